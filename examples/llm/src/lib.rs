//! The flagship of rknpu-rs: a quantized LLM forward pass (GGUF files of the llama family)
//! whose weight matmuls run through the SDK, and the pieces around it.
//!
//! * [`gguf`]: the GGUF container: header, metadata, tensor directory, zero-copy views into the
//!   mapped file, and dequantization of the common block formats.
//! * [`tokenizer`]: the vocabularies GGUF files carry (SentencePiece-style and byte-level BPE
//!   with the model's pre-tokenizer), producing llama.cpp's ids.
//! * [`model`]: the llama / qwen2 forward pass with a KV cache.
//! * [`sample`]: greedy, temperature, top-k, top-p, repetition penalty.
//! * [`spec`]: lossless speculative decoding by prompt lookup.
//! * [`generate`]: prefill, then decode token by token or by verified drafts.
//! * [`chat`]: the ChatML, Llama-3 and Llama-2 chat formats.

pub mod chat;
pub mod generate;
pub mod gguf;
pub mod model;
pub mod sample;
pub mod spec;
pub mod tokenizer;
