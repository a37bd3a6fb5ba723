//! Teacher-forced perplexity: by default what llama.cpp's `llama-perplexity` computes, so the
//! two programs give comparable numbers on the same text, model and context size.
//!
//! [`Scoring::SecondHalf`] (the default) is `llama-perplexity`'s: the text is tokenized with the
//! vocabulary's special tokens (BOS when it adds one) and cut into chunks of `n_ctx` tokens; the
//! tail that does not fill a chunk is left out, and the text must give at least two chunks
//! (`2 n_ctx` tokens). Each chunk is evaluated from an empty cache with its first token replaced
//! by BOS (when the vocabulary adds one), and only its second half is scored: the tokens at
//! positions `n_ctx/2 + 1 .. n_ctx`, each from the logits of the position before it, so every
//! scored token has at least half a chunk of context. That is `n_ctx - n_ctx/2 - 1` tokens per
//! chunk. The first half's positions only fill the cache (their logits are not computed).
//!
//! [`Scoring::EveryToken`] scores every token of the text but the first: windows of `n_ctx`
//! positions, each from an empty cache, the first the text's first `n_ctx` tokens, each later one
//! a BOS (when the vocabulary adds one) followed by the next `n_ctx - 1` tokens; every token of a
//! window but its first is scored. Early tokens of a window have little context, so its
//! perplexity is higher than the second half's, but it scores every token exactly once, and with
//! a context longer than the text it scores the whole text in one window (what comparing two
//! backends' logits row by row needs: `llm-decode --perplexity-scoring every-token
//! --dump-logits`).
//!
//! The error estimate is `llama-perplexity`'s: with `v` the negative log-likelihood of each
//! scored token, `ppl · sqrt((mean(v²) − mean(v)²) / (N − 1))` over the `N` scored tokens (the
//! standard error of the mean `v`, carried through `exp`).

use std::num::NonZeroUsize;

use crate::model::{Logits, Model, ModelError, Sequence};
use crate::tokenizer::{Tokenizer, TokenizerError};

/// Which tokens are scored, in which windows ([module docs](self)).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Scoring {
    /// `llama-perplexity`'s: chunks of `n_ctx` tokens each beginning with BOS, the second half
    /// of each scored.
    #[default]
    SecondHalf,
    /// Every token but the text's first, in windows of `n_ctx` positions each beginning with
    /// BOS.
    EveryToken,
}

impl Scoring {
    /// The name `llm-decode --perplexity-scoring` takes and reports: `second-half`,
    /// `every-token`.
    pub fn name(self) -> &'static str {
        match self {
            Scoring::SecondHalf => "second-half",
            Scoring::EveryToken => "every-token",
        }
    }
}

impl std::fmt::Display for Scoring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// How [`perplexity`] runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PerplexityParams {
    /// Which tokens are scored.
    pub scoring: Scoring,
    /// Tokens per forward pass (0 is taken as 1).
    pub batch: usize,
    /// Evaluate at most this many chunks (windows), the first ones (`llama-perplexity
    /// --chunks`); `None`: all the text gives.
    pub max_chunks: Option<NonZeroUsize>,
}

impl Default for PerplexityParams {
    fn default() -> Self {
        PerplexityParams {
            scoring: Scoring::SecondHalf,
            batch: 128,
            max_chunks: None,
        }
    }
}

/// The result of [`perplexity`].
#[derive(Clone, Debug, PartialEq)]
pub struct Perplexity {
    /// `exp(nll)`.
    pub ppl: f64,
    /// `llama-perplexity`'s `±` on `ppl`: the standard error of `nll` times `ppl`; `None` with
    /// a single scored token.
    pub ppl_error: Option<f64>,
    /// The mean negative log-likelihood of the scored tokens (natural log).
    pub nll: f64,
    /// Tokens scored.
    pub scored: usize,
    /// Chunks (windows) evaluated.
    pub chunks: usize,
    /// The text's tokens (BOS included).
    pub tokens: usize,
    /// Tokens evaluated (forward passes' rows, the BOS of each chunk included).
    pub evaluated: usize,
    /// The context size: tokens per chunk.
    pub n_ctx: usize,
    /// The perplexity over the chunks so far, after each chunk (what `llama-perplexity` prints
    /// as `[1]…,[2]…`).
    pub running: Vec<f64>,
    /// Which tokens were scored.
    pub scoring: Scoring,
}

