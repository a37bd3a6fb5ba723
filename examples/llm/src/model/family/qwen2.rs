//! `qwen2` (Qwen2, Qwen2.5): Q/K/V biases, RoPE on the two halves of each head (NeoX).

use rknn_chip::Residual;

use crate::model::config::{Activation, Family, QkNorm, RopeStyle, no_hparams};

pub(super) const FAMILY: Family = Family {
    name: "qwen2",
    rope_style: RopeStyle::Halves,
    qkv_bias: true,
    optional_biases: false,
    qk_norm: QkNorm::None,
    post_norms: false,
    activation: Activation::Silu,
    fused_gate_up: false,
    scale_queries: false,
    w8a8_residual: Residual::OutputAndDown,
    hparams: no_hparams,
};
