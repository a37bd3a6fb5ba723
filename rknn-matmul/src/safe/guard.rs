//! Guards against the NPU's field hazards (fact sheet §9):
//!
//! * every NPU memory holds a dma-buf file descriptor, and the runtime segfaults once the
//!   process runs out (near 1020 under the common `ulimit -n 1024`): the soft RLIMIT_NOFILE is
//!   raised toward the hard limit, and a handle budget turns exhaustion into a typed error;
//! * the NPU is single-tenant: two processes driving it have panicked the kernel, so a
//!   process-wide exclusive file lock makes the second process fail with "NPU busy (held by
//!   pid N)";
//! * librknnrt may unmap ranges that alias glibc's mmap-backed large mallocs: the known
//!   workaround, `mallopt(M_MMAP_MAX, 0)`, is applied before NPU memory is created.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, Write};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};

use crate::error::{Error, Result};

/// Default path of the NPU lock file: one per machine, shared by every user.
pub const DEFAULT_LOCK_PATH: &str = "/tmp/rknn-npu.lock";

/// File descriptors kept free for the rest of the process when sizing the handle budget.
pub const FD_RESERVE: usize = 64;

/// The soft and hard RLIMIT_NOFILE after [`raise_fd_limit`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FdLimit {
    /// The soft limit in force.
    pub soft: u64,
    /// The hard limit.
    pub hard: u64,
    /// The soft limit before it was raised.
    pub soft_before: u64,
}

/// Raises the soft RLIMIT_NOFILE to the hard limit (capped at 1 << 20, since an unlimited hard
/// limit would make some programs allocate per-fd tables) and reports both.
// `rlim_t` is 32-bit on some 32-bit targets: the casts are not always no-ops.
#[allow(clippy::unnecessary_cast)]
pub fn raise_fd_limit() -> Result<FdLimit> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `lim` is a valid out-pointer.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return Err(Error::Os {
            what: "getrlimit(RLIMIT_NOFILE)".into(),
            source: std::io::Error::last_os_error(),
        });
    }
    let before = lim.rlim_cur as u64;
    let target = (lim.rlim_max as u64).min(1 << 20);
    if target > before {
        let new = libc::rlimit {
            rlim_cur: target as libc::rlim_t,
            rlim_max: lim.rlim_max,
        };
        // SAFETY: valid pointer to an initialised rlimit.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &new) } == 0 {
            lim.rlim_cur = new.rlim_cur;
        }
    }
    Ok(FdLimit {
        soft: lim.rlim_cur as u64,
        hard: lim.rlim_max as u64,
        soft_before: before,
    })
}

/// Counts live NPU memories against a budget, so that exhaustion is an error before the
/// runtime fails (or, on the real device, crashes).
#[derive(Debug)]
pub struct HandleBudget {
    live: AtomicUsize,
    budget: usize,
}

impl HandleBudget {
    /// A budget of `budget` live memories.
    pub fn new(budget: usize) -> HandleBudget {
        HandleBudget {
            live: AtomicUsize::new(0),
            budget,
        }
    }

    /// The budget sized from a file-descriptor limit.
    pub fn for_fd_limit(soft: u64) -> HandleBudget {
        // A limit beyond usize (RLIM_INFINITY on a 32-bit target) is no limit at all.
        let soft = usize::try_from(soft).unwrap_or(usize::MAX);
        HandleBudget::new(soft.saturating_sub(FD_RESERVE).max(1))
    }

    /// Takes one handle, or fails with [`Error::HandleBudget`].
    pub(crate) fn acquire(&self) -> Result<()> {
        // A compare-and-swap loop (`fetch_update` is deprecated on nightly for `try_update`,
        // which the MSRV lacks).
        let mut live = self.live.load(Ordering::Acquire);
        loop {
            if live >= self.budget {
                return Err(Error::HandleBudget {
                    live,
                    budget: self.budget,
                });
            }
            match self.live.compare_exchange_weak(
                live,
                live + 1,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return Ok(()),
                Err(seen) => live = seen,
            }
        }
    }

    /// Returns one handle.
    pub(crate) fn release(&self) {
        self.live.fetch_sub(1, Ordering::AcqRel);
    }

    /// Live memories.
    pub fn live(&self) -> usize {
        self.live.load(Ordering::Acquire)
    }

    /// The budget.
    pub fn budget(&self) -> usize {
        self.budget
    }
}

/// An exclusive, process-wide lock on the NPU: an `flock` on a file that names its holder.
/// Runtimes of one process share it (the NPU is single-tenant between processes, not between
/// runtimes of one process); it is released when the last of them drops it (or when the
/// process dies, by the kernel).
#[derive(Debug, Clone)]
pub struct NpuLock {
    held: Arc<HeldLock>,
}

#[derive(Debug)]
struct HeldLock {
    file: File,
    path: PathBuf,
}

/// The locks this process holds, by path: a second runtime shares the first one's lock instead
/// of failing on its own `flock` (which the kernel ties to the open file, not the process).
static HELD: Mutex<Vec<(PathBuf, Weak<HeldLock>)>> = Mutex::new(Vec::new());

