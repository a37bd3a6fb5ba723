//! Resident weights and the forward pass.
//!
//! A weight matrix W [N, K] is converted once: quantised per output channel (W8A8) or to f16,
//! padded to the chip's alignment, split into N shards (one per NPU core) and K segments (the
//! chip's segment size: one context with K above it ran 14x slower on RK3588), written in the
//! native B layout and kept resident in NPU memory. `forward` quantises the activations once
//! per row, each worker packs native A for its segments, runs them on its core, accumulates
//! the segments exactly in i32 and scales into its columns of the output.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use half::f16;
use rknn_chip::Layout;
use self_cell::self_cell;

use super::Inner;
use super::glue;
use super::scheduler::Work;
use super::stats::{Counters, Phase};
use crate::dtype::{F16xF16ToF32, I8xI8ToI32, MatmulKind};
use crate::error::{Error, Result};
use crate::matmul::{Core, Matmul};
use crate::mem::TensorMem;
use crate::runtime::Runtime;

/// The precision of a [`Linear`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WeightFormat {
    /// int8 weights with one f32 scale per output channel, int8 activations with one scale per
    /// row; i8 × i8 → i32 on the NPU, scales applied on the host (per-channel scales on the NPU
    /// returned all-zero C in a public RK3588 report, and factor out of the K sum anyway).
    W8A8,
    /// f16 weights and activations, f32 output.
    F16,
}

/// The three memories of one context.
pub(crate) struct Buffers<'a, K: MatmulKind> {
    a: TensorMem<'a, K::A>,
    b: TensorMem<'a, K::B>,
    c: TensorMem<'a, K::C>,
}

type I8Buffers<'a> = Buffers<'a, I8xI8ToI32>;
type F16Buffers<'a> = Buffers<'a, F16xF16ToF32>;

self_cell!(
    /// A W8A8 context with its memories.
    pub(crate) struct I8Segment<'rt> {
        owner: Matmul<'rt, I8xI8ToI32>,
        #[covariant]
        dependent: I8Buffers,
    }
);

self_cell!(
    /// An F16 context with its memories.
    pub(crate) struct F16Segment<'rt> {
        owner: Matmul<'rt, F16xF16ToF32>,
        #[covariant]
        dependent: F16Buffers,
    }
);

enum Segments<'rt> {
    I8(Vec<I8Segment<'rt>>),
    F16(Vec<F16Segment<'rt>>),
}

/// One worker's part of one linear.
struct Shard<'rt> {
    segments: Segments<'rt>,
    /// First output column of the shard.
    n0: usize,
    /// Columns of the shard (aligned).
    width: usize,
    /// Columns that exist in the output (the rest is alignment padding).
    valid: usize,
    /// Per-output-channel scales (W8A8).
    ch_scales: Vec<f32>,
}

/// Weights of one shard, sent to its worker at registration.
pub(crate) enum ShardWeights {
    I8 { q: Vec<i8>, ch_scales: Vec<f32> },
    F16 { w: Vec<f16> },
}

/// What a worker needs to build its part of a linear.
pub(crate) struct ShardSpec {
    weights: ShardWeights,
    n0: usize,
    width: usize,
    valid: usize,
    k_pad: usize,
    /// (first K row, rows) per segment.
    segments: Vec<(usize, usize)>,
    buckets: Vec<usize>,
    core: Core,
}

/// Raw views of the caller's buffers for one forward chunk. The caller blocks until every
/// worker has finished with them (see `Pool::run_all`).
pub(crate) struct ForwardIo {
    /// Rows of this chunk.
    m: usize,
    /// The context M (bucket) the chunk runs at; rows m..bucket of the inputs are zero.
    bucket: usize,
    /// W8A8: quantised activations [bucket, k_pad]; F16: activations [bucket, k] f32.
    input: *const u8,
    input_len: usize,
    row_scales: *const f32,
    k: usize,
    out: *mut f32,
    /// Output row stride (N).
    ld: usize,
}

// SAFETY: the pointers are only dereferenced while the posting thread waits for the task to
// finish; inputs are read-only and each worker writes a disjoint set of output columns.
unsafe impl Send for ForwardIo {}

