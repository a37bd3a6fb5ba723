//! The weight formats, and everything in which they differ: the NPU's matmul type, how a weight
//! row is converted, how an activation row is prepared, how native A and B are packed, how the
//! K segments' outputs are summed and how the result is finished. The rest of the engine is
//! written once, generic over [`EngineKind`].
//!
//! | format | NPU type | weights | activations | host finish |
//! |---|---|---|---|---|
//! | W8A8 | i8 × i8 → i32 (every chip) | int8 -127..=127, f32 scale per output channel | int8 per row (+ residual row) | `(acc · row scale) · channel scale` |
//! | F16 | f16 × f16 → f32 (every chip) | f16 | f16 | none |
//! | W4A16 | f16 × i4 → f32 (RK3576) | int4 -7..=7, f32 scale per output channel | f16 | `acc · channel scale` |
//! | W4A16 per group | f16 × i4 → f32, per-group B scales `d` (RK3576, \[open\]) | int4 -8..=7, per (channel, group) f32 `d` and offset `o` | f16 | `acc + Σ_g o · S_g(x)` |
//! | W4A8 | i8 × i4 → i32 (RK3576) | int4 -7..=7, f32 scale per output channel | int8 per row (+ residual row) | `(acc · row scale) · channel scale` |
//!
//! The int4 formats keep two values per byte (two's complement nibbles, the even K index in
//! the low nibble, fact sheet §7) on the host and in [`ConvertedWeights`]; their native B is
//! made by the runtime's own converter (`rknn_B_normal_layout_to_native_layout`) from one value
//! per element, so the nibble order of native int4 B (\[open\]) is whatever the runtime reads,
//! and the converter's input packing (\[open\]) is the runtime's
//! [`int4_converter_input`](crate::Runtime::int4_converter_input) setting.
//!
//! [`ConvertedWeights`]: super::converted::ConvertedWeights
//!
//! Per-group W4A16 ([`LinearOptions::int4_group`](super::LinearOptions::int4_group)) is W4A16
//! with other weights, not another matmul type: [`quantize_rows_i4_grouped`] converts, each
//! context gets its K segment's group scales as per-group B quantisation (in the runtime's
//! [`group_order`](crate::Runtime::group_order)), and [`finish_grouped`] adds the offsets
//! times the f16 activations' group sums ([`f16_group_sums`]).
//!
//! **Adding a format** is done here and only here: a [`WeightFormat`] variant (with its name and
//! matmul type), an [`EngineKind`] implementation for the `MatmulKind` it runs on the NPU, and
//! its arm in [`with_format!`], the one place where the variant meets the type.

use half::f16;
use rknn_chip::{ElemKind, Layout, MatmulType};

use super::glue;
use super::out_cols::OutCols;
use crate::dtype::{Element, F16xF16ToF32, F16xI4ToF32, I4x2, I8xI4ToI32, I8xI8ToI32, MatmulKind};
use crate::error::{Error, Matrix, Result};
use crate::safe::matmul::Matmul;
use crate::safe::mem::TensorMem;

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
            $crate::engine::format::WeightFormat::W4A16 => {
                type $K = $crate::dtype::F16xI4ToF32;
                $body
            }
            $crate::engine::format::WeightFormat::W4A8 => {
                type $K = $crate::dtype::I8xI4ToI32;
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
    /// int4 weights (-7..=7, two per byte) with one f32 scale per output channel, f16
    /// activations; f16 × i4 → f32 on the NPU (`RKNN_FLOAT16_MM_INT4_TO_FLOAT32`, RK3576
    /// only), the channel scale applied on the host. Half the weight bytes of W8A8.
    W4A16,
    /// int4 weights (-7..=7, two per byte) with one f32 scale per output channel, int8
    /// activations with one scale per row (and a residual row, as W8A8's); i8 × i4 → i32 on
    /// the NPU (`RKNN_INT8_MM_INT4_TO_INT32`, RK3576 only), exact, scales applied on the host.
    W4A8,
}

impl WeightFormat {
    /// Every format (not every chip runs every one: the engine refuses a format its chip
    /// lacks with [`Error::Unsupported`](crate::Error::Unsupported)).
    pub const ALL: [WeightFormat; 4] = [
        WeightFormat::W8A8,
        WeightFormat::F16,
        WeightFormat::W4A16,
        WeightFormat::W4A8,
    ];

