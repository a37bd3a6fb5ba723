//! x86-64 backend: AVX2 for the int8 quantisation, F16C `vcvtps2ph` for the f16 packing, and
//! the shared relayout kernels of [`super::fast`] compiled with AVX2 enabled.
//!
//! Every function requires AVX2 (and the f16 one F16C) and the parent module's length checks;
//! both are the callers' `unsafe` contract.

// At the MSRV (1.85) the value-only intrinsics are `unsafe fn`s, while newer compilers consider
// them safe inside `#[target_feature]` functions; every `unsafe` block therefore also holds
// raw-pointer accesses, so it is needed on every compiler.

use super::common::{RowPlan, quantize_one};
use super::fast;
use std::arch::x86_64::{
    __m256, __m256i, _CMP_ORD_Q, _MM_FROUND_TO_NEAREST_INT, _mm_storeu_si128, _mm256_add_ps,
    _mm256_and_ps, _mm256_and_si256, _mm256_blend_ps, _mm256_castsi256_ps, _mm256_cmp_ps,
    _mm256_cmpeq_epi32, _mm256_cvtps_epi32, _mm256_cvtps_ph, _mm256_loadu_ps, _mm256_loadu_si256,
    _mm256_max_epu32, _mm256_max_ps, _mm256_min_ps, _mm256_mul_ps, _mm256_packs_epi16,
    _mm256_packs_epi32, _mm256_permute_ps, _mm256_permute2f128_ps, _mm256_permutevar8x32_epi32,
    _mm256_set1_epi32, _mm256_set1_ps, _mm256_setr_epi32, _mm256_setzero_si256, _mm256_slli_epi32,
    _mm256_storeu_ps, _mm256_storeu_si256, _mm256_sub_ps, _mm256_xor_ps,
};
use std::ptr;

/// [`quantize_rows`](super::quantize_rows) with AVX2.
///
/// # Safety
///
/// AVX2 is available; the parent's length checks hold.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn quantize_rows(
    x: &[f32],
    m: usize,
    k: usize,
    k_pad: usize,
    q: &mut [i8],
    scales: &mut [f32],
) {
    for r in 0..m {
        let row = &x[r * k..][..k];
        let out = &mut q[r * k_pad..][..k_pad];
        // SAFETY: `row` holds `k` elements; AVX2 is available (contract).
        let bits = unsafe { max_abs_bits(row.as_ptr(), k) };
        let (scale, inv, general) = match RowPlan::new(bits, row) {
            RowPlan::Zero => {
                scales[r] = 0.0;
                out.fill(0);
                continue;
            }
            RowPlan::Plain { scale, inv } => (scale, inv, false),
            RowPlan::General { scale, inv } => (scale, inv, true),
        };
        scales[r] = scale;
        let (src, dst) = (row.as_ptr(), out.as_mut_ptr());
        // SAFETY: `row` holds `k` elements and `out` `k_pad >= k`; AVX2 is available.
        unsafe {
            if general {
                quantize_row::<true>(src, dst, k, inv);
            } else {
                quantize_row::<false>(src, dst, k, inv);
            }
        }
        out[k..].fill(0);
    }
}

/// The maximum of the `|x|` bit patterns of `p[..k]` (NaN patterns included, which exceed
/// `+inf`). An integer max is exact and needs no NaN handling; [`RowPlan::new`] sorts the
/// NaN case out.
///
/// # Safety
///
/// AVX2; `p` valid for reads of `k` elements.
#[target_feature(enable = "avx2")]
unsafe fn max_abs_bits(p: *const f32, k: usize) -> u32 {
    // SAFETY: every load is inside `p[..k]`: vectors only while `i + 8 <= k`.
    unsafe {
        let mask = _mm256_set1_epi32(0x7FFF_FFFF);
        // Four independent chains so the loop runs at load throughput, not max latency.
        let mut acc = [_mm256_setzero_si256(); 4];
        let mut i = 0;
        while i + 32 <= k {
            for (u, a) in acc.iter_mut().enumerate() {
                let v = _mm256_loadu_si256(p.add(i + 8 * u).cast());
                *a = _mm256_max_epu32(*a, _mm256_and_si256(v, mask));
            }
            i += 32;
        }
        while i + 8 <= k {
            let v = _mm256_loadu_si256(p.add(i).cast());
            acc[0] = _mm256_max_epu32(acc[0], _mm256_and_si256(v, mask));
            i += 8;
        }
        let v = _mm256_max_epu32(
            _mm256_max_epu32(acc[0], acc[1]),
            _mm256_max_epu32(acc[2], acc[3]),
        );
        let mut lanes = [0u32; 8];
        _mm256_storeu_si256(lanes.as_mut_ptr().cast(), v);
        let mut best = lanes.into_iter().max().unwrap_or(0);
        while i < k {
            best = best.max((*p.add(i)).to_bits() & 0x7FFF_FFFF);
            i += 1;
        }
        best
    }
}

