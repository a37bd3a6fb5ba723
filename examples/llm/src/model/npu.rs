//! The NPU backend: every weight matmul runs through the SDK's engine
//! ([`rknn_matmul::engine`]) as a linear resident in NPU memory, on the real NPU or on the
//! emulator, through the same code path.
//!
//! W8A8 (the default): each weight row is quantised to int8 with one scale per output channel,
//! each activation row to int8 with one scale per row; the NPU sums exactly in i32 and the
//! scales are applied on the host. Plain W8A8 loses too much on a small model (SmolLM2-135M:
//! 88 % top-1 agreement with the f32 path). Two changes, both in int8 arithmetic on the NPU,
//! bring it within 1 % of f32's perplexity and above 96 % agreement (docs/llm.md):
//!
//! * every linear's input is rotated by its own random orthogonal transform (random signs, a
//!   Walsh–Hadamard transform per 64-channel block, a random orthogonal mix across the
//!   blocks): the weights once at load, the activations by the engine, so outlier channels no
//!   longer set the row's int8 scale, and the rounding errors of different layers do not line
//!   up;
//! * each activation row is quantised twice, as itself and as its residual, and both rows go
//!   through the NPU (about 15 bits of activation precision; decode, bound by reading the
//!   weights, pays little for the second row; prefill pays twice the NPU work).
//!
//! F16 weights and activations are the higher-precision option. Weights are converted a few
//! rows at a time (dequantise, rotate, quantise), so loading never holds a whole matrix in f32
//! for W8A8.
//!
//! On RK3576, W4A16 with per-group int4 weights ([`EngineOptions::int4_group`], groups of 32)
//! reproduces a 4-bit GGUF's blocks exactly and stays within the same bar on the demo model
//! (98 % top-1 agreement); those linears run unrotated and the output head W8A8.

use std::num::NonZeroU16;

use rknn_chip::{LinearRole, Residual};
use rknn_matmul::engine::{Engine, Linear, LinearOptions, Rotation, WeightFormat};

use super::backend::{BackendError, LinearFactory, LinearOp, stacked_shape};
use super::config::Family;
use crate::gguf::TensorView;

/// How the engine backend converts weights and treats activations. The defaults are what it
/// takes to keep W8A8 within the accuracy bar of issue 14 on SmolLM2-135M (top-1 agreement
/// with the f32 path >= 96 %, perplexity within 1 %; the figures are in docs/llm.md).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EngineOptions {
    /// W8A8 (default), F16, or on RK3576 W4A16 and W4A8.
    pub format: WeightFormat,
    /// Rotate each linear's input by a randomized Hadamard transform over 64-channel blocks,
    /// mixed across blocks by a random orthogonal matrix (default: yes).
    pub rotate: bool,
    /// Which linears quantise each activation row twice, as itself and as its residual: about
    /// 15 bits of activation precision from int8 arithmetic, for a second row of A (default:
    /// the output head and the down projections, the cheapest choice that met the accuracy bar
    /// for every rotation seed tried; [`Residual::All`] has a wider margin for twice the
    /// prefill work).
    pub residual: Residual,
    /// Seed of the rotations.
    pub seed: u64,
    /// Where a mixture's experts go on the NPU's cores (default:
    /// [`ExpertPlacement::PerCore`]).
    pub experts: ExpertPlacement,
    /// Per-group int4 weights in groups of this many input features
    /// ([`LinearOptions::int4_group`]; `format` must be [`WeightFormat::W4A16`]), instead of
    /// one scale per output channel (default: none). A group's min/max grid reproduces a 4-bit
    /// GGUF block (Q4_0, Q4_1: group 32) exactly. Those linears run without a rotation
    /// whatever `rotate` says: a rotation mixes the input features and spreads every group's
    /// grid over all of them. Linears the GGUF stores in more than
    /// [`INT4_GROUP_MAX_GGUF_BITS`] bits per weight, and the output head, stay W8A8 (rotated,
    /// with the residual policy's second row), see [`EngineOptions::linear_settings`]: on the demo model (SmolLM2-135M,
    /// whose tied head is Q8_0 in the GGUF) the head in per-group int4 too dropped top-1
    /// agreement with the f32 path from 98.10 % to 82.21 % (perplexity +0.01 % to +6.30 %),
    /// and saved 6.9 MiB (its 49152 × 576 head: 27.2 MiB in W8A8, 20.2 MiB in int4 with
    /// groups of 32; docs/llm.md).
    pub int4_group: Option<NonZeroU16>,
}

