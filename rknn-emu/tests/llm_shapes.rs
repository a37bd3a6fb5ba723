//! Structural facts the cost model must get right for the public decoder shapes it is compared
//! with RKLLM on (docs/npu-matmul-performance.md, "The RKLLM table"): no predicted figure is
//! asserted here, only what follows from the shapes and the model's own rules.

use rknn_chip::MatmulType;
use rknn_emu::cost::{
    self, CAMPAIGN_9B, CostModel, DecoderLayout, DecoderShape, ENGINE_LAYOUT, EngineLayout,
    EngineLinear, GEMMA2_2B, LLAMA3_8B, LinearRole, PHI3_3_8B, QWEN2_0_5B, QWEN2_5_1_5B,
    QWEN3_0_6B, RK3588, Residual, TINYLLAMA_1_1B,
};

/// A model's `config.json` values, as published.
struct Config {
    shape: DecoderShape,
    hidden: usize,
    layers: usize,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    n_ff: usize,
    vocab: usize,
    tied: bool,
    /// q, k and v biases (Qwen2).
    qkv_bias: bool,
    /// Norms of the hidden size per block: 2 (before attention and before the feed-forward),
    /// 4 in Gemma 2 (also after each).
    block_norms: usize,
    /// Per-head q and k norms of the head size (Qwen3).
    qk_norm: bool,
    /// The parameter count the `config.json` gives (the published checkpoint's, its
    /// safetensors index, where one is stored).
    parameters: u64,
    /// The size the publisher names the model by, in billions ("0.6" for Qwen3-0.6B).
    published: &'static str,
}

const CONFIGS: [Config; 7] = [
    Config {
        shape: QWEN2_0_5B,
        hidden: 896,
        layers: 24,
        heads: 14,
        kv_heads: 2,
        head_dim: 64,
        n_ff: 4864,
        vocab: 151_936,
        tied: true,
        qkv_bias: true,
        block_norms: 2,
        qk_norm: false,
        parameters: 494_032_768,
        published: "0.5",
    },
    Config {
        shape: TINYLLAMA_1_1B,
        hidden: 2048,
        layers: 22,
        heads: 32,
        kv_heads: 4,
        head_dim: 64,
        n_ff: 5632,
        vocab: 32_000,
        tied: false,
        qkv_bias: false,
        block_norms: 2,
        qk_norm: false,
        parameters: 1_100_048_384,
        published: "1.1",
    },
    Config {
        shape: QWEN2_5_1_5B,
        hidden: 1536,
        layers: 28,
        heads: 12,
        kv_heads: 2,
        head_dim: 128,
        n_ff: 8960,
        vocab: 151_936,
        tied: true,
        qkv_bias: true,
        block_norms: 2,
        qk_norm: false,
        parameters: 1_543_714_304,
        published: "1.5",
    },
    Config {
        shape: LLAMA3_8B,
        hidden: 4096,
        layers: 32,
        heads: 32,
        kv_heads: 8,
        head_dim: 128,
        n_ff: 14336,
        vocab: 128_256,
        tied: false,
        qkv_bias: false,
        block_norms: 2,
        qk_norm: false,
        parameters: 8_030_261_248,
        published: "8",
    },
    // Qwen3-0.6B: 151.6 M of embedding and 440.5 M of blocks ("0.44B" non-embedding on its
    // model card).
    Config {
        shape: QWEN3_0_6B,
        hidden: 1024,
        layers: 28,
        heads: 16,
        kv_heads: 8,
        head_dim: 128,
        n_ff: 3072,
        vocab: 151_936,
        tied: true,
        qkv_bias: false,
        block_norms: 2,
        qk_norm: true,
        parameters: 596_049_920,
        published: "0.6",
    },
    Config {
        shape: GEMMA2_2B,
        hidden: 2304,
        layers: 26,
        heads: 8,
        kv_heads: 4,
        head_dim: 256,
        n_ff: 9216,
        vocab: 256_000,
        tied: true,
        qkv_bias: false,
        block_norms: 4,
        qk_norm: false,
        parameters: 2_614_341_888,
        published: "2.6",
    },
    Config {
        shape: PHI3_3_8B,
        hidden: 3072,
        layers: 32,
        heads: 32,
        kv_heads: 32,
        head_dim: 96,
        n_ff: 8192,
        vocab: 32_064,
        tied: false,
        qkv_bias: false,
        block_norms: 2,
        qk_norm: false,
        parameters: 3_821_079_552,
        published: "3.8",
    },
];

