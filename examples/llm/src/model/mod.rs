//! The f32 reference forward pass of the llama family (`llama`, `qwen2`), read in one sitting:
//! configuration from the GGUF metadata, weights through a [`LinearFactory`], then
//! [`Model::forward`] from token ids to logits with an explicit KV cache.
//!
//! A token's path: embedding row → per layer { RMSNorm → Q, K, V projections (+ biases for
//! qwen2) → RoPE on Q and K → append K, V to the cache → causal grouped-query attention →
//! output projection → residual; RMSNorm → SwiGLU feed-forward → residual } → final RMSNorm →
//! output projection (tied to the embedding when the file has no `output.weight`).
//!
//! Batch invariance: the logits of a position are bit-identical whether it is computed alone
//! or inside a batch of any size, with any thread count. Every float reduction (matmul dot
//! products, attention scores, softmax sums, norms) runs in an order fixed by the vector
//! lengths alone (see [`kernels`]); rows are never mixed.

mod exp;
mod host_pool;
pub mod kernels;
mod kv_cache;
pub mod linear;
pub mod npu;

use std::sync::Arc;
use std::time::{Duration, Instant};

use rayon::prelude::*;

use crate::gguf::{GgmlType, GgufError, GgufFile, TensorView, Value};
pub use host_pool::host_pool;
use kv_cache::KvRows;
pub use kv_cache::{CacheType, KvCache};
pub use linear::{BackendError, F32Linear, HostF32Factory, LinearFactory, LinearOp, LinearRole};
pub use npu::{EngineFactory, EngineLinear, EngineOptions, Residual};

/// What went wrong building or running the model.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ModelError {
    /// The GGUF file itself.
    #[error(transparent)]
    Gguf(#[from] GgufError),
    /// `general.architecture` names an architecture this crate does not run.
    #[error("unsupported architecture {arch:?} (supported: llama, qwen2)")]
    UnsupportedArchitecture {
        /// The architecture named by the file.
        arch: String,
    },
    /// A required metadata key is absent.
    #[error("metadata key {key:?} is missing")]
    MissingKey {
        /// The key.
        key: String,
    },
    /// A metadata value is of the wrong type or out of range.
    #[error("metadata key {key:?}: {reason}")]
    BadKey {
        /// The key.
        key: String,
        /// What is wrong.
        reason: String,
    },
    /// A feature of the file this model does not implement.
    #[error("unsupported model feature: {what}")]
    Unsupported {
        /// The feature.
        what: String,
    },
    /// A required tensor is absent.
    #[error("tensor {name:?} is missing")]
    MissingTensor {
        /// Its name.
        name: String,
    },
    /// A tensor of the wrong shape or type.
    #[error("tensor {name:?} has dimensions {found:?} of {ty}, expected {expected:?}")]
    BadTensor {
        /// Its name.
        name: String,
        /// The dimensions the configuration implies.
        expected: Vec<u64>,
        /// The dimensions in the file.
        found: Vec<u64>,
        /// Its type.
        ty: GgmlType,
    },
    /// The backend refused or failed a weight.
    #[error("backend, tensor {tensor:?}: {source}")]
    Backend {
        /// The tensor being converted or multiplied.
        tensor: String,
        /// The backend's error.
        source: BackendError,
    },
    /// The tokens would run past the context length.
    #[error(
        "context overflow: positions {pos}..{end} exceed the context length {n_ctx}",
        end = pos + n_tokens
    )]
    ContextOverflow {
        /// First position.
        pos: usize,
        /// Tokens given.
        n_tokens: usize,
        /// The context length.
        n_ctx: usize,
    },
    /// A position past what the cache holds.
    #[error("position {pos} is past the {cached} positions in the KV cache")]
    BadPosition {
        /// The position given.
        pos: usize,
        /// Positions cached.
        cached: usize,
    },
    /// A token id outside the vocabulary.
    #[error("token id {token} is outside the vocabulary of {n_vocab}")]
    BadToken {
        /// The id.
        token: u32,
        /// The vocabulary size.
        n_vocab: usize,
    },
}

/// The architectures [`Model`] runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Architecture {
    /// `llama`: GGUF files rotate adjacent pairs in RoPE.
    Llama,
    /// `qwen2`: Q/K/V biases, RoPE on the two halves of each head (NeoX style).
    Qwen2,
}

impl Architecture {
    /// The name in `general.architecture`.
    pub fn name(self) -> &'static str {
        match self {
            Architecture::Llama => "llama",
            Architecture::Qwen2 => "qwen2",
        }
    }
}

