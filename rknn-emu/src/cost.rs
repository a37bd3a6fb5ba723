//! A cost model of the NPU: how long one `rknn_matmul_run` takes on the device, calibrated to
//! what has been measured on RK3588 boards.
//!
//! The emulator computes on the host CPU, so its wall time says nothing about a board. This
//! model says what the board would take, and the emulator keeps its figure per context and per
//! core for every run it makes ([`crate::Emulator::modelled`]). Everything it prints is a
//! **model**, labelled as such: calibrated to the points in [`calibration`], each with its
//! source and error, and extrapolated everywhere else. [`RK3576`] is the same model with
//! RK3576's public figures (two cores, 6 TOPS rated, a 32-bit memory interface, 4096-row K
//! segments) and RK3588's calibration where RK3576 publishes nothing: a prediction with
//! stated assumptions, not a calibrated model.
//!
//! # The model
//!
//! One run of C\[M, N\] = A\[M, K\] × B\[K, N\] on one core, while `busy` cores run at once:
//!
//! ```text
//! t = call + max(compute, memory)                       (K <= the chip's K segment)
//! t = call + 2·M·K·N / cliff_ops                        (K above it: the field's cliff)
//!
//! compute = 2·M·K·N / peak(dtype)
//! memory  = (passes · bytes(B) + bytes(A) + bytes(C)) / min(core_bw, ddr_bw / busy)
//! passes  = ceil(M / rows),  rows = max(1, floor(a_block_bytes / bytes(one row of A)))
//! ```
//!
//! * `call`: a fixed cost per run (submission, cache maintenance).
//! * `compute`: the rated MAC rate of a core for the operand type. For int8 GEMMs it never binds
//!   at the measured points: the field's 4096³ ran at 34 % of it.
//! * `memory`: the core holds a block of `rows` rows of A on chip and streams all of B past it,
//!   once per block; A and C move once. The rate is the core's own DMA rate, or its share of the
//!   DDR bandwidth when more cores stream at once. This one term reproduces the three things the
//!   field measured: the GEMM ceiling (0.69 TOPS at 4096³ is B streamed 128 times at ~11 GB/s),
//!   decode (M = 1 streams B once: bandwidth-bound), and why three concurrent contexts give
//!   2.77× rather than 3× (their share of DDR falls below one core's DMA rate).
//! * the K-segment cliff: one context with K above the segment size (8192 on RK3588) ran at
//!   0.02 TOPS; the model charges such runs at that rate.
//!
//! Layout (native or normal B) and quantisation granularity do not appear: the field measured
//! no difference between them. The f16 and int4 rates are not calibrated (no field figure
//! exists); their peaks are assumptions, marked as such in [`RK3588`].
//!
//! # Whole decoders
//!
//! [`CostModel::decoder_pass`] costs every linear of a decoder ([`DecoderShape`]: the
//! campaign's 9B stand-in [`CAMPAIGN_9B`], and the public shapes [`QWEN2_0_5B`],
//! [`TINYLLAMA_1_1B`], [`QWEN2_5_1_5B`], [`QWEN3_0_6B`], [`GEMMA2_2B`], [`PHI3_3_8B`],
//! [`LLAMA3_8B`], the drafts [`LLAMA3_2_1B`] and
//! [`QWEN2_5_0_5B`], the mixture of experts
//! [`OLMOE_1B_7B`] and its dense twin [`OLMOE_1B_7B_DENSE`]) term by term ([`NpuTerms`]);
//! [`CostModel::predict_llm_prompt`] adds the campaign's host time ([`host`]) for decode and
//! prefill rates and the time to the first token. Both cost the campaign's llama.cpp graph,
//! the calibrated one; [`CostModel::decoder_pass_in`] and [`CostModel::predict_llm_prompt_in`]
//! cost the same decoder in another [`DecoderLayout`]: this project's engine's
//! ([`EngineLayout`]: fused linears, contexts of at most 8192 columns, residual activations,
//! each linear split by the engine's own planner, [`rknn_chip::plan`]), with the same per-run
//! cost, nothing refitted. The calibration is frozen: the constants are those of the
//! table in `docs/npu-matmul-performance.md`, and a test fails when one changes.
//!
//! A mixture of experts ([`MoeShape`]) is costed by the same runs: per block the attention
//! linears, then each expert a pass touches once on its rows (decode: the `k` a token
//! uses; a prefill of `P` rows: the `n · (1 − (1 − k/n)^P)` distinct experts uniform routing
//! touches, [`DecoderShape::experts_touched`]), gate, up and down apart in the campaign's
//! layout, gate-up and down in the engine's (split over the cores, or each expert whole on one
//! core, [`ExpertLayout`], where the pass waits for the core holding the most touched experts,
//! [`DecoderShape::busiest_lane_experts`]); the f32 routers on one host thread
//! ([`host::router_s`], an uncalibrated assumption) are added to the host time.
//!
//! Speculative decoding with a draft model ([`CostModel::spec_decode`], [`SpecDecode`]) is
//! priced from the same passes: a cycle is `k` single-row passes of the draft and one pass of
//! the model over `k + 1` rows, each with a decoded token's host share; with each drafted
//! token accepted with probability `α`, independently, a cycle yields
//! `E = (1 − α^(k+1)) / (1 − α)` tokens ([`spec_tokens_per_cycle`]), and decode runs at
//! `E / cycle`. A measured accepted / drafted is not `α` (the drafts after the first
//! rejection are never accepted): [`spec_alpha_from_acceptance`] converts it.

use std::time::Duration;

use rknn_chip::plan::{LinearPlan, MChunk, PlanError, SplitRules, m_bucket, m_chunks};
use rknn_chip::{ElemKind, MatmulType, Platform, USER_GUIDE_MAX_N};

/// The linears of the engine's layout and which of them run residual activations, defined
/// with the engine's plan in `rknn-chip` (the LLM names the same ones).
pub use rknn_chip::{LinearRole, Residual};

/// The cost model of one chip's NPU. The fields are public so that a user with better
/// measurements can adjust them; [`RK3588`] is the calibrated model.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CostModel {
    /// The chip.
    pub platform: Platform,
    /// Fixed cost of one `rknn_matmul_run`, in seconds.
    pub call_s: f64,
    /// Peak int8 × int8 rate of one core, in operations (2 per MAC) per second.
    pub peak_i8: f64,
    /// Peak f16 × f16 rate of one core.
    pub peak_f16: f64,
    /// Peak int4 × int4 rate of one core.
    pub peak_i4: f64,
    /// Bytes of A a core holds on chip while B streams past them.
    pub a_block_bytes: f64,
    /// Bytes per second one core's DMA moves when it has DDR to itself.
    pub core_bw: f64,
    /// Bytes per second DDR delivers to the NPU cores together.
    pub ddr_bw: f64,
    /// Rows of K above which one context falls off the cliff (`None`: no cliff).
    pub k_segment: Option<usize>,
    /// Operations per second of a run above the K segment.
    pub cliff_ops: f64,
    /// NPU cores.
    pub cores: usize,
}

/// The calibrated model of RK3588 (librknnrt 2.3.2, NPU at 1.0 GHz, LPDDR5). Where each number
/// comes from is in [`calibration`] and `docs/npu-matmul-performance.md`.
pub const RK3588: CostModel = CostModel {
    platform: Platform::Rk3588,
    // No field measurement isolates it; of the order of the ~100 µs the campaign measured for
    // a bind. At 50 µs it is 5 % of the 9B decode prediction.
    call_s: 50e-6,
    // Rated: 2 TOPS per core (6 TOPS over three cores).
    peak_i8: 2.0e12,
    // Not published for matmul: assumed half the int8 rate. Uncalibrated.
    peak_f16: 1.0e12,
    // Not published for matmul: assumed twice the int8 rate. Uncalibrated.
    peak_i4: 4.0e12,
    // 32 rows of K = 4096 int8: with core_bw this gives 0.69 TOPS at 4096³.
    a_block_bytes: 128.0 * 1024.0,
    // Fitted to 0.69 TOPS at i8 4096³ on one core.
    core_bw: 11.2e9,
    // Fitted to the 9B decode (2.98 tok/s); the field reports ~28 GB/s realised in decode.
    ddr_bw: 30.3e9,
    k_segment: Some(8192),
    // Fitted between the field's 0.02 TOPS and "14× slower" at K = 15360.
    cliff_ops: 21.5e9,
    cores: 3,
};

/// The peak DDR bandwidth of the campaign's RK3588 board: 64-bit LPDDR5-6400, 8 bytes ×
/// 6.4 GT/s = 51.2 GB/s (fact sheet §9).
pub const RK3588_DDR_PEAK: f64 = 51.2e9;

/// The share of its DDR peak the calibrated RK3588 model streams at: [`RK3588`]'s `ddr_bw`,
/// 30.3 GB/s (fitted to the 9B decode), over [`RK3588_DDR_PEAK`], 51.2 GB/s: 0.592.
pub const RK3588_DDR_REALISED: f64 = 30.3e9 / RK3588_DDR_PEAK;

/// The peak DDR bandwidth taken for RK3576: its memory interface is 32 bits wide (two 16-bit
/// channels of LPDDR4/4X/5: public spec listings, e.g. CNX Software's RK3576 specifications),
/// half of RK3588's 64. The data rate is an **assumption**: LPDDR5 at 6400 MT/s, the rate of
/// the campaign's RK3588 board; no public source consulted states RK3576's top rate. 4 bytes ×
/// 6.4 GT/s = 25.6 GB/s. A board with LPDDR4X-4266 has 17.1 GB/s (−33 %).
pub const RK3576_DDR_PEAK: f64 = 25.6e9;

/// The modelled RK3576 (two NPU cores). **Not calibrated**: no RK3576 measurement exists here.
/// Its numbers are Rockchip's rated figures, the fact sheet's, and RK3588's calibration
/// carried over where RK3576 publishes nothing; each is marked rated, public or assumed. What
/// it gives for RKLLM's RK3576 models and how far each assumption moves it is in
/// `docs/npu-matmul-performance.md` ("RK3576").
pub const RK3576: CostModel = CostModel {
    platform: Platform::Rk3576,
    // Assumed: RK3588's (no RK3576 measurement).
    call_s: 50e-6,
    // Rated: 6 TOPS int8 over two cores, 3 TOPS a core.
    peak_i8: 3.0e12,
    // Assumed: half the int8 rate, as on RK3588 (no published matmul figure). Uncalibrated.
    peak_f16: 1.5e12,
    // Assumed: twice the int8 rate, as on RK3588. Uncalibrated.
    peak_i4: 6.0e12,
    // Assumed: RK3588's 128 KiB.
    a_block_bytes: 128.0 * 1024.0,
    // Assumed: RK3588's fitted 11.2 GB/s per core.
    core_bw: 11.2e9,
    // Public width, assumed rate: RK3576_DDR_PEAK (25.6 GB/s) at RK3588's realised share
    // (0.592): 15.15 GB/s.
    ddr_bw: RK3576_DDR_PEAK * RK3588_DDR_REALISED,
    // Fact sheet §6: native B in segments of 4096 K rows on RK3576.
    k_segment: Some(4096),
    // Assumed: RK3588's rate above the segment.
    cliff_ops: 21.5e9,
    // Public: two NPU cores.
    cores: 2,
};

