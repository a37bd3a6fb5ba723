//! Lossless speculative decoding by prompt lookup: no draft model. The context often already
//! contains what comes next (re-emitting a file with a small edit, quoting the prompt), so the
//! tokens that followed the latest earlier occurrence of the last few tokens are proposed, and
//! the model checks all of them in one forward pass of `1 + k` rows, which costs an NPU (bound
//! by reading the weights) little more than one row.
//!
//! Lossless: with greedy decoding a drafted token is kept only if it is the model's own argmax
//! at its position, and the forward pass gives bit-identical logits for a position whatever the
//! batch it is computed in (every reduction has a fixed order, and W8A8 quantises each row on
//! its own), so the output is token-identical to plain greedy decoding. With sampling, the
//! standard speculative-sampling rule ([`crate::sample::Sampler::verify`]) keeps the output
//! distribution unchanged.
//!
//! A draft model ([`DraftModel`], `llm-decode --model-draft`) proposes instead, or where lookup
//! finds nothing: a smaller model of the same vocabulary runs ahead of the target a few tokens,
//! one cheap pass per token, always taking its own argmax, and the target verifies them all in
//! one pass. Its proposals are deterministic given the context (a point mass, as lookup's are),
//! so the same rule keeps greedy output token-identical to the target alone and sampled output
//! distributed as the target's.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::model::{CacheType, Logits, Model, ModelError, Sequence};
use crate::tokenizer::Tokenizer;

/// n-gram prompt lookup.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PromptLookup {
    /// The longest n-gram matched (tried first).
    pub ngram_max: usize,
    /// The shortest n-gram matched when no longer one is found.
    pub ngram_min: usize,
    /// Tokens proposed at most.
    pub draft_max: usize,
}

impl Default for PromptLookup {
    fn default() -> Self {
        // 3-grams only: falling back to 2-grams drafted more and gained less in the in-process
        // benchmark (`benches/spec.rs`, 2026-12-01): copy_code_chat's acceptance fell from 0.77
        // to 0.60 and prose_chat's rejected drafts grew, while list and quote copies gained a
        // little (docs/llm.md).
        PromptLookup {
            ngram_max: 3,
            ngram_min: 3,
            draft_max: 8,
        }
    }
}

impl PromptLookup {
    /// The tokens that followed the latest earlier occurrence of the last `n` tokens of
    /// `context` (`n` from `ngram_max` down to `ngram_min`), at most `min(draft_max, max)`;
    /// empty when nothing matches.
    pub fn draft<'c>(&self, context: &'c [u32], max: usize) -> &'c [u32] {
        let max = self.draft_max.min(max);
        if max == 0 {
            return &[];
        }
        let len = context.len();
        for n in (self.ngram_min.max(1)..=self.ngram_max).rev() {
            if len <= n {
                continue;
            }
            let tail = &context[len - n..];
            // The latest earlier occurrence: start positions before the tail itself.
            if let Some(i) = (0..len - n).rev().find(|&i| &context[i..i + n] == tail) {
                let from = i + n;
                return &context[from..(from + max).min(len)];
            }
        }
        &[]
    }
}

/// How many tokens to draft next, from how the previous drafts fared.
///
/// A verify pass of `1 + k` rows is almost free where the weights' reading dominates (the NPU,
/// decode), but not free: on the emulator each row is CPU work, and on a board the rows still
/// cost activation traffic. So drafts shrink to what was accepted plus one after a miss and
/// double after a full hit; and when even a single drafted token is rejected, lookup pauses for
/// a number of tokens that doubles with each such miss (2, 4, ... up to [`MAX_PAUSE`]), so text
/// that does not repeat its context (most prose) pays for few wasted rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DraftPolicy {
    max: usize,
    len: usize,
    pause: usize,
    misses: u32,
}

/// The longest pause of [`DraftPolicy`], in tokens.
pub const MAX_PAUSE: usize = 32;

impl DraftPolicy {
    /// Starts at half of `max` tokens per draft (a first draft has no record to go by).
    pub fn new(max: usize) -> Self {
        DraftPolicy {
            max,
            len: max.div_ceil(2),
            pause: 0,
            misses: 0,
        }
    }

    /// Tokens to draft for the next pass (0 while paused); call once per decode pass.
    pub fn next_len(&mut self) -> usize {
        if self.pause > 0 {
            self.pause -= 1;
            return 0;
        }
        self.len
    }

    /// Records a verify pass: `drafted` tokens proposed (0 for a plain pass), `kept` accepted.
    pub fn record(&mut self, drafted: usize, kept: usize) {
        if drafted == 0 {
            return;
        }
        if kept == drafted {
            self.len = (2 * self.len).min(self.max).max(1);
            self.misses = 0;
        } else if kept == 0 && drafted == 1 {
            self.misses += 1;
            self.pause = 1usize << self.misses.min(MAX_PAUSE.trailing_zeros());
        } else {
            self.len = kept + 1;
            if kept > 0 {
                self.misses = 0;
            }
        }
    }
}

