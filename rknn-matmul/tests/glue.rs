//! The engine's host glue kernels: the run-time selected backend (AVX2 on x86-64, NEON on
//! aarch64) and the scalar one must both equal, bit for bit, an independent reference written
//! here from the documented formulas, over random shapes and adversarial values.

use half::f16;
use rknn_matmul::engine::glue;

// ---------------------------------------------------------------------------------------------
// References, straight from the formulas (deliberately naive and independent of the crate).
// ---------------------------------------------------------------------------------------------

fn ref_quantize(x: &[f32], m: usize, k: usize, k_pad: usize) -> (Vec<i8>, Vec<f32>) {
    let mut q = vec![0i8; m * k_pad];
    let mut scales = vec![0f32; m];
    for r in 0..m {
        let row = &x[r * k..(r + 1) * k];
        let mut amax = 0f32;
        for &v in row {
            if !v.is_nan() && v.abs() > amax {
                amax = v.abs();
            }
        }
        if amax == 0.0 {
            continue;
        }
        scales[r] = amax / 127.0;
        let inv = 127.0f32 / amax;
        for c in 0..k {
            let y = row[c] * inv;
            q[r * k_pad + c] = if y.is_nan() {
                0
            } else {
                let t = y.round_ties_even();
                if t >= 127.0 {
                    127
                } else if t <= -127.0 {
                    -127
                } else {
                    t as i8
                }
            };
        }
    }
    (q, scales)
}

fn ref_pack_a<T: Copy>(
    src: &[T],
    m: usize,
    ld: usize,
    k0: usize,
    kseg: usize,
    sk: usize,
    dst: &mut [T],
) {
    for r in 0..m {
        for c in 0..kseg {
            dst[((c / sk) * m + r) * sk + c % sk] = src[r * ld + k0 + c];
        }
    }
}

fn native_c_index(m: usize, sn: usize, r: usize, j: usize) -> usize {
    ((j / sn) * m + r) * sn + j % sn
}

/// IEEE binary32 -> binary16, round to nearest even, written out bit by bit (NaN: quiet bit
/// set, top 10 payload bits kept).
fn ref_f16_bits(x: f32) -> u16 {
    fn rne_shift(v: u32, s: u32) -> u32 {
        if s == 0 {
            return v;
        }
        if s > 31 {
            return 0;
        }
        let (q, rem, half) = (v >> s, v & ((1 << s) - 1), 1u32 << (s - 1));
        if rem > half || (rem == half && q & 1 == 1) {
            q + 1
        } else {
            q
        }
    }
    let b = x.to_bits();
    let sign = ((b >> 16) & 0x8000) as u16;
    let exp = ((b >> 23) & 0xFF) as i32;
    let man = b & 0x7F_FFFF;
    if exp == 0xFF {
        return if man == 0 {
            sign | 0x7C00
        } else {
            sign | 0x7E00 | (man >> 13) as u16
        };
    }
    if exp == 0 {
        return sign; // f32 subnormals are far below half of the smallest f16 subnormal
    }
    let e = exp - 127 + 15;
    if e >= 31 {
        return sign | 0x7C00;
    }
    if e <= 0 {
        // Subnormal f16: units of 2^-24.
        let shift = (126 - exp) as u32;
        return sign | rne_shift(man | 0x80_0000, shift) as u16;
    }
    // The carry of a rounded-up mantissa moves into the exponent (up to inf): still correct.
    sign | (((e as u32) << 10) + rne_shift(man, 13)) as u16
}

// ---------------------------------------------------------------------------------------------
// Value generators.
// ---------------------------------------------------------------------------------------------

fn edge_value(rng: &mut fastrand::Rng) -> f32 {
    match rng.u32(0..16) {
        0 => f32::NAN,
        1 => f32::from_bits(0x7F80_0000 | rng.u32(1..0x40_0000)), // signalling NaN
        2 => f32::from_bits(0xFF80_0000 | rng.u32(1..0x80_0000)), // negative NaN, any payload
        3 => f32::INFINITY,
        4 => f32::NEG_INFINITY,
        5 => -0.0,
        6 => 0.0,
        7 => f32::MAX,
        8 => -f32::MAX,
        9 => f32::MIN_POSITIVE,
        10 => f32::from_bits(rng.u32(1..0x80_0000)), // subnormal
        11 => f32::from_bits(rng.u32(..)),           // anything
        12 => (rng.f32() - 0.5) * 1e30,
        13 => (rng.f32() - 0.5) * 1e-30,
        _ => (rng.f32() - 0.5) * 8.0,
    }
}

