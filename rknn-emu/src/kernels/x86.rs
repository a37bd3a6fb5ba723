//! x86-64 kernels: AVX2 for i8 (sign extension to i16, then `vpmaddwd`), AVX2 + FMA for f32,
//! and AVX512-VNNI for i8 (`vpdpbusd` on `ymm` registers, written with `asm!` because the
//! AVX-512 intrinsics are not stable at the crate's MSRV).
//!
//! Each tile kernel keeps an `R x C` block of dot products in registers over one K block
//! (see [`super::blocking`]), one vector chunk at a time; the last partial chunk of A (and of
//! B when it is not packed) is copied into zero-padded stack buffers and run through the same
//! code, so no load reads past a row.

// Each function body is one `unsafe` block: at the MSRV (1.85) the value-only intrinsics are
// `unsafe fn`s too, while newer compilers consider them safe inside `#[target_feature]`
// functions. The blocks always also contain raw-pointer accesses, so they are never unused.

use std::arch::asm;
use std::arch::x86_64::{
    __m128i, __m256, __m256i, _MM_HINT_T0, _mm_add_epi32, _mm_add_ps, _mm_loadu_si128,
    _mm_prefetch, _mm_storeu_ps, _mm_storeu_si128, _mm256_add_epi32, _mm256_broadcastd_epi32,
    _mm256_castps256_ps128, _mm256_castsi256_si128, _mm256_cvtepi8_epi16, _mm256_extractf128_ps,
    _mm256_extracti128_si256, _mm256_fmadd_ps, _mm256_hadd_epi32, _mm256_hadd_ps, _mm256_loadu_ps,
    _mm256_loadu_si256, _mm256_madd_epi16, _mm256_permute2x128_si256, _mm256_set1_epi8,
    _mm256_setzero_ps, _mm256_setzero_si256, _mm256_slli_epi32, _mm256_storeu_si256,
    _mm256_sub_epi32, _mm256_xor_si256,
};

use super::blocking::{TilePtrs, Tiling, pad_tail, run_tiles, run_tiles_native_b, with_tile_shape};
use super::shape::{NATIVE_B_SK, NativeBShape, check_shapes};

/// Tiles of the AVX2 i8 kernel: 3 x 3 (9 accumulators + 3 rows of A + 1 column of B + 1
/// product of the 16 `ymm` registers; each B chunk, the part that comes from L2, serves 3
/// rows), 1 x 8 for a lone row. B is never packed (measured: no gain for i8).
const TILING_I8: Tiling = Tiling {
    rows: 3,
    cols: 3,
    single_cols: 8,
    width: 16,
    pack_min_rows: usize::MAX,
};

/// Tiles of the VNNI kernel, as [`TILING_I8`] with 32-byte chunks.
const TILING_VNNI: Tiling = Tiling {
    width: 32,
    ..TILING_I8
};

/// Tiles of the f32 kernel: 3 x 3, whose 9 independent FMA chains hide the FMA latency
/// (4 cycles at 2 per cycle); 1 x 8 for a lone row; B packed from 64 rows on.
const TILING_F32: Tiling = Tiling {
    width: 8,
    pack_min_rows: 64,
    ..TILING_I8
};

/// Horizontal sums of four i32 vectors (wrapping).
///
/// # Safety
///
/// AVX2.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn hsum4_epi32(v: [__m256i; 4]) -> [i32; 4] {
    let mut out = [0i32; 4];
    // SAFETY: AVX2 is available; the store writes the 16 bytes of `out`.
    unsafe {
        let s = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
        let s = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256::<1>(s));
        _mm_storeu_si128(out.as_mut_ptr().cast::<__m128i>(), s);
    }
    out
}

/// Horizontal sums of four f32 vectors.
///
/// # Safety
///
/// AVX.
#[target_feature(enable = "avx")]
#[inline]
unsafe fn hsum4_ps(v: [__m256; 4]) -> [f32; 4] {
    let mut out = [0f32; 4];
    // SAFETY: AVX is available; the store writes the 16 bytes of `out`.
    unsafe {
        let s = _mm256_hadd_ps(_mm256_hadd_ps(v[0], v[1]), _mm256_hadd_ps(v[2], v[3]));
        let s = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps::<1>(s));
        _mm_storeu_ps(out.as_mut_ptr(), s);
    }
    out
}

/// Calls `f(r, q, index)` for every accumulator of an `R x C` tile in row-major order, so
/// that the horizontal sums can be taken four at a time.
#[inline(always)]
fn for_each_acc<const R: usize, const C: usize>(mut f: impl FnMut(usize, usize, usize)) {
    for idx in 0..R * C {
        f(idx / C, idx % C, idx);
    }
}

/// Writes (or, when accumulating, adds) each sum to its element of the tile of C, less
/// `offset[r]` in the call's first K block, in wrapping i32 arithmetic.
///
/// # Safety
///
/// AVX2; `t.c` valid for reads and writes of the `R x C` tile.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn store_i32<const R: usize, const C: usize>(
    acc: &[[__m256i; C]; R],
    offset: &[i32; R],
    t: &TilePtrs<i8, i32>,
) {
    // SAFETY: AVX2 is available; the accesses stay inside the tile of C (contract).
    unsafe {
        let zero = _mm256_setzero_si256();
        let mut group = [zero; 4];
        let mut cells = [(0usize, 0usize); 4];
        for_each_acc::<R, C>(|r, q, idx| {
            group[idx % 4] = acc[r][q];
            cells[idx % 4] = (r, q);
            if idx % 4 == 3 || idx + 1 == R * C {
                let sums = hsum4_epi32(group);
                for (&(r, q), &sum) in cells.iter().zip(&sums).take(idx % 4 + 1) {
                    let dst = t.c.add(r * t.ldc + q);
                    let sum = if t.first_block {
                        sum.wrapping_sub(offset[r])
                    } else {
                        sum
                    };
                    *dst = if t.accumulate {
                        (*dst).wrapping_add(sum)
                    } else {
                        sum
                    };
                }
                group = [zero; 4];
            }
        });
    }
}

