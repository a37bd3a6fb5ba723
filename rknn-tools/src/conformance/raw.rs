//! The C API as the checks use it: straight through the function table, so that the subject
//! runtime is asked exactly what a C program would ask it (the safe layer would refuse much of
//! it first, by the emulator's rules), with RAII so that every memory is destroyed before its
//! context on every path, and return codes handed back as they are.

use std::cell::Cell;
use std::ffi::c_char;
use std::marker::PhantomData;
use std::ptr::NonNull;

use rknn_sys::{self as sys, RknnApi};

/// An optional function the runtime does not export.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Missing(pub &'static str);

/// A matmul context, destroyed on drop (after its memories, which borrow it).
pub struct Ctx<'a> {
    api: &'a RknnApi,
    handle: sys::rknn_matmul_ctx,
    /// The `io_attr` of every shape (one for a static context).
    pub ios: Vec<sys::rknn_matmul_io_attr>,
    /// The shape selected last (memories borrow the context, so selecting one takes `&self`).
    current: Cell<usize>,
}

impl std::fmt::Debug for Ctx<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ctx").field("handle", &self.handle).finish()
    }
}

/// Which matrix of a context.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Which {
    /// A.
    A,
    /// B.
    B,
    /// C.
    C,
}

impl<'a> Ctx<'a> {
    /// `rknn_matmul_create`; the runtime's code on failure.
    pub fn create(api: &'a RknnApi, info: &sys::rknn_matmul_info) -> Result<Ctx<'a>, i32> {
        let mut info = *info;
        let mut io = sys::rknn_matmul_io_attr::default();
        let mut handle: sys::rknn_matmul_ctx = 0;
        // SAFETY: three valid, exclusive pointers for the call, as the C API takes them.
        let rc = unsafe { (api.rknn_matmul_create)(&mut handle, &mut info, &mut io) };
        if rc != 0 {
            return Err(rc);
        }
        Ok(Ctx {
            api,
            handle,
            ios: vec![io],
            current: Cell::new(0),
        })
    }

    /// `rknn_matmul_create_dynamic_shape` for shapes `(M, K, N)`.
    pub fn create_dynamic(
        api: &'a RknnApi,
        info: &sys::rknn_matmul_info,
        shapes: &[(usize, usize, usize)],
    ) -> Result<Result<Ctx<'a>, i32>, Missing> {
        let f = api
            .rknn_matmul_create_dynamic_shape
            .ok_or(Missing("rknn_matmul_create_dynamic_shape"))?;
        let mut info = *info;
        let mut s: Vec<sys::rknn_matmul_shape> = shapes
            .iter()
            .map(|&(m, k, n)| sys::rknn_matmul_shape {
                M: dim(m),
                K: dim(k),
                N: dim(n),
            })
            .collect();
        let mut ios = vec![sys::rknn_matmul_io_attr::default(); s.len()];
        let mut handle: sys::rknn_matmul_ctx = 0;
        // SAFETY: `shapes` and `io_attrs` both hold `shape_num` entries; the pointers are valid
        // and exclusive for the call.
        let rc = unsafe {
            f(
                &mut handle,
                &mut info,
                dim(s.len()),
                s.as_mut_ptr(),
                ios.as_mut_ptr(),
            )
        };
        if rc != 0 {
            return Ok(Err(rc));
        }
        Ok(Ok(Ctx {
            api,
            handle,
            ios,
            current: Cell::new(0),
        }))
    }

    /// The `io_attr` of the current shape.
    pub fn io(&self) -> &sys::rknn_matmul_io_attr {
        &self.ios[self.current.get()]
    }

    /// The descriptor of one matrix for the current shape.
    pub fn attr(&self, which: Which) -> &sys::rknn_matmul_tensor_attr {
        let io = self.io();
        match which {
            Which::A => &io.A,
            Which::B => &io.B,
            Which::C => &io.C,
        }
    }

    /// The raw handle (for the model API's calls, which take it as an `rknn_context`).
    pub fn handle(&self) -> sys::rknn_matmul_ctx {
        self.handle
    }

