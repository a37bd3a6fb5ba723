//! The RK3588 cost model's predictions beside RKLLM's published W8A8 figures, as one Markdown
//! table (docs/npu-matmul-performance.md, "The RKLLM table").
//!
//! ```sh
//! cargo run -p rknn-emu --example rkllm_table --release
//! ```
//!
//! Every "ours" figure but memory is a MODEL (`rknn_emu::cost`, calibrated to the field
//! campaign's 9B), not a measurement; memory is the peak RSS measured on the emulator
//! ([`MEASURED_RSS`]), beside RKLLM's published memory. The model assumes three NPU cores,
//! W8A8, the NPU at 1 GHz, decode at M = 1, TTFT the prefill pass of the prompt (the first
//! token comes out of its last row's logits), unpinned and with the campaign's A76-pinned
//! speed-up. The first columns cost the campaign's layout (the calibrated one, its host
//! terms the campaign's, end to end); the "engine layout" columns cost the same shapes laid
//! out as this project's engine lays them out (`DecoderLayout::Engine`: fused qkv and
//! gate-up, contexts of at most 8192 columns, residual activations on the down projections
//! and the head), with the same per-run cost, the engine's own host glue and the model's
//! host ops between the linears (`host::prefill_ops_s`, `host::decode_ops_s`), both measured
//! here and carried to the A76. A second table splits the engine layout's TTFT into NPU, host
//! glue and host ops, with and without the down projections' residual rows, and its decoded
//! token the same way. A third sets the mixture of experts OLMoE-1B-7B beside its
//! dense twin (the same attention and head, one feed-forward as wide as its 8 active experts:
//! the weights a decoded token reads are the same), at RKLLM's prompt of 128 tokens: decode,
//! TTFT, runs per core, the largest terms, and what the engine holds (contexts, each one
//! dma-buf handle for its B, and NPU weight memory). The last two price speculative decoding
//! with a draft model (`CostModel::spec_decode`, engine layout): Llama-3-8B drafted by
//! Llama-3.2-1B and Qwen2.5-1.5B by Qwen2.5-0.5B, what both hold, the break-even per-token
//! acceptance, and decode at the acceptances measured here (converted from accepted / drafted
//! to per-token) and at higher, assumed ones, each at its best draft length.
//!
//! The RK3576 section sets the `RK3576` model (not calibrated: RK3576's public figures and
//! RK3588's calibration, every number marked rated, public or assumed in `rknn_emu::cost`)
//! beside RKLLM's RK3576 table, in the engine's layout with RK3576's defaults (contexts of at
//! most 4096 columns, K segments of 4096 rows): our w4a16 (`RKNN_FLOAT16_MM_INT4_TO_FLOAT32`,
//! f16 activations, no residual rows) and w8a8 decode and TTFT beside RKLLM's, and the NPU
//! bytes of the weights the engine would hold beside RKLLM's memory (nothing is measured on
//! RK3576 here); then what a w4a16 token and TTFT are made of, the realised DDR bandwidth
//! at which each row reaches RKLLM's w4a16 decode, and how far each assumption moves them.

use rknn_emu::cost::{
    CostModel, DecoderLayout, DecoderShape, ENGINE_LAYOUT, EngineLayout, ExpertLayout, GEMMA2_2B,
    LLAMA3_2_1B, LLAMA3_8B, LlmPrediction, NpuTerms, OLMOE_1B_7B, OLMOE_1B_7B_DENSE, PHI3_3_8B,
    QWEN2_0_5B, QWEN2_5_0_5B, QWEN2_5_1_5B, QWEN3_0_6B, RK3576, RK3576_DDR_PEAK, RK3588, Residual,
    TINYLLAMA_1_1B, host, spec_acceptance_rate, spec_alpha_from_acceptance,
};
use rknn_emu::rknn_chip::{MatmulType, Platform};

