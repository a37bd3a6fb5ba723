//! The RKNN emulator exported under the C names of `librknnrt.so`.
//!
//! `cargo build --release -p rknn-emu-dropin` produces `target/release/librknnrt.so`. A C or
//! C++ program written for Rockchip's runtime (matmul + memory API, SDK 2.x) runs on x86 with
//! `LD_LIBRARY_PATH=target/release`; `RKNN_EMU_PLATFORM` picks the chip (default rk3588) and
//! the other `RKNN_EMU_*` variables of [`rknn_emu::EmuConfig::from_env`] set the policies.
//! Rust programs can load it through `rknn_sys::RknnApi::load` like the real library.

use std::ffi::{c_char, c_int, c_void};

use rknn_emu::DROPIN_FUNCTIONS as F;
use rknn_sys::*;

macro_rules! export {
    ($(fn $name:ident($($arg:ident: $ty:ty),*) -> $ret:ty;)*) => {
        $(
            #[doc = concat!("`", stringify!($name), "`, emulated.")]
            ///
            /// # Safety
            /// The C contract of the runtime: pointers valid for the call as the API describes.
            #[unsafe(no_mangle)]
            pub unsafe extern "C" fn $name($($arg: $ty),*) -> $ret {
                // SAFETY: forwarded unchanged to the emulator's entry point of the same signature.
                unsafe { export!(@call $name, ($($arg),*)) }
            }
        )*
    };
    (@call rknn_matmul_create_dynamic_shape, $args:tt) => { export!(@opt rknn_matmul_create_dynamic_shape, $args) };
    (@call rknn_matmul_set_dynamic_shape, $args:tt) => { export!(@opt rknn_matmul_set_dynamic_shape, $args) };
    (@call rknn_matmul_set_quant_params, $args:tt) => { export!(@opt rknn_matmul_set_quant_params, $args) };
    (@call rknn_matmul_get_quant_params, $args:tt) => { export!(@opt rknn_matmul_get_quant_params, $args) };
    (@call rknn_B_normal_layout_to_native_layout, $args:tt) => { export!(@opt rknn_B_normal_layout_to_native_layout, $args) };
    (@call rknn_create_mem2, $args:tt) => { export!(@opt rknn_create_mem2, $args) };
    (@call rknn_create_mem_from_fd, $args:tt) => { export!(@opt rknn_create_mem_from_fd, $args) };
    (@call rknn_create_mem_from_phys, $args:tt) => { export!(@opt rknn_create_mem_from_phys, $args) };
    (@call rknn_mem_sync, $args:tt) => { export!(@opt rknn_mem_sync, $args) };
    (@call rknn_set_core_mask, $args:tt) => { export!(@opt rknn_set_core_mask, $args) };
    (@call rknn_emu_last_error, $args:tt) => { export!(@opt rknn_emu_last_error, $args) };
    (@call $name:ident, ($($arg:ident),*)) => { (F.$name)($($arg),*) };
    // The emulator implements every optional function; `Option` is only the table's type.
    (@opt $name:ident, ($($arg:ident),*)) => { (F.$name.expect("the emulator implements every function"))($($arg),*) };
}

export! {
    fn rknn_matmul_create(ctx: *mut rknn_matmul_ctx, info: *mut rknn_matmul_info, io_attr: *mut rknn_matmul_io_attr) -> c_int;
    fn rknn_matmul_create_dynamic_shape(ctx: *mut rknn_matmul_ctx, info: *mut rknn_matmul_info, shape_num: c_int, shapes: *mut rknn_matmul_shape, io_attrs: *mut rknn_matmul_io_attr) -> c_int;
    fn rknn_matmul_set_dynamic_shape(ctx: rknn_matmul_ctx, shape: *mut rknn_matmul_shape) -> c_int;
    fn rknn_matmul_set_io_mem(ctx: rknn_matmul_ctx, mem: *mut rknn_tensor_mem, attr: *mut rknn_matmul_tensor_attr) -> c_int;
    fn rknn_matmul_set_core_mask(ctx: rknn_matmul_ctx, mask: rknn_core_mask) -> c_int;
    fn rknn_matmul_set_quant_params(ctx: rknn_matmul_ctx, params: *mut rknn_quant_params) -> c_int;
    fn rknn_matmul_get_quant_params(ctx: rknn_matmul_ctx, params: *mut rknn_quant_params, scale: *mut f32) -> c_int;
    fn rknn_matmul_run(ctx: rknn_matmul_ctx) -> c_int;
    fn rknn_matmul_destroy(ctx: rknn_matmul_ctx) -> c_int;
    fn rknn_B_normal_layout_to_native_layout(b_in: *mut c_void, b_out: *mut c_void, k: c_int, n: c_int, info: *mut rknn_matmul_info) -> c_int;
    fn rknn_create_mem(ctx: rknn_context, size: u32) -> *mut rknn_tensor_mem;
    fn rknn_create_mem2(ctx: rknn_context, size: u64, flags: u64) -> *mut rknn_tensor_mem;
    fn rknn_create_mem_from_fd(ctx: rknn_context, fd: i32, virt: *mut c_void, size: u32, offset: i32) -> *mut rknn_tensor_mem;
    fn rknn_create_mem_from_phys(ctx: rknn_context, phys: u64, virt: *mut c_void, size: u32) -> *mut rknn_tensor_mem;
    fn rknn_destroy_mem(ctx: rknn_context, mem: *mut rknn_tensor_mem) -> c_int;
    fn rknn_mem_sync(ctx: rknn_context, mem: *mut rknn_tensor_mem, mode: rknn_mem_sync_mode) -> c_int;
    fn rknn_query(ctx: rknn_context, cmd: rknn_query_cmd, info: *mut c_void, size: u32) -> c_int;
    fn rknn_set_core_mask(ctx: rknn_context, mask: rknn_core_mask) -> c_int;
    fn rknn_emu_last_error() -> *const c_char;
}