    /// The function table.
    pub fn api(&self) -> &'a RknnApi {
        self.api
    }

    /// `rknn_matmul_set_dynamic_shape` to shape `index` of the creation list.
    pub fn set_shape(&self, index: usize, shape: (usize, usize, usize)) -> Result<i32, Missing> {
        let f = self
            .api
            .rknn_matmul_set_dynamic_shape
            .ok_or(Missing("rknn_matmul_set_dynamic_shape"))?;
        let mut s = sys::rknn_matmul_shape {
            M: dim(shape.0),
            K: dim(shape.1),
            N: dim(shape.2),
        };
        // SAFETY: a live context and a valid shape pointer.
        let rc = unsafe { f(self.handle, &mut s) };
        if rc == 0 {
            self.current.set(index);
        }
        Ok(rc)
    }

    /// `rknn_matmul_set_io_mem` with the current shape's descriptor of `which`.
    pub fn bind(&self, mem: &Mem<'_>, which: Which) -> i32 {
        let mut attr = *self.attr(which);
        // SAFETY: a live context and a live memory; the memory outlives every run of this
        // context that uses it, since the checks run before dropping it (the one check that
        // destroys a bound memory first does so on purpose, on the emulator or when asked).
        unsafe { (self.api.rknn_matmul_set_io_mem)(self.handle, mem.ptr.as_ptr(), &mut attr) }
    }

    /// `rknn_matmul_run`.
    pub fn run(&self) -> i32 {
        // SAFETY: a live context; whatever is bound is alive (see `bind`).
        unsafe { (self.api.rknn_matmul_run)(self.handle) }
    }

    /// `rknn_matmul_set_core_mask`.
    pub fn set_core_mask(&self, mask: u32) -> i32 {
        // SAFETY: a live context; the mask is a plain value.
        unsafe { (self.api.rknn_matmul_set_core_mask)(self.handle, mask as sys::rknn_core_mask) }
    }

    /// `rknn_matmul_set_quant_params` for matrix `name` ("A", "B" or "C").
    pub fn set_quant(&self, name: &str, scales: &[f32], zps: &[i32]) -> Result<i32, Missing> {
        let f = self
            .api
            .rknn_matmul_set_quant_params
            .ok_or(Missing("rknn_matmul_set_quant_params"))?;
        let mut scales = scales.to_vec();
        let mut zps = zps.to_vec();
        let mut p = sys::rknn_quant_params::default();
        for (d, s) in p.name.iter_mut().zip(name.bytes()) {
            *d = c_char::from_ne_bytes([s]);
        }
        p.scale = scales.as_mut_ptr();
        p.scale_len = dim(scales.len());
        if !zps.is_empty() {
            p.zp = zps.as_mut_ptr();
            p.zp_len = dim(zps.len());
        }
        // SAFETY: the arrays live until the call returns and hold the lengths given.
        Ok(unsafe { f(self.handle, &mut p) })
    }

    /// `rknn_matmul_get_quant_params`: the code, the single scale, and the per-channel array
    /// (`len` entries) it wrote.
    pub fn get_quant(&self, len: usize) -> Result<(i32, f32, Vec<f32>), Missing> {
        let f = self
            .api
            .rknn_matmul_get_quant_params
            .ok_or(Missing("rknn_matmul_get_quant_params"))?;
        let mut array = vec![f32::NAN; len];
        let mut p = sys::rknn_quant_params::default();
        for (d, s) in p.name.iter_mut().zip("B".bytes()) {
            *d = c_char::from_ne_bytes([s]);
        }
        p.scale = array.as_mut_ptr();
        p.scale_len = dim(len);
        let mut scale = f32::NAN;
        // SAFETY: `scale` points to one float, `p.scale` to `len` floats, both live for the call.
        let rc = unsafe { f(self.handle, &mut p, &mut scale) };
        Ok((rc, scale, array))
    }

    /// `rknn_query(RKNN_QUERY_SDK_VERSION)` on this context: the code only (the strings are
    /// reported, not compared).
    pub fn query_version(&self) -> i32 {
        let mut v = sys::rknn_sdk_version::default();
        let size = std::mem::size_of::<sys::rknn_sdk_version>() as u32;
        // SAFETY: a live handle and a 512-byte struct of the size passed.
        unsafe {
            (self.api.rknn_query)(
                self.handle as sys::rknn_context,
                sys::RKNN_QUERY_SDK_VERSION,
                (&raw mut v).cast(),
                size,
            )
        }
    }

    /// `rknn_create_mem(size)`: `None` when the runtime returned NULL or an unusable mapping.
    pub fn alloc(&self, size: u32) -> Option<Mem<'_>> {
        // SAFETY: a live context; the size is a plain value.
        let raw = unsafe { (self.api.rknn_create_mem)(self.handle as sys::rknn_context, size) };
        let ptr = NonNull::new(raw)?;
        let mem = Mem {
            api: self.api,
            ctx: self.handle,
            ptr,
            size: size as usize,
            _ctx: PhantomData,
        };
        // SAFETY: a non-NULL memory struct just returned by the runtime.
        let (virt, reported) = unsafe { ((*raw).virt_addr, (*raw).size) };
        // A memory the CPU cannot see, or smaller than asked, cannot be used: dropping `mem`
        // destroys it.
        (!virt.is_null() && reported as usize >= size as usize).then_some(mem)
    }

    /// `rknn_B_normal_layout_to_native_layout(input, output, K, N, info)`.
    pub fn convert_b(
        api: &RknnApi,
        input: &mut [u8],
        output: &mut [u8],
        k: usize,
        n: usize,
        info: &sys::rknn_matmul_info,
    ) -> Result<i32, Missing> {
        let f = api
            .rknn_B_normal_layout_to_native_layout
            .ok_or(Missing("rknn_B_normal_layout_to_native_layout"))?;
        let mut info = *info;
        // SAFETY: the caller sizes `input` for what the converter may read (the larger of the
        // two int4 readings) and `output` for native B of K × N; distinct buffers.
        Ok(unsafe {
            f(
                input.as_mut_ptr().cast(),
                output.as_mut_ptr().cast(),
                dim(k),
                dim(n),
                &mut info,
            )
        })
    }

    /// The converter called in place (`input` == `output`), which corrupts B on the board.
    pub fn convert_b_in_place(
        api: &RknnApi,
        buf: &mut [u8],
        k: usize,
        n: usize,
        info: &sys::rknn_matmul_info,
    ) -> Result<i32, Missing> {
        let f = api
            .rknn_B_normal_layout_to_native_layout
            .ok_or(Missing("rknn_B_normal_layout_to_native_layout"))?;
        let mut info = *info;
        let p = buf.as_mut_ptr().cast();
        // SAFETY: `buf` holds native B of K × N (at least as large as the input); the call may
        // scribble over it, which is what is being observed, and never past it.
        Ok(unsafe { f(p, p, dim(k), dim(n), &mut info) })
    }

    /// `rknn_set_core_mask` (the model API) on this matmul context.
    pub fn model_set_core_mask(&self, mask: u32) -> Result<i32, Missing> {
        let f = self
            .api
            .rknn_set_core_mask
            .ok_or(Missing("rknn_set_core_mask"))?;
        // SAFETY: a live handle; what the runtime does with a matmul handle here is the
        // question (the check runs on hardware only when asked).
        Ok(unsafe {
            f(
                self.handle as sys::rknn_context,
                mask as sys::rknn_core_mask,
            )
        })
    }
}

