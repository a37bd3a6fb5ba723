//! What can be wrong with a GGUF file.

use std::path::PathBuf;

use super::types::GgmlType;
use super::value::MAX_ARRAY_DEPTH;

/// What went wrong reading a GGUF file.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GgufError {
    /// The file could not be opened or mapped.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The path given.
        path: PathBuf,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// The file does not start with `GGUF`.
    #[error("not a GGUF file: magic is {found:02x?}, expected \"GGUF\"")]
    BadMagic {
        /// The first four bytes (fewer if the file is shorter).
        found: Vec<u8>,
    },
    /// A version this reader does not handle (1 used 32-bit counts; big-endian files read as
    /// a huge version).
    #[error("unsupported GGUF version {version} (supported: 2, 3{hint})")]
    UnsupportedVersion {
        /// The version field.
        version: u32,
        /// A hint for byte-swapped (big-endian) files.
        hint: &'static str,
    },
    /// The file ends inside a field.
    #[error(
        "file truncated reading {what} at byte {offset}: need {needed} bytes, {remaining} left"
    )]
    Truncated {
        /// The field being read.
        what: String,
        /// Its offset in the file.
        offset: u64,
        /// Bytes the field needs.
        needed: u64,
        /// Bytes left in the file.
        remaining: u64,
    },
    /// A count (entries, tensors, array elements) that the rest of the file cannot hold.
    #[error(
        "{what}: count {count} cannot fit in the {remaining} bytes left at byte {offset} (at least {min_size} bytes each)"
    )]
    CountTooLarge {
        /// What is being counted.
        what: String,
        /// The count read.
        count: u64,
        /// Minimum bytes per item.
        min_size: u64,
        /// Offset of the count's first item.
        offset: u64,
        /// Bytes left.
        remaining: u64,
    },
    /// A metadata type tag outside 0..=12.
    #[error("{what}: unknown metadata value type {tag}")]
    UnknownValueType {
        /// The key or array holding it.
        what: String,
        /// The tag read.
        tag: u32,
    },
    /// A string that is not UTF-8.
    #[error("{what}: string at byte {offset} is not valid UTF-8")]
    InvalidUtf8 {
        /// The key or tensor it belongs to.
        what: String,
        /// Offset of the string's bytes.
        offset: u64,
    },
    /// A bool byte other than 0 or 1.
    #[error("{what}: bool byte is {byte}, expected 0 or 1")]
    InvalidBool {
        /// The key holding it.
        what: String,
        /// The byte read.
        byte: u8,
    },
    /// Arrays nested deeper than this reader accepts.
    #[error("{what}: arrays nested more than {MAX_ARRAY_DEPTH} deep")]
    ArrayTooDeep {
        /// The key holding the array.
        what: String,
    },
    /// A metadata key present twice.
    #[error("duplicate metadata key {key:?}")]
    DuplicateKey {
        /// The key.
        key: String,
    },
    /// A metadata value of the wrong type for a key this reader interprets.
    #[error("metadata {key:?} has type {found}, expected {expected}")]
    WrongValueType {
        /// The key.
        key: String,
        /// What it must be.
        expected: &'static str,
        /// What it is.
        found: &'static str,
    },
    /// `general.alignment` not a positive power of two.
    #[error("general.alignment is {value}, must be a power of two")]
    BadAlignment {
        /// The value.
        value: u64,
    },
    /// A tensor name present twice.
    #[error("duplicate tensor name {name:?}")]
    DuplicateTensor {
        /// The name.
        name: String,
    },
    /// A tensor type id this reader does not know.
    #[error("tensor {tensor:?}: unknown ggml type {type_id}")]
    UnknownTensorType {
        /// The tensor.
        tensor: String,
        /// The id read.
        type_id: u32,
    },
    /// A bad tensor shape: too many dimensions, a dimension out of range, a row that is not
    /// whole blocks, or an element/byte count that overflows.
    #[error("tensor {tensor:?}: {reason}")]
    BadShape {
        /// The tensor.
        tensor: String,
        /// The rule broken, with the values.
        reason: String,
    },
    /// A tensor offset not a multiple of the alignment.
    #[error("tensor {tensor:?}: offset {offset} is not a multiple of the alignment {alignment}")]
    MisalignedTensor {
        /// The tensor.
        tensor: String,
        /// Its offset in the data section.
        offset: u64,
        /// The file's alignment.
        alignment: u64,
    },
    /// A tensor whose bytes extend past the end of the file.
    #[error(
        "tensor {tensor:?}: bytes {offset}..{offset}+{size} of the data section run past its end ({data_len} bytes)"
    )]
    TensorOutOfBounds {
        /// The tensor.
        tensor: String,
        /// Its offset in the data section.
        offset: u64,
        /// Its size in bytes.
        size: u64,
        /// Bytes in the data section.
        data_len: u64,
    },
    /// Dequantization of a type this crate does not convert.
    #[error("dequantization of {ty} is not supported")]
    UnsupportedType {
        /// The type.
        ty: GgmlType,
    },
    /// Dequantization buffers of inconsistent sizes.
    #[error("dequantizing {ty}: {reason}")]
    BadLength {
        /// The type.
        ty: GgmlType,
        /// The sizes that disagree.
        reason: String,
    },
}
