//! Shape rules (§6), `parse_info` and core masks against the fact sheet.

mod common;

use common::{accepted_pairs, accepted_types, align, chip_name, kind_name, mt};
use rknn_chip::{
    Dim, ElemKind, Layout, MatmulType, Platform, QuantGranularity, QuantType, RuleViolation,
    ShapeRules, check_kn, parse_info,
};

/// The kind whose alignment applies when A and B have the same kind (the only case §6 settles).
fn same_kind(t: MatmulType) -> Option<ElemKind> {
    (t.a == t.b).then_some(t.a)
}

/// (K align, N align) that satisfies both operands' alignments (all powers of two).
fn joint_align(p: Platform, t: MatmulType) -> (usize, usize) {
    let (ka, na) = align(p, t.a).unwrap();
    let (kb, nb) = align(p, t.b).unwrap();
    (ka.max(kb), na.max(nb))
}

#[test]
fn doc_example_error_text() {
    let p = Platform::Rk3588;
    let err = check_kn(p, &ShapeRules::accepted(p), mt(2), 64, 100).unwrap_err();
    assert_eq!(
        err.to_string(),
        "N=100 is not a multiple of 32 required for i8 on RK3588"
    );
}

#[test]
fn aligned_shapes_pass_on_every_chip_and_type() {
    for (p, t) in accepted_pairs() {
        let rules = ShapeRules::accepted(p);
        let (ka, na) = joint_align(p, t);
        for i in 1..=12 {
            for j in 1..=12 {
                let (k, n) = (ka * i, na * j);
                assert_eq!(
                    check_kn(p, &rules, t, k, n),
                    Ok(()),
                    "{p:?} {t} K={k} N={n}"
                );
            }
        }
        // The largest header K is always fine.
        assert_eq!(
            check_kn(p, &rules, t, 10240, na),
            Ok(()),
            "{p:?} {t} K=10240"
        );
    }
}

#[test]
fn misaligned_k_and_n_fail_with_exact_text() {
    let mut checked = 0;
    for (p, t) in accepted_pairs() {
        let Some(kind) = same_kind(t) else { continue };
        let rules = ShapeRules::accepted(p);
        let (ka, na) = align(p, kind).unwrap();
        for r in 1..ka {
            let k = 2 * ka + r;
            let err = check_kn(p, &rules, t, k, na).unwrap_err();
            assert_eq!(
                err,
                RuleViolation::Misaligned {
                    dim: Dim::K,
                    value: k,
                    align: ka,
                    kind,
                    platform: p
                }
            );
            assert_eq!(
                err.to_string(),
                format!(
                    "K={k} is not a multiple of {ka} required for {} on {}",
                    kind_name(kind),
                    chip_name(p)
                )
            );
            checked += 1;
        }
        for r in 1..na {
            let n = 3 * na + r;
            let err = check_kn(p, &rules, t, ka, n).unwrap_err();
            assert_eq!(
                err,
                RuleViolation::Misaligned {
                    dim: Dim::N,
                    value: n,
                    align: na,
                    kind,
                    platform: p
                }
            );
            assert_eq!(
                err.to_string(),
                format!(
                    "N={n} is not a multiple of {na} required for {} on {}",
                    kind_name(kind),
                    chip_name(p)
                )
            );
            checked += 1;
        }
    }
    assert!(checked > 500);
}

#[test]
fn header_alignment_table_is_the_platform_table() {
    for p in Platform::ALL {
        for kind in [ElemKind::I4, ElemKind::I8, ElemKind::F16] {
            assert_eq!(p.alignment(kind), align(p, kind), "{p:?} {kind:?}");
        }
    }
}

#[test]
fn mixed_types_on_rk3576_reject_shapes_misaligned_for_both_operands() {
    let p = Platform::Rk3576;
    let rules = ShapeRules::accepted(p);
    for raw in [5, 7, 8, 11] {
        let t = mt(raw);
        assert_ne!(t.a, t.b);
        let (ka, na) = joint_align(p, t);
        let min_n = align(p, t.a).unwrap().1.min(align(p, t.b).unwrap().1);
        let min_k = align(p, t.a).unwrap().0.min(align(p, t.b).unwrap().0);
        assert!(
            check_kn(p, &rules, t, ka, min_n / 2).is_err(),
            "{t} N={}",
            min_n / 2
        );
        assert!(check_kn(p, &rules, t, ka, na + min_n / 2).is_err(), "{t}");
        assert!(
            check_kn(p, &rules, t, min_k / 2, na).is_err(),
            "{t} K={}",
            min_k / 2
        );
        assert!(check_kn(p, &rules, t, ka + 1, na).is_err(), "{t}");
    }
}

