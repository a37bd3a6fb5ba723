//! A model's hyper-parameters and its family's rules, as types, with the readers of metadata
//! keys the families share; [`Config::from_gguf`] (in `family/mod.rs`, beside the table of
//! families) reads them from a file.

use rknn_chip::Residual;

use super::error::ModelError;
use crate::gguf::{GgufFile, Value};

/// How RoPE pairs the dimensions of a head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeStyle {
    /// Dimensions `2i` and `2i + 1` (GGUF llama files; their Q/K weights are permuted to it).
    Adjacent,
    /// Dimensions `i` and `i + n_rot/2` (NeoX, qwen2).
    Halves,
}

/// Sliding-window attention on some layers (the local layers of Gemma 2 and 3).
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

/// LongRoPE (Phi-3 128k, Phi-3.5, Phi-4-mini): per-pair divisors of the RoPE frequencies,
/// one set for contexts up to the original training context and one for longer contexts.
#[derive(Debug, Clone, PartialEq)]
pub struct LongRope {
    /// `{arch}.rope.scaling.original_context_length`: the context up to which the short
    /// factors apply.
    pub original_ctx: usize,
    /// `rope_factors_long.weight`, `n_rot / 2` values.
    pub long: Vec<f32>,
    /// `rope_factors_short.weight`, `n_rot / 2` values.
    pub short: Vec<f32>,
}

/// The granularity llama.cpp rounds a sequence's context up to (`GGML_PAD(n_ctx, 256)`)
/// before comparing it with the original context.
pub const LONG_ROPE_CTX_PAD: usize = 256;

impl LongRope {
    /// Whether a sequence of context size `n_ctx` uses the long factors: as llama.cpp's
    /// `get_rope_factors`, when its context rounded up to a multiple of
    /// [`LONG_ROPE_CTX_PAD`] (llama.cpp's `n_ctx_seq`) exceeds [`LongRope::original_ctx`].
    /// The choice is per context size, not per position.
    pub fn uses_long(&self, n_ctx: usize) -> bool {
        long_rope_at(self.original_ctx, n_ctx)
    }

    /// The factors a sequence of context size `n_ctx` uses ([`LongRope::uses_long`]).
    pub fn factors(&self, n_ctx: usize) -> &[f32] {
        if self.uses_long(n_ctx) {
            &self.long
        } else {
            &self.short
        }
    }
}

/// [`LongRope::uses_long`] for the original context `original_ctx`.
pub(super) fn long_rope_at(original_ctx: usize, n_ctx: usize) -> bool {
    n_ctx.div_ceil(LONG_ROPE_CTX_PAD) * LONG_ROPE_CTX_PAD > original_ctx
}

/// The short-convolution layers of a hybrid model (LFM2): instead of attention, such a layer
/// projects its input to `B`, `C` and `x` (`n_embd` each), convolves `B ⊙ x` causally over
/// time, per channel, with a kernel of `l_cache` taps, and projects `C ⊙ conv` back.
#[derive(Debug, Clone, PartialEq)]
pub struct ShortConv {
    /// Taps of the kernel (`{arch}.shortconv.l_cache`): the output at a position sums
    /// `B ⊙ x` of that position and the `l_cache - 1` before it.
    pub l_cache: usize,
    /// Per layer: whether it is a short-convolution layer (the others are attention layers).
    pub layers: Vec<bool>,
}

/// The longest short-convolution kernel accepted (LFM2's is 3; Qwen3.5's delta-net
/// convolution 4).
pub const MAX_L_CACHE: usize = 16;

/// The gated delta-net layers of a hybrid model (Qwen3.5, `qwen35`): linear attention with a
/// recurrent state instead of a KV cache (see `examples/llm/src/model/delta_net.rs`).
#[derive(Debug, Clone, PartialEq)]
pub struct DeltaNet {
    /// Taps of the causal depthwise convolution over the q, k, v channels
    /// (`{arch}.ssm.conv_kernel`).
    pub conv_kernel: usize,
    /// Head size of the keys and of the values (`{arch}.ssm.state_size`).
    pub head_dim: usize,
    /// Key (and query) heads (`{arch}.ssm.group_count`).
    pub n_k_heads: usize,
    /// Value heads (`{arch}.ssm.time_step_rank`), a multiple of the key heads: value head `h`
    /// reads key head `h % n_k_heads` (ggml's repeat tiles them).
    pub n_v_heads: usize,
    /// Per layer: whether it is a delta-net layer (the others are full attention).
    pub layers: Vec<bool>,
}

