//! The chips that run matmul, and their rules.
//!
//! Every number here comes from the project's fact sheet (`docs/hardware-facts.md` summarises
//! it with sources): \[doc\] from Rockchip's header and guide, \[hw\] measured on boards, \[open\] not
//! settled, in which case the value is a documented default that [`ShapeRules`] can change.

use std::fmt;
use std::str::FromStr;

use crate::dtype::{ElemKind, MatmulType};

/// A Rockchip SoC whose NPU runs the matmul API.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Platform {
    /// RK3588 / RK3588S: three NPU cores.
    Rk3588,
    /// RK3576: two NPU cores.
    Rk3576,
    /// RK3562: one core.
    Rk3562,
    /// RK3566: one core.
    Rk3566,
    /// RK3568: one core.
    Rk3568,
}

/// Tile sizes of the native layouts for one matmul type on one chip (fact sheet §7).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Tiles {
    /// Native A: K elements per tile row, `[ceil(K/a_k), M, a_k]`.
    pub a_k: usize,
    /// Native B: N per tile, `[ceil(N/b_n), ceil(K/b_k), b_n, b_k]`.
    pub b_n: usize,
    /// Native B: K per tile.
    pub b_k: usize,
    /// Native C: N per tile, `[ceil(N/c_n), M, c_n]`.
    pub c_n: usize,
}

impl Platform {
    /// Every platform, RK3588 first.
    pub const ALL: [Platform; 5] = [
        Platform::Rk3588,
        Platform::Rk3576,
        Platform::Rk3562,
        Platform::Rk3566,
        Platform::Rk3568,
    ];

    /// Lower-case name: "rk3588", ...
    pub const fn name(self) -> &'static str {
        match self {
            Platform::Rk3588 => "rk3588",
            Platform::Rk3576 => "rk3576",
            Platform::Rk3562 => "rk3562",
            Platform::Rk3566 => "rk3566",
            Platform::Rk3568 => "rk3568",
        }
    }

    /// Number of NPU cores.
    pub const fn npu_cores(self) -> usize {
        match self {
            Platform::Rk3588 => 3,
            Platform::Rk3576 => 2,
            _ => 1,
        }
    }

    /// Whether the chip accepts this matmul type (fact sheet §5). RK3588 rejects every
    /// weight-only mode (\[hw\]: types 5, 7, 11 fail with -5); types 6, 12 and 15 appear in no
    /// chip's table and are treated as unsupported everywhere (\[open\]).
    pub fn accepts(self, t: MatmulType) -> bool {
        let accepted: &[u32] = match self {
            Platform::Rk3588 => &[1, 2, 3, 4, 9, 10],
            Platform::Rk3576 => &[1, 2, 4, 5, 7, 8, 11],
            Platform::Rk3562 | Platform::Rk3566 | Platform::Rk3568 => &[1, 2],
        };
        accepted.contains(&t.raw())
    }

    /// K and N alignment for an element kind, from the runtime header (fact sheet §6).
    /// `None` when the chip has no matmul on that kind.
    pub const fn alignment(self, kind: ElemKind) -> Option<(usize, usize)> {
        match (self, kind) {
            (Platform::Rk3566 | Platform::Rk3568, ElemKind::I8) => Some((32, 16)),
            (Platform::Rk3566 | Platform::Rk3568, ElemKind::F16) => Some((16, 8)),
            (Platform::Rk3562, ElemKind::I8) => Some((32, 16)),
            (Platform::Rk3562, ElemKind::F16) => Some((32, 8)),
            (Platform::Rk3588 | Platform::Rk3576, ElemKind::I8) => Some((32, 32)),
            (Platform::Rk3588 | Platform::Rk3576, ElemKind::F16) => Some((32, 16)),
            (Platform::Rk3588 | Platform::Rk3576, ElemKind::I4) => Some((32, 64)),
            _ => None,
        }
    }

    /// Rows of K per native-B segment: the runtime converts and stores B in blocks of this
    /// many K rows when K exceeds it (RK3588 8192, RK3576 4096; fact sheet §6). For the
    /// single-core chips no segmentation is documented (`None`).
    pub const fn k_segment(self) -> Option<usize> {
        match self {
            Platform::Rk3588 => Some(8192),
            Platform::Rk3576 => Some(4096),
            _ => None,
        }
    }

    /// The largest N of one matmul context ever measured on this chip: i8 N = 8192 ran on
    /// RK3588 (\[hw\]); nothing above the user guide's [`USER_GUIDE_MAX_N`] is known to run
    /// on the other chips (`None`). Whether a runtime release accepts it is \[open\]
    /// (conformance: `rules.n_limit`).
    pub const fn measured_max_n(self) -> Option<usize> {
        match self {
            Platform::Rk3588 => Some(8192),
            _ => None,
        }
    }

    /// Whether `rknn_matmul_set_core_mask` exists on this chip (RK3588 and RK3576 only; the
    /// single-core chips return -1).
    pub const fn has_core_mask(self) -> bool {
        self.npu_cores() > 1
    }

    /// Whether a matmul context accepts this core mask. Only AUTO and single-core masks of
    /// existing cores run (\[hw\]: a combined mask such as 3 or 7 is rejected for matmul).
    pub fn accepts_core_mask(self, mask: u32) -> bool {
        if !self.has_core_mask() {
            return false;
        }
        mask == rknn_sys::RKNN_NPU_CORE_AUTO
            || (mask.is_power_of_two() && (mask.trailing_zeros() as usize) < self.npu_cores())
    }

    /// Native-layout tile sizes for a matmul type (fact sheet §7). `None` when the chip has no
    /// tile for one of the operands (the type is not supported there).
    ///
    /// The C tile for f16, bf16 and i8 outputs is undocumented (\[open\]): every RK3588 A/C cell
    /// is 16 bytes, so `16 / element size` is used (8 for f16/bf16, 16 for i8). On the real
    /// NPU always read the tile from `io_attr.C.dims[2]` instead.
    pub fn tiles(self, t: MatmulType) -> Option<Tiles> {
        let big = matches!(self, Platform::Rk3588 | Platform::Rk3576);
        let old = matches!(self, Platform::Rk3566 | Platform::Rk3568);
        let a_k = match (t.a, big, old) {
            (ElemKind::I4, true, _) => 32,
            (ElemKind::I8, _, false) => 16,
            (ElemKind::I8, _, true) => 8,
            (ElemKind::F16, _, false) => 8,
            (ElemKind::F16, _, true) => 4,
            _ => return None,
        };
        let (b_n, b_k) = match (t.b, self) {
            (ElemKind::I4, Platform::Rk3588 | Platform::Rk3576) => (64, 32),
            (ElemKind::I8, Platform::Rk3588 | Platform::Rk3576) => (32, 32),
            (ElemKind::F16, Platform::Rk3588 | Platform::Rk3576) => (16, 32),
            (ElemKind::I8, Platform::Rk3562) => (16, 32),
            (ElemKind::F16, Platform::Rk3562) => (8, 32),
            (ElemKind::I8, Platform::Rk3566 | Platform::Rk3568) => (16, 32),
            (ElemKind::F16, Platform::Rk3566 | Platform::Rk3568) => (8, 16),
            _ => return None,
        };
        let c_n = match t.c {
            ElemKind::I16 => 8,
            ElemKind::I32 | ElemKind::F32 => 4,
            // [open] inferred from the 16-byte cell, see above.
            ElemKind::F16 | ElemKind::Bf16 => 8,
            ElemKind::I8 => 16,
            ElemKind::I4 => return None,
        };
        Some(Tiles { a_k, b_n, b_k, c_n })
    }
}

