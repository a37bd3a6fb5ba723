//! The RK3576 cost model: its numbers are the stated ones (rated, public, or RK3588's carried
//! over), `for_platform` and the emulator use it, W4A16 reads half the weight bytes W8A8
//! reads, planned with int4 alignment and RK3576's 4096-row K segments, and its host terms
//! are the measured ones carried to the Cortex-A72 by the stated ratio.

use rknn_chip::plan::LinearPlan;
use rknn_chip::{MatmulType, Platform};
use rknn_emu::cost::{
    CostModel, DecoderLayout, EngineLayout, EngineLinear, LinearRole, PHI3_3_8B, QWEN2_0_5B,
    RK3576, RK3588, Residual, Run, TINYLLAMA_1_1B, host,
};
use rknn_emu::{CostPolicy, EmuConfig, Emulator};

const W4A16: MatmulType = MatmulType::F16_I4_F32;
const W8A8: MatmulType = MatmulType::I8_I8_I32;

fn close(a: f64, b: f64, rel: f64) -> bool {
    (a - b).abs() <= rel * b.abs()
}

#[test]
fn the_rk3576_numbers_are_the_stated_ones() {
    let m = &RK3576;
    assert_eq!(m.platform, Platform::Rk3576);
    // Public: two NPU cores; rated: 6 TOPS int8 over them.
    assert_eq!(m.cores, 2);
    assert_eq!(m.cores, Platform::Rk3576.npu_cores());
    assert_eq!(m.peak_i8 * m.cores as f64, 6.0e12);
    assert_eq!(m.rated_tops(W8A8), Some(3.0));
    // Fact sheet §6: K segments of 4096 rows on RK3576.
    assert_eq!(m.k_segment, Some(4096));
    assert_eq!(m.k_segment, Platform::Rk3576.k_segment());
    // DDR: 32 bits (4 bytes) at an assumed 6400 MT/s, at RK3588's realised share of its
    // 64-bit LPDDR5-6400 peak (30.3 of 51.2 GB/s).
    let peak = 4.0 * 6.4e9;
    assert!(close(m.ddr_bw, peak * 30.3 / 51.2, 1e-12), "{}", m.ddr_bw);
    assert!(close(m.ddr_bw, 15.15e9, 1e-3), "{}", m.ddr_bw);
    // Assumed: RK3588's per-run cost, per-core DMA, A block and cliff rate.
    assert_eq!(
        (m.call_s, m.core_bw, m.a_block_bytes, m.cliff_ops),
        (
            RK3588.call_s,
            RK3588.core_bw,
            RK3588.a_block_bytes,
            RK3588.cliff_ops
        )
    );
    // Assumed: f16 at half and int4 at twice the int8 rate, as on RK3588.
    assert_eq!(m.peak_f16, m.peak_i8 / 2.0);
    assert_eq!(m.peak_i4, 2.0 * m.peak_i8);
    // The mixed f16 × int4 type runs at most at the f16 rate.
    assert_eq!(m.peak(W4A16), m.peak_f16);
    // Two cores streaming at once each get half of DDR, below one core's DMA rate.
    assert_eq!(m.bandwidth(2), m.ddr_bw / 2.0);
    assert_eq!(m.bandwidth(1), m.core_bw);
}

#[test]
fn for_platform_and_the_emulator_use_the_rk3576_model() {
    assert_eq!(CostModel::for_platform(Platform::Rk3576), Some(&RK3576));
    assert_eq!(
        CostPolicy::Calibrated.resolve(Platform::Rk3576),
        Some(RK3576)
    );
    let emu = Emulator::new(EmuConfig::new(Platform::Rk3576)).unwrap();
    assert_eq!(emu.cost_model(), Some(&RK3576));
    // What the LLM's modelled line is built from: a non-zero time for a decode-sized run.
    let t = RK3576.modelled_run(1, 896, 4864, W8A8, 2);
    assert!(t.as_secs_f64() > RK3576.call_s, "{t:?}");
}

