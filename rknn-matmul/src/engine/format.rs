//! The weight formats, and everything in which they differ: the NPU's matmul type, how a weight
//! row is converted, how an activation row is prepared, how native A is packed, how the K
//! segments' outputs are summed and how the result is finished. The rest of the engine is
//! written once, generic over [`EngineKind`].
//!
//! **Adding a format** is done here and only here: a [`WeightFormat`] variant (with its name and
//! matmul type), an [`EngineKind`] implementation for the `MatmulKind` it runs on the NPU, and
//! its arm in [`with_format!`], the one place where the variant meets the type.

use half::f16;
use rknn_chip::{ElemKind, MatmulType};

use super::glue;
use super::out_cols::OutCols;
use crate::dtype::{F16xF16ToF32, I8xI8ToI32, MatmulKind};

/// `$body` with `$K` the [`EngineKind`] of `$format`: the one match from a format to its type.
macro_rules! with_format {
    ($format:expr, $K:ident => $body:expr) => {
        match $format {
            $crate::engine::format::WeightFormat::W8A8 => {
                type $K = $crate::dtype::I8xI8ToI32;
                $body
            }
            $crate::engine::format::WeightFormat::F16 => {
                type $K = $crate::dtype::F16xF16ToF32;
                $body
            }
        }
    };
}
pub(crate) use with_format;

/// The precision of a [`Linear`](super::linear::Linear).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WeightFormat {
    /// int8 weights with one f32 scale per output channel, int8 activations with one scale per
    /// row; i8 × i8 → i32 on the NPU, scales applied on the host (per-channel scales on the NPU
    /// returned all-zero C in a public RK3588 report, and factor out of the K sum anyway).
    W8A8,
    /// f16 weights and activations, f32 output.
    F16,
}

impl WeightFormat {
    /// Every format.
    pub const ALL: [WeightFormat; 2] = [WeightFormat::W8A8, WeightFormat::F16];

    /// Its short name (`"w8a8"`, `"f16"`), as statistics and command lines spell it.
    pub fn name(self) -> &'static str {
        match self {
            WeightFormat::W8A8 => "w8a8",
            WeightFormat::F16 => "f16",
        }
    }

    /// The matmul type the NPU runs for it.
    pub fn matmul_type(self) -> MatmulType {
        with_format!(self, K => K::TYPE)
    }

    /// The element kind that sets its K and N alignment.
    pub(crate) fn align_kind(self) -> ElemKind {
        self.matmul_type().b
    }

    /// Bytes per element of B (and A) and of C.
    pub(crate) fn bytes(self) -> (u64, u64) {
        with_format!(self, K => (
            std::mem::size_of::<<K as MatmulKind>::B>() as u64,
            std::mem::size_of::<<K as MatmulKind>::C>() as u64,
        ))
    }
}

impl std::fmt::Display for WeightFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The values of converted weights, one buffer type per format.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Values {
    /// W8A8: int8 in -127..=127.
    I8(Vec<i8>),
    /// F16.
    F16(Vec<f16>),
}

/// A forward's prepared activations, shared by the lanes: one buffer per input element type
/// (a format uses the one of its [`EngineKind::In`]), and a scale per row for quantised ones.
#[derive(Clone, Default)]
pub(crate) struct Prepared {
    pub(crate) i8s: Vec<i8>,
    pub(crate) f32s: Vec<f32>,
    pub(crate) scales: Vec<f32>,
}

/// A lane's accumulators over K segments, one buffer per accumulator type.
#[derive(Default)]
pub(crate) struct Accumulators {
    i32s: Vec<i32>,
    f32s: Vec<f32>,
}

/// An element of prepared activations.
pub(crate) trait InElem: Copy + Default + Send + Sync + 'static {
    /// Its buffer in `p`.
    fn of(p: &Prepared) -> &Vec<Self>;
    /// Its buffer and the row scales in `p`, to fill.
    fn of_mut(p: &mut Prepared) -> (&mut Vec<Self>, &mut Vec<f32>);
}

