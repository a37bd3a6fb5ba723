//! The cost model's mixture-of-experts terms (docs/npu-matmul-performance.md, "Mixture of
//! experts: OLMoE-1B-7B beside its dense twin") checked against hand calculations from the
//! documented formulas: the per-run time `call + bytes / bandwidth` of a memory-bound run, the
//! distinct experts a pass touches `n · (1 − (1 − k/n)^P)`, the host router's reads and
//! multiply-adds. The expected figures are worked out here from the shapes, not read back
//! from the model.

use DecoderLayout::Engine;
use rknn_chip::MatmulType;
use rknn_emu::cost::{
    CAMPAIGN_9B, DecoderLayout, DecoderShape, ENGINE_LAYOUT, EngineLayout, ExpertLayout, MoeShape,
    OLMOE_1B_7B, OLMOE_1B_7B_DENSE, RK3588, host,
};

const W8A8: MatmulType = MatmulType::I8_I8_I32;

/// One memory-bound run of RK3588 at M = 1 on one of three busy cores, by the documented
/// formula: `call + (K·N + K + 4·N) / min(core_bw, ddr_bw / 3)` (B and A of one byte, C of
/// four), with the calibrated constants written out.
fn run_m1(k: f64, n: f64) -> f64 {
    let bw = f64::min(11.2e9, 30.3e9 / 3.0);
    50e-6 + (k * n + k + 4.0 * n) / bw
}

/// A third of `n` columns rounded up to a multiple of 32: the campaign's shard of one core.
fn shard(n: usize) -> f64 {
    n.div_ceil(3).next_multiple_of(32) as f64
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * b.abs().max(1e-12)
}

#[test]
fn a_token_reads_the_active_experts_and_the_model_holds_them_all() {
    let (h, ff, vocab) = (2048u64, 1024u64, 50_304u64);
    let attn = 4 * h * h; // q, k, v, o: 16 heads of 128, 16 KV heads
    let expert = 3 * h * ff; // gate, up, down
    let head = vocab * h;
    // Decode reads 8 of 64 experts per block: OLMoE's 1.18 G active linear weights...
    assert_eq!(OLMOE_1B_7B.weights(), 16 * (attn + 8 * expert) + head);
    assert_eq!(OLMOE_1B_7B.weights(), 1_176_764_416);
    // ...the dense twin's, whose one feed-forward is 8 experts wide.
    assert_eq!(OLMOE_1B_7B_DENSE.weights(), OLMOE_1B_7B.weights());
    // It holds all 64, their routers (64 × 2048 each) and a separate embedding: 6.92 G.
    let router = 64 * h;
    assert_eq!(
        OLMOE_1B_7B.parameters(),
        16 * (attn + 64 * expert + router) + 2 * head
    );
    assert_eq!(OLMOE_1B_7B.parameters(), 6_919_028_736);
    assert_eq!(
        OLMOE_1B_7B_DENSE.parameters(),
        16 * (attn + 8 * expert) + 2 * head
    );
}

#[test]
fn distinct_experts_follow_uniform_routing() {
    let d = &OLMOE_1B_7B;
    // One row touches exactly its k experts.
    assert_eq!(d.experts_touched(1), 8.0);
    assert_eq!(d.expert_rows(1), 1);
    // Two rows: 64 · (1 − (7/8)²) = 64 · 15/64 = 15 experts for 16 (row, expert) pairs.
    assert_eq!(d.experts_touched(2), 15.0);
    assert_eq!(d.expert_rows(2), 1);
    // 128 rows: (7/8)^128 = 3.8e-8, so all 64, each on 128 · 8 / 64 = 16 rows.
    assert!((d.experts_touched(128) - 64.0).abs() < 1e-5);
    assert_eq!(d.expert_rows(128), 16);
    assert_eq!(d.experts_touched(0), 0.0);
    // A dense block runs its one feed-forward on every row.
    assert_eq!(OLMOE_1B_7B_DENSE.experts_touched(128), 1.0);
    assert_eq!(OLMOE_1B_7B_DENSE.expert_rows(128), 128);
}

