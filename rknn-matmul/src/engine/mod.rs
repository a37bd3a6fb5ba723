//! The GEMM engine: resident weights split into per-core shards and K segments, one
//! persistent lane per NPU core, and SIMD host glue (activation quantisation, native A
//! packing, output collection).
//!
//! Follow one call: [`Linear::forward`] (`linear.rs`, the caller's side) rotates and prepares
//! the input once per row on the calling thread (no thread pool is forked for it, which
//! matters at M = 1), posts one task to each worker lane, runs its own lane's shard itself and
//! waits. Each lane (`worker.rs`) packs native A for each K segment of its shard, runs its
//! contexts on its core, accumulates the segments, and finishes straight into its columns of
//! the caller's output (the lanes' columns are disjoint, and the caller waits for every lane
//! before it returns, even when unwinding). Results do not depend on the number of cores:
//! every output element is the same exact integer sum times the same two scales.
//!
//! Where things live:
//! * `config.rs`: [`EngineConfig`], [`LinearOptions`], the M buckets;
//! * `plan.rs`: a linear's plan (padded shape, K segments, shards, each split into contexts
//!   no wider than the chip's N limit), made by [`rknn_chip::plan`] from this runtime's rules,
//!   and its IOMMU domain;
//! * `probe.rs`: the two \[open\] facts the defaults rest on, tried once when the engine
//!   starts (the widest context, A and C shared between contexts);
//! * `format.rs`: **the weight formats**: everything in which W8A8, F16, W4A16 and W4A8
//!   differ (the two int4 formats run only where the chip has their types: RK3576). A new
//!   format is added there, and only there;
//! * `linear.rs`: the caller's side (making a linear resident, its forward);
//! * `worker.rs`: the lanes' side (their state, tasks and shard forward);
//! * `scheduler.rs`: the generic lanes and the hand-off between threads;
//! * `glue.rs` and `glue/`: the host kernels, `rotation.rs`: the input rotation;
//! * `emulator_cache.rs`: the one emulator-only behaviour (idle lanes reading the next
//!   weights into the CPU caches), never constructed on hardware.
//!
//! Any number of threads may use one engine: a round (post to every lane, wait for every
//! reply) holds the lanes' lock, so forwards, registrations and drops take turns.
//!
//! M handling: contexts are dynamic-shape contexts whose M values are every M up to 32 (decode,
//! speculative verify passes), 64, and the multiples of 128 up to
//! [`EngineConfig::max_m`] (rounding 300 up to 384, not to 512: the field measured +19 %
//! prefill from that alone); larger M is processed in chunks of `max_m`. One context per
//! (core, N block, segment) serves every bucket, so the weights are resident once.

mod config;
mod converted;
mod emulator_cache;
mod format;
pub mod glue;
mod linear;
mod out_cols;
mod plan;
mod probe;
mod rotation;
mod scheduler;
mod stats;
pub mod topology;
mod worker;

use std::num::NonZeroU16;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

pub use config::{EngineConfig, LinearOptions, MAX_EXACT_K_W8A8, MAX_M_LIMIT};
pub use converted::{ConvertedBytes, ConvertedWeights};
pub use emulator_cache::DEFAULT_WARM_BYTES;
pub use format::WeightFormat;
pub use linear::{ForwardJob, Linear};
pub use rotation::{HADAMARD_BLOCK, Rotation};
pub use stats::{Phase, PhaseStats, Stats};

use crate::dtype::{self, I8xI8ToI32};
use crate::error::{Error, Result};
use crate::safe::runtime::Runtime;
use converted::WeightRows;
use converted::try_vec;
use format::with_format;
use linear::{Inner, Scratch};
use plan::DomainPlan;
use rknn_chip::plan::LinearPlan;
use scheduler::{Pool, Worker};
use stats::Counters;
use topology::CpuTopology;
use worker::{Task, WorkerState};

/// The engine: one lane per NPU core and the linears registered on it. Cheap to clone;
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

