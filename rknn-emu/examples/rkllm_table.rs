//! The RK3588 cost model's predictions beside RKLLM's published W8A8 figures, as one Markdown
//! table (docs/npu-matmul-performance.md, "The RKLLM table").
//!
//! ```sh
//! cargo run -p rknn-emu --example rkllm_table --release
//! ```
//!
//! Every "ours" figure is a MODEL (`rknn_emu::cost`, calibrated to the field campaign's 9B),
//! not a measurement: three NPU cores, W8A8, the NPU at 1 GHz, decode at M = 1, TTFT the
//! prefill pass of the prompt (the first token comes out of its last row's logits) with the
//! campaign's host glue, unpinned and with the campaign's A76-pinned speed-up.

use rknn_emu::cost::{
    DecoderShape, LLAMA3_8B, LlmPrediction, NpuTerms, QWEN2_0_5B, QWEN2_5_1_5B, RK3588,
    TINYLLAMA_1_1B,
};

/// A row: the shape, RKLLM's prompt length, and RKLLM's published decode tok/s and TTFT (ms).
struct Published {
    shape: DecoderShape,
    prompt: usize,
    decode_tok_s: f64,
    ttft_ms: f64,
}

/// RKLLM's RK3588 W8A8 figures: airockchip/rknn-llm `benchmark.md` (release 1.3.0, seqlen 128,
/// 64 new tokens) for the first three, its README (releases 1.1–1.2.1, seqlen 64, 256 new
/// tokens) for Llama-3-8B; CPU and NPU at their maximum frequencies.
const ROWS: [Published; 4] = [
    Published {
        shape: QWEN2_0_5B,
        prompt: 128,
        decode_tok_s: 41.58,
        ttft_ms: 145.90,
    },
    Published {
        shape: TINYLLAMA_1_1B,
        prompt: 128,
        decode_tok_s: 24.43,
        ttft_ms: 243.93,
    },
    Published {
        shape: QWEN2_5_1_5B,
        prompt: 128,
        decode_tok_s: 16.69,
        ttft_ms: 378.31,
    },
    Published {
        shape: LLAMA3_8B,
        prompt: 64,
        decode_tok_s: 3.79,
        ttft_ms: 1128.0,
    },
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
         | RKLLM | decode: largest terms | TTFT: largest terms | runs per core per token |"
    );
    println!("|---|---:|---:|---:|---:|---:|---|---|---:|");
    for r in &ROWS {
        let p: LlmPrediction = RK3588.predict_llm_prompt(&r.shape, r.prompt);
        println!(
            "| {} | {} | {:.2} ({:.2}) | {:.2} | {:.0} ({:.0}) | {:.0} | {} | {} | {} |",
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
        );
    }
}
