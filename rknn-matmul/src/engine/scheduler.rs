//! The per-core scheduler: one persistent worker thread per NPU core, each owning its
//! contexts (one context is never touched by two threads) and its scratch, fed through a slot
//! that the worker spins on briefly before sleeping. Spinning keeps the hand-off in the
//! microseconds when linears come back to back (decode); sleeping keeps idle workers off the CPU.
//!
//! Submissions are safe for any number of callers: a slot holds one task and one reply, so
//! tasks are posted only through a [`Round`], which holds the pool's lock from the first post to
//! the last reply. Two threads forwarding, registering and dropping linears at once take turns
//! round by round; none can overwrite another's task or take its reply.
//!
//! The hand-off: every change of a slot's state happens under its mutex, and a side that found
//! nothing to do marks itself sleeping under that mutex before it waits on a condition
//! variable, so the other side, which reads the mark under the same mutex after its change,
//! never misses it (and skips the wake-up system call when nobody sleeps). The atomics mirror
//! the tickets only so that the spin phase can poll without the lock.

use std::time::Duration;

use crate::error::{Error, Result};
use sync::{Arc, AtomicU64, Condvar, Mutex, MutexGuard, Ordering, thread};

/// std, or loom's model-checked replacements under `--cfg loom`.
mod sync {
    #[cfg(loom)]
    pub(crate) use loom::{
        sync::atomic::{AtomicU64, Ordering},
        sync::{Arc, Condvar, Mutex, MutexGuard},
        thread,
    };
    #[cfg(not(loom))]
    pub(crate) use std::{
        sync::atomic::{AtomicU64, Ordering},
        sync::{Arc, Condvar, Mutex, MutexGuard},
        thread,
    };
}

/// What a worker runs.
pub(crate) trait Work: Send + 'static {
    /// Worker-local state (contexts, scratch), created on the worker thread.
    type State;
    /// What a task gives back to the caller.
    type Reply: Send + 'static;
    /// Runs one task on the worker.
    fn run(self, state: &mut Self::State) -> Result<Self::Reply>;
    /// Whether this task ends the worker's loop (sent when the pool is dropped).
    fn is_exit(&self) -> bool;
    /// Work a worker may do after replying, before it waits for its next task; it stops as
    /// soon as `interrupted()` (a task was posted). Default: none.
    fn idle(state: &mut Self::State, interrupted: &dyn Fn() -> bool) {
        let _ = (state, interrupted);
    }
}

struct SlotState<T: Work> {
    task: Option<T>,
    reply: Option<Result<T::Reply>>,
    /// Tickets posted and finished: the worker runs ticket `posted` once `posted > done`.
    posted: u64,
    done: u64,
    worker_sleeping: bool,
    caller_sleeping: bool,
}

