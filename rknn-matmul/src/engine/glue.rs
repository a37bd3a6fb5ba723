//! Host glue kernels of the GEMM engine: per-row int8 quantisation of activations, packing of
//! the `A` operand into the NPU's native layout, and collection of the native `C` output
//! (exact i32 accumulation across K segments, dequantisation, f32 accumulation).
//!
//! # Backends
//!
//! | backend | arch | how |
//! |---|---|---|
//! | `scalar` | any | plain loops ([`scalar`]), the reference |
//! | `avx2` | x86-64 | AVX2 intrinsics, F16C `vcvtps2ph` for f16 (needs `avx2` and `f16c`) |
//! | `neon` | aarch64 | NEON intrinsics, `fcvtn` (via `asm!`) for f16 (NEON is baseline) |
//!
//! The CPU is probed once per process; [`backend`] names the implementation the functions of
//! this module run. Every backend produces **bit-identical** results: the kernels only move
//! data, add integers, or apply one correctly rounded IEEE operation per element in a fixed
//! order (no FMA contraction, no reassociation), so SIMD lanes compute exactly what the scalar
//! loop computes. One exception: when an f32 multiply or add in [`scale_out`] or
//! [`accumulate_c_native_f32`] meets NaN operands, the result is a NaN on every backend but its
//! payload is not specified (Rust lets the compiler commute the operands, and x86 and Arm
//! return the first NaN operand). The int8 path has no such case (NaN quantises to 0) and the
//! f16 conversion keeps payloads exactly.
//!
//! # Choosing a backend
//!
//! As every host kernel of the SDK ([`rknn_chip::kernel`]): the fastest this CPU runs, unless
//! `RKNN_KERNEL_GLUE` (or, for every component at once, `RKNN_KERNEL`) names another, e.g.
//! `RKNN_KERNEL_GLUE=scalar` to rule out a SIMD bug. [`kernel_choice`] says what was chosen
//! and why (`rknn-info --kernels` prints it).
//!
//! # Layouts
//!
//! The NPU's native `A` layout for a K segment of `kseg` columns is `[kseg / sk, m, sk]`:
//! element `(r, c)` (column `c` relative to the segment start) lives at
//! `((c / sk) * m + r) * sk + c % sk`. The native `C` layout is `[ceil(n / sn), m, sn]`:
//! element `(r, j)` at `((j / sn) * m + r) * sn + j % sn`. On RK3588 `sk` is 16 for i8 and 8
//! for f16, `sn` is 4 for i32 and f32 outputs.
//!
//! # Panics
//!
//! Every function checks its slice lengths and layout parameters with `assert!` and panics on
//! a mismatch (a misuse by the engine, never a data-dependent condition). Slices may be longer
//! than needed; only the described prefix is read or written.

use std::sync::OnceLock;

use rknn_chip::KernelChoice;

use common::{add, check_len, check_out, check_pack_a, check_quantize, mul, native_c_len};

/// Runs `$body` for every block `($r, $b)` (`r < m`, `b < nb`) of a relayout between a
/// row-major matrix and a native layout (`[nb, m, width]`), tile by tile: `row_tile` rows by
/// `block_tile` blocks, and inside a tile groups of 4 rows, each group visiting its blocks
/// in order and, per block, its 4 rows (on RK3588 a block row is 16 bytes, so those 4 rows
/// are one 64-byte line of the native buffer).
///
/// Both sides of the relayout stride by 4 KiB or more per step (a row of `A` or `C`, a block
/// of the native buffer), so the tile shape trades TLB reach against L1 set conflicts; the
/// constants [`PACK_TILE`], [`PACK_F16_TILE`] and [`COLLECT_TILE`] are the best measured on
/// the x86 bench machine (see `docs/engine-glue-performance.md`).
macro_rules! for_each_block {
    ($m:expr, $nb:expr, $tile:expr, |$r:ident, $b:ident| $body:block) => {{
        let (m, nb): (usize, usize) = ($m, $nb);
        let (row_tile, block_tile): (usize, usize) = $tile;
        let mut r0 = 0;
        while r0 < m {
            let r_end = r0.saturating_add(row_tile).min(m);
            let mut b0 = 0;
            while b0 < nb {
                let b_end = b0.saturating_add(block_tile).min(nb);
                let mut g = r0;
                while g < r_end {
                    let g_end = (g + 4).min(r_end);
                    if g_end - g == 4 {
                        for $b in b0..b_end {
                            for rr in 0..4 {
                                let $r = g + rr;
                                $body
                            }
                        }
                    } else {
                        for $b in b0..b_end {
                            for $r in g..g_end {
                                $body
                            }
                        }
                    }
                    g = g_end;
                }
                b0 = b_end;
            }
            r0 = r_end;
        }
    }};
}

