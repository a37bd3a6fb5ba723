//! `llama` (Llama 1–3, SmolLM2, TinyLlama, Mistral): GGUF files permute Q and K to rotate
//! adjacent pairs; no biases, SiLU-gated feed-forward.

use rknn_chip::Residual;

use crate::model::config::{Activation, Family, QkNorm, RopeStyle, no_hparams};

pub(super) const FAMILY: Family = Family {
    name: "llama",
    rope_style: RopeStyle::Adjacent,
    qkv_bias: false,
    qk_norm: QkNorm::None,
    post_norms: false,
    activation: Activation::Silu,
    fused_gate_up: false,
    scale_queries: false,
    w8a8_residual: Residual::OutputAndDown,
    hparams: no_hparams,
};
