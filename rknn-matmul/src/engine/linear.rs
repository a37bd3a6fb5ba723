//! The caller's side of the engine: a resident [`Linear`], how it is made resident, and its
//! forward pass as the calling thread runs it.
//!
//! A forward chunk: the caller rotates and prepares the input rows once (quantised per row for
//! W8A8; on every lane, a share each, for a prompt chunk), posts one [`Forward`] to each worker
//! lane, runs its own lane's shard itself (lane 0, [`EngineConfig::caller_runs_core0`]) and
//! waits for the others. Every lane writes its columns of the caller's output in place.

use std::sync::atomic::{AtomicU64, AtomicUsize};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use rknn_chip::plan::{LinearPlan, MChunk, m_chunks};

use super::config::{EngineConfig, LinearOptions};
use super::converted::{WeightRows, try_vec};
use super::format::{
    EngineKind, InElem, Prepared, WeightFormat, params_per_row, row_len, with_format,
};
use super::out_cols::OutCols;
use super::plan::{DomainPlan, lane_needs};
use super::probe::Resolved;
use super::rotation::Rotation;
use super::scheduler::{MAX_WORKERS, Pool, Round};
use super::stats::{Counters, Phase};
use super::worker::{Forward, PrepareRows, Reply, ShardSpec, Task};
use crate::error::{Error, Result};
use crate::safe::matmul::Core;
use crate::safe::runtime::Runtime;

/// What an engine and its linears share: the runtime, the lanes, the counters, and the plan of
/// the NPU memory.
pub(crate) struct Inner {
    pub(crate) rt: Runtime,
    pub(crate) cfg: EngineConfig,
    /// Bytes per lane and linear the workers read ahead on an emulated runtime
    /// ([`EngineConfig::warm_bytes`]), shared with them.
    pub(crate) warm: Arc<AtomicUsize>,
    pub(crate) pool: Pool<Task, Scratch>,
    pub(crate) stats: Arc<Counters>,
    pub(crate) next_id: AtomicU64,
    pub(crate) domains: Mutex<DomainPlan>,
    /// The widest context and the A/C sharing the engine runs with, after its probes.
    pub(crate) resolved: Resolved,
    /// Each format asked for so far, and why the chip cannot run it (`None`: it can), from
    /// the runtime's capability probe ([`Runtime::require`]), tried once per format.
    pub(crate) formats: Mutex<rustc_hash::FxHashMap<WeightFormat, Option<String>>>,
}

/// The caller side of a round: the prepared inputs the lanes share, recycled from round to
/// round.
#[derive(Default)]
pub(crate) struct Scratch {
    rotated: Vec<f32>,
    tmp: Vec<f32>,
    input: Arc<Prepared>,
    x: Arc<Vec<f32>>,
    /// Each lane's share of a chunk prepared on the lanes, recycled.
    parts: [Prepared; MAX_WORKERS],
    /// The inputs of a [`Linear::forward_many`] round, one per job, recycled.
    many: Vec<Arc<Prepared>>,
}

/// One forward of a [`Linear::forward_many`] group: `out` [m, N] = `x` [m, K] × Wᵀ.
#[derive(Debug)]
pub struct ForwardJob<'a> {
    /// The linear.
    pub linear: &'a Linear,
    /// The input rows, `m × in_features`.
    pub x: &'a [f32],
    /// Rows.
    pub m: usize,
    /// The output rows, `m × out_features`, written in place.
    pub out: &'a mut [f32],
}

/// A weight matrix resident on the NPU, shared over the engine's cores. `Send + Sync`: any
/// number of threads may call [`Linear::forward`] at once (their rounds take turns).
///
/// ```
/// # if !cfg!(feature = "emulator") { return Ok(()); } // the emulator is not compiled in
/// use rknn_matmul::engine::{Engine, EngineConfig, WeightFormat};
/// use rknn_matmul::{Platform, Runtime};
/// let engine = Engine::new(&Runtime::emulator(Platform::Rk3588)?, EngineConfig::default())?;
/// // W: 3 outputs × 4 inputs (any N and K: the engine pads to the chip's alignment).
/// let w = [1.0, 0.0, 0.0, 0.0, 0.0, 2.0, 0.0, 0.0, 0.0, 0.0, 0.0, -1.0];
/// let lin = engine.linear(&w, 3, 4, WeightFormat::F16)?;
/// let y = lin.forward_vec(&[1.0, 2.0, 3.0, 4.0], 1)?;
/// assert_eq!(y, [1.0, 4.0, -4.0]);
/// # Ok::<(), rknn_matmul::Error>(())
/// ```
pub struct Linear {
    inner: Arc<Inner>,
    id: u64,
    plan: LinearPlan,
    format: WeightFormat,
    /// The rotation of the input, applied before preparing it.
    rotation: Option<Rotation>,
    /// Whether each input row is prepared twice (itself, then its residual).
    residual: bool,
    /// The IOMMU domain of its memories, and the bytes of B it holds there.
    domain: i32,
    b_bytes: u64,
}

