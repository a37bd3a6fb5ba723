//! Generation: a [`Session`] over a shared [`Model`], and [`Session::generate`], an iterator of
//! generated pieces that stops on end-of-generation, the token limit or a stop string, and is
//! cancelled by dropping it.
//!
//! A session owns one sequence's state (its KV cache), its sampler and a handle to the
//! tokenizer; the model's weights are shared (`Arc<Model>`), so any number of sessions, on any
//! threads, run over one loaded model. The session remembers its conversation: a second
//! [`Session::generate`] continues after the first, feeding first the last token the previous
//! generation decided but did not feed.
//!
//! A chat ([`Session::chat`], [`Session::respond`]) keeps the conversation's messages, the
//! replies as they were generated among them: each turn renders the whole conversation with the
//! model's chat template ([`ChatTemplate`]) and evaluates only the tokens past the longest
//! prefix the session already holds, so turn 2 reuses the KV cache of turn 1 wherever the new
//! rendering begins with the old one (a template that rewrites earlier turns, such as Qwen3
//! dropping the reasoning of past replies, re-evaluates from where they differ).
//!
//! ```
//! use std::sync::Arc;
//! use rknn_llm::gguf::GgufFile;
//! use rknn_llm::model::{HostF32Factory, Model, host_pool};
//! use rknn_llm::sample::SamplerConfig;
//! use rknn_llm::session::{GenerateParams, Session};
//! use rknn_llm::tokenizer::Tokenizer;
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/llm/tiny-llama.gguf");
//! let file = GgufFile::open(path)?;
//! let pool = host_pool(2)?;
//! let model = Model::load(&file, &mut HostF32Factory::new(pool.clone()), pool, &mut |_, _| {})?;
//! let tokenizer = Tokenizer::from_gguf(&file)?;
//! let greedy = SamplerConfig { temperature: 0.0, ..SamplerConfig::default() };
//! let mut session = Session::new(Arc::new(model), Arc::new(tokenizer), greedy)?;
//! let params = GenerateParams { max_tokens: Some(8), ..GenerateParams::default() };
//! let mut text = String::new();
//! for piece in session.generate("Once upon a time", &params)? {
//!     text.push_str(&piece?.text); // or print it as it comes; `break` cancels
//! }
//! assert!(session.history().len() > 4);
//! # Ok(()) }
//! ```

use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::chat::{ChatError, ChatOptions, ChatTemplate, Message, encode_prompt};
use crate::model::{CacheType, Logits, Model, ModelError, Sequence};
use crate::sample::{Sampler, SamplerConfig, TokenLogprobs, Verdict, token_logprobs};
use crate::spec::{DraftModel, DraftPolicy, Drafter, PromptLookup, SpecStats};
use crate::tokenizer::{StreamDecoder, Tokenizer, TokenizerError};

/// Why generation stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    /// An end-of-generation token.
    Eog,
    /// The requested number of tokens ([`GenerateParams::max_tokens`]).
    MaxTokens,
    /// A stop string ([`GenerateParams::stop`]).
    StopString,
    /// The context is full.
    Context,
}

impl Stop {
    /// The name in `llm-decode`'s summary and JSON (`"eog"`, `"n_predict"`, `"stop"`,
    /// `"context"`).
    pub fn name(self) -> &'static str {
        match self {
            Stop::Eog => "eog",
            Stop::MaxTokens => "n_predict",
            Stop::StopString => "stop",
            Stop::Context => "context",
        }
    }
}

/// How to generate.
#[derive(Clone, Debug, PartialEq)]
pub struct GenerateParams {
    /// Tokens to generate at most (`None`: until end of generation or a full context).
    pub max_tokens: Option<usize>,
    /// Text that ends the generation where it appears; it is not part of the output.
    pub stop: Vec<String>,
    /// Speculative decoding by prompt lookup (lossless), when set.
    pub lookup: Option<PromptLookup>,
    /// Prompt tokens per forward pass (default 128; at least 1).
    pub batch: usize,
    /// The grammar the output must follow ([`crate::constraint`]): every token is sampled
    /// among those it allows, and the generation ends when it is complete.
    #[cfg(feature = "constraint")]
    pub constraint: Option<crate::constraint::Grammar>,
    /// Log-probabilities of each generated token and of the `n` most likely tokens at its
    /// position (at most [`MAX_TOP_LOGPROBS`](crate::sample::MAX_TOP_LOGPROBS)) in
    /// [`Piece::logprobs`], from the raw logits ([`token_logprobs`]); `None` computes none.
    pub logprobs: Option<usize>,
    /// Control tokens whose text the output keeps (others are rendered as nothing): a
    /// tool-call format's markers ([`ToolCallFormat::preserved_tokens`]).
    ///
    /// [`ToolCallFormat::preserved_tokens`]: crate::chat::ToolCallFormat::preserved_tokens
    pub preserve: Vec<u32>,
}

impl Default for GenerateParams {
    fn default() -> Self {
        GenerateParams {
            max_tokens: None,
            stop: Vec::new(),
            lookup: None,
            batch: 128,
            #[cfg(feature = "constraint")]
            constraint: None,
            logprobs: None,
            preserve: Vec::new(),
        }
    }
}