/// How RoPE pairs the dimensions of a head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeStyle {
    /// Dimensions `2i` and `2i + 1` (GGUF llama files; their Q/K weights are permuted to it).
    Adjacent,
    /// Dimensions `i` and `i + n_rot/2` (NeoX, qwen2).
    Halves,
}

/// Model hyper-parameters, read from the GGUF metadata.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// The architecture.
    pub arch: Architecture,
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
}

fn key_usize(file: &GgufFile, key: &str) -> Result<Option<usize>, ModelError> {
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

fn key_f32(file: &GgufFile, key: &str) -> Result<Option<f32>, ModelError> {
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
        let arch = match arch_name {
            "llama" => Architecture::Llama,
            "qwen2" => Architecture::Qwen2,
            other => {
                return Err(ModelError::UnsupportedArchitecture { arch: other.into() });
            }
        };
        let p = arch.name();
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
        Ok(Config {
            arch,
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
            rope_style: match arch {
                Architecture::Llama => RopeStyle::Adjacent,
                Architecture::Qwen2 => RopeStyle::Halves,
            },
        })
    }

    fn q_dim(&self) -> usize {
        self.n_head * self.head_dim
    }

    fn kv_dim(&self) -> usize {
        self.n_head_kv * self.head_dim
    }
}

/// A matmul weight with its name, for error messages.
struct Linear {
    name: String,
    op: Box<dyn LinearOp>,
}

impl Linear {
    fn forward(&self, x: &[f32], m: usize, out: &mut [f32]) -> Result<(), ModelError> {
        self.op
            .forward(x, m, out)
            .map_err(|source| ModelError::Backend {
                tensor: self.name.clone(),
                source,
            })
    }
}

struct Layer {
    attn_norm: Vec<f32>,
    /// q, k and v fused: they read the same input, so a backend that transforms its input
    /// (quantises, rotates) does it once, and runs one matmul instead of three.
    wqkv: Linear,
    bq: Option<Vec<f32>>,
    bk: Option<Vec<f32>>,
    bv: Option<Vec<f32>>,
    wo: Linear,
    ffn_norm: Vec<f32>,
    /// gate and up fused, for the same reason.
    w_gate_up: Linear,
    w_down: Linear,
}

/// Which rows of logits [`Model::forward`] computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Logits {
    /// None: only fill the KV cache.
    None,
    /// The last token's.
    Last,
    /// Every token's (perplexity, fixtures).
    All,
}

/// Time spent per phase, summed over forward calls.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Stats {
    /// Forward calls.
    pub forward_calls: u64,
    /// Tokens processed.
    pub tokens: u64,
    /// In [`LinearOp::forward`].
    pub matmul: Duration,
    /// In attention (scores, softmax, weighted values).
    pub attention: Duration,
    /// Everything else (norms, RoPE, embedding, SwiGLU, residuals).
    pub other: Duration,
}

/// The loaded model with its KV cache.
pub struct Model {
    config: Config,
    embd_ty: GgmlType,
    embd_row_bytes: usize,
    embd: Vec<u8>,
    layers: Vec<Layer>,
    output_norm: Vec<f32>,
    output: Linear,
    rope_freqs: Option<Vec<f32>>,
    cache: KvCache,
    pool: Arc<rayon::ThreadPool>,
    logits: Vec<f32>,
    stats: Stats,
    backend_kind: &'static str,
}

impl std::fmt::Debug for Model {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Model")
            .field("config", &self.config)
            .field("cached", &self.cache.len)
            .finish_non_exhaustive()
    }
}

/// Loading progress: weight bytes converted so far and in total.
pub type Progress<'a> = &'a mut dyn FnMut(u64, u64);

