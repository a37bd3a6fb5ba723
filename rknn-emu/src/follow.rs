//! Prefetching the context that ran next on this thread last time, at the end of each run.
//!
//! Why: a program that runs many contexts in turn, as a decoder's linears do once per token,
//! streams its weights through the CPU caches between two runs of the same context, so every
//! run starts with a chain of misses on the context's own records (about 200 ns each in the
//! guest this was measured on). The order in which one thread runs its contexts repeats from
//! token to token, so at the end of a run the emulator asks the CPU to fetch the records of the
//! context that followed this one last time, while the caller does its other work.
//!
//! Measured on the demo model's decode (in-process ABBA of the decode bench with this switched
//! on and off by a throwaway toggle, 2026-12-02, AMD EPYC guest, 2 vCPUs): medians 1.012 and
//! 1.014 over 200 pairs.
//!
//! What is fetched: addresses only, recorded when the following context ran, and given to
//! the CPU's prefetch instruction, which never faults; a stale address (the context was
//! destroyed since) costs a useless fetch, nothing else. Nothing here is ever dereferenced.

use std::cell::RefCell;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};

use crate::context::Context;

/// Addresses a run reads first: the context's cell, its current descriptors, and B's memory
/// record (A and C are usually shared by all the contexts of a core, and hot).
pub(crate) const HINTS: usize = 3;

/// Bytes fetched from each address: the cell holds the whole `Context`, the other two are
/// small records.
const SPANS: [usize; HINTS] = [512, 128, 128];

/// A context as the instance's table holds it: the context behind its lock, and the addresses
/// to prefetch after it runs.
pub(crate) struct ContextCell {
    pub(crate) ctx: Mutex<Context>,
    /// What the context that ran after this one on the same thread read first (0: nothing
    /// recorded yet). Written by that run, read by this context's next run.
    next: [AtomicUsize; HINTS],
}

impl ContextCell {
    pub(crate) fn new(c: Context) -> ContextCell {
        ContextCell {
            ctx: Mutex::new(c),
            next: [const { AtomicUsize::new(0) }; HINTS],
        }
    }
}

thread_local! {
    /// The context this thread ran last.
    static LAST: RefCell<Weak<ContextCell>> = const { RefCell::new(Weak::new()) };
}

/// The addresses of `c`'s records that a run reads first.
pub(crate) fn hints(cell: &Arc<ContextCell>, c: &Context) -> [usize; HINTS] {
    [
        Arc::as_ptr(cell).addr(),
        std::ptr::from_ref(c.current_descs()).addr(),
        c.bound[1].as_ref().map_or(0, |m| Arc::as_ptr(m).addr()),
    ]
}

/// Called after a successful run of `cell` (which read `hints` first): records them in the
/// context this thread ran before, and prefetches what ran after `cell` last time.
pub(crate) fn ran(cell: &Arc<ContextCell>, hints: [usize; HINTS]) {
    LAST.with(|last| {
        let mut last = last.borrow_mut();
        if !std::ptr::eq(last.as_ptr(), Arc::as_ptr(cell)) {
            if let Some(prev) = last.upgrade() {
                for (slot, h) in prev.next.iter().zip(hints) {
                    // Read first: in the steady state nothing changes, and the line stays clean.
                    if slot.load(Ordering::Relaxed) != h {
                        slot.store(h, Ordering::Relaxed);
                    }
                }
            }
            *last = Arc::downgrade(cell);
        }
    });
    for (slot, span) in cell.next.iter().zip(SPANS) {
        let at = slot.load(Ordering::Relaxed);
        if at != 0 {
            prefetch(at, span);
        }
    }
}

/// Asks the CPU to bring `bytes` from address `at` into its caches. Never faults.
fn prefetch(at: usize, bytes: usize) {
    for line in (at & !63..at.saturating_add(bytes)).step_by(64) {
        prefetch_line(line);
    }
}

