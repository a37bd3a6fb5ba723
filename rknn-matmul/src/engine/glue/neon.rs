//! aarch64 backend: NEON for the int8 quantisation, `fcvtn` for the f16 packing (through
//! `asm!`: the f16 vector types and `vcvt_f16_f32` are not stable at the crate's MSRV). NEON
//! is baseline on aarch64; the relayout kernels of [`super::fast`] are called directly.
//!
//! Every function requires the parent module's length checks, the callers' `unsafe`
//! contract.

// At the MSRV (1.85) the value-only intrinsics are `unsafe fn`s, while newer compilers consider
// them safe; every `unsafe` block therefore also holds raw-pointer accesses, so it is needed on
// every compiler.

use super::common::{RowPlan, quantize_one};
use std::arch::aarch64::{
    uint16x8_t, vandq_u32, vcvtnq_s32_f32, vdupq_n_f32, vdupq_n_s8, vdupq_n_u32, vld1q_f32,
    vld1q_u32, vmaxq_s8, vmaxq_u32, vmaxvq_u32, vmulq_f32, vqmovn_high_s16, vqmovn_high_s32,
    vqmovn_s16, vqmovn_s32, vst1q_s8, vst1q_u16,
};
use std::arch::asm;

/// [`quantize_rows`](super::quantize_rows) with NEON.
///
/// # Safety
///
/// The parent's length checks hold.
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
        // SAFETY: `row` holds `k` elements.
        let bits = unsafe { max_abs_bits(row.as_ptr(), k) };
        // `fcvtns` already rounds to nearest even, saturates and maps NaN to 0, so one loop
        // serves plain and general rows alike.
        let (RowPlan::Plain { scale, inv } | RowPlan::General { scale, inv }) =
            RowPlan::new(bits, row)
        else {
            scales[r] = 0.0;
            out.fill(0);
            continue;
        };
        scales[r] = scale;
        // SAFETY: `row` holds `k` elements and `out` `k_pad >= k`.
        unsafe { quantize_row(row.as_ptr(), out.as_mut_ptr(), k, inv) };
        out[k..].fill(0);
    }
}

/// The maximum of the `|x|` bit patterns of `p[..k]` (NaN patterns included, which exceed
/// `+inf`). An integer max is exact and, unlike `fmaxnm`, treats every NaN alike;
/// [`RowPlan::new`] sorts the NaN case out.
///
/// # Safety
///
/// `p` valid for reads of `k` elements.
unsafe fn max_abs_bits(p: *const f32, k: usize) -> u32 {
    // SAFETY: every load is inside `p[..k]`: vectors only while `i + 4 <= k`.
    unsafe {
        let mask = vdupq_n_u32(0x7FFF_FFFF);
        // Four independent chains so the loop runs at load throughput, not max latency.
        let mut acc = [vdupq_n_u32(0); 4];
        let mut i = 0;
        while i + 16 <= k {
            for (u, a) in acc.iter_mut().enumerate() {
                let v = vld1q_u32(p.add(i + 4 * u).cast());
                *a = vmaxq_u32(*a, vandq_u32(v, mask));
            }
            i += 16;
        }
        while i + 4 <= k {
            acc[0] = vmaxq_u32(acc[0], vandq_u32(vld1q_u32(p.add(i).cast()), mask));
            i += 4;
        }
        let v = vmaxq_u32(vmaxq_u32(acc[0], acc[1]), vmaxq_u32(acc[2], acc[3]));
        let mut best = vmaxvq_u32(v);
        while i < k {
            best = best.max((*p.add(i)).to_bits() & 0x7FFF_FFFF);
            i += 1;
        }
        best
    }
}

/// Quantises `src[..k]` into `dst[..k]` with the reciprocal `inv`, 16 elements per step:
/// `fcvtns` (round to nearest even, saturating, NaN to 0), two saturating narrowings to i8,
/// then a max with -127 for the lower clamp (the narrowing already clamps at 127).
///
/// # Safety
///
/// `src` valid for reads and `dst` for writes of `k` elements.
unsafe fn quantize_row(src: *const f32, dst: *mut i8, k: usize, inv: f32) {
    // SAFETY: vector accesses only while `i + 16 <= k`, the tail element by element.
    unsafe {
        let vinv = vdupq_n_f32(inv);
        let floor = vdupq_n_s8(-127);
        let mut i = 0;
        while i + 16 <= k {
            let q0 = vcvtnq_s32_f32(vmulq_f32(vld1q_f32(src.add(i)), vinv));
            let q1 = vcvtnq_s32_f32(vmulq_f32(vld1q_f32(src.add(i + 4)), vinv));
            let q2 = vcvtnq_s32_f32(vmulq_f32(vld1q_f32(src.add(i + 8)), vinv));
            let q3 = vcvtnq_s32_f32(vmulq_f32(vld1q_f32(src.add(i + 12)), vinv));
            let h0 = vqmovn_high_s32(vqmovn_s32(q0), q1);
            let h1 = vqmovn_high_s32(vqmovn_s32(q2), q3);
            let b = vqmovn_high_s16(vqmovn_s16(h0), h1);
            vst1q_s8(dst.add(i), vmaxq_s8(b, floor));
            i += 16;
        }
        while i < k {
            *dst.add(i) = quantize_one(*src.add(i), inv);
            i += 1;
        }
    }
}

/// Converts `s[..8]` to f16 bit patterns at `d[..8]` with `fcvtn`/`fcvtn2`: IEEE
/// round-to-nearest-even under the default FPCR (the mode Rust code runs in), NaN payloads
/// kept like `half::f16::from_f32` does.
///
/// # Safety
///
/// `s` valid for reads and `d` for writes of 8 elements.
#[inline(always)]
unsafe fn cvt8_f16(s: *const f32, d: *mut u16) {
    // SAFETY: the loads and the store are the ranges of the contract; the asm only reads and
    // writes registers (it may set FPSR exception flags, so no `preserves_flags`).
    unsafe {
        let lo = vld1q_f32(s);
        let hi = vld1q_f32(s.add(4));
        let h: uint16x8_t;
        asm!(
            "fcvtn {h:v}.4h, {lo:v}.4s",
            "fcvtn2 {h:v}.8h, {hi:v}.4s",
            // `out`, not `lateout`: `h` is written before `hi` is read.
            h = out(vreg) h,
            lo = in(vreg) lo,
            hi = in(vreg) hi,
            options(pure, nomem, nostack),
        );
        vst1q_u16(d, h);
    }
}

/// [`pack_a_native_f16`](super::pack_a_native_f16) with `fcvtn`.
///
/// # Safety
///
/// The parent's length checks hold.
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
    // SAFETY: `x` holds `m * k` elements and `dst` `m * kseg = nb * m * sk` (parent's checks).
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

/// Columns `k0..k0 + len` of the one row at `xp` (`k` columns, zero beyond) to f16 at `dp`.
///
/// # Safety
///
/// `xp` valid for reads of `k` elements, `dp` for writes of `len`.
unsafe fn convert_row(xp: *const f32, k: usize, k0: usize, len: usize, dp: *mut u16) {
    // Columns below `k` that are in the segment.
    let live = k.saturating_sub(k0).min(len);
    // SAFETY: reads at `k0 + i < k` only, writes at `i < len`.
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
        std::ptr::write_bytes(dp.add(live), 0, len - live);
    }
}

/// The blocks of `SK` columns of [`pack_a_native_f16`], for `m` rows.
///
/// # Safety
///
/// `xp` valid for reads of `m * k` elements, `dp` for writes of `nb * m * SK`;
/// `k0 + nb * SK` does not overflow.
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
    // with `b < nb`.
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
