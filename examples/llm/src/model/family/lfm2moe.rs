//! `lfm2moe` (Liquid LFM2-8B-A1B, LFM2-24B-A2B): lfm2's hybrid of short-convolution and
//! attention layers (see [`super::lfm2`]) whose feed-forward is, after
//! `lfm2moe.leading_dense_block_count` dense layers, a mixture of experts, as llama.cpp builds
//! it (lfm2's graph, `build_moe_ffn`):
//!
//! - the leading dense layers: SiLU-gated, of `lfm2moe.feed_forward_length` (`ffn_gate`,
//!   `ffn_up`, `ffn_down`);
//! - the other layers: the router's logits through `lfm2moe.expert_gating_func` (the
//!   converter writes 2, a sigmoid per expert; 1, a softmax, is run too), the top
//!   `lfm2moe.expert_used_count` chosen by probability plus the layer's selection bias
//!   (`exp_probs_b.bias`, `n_expert` values, required), each weighted by its probability
//!   without the bias, the weights divided by their sum (llama.cpp passes `norm_w = true` for
//!   lfm2moe whatever the file says: `expert_weights_norm` is not read, nor is
//!   `expert_weights_scale`, so both are ignored here too), SiLU-gated experts of
//!   `lfm2moe.expert_feed_forward_length`;
//! - `expert_feed_forward_length` may be one width per layer: llama.cpp reads such an array
//!   but shapes every layer's experts by its first entry, so the first entry is the width and
//!   an array whose mixture layers say otherwise is refused.
//!
//! llama.cpp reads no sliding window for lfm2moe: a file's `lfm2moe.attention.sliding_window`
//! is ignored, as it ignores it. Refused: the gating functions llama.cpp has that this code
//! does not (3, a softmax over the chosen experts' logits; 4, `√softplus`), and what lfm2
//! refuses (non-causal attention, the ColBERT projection).

use rknn_chip::Residual;

use crate::gguf::{GgufFile, Value};
use crate::model::config::{
    Activation, Config, Family, Gating, QkNorm, RopeStyle, key_per_layer, key_usize, moe,
};
use crate::model::error::ModelError;

pub(super) const FAMILY: Family = Family {
    name: "lfm2moe",
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
    super::lfm2::short_conv(file, c)?;
    let key = "lfm2moe.leading_dense_block_count";
    let n_dense_lead = key_usize(file, key)?.unwrap_or(0);
    if n_dense_lead > c.n_layer {
        return Err(ModelError::BadKey {
            key: key.into(),
            reason: format!("{n_dense_lead} dense layers of {}", c.n_layer),
        });
    }
    let key = "lfm2moe.expert_feed_forward_length";
    let n_ff_exp = match file.metadata().get(key) {
        None => return Err(ModelError::MissingKey { key: key.into() }),
        Some(Value::Array(_)) => {
            let widths = key_per_layer(file, key, c.n_layer)?.unwrap_or_default();
            let first = widths.first().copied().unwrap_or(0);
            if let Some(l) = (n_dense_lead..c.n_layer).find(|&l| widths[l] != first) {
                return Err(ModelError::BadKey {
                    key: key.into(),
                    reason: format!(
                        "{} on layer {l}: llama.cpp shapes every layer's experts by the first \
                         entry, {first}",
                        widths[l]
                    ),
                });
            }
            first
        }
        Some(_) => key_usize(file, key)?.unwrap_or(0),
    };
    let key = "lfm2moe.expert_gating_func";
    let gating = match key_usize(file, key)? {
        None => return Err(ModelError::MissingKey { key: key.into() }),
        Some(1) => Gating::Softmax,
        Some(2) => Gating::Sigmoid,
        Some(f @ (3 | 4)) => {
            return Err(ModelError::Unsupported {
                what: format!(
                    "{key} {f} ({})",
                    if f == 3 {
                        "softmax_weight"
                    } else {
                        "sqrt_softplus"
                    }
                ),
            });
        }
        Some(f) => {
            return Err(ModelError::BadKey {
                key: key.into(),
                reason: format!("{f}: 1 (softmax) or 2 (sigmoid) are supported"),
            });
        }
    };
    moe(file, c, n_ff_exp, true)?;
    if let Some(m) = c.moe.as_mut() {
        m.gating = gating;
        m.selection_bias = true;
        m.n_dense_lead = n_dense_lead;
    }
    Ok(())
}
