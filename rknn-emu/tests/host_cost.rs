//! The cost model's host term for the engine's layout (`rknn_emu::cost::host`): this engine's
//! glue measured per activation element (`scripts/bench/host_cost.py`) and carried to the
//! board's Cortex-A76 by llama.cpp's per-thread rates on the campaign's 9B, checked against
//! the measured numbers and a hand count of the elements; the calibrated NPU terms and the
//! campaign's own host term are untouched.

use rknn_emu::cost::{
    DecoderLayout, ENGINE_LAYOUT, QWEN2_0_5B, QWEN2_5_1_5B, RK3588, TINYLLAMA_1_1B, host,
};

fn close(a: f64, b: f64, rel: f64) -> bool {
    (a - b).abs() <= rel * b.abs()
}

#[test]
fn the_scale_is_llama_cpps_per_thread_rate_here_against_the_a76s() {
    // pp512 on the campaign's 9B: 12.64 tok/s on 2 threads here, 13.65 on four A76 threads.
    let ratio = (12.64 / 2.0) / (13.65 / 4.0);
    assert!(close(host::A76_THREAD_SLOWDOWN, ratio, 0.005), "{ratio}");
    // The glue measured here: the median of the three models' 1.19, 1.14, 1.15 ns.
    let mut measured = [1.19, 1.14, 1.15];
    measured.sort_by(f64::total_cmp);
    assert_eq!(host::ENGINE_GLUE_NS_HERE, measured[1]);
    // Spread over the board's three lanes: 0.71 ns of wall time per element, a fifth of the
    // campaign's 3.6.
    assert!(close(host::ENGINE_GLUE_NS, 1.15 * ratio / 3.0, 0.005));
    let campaign_ns = 1e9 * host::PREFILL_512_S / rknn_emu::cost::CAMPAIGN_9B.activations(512, 1);
    assert!((campaign_ns - 3.6).abs() < 0.05, "{campaign_ns}");
    assert!(host::ENGINE_GLUE_NS < campaign_ns / 4.0);
}

#[test]
fn the_engine_glue_counts_every_element_its_linears_move() {
    // Qwen2-0.5B, 128 rows: per block qkv (896 in, 896 + 2 × 128 out), o (896, 896),
    // gate-up (896, 2 × 4864) and down with residual rows (2 × (4864 + 896)); the head over
    // the last row, residual too (2 × (896 + 151 936)).
    let per_row = (896 + 1152) + (896 + 896) + (896 + 2 * 4864) + 2 * (4864 + 896);
    let elems = (24 * 128 * per_row + 2 * (896 + 151_936)) as f64;
    let want = host::ENGINE_GLUE_NS * 1e-9 * elems;
    let got = host::prefill_engine_s(&QWEN2_0_5B, 128, &ENGINE_LAYOUT);
    assert!(close(got, want, 1e-12), "{got} vs {want}");
    // It is the prediction's prefill host time (no router in a dense model), and a fifth of
    // what the same elements cost at the campaign's rate.
    for d in [&QWEN2_0_5B, &TINYLLAMA_1_1B, &QWEN2_5_1_5B] {
        let p = RK3588.predict_llm_prompt_in(d, 128, &DecoderLayout::Engine(ENGINE_LAYOUT));
        assert_eq!(
            p.prefill_host_s,
            host::prefill_engine_s(d, 128, &ENGINE_LAYOUT)
        );
        let campaign = host::prefill_engine_campaign_s(d, 128, &ENGINE_LAYOUT);
        assert!(close(
            p.prefill_host_s / campaign,
            host::ENGINE_GLUE_NS / 3.6,
            0.02
        ));
    }
    // The campaign's layout keeps the campaign's host term: its calibration is untouched.
    let c = RK3588.predict_llm_prompt(&QWEN2_0_5B, 128);
    assert_eq!(c.prefill_host_s, host::prefill_s(&QWEN2_0_5B, 128));
}

