//! The architectures the forward pass runs, as data: one [`Family`] per architecture, each in
//! its own small file, listed in [`FAMILIES`].
//!
//! A family says which of the shared building blocks its layers use (RoPE pairing, Q/K biases,
//! per-head Q/K norms, post-norms, the gated feed-forward's activation, how its tensors are
//! fused) and reads its own metadata keys in [`Family::hparams`] (a sliding window, an
//! attention scale, the layers without RoPE, a refusal of what the code does not implement).
//! Adding the next family is one file here and one line in [`FAMILIES`]; the weight matmuls
//! still go through the one seam, so the NPU path needs nothing per family beyond shapes.

mod gemma2;
mod gemma3;
mod granite;
mod granitemoe;
mod lfm2;
mod lfm2moe;
mod llama;
mod olmoe;
mod phi3;
mod qwen2;
mod qwen3;
mod qwen35;
mod qwen3moe;
mod smollm3;

use super::config::{Config, Family, key_f32, key_per_layer, key_usize};
use super::error::ModelError;
use crate::gguf::{GgufFile, Value};

/// Every family this crate runs, by `general.architecture`.
pub const FAMILIES: &[&Family] = &[
    &llama::FAMILY,
    &qwen2::FAMILY,
    &qwen3::FAMILY,
    &gemma3::FAMILY,
    &phi3::FAMILY,
    &smollm3::FAMILY,
    &granite::FAMILY,
    &gemma2::FAMILY,
    &qwen3moe::FAMILY,
    &olmoe::FAMILY,
    &lfm2::FAMILY,
    &granitemoe::FAMILY,
    &lfm2moe::FAMILY,
    &qwen35::FAMILY,
];

/// The family named `arch`, if this crate runs it.
pub fn family(arch: &str) -> Option<&'static Family> {
    FAMILIES.iter().copied().find(|f| f.name == arch)
}

/// The names of every family, comma-separated (for error messages).
pub fn supported() -> String {
    FAMILIES
        .iter()
        .map(|f| f.name)
        .collect::<Vec<_>>()
        .join(", ")
}