impl std::fmt::Debug for Linear {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Linear")
            .field("n", &self.plan.n)
            .field("k", &self.plan.k)
            .field("format", &self.format)
            .finish()
    }
}

/// Input rows per chunk from which the rotation and preparation are split over the lanes: a
/// prompt chunk, where they were about a seventh of the caller's time (decode's single row
/// stays on the caller: a round of hand-offs would cost more than it saves).
const LANE_PREPARE_MIN_ROWS: usize = 32;

/// Where a linear's weight rows come from: `rows(first, buf)` fills `buf` with rows `first..`.
pub(crate) type RowSource<'a, E> = dyn FnMut(usize, &mut [f32]) -> std::result::Result<(), E> + 'a;

/// Where converted rows go, a step at a time: `sink(first, values, scales)`.
pub(crate) type StepSink<'a, B, E> =
    dyn FnMut(usize, &[B], &[f32]) -> std::result::Result<(), E> + 'a;

/// Rows converted at a time (rotate, then quantise or convert) while a linear is made resident.
pub(crate) const ROWS_PER_STEP: usize = 256;

/// Runs `f`, counted as one run of `phase` by the callers.
fn timed<R>(stats: &Counters, phase: Phase, f: impl FnOnce() -> R) -> R {
    let t = Instant::now();
    let r = f();
    stats.add(stats.callers(), phase, t.elapsed());
    r
}

impl Linear {
    /// Makes the linear `plan` describes resident in format `K`: the rows come from `rows`
    /// ([`ROWS_PER_STEP`] at a time: `rows(first, buf)` fills `buf` with rows `first..` of
    /// W), rotated by `opts.rotation` and converted step by step, so the whole matrix is never
    /// held in f32.
    pub(crate) fn register<K: EngineKind, E: From<Error>>(
        inner: &Arc<Inner>,
        plan: LinearPlan,
        opts: LinearOptions,
        rows: &mut RowSource<'_, E>,
    ) -> std::result::Result<Linear, E> {
        opts.check(plan.k)?;
        let threads = inner.pool.len();
        let (b, scales) =
            Linear::convert::<K, E>(&plan, opts.rotation.as_ref(), opts.group(), threads, rows)?;
        Ok(Linear::place::<K>(inner, plan, Arc::new(b), scales, opts)?)
    }

    /// Converts the weights of the linear `plan` describes into format `K` (`b` [n_pad,
    /// k_pad], `scales` [n_pad × params per row]: one scale per row, or with per-group int4
    /// `group` each row's group scales and offsets): the rows come from `rows`
    /// ([`ROWS_PER_STEP`] at a time), rotated by `rotation`.
    pub(crate) fn convert<K: EngineKind, E: From<Error>>(
        plan: &LinearPlan,
        rotation: Option<&Rotation>,
        group: Option<usize>,
        threads: usize,
        rows: &mut RowSource<'_, E>,
    ) -> std::result::Result<(Vec<K::B>, Vec<f32>), E> {
        let len = row_len::<K>(plan.k_pad);
        let per = params_per_row(K::FORMAT, group, plan.k_pad).max(1);
        let mut b = try_vec(
            plan.n_pad * len,
            <K as crate::dtype::MatmulKind>::B::default(),
            "converted weights",
        )?;
        let mut scales = try_vec(plan.n_pad * per, 0f32, "converted weight scales")?;
        Linear::convert_steps::<K, E>(
            plan,
            rotation,
            group,
            threads,
            rows,
            &mut |first, values, s| {
                b[first * len..][..values.len()].copy_from_slice(values);
                scales[first * per..][..s.len()].copy_from_slice(s);
                Ok(())
            },
        )?;
        Ok((b, scales))
    }

