//! Cache blocking shared by the SIMD backends: the loop nest over register tiles, the packing
//! of `Bt` panels, and the pointer bundle handed to the arch-specific tile kernels.
//!
//! Loop nest, outermost first:
//!
//! 1. column panels of `Bt` of about [`PANEL_BYTES`] per K block, so a panel stays in L2
//!    while every row of A goes past it;
//! 2. K blocks of [`K_BLOCK_BYTES`] per row (only when `M > 1`), so the few rows of A a tile
//!    reads stay in L1 while the tile moves along the panel; later blocks add to C;
//! 3. row blocks of `Tiling::rows` rows (leftover rows as one smaller block, a single leftover
//!    row as wide `1 x single_cols` tiles when B is not packed);
//! 4. column tiles of `Tiling::cols` columns: one call of the tile kernel, which keeps all
//!    `rows x cols` dot products in registers over the K block.
//!
//! When `M >= Tiling::pack_min_rows` every (panel, K block) of `Bt` is first copied into a
//! 64-byte aligned buffer in the order the tile kernel reads it (chunk by chunk, the tile's
//! columns next to each other, the last chunk zero-padded), so B streams from one aligned
//! sequential buffer. The copy costs `N * K` element moves per call, which only pays off for
//! many rows: measured on a Zen 4 core it speeds the f32 kernel up by 10-30 % from about
//! 32-64 rows on (hence 64), and did not help the i8 kernels at any `M` up to 512, so they
//! never pack.

use std::ops::Range;

use super::shape::{NATIVE_B_SK, NativeBShape};

/// Register-tile geometry of a tile kernel.
#[derive(Debug, Clone, Copy)]
pub(super) struct Tiling {
    /// Rows of the main tile.
    pub rows: usize,
    /// Columns of the main tile.
    pub cols: usize,
    /// Columns of the tile for a single leftover row when B is not packed (`M = 1` above
    /// all).
    pub single_cols: usize,
    /// Elements of one vector chunk along K.
    pub width: usize,
    /// From this many rows of A on, panels of `Bt` are packed (`usize::MAX`: never).
    pub pack_min_rows: usize,
}

/// Bytes of `Bt` in one column panel (per K block), to stay in a per-core L2 cache.
const PANEL_BYTES: usize = 256 * 1024;

/// Bytes of each row of A and Bt in one K block when `M > 1`: a block of up to 4 rows of A is
/// then at most 16 KiB, half a 32 KiB L1 data cache. A power of two, so a multiple of every
/// vector width.
const K_BLOCK_BYTES: usize = 4096;

/// The pointers and strides of one register tile, for the arch-specific tile kernels.
///
/// Chunk `s` (elements `s*W..(s+1)*W` of the K block) of row `r` of A is at
/// `a + r*lda + s*W`, of column `q` of B at `b + (s / b_group)*b_step + (s % b_group)*W +
/// q*b_ld`: runs of `b_group` chunks are contiguous (one chunk, except in native B read with
/// chunks narrower than its 32-byte tile rows).
#[derive(Debug, Clone, Copy)]
pub(super) struct TilePtrs<T, U> {
    /// First row `i` of the tile in A and C.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub row: usize,
    /// `A[i, p0]`, where `p0` is the start of the K block.
    pub a: *const T,
    /// Row stride of A (K).
    pub lda: usize,
    /// The first chunk of the tile's first column of B (in `Bt` or the packed panel).
    pub b: *const T,
    /// Distance between the tile's columns: K, or the vector width when packed.
    pub b_ld: usize,
    /// Distance between runs of `b_group` chunks of a column: the vector width, `cols` widths
    /// when packed, the tile block (`sn * 32`) in native B.
    pub b_step: usize,
    /// Chunks of a column that are contiguous in B: 1, or `32 / W` in native B (whose K blocks
    /// are then multiples of 32, so no partial run).
    pub b_group: usize,
    /// Whether B is packed (its last chunk is then already zero-padded).
    pub packed: bool,
    /// Elements of each row in this K block.
    pub kc: usize,
    /// `C[i, j]`.
    pub c: *mut U,
    /// Row stride of C (N).
    pub ldc: usize,
    /// Add to C instead of overwriting it.
    pub accumulate: bool,
    /// Whether this is the first K block of the call: kernels that correct their sums by a
    /// per-row offset over the whole K (the VNNI kernel) apply it here.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub first_block: bool,
}