impl InElem for i8 {
    fn of(p: &Prepared) -> &Vec<i8> {
        &p.i8s
    }
    fn of_mut(p: &mut Prepared) -> (&mut Vec<i8>, &mut Vec<f32>) {
        (&mut p.i8s, &mut p.scales)
    }
}

impl InElem for f32 {
    fn of(p: &Prepared) -> &Vec<f32> {
        &p.f32s
    }
    fn of_mut(p: &mut Prepared) -> (&mut Vec<f32>, &mut Vec<f32>) {
        (&mut p.f32s, &mut p.scales)
    }
}

/// An accumulator element.
pub(crate) trait AccElem: Copy + Default + Send + 'static {
    /// Its buffer in `a`.
    fn of(a: &mut Accumulators) -> &mut Vec<Self>;
}

impl AccElem for i32 {
    fn of(a: &mut Accumulators) -> &mut Vec<i32> {
        &mut a.i32s
    }
}

impl AccElem for f32 {
    fn of(a: &mut Accumulators) -> &mut Vec<f32> {
        &mut a.f32s
    }
}

/// What the engine needs of a format's matmul type.
pub(crate) trait EngineKind: MatmulKind + Sized {
    /// Its [`WeightFormat`].
    const FORMAT: WeightFormat;
    /// Whether an input row may be prepared twice, as itself and as its residual
    /// ([`super::config::LinearOptions::residual_activations`]).
    const RESIDUAL: bool;
    /// The prepared input element (quantised i8, or f32 converted while packing).
    type In: InElem;
    /// The accumulator over K segments (exact i32, or f32).
    type Acc: AccElem;

    /// Its converted weights in the format-free holder of
    /// [`ConvertedWeights`](super::converted::ConvertedWeights).
    fn wrap_values(b: Vec<Self::B>) -> Values;

    /// Its converted weights back from the holder (`None` for another format's).
    fn unwrap_values(v: Values) -> Option<Vec<Self::B>>;

    /// The values converted weights may hold, in words.
    const VALUE_RANGE: &'static str;

    /// The first converted value out of [`EngineKind::VALUE_RANGE`], with its value.
    fn invalid_value(b: &[Self::B]) -> Option<(usize, i64)>;

    /// Values per prepared input row, for rows of `k` values padded to `k_pad`.
    fn input_ld(k: usize, k_pad: usize) -> usize;

    /// Converts `rows` weight rows `w` ([rows, k], row = output channel, rotated already) into
    /// `b` ([rows, k_pad], zero-padded) and, for quantised formats, one scale per row.
    fn convert_rows(
        w: &[f32],
        rows: usize,
        k: usize,
        k_pad: usize,
        b: &mut [Self::B],
        scales: &mut [f32],
    );

    /// Prepares `rows` input rows `x` ([rows, k], rotated already) into `dst` ([rows × per,
    /// ld]) and `scales` ([rows × per]); `per` is 2 when `twice` (each row, then its residual).
    /// `tmp` is scratch.
    #[allow(clippy::too_many_arguments)] // The operands of the conversion.
    fn prepare_rows(
        x: &[f32],
        rows: usize,
        k: usize,
        k_pad: usize,
        twice: bool,
        tmp: &mut Vec<f32>,
        dst: &mut [Self::In],
        scales: &mut [f32],
    );

    /// Packs columns `k0..k0 + ks` of `x` ([m, ld] row-major) into native A.
    fn pack_a(
        x: &[Self::In],
        m: usize,
        ld: usize,
        k0: usize,
        ks: usize,
        sk: usize,
        dst: &mut [Self::A],
    );

    /// Adds native C ([width / sn, m, sn]) into `acc` ([m, width]), or sets it if `first`.
    fn accumulate(
        c: &[Self::C],
        m: usize,
        width: usize,
        sn: usize,
        acc: &mut [Self::Acc],
        first: bool,
    );

