//! The library's generation loop ([`rknn_llm::generate::Generator`]) on the tiny committed
//! models: with prompt lookup it decides every position from the same logits as plain decoding
//! (the logits it writes out are the same bytes), it writes out exactly the text it returns,
//! and it stops where asked.

mod common;

use std::sync::Arc;

use rknn_llm::generate::{Generation, Generator, Stop};
use rknn_llm::gguf::GgufFile;
use rknn_llm::model::{HostF32Factory, Model};
use rknn_llm::sample::{Sampler, SamplerConfig};
use rknn_llm::spec::PromptLookup;
use rknn_llm::tokenizer::Tokenizer;

fn load(name: &str) -> (Model, Tokenizer) {
    let pool = Arc::new(
        rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .unwrap(),
    );
    let file = GgufFile::open(common::fixtures().join("llm").join(name)).unwrap();
    let tok = Tokenizer::from_gguf(&file).unwrap();
    let model = Model::load(
        &file,
        &mut HostF32Factory::new(pool.clone()),
        pool,
        &mut |_, _| {},
    )
    .unwrap();
    (model, tok)
}

/// Greedy generation of `n` tokens from `prompt`, with its written text and logits.
fn generate(
    model: &mut Model,
    tok: &Tokenizer,
    prompt: &[u32],
    lookup: Option<PromptLookup>,
    n: usize,
) -> (Generation, Vec<u8>, Vec<u8>) {
    let mut sampler = Sampler::new(SamplerConfig {
        temperature: 0.0,
        ..SamplerConfig::default()
    });
    let (mut text, mut logits) = (Vec::new(), Vec::new());
    let mut g = Generator {
        model,
        emulator: None,
        lookup,
        history: Vec::new(),
        tok,
        sampler: &mut sampler,
        batch: 5,
        n_predict: Some(n),
        logits_out: Some(&mut logits),
        text_out: Some(&mut text),
    };
    let out = g.generate(prompt, 0).unwrap();
    (out, text, logits)
}

#[test]
fn lookup_decides_every_position_from_the_same_logits_as_plain_decoding() {
    let mut drafted = 0;
    for name in ["tiny-llama.gguf", "tiny-qwen2.gguf"] {
        let (mut model, tok) = load(name);
        let n_vocab = model.config().n_vocab;
        // A prompt that repeats itself, so there is something to look up.
        let unit: Vec<u32> = (0..7).map(|i| (i * 37 + 11) % n_vocab as u32).collect();
        let prompt: Vec<u32> = unit.iter().cycle().take(23).copied().collect();
        let (plain, plain_text, plain_logits) = generate(&mut model, &tok, &prompt, None, 30);
        let lookup = PromptLookup {
            ngram_min: 1,
            ..PromptLookup::default()
        };
        let (spec, spec_text, spec_logits) = generate(&mut model, &tok, &prompt, Some(lookup), 30);
        assert_eq!(spec.generated, plain.generated, "{name}");
        assert_eq!(plain.stop, Stop::NPredict, "{name}");
        assert_eq!(plain.generated.len(), 30, "{name}");
        // Every decided position's row is written once, in position order, by both.
        let rows = prompt.len() + plain.decisions;
        assert_eq!(plain_logits.len(), rows * n_vocab * 4, "{name}");
        assert_eq!(spec_logits, plain_logits, "{name}");
        assert_eq!(
            plain.decode_forwards, plain.decisions,
            "{name}: one row per pass"
        );
        assert_eq!(spec.decisions, plain.decisions, "{name}");
        // Each accepted draft saves a pass (the last one may end the generation mid-pass).
        let saved = plain.decode_forwards - spec.decode_forwards;
        assert!(
            saved == spec.spec.accepted || saved + 1 == spec.spec.accepted,
            "{name}: {saved} passes saved by {} accepted drafts",
            spec.spec.accepted
        );
        // The text written as it is produced is the text returned.
        assert_eq!(String::from_utf8(plain_text).unwrap(), plain.text, "{name}");
        assert_eq!(String::from_utf8(spec_text).unwrap(), spec.text, "{name}");
        assert_eq!(spec.text, plain.text, "{name}");
        // Plain decoding decides the last token without feeding it; lookup may have fed it
        // as an accepted draft. Either way the cache holds what `unfed` leaves out.
        assert_eq!(plain.unfed, plain.generated.last().copied(), "{name}");
        assert_eq!(plain.end_pos, prompt.len() + 29, "{name}");
        let fed = |g: &Generation| g.end_pos + usize::from(g.unfed.is_some());
        assert_eq!(fed(&spec), prompt.len() + 30, "{name}");
        drafted += spec.spec.drafted;
    }
    assert!(drafted > 0, "the repeated prompts drafted nothing");
}

#[test]
fn generation_stops_at_n_predict_and_at_a_full_context() {
    let (mut model, tok) = load("tiny-llama.gguf");
    let n_ctx = model.config().n_ctx;
    let (none, _, _) = generate(&mut model, &tok, &[1, 2, 3], None, 0);
    assert_eq!((none.stop, none.generated.len()), (Stop::NPredict, 0));
    let prompt: Vec<u32> = (0..n_ctx as u32 - 4).map(|i| 1 + i % 50).collect();
    let (full, _, _) = generate(&mut model, &tok, &prompt, None, 100);
    assert_eq!(full.stop, Stop::Context);
    assert_eq!(full.end_pos, n_ctx);
}