#[test]
fn int4_has_no_alignment_on_single_core_chips() {
    for p in [Platform::Rk3562, Platform::Rk3566, Platform::Rk3568] {
        assert_eq!(p.alignment(ElemKind::I4), None);
        assert!(
            check_kn(p, &ShapeRules::accepted(p), mt(10), 64, 64).is_err(),
            "{p:?}"
        );
    }
}

#[test]
fn default_rules_on_rk3588_accept_the_measured_large_shapes() {
    let p = Platform::Rk3588;
    let rules = ShapeRules::accepted(p);
    for raw in accepted_types(p) {
        let t = mt(*raw);
        assert_eq!(check_kn(p, &rules, t, 15360, 8192), Ok(()), "{t}");
    }
    // f16 N aligned to the header's 16 is enough by default.
    assert_eq!(check_kn(p, &rules, mt(1), 64, 48), Ok(()));
    assert_eq!(check_kn(p, &rules, mt(4), 64, 16), Ok(()));
}

#[test]
fn default_rules_keep_the_header_k_limit_on_single_core_chips() {
    for p in [Platform::Rk3562, Platform::Rk3566, Platform::Rk3568] {
        let rules = ShapeRules::accepted(p);
        for raw in accepted_types(p) {
            let t = mt(*raw);
            assert_eq!(check_kn(p, &rules, t, 10240, 64), Ok(()));
            let err = check_kn(p, &rules, t, 10240 + 32, 64).unwrap_err();
            assert!(
                matches!(
                    err,
                    RuleViolation::TooLarge {
                        dim: Dim::K,
                        value: 10272,
                        max: 10240,
                        ..
                    }
                ),
                "{err:?}"
            );
        }
    }
}

#[test]
fn strict_rules_limit_k_and_n() {
    for (p, t) in accepted_pairs() {
        let rules = ShapeRules::strict(p);
        let (ka, na) = joint_align(p, t);
        let na = if t.a == ElemKind::F16 || t.b == ElemKind::F16 {
            na.max(32)
        } else {
            na
        };
        assert_eq!(check_kn(p, &rules, t, 10240, 4096), Ok(()), "{p:?} {t}");
        let k = 10240 + ka;
        let err = check_kn(p, &rules, t, k, na).unwrap_err();
        assert!(
            matches!(err, RuleViolation::TooLarge { dim: Dim::K, value, max: 10240, .. } if value == k),
            "{err:?}"
        );
        let msg = err.to_string();
        assert!(
            msg.starts_with(&format!(
                "K={k} exceeds the limit of 10240 on {}",
                chip_name(p)
            )),
            "{msg}"
        );
        let n = 4096 + na;
        let err = check_kn(p, &rules, t, ka, n).unwrap_err();
        assert!(
            matches!(err, RuleViolation::TooLarge { dim: Dim::N, value, max: 4096, .. } if value == n),
            "{err:?}"
        );
        let err = check_kn(p, &rules, t, 15360, 8192).unwrap_err();
        assert!(matches!(err, RuleViolation::TooLarge { .. }), "{err:?}");
    }
}

#[test]
fn strict_rules_align_f16_n_to_32_on_rk3588() {
    let p = Platform::Rk3588;
    let strict = ShapeRules::strict(p);
    let accepted = ShapeRules::accepted(p);
    for raw in [1, 4] {
        let t = mt(raw);
        for n in [16, 48, 80, 4080] {
            assert_eq!(check_kn(p, &accepted, t, 64, n), Ok(()), "{t} N={n}");
            let err = check_kn(p, &strict, t, 64, n).unwrap_err();
            assert_eq!(
                err,
                RuleViolation::Misaligned {
                    dim: Dim::N,
                    value: n,
                    align: 32,
                    kind: ElemKind::F16,
                    platform: p
                }
            );
            assert_eq!(
                err.to_string(),
                format!("N={n} is not a multiple of 32 required for f16 on RK3588")
            );
        }
        for n in [32, 64, 4096] {
            assert_eq!(check_kn(p, &strict, t, 64, n), Ok(()), "{t} N={n}");
        }
    }
    // Strict rules do not change the i8 / i4 alignment.
    assert_eq!(check_kn(p, &strict, mt(2), 32, 32), Ok(()));
    assert_eq!(check_kn(p, &strict, mt(10), 32, 64), Ok(()));
}

