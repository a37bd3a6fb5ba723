//! The host thread pool a [`Model`](super::Model) runs its host work on, with the thread that
//! drives the model as one of its members.
//!
//! Why: [`Model::forward`](super::Model::forward) runs inside its pool. Called from a thread
//! outside the pool, every pass is injected into the pool, which wakes a pool thread to run it
//! while the caller sleeps; the pool's other threads, woken with it, then spin and yield
//! looking for work that decode never gives them (one row per pass runs on one thread). On
//! the emulator the engine's NPU workers are busy CPU threads too, so a spinning host thread
//! takes their CPU: on the two-CPU development machine (2026-12-01) such a thread took 12 % of
//! a CPU and preempted the engine worker about 5 500 times a second during decode; with the
//! caller in the pool, 0 % and none, and decode tg64 went from 263-278 to 287-293 tok/s in
//! three alternating pairs.

use std::sync::Arc;

use rayon::{ThreadPool, ThreadPoolBuildError, ThreadPoolBuilder};

/// A pool of `threads` host threads (at least one) whose member 0 is the calling thread, so
/// that [`Model::forward`](super::Model::forward) called from this thread runs on it directly
/// and the other `threads - 1` stay asleep until a parallel pass (a prompt chunk, long
/// attention) wakes them. The pool works from any thread, as any rayon pool does; it is only
/// fastest from this one.
///
/// A thread can be a member of one pool only: called on a thread that already is (inside
/// another pool, or after an earlier call), this returns an ordinary pool of `threads` worker
/// threads instead. The calling thread's membership lasts for the life of the process (rayon
/// keeps the registry of such a pool alive), so build one per thread, as `llm-decode` does.
pub fn host_pool(threads: usize) -> Result<Arc<ThreadPool>, ThreadPoolBuildError> {
    let threads = threads.max(1);
    let builder = || {
        ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("llm-host-{i}"))
    };
    let pool = match builder().use_current_thread().build() {
        Ok(pool) => pool,
        // The calling thread belongs to a pool already.
        Err(_) => builder().build()?,
    };
    Ok(Arc::new(pool))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_calling_thread_is_member_zero_and_a_second_pool_falls_back() {
        std::thread::spawn(|| {
            let pool = host_pool(2).expect("a pool");
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
            assert_eq!(other.current_num_threads(), 3);
            assert_eq!(other.current_thread_index(), None);
            assert!(other.install(|| rayon::current_thread_index().is_some()));
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
        })
        .join()
        .expect("the test thread");
    }
}
