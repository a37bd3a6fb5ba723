//! A linear's weights converted to the engine's format but not yet resident: what
//! [`Engine::convert_from_rows`](super::Engine::convert_from_rows) makes and
//! [`Engine::linear_from_converted`](super::Engine::linear_from_converted) places on the NPU
//! cores, so that a program can store the converted weights and make them resident again
//! without converting (an LLM's converted-weight cache).
//!
//! The holder keeps the rows in the order the NPU sums them (row = output channel, padded to
//! the chip's K and N alignment), before each context's native packing. The packing is a
//! permutation the lanes do in parallel as they place a linear; keeping it out of the stored
//! form lets one stored copy serve any number of cores and any context width.

use std::num::NonZeroU16;

use super::format::{
    EngineKind, INT4_RANGE, Values, WeightFormat, invalid_i4, params_per_row, row_len, with_format,
};
use crate::dtype::{Element, I4x2, as_bytes, as_bytes_mut};
use crate::error::{Error, Result};
use rknn_chip::plan::LinearPlan;

/// A linear's weights in the engine's format, on the host: `n_pad × k_pad` values (row =
/// output channel, zero past `n` and `k`; int4 two per byte, the even column in the low
/// nibble) and, for the quantised formats (W8A8, W4A16, W4A8), one scale per output channel;
/// per-group int4 ([`LinearOptions::int4_group`](super::LinearOptions::int4_group)) has
/// instead, per output channel, its `k_pad / group` group scales then as many offsets.
///
/// Made by [`Engine::convert_from_rows`](super::Engine::convert_from_rows) (with the rotation
/// the linear will run with already applied) or, to fill from storage, by
/// [`Engine::converted_zeroed`](super::Engine::converted_zeroed) and
/// [`ConvertedWeights::values_bytes_mut`] / [`ConvertedWeights::scales_bytes_mut`]; made
/// resident by [`Engine::linear_from_converted`](super::Engine::linear_from_converted), which
/// checks what it is given.
///
/// ```
/// # if !cfg!(feature = "emulator") { return Ok(()); } // the emulator is not compiled in
/// use rknn_matmul::engine::{Engine, EngineConfig, LinearOptions, WeightFormat};
/// use rknn_matmul::{Platform, Runtime};
/// let engine = Engine::new(&Runtime::emulator(Platform::Rk3588)?, EngineConfig::default())?;
/// let w = [1.0f32, 0.0, 0.0, 0.0, 0.0, 2.0, 0.0, 0.0, 0.0, 0.0, 0.0, -1.0];
/// let rows = |first: usize, buf: &mut [f32]| {
///     buf.copy_from_slice(&w[first * 4..first * 4 + buf.len()]);
///     Ok::<(), rknn_matmul::Error>(())
/// };
/// let converted = engine.convert_from_rows(3, 4, WeightFormat::W8A8, None, rows)?;
/// // Stored and read back as bytes, then made resident without converting again.
/// let (values, scales) = (converted.values_bytes().to_vec(), converted.scales_bytes().to_vec());
/// let mut again = engine.converted_zeroed(3, 4, WeightFormat::W8A8)?;
/// again.values_bytes_mut().copy_from_slice(&values);
/// again.scales_bytes_mut().copy_from_slice(&scales);
/// let lin = engine.linear_from_converted(again, LinearOptions::default())?;
/// let y = lin.forward_vec(&[1.0, 2.0, 3.0, 4.0], 1)?;
/// // int8 weights and activations: within a rounding of [1, 4, -4].
/// assert!(y.iter().zip([1.0, 4.0, -4.0]).all(|(g, w)| (g - w).abs() < 0.05), "{y:?}");
/// # Ok::<(), rknn_matmul::Error>(())
/// ```
#[derive(Clone, PartialEq)]
pub struct ConvertedWeights {
    pub(crate) format: WeightFormat,
    pub(crate) n: usize,
    pub(crate) k: usize,
    pub(crate) n_pad: usize,
    pub(crate) k_pad: usize,
    pub(crate) values: Values,
    pub(crate) scales: Vec<f32>,
    /// Per-group int4: the group size.
    pub(crate) group: Option<NonZeroU16>,
}

impl std::fmt::Debug for ConvertedWeights {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConvertedWeights")
            .field("format", &self.format)
            .field("n", &self.n)
            .field("k", &self.k)
            .field("n_pad", &self.n_pad)
            .field("k_pad", &self.k_pad)
            .field("int4_group", &self.group)
            .finish_non_exhaustive()
    }
}

impl ConvertedWeights {
    /// Zeroed weights of `n × k` padded to `n_pad × k_pad`, or [`Error::HostAlloc`].
    pub(crate) fn zeroed(
        format: WeightFormat,
        (n, k): (usize, usize),
        (n_pad, k_pad): (usize, usize),
        group: Option<NonZeroU16>,
    ) -> Result<ConvertedWeights> {
        let values = with_format!(format, K => {
            let len = n_pad * row_len::<K>(k_pad);
            <K as EngineKind>::wrap_values(try_vec(len, Default::default(), "converted weights")?)
        });
        let per = params_per_row(format, group.map(|g| usize::from(g.get())), k_pad);
        let scales = try_vec(n_pad * per, 0.0, "converted weight scales")?;
        Ok(ConvertedWeights {
            format,
            n,
            k,
            n_pad,
            k_pad,
            values,
            scales,
            group,
        })
    }