    /// Converts as [`Linear::convert`], handing each step to `sink` instead of keeping it:
    /// `sink(first, values, scales)` gets rows `first..` in order (`values` `k_pad` values per
    /// row, int4 two per element,
    /// one scale per row), then the padding rows up to `n_pad` as zeros. Each step's rows are
    /// rotated and converted on `threads` threads (the lanes' count: the engine's share of the
    /// CPUs, idle while a model loads), a contiguous share each: every row's arithmetic is its
    /// own, so the result does not depend on the split.
    pub(crate) fn convert_steps<K: EngineKind, E: From<Error>>(
        plan: &LinearPlan,
        rotation: Option<&Rotation>,
        group: Option<usize>,
        threads: usize,
        rows: &mut RowSource<'_, E>,
        sink: &mut StepSink<'_, K::B, E>,
    ) -> std::result::Result<(), E> {
        let (n, k, k_pad) = (plan.n, plan.k, plan.k_pad);
        let len = row_len::<K>(k_pad);
        // Scales per row: one (also for F16, whose sink drops them), or a group's two each.
        let per = params_per_row(K::FORMAT, group, k_pad).max(1);
        let step = ROWS_PER_STEP.min(n);
        let mut b = try_vec(
            step * len,
            <K as crate::dtype::MatmulKind>::B::default(),
            "a step of converted weights",
        )?;
        let mut scales = try_vec(step * per, 0f32, "a step of converted weight scales")?;
        let mut buf = try_vec(step * k, 0f32, "a step of weight rows")?;
        for first in (0..n).step_by(ROWS_PER_STEP) {
            let count = ROWS_PER_STEP.min(n - first);
            let w = &mut buf[..count * k];
            rows(first, w)?;
            let (bs, ss) = (&mut b[..count * len], &mut scales[..count * per]);
            // Shares of at least 16 rows: below that a thread costs more than it saves.
            let share = count.div_ceil(threads.clamp(1, count.div_ceil(16)));
            let convert = |w: &mut [f32], bs: &mut [K::B], ss: &mut [f32]| {
                if let Some(r) = rotation {
                    r.apply_rows(w);
                }
                match group {
                    Some(g) => K::convert_rows_grouped(w, (ss.len() / per, k, k_pad), g, bs, ss),
                    None => K::convert_rows(w, ss.len(), k, k_pad, bs, ss),
                }
            };
            std::thread::scope(|scope| {
                let mut parts = w
                    .chunks_mut(share * k)
                    .zip(bs.chunks_mut(share * len))
                    .zip(ss.chunks_mut(share * per));
                let mine = parts.next();
                for ((w, bs), ss) in parts {
                    scope.spawn(move || convert(w, bs, ss));
                }
                if let Some(((w, bs), ss)) = mine {
                    convert(w, bs, ss);
                }
            });
            sink(first, bs, ss)?;
        }
        if plan.n_pad > n {
            let pad = plan.n_pad - n;
            let zeros = vec![<K as crate::dtype::MatmulKind>::B::default(); pad * len];
            sink(n, &zeros, &vec![0.0; pad * per])?;
        }
        Ok(())
    }

