//! The C entry points: every function of the runtime's matmul and memory API with its exact
//! signature. They check every pointer and handle, turn misuse into the runtime's error codes
//! (never a crash), catch panics at the boundary, and forward to the instance of their slot.

use std::cell::RefCell;
use std::ffi::{CString, c_char, c_int, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, Mutex, TryLockError};

use rknn_chip::layout::{self, TensorDesc};
use rknn_chip::{ElemKind, Int4ConverterInput, Platform};
use rknn_sys::{self as sys, RknnFunctions, rknn_matmul_ctx, rknn_tensor_mem};

use crate::config::{NibbleOrder, SharedMemories};
use crate::context::{CallResult, Context, swap_nibbles, try_vec};
use crate::instance::{self, Instance, InstanceRef, next_handle};
use crate::memory::Source;

/// The runtime version the emulator reports.
pub const EMULATED_API_VERSION: &str = "2.3.2 (rknn-emu)";

thread_local! {
    /// The last error message of this thread, as the C string `rknn_emu_last_error` returns.
    static LAST_ERROR: RefCell<Option<CString>> = const { RefCell::new(None) };
}

/// The message of the last error an emulator call returned on this thread, of any instance
/// (empty when none failed). Kept after later successful calls, like `errno`.
///
/// Code above the function table should read the table's `rknn_emu_last_error` entry instead,
/// which works through the drop-in library too and is simply absent with Rockchip's runtime.
pub fn last_error() -> String {
    LAST_ERROR.with(|e| {
        e.borrow()
            .as_ref()
            .map(|c| c.to_string_lossy().into_owned())
            .unwrap_or_default()
    })
}

/// Keeps the message for `rknn_emu_last_error` and, unless the instance's configuration says
/// not to, logs it on stderr the way the real runtime logs its reasons (`E RKNN: ...`).
fn record(slot: usize, func: &str, code: c_int, msg: &str) -> c_int {
    // Our messages never contain NUL; a name copied from C could not either (it ends at one).
    let c = CString::new(msg.replace('\0', " ")).unwrap_or_default();
    LAST_ERROR.with(|e| *e.borrow_mut() = Some(c));
    let log = instance::instance(slot).is_none_or(|i| i.cfg.log_errors);
    if log {
        let name = sys::error_name(code).unwrap_or("error");
        let prefix = if msg.starts_with(func) { "" } else { func };
        let sep = if prefix.is_empty() { "" } else { ": " };
        // `eprintln!` (not a raw write to fd 2) so that test harnesses capture it; it panics if
        // stderr is closed, which must not unwind into C.
        let _ = catch_unwind(|| eprintln!("E RKNN: {prefix}{sep}{msg} ({name} {code})"));
    }
    code
}

/// Runs the body of C function `func` of slot `S`, mapping errors and panics to codes.
fn call<const S: usize>(func: &'static str, body: impl FnOnce() -> CallResult) -> c_int {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => 0,
        Ok(Err((code, msg))) => record(S, func, code, &msg),
        Err(_) => record(
            S,
            func,
            sys::RKNN_ERR_FAIL,
            "internal error (panic) in the emulator",
        ),
    }
}

/// As [`call`] for the functions that return a memory pointer (NULL on failure).
fn call_ptr<const S: usize>(
    func: &'static str,
    body: impl FnOnce() -> CallResult<*mut rknn_tensor_mem>,
) -> *mut rknn_tensor_mem {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(p)) => p,
        Ok(Err((code, msg))) => {
            record(S, func, code, &msg);
            std::ptr::null_mut()
        }
        Err(_) => {
            record(
                S,
                func,
                sys::RKNN_ERR_FAIL,
                "internal error (panic) in the emulator",
            );
            std::ptr::null_mut()
        }
    }
}

/// `rknn_emu_last_error`, the emulator's extension of the table: this thread's last error
/// message as a C string, valid until the thread's next call into the emulator.
unsafe extern "C" fn emu_last_error<const S: usize>() -> *const c_char {
    LAST_ERROR.with(|e| e.borrow().as_ref().map_or(c"".as_ptr(), |c| c.as_ptr()))
}

/// The handle as the emulator's key: `rknn_context` is 32-bit on 32-bit ARM, 64-bit elsewhere.
#[allow(clippy::useless_conversion)]
pub(crate) fn handle(ctx: sys::rknn_context) -> u64 {
    u64::from(ctx)
}

fn err(code: c_int, msg: impl Into<String>) -> (c_int, String) {
    (code, msg.into())
}