impl CostModel {
    /// The model of a chip, if there is one: [`RK3588`], calibrated to the field campaign, and
    /// [`RK3576`], built from its public figures and RK3588's calibration (not calibrated
    /// itself). `None` for the single-core chips.
    pub fn for_platform(platform: Platform) -> Option<&'static CostModel> {
        match platform {
            Platform::Rk3588 => Some(&RK3588),
            Platform::Rk3576 => Some(&RK3576),
            _ => None,
        }
    }

    /// The modelled device time of one run of type `t` on one core while `busy_cores` cores
    /// (this one included) run at once: the call the lead's LLM driver makes per linear.
    ///
    /// ```
    /// use rknn_emu::cost::RK3588;
    /// use rknn_emu::rknn_chip::MatmulType;
    /// let t = RK3588.modelled_run(4096, 4096, 4096, MatmulType::I8_I8_I32, 1);
    /// let tops = 2.0 * 4096f64.powi(3) / t.as_secs_f64() / 1e12;
    /// assert!((tops - 0.69).abs() < 0.01); // the field's single-core figure
    /// ```
    pub fn modelled_run(
        &self,
        m: usize,
        k: usize,
        n: usize,
        t: MatmulType,
        busy_cores: usize,
    ) -> Duration {
        self.run(&Run {
            m,
            k,
            n,
            t,
            busy_cores,
        })
        .time()
    }

    /// The peak rate of one core for a matmul type: the narrower operand's rate for the mixed
    /// types (int4 B with f16 A runs at most at the f16 rate).
    pub fn peak(&self, t: MatmulType) -> f64 {
        let rate = |k: ElemKind| match k {
            ElemKind::I4 => self.peak_i4,
            ElemKind::I8 => self.peak_i8,
            _ => self.peak_f16,
        };
        rate(t.a).min(rate(t.b))
    }

    /// The rated peak of one core in TOPS, where Rockchip publishes one (int8 only).
    pub fn rated_tops(&self, t: MatmulType) -> Option<f64> {
        (t.a == ElemKind::I8 && t.b == ElemKind::I8).then_some(self.peak_i8 / 1e12)
    }

    /// The DDR rate one core gets while `busy` cores stream at once.
    pub fn bandwidth(&self, busy: usize) -> f64 {
        let busy = busy.clamp(1, self.cores.max(1));
        self.core_bw.min(self.ddr_bw / busy as f64)
    }

    /// The modelled cost of one run, term by term.
    pub fn run(&self, r: &Run) -> RunCost {
        let (m, k, n) = (r.m as f64, r.k as f64, r.n as f64);
        let ops = 2.0 * m * k * n;
        let size = |kind: ElemKind, count: f64| count * kind.bits() as f64 / 8.0;
        let row = size(r.t.a, k).max(1.0);
        let rows = (self.a_block_bytes / row).floor().max(1.0);
        let passes = (m / rows).ceil().max(1.0);
        let bytes = passes * size(r.t.b, k * n) + size(r.t.a, m * k) + size(r.t.c, m * n);
        let compute = ops / self.peak(r.t);
        let memory = bytes / self.bandwidth(r.busy_cores);
        let cliff = self.k_segment.is_some_and(|s| r.k > s);
        let (body, bound) = if cliff {
            (ops / self.cliff_ops, Bound::KCliff)
        } else if memory >= compute {
            (memory, Bound::Memory)
        } else {
            (compute, Bound::Compute)
        };
        RunCost {
            ops,
            bytes,
            passes: passes as u64,
            call_s: self.call_s,
            compute_s: compute,
            memory_s: memory,
            total_s: self.call_s + body,
            bound,
        }
    }

    /// The modelled NPU time of one forward pass of a decoder over `rows` rows (tokens), in
    /// the campaign's layout ([`DecoderLayout::Campaign`], the calibrated one), every linear
    /// split as [`CostModel::linear`] splits it: N in `cores` shards (one context per core,
    /// all running at once), K in segments of at most the chip's segment size. The output
    /// projection runs over `head_rows` rows (llama.cpp computes the logits of the last prompt
    /// token only during prefill). Host work (quantisation, attention, sampling) is not in it.
    pub fn decoder_pass(
        &self,
        d: &DecoderShape,
        rows: usize,
        head_rows: usize,
        cores: usize,
        t: MatmulType,
    ) -> PassCost {
        let mut total = PassCost::default();
        let mut linear = |n: usize, k: usize, m: usize, count: f64| {
            let one = self.linear(n, k, m, cores, t);
            total.add_expected(&one, count);
        };
        let l = d.layer_linears();
        for &(n, k) in &l[..4] {
            linear(n, k, rows, d.layers as f64);
        }
        // The feed-forward: once per block, or each touched expert once on its rows (gate, up
        // and down apart, as llama.cpp's graph keeps them), and the shared expert on all rows.
        let (touched, m) = (d.experts_touched(rows), d.expert_rows(rows));
        for &(n, k) in &l[4..] {
            linear(n, k, m, d.layers as f64 * touched);
        }
        if let Some(fs) = d.moe.map(|x| x.n_ff_shared).filter(|&fs| fs > 0) {
            for (n, k) in [(fs, d.hidden), (fs, d.hidden), (d.hidden, fs)] {
                linear(n, k, rows, d.layers as f64);
            }
        }
        linear(d.vocab, d.hidden, head_rows, 1.0);
        total
    }
}

impl CostModel {
    /// The modelled NPU time of one linear y[M, N] = x[M, K] × W[N, K]ᵀ split as the
    /// campaign's graph splits it: N in `cores` shards aligned to 32 (one context per core, all
    /// running at once), K in equal segments of at most the chip's segment size, run one after
    /// another on each core. [`CostModel::engine_linear`] splits it as this project's engine
    /// does.
    pub fn linear(&self, n: usize, k: usize, m: usize, cores: usize, t: MatmulType) -> PassCost {
        let cores = cores.clamp(1, self.cores.max(1));
        let shard = n.div_ceil(cores).next_multiple_of(32);
        let segs = match self.k_segment {
            Some(s) if k > s => k.div_ceil(s),
            _ => 1,
        };
        let ks = k.div_ceil(segs).next_multiple_of(32);
        let one = self.run(&Run {
            m,
            k: ks,
            n: shard,
            t,
            busy_cores: cores,
        });
        let terms = NpuTerms::of_run(&one, ks * shard, t);
        let mut total = NpuTerms::default();
        total.add(&terms, segs as f64);
        PassCost {
            // Every core runs its shard at once: the linear takes as long as one shard.
            npu_s: segs as f64 * one.total_s,
            runs_per_core: segs as u64,
            weight_bytes: (k * n) as f64 * t.b.bits() as f64 / 8.0,
            terms: total,
        }
    }
}

impl CostModel {
    /// [`CostModel::decoder_pass`] with the decoder laid out as `layout` says: the campaign's
    /// (exactly [`CostModel::decoder_pass`]) or this project's engine's
    /// ([`EngineLayout::block_linears`] per block and [`EngineLayout::head`] over `head_rows`
    /// rows, none when it is 0, each costed by [`CostModel::engine_linear`] on `cores` lanes).
    pub fn decoder_pass_in(
        &self,
        d: &DecoderShape,
        rows: usize,
        head_rows: usize,
        cores: usize,
        t: MatmulType,
        layout: &DecoderLayout,
    ) -> PassCost {
        let e = match layout {
            DecoderLayout::Campaign => return self.decoder_pass(d, rows, head_rows, cores, t),
            DecoderLayout::Engine(e) => e,
        };
        let mut total = PassCost::default();
        let [qkv, o, gate_up, down] = e.block_linears(d);
        for l in [qkv, o] {
            total.add(&self.engine_linear(&l, rows, cores, t, e), d.layers as u64);
        }
        // The feed-forward: once per block, or each touched expert once on its rows (gate-up
        // fused, then down: 2 linears an expert), and the shared expert on all rows.
        let (touched, m) = (d.experts_touched(rows), d.expert_rows(rows));
        match (d.moe, e.experts) {
            (Some(_), ExpertLayout::PerCore) if rows > 0 => {
                // Each expert whole on one lane, the lanes at once: the pass waits for the
                // busiest lane's experts, each run on its share of DDR while the others
                // stream too; every touched expert's weights are read.
                let lanes = cores.clamp(1, self.cores.max(1));
                let busiest = d.busiest_lane_experts(rows, lanes);
                let busy = (touched.ceil() as usize).clamp(1, lanes);
                for l in [gate_up, down] {
                    let one = self.engine_linear_on(&l, m, 1, busy, t, e);
                    let times = d.layers as f64 * busiest;
                    total.npu_s += times * one.npu_s;
                    total.runs_per_core += (times * one.runs_per_core as f64).round() as u64;
                    total.weight_bytes += d.layers as f64 * touched * one.weight_bytes;
                    total.terms.add(&one.terms, times);
                }
            }
            _ => {
                for l in [gate_up, down] {
                    let one = self.engine_linear(&l, m, cores, t, e);
                    total.add_expected(&one, d.layers as f64 * touched);
                }
            }
        }
        for l in e.shared_linears(d).into_iter().flatten() {
            total.add(&self.engine_linear(&l, rows, cores, t, e), d.layers as u64);
        }
        total.add(&self.engine_linear(&e.head(d), head_rows, cores, t, e), 1);
        total
    }

    /// The modelled NPU time of one linear of the engine over `rows` input rows, split as the
    /// engine splits it, by the same planner ([`rknn_chip::plan`], through
    /// [`CostModel::engine_plan`]): the shape padded to the chip's alignment for B's element
    /// type, N over `lanes` lanes in whole aligned blocks (as equal as they go), each lane's
    /// columns into contexts of at most [`EngineLayout::max_n_per_context`] columns (as equal
    /// as they go), K in segments of the model's segment size and the rest; the rows in chunks
    /// of at most [`EngineLayout::max_m`] rows of A, each run at its bucket's M
    /// ([`rknn_chip::plan::m_chunks`]), two rows of A per input row when the linear is
    /// [`EngineLinear::residual`]. Each lane runs its contexts one after another, the lanes at
    /// once: the linear takes as long as the slowest lane, whose runs and terms it reports.
    /// Zero rows or no weights cost nothing (a head that computes no logits); padded weights
    /// beyond the address space cost `f64::INFINITY`.
    pub fn engine_linear(
        &self,
        l: &EngineLinear,
        rows: usize,
        lanes: usize,
        t: MatmulType,
        e: &EngineLayout,
    ) -> PassCost {
        self.engine_linear_on(l, rows, lanes, 0, t, e)
    }

    /// [`CostModel::engine_linear`] while `busy` cores stream at once (0: the linear's own
    /// lanes), for linears that run beside others: a mixture's experts, each whole on one
    /// lane ([`ExpertLayout::PerCore`]).
    pub fn engine_linear_on(
        &self,
        l: &EngineLinear,
        rows: usize,
        lanes: usize,
        busy: usize,
        t: MatmulType,
        e: &EngineLayout,
    ) -> PassCost {
        if rows == 0 {
            return PassCost::default();
        }
        let weight_bytes = (l.k * l.n) as f64 * t.b.bits() as f64 / 8.0;
        let plan = match self.engine_plan(l, lanes, t, e) {
            Ok(plan) => plan,
            // No weights, nothing to run.
            Err(PlanError::Empty { .. }) => return PassCost::default(),
            // Padded weights beyond the address space: no plan, no finite time.
            Err(_) => {
                return PassCost {
                    npu_s: f64::INFINITY,
                    weight_bytes,
                    ..PassCost::default()
                };
            }
        };
        let busy = if busy == 0 {
            plan.shards.iter().flatten().count().max(1)
        } else {
            busy
        };
        let chunks: Vec<MChunk> = m_chunks(rows, l.rows_per_input_row(), e.max_m).collect();
        let mut slowest = PassCost::default();
        for shard in plan.shards.iter().flatten() {
            let blocks = plan.blocks(shard);
            let mut lane = PassCost::default();
            for chunk in &chunks {
                for block in &blocks {
                    for &(_, ks) in &plan.segments {
                        let n = block.width;
                        let one = self.run(&Run {
                            m: chunk.m,
                            k: ks,
                            n,
                            t,
                            busy_cores: busy,
                        });
                        lane.npu_s += one.total_s;
                        lane.runs_per_core += 1;
                        lane.terms.add(&NpuTerms::of_run(&one, ks * n, t), 1.0);
                    }
                }
            }
            if lane.npu_s > slowest.npu_s {
                slowest = lane;
            }
        }
        slowest.weight_bytes = weight_bytes;
        slowest
    }

    /// What the engine holds for `d` on `lanes` lanes with B of `t.b`: its contexts (one
    /// dma-buf handle each, for its B; A and C are shared per core and domain) and the
    /// padded weight elements, every held linear planned as the engine plans it (a mixture's
    /// experts whole on one lane under [`ExpertLayout::PerCore`]). Linears without a plan
    /// (beyond the address space) are left out.
    pub fn engine_held(
        &self,
        d: &DecoderShape,
        lanes: usize,
        t: MatmulType,
        e: &EngineLayout,
    ) -> (usize, f64) {
        let mut contexts = 0;
        let mut elems = 0.0;
        for (l, count, whole) in e.held_placed(d) {
            let plan = match self.engine_plan(&l, lanes, t, e) {
                Ok(plan) if whole => plan.on_lane(0),
                other => other,
            };
            if let Ok(plan) = plan {
                contexts += count * plan.contexts();
                elems += (count * plan.n_pad * plan.k_pad) as f64;
            }
        }
        (contexts, elems)
    }

    /// The engine's plan of linear `l` on `lanes` lanes (at most the model's cores) for B of
    /// `t.b` ([`rknn_chip::plan::LinearPlan`], the one the engine builds its contexts from):
    /// the chip's alignment for that element kind (1 where it has none) and this model's K
    /// segment ([`CostModel::k_segment`]), contexts of at most
    /// [`EngineLayout::max_n_per_context`] columns (one aligned block where that is less
    /// than one: the engine refuses such a limit).
    pub fn engine_plan(
        &self,
        l: &EngineLinear,
        lanes: usize,
        t: MatmulType,
        e: &EngineLayout,
    ) -> Result<LinearPlan, PlanError> {
        let lanes = lanes.clamp(1, self.cores.max(1));
        let (k_align, n_align) = self.platform.alignment(t.b).unwrap_or((1, 1));
        let rules = SplitRules {
            k_align,
            n_align,
            k_segment: self.k_segment,
            max_n_per_context: e.max_n_per_context.max(n_align),
        };
        LinearPlan::new(l.n, l.k, lanes, &rules)
    }
}