/// Why generation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GenerateError {
    /// The forward pass refused its input.
    #[error(transparent)]
    Model(#[from] ModelError),
    /// A prompt that could not be tokenized, or an id without text.
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
    /// Writing the logits ([`Session::set_logits_tap`]) failed.
    #[error("writing the logits: {0}")]
    Io(#[from] std::io::Error),
    /// The chat template failed.
    #[error(transparent)]
    Chat(#[from] ChatError),
    /// Nothing to evaluate: an empty prompt in a session with no pending token.
    #[error("the prompt is empty after tokenization")]
    EmptyPrompt,
    /// The grammar of [`GenerateParams::constraint`] failed while generating.
    #[cfg(feature = "constraint")]
    #[error(transparent)]
    Grammar(#[from] crate::constraint::GrammarError),
    /// The model and the tokenizer disagree on the vocabulary.
    #[error("the model's {model} logits do not match the vocabulary's {tokenizer} tokens")]
    VocabularyMismatch {
        /// The model's logits per row.
        model: usize,
        /// The tokenizer's tokens.
        tokenizer: usize,
    },
}

/// One generated token and the text it completes (possibly empty: a piece of a character, or
/// text held back because a stop string may begin there). A final piece without a token
/// carries the text still held back when generation ended.
#[derive(Clone, Debug, PartialEq)]
pub struct Piece {
    /// The token, `None` for the final piece.
    pub token: Option<u32>,
    /// The text released with it.
    pub text: String,
    /// The token's log-probabilities, when [`GenerateParams::logprobs`] asks for them.
    pub logprobs: Option<TokenLogprobs>,
}

/// What one generation produced and how long it took.
#[derive(Clone, Debug, Default)]
pub struct GenerationSummary {
    /// The generated ids.
    pub generated: Vec<u32>,
    /// Their text (up to a stop string, which is left out).
    pub text: String,
    /// Evaluating the prompt, up to the first token's logits.
    pub prefill_time: Duration,
    /// Everything after.
    pub decode_time: Duration,
    /// Prompt tokens evaluated (the prompt, and a token the previous generation left unfed).
    pub prompt_tokens: usize,
    /// Forward passes after the prompt.
    pub decode_forwards: usize,
    /// Token decisions made from decode passes' logits (one per pass without speculation).
    pub decisions: usize,
    /// What speculation did.
    pub spec: SpecStats,
    /// The modelled RK3588 NPU time (busiest core) of prefill and of decode so far, when the
    /// matmuls run on the in-process emulator (its cost model, not this machine's time).
    pub modelled: Option<(Duration, Duration)>,
    /// Why it stopped, once it has.
    pub stop: Option<Stop>,
}

impl GenerationSummary {
    /// Decode speed: token decisions per second of decode time.
    pub fn decode_tok_s(&self) -> f64 {
        rate(self.decisions, self.decode_time)
    }

    /// Prompt speed: prompt tokens per second of prefill time.
    pub fn prefill_tok_s(&self) -> f64 {
        rate(self.prompt_tokens, self.prefill_time)
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

/// One conversation over a shared model: its KV cache, its sampler and its tokenizer. `Send`,
/// so a server can keep sessions on any thread.
pub struct Session {
    model: Arc<Model>,
    tokenizer: Arc<Tokenizer>,
    seq: Sequence,
    sampler: Sampler,
    /// Every token of the conversation; the first `seq.len()` are in the KV cache, the rest
    /// (at most one: a token decided but not fed yet) are fed first by the next generation.
    history: Vec<u32>,
    tap: Option<Box<dyn Write + Send>>,
    /// The chat's conversation ([`Session::chat`]): its messages, the replies as generated.
    messages: Vec<Message>,
    /// The draft model speculative decoding proposes with, and its cache of this context.
    draft: Option<Drafter>,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("model", &self.model)
            .field("history", &self.history.len())
            .field("cached", &self.seq.len())
            .field("messages", &self.messages.len())
            .finish_non_exhaustive()
    }
}

impl Session {
    /// A session over `model` with `tokenizer`, sampling as `sampling` says; its cache is f32.
    pub fn new(
        model: Arc<Model>,
        tokenizer: Arc<Tokenizer>,
        sampling: SamplerConfig,
    ) -> Result<Session, GenerateError> {
        let (m, t) = (model.config().n_vocab, tokenizer.n_vocab());
        if m != t {
            return Err(GenerateError::VocabularyMismatch {
                model: m,
                tokenizer: t,
            });
        }
        Ok(Session {
            seq: model.sequence(CacheType::F32),
            model,
            tokenizer,
            sampler: Sampler::new(sampling),
            history: Vec::new(),
            tap: None,
            messages: Vec::new(),
            draft: None,
        })
    }

    /// Drafts with `draft` from now on (`None`: no more): each decode pass, when prompt lookup
    /// ([`GenerateParams::lookup`]) proposes nothing, the draft model proposes up to its
    /// [`DraftModel::max`] tokens and the pass verifies them ([`crate::spec`]). The draft keeps
    /// its own cache of the conversation, of this session's cache type and context.
    pub fn set_draft(&mut self, draft: Option<DraftModel>) {
        self.draft = draft.map(|d| {
            let mut drafter = Drafter::new(d, self.seq.cache().cache_type());
            drafter.limit_context(self.seq.n_ctx());
            drafter
        });
    }

    /// The draft model, if the session drafts with one ([`Session::set_draft`]).
    pub fn draft(&self) -> Option<&DraftModel> {
        self.draft.as_ref().map(Drafter::draft)
    }

    /// The model.
    pub fn model(&self) -> &Arc<Model> {
        &self.model
    }

    /// The tokenizer.
    pub fn tokenizer(&self) -> &Arc<Tokenizer> {
        &self.tokenizer
    }

    /// The sequence's state (its cache and timings).
    pub fn sequence(&self) -> &Sequence {
        &self.seq
    }

    /// Every token of the conversation so far.
    pub fn history(&self) -> &[u32] {
        &self.history
    }

    /// The chat's messages so far ([`Session::chat`], [`Session::respond`]): the system and
    /// user messages given, and each reply as generated (up to where it stopped).
    pub fn messages(&self) -> &[Message] {
        &self.messages
    }

    /// Keeps the longest prefix of the conversation that `prompt` begins with, leaving at
    /// least one token of `prompt` to evaluate (its logits decide the first token), and
    /// returns its length: the history is then `prompt[..len]`, and the cache holds it (but
    /// for a last token decided and not fed yet). A model with sliding-window layers may keep
    /// less than the common prefix ([`Sequence::truncate`]). The repetition penalty's recent
    /// tokens are cut back with the history: the next token is penalised as in a session that
    /// evaluated the kept prefix afresh.
    pub fn keep_prefix(&mut self, prompt: &[u32]) -> usize {
        let common = common_prefix(&self.history, prompt).min(prompt.len().saturating_sub(1));
        if self.history.len() > common {
            self.truncate_history(common);
            self.seq.truncate(common);
        }
        // A cut the local layers could not follow keeps nothing: restart there.
        if self.seq.len() + 1 < self.history.len() {
            self.truncate_history(self.seq.len());
        }
        self.history.len()
    }

    /// [`Session::keep_prefix`], or, when `from` (a session of the same model and cache type:
    /// another slot, another user's conversation) holds a longer prefix of `prompt` in its
    /// cache, a copy of that: the history becomes `prompt[..len]` and the cache the keys and
    /// values `from` computed for it, bit for bit what evaluating it here would write. Returns
    /// the length kept (at most `prompt.len() - 1`, as `keep_prefix`). The chat's messages are
    /// forgotten when it copies.
    pub fn keep_prefix_from(&mut self, from: &Session, prompt: &[u32]) -> usize {
        let limit = prompt.len().saturating_sub(1);
        let theirs = common_prefix(&from.history, prompt)
            .min(from.seq.len())
            .min(limit);
        let ours = common_prefix(&self.history, prompt).min(limit);
        if theirs > ours
            && Arc::ptr_eq(&self.model, &from.model)
            && self.seq.copy_prefix(&from.seq, theirs)
        {
            self.history.clear();
            self.history.extend_from_slice(&prompt[..theirs]);
            self.sampler.set_recent(&self.history);
            self.messages.clear();
            return theirs;
        }
        self.keep_prefix(prompt)
    }

    /// Cuts the history back to its first `len` tokens, and the sampler's recent tokens (the
    /// repetition penalty's window) with it: the next token is penalised only for tokens still
    /// in the context.
    fn truncate_history(&mut self, len: usize) {
        if self.history.len() > len {
            self.history.truncate(len);
            self.sampler.set_recent(&self.history);
        }
    }

    /// The sequence, for a batched forward pass ([`crate::serve`]).
    pub(crate) fn seq_mut(&mut self) -> &mut Sequence {
        &mut self.seq
    }

    /// Samples as `sampling` says from now on (a new random stream from its seed).
    pub fn set_sampling(&mut self, sampling: SamplerConfig) {
        self.sampler = Sampler::new(sampling);
        for &t in &self.history {
            self.sampler.accept(t);
        }
    }

    /// Stores keys and values as `ty` from now on; the conversation is forgotten (positions
    /// written in one type are not converted to the other).
    pub fn set_cache_type(&mut self, ty: CacheType) {
        self.seq = self.model.sequence(ty);
        if let Some(d) = self.draft.take() {
            self.set_draft(Some(d.draft().clone()));
        }
        self.truncate_history(0);
        self.messages.clear();
    }

    /// Limits the session to `n_ctx` positions (at most the model's context size; a server
    /// dividing its context among slots gives each its share). Cached positions past it are
    /// dropped.
    pub fn set_context(&mut self, n_ctx: usize) {
        self.seq.limit_context(n_ctx);
        if let Some(d) = &mut self.draft {
            d.limit_context(self.seq.n_ctx());
        }
        if self.history.len() > self.seq.len() + 1 {
            self.truncate_history(self.seq.len());
        }
    }

    /// Forgets the conversation.
    pub fn reset(&mut self) {
        self.seq.reset();
        if let Some(d) = &mut self.draft {
            d.reset();
        }
        self.history.clear();
        self.messages.clear();
        self.sampler = Sampler::new(self.sampler.config().clone());
    }

    /// Writes every logits row the session computes from now on to `tap`, as little-endian
    /// f32 rows of `n_vocab` (prompts evaluate every row then, not only the last). Returns the
    /// previous tap.
    pub fn set_logits_tap(
        &mut self,
        tap: Option<Box<dyn Write + Send>>,
    ) -> Option<Box<dyn Write + Send>> {
        std::mem::replace(&mut self.tap, tap)
    }

    /// Generates after `prompt` (tokenized with the special tokens it names, and a BOS when
    /// the vocabulary wants one at the start of a conversation).
    pub fn generate(
        &mut self,
        prompt: &str,
        params: &GenerateParams,
    ) -> Result<Generation<'_>, GenerateError> {
        let ids = self
            .tokenizer
            .encode(prompt, self.history.is_empty(), true)?;
        self.generate_tokens(&ids, params)
    }

    /// The next turn of a chat: `user`'s message (after `system`'s, when the conversation has
    /// no message yet) added to the conversation, and the reply generated after it as
    /// [`Session::respond`] does.
    pub fn chat(
        &mut self,
        template: &ChatTemplate,
        system: Option<&str>,
        user: &str,
        options: &ChatOptions,
        params: &GenerateParams,
    ) -> Result<Generation<'_>, GenerateError> {
        let mut messages = self.messages.clone();
        if let (true, Some(system)) = (messages.is_empty(), system) {
            messages.push(Message::system(system));
        }
        messages.push(Message::user(user));
        self.respond(template, messages, options, params)
    }

    /// Generates the assistant's next message after the conversation `messages`, which
    /// replaces the session's: the whole conversation is rendered with `template` (with the
    /// generation prompt) and tokenized ([`encode_prompt`]); the tokens the session already
    /// holds stay in the cache up to the first one that differs, and only the rest is
    /// evaluated. The reply joins the conversation as an assistant message when the generation
    /// ends (or its iterator is dropped). On an error the session's conversation is unchanged
    /// (though a cache that held tokens past the common prefix has dropped them).
    pub fn respond(
        &mut self,
        template: &ChatTemplate,
        messages: Vec<Message>,
        options: &ChatOptions,
        params: &GenerateParams,
    ) -> Result<Generation<'_>, GenerateError> {
        let text = template.render(&messages, true, options)?;
        let ids = encode_prompt(&self.tokenizer, &text)?;
        if ids.is_empty() {
            return Err(GenerateError::EmptyPrompt);
        }
        let common = self.keep_prefix(&ids);
        let started = self.prefill(&ids[common..], params)?;
        self.messages = messages;
        Ok(self.iterate(started, params, true))
    }

    /// Generates after the token ids `prompt`: evaluates them (after any token the previous
    /// generation left unfed) in chunks of `params.batch`, decides the first token, and
    /// returns the iterator that generates the rest.
    pub fn generate_tokens(
        &mut self,
        prompt: &[u32],
        params: &GenerateParams,
    ) -> Result<Generation<'_>, GenerateError> {
        let started = self.prefill(prompt, params)?;
        Ok(self.iterate(started, params, false))
    }

    /// The prompt part of [`generate_tokens`](Self::generate_tokens): evaluates `prompt` after
    /// what is pending and decides the first token.
    fn prefill(
        &mut self,
        prompt: &[u32],
        params: &GenerateParams,
    ) -> Result<Prefilled, GenerateError> {
        let t = Instant::now();
        let m0 = modelled(&self.model);
        let (start, pending) = self.begin_prefill(prompt)?;
        if let Err(e) = self.evaluate(&pending, start, params.batch.max(1)) {
            // The cache holds what was evaluated; the history must not claim more.
            self.truncate_history(self.seq.len());
            return Err(e);
        }
        self.decide_first(prompt, pending.len(), t, m0, params)
    }

    /// Adds `prompt` to the history and returns where evaluation starts and what it
    /// evaluates (a token the previous generation left unfed, then `prompt`).
    pub(crate) fn begin_prefill(
        &mut self,
        prompt: &[u32],
    ) -> Result<(usize, Vec<u32>), GenerateError> {
        let start = self.seq.len();
        self.history.extend_from_slice(prompt);
        let pending: Vec<u32> = self.history[start..].to_vec();
        if pending.is_empty() {
            return Err(GenerateError::EmptyPrompt);
        }
        Ok((start, pending))
    }

    /// After the pending tokens were evaluated (the last row's logits in the sequence): the
    /// sampler takes the prompt in and decides the first token (under `params`' constraint,
    /// whose state starts here); `t`, `m0`: when the prefill began, and the modelled NPU time
    /// then.
    pub(crate) fn decide_first(
        &mut self,
        prompt: &[u32],
        pending: usize,
        t: Instant,
        m0: Option<rknn_matmul::ModelledTime>,
        params: &GenerateParams,
    ) -> Result<Prefilled, GenerateError> {
        let n_vocab = self.model.config().n_vocab;
        for &t in prompt {
            self.sampler.accept(t);
        }
        self.sampler.start_completion();
        #[cfg(feature = "constraint")]
        let mut constraint = params.constraint.as_ref().map(|g| g.start());
        #[cfg(not(feature = "constraint"))]
        let mut constraint: Option<Never> = {
            let _ = params;
            None
        };
        let mut scratch = Vec::new();
        // The last evaluated row's logits decide the first token.
        let logits = self.seq.logits();
        let row = &logits[logits.len() - n_vocab..];
        let raw = row;
        let row = allowed(constraint.as_mut(), row, &mut scratch)?;
        let decided = self.sampler.sample(row);
        // From the model's own row, before the grammar's mask.
        let decided_lp = params.logprobs.map(|n| token_logprobs(raw, decided, n));
        let prefill_time = t.elapsed();
        let m1 = modelled(&self.model);
        Ok(Prefilled {
            out: GenerationSummary {
                prefill_time,
                prompt_tokens: pending,
                modelled: m0
                    .zip(m1.as_ref())
                    .map(|(a, b)| (b.since(&a).busiest_core(), Duration::ZERO)),
                ..GenerationSummary::default()
            },
            modelled_from: m1,
            decided,
            constraint,
            scratch,
            decided_lp,
        })
    }

    /// The iterator generating after a prefill; `reply`: its text joins the chat's messages.
    fn iterate(&mut self, p: Prefilled, params: &GenerateParams, reply: bool) -> Generation<'_> {
        let g = GenerationState::new(&self.tokenizer, p, params, reply);
        Generation { s: self, g }
    }
}

