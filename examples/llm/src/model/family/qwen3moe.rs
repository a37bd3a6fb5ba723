//! `qwen3moe` (Qwen3 mixture of experts, 30B-A3B, 235B-A22B): qwen3's attention (per-head
//! Q/K RMSNorms, NeoX RoPE, no biases) with a mixture of experts for the feed-forward, as
//! llama.cpp's graph builds it: softmax over the router's logits, the top
//! `qwen3moe.expert_used_count`, their weights divided by their sum (`norm_w`), SiLU-gated
//! experts of `qwen3moe.expert_feed_forward_length` (`n_ff / n_expert_used` when absent).

use rknn_chip::Residual;

use crate::gguf::GgufFile;
use crate::model::config::{
    Activation, Config, Family, QkNorm, RopeStyle, key_usize, moe, rope_whole_head,
};
use crate::model::error::ModelError;

pub(super) const FAMILY: Family = Family {
    name: "qwen3moe",
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

fn hparams(file: &GgufFile, c: &mut Config) -> Result<(), ModelError> {
    rope_whole_head(c)?;
    let n_ff_exp = match key_usize(file, "qwen3moe.expert_feed_forward_length")? {
        Some(n) => n,
        // llama.cpp's fallback; the used count is checked non-zero by `moe` (0 gives 0 here,
        // refused there).
        None => key_usize(file, "qwen3moe.expert_used_count")?
            .filter(|&k| k > 0)
            .map_or(0, |k| c.n_ff / k),
    };
    moe(file, c, n_ff_exp, true)
}