/// Storage for packed panels, aligned to 64 bytes.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([u8; 64]);

/// Runs the loop nest over the `m x n` output of `A [m, k] * Bt [n, k]^T` (slices already
/// checked to hold the matrices), calling `tile(ptrs, rows, cols)` for every register tile.
pub(super) fn run_tiles<T: Copy + Default, U>(
    a: &[T],
    bt: &[T],
    c: &mut [U],
    (m, n, k): (usize, usize, usize),
    t: Tiling,
    mut tile: impl FnMut(TilePtrs<T, U>, usize, usize),
) {
    debug_assert!(a.len() >= m * k && bt.len() >= n * k && c.len() >= m * n);
    if m == 0 || n == 0 {
        return;
    }
    let elem = size_of::<T>();
    let packing = m >= t.pack_min_rows;
    let kc_max = if m > 1 {
        (K_BLOCK_BYTES / elem).min(k)
    } else {
        k
    }
    .max(1);
    let k_blocks = k.div_ceil(kc_max).max(1);
    let kc_padded = kc_max.div_ceil(t.width) * t.width;
    let align = if packing { t.cols } else { t.single_cols };
    let panel = ((PANEL_BYTES / (kc_padded * elem)) / align * align).max(align);

    // Pack buffer of `panel x kc_padded` elements, aligned to 64 bytes.
    let mut lines = Vec::new();
    let mut pack: &mut [T] = &mut [];
    if packing {
        lines = vec![Line([0; 64]); (panel * kc_padded * elem).div_ceil(64)];
        // SAFETY: `lines` is a live, exclusively borrowed allocation of at least
        // `panel * kc_padded * size_of::<T>()` bytes aligned to 64, and `T` is a plain
        // numeric type (i8 or f32 here) for which every bit pattern, in particular the zero
        // bytes it holds, is valid.
        pack = unsafe {
            std::slice::from_raw_parts_mut(lines.as_mut_ptr().cast::<T>(), panel * kc_padded)
        };
    }

    let cp = c.as_mut_ptr();
    for j0 in (0..n).step_by(panel) {
        let cols_range = j0..(j0 + panel).min(n);
        for kb in 0..k_blocks {
            let p0 = kb * kc_max;
            let kc = (k - p0).min(kc_max);
            let accumulate = kb > 0;
            if packing {
                pack_panel(bt, k, cols_range.clone(), p0..p0 + kc, t, pack);
            }
            let mut i = 0;
            while i < m {
                let rows = if m - i >= t.rows { t.rows } else { m - i };
                let tile_cols = if rows == 1 && !packing {
                    t.single_cols
                } else {
                    t.cols
                };
                for j in cols_range.clone().step_by(tile_cols) {
                    let cols = tile_cols.min(cols_range.end - j);
                    let (b, b_ld, b_step) = if packing {
                        // Offset of the column group: full groups of `t.cols` columns before.
                        let chunks = kc.div_ceil(t.width);
                        let off = (j - j0) * chunks * t.width;
                        (pack[off..].as_ptr(), t.width, cols * t.width)
                    } else {
                        (bt[j * k + p0..].as_ptr(), k, t.width)
                    };
                    let ptrs = TilePtrs {
                        row: i,
                        a: a[i * k + p0..].as_ptr(),
                        lda: k,
                        b,
                        b_ld,
                        b_step,
                        b_group: 1,
                        packed: packing,
                        kc,
                        // SAFETY: `i * n + j` is inside the checked `m x n` matrix C.
                        c: unsafe { cp.add(i * n + j) },
                        ldc: n,
                        accumulate,
                        first_block: kb == 0,
                    };
                    tile(ptrs, rows, cols);
                }
                i += rows;
            }
        }
    }
    drop(lines);
}