/// One run to cost.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Run {
    /// Rows of A and C.
    pub m: usize,
    /// The reduction dimension.
    pub k: usize,
    /// Columns of B and C.
    pub n: usize,
    /// The matmul type.
    pub t: MatmulType,
    /// Cores running at once, this one included (1 when it runs alone).
    pub busy_cores: usize,
}

/// Which term set a run's time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bound {
    /// The core's MAC rate.
    Compute,
    /// Moving B (once per block of A rows), A and C.
    Memory,
    /// K above the segment size in one context.
    KCliff,
}

impl Bound {
    /// "compute", "memory" or "K cliff".
    pub fn name(self) -> &'static str {
        match self {
            Bound::Compute => "compute",
            Bound::Memory => "memory",
            Bound::KCliff => "K cliff",
        }
    }
}

/// The modelled cost of one run.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RunCost {
    /// Operations (2 per multiply-accumulate).
    pub ops: f64,
    /// Bytes moved between DDR and the core.
    pub bytes: f64,
    /// Times B streams past the core.
    pub passes: u64,
    /// The fixed cost per call, seconds.
    pub call_s: f64,
    /// The compute term, seconds.
    pub compute_s: f64,
    /// The memory term, seconds.
    pub memory_s: f64,
    /// The modelled time of the run, seconds.
    pub total_s: f64,
    /// Which term set it.
    pub bound: Bound,
}

impl RunCost {
    /// The modelled time.
    pub fn time(&self) -> Duration {
        Duration::from_secs_f64(self.total_s)
    }

    /// Tera-operations per second at the modelled time.
    pub fn tops(&self) -> f64 {
        self.ops / self.total_s / 1e12
    }
}

/// The modelled NPU cost of one forward pass ([`CostModel::decoder_pass`]) or of one linear
/// ([`CostModel::linear`]).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct PassCost {
    /// NPU time of the pass, seconds (the cores run their shards at once).
    pub npu_s: f64,
    /// Runs each core makes.
    pub runs_per_core: u64,
    /// Weight bytes of the linears.
    pub weight_bytes: f64,
    /// `npu_s` term by term (the terms add up to it).
    pub terms: NpuTerms,
}

impl PassCost {
    /// Adds `times` × `other`.
    fn add(&mut self, other: &PassCost, times: u64) {
        let c = times as f64;
        self.npu_s += c * other.npu_s;
        self.runs_per_core += times * other.runs_per_core;
        self.weight_bytes += c * other.weight_bytes;
        self.terms.add(&other.terms, c);
    }

    /// Adds an expected `times` × `other` (the experts a prefill pass touches need not be a
    /// whole number): times and terms scaled by it, runs by it rounded to the nearest run.
    fn add_expected(&mut self, other: &PassCost, times: f64) {
        self.npu_s += times * other.npu_s;
        self.runs_per_core += (times * other.runs_per_core as f64).round() as u64;
        self.weight_bytes += times * other.weight_bytes;
        self.terms.add(&other.terms, times);
    }
}

/// Modelled NPU time split by what set it, seconds. Each run's fixed cost is `call_s`; the
/// rest of the run goes to the term that bound it ([`Bound`]), a memory-bound run's shared
/// between the weights (B) and the activations (A and C) in proportion to their bytes. K
/// segments have no term of their own: each segment is one more run (its fixed cost) and
/// one more C written (activations).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct NpuTerms {
    /// The fixed cost of every run.
    pub call_s: f64,
    /// Streaming the weights (B) in memory-bound runs.
    pub weights_s: f64,
    /// Moving A and C in memory-bound runs.
    pub activations_s: f64,
    /// Compute-bound runs.
    pub compute_s: f64,
    /// Runs with K above the chip's segment (none when the linears are split as the engine
    /// splits them).
    pub k_cliff_s: f64,
}

impl NpuTerms {
    /// The terms of one run whose B holds `b_elems` elements of `t.b`: its fixed cost, and the
    /// time past it given to the term that set it; a memory-bound body is shared between B
    /// (the weights, streamed `passes` times) and A and C by bytes.
    fn of_run(one: &RunCost, b_elems: usize, t: MatmulType) -> NpuTerms {
        let body = one.total_s - one.call_s;
        let b_bytes = one.passes as f64 * b_elems as f64 * t.b.bits() as f64 / 8.0;
        let mut terms = NpuTerms {
            call_s: one.call_s,
            ..NpuTerms::default()
        };
        match one.bound {
            Bound::Memory => {
                terms.weights_s = body * b_bytes / one.bytes;
                terms.activations_s = body - terms.weights_s;
            }
            Bound::Compute => terms.compute_s = body,
            Bound::KCliff => terms.k_cliff_s = body,
        }
        terms
    }

    /// Adds `times` × `other`.
    pub fn add(&mut self, other: &NpuTerms, times: f64) {
        self.call_s += times * other.call_s;
        self.weights_s += times * other.weights_s;
        self.activations_s += times * other.activations_s;
        self.compute_s += times * other.compute_s;
        self.k_cliff_s += times * other.k_cliff_s;
    }

    /// The terms with their names: "per-run fixed cost", "weight reads", "activations (A, C)",
    /// "compute", "K cliff".
    pub fn named(&self) -> [(&'static str, f64); 5] {
        [
            ("per-run fixed cost", self.call_s),
            ("weight reads", self.weights_s),
            ("activations (A, C)", self.activations_s),
            ("compute", self.compute_s),
            ("K cliff", self.k_cliff_s),
        ]
    }

    /// The sum of the terms.
    pub fn total(&self) -> f64 {
        self.named().iter().map(|(_, s)| s).sum()
    }
}

/// The linear layers of a llama-style decoder, for [`CostModel::decoder_pass`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DecoderShape {
    /// What it stands for.
    pub name: &'static str,
    /// Transformer blocks.
    pub layers: usize,
    /// Hidden size (K of q, k, v, gate, up; N of o and down).
    pub hidden: usize,
    /// Feed-forward size (N of gate and up, K of down): of each expert, in a mixture of
    /// experts ([`DecoderShape::moe`]).
    pub n_ff: usize,
    /// Output columns of the query projection (heads × head size).
    pub q_dim: usize,
    /// Output columns of the key and of the value projection.
    pub kv_dim: usize,
    /// Vocabulary (N of the output projection).
    pub vocab: usize,
    /// The output projection is the token embedding (`tie_word_embeddings`): the model holds
    /// one vocab × hidden matrix instead of two. Every decoded token still reads it whole, as
    /// the output projection; only the model's size changes.
    pub tied_embeddings: bool,
    /// The feed-forward is a mixture of experts (`None`: one dense feed-forward of
    /// [`DecoderShape::n_ff`]).
    pub moe: Option<MoeShape>,
}

/// A mixture-of-experts feed-forward: each block holds `experts` feed-forwards of the
/// decoder's [`DecoderShape::n_ff`] and a router (`experts × hidden`, f32 on the host); each
/// row runs the `used` its router picks, and the shared expert, if any, on every row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MoeShape {
    /// Experts per block (`expert_count`).
    pub experts: usize,
    /// Experts each row runs (`expert_used_count`).
    pub used: usize,
    /// Hidden width of the shared expert every row runs (0: none).
    pub n_ff_shared: usize,
}

impl DecoderShape {
    /// (N, K) of the linears of one block: q, k, v, o, gate, up, down (in a mixture of experts,
    /// gate, up and down are one expert's).
    pub fn layer_linears(&self) -> [(usize, usize); 7] {
        let (h, f) = (self.hidden, self.n_ff);
        [
            (self.q_dim, h),
            (self.kv_dim, h),
            (self.kv_dim, h),
            (h, self.q_dim),
            (f, h),
            (f, h),
            (h, f),
        ]
    }

    /// Weights of one block's attention linears (q, k, v, o) and of one feed-forward (gate,
    /// up, down; one expert's in a mixture).
    fn block_weights(&self) -> (usize, usize) {
        let l = self.layer_linears();
        let sum = |ls: &[(usize, usize)]| ls.iter().map(|(n, k)| n * k).sum::<usize>();
        (sum(&l[..4]), sum(&l[4..]))
    }

    /// The shared expert's weights in one block (0 without one).
    fn shared_weights(&self) -> usize {
        self.moe.map_or(0, |m| 3 * m.n_ff_shared * self.hidden)
    }

    /// Weights of all linears a decoded token runs, the output projection included: what the
    /// NPU reads per decoded token. In a mixture of experts, the `used` experts of each block
    /// (and the shared one), not all of them: its active weights.
    pub fn weights(&self) -> u64 {
        let (attn, ffn) = self.block_weights();
        let used = self.moe.map_or(1, |m| m.used);
        let block = attn + used * ffn + self.shared_weights();
        (self.layers * block + self.vocab * self.hidden) as u64
    }

    /// Weights of every matrix the model holds: the attention and every expert's feed-forward
    /// of every block (in a mixture, all `experts`, the shared one and the router), the output
    /// projection, and the token embedding unless it is the output projection
    /// ([`DecoderShape::tied_embeddings`]). Norms and biases are not counted.
    pub fn parameters(&self) -> u64 {
        let embedding = if self.tied_embeddings {
            0
        } else {
            self.vocab * self.hidden
        };
        let (attn, ffn) = self.block_weights();
        let block = match self.moe {
            None => attn + ffn,
            Some(m) => attn + m.experts * (ffn + self.hidden) + self.shared_weights(),
        };
        (self.layers * block + self.vocab * self.hidden + embedding) as u64
    }

    /// The feed-forwards one block runs in a pass over `rows` rows: 1 for a dense block (0
    /// for no rows); in a mixture of `n` experts of which each row uses `k`, the expected
    /// number of distinct experts the rows choose, `n · (1 − (1 − k/n)^rows)`, assuming each
    /// row's choice is uniform and independent of the others' (`k` for one row, all `n` as
    /// rows grow). Each touched expert runs once on its rows ([`DecoderShape::expert_rows`]).
    pub fn experts_touched(&self, rows: usize) -> f64 {
        if rows == 0 {
            return 0.0;
        }
        match self.moe {
            None => 1.0,
            Some(m) => {
                let (n, k) = (m.experts as f64, m.used.min(m.experts) as f64);
                n * (1.0 - (1.0 - k / n).powi(rows.min(i32::MAX as usize) as i32))
            }
        }
    }

    /// The rows each touched feed-forward runs on in a pass over `rows` rows: `rows` for a
    /// dense block; in a mixture, the `rows · k` (row, expert) pairs shared by the
    /// [`DecoderShape::experts_touched`] experts, rounded to whole rows (a run has a whole
    /// number of rows; the uniform-routing mean), at least 1 and at most `rows`.
    pub fn expert_rows(&self, rows: usize) -> usize {
        match self.moe {
            None => rows,
            Some(_) if rows == 0 => 0,
            Some(m) => {
                let pairs = (rows * m.used) as f64;
                ((pairs / self.experts_touched(rows)).round() as usize).clamp(1, rows)
            }
        }
    }

