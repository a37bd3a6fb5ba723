//! Safe Rust SDK for matrix multiplication on Rockchip NPUs (RK3588 and family).
//!
//! * [`Runtime`]: the real NPU through `librknnrt.so`, or the emulator (`rknn-emu`, feature
//!   `emulator`, on by default), or [`Runtime::auto`]. A runtime is a cheap handle; every
//!   object made from it keeps it alive.
//! * [`Matmul`]: a typed context, `Matmul<I8xI8ToI32>` and friends: shapes and layouts are
//!   checked against the chip's rules before any FFI call, with errors that name the rule
//!   ("N=100 is not a multiple of 32 required for i8 on RK3588").
//! * [`TensorMem`]: NPU memory that owns its context (so the context is destroyed after its last
//!   memory, whatever the drop order); [`Matmul::run`] syncs caches and re-binds changed inputs
//!   by construction.
//! * [`Runtime::capabilities`] / [`Runtime::require`]: what the chip can multiply; RK3588's
//!   missing weight-only int4/int8 modes are refused with the reason.
//! * Guards for the field hazards ([`guard`]): fd limit and handle budget, an exclusive NPU
//!   lock between processes, the glibc `mallopt` workaround.
//! * [`engine`]: the GEMM engine for model weights: resident linears split over the NPU cores
//!   and K segments, one persistent worker per core, SIMD host glue.
//!
//! Layers, bottom up, each a directory or file of this crate: `rknn-sys` (the C function table,
//! filled by `dlopen` or by the emulator); `dtype.rs` and `error.rs` (element types and typed
//! errors); `result.rs` (one function per C call, each return code mapped to a typed [`Error`]
//! naming the [`Call`]); `safe/` (the RAII types re-exported here); `engine/`. Each uses only
//! the layers below it. Errors a `Drop` cannot return (a
//! failed destroy) are reported by the next call on the same runtime
//! ([`Error::ReleaseFailed`]), never lost.
//!
//! Threads: a [`Runtime`] is `Send + Sync`; a [`Matmul`] is `Send` but not `Sync`, because one
//! context driven from two threads at once has panicked the kernel on RK3588. Use one context
//! per thread (per NPU core), as the engine does.
//!
//! ```
//! # if !cfg!(feature = "emulator") { return Ok(()); } // the emulator is not compiled in
//! use rknn_matmul::{F16xF16ToF32, Platform, Runtime};
//! use half::f16;
//! let rt = Runtime::emulator(Platform::Rk3588)?;
//! let mm = rt.matmul::<F16xF16ToF32>(1, 32, 16).build()?;
//! let (mut a, mut b, mut c) = (mm.alloc_a()?, mm.alloc_b()?, mm.alloc_c()?);
//! a.as_mut_slice().fill(f16::from_f32(0.5));
//! b.as_mut_slice().fill(f16::from_f32(2.0));
//! mm.run(&a, &b, &mut c)?;
//! assert_eq!(c.as_slice()[..16], [32.0f32; 16]);
//! # Ok::<(), rknn_matmul::Error>(())
//! ```

mod dtype;
pub mod engine;
mod error;
mod result;
mod safe;

pub use dtype::*;
pub use error::{Call, Error, Matrix, Result, RknnCode, Versions};
pub use rknn_chip::{
    self, GroupOrder, Int4ConverterInput, Layout, MatmulType, ModelledTime, Platform, ShapeRules,
};
#[cfg(feature = "emulator")]
pub use rknn_emu::{self, EmuConfig};
pub use safe::capability::Capability;
pub use safe::guard;
pub use safe::matmul::{BQuant, Core, LayerQuant, Matmul, MatmulBuilder};
pub use safe::mem::{MemFlags, TensorMem};
pub use safe::runtime::{Backend, GuardPolicy, Runtime, RuntimeOptions, detect_platform};