fn param(msg: impl Into<String>) -> (c_int, String) {
    err(sys::RKNN_ERR_PARAM_INVALID, msg)
}

fn inst(slot: usize) -> CallResult<InstanceRef> {
    instance::instance(slot).ok_or_else(|| {
        err(
            sys::RKNN_ERR_CTX_INVALID,
            "this emulator instance was dropped",
        )
    })
}

fn context(inst: &Instance, ctx: u64) -> CallResult<Arc<Mutex<Context>>> {
    inst.state().contexts.get(&ctx).cloned().ok_or_else(|| {
        err(
            sys::RKNN_ERR_CTX_INVALID,
            format!("context {ctx:#x} is not a live matmul context"),
        )
    })
}

/// Runs `f` on a context, refusing the call if another thread is inside a call on it: on the
/// real NPU one context used from two threads has caused kernel panics.
fn with_context<T>(
    inst: &Instance,
    ctx: u64,
    f: impl FnOnce(&mut Context) -> CallResult<T>,
) -> CallResult<T> {
    let c = context(inst, ctx)?;
    let mut guard = match c.try_lock() {
        Ok(g) => g,
        Err(TryLockError::Poisoned(p)) => p.into_inner(),
        Err(TryLockError::WouldBlock) => {
            inst.concurrent_uses
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            return Err(err(
                sys::RKNN_ERR_FAIL,
                format!(
                    "context {ctx:#x} is in use by another thread (one context per thread: shared contexts have panicked the kernel)"
                ),
            ));
        }
    };
    f(&mut guard)
}

/// The bytes of a NUL-terminated C name (all of it if it has no NUL).
fn c_name_bytes(name: &[std::ffi::c_char]) -> impl Iterator<Item = u8> + '_ {
    name.iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c.to_ne_bytes()[0])
}