    /// The expected number of touched experts ([`DecoderShape::experts_touched`]) on the lane
    /// holding the most of them, with expert `x` on lane `x mod lanes`
    /// ([`ExpertLayout::PerCore`]): a pass over one row touches `k` distinct experts, uniformly
    /// (exact: the multivariate hypergeometric law of the lanes' counts); a pass over more
    /// rows touches each expert with probability `1 − (1 − k/n)^rows`, taken independently
    /// (the lanes' counts binomial). 1 for a dense block.
    pub fn busiest_lane_experts(&self, rows: usize, lanes: usize) -> f64 {
        let Some(m) = self.moe else {
            return if rows == 0 { 0.0 } else { 1.0 };
        };
        if rows == 0 {
            return 0.0;
        }
        let (n, k, lanes) = (m.experts, m.used.min(m.experts), lanes.max(1));
        let held: Vec<usize> = (0..lanes)
            .map(|l| n / lanes + usize::from(l < n % lanes))
            .collect();
        if rows == 1 {
            // Σ over the lanes' counts c (Σ c = k) of max(c) · Π C(n_l, c_l) / C(n, k).
            fn walk(held: &[usize], left: usize, max: usize, ways: f64, acc: &mut f64) {
                match held.split_first() {
                    None => {
                        if left == 0 {
                            *acc += ways * max as f64;
                        }
                    }
                    Some((&nl, rest)) => {
                        for c in 0..=left.min(nl) {
                            walk(rest, left - c, max.max(c), ways * choose(nl, c), acc);
                        }
                    }
                }
            }
            let mut acc = 0.0;
            walk(&held, k, 0, 1.0, &mut acc);
            return acc / choose(n, k);
        }
        let q = 1.0 - (1.0 - k as f64 / n as f64).powi(rows.min(i32::MAX as usize) as i32);
        // E[max] = Σ_{c ≥ 0} P(max > c) = Σ_c (1 − Π_l P(Bin(n_l, q) ≤ c)).
        let most = held.iter().copied().max().unwrap_or(0);
        let cdfs: Vec<Vec<f64>> = held
            .iter()
            .map(|&nl| {
                let mut cdf = Vec::with_capacity(most + 1);
                let mut sum = 0.0;
                for c in 0..=most {
                    if c <= nl {
                        sum += choose(nl, c) * q.powi(c as i32) * (1.0 - q).powi((nl - c) as i32);
                    }
                    cdf.push(sum.min(1.0));
                }
                cdf
            })
            .collect();
        (0..most)
            .map(|c| 1.0 - cdfs.iter().map(|cdf| cdf[c]).product::<f64>())
            .sum()
    }

    /// f32 router weights one block holds (`experts × hidden`; 0 for a dense block): read and
    /// multiplied on the host for every row ([`host::router_s`]).
    pub fn router_weights(&self) -> usize {
        self.moe.map_or(0, |m| m.experts * self.hidden)
    }

    /// Activation elements a pass over `rows` rows moves between the host and the NPU: every
    /// linear's input (rows × K, quantised and packed by the host) and output (rows × N,
    /// collected by it), the output projection's over `head_rows` rows. What the host glue of
    /// [`host::prefill_s`] scales with.
    /// In a mixture each row goes through its `used` experts (and the shared one): the
    /// experts' inputs and outputs are `rows · used` rows' worth.
    pub fn activations(&self, rows: usize, head_rows: usize) -> f64 {
        let l = self.layer_linears();
        let sum = |ls: &[(usize, usize)]| ls.iter().map(|(n, k)| n + k).sum::<usize>();
        let (used, shared) = self.moe.map_or((1, 0), |m| {
            let h = self.hidden;
            let fs = m.n_ff_shared;
            (m.used, if fs == 0 { 0 } else { 3 * (fs + h) })
        });
        let block = sum(&l[..4]) + used * sum(&l[4..]) + shared;
        let head = self.vocab + self.hidden;
        (rows * self.layers * block + head_rows * head) as f64
    }
}

/// A stand-in for the field campaign's 9B Q8_0 model, whose architecture the campaign does not
/// publish. It has the campaign's feed-forward size (K = n_ff = 15360, split in two K segments)
/// and its weight volume (8.93 G weights against the ~8.86 GB the campaign streamed per decoded
/// token): 36 blocks of hidden 4096 with grouped-query attention (32 × 128 query, 8 × 128 key
/// and value columns) and a 151 936-token vocabulary.
pub const CAMPAIGN_9B: DecoderShape = DecoderShape {
    name: "9B stand-in (36 × hidden 4096, n_ff 15360, GQA 32/8 × 128, vocab 151936)",
    layers: 36,
    hidden: 4096,
    n_ff: 15360,
    q_dim: 4096,
    kv_dim: 1024,
    vocab: 151_936,
    // Not published; the bytes a token reads do not depend on it.
    tied_embeddings: false,
    moe: None,
};

/// Qwen2-0.5B, from its `config.json`: hidden 896, 24 layers, 14 heads and 2 key/value heads
/// of 64, intermediate 4864, vocabulary 151 936, tied embeddings (494.0 M parameters).
pub const QWEN2_0_5B: DecoderShape = DecoderShape {
    name: "Qwen2-0.5B",
    layers: 24,
    hidden: 896,
    n_ff: 4864,
    q_dim: 14 * 64,
    kv_dim: 2 * 64,
    vocab: 151_936,
    tied_embeddings: true,
    moe: None,
};

/// TinyLlama-1.1B (`TinyLlama-1.1B-Chat-v1.0`), from its `config.json`: hidden 2048, 22
/// layers, 32 heads and 4 key/value heads of 64, intermediate 5632, vocabulary 32 000, separate
/// embedding and output projection (1.10 G parameters).
pub const TINYLLAMA_1_1B: DecoderShape = DecoderShape {
    name: "TinyLlama-1.1B",
    layers: 22,
    hidden: 2048,
    n_ff: 5632,
    q_dim: 32 * 64,
    kv_dim: 4 * 64,
    vocab: 32_000,
    tied_embeddings: false,
    moe: None,
};

/// Qwen2.5-1.5B, from its `config.json`: hidden 1536, 28 layers, 12 heads and 2 key/value heads
/// of 128, intermediate 8960 (above RK3588's 8192-row K segment: the down projection runs in
/// two segments), vocabulary 151 936, tied embeddings (1.54 G parameters).
pub const QWEN2_5_1_5B: DecoderShape = DecoderShape {
    name: "Qwen2.5-1.5B",
    layers: 28,
    hidden: 1536,
    n_ff: 8960,
    q_dim: 12 * 128,
    kv_dim: 2 * 128,
    vocab: 151_936,
    tied_embeddings: true,
    moe: None,
};

/// Qwen3-0.6B (`Qwen/Qwen3-0.6B`), from its `config.json`: hidden 1024, 28 layers, 16 heads
/// and 8 key/value heads of 128 (`head_dim` 128, wider than hidden / heads = 64: the query
/// projection has 2048 columns, twice the hidden size), intermediate 3072, vocabulary 151 936,
/// tied embeddings (596.0 M parameters, Qwen's "0.6B"). Its per-head q and k norms are host
/// work over vectors; the NPU sees the same seven linears as Qwen2's, without biases.
pub const QWEN3_0_6B: DecoderShape = DecoderShape {
    name: "Qwen3-0.6B",
    layers: 28,
    hidden: 1024,
    n_ff: 3072,
    q_dim: 16 * 128,
    kv_dim: 8 * 128,
    vocab: 151_936,
    tied_embeddings: true,
    moe: None,
};

/// Gemma-2-2B (`google/gemma-2-2b`), from its `config.json`: hidden 2304, 26 layers, 8 heads
/// and 4 key/value heads of 256 (`head_dim` 256: 2048 query and 1024 key and value columns),
/// intermediate 9216 (above RK3588's 8192-row K segment: the down projection runs in two
/// segments), vocabulary 256 000, tied embeddings (2.61 G parameters, Google's "2.6B"). What
/// sets Gemma 2 apart costs the host, not the NPU, and is not in the shape: the soft-capping
/// of attention scores (50) and of the final logits (30), the sliding window (4096) of every
/// other layer's attention, the two extra norms per block and the scaled embedding.
pub const GEMMA2_2B: DecoderShape = DecoderShape {
    name: "Gemma2-2B",
    layers: 26,
    hidden: 2304,
    n_ff: 9216,
    q_dim: 8 * 256,
    kv_dim: 4 * 256,
    vocab: 256_000,
    tied_embeddings: true,
    moe: None,
};

/// Phi-3-mini (`microsoft/Phi-3-mini-4k-instruct`), from its `config.json`: hidden 3072, 32
/// layers, 32 heads of 96 and as many key/value heads (no grouped-query attention: key and
/// value have 3072 columns each), intermediate 8192, vocabulary 32 064, separate embedding and
/// output projection (3.82 G parameters, Microsoft's "3.8B"). Its checkpoint stores q, k, v as
/// one `qkv_proj` and gate, up as one `gate_up_proj`: the same matrices as the shape's.
pub const PHI3_3_8B: DecoderShape = DecoderShape {
    name: "Phi3-3.8B",
    layers: 32,
    hidden: 3072,
    n_ff: 8192,
    q_dim: 32 * 96,
    kv_dim: 32 * 96,
    vocab: 32_064,
    tied_embeddings: false,
    moe: None,
};

/// Llama-3-8B (`Meta-Llama-3-8B`), from its `config.json`: hidden 4096, 32 layers, 32 heads
/// and 8 key/value heads of 128, intermediate 14336 (two K segments for the down projection),
/// vocabulary 128 256, separate embedding and output projection (8.03 G parameters).
pub const LLAMA3_8B: DecoderShape = DecoderShape {
    name: "Llama-3-8B",
    layers: 32,
    hidden: 4096,
    n_ff: 14336,
    q_dim: 32 * 128,
    kv_dim: 8 * 128,
    vocab: 128_256,
    tied_embeddings: false,
    moe: None,
};

/// Llama-3.2-1B (`meta-llama/Llama-3.2-1B`), from its public `config.json`: hidden 2048, 16
/// layers, 32 heads and 8 key/value heads of 64, intermediate 8192, vocabulary 128 256, tied
/// embeddings (1.24 G parameters). llama.cpp's loader names 16 llama blocks "Llama 3.2 1B"
/// (`src/models/llama.cpp`). A draft for the 8B of the same vocabulary: 128 256 tokens, as
/// [`LLAMA3_8B`]'s; token for token it is Llama-3.1-8B's (Llama 3.1 named three of Llama 3's
/// reserved tokens, 128004, 128008 and 128010), whose linears are [`LLAMA3_8B`]'s.
pub const LLAMA3_2_1B: DecoderShape = DecoderShape {
    name: "Llama-3.2-1B",
    layers: 16,
    hidden: 2048,
    n_ff: 8192,
    q_dim: 32 * 64,
    kv_dim: 8 * 64,
    vocab: 128_256,
    tied_embeddings: true,
    moe: None,
};

/// Qwen2.5-0.5B: the shape of [`QWEN2_0_5B`], whose numbers its `config.json` repeats (hidden
/// 896, 24 layers, 14 and 2 heads of 64, intermediate 4864, vocabulary 151 936, tied
/// embeddings); only the name differs. A draft for [`QWEN2_5_1_5B`]: the same tokenizer and
/// the same 151 936-row vocabulary.
pub const QWEN2_5_0_5B: DecoderShape = DecoderShape {
    name: "Qwen2.5-0.5B",
    ..QWEN2_0_5B
};

/// OLMoE-1B-7B (`allenai/OLMoE-1B-7B-0924`), from its `config.json`: hidden 2048, 16 layers,
/// 16 heads and 16 key/value heads of 128, a mixture of 64 experts of intermediate 1024 per
/// block of which each token uses 8 (no shared expert), vocabulary 50 304, separate embedding
/// and output projection (6.92 G parameters, 1.28 G of them active per token).
pub const OLMOE_1B_7B: DecoderShape = DecoderShape {
    name: "OLMoE-1B-7B",
    layers: 16,
    hidden: 2048,
    n_ff: 1024,
    q_dim: 16 * 128,
    kv_dim: 16 * 128,
    vocab: 50_304,
    tied_embeddings: false,
    moe: Some(MoeShape {
        experts: 64,
        used: 8,
        n_ff_shared: 0,
    }),
};

/// The dense twin of [`OLMOE_1B_7B`]: its attention, embedding and head, and one feed-forward
/// as wide as its 8 active experts together (8 × 1024 = 8192), so a decoded token reads the
/// same weights (1.28 G). These are also OLMo-1B's widths (hidden 2048, 16 layers, 16 heads,
/// MLP 8192, vocabulary 50 304), the dense model the OLMoE paper sets beside it.
pub const OLMOE_1B_7B_DENSE: DecoderShape = DecoderShape {
    name: "OLMoE-1B-7B's dense twin",
    n_ff: 8 * 1024,
    moe: None,
    ..OLMOE_1B_7B
};

/// How a decoder's linears are laid out on the NPU ([`CostModel::decoder_pass_in`],
/// [`CostModel::predict_llm_prompt_in`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecoderLayout {
    /// The field campaign's llama.cpp graph, the one the model is calibrated on: seven linears
    /// per block (q, k, v, o, gate, up, down), N split over the cores in 32-column shards, one
    /// context per core and K segment, one row of A per token
    /// ([`CostModel::decoder_pass`]).
    Campaign,
    /// This project's LLM engine ([`EngineLayout`]; [`ENGINE_LAYOUT`] is its default).
    Engine(EngineLayout),
}

impl DecoderLayout {
    /// "campaign" or "engine".
    pub fn name(&self) -> &'static str {
        match self {
            DecoderLayout::Campaign => "campaign",
            DecoderLayout::Engine(_) => "engine",
        }
    }
}