#[test]
fn decode_costs_the_active_experts_runs_by_hand() {
    // The campaign's layout: q, k, v, o, then per expert gate, up and down apart, each split
    // over the three cores (K = 2048 or 1024: below the 8192 segment, one run per core).
    let moe = RK3588.decoder_pass(&OLMOE_1B_7B, 1, 1, 3, W8A8);
    let dense = RK3588.decoder_pass(&OLMOE_1B_7B_DENSE, 1, 1, 3, W8A8);
    // Runs per core per token: 16 × (4 + 8 × 3) + the head, against 16 × 7 + 1.
    assert_eq!(moe.runs_per_core, 16 * (4 + 8 * 3) + 1);
    assert_eq!(dense.runs_per_core, 16 * 7 + 1);
    // They differ only in the feed-forward: 8 experts × (gate, up: 2048 → a third of 1024;
    // down: 1024 → a third of 2048) against one 8192-wide feed-forward.
    let moe_ffn = 8.0 * (2.0 * run_m1(2048.0, shard(1024)) + run_m1(1024.0, shard(2048)));
    let dense_ffn = 2.0 * run_m1(2048.0, shard(8192)) + run_m1(8192.0, shard(2048));
    assert!(close(moe.npu_s - dense.npu_s, 16.0 * (moe_ffn - dense_ffn)));
    // The fixed costs: 24 more runs per block of 50 µs; the rest is the experts' shards
    // padded more (a third of 1024 is 342 columns, run as 352).
    assert!(close(
        moe.terms.call_s - dense.terms.call_s,
        16.0 * 21.0 * 50e-6
    ));
    // The same weights, so about the same weight reads; the extra time is the runs.
    assert!((moe.weight_bytes - dense.weight_bytes).abs() < 1.0);
    assert!(moe.npu_s > dense.npu_s);
}

#[test]
fn the_engine_runs_two_linears_per_expert() {
    let split = DecoderLayout::Engine(EngineLayout {
        experts: ExpertLayout::Split,
        ..ENGINE_LAYOUT
    });
    let moe = RK3588.decoder_pass_in(&OLMOE_1B_7B, 1, 1, 3, W8A8, &split);
    let dense = RK3588.decoder_pass_in(&OLMOE_1B_7B_DENSE, 1, 1, 3, W8A8, &split);
    // Per block: qkv, o, and 8 × (gate-up, down) split over the cores; the 50 304-wide head
    // is 16 768 columns a lane, 3 contexts of at most 8192.
    assert_eq!(moe.runs_per_core, 16 * (2 + 8 * 2) + 3);
    assert_eq!(dense.runs_per_core, 16 * 4 + 3);
    // Held: per block qkv, o and 64 × (gate-up, down), each in one context per lane (all
    // narrower than 8192 columns a lane), the head in 3 a lane: 3 × (16 × 130 + 3) contexts,
    // one dma-buf handle each (their B; A and C are shared per core and domain).
    let Engine(split_layout) = split else {
        unreachable!()
    };
    let held = |d, e: &EngineLayout| RK3588.engine_held(d, 3, W8A8, e).0;
    assert_eq!(held(&OLMOE_1B_7B, &split_layout), 3 * (16 * 130 + 3));
    assert_eq!(held(&OLMOE_1B_7B_DENSE, &split_layout), 3 * (16 * 4 + 3));
    // Experts whole on one core: one context per expert linear, the rest as before.
    assert_eq!(
        held(&OLMOE_1B_7B, &ENGINE_LAYOUT),
        3 * (16 * 2 + 3) + 16 * 64 * 2
    );
    assert_eq!(
        held(&OLMOE_1B_7B_DENSE, &ENGINE_LAYOUT),
        held(&OLMOE_1B_7B_DENSE, &split_layout)
    );
}

/// `E[max]` of the lanes' counts by simulation: `trials` passes of `rows` rows, each row
/// choosing `k` distinct experts of `n` uniformly, expert `x` on lane `x mod lanes`.
fn simulated_busiest(n: usize, k: usize, rows: usize, lanes: usize, trials: usize) -> f64 {
    let mut rng = fastrand::Rng::with_seed(17);
    let mut sum = 0usize;
    let mut touched = vec![false; n];
    let mut pick: Vec<usize> = (0..n).collect();
    for _ in 0..trials {
        touched.fill(false);
        for _ in 0..rows {
            // A partial Fisher-Yates shuffle: k distinct experts.
            for i in 0..k {
                let j = rng.usize(i..n);
                pick.swap(i, j);
                touched[pick[i]] = true;
            }
        }
        let mut counts = vec![0usize; lanes];
        for (x, &t) in touched.iter().enumerate() {
            counts[x % lanes] += usize::from(t);
        }
        sum += counts.into_iter().max().unwrap_or(0);
    }
    sum as f64 / trials as f64
}

