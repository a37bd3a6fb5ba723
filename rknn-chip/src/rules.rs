//! Validation of one matmul configuration against a chip's rules, with errors that name the
//! rule and its numbers.

use crate::dtype::{ElemKind, Layout, MatmulType, QuantGranularity, QuantType};
use crate::platform::{Platform, ShapeRules};

/// Which dimension a rule is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Dim {
    /// Rows of A and C.
    M,
    /// The reduction dimension.
    K,
    /// Columns of B and C.
    N,
}

impl std::fmt::Display for Dim {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Dim::M => "M",
            Dim::K => "K",
            Dim::N => "N",
        })
    }
}

/// A broken chip rule. The runtime answers every one of these with `RKNN_ERR_PARAM_INVALID`
/// (-5); these errors say which rule it was.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RuleViolation {
    /// The matmul type value is not one SDK 2.x defines.
    #[error("matmul type {0} does not exist (SDK 2.x defines 1-12 and 15)")]
    UnknownType(u32),
    /// The chip does not have this matmul type.
    #[error("{t} is not supported on {platform}{}", weight_only_hint(*platform, *t))]
    UnsupportedType {
        /// The chip.
        platform: Platform,
        /// The type asked for.
        t: MatmulType,
    },
    /// A dimension is zero or negative.
    #[error("{dim}={value} must be at least 1")]
    NotPositive {
        /// The dimension.
        dim: Dim,
        /// Its value.
        value: i64,
    },
    /// A dimension does not fit the C API's `int32_t` fields (`rknn_matmul_info.M/K/N`): a
    /// cast would silently truncate it.
    #[error("{dim}={value} exceeds {max}, the largest value the C API's int32_t dimensions carry")]
    DimTooLarge {
        /// The dimension.
        dim: Dim,
        /// Its value.
        value: usize,
        /// The limit, `i32::MAX`.
        max: usize,
    },
    /// A size computed from the dimensions does not fit in `usize` on this machine.
    #[error("the size of {matrix} for M={m}, K={k}, N={n} overflows this machine's address space")]
    SizeOverflow {
        /// "A", "B" or "C".
        matrix: &'static str,
        /// M.
        m: usize,
        /// K.
        k: usize,
        /// N.
        n: usize,
    },
    /// A matrix takes more bytes than a tensor attribute's `uint32_t size` (and
    /// `rknn_create_mem`'s size argument) can describe.
    #[error(
        "{matrix} takes {bytes} bytes, more than the {max} a tensor attribute's uint32_t size can describe"
    )]
    TooManyBytes {
        /// "A", "B" or "C".
        matrix: &'static str,
        /// Its size in bytes.
        bytes: usize,
        /// The limit, `u32::MAX`.
        max: usize,
    },
    /// The chip needs B in the native layout for this type.
    #[error(
        "{t} on {platform} needs B in the native layout (a normal-layout B fails at set_io_mem on the hardware)"
    )]
    NeedsNativeB {
        /// The chip.
        platform: Platform,
        /// The matmul type.
        t: MatmulType,
    },
    /// K or N is not a multiple of the chip's alignment for the element type.
    #[error("{dim}={value} is not a multiple of {align} required for {kind} on {platform}")]
    Misaligned {
        /// The dimension.
        dim: Dim,
        /// Its value.
        value: usize,
        /// The required multiple.
        align: usize,
        /// The element kind that sets the alignment.
        kind: ElemKind,
        /// The chip.
        platform: Platform,
    },
    /// A dimension exceeds a limit.
    #[error("{dim}={value} exceeds the limit of {max} on {platform} ({source_of_limit})")]
    TooLarge {
        /// The dimension.
        dim: Dim,
        /// Its value.
        value: usize,
        /// The limit.
        max: usize,
        /// The chip.
        platform: Platform,
        /// Where the limit comes from.
        source_of_limit: &'static str,
    },
    /// A layout value that does not exist, or one that this matrix cannot use (TP_NORM, 2, is a
    /// layout of B only).
    #[error("layout {value} is not valid for {matrix} (NORM 0, NATIVE 1{})", if *matrix == "B" { ", TP_NORM 2" } else if *value == 2 { "; TP_NORM 2 is a layout of B only" } else { "" })]
    BadLayout {
        /// "A/C" or "B".
        matrix: &'static str,
        /// The raw layout value.
        value: i64,
    },
    /// A quant type value that does not exist.
    #[error("quant type {value} for {matrix} does not exist (0-5)")]
    BadQuantType {
        /// "A/C" or "B".
        matrix: &'static str,
        /// The raw value.
        value: i64,
    },
    /// Per-group quantisation needs a group size that divides K.
    #[error("group_size={group_size} must be positive and divide K={k} for per-group quantisation")]
    BadGroupSize {
        /// The group size.
        group_size: i64,
        /// K.
        k: usize,
    },
}