/// What a prefill leaves for the generation iterator.
pub(crate) struct Prefilled {
    out: GenerationSummary,
    modelled_from: Option<rknn_matmul::ModelledTime>,
    decided: u32,
    decided_lp: Option<TokenLogprobs>,
    constraint: Option<ConstraintState>,
    scratch: Vec<f32>,
}

/// A generation's grammar state ([`GenerateParams::constraint`]).
#[cfg(feature = "constraint")]
type ConstraintState = crate::constraint::Constraint;
/// Without the `constraint` feature there is no grammar state.
#[cfg(not(feature = "constraint"))]
type ConstraintState = Never;

/// A type without values: the grammar state of a build without the `constraint` feature.
#[cfg(not(feature = "constraint"))]
#[derive(Debug)]
pub(crate) enum Never {}

/// `row`, or under a constraint a copy of it (in `scratch`) with every token the grammar does
/// not allow next at minus infinity.
#[cfg_attr(not(feature = "constraint"), allow(clippy::ptr_arg))]
fn allowed<'a>(
    constraint: Option<&mut ConstraintState>,
    row: &'a [f32],
    scratch: &'a mut Vec<f32>,
) -> Result<&'a [f32], GenerateError> {
    match constraint {
        None => Ok(row),
        #[cfg(feature = "constraint")]
        Some(c) => {
            scratch.clear();
            scratch.extend_from_slice(row);
            c.mask(scratch)?;
            Ok(scratch)
        }
        #[cfg(not(feature = "constraint"))]
        Some(never) => {
            let _ = scratch;
            match *never {}
        }
    }
}

