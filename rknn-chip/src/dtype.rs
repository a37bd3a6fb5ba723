//! Matmul types and the element kinds of their operands.

use rknn_sys as sys;

/// The element type of one matmul operand, as the NPU stores it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ElemKind {
    /// 4-bit two's complement, two per byte, even element in the low nibble.
    I4,
    /// 8-bit signed integer.
    I8,
    /// IEEE binary16.
    F16,
    /// bfloat16.
    Bf16,
    /// 16-bit signed integer.
    I16,
    /// 32-bit signed integer.
    I32,
    /// IEEE binary32.
    F32,
}

impl ElemKind {
    /// Storage size in bits.
    pub const fn bits(self) -> usize {
        match self {
            ElemKind::I4 => 4,
            ElemKind::I8 => 8,
            ElemKind::F16 | ElemKind::Bf16 | ElemKind::I16 => 16,
            ElemKind::I32 | ElemKind::F32 => 32,
        }
    }

    /// Bytes taken by `count` elements (int4 rounds up to whole bytes), or `None` when the
    /// size does not fit in `usize`.
    pub const fn bytes_for(self, count: usize) -> Option<usize> {
        match self {
            // Never multiplied by the bit width, which could overflow where the result fits.
            ElemKind::I4 => Some(count.div_ceil(2)),
            _ => count.checked_mul(self.bits() / 8),
        }
    }

    /// The runtime's `rknn_tensor_type` for this kind.
    pub const fn tensor_type(self) -> sys::rknn_tensor_type {
        match self {
            ElemKind::I4 => sys::RKNN_TENSOR_INT4,
            ElemKind::I8 => sys::RKNN_TENSOR_INT8,
            ElemKind::F16 => sys::RKNN_TENSOR_FLOAT16,
            ElemKind::Bf16 => sys::RKNN_TENSOR_BFLOAT16,
            ElemKind::I16 => sys::RKNN_TENSOR_INT16,
            ElemKind::I32 => sys::RKNN_TENSOR_INT32,
            ElemKind::F32 => sys::RKNN_TENSOR_FLOAT32,
        }
    }

    /// Short name used in error messages ("i8", "f16", ...).
    pub const fn name(self) -> &'static str {
        match self {
            ElemKind::I4 => "i4",
            ElemKind::I8 => "i8",
            ElemKind::F16 => "f16",
            ElemKind::Bf16 => "bf16",
            ElemKind::I16 => "i16",
            ElemKind::I32 => "i32",
            ElemKind::F32 => "f32",
        }
    }
}

impl std::fmt::Display for ElemKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A matmul type (`rknn_matmul_type`): the element kinds of A × B → C.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MatmulType {
    raw: sys::rknn_matmul_type,
    /// Kind of A (activations), [M, K].
    pub a: ElemKind,
    /// Kind of B (weights), [K, N].
    pub b: ElemKind,
    /// Kind of C (output), [M, N].
    pub c: ElemKind,
}

macro_rules! matmul_types {
    ($($name:ident = $raw:ident: $a:ident x $b:ident -> $c:ident;)*) => {
        impl MatmulType {
            $(
                #[doc = concat!("`", stringify!($raw), "`: ", stringify!($a), " × ", stringify!($b), " → ", stringify!($c), ".")]
                pub const $name: MatmulType =
                    MatmulType { raw: sys::$raw, a: ElemKind::$a, b: ElemKind::$b, c: ElemKind::$c };
            )*

            /// Every matmul type of SDK 2.x, in the order of their values.
            pub const ALL: &'static [MatmulType] = &[$(MatmulType::$name,)*];
        }
    };
}

matmul_types! {
    F16_F16_F32 = RKNN_FLOAT16_MM_FLOAT16_TO_FLOAT32: F16 x F16 -> F32;
    I8_I8_I32 = RKNN_INT8_MM_INT8_TO_INT32: I8 x I8 -> I32;
    I8_I8_I8 = RKNN_INT8_MM_INT8_TO_INT8: I8 x I8 -> I8;
    F16_F16_F16 = RKNN_FLOAT16_MM_FLOAT16_TO_FLOAT16: F16 x F16 -> F16;
    F16_I8_F32 = RKNN_FLOAT16_MM_INT8_TO_FLOAT32: F16 x I8 -> F32;
    F16_I8_F16 = RKNN_FLOAT16_MM_INT8_TO_FLOAT16: F16 x I8 -> F16;
    F16_I4_F32 = RKNN_FLOAT16_MM_INT4_TO_FLOAT32: F16 x I4 -> F32;
    F16_I4_F16 = RKNN_FLOAT16_MM_INT4_TO_FLOAT16: F16 x I4 -> F16;
    I8_I8_F32 = RKNN_INT8_MM_INT8_TO_FLOAT32: I8 x I8 -> F32;
    I4_I4_I16 = RKNN_INT4_MM_INT4_TO_INT16: I4 x I4 -> I16;
    I8_I4_I32 = RKNN_INT8_MM_INT4_TO_INT32: I8 x I4 -> I32;
    F16_I4_BF16 = RKNN_FLOAT16_MM_INT4_TO_BFLOAT16: F16 x I4 -> Bf16;
    I8_I4_F16 = RKNN_INT8_MM_INT4_TO_FLOAT16: I8 x I4 -> F16;
}