    /// Its short name (`"w8a8"`, `"f16"`, `"w4a16"`, `"w4a8"`), as statistics and command
    /// lines spell it.
    pub fn name(self) -> &'static str {
        match self {
            WeightFormat::W8A8 => "w8a8",
            WeightFormat::F16 => "f16",
            WeightFormat::W4A16 => "w4a16",
            WeightFormat::W4A8 => "w4a8",
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

    /// Bytes per element of A and of C.
    pub(crate) fn bytes(self) -> (u64, u64) {
        with_format!(self, K => (
            std::mem::size_of::<<K as MatmulKind>::A>() as u64,
            std::mem::size_of::<<K as MatmulKind>::C>() as u64,
        ))
    }

    /// Bytes of `values` weight values (int4: two per byte; `values` is even, a whole number
    /// of K-aligned rows).
    pub(crate) fn b_bytes(self, values: u64) -> u64 {
        with_format!(self, K => {
            let e = <<K as MatmulKind>::B as Element>::PER_ELEMENT as u64;
            values.div_ceil(e) * std::mem::size_of::<<K as MatmulKind>::B>() as u64
        })
    }

    /// Whether its converted weights carry one scale per output channel.
    pub(crate) fn has_scales(self) -> bool {
        with_format!(self, K => <K as EngineKind>::SCALES)
    }
}

/// f32 parameters per output channel of converted weights in `format` of `k_pad` columns: 0
/// (F16), 1 (a channel scale), or with per-group int4 `group` each group's scale and offset
/// ([`group_params_per_row`]).
pub(crate) fn params_per_row(format: WeightFormat, group: Option<usize>, k_pad: usize) -> usize {
    match group {
        Some(g) => group_params_per_row(k_pad, g),
        None => usize::from(format.has_scales()),
    }
}

/// Stored elements of B per converted row of `k_pad` values (int4: two values per element;
/// `k_pad` is a multiple of the K alignment, so even).
pub(crate) fn row_len<K: MatmulKind>(k_pad: usize) -> usize {
    k_pad.div_ceil(K::B::PER_ELEMENT)
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
    /// W4A16 and W4A8: int4 in -7..=7, two per byte (even K index in the low nibble).
    I4(Vec<I4x2>),
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
    /// Whether converted weights carry one scale per output channel.
    const SCALES: bool;
    /// The largest K whose sum the NPU's integer accumulator holds exactly (`None`: no bound,
    /// a float accumulator).
    const MAX_EXACT_K: Option<usize>;

    /// Writes the weights of one context, `width` converted rows (`row_len::<Self>(k_pad)`
    /// elements each, columns `k0..k0 + ks` of which are the context's, zero past `k`), into
    /// its native B memory `dst`. The default packs them itself with the tile sizes the
    /// runtime reported; `seg` is scratch.
    #[allow(clippy::too_many_arguments)] // The operands of the packing.
    fn write_b(
        mm: &Matmul<Self>,
        rows: &[Self::B],
        k: usize,
        k0: usize,
        ks: usize,
        width: usize,
        seg: &mut Vec<Self::B>,
        dst: &mut TensorMem<Self::B>,
    ) -> Result<()> {
        pack_b_native(mm, rows, k, k0, ks, width, seg, dst)
    }

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
    /// `b` ([rows, k_pad] values, zero-padded: `row_len::<Self>(k_pad)` elements per row) and,
    /// for quantised formats, one scale per row.
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

    /// Per-group int4 ([`super::config::LinearOptions::int4_group`], W4A16 only, refused for
    /// the other formats before anything is converted): converts as
    /// [`quantize_rows_i4_grouped`] does, `params` [rows, 2 · k_pad / group].
    fn convert_rows_grouped(
        w: &[f32],
        (rows, k, k_pad): (usize, usize, usize),
        group: usize,
        b: &mut [Self::B],
        params: &mut [f32],
    ) {
        let _ = (w, rows, k, k_pad, group, b, params);
        unreachable!("per-group weights are W4A16 only (checked when the linear is planned)")
    }

    /// Per-group int4: the sums of each of the `m` rows of `x` ([m, ld], `k` values) over
    /// each group of `group` columns, as the NPU sees them, into `sums` ([m, groups]).
    fn group_sums(
        x: &[Self::In],
        (m, ld, k): (usize, usize, usize),
        group: usize,
        groups: usize,
        sums: &mut Vec<f32>,
    ) {
        let _ = (x, m, ld, k, group, groups, sums);
        unreachable!("per-group weights are W4A16 only (checked when the linear is planned)")
    }

    /// Per-group int4: checks weights filled from outside (storage) before they reach the
    /// NPU: `rows` (converted rows, `k` values each padded to `k_pad`) and their `params`
    /// (per row `2 · k_pad / group`: scales, then offsets), the first of them row `row0` of
    /// the linear (errors name indices of the whole linear). See [`check_grouped_i4`].
    fn check_grouped(
        rows: &[Self::B],
        (k, k_pad): (usize, usize),
        group: usize,
        params: &[f32],
        row0: usize,
    ) -> Result<()> {
        let _ = (rows, k, k_pad, group, params, row0);
        Ok(())
    }

    /// Per-group int4: as [`EngineKind::finish`], with the per-group offsets: `out = acc +
    /// Σ_g o[col, g] · sums[row, g]` (see [`finish_grouped`]).
    #[allow(clippy::too_many_arguments)] // The operands of the formula.
    fn finish_grouped(
        acc: &[Self::Acc],
        (m, width, valid): (usize, usize, usize),
        params: &[f32],
        groups: usize,
        sums: &[f32],
        out: &mut OutCols,
    ) {
        let _ = (acc, m, width, valid, params, groups, sums, out);
        unreachable!("per-group weights are W4A16 only (checked when the linear is planned)")
    }

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

/// The methods of the formats whose activations are int8 rows with a scale each, prepared
/// (rotated, quantised, with residual rows where asked) as W8A8's: W8A8 and W4A8.
macro_rules! i8_activations {
    () => {
        fn input_ld(_k: usize, k_pad: usize) -> usize {
            k_pad
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
            prepare_i8_rows(x, rows, k, k_pad, twice, tmp, dst, scales);
        }

        fn pack_a(x: &[i8], m: usize, ld: usize, k0: usize, ks: usize, sk: usize, dst: &mut [i8]) {
            glue::pack_a_native_i8(x, m, ld, k0, ks, sk, dst);
        }

        fn accumulate(c: &[i32], m: usize, width: usize, sn: usize, acc: &mut [i32], first: bool) {
            glue::accumulate_c_native_i32(c, m, width, sn, acc, first);
        }

        /// See [`finish_i32_rows`].
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
            finish_i32_rows(acc, m, per, width, valid, row_scales, ch_scales, out);
        }
    };
}

/// The methods of the formats whose activations are f16 rows (converted when packed), whose
/// C is f32 summed over the K segments: F16 and W4A16.
macro_rules! f16_activations {
    () => {
        fn input_ld(k: usize, _k_pad: usize) -> usize {
            k
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

        fn pack_a(
            x: &[f32],
            m: usize,
            ld: usize,
            k0: usize,
            ks: usize,
            sk: usize,
            dst: &mut [f16],
        ) {
            glue::pack_a_native_f16(x, m, ld, k0, ks, sk, dst);
        }

        fn accumulate(c: &[f32], m: usize, width: usize, sn: usize, acc: &mut [f32], first: bool) {
            glue::accumulate_c_native_f32(c, m, width, sn, acc, width, 0, first);
        }
    };
}

impl EngineKind for I8xI8ToI32 {
    const FORMAT: WeightFormat = WeightFormat::W8A8;
    const RESIDUAL: bool = true;
    type In = i8;
    type Acc = i32;
    const SCALES: bool = true;
    const MAX_EXACT_K: Option<usize> = Some(super::config::MAX_EXACT_K_W8A8);

    fn wrap_values(b: Vec<i8>) -> Values {
        Values::I8(b)
    }

    fn unwrap_values(v: Values) -> Option<Vec<i8>> {
        match v {
            Values::I8(b) => Some(b),
            _ => None,
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

    i8_activations!();
}

impl EngineKind for F16xF16ToF32 {
    const FORMAT: WeightFormat = WeightFormat::F16;
    const RESIDUAL: bool = false;
    type In = f32;
    type Acc = f32;
    const SCALES: bool = false;
    const MAX_EXACT_K: Option<usize> = None;

    fn wrap_values(b: Vec<f16>) -> Values {
        Values::F16(b)
    }

    fn unwrap_values(v: Values) -> Option<Vec<f16>> {
        match v {
            Values::F16(b) => Some(b),
            _ => None,
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

    f16_activations!();

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

/// The int4 formats' weights: the values are i4 and the native B comes from the runtime's
/// converter.
macro_rules! int4_weights {
    () => {
        const SCALES: bool = true;

        fn wrap_values(b: Vec<I4x2>) -> Values {
            Values::I4(b)
        }

        fn unwrap_values(v: Values) -> Option<Vec<I4x2>> {
            match v {
                Values::I4(b) => Some(b),
                _ => None,
            }
        }

        const VALUE_RANGE: &'static str = INT4_RANGE;

        fn invalid_value(b: &[I4x2]) -> Option<(usize, i64)> {
            invalid_i4(b)
        }

        fn convert_rows(
            w: &[f32],
            rows: usize,
            k: usize,
            k_pad: usize,
            b: &mut [I4x2],
            scales: &mut [f32],
        ) {
            quantize_rows_i4(w, rows, k, k_pad, b, scales);
        }

        fn write_b(
            mm: &Matmul<Self>,
            rows: &[I4x2],
            k: usize,
            k0: usize,
            ks: usize,
            width: usize,
            _seg: &mut Vec<I4x2>,
            dst: &mut TensorMem<I4x2>,
        ) -> Result<()> {
            write_b_i4(mm, rows, k, k0, ks, width, dst)
        }
    };
}

impl EngineKind for F16xI4ToF32 {
    const FORMAT: WeightFormat = WeightFormat::W4A16;
    const RESIDUAL: bool = false;
    type In = f32;
    type Acc = f32;
    const MAX_EXACT_K: Option<usize> = None;
    int4_weights!();

    f16_activations!();

    fn convert_rows_grouped(
        w: &[f32],
        (rows, k, k_pad): (usize, usize, usize),
        group: usize,
        b: &mut [I4x2],
        params: &mut [f32],
    ) {
        quantize_rows_i4_grouped(w, (rows, k, k_pad), group, b, params);
    }

    fn group_sums(
        x: &[f32],
        (m, ld, k): (usize, usize, usize),
        group: usize,
        groups: usize,
        sums: &mut Vec<f32>,
    ) {
        f16_group_sums(x, (m, ld, k), group, groups, sums);
    }

    fn finish_grouped(
        acc: &[f32],
        (m, width, valid): (usize, usize, usize),
        params: &[f32],
        groups: usize,
        sums: &[f32],
        out: &mut OutCols,
    ) {
        finish_grouped(acc, (m, width, valid), params, groups, sums, out);
    }

    fn check_grouped(
        rows: &[I4x2],
        (k, k_pad): (usize, usize),
        group: usize,
        params: &[f32],
        row0: usize,
    ) -> Result<()> {
        check_grouped_i4(rows, (k, k_pad), group, params, row0)
    }

    /// `out = acc · ch_scale`: the f32 sum of the K segments times the channel's scale, one
    /// f32 multiply.
    fn finish(
        acc: &[f32],
        m: usize,
        _per: usize,
        width: usize,
        valid: usize,
        _row_scales: &[f32],
        ch_scales: &[f32],
        out: &mut OutCols,
    ) {
        for r in 0..m {
            let a = &acc[r * width..r * width + valid];
            for ((o, &x), &ch) in out.row(r).iter_mut().zip(a).zip(&ch_scales[..valid]) {
                *o = x * ch;
            }
        }
    }
}

impl EngineKind for I8xI4ToI32 {
    const FORMAT: WeightFormat = WeightFormat::W4A8;
    const RESIDUAL: bool = true;
    type In = i8;
    type Acc = i32;
    const MAX_EXACT_K: Option<usize> = Some(MAX_EXACT_K_W4A8);
    int4_weights!();

    i8_activations!();
}

/// [`EngineKind::write_b`]'s default: the context's columns `k0..k0 + ks` of `rows` (`width`
/// rows, zero past `k`) gathered in `seg` and packed into native B `dst` with the tile sizes
/// the runtime reported for `mm`.
#[allow(clippy::too_many_arguments)] // The operands of the packing.
pub(crate) fn pack_b_native<K: MatmulKind>(
    mm: &Matmul<K>,
    rows: &[K::B],
    k: usize,
    k0: usize,
    ks: usize,
    width: usize,
    seg: &mut Vec<K::B>,
    dst: &mut TensorMem<K::B>,
) -> Result<()> {
    let (bn, bk) = mm.native_tile(Matrix::B)?;
    seg.clear();
    seg.try_reserve_exact(ks * width)
        .map_err(|_| Error::HostAlloc {
            what: "a K segment's weights",
            bytes: (ks * width * std::mem::size_of::<K::B>()) as u64,
        })?;
    let k_pad = rows.len() / width.max(1);
    // Columns past K are padding: zero, whatever the source holds there.
    let real = k.saturating_sub(k0).min(ks);
    for row in rows.chunks_exact(k_pad).take(width) {
        seg.extend_from_slice(&row[k0..k0 + real]);
        seg.resize(seg.len() + ks - real, K::B::default());
    }
    let geo = rknn_chip::layout::NativeB::new(ks, width, bn, bk, None).ok_or_else(|| {
        Error::BadTensorDims {
            matrix: Matrix::B,
            layout: Layout::Native,
            dims: mm.io_attr().B.dims.to_vec(),
        }
    })?;
    let dst = dst.as_mut_slice();
    if dst.len() < geo.len() {
        return Err(Error::MemoryTooSmall {
            matrix: Matrix::B,
            bytes: std::mem::size_of_val(dst) as u64,
            needed: (geo.len() * std::mem::size_of::<K::B>()) as u64,
        });
    }
    geo.pack_from_nk(seg, dst);
    Ok(())
}

/// The largest K of an exact W4A8 linear: |a| <= 127 and |w| <= 7, so the i32 sum over K stays
/// exact while 127 × 7 × K < 2^31.
pub(crate) const MAX_EXACT_K_W4A8: usize = i32::MAX as usize / (127 * 7);

/// The values int4 converted weights may hold.
pub(crate) const INT4_RANGE: &str = "-7..=7 (symmetric int4: values are clamped to ±7, so -8 is never \
     produced, and a stored -8 is refused as corrupt)";

/// The first nibble of `b` holding -8, with its value index (two per element).
pub(crate) fn invalid_i4(b: &[I4x2]) -> Option<(usize, i64)> {
    b.iter().enumerate().find_map(|(i, p)| {
        let (lo, hi) = p.get();
        if lo == -8 {
            Some((2 * i, -8))
        } else if hi == -8 {
            Some((2 * i + 1, -8))
        } else {
            None
        }
    })
}

/// Symmetric per-row int4 quantisation of `w` ([rows, k]) into `b` ([rows, k_pad / 2] pairs,
/// the even column in the low nibble) and `scales` ([rows]), the scale of each row searched for
/// the smallest squared error.
///
/// For each row: `amax` is the largest `|w|` over its non-NaN values (a row of zeros gets scale
/// 0.0 and all-zero values; a row with an infinity gets scale infinity and all-zero values). A candidate scale `s = (amax / 7.0) · r` quantises with `inv = 1.0 / s`
/// computed once, `q = round_ties_even(clamp(w · inv, -7, 7))` (NaN to 0), and costs the sum of
/// `(w - s · q)²` over the non-NaN values, in f32: value `i` of the row into partial sum `i mod
/// 8`, the eight partial sums then added in order. The ratios `r` tried are
/// [`SCALE_SEARCH`]'s: first the coarse ones, then the fine ones around the best coarse one
/// (`r_best + j · step` for `j` in -4..=4 but 0, within 0.5..=1.0); the smallest cost wins, the
/// earlier candidate on a tie. Columns `k..k_pad` are zero. The range is symmetric (-7..=7, not
/// -8..=7), so `-w` is quantised to `-q`.
///
/// Why a search: with 15 levels, the max-abs scale spends the outer levels on a few large
/// weights and rounds the bulk coarsely; clipping those few to ±7 costs less than it saves (on
/// the demo model, top-1 agreement with the f32 path went from 43 % to 55 %, docs/llm.md).
pub(crate) fn quantize_rows_i4(
    w: &[f32],
    rows: usize,
    k: usize,
    k_pad: usize,
    b: &mut [I4x2],
    scales: &mut [f32],
) {
    let per_row = k_pad / 2;
    for ((src, dst), s) in w
        .chunks_exact(k)
        .zip(b.chunks_exact_mut(per_row))
        .zip(scales.iter_mut())
        .take(rows)
    {
        let scale = search_i4_scale(src);
        *s = scale;
        let inv = if scale == 0.0 || !scale.is_finite() {
            0.0
        } else {
            1.0 / scale
        };
        let q = |c: usize| -> i8 { src.get(c).map_or(0, |&x| round_i4(x * inv) as i8) };
        for (i, d) in dst.iter_mut().enumerate() {
            *d = I4x2::new(q(2 * i), q(2 * i + 1));
        }
    }
}

/// The ratios to max-abs / 7 that [`quantize_rows_i4`] tries: the coarse ones, and the step of
/// the fine ones tried around the best coarse one.
pub(crate) const SCALE_SEARCH: ([f32; 11], f32) = (
    [1.0, 0.95, 0.9, 0.85, 0.8, 0.75, 0.7, 0.65, 0.6, 0.55, 0.5],
    0.01,
);

/// `v` clamped to -7..=7 and rounded to the nearest integer, ties to even (NaN stays NaN,
/// which `as i8` makes 0). The rounding adds and subtracts 1.5 · 2^23, where f32's spacing is
/// 1: the same result as `round_ties_even` for |v| <= 7, in two additions that vectorise on
/// every target (the x86-64 baseline has no rounding instruction).
fn round_i4(v: f32) -> f32 {
    const MAGIC: f32 = 12_582_912.0;
    (v.clamp(-7.0, 7.0) + MAGIC) - MAGIC
}

/// `Σ (w - s · round_i4(w · inv))²` over the non-NaN values of `row`, as
/// [`quantize_rows_i4`] sums it (eight interleaved f32 partial sums, added in order).
fn i4_cost(row: &[f32], s: f32, inv: f32) -> f32 {
    let mut acc = [0f32; 8];
    let term = |x: f32| {
        let e = x - s * round_i4(x * inv);
        let e2 = e * e;
        if e2.is_nan() { 0.0 } else { e2 }
    };
    let mut chunks = row.chunks_exact(8);
    for c in &mut chunks {
        for (a, &x) in acc.iter_mut().zip(c) {
            *a += term(x);
        }
    }
    for (a, &x) in acc.iter_mut().zip(chunks.remainder()) {
        *a += term(x);
    }
    acc.iter().sum()
}

/// The scale of one int4 row by [`quantize_rows_i4`]'s search.
fn search_i4_scale(row: &[f32]) -> f32 {
    let amax = row.iter().fold(0f32, |a, &x| a.max(x.abs()));
    if amax == 0.0 || !amax.is_finite() {
        return amax / 7.0;
    }
    let cost = |r: f32| {
        let s = amax / 7.0 * r;
        i4_cost(row, s, 1.0 / s)
    };
    let (coarse, step) = SCALE_SEARCH;
    let mut best = (coarse[0], cost(coarse[0]));
    for &r in &coarse[1..] {
        let c = cost(r);
        if c < best.1 {
            best = (r, c);
        }
    }
    let centre = best.0;
    for j in [-4i8, -3, -2, -1, 1, 2, 3, 4] {
        let r = centre + f32::from(j) * step;
        if (0.5..=1.0).contains(&r) {
            let c = cost(r);
            if c < best.1 {
                best = (r, c);
            }
        }
    }
    amax / 7.0 * best.0
}

/// Values (f32) per output channel of per-group int4 weights of `k_pad` columns in groups of
/// `group`: the groups' scales `d`, then their offsets `o`.
pub(crate) fn group_params_per_row(k_pad: usize, group: usize) -> usize {
    2 * k_pad.div_ceil(group)
}

/// Asymmetric per-group int4 quantisation of `w` ([rows, k]) into `b` ([rows, k_pad / 2]
/// pairs, the even column in the low nibble) and `params` ([rows, 2 · groups], `groups =
/// k_pad / group`: each row's scales `d`, then its offsets `o`).
///
/// For each row and group `g` (columns `g·group .. (g+1)·group`, those below `k`): `min` and
/// `max` over its non-NaN values, `d = (max - min) / 15`, `o = min + 8·d`, and each value `q =
/// clamp(round_ties_even((w - min) / d), 0, 15) - 8` in -8..=7, so that `w ≈ d·q + o`. A group
/// of equal values (`d = 0`) stores q = 0 and `o = min` (exact). Groups wholly past `k` are
/// zero (d = o = 0), columns past `k` store 0 (their activations are zero). Values `w = d'·c
/// + m'` with integer codes `c` spanning 0..=15 (a Q4_0 or Q4_1 block) come back as
/// `min = m'`, `max = m' + 15·d'`, so `q + 8 = c` and `d·q + o = d·c + m'`.
pub(crate) fn quantize_rows_i4_grouped(
    w: &[f32],
    (rows, k, k_pad): (usize, usize, usize),
    group: usize,
    b: &mut [I4x2],
    params: &mut [f32],
) {
    let per_row = k_pad / 2;
    let groups = k_pad.div_ceil(group);
    let mut q = vec![0i8; k_pad];
    for ((src, dst), p) in w
        .chunks_exact(k)
        .zip(b.chunks_exact_mut(per_row))
        .zip(params.chunks_exact_mut(2 * groups))
        .take(rows)
    {
        q.fill(0);
        let (ds, os) = p.split_at_mut(groups);
        for g in 0..groups {
            let c0 = g * group;
            let vals = src.get(c0..(c0 + group).min(k)).unwrap_or(&[]);
            let (lo, hi) = vals
                .iter()
                .filter(|x| !x.is_nan())
                .fold((f32::INFINITY, f32::NEG_INFINITY), |(a, b), &x| {
                    (a.min(x), b.max(x))
                });
            if lo > hi {
                // No value (past k, or all NaN): zero.
                ds[g] = 0.0;
                os[g] = 0.0;
                continue;
            }
            let d = (hi - lo) / 15.0;
            ds[g] = d;
            os[g] = lo + 8.0 * d;
            if d > 0.0 {
                for (qc, &x) in q[c0..].iter_mut().zip(vals) {
                    // `as` maps NaN to 0; the clamp keeps rounding at the ends in range.
                    *qc = ((x - lo) / d).round_ties_even().clamp(0.0, 15.0) as i8 - 8;
                }
            } else {
                // Equal values: q = 0, so that the NPU's scale for this group (which must be
                // positive, see `segment_group_scales`) multiplies zeros.
                os[g] = lo;
            }
        }
        for (i, d) in dst.iter_mut().enumerate() {
            *d = I4x2::new(q[2 * i], q[2 * i + 1]);
        }
    }
}

/// Checks per-group int4 weights filled from outside before they reach the NPU: every group
/// scale finite and not negative, every offset finite, and a group of scale 0 holding zeros
/// in its columns below `k` (the NPU is given a scale of 1 for it, as it takes positive scales
/// only: its value is its offset, as [`quantize_rows_i4_grouped`] makes it). `rows` holds
/// whole rows of `k_pad / 2` pairs, `params` their `2 · k_pad / group` values each; the
/// first row is row `row0` of the linear, whose indices the errors give.
pub(crate) fn check_grouped_i4(
    rows: &[I4x2],
    (k, k_pad): (usize, usize),
    group: usize,
    params: &[f32],
    row0: usize,
) -> Result<()> {
    let groups = k_pad.div_ceil(group);
    for (j, (row, p)) in rows
        .chunks_exact(k_pad / 2)
        .zip(params.chunks_exact(2 * groups))
        .enumerate()
    {
        let j = row0 + j;
        if let Some(i) = p.iter().position(|v| !v.is_finite()) {
            return Err(Error::OutOfRange {
                what: "per-group int4 scales and offsets",
                index: j * 2 * groups + i,
                value: 0,
                range: "finite f32",
            });
        }
        for (g, &d) in p[..groups].iter().enumerate() {
            if d < 0.0 {
                return Err(Error::OutOfRange {
                    what: "per-group int4 scales",
                    index: j * 2 * groups + g,
                    value: -1,
                    range: ">= 0 (max - min over the group, over 15)",
                });
            }
            if d > 0.0 {
                continue;
            }
            for c in g * group..((g + 1) * group).min(k) {
                let (lo, hi) = row[c / 2].get();
                let q = if c % 2 == 0 { lo } else { hi };
                if q != 0 {
                    return Err(Error::OutOfRange {
                        what: "per-group int4 weights",
                        index: j * k_pad + c,
                        value: q.into(),
                        range: "0 in a group of scale 0 (its value is its offset)",
                    });
                }
            }
        }
    }
    Ok(())
}

/// Each of the `m` rows of `x` ([m, ld], `k` values per row) summed over each group of `group`
/// columns after rounding to f16 (what the NPU multiplies), in f32 in column order, into `sums`
/// ([m, groups]; groups past `k` sum to zero).
pub(crate) fn f16_group_sums(
    x: &[f32],
    (m, ld, k): (usize, usize, usize),
    group: usize,
    groups: usize,
    sums: &mut Vec<f32>,
) {
    sums.clear();
    sums.resize(m * groups, 0.0);
    for (row, s) in x.chunks(ld).zip(sums.chunks_exact_mut(groups)).take(m) {
        for (vals, s) in row[..k].chunks(group).zip(s.iter_mut()) {
            *s = vals.iter().map(|&v| f16::from_f32(v).to_f32()).sum();
        }
    }
}

/// The finish of per-group W4A16: `out[r][j] = acc[r][j] + Σ_g o[j][g] · sums[r][g]` (the sum
/// over groups in f32, in group order, then added to the NPU's f32 result), `params` the
/// block's rows of per-group parameters (`2 · groups` each: scales, then offsets).
pub(crate) fn finish_grouped(
    acc: &[f32],
    (m, width, valid): (usize, usize, usize),
    params: &[f32],
    groups: usize,
    sums: &[f32],
    out: &mut OutCols,
) {
    for r in 0..m {
        let a = &acc[r * width..r * width + valid];
        let s = &sums[r * groups..(r + 1) * groups];
        for ((o, &x), p) in out
            .row(r)
            .iter_mut()
            .zip(a)
            .zip(params.chunks_exact(2 * groups))
        {
            let offsets = &p[groups..];
            let add: f32 = offsets.iter().zip(s).map(|(&o, &s)| o * s).sum();
            *o = x + add;
        }
    }
}

/// [`EngineKind::write_b`] for int4: the context's columns of `rows` unpacked to one value per
/// element in the normal [ks, width] layout (zero past `k`), converted to native B by the
/// runtime's own converter ([`Matmul::b_to_native`], which packs its input as the runtime's
/// \[open\] converter-input setting says).
fn write_b_i4<K: MatmulKind<B = I4x2>>(
    mm: &Matmul<K>,
    rows: &[I4x2],
    k: usize,
    k0: usize,
    ks: usize,
    width: usize,
    dst: &mut TensorMem<I4x2>,
) -> Result<()> {
    let per_row = rows.len() / width.max(1);
    let real = k.saturating_sub(k0).min(ks);
    let mut normal = Vec::new();
    normal
        .try_reserve_exact(ks * width)
        .map_err(|_| Error::HostAlloc {
            what: "a K segment's int4 weights",
            bytes: (ks * width) as u64,
        })?;
    normal.resize(ks * width, 0i8);
    for (j, row) in rows.chunks_exact(per_row).take(width).enumerate() {
        for c in 0..real {
            let at = k0 + c;
            let (lo, hi) = row[at / 2].get();
            normal[c * width + j] = if at % 2 == 0 { lo } else { hi };
        }
    }
    mm.b_to_native(&normal, dst)
}

/// [`glue::quantize_rows`] of each row, or with `twice` each row and its residual
/// ([`quantize_with_residual`]): the int8 activations of W8A8 and W4A8.
#[allow(clippy::too_many_arguments)] // The operands of the conversion.
fn prepare_i8_rows(
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

/// The finish of the integer formats (W8A8, W4A8). With `per = 1`: `out = (acc · row_scale)
/// · ch_scale` ([`glue::scale_out`]). With `per = 2`: `out = (acc₀ · s₀ + acc₁ · s₁) ·
/// ch_scale`, in exactly this order (`per` is 1 or 2).
#[allow(clippy::too_many_arguments)] // The operands of the formula.
fn finish_i32_rows(
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
            for (((o, &x0), &x1), &ch) in o.iter_mut().zip(a0).zip(a1).zip(&ch_scales[..valid]) {
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The two-addition rounding is `round_ties_even` of the clamped value: every quarter
    /// step over ±9 (the ties among them), near-ties, and NaN.
    #[test]
    fn int4_rounding_is_round_ties_even_of_the_clamped_value() {
        let mut vs: Vec<f32> = (-36..=36).map(|i| i as f32 / 4.0).collect();
        for t in [0.5f32, 1.5, 2.5, 6.5, 7.5] {
            // The neighbouring f32s of a positive `t` (`next_down`/`next_up` are newer than
            // the MSRV).
            let (below, above) = (
                f32::from_bits(t.to_bits() - 1),
                f32::from_bits(t.to_bits() + 1),
            );
            vs.extend([below, above, -below, -above]);
        }
        for v in vs {
            let want = v.clamp(-7.0, 7.0).round_ties_even();
            assert_eq!(round_i4(v), want, "{v}");
        }
        assert!(round_i4(f32::NAN).is_nan());
        assert_eq!(round_i4(f32::NAN) as i8, 0);
    }

    /// The searched scale never costs more than max-abs / 7, and on a row whose one large
    /// value would waste the levels it clips that value (a smaller scale); rows of zeros, NaN
    /// and infinities quantise as documented.
    #[test]
    fn the_searched_int4_scale_costs_no_more_than_max_abs() {
        let mut state = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 11) as f32 / (1u64 << 53) as f32 - 0.5
        };
        let mut clipped = 0;
        for _ in 0..50 {
            // Products of two uniforms: heavy-tailed, as weight rows are.
            let row: Vec<f32> = (0..200).map(|_| next() * next()).collect();
            let amax = row.iter().fold(0f32, |a, &x| a.max(x.abs()));
            let s = search_i4_scale(&row);
            assert!(s <= amax / 7.0 && s >= amax / 14.0, "{s} {amax}");
            assert!(i4_cost(&row, s, 1.0 / s) <= i4_cost(&row, amax / 7.0, 7.0 / amax));
            clipped += usize::from(s < amax / 7.0);
        }
        assert!(
            clipped > 40,
            "the search clips most heavy-tailed rows: {clipped} of 50"
        );
        let (mut b, mut sc) = (vec![I4x2::default(); 2], [1f32]);
        quantize_rows_i4(&[0.0; 3], 1, 3, 4, &mut b, &mut sc);
        assert_eq!((b[0].get(), b[1].get(), sc[0]), ((0, 0), (0, 0), 0.0));
        quantize_rows_i4(&[f32::NAN, 1.0, -2.0], 1, 3, 4, &mut b, &mut sc);
        assert_eq!(b[0].get().0, 0, "NaN to 0");
        assert_eq!(
            b[1].get().0,
            -7,
            "the largest magnitude clamped or mapped to -7"
        );
        quantize_rows_i4(&[f32::INFINITY, 1.0, -2.0], 1, 3, 4, &mut b, &mut sc);
        assert_eq!((b[0].get(), b[1].get().0), ((0, 0), 0), "{sc:?}");
        assert_eq!(sc[0], f32::INFINITY);
    }
}

#[cfg(test)]
mod group_tests {
    use super::*;

    fn unpack(b: &[I4x2]) -> Vec<i8> {
        b.iter()
            .flat_map(|p| {
                let (lo, hi) = p.get();
                [lo, hi]
            })
            .collect()
    }

    /// Q4_0 (`w = d'·(c - 8)`) and Q4_1 (`w = d'·c + m'`) blocks of 32 with f16 `d'` and `m'`
    /// and codes spanning 0..=15 convert to a grid whose dequantisation `d·q + o` is every
    /// weight exactly, and `q + 8` is the block's code.
    #[test]
    fn q4_0_and_q4_1_blocks_convert_exactly() {
        let mut rng = fastrand::Rng::with_seed(7);
        let (rows, k, k_pad, g) = (5, 96, 128, 32);
        for q4_1 in [false, true] {
            let mut w = vec![0f32; rows * k];
            let mut codes = vec![0i8; rows * k];
            for block in 0..rows * k / g {
                let d = f16::from_f32(rng.f32() * 0.1 + 1e-3).to_f32();
                let m = if q4_1 {
                    f16::from_f32(-rng.f32() * 0.8).to_f32()
                } else {
                    -8.0 * d
                };
                for i in 0..g {
                    // Both ends of the code range in every block, the rest random.
                    let c = match i {
                        0 => 0,
                        1 => 15,
                        _ => rng.i8(0..16),
                    };
                    codes[block * g + i] = c;
                    w[block * g + i] = d * f32::from(c) + m;
                }
            }
            let mut b = vec![I4x2::default(); rows * k_pad / 2];
            let groups = k_pad / g;
            let mut p = vec![0f32; rows * 2 * groups];
            quantize_rows_i4_grouped(&w, (rows, k, k_pad), g, &mut b, &mut p);
            let q = unpack(&b);
            for r in 0..rows {
                let (ds, os) = p[r * 2 * groups..(r + 1) * 2 * groups].split_at(groups);
                for c in 0..k {
                    let (qv, gi) = (q[r * k_pad + c], c / g);
                    assert_eq!(qv + 8, codes[r * k + c], "q4_1={q4_1} [{r},{c}]");
                    let back = f64::from(ds[gi]) * f64::from(qv) + f64::from(os[gi]);
                    assert_eq!(back, f64::from(w[r * k + c]), "q4_1={q4_1} [{r},{c}]");
                }
                // The group wholly past K (columns 96..128): zero values and parameters.
                assert_eq!((ds[3], os[3]), (0.0, 0.0));
                assert!(q[r * k_pad + k..(r + 1) * k_pad].iter().all(|&v| v == 0));
            }
        }
    }

    /// Random rows against an f64 evaluation of the documented formula: the same codes except
    /// within a rounding of a tie, scales and offsets within f32 rounding, every dequantised
    /// weight within half a step; a group of equal values holds q = 0 and its value as offset.
    #[test]
    fn random_rows_follow_an_f64_reference_of_the_formula() {
        let mut rng = fastrand::Rng::with_seed(8);
        let (rows, k, g) = (7, 200, 64);
        let k_pad = 256;
        let groups = k_pad / g;
        let mut w: Vec<f32> = (0..rows * k).map(|_| (rng.f32() - 0.3) * 3.0).collect();
        w[..g].fill(0.25); // Row 0, group 0: equal values.
        let mut b = vec![I4x2::default(); rows * k_pad / 2];
        let mut p = vec![0f32; rows * 2 * groups];
        quantize_rows_i4_grouped(&w, (rows, k, k_pad), g, &mut b, &mut p);
        let q = unpack(&b);
        assert_eq!((p[0], p[groups]), (0.0, 0.25));
        assert!(q[..g].iter().all(|&v| v == 0));
        for r in 0..rows {
            let row = &w[r * k..(r + 1) * k];
            for gi in 0..groups {
                let vals: Vec<f64> = row
                    .iter()
                    .skip(gi * g)
                    .take(g)
                    .map(|&v| f64::from(v))
                    .collect();
                let (d, o) = (p[r * 2 * groups + gi], p[r * 2 * groups + groups + gi]);
                if vals.is_empty() {
                    assert_eq!((d, o), (0.0, 0.0));
                    continue;
                }
                let lo = vals.iter().copied().fold(f64::INFINITY, f64::min);
                let hi = vals.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let d64 = (hi - lo) / 15.0;
                if d64 == 0.0 {
                    continue;
                }
                let o64 = lo + 8.0 * d64;
                assert!((f64::from(d) - d64).abs() <= 1e-6 * d64, "[{r},{gi}] d");
                assert!(
                    (f64::from(o) - o64).abs() <= 1e-6 * (lo.abs() + hi.abs()),
                    "[{r},{gi}] o"
                );
                for (i, &v) in vals.iter().enumerate() {
                    let t = (v - lo) / d64;
                    let want = t.round().clamp(0.0, 15.0) as i8 - 8;
                    let got = q[r * k_pad + gi * g + i];
                    let near_tie = (t - t.floor() - 0.5).abs() < 1e-4;
                    assert!(got == want || near_tie, "[{r},{gi},{i}] {got} vs {want}");
                    let back = f64::from(d) * f64::from(got) + f64::from(o);
                    assert!(
                        (back - v).abs() <= 0.5 * d64 * (1.0 + 1e-5),
                        "[{r},{gi},{i}]"
                    );
                }
            }
        }
    }

    /// The group sums round each activation to f16 first, as the NPU's A holds it.
    #[test]
    fn group_sums_are_of_the_f16_activations() {
        // 1 + 2^-12 rounds to 1 in f16 (an 11-bit significand): sums of 1s, not of 1.0002.
        let x = [1.0 + 1.0 / 4096.0; 6];
        let mut sums = Vec::new();
        f16_group_sums(&x, (2, 3, 3), 2, 2, &mut sums);
        assert_eq!(sums, [2.0, 1.0, 2.0, 1.0]);
    }
}
