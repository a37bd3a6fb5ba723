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
    #[error("{dim}={value} must be positive")]
    NotPositive {
        /// The dimension.
        dim: Dim,
        /// Its value.
        value: i64,
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
    /// A layout value that does not exist, or one that this matrix cannot use.
    #[error("layout {value} is not valid for {matrix} (NORM 0, NATIVE 1{})", if *matrix == "B" { ", TP_NORM 2" } else { "" })]
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