impl MatmulType {
    /// The type with this `rknn_matmul_type` value, if SDK 2.x defines it (13 and 14 do not exist).
    pub fn from_raw(raw: sys::rknn_matmul_type) -> Option<MatmulType> {
        MatmulType::ALL.iter().copied().find(|t| t.raw == raw)
    }

    /// The `rknn_matmul_type` value.
    pub const fn raw(self) -> sys::rknn_matmul_type {
        self.raw
    }

    /// The C name, e.g. `RKNN_INT8_MM_INT8_TO_INT32`.
    pub fn c_name(self) -> &'static str {
        sys::matmul_type_name(self.raw).unwrap_or("unknown matmul type")
    }

    /// The element kind that sets the K and N alignment: the narrower of A and B, whose tiles
    /// are the larger. For the mixed types (RK3576) which operand governs is \[open\]; the
    /// stricter choice is taken.
    pub fn align_kind(self) -> ElemKind {
        if self.a.bits() <= self.b.bits() {
            self.a
        } else {
            self.b
        }
    }

    /// Whether every operand is an integer, so the result is exact (no rounding anywhere).
    pub fn is_integer(self) -> bool {
        matches!(self.a, ElemKind::I4 | ElemKind::I8)
            && matches!(self.b, ElemKind::I4 | ElemKind::I8)
            && matches!(self.c, ElemKind::I16 | ElemKind::I32)
    }
}

impl std::fmt::Display for MatmulType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} ({} x {} -> {})",
            self.c_name(),
            self.a,
            self.b,
            self.c
        )
    }
}

/// How a matrix is laid out in memory (`rknn_matmul_layout`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Layout {
    /// Row-major: A [M, K], B [K, N], C [M, N].
    Norm,
    /// The NPU's tiled layout (see [`crate::layout`]).
    Native,
    /// B only: supplied transposed, [N, K] row-major.
    TpNorm,
}

impl Layout {
    /// The layout with this `rknn_matmul_layout` value.
    pub fn from_raw(raw: i64) -> Option<Layout> {
        match raw {
            0 => Some(Layout::Norm),
            1 => Some(Layout::Native),
            2 => Some(Layout::TpNorm),
            _ => None,
        }
    }

    /// The `rknn_matmul_layout` value.
    pub const fn raw(self) -> sys::rknn_matmul_layout {
        match self {
            Layout::Norm => sys::RKNN_MM_LAYOUT_NORM,
            Layout::Native => sys::RKNN_MM_LAYOUT_NATIVE,
            Layout::TpNorm => sys::RKNN_MM_LAYOUT_TP_NORM,
        }
    }
}

/// Granularity of quantisation parameters (`rknn_matmul_quant_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum QuantGranularity {
    /// One scale (and zero point) for the whole matrix.
    PerLayer,
    /// One per output channel (N values).
    PerChannel,
    /// One per group of `group_size` rows of K per channel (N*K/group_size values).
    PerGroup,
}

/// A quant type: granularity and whether zero points are used.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct QuantType {
    /// Granularity.
    pub granularity: QuantGranularity,
    /// Asymmetric (zero points used) or symmetric.
    pub asymmetric: bool,
}

impl QuantType {
    /// The quant type with this `rknn_matmul_quant_type` value (0..=5).
    pub fn from_raw(raw: i64) -> Option<QuantType> {
        let granularity = match raw {
            0 | 1 => QuantGranularity::PerLayer,
            2 | 3 => QuantGranularity::PerChannel,
            4 | 5 => QuantGranularity::PerGroup,
            _ => return None,
        };
        Some(QuantType {
            granularity,
            asymmetric: raw % 2 == 1,
        })
    }

    /// The `rknn_matmul_quant_type` value.
    pub const fn raw(self) -> sys::rknn_matmul_quant_type {
        let base = match self.granularity {
            QuantGranularity::PerLayer => 0,
            QuantGranularity::PerChannel => 2,
            QuantGranularity::PerGroup => 4,
        };
        base + self.asymmetric as u32
    }
}