#[test]
fn the_busiest_lane_holds_more_than_its_share_of_the_chosen_experts() {
    let d = &OLMOE_1B_7B;
    // One lane holds every chosen expert; a dense block is one feed-forward.
    assert_eq!(d.busiest_lane_experts(1, 1), 8.0);
    assert!((d.busiest_lane_experts(128, 1) - 64.0).abs() < 1e-5);
    assert_eq!(OLMOE_1B_7B_DENSE.busiest_lane_experts(1, 3), 1.0);
    assert_eq!(d.busiest_lane_experts(0, 3), 0.0);
    // By hand: 4 experts on 2 lanes ({0, 2}, {1, 3}), 2 chosen: of the 6 pairs, 2 land on
    // one lane (max 2), 4 on both (max 1): 8 / 6.
    let small = DecoderShape {
        moe: Some(MoeShape {
            experts: 4,
            used: 2,
            n_ff_shared: 0,
        }),
        ..OLMOE_1B_7B
    };
    assert!(close(small.busiest_lane_experts(1, 2), 8.0 / 6.0));
    // OLMoE's decode on three lanes (22, 21, 21 experts), exact, against a simulation.
    let exact = d.busiest_lane_experts(1, 3);
    let sim = simulated_busiest(64, 8, 1, 3, 200_000);
    assert!((exact - sim).abs() < 0.01, "{exact} vs {sim}");
    assert!(exact > 8.0 / 3.0 + 1.0, "{exact}: well above an even share");
    // Passes of a few rows, where the touches are taken as independent: against routing
    // row by row, within 2 %.
    for rows in [2, 5, 16] {
        let model = d.busiest_lane_experts(rows, 3);
        let sim = simulated_busiest(64, 8, rows, 3, 50_000);
        assert!(
            (model - sim).abs() <= 0.02 * sim,
            "{rows} rows: {model} vs {sim}"
        );
    }
    // A 128-row prompt touches every expert: the lane of 22.
    assert!((d.busiest_lane_experts(128, 3) - 22.0).abs() < 1e-4);
}

#[test]
fn experts_whole_on_one_core_cost_the_busiest_lane_by_hand() {
    let split = DecoderLayout::Engine(EngineLayout {
        experts: ExpertLayout::Split,
        ..ENGINE_LAYOUT
    });
    let per_core = DecoderLayout::Engine(ENGINE_LAYOUT);
    let a = RK3588.decoder_pass_in(&OLMOE_1B_7B, 1, 1, 3, W8A8, &per_core);
    let b = RK3588.decoder_pass_in(&OLMOE_1B_7B, 1, 1, 3, W8A8, &split);
    // Decode: per block, the busiest lane's expected experts, each its gate-up (2048 → 2048)
    // and its down (1024 → 2048, two rows of A: residual) whole on one core, on a third of
    // DDR while all three stream; against 8 experts each split in thirds (a third of 2048
    // columns is 683, run as 704).
    let e = OLMOE_1B_7B.busiest_lane_experts(1, 3);
    let run = |m: f64, k: f64, n: f64| {
        let bw = f64::min(11.2e9, 30.3e9 / 3.0);
        50e-6 + (k * n + m * k + 4.0 * m * n) / bw
    };
    let whole = run(1.0, 2048.0, 2048.0) + run(2.0, 1024.0, 2048.0);
    let thirds = run(1.0, 2048.0, 704.0) + run(2.0, 1024.0, 704.0);
    assert!(close(a.npu_s - b.npu_s, 16.0 * (e * whole - 8.0 * thirds)));
    // Fewer runs per core, the same weights read.
    assert_eq!(a.runs_per_core, 2 * (16.0 * e).round() as u64 + 16 * 2 + 3);
    assert!(close(a.weight_bytes, b.weight_bytes));
    assert!(a.runs_per_core < b.runs_per_core);
    // A 128-row prefill touches all 64 experts: 22 on the busiest lane against 64 split
    // ones, a third of the runs and no column padding.
    let pa = RK3588.decoder_pass_in(&OLMOE_1B_7B, 128, 1, 3, W8A8, &per_core);
    let pb = RK3588.decoder_pass_in(&OLMOE_1B_7B, 128, 1, 3, W8A8, &split);
    assert!(pa.npu_s < pb.npu_s);
    assert!(pa.runs_per_core < pb.runs_per_core / 2);
    // A dense model is laid out the same either way.
    let da = RK3588.decoder_pass_in(&OLMOE_1B_7B_DENSE, 128, 1, 3, W8A8, &per_core);
    let db = RK3588.decoder_pass_in(&OLMOE_1B_7B_DENSE, 128, 1, 3, W8A8, &split);
    assert_eq!(da, db);
}