// ---------------------------------------------------------------------------------------------
// i8, AVX2
// ---------------------------------------------------------------------------------------------

/// The AVX2 i8 kernel (see [`super::gemm_i8_i32`]).
///
/// # Safety
///
/// The CPU must support AVX2. (The slice lengths are checked here.)
pub(super) unsafe fn gemm_i8_i32_avx2(
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
        // panel) with strides matching `TILING_I8`; the caller guarantees AVX2.
        unsafe { with_tile_shape!(tile_i8_avx2, rows, cols, t) }
    });
}

/// `C[tile] (+)= A[tile rows] * B[tile columns]^T` over the tile's K block.
///
/// # Safety
///
/// AVX2; `t` describes `R` rows of A and `C` columns of B readable over `t.kc` elements with
/// its strides (B not packed), and an `R x C` tile of C.
#[target_feature(enable = "avx2")]
unsafe fn tile_i8_avx2<const R: usize, const C: usize>(t: TilePtrs<i8, i32>) {
    const W: usize = 16;
    debug_assert!(!t.packed, "the i8 tilings never pack B");
    // SAFETY: every access is within the ranges of the contract: the main loop reads whole
    // chunks below `kc`, the tail reads the padded stack buffers.
    unsafe {
        let mut acc = [[_mm256_setzero_si256(); C]; R];
        let full = t.kc - t.kc % W;
        let (mut p, mut b) = (0, t.b);
        while p < full {
            for g in 0..t.b_group {
                step_i8_avx2::<R, C>(&mut acc, t.a.add(p), t.lda, b.add(g * W), t.b_ld);
                p += W;
            }
            b = b.add(t.b_step);
        }
        if p < t.kc {
            let pa: [[i8; W]; R] = pad_tail(t.a, t.lda, p, t.kc);
            let pb: [[i8; W]; C] = pad_tail(t.b, t.b_ld, p, t.kc);
            step_i8_avx2::<R, C>(&mut acc, pa.as_ptr().cast(), W, pb.as_ptr().cast(), W);
        }
        store_i32::<R, C>(&acc, &[0; R], &t);
    }
}

