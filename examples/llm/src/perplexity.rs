//! Teacher-forced perplexity, as llama.cpp's `llama-perplexity` defines it per window: the
//! tokens are cut into windows of the context length, each evaluated from an empty cache, and
//! every token but a window's first is scored with the previous position's logits.

use crate::model::{Logits, Model, Sequence};
use crate::session::GenerateError;

/// The result of [`perplexity`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Perplexity {
    /// `exp(nll)`.
    pub ppl: f64,
    /// The mean negative log-likelihood of the scored tokens (natural log).
    pub nll: f64,
    /// Tokens scored.
    pub scored: usize,
    /// Windows evaluated.
    pub windows: usize,
}

/// The perplexity of `ids` under `model`, evaluated in `seq` (reset first, and between
/// windows) in forward passes of `batch` tokens. `scored_row` sees each scored position's
/// logits row (`--dump-logits`), in order.
pub fn perplexity(
    model: &Model,
    seq: &mut Sequence,
    ids: &[u32],
    batch: usize,
    mut scored_row: impl FnMut(&[f32]) -> std::io::Result<()>,
) -> Result<Perplexity, GenerateError> {
    if ids.len() < 2 {
        return Err(GenerateError::TooShort {
            need: 2,
            got: ids.len(),
        });
    }
    let n_ctx = seq.n_ctx();
    let n_vocab = model.config().n_vocab;
    let batch = batch.max(1);
    let (mut nll, mut scored, mut windows) = (0.0f64, 0usize, 0usize);
    for window in ids.chunks(n_ctx) {
        seq.reset();
        windows += 1;
        for (c, chunk) in window.chunks(batch).enumerate() {
            let start = c * batch;
            let logits = model.forward(seq, chunk, start, Logits::All)?;
            for (r, row) in logits.chunks_exact(n_vocab).enumerate() {
                let Some(&next) = window.get(start + r + 1) else {
                    continue;
                };
                nll -= log_softmax_at(row, next as usize);
                scored += 1;
                scored_row(row)?;
            }
        }
    }
    let nll = nll / scored.max(1) as f64;
    Ok(Perplexity {
        ppl: nll.exp(),
        nll,
        scored,
        windows,
    })
}

/// `log softmax(row)[i]`, in f64.
pub fn log_softmax_at(row: &[f32], i: usize) -> f64 {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = row
        .iter()
        .map(|&v| (f64::from(v) - f64::from(max)).exp())
        .sum();
    f64::from(row[i]) - f64::from(max) - sum.ln()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_softmax_is_the_log_of_the_normalised_exponential() {
        let row = [1.0f32, 2.0, 0.5, -3.0];
        let z: f64 = row.iter().map(|&v| f64::from(v).exp()).sum();
        for (i, &v) in row.iter().enumerate() {
            let want = (f64::from(v).exp() / z).ln();
            assert!((log_softmax_at(&row, i) - want).abs() < 1e-12);
        }
    }
}
