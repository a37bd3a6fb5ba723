//! Every matrix-kernel backend available on this CPU against an independent naive reference:
//! the i8 kernel must be bit-exact (i64 reference, checked to fit in i32), the f32 kernel
//! within the rounding-error bound of f32 accumulation of an f64 reference.

use rknn_emu::kernels::{
    BackendUnavailable, KernelBackend, available_backends, gemm_f32, gemm_f32_with, gemm_i8_i32,
    gemm_i8_i32_with, kernel_choice, selected_backend,
};

/// Sentinel written into C before a call, and into the guard elements after it.
const SENTINEL_I32: i32 = 0x5A5A_5A5A;
const SENTINEL_F32: f32 = -12345.678;

/// How a matrix is filled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fill {
    /// Uniform over the whole i8 range.
    Uniform,
    /// Every element -128.
    AllMin,
    /// Every element 127.
    AllMax,
    /// Random picks of -128, 127, -1, 0 and 1.
    Extremes,
}

const FILLS: [Fill; 4] = [Fill::Uniform, Fill::AllMin, Fill::AllMax, Fill::Extremes];

fn fill_i8(rng: &mut fastrand::Rng, len: usize, fill: Fill) -> Vec<i8> {
    (0..len)
        .map(|_| match fill {
            Fill::Uniform => rng.i8(..),
            Fill::AllMin => i8::MIN,
            Fill::AllMax => i8::MAX,
            Fill::Extremes => [i8::MIN, i8::MAX, -1, 0, 1][rng.usize(..5)],
        })
        .collect()
}

/// The naive reference: i64 sums, then checked to fit in i32.
fn reference_i8(a: &[i8], bt: &[i8], m: usize, n: usize, k: usize) -> Vec<i64> {
    let mut c = vec![0i64; m * n];
    for i in 0..m {
        for j in 0..n {
            let mut s = 0i64;
            for p in 0..k {
                s += i64::from(a[i * k + p]) * i64::from(bt[j * k + p]);
            }
            c[i * n + j] = s;
        }
    }
    c
}

fn expect_fits(reference: &[i64]) -> Vec<i32> {
    reference
        .iter()
        .map(|&x| i32::try_from(x).expect("reference result must fit in i32"))
        .collect()
}

/// Runs `backend` (or the public default entry point for `None`) on copies of the inputs with
/// `extra` trailing junk elements, and returns C; asserts the guard elements after C are
/// untouched.
#[allow(clippy::too_many_arguments)]
fn run_i8(
    backend: Option<KernelBackend>,
    a: &[i8],
    bt: &[i8],
    m: usize,
    n: usize,
    k: usize,
    extra: usize,
) -> Vec<i32> {
    let mut a = a.to_vec();
    let mut bt = bt.to_vec();
    a.extend(std::iter::repeat_n(99, extra));
    bt.extend(std::iter::repeat_n(-99, extra));
    let mut c = vec![SENTINEL_I32; m * n + extra];
    match backend {
        Some(b) => gemm_i8_i32_with(b, &a, &bt, &mut c, m, n, k).unwrap(),
        None => gemm_i8_i32(&a, &bt, &mut c, m, n, k),
    }
    assert!(
        c[m * n..].iter().all(|&x| x == SENTINEL_I32),
        "{backend:?} wrote past C ({m}x{n}x{k})"
    );
    c.truncate(m * n);
    c
}

/// The backends to check plus `None` for the default entry point.
fn all_runs() -> Vec<Option<KernelBackend>> {
    available_backends()
        .into_iter()
        .map(Some)
        .chain([None])
        .collect()
}