    /// Places converted weights (`b` [n_pad, k_pad], `scales` [n_pad × params per row]:
    /// one per row, or with `opts.int4_group` each row's group scales and offsets) on the
    /// lanes.
    pub(crate) fn place<K: EngineKind>(
        inner: &Arc<Inner>,
        plan: LinearPlan,
        b: Arc<dyn WeightRows<K::B>>,
        scales: Vec<f32>,
        opts: LinearOptions,
    ) -> Result<Linear> {
        let rt = &inner.rt;
        let plan = match opts.lane {
            Some(lane) => plan.on_lane(lane)?,
            None => plan,
        };
        let share_io = inner.resolved.share_io;
        let group = opts.group();
        let needs = lane_needs(&plan, &inner.cfg, K::FORMAT, share_io);
        let mut domains = inner
            .domains
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let placed = domains.place(inner.cfg.iommu_domain_bytes, K::FORMAT, share_io, &needs)?;
        let (domain, b_bytes) = (placed.domain, placed.b_bytes);
        // Every context holds its B (and its own A and C unless shared), each memory a dma-buf
        // file descriptor: a model that needs more than the budget fails here, saying what to
        // raise, not in the middle of the lanes' builds.
        let contexts: usize = needs.iter().map(|n| n.contexts).sum();
        let needed = contexts * if share_io { 1 } else { 3 } + 2 * placed.new_pairs;
        let budget = rt.handle_budget();
        if budget.live().saturating_add(needed) > budget.budget() {
            domains.release(domain, b_bytes);
            return Err(Error::HandlesForLinear {
                n: plan.n,
                k: plan.k,
                needed,
                contexts,
                shared: share_io,
                live: budget.live(),
                budget: budget.budget(),
            });
        }
        drop(domains);
        let id = inner
            .next_id
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let linear = Linear {
            inner: inner.clone(),
            id,
            format: K::FORMAT,
            rotation: opts.rotation,
            residual: opts.residual_activations && K::RESIDUAL,
            domain,
            b_bytes,
            plan,
        };
        let plan = &linear.plan;
        let k_pad = plan.k_pad;
        let per = params_per_row(K::FORMAT, group, k_pad);
        let group_order = rt.group_order();
        let buckets: Arc<[usize]> = inner.cfg.buckets().into();
        let segments: Arc<[(usize, usize)]> = plan.segments.as_slice().into();
        let multi = rt.platform().has_core_mask();
        // The lanes share the converted weights, each packing its own rows into its contexts'
        // memories (no host copy per lane: a linear's weights are held once beside the NPU's).
        // On failure, dropping `linear` gives back what was booked (and removes the shards that
        // were built).
        let mut specs = plan
            .shards
            .iter()
            .enumerate()
            .map(|(i, p)| {
                p.map(|p| -> Result<ShardSpec<K>> {
                    Ok(ShardSpec {
                        b: b.clone(),
                        row0: p.n0,
                        k: plan.k,
                        ch_scales: scales
                            .get(p.n0 * per..(p.n0 + p.width) * per)
                            .unwrap_or(&[])
                            .to_vec(),
                        group: group.map(|g| (g, group_order)),
                        blocks: plan.blocks(&p),
                        k_pad,
                        segments: segments.clone(),
                        buckets: buckets.clone(),
                        core: if multi { Core::Index(i) } else { Core::Auto },
                        domain,
                        share_io,
                    })
                })
                .transpose()
            })
            .collect::<Result<Vec<_>>>()?;
        drop(b);
        inner.pool.round().run_all(|i, _| {
            let spec = specs[i].take()?;
            Some(Task::Register {
                id,
                build: Box::new(move |rt, io| spec.build(rt, io)),
            })
        })?;
        Ok(linear)
    }

    /// Output features (N).
    pub fn out_features(&self) -> usize {
        self.plan.n
    }

    /// Input features (K).
    pub fn in_features(&self) -> usize {
        self.plan.k
    }

    /// The precision.
    pub fn format(&self) -> WeightFormat {
        self.format
    }

    /// Its NPU contexts: every core's blocks of at most
    /// [`Engine::max_n_per_context`](super::Engine::max_n_per_context) columns, times its K
    /// segments.
    pub fn contexts(&self) -> usize {
        self.plan.contexts()
    }

    /// The plan its lanes built their contexts from.
    #[cfg(all(test, feature = "emulator"))]
    pub(crate) fn plan(&self) -> &LinearPlan {
        &self.plan
    }

    /// The IOMMU domain its weights live in.
    pub fn iommu_domain(&self) -> i32 {
        self.domain
    }

    /// The rotation of its input, if any.
    pub fn rotation(&self) -> Option<&Rotation> {
        self.rotation.as_ref()
    }

    /// Whether each input row is quantised twice (see [`LinearOptions::residual_activations`]).
    pub fn residual_activations(&self) -> bool {
        self.residual
    }

