//! `llama` (Llama 1–3, SmolLM2, TinyLlama, Mistral): GGUF files permute Q and K to rotate
//! adjacent pairs; SiLU-gated feed-forward. Biases are optional, as in llama.cpp's llama graph:
//! `attn_q.bias`, `attn_k.bias`, `attn_v.bias`, `attn_output.bias`, `ffn_gate.bias`,
//! `ffn_up.bias` and `ffn_down.bias` are each added after their linear when the file has them
//! (most llama files have none).

use rknn_chip::Residual;

use crate::model::config::{Activation, Family, QkNorm, RopeStyle, no_hparams};

pub(super) const FAMILY: Family = Family {
    name: "llama",
    rope_style: RopeStyle::Adjacent,
    qkv_bias: false,
    optional_biases: true,
    qk_norm: QkNorm::None,
    post_norms: false,
    activation: Activation::Silu,
    fused_gate_up: false,
    scale_queries: false,
    w8a8_residual: Residual::OutputAndDown,
    hparams: no_hparams,
};