fn weight_only_hint(platform: Platform, t: MatmulType) -> &'static str {
    let weight_only = t.a.bits() > t.b.bits();
    if platform == Platform::Rk3588 && weight_only {
        ": the RK3588 NPU has no weight-only int8/int4 matmul; its only int4 mode is \
         RKNN_INT4_MM_INT4_TO_INT16 (W4A4), which also quantises the activations to 4 bits"
    } else {
        ""
    }
}

/// One matmul configuration as `rknn_matmul_info` describes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MatmulConfig {
    /// The matmul type.
    pub t: MatmulType,
    /// Rows of A and C.
    pub m: usize,
    /// Reduction length.
    pub k: usize,
    /// Columns of B and C.
    pub n: usize,
    /// Layout of B.
    pub b_layout: Layout,
    /// Layout of A and C.
    pub ac_layout: Layout,
    /// Quant type of B.
    pub b_quant: QuantType,
    /// Quant type of A and C.
    pub ac_quant: QuantType,
    /// Group size for per-group quantisation (0 otherwise).
    pub group_size: usize,
}

/// Parses and validates the fields of an `rknn_matmul_info` for `platform`.
pub fn parse_info(
    platform: Platform,
    rules: &ShapeRules,
    info: &rknn_sys::rknn_matmul_info,
) -> Result<MatmulConfig, RuleViolation> {
    let t = MatmulType::from_raw(info.type_).ok_or(RuleViolation::UnknownType(info.type_))?;
    let b_layout = Layout::from_raw(info.B_layout.into()).ok_or(RuleViolation::BadLayout {
        matrix: "B",
        value: info.B_layout.into(),
    })?;
    let ac_layout = match Layout::from_raw(info.AC_layout.into()) {
        Some(l @ (Layout::Norm | Layout::Native)) => l,
        _ => {
            return Err(RuleViolation::BadLayout {
                matrix: "A/C",
                value: info.AC_layout.into(),
            });
        }
    };
    let b_quant =
        QuantType::from_raw(info.B_quant_type.into()).ok_or(RuleViolation::BadQuantType {
            matrix: "B",
            value: info.B_quant_type.into(),
        })?;
    let ac_quant =
        QuantType::from_raw(info.AC_quant_type.into()).ok_or(RuleViolation::BadQuantType {
            matrix: "A/C",
            value: info.AC_quant_type.into(),
        })?;
    let dim = |d: Dim, v: i32| {
        usize::try_from(v)
            .ok()
            .filter(|&v| v > 0)
            .ok_or(RuleViolation::NotPositive {
                dim: d,
                value: v.into(),
            })
    };
    let (m, k, n) = (
        dim(Dim::M, info.M)?,
        dim(Dim::K, info.K)?,
        dim(Dim::N, info.N)?,
    );
    let group_size = if b_quant.granularity == QuantGranularity::PerGroup {
        let g = i64::from(info.group_size);
        if g <= 0 || k % g as usize != 0 {
            return Err(RuleViolation::BadGroupSize { group_size: g, k });
        }
        g as usize
    } else {
        0
    };
    let cfg = MatmulConfig {
        t,
        m,
        k,
        n,
        b_layout,
        ac_layout,
        b_quant,
        ac_quant,
        group_size,
    };
    check_type(platform, t)?;
    check_kn(platform, rules, t, k, n)?;
    Ok(cfg)
}

/// Checks that `platform` has matmul type `t`.
pub fn check_type(platform: Platform, t: MatmulType) -> Result<(), RuleViolation> {
    if platform.accepts(t) {
        Ok(())
    } else {
        Err(RuleViolation::UnsupportedType { platform, t })
    }
}