#[test]
fn core_masks() {
    let rk3588 = Platform::Rk3588;
    for m in [0, 1, 2, 4] {
        assert!(rk3588.accepts_core_mask(m), "RK3588 mask {m}");
    }
    for m in [3, 5, 6, 7, 8, 16, 0xffff, 0x10000, u32::MAX] {
        assert!(!rk3588.accepts_core_mask(m), "RK3588 mask {m}");
    }
    let rk3576 = Platform::Rk3576;
    for m in [0, 1, 2] {
        assert!(rk3576.accepts_core_mask(m), "RK3576 mask {m}");
    }
    for m in [3, 4, 7, 8, 0xffff, 0x10000] {
        assert!(!rk3576.accepts_core_mask(m), "RK3576 mask {m}");
    }
    assert!(rk3588.has_core_mask() && rk3576.has_core_mask());
    assert_eq!((rk3588.npu_cores(), rk3576.npu_cores()), (3, 2));
    for p in [Platform::Rk3562, Platform::Rk3566, Platform::Rk3568] {
        assert!(!p.has_core_mask(), "{p:?}");
        assert_eq!(p.npu_cores(), 1);
        for m in [0, 1, 2, 3, 4, 7, 0xffff, 0x10000] {
            assert!(!p.accepts_core_mask(m), "{p:?} mask {m}");
        }
    }
}

// ---------------------------------------------------------------- parse_info

fn info(t: u32, m: i32, k: i32, n: i32) -> rknn_sys::rknn_matmul_info {
    rknn_sys::rknn_matmul_info {
        M: m,
        K: k,
        N: n,
        type_: t,
        ..Default::default()
    }
}

fn parse(
    p: Platform,
    i: &rknn_sys::rknn_matmul_info,
) -> Result<rknn_chip::MatmulConfig, RuleViolation> {
    parse_info(p, &ShapeRules::accepted(p), i)
}

#[test]
fn parse_info_accepts_every_valid_configuration() {
    let mut rng = fastrand::Rng::with_seed(0x5eed_0001);
    for (p, t) in accepted_pairs() {
        let (ka, na) = joint_align(p, t);
        for b_layout in 0..=2i16 {
            for ac_layout in 0..=1i16 {
                for b_quant in 0..=5i16 {
                    let (m, k, n) = (
                        rng.usize(1..=64),
                        ka * rng.usize(1..=8),
                        na * rng.usize(1..=8),
                    );
                    let mut i = info(t.raw(), m as i32, k as i32, n as i32);
                    i.B_layout = b_layout;
                    i.AC_layout = ac_layout;
                    i.B_quant_type = b_quant;
                    i.AC_quant_type = 5 - b_quant;
                    i.group_size = 16; // divides every aligned K (K align >= 16)
                    let cfg = parse(p, &i).unwrap_or_else(|e| panic!("{p:?} {t} {i:?}: {e}"));
                    assert_eq!((cfg.t, cfg.m, cfg.k, cfg.n), (t, m, k, n));
                    assert_eq!(cfg.b_layout, Layout::from_raw(b_layout.into()).unwrap());
                    assert_eq!(cfg.ac_layout, Layout::from_raw(ac_layout.into()).unwrap());
                    assert_eq!(cfg.b_quant, QuantType::from_raw(b_quant.into()).unwrap());
                    assert_eq!(
                        cfg.ac_quant,
                        QuantType::from_raw((5 - b_quant).into()).unwrap()
                    );
                    let per_group = cfg.b_quant.granularity == QuantGranularity::PerGroup;
                    assert_eq!(cfg.group_size, if per_group { 16 } else { 0 });
                }
            }
        }
    }
}

#[test]
fn parse_info_rejects_bad_layouts() {
    let p = Platform::Rk3588;
    for v in [-1i16, 3, 4, 7, 100, i16::MAX, i16::MIN] {
        let mut i = info(2, 4, 64, 64);
        i.B_layout = v;
        assert_eq!(
            parse(p, &i),
            Err(RuleViolation::BadLayout {
                matrix: "B",
                value: v.into()
            }),
            "B_layout {v}"
        );
    }
    // TP_NORM is for B only.
    for v in [2i16, -1, 3, 100, i16::MIN] {
        let mut i = info(2, 4, 64, 64);
        i.AC_layout = v;
        let err = parse(p, &i).unwrap_err();
        assert_eq!(
            err,
            RuleViolation::BadLayout {
                matrix: "A/C",
                value: v.into()
            },
            "AC_layout {v}"
        );
        assert!(err.to_string().contains(&format!("layout {v}")), "{err}");
    }
}

