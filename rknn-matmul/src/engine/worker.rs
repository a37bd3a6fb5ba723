//! The lanes' side of the engine: what each lane holds (its contexts, memories and scratch),
//! the tasks the caller hands it, and how a lane runs its shard of a linear. A lane is a
//! worker thread pinned to its NPU core, or the calling thread for lane 0
//! ([`super::config::EngineConfig::caller_runs_core0`]): both run the same code here.

use std::any::Any;
use std::sync::Arc;
use std::sync::atomic::AtomicUsize;

use rknn_chip::Layout;
use rknn_chip::plan::Columns;
use rustc_hash::FxHashMap;

use super::converted::WeightRows;
use super::emulator_cache::EmulatorCache;
use super::format::{
    AccElem, Accumulators, EngineKind, InElem, Prepared, WeightFormat, group_params_per_row,
    row_len, with_format,
};
use super::out_cols::OutCols;
use super::rotation::Rotation;
use super::scheduler::Work;
use super::stats::{Counters, Lap, Phase};
use crate::dtype::{MatmulKind, as_bytes};
use crate::error::{Error, Matrix, Result};
use crate::safe::matmul::{BQuant, Core, Matmul};
use crate::safe::mem::TensorMem;
use crate::safe::runtime::Runtime;

/// A task of the engine's lanes.
pub(crate) enum Task {
    /// Build this lane's shard of linear `id` (its contexts and B memories).
    Register {
        id: u64,
        build: Box<BuildShard>,
    },
    /// Run this lane's shard of a forward chunk.
    Forward(Forward),
    /// Run this lane's shards of several forward chunks, one after another
    /// ([`super::Linear::forward_many`]).
    Forwards(Vec<Forward>),
    /// Rotate and prepare a share of a prompt chunk's rows.
    Prepare(PrepareRows),
    /// Linear `id` is gone.
    Remove {
        id: u64,
    },
    Ping,
    Exit,
}

/// How a lane builds its shard of a linear, on the lane's thread.
pub(crate) type BuildShard = dyn FnOnce(&Runtime, &mut LaneIo) -> Result<Box<dyn LaneShard>> + Send;

/// One forward chunk for one lane.
pub(crate) struct Forward {
    pub(crate) id: u64,
    /// Output rows; the input has `m × per` rows.
    pub(crate) m: usize,
    pub(crate) per: usize,
    /// The context's M: `m × per` rounded up to a bucket.
    pub(crate) bucket: usize,
    /// The prepared input, [bucket, ld], and its row scales.
    pub(crate) input: Arc<Prepared>,
    pub(crate) ld: usize,
    /// The lane's columns of the caller's output rows, written in place.
    pub(crate) out: OutCols,
}

/// Rows of a prompt chunk to rotate and prepare on a lane: the preparation of many rows is
/// split over the lanes instead of running on the caller while the cores wait.
pub(crate) struct PrepareRows {
    pub(crate) format: WeightFormat,
    /// The chunk's input rows [m, k].
    pub(crate) x: Arc<Vec<f32>>,
    /// The rows of `x` this lane prepares.
    pub(crate) rows: std::ops::Range<usize>,
    pub(crate) k: usize,
    pub(crate) k_pad: usize,
    pub(crate) rotation: Option<Rotation>,
    /// Each row prepared twice (itself and its residual).
    pub(crate) twice: bool,
    /// Buffers for the result, returned in the reply: [rows × per, ld] and [rows × per].
    pub(crate) out: Prepared,
}

/// What a lane gives back.
pub(crate) enum Reply {
    /// Nothing (registration, removal, ping, a forward).
    Done,
    /// A [`PrepareRows`]'s rows and scales.
    Prepared(Prepared),
}

/// One lane's shard of a linear, whatever its format.
pub(crate) trait LaneShard: Send {
    /// Runs the shard of one forward chunk: per K segment pack A, run, accumulate; then
    /// finish the valid columns into the lane's columns of the output.
    fn forward(&mut self, lane: &mut LaneBufs, f: Forward, stats: (&Counters, usize))
    -> Result<()>;

    /// Its weights' bytes, segment by segment (the order a run reads them).
    fn weights(&self) -> Vec<&[u8]>;
}