/// Compares every backend with `expected` for one problem; returns the number of mismatching
/// elements (and prints the first few).
fn check_i8_all(a: &[i8], bt: &[i8], m: usize, n: usize, k: usize, expected: &[i32]) -> usize {
    let mut bad = 0;
    for (idx, backend) in all_runs().into_iter().enumerate() {
        let got = run_i8(backend, a, bt, m, n, k, idx % 3);
        let wrong = got.iter().zip(expected).filter(|(g, e)| g != e).count();
        if wrong > 0 {
            let first = got.iter().zip(expected).position(|(g, e)| g != e).unwrap();
            eprintln!(
                "{backend:?}: {wrong} mismatches for M={m} N={n} K={k}; first at ({}, {}): \
                 got {} expected {}",
                first / n,
                first % n,
                got[first],
                expected[first]
            );
        }
        bad += wrong;
    }
    bad
}

#[test]
fn i8_random_shapes_match_reference() {
    let mut rng = fastrand::Rng::with_seed(0x5EED_0001);
    let cases = 2000;
    let mut mismatches = 0;
    let mut compared = 0;
    for case in 0..cases {
        let m = if case % 5 == 0 { 1 } else { rng.usize(1..=40) };
        let n = rng.usize(1..=70);
        let k = match case % 4 {
            0 => rng.usize(1..=40),
            _ => rng.usize(1..=600),
        };
        let (fa, fb) = if case < 16 {
            (FILLS[case % 4], FILLS[case / 4])
        } else {
            (FILLS[rng.usize(..4)], FILLS[rng.usize(..4)])
        };
        let a = fill_i8(&mut rng, m * k, fa);
        let bt = fill_i8(&mut rng, n * k, fb);
        let expected = expect_fits(&reference_i8(&a, &bt, m, n, k));
        mismatches += check_i8_all(&a, &bt, m, n, k, &expected);
        compared += expected.len() * all_runs().len();
    }
    eprintln!(
        "{cases} shapes, {compared} outputs compared over backends {:?}",
        available_backends()
    );
    assert_eq!(mismatches, 0);
}

#[test]
fn i8_every_k_below_100_and_all_tile_edges() {
    // Exhaustive small K (every SIMD tail length) and every M, N remainder of the tiles.
    let mut rng = fastrand::Rng::with_seed(0x5EED_0002);
    let mut mismatches = 0;
    for k in 0..100 {
        for (m, n) in [
            (1, 1),
            (1, 9),
            (2, 4),
            (3, 7),
            (4, 5),
            (5, 8),
            (7, 17),
            (9, 3),
        ] {
            let a = fill_i8(&mut rng, m * k, FILLS[k % 4]);
            let bt = fill_i8(&mut rng, n * k, FILLS[(k / 4) % 4]);
            let expected = expect_fits(&reference_i8(&a, &bt, m, n, k));
            mismatches += check_i8_all(&a, &bt, m, n, k, &expected);
        }
    }
    assert_eq!(mismatches, 0);
}

#[test]
fn i8_big_k_matches_reference() {
    let mut rng = fastrand::Rng::with_seed(0x5EED_0003);
    let mut mismatches = 0;
    for k in [4099, 8200, 20000] {
        for (m, n) in [(1, 70), (2, 9), (5, 33), (3, 1)] {
            for (fa, fb) in [
                (Fill::AllMin, Fill::AllMin),
                (Fill::AllMin, Fill::AllMax),
                (Fill::Uniform, Fill::Uniform),
                (Fill::Extremes, Fill::Extremes),
            ] {
                let a = fill_i8(&mut rng, m * k, fa);
                let bt = fill_i8(&mut rng, n * k, fb);
                let expected = expect_fits(&reference_i8(&a, &bt, m, n, k));
                mismatches += check_i8_all(&a, &bt, m, n, k, &expected);
            }
        }
    }
    assert_eq!(mismatches, 0);
}

/// Shapes with many rows (f32 panels of B are packed from 64 rows on), several column panels
/// and several K blocks.
const LARGER_SHAPES: [(usize, usize, usize); 7] = [
    (64, 70, 1030),
    (67, 131, 77),
    (100, 33, 2100),
    (64, 1, 5),
    (65, 200, 1024),
    (70, 9, 4099),
    (128, 129, 130),
];