/// The three models measured by `scripts/bench/host_cost.py` (128-token prompt, 32 tokens
/// decoded): shape, prompt tokens, and the host ops measured per token, milliseconds of wall
/// time on 2 threads here: prefill attention / other, decode attention / other.
const MEASURED_OPS: [(&rknn_emu::cost::DecoderShape, usize, [f64; 4]); 3] = [
    (&QWEN2_0_5B, 128, [0.111, 0.236, 0.684, 0.392]),
    (&TINYLLAMA_1_1B, 129, [0.236, 0.257, 1.299, 0.359]),
    (&QWEN2_5_1_5B, 128, [0.178, 0.384, 1.186, 0.455]),
];

#[test]
fn the_host_ops_term_is_the_measured_ops_carried_to_the_a76() {
    for (d, prompt, [p_attn, p_other, d_attn, d_other]) in MEASURED_OPS {
        let (l, r) = (d.layers as f64, prompt as f64);
        // The rates the constants are the medians of, from the measurement and the shape.
        let other_ns = 1e6 * p_other / (l * (d.hidden + d.n_ff) as f64);
        let attn_ns = 1e6 * p_attn / (l * 2.0 * d.q_dim as f64 * (r + 1.0) / 2.0);
        assert!(
            close(other_ns, host::PREFILL_OPS_NS_HERE, 0.15),
            "{other_ns}"
        );
        assert!(
            close(attn_ns, host::PREFILL_ATTENTION_NS_HERE, 0.2),
            "{attn_ns}"
        );
        assert!(close(
            1e3 * d_other / l,
            host::DECODE_OPS_US_PER_BLOCK_HERE,
            0.01
        ));
        // Decode measured over the 32 tokens after the prompt: positions prompt + 1 ..= + 32.
        let positions = r + 16.5;
        let d_attn_ns = 1e6 * d_attn / (l * 2.0 * d.q_dim as f64 * positions);
        assert!(
            close(d_attn_ns, host::DECODE_ATTENTION_NS_HERE, 0.12),
            "{d_attn_ns}"
        );

        // The term: the measured wall time per token here, carried by the A76's per-thread
        // slowdown, the prefill's spread from 2 threads to the board's 4, decode's on one.
        // The medians fit each model's prefill within 20 % (Qwen2.5-1.5B +19 %: its wider
        // feed-forward costs less per element), its decode within 12 %.
        let here = 1e-3 * r * (p_attn + p_other);
        let board = host::prefill_ops_s(d, prompt);
        assert!(
            close(board, here * 1.85 * 2.0 / 4.0, 0.2),
            "{} {board}",
            d.name
        );
        let here = 1e-3 * (d_attn + d_other);
        let board = host::decode_ops_s(d, 1, prompt + 16);
        assert!(close(board, here * 1.85, 0.12), "{} {board}", d.name);
    }
}

#[test]
fn the_engine_layout_pays_its_host_ops_and_the_campaign_layout_does_not() {
    let engine = DecoderLayout::Engine(ENGINE_LAYOUT);
    for (d, ..) in MEASURED_OPS {
        let e = RK3588.predict_llm_prompt_in(d, 128, &engine);
        assert_eq!(e.prefill_ops_s, host::prefill_ops_s(d, 128));
        assert_eq!(e.decode_ops_s, host::decode_ops_s(d, 1, 160));
        // TTFT is NPU, glue and ops; decode is NPU, glue share and ops.
        assert_eq!(
            e.ttft_s(),
            e.prefill_npu_s + e.prefill_host_s + e.prefill_ops_s
        );
        assert!(close(
            e.decode_tok_s,
            1.0 / (e.decode_npu_s + e.decode_host_s + e.decode_ops_s),
            1e-12
        ));
        // Attention grows with the positions: a longer prompt costs more per token.
        let long = host::prefill_ops_s(d, 1024) / 1024.0;
        assert!(long > host::prefill_ops_s(d, 128) / 128.0);
        assert!(host::decode_ops_s(d, 1, 1024) > host::decode_ops_s(d, 1, 160));
        // The campaign's layout keeps its calibrated, end-to-end host term.
        let c = RK3588.predict_llm_prompt(d, 128);
        assert_eq!((c.prefill_ops_s, c.decode_ops_s), (0.0, 0.0));
    }
}