struct Slot<T: Work> {
    state: Mutex<SlotState<T>>,
    wake_worker: Condvar,
    wake_caller: Condvar,
    /// Mirrors of `state.posted` / `state.done` for the lock-free spin.
    posted: AtomicU64,
    done: AtomicU64,
    spin: Duration,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Polls `ready()` before the caller falls back to sleeping: first a short busy spin (with the
/// CPU's pause hint), then yielding the CPU for up to `spin`. Yielding rather than spinning
/// keeps the hand-off fast when there are more engine threads than CPUs, where a pure spin
/// would hold the very CPU the other side needs. Under loom only the sleeping path is modelled:
/// it is the one that can lose a wake-up.
fn spin_until(spin: Duration, ready: impl Fn() -> bool) {
    #[cfg(not(loom))]
    {
        for _ in 0..256 {
            if ready() {
                return;
            }
            std::hint::spin_loop();
        }
        let start = std::time::Instant::now();
        while !ready() && start.elapsed() <= spin {
            thread::yield_now();
        }
    }
    #[cfg(loom)]
    let _ = (spin, ready);
}

/// A running worker.
pub(crate) struct Worker<T: Work> {
    slot: Arc<Slot<T>>,
    handle: Option<thread::JoinHandle<()>>,
}

impl<T: Work> Worker<T> {
    /// Starts worker `index`; `init` runs on the new thread and makes its state (pin it, open
    /// its contexts).
    pub(crate) fn spawn(
        index: usize,
        spin: Duration,
        init: impl FnOnce() -> T::State + Send + 'static,
    ) -> Result<Worker<T>> {
        let slot = Arc::new(Slot::<T> {
            state: Mutex::new(SlotState {
                task: None,
                reply: None,
                posted: 0,
                done: 0,
                worker_sleeping: false,
                caller_sleeping: false,
            }),
            wake_worker: Condvar::new(),
            wake_caller: Condvar::new(),
            posted: AtomicU64::new(0),
            done: AtomicU64::new(0),
            spin,
        });
        let s = slot.clone();
        let body = move || {
            let mut state = init();
            let mut seen = 0u64;
            loop {
                T::idle(&mut state, &|| s.posted.load(Ordering::Acquire) > seen);
                spin_until(s.spin, || s.posted.load(Ordering::Acquire) > seen);
                let mut st = lock(&s.state);
                while st.posted <= seen {
                    st.worker_sleeping = true;
                    st = s.wake_worker.wait(st).unwrap_or_else(|e| e.into_inner());
                }
                st.worker_sleeping = false;
                seen = st.posted;
                let task = st.task.take();
                drop(st);
                let Some(task) = task else {
                    continue;
                };
                let exit = task.is_exit();
                // A panic in a task must not leave the caller waiting forever.
                let r =
                    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| task.run(&mut state)))
                        .unwrap_or(Err(Error::WorkerPanicked { worker: index }));
                let mut st = lock(&s.state);
                st.reply = Some(r);
                st.done = seen;
                s.done.store(seen, Ordering::Release);
                let wake = st.caller_sleeping;
                drop(st);
                if wake {
                    s.wake_caller.notify_one();
                }
                if exit {
                    break;
                }
            }
        };
        #[cfg(not(loom))]
        let handle = thread::Builder::new()
            .name(format!("rknn-core{index}"))
            .spawn(body)
            .map_err(|e| Error::Os {
                what: "spawn an engine worker".into(),
                source: e,
            })?;
        #[cfg(loom)]
        let handle = thread::spawn(body);
        Ok(Worker {
            slot,
            handle: Some(handle),
        })
    }

    /// Hands a task to the worker and returns the ticket to wait on. Only a [`Round`] calls
    /// this, holding the pool's lock.
    fn post(&self, task: T) -> u64 {
        let mut st = lock(&self.slot.state);
        st.task = Some(task);
        st.posted += 1;
        let seq = st.posted;
        self.slot.posted.store(seq, Ordering::Release);
        let wake = st.worker_sleeping;
        drop(st);
        if wake {
            self.slot.wake_worker.notify_one();
        }
        seq
    }

    fn wait(&self, seq: u64) -> Result<T::Reply> {
        spin_until(self.slot.spin, || {
            self.slot.done.load(Ordering::Acquire) >= seq
        });
        let mut st = lock(&self.slot.state);
        while st.done < seq {
            st.caller_sleeping = true;
            st = self
                .slot
                .wake_caller
                .wait(st)
                .unwrap_or_else(|e| e.into_inner());
        }
        st.caller_sleeping = false;
        st.reply
            .take()
            .unwrap_or(Err(Error::WorkerPanicked { worker: usize::MAX }))
    }
}

/// Lanes one pool can hold (NPU cores: 3 on RK3588).
pub(crate) const MAX_WORKERS: usize = 8;

/// Each lane's reply of a round, at its lane index.
pub(crate) type Replies<T> = [Option<<T as Work>::Reply>; MAX_WORKERS];

/// What a round holds exclusively: the caller-side state (`S`: the engine's input buffers) and,
/// when the caller runs lane 0 itself, that lane's worker state.
struct RoundState<T: Work, S> {
    scratch: S,
    inline: Option<T::State>,
}

/// The lanes of an engine (one per NPU core): lane 0 on the calling thread when `inline` (a
/// hand-off saved per round, and on the emulator, where every core is a CPU thread, one thread
/// fewer competing for the CPUs), the others on worker threads. The round state sits behind the
/// one lock that makes a round exclusive.
pub(crate) struct Pool<T: Work, S> {
    workers: Vec<Worker<T>>,
    lanes: usize,
    round: Mutex<RoundState<T, S>>,
    exit: fn() -> T,
}