/// Why [`perplexity`] failed.
#[derive(Debug, thiserror::Error)]
pub enum PerplexityError {
    /// The text gives too few tokens for the scoring and context size.
    #[error(
        "{scoring} perplexity with a context of {n_ctx} needs at least {need} tokens; the text \
         has {got}"
    )]
    TextTooShort {
        /// The scoring asked for.
        scoring: Scoring,
        /// The context size.
        n_ctx: usize,
        /// Tokens needed (BOS included).
        need: usize,
        /// Tokens the text gives (BOS included).
        got: usize,
    },
    /// The context is too small to score two tokens per chunk (second half) or one per window
    /// (every token).
    #[error("{scoring} perplexity needs a context of at least {need} positions, not {n_ctx}")]
    ContextTooSmall {
        /// The scoring asked for.
        scoring: Scoring,
        /// The context size.
        n_ctx: usize,
        /// The smallest it can be.
        need: usize,
    },
    /// The vocabulary appends EOS to every tokenized text (`tokenizer.ggml.add_eos_token`), which
    /// `llama-perplexity` refuses too.
    #[error(
        "the vocabulary appends EOS to every text (tokenizer.ggml.add_eos_token), which \
         perplexity does not score"
    )]
    AppendsEos,
    /// The model and the tokenizer disagree on the vocabulary.
    #[error("the model's {model} logits do not match the vocabulary's {tokenizer} tokens")]
    VocabularyMismatch {
        /// The model's logits per row.
        model: usize,
        /// The tokenizer's tokens.
        tokenizer: usize,
    },
    /// The text could not be tokenized.
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
    /// The forward pass refused its input.
    #[error(transparent)]
    Model(#[from] ModelError),
    /// The scored rows' callback failed (writing `--dump-logits`).
    #[error("writing the logits: {0}")]
    Io(#[from] std::io::Error),
}

/// The perplexity of `text` under `model` as `params` say ([module docs](self)), evaluated in
/// `seq` (reset before each chunk; its context size is the chunk size). The text is tokenized
/// as `llama-perplexity` tokenizes it: with BOS when the vocabulary adds one, special tokens
/// written in the text left as text. `scored_row` sees each scored position's logits row, in
/// order (`--dump-logits`).
pub fn perplexity(
    model: &Model,
    seq: &mut Sequence,
    tokenizer: &Tokenizer,
    text: &str,
    params: &PerplexityParams,
    scored_row: impl FnMut(&[f32]) -> std::io::Result<()>,
) -> Result<Perplexity, PerplexityError> {
    let (m, t) = (model.config().n_vocab, tokenizer.n_vocab());
    if m != t {
        return Err(PerplexityError::VocabularyMismatch {
            model: m,
            tokenizer: t,
        });
    }
    if tokenizer.add_eos() {
        return Err(PerplexityError::AppendsEos);
    }
    let ids = tokenizer.encode(text, true, false)?;
    let bos = if tokenizer.add_bos() {
        tokenizer.bos()
    } else {
        None
    };
    perplexity_of_ids(model, seq, &ids, bos, params, scored_row)
}

/// [`perplexity`] of the token ids `ids` (tokenized already, with their BOS if any); `bos`: the
/// token each chunk (window) begins with, `None` when the vocabulary adds none.
pub fn perplexity_of_ids(
    model: &Model,
    seq: &mut Sequence,
    ids: &[u32],
    bos: Option<u32>,
    params: &PerplexityParams,
    scored_row: impl FnMut(&[f32]) -> std::io::Result<()>,
) -> Result<Perplexity, PerplexityError> {
    let n_ctx = seq.n_ctx();
    let scoring = params.scoring;
    let need_ctx = match scoring {
        // n_ctx - n_ctx/2 - 1 >= 1 scored token per chunk.
        Scoring::SecondHalf => 3,
        Scoring::EveryToken => 2,
    };
    if n_ctx < need_ctx {
        return Err(PerplexityError::ContextTooSmall {
            scoring,
            n_ctx,
            need: need_ctx,
        });
    }
    let windows = match scoring {
        Scoring::SecondHalf => second_half_chunks(ids, n_ctx, bos)?,
        Scoring::EveryToken => every_token_windows(ids, n_ctx, bos)?,
    };
    let windows = match params.max_chunks {
        Some(max) => &windows[..windows.len().min(max.get())],
        None => &windows[..],
    };
    let mut acc = Accumulator {
        model,
        seq,
        batch: params.batch.max(1),
        scored_row,
        sum: 0.0,
        sum2: 0.0,
        scored: 0,
    };
    let mut running = Vec::with_capacity(windows.len());
    for w in windows {
        acc.seq.reset();
        acc.score(&w.tokens, w.first_scored)?;
        running.push((acc.sum / acc.scored as f64).exp());
    }
    let n = acc.scored as f64;
    let nll = acc.sum / n;
    let ppl = nll.exp();
    // `llama-perplexity`'s estimate (rounding can make a zero variance slightly negative).
    let var = (acc.sum2 / n - nll * nll).max(0.0);
    let ppl_error = (acc.scored > 1).then(|| ppl * (var / (n - 1.0)).sqrt());
    Ok(Perplexity {
        ppl,
        ppl_error,
        nll,
        scored: acc.scored,
        chunks: windows.len(),
        tokens: ids.len(),
        evaluated: windows.iter().map(|w| w.tokens.len()).sum(),
        n_ctx,
        running,
        scoring,
    })
}

/// One chunk (window) to evaluate from an empty cache: its tokens and the first position whose
/// logits are scored (against the token after it).
struct Window {
    tokens: Vec<u32>,
    first_scored: usize,
}

/// `llama-perplexity`'s chunks: `ids.len() / n_ctx` of `n_ctx` tokens, the first of each
/// replaced by `bos`, scored from position `n_ctx / 2`.
fn second_half_chunks(
    ids: &[u32],
    n_ctx: usize,
    bos: Option<u32>,
) -> Result<Vec<Window>, PerplexityError> {
    if ids.len() < 2 * n_ctx {
        return Err(PerplexityError::TextTooShort {
            scoring: Scoring::SecondHalf,
            n_ctx,
            need: 2 * n_ctx,
            got: ids.len(),
        });
    }
    Ok(ids
        .chunks_exact(n_ctx)
        .map(|c| {
            let mut tokens = c.to_vec();
            if let Some(b) = bos {
                tokens[0] = b;
            }
            Window {
                tokens,
                first_scored: n_ctx / 2,
            }
        })
        .collect())
}

/// Windows covering every token: the first `n_ctx` tokens, then `bos` (if any) and the next
/// ones; scored from position 0.
fn every_token_windows(
    ids: &[u32],
    n_ctx: usize,
    bos: Option<u32>,
) -> Result<Vec<Window>, PerplexityError> {
    let mut windows = Vec::new();
    let mut rest = ids;
    let mut scored = 0;
    while !rest.is_empty() {
        let mut tokens = Vec::with_capacity(n_ctx);
        if let (Some(b), false) = (bos, windows.is_empty()) {
            tokens.push(b);
        }
        let take = (n_ctx - tokens.len()).min(rest.len());
        tokens.extend_from_slice(&rest[..take]);
        rest = &rest[take..];
        scored += tokens.len() - 1;
        windows.push(Window {
            tokens,
            first_scored: 0,
        });
    }
    if scored == 0 {
        return Err(PerplexityError::TextTooShort {
            scoring: Scoring::EveryToken,
            n_ctx,
            need: 2,
            got: ids.len(),
        });
    }
    Ok(windows)
}

/// The running sums over the scored tokens.
struct Accumulator<'a, F> {
    model: &'a Model,
    seq: &'a mut Sequence,
    batch: usize,
    scored_row: F,
    /// Σ v and Σ v² over the scored tokens' negative log-likelihoods v.
    sum: f64,
    sum2: f64,
    scored: usize,
}

