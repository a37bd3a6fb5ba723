//! The tokenizers GGUF files describe, producing the ids llama.cpp produces.
//!
//! Two families are supported:
//!
//! * SentencePiece-style vocabularies (`tokenizer.ggml.model = "llama"`: Llama 1/2, TinyLlama,
//!   Phi-3, Gemma 3, ...): spaces become U+2581, characters merge by token score, and characters
//!   outside the vocabulary fall back to `<0xXX>` byte tokens.
//! * Byte-level BPE (`tokenizer.ggml.model = "gpt2"`: SmolLM, Llama 3, Qwen 2, GPT-2, ...):
//!   the model's pre-tokenizer ([`PreTokenizerKind`]) cuts the text into words, each word's
//!   bytes map to GPT-2's printable characters and merge by rank. Gemma 4's SentencePiece-style
//!   BPE (`gemma4`) is supported as well.
//!
//! Before either runs, special tokens are cut out of the text: user-defined tokens always, control
//! tokens (`<|im_start|>`) only when the caller asks (`parse_special`), longest first. The
//! special ids, `add_bos` / `add_eos` defaults, end-of-generation set and per-token attributes
//! follow llama.cpp's vocabulary loader.
//!
//! [`StreamDecoder`] turns generated ids back into text, holding back incomplete UTF-8.

mod bpe;
mod error;
mod gguf_keys;
mod pretok;
mod spec;
mod spm;
mod stream;
mod trie;
mod vocab;

pub use error::TokenizerError;
pub use pretok::PreTokenizerKind;
pub use spec::{SpecialIds, TokenAttr, VocabKind, VocabSpec};
pub use stream::StreamDecoder;
pub use vocab::Tokenizer;

#[cfg(test)]
use {
    pretok::PreTokenizer,
    vocab::{clean_spaces, parse_byte_token},
};

#[cfg(test)]
mod tests;
