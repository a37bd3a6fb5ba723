//! Resident weights and the forward pass.
//!
//! A weight matrix W [N, K] is converted once: quantised per output channel (W8A8) or to f16,
//! padded to the chip's alignment, split into N shards (one per NPU core) and K segments (the
//! chip's segment size: one context with K above it ran 14x slower on RK3588), written in the
//! native B layout and kept resident in NPU memory. `forward` quantises the activations once
//! per row into a buffer the workers share (the caller alone for a few rows; every lane a share
//! of the rows for a prompt chunk), each worker packs native A for its segments, runs
//! them on its core, accumulates the segments and scales into its own output block, and the
//! caller copies each block into its columns of the output.
//!
//! The two weight formats share one structure ([`EngineKind`]): they differ only in the input
//! element, the accumulator, and the last step (per-row × per-channel scales, or a copy).

use std::sync::Arc;
use std::sync::atomic::AtomicUsize;

use half::f16;
use rknn_chip::Layout;
use rustc_hash::FxHashMap;

use super::clock;
use super::glue;
use super::out_cols::OutCols;
use super::prefetch::Ranges;
use super::scheduler::{MAX_WORKERS, Round, Work};
use super::stats::{Counters, Lap, Phase};
use super::warm::{self, PeerBytes, Warmer};
use super::{Inner, Rotation, Scratch};
use crate::dtype::{F16xF16ToF32, I8xI8ToI32, MatmulKind};
use crate::error::{Error, Matrix, Result};
use crate::matmul::{Core, Matmul};
use crate::mem::TensorMem;
use crate::runtime::Runtime;

/// The precision of a [`Linear`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WeightFormat {
    /// int8 weights with one f32 scale per output channel, int8 activations with one scale per
    /// row; i8 × i8 → i32 on the NPU, scales applied on the host (per-channel scales on the NPU
    /// returned all-zero C in a public RK3588 report, and factor out of the K sum anyway).
    W8A8,
    /// f16 weights and activations, f32 output.
    F16,
}

/// What the forward pass needs of a matmul type.
pub(crate) trait EngineKind: MatmulKind + Sized {
    /// The caller's prepared input element (quantised i8, or f32 converted while packing).
    type In: Copy + Send + Sync + 'static;
    /// The accumulator over K segments (exact i32, or f32).
    type Acc: Copy + Default + Send + 'static;

    /// Packs columns `k0..k0 + ks` of `x` ([m, ld] row-major) into native A.
    fn pack_a(
        x: &[Self::In],
        m: usize,
        ld: usize,
        k0: usize,
        ks: usize,
        sk: usize,
        dst: &mut [Self::A],
    );

    /// Adds native C ([width / sn, m, sn]) into `acc` ([m, width]), or sets it if `first`.
    fn accumulate(
        c: &[Self::C],
        m: usize,
        width: usize,
        sn: usize,
        acc: &mut [Self::Acc],
        first: bool,
    );

    /// The lane's shared A/C of this type, per IOMMU domain.
    fn shared(io: &mut LaneIo) -> &mut FxHashMap<i32, Option<IoMems<Self>>>;

    /// Writes the first `valid` columns of `acc` ([m × per, width]) into `out`'s rows (`m` rows
    /// of `valid` columns): output row `r` combines accumulator rows `r·per .. r·per + per`
    /// (`per` is 2 when each input row was quantised twice, as itself and as its residual).
    #[allow(clippy::too_many_arguments)] // The operands of the formula.
    fn finish(
        acc: &[Self::Acc],
        m: usize,
        per: usize,
        width: usize,
        valid: usize,
        row_scales: &[f32],
        ch_scales: &[f32],
        out: &mut OutCols,
    );
}

impl EngineKind for I8xI8ToI32 {
    type In = i8;
    type Acc = i32;

    fn shared(io: &mut LaneIo) -> &mut FxHashMap<i32, Option<IoMems<Self>>> {
        &mut io.i8
    }

    fn pack_a(x: &[i8], m: usize, ld: usize, k0: usize, ks: usize, sk: usize, dst: &mut [i8]) {
        glue::pack_a_native_i8(x, m, ld, k0, ks, sk, dst);
    }

    fn accumulate(c: &[i32], m: usize, width: usize, sn: usize, acc: &mut [i32], first: bool) {
        glue::accumulate_c_native_i32(c, m, width, sn, acc, first);
    }

    /// With `per = 1`: `out = (acc · row_scale) · ch_scale` ([`glue::scale_out`]). With
    /// `per = 2`: `out = (acc₀ · s₀ + acc₁ · s₁) · ch_scale`, in exactly this order (`per` is 1
    /// or 2).
    fn finish(
        acc: &[i32],
        m: usize,
        per: usize,
        width: usize,
        valid: usize,
        row_scales: &[f32],
        ch_scales: &[f32],
        out: &mut OutCols,
    ) {
        if per == 2 {
            for r in 0..m {
                let o = out.row(r);
                let (i0, i1) = (2 * r, 2 * r + 1);
                let (s0, s1) = (row_scales[i0], row_scales[i1]);
                let a0 = &acc[i0 * width..i0 * width + valid];
                let a1 = &acc[i1 * width..i1 * width + valid];
                for (((o, &x0), &x1), &ch) in o.iter_mut().zip(a0).zip(a1).zip(&ch_scales[..valid])
                {
                    *o = (x0 as f32 * s0 + x1 as f32 * s1) * ch;
                }
            }
            return;
        }
        for r in 0..m {
            glue::scale_out(
                &acc[r * width..r * width + valid],
                1,
                valid,
                &row_scales[r..=r],
                &ch_scales[..valid],
                out.row(r),
                valid,
                0,
            );
        }
    }
}

