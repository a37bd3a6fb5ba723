//! `granite` (IBM Granite 3.x dense): llama's layers (adjacent-pair RoPE, SiLU-gated
//! feed-forward) with four scalars, as llama.cpp reads them:
//!
//! - `granite.embedding_scale` multiplies the embedding rows;
//! - `granite.attention.scale` replaces `1/√head_dim` as the attention scale;
//! - `granite.residual_scale` multiplies the attention's and the feed-forward's outputs before
//!   their residual adds;
//! - `granite.logit_scale` (required) divides the logits (a multiplication by its f32
//!   reciprocal, as ggml).
//!
//! The three optional ones are off when absent or 0, as in llama.cpp. A
//! `granite.rope.scaling.finetuned` of false turns RoPE off on every layer (llama.cpp's switch).
//! Biases on the attention output or the feed-forward, which llama.cpp would add, are refused.

use rknn_chip::Residual;

use crate::gguf::GgufFile;
use crate::model::config::{
    Activation, Config, Family, QkNorm, RopeStyle, key_f32, rope_whole_head,
};
use crate::model::error::ModelError;

pub(super) const FAMILY: Family = Family {
    name: "granite",
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

fn hparams(file: &GgufFile, c: &mut Config) -> Result<(), ModelError> {
    rope_whole_head(c)?;
    scalars(file, c)?;
    let key = "granite.rope.scaling.finetuned";
    if let Some(v) = file.metadata().get(key) {
        match v.as_bool() {
            Some(true) => {}
            Some(false) => c.no_rope_step = Some(1),
            None => {
                return Err(ModelError::BadKey {
                    key: key.into(),
                    reason: format!("expected a boolean, found {v:?}"),
                });
            }
        }
    }
    for part in ["attn_output", "ffn_gate", "ffn_up", "ffn_down"] {
        let name = format!("blk.0.{part}.bias");
        if file.tensor(&name).is_some() {
            return Err(ModelError::Unsupported {
                what: format!("tensor {name:?} in a granite model"),
            });
        }
    }
    Ok(())
}

/// Reads the four scalars of the module documentation, under the family's prefix
/// (`granite.*`, `granitemoe.*`), into `c`.
pub(super) fn scalars(file: &GgufFile, c: &mut Config) -> Result<(), ModelError> {
    let p = c.family.name;
    let key = format!("{p}.logit_scale");
    let logit_scale =
        key_f32(file, &key)?.ok_or_else(|| ModelError::MissingKey { key: key.clone() })?;
    if logit_scale == 0.0 || !logit_scale.is_finite() {
        return Err(ModelError::BadKey {
            key,
            reason: format!("{logit_scale}: the logits are divided by it"),
        });
    }
    c.logit_scale = Some(logit_scale);
    c.embd_scale = multiplier(file, &format!("{p}.embedding_scale"))?;
    c.residual_scale = multiplier(file, &format!("{p}.residual_scale"))?;
    if let Some(s) = multiplier(file, &format!("{p}.attention.scale"))? {
        c.attn_scale = s;
    }
    Ok(())
}

/// An optional multiplier: `None` when absent or 0 (llama.cpp skips a zero scale), refused
/// when not finite.
fn multiplier(file: &GgufFile, key: &str) -> Result<Option<f32>, ModelError> {
    match key_f32(file, key)? {
        None | Some(0.0) => Ok(None),
        Some(v) if v.is_finite() => Ok(Some(v)),
        Some(v) => Err(ModelError::BadKey {
            key: key.into(),
            reason: format!("{v} is not finite"),
        }),
    }
}