mod common;
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
mod fast;
pub(crate) mod fwht;
#[cfg(target_arch = "aarch64")]
mod neon;
pub mod scalar;
#[cfg(target_arch = "x86_64")]
mod x86;

/// One implementation of the kernels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Backend {
    Scalar,
    #[cfg(target_arch = "x86_64")]
    Avx2,
    #[cfg(target_arch = "aarch64")]
    Neon,
}

impl Backend {
    /// Every backend compiled for this architecture, the reference first.
    const ALL: &'static [Backend] = &[
        Backend::Scalar,
        #[cfg(target_arch = "x86_64")]
        Backend::Avx2,
        #[cfg(target_arch = "aarch64")]
        Backend::Neon,
    ];

    fn name(self) -> &'static str {
        match self {
            Backend::Scalar => "scalar",
            #[cfg(target_arch = "x86_64")]
            Backend::Avx2 => "avx2",
            #[cfg(target_arch = "aarch64")]
            Backend::Neon => "neon",
        }
    }

    /// The fastest backend this CPU can run.
    fn best() -> Backend {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2")
            && std::arch::is_x86_feature_detected!("f16c")
        {
            return Backend::Avx2;
        }
        #[cfg(target_arch = "aarch64")]
        if std::arch::is_aarch64_feature_detected!("neon") {
            return Backend::Neon;
        }
        Backend::Scalar
    }
}

/// The component name of the glue in the kernel convention ([`rknn_chip::kernel`]).
pub const KERNEL_COMPONENT: &str = "glue";

/// The backend chosen on the first call, and why ([`rknn_chip::kernel`]).
pub fn kernel_choice() -> &'static KernelChoice {
    static CHOICE: OnceLock<KernelChoice> = OnceLock::new();
    CHOICE.get_or_init(|| {
        let compiled: Vec<&'static str> = Backend::ALL.iter().map(|b| b.name()).collect();
        let best = Backend::best();
        // Every backend up to the best one runs (NEON is baseline on aarch64; AVX2 is
        // detected with F16C).
        let available: Vec<&'static str> = Backend::ALL
            .iter()
            .take_while(|&&b| b != best)
            .chain(std::iter::once(&best))
            .map(|b| b.name())
            .collect();
        let choice = KernelChoice::from_env(KERNEL_COMPONENT, &compiled, &available);
        choice.warn();
        choice
    })
}

fn selected() -> Backend {
    static SELECTED: OnceLock<Backend> = OnceLock::new();
    *SELECTED.get_or_init(|| {
        let name = kernel_choice().selected;
        Backend::ALL
            .iter()
            .copied()
            .find(|b| b.name() == name)
            .unwrap_or(Backend::Scalar)
    })
}

/// Which implementation the functions of this module run: `"avx2"`, `"neon"` or `"scalar"`.
pub fn backend() -> &'static str {
    selected().name()
}