impl DeltaNet {
    /// Width of the queries (and of the keys) of all key heads.
    pub fn key_dim(&self) -> usize {
        self.n_k_heads * self.head_dim
    }

    /// Width of the values of all value heads (`{arch}.ssm.inner_size`).
    pub fn value_dim(&self) -> usize {
        self.n_v_heads * self.head_dim
    }

    /// Channels of the convolution: q, k and v side by side.
    pub fn conv_dim(&self) -> usize {
        2 * self.key_dim() + self.value_dim()
    }

    /// f32 values of one layer's recurrent state: the convolution's last `conv_kernel - 1`
    /// input rows and one `head_dim × head_dim` matrix per value head.
    pub fn state_len(&self) -> usize {
        (self.conv_kernel - 1) * self.conv_dim() + self.n_v_heads * self.head_dim * self.head_dim
    }
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
    /// Leading dimensions of each head that RoPE rotates (`{arch}.rope.dimension_count`; the
    /// whole head when absent). The others pass through unrotated (Phi-4-mini rotates 3/4).
    pub n_rot: usize,
    /// The factor RoPE multiplies its cos and sin by (`{arch}.rope.scaling.attn_factor`, 1
    /// when absent), as ggml's `rope_ext` applies its `attn_factor` to queries and keys.
    pub rope_attn_factor: f32,
    /// Phi-3's long-context RoPE frequency factors, if the file has them.
    pub long_rope: Option<LongRope>,
    /// The RoPE pairing.
    pub rope_style: RopeStyle,
    /// The attention scale (`1/√head_dim` unless the family sets another), applied to the
    /// scores inside the softmax, or to the queries when the family says so
    /// ([`Family::scale_queries`]).
    pub attn_scale: f32,
    /// The factor the embedding rows are multiplied by (Gemma: √n_embd; Granite:
    /// `embedding_scale`).
    pub embd_scale: Option<f32>,
    /// The factor the attention's and the feed-forward's outputs are multiplied by before
    /// their residual adds (Granite's `residual_scale`).
    pub residual_scale: Option<f32>,
    /// The sliding window of the local layers, if any.
    pub sliding_window: Option<SlidingWindow>,
    /// `cap · tanh(score / cap)` on the attention scores before the softmax, if set (Gemma 2).
    pub attn_softcap: Option<f32>,
    /// `cap · tanh(logit / cap)` on the output logits, if set.
    pub final_logit_softcap: Option<f32>,
    /// The divisor of the output logits (Granite's `logit_scale`): they are multiplied by its
    /// f32 reciprocal, as ggml scales them.
    pub logit_scale: Option<f32>,
    /// Layers without RoPE (NoPE), as llama.cpp's `n_no_rope_layer_step`: with `Some(n)`, the
    /// layers `l` with `(l + 1) % n == 0` leave their queries and keys unrotated (SmolLM3: 4,
    /// every fourth layer; 1: no layer rotates). `None`: every layer rotates.
    pub no_rope_step: Option<usize>,
    /// `{arch}.pooling_type`, if set: how the file says to pool its embeddings, in llama.cpp's
    /// numbering (0 none, 1 mean, 2 cls, 3 last, 4 rank; see
    /// [`Pooling::from_gguf_type`](super::Pooling::from_gguf_type)).
    pub pooling_type: Option<u64>,
    /// The short-convolution layers, if the model has any (LFM2).
    pub short_conv: Option<ShortConv>,
    /// The gated delta-net layers, if the model has any (Qwen3.5).
    pub delta_net: Option<DeltaNet>,
    /// The full-attention layers' `attn_q` holds, per head, `head_dim` queries and then
    /// `head_dim` gate values; the attention's output is multiplied by `sigmoid(gate)` before
    /// `attn_output` (Qwen3.5).
    pub gated_attention: bool,
    /// The name of each layer's norm before the feed-forward (`ffn_norm.weight`; Qwen3.5's is
    /// `post_attention_norm.weight`).
    pub ffn_norm: &'static str,
    /// The name of the final norm's tensor (`output_norm.weight`; LFM2's is
    /// `token_embd_norm.weight`).
    pub output_norm: &'static str,
    /// The mixture of experts that replaces the dense feed-forward, if the family has one
    /// (its `n_ff_exp` replaces [`Config::n_ff`] as the experts' hidden width).
    pub moe: Option<Moe>,
}

