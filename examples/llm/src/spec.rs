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
    /// Tokens proposed.
    pub drafted: usize,
    /// Proposed tokens the model agreed with.
    pub accepted: usize,
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
        };
        assert_eq!(s.acceptance(), 0.75);
        assert_eq!(SpecStats::default().acceptance(), 0.0);
    }
}
