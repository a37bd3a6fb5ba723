//! `granitemoe` (IBM Granite 3.x mixture of experts, granite-3.1-1b-a400m / 3b-a800m, and
//! Granite MoE Shared): granite's layers and four scalars (see [`super::granite`]) with a
//! mixture of experts for the feed-forward, as llama.cpp's graph builds it (granite's graph,
//! `build_moe_ffn`):
//!
//! - a softmax over the router's logits, the top `granitemoe.expert_used_count`, their weights
//!   divided by their sum (`norm_w`), SiLU-gated experts of `granitemoe.feed_forward_length`
//!   (granitemoe has no `expert_feed_forward_length`);
//! - no `expert_weights_scale` (llama.cpp reads none for granitemoe, so a file's key is
//!   ignored as it ignores it);
//! - when `granitemoe.expert_shared_feed_forward_length` is above 0, a shared expert
//!   (`ffn_{gate,up,down}_shexp`, SiLU-gated, of that width) runs on every row's normalised
//!   input and its output is added, neither gated nor weighted, to the experts' weighted sum;
//!   then granite's `residual_scale` scales the whole before the residual add;
//! - RoPE on every layer: llama.cpp reads no `rope.scaling.finetuned` switch for granitemoe.
//!
//! An attention-output bias, which llama.cpp would add, is refused; so are shared-expert
//! tensors without the key that gives their width (llama.cpp refuses a file with tensors it
//! does not use).

use rknn_chip::Residual;

use crate::gguf::GgufFile;
use crate::model::config::{
    Activation, Config, Family, QkNorm, RopeStyle, key_usize, moe, rope_whole_head,
};
use crate::model::error::ModelError;

pub(super) const FAMILY: Family = Family {
    name: "granitemoe",
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
    super::granite::scalars(file, c)?;
    moe(file, c, c.n_ff, true)?;
    let shared =
        key_usize(file, "granitemoe.expert_shared_feed_forward_length")?.filter(|&n| n > 0);
    if shared.is_none() {
        if let Some(name) = ["ffn_gate_shexp", "ffn_up_shexp", "ffn_down_shexp"]
            .iter()
            .map(|part| format!("blk.0.{part}.weight"))
            .find(|name| file.tensor(name).is_some())
        {
            return Err(ModelError::Unsupported {
                what: format!(
                    "tensor {name:?} without granitemoe.expert_shared_feed_forward_length"
                ),
            });
        }
    }
    if let Some(m) = c.moe.as_mut() {
        m.n_ff_shared = shared;
    }
    let name = "blk.0.attn_output.bias";
    if file.tensor(name).is_some() {
        return Err(ModelError::Unsupported {
            what: format!("tensor {name:?} in a granitemoe model"),
        });
    }
    Ok(())
}