/// How this project's LLM engine lays a decoder out (`examples/llm/src/model/load.rs`, the
/// `rknn_matmul` engine's plans): q, k and v fused into one linear, gate and up into another,
/// o and down separate, the output head one linear; every linear's N over the lanes and each
/// lane's share in contexts of at most [`EngineLayout::max_n_per_context`] columns
/// ([`CostModel::engine_linear`]); the linears of [`EngineLayout::residual`] take two rows of
/// A per input row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EngineLayout {
    /// The widest context, in columns (`EngineConfig::max_n_per_context`; the default is the
    /// chip's measured largest N, 8192 on RK3588), rounded down to the chip's N alignment;
    /// one below the alignment is priced as one aligned block (the engine refuses it).
    pub max_n_per_context: usize,
    /// The most rows of A one context runs (`EngineConfig::max_m`, default 512): a forward
    /// over more is run in chunks.
    pub max_m: usize,
    /// Prompt tokens per forward pass (`GenerateParams::batch` of the LLM example, default
    /// 128); only the last pass computes logits, of its last row.
    pub prefill_batch: usize,
    /// Which linears quantise each input row twice (the LLM example's
    /// `EngineOptions::residual`, default [`Residual::OutputAndDown`]).
    pub residual: Residual,
    /// Where a mixture's experts go (the LLM example's `EngineOptions::experts`, default
    /// [`ExpertLayout::PerCore`]).
    pub experts: ExpertLayout,
}

/// Where the engine puts a mixture of experts' linears (the LLM example's
/// `ExpertPlacement`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExpertLayout {
    /// Each expert whole on one lane, expert `x` on lane `x mod lanes`; the experts a pass
    /// touches run on their lanes at once, so the pass waits for the lane holding the most of
    /// them ([`DecoderShape::busiest_lane_experts`]), each run on one core's share of DDR.
    PerCore,
    /// Each expert split over every lane like a dense linear, one after another.
    Split,
}

/// The engine's defaults on RK3588: contexts of at most 8192 columns, 512 rows of A,
/// prefill in passes of 128 tokens, residual activations on the head and the down projections.
pub const ENGINE_LAYOUT: EngineLayout = EngineLayout {
    max_n_per_context: 8192,
    max_m: 512,
    prefill_batch: 128,
    residual: Residual::OutputAndDown,
    experts: ExpertLayout::PerCore,
};

/// One linear of the engine's layout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EngineLinear {
    /// What it is.
    pub role: LinearRole,
    /// Output columns.
    pub n: usize,
    /// Input columns (the reduction).
    pub k: usize,
    /// Each input row is quantised twice and runs as two rows of A.
    pub residual: bool,
}

impl EngineLinear {
    /// Rows of A per input row: 2 with residual activations, else 1.
    pub fn rows_per_input_row(&self) -> usize {
        1 + usize::from(self.residual)
    }
}

impl EngineLayout {
    /// The engine's defaults on `platform`: [`ENGINE_LAYOUT`] with contexts of at most the
    /// widest N measured on the chip, or the user guide's 4096 where none is
    /// ([`Platform::measured_max_n`], as the engine's probe defaults): 8192 on RK3588, 4096 on
    /// RK3576.
    pub fn for_platform(platform: Platform) -> EngineLayout {
        EngineLayout {
            max_n_per_context: platform.measured_max_n().unwrap_or(USER_GUIDE_MAX_N),
            ..ENGINE_LAYOUT
        }
    }

    /// This layout for the matmul type `t`: activations of a float kind (f16, W4A16) are not
    /// quantised, so they have no residual rows ([`Residual::None`]); integer activations keep
    /// [`EngineLayout::residual`].
    pub fn for_type(&self, t: MatmulType) -> EngineLayout {
        let float = matches!(t.a, ElemKind::F16 | ElemKind::Bf16);
        EngineLayout {
            residual: if float { Residual::None } else { self.residual },
            ..*self
        }
    }

    fn linear(&self, role: LinearRole, n: usize, k: usize) -> EngineLinear {
        EngineLinear {
            role,
            n,
            k,
            residual: self.residual.applies(role),
        }
    }

    /// The linears of one block of `d`: qkv, o, gate-up, down (in a mixture of experts, one
    /// expert's gate-up and down).
    pub fn block_linears(&self, d: &DecoderShape) -> [EngineLinear; 4] {
        let (h, f) = (d.hidden, d.n_ff);
        [
            self.linear(LinearRole::Qkv, d.q_dim + 2 * d.kv_dim, h),
            self.linear(LinearRole::AttnOutput, h, d.q_dim),
            self.linear(LinearRole::GateUp, 2 * f, h),
            self.linear(LinearRole::Down, h, f),
        ]
    }

    /// The shared expert's gate-up and down in one block of `d`, if it has one.
    pub fn shared_linears(&self, d: &DecoderShape) -> Option<[EngineLinear; 2]> {
        let fs = d.moe.map_or(0, |m| m.n_ff_shared);
        (fs > 0).then(|| {
            [
                self.linear(LinearRole::GateUp, 2 * fs, d.hidden),
                self.linear(LinearRole::Down, d.hidden, fs),
            ]
        })
    }

    /// The linears the engine holds for `d` (each resident, with its own contexts), with how
    /// many of each: per block qkv and o, gate-up and down once per expert (`experts` times
    /// in a mixture) and the shared expert's; the head once.
    pub fn held_linears(&self, d: &DecoderShape) -> Vec<(EngineLinear, usize)> {
        self.held_placed(d)
            .into_iter()
            .map(|(l, c, _)| (l, c))
            .collect()
    }

    /// [`EngineLayout::held_linears`], each with whether it is placed whole on one lane (a
    /// mixture's experts under [`ExpertLayout::PerCore`]).
    fn held_placed(&self, d: &DecoderShape) -> Vec<(EngineLinear, usize, bool)> {
        let whole = d.moe.is_some() && self.experts == ExpertLayout::PerCore;
        let mut held: Vec<(EngineLinear, usize, bool)> = self
            .held_split(d)
            .into_iter()
            .map(|(l, c)| (l, c, false))
            .collect();
        for h in &mut held[2..4] {
            h.2 = whole;
        }
        held
    }

    fn held_split(&self, d: &DecoderShape) -> Vec<(EngineLinear, usize)> {
        let [qkv, o, gate_up, down] = self.block_linears(d);
        let per_block = d.moe.map_or(1, |m| m.experts);
        let mut held = vec![
            (qkv, d.layers),
            (o, d.layers),
            (gate_up, d.layers * per_block),
            (down, d.layers * per_block),
        ];
        for l in self.shared_linears(d).into_iter().flatten() {
            held.push((l, d.layers));
        }
        held.push((self.head(d), 1));
        held
    }

    /// The output head of `d`.
    pub fn head(&self, d: &DecoderShape) -> EngineLinear {
        self.linear(LinearRole::Output, d.vocab, d.hidden)
    }

    /// The context M the engine runs `m` rows of A at: the engine's bucket
    /// ([`rknn_chip::plan::m_bucket`]) with contexts of at most [`EngineLayout::max_m`] rows.
    pub fn context_m(&self, m: usize) -> usize {
        m_bucket(m, self.max_m)
    }

    /// Activation elements a forward over `rows` rows moves between the host and the NPU in
    /// this layout ([`DecoderShape::activations`] for the campaign's): every linear's input
    /// (quantised once per fused linear, twice with residual activations) and output, the
    /// head's over `head_rows` rows.
    /// In a mixture each row goes through its `used` experts: their inputs and outputs are
    /// `rows · used` rows' worth.
    pub fn activations(&self, d: &DecoderShape, rows: usize, head_rows: usize) -> f64 {
        let moved = |l: &EngineLinear, rows: usize| l.rows_per_input_row() * rows * (l.k + l.n);
        let [qkv, o, gate_up, down] = self.block_linears(d);
        let used = d.moe.map_or(1, |m| m.used);
        let shared: usize = self
            .shared_linears(d)
            .into_iter()
            .flatten()
            .map(|l| moved(&l, rows))
            .sum();
        let block = moved(&qkv, rows)
            + moved(&o, rows)
            + moved(&gate_up, rows * used)
            + moved(&down, rows * used)
            + shared;
        (d.layers * block + moved(&self.head(d), head_rows)) as f64
    }
}

/// Host time around the NPU in the campaign's LLM runs, which the NPU model does not describe.
/// Every number is derived from the campaign's own measurements (its 9B Q8_0 model, E5 build,
/// four host threads); the derivations are in `docs/npu-matmul-performance.md`. How host time
/// scales to other shapes is an assumption, one per phase: decode keeps the campaign's share
/// of the token ([`host::decode_s`]), prefill scales with the activations the host quantises
/// and collects ([`host::prefill_s`]).
pub mod host {
    use super::{CAMPAIGN_9B, DecoderShape, EngineLayout, Platform};

    /// Share of decode time outside `rknn_matmul_run`: 7.8 % (the campaign's instrumented
    /// decode: prepare A, run, collect C).
    pub const DECODE_SHARE: f64 = 0.078;
    /// Host seconds per 512-token prefill pass: 20.3 % (the campaign's serial fraction, which
    /// it showed matches its 1/2/3-core scaling) of the one-core pass (512 / 18.28 tok/s).
    pub const PREFILL_512_S: f64 = 0.203 * 512.0 / 18.28;
    /// Host seconds per decoded token in the build of the core-scaling runs: 7.8 % of the
    /// one-core token (1 / 0.89 tok/s).
    pub const DECODE_SCALING_BUILD_S: f64 = 0.078 / 0.89;
    /// Decode speed-up from pinning the host threads to the four Cortex-A76 cores: +12.8 %
    /// (the campaign's tg128, same binary: 3.35 tok/s pinned against 2.97 unpinned). An
    /// end-to-end ratio, applied to the whole decode rate: the pinned token (0.299 s) is
    /// shorter than the model's NPU time alone (0.311 s), so no speed-up of the host share
    /// alone reproduces it.
    pub const A76_PINNED_DECODE_SPEEDUP: f64 = 1.128;
    /// Prefill speed-up from the same pinning: +18.9 % (pp512: 51.37 tok/s pinned against
    /// 43.22 unpinned). An end-to-end ratio, applied to the whole prefill rate.
    pub const A76_PINNED_PREFILL_SPEEDUP: f64 = 1.189;

    /// Host seconds around a decoded token whose NPU time is `npu_s`: the campaign's share,
    /// `npu_s · DECODE_SHARE / (1 − DECODE_SHARE)`. It scales with the NPU time, so it never
    /// dominates a token.
    pub fn decode_s(npu_s: f64) -> f64 {
        npu_s * DECODE_SHARE / (1.0 - DECODE_SHARE)
    }

    /// [`decode_s`] on `board`: the campaign's share, its host part as much longer as the
    /// board's threads are slower than RK3588's A76 ([`Board::relative_to_a76`]; the same
    /// figure on [`RK3588_A76`]).
    pub fn decode_s_on(board: &Board, npu_s: f64) -> f64 {
        decode_s(npu_s) * board.relative_to_a76()
    }

    /// Host seconds around a prefill pass of `rows` tokens of `d` (the output projection over
    /// the last row): [`PREFILL_512_S`] per the activations of the campaign's 512-token pass
    /// ([`DecoderShape::activations`] of [`CAMPAIGN_9B`]), times this pass's. The campaign's
    /// host phases are quantising and packing A and collecting C, both per element; for the
    /// 9B at 512 rows this is [`PREFILL_512_S`] itself (3.6 ns per element).
    pub fn prefill_s(d: &DecoderShape, rows: usize) -> f64 {
        PREFILL_512_S * (d.activations(rows, 1) / CAMPAIGN_9B.activations(512, 1))
    }

    /// The engine's host glue (rotating and quantising the inputs, packing A, collecting C
    /// with the scales) per activation element of a 128-token prefill, in nanoseconds of
    /// thread time, measured on an AMD EPYC (Zen 3) guest of 2 vCPUs
    /// (`scripts/bench/host_cost.py`, the emulator, W8A8, random real-size GGUFs): Qwen2-0.5B
    /// 1.19, TinyLlama-1.1B 1.14, Qwen2.5-1.5B 1.15; the median.
    pub const ENGINE_GLUE_NS_HERE: f64 = 1.15;
    /// How much longer one Cortex-A76 thread of the campaign's board takes than one thread of
    /// that machine at GEMM-like host work: llama.cpp's CPU path on the campaign's 9B shapes
    /// (random Q8_0), pp512 12.64 tok/s on 2 threads there against the campaign's 13.65 on four
    /// A76 threads (6.32 against 3.41 tok/s a thread). The streaming rate (tg128: 2.93 against
    /// 2.78) gives 2.11: the glue carried by it is 14 % dearer.
    pub const A76_THREAD_SLOWDOWN: f64 = 1.85;
    /// Threads the engine's prefill glue spreads over on RK3588: its three lanes (a prompt
    /// chunk is prepared, packed and collected on every lane, as on the 2 lanes measured).
    pub const BOARD_GLUE_THREADS: f64 = 3.0;
    /// The engine's prefill glue per activation element on RK3588, wall nanoseconds:
    /// [`ENGINE_GLUE_NS_HERE`] × [`A76_THREAD_SLOWDOWN`] / [`BOARD_GLUE_THREADS`] = 0.71 (the
    /// campaign's llama.cpp backend: 3.6).
    pub const ENGINE_GLUE_NS: f64 = ENGINE_GLUE_NS_HERE * A76_THREAD_SLOWDOWN / BOARD_GLUE_THREADS;

