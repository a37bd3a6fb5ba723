//! The result layer: one small function per C call, each calling through the function table
//! and turning its return code into a typed [`Error`] that names the call ([`Call`]) and, when
//! the backend gives one, its reason. Every safe type calls these, never the table directly,
//! so "call, check, map the code, name the call" exists once.
//!
//! The functions are safe where their arguments make the call sound by construction (handles
//! are plain integers the runtime validates; pointers come from references with the sizes the
//! call needs); where the caller must vouch for a runtime-allocated memory, they say so in a
//! `# Safety` section.

use std::ffi::{CStr, c_char};
use std::ptr::NonNull;

use rknn_sys::{self as sys, RknnApi};

use crate::error::{Call, Error, Matrix, Result, RknnCode, Versions};

/// The backend's reason for the calling thread's last failure, through the function table's
/// optional `rknn_emu_last_error` extension (the emulator and its drop-in library export it;
/// Rockchip's runtime logs its reasons instead and leaves the entry empty).
pub(crate) fn last_error(api: &RknnApi) -> Option<String> {
    let f = api.rknn_emu_last_error?;
    // SAFETY: the extension returns a NUL-terminated string owned by the calling thread,
    // valid until the next call on this thread; it is copied out at once.
    let text = unsafe {
        let p = f();
        if p.is_null() {
            return None;
        }
        CStr::from_ptr(p).to_string_lossy().into_owned()
    };
    (!text.is_empty()).then_some(text)
}

/// Maps a return code of `call`.
pub(crate) fn check(api: &RknnApi, call: Call, rc: i32) -> Result<()> {
    if rc >= 0 {
        return Ok(());
    }
    Err(Error::Rknn {
        call,
        code: RknnCode::from_raw(rc),
        detail: last_error(api),
        versions: None,
    })
}

fn missing(symbol: &'static str) -> Error {
    Error::MissingFunction { symbol }
}

/// `rknn_matmul_create`: a context and its A/B/C descriptors.
pub(crate) fn matmul_create(
    api: &RknnApi,
    info: &mut sys::rknn_matmul_info,
) -> Result<(sys::rknn_matmul_ctx, sys::rknn_matmul_io_attr)> {
    let mut ctx: sys::rknn_matmul_ctx = 0;
    let mut io = sys::rknn_matmul_io_attr::default();
    // SAFETY: three valid, exclusive pointers to initialised structs of the C types.
    let rc = unsafe { (api.rknn_matmul_create)(&mut ctx, info, &mut io) };
    check(api, Call::MatmulCreate, rc)?;
    Ok((ctx, io))
}

/// `rknn_matmul_create_dynamic_shape`: a context with one descriptor set per shape.
pub(crate) fn matmul_create_dynamic_shape(
    api: &RknnApi,
    info: &mut sys::rknn_matmul_info,
    shapes: &mut [sys::rknn_matmul_shape],
) -> Result<(sys::rknn_matmul_ctx, Vec<sys::rknn_matmul_io_attr>)> {
    let create = api
        .rknn_matmul_create_dynamic_shape
        .ok_or(missing("rknn_matmul_create_dynamic_shape"))?;
    let count = i32::try_from(shapes.len()).map_err(|_| Error::SizeOverflow {
        what: "number of dynamic shapes",
        value: shapes.len().to_string(),
        limit: "i32",
    })?;
    let mut ctx: sys::rknn_matmul_ctx = 0;
    let mut ios = vec![sys::rknn_matmul_io_attr::default(); shapes.len()];
    // SAFETY: `shapes` and `ios` hold `count` entries each; the other pointers are valid.
    let rc = unsafe { create(&mut ctx, info, count, shapes.as_mut_ptr(), ios.as_mut_ptr()) };
    check(api, Call::MatmulCreateDynamicShape, rc)?;
    Ok((ctx, ios))
}

/// `rknn_matmul_set_dynamic_shape`.
pub(crate) fn matmul_set_dynamic_shape(
    api: &RknnApi,
    ctx: sys::rknn_matmul_ctx,
    shape: &mut sys::rknn_matmul_shape,
) -> Result<()> {
    let set = api
        .rknn_matmul_set_dynamic_shape
        .ok_or(missing("rknn_matmul_set_dynamic_shape"))?;
    // SAFETY: the runtime validates the handle; `shape` is a valid pointer.
    check(api, Call::MatmulSetDynamicShape, unsafe { set(ctx, shape) })
}