#[test]
fn a_w4a16_run_reads_half_the_weight_bytes_of_a_w8a8_run() {
    let (m, k, n) = (1, 2048, 4096);
    let run = |t| {
        RK3576.run(&Run {
            m,
            k,
            n,
            t,
            busy_cores: 2,
        })
    };
    // Hand count: B at 4 or 8 bits, A at 16 or 8 bits, C at 32 bits, B streamed once.
    let b4 = (k * n / 2) as f64;
    let b8 = (k * n) as f64;
    assert_eq!(
        run(W4A16).bytes,
        b4 + (2 * m * k) as f64 + (4 * m * n) as f64
    );
    assert_eq!(run(W8A8).bytes, b8 + (m * k) as f64 + (4 * m * n) as f64);
    assert_eq!(2.0 * b4, b8);
    // Memory-bound at M = 1: the time is the bytes at each core's share of DDR.
    let r = run(W4A16);
    assert!(close(r.memory_s, r.bytes / (RK3576.ddr_bw / 2.0), 1e-12));
    assert!(r.memory_s > r.compute_s);
}

#[test]
fn a_w4a16_decoder_pass_reads_half_the_weight_bytes_of_w8a8() {
    let layout = EngineLayout::for_platform(Platform::Rk3576);
    let engine = DecoderLayout::Engine(layout);
    let d = &TINYLLAMA_1_1B;
    // Hand count of TinyLlama's weights a token reads: per block q, k, v (2048 + 2 × 256
    // columns), o, gate and up (2 × 5632), down, all of K 2048 but down's (5632); the head
    // 32000 × 2048.
    let block = (2048 + 2 * 256) * 2048 + 2048 * 2048 + 2 * 5632 * 2048 + 2048 * 5632;
    let weights = (22 * block + 32000 * 2048) as f64;
    let pass = |t| RK3576.decoder_pass_in(d, 1, 1, 2, t, &engine);
    assert_eq!(pass(W8A8).weight_bytes, weights);
    assert_eq!(pass(W4A16).weight_bytes, weights / 2.0);
    // Every TinyLlama dimension is a multiple of 64: int4's alignment pads nothing, so the
    // engine holds as many elements in both formats, at half the bytes.
    let (_, e4) = RK3576.engine_held(d, 2, W4A16, &layout);
    let (_, e8) = RK3576.engine_held(d, 2, W8A8, &layout);
    assert_eq!(e4, e8);
    // Decode streams them at the DDR rate: the slowest lane's weight-read time is its half
    // of the bytes at half of DDR, the whole at the whole (lanes split evenly to within an
    // aligned block).
    let p = RK3576.predict_llm_prompt_as(d, 128, &engine, W4A16);
    let want = weights / 2.0 / RK3576.ddr_bw;
    assert!(close(p.decode.terms.weights_s, want, 0.02), "{p:?}");
    // And W4A16 decodes faster than W8A8 on the same chip.
    let p8 = RK3576.predict_llm_prompt_as(d, 128, &engine, W8A8);
    assert!(p.decode_tok_s > 1.5 * p8.decode_tok_s, "{p:?} {p8:?}");
}

#[test]
fn int4_weights_are_planned_with_int4_alignment_and_4096_row_segments() {
    let layout = EngineLayout::for_platform(Platform::Rk3576);
    let lin = |n, k| EngineLinear {
        role: LinearRole::Down,
        n,
        k,
        residual: false,
    };
    let plan =
        |l: &EngineLinear, t| -> LinearPlan { RK3576.engine_plan(l, 2, t, &layout).unwrap() };
    // N = 96: int4 pads to 128 (N alignment 64), int8 keeps 96 (32).
    assert_eq!(plan(&lin(96, 2048), W4A16).n_pad, 128);
    assert_eq!(plan(&lin(96, 2048), W8A8).n_pad, 96);
    // K = 5632 in RK3576's segments of 4096 rows.
    assert_eq!(
        plan(&lin(2048, 5632), W4A16).segments,
        [(0, 4096), (4096, 1536)]
    );
    // The engine's default widest context on RK3576 is the user guide's 4096 columns (no
    // wider N measured there); RK3588's measured 8192.
    assert_eq!(layout.max_n_per_context, 4096);
    assert_eq!(
        EngineLayout::for_platform(Platform::Rk3588).max_n_per_context,
        8192
    );
}