    /// Host seconds of the engine's glue around a prefill pass of `rows` tokens of `d` laid
    /// out as `e` lays it out: [`ENGINE_GLUE_NS`] per activation element of the engine's
    /// linears ([`EngineLayout::activations`]: fused inputs quantised once, residual ones
    /// twice, the head over the last row). This engine's measured glue, carried to the board;
    /// [`prefill_engine_campaign_s`] is the same elements at the campaign's rate.
    pub fn prefill_engine_s(d: &DecoderShape, rows: usize, e: &EngineLayout) -> f64 {
        prefill_engine_s_on(&RK3588_A76, d, rows, e)
    }

    /// [`prefill_engine_s`] on `board`: [`ENGINE_GLUE_NS_HERE`] carried to the board's
    /// threads ([`Board::glue_ns`]) per activation element of the engine's linears.
    pub fn prefill_engine_s_on(
        board: &Board,
        d: &DecoderShape,
        rows: usize,
        e: &EngineLayout,
    ) -> f64 {
        board.glue_ns() * 1e-9 * e.activations(d, rows, 1)
    }

    /// [`prefill_s`]'s rate per element (the campaign's llama.cpp backend, 3.6 ns) over the
    /// engine layout's elements: what the engine's TTFT would be with the campaign's glue.
    pub fn prefill_engine_campaign_s(d: &DecoderShape, rows: usize, e: &EngineLayout) -> f64 {
        PREFILL_512_S * (e.activations(d, rows, 1) / CAMPAIGN_9B.activations(512, 1))
    }

    /// The model's own host ops between the linears in a prefill (norms, RoPE, activations,
    /// residual adds, the embedding rows and the last row's sampling), nanoseconds of wall time
    /// per token, block and element of the block's width (`hidden + n_ff`), on the 2 threads of
    /// the host pool of the machine [`ENGINE_GLUE_NS_HERE`] was measured on, by the same run
    /// (`scripts/bench/host_cost.py`, `llm-decode --json`'s `other_s` of a 128-token prompt):
    /// Qwen2-0.5B 1.71, TinyLlama-1.1B 1.52, Qwen2.5-1.5B 1.31; the median.
    pub const PREFILL_OPS_NS_HERE: f64 = 1.52;
    /// The prefill's attention (the prompt's rows over the positions before them), nanoseconds
    /// of wall time per multiply-add (`2 × q_dim` per attended position: the scores and the
    /// values), on those 2 threads, by the same run (`attention_s`): Qwen2-0.5B 0.0400,
    /// TinyLlama-1.1B 0.0403, Qwen2.5-1.5B 0.0321; the median.
    pub const PREFILL_ATTENTION_NS_HERE: f64 = 0.0400;
    /// A decoded token's host ops other than attention, microseconds of wall time per block:
    /// Qwen2-0.5B 16.3, TinyLlama-1.1B 16.3, Qwen2.5-1.5B 16.3 (the same run, 32 tokens after
    /// the prompt: a fixed cost per block, not per element, at these widths).
    pub const DECODE_OPS_US_PER_BLOCK_HERE: f64 = 16.3;
    /// A decoded token's attention, nanoseconds of wall time per multiply-add, on one thread
    /// (one row's attention stays on the calling thread): Qwen2-0.5B 0.110, TinyLlama-1.1B
    /// 0.099, Qwen2.5-1.5B 0.095; the median.
    pub const DECODE_ATTENTION_NS_HERE: f64 = 0.099;
    /// Threads of the host pool the prefill ops were measured on.
    pub const OPS_THREADS_HERE: f64 = 2.0;
    /// Threads of the host pool on RK3588: its four Cortex-A76 cores (the lanes wait on the NPU,
    /// which is idle while the host ops run).
    pub const BOARD_OPS_THREADS: f64 = 4.0;
    /// Positions after the prompt at which [`decode_ops_s`] is priced in the tables: the middle
    /// of the 64 tokens RKLLM's benchmark generates after its 128-token prompt.
    pub const DECODE_POSITIONS_AFTER_PROMPT: usize = 32;

    /// Host seconds of the model's own ops between the linears in a prefill of `rows` tokens
    /// of `d` from an empty cache, on RK3588: per block, [`PREFILL_OPS_NS_HERE`] per token and
    /// element of `hidden + n_ff`, and [`PREFILL_ATTENTION_NS_HERE`] per multiply-add of the
    /// causal attention (`2 × q_dim × rows (rows + 1) / 2`), carried to the board as the glue
    /// is ([`A76_THREAD_SLOWDOWN`]) and spread from the [`OPS_THREADS_HERE`] threads measured
    /// to the board's [`BOARD_OPS_THREADS`]. Neither the campaign's host term nor the glue
    /// counts them; RKLLM's measured TTFT does.
    pub fn prefill_ops_s(d: &DecoderShape, rows: usize) -> f64 {
        prefill_ops_s_on(&RK3588_A76, d, rows)
    }

    /// [`prefill_ops_s`] on `board`: its thread slowdown and host pool
    /// ([`Board::thread_slowdown`], [`Board::ops_threads`]).
    pub fn prefill_ops_s_on(board: &Board, d: &DecoderShape, rows: usize) -> f64 {
        let r = rows as f64;
        let per_block = r * (d.hidden + d.n_ff) as f64 * PREFILL_OPS_NS_HERE
            + PREFILL_ATTENTION_NS_HERE * d.q_dim as f64 * r * (r + 1.0);
        1e-9 * d.layers as f64 * per_block * board.thread_slowdown * OPS_THREADS_HERE
            / board.ops_threads
    }

    /// Host seconds of the model's own ops in a decode pass of `rows` rows of `d` each
    /// attending to about `positions` positions, on RK3588: per block,
    /// [`DECODE_OPS_US_PER_BLOCK_HERE`] and [`DECODE_ATTENTION_NS_HERE`] per multiply-add of
    /// attention (`2 × q_dim × positions` a row), on one thread carried by
    /// [`A76_THREAD_SLOWDOWN`]. The pessimistic side: the host pool may take a wide model's
    /// attention over more threads.
    pub fn decode_ops_s(d: &DecoderShape, rows: usize, positions: usize) -> f64 {
        decode_ops_s_on(&RK3588_A76, d, rows, positions)
    }

    /// [`decode_ops_s`] on `board` (one of its threads, [`Board::thread_slowdown`]).
    pub fn decode_ops_s_on(board: &Board, d: &DecoderShape, rows: usize, positions: usize) -> f64 {
        let per_block = 1e3 * DECODE_OPS_US_PER_BLOCK_HERE
            + DECODE_ATTENTION_NS_HERE * 2.0 * d.q_dim as f64 * (rows * positions) as f64;
        1e-9 * d.layers as f64 * per_block * board.thread_slowdown
    }

    /// The host CPU of a board, as far as the host terms need it: how much slower one of its
    /// threads is than one thread of the machine the host terms were measured on, and how many
    /// threads the engine's glue and the model's host ops spread over.
    #[derive(Clone, Copy, Debug, PartialEq)]
    pub struct Board {
        /// What it is.
        pub name: &'static str,
        /// How much longer one of its threads takes than one thread of the machine
        /// [`ENGINE_GLUE_NS_HERE`] was measured on.
        pub thread_slowdown: f64,
        /// Threads the engine's prefill glue spreads over: one per NPU lane.
        pub glue_threads: f64,
        /// Threads of the host pool running the model's ops between the linears.
        pub ops_threads: f64,
        /// Decode speed-up from pinning the host threads to the big cores, end to end.
        pub pinned_decode_speedup: f64,
        /// Prefill speed-up from the same pinning, end to end.
        pub pinned_prefill_speedup: f64,
    }

    impl Board {
        /// The engine's prefill glue per activation element on this board, wall nanoseconds:
        /// [`ENGINE_GLUE_NS_HERE`] × [`Board::thread_slowdown`] / [`Board::glue_threads`]
        /// ([`ENGINE_GLUE_NS`] on [`RK3588_A76`]).
        pub fn glue_ns(&self) -> f64 {
            ENGINE_GLUE_NS_HERE * self.thread_slowdown / self.glue_threads
        }

        /// How much slower one of its threads is than one of RK3588's A76 threads (1 on
        /// [`RK3588_A76`]).
        pub fn relative_to_a76(&self) -> f64 {
            self.thread_slowdown / A76_THREAD_SLOWDOWN
        }
    }

    /// RK3588's host: four Cortex-A76 at 2.4 GHz, the campaign's board, every number measured
    /// ([`A76_THREAD_SLOWDOWN`], [`BOARD_GLUE_THREADS`], [`BOARD_OPS_THREADS`], the pinned
    /// speed-ups).
    pub const RK3588_A76: Board = Board {
        name: "RK3588 (4× Cortex-A76 at 2.4 GHz)",
        thread_slowdown: A76_THREAD_SLOWDOWN,
        glue_threads: BOARD_GLUE_THREADS,
        ops_threads: BOARD_OPS_THREADS,
        pinned_decode_speedup: A76_PINNED_DECODE_SPEEDUP,
        pinned_prefill_speedup: A76_PINNED_PREFILL_SPEEDUP,
    };

    /// How much more work a Cortex-A76 does than a Cortex-A72 per clock at the host's work. An
    /// **assumption**, measured on neither board: about 1.5, the order of Arm's own generational
    /// claims from the A72 to the A76 and of published per-GHz SPEC comparisons. A board run of
    /// `scripts/bench/host_cost.py` on RK3576 settles it.
    pub const A76_OVER_A72_PER_CLOCK: f64 = 1.5;
    /// RK3588's Cortex-A76 clock, GHz (public: 2.4).
    pub const A76_GHZ: f64 = 2.4;
    /// RK3576's Cortex-A72 clock, GHz (public: 2.2).
    pub const A72_GHZ: f64 = 2.2;
    /// How much longer one Cortex-A72 thread of RK3576 takes than one thread of the machine the
    /// host terms were measured on: [`A76_THREAD_SLOWDOWN`] (measured) × the assumed
    /// [`A76_OVER_A72_PER_CLOCK`] × the clocks' ratio [`A76_GHZ`] / [`A72_GHZ`]: 3.03.
    pub const A72_THREAD_SLOWDOWN: f64 =
        A76_THREAD_SLOWDOWN * A76_OVER_A72_PER_CLOCK * A76_GHZ / A72_GHZ;

    /// RK3576's host: four Cortex-A72 at 2.2 GHz (and four A53, left out): the host terms
    /// measured here carried to the A72 by [`A72_THREAD_SLOWDOWN`] (an assumption past the
    /// A76), the glue over the engine's two lanes, the host ops over the four A72. No pinning
    /// gain is assumed (none measured).
    pub const RK3576_A72: Board = Board {
        name: "RK3576 (4× Cortex-A72 at 2.2 GHz)",
        thread_slowdown: A72_THREAD_SLOWDOWN,
        glue_threads: 2.0,
        ops_threads: 4.0,
        pinned_decode_speedup: 1.0,
        pinned_prefill_speedup: 1.0,
    };

    /// The host of `platform`'s board: [`RK3576_A72`] on RK3576, [`RK3588_A76`] everywhere
    /// else (the only host measured; for the single-core chips, which have no cost model, an
    /// optimistic stand-in).
    pub fn board(platform: Platform) -> &'static Board {
        match platform {
            Platform::Rk3576 => &RK3576_A72,
            _ => &RK3588_A76,
        }
    }

    /// Bytes per second one host core streams the router's f32 weights from DDR at. An
    /// assumption, not measured on a board: a Cortex-A76 reading a 512 KB matrix that the
    /// previous token's 15 other routers pushed out of its caches.
    pub const ROUTER_BYTES_PER_S: f64 = 8e9;
    /// f32 operations per second of one host core in the router's dot products. An
    /// assumption, not measured: about a quarter of a 2.4 GHz Cortex-A76's 38.4 GFLOP/s NEON
    /// peak (two 4-wide FMA pipes), a dot product being bound by its loads.
    pub const ROUTER_FLOPS: f64 = 10e9;

    /// Host seconds of the routers of a pass over `rows` rows of `d` (0 for a dense decoder):
    /// per block, the router's f32 weights read once ([`DecoderShape::router_weights`] × 4
    /// bytes at [`ROUTER_BYTES_PER_S`]) and multiplied by every row (2 × weights operations
    /// per row at [`ROUTER_FLOPS`]), on one host thread, as the engine routes
    /// (`examples/llm/src/model/moe.rs`). The softmax and top-k over `experts` values per row
    /// are left out (64 values against 131 072 multiply-adds for OLMoE).
    pub fn router_s(d: &DecoderShape, rows: usize) -> f64 {
        if rows == 0 {
            return 0.0;
        }
        let w = d.router_weights() as f64;
        d.layers as f64 * (4.0 * w / ROUTER_BYTES_PER_S + rows as f64 * 2.0 * w / ROUTER_FLOPS)
    }
}