/// `rknn_matmul_set_io_mem`.
///
/// # Safety
/// `mem` must be a live memory allocated on `ctx` and at least `attr.size` bytes large, and
/// stay alive while it is bound (until it is replaced or the context is destroyed).
pub(crate) unsafe fn matmul_set_io_mem(
    api: &RknnApi,
    ctx: sys::rknn_matmul_ctx,
    mem: NonNull<sys::rknn_tensor_mem>,
    attr: &mut sys::rknn_matmul_tensor_attr,
) -> Result<()> {
    // SAFETY: the caller vouches for `mem`; `attr` is a valid pointer.
    let rc = unsafe { (api.rknn_matmul_set_io_mem)(ctx, mem.as_ptr(), attr) };
    check(api, Call::MatmulSetIoMem, rc)
}

/// `rknn_matmul_set_core_mask`.
pub(crate) fn matmul_set_core_mask(
    api: &RknnApi,
    ctx: sys::rknn_matmul_ctx,
    mask: sys::rknn_core_mask,
) -> Result<()> {
    // SAFETY: the runtime validates the handle and the mask.
    check(api, Call::MatmulSetCoreMask, unsafe {
        (api.rknn_matmul_set_core_mask)(ctx, mask)
    })
}

/// `rknn_matmul_set_quant_params` for one matrix (the runtime copies the arrays).
pub(crate) fn matmul_set_quant_params(
    api: &RknnApi,
    ctx: sys::rknn_matmul_ctx,
    matrix: Matrix,
    scales: &[f32],
    zps: &[i32],
) -> Result<()> {
    let set = api
        .rknn_matmul_set_quant_params
        .ok_or(missing("rknn_matmul_set_quant_params"))?;
    let len = |n: usize| {
        i32::try_from(n).map_err(|_| Error::SizeOverflow {
            what: "quantisation parameter count",
            value: n.to_string(),
            limit: "i32",
        })
    };
    let mut p = sys::rknn_quant_params::default();
    for (d, s) in p.name.iter_mut().zip(matrix.name().bytes()) {
        *d = c_char::from_ne_bytes([s]);
    }
    // The C struct takes mutable pointers but the runtime only reads (and copies) the arrays.
    p.scale = scales.as_ptr().cast_mut();
    p.scale_len = len(scales.len())?;
    if !zps.is_empty() {
        p.zp = zps.as_ptr().cast_mut();
        p.zp_len = len(zps.len())?;
    }
    // SAFETY: `p` points into `scales`/`zps`, alive for the call, with their lengths; the
    // runtime copies the arrays and does not write through the pointers.
    check(api, Call::MatmulSetQuantParams, unsafe { set(ctx, &mut p) })
}

/// `rknn_matmul_run`.
///
/// # Safety
/// A, B and C of `ctx` must be bound to memories that are alive (the runtime reads and writes
/// them by DMA during the call).
pub(crate) unsafe fn matmul_run(api: &RknnApi, ctx: sys::rknn_matmul_ctx) -> Result<()> {
    // SAFETY: the caller vouches for the bound memories.
    check(api, Call::MatmulRun, unsafe { (api.rknn_matmul_run)(ctx) })
}

/// `rknn_matmul_destroy`.
///
/// # Safety
/// `ctx` must be a live context, destroyed once, after every memory allocated on it.
pub(crate) unsafe fn matmul_destroy(api: &RknnApi, ctx: sys::rknn_matmul_ctx) -> Result<()> {
    // SAFETY: the caller vouches for the handle and the order.
    check(api, Call::MatmulDestroy, unsafe {
        (api.rknn_matmul_destroy)(ctx)
    })
}

/// `rknn_B_normal_layout_to_native_layout`: `src` and `dst` are distinct buffers by type (a
/// shared and an exclusive borrow), which the runtime needs ([hw]: in place corrupts B).
pub(crate) fn b_normal_to_native(
    api: &RknnApi,
    src: &[u8],
    dst: &mut [u8],
    k: i32,
    n: i32,
    info: &mut sys::rknn_matmul_info,
) -> Result<()> {
    let conv = api
        .rknn_B_normal_layout_to_native_layout
        .ok_or(missing("rknn_B_normal_layout_to_native_layout"))?;
    // SAFETY: the caller sized `src` for the normal B of (k, n) and `dst` for the native B the
    // runtime reported; the converter reads `src` only (the C prototype is not const) and writes
    // within `dst`.
    let rc = unsafe {
        conv(
            src.as_ptr().cast_mut().cast(),
            dst.as_mut_ptr().cast(),
            k,
            n,
            info,
        )
    };
    check(api, Call::BNormalLayoutToNativeLayout, rc)
}