#[test]
fn f16_activations_have_no_residual_rows() {
    let layout = EngineLayout::for_platform(Platform::Rk3576);
    assert_eq!(layout.residual, Residual::OutputAndDown);
    assert_eq!(layout.for_type(W4A16).residual, Residual::None);
    assert_eq!(layout.for_type(W8A8).residual, Residual::OutputAndDown);
    assert_eq!(
        layout.for_type(MatmulType::I8_I4_I32).residual,
        Residual::OutputAndDown
    );
    // The W4A16 prefill's glue is the board's rate per element without residual rows.
    let d = &QWEN2_0_5B;
    let p = RK3576.predict_llm_prompt_as(d, 128, &DecoderLayout::Engine(layout), W4A16);
    let plain = EngineLayout {
        residual: Residual::None,
        ..layout
    };
    let want = host::RK3576_A72.glue_ns() * 1e-9 * plain.activations(d, 128, 1);
    assert!(close(p.prefill_host_s, want, 1e-12), "{p:?}");
}

#[test]
fn the_host_terms_are_carried_to_the_a72_by_the_stated_ratio() {
    let b = host::board(Platform::Rk3576);
    assert_eq!(b, &host::RK3576_A72);
    // Measured A76 slowdown × assumed 1.5 per clock × the clocks 2.4 / 2.2 GHz.
    assert!(close(b.thread_slowdown, 1.85 * 1.5 * 2.4 / 2.2, 1e-12));
    assert!(close(b.thread_slowdown, 3.027, 1e-3));
    assert_eq!((b.glue_threads, b.ops_threads), (2.0, 4.0));
    // The engine's glue per element there: 1.15 ns × 3.03 / 2 lanes.
    assert!(close(b.glue_ns(), 1.15 * 3.027 / 2.0, 1e-3));
    assert_eq!(host::board(Platform::Rk3588), &host::RK3588_A76);
    // A decoded token's host ops and share scale with the thread slowdown.
    let d = &PHI3_3_8B;
    let a76 = host::decode_ops_s(d, 1, 160);
    let a72 = host::decode_ops_s_on(b, d, 1, 160);
    assert!(close(a72 / a76, 1.5 * 2.4 / 2.2, 1e-12));
    assert!(close(
        host::decode_s_on(b, 0.1) / host::decode_s(0.1),
        1.5 * 2.4 / 2.2,
        1e-12
    ));
}

#[test]
fn rk3588_predictions_are_unchanged_by_the_board_and_type_parameters() {
    let engine = DecoderLayout::Engine(EngineLayout::for_platform(Platform::Rk3588));
    for d in [&QWEN2_0_5B, &TINYLLAMA_1_1B, &PHI3_3_8B] {
        let p = RK3588.predict_llm_prompt_in(d, 128, &engine);
        let q = RK3588.predict_llm_prompt_on(d, 128, &engine, W8A8, &host::RK3588_A76);
        assert_eq!(p, q);
        // The host terms are RK3588's own formulas, term for term.
        assert_eq!(
            p.prefill_host_s,
            host::prefill_engine_s(d, 128, &rknn_emu::cost::ENGINE_LAYOUT)
        );
        assert_eq!(p.decode_host_s, host::decode_s(p.decode_npu_s));
        assert_eq!(p.prefill_ops_s, host::prefill_ops_s(d, 128));
        assert_eq!(p.decode_ops_s, host::decode_ops_s(d, 1, 160));
        assert!(close(
            p.decode_pinned_tok_s,
            host::A76_PINNED_DECODE_SPEEDUP * p.decode_tok_s,
            1e-12
        ));
    }
}
