//! The reference kernels: one plain dot product per output element.
//!
//! Deliberately simple (the compiler may still auto-vectorise the inner loops). The i8 sum
//! wraps like the SIMD backends' i32 lanes, so all backends agree even past `K = 131071`.

use super::shape::{NATIVE_B_SK, NativeBShape};

/// See [`super::gemm_i8_i32`]; the caller has checked the slice lengths.
pub(super) fn gemm_i8_i32(a: &[i8], bt: &[i8], c: &mut [i32], m: usize, n: usize, k: usize) {
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        c[..m * n].fill(0);
        return;
    }
    for (row, c_row) in a.chunks_exact(k).zip(c.chunks_exact_mut(n)).take(m) {
        for (col, out) in bt.chunks_exact(k).zip(c_row.iter_mut()) {
            *out = row.iter().zip(col).fold(0i32, |s, (&x, &y)| {
                s.wrapping_add(i32::from(x) * i32::from(y))
            });
        }
    }
}

/// See [`super::gemm_f32`]; the caller has checked the slice lengths.
pub(super) fn gemm_f32(a: &[f32], bt: &[f32], c: &mut [f32], m: usize, n: usize, k: usize) {
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        c[..m * n].fill(0.0);
        return;
    }
    for (row, c_row) in a.chunks_exact(k).zip(c.chunks_exact_mut(n)).take(m) {
        for (col, out) in bt.chunks_exact(k).zip(c_row.iter_mut()) {
            *out = row.iter().zip(col).map(|(&x, &y)| x * y).sum();
        }
    }
}

/// See [`super::gemm_i8_native_b`]; the caller has checked the shape and the slice lengths.
pub(super) fn gemm_i8_native_b(
    a: &[i8],
    b: &[i8],
    c: &mut [i32],
    shape: NativeBShape,
    accumulate: bool,
) {
    let NativeBShape { m, n, k, sn, lda } = shape;
    let sk = NATIVE_B_SK;
    for i in 0..m {
        let row = &a[i * lda..i * lda + k];
        for j in 0..n {
            let sum = (0..k).fold(0i32, |s, p| {
                let at = (j / sn) * k * sn + (p / sk) * sn * sk + (j % sn) * sk + p % sk;
                s.wrapping_add(i32::from(row[p]) * i32::from(b[at]))
            });
            let dst = &mut c[i * n + j];
            *dst = if accumulate {
                dst.wrapping_add(sum)
            } else {
                sum
            };
        }
    }
}