/// Eight quantised lanes of `x` as i32. The plain form relies on `vcvtps2dq` rounding to
/// nearest even (the default MXCSR mode, which Rust code may assume) and on the products
/// lying within +-127.0000077 (see [`RowPlan::Plain`]). The general form first maps NaN to
/// +0 (an ordered-compare mask) and clamps to +-127 in float, where the clamp commutes with
/// rounding because the bounds are integers; `vmaxps`/`vminps` see no NaN by then.
macro_rules! quantize8 {
    ($x:expr, $vinv:expr, $general:expr) => {{
        let y: __m256 = _mm256_mul_ps($x, $vinv);
        let y = if $general {
            let y = _mm256_and_ps(y, _mm256_cmp_ps::<_CMP_ORD_Q>(y, y));
            _mm256_min_ps(
                _mm256_max_ps(y, _mm256_set1_ps(-127.0)),
                _mm256_set1_ps(127.0),
            )
        } else {
            y
        };
        let q: __m256i = _mm256_cvtps_epi32(y);
        q
    }};
}

/// Quantises `src[..k]` into `dst[..k]` with the reciprocal `inv`, 32 elements per step.
///
/// # Safety
///
/// AVX2; `src` valid for reads and `dst` for writes of `k` elements.
#[target_feature(enable = "avx2")]
unsafe fn quantize_row<const GENERAL: bool>(src: *const f32, dst: *mut i8, k: usize, inv: f32) {
    // SAFETY: vector accesses only while `i + 32 <= k`, the tail element by element.
    unsafe {
        let vinv = _mm256_set1_ps(inv);
        // `vpackssdw`/`vpacksswb` interleave the 128-bit lanes; this puts the dwords back in
        // order. Their saturation never triggers: the values are within +-127 already.
        let unshuffle = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
        let mut i = 0;
        while i + 32 <= k {
            let q0 = quantize8!(_mm256_loadu_ps(src.add(i)), vinv, GENERAL);
            let q1 = quantize8!(_mm256_loadu_ps(src.add(i + 8)), vinv, GENERAL);
            let q2 = quantize8!(_mm256_loadu_ps(src.add(i + 16)), vinv, GENERAL);
            let q3 = quantize8!(_mm256_loadu_ps(src.add(i + 24)), vinv, GENERAL);
            let w01 = _mm256_packs_epi32(q0, q1);
            let w23 = _mm256_packs_epi32(q2, q3);
            let b = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(w01, w23), unshuffle);
            _mm256_storeu_si256(dst.add(i).cast(), b);
            i += 32;
        }
        while i < k {
            *dst.add(i) = quantize_one(*src.add(i), inv);
            i += 1;
        }
    }
}

/// [`pack_a_native_i8`](super::pack_a_native_i8) compiled with AVX2.
///
/// # Safety
///
/// AVX2 is available; the parent's length checks hold.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn pack_a_native_i8(
    q: &[i8],
    m: usize,
    k_pad: usize,
    k0: usize,
    kseg: usize,
    sk: usize,
    dst: &mut [i8],
) {
    // SAFETY: the parent's length checks hold (contract).
    unsafe { fast::pack_a_native_i8(q, m, k_pad, k0, kseg, sk, dst) }
}

/// [`accumulate_c_native_i32`](super::accumulate_c_native_i32) compiled with AVX2.
///
/// # Safety
///
/// AVX2 is available; the parent's length checks hold.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn accumulate_c_native_i32(
    c: &[i32],
    m: usize,
    n: usize,
    sn: usize,
    acc: &mut [i32],
    first: bool,
) {
    // SAFETY: the parent's length checks hold (contract).
    unsafe { fast::accumulate_c_native_i32(c, m, n, sn, acc, first) }
}

