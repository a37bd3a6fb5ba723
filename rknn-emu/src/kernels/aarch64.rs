//! aarch64 kernels: NEON for i8 (`smull`/`smull2` to i16, then `sadalp` into i32), NEON with
//! the dot-product extension for i8 (`sdot`, written with `asm!` because `vdotq_s32` is not
//! stable at the crate's MSRV), and NEON `fmla` for f32.
//!
//! Each tile kernel keeps an `R x C` block of dot products in registers over one K block
//! (see [`super::blocking`]), one vector chunk at a time; the last partial chunk of A (and of
//! B when it is not packed) is copied into zero-padded stack buffers and run through the same
//! code, so no load reads past a row.

// Each function body is one `unsafe` block: at the MSRV (1.85) the value-only intrinsics are
// `unsafe fn`s too, while newer compilers consider them safe inside `#[target_feature]`
// functions. The blocks always also contain raw-pointer accesses, so they are never unused.

use std::arch::aarch64::{
    float32x4_t, int8x16_t, int32x4_t, vaddq_s32, vaddvq_f32, vaddvq_s32, vdupq_n_f32, vdupq_n_s8,
    vdupq_n_s32, vfmaq_f32, vget_low_s8, vld1q_f32, vld1q_s8, vld1q_s32, vmull_high_s8, vmull_s8,
    vpadalq_s16, vpaddq_s32, vst1q_s32,
};
use std::arch::asm;

use super::blocking::{TilePtrs, Tiling, pad_tail, run_tiles, run_tiles_native_b, with_tile_shape};
use super::shape::{NATIVE_B_SK, NativeBShape, check_shapes};

/// Tiles of the i8 kernels: 4 x 4 (16 accumulators of the 32 vector registers), 1 x 8 for a
/// lone row. B is never packed, as on x86-64.
const TILING_I8: Tiling = Tiling {
    rows: 4,
    cols: 4,
    single_cols: 8,
    width: 16,
    pack_min_rows: usize::MAX,
};

/// Tiles of the f32 kernel, as [`TILING_I8`] with 4-element chunks; B packed from 64 rows
/// on, as on x86-64.
const TILING_F32: Tiling = Tiling {
    width: 4,
    pack_min_rows: 64,
    ..TILING_I8
};

