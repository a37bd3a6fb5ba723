//! Relayout kernels shared by the SIMD backends: plain Rust over raw pointers, specialised on
//! the block width so every block moves as one fixed-size vector. The x86-64 backend inlines
//! them into `#[target_feature(enable = "avx2")]` wrappers (so LLVM emits AVX2); on aarch64
//! NEON is baseline and they are called directly. The visiting order is
//! [`for_each_block`]'s.

use std::ptr;

/// `$f::<_, WIDTH>(args)` for the common block widths, `$dyn(width, args)` for any other.
macro_rules! by_width {
    ($w:expr, $f:ident, $dynf:ident, ($($arg:expr),* $(,)?)) => {
        match $w {
            4 => $f::<_, 4>($($arg),*),
            8 => $f::<_, 8>($($arg),*),
            16 => $f::<_, 16>($($arg),*),
            32 => $f::<_, 32>($($arg),*),
            w => $dynf(w, $($arg),*),
        }
    };
}

/// Copies `nb` blocks of `SK` elements from each of `m` rows (`src` at row 0's first block,
/// rows `ld` apart) into the native layout at `dst` (block `b` of row `r` at
/// `dst + (b * m + r) * SK`).
///
/// # Safety
///
/// `src` valid for reads at `r * ld + b * SK .. + SK` and `dst` for writes of `nb * m * SK`
/// elements, not overlapping.
#[inline(always)]
unsafe fn gather_blocks<T: Copy, const SK: usize>(
    src: *const T,
    ld: usize,
    m: usize,
    nb: usize,
    dst: *mut T,
) {
    // SAFETY: every access is one of the ranges of the contract.
    unsafe {
        if m == 1 {
            // One row: the native layout is the row itself.
            ptr::copy_nonoverlapping(src, dst, nb * SK);
            return;
        }
        for_each_block!(m, nb, super::common::PACK_TILE, |r, b| {
            let s = src.add(r * ld + b * SK).cast::<[T; SK]>();
            let d = dst.add((b * m + r) * SK).cast::<[T; SK]>();
            d.write_unaligned(s.read_unaligned());
        });
    }
}

/// [`gather_blocks`] for a block width known only at run time.
///
/// # Safety
///
/// As [`gather_blocks`] with `SK = sk`.
#[inline(always)]
unsafe fn gather_blocks_dyn<T: Copy>(
    sk: usize,
    src: *const T,
    ld: usize,
    m: usize,
    nb: usize,
    dst: *mut T,
) {
    // SAFETY: every access is one of the ranges of the contract.
    unsafe {
        for b in 0..nb {
            for r in 0..m {
                ptr::copy_nonoverlapping(src.add(r * ld + b * sk), dst.add((b * m + r) * sk), sk);
            }
        }
    }
}

/// [`pack_a_native_i8`](super::pack_a_native_i8) without the checks.
///
/// # Safety
///
/// The parent's length checks hold.
#[inline(always)]
pub(super) unsafe fn pack_a_native_i8(
    q: &[i8],
    m: usize,
    k_pad: usize,
    k0: usize,
    kseg: usize,
    sk: usize,
    dst: &mut [i8],
) {
    let nb = kseg / sk;
    let (src, d) = (q.as_ptr().wrapping_add(k0), dst.as_mut_ptr());
    // SAFETY: `k0 + kseg <= k_pad` and `q.len() >= m * k_pad`, so every block of every row
    // is inside `q`; `dst.len() >= m * kseg = nb * m * sk`; `q` and `dst` are distinct
    // borrows.
    unsafe { by_width!(sk, gather_blocks, gather_blocks_dyn, (src, k_pad, m, nb, d)) }
}

/// Scatters the native `C` blocks of width `SN` into a row-major matrix: element `(r, j)`
/// (`c + ((j / SN) * m + r) * SN + j % SN`) to `out + r * ld + j`, as `f(out, c)` if
/// `ACC` else `c`.
///
/// # Safety
///
/// `c` valid for reads of `ceil(n / SN) * m * SN` elements, `out` for reads and writes at
/// `r * ld + j` for `r < m`, `j < n`, not overlapping `c`; rows of `out` do not overlap
/// (`ld >= n` when `m > 1`).
#[inline(always)]
unsafe fn scatter_blocks<T: Copy, const SN: usize, const ACC: bool>(
    c: *const T,
    m: usize,
    n: usize,
    out: *mut T,
    ld: usize,
    f: impl Fn(T, T) -> T,
) {
    // SAFETY: every access is one of the ranges of the contract.
    unsafe {
        if m == 1 {
            // One row: the native layout is the row itself (plus padding to a block).
            let (cs, os) = (
                std::slice::from_raw_parts(c, n),
                std::slice::from_raw_parts_mut(out, n),
            );
            for (o, &v) in os.iter_mut().zip(cs) {
                *o = if ACC { f(*o, v) } else { v };
            }
            return;
        }
        let (full, rem) = (n / SN, n % SN);
        for_each_block!(m, full, super::common::COLLECT_TILE, |r, jb| {
            let s = c.add((jb * m + r) * SN).cast::<[T; SN]>().read_unaligned();
            let d = out.add(r * ld + jb * SN).cast::<[T; SN]>();
            let v = if ACC {
                let mut o = d.read_unaligned();
                for (o, s) in o.iter_mut().zip(s) {
                    *o = f(*o, s);
                }
                o
            } else {
                s
            };
            d.write_unaligned(v);
        });
        if rem > 0 {
            for r in 0..m {
                let s = c.add((full * m + r) * SN);
                let d = out.add(r * ld + full * SN);
                for l in 0..rem {
                    let v = s.add(l).read();
                    d.add(l).write(if ACC { f(d.add(l).read(), v) } else { v });
                }
            }
        }
    }
}