/// A row: the shape, RKLLM's prompt length, and RKLLM's published decode tok/s, TTFT (ms) and
/// memory (bytes; `None` where it publishes none).
struct Published {
    shape: DecoderShape,
    prompt: usize,
    decode_tok_s: f64,
    ttft_ms: f64,
    memory: Option<f64>,
}

/// RKLLM's "memory(MB)" column in bytes (it does not say whether its MB are 10⁶ or 2²⁰ bytes,
/// 4.9 % apart; read as 10⁶, the way the table prints them back).
const fn mb(m: f64) -> Option<f64> {
    Some(m * 1e6)
}

/// RKLLM's RK3588 W8A8 figures: airockchip/rknn-llm `benchmark.md` (release 1.3.0, seqlen 128,
/// 64 new tokens, with its memory column; the file at commit 878f9361) for every row but
/// Llama-3-8B, which that table does not list: its figures are the README's (releases
/// 1.1–1.2.1, seqlen 64, 256 new tokens; no memory). CPU and NPU at their maximum frequencies.
const ROWS: [Published; 7] = [
    Published {
        shape: QWEN2_0_5B,
        prompt: 128,
        decode_tok_s: 41.58,
        ttft_ms: 145.90,
        memory: mb(669.56),
    },
    Published {
        shape: QWEN3_0_6B,
        prompt: 128,
        decode_tok_s: 32.91,
        ttft_ms: 199.09,
        memory: mb(791.11),
    },
    Published {
        shape: TINYLLAMA_1_1B,
        prompt: 128,
        decode_tok_s: 24.43,
        ttft_ms: 243.93,
        memory: mb(1093.66),
    },
    Published {
        shape: QWEN2_5_1_5B,
        prompt: 128,
        decode_tok_s: 16.69,
        ttft_ms: 378.31,
        memory: mb(1689.21),
    },
    Published {
        shape: GEMMA2_2B,
        prompt: 128,
        decode_tok_s: 10.37,
        ttft_ms: 598.41,
        memory: mb(2779.22),
    },
    Published {
        shape: PHI3_3_8B,
        prompt: 128,
        decode_tok_s: 7.45,
        ttft_ms: 1017.28,
        memory: mb(3758.34),
    },
    Published {
        shape: LLAMA3_8B,
        prompt: 64,
        decode_tok_s: 3.79,
        ttft_ms: 1128.0,
        memory: None,
    },
];

/// Peak RSS measured here, in MiB (GNU time's KiB / 1024, as `scripts/bench/real_size.py`
/// prints it), with the context (`-c`) it ran at: `llm-decode` on the emulator backend over
/// random-weight Q8_0 GGUFs of each shape (`scripts/bench/gen_random_gguf.py`), the weights
/// converted at load (`--no-weight-cache`), 2 threads, 16 greedy tokens after the prompt "The
/// capital of France is" (5 or 6 tokens), under GNU time (`Maximum resident set size`):
///
/// ```sh
/// python3 scripts/bench/real_size.py qwen2-0.5b qwen3-0.6b qwen2.5-1.5b --modes convert --ctx 4096
/// python3 scripts/bench/real_size.py gemma2-2b phi3-3.8b --modes convert --ctx 4096
/// python3 scripts/bench/real_size.py tinyllama-1.1b --modes convert --ctx 2048
/// ```
///
/// on an AMD EPYC with 2 vCPUs and 24 GiB. The context is `llm-decode`'s default: 4096
/// positions, TinyLlama's trained 2048 where that is shorter. The peak comes at the end of
/// loading (the output projection is converted first, so no linear's converted copy sits on
/// top of all the others). The RSS holds the emulator's NPU memories (the int8 weights,
/// padded, and the A and C buffers; anonymous memory here, dma-bufs of the NPU driver on a
/// board), the host side (the tokenizer, the norms and biases, the engine's state, the
/// program's code) and the KV cache (f32) of the positions written: the cache grows with
/// them, so the context sets the most it can hold, not what is resident. The GGUF's pages are
/// given back once converted and after each pass reads its embedding rows. Llama-3-8B, for
/// which RKLLM publishes no memory, was not run: its cell prints "—".
const MEASURED_RSS: [(&str, f64, usize); 6] = [
    ("Qwen2-0.5B", 545.0, 4096),
    ("Qwen3-0.6B", 642.0, 4096),
    ("TinyLlama-1.1B", 1062.0, 2048),
    ("Qwen2.5-1.5B", 1585.0, 4096),
    ("Gemma2-2B", 2640.0, 4096),
    ("Phi3-3.8B", 3713.0, 4096),
];