/// [`accumulate_c_native_f32`](super::accumulate_c_native_f32) compiled with AVX2.
///
/// # Safety
///
/// AVX2 is available; the parent's length checks hold.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2")]
pub(super) unsafe fn accumulate_c_native_f32(
    c: &[f32],
    m: usize,
    n: usize,
    sn: usize,
    out: &mut [f32],
    ld: usize,
    n0: usize,
    first: bool,
) {
    // SAFETY: the parent's length checks hold (contract).
    unsafe { fast::accumulate_c_native_f32(c, m, n, sn, out, ld, n0, first) }
}

/// [`scale_out`](super::scale_out) compiled with AVX2 (`vcvtdq2ps` rounds to nearest even
/// like `as f32`; the two multiplies stay separate, Rust never contracts them into an FMA).
///
/// # Safety
///
/// AVX2 is available; the parent's length checks hold.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2")]
pub(super) unsafe fn scale_out(
    acc: &[i32],
    m: usize,
    n: usize,
    row_scales: &[f32],
    ch_scales: &[f32],
    out: &mut [f32],
    ld: usize,
    n0: usize,
) {
    fast::scale_out(acc, m, n, row_scales, ch_scales, out, ld, n0);
}

/// [`pack_a_native_f16`](super::pack_a_native_f16) with F16C: `vcvtps2ph` with an explicit
/// round-to-nearest-even immediate is the IEEE conversion `half::f16::from_f32` performs,
/// NaN payloads included (quiet bit set, top 10 mantissa bits kept).
///
/// # Safety
///
/// AVX2 and F16C are available; the parent's length checks hold.
#[target_feature(enable = "avx2,f16c")]
pub(super) unsafe fn pack_a_native_f16(
    x: &[f32],
    m: usize,
    k: usize,
    k0: usize,
    kseg: usize,
    sk: usize,
    dst: &mut [half::f16],
) {
    let nb = kseg / sk;
    // `half::f16` is a `repr(transparent)` `u16`.
    let (xp, dp) = (x.as_ptr(), dst.as_mut_ptr().cast::<u16>());
    // SAFETY: `x` holds `m * k` elements and `dst` `m * kseg = nb * m * sk` (parent's checks);
    // F16C is available.
    unsafe {
        match (m, sk) {
            // One row: the native layout is the row itself.
            (1, _) => convert_row(xp, k, k0, kseg, dp),
            (_, 8) => pack_f16_blocks::<8>(xp, m, k, k0, nb, dp),
            (_, 16) => pack_f16_blocks::<16>(xp, m, k, k0, nb, dp),
            // No RK chip uses another f16 block; not worth a vector path.
            _ => super::scalar::pack_a_native_f16(x, m, k, k0, kseg, sk, dst),
        }
    }
}

/// Eight f32 at `s` to f16 bit patterns at `d`.
///
/// # Safety
///
/// F16C; `s` valid for reads and `d` for writes of 8 elements.
#[inline]
#[target_feature(enable = "avx2,f16c")]
unsafe fn cvt8_f16(s: *const f32, d: *mut u16) {
    // SAFETY: the ranges of the contract; F16C is available.
    unsafe {
        let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm256_loadu_ps(s));
        _mm_storeu_si128(d.cast(), h);
    }
}

/// Columns `k0..k0 + len` of the one row at `xp` (`k` columns, zero beyond) to f16 at `dp`.
///
/// # Safety
///
/// F16C; `xp` valid for reads of `k` elements, `dp` for writes of `len`.
#[target_feature(enable = "avx2,f16c")]
unsafe fn convert_row(xp: *const f32, k: usize, k0: usize, len: usize, dp: *mut u16) {
    // Columns below `k` that are in the segment.
    let live = k.saturating_sub(k0).min(len);
    // SAFETY: reads at `k0 + i < k` only, writes at `i < len`; F16C is available.
    unsafe {
        let s = xp.add(k0.min(k));
        let mut i = 0;
        while i + 32 <= live {
            for u in 0..4 {
                cvt8_f16(s.add(i + 8 * u), dp.add(i + 8 * u));
            }
            i += 32;
        }
        while i + 8 <= live {
            cvt8_f16(s.add(i), dp.add(i));
            i += 8;
        }
        while i < live {
            *dp.add(i) = half::f16::from_f32(*s.add(i)).to_bits();
            i += 1;
        }
        ptr::write_bytes(dp.add(live), 0, len - live);
    }
}