impl Model {
    /// Builds the model from `file`, converting each weight matrix with `factory`; attention
    /// runs on `pool`. `progress` is called after each tensor.
    pub fn load(
        file: &GgufFile,
        factory: &mut dyn LinearFactory,
        pool: Arc<rayon::ThreadPool>,
        progress: Progress<'_>,
    ) -> Result<Self, ModelError> {
        let c = Config::from_gguf(file)?;
        let (e, q, kv, ff) = (
            c.n_embd as u64,
            c.q_dim() as u64,
            c.kv_dim() as u64,
            c.n_ff as u64,
        );
        let total: u64 = file.tensor_infos().iter().map(|t| t.n_bytes()).sum();
        let mut done = 0u64;

        let tensor = |name: &str, dims: &[u64]| -> Result<TensorView<'_>, ModelError> {
            let t = file
                .tensor(name)
                .ok_or_else(|| ModelError::MissingTensor { name: name.into() })?;
            if t.dims() != dims || !t.ty().can_dequantize() {
                return Err(ModelError::BadTensor {
                    name: name.into(),
                    expected: dims.to_vec(),
                    found: t.dims().to_vec(),
                    ty: t.ty(),
                });
            }
            Ok(t)
        };
        let vector = |name: &str, len: u64, done: &mut u64| -> Result<Vec<f32>, ModelError> {
            let t = tensor(name, &[len])?;
            *done += t.data().len() as u64;
            Ok(t.to_f32()?)
        };
        // A linear of the tensors `parts` (name, out_features) stacked along the outputs.
        let mut linear = |role: LinearRole,
                          parts: &[(&str, u64)],
                          k: u64,
                          done: &mut u64|
         -> Result<Linear, ModelError> {
            let views = parts
                .iter()
                .map(|&(name, n)| tensor(name, &[k, n]))
                .collect::<Result<Vec<_>, _>>()?;
            let name = parts.iter().map(|p| p.0).collect::<Vec<_>>().join("+");
            let op = factory
                .build(role, &views)
                .map_err(|source| ModelError::Backend {
                    tensor: name.clone(),
                    source,
                })?;
            *done += views.iter().map(|t| t.data().len() as u64).sum::<u64>();
            Ok(Linear { name, op })
        };

        let embd = tensor("token_embd.weight", &[e, c.n_vocab as u64])?;
        done += embd.data().len() as u64;
        progress(done, total);

        // The block count comes from the file: every layer has tensors in it, so no more
        // layers than tensors are reserved up front (2^40 layers aborted the process).
        let mut layers = Vec::with_capacity(c.n_layer.min(file.tensor_infos().len()));
        for i in 0..c.n_layer {
            let n = |s: &str| format!("blk.{i}.{s}");
            let bias =
                |s: &str, len: u64, done: &mut u64| -> Result<Option<Vec<f32>>, ModelError> {
                    match c.arch {
                        Architecture::Qwen2 => vector(&n(s), len, done).map(Some),
                        Architecture::Llama if file.tensor(&n(s)).is_some() => {
                            Err(ModelError::Unsupported {
                                what: format!("tensor {:?} in a llama model", n(s)),
                            })
                        }
                        Architecture::Llama => Ok(None),
                    }
                };
            let (wq, wk, wv) = (n("attn_q.weight"), n("attn_k.weight"), n("attn_v.weight"));
            let (wg, wu) = (n("ffn_gate.weight"), n("ffn_up.weight"));
            let layer = Layer {
                attn_norm: vector(&n("attn_norm.weight"), e, &mut done)?,
                wqkv: linear(
                    LinearRole::Qkv,
                    &[(&wq, q), (&wk, kv), (&wv, kv)],
                    e,
                    &mut done,
                )?,
                bq: bias("attn_q.bias", q, &mut done)?,
                bk: bias("attn_k.bias", kv, &mut done)?,
                bv: bias("attn_v.bias", kv, &mut done)?,
                wo: linear(
                    LinearRole::AttnOutput,
                    &[(&n("attn_output.weight"), e)],
                    q,
                    &mut done,
                )?,
                ffn_norm: vector(&n("ffn_norm.weight"), e, &mut done)?,
                w_gate_up: linear(LinearRole::GateUp, &[(&wg, ff), (&wu, ff)], e, &mut done)?,
                w_down: linear(
                    LinearRole::Down,
                    &[(&n("ffn_down.weight"), e)],
                    ff,
                    &mut done,
                )?,
            };
            layers.push(layer);
            progress(done, total);
        }
        let output_norm = vector("output_norm.weight", e, &mut done)?;
        let output_name = if file.tensor("output.weight").is_some() {
            "output.weight"
        } else {
            "token_embd.weight"
        };
        let output = linear(
            LinearRole::Output,
            &[(output_name, c.n_vocab as u64)],
            e,
            &mut done,
        )?;
        let rope_freqs = match file.tensor("rope_freqs.weight") {
            Some(_) => Some(vector(
                "rope_freqs.weight",
                (c.n_rot / 2) as u64,
                &mut done,
            )?),
            None => None,
        };
        progress(total, total);

