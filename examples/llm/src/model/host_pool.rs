//! The host thread pool a [`Model`](super::Model) runs its host work on, [`HostPool`], and
//! [`host_pool`], whose member 0 is the thread that drives the model.
//!
//! Why a thread of the program in the pool: [`Model::forward`](super::Model::forward) runs
//! inside its pool. Called from a thread outside the pool, every pass is injected into the
//! pool, which wakes a pool thread to run it while the caller sleeps; the pool's other
//! threads, woken with it, then spin and yield looking for work that decode never gives them
//! (one row per pass runs on one thread). On the emulator the engine's NPU workers are busy
//! CPU threads too, so a spinning host thread takes their CPU: on the two-CPU development
//! machine (2026-12-01) such a thread took 12 % of a CPU and preempted the engine worker about
//! 5 500 times a second during decode; with the caller in the pool, 0 % and none, and decode
//! tg64 went from 263-278 to 287-293 tok/s in three alternating pairs.
//!
//! The price: such a pool's member 0 takes work only while that thread is inside the pool
//! (running a pass). Another thread can use the model all the same: its passes run on the
//! pool's other threads, or, when the pool has one thread in all, on the calling thread itself
//! (a model with one host thread never hands work to its pool). [`HostPool`] remembers which
//! thread is its member 0; [`ModelBuilder::serve`](crate::ModelBuilder::serve) loads a model on
//! a [`Batcher`](crate::serve::Batcher)'s own thread so that the batcher's passes run there
//! directly.

use std::sync::Arc;
use std::thread::ThreadId;

use rayon::{ThreadPool, ThreadPoolBuildError, ThreadPoolBuilder};

/// A model's host thread pool: a rayon pool, and which thread (if any) is its member 0 (one
/// from [`host_pool`]). Cheap to clone (an `Arc`); dereferences to the [`ThreadPool`].
#[derive(Clone, Debug)]
pub struct HostPool {
    pool: Arc<ThreadPool>,
    driver: Option<ThreadId>,
}

impl HostPool {
    /// An ordinary pool of `threads` worker threads (at least one), for a model driven from
    /// threads that are not in it (a [`Batcher`](crate::serve::Batcher)'s, several at once):
    /// each pass is handed to a pool thread.
    pub fn workers(threads: usize) -> Result<HostPool, ThreadPoolBuildError> {
        let pool = ThreadPoolBuilder::new()
            .num_threads(threads.max(1))
            .thread_name(|i| format!("llm-host-{i}"))
            .build()?;
        Ok(HostPool::from(pool))
    }

    /// The rayon pool.
    pub fn thread_pool(&self) -> &Arc<ThreadPool> {
        &self.pool
    }

    /// The thread that is the pool's member 0 ([`host_pool`]), if a program thread is.
    pub fn driver(&self) -> Option<ThreadId> {
        self.driver
    }

    /// Runs `op` as host work of this pool: on the calling thread when it is in the pool, or
    /// when the pool has one thread in all (which may be another thread's, busy elsewhere, so
    /// that work handed to it would wait); else on a thread of the pool, the caller waiting.
    pub fn run<R: Send>(&self, op: impl FnOnce() -> R + Send) -> R {
        if self.pool.current_num_threads() == 1 && self.pool.current_thread_index().is_none() {
            op()
        } else {
            self.pool.install(op)
        }
    }
}

impl std::ops::Deref for HostPool {
    type Target = ThreadPool;

    fn deref(&self) -> &ThreadPool {
        &self.pool
    }
}

/// An ordinary pool (no program thread in it).
impl From<Arc<ThreadPool>> for HostPool {
    fn from(pool: Arc<ThreadPool>) -> HostPool {
        HostPool { pool, driver: None }
    }
}

/// An ordinary pool (no program thread in it).
impl From<ThreadPool> for HostPool {
    fn from(pool: ThreadPool) -> HostPool {
        HostPool::from(Arc::new(pool))
    }
}

/// A pool of `threads` host threads (at least one) whose member 0 is the calling thread, so
/// that [`Model::forward`](super::Model::forward) called from this thread runs on it directly
/// and the other `threads - 1` stay asleep until a parallel pass (a prompt chunk, long
/// attention) wakes them. The pool works from any thread, as any rayon pool does; it is only
/// fastest from this one.
///
/// A thread can be a member of one pool only: called on a thread that already is (inside
/// another pool, or after an earlier call), this returns an ordinary pool of `threads` worker
/// threads instead ([`HostPool::driver`] says which it got). The calling thread's membership
/// lasts for the life of the process (rayon keeps the registry of such a pool alive), so build
/// one per thread, as `llm-decode` does.
pub fn host_pool(threads: usize) -> Result<HostPool, ThreadPoolBuildError> {
    let threads = threads.max(1);
    let builder = || {
        ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("llm-host-{i}"))
    };
    match builder().use_current_thread().build() {
        Ok(pool) => Ok(HostPool {
            pool: Arc::new(pool),
            driver: Some(std::thread::current().id()),
        }),
        // The calling thread belongs to a pool already.
        Err(_) => HostPool::workers(threads),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_calling_thread_is_member_zero_and_a_second_pool_falls_back() {
        std::thread::spawn(|| {
            let pool = host_pool(2).expect("a pool");
            assert_eq!(pool.driver(), Some(std::thread::current().id()));
            assert_eq!(pool.current_num_threads(), 2);
            assert_eq!(pool.current_thread_index(), Some(0));
            // Work installed from the member runs on it; parallel work reaches the other.
            assert_eq!(pool.install(rayon::current_thread_index), Some(0));
            let sum: u64 = pool.install(|| {
                use rayon::prelude::*;
                (0..10_000u64).into_par_iter().sum()
            });
            assert_eq!(sum, 10_000 * 9_999 / 2);
            // This thread is taken: the next pool is an ordinary one, and works.
            let other = host_pool(3).expect("a fallback pool");
            assert_eq!(other.driver(), None);
            assert_eq!(other.current_num_threads(), 3);
            assert_eq!(other.current_thread_index(), None);
            assert!(other.install(|| rayon::current_thread_index().is_some()));
        })
        .join()
        .expect("the test thread");
    }

    #[test]
    fn another_thread_runs_its_work_on_a_one_thread_pool_itself_and_on_the_others_else() {
        std::thread::spawn(|| {
            let (one, two) = (host_pool(1).unwrap(), HostPool::workers(2).unwrap());
            // This thread drives `one`; from here its work runs here, in the pool.
            assert_eq!(one.run(rayon::current_thread_index), Some(0));
            let other = std::thread::spawn(move || {
                // Handed to `one`, it would wait for this thread's parent forever.
                let here = one.run(|| std::thread::current().id());
                assert_eq!(here, std::thread::current().id());
                assert!(two.run(rayon::current_thread_index).is_some());
            });
            other.join().expect("no stall, no panic");
        })
        .join()
        .expect("the test thread");
    }

    #[test]
    fn zero_threads_means_one() {
        std::thread::spawn(|| {
            let pool = host_pool(0).expect("a pool");
            assert_eq!(pool.current_num_threads(), 1);
            assert_eq!(pool.install(rayon::current_thread_index), Some(0));
            let workers = HostPool::workers(0).expect("a pool");
            assert_eq!((workers.current_num_threads(), workers.driver()), (1, None));
        })
        .join()
        .expect("the test thread");
    }
}