/// [`scatter_blocks`] for a block width known only at run time.
///
/// # Safety
///
/// As [`scatter_blocks`] with `SN = sn`.
#[inline(always)]
unsafe fn scatter_blocks_dyn<T: Copy, const ACC: bool>(
    sn: usize,
    c: *const T,
    m: usize,
    n: usize,
    out: *mut T,
    ld: usize,
    f: impl Fn(T, T) -> T,
) {
    // SAFETY: every access is one of the ranges of the contract.
    unsafe {
        for r in 0..m {
            for j in 0..n {
                let v = c.add(((j / sn) * m + r) * sn + j % sn).read();
                let d = out.add(r * ld + j);
                d.write(if ACC { f(d.read(), v) } else { v });
            }
        }
    }
}

/// `scatter_blocks::<_, SN, !first>` for the widths of [`by_width`].
macro_rules! scatter {
    ($sn:expr, $first:expr, ($c:expr, $m:expr, $n:expr, $out:expr, $ld:expr, $f:expr)) => {
        match ($sn, $first) {
            (4, true) => scatter_blocks::<_, 4, false>($c, $m, $n, $out, $ld, $f),
            (4, false) => scatter_blocks::<_, 4, true>($c, $m, $n, $out, $ld, $f),
            (8, true) => scatter_blocks::<_, 8, false>($c, $m, $n, $out, $ld, $f),
            (8, false) => scatter_blocks::<_, 8, true>($c, $m, $n, $out, $ld, $f),
            (16, true) => scatter_blocks::<_, 16, false>($c, $m, $n, $out, $ld, $f),
            (16, false) => scatter_blocks::<_, 16, true>($c, $m, $n, $out, $ld, $f),
            (sn, true) => scatter_blocks_dyn::<_, false>(sn, $c, $m, $n, $out, $ld, $f),
            (sn, false) => scatter_blocks_dyn::<_, true>(sn, $c, $m, $n, $out, $ld, $f),
        }
    };
}

/// [`accumulate_c_native_i32`](super::accumulate_c_native_i32) without the checks.
///
/// # Safety
///
/// The parent's length checks hold.
#[inline(always)]
pub(super) unsafe fn accumulate_c_native_i32(
    c: &[i32],
    m: usize,
    n: usize,
    sn: usize,
    acc: &mut [i32],
    first: bool,
) {
    let (cp, ap) = (c.as_ptr(), acc.as_mut_ptr());
    // SAFETY: `c` holds `ceil(n / sn) * m * sn` elements and `acc` `m * n` (checked by the
    // caller); with `ld = n` the rows are disjoint; distinct borrows do not overlap.
    unsafe { scatter!(sn, first, (cp, m, n, ap, n, i32::wrapping_add)) }
}

/// [`accumulate_c_native_f32`](super::accumulate_c_native_f32) without the checks.
///
/// # Safety
///
/// The parent's length checks hold.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
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
    let (cp, op) = (c.as_ptr(), out.as_mut_ptr().wrapping_add(n0));
    // SAFETY: `c` holds `ceil(n / sn) * m * sn` elements and `out` `(m - 1) * ld + n0 + n`
    // with `ld >= n0 + n` for `m > 1` (checked by the caller), so the rows at `n0` are
    // disjoint and inside `out`; distinct borrows do not overlap.
    unsafe { scatter!(sn, first, (cp, m, n, op, ld, |a: f32, b: f32| a + b)) }
}

/// [`scale_out`](super::scale_out) after the checks: safe code, since slicing each row once
/// costs nothing next to the row and the zipped loop vectorises.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub(super) fn scale_out(
    acc: &[i32],
    m: usize,
    n: usize,
    row_scales: &[f32],
    ch_scales: &[f32],
    out: &mut [f32],
    ld: usize,
    n0: usize,
) {
    let cs = &ch_scales[..n];
    for r in 0..m {
        let a = &acc[r * n..][..n];
        let o = &mut out[r * ld + n0..][..n];
        let rs = row_scales[r];
        for ((o, &a), &c) in o.iter_mut().zip(a).zip(cs) {
            *o = (a as f32 * rs) * c;
        }
    }
}
