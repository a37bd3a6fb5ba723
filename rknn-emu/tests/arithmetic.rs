//! Property tests: the emulator against naive references written from the fact sheet's
//! formulas (§8), over random shapes, every accepted type of every chip, and every layout.
//! Integer types must match exactly; float types within a tolerance.

mod common;

use common::*;
use rknn_chip::{MatmulType, Platform, ShapeRules};
use rknn_sys::*;

/// Random aligned (K, N) for a type on a chip, K up to `max_k`.
fn shape(
    rng: &mut fastrand::Rng,
    p: Platform,
    t: MatmulType,
    max_k: usize,
) -> (usize, usize, usize) {
    let kind = t.align_kind();
    let (ka, mut na) = p.alignment(kind).unwrap();
    if kind == rknn_chip::ElemKind::F16 {
        na = ShapeRules::accepted(p).f16_n_align;
    }
    let m = if rng.bool() {
        rng.usize(1..=4)
    } else {
        rng.usize(1..=24)
    };
    let k = ka * rng.usize(1..=max_k / ka);
    let n = na * rng.usize(1..=(192 / na).max(1));
    (m, k, n)
}

fn ints(v: &Values) -> &[i32] {
    match v {
        Values::Int(x) => x,
        Values::Float(_) => panic!("ints expected"),
    }
}

fn floats(v: &Values) -> Vec<f64> {
    match v {
        Values::Int(x) => x.iter().map(|&x| f64::from(x)).collect(),
        Values::Float(x) => x.iter().map(|&x| f64::from(x)).collect(),
    }
}

/// Exact integer products, as i64: the reference for the integer types.
fn int_reference(a: &[i32], b: &[i32], m: usize, k: usize, n: usize) -> Vec<i64> {
    let mut c = vec![0i64; m * n];
    for i in 0..m {
        for j in 0..n {
            c[i * n + j] = (0..k)
                .map(|x| i64::from(a[i * k + x]) * i64::from(b[x * n + j]))
                .sum();
        }
    }
    c
}

#[test]
fn integer_types_are_bit_exact_on_every_chip_and_layout() {
    let mut rng = fastrand::Rng::with_seed(0x5eed);
    let mut runs = 0;
    for p in Platform::ALL {
        let emu = emulator(p);
        for &t in MatmulType::ALL
            .iter()
            .filter(|t| p.accepts(**t) && t.is_integer())
        {
            for layouts in ALL_LAYOUTS {
                for _ in 0..cases(40) {
                    let (m, k, n) = shape(&mut rng, p, t, 512);
                    let (ta, tb) = operand_types(t.raw());
                    let a = random_values(&mut rng, ta, m * k);
                    let b = random_values(&mut rng, tb, k * n);
                    let mut run = Run::new(&emu, t.raw(), m, k, n, layouts);
                    let out = match run.go(&a, &b) {
                        Err(RKNN_ERR_PARAM_INVALID)
                            if t == MatmulType::I4_I4_I16
                                && layouts.b != 1
                                && p == Platform::Rk3588 =>
                        {
                            continue;
                        }
                        r => r.unwrap_or_else(|rc| {
                            panic!("{t} {p} {layouts:?} M={m} K={k} N={n}: rc {rc}")
                        }),
                    };
                    let want = int_reference(ints(&a), ints(&b), m, k, n);
                    let got = ints(&out.c);
                    for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
                        let w = if t.c == rknn_chip::ElemKind::I16 {
                            w.clamp(-32768, 32767)
                        } else {
                            w
                        };
                        assert_eq!(
                            i64::from(g),
                            w,
                            "{t} on {p} {layouts:?} M={m} K={k} N={n} at {i}"
                        );
                    }
                    runs += 1;
                }
            }
        }
    }
    assert!(runs > 1000, "only {runs} runs");
}

#[test]
fn i8_matmul_is_exact_across_the_k_segment_boundary() {
    // K above RK3588's 8192-row segment: native B is stored as two blocks.
    let emu = emulator(Platform::Rk3588);
    let mut rng = fastrand::Rng::with_seed(3);
    for (m, k, n) in [
        (1, 8192 + 32, 32),
        (3, 15360, 64),
        (2, 8192, 32),
        (1, 16384 + 96, 32),
    ] {
        let a = random_values(&mut rng, RKNN_TENSOR_INT8, m * k);
        let b = random_values(&mut rng, RKNN_TENSOR_INT8, k * n);
        for layouts in [
            Layouts {
                ac_native: true,
                b: 1,
            },
            Layouts {
                ac_native: false,
                b: 0,
            },
        ] {
            let out = Run::new(&emu, RKNN_INT8_MM_INT8_TO_INT32, m, k, n, layouts)
                .go(&a, &b)
                .unwrap();
            let want = int_reference(ints(&a), ints(&b), m, k, n);
            assert!(
                ints(&out.c)
                    .iter()
                    .zip(&want)
                    .all(|(&g, &w)| i64::from(g) == w),
                "K={k}"
            );
        }
    }
}