impl EngineOptions {
    /// The format, per-group int4 size and rotation of the linear of `role` whose GGUF tensors
    /// store `gguf_bits` bits per weight (the most of its parts, scales included):
    /// [`EngineOptions::format`], except that with per-group int4
    /// ([`EngineOptions::int4_group`]) the output head, and every linear stored in more than
    /// [`INT4_GROUP_MAX_GGUF_BITS`] bits per weight, run W8A8, and the int4 linears unrotated.
    pub fn linear_settings(
        &self,
        role: LinearRole,
        gguf_bits: f64,
    ) -> (WeightFormat, Option<NonZeroU16>, bool) {
        match self.int4_group {
            Some(_)
                if self.format == WeightFormat::W4A16
                    && (role == LinearRole::Output || gguf_bits > INT4_GROUP_MAX_GGUF_BITS) =>
            {
                (WeightFormat::W8A8, None, self.rotate)
            }
            Some(g) => (self.format, Some(g), false),
            None => (self.format, None, self.rotate),
        }
    }
}

/// The most bits per weight (scales and minimums included) a GGUF tensor may store for
/// per-group int4 ([`EngineOptions::int4_group`]) to take it: Q4_1's 5.0, so Q4_0, Q4_1 and
/// Q4_K (whose blocks a group of 32 holds exactly) and the lower-bit types go to int4, while
/// Q5_0, Q5_K, Q6_K, Q8_0 and the float types keep W8A8. On Gemma-3-270M, whose "Q4_K_M" file
/// is mostly 5-, 6- and 8-bit, rounding those to 4 bits too gave 73 % top-1 (docs/llm.md).
pub const INT4_GROUP_MAX_GGUF_BITS: f64 = 5.0;

/// Where the engine puts a mixture of experts' linears.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum ExpertPlacement {
    /// Each expert whole on one core, expert `x` on core `x mod cores` (its gate-up and down
    /// together), the chosen experts of a pass running on their cores at once: one run per
    /// expert linear instead of one per core, and a third of the contexts and memory handles
    /// on three cores. Decode is as fast as the busiest core: the chosen experts do not spread
    /// evenly over the cores (docs/npu-matmul-performance.md prices both placements).
    #[default]
    PerCore,
    /// Each expert split over every core like a dense linear, the experts one after another.
    Split,
}

impl Default for EngineOptions {
    fn default() -> Self {
        EngineOptions {
            format: WeightFormat::W8A8,
            rotate: true,
            residual: Residual::OutputAndDown,
            seed: 0x5EED,
            experts: ExpertPlacement::default(),
            int4_group: None,
        }
    }
}

impl Family {
    /// The NPU backend's default options with this family's residual policy.
    pub fn engine_options(&self) -> EngineOptions {
        EngineOptions {
            residual: self.w8a8_residual,
            ..EngineOptions::default()
        }
    }
}

/// Builds engine linears from GGUF weights, converting them, or reading them converted from
/// a weight cache ([`Model::load_cached`](super::Model::load_cached)).
pub struct EngineFactory {
    engine: Engine,
    opts: EngineOptions,
    store: Option<Box<dyn WeightStore>>,
}