/// Advances the grammar past a generated `token`.
fn commit(constraint: Option<&mut ConstraintState>, token: u32) -> Result<(), GenerateError> {
    match constraint {
        None => Ok(()),
        #[cfg(feature = "constraint")]
        Some(c) => Ok(c.commit(token)?),
        #[cfg(not(feature = "constraint"))]
        Some(never) => {
            let _ = token;
            match *never {}
        }
    }
}

impl Session {
    /// Evaluates `pending` at positions `start..` in forward passes of `batch` tokens, tapping
    /// every row's logits when there is a tap (else computing only the last row's).
    fn evaluate(
        &mut self,
        pending: &[u32],
        start: usize,
        batch: usize,
    ) -> Result<(), GenerateError> {
        for (c, chunk) in pending.chunks(batch).enumerate() {
            let is_last = (c + 1) * batch >= pending.len();
            let which = match (self.tap.is_some(), is_last) {
                (true, _) => Logits::All,
                (false, true) => Logits::Last,
                (false, false) => Logits::None,
            };
            let logits = self
                .model
                .forward(&mut self.seq, chunk, start + c * batch, which)?;
            if let Some(tap) = &mut self.tap {
                write_rows(tap, logits)?;
            }
        }
        Ok(())
    }
}

/// The modelled NPU time so far, when the model's matmuls run on the in-process emulator.
pub(crate) fn modelled(model: &Model) -> Option<rknn_matmul::ModelledTime> {
    model.modelled_time()
}