/// Exclusive use of the pool's lanes, from the first post to the last reply.
pub(crate) struct Round<'p, T: Work, S> {
    workers: &'p [Worker<T>],
    state: MutexGuard<'p, RoundState<T, S>>,
    /// Time the caller waited for workers still busy, and in how many `run_all`s.
    waited: (Duration, u64),
}

impl<T: Work, S> Pool<T, S>
where
    T::State: Send,
{
    /// A pool of `workers` thread lanes, after an inline lane 0 when `inline` holds its state;
    /// at most [`MAX_WORKERS`] lanes.
    pub(crate) fn new(
        inline: Option<T::State>,
        workers: Vec<Worker<T>>,
        scratch: S,
        exit: fn() -> T,
    ) -> Result<Pool<T, S>> {
        let lanes = workers.len() + usize::from(inline.is_some());
        if lanes > MAX_WORKERS {
            return Err(Error::EngineConfig {
                field: "cores",
                value: lanes,
                rule: format!("must be at most {MAX_WORKERS}"),
            });
        }
        Ok(Pool {
            workers,
            lanes,
            round: Mutex::new(RoundState { scratch, inline }),
            exit,
        })
    }
}

impl<T: Work, S> Pool<T, S> {
    /// Number of lanes.
    pub(crate) fn len(&self) -> usize {
        self.lanes
    }

    /// Takes the pool for one round (waits for another caller's round to finish).
    pub(crate) fn round(&self) -> Round<'_, T, S> {
        Round {
            workers: &self.workers,
            state: lock(&self.round),
            waited: (Duration::ZERO, 0),
        }
    }
}

impl<'p, T: Work, S> Round<'p, T, S> {
    /// The caller-side state, exclusive for the round.
    pub(crate) fn scratch(&mut self) -> &mut S {
        &mut self.state.scratch
    }

    /// Lane 0's state, when the calling thread runs that lane, and the caller-side state.
    pub(crate) fn inline_parts(&mut self) -> Option<(&mut T::State, &mut S)> {
        let state = &mut *self.state;
        Some((state.inline.as_mut()?, &mut state.scratch))
    }

    /// The time the caller spent waiting for workers since the last call, and the number of
    /// [`Round::run_all`]s in which it had to: those where a worker had not replied yet when
    /// the caller had posted every task and run its own lane's.
    pub(crate) fn take_waited(&mut self) -> (Duration, u64) {
        std::mem::take(&mut self.waited)
    }

    /// Adds a [`Posted::wait_all`]'s waiting to the round's (see [`Round::take_waited`]).
    pub(crate) fn add_waited(&mut self, (time, rounds): (Duration, u64)) {
        self.waited.0 += time;
        self.waited.1 += rounds;
    }

    /// Posts `task(i)` to each worker lane `i` (skipping `None`; the inline lane 0, if any, is
    /// not asked: its caller runs that lane's work itself, with [`Round::inline_state`], and
    /// then waits with [`Posted::wait`]). The returned tickets wait for every posted task when
    /// dropped, so no task outlives the round even when the caller unwinds: a task may write
    /// through pointers into memory the caller lends for the round (the engine's output
    /// rows).
    pub(crate) fn post(
        &mut self,
        mut task: impl FnMut(usize, &mut S) -> Option<T>,
    ) -> Posted<'p, T> {
        let offset = usize::from(self.state.inline.is_some());
        let mut posted = Posted {
            workers: self.workers,
            offset,
            tickets: [None; MAX_WORKERS],
        };
        for (i, w) in self.workers.iter().enumerate() {
            if let Some(t) = task(i + offset, &mut self.state.scratch) {
                posted.tickets[i] = Some(w.post(t));
            }
        }
        posted
    }

    /// Runs `task(i)` on lane `i` (skipping `None`), all at once (the inline lane while the
    /// others run), and waits for all of them even when one fails. Returns each lane's reply,
    /// or the first error. Allocates nothing.
    ///
    /// Every task posted has finished when this returns or unwinds (a panic in `task` or in
    /// the inline lane waits for the workers first). A panic in the inline lane is reported
    /// as [`Error::WorkerPanicked`] for lane 0, like a worker's.
    pub(crate) fn run_all(
        &mut self,
        mut task: impl FnMut(usize, &mut S) -> Option<T>,
    ) -> Result<Replies<T>> {
        let posted = self.post(&mut task);
        let mut first = None;
        let mut inline_reply = None;
        let state = &mut *self.state;
        if let Some(inline) = state.inline.as_mut() {
            if let Some(t) = task(0, &mut state.scratch) {
                // A panic here must not skip the waits below (the round would end with tasks
                // in flight): it is caught and reported like a worker's.
                match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| t.run(inline)))
                    .unwrap_or(Err(Error::WorkerPanicked { worker: 0 }))
                {
                    Ok(r) => inline_reply = Some(r),
                    Err(e) => first = Some(e),
                }
            }
        }
        let (replies, waited) = posted.wait_all();
        self.add_waited(waited);
        let mut replies = match (first, replies) {
            (Some(e), _) | (None, Err(e)) => return Err(e),
            (None, Ok(r)) => r,
        };
        if inline_reply.is_some() {
            replies[0] = inline_reply;
        }
        Ok(replies)
    }
}

