//! What a grammar costs a stream: decode tokens per second with and without a JSON Schema
//! constraint, 1 and 4 concurrent streams through the batcher, on a model (default: the demo
//! model) on its default backend (the emulator here), measured in the same run, the plain and
//! constrained rounds alternating; then the constraint's own host cost per token (the mask and
//! the parser's advance) over a real vocabulary, apart from the model.
//!
//! ```sh
//! cargo bench -p rknn-llm --bench constraint [-- MODEL.gguf]
//! ```
//!
//! The goal (the structured-output issue): a constrained stream at ≥ 0.9× the plain one's
//! decode rate. Both generate 64 tokens at most, greedy, from the same prompts; the schema
//! is a list of short strings, so that a constrained answer is as long as a plain one.

use std::path::PathBuf;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use rknn_llm::constraint::{GrammarCompiler, GrammarSpec};
use rknn_llm::sample::SamplerConfig;
use rknn_llm::serve::{Event, Request, ServeConfig};
use rknn_llm::{LoadedModel, Model};

mod common;
use common::per_call;

const MAX_TOKENS: usize = 64;

fn main() {
    let path = std::env::args()
        .skip(1)
        .find(|a| !a.starts_with('-'))
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("../../models/SmolLM2-135M-Instruct.Q4_1.gguf")
        });
    let quick = std::env::var_os("BENCH_QUICK").is_some();
    let (loaded, batcher) = Model::builder(&path)
        .threads(2)
        .serve(|_| {
            Ok(ServeConfig {
                slots: 4,
                slot_ctx: 1024,
                ..ServeConfig::default()
            })
        })
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let schema = serde_json::json!({
        "type": "object",
        "properties": {"animals": {"type": "array", "items": {"type": "string", "maxLength": 16}, "maxItems": 200}},
        "required": ["animals"], "additionalProperties": false
    });
    let compiler = GrammarCompiler::new(&loaded.tokenizer).unwrap();
    let grammar = compiler.compile(&GrammarSpec::JsonSchema(schema)).unwrap();
    println!(
        "{} on the {} backend, 2 host threads, {} CPUs; {MAX_TOKENS} tokens per stream, greedy",
        path.display(),
        loaded.backend.name(),
        std::thread::available_parallelism().map_or(0, |n| n.get()),
    );
    println!("| streams | plain tok/s | constrained tok/s | constrained / plain |");
    println!("|---:|---:|---:|---:|");
    let rounds = if quick { 1 } else { 3 };
    for streams in [1, 4] {
        let (mut plain, mut constrained) = (Vec::new(), Vec::new());
        for _ in 0..rounds {
            plain.push(run(&loaded, &batcher, streams, None));
            constrained.push(run(&loaded, &batcher, streams, Some(grammar.clone())));
        }
        let (p, c) = (median(plain), median(constrained));
        println!("| {streams} | {p:.1} | {c:.1} | {:.3} |", c / p);
    }
    // The constraint's own cost per token: mask one row, advance by its best token.
    let n_vocab = loaded.model.config().n_vocab;
    let mut row = vec![0.0f32; n_vocab];
    let text = "{\"animals\":[\"cat\",\"dog\",\"horse\",\"lion\",\"tiger\",\"bear\",\"wolf\"]}";
    let ids = loaded.tokenizer.encode(text, false, false).unwrap();
    let per_token = per_call(if quick { 2 } else { 10 }, || {
        let mut c = grammar.start();
        for &id in &ids {
            c.mask(&mut row).unwrap();
            c.commit(id).unwrap();
        }
    }) / ids.len() as u32;
    println!(
        "\nmask + advance: {:.1} µs per token over a {n_vocab}-token vocabulary (one thread)",
        per_token.as_secs_f64() * 1e6
    );
    batcher.close();
}

/// Decode tokens per second of `streams` concurrent requests (the slowest stream's decode
/// time: they run in the same passes).
fn run(
    loaded: &LoadedModel,
    batcher: &rknn_llm::serve::Batcher,
    streams: usize,
    constraint: Option<rknn_llm::constraint::Grammar>,
) -> f64 {
    let (tx, rx) = mpsc::channel();
    for i in 0..streams {
        let prompt = format!(
            "<|im_start|>user\nList as many animals as you can, as JSON ({i}).<|im_end|>\n<|im_start|>assistant\n"
        );
        let tx = tx.clone();
        let request = Request {
            prompt: loaded.tokenizer.encode(&prompt, true, true).unwrap(),
            sampling: SamplerConfig {
                temperature: 0.0,
                ..SamplerConfig::default()
            },
            max_tokens: Some(MAX_TOKENS),
            // Each round decodes its prompt again.
            cache_prompt: false,
            constraint: constraint.clone(),
            ..Request::default()
        };
        batcher
            .submit(
                request,
                Box::new(move |e: Event| match e {
                    Event::Done(f) => tx.send(Some(f)).is_ok(),
                    Event::Failed(_) => tx.send(None).is_ok(),
                    Event::Piece(_) => true,
                }),
            )
            .unwrap();
    }
    drop(tx);
    let t = Instant::now();
    let (mut tokens, mut slowest) = (0, Duration::ZERO);
    for f in rx.iter().take(streams) {
        let f = f.expect("the request ends");
        tokens += f.completion_tokens;
        slowest = slowest.max(f.decode_time);
    }
    assert!(t.elapsed() < Duration::from_secs(600));
    tokens as f64 / slowest.as_secs_f64()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}