impl EngineKind for F16xF16ToF32 {
    type In = f32;
    type Acc = f32;

    fn shared(io: &mut LaneIo) -> &mut FxHashMap<i32, Option<IoMems<Self>>> {
        &mut io.f16
    }

    fn pack_a(x: &[f32], m: usize, ld: usize, k0: usize, ks: usize, sk: usize, dst: &mut [f16]) {
        glue::pack_a_native_f16(x, m, ld, k0, ks, sk, dst);
    }

    fn accumulate(c: &[f32], m: usize, width: usize, sn: usize, acc: &mut [f32], first: bool) {
        glue::accumulate_c_native_f32(c, m, width, sn, acc, width, 0, first);
    }

    fn finish(
        acc: &[f32],
        m: usize,
        _per: usize,
        width: usize,
        valid: usize,
        _row_scales: &[f32],
        _ch_scales: &[f32],
        out: &mut OutCols,
    ) {
        for r in 0..m {
            out.row(r)
                .copy_from_slice(&acc[r * width..r * width + valid]);
        }
    }
}

/// The A and C memories a context runs with.
pub(crate) struct IoMems<K: MatmulKind> {
    a: TensorMem<K::A>,
    c: TensorMem<K::C>,
}

impl<K: MatmulKind> IoMems<K> {
    /// Memories for `mm` alone.
    fn own(mm: &Matmul<K>) -> Result<IoMems<K>> {
        Ok(IoMems {
            a: mm.alloc_a()?,
            c: mm.alloc_c()?,
        })
    }

    /// Makes `shared` (the lane's memories of one IOMMU domain) large enough for `mm`,
    /// allocating them on `mm` the first time or when they are too small.
    fn ensure_shared(shared: &mut Option<IoMems<K>>, mm: &Matmul<K>) -> Result<()> {
        let (need_a, need_c) = (mm.max_bytes(Matrix::A), mm.max_bytes(Matrix::C));
        let fits = shared
            .as_ref()
            .is_some_and(|io| io.a.bytes() >= need_a && io.c.bytes() >= need_c);
        if !fits {
            let (len_a, len_c) = shared
                .as_ref()
                .map_or((0, 0), |io| (io.a.len(), io.c.len()));
            // The old pair stays bound to earlier contexts only until their next run, which
            // binds the new pair (a different memory) first.
            *shared = Some(IoMems {
                a: mm.alloc_shared_a(len_a)?,
                c: mm.alloc_shared_c(len_c)?,
            });
        }
        Ok(())
    }
}

/// One K segment of a shard: its context and its B, written once and kept; A and C are the
/// lane's shared pair, or the segment's own when sharing is off.
struct Segment<K: MatmulKind> {
    mm: Matmul<K>,
    b: TensorMem<K::B>,
    own: Option<IoMems<K>>,
    /// First K row and rows of the segment.
    k0: usize,
    ks: usize,
}

/// One worker's part of one linear, with the tiles the runtime reported.
struct Shard<K: MatmulKind> {
    segments: Vec<Segment<K>>,
    /// The IOMMU domain of its memories.
    domain: i32,
    /// Columns of the shard (aligned), of which the first `valid` exist in the output.
    width: usize,
    valid: usize,
    /// Per-output-channel scales (W8A8; empty for F16).
    ch_scales: Vec<f32>,
    /// Native tile sizes: A's sK and C's sN.
    sk: usize,
    sn: usize,
    /// What the linear that this lane ran after this one last time read first: prefetched at
    /// the end of this one's forward ([`super::prefetch`]).
    next: Ranges,
}

enum AnyShard {
    I8(Shard<I8xI8ToI32>),
    F16(Shard<F16xF16ToF32>),
}

/// Weights of one shard, sent to its worker at registration: rows = output channels, each
/// `k_pad` long.
pub(crate) enum ShardWeights {
    I8 { q: Vec<i8>, ch_scales: Vec<f32> },
    F16 { w: Vec<f16> },
}

/// What a worker needs to build its part of a linear.
pub(crate) struct ShardSpec {
    pub(crate) weights: ShardWeights,
    pub(crate) plan: ShardPlan,
    pub(crate) k_pad: usize,
    /// (first K row, rows) per segment.
    pub(crate) segments: Arc<[(usize, usize)]>,
    pub(crate) buckets: Arc<[usize]>,
    pub(crate) core: Core,
    pub(crate) domain: i32,
    /// Whether the lane's contexts share one A and one C per IOMMU domain.
    pub(crate) share_io: bool,
}

/// The caller's prepared input for one forward chunk, shared with the workers.
pub(crate) enum Input {
    /// Quantised activations [bucket, ld] and one scale per row.
    I8 {
        q: Arc<Vec<i8>>,
        scales: Arc<Vec<f32>>,
        ld: usize,
    },
    /// Activations [bucket, ld] in f32.
    F16 { x: Arc<Vec<f32>>, ld: usize },
}

