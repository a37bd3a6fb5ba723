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
//! # `RKNN_GLUE`
//!
//! Setting the environment variable `RKNN_GLUE=scalar` forces the scalar backend (to rule out
//! a SIMD bug); `avx2` or `neon` force that backend if the CPU has it; `auto` or an empty value
//! mean the default. The variable is read once, on the first call; an unknown or unavailable
//! name is reported on stderr and ignored.
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

/// `(rows, blocks)` tile of [`for_each_block`] for packing `A`: 8 rows by 4 blocks, so each
/// visit of a native block writes 128 contiguous bytes and each row's 64-byte line is used
/// up before the next. Measured at m = 512, k = 4096 on the x86 bench machine (GB/s relative
/// to memcpy): 4 rows x all blocks 0.46 (every native line a new page: TLB-bound), 8 x 4
/// 0.56, 16 x 4 0.52, 32 x 4 0.50, 64 x 4 0.47 (the rows, 4 KiB apart, overflow an L1 set).
#[cfg_attr(
    not(any(target_arch = "x86_64", target_arch = "aarch64")),
    allow(dead_code)
)]
const PACK_TILE: (usize, usize) = (8, 4);

/// `(rows, blocks)` tile of [`for_each_block`] for packing f32 `A` to f16: 4 rows, every
/// block. The source rows are twice as wide as the output blocks (32 bytes per block), so
/// 4 sequential row streams with one 64-byte native line per block visit did best: 0.55 of
/// memcpy at m = 512, k = 4096, against 0.37 for the i8 tile (8 x 4) and 0.43 for 16 x 4.
#[cfg_attr(
    not(any(target_arch = "x86_64", target_arch = "aarch64")),
    allow(dead_code)
)]
const PACK_F16_TILE: (usize, usize) = (4, usize::MAX);

/// `(rows, blocks)` tile of [`for_each_block`] for collecting `C`: 4 rows, every block. The
/// read-modify-write of the row-major output keeps its 4 rows' lines hot. Measured at
/// m = 512, n = 1024 (relative to memcpy, `first` / accumulating): 4 x all 0.60 / 0.82,
/// 16 x all 0.60 / 0.82, 8 x 4 0.47 / 0.61, 16 x 4 0.35 / 0.28.
#[cfg_attr(
    not(any(target_arch = "x86_64", target_arch = "aarch64")),
    allow(dead_code)
)]
const COLLECT_TILE: (usize, usize) = (4, usize::MAX);

#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
mod fast;
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

/// The backend chosen on the first call (CPU probe plus `RKNN_GLUE`).
fn selected() -> Backend {
    static SELECTED: OnceLock<Backend> = OnceLock::new();
    *SELECTED.get_or_init(|| {
        let best = Backend::best();
        let wanted = std::env::var("RKNN_GLUE").unwrap_or_default();
        let wanted = wanted.trim().to_ascii_lowercase();
        match wanted.as_str() {
            "" | "auto" => best,
            "scalar" => Backend::Scalar,
            name if name == best.name() => best,
            name => {
                let available = if best == Backend::Scalar {
                    "scalar".to_string()
                } else {
                    format!("scalar, {}", best.name())
                };
                eprintln!(
                    "rknn-matmul: RKNN_GLUE={name:?} is not a glue backend available on this \
                     CPU (available: {available}); using {}",
                    best.name()
                );
                best
            }
        }
    })
}

/// Which implementation the functions of this module run: `"avx2"`, `"neon"` or `"scalar"`.
pub fn backend() -> &'static str {
    selected().name()
}

/// `a * b`, panicking instead of wrapping: the products bound raw-pointer accesses.
fn mul(a: usize, b: usize) -> usize {
    a.checked_mul(b).expect("glue: size overflows usize")
}

/// `a + b`, panicking instead of wrapping.
fn add(a: usize, b: usize) -> usize {
    a.checked_add(b).expect("glue: size overflows usize")
}

/// Length of a `rows`-row strided matrix whose rows hold `cols` elements starting at
/// column `col0` with leading dimension `ld`: `(rows - 1) * ld + col0 + cols`, or 0 for no
/// rows.
fn strided_len(rows: usize, ld: usize, col0: usize, cols: usize) -> usize {
    if rows == 0 {
        0
    } else {
        add(mul(rows - 1, ld), add(col0, cols))
    }
}

