//! A model's hyper-parameters, read from the GGUF metadata: the keys every family shares here,
//! each family's own in its file under [`super::family`].

use super::error::ModelError;
use super::family::{self, Family};
use crate::gguf::{GgufFile, Value};

/// How RoPE pairs the dimensions of a head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeStyle {
    /// Dimensions `2i` and `2i + 1` (GGUF llama files; their Q/K weights are permuted to it).
    Adjacent,
    /// Dimensions `i` and `i + n_rot/2` (NeoX, qwen2).
    Halves,
}

/// Sliding-window attention on some layers (Gemma 3's local layers).
#[derive(Debug, Clone, PartialEq)]
pub struct SlidingWindow {
    /// Positions a query sees, itself included: the key at position `p0` is visible from the
    /// query at `p1` when `p1 - p0 < window`.
    pub window: usize,
    /// Per layer: whether it is local (windowed); the others attend to every position.
    pub layers: Vec<bool>,
    /// The local layers' RoPE base.
    pub rope_base: f32,
    /// The local layers' RoPE position scale.
    pub rope_freq_scale: f32,
}

/// Model hyper-parameters, read from the GGUF metadata.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// The architecture's rules.
    pub family: &'static Family,
    /// Vocabulary size (rows of the embedding).
    pub n_vocab: usize,
    /// Width of the residual stream.
    pub n_embd: usize,
    /// Transformer blocks.
    pub n_layer: usize,
    /// Query heads.
    pub n_head: usize,
    /// Key/value heads (grouped-query attention when fewer than `n_head`).
    pub n_head_kv: usize,
    /// Dimensions of one head.
    pub head_dim: usize,
    /// Hidden width of the feed-forward network.
    pub n_ff: usize,
    /// Context length the model was trained for; the KV cache's limit.
    pub n_ctx: usize,
    /// RMSNorm epsilon.
    pub rms_eps: f32,
    /// RoPE base frequency.
    pub rope_base: f32,
    /// RoPE position scale (1 / linear scaling factor).
    pub rope_freq_scale: f32,
    /// Leading dimensions of each head that RoPE rotates.
    pub n_rot: usize,
    /// The RoPE pairing.
    pub rope_style: RopeStyle,
    /// The attention scale (`1/√head_dim` unless the family sets another), applied to the
    /// scores inside the softmax, or to the queries when the family says so
    /// ([`Family::scale_queries`]).
    pub attn_scale: f32,
    /// The factor the embedding rows are multiplied by (Gemma: √n_embd).
    pub embd_scale: Option<f32>,
    /// The sliding window of the local layers, if any.
    pub sliding_window: Option<SlidingWindow>,
    /// `cap · tanh(logit / cap)` on the output logits, if set.
    pub final_logit_softcap: Option<f32>,
}

pub(super) fn key_usize(file: &GgufFile, key: &str) -> Result<Option<usize>, ModelError> {
    match file.metadata().get(key) {
        None => Ok(None),
        Some(v) => v
            .as_u64()
            .and_then(|x| usize::try_from(x).ok())
            .map(Some)
            .ok_or_else(|| ModelError::BadKey {
                key: key.into(),
                reason: format!("expected a non-negative integer, found {}", describe(v)),
            }),
    }
}

pub(super) fn key_f32(file: &GgufFile, key: &str) -> Result<Option<f32>, ModelError> {
    match file.metadata().get(key) {
        None => Ok(None),
        Some(v) => v
            .as_f32()
            .or_else(|| v.as_f64().map(|x| x as f32))
            .map(Some)
            .ok_or_else(|| ModelError::BadKey {
                key: key.into(),
                reason: format!("expected a float, found {}", describe(v)),
            }),
    }
}

fn describe(v: &Value) -> String {
    match v {
        Value::Array(a) => format!("an array of {} {}", a.len(), a.element_type().name()),
        other => format!("{} {:?}", other.value_type().name(), other),
    }
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
        let fam = family::family(arch_name).ok_or_else(|| ModelError::UnsupportedArchitecture {
            arch: arch_name.into(),
            supported: family::supported(),
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
        let n_head_kv = key_usize(file, &format!("{p}.attention.head_count_kv"))?.unwrap_or(n_head);
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
            rope_style: fam.rope_style,
            attn_scale: 1.0 / (head_dim as f32).sqrt(),
            embd_scale: None,
            sliding_window: None,
            final_logit_softcap: None,
        };
        (fam.hparams)(file, &mut c)?;
        Ok(c)
    }

    /// The sliding window of layer `l`, if it is local.
    pub fn window(&self, l: usize) -> Option<usize> {
        self.sliding_window
            .as_ref()
            .filter(|s| s.layers.get(l).copied().unwrap_or(false))
            .map(|s| s.window)
    }

    /// Width of the queries of all heads (`n_head × head_dim`).
    pub fn q_dim(&self) -> usize {
        self.n_head * self.head_dim
    }

    /// Width of the keys (or values) of all KV heads (`n_head_kv × head_dim`).
    pub fn kv_dim(&self) -> usize {
        self.n_head_kv * self.head_dim
    }
}