/// Symmetric per-row int8 quantisation of `x` (`[m, k]` row-major) into `q` (`[m, k_pad]`
/// row-major) and `scales` (`[m]`).
///
/// For each row `r`: `amax` is the largest `|x|` over the row's non-NaN values;
/// `scales[r] = amax / 127.0` (0.0 for a row of zeros); with `inv = 127.0f32 / amax` computed
/// once per row in f32, `q[r*k_pad + c] = clamp(round_ties_even(x * inv), -127, 127)` for
/// `c < k` (the product is one f32 multiply) and 0 for `k <= c < k_pad`. NaN quantises to 0;
/// the clamp saturates, so the result is never -128 and never wraps.
///
/// `x * inv` cannot round above 127 for a finite `amax` whose reciprocal is finite
/// (`|x * inv| <= 127 * (1 + 2^-24)`), but a subnormal `amax` makes `inv` infinite and
/// `amax = inf` makes it 0: then the clamp, respectively the NaN rule, decide.
///
/// # Panics
///
/// If `k_pad < k` or a slice is shorter than `m * k` (`x`), `m * k_pad` (`q`), `m` (`scales`).
pub fn quantize_rows(
    x: &[f32],
    m: usize,
    k: usize,
    k_pad: usize,
    q: &mut [i8],
    scales: &mut [f32],
) {
    check_quantize(x, m, k, k_pad, q, scales);
    match selected() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the lengths are checked above; `Avx2` is selected only if the CPU has AVX2
        // and F16C.
        Backend::Avx2 => unsafe { x86::quantize_rows(x, m, k, k_pad, q, scales) },
        #[cfg(target_arch = "aarch64")]
        // SAFETY: the lengths are checked above.
        Backend::Neon => unsafe { neon::quantize_rows(x, m, k, k_pad, q, scales) },
        Backend::Scalar => scalar::quantize_rows(x, m, k, k_pad, q, scales),
    }
}