/// As [`run_tiles`] with B in the NPU's native int8 layout `[n / sn][k / 32][sn][32]` (see
/// [`super::gemm_i8_native_b`]) read in place, and A with a row stride: the loop nest over
/// column panels of whole tile blocks (`sn` columns), K blocks, row blocks and column tiles
/// inside one tile block, whose columns are 32 bytes apart and whose 32-byte chunks are one
/// tile block (`sn * 32` bytes) apart. No unpacking into `[N, K]`, which for the many rows of
/// a prompt chunk was a copy of all of B per call. `t.width` must divide 32; with `accumulate`
/// every tile adds to C.
pub(super) fn run_tiles_native_b<U>(
    a: &[i8],
    b: &[i8],
    c: &mut [U],
    shape: NativeBShape,
    accumulate: bool,
    t: Tiling,
    mut tile: impl FnMut(TilePtrs<i8, U>, usize, usize),
) {
    const SK: usize = NATIVE_B_SK;
    let NativeBShape { m, n, k, sn, lda } = shape;
    debug_assert!(SK % t.width == 0 && k % SK == 0 && n % sn == 0);
    debug_assert!(c.len() >= m * n && b.len() >= n * k);
    if m == 0 || n == 0 || k == 0 {
        return;
    }
    // A multiple of 32, as K_BLOCK_BYTES and k are.
    let kc_max = K_BLOCK_BYTES.min(k);
    let k_blocks = k.div_ceil(kc_max);
    let blocks = n / sn;
    let panel_blocks = (PANEL_BYTES / (kc_max * sn)).max(1);
    let cp = c.as_mut_ptr();
    for jb0 in (0..blocks).step_by(panel_blocks) {
        let panel = jb0..(jb0 + panel_blocks).min(blocks);
        for kb in 0..k_blocks {
            let p0 = kb * kc_max;
            let kc = (k - p0).min(kc_max);
            let mut i = 0;
            while i < m {
                let rows = t.rows.min(m - i);
                let tile_cols = if rows == 1 { t.single_cols } else { t.cols };
                for jb in panel.clone() {
                    for q in (0..sn).step_by(tile_cols) {
                        let cols = tile_cols.min(sn - q);
                        let ptrs = TilePtrs {
                            row: i,
                            a: a[i * lda + p0..].as_ptr(),
                            lda,
                            // Column q of tile block jb, from its chunk p0 / 32 on.
                            b: b[jb * k * sn + p0 * sn + q * SK..].as_ptr(),
                            b_ld: SK,
                            b_step: sn * SK,
                            b_group: SK / t.width,
                            packed: false,
                            kc,
                            // SAFETY: `i * n + jb * sn + q` is inside the `m x n` matrix C.
                            c: unsafe { cp.add(i * n + jb * sn + q) },
                            ldc: n,
                            accumulate: accumulate || kb > 0,
                            first_block: kb == 0,
                        };
                        tile(ptrs, rows, cols);
                    }
                }
                i += rows;
            }
        }
    }
}

/// Packs `Bt[cols, ks]` into `out`: column groups of `t.cols` (the last one possibly
/// narrower), each chunk by chunk with the group's columns side by side, the last chunk
/// zero-padded to `t.width`.
fn pack_panel<T: Copy + Default>(
    bt: &[T],
    k: usize,
    cols: Range<usize>,
    ks: Range<usize>,
    t: Tiling,
    out: &mut [T],
) {
    // A compile-time chunk width turns the chunk copies into a few vector moves.
    match t.width {
        4 => pack_panel_w::<T, 4>(bt, k, cols, ks, t.cols, out),
        8 => pack_panel_w::<T, 8>(bt, k, cols, ks, t.cols, out),
        16 => pack_panel_w::<T, 16>(bt, k, cols, ks, t.cols, out),
        32 => pack_panel_w::<T, 32>(bt, k, cols, ks, t.cols, out),
        w => unreachable!("no packing for chunks of {w}"),
    }
}