    /// Writes the first `valid` columns of `acc` ([m × per, width]) into `out`'s rows (`m` rows
    /// of `valid` columns): output row `r` combines accumulator rows `r·per .. r·per + per`.
    #[allow(clippy::too_many_arguments)] // The operands of the formula.
    fn finish(
        acc: &[Self::Acc],
        m: usize,
        per: usize,
        width: usize,
        valid: usize,
        row_scales: &[f32],
        ch_scales: &[f32],
        out: &mut OutCols,
    );
}

impl EngineKind for I8xI8ToI32 {
    const FORMAT: WeightFormat = WeightFormat::W8A8;
    const RESIDUAL: bool = true;
    type In = i8;
    type Acc = i32;

    fn input_ld(_k: usize, k_pad: usize) -> usize {
        k_pad
    }

    fn wrap_values(b: Vec<i8>) -> Values {
        Values::I8(b)
    }

    fn unwrap_values(v: Values) -> Option<Vec<i8>> {
        match v {
            Values::I8(b) => Some(b),
            Values::F16(_) => None,
        }
    }

    const VALUE_RANGE: &'static str =
        "-127..=127 (the exactness bound of the K sum assumes |q| <= 127)";

    fn invalid_value(b: &[i8]) -> Option<(usize, i64)> {
        b.iter()
            .position(|&q| q == i8::MIN)
            .map(|i| (i, i8::MIN.into()))
    }

    fn convert_rows(
        w: &[f32],
        rows: usize,
        k: usize,
        k_pad: usize,
        b: &mut [i8],
        scales: &mut [f32],
    ) {
        glue::quantize_rows(w, rows, k, k_pad, b, scales);
    }

    fn prepare_rows(
        x: &[f32],
        rows: usize,
        k: usize,
        k_pad: usize,
        twice: bool,
        tmp: &mut Vec<f32>,
        dst: &mut [i8],
        scales: &mut [f32],
    ) {
        if twice {
            quantize_with_residual(x, rows, k, k_pad, tmp, dst, scales);
        } else {
            glue::quantize_rows(x, rows, k, k_pad, dst, scales);
        }
    }

    fn pack_a(x: &[i8], m: usize, ld: usize, k0: usize, ks: usize, sk: usize, dst: &mut [i8]) {
        glue::pack_a_native_i8(x, m, ld, k0, ks, sk, dst);
    }

    fn accumulate(c: &[i32], m: usize, width: usize, sn: usize, acc: &mut [i32], first: bool) {
        glue::accumulate_c_native_i32(c, m, width, sn, acc, first);
    }

    /// With `per = 1`: `out = (acc · row_scale) · ch_scale` ([`glue::scale_out`]). With
    /// `per = 2`: `out = (acc₀ · s₀ + acc₁ · s₁) · ch_scale`, in exactly this order (`per` is 1
    /// or 2).
    fn finish(
        acc: &[i32],
        m: usize,
        per: usize,
        width: usize,
        valid: usize,
        row_scales: &[f32],
        ch_scales: &[f32],
        out: &mut OutCols,
    ) {
        if per == 2 {
            for r in 0..m {
                let o = out.row(r);
                let (i0, i1) = (2 * r, 2 * r + 1);
                let (s0, s1) = (row_scales[i0], row_scales[i1]);
                let a0 = &acc[i0 * width..i0 * width + valid];
                let a1 = &acc[i1 * width..i1 * width + valid];
                for (((o, &x0), &x1), &ch) in o.iter_mut().zip(a0).zip(a1).zip(&ch_scales[..valid])
                {
                    *o = (x0 as f32 * s0 + x1 as f32 * s1) * ch;
                }
            }
            return;
        }
        for r in 0..m {
            glue::scale_out(
                &acc[r * width..r * width + valid],
                1,
                valid,
                &row_scales[r..=r],
                &ch_scales[..valid],
                out.row(r),
                valid,
                0,
            );
        }
    }
}

