//! The fact sheet (`docs/rknn-matmul-facts.md`, sections 3 and 5-7) transcribed as plain
//! tables: the independent reference the integration tests compare `rknn-chip` against.
//! Nothing here is computed with the crate's own tables.
#![allow(dead_code)]

use rknn_chip::{ElemKind, MatmulType, Platform};

/// Every matmul type value SDK 2.x defines (§3; 13 and 14 do not exist).
pub const DEFINED_TYPES: [u32; 13] = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 15];

/// §5: accepted matmul types per chip.
pub fn accepted_types(p: Platform) -> &'static [u32] {
    match p {
        Platform::Rk3588 => &[1, 2, 3, 4, 9, 10],
        Platform::Rk3576 => &[1, 2, 4, 5, 7, 8, 11],
        Platform::Rk3562 | Platform::Rk3566 | Platform::Rk3568 => &[1, 2],
    }
}

/// Upper-case chip name as it appears in error messages.
pub fn chip_name(p: Platform) -> &'static str {
    match p {
        Platform::Rk3588 => "RK3588",
        Platform::Rk3576 => "RK3576",
        Platform::Rk3562 => "RK3562",
        Platform::Rk3566 => "RK3566",
        Platform::Rk3568 => "RK3568",
    }
}

/// §3: A, B, C element kinds of a matmul type value.
pub fn kinds(raw: u32) -> (ElemKind, ElemKind, ElemKind) {
    use ElemKind::*;
    match raw {
        1 => (F16, F16, F32),
        2 => (I8, I8, I32),
        3 => (I8, I8, I8),
        4 => (F16, F16, F16),
        5 => (F16, I8, F32),
        6 => (F16, I8, F16),
        7 => (F16, I4, F32),
        8 => (F16, I4, F16),
        9 => (I8, I8, F32),
        10 => (I4, I4, I16),
        11 => (I8, I4, I32),
        12 => (F16, I4, Bf16),
        15 => (I8, I4, F16),
        _ => panic!("matmul type {raw} does not exist"),
    }
}

/// §3: C names of the matmul types.
pub fn c_name(raw: u32) -> &'static str {
    match raw {
        1 => "RKNN_FLOAT16_MM_FLOAT16_TO_FLOAT32",
        2 => "RKNN_INT8_MM_INT8_TO_INT32",
        3 => "RKNN_INT8_MM_INT8_TO_INT8",
        4 => "RKNN_FLOAT16_MM_FLOAT16_TO_FLOAT16",
        5 => "RKNN_FLOAT16_MM_INT8_TO_FLOAT32",
        6 => "RKNN_FLOAT16_MM_INT8_TO_FLOAT16",
        7 => "RKNN_FLOAT16_MM_INT4_TO_FLOAT32",
        8 => "RKNN_FLOAT16_MM_INT4_TO_FLOAT16",
        9 => "RKNN_INT8_MM_INT8_TO_FLOAT32",
        10 => "RKNN_INT4_MM_INT4_TO_INT16",
        11 => "RKNN_INT8_MM_INT4_TO_INT32",
        12 => "RKNN_FLOAT16_MM_INT4_TO_BFLOAT16",
        15 => "RKNN_INT8_MM_INT4_TO_FLOAT16",
        _ => panic!("matmul type {raw} does not exist"),
    }
}

/// §3: `rknn_tensor_type` value of an element kind.
pub fn tensor_type(k: ElemKind) -> u32 {
    match k {
        ElemKind::F32 => 0,
        ElemKind::F16 => 1,
        ElemKind::I8 => 2,
        ElemKind::I16 => 4,
        ElemKind::I32 => 6,
        ElemKind::I4 => 10,
        ElemKind::Bf16 => 11,
    }
}

/// Storage bits of an element kind.
pub fn bits(k: ElemKind) -> usize {
    match k {
        ElemKind::I4 => 4,
        ElemKind::I8 => 8,
        ElemKind::F16 | ElemKind::Bf16 | ElemKind::I16 => 16,
        ElemKind::I32 | ElemKind::F32 => 32,
    }
}

