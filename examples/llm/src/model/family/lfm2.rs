//! `lfm2` (Liquid LFM2 / LFM2.5, dense): a hybrid of attention layers and short-convolution
//! layers, each followed by a SiLU-gated feed-forward, as llama.cpp's `models/lfm2.cpp`.
//!
//! - Which layers are which: `lfm2.attention.head_count_kv` is an array of one count per
//!   layer, 0 on a short-convolution layer (every attention layer has the same count here).
//! - Attention layers: GQA with a per-head RMSNorm of the queries and keys before NeoX RoPE,
//!   scale `1/√head_dim`, no biases (`attn_q`, `attn_k`, `attn_v`, `attn_output`).
//! - Short-convolution layers: `shortconv.in_proj` (`n_embd → 3·n_embd`: B, C, x),
//!   `Bx = B ⊙ x`, a causal depthwise convolution over time of `lfm2.shortconv.l_cache` taps
//!   (`shortconv.conv`, GGUF dims `[l_cache, n_embd]`: each channel's taps contiguous, the
//!   last one on the current position; positions before 0 count as 0), `y = C ⊙ conv`,
//!   `shortconv.out_proj`. The sequence's cache keeps each such layer's `Bx` rows like keys
//!   (see [`KvCache`](crate::model::KvCache)).
//! - The final norm is `token_embd_norm.weight` (llama.cpp's name for it); the output is tied
//!   to the embedding when there is no `output.weight`.
//!
//! Refused, where llama.cpp would do something this code does not: a sliding window on the
//! attention layers (`lfm2.attention.sliding_window` > 0), non-causal attention (the
//! bidirectional embedding models), the ColBERT projection (`dense_2_out.weight`), and a kernel
//! of fewer than 2 taps (llama.cpp asserts it) or more than [`MAX_L_CACHE`].

use rknn_chip::Residual;

use crate::gguf::GgufFile;
use crate::model::config::{
    Activation, Config, Family, MAX_L_CACHE, QkNorm, RopeStyle, ShortConv, key_per_layer, key_usize,
};
use crate::model::error::ModelError;

pub(super) const FAMILY: Family = Family {
    name: "lfm2",
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
    if key_usize(file, "lfm2.attention.sliding_window")?.is_some_and(|w| w > 0) {
        return Err(ModelError::Unsupported {
            what: "lfm2 with a sliding window".into(),
        });
    }
    short_conv(file, c)
}

/// The hybrid's layers as lfm2 and lfm2moe share them (keys under the family's name): which
/// layers are short-convolution layers, their kernel, causal attention only, no ColBERT
/// projection, and the final norm's name.
pub(super) fn short_conv(file: &GgufFile, c: &mut Config) -> Result<(), ModelError> {
    let p = c.family.name;
    let key = format!("{p}.shortconv.l_cache");
    let l_cache = key_usize(file, &key)?.ok_or(ModelError::MissingKey { key: key.clone() })?;
    if !(2..=MAX_L_CACHE).contains(&l_cache) {
        return Err(ModelError::BadKey {
            key,
            reason: format!("{l_cache} taps: a kernel has 2 to {MAX_L_CACHE}"),
        });
    }
    // One flag per layer: a layer has tensors, so a block count beyond the file's tensors is
    // refused before it is allocated.
    if c.n_layer > file.tensor_infos().len() {
        return Err(ModelError::BadKey {
            key: format!("{p}.block_count"),
            reason: format!(
                "{} layers in a file of {} tensors",
                c.n_layer,
                file.tensor_infos().len()
            ),
        });
    }
    let kv = key_per_layer(file, &format!("{p}.attention.head_count_kv"), c.n_layer)?;
    let layers = match kv {
        Some(v) => v.iter().map(|&h| h == 0).collect(),
        None => vec![false; c.n_layer],
    };
    let key = format!("{p}.attention.causal");
    if let Some(v) = file.metadata().get(&key) {
        match v.as_bool() {
            Some(true) => {}
            Some(false) => {
                return Err(ModelError::Unsupported {
                    what: format!("{p} with non-causal attention"),
                });
            }
            None => {
                return Err(ModelError::BadKey {
                    key,
                    reason: format!("expected a boolean, found {v:?}"),
                });
            }
        }
    }
    if file.tensor("dense_2_out.weight").is_some() {
        return Err(ModelError::Unsupported {
            what: format!("tensor \"dense_2_out.weight\" in an {p} model"),
        });
    }
    c.short_conv = Some(ShortConv { l_cache, layers });
    c.output_norm = "token_embd_norm.weight";
    Ok(())
}