    /// f32 parameters per output channel: 0 (F16), 1 (a scale) or per-group int4's two per
    /// group.
    fn per_row(&self) -> usize {
        params_per_row(
            self.format,
            self.group.map(|g| usize::from(g.get())),
            self.k_pad,
        )
    }

    /// The weights `convert` made for `plan` in format `K`.
    pub(crate) fn new<K: EngineKind>(
        plan: &LinearPlan,
        b: Vec<K::B>,
        mut scales: Vec<f32>,
        group: Option<NonZeroU16>,
    ) -> ConvertedWeights {
        let per = params_per_row(K::FORMAT, group.map(|g| usize::from(g.get())), plan.k_pad);
        scales.truncate(plan.n_pad * per);
        ConvertedWeights {
            format: K::FORMAT,
            n: plan.n,
            k: plan.k,
            n_pad: plan.n_pad,
            k_pad: plan.k_pad,
            values: K::wrap_values(b),
            scales,
            group,
        }
    }

    /// The per-group int4 size it was converted with
    /// ([`LinearOptions::int4_group`](super::LinearOptions::int4_group)), if any.
    pub fn int4_group(&self) -> Option<NonZeroU16> {
        self.group
    }

    /// The format.
    pub fn format(&self) -> WeightFormat {
        self.format
    }

    /// Output features (N).
    pub fn out_features(&self) -> usize {
        self.n
    }

    /// Input features (K).
    pub fn in_features(&self) -> usize {
        self.k
    }

    /// `(n_pad, k_pad)`: the shape padded to the chip's alignment, as stored.
    pub fn padded(&self) -> (usize, usize) {
        (self.n_pad, self.k_pad)
    }

    /// The values' bytes, little-endian (int8 for W8A8, f16 for F16, int4 two per byte for
    /// W4A16 and W4A8), `n_pad × k_pad` values.
    pub fn values_bytes(&self) -> &[u8] {
        match &self.values {
            Values::I8(v) => as_bytes(v),
            Values::F16(v) => as_bytes(v),
            Values::I4(v) => as_bytes(v),
        }
    }

    /// The values' bytes, to fill from storage (checked when made resident).
    pub fn values_bytes_mut(&mut self) -> &mut [u8] {
        match &mut self.values {
            Values::I8(v) => as_bytes_mut(v),
            Values::F16(v) => as_bytes_mut(v),
            Values::I4(v) => as_bytes_mut(v),
        }
    }

    /// The per-channel scales (`n_pad` for the quantised formats, none for F16), or for
    /// per-group int4 per output channel its group scales then its group offsets (`n_pad ×
    /// 2 · k_pad / group`).
    pub fn scales(&self) -> &[f32] {
        &self.scales
    }

    /// The scales' bytes, little-endian f32.
    pub fn scales_bytes(&self) -> &[u8] {
        as_bytes(&self.scales)
    }

    /// The scales' bytes, to fill from storage (checked when made resident).
    pub fn scales_bytes_mut(&mut self) -> &mut [u8] {
        as_bytes_mut(&mut self.scales)
    }

    /// Checks values filled from outside (storage) and zeroes the padding, so that nothing
    /// but the `n × k` weights and their scales reaches the NPU: int8 values in -127..=127
    /// (the exactness bound of the K sum), int4 in -7..=7 unless per-group (whose grid is
    /// -8..=7), finite scales.
    pub(crate) fn check_and_clear_padding(&mut self) -> Result<()> {
        let (n, k, k_pad) = (self.n, self.k, self.k_pad);
        let (per, grouped) = (self.per_row(), self.group.is_some());
        fn clear<T: Element>(v: &mut [T], n: usize, k: usize, k_pad: usize) {
            for row in v[..n * k_pad].chunks_exact_mut(k_pad) {
                row[k..].fill(T::default());
            }
            v[n * k_pad..].fill(T::default());
        }
        match &mut self.values {
            Values::I8(v) => {
                clear(v, n, k, k_pad);
                if let Some(index) = v.iter().position(|&q| q == i8::MIN) {
                    return Err(Error::OutOfRange {
                        what: "converted weights",
                        index,
                        value: i8::MIN.into(),
                        range: "-127..=127 (the exactness bound of the K sum assumes |q| <= 127)",
                    });
                }
            }
            Values::F16(v) => clear(v, n, k, k_pad),
            Values::I4(v) => {
                let per_row = k_pad / 2;
                for row in v[..n * per_row].chunks_exact_mut(per_row) {
                    if k % 2 == 1 {
                        // The low nibble is column k - 1, the high one padding.
                        row[k / 2] = I4x2(row[k / 2].0 & 0x0f);
                    }
                    row[k.div_ceil(2)..].fill(I4x2::default());
                }
                v[n * per_row..].fill(I4x2::default());
                if let Some((index, value)) = invalid_i4(v).filter(|_| !grouped) {
                    return Err(Error::OutOfRange {
                        what: "converted weights",
                        index,
                        value,
                        range: INT4_RANGE,
                    });
                }
            }
        }
        if let Some(pad) = self.scales.get_mut(n * per..) {
            pad.fill(0.0);
        }
        if let Some(index) = self.scales.iter().position(|s| !s.is_finite()) {
            return Err(Error::OutOfRange {
                what: "converted weight scales",
                index,
                value: 0,
                range: "finite f32",
            });
        }
        Ok(())
    }