/// Short kind name used in error messages.
pub fn kind_name(k: ElemKind) -> &'static str {
    match k {
        ElemKind::I4 => "i4",
        ElemKind::I8 => "i8",
        ElemKind::F16 => "f16",
        ElemKind::Bf16 => "bf16",
        ElemKind::I16 => "i16",
        ElemKind::I32 => "i32",
        ElemKind::F32 => "f32",
    }
}

/// §6 (header values): (K align, N align) per chip and element kind; `None` for "–".
pub fn align(p: Platform, k: ElemKind) -> Option<(usize, usize)> {
    use ElemKind::*;
    match p {
        Platform::Rk3566 | Platform::Rk3568 => match k {
            I8 => Some((32, 16)),
            F16 => Some((16, 8)),
            _ => None,
        },
        Platform::Rk3562 => match k {
            I8 => Some((32, 16)),
            F16 => Some((32, 8)),
            _ => None,
        },
        Platform::Rk3588 | Platform::Rk3576 => match k {
            I8 => Some((32, 32)),
            F16 => Some((32, 16)),
            I4 => Some((32, 64)),
            _ => None,
        },
    }
}

/// §6: native-B K segment (RK3588 8192, RK3576 4096, nothing documented elsewhere).
pub fn segment(p: Platform) -> Option<usize> {
    match p {
        Platform::Rk3588 => Some(8192),
        Platform::Rk3576 => Some(4096),
        _ => None,
    }
}

/// §7: native A tile sK for the kind of A.
pub fn a_sk(p: Platform, k: ElemKind) -> Option<usize> {
    use ElemKind::*;
    match (p, k) {
        (Platform::Rk3588 | Platform::Rk3576, I4) => Some(32),
        (Platform::Rk3588 | Platform::Rk3576, I8) => Some(16),
        (Platform::Rk3588 | Platform::Rk3576, F16) => Some(8),
        (Platform::Rk3562, I8) => Some(16),
        (Platform::Rk3562, F16) => Some(8),
        (Platform::Rk3566 | Platform::Rk3568, I8) => Some(8),
        (Platform::Rk3566 | Platform::Rk3568, F16) => Some(4),
        _ => None,
    }
}

/// §7: native B tile (sN, sK) for the kind of B.
pub fn b_tile(p: Platform, k: ElemKind) -> Option<(usize, usize)> {
    use ElemKind::*;
    match (p, k) {
        (Platform::Rk3588 | Platform::Rk3576, I4) => Some((64, 32)),
        (Platform::Rk3588 | Platform::Rk3576, I8) => Some((32, 32)),
        (Platform::Rk3588 | Platform::Rk3576, F16) => Some((16, 32)),
        (Platform::Rk3562, I8) => Some((16, 32)),
        (Platform::Rk3562, F16) => Some((8, 32)),
        (Platform::Rk3566 | Platform::Rk3568, I8) => Some((16, 32)),
        (Platform::Rk3566 | Platform::Rk3568, F16) => Some((8, 16)),
        _ => None,
    }
}

/// §7: native C tile sN for the kind of C. Documented for i16 (8) and i32/f32 (4); for f16,
/// bf16 and i8 outputs the sheet only suggests a 16-byte cell ([open]).
pub fn c_sn(k: ElemKind) -> usize {
    match k {
        ElemKind::I16 => 8,
        ElemKind::I32 | ElemKind::F32 => 4,
        other => 16 * 8 / bits(other),
    }
}

/// The type with this raw value (must exist).
pub fn mt(raw: u32) -> MatmulType {
    MatmulType::from_raw(raw).unwrap_or_else(|| panic!("type {raw} should exist"))
}

/// Every (platform, accepted type) pair of §5.
pub fn accepted_pairs() -> Vec<(Platform, MatmulType)> {
    let mut v = Vec::new();
    for p in Platform::ALL {
        for &raw in accepted_types(p) {
            v.push((p, mt(raw)));
        }
    }
    v
}
