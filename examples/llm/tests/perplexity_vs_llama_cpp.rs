//! rknn-llm's perplexity ([`rknn_llm::perplexity`], its default scoring) against what llama.cpp's
//! `llama-perplexity` reports on the same text, model and context size
//! (`fixtures/llm/perplexity.json`, from `scripts/fixtures/gen_perplexity_fixtures.py`): the
//! committed English text in every chunk of 128 tokens it gives.
//!
//! - The f32 path against llama.cpp computing in f32 (the tiny random model's F32 weights over
//!   every chunk; the F32 conversions of the demo model and Gemma-3-270M over their first two
//!   chunks, against the running value llama-perplexity printed after them; F32 KV cache): the
//!   same weights and the same definition, so they agree to the printed digits.
//! - The default NPU path (W8A8 on the emulator) over every chunk against llama-perplexity run
//!   as a user runs it on the demo model's Q4_1 file and Gemma-3-270M's Q4_K_M (its quantized
//!   activations and F16 KV cache): within 1 %. Both sides round differently here, so the
//!   difference is noise that shrinks with the scored tokens; over the first six chunks (378
//!   tokens) W8A8 on the demo model was 1.1 % off, over all thirteen (819) 0.3 %. (The f32
//!   path is 0.17 % and 0.41 % from these values: llama.cpp's own rounding.)

mod common;

use std::num::NonZeroUsize;
use std::path::Path;
use std::sync::Arc;

use rknn_llm::gguf::GgufFile;
use rknn_llm::model::{Config, EngineFactory, Model};
use rknn_llm::perplexity::{Perplexity, PerplexityParams, perplexity};
use rknn_llm::tokenizer::Tokenizer;
use rknn_matmul::engine::{Engine, EngineConfig};
use rknn_matmul::{Platform, Runtime};
use serde_json::Value as Json;

/// The bar of issue 39 for rknn-llm's perplexity against llama-perplexity's on a quantized
/// model: 1 %.
const BAR: f64 = 0.01;

/// The f32 path against llama.cpp in f32: the same weights and definition, so the printed
/// digits (4 decimals) and rounding: Gemma-3-270M's first chunks differ by 1e-4, as both round
/// GELU's input to f16 and float noise near a rounding midpoint picks the neighbouring value
/// (docs/llm.md, "Correctness against llama.cpp").
const EXACT: f64 = 2e-4;

fn fixture(name: &str) -> Json {
    let doc: Json = serde_json::from_slice(
        &std::fs::read(common::fixtures().join("llm/perplexity.json")).unwrap(),
    )
    .unwrap();
    let case = doc["cases"][name].clone();
    assert!(case.is_object(), "no case {name} in perplexity.json");
    case
}

fn text() -> String {
    std::fs::read_to_string(common::fixtures().join("text/eval_english.txt")).unwrap()
}

/// The f32 host path, or the default NPU path (W8A8 with the family's residual policy, as
/// `llm-decode` loads it) on the emulator.
#[derive(Clone, Copy, Debug)]
enum Backend {
    F32,
    W8A8,
}

fn load(path: &Path, backend: Backend) -> common::Run {
    match backend {
        Backend::F32 => common::load_f32(path, 2),
        Backend::W8A8 => {
            let file = GgufFile::open(path).unwrap();
            let family = Config::from_gguf(&file).unwrap().family;
            let rt = Runtime::emulator(Platform::Rk3588).unwrap();
            let engine = Engine::new(&rt, EngineConfig::default()).unwrap();
            let pool = Arc::new(
                rayon::ThreadPoolBuilder::new()
                    .num_threads(2)
                    .build()
                    .unwrap(),
            );
            let mut factory = EngineFactory::new(engine, family.engine_options());
            common::Run::new(Model::load(&file, &mut factory, pool, &mut |_, _| {}).unwrap())
        }
    }
}

/// Our perplexity of the fixture's text with the case's context size, over its first
/// `max_chunks` chunks (all: `None`).
fn ours(path: &Path, backend: Backend, case: &Json, max_chunks: Option<usize>) -> Perplexity {
    let mut run = load(path, backend);
    let n_ctx = case["n_ctx"].as_u64().unwrap() as usize;
    run.seq.limit_context(n_ctx);
    assert_eq!(run.seq.n_ctx(), n_ctx);
    let tok = Tokenizer::from_gguf(&GgufFile::open(path).unwrap()).unwrap();
    let t = std::time::Instant::now();
    let params = PerplexityParams {
        max_chunks: max_chunks.map(|n| NonZeroUsize::new(n).unwrap()),
        ..PerplexityParams::default()
    };
    let p = perplexity(&run.model, &mut run.seq, &tok, &text(), &params, |_| Ok(())).unwrap();
    eprintln!(
        "{} {backend:?}: PPL = {:.4} +/- {:.5} over {} chunks ({} tokens scored), {:.1} s",
        path.display(),
        p.ppl,
        p.ppl_error.unwrap(),
        p.chunks,
        p.scored,
        t.elapsed().as_secs_f64()
    );
    p
}