/// A linear's weight rows as f32, a few at a time: `rows(first, buf)` fills `buf` with rows
/// `first..` (whole rows of `in_features`).
pub(super) type Rows<'a> = dyn FnMut(usize, &mut [f32]) -> Result<(), BackendError> + 'a;

/// Where an [`EngineFactory`] gets and keeps converted weights instead of converting each
/// load: the weight cache ([`super::weight_cache`]).
pub(super) trait WeightStore {
    /// Makes linear `name` ([n, k] in `format`, running with `opts`) resident, from the
    /// store or by converting `rows` into it.
    #[allow(clippy::too_many_arguments)] // The linear's description.
    fn linear(
        &mut self,
        engine: &Engine,
        name: &str,
        n: usize,
        k: usize,
        format: WeightFormat,
        opts: LinearOptions,
        rows: &mut Rows<'_>,
    ) -> Result<Linear, BackendError>;

    /// Every linear is built.
    fn finish(&mut self);
}

impl std::fmt::Debug for EngineFactory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EngineFactory")
            .field("engine", &self.engine)
            .field("opts", &self.opts)
            .finish_non_exhaustive()
    }
}

impl EngineFactory {
    /// A factory that makes its linears resident on `engine`.
    pub fn new(engine: Engine, opts: EngineOptions) -> Self {
        EngineFactory {
            engine,
            opts,
            store: None,
        }
    }

    /// A factory whose linears come from, or are converted into, `store`.
    pub(super) fn with_store(
        engine: Engine,
        opts: EngineOptions,
        store: Box<dyn WeightStore>,
    ) -> Self {
        EngineFactory {
            engine,
            opts,
            store: Some(store),
        }
    }
}

impl LinearFactory for EngineFactory {
    fn engine(&self) -> Option<&Engine> {
        Some(&self.engine)
    }

    fn build(
        &mut self,
        role: LinearRole,
        parts: &[TensorView<'_>],
    ) -> Result<Box<dyn LinearOp>, BackendError> {
        self.build_on(role, parts, None)
    }

    fn build_expert(
        &mut self,
        role: LinearRole,
        parts: &[TensorView<'_>],
        expert: usize,
    ) -> Result<Box<dyn LinearOp>, BackendError> {
        let lane = match self.opts.experts {
            ExpertPlacement::PerCore => Some(expert % self.engine.workers().max(1)),
            ExpertPlacement::Split => None,
        };
        self.build_on(role, parts, lane)
    }

    fn finish(&mut self) -> Result<(), BackendError> {
        if let Some(store) = &mut self.store {
            store.finish();
        }
        Ok(())
    }
}

impl EngineFactory {
    /// The linear of `parts` for `role`, whole on `lane` or split over every lane.
    fn build_on(
        &mut self,
        role: LinearRole,
        parts: &[TensorView<'_>],
        lane: Option<usize>,
    ) -> Result<Box<dyn LinearOp>, BackendError> {
        let (k, n) = stacked_shape(parts)?;
        let o = self.opts;
        // Each linear its own rotation (seeded by its first tensor's name), so the rounding
        // errors of different layers are independent instead of aligned.
        let seed = parts
            .first()
            .map_or(o.seed, |t| name_seed(o.seed, t.name()));
        let bits = parts
            .iter()
            .map(|t| t.ty().bits_per_weight())
            .fold(0.0, f64::max);
        let (format, int4_group, rotate) = o.linear_settings(role, bits);
        let opts = LinearOptions {
            rotation: rotate.then(|| Rotation::hadamard_mixed(k, seed)),
            residual_activations: o.residual.applies(role),
            lane,
            int4_group,
        };
        let name = parts.iter().map(|t| t.name()).collect::<Vec<_>>().join("+");
        // The parts' rows one after the other, a few at a time (the engine rotates and
        // converts each step), so no whole matrix is ever held in f32.
        let starts: Vec<usize> = parts
            .iter()
            .scan(0, |r0, t| {
                let at = *r0;
                *r0 += usize::try_from(t.dims()[1]).unwrap_or(usize::MAX);
                Some(at)
            })
            .collect();
        let mut rows = |first: usize, buf: &mut [f32]| {
            let mut row = first;
            let mut filled = 0;
            while filled < buf.len() {
                let part = starts.partition_point(|&s| s <= row) - 1;
                let tn = usize::try_from(parts[part].dims()[1])?;
                let local = row - starts[part];
                let rows = ((buf.len() - filled) / k).min(tn - local);
                parts[part].rows_to_f32(local, &mut buf[filled..filled + rows * k])?;
                // Converted: this step's pages of the file are not needed again.
                parts[part].release_rows(local, rows);
                filled += rows * k;
                row += rows;
            }
            Ok::<(), BackendError>(())
        };
        let linear = match &mut self.store {
            None => self.engine.linear_from_rows(n, k, format, opts, rows)?,
            Some(store) => store.linear(&self.engine, &name, n, k, format, opts, &mut rows)?,
        };
        Ok(Box::new(linear))
    }
}

/// A rotation seed from the base seed and a tensor name (FNV-1a over the name).
fn name_seed(base: u64, name: &str) -> u64 {
    name.bytes().fold(base ^ 0xCBF2_9CE4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01B3)
    })
}

/// An engine linear is the NPU backend's [`LinearOp`]: the model calls its forward directly.
impl LinearOp for Linear {
    fn in_features(&self) -> usize {
        Linear::in_features(self)
    }

