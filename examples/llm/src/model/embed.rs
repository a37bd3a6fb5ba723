//! Embeddings: each input's final hidden states (after the final norm, before the output
//! projection, which is skipped) pooled into one vector and L2-normalised, as llama.cpp's
//! `llama-embedding` computes them (`--embd-normalize 2`, its default).
//!
//! Every input is a sequence of its own, run through [`Model::forward_batch`]'s pass (rows of
//! several inputs share a pass, at most a given number of rows per pass; a long input runs in
//! chunks over its own cache). The pass is row-wise batch-invariant and the pooling sums each
//! input's rows in position order, so an input's vector is bit-identical whatever else is
//! embedded with it and however the passes are cut.

use std::str::FromStr;

use super::error::ModelError;
use super::forward::{BatchItem, Logits, Sequence};
use super::kv_cache::CacheType;
use super::load::Model;

/// Rows per forward pass of [`Model::embed`] at most (the activations of a pass grow with its
/// rows; an input longer than this runs in chunks).
pub const EMBED_PASS_ROWS: usize = 512;

/// How an input's hidden states become one vector.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pooling {
    /// The mean over every position (llama.cpp's `mean`, 1).
    Mean,
    /// The last position's (llama.cpp's `last`, 3): with causal attention, the one that has
    /// seen the whole input.
    Last,
    /// The first position's (llama.cpp's `cls`, 2). With causal attention it sees only the
    /// first token, so only that token is run.
    Cls,
}

impl Pooling {
    /// Its name, as `--pooling` takes it (`mean`, `last`, `cls`).
    pub fn name(self) -> &'static str {
        match self {
            Pooling::Mean => "mean",
            Pooling::Last => "last",
            Pooling::Cls => "cls",
        }
    }

    /// The pooling of `{arch}.pooling_type` `value`, in llama.cpp's numbering (0 none, 1 mean,
    /// 2 cls, 3 last, 4 rank). `none` (one vector per token) and `rank` (a reranker's
    /// classification head) are refused ([`ModelError::UnsupportedPooling`]), and so is a
    /// number llama.cpp does not define.
    pub fn from_gguf_type(value: u64) -> Result<Pooling, ModelError> {
        match value {
            1 => Ok(Pooling::Mean),
            2 => Ok(Pooling::Cls),
            3 => Ok(Pooling::Last),
            0 => Err(ModelError::UnsupportedPooling {
                pooling: "none (0)".into(),
            }),
            4 => Err(ModelError::UnsupportedPooling {
                pooling: "rank (4)".into(),
            }),
            n => Err(ModelError::UnsupportedPooling {
                pooling: format!("unknown type {n}"),
            }),
        }
    }
}

impl std::fmt::Display for Pooling {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Pooling {
    type Err = ModelError;

    /// `mean`, `last` or `cls`; `none` and `rank` (llama.cpp's other names) and anything else
    /// are [`ModelError::UnsupportedPooling`].
    fn from_str(s: &str) -> Result<Pooling, ModelError> {
        match s {
            "mean" => Ok(Pooling::Mean),
            "last" => Ok(Pooling::Last),
            "cls" => Ok(Pooling::Cls),
            other => Err(ModelError::UnsupportedPooling {
                pooling: format!("{other:?}"),
            }),
        }
    }
}

/// One input's state in an [`Embedder`].
#[derive(Debug)]
struct Input {
    tokens: Vec<u32>,
    /// The tokens to run: all of them, or the first only ([`Pooling::Cls`]).
    run: usize,
    /// Run so far.
    done: usize,
    seq: Option<Sequence>,
    /// The pooled state: the sum of the rows so far (mean) or the row kept (last, cls).
    acc: Vec<f64>,
}

/// A list of inputs being embedded, a pass at a time ([`Embedder::pass`]); what
/// [`Model::embed`] runs to the end in one call. A server interleaves the passes with its
/// other work (`rknn_llm::serve::Batcher::embed`).
#[derive(Debug)]
pub struct Embedder {
    pooling: Pooling,
    inputs: Vec<Input>,
    /// The first input not yet all run.
    next: usize,
    n_embd: usize,
}

impl Model {
    /// The pooling the file names (`{arch}.pooling_type`). A file without the key is
    /// [`ModelError::NoPooling`]: llama.cpp then makes one vector per token (pooling `none`),
    /// which is no embedding of the input, so the caller must choose one.
    pub fn pooling(&self) -> Result<Pooling, ModelError> {
        match self.config.pooling_type {
            Some(t) => Pooling::from_gguf_type(t),
            None => Err(ModelError::NoPooling {
                key: format!("{}.pooling_type", self.config.family.name),
            }),
        }
    }

