//! Generation: a prompt evaluated in chunks, then tokens decided one forward pass at a time or,
//! with prompt lookup ([`crate::spec`]), several per pass when the model confirms a draft.
//!
//! [`Generator`] is what `llm-decode` runs and what the speculative-decoding benchmark
//! alternates in one process (`benches/spec.rs`), so both measure the same loop.

use std::io::Write;
use std::time::{Duration, Instant};

use crate::model::{Logits, Model, ModelError};
use crate::sample::{Sampler, Verdict};
use crate::spec::{DraftPolicy, PromptLookup, SpecStats};
use crate::tokenizer::{StreamDecoder, Tokenizer, TokenizerError};

/// Why generation stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    /// An end-of-generation token.
    Eog,
    /// The requested number of tokens.
    NPredict,
    /// The context is full.
    Context,
}

impl Stop {
    /// The name in `llm-decode`'s summary and JSON.
    pub fn name(self) -> &'static str {
        match self {
            Stop::Eog => "eog",
            Stop::NPredict => "n_predict",
            Stop::Context => "context",
        }
    }
}

/// What one [`Generator::generate`] call produced and how long it took.
#[derive(Clone, Debug)]
pub struct Generation {
    /// The generated ids (the last one may not be fed to the model yet: [`Generation::unfed`]).
    pub generated: Vec<u32>,
    /// Their text.
    pub text: String,
    /// Evaluating the prompt, up to the first token's logits.
    pub prefill_time: Duration,
    /// Everything after.
    pub decode_time: Duration,
    /// Forward passes after the prompt.
    pub decode_forwards: usize,
    /// Token decisions made from decode passes' logits (one per pass without speculation).
    pub decisions: usize,
    /// What speculation did.
    pub spec: SpecStats,
    /// The emulator's modelled RK3588 NPU time (busiest core) of prefill and decode, when the
    /// matmuls ran on the emulator.
    pub modelled: Option<(Duration, Duration)>,
    /// Why it stopped.
    pub stop: Stop,
    /// The position after the last token fed to the model.
    pub end_pos: usize,
    /// The last generated token when it is not in the KV cache yet: a token decided by a pass
    /// is fed with the next one, so generation that stops after deciding it leaves it out,
    /// while a drafted token that a pass accepted is in already. A conversation feeds it
    /// before its next turn.
    pub unfed: Option<u32>,
}

impl Generation {
    /// Decode speed: token decisions per second of decode time.
    pub fn decode_tok_s(&self) -> f64 {
        rate(self.decisions, self.decode_time)
    }

    /// Token decisions per decode forward pass: 1 without speculation, more as drafts are
    /// accepted.
    pub fn tokens_per_pass(&self) -> f64 {
        if self.decode_forwards == 0 {
            0.0
        } else {
            self.decisions as f64 / self.decode_forwards as f64
        }
    }
}

/// `n` per second of `t` (0 for no time).
pub fn rate(n: usize, t: Duration) -> f64 {
    let s = t.as_secs_f64();
    if s > 0.0 { n as f64 / s } else { 0.0 }
}

/// Why generation failed.
#[derive(Debug, thiserror::Error)]
pub enum GenerateError {
    /// The forward pass refused its input.
    #[error(transparent)]
    Model(#[from] ModelError),
    /// A generated id has no text.
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
    /// Writing the text or the logits failed.
    #[error("writing the generation's output: {0}")]
    Io(#[from] std::io::Error),
}

/// One generation session: the model, how to pick tokens, and where the text and logits go.
/// `history` carries the context over calls (a chat's turns).
pub struct Generator<'a> {
    /// The model; its KV cache holds the positions before the `pos` given to `generate`.
    pub model: &'a mut Model,
    /// The emulator running the matmuls, whose cost model times them as an RK3588 would.
    pub emulator: Option<&'a rknn_matmul::rknn_emu::Emulator>,
    /// Prompt lookup, when speculating.
    pub lookup: Option<PromptLookup>,
    /// Every token fed so far (the context drafts are looked up in).
    pub history: Vec<u32>,
    /// The vocabulary (end-of-generation ids, the text of each id).
    pub tok: &'a Tokenizer,
    /// Picks (and verifies) tokens.
    pub sampler: &'a mut Sampler,
    /// Prompt rows per forward pass.
    pub batch: usize,
    /// Tokens to generate at most (`None`: until end of generation or a full context).
    pub n_predict: Option<usize>,
    /// Every logits row computed, as little-endian f32 (`--dump-logits`).
    pub logits_out: Option<&'a mut dyn Write>,
    /// The text as it is produced, flushed piece by piece.
    pub text_out: Option<&'a mut dyn Write>,
}

impl std::fmt::Debug for Generator<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Generator")
            .field("lookup", &self.lookup)
            .field("history", &self.history.len())
            .field("batch", &self.batch)
            .field("n_predict", &self.n_predict)
            .finish_non_exhaustive()
    }
}

