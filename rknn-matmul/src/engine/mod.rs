//! The GEMM engine: resident weights split into per-core shards and K segments, a per-core
//! scheduler with persistent workers, and SIMD host glue (activation quantisation, native A
//! packing, output collection).
//!
//! Follow one call: [`Linear::forward`] quantises x once per row on the caller thread (no
//! thread pool is forked for it, which matters at M = 1), hands one task to each NPU-core
//! worker, and waits. Each worker packs native A for each K segment of its shard, runs its
//! contexts on its core, accumulates the segments exactly in i32, and scales straight into its
//! columns of the caller's output (the lanes' columns are disjoint, and the round waits for
//! every lane before it returns, even when unwinding). Results do not depend
//! on the number of cores: every output element is the same exact integer sum times the same
//! two scales.
//!
//! Any number of threads may use one engine: a round (post to every worker, wait for every
//! reply) holds the pool's lock, so forwards, registrations and drops take turns.
//!
//! M handling: contexts are dynamic-shape contexts whose M values are every M up to 32 (decode,
//! speculative verify passes), 64, and the multiples of 128 up to
//! [`EngineConfig::max_m`] (rounding 300 up to 384, not to 512: the field measured +19 %
//! prefill from that alone); larger M is processed in chunks of `max_m`. One context per
//! (core, segment) serves every bucket, so the weights are resident once.

mod clock;
pub mod glue;
mod linear;
mod out_cols;
pub(crate) mod prefetch;
mod rotation;
mod scheduler;
mod stats;
pub mod topology;
mod warm;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use half::f16;
use rknn_chip::ElemKind;

pub use linear::{Linear, WeightFormat};
pub use rotation::{HADAMARD_BLOCK, Rotation};
pub use stats::{Phase, PhaseStats, Stats};

use crate::error::{Error, Result};
use crate::matmul::Core;
use crate::runtime::Runtime;
use linear::{Reply, ShardSpec, ShardWeights, Task, WorkerState, plan_shards};
use scheduler::{MAX_WORKERS, Pool, Worker};
use stats::Counters;
use topology::{CpuTopology, Pinning};

/// Up to this many rows, every M is its own bucket.
const EXACT_BUCKETS_UP_TO: usize = 32;

/// The largest `max_m`: the runtime takes at most 512 shapes per dynamic-shape context
/// (`RKNN_MAX_DYNAMIC_SHAPE_NUM`), and the buckets are 1..=32, 64 and the multiples of 128.
pub const MAX_M_LIMIT: usize = (512 - 33) * 128;

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
    /// near 1020 under `ulimit -n 1024`: sharing needs 2 handles per linear and core (context
    /// and B) instead of 4. Binding one context's memory in another is \[open\] on Rockchip's
    /// runtime; turn this off if a board refuses it.
    pub share_io_memories: bool,
    /// Bytes one IOMMU domain holds (default 4 GiB, \[doc\] driver >= 0.9.8). Weights beyond it
    /// are placed in the next domain, automatically.
    pub iommu_domain_bytes: u64,
    /// Bytes of each linear's weights that an idle worker reads ahead into the CPU caches, of
    /// its own shard and as much again of the calling thread's lane's, while the caller does
    /// the host work before that linear (default: [`DEFAULT_WARM_BYTES`] on an emulated runtime,
    /// whose cores read B from host memory; 0, off, on hardware, where the NPU reads B by DMA).
    /// The next linear is learned from the order of the forwards; only forwards of at most 32
    /// rows of A (decode, speculative verify passes) are followed by a read-ahead. This is the
    /// starting value: [`Engine::set_warm_bytes`] changes it while the engine runs.
    pub warm_bytes: Option<usize>,
}

/// [`EngineConfig::warm_bytes`] on an emulated runtime.
pub const DEFAULT_WARM_BYTES: usize = 256 << 10;

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            cores: None,
            max_m: 512,
            pinning: Pinning::BigCores,
            spin: Duration::from_micros(50),
            caller_runs_core0: true,
            share_io_memories: true,
            iommu_domain_bytes: 4 << 30,
            warm_bytes: None,
        }
    }
}

impl EngineConfig {
    /// The context M for `m` rows: `m` itself up to 32 (decode is 1, or 2 with residual
    /// activations; a speculative verify pass a few more: padding rows would cost as much as
    /// real ones), 64 up to 64, else `m` rounded up to a multiple of 128 (prefill chunks: 300
    /// rows run at 384, not 512, which the field measured as +19 % prefill).
    pub fn bucket(&self, m: usize) -> usize {
        if m <= EXACT_BUCKETS_UP_TO {
            m.max(1)
        } else if m <= 64 {
            64
        } else {
            m.div_ceil(128) * 128
        }
        .min(self.max_m)
    }

