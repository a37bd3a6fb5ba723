//! `phi3` (Phi-3, Phi-3.5, Phi-4-mini): Q, K and V in one `attn_qkv` tensor (or three), gate
//! and up in one double-width `ffn_up`, NeoX RoPE, the queries scaled before the scores.
//!
//! `phi3.attention.sliding_window`, where a file sets it, is read and not applied: llama.cpp
//! disables Phi's sliding window (its converters do not record which layers use it), and this
//! crate computes what llama.cpp computes.
//!
//! Partial rotary (Phi-4-mini: `rope.dimension_count` is 3/4 of the head): the first `n_rot`
//! dimensions of each head are rotated in NeoX halves of `n_rot`, the rest pass through.
//!
//! LongRoPE (the 128k models): the tensors `rope_factors_long.weight` and
//! `rope_factors_short.weight` (`n_rot / 2` positive values each) divide the RoPE frequencies,
//! and `phi3.rope.scaling.attn_factor` multiplies cos and sin ([`Config::rope_attn_factor`],
//! 1 when absent: llama.cpp derives no factor for this scaling, the converter writes it). Which
//! set applies depends on the context size a sequence runs at, as in llama.cpp: the long
//! factors when it, rounded up to a multiple of 256, exceeds
//! `phi3.rope.scaling.original_context_length` ([`LongRope::uses_long`]). Checked against
//! llama.cpp on `tiny-phi3-longrope` at contexts on both sides of the switch.

use rknn_chip::Residual;

use crate::gguf::GgufFile;
use crate::model::config::{Activation, Config, Family, LongRope, QkNorm, RopeStyle, key_usize};
use crate::model::error::ModelError;

pub(super) const FAMILY: Family = Family {
    name: "phi3",
    rope_style: RopeStyle::Halves,
    qkv_bias: false,
    optional_biases: false,
    qk_norm: QkNorm::None,
    post_norms: false,
    activation: Activation::Silu,
    fused_gate_up: true,
    scale_queries: true,
    w8a8_residual: Residual::OutputAndDown,
    hparams,
};

const LONG: &str = "rope_factors_long.weight";
const SHORT: &str = "rope_factors_short.weight";
const ORIGINAL_CTX: &str = "phi3.rope.scaling.original_context_length";

fn hparams(file: &GgufFile, c: &mut Config) -> Result<(), ModelError> {
    if file.tensor(LONG).is_none() && file.tensor(SHORT).is_none() {
        return Ok(());
    }
    let original_ctx = key_usize(file, ORIGINAL_CTX)?.ok_or_else(|| ModelError::MissingKey {
        key: ORIGINAL_CTX.into(),
    })?;
    if original_ctx == 0 {
        return Err(ModelError::BadKey {
            key: ORIGINAL_CTX.into(),
            reason: "0 positions".into(),
        });
    }
    c.long_rope = Some(LongRope {
        original_ctx,
        long: factors(file, LONG, c.n_rot)?,
        short: factors(file, SHORT, c.n_rot)?,
    });
    Ok(())
}

/// The `n_rot / 2` factors of tensor `name`: F32, one dimension, each finite and positive.
fn factors(file: &GgufFile, name: &str, n_rot: usize) -> Result<Vec<f32>, ModelError> {
    let t = file
        .tensor(name)
        .ok_or_else(|| ModelError::MissingTensor { name: name.into() })?;
    let expected = vec![(n_rot / 2) as u64];
    if t.dims() != expected.as_slice() {
        return Err(ModelError::BadTensor {
            name: name.into(),
            expected,
            found: t.dims().to_vec(),
            ty: t.ty(),
        });
    }
    let v = t.to_f32()?;
    if let Some((i, x)) = v
        .iter()
        .enumerate()
        .find(|(_, x)| !(x.is_finite() && **x > 0.0))
    {
        return Err(ModelError::BadTensorData {
            name: name.into(),
            reason: format!("factor {i} is {x}, not a finite positive number"),
        });
    }
    Ok(v)
}