#[test]
fn parse_info_rejects_bad_quant_types() {
    let p = Platform::Rk3588;
    for v in [-1i16, 6, 7, 100, i16::MAX, i16::MIN] {
        let mut i = info(2, 4, 64, 64);
        i.B_quant_type = v;
        assert_eq!(
            parse(p, &i),
            Err(RuleViolation::BadQuantType {
                matrix: "B",
                value: v.into()
            }),
            "B quant {v}"
        );
        let mut i = info(2, 4, 64, 64);
        i.AC_quant_type = v;
        assert_eq!(
            parse(p, &i),
            Err(RuleViolation::BadQuantType {
                matrix: "A/C",
                value: v.into()
            }),
            "AC quant {v}"
        );
    }
}

#[test]
fn parse_info_rejects_non_positive_dims() {
    let p = Platform::Rk3588;
    for v in [0, -1, -32, i32::MIN] {
        for (dim, i) in [
            (Dim::M, info(2, v, 64, 64)),
            (Dim::K, info(2, 4, v, 64)),
            (Dim::N, info(2, 4, 64, v)),
        ] {
            let err = parse(p, &i).unwrap_err();
            assert_eq!(
                err,
                RuleViolation::NotPositive {
                    dim,
                    value: v.into()
                },
                "{dim}={v}"
            );
            assert_eq!(err.to_string(), format!("{dim}={v} must be at least 1"));
        }
    }
}

#[test]
fn parse_info_checks_group_size_for_per_group_b() {
    let p = Platform::Rk3588;
    for quant in [4i16, 5] {
        for (k, g) in [
            (64, 0i16),
            (64, -32),
            (64, 48),
            (64, 128),
            (96, 64),
            (4096, 3),
            (64, i16::MIN),
        ] {
            let mut i = info(2, 4, k, 64);
            i.B_quant_type = quant;
            i.group_size = g;
            let err = parse(p, &i).unwrap_err();
            assert_eq!(
                err,
                RuleViolation::BadGroupSize {
                    group_size: g.into(),
                    k: k as usize
                },
                "K={k} G={g}"
            );
        }
        for (k, g) in [(64, 32i16), (64, 64), (64, 1), (96, 32), (4096, 128)] {
            let mut i = info(2, 4, k, 64);
            i.B_quant_type = quant;
            i.group_size = g;
            let cfg = parse(p, &i).unwrap();
            assert_eq!(cfg.group_size, g as usize);
        }
    }
    // Not per-group: group_size is ignored.
    for quant in 0..=3i16 {
        let mut i = info(2, 4, 64, 64);
        i.B_quant_type = quant;
        i.group_size = 48;
        assert_eq!(parse(p, &i).unwrap().group_size, 0);
    }
}

#[test]
fn parse_info_applies_type_and_shape_rules() {
    for raw in [0u32, 13, 14, 16] {
        assert_eq!(
            parse(Platform::Rk3588, &info(raw, 4, 64, 64)),
            Err(RuleViolation::UnknownType(raw))
        );
    }
    for p in Platform::ALL {
        for raw in common::DEFINED_TYPES {
            let r = parse(p, &info(raw, 4, 128, 128));
            if accepted_types(p).contains(&raw) {
                assert!(r.is_ok(), "{p:?} type {raw}: {r:?}");
            } else {
                assert_eq!(
                    r,
                    Err(RuleViolation::UnsupportedType {
                        platform: p,
                        t: mt(raw)
                    }),
                    "{p:?} type {raw}"
                );
            }
        }
    }
    let p = Platform::Rk3588;
    assert!(matches!(
        parse(p, &info(2, 4, 48, 64)),
        Err(RuleViolation::Misaligned { dim: Dim::K, .. })
    ));
    assert_eq!(
        parse(p, &info(2, 4, 64, 100)).unwrap_err().to_string(),
        "N=100 is not a multiple of 32 required for i8 on RK3588"
    );
    // M has no alignment ([hw] M = 1, 2, 5 work).
    for m in [1, 2, 5, 7, 33] {
        assert!(parse(p, &info(2, m, 64, 64)).is_ok(), "M={m}");
    }
    let strict = ShapeRules::strict(p);
    assert!(parse_info(p, &strict, &info(2, 1, 15360, 64)).is_err());
    assert!(parse(p, &info(2, 1, 15360, 8192)).is_ok());
}
