//! [`ModelledTime`]: what a cost model of the chip gives the runs an emulator made.
//!
//! Not a chip fact: it lives here because the emulator (`rknn-emu`) keeps it and the safe
//! layer (`rknn-matmul`) hands it out, and the safe layer must build without the emulator,
//! so the one definition sits in the lowest crate both reach.

use std::time::Duration;

/// Modelled device time of the runs an emulator made (`rknn_emu::cost`): a model of the chip,
/// not a measurement.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ModelledTime {
    /// Runs counted.
    pub runs: u64,
    /// Their modelled device time, summed over every core.
    pub total: Duration,
    /// Per NPU core, the modelled time of the runs made on it.
    pub per_core: Vec<Duration>,
    /// Operations (2 per multiply-accumulate) of the runs.
    pub ops: f64,
}

impl ModelledTime {
    /// The modelled device time of the busiest core: the NPU's wall time for work split
    /// evenly over the cores and run on all of them at once (as the engine's linears are).
    pub fn busiest_core(&self) -> Duration {
        self.per_core.iter().copied().max().unwrap_or_default()
    }

    /// The difference since an earlier snapshot of the same emulator (for timing one phase,
    /// e.g. prefill then decode).
    ///
    /// ```
    /// use std::time::Duration;
    /// use rknn_chip::ModelledTime;
    /// let ms = Duration::from_millis;
    /// let before = ModelledTime { runs: 2, total: ms(3), per_core: vec![ms(2), ms(1)], ops: 10.0 };
    /// let after = ModelledTime { runs: 5, total: ms(9), per_core: vec![ms(4), ms(5)], ops: 25.0 };
    /// let phase = after.since(&before);
    /// assert_eq!(phase, ModelledTime { runs: 3, total: ms(6), per_core: vec![ms(2), ms(4)], ops: 15.0 });
    /// assert_eq!(phase.busiest_core(), ms(4));
    /// ```
    pub fn since(&self, earlier: &ModelledTime) -> ModelledTime {
        ModelledTime {
            runs: self.runs.saturating_sub(earlier.runs),
            total: self.total.saturating_sub(earlier.total),
            per_core: self
                .per_core
                .iter()
                .enumerate()
                .map(|(i, t)| {
                    t.saturating_sub(earlier.per_core.get(i).copied().unwrap_or_default())
                })
                .collect(),
            ops: (self.ops - earlier.ops).max(0.0),
        }
    }
}
