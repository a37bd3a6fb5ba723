//! `gemma2` (Gemma 2): Gemma 3's layers without the per-head Q/K norms, and with soft-capping.
//! The embedding scaled by √n_embd; RMSNorms before and after attention and the feed-forward;
//! GELU-gated feed-forward; NeoX RoPE; the queries scaled by `1/√head_size` before the scores
//! (`1/√(n_embd/n_head)` on the 46-layer 27B, as llama.cpp derives gemma_pytorch's
//! `query_pre_attn_scalar`); the attention scores soft-capped (`attn_logit_softcapping`, 50
//! by default) and the logits too (`final_logit_softcapping`, 30 by default). Every other
//! layer is local, from the first (`sliding_window_pattern` 2 by default), with a window of
//! `sliding_window` positions (4096 by default) and the global layers' RoPE unless
//! `rope.freq_base_swa` is set. The output is the embedding: a file with an `output.weight`
//! is refused, as llama.cpp refuses it. On the NPU path every linear quantises its activations
//! twice by default, as for Gemma 3 (not measured on a Gemma 2 model).

use rknn_chip::Residual;

use crate::gguf::GgufFile;
use crate::model::config::{
    Activation, Config, Family, QkNorm, RopeStyle, key_f32, key_usize, sliding_window,
};
use crate::model::error::ModelError;

pub(super) const FAMILY: Family = Family {
    name: "gemma2",
    rope_style: RopeStyle::Halves,
    qkv_bias: false,
    optional_biases: false,
    qk_norm: QkNorm::None,
    post_norms: true,
    activation: Activation::GeluTanh,
    fused_gate_up: false,
    scale_queries: true,
    w8a8_residual: Residual::All,
    hparams,
};

fn hparams(file: &GgufFile, c: &mut Config) -> Result<(), ModelError> {
    if file.tensor("output.weight").is_some() {
        return Err(ModelError::Unsupported {
            what: "tensor \"output.weight\" in a gemma2 model (its output is the embedding)".into(),
        });
    }
    c.attn_softcap = Some(softcap(file, "gemma2.attn_logit_softcapping", 50.0)?);
    c.final_logit_softcap = Some(softcap(file, "gemma2.final_logit_softcapping", 30.0)?);
    let key = "gemma2.attention.sliding_window";
    if key_usize(file, key)? == Some(0) {
        return Err(ModelError::BadKey {
            key: key.into(),
            reason: "0 positions: a local layer's queries would see no key".into(),
        });
    }
    c.sliding_window = sliding_window(file, c, Some(4096), 2, (c.rope_base, c.rope_freq_scale))?;
    c.embd_scale = Some((c.n_embd as f32).sqrt());
    c.attn_scale = if c.n_layer == 46 {
        1.0 / ((c.n_embd / c.n_head) as f32).sqrt()
    } else {
        1.0 / (c.head_dim as f32).sqrt()
    };
    Ok(())
}

/// A soft-cap, `default` when absent; it divides, so it must be positive and finite.
fn softcap(file: &GgufFile, key: &str, default: f32) -> Result<f32, ModelError> {
    match key_f32(file, key)?.unwrap_or(default) {
        cap if cap > 0.0 && cap.is_finite() => Ok(cap),
        cap => Err(ModelError::BadKey {
            key: key.into(),
            reason: format!("{cap}: a soft-cap must be positive and finite"),
        }),
    }
}