    /// The values as `K`'s B elements (`None` if the format is not `K`'s).
    pub(crate) fn into_parts<K: EngineKind>(self) -> Option<(Vec<K::B>, Vec<f32>)> {
        let per = self.per_row().max(1);
        let b = K::unwrap_values(self.values)?;
        let mut scales = self.scales;
        scales.resize(self.n_pad * per, 0.0);
        Some((b, scales))
    }
}

/// The scales of converted weights of `n` output channels padded to `n_pad`, `per` f32 per
/// channel ([`params_per_row`]), from their bytes: checked (their length, finite), padding
/// zeroed, `n_pad × max(per, 1)` long.
pub(crate) fn scales_from_bytes(
    (n, n_pad): (usize, usize),
    per: usize,
    bytes: &[u8],
) -> Result<Vec<f32>> {
    let want = n_pad * per * 4;
    if bytes.len() != want {
        return Err(Error::Length {
            what: "converted weight scale bytes",
            expected: want,
            got: bytes.len(),
        });
    }
    let mut scales: Vec<f32> = bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    if let Some(pad) = scales.get_mut(n * per..) {
        pad.fill(0.0);
    }
    if let Some(index) = scales.iter().position(|s| !s.is_finite()) {
        return Err(Error::OutOfRange {
            what: "converted weight scales",
            index,
            value: 0,
            range: "finite f32",
        });
    }
    scales.resize(n_pad * per.max(1), 0.0);
    Ok(scales)
}

/// Converted weights held outside the engine, for instance in a mapped file: the layout of
/// [`ConvertedWeights`] as bytes, which [`Engine::linear_from_bytes`](super::Engine::linear_from_bytes)
/// places without a host copy, each lane packing its rows straight from them into its
/// contexts' memories and then saying so ([`ConvertedBytes::placed`]), so that a mapped file
/// can give back those pages at once: loading never holds a linear twice.
pub trait ConvertedBytes: Send + Sync {
    /// The values: `n_pad × k_pad` little-endian values of the format (int8, f16 aligned to
    /// 2 bytes, or int4 two per byte), as [`ConvertedWeights::values_bytes`] lays them out.
    fn values(&self) -> &[u8];

    /// The scales: `n_pad` little-endian f32 for the quantised formats, none for F16; for
    /// per-group int4, per output channel its group scales then offsets
    /// ([`ConvertedWeights::scales`]).
    fn scales(&self) -> &[u8];

    /// Output channels `rows` are placed: their values are not read again.
    fn placed(&self, rows: std::ops::Range<usize>) {
        let _ = rows;
    }
}

/// A linear's converted values as its lanes read them: all `n_pad × k_pad`, and a hint
/// when a range of rows is placed.
pub(crate) trait WeightRows<T>: Send + Sync {
    /// Every value (empty if they cannot be viewed as `T`).
    fn all(&self) -> &[T];

    /// Rows `rows` are placed.
    fn placed(&self, rows: std::ops::Range<usize>);
}

impl<T: Send + Sync> WeightRows<T> for Vec<T> {
    fn all(&self) -> &[T] {
        self
    }

    fn placed(&self, _rows: std::ops::Range<usize>) {}
}

/// [`ConvertedBytes`] viewed as values of `T`.
pub(crate) struct External<T> {
    pub(crate) bytes: std::sync::Arc<dyn ConvertedBytes>,
    pub(crate) _values: std::marker::PhantomData<fn() -> T>,
}

impl<T: Element> WeightRows<T> for External<T> {
    fn all(&self) -> &[T] {
        crate::dtype::from_bytes(self.bytes.values()).unwrap_or(&[])
    }

    fn placed(&self, rows: std::ops::Range<usize>) {
        self.bytes.placed(rows);
    }
}

/// `len` copies of `value`, or [`Error::HostAlloc`] when the host cannot back them: weight
/// buffers are sized by the caller's matrices, and on a small board running out must be an
/// error, not an abort.
pub(crate) fn try_vec<T: Clone>(len: usize, value: T, what: &'static str) -> Result<Vec<T>> {
    let mut v = Vec::new();
    v.try_reserve_exact(len).map_err(|_| Error::HostAlloc {
        what,
        bytes: (len as u64).saturating_mul(std::mem::size_of::<T>() as u64),
    })?;
    v.resize(len, value);
    Ok(v)
}