    /// Each input's embedding: its final hidden states pooled by `pooling` and L2-normalised
    /// (`n_embd` values, as llama.cpp's `llama-embedding` with `--embd-normalize 2`; a zero
    /// vector stays zero).
    ///
    /// Each input runs as a sequence of its own through [`Model::forward_batch`], at most
    /// [`EMBED_PASS_ROWS`] rows per pass, without the output projection. An input's vector is
    /// bit-identical whether it is embedded alone or with others.
    ///
    /// Every input is checked before anything runs: an empty one, one longer than the
    /// model's context ([`Model::n_ctx`]) or one with a token outside the vocabulary is
    /// [`ModelError::EmbeddingInput`], naming its index.
    pub fn embed(&self, inputs: &[&[u32]], pooling: Pooling) -> Result<Vec<Vec<f32>>, ModelError> {
        let owned = inputs.iter().map(|t| t.to_vec()).collect();
        let mut e = self.embedder(owned, pooling)?;
        while !e.pass(self, EMBED_PASS_ROWS)? {}
        Ok(e.finish())
    }

    /// An [`Embedder`] of `inputs` (checked as [`Model::embed`] checks them), none run yet.
    pub fn embedder(
        &self,
        inputs: Vec<Vec<u32>>,
        pooling: Pooling,
    ) -> Result<Embedder, ModelError> {
        let n_vocab = self.config.n_vocab;
        for (index, t) in inputs.iter().enumerate() {
            let reason = if t.is_empty() {
                Some("it has no token".to_string())
            } else if t.len() > self.n_ctx {
                Some(format!(
                    "{} tokens exceed the context length {}",
                    t.len(),
                    self.n_ctx
                ))
            } else {
                t.iter()
                    .find(|&&x| x as usize >= n_vocab)
                    .map(|x| format!("token id {x} is outside the vocabulary of {n_vocab}"))
            };
            if let Some(reason) = reason {
                return Err(ModelError::EmbeddingInput { index, reason });
            }
        }
        let n_embd = self.config.n_embd;
        let inputs = inputs
            .into_iter()
            .map(|tokens| Input {
                run: if pooling == Pooling::Cls {
                    1
                } else {
                    tokens.len()
                },
                tokens,
                done: 0,
                seq: None,
                acc: vec![0.0; n_embd],
            })
            .collect();
        Ok(Embedder {
            pooling,
            inputs,
            next: 0,
            n_embd,
        })
    }
}

impl Embedder {
    /// The pooling.
    pub fn pooling(&self) -> Pooling {
        self.pooling
    }

    /// Tokens of all the inputs (what a server reports as `prompt_tokens`).
    pub fn tokens(&self) -> usize {
        self.inputs.iter().map(|i| i.tokens.len()).sum()
    }

    /// Tokens run so far (over every input).
    pub fn tokens_run(&self) -> usize {
        self.inputs.iter().map(|i| i.done).sum()
    }

    /// Whether every input has run.
    pub fn is_done(&self) -> bool {
        self.next == self.inputs.len()
    }

