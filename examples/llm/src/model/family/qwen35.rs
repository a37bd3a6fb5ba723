//! `qwen35` (Qwen3.5 dense): a hybrid of gated delta-net layers (linear attention with a
//! recurrent state) and gated full-attention layers, each followed by a SiLU-gated
//! feed-forward, as llama.cpp's `models/qwen35.cpp` and `models/delta-net-base.cpp`.
//!
//! - Which layers are which: `qwen35.attention.recurrent_layers` (one boolean per layer) if
//!   present, else every `qwen35.full_attention_interval`-th layer (default 4: layers 3, 7, …)
//!   is full attention and the others delta-net.
//! - Each layer: `attn_norm` → its attention → residual; `post_attention_norm` (the norm
//!   before the feed-forward, llama.cpp's `attn_post_norm`) → feed-forward → residual.
//! - Full-attention layers: `attn_q` gives per head `head_dim` queries then `head_dim` gate
//!   values; per-head RMSNorm of the queries and keys; RoPE; causal GQA with scale
//!   `1/√head_dim`; the output times `sigmoid(gate)` before `attn_output`. llama.cpp rotates
//!   with IMROPE (`rope_multi` over `qwen35.rope.dimension_sections`): for text it fills the
//!   temporal, height and width position streams with the token's position and the fourth
//!   with 0, and every rotated pair whose section is one of the first three turns by the
//!   position times the usual frequency. So where every pair of the `rope.dimension_count`
//!   rotated dimensions falls in the first three sections (Qwen3.5: `[11, 11, 10, 0]` over 32
//!   pairs), that is NeoX RoPE over the first `rope.dimension_count` dimensions of each head
//!   (partial rotary); sections that leave a pair to the fourth stream are refused.
//! - Delta-net layers: see `examples/llm/src/model/delta_net.rs` for the arithmetic and the
//!   per-sequence state. The projections `attn_qkv`, `ssm_beta`, `ssm_alpha` and `attn_gate`
//!   read the same normed input: they are one linear through the seam (so the NPU path runs
//!   them, the small beta/alpha ones included), `ssm_out` another; the convolution, the
//!   recurrence and the norms run on the host in f32.
//! - The output is tied to the embedding when there is no `output.weight`.
//!
//! MTP layers (`qwen35.nextn_predict_layers` > 0) are the last blocks of `block_count`;
//! llama.cpp loads them but does not run them in its main pass, and neither does this code:
//! they are not loaded at all (their tensors stay in the file).

use rknn_chip::Residual;

use crate::gguf::{GgufFile, Value};
use crate::model::config::{
    Activation, Config, DeltaNet, Family, MAX_L_CACHE, QkNorm, RopeStyle, key_usize,
};
use crate::model::error::ModelError;