/// One row of `k` values of a random kind (see the match).
fn quant_row(rng: &mut fastrand::Rng, k: usize) -> Vec<f32> {
    let scale = 2f32.powi(rng.i32(-20..20));
    let mut row: Vec<f32> = match rng.u32(0..9) {
        // Plain values.
        0 | 1 => (0..k).map(|_| (rng.f32() - 0.5) * scale).collect(),
        // Ties: amax = 127 * 2^e makes inv = 2^-e exactly, so (i + 0.5) * 2^e lands on .5.
        2 => (0..k)
            .map(|_| (rng.i32(-127..127) as f32 + 0.5) * scale)
            .collect(),
        // All zero, with signs.
        3 => (0..k)
            .map(|_| if rng.bool() { 0.0 } else { -0.0 })
            .collect(),
        // Sprinkled special values.
        4 | 5 => (0..k)
            .map(|_| {
                if rng.u32(0..8) == 0 {
                    edge_value(rng)
                } else {
                    (rng.f32() - 0.5) * scale
                }
            })
            .collect(),
        // Only special values.
        6 => (0..k).map(|_| edge_value(rng)).collect(),
        // Subnormal or near-subnormal amax: 127 / amax overflows to inf.
        7 => (0..k)
            .map(|_| f32::from_bits(rng.u32(0..0x0300_0000)) * if rng.bool() { 1.0 } else { -1.0 })
            .collect(),
        // Huge values.
        _ => (0..k).map(|_| (rng.f32() - 0.5) * f32::MAX).collect(),
    };
    if k > 0 && rng.bool() {
        // The amax itself (-> +-127), at both signs.
        let a = 127.0 * scale;
        let i = rng.usize(0..k);
        row[i] = a;
        let j = rng.usize(0..k);
        row[j] = -a;
    }
    row
}

/// Equal bit patterns, except that any NaN equals any NaN: which operand's payload an f32
/// operation on two NaNs returns is unspecified in Rust (LLVM may commute the operands), so
/// the kernels promise "NaN" there, not a payload. Conversions (f16) are compared exactly.
fn assert_bits_eq(what: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan()),
            "{what}[{i}]: got {g:e} ({:#010x}), want {w:e} ({:#010x})",
            g.to_bits(),
            w.to_bits()
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Tests.
// ---------------------------------------------------------------------------------------------

#[test]
fn backend_is_the_best_available_unless_forced() {
    let name = glue::backend();
    assert!(["avx2", "neon", "scalar"].contains(&name), "{name}");
    let forced = ["RKNN_KERNEL_GLUE", "RKNN_KERNEL"]
        .iter()
        .any(|v| std::env::var(v).is_ok_and(|v| !v.is_empty() && v != "auto"));
    assert_eq!(glue::kernel_choice().selected, name);
    if !forced {
        #[cfg(target_arch = "x86_64")]
        if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("f16c") {
            assert_eq!(name, "avx2");
        }
        #[cfg(target_arch = "aarch64")]
        assert_eq!(name, "neon");
    }
    eprintln!("glue backend under test: {name}");
}

#[test]
fn reference_f16_conversion_matches_half() {
    let mut rng = fastrand::Rng::with_seed(7);
    let check = |x: f32| {
        assert_eq!(
            ref_f16_bits(x),
            f16::from_f32(x).to_bits(),
            "{x:e} ({:#010x})",
            x.to_bits()
        );
    };
    for _ in 0..200_000 {
        check(f32::from_bits(rng.u32(..)));
    }
    // Every f16 value, and the ties halfway between neighbours.
    for h in 0..=u16::MAX {
        let v = f16::from_bits(h).to_f32();
        check(v);
        let next = f16::from_bits(h.wrapping_add(1)).to_f32();
        if v.is_finite() && next.is_finite() && (h & 0x7FFF) != 0x7BFF {
            check((v + next) / 2.0);
        }
    }
}