    /// y [m, N] = x [m, K] × Wᵀ, for any m.
    ///
    /// Each NPU core's lane writes its columns of `out` directly; if the call fails, `out` may
    /// hold some lanes' columns and must not be used.
    pub fn forward(&self, x: &[f32], m: usize, out: &mut [f32]) -> Result<()> {
        let (k, n, k_pad) = (self.plan.k, self.plan.n, self.plan.k_pad);
        self.check_lengths(x, m, out)?;
        let inner = &self.inner;
        let stats = &*inner.stats;
        let mut round = inner.pool.round();
        // Prepared twice, each input row takes two rows of the NPU's A.
        let per = if self.residual { 2 } else { 1 };
        let ld = with_format!(self.format, K => <K as EngineKind>::input_ld(k, k_pad));
        // Chunks of at most `max_m` rows of A, each at its bucket's M: the planner's rule, the
        // one the cost model prices.
        for MChunk {
            first: r0,
            rows: mc,
            m: bucket,
        } in m_chunks(m, per, inner.cfg.max_m)
        {
            let x_chunk = &x[r0 * k..(r0 + mc) * k];
            if mc >= LANE_PREPARE_MIN_ROWS && inner.pool.len() > 1 {
                timed(stats, Phase::Quantize, || {
                    self.prepare_on_lanes(&mut round, x_chunk, mc, per, bucket)
                })?;
            } else {
                timed(stats, Phase::Quantize, || {
                    self.prepare_here(round.scratch(), x_chunk, mc, per, bucket)
                });
            }
            let out_chunk = &mut out[r0 * n..(r0 + mc) * n];
            let mut cols = [None; MAX_WORKERS];
            for (c, plan) in cols.iter_mut().zip(&self.plan.shards) {
                *c = plan
                    .as_ref()
                    .filter(|p| p.valid > 0)
                    .map(|p| (p.n0, p.valid));
            }
            // SAFETY: `out_chunk` is not touched again in this iteration, and no view is used
            // after it: each goes to one lane's forward, which drops it before it returns or
            // replies, and the posted tasks have all finished when `wait_all` returns or its
            // tickets drop (also when unwinding); the views not handed out are never used.
            let mut views = unsafe { OutCols::split(out_chunk, mc, n, cols) };
            let mut chunk = |i: usize, input: &Arc<Prepared>| -> Option<Forward> {
                Some(Forward {
                    id: self.id,
                    m: mc,
                    per,
                    bucket,
                    input: input.clone(),
                    ld,
                    out: views.get_mut(i)?.take()?,
                })
            };
            let posted = round.post(|i, s| chunk(i, &s.input).map(Task::Forward));
            // The calling thread's own lane, run here while the workers run theirs.
            let mine = match round.inline_parts() {
                Some((st, s)) => match (chunk(0, &s.input), st.shards.get_mut(&self.id)) {
                    (Some(f), Some(shard)) => shard.forward(&mut st.bufs, f, (&st.stats, st.lane)),
                    _ => Ok(()),
                },
                None => Ok(()),
            };
            let (replies, waited) = posted.wait_all();
            round.add_waited(waited);
            mine?;
            replies?;
        }
        let (waited, rounds) = round.take_waited();
        if rounds > 0 {
            stats.add_runs(stats.callers(), Phase::Wait, rounds, waited);
        }
        let rows = (m * per) as u64;
        stats.forward(rows * k as u64, rows * n as u64);
        Ok(())
    }

    /// The lane holding all its columns, when one does ([`LinearOptions::lane`], or a linear
    /// too narrow to split).
    pub fn lane(&self) -> Option<usize> {
        self.plan.only_lane()
    }

    /// Rows of A per input row (2 with residual activations), and whether `m` rows run as one
    /// chunk of at most the engine's `max_m` rows of A.
    fn one_chunk(&self, m: usize) -> Option<(usize, usize)> {
        let per = if self.residual { 2 } else { 1 };
        let rows = m.checked_mul(per)?;
        (m > 0 && rows <= self.inner.cfg.max_m).then(|| (per, self.inner.cfg.bucket(rows)))
    }

