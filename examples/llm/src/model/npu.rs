//! The NPU backend: every weight matmul runs through the SDK's engine
//! ([`rknn_matmul::engine`]) as a linear resident in NPU memory, on the real NPU or on the
//! emulator, through the same code path.
//!
//! W8A8 (the default): each weight row is quantised to int8 with one scale per output channel,
//! each activation row to int8 with one scale per row; the NPU sums exactly in i32 and the
//! scales are applied on the host. Plain W8A8 loses too much on a small model (SmolLM2-135M:
//! 88 % top-1 agreement with the f32 path). Three changes, all in int8 arithmetic on the NPU,
//! bring it within 1 % of f32's perplexity and above 96 % agreement (docs/llm.md):
//!
//! * every linear's input is rotated by a random orthogonal transform (random signs, a
//!   Walsh–Hadamard transform per 64-channel block, a random orthogonal mix across the blocks):
//!   the weights once at load, the activations by the engine, so outlier channels no longer
//!   set the row's int8 scale;
//! * each activation row is quantised twice, as itself and as its residual, and both rows go
//!   through the NPU (about 15 bits of activation precision; decode, bound by reading the
//!   weights, pays nothing for the second row);
//! * each weight row's scale minimises its squared quantisation error instead of fitting its
//!   maximum.
//!
//! F16 weights and activations are the higher-precision option. Weights are converted a few
//! rows at a time (dequantise, rotate, quantise), so loading never holds a whole matrix in f32
//! for W8A8.

use rknn_matmul::engine::{Engine, Linear, LinearOptions, Rotation, WeightFormat, glue};

use super::linear::{BackendError, LinearFactory, LinearOp, stacked_shape};
use crate::gguf::TensorView;

/// How the engine backend converts weights and treats activations. The defaults are what it
/// takes to keep W8A8 within the accuracy bar of issue 14 on SmolLM2-135M (top-1 agreement
/// with the f32 path >= 96 %, perplexity within 1 %; the figures are in docs/llm.md).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EngineOptions {
    /// W8A8 (default) or F16.
    pub format: WeightFormat,
    /// Rotate each linear's input by a randomized Hadamard transform over 64-channel blocks,
    /// mixed across blocks by a random orthogonal matrix (default: yes).
    pub rotate: bool,
    /// Quantise each activation row twice, as itself and as its residual (default: yes): about
    /// 15 bits of activation precision from int8 arithmetic, for a second row of A.
    pub residual_activations: bool,
    /// Choose each weight row's int8 scale to minimise the squared error (searching clipped
    /// fractions of the row's maximum) instead of taking the maximum (default: yes).
    pub mse_weight_scales: bool,
    /// Seed of the rotations.
    pub seed: u64,
}

impl Default for EngineOptions {
    fn default() -> Self {
        EngineOptions {
            format: WeightFormat::W8A8,
            rotate: true,
            residual_activations: true,
            mse_weight_scales: true,
            seed: 0x5EED,
        }
    }
}

/// Rows converted at a time (dequantise, rotate, quantise) while loading.
const ROWS_PER_STEP: usize = 256;

/// Builds engine linears from GGUF weights.
#[derive(Debug)]
pub struct EngineFactory {
    engine: Engine,
    opts: EngineOptions,
}

impl EngineFactory {
    /// A factory that makes its linears resident on `engine`.
    pub fn new(engine: Engine, opts: EngineOptions) -> Self {
        EngineFactory { engine, opts }
    }

    /// The engine.
    pub fn engine(&self) -> &Engine {
        &self.engine
    }
}