        let backend_kind = output.op.kind();
        Ok(Model {
            embd_ty: embd.ty(),
            embd_row_bytes: embd.row_bytes(),
            embd: embd.data().to_vec(),
            layers,
            output_norm,
            output,
            rope_freqs,
            cache: KvCache::new(c.n_layer * c.n_head_kv, CacheType::F32),
            pool,
            logits: Vec::new(),
            stats: Stats::default(),
            backend_kind,
            config: c,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The KV cache.
    pub fn cache(&self) -> &KvCache {
        &self.cache
    }

    /// The kind of the backend's linears (`"f32"`, ...).
    pub fn backend_kind(&self) -> &'static str {
        self.backend_kind
    }

    /// Accumulated timings.
    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    /// Forgets every cached position.
    pub fn reset(&mut self) {
        self.truncate(0);
    }

    /// Stores keys and values as `ty` from now on; the cache is emptied (positions written in
    /// one type are not converted to the other).
    pub fn set_cache_type(&mut self, ty: CacheType) {
        let c = &self.config;
        self.cache = KvCache::new(c.n_layer * c.n_head_kv, ty);
    }

    fn truncate(&mut self, pos: usize) {
        self.cache.truncate(pos, self.config.head_dim);
    }

    /// Runs `tokens` at positions `pos..pos + tokens.len()` and returns the requested logits,
    /// `n_vocab` per row (the last row's, every row's, or none).
    ///
    /// `pos` may be at most the number of cached positions; a smaller `pos` first drops the
    /// cached positions from `pos` on (to re-run a different continuation).
    ///
    /// The pass runs inside the model's pool. Called from a thread of that pool (a pool from
    /// [`host_pool`] on the calling thread) it runs on this thread directly; from elsewhere it
    /// is handed to a pool thread, which costs a wake-up per pass and, during decode, CPU time
    /// the pool's idle threads spend looking for work.
    pub fn forward(
        &mut self,
        tokens: &[u32],
        pos: usize,
        which: Logits,
    ) -> Result<&[f32], ModelError> {
        // The whole pass runs on a pool thread: the parallel loops inside it then split work
        // among the workers directly instead of each waking the pool from outside and
        // blocking this thread (two context switches per matmul).
        let pool = self.pool.clone();
        pool.install(|| self.forward_in_pool(tokens, pos, which))?;
        Ok(&self.logits)
    }

    fn forward_in_pool(
        &mut self,
        tokens: &[u32],
        pos: usize,
        which: Logits,
    ) -> Result<(), ModelError> {
        let c = self.config.clone();
        let m = tokens.len();
        if pos > self.cache.len {
            return Err(ModelError::BadPosition {
                pos,
                cached: self.cache.len,
            });
        }
        if pos.checked_add(m).is_none_or(|end| end > c.n_ctx) {
            return Err(ModelError::ContextOverflow {
                pos,
                n_tokens: m,
                n_ctx: c.n_ctx,
            });
        }
        if let Some(&token) = tokens.iter().find(|&&t| t as usize >= c.n_vocab) {
            return Err(ModelError::BadToken {
                token,
                n_vocab: c.n_vocab,
            });
        }
        self.truncate(pos);
        self.logits.clear();
        if m == 0 {
            return Ok(());
        }
        let t_start = Instant::now();
        let mut t_matmul = Duration::ZERO;
        let mut t_attn = Duration::ZERO;
        let (e, qd, kvd) = (c.n_embd, c.q_dim(), c.kv_dim());

        let mut x = vec![0.0f32; m * e];
        for (row, &t) in x.chunks_exact_mut(e).zip(tokens) {
            let s = t as usize * self.embd_row_bytes;
            crate::gguf::dequantize(self.embd_ty, &self.embd[s..s + self.embd_row_bytes], row)?;
        }
        let rope = RopeTable::new(&c, self.rope_freqs.as_deref(), pos, m);
        let mut h = vec![0.0f32; m * e];
        let mut qkv = vec![0.0f32; m * (qd + 2 * kvd)];
        let mut q = vec![0.0f32; m * qd];
        let mut k = vec![0.0f32; m * kvd];
        let mut v = vec![0.0f32; m * kvd];
        let mut att = vec![0.0f32; m * qd];
        let mut gate_up = vec![0.0f32; m * 2 * c.n_ff];
        let mut gate = vec![0.0f32; m * c.n_ff];
        let mut up = vec![0.0f32; m * c.n_ff];

        for (l, layer) in self.layers.iter().enumerate() {
            // Attention block.
            rms_norm(&x, &layer.attn_norm, c.rms_eps, &mut h);
            let t = Instant::now();
            layer.wqkv.forward(&h, m, &mut qkv)?;
            t_matmul += t.elapsed();
            // One row (decode) holds q, k and v side by side: use them in place.
            let [q, k, v] = split_columns(&mut qkv, m, [&mut q, &mut k, &mut v]);
            add_bias(q, layer.bq.as_deref());
            add_bias(k, layer.bk.as_deref());
            add_bias(v, layer.bv.as_deref());
            rope.apply(q, c.n_head);
            rope.apply(k, c.n_head_kv);
            let heads = l * c.n_head_kv..(l + 1) * c.n_head_kv;
            for (cache, new) in [(&mut self.cache.k, &*k), (&mut self.cache.v, &*v)] {
                for row in new.chunks_exact(kvd) {
                    for (buf, head) in cache[heads.clone()]
                        .iter_mut()
                        .zip(row.chunks_exact(c.head_dim))
                    {
                        buf.extend(head);
                    }
                }
            }

            let t = Instant::now();
            let work = m * c.n_head * (pos + m) * c.head_dim;
            attention(
                &c,
                (work >= ATTENTION_PARALLEL_WORK).then_some(&*self.pool),
                q,
                &self.cache.k[heads.clone()],
                &self.cache.v[heads],
                pos,
                &mut att,
            );
            t_attn += t.elapsed();

            let t = Instant::now();
            layer.wo.forward(&att, m, &mut h)?;
            t_matmul += t.elapsed();
            add_into(&mut x, &h);

            // Feed-forward block.
            rms_norm(&x, &layer.ffn_norm, c.rms_eps, &mut h);
            let t = Instant::now();
            layer.w_gate_up.forward(&h, m, &mut gate_up)?;
            t_matmul += t.elapsed();
            let [gate, up] = split_columns(&mut gate_up, m, [&mut gate, &mut up]);
            swiglu(c.n_ff, gate, up);
            let t = Instant::now();
            layer.w_down.forward(gate, m, &mut h)?;
            t_matmul += t.elapsed();
            add_into(&mut x, &h);
        }
        self.cache.len = pos + m;

        let rows = match which {
            Logits::None => 0..0,
            Logits::Last => m - 1..m,
            Logits::All => 0..m,
        };
        if !rows.is_empty() {
            let n = rows.len();
            let sel = &x[rows.start * e..rows.end * e];
            let mut normed = vec![0.0f32; n * e];
            rms_norm(sel, &self.output_norm, c.rms_eps, &mut normed);
            self.logits.resize(n * c.n_vocab, 0.0);
            let t = Instant::now();
            self.output.forward(&normed, n, &mut self.logits)?;
            t_matmul += t.elapsed();
        }
        let total = t_start.elapsed();
        self.stats.forward_calls += 1;
        self.stats.tokens += m as u64;
        self.stats.matmul += t_matmul;
        self.stats.attention += t_attn;
        self.stats.other += total.saturating_sub(t_matmul + t_attn);
        Ok(())
    }
}

/// `out = x / rms(x) * w` per row, as ggml computes it: squares summed in f64 in order, the
/// mean rounded to f32, the scale `1/sqrt(mean + eps)` in f32, then `(x * scale) * w`.
fn rms_norm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let n = w.len();
    by_row_blocks(n, out, x, |out, x| rms_norm_rows(x, w, eps, out));
}