fn write_rows(out: &mut dyn Write, rows: &[f32]) -> std::io::Result<()> {
    for v in rows {
        out.write_all(&v.to_le_bytes())?;
    }
    Ok(())
}

/// The generation iterator of [`Session::generate`]: each item is one generated token and
/// its text ([`Piece`]); dropping it cancels the generation (the session keeps what was
/// generated so far).
pub struct Generation<'s> {
    s: &'s mut Session,
    g: GenerationState,
}

/// One generation's state, apart from its session: the iterator [`Generation`] holds one with
/// its session, a batching server one per slot beside the slot's session
/// ([`crate::serve`]), stepping it between batched forward passes.
pub(crate) struct GenerationState {
    params: GenerateParams,
    decoder: StreamDecoder<Arc<Tokenizer>>,
    policy: DraftPolicy,
    /// Drafts of the pass being verified that the draft model proposed (0: lookup's or none).
    model_drafts: usize,
    out: GenerationSummary,
    modelled_from: Option<rknn_matmul::ModelledTime>,
    /// The token decided for the next position, not emitted yet.
    decided: Option<u32>,
    /// Its log-probabilities, when asked for.
    decided_lp: Option<TokenLogprobs>,
    /// Drafted tokens the last verify pass accepted (fed already, and in the history), to
    /// emit in order (the next one last), and the stop that ends the generation after them.
    accepted: Vec<u32>,
    /// Their log-probabilities (in the same order), when asked for.
    accepted_lp: Vec<Option<TokenLogprobs>>,
    stop_after: Option<Stop>,
    /// Released text not yet returned because a stop string may begin in it.
    held: String,
    flushed: bool,
    /// The generated text is still to join the chat's messages as the assistant's reply.
    reply: bool,
    started: Instant,
    /// The grammar's state, advanced by every token emitted or accepted from a draft.
    constraint: Option<ConstraintState>,
    /// A masked copy of a row of logits, under a constraint.
    scratch: Vec<f32>,
}

/// What a generation needs next.
pub(crate) enum Step {
    /// A piece to hand out, an error, or the end (`None`).
    Item(Option<Result<Piece, GenerateError>>),
    /// A forward pass of `fed` at `pos` of the session's sequence, computing `logits`;
    /// `drafts` of them are speculative. [`GenerationState::fed`] takes it from there.
    Feed(Feed),
}

