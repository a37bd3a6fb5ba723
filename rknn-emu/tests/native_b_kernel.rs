//! The native-B matrix-vector kernel (`gemm_i8_native_b`) on every backend available here,
//! against a naive i64 reference over B transposed ([N, K]), with B written into the native
//! layout by `rknn_chip`'s packer (the layout the emulator's memories hold).

use rknn_chip::layout::NativeB;
use rknn_emu::kernels::{
    BackendUnavailable, KernelBackend, NATIVE_B_SK, NATIVE_B_STREAM_MAX_M, NativeBShape,
    available_backends, gemm_i8_native_b, gemm_i8_native_b_with,
};

const SENTINEL: i32 = 0x5A5A_5A5A;

fn fill(rng: &mut fastrand::Rng, len: usize, kind: usize) -> Vec<i8> {
    (0..len)
        .map(|_| match kind % 4 {
            0 => rng.i8(..),
            1 => i8::MIN,
            2 => i8::MAX,
            _ => [i8::MIN, i8::MAX, -1, 0, 1][rng.usize(..5)],
        })
        .collect()
}

/// `c[i, j] = sum_p a[i * lda + p] * bt[j * k + p]` in i64, then wrapped to i32 (the kernels'
/// documented result; exact while it fits).
fn reference(a: &[i8], bt: &[i8], m: usize, n: usize, k: usize, lda: usize) -> Vec<i32> {
    let mut c = vec![0i32; m * n];
    for i in 0..m {
        for j in 0..n {
            let s: i64 = (0..k)
                .map(|p| i64::from(a[i * lda + p]) * i64::from(bt[j * k + p]))
                .sum();
            c[i * n + j] = s as i32;
        }
    }
    c
}

fn native(bt: &[i8], n: usize, k: usize, sn: usize) -> Vec<i8> {
    let geo = NativeB::new(k, n, sn, NATIVE_B_SK, None).unwrap();
    assert_eq!(geo.len(), n * k, "whole tiles: no padding");
    let mut b = vec![0i8; geo.len()];
    geo.pack_from_nk(bt, &mut b);
    b
}

/// Every available backend plus the default entry point (`None`).
fn runs() -> Vec<Option<KernelBackend>> {
    available_backends()
        .into_iter()
        .map(Some)
        .chain([None])
        .collect()
}

/// Runs one backend with a guard element after C; checks the guard.
fn run(
    backend: Option<KernelBackend>,
    a: &[i8],
    b: &[i8],
    c0: &[i32],
    shape: NativeBShape,
    accumulate: bool,
) -> Vec<i32> {
    let mut c = c0.to_vec();
    c.push(SENTINEL);
    match backend {
        Some(be) => gemm_i8_native_b_with(be, a, b, &mut c, shape, accumulate).unwrap(),
        None => gemm_i8_native_b(a, b, &mut c, shape, accumulate),
    }
    assert_eq!(c.pop(), Some(SENTINEL), "{backend:?} wrote past C");
    c
}

/// Checks every backend on one case, overwriting and accumulating onto random prior values of
/// C, against the reference; returns the number of backends checked.
fn check_case(rng: &mut fastrand::Rng, a: &[i8], bt: &[i8], shape: NativeBShape) -> usize {
    let NativeBShape { m, n, k, sn, lda } = shape;
    let b = native(bt, n, k, sn);
    let want = reference(a, bt, m, n, k, lda);
    let prior: Vec<i32> = (0..m * n).map(|_| rng.i32(..)).collect();
    let want_acc: Vec<i32> = want
        .iter()
        .zip(&prior)
        .map(|(w, p)| w.wrapping_add(*p))
        .collect();
    let backends = runs();
    for &backend in &backends {
        let got = run(backend, a, &b, &prior, shape, false);
        assert_eq!(got, want, "{backend:?} {shape:?}");
        let got = run(backend, a, &b, &prior, shape, true);
        assert_eq!(got, want_acc, "{backend:?} {shape:?} accumulating");
    }
    backends.len()
}

#[test]
fn every_backend_matches_the_reference() {
    let mut rng = fastrand::Rng::with_seed(0x4E41_5449);
    let mut checked = 0;
    for case in 0..300 {
        let sn = [8, 16, 24, 32][case % 4];
        let n = sn * rng.usize(1..=5);
        let k = NATIVE_B_SK * rng.usize(1..=12);
        let m = [1, 1, 2, 3, 4, 5, 6, 7, 8, 10, 13, 32][rng.usize(..12)];
        let lda = k + [0, 0, 1, 32, 7][rng.usize(..5)];
        let a = fill(&mut rng, m * lda, case / 4);
        let bt = fill(&mut rng, n * k, case / 4 + case % 3);
        let shape = NativeBShape { m, n, k, sn, lda };
        checked += check_case(&mut rng, &a, &bt, shape);
    }
    assert!(checked >= 600);
}

