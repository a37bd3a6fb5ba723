//! How to run the engine ([`EngineConfig`]) and how a linear treats its input
//! ([`LinearOptions`]).

use std::num::NonZeroU16;
use std::time::Duration;

use super::rotation::Rotation;
use super::topology::Pinning;
use crate::error::{Error, Result};

/// The largest `max_m`: the runtime takes at most 512 shapes per dynamic-shape context
/// (`RKNN_MAX_DYNAMIC_SHAPE_NUM`), and the buckets are 1..=32, 64 and the multiples of 128
/// ([`rknn_chip::plan::m_buckets`]).
pub const MAX_M_LIMIT: usize = (512 - rknn_chip::plan::EXACT_M_BUCKETS - 1) * 128;

/// The largest K of an exact W8A8 linear: |q| <= 127 on both sides, so the i32 sum over K
/// stays exact while 127 × 127 × K < 2^31.
pub const MAX_EXACT_K_W8A8: usize = i32::MAX as usize / (127 * 127);

/// How to run the engine.
#[derive(Clone, Debug)]
pub struct EngineConfig {
    /// NPU cores to use (one lane each); default: the chip's core count on hardware, and on an
    /// emulated runtime no more than this machine's CPUs (each emulated core is a busy CPU
    /// thread: more of them than CPUs would make every round wait for the scheduler).
    pub cores: Option<usize>,
    /// Largest M per run; larger inputs are chunked. A multiple of 128 up to
    /// [`MAX_M_LIMIT`] (default 512).
    pub max_m: usize,
    /// Where the workers run (default: the big cores).
    pub pinning: Pinning,
    /// How long an idle worker spins before parking (default 50 µs).
    pub spin: Duration,
    /// Whether the calling thread runs core 0's share of each round itself (default: yes). It
    /// saves a hand-off per round; on the emulator, where every NPU core is a CPU thread, it is
    /// also one busy thread fewer than cores + caller.
    pub caller_runs_core0: bool,
    /// Whether all contexts of one core share one A and one C memory per IOMMU domain
    /// (default: yes). Every NPU memory holds a dma-buf file descriptor, and a process runs out
    /// near 1020 under `ulimit -n 1024`: sharing needs one handle per context (its B) instead
    /// of three (B, A and C). Binding one context's memory in another is \[open\] on
    /// Rockchip's runtime (conformance: `memory.shared_between_contexts`), so when this is on
    /// the engine tries it once when it starts (two tiny contexts) and, if the runtime refuses
    /// it or computes a wrong result, gives every context its own A and C, with one line on
    /// stderr; [`Engine::shares_io_memories`](super::Engine::shares_io_memories) says which.
    pub share_io_memories: bool,
    /// The largest N of one context: each core's share of a linear is split into contexts of
    /// at most this many columns (rounded down to the chip's N alignment), as K is split into
    /// segments. `None` (default): the largest N measured on the chip
    /// ([`Platform::measured_max_n`](rknn_chip::Platform::measured_max_n): 8192 on RK3588),
    /// or the user guide's [`USER_GUIDE_MAX_N`](rknn_chip::USER_GUIDE_MAX_N) (4096) on the
    /// other chips and under the strict shape rules. Whether a runtime accepts more than 4096
    /// is \[open\] (conformance: `rules.n_limit`), so the default is tried once when the
    /// engine starts (one tiny context) and, if the runtime refuses it, the engine uses 4096,
    /// with one line on stderr. A value set here is used as it is. Narrower contexts cost
    /// handles (one more B, and A and C unless shared, per context) and one more run per
    /// context and K segment; [`Engine::max_n_per_context`](super::Engine::max_n_per_context)
    /// gives the value in use.
    pub max_n_per_context: Option<usize>,
    /// Bytes one IOMMU domain holds (default 4 GiB, \[doc\] driver >= 0.9.8). Weights beyond it
    /// are placed in the next domain, automatically.
    pub iommu_domain_bytes: u64,
    /// Bytes of its own shard of each linear's weights that an idle worker reads ahead into the
    /// CPU caches while the caller does the host work before that linear (default:
    /// [`DEFAULT_WARM_BYTES`](super::DEFAULT_WARM_BYTES) on an emulated runtime,
    /// whose cores read B from host memory; 0, off, on hardware, where the NPU reads B by DMA).
    /// The next linear is learned from the order of the forwards; only forwards of at most 32
    /// rows of A (decode, speculative verify passes) are followed by a read-ahead. This is the
    /// starting value: [`Engine::set_warm_bytes`](super::Engine::set_warm_bytes) changes it while the engine runs.
    pub warm_bytes: Option<usize>,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            cores: None,
            max_m: 512,
            pinning: Pinning::BigCores,
            spin: Duration::from_micros(50),
            caller_runs_core0: true,
            share_io_memories: true,
            max_n_per_context: None,
            iommu_domain_bytes: 4 << 30,
            warm_bytes: None,
        }
    }
}