impl LinearFactory for EngineFactory {
    fn build(&mut self, parts: &[TensorView<'_>]) -> Result<Box<dyn LinearOp>, BackendError> {
        let (k, n) = stacked_shape(parts)?;
        let o = self.opts;
        let rotation = o.rotate.then(|| Rotation::hadamard_mixed(k, o.seed));
        let opts = LinearOptions {
            rotation: rotation.clone(),
            residual_activations: o.residual_activations,
        };
        let linear = match o.format {
            WeightFormat::W8A8 => {
                let mut q = vec![0i8; n * k];
                let mut scales = vec![0f32; n];
                let mut rows = vec![0f32; ROWS_PER_STEP * k];
                let mut r0 = 0;
                for t in parts {
                    let tn = usize::try_from(t.dims()[1])?;
                    for first in (0..tn).step_by(ROWS_PER_STEP) {
                        let count = ROWS_PER_STEP.min(tn - first);
                        let buf = &mut rows[..count * k];
                        t.rows_to_f32(first, buf)?;
                        if let Some(r) = &rotation {
                            r.apply_rows(buf);
                        }
                        let at = r0 + first;
                        let (q, scales) = (
                            &mut q[at * k..(at + count) * k],
                            &mut scales[at..at + count],
                        );
                        if o.mse_weight_scales {
                            for ((row, qr), s) in
                                buf.chunks_exact(k).zip(q.chunks_exact_mut(k)).zip(scales)
                            {
                                *s = quantize_row_mse(row, qr);
                            }
                        } else {
                            glue::quantize_rows(buf, count, k, k, q, scales);
                        }
                    }
                    r0 += tn;
                }
                self.engine.linear_quantized_with(&q, &scales, n, k, opts)?
            }
            WeightFormat::F16 => {
                let mut w = Vec::with_capacity(n * k);
                for t in parts {
                    w.extend_from_slice(&t.to_f32()?);
                }
                self.engine.linear_with(&w, n, k, WeightFormat::F16, opts)?
            }
        };
        Ok(Box::new(EngineLinear { linear }))
    }
}

/// Quantises one weight row to int8 (-127..=127) with the scale that minimises the squared
/// error among `amax · (1 - i/100) / 127` for `i` in 0..=20 (searched coarsely, then refined
/// around the best), and returns the scale. Clipping the few largest weights a little makes the
/// step finer for all the others.
pub fn quantize_row_mse(row: &[f32], q: &mut [i8]) -> f32 {
    let amax = row.iter().fold(0f32, |a, &v| a.max(v.abs()));
    if amax == 0.0 || !amax.is_finite() {
        // Zero rows quantise to zero; a row with an infinity or NaN keeps the plain rule.
        let mut s = [0f32];
        glue::quantize_rows(row, 1, row.len(), row.len(), q, &mut s);
        return s[0];
    }
    let scale_of = |i: i32| amax * (1.0 - i as f32 / 100.0) / 127.0;
    let mut errs = [f32::INFINITY; 21];
    let mut err = |i: i32| -> f32 {
        let slot = &mut errs[i as usize];
        if slot.is_infinite() {
            *slot = squared_error(row, scale_of(i));
        }
        *slot
    };
    let mut best = (0..=20)
        .step_by(4)
        .min_by(|&a, &b| err(a).total_cmp(&err(b)))
        .unwrap_or(0);
    for i in (best - 3).max(0)..=(best + 3).min(20) {
        if err(i) < err(best) {
            best = i;
        }
    }
    let scale = scale_of(best);
    let inv = 1.0 / scale;
    for (d, &v) in q.iter_mut().zip(row) {
        *d = round_even((v * inv).clamp(-127.0, 127.0)) as i8;
    }
    scale
}

/// Round half to even of a value in -127..=127 (adding and removing 1.5 · 2²³ leaves the
/// nearest integer, ties to even, under the default rounding mode): one add and one subtract
/// that vectorise, where `round_ties_even` may be a library call per element.
#[inline(always)]
fn round_even(v: f32) -> f32 {
    const MAGIC: f32 = 12_582_912.0;
    (v + MAGIC) - MAGIC
}

/// The squared error of quantising `row` with `scale`, summed in 8 lanes.
fn squared_error(row: &[f32], scale: f32) -> f32 {
    let inv = 1.0 / scale;
    let mut acc = [0f32; 8];
    let mut chunks = row.chunks_exact(8);
    for c in &mut chunks {
        for (a, &v) in acc.iter_mut().zip(c) {
            let e = v - round_even((v * inv).clamp(-127.0, 127.0)) * scale;
            *a += e * e;
        }
    }
    let tail: f32 = chunks
        .remainder()
        .iter()
        .map(|&v| {
            let e = v - round_even((v * inv).clamp(-127.0, 127.0)) * scale;
            e * e
        })
        .sum();
    acc.iter().sum::<f32>() + tail
}

/// A weight resident on the NPU.
#[derive(Debug)]
pub struct EngineLinear {
    linear: Linear,
}

impl LinearOp for EngineLinear {
    fn in_features(&self) -> usize {
        self.linear.in_features()
    }

    fn out_features(&self) -> usize {
        self.linear.out_features()
    }

    fn forward(&self, x: &[f32], m: usize, out: &mut [f32]) -> Result<(), BackendError> {
        Ok(self.linear.forward(x, m, out)?)
    }

    fn kind(&self) -> &'static str {
        match self.linear.format() {
            WeightFormat::W8A8 => "w8a8",
            WeightFormat::F16 => "f16",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn magic_rounding_is_round_half_even_on_the_int8_range() {
        let mut v = -127.0f32;
        while v <= 127.0 {
            assert_eq!(round_even(v), v.round_ties_even(), "{v}");
            v += 0.125;
        }
        for v in [0.5f32, 1.5, 2.5, -0.5, -1.5, 126.5, -126.5, 0.49999997] {
            assert_eq!(round_even(v), v.round_ties_even(), "{v}");
        }
    }

    #[test]
    fn least_squares_scales_never_lose_to_the_maximum() {
        let mut rng = fastrand::Rng::with_seed(8);
        for k in [7, 64, 576] {
            // Heavy-tailed rows, where clipping pays.
            let row: Vec<f32> = (0..k)
                .map(|_| {
                    let u = rng.f32() - 0.5;
                    u * u * u * 8.0
                })
                .collect();
            let mut q = vec![0i8; k];
            let s = quantize_row_mse(&row, &mut q);
            let amax = row.iter().fold(0f32, |a, &v| a.max(v.abs()));
            assert!(s <= amax / 127.0 && s >= 0.8 * amax / 127.0 - 1e-12);
            let err = |scale: f32, q: &[i8]| -> f64 {
                row.iter()
                    .zip(q)
                    .map(|(&v, &qv)| f64::from(v - f32::from(qv) * scale).powi(2))
                    .sum()
            };
            let mut qm = vec![0i8; k];
            let mut sm = [0f32];
            glue::quantize_rows(&row, 1, k, k, &mut qm, &mut sm);
            assert!(err(s, &q) <= err(sm[0], &qm) + 1e-12, "k={k}");
        }
        let mut q = [1i8; 4];
        assert_eq!(quantize_row_mse(&[0.0; 4], &mut q), 0.0);
        assert_eq!(q, [0; 4]);
    }
}