/// The tickets of a round's posted tasks that have not been waited for: dropped while
/// unwinding, it waits for each (their replies discarded), so no task outlives its round.
pub(crate) struct Posted<'p, T: Work> {
    workers: &'p [Worker<T>],
    /// The lane index of the first worker (1 when lane 0 is the caller's).
    offset: usize,
    tickets: [Option<u64>; MAX_WORKERS],
}

impl<T: Work> Posted<'_, T> {
    /// Waits for every posted task. Returns each worker lane's reply (at its lane index; lane 0
    /// is the inline lane when there is one, and has none here) or the first error, and the
    /// time spent waiting for tasks that had not finished when this was called, with 1 if
    /// there were any (else 0).
    pub(crate) fn wait_all(mut self) -> (Result<Replies<T>>, (Duration, u64)) {
        let offset = self.offset;
        let mut replies = std::array::from_fn(|_| None);
        let mut first = None;
        // Clock reads only when there is waiting to time.
        let busy = self
            .workers
            .iter()
            .zip(&self.tickets)
            .any(|(w, t)| t.is_some_and(|seq| w.slot.done.load(Ordering::Acquire) < seq));
        let wait_start = busy.then(std::time::Instant::now);
        for (i, w) in self.workers.iter().enumerate() {
            if let Some(seq) = self.tickets[i].take() {
                match w.wait(seq) {
                    Ok(r) => replies[i + offset] = Some(r),
                    Err(Error::WorkerPanicked { .. }) if first.is_none() => {
                        first = Some(Error::WorkerPanicked { worker: i + offset })
                    }
                    Err(e) if first.is_none() => first = Some(e),
                    Err(_) => {}
                }
            }
        }
        let waited = match wait_start {
            Some(t) => (t.elapsed(), 1),
            None => (Duration::ZERO, 0),
        };
        let replies = match first {
            Some(e) => Err(e),
            None => Ok(replies),
        };
        (replies, waited)
    }
}

impl<T: Work> Drop for Posted<'_, T> {
    fn drop(&mut self) {
        for (w, t) in self.workers.iter().zip(&mut self.tickets) {
            if let Some(seq) = t.take() {
                let _ = w.wait(seq);
            }
        }
    }
}