fn c_name(name: &[std::ffi::c_char]) -> String {
    let bytes: Vec<u8> = c_name_bytes(name).collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

fn fill_attr(attr: &mut sys::rknn_matmul_tensor_attr, d: &TensorDesc) {
    *attr = sys::rknn_matmul_tensor_attr::default();
    for (dst, src) in attr.name.iter_mut().zip(d.name.bytes()) {
        *dst = std::ffi::c_char::from_ne_bytes([src]);
    }
    attr.n_dims = d.n_dims as u32;
    for (dst, &src) in attr.dims.iter_mut().zip(&d.dims[..d.n_dims]) {
        *dst = src as u32;
    }
    attr.size = d.size_bytes() as u32;
    attr.type_ = d.kind.tensor_type();
}

fn fill_io(io: &mut sys::rknn_matmul_io_attr, d: &[TensorDesc; 3]) {
    fill_attr(&mut io.A, &d[0]);
    fill_attr(&mut io.B, &d[1]);
    fill_attr(&mut io.C, &d[2]);
}

/// Validates `info` for one shape and returns the descriptors.
fn describe(
    platform: Platform,
    inst: &Instance,
    info: &sys::rknn_matmul_info,
) -> CallResult<(rknn_chip::MatmulConfig, [TensorDesc; 3])> {
    let cfg =
        rknn_chip::parse_info(platform, &inst.rules, info).map_err(|e| param(e.to_string()))?;
    let descs = layout::io_descs(platform, &cfg).map_err(|e| param(e.to_string()))?;
    Ok((cfg, descs))
}

unsafe extern "C" fn matmul_create<const S: usize>(
    ctx: *mut rknn_matmul_ctx,
    info: *mut sys::rknn_matmul_info,
    io_attr: *mut sys::rknn_matmul_io_attr,
) -> c_int {
    call::<S>("rknn_matmul_create", || {
        if ctx.is_null() || info.is_null() || io_attr.is_null() {
            return Err(param(
                "rknn_matmul_create: ctx, info and io_attr must not be NULL",
            ));
        }
        let inst = inst(S)?;
        // SAFETY: checked non-null; the C contract makes them valid for the call.
        let (info, io_attr) = unsafe { (&*info, &mut *io_attr) };
        let (cfg, descs) = describe(inst.cfg.platform, &inst, info)?;
        let handle = next_handle();
        let c = Context::new(
            cfg,
            vec![(cfg.m, cfg.k, cfg.n)],
            vec![descs],
            info.iommu_domain_id,
            inst.cfg.group_order,
        );
        inst.state_mut().add_context(handle, c);
        fill_io(io_attr, &descs);
        // SAFETY: checked non-null.
        unsafe { *ctx = handle as rknn_matmul_ctx };
        Ok(())
    })
}

unsafe extern "C" fn matmul_create_dynamic_shape<const S: usize>(
    ctx: *mut rknn_matmul_ctx,
    info: *mut sys::rknn_matmul_info,
    shape_num: c_int,
    shapes: *mut sys::rknn_matmul_shape,
    io_attrs: *mut sys::rknn_matmul_io_attr,
) -> c_int {
    call::<S>("rknn_matmul_create_dynamic_shape", || {
        if ctx.is_null() || info.is_null() || shapes.is_null() || io_attrs.is_null() {
            return Err(param(
                "rknn_matmul_create_dynamic_shape: pointers must not be NULL",
            ));
        }
        if shape_num <= 0 || shape_num as u32 > sys::RKNN_MAX_DYNAMIC_SHAPE_NUM {
            return Err(param(format!(
                "shape_num={shape_num} must be 1..={}",
                sys::RKNN_MAX_DYNAMIC_SHAPE_NUM
            )));
        }
        let inst = inst(S)?;
        let n = shape_num as usize;
        // SAFETY: non-null and, by the C contract, `shape_num` entries long.
        let (info, shapes, io_attrs) = unsafe {
            (
                &*info,
                std::slice::from_raw_parts(shapes, n),
                std::slice::from_raw_parts_mut(io_attrs, n),
            )
        };
        let mut cfgs = Vec::with_capacity(n);
        let mut all_descs = Vec::with_capacity(n);
        for s in shapes {
            let one = sys::rknn_matmul_info {
                M: s.M,
                K: s.K,
                N: s.N,
                ..*info
            };
            let (cfg, descs) = describe(inst.cfg.platform, &inst, &one)?;
            if cfgs
                .iter()
                .any(|c: &rknn_chip::MatmulConfig| (c.m, c.k, c.n) == (cfg.m, cfg.k, cfg.n))
            {
                return Err(param(format!(
                    "shape M={} K={} N={} is given twice",
                    cfg.m, cfg.k, cfg.n
                )));
            }
            if let Some(first) = cfgs.first() {
                if cfg.b_layout != rknn_chip::Layout::TpNorm && (cfg.k, cfg.n) != (first.k, first.n)
                {
                    // [doc] vendor demo: with B NORM or NATIVE, B is bound once for all shapes.
                    return Err(param(format!(
                        "with B_layout NORM or NATIVE every shape must have the same K and N (B is bound once): shape M={} K={} N={} differs from K={} N={}",
                        cfg.m, cfg.k, cfg.n, first.k, first.n
                    )));
                }
            }
            cfgs.push(cfg);
            all_descs.push(descs);
        }
        for (io, d) in io_attrs.iter_mut().zip(&all_descs) {
            fill_io(io, d);
        }
        let handle = next_handle();
        let shapes = cfgs.iter().map(|c| (c.m, c.k, c.n)).collect();
        let c = Context::new(
            cfgs[0],
            shapes,
            all_descs,
            info.iommu_domain_id,
            inst.cfg.group_order,
        );
        inst.state_mut().add_context(handle, c);
        // SAFETY: checked non-null.
        unsafe { *ctx = handle as rknn_matmul_ctx };
        Ok(())
    })
}

unsafe extern "C" fn matmul_set_dynamic_shape<const S: usize>(
    ctx: rknn_matmul_ctx,
    shape: *mut sys::rknn_matmul_shape,
) -> c_int {
    call::<S>("rknn_matmul_set_dynamic_shape", || {
        if shape.is_null() {
            return Err(param(
                "rknn_matmul_set_dynamic_shape: shape must not be NULL",
            ));
        }
        // SAFETY: checked non-null.
        let s = unsafe { *shape };
        let inst = inst(S)?;
        let dim = |v: i32| usize::try_from(v).map_err(|_| param(format!("negative dimension {v}")));
        let (m, k, n) = (dim(s.M)?, dim(s.K)?, dim(s.N)?);
        with_context(&inst, handle(ctx), |c| c.set_shape(m, k, n))
    })
}

unsafe extern "C" fn matmul_set_io_mem<const S: usize>(
    ctx: rknn_matmul_ctx,
    mem: *mut rknn_tensor_mem,
    attr: *mut sys::rknn_matmul_tensor_attr,
) -> c_int {
    call::<S>("rknn_matmul_set_io_mem", || {
        if mem.is_null() || attr.is_null() {
            return Err(param(
                "rknn_matmul_set_io_mem: mem and attr must not be NULL",
            ));
        }
        let inst = inst(S)?;
        // SAFETY: checked non-null.
        let attr = unsafe { &*attr };
        // Matched without building a string: this runs before every matmul of a model.
        const NAMES: [&str; 3] = ["A", "B", "C"];
        let Some(which) = NAMES
            .iter()
            .position(|n| c_name_bytes(&attr.name).eq(n.bytes()))
        else {
            return Err(param(format!(
                "attr name {:?} is not \"A\", \"B\" or \"C\" from io_attr",
                c_name(&attr.name)
            )));
        };
        let name = NAMES[which];
        let platform = inst.cfg.platform;
        with_context(&inst, handle(ctx), |c| {
            let desc = c.current_descs()[which];
            if attr.size as usize != desc.size_bytes() {
                return Err(param(format!(
                    "attr {name} has size {} but this context's {name} is {} bytes",
                    attr.size,
                    desc.size_bytes()
                )));
            }
            if which == 1 {
                // [hw]: on RK3588 type 10 with B in a normal layout is created but fails here.
                rknn_chip::check_layouts(platform, c.base.t, desc.layout, c.base.ac_layout)
                    .map_err(|e| param(e.to_string()))?;
            }
            let shared = {
                let st = inst.state();
                let m = st
                    .memories
                    .get(mem)
                    .ok_or_else(|| param("mem is not a live memory of this runtime"))?;
                if m.size < desc.size_bytes() {
                    return Err(param(format!(
                        "memory of {} bytes is smaller than {name}'s {} bytes",
                        m.size,
                        desc.size_bytes()
                    )));
                }
                if m.domain != c.domain {
                    // Each IOMMU domain is its own device address space: on a board the NPU would
                    // read or write through a mapping that does not exist in this context's domain.
                    return Err(param(format!(
                        "{name}'s memory was allocated in IOMMU domain {} but this context is in domain {}: allocate it on a context of domain {}",
                        m.domain, c.domain, c.domain
                    )));
                }
                if inst.cfg.shared_memories == SharedMemories::Refuse
                    && m.ctx != 0
                    && m.ctx != handle(ctx)
                {
                    // [open]: whether the runtime binds a memory of another context of the same
                    // domain; this setting plays a runtime that does not.
                    return Err(param(format!(
                        "{name}'s memory was created on context {:#x}, not on this context {:#x}: this runtime refuses a memory of another context (RKNN_EMU_SHARED_MEMORIES=refuse)",
                        m.ctx,
                        handle(ctx)
                    )));
                }
                m.shared.clone()
            };
            c.bind(&inst.cfg, which, shared)
        })
    })
}

unsafe extern "C" fn matmul_set_core_mask<const S: usize>(
    ctx: rknn_matmul_ctx,
    mask: sys::rknn_core_mask,
) -> c_int {
    call::<S>("rknn_matmul_set_core_mask", || {
        set_mask(&*inst(S)?, handle(ctx), mask)
    })
}

/// `rknn_set_core_mask`, the model API's core mask. The emulator has no model API: the only
/// contexts it knows are matmul contexts, on which it acts as `rknn_matmul_set_core_mask`
/// (what Rockchip's runtime does with a matmul handle here is not documented); any other handle
/// is `RKNN_ERR_CTX_INVALID`. Exported so that C code written for the whole vendor API links.
unsafe extern "C" fn set_core_mask<const S: usize>(
    ctx: sys::rknn_context,
    mask: sys::rknn_core_mask,
) -> c_int {
    call::<S>("rknn_set_core_mask", || {
        let inst = inst(S)?;
        if !inst.state().contexts.contains_key(&handle(ctx)) {
            return Err(err(
                sys::RKNN_ERR_CTX_INVALID,
                format!(
                    "context {:#x} is not a matmul context of this runtime (the emulator implements the matmul API only, it has no model contexts)",
                    handle(ctx)
                ),
            ));
        }
        set_mask(&inst, handle(ctx), mask)
    })
}

fn set_mask(inst: &Instance, ctx: u64, mask: sys::rknn_core_mask) -> CallResult {
    let p = inst.cfg.platform;
    with_context(inst, ctx, |c| {
        if !p.has_core_mask() {
            return Err(err(
                sys::RKNN_ERR_FAIL,
                format!("{p} has one NPU core: no core mask"),
            ));
        }
        if !p.accepts_core_mask(mask) {
            return Err(param(format!(
                "core mask {mask:#x} rejected: a matmul context runs on one core of {p} (masks 0 = auto, {}; use one context per core)",
                (0..p.npu_cores())
                    .map(|i| (1u32 << i).to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        }
        c.core_mask = mask;
        Ok(())
    })
}

unsafe extern "C" fn matmul_set_quant_params<const S: usize>(
    ctx: rknn_matmul_ctx,
    params: *mut sys::rknn_quant_params,
) -> c_int {
    call::<S>("rknn_matmul_set_quant_params", || {
        if params.is_null() {
            return Err(param(
                "rknn_matmul_set_quant_params: params must not be NULL",
            ));
        }
        let inst = inst(S)?;
        // SAFETY: checked non-null.
        let p = unsafe { &*params };
        let len = |l: i32, ptr: bool, what: &str| -> CallResult<usize> {
            match usize::try_from(l) {
                Ok(0) => Ok(0),
                Ok(n) if ptr => Ok(n),
                _ => Err(param(format!(
                    "{what}_len={l} with a {} pointer",
                    if ptr { "valid" } else { "NULL" }
                ))),
            }
        };
        let scale_len = len(p.scale_len, !p.scale.is_null(), "scale")?;
        let zp_len = len(p.zp_len, !p.zp.is_null(), "zp")?;
        let scale = if scale_len == 0 {
            vec![]
        } else {
            // SAFETY: a non-null pointer (checked by `len`) to the `scale_len` values the caller
            // declared (C contract); the values are copied out.
            let s = unsafe { std::slice::from_raw_parts(p.scale, scale_len) };
            s.to_vec()
        };
        let zp = if zp_len == 0 {
            vec![]
        } else {
            // SAFETY: as above, for the zero points.
            let z = unsafe { std::slice::from_raw_parts(p.zp, zp_len) };
            z.to_vec()
        };
        let name = c_name(&p.name);
        with_context(&inst, handle(ctx), |c| c.set_quant(&name, scale, zp))
    })
}

unsafe extern "C" fn matmul_get_quant_params<const S: usize>(
    ctx: rknn_matmul_ctx,
    params: *mut sys::rknn_quant_params,
    scale: *mut f32,
) -> c_int {
    call::<S>("rknn_matmul_get_quant_params", || {
        if scale.is_null() {
            return Err(param(
                "rknn_matmul_get_quant_params: scale must not be NULL",
            ));
        }
        let inst = inst(S)?;
        let (max, normalised) = with_context(&inst, handle(ctx), |c| c.normalised_b_scale())?;
        // SAFETY: checked non-null.
        unsafe { *scale = max };
        if !params.is_null() {
            // SAFETY: checked non-null; `scale` points to `scale_len` floats per the C contract.
            let p = unsafe { &mut *params };
            if !p.scale.is_null() && p.scale_len as usize >= normalised.len() {
                // SAFETY: as above.
                unsafe { std::slice::from_raw_parts_mut(p.scale, normalised.len()) }
                    .copy_from_slice(&normalised);
            }
        }
        Ok(())
    })
}

unsafe extern "C" fn matmul_run<const S: usize>(ctx: rknn_matmul_ctx) -> c_int {
    call::<S>("rknn_matmul_run", || {
        let inst = inst(S)?;
        with_context(&inst, handle(ctx), |c| {
            c.run(&inst.cfg)?;
            inst.account_run(c);
            Ok(())
        })
    })
}

unsafe extern "C" fn matmul_destroy<const S: usize>(ctx: rknn_matmul_ctx) -> c_int {
    call::<S>("rknn_matmul_destroy", || {
        let inst = inst(S)?;
        // Refuse while another thread is inside a call on it.
        with_context(&inst, handle(ctx), |c| {
            c.unbind_all();
            inst.forget_context(c);
            Ok(())
        })?;
        let mut st = inst.state_mut();
        st.contexts.remove(&handle(ctx));
        st.domains.remove(&handle(ctx));
        let orphans = st.memories.count_for_ctx(handle(ctx));
        inst.orphaned
            .fetch_add(orphans, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    })
}

/// `rknn_B_normal_layout_to_native_layout`: row-major [K, N] B into the native layout of the
/// configuration in `info` (its K and N replaced by the arguments), with K segmentation.
/// int4 input is read as [`EmuConfig::int4_converter_input`](crate::EmuConfig) says (\[open\]).
unsafe extern "C" fn b_normal_to_native<const S: usize>(
    b_in: *mut c_void,
    b_out: *mut c_void,
    k: c_int,
    n: c_int,
    info: *mut sys::rknn_matmul_info,
) -> c_int {
    call::<S>("rknn_B_normal_layout_to_native_layout", || {
        if b_in.is_null() || b_out.is_null() || info.is_null() {
            return Err(param(
                "rknn_B_normal_layout_to_native_layout: pointers must not be NULL",
            ));
        }
        let inst = inst(S)?;
        let platform = inst.cfg.platform;
        // SAFETY: checked non-null.
        let info = unsafe { *info };
        let one = sys::rknn_matmul_info {
            K: k,
            N: n,
            M: info.M.max(1),
            B_layout: sys::RKNN_MM_LAYOUT_NATIVE as i16,
            ..info
        };
        let (cfg, descs) = describe(platform, &inst, &one)?;
        let kind = cfg.t.b;
        let int4 = inst.cfg.int4_converter_input;
        let too_big = || {
            param(format!(
                "B of K={} N={} does not fit in memory",
                cfg.k, cfg.n
            ))
        };
        let count = cfg.k.checked_mul(cfg.n).ok_or_else(too_big)?;
        let in_len = layout::converter_input_len(kind, cfg.k, cfg.n, int4).ok_or_else(too_big)?;
        let out_len = descs[1].size_bytes();
        let (i0, o0) = (b_in.addr(), b_out.addr());
        if i0 < o0.saturating_add(out_len) && o0 < i0.saturating_add(in_len) {
            return Err(param(
                "B_input and B_output overlap: in-place conversion corrupts B on the real runtime",
            ));
        }
        let geo = layout::native_b_geometry(platform, cfg.t, cfg.k, cfg.n).ok_or_else(too_big)?;
        // SAFETY: non-null, `in_len` bytes by the C contract (the caller's buffer holds the whole
        // input in the form the setting names), not overlapping the output (checked above).
        let input = unsafe { std::slice::from_raw_parts(b_in as *const u8, in_len) };
        // SAFETY: non-null, `out_len` bytes (the size io_attr reports for native B) by the C
        // contract; distinct from `input`.
        let out = unsafe { std::slice::from_raw_parts_mut(b_out as *mut u8, out_len) };
        match kind {
            ElemKind::I8 | ElemKind::I4 => {
                let mut src = try_vec(count, 0i8)?;
                match (kind, int4) {
                    (ElemKind::I4, Int4ConverterInput::Packed) => {
                        layout::unpack_i4(input, &mut src)
                    }
                    _ => src.iter_mut().zip(input).for_each(|(d, &b)| *d = b as i8),
                }
                let mut native = try_vec(geo.len(), 0i8)?;
                geo.pack_from_kn(&src, &mut native);
                if kind == ElemKind::I4 {
                    // Values outside -8..=7 (one per byte) keep their low nibble.
                    layout::pack_i4(&native, out);
                    if inst.cfg.native_b_nibbles == NibbleOrder::HighFirst {
                        swap_nibbles(out);
                    }
                } else {
                    out.iter_mut().zip(&native).for_each(|(d, &s)| *d = s as u8);
                }
            }
            _ => {
                // 16-bit elements; the caller's buffer need not be aligned: read bytes.
                let mut src = try_vec(count, 0u16)?;
                src.iter_mut()
                    .zip(input.chunks_exact(2))
                    .for_each(|(d, c)| *d = u16::from_le_bytes([c[0], c[1]]));
                let mut native = try_vec(geo.len(), 0u16)?;
                geo.pack_from_kn(&src, &mut native);
                out.chunks_exact_mut(2)
                    .zip(&native)
                    .for_each(|(d, s)| d.copy_from_slice(&s.to_le_bytes()));
            }
        }
        Ok(())
    })
}

fn create(
    slot: usize,
    ctx: u64,
    size: u64,
    flags: u64,
    source: Source,
) -> CallResult<*mut rknn_tensor_mem> {
    let inst = inst(slot)?;
    let no_ctx = flags & u64::from(sys::RKNN_MEM_FLAG_ALLOC_NO_CONTEXT) != 0;
    let domain = if no_ctx && ctx == 0 {
        0
    } else {
        *inst.state().domains.get(&ctx).ok_or_else(|| {
            err(
                sys::RKNN_ERR_CTX_INVALID,
                format!("context {ctx:#x} is not a live matmul context"),
            )
        })?
    };
    let mut st = inst.state_mut();
    let st = &mut *st;
    st.memories
        .create(&inst.cfg, ctx, domain, size, source, &mut st.next_fd)
        .map_err(|e| err(sys::RKNN_ERR_MALLOC_FAIL, e.to_string()))
}

unsafe extern "C" fn create_mem<const S: usize>(
    ctx: sys::rknn_context,
    size: u32,
) -> *mut rknn_tensor_mem {
    call_ptr::<S>("rknn_create_mem", || {
        create(S, handle(ctx), size.into(), 0, Source::Alloc)
    })
}

unsafe extern "C" fn create_mem2<const S: usize>(
    ctx: sys::rknn_context,
    size: u64,
    flags: u64,
) -> *mut rknn_tensor_mem {
    call_ptr::<S>("rknn_create_mem2", || {
        create(S, handle(ctx), size, flags, Source::Alloc)
    })
}

unsafe extern "C" fn create_mem_from_fd<const S: usize>(
    ctx: sys::rknn_context,
    fd: i32,
    virt: *mut c_void,
    size: u32,
    offset: i32,
) -> *mut rknn_tensor_mem {
    call_ptr::<S>("rknn_create_mem_from_fd", || {
        if virt.is_null() || fd < 0 || offset < 0 {
            return Err(param(
                "rknn_create_mem_from_fd: the emulator needs the buffer's CPU mapping (virt_addr), fd >= 0, offset >= 0",
            ));
        }
        let flags = sys::RKNN_TENSOR_MEMORY_FLAGS_FROM_FD;
        create(
            S,
            handle(ctx),
            size.into(),
            0,
            Source::Wrap {
                fd,
                phys: 0,
                virt: virt.cast(),
                offset,
                flags,
            },
        )
    })
}

unsafe extern "C" fn create_mem_from_phys<const S: usize>(
    ctx: sys::rknn_context,
    phys: u64,
    virt: *mut c_void,
    size: u32,
) -> *mut rknn_tensor_mem {
    call_ptr::<S>("rknn_create_mem_from_phys", || {
        if virt.is_null() {
            return Err(param(
                "rknn_create_mem_from_phys: the emulator needs the buffer's CPU mapping (virt_addr)",
            ));
        }
        let flags = sys::RKNN_TENSOR_MEMORY_FLAGS_FROM_PHYS;
        create(
            S,
            handle(ctx),
            size.into(),
            0,
            Source::Wrap {
                fd: -1,
                phys,
                virt: virt.cast(),
                offset: 0,
                flags,
            },
        )
    })
}

unsafe extern "C" fn destroy_mem<const S: usize>(
    ctx: sys::rknn_context,
    mem: *mut rknn_tensor_mem,
) -> c_int {
    call::<S>("rknn_destroy_mem", || {
        if mem.is_null() {
            return Err(param("rknn_destroy_mem: mem must not be NULL"));
        }
        let inst = inst(S)?;
        let mut st = inst.state_mut();
        let owner = st
            .memories
            .get(mem)
            .map(|m| m.ctx)
            .ok_or_else(|| param("mem is not a live memory of this runtime (double free?)"))?;
        if owner != handle(ctx) {
            return Err(err(
                sys::RKNN_ERR_CTX_INVALID,
                format!("mem belongs to context {owner:#x}, not {:#x}", handle(ctx)),
            ));
        }
        st.memories.destroy(mem);
        Ok(())
    })
}

unsafe extern "C" fn mem_sync<const S: usize>(
    ctx: sys::rknn_context,
    mem: *mut rknn_tensor_mem,
    mode: sys::rknn_mem_sync_mode,
) -> c_int {
    call::<S>("rknn_mem_sync", || {
        if mem.is_null() {
            return Err(param("rknn_mem_sync: mem must not be NULL"));
        }
        let (to, from) = match mode {
            sys::RKNN_MEMORY_SYNC_TO_DEVICE => (true, false),
            sys::RKNN_MEMORY_SYNC_FROM_DEVICE => (false, true),
            sys::RKNN_MEMORY_SYNC_BIDIRECTIONAL => (true, true),
            other => return Err(param(format!("sync mode {other} is not 1, 2 or 3"))),
        };
        let inst = inst(S)?;
        let st = inst.state();
        let m = st
            .memories
            .get(mem)
            .ok_or_else(|| param("mem is not a live memory of this runtime"))?;
        if m.ctx != handle(ctx) && m.ctx != 0 {
            return Err(err(
                sys::RKNN_ERR_CTX_INVALID,
                "mem belongs to another context",
            ));
        }
        // Under the state's read lock: a sync takes only the memory's own lock, never the
        // state's, and a reference count taken and dropped would be two more writes per call.
        m.shared.sync(to, from);
        Ok(())
    })
}

unsafe extern "C" fn query<const S: usize>(
    ctx: sys::rknn_context,
    cmd: sys::rknn_query_cmd,
    info: *mut c_void,
    size: u32,
) -> c_int {
    call::<S>("rknn_query", || {
        let inst = inst(S)?;
        if ctx != 0 {
            context(&inst, handle(ctx))?;
            if !inst.cfg.sdk_version_on_matmul {
                return Err(err(
                    sys::RKNN_ERR_CTX_INVALID,
                    "RKNN_QUERY_SDK_VERSION is not answered on a matmul context (RKNN_EMU_SDK_VERSION_ON_MATMUL=0)",
                ));
            }
        }
        if cmd != sys::RKNN_QUERY_SDK_VERSION {
            return Err(param(format!(
                "query command {cmd} is not emulated (only RKNN_QUERY_SDK_VERSION = 5)"
            )));
        }
        if info.is_null() || (size as usize) < std::mem::size_of::<sys::rknn_sdk_version>() {
            return Err(param(
                "RKNN_QUERY_SDK_VERSION needs a rknn_sdk_version (512 bytes)",
            ));
        }
        let mut v = sys::rknn_sdk_version::default();
        let drv = format!(
            "emulated {} (rknn-emu {})",
            inst.cfg.platform.name(),
            env!("CARGO_PKG_VERSION")
        );
        for (d, s) in v.api_version.iter_mut().zip(EMULATED_API_VERSION.bytes()) {
            *d = std::ffi::c_char::from_ne_bytes([s]);
        }
        for (d, s) in v.drv_version.iter_mut().zip(drv.bytes().take(255)) {
            *d = std::ffi::c_char::from_ne_bytes([s]);
        }
        // SAFETY: non-null and at least 512 bytes (checked); unaligned write since the caller's
        // buffer is typed `void *`.
        unsafe { std::ptr::write_unaligned(info.cast::<sys::rknn_sdk_version>(), v) };
        Ok(())
    })
}

/// The function table of instance slot `S`.
const fn table<const S: usize>() -> RknnFunctions {
    RknnFunctions {
        rknn_matmul_create: matmul_create::<S>,
        rknn_matmul_set_io_mem: matmul_set_io_mem::<S>,
        rknn_matmul_set_core_mask: matmul_set_core_mask::<S>,
        rknn_matmul_run: matmul_run::<S>,
        rknn_matmul_destroy: matmul_destroy::<S>,
        rknn_create_mem: create_mem::<S>,
        rknn_destroy_mem: destroy_mem::<S>,
        rknn_query: query::<S>,
        rknn_matmul_create_dynamic_shape: Some(matmul_create_dynamic_shape::<S>),
        rknn_matmul_set_dynamic_shape: Some(matmul_set_dynamic_shape::<S>),
        rknn_matmul_set_quant_params: Some(matmul_set_quant_params::<S>),
        rknn_matmul_get_quant_params: Some(matmul_get_quant_params::<S>),
        rknn_B_normal_layout_to_native_layout: Some(b_normal_to_native::<S>),
        rknn_create_mem2: Some(create_mem2::<S>),
        rknn_create_mem_from_fd: Some(create_mem_from_fd::<S>),
        rknn_create_mem_from_phys: Some(create_mem_from_phys::<S>),
        rknn_mem_sync: Some(mem_sync::<S>),
        rknn_set_core_mask: Some(set_core_mask::<S>),
        rknn_emu_last_error: Some(emu_last_error::<S>),
    }
}

const TABLES: [RknnFunctions; instance::SLOTS] = [
    table::<0>(),
    table::<1>(),
    table::<2>(),
    table::<3>(),
    table::<4>(),
    table::<5>(),
    table::<6>(),
    table::<7>(),
    table::<8>(),
    table::<9>(),
    table::<10>(),
    table::<11>(),
    table::<12>(),
    table::<13>(),
    table::<14>(),
    table::<15>(),
];

/// The table of instance slot `slot`.
pub(crate) fn functions_for_slot(slot: usize) -> RknnFunctions {
    TABLES[slot]
}

/// The function table of the drop-in library's instance (configured from `RKNN_EMU_*`
/// environment variables on first use). The drop-in `librknnrt.so` exports these functions
/// under their C names.
pub const DROPIN_FUNCTIONS: RknnFunctions = table::<0>();