pub(super) const FAMILY: Family = Family {
    name: "qwen35",
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
    let req = |k: &str| -> Result<(String, usize), ModelError> {
        let key = format!("qwen35.{k}");
        let v =
            key_usize(file, &key)?.ok_or_else(|| ModelError::MissingKey { key: key.clone() })?;
        Ok((key, v))
    };
    let bad = |key: String, reason: String| ModelError::BadKey { key, reason };
    // MTP blocks are the last ones: the main pass runs the others.
    let nextn_key = "qwen35.nextn_predict_layers";
    let nextn = key_usize(file, nextn_key)?.unwrap_or(0);
    if nextn >= c.n_layer {
        return Err(bad(
            nextn_key.into(),
            format!("{nextn} MTP layers of {} blocks", c.n_layer),
        ));
    }
    let n_layer_all = c.n_layer;
    c.n_layer -= nextn;
    // One flag per layer: a layer has tensors, so a block count beyond the file's tensors is
    // refused before it is allocated.
    if n_layer_all > file.tensor_infos().len() {
        return Err(bad(
            "qwen35.block_count".into(),
            format!(
                "{n_layer_all} layers in a file of {} tensors",
                file.tensor_infos().len()
            ),
        ));
    }

    let (key, conv_kernel) = req("ssm.conv_kernel")?;
    if !(1..=MAX_L_CACHE).contains(&conv_kernel) {
        return Err(bad(
            key,
            format!("{conv_kernel} taps: a kernel has 1 to {MAX_L_CACHE}"),
        ));
    }
    let (key, head_dim) = req("ssm.state_size")?;
    if head_dim == 0 {
        return Err(bad(key, "heads of 0 dimensions".into()));
    }
    let (key, n_k_heads) = req("ssm.group_count")?;
    if n_k_heads == 0 {
        return Err(bad(key, "0 key heads".into()));
    }
    let (key, n_v_heads) = req("ssm.time_step_rank")?;
    if n_v_heads == 0 || n_v_heads % n_k_heads != 0 {
        return Err(bad(
            key,
            format!("{n_v_heads} value heads are not a multiple of the {n_k_heads} key heads"),
        ));
    }
    let (key, inner) = req("ssm.inner_size")?;
    if head_dim.checked_mul(n_v_heads) != Some(inner) {
        return Err(bad(
            key,
            format!("{inner} is not {n_v_heads} value heads of {head_dim}"),
        ));
    }
    // The state's size must exist: (taps - 1) rows of the channels plus a matrix per head.
    let fits = head_dim
        .checked_mul(head_dim)
        .and_then(|hh| hh.checked_mul(n_v_heads))
        .zip(
            n_k_heads
                .checked_mul(head_dim)
                .and_then(|k| k.checked_mul(2))
                .and_then(|k| k.checked_add(inner))
                .and_then(|cd| cd.checked_mul(conv_kernel)),
        )
        .and_then(|(s, conv)| s.checked_add(conv))
        .is_some();
    if !fits {
        return Err(bad(
            "qwen35.ssm.state_size".into(),
            format!("a state of {n_v_heads} heads of {head_dim}² overflows"),
        ));
    }

    let layers_key = "qwen35.attention.recurrent_layers";
    let layers: Vec<bool> = match file.metadata().get(layers_key) {
        Some(Value::Array(a)) => {
            let flags = a.as_bools().ok_or_else(|| {
                bad(
                    layers_key.into(),
                    format!("expected booleans, found {}", a.element_type().name()),
                )
            })?;
            if flags.len() != n_layer_all {
                return Err(bad(
                    layers_key.into(),
                    format!("{} entries for {n_layer_all} layers", flags.len()),
                ));
            }
            flags[..c.n_layer].to_vec()
        }
        Some(v) => {
            return Err(bad(
                layers_key.into(),
                format!("expected an array of booleans, found {v:?}"),
            ));
        }
        None => {
            let key = "qwen35.full_attention_interval";
            let n = key_usize(file, key)?.unwrap_or(4);
            if n == 0 {
                return Err(bad(key.into(), "an interval of 0 layers".into()));
            }
            (0..c.n_layer).map(|l| (l + 1) % n != 0).collect()
        }
    };

    // IMROPE's sections (required, as llama.cpp reads them): text positions rotate every pair
    // a section of the first three streams owns; the fourth stream's position is 0.
    let key = "qwen35.rope.dimension_sections";
    let sections = match file.metadata().get(key) {
        None => return Err(ModelError::MissingKey { key: key.into() }),
        Some(Value::Array(a)) => {
            let v: Option<Vec<usize>> = match (a.as_u32s(), a.as_i32s()) {
                (Some(v), _) => Some(v.iter().map(|&x| x as usize).collect()),
                (_, Some(v)) => v.iter().map(|&x| usize::try_from(x).ok()).collect(),
                _ => None,
            };
            match v {
                Some(v) if v.len() == 4 => [v[0], v[1], v[2], v[3]],
                _ => {
                    return Err(bad(
                        key.into(),
                        format!(
                            "expected 4 non-negative integers, found {} {}",
                            a.len(),
                            a.element_type().name()
                        ),
                    ));
                }
            }
        }
        Some(v) => return Err(bad(key.into(), format!("expected an array, found {v:?}"))),
    };
    let total: usize = sections.iter().sum();
    if total == 0 {
        return Err(bad(key.into(), "every section is empty".into()));
    }
    let [t, h, w, _] = sections;
    let text = |pair: usize| {
        let s = pair % total;
        (s.is_multiple_of(3) && s < 3 * t) || (s % 3 == 1 && s < 3 * h) || (s % 3 == 2 && s < 3 * w)
    };
    if let Some(pair) = (0..c.n_rot / 2).find(|&p| !text(p)) {
        return Err(ModelError::Unsupported {
            what: format!(
                "qwen35 RoPE sections {sections:?}: rotated pair {pair} takes the fourth \
                 position stream"
            ),
        });
    }

    c.delta_net = Some(DeltaNet {
        conv_kernel,
        head_dim,
        n_k_heads,
        n_v_heads,
        layers,
    });
    c.gated_attention = true;
    c.ffn_norm = "post_attention_norm.weight";
    Ok(())
}