impl<T: Work, S> Drop for Pool<T, S> {
    fn drop(&mut self) {
        let exit = self.exit;
        let mut round = self.round();
        // The inline lane needs no exit task: its state drops with the pool.
        let inline = usize::from(round.state.inline.is_some());
        let _ = round.run_all(|i, _| (i >= inline).then(exit));
        drop(round);
        for w in &mut self.workers {
            if let Some(h) = w.handle.take() {
                let _ = h.join();
            }
        }
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    //! The hand-off, model-checked: every interleaving (up to a preemption bound) of two callers
    //! and a worker delivers each task exactly once and each reply to the caller that posted
    //! it. Run with `RUSTFLAGS="--cfg loom" cargo test -p rknn-matmul --lib --release loom`.
    use super::*;

    enum Job {
        Add(u64),
        Exit,
    }

    impl Work for Job {
        type State = u64;
        type Reply = u64;
        fn run(self, state: &mut u64) -> Result<u64> {
            if let Job::Add(x) = self {
                *state += x;
            }
            Ok(*state)
        }
        fn is_exit(&self) -> bool {
            matches!(self, Job::Exit)
        }
    }

    #[test]
    fn two_callers_one_worker_every_reply_reaches_its_caller() {
        let mut model = loom::model::Builder::new();
        // Bounded preemption keeps the search to seconds; the hand-off has few steps.
        model.preemption_bound = Some(3);
        model.check(|| {
            let workers = vec![Worker::<Job>::spawn(0, Duration::ZERO, || 0).unwrap()];
            let pool = Arc::new(Pool::new(None, workers, (), || Job::Exit).unwrap());
            let p2 = pool.clone();
            let other = thread::spawn(move || {
                let r = p2.round().run_all(|_, _| Some(Job::Add(10))).unwrap();
                r[0].unwrap()
            });
            let mine = pool.round().run_all(|_, _| Some(Job::Add(1))).unwrap()[0].unwrap();
            let theirs = other.join().unwrap();
            // The worker saw both tasks in some order; each caller got the state after its own.
            assert!(
                (mine == 1 && theirs == 11) || (mine == 11 && theirs == 10),
                "{mine} {theirs}"
            );
        });
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    //! The hand-off with the real std primitives, spin phase included: the tests `.ci/miri`
    //! runs so that Miri's data-race and leak detectors see every path (post, spin, sleep,
    //! wake, a panicking task, several callers, the exit on drop).
    use super::*;

    enum Job {
        Add(u64),
        Sleep(Duration),
        SleepThenSet(Duration, Arc<std::sync::atomic::AtomicBool>),
        Panic,
        Exit,
    }

    impl Work for Job {
        type State = u64;
        type Reply = u64;
        fn run(self, state: &mut u64) -> Result<u64> {
            match self {
                Job::Add(x) => *state += x,
                Job::Sleep(d) => thread::sleep(d),
                Job::SleepThenSet(d, flag) => {
                    thread::sleep(d);
                    flag.store(true, Ordering::Release);
                }
                Job::Panic => panic!("a task that panics"),
                Job::Exit => {}
            }
            Ok(*state)
        }
        fn is_exit(&self) -> bool {
            matches!(self, Job::Exit)
        }
    }

    fn pool(inline: bool, workers: usize, spin: Duration) -> Pool<Job, Vec<u64>> {
        let ws = (0..workers)
            .map(|i| Worker::<Job>::spawn(i, spin, || 0).expect("spawn"))
            .collect();
        Pool::new(inline.then_some(0), ws, Vec::new(), || Job::Exit).expect("a pool")
    }

    #[test]
    fn every_lane_runs_its_task_and_replies_to_its_caller() {
        // Zero spin: every wait sleeps on the condition variable; a long one: it spins.
        for spin in [Duration::ZERO, Duration::from_millis(50)] {
            let p = pool(true, 2, spin);
            let rounds = if cfg!(miri) { 3 } else { 100 };
            std::thread::scope(|s| {
                for t in 0..2u64 {
                    let p = &p;
                    s.spawn(move || {
                        for r in 0..rounds {
                            let mut round = p.round();
                            let before = round.scratch().len();
                            round.scratch().push(t);
                            let replies = round
                                .run_all(|i, _| Some(Job::Add((i as u64 + 1) * 1000 + t)))
                                .expect("no task fails");
                            // Lane i's state grew by its task: each reply is at least it.
                            for (i, reply) in replies.iter().take(3).enumerate() {
                                let got = reply.expect("every lane replied");
                                assert!(got >= (i as u64 + 1) * 1000, "{t} {r} lane {i}: {got}");
                            }
                            assert_eq!(round.scratch().len(), before + 1);
                        }
                    });
                }
            });
            // Every task ran once on its lane: lane i holds rounds × 2 × (i + 1) × 1000 + the ts.
            let r = p.round().run_all(|_, _| Some(Job::Add(0))).expect("ok");
            for (i, reply) in r.iter().take(3).enumerate() {
                let want = rounds * 2 * (i as u64 + 1) * 1000 + rounds;
                assert_eq!(reply.expect("replied"), want, "lane {i}");
            }
            assert!(r[3].is_none());
        }
    }

    #[test]
    fn a_panicking_task_is_an_error_and_the_pool_goes_on() {
        let p = pool(true, 2, Duration::ZERO);
        let e = p
            .round()
            .run_all(|i, _| Some(if i == 2 { Job::Panic } else { Job::Add(1) }))
            .unwrap_err();
        assert!(matches!(e, Error::WorkerPanicked { worker: 2 }), "{e}");
        let e = p
            .round()
            .run_all(|i, _| Some(if i == 0 { Job::Panic } else { Job::Add(1) }))
            .unwrap_err();
        assert!(matches!(e, Error::WorkerPanicked { worker: 0 }), "{e}");
        // Lanes 1 and 2 ran both rounds' tasks (lane 2's panic lost its state change only).
        let r = p.round().run_all(|_, _| Some(Job::Add(0))).expect("ok");
        assert_eq!(r[1], Some(2));
        assert_eq!(r[2], Some(1));
    }

    #[test]
    fn a_round_unwinding_from_its_caller_waits_for_the_tasks_it_posted() {
        // Lane 1's task is posted and sleeps, then sets a flag; making lane 2's task panics on
        // the caller. The round must not unwind past its posted task (tasks may write into
        // memory the caller lends for the round): when the panic reaches us, the flag is set.
        let p = pool(true, 2, Duration::ZERO);
        let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let slow = Duration::from_millis(if cfg!(miri) { 1 } else { 30 });
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            p.round().run_all(|i, _| match i {
                1 => Some(Job::SleepThenSet(slow, done.clone())),
                // Without the panic hook, whose backtrace (RUST_BACKTRACE) can take longer
                // than the task's sleep.
                2 => std::panic::resume_unwind(Box::new("building lane 2's task")),
                _ => Some(Job::Add(1)),
            })
        }));
        assert!(r.is_err(), "the caller's panic propagates");
        assert!(
            done.load(Ordering::Acquire),
            "the round unwound while its posted task was still running"
        );
        // The pool goes on.
        let r = p.round().run_all(|_, _| Some(Job::Add(0))).expect("ok");
        assert_eq!(r[1], Some(0));
    }

    #[test]
    #[cfg_attr(miri, ignore)] // Sleeps for real; the hand-off paths are covered above.
    fn the_caller_times_its_waits_only_for_workers_still_busy() {
        let p = pool(true, 1, Duration::from_millis(1));
        let mut round = p.round();
        let slow = Duration::from_millis(40);
        // The worker (lane 1) sleeps while the caller's own lane is done at once: it waits.
        round
            .run_all(|i, _| {
                Some(if i == 1 {
                    Job::Sleep(slow)
                } else {
                    Job::Add(1)
                })
            })
            .expect("ok");
        let (waited, rounds) = round.take_waited();
        assert_eq!(rounds, 1);
        assert!(waited >= slow / 2, "{waited:?}");
        assert_eq!(round.take_waited(), (Duration::ZERO, 0), "taken");
        // The caller's own lane is the slow one: the worker's reply is in when it looks.
        round
            .run_all(|i, _| {
                Some(if i == 0 {
                    Job::Sleep(slow * 5)
                } else {
                    Job::Add(1)
                })
            })
            .expect("ok");
        // With no task posted there is nothing to wait for.
        round
            .run_all(|i, _| (i == 0).then_some(Job::Add(1)))
            .expect("ok");
        assert_eq!(round.take_waited(), (Duration::ZERO, 0));
    }

    #[test]
    fn a_pool_without_an_inline_lane_exits_its_workers_on_drop() {
        let p = pool(false, 3, Duration::from_micros(10));
        let r = p
            .round()
            .run_all(|i, _| (i != 1).then_some(Job::Add(5)))
            .expect("ok");
        assert_eq!(r[..3], [Some(5), None, Some(5)]);
        drop(p); // joins the three workers: a lost exit would hang here
    }
}