    /// Runs independent forwards as one round: every job's input is prepared on the calling
    /// thread, then each lane runs its shards of all the jobs one after another, the lanes at
    /// once. Linears placed whole on different lanes ([`LinearOptions::lane`]: a mixture's
    /// experts) run in parallel; linears split over every lane take one hand-off to the lanes
    /// for the group instead of one each. Each job's output is what [`Linear::forward`]
    /// gives, bit for bit. A job of more rows than one chunk of the engine's `max_m` runs on
    /// its own, after the round. Every linear must be of the same engine.
    ///
    /// ```
    /// # if !cfg!(feature = "emulator") { return Ok(()); } // the emulator is not compiled in
    /// use rknn_matmul::engine::{Engine, EngineConfig, ForwardJob, LinearOptions, WeightFormat};
    /// use rknn_matmul::{Platform, Runtime};
    /// let engine = Engine::new(&Runtime::emulator(Platform::Rk3588)?, EngineConfig::default())?;
    /// let on = |lane| LinearOptions { lane: Some(lane), ..LinearOptions::default() };
    /// let (w0, w1) = ([1.0f32, 0.0, 0.0, 1.0], [0.0f32, 2.0, 2.0, 0.0]);
    /// let a = engine.linear_with(&w0, 2, 2, WeightFormat::F16, on(0))?;
    /// let b = engine.linear_with(&w1, 2, 2, WeightFormat::F16, on(1 % engine.workers()))?;
    /// let (mut ya, mut yb) = ([0.0f32; 2], [0.0f32; 4]);
    /// rknn_matmul::engine::Linear::forward_many(&mut [
    ///     ForwardJob { linear: &a, x: &[3.0, 4.0], m: 1, out: &mut ya },
    ///     ForwardJob { linear: &b, x: &[1.0, 2.0, 3.0, 4.0], m: 2, out: &mut yb },
    /// ])?;
    /// assert_eq!((ya, yb), ([3.0, 4.0], [4.0, 2.0, 8.0, 6.0]));
    /// # Ok::<(), rknn_matmul::Error>(())
    /// ```
    pub fn forward_many(jobs: &mut [ForwardJob<'_>]) -> Result<()> {
        let Some(first) = jobs.first() else {
            return Ok(());
        };
        let inner = first.linear.inner.clone();
        for job in jobs.iter() {
            if !Arc::ptr_eq(&job.linear.inner, &inner) {
                return Err(Error::EngineConfig {
                    field: "ForwardJob::linear",
                    value: jobs.len(),
                    rule: "the linears of one forward_many must be of the same engine".into(),
                });
            }
            job.linear.check_lengths(job.x, job.m, job.out)?;
        }
        // Jobs of one chunk each run in the round; the others, and empty ones, alone.
        let (grouped, alone): (Vec<usize>, Vec<usize>) =
            (0..jobs.len()).partition(|&i| jobs[i].linear.one_chunk(jobs[i].m).is_some());
        if grouped.len() == 1 {
            let j = &mut jobs[grouped[0]];
            j.linear.forward(j.x, j.m, j.out)?;
        } else if !grouped.is_empty() {
            Linear::forward_round(&inner, jobs, &grouped)?;
        }
        for i in alone {
            let j = &mut jobs[i];
            j.linear.forward(j.x, j.m, j.out)?;
        }
        Ok(())
    }

    /// The round of [`Linear::forward_many`] over `jobs[grouped]`, each one chunk.
    fn forward_round(
        inner: &Arc<Inner>,
        jobs: &mut [ForwardJob<'_>],
        grouped: &[usize],
    ) -> Result<()> {
        let stats = &*inner.stats;
        let lanes = inner.pool.len();
        let mut round = inner.pool.round();
        let t = Instant::now();
        {
            let s = round.scratch();
            if s.many.len() < grouped.len() {
                s.many.resize_with(grouped.len(), Default::default);
            }
            let Scratch {
                rotated, tmp, many, ..
            } = s;
            for (slot, &i) in many.iter_mut().zip(grouped) {
                let j = &jobs[i];
                let (per, bucket) = j.linear.one_chunk(j.m).expect("grouped jobs are one chunk");
                j.linear
                    .prepare_into(rotated, tmp, reuse(slot), j.x, j.m, per, bucket);
            }
        }
        stats.add(stats.callers(), Phase::Quantize, t.elapsed());
        // Each lane's forwards, in the jobs' order.
        let mut per_lane: Vec<Vec<Forward>> = (0..lanes).map(|_| Vec::new()).collect();
        let inputs: Vec<Arc<Prepared>> = round.scratch().many[..grouped.len()].to_vec();
        let mut picked: Vec<Option<&mut ForwardJob<'_>>> = jobs.iter_mut().map(Some).collect();
        for (&i, input) in grouped.iter().zip(&inputs) {
            let j = picked[i].take().expect("each job once");
            let l = j.linear;
            let (per, bucket) = l.one_chunk(j.m).expect("grouped jobs are one chunk");
            let (k, n, k_pad) = (l.plan.k, l.plan.n, l.plan.k_pad);
            let ld = with_format!(l.format, K => <K as EngineKind>::input_ld(k, k_pad));
            let mut cols = [None; MAX_WORKERS];
            for (c, plan) in cols.iter_mut().zip(&l.plan.shards) {
                *c = plan
                    .as_ref()
                    .filter(|p| p.valid > 0)
                    .map(|p| (p.n0, p.valid));
            }
            // SAFETY: each job's `out` is borrowed mutably by this call alone and not touched
            // again until the round ends; every view goes to one lane's forward, which drops
            // it before it replies, and all posted tasks have finished when `wait_all`
            // returns or its tickets drop (also when unwinding); views not handed out are
            // dropped unused.
            let mut views = unsafe { OutCols::split(j.out, j.m, n, cols) };
            for (lane, list) in per_lane.iter_mut().enumerate() {
                if let Some(out) = views.get_mut(lane).and_then(Option::take) {
                    list.push(Forward {
                        id: l.id,
                        m: j.m,
                        per,
                        bucket,
                        input: input.clone(),
                        ld,
                        out,
                    });
                }
            }
        }
        drop(inputs);
        let mut lists: Vec<Option<Vec<Forward>>> = per_lane
            .into_iter()
            .map(|l| (!l.is_empty()).then_some(l))
            .collect();
        let inline = round.inline_parts().is_some();
        let mine = if inline { lists[0].take() } else { None };
        let posted = round.post(|i, _| lists.get_mut(i)?.take().map(Task::Forwards));
        let mine = match (mine, round.inline_parts()) {
            (Some(list), Some((st, _))) => list.into_iter().try_for_each(|f| st.forward(f)),
            _ => Ok(()),
        };
        let (replies, waited) = posted.wait_all();
        round.add_waited(waited);
        let (waited, rounds) = round.take_waited();
        if rounds > 0 {
            stats.add_runs(stats.callers(), Phase::Wait, rounds, waited);
        }
        mine?;
        replies?;
        for &i in grouped {
            let l = jobs[i].linear;
            let rows = (jobs[i].m * if l.residual { 2 } else { 1 }) as u64;
            stats.forward(rows * l.plan.k as u64, rows * l.plan.n as u64);
        }
        Ok(())
    }

    /// Checks `x` and `out` against `m` rows of the linear's shape.
    fn check_lengths(&self, x: &[f32], m: usize, out: &[f32]) -> Result<()> {
        let (k, n) = (self.plan.k, self.plan.n);
        let need = |what, dim: usize| {
            m.checked_mul(dim).ok_or_else(|| Error::SizeOverflow {
                what,
                value: (m as u128 * dim as u128).to_string(),
                limit: "usize",
            })
        };
        let (nx, nout) = (
            need("x elements (m × in_features)", k)?,
            need("out elements (m × out_features)", n)?,
        );
        if x.len() != nx {
            return Err(Error::Length {
                what: "x (m × in_features)",
                expected: nx,
                got: x.len(),
            });
        }
        if out.len() != nout {
            return Err(Error::Length {
                what: "out (m × out_features)",
                expected: nout,
                got: out.len(),
            });
        }
        Ok(())
    }

    /// Rotates and prepares the chunk `x` ([mc, K]) on the calling thread into the round's
    /// shared input ([bucket, ld]; rows past `mc × per` zero).
    fn prepare_here(&self, s: &mut Scratch, x: &[f32], mc: usize, per: usize, bucket: usize) {
        let input = reuse(&mut s.input);
        self.prepare_into(&mut s.rotated, &mut s.tmp, input, x, mc, per, bucket);
    }

    /// Rotates and prepares the chunk `x` ([mc, K]) on the calling thread into `input`
    /// ([bucket, ld]; rows past `mc × per` zero), with `rotated` and `tmp` as scratch.
    #[allow(clippy::too_many_arguments)]
    fn prepare_into(
        &self,
        rotated: &mut Vec<f32>,
        tmp: &mut Vec<f32>,
        input: &mut Prepared,
        x: &[f32],
        mc: usize,
        per: usize,
        bucket: usize,
    ) {
        let x = match &self.rotation {
            Some(r) => {
                rotated.clear();
                rotated.extend_from_slice(x);
                r.apply_rows(rotated);
                &rotated[..]
            }
            None => x,
        };
        with_format!(self.format, K => {
            let (k, k_pad) = (self.plan.k, self.plan.k_pad);
            let ld = <K as EngineKind>::input_ld(k, k_pad);
            let (dst, scales) = <<K as EngineKind>::In as InElem>::of_mut(input);
            dst.resize(bucket * ld, Default::default());
            scales.resize(bucket, 0.0);
            <K as EngineKind>::prepare_rows(x, mc, k, k_pad, per == 2, tmp, dst, scales);
            dst[mc * per * ld..].fill(Default::default());
            scales[mc * per..].fill(0.0);
        });
    }

    /// Rotates and prepares the chunk `x` ([mc, K]) into the round's shared input ([bucket,
    /// ld]; rows past `mc × per` zero), each lane taking a contiguous share of the rows.
    fn prepare_on_lanes(
        &self,
        round: &mut Round<'_, Task, Scratch>,
        x: &[f32],
        mc: usize,
        per: usize,
        bucket: usize,
    ) -> Result<()> {
        let lanes = self.inner.pool.len();
        let share = mc.div_ceil(lanes);
        let (k, k_pad) = (self.plan.k, self.plan.k_pad);
        let xs = reuse(&mut round.scratch().x);
        xs.clear();
        xs.extend_from_slice(x);
        let replies = round.run_all(|i, s| {
            let rows = (i * share).min(mc)..((i + 1) * share).min(mc);
            (!rows.is_empty()).then(|| {
                Task::Prepare(PrepareRows {
                    format: self.format,
                    x: s.x.clone(),
                    rows,
                    k,
                    k_pad,
                    rotation: self.rotation.clone(),
                    twice: per == 2,
                    out: std::mem::take(&mut s.parts[i]),
                })
            })
        })?;
        let s = round.scratch();
        let input = reuse(&mut s.input);
        with_format!(self.format, K => {
            let ld = <K as EngineKind>::input_ld(k, k_pad);
            let (dst, scales) = <<K as EngineKind>::In as InElem>::of_mut(input);
            dst.resize(bucket * ld, Default::default());
            scales.resize(bucket, 0.0);
            let mut filled = 0;
            for (i, reply) in replies.into_iter().enumerate() {
                if let Some(Reply::Prepared(mut part)) = reply {
                    let row0 = i * share * per;
                    let (pq, ps) = <<K as EngineKind>::In as InElem>::of_mut(&mut part);
                    dst[row0 * ld..][..pq.len()].copy_from_slice(pq);
                    scales[row0..][..ps.len()].copy_from_slice(ps);
                    filled += ps.len();
                    s.parts[i] = part;
                }
            }
            debug_assert_eq!(filled, mc * per, "every row prepared once");
            dst[mc * per * ld..].fill(Default::default());
            scales[mc * per..].fill(0.0);
        });
        Ok(())
    }

    /// As [`Linear::forward`], allocating the output.
    pub fn forward_vec(&self, x: &[f32], m: usize) -> Result<Vec<f32>> {
        let n = m
            .checked_mul(self.plan.n)
            .ok_or_else(|| Error::SizeOverflow {
                what: "out elements (m × out_features)",
                value: (m as u128 * self.plan.n as u128).to_string(),
                limit: "usize",
            })?;
        let mut out = vec![0.0; n];
        self.forward(x, m, &mut out)?;
        Ok(out)
    }
}

impl Drop for Linear {
    fn drop(&mut self) {
        if let Ok(mut plan) = self.inner.domains.lock() {
            plan.release(self.domain, self.b_bytes);
        }
        let shards = &self.plan.shards;
        let _ = self
            .inner
            .pool
            .round()
            .run_all(|i, _| shards[i].is_some().then_some(Task::Remove { id: self.id }));
    }
}

/// Recycles a shared buffer: the lanes dropped their clones before replying, so the caller
/// owns it again and no allocation happens in steady state.
fn reuse<T: Clone + Default>(buf: &mut Arc<T>) -> &mut T {
    Arc::make_mut(buf)
}