#[test]
fn i8_larger_shapes_match_reference() {
    let mut rng = fastrand::Rng::with_seed(0x5EED_0007);
    let mut mismatches = 0;
    for (idx, &(m, n, k)) in LARGER_SHAPES.iter().enumerate() {
        let a = fill_i8(&mut rng, m * k, FILLS[idx % 4]);
        let bt = fill_i8(&mut rng, n * k, FILLS[(idx + 1) % 4]);
        let expected = expect_fits(&reference_i8(&a, &bt, m, n, k));
        mismatches += check_i8_all(&a, &bt, m, n, k, &expected);
    }
    assert_eq!(mismatches, 0);
}

#[test]
fn i8_exact_up_to_the_documented_k_limit() {
    // K = 131071 with every product (-128)^2 is the largest sum that must still be exact.
    let k = 131_071;
    let a = vec![i8::MIN; 2 * k];
    let mut bt = vec![i8::MIN; 3 * k];
    bt[2 * k..].fill(i8::MAX);
    let expected = expect_fits(&reference_i8(&a, &bt, 2, 3, k));
    assert_eq!(expected[0], 131_071 * 16_384);
    assert_eq!(check_i8_all(&a, &bt, 2, 3, k, &expected), 0);
}

#[test]
fn i8_beyond_the_k_limit_wraps_identically() {
    // Past the limit every backend returns the true sum modulo 2^32.
    let k = 140_000;
    let a = vec![i8::MIN; k];
    let bt = vec![i8::MIN; 2 * k];
    let expected: Vec<i32> = reference_i8(&a, &bt, 1, 2, k)
        .iter()
        .map(|&x| x as i32)
        .collect();
    assert_ne!(i64::from(expected[0]), 140_000 * 16_384);
    assert_eq!(check_i8_all(&a, &bt, 1, 2, k, &expected), 0);
}

#[test]
fn degenerate_shapes() {
    for backend in all_runs() {
        for (m, n, k) in [(0, 0, 0), (0, 5, 3), (4, 0, 3), (3, 4, 0), (1, 1, 0)] {
            let a = vec![1i8; m * k];
            let bt = vec![1i8; n * k];
            let got = run_i8(backend, &a, &bt, m, n, k, 2);
            assert!(got.iter().all(|&x| x == 0), "{backend:?} {m}x{n}x{k}");

            let a = vec![1f32; m * k];
            let bt = vec![1f32; n * k];
            let mut c = vec![SENTINEL_F32; m * n + 1];
            match backend {
                Some(b) => gemm_f32_with(b, &a, &bt, &mut c, m, n, k).unwrap(),
                None => gemm_f32(&a, &bt, &mut c, m, n, k),
            }
            assert!(
                c[..m * n].iter().all(|&x| x == 0.0),
                "{backend:?} {m}x{n}x{k}"
            );
            assert_eq!(c[m * n], SENTINEL_F32);
        }
    }
}

/// An f32 value of one of several kinds: uniform in [-1, 1], small integers (as in f16
/// matmuls of quantised data), or a wide dynamic range.
fn f32_value(rng: &mut fastrand::Rng, kind: usize) -> f32 {
    match kind {
        0 => rng.f32() * 2.0 - 1.0,
        1 => f32::from(rng.i8(-8..=8)),
        _ => (rng.f32() * 2.0 - 1.0) * 2f32.powi(rng.i32(-20..=20)),
    }
}

