//! The cost model's speculative decoding with a draft model (docs/npu-matmul-performance.md,
//! "Speculative decoding with a draft model") checked against independent references: the
//! tokens a cycle yields against the geometric series summed term by term and against cycles
//! drawn at random, the cycle time against the passes of `decoder_pass_in` and against the
//! extra rows of a verify pass worked out by hand from the documented per-run formula, the
//! break-even acceptance against the two rates it equates, and the limits (nothing accepted;
//! a free draft that is always right).

use rknn_chip::MatmulType;
use rknn_emu::cost::{
    DecoderLayout, DecoderShape, ENGINE_LAYOUT, LLAMA3_2_1B, LLAMA3_8B, QWEN2_0_5B, QWEN2_5_0_5B,
    QWEN2_5_1_5B, RK3588, SPEC_POSITIONS, SpecDecode, host, spec_acceptance_rate,
    spec_alpha_from_acceptance, spec_tokens_per_cycle,
};

const W8A8: MatmulType = MatmulType::I8_I8_I32;
const MAX_K: usize = 16;

/// The campaign's host share of a decoded token: a pass of NPU time `npu` takes
/// `npu + npu · 0.078 / (1 − 0.078)` seconds.
fn with_host(npu: f64) -> f64 {
    npu / (1.0 - 0.078)
}

fn close(a: f64, b: f64, rel: f64) -> bool {
    (a - b).abs() <= rel * b.abs().max(1e-300)
}

fn pairs() -> [(&'static DecoderShape, &'static DecoderShape); 2] {
    [(&LLAMA3_8B, &LLAMA3_2_1B), (&QWEN2_5_1_5B, &QWEN2_5_0_5B)]
}

fn engine() -> DecoderLayout {
    DecoderLayout::Engine(ENGINE_LAYOUT)
}

#[test]
fn the_drafts_shapes_and_vocabularies() {
    // Llama-3.2-1B: 16 blocks of q 2048 × 2048, k and v 512 × 2048, o 2048 × 2048, gate and
    // up 8192 × 2048, down 2048 × 8192; one tied 128 256 × 2048 embedding: 1.24 G.
    let attn = 2 * 2048 * 2048 + 2 * 512 * 2048;
    let ffn = 3 * 2048 * 8192;
    let head = 128_256 * 2048;
    assert_eq!(LLAMA3_2_1B.parameters(), 16 * (attn + ffn) + head);
    assert_eq!(LLAMA3_2_1B.parameters(), 1_235_746_816);
    assert_eq!(LLAMA3_2_1B.weights(), LLAMA3_2_1B.parameters());
    // Qwen2.5-0.5B is Qwen2-0.5B's shape under its own name.
    assert_eq!(
        QWEN2_5_0_5B,
        DecoderShape {
            name: "Qwen2.5-0.5B",
            ..QWEN2_0_5B
        }
    );
    // Each draft has its target's vocabulary.
    assert_eq!(LLAMA3_2_1B.vocab, LLAMA3_8B.vocab);
    assert_eq!(QWEN2_5_0_5B.vocab, QWEN2_5_1_5B.vocab);
}

#[test]
fn a_cycle_yields_the_geometric_series() {
    let mut alphas: Vec<f64> = (0..20).map(|i| i as f64 * 0.05).collect();
    alphas.extend([0.17, 0.31, 0.41, 0.99, 1.0 - 1e-6, 1.0]);
    for &a in &alphas {
        for k in 0..=MAX_K {
            // 1 + α + α² + … + α^k, term by term.
            let direct: f64 = (0..=k).map(|i| a.powi(i as i32)).sum();
            let e = spec_tokens_per_cycle(a, k);
            assert!(close(e, direct, 1e-9), "α {a} k {k}: {e} against {direct}");
        }
    }
    assert_eq!(spec_tokens_per_cycle(0.0, 4), 1.0);
    assert_eq!(spec_tokens_per_cycle(1.0, 4), 5.0);
    assert_eq!(spec_tokens_per_cycle(0.7, 0), 1.0);
}

