//! `rknn-emu`: Rockchip's RKNN matmul and memory C API implemented in Rust.
//!
//! The emulator fills the same [`rknn_sys::RknnApi`] function table as the real
//! `librknnrt.so`, so code above the table (the `rknn-matmul` safe layer, examples, C programs
//! through the drop-in library) runs unchanged on machines without an NPU and goes through the
//! same unsafe calls, pointers and call order as on the board.
//!
//! What it reproduces (all from the project's fact sheet, `docs/hardware-facts.md`):
//!
//! * per-chip rules: accepted matmul types (unsupported → `RKNN_ERR_PARAM_INVALID`), K/N
//!   alignment, K limits, single-core masks only, tile sizes ([`rknn_chip`]);
//! * `io_attr` exactly as the runtime reports it (names, dims per layout, sizes in bytes);
//! * layouts: normal, native A/B/C, TP_NORM B, int4 packing, and
//!   `rknn_B_normal_layout_to_native_layout` with K segmentation (aliasing refused);
//! * arithmetic: i8 × i8 → i32 bit-exact, i4 × i4 → i16 exact with a configurable overflow
//!   policy, f16 with f32 accumulation, quantised types with per-layer/channel/group params;
//! * `set_io_mem` takes A and B in a normal layout at bind time, as the docs say the runtime
//!   may (it "may rearrange" them then); A and B in a native layout, already in the device's
//!   order, are read from the memory by every run, as the NPU reads its DMA buffers (no copy of
//!   native B, the weights, is kept); a run after a bound memory was destroyed fails, as the
//!   board would fault;
//! * dynamic shapes as the vendor uses them: B bound once, A and C per shape;
//! * field hazards: the handle budget (~1020), 4 GiB per IOMMU domain and no binding across
//!   domains, concurrent use of one context (refused with an error; the real device has panicked
//!   the kernel), optionally non-coherent caches ([`EmuConfig::strict_cache`]), and memories that
//!   are their own page mappings with a guard page, so a C overrun faults;
//! * errors: the runtime's codes, an `E RKNN: ...` line on stderr ([`EmuConfig::log_errors`]),
//!   and the reason through the table's `rknn_emu_last_error` extension entry.
//!
//! It also keeps, for every run, the device time a calibrated cost model of the chip gives it
//! ([`cost`], [`Emulator::modelled`]): what RK3588 would take, not what the host took.
//!
//! Behaviour the public sources leave open (\[open\] in the docs) is configurable in
//! [`EmuConfig`] and never presented as the hardware's.
//!
//! ```
//! use rknn_emu::{EmuConfig, Emulator};
//! use rknn_chip::Platform;
//! use rknn_sys::*;
//!
//! let emu = Emulator::new(EmuConfig::new(Platform::Rk3588)).unwrap();
//! let api = emu.api();
//! let mut info = rknn_matmul_info { M: 1, K: 32, N: 32, type_: RKNN_FLOAT16_MM_INT4_TO_FLOAT32, ..Default::default() };
//! let mut io = rknn_matmul_io_attr::default();
//! let mut ctx: rknn_matmul_ctx = 0;
//! // SAFETY: valid pointers for the call.
//! let rc = unsafe { (api.rknn_matmul_create)(&mut ctx, &mut info, &mut io) };
//! assert_eq!(rc, RKNN_ERR_PARAM_INVALID); // RK3588 has no weight-only int4
//! // The emulator's extension of the table says why (Rockchip's runtime leaves it `None`).
//! // SAFETY: a NUL-terminated string, valid until this thread's next call into the emulator.
//! let why = unsafe { std::ffi::CStr::from_ptr((api.rknn_emu_last_error.unwrap())()) };
//! assert!(why.to_str().unwrap().contains("no weight-only"));
//! ```

mod abi;
mod config;
mod context;
pub mod cost;
mod emulator;
mod instance;
pub mod kernels;
mod memory;

pub use abi::{DROPIN_FUNCTIONS, EMULATED_API_VERSION, last_error};
pub use config::{
    BusyCores, CostPolicy, EmuConfig, GroupOrder, NativeInputs, NibbleOrder, Overflow, Rounding,
    RulesPolicy, SharedMemories,
};
pub use context::ContextModelled;
pub use emulator::{EmuError, EmuStats, Emulator};
pub use rknn_chip;
/// What the cost model gives the runs an emulator made ([`Emulator::modelled`]).
pub use rknn_chip::ModelledTime;
