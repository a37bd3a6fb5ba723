//! The architectures the forward pass runs, as data: one [`Family`] per architecture, each in
//! its own small file, listed in [`FAMILIES`].
//!
//! A family says which of the shared building blocks its layers use (RoPE pairing, Q/K biases,
//! per-head Q/K norms, post-norms, the gated feed-forward's activation, how its tensors are
//! fused) and reads its own metadata keys in [`Family::hparams`] (a sliding window, an
//! attention scale, a refusal of what the code does not implement). Adding the next family
//! (SmolLM3, Granite, ...) is one file here and one line in [`FAMILIES`]; the weight matmuls
//! still go through the one seam, so the NPU path needs nothing per family beyond shapes.

mod gemma3;
mod llama;
mod phi3;
mod qwen2;
mod qwen3;

use super::config::{Config, RopeStyle, SlidingWindow, key_f32, key_usize};
use super::error::ModelError;
use super::npu::Residual;
use crate::gguf::{GgufFile, Value};

/// Every family this crate runs, by `general.architecture`.
pub const FAMILIES: &[&Family] = &[
    &llama::FAMILY,
    &qwen2::FAMILY,
    &qwen3::FAMILY,
    &gemma3::FAMILY,
    &phi3::FAMILY,
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

/// The activation of the gated feed-forward network, `act(gate) * up`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    /// SiLU, `g / (1 + e^-g)` (llama, qwen, phi3).
    Silu,
    /// GELU with the tanh approximation, as ggml computes it in f32: the input rounded to f16,
    /// `0.5 x (1 + tanh(√(2/π) x (1 + 0.044715 x²)))` rounded to f16 (gemma).
    GeluTanh,
}

/// One architecture's rules (see the module documentation).
#[derive(Debug)]
pub struct Family {
    /// The name in `general.architecture` (also the metadata keys' prefix).
    pub name: &'static str,
    /// How RoPE pairs the dimensions of a head.
    pub rope_style: RopeStyle,
    /// Q, K and V biases: required (qwen2) or refused.
    pub qkv_bias: bool,
    /// Per-head RMSNorm of the queries and keys before RoPE (`attn_q_norm`, `attn_k_norm`).
    pub qk_norm: bool,
    /// RMSNorm of the attention's and the feed-forward's outputs before their residual adds
    /// (`post_attention_norm`, `post_ffw_norm`).
    pub post_norms: bool,
    /// The feed-forward's activation.
    pub activation: Activation,
    /// `ffn_up` holds gate and up side by side (`2 × n_ff` outputs, gate first) and there is no
    /// `ffn_gate` (phi3).
    pub fused_gate_up: bool,
    /// The queries are multiplied by the attention scale before the scores, as llama.cpp's
    /// graph does for this family, instead of the scores inside the softmax.
    pub scale_queries: bool,
    /// Which linears the NPU path's W8A8 quantises each activation row of twice by default
    /// ([`EngineOptions::for_family`](super::EngineOptions::for_family)): what it takes this
    /// family to stay within the accuracy bar (docs/llm.md).
    pub w8a8_residual: Residual,
    /// Reads the family's own metadata into `config` (after the shared keys), or refuses what
    /// the code does not implement.
    pub hparams: fn(&GgufFile, &mut Config) -> Result<(), ModelError>,
}

impl PartialEq for Family {
    fn eq(&self, other: &Self) -> bool {
        self.name == other.name
    }
}

/// A family with nothing of its own to read.
pub(super) fn no_hparams(_: &GgufFile, _: &mut Config) -> Result<(), ModelError> {
    Ok(())
}

/// The sliding window of `{arch}.attention.sliding_window`, if set and not 0, on the layers of
/// `{arch}.attention.sliding_window_pattern` (an array of booleans, one per layer, or `n`:
/// every layer but each `n`-th is local; `default_pattern` when absent), with RoPE base
/// `{arch}.rope.freq_base_swa` (10 000 when absent) and no RoPE scaling, as llama.cpp reads them.
pub(super) fn sliding_window(
    file: &GgufFile,
    c: &Config,
    default_pattern: usize,
) -> Result<Option<SlidingWindow>, ModelError> {
    let p = c.family.name;
    let window = match key_usize(file, &format!("{p}.attention.sliding_window"))? {
        None | Some(0) => return Ok(None),
        Some(w) => w,
    };
    let pattern_key = format!("{p}.attention.sliding_window_pattern");
    let layers = match file.metadata().get(&pattern_key) {
        Some(Value::Array(a)) => {
            let flags = a.as_bools().ok_or_else(|| ModelError::BadKey {
                key: pattern_key.clone(),
                reason: format!("expected booleans, found {}", a.element_type().name()),
            })?;
            if flags.len() != c.n_layer {
                return Err(ModelError::BadKey {
                    key: pattern_key,
                    reason: format!("{} entries for {} layers", flags.len(), c.n_layer),
                });
            }
            flags.to_vec()
        }
        _ => {
            let n = key_usize(file, &pattern_key)?.unwrap_or(default_pattern);
            // llama.cpp: with a pattern of n, layer il is local unless il % n == n - 1; 0 makes
            // every layer local.
            (0..c.n_layer).map(|l| n == 0 || l % n < n - 1).collect()
        }
    };
    let rope_base = key_f32(file, &format!("{p}.rope.freq_base_swa"))?.unwrap_or(10_000.0);
    Ok(Some(SlidingWindow {
        window,
        layers,
        rope_base,
        rope_freq_scale: 1.0,
    }))
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
        assert_eq!(supported(), "llama, qwen2, qwen3, gemma3, phi3");
    }
}
