//! `gemma3` (Gemma 3 text models): the embedding scaled by √n_embd; RMSNorms before and after
//! attention and the feed-forward; per-head Q/K norms; GELU-gated feed-forward; NeoX RoPE;
//! interleaved sliding-window layers (five local, one global by default) with their own RoPE
//! base; the queries scaled by `1/√head_size` before the scores (`1/√(n_embd/n_head)` on the
//! 62-layer 27B, as llama.cpp and gemma_pytorch set it); optional final-logit soft-capping.
//! The GGUF norm weights already include Gemma's `1 +`. On the NPU path every linear quantises
//! its activations twice by default.

use rknn_chip::Residual;

use crate::gguf::GgufFile;
use crate::model::config::{
    Activation, Config, Family, QkNorm, RopeStyle, key_f32, sliding_window,
};
use crate::model::error::ModelError;

pub(super) const FAMILY: Family = Family {
    name: "gemma3",
    rope_style: RopeStyle::Halves,
    qkv_bias: false,
    optional_biases: false,
    qk_norm: QkNorm::PerHead,
    post_norms: true,
    activation: Activation::GeluTanh,
    fused_gate_up: false,
    scale_queries: true,
    // Gemma-3-270M: top-1 agreement 95.6 % with the output head and down projections, 96.4 %
    // with every linear (the first 1024 tokens of the English text).
    w8a8_residual: Residual::All,
    hparams,
};

fn hparams(file: &GgufFile, c: &mut Config) -> Result<(), ModelError> {
    c.sliding_window = sliding_window(file, c, None, 6, (10_000.0, 1.0))?;
    c.embd_scale = Some((c.n_embd as f32).sqrt());
    c.attn_scale = if c.n_layer == 62 {
        1.0 / ((c.n_embd / c.n_head) as f32).sqrt()
    } else {
        1.0 / (c.head_dim as f32).sqrt()
    };
    c.final_logit_softcap =
        key_f32(file, "gemma3.final_logit_softcapping")?.filter(|&cap| cap != 0.0);
    Ok(())
}