    /// Every bucket: 1, 2, 3, ..., 32, 64, then 128, 256, ..., `max_m`.
    pub fn buckets(&self) -> Vec<usize> {
        (1..=EXACT_BUCKETS_UP_TO)
            .chain(std::iter::once(64))
            .chain((128..=self.max_m).step_by(128))
            .collect()
    }

    fn validate(&self) -> Result<()> {
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

/// The caller side of a round: the prepared inputs the workers share, recycled from round to
/// round.
#[derive(Default)]
pub(crate) struct Scratch {
    rotated: Vec<f32>,
    residual: Vec<f32>,
    q: Arc<Vec<i8>>,
    scales: Arc<Vec<f32>>,
    x: Arc<Vec<f32>>,
    /// Each lane's share of a chunk quantised on the lanes (rows, then scales), recycled.
    q_parts: [Vec<i8>; MAX_WORKERS],
    scale_parts: [Vec<f32>; MAX_WORKERS],
}

pub(crate) struct Inner {
    rt: Runtime,
    cfg: EngineConfig,
    /// Bytes per lane and linear the workers read ahead (see [`EngineConfig::warm_bytes`]),
    /// shared with them: [`Engine::set_warm_bytes`] changes it while they run.
    warm: Arc<AtomicUsize>,
    pool: Pool<Task, Scratch>,
    stats: Arc<Counters>,
    next_id: AtomicU64,
    domains: Mutex<DomainPlan>,
}

/// Where the engine's NPU memory goes: bytes used per IOMMU domain, and the size of each
/// lane's shared A and C per (lane, domain, format), so that a linear is placed in the first
/// domain with room for its B memories and for whatever the shared pair must grow by.
#[derive(Default)]
struct DomainPlan {
    used: Vec<u64>,
    io: HashMap<(usize, i32, WeightFormat), (u64, u64)>,
}

/// One lane's memory needs for a new linear.
struct LaneNeed {
    lane: usize,
    b: u64,
    a: u64,
    c: u64,
}

impl DomainPlan {
    /// The bytes a linear adds to domain `d`.
    fn delta(&self, d: i32, format: WeightFormat, share: bool, needs: &[LaneNeed]) -> u64 {
        needs
            .iter()
            .map(|n| {
                let io = if share {
                    let (a, c) = self.io.get(&(n.lane, d, format)).copied().unwrap_or((0, 0));
                    n.a.saturating_sub(a) + n.c.saturating_sub(c)
                } else {
                    n.a + n.c
                };
                n.b + io
            })
            .sum()
    }

    /// Gives back a dropped linear's B bytes (the lanes' shared A and C stay).
    fn release(&mut self, d: i32, b: u64) {
        if let Some(u) = usize::try_from(d).ok().and_then(|d| self.used.get_mut(d)) {
            *u = u.saturating_sub(b);
        }
    }

    /// Places a linear in the first domain with room for it and books its bytes.
    fn place(
        &mut self,
        cap: u64,
        format: WeightFormat,
        share: bool,
        needs: &[LaneNeed],
    ) -> Result<(i32, u64)> {
        for d in 0.. {
            let di = usize::try_from(d).unwrap_or(usize::MAX);
            if di == self.used.len() {
                self.used.push(0);
            }
            let delta = self.delta(d, format, share, needs);
            if self.used[di].saturating_add(delta) <= cap {
                self.used[di] += delta;
                if share {
                    for n in needs {
                        let e = self.io.entry((n.lane, d, format)).or_default();
                        *e = (e.0.max(n.a), e.1.max(n.c));
                    }
                }
                return Ok((d, needs.iter().map(|n| n.b).sum()));
            }
            if self.used[di] == 0 {
                // Even an empty domain cannot hold it.
                return Err(Error::EngineConfig {
                    field: "iommu_domain_bytes",
                    value: usize::try_from(cap).unwrap_or(usize::MAX),
                    rule: format!("is smaller than one linear's {delta} bytes of NPU memory"),
                });
            }
        }
        unreachable!("the domain loop returns")
    }
}

/// The engine: one worker per NPU core and the linears registered on it. Cheap to clone;
/// `Send + Sync`, usable from any number of threads.
#[derive(Clone)]
pub struct Engine {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("workers", &self.inner.pool.len())
            .field("config", &self.inner.cfg)
            .finish()
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
}

/// What a weight format needs of the chip: the element kind that sets the alignment.
fn align_kind(format: WeightFormat) -> ElemKind {
    match format {
        WeightFormat::W8A8 => ElemKind::I8,
        WeightFormat::F16 => ElemKind::F16,
    }
}

impl Engine {
    /// Starts the workers on `rt`.
    pub fn new(rt: &Runtime, cfg: EngineConfig) -> Result<Engine> {
        cfg.validate()?;
        let cores = cfg.cores.unwrap_or_else(|| default_cores(rt));
        if cores == 0 || cores > rt.npu_cores() {
            return Err(Error::EngineConfig {
                field: "cores",
                value: cores,
                rule: format!(
                    "must be between 1 and the {} NPU core(s) of {}",
                    rt.npu_cores(),
                    rt.platform()
                ),
            });
        }
        let stats = Arc::new(Counters::new(cores));
        let pin = cfg.pinning.cpus(&CpuTopology::detect());
        let warm = Arc::new(AtomicUsize::new(cfg.warm_bytes.unwrap_or(
            if rt.is_hardware() {
                0
            } else {
                DEFAULT_WARM_BYTES
            },
        )));
        // The calling thread's lane is never idle: it reads nothing ahead.
        let never = Arc::new(AtomicUsize::new(0));
        let inline = cfg
            .caller_runs_core0
            .then(|| WorkerState::new(rt.clone(), stats.clone(), 0, never));
        let first_thread = usize::from(inline.is_some());
        let mut workers = Vec::with_capacity(cores);
        for i in first_thread..cores {
            let (rt, stats, pin, warm) = (rt.clone(), stats.clone(), pin.clone(), warm.clone());
            let init = move || {
                if let Some(cpus) = pin {
                    // Best effort: a container may forbid it; the engine still works unpinned.
                    let _ = topology::pin_current_thread(&cpus);
                }
                WorkerState::new(rt, stats, i, warm)
            };
            workers.push(Worker::spawn(i, cfg.spin, init)?);
        }
        let pool = Pool::new(inline, workers, Scratch::default(), || Task::Exit)?;
        Ok(Engine {
            inner: Arc::new(Inner {
                rt: rt.clone(),
                cfg,
                warm,
                pool,
                stats,
                next_id: AtomicU64::new(1),
                domains: Mutex::new(DomainPlan::default()),
            }),
        })
    }

    /// The runtime.
    pub fn runtime(&self) -> &Runtime {
        &self.inner.rt
    }

    /// The configuration.
    pub fn config(&self) -> &EngineConfig {
        &self.inner.cfg
    }

    /// Number of workers (NPU cores used).
    pub fn workers(&self) -> usize {
        self.inner.pool.len()
    }

    /// Bytes of each linear's weights an idle worker reads ahead, per lane, now
    /// ([`EngineConfig::warm_bytes`]).
    pub fn warm_bytes(&self) -> usize {
        self.inner.warm.load(Ordering::Relaxed)
    }

    /// Sets the bytes of each linear's weights an idle worker reads ahead, per lane (0 turns
    /// the read-ahead off), while the engine runs: the workers read the budget at each idle
    /// spell. Raised from 0, the read-ahead starts again once the workers have seen the order
    /// of the forwards again (within a token of a model). It changes no result, only where
    /// the weights are read from; a benchmark uses it to compare both settings on one model.
    pub fn set_warm_bytes(&self, bytes: usize) {
        self.inner.warm.store(bytes, Ordering::Relaxed);
    }

    /// The per-phase counters.
    pub fn stats(&self) -> Stats {
        self.inner.stats.snapshot()
    }

    /// Each lane's counters (lane 0 first): a lane whose `run` and `collect` take longer than
    /// the others' makes every round wait for it.
    pub fn lane_stats(&self) -> Vec<Stats> {
        self.inner.stats.lanes()
    }

    /// Zeroes the counters.
    pub fn reset_stats(&self) {
        self.inner.stats.reset()
    }

    /// One empty task round trip to every worker: the scheduler's dispatch overhead.
    pub fn ping(&self) -> Result<()> {
        self.inner
            .pool
            .round()
            .run_all(|_, _| Some(Task::Ping))
            .map(drop)
    }

    /// The chip's (K, N) alignment for `format`, from the chip rules and the runtime's shape
    /// rules.
    fn alignment(&self, format: WeightFormat) -> Result<(usize, usize)> {
        let rt = &self.inner.rt;
        let kind = align_kind(format);
        let t = match format {
            WeightFormat::W8A8 => rknn_chip::MatmulType::I8_I8_I32,
            WeightFormat::F16 => rknn_chip::MatmulType::F16_F16_F32,
        };
        rknn_chip::check_type(rt.platform(), t)?;
        let (ka, mut na) =
            rt.platform()
                .alignment(kind)
                .ok_or(rknn_chip::RuleViolation::UnsupportedType {
                    platform: rt.platform(),
                    t,
                })?;
        if kind == ElemKind::F16 {
            na = na.max(rt.shape_rules().f16_n_align);
        }
        Ok((ka, na))
    }

    /// Checks a linear's shape and returns (k_pad, n_pad, n_align).
    fn padded(&self, n: usize, k: usize, format: WeightFormat) -> Result<(usize, usize, usize)> {
        rknn_chip::check_dims(1, k, n)?;
        if format == WeightFormat::W8A8 && k > MAX_EXACT_K_W8A8 {
            return Err(Error::KTooLargeForExactSum {
                k,
                max: MAX_EXACT_K_W8A8,
            });
        }
        let (ka, na) = self.alignment(format)?;
        let round = |v: usize, a: usize| v.div_ceil(a) * a;
        let (k_pad, n_pad) = (round(k, ka), round(n, na));
        if k_pad.checked_mul(n_pad).is_none() {
            return Err(Error::SizeOverflow {
                what: "padded weight elements (N × K)",
                value: (k_pad as u128 * n_pad as u128).to_string(),
                limit: "usize",
            });
        }
        Ok((k_pad, n_pad, na))
    }

    /// Makes W [n, k] (row-major, row = output channel) resident in `format`.
    pub fn linear(&self, w: &[f32], n: usize, k: usize, format: WeightFormat) -> Result<Linear> {
        self.linear_with(w, n, k, format, LinearOptions::default())
    }

    /// As [`Engine::linear`], with [`LinearOptions`]: with a rotation, the weights are rotated
    /// once here and every forward rotates its input before quantising it, which keeps W8A8
    /// close to the f32 result. Fuse linears that read the same input (q, k and v; gate and up)
    /// into one to transform that input once.
    pub fn linear_with(
        &self,
        w: &[f32],
        n: usize,
        k: usize,
        format: WeightFormat,
        opts: LinearOptions,
    ) -> Result<Linear> {
        let LinearOptions {
            rotation,
            residual_activations,
        } = opts;
        let (k_pad, n_pad, na) = self.padded(n, k, format)?;
        if w.len() != n * k {
            return Err(Error::Length {
                what: "weights (n × k)",
                expected: n * k,
                got: w.len(),
            });
        }
        if let Some(r) = &rotation {
            if r.k() != k {
                return Err(Error::Length {
                    what: "rotation channels (in_features)",
                    expected: k,
                    got: r.k(),
                });
            }
        }
        let rotated;
        let w = match &rotation {
            Some(r) => {
                let mut v = try_copy(w, "rotated weights")?;
                r.apply_rows(&mut v);
                rotated = v;
                &rotated[..]
            }
            None => w,
        };
        let linear = match format {
            WeightFormat::W8A8 => {
                let mut q = try_vec(n_pad * k_pad, 0i8, "quantised weights")?;
                let mut scales = vec![0f32; n_pad];
                glue::quantize_rows(w, n, k, k_pad, &mut q, &mut scales);
                self.register(n, k, k_pad, n_pad, na, format, |r0, rows| {
                    Ok(ShardWeights::I8 {
                        q: try_copy(&q[r0 * k_pad..(r0 + rows) * k_pad], "a shard's weights")?,
                        ch_scales: scales[r0..r0 + rows].to_vec(),
                    })
                })
            }
            WeightFormat::F16 => {
                let mut h = try_vec(n_pad * k_pad, f16::ZERO, "f16 weights")?;
                for (dst, src) in h.chunks_exact_mut(k_pad).zip(w.chunks_exact(k)) {
                    for (d, &s) in dst.iter_mut().zip(src) {
                        *d = f16::from_f32(s);
                    }
                }
                self.register(n, k, k_pad, n_pad, na, format, |r0, rows| {
                    Ok(ShardWeights::F16 {
                        w: try_copy(&h[r0 * k_pad..(r0 + rows) * k_pad], "a shard's weights")?,
                    })
                })
            }
        };
        let mut linear = linear?;
        linear.rotation = rotation;
        linear.residual = residual_activations && format == WeightFormat::W8A8;
        Ok(linear)
    }

    /// Makes already-quantised W8A8 weights resident: `q` [n, k] int8 (row = output channel,
    /// values in -127..=127) with one scale per row.
    pub fn linear_quantized(&self, q: &[i8], scales: &[f32], n: usize, k: usize) -> Result<Linear> {
        self.linear_quantized_with(q, scales, n, k, LinearOptions::default())
    }

    /// As [`Engine::linear_quantized`] with [`LinearOptions`]; with a rotation, the weights
    /// must have been quantised after it was applied to their rows (so a model can convert its
    /// weights a few rows at a time, rotating and quantising them with [`Rotation::apply_rows`]
    /// and [`glue::quantize_rows`], without holding them in f32); every forward rotates its
    /// input the same way.
    pub fn linear_quantized_with(
        &self,
        q: &[i8],
        scales: &[f32],
        n: usize,
        k: usize,
        opts: LinearOptions,
    ) -> Result<Linear> {
        let LinearOptions {
            rotation,
            residual_activations,
        } = opts;
        if let Some(r) = &rotation {
            if r.k() != k {
                return Err(Error::Length {
                    what: "rotation channels (in_features)",
                    expected: k,
                    got: r.k(),
                });
            }
        }
        let (k_pad, n_pad, na) = self.padded(n, k, WeightFormat::W8A8)?;
        if q.len() != n * k {
            return Err(Error::Length {
                what: "quantised weights (n × k)",
                expected: n * k,
                got: q.len(),
            });
        }
        if scales.len() != n {
            return Err(Error::Length {
                what: "weight scales (one per output channel, n)",
                expected: n,
                got: scales.len(),
            });
        }
        if let Some((index, &v)) = q.iter().enumerate().find(|(_, v)| **v == i8::MIN) {
            return Err(Error::OutOfRange {
                what: "quantised weights",
                index,
                value: v.into(),
                range: "-127..=127 (the exactness bound of the K sum assumes |q| <= 127)",
            });
        }
        let mut qp = try_vec(n_pad * k_pad, 0i8, "quantised weights")?;
        for (dst, src) in qp.chunks_exact_mut(k_pad).zip(q.chunks_exact(k)) {
            dst[..k].copy_from_slice(src);
        }
        let mut sp = scales.to_vec();
        sp.resize(n_pad, 0.0);
        let mut linear =
            self.register(n, k, k_pad, n_pad, na, WeightFormat::W8A8, |r0, rows| {
                Ok(ShardWeights::I8 {
                    q: try_copy(&qp[r0 * k_pad..(r0 + rows) * k_pad], "a shard's weights")?,
                    ch_scales: sp[r0..r0 + rows].to_vec(),
                })
            })?;
        linear.rotation = rotation;
        linear.residual = residual_activations;
        Ok(linear)
    }

    #[allow(clippy::too_many_arguments)] // The shape of the linear, resolved once.
    fn register(
        &self,
        n: usize,
        k: usize,
        k_pad: usize,
        n_pad: usize,
        align: usize,
        format: WeightFormat,
        shard: impl Fn(usize, usize) -> Result<ShardWeights>,
    ) -> Result<Linear> {
        let inner = &self.inner;
        let rt = &inner.rt;
        // Split K where the chip says (8192 on RK3588: one context above it ran 14x slower),
        // else below its K limit; a chip with neither takes K in one context.
        let seg = rt
            .platform()
            .k_segment()
            .or(rt.shape_rules().max_k)
            .map(|s| s - s % align_k(rt, format))
            .filter(|&s| s > 0)
            .unwrap_or(k_pad);
        let segments: Arc<[(usize, usize)]> = (0..k_pad)
            .step_by(seg)
            .map(|k0| (k0, seg.min(k_pad - k0)))
            .collect();
        let buckets: Arc<[usize]> = inner.cfg.buckets().into();
        let plans = plan_shards(n, n_pad, align, inner.pool.len());
        let multi = rt.platform().has_core_mask();
        let share_io = inner.cfg.share_io_memories;
        // Bytes per element of B and A (i8, or f16) and of C (i32 or f32).
        let (eb, ec) = match format {
            WeightFormat::W8A8 => (1u64, 4u64),
            WeightFormat::F16 => (2, 4),
        };
        let (max_m, ks_max) = (inner.cfg.max_m as u64, seg.min(k_pad) as u64);
        // Shared: one A and C per lane and domain; else one pair per K segment.
        let pairs = if share_io { 1 } else { segments.len() as u64 };
        let needs: Vec<LaneNeed> = plans
            .iter()
            .enumerate()
            .filter_map(|(lane, p)| {
                let p = p.as_ref()?;
                let w = p.width as u64;
                Some(LaneNeed {
                    lane,
                    b: w * k_pad as u64 * eb,
                    a: max_m * ks_max * eb * pairs,
                    c: max_m * w * ec * pairs,
                })
            })
            .collect();
        let (domain, b_bytes) = inner
            .domains
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .place(inner.cfg.iommu_domain_bytes, format, share_io, &needs)?;
        let id = inner
            .next_id
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let linear = Linear {
            inner: inner.clone(),
            id,
            n,
            k,
            k_pad,
            format,
            shards: plans.clone(),
            rotation: None,
            residual: false,
            domain,
            b_bytes,
        };
        // Each worker's copy of its weights, made before the round so that a host that cannot
        // hold them is an error here. On failure, dropping `linear` gives back what was booked
        // (and removes the shards that were built, below).
        let mut weights = plans
            .iter()
            .map(|p| p.map(|plan| shard(plan.n0, plan.width)).transpose())
            .collect::<Result<Vec<_>>>()?;
        let built = inner.pool.round().run_all(|i, _| {
            let weights = weights[i].take()?;
            plans[i].map(|plan| Task::Register {
                id,
                spec: Box::new(ShardSpec {
                    weights,
                    plan,
                    k_pad,
                    segments: segments.clone(),
                    buckets: buckets.clone(),
                    core: if multi { Core::Index(i) } else { Core::Auto },
                    domain,
                    share_io,
                }),
            })
        })?;
        // The calling thread's lane is never idle: the workers read its weights ahead too,
        // each a share of the first `warm` bytes (registered whatever the budget is now, which
        // `set_warm_bytes` may raise later).
        let workers = inner.pool.len().saturating_sub(1);
        let caller_lane = match &built[0] {
            Some(Reply::Registered(ranges)) if inner.pool.has_inline_lane() => Some(ranges),
            _ => None,
        };
        if let Some(caller_lane) = caller_lane.filter(|_| workers > 0) {
            inner.pool.round().run_all(|i, _| {
                // Lane 0 is the calling thread's own; workers without a shard never run it.
                if i == 0 || plans[i].is_none() {
                    return None;
                }
                Some(Task::Peer {
                    id,
                    parts: caller_lane.clone(),
                    slot: i - 1,
                    slots: workers,
                })
            })?;
        }
        Ok(linear)
    }
}

/// `len` copies of `value`, or [`Error::HostAlloc`] when the host cannot back them: weight
/// buffers are sized by the caller's matrices, and on a small board running out must be an
/// error, not an abort.
pub(crate) fn try_vec<T: Clone>(len: usize, value: T, what: &'static str) -> Result<Vec<T>> {
    let mut v = Vec::new();
    v.try_reserve_exact(len).map_err(|_| Error::HostAlloc {
        what,
        bytes: (len as u64).saturating_mul(std::mem::size_of::<T>() as u64),
    })?;
    v.resize(len, value);
    Ok(v)
}

/// A copy of `src`, or [`Error::HostAlloc`] (see [`try_vec`]).
pub(crate) fn try_copy<T: Clone>(src: &[T], what: &'static str) -> Result<Vec<T>> {
    let mut v = Vec::new();
    v.try_reserve_exact(src.len())
        .map_err(|_| Error::HostAlloc {
            what,
            bytes: (src.len() as u64).saturating_mul(std::mem::size_of::<T>() as u64),
        })?;
    v.extend_from_slice(src);
    Ok(v)
}

/// The default number of cores (see [`EngineConfig::cores`]).
fn default_cores(rt: &Runtime) -> usize {
    if rt.is_hardware() {
        rt.npu_cores()
    } else {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        rt.npu_cores().min(cpus)
    }
}

/// The K alignment of `format` on the runtime's chip (checked supported by the caller).
fn align_k(rt: &Runtime, format: WeightFormat) -> usize {
    rt.platform()
        .alignment(align_kind(format))
        .map_or(1, |(k, _)| k)
}