const W8A8: MatmulType = MatmulType::I8_I8_I32;

#[test]
fn the_shapes_are_the_published_configs() {
    for c in &CONFIGS {
        let d = &c.shape;
        let (q, kv) = (c.heads * c.head_dim, c.kv_heads * c.head_dim);
        assert_eq!(
            (d.hidden, d.layers, d.n_ff, d.vocab, d.tied_embeddings),
            (c.hidden, c.layers, c.n_ff, c.vocab, c.tied),
            "{}",
            d.name
        );
        assert_eq!((d.q_dim, d.kv_dim), (q, kv), "{}", d.name);
        // The matrices, norms (two per block, four in Gemma 2, Qwen3's per-head q and k norms,
        // and the final one) and biases add up to the published checkpoint's parameter count:
        // the shape is the model, and the embedding is counted once exactly when it is tied.
        let bias = if c.qkv_bias { q + 2 * kv } else { 0 };
        let qk_norm = if c.qk_norm { 2 * c.head_dim } else { 0 };
        let per_block = c.block_norms * c.hidden + bias + qk_norm;
        let small = (c.layers * per_block + c.hidden) as u64;
        assert_eq!(d.parameters() + small, c.parameters, "{}", d.name);
        // ... which rounds to the size the model is published under, at its precision.
        let digits = c.published.split('.').nth(1).map_or(0, str::len);
        let unit = 10f64.powi(-(digits as i32));
        let named: f64 = c.published.parse().unwrap();
        let billions = c.parameters as f64 / 1e9;
        assert!(
            (billions - named).abs() <= unit / 2.0,
            "{}: {billions:.3} B is not {named} B",
            d.name
        );
    }
}

#[test]
fn a_decoded_token_reads_every_matrix_once() {
    for c in &CONFIGS {
        let d = &c.shape;
        let (h, f, q, kv) = (d.hidden, d.n_ff, d.q_dim, d.kv_dim);
        // q, k, v, o, gate, up, down per block, and the output projection.
        let block = h * q + 2 * h * kv + q * h + 3 * h * f;
        let matrices = (d.layers * block + d.vocab * h) as u64;
        assert_eq!(d.weights(), matrices, "{}", d.name);
        let pass = RK3588.decoder_pass(d, 1, 1, 3, W8A8);
        // W8A8: one byte per weight, whatever the padding of the shards.
        assert_eq!(pass.weight_bytes, matrices as f64, "{}", d.name);
        // A tied model reads its embedding as the output projection: everything it holds
        // streams per token. An untied one holds an embedding the NPU never reads (a row
        // lookup on the host).
        let embedding = (d.vocab * h) as u64;
        if d.tied_embeddings {
            assert_eq!(d.parameters(), d.weights(), "{}", d.name);
        } else {
            assert_eq!(d.parameters(), d.weights() + embedding, "{}", d.name);
        }
        // The model streams at least the weights once per token: the weight-read term is no
        // less than the bytes at the DDR rate (shards are padded, never trimmed).
        assert!(
            pass.terms.weights_s >= pass.weight_bytes / RK3588.ddr_bw,
            "{}",
            d.name
        );
    }
}