/// A forward pass a generation asks for ([`Step::Feed`]).
pub(crate) struct Feed {
    pub(crate) fed: Vec<u32>,
    pub(crate) pos: usize,
    pub(crate) logits: Logits,
    pub(crate) drafts: usize,
}

impl std::fmt::Debug for Generation<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Generation")
            .field("generated", &self.g.out.generated.len())
            .field("stop", &self.g.out.stop)
            .finish_non_exhaustive()
    }
}

impl Generation<'_> {
    /// What has been generated so far, and the timings (complete once the iterator has
    /// returned `None`).
    pub fn summary(&self) -> &GenerationSummary {
        &self.g.out
    }

    /// Why generation stopped, once it has.
    pub fn stop(&self) -> Option<Stop> {
        self.g.out.stop
    }

    /// Runs the generation to its end and returns the summary.
    pub fn finish(mut self) -> Result<GenerationSummary, GenerateError> {
        for piece in &mut self {
            piece?;
        }
        Ok(std::mem::take(&mut self.g.out))
    }
}

impl GenerationState {
    /// The state after a prefill; `reply`: its text joins the chat's messages.
    pub(crate) fn new(
        tokenizer: &Arc<Tokenizer>,
        p: Prefilled,
        params: &GenerateParams,
        reply: bool,
    ) -> GenerationState {
        GenerationState {
            decoder: StreamDecoder::new(tokenizer.clone()).preserve(&params.preserve),
            policy: DraftPolicy::new(params.lookup.map_or(0, |l| l.draft_max)),
            model_drafts: 0,
            params: params.clone(),
            out: p.out,
            modelled_from: p.modelled_from,
            decided: Some(p.decided),
            decided_lp: p.decided_lp,
            accepted: Vec::new(),
            accepted_lp: Vec::new(),
            stop_after: None,
            held: String::new(),
            flushed: false,
            reply,
            started: Instant::now(),
            constraint: p.constraint,
            scratch: p.scratch,
        }
    }

    /// What has been generated so far, and the timings.
    pub(crate) fn summary(&self) -> &GenerationSummary {
        &self.out
    }

    fn limit(&self) -> usize {
        self.params.max_tokens.unwrap_or(usize::MAX)
    }

    /// Ends the generation for `why`: accepted drafts not emitted yet leave the history and
    /// the cache (the conversation ends where the output does).
    fn end(&mut self, s: &mut Session, why: Stop) {
        if !self.accepted.is_empty() {
            let keep = s.history.len() - self.accepted.len();
            s.truncate_history(keep);
            s.seq.truncate(keep);
            self.accepted.clear();
            self.accepted_lp.clear();
        }
        self.decided = None;
        self.decided_lp = None;
        self.out.stop = Some(why);
        self.out.decode_time = self.started.elapsed();
        if let (Some(m), Some(from)) = (modelled(&s.model), &self.modelled_from) {
            if let Some((_, d)) = &mut self.out.modelled {
                *d = m.since(from).busiest_core() + self.out.spec.draft_modelled;
            }
        }
    }

    /// Emits a generated token (decided now, or an accepted draft when `fed`) with its
    /// log-probabilities `lp`: recorded as generated (and, unless fed, in the history, unfed),
    /// decoded, and its text released as far as a stop string allows.
    fn emit(
        &mut self,
        s: &mut Session,
        token: u32,
        fed: bool,
        lp: Option<TokenLogprobs>,
    ) -> Result<Piece, GenerateError> {
        self.out.generated.push(token);
        if !fed {
            commit(self.constraint.as_mut(), token)?;
            s.sampler.accept(token);
            s.history.push(token);
        }
        let text = self.decoder.push(token)?;
        let text = self.release(s, &text);
        if self.out.stop.is_none() && self.out.generated.len() >= self.limit() {
            self.end(s, Stop::MaxTokens);
        }
        Ok(Piece {
            token: Some(token),
            text,
            logprobs: lp,
        })
    }

    /// Adds `text` to what is held and returns what can be released: everything before a stop
    /// string (which ends the generation), or everything that cannot begin one.
    fn release(&mut self, s: &mut Session, text: &str) -> String {
        self.held.push_str(text);
        let stops = &self.params.stop;
        let found = stops
            .iter()
            .filter(|s| !s.is_empty())
            .filter_map(|s| self.held.find(s.as_str()))
            .min();
        let cut = match found {
            Some(at) => at,
            None => {
                // Hold back the longest end of `held` that begins a stop string.
                let held = &self.held;
                let begins = stops
                    .iter()
                    .map(|s| {
                        (1..=s.len().min(held.len()))
                            .rev()
                            .find(|&n| {
                                let at = held.len() - n;
                                held.is_char_boundary(at) && s.starts_with(&held[at..])
                            })
                            .unwrap_or(0)
                    })
                    .max()
                    .unwrap_or(0);
                held.len() - begins
            }
        };
        let out: String = self.held.drain(..cut).collect();
        self.out.text.push_str(&out);
        if found.is_some() {
            self.held.clear();
            self.end(s, Stop::StopString);
        }
        out
    }

    /// The text still held back at the end (a character's first bytes, text that began a
    /// stop string), once; a chat's reply joins its messages then.
    fn flush(&mut self, s: &mut Session) -> Option<Piece> {
        if self.flushed {
            return None;
        }
        self.flushed = true;
        let piece = if self.out.stop == Some(Stop::StopString) {
            None
        } else {
            let mut text = std::mem::take(&mut self.held);
            text.push_str(&self.decoder.finish());
            self.out.text.push_str(&text);
            (!text.is_empty()).then_some(Piece {
                token: None,
                text,
                logprobs: None,
            })
        };
        self.record_reply(s);
        piece
    }