/// The two largest terms of an NPU pass plus its host glue, with their shares of the total.
fn dominant(terms: &NpuTerms, host_s: f64) -> String {
    let mut all = terms.named().to_vec();
    all.push(("host glue", host_s));
    let total: f64 = all.iter().map(|(_, s)| s).sum();
    all.sort_by(|a, b| b.1.total_cmp(&a.1));
    all[..2]
        .iter()
        .map(|(name, s)| format!("{name} {:.0} %", 100.0 * s / total))
        .collect::<Vec<_>>()
        .join(", ")
}

fn main() {
    println!(
        "| model | prompt | decode tok/s: ours (A76-pinned) | RKLLM | TTFT ms: ours (A76-pinned) \
         | RKLLM | memory: ours, MiB (peak RSS, emulator; -c) | RKLLM, MB \
         | decode: largest terms | TTFT: largest terms | runs per core per token \
         | engine layout: decode tok/s (A76-pinned) | engine layout: TTFT ms (A76-pinned) \
         | engine layout: runs per core per token |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---|---|---:|---:|---:|---:|");
    let engine = DecoderLayout::Engine(ENGINE_LAYOUT);
    for r in &ROWS {
        let p: LlmPrediction = RK3588.predict_llm_prompt(&r.shape, r.prompt);
        let e: LlmPrediction = RK3588.predict_llm_prompt_in(&r.shape, r.prompt, &engine);
        let ours = MEASURED_RSS
            .iter()
            .find(|(name, ..)| *name == r.shape.name)
            .map_or("—".to_string(), |(_, mb, ctx)| format!("{mb:.0} ({ctx})"));
        let theirs = r
            .memory
            .map_or("—".to_string(), |b| format!("{:.0}", b / 1e6));
        println!(
            "| {} | {} | {:.2} ({:.2}) | {:.2} | {:.0} ({:.0}) | {:.0} | {ours} | {theirs} \
             | {} | {} | {} | {:.2} ({:.2}) | {:.0} ({:.0}) | {} |",
            r.shape.name,
            r.prompt,
            p.decode_tok_s,
            p.decode_pinned_tok_s,
            r.decode_tok_s,
            1e3 * p.ttft_s(),
            1e3 * p.ttft_pinned_s(),
            r.ttft_ms,
            dominant(&p.decode.terms, p.decode_host_s),
            dominant(&p.prefill.terms, p.prefill_host_s),
            p.decode.runs_per_core,
            e.decode_tok_s,
            e.decode_pinned_tok_s,
            1e3 * e.ttft_s(),
            1e3 * e.ttft_pinned_s(),
            e.decode.runs_per_core,
        );
    }
    // What the engine layout's TTFT is made of, and what the residual activations of the
    // down projections add to it (the head's residual row is one row of A per prompt).
    let head_only = DecoderLayout::Engine(EngineLayout {
        residual: Residual::Output,
        ..ENGINE_LAYOUT
    });
    println!();
    println!(
        "| model | RKLLM TTFT ms | engine layout, the campaign's glue (3.6 ns/element): TTFT ms \
         | host glue ms | engine layout, its own glue ({:.2} ns/element) and host ops: TTFT ms \
         | NPU ms | host glue ms | host ops ms | residual on the head only: TTFT ms | NPU ms \
         | host glue ms | decode: NPU / host glue / host ops ms per token |",
        host::ENGINE_GLUE_NS
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|");
    for r in &ROWS {
        let e = RK3588.predict_llm_prompt_in(&r.shape, r.prompt, &engine);
        let h = RK3588.predict_llm_prompt_in(&r.shape, r.prompt, &head_only);
        let campaign_glue = host::prefill_engine_campaign_s(&r.shape, r.prompt, &ENGINE_LAYOUT)
            + host::router_s(&r.shape, r.prompt);
        println!(
            "| {} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} \
             | {:.1} / {:.1} / {:.1} |",
            r.shape.name,
            r.ttft_ms,
            1e3 * (e.prefill_npu_s + campaign_glue),
            1e3 * campaign_glue,
            1e3 * e.ttft_s(),
            1e3 * e.prefill_npu_s,
            1e3 * e.prefill_host_s,
            1e3 * e.prefill_ops_s,
            1e3 * h.ttft_s(),
            1e3 * h.prefill_npu_s,
            1e3 * h.prefill_host_s,
            1e3 * e.decode_npu_s,
            1e3 * e.decode_host_s,
            1e3 * e.decode_ops_s,
        );
    }
    moe_section();
    spec_section();
    rk3576_section();
}

/// What the engine holds for `d` on three lanes: (contexts, one dma-buf handle each for its
/// B; NPU bytes of the padded weights).
fn held(d: &DecoderShape) -> (usize, f64) {
    RK3588.engine_held(d, 3, MatmulType::I8_I8_I32, &ENGINE_LAYOUT)
}

/// OLMoE-1B-7B beside its dense twin at RKLLM's prompt length.
fn moe_section() {
    const PROMPT: usize = 128;
    println!();
    println!(
        "| model ({PROMPT}-token prompt) | weights G: held / read per token | decode tok/s (A76-pinned) \
         | TTFT ms (A76-pinned) | engine layout: decode tok/s | engine layout: TTFT ms \
         | engine layout: runs per core per token / per prompt | engine layout: decode terms \
         | engine layout: TTFT terms | router ms: token / prompt | engine: contexts held (3 lanes) \
         | engine: NPU weights GB |"
    );
    println!("|---|---|---:|---:|---:|---:|---|---|---|---|---:|---:|");
    let split = EngineLayout {
        experts: ExpertLayout::Split,
        ..ENGINE_LAYOUT
    };
    for (d, layout, label) in [
        (&OLMOE_1B_7B, ENGINE_LAYOUT, ", experts whole per core"),
        (&OLMOE_1B_7B, split, ", experts split over the cores"),
        (&OLMOE_1B_7B_DENSE, ENGINE_LAYOUT, ""),
    ] {
        let p = RK3588.predict_llm_prompt(d, PROMPT);
        let e = RK3588.predict_llm_prompt_in(d, PROMPT, &DecoderLayout::Engine(layout));
        let (contexts, bytes) = RK3588.engine_held(d, 3, MatmulType::I8_I8_I32, &layout);
        println!(
            "| {}{label} | {:.2} / {:.2} | {:.2} ({:.2}) | {:.0} ({:.0}) | {:.2} | {:.0} | {} / {} | {} | {} \
             | {:.1} / {:.0} | {} | {:.2} |",
            d.name,
            d.parameters() as f64 / 1e9,
            d.weights() as f64 / 1e9,
            p.decode_tok_s,
            p.decode_pinned_tok_s,
            1e3 * p.ttft_s(),
            1e3 * p.ttft_pinned_s(),
            e.decode_tok_s,
            1e3 * e.ttft_s(),
            e.decode.runs_per_core,
            e.prefill.runs_per_core,
            dominant(&e.decode.terms, e.decode_host_s),
            dominant(&e.prefill.terms, e.prefill_host_s),
            1e3 * host::router_s(d, 1),
            1e3 * host::router_s(d, PROMPT),
            contexts,
            bytes / 1e9,
        );
    }
}

/// The longest draft priced: llama.cpp's default `--draft-max`.
const MAX_DRAFT: usize = 16;

/// Acceptance measured here (docs/llm.md, "Draft-model speculative decoding": the demo model
/// drafted by its first 27 of 30 blocks, greedy, eight prompts): accepted / drafted at a
/// draft length, the ends of the two ranges.
const MEASURED: [(f64, usize); 4] = [(0.17, 4), (0.28, 3), (0.31, 4), (0.41, 3)];

/// Per-token acceptances assumed for a 1B-class draft of an 8B model (published pairs report
/// 0.6 to 0.8); not measured here.
const ASSUMED: [f64; 3] = [0.6, 0.7, 0.8];

/// Speculative decoding of the two pairs: what they hold and cost per pass, then decode at
/// each acceptance with the best draft length.
fn spec_section() {
    let engine = DecoderLayout::Engine(ENGINE_LAYOUT);
    let pairs = [(&LLAMA3_8B, &LLAMA3_2_1B), (&QWEN2_5_1_5B, &QWEN2_5_0_5B)];
    println!();
    println!(
        "| model + draft (engine layout) | vocabulary | NPU weights GB: model + draft = held \
         | contexts held (3 lanes): model + draft | plain decode tok/s | pass ms: model, 1 row \
         / 5 rows / draft, 1 row | draft / model pass | break-even α (draft length) |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|");
    for (target, draft) in pairs {
        let s = RK3588.spec_decode(target, draft, MAX_DRAFT, &engine);
        let (tc, tb) = held(target);
        let (dc, db) = held(draft);
        let even = s
            .break_even_alpha_best()
            .map_or("never".to_string(), |(k, a)| format!("{a:.3} ({k})"));
        println!(
            "| {} + {} | {} | {:.2} + {:.2} = {:.2} | {} + {} = {} | {:.2} | {:.1} / {:.1} / {:.1} \
             | {:.3} | {} |",
            target.name,
            draft.name,
            target.vocab,
            tb / 1e9,
            db / 1e9,
            (tb + db) / 1e9,
            tc,
            dc,
            tc + dc,
            s.plain_tok_s(),
            1e3 * s.plain_s,
            1e3 * s.verify_s[4],
            1e3 * s.draft_s,
            s.draft_s / s.plain_s,
            even,
        );
    }
    println!();
    println!(
        "| model + draft | per-token α | where α comes from | best draft length | decode tok/s \
         | × plain | accepted / drafted at that length | at the measured length: tok/s (× plain) |"
    );
    println!("|---|---:|---|---:|---:|---:|---:|---:|");
    for (target, draft) in pairs {
        let s = RK3588.spec_decode(target, draft, MAX_DRAFT, &engine);
        let measured = MEASURED.iter().map(|&(rate, k)| {
            let alpha = spec_alpha_from_acceptance(rate, k).expect("a rate in 0..=1");
            let from = format!(
                "measured: {:.0} % of drafts accepted at length {k} (layer-skipped demo model)",
                100.0 * rate
            );
            let at = s.tok_s(alpha, k);
            let at = format!("{at:.2} ({:.2})", at / s.plain_tok_s());
            (alpha, from, at)
        });
        let assumed = ASSUMED.iter().map(|&a| {
            let from = "assumed (what published 1B drafts of 8B models report)";
            (a, from.to_string(), "-".to_string())
        });
        for (alpha, from, at) in measured.chain(assumed) {
            let (k, tok_s) = s.best_k(alpha);
            println!(
                "| {} + {} | {:.2} | {} | {} | {:.2} | {:.2} | {:.0} % | {} |",
                target.name,
                draft.name,
                alpha,
                from,
                k,
                tok_s,
                tok_s / s.plain_tok_s(),
                100.0 * spec_acceptance_rate(alpha, k),
                at,
            );
        }
    }
}

/// RKLLM's figures for one format on RK3576: decode tok/s, TTFT ms (`None` where it publishes
/// none) and memory MB (`None` likewise).
struct Rkllm {
    decode_tok_s: f64,
    ttft_ms: Option<f64>,
    memory_mb: Option<f64>,
}

/// A row of RKLLM's RK3576 table: the shape, its prompt, RKLLM's w4a16 and w8a8 (`None`:
/// not published), and where the figures come from.
struct Rk3576Row {
    shape: DecoderShape,
    prompt: usize,
    w4a16: Rkllm,
    w8a8: Option<Rkllm>,
    source: &'static str,
}

const fn rkllm(decode_tok_s: f64, ttft_ms: f64, memory_mb: f64) -> Rkllm {
    Rkllm {
        decode_tok_s,
        ttft_ms: Some(ttft_ms),
        memory_mb: Some(memory_mb),
    }
}

/// RKLLM's RK3576 rows whose architecture the LLM crate runs: airockchip/rknn-llm
/// `benchmark.md` (release 1.3.0, the file at commit 878f9361; seqlen 128, 64 new tokens, CPU
/// and NPU at their maximum frequencies), w4a16 (per channel) and w8a8; Llama-3-8B is not in
/// that table: its w4a16 decode and memory are an older RKLLM README's (3.60 tok/s in 5.63 GB,
/// as issue 43 quotes them; no TTFT, no w8a8), priced here at the prompt of 64 tokens that
/// README's RK3588 rows used.
const RK3576_ROWS: [Rk3576Row; 6] = [
    Rk3576Row {
        shape: QWEN2_0_5B,
        prompt: 128,
        w4a16: rkllm(32.56, 342.37, 443.44),
        w8a8: Some(rkllm(21.73, 344.27, 678.43)),
        source: "1.3.0",
    },
    Rk3576Row {
        shape: QWEN3_0_6B,
        prompt: 128,
        w4a16: rkllm(24.85, 468.61, 512.71),
        w8a8: Some(rkllm(17.17, 461.54, 796.26)),
        source: "1.3.0",
    },
    Rk3576Row {
        shape: TINYLLAMA_1_1B,
        prompt: 128,
        w4a16: rkllm(19.71, 543.68, 601.09),
        w8a8: Some(rkllm(12.18, 534.13, 1092.87)),
        source: "1.3.0",
    },
    Rk3576Row {
        shape: GEMMA2_2B,
        prompt: 128,
        w4a16: rkllm(9.14, 997.92, 1542.14),
        w8a8: Some(rkllm(5.24, 956.77, 2784.78)),
        source: "1.3.0",
    },
    Rk3576Row {
        shape: PHI3_3_8B,
        prompt: 128,
        w4a16: rkllm(6.58, 1829.12, 1995.78),
        w8a8: Some(rkllm(3.74, 1615.97, 3767.28)),
        source: "1.3.0",
    },
    Rk3576Row {
        shape: LLAMA3_8B,
        prompt: 64,
        w4a16: Rkllm {
            decode_tok_s: 3.60,
            ttft_ms: None,
            memory_mb: Some(5630.0),
        },
        w8a8: None,
        source: "older README",
    },
];

/// W4A16: f16 activations × int4 weights → f32.
const W4A16: MatmulType = MatmulType::F16_I4_F32;
/// W8A8: int8 × int8 → int32.
const W8A8: MatmulType = MatmulType::I8_I8_I32;

/// NPU bytes of the weights the engine holds for `d` on RK3576's two lanes in format `t`:
/// padded elements × the bits of `t.b`.
fn held_bytes(d: &DecoderShape, t: MatmulType) -> f64 {
    let layout = EngineLayout::for_platform(Platform::Rk3576);
    let (_, elems) = RK3576.engine_held(d, RK3576.cores, t, &layout);
    elems * t.b.bits() as f64 / 8.0
}

/// "x.xx" or "—".
fn opt(x: Option<f64>, digits: usize) -> String {
    x.map_or("—".to_string(), |v| format!("{v:.digits$}"))
}

/// The RK3576 model's predictions beside RKLLM's RK3576 table, the terms of a decoded
/// token, and how far each assumption moves decode and TTFT.
fn rk3576_section() {
    let engine = DecoderLayout::Engine(EngineLayout::for_platform(Platform::Rk3576));
    let predict = |m: &CostModel, r: &Rk3576Row, t: MatmulType| {
        m.predict_llm_prompt_as(&r.shape, r.prompt, &engine, t)
    };
    println!();
    println!(
        "| RK3576 model | prompt | RKLLM figures | decode tok/s w4a16: ours | RKLLM \
         | decode tok/s w8a8: ours | RKLLM | TTFT ms w4a16: ours | RKLLM | TTFT ms w8a8: ours \
         | RKLLM | NPU weights MB (modelled) w4a16 / w8a8 | RKLLM memory MB w4a16 / w8a8 \
         | w4a16 decode: ours / RKLLM |"
    );
    println!("|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for r in &RK3576_ROWS {
        let (w4, w8) = (predict(&RK3576, r, W4A16), predict(&RK3576, r, W8A8));
        let theirs8 = r.w8a8.as_ref();
        println!(
            "| {} | {} | {} | {:.2} | {:.2} | {:.2} | {} | {:.0} | {} | {:.0} | {} | {:.0} / {:.0} \
             | {} / {} | {:.2} |",
            r.shape.name,
            r.prompt,
            r.source,
            w4.decode_tok_s,
            r.w4a16.decode_tok_s,
            w8.decode_tok_s,
            opt(theirs8.map(|x| x.decode_tok_s), 2),
            1e3 * w4.ttft_s(),
            opt(r.w4a16.ttft_ms, 0),
            1e3 * w8.ttft_s(),
            opt(theirs8.and_then(|x| x.ttft_ms), 0),
            held_bytes(&r.shape, W4A16) / 1e6,
            held_bytes(&r.shape, W8A8) / 1e6,
            opt(r.w4a16.memory_mb, 0),
            opt(theirs8.and_then(|x| x.memory_mb), 0),
            w4.decode_tok_s / r.w4a16.decode_tok_s,
        );
    }
    // What a decoded token and the TTFT are made of, w4a16.
    println!();
    println!(
        "| RK3576 model, w4a16 | decode ms: NPU weight reads / per-run fixed cost / activations \
         / compute | decode ms: host share / host ops | runs per core per token \
         | TTFT ms: NPU / host glue / host ops | TTFT: largest terms \
         | realised DDR at which ours reaches RKLLM's w4a16 decode, GB/s (share of the peak) |"
    );
    println!("|---|---|---|---:|---|---|---:|");
    for r in &RK3576_ROWS {
        let p = predict(&RK3576, r, W4A16);
        let t = &p.decode.terms;
        println!(
            "| {} | {:.1} / {:.1} / {:.1} / {:.1} | {:.1} / {:.1} | {} | {:.0} / {:.0} / {:.0} | {} \
             | {} |",
            r.shape.name,
            1e3 * t.weights_s,
            1e3 * t.call_s,
            1e3 * t.activations_s,
            1e3 * t.compute_s,
            1e3 * p.decode_host_s,
            1e3 * p.decode_ops_s,
            p.decode.runs_per_core,
            1e3 * p.prefill_npu_s,
            1e3 * p.prefill_host_s,
            1e3 * p.prefill_ops_s,
            dominant(&p.prefill.terms, p.prefill_host_s + p.prefill_ops_s),
            ddr_to_reach(r, &engine).map_or("above the peak".to_string(), |b| format!(
                "{:.1} ({:.0} %)",
                b / 1e9,
                100.0 * b / RK3576_DDR_PEAK
            )),
        );
    }
    // How far each assumption moves the w4a16 figures.
    let lpddr4x = CostModel {
        ddr_bw: 17.064e9 * (30.3e9 / 51.2e9),
        ..RK3576
    };
    let ddr = |f: f64| CostModel {
        ddr_bw: RK3576.ddr_bw * f,
        ..RK3576
    };
    let call = |s: f64| CostModel {
        call_s: s,
        ..RK3576
    };
    let f16 = |f: f64| CostModel {
        peak_f16: RK3576.peak_f16 * f,
        ..RK3576
    };
    let a72 = |per_clock: f64| host::Board {
        thread_slowdown: host::A76_THREAD_SLOWDOWN * per_clock * host::A76_GHZ / host::A72_GHZ,
        ..host::RK3576_A72
    };
    let variants: [(&str, CostModel, host::Board); 10] = [
        ("as assumed", RK3576, host::RK3576_A72),
        ("DDR −20 %", ddr(0.8), host::RK3576_A72),
        ("DDR +20 %", ddr(1.2), host::RK3576_A72),
        ("LPDDR4X-4266 (17.1 GB/s peak)", lpddr4x, host::RK3576_A72),
        ("per-run cost 25 µs", call(25e-6), host::RK3576_A72),
        ("per-run cost 100 µs", call(100e-6), host::RK3576_A72),
        ("f16 rate = int8 rate", f16(2.0), host::RK3576_A72),
        ("f16 rate = a quarter of int8", f16(0.5), host::RK3576_A72),
        ("A76/A72 per clock 1.2", RK3576, a72(1.2)),
        ("A76/A72 per clock 1.8", RK3576, a72(1.8)),
    ];
    // Not a chip figure but the engine's setting: contexts of 8192 columns, if RK3576's
    // runtime accepts N = 8192 (`rknn-conformance`'s rules.n_limit settles it): fewer runs.
    let wide = DecoderLayout::Engine(EngineLayout {
        max_n_per_context: 8192,
        ..EngineLayout::for_platform(Platform::Rk3576)
    });
    println!();
    print!("| RK3576 w4a16, assumption |");
    for r in &RK3576_ROWS {
        print!(" {}: decode tok/s, TTFT ms |", r.shape.name);
    }
    println!();
    println!("|---|{}", "---:|".repeat(RK3576_ROWS.len()));
    let rows = variants
        .iter()
        .map(|(what, m, board)| (*what, m, board, &engine))
        .chain([(
            "contexts of 8192 columns (if RK3576 runs N = 8192)",
            &RK3576,
            &host::RK3576_A72,
            &wide,
        )]);
    for (what, m, board, layout) in rows {
        print!("| {what} |");
        for r in &RK3576_ROWS {
            let p = m.predict_llm_prompt_on(&r.shape, r.prompt, layout, W4A16, board);
            print!(" {:.2}, {:.0} |", p.decode_tok_s, 1e3 * p.ttft_s());
        }
        println!();
    }
}

/// The realised DDR bandwidth at which the model's w4a16 decode of `r` reaches RKLLM's, all
/// else as assumed (bisection to 1 MB/s); `None` when even the whole peak
/// ([`RK3576_DDR_PEAK`]) does not reach it.
fn ddr_to_reach(r: &Rk3576Row, layout: &DecoderLayout) -> Option<f64> {
    let decode = |bw: f64| {
        let m = CostModel {
            ddr_bw: bw,
            ..RK3576
        };
        m.predict_llm_prompt_as(&r.shape, r.prompt, layout, W4A16)
            .decode_tok_s
    };
    let want = r.w4a16.decode_tok_s;
    let (mut lo, mut hi) = (1e9, RK3576_DDR_PEAK);
    if decode(hi) < want {
        return None;
    }
    while hi - lo > 1e6 {
        let mid = 0.5 * (lo + hi);
        if decode(mid) >= want {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    Some(hi)
}
