//! The flagship of rknpu-rs as a library: quantized LLMs (GGUF files of the llama family) whose
//! weight matmuls run on the NPU through the SDK's engine, or on the host in f32.
//!
//! * [`ModelBuilder`] ([`Model::builder`]): loading in one place: the backend (NPU, emulator
//!   or host f32, and why), the engine, the converted-weight cache, the context, the host
//!   threads, the tokenizer and the chat template.
//! * [`gguf`]: the GGUF container: header, metadata, tensor directory, zero-copy views into the
//!   mapped file, and dequantization of the common block formats.
//! * [`tokenizer`]: the vocabularies GGUF files carry (SentencePiece-style and byte-level BPE
//!   with the model's pre-tokenizer), producing llama.cpp's ids.
//! * [`model`]: the forward pass over a [`model::Model`] (immutable, shared) and a
//!   [`model::Sequence`] (one sequence's KV cache), every weight matmul through one seam.
//! * [`session`]: [`session::Session`], one conversation over a shared model, and
//!   [`session::Session::generate`], an iterator of generated pieces.
//! * [`sample`]: greedy, temperature, top-k, top-p, repetition penalty.
//! * [`spec`]: lossless speculative decoding by prompt lookup.
//! * [`chat`]: chat templates (`tokenizer.chat_template`) rendered by minijinja as Hugging
//!   Face's `apply_chat_template` renders them.
//! * `constraint` (feature `constraint`, on with `cli`): structured output, a JSON Schema or a
//!   grammar enforced while sampling.
//! * [`perplexity`]: teacher-forced perplexity, as llama.cpp's `llama-perplexity` computes it.
//!
//! The binaries (`llm-decode`, `llm-server`) and [`cli`], their shared flags for loading a
//! model, are behind the default `cli` feature; `default-features = false` builds the library
//! alone.

pub mod builder;
pub mod chat;
#[cfg(feature = "cli")]
pub mod cli;
#[cfg(feature = "constraint")]
pub mod constraint;
pub mod gguf;
pub mod model;
pub mod perplexity;
pub mod sample;
pub mod serve;
pub mod session;
pub mod spec;
pub mod tokenizer;

pub use builder::{Backend, DEFAULT_CONTEXT, LoadError, LoadedModel, ModelBuilder};
pub use model::Model;