impl<F: FnMut(&[f32]) -> std::io::Result<()>> Accumulator<'_, F> {
    /// Evaluates `tokens` from position 0 of the (empty) sequence in passes of `self.batch`:
    /// the positions before `first` only fill the cache; from `first` on, each position's
    /// logits score the token after it.
    fn score(&mut self, tokens: &[u32], first: usize) -> Result<(), PerplexityError> {
        let n_vocab = self.model.config().n_vocab;
        for start in (0..first).step_by(self.batch) {
            let end = (start + self.batch).min(first);
            self.model
                .forward(self.seq, &tokens[start..end], start, Logits::None)?;
        }
        for start in (first..tokens.len()).step_by(self.batch) {
            let end = (start + self.batch).min(tokens.len());
            let logits = self
                .model
                .forward(self.seq, &tokens[start..end], start, Logits::All)?;
            for (r, row) in logits.chunks_exact(n_vocab).enumerate() {
                let Some(&next) = tokens.get(start + r + 1) else {
                    continue;
                };
                let v = -log_softmax_at(row, next as usize);
                self.sum += v;
                self.sum2 += v * v;
                self.scored += 1;
                (self.scored_row)(row)?;
            }
        }
        Ok(())
    }
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

    fn tokens(w: &[Window]) -> Vec<Vec<u32>> {
        w.iter().map(|w| w.tokens.clone()).collect()
    }

    /// llama-perplexity's chunks: `len / n_ctx` whole chunks (the tail left out), the first
    /// token of each replaced by BOS, scored from the middle.
    #[test]
    fn second_half_chunks_begin_with_bos_and_score_from_the_middle() {
        const B: u32 = 99;
        // The text's ids: BOS then 1..=10; n_ctx 4 gives chunks [B 1 2 3], [4 5 6 7] and the
        // tail 8 9 10.
        let ids: Vec<u32> = std::iter::once(B).chain(1..=10).collect();
        let w = second_half_chunks(&ids, 4, Some(B)).unwrap();
        assert_eq!(tokens(&w), [vec![B, 1, 2, 3], vec![B, 5, 6, 7]]);
        assert!(w.iter().all(|w| w.first_scored == 2));
        let w = second_half_chunks(&ids, 5, Some(B)).unwrap();
        assert_eq!(tokens(&w), [vec![B, 1, 2, 3, 4], vec![B, 6, 7, 8, 9]]);
        assert!(w.iter().all(|w| w.first_scored == 2));
        // A vocabulary without BOS keeps every token.
        let plain: Vec<u32> = (1..=8).collect();
        let w = second_half_chunks(&plain, 4, None).unwrap();
        assert_eq!(tokens(&w), [vec![1, 2, 3, 4], vec![5, 6, 7, 8]]);
        // Two chunks at least.
        assert!(matches!(
            second_half_chunks(&plain, 5, None),
            Err(PerplexityError::TextTooShort {
                need: 10,
                got: 8,
                n_ctx: 5,
                ..
            })
        ));
    }

    /// Every token after the text's first is scored once: later windows begin with an added
    /// BOS.
    #[test]
    fn every_token_windows_cover_the_text_once() {
        const B: u32 = 99;
        let ids: Vec<u32> = std::iter::once(B).chain(1..=9).collect();
        let w = every_token_windows(&ids, 4, Some(B)).unwrap();
        assert_eq!(
            tokens(&w),
            [vec![B, 1, 2, 3], vec![B, 4, 5, 6], vec![B, 7, 8, 9]]
        );
        assert!(w.iter().all(|w| w.first_scored == 0));
        // Without BOS a window's first token has nothing to be scored from.
        let w = every_token_windows(&ids[1..], 4, None).unwrap();
        assert_eq!(tokens(&w), [vec![1, 2, 3, 4], vec![5, 6, 7, 8], vec![9]]);
        assert!(matches!(
            every_token_windows(&[B], 4, Some(B)),
            Err(PerplexityError::TextTooShort {
                need: 2,
                got: 1,
                ..
            })
        ));
    }

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