/// A memory the runtime allocated, owned: made only by a successful allocation and consumed
/// by [`destroy_mem`], so while one exists its descriptor is live (which makes syncing and
/// destroying it safe), and it is destroyed at most once.
pub(crate) struct Allocated {
    /// The runtime's descriptor, to pass back to it (bind, sync, destroy).
    mem: NonNull<sys::rknn_tensor_mem>,
    /// The context it was allocated on.
    ctx: sys::rknn_matmul_ctx,
    /// `virt_addr`: the CPU mapping (NULL if the runtime gave none).
    pub(crate) virt: *mut std::ffi::c_void,
    /// `size` in bytes.
    pub(crate) size: u32,
}

impl Allocated {
    /// The descriptor, for `set_io_mem`.
    pub(crate) fn raw(&self) -> NonNull<sys::rknn_tensor_mem> {
        self.mem
    }
}

fn allocated(
    api: &RknnApi,
    ctx: sys::rknn_matmul_ctx,
    call: Call,
    bytes: u64,
    raw: *mut sys::rknn_tensor_mem,
) -> Result<Allocated> {
    let mem = NonNull::new(raw).ok_or_else(|| Error::AllocFailed {
        call,
        bytes,
        detail: last_error(api),
    })?;
    // SAFETY: a non-NULL return of an allocation call is a valid rknn_tensor_mem owned by the
    // runtime until it is destroyed; the fields are read by value.
    let (virt, size) = unsafe { (mem.as_ref().virt_addr, mem.as_ref().size) };
    Ok(Allocated {
        mem,
        ctx,
        virt,
        size,
    })
}

/// `rknn_create_mem`: a runtime-allocated memory of `size` bytes.
pub(crate) fn create_mem(api: &RknnApi, ctx: sys::rknn_matmul_ctx, size: u32) -> Result<Allocated> {
    // SAFETY: the runtime validates the handle and returns NULL on failure.
    let raw = unsafe { (api.rknn_create_mem)(ctx, size) };
    allocated(api, ctx, Call::CreateMem, size.into(), raw)
}

/// `rknn_create_mem2`: as `create_mem`, with allocation flags.
pub(crate) fn create_mem2(
    api: &RknnApi,
    ctx: sys::rknn_matmul_ctx,
    size: u64,
    flags: u64,
) -> Result<Allocated> {
    let create = api.rknn_create_mem2.ok_or(missing("rknn_create_mem2"))?;
    // SAFETY: as `create_mem`.
    let raw = unsafe { create(ctx, size, flags) };
    allocated(api, ctx, Call::CreateMem2, size, raw)
}

/// `rknn_destroy_mem`, consuming the memory.
pub(crate) fn destroy_mem(api: &RknnApi, mem: Allocated) -> Result<()> {
    // SAFETY: `mem` is live (an `Allocated` exists only between allocation and this call) and
    // allocated on `mem.ctx`; it is consumed, so it is destroyed once.
    check(api, Call::DestroyMem, unsafe {
        (api.rknn_destroy_mem)(mem.ctx, mem.mem.as_ptr())
    })
}

/// `rknn_mem_sync`. A runtime without it keeps its memories coherent itself (the sync is then
/// a no-op, not an error: Rockchip's own demos never call it).
pub(crate) fn mem_sync(
    api: &RknnApi,
    mem: &Allocated,
    mode: sys::rknn_mem_sync_mode,
) -> Result<()> {
    let Some(sync) = api.rknn_mem_sync else {
        return Ok(());
    };
    // SAFETY: `mem` is live and allocated on `mem.ctx` (see `Allocated`).
    check(api, Call::MemSync, unsafe {
        sync(mem.ctx, mem.mem.as_ptr(), mode)
    })
}

/// `rknn_query(RKNN_QUERY_SDK_VERSION)` on a context.
pub(crate) fn query_sdk_version(api: &RknnApi, ctx: sys::rknn_matmul_ctx) -> Result<Versions> {
    let mut v = sys::rknn_sdk_version::default();
    let size = u32::try_from(std::mem::size_of::<sys::rknn_sdk_version>())
        .expect("rknn_sdk_version is 512 bytes");
    // SAFETY: `v` is a valid, exclusive rknn_sdk_version of `size` bytes.
    let rc = unsafe {
        (api.rknn_query)(
            ctx,
            sys::RKNN_QUERY_SDK_VERSION,
            (&mut v as *mut sys::rknn_sdk_version).cast(),
            size,
        )
    };
    check(api, Call::QuerySdkVersion, rc)?;
    Ok(Versions {
        runtime: c_text(&v.api_version),
        driver: c_text(&v.drv_version),
    })
}

/// A fixed C char array up to its first NUL, lossily as UTF-8 (`c_char` is `i8` or `u8`
/// depending on the target).
fn c_text(s: &[c_char]) -> String {
    let bytes: Vec<u8> = s
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c.to_ne_bytes()[0])
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}