#[test]
fn runs_per_token_follow_the_k_segments() {
    let seg = RK3588.k_segment.expect("RK3588 splits K");
    for c in &CONFIGS {
        let d = &c.shape;
        // 7 linears per block, the down projection in ceil(n_ff / segment) runs, and the head.
        let down = d.n_ff.div_ceil(seg) as u64;
        let want = d.layers as u64 * (6 + down) + 1;
        let pass = RK3588.decoder_pass(d, 1, 1, 3, W8A8);
        assert_eq!(pass.runs_per_core, want, "{}", d.name);
        // Every run pays the fixed cost once, and nothing falls off the K cliff.
        let fixed = want as f64 * RK3588.call_s;
        assert!(
            (pass.terms.call_s - fixed).abs() <= 1e-12 * fixed,
            "{}",
            d.name
        );
        assert_eq!(pass.terms.k_cliff_s, 0.0, "{}", d.name);
        // The terms add up to the pass.
        let (a, b) = (pass.terms.total(), pass.npu_s);
        assert!((a - b).abs() <= 1e-9 * b, "{}: {a} vs {b}", d.name);
    }
    // Qwen2.5-1.5B's, Llama-3-8B's and Gemma2-2B's down projections (K = 8960, 14336, 9216)
    // are the ones split.
    let split: Vec<_> = CONFIGS
        .iter()
        .filter(|c| c.n_ff > seg)
        .map(|c| c.shape.name)
        .collect();
    assert_eq!(split, ["Qwen2.5-1.5B", "Llama-3-8B", "Gemma2-2B"]);
}

#[test]
fn predictions_are_finite_and_ordered_by_size() {
    let mut shapes: Vec<DecoderShape> = CONFIGS.iter().map(|c| c.shape).collect();
    shapes.push(CAMPAIGN_9B);
    shapes.sort_by_key(|d| d.weights());
    let at = |d: &DecoderShape| RK3588.predict_llm_prompt(d, 128);
    for pair in shapes.windows(2) {
        let (small, big) = (at(&pair[0]), at(&pair[1]));
        let names = (pair[0].name, pair[1].name);
        // More weights per token: slower decode, longer time to the first token.
        assert!(big.decode_tok_s < small.decode_tok_s, "{names:?}");
        assert!(big.ttft_s() > small.ttft_s(), "{names:?}");
        assert!(big.decode_npu_s > small.decode_npu_s, "{names:?}");
    }
    for d in &shapes {
        for prompt in [1, 64, 128, 512] {
            let p = RK3588.predict_llm_prompt(d, prompt);
            let all = [
                p.decode_npu_s,
                p.decode_host_s,
                p.decode_tok_s,
                p.decode_pinned_tok_s,
                p.prefill_npu_s,
                p.prefill_host_s,
                p.prefill_tok_s,
                p.prefill_pinned_tok_s,
                p.ttft_s(),
                p.ttft_pinned_s(),
            ];
            assert!(all.iter().all(|x| x.is_finite() && *x > 0.0), "{p:?}");
            // Host time only adds; pinning only removes; TTFT is the prefill pass, no decode
            // step (the first token is the prefill's last row's).
            assert!(p.decode_tok_s < p.decode_npu_only_tok_s);
            assert!(p.prefill_tok_s < p.prefill_npu_only_tok_s);
            assert!(p.ttft_pinned_s() < p.ttft_s());
            let pass = RK3588.decoder_pass(d, prompt, 1, 3, W8A8);
            assert_eq!(p.prefill, pass);
            assert_eq!(p.ttft_s(), pass.npu_s + p.prefill_host_s);
            assert_eq!(p.prefill_tok_s, prompt as f64 / p.ttft_s());
        }
    }
}

#[test]
fn host_glue_scales_with_the_activations() {
    let h = |d: &DecoderShape, rows| cost::host::prefill_s(d, rows);
    // The campaign's own pass is its measured host time.
    assert_eq!(h(&CAMPAIGN_9B, 512), cost::host::PREFILL_512_S);
    for c in &CONFIGS {
        let d = &c.shape;
        // Twice the rows, twice the block activations (the head runs one row either way).
        let head = (d.vocab + d.hidden) as f64;
        assert_eq!(
            d.activations(256, 1) - head,
            2.0 * (d.activations(128, 1) - head)
        );
        assert!(h(d, 256) > h(d, 128) && h(d, 256) < 2.0 * h(d, 128) + 1e-12);
        // Per row, a smaller hidden size moves fewer activations than the campaign's 9B.
        assert!(h(d, 512) < cost::host::PREFILL_512_S, "{}", d.name);
    }
    // Decode host time is the campaign's share of the token.
    let p = RK3588.predict_llm_prompt(&QWEN2_0_5B, 128);
    let share = p.decode_host_s / (p.decode_host_s + p.decode_npu_s);
    assert!((share - cost::host::DECODE_SHARE).abs() < 1e-12);
}

