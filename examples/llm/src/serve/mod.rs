//! Serving many requests on one model: a [`Batcher`] owns `slots` sessions over one shared
//! [`Model`] and decodes every active request in the same forward pass (continuous batching),
//! on one thread of its own, with no async runtime (`llm-server` puts HTTP in front of it).
//!
//! Why one pass for all: decode reads every weight once per pass whatever the number of rows,
//! so on an NPU bound by reading the weights, rows of other requests ride along almost free
//! (the campaign seed measured a pass of 6 rows at about the cost of 1). Each step:
//!
//! 1. every decoding request hands out the token its last pass decided (to its sink) and asks
//!    for one row: the token to feed at its own position;
//! 2. requests still evaluating their prompt add chunks of it, at most
//!    [`ServeConfig::prefill_chunk`] prompt tokens per pass in all (the oldest first), so that
//!    a long new prompt does not stall the running streams;
//! 3. one [`Model::forward_batch`] runs all those rows, each over its own slot's KV cache;
//! 4. each request decides its next token from its own row of logits.
//!
//! The pass is row-wise batch-invariant, so a request's tokens are bit-for-bit those it gets
//! alone (or from `llm-decode` with the same prompt and sampling), whatever else is in flight.
//!
//! **Prompt cache.** A slot keeps its KV cache after its request ends. A new request goes to
//! the free slot whose cached tokens share the longest prefix with its prompt (a chat's next
//! turn, a common system prompt), which evaluates only the rest
//! ([`Session::keep_prefix`]); the logits are the same as from a cold cache. When another
//! slot (busy or free) holds a longer prefix, the request copies that slot's keys and values
//! for it ([`Session::keep_prefix_from`]); a request whose prompt a slot is evaluating now
//! waits for that prefill when it would copy at least 16 tokens more, so one prompt submitted
//! `n` times (a server's `n` choices) is evaluated once.
//!
//! **Admission.** `slots` requests run at once and `queue` more wait; past that,
//! [`Batcher::submit`] refuses with [`ServeError::QueueFull`] (a server answers 503). A
//! request nobody listens to any more is cancelled, and so is one past its deadline; either
//! frees its place (its slot, or its place in the queue, and admission's count) before the
//! next pass. A decoding request's sink tells by returning `false` for a piece; a waiting or
//! prefilling request has no event to send, so its sink is asked before every pass
//! ([`EventSink::is_listening`]: a plain closure cannot tell, and its request is cancelled at
//! its first token). A panic inside a pass fails the requests of that pass (their slots are
//! reset) and the batcher goes on.
//!
//! **Embeddings.** [`Batcher::embed`] queues a list of inputs to embed ([`Model::embed`]'s
//! vectors): the batcher runs them as sequences of their own (not slots), one bounded pass of
//! them after each step, so running streams wait for one such pass at a time; the vectors are
//! bit-identical to each input's alone.
//!
//! **Files.** The public types are in `types.rs`; the handle ([`Batcher`]: starting,
//! admission, metrics, closing) in `batcher.rs`; its thread (the slots, the wait queue, the
//! step and its four phases, ending requests) in `worker.rs`; what the two share in
//! `shared.rs`.
//!
//! ```
//! use std::sync::{Arc, mpsc};
//! use rknn_llm::gguf::GgufFile;
//! use rknn_llm::model::{HostF32Factory, Model};
//! use rknn_llm::sample::SamplerConfig;
//! use rknn_llm::serve::{Batcher, Event, Request, ServeConfig};
//! use rknn_llm::tokenizer::Tokenizer;
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/llm/tiny-llama.gguf");
//! let file = GgufFile::open(path)?;
//! // An ordinary pool: the batcher's thread runs inside it (see `Batcher::start`).
//! let pool = Arc::new(rayon::ThreadPoolBuilder::new().num_threads(2).build()?);
//! let model = Model::load(&file, &mut HostF32Factory::new(pool.clone()), pool, &mut |_, _| {})?;
//! let tokenizer = Arc::new(Tokenizer::from_gguf(&file)?);
//! let batcher = Batcher::start(Arc::new(model), tokenizer.clone(), ServeConfig::default())?;
//! let (tx, rx) = mpsc::channel();
//! let request = Request {
//!     prompt: tokenizer.encode("Once upon a time", true, true)?,
//!     sampling: SamplerConfig { temperature: 0.0, ..SamplerConfig::default() },
//!     max_tokens: Some(8),
//!     ..Request::default()
//! };
//! batcher.submit(request, Box::new(move |event| tx.send(event).is_ok()))?;
//! let mut text = String::new();
//! for event in rx {
//!     match event {
//!         Event::Piece(piece) => text.push_str(&piece.text),
//!         Event::Done(done) => { assert_eq!(done.completion_tokens, 8); break }
//!         Event::Failed(e) => return Err(e.into()),
//!     }
//! }
//! # Ok(()) }
//! ```
//!
//! [`Model`]: crate::model::Model
//! [`Model::forward_batch`]: crate::model::Model::forward_batch
//! [`Model::embed`]: crate::model::Model::embed
//! [`Session::keep_prefix`]: crate::session::Session::keep_prefix
//! [`Session::keep_prefix_from`]: crate::session::Session::keep_prefix_from

mod batcher;
mod shared;
mod types;
mod worker;

pub use batcher::Batcher;
pub use types::{
    EmbedReply, EmbedSink, Event, EventSink, Finished, Metrics, RATE_WINDOW, ROWS_BUCKETS, Request,
    ServeConfig, ServeError, Sink,
};
