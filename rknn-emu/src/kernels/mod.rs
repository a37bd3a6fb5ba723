//! Matrix kernels of the emulator: exact i8 GEMM and f32-accumulating float GEMM, with SIMD
//! variants chosen at run time. (Stub: the scalar reference only; SIMD variants to come.)

/// C[m*n_total + n] = sum_k A[m*k_total + k] * Bt[n*k_total + k], exactly, in i32.
///
/// `a` is [M, K] row-major, `bt` is B transposed ([N, K] row-major), `c` is [M, N] row-major.
pub fn gemm_i8_i32(a: &[i8], bt: &[i8], c: &mut [i32], m: usize, n: usize, k: usize) {
    assert!(a.len() >= m * k && bt.len() >= n * k && c.len() >= m * n);
    for i in 0..m {
        let row = &a[i * k..(i + 1) * k];
        for j in 0..n {
            let col = &bt[j * k..(j + 1) * k];
            c[i * n + j] = row.iter().zip(col).map(|(&x, &y)| i32::from(x) * i32::from(y)).sum();
        }
    }
}

/// As [`gemm_i8_i32`] for floats, accumulating in f32.
pub fn gemm_f32(a: &[f32], bt: &[f32], c: &mut [f32], m: usize, n: usize, k: usize) {
    assert!(a.len() >= m * k && bt.len() >= n * k && c.len() >= m * n);
    for i in 0..m {
        let row = &a[i * k..(i + 1) * k];
        for j in 0..n {
            let col = &bt[j * k..(j + 1) * k];
            c[i * n + j] = row.iter().zip(col).map(|(&x, &y)| x * y).sum();
        }
    }
}