/// `p` agrees within `bar` (relative) with the perplexity llama-perplexity printed after its
/// first `p.chunks` chunks (the final estimate, when `p` covers them all), evaluated as it
/// does: `n_ctx - n_ctx/2 - 1` tokens scored per chunk, all the chunks the text gives.
fn assert_agrees(p: &Perplexity, case: &Json, bar: f64, what: &str) {
    let running = case["running"].as_array().unwrap();
    let all = case["chunks"].as_u64().unwrap() as usize;
    assert_eq!(running.len(), all, "{what}");
    let want = running[p.chunks - 1].as_f64().unwrap();
    let rel = p.ppl / want - 1.0;
    eprintln!(
        "  {what}: llama-perplexity {want} after {} of {all} chunks ({:+.4} %)",
        p.chunks,
        100.0 * rel
    );
    assert!(
        rel.abs() <= bar,
        "{what}: PPL {} vs llama-perplexity {want} ({:+.4} %, bar {} %)",
        p.ppl,
        100.0 * rel,
        100.0 * bar
    );
    assert_eq!(p.n_ctx as u64, case["n_ctx"].as_u64().unwrap(), "{what}");
    assert_eq!(p.scored, p.chunks * (p.n_ctx - p.n_ctx / 2 - 1), "{what}");
    assert_eq!(p.running.len(), p.chunks, "{what}");
    if p.chunks == all {
        assert_eq!(p.tokens / p.n_ctx, all, "{what}: the chunks the text gives");
        let err = case["ppl_error"].as_f64().unwrap();
        let got = p.ppl_error.expect("more than one token scored");
        // The ± of two computations of the same tokens: as close as the values themselves.
        assert!(
            (got / err - 1.0).abs() <= 2.0 * bar.max(1e-4),
            "{what}: ± {got} vs {err}"
        );
    }
}

/// The tiny random model with F32 weights and llama-perplexity's F32 KV cache: the f32 path
/// computes what llama.cpp computes, so every running value agrees to the fixture's 4 decimals
/// (the values are in the thousands: a few parts in a million), over every chunk the text
/// gives (the count is llama-perplexity's `tokens / n_ctx`).
#[test]
fn the_tiny_model_matches_llama_perplexity_to_its_printed_digits() {
    let case = fixture("tiny-llama");
    let path = common::fixtures().join("llm/tiny-llama.gguf");
    let p = ours(&path, Backend::F32, &case, None);
    assert_agrees(&p, &case, 1e-5, "tiny-llama f32");
    for (i, (got, want)) in p
        .running
        .iter()
        .zip(case["running"].as_array().unwrap())
        .enumerate()
    {
        let want = want.as_f64().unwrap();
        assert!(
            (got / want - 1.0).abs() <= 1e-5,
            "chunk {}: {got} vs {want}",
            i + 1
        );
    }
}

/// The f32 path over the first two chunks within [`EXACT`] of llama.cpp computing in f32 (the
/// fixture's `NAME-f32` case: the file's F32 conversion); the default NPU path over every chunk
/// within [`BAR`] of llama-perplexity on the file.
fn quantized_model_agrees(path: &Path, name: &str) {
    let exact = fixture(&format!("{name}-f32"));
    let p = ours(path, Backend::F32, &exact, Some(2));
    assert_agrees(
        &p,
        &exact,
        EXACT,
        &format!("{name} f32 vs llama.cpp in f32"),
    );
    let case = fixture(name);
    let p = ours(path, Backend::W8A8, &case, None);
    assert_agrees(&p, &case, BAR, &format!("{name} W8A8"));
}

/// The demo model (Q4_1): the f32 path as llama.cpp's in f32; the default NPU path within 1 %
/// of llama-perplexity.
#[test]
fn the_demo_model_agrees_with_llama_perplexity() {
    let Some(path) = common::demo_model_forward() else {
        return;
    };
    quantized_model_agrees(&path, "smollm2");
}

/// Gemma-3-270M (Q4_K_M; its vocabulary adds BOS, so every chunk's first token is replaced):
/// the f32 path as llama.cpp's in f32; the default NPU path within 1 % of llama-perplexity.
#[test]
fn gemma3_agrees_with_llama_perplexity() {
    let Some(path) = common::gemma3_model_forward() else {
        return;
    };
    quantized_model_agrees(&path, "gemma3-270m");
}
