//! Safe Rust SDK for matrix multiplication on Rockchip NPUs (RK3588 and family).
//!
//! * [`Runtime`]: the real NPU through `librknnrt.so`, or the emulator (`rknn-emu`), or
//!   [`Runtime::auto`]; every context is created from a runtime and cannot outlive it.
//! * [`Matmul`]: a typed context, `Matmul<'_, I8xI8ToI32>` and friends: shapes and layouts
//!   are checked against the chip's rules before any FFI call, with errors that name the rule
//!   ("N=100 is not a multiple of 32 required for i8 on RK3588").
//! * [`TensorMem`]: NPU memory that borrows its context (freed before it, exactly once);
//!   [`Matmul::run`] syncs caches and re-binds changed inputs by construction.
//! * [`Runtime::capabilities`] / [`Runtime::require`]: what the chip can multiply; RK3588's
//!   missing weight-only int4/int8 modes are refused with the reason.
//! * Guards for the field hazards ([`guard`]): fd limit and handle budget, an exclusive NPU
//!   lock between processes, the glibc `mallopt` workaround.
//!
//! Threads: a [`Runtime`] is `Sync`; a [`Matmul`] is `Send` but not `Sync`, because one
//! context driven from two threads at once has panicked the kernel on RK3588. Use one context
//! per thread (per NPU core).
//!
//! ```
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

mod capability;
mod dtype;
pub mod engine;
mod error;
pub mod guard;
mod matmul;
mod mem;
mod runtime;

pub use capability::{Capability, Scheme};
pub use dtype::*;
pub use error::{Error, Result, RknnCode, Versions};
pub use matmul::{BQuant, Core, LayerQuant, Matmul, MatmulBuilder};
pub use mem::TensorMem;
pub use rknn_chip::{self, Layout, MatmulType, Platform};
pub use rknn_emu::{self, EmuConfig};
pub use runtime::{Backend, GuardPolicy, Runtime, RuntimeOptions, detect_platform};