#[test]
fn many_rows_run_register_tiles_over_b_in_place() {
    // Above NATIVE_B_STREAM_MAX_M rows the kernels step through the native layout with their
    // register tiles: every row count around the tile heights (3 on x86-64, 4 on aarch64) and
    // the threshold, every tile width, K over several 4 KiB K blocks, strided A, accumulation.
    let mut rng = fastrand::Rng::with_seed(0x5449_4C45);
    let mut cases = 0;
    for case in 0..40 {
        let sn = [8, 16, 24, 32][case % 4];
        let n = sn * rng.usize(1..=3);
        let k = if case % 5 == 0 {
            NATIVE_B_SK * rng.usize(129..=260)
        } else {
            NATIVE_B_SK * rng.usize(1..=20)
        };
        let m = NATIVE_B_STREAM_MAX_M + [1, 2, 3, 4, 5, 7, 12, 31, 65][case % 9];
        let lda = k + [0, 1, 32][case % 3];
        let a = fill(&mut rng, (m - 1) * lda + k, case / 4);
        let bt = fill(&mut rng, n * k, case / 4 + case % 3);
        let shape = NativeBShape { m, n, k, sn, lda };
        check_case(&mut rng, &a, &bt, shape);
        cases += 1;
    }
    assert_eq!(cases, 40);
}

#[test]
fn extremes_up_to_the_exactness_limit() {
    // K = 131040 (the largest multiple of 32 within the i32-exact limit) with every product
    // (-128)^2, and the all-(-128) row against 127: the VNNI offset correction at its largest,
    // for the streaming kernel (2 rows) and the register tiles (34 rows).
    let k = 131_040;
    let (sn, n) = (8, 16);
    let mut bt = vec![i8::MIN; n * k];
    bt[8 * k..].fill(i8::MAX);
    let b = native(&bt, n, k, sn);
    for m in [2, NATIVE_B_STREAM_MAX_M + 2] {
        let a = vec![i8::MIN; m * k];
        let shape = NativeBShape {
            m,
            n,
            k,
            sn,
            lda: k,
        };
        let mut want = vec![131_040 * 16_384; m * n];
        for row in want.chunks_exact_mut(n) {
            row[8..].fill(-131_040 * 128 * 127);
        }
        assert_eq!(want[..2 * n], reference(&a[..2 * k], &bt, 2, n, k, k)[..]);
        for backend in runs() {
            assert_eq!(
                run(backend, &a, &b, &vec![0; m * n], shape, false),
                want,
                "{backend:?} m={m}"
            );
        }
    }
}

#[test]
fn empty_shapes_touch_nothing() {
    for backend in runs() {
        let shape = NativeBShape {
            m: 0,
            n: 32,
            k: 32,
            sn: 32,
            lda: 32,
        };
        assert_eq!(run(backend, &[], &[0; 1024], &[], shape, false), []);
        let shape = NativeBShape {
            m: 2,
            n: 0,
            k: 64,
            sn: 16,
            lda: 64,
        };
        assert_eq!(run(backend, &[1; 128], &[], &[], shape, false), []);
    }
}

#[test]
fn unavailable_backends_are_refused() {
    let shape = NativeBShape {
        m: 1,
        n: 8,
        k: 32,
        sn: 8,
        lda: 32,
    };
    for &backend in KernelBackend::ALL {
        let mut c = [SENTINEL; 8];
        let r = gemm_i8_native_b_with(backend, &[1; 32], &[1; 256], &mut c, shape, false);
        if backend.is_available() {
            assert_eq!(r, Ok(()));
            assert_eq!(c, [32; 8]);
        } else {
            assert_eq!(r, Err(BackendUnavailable(backend)));
            assert_eq!(c, [SENTINEL; 8]);
        }
    }
}

#[test]
#[should_panic(expected = "unsupported shape")]
fn k_must_be_whole_tiles() {
    let shape = NativeBShape {
        m: 1,
        n: 8,
        k: 31,
        sn: 8,
        lda: 31,
    };
    gemm_i8_native_b(&[0; 31], &[0; 248], &mut [0; 8], shape, false);
}

#[test]
#[should_panic(expected = "slices too short")]
fn short_b_panics() {
    let shape = NativeBShape {
        m: 1,
        n: 16,
        k: 32,
        sn: 16,
        lda: 32,
    };
    gemm_i8_native_b(&[0; 32], &[0; 511], &mut [0; 16], shape, false);
}