/// One 16-element chunk: rows at `a + r*lda`, columns at `b + q*ldb`.
///
/// # Safety
///
/// AVX2; the 16 bytes at each row and column start readable.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn step_i8_avx2<const R: usize, const C: usize>(
    acc: &mut [[__m256i; C]; R],
    a: *const i8,
    lda: usize,
    b: *const i8,
    ldb: usize,
) {
    // SAFETY: the loads read 16 bytes at each row / column start, readable by the contract.
    unsafe {
        let mut av = [_mm256_setzero_si256(); R];
        for (r, v) in av.iter_mut().enumerate() {
            *v = _mm256_cvtepi8_epi16(_mm_loadu_si128(a.add(r * lda).cast()));
        }
        for q in 0..C {
            let bv = _mm256_cvtepi8_epi16(_mm_loadu_si128(b.add(q * ldb).cast()));
            for (acc_row, &x) in acc.iter_mut().zip(&av) {
                // i16 x i16 products of i8 values, summed in pairs: at most 2 * 128^2 = 2^15,
                // exact in i32.
                acc_row[q] = _mm256_add_epi32(acc_row[q], _mm256_madd_epi16(x, bv));
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// i8, AVX512-VNNI (256-bit)
// ---------------------------------------------------------------------------------------------

/// The AVX512-VNNI i8 kernel (see [`super::gemm_i8_i32`]).
///
/// `vpdpbusd` multiplies *unsigned* by signed bytes, so B is offset to `b + 128` (an XOR with
/// `0x80` after each load) and `128 * sum(row of A)` is subtracted at
/// the end; the intermediate sums may wrap, the final one is exact modulo 2^32 like the other
/// backends.
///
/// # Safety
///
/// The CPU must support AVX2, AVX512-VL and AVX512-VNNI. (The slice lengths are checked.)
pub(super) unsafe fn gemm_i8_i32_vnni(
    a: &[i8],
    bt: &[i8],
    c: &mut [i32],
    m: usize,
    n: usize,
    k: usize,
) {
    check_shapes(a.len(), bt.len(), c.len(), m, n, k);
    let row_sums = row_sums(a, m, k, k);
    run_tiles(a, bt, c, (m, n, k), TILING_VNNI, |t, rows, cols| {
        let sums = &row_sums[t.row..];
        // SAFETY: as in `gemm_i8_i32_avx2`, and `sums` has an entry for each of the tile's
        // rows; the caller guarantees the CPU features.
        unsafe { with_tile_shape!(tile_i8_vnni, rows, cols, (t, sums)) }
    });
}

/// The wrapping sums of the `m` rows of `k` elements of A (row stride `lda`): the VNNI
/// kernels' offset correction.
fn row_sums(a: &[i8], m: usize, k: usize, lda: usize) -> Vec<i32> {
    (0..m).map(|i| row_sum(&a[i * lda..i * lda + k])).collect()
}

/// The wrapping sum of a row of A.
fn row_sum(row: &[i8]) -> i32 {
    row.iter().fold(0i32, |s, &x| s.wrapping_add(i32::from(x)))
}

/// `acc + the sum of four u8(u) * i8(s) products in each i32 lane` (`vpdpbusd`, wrapping).
///
/// # Safety
///
/// The CPU must support AVX512-VL and AVX512-VNNI.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn vpdpbusd(acc: __m256i, u: __m256i, s: __m256i) -> __m256i {
    let mut acc = acc;
    // SAFETY: the caller guarantees the CPU runs the EVEX-encoded 256-bit `vpdpbusd`; the
    // instruction only reads and writes the three named vector registers.
    unsafe {
        asm!(
            "{{evex}} vpdpbusd {acc}, {u}, {s}",
            acc = inout(ymm_reg) acc,
            u = in(ymm_reg) u,
            s = in(ymm_reg) s,
            options(pure, nomem, nostack, preserves_flags),
        );
    }
    acc
}

/// As [`tile_i8_avx2`] with `vpdpbusd`; `sums[r]` is the sum of the whole row `r` of the
/// tile's A, whose correction is applied with the first K block.
///
/// # Safety
///
/// AVX2, AVX512-VL and AVX512-VNNI; the ranges of [`tile_i8_avx2`], and at least `R` sums.
#[target_feature(enable = "avx2")]
unsafe fn tile_i8_vnni<const R: usize, const C: usize>((t, sums): (TilePtrs<i8, i32>, &[i32])) {
    const W: usize = 32;
    debug_assert!(!t.packed, "the i8 tilings never pack B");
    // SAFETY: every access is within the ranges of the contract: the main loop reads whole
    // chunks below `kc`, the tail reads the padded stack buffers.
    // Padding is harmless: zero bytes of A times anything.
    unsafe {
        let flip = _mm256_set1_epi8(i8::MIN);
        let mut acc = [[_mm256_setzero_si256(); C]; R];
        let full = t.kc - t.kc % W;
        let (mut p, mut b) = (0, t.b);
        debug_assert_eq!(t.b_group, 1, "32-byte chunks are whole native tile rows");
        while p < full {
            step_i8_vnni::<R, C>(&mut acc, t.a.add(p), t.lda, b, t.b_ld, flip);
            b = b.add(t.b_step);
            p += W;
        }
        if p < t.kc {
            let pa: [[i8; W]; R] = pad_tail(t.a, t.lda, p, t.kc);
            let pb: [[i8; W]; C] = pad_tail(t.b, t.b_ld, p, t.kc);
            let pb = pb.as_ptr().cast();
            step_i8_vnni::<R, C>(&mut acc, pa.as_ptr().cast(), W, pb, W, flip);
        }
        let offset: [i32; R] = std::array::from_fn(|r| sums[r].wrapping_mul(128));
        store_i32::<R, C>(&acc, &offset, &t);
    }
}

/// One 32-element chunk of the VNNI tile; B chunks are XORed with `flip`.
///
/// # Safety
///
/// AVX2, AVX512-VL and AVX512-VNNI; the 32 bytes at each row and column start readable.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn step_i8_vnni<const R: usize, const C: usize>(
    acc: &mut [[__m256i; C]; R],
    a: *const i8,
    lda: usize,
    b: *const i8,
    ldb: usize,
    flip: __m256i,
) {
    // SAFETY: the loads read 32 bytes at each row / column start, readable by the contract;
    // `vpdpbusd`'s features are guaranteed by the caller.
    unsafe {
        let mut av = [_mm256_setzero_si256(); R];
        for (r, v) in av.iter_mut().enumerate() {
            *v = _mm256_loadu_si256(a.add(r * lda).cast());
        }
        for q in 0..C {
            let bu = _mm256_xor_si256(_mm256_loadu_si256(b.add(q * ldb).cast()), flip);
            for (acc_row, &x) in acc.iter_mut().zip(&av) {
                acc_row[q] = vpdpbusd(acc_row[q], bu, x);
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// f32, AVX2 + FMA
// ---------------------------------------------------------------------------------------------

/// The AVX2 + FMA f32 kernel (see [`super::gemm_f32`]).
///
/// # Safety
///
/// The CPU must support AVX2 and FMA. (The slice lengths are checked here.)
pub(super) unsafe fn gemm_f32_avx2_fma(
    a: &[f32],
    bt: &[f32],
    c: &mut [f32],
    m: usize,
    n: usize,
    k: usize,
) {
    check_shapes(a.len(), bt.len(), c.len(), m, n, k);
    run_tiles(a, bt, c, (m, n, k), TILING_F32, |t, rows, cols| {
        // SAFETY: as in `gemm_i8_i32_avx2`; the caller guarantees AVX2 and FMA.
        unsafe { with_tile_shape!(tile_f32_fma, rows, cols, t) }
    });
}

/// As [`tile_i8_avx2`] in f32.
///
/// # Safety
///
/// AVX2 and FMA; the ranges of [`tile_i8_avx2`] (in elements).
#[target_feature(enable = "avx2,fma")]
unsafe fn tile_f32_fma<const R: usize, const C: usize>(t: TilePtrs<f32, f32>) {
    const W: usize = 8;
    // SAFETY: every access is within the ranges of the contract: the main loop reads whole
    // chunks below `kc`, the tail reads the padded stack buffers (or the packed padding).
    // Zero padding in both A and B: the extra products are 0 * 0 = 0.
    unsafe {
        let mut acc = [[_mm256_setzero_ps(); C]; R];
        debug_assert_eq!(t.b_group, 1, "float B is never native");
        let full = t.kc - t.kc % W;
        let (mut p, mut b) = (0, t.b);
        while p < full {
            step_f32_fma::<R, C>(&mut acc, t.a.add(p), t.lda, b, t.b_ld);
            b = b.add(t.b_step);
            p += W;
        }
        if p < t.kc {
            let pa: [[f32; W]; R] = pad_tail(t.a, t.lda, p, t.kc);
            if t.packed {
                step_f32_fma::<R, C>(&mut acc, pa.as_ptr().cast(), W, b, t.b_ld);
            } else {
                let pb: [[f32; W]; C] = pad_tail(t.b, t.b_ld, p, t.kc);
                step_f32_fma::<R, C>(&mut acc, pa.as_ptr().cast(), W, pb.as_ptr().cast(), W);
            }
        }
        let zero = _mm256_setzero_ps();
        let mut group = [zero; 4];
        let mut cells = [(0usize, 0usize); 4];
        for_each_acc::<R, C>(|r, q, idx| {
            group[idx % 4] = acc[r][q];
            cells[idx % 4] = (r, q);
            if idx % 4 == 3 || idx + 1 == R * C {
                let sums = hsum4_ps(group);
                for (&(r, q), &sum) in cells.iter().zip(&sums).take(idx % 4 + 1) {
                    let dst = t.c.add(r * t.ldc + q);
                    *dst = if t.accumulate { *dst + sum } else { sum };
                }
                group = [zero; 4];
            }
        });
    }
}

/// One 8-element chunk of the f32 tile.
///
/// # Safety
///
/// AVX2 and FMA; the 8 floats at each row and column start readable.
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn step_f32_fma<const R: usize, const C: usize>(
    acc: &mut [[__m256; C]; R],
    a: *const f32,
    lda: usize,
    b: *const f32,
    ldb: usize,
) {
    // SAFETY: the loads read 8 floats at each row / column start, readable by the contract.
    unsafe {
        let mut av = [_mm256_setzero_ps(); R];
        for (r, v) in av.iter_mut().enumerate() {
            *v = _mm256_loadu_ps(a.add(r * lda));
        }
        for q in 0..C {
            let bv = _mm256_loadu_ps(b.add(q * ldb));
            for (acc_row, &x) in acc.iter_mut().zip(&av) {
                acc_row[q] = _mm256_fmadd_ps(x, bv, acc_row[q]);
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// i8 with native B (the matrix-vector product), AVX2 and AVX512-VNNI
// ---------------------------------------------------------------------------------------------

/// The AVX2 native-B kernel (see [`super::gemm_i8_native_b`]).
///
/// # Safety
///
/// The CPU must support AVX2; the caller has checked the shape and the slice lengths
/// ([`NativeBShape`]).
#[target_feature(enable = "avx2")]
pub(super) unsafe fn native_b_avx2(
    a: &[i8],
    b: &[i8],
    c: &mut [i32],
    shape: NativeBShape,
    accumulate: bool,
) {
    // SAFETY: forwarded contract.
    unsafe { native_b::<false>(a, b, c, shape, accumulate) }
}

/// The AVX512-VNNI native-B kernel (see [`super::gemm_i8_native_b`]): `vpdpbusd` with B
/// offset to unsigned, as in [`gemm_i8_i32_vnni`]. Built by Rust 1.89 or later, the 512-bit
/// [`native_b_zmm`] for every M; by older compilers, the 256-bit loop (M up to
/// [`super::NATIVE_B_STREAM_MAX_M`]; [`native_b_tiled_vnni`] above).
///
/// # Safety
///
/// The CPU must support AVX2, AVX512-VL and AVX512-VNNI (and so AVX512-F); the caller has
/// checked the shape and the slice lengths ([`NativeBShape`]).
#[target_feature(enable = "avx2")]
pub(super) unsafe fn native_b_vnni(
    a: &[i8],
    b: &[i8],
    c: &mut [i32],
    shape: NativeBShape,
    accumulate: bool,
) {
    if ZMM_BUILT {
        // SAFETY: forwarded contract (the VNNI backend's detection includes AVX512-F).
        unsafe { native_b_zmm(a, b, c, shape, accumulate) }
    } else {
        // SAFETY: forwarded contract.
        unsafe { native_b::<true>(a, b, c, shape, accumulate) }
    }
}

/// Whether this build has the 512-bit native-B kernel ([`native_b_zmm`]): compilers from
/// 1.89, where the AVX-512 intrinsics are stable. The MSRV's build (1.85) runs the 256-bit
/// [`native_b`] on VNNI CPUs too.
#[rustversion::since(1.89)]
pub(super) const ZMM_BUILT: bool = true;
/// See above.
#[rustversion::before(1.89)]
pub(super) const ZMM_BUILT: bool = false;

/// Rows of A the 512-bit native-B kernel runs together on each load of B: its accumulators
/// are `ROWS x 4` registers. Measured on this AMD EPYC guest (`cargo bench -p rknn-emu --bench
/// kernels`, rows of 576 bytes in cache): 2 rows 281, 3 rows 330 GMAC/s at M = 8; 4 rows ran
/// at 112, the compiler no longer keeping its 16 accumulators in registers.
#[rustversion::since(1.89)]
const ZMM_ROWS: usize = 3;

/// The native-B kernel on 512-bit registers, for every M: column block by column block of B,
/// the rows of A in groups of up to [`ZMM_ROWS`] ([`rows_zmm`]), while the first group
/// prefetches the next block, so that B still streams from memory once, front to back, and
/// every other group finds the block in cache. Above [`super::NATIVE_B_STREAM_MAX_M`] rows it
/// replaces the register tiles too ([`native_b_tiled_vnni`]): prompt chunks of the demo model
/// (pp128 on two emulated cores) went from 1382-1482 to 1764-2049 tok/s, and one thread over
/// B of 1536 x 576 from 186 to 406 GMAC/s at M = 128 (4096 x 4096: 166 -> 249).
///
/// Why (measured against [`native_b`] with the 256-bit `vpdpbusd`, single thread, 2026-12-01,
/// AMD EPYC guest): a 512-bit `vpdpbusd` does twice the work, several rows share each load of
/// B, and the products of a column group accumulate across every tile before one reduction.
/// The demo model's output head (N = 49152, K = 576: 28 MB of B, partly held by this guest's
/// 32 MB L3): M = 1 50 -> 61 GB/s of B, M = 2 37 -> 62 GB/s, M = 8 2.10 -> 1.05 ms, M = 32
/// 7.0 -> 3.0 ms. Truly from memory (288 MiB, `--dram` of the kernels bench) M = 1 is level
/// with the 256-bit kernel and M = 2 0.93 -> 0.97-1.08 of a plain read.
///
/// # Safety
///
/// AVX2, AVX512-F and AVX512-VNNI; the shape and lengths checked by the caller.
#[rustversion::since(1.89)]
#[target_feature(enable = "avx2,avx512f,avx512vnni")]
pub(super) unsafe fn native_b_zmm(
    a: &[i8],
    b: &[i8],
    c: &mut [i32],
    shape: NativeBShape,
    accumulate: bool,
) {
    const SK: usize = NATIVE_B_SK;
    let NativeBShape { m, n, k, sn, lda } = shape;
    // `vpdpbusd` multiplies unsigned by signed bytes: B is offset by 128 in registers, and
    // `sum (b + 128) a = sum b a + 128 sum a` is corrected with each row's sum.
    let mut on_stack = [0i32; super::shape::NATIVE_B_STREAM_MAX_M];
    let mut on_heap = Vec::new();
    let sums: &mut [i32] = if m <= on_stack.len() {
        &mut on_stack[..m]
    } else {
        on_heap.resize(m, 0);
        &mut on_heap
    };
    for (i, s) in sums.iter_mut().enumerate() {
        *s = row_sum(&a[i * lda..i * lda + k]);
    }
    let c = c.as_mut_ptr();
    for jb in 0..n / sn {
        // SAFETY: by the checked shape, B holds `n / sn` blocks of `k · sn` bytes.
        let block = unsafe { b.as_ptr().add(jb * k * sn) };
        let mut i = 0;
        while i < m {
            let r = (m - i).min(ZMM_ROWS);
            // Entries past the group's `r` rows repeat its last row; `R = r` leaves them unread.
            let row = |j: usize| a[(i + j).min(m - 1) * lda..].as_ptr();
            // Formed without dereferencing; inside C by the checked shape (`m · n` elements).
            let dst = |j: usize| c.wrapping_add((i + j).min(m - 1) * n + jb * sn);
            let sum = |j: usize| sums[(i + j).min(m - 1)];
            let group = RowGroup {
                block,
                tiles: k / SK,
                sn,
                accumulate,
                prefetch_next: i == 0,
            };
            // SAFETY: each row pointer has `k` readable bytes, the block `k · sn`, and each
            // destination `sn` writable elements (the checked shape); the CPU features are the
            // caller's contract.
            unsafe {
                match r {
                    3 => rows_zmm::<3>(
                        [row(0), row(1), row(2)],
                        [sum(0), sum(1), sum(2)],
                        [dst(0), dst(1), dst(2)],
                        group,
                    ),
                    2 => rows_zmm::<2>([row(0), row(1)], [sum(0), sum(1)], [dst(0), dst(1)], group),
                    _ if sn % 8 == 0 && sn / 8 <= SEQ_GROUPS => {
                        row_seq_zmm(row(0), sum(0), dst(0), group)
                    }
                    _ => rows_zmm::<1>([row(0)], [sum(0)], [dst(0)], group),
                }
            }
            i += r;
        }
    }
}

/// See above.
#[rustversion::before(1.89)]
pub(super) unsafe fn native_b_zmm(_: &[i8], _: &[i8], _: &mut [i32], _: NativeBShape, _: bool) {
    unreachable!("ZMM_BUILT is false: the 256-bit kernel runs");
}

/// What [`rows_zmm`] needs of one column block of native B.
#[rustversion::since(1.89)]
#[derive(Clone, Copy)]
struct RowGroup {
    /// The block: `tiles` tiles of `sn` columns × 32 bytes, each column's 32 K values
    /// contiguous.
    block: *const i8,
    tiles: usize,
    sn: usize,
    /// Add to C instead of overwriting it.
    accumulate: bool,
    /// Prefetch the next block (the first group of rows does, while the others find this
    /// block in cache).
    prefetch_next: bool,
}

/// Writes one row's eight sums of a column group from its four accumulators (lanes 0-7 of
/// `acc[q]` are column 2q's partial sums, lanes 8-15 column 2q+1's), less `128 · sum(row)`,
/// to `d` (added to what is there when `accumulate`).
///
/// # Safety
///
/// AVX2 and AVX512-F; `d` has 8 writable (and, to accumulate, readable) elements.
#[rustversion::since(1.89)]
#[target_feature(enable = "avx2,avx512f")]
unsafe fn store_group(
    acc: &[std::arch::x86_64::__m512i; 4],
    sum: i32,
    d: *mut i32,
    accumulate: bool,
) {
    use std::arch::x86_64::{_mm256_set1_epi32, _mm512_castsi512_si256, _mm512_extracti64x4_epi64};
    // SAFETY: the CPU features are the caller's contract, and `d`'s 8 elements.
    unsafe {
        let halves: [__m256i; 8] = std::array::from_fn(|h| match h % 2 {
            0 => _mm512_castsi512_si256(acc[h / 2]),
            _ => _mm512_extracti64x4_epi64::<1>(acc[h / 2]),
        });
        let mut v = _mm256_sub_epi32(reduce8(halves), _mm256_set1_epi32(sum.wrapping_shl(7)));
        if accumulate {
            v = _mm256_add_epi32(_mm256_loadu_si256(d.cast()), v);
        }
        _mm256_storeu_si256(d.cast(), v);
    }
}

/// Column groups of 8 whose accumulators [`row_seq_zmm`] keeps at once (4 × 4 registers).
#[rustversion::since(1.89)]
const SEQ_GROUPS: usize = 4;

/// One row of A (decode) against one column block of native B, read front to back: every
/// column group of a tile before the next tile, so B is one sequential stream the hardware
/// prefetchers follow at the memory's pace ([`rows_zmm`] walks the block once per group of
/// columns, a strided pattern that left a single thread at under half the streaming read).
/// The same products as [`rows_zmm`]`::<1>`, summed in another order: the same wrapping i32
/// sums, bit for bit.
///
/// # Safety
///
/// As [`rows_zmm`], and `sn` a multiple of 8 of at most `8 · SEQ_GROUPS`.
#[rustversion::since(1.89)]
#[target_feature(enable = "avx2,avx512f,avx512vnni")]
unsafe fn row_seq_zmm(row: *const i8, sum: i32, dst: *mut i32, g: RowGroup) {
    use std::arch::x86_64::{
        __m512i, _mm512_broadcast_i64x4, _mm512_dpbusd_epi32, _mm512_loadu_si512, _mm512_set1_epi8,
        _mm512_setzero_si512, _mm512_xor_si512,
    };
    const SK: usize = NATIVE_B_SK;
    let RowGroup {
        block,
        tiles,
        sn,
        accumulate,
        prefetch_next,
    } = g;
    let groups = sn / 8;
    let tile_len = sn * SK;
    let block_len = tiles * tile_len;
    // SAFETY: tile `t` is bytes `t · sn · 32 .. + sn · 32` of the block, group `cg` of it
    // 256 bytes at `cg · 256` (`cg < sn / 8`); the row's 32 bytes at `t · 32`; the
    // destination's `sn` elements: inside the contract's ranges.
    unsafe {
        let zero = _mm512_setzero_si512();
        let flip = _mm512_set1_epi8(i8::MIN);
        let mut acc = [[zero; 4]; SEQ_GROUPS];
        for t in 0..tiles {
            let tile = block.add(t * tile_len);
            if prefetch_next {
                // Two blocks ahead: one left a single thread waiting on memory (`--dram`:
                // 0.60 against 0.63 of the streaming read, 0.69 against 0.82 on two threads).
                prefetch_lines(block.wrapping_add(2 * block_len + t * tile_len), tile_len);
            }
            let a = _mm512_broadcast_i64x4(_mm256_loadu_si256(row.add(t * SK).cast()));
            for (cg, acc) in acc.iter_mut().enumerate().take(groups) {
                let cols = tile.add(cg * 8 * SK);
                for (q, acc) in acc.iter_mut().enumerate() {
                    let b: __m512i =
                        _mm512_xor_si512(_mm512_loadu_si512(cols.add(q * 64).cast()), flip);
                    *acc = _mm512_dpbusd_epi32(*acc, b, a);
                }
            }
        }
        for (cg, acc) in acc.iter().enumerate().take(groups) {
            store_group(acc, sum, dst.add(cg * 8), accumulate);
        }
    }
}

/// `R` rows of A against one column block of native B, in groups of 8 columns: a 512-bit load
/// holds two columns' 32 bytes of a tile, the row's 32 bytes are broadcast to both halves, and
/// each `vpdpbusd` adds 16 lanes of 4 products. The `R x 4` accumulators run over every tile;
/// one reduction per row and group gives the 8 sums, less `128 · sum(row)`. Wrapping i32 sums
/// in any order are the same sums: the result is [`native_b`]'s, bit for bit.
///
/// # Safety
///
/// AVX2, AVX512-F and AVX512-VNNI; each row `tiles · 32` readable bytes, the block
/// `tiles · sn · 32`, each destination `sn` writable elements. The next block's prefetches
/// may point past B: a prefetch never faults.
#[rustversion::since(1.89)]
#[target_feature(enable = "avx2,avx512f,avx512vnni")]
unsafe fn rows_zmm<const R: usize>(
    rows: [*const i8; R],
    sums: [i32; R],
    dst: [*mut i32; R],
    g: RowGroup,
) {
    use std::arch::x86_64::{
        __m512i, _mm512_broadcast_i64x4, _mm512_dpbusd_epi32, _mm512_loadu_si512, _mm512_set1_epi8,
        _mm512_setzero_si512, _mm512_xor_si512,
    };
    const SK: usize = NATIVE_B_SK;
    let RowGroup {
        block,
        tiles,
        sn,
        accumulate,
        prefetch_next,
    } = g;
    let block_len = tiles * sn * SK;
    // SAFETY: group `cg` of 8 columns reads bytes `t · sn · 32 + cg · 256 .. + 256` of the
    // block for each tile `t` (`cg · 8 + 8 <= sn`), 32 bytes at `t · 32` of each row, and
    // writes elements `cg · 8 .. + 8` of each destination: inside the contract's ranges.
    unsafe {
        let zero = _mm512_setzero_si512();
        let flip = _mm512_set1_epi8(i8::MIN);
        for cg in 0..sn / 8 {
            let mut acc = [[zero; 4]; R];
            for t in 0..tiles {
                let cols = block.add(t * sn * SK + cg * 8 * SK);
                if prefetch_next {
                    // Four lines per step: the whole next block over this block's steps
                    // (`sn / 8 · tiles` steps of 256 bytes).
                    prefetch_lines(block.wrapping_add(block_len + (cg * tiles + t) * 256), 256);
                }
                let b: [__m512i; 4] = std::array::from_fn(|q| {
                    _mm512_xor_si512(_mm512_loadu_si512(cols.add(q * 64).cast()), flip)
                });
                for (acc, row) in acc.iter_mut().zip(rows) {
                    let a = _mm512_broadcast_i64x4(_mm256_loadu_si256(row.add(t * SK).cast()));
                    for (acc, b) in acc.iter_mut().zip(b) {
                        *acc = _mm512_dpbusd_epi32(*acc, b, a);
                    }
                }
            }
            for ((acc, sum), dst) in acc.iter().zip(sums).zip(dst) {
                store_group(acc, sum, dst.add(cg * 8), accumulate);
            }
        }
    }
}

/// The AVX2 native-B kernel for many rows: [`tile_i8_avx2`] over B in place
/// ([`run_tiles_native_b`]).
///
/// # Safety
///
/// The CPU must support AVX2; the caller has checked the shape and the slice lengths
/// ([`NativeBShape`]).
pub(super) unsafe fn native_b_tiled_avx2(
    a: &[i8],
    b: &[i8],
    c: &mut [i32],
    shape: NativeBShape,
    accumulate: bool,
) {
    run_tiles_native_b(a, b, c, shape, accumulate, TILING_I8, |t, rows, cols| {
        // SAFETY: `run_tiles_native_b` hands out tiles inside the checked matrices with
        // strides matching `TILING_I8` (16-byte chunks, two per native tile row); the caller
        // guarantees AVX2.
        unsafe { with_tile_shape!(tile_i8_avx2, rows, cols, t) }
    });
}

/// The AVX512-VNNI native-B kernel for many rows: [`tile_i8_vnni`] over B in place
/// ([`run_tiles_native_b`]), the row sums of A taken once per call.
///
/// # Safety
///
/// The CPU must support AVX2, AVX512-VL and AVX512-VNNI; the caller has checked the shape and
/// the slice lengths ([`NativeBShape`]).
pub(super) unsafe fn native_b_tiled_vnni(
    a: &[i8],
    b: &[i8],
    c: &mut [i32],
    shape: NativeBShape,
    accumulate: bool,
) {
    let row_sums = row_sums(a, shape.m, shape.k, shape.lda);
    run_tiles_native_b(a, b, c, shape, accumulate, TILING_VNNI, |t, rows, cols| {
        let sums = &row_sums[t.row..];
        // SAFETY: as in `native_b_tiled_avx2`, and `sums` has an entry for each of the tile's
        // rows; the caller guarantees the CPU features.
        unsafe { with_tile_shape!(tile_i8_vnni, rows, cols, (t, sums)) }
    });
}

/// The sums of eight vectors of i32 lanes, as one vector (lane `r` = sum of `v[r]`), wrapping.
///
/// # Safety
///
/// AVX2.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn reduce8(v: [__m256i; 8]) -> __m256i {
    // Register-only intrinsics: `unsafe fn`s at the MSRV (1.85), safe inside this function
    // for newer compilers, hence the allowance.
    // SAFETY: AVX2 is available.
    #[allow(unused_unsafe)]
    unsafe {
        // Per 128-bit half: q0 = [sum v0, sum v1, sum v2, sum v3] of that half's lanes.
        let q0 = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
        let q1 = _mm256_hadd_epi32(_mm256_hadd_epi32(v[4], v[5]), _mm256_hadd_epi32(v[6], v[7]));
        let low_halves = _mm256_permute2x128_si256::<0x20>(q0, q1);
        let high_halves = _mm256_permute2x128_si256::<0x31>(q0, q1);
        _mm256_add_epi32(low_halves, high_halves)
    }
}

/// How far ahead of the tile being reduced the native-B kernel prefetches B, in bytes.
const PREFETCH_AHEAD: usize = 4096;

/// Prefetches the `len` bytes that lie [`PREFETCH_AHEAD`] bytes after `at`, one cache line
/// at a time. Prefetches never fault, and the addresses are formed with wrapping arithmetic,
/// so running past the end of B is harmless.
///
/// Why: on the Intel Xeon of a later development machine the hardware prefetchers alone
/// followed native B at 0.86 of a plain streaming read with one row of A and 0.66 with two;
/// with this, 1.17 and 0.97 (`cargo bench -p rknn-emu --bench kernels -- --dram`).
#[inline]
fn prefetch_ahead(at: *const i8, len: usize) {
    prefetch_lines(at.wrapping_add(PREFETCH_AHEAD), len);
}

/// Prefetches the `len` bytes at `at` into L1, one cache line at a time (never faults: see
/// [`prefetch_ahead`]).
#[inline]
fn prefetch_lines(ahead: *const i8, len: usize) {
    for line in (0..len).step_by(64) {
        // `_mm_prefetch` is an `unsafe fn` at the MSRV (1.85), safe for newer compilers.
        // SAFETY: SSE is part of x86-64; a prefetch is a hint that reads nothing
        // architecturally and cannot fault, whatever the address.
        #[allow(unused_unsafe)]
        unsafe {
            _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(line))
        };
    }
}

/// Tiles of native B whose products a pair of rows accumulates before reducing them.
const PAIR_TILES: usize = 4;

/// The native-B loop: for each column block of `sn`, for each row of A, every 32 x 32 tile
/// is reduced in groups of 8 columns (one 32-byte row of the tile per column) into one vector
/// of 8 sums, so B is read once, front to back.
///
/// # Safety
///
/// AVX2, and AVX512-VL + AVX512-VNNI when `VNNI`; the shape and lengths checked by the caller.
#[target_feature(enable = "avx2")]
unsafe fn native_b<const VNNI: bool>(
    a: &[i8],
    b: &[i8],
    c: &mut [i32],
    shape: NativeBShape,
    accumulate: bool,
) {
    const SK: usize = NATIVE_B_SK;
    let NativeBShape { m, n, k, sn, lda } = shape;
    let groups = sn / 8;
    // SAFETY: by the checked shape, row `i` of A has `k` readable bytes at `i * lda`, B has
    // `n * k` bytes (tile block `jb` at `jb * k * sn`, tile `t` of it `t * sn * 32` further,
    // tile row `r` 32 bytes at `r * 32`), and C has `m * n` elements; every load and store
    // below stays inside those ranges (`g * 8 + 8 <= sn`).
    unsafe {
        let zero = _mm256_setzero_si256();
        let flip = _mm256_set1_epi8(i8::MIN);
        let ones = _mm256_set1_epi8(1);
        for jb in 0..n / sn {
            let block = b.as_ptr().add(jb * k * sn);
            // VNNI, two rows at a time: one load of B serves both (groups of 4 columns, the two
            // rows' 4 sums reduced as one vector of 8).
            let pairs = if VNNI { m / 2 } else { 0 };
            for p in 0..pairs {
                let rows = [
                    a.as_ptr().add(2 * p * lda),
                    a.as_ptr().add((2 * p + 1) * lda),
                ];
                let mut acc = [zero; 8];
                let mut row_sum = [zero; 2];
                let tiles = k / SK;
                if p == 0 {
                    // The first pair reads this block of B from memory: tile by tile, front to
                    // back, as one stream the prefetchers follow.
                    for t in 0..tiles {
                        let tile = block.add(t * sn * SK);
                        prefetch_ahead(tile, sn * SK);
                        let a0 = _mm256_loadu_si256(rows[0].add(t * SK).cast());
                        let a1 = _mm256_loadu_si256(rows[1].add(t * SK).cast());
                        row_sum[0] = vpdpbusd(row_sum[0], ones, a0);
                        row_sum[1] = vpdpbusd(row_sum[1], ones, a1);
                        for (g, acc) in acc.iter_mut().enumerate().take(sn / 4) {
                            let mut v = [zero; 8];
                            for col in 0..4 {
                                let bp = tile.add((g * 4 + col) * SK);
                                let bu = _mm256_xor_si256(_mm256_loadu_si256(bp.cast()), flip);
                                v[col] = vpdpbusd(zero, bu, a0);
                                v[4 + col] = vpdpbusd(zero, bu, a1);
                            }
                            *acc = _mm256_add_epi32(*acc, reduce8(v));
                        }
                    }
                } else {
                    // Later pairs find the block in cache: the products of PAIR_TILES tiles
                    // accumulate unreduced before one horizontal reduction (the reduction, not
                    // the multiply, was most of the work per tile). Wrapping i32 sums in any
                    // order are the same sums.
                    let mut t0 = 0;
                    while t0 < tiles {
                        let t1 = (t0 + PAIR_TILES).min(tiles);
                        for t in t0..t1 {
                            let a0 = _mm256_loadu_si256(rows[0].add(t * SK).cast());
                            let a1 = _mm256_loadu_si256(rows[1].add(t * SK).cast());
                            row_sum[0] = vpdpbusd(row_sum[0], ones, a0);
                            row_sum[1] = vpdpbusd(row_sum[1], ones, a1);
                        }
                        for (g, acc) in acc.iter_mut().enumerate().take(sn / 4) {
                            let mut v = [zero; 8];
                            for t in t0..t1 {
                                let tile = block.add(t * sn * SK);
                                let a0 = _mm256_loadu_si256(rows[0].add(t * SK).cast());
                                let a1 = _mm256_loadu_si256(rows[1].add(t * SK).cast());
                                for col in 0..4 {
                                    let bp = tile.add((g * 4 + col) * SK);
                                    let b = _mm256_loadu_si256(bp.cast());
                                    let bu = _mm256_xor_si256(b, flip);
                                    v[col] = vpdpbusd(v[col], bu, a0);
                                    v[4 + col] = vpdpbusd(v[4 + col], bu, a1);
                                }
                            }
                            *acc = _mm256_add_epi32(*acc, reduce8(v));
                        }
                        t0 = t1;
                    }
                }
                // sum (b + 128) a = sum b a + 128 sum a, per row.
                let s = reduce8([row_sum[0], row_sum[1], zero, zero, zero, zero, zero, zero]);
                let lanes: [i32; 8] = std::mem::transmute(s);
                for (g, acc) in acc.iter().enumerate().take(sn / 4) {
                    let sums: [i32; 8] = std::mem::transmute(*acc);
                    for (r, sums) in sums.chunks_exact(4).enumerate() {
                        let i = 2 * p + r;
                        let dst = c.as_mut_ptr().add(i * n + jb * sn + g * 4);
                        for (col, &v) in sums.iter().enumerate() {
                            let v = v.wrapping_sub(lanes[r].wrapping_shl(7));
                            let d = dst.add(col);
                            *d = if accumulate { (*d).wrapping_add(v) } else { v };
                        }
                    }
                }
            }
            for i in 2 * pairs..m {
                let row = a.as_ptr().add(i * lda);
                let mut acc = [zero; 4];
                // VNNI: the lanes of `row_sum` add up to the sum of the row of A.
                let mut row_sum = zero;
                for t in 0..k / SK {
                    let ap = row.add(t * SK);
                    let tile = block.add(t * sn * SK);
                    if pairs == 0 && i == 0 {
                        prefetch_ahead(tile, sn * SK);
                    }
                    if VNNI {
                        let av = _mm256_loadu_si256(ap.cast());
                        row_sum = vpdpbusd(row_sum, ones, av);
                        for (g, acc) in acc.iter_mut().enumerate().take(groups) {
                            let mut v = [zero; 8];
                            for (r, v) in v.iter_mut().enumerate() {
                                let bp = tile.add((g * 8 + r) * SK);
                                let bu = _mm256_xor_si256(_mm256_loadu_si256(bp.cast()), flip);
                                *v = vpdpbusd(zero, bu, av);
                            }
                            *acc = _mm256_add_epi32(*acc, reduce8(v));
                        }
                    } else {
                        let a_lo = _mm256_cvtepi8_epi16(_mm_loadu_si128(ap.cast()));
                        let a_hi = _mm256_cvtepi8_epi16(_mm_loadu_si128(ap.add(16).cast()));
                        for (g, acc) in acc.iter_mut().enumerate().take(groups) {
                            let mut v = [zero; 8];
                            for (r, v) in v.iter_mut().enumerate() {
                                let bp = tile.add((g * 8 + r) * SK);
                                let b_lo = _mm256_cvtepi8_epi16(_mm_loadu_si128(bp.cast()));
                                let b_hi = _mm256_cvtepi8_epi16(_mm_loadu_si128(bp.add(16).cast()));
                                // Pairs of i8 x i8 products: at most 2^15, exact in i32.
                                *v = _mm256_add_epi32(
                                    _mm256_madd_epi16(b_lo, a_lo),
                                    _mm256_madd_epi16(b_hi, a_hi),
                                );
                            }
                            *acc = _mm256_add_epi32(*acc, reduce8(v));
                        }
                    }
                }
                // sum (b + 128) a = sum b a + 128 sum a: every lane subtracts 128 sum a.
                let offset = if VNNI {
                    let s = reduce8([row_sum, zero, zero, zero, zero, zero, zero, zero]);
                    let total = _mm256_broadcastd_epi32(_mm256_castsi256_si128(s));
                    _mm256_slli_epi32::<7>(total)
                } else {
                    zero
                };
                for (g, acc) in acc.iter().enumerate().take(groups) {
                    let dst = c.as_mut_ptr().add(i * n + jb * sn + g * 8);
                    let mut sum = _mm256_sub_epi32(*acc, offset);
                    if accumulate {
                        sum = _mm256_add_epi32(_mm256_loadu_si256(dst.cast()), sum);
                    }
                    _mm256_storeu_si256(dst.cast(), sum);
                }
            }
        }
    }
}
