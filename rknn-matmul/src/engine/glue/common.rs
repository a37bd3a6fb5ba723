//! What the glue's backends share: the checks of slice lengths and layout parameters, the
//! per-row quantisation rule's pieces, and the measured tile shapes of the relayouts.

/// `(rows, blocks)` tile of [`for_each_block`] for packing `A`: 8 rows by 4 blocks, so each
/// visit of a native block writes 128 contiguous bytes and each row's 64-byte line is used
/// up before the next. Measured at m = 512, k = 4096 on the x86 bench machine (GB/s relative
/// to memcpy): 4 rows x all blocks 0.46 (every native line a new page: TLB-bound), 8 x 4
/// 0.56, 16 x 4 0.52, 32 x 4 0.50, 64 x 4 0.47 (the rows, 4 KiB apart, overflow an L1 set).
#[cfg_attr(
    not(any(target_arch = "x86_64", target_arch = "aarch64")),
    allow(dead_code)
)]
pub(super) const PACK_TILE: (usize, usize) = (8, 4);

/// `(rows, blocks)` tile of [`for_each_block`] for packing f32 `A` to f16: 4 rows, every
/// block. The source rows are twice as wide as the output blocks (32 bytes per block), so
/// 4 sequential row streams with one 64-byte native line per block visit did best: 0.55 of
/// memcpy at m = 512, k = 4096, against 0.37 for the i8 tile (8 x 4) and 0.43 for 16 x 4.
#[cfg_attr(
    not(any(target_arch = "x86_64", target_arch = "aarch64")),
    allow(dead_code)
)]
pub(super) const PACK_F16_TILE: (usize, usize) = (4, usize::MAX);

/// `(rows, blocks)` tile of [`for_each_block`] for collecting `C`: 4 rows, every block. The
/// read-modify-write of the row-major output keeps its 4 rows' lines hot. Measured at
/// m = 512, n = 1024 (relative to memcpy, `first` / accumulating): 4 x all 0.60 / 0.82,
/// 16 x all 0.60 / 0.82, 8 x 4 0.47 / 0.61, 16 x 4 0.35 / 0.28.
#[cfg_attr(
    not(any(target_arch = "x86_64", target_arch = "aarch64")),
    allow(dead_code)
)]
pub(super) const COLLECT_TILE: (usize, usize) = (4, usize::MAX);

/// `a * b`, panicking instead of wrapping: the products bound raw-pointer accesses.
pub(super) fn mul(a: usize, b: usize) -> usize {
    a.checked_mul(b).expect("glue: size overflows usize")
}

/// `a + b`, panicking instead of wrapping.
pub(super) fn add(a: usize, b: usize) -> usize {
    a.checked_add(b).expect("glue: size overflows usize")
}

/// Length of a `rows`-row strided matrix whose rows hold `cols` elements starting at
/// column `col0` with leading dimension `ld`: `(rows - 1) * ld + col0 + cols`, or 0 for no
/// rows.
pub(super) fn strided_len(rows: usize, ld: usize, col0: usize, cols: usize) -> usize {
    if rows == 0 {
        0
    } else {
        add(mul(rows - 1, ld), add(col0, cols))
    }
}

pub(super) fn check_len(what: &str, have: usize, need: usize) {
    assert!(
        have >= need,
        "glue: `{what}` holds {have} elements, {need} needed"
    );
}

pub(super) fn check_quantize(
    x: &[f32],
    m: usize,
    k: usize,
    k_pad: usize,
    q: &[i8],
    scales: &[f32],
) {
    assert!(k_pad >= k, "glue: k_pad = {k_pad} < k = {k}");
    check_len("x", x.len(), mul(m, k));
    check_len("q", q.len(), mul(m, k_pad));
    check_len("scales", scales.len(), m);
}

pub(super) fn check_pack_a(
    src_len: usize,
    m: usize,
    ld: usize,
    kseg: usize,
    sk: usize,
    dst_len: usize,
) {
    assert!(sk > 0, "glue: sk must be positive");
    assert!(
        kseg % sk == 0,
        "glue: kseg = {kseg} is not a multiple of sk = {sk}"
    );
    check_len("src", src_len, mul(m, ld));
    check_len("dst", dst_len, mul(m, kseg));
}

/// Number of elements of a native `C` buffer `[ceil(n / sn), m, sn]`.
pub(super) fn native_c_len(m: usize, n: usize, sn: usize) -> usize {
    assert!(sn > 0, "glue: sn must be positive");
    mul(mul(n.div_ceil(sn), m), sn)
}

pub(super) fn check_out(out_len: usize, m: usize, n: usize, ld: usize, n0: usize) {
    assert!(
        m <= 1 || ld >= add(n0, n),
        "glue: ld = {ld} < n0 + n = {}",
        n0 + n
    );
    check_len("out", out_len, strided_len(m, ld, n0, n));
}

/// The amax of a row as the scalar reference defines it: the largest `|x|` over non-NaN
/// values, compared as bit patterns (for non-negative floats the integer order is the float
/// order). `f32::max` is avoided on purpose: on aarch64 it lowers to `fmaxnm`, which returns
/// NaN for a *signalling* NaN operand, so the result would depend on the NaN's kind and place.
pub(super) fn amax_ignoring_nan(row: &[f32]) -> f32 {
    let bits = row
        .iter()
        .map(|v| v.to_bits() & 0x7FFF_FFFF)
        .filter(|&b| b <= INF_BITS)
        .max()
        .unwrap_or(0);
    f32::from_bits(bits)
}

/// Bit pattern of `+inf`; any larger `|x|` pattern is a NaN.
pub(super) const INF_BITS: u32 = 0x7F80_0000;

/// One element of [`quantize_rows`]. `f32::clamp` keeps NaN, and the saturating `as` cast
/// turns it into 0.
#[inline(always)]
pub(super) fn quantize_one(v: f32, inv: f32) -> i8 {
    (v * inv).round_ties_even().clamp(-127.0, 127.0) as i8
}

/// What the SIMD backends need to know about a row before quantising it.
#[cfg_attr(
    not(any(target_arch = "x86_64", target_arch = "aarch64")),
    allow(dead_code)
)]
pub(super) enum RowPlan {
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
    pub(super) fn new(max_abs_bits: u32, row: &[f32]) -> RowPlan {
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