/// The blocks of `SK` columns of [`pack_a_native_f16`], for `m` rows.
///
/// # Safety
///
/// F16C; `xp` valid for reads of `m * k` elements, `dp` for writes of `nb * m * SK`;
/// `k0 + nb * SK` does not overflow.
#[target_feature(enable = "avx2,f16c")]
unsafe fn pack_f16_blocks<const SK: usize>(
    xp: *const f32,
    m: usize,
    k: usize,
    k0: usize,
    nb: usize,
    dp: *mut u16,
) {
    // SAFETY: source columns are read only below `k` (whole vectors only when
    // `c0 + SK <= k`), rows below `m`; block `b` of row `r` is `dp[(b * m + r) * SK..][..SK]`
    // with `b < nb`; F16C is available.
    unsafe {
        for_each_block!(m, nb, super::common::PACK_F16_TILE, |r, b| {
            let c0 = k0 + b * SK;
            let s = xp.add(r * k);
            let d = dp.add((b * m + r) * SK);
            if c0 + SK <= k {
                for h in 0..SK / 8 {
                    cvt8_f16(s.add(c0 + 8 * h), d.add(8 * h));
                }
            } else {
                for l in 0..SK {
                    let c = c0 + l;
                    let v = if c < k { *s.add(c) } else { 0.0 };
                    *d.add(l) = half::f16::from_f32(v).to_bits();
                }
            }
        });
    }
}

/// [`rotate_rows`](super::rotate_rows) compiled with AVX2.
///
/// # Safety
///
/// AVX2 is available.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn rotate_rows(signs: &[u64], mix: Option<&[f32]>, k: usize, x: &mut [f32]) {
    super::fwht::rotate_rows_with(signs, mix, k, x, |block, signs| {
        // SAFETY: AVX2 is available (contract).
        unsafe { sign_fwht64(block, signs) }
    })
}

/// [`sign_fwht64`](super::fwht::sign_fwht64) in eight registers (the signs flipped
/// by a mask built from their bits): the butterflies
/// of distance 1, 2 and 4 within each register (the partner brought in by a permute, the sum
/// kept in the lower lane and the difference `a - b` in the upper one), those of 8, 16 and 32
/// between registers. Each output is the same `a + b` or `a - b` of the same operands as the
/// portable loops, so the bits are the same; the compiler does not find this arrangement for
/// the short distances, which were most of a decode token's rotation.
///
/// # Safety
///
/// AVX2 is available.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn sign_fwht64(block: &mut [f32; 64], signs: u64) {
    // SAFETY: every load and store is of 8 floats at `8 * j`, j < 8, inside the 64-float
    // array; AVX2 is available (contract).
    unsafe {
        let p = block.as_mut_ptr();
        // Lane i of register j takes bit 8j + i of `signs` into its sign bit: the byte
        // broadcast, each lane's bit isolated and compared, the all-ones lanes cut to bit 31.
        let lane_bits = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
        let mut v: [__m256; 8] = std::array::from_fn(|j| {
            let byte = _mm256_set1_epi32(((signs >> (8 * j)) & 0xFF) as i32);
            let set = _mm256_cmpeq_epi32(_mm256_and_si256(byte, lane_bits), lane_bits);
            let flip = _mm256_castsi256_ps(_mm256_slli_epi32::<31>(set));
            _mm256_xor_ps(_mm256_loadu_ps(p.add(8 * j)), flip)
        });
        for x in &mut v {
            // Distance 1: partner [x1, x0, x3, x2]; distance 2: [x2, x3, x0, x1] per half;
            // distance 4: the other half.
            let s = _mm256_permute_ps::<0b10_11_00_01>(*x);
            *x = _mm256_blend_ps::<0b1010_1010>(_mm256_add_ps(*x, s), _mm256_sub_ps(s, *x));
            let s = _mm256_permute_ps::<0b01_00_11_10>(*x);
            *x = _mm256_blend_ps::<0b1100_1100>(_mm256_add_ps(*x, s), _mm256_sub_ps(s, *x));
            let s = _mm256_permute2f128_ps::<0x01>(*x, *x);
            *x = _mm256_blend_ps::<0b1111_0000>(_mm256_add_ps(*x, s), _mm256_sub_ps(s, *x));
        }
        for h in [1, 2, 4] {
            for base in (0..8).step_by(2 * h) {
                for j in base..base + h {
                    let (a, b) = (v[j], v[j + h]);
                    v[j] = _mm256_add_ps(a, b);
                    v[j + h] = _mm256_sub_ps(a, b);
                }
            }
        }
        let eighth = _mm256_set1_ps(0.125);
        for (j, x) in v.iter().enumerate() {
            _mm256_storeu_ps(p.add(8 * j), _mm256_mul_ps(*x, eighth));
        }
    }
}