/// [`pack_panel`] for chunks of `W` elements and column groups of `group`.
fn pack_panel_w<T: Copy + Default, const W: usize>(
    bt: &[T],
    k: usize,
    cols: Range<usize>,
    ks: Range<usize>,
    group: usize,
    out: &mut [T],
) {
    let chunks = ks.len().div_ceil(W);
    for (g, jg) in cols.clone().step_by(group).enumerate() {
        let group_cols = group.min(cols.end - jg);
        let dst = &mut out[g * group * chunks * W..][..group_cols * chunks * W];
        for q in 0..group_cols {
            let src = &bt[(jg + q) * k..][ks.clone()];
            let mut src_chunks = src.chunks_exact(W);
            let dst_chunks = dst.chunks_exact_mut(W).skip(q).step_by(group_cols);
            for (d, s) in dst_chunks.zip(&mut src_chunks) {
                let d: &mut [T; W] = d.try_into().expect("chunks_exact_mut");
                *d = s.try_into().expect("chunks_exact");
            }
            let rest = src_chunks.remainder();
            if !rest.is_empty() {
                let last = &mut dst[((chunks - 1) * group_cols + q) * W..][..W];
                last[..rest.len()].copy_from_slice(rest);
                last[rest.len()..].fill(T::default());
            }
        }
    }
}

/// Copies elements `p..len` (fewer than `W`) of `R` rows of stride `ld` starting at `src`
/// into zero-padded buffers of one vector each.
///
/// # Safety
///
/// Each row `src[r*ld..r*ld + len]` must be readable, and `p <= len <= p + W`.
#[inline(always)]
pub(super) unsafe fn pad_tail<T: Copy + Default, const R: usize, const W: usize>(
    src: *const T,
    ld: usize,
    p: usize,
    len: usize,
) -> [[T; W]; R] {
    let mut out = [[T::default(); W]; R];
    debug_assert!(p <= len && len - p <= W);
    for (r, row) in out.iter_mut().enumerate() {
        // SAFETY: `src[r*ld + p..r*ld + len]` is readable by the contract and fits in `row`.
        unsafe { std::ptr::copy_nonoverlapping(src.add(r * ld + p), row.as_mut_ptr(), len - p) };
    }
    out
}

/// `$kernel::<R, C>($arg)` for the run-time tile shape `($rows, $cols)`, for the shapes
/// [`run_tiles`] produces with main tiles of at most 4 x 4 and single-row tiles of at most 8.
macro_rules! with_tile_shape {
    ($kernel:ident, $rows:expr, $cols:expr, $arg:expr) => {
        match ($rows, $cols) {
            (4, 4) => $kernel::<4, 4>($arg),
            (4, 3) => $kernel::<4, 3>($arg),
            (4, 2) => $kernel::<4, 2>($arg),
            (4, 1) => $kernel::<4, 1>($arg),
            (3, 4) => $kernel::<3, 4>($arg),
            (3, 3) => $kernel::<3, 3>($arg),
            (3, 2) => $kernel::<3, 2>($arg),
            (3, 1) => $kernel::<3, 1>($arg),
            (2, 4) => $kernel::<2, 4>($arg),
            (2, 3) => $kernel::<2, 3>($arg),
            (2, 2) => $kernel::<2, 2>($arg),
            (2, 1) => $kernel::<2, 1>($arg),
            (1, 8) => $kernel::<1, 8>($arg),
            (1, 7) => $kernel::<1, 7>($arg),
            (1, 6) => $kernel::<1, 6>($arg),
            (1, 5) => $kernel::<1, 5>($arg),
            (1, 4) => $kernel::<1, 4>($arg),
            (1, 3) => $kernel::<1, 3>($arg),
            (1, 2) => $kernel::<1, 2>($arg),
            (1, 1) => $kernel::<1, 1>($arg),
            (rows, cols) => unreachable!("no {rows}x{cols} tile"),
        }
    };
}
pub(super) use with_tile_shape;
