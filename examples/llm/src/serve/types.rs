//! The batcher's public types: how it serves ([`ServeConfig`]), what a request asks
//! ([`Request`]), where its events go ([`EventSink`], [`Sink`]) and what they are ([`Event`],
//! [`Finished`]), why one fails ([`ServeError`]), and what the batcher has done ([`Metrics`]).

use std::time::{Duration, Instant};

use crate::model::CacheType;
use crate::sample::SamplerConfig;
use crate::session::{GenerateError, Piece, Stop};
use crate::spec::DraftModel;

/// How a [`Batcher`](super::Batcher) serves.
#[derive(Clone, Debug, PartialEq)]
pub struct ServeConfig {
    /// Requests decoded together at most (llama-server's `--parallel`); each has a slot with
    /// its own KV cache. At least 1.
    pub slots: usize,
    /// Positions per slot (0: the model's context size,
    /// [`Model::n_ctx`](crate::model::Model::n_ctx)). A server sharing a total context
    /// among its slots, as llama-server's `-c` does, sets the total divided by `slots`.
    pub slot_ctx: usize,
    /// Requests that may wait for a slot beyond those running; more are refused
    /// ([`ServeError::QueueFull`]).
    pub queue: usize,
    /// Prompt tokens evaluated per forward pass at most, over all requests still evaluating
    /// their prompt (at least 1). Smaller keeps the running streams' inter-token latency
    /// steadier while a prompt arrives; larger gets the new request its first token sooner.
    pub prefill_chunk: usize,
    /// How each slot's cache stores keys and values.
    pub cache_type: CacheType,
    /// A draft model every slot drafts with ([`Session::set_draft`](crate::session::Session::set_draft)):
    /// each decode step, a slot's draft proposes tokens and the step's pass verifies them.
    pub draft: Option<DraftModel>,
}

impl Default for ServeConfig {
    fn default() -> Self {
        ServeConfig {
            slots: 4,
            slot_ctx: 0,
            queue: 64,
            prefill_chunk: 64,
            cache_type: CacheType::F32,
            draft: None,
        }
    }
}

/// One completion to generate.
#[derive(Clone, Debug, PartialEq)]
pub struct Request {
    /// The prompt's token ids (a BOS included where the vocabulary wants one).
    pub prompt: Vec<u32>,
    /// How to sample (greedy at temperature 0).
    pub sampling: SamplerConfig,
    /// Tokens to generate at most (`None`: until end of generation or a full slot).
    pub max_tokens: Option<usize>,
    /// Text that ends the generation where it appears (left out of the output).
    pub stop: Vec<String>,
    /// Whether the request may reuse a slot's cached prefix (llama-server's `cache_prompt`;
    /// the output is the same either way).
    pub cache_prompt: bool,
    /// When the request is cancelled ([`ServeError::DeadlineExceeded`]) if it has not ended, waiting
    /// or running.
    pub deadline: Option<Instant>,
    /// The grammar the output must follow ([`crate::constraint`]); each request has its own
    /// parser state.
    #[cfg(feature = "constraint")]
    pub constraint: Option<crate::constraint::Grammar>,
    /// Log-probabilities of each generated token and of the `n` most likely at its position
    /// in each [`Piece`] ([`GenerateParams::logprobs`](crate::session::GenerateParams::logprobs));
    /// `None` computes none.
    pub logprobs: Option<usize>,
    /// Control tokens whose text the output keeps ([`GenerateParams::preserve`](crate::session::GenerateParams::preserve)).
    pub preserve: Vec<u32>,
}

impl Default for Request {
    fn default() -> Self {
        Request {
            prompt: Vec::new(),
            sampling: SamplerConfig::default(),
            max_tokens: None,
            stop: Vec::new(),
            cache_prompt: true,
            deadline: None,
            #[cfg(feature = "constraint")]
            constraint: None,
            logprobs: None,
            preserve: Vec::new(),
        }
    }
}