/// A task of the engine's workers.
pub(crate) enum Task {
    Register { id: u64, spec: Box<ShardSpec> },
    Forward { id: u64, io: ForwardIo },
    Remove { id: u64 },
    Ping,
    Exit,
}

/// A worker's state: its runtime, core, contexts and scratch.
pub(crate) struct WorkerState {
    rt: Arc<Runtime>,
    shards: HashMap<u64, Shard<'static>>,
    acc: Vec<i32>,
    facc: Vec<f32>,
    stats: Arc<Counters>,
}

impl WorkerState {
    pub(crate) fn new(rt: Arc<Runtime>, stats: Arc<Counters>) -> WorkerState {
        WorkerState {
            rt,
            shards: HashMap::new(),
            acc: Vec::new(),
            facc: Vec::new(),
            stats,
        }
    }
}

impl Drop for WorkerState {
    fn drop(&mut self) {
        // Contexts borrow the runtime: free them before the Arc is released.
        self.shards.clear();
    }
}

impl Work for Task {
    type State = WorkerState;

    fn run(self, st: &mut WorkerState) -> Result<()> {
        match self {
            Task::Register { id, spec } => {
                // SAFETY: the runtime is kept alive by `st.rt` (an Arc) for as long as `st.shards`
                // exists, and `WorkerState::drop` clears the shards before the Arc field drops, so
                // extending the borrow to 'static never lets a context outlive its runtime.
                let rt: &'static Runtime = unsafe { &*Arc::as_ptr(&st.rt) };
                let shard = build_shard(rt, *spec)?;
                st.shards.insert(id, shard);
                Ok(())
            }
            Task::Forward { id, io } => {
                let shard = st
                    .shards
                    .get_mut(&id)
                    .ok_or_else(|| Error::Invalid(format!("linear {id} is not registered")))?;
                forward_shard(shard, &io, &mut st.acc, &mut st.facc, &st.stats)
            }
            Task::Remove { id } => {
                st.shards.remove(&id);
                Ok(())
            }
            Task::Ping | Task::Exit => Ok(()),
        }
    }
}

fn build_shard(rt: &Runtime, spec: ShardSpec) -> Result<Shard<'_>> {
    let ShardSpec {
        weights,
        n0,
        width,
        valid,
        k_pad,
        segments,
        buckets,
        core,
    } = spec;
    let ctx = |ks: usize| SegmentContext {
        rt,
        m: buckets[0],
        ks,
        width,
        buckets: &buckets,
        core,
    };
    let (segs, ch_scales) = match weights {
        ShardWeights::I8 { q, ch_scales } => {
            let segs = segments
                .iter()
                .map(|&(k0, ks)| {
                    I8Segment::try_new(ctx(ks).build()?, |mm| resident_buffers(mm, &q, k_pad, k0))
                })
                .collect::<Result<_>>()?;
            (Segments::I8(segs), ch_scales)
        }
        ShardWeights::F16 { w } => {
            let segs = segments
                .iter()
                .map(|&(k0, ks)| {
                    F16Segment::try_new(ctx(ks).build()?, |mm| resident_buffers(mm, &w, k_pad, k0))
                })
                .collect::<Result<_>>()?;
            (Segments::F16(segs), Vec::new())
        }
    };
    Ok(Shard {
        segments: segs,
        n0,
        width,
        valid,
        ch_scales,
    })
}

/// The context of one K segment of a shard: native A/B/C, dynamic M over the buckets.
struct SegmentContext<'rt, 'b> {
    rt: &'rt Runtime,
    m: usize,
    ks: usize,
    width: usize,
    buckets: &'b [usize],
    core: Core,
}

impl<'rt> SegmentContext<'rt, '_> {
    fn build<K: MatmulKind>(&self) -> Result<Matmul<'rt, K>> {
        self.rt
            .matmul::<K>(self.m, self.ks, self.width)
            .dynamic_m(self.buckets)
            .ac_layout(Layout::Native)
            .b_layout(Layout::Native)
            .core(self.core)
            .build()
    }
}