/// Rows per task of the host's row-wise passes (RMSNorm, SwiGLU) on a prompt chunk: a row is
/// about a microsecond of work, a task hand-off about as much.
const ROWS_PER_TASK: usize = 16;

/// `f(out rows, in rows)` over blocks of [`ROWS_PER_TASK`] rows of `width`, on the current
/// rayon pool when there are two blocks or more (a prompt chunk; one decode row stays on this
/// thread). Each row is computed the same way whatever block it is in.
fn by_row_blocks(width: usize, out: &mut [f32], x: &[f32], f: impl Fn(&mut [f32], &[f32]) + Sync) {
    let block = ROWS_PER_TASK * width;
    if out.len() >= 2 * block {
        out.par_chunks_mut(block)
            .zip(x.par_chunks(block))
            .for_each(|(o, x)| f(o, x));
    } else {
        f(out, x);
    }
}

fn rms_norm_rows(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let n = w.len();
    for (xr, or) in x.chunks_exact(n).zip(out.chunks_exact_mut(n)) {
        let sum: f64 = xr.iter().map(|&v| f64::from(v * v)).sum();
        let mean = (sum / n as f64) as f32;
        let scale = 1.0 / (mean + eps).sqrt();
        for ((o, &v), &g) in or.iter_mut().zip(xr).zip(w) {
            *o = (v * scale) * g;
        }
    }
}