/// Writes (or, when accumulating, adds) the horizontal (wrapping) sums to the tile of C.
///
/// # Safety
///
/// NEON; `t.c` valid for reads and writes of the `R x C` tile.
#[target_feature(enable = "neon")]
#[inline]
unsafe fn store_i32<const R: usize, const C: usize>(
    acc: &[[int32x4_t; C]; R],
    t: &TilePtrs<i8, i32>,
) {
    // SAFETY: the accesses stay inside the tile of C, valid by the contract.
    unsafe {
        for (r, acc_row) in acc.iter().enumerate() {
            for (q, v) in acc_row.iter().enumerate() {
                let sum = vaddvq_s32(*v);
                let dst = t.c.add(r * t.ldc + q);
                *dst = if t.accumulate {
                    (*dst).wrapping_add(sum)
                } else {
                    sum
                };
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// i8, NEON (smull + sadalp)
// ---------------------------------------------------------------------------------------------

/// The NEON i8 kernel (see [`super::gemm_i8_i32`]).
///
/// # Safety
///
/// The CPU must support NEON. (The slice lengths are checked here.)
pub(super) unsafe fn gemm_i8_i32_neon(
    a: &[i8],
    bt: &[i8],
    c: &mut [i32],
    m: usize,
    n: usize,
    k: usize,
) {
    check_shapes(a.len(), bt.len(), c.len(), m, n, k);
    run_tiles(a, bt, c, (m, n, k), TILING_I8, |t, rows, cols| {
        // SAFETY: `run_tiles` hands out tiles inside the checked matrices (and the packed
        // panel) with strides matching `TILING_I8`; the caller guarantees NEON.
        unsafe { with_tile_shape!(tile_i8_neon, rows, cols, t) }
    });
}

/// `C[tile] (+)= A[tile rows] * B[tile columns]^T` over the tile's K block.
///
/// # Safety
///
/// NEON; `t` describes `R` rows of A and `C` columns of B readable over `t.kc` elements with
/// its strides (B not packed), and an `R x C` tile of C.
#[target_feature(enable = "neon")]
unsafe fn tile_i8_neon<const R: usize, const C: usize>(t: TilePtrs<i8, i32>) {
    const W: usize = 16;
    debug_assert!(!t.packed, "the i8 tilings never pack B");
    // SAFETY: every access is within the ranges of the contract: the main loop reads whole
    // chunks below `kc`, the tail reads the padded stack buffers.
    unsafe {
        let mut acc = [[vdupq_n_s32(0); C]; R];
        let full = t.kc - t.kc % W;
        let (mut p, mut b) = (0, t.b);
        while p < full {
            for g in 0..t.b_group {
                step_i8_neon::<R, C>(&mut acc, t.a.add(p), t.lda, b.add(g * W), t.b_ld);
                p += W;
            }
            b = b.add(t.b_step);
        }
        if p < t.kc {
            let pa: [[i8; W]; R] = pad_tail(t.a, t.lda, p, t.kc);
            let pb: [[i8; W]; C] = pad_tail(t.b, t.b_ld, p, t.kc);
            step_i8_neon::<R, C>(&mut acc, pa.as_ptr().cast(), W, pb.as_ptr().cast(), W);
        }
        store_i32::<R, C>(&acc, &t);
    }
}

/// One 16-element chunk: rows at `a + r*lda`, columns at `b + q*ldb`.
///
/// # Safety
///
/// NEON; the 16 bytes at each row and column start readable.
#[target_feature(enable = "neon")]
#[inline]
unsafe fn step_i8_neon<const R: usize, const C: usize>(
    acc: &mut [[int32x4_t; C]; R],
    a: *const i8,
    lda: usize,
    b: *const i8,
    ldb: usize,
) {
    // SAFETY: the loads read 16 bytes at each row / column start, readable by the contract.
    unsafe {
        let mut av = [vdupq_n_s8(0); R];
        for (r, v) in av.iter_mut().enumerate() {
            *v = vld1q_s8(a.add(r * lda));
        }
        for q in 0..C {
            let bv = vld1q_s8(b.add(q * ldb));
            for (acc_row, &x) in acc.iter_mut().zip(&av) {
                // i8 x i8 products fit in i16 ((-128)^2 = 2^14); `sadalp` adds them in pairs
                // into the i32 lanes.
                let lo = vmull_s8(vget_low_s8(x), vget_low_s8(bv));
                let hi = vmull_high_s8(x, bv);
                acc_row[q] = vpadalq_s16(vpadalq_s16(acc_row[q], lo), hi);
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// i8, NEON + dotprod (sdot)
// ---------------------------------------------------------------------------------------------

/// The `sdot` i8 kernel (see [`super::gemm_i8_i32`]).
///
/// # Safety
///
/// The CPU must support NEON and the dot-product extension. (The slice lengths are checked.)
pub(super) unsafe fn gemm_i8_i32_sdot(
    a: &[i8],
    bt: &[i8],
    c: &mut [i32],
    m: usize,
    n: usize,
    k: usize,
) {
    check_shapes(a.len(), bt.len(), c.len(), m, n, k);
    run_tiles(a, bt, c, (m, n, k), TILING_I8, |t, rows, cols| {
        // SAFETY: as in `gemm_i8_i32_neon`; the caller guarantees NEON and dotprod.
        unsafe { with_tile_shape!(tile_i8_sdot, rows, cols, t) }
    });
}

/// `acc + the sum of four i8 x i8 products in each i32 lane` (`sdot`).
///
/// # Safety
///
/// The CPU must support the dot-product extension.
#[target_feature(enable = "neon,dotprod")]
#[inline]
unsafe fn sdot(acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t {
    let mut acc = acc;
    // SAFETY: the caller guarantees the CPU runs `sdot`; the instruction only reads and writes
    // the three named vector registers.
    unsafe {
        asm!(
            "sdot {acc:v}.4s, {a:v}.16b, {b:v}.16b",
            acc = inout(vreg) acc,
            a = in(vreg) a,
            b = in(vreg) b,
            options(pure, nomem, nostack, preserves_flags),
        );
    }
    acc
}

/// As [`tile_i8_neon`] with `sdot`.
///
/// # Safety
///
/// NEON and dotprod; the ranges of [`tile_i8_neon`].
#[target_feature(enable = "neon,dotprod")]
unsafe fn tile_i8_sdot<const R: usize, const C: usize>(t: TilePtrs<i8, i32>) {
    const W: usize = 16;
    debug_assert!(!t.packed, "the i8 tilings never pack B");
    // SAFETY: every access is within the ranges of the contract: the main loop reads whole
    // chunks below `kc`, the tail reads the padded stack buffers.
    unsafe {
        let mut acc = [[vdupq_n_s32(0); C]; R];
        let full = t.kc - t.kc % W;
        let (mut p, mut b) = (0, t.b);
        while p < full {
            for g in 0..t.b_group {
                step_i8_sdot::<R, C>(&mut acc, t.a.add(p), t.lda, b.add(g * W), t.b_ld);
                p += W;
            }
            b = b.add(t.b_step);
        }
        if p < t.kc {
            let pa: [[i8; W]; R] = pad_tail(t.a, t.lda, p, t.kc);
            let pb: [[i8; W]; C] = pad_tail(t.b, t.b_ld, p, t.kc);
            step_i8_sdot::<R, C>(&mut acc, pa.as_ptr().cast(), W, pb.as_ptr().cast(), W);
        }
        store_i32::<R, C>(&acc, &t);
    }
}

/// One 16-element chunk of the `sdot` tile.
///
/// # Safety
///
/// NEON and dotprod; the 16 bytes at each row and column start readable.
#[target_feature(enable = "neon,dotprod")]
#[inline]
unsafe fn step_i8_sdot<const R: usize, const C: usize>(
    acc: &mut [[int32x4_t; C]; R],
    a: *const i8,
    lda: usize,
    b: *const i8,
    ldb: usize,
) {
    // SAFETY: the loads read 16 bytes at each row / column start, readable by the contract;
    // the caller guarantees `sdot`.
    unsafe {
        let mut av = [vdupq_n_s8(0); R];
        for (r, v) in av.iter_mut().enumerate() {
            *v = vld1q_s8(a.add(r * lda));
        }
        for q in 0..C {
            let bv = vld1q_s8(b.add(q * ldb));
            for (acc_row, &x) in acc.iter_mut().zip(&av) {
                acc_row[q] = sdot(acc_row[q], x, bv);
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// f32, NEON
// ---------------------------------------------------------------------------------------------

/// The NEON f32 kernel (see [`super::gemm_f32`]).
///
/// # Safety
///
/// The CPU must support NEON. (The slice lengths are checked here.)
pub(super) unsafe fn gemm_f32_neon(
    a: &[f32],
    bt: &[f32],
    c: &mut [f32],
    m: usize,
    n: usize,
    k: usize,
) {
    check_shapes(a.len(), bt.len(), c.len(), m, n, k);
    run_tiles(a, bt, c, (m, n, k), TILING_F32, |t, rows, cols| {
        // SAFETY: as in `gemm_i8_i32_neon`.
        unsafe { with_tile_shape!(tile_f32_neon, rows, cols, t) }
    });
}

/// As [`tile_i8_neon`] in f32.
///
/// # Safety
///
/// NEON; the ranges of [`tile_i8_neon`] (in elements).
#[target_feature(enable = "neon")]
unsafe fn tile_f32_neon<const R: usize, const C: usize>(t: TilePtrs<f32, f32>) {
    const W: usize = 4;
    // SAFETY: every access is within the ranges of the contract: the main loop reads whole
    // chunks below `kc`, the tail reads the padded stack buffers (or the packed padding).
    // Zero padding in both A and B: the extra products are 0 * 0 = 0.
    unsafe {
        let mut acc = [[vdupq_n_f32(0.0); C]; R];
        let full = t.kc - t.kc % W;
        let (mut p, mut b) = (0, t.b);
        debug_assert_eq!(t.b_group, 1, "float B is never native");
        while p < full {
            step_f32_neon::<R, C>(&mut acc, t.a.add(p), t.lda, b, t.b_ld);
            b = b.add(t.b_step);
            p += W;
        }
        if p < t.kc {
            let pa: [[f32; W]; R] = pad_tail(t.a, t.lda, p, t.kc);
            if t.packed {
                step_f32_neon::<R, C>(&mut acc, pa.as_ptr().cast(), W, b, t.b_ld);
            } else {
                let pb: [[f32; W]; C] = pad_tail(t.b, t.b_ld, p, t.kc);
                step_f32_neon::<R, C>(&mut acc, pa.as_ptr().cast(), W, pb.as_ptr().cast(), W);
            }
        }
        for (r, acc_row) in acc.iter().enumerate() {
            for (q, v) in acc_row.iter().enumerate() {
                let sum = vaddvq_f32(*v);
                let dst = t.c.add(r * t.ldc + q);
                *dst = if t.accumulate { *dst + sum } else { sum };
            }
        }
    }
}

/// One 4-element chunk of the f32 tile.
///
/// # Safety
///
/// NEON; the 4 floats at each row and column start readable.
#[target_feature(enable = "neon")]
#[inline]
unsafe fn step_f32_neon<const R: usize, const C: usize>(
    acc: &mut [[float32x4_t; C]; R],
    a: *const f32,
    lda: usize,
    b: *const f32,
    ldb: usize,
) {
    // SAFETY: the loads read 4 floats at each row / column start, readable by the contract.
    unsafe {
        let mut av = [vdupq_n_f32(0.0); R];
        for (r, v) in av.iter_mut().enumerate() {
            *v = vld1q_f32(a.add(r * lda));
        }
        for q in 0..C {
            let bv = vld1q_f32(b.add(q * ldb));
            for (acc_row, &x) in acc.iter_mut().zip(&av) {
                acc_row[q] = vfmaq_f32(acc_row[q], x, bv);
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// i8 with native B (the matrix-vector product), NEON and NEON + dotprod
// ---------------------------------------------------------------------------------------------

/// The NEON native-B kernel (see [`super::gemm_i8_native_b`]).
///
/// # Safety
///
/// The CPU must support NEON; the caller has checked the shape and the slice lengths
/// ([`NativeBShape`]).
#[target_feature(enable = "neon")]
pub(super) unsafe fn native_b_neon(
    a: &[i8],
    b: &[i8],
    c: &mut [i32],
    shape: NativeBShape,
    accumulate: bool,
) {
    // SAFETY: forwarded contract.
    unsafe { native_b::<false>(a, b, c, shape, accumulate) }
}

/// The `sdot` native-B kernel (see [`super::gemm_i8_native_b`]).
///
/// # Safety
///
/// The CPU must support NEON and the dot-product extension; the caller has checked the shape
/// and the slice lengths ([`NativeBShape`]).
#[target_feature(enable = "neon,dotprod")]
pub(super) unsafe fn native_b_sdot(
    a: &[i8],
    b: &[i8],
    c: &mut [i32],
    shape: NativeBShape,
    accumulate: bool,
) {
    // SAFETY: forwarded contract.
    unsafe { native_b::<true>(a, b, c, shape, accumulate) }
}

/// The NEON native-B kernel for many rows: [`tile_i8_neon`] over B in place
/// ([`run_tiles_native_b`]).
///
/// # Safety
///
/// The CPU must support NEON; the caller has checked the shape and the slice lengths
/// ([`NativeBShape`]).
pub(super) unsafe fn native_b_tiled_neon(
    a: &[i8],
    b: &[i8],
    c: &mut [i32],
    shape: NativeBShape,
    accumulate: bool,
) {
    run_tiles_native_b(a, b, c, shape, accumulate, TILING_I8, |t, rows, cols| {
        // SAFETY: `run_tiles_native_b` hands out tiles inside the checked matrices with
        // strides matching `TILING_I8` (16-byte chunks, two per native tile row); the caller
        // guarantees NEON.
        unsafe { with_tile_shape!(tile_i8_neon, rows, cols, t) }
    });
}

/// The `sdot` native-B kernel for many rows: [`tile_i8_sdot`] over B in place
/// ([`run_tiles_native_b`]).
///
/// # Safety
///
/// The CPU must support NEON and the dot-product extension; the caller has checked the shape
/// and the slice lengths ([`NativeBShape`]).
pub(super) unsafe fn native_b_tiled_sdot(
    a: &[i8],
    b: &[i8],
    c: &mut [i32],
    shape: NativeBShape,
    accumulate: bool,
) {
    run_tiles_native_b(a, b, c, shape, accumulate, TILING_I8, |t, rows, cols| {
        // SAFETY: as in `native_b_tiled_neon`; the caller guarantees NEON and dotprod.
        unsafe { with_tile_shape!(tile_i8_sdot, rows, cols, t) }
    });
}

/// The native-B loop (inlined into the two entry points, so that `sdot` is inlined where the
/// dot-product feature is enabled): for each column block of `sn`, for each row of A, every
/// 32 x 32 tile is reduced in groups of 4 columns (one 32-byte row of the tile per column) into
/// one vector of 4 sums, so B is read once, front to back.
///
/// # Safety
///
/// NEON, and dotprod when `DOT`; the shape and lengths checked by the caller.
#[inline(always)]
unsafe fn native_b<const DOT: bool>(
    a: &[i8],
    b: &[i8],
    c: &mut [i32],
    shape: NativeBShape,
    accumulate: bool,
) {
    const SK: usize = NATIVE_B_SK;
    let NativeBShape { m, n, k, sn, lda } = shape;
    let groups = sn / 4;
    // SAFETY: by the checked shape, row `i` of A has `k` readable bytes at `i * lda`, B has
    // `n * k` bytes (tile block `jb` at `jb * k * sn`, tile `t` of it `t * sn * 32` further,
    // tile row `r` 32 bytes at `r * 32`), and C has `m * n` elements; every load and store
    // below stays inside those ranges (`g * 4 + 4 <= sn`). The caller guarantees the features.
    unsafe {
        let zero = vdupq_n_s32(0);
        for jb in 0..n / sn {
            let block = b.as_ptr().add(jb * k * sn);
            for i in 0..m {
                let row = a.as_ptr().add(i * lda);
                let mut acc = [zero; 8];
                for t in 0..k / SK {
                    let a0 = vld1q_s8(row.add(t * SK));
                    let a1 = vld1q_s8(row.add(t * SK + 16));
                    let tile = block.add(t * sn * SK);
                    for (g, acc) in acc.iter_mut().enumerate().take(groups) {
                        let mut v = [zero; 4];
                        for (r, v) in v.iter_mut().enumerate() {
                            let bp = tile.add((g * 4 + r) * SK);
                            let (b0, b1) = (vld1q_s8(bp), vld1q_s8(bp.add(16)));
                            *v = if DOT {
                                sdot(sdot(zero, a0, b0), a1, b1)
                            } else {
                                // i8 x i8 products fit in i16; `sadalp` adds them in pairs.
                                let mut p =
                                    vpadalq_s16(zero, vmull_s8(vget_low_s8(a0), vget_low_s8(b0)));
                                p = vpadalq_s16(p, vmull_high_s8(a0, b0));
                                p = vpadalq_s16(p, vmull_s8(vget_low_s8(a1), vget_low_s8(b1)));
                                vpadalq_s16(p, vmull_high_s8(a1, b1))
                            };
                        }
                        let sums = vpaddq_s32(vpaddq_s32(v[0], v[1]), vpaddq_s32(v[2], v[3]));
                        *acc = vaddq_s32(*acc, sums);
                    }
                }
                for (g, acc) in acc.iter().enumerate().take(groups) {
                    let dst = c.as_mut_ptr().add(i * n + jb * sn + g * 4);
                    let sum = if accumulate {
                        vaddq_s32(vld1q_s32(dst), *acc)
                    } else {
                        *acc
                    };
                    vst1q_s32(dst, sum);
                }
            }
        }
    }
}