impl Config {
    /// Reads the configuration of the file's architecture.
    pub fn from_gguf(file: &GgufFile) -> Result<Self, ModelError> {
        let arch_name = file
            .metadata()
            .get_str("general.architecture")
            .ok_or_else(|| ModelError::MissingKey {
                key: "general.architecture".into(),
            })?;
        let fam = family(arch_name).ok_or_else(|| ModelError::UnsupportedArchitecture {
            arch: arch_name.into(),
            supported: supported(),
        })?;
        let p = fam.name;
        let req = |k: &str| -> Result<usize, ModelError> {
            let key = format!("{p}.{k}");
            key_usize(file, &key)?.ok_or(ModelError::MissingKey { key })
        };
        let n_embd = req("embedding_length")?;
        let n_layer = req("block_count")?;
        let n_ff = req("feed_forward_length")?;
        let n_head = req("attention.head_count")?;
        let n_ctx = req("context_length")?;
        let bad = |k: &str, reason: String| ModelError::BadKey {
            key: format!("{p}.{k}"),
            reason,
        };
        if n_head == 0 || n_embd == 0 || n_layer == 0 || n_ff == 0 {
            return Err(bad(
                "*",
                format!(
                    "zero size: embedding {n_embd}, layers {n_layer}, heads {n_head}, feed-forward {n_ff}"
                ),
            ));
        }
        // One count for every layer, or one per layer (LFM2, LFM2-MoE: 0 on its short-convolution
        // layers, the same count on every attention layer).
        let kv_key = format!("{p}.attention.head_count_kv");
        let kv_per_layer = match file.metadata().get(&kv_key) {
            Some(Value::Array(_)) => key_per_layer(file, &kv_key, n_layer)?,
            _ => None,
        };
        let n_head_kv = match &kv_per_layer {
            Some(v) => {
                let mut attn = v.iter().copied().filter(|&h| h != 0);
                let first = attn.next().unwrap_or(n_head);
                if let Some(other) = attn.find(|&h| h != first) {
                    return Err(ModelError::Unsupported {
                        what: format!("attention layers of {first} and of {other} KV heads"),
                    });
                }
                first
            }
            None => key_usize(file, &kv_key)?.unwrap_or(n_head),
        };
        if n_head_kv == 0 || n_head % n_head_kv != 0 {
            return Err(bad(
                "attention.head_count_kv",
                format!("{n_head_kv} does not divide the {n_head} query heads"),
            ));
        }
        let head_dim = match key_usize(file, &format!("{p}.attention.key_length"))? {
            Some(d) => d,
            None if n_embd % n_head == 0 => n_embd / n_head,
            None => {
                return Err(bad(
                    "attention.head_count",
                    format!("{n_head} heads do not divide the embedding width {n_embd}"),
                ));
            }
        };
        // The widths of Q and of K/V are computed from these everywhere: they must exist.
        for (what, heads) in [("head_count", n_head), ("head_count_kv", n_head_kv)] {
            if heads.checked_mul(head_dim).is_none() {
                return Err(bad(
                    &format!("attention.{what}"),
                    format!("{heads} heads of {head_dim} dimensions overflow"),
                ));
            }
        }
        if let Some(v) = key_usize(file, &format!("{p}.attention.value_length"))? {
            if v != head_dim {
                return Err(ModelError::Unsupported {
                    what: format!("value head size {v} differs from key head size {head_dim}"),
                });
            }
        }
        let n_rot = key_usize(file, &format!("{p}.rope.dimension_count"))?.unwrap_or(head_dim);
        if n_rot > head_dim || n_rot % 2 != 0 || head_dim == 0 {
            return Err(bad(
                "rope.dimension_count",
                format!("{n_rot} rotated dimensions in heads of {head_dim}"),
            ));
        }
        let rms_eps =
            key_f32(file, &format!("{p}.attention.layer_norm_rms_epsilon"))?.ok_or_else(|| {
                ModelError::MissingKey {
                    key: format!("{p}.attention.layer_norm_rms_epsilon"),
                }
            })?;
        let rope_base = key_f32(file, &format!("{p}.rope.freq_base"))?.unwrap_or(10000.0);
        let mut rope_freq_scale = 1.0f32;
        if let Some(kind) = file.metadata().get_str(&format!("{p}.rope.scaling.type")) {
            match kind {
                "none" => {}
                "linear" => {
                    let f = key_f32(file, &format!("{p}.rope.scaling.factor"))?.unwrap_or(1.0);
                    if f.is_nan() || f <= 0.0 {
                        return Err(bad("rope.scaling.factor", format!("{f} is not positive")));
                    }
                    rope_freq_scale = 1.0 / f;
                }
                other => {
                    return Err(ModelError::Unsupported {
                        what: format!("RoPE scaling {other:?}"),
                    });
                }
            }
        }
        let rope_attn_factor =
            key_f32(file, &format!("{p}.rope.scaling.attn_factor"))?.unwrap_or(1.0);
        if !rope_attn_factor.is_finite() {
            return Err(bad(
                "rope.scaling.attn_factor",
                format!("{rope_attn_factor} is not finite"),
            ));
        }
        let n_vocab = match key_usize(file, &format!("{p}.vocab_size"))? {
            Some(v) => v,
            None => {
                let emb = file
                    .tensor("token_embd.weight")
                    .ok_or(ModelError::MissingTensor {
                        name: "token_embd.weight".into(),
                    })?;
                usize::try_from(emb.dims().get(1).copied().unwrap_or(0)).unwrap_or(0)
            }
        };
        let mut c = Config {
            family: fam,
            n_vocab,
            n_embd,
            n_layer,
            n_head,
            n_head_kv,
            head_dim,
            n_ff,
            n_ctx,
            rms_eps,
            rope_base,
            rope_freq_scale,
            n_rot,
            rope_attn_factor,
            long_rope: None,
            rope_style: fam.rope_style,
            attn_scale: 1.0 / (head_dim as f32).sqrt(),
            embd_scale: None,
            residual_scale: None,
            sliding_window: None,
            attn_softcap: None,
            final_logit_softcap: None,
            logit_scale: None,
            no_rope_step: None,
            pooling_type: None,
            moe: None,
            short_conv: None,
            delta_net: None,
            gated_attention: false,
            ffn_norm: "ffn_norm.weight",
            output_norm: "output_norm.weight",
        };
        c.pooling_type = key_usize(file, &format!("{p}.pooling_type"))?.map(|t| t as u64);
        (fam.hparams)(file, &mut c)?;
        // A layer without KV heads is a short-convolution layer, and only that.
        if let Some(v) = &kv_per_layer {
            if let Some(l) = (0..n_layer).find(|&l| (v[l] == 0) != c.conv(l).is_some()) {
                return Err(bad(
                    "attention.head_count_kv",
                    format!(
                        "{} KV heads on layer {l}, {}",
                        v[l],
                        match c.conv(l) {
                            Some(_) => "a short-convolution layer",
                            None => "an attention layer",
                        }
                    ),
                ));
            }
        }
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_family_has_a_distinct_name_that_finds_it() {
        for f in FAMILIES {
            assert_eq!(family(f.name), Some(*f));
        }
        assert_eq!(family("gpt2"), None);
        assert_eq!(
            supported(),
            "llama, qwen2, qwen3, gemma3, phi3, smollm3, granite, gemma2, qwen3moe, olmoe, lfm2, granitemoe, lfm2moe, qwen35"
        );
    }
}