#[test]
fn quantize_rows_matches_reference_on_random_shapes() {
    let mut rng = fastrand::Rng::with_seed(1);
    for case in 0..3000 {
        let m = rng.usize(1..41);
        // Mostly multiples of 16 (the engine's), sometimes anything, to reach every tail.
        let k = if rng.u32(0..4) == 0 {
            rng.usize(0..100)
        } else {
            16 * rng.usize(0..20)
        };
        let k_pad = k + 16 * rng.usize(0..3) + if rng.bool() { 0 } else { rng.usize(0..5) };
        let x: Vec<f32> = (0..m).flat_map(|_| quant_row(&mut rng, k)).collect();
        let (want_q, want_s) = ref_quantize(&x, m, k, k_pad);
        type Quantize = fn(&[f32], usize, usize, usize, &mut [i8], &mut [f32]);
        let impls: [(&str, Quantize); 2] = [
            ("selected", glue::quantize_rows),
            ("scalar", glue::scalar::quantize_rows),
        ];
        for (name, f) in impls {
            // Longer slices than needed, prefilled: the surplus must stay untouched.
            let mut q = vec![99i8; m * k_pad + 3];
            let mut s = vec![7.0f32; m + 2];
            f(&x, m, k, k_pad, &mut q, &mut s);
            assert_eq!(&q[m * k_pad..], &[99; 3], "{name}: wrote past q");
            assert_eq!(&s[m..], &[7.0; 2], "{name}: wrote past scales");
            if q[..m * k_pad] != want_q[..] {
                let i = (0..m * k_pad).find(|&i| q[i] != want_q[i]).unwrap();
                let (r, c) = (i / k_pad, i % k_pad);
                panic!(
                    "case {case} {name} m={m} k={k} k_pad={k_pad}: q[{r}, {c}] = {}, want {} \
                     (x = {:e}, scale {:e})",
                    q[i],
                    want_q[i],
                    if c < k { x[r * k + c] } else { 0.0 },
                    want_s[r]
                );
            }
            assert_bits_eq(&format!("case {case} {name} scales"), &s[..m], &want_s);
        }
    }
}

#[test]
fn quantize_rounds_ties_to_even_and_maps_amax_to_127() {
    let x = [
        127.0,
        2.5,
        3.5,
        -2.5,
        -3.5,
        0.5,
        -0.5,
        1.5,
        126.5,
        -126.5,
        -127.0,
        -0.0,
        f32::NAN,
        0.49999997,
        100.0,
        0.0,
    ];
    let want: [i8; 16] = [127, 2, 4, -2, -4, 0, 0, 2, 126, -126, -127, 0, 0, 0, 100, 0];
    for f in [glue::quantize_rows, glue::scalar::quantize_rows] {
        let (mut q, mut s) = ([0i8; 16], [0f32; 1]);
        f(&x, 1, 16, 16, &mut q, &mut s);
        assert_eq!(q, want);
        assert_eq!(s[0], 1.0);
    }
}

/// Can `x * (127 / amax)` round past 127 in f32 for `|x| <= amax`? With `inv = fl(127 / amax)`
/// within a factor `1 + 2^-24` of the exact value (when it is finite and normal), the product
/// is at most `127 * (1 + 2^-24)^2`, so it rounds to at most the next float after 127
/// (127.0000076): it does exceed 127.0, but never reaches 127.5, and rounds to 127. This
/// checks that over a wide random sample, and finds that the "exceeds 127.0" case is real.
#[test]
fn product_with_the_reciprocal_never_rounds_past_127_for_a_normal_amax() {
    let mut rng = fastrand::Rng::with_seed(3);
    let mut above_127 = 0;
    for _ in 0..1_000_000 {
        // Any positive normal f32 whose reciprocal is finite.
        let amax = f32::from_bits(rng.u32(0x0300_0000..0x7F80_0000));
        let inv = 127.0f32 / amax;
        assert!(inv.is_finite());
        let y = amax * inv;
        assert!(y < 127.5, "amax {amax:e}: {y}");
        above_127 += usize::from(y > 127.0);
    }
    assert!(above_127 > 0, "expected some products just above 127.0");

    // Such a row quantises to exactly 127 on every backend.
    let amax = (0x0300_0000..)
        .map(f32::from_bits)
        .find(|&a| a * (127.0f32 / a) > 127.0)
        .unwrap();
    for f in [glue::quantize_rows, glue::scalar::quantize_rows] {
        let x = [amax, -amax, amax, 0.0];
        let (mut q, mut s) = ([0i8; 4], [0f32; 1]);
        f(&x, 1, 4, 4, &mut q, &mut s);
        assert_eq!(q, [127, -127, 127, 0], "amax {amax:e}");
    }
}