/// Checks `got` against an f64 reference: `|got - exact| <= (K + 2) * eps * sum |a*b|` (the
/// worst-case bound of f32 summation in any order) plus a denormal-sized slack.
fn check_f32(
    backend: Option<KernelBackend>,
    a: &[f32],
    bt: &[f32],
    got: &[f32],
    (m, n, k): (usize, usize, usize),
) -> usize {
    let mut bad = 0;
    for i in 0..m {
        for j in 0..n {
            let (mut exact, mut magnitude) = (0f64, 0f64);
            for p in 0..k {
                let prod = f64::from(a[i * k + p]) * f64::from(bt[j * k + p]);
                exact += prod;
                magnitude += prod.abs();
            }
            let tol = (k as f64 + 2.0) * f64::from(f32::EPSILON) * magnitude + 1e-30;
            let err = (f64::from(got[i * n + j]) - exact).abs();
            // NaN compares false, so a NaN result counts as a mismatch.
            let within = err <= tol;
            if !within {
                if bad < 3 {
                    eprintln!(
                        "{backend:?}: M={m} N={n} K={k} ({i}, {j}): got {} expected {exact} \
                         (tolerance {tol:e})",
                        got[i * n + j]
                    );
                }
                bad += 1;
            }
        }
    }
    bad
}

fn run_f32(
    backend: Option<KernelBackend>,
    a: &[f32],
    bt: &[f32],
    (m, n, k): (usize, usize, usize),
) -> Vec<f32> {
    let mut c = vec![SENTINEL_F32; m * n + 1];
    match backend {
        Some(b) => gemm_f32_with(b, a, bt, &mut c, m, n, k).unwrap(),
        None => gemm_f32(a, bt, &mut c, m, n, k),
    }
    assert_eq!(c[m * n], SENTINEL_F32, "{backend:?} wrote past C");
    c.truncate(m * n);
    c
}

#[test]
fn f32_random_shapes_within_tolerance() {
    let mut rng = fastrand::Rng::with_seed(0x5EED_0004);
    let cases = 800;
    let mut bad = 0;
    for case in 0..cases {
        let m = if case % 5 == 0 { 1 } else { rng.usize(1..=40) };
        let n = rng.usize(1..=70);
        let k = match case % 4 {
            0 => rng.usize(1..=40),
            _ => rng.usize(1..=600),
        };
        let kind = case % 3;
        let a: Vec<f32> = (0..m * k).map(|_| f32_value(&mut rng, kind)).collect();
        let bt: Vec<f32> = (0..n * k).map(|_| f32_value(&mut rng, kind)).collect();
        for backend in all_runs() {
            let got = run_f32(backend, &a, &bt, (m, n, k));
            bad += check_f32(backend, &a, &bt, &got, (m, n, k));
        }
    }
    assert_eq!(bad, 0);
}

#[test]
fn f32_big_k_within_tolerance() {
    let mut rng = fastrand::Rng::with_seed(0x5EED_0005);
    let mut bad = 0;
    for k in [8200, 20000] {
        for (m, n) in [(1, 17), (3, 9)] {
            for kind in 0..3 {
                let a: Vec<f32> = (0..m * k).map(|_| f32_value(&mut rng, kind)).collect();
                let bt: Vec<f32> = (0..n * k).map(|_| f32_value(&mut rng, kind)).collect();
                for backend in all_runs() {
                    let got = run_f32(backend, &a, &bt, (m, n, k));
                    bad += check_f32(backend, &a, &bt, &got, (m, n, k));
                }
            }
        }
    }
    assert_eq!(bad, 0);
}

#[test]
fn f32_larger_shapes_within_tolerance() {
    let mut rng = fastrand::Rng::with_seed(0x5EED_0008);
    let mut bad = 0;
    for (idx, &(m, n, k)) in LARGER_SHAPES.iter().enumerate() {
        let kind = idx % 3;
        let a: Vec<f32> = (0..m * k).map(|_| f32_value(&mut rng, kind)).collect();
        let bt: Vec<f32> = (0..n * k).map(|_| f32_value(&mut rng, kind)).collect();
        for backend in all_runs() {
            let got = run_f32(backend, &a, &bt, (m, n, k));
            bad += check_f32(backend, &a, &bt, &got, (m, n, k));
        }
    }
    assert_eq!(bad, 0);
}

