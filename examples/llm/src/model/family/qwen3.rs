//! `qwen3` (Qwen3 dense): per-head RMSNorm of Q and K before RoPE, no biases, NeoX RoPE; the
//! head size comes from `qwen3.attention.key_length` (128 for every size, whatever
//! `n_embd / n_head` is).

use rknn_chip::Residual;

use crate::gguf::GgufFile;
use crate::model::config::{Activation, Config, Family, QkNorm, RopeStyle, rope_whole_head};
use crate::model::error::ModelError;

pub(super) const FAMILY: Family = Family {
    name: "qwen3",
    rope_style: RopeStyle::Halves,
    qkv_bias: false,
    optional_biases: false,
    qk_norm: QkNorm::PerHead,
    post_norms: false,
    activation: Activation::Silu,
    fused_gate_up: false,
    scale_queries: false,
    w8a8_residual: Residual::OutputAndDown,
    hparams,
};

/// llama.cpp rotates the whole head (it asserts `n_rot == head size`).
fn hparams(_: &GgufFile, c: &mut Config) -> Result<(), ModelError> {
    rope_whole_head(c)
}
