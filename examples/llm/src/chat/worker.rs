//! The render workers: long-lived threads that run chat-template renderings, so that a
//! rendering costs no thread of its own.
//!
//! Templates are untrusted, so a rendering runs on a thread with a large stack
//! ([`RENDER_STACK`]), and its caller waits for it only until its deadline. The design, and why:
//!
//! * **A few workers, started lazily.** A job queued when no worker is free starts one, up to
//!   [`RENDER_WORKERS`]; a free worker waits for the next job. Renderings from many threads at
//!   once (the server renders on tokio's blocking threads) run side by side up to the bound and
//!   queue beyond it; each caller gets its own job's result over its own channel. One worker
//!   would do for the usual renderings (a long conversation costs a few percent of the default
//!   fuel), but a few let short renderings pass one that runs long, and the bound keeps the
//!   stacks reserved to a few.
//! * **A worker busy past its job's deadline is retired.** The caller that timed out (or any
//!   caller queuing a job later) finds it so; it no longer counts towards the bound, so a fresh
//!   worker takes the queue, and the retired one finishes its rendering and exits. The fuel
//!   bounds nearly all of a rendering's work; what runs past a deadline is what the fuel does
//!   not see (minijinja printing or comparing a value that shares its parts exponentially
//!   often), and minijinja cannot stop a rendering from outside, so the retired thread runs
//!   until that rendering ends. A runaway rendering costs its own caller a timeout and one
//!   thread while it runs, never the renderings after it.
//! * **A job whose deadline passed while it was queued is dropped unrun**: its caller has
//!   already been told it timed out.
//! * **A panic is caught** (in minijinja or anywhere in the job): its caller gets the panic's
//!   message as an error, and the worker takes the next job.

use std::collections::VecDeque;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::mpsc;
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

/// The stack of a render worker: room for minijinja's recursion limit, and for values nested
/// as deeply as the fuel lets a template build them (dropping and printing them recurses).
pub(super) const RENDER_STACK: usize = 64 << 20;

/// The most render workers at work at once (retired ones not counted).
pub(super) const RENDER_WORKERS: usize = 4;

/// The workers that render chat templates.
pub(super) static RENDERERS: Pool = Pool::new("chat-template", RENDER_STACK, RENDER_WORKERS);

/// Why a job gave no result.
#[derive(Debug)]
pub(super) enum RunError {
    /// The deadline passed first.
    Timeout,
    /// The job panicked, with this message.
    Panicked(String),
    /// No worker could be started, and none is at work.
    Spawn(std::io::Error),
}

/// Workers taking jobs from one queue (see the module's documentation).
pub(super) struct Pool {
    /// The workers' thread name.
    name: &'static str,
    /// Their stack size.
    stack: usize,
    /// The most workers counted at once.
    max: usize,
    state: Mutex<State>,
    /// Signalled when a job is queued.
    queued: Condvar,
}

struct State {
    queue: VecDeque<Job>,
    /// The workers counted towards the bound: retired ones are removed.
    workers: Vec<Worker>,
    next_id: u64,
    /// Workers started, ever.
    spawned: u64,
    /// Workers retired, ever.
    retired: u64,
}

struct Worker {
    id: u64,
    /// `None` when free; else the deadline of the job it runs (`None` inside: no deadline).
    running: Option<Option<Instant>>,
}

struct Job {
    deadline: Option<Instant>,
    run: Box<dyn FnOnce() + Send>,
}

impl Pool {
    /// A pool with no worker yet: they start with the first jobs.
    pub(super) const fn new(name: &'static str, stack: usize, max: usize) -> Pool {
        Pool {
            name,
            stack,
            max,
            state: Mutex::new(State {
                queue: VecDeque::new(),
                workers: Vec::new(),
                next_id: 0,
                spawned: 0,
                retired: 0,
            }),
            queued: Condvar::new(),
        }
    }