const ENGINE: DecoderLayout = DecoderLayout::Engine(ENGINE_LAYOUT);

/// Contexts the busiest lane holds of linear `l` in the engine's layout on three lanes: the
/// engine's own plan ([`rknn_chip::plan::LinearPlan`], through the cost model's
/// [`cost::CostModel::engine_plan`]).
fn engine_contexts(model: &cost::CostModel, l: &EngineLinear, e: &EngineLayout) -> u64 {
    let plan = model.engine_plan(l, 3, W8A8, e).unwrap();
    plan.lane_contexts().into_iter().max().unwrap() as u64
}

#[test]
fn the_engine_layout_fuses_and_splits_as_the_engine_does() {
    let max_n = ENGINE_LAYOUT.max_n_per_context;
    assert_eq!(max_n, 8192);
    for c in &CONFIGS {
        let d = &c.shape;
        let (h, f, q, kv) = (d.hidden, d.n_ff, d.q_dim, d.kv_dim);
        let e = &ENGINE_LAYOUT;
        // The fused linears: qkv, o, gate-up, down.
        let shapes: Vec<(usize, usize)> = e.block_linears(d).iter().map(|l| (l.n, l.k)).collect();
        assert_eq!(shapes, [(q + 2 * kv, h), (h, q), (2 * f, h), (h, f)]);
        let block: u64 = e
            .block_linears(d)
            .iter()
            .map(|l| engine_contexts(&RK3588, l, e))
            .sum();
        let head = engine_contexts(&RK3588, &e.head(d), e);
        let want = d.layers as u64 * block + head;
        let engine = RK3588.decoder_pass_in(d, 1, 1, 3, W8A8, &ENGINE);
        let campaign = RK3588.decoder_pass(d, 1, 1, 3, W8A8);
        assert_eq!(engine.runs_per_core, want, "{}", d.name);
        // Fewer runs than the campaign's seven linears and one head run per core.
        assert!(engine.runs_per_core < campaign.runs_per_core, "{}", d.name);
        // The same matrices, only fused: the same weight bytes per token.
        assert_eq!(engine.weight_bytes, campaign.weight_bytes, "{}", d.name);
        assert_eq!(engine.weight_bytes, d.weights() as f64, "{}", d.name);
        // Every run pays the fixed cost once, none falls off the K cliff, the terms add up.
        let fixed = want as f64 * RK3588.call_s;
        assert!((engine.terms.call_s - fixed).abs() <= 1e-12 * fixed);
        assert_eq!(engine.terms.k_cliff_s, 0.0, "{}", d.name);
        let (a, b) = (engine.terms.total(), engine.npu_s);
        assert!((a - b).abs() <= 1e-9 * b, "{}: {a} vs {b}", d.name);
    }
    // Qwen2-0.5B: every linear of a block fits one context per lane (the fused gate-up's
    // 9728 columns are 3264 per lane), and the head is ceil(50 656 / 8192) contexts.
    let d = &QWEN2_0_5B;
    let head = (d.vocab.div_ceil(32).div_ceil(3) * 32).div_ceil(max_n) as u64;
    let engine = RK3588.decoder_pass_in(d, 1, 1, 3, W8A8, &ENGINE);
    assert_eq!(engine.runs_per_core, d.layers as u64 * 4 + head);
}

