//! `smollm3` (SmolLM3): llama's layers (adjacent-pair RoPE, no biases, SiLU-gated
//! feed-forward) except that every fourth layer (3, 7, 11, ...) applies no RoPE (NoPE): its
//! queries and keys attend by content alone. llama.cpp fixes the step at 4
//! (`n_no_rope_layer_step`; no GGUF key sets it) and asserts that RoPE covers the whole head.

use rknn_chip::Residual;

use crate::gguf::GgufFile;
use crate::model::config::{Activation, Config, Family, QkNorm, RopeStyle, rope_whole_head};
use crate::model::error::ModelError;

pub(super) const FAMILY: Family = Family {
    name: "smollm3",
    rope_style: RopeStyle::Adjacent,
    qkv_bias: false,
    optional_biases: false,
    qk_norm: QkNorm::None,
    post_norms: false,
    activation: Activation::Silu,
    fused_gate_up: false,
    scale_queries: false,
    w8a8_residual: Residual::OutputAndDown,
    hparams,
};

/// Layer `il` rotates unless `(il + 1) % NO_ROPE_LAYER_STEP == 0` (llama.cpp's smollm3 graph).
const NO_ROPE_LAYER_STEP: usize = 4;

fn hparams(_: &GgufFile, c: &mut Config) -> Result<(), ModelError> {
    rope_whole_head(c)?;
    c.no_rope_step = Some(NO_ROPE_LAYER_STEP);
    Ok(())
}