    /// Runs `f` on a worker and waits for its result up to `timeout` (no limit when the
    /// deadline is beyond what `Instant` holds).
    pub(super) fn run<T, F>(&'static self, timeout: Duration, f: F) -> Result<T, RunError>
    where
        T: Send + 'static,
        F: FnOnce() -> T + Send + 'static,
    {
        let deadline = Instant::now().checked_add(timeout);
        let (tx, rx) = mpsc::sync_channel(1);
        let run = Box::new(move || {
            let r = catch_unwind(AssertUnwindSafe(f)).map_err(|p| panic_message(&*p));
            // The caller may have stopped waiting: the result is dropped here then.
            let _ = tx.send(r);
        });
        {
            let mut st = self.lock();
            st.queue.push_back(Job { deadline, run });
            if let Err(e) = self.dispatch(&mut st) {
                if st.workers.is_empty() {
                    // Ours, pushed under this lock: no worker will ever take it.
                    st.queue.pop_back();
                    return Err(RunError::Spawn(e));
                }
            }
        }
        let got = match deadline {
            Some(d) => rx.recv_timeout(d.saturating_duration_since(Instant::now())),
            None => rx.recv().map_err(|_| mpsc::RecvTimeoutError::Disconnected),
        };
        match got {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(why)) => Err(RunError::Panicked(why)),
            // The deadline passed (a job always answers, unless dropped unrun once its
            // deadline passed): retire the worker that overran it, and let a fresh one take
            // the queue.
            Err(_) => {
                let _ = self.dispatch(&mut self.lock());
                Err(RunError::Timeout)
            }
        }
    }

    /// Retires the workers busy past their job's deadline, then starts a worker if a queued
    /// job finds none free and the bound allows, or wakes a free one.
    fn dispatch(&'static self, st: &mut State) -> std::io::Result<()> {
        let now = Instant::now();
        let before = st.workers.len();
        st.workers
            .retain(|w| !matches!(w.running, Some(Some(deadline)) if deadline <= now));
        st.retired += (before - st.workers.len()) as u64;
        if st.queue.is_empty() {
            return Ok(());
        }
        let free = st.workers.iter().filter(|w| w.running.is_none()).count();
        if free > 0 {
            self.queued.notify_one();
        }
        if st.queue.len() > free && st.workers.len() < self.max {
            let id = st.next_id;
            std::thread::Builder::new()
                .name(self.name.into())
                .stack_size(self.stack)
                .spawn(move || self.work(id))?;
            // The new worker looks for its entry under the lock held here: it is there first.
            st.next_id += 1;
            st.workers.push(Worker { id, running: None });
            st.spawned += 1;
        }
        Ok(())
    }

    /// A worker's life: take the next job whose caller still waits, run it, until retired.
    fn work(&'static self, id: u64) {
        let mut st = self.lock();
        loop {
            let Some(me) = st.workers.iter().position(|w| w.id == id) else {
                return; // retired
            };
            let now = Instant::now();
            let job = loop {
                match st.queue.pop_front() {
                    Some(j) if j.deadline.is_some_and(|d| d <= now) => continue,
                    next => break next,
                }
            };
            match job {
                Some(job) => {
                    st.workers[me].running = Some(job.deadline);
                    drop(st);
                    (job.run)();
                    st = self.lock();
                    if let Some(w) = st.workers.iter_mut().find(|w| w.id == id) {
                        w.running = None;
                    }
                }
                None => {
                    st = self.queued.wait(st).unwrap_or_else(PoisonError::into_inner);
                }
            }
        }
    }

    /// The state; no code that can panic runs under the lock, but a poisoned lock is still
    /// consistent, so it is taken either way.
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Workers started and workers retired, since the pool was made.
    #[cfg(test)]
    pub(super) fn counts(&self) -> (u64, u64) {
        let st = self.lock();
        (st.spawned, st.retired)
    }
}