/// Most experts a layer may have: llama.cpp's `LLAMA_MAX_EXPERTS`.
pub const MAX_EXPERTS: usize = 1024;

/// How a mixture's router turns its logits into expert probabilities (llama.cpp's
/// `expert_gating_func`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gating {
    /// A softmax over the layer's experts (qwen3moe, olmoe, granitemoe; llama.cpp's 1).
    Softmax,
    /// Each logit's sigmoid on its own, `1 / (1 + e^-x)` (lfm2moe; llama.cpp's 2).
    Sigmoid,
}

/// A mixture-of-experts feed-forward's hyper-parameters (qwen3moe, olmoe, granitemoe,
/// lfm2moe).
///
/// Each row's router logits (`ffn_gate_inp`, on the host in f32) go through the gating
/// function; the `n_expert_used` experts of the highest probabilities (plus the layer's
/// selection bias, when it has one) run, ties to the lower index, and their outputs are
/// summed, weighted by their unbiased probabilities (divided by the chosen ones' sum when
/// `renormalise`), in rank order; a shared expert's output, when there is one, is added to
/// that sum. The first `n_dense_lead` layers have a dense feed-forward instead.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Moe {
    /// Experts per layer (`{arch}.expert_count`).
    pub n_expert: usize,
    /// Experts each row runs (`{arch}.expert_used_count`).
    pub n_expert_used: usize,
    /// Hidden width of one expert.
    pub n_ff_exp: usize,
    /// Whether the chosen experts' weights are divided by their sum (llama.cpp's `norm_w`).
    pub renormalise: bool,
    /// Hidden width of the shared expert every row runs besides its chosen ones
    /// (`ffn_{gate,up,down}_shexp`, unweighted), if the layers have one (granitemoe's
    /// `expert_shared_feed_forward_length`).
    pub n_ff_shared: Option<usize>,
    /// The router's gating function.
    pub gating: Gating,
    /// Whether each mixture layer has a selection bias (`exp_probs_b.bias`, `n_expert`
    /// values): added to the probabilities to choose the experts, not to weight them
    /// (lfm2moe's, as DeepSeek V3's).
    pub selection_bias: bool,
    /// The leading layers whose feed-forward is dense, of [`Config::n_ff`]
    /// (`{arch}.leading_dense_block_count`; 0 for most families).
    pub n_dense_lead: usize,
}

