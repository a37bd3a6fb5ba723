//! The portable reference backend: the formulas of the parent module as plain loops, one
//! element at a time. The SIMD backends must match these functions bit for bit; tests and
//! benchmarks call them directly, and `RKNN_KERNEL_GLUE=scalar` makes the parent module use
//! them.
//!
//! Each function has the same contract (and the same length checks) as its namesake in the
//! parent module.

use super::common::{
    amax_ignoring_nan, check_len, check_out, check_pack_a, check_quantize, mul, native_c_len,
    quantize_one,
};

/// Scalar [`quantize_rows`](super::quantize_rows).
pub fn quantize_rows(
    x: &[f32],
    m: usize,
    k: usize,
    k_pad: usize,
    q: &mut [i8],
    scales: &mut [f32],
) {
    check_quantize(x, m, k, k_pad, q, scales);
    for r in 0..m {
        let row = &x[r * k..][..k];
        let out = &mut q[r * k_pad..][..k_pad];
        let amax = amax_ignoring_nan(row);
        if amax == 0.0 {
            scales[r] = 0.0;
            out.fill(0);
            continue;
        }
        let inv = 127.0f32 / amax;
        scales[r] = amax / 127.0;
        for (o, &v) in out.iter_mut().zip(row) {
            *o = quantize_one(v, inv);
        }
        out[k..].fill(0);
    }
}

/// Scalar [`pack_a_native_i8`](super::pack_a_native_i8).
pub fn pack_a_native_i8(
    q: &[i8],
    m: usize,
    k_pad: usize,
    k0: usize,
    kseg: usize,
    sk: usize,
    dst: &mut [i8],
) {
    assert!(
        k0.checked_add(kseg).is_some_and(|end| end <= k_pad),
        "glue: columns {k0}..+{kseg} exceed k_pad = {k_pad}"
    );
    check_pack_a(q.len(), m, k_pad, kseg, sk, dst.len());
    for b in 0..kseg / sk {
        for r in 0..m {
            let src = &q[r * k_pad + k0 + b * sk..][..sk];
            dst[(b * m + r) * sk..][..sk].copy_from_slice(src);
        }
    }
}

/// Scalar [`accumulate_c_native_i32`](super::accumulate_c_native_i32).
pub fn accumulate_c_native_i32(
    c: &[i32],
    m: usize,
    n: usize,
    sn: usize,
    acc: &mut [i32],
    first: bool,
) {
    check_len("c", c.len(), native_c_len(m, n, sn));
    check_len("acc", acc.len(), mul(m, n));
    for r in 0..m {
        for j in 0..n {
            let v = c[((j / sn) * m + r) * sn + j % sn];
            let a = &mut acc[r * n + j];
            *a = if first { v } else { a.wrapping_add(v) };
        }
    }
}

/// Scalar [`scale_out`](super::scale_out).
#[allow(clippy::too_many_arguments)] // Same signature as the dispatching function.
pub fn scale_out(
    acc: &[i32],
    m: usize,
    n: usize,
    row_scales: &[f32],
    ch_scales: &[f32],
    out: &mut [f32],
    ld: usize,
    n0: usize,
) {
    check_len("acc", acc.len(), mul(m, n));
    check_len("row_scales", row_scales.len(), m);
    check_len("ch_scales", ch_scales.len(), n);
    check_out(out.len(), m, n, ld, n0);
    for r in 0..m {
        for j in 0..n {
            out[r * ld + n0 + j] = (acc[r * n + j] as f32 * row_scales[r]) * ch_scales[j];
        }
    }
}

/// Scalar [`pack_a_native_f16`](super::pack_a_native_f16).
pub fn pack_a_native_f16(
    x: &[f32],
    m: usize,
    k: usize,
    k0: usize,
    kseg: usize,
    sk: usize,
    dst: &mut [half::f16],
) {
    check_pack_a(x.len(), m, k, kseg, sk, dst.len());
    for c in 0..kseg {
        let col = k0.checked_add(c).expect("glue: size overflows usize");
        for r in 0..m {
            let v = if col < k { x[r * k + col] } else { 0.0 };
            dst[((c / sk) * m + r) * sk + c % sk] = half::f16::from_f32(v);
        }
    }
}

/// Scalar [`accumulate_c_native_f32`](super::accumulate_c_native_f32).
#[allow(clippy::too_many_arguments)] // Same signature as the dispatching function.
pub fn accumulate_c_native_f32(
    c: &[f32],
    m: usize,
    n: usize,
    sn: usize,
    out: &mut [f32],
    ld: usize,
    n0: usize,
    first: bool,
) {
    check_len("c", c.len(), native_c_len(m, n, sn));
    check_out(out.len(), m, n, ld, n0);
    for r in 0..m {
        for j in 0..n {
            let v = c[((j / sn) * m + r) * sn + j % sn];
            let o = &mut out[r * ld + n0 + j];
            *o = if first { v } else { *o + v };
        }
    }
}
