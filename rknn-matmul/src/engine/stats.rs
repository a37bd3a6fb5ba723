//! Per-phase statistics: how often and how long the engine quantised and packed, ran the NPU,
//! and collected results. The field campaign decided what to optimise from exactly these
//! numbers (decode spent 7.8 % of tracked time in host glue, prefill 20.3 %).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// A phase of a forward pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Activation quantisation (caller thread).
    Quantize,
    /// Native A packing, with the dynamic shape's selection (workers).
    Pack,
    /// `rknn_matmul_run` (workers).
    Run,
    /// Reading C, accumulating K segments, scaling (workers).
    Collect,
    /// The calling thread waiting for the workers' replies once its own part of a round is
    /// done (posting, and the lane it runs itself), in the rounds where a worker was still busy
    /// (callers). With the caller running a lane, this is the fork-join's cost: the slower
    /// lane's lead over the caller's, plus the hand-off.
    Wait,
}

/// Phases, the length of the per-phase arrays.
const PHASES: usize = 5;

/// One writer's counters, alone in its cache lines (128 bytes: CPUs prefetch lines in
/// pairs). The lanes of an engine run on different cores: counters they shared moved between
/// the cores on every phase of every run.
#[derive(Debug, Default)]
#[repr(align(128))]
struct Cell {
    count: [AtomicU64; PHASES],
    nanos: [AtomicU64; PHASES],
    forwards: AtomicU64,
    warmed: AtomicU64,
    in_elems: AtomicU64,
    out_elems: AtomicU64,
}

/// The engine's counters: a cell per lane, and one for the callers (quantisation, forwards).
#[derive(Debug)]
pub(crate) struct Counters {
    cells: Box<[Cell]>,
}

impl Counters {
    /// Counters for `lanes` lanes and the callers.
    pub(crate) fn new(lanes: usize) -> Counters {
        Counters {
            cells: (0..=lanes).map(|_| Cell::default()).collect(),
        }
    }

    /// The writer index of the callers' cell (lanes are `0..lanes`).
    pub(crate) fn callers(&self) -> usize {
        self.cells.len() - 1
    }

    /// Adds one run of `phase` that took `d`, for `writer`.
    pub(crate) fn add(&self, writer: usize, phase: Phase, d: Duration) {
        self.add_runs(writer, phase, 1, d);
    }

    /// Adds `runs` runs of `phase` that took `d` in all, for `writer`.
    pub(crate) fn add_runs(&self, writer: usize, phase: Phase, runs: u64, d: Duration) {
        let c = &self.cells[writer];
        let i = phase as usize;
        c.count[i].fetch_add(runs, Ordering::Relaxed);
        c.nanos[i].fetch_add(d.as_nanos() as u64, Ordering::Relaxed);
    }

    /// Adds the phases of `lap`, for `writer`.
    pub(crate) fn add_lap(&self, writer: usize, lap: &Lap) {
        let c = &self.cells[writer];
        for i in (0..PHASES).filter(|&i| lap.count[i] > 0) {
            c.count[i].fetch_add(lap.count[i], Ordering::Relaxed);
            c.nanos[i].fetch_add(lap.spent[i].as_nanos() as u64, Ordering::Relaxed);
        }
    }

    /// Adds `bytes` read ahead by `writer` (an idle worker).
    pub(crate) fn add_warmed(&self, writer: usize, bytes: u64) {
        self.cells[writer]
            .warmed
            .fetch_add(bytes, Ordering::Relaxed);
    }

    /// Counts one forward that prepared `input` activation elements (rows of A × K, each
    /// input row twice with residual activations) and collected `output` (rows of C × N).
    pub(crate) fn forward(&self, input: u64, output: u64) {
        let c = &self.cells[self.callers()];
        c.forwards.fetch_add(1, Ordering::Relaxed);
        c.in_elems.fetch_add(input, Ordering::Relaxed);
        c.out_elems.fetch_add(output, Ordering::Relaxed);
    }

    pub(crate) fn snapshot(&self) -> Stats {
        Counters::sum(&self.cells)
    }

    /// Each lane's own counters (the callers' quantisation and forwards are in none of them).
    pub(crate) fn lanes(&self) -> Vec<Stats> {
        let lanes = &self.cells[..self.callers()];
        lanes
            .iter()
            .map(std::slice::from_ref)
            .map(Counters::sum)
            .collect()
    }