/// The parts of a fused output ([m, Σ widths], row `i` the concatenation of row `i` of each
/// part), each [m, width]: for one row the parts are side by side in `fused` and are returned
/// in place; for more, each is copied out into its buffer (whose length gives its width).
fn split_columns<'a, const P: usize>(
    fused: &'a mut [f32],
    m: usize,
    mut parts: [&'a mut Vec<f32>; P],
) -> [&'a mut [f32]; P] {
    let widths = parts.each_ref().map(|p| p.len() / m);
    if m == 1 {
        let mut rest = fused;
        return widths.map(|w| {
            let (part, tail) = std::mem::take(&mut rest).split_at_mut(w);
            rest = tail;
            part
        });
    }
    let row: usize = widths.iter().sum();
    for (i, frow) in fused.chunks_exact(row).enumerate() {
        let mut off = 0;
        for (p, &w) in parts.iter_mut().zip(&widths) {
            p[i * w..(i + 1) * w].copy_from_slice(&frow[off..off + w]);
            off += w;
        }
    }
    parts.map(|p| &mut p[..])
}

fn add_bias(x: &mut [f32], b: Option<&[f32]>) {
    if let Some(b) = b {
        for row in x.chunks_exact_mut(b.len()) {
            for (v, &bb) in row.iter_mut().zip(b) {
                *v += bb;
            }
        }
    }
}

fn add_into(x: &mut [f32], y: &[f32]) {
    for (a, &b) in x.iter_mut().zip(y) {
        *a += b;
    }
}

/// `gate = silu(gate) * up`, with `silu(g) = g / (1 + e^-g)` ([`exp::exp`]), for rows of
/// `width`, on the selected backend ([`kernels::Kernel::swiglu`]: the same bits on each).
fn swiglu(width: usize, gate: &mut [f32], up: &[f32]) {
    let kern = kernels::selected();
    by_row_blocks(width, gate, up, |g, u| kern.swiglu(g, u));
}

/// cos/sin of every rotated pair for the positions of one forward call.
struct RopeTable {
    style: RopeStyle,
    head_dim: usize,
    n_rot: usize,
    /// `[m][n_rot / 2]` pairs of (cos, sin).
    cs: Vec<(f32, f32)>,
}

impl RopeTable {
    /// The angles as ggml computes them: `theta_scale = base^(-2/n_rot)` in f32, the angle of
    /// pair `i` at position `p` the f32 running product `p * theta_scale^i` (times the linear
    /// scale, divided by the file's per-pair frequency factor if any).
    fn new(c: &Config, freq_factors: Option<&[f32]>, pos: usize, m: usize) -> Self {
        let half = c.n_rot / 2;
        let theta_scale = c.rope_base.powf(-2.0 / c.n_rot as f32);
        let mut cs = Vec::with_capacity(m * half);
        for p in pos..pos + m {
            let mut theta = p as f32;
            for i in 0..half {
                let ff = freq_factors.map_or(1.0, |f| f[i]);
                let t = c.rope_freq_scale * (theta / ff);
                cs.push((t.cos(), t.sin()));
                theta *= theta_scale;
            }
        }
        RopeTable {
            style: c.rope_style,
            head_dim: c.head_dim,
            n_rot: c.n_rot,
            cs,
        }
    }

    /// Rotates every head of every row of `x` (`[m][n_heads * head_dim]`).
    fn apply(&self, x: &mut [f32], n_heads: usize) {
        let half = self.n_rot / 2;
        for (r, row) in x.chunks_exact_mut(n_heads * self.head_dim).enumerate() {
            let cs = &self.cs[r * half..(r + 1) * half];
            for head in row.chunks_exact_mut(self.head_dim) {
                for (i, &(cos, sin)) in cs.iter().enumerate() {
                    let (a, b) = match self.style {
                        RopeStyle::Adjacent => (2 * i, 2 * i + 1),
                        RopeStyle::Halves => (i, i + half),
                    };
                    let (x0, x1) = (head[a], head[b]);
                    head[a] = x0 * cos - x1 * sin;
                    head[b] = x0 * sin + x1 * cos;
                }
            }
        }
    }
}

