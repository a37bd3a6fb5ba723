//! NPU memory with RAII: allocated on a context, owning an `Arc` of it (so the context is
//! destroyed after its last memory), freed exactly once on drop, viewed as a typed slice.

use std::cell::Cell;
use std::marker::PhantomData;
use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use rknn_sys as sys;

use super::context::ContextHandle;
use super::runtime::Runtime;
use crate::dtype::Element;
use crate::error::{Call, Error, Matrix, Result};
use crate::result;

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

bitflags::bitflags! {
    /// Allocation flags of `rknn_create_mem2` (fact sheet §3). The default allocation is
    /// cacheable; the safe layer syncs caches around every run either way.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
    pub struct MemFlags: u64 {
        /// Cacheable memory (the default of `rknn_create_mem`).
        const CACHEABLE = sys::RKNN_FLAG_MEMORY_CACHEABLE as u64;
        /// Uncached memory: no sync needed, slow CPU access.
        const NON_CACHEABLE = sys::RKNN_FLAG_MEMORY_NON_CACHEABLE as u64;
        /// Try the NPU's SRAM first (956 KB on RK3588; falls back to DRAM).
        const TRY_ALLOC_SRAM = sys::RKNN_FLAG_MEMORY_TRY_ALLOC_SRAM as u64;
    }
}

/// A runtime-allocated NPU memory holding `len` elements of `T`, allocated for one matrix of
/// one context.
///
/// It owns an `Arc` of its context, so dropping the context first is fine: the context is
/// destroyed after its last memory (the documented order), whatever the drop order:
///
/// ```
/// # if !cfg!(feature = "emulator") { return Ok(()); } // the emulator is not compiled in
/// use rknn_matmul::{Runtime, Platform, I8xI8ToI32};
/// let rt = Runtime::emulator(Platform::Rk3588)?;
/// let mm = rt.matmul::<I8xI8ToI32>(1, 32, 32).build()?;
/// let mut a = mm.alloc_a()?;
/// drop(mm);
/// a.as_mut_slice().fill(1); // still valid: `a` keeps the context alive
/// # Ok::<(), rknn_matmul::Error>(())
/// ```
///
/// Writing through [`TensorMem::as_mut_slice`] marks the memory as changed; the next
/// [`Matmul::run`](super::matmul::Matmul::run) then syncs it to the device and binds it again, so the documented
/// write → sync → bind → run order holds by construction.
///
/// A memory is `Send` (it can move to another thread with its context, or be dropped there:
/// calls on one context are serialised) but not `Sync`.
pub struct TensorMem<T: Element> {
    handle: Arc<ContextHandle>,
    /// The runtime's memory; `None` only while being destroyed in `Drop`.
    mem: Option<result::Allocated>,
    /// The CPU mapping (`virt_addr`), checked non-NULL, aligned and large enough.
    data: NonNull<T>,
    len: usize,
    bytes: u64,
    matrix: Matrix,
    /// Whether other contexts of its runtime and IOMMU domain may bind it.
    shared: bool,
    id: u64,
    generation: Cell<u64>,
    _t: PhantomData<T>,
}

// SAFETY: the memory is owned by this value alone (no other handle to `mem` exists outside the
// runtime); its CPU mapping is ordinary process memory, usable from any thread; and every call
// on the context it belongs to goes through `ContextHandle`, which serialises them, so a drop
// on another thread cannot race with the context's owner.
unsafe impl<T: Element> Send for TensorMem<T> {}

impl<T: Element> std::fmt::Debug for TensorMem<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TensorMem")
            .field("matrix", &self.matrix)
            .field("kind", &T::KIND)
            .field("len", &self.len)
            .field("id", &self.id)
            .finish()
    }
}