impl fmt::Display for Platform {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name().to_ascii_uppercase())
    }
}

/// A platform name that is not one of rk3588, rk3576, rk3562, rk3566, rk3568.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown platform {0:?}: expected one of rk3588, rk3576, rk3562, rk3566, rk3568")]
pub struct UnknownPlatform(pub String);

impl FromStr for Platform {
    type Err = UnknownPlatform;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let lower = s.trim().to_ascii_lowercase();
        Platform::ALL
            .into_iter()
            .find(|p| p.name() == lower)
            .ok_or_else(|| UnknownPlatform(s.to_string()))
    }
}

/// The user guide's largest N of one matmul context, on every chip (\[doc\]; stricter than
/// what RK3588 ran, [`Platform::measured_max_n`]).
pub const USER_GUIDE_MAX_N: usize = 4096;

/// Shape rules beyond the per-chip tables, where public sources disagree (\[open\]).
///
/// The defaults follow what the runtime demonstrably accepts; [`ShapeRules::strict`] adds the
/// user guide's stricter limits for code that must run on every runtime release.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ShapeRules {
    /// Largest K of one context. The header says 10240; RK3588 \[hw\] ran K = 15360 (slowly), so
    /// the default is no limit on RK3588 and the header's 10240 on the other chips.
    pub max_k: Option<usize>,
    /// Largest N. The user guide says 4096; \[hw\] N = 8192 ran on RK3588. Default: none.
    pub max_n: Option<usize>,
    /// N alignment for f16 on RK3588/RK3576. Header 16 (default); user guide 32.
    pub f16_n_align: usize,
}

impl ShapeRules {
    /// What the runtime demonstrably accepts on `platform`.
    pub const fn accepted(platform: Platform) -> ShapeRules {
        let max_k = match platform {
            Platform::Rk3588 => None,
            _ => Some(10240),
        };
        let f16_n_align = match platform.alignment(ElemKind::F16) {
            Some((_, n)) => n,
            None => 16,
        };
        ShapeRules {
            max_k,
            max_n: None,
            f16_n_align,
        }
    }

    /// The user guide's stricter rules: K <= 10240, N <= 4096, f16 N aligned to 32 on the
    /// three-core and two-core chips.
    pub const fn strict(platform: Platform) -> ShapeRules {
        let f16_n_align = match platform {
            Platform::Rk3588 | Platform::Rk3576 => 32,
            _ => ShapeRules::accepted(platform).f16_n_align,
        };
        ShapeRules {
            max_k: Some(10240),
            max_n: Some(USER_GUIDE_MAX_N),
            f16_n_align,
        }
    }
}
