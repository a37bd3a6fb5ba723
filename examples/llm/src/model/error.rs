//! What can go wrong building or running a model.

use super::backend::BackendError;
use crate::gguf::{GgmlType, GgufError};

/// What went wrong building or running the model.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ModelError {
    /// The GGUF file itself.
    #[error(transparent)]
    Gguf(#[from] GgufError),
    /// `general.architecture` names an architecture this crate does not run.
    #[error("unsupported architecture {arch:?} (supported: {supported})")]
    UnsupportedArchitecture {
        /// The architecture named by the file.
        arch: String,
        /// The architectures this crate runs, comma-separated.
        supported: String,
    },
    /// A required metadata key is absent.
    #[error("metadata key {key:?} is missing")]
    MissingKey {
        /// The key.
        key: String,
    },
    /// A metadata value is of the wrong type or out of range.
    #[error("metadata key {key:?}: {reason}")]
    BadKey {
        /// The key.
        key: String,
        /// What is wrong.
        reason: String,
    },
    /// A feature of the file this model does not implement.
    #[error("unsupported model feature: {what}")]
    Unsupported {
        /// The feature.
        what: String,
    },
    /// A required tensor is absent.
    #[error("tensor {name:?} is missing")]
    MissingTensor {
        /// Its name.
        name: String,
    },
    /// A tensor of the wrong shape or type.
    #[error("tensor {name:?} has dimensions {found:?} of {ty}, expected {expected:?}")]
    BadTensor {
        /// Its name.
        name: String,
        /// The dimensions the configuration implies.
        expected: Vec<u64>,
        /// The dimensions in the file.
        found: Vec<u64>,
        /// Its type.
        ty: GgmlType,
    },
    /// A tensor of the right shape whose values the model cannot use.
    #[error("tensor {name:?}: {reason}")]
    BadTensorData {
        /// Its name.
        name: String,
        /// What is wrong.
        reason: String,
    },
    /// The backend refused or failed a weight.
    #[error("backend, tensor {tensor:?}: {source}")]
    Backend {
        /// The tensor being converted or multiplied.
        tensor: String,
        /// The backend's error.
        source: BackendError,
    },
    /// The tokens would run past the context length.
    #[error(
        "context overflow: positions {pos}..{end} exceed the context length {n_ctx}",
        end = pos + n_tokens
    )]
    ContextOverflow {
        /// First position.
        pos: usize,
        /// Tokens given.
        n_tokens: usize,
        /// The context length.
        n_ctx: usize,
    },
    /// A position past what the cache holds.
    #[error("position {pos} is past the {cached} positions in the KV cache")]
    BadPosition {
        /// The position given.
        pos: usize,
        /// Positions cached.
        cached: usize,
    },
    /// A step back further than the sliding-window layers keep their keys.
    #[error(
        "cannot go back to position {pos} of {cached}: the sliding-window layers keep the keys of \
         the last passes only (reset the sequence and evaluate from 0)"
    )]
    RewindPastWindow {
        /// The position asked for.
        pos: usize,
        /// Positions cached.
        cached: usize,
    },
    /// A context size the model cannot take.
    #[error("context size {asked} exceeds the model's trained context of {trained}")]
    ContextTooLarge {
        /// The size asked for.
        asked: usize,
        /// The model's `context_length`.
        trained: usize,
    },
    /// A pooling of embeddings this crate does not compute (llama.cpp's `none`, one vector
    /// per token, and `rank`, a reranker's head; or an unknown name or number).
    #[error("pooling {pooling} is not supported for embeddings (mean, last and cls are)")]
    UnsupportedPooling {
        /// The pooling asked for or named by the file.
        pooling: String,
    },
    /// The file names no pooling for its embeddings, and none was chosen.
    #[error(
        "the model names no pooling for embeddings ({key} is absent): choose mean, last or cls \
         (--pooling)"
    )]
    NoPooling {
        /// The metadata key that is absent.
        key: String,
    },
    /// An input to [`Model::embed`](super::Model::embed) that cannot be embedded.
    #[error("embedding input {index}: {reason}")]
    EmbeddingInput {
        /// Its index in the list.
        index: usize,
        /// What is wrong with it.
        reason: String,
    },
    /// A token id outside the vocabulary.
    #[error("token id {token} is outside the vocabulary of {n_vocab}")]
    BadToken {
        /// The id.
        token: u32,
        /// The vocabulary size.
        n_vocab: usize,
    },
}