/// The message a panic was raised with (`panic!("...")` carries a `&str` or a `String`).
fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::thread::ThreadId;

    use super::*;

    fn name() -> String {
        std::thread::current()
            .name()
            .unwrap_or_default()
            .to_string()
    }

    #[test]
    fn many_threads_get_their_own_results_from_a_few_workers() {
        static POOL: Pool = Pool::new("pool-many", 1 << 20, 2);
        let workers: HashSet<ThreadId> = std::thread::scope(|s| {
            let callers: Vec<_> = (0..8u64)
                .map(|i| {
                    s.spawn(move || {
                        let mut workers = HashSet::new();
                        for j in 0..50u64 {
                            let n = i * 100 + j;
                            let (sum, id, name) = POOL
                                .run(Duration::from_secs(60), move || {
                                    // Work that depends on the job's own inputs only.
                                    let sum: u64 = (0..=n).sum();
                                    (sum, std::thread::current().id(), name())
                                })
                                .unwrap();
                            assert_eq!(sum, n * (n + 1) / 2, "job {n}");
                            assert_eq!(name, "pool-many");
                            workers.insert(id);
                        }
                        workers
                    })
                })
                .collect();
            callers
                .into_iter()
                .flat_map(|c| c.join().unwrap())
                .collect()
        });
        // 400 jobs, at most two threads: no thread per job.
        assert!((1..=2).contains(&workers.len()), "{workers:?}");
        assert_eq!(POOL.counts(), (workers.len() as u64, 0));
    }

    #[test]
    fn a_job_past_its_deadline_does_not_hold_up_the_next() {
        static POOL: Pool = Pool::new("pool-overrun", 1 << 20, 1);
        // The worker started and free, so that it takes the next job at once.
        let warm = POOL
            .run(Duration::from_secs(60), || std::thread::current().id())
            .unwrap();
        let (release, blocked) = mpsc::channel::<()>();
        let first = POOL.run(Duration::from_millis(200), move || {
            // Runs until the test lets it go: past its deadline, as a runaway rendering does.
            let _ = blocked.recv();
            std::thread::current().id()
        });
        assert!(matches!(first, Err(RunError::Timeout)), "{first:?}");
        assert_eq!(POOL.counts(), (1, 1), "the overrunning worker is retired");
        // With one worker allowed and that one still busy, this is only answered if the
        // overrunning worker was retired and a fresh one started.
        let second = POOL
            .run(Duration::from_secs(60), || std::thread::current().id())
            .unwrap();
        assert_ne!(second, warm);
        assert_eq!(POOL.counts(), (2, 1));
        let _ = release.send(());
        // The fresh worker stays the pool's: no further start.
        let third = POOL
            .run(Duration::from_secs(60), || std::thread::current().id())
            .unwrap();
        assert_eq!(second, third);
        assert_eq!(POOL.counts(), (2, 1));
    }

    #[test]
    fn a_job_whose_deadline_passed_in_the_queue_is_not_run() {
        static POOL: Pool = Pool::new("pool-queue", 1 << 20, 1);
        static RAN: AtomicBool = AtomicBool::new(false);
        let (release, blocked) = mpsc::channel::<()>();
        let (started_tx, started) = mpsc::channel::<()>();
        let long = std::thread::spawn(move || {
            POOL.run(Duration::from_secs(60), move || {
                started_tx.send(()).unwrap();
                blocked.recv().unwrap();
                1
            })
        });
        started.recv().unwrap();
        // The only worker is busy within its deadline: this one waits in the queue, and its
        // caller gives up.
        let queued = POOL.run(Duration::from_millis(20), || {
            RAN.store(true, Ordering::SeqCst)
        });
        assert!(matches!(queued, Err(RunError::Timeout)), "{queued:?}");
        release.send(()).unwrap();
        assert_eq!(long.join().unwrap().unwrap(), 1);
        // Once this ran, the worker has been past the expired job.
        assert_eq!(POOL.run(Duration::from_secs(60), || 2).unwrap(), 2);
        assert!(!RAN.load(Ordering::SeqCst));
        assert_eq!(POOL.counts(), (1, 0));
    }

    #[test]
    fn a_panicking_job_is_an_error_and_its_worker_goes_on() {
        static POOL: Pool = Pool::new("pool-panic", 1 << 20, 1);
        let before = POOL
            .run(Duration::from_secs(60), || std::thread::current().id())
            .unwrap();
        let r = POOL.run(Duration::from_secs(60), || -> u32 {
            panic!("a bug: {}", 42)
        });
        match r {
            Err(RunError::Panicked(why)) => assert_eq!(why, "a bug: 42"),
            other => panic!("{other:?}"),
        }
        let after = POOL
            .run(Duration::from_secs(60), || std::thread::current().id())
            .unwrap();
        assert_eq!(before, after);
        assert_eq!(POOL.counts(), (1, 0));
    }

    #[test]
    fn no_deadline_when_the_timeout_is_beyond_any_instant() {
        static POOL: Pool = Pool::new("pool-forever", 1 << 20, 1);
        assert_eq!(POOL.run(Duration::MAX, || 7).unwrap(), 7);
    }
}