/// One forward chunk for one worker.
pub(crate) struct Forward {
    id: u64,
    /// Output rows; the input has `m × per` rows.
    m: usize,
    per: usize,
    bucket: usize,
    input: Input,
    /// The lane's columns of the caller's output rows, written in place.
    out: OutCols,
}

/// Rows of a prompt chunk to rotate and quantise on a lane: the quantisation of many rows is
/// split over the lanes instead of running on the caller while the cores wait.
pub(crate) struct QuantizeRows {
    /// The chunk's input rows [m, k].
    x: Arc<Vec<f32>>,
    /// The rows of `x` this lane quantises.
    rows: std::ops::Range<usize>,
    k: usize,
    k_pad: usize,
    rotation: Option<Rotation>,
    /// Each row quantised twice (itself and its residual), as [`quantize_with_residual`].
    residual: bool,
    /// Buffers for the result, returned in the reply: [rows × per, k_pad] and [rows × per].
    q: Vec<i8>,
    scales: Vec<f32>,
}

/// A task of the engine's workers.
pub(crate) enum Task {
    Register {
        id: u64,
        spec: Box<ShardSpec>,
    },
    Forward(Forward),
    Quantize(QuantizeRows),
    /// Parts of the calling thread's lane's weights of linear `id` for this worker to read
    /// ahead while idle (see [`Warmer::add_peer`]).
    Peer {
        id: u64,
        parts: Vec<PeerBytes>,
        /// This worker's part of the read-ahead: `slot` of `slots` (the workers).
        slot: usize,
        slots: usize,
    },
    Remove {
        id: u64,
    },
    Ping,
    Exit,
}

/// A lane's shared A and C memories, per weight format and IOMMU domain.
#[derive(Default)]
pub(crate) struct LaneIo {
    i8: FxHashMap<i32, Option<IoMems<I8xI8ToI32>>>,
    f16: FxHashMap<i32, Option<IoMems<F16xF16ToF32>>>,
}

/// A worker's state: its runtime, contexts and scratch.
pub(crate) struct WorkerState {
    rt: Runtime,
    // Dropped before `io`: the shards' contexts may hold the shared memories' bindings.
    shards: FxHashMap<u64, AnyShard>,
    io: LaneIo,
    acc: Vec<i32>,
    facc: Vec<f32>,
    /// Rotated rows and residuals of a [`Task::Quantize`].
    rotated: Vec<f32>,
    residual: Vec<f32>,
    stats: Arc<Counters>,
    /// This lane's index: its cell of the counters.
    lane: usize,
    /// What to read ahead while idle (workers only: the calling thread's lane is never idle).
    warm: Warmer,
    /// The linear this lane ran last, which learns what its state prefetches
    /// ([`super::prefetch`]).
    last: Option<u64>,
    /// On the calling thread's lane, what the current forward read first of the linear itself
    /// (set by [`Linear::forward`]): recorded with the shard's own first reads. Empty on
    /// workers.
    caller_reads: Ranges,
}

impl WorkerState {
    /// After a forward of linear `id` on this lane: tells the linear before it on this lane
    /// what `id`'s forward reads first, and prefetches what the linear after `id` read first
    /// last time ([`super::prefetch`]).
    fn follow(&mut self, id: u64) {
        let Some(shard) = self.shards.get_mut(&id) else {
            return;
        };
        shard.next().prefetch();
        let mut reads = self.caller_reads;
        shard.first_reads(&mut reads);
        if let Some(prev) = self.last.replace(id).filter(|&p| p != id) {
            if let Some(p) = self.shards.get_mut(&prev) {
                let slot = p.next();
                // Compared first: in the steady state nothing changes and the line stays clean.
                if *slot != reads {
                    *slot = reads;
                }
            }
        }
    }

    /// A lane's state; `warm_bytes`: bytes of each linear's weights it reads ahead while idle
    /// (read at each idle spell).
    pub(crate) fn new(
        rt: Runtime,
        stats: Arc<Counters>,
        lane: usize,
        warm_bytes: Arc<AtomicUsize>,
    ) -> WorkerState {
        WorkerState {
            warm: Warmer::new(warm_bytes),
            rt,
            shards: FxHashMap::default(),
            last: None,
            caller_reads: Ranges::default(),
            io: LaneIo::default(),
            acc: Vec::new(),
            facc: Vec::new(),
            rotated: Vec::new(),
            residual: Vec::new(),
            stats,
            lane,
        }
    }
}

/// What a worker gives back.
pub(crate) enum Reply {
    /// Nothing (removal, ping).
    Done,
    /// A shard was built: its weights' ranges, in the order its runs read them.
    Registered(Vec<PeerBytes>),
    /// A [`QuantizeRows`]'s rows and scales.
    Quantized { q: Vec<i8>, scales: Vec<f32> },
}

impl Work for Task {
    type State = WorkerState;
    type Reply = Reply;