impl Drop for Ctx<'_> {
    fn drop(&mut self) {
        // SAFETY: a live context, destroyed once; its memories borrow it and are gone.
        // A failure cannot be reported from here; it is not what any check observes.
        let _ = unsafe { (self.api.rknn_matmul_destroy)(self.handle) };
    }
}

/// An NPU memory made by `rknn_create_mem`, destroyed on drop. It borrows its context, so it
/// is destroyed first.
pub struct Mem<'c> {
    api: &'c RknnApi,
    ctx: sys::rknn_matmul_ctx,
    ptr: NonNull<sys::rknn_tensor_mem>,
    size: usize,
    _ctx: PhantomData<&'c Ctx<'c>>,
}

impl std::fmt::Debug for Mem<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mem").field("size", &self.size).finish()
    }
}

impl Mem<'_> {
    /// The CPU view.
    pub fn bytes(&self) -> &[u8] {
        // SAFETY: `virt_addr` maps at least `size` bytes (checked in `Ctx::alloc`) while the
        // memory lives; runs that write it are synchronous calls that borrow nothing from here.
        unsafe {
            std::slice::from_raw_parts((*self.ptr.as_ptr()).virt_addr as *const u8, self.size)
        }
    }

    /// The CPU view, for writing.
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `bytes`; `&mut self` makes this the only view.
        unsafe { std::slice::from_raw_parts_mut((*self.ptr.as_ptr()).virt_addr.cast(), self.size) }
    }

    /// Copies `data` to the start of the memory (at most its size) and syncs it to the device.
    pub fn write_synced(&mut self, data: &[u8]) -> i32 {
        let len = data.len().min(self.size);
        self.bytes_mut()[..len].copy_from_slice(&data[..len]);
        self.sync(sys::RKNN_MEMORY_SYNC_TO_DEVICE)
    }

    /// `rknn_mem_sync`; a runtime without the function has coherent memories (0).
    pub fn sync(&self, mode: sys::rknn_mem_sync_mode) -> i32 {
        match self.api.rknn_mem_sync {
            // SAFETY: a live memory of the context `ctx`.
            Some(f) => unsafe { f(self.ctx as sys::rknn_context, self.ptr.as_ptr(), mode) },
            None => 0,
        }
    }

    /// Destroys the memory now, returning the runtime's code.
    pub fn destroy(self) -> i32 {
        let this = std::mem::ManuallyDrop::new(self);
        // SAFETY: a live memory destroyed once (`Drop` will not run).
        unsafe { (this.api.rknn_destroy_mem)(this.ctx as sys::rknn_context, this.ptr.as_ptr()) }
    }
}

impl Drop for Mem<'_> {
    fn drop(&mut self) {
        // SAFETY: a live memory, destroyed once, before its context (it borrows it).
        let _ = unsafe {
            (self.api.rknn_destroy_mem)(self.ctx as sys::rknn_context, self.ptr.as_ptr())
        };
    }
}

/// A dimension as the C API's `int32_t`; the checks' shapes are small constants, far below.
fn dim(v: usize) -> i32 {
    i32::try_from(v).unwrap_or(i32::MAX)
}