/// Reads `{arch}.expert_count` and `{arch}.expert_used_count` (both required, checked against
/// each other and [`MAX_EXPERTS`]) into `c.moe`, with the experts' hidden width `n_ff_exp`.
pub(super) fn moe(
    file: &GgufFile,
    c: &mut Config,
    n_ff_exp: usize,
    renormalise: bool,
) -> Result<(), ModelError> {
    let p = c.family.name;
    let req = |k: &str| -> Result<(String, usize), ModelError> {
        let key = format!("{p}.{k}");
        let v =
            key_usize(file, &key)?.ok_or_else(|| ModelError::MissingKey { key: key.clone() })?;
        Ok((key, v))
    };
    let (count_key, n_expert) = req("expert_count")?;
    let (used_key, n_expert_used) = req("expert_used_count")?;
    if n_expert == 0 || n_expert > MAX_EXPERTS {
        return Err(ModelError::BadKey {
            key: count_key,
            reason: format!("{n_expert} experts: 1 to {MAX_EXPERTS} are supported"),
        });
    }
    if n_expert_used == 0 || n_expert_used > n_expert {
        return Err(ModelError::BadKey {
            key: used_key,
            reason: format!("{n_expert_used} experts used of {n_expert}"),
        });
    }
    if n_ff_exp == 0 {
        return Err(ModelError::BadKey {
            key: format!("{p}.expert_feed_forward_length"),
            reason: "experts of hidden width 0".into(),
        });
    }
    c.moe = Some(Moe {
        n_expert,
        n_expert_used,
        n_ff_exp,
        renormalise,
        n_ff_shared: None,
        gating: Gating::Softmax,
        selection_bias: false,
        n_dense_lead: 0,
    });
    Ok(())
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

/// `key` as one non-negative integer per layer: an array of `n_layer` of them, or one integer
/// for every layer (`None` when absent), as llama.cpp's `get_key_or_arr` reads it.
pub(super) fn key_per_layer(
    file: &GgufFile,
    key: &str,
    n_layer: usize,
) -> Result<Option<Vec<usize>>, ModelError> {
    let Some(Value::Array(a)) = file.metadata().get(key) else {
        // One flag per layer: a layer has tensors, so a block count beyond the file's
        // tensors is refused before it is allocated.
        return match key_usize(file, key)? {
            None => Ok(None),
            Some(_) if n_layer > file.tensor_infos().len() => Err(ModelError::BadKey {
                key: key.into(),
                reason: format!(
                    "{n_layer} layers in a file of {} tensors",
                    file.tensor_infos().len()
                ),
            }),
            Some(v) => Ok(Some(vec![v; n_layer])),
        };
    };
    let bad = |reason: String| ModelError::BadKey {
        key: key.into(),
        reason,
    };
    if a.len() != n_layer {
        return Err(bad(format!("{} entries for {n_layer} layers", a.len())));
    }
    let values: Option<Vec<usize>> = match (a.as_u32s(), a.as_i32s()) {
        (Some(v), _) => Some(v.iter().map(|&x| x as usize).collect()),
        (_, Some(v)) => v.iter().map(|&x| usize::try_from(x).ok()).collect(),
        _ => None,
    };
    values.map(Some).ok_or_else(|| {
        bad(format!(
            "expected non-negative integers, found {}",
            a.element_type().name()
        ))
    })
}

fn describe(v: &Value) -> String {
    match v {
        Value::Array(a) => format!("an array of {} {}", a.len(), a.element_type().name()),
        other => format!("{} {:?}", other.value_type().name(), other),
    }
}

impl Config {
    /// Whether layer `l` applies RoPE to its queries and keys ([`Config::no_rope_step`]).
    pub fn rotates(&self, l: usize) -> bool {
        self.no_rope_step
            .and_then(|n| (l + 1).checked_rem(n))
            .is_none_or(|r| r != 0)
    }

    /// The sliding window of layer `l`, if it is local.
    pub fn window(&self, l: usize) -> Option<usize> {
        self.sliding_window
            .as_ref()
            .filter(|s| s.layers.get(l).copied().unwrap_or(false))
            .map(|s| s.window)
    }

    /// The kernel length of layer `l` if it is a short-convolution layer (not attention).
    pub fn conv(&self, l: usize) -> Option<usize> {
        self.short_conv
            .as_ref()
            .filter(|s| s.layers.get(l).copied().unwrap_or(false))
            .map(|s| s.l_cache)
    }

    /// The mixture of experts of layer `l`, if its feed-forward is one (not one of the
    /// leading dense layers, [`Moe::n_dense_lead`]).
    pub fn moe_at(&self, l: usize) -> Option<&Moe> {
        self.moe.as_ref().filter(|m| l >= m.n_dense_lead)
    }

    /// Whether layer `l` is a gated delta-net layer (not attention).
    pub fn delta(&self, l: usize) -> bool {
        self.delta_net
            .as_ref()
            .is_some_and(|d| d.layers.get(l).copied().unwrap_or(false))
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

/// The activation of the gated feed-forward network, `act(gate) * up`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    /// SiLU, `g / (1 + e^-g)` (llama, qwen, phi3, smollm3, granite).
    Silu,
    /// GELU with the tanh approximation, as ggml computes it in f32: the input rounded to f16,
    /// `0.5 x (1 + tanh(√(2/π) x (1 + 0.044715 x²)))` rounded to f16 (gemma2, gemma3).
    GeluTanh,
}

/// Where the queries and keys are RMS-normalised before RoPE.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QkNorm {
    /// Not at all.
    None,
    /// Each head on its own, with weights of `head_dim` (qwen3, gemma3, qwen3moe).
    PerHead,
    /// The whole projection of a row, all heads at once, with weights of `q_dim` and `kv_dim`
    /// (olmoe).
    Whole,
}

/// One architecture's rules (see the module documentation).
#[derive(Debug)]
pub struct Family {
    /// The name in `general.architecture` (also the metadata keys' prefix).
    pub name: &'static str,
    /// How RoPE pairs the dimensions of a head.
    pub rope_style: RopeStyle,
    /// Q, K and V biases: required (qwen2) or, unless [`Family::optional_biases`], refused.
    pub qkv_bias: bool,
    /// Biases on the Q, K and V, the attention output and the feed-forward (gate, up, down)
    /// linears are each added when the file has them (llama.cpp's llama graph: `attn_q.bias`
    /// … `attn_output.bias`, `ffn_gate.bias`, `ffn_up.bias`, `ffn_down.bias`, all optional);
    /// otherwise any of them is refused, naming the tensor.
    pub optional_biases: bool,
    /// RMSNorm of the queries and keys before RoPE (`attn_q_norm`, `attn_k_norm`), if any.
    pub qk_norm: QkNorm,
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
    /// ([`Family::engine_options`]): what it takes this family to stay within the accuracy bar
    /// (docs/llm.md).
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

/// Refuses RoPE on part of each head where llama.cpp's graph asserts it covers the whole head
/// (`n_rot == head_dim`).
pub(super) fn rope_whole_head(c: &Config) -> Result<(), ModelError> {
    if c.n_rot != c.head_dim {
        return Err(ModelError::Unsupported {
            what: format!(
                "{} with RoPE on {} of {} dimensions per head",
                c.family.name, c.n_rot, c.head_dim
            ),
        });
    }
    Ok(())
}

/// The sliding window of `{arch}.attention.sliding_window` (`default_window` when absent; none
/// when 0) on the layers of `{arch}.attention.sliding_window_pattern` (an array of booleans,
/// one per layer, or `n`: every layer but each `n`-th is local; `default_pattern` when
/// absent), with RoPE base `{arch}.rope.freq_base_swa` (`default_rope.0` when absent) and
/// position scale `default_rope.1`, as llama.cpp reads them.
pub(super) fn sliding_window(
    file: &GgufFile,
    c: &Config,
    default_window: Option<usize>,
    default_pattern: usize,
    default_rope: (f32, f32),
) -> Result<Option<SlidingWindow>, ModelError> {
    let p = c.family.name;
    let window = match key_usize(file, &format!("{p}.attention.sliding_window"))?.or(default_window)
    {
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
            // One flag per layer: a layer has tensors, so a block count beyond the file's
            // tensors is refused before it is allocated.
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
            let n = key_usize(file, &pattern_key)?.unwrap_or(default_pattern);
            // llama.cpp: with a pattern of n, layer il is local unless il % n == n - 1; 0 makes
            // every layer local.
            (0..c.n_layer).map(|l| n == 0 || l % n < n - 1).collect()
        }
    };
    let rope_base = key_f32(file, &format!("{p}.rope.freq_base_swa"))?.unwrap_or(default_rope.0);
    Ok(Some(SlidingWindow {
        window,
        layers,
        rope_base,
        rope_freq_scale: default_rope.1,
    }))
}