/// What speculation did during one generation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SpecStats {
    /// Verify passes that carried at least one drafted token.
    pub passes: usize,
    /// Tokens proposed (by prompt lookup and the draft model).
    pub drafted: usize,
    /// Proposed tokens the model agreed with.
    pub accepted: usize,
    /// Of [`SpecStats::drafted`], the tokens the draft model proposed.
    pub model_drafted: usize,
    /// Of [`SpecStats::accepted`], the draft model's.
    pub model_accepted: usize,
    /// The draft model's forward passes (catching up with the context, then one per token).
    pub draft_forwards: usize,
    /// Time spent in the draft model.
    pub draft_time: Duration,
    /// The draft model's modelled RK3588 NPU time (busiest core), on the in-process emulator
    /// (zero elsewhere); [`GenerationSummary::modelled`](crate::session::GenerationSummary::modelled)'s
    /// decode time includes it, as the draft's passes take the NPU between the model's.
    pub draft_modelled: Duration,
}

impl SpecStats {
    /// Accepted over drafted (0 when nothing was drafted).
    pub fn acceptance(&self) -> f64 {
        if self.drafted == 0 {
            0.0
        } else {
            self.accepted as f64 / self.drafted as f64
        }
    }
}

/// The most tokens [`DraftModel::new`] accepts as `max` (as `--draft-max`, a `u16`).
pub const MAX_DRAFT: usize = 256;

/// A draft model for speculative decoding: a smaller model of the target's vocabulary, loaded
/// like any other ([`crate::ModelBuilder`]), resident beside the target. Shared by `Arc`: each
/// session that drafts with it keeps its own cache of the draft's context
/// ([`crate::session::Session::set_draft`]).
#[derive(Clone, Debug)]
pub struct DraftModel {
    model: Arc<Model>,
    max: usize,
    p_min: f32,
}

/// The same model (the same `Arc`), `max` and `p_min`.
impl PartialEq for DraftModel {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.model, &other.model) && self.max == other.max && self.p_min == other.p_min
    }
}

/// Why a model cannot draft for another.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DraftError {
    /// The two vocabularies differ in size.
    #[error(
        "the draft model's vocabulary has {draft} tokens, the target's {target}: a draft must share the target's vocabulary"
    )]
    VocabularySize {
        /// The target's tokens.
        target: usize,
        /// The draft's tokens.
        draft: usize,
    },
    /// A token differs between the two vocabularies.
    #[error(
        "token {id} is {target:?} in the target's vocabulary but {draft:?} in the draft's: a draft must share the target's vocabulary"
    )]
    Token {
        /// The first id that differs.
        id: u32,
        /// Its text in the target's vocabulary.
        target: String,
        /// Its text in the draft's.
        draft: String,
    },
    /// A special token (BOS, EOS) differs.
    #[error("the draft's {which} token is {draft:?}, the target's {target:?}")]
    Special {
        /// `"BOS"` or `"EOS"`.
        which: &'static str,
        /// The target's.
        target: Option<u32>,
        /// The draft's.
        draft: Option<u32>,
    },
    /// The draft model's logits do not match its own tokenizer.
    #[error("the draft model has {model} logits per row but its vocabulary {tokenizer} tokens")]
    Logits {
        /// The model's logits per row.
        model: usize,
        /// Its tokenizer's tokens.
        tokenizer: usize,
    },
    /// `max` or `p_min` out of range.
    #[error("{0}")]
    Setting(String),
}

impl DraftModel {
    /// `model` (with its `tokenizer`) drafting at most `max` tokens a pass (1 to [`MAX_DRAFT`])
    /// for a target whose vocabulary is `target`, stopping early where its own probability of
    /// its argmax falls below `p_min` (0 to 1; llama.cpp's `--draft-p-min`, default 0). The
    /// vocabularies must be the same token for token (size, every token's text, BOS and EOS),
    /// as each proposed id is verified as the target's token of that id.
    pub fn new(
        model: Arc<Model>,
        tokenizer: &Tokenizer,
        target: &Tokenizer,
        max: usize,
        p_min: f32,
    ) -> Result<DraftModel, DraftError> {
        if !(1..=MAX_DRAFT).contains(&max) {
            return Err(DraftError::Setting(format!(
                "a draft of {max} tokens: between 1 and {MAX_DRAFT}"
            )));
        }
        if !(0.0..=1.0).contains(&p_min) {
            return Err(DraftError::Setting(format!(
                "a minimum draft probability of {p_min}: between 0 and 1"
            )));
        }
        let n_logits = model.config().n_vocab;
        if n_logits != tokenizer.n_vocab() {
            return Err(DraftError::Logits {
                model: n_logits,
                tokenizer: tokenizer.n_vocab(),
            });
        }
        check_vocabulary(tokenizer, target)?;
        Ok(DraftModel { model, max, p_min })
    }

