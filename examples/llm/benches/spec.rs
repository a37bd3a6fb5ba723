//! Speculative decoding (prompt lookup) against plain greedy decoding, in one process on the
//! emulator: the model loads once, and for each prompt of `benches/spec_prompts/` the two modes
//! alternate (ABBA) `-r` times each, every generation from an empty cache.
//!
//! ```sh
//! cargo bench -p rknn-llm --bench spec -- MODEL.gguf [-t THREADS] [-n TOKENS] [-r REPS]
//!     [--prompts DIR] [--only SUBSTRING] [--ngram-min N] [--draft-max K] [--json OUT.json]
//! ```
//!
//! Per prompt: the median decode tok/s of each mode, the median of the per-pair ratios
//! (lookup over the plain run next to it), acceptance, tokens per forward pass, the cost
//! model's RK3588 projection of both, and whether every run produced the same tokens (lossless).
//! In one process the two modes share the same physical pages of the weights; separate
//! processes (`scripts/bench/spec.py`) add page placement to the noise of each run.

use std::sync::Arc;

use rknn_llm::gguf::GgufFile;
use rknn_llm::model::{EngineFactory, EngineOptions, Model, host_pool};
use rknn_llm::sample::SamplerConfig;
use rknn_llm::session::{GenerateParams, GenerationSummary, Session, rate};
use rknn_llm::spec::PromptLookup;
use rknn_llm::tokenizer::Tokenizer;
use rknn_matmul::engine::{Engine, EngineConfig};
use rknn_matmul::{Platform, Runtime};

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

fn main() {
    let mut args = std::env::args().skip(1).filter(|a| a != "--bench");
    let (mut threads, mut tokens, mut reps) = (2usize, 96usize, 8usize);
    let mut path = None;
    let mut json = None;
    let mut lookup = PromptLookup::default();
    let mut only: Option<String> = None;
    let mut prompts = concat!(env!("CARGO_MANIFEST_DIR"), "/benches/spec_prompts").to_string();
    while let Some(a) = args.next() {
        let mut next = |what: &str| {
            args.next()
                .unwrap_or_else(|| panic!("{what} needs a value"))
        };
        match a.as_str() {
            "-t" => threads = next("-t").parse().expect("-t number"),
            "-n" => tokens = next("-n").parse().expect("-n number"),
            "-r" => reps = next("-r").parse().expect("-r number"),
            "--prompts" => prompts = next("--prompts"),
            "--only" => only = Some(next("--only")),
            "--ngram-min" => lookup.ngram_min = next("--ngram-min").parse().expect("number"),
            "--draft-max" => lookup.draft_max = next("--draft-max").parse().expect("number"),
            "--json" => json = Some(next("--json")),
            _ => path = Some(a),
        }
    }
    let Some(path) = path else {
        eprintln!(
            "usage: spec MODEL.gguf [-t THREADS] [-n TOKENS] [-r REPS] [--prompts DIR] [--only SUBSTRING] [--json OUT]"
        );
        return;
    };
    let pool = host_pool(threads).unwrap();
    let file = GgufFile::open(&path).unwrap();
    let tok = Tokenizer::from_gguf(&file).unwrap();
    let rt = Runtime::emulator(Platform::Rk3588).unwrap();
    let engine = Engine::new(&rt, EngineConfig::default()).unwrap();
    let mut factory = EngineFactory::new(engine.clone(), EngineOptions::default());
    let model = Arc::new(Model::load(&file, &mut factory, pool, &mut |_, _| {}).unwrap());
    let tok = Arc::new(tok);

    let mut files: Vec<_> = std::fs::read_dir(&prompts)
        .unwrap_or_else(|e| panic!("{prompts}: {e}"))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "txt"))
        .filter(|p| {
            only.as_ref()
                .is_none_or(|o| p.to_string_lossy().contains(o.as_str()))
        })
        .collect();
    files.sort();
    let greedy = SamplerConfig {
        temperature: 0.0,
        ..SamplerConfig::default()
    };
    let mut session = Session::new(model, tok.clone(), greedy).unwrap();
    let mut generate = |ids: &[u32], lookup: Option<PromptLookup>| -> GenerationSummary {
        session.reset();
        let params = GenerateParams {
            max_tokens: Some(tokens),
            lookup,
            ..GenerateParams::default()
        };
        let g = session.generate_tokens(ids, &params).unwrap();
        g.finish().unwrap()
    };
    println!(
        "| prompt | plain tok/s | lookup tok/s | ratio of medians | median pair ratio | acceptance | tokens / pass | RK3588 model: plain → lookup | identical |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---|");
    let mut rows = Vec::new();
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap();
        let ids = tok.encode(&text, true, true).unwrap();
        // One untimed warm-up of each mode (first-touch of the cache's pages).
        let first_plain = generate(&ids, None);
        let first_spec = generate(&ids, Some(lookup));
        let (mut plain, mut spec, mut pairs) = (Vec::new(), Vec::new(), Vec::new());
        let mut identical = first_spec.generated == first_plain.generated;
        for rep in 0..reps {
            let mut run = |on: bool| {
                let g = generate(&ids, on.then_some(lookup));
                identical &= g.generated == first_plain.generated;
                g.decode_tok_s()
            };
            // ABBA: whatever the second of two back-to-back runs pays falls on both modes.
            let (p, s) = if rep % 2 == 0 {
                let p = run(false);
                (p, run(true))
            } else {
                let s = run(true);
                (run(false), s)
            };
            plain.push(p);
            spec.push(s);
            pairs.push(s / p);
        }
        let (tp, ts, pr) = (median(plain), median(spec), median(pairs));
        let st = first_spec.spec;
        let model_rate =
            |g: &GenerationSummary| g.modelled.map_or(0.0, |(_, d)| rate(g.decisions, d));
        let (mp, ms) = (model_rate(&first_plain), model_rate(&first_spec));
        let name = f.file_stem().unwrap().to_string_lossy().to_string();
        println!(
            "| {name} | {tp:.1} | {ts:.1} | {:.2} | **{pr:.2}** | {:.2} | {:.2} | {mp:.1} → {ms:.1} | {} |",
            ts / tp,
            st.acceptance(),
            first_spec.tokens_per_pass(),
            if identical { "yes" } else { "**NO**" }
        );
        rows.push(serde_json::json!({
            "prompt": name, "plain_tok_s": tp, "lookup_tok_s": ts, "ratio": ts / tp,
            "median_pair_ratio": pr, "acceptance": st.acceptance(), "drafted": st.drafted,
            "accepted": st.accepted, "passes": st.passes,
            "tokens_per_pass": first_spec.tokens_per_pass(),
            "modelled_rk3588_plain_tok_s": mp, "modelled_rk3588_lookup_tok_s": ms,
            "identical": identical,
        }));
    }
    if let Some(out) = json {
        let doc = serde_json::json!({"tokens": tokens, "reps": reps, "threads": threads, "prompts": rows});
        std::fs::write(&out, doc.to_string()).unwrap();
    }
}