impl<T: Element> TensorMem<T> {
    /// Allocates `bytes` (rounded up to whole elements) for `matrix` on the context.
    pub(crate) fn new(
        handle: Arc<ContextHandle>,
        matrix: Matrix,
        bytes: u64,
        flags: Option<MemFlags>,
        shared: bool,
    ) -> Result<TensorMem<T>> {
        let elem = std::mem::size_of::<T>() as u64;
        let len = usize::try_from(bytes.div_ceil(elem)).map_err(|_| Error::SizeOverflow {
            what: "memory elements",
            value: bytes.div_ceil(elem).to_string(),
            limit: "usize",
        })?;
        let bytes = bytes.div_ceil(elem) * elem;
        let rt = handle.rt.clone();
        rt.handle_budget().acquire()?;
        let (call, made) = match flags {
            None => {
                let size = u32::try_from(bytes).map_err(|_| Error::SizeOverflow {
                    what: "memory bytes",
                    value: bytes.to_string(),
                    limit: "u32, the size argument of rknn_create_mem",
                });
                (
                    Call::CreateMem,
                    size.and_then(|s| handle.call(|api, ctx| result::create_mem(api, ctx, s))),
                )
            }
            Some(f) => (
                Call::CreateMem2,
                handle.call(|api, ctx| result::create_mem2(api, ctx, bytes, f.bits())),
            ),
        };
        let made = match made {
            Ok(m) => m,
            Err(e) => {
                rt.handle_budget().release();
                return Err(e);
            }
        };
        let data = NonNull::new(made.virt.cast::<T>());
        let (size, aligned) = (made.size, made.virt.cast::<T>().is_aligned());
        let out = TensorMem {
            handle,
            mem: Some(made),
            // A NULL mapping is refused below; the dangling pointer is never read.
            data: data.unwrap_or(NonNull::dangling()),
            len,
            bytes,
            matrix,
            shared,
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            generation: Cell::new(1),
            _t: PhantomData,
        };
        // On a refusal, dropping `out` destroys the memory and returns its handle.
        let reason = if data.is_none() {
            Some("virt_addr is NULL".to_string())
        } else if u64::from(size) < bytes {
            Some(format!("size {size} < {bytes} bytes asked"))
        } else if !aligned {
            Some(format!(
                "virt_addr not aligned to {}",
                std::mem::align_of::<T>()
            ))
        } else {
            None
        };
        if let Some(reason) = reason {
            return Err(Error::BadMapping { call, reason });
        }
        Ok(out)
    }

    /// Elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds no elements (never, for memories of a valid context).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// The matrix it was allocated for.
    pub fn matrix(&self) -> Matrix {
        self.matrix
    }

    /// The CPU view.
    pub fn as_slice(&self) -> &[T] {
        // SAFETY: `virt_addr` maps at least `len` elements (checked at allocation), aligned for
        // T, alive while `self` is (freed only in Drop); `T: Element` accepts every bit pattern.
        unsafe { std::slice::from_raw_parts(self.data.as_ptr(), self.len) }
    }

    /// The CPU view, for writing. Marks the memory as changed, so the next run syncs it and
    /// binds it again.
    pub fn as_mut_slice(&mut self) -> &mut [T] {
        self.generation.set(self.generation.get() + 1);
        // SAFETY: as in `as_slice`; `&mut self` makes this the only view.
        unsafe { std::slice::from_raw_parts_mut(self.data.as_ptr(), self.len) }
    }

    /// Copies `src` into the start of the memory.
    pub fn write(&mut self, src: &[T]) -> Result<()> {
        if src.len() > self.len {
            return Err(Error::Length {
                what: "write source (at most the memory's length)",
                expected: self.len,
                got: src.len(),
            });
        }
        self.as_mut_slice()[..src.len()].copy_from_slice(src);
        Ok(())
    }

    pub(crate) fn raw(&self) -> NonNull<sys::rknn_tensor_mem> {
        self.allocated().raw()
    }

    fn allocated(&self) -> &result::Allocated {
        self.mem
            .as_ref()
            .expect("a TensorMem holds its memory until it is dropped")
    }

    pub(crate) fn stamp(&self) -> (u64, u64) {
        (self.id, self.generation.get())
    }

    /// Whether other contexts of the same runtime and IOMMU domain may bind it.
    pub fn is_shared(&self) -> bool {
        self.shared
    }

    /// The IOMMU domain it lives in.
    pub fn domain(&self) -> i32 {
        self.handle.domain
    }

    pub(crate) fn runtime(&self) -> &Runtime {
        &self.handle.rt
    }

    pub(crate) fn belongs_to(&self, handle: &Arc<ContextHandle>) -> bool {
        Arc::ptr_eq(&self.handle, handle)
    }

    pub(crate) fn sync(&self, mode: sys::rknn_mem_sync_mode) -> Result<()> {
        self.handle
            .call(|api, _| result::mem_sync(api, self.allocated(), mode))
    }
}

impl<T: Element> Drop for TensorMem<T> {
    fn drop(&mut self) {
        if let Some(mem) = self.mem.take() {
            self.handle.release(|api, _| result::destroy_mem(api, mem));
        }
        self.handle.rt.handle_budget().release();
    }
}