    /// The draft model.
    pub fn model(&self) -> &Arc<Model> {
        &self.model
    }

    /// Tokens drafted at most per pass.
    pub fn max(&self) -> usize {
        self.max
    }

    /// The probability below which drafting stops.
    pub fn p_min(&self) -> f32 {
        self.p_min
    }
}

/// Whether a model of vocabulary `tokenizer` can draft for one of vocabulary `target`: the same
/// size, every token's text, BOS and EOS ([`DraftModel::new`] checks it; a program can check
/// the vocabularies before it loads the draft's weights).
pub fn check_vocabulary(tokenizer: &Tokenizer, target: &Tokenizer) -> Result<(), DraftError> {
    if tokenizer.n_vocab() != target.n_vocab() {
        return Err(DraftError::VocabularySize {
            target: target.n_vocab(),
            draft: tokenizer.n_vocab(),
        });
    }
    for (which, t, d) in [
        ("BOS", target.bos(), tokenizer.bos()),
        ("EOS", target.eos(), tokenizer.eos()),
    ] {
        if t != d {
            return Err(DraftError::Special {
                which,
                target: t,
                draft: d,
            });
        }
    }
    let n = u32::try_from(target.n_vocab()).unwrap_or(u32::MAX);
    if let Some(id) = (0..n).find(|&id| target.token_text(id) != tokenizer.token_text(id)) {
        let text = |t: &Tokenizer| t.token_text(id).unwrap_or_default().to_string();
        return Err(DraftError::Token {
            id,
            target: text(target),
            draft: text(tokenizer),
        });
    }
    Ok(())
}

/// One session's use of a [`DraftModel`]: the draft's cache and the tokens it holds.
#[derive(Debug)]
pub(crate) struct Drafter {
    draft: DraftModel,
    seq: Sequence,
    /// The tokens in `seq`'s cache, in order.
    held: Vec<u32>,
}

/// What one [`Drafter::propose`] did.
pub(crate) struct Proposal {
    pub(crate) tokens: Vec<u32>,
    pub(crate) forwards: usize,
    pub(crate) time: Duration,
    /// The draft's modelled NPU time (busiest core) on the in-process emulator.
    pub(crate) modelled: Duration,
}

impl Drafter {
    pub(crate) fn new(draft: DraftModel, ty: CacheType) -> Drafter {
        Drafter {
            seq: draft.model.sequence(ty),
            draft,
            held: Vec::new(),
        }
    }

    /// The draft model.
    pub(crate) fn draft(&self) -> &DraftModel {
        &self.draft
    }

    /// Limits the draft's context to `n_ctx` positions (as its session's).
    pub(crate) fn limit_context(&mut self, n_ctx: usize) {
        self.seq.limit_context(n_ctx);
        self.held.truncate(self.seq.len());
    }

    /// Forgets the draft's context (its cache is rebuilt from the next context given).
    pub(crate) fn reset(&mut self) {
        self.seq.reset();
        self.held.clear();
    }

    /// Up to `max` (and the draft's own `max`) tokens the draft model would write after
    /// `context`, each its argmax given the ones before; fewer where its probability falls below
    /// `p_min`, after an end-of-generation token (`is_eog`), or at the end of the draft's
    /// context. The draft's cache keeps what it already evaluated of `context` (the longest
    /// common prefix) and evaluates only the rest, `batch` tokens a pass.
    pub(crate) fn propose(
        &mut self,
        context: &[u32],
        max: usize,
        batch: usize,
        is_eog: impl Fn(u32) -> bool,
    ) -> Result<Proposal, ModelError> {
        let t0 = Instant::now();
        let m0 = self.draft.model.modelled_time();
        let mut out = Proposal {
            tokens: Vec::new(),
            forwards: 0,
            time: Duration::ZERO,
            modelled: Duration::ZERO,
        };
        // The last token drafted is not fed: the draft's context holds `context.len() + max - 1`.
        let room = (self.seq.n_ctx() + 1).saturating_sub(context.len());
        let max = max.min(self.draft.max).min(room);
        let model = self.draft.model.clone();
        if max == 0 || context.is_empty() {
            return Ok(out);
        }
        // At least the last token of the context is fed: its logits draft the first token.
        let common = common_prefix(&self.held, context)
            .min(context.len() - 1)
            .min(self.seq.len());
        self.seq.truncate(common);
        let kept = self.seq.len();
        self.held.truncate(kept);
        // The context's rest, in passes of at most the model's batch.
        let mut pos = kept;
        for chunk in context[kept..].chunks(batch.max(1)) {
            let last = pos + chunk.len() == context.len();
            let which = if last { Logits::Last } else { Logits::None };
            model.forward(&mut self.seq, chunk, pos, which)?;
            out.forwards += 1;
            pos += chunk.len();
        }
        self.held.extend_from_slice(&context[kept..]);
        loop {
            let (t, p) = argmax_prob(self.seq.logits());
            if p < self.draft.p_min {
                break;
            }
            out.tokens.push(t);
            if out.tokens.len() == max || is_eog(t) {
                break;
            }
            model.forward(&mut self.seq, &[t], pos, Logits::Last)?;
            out.forwards += 1;
            self.held.push(t);
            pos += 1;
        }
        out.time = t0.elapsed();
        if let (Some(m1), Some(m0)) = (self.draft.model.modelled_time(), &m0) {
            out.modelled = m1.since(m0).busiest_core();
        }
        Ok(out)
    }
}

