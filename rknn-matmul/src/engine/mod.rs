//! The GEMM engine: resident weights split into per-core shards and K segments, a per-core
//! scheduler with persistent workers, and SIMD host glue (activation quantisation, native A
//! packing, output collection).
//!
//! Follow one call: [`Linear::forward`] quantises x once per row on the caller thread (no
//! thread pool is forked for it, which matters at M = 1), hands one task to each NPU-core
//! worker, and waits. Each worker packs native A for each K segment of its shard, runs its
//! contexts on its core, accumulates the segments exactly in i32, and scales into its own
//! columns of the output. Results do not depend on the number of cores: every output element
//! is the same exact integer sum times the same two scales.
//!
//! M handling: contexts are dynamic-shape contexts whose M values are 1 and multiples of 128
//! up to [`EngineConfig::max_m`] (rounding 300 up to 384, not to 512: the field measured +19 %
//! prefill from that alone); larger M is processed in chunks of `max_m`. One context per
//! (core, segment) serves every bucket, so the weights are resident once.

pub mod glue;
mod linear;
mod scheduler;
mod stats;
pub mod topology;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use half::f16;

pub use linear::{Linear, WeightFormat};
pub use stats::{Phase, PhaseStats, Stats};

use crate::error::{Error, Result};
use crate::matmul::Core;
use crate::runtime::Runtime;
use linear::{ShardWeights, Task, WorkerState, make_spec, plan_shards};
use scheduler::{Pool, Worker};
use stats::Counters;
use topology::{CpuTopology, Pinning};

/// How to run the engine.
#[derive(Clone, Debug)]
pub struct EngineConfig {
    /// Workers (one per NPU core); default: the chip's core count.
    pub cores: Option<usize>,
    /// Largest M per run; larger inputs are chunked. A multiple of 128 (default 512).
    pub max_m: usize,
    /// Where the workers run (default: the big cores).
    pub pinning: Pinning,
    /// How long an idle worker spins before parking (default 50 µs).
    pub spin: Duration,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            cores: None,
            max_m: 512,
            pinning: Pinning::BigCores,
            spin: Duration::from_micros(50),
        }
    }
}

impl EngineConfig {
    /// The context M for `m` rows: 1 for decode, else `m` rounded up to a multiple of 128.
    pub fn bucket(&self, m: usize) -> usize {
        if m <= 1 { 1 } else { m.div_ceil(128) * 128 }.min(self.max_m)
    }

    /// Every bucket: 1, 128, 256, ..., `max_m`.
    pub fn buckets(&self) -> Vec<usize> {
        std::iter::once(1)
            .chain((128..=self.max_m).step_by(128))
            .collect()
    }
}

#[derive(Default)]
struct CallerScratch {
    q: Vec<i8>,
    scales: Vec<f32>,
    x: Vec<f32>,
}

pub(crate) struct Inner {
    rt: Arc<Runtime>,
    cfg: EngineConfig,
    pool: Pool<Task>,
    stats: Arc<Counters>,
    scratch: Mutex<CallerScratch>,
    next_id: std::sync::atomic::AtomicU64,
}

/// The engine: one worker per NPU core and the linears registered on it. Cheap to clone.
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