/// [`Rotation::apply_rows`](super::Rotation::apply_rows) on the selected backend (the same
/// operations in the same order on each, so the same bits).
pub(crate) fn rotate_rows(signs: &[u64], mix: Option<&[f32]>, k: usize, x: &mut [f32]) {
    match selected() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Avx2` is selected only if the CPU has AVX2; the body is safe code.
        Backend::Avx2 => unsafe { x86::rotate_rows(signs, mix, k, x) },
        _ => fwht::rotate_rows(signs, mix, k, x),
    }
}

/// Packs columns `k0..k0 + kseg` of `q` (`[m, k_pad]` row-major i8) into the NPU's native `A`
/// layout `[kseg / sk, m, sk]`: element `(r, c)` (`c` relative to `k0`) goes to
/// `dst[((c / sk) * m + r) * sk + c % sk]`.
///
/// # Panics
///
/// If `sk == 0`, `kseg` is not a multiple of `sk`, `k0 + kseg > k_pad`, `q` is shorter than
/// `m * k_pad` or `dst` shorter than `m * kseg`.
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
        add(k0, kseg) <= k_pad,
        "glue: columns {k0}..{} exceed k_pad = {k_pad}",
        k0 + kseg
    );
    check_pack_a(q.len(), m, k_pad, kseg, sk, dst.len());
    match selected() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the lengths are checked above; `Avx2` is selected only if the CPU has AVX2.
        Backend::Avx2 => unsafe { x86::pack_a_native_i8(q, m, k_pad, k0, kseg, sk, dst) },
        #[cfg(target_arch = "aarch64")]
        // SAFETY: the lengths are checked above.
        Backend::Neon => unsafe { fast::pack_a_native_i8(q, m, k_pad, k0, kseg, sk, dst) },
        Backend::Scalar => scalar::pack_a_native_i8(q, m, k_pad, k0, kseg, sk, dst),
    }
}

/// Reads the native `C` output `c` (`[ceil(n / sn), m, sn]` i32, element `(r, j)` at
/// `((j / sn) * m + r) * sn + j % sn`) into `acc` (`[m, n]` row-major): `acc = c` if `first`,
/// else `acc = acc.wrapping_add(c)`, the exact integer sum across K segments.
///
/// # Panics
///
/// If `sn == 0`, `c` is shorter than `ceil(n / sn) * m * sn` or `acc` shorter than `m * n`.
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
    match selected() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the lengths are checked above; `Avx2` is selected only if the CPU has AVX2.
        Backend::Avx2 => unsafe { x86::accumulate_c_native_i32(c, m, n, sn, acc, first) },
        #[cfg(target_arch = "aarch64")]
        // SAFETY: the lengths are checked above.
        Backend::Neon => unsafe { fast::accumulate_c_native_i32(c, m, n, sn, acc, first) },
        Backend::Scalar => scalar::accumulate_c_native_i32(c, m, n, sn, acc, first),
    }
}

/// Dequantises: `out[r*ld + n0 + j] = (acc[r*n + j] as f32 * row_scales[r]) * ch_scales[j]`
/// for `r < m`, `j < n`, in exactly this order of f32 operations.
///
/// # Panics
///
/// If `acc` is shorter than `m * n`, `row_scales` than `m`, `ch_scales` than `n`, `out` than
/// `(m - 1) * ld + n0 + n`, or (for `m > 1`) `ld < n0 + n`.
#[allow(clippy::too_many_arguments)] // The engine's call matches the formula's operands.
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
    match selected() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the lengths are checked above; `Avx2` is selected only if the CPU has AVX2.
        Backend::Avx2 => unsafe { x86::scale_out(acc, m, n, row_scales, ch_scales, out, ld, n0) },
        #[cfg(target_arch = "aarch64")]
        Backend::Neon => fast::scale_out(acc, m, n, row_scales, ch_scales, out, ld, n0),
        Backend::Scalar => scalar::scale_out(acc, m, n, row_scales, ch_scales, out, ld, n0),
    }
}

/// f16 path: converts columns `k0..k0 + kseg` of `x` (`[m, k]` row-major f32; columns `>= k`
/// read as zero padding) to f16, rounding to nearest even exactly like `half::f16::from_f32`
/// (NaN stays NaN with its payload's top bits), in the native `A` layout `[kseg / sk, m, sk]`
/// (element `(r, c)` at `((c / sk) * m + r) * sk + c % sk`, `c` relative to `k0`).
///
/// # Panics
///
/// If `sk == 0`, `kseg` is not a multiple of `sk`, `x` is shorter than `m * k` or `dst`
/// shorter than `m * kseg`.
pub fn pack_a_native_f16(
    x: &[f32],
    m: usize,
    k: usize,
    k0: usize,
    kseg: usize,
    sk: usize,
    dst: &mut [half::f16],
) {
    assert!(
        k0.checked_add(kseg).is_some(),
        "glue: k0 + kseg overflows usize"
    );
    check_pack_a(x.len(), m, k, kseg, sk, dst.len());
    match selected() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the lengths are checked above; `Avx2` is selected only if the CPU has AVX2
        // and F16C.
        Backend::Avx2 => unsafe { x86::pack_a_native_f16(x, m, k, k0, kseg, sk, dst) },
        #[cfg(target_arch = "aarch64")]
        // SAFETY: the lengths are checked above.
        Backend::Neon => unsafe { neon::pack_a_native_f16(x, m, k, k0, kseg, sk, dst) },
        Backend::Scalar => scalar::pack_a_native_f16(x, m, k, k0, kseg, sk, dst),
    }
}

/// f16 path collection: `out[r*ld + n0 + j] = c(r, j)` if `first`, else
/// `out[r*ld + n0 + j] + c(r, j)` (one f32 addition), for `r < m`, `j < n`; `c` is native f32
/// `[ceil(n / sn), m, sn]`, element `(r, j)` at `((j / sn) * m + r) * sn + j % sn`.
///
/// # Panics
///
/// If `sn == 0`, `c` is shorter than `ceil(n / sn) * m * sn`, `out` shorter than
/// `(m - 1) * ld + n0 + n`, or (for `m > 1`) `ld < n0 + n`.
#[allow(clippy::too_many_arguments)] // The engine's call matches the formula's operands.
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
    match selected() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the lengths are checked above; `Avx2` is selected only if the CPU has AVX2.
        Backend::Avx2 => unsafe { x86::accumulate_c_native_f32(c, m, n, sn, out, ld, n0, first) },
        #[cfg(target_arch = "aarch64")]
        // SAFETY: the lengths are checked above.
        Backend::Neon => unsafe { fast::accumulate_c_native_f32(c, m, n, sn, out, ld, n0, first) },
        Backend::Scalar => scalar::accumulate_c_native_f32(c, m, n, sn, out, ld, n0, first),
    }
}
