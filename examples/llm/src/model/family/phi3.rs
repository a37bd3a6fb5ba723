//! `phi3` (Phi-3, Phi-3.5, Phi-4-mini): Q, K and V in one `attn_qkv` tensor (or three), gate
//! and up in one double-width `ffn_up`, NeoX RoPE, the queries scaled before the scores.
//!
//! `phi3.attention.sliding_window`, where a file sets it, is read and not applied: llama.cpp
//! disables Phi's sliding window (its converters do not record which layers use it), and this
//! crate computes what llama.cpp computes. Long-context RoPE (`longrope`, the
//! `rope_factors_long/short` tensors of the 128k models) is refused by name.

use rknn_chip::Residual;

use crate::gguf::GgufFile;
use crate::model::config::{Activation, Config, Family, QkNorm, RopeStyle};
use crate::model::error::ModelError;

pub(super) const FAMILY: Family = Family {
    name: "phi3",
    rope_style: RopeStyle::Halves,
    qkv_bias: false,
    qk_norm: QkNorm::None,
    post_norms: false,
    activation: Activation::Silu,
    fused_gate_up: true,
    scale_queries: true,
    w8a8_residual: Residual::OutputAndDown,
    hparams,
};

fn hparams(file: &GgufFile, _: &mut Config) -> Result<(), ModelError> {
    for name in ["rope_factors_long.weight", "rope_factors_short.weight"] {
        if file.tensor(name).is_some() {
            return Err(ModelError::Unsupported {
                what: format!("RoPE scaling \"longrope\" (tensor {name:?})"),
            });
        }
    }
    Ok(())
}