impl EngineKind for F16xF16ToF32 {
    const FORMAT: WeightFormat = WeightFormat::F16;
    const RESIDUAL: bool = false;
    type In = f32;
    type Acc = f32;

    fn input_ld(k: usize, _k_pad: usize) -> usize {
        k
    }

    fn wrap_values(b: Vec<f16>) -> Values {
        Values::F16(b)
    }

    fn unwrap_values(v: Values) -> Option<Vec<f16>> {
        match v {
            Values::F16(b) => Some(b),
            Values::I8(_) => None,
        }
    }

    const VALUE_RANGE: &'static str = "any f16";

    fn invalid_value(_b: &[f16]) -> Option<(usize, i64)> {
        None
    }

    fn convert_rows(
        w: &[f32],
        rows: usize,
        k: usize,
        k_pad: usize,
        b: &mut [f16],
        _scales: &mut [f32],
    ) {
        for (dst, src) in b[..rows * k_pad]
            .chunks_exact_mut(k_pad)
            .zip(w.chunks_exact(k))
        {
            for (d, &s) in dst.iter_mut().zip(src) {
                *d = f16::from_f32(s);
            }
            dst[k..].fill(f16::ZERO);
        }
    }

    fn prepare_rows(
        x: &[f32],
        rows: usize,
        k: usize,
        _k_pad: usize,
        _twice: bool,
        _tmp: &mut Vec<f32>,
        dst: &mut [f32],
        _scales: &mut [f32],
    ) {
        dst[..rows * k].copy_from_slice(&x[..rows * k]);
    }

    fn pack_a(x: &[f32], m: usize, ld: usize, k0: usize, ks: usize, sk: usize, dst: &mut [f16]) {
        glue::pack_a_native_f16(x, m, ld, k0, ks, sk, dst);
    }

    fn accumulate(c: &[f32], m: usize, width: usize, sn: usize, acc: &mut [f32], first: bool) {
        glue::accumulate_c_native_f32(c, m, width, sn, acc, width, 0, first);
    }

    fn finish(
        acc: &[f32],
        m: usize,
        _per: usize,
        width: usize,
        valid: usize,
        _row_scales: &[f32],
        _ch_scales: &[f32],
        out: &mut OutCols,
    ) {
        for r in 0..m {
            out.row(r)
                .copy_from_slice(&acc[r * width..r * width + valid]);
        }
    }
}

/// Quantises each of the `m` rows of `x` ([m, k]) twice into `q` ([2m, k_pad]) and `scales`
/// ([2m]): row `2r` is row `r` as [`glue::quantize_rows`] quantises it, row `2r + 1` its
/// residual `x - scale · q` (in f32), quantised the same way. The NPU multiplies both by the
/// weights in the same exact integer arithmetic, and the two results added back give about 15
/// bits of activation precision for the price of a second row of A (nothing, when decode is
/// bound by reading the weights).
pub(crate) fn quantize_with_residual(
    x: &[f32],
    m: usize,
    k: usize,
    k_pad: usize,
    residual: &mut Vec<f32>,
    q: &mut [i8],
    scales: &mut [f32],
) {
    residual.resize(k, 0.0);
    for r in 0..m {
        let row = &x[r * k..(r + 1) * k];
        let (q1, rest) = q[2 * r * k_pad..(2 * r + 2) * k_pad].split_at_mut(k_pad);
        let (s1, s2) = scales[2 * r..2 * r + 2].split_at_mut(1);
        glue::quantize_rows(row, 1, k, k_pad, q1, s1);
        for ((e, &v), &qv) in residual.iter_mut().zip(row).zip(&q1[..k]) {
            *e = v - s1[0] * f32::from(qv);
        }
        glue::quantize_rows(residual, 1, k, k_pad, rest, s2);
    }
}