/// The length of the longest common prefix of `a` and `b`.
pub(crate) fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// The argmax of a row of logits (the lowest id among equals) and its softmax probability.
fn argmax_prob(row: &[f32]) -> (u32, f32) {
    let mut best = 0;
    for (i, &x) in row.iter().enumerate() {
        if x > row[best] {
            best = i;
        }
    }
    let m = row[best];
    let sum: f64 = row.iter().map(|&x| f64::from(x - m).exp()).sum();
    (best as u32, (1.0 / sum) as f32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proposes_what_followed_the_latest_earlier_occurrence() {
        let l = PromptLookup::default();
        // ... 7 8 9 [1 2 3] 4 5 ... 1 2 3 6 ... [1 2 3] -> the latest earlier match is "6 ...".
        let ctx = [7, 8, 9, 1, 2, 3, 4, 5, 1, 2, 3, 6, 0, 1, 2, 3];
        assert_eq!(l.draft(&ctx, 100), &[6, 0, 1, 2, 3]);
        assert_eq!(l.draft(&ctx, 2), &[6, 0]);
        // No 3-gram match, but a 2-gram one: found only when 2-grams are allowed.
        assert!(l.draft(&[5, 6, 7, 9, 6, 7], 100).is_empty());
        let bigrams = PromptLookup { ngram_min: 2, ..l };
        assert_eq!(bigrams.draft(&[5, 6, 7, 9, 6, 7], 100), &[9, 6, 7]);
        // Nothing matches, or nothing may be proposed.
        assert!(l.draft(&[1, 2, 3, 4], 100).is_empty());
        assert!(l.draft(&ctx, 0).is_empty());
        assert!(l.draft(&[], 10).is_empty());
        assert!(l.draft(&[3], 10).is_empty());
        let short = PromptLookup { draft_max: 1, ..l };
        assert_eq!(short.draft(&ctx, 100), &[6]);
    }

    #[test]
    fn drafts_shrink_after_a_miss_grow_after_a_hit_and_pause_after_single_misses() {
        let mut p = DraftPolicy::new(8);
        assert_eq!(p.next_len(), 4, "half of max to start");
        p.record(4, 4);
        assert_eq!(p.next_len(), 8);
        p.record(8, 8);
        assert_eq!(p.next_len(), 8, "capped at max");
        p.record(8, 2);
        assert_eq!(p.next_len(), 3, "accepted + 1");
        p.record(3, 3);
        assert_eq!(p.next_len(), 6, "doubled after a full hit");
        p.record(6, 0);
        assert_eq!(p.next_len(), 1);
        // A plain pass (nothing matched in the context) changes nothing.
        p.record(0, 0);
        assert_eq!(p.next_len(), 1);
        // Single-token misses pause lookup for 2, 4, 8, ... tokens, up to MAX_PAUSE.
        let mut pauses = Vec::new();
        for _ in 0..7 {
            p.record(1, 0);
            let mut paused = 0;
            while p.next_len() == 0 {
                paused += 1;
            }
            pauses.push(paused);
        }
        assert_eq!(pauses, [2, 4, 8, 16, 32, 32, 32]);
        // A hit ends the back-off: the next single miss pauses for 2 again.
        p.record(1, 1);
        assert_eq!(p.next_len(), 2);
        p.record(2, 1);
        assert_eq!(p.next_len(), 2);
        p.record(2, 0);
        assert_eq!(p.next_len(), 1);
        p.record(1, 0);
        assert_eq!((p.next_len(), p.next_len(), p.next_len()), (0, 0, 1));
    }

    #[test]
    fn acceptance_rate() {
        let s = SpecStats {
            passes: 2,
            drafted: 8,
            accepted: 6,
            ..SpecStats::default()
        };
        assert_eq!(s.acceptance(), 0.75);
        assert_eq!(SpecStats::default().acceptance(), 0.0);
    }
}