#[cfg(all(target_arch = "x86_64", not(miri)))]
fn prefetch_line(at: usize) {
    use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
    // SAFETY: PREFETCHT0 is a hint: it reads nothing architecturally and never faults, whatever
    // the address (Intel SDM vol. 2, PREFETCHh). The pointer is never dereferenced.
    #[allow(unused_unsafe)]
    unsafe {
        _mm_prefetch::<_MM_HINT_T0>(std::ptr::without_provenance::<i8>(at))
    };
}

#[cfg(all(target_arch = "aarch64", not(miri)))]
fn prefetch_line(at: usize) {
    // SAFETY: PRFM is a hint: it never faults and changes no architectural state (Arm ARM
    // C6.2, PRFM); the address is not dereferenced.
    unsafe {
        std::arch::asm!("prfm pldl1keep, [{}]", in(reg) at, options(nostack, preserves_flags, readonly))
    };
}

#[cfg(any(not(any(target_arch = "x86_64", target_arch = "aarch64")), miri))]
fn prefetch_line(_at: usize) {}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::instance::instance;
    use crate::{EmuConfig, Emulator};
    use rknn_sys::*;

    /// A context of M = 1, K = N = 32 (i8) with A, B and C bound.
    fn bound_context(api: &RknnApi) -> rknn_matmul_ctx {
        let mut info = rknn_matmul_info {
            M: 1,
            K: 32,
            N: 32,
            type_: RKNN_INT8_MM_INT8_TO_INT32,
            ..Default::default()
        };
        let mut io = rknn_matmul_io_attr::default();
        let mut ctx: rknn_matmul_ctx = 0;
        // SAFETY: valid pointers for each call; the memories are the sizes io_attr gives and
        // live as long as the emulator (dropped at the end of the test).
        unsafe {
            assert_eq!((api.rknn_matmul_create)(&mut ctx, &mut info, &mut io), 0);
            for attr in [&mut io.A, &mut io.B, &mut io.C] {
                let mem = (api.rknn_create_mem)(ctx, attr.size);
                assert!(!mem.is_null());
                assert_eq!((api.rknn_matmul_set_io_mem)(ctx, mem, attr), 0);
            }
        }
        ctx
    }

    fn next_of(emu: &Emulator, ctx: rknn_matmul_ctx) -> [usize; HINTS] {
        let inst = instance(emu.slot).unwrap();
        let st = inst.state();
        let cell = st.contexts.get(&crate::abi::handle(ctx)).unwrap();
        cell.next.each_ref().map(|a| a.load(Ordering::Relaxed))
    }

    fn hints_of(emu: &Emulator, ctx: rknn_matmul_ctx) -> [usize; HINTS] {
        let inst = instance(emu.slot).unwrap();
        let st = inst.state();
        let cell = st.contexts.get(&crate::abi::handle(ctx)).unwrap();
        let c = cell.ctx.lock().unwrap();
        hints(cell, &c)
    }

    #[test]
    fn a_context_learns_what_ran_after_it_on_its_thread() {
        let emu = Emulator::new(EmuConfig::new(rknn_chip::Platform::Rk3588)).unwrap();
        let api = emu.api();
        let (x, y, z) = (bound_context(api), bound_context(api), bound_context(api));
        // SAFETY: live contexts with A, B and C bound.
        let run = |c| assert_eq!(unsafe { (api.rknn_matmul_run)(c) }, 0);
        run(x);
        assert_eq!(next_of(&emu, x), [0; HINTS], "nothing has run after x yet");
        run(y);
        let after_x = next_of(&emu, x);
        assert_eq!(after_x, hints_of(&emu, y));
        assert!(after_x.iter().all(|&a| a != 0), "{after_x:?}");
        // Another thread's runs are not this thread's order.
        std::thread::scope(|s| {
            s.spawn(|| run(z));
        });
        assert_eq!(next_of(&emu, y), [0; HINTS]);
        // The order changes: x is followed by z now.
        run(x);
        run(z);
        assert_eq!(next_of(&emu, y), hints_of(&emu, x));
        assert_eq!(next_of(&emu, x), hints_of(&emu, z));
        // A context run twice in a row is not its own successor.
        run(z);
        assert_eq!(next_of(&emu, z), [0; HINTS]);
    }
}