/// The clamp's real work: a subnormal (or tiny) amax makes `127 / amax` overflow to inf, so
/// every nonzero product is +-inf and must saturate to +-127, never wrap to -128.
#[test]
fn quantize_saturates_when_the_reciprocal_overflows() {
    let tiny = [
        f32::from_bits(1),           // smallest subnormal
        f32::from_bits(0x0040_0000), // a mid subnormal
        3.0e-37,                     // normal, but 127 / 3e-37 > f32::MAX
    ];
    for amax in tiny {
        assert!((127.0f32 / amax).is_infinite());
        let x = [
            amax,
            -amax,
            amax / 2.0,
            -amax / 2.0,
            0.0,
            -0.0,
            f32::NAN,
            amax,
        ];
        for f in [glue::quantize_rows, glue::scalar::quantize_rows] {
            let (mut q, mut s) = ([5i8; 8], [0f32; 1]);
            f(&x, 1, 8, 8, &mut q, &mut s);
            let half = if amax / 2.0 == 0.0 { 0 } else { 127 };
            assert_eq!(q, [127, -127, half, -half, 0, 0, 0, 127], "amax {amax:e}");
            assert_eq!(s[0].to_bits(), (amax / 127.0).to_bits());
        }
    }
    // A 32-element row too, so the SIMD backends' vector loop (not just the tail) sees it.
    let x: Vec<f32> = (0..64)
        .map(|i| f32::from_bits(1 + i as u32) * if i % 2 == 0 { 1.0 } else { -1.0 })
        .collect();
    let (want, _) = ref_quantize(&x, 1, 64, 64);
    assert!(want.iter().all(|&v| v == 127 || v == -127));
    for f in [glue::quantize_rows, glue::scalar::quantize_rows] {
        let (mut q, mut s) = ([0i8; 64], [0f32; 1]);
        f(&x, 1, 64, 64, &mut q, &mut s);
        assert_eq!(q.to_vec(), want);
    }
}

#[test]
fn quantize_rows_of_zeros_infinities_and_nans() {
    let k = 40;
    let rows: [Vec<f32>; 4] = [
        vec![-0.0; k],
        vec![f32::NAN; k],
        (0..k)
            .map(|i| if i == 3 { f32::INFINITY } else { i as f32 })
            .collect(),
        (0..k)
            .map(|i| {
                if i % 3 == 0 {
                    f32::NAN
                } else {
                    i as f32 - 20.0
                }
            })
            .collect(),
    ];
    let x: Vec<f32> = rows.concat();
    let (want_q, want_s) = ref_quantize(&x, 4, k, 48);
    assert_eq!(want_s[..2], [0.0, 0.0]);
    assert_eq!(want_s[2], f32::INFINITY);
    assert_eq!(want_s[3], 19.0 / 127.0); // i = 0 (-20) is a NaN
    for f in [glue::quantize_rows, glue::scalar::quantize_rows] {
        let (mut q, mut s) = (vec![1i8; 4 * 48], vec![1f32; 4]);
        f(&x, 4, k, 48, &mut q, &mut s);
        assert_eq!(q, want_q);
        assert_bits_eq("scales", &s, &want_s);
        // amax = inf: inv = 0, so finite values give 0 and inf * 0 = NaN gives 0.
        assert!(q[2 * 48..3 * 48].iter().all(|&v| v == 0));
    }
}