#[test]
fn i4_overflow_saturates_by_default_and_wraps_when_asked() {
    let (m, k, n) = (1, 1024, 64);
    let a = Values::Int(vec![-8; m * k]);
    let b = Values::Int(vec![-8; k * n]);
    let native = Layouts {
        ac_native: false,
        b: 1,
    };
    let emu = emulator(Platform::Rk3588);
    let out = Run::new(&emu, RKNN_INT4_MM_INT4_TO_INT16, m, k, n, native)
        .go(&a, &b)
        .unwrap();
    assert!(
        ints(&out.c).iter().all(|&x| x == 32767),
        "64 * 1024 saturates"
    );
    let mut cfg = rknn_emu::EmuConfig::new(Platform::Rk3588);
    cfg.i16_overflow = rknn_emu::Overflow::Wrap;
    let emu = rknn_emu::Emulator::new(cfg).unwrap();
    let out = Run::new(&emu, RKNN_INT4_MM_INT4_TO_INT16, m, k, n, native)
        .go(&a, &b)
        .unwrap();
    assert!(
        ints(&out.c)
            .iter()
            .all(|&x| x == i32::from((64 * 1024) as i16)),
        "wraps"
    );
}

/// Tolerance for an f32-accumulated dot product of f16 inputs: a few f32 ulps of the sum of
/// magnitudes, plus half an f16 ulp of the result for f16 outputs.
fn close(got: f64, want: f64, magnitude: f64, f16_out: bool) -> bool {
    let mut tol = 1e-5 * magnitude + 1e-6;
    if f16_out {
        tol += want.abs() / 1024.0;
    }
    (got - want).abs() <= tol
}

#[test]
fn float_types_match_an_f64_reference_within_tolerance() {
    let mut rng = fastrand::Rng::with_seed(11);
    let mut runs = 0;
    for p in Platform::ALL {
        let emu = emulator(p);
        for &t in MatmulType::ALL
            .iter()
            .filter(|t| p.accepts(**t) && t.a == rknn_chip::ElemKind::F16)
        {
            for layouts in ALL_LAYOUTS {
                for _ in 0..cases(20) {
                    let (m, k, n) = shape(&mut rng, p, t, 384);
                    let (ta, tb) = operand_types(t.raw());
                    let a = random_values(&mut rng, ta, m * k);
                    let b = random_values(&mut rng, tb, k * n);
                    // Integer B is dequantised with per-channel scales and zero points.
                    let int_b = tb != RKNN_TENSOR_FLOAT16;
                    let scale: Vec<f32> = (0..n).map(|_| 0.01 + rng.f32() * 0.1).collect();
                    let zp: Vec<i32> = (0..n).map(|_| rng.i32(-3..=3)).collect();
                    let mut run = Run::new(&emu, t.raw(), m, k, n, layouts);
                    if int_b {
                        run.b_quant_type = RKNN_QUANT_TYPE_PER_CHANNEL_ASYM as i16;
                        run.quant.push(Quant {
                            name: "B",
                            scale: scale.clone(),
                            zp: zp.clone(),
                        });
                    }
                    let out = run
                        .go(&a, &b)
                        .unwrap_or_else(|rc| panic!("{t} {p} {layouts:?}: {rc}"));
                    let (af, bf) = (floats(&a), floats(&b));
                    let got = floats(&out.c);
                    for i in 0..m {
                        for j in 0..n {
                            let bj = |x: usize| {
                                if int_b {
                                    (bf[x * n + j] - f64::from(zp[j])) * f64::from(scale[j])
                                } else {
                                    bf[x * n + j]
                                }
                            };
                            let want: f64 = (0..k).map(|x| af[i * k + x] * bj(x)).sum();
                            let mag: f64 = (0..k).map(|x| (af[i * k + x] * bj(x)).abs()).sum();
                            let g = got[i * n + j];
                            assert!(
                                close(g, want, mag, t.c == rknn_chip::ElemKind::F16),
                                "{t} {p} {layouts:?} M={m} K={k} N={n} C[{i},{j}]={g} want {want}"
                            );
                        }
                    }
                    runs += 1;
                }
            }
        }
    }
    assert!(runs > 500, "only {runs} runs");
}