impl Engine {
    /// Starts the lanes on `rt`.
    pub fn new(rt: &Runtime, cfg: EngineConfig) -> Result<Engine> {
        cfg.validate()?;
        let resolved = probe::resolve(rt, &cfg)?;
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
        let inline = cfg
            .caller_runs_core0
            .then(|| WorkerState::new(rt.clone(), stats.clone(), 0, None));
        let first_thread = usize::from(inline.is_some());
        let mut workers = Vec::with_capacity(cores);
        for i in first_thread..cores {
            let (rt, stats, pin, warm) = (rt.clone(), stats.clone(), pin.clone(), warm.clone());
            let init = move || {
                if let Some(cpus) = pin {
                    // Best effort: a container may forbid it; the engine still works unpinned.
                    let _ = topology::pin_current_thread(&cpus);
                }
                WorkerState::new(rt, stats, i, Some(warm))
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
                resolved,
                formats: Mutex::default(),
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

    /// The largest N of one context in use: [`EngineConfig::max_n_per_context`], or the
    /// default the engine's probe settled on when it started.
    pub fn max_n_per_context(&self) -> usize {
        self.inner.resolved.n_limit
    }

    /// Whether the contexts of one core share one A and one C: asked for by
    /// [`EngineConfig::share_io_memories`] and accepted by the runtime when the engine started.
    pub fn shares_io_memories(&self) -> bool {
        self.inner.resolved.share_io
    }

    /// Number of lanes (NPU cores used).
    pub fn workers(&self) -> usize {
        self.inner.pool.len()
    }

    /// Bytes of each linear's weights an idle worker reads ahead, per lane, now
    /// ([`EngineConfig::warm_bytes`]; emulated runtimes only).
    pub fn warm_bytes(&self) -> usize {
        self.inner.warm.load(Ordering::Relaxed)
    }

    /// Sets the bytes of each linear's weights an idle worker reads ahead, per lane (0 turns
    /// the read-ahead off), while the engine runs: the workers read the budget at each idle
    /// spell. Raised from 0, the read-ahead starts again once the workers have seen the order
    /// of the forwards again (within a token of a model). It changes no result, only where
    /// the weights are read from; a benchmark uses it to compare both settings on one model.
    /// No effect on hardware, where the NPU reads the weights by DMA.
    pub fn set_warm_bytes(&self, bytes: usize) {
        self.inner.warm.store(bytes, Ordering::Relaxed);
    }

    /// The NPU memory its linears hold in each IOMMU domain (domain 0 first), in bytes: their
    /// weights (B) and the A and C memories their contexts run with, as booked against
    /// [`EngineConfig::iommu_domain_bytes`].
    pub fn domain_bytes(&self) -> Vec<u64> {
        self.inner
            .domains
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .used()
            .to_vec()
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

    /// One empty task round trip to every lane: the scheduler's dispatch overhead.
    pub fn ping(&self) -> Result<()> {
        self.inner
            .pool
            .round()
            .run_all(|_, _| Some(Task::Ping))
            .map(drop)
    }

    /// Whether the chip runs `format`: its matmul type is in the chip's documented table and
    /// the runtime creates a context of it. Asked once per engine and format, and by every
    /// call that makes or converts a linear before anything else. A format the chip lacks
    /// (W4A16 or W4A8 on RK3588) is [`Error::Unsupported`], naming the scheme (the format),
    /// the chip and [`Runtime::require`]'s reason (from the table, or from the capability
    /// probe when the runtime refuses a type the table lists).
    pub fn check_format(&self, format: WeightFormat) -> Result<()> {
        let rt = &self.inner.rt;
        let t = format.matmul_type();
        let scheme = dtype::Scheme::of(t);
        let mut known = self
            .inner
            .formats
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let verdict = match known.get(&format) {
            Some(v) => v.clone(),
            None => {
                // A type the chip's documented table lacks is refused from the table (no
                // context, no refusal logged by the runtime); one the table lists costs one
                // context; the full probe (every type) runs only to say why a listed type
                // was refused.
                if let Some(Error::Unsupported { reason, .. }) = rt.documented_refusal(t) {
                    known.insert(format, Some(reason.clone()));
                    return Err(Error::Unsupported {
                        scheme,
                        platform: rt.platform(),
                        reason,
                    });
                }
                let v = match rt
                    .try_create(t)
                    .map_or_else(|_| rt.require(scheme), |()| Ok(vec![t]))
                {
                    Ok(types) if types.contains(&t) => None,
                    Ok(types) => Some(format!(
                        "the {format} format runs {}, which the runtime refused (it runs {})",
                        t.c_name(),
                        types
                            .iter()
                            .map(|t| t.c_name())
                            .collect::<Vec<_>>()
                            .join(", ")
                    )),
                    Err(Error::Unsupported { reason, .. }) => Some(reason),
                    Err(e) => return Err(e),
                };
                known.insert(format, v.clone());
                v
            }
        };
        match verdict {
            None => Ok(()),
            Some(reason) => Err(Error::Unsupported {
                scheme,
                platform: rt.platform(),
                reason,
            }),
        }
    }

    /// The plan of W [n, k] in `format` (per-group int4 in groups of `group`, if given) on
    /// this engine's lanes and widest context, once the chip is known to run `format`
    /// ([`Engine::check_format`]).
    fn plan(
        &self,
        n: usize,
        k: usize,
        format: WeightFormat,
        group: Option<usize>,
    ) -> Result<LinearPlan> {
        self.check_format(format)?;
        let inner = &self.inner;
        plan::linear_plan(
            &inner.rt,
            inner.pool.len(),
            (n, k),
            format,
            group,
            inner.resolved.n_limit,
        )
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
        let plan = self.plan(n, k, format, opts.group())?;
        if w.len() != n * k {
            return Err(Error::Length {
                what: "weights (n × k)",
                expected: n * k,
                got: w.len(),
            });
        }
        let mut rows = |first: usize, buf: &mut [f32]| {
            buf.copy_from_slice(&w[first * k..first * k + buf.len()]);
            Ok(())
        };
        with_format!(format, K => Linear::register::<K, Error>(&self.inner, plan, opts, &mut rows))
    }

    /// As [`Engine::linear_with`], with the weights read a few rows at a time, so the whole
    /// matrix is never held in f32 (a model converting its file's tensors): `rows(first, buf)`
    /// fills `buf` with the rows `first..first + buf.len() / k` of W. An error of `rows` is
    /// returned as it is.
    pub fn linear_from_rows<E>(
        &self,
        n: usize,
        k: usize,
        format: WeightFormat,
        opts: LinearOptions,
        mut rows: impl FnMut(usize, &mut [f32]) -> std::result::Result<(), E>,
    ) -> std::result::Result<Linear, E>
    where
        E: From<Error>,
    {
        let plan = self.plan(n, k, format, opts.group())?;
        with_format!(format, K => Linear::register::<K, E>(&self.inner, plan, opts, &mut rows))
    }

    /// Converts W [n, k] into `format` without making it resident, rotated by `rotation` (the
    /// one the linear will run with), reading the rows a few at a time as
    /// [`Engine::linear_from_rows`] does: the weights a program can store and later make
    /// resident with [`Engine::linear_from_converted`], skipping the conversion.
    pub fn convert_from_rows<E>(
        &self,
        n: usize,
        k: usize,
        format: WeightFormat,
        rotation: Option<&Rotation>,
        rows: impl FnMut(usize, &mut [f32]) -> std::result::Result<(), E>,
    ) -> std::result::Result<ConvertedWeights, E>
    where
        E: From<Error>,
    {
        let opts = LinearOptions {
            rotation: rotation.cloned(),
            ..LinearOptions::default()
        };
        self.convert_from_rows_with(n, k, format, &opts, rows)
    }

    /// As [`Engine::convert_from_rows`], with the conversion [`LinearOptions`] set: the
    /// rotation, and per-group int4 ([`LinearOptions::int4_group`]); the other options are
    /// the placement's and ignored here.
    pub fn convert_from_rows_with<E>(
        &self,
        n: usize,
        k: usize,
        format: WeightFormat,
        opts: &LinearOptions,
        mut rows: impl FnMut(usize, &mut [f32]) -> std::result::Result<(), E>,
    ) -> std::result::Result<ConvertedWeights, E>
    where
        E: From<Error>,
    {
        let group = opts.group();
        let plan = self.plan(n, k, format, group)?;
        let rotation = opts.rotation.as_ref();
        config::check_rotation(rotation, k)?;
        with_format!(format, K => {
            let threads = self.inner.pool.len();
            let (b, scales) = Linear::convert::<K, E>(&plan, rotation, group, threads, &mut rows)?;
            Ok(ConvertedWeights::new::<K>(&plan, b, scales, opts.int4_group))
        })
    }

    /// Converts W [n, k] as [`Engine::convert_from_rows`] does, handing the converted rows to
    /// `sink` a few at a time instead of keeping them (a program writing them to a file holds
    /// no more than one step): `sink(first, values, scales)` gets rows `first..` in order, as
    /// little-endian bytes laid out as [`ConvertedWeights`] lays them out (`values` padded to
    /// `k_pad` values per row, int4 two per byte; `scales` one f32 per row for the quantised
    /// formats, empty for F16), then the padding rows up to `n_pad` as zeros. Returns
    /// `(n_pad, k_pad)`.
    pub fn convert_to<E>(
        &self,
        n: usize,
        k: usize,
        format: WeightFormat,
        rotation: Option<&Rotation>,
        rows: impl FnMut(usize, &mut [f32]) -> std::result::Result<(), E>,
        sink: impl FnMut(usize, &[u8], &[u8]) -> std::result::Result<(), E>,
    ) -> std::result::Result<(usize, usize), E>
    where
        E: From<Error>,
    {
        let opts = LinearOptions {
            rotation: rotation.cloned(),
            ..LinearOptions::default()
        };
        self.convert_to_with(n, k, format, &opts, rows, sink)
    }

    /// As [`Engine::convert_to`], with the conversion [`LinearOptions`] set (the rotation and
    /// [`LinearOptions::int4_group`]); with a group, `scales` holds each row's group scales
    /// then offsets ([`ConvertedWeights::scales`]).
    pub fn convert_to_with<E>(
        &self,
        n: usize,
        k: usize,
        format: WeightFormat,
        opts: &LinearOptions,
        mut rows: impl FnMut(usize, &mut [f32]) -> std::result::Result<(), E>,
        mut sink: impl FnMut(usize, &[u8], &[u8]) -> std::result::Result<(), E>,
    ) -> std::result::Result<(usize, usize), E>
    where
        E: From<Error>,
    {
        let group = opts.group();
        let plan = self.plan(n, k, format, group)?;
        let rotation = opts.rotation.as_ref();
        config::check_rotation(rotation, k)?;
        let keep_scales = format.has_scales();
        let threads = self.inner.pool.len();
        with_format!(format, K => Linear::convert_steps::<K, E>(
            &plan,
            rotation,
            group,
            threads,
            &mut rows,
            &mut |first, values, scales| {
                let scales = if keep_scales { scales } else { &[] };
                sink(first, dtype::as_bytes(values), dtype::as_bytes(scales))
            },
        ))?;
        Ok((plan.n_pad, plan.k_pad))
    }

    /// Zeroed converted weights of W [n, k] in `format`, padded as this engine's chip pads
    /// them: to fill from storage ([`ConvertedWeights::values_bytes_mut`],
    /// [`ConvertedWeights::scales_bytes_mut`]) and make resident with
    /// [`Engine::linear_from_converted`].
    pub fn converted_zeroed(
        &self,
        n: usize,
        k: usize,
        format: WeightFormat,
    ) -> Result<ConvertedWeights> {
        self.converted_zeroed_with(n, k, format, None)
    }

    /// As [`Engine::converted_zeroed`], for per-group int4 weights in groups of `int4_group`
    /// ([`LinearOptions::int4_group`]; `None`: as [`Engine::converted_zeroed`]).
    pub fn converted_zeroed_with(
        &self,
        n: usize,
        k: usize,
        format: WeightFormat,
        int4_group: Option<NonZeroU16>,
    ) -> Result<ConvertedWeights> {
        let group = int4_group.map(|g| usize::from(g.get()));
        let plan = self.plan(n, k, format, group)?;
        ConvertedWeights::zeroed(format, (n, k), (plan.n_pad, plan.k_pad), int4_group)
    }

    /// Makes converted weights resident without converting them, each lane packing its rows
    /// into its contexts' memories. `opts.rotation` must be the rotation the weights were
    /// converted with. Weights filled from storage are checked first: padded as this engine's
    /// chip pads them ([`Error::Length`] if not), int8 values in -127..=127 and finite scales
    /// ([`Error::OutOfRange`]); their padding is zeroed.
    pub fn linear_from_converted(
        &self,
        mut w: ConvertedWeights,
        opts: LinearOptions,
    ) -> Result<Linear> {
        if opts.int4_group != w.group {
            return Err(Error::EngineConfig {
                field: "int4_group",
                value: opts.group().unwrap_or(0),
                rule: format!(
                    "must be the group the weights were converted with ({})",
                    w.group.map_or("none".into(), |g| g.to_string())
                ),
            });
        }
        let plan = self.plan(w.n, w.k, w.format, opts.group())?;
        opts.check(w.k)?;
        if w.padded() != (plan.n_pad, plan.k_pad) {
            return Err(Error::Length {
                what: "converted weights (n_pad × k_pad, as this engine's chip pads them)",
                expected: plan.n_pad * plan.k_pad,
                got: w.n_pad * w.k_pad,
            });
        }
        w.check_and_clear_padding()?;
        with_format!(w.format, K => {
            let (b, scales) = w.into_parts::<K>().ok_or(Error::Length {
                what: "converted weights of another format",
                expected: plan.n_pad * plan.k_pad,
                got: 0,
            })?;
            Linear::place::<K>(&self.inner, plan, Arc::new(b), scales, opts)
        })
    }

    /// Makes converted weights held outside the engine resident (a mapped cache file), each
    /// lane packing its rows straight from `bytes` into its contexts' memories: no host copy
    /// of the linear is made. `bytes` holds W [n, k] in `format` laid out as
    /// [`ConvertedWeights`] lays it out for this engine's chip ([`Engine::converted_zeroed`]
    /// gives the padded shape), converted with `opts.rotation`. Checked as
    /// [`Engine::linear_from_converted`] checks (lengths and alignment: [`Error::Length`];
    /// values and scales: [`Error::OutOfRange`]); padding is packed as zeros.
    pub fn linear_from_bytes(
        &self,
        n: usize,
        k: usize,
        format: WeightFormat,
        opts: LinearOptions,
        bytes: Arc<dyn ConvertedBytes>,
    ) -> Result<Linear> {
        let plan = self.plan(n, k, format, opts.group())?;
        opts.check(k)?;
        let values = format.b_bytes((plan.n_pad * plan.k_pad) as u64) as usize;
        if bytes.values().len() != values {
            return Err(Error::Length {
                what: "converted weight bytes (n_pad × k_pad values)",
                expected: values,
                got: bytes.values().len(),
            });
        }
        let per = format::params_per_row(format, opts.group(), plan.k_pad);
        let scales = converted::scales_from_bytes((n, plan.n_pad), per, bytes.scales())?;
        with_format!(format, K => {
            let rows = converted::External::<<K as dtype::MatmulKind>::B> {
                bytes,
                _values: std::marker::PhantomData,
            };
            if std::mem::size_of_val(rows.all()) != values {
                return Err(Error::Length {
                    what: "converted weight bytes aligned for their values",
                    expected: values,
                    got: 0,
                });
            }
            Linear::place::<K>(&self.inner, plan, Arc::new(rows), scales, opts)
        })
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
        opts.check(k)?;
        let plan = self.plan(n, k, WeightFormat::W8A8, opts.group())?;
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
        let k_pad = plan.k_pad;
        let mut qp = try_vec(plan.n_pad * k_pad, 0i8, "quantised weights")?;
        for (dst, src) in qp.chunks_exact_mut(k_pad).zip(q.chunks_exact(k)) {
            dst[..k].copy_from_slice(src);
        }
        let mut sp = scales.to_vec();
        sp.resize(plan.n_pad, 0.0);
        Linear::place::<I8xI8ToI32>(&self.inner, plan, Arc::new(qp), sp, opts)
    }
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