#[test]
fn the_router_runs_on_the_host() {
    // Per block 64 × 2048 f32 weights: 512 KiB read at 8 GB/s, and 2 × 131 072 operations
    // per row at 10 GFLOP/s.
    let per_block = |rows: f64| 524_288.0 / 8e9 + rows * 262_144.0 / 10e9;
    assert!(close(
        host::router_s(&OLMOE_1B_7B, 1),
        16.0 * per_block(1.0)
    ));
    assert!(close(
        host::router_s(&OLMOE_1B_7B, 128),
        16.0 * per_block(128.0)
    ));
    assert_eq!(host::router_s(&OLMOE_1B_7B_DENSE, 128), 0.0);
    assert_eq!(host::router_s(&CAMPAIGN_9B, 512), 0.0);
    // Decode's host time is the campaign's share of the NPU time plus one row's routers;
    // TTFT's host time the glue plus the prompt's.
    let p = RK3588.predict_llm_prompt(&OLMOE_1B_7B, 128);
    let share = p.decode_npu_s * 0.078 / (1.0 - 0.078);
    assert!(close(p.decode_host_s, share + 16.0 * per_block(1.0)));
    assert!(close(
        p.prefill_host_s,
        host::prefill_s(&OLMOE_1B_7B, 128) + 16.0 * per_block(128.0)
    ));
}

#[test]
fn a_prefill_runs_every_touched_expert_once_on_its_rows() {
    // 128 rows in the engine's one 128-row pass: each block runs its 64 experts (7/8 of the
    // rows missing an expert is 3.8e-8) on 16 rows each, 2 linears an expert: split over the
    // cores, each core runs all 64; whole on one core each, the busiest core its 22. The
    // dense twin runs its 2 feed-forward linears once on 128 rows.
    let engine = DecoderLayout::Engine(ENGINE_LAYOUT);
    let split = DecoderLayout::Engine(EngineLayout {
        experts: ExpertLayout::Split,
        ..ENGINE_LAYOUT
    });
    let moe = RK3588.decoder_pass_in(&OLMOE_1B_7B, 128, 1, 3, W8A8, &split);
    let dense = RK3588.decoder_pass_in(&OLMOE_1B_7B_DENSE, 128, 1, 3, W8A8, &engine);
    assert_eq!(moe.runs_per_core, 16 * (2 + 64 * 2) + 3);
    assert_eq!(dense.runs_per_core, 16 * 4 + 3);
    let per_core = RK3588.decoder_pass_in(&OLMOE_1B_7B, 128, 1, 3, W8A8, &engine);
    assert_eq!(per_core.runs_per_core, 16 * (2 + 22 * 2) + 3);
    assert!(close(per_core.weight_bytes, moe.weight_bytes));
    // All 64 experts' weights stream once: 8 times the dense twin's feed-forward reads.
    let expert_bytes = 3.0 * 2048.0 * 1024.0;
    let attn_head = 16.0 * 4.0 * 2048.0 * 2048.0 + 50_304.0 * 2048.0;
    assert!((moe.weight_bytes - (16.0 * 64.0 * expert_bytes + attn_head)).abs() < 1e3);
    assert!((dense.weight_bytes - (16.0 * 8.0 * expert_bytes + attn_head)).abs() < 1e3);
}
