//! A reader-writer lock whose readers on different threads write different cache lines.
//!
//! Why: every call into the emulator looks up its instance and then its contexts and memories,
//! and these tables change only when something is created or destroyed. Under a plain
//! `RwLock` every read lock and unlock is an atomic write to the one lock word, so two
//! emulated NPU cores calling at once (as the engine's lanes do on every linear) pass that
//! cache line between their CPUs several times per run. Measured with
//! `cargo bench --bench safe_layer_overhead` (AMD EPYC guest, 2 vCPUs, 2026-12-02): a run of
//! M = 1, K = N = 32 with A rebound (four calls) took 0.65 µs on one thread, and 1.0 µs on each
//! of two threads on one emulator against 0.75 µs on two emulators.
//!
//! Here a reader locks one of [`SHARDS`] read locks, the one of its thread, each on its own
//! cache line; a writer locks all of them, in order. Reads stay as cheap as an uncontended
//! `RwLock`; writes cost `SHARDS` lock operations, which creation and destruction can afford.

use std::cell::UnsafeCell;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// Read locks per lock: more than the threads that call at once on a board (3 NPU cores and
/// the caller); threads beyond that share shards, which is correct, only slower.
pub(crate) const SHARDS: usize = 8;

/// One read lock on its own cache line (128 bytes: two lines, for the adjacent-line prefetch).
#[repr(align(128))]
struct Shard(RwLock<()>);

/// The reader-writer lock (see the module documentation). Poisoning is ignored, as the
/// emulator's state stays consistent through a panic (each change is one insert or remove).
pub(crate) struct BrLock<T> {
    shards: [Shard; SHARDS],
    value: UnsafeCell<T>,
}

// SAFETY: the value is reached only through the guards below: shared references while one
// shard is read-locked (no writer can hold all shards then), a unique reference while every
// shard is write-locked (no reader holds any). That is `RwLock<T>`'s contract, so the same
// bounds apply.
unsafe impl<T: Send> Send for BrLock<T> {}
// SAFETY: as above; readers on several threads share `&T`, hence `T: Sync`.
unsafe impl<T: Send + Sync> Sync for BrLock<T> {}

/// The shard of the calling thread: threads take shards in turn as they first read.
fn my_shard() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static MINE: usize = NEXT.fetch_add(1, Ordering::Relaxed) % SHARDS;
    }
    MINE.with(|m| *m)
}

impl<T> BrLock<T> {
    pub(crate) const fn new(value: T) -> BrLock<T> {
        BrLock {
            shards: [const { Shard(RwLock::new(())) }; SHARDS],
            value: UnsafeCell::new(value),
        }
    }

    /// Shared access, locking the calling thread's shard only.
    pub(crate) fn read(&self) -> BrReadGuard<'_, T> {
        let shard = &self.shards[my_shard()].0;
        BrReadGuard {
            _guard: shard.read().unwrap_or_else(PoisonError::into_inner),
            // SAFETY: this thread's shard is read-locked, so no writer holds every shard until
            // the guard drops; writers are the only source of `&mut T`.
            value: unsafe { &*self.value.get() },
        }
    }

    /// Exclusive access, locking every shard in index order (the same order for every
    /// writer, so two writers cannot each hold a shard the other waits for).
    pub(crate) fn write(&self) -> BrWriteGuard<'_, T> {
        let guards = self
            .shards
            .each_ref()
            .map(|s| s.0.write().unwrap_or_else(PoisonError::into_inner));
        BrWriteGuard {
            _guards: guards,
            // SAFETY: every shard is write-locked until the guard drops: no reader and no
            // other writer can reach the value meanwhile.
            value: unsafe { &mut *self.value.get() },
        }
    }
}

/// Shared access to a [`BrLock`]'s value.
pub(crate) struct BrReadGuard<'a, T> {
    _guard: RwLockReadGuard<'a, ()>,
    value: &'a T,
}

impl<T> Deref for BrReadGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        self.value
    }
}

/// Exclusive access to a [`BrLock`]'s value.
pub(crate) struct BrWriteGuard<'a, T> {
    _guards: [RwLockWriteGuard<'a, ()>; SHARDS],
    value: &'a mut T,
}

impl<T> Deref for BrWriteGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        self.value
    }
}

impl<T> DerefMut for BrWriteGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        self.value
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn readers_on_many_threads_see_every_write_whole() {
        // Writers keep the two halves equal; a reader that saw a half-done write would find
        // them different.
        let lock = Arc::new(BrLock::new((0u64, 0u64)));
        let threads = if cfg!(miri) { 3 } else { 2 * SHARDS + 1 };
        let rounds = if cfg!(miri) { 20 } else { 2_000 };
        std::thread::scope(|s| {
            for t in 0..threads {
                let lock = lock.clone();
                s.spawn(move || {
                    for i in 0..rounds {
                        if (i + t) % 5 == 0 {
                            let mut w = lock.write();
                            w.0 += 1;
                            w.1 += 1;
                        } else {
                            let r = lock.read();
                            assert_eq!(r.0, r.1);
                        }
                    }
                });
            }
        });
        let r = lock.read();
        let writes = (0..threads)
            .map(|t| (0..rounds).filter(|i| (i + t) % 5 == 0).count() as u64)
            .sum::<u64>();
        assert_eq!(*r, (writes, writes));
    }

    #[test]
    fn a_thread_may_read_twice_while_no_writer_waits() {
        let lock = BrLock::new(7);
        let (a, b) = (lock.read(), lock.read());
        assert_eq!(*a + *b, 14);
    }
}