/// What a request's sink receives: pieces, then one `Done` or one `Failed`.
#[derive(Debug)]
pub enum Event {
    /// A generated token and the text it releases (see [`Piece`]).
    Piece(Piece),
    /// The request ended normally.
    Done(Finished),
    /// The request failed; nothing follows.
    Failed(ServeError),
}

/// How a request ended.
#[derive(Clone, Debug, PartialEq)]
pub struct Finished {
    /// Why generation stopped.
    pub stop: Stop,
    /// Tokens of the prompt.
    pub prompt_tokens: usize,
    /// Of those, the ones a slot's cache already held (not evaluated again).
    pub cached_tokens: usize,
    /// Tokens generated.
    pub completion_tokens: usize,
    /// The generated text (up to a stop string, which is left out).
    pub text: String,
    /// From submission to the first token's logits (waiting for a slot included).
    pub time_to_first_token: Duration,
    /// From the first token's logits to the end.
    pub decode_time: Duration,
    /// The slot that served it.
    pub slot: usize,
}

/// Why a request was refused or failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServeError {
    /// Every slot is busy and the wait queue is full.
    #[error("all {slots} slots are busy and {queue} requests are waiting already")]
    QueueFull {
        /// Slots.
        slots: usize,
        /// The wait queue's length.
        queue: usize,
    },
    /// The prompt does not fit in a slot.
    #[error("the prompt has {tokens} tokens, more than a slot's context of {n_ctx}")]
    PromptTooLong {
        /// Prompt tokens.
        tokens: usize,
        /// Positions per slot.
        n_ctx: usize,
    },
    /// The prompt has no token.
    #[error("the prompt is empty")]
    EmptyPrompt,
    /// A prompt id outside the vocabulary.
    #[error("token id {token} is outside the vocabulary of {n_vocab}")]
    BadToken {
        /// The id.
        token: u32,
        /// Tokens in the vocabulary.
        n_vocab: usize,
    },
    /// The batcher is shutting down and takes no new request, or ended this one.
    #[error("the server is shutting down")]
    ShuttingDown,
    /// The request's deadline passed before it finished.
    #[error("the request's deadline passed")]
    DeadlineExceeded,
    /// The configuration is unusable.
    #[error("bad serving configuration: {0}")]
    Config(String),
    /// Generation failed (the forward pass or the tokenizer refused).
    #[error(transparent)]
    Generate(#[from] GenerateError),
    /// An embeddings request refused or failed (an input that cannot be embedded, a failed
    /// pass).
    #[error(transparent)]
    Embedding(crate::model::ModelError),
    /// A panic inside the request's forward pass or its sink; the batcher goes on.
    #[error("internal error: {0}")]
    Internal(String),
}

/// A snapshot of what a [`Batcher`](super::Batcher) has done
/// ([`Batcher::metrics`](super::Batcher::metrics)).
#[derive(Clone, Debug, Default, PartialEq)]
#[non_exhaustive]
pub struct Metrics {
    /// Slots.
    pub slots: usize,
    /// Slots serving a request now.
    pub active: usize,
    /// Requests waiting for a slot.
    pub queued: usize,
    /// Requests accepted.
    pub accepted: u64,
    /// Requests refused at submission (any [`ServeError`] from
    /// [`Batcher::submit`](super::Batcher::submit)).
    pub refused: u64,
    /// Requests that ended with [`Event::Done`].
    pub finished: u64,
    /// Requests cancelled (sink gone, deadline, shutdown).
    pub cancelled: u64,
    /// Requests that failed otherwise.
    pub failed: u64,
    /// Prompt tokens of accepted requests.
    pub prompt_tokens: u64,
    /// Of those, tokens reused from a slot's cache.
    pub cached_tokens: u64,
    /// Tokens generated.
    pub completion_tokens: u64,
    /// Forward passes run.
    pub passes: u64,
    /// Rows in those passes (prompt chunks and decode rows).
    pub pass_rows: u64,
    /// Decode rows in those passes (one per decoding request per pass).
    pub decode_rows: u64,
    /// Tokens the draft model proposed ([`ServeConfig::draft`]), over finished requests.
    pub draft_tokens: u64,
    /// Of those, tokens the model accepted.
    pub draft_accepted: u64,
    /// Rows of the last pass.
    pub last_pass_rows: usize,
    /// Passes by rows, in buckets of at most 1, 2, 4, 8, 16, 32, 64, 128 and more rows.
    pub rows_histogram: [u64; ROWS_BUCKETS.len() + 1],
    /// Seconds spent in forward passes.
    pub busy_seconds: f64,
    /// Tokens generated per second over the last [`RATE_WINDOW`].
    pub decode_tok_s: f64,
    /// The modelled RK3588 NPU time (busiest core) of every pass so far, in seconds, when the
    /// matmuls run on the in-process emulator (its cost model, not this machine's time).
    pub modelled_npu_seconds: Option<f64>,
}

