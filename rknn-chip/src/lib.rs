//! Per-chip facts of the Rockchip NPU matmul API, in one place: which matmul types each chip
//! accepts, K/N alignment and limits, native-layout tile sizes, the K segmentation of native
//! B, int4 packing, and the `io_attr` descriptors the runtime reports.
//!
//! The RKNN emulator (`rknn-emu`) uses these tables to enforce and compute; the safe layer
//! (`rknn-matmul`) uses them to validate before any FFI call and to pack A / unpack C on the
//! engine's hot path. One source of truth keeps the two from drifting apart.
//!
//! It also holds what several crates above must agree on and that no crate below them could:
//! the one convention by which every host kernel of the SDK is chosen ([`kernel`]:
//! `RKNN_KERNEL`, `RKNN_KERNEL_<COMPONENT>`); how a linear is split into contexts and runs
//! ([`plan`]), which the engine builds and the cost model prices; the linears of a decoder
//! ([`LinearRole`], [`Residual`]), which the cost model prices and the LLM builds; and the
//! modelled device time ([`ModelledTime`]), which the emulator keeps and the safe layer hands
//! out.
//!
//! Every size computed from dimensions is overflow-checked ([`ElemKind::bytes_for`],
//! [`layout::io_descs`], the native lengths), and [`check_dims`] bounds M, K and N to the C
//! API's `int32_t` before anything else.
//!
//! Facts are labelled as in the project's fact sheet (`docs/hardware-facts.md`): \[doc\]
//! Rockchip's documentation, \[hw\] measured on boards, \[open\] unsettled. \[open\] items are
//! documented defaults, never presented as fact, and [`ShapeRules`] makes the disputed limits
//! configurable.
//!
//! ```
//! use rknn_chip::{check_kn, MatmulType, Platform, ShapeRules};
//! let p = Platform::Rk3588;
//! let err = check_kn(p, &ShapeRules::accepted(p), MatmulType::I8_I8_I32, 64, 100).unwrap_err();
//! assert_eq!(err.to_string(), "N=100 is not a multiple of 32 required for i8 on RK3588");
//! assert!(!p.accepts(MatmulType::F16_I4_F32)); // no weight-only int4 on RK3588
//! ```

mod decoder;
mod dtype;
mod group_order;
mod int4;
pub mod kernel;
pub mod layout;
mod modelled;
pub mod plan;
mod platform;
mod rules;

pub use decoder::{LinearRole, Residual};
pub use dtype::{ElemKind, Layout, MatmulType, QuantGranularity, QuantType};
pub use group_order::{GROUP_ORDER_ENV, GroupOrder, UnknownGroupOrder};
pub use int4::{INT4_CONVERTER_INPUT_ENV, Int4ConverterInput, UnknownInt4ConverterInput};
pub use kernel::KernelChoice;
pub use modelled::ModelledTime;
pub use platform::{Platform, ShapeRules, Tiles, USER_GUIDE_MAX_N, UnknownPlatform};
pub use rules::{
    Dim, MAX_DIM, MatmulConfig, RuleViolation, check_dims, check_kn, check_layouts, check_type,
    parse_info,
};