    /// Runs one forward pass of at most `max_rows` rows (at least 1): the next inputs in
    /// order, a chunk of one that does not fit. Whether every input has run now. A failed
    /// pass leaves the embedder unusable: drop it.
    pub fn pass(&mut self, model: &Model, max_rows: usize) -> Result<bool, ModelError> {
        let mut budget = max_rows.max(1);
        let mut picked = Vec::new();
        for (i, input) in self.inputs.iter_mut().enumerate().skip(self.next) {
            if budget == 0 {
                break;
            }
            let take = (input.run - input.done).min(budget);
            budget -= take;
            if input.seq.is_none() {
                let mut seq = model.sequence(CacheType::F32);
                // Held to the input's length, unless that would change a LongRoPE model's
                // factors: they follow the model's context, as llama.cpp's follow its
                // context size, whatever the input's length.
                let switches = model
                    .config
                    .long_rope
                    .as_ref()
                    .is_some_and(|lr| lr.uses_long(input.run) != lr.uses_long(model.n_ctx));
                if !switches {
                    seq.limit_context(input.run);
                }
                input.seq = Some(seq);
            }
            picked.push((i, take));
        }
        let pooling = self.pooling;
        let mut items = Vec::with_capacity(picked.len());
        // Which rows of each item's chunk come back, per picked input.
        let mut wanted = Vec::with_capacity(picked.len());
        for (input, &(_, take)) in self.inputs.iter_mut().skip(self.next).zip(&picked) {
            let (from, to) = (input.done, input.done + take);
            let logits = match pooling {
                Pooling::Mean => Logits::All,
                Pooling::Last | Pooling::Cls if to == input.run => Logits::Last,
                Pooling::Last | Pooling::Cls => Logits::None,
            };
            wanted.push(match logits {
                Logits::All => take,
                Logits::Last => 1,
                Logits::None => 0,
            });
            items.push(BatchItem {
                seq: input.seq.as_mut().expect("made above"),
                tokens: &input.tokens[from..to],
                pos: from,
                logits,
            });
        }
        let mut hidden = Vec::new();
        model.forward_rows(&mut items, Some(&mut hidden))?;
        drop(items);
        let e = self.n_embd;
        let mut rows = hidden.chunks_exact(e);
        for (&(i, take), n) in picked.iter().zip(wanted) {
            let input = &mut self.inputs[i];
            for row in rows.by_ref().take(n) {
                match pooling {
                    Pooling::Mean => {
                        for (a, &x) in input.acc.iter_mut().zip(row) {
                            *a += f64::from(x);
                        }
                    }
                    Pooling::Last | Pooling::Cls => {
                        for (a, &x) in input.acc.iter_mut().zip(row) {
                            *a = f64::from(x);
                        }
                    }
                }
            }
            input.done += take;
            if input.done == input.run {
                input.seq = None; // its cache is not needed any more
            }
        }
        while self.next < self.inputs.len()
            && self.inputs[self.next].done == self.inputs[self.next].run
        {
            self.next += 1;
        }
        Ok(self.is_done())
    }

    /// Each input's vector, pooled and L2-normalised, in input order. Call once
    /// [`Embedder::pass`] has said every input has run (an input not run yet gives zeros).
    pub fn finish(self) -> Vec<Vec<f32>> {
        self.inputs
            .into_iter()
            .map(|input| {
                let div = match self.pooling {
                    Pooling::Mean => input.run.max(1) as f64,
                    Pooling::Last | Pooling::Cls => 1.0,
                };
                let pooled: Vec<f32> = input.acc.iter().map(|&a| (a / div) as f32).collect();
                normalize(&pooled)
            })
            .collect()
    }
}

/// `v / ‖v‖₂`, as llama.cpp's `common_embd_normalize(…, 2)` computes it (the squares summed
/// in f64, the factor rounded to f32); a zero vector stays zero.
fn normalize(v: &[f32]) -> Vec<f32> {
    let sum: f64 = v.iter().map(|&x| f64::from(x * x)).sum();
    let norm = sum.sqrt();
    let f = if norm > 0.0 { (1.0 / norm) as f32 } else { 0.0 };
    v.iter().map(|&x| x * f).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pooling_names_and_numbers_are_llama_cpps() {
        for (s, p) in [
            ("mean", Pooling::Mean),
            ("last", Pooling::Last),
            ("cls", Pooling::Cls),
        ] {
            assert_eq!(s.parse::<Pooling>().unwrap(), p);
            assert_eq!(p.name(), s);
        }
        assert_eq!(Pooling::from_gguf_type(1).unwrap(), Pooling::Mean);
        assert_eq!(Pooling::from_gguf_type(2).unwrap(), Pooling::Cls);
        assert_eq!(Pooling::from_gguf_type(3).unwrap(), Pooling::Last);
        for (t, name) in [(0, "none"), (4, "rank"), (7, "unknown")] {
            let e = Pooling::from_gguf_type(t).unwrap_err().to_string();
            assert!(e.contains(name), "{e}");
        }
        let e = "none".parse::<Pooling>().unwrap_err().to_string();
        assert!(e.contains("\"none\""), "{e}");
    }

    #[test]
    fn normalize_gives_unit_length_and_keeps_zero() {
        let v = normalize(&[3.0, 4.0]);
        assert_eq!(v, [0.6, 0.8]);
        assert_eq!(normalize(&[0.0, 0.0]), [0.0, 0.0]);
    }
}