impl Generator<'_> {
    /// Evaluates `prompt` at `pos` (the cache holds `0..pos`), then samples until an
    /// end-of-generation token, `n_predict` tokens or a full context.
    pub fn generate(&mut self, prompt: &[u32], pos: usize) -> Result<Generation, GenerateError> {
        let n_ctx = self.model.config().n_ctx;
        let n_vocab = self.model.config().n_vocab;
        let batch = self.batch.max(1);
        let m0 = self.emulator.map(|e| e.modelled());
        let t = Instant::now();
        let mut last = Vec::new();
        for (c, chunk) in prompt.chunks(batch).enumerate() {
            let is_last = (c + 1) * batch >= prompt.len();
            let which = match (&self.logits_out, is_last) {
                (Some(_), _) => Logits::All,
                (None, true) => Logits::Last,
                (None, false) => Logits::None,
            };
            let logits = self.model.forward(chunk, pos + c * batch, which)?;
            if let Some(d) = self.logits_out.as_mut() {
                write_rows(d, logits)?;
            }
            if is_last {
                last = logits[logits.len() - n_vocab..].to_vec();
            }
        }
        prompt.iter().for_each(|&t| self.sampler.accept(t));
        let prefill_time = t.elapsed();
        let m1 = self.emulator.map(|e| e.modelled());

        let mut pos = pos + prompt.len();
        self.history.extend_from_slice(prompt);
        let mut out = Out {
            sampler: self.sampler,
            history: &mut self.history,
            generated: Vec::new(),
            decoder: StreamDecoder::new(self.tok),
            text: String::new(),
            text_out: match &mut self.text_out {
                Some(w) => Some(&mut **w),
                None => None,
            },
        };
        let (mut decode_forwards, mut decisions) = (0usize, 0usize);
        let mut spec = SpecStats::default();
        let mut policy = DraftPolicy::new(self.lookup.map_or(0, |l| l.draft_max));
        let limit = self.n_predict.unwrap_or(usize::MAX);
        let t = Instant::now();
        // The token decided for position `pos`, emitted, then fed with any drafted tokens.
        let mut token = out.sampler.sample(&last);
        let (stop, unfed) = 'generate: loop {
            if out.generated.len() >= limit {
                break (Stop::NPredict, None);
            }
            if self.tok.is_eog(token) {
                break (Stop::Eog, None);
            }
            out.keep(token)?;
            if out.generated.len() >= limit {
                break (Stop::NPredict, Some(token));
            }
            if pos >= n_ctx {
                break (Stop::Context, Some(token));
            }
            // Room for drafts: the tokens still to generate, and the context after `token`.
            let room = (limit - out.generated.len())
                .min(n_ctx - pos - 1)
                .min(policy.next_len());
            let drafts: Vec<u32> = match &self.lookup {
                Some(l) => l.draft(out.history, room).to_vec(),
                None => Vec::new(),
            };
            let mut batch = Vec::with_capacity(1 + drafts.len());
            batch.push(token);
            batch.extend_from_slice(&drafts);
            let which = if drafts.is_empty() {
                Logits::Last
            } else {
                Logits::All
            };
            let rows = self.model.forward(&batch, pos, which)?;
            pos += 1;
            decode_forwards += 1;
            let accepted_before = spec.accepted;
            if !drafts.is_empty() {
                spec.passes += 1;
                spec.drafted += drafts.len();
            }
            // Each drafted token stands if the model, at its position, would have chosen it.
            let mut next = None;
            for (i, row) in rows.chunks_exact(n_vocab).enumerate() {
                if let Some(d) = self.logits_out.as_mut() {
                    write_rows(d, row)?;
                }
                decisions += 1;
                let Some(&drafted) = drafts.get(i) else {
                    next = Some(out.sampler.sample(row));
                    break;
                };
                match out.sampler.verify(row, drafted) {
                    Verdict::Reject(t) => {
                        next = Some(t);
                        break;
                    }
                    Verdict::Accept => {
                        spec.accepted += 1;
                        if self.tok.is_eog(drafted) {
                            break 'generate (Stop::Eog, None);
                        }
                        out.keep(drafted)?;
                        pos += 1;
                        if out.generated.len() >= limit {
                            break 'generate (Stop::NPredict, None);
                        }
                    }
                }
            }
            policy.record(drafts.len(), spec.accepted - accepted_before);
            token = next.expect("the last row of a verify pass decides a token");
        };
        let decode_time = t.elapsed();
        let modelled = match (self.emulator, m0, m1) {
            (Some(e), Some(m0), Some(m1)) => Some((
                m1.since(&m0).busiest_core(),
                e.modelled().since(&m1).busiest_core(),
            )),
            _ => None,
        };
        let rest = out.decoder.finish();
        out.emit(&rest)?;
        Ok(Generation {
            generated: out.generated,
            text: out.text,
            prefill_time,
            decode_time,
            decode_forwards,
            decisions,
            spec,
            modelled,
            stop,
            end_pos: pos,
            unfed,
        })
    }
}

/// Where a generated token goes (borrowed apart from the model, so a verify pass's logits,
/// borrowed from the model, stay readable meanwhile).
struct Out<'r, 'd, 'w> {
    sampler: &'r mut Sampler,
    history: &'r mut Vec<u32>,
    generated: Vec<u32>,
    decoder: StreamDecoder<'d>,
    text: String,
    text_out: Option<&'r mut (dyn Write + 'w)>,
}

impl Out<'_, '_, '_> {
    /// Emits a generated token: kept, recorded for the repetition penalty and the lookup, and
    /// written out as text.
    fn keep(&mut self, token: u32) -> Result<(), GenerateError> {
        self.generated.push(token);
        self.sampler.accept(token);
        self.history.push(token);
        let piece = self.decoder.push(token)?;
        self.emit(&piece)
    }

    fn emit(&mut self, piece: &str) -> Result<(), GenerateError> {
        self.text.push_str(piece);
        if let Some(w) = self.text_out.as_mut().filter(|_| !piece.is_empty()) {
            w.write_all(piece.as_bytes())?;
            w.flush()?;
        }
        Ok(())
    }
}

fn write_rows(out: &mut dyn Write, rows: &[f32]) -> std::io::Result<()> {
    for v in rows {
        out.write_all(&v.to_le_bytes())?;
    }
    Ok(())
}