#[test]
fn f32_small_integers_are_exact() {
    // Products and sums of small integers are exact in f32 whatever the order.
    let mut rng = fastrand::Rng::with_seed(0x5EED_0006);
    for (m, n, k) in [(1, 13, 300), (6, 11, 77), (9, 70, 1000), (70, 66, 1500)] {
        let a: Vec<f32> = (0..m * k).map(|_| f32::from(rng.i8(-8..=8))).collect();
        let bt: Vec<f32> = (0..n * k).map(|_| f32::from(rng.i8(-8..=8))).collect();
        let ai: Vec<i8> = a.iter().map(|&x| x as i8).collect();
        let bi: Vec<i8> = bt.iter().map(|&x| x as i8).collect();
        let expected = reference_i8(&ai, &bi, m, n, k);
        for backend in all_runs() {
            let got = run_f32(backend, &a, &bt, (m, n, k));
            for (g, e) in got.iter().zip(&expected) {
                assert_eq!(f64::from(*g), *e as f64, "{backend:?} {m}x{n}x{k}");
            }
        }
    }
}

#[test]
fn f32_non_finite_values_propagate() {
    for (m, n, k) in [(3, 9, 37), (66, 9, 37)] {
        let mut a = vec![1.0f32; m * k];
        let bt = vec![0.5f32; n * k];
        a[5] = f32::INFINITY; // row 0
        a[k + 36] = f32::NAN; // row 1, in the tail chunk of every SIMD width
        for backend in all_runs() {
            let got = run_f32(backend, &a, &bt, (m, n, k));
            for j in 0..n {
                assert_eq!(got[j], f32::INFINITY, "{backend:?}");
                assert!(got[n + j].is_nan(), "{backend:?}");
                assert_eq!(got[2 * n + j], 0.5 * k as f32, "{backend:?}");
            }
        }
    }
}

#[test]
fn backend_api() {
    let available = available_backends();
    assert_eq!(available.first(), Some(&KernelBackend::Scalar));
    assert!(available.contains(&selected_backend()));
    for &backend in KernelBackend::ALL {
        assert_eq!(KernelBackend::from_name(backend.name()), Some(backend));
        assert_eq!(
            KernelBackend::from_name(&backend.name().to_uppercase()),
            Some(backend)
        );
        assert_eq!(backend.to_string(), backend.name());
        assert_eq!(backend.is_available(), available.contains(&backend));
        let mut c = [SENTINEL_I32; 4];
        let r = gemm_i8_i32_with(backend, &[1, 2], &[3, 4, 5, 6], &mut c, 1, 2, 2);
        if backend.is_available() {
            assert_eq!(r, Ok(()));
            assert_eq!(c, [11, 17, SENTINEL_I32, SENTINEL_I32]);
        } else {
            assert_eq!(r, Err(BackendUnavailable(backend)));
            assert_eq!(c, [SENTINEL_I32; 4]);
            assert!(r.unwrap_err().to_string().contains(backend.name()));
        }
    }
    assert_eq!(KernelBackend::from_name("no-such-backend"), None);
    let choice = kernel_choice();
    assert_eq!(choice.component, "emu");
    assert_eq!(choice.selected, selected_backend().name());
    let names = |b: &[KernelBackend]| b.iter().map(|b| b.name()).collect::<Vec<_>>();
    assert_eq!(choice.compiled, names(KernelBackend::ALL));
    assert_eq!(choice.available, names(&available));
    eprintln!(
        "available: {available:?}, selected: {:?}",
        selected_backend()
    );
}

/// Set in the child processes of [`env_var_forces_backend`]: the backend they must select.
const EXPECT_VAR: &str = "KERNELS_TEST_EXPECT_BACKEND";

/// The variables of the SDK's kernel selection that apply to the emulator's kernels.
const EMU_VAR: &str = "RKNN_KERNEL_EMU";
const ALL_VAR: &str = "RKNN_KERNEL";