/// Causal grouped-query attention of the `m` query rows at positions `pos..pos + m` over the
/// cached keys/values `0..pos + m` (one buffer per KV head, see [`KvCache`]); `out` is
/// `[m][n_head * head_dim]`.
///
/// Per (row, head): scores `q·k * 1/sqrt(head_dim)` with the canonical dot product; softmax
/// with the maximum subtracted and the sum of exponentials in f64, in position order; the
/// output `Σ_t p_t v_t` accumulated in position order. Nothing depends on `m`.
/// Work (rows × heads × positions × head size) from which [`attention`] is split over the pool.
/// Below it the pass is over in tens of microseconds, less than waking the pool costs, and a
/// woken pool thread competes for the CPUs with the engine's workers (decode at short contexts).
const ATTENTION_PARALLEL_WORK: usize = 1 << 18;

fn attention(
    c: &Config,
    pool: Option<&rayon::ThreadPool>,
    q: &[f32],
    k_cache: &[KvRows],
    v_cache: &[KvRows],
    pos: usize,
    out: &mut [f32],
) {
    let (hd, qd) = (c.head_dim, c.q_dim());
    let m = q.len() / qd;
    let group = c.n_head / c.n_head_kv;
    let scale = 1.0 / (hd as f32).sqrt();
    let kern = kernels::selected();
    thread_local! {
        /// One head's scores, kept per thread (decode calls this 270 times per token).
        static SCORES: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    let one = |idx: usize, o: &mut [f32]| {
        let (r, h) = (idx / c.n_head, idx % c.n_head);
        let g = h / group;
        let n_t = pos + r + 1;
        let mut scores = SCORES.with_borrow_mut(std::mem::take);
        scores.clear();
        scores.resize(n_t, 0.0);
        let qh = &q[r * qd + h * hd..r * qd + (h + 1) * hd];
        match &k_cache[g] {
            KvRows::F32(keys) => kern.dot_rows(qh, keys, hd, &mut scores),
            KvRows::F16(keys) => kern.dot_rows_f16(qh, keys, hd, &mut scores),
        }
        kern.softmax_scaled(&mut scores, scale);
        o.fill(0.0);
        match &v_cache[g] {
            KvRows::F32(values) => kern.add_scaled_rows(&scores, values, hd, o),
            KvRows::F16(values) => kern.add_scaled_rows_f16(&scores, values, hd, o),
        }
        SCORES.with_borrow_mut(|s| *s = scores);
    };
    match pool {
        None => out
            .chunks_mut(hd)
            .enumerate()
            .for_each(|(idx, o)| one(idx, o)),
        // One task per (row, query head), each writing its own head_dim slice of `out`.
        Some(pool) => pool.install(|| {
            out.par_chunks_mut(hd)
                .enumerate()
                .for_each(|(idx, o)| one(idx, o));
        }),
    }
    debug_assert_eq!(out.len(), m * qd);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_columns_gives_each_part_its_columns_in_place_or_copied() {
        for m in [1, 3] {
            // Row i: part a = [10i, 10i+1], part b = [10i+2, 10i+3, 10i+4].
            let mut fused: Vec<f32> = (0..m)
                .flat_map(|i| (0..5).map(move |j| (10 * i + j) as f32))
                .collect();
            let (mut a, mut b) = (vec![0.0; 2 * m], vec![0.0; 3 * m]);
            let [pa, pb] = split_columns(&mut fused, m, [&mut a, &mut b]);
            let want = |w: usize, off: usize| -> Vec<f32> {
                (0..m)
                    .flat_map(|i| (0..w).map(move |j| (10 * i + off + j) as f32))
                    .collect()
            };
            assert_eq!(pa, &want(2, 0)[..], "m={m}");
            assert_eq!(pb, &want(3, 2)[..], "m={m}");
        }
    }

    #[test]
    fn attention_gives_the_same_bits_on_one_thread_and_on_the_pool() {
        let c = Config {
            arch: Architecture::Llama,
            n_vocab: 16,
            n_embd: 48,
            n_layer: 1,
            n_head: 6,
            n_head_kv: 2,
            head_dim: 8,
            n_ff: 32,
            n_ctx: 64,
            rms_eps: 1e-5,
            rope_base: 10_000.0,
            rope_freq_scale: 1.0,
            n_rot: 8,
            rope_style: RopeStyle::Adjacent,
        };
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .unwrap();
        let mut rng = fastrand::Rng::with_seed(5);
        let (pos, m, hd) = (7, 5, c.head_dim);
        let mut random = |n: usize| (0..n).map(|_| rng.f32() - 0.5).collect::<Vec<f32>>();
        let q = random(m * c.q_dim());
        let k: Vec<Vec<f32>> = (0..c.n_head_kv).map(|_| random((pos + m) * hd)).collect();
        let v: Vec<Vec<f32>> = (0..c.n_head_kv).map(|_| random((pos + m) * hd)).collect();
        let rows = |x: &[Vec<f32>]| -> Vec<KvRows> { x.iter().cloned().map(KvRows::F32).collect() };
        let (kr, vr) = (rows(&k), rows(&v));
        let mut serial = vec![0.0; m * c.q_dim()];
        let mut parallel = serial.clone();
        attention(&c, None, &q, &kr, &vr, pos, &mut serial);
        attention(&c, Some(&pool), &q, &kr, &vr, pos, &mut parallel);
        let bits = |x: &[f32]| x.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&serial), bits(&parallel));
        // And it is causal softmax attention (f64 reference).
        let group = c.n_head / c.n_head_kv;
        for r in 0..m {
            for h in 0..c.n_head {
                let (g, qh) = (h / group, &q[(r * c.n_head + h) * hd..][..hd]);
                let n_t = pos + r + 1;
                let scores: Vec<f64> = (0..n_t)
                    .map(|t| {
                        let kt = &k[g][t * hd..(t + 1) * hd];
                        let d: f64 = qh.iter().zip(kt).map(|(&a, &b)| f64::from(a * b)).sum();
                        d / (hd as f64).sqrt()
                    })
                    .collect();
                let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
                let sum: f64 = e.iter().sum();
                for j in 0..hd {
                    let want: f64 = (0..n_t)
                        .map(|t| e[t] / sum * f64::from(v[g][t * hd + j]))
                        .sum();
                    let got = f64::from(serial[(r * c.n_head + h) * hd + j]);
                    assert!(
                        (got - want).abs() < 1e-5,
                        "row {r} head {h}: {got} vs {want}"
                    );
                }
            }
        }
    }

    #[test]
    fn attention_over_an_f16_cache_is_attention_over_its_rounded_values() {
        // On one thread and on the pool: exactly the f32 cache's result on the f16-rounded keys
        // and values (every kernel backend is checked against that in `kernels`).
        let c = Config {
            arch: Architecture::Llama,
            n_vocab: 16,
            n_embd: 128,
            n_layer: 1,
            n_head: 4,
            n_head_kv: 2,
            head_dim: 32,
            n_ff: 32,
            n_ctx: 512,
            rms_eps: 1e-5,
            rope_base: 10_000.0,
            rope_freq_scale: 1.0,
            n_rot: 32,
            rope_style: RopeStyle::Adjacent,
        };
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .unwrap();
        let mut rng = fastrand::Rng::with_seed(6);
        let (pos, m, hd) = (150, 3, c.head_dim);
        let mut random = |n: usize| (0..n).map(|_| rng.f32() * 4.0 - 2.0).collect::<Vec<f32>>();
        let q = random(m * c.q_dim());
        let k: Vec<Vec<f32>> = (0..c.n_head_kv).map(|_| random((pos + m) * hd)).collect();
        let v: Vec<Vec<f32>> = (0..c.n_head_kv).map(|_| random((pos + m) * hd)).collect();
        let round = |x: &Vec<f32>| -> Vec<f32> {
            x.iter().map(|&y| half::f16::from_f32(y).to_f32()).collect()
        };
        let exact_rows =
            |x: &[Vec<f32>]| -> Vec<KvRows> { x.iter().map(|b| KvRows::F32(round(b))).collect() };
        let half_rows = |x: &[Vec<f32>]| -> Vec<KvRows> {
            x.iter()
                .map(|b| {
                    let mut r = KvRows::F16(Vec::new());
                    r.extend(b);
                    r
                })
                .collect()
        };
        let mut want = vec![0.0; m * c.q_dim()];
        attention(
            &c,
            None,
            &q,
            &exact_rows(&k),
            &exact_rows(&v),
            pos,
            &mut want,
        );
        let bits = |x: &[f32]| x.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        for pool in [None, Some(&pool)] {
            let mut got = vec![0.0; m * c.q_dim()];
            attention(&c, pool, &q, &half_rows(&k), &half_rows(&v), pos, &mut got);
            assert_eq!(bits(&got), bits(&want), "pool: {}", pool.is_some());
        }
    }
}