/// Checks K and N against the chip's alignment and limits for `t` (M has no rule).
pub fn check_kn(
    platform: Platform,
    rules: &ShapeRules,
    t: MatmulType,
    k: usize,
    n: usize,
) -> Result<(), RuleViolation> {
    let kind = t.align_kind();
    let Some((k_align, mut n_align)) = platform.alignment(kind) else {
        return Err(RuleViolation::UnsupportedType { platform, t });
    };
    if kind == ElemKind::F16 {
        n_align = rules.f16_n_align;
    }
    if k % k_align != 0 {
        return Err(RuleViolation::Misaligned {
            dim: Dim::K,
            value: k,
            align: k_align,
            kind,
            platform,
        });
    }
    if n % n_align != 0 {
        return Err(RuleViolation::Misaligned {
            dim: Dim::N,
            value: n,
            align: n_align,
            kind,
            platform,
        });
    }
    if let Some(max) = rules.max_k.filter(|&max| k > max) {
        return Err(RuleViolation::TooLarge {
            dim: Dim::K,
            value: k,
            max,
            platform,
            source_of_limit: "runtime header",
        });
    }
    if let Some(max) = rules.max_n.filter(|&max| n > max) {
        return Err(RuleViolation::TooLarge {
            dim: Dim::N,
            value: n,
            max,
            platform,
            source_of_limit: "user guide",
        });
    }
    Ok(())
}

/// The largest M, K or N the C API can carry: `rknn_matmul_info` and `rknn_matmul_shape` hold
/// them in `int32_t` fields.
pub const MAX_DIM: usize = i32::MAX as usize;

/// Checks M, K and N before anything else: each must be in `1..=i32::MAX` ([`MAX_DIM`]), so
/// that the casts to the C API's `int32_t` fields are exact.
///
/// ```
/// use rknn_chip::{check_dims, Dim, RuleViolation};
/// assert_eq!(check_dims(1, 64, 0).unwrap_err().to_string(), "N=0 must be at least 1");
/// let err = check_dims(1, (1 << 32) + 32, 32).unwrap_err();
/// assert!(matches!(err, RuleViolation::DimTooLarge { dim: Dim::K, .. }));
/// ```
pub fn check_dims(m: usize, k: usize, n: usize) -> Result<(), RuleViolation> {
    for (dim, value) in [(Dim::M, m), (Dim::K, k), (Dim::N, n)] {
        if value == 0 {
            return Err(RuleViolation::NotPositive { dim, value: 0 });
        }
        if value > MAX_DIM {
            return Err(RuleViolation::DimTooLarge {
                dim,
                value,
                max: MAX_DIM,
            });
        }
    }
    Ok(())
}

/// Checks the layouts of a configuration: TP_NORM is a layout of B only, and on RK3588
/// `RKNN_INT4_MM_INT4_TO_INT16` needs B in the native layout (\[hw\]: the runtime creates the
/// context with a normal B but fails at `set_io_mem`). The emulator applies it when B is bound,
/// where the hardware fails; the safe layer before creating the context.
///
/// ```
/// use rknn_chip::{check_layouts, Layout, MatmulType, Platform};
/// let p = Platform::Rk3588;
/// assert!(check_layouts(p, MatmulType::I4_I4_I16, Layout::Native, Layout::Norm).is_ok());
/// assert!(check_layouts(p, MatmulType::I4_I4_I16, Layout::Norm, Layout::Norm).is_err());
/// assert!(check_layouts(p, MatmulType::I8_I8_I32, Layout::Norm, Layout::TpNorm).is_err());
/// ```
pub fn check_layouts(
    platform: Platform,
    t: MatmulType,
    b_layout: Layout,
    ac_layout: Layout,
) -> Result<(), RuleViolation> {
    if ac_layout == Layout::TpNorm {
        return Err(RuleViolation::BadLayout {
            matrix: "A/C",
            value: Layout::TpNorm.raw().into(),
        });
    }
    if platform == Platform::Rk3588 && t == MatmulType::I4_I4_I16 && b_layout != Layout::Native {
        return Err(RuleViolation::NeedsNativeB { platform, t });
    }
    Ok(())
}
