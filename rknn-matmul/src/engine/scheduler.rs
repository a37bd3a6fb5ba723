//! The per-core scheduler: one persistent worker thread per NPU core, each owning its
//! contexts (one context is never touched by two threads) and its scratch, fed through a slot
//! that the worker spins on briefly before parking. Spinning keeps the hand-off in the
//! microseconds when linears come back to back (decode); parking keeps idle workers off the CPU.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::thread::{JoinHandle, Thread};
use std::time::{Duration, Instant};

use crate::error::{Error, Result};

/// What a worker runs. `T` is the engine's task type.
pub(crate) trait Work: Send + 'static {
    /// Worker-local state (contexts, scratch), created on the worker thread.
    type State;
    /// Runs one task on the worker.
    fn run(self, state: &mut Self::State) -> Result<()>;
}

struct Slot<T> {
    task: Mutex<Option<T>>,
    result: Mutex<Option<Result<()>>>,
    posted: AtomicU64,
    done: AtomicU64,
    worker: OnceLock<Thread>,
    waiter: Mutex<Option<Thread>>,
    spin: Duration,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Waits until `ready()`: first a short busy spin (with the CPU's pause hint), then yielding
/// the CPU for up to `spin`, then parking until unparked. Yielding rather than spinning keeps
/// the hand-off fast when there are more engine threads than CPUs, where a pure spin would
/// hold the very CPU the other side needs.
fn wait_until(spin: Duration, ready: impl Fn() -> bool) {
    for _ in 0..256 {
        if ready() {
            return;
        }
        std::hint::spin_loop();
    }
    let start = Instant::now();
    while !ready() {
        if start.elapsed() > spin {
            while !ready() {
                std::thread::park();
            }
            return;
        }
        std::thread::yield_now();
    }
}

/// A running worker.
pub(crate) struct Worker<T: Work> {
    slot: Arc<Slot<T>>,
    handle: Option<JoinHandle<()>>,
}

impl<T: Work> Worker<T> {
    /// Starts a worker; `init` runs on the new thread and makes its state (pin it, open its
    /// contexts). `exit` is the task that makes the loop end when the worker is dropped.
    pub(crate) fn spawn(
        name: String,
        spin: Duration,
        init: impl FnOnce() -> T::State + Send + 'static,
        is_exit: fn(&T) -> bool,
    ) -> Result<Worker<T>> {
        let slot = Arc::new(Slot {
            task: Mutex::new(None),
            result: Mutex::new(None),
            posted: AtomicU64::new(0),
            done: AtomicU64::new(0),
            worker: OnceLock::new(),
            waiter: Mutex::new(None),
            spin,
        });
        let s = slot.clone();
        let handle = std::thread::Builder::new()
            .name(name)
            .spawn(move || {
                let _ = s.worker.set(std::thread::current());
                let mut state = init();
                let mut seen = 0u64;
                loop {
                    wait_until(s.spin, || s.posted.load(Ordering::Acquire) > seen);
                    seen = s.posted.load(Ordering::Acquire);
                    let Some(task) = lock(&s.task).take() else {
                        continue;
                    };
                    let exit = is_exit(&task);
                    // A panic in a task must not leave the caller waiting forever.
                    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        task.run(&mut state)
                    }))
                    .unwrap_or_else(|_| Err(Error::Invalid("an engine worker panicked".into())));
                    *lock(&s.result) = Some(r);
                    s.done.store(seen, Ordering::Release);
                    if let Some(t) = lock(&s.waiter).as_ref() {
                        t.unpark();
                    }
                    if exit {
                        break;
                    }
                }
            })
            .map_err(|e| Error::Os {
                what: "spawn an engine worker".into(),
                source: e,
            })?;
        // Wait until the worker can be unparked.
        while slot.worker.get().is_none() {
            std::thread::yield_now();
        }
        Ok(Worker {
            slot,
            handle: Some(handle),
        })
    }

    /// Hands a task to the worker and returns the ticket to wait on.
    fn post(&self, task: T) -> u64 {
        *lock(&self.slot.waiter) = Some(std::thread::current());
        *lock(&self.slot.task) = Some(task);
        let seq = self.slot.posted.fetch_add(1, Ordering::AcqRel) + 1;
        if let Some(t) = self.slot.worker.get() {
            t.unpark();
        }
        seq
    }

    fn wait(&self, seq: u64) -> Result<()> {
        wait_until(self.slot.spin, || {
            self.slot.done.load(Ordering::Acquire) >= seq
        });
        lock(&self.slot.result).take().unwrap_or(Ok(()))
    }
}

impl<T: Work> Drop for Worker<T> {
    fn drop(&mut self) {
        if let Some(h) = self.handle.take() {
            // The caller sent the exit task already (see `Pool::drop`); joining reaps the thread.
            let _ = h.join();
        }
    }
}

/// Workers one pool can hold (NPU cores: 3 on RK3588).
pub(crate) const MAX_WORKERS: usize = 8;

/// All workers of an engine.
pub(crate) struct Pool<T: Work> {
    workers: Vec<Worker<T>>,
    exit: fn() -> T,
}

impl<T: Work> Pool<T> {
    pub(crate) fn new(workers: Vec<Worker<T>>, exit: fn() -> T) -> Pool<T> {
        assert!(
            workers.len() <= MAX_WORKERS,
            "at most {MAX_WORKERS} workers"
        );
        Pool { workers, exit }
    }

    /// Number of workers.
    pub(crate) fn len(&self) -> usize {
        self.workers.len()
    }

    /// Runs `task(i)` on worker `i` (skipping `None`), all at once, and waits for all of them
    /// even when one fails: the tasks may point into the caller's buffers, which must outlive
    /// every use. Returns the first error. Allocates nothing.
    pub(crate) fn run_all(&self, mut task: impl FnMut(usize) -> Option<T>) -> Result<()> {
        let mut tickets = [None; MAX_WORKERS];
        for (i, (w, t)) in self.workers.iter().zip(&mut tickets).enumerate() {
            *t = task(i).map(|task| w.post(task));
        }
        let mut first = Ok(());
        for (w, t) in self.workers.iter().zip(tickets) {
            if let Some(seq) = t {
                let r = w.wait(seq);
                if first.is_ok() {
                    first = r;
                }
            }
        }
        first
    }
}

impl<T: Work> Drop for Pool<T> {
    fn drop(&mut self) {
        let exit = self.exit;
        let _ = self.run_all(|_| Some(exit()));
    }
}
