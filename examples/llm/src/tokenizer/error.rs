//! What can go wrong loading a vocabulary or tokenizing with it.

/// What can go wrong loading a vocabulary or tokenizing with it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TokenizerError {
    /// A metadata key the tokenizer needs is absent.
    #[error("GGUF metadata key `{key}` is missing")]
    MissingKey {
        /// The key.
        key: &'static str,
    },
    /// A metadata key holds a value of another type.
    #[error("GGUF metadata key `{key}` should be {expected}")]
    WrongType {
        /// The key.
        key: &'static str,
        /// What it should hold.
        expected: &'static str,
    },
    /// `tokenizer.ggml.model` names a tokenizer this crate does not implement.
    #[error("unsupported tokenizer model `{model}` (supported: llama, gpt2, gemma4)")]
    UnsupportedModel {
        /// The value of `tokenizer.ggml.model`.
        model: String,
    },
    /// `tokenizer.ggml.pre` names a pre-tokenizer this crate does not implement.
    #[error("unsupported pre-tokenizer `{pre}` (tokenizer.ggml.pre)")]
    UnsupportedPreTokenizer {
        /// The value of `tokenizer.ggml.pre`.
        pre: String,
    },
    /// The vocabulary has no tokens.
    #[error("the vocabulary is empty (tokenizer.ggml.tokens)")]
    EmptyVocab,
    /// More tokens than llama.cpp's 32-bit signed ids can address.
    #[error("the vocabulary has {n} tokens, more than the {max} token ids can address")]
    TooManyTokens {
        /// Tokens in the file.
        n: usize,
        /// The limit.
        max: usize,
    },
    /// A per-token array is shorter than the token list.
    #[error("`{key}` has {len} entries for {n_tokens} tokens")]
    ArrayTooShort {
        /// The key.
        key: &'static str,
        /// Its length.
        len: usize,
        /// The number of tokens.
        n_tokens: usize,
    },
    /// Two tokens have the same text, so text-to-id is ambiguous.
    #[error("tokens {first} and {second} have the same text {text:?}")]
    DuplicateToken {
        /// The text.
        text: String,
        /// The first id.
        first: u32,
        /// The second id.
        second: u32,
    },
    /// A BPE vocabulary without `tokenizer.ggml.merges`.
    #[error("BPE vocabulary without merges (tokenizer.ggml.merges)")]
    MissingMerges,
    /// A pre-tokenizer expression failed to compile or to run (backtracking limit).
    #[error("pre-tokenizer expression {pattern:?} failed: {message}")]
    Regex {
        /// The expression.
        pattern: String,
        /// What went wrong.
        message: String,
    },
    /// The text needs a byte-fallback token the SentencePiece vocabulary lacks.
    #[error("no byte token for byte 0x{byte:02X} (<0x{byte:02X}>) in the vocabulary")]
    MissingByteToken {
        /// The byte.
        byte: u8,
    },
    /// `add_special` asked for a BOS or EOS token the vocabulary does not define.
    #[error("the vocabulary adds a {which} token but defines none")]
    MissingSpecial {
        /// `BOS` or `EOS`.
        which: &'static str,
    },
    /// A token id beyond the vocabulary.
    #[error("token id {id} is out of range (vocabulary of {n_vocab})")]
    IdOutOfRange {
        /// The id.
        id: u32,
        /// The vocabulary size.
        n_vocab: usize,
    },
    /// Text longer than the 4 GiB the tokenizer indexes.
    #[error("text of {len} bytes is longer than the tokenizer's 4 GiB limit")]
    TextTooLong {
        /// The text's length.
        len: usize,
    },
}