fn check_len(what: &str, have: usize, need: usize) {
    assert!(
        have >= need,
        "glue: `{what}` holds {have} elements, {need} needed"
    );
}

fn check_quantize(x: &[f32], m: usize, k: usize, k_pad: usize, q: &[i8], scales: &[f32]) {
    assert!(k_pad >= k, "glue: k_pad = {k_pad} < k = {k}");
    check_len("x", x.len(), mul(m, k));
    check_len("q", q.len(), mul(m, k_pad));
    check_len("scales", scales.len(), m);
}

fn check_pack_a(src_len: usize, m: usize, ld: usize, kseg: usize, sk: usize, dst_len: usize) {
    assert!(sk > 0, "glue: sk must be positive");
    assert!(
        kseg % sk == 0,
        "glue: kseg = {kseg} is not a multiple of sk = {sk}"
    );
    check_len("src", src_len, mul(m, ld));
    check_len("dst", dst_len, mul(m, kseg));
}

/// Number of elements of a native `C` buffer `[ceil(n / sn), m, sn]`.
fn native_c_len(m: usize, n: usize, sn: usize) -> usize {
    assert!(sn > 0, "glue: sn must be positive");
    mul(mul(n.div_ceil(sn), m), sn)
}

fn check_out(out_len: usize, m: usize, n: usize, ld: usize, n0: usize) {
    assert!(
        m <= 1 || ld >= add(n0, n),
        "glue: ld = {ld} < n0 + n = {}",
        n0 + n
    );
    check_len("out", out_len, strided_len(m, ld, n0, n));
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
        _ => super::rotation::rotate_rows(signs, mix, k, x),
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

/// The amax of a row as the scalar reference defines it: the largest `|x|` over non-NaN
/// values, compared as bit patterns (for non-negative floats the integer order is the float
/// order). `f32::max` is avoided on purpose: on aarch64 it lowers to `fmaxnm`, which returns
/// NaN for a *signalling* NaN operand, so the result would depend on the NaN's kind and place.
fn amax_ignoring_nan(row: &[f32]) -> f32 {
    let bits = row
        .iter()
        .map(|v| v.to_bits() & 0x7FFF_FFFF)
        .filter(|&b| b <= INF_BITS)
        .max()
        .unwrap_or(0);
    f32::from_bits(bits)
}

/// Bit pattern of `+inf`; any larger `|x|` pattern is a NaN.
const INF_BITS: u32 = 0x7F80_0000;

/// One element of [`quantize_rows`]. `f32::clamp` keeps NaN, and the saturating `as` cast
/// turns it into 0.
#[inline(always)]
fn quantize_one(v: f32, inv: f32) -> i8 {
    (v * inv).round_ties_even().clamp(-127.0, 127.0) as i8
}

/// What the SIMD backends need to know about a row before quantising it.
#[cfg_attr(
    not(any(target_arch = "x86_64", target_arch = "aarch64")),
    allow(dead_code)
)]
enum RowPlan {
    /// All zero (or all NaN): scale 0, every `q` 0.
    Zero,
    /// `amax` finite and positive with a finite reciprocal, and no NaN in the row: every
    /// product lies within `127 * (1 + 2^-24)`, so no clamp or NaN mask is needed.
    Plain { scale: f32, inv: f32 },
    /// Anything else (NaN, infinity, subnormal `amax`): the fully general per-element rule.
    General { scale: f32, inv: f32 },
}

impl RowPlan {
    /// Plans a row from the maximum of its `|x|` bit patterns (NaNs included), recomputing
    /// the NaN-free amax from `row` when a NaN is present.
    #[cfg_attr(
        not(any(target_arch = "x86_64", target_arch = "aarch64")),
        allow(dead_code)
    )]
    fn new(max_abs_bits: u32, row: &[f32]) -> RowPlan {
        let has_nan = max_abs_bits > INF_BITS;
        let amax = if has_nan {
            amax_ignoring_nan(row)
        } else {
            f32::from_bits(max_abs_bits)
        };
        if amax == 0.0 {
            return RowPlan::Zero;
        }
        let inv = 127.0f32 / amax;
        let scale = amax / 127.0;
        if !has_nan && amax.is_finite() && inv.is_finite() {
            RowPlan::Plain { scale, inv }
        } else {
            RowPlan::General { scale, inv }
        }
    }
}
