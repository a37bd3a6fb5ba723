//! The emulator's cache behaviour: idle worker lanes read the next linear's weights ahead into
//! the CPU caches. Only on an emulated runtime; on hardware the NPU reads B by DMA and this
//! module is never constructed ([`EmulatorCache::for_runtime`]).
//!
//! Why: on an emulated runtime every NPU core is a CPU thread that reads its B from host
//! memory, and decode is bound by that reading (a token reads every weight byte once). Between
//! two linears the caller does host work (attention, norms, preparing the next input) while
//! the workers wait, and the memory bus has nothing to do. A worker that has replied reads the
//! first bytes of its own shard of the next linear's B, so that the run finds them in the
//! caches.
//!
//! Measured (in-process ABBA of decode tg64 on the demo model, on and off in one process,
//! `docs/engine-performance.md`): 1.052 (95 % interval 1.033-1.072) over 200 pairs on a 2-vCPU
//! AMD EPYC (Zen 4) guest. The other emulator-speed hints tried (a counter clock, prefetching
//! the next context's records in the emulator and the next linear's state in the engine, a
//! sharded reader lock) gained less than 2 % each there and were removed.
//!
//! The next linear is learned, not declared: a model runs its linears in the same order token
//! after token, so each worker remembers which linear followed which on its lane. The budget is
//! one atomic the engine shares with its workers, so [`super::Engine::set_warm_bytes`] changes
//! it while they run (a benchmark compares both settings on one model that way).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use rustc_hash::FxHashMap;

use crate::safe::runtime::Runtime;

/// [`EngineConfig::warm_bytes`](super::config::EngineConfig::warm_bytes) on an emulated
/// runtime.
pub const DEFAULT_WARM_BYTES: usize = 256 << 10;

/// Rows of A up to which a forward is followed by a read-ahead: decode (one or two rows) and
/// speculative verify passes are bound by reading the weights; a prompt chunk's runs are bound
/// by arithmetic, and its host work runs on the host pool's threads, which a reading worker
/// would compete with for the CPUs (on the emulator every worker is a busy CPU thread).
pub(crate) const MAX_ROWS: usize = 32;

/// Bytes read per step before the worker checks for its next task again (a few hundred
/// nanoseconds from memory: a posted task waits no longer than that).
const STEP: usize = 4096;

/// CPU cache line: one read per line brings all of it (64 bytes on x86-64 and on the
/// Cortex-A76/A55).
const LINE: usize = 64;

/// A worker's read-ahead state: what follows what, and the linear to warm while idle.
#[derive(Debug, Default)]
pub(crate) struct EmulatorCache {
    /// Bytes per lane and linear to read ahead (0: off), shared with the engine.
    budget: Arc<AtomicUsize>,
    last: Option<u64>,
    next: FxHashMap<u64, u64>,
    pending: Option<u64>,
}

impl EmulatorCache {
    /// A worker's state, reading ahead as many bytes as `budget` holds at each idle spell.
    pub(crate) fn new(budget: Arc<AtomicUsize>) -> EmulatorCache {
        EmulatorCache {
            budget,
            ..EmulatorCache::default()
        }
    }

    /// A worker lane's read-ahead on `rt`, with the budget `budget` holds at each idle spell:
    /// `None` on hardware, where the NPU reads B by DMA and warming the CPU's caches would only
    /// take memory bandwidth from it.
    pub(crate) fn for_runtime(rt: &Runtime, budget: Arc<AtomicUsize>) -> Option<EmulatorCache> {
        (!rt.is_hardware()).then(|| EmulatorCache::new(budget))
    }

    /// Reads ahead the first budget's bytes of a linear's weights on this lane, `own` (in the
    /// order its runs read them), until done or `interrupted()`. Returns the bytes read.
    pub(crate) fn read_ahead(&self, own: &[&[u8]], interrupted: &dyn Fn() -> bool) -> u64 {
        read_ahead(own.iter().copied(), self.budget(), interrupted)
    }

    /// Bytes per lane and linear it reads ahead now.
    pub(crate) fn budget(&self) -> usize {
        self.budget.load(Ordering::Relaxed)
    }

    /// A forward of linear `id` starts: it follows the previous one (a chunked forward, the
    /// same linear again, teaches nothing). Nothing is learned while the budget is 0: the
    /// order is learned again within a token of it being raised.
    pub(crate) fn starts(&mut self, id: u64) {
        if self.budget() == 0 {
            self.last = None;
            return;
        }
        self.pending = None;
        if let Some(prev) = self.last.filter(|&p| p != id) {
            self.next.insert(prev, id);
        }
        self.last = Some(id);
    }

    /// A forward of linear `id` over `rows` rows of A ended: warm what followed it last time,
    /// after a forward of at most [`MAX_ROWS`] rows.
    pub(crate) fn ended(&mut self, id: u64, rows: usize) {
        let on = rows <= MAX_ROWS && self.budget() > 0;
        self.pending = self.next.get(&id).copied().filter(|_| on);
    }

    /// The linear to warm now, taken (warmed once per idle spell).
    pub(crate) fn take_pending(&mut self) -> Option<u64> {
        self.pending.take()
    }