#[test]
fn pack_a_native_i8_matches_reference() {
    let mut rng = fastrand::Rng::with_seed(2);
    for case in 0..3000 {
        let m = rng.usize(1..41);
        let sk = [16, 16, 16, 8, 32, 4, 12][rng.usize(0..7)];
        let k_pad = sk * rng.usize(0..24) + if rng.bool() { 0 } else { rng.usize(0..sk) };
        let kseg = sk * rng.usize(0..=k_pad / sk);
        let k0 = rng.usize(0..=k_pad - kseg);
        let q: Vec<i8> = (0..m * k_pad).map(|_| rng.i8(..)).collect();
        let mut want = vec![-99i8; m * kseg + 5];
        ref_pack_a(&q, m, k_pad, k0, kseg, sk, &mut want);
        type Pack = fn(&[i8], usize, usize, usize, usize, usize, &mut [i8]);
        let impls: [(&str, Pack); 2] = [
            ("selected", glue::pack_a_native_i8),
            ("scalar", glue::scalar::pack_a_native_i8),
        ];
        for (name, f) in impls {
            let mut dst = vec![-99i8; m * kseg + 5];
            f(&q, m, k_pad, k0, kseg, sk, &mut dst);
            assert_eq!(
                dst, want,
                "case {case} {name}: m={m} k_pad={k_pad} k0={k0} kseg={kseg} sk={sk}"
            );
        }
    }
}

#[test]
fn pack_a_native_f16_matches_reference() {
    let mut rng = fastrand::Rng::with_seed(4);
    for case in 0..2000 {
        let m = rng.usize(1..41);
        let sk = [8, 8, 8, 16, 4, 12][rng.usize(0..6)];
        // k anything: the segment may run past k into the zero padding.
        let k = if rng.bool() {
            16 * rng.usize(0..12)
        } else {
            rng.usize(0..150)
        };
        let kseg = sk * rng.usize(0..(k + 2 * sk) / sk + 1);
        let k0 = rng.usize(0..=k + sk);
        let x: Vec<f32> = (0..m * k)
            .map(|_| match rng.u32(0..4) {
                0 => edge_value(&mut rng),
                1 => f32::from_bits(rng.u32(..)),
                // Around the f16 range: overflow, subnormals, ties.
                2 => {
                    f16::from_bits(rng.u16(..)).to_f32()
                        * (1.0 + (rng.i32(-2..3) as f32) * 2f32.powi(-11))
                }
                _ => (rng.f32() - 0.5) * 100.0,
            })
            .collect();
        let padded: Vec<u16> = (0..m)
            .flat_map(|r| {
                let x = &x;
                (0..k0 + kseg).map(move |c| if c < k { ref_f16_bits(x[r * k + c]) } else { 0 })
            })
            .collect();
        let mut want = vec![0xABCDu16; m * kseg + 3];
        ref_pack_a(&padded, m, k0 + kseg, k0, kseg, sk, &mut want);
        type Pack = fn(&[f32], usize, usize, usize, usize, usize, &mut [f16]);
        let impls: [(&str, Pack); 2] = [
            ("selected", glue::pack_a_native_f16),
            ("scalar", glue::scalar::pack_a_native_f16),
        ];
        for (name, f) in impls {
            let mut dst = vec![f16::from_bits(0xABCD); m * kseg + 3];
            f(&x, m, k, k0, kseg, sk, &mut dst);
            let got: Vec<u16> = dst.iter().map(|h| h.to_bits()).collect();
            if got != want {
                let i = (0..got.len()).find(|&i| got[i] != want[i]).unwrap();
                panic!(
                    "case {case} {name}: m={m} k={k} k0={k0} kseg={kseg} sk={sk}: dst[{i}] = \
                     {:#06x}, want {:#06x}",
                    got[i], want[i]
                );
            }
        }
    }
}

#[test]
fn accumulate_c_native_i32_matches_reference() {
    let mut rng = fastrand::Rng::with_seed(5);
    for case in 0..3000 {
        let m = rng.usize(1..41);
        let sn = [4, 4, 4, 8, 16, 3][rng.usize(0..6)];
        let n = if rng.bool() {
            sn * rng.usize(0..40)
        } else {
            rng.usize(0..150)
        };
        let first = rng.bool();
        let big = rng.bool();
        let mut val = || {
            if big {
                rng.i32(..)
            } else {
                rng.i32(-1000..1000)
            }
        };
        let c: Vec<i32> = (0..n.div_ceil(sn) * m * sn).map(|_| val()).collect();
        let acc0: Vec<i32> = (0..m * n + 4).map(|_| val()).collect();
        let mut want = acc0.clone();
        for r in 0..m {
            for j in 0..n {
                let v = c[native_c_index(m, sn, r, j)];
                let a = &mut want[r * n + j];
                *a = if first { v } else { a.wrapping_add(v) };
            }
        }
        type Acc = fn(&[i32], usize, usize, usize, &mut [i32], bool);
        let impls: [(&str, Acc); 2] = [
            ("selected", glue::accumulate_c_native_i32),
            ("scalar", glue::scalar::accumulate_c_native_i32),
        ];
        for (name, f) in impls {
            let mut acc = acc0.clone();
            f(&c, m, n, sn, &mut acc, first);
            assert_eq!(
                acc, want,
                "case {case} {name}: m={m} n={n} sn={sn} first={first}"
            );
        }
    }
}