    fn run(self, st: &mut WorkerState) -> Result<Reply> {
        match self {
            Task::Register { id, spec } => {
                let shard = build_shard(&st.rt, &mut st.io, *spec)?;
                let ranges = shard.b_bytes().map(PeerBytes::of).collect();
                st.shards.insert(id, shard);
                Ok(Reply::Registered(ranges))
            }
            Task::Peer {
                id,
                parts,
                slot,
                slots,
            } => {
                st.warm.add_peer(id, parts, slot, slots);
                Ok(Reply::Done)
            }
            Task::Quantize(job) => Ok(quantize_share(job, &mut st.rotated, &mut st.residual)),
            Task::Forward(f) => {
                // A Linear removes its shards only when dropped, after its last forward.
                let shard = st
                    .shards
                    .get_mut(&f.id)
                    .expect("a live Linear's shards are registered on its workers");
                let stats = (&*st.stats, st.lane);
                st.warm.starts(f.id);
                match (shard, f.input) {
                    (AnyShard::I8(s), Input::I8 { q, scales, ld }) => {
                        let rows = (f.m, f.per, f.bucket);
                        let lane = &mut st.io;
                        forward_shard(s, lane, &q, ld, &scales, rows, &mut st.acc, f.out, stats)?
                    }
                    (AnyShard::F16(s), Input::F16 { x, ld }) => {
                        let rows = (f.m, f.per, f.bucket);
                        let lane = &mut st.io;
                        forward_shard(s, lane, &x, ld, &[], rows, &mut st.facc, f.out, stats)?
                    }
                    _ => unreachable!("a linear's input matches its weight format"),
                }
                st.warm.ended(f.id, f.bucket);
                st.follow(f.id);
                Ok(Reply::Done)
            }
            Task::Remove { id } => {
                st.warm.forget(id);
                st.shards.remove(&id);
                Ok(Reply::Done)
            }
            Task::Ping | Task::Exit => Ok(Reply::Done),
        }
    }

    fn is_exit(&self) -> bool {
        matches!(self, Task::Exit)
    }

    fn idle(st: &mut WorkerState, interrupted: &dyn Fn() -> bool) {
        let Some(id) = st.warm.take_pending() else {
            return;
        };
        // Its own state first (a few dozen cache lines that the weights of every other linear
        // evicted since its last forward, a token ago), then its weights.
        if let Some(shard) = st.shards.get(&id) {
            shard.touch();
        }
        let own = st.shards.get(&id).into_iter().flat_map(AnyShard::b_bytes);
        let budget = st.warm.budget();
        let read = warm::read_ahead(own, st.warm.peers(id, budget), budget, interrupted);
        st.stats.add_warmed(st.lane, read);
    }
}

impl AnyShard {
    /// Adds what its forward reads first to `r`: the shard, its first segment's wrappers, the
    /// start of the channel scales.
    fn first_reads(&self, r: &mut Ranges) {
        fn each<K: MatmulKind>(s: &Shard<K>, r: &mut Ranges) {
            r.add(s);
            r.add_slice(&s.segments);
            if let Some(seg) = s.segments.first() {
                seg.mm.first_reads(r);
            }
            r.add_slice(&s.ch_scales);
        }
        match self {
            AnyShard::I8(s) => each(s, r),
            AnyShard::F16(s) => each(s, r),
        }
    }

    /// What the linear after it read first, last time.
    fn next(&mut self) -> &mut Ranges {
        match self {
            AnyShard::I8(s) => &mut s.next,
            AnyShard::F16(s) => &mut s.next,
        }
    }

    /// Reads the state its next forward reads (each segment's context wrapper and B, the
    /// channel scales), so that the forward finds it in this core's caches.
    fn touch(&self) {
        fn each<K: MatmulKind>(s: &Shard<K>) {
            for seg in &s.segments {
                seg.mm.touch();
                seg.b.touch();
            }
            // One read per cache line.
            std::hint::black_box(s.ch_scales.iter().step_by(16).fold(0.0f32, |a, &v| a + v));
        }
        match self {
            AnyShard::I8(s) => each(s),
            AnyShard::F16(s) => each(s),
        }
    }

    /// The bytes of its weights, segment by segment (the order a run reads them).
    fn b_bytes(&self) -> impl Iterator<Item = &[u8]> {
        let (i8s, f16s): (&[Segment<I8xI8ToI32>], &[Segment<F16xF16ToF32>]) = match self {
            AnyShard::I8(s) => (&s.segments, &[]),
            AnyShard::F16(s) => (&[], &s.segments),
        };
        let i8s = i8s.iter().map(|seg| seg.b.as_bytes());
        i8s.chain(f16s.iter().map(|seg| seg.b.as_bytes()))
    }
}

fn build_shard(rt: &Runtime, io: &mut LaneIo, spec: ShardSpec) -> Result<AnyShard> {
    Ok(match spec.weights {
        ShardWeights::I8 {
            ref q,
            ref ch_scales,
        } => {
            let mut s = build::<I8xI8ToI32>(rt, io, &spec, q)?;
            s.ch_scales = ch_scales.clone();
            AnyShard::I8(s)
        }
        ShardWeights::F16 { ref w } => AnyShard::F16(build::<F16xF16ToF32>(rt, io, &spec, w)?),
    })
}