/// The cost model prices the plan the engine makes: narrower contexts or shorter K segments
/// mean more runs per token, each paying the fixed cost, and the prediction moves by them.
#[test]
fn the_prediction_follows_the_split_limits() {
    // Qwen2-0.5B's head: 151 936 columns, 4748 blocks of 32, 1583 on the busiest lane
    // (50 656 columns): ceil(50 656 / 8192) = 7 contexts at the default, 13 at 4096, 4 at
    // 16 384. Its blocks are one context each (at most 3264 columns per lane), so only the
    // head moves.
    let d = &QWEN2_0_5B;
    let at = |max_n: usize| {
        let e = EngineLayout {
            max_n_per_context: max_n,
            ..ENGINE_LAYOUT
        };
        (
            RK3588.decoder_pass_in(d, 1, 1, 3, W8A8, &DecoderLayout::Engine(e)),
            RK3588.predict_llm_prompt_in(d, 128, &DecoderLayout::Engine(e)),
        )
    };
    let blocks = d.layers as u64 * 4;
    let (wide, wide_p) = at(8192);
    let (narrow, narrow_p) = at(4096);
    let (wider, wider_p) = at(16_384);
    assert_eq!(wide.runs_per_core, blocks + 7);
    assert_eq!(narrow.runs_per_core, blocks + 13);
    assert_eq!(wider.runs_per_core, blocks + 4);
    // Each extra run is one more fixed cost on the busiest lane; the bytes stay the same.
    let extra = (narrow.terms.call_s - wide.terms.call_s) / RK3588.call_s;
    assert!((extra - 6.0).abs() < 1e-9, "{extra}");
    assert_eq!(narrow.weight_bytes, wide.weight_bytes);
    assert!(narrow.npu_s > wide.npu_s && wide.npu_s > wider.npu_s);
    assert!(narrow_p.decode_tok_s < wide_p.decode_tok_s);
    assert!(wider_p.decode_tok_s > wide_p.decode_tok_s);
    assert!(narrow_p.ttft_s() > wide_p.ttft_s());

    // Llama-3-8B's down projection: K = 14 336 in ceil(14 336 / 8192) = 2 segments on RK3588,
    // 4 with a 4096-row segment (RK3576's), 1 without one; the other linears (K = 4096) keep
    // one. Per block: qkv 6144 and o 4096 columns (2048 and 1376 per lane: one context), gate-up
    // 28 672 (9568 on the busiest lane: two contexts), down 4096 (one context per segment).
    let d = &LLAMA3_8B;
    let e = ENGINE_LAYOUT;
    let with_segment = |seg: Option<usize>| {
        let model = CostModel {
            k_segment: seg,
            ..RK3588
        };
        (
            model.decoder_pass_in(d, 1, 0, 3, W8A8, &ENGINE),
            model.predict_llm_prompt_in(d, 64, &ENGINE),
        )
    };
    let runs = |down: u64| d.layers as u64 * (1 + 1 + 2 + down);
    let (two, two_p) = with_segment(Some(8192));
    let (four, four_p) = with_segment(Some(4096));
    let (one, _) = with_segment(None);
    assert_eq!(two.runs_per_core, runs(2));
    assert_eq!(four.runs_per_core, runs(4));
    assert_eq!(one.runs_per_core, runs(1));
    assert_eq!(
        engine_contexts(
            &CostModel {
                k_segment: Some(4096),
                ..RK3588
            },
            &e.block_linears(d)[3],
            &e
        ),
        4
    );
    // Decode, bound by reading the weights, pays the extra runs' fixed cost.
    assert!(four.npu_s > two.npu_s && two.npu_s > one.npu_s);
    let extra = (four.terms.call_s - two.terms.call_s) / RK3588.call_s;
    assert!((extra - 2.0 * d.layers as f64).abs() < 1e-9, "{extra}");
    assert!(four_p.decode_tok_s < two_p.decode_tok_s);
    // Prefill gains: a segment of half the rows lets the A block hold twice the rows of A,
    // so B streams past them half as many times (at M = 256, the down projection's residual
    // rows of a 128-token forward: 8 passes instead of 16).
    let passes = |ks: usize| 256usize.div_ceil((RK3588.a_block_bytes as usize / ks).max(1));
    assert_eq!((passes(4096), passes(8192)), (8, 16));
    assert!(four_p.prefill_npu_s < two_p.prefill_npu_s);
    // A model without a segment (and so without the cliff) runs K whole.
    assert_eq!(one.terms.k_cliff_s, 0.0);
}

