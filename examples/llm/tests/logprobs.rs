//! Log-probabilities against llama.cpp on the fixture of
//! scripts/fixtures/gen_logprob_fixtures.py (the float64 log-softmax of llama.cpp's raw logits,
//! F32 weights and KV cache): a greedy generation on the f32 path with
//! `GenerateParams::logprobs` gives llama.cpp's tokens, and the chosen token's and the top 5's
//! log-probabilities within 1e-3 at every position; with prompt lookup (drafts accepted in
//! verify passes, each accepted token's logprobs from its own row of the pass) the same.
//!
//! The tiny random models (llama, qwen2) are committed; SmolLM2 is the demo Q4_1 file, whose
//! dequantized weights are exactly those of the F32 conversion llama.cpp ran.

mod common;

use std::path::Path;

use rknn_llm::sample::SamplerConfig;
use rknn_llm::session::{GenerateParams, Session};
use rknn_llm::spec::PromptLookup;
use serde_json::Value as Json;

const TOLERANCE: f64 = 1e-3;

fn ids(v: &Json) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

fn floats(v: &Json) -> Vec<f64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect()
}

/// Generates after each of the fixture's prompts (up to an end-of-generation token) for `name` on the f32 path, with and without
/// prompt lookup, and compares every position; returns the largest |Δ| seen.
fn check(name: &str, path: &Path) -> f64 {
    let doc: Json = serde_json::from_slice(
        &std::fs::read(common::fixtures().join("llm/logprobs.json")).unwrap(),
    )
    .unwrap();
    let top = doc["top"].as_u64().unwrap() as usize;
    let n_gen = doc["n_gen"].as_u64().unwrap() as usize;
    let loaded = rknn_llm::Model::builder(path)
        .backend(rknn_llm::Backend::F32)
        .pool(rknn_llm::model::HostPool::workers(2).unwrap())
        .context(0)
        .load()
        .unwrap();
    let greedy = SamplerConfig {
        temperature: 0.0,
        ..SamplerConfig::default()
    };
    let tokenizer = loaded.tokenizer.clone();
    let mut session = Session::new(loaded.model, loaded.tokenizer, greedy).unwrap();
    let mut worst = 0.0f64;
    let mut accepted = 0;
    for lookup in [None, Some(PromptLookup::default())] {
        for (p, prompt) in doc["models"][name]["prompts"]
            .as_array()
            .unwrap()
            .iter()
            .enumerate()
        {
            let what = format!("{name} prompt {p} lookup {}", lookup.is_some());
            session.reset();
            let params = GenerateParams {
                max_tokens: Some(n_gen),
                lookup,
                logprobs: Some(top),
                ..GenerateParams::default()
            };
            let mut g = session
                .generate_tokens(&ids(&prompt["prompt_ids"]), &params)
                .unwrap();
            let pieces: Vec<_> = (&mut g)
                .map(|p| p.unwrap())
                .filter(|p| p.token.is_some())
                .collect();
            accepted += g.summary().spec.accepted;
            drop(g);
            let tokens: Vec<u32> = pieces.iter().map(|p| p.token.unwrap()).collect();
            // llama_ref decodes past an end-of-generation token; the session stops there.
            let want = ids(&prompt["generated"]);
            assert_eq!(tokens, want[..tokens.len()], "{what}: the greedy tokens");
            if let Some(&next) = want.get(tokens.len()) {
                assert!(tokenizer.is_eog(next), "{what}: stopped early at {next}");
            }
            let (want_lp, want_ids) = (floats(&prompt["logprob"]), &prompt["top_ids"]);
            for (i, piece) in pieces.iter().enumerate() {
                let lp = piece.logprobs.as_ref().expect("asked for");
                assert_eq!(lp.token, tokens[i]);
                let d = (f64::from(lp.logprob) - want_lp[i]).abs();
                worst = worst.max(d);
                assert!(d <= TOLERANCE, "{what} position {i}: chosen {d}");
                let want_top = floats(&prompt["top_logprobs"][i]);
                let want_top_ids = ids(&want_ids[i]);
                assert_eq!(lp.top.len(), top, "{what} position {i}");
                for (j, &(id, l)) in lp.top.iter().enumerate() {
                    // Rank by rank the values; the ids where no neighbour is within the
                    // tolerance (a near-tie may swap two of them).
                    let d = (f64::from(l) - want_top[j]).abs();
                    worst = worst.max(d);
                    assert!(d <= TOLERANCE, "{what} position {i} rank {j}: {d}");
                    let alone = want_top
                        .iter()
                        .enumerate()
                        .all(|(k, &w)| k == j || (w - want_top[j]).abs() > 2.0 * TOLERANCE);
                    if alone {
                        assert_eq!(id, want_top_ids[j], "{what} position {i} rank {j}");
                    }
                }
            }
        }
    }
    assert!(
        accepted > 0,
        "{name}: prompt lookup never had a draft accepted"
    );
    println!("{name}: max |Δ| {worst:.2e}, {accepted} drafts accepted");
    worst
}

#[test]
fn tiny_llama_logprobs_match_llama_cpp() {
    check(
        "tiny-llama",
        &common::fixtures().join("llm/tiny-llama.gguf"),
    );
}

#[test]
fn tiny_qwen2_logprobs_match_llama_cpp() {
    check(
        "tiny-qwen2",
        &common::fixtures().join("llm/tiny-qwen2.gguf"),
    );
}

#[test]
fn smollm2_logprobs_match_llama_cpp() {
    let Some(path) = common::demo_model_forward() else {
        return;
    };
    check("smollm2", &path);
}

/// Without `logprobs` no piece carries any; with 0 the chosen token's only.
#[test]
fn logprobs_only_when_asked() {
    let loaded = rknn_llm::Model::builder(common::fixtures().join("llm/tiny-llama.gguf"))
        .backend(rknn_llm::Backend::F32)
        .pool(rknn_llm::model::HostPool::workers(1).unwrap())
        .load()
        .unwrap();
    let greedy = SamplerConfig {
        temperature: 0.0,
        ..SamplerConfig::default()
    };
    let mut session = Session::new(loaded.model, loaded.tokenizer, greedy).unwrap();
    for (asked, len) in [(None, None), (Some(0), Some(0)), (Some(25), Some(20))] {
        session.reset();
        let params = GenerateParams {
            max_tokens: Some(6),
            logprobs: asked,
            ..GenerateParams::default()
        };
        let pieces: Vec<_> = session
            .generate("hello world", &params)
            .unwrap()
            .map(|p| p.unwrap())
            .collect();
        for p in pieces {
            if p.token.is_none() {
                assert!(p.logprobs.is_none());
                continue;
            }
            assert_eq!(p.logprobs.as_ref().map(|l| l.top.len()), len, "{asked:?}");
            if let Some(l) = &p.logprobs {
                assert_eq!(Some(l.token), p.token);
                assert!(l.logprob <= 0.0);
            }
        }
    }
}