impl EngineConfig {
    /// The context M for `m` rows ([`rknn_chip::plan::m_bucket`], the rule the cost model
    /// prices too): `m` itself up to 32 (decode is 1, or 2 with residual activations; a
    /// speculative verify pass a few more: padding rows would cost as much as real ones), 64
    /// up to 64, else `m` rounded up to a multiple of 128 (prefill chunks: 300 rows run at
    /// 384, not 512, which the field measured as +19 % prefill); at most `max_m`.
    pub fn bucket(&self, m: usize) -> usize {
        rknn_chip::plan::m_bucket(m, self.max_m)
    }

    /// Every bucket: 1, 2, 3, ..., 32, 64, then 128, 256, ..., `max_m`
    /// ([`rknn_chip::plan::m_buckets`]).
    pub fn buckets(&self) -> Vec<usize> {
        rknn_chip::plan::m_buckets(self.max_m)
    }

    pub(crate) fn validate(&self) -> Result<()> {
        if self.max_m == 0 || self.max_m % 128 != 0 || self.max_m > MAX_M_LIMIT {
            return Err(Error::EngineConfig {
                field: "max_m",
                value: self.max_m,
                rule: format!(
                    "must be a positive multiple of 128 up to {MAX_M_LIMIT} (the runtime takes at most 512 shapes per context)"
                ),
            });
        }
        Ok(())
    }
}

/// How a linear treats its input (W8A8).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LinearOptions {
    /// Rotate the input by this rotation (of `in_features` channels) before quantising it; the
    /// weights are rotated once when the linear is made resident (`W x = (W Rᵀ)(R x)`). It
    /// spreads activation outliers over many channels, so per-row int8 loses far less.
    pub rotation: Option<Rotation>,
    /// Quantise each input row twice, as itself and as the residual the first quantisation
    /// left, and run both rows through the NPU: about 15 bits of activation precision from
    /// int8 arithmetic, for a second row of A per input row (free when decode is bound by
    /// reading the weights; twice the NPU work in prefill). Ignored for F16.
    pub residual_activations: bool,
    /// Place the whole linear on this lane (its NPU core) instead of splitting its columns
    /// over every lane (`None`, the default). One run per row chunk on one core instead of one
    /// on each: for many small linears of which a pass runs a few, such as a mixture's
    /// experts, which then run on different cores at once ([`Linear::forward_many`]). A lane
    /// the engine does not have is refused when the linear is placed.
    ///
    /// [`Linear::forward_many`]: super::Linear::forward_many
    pub lane: Option<usize>,
    /// Per-group int4 weights (W4A16 only): instead of one scale per output channel, every
    /// group of this many consecutive input features of an output channel gets its own
    /// asymmetric grid, `w ≈ d·q + o` with `q` in -8..=7, `d = (max - min) / 15` and
    /// `o = min + 8·d` over the group's values. The NPU applies `d` as the per-group scales of its
    /// per-group symmetric B quantisation (quant type 4, the context's `group_size`), so C =
    /// Σ_g d·Σ_{k∈g} q·x; the host adds Σ_g o·S_g(x), `S_g` the row's activations summed over
    /// the group as the NPU sees them (f16). A 4-bit GGUF block (Q4_0, Q4_1, group 32) whose
    /// codes span 0..=15 converts exactly. Costs two f32 per output channel and group beside
    /// the int4 values (group 32: 2 bits per weight more).
    ///
    /// The group must be a multiple of the chip's int4 K alignment (32) and divide its K
    /// segment (4096 on RK3576); the linear's K is padded to a multiple of it. W8A8, F16 and
    /// W4A8 refuse it (W4A8's C is i32: the NPU cannot apply per-group scales to it). Whether
    /// RK3576's runtime runs per-group quantisation for f16 × i4 is \[open\] (the emulator
    /// does; conformance: `quant.per_group_order`), and so is the order of the per-group
    /// parameters, which follows [`Runtime::group_order`](crate::Runtime::group_order). A
    /// rotation mixes the input features and spreads a group's grid over all of them: with a
    /// group, leave [`LinearOptions::rotation`] off.
    pub int4_group: Option<NonZeroU16>,
}

impl LinearOptions {
    /// Checks that the rotation, if any, is of `k` channels (the linear's input features).
    pub(crate) fn check(&self, k: usize) -> Result<()> {
        check_rotation(self.rotation.as_ref(), k)
    }

    /// The per-group size as a `usize`.
    pub(crate) fn group(&self) -> Option<usize> {
        self.int4_group.map(|g| usize::from(g.get()))
    }
}

/// Checks that `rotation`, if any, is of `k` channels (the linear's input features).
pub(crate) fn check_rotation(rotation: Option<&Rotation>, k: usize) -> Result<()> {
    match rotation {
        Some(r) if r.k() != k => Err(Error::Length {
            what: "rotation channels (in_features)",
            expected: k,
            got: r.k(),
        }),
        _ => Ok(()),
    }
}