/// Powers of two make every scale product exact in f64, so the i8 → i8 and i8 → f32
/// references can be compared exactly.
fn pow2(rng: &mut fastrand::Rng, lo: i32, hi: i32) -> f32 {
    2f32.powi(rng.i32(lo..=hi))
}

#[test]
fn i8_to_f32_applies_per_layer_channel_and_group_scales_and_zero_points() {
    let emu = emulator(Platform::Rk3588);
    let mut rng = fastrand::Rng::with_seed(21);
    for case in 0..cases(150) {
        let (m, k, n) = (
            rng.usize(1..=6),
            32 * rng.usize(1..=8),
            32 * rng.usize(1..=3),
        );
        let a = random_values(&mut rng, RKNN_TENSOR_INT8, m * k);
        let b = random_values(&mut rng, RKNN_TENSOR_INT8, k * n);
        let granularity = case % 3; // layer, channel, group
        let group = [32, 64]
            .into_iter()
            .filter(|g| k % g == 0)
            .nth(rng.usize(..2))
            .unwrap_or(32);
        let len = [1, n, n * k / group][granularity];
        let sb: Vec<f32> = (0..len).map(|_| pow2(&mut rng, -8, -2)).collect();
        let zb: Vec<i32> = (0..len).map(|_| rng.i32(-4..=4)).collect();
        let (sa, za) = (pow2(&mut rng, -6, 0), rng.i32(-5..=5));
        let layouts = ALL_LAYOUTS[rng.usize(..ALL_LAYOUTS.len())];
        let mut run = Run::new(&emu, RKNN_INT8_MM_INT8_TO_FLOAT32, m, k, n, layouts);
        run.b_quant_type = [1, 3, 5][granularity];
        run.group_size = if granularity == 2 { group as i16 } else { 0 };
        run.quant.push(Quant {
            name: "A",
            scale: vec![sa],
            zp: vec![za],
        });
        run.quant.push(Quant {
            name: "B",
            scale: sb.clone(),
            zp: zb.clone(),
        });
        let out = run.go(&a, &b).unwrap();
        let (ai, bi) = (ints(&a), ints(&b));
        let got = floats(&out.c);
        for i in 0..m {
            for j in 0..n {
                let p = |x: usize| [0, j, (x / group) * n + j][granularity];
                let want: f64 = (0..k)
                    .map(|x| {
                        f64::from(sa)
                            * f64::from(sb[p(x)])
                            * f64::from(ai[i * k + x] - za)
                            * f64::from(bi[x * n + j] - zb[p(x)])
                    })
                    .sum();
                assert_eq!(
                    got[i * n + j],
                    f64::from(want as f32),
                    "case {case} C[{i},{j}]"
                );
            }
        }
    }
}

#[test]
fn i8_to_i8_requantises_with_rounding_half_away_from_zero_and_saturation() {
    let emu = emulator(Platform::Rk3588);
    let mut rng = fastrand::Rng::with_seed(31);
    for case in 0..cases(150) {
        let (m, k, n) = (
            rng.usize(1..=5),
            32 * rng.usize(1..=4),
            32 * rng.usize(1..=2),
        );
        let a = random_values(&mut rng, RKNN_TENSOR_INT8, m * k);
        let b = random_values(&mut rng, RKNN_TENSOR_INT8, k * n);
        let (sa, sb, sc) = (
            pow2(&mut rng, -4, 0),
            pow2(&mut rng, -4, 0),
            pow2(&mut rng, 4, 12),
        );
        let zc = rng.i32(-10..=10);
        let mut run = Run::new(
            &emu,
            RKNN_INT8_MM_INT8_TO_INT8,
            m,
            k,
            n,
            ALL_LAYOUTS[case % 6],
        );
        run.quant.push(Quant {
            name: "A",
            scale: vec![sa],
            zp: vec![],
        });
        run.quant.push(Quant {
            name: "B",
            scale: vec![sb],
            zp: vec![],
        });
        run.quant.push(Quant {
            name: "C",
            scale: vec![sc],
            zp: vec![zc],
        });
        let out = run.go(&a, &b).unwrap();
        let sums = int_reference(ints(&a), ints(&b), m, k, n);
        for (i, (&g, &s)) in ints(&out.c).iter().zip(&sums).enumerate() {
            let real = s as f64 * f64::from(sa) * f64::from(sb) / f64::from(sc);
            // f64::round is half away from zero.
            let want = (real.round() + f64::from(zc)).clamp(-128.0, 127.0) as i32;
            assert_eq!(g, want, "case {case} at {i}: sum {s}");
        }
    }
}