#[test]
fn env_var_forces_backend() {
    // The selection is made once per process, so each case runs in a child process of this
    // test binary that executes only this test.
    if let Ok(expected) = std::env::var(EXPECT_VAR) {
        assert_eq!(selected_backend().name(), expected);
        assert_eq!(kernel_choice().selected, expected);
        let mut c = [0i32; 1];
        gemm_i8_i32(&[-128, 3], &[-128, 5], &mut c, 1, 1, 2);
        assert_eq!(c, [16384 + 15]);
        // Asked again: the choice is made, and an ignored name reported, once.
        assert_eq!(kernel_choice().selected, expected);
        return;
    }
    let available = available_backends();
    let fastest = available.last().unwrap().name();
    // (RKNN_KERNEL_EMU, RKNN_KERNEL, the backend expected, whether a warning is expected).
    let mut cases: Vec<(Option<String>, Option<String>, &str, bool)> = Vec::new();
    for b in &available {
        cases.push((Some(b.name().to_string()), None, b.name(), false));
        cases.push((None, Some(b.name().to_string()), b.name(), false));
    }
    for b in KernelBackend::ALL.iter().filter(|b| !b.is_available()) {
        cases.push((Some(b.name().to_string()), None, fastest, true));
    }
    let some = |v: &str| Some(v.to_string());
    cases.extend([
        (None, None, fastest, false),
        (some("Scalar"), None, "scalar", false),
        (None, some("SCALAR"), "scalar", false),
        // The component's variable wins over the one for every component.
        (some("scalar"), some(fastest), "scalar", false),
        (some(fastest), some("scalar"), fastest, false),
        (some("auto"), some("scalar"), fastest, false),
        (some(""), None, fastest, false),
        (some("no-such-backend"), None, fastest, true),
        (None, some("no-such-backend"), fastest, true),
    ]);
    let exe = std::env::current_exe().unwrap();
    // Under qemu-user without binfmt_misc, for one, the binary cannot start itself: skip then.
    let listing = std::process::Command::new(&exe)
        .args(["env_var_forces_backend", "--exact", "--list"])
        .output();
    if !listing.is_ok_and(|l| String::from_utf8_lossy(&l.stdout).contains("env_var_forces")) {
        eprintln!("skipping env_var_forces_backend: {exe:?} cannot be re-run here");
        return;
    }
    for (emu, all, expected, warns) in cases {
        let mut child = std::process::Command::new(&exe);
        // `--nocapture`: the child's warning reaches its stderr, where it is counted below.
        child
            .args([
                "env_var_forces_backend",
                "--exact",
                "--test-threads=1",
                "--nocapture",
            ])
            .env_remove(EMU_VAR)
            .env_remove(ALL_VAR)
            .env(EXPECT_VAR, expected);
        for (var, value) in [(EMU_VAR, &emu), (ALL_VAR, &all)] {
            if let Some(value) = value {
                child.env(var, value);
            }
        }
        let out = child.output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        let case = format!("{EMU_VAR}={emu:?} {ALL_VAR}={all:?} (expected {expected})");
        assert!(
            out.status.success(),
            "{case}: {}\n{stderr}",
            String::from_utf8_lossy(&out.stdout)
        );
        let warnings = stderr.matches("rknn kernels: ").count();
        assert_eq!(warnings, usize::from(warns), "{case}: stderr {stderr:?}");
    }
}

#[test]
#[should_panic(expected = "slices too short")]
fn short_slices_panic() {
    let mut c = [0i32; 3];
    gemm_i8_i32(&[1, 2, 3, 4], &[1, 2, 3, 4], &mut c, 2, 2, 2);
}

#[test]
#[should_panic(expected = "slices too short")]
fn short_slices_panic_f32() {
    let mut c = [0f32; 4];
    gemm_f32(&[1.0; 4], &[1.0; 3], &mut c, 2, 2, 2);
}