/// The memories and scratch a lane's shards share.
#[derive(Default)]
pub(crate) struct LaneBufs {
    pub(crate) io: LaneIo,
    pub(crate) acc: Accumulators,
    /// Per-group int4: each input row's sums over the groups ([m, groups]).
    pub(crate) group_sums: Vec<f32>,
}

/// A lane's shared A and C memories, per IOMMU domain and weight format: an
/// `Option<IoMems<K>>` for the format's `K`.
#[derive(Default)]
pub(crate) struct LaneIo {
    shared: FxHashMap<(i32, WeightFormat), Box<dyn Any + Send>>,
}

impl LaneIo {
    /// The shared pair of `domain` for `K` (none until a shard of `K` in `domain` is built).
    fn shared<K: EngineKind>(&mut self, domain: i32) -> &mut Option<IoMems<K>> {
        self.shared
            .entry((domain, K::FORMAT))
            .or_insert_with(|| Box::new(None::<IoMems<K>>))
            .downcast_mut()
            .expect("a format's entry holds that format's memories")
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

/// One K segment of a block: its context and its B, written once and kept; A and C are the
/// lane's shared pair, or the segment's own when sharing is off.
struct Segment<K: MatmulKind> {
    mm: Matmul<K>,
    b: TensorMem<K::B>,
    own: Option<IoMems<K>>,
    /// First K row and rows of the segment.
    k0: usize,
    ks: usize,
}

/// A block of a shard's columns, no wider than the chip's N limit: one context per K segment.
struct Block<K: MatmulKind> {
    segments: Vec<Segment<K>>,
    /// Its first column in the shard, its columns (aligned), and those that exist in the
    /// output.
    c0: usize,
    width: usize,
    valid: usize,
}

/// One lane's part of one linear, with the tiles the runtime reported.
pub(crate) struct Shard<K: MatmulKind> {
    blocks: Vec<Block<K>>,
    /// The IOMMU domain of its memories.
    domain: i32,
    /// Per-output-channel scales of the shard's columns (quantised formats; empty otherwise),
    /// or with per-group int4 each column's group scales then offsets.
    ch_scales: Vec<f32>,
    /// Per-group int4: the group size and the groups per column (of `k_pad`).
    group: Option<(usize, usize)>,
    /// The linear's input features.
    k: usize,
    /// Native tile sizes: A's sK and C's sN.
    sk: usize,
    sn: usize,
}

/// What a lane needs to build its part of a linear.
pub(crate) struct ShardSpec<K: MatmulKind> {
    /// The linear's weights, shared by its lanes: rows = output channels, each `k_pad` long;
    /// this shard's are rows `row0..`.
    pub(crate) b: Arc<dyn WeightRows<K::B>>,
    /// The shard's first row in `b`.
    pub(crate) row0: usize,
    /// The linear's input features: columns `k..k_pad` of every row are padding, packed as
    /// zeros whatever `b` holds there.
    pub(crate) k: usize,
    /// Per output channel of the shard: its scale, or with `group` its groups' scales then
    /// their offsets.
    pub(crate) ch_scales: Vec<f32>,
    /// Per-group int4 ([`super::config::LinearOptions::int4_group`]): the group size and the
    /// order the runtime reads per-group parameters in.
    pub(crate) group: Option<(usize, rknn_chip::GroupOrder)>,
    /// The shard's blocks, columns relative to the shard
    /// ([`LinearPlan::blocks`](rknn_chip::plan::LinearPlan::blocks)).
    pub(crate) blocks: Vec<Columns>,
    pub(crate) k_pad: usize,
    /// (first K row, rows) per segment.
    pub(crate) segments: Arc<[(usize, usize)]>,
    pub(crate) buckets: Arc<[usize]>,
    pub(crate) core: Core,
    pub(crate) domain: i32,
    /// Whether the lane's contexts share one A and one C per IOMMU domain.
    pub(crate) share_io: bool,
}

impl<K: EngineKind> ShardSpec<K> {
    /// Builds the shard's contexts (native A/B/C, dynamic M over the buckets, on its core),
    /// one per block and K segment, and writes its weights into their B memories.
    pub(crate) fn build(self, rt: &Runtime, io: &mut LaneIo) -> Result<Box<dyn LaneShard>> {
        let mut blocks = Vec::with_capacity(self.blocks.len());
        let all = self.b.all();
        let mut tiles = None;
        let mut seg_w = Vec::new();
        for block in &self.blocks {
            let (c0, width) = (block.n0, block.width);
            let mut segments = Vec::with_capacity(self.segments.len());
            for &(k0, ks) in self.segments.iter() {
                let mut builder = rt
                    .matmul::<K>(self.buckets[0], ks, width)
                    .dynamic_m(&self.buckets)
                    .ac_layout(Layout::Native)
                    .b_layout(Layout::Native)
                    .core(self.core)
                    .iommu_domain(self.domain);
                if let Some((g, order)) = self.group {
                    builder = builder.quant_b(BQuant::PerGroup {
                        group_size: g,
                        scales: segment_group_scales(
                            &self.ch_scales,
                            (c0, width),
                            (k0, ks, self.k_pad),
                            g,
                            order,
                        ),
                        zps: Vec::new(),
                    });
                }
                let mm = builder.build()?;
                let (sk, _) = mm.native_tile(Matrix::A)?;
                let (sn, _) = mm.native_tile(Matrix::C)?;
                tiles = Some((sk, sn));
                let mut b = mm.alloc_b()?;
                let r0 = self.row0 + c0;
                let len = row_len::<K>(self.k_pad);
                let rows = all.get(r0 * len..(r0 + width) * len).ok_or(Error::Length {
                    what: "converted weights (n_pad × k_pad)",
                    expected: (r0 + width) * len,
                    got: all.len(),
                })?;
                // Per-group int4 stores -8..=7 (its grid is asymmetric): every nibble is valid.
                let check = if self.group.is_none() {
                    K::invalid_value(rows)
                } else {
                    None
                };
                if let Some((at, value)) = check {
                    return Err(Error::OutOfRange {
                        what: "converted weights",
                        index: r0 * self.k_pad + at,
                        value,
                        range: K::VALUE_RANGE,
                    });
                }
                if let (Some((g, _)), 0) = (self.group, k0) {
                    let per = group_params_per_row(self.k_pad, g);
                    let params = &self.ch_scales[c0 * per..(c0 + width) * per];
                    K::check_grouped(rows, (self.k, self.k_pad), g, params, r0)?;
                }
                K::write_b(&mm, rows, self.k, k0, ks, width, &mut seg_w, &mut b)?;
                let own = if self.share_io {
                    IoMems::ensure_shared(io.shared::<K>(self.domain), &mm)?;
                    None
                } else {
                    Some(IoMems::own(&mm)?)
                };
                segments.push(Segment { b, own, mm, k0, ks });
            }
            self.b.placed(self.row0 + c0..self.row0 + c0 + width);
            blocks.push(Block {
                segments,
                c0,
                width,
                valid: block.valid,
            });
        }
        // Every linear has at least one block and one segment (N, K >= 1).
        let (sk, sn) = tiles.expect("a linear has at least one context");
        Ok(Box::new(Shard::<K> {
            blocks,
            domain: self.domain,
            ch_scales: self.ch_scales,
            group: self.group.map(|(g, _)| (g, self.k_pad.div_ceil(g))),
            k: self.k,
            sk,
            sn,
        }))
    }
}

impl<K: EngineKind> LaneShard for Shard<K> {
    fn forward(
        &mut self,
        lane: &mut LaneBufs,
        f: Forward,
        (stats, lane_index): (&Counters, usize),
    ) -> Result<()> {
        let (sk, sn) = (self.sk, self.sn);
        let x = K::In::of(&f.input);
        let mut out = f.out;
        debug_assert_eq!(out.rows(), f.m, "the lane's view has the chunk's rows");
        // One clock read per phase boundary, one update of this lane's counters per call.
        let mut lap = Lap::start();
        if let Some((g, groups)) = self.group {
            K::group_sums(x, (f.m, f.ld, self.k), g, groups, &mut lane.group_sums);
            lap.mark(Phase::Collect);
        }
        for block in &mut self.blocks {
            let width = block.width;
            // The first segment sets every accumulator, so the buffer only grows (zeroing it
            // again whenever a wider linear followed a narrower one was a memset per call).
            let need = f.bucket * width;
            let acc = K::Acc::of(&mut lane.acc);
            if acc.len() < need {
                acc.resize(need, K::Acc::default());
            }
            let acc = &mut acc[..need];
            let mut shared = lane.io.shared::<K>(self.domain).as_mut();
            for (i, seg) in block.segments.iter_mut().enumerate() {
                let io = match (&mut seg.own, shared.as_deref_mut()) {
                    (Some(own), _) => own,
                    (None, Some(shared)) => shared,
                    // Built with sharing: the lane's pair of this domain exists from the build.
                    (None, None) => unreachable!("a shard's lane has the shared A/C of its domain"),
                };
                if let Err(e) = seg.mm.set_m(f.bucket) {
                    stats.add_lap(lane_index, &lap);
                    return Err(e);
                }
                K::pack_a(x, f.bucket, f.ld, seg.k0, seg.ks, sk, io.a.as_mut_slice());
                lap.mark(Phase::Pack);
                let ran = seg.mm.run(&io.a, &seg.b, &mut io.c);
                lap.mark(Phase::Run);
                if let Err(e) = ran {
                    stats.add_lap(lane_index, &lap);
                    return Err(e);
                }
                K::accumulate(io.c.as_slice(), f.bucket, width, sn, acc, i == 0);
                lap.mark(Phase::Collect);
            }
            if let (true, Some((_, groups))) = (block.valid > 0, self.group) {
                let params = &self.ch_scales[block.c0 * 2 * groups..];
                let sums = &lane.group_sums;
                out.with_columns(block.c0, block.valid, |out| {
                    K::finish_grouped(acc, (f.m, width, block.valid), params, groups, sums, out)
                });
            } else if block.valid > 0 {
                let scales = &self.ch_scales[block.c0.min(self.ch_scales.len())..];
                out.with_columns(block.c0, block.valid, |out| {
                    K::finish(
                        acc,
                        f.m,
                        f.per,
                        width,
                        block.valid,
                        &f.input.scales,
                        scales,
                        out,
                    )
                });
            }
            lap.mark(Phase::Collect);
        }
        stats.add_lap(lane_index, &lap);
        Ok(())
    }

    fn weights(&self) -> Vec<&[u8]> {
        self.blocks
            .iter()
            .flat_map(|b| &b.segments)
            .map(|s| as_bytes(s.b.as_slice()))
            .collect()
    }
}

/// The per-group scales of one context of per-group int4 weights: columns `c0..c0 + width`
/// of the shard (`params` holds `2 · k_pad / g` values per column, its group scales first)
/// and K rows `k0..k0 + ks` (whole groups), laid out in the runtime's `order` for a context
/// of `width` columns and `ks / g` groups. A scale of 0 (or not positive) is given as 1.0:
/// such a group holds q = 0 (padding, or a group of equal values, whose value is its offset).
fn segment_group_scales(
    params: &[f32],
    (c0, width): (usize, usize),
    (k0, ks, k_pad): (usize, usize, usize),
    g: usize,
    order: rknn_chip::GroupOrder,
) -> Vec<f32> {
    let per = group_params_per_row(k_pad, g);
    let (first, groups) = (k0 / g, ks / g);
    let mut out = vec![0f32; width * groups];
    for j in 0..width {
        let row = params.get((c0 + j) * per..(c0 + j + 1) * per);
        for gi in 0..groups {
            // The runtime takes positive scales only; a group of scale 0 (padding, or equal
            // values) holds q = 0, so any positive scale gives its zero product.
            let d = row.map_or(0.0, |r| r[first + gi]);
            out[order.index(gi, j, groups, width)] = if d > 0.0 { d } else { 1.0 };
        }
    }
    out
}

/// A lane's state: its runtime, shards and scratch.
pub(crate) struct WorkerState {
    rt: Runtime,
    // Dropped before `bufs`: the shards' contexts may hold the shared memories' bindings.
    pub(crate) shards: FxHashMap<u64, Box<dyn LaneShard>>,
    pub(crate) bufs: LaneBufs,
    /// Rotated rows and residuals of a [`Task::Prepare`].
    rotated: Vec<f32>,
    tmp: Vec<f32>,
    pub(crate) stats: Arc<Counters>,
    /// This lane's index: its cell of the counters.
    pub(crate) lane: usize,
    /// What to read ahead while idle, on an emulated runtime's worker lanes
    /// ([`super::emulator_cache`]); none on hardware and on the calling thread's lane.
    cache: Option<EmulatorCache>,
}

impl WorkerState {
    /// Lane `lane`'s state; `warm_bytes`: the read-ahead budget on an emulated runtime (`None`
    /// for a lane that never reads ahead).
    pub(crate) fn new(
        rt: Runtime,
        stats: Arc<Counters>,
        lane: usize,
        warm_bytes: Option<Arc<AtomicUsize>>,
    ) -> WorkerState {
        WorkerState {
            cache: warm_bytes.and_then(|b| EmulatorCache::for_runtime(&rt, b)),
            rt,
            shards: FxHashMap::default(),
            bufs: LaneBufs::default(),
            rotated: Vec::new(),
            tmp: Vec::new(),
            stats,
            lane,
        }
    }
}

impl WorkerState {
    /// Runs this lane's shard of one forward chunk.
    pub(crate) fn forward(&mut self, f: Forward) -> Result<()> {
        let (id, bucket) = (f.id, f.bucket);
        // A Linear removes its shards only when dropped, after its last forward.
        let shard = self
            .shards
            .get_mut(&id)
            .expect("a live Linear's shards are registered on its lanes");
        if let Some(c) = &mut self.cache {
            c.starts(id);
        }
        shard.forward(&mut self.bufs, f, (&self.stats, self.lane))?;
        if let Some(c) = &mut self.cache {
            c.ended(id, bucket);
        }
        Ok(())
    }
}

impl Work for Task {
    type State = WorkerState;
    type Reply = Reply;

    fn run(self, st: &mut WorkerState) -> Result<Reply> {
        match self {
            Task::Register { id, build } => {
                let shard = build(&st.rt, &mut st.bufs.io)?;
                st.shards.insert(id, shard);
                Ok(Reply::Done)
            }
            Task::Prepare(job) => Ok(Reply::Prepared(prepare_share(
                job,
                &mut st.rotated,
                &mut st.tmp,
            ))),
            Task::Forward(f) => {
                st.forward(f)?;
                Ok(Reply::Done)
            }
            Task::Forwards(list) => {
                for f in list {
                    st.forward(f)?;
                }
                Ok(Reply::Done)
            }
            Task::Remove { id } => {
                if let Some(c) = &mut st.cache {
                    c.forget(id);
                }
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
        let Some(cache) = &mut st.cache else {
            return;
        };
        let Some(id) = cache.take_pending() else {
            return;
        };
        let own = st.shards.get(&id).map(|s| s.weights()).unwrap_or_default();
        let read = cache.read_ahead(&own, interrupted);
        st.stats.add_warmed(st.lane, read);
    }
}

/// Rotates and prepares a lane's share of a chunk: the same per-row operations as the caller's
/// path (the rotation row by row, [`EngineKind::prepare_rows`]), so the same bits whichever
/// lane prepares a row.
fn prepare_share(job: PrepareRows, rotated: &mut Vec<f32>, tmp: &mut Vec<f32>) -> Prepared {
    with_format!(job.format, K => prepare_share_as::<K>(job, rotated, tmp))
}

fn prepare_share_as<K: EngineKind>(
    job: PrepareRows,
    rotated: &mut Vec<f32>,
    tmp: &mut Vec<f32>,
) -> Prepared {
    let PrepareRows {
        x,
        rows,
        k,
        k_pad,
        rotation,
        twice,
        mut out,
        ..
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
    let ld = K::input_ld(k, k_pad);
    let (dst, scales) = K::In::of_mut(&mut out);
    dst.resize(n * per * ld, K::In::default());
    scales.resize(n * per, 0.0);
    K::prepare_rows(src, n, k, k_pad, twice, tmp, dst, scales);
    out
}