/// The model's prediction for a decoder on the model's chip (all its cores; W8A8 unless
/// [`CostModel::predict_llm_prompt_as`] names another format), for the campaign's 9B
/// ([`CostModel::predict_llm`]) or any shape and prompt ([`CostModel::predict_llm_prompt`]).
/// The host terms are those of the chip's board ([`host::board`]): the fields below name
/// RK3588's, which RK3576's scale ([`host::Board`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LlmPrediction {
    /// Tokens of the prefill pass (512 for [`CostModel::predict_llm`]).
    pub prompt: usize,
    /// The NPU cost of one decoded token, term by term.
    pub decode: PassCost,
    /// The NPU cost of the prefill pass, term by term (the output projection over its last
    /// row).
    pub prefill: PassCost,
    /// NPU seconds per decoded token.
    pub decode_npu_s: f64,
    /// Host seconds per decoded token ([`host::decode_s`], and [`host::router_s`] of one row
    /// in a mixture of experts).
    pub decode_host_s: f64,
    /// Decode tokens per second if the NPU were all there is.
    pub decode_npu_only_tok_s: f64,
    /// Decode tokens per second with the campaign's host share ([`host::DECODE_SHARE`]).
    pub decode_tok_s: f64,
    /// Decode tokens per second with the host threads pinned to the A76 cores
    /// ([`host::A76_PINNED_DECODE_SPEEDUP`]).
    pub decode_pinned_tok_s: f64,
    /// NPU seconds of the prefill pass.
    pub prefill_npu_s: f64,
    /// Host seconds of the prefill pass ([`host::prefill_s`], and [`host::router_s`] of the
    /// prompt in a mixture of experts).
    pub prefill_host_s: f64,
    /// Host seconds of the model's own ops per decoded token ([`host::decode_ops_s`] at
    /// [`host::DECODE_POSITIONS_AFTER_PROMPT`] positions after the prompt): in the engine's
    /// layout; 0 in the campaign's, whose host share is calibrated end to end.
    pub decode_ops_s: f64,
    /// Host seconds of the model's own ops in the prefill pass ([`host::prefill_ops_s`]): in
    /// the engine's layout; 0 in the campaign's.
    pub prefill_ops_s: f64,
    /// Prefill tokens per second if the NPU were all there is.
    pub prefill_npu_only_tok_s: f64,
    /// Prefill tokens per second with the host time ([`host::prefill_s`]).
    pub prefill_tok_s: f64,
    /// Prefill tokens per second with the host threads pinned to the A76 cores
    /// ([`host::A76_PINNED_PREFILL_SPEEDUP`]).
    pub prefill_pinned_tok_s: f64,
}

impl LlmPrediction {
    /// Time to the first token, seconds: the prefill pass, NPU, host glue and host ops. The
    /// first token comes out of the prefill's logits (of the last prompt row), so no decode
    /// step is added.
    pub fn ttft_s(&self) -> f64 {
        self.prefill_npu_s + self.prefill_host_s + self.prefill_ops_s
    }

    /// Time to the first token with the host threads pinned to the A76 cores.
    pub fn ttft_pinned_s(&self) -> f64 {
        self.prompt as f64 / self.prefill_pinned_tok_s
    }
}

impl CostModel {
    /// The prediction for a decoder run W8A8 on all cores: decode at M = 1, prefill of 512
    /// tokens, with the campaign's host time added for the end-to-end figures.
    pub fn predict_llm(&self, d: &DecoderShape) -> LlmPrediction {
        self.predict_llm_prompt(d, 512)
    }

    /// [`CostModel::predict_llm`] with a prefill of `prompt` tokens.
    pub fn predict_llm_prompt(&self, d: &DecoderShape, prompt: usize) -> LlmPrediction {
        self.predict_campaign(d, prompt, MatmulType::I8_I8_I32)
    }

    /// The campaign's layout with B of `t`: its calibrated host terms, carried to this chip's
    /// host ([`host::board`]; unchanged on RK3588).
    fn predict_campaign(&self, d: &DecoderShape, prompt: usize, t: MatmulType) -> LlmPrediction {
        let board = host::board(self.platform);
        let decode = self.decoder_pass(d, 1, 1, self.cores, t);
        let prefill = self.decoder_pass(d, prompt, 1, self.cores, t);
        LlmPrediction::new(
            prompt,
            decode,
            prefill,
            host::prefill_s(d, prompt) * board.relative_to_a76(),
            (0.0, 0.0),
            d,
            board,
        )
    }

    /// [`CostModel::predict_llm_prompt`] with the decoder laid out as `layout` says: the
    /// campaign's (the same figures, bit for bit) or this project's engine's, whose prompt
    /// runs in forwards of [`EngineLayout::prefill_batch`] tokens (the last one computing the
    /// logits of its last row), whose host glue is its own, measured rate per activation
    /// element of its linears ([`host::prefill_engine_s`]), and whose host ops between the
    /// linears are priced too ([`host::prefill_ops_s`], [`host::decode_ops_s`]): the campaign's
    /// host terms are calibrated end to end, the engine's are built from parts, so the parts
    /// must all be there.
    pub fn predict_llm_prompt_in(
        &self,
        d: &DecoderShape,
        prompt: usize,
        layout: &DecoderLayout,
    ) -> LlmPrediction {
        self.predict_llm_prompt_as(d, prompt, layout, MatmulType::I8_I8_I32)
    }

    /// [`CostModel::predict_llm_prompt_in`] with the weights' format `t` (W8A8 is
    /// `I8_I8_I32`, W4A16 `F16_I4_F32`, W4A8 `I8_I4_I32`): every linear planned with the
    /// alignment of `t.b` ([`CostModel::engine_plan`]: int4 pads N to 64 on RK3588 and
    /// RK3576), its runs costed with `t`'s element sizes and rate ([`CostModel::run`],
    /// [`CostModel::peak`]), and the host terms on this chip's host ([`host::board`]).
    /// In the engine's layout, activations of a float kind (f16) are neither rotated nor
    /// quantised, so no linear runs residual rows whatever `layout` says
    /// ([`EngineLayout::for_type`]); their glue per activation element (converting to f16,
    /// packing A, collecting C with the per-channel scales) is taken to be W8A8's measured
    /// rate, [`host::ENGINE_GLUE_NS_HERE`]: an assumption, on the high side for the work
    /// (no rotation, no per-row scale), not for the bytes (A is twice as wide).
    pub fn predict_llm_prompt_as(
        &self,
        d: &DecoderShape,
        prompt: usize,
        layout: &DecoderLayout,
        t: MatmulType,
    ) -> LlmPrediction {
        self.predict_llm_prompt_on(d, prompt, layout, t, host::board(self.platform))
    }

    /// [`CostModel::predict_llm_prompt_as`] with the engine layout's host terms on `board`
    /// instead of this chip's: what the prediction is if the board's host is faster or slower
    /// than assumed. The campaign's layout keeps the chip's board ([`host::board`]).
    pub fn predict_llm_prompt_on(
        &self,
        d: &DecoderShape,
        prompt: usize,
        layout: &DecoderLayout,
        t: MatmulType,
        board: &host::Board,
    ) -> LlmPrediction {
        let e = match layout {
            DecoderLayout::Campaign => return self.predict_campaign(d, prompt, t),
            DecoderLayout::Engine(e) => e.for_type(t),
        };
        let layout = &DecoderLayout::Engine(e);
        let e = &e;
        let decode = self.decoder_pass_in(d, 1, 1, self.cores, t, layout);
        let mut prefill = PassCost::default();
        let batch = e.prefill_batch.max(1);
        let mut done = 0;
        while done < prompt {
            let rows = batch.min(prompt - done);
            done += rows;
            let head = usize::from(done == prompt);
            prefill.add(
                &self.decoder_pass_in(d, rows, head, self.cores, t, layout),
                1,
            );
        }
        let ops = (
            host::decode_ops_s_on(board, d, 1, prompt + host::DECODE_POSITIONS_AFTER_PROMPT),
            host::prefill_ops_s_on(board, d, prompt),
        );
        LlmPrediction::new(
            prompt,
            decode,
            prefill,
            host::prefill_engine_s_on(board, d, prompt, e),
            ops,
            d,
            board,
        )
    }
}

impl LlmPrediction {
    /// The prediction from the NPU cost of a decoded token and of the prefill pass, the
    /// prefill's host glue seconds and the host ops' seconds (decode, prefill): decode host
    /// time is [`host::decode_s`], the routers of `d` ([`host::router_s`]) are added to both
    /// phases' host time, the pinned rates are the campaign's speed-ups.
    fn new(
        prompt: usize,
        decode: PassCost,
        prefill: PassCost,
        glue: f64,
        (decode_ops_s, prefill_ops_s): (f64, f64),
        d: &DecoderShape,
        board: &host::Board,
    ) -> LlmPrediction {
        let (dn, pn) = (decode.npu_s, prefill.npu_s);
        let dh = host::decode_s_on(board, dn) + host::router_s(d, 1);
        let ph = glue + host::router_s(d, prompt);
        let (dt, pt) = (dn + dh + decode_ops_s, pn + ph + prefill_ops_s);
        let rows = prompt as f64;
        LlmPrediction {
            prompt,
            decode,
            prefill,
            decode_npu_s: dn,
            decode_host_s: dh,
            decode_npu_only_tok_s: 1.0 / dn,
            decode_tok_s: 1.0 / dt,
            decode_pinned_tok_s: board.pinned_decode_speedup / dt,
            prefill_npu_s: pn,
            prefill_host_s: ph,
            decode_ops_s,
            prefill_ops_s,
            prefill_npu_only_tok_s: rows / pn,
            prefill_tok_s: rows / pt,
            prefill_pinned_tok_s: board.pinned_prefill_speedup * rows / pt,
        }
    }
}

/// Tokens one draft-and-verify cycle yields when the draft proposes `k` tokens and the model
/// accepts each with probability `alpha`, independently of the others: the accepted prefix of
/// the draft (verification stops at the first rejection) and the one token the verify pass
/// adds after it (the correction, or the next token when all `k` are accepted),
/// `E = 1 + α + … + α^k = (1 − α^(k+1)) / (1 − α)`; `k + 1` at `α = 1`, 1 at `α = 0` or
/// `k = 0`. `alpha` is clamped to 0..=1.
pub fn spec_tokens_per_cycle(alpha: f64, k: usize) -> f64 {
    let a = alpha.clamp(0.0, 1.0);
    if a == 1.0 {
        return (k + 1) as f64;
    }
    let n = i32::try_from(k + 1).unwrap_or(i32::MAX);
    (1.0 - a.powi(n)) / (1.0 - a)
}

/// The share of drafted tokens accepted, accepted / drafted (what `rknn-llm`'s
/// `SpecStats::acceptance` reports), at per-token acceptance `alpha` and a draft of `k`
/// tokens every cycle: `(E − 1) / k` with `E` of [`spec_tokens_per_cycle`]. It is below
/// `alpha` for `k > 1`, as the tokens after the first rejection are drafted but never
/// accepted. 0 for `k = 0`.
pub fn spec_acceptance_rate(alpha: f64, k: usize) -> f64 {
    if k == 0 {
        return 0.0;
    }
    (spec_tokens_per_cycle(alpha, k) - 1.0) / k as f64
}

/// The per-token acceptance `α` whose [`spec_acceptance_rate`] at draft length `k` is `rate`
/// (a measured accepted / drafted, 0 to 1, drafts of `k` tokens each time): the rate rises
/// from 0 to 1 with `α`, so bisection finds it to 1e-15. `None` for `k = 0` or a rate
/// outside 0..=1.
pub fn spec_alpha_from_acceptance(rate: f64, k: usize) -> Option<f64> {
    if k == 0 || !(0.0..=1.0).contains(&rate) {
        return None;
    }
    Some(bisect(|a| spec_acceptance_rate(a, k) - rate))
}

