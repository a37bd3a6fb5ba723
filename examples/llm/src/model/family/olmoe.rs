//! `olmoe` (AllenAI OLMoE): llama-style attention whose Q and K are RMS-normalised over the
//! whole projection (all heads at once, weights of `n_embd`) before NeoX RoPE, and a mixture
//! of experts for the feed-forward, as llama.cpp's graph builds it: softmax over the router's
//! logits, the top `olmoe.expert_used_count` weighted by their probabilities as they are (no
//! renormalisation), SiLU-gated experts of `olmoe.feed_forward_length`.

use rknn_chip::Residual;

use crate::gguf::GgufFile;
use crate::model::config::{Activation, Config, Family, QkNorm, RopeStyle, moe, rope_whole_head};
use crate::model::error::ModelError;

pub(super) const FAMILY: Family = Family {
    name: "olmoe",
    rope_style: RopeStyle::Halves,
    qkv_bias: false,
    optional_biases: false,
    qk_norm: QkNorm::Whole,
    post_norms: false,
    activation: Activation::Silu,
    fused_gate_up: false,
    scale_queries: false,
    w8a8_residual: Residual::OutputAndDown,
    hparams,
};

fn hparams(file: &GgufFile, c: &mut Config) -> Result<(), ModelError> {
    rope_whole_head(c)?;
    moe(file, c, c.n_ff, false)
}