    fn sum(cells: &[Cell]) -> Stats {
        let sum = |f: &dyn Fn(&Cell) -> &AtomicU64| -> u64 {
            cells.iter().map(|c| f(c).load(Ordering::Relaxed)).sum()
        };
        let get = |i: usize| PhaseStats {
            count: sum(&|c| &c.count[i]),
            time: Duration::from_nanos(sum(&|c| &c.nanos[i])),
        };
        Stats {
            forwards: sum(&|c| &c.forwards),
            warmed_bytes: sum(&|c| &c.warmed),
            input_elements: sum(&|c| &c.in_elems),
            output_elements: sum(&|c| &c.out_elems),
            quantize: get(0),
            pack: get(1),
            run: get(2),
            collect: get(3),
            wait: get(4),
        }
    }

    pub(crate) fn reset(&self) {
        for c in self.cells.iter() {
            for a in c.count.iter().chain(&c.nanos).chain([
                &c.forwards,
                &c.warmed,
                &c.in_elems,
                &c.out_elems,
            ]) {
                a.store(0, Ordering::Relaxed);
            }
        }
    }
}

/// Consecutive phases timed with one clock read at each boundary (a forward shard's pack, run
/// and collect, segment after segment), added to the counters once at the end.
pub(crate) struct Lap {
    last: Instant,
    spent: [Duration; PHASES],
    count: [u64; PHASES],
}

impl Lap {
    /// Starts timing the first phase.
    pub(crate) fn start() -> Lap {
        Lap {
            last: Instant::now(),
            spent: [Duration::ZERO; PHASES],
            count: [0; PHASES],
        }
    }

    /// Ends a run of `phase` (begun at the previous mark) and starts the next.
    pub(crate) fn mark(&mut self, phase: Phase) {
        let now = Instant::now();
        self.spent[phase as usize] += now - self.last;
        self.count[phase as usize] += 1;
        self.last = now;
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
    /// The calling thread waiting for workers ([`Phase::Wait`]): its count is the rounds in
    /// which a worker was still busy when the caller's own part was done, out of one or more
    /// rounds per forward (a forward of more rows than `max_m` takes several).
    pub wait: PhaseStats,
    /// Bytes of weights idle workers read ahead into the CPU caches
    /// ([`super::EngineConfig::warm_bytes`]).
    pub warmed_bytes: u64,
    /// Activation elements the forwards prepared: rows of A × K (an input row with residual
    /// activations is two rows of A).
    pub input_elements: u64,
    /// Activation elements the forwards collected: rows of C × N.
    pub output_elements: u64,
}

impl Stats {
    /// Host glue time (quantise + pack + collect, summed over the threads that did it) per
    /// activation element moved ([`Stats::input_elements`] + [`Stats::output_elements`]), in
    /// nanoseconds: the unit of the cost model's host term
    /// (`rknn_emu::cost::EngineLayout::activations` counts the same elements). 0 before any
    /// forward.
    pub fn glue_ns_per_element(&self) -> f64 {
        let glue = self.quantize.time + self.pack.time + self.collect.time;
        let elems = self.input_elements + self.output_elements;
        if elems == 0 {
            return 0.0;
        }
        glue.as_nanos() as f64 / elems as f64
    }

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
        row(f, "collect", self.collect)?;
        row(f, "wait", self.wait)?;
        writeln!(f, "  read ahead {:.1} MB", self.warmed_bytes as f64 / 1e6)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lanes_and_callers_add_up_in_the_snapshot() {
        let c = Counters::new(2);
        assert_eq!(c.callers(), 2);
        std::thread::scope(|s| {
            for lane in 0..2 {
                let c = &c;
                s.spawn(move || {
                    for _ in 0..1000 {
                        let mut lap = Lap::start();
                        lap.mark(Phase::Pack);
                        lap.mark(Phase::Run);
                        lap.mark(Phase::Collect);
                        lap.mark(Phase::Collect);
                        c.add_lap(lane, &lap);
                    }
                });
            }
            for _ in 0..500 {
                c.add(c.callers(), Phase::Quantize, Duration::from_nanos(3));
                c.add_runs(c.callers(), Phase::Wait, 2, Duration::from_nanos(5));
                c.forward(7, 3);
            }
        });
        let s = c.snapshot();
        assert_eq!(
            (
                s.forwards,
                s.quantize.count,
                s.pack.count,
                s.run.count,
                s.collect.count
            ),
            (500, 500, 2000, 2000, 4000)
        );
        assert_eq!(s.quantize.time, Duration::from_nanos(1500));
        assert_eq!((s.input_elements, s.output_elements), (3500, 1500));
        assert_eq!(
            (s.wait.count, s.wait.time),
            (1000, Duration::from_nanos(2500))
        );
        // The callers' phases are in no lane's counters.
        assert!(
            c.lanes()
                .iter()
                .all(|l| l.wait.count == 0 && l.quantize.count == 0)
        );
        c.reset();
        assert_eq!(c.snapshot(), Stats::default());
    }
}
