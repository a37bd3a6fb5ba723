//! Raw FFI bindings to Rockchip's RKNN runtime, `librknnrt.so` (SDK 2.x), for its matrix
//! multiplication ("matmul") and memory API.
//!
//! * [`bindings`] (re-exported at the root): the C types, constants and function-pointer types,
//!   with the C names. They are bindgen output committed to the repository, so building needs
//!   neither bindgen, libclang nor Rockchip's headers (which may not be redistributed).
//!   `regen-bindings.sh` reproduces them. bindgen renames the C field `type` to `type_`.
//! * [`RknnApi`]: the function table. [`RknnApi::load`] opens the library at run time (the
//!   default), so a crate depending on this one builds and runs on machines without an NPU;
//!   feature `link` adds `RknnApi::linked` for link-time binding; [`RknnApi::from_functions`]
//!   lets a Rust implementation of the C API (the `rknn-emu` emulator) fill the same table
//!   (`unsafe`: every pointer must implement the C contract of its entry).
//!   One entry is not Rockchip's: [`RknnFunctions::rknn_emu_last_error`], the emulator's
//!   error message for the last failed call, `None` with the real runtime.
//!
//! Only SDK 2.x is supported: 1.x runtimes have a 24-byte `rknn_matmul_info` and would
//! misread the 64-byte struct bound here.
//!
//! ```no_run
//! use rknn_sys::*;
//! // SAFETY: librknnrt.so (or the file named by RKNN_RUNTIME_PATH) is an RKNN runtime.
//! let api = unsafe { RknnApi::load() }.expect("librknnrt.so");
//! let mut info = rknn_matmul_info { M: 1, K: 64, N: 32, type_: RKNN_INT8_MM_INT8_TO_INT32, ..Default::default() };
//! let mut io = rknn_matmul_io_attr::default();
//! let mut ctx: rknn_matmul_ctx = 0;
//! // SAFETY: every pointer is valid for the call.
//! let rc = unsafe { (api.rknn_matmul_create)(&mut ctx, &mut info, &mut io) };
//! assert_eq!(rc, 0);
//! # unsafe { (api.rknn_matmul_destroy)(ctx) };
//! ```

/// The C types, constants and function-pointer types (bindgen output, C names; the C names
/// and the fact sheet are their documentation).
#[allow(missing_docs)]
pub mod bindings;
pub use bindings::*;

mod api;
pub use api::{
    ApiOrigin, DEFAULT_RUNTIME_SONAME, LoadError, RKNN_RUNTIME_PATH_ENV, RknnApi, RknnFunctions,
};

#[cfg(feature = "link")]
mod linked;

/// The C name of an error code returned by the runtime, or `None` for an undocumented code.
pub fn error_name(code: i32) -> Option<&'static str> {
    Some(match code {
        0 => "RKNN_SUCC",
        RKNN_ERR_FAIL => "RKNN_ERR_FAIL",
        RKNN_ERR_TIMEOUT => "RKNN_ERR_TIMEOUT",
        RKNN_ERR_DEVICE_UNAVAILABLE => "RKNN_ERR_DEVICE_UNAVAILABLE",
        RKNN_ERR_MALLOC_FAIL => "RKNN_ERR_MALLOC_FAIL",
        RKNN_ERR_PARAM_INVALID => "RKNN_ERR_PARAM_INVALID",
        RKNN_ERR_MODEL_INVALID => "RKNN_ERR_MODEL_INVALID",
        RKNN_ERR_CTX_INVALID => "RKNN_ERR_CTX_INVALID",
        RKNN_ERR_INPUT_INVALID => "RKNN_ERR_INPUT_INVALID",
        RKNN_ERR_OUTPUT_INVALID => "RKNN_ERR_OUTPUT_INVALID",
        RKNN_ERR_DEVICE_UNMATCH => "RKNN_ERR_DEVICE_UNMATCH",
        RKNN_ERR_INCOMPATILE_PRE_COMPILE_MODEL => "RKNN_ERR_INCOMPATILE_PRE_COMPILE_MODEL",
        RKNN_ERR_INCOMPATILE_OPTIMIZATION_LEVEL_VERSION => {
            "RKNN_ERR_INCOMPATILE_OPTIMIZATION_LEVEL_VERSION"
        }
        RKNN_ERR_TARGET_PLATFORM_UNMATCH => "RKNN_ERR_TARGET_PLATFORM_UNMATCH",
        _ => return None,
    })
}

/// The C name of a matmul type, or `None` for a value the fact sheet does not list.
pub fn matmul_type_name(t: rknn_matmul_type) -> Option<&'static str> {
    Some(match t {
        RKNN_FLOAT16_MM_FLOAT16_TO_FLOAT32 => "RKNN_FLOAT16_MM_FLOAT16_TO_FLOAT32",
        RKNN_INT8_MM_INT8_TO_INT32 => "RKNN_INT8_MM_INT8_TO_INT32",
        RKNN_INT8_MM_INT8_TO_INT8 => "RKNN_INT8_MM_INT8_TO_INT8",
        RKNN_FLOAT16_MM_FLOAT16_TO_FLOAT16 => "RKNN_FLOAT16_MM_FLOAT16_TO_FLOAT16",
        RKNN_FLOAT16_MM_INT8_TO_FLOAT32 => "RKNN_FLOAT16_MM_INT8_TO_FLOAT32",
        RKNN_FLOAT16_MM_INT8_TO_FLOAT16 => "RKNN_FLOAT16_MM_INT8_TO_FLOAT16",
        RKNN_FLOAT16_MM_INT4_TO_FLOAT32 => "RKNN_FLOAT16_MM_INT4_TO_FLOAT32",
        RKNN_FLOAT16_MM_INT4_TO_FLOAT16 => "RKNN_FLOAT16_MM_INT4_TO_FLOAT16",
        RKNN_INT8_MM_INT8_TO_FLOAT32 => "RKNN_INT8_MM_INT8_TO_FLOAT32",
        RKNN_INT4_MM_INT4_TO_INT16 => "RKNN_INT4_MM_INT4_TO_INT16",
        RKNN_INT8_MM_INT4_TO_INT32 => "RKNN_INT8_MM_INT4_TO_INT32",
        RKNN_FLOAT16_MM_INT4_TO_BFLOAT16 => "RKNN_FLOAT16_MM_INT4_TO_BFLOAT16",
        RKNN_INT8_MM_INT4_TO_FLOAT16 => "RKNN_INT8_MM_INT4_TO_FLOAT16",
        _ => return None,
    })
}