    /// Adds the text generated so far (and what is held back) to the chat's messages as the
    /// assistant's reply, once.
    fn record_reply(&mut self, s: &mut Session) {
        if std::mem::take(&mut self.reply) {
            let mut text = self.out.text.clone();
            if !self.flushed {
                text.push_str(&self.held);
            }
            s.messages.push(Message::assistant(text));
        }
    }

    /// After a pass that fed the last emitted token and `drafts` at `pos`: each drafted token
    /// stands if the model, at its position, would have chosen it (up to the token limit, and
    /// not past an end-of-generation token); the first row that does not confirm its draft
    /// decides the next token. The cache and the history keep the fed token and the accepted
    /// drafts.
    fn verify(&mut self, s: &mut Session, drafts: &[u32], pos: usize) -> Result<(), GenerateError> {
        let limit = self.limit();
        let Session {
            model,
            tokenizer,
            seq,
            sampler,
            history,
            tap,
            ..
        } = s;
        let n_vocab = model.config().n_vocab;
        let mut accepted = Vec::new();
        // A failure (the tap, the grammar) still leaves the cache and the history as the
        // accepted drafts say.
        let mut outcome = Ok(());
        let mut accepted_lp = Vec::new();
        let logprobs = self.params.logprobs;
        // Each decided or accepted token's log-probabilities come from its own row.
        let lp = |row: &[f32], t: u32| logprobs.map(|n| token_logprobs(row, t, n));
        for (i, row) in seq.logits().chunks_exact(n_vocab).enumerate() {
            if let Some(tap) = tap {
                if let Err(e) = write_rows(tap, row) {
                    outcome = Err(e.into());
                    break;
                }
            }
            self.out.decisions += 1;
            let raw = row;
            let row = match allowed(self.constraint.as_mut(), row, &mut self.scratch) {
                Ok(row) => row,
                Err(e) => {
                    outcome = Err(e);
                    break;
                }
            };
            let Some(&drafted) = drafts.get(i) else {
                let t = sampler.sample(row);
                self.decided = Some(t);
                self.decided_lp = lp(raw, t);
                break;
            };
            match sampler.verify(row, drafted) {
                Verdict::Reject(t) => {
                    self.decided = Some(t);
                    self.decided_lp = lp(raw, t);
                    break;
                }
                Verdict::Accept => {
                    self.out.spec.accepted += 1;
                    if tokenizer.is_eog(drafted) {
                        self.stop_after = Some(Stop::Eog);
                        break;
                    }
                    if let Err(e) = commit(self.constraint.as_mut(), drafted) {
                        outcome = Err(e);
                        break;
                    }
                    sampler.accept(drafted);
                    accepted.push(drafted);
                    accepted_lp.push(lp(raw, drafted));
                    if self.out.generated.len() + accepted.len() >= limit {
                        self.stop_after = Some(Stop::MaxTokens);
                        break;
                    }
                }
            }
        }
        seq.truncate(pos + 1 + accepted.len());
        history.truncate(pos + 1);
        history.extend_from_slice(&accepted);
        accepted.reverse();
        accepted_lp.reverse();
        self.accepted = accepted;
        self.accepted_lp = accepted_lp;
        outcome
    }

    /// Ends the generation now (a client gone, a deadline): what was generated stays.
    pub(crate) fn cancel(&mut self, s: &mut Session, why: Stop) {
        if self.out.stop.is_none() {
            self.end(s, why);
        }
        self.flushed = true;
        self.record_reply(s);
    }

    /// The next thing the generation needs: a piece to hand out (or its end), or a forward
    /// pass, after which [`GenerationState::fed`] must be called.
    pub(crate) fn step(&mut self, s: &mut Session) -> Step {
        if self.out.stop.is_some() {
            return Step::Item(self.flush(s).map(Ok));
        }
        // Drafts a verify pass accepted come first: they are fed already.
        if let Some(t) = self.accepted.pop() {
            let lp = self.accepted_lp.pop().flatten();
            return Step::Item(Some(self.emit(s, t, true, lp)));
        }
        if let Some(why) = self.stop_after.take() {
            self.end(s, why);
            return self.step(s);
        }
        if self.out.generated.len() >= self.limit() {
            self.end(s, Stop::MaxTokens);
            return self.step(s);
        }
        if let Some(token) = self.decided.take() {
            if s.tokenizer.is_eog(token) {
                self.end(s, Stop::Eog);
                return self.step(s);
            }
            let lp = self.decided_lp.take();
            return Step::Item(Some(self.emit(s, token, false, lp)));
        }
        // Feed the last emitted token (and drafts) and decide the next.
        let pos = s.seq.len();
        let n_ctx = s.seq.n_ctx();
        if pos >= n_ctx {
            self.end(s, Stop::Context);
            return self.step(s);
        }
        let room = (self.limit() - self.out.generated.len()).min(n_ctx - pos - 1);
        let lookup_room = room.min(self.policy.next_len());
        let mut drafts: Vec<u32> = match &self.params.lookup {
            Some(l) => l.draft(&s.history, lookup_room).to_vec(),
            None => Vec::new(),
        };
        if drafts.is_empty() && room > 0 {
            if let Some(d) = &mut s.draft {
                let tokenizer = &s.tokenizer;
                match d.propose(&s.history, room, self.params.batch, |t| tokenizer.is_eog(t)) {
                    Ok(p) => {
                        let spec = &mut self.out.spec;
                        spec.draft_forwards += p.forwards;
                        spec.draft_time += p.time;
                        spec.draft_modelled += p.modelled;
                        spec.model_drafted += p.tokens.len();
                        self.model_drafts = p.tokens.len();
                        drafts = p.tokens;
                    }
                    Err(e) => return Step::Item(Some(Err(e.into()))),
                }
            }
        }
        let mut fed = Vec::with_capacity(1 + drafts.len());
        fed.extend_from_slice(&s.history[pos..]);
        let n_drafts = drafts.len();
        fed.extend(drafts);
        let logits = if n_drafts == 0 {
            Logits::Last
        } else {
            Logits::All
        };
        Step::Feed(Feed {
            fed,
            pos,
            logits,
            drafts: n_drafts,
        })
    }

