//! The model: the decoder-only transformer's forward pass over weights loaded from a GGUF
//! file, for the families of [`FAMILIES`] (`llama`, `qwen2`, `qwen3`, `gemma3`, `phi3`,
//! `smollm3`, `granite`, `gemma2`, `qwen3moe`, `olmoe`, `lfm2`, `granitemoe`, `lfm2moe`, `qwen35`), every
//! weight matmul through one seam.
//!
//! * `family/`: one [`Family`] per architecture, as data plus one small file each;
//! * `config.rs`: [`Config`], the hyper-parameters read from the metadata;
//! * `load.rs`: [`Model`], the weights (immutable once loaded, shared by any number of
//!   sequences) built through a [`LinearFactory`];
//! * `forward.rs`: [`Model::forward`] over a [`Sequence`] (one sequence's KV cache and logits);
//! * `embed.rs`: [`Model::embed`], inputs' final hidden states pooled ([`Pooling`]) and
//!   L2-normalised;
//! * `delta_net.rs`: Qwen3.5's gated delta-net layers (host arithmetic, per-sequence state);
//! * `ops.rs`: the host operations (RMSNorm, RoPE, attention, SwiGLU), `kernels.rs` their SIMD
//!   kernels, `kv_cache.rs` the cache;
//! * `backend.rs`: the seam ([`LinearOp`], [`LinearFactory`]); `host.rs` the f32 reference
//!   backend, `npu.rs` the NPU backend (the engine of `rknn-matmul`);
//! * `weight_cache/`: [`WeightCache`], the NPU backend's converted weights kept on disk, so
//!   that only a model's first load converts.

mod backend;
mod config;
mod delta_net;
mod embed;
mod error;
pub(crate) mod exp;
mod family;
mod forward;
mod host;
mod host_pool;
pub mod kernels;
mod kv_cache;
mod load;
mod moe;
mod npu;
mod ops;
pub mod weight_cache;

pub use backend::{BackendError, LinearFactory, LinearOp, OpJob, forward_many, stacked_shape};
pub use config::{
    Activation, Config, DeltaNet, Family, Gating, LONG_ROPE_CTX_PAD, LongRope, MAX_EXPERTS,
    MAX_L_CACHE, Moe, QkNorm, RopeStyle, ShortConv, SlidingWindow,
};
pub use delta_net::{CHECKPOINTS, REPLAY_ROWS};
pub use embed::{EMBED_PASS_ROWS, Embedder, Pooling};
pub use error::ModelError;
pub use family::FAMILIES;
pub use forward::{BatchItem, Logits, Sequence, Stats};
pub use host::{F32Linear, HostF32Factory};
pub use host_pool::{HostPool, host_pool};
pub use kv_cache::{CacheType, KvCache, REWIND};
pub use load::{Footprint, Model, Progress};
pub use npu::{EngineFactory, EngineOptions, ExpertPlacement, INT4_GROUP_MAX_GGUF_BITS};
/// Which linear of the model a weight is, and which linears quantise their activations twice:
/// defined with the engine's plan in `rknn-chip`, where the cost model of `rknn-emu` names them
/// too.
pub use rknn_chip::{LinearRole, Residual};
pub use weight_cache::{CacheOutcome, WeightCache};
