//! The owner of a raw matmul context: what a [`Matmul`](super::matmul::Matmul) and its
//! memories share.

use std::sync::{Mutex, MutexGuard, PoisonError};

use rknn_sys::{self as sys, RknnApi};

use super::runtime::Runtime;
use crate::error::Result;
use crate::result;

/// What every object made from a context shares: the handle, its runtime, and the lock that
/// serialises the calls on it. Memories hold an `Arc` of it, so the context is destroyed after
/// the last of them, and a memory dropped on another thread never calls into the context at the
/// same time as its owner (one context used from two threads at once has panicked RK3588's
/// kernel).
pub(crate) struct ContextHandle {
    pub(crate) rt: Runtime,
    ctx: sys::rknn_matmul_ctx,
    /// The IOMMU domain of the context and of every memory allocated on it.
    pub(crate) domain: i32,
    calls: Mutex<()>,
}

/// Exclusive use of a context for one call ([`ContextHandle::enter`]).
pub(crate) struct Entered<'a> {
    pub(crate) api: &'a RknnApi,
    pub(crate) ctx: sys::rknn_matmul_ctx,
    pub(crate) rt: &'a Runtime,
    _alone: MutexGuard<'a, ()>,
}

impl ContextHandle {
    /// Takes ownership of a context the runtime created: it is destroyed when the handle drops.
    pub(crate) fn own(rt: Runtime, ctx: sys::rknn_matmul_ctx, domain: i32) -> ContextHandle {
        ContextHandle {
            rt,
            ctx,
            domain,
            calls: Mutex::new(()),
        }
    }

    /// Creates a context for `info` (also how the probes ask the runtime whether it accepts a
    /// configuration).
    pub(crate) fn create(
        rt: &Runtime,
        info: &mut sys::rknn_matmul_info,
    ) -> Result<(ContextHandle, sys::rknn_matmul_io_attr)> {
        let (ctx, io) = rt.call(|api| result::matmul_create(api, info))?;
        Ok((
            ContextHandle::own(rt.clone(), ctx, info.iommu_domain_id),
            io,
        ))
    }

    /// The context alone for one call, after the runtime has reported any release that failed
    /// earlier ([`Runtime::check_released`]). Pass the call's result through
    /// [`Runtime::with_versions`].
    pub(crate) fn enter(&self) -> Result<Entered<'_>> {
        let alone = self.calls.lock().unwrap_or_else(PoisonError::into_inner);
        self.rt.check_released()?;
        Ok(Entered {
            api: self.rt.api(),
            ctx: self.ctx,
            rt: &self.rt,
            _alone: alone,
        })
    }

    /// Makes a result-layer call on this context, alone.
    pub(crate) fn call<T>(
        &self,
        f: impl FnOnce(&RknnApi, sys::rknn_matmul_ctx) -> Result<T>,
    ) -> Result<T> {
        let e = self.enter()?;
        e.rt.with_versions(f(e.api, e.ctx))
    }

    /// As [`ContextHandle::call`] for a release in `Drop`: a failure is recorded on the runtime
    /// and reported by its next call.
    pub(crate) fn release(&self, f: impl FnOnce(&RknnApi, sys::rknn_matmul_ctx) -> Result<()>) {
        let _alone = self.calls.lock().unwrap_or_else(PoisonError::into_inner);
        self.rt.released(f(self.rt.api(), self.ctx));
    }

    /// The raw handle (for [`Matmul::as_raw`](super::matmul::Matmul::as_raw)).
    pub(crate) fn raw(&self) -> sys::rknn_matmul_ctx {
        self.ctx
    }
}

impl Drop for ContextHandle {
    fn drop(&mut self) {
        // Every memory holds an Arc of this handle, so all of them are gone: the documented
        // order (memories first, then the context).
        // SAFETY: a live context, destroyed once, after its memories.
        let r = unsafe { result::matmul_destroy(self.rt.api(), self.ctx) };
        self.rt.released(r);
    }
}
