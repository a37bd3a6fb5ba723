//! Matmul types, element kinds and enumerations against the fact sheet §3 and §5.

mod common;

use common::{DEFINED_TYPES, accepted_types, chip_name, kinds, mt};
use rknn_chip::{
    ElemKind, Layout, MatmulType, Platform, QuantGranularity, QuantType, RuleViolation, check_type,
};

#[test]
fn defined_types_have_the_fact_sheet_kinds_and_names() {
    assert_eq!(MatmulType::ALL.len(), DEFINED_TYPES.len());
    for raw in DEFINED_TYPES {
        let t = mt(raw);
        assert_eq!(t.raw(), raw);
        assert_eq!((t.a, t.b, t.c), kinds(raw), "kinds of type {raw}");
        assert_eq!(t.c_name(), common::c_name(raw));
        assert!(MatmulType::ALL.contains(&t));
    }
}

#[test]
fn types_13_and_14_and_out_of_range_values_do_not_exist() {
    for raw in [0, 13, 14, 16, 17, 100, 0x7fff_ffff, u32::MAX] {
        assert_eq!(MatmulType::from_raw(raw), None, "type {raw}");
    }
}

#[test]
fn every_platform_accepts_exactly_the_fact_sheet_types() {
    for p in Platform::ALL {
        for raw in 0..=20u32 {
            let Some(t) = MatmulType::from_raw(raw) else {
                assert!(!DEFINED_TYPES.contains(&raw), "type {raw} should exist");
                continue;
            };
            let expected = accepted_types(p).contains(&raw);
            assert_eq!(p.accepts(t), expected, "{p:?} type {raw}");
            match check_type(p, t) {
                Ok(()) => assert!(expected, "{p:?} accepted type {raw}"),
                Err(e) => {
                    assert!(!expected, "{p:?} rejected type {raw}: {e}");
                    assert_eq!(e, RuleViolation::UnsupportedType { platform: p, t });
                    let msg = e.to_string();
                    assert!(msg.contains("not supported on"), "{msg}");
                    assert!(msg.contains(chip_name(p)), "{msg}");
                }
            }
        }
    }
}

#[test]
fn platform_list_is_the_five_matmul_chips() {
    let names: Vec<String> = Platform::ALL.iter().map(|p| p.to_string()).collect();
    assert_eq!(names, ["RK3588", "RK3576", "RK3562", "RK3566", "RK3568"]);
    for p in Platform::ALL {
        assert_eq!(chip_name(p).to_ascii_lowercase().parse::<Platform>(), Ok(p));
        assert_eq!(chip_name(p).parse::<Platform>(), Ok(p));
    }
    // No matmul at all on these (§5).
    for name in ["rv1103", "rv1106", "rk2118", "", "rk3599"] {
        assert!(name.parse::<Platform>().is_err(), "{name}");
    }
}

#[test]
fn rk3588_weight_only_rejection_explains_itself() {
    for raw in [5, 7, 11] {
        let err = check_type(Platform::Rk3588, mt(raw)).unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("RK3588"), "{msg}");
        assert!(msg.contains("weight-only"), "{msg}");
        assert!(msg.contains("int4"), "{msg}");
        assert!(msg.contains("int8"), "{msg}");
        assert!(msg.contains("W4A4"), "{msg}");
        assert!(msg.contains(common::c_name(raw)), "{msg}");
    }
    // The hint is about RK3588's weight-only modes only.
    let msg = check_type(Platform::Rk3576, mt(3)).unwrap_err().to_string();
    assert!(!msg.contains("weight-only"), "{msg}");
    let msg = check_type(Platform::Rk3566, mt(5)).unwrap_err().to_string();
    assert!(!msg.contains("RK3588"), "{msg}");
}

#[test]
fn element_kinds_map_to_tensor_types_and_sizes() {
    for k in [
        ElemKind::I4,
        ElemKind::I8,
        ElemKind::F16,
        ElemKind::Bf16,
        ElemKind::I16,
        ElemKind::I32,
        ElemKind::F32,
    ] {
        assert_eq!(k.tensor_type(), common::tensor_type(k), "{k:?}");
        assert_eq!(k.bits(), common::bits(k), "{k:?}");
        assert_eq!(k.name(), common::kind_name(k));
        assert_eq!(k.to_string(), common::kind_name(k));
        for count in 0..50 {
            assert_eq!(
                k.bytes_for(count),
                Some((count * common::bits(k)).div_ceil(8)),
                "{k:?} x {count}"
            );
        }
    }
    // int4: half a byte per element, an odd count rounds up.
    assert_eq!(ElemKind::I4.bytes_for(7), Some(4));
    assert_eq!(ElemKind::I4.bytes_for(8), Some(4));
}

#[test]
fn integer_types_are_exact() {
    // §8: integer accumulations are exact; i8 -> i8 (type 3) requantises with rounding.
    for raw in DEFINED_TYPES {
        assert_eq!(
            mt(raw).is_integer(),
            [2, 10, 11].contains(&raw),
            "type {raw}"
        );
    }
}

#[test]
fn quant_types_follow_the_runtime_values() {
    use QuantGranularity::*;
    let expected = [
        (PerLayer, false),
        (PerLayer, true),
        (PerChannel, false),
        (PerChannel, true),
        (PerGroup, false),
        (PerGroup, true),
    ];
    for (raw, (granularity, asymmetric)) in expected.into_iter().enumerate() {
        let q = QuantType::from_raw(raw as i64).unwrap();
        assert_eq!(
            q,
            QuantType {
                granularity,
                asymmetric
            },
            "quant type {raw}"
        );
        assert_eq!(q.raw(), raw as u32);
    }
    for raw in [-1, 6, 7, 100, i64::from(i16::MIN), i64::from(i16::MAX)] {
        assert_eq!(QuantType::from_raw(raw), None, "quant type {raw}");
    }
}

#[test]
fn layouts_follow_the_runtime_values() {
    for (raw, l) in [(0, Layout::Norm), (1, Layout::Native), (2, Layout::TpNorm)] {
        assert_eq!(Layout::from_raw(raw), Some(l));
        assert_eq!(l.raw(), raw as u32);
    }
    for raw in [-1, 3, 4, 100, i64::from(i16::MIN)] {
        assert_eq!(Layout::from_raw(raw), None, "layout {raw}");
    }
}