/// Allocates a segment's memories and writes its weights (columns k0.. of `w`) into B, where
/// they stay.
fn resident_buffers<'a, K: MatmulKind>(
    mm: &'a Matmul<'_, K>,
    w: &[K::B],
    k_pad: usize,
    k0: usize,
) -> Result<Buffers<'a, K>> {
    let (_, ks, width) = mm.shape();
    let mut b = mm.alloc_b()?;
    write_native_b(mm.tiles().1, w, k_pad, k0, ks, width, b.as_mut_slice())?;
    Ok(Buffers {
        a: mm.alloc_a()?,
        b,
        c: mm.alloc_c()?,
    })
}

/// Writes columns k0..k0+ks of the shard's weights ([width, k_pad], row = output channel) in
/// the native B layout, with the tile the runtime reported.
fn write_native_b<T: Copy + Default>(
    tile: Option<(usize, usize)>,
    w: &[T],
    k_pad: usize,
    k0: usize,
    ks: usize,
    width: usize,
    dst: &mut [T],
) -> Result<()> {
    let (sn, sk) = tile.ok_or_else(|| Error::Invalid("native B without tile dims".into()))?;
    let mut seg = Vec::with_capacity(width * ks);
    for row in w.chunks_exact(k_pad) {
        seg.extend_from_slice(&row[k0..k0 + ks]);
    }
    let geo = rknn_chip::layout::NativeB::new(ks, width, sn, sk, None).ok_or_else(|| {
        Error::Invalid(format!(
            "native B of K={ks} N={width} with tile {sn}x{sk} has no layout or overflows"
        ))
    })?;
    if dst.len() < geo.len() {
        return Err(Error::Size {
            what: "native B memory",
            expected: geo.len(),
            got: dst.len(),
        });
    }
    geo.pack_from_nk(&seg, dst);
    Ok(())
}

fn timed<R>(stats: &Counters, phase: Phase, f: impl FnOnce() -> R) -> R {
    let t = Instant::now();
    let r = f();
    stats.add(phase, t.elapsed());
    r
}

fn forward_shard(
    shard: &mut Shard<'static>,
    io: &ForwardIo,
    acc: &mut Vec<i32>,
    facc: &mut Vec<f32>,
    stats: &Counters,
) -> Result<()> {
    let (bucket, width) = (io.bucket, shard.width);
    match &mut shard.segments {
        Segments::I8(segs) => {
            // SAFETY: `input` holds `input_len` i8 values and stays alive and unchanged until the
            // caller's wait returns (ForwardIo contract).
            let q = unsafe { std::slice::from_raw_parts(io.input as *const i8, io.input_len) };
            let k_pad = io.input_len / bucket;
            acc.resize(bucket * width, 0);
            let mut k0 = 0;
            for (i, seg) in segs.iter_mut().enumerate() {
                seg.with_dependent_mut(|mm, bufs| -> Result<()> {
                    mm.set_m(bucket)?;
                    let ks = mm.shape().1;
                    let sk = mm.tiles().0.unwrap_or(16);
                    timed(stats, Phase::Pack, || {
                        glue::pack_a_native_i8(q, bucket, k_pad, k0, ks, sk, bufs.a.as_mut_slice())
                    });
                    timed(stats, Phase::Run, || mm.run(&bufs.a, &bufs.b, &mut bufs.c))?;
                    let sn = mm.tiles().2.unwrap_or(4);
                    timed(stats, Phase::Collect, || {
                        glue::accumulate_c_native_i32(
                            bufs.c.as_slice(),
                            bucket,
                            width,
                            sn,
                            acc,
                            i == 0,
                        )
                    });
                    k0 += ks;
                    Ok(())
                })?;
            }
            // SAFETY: `row_scales` holds `bucket` floats (ForwardIo contract).
            let row_scales = unsafe { std::slice::from_raw_parts(io.row_scales, bucket) };
            timed(stats, Phase::Collect, || {
                for r in 0..io.m {
                    // SAFETY: row r, columns n0..n0+valid of the [m, ld] output belong to this
                    // shard alone; no other worker writes them, and the caller waits.
                    let out = unsafe {
                        std::slice::from_raw_parts_mut(
                            io.out.add(r * io.ld + shard.n0),
                            shard.valid,
                        )
                    };
                    glue::scale_out(
                        &acc[r * width..r * width + shard.valid],
                        1,
                        shard.valid,
                        &row_scales[r..=r],
                        &shard.ch_scales[..shard.valid],
                        out,
                        shard.valid,
                        0,
                    );
                }
            });
        }
        Segments::F16(segs) => {
            // SAFETY: `input` holds `input_len` f32 values, alive until the caller's wait returns.
            let x = unsafe { std::slice::from_raw_parts(io.input as *const f32, io.input_len) };
            facc.resize(bucket * width, 0.0);
            let mut k0 = 0;
            for (i, seg) in segs.iter_mut().enumerate() {
                seg.with_dependent_mut(|mm, bufs| -> Result<()> {
                    mm.set_m(bucket)?;
                    let ks = mm.shape().1;
                    let sk = mm.tiles().0.unwrap_or(8);
                    timed(stats, Phase::Pack, || {
                        glue::pack_a_native_f16(x, bucket, io.k, k0, ks, sk, bufs.a.as_mut_slice())
                    });
                    timed(stats, Phase::Run, || mm.run(&bufs.a, &bufs.b, &mut bufs.c))?;
                    let sn = mm.tiles().2.unwrap_or(4);
                    timed(stats, Phase::Collect, || {
                        glue::accumulate_c_native_f32(
                            bufs.c.as_slice(),
                            bucket,
                            width,
                            sn,
                            facc,
                            width,
                            0,
                            i == 0,
                        )
                    });
                    k0 += ks;
                    Ok(())
                })?;
            }
            timed(stats, Phase::Collect, || {
                for r in 0..io.m {
                    // SAFETY: as above: this shard's columns of row r are written by this worker only.
                    let out = unsafe {
                        std::slice::from_raw_parts_mut(
                            io.out.add(r * io.ld + shard.n0),
                            shard.valid,
                        )
                    };
                    out.copy_from_slice(&facc[r * width..r * width + shard.valid]);
                }
            });
        }
    }
    Ok(())
}