#[test]
fn accumulate_c_native_f32_matches_reference() {
    let mut rng = fastrand::Rng::with_seed(6);
    for case in 0..3000 {
        let m = rng.usize(1..41);
        let sn = [4, 4, 4, 8, 16, 3][rng.usize(0..6)];
        let n = if rng.bool() {
            sn * rng.usize(0..40)
        } else {
            rng.usize(0..150)
        };
        let n0 = rng.usize(0..20);
        let ld = n0 + n + rng.usize(0..10);
        let first = rng.bool();
        let mut val = || {
            if rng.u32(0..10) == 0 {
                edge_value(&mut rng)
            } else {
                (rng.f32() - 0.5) * 1000.0
            }
        };
        let c: Vec<f32> = (0..n.div_ceil(sn) * m * sn).map(|_| val()).collect();
        let out0: Vec<f32> = (0..m * ld + 3).map(|_| val()).collect();
        let mut want = out0.clone();
        for r in 0..m {
            for j in 0..n {
                let v = c[native_c_index(m, sn, r, j)];
                let o = &mut want[r * ld + n0 + j];
                *o = if first { v } else { *o + v };
            }
        }
        type Acc = fn(&[f32], usize, usize, usize, &mut [f32], usize, usize, bool);
        let impls: [(&str, Acc); 2] = [
            ("selected", glue::accumulate_c_native_f32),
            ("scalar", glue::scalar::accumulate_c_native_f32),
        ];
        for (name, f) in impls {
            let mut out = out0.clone();
            f(&c, m, n, sn, &mut out, ld, n0, first);
            assert_bits_eq(
                &format!("case {case} {name} m={m} n={n} sn={sn} ld={ld} n0={n0} first={first}"),
                &out,
                &want,
            );
        }
    }
}

#[test]
fn scale_out_matches_reference() {
    let mut rng = fastrand::Rng::with_seed(8);
    for case in 0..3000 {
        let m = rng.usize(1..41);
        let n = if rng.bool() {
            4 * rng.usize(0..40)
        } else {
            rng.usize(0..150)
        };
        let n0 = rng.usize(0..20);
        let ld = n0 + n + rng.usize(0..10);
        let big = rng.bool();
        let acc: Vec<i32> = (0..m * n)
            .map(|_| {
                if big {
                    rng.i32(..)
                } else {
                    rng.i32(-100_000..100_000)
                }
            })
            .collect();
        let mut scale = || {
            if rng.u32(0..20) == 0 {
                edge_value(&mut rng)
            } else {
                rng.f32() * 0.01
            }
        };
        let rs: Vec<f32> = (0..m).map(|_| scale()).collect();
        let cs: Vec<f32> = (0..n).map(|_| scale()).collect();
        let out0: Vec<f32> = (0..m * ld + 3).map(|i| i as f32).collect();
        let mut want = out0.clone();
        for r in 0..m {
            for j in 0..n {
                want[r * ld + n0 + j] = (acc[r * n + j] as f32 * rs[r]) * cs[j];
            }
        }
        type Scale = fn(&[i32], usize, usize, &[f32], &[f32], &mut [f32], usize, usize);
        let impls: [(&str, Scale); 2] = [
            ("selected", glue::scale_out),
            ("scalar", glue::scalar::scale_out),
        ];
        for (name, f) in impls {
            let mut out = out0.clone();
            f(&acc, m, n, &rs, &cs, &mut out, ld, n0);
            assert_bits_eq(
                &format!("case {case} {name} m={m} n={n} ld={ld} n0={n0}"),
                &out,
                &want,
            );
        }
    }
}