#[test]
fn accepted_over_drafted_is_not_alpha() {
    // Cycles drawn at random: k drafts, each accepted with probability α until the first
    // rejection. The tokens a cycle yields (accepted + 1) and accepted / drafted over many
    // cycles against E and spec_acceptance_rate.
    let mut rng = fastrand::Rng::with_seed(42);
    let cycles = 200_000;
    for (a, k) in [(0.41, 4), (0.62, 3), (0.8, 6), (0.3, 1)] {
        let mut accepted = 0usize;
        for _ in 0..cycles {
            accepted += (0..k).take_while(|_| rng.f64() < a).count();
        }
        let e = 1.0 + accepted as f64 / cycles as f64;
        let rate = accepted as f64 / (cycles * k) as f64;
        // The accepted count of a cycle has a standard deviation below k: 5 σ of the mean.
        let tol = 5.0 * k as f64 / (cycles as f64).sqrt();
        assert!(
            (e - spec_tokens_per_cycle(a, k)).abs() < tol,
            "α {a} k {k}: E {e}"
        );
        assert!((rate - spec_acceptance_rate(a, k)).abs() < tol / k as f64);
        if k > 1 {
            assert!(
                rate < a - 0.05,
                "the drafts after a rejection are never accepted"
            );
        }
    }
    // The rates measured here converted: 17 % at k = 4 is α with α + α² + α³ + α⁴ = 4 · 0.17,
    // 41 % at k = 3 is α with α + α² + α³ = 3 · 0.41.
    for (rate, k) in [(0.17, 4), (0.31, 4), (0.28, 3), (0.41, 3)] {
        let a = spec_alpha_from_acceptance(rate, k).unwrap();
        let accepted: f64 = (1..=k).map(|i| a.powi(i as i32)).sum();
        assert!(close(accepted, k as f64 * rate, 1e-12), "{rate} at {k}");
        assert!(a > rate);
    }
    let a = spec_alpha_from_acceptance(0.17, 4).unwrap();
    assert!((a - 0.41).abs() < 0.005, "{a}");
    // One drafted token: the rate is α.
    assert!(close(
        spec_alpha_from_acceptance(0.3, 1).unwrap(),
        0.3,
        1e-12
    ));
    assert_eq!(spec_alpha_from_acceptance(0.3, 0), None);
    assert_eq!(spec_alpha_from_acceptance(1.5, 4), None);
}

#[test]
fn a_cycle_is_k_draft_passes_and_one_verify_pass() {
    for layout in [engine(), DecoderLayout::Campaign] {
        for (target, draft) in pairs() {
            let s = RK3588.spec_decode(target, draft, MAX_K, &layout);
            assert_eq!(s.max_k(), MAX_K);
            // In the engine's layout each pass also pays its rows' host ops (the campaign's
            // host share is calibrated end to end).
            let ops = |d: &DecoderShape, rows: usize| match layout {
                DecoderLayout::Campaign => 0.0,
                DecoderLayout::Engine(_) => host::decode_ops_s(d, rows, SPEC_POSITIONS),
            };
            let pass = |d: &DecoderShape, rows: usize| {
                with_host(
                    RK3588
                        .decoder_pass_in(d, rows, rows, 3, W8A8, &layout)
                        .npu_s,
                ) + ops(d, rows)
            };
            let draft_s = pass(draft, 1);
            for k in 0..=MAX_K {
                let hand = k as f64 * draft_s + pass(target, k + 1);
                assert!(close(s.cycle_s(k), hand, 1e-12), "{} k {k}", target.name);
            }
            // Plain decode is the model's decode prediction.
            let p = RK3588.predict_llm_prompt_in(target, 128, &layout);
            assert!(close(s.plain_tok_s(), p.decode_tok_s, 1e-12));
            assert!(close(s.tok_s(0.9, 0), p.decode_tok_s, 1e-12));
        }
    }
}

/// A third of `n` columns rounded up to a multiple of 32: the campaign's shard of one core.
fn shard(n: usize) -> f64 {
    n.div_ceil(3).next_multiple_of(32) as f64
}