/// A weight matrix resident on the NPU, shared over the engine's cores.
///
/// ```
/// use std::sync::Arc;
/// use rknn_matmul::engine::{Engine, EngineConfig, WeightFormat};
/// use rknn_matmul::{Platform, Runtime};
/// let engine = Engine::new(Arc::new(Runtime::emulator(Platform::Rk3588)?), EngineConfig::default())?;
/// // W: 3 outputs × 4 inputs (any N and K: the engine pads to the chip's alignment).
/// let w = [1.0, 0.0, 0.0, 0.0, 0.0, 2.0, 0.0, 0.0, 0.0, 0.0, 0.0, -1.0];
/// let lin = engine.linear(&w, 3, 4, WeightFormat::F16)?;
/// let y = lin.forward_vec(&[1.0, 2.0, 3.0, 4.0], 1)?;
/// assert_eq!(y, [1.0, 4.0, -4.0]);
/// # Ok::<(), rknn_matmul::Error>(())
/// ```
pub struct Linear {
    pub(crate) inner: Arc<Inner>,
    pub(crate) id: u64,
    pub(crate) n: usize,
    pub(crate) k: usize,
    pub(crate) k_pad: usize,
    pub(crate) format: WeightFormat,
    /// Which workers hold a shard.
    pub(crate) present: Vec<bool>,
}

impl std::fmt::Debug for Linear {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Linear")
            .field("n", &self.n)
            .field("k", &self.k)
            .field("format", &self.format)
            .finish()
    }
}

impl Linear {
    /// Output features (N).
    pub fn out_features(&self) -> usize {
        self.n
    }

    /// Input features (K).
    pub fn in_features(&self) -> usize {
        self.k
    }

    /// The precision.
    pub fn format(&self) -> WeightFormat {
        self.format
    }