    /// Linear `id` is gone: forget its place in the order.
    pub(crate) fn forget(&mut self, id: u64) {
        self.next.remove(&id);
        self.next.retain(|_, n| *n != id);
        if self.last == Some(id) {
            self.last = None;
        }
        if self.pending == Some(id) {
            self.pending = None;
        }
    }
}

/// Reads the first `budget` bytes of `ranges` (in the order a run reads them), a step at a
/// time, until done or `interrupted()`, which it asks before every step (a posted task waits
/// at most one step for the worker). Returns the bytes read.
fn read_ahead<'a>(
    ranges: impl Iterator<Item = &'a [u8]>,
    budget: usize,
    interrupted: &dyn Fn() -> bool,
) -> u64 {
    let mut cursor = Cursor::new(ranges, budget);
    let mut read = 0u64;
    while !interrupted() {
        let step = cursor.step();
        if step.is_empty() {
            break;
        }
        touch(step);
        read += step.len() as u64;
    }
    read
}

/// Reads one byte of every cache line of `bytes`.
fn touch(bytes: &[u8]) {
    let sum = bytes
        .iter()
        .step_by(LINE)
        .fold(0u8, |acc, &b| acc.wrapping_add(b));
    std::hint::black_box(sum);
}

/// Steps of at most [`STEP`] bytes through ranges, up to a total.
struct Cursor<'a, I: Iterator<Item = &'a [u8]>> {
    ranges: I,
    current: &'a [u8],
    left: usize,
}

impl<'a, I: Iterator<Item = &'a [u8]>> Cursor<'a, I> {
    fn new(ranges: I, total: usize) -> Self {
        Cursor {
            ranges,
            current: &[],
            left: total,
        }
    }

    /// The next step (empty when done).
    fn step(&mut self) -> &'a [u8] {
        while self.current.is_empty() && self.left > 0 {
            match self.ranges.next() {
                Some(r) => self.current = r,
                None => return &[],
            }
        }
        let n = self.current.len().min(STEP).min(self.left);
        let (head, rest) = self.current.split_at(n);
        self.current = rest;
        self.left -= n;
        head
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    fn budget(bytes: usize) -> Arc<AtomicUsize> {
        Arc::new(AtomicUsize::new(bytes))
    }

    #[test]
    fn a_worker_learns_which_linear_follows_which() {
        let mut w = EmulatorCache::new(budget(1024));
        // Two tokens of a three-linear model; the second linear's forward is chunked.
        for id in [1, 2, 2, 3, 1, 2, 3] {
            w.starts(id);
            w.ended(id, 1);
        }
        w.ended(3, 1);
        assert_eq!(w.take_pending(), Some(1));
        assert_eq!(w.take_pending(), None, "taken once per idle spell");
        w.ended(1, 2);
        assert_eq!(w.take_pending(), Some(2));
        w.ended(2, MAX_ROWS);
        let chunked = "not 2: a chunked forward teaches nothing";
        assert_eq!(w.take_pending(), Some(3), "{chunked}");
        // Not after a prompt chunk.
        w.ended(2, MAX_ROWS + 1);
        assert_eq!(w.take_pending(), None);
        // A forward that starts cancels what was pending.
        w.ended(1, 1);
        w.starts(2);
        assert_eq!(w.take_pending(), None);
        w.forget(3);
        w.ended(2, 1);
        assert_eq!(w.take_pending(), None, "a forgotten linear is never warmed");
        // Off: nothing is learned.
        let shared = budget(0);
        let mut off = EmulatorCache::new(shared.clone());
        off.starts(1);
        off.starts(2);
        off.ended(1, 1);
        assert_eq!(off.take_pending(), None);
        // Turned on while running: learned from the next pair of forwards on.
        shared.store(64, Ordering::Relaxed);
        off.starts(1);
        off.ended(1, 1);
        assert_eq!(off.take_pending(), None, "nothing learned while off");
        off.starts(2);
        off.ended(2, 1);
        off.ended(1, 1);
        assert_eq!(off.take_pending(), Some(2));
        // And off again: what was learned is not read ahead.
        shared.store(0, Ordering::Relaxed);
        off.ended(1, 1);
        assert_eq!(off.take_pending(), None);
    }

    #[test]
    fn reading_ahead_takes_the_budget_until_interrupted() {
        let own = vec![1u8; 3 * STEP + 10];
        let seg2 = vec![2u8; STEP];
        let never = || false;
        let read = read_ahead([&own[..], &seg2[..]].into_iter(), 2 * STEP + 5, &never);
        assert_eq!(read, (2 * STEP + 5) as u64);
        // Past the first segment into the second.
        let read = read_ahead([&own[..], &seg2[..]].into_iter(), usize::MAX, &never);
        assert_eq!(read, (4 * STEP + 10) as u64);
        // Asked before every step: interrupted at the third question, after two steps.
        let checks = Cell::new(0);
        let after_two = || {
            checks.set(checks.get() + 1);
            checks.get() > 2
        };
        let read = read_ahead([&own[..]].into_iter(), usize::MAX, &after_two);
        assert_eq!(read, (2 * STEP) as u64);
        assert_eq!(checks.get(), 3);
    }
}
