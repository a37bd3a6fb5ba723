//! NPU memory with RAII: allocated on a context, borrowed from it (so it cannot outlive it),
//! freed exactly once on drop, and viewed as a typed slice.

use std::cell::Cell;
use std::marker::PhantomData;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};

use rknn_sys as sys;

use crate::dtype::Element;
use crate::error::{Error, Result};
use crate::matmul::ContextCore;

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// A runtime-allocated NPU memory holding `len` elements of `T`.
///
/// It borrows the context it was allocated on, so it is destroyed before the context (the
/// documented order) and can never be used after it:
///
/// ```compile_fail,E0505
/// use rknn_matmul::{Runtime, Platform, I8xI8ToI32};
/// let rt = Runtime::emulator(Platform::Rk3588).unwrap();
/// let mm = rt.matmul::<I8xI8ToI32>(1, 32, 32).build().unwrap();
/// let a = mm.alloc_a().unwrap();
/// drop(mm); // error: `mm` is still borrowed by `a`
/// let _ = a.as_slice();
/// ```
///
/// Writing through [`TensorMem::as_mut_slice`] marks the memory as changed; the next
/// [`crate::Matmul::run`] then syncs it to the device and binds it again, so the documented
/// write → bind → run order holds by construction.
pub struct TensorMem<'m, T: Element> {
    core: &'m ContextCore<'m>,
    mem: NonNull<sys::rknn_tensor_mem>,
    len: usize,
    id: u64,
    generation: Cell<u64>,
    _t: PhantomData<T>,
}

impl<T: Element> std::fmt::Debug for TensorMem<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TensorMem")
            .field("kind", &T::KIND)
            .field("len", &self.len)
            .field("id", &self.id)
            .finish()
    }
}

impl<'m, T: Element> TensorMem<'m, T> {
    pub(crate) fn new(core: &'m ContextCore<'m>, len: usize) -> Result<TensorMem<'m, T>> {
        let bytes = len * std::mem::size_of::<T>();
        let size = u32::try_from(bytes).map_err(|_| {
            Error::Invalid(format!(
                "{bytes} bytes exceed the runtime's 4 GiB limit per memory"
            ))
        })?;
        core.rt.budget.acquire()?;
        let api = core.rt.api();
        // SAFETY: a live context handle and a size; the runtime returns NULL on failure.
        let raw = unsafe { (api.rknn_create_mem)(core.ctx, size) };
        let Some(mem) = NonNull::new(raw) else {
            core.rt.budget.release();
            return Err(Error::AllocFailed {
                call: "rknn_create_mem",
                bytes,
                detail: core.rt.last_error(),
            });
        };
        // SAFETY: the runtime returned a valid rknn_tensor_mem.
        let m = unsafe { mem.as_ref() };
        if m.virt_addr.is_null()
            || (m.size as usize) < bytes
            || (m.virt_addr as usize) % std::mem::align_of::<T>() != 0
        {
            // SAFETY: destroying the memory just created on this context.
            unsafe { (api.rknn_destroy_mem)(core.ctx, raw) };
            core.rt.budget.release();
            return Err(Error::Invalid(
                "the runtime returned a memory without a usable CPU mapping".into(),
            ));
        }
        Ok(TensorMem {
            core,
            mem,
            len,
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            generation: Cell::new(1),
            _t: PhantomData,
        })
    }

    /// Elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds no elements (never, for memories of a valid context).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The CPU view.
    pub fn as_slice(&self) -> &[T] {
        // SAFETY: `virt_addr` maps at least `len` elements (checked at allocation), aligned for
        // T, alive while `self` is (freed only in Drop); `T: Element` accepts every bit pattern.
        unsafe { std::slice::from_raw_parts(self.mem.as_ref().virt_addr as *const T, self.len) }
    }

    /// The CPU view, for writing. Marks the memory as changed, so the next run syncs it and
    /// binds it again.
    pub fn as_mut_slice(&mut self) -> &mut [T] {
        self.generation.set(self.generation.get() + 1);
        // SAFETY: as in `as_slice`; `&mut self` makes this the only view.
        unsafe { std::slice::from_raw_parts_mut(self.mem.as_ref().virt_addr as *mut T, self.len) }
    }

    /// Copies `src` into the start of the memory.
    pub fn write(&mut self, src: &[T]) -> Result<()> {
        if src.len() > self.len {
            return Err(Error::Size {
                what: "write",
                expected: self.len,
                got: src.len(),
            });
        }
        self.as_mut_slice()[..src.len()].copy_from_slice(src);
        Ok(())
    }

    pub(crate) fn raw(&self) -> *mut sys::rknn_tensor_mem {
        self.mem.as_ptr()
    }

    pub(crate) fn stamp(&self) -> (u64, u64) {
        (self.id, self.generation.get())
    }

    pub(crate) fn belongs_to(&self, core: &ContextCore<'_>) -> bool {
        std::ptr::eq(self.core, core)
    }

    pub(crate) fn sync(&self, mode: sys::rknn_mem_sync_mode) -> Result<()> {
        let api = self.core.rt.api();
        if let Some(sync) = api.rknn_mem_sync {
            // SAFETY: a live memory of this live context.
            let rc = unsafe { sync(self.core.ctx, self.mem.as_ptr(), mode) };
            self.core.rt.check("rknn_mem_sync", rc)?;
        }
        Ok(())
    }
}

impl<T: Element> Drop for TensorMem<'_, T> {
    fn drop(&mut self) {
        self.core.forget(self.id);
        // SAFETY: the memory was created on this context, which outlives `self` (borrow), and is
        // destroyed exactly once, here.
        let rc = unsafe { (self.core.rt.api().rknn_destroy_mem)(self.core.ctx, self.mem.as_ptr()) };
        debug_assert_eq!(
            rc,
            0,
            "rknn_destroy_mem failed: {}",
            self.core.rt.last_error().unwrap_or_default()
        );
        self.core.rt.budget.release();
    }
}