/// The sizes the engine really uses (decode and a prefill tile), once, through every kernel.
#[test]
fn engine_sizes_match_scalar() {
    let mut rng = fastrand::Rng::with_seed(9);
    for (m, k, n) in [(1, 4096, 4096), (1, 15360, 256), (64, 4096, 1024)] {
        let x: Vec<f32> = (0..m * k).map(|_| (rng.f32() - 0.5) * 6.0).collect();
        let (mut q1, mut s1) = (vec![0i8; m * k], vec![0f32; m]);
        let (mut q2, mut s2) = (q1.clone(), s1.clone());
        glue::quantize_rows(&x, m, k, k, &mut q1, &mut s1);
        glue::scalar::quantize_rows(&x, m, k, k, &mut q2, &mut s2);
        assert_eq!(q1, q2);
        assert_bits_eq("scales", &s1, &s2);

        let (k0, kseg) = (k / 4, k / 2);
        let (mut p1, mut p2) = (vec![0i8; m * kseg], vec![0i8; m * kseg]);
        glue::pack_a_native_i8(&q1, m, k, k0, kseg, 16, &mut p1);
        glue::scalar::pack_a_native_i8(&q1, m, k, k0, kseg, 16, &mut p2);
        assert_eq!(p1, p2);

        let (mut h1, mut h2) = (vec![f16::ZERO; m * kseg], vec![f16::ZERO; m * kseg]);
        glue::pack_a_native_f16(&x, m, k, k0, kseg, 8, &mut h1);
        glue::scalar::pack_a_native_f16(&x, m, k, k0, kseg, 8, &mut h2);
        assert_eq!(h1, h2);

        let c: Vec<i32> = (0..m * n).map(|_| rng.i32(..)).collect();
        let (mut a1, mut a2) = (vec![0i32; m * n], vec![0i32; m * n]);
        for first in [true, false] {
            glue::accumulate_c_native_i32(&c, m, n, 4, &mut a1, first);
            glue::scalar::accumulate_c_native_i32(&c, m, n, 4, &mut a2, first);
            assert_eq!(a1, a2);
        }
        let cs: Vec<f32> = (0..n).map(|_| rng.f32()).collect();
        let (mut o1, mut o2) = (vec![0f32; m * n], vec![0f32; m * n]);
        glue::scale_out(&a1, m, n, &s1, &cs, &mut o1, n, 0);
        glue::scalar::scale_out(&a1, m, n, &s1, &cs, &mut o2, n, 0);
        assert_bits_eq("scale_out", &o1, &o2);

        let cf: Vec<f32> = (0..m * n).map(|_| rng.f32() - 0.5).collect();
        for first in [true, false] {
            glue::accumulate_c_native_f32(&cf, m, n, 4, &mut o1, n, 0, first);
            glue::scalar::accumulate_c_native_f32(&cf, m, n, 4, &mut o2, n, 0, first);
            assert_bits_eq("accumulate_c_native_f32", &o1, &o2);
        }
    }
}

#[test]
#[should_panic(expected = "`q` holds")]
fn quantize_rejects_a_short_output() {
    let mut q = [0i8; 31];
    glue::quantize_rows(&[1.0; 32], 2, 16, 16, &mut q, &mut [0.0; 2]);
}

#[test]
#[should_panic(expected = "not a multiple of sk")]
fn pack_rejects_a_ragged_segment() {
    let mut dst = [0i8; 32];
    glue::pack_a_native_i8(&[0; 32], 1, 32, 0, 20, 16, &mut dst);
}

#[test]
#[should_panic(expected = "exceed k_pad")]
fn pack_rejects_columns_past_k_pad() {
    let mut dst = [0i8; 32];
    glue::pack_a_native_i8(&[0; 32], 1, 32, 16, 32, 16, &mut dst);
}

#[test]
#[should_panic(expected = "`c` holds")]
fn accumulate_rejects_a_short_native_c() {
    // n = 5 needs two blocks of 4 per row.
    let mut acc = [0i32; 5];
    glue::accumulate_c_native_i32(&[0; 5], 1, 5, 4, &mut acc, true);
}

#[test]
#[should_panic(expected = "ld = ")]
fn scale_out_rejects_overlapping_rows() {
    let mut out = [0f32; 64];
    glue::scale_out(&[0; 16], 2, 8, &[1.0; 2], &[1.0; 8], &mut out, 8, 4);
}