    fn out_features(&self) -> usize {
        Linear::out_features(self)
    }

    fn forward(&self, x: &[f32], m: usize, out: &mut [f32]) -> Result<(), BackendError> {
        Ok(Linear::forward(self, x, m, out)?)
    }

    fn weight_format(&self) -> &'static str {
        self.format().name()
    }

    fn engine_linear(&self) -> Option<&Linear> {
        Some(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::GgmlType;

    /// With per-group int4, a linear takes int4 only where its GGUF tensor holds at most Q4_1's
    /// 5 bits per weight (the types' sizes from ggml's block layouts), and never the head.
    #[test]
    fn per_group_int4_takes_only_the_4_bit_tensors_and_not_the_head() {
        let opts = EngineOptions {
            format: WeightFormat::W4A16,
            int4_group: NonZeroU16::new(32),
            ..EngineOptions::default()
        };
        let g = NonZeroU16::new(32);
        for (ty, want) in [
            (GgmlType::Q4_0, (WeightFormat::W4A16, g, false)),
            (GgmlType::Q4_1, (WeightFormat::W4A16, g, false)),
            (GgmlType::Q4_K, (WeightFormat::W4A16, g, false)),
            (GgmlType::Q3_K, (WeightFormat::W4A16, g, false)),
            (GgmlType::Q5_0, (WeightFormat::W8A8, None, true)),
            (GgmlType::Q5_K, (WeightFormat::W8A8, None, true)),
            (GgmlType::Q6_K, (WeightFormat::W8A8, None, true)),
            (GgmlType::Q8_0, (WeightFormat::W8A8, None, true)),
            (GgmlType::F16, (WeightFormat::W8A8, None, true)),
        ] {
            let bits = ty.bits_per_weight();
            assert_eq!(opts.linear_settings(LinearRole::Down, bits), want, "{ty:?}");
        }
        let q4 = GgmlType::Q4_0.bits_per_weight();
        assert_eq!(
            opts.linear_settings(LinearRole::Output, q4),
            (WeightFormat::W8A8, None, true)
        );
        // Without a group, the format is the format, whatever the GGUF holds.
        let plain = EngineOptions {
            format: WeightFormat::W4A16,
            ..EngineOptions::default()
        };
        let q8 = GgmlType::Q8_0.bits_per_weight();
        assert_eq!(
            plain.linear_settings(LinearRole::Down, q8),
            (WeightFormat::W4A16, None, true)
        );
    }
}
