//! Dequantization of ggml block formats to f32 (placeholder until the block decoders land).

use super::{GgmlType, GgufError};

/// Converts `src`, whole blocks of type `ty`, to `dst.len()` f32 values.
pub fn dequantize(ty: GgmlType, src: &[u8], dst: &mut [f32]) -> Result<(), GgufError> {
    let _ = (src, dst);
    Err(GgufError::UnsupportedType { ty })
}

/// Bytes of `n` values of `ty`, or `None` when `n` is not whole blocks.
pub fn dequantize_row_bytes(ty: GgmlType, n: usize) -> Option<usize> {
    ty.bytes_for(n as u64).and_then(|b| usize::try_from(b).ok())
}