impl NpuLock {
    /// Takes the lock at `path` without waiting (or shares it, when this process holds it
    /// already); fails with [`Error::NpuBusy`] naming the holder's pid when another process has
    /// it.
    pub fn acquire(path: &Path) -> Result<NpuLock> {
        let mut held = HELD.lock().unwrap_or_else(PoisonError::into_inner);
        held.retain(|(_, w)| w.strong_count() > 0);
        if let Some(lock) = held
            .iter()
            .find(|(p, _)| p == path)
            .and_then(|(_, w)| w.upgrade())
        {
            return Ok(NpuLock { held: lock });
        }
        // A lock of this process whose last user is being dropped right now still holds the
        // flock for a moment: wait for its release rather than report ourselves as busy.
        let me = std::process::id();
        let mut tries = 0;
        let lock = loop {
            match HeldLock::take(path) {
                Err(Error::NpuBusy { pid: Some(p), .. }) if p == me && tries < 10_000 => {
                    tries += 1;
                    std::thread::yield_now();
                }
                r => break Arc::new(r?),
            }
        };
        held.push((path.to_path_buf(), Arc::downgrade(&lock)));
        Ok(NpuLock { held: lock })
    }

    /// Which other process holds the lock at `path`, if any (`None` when free or held by this
    /// process).
    pub fn holder(path: &Path) -> Option<u32> {
        let mine = HELD
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .any(|(p, w)| p == path && w.strong_count() > 0);
        if mine {
            return None;
        }
        match HeldLock::take(path) {
            Err(Error::NpuBusy { pid, .. }) => pid.or(Some(0)),
            _ => None,
        }
    }

    /// The lock file.
    pub fn path(&self) -> &Path {
        &self.held.path
    }
}

impl HeldLock {
    fn take(path: &Path) -> Result<HeldLock> {
        let os = |what: &str, source| Error::Os {
            what: format!("{what} {}", path.display()),
            source,
        };
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .map_err(|e| os("open", e))?;
        // SAFETY: flock on a file descriptor we own.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            let err = std::io::Error::last_os_error();
            if err.raw_os_error() == Some(libc::EWOULDBLOCK) {
                let mut s = String::new();
                let _ = file.read_to_string(&mut s);
                return Err(Error::NpuBusy {
                    pid: s.trim().parse().ok(),
                    path: path.to_path_buf(),
                });
            }
            return Err(os("flock", err));
        }
        file.set_len(0).map_err(|e| os("truncate", e))?;
        file.rewind().map_err(|e| os("rewind", e))?;
        write!(file, "{}", std::process::id()).map_err(|e| os("write", e))?;
        file.flush().map_err(|e| os("flush", e))?;
        Ok(HeldLock {
            file,
            path: path.to_path_buf(),
        })
    }
}

impl Drop for HeldLock {
    fn drop(&mut self) {
        let _ = self.file.set_len(0);
        // SAFETY: unlock our own descriptor; closing it would unlock too.
        unsafe { libc::flock(self.file.as_raw_fd(), libc::LOCK_UN) };
    }
}

/// Applies `mallopt(M_MMAP_MAX, 0)` so that glibc serves large allocations from the heap
/// instead of private mmaps, which librknnrt has been seen to unmap. Returns whether glibc
/// accepted it (always false off glibc).
pub fn disable_malloc_mmap() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: mallopt only changes allocator tuning; M_MMAP_MAX = 0 is a documented value.
        unsafe { libc::mallopt(libc::M_MMAP_MAX, 0) == 1 }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_handle_budget_is_exact_under_contention() {
        let budget = HandleBudget::new(100);
        let (granted, refused) = std::thread::scope(|s| {
            let threads: Vec<_> = (0..4)
                .map(|_| {
                    s.spawn(|| {
                        let (mut ok, mut refused) = (0, 0);
                        for _ in 0..50 {
                            match budget.acquire() {
                                Ok(()) => ok += 1,
                                Err(Error::HandleBudget { live, budget: b }) => {
                                    assert_eq!((live, b), (100, 100));
                                    refused += 1;
                                }
                                Err(e) => panic!("{e}"),
                            }
                        }
                        (ok, refused)
                    })
                })
                .collect();
            threads
                .into_iter()
                .map(|t| t.join().unwrap())
                .fold((0, 0), |(a, b), (c, d)| (a + c, b + d))
        });
        assert_eq!((granted, refused), (100, 100));
        assert_eq!(budget.live(), 100);
        budget.release();
        assert!(budget.acquire().is_ok());
        assert!(budget.acquire().is_err());
    }

    #[test]
    fn an_unlimited_fd_limit_is_the_largest_budget() {
        assert_eq!(
            HandleBudget::for_fd_limit(u64::MAX).budget(),
            usize::MAX - FD_RESERVE
        );
        assert_eq!(HandleBudget::for_fd_limit(0).budget(), 1);
    }
}