    /// y [m, N] = x [m, K] × Wᵀ, for any m.
    pub fn forward(&self, x: &[f32], m: usize, out: &mut [f32]) -> Result<()> {
        if x.len() != m * self.k {
            return Err(Error::Size {
                what: "x (m × in_features)",
                expected: m * self.k,
                got: x.len(),
            });
        }
        if out.len() != m * self.n {
            return Err(Error::Size {
                what: "out (m × out_features)",
                expected: m * self.n,
                got: out.len(),
            });
        }
        let inner = &self.inner;
        let mut scratch = inner
            .scratch
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let max_m = inner.cfg.max_m;
        let mut r0 = 0;
        while r0 < m {
            let mc = (m - r0).min(max_m);
            let bucket = inner.cfg.bucket(mc);
            let x_chunk = &x[r0 * self.k..(r0 + mc) * self.k];
            let out_chunk = &mut out[r0 * self.n..(r0 + mc) * self.n];
            let (input, input_len, row_scales) = match self.format {
                WeightFormat::W8A8 => {
                    let s = &mut *scratch;
                    s.q.resize(bucket * self.k_pad, 0);
                    s.scales.resize(bucket, 0.0);
                    timed(&inner.stats, Phase::Quantize, || {
                        glue::quantize_rows(
                            x_chunk,
                            mc,
                            self.k,
                            self.k_pad,
                            &mut s.q,
                            &mut s.scales,
                        );
                        s.q[mc * self.k_pad..].fill(0);
                        s.scales[mc..].fill(0.0);
                    });
                    (s.q.as_ptr().cast::<u8>(), s.q.len(), s.scales.as_ptr())
                }
                WeightFormat::F16 if mc == bucket => (
                    x_chunk.as_ptr().cast::<u8>(),
                    x_chunk.len(),
                    std::ptr::null(),
                ),
                WeightFormat::F16 => {
                    let s = &mut *scratch;
                    s.x.clear();
                    s.x.extend_from_slice(x_chunk);
                    s.x.resize(bucket * self.k, 0.0);
                    (s.x.as_ptr().cast::<u8>(), s.x.len(), std::ptr::null())
                }
            };
            let out_ptr = out_chunk.as_mut_ptr();
            inner.pool.run_all(|i| {
                self.present[i].then_some(Task::Forward {
                    id: self.id,
                    io: ForwardIo {
                        m: mc,
                        bucket,
                        input,
                        input_len,
                        row_scales,
                        k: self.k,
                        out: out_ptr,
                        ld: self.n,
                    },
                })
            })?;
            r0 += mc;
        }
        inner.stats.forward();
        Ok(())
    }

    /// As [`Linear::forward`], allocating the output.
    pub fn forward_vec(&self, x: &[f32], m: usize) -> Result<Vec<f32>> {
        let mut out = vec![0.0; m * self.n];
        self.forward(x, m, &mut out)?;
        Ok(out)
    }
}

impl Drop for Linear {
    fn drop(&mut self) {
        let _ = self
            .inner
            .pool
            .run_all(|i| self.present[i].then_some(Task::Remove { id: self.id }));
    }
}

pub(crate) struct ShardPlan {
    pub(crate) n0: usize,
    pub(crate) width: usize,
    pub(crate) valid: usize,
}

/// Splits `n_pad` aligned columns into `cores` shards of whole `align` blocks, as equal as
/// possible; `n` columns exist in the output.
pub(crate) fn plan_shards(
    n: usize,
    n_pad: usize,
    align: usize,
    cores: usize,
) -> Vec<Option<ShardPlan>> {
    let blocks = n_pad / align;
    let mut n0 = 0;
    (0..cores)
        .map(|i| {
            let b = blocks / cores + usize::from(i < blocks % cores);
            if b == 0 {
                return None;
            }
            let width = b * align;
            let valid = n.saturating_sub(n0).min(width);
            let p = ShardPlan { n0, width, valid };
            n0 += width;
            Some(p)
        })
        .collect()
}

pub(crate) fn make_spec(
    weights: ShardWeights,
    plan: &ShardPlan,
    k_pad: usize,
    segments: &[(usize, usize)],
    buckets: &[usize],
    core: Core,
) -> Box<ShardSpec> {
    Box::new(ShardSpec {
        weights,
        n0: plan.n0,
        width: plan.width,
        valid: plan.valid,
        k_pad,
        segments: segments.to_vec(),
        buckets: buckets.to_vec(),
        core,
    })
}
