//! Per-phase statistics: how often and how long the engine quantised and packed, ran the NPU,
//! and collected results. The field campaign decided what to optimise from exactly these
//! numbers (decode spent 7.8 % of tracked time in host glue, prefill 20.3 %).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// A phase of a forward pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Activation quantisation (caller thread).
    Quantize,
    /// Native A packing (workers).
    Pack,
    /// `rknn_matmul_run` (workers).
    Run,
    /// Reading C, accumulating K segments, scaling (workers).
    Collect,
}

#[derive(Debug, Default)]
pub(crate) struct Counters {
    count: [AtomicU64; 4],
    nanos: [AtomicU64; 4],
    forwards: AtomicU64,
}

impl Counters {
    pub(crate) fn add(&self, phase: Phase, d: Duration) {
        let i = phase as usize;
        self.count[i].fetch_add(1, Ordering::Relaxed);
        self.nanos[i].fetch_add(d.as_nanos() as u64, Ordering::Relaxed);
    }

    pub(crate) fn forward(&self) {
        self.forwards.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn snapshot(&self) -> Stats {
        let get = |i: usize| PhaseStats {
            count: self.count[i].load(Ordering::Relaxed),
            time: Duration::from_nanos(self.nanos[i].load(Ordering::Relaxed)),
        };
        Stats {
            forwards: self.forwards.load(Ordering::Relaxed),
            quantize: get(0),
            pack: get(1),
            run: get(2),
            collect: get(3),
        }
    }

    pub(crate) fn reset(&self) {
        for a in self.count.iter().chain(&self.nanos) {
            a.store(0, Ordering::Relaxed);
        }
        self.forwards.store(0, Ordering::Relaxed);
    }
}

/// Count and cumulative time of one phase. Worker phases add up over workers, so with three
/// cores busy at once their time can exceed wall time.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PhaseStats {
    /// Times the phase ran.
    pub count: u64,
    /// Total time in it.
    pub time: Duration,
}

/// A snapshot of the engine's counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// `Linear::forward` calls.
    pub forwards: u64,
    /// Activation quantisation.
    pub quantize: PhaseStats,
    /// Native A packing.
    pub pack: PhaseStats,
    /// NPU runs.
    pub run: PhaseStats,
    /// Output collection.
    pub collect: PhaseStats,
}

impl Stats {
    /// Host glue time (quantise + pack + collect) over NPU run time.
    pub fn glue_to_run_ratio(&self) -> f64 {
        let glue = self.quantize.time + self.pack.time + self.collect.time;
        glue.as_secs_f64() / self.run.time.as_secs_f64().max(1e-12)
    }
}

impl std::fmt::Display for Stats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let row = |f: &mut std::fmt::Formatter<'_>, name: &str, p: PhaseStats| {
            writeln!(
                f,
                "  {name:<9} {:>8} calls {:>12.3} ms",
                p.count,
                p.time.as_secs_f64() * 1e3
            )
        };
        writeln!(f, "engine: {} forwards", self.forwards)?;
        row(f, "quantize", self.quantize)?;
        row(f, "pack", self.pack)?;
        row(f, "run", self.run)?;
        row(f, "collect", self.collect)
    }
}