/// Builds a shard's contexts (native A/B/C, dynamic M over the buckets, on its core) and writes
/// its weights (`w`: [width, k_pad], row = output channel) into their B memories.
fn build<K: EngineKind>(
    rt: &Runtime,
    io: &mut LaneIo,
    spec: &ShardSpec,
    w: &[K::B],
) -> Result<Shard<K>> {
    let width = spec.plan.width;
    let mut segments = Vec::with_capacity(spec.segments.len());
    let mut tiles = None;
    let mut seg_w = Vec::new();
    for &(k0, ks) in spec.segments.iter() {
        let mm = rt
            .matmul::<K>(spec.buckets[0], ks, width)
            .dynamic_m(&spec.buckets)
            .ac_layout(Layout::Native)
            .b_layout(Layout::Native)
            .core(spec.core)
            .iommu_domain(spec.domain)
            .build()?;
        let (sk, _) = mm.native_tile(Matrix::A)?;
        let (sn, _) = mm.native_tile(Matrix::C)?;
        let (bn, bk) = mm.native_tile(Matrix::B)?;
        tiles = Some((sk, sn));
        let mut b = mm.alloc_b()?;
        seg_w.clear();
        seg_w
            .try_reserve_exact(ks * width)
            .map_err(|_| Error::HostAlloc {
                what: "a K segment's weights",
                bytes: (ks * width * std::mem::size_of::<K::B>()) as u64,
            })?;
        for row in w.chunks_exact(spec.k_pad) {
            seg_w.extend_from_slice(&row[k0..k0 + ks]);
        }
        let geo = rknn_chip::layout::NativeB::new(ks, width, bn, bk, None).ok_or_else(|| {
            Error::BadTensorDims {
                matrix: Matrix::B,
                layout: Layout::Native,
                dims: mm.io_attr().B.dims.to_vec(),
            }
        })?;
        let dst = b.as_mut_slice();
        if dst.len() < geo.len() {
            return Err(Error::MemoryTooSmall {
                matrix: Matrix::B,
                bytes: std::mem::size_of_val(dst) as u64,
                needed: (geo.len() * std::mem::size_of::<K::B>()) as u64,
            });
        }
        geo.pack_from_nk(&seg_w, dst);
        let own = if spec.share_io {
            IoMems::ensure_shared(K::shared(io).entry(spec.domain).or_default(), &mm)?;
            None
        } else {
            Some(IoMems::own(&mm)?)
        };
        segments.push(Segment { b, own, mm, k0, ks });
    }
    // Every linear has at least one segment (K >= 1).
    let (sk, sn) = tiles.expect("a linear has at least one K segment");
    Ok(Shard {
        segments,
        domain: spec.domain,
        width,
        valid: spec.plan.valid,
        ch_scales: Vec::new(),
        sk,
        sn,
        next: Ranges::default(),
    })
}

/// Runs `f`, counted as one run of `phase` by the callers.
fn timed<R>(stats: &Counters, phase: Phase, f: impl FnOnce() -> R) -> R {
    let t = clock::now();
    let r = f();
    stats.add(stats.callers(), phase, clock::now().since(t).duration());
    r
}