#[test]
fn a_verify_row_costs_its_activations_by_hand() {
    // The campaign's layout, Llama-3-8B: every run is memory-bound and its rows fit the A
    // block, so each extra row of a verify pass adds only its A row (K bytes) and C row (4 × N
    // bytes) to every run, at one of three cores' share of DDR, min(11.2, 30.3 / 3) GB/s.
    // Runs per block (K, N of a core's shard): q and o (4096, 4096 / 3), k and v (4096,
    // 1024 / 3), gate and up (4096, 14336 / 3), down in 2 segments (7168, 4096 / 3); the head
    // (4096, 128 256 / 3) over every row.
    let row = |k: f64, n: usize| k + 4.0 * shard(n);
    let block = 2.0 * row(4096.0, 4096)
        + 2.0 * row(4096.0, 1024)
        + 2.0 * row(4096.0, 14336)
        + 2.0 * row(7168.0, 4096);
    let per_row = (32.0 * block + row(4096.0, 128_256)) / f64::min(11.2e9, 30.3e9 / 3.0);
    let s = RK3588.spec_decode(&LLAMA3_8B, &LLAMA3_2_1B, 8, &DecoderLayout::Campaign);
    for k in 1..=8 {
        let extra = s.verify_s[k] - s.plain_s;
        assert!(
            close(extra, with_host(k as f64 * per_row), 1e-9),
            "k {k}: {extra} against {}",
            with_host(k as f64 * per_row)
        );
    }
}

#[test]
fn the_break_even_alpha_equates_the_rates() {
    for (target, draft) in pairs() {
        let s = RK3588.spec_decode(target, draft, MAX_K, &engine());
        let plain = s.plain_tok_s();
        let mut lowest = f64::INFINITY;
        for k in 1..=MAX_K {
            let a = s
                .break_even_alpha(k)
                .expect("a 1B-class draft pays at α = 1");
            assert!(close(s.tok_s(a, k), plain, 1e-9), "{} k {k}", target.name);
            assert!(s.tok_s(a + 1e-6, k) > plain);
            assert!(s.tok_s(a - 1e-6, k) < plain);
            lowest = lowest.min(a);
        }
        let (k, a) = s.break_even_alpha_best().unwrap();
        assert_eq!(a, lowest);
        assert_eq!(s.break_even_alpha(k), Some(a));
        // Below it no draft length pays; above it the best one does.
        assert!(s.best_k(a - 1e-6).1 < plain);
        assert!(s.best_k(a + 1e-6).1 > plain);
    }
    // A draft as costly as the model never pays: a cycle costs at least k + 1 plain tokens.
    let s = RK3588.spec_decode(&LLAMA3_8B, &LLAMA3_8B, MAX_K, &engine());
    assert_eq!(s.break_even_alpha_best(), None);
    assert_eq!(s.break_even_alpha(0), None);
}

#[test]
fn nothing_accepted_is_slower_than_plain_decode() {
    for (target, draft) in pairs() {
        let s = RK3588.spec_decode(target, draft, MAX_K, &engine());
        for k in 1..=MAX_K {
            // One token a cycle, for k draft passes and a verify pass.
            assert!(close(s.tok_s(0.0, k), 1.0 / s.cycle_s(k), 1e-12));
            assert!(s.tok_s(0.0, k) < s.plain_tok_s(), "{} k {k}", target.name);
        }
    }
}

#[test]
fn a_free_draft_always_right_gives_k_plus_1_tokens_a_verify_pass() {
    for (target, draft) in pairs() {
        let s = SpecDecode {
            draft_s: 0.0,
            ..RK3588.spec_decode(target, draft, MAX_K, &engine())
        };
        for k in 1..=MAX_K {
            let limit = (k + 1) as f64 / s.verify_s[k];
            assert!(close(s.tok_s(1.0 - 1e-9, k), limit, 1e-7), "k {k}");
            assert!(s.tok_s(1.0 - 1e-3, k) < limit);
            assert!(close(s.tok_s(1.0, k), limit, 1e-15));
            // A verify pass of k + 1 rows costs less than k + 1 plain tokens: it pays.
            assert!(limit > s.plain_tok_s());
        }
    }
}

#[test]
fn the_best_length_is_the_fastest() {
    for (target, draft) in pairs() {
        let s = RK3588.spec_decode(target, draft, MAX_K, &engine());
        let mut last = 0;
        for a in [0.2, 0.41, 0.6, 0.7, 0.8, 0.9] {
            let (k, rate) = s.best_k(a);
            for j in 1..=MAX_K {
                assert!(rate >= s.tok_s(a, j), "α {a}: k {k} against {j}");
            }
            // A more agreeable draft is worth drafting further.
            assert!(k >= last, "α {a}");
            last = k;
        }
        // Capped below the best length, the longest allowed is the best.
        for cap in [1, 2] {
            let s = RK3588.spec_decode(target, draft, cap, &engine());
            assert_eq!(s.max_k(), cap);
            assert_eq!(s.best_k(0.95), (cap, s.tok_s(0.95, cap)));
        }
    }
}
