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