/// Runs one shard of one forward chunk: per K segment pack A, run, accumulate; then scale (or
/// copy) the valid columns into the lane's columns of the output, `out`.
#[allow(clippy::too_many_arguments)] // One call site per weight format.
fn forward_shard<K: EngineKind>(
    shard: &mut Shard<K>,
    lane: &mut LaneIo,
    x: &[K::In],
    ld: usize,
    row_scales: &[f32],
    (m, per, bucket): (usize, usize, usize),
    acc: &mut Vec<K::Acc>,
    mut out: OutCols,
    (stats, lane_index): (&Counters, usize),
) -> Result<()> {
    let (width, sk, sn) = (shard.width, shard.sk, shard.sn);
    // The first segment sets every accumulator, so the buffer only grows (zeroing it again
    // whenever a wider linear followed a narrower one was a memset per call).
    let need = bucket * width;
    if acc.len() < need {
        acc.resize(need, K::Acc::default());
    }
    let acc = &mut acc[..need];
    let mut shared = K::shared(lane).get_mut(&shard.domain);
    // One clock read per phase boundary, one update of this lane's counters per call.
    let mut lap = Lap::start();
    for (i, seg) in shard.segments.iter_mut().enumerate() {
        let io = match (&mut seg.own, shared.as_deref_mut()) {
            (Some(own), _) => own,
            (None, Some(Some(shared))) => shared,
            // Built with sharing: the lane's pair of this domain exists from the shard's build.
            (None, _) => unreachable!("a shard's lane has the shared A/C of its domain"),
        };
        let ran = seg.mm.set_m(bucket).map(|()| {
            K::pack_a(x, bucket, ld, seg.k0, seg.ks, sk, io.a.as_mut_slice());
            lap.mark(Phase::Pack);
            seg.mm.run(&io.a, &seg.b, &mut io.c)
        });
        lap.mark(Phase::Run);
        if let Err(e) = ran.and_then(|r| r) {
            stats.add_lap(lane_index, &lap);
            return Err(e);
        }
        K::accumulate(io.c.as_slice(), bucket, width, sn, acc, i == 0);
        lap.mark(Phase::Collect);
    }
    debug_assert_eq!(out.rows(), m, "the lane's view has the chunk's rows");
    K::finish(
        acc,
        m,
        per,
        width,
        shard.valid,
        row_scales,
        &shard.ch_scales,
        &mut out,
    );
    lap.mark(Phase::Collect);
    stats.add_lap(lane_index, &lap);
    Ok(())
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
    pub(crate) inner: Arc<Inner>,
    pub(crate) id: u64,
    pub(crate) n: usize,
    pub(crate) k: usize,
    pub(crate) k_pad: usize,
    pub(crate) format: WeightFormat,
    /// Each worker's shard, if it holds one.
    pub(crate) shards: Vec<Option<ShardPlan>>,
    /// The rotation of the input, applied before quantising it.
    pub(crate) rotation: Option<Rotation>,
    /// Whether each input row is quantised twice (itself, then its residual).
    pub(crate) residual: bool,
    /// The IOMMU domain of its memories, and the bytes of B it holds there.
    pub(crate) domain: i32,
    pub(crate) b_bytes: u64,
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

/// Quantises each of the `m` rows of `x` ([m, k]) twice into `q` ([2m, k_pad]) and `scales`
/// ([2m]): row `2r` is row `r` as [`glue::quantize_rows`] quantises it, row `2r + 1` its
/// residual `x - scale · q` (in f32), quantised the same way. The NPU multiplies both by the
/// weights in the same exact integer arithmetic, and the two results added back give about 15
/// bits of activation precision for the price of a second row of A (nothing, when decode is
/// bound by reading the weights).
fn quantize_with_residual(
    x: &[f32],
    m: usize,
    k: usize,
    k_pad: usize,
    residual: &mut Vec<f32>,
    q: &mut [i8],
    scales: &mut [f32],
) {
    residual.resize(k, 0.0);
    for r in 0..m {
        let row = &x[r * k..(r + 1) * k];
        let (q1, rest) = q[2 * r * k_pad..(2 * r + 2) * k_pad].split_at_mut(k_pad);
        let (s1, s2) = scales[2 * r..2 * r + 2].split_at_mut(1);
        glue::quantize_rows(row, 1, k, k_pad, q1, s1);
        for ((e, &v), &qv) in residual.iter_mut().zip(row).zip(&q1[..k]) {
            *e = v - s1[0] * f32::from(qv);
        }
        glue::quantize_rows(residual, 1, k, k_pad, rest, s2);
    }
}

/// Rotates and quantises a lane's share of a chunk: the same per-row operations as the caller's
/// path ([`glue::quantize_rows`], [`quantize_with_residual`], the rotation row by row), so the
/// same bits whichever lane quantises a row.
fn quantize_share(job: QuantizeRows, rotated: &mut Vec<f32>, residual: &mut Vec<f32>) -> Reply {
    let QuantizeRows {
        x,
        rows,
        k,
        k_pad,
        rotation,
        residual: twice,
        mut q,
        mut scales,
    } = job;
    let n = rows.len();
    let per = if twice { 2 } else { 1 };
    let src = &x[rows.start * k..rows.end * k];
    let src = match &rotation {
        Some(r) => {
            rotated.clear();
            rotated.extend_from_slice(src);
            r.apply_rows(rotated);
            &rotated[..]
        }
        None => src,
    };
    q.resize(n * per * k_pad, 0);
    scales.resize(n * per, 0.0);
    if twice {
        quantize_with_residual(src, n, k, k_pad, residual, &mut q, &mut scales);
    } else {
        glue::quantize_rows(src, n, k, k_pad, &mut q, &mut scales);
    }
    Reply::Quantized { q, scales }
}

/// Input rows per chunk from which the rotation and quantisation are split over the lanes: a
/// prompt chunk, where they were about a seventh of the caller's time (decode's single row
/// stays on the caller: a round of hand-offs would cost more than it saves).
const LANE_QUANTIZE_MIN_ROWS: usize = 32;

/// Recycles a shared buffer: the workers dropped their clones before replying, so the caller
/// owns it again and no allocation happens in steady state.
fn reuse<T: Clone>(buf: &mut Arc<Vec<T>>) -> &mut Vec<T> {
    Arc::make_mut(buf)
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

    /// The IOMMU domain its weights live in.
    pub fn iommu_domain(&self) -> i32 {
        self.domain
    }

    /// The rotation of its input, if any.
    pub fn rotation(&self) -> Option<&Rotation> {
        self.rotation.as_ref()
    }

    /// Whether each input row is quantised twice (see [`super::LinearOptions::residual_activations`]).
    pub fn residual_activations(&self) -> bool {
        self.residual
    }

    /// y [m, N] = x [m, K] × Wᵀ, for any m.
    ///
    /// Each NPU core's lane writes its columns of `out` directly; if the call fails, `out` may
    /// hold some lanes' columns and must not be used.
    pub fn forward(&self, x: &[f32], m: usize, out: &mut [f32]) -> Result<()> {
        let need = |what, dim: usize| {
            m.checked_mul(dim).ok_or_else(|| Error::SizeOverflow {
                what,
                value: (m as u128 * dim as u128).to_string(),
                limit: "usize",
            })
        };
        let (nx, nout) = (
            need("x elements (m × in_features)", self.k)?,
            need("out elements (m × out_features)", self.n)?,
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
        let inner = &self.inner;
        // What this call reads of the linear itself: the calling thread's lane records it with
        // its own state in the linear it ran before, which prefetches it when its forward ends
        // ([`WorkerState::follow`]).
        let mut round = inner.pool.round();
        if let Some(st) = round.inline_state() {
            st.caller_reads = self.caller_reads();
        }
        // Quantised twice, each input row takes two rows of the NPU's A.
        let per = if self.residual { 2 } else { 1 };
        let max_m = inner.cfg.max_m / per;
        let mut r0 = 0;
        while r0 < m {
            let mc = (m - r0).min(max_m);
            let rows = mc * per;
            let bucket = inner.cfg.bucket(rows);
            let x_chunk = &x[r0 * self.k..(r0 + mc) * self.k];
            let on_lanes = self.format == WeightFormat::W8A8
                && mc >= LANE_QUANTIZE_MIN_ROWS
                && inner.pool.len() > 1;
            if on_lanes {
                timed(&inner.stats, Phase::Quantize, || {
                    self.quantize_on_lanes(&mut round, x_chunk, mc, per, bucket)
                })?;
            }
            let s: &mut Scratch = round.scratch();
            let x_chunk = match &self.rotation {
                _ if on_lanes => x_chunk,
                Some(r) => timed(&inner.stats, Phase::Quantize, || {
                    s.rotated.clear();
                    s.rotated.extend_from_slice(x_chunk);
                    r.apply_rows(&mut s.rotated);
                    &s.rotated[..]
                }),
                None => x_chunk,
            };
            match self.format {
                WeightFormat::W8A8 if on_lanes => {}
                WeightFormat::W8A8 if per == 2 => timed(&inner.stats, Phase::Quantize, || {
                    let (q, scales) = (reuse(&mut s.q), reuse(&mut s.scales));
                    q.resize(bucket * self.k_pad, 0);
                    scales.resize(bucket, 0.0);
                    quantize_with_residual(
                        x_chunk,
                        mc,
                        self.k,
                        self.k_pad,
                        &mut s.residual,
                        q,
                        scales,
                    );
                    q[rows * self.k_pad..].fill(0);
                    scales[rows..].fill(0.0);
                }),
                WeightFormat::W8A8 => timed(&inner.stats, Phase::Quantize, || {
                    let (q, scales) = (reuse(&mut s.q), reuse(&mut s.scales));
                    q.resize(bucket * self.k_pad, 0);
                    scales.resize(bucket, 0.0);
                    glue::quantize_rows(x_chunk, mc, self.k, self.k_pad, q, scales);
                    q[mc * self.k_pad..].fill(0);
                    scales[mc..].fill(0.0);
                }),
                WeightFormat::F16 => {
                    let xs = reuse(&mut s.x);
                    xs.clear();
                    xs.extend_from_slice(x_chunk);
                    xs.resize(bucket * self.k, 0.0);
                }
            }
            let out_chunk = &mut out[r0 * self.n..(r0 + mc) * self.n];
            let mut cols = [None; MAX_WORKERS];
            for (c, plan) in cols.iter_mut().zip(&self.shards) {
                *c = plan
                    .as_ref()
                    .filter(|p| p.valid > 0)
                    .map(|p| (p.n0, p.valid));
            }
            // SAFETY: `out_chunk` is not touched again in this iteration, and no view is used
            // after it: each goes to one lane's task, which drops it before replying, and
            // `run_all` returns (or unwinds) only after every posted task has replied; the views
            // not handed out are never used.
            let mut views = unsafe { OutCols::split(out_chunk, mc, self.n, cols) };
            round.run_all(|i, s| {
                let out = views.get_mut(i)?.take()?;
                let input = match self.format {
                    WeightFormat::W8A8 => Input::I8 {
                        q: s.q.clone(),
                        scales: s.scales.clone(),
                        ld: self.k_pad,
                    },
                    WeightFormat::F16 => Input::F16 {
                        x: s.x.clone(),
                        ld: self.k,
                    },
                };
                Some(Task::Forward(Forward {
                    id: self.id,
                    m: mc,
                    per,
                    bucket,
                    input,
                    out,
                }))
            })?;
            r0 += mc;
        }
        let (waited, rounds) = round.take_waited();
        if rounds > 0 {
            let callers = inner.stats.callers();
            inner.stats.add_runs(callers, Phase::Wait, rounds, waited);
        }
        inner.stats.forward();
        Ok(())
    }

    /// What a forward reads first of the linear itself on the calling thread: the `Linear`, its
    /// shard plans and its rotation.
    fn caller_reads(&self) -> Ranges {
        let mut r = Ranges::default();
        r.add(self);
        r.add_slice(&self.shards);
        if let Some(rot) = &self.rotation {
            rot.first_reads(&mut r);
        }
        r
    }

    /// Rotates and quantises the chunk `x` ([mc, K]) into the round's shared `q` and `scales`
    /// ([bucket, K_pad], [bucket]; rows past `mc × per` zero), each lane taking a contiguous
    /// share of the rows.
    fn quantize_on_lanes(
        &self,
        round: &mut Round<'_, Task, Scratch>,
        x: &[f32],
        mc: usize,
        per: usize,
        bucket: usize,
    ) -> Result<()> {
        let lanes = self.inner.pool.len();
        let share = mc.div_ceil(lanes);
        let xs = reuse(&mut round.scratch().x);
        xs.clear();
        xs.extend_from_slice(x);
        let replies = round.run_all(|i, s| {
            let rows = (i * share).min(mc)..((i + 1) * share).min(mc);
            (!rows.is_empty()).then(|| {
                Task::Quantize(QuantizeRows {
                    x: s.x.clone(),
                    rows,
                    k: self.k,
                    k_pad: self.k_pad,
                    rotation: self.rotation.clone(),
                    residual: per == 2,
                    q: std::mem::take(&mut s.q_parts[i]),
                    scales: std::mem::take(&mut s.scale_parts[i]),
                })
            })
        })?;
        let s = round.scratch();
        let (q, scales) = (reuse(&mut s.q), reuse(&mut s.scales));
        q.resize(bucket * self.k_pad, 0);
        scales.resize(bucket, 0.0);
        let mut filled = 0;
        for (i, reply) in replies.into_iter().enumerate() {
            if let Some(Reply::Quantized {
                q: part,
                scales: part_scales,
            }) = reply
            {
                let row0 = i * share * per;
                q[row0 * self.k_pad..][..part.len()].copy_from_slice(&part);
                scales[row0..][..part_scales.len()].copy_from_slice(&part_scales);
                filled += part_scales.len();
                s.q_parts[i] = part;
                s.scale_parts[i] = part_scales;
            }
        }
        debug_assert_eq!(filled, mc * per, "every row quantised once");
        q[mc * per * self.k_pad..].fill(0);
        scales[mc * per..].fill(0.0);
        Ok(())
    }

    /// As [`Linear::forward`], allocating the output.
    pub fn forward_vec(&self, x: &[f32], m: usize) -> Result<Vec<f32>> {
        let n = m.checked_mul(self.n).ok_or_else(|| Error::SizeOverflow {
            what: "out elements (m × out_features)",
            value: (m as u128 * self.n as u128).to_string(),
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
        // The workers first, the calling thread's lane after their replies: a worker may read
        // that lane's weights ahead until it has forgotten them ([`Warmer::add_peer`]).
        let inline = usize::from(self.inner.pool.has_inline_lane());
        for lanes in [inline..self.shards.len(), 0..inline] {
            let _ = self.inner.pool.round().run_all(|i, _| {
                (lanes.contains(&i) && self.shards[i].is_some())
                    .then_some(Task::Remove { id: self.id })
            });
        }
    }
}

/// One worker's columns of a linear.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ShardPlan {
    /// First output column.
    pub(crate) n0: usize,
    /// Columns (a multiple of the alignment).
    pub(crate) width: usize,
    /// Columns that exist in the output.
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

#[cfg(all(test, feature = "emulator"))]
mod tests {
    use super::*;
    use crate::Platform;
    use crate::engine::topology::Pinning;
    use crate::engine::{Engine, EngineConfig};

    /// What the calling thread's lane records for a forward of `l`: the linear's own first
    /// reads, then its shard's.
    fn reads(st: &WorkerState, l: &Linear) -> Ranges {
        let mut r = l.caller_reads();
        st.shards[&l.id].first_reads(&mut r);
        r
    }

    fn next(st: &mut WorkerState, id: u64) -> Ranges {
        *st.shards
            .get_mut(&id)
            .expect("a live linear's shard")
            .next()
    }

    /// The calling thread's lane records, in each linear's shard, what the linear it ran next
    /// read first (what the end of that shard's forward then prefetches).
    #[test]
    fn a_lane_learns_what_the_linear_after_each_one_reads_first() {
        let rt = Runtime::emulator(Platform::Rk3588).unwrap();
        let cfg = EngineConfig {
            cores: Some(1),
            pinning: Pinning::None,
            ..EngineConfig::default()
        };
        let e = Engine::new(&rt, cfg).unwrap();
        let w: Vec<f32> = (0..64 * 64).map(|i| (i % 7) as f32 - 3.0).collect();
        let lins: Vec<Linear> = (0..3)
            .map(|_| e.linear(&w, 64, 64, WeightFormat::W8A8).unwrap())
            .collect();
        let ids: Vec<u64> = lins.iter().map(|l| l.id).collect();
        let x = vec![0.25f32; 64];
        let forward = |i: usize| {
            lins[i].forward_vec(&x, 1).unwrap();
        };
        forward(0);
        forward(1);
        {
            let mut round = lins[0].inner.pool.round();
            let st = round
                .inline_state()
                .expect("one core: the caller runs lane 0");
            let after_0 = next(st, ids[0]);
            assert_eq!(after_0, reads(st, &lins[1]));
            // The linear and its shard plans; its shard, segments, context handle, A's
            // attribute, B's and C's sizes, M values and channel scales.
            assert_eq!(after_0.iter().count(), 2 + 8, "{after_0:?}");
            assert_eq!(
                next(st, ids[1]),
                Ranges::default(),
                "nothing ran after 1 yet"
            );
        }
        // The order changes: 1 is followed by 0, and 0 by 2; a linear run twice in a row is not
        // its own successor.
        forward(0);
        forward(2);
        forward(2);
        let mut round = lins[0].inner.pool.round();
        let st = round.inline_state().unwrap();
        assert_eq!(next(st, ids[1]), reads(st, &lins[0]));
        assert_eq!(next(st, ids[0]), reads(st, &lins[2]));
        assert_eq!(next(st, ids[2]), Ranges::default());
        assert_ne!(
            reads(st, &lins[0]),
            reads(st, &lins[2]),
            "distinct linears, distinct state"
        );
    }
}