impl Engine {
    /// Starts the workers on `rt`.
    pub fn new(rt: Arc<Runtime>, cfg: EngineConfig) -> Result<Engine> {
        if cfg.max_m == 0 || cfg.max_m % 128 != 0 {
            return Err(Error::Invalid(format!(
                "max_m={} must be a positive multiple of 128",
                cfg.max_m
            )));
        }
        let cores = cfg.cores.unwrap_or(rt.npu_cores());
        if cores == 0 || cores > rt.npu_cores() {
            return Err(Error::Invalid(format!(
                "{} has {} NPU core(s); {cores} workers asked",
                rt.platform(),
                rt.npu_cores()
            )));
        }
        let stats = Arc::new(Counters::default());
        let pin = cfg.pinning.cpus(&CpuTopology::detect());
        let mut workers = Vec::with_capacity(cores);
        for i in 0..cores {
            let (rt, stats, pin) = (rt.clone(), stats.clone(), pin.clone());
            let init = move || {
                if let Some(cpus) = pin {
                    // Best effort: a container may forbid it; the engine still works unpinned.
                    let _ = topology::pin_current_thread(&cpus);
                }
                WorkerState::new(rt, stats)
            };
            workers.push(Worker::spawn(
                format!("rknn-core{i}"),
                cfg.spin,
                init,
                |t| matches!(t, Task::Exit),
            )?);
        }
        let pool = Pool::new(workers, || Task::Exit);
        let inner = Inner {
            rt,
            cfg,
            pool,
            stats,
            scratch: Mutex::new(CallerScratch::default()),
            next_id: 1.into(),
        };
        Ok(Engine {
            inner: Arc::new(inner),
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

    /// The per-phase counters.
    pub fn stats(&self) -> Stats {
        self.inner.stats.snapshot()
    }

    /// Zeroes the counters.
    pub fn reset_stats(&self) {
        self.inner.stats.reset()
    }

    /// One empty task round trip to every worker: the scheduler's dispatch overhead.
    pub fn ping(&self) -> Result<()> {
        self.inner.pool.run_all(|_| Some(Task::Ping))
    }

    /// Makes W [n, k] (row-major, row = output channel) resident in `format`.
    pub fn linear(&self, w: &[f32], n: usize, k: usize, format: WeightFormat) -> Result<Linear> {
        if w.len() != n * k || n == 0 || k == 0 {
            return Err(Error::Size {
                what: "weights (n × k)",
                expected: n * k,
                got: w.len(),
            });
        }
        let k_pad = k.div_ceil(32) * 32;
        match format {
            WeightFormat::W8A8 => {
                let n_pad = n.div_ceil(32) * 32;
                let mut q = vec![0i8; n_pad * k_pad];
                let mut scales = vec![0f32; n_pad];
                glue::quantize_rows(w, n, k, k_pad, &mut q, &mut scales);
                self.register(n, k, k_pad, format, 32, |r0, rows| ShardWeights::I8 {
                    q: q[r0 * k_pad..(r0 + rows) * k_pad].to_vec(),
                    ch_scales: scales[r0..r0 + rows].to_vec(),
                })
            }
            WeightFormat::F16 => {
                let n_pad = n.div_ceil(16) * 16;
                let mut h = vec![f16::ZERO; n_pad * k_pad];
                for (dst, src) in h.chunks_exact_mut(k_pad).zip(w.chunks_exact(k)) {
                    for (d, &s) in dst.iter_mut().zip(src) {
                        *d = f16::from_f32(s);
                    }
                }
                self.register(n, k, k_pad, format, 16, |r0, rows| ShardWeights::F16 {
                    w: h[r0 * k_pad..(r0 + rows) * k_pad].to_vec(),
                })
            }
        }
    }

    /// Makes already-quantised W8A8 weights resident: `q` [n, k] int8 (row = output channel,
    /// values in -127..=127) with one scale per row.
    pub fn linear_quantized(&self, q: &[i8], scales: &[f32], n: usize, k: usize) -> Result<Linear> {
        if q.len() != n * k || scales.len() != n || n == 0 || k == 0 {
            return Err(Error::Size {
                what: "quantised weights (n × k) and n scales",
                expected: n * k,
                got: q.len(),
            });
        }
        let k_pad = k.div_ceil(32) * 32;
        let n_pad = n.div_ceil(32) * 32;
        let mut qp = vec![0i8; n_pad * k_pad];
        for (dst, src) in qp.chunks_exact_mut(k_pad).zip(q.chunks_exact(k)) {
            dst[..k].copy_from_slice(src);
        }
        let mut sp = scales.to_vec();
        sp.resize(n_pad, 0.0);
        self.register(n, k, k_pad, WeightFormat::W8A8, 32, |r0, rows| {
            ShardWeights::I8 {
                q: qp[r0 * k_pad..(r0 + rows) * k_pad].to_vec(),
                ch_scales: sp[r0..r0 + rows].to_vec(),
            }
        })
    }

    fn register(
        &self,
        n: usize,
        k: usize,
        k_pad: usize,
        format: WeightFormat,
        align: usize,
        shard: impl Fn(usize, usize) -> ShardWeights,
    ) -> Result<Linear> {
        let inner = &self.inner;
        let rt = &inner.rt;
        let n_pad = n.div_ceil(align) * align;
        // Chips without a documented segment still split below the header's K limit of 10240.
        let seg = rt.platform().k_segment().unwrap_or(8192);
        let segments: Vec<(usize, usize)> = (0..k_pad)
            .step_by(seg)
            .map(|k0| (k0, seg.min(k_pad - k0)))
            .collect();
        let plans = plan_shards(n, n_pad, align, inner.pool.len());
        let multi = rt.platform().has_core_mask();
        let buckets = inner.cfg.buckets();
        let id = inner
            .next_id
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let present: Vec<bool> = plans.iter().map(Option::is_some).collect();
        let linear = Linear {
            inner: inner.clone(),
            id,
            n,
            k,
            k_pad,
            format,
            present,
        };
        // On failure, dropping `linear` removes the shards that were built.
        inner.pool.run_all(|i| {
            plans[i].as_ref().map(|p| {
                let core = if multi { Core::Index(i) } else { Core::Auto };
                Task::Register {
                    id,
                    spec: make_spec(shard(p.n0, p.width), p, k_pad, &segments, &buckets, core),
                }
            })
        })?;
        Ok(linear)
    }
}