    /// After the forward pass `feed` asked for ran (its logits in the session's sequence):
    /// verifies the drafts and decides the next token.
    pub(crate) fn fed(&mut self, s: &mut Session, feed: &Feed) -> Result<(), GenerateError> {
        self.out.decode_forwards += 1;
        if feed.drafts > 0 {
            self.out.spec.passes += 1;
            self.out.spec.drafted += feed.drafts;
        }
        let before = self.out.spec.accepted;
        let drafts = &feed.fed[feed.fed.len() - feed.drafts..];
        let verified = self.verify(s, drafts, feed.pos);
        let kept = self.out.spec.accepted - before;
        if std::mem::take(&mut self.model_drafts) > 0 {
            self.out.spec.model_accepted += kept;
        } else {
            // Lookup's policy learns from lookup's drafts only.
            self.policy.record(feed.drafts, kept);
        }
        verified
    }
}

impl Drop for Generation<'_> {
    /// A chat turn cancelled by dropping its iterator still records what was generated.
    fn drop(&mut self) {
        self.g.record_reply(self.s);
    }
}

impl Iterator for Generation<'_> {
    type Item = Result<Piece, GenerateError>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            match self.g.step(self.s) {
                Step::Item(item) => return item,
                Step::Feed(feed) => {
                    let Session { model, seq, .. } = &mut *self.s;
                    if let Err(e) = model.forward(seq, &feed.fed, feed.pos, feed.logits) {
                        return Some(Err(e.into()));
                    }
                    if let Err(e) = self.g.fed(self.s, &feed) {
                        return Some(Err(e));
                    }
                }
            }
        }
    }
}

pub(crate) use crate::spec::common_prefix;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::GgufFile;
    use crate::model::{HostF32Factory, host_pool};
    use crate::spec::PromptLookup;

    fn tiny_session(sampling: SamplerConfig) -> Session {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/llm/tiny-llama.gguf"
        );
        let file = GgufFile::open(path).unwrap();
        let pool = host_pool(1).unwrap();
        let model = Model::load(
            &file,
            &mut HostF32Factory::new(pool.clone()),
            pool,
            &mut |_, _| {},
        )
        .unwrap();
        let tok = Tokenizer::from_gguf(&file).unwrap();
        Session::new(Arc::new(model), Arc::new(tok), sampling).unwrap()
    }

    /// The repetition penalty's recent tokens are the last `repeat_last_n` of the history.
    fn assert_window_follows(s: &Session, when: &str) {
        let n = s.sampler.config().repeat_last_n;
        let h = &s.history;
        assert_eq!(s.sampler.recent(), h[h.len().saturating_sub(n)..], "{when}");
    }

    #[test]
    fn the_penalty_window_follows_every_cut_of_the_history() {
        let mut s = tiny_session(SamplerConfig {
            temperature: 0.0,
            repeat_last_n: 16,
            ..SamplerConfig::default()
        });
        // A prompt that repeats itself, so prompt lookup drafts and verify passes accept.
        let prompt: Vec<u32> = (0..40).map(|i| 3 + (i % 7) * 11).collect();
        let params = GenerateParams {
            max_tokens: Some(60),
            lookup: Some(PromptLookup::default()),
            ..GenerateParams::default()
        };
        let mut g = s.generate_tokens(&prompt, &params).unwrap();
        assert_window_follows(g.s, "after the prompt");
        // Run until a verify pass leaves accepted drafts to emit, then end there, as a stop
        // string in the first of them does: the rest leave the history.
        let cut = loop {
            match g.g.step(g.s) {
                Step::Item(Some(piece)) => {
                    piece.unwrap();
                }
                Step::Item(None) => panic!("no verify pass accepted a draft"),
                Step::Feed(feed) => {
                    let Session { model, seq, .. } = &mut *g.s;
                    model
                        .forward(seq, &feed.fed, feed.pos, feed.logits)
                        .unwrap();
                    g.g.fed(g.s, &feed).unwrap();
                    if !g.g.accepted.is_empty() {
                        let before = g.s.history.len();
                        g.g.end(g.s, Stop::StopString);
                        break before - g.s.history.len();
                    }
                }
            }
        };
        drop(g);
        assert!(cut > 0);
        assert_window_follows(&s, "after a stop among accepted drafts");
        let len = s.sequence().len();
        s.set_context(len - 5);
        assert!(s.history.len() < len);
        assert_window_follows(&s, "after set_context");
        let kept = s.keep_prefix(&prompt[..20]);
        assert_eq!(kept, 19);
        assert_window_follows(&s, "after keep_prefix");
    }
}