/// The root in 0..=1 of `f`, rising from `f(0) <= 0` to `f(1) >= 0`, by bisection to 1e-15.
fn bisect(f: impl Fn(f64) -> f64) -> f64 {
    let (mut lo, mut hi) = (0.0f64, 1.0f64);
    if f(lo) >= 0.0 {
        return lo;
    }
    while hi - lo > 1e-15 {
        let mid = 0.5 * (lo + hi);
        if f(mid) < 0.0 {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    0.5 * (lo + hi)
}

/// The modelled time of speculative decoding with a draft model ([`CostModel::spec_decode`]):
/// a cycle is `k` single-row passes of the draft, then one pass of the model over the `k + 1`
/// rows (the last accepted token and the `k` drafts, logits on every row), each pass with the
/// host glue the model gives a decoded token. Seconds, NPU and host together.
#[derive(Clone, Debug, PartialEq)]
pub struct SpecDecode {
    /// One plain decoded token of the model: its single-row pass.
    pub plain_s: f64,
    /// One single-row pass of the draft.
    pub draft_s: f64,
    /// `verify_s[k]`: the model's pass over `k + 1` rows with logits on all of them
    /// (`verify_s[0]` is [`SpecDecode::plain_s`]).
    pub verify_s: Vec<f64>,
}

impl SpecDecode {
    /// The longest draft priced.
    pub fn max_k(&self) -> usize {
        self.verify_s.len().saturating_sub(1)
    }

    /// Plain decode, tokens per second.
    pub fn plain_tok_s(&self) -> f64 {
        1.0 / self.plain_s
    }

    /// Seconds of one cycle with a draft of `k` tokens: `k × draft + verify of k + 1 rows`.
    ///
    /// # Panics
    ///
    /// When `k` is above [`SpecDecode::max_k`].
    pub fn cycle_s(&self, k: usize) -> f64 {
        k as f64 * self.draft_s + self.verify_s[k]
    }

    /// Decoded tokens per second at per-token acceptance `alpha` with drafts of `k` tokens:
    /// [`spec_tokens_per_cycle`] over [`SpecDecode::cycle_s`] (plain decode at `k = 0`).
    pub fn tok_s(&self, alpha: f64, k: usize) -> f64 {
        spec_tokens_per_cycle(alpha, k) / self.cycle_s(k)
    }

    /// The draft length of 1 to [`SpecDecode::max_k`] that decodes fastest at `alpha`, and its
    /// tokens per second (the shortest among equals). It may be slower than plain decode: a
    /// draft that does not pay at `alpha` has no good length.
    pub fn best_k(&self, alpha: f64) -> (usize, f64) {
        (1..=self.max_k())
            .map(|k| (k, self.tok_s(alpha, k)))
            .fold((0, 0.0), |best, x| if x.1 > best.1 { x } else { best })
    }

    /// The per-token acceptance at which drafts of `k` tokens decode as fast as plain decode
    /// (`E(α, k) = cycle(k) / plain`, solved by bisection to 1e-15): above it speculation pays.
    /// `None` when it does not pay even at `α = 1` (the cycle costs `k + 1` plain tokens or
    /// more) or for `k = 0`.
    pub fn break_even_alpha(&self, k: usize) -> Option<f64> {
        if k == 0 || k > self.max_k() {
            return None;
        }
        let need = self.cycle_s(k) / self.plain_s;
        (need < (k + 1) as f64).then(|| bisect(|a| spec_tokens_per_cycle(a, k) - need))
    }

    /// The lowest [`SpecDecode::break_even_alpha`] over the draft lengths 1 to
    /// [`SpecDecode::max_k`], with its length: below it no draft length pays.
    pub fn break_even_alpha_best(&self) -> Option<(usize, f64)> {
        (1..=self.max_k())
            .filter_map(|k| self.break_even_alpha(k).map(|a| (k, a)))
            .fold(None, |best, x| match best {
                Some((_, a)) if a <= x.1 => best,
                _ => Some(x),
            })
    }
}

/// Positions a pass of [`CostModel::spec_decode`] attends to, for its host ops in the engine's
/// layout: a token [`host::DECODE_POSITIONS_AFTER_PROMPT`] after a 128-token prompt, as the
/// decode of [`CostModel::predict_llm_prompt_in`] at RKLLM's prompt.
pub const SPEC_POSITIONS: usize = 128 + host::DECODE_POSITIONS_AFTER_PROMPT;

impl CostModel {
    /// Speculative decoding of `target` with `draft` (W8A8, all cores, laid out as `layout`
    /// says), draft lengths 0 to `max_k`: every pass priced by [`CostModel::decoder_pass_in`]
    /// (the draft's over one row and its logits, the target's over `k + 1` rows and all their
    /// logits) plus the host time the model gives a decoded token of that NPU time
    /// ([`host::decode_s`], [`host::router_s`] of the pass's rows in a mixture, and in the
    /// engine's layout the host ops of its rows at [`SPEC_POSITIONS`]). Plain
    /// decode is the single-row pass, as in [`CostModel::predict_llm_prompt_in`].
    ///
    /// The draft's first pass of a cycle after all `k` drafts were accepted runs two rows (the
    /// last draft, never fed, and the model's next token); it is priced as one row, which a
    /// pass bound by its weight reads barely notices.
    pub fn spec_decode(
        &self,
        target: &DecoderShape,
        draft: &DecoderShape,
        max_k: usize,
        layout: &DecoderLayout,
    ) -> SpecDecode {
        let t = MatmulType::I8_I8_I32;
        let board = host::board(self.platform);
        let pass = |d: &DecoderShape, rows: usize| {
            let npu = self
                .decoder_pass_in(d, rows, rows, self.cores, t, layout)
                .npu_s;
            let ops = match layout {
                DecoderLayout::Campaign => 0.0,
                DecoderLayout::Engine(_) => host::decode_ops_s_on(board, d, rows, SPEC_POSITIONS),
            };
            npu + host::decode_s_on(board, npu) + host::router_s(d, rows) + ops
        };
        let verify_s: Vec<f64> = (0..=max_k).map(|k| pass(target, k + 1)).collect();
        SpecDecode {
            plain_s: verify_s[0],
            draft_s: pass(draft, 1),
            verify_s,
        }
    }
}

/// One documented measurement and the model's figure for it.
#[derive(Clone, Debug, PartialEq)]
pub struct CalibrationPoint {
    /// What was measured.
    pub what: &'static str,
    /// Where the figure comes from.
    pub source: &'static str,
    /// The unit of both figures.
    pub unit: &'static str,
    /// The measured figure.
    pub measured: f64,
    /// The model's figure.
    pub modelled: f64,
    /// The largest error the model is held to here: [`TOLERANCE`], or more where the point
    /// mixes in host work the model cannot separate (`note` says why).
    pub tolerance: f64,
    /// Why the tolerance is wider than [`TOLERANCE`] (empty when it is not).
    pub note: &'static str,
}

impl CalibrationPoint {
    /// (modelled − measured) / measured.
    pub fn error(&self) -> f64 {
        (self.modelled - self.measured) / self.measured
    }
}

/// The error every calibration point must stay within.
pub const TOLERANCE: f64 = 0.15;

/// Every documented RK3588 measurement the model is calibrated to, with `model`'s figure for
/// it (pass [`RK3588`] for the calibrated model).
pub fn calibration(model: &CostModel) -> Vec<CalibrationPoint> {
    const PEAK: &str = "campaign mm_peak (librknnrt 2.3.2, NPU 1.0 GHz), fact sheet §9";
    const CONC: &str = "campaign mm_concurrent (times creation too), fact sheet §9";
    const E5: &str = "campaign results table, E5 build (llama-bench, 4 threads)";
    const PIN: &str = "campaign thread pinning, A76 cores (E5 prediction × pinned speed-up)";
    const SCALE: &str = "campaign NPU core scaling (Amdahl-matched build)";
    let i8 = MatmulType::I8_I8_I32;
    let tops = |m: usize, k: usize, n: usize, busy: usize| {
        let r = model.run(&Run {
            m,
            k,
            n,
            t: i8,
            busy_cores: busy,
        });
        r.tops()
    };
    let square = |busy: usize| busy as f64 * tops(4096, 4096, 4096, busy);
    let cliff_time = model
        .run(&Run {
            m: 512,
            k: 15360,
            n: 4096,
            t: i8,
            busy_cores: 1,
        })
        .total_s;
    let square_time = model
        .run(&Run {
            m: 4096,
            k: 4096,
            n: 4096,
            t: i8,
            busy_cores: 1,
        })
        .total_s;
    let d = &CAMPAIGN_9B;
    let p = model.predict_llm(d);
    let pass = |rows: usize, cores: usize, t: MatmulType| model.decoder_pass(d, rows, 1, cores, t);
    let prefill_at = |cores: usize| 512.0 / (pass(512, cores, i8).npu_s + host::PREFILL_512_S);
    let decode_at = |cores: usize, t: MatmulType| {
        1.0 / (pass(1, cores, t).npu_s + host::DECODE_SCALING_BUILD_S)
    };
    let pt = |what, source, unit, measured, modelled| CalibrationPoint {
        what,
        source,
        unit,
        measured,
        modelled,
        tolerance: TOLERANCE,
        note: "",
    };
    // The core-scaling build's prefill: its host time is the campaign's Amdahl serial
    // fraction taken as constant, but that build's host glue ran one thread per NPU core, so
    // host and NPU time cannot be separated at one or two cores; and the model's NPU is faster
    // than that build's at every core count (its 3-core prefill was 10 % slower than E5's).
    let scaling = |p: CalibrationPoint| CalibrationPoint {
        tolerance: 0.35,
        note: "prefill of the core-scaling build: host glue ran one thread per NPU core, so its host time is not the constant the Amdahl fraction assumes",
        ..p
    };
    vec![
        pt(
            "i8 4096³, one core",
            PEAK,
            "TOPS",
            0.69,
            tops(4096, 4096, 4096, 1),
        ),
        pt("i8 4096³, 1 context", CONC, "TOPS", 0.66, square(1)),
        pt(
            "i8 4096³, 2 concurrent contexts",
            CONC,
            "TOPS",
            1.26,
            square(2),
        ),
        pt(
            "i8 4096³, 3 concurrent contexts",
            CONC,
            "TOPS",
            1.83,
            square(3),
        ),
        pt(
            "i8 M=512 K=15360 N=4096, one core",
            PEAK,
            "TOPS",
            0.02,
            tops(512, 15360, 4096, 1),
        ),
        pt(
            "K=15360 run time over the 4096³ run time",
            "fact sheet §6 (\"~14× slower\")",
            "×",
            14.0,
            cliff_time / square_time,
        ),
        pt("9B Q8_0 decode (tg128)", E5, "tok/s", 2.98, p.decode_tok_s),
        pt(
            "9B Q8_0 prefill (pp512)",
            E5,
            "tok/s",
            42.1,
            p.prefill_tok_s,
        ),
        pt(
            "9B Q8_0 decode, pinned",
            PIN,
            "tok/s",
            3.35,
            p.decode_pinned_tok_s,
        ),
        pt(
            "9B Q8_0 prefill, pinned",
            PIN,
            "tok/s",
            51.37,
            p.prefill_pinned_tok_s,
        ),
        scaling(pt(
            "9B Q8_0 prefill, one NPU core",
            SCALE,
            "tok/s",
            18.28,
            prefill_at(1),
        )),
        scaling(pt(
            "9B Q8_0 prefill, two NPU cores",
            SCALE,
            "tok/s",
            30.26,
            prefill_at(2),
        )),
        scaling(pt(
            "9B Q8_0 prefill, three NPU cores",
            SCALE,
            "tok/s",
            38.13,
            prefill_at(3),
        )),
        CalibrationPoint {
            tolerance: 0.35,
            note: "decode on one core of the core-scaling build: the model's lone core streams at 11.2 GB/s (fitted to 4096³); that build's implies ~8.5 GB/s",
            ..pt(
                "9B Q8_0 decode, one NPU core",
                SCALE,
                "tok/s",
                0.89,
                decode_at(1, i8),
            )
        },
        pt(
            "9B Q8_0 decode, three NPU cores",
            SCALE,
            "tok/s",
            2.35,
            decode_at(3, i8),
        ),
        pt(
            "9B W4A4 decode, three NPU cores",
            "campaign int4 pipelines (same build as the core scaling)",
            "tok/s",
            4.08,
            decode_at(3, MatmulType::I4_I4_I16),
        ),
    ]
}

/// The binomial coefficient C(n, k) as an f64.
fn choose(n: usize, k: usize) -> f64 {
    if k > n {
        return 0.0;
    }
    let k = k.min(n - k);
    (0..k).fold(1.0, |acc, i| acc * (n - i) as f64 / (i + 1) as f64)
}