/// Upper bounds of [`Metrics::rows_histogram`]'s buckets (the last bucket has no bound).
pub const ROWS_BUCKETS: [usize; 8] = [1, 2, 4, 8, 16, 32, 64, 128];

/// The window of [`Metrics::decode_tok_s`].
pub const RATE_WINDOW: Duration = Duration::from_secs(10);

/// Where a request's events go. Its methods are called on the batcher's thread, between
/// passes, so they must not block.
///
/// A closure `FnMut(Event) -> bool` is a sink: it hands each event on and returns `false` once
/// nobody listens. Such a sink can only tell by being called, so a request whose listener left
/// while it waited for a slot or evaluated its prompt is cancelled at its first token. A sink
/// that can also be asked ([`EventSink::is_listening`], e.g. a channel's sender asking whether
/// its receiver is still there) frees that place (the queue's, admission's, the slot) before
/// the next pass instead.
pub trait EventSink: Send {
    /// Hands `event` on: `false` once nobody listens (the request is then cancelled, and
    /// nothing more is sent).
    fn send(&mut self, event: Event) -> bool;

    /// Whether anybody still listens; asked before every pass while the request waits for a
    /// slot or evaluates its prompt (steps in which it has no event to send). `false` cancels
    /// it at once, and nothing more is sent. The default says `true`: the sink tells only
    /// through [`EventSink::send`].
    fn is_listening(&mut self) -> bool {
        true
    }
}

impl<F: FnMut(Event) -> bool + Send> EventSink for F {
    fn send(&mut self, event: Event) -> bool {
        self(event)
    }
}

/// A request's sink, as [`Batcher::submit`](super::Batcher::submit) takes it:
/// `Box::new(move |event| tx.send(event).is_ok())`, or a boxed [`EventSink`] of your own.
pub type Sink = Box<dyn EventSink>;

/// Where an embeddings request's answer goes ([`Batcher::embed`](super::Batcher::embed)). Its
/// methods are called on the batcher's thread, so they must not block.
///
/// A closure `FnOnce(Result<Vec<Vec<f32>>, ServeError>)` is one (it cannot be asked whether
/// anybody listens, so its request runs to its end); a reply of your own can also answer
/// [`EmbedSink::is_listening`], which frees the request's place before its next pass once
/// nobody waits.
pub trait EmbedSink: Send {
    /// Hands over the answer: each input's vector in input order, or why the request failed.
    /// Called once, and last.
    fn answer(self: Box<Self>, answer: Result<Vec<Vec<f32>>, ServeError>);

    /// Whether anybody still waits for the answer; asked before each of the request's passes.
    /// `false` cancels it at once, and [`EmbedSink::answer`] is not called. The default says
    /// `true`.
    fn is_listening(&mut self) -> bool {
        true
    }
}

impl<F: FnOnce(Result<Vec<Vec<f32>>, ServeError>) + Send> EmbedSink for F {
    fn answer(self: Box<Self>, answer: Result<Vec<Vec<f32>>, ServeError>) {
        (*self)(answer)
    }
}

/// An embeddings request's reply, as [`Batcher::embed`](super::Batcher::embed) takes it:
/// `Box::new(move |answer| ...)`, or a boxed [`EmbedSink`] of your own.
pub type EmbedReply = Box<dyn EmbedSink>;