#[test]
fn residual_activations_double_the_rows_of_down_and_the_head() {
    let e = &ENGINE_LAYOUT;
    for c in &CONFIGS {
        let d = &c.shape;
        let roles: Vec<_> = e.block_linears(d).iter().map(|l| l.role).collect();
        assert_eq!(
            roles,
            [
                LinearRole::Qkv,
                LinearRole::AttnOutput,
                LinearRole::GateUp,
                LinearRole::Down
            ]
        );
        let residual: Vec<_> = e.block_linears(d).iter().map(|l| l.residual).collect();
        assert_eq!(residual, [false, false, false, true], "{}", d.name);
        assert!(e.head(d).residual);
        // A residual linear over `rows` input rows costs what the same linear without them
        // costs over twice the rows: M doubles, nothing else changes.
        for l in [e.block_linears(d)[3], e.head(d)] {
            let plain = EngineLinear {
                residual: false,
                ..l
            };
            for rows in [1, 64, 128] {
                let twice = RK3588.engine_linear(&l, rows, 3, W8A8, e);
                assert_eq!(
                    twice,
                    RK3588.engine_linear(&plain, 2 * rows, 3, W8A8, e),
                    "{}",
                    d.name
                );
                assert_ne!(twice, RK3588.engine_linear(&plain, rows, 3, W8A8, e));
            }
        }
        // The pass is its linears: down and the head at two rows per token.
        let sum = |rows: usize, layout: &EngineLayout| {
            let lin = |l: &EngineLinear, r| RK3588.engine_linear(l, r, 3, W8A8, layout).npu_s;
            let block: f64 = layout.block_linears(d).iter().map(|l| lin(l, rows)).sum();
            d.layers as f64 * block + lin(&layout.head(d), 1)
        };
        for rows in [1, 128] {
            let pass = RK3588.decoder_pass_in(d, rows, 1, 3, W8A8, &ENGINE);
            let want = sum(rows, e);
            assert!((pass.npu_s - want).abs() <= 1e-12 * want, "{}", d.name);
        }
        // Without residual activations no linear runs more rows than it has inputs, and
        // the pass is no dearer.
        let none = EngineLayout {
            residual: Residual::None,
            ..*e
        };
        let plain = RK3588.decoder_pass_in(d, 128, 1, 3, W8A8, &DecoderLayout::Engine(none));
        let with = RK3588.decoder_pass_in(d, 128, 1, 3, W8A8, &ENGINE);
        assert!(plain.npu_s < with.npu_s, "{}", d.name);
        assert_eq!(plain.runs_per_core, with.runs_per_core, "{}", d.name);
        // The host glue counts the second row too: fused inputs once, residual ones twice.
        let (h, f, q, kv) = (d.hidden, d.n_ff, d.q_dim, d.kv_dim);
        let block = (h + q + 2 * kv) + (q + h) + (h + 2 * f) + 2 * (f + h);
        let want = (128 * d.layers * block + 2 * (h + d.vocab)) as f64;
        assert_eq!(e.activations(d, 128, 1), want, "{}", d.name);
    }
}

#[test]
fn the_campaign_layout_is_the_calibrated_path() {
    for c in &CONFIGS {
        let d = &c.shape;
        for prompt in [1, 64, 128, 512] {
            let p = RK3588.predict_llm_prompt_in(d, prompt, &DecoderLayout::Campaign);
            assert_eq!(p, RK3588.predict_llm_prompt(d, prompt), "{}", d.name);
            assert_eq!(
                RK3588.decoder_pass_in(d, prompt, 1, 3, W8A8, &DecoderLayout::Campaign),
                RK3588.decoder_pass(d, prompt, 1, 3, W8A8)
            );
            // The engine's prompt runs in forwards of 128 tokens, the head over the last
            // row of the last one.
            let e = RK3588.predict_llm_prompt_in(d, prompt, &ENGINE);
            let forwards = prompt.div_ceil(ENGINE_LAYOUT.prefill_batch);
            let per_forward = RK3588
                .decoder_pass_in(d, 1, 0, 3, W8A8, &ENGINE)
                .runs_per_core;
            let head = RK3588
                .decoder_pass_in(d, 1, 1, 3, W8A8, &ENGINE)
                .runs_per_core
                - per_forward;
            assert_eq!(
                e.prefill.runs_per_core,
                forwards as u64 * per_forward + head,
                "{}",
                d.name
            );
            assert_eq!(
                e.prefill_host_s,
                cost::host::prefill_engine_s(d, prompt, &ENGINE_LAYOUT)
            );
            assert!(e.ttft_s().is_finite() && e.decode_tok_s.is_finite());
        }
    }
}
