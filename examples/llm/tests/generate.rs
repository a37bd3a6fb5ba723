//! The library's generation API ([`rknn_llm::session`]) on the tiny committed models: with
//! prompt lookup it decides every position from the same logits as plain decoding (the logits
//! it taps are the same bytes), the pieces it yields are the text it reports, it stops where
//! asked (token limit, full context, stop strings), a dropped iterator leaves a conversation
//! that continues exactly as an uninterrupted one, a conversation cut back to a prefix
//! penalises repetitions as a fresh one, and sessions share one model.

mod common;

use std::io::Write;
use std::sync::{Arc, Mutex};

use rknn_llm::gguf::GgufFile;
use rknn_llm::model::{CacheType, HostF32Factory, Logits, Model};
use rknn_llm::sample::{Sampler, SamplerConfig};
use rknn_llm::session::{GenerateParams, GenerationSummary, Session, Stop};
use rknn_llm::spec::PromptLookup;
use rknn_llm::tokenizer::Tokenizer;

fn load(name: &str) -> (Arc<Model>, Arc<Tokenizer>) {
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
    (Arc::new(model), Arc::new(tok))
}

fn greedy() -> SamplerConfig {
    SamplerConfig {
        temperature: 0.0,
        ..SamplerConfig::default()
    }
}

/// A logits tap the test can read back.
#[derive(Clone, Default)]
struct Tap(Arc<Mutex<Vec<u8>>>);

impl Write for Tap {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Greedy generation of `n` tokens from `prompt`, with the pieces' text and the tapped logits.
fn generate(
    model: &Arc<Model>,
    tok: &Arc<Tokenizer>,
    prompt: &[u32],
    lookup: Option<PromptLookup>,
    n: usize,
) -> (GenerationSummary, Session, String, Vec<u8>) {
    let mut s = Session::new(model.clone(), tok.clone(), greedy()).unwrap();
    let tap = Tap::default();
    s.set_logits_tap(Some(Box::new(tap.clone())));
    let params = GenerateParams {
        max_tokens: Some(n),
        lookup,
        batch: 5,
        ..GenerateParams::default()
    };
    let mut text = String::new();
    let mut g = s.generate_tokens(prompt, &params).unwrap();
    for piece in &mut g {
        text.push_str(&piece.unwrap().text);
    }
    let out = g.summary().clone();
    drop(g);
    let logits = tap.0.lock().unwrap().clone();
    (out, s, text, logits)
}

#[test]
fn lookup_decides_every_position_from_the_same_logits_as_plain_decoding() {
    let mut drafted = 0;
    for name in ["tiny-llama.gguf", "tiny-qwen2.gguf", "tiny-qwen35.gguf"] {
        let (model, tok) = load(name);
        let n_vocab = model.config().n_vocab;
        // A prompt that repeats itself, so there is something to look up.
        let unit: Vec<u32> = (0..7).map(|i| (i * 37 + 11) % n_vocab as u32).collect();
        let prompt: Vec<u32> = unit.iter().cycle().take(23).copied().collect();
        let (plain, plain_s, plain_text, plain_logits) = generate(&model, &tok, &prompt, None, 30);
        let lookup = PromptLookup {
            ngram_min: 1,
            ..PromptLookup::default()
        };
        let (spec, spec_s, spec_text, spec_logits) =
            generate(&model, &tok, &prompt, Some(lookup), 30);
        assert_eq!(spec.generated, plain.generated, "{name}");
        assert_eq!(plain.stop, Some(Stop::MaxTokens), "{name}");
        assert_eq!(plain.generated.len(), 30, "{name}");
        // Every decided position's row is tapped once, in position order, by both.
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
        // The pieces yielded are the text reported, and the same for both.
        assert_eq!(plain_text, plain.text, "{name}");
        assert_eq!(spec_text, spec.text, "{name}");
        assert_eq!(spec.text, plain.text, "{name}");
        // Both conversations hold prompt + generated; plain decoding decides the last token
        // without feeding it, lookup may have fed it as an accepted draft.
        for s in [&plain_s, &spec_s] {
            let mut want = prompt.clone();
            want.extend_from_slice(&plain.generated);
            assert_eq!(s.history(), &want[..], "{name}");
        }
        assert_eq!(plain_s.sequence().len(), prompt.len() + 29, "{name}");
        assert!(spec_s.sequence().len() >= prompt.len() + 29, "{name}");
        drafted += spec.spec.drafted;
    }
    assert!(drafted > 0, "the repeated prompts drafted nothing");
}

#[test]
fn generation_stops_at_the_token_limit_and_at_a_full_context() {
    let (model, tok) = load("tiny-llama.gguf");
    let n_ctx = model.config().n_ctx;
    let (none, s, _, _) = generate(&model, &tok, &[1, 2, 3], None, 0);
    assert_eq!(
        (none.stop, none.generated.len()),
        (Some(Stop::MaxTokens), 0)
    );
    assert_eq!(s.sequence().len(), 3, "the prompt is evaluated");
    let prompt: Vec<u32> = (0..n_ctx as u32 - 4).map(|i| 1 + i % 50).collect();
    let (full, s, _, _) = generate(&model, &tok, &prompt, None, 100);
    assert_eq!(full.stop, Some(Stop::Context));
    assert_eq!(s.sequence().len(), n_ctx);
}

#[test]
fn a_dropped_generation_continues_as_if_it_had_not_been_interrupted() {
    for name in ["tiny-llama.gguf", "tiny-qwen2.gguf"] {
        let (model, tok) = load(name);
        let prompt: Vec<u32> = (0..9).map(|i| 3 + i * 5).collect();
        let (whole, ..) = generate(&model, &tok, &prompt, None, 20);
        // The same, cancelled after 7 pieces, then resumed with an empty prompt (the decided,
        // unfed 7th token is fed first).
        let mut s = Session::new(model.clone(), tok.clone(), greedy()).unwrap();
        let first = GenerateParams {
            max_tokens: Some(100),
            ..GenerateParams::default()
        };
        let mut got: Vec<u32> = s
            .generate_tokens(&prompt, &first)
            .unwrap()
            .take(7)
            .map(|p| p.unwrap().token.unwrap())
            .collect();
        assert_eq!(s.history().len(), prompt.len() + 7, "{name}");
        assert_eq!(
            s.sequence().len(),
            prompt.len() + 6,
            "{name}: the 7th is unfed"
        );
        let rest = GenerateParams {
            max_tokens: Some(13),
            ..GenerateParams::default()
        };
        let g = s.generate_tokens(&[], &rest).unwrap().finish().unwrap();
        got.extend_from_slice(&g.generated);
        assert_eq!(got, whole.generated, "{name}");
    }
}

#[test]
fn a_stop_string_ends_the_output_before_it() {
    let (model, tok) = load("tiny-qwen2.gguf");
    let prompt: Vec<u32> = (0..6).map(|i| 100 + i * 17).collect();
    let (whole, ..) = generate(&model, &tok, &prompt, None, 40);
    // A stop string from the middle of the unstopped text (three characters there).
    let chars: Vec<char> = whole.text.chars().collect();
    assert!(chars.len() > 12, "{:?}", whole.text);
    let at = chars.len() / 2;
    let stop: String = chars[at..at + 3].iter().collect();
    let before: String = whole.text[..whole.text.find(&stop).unwrap()].to_string();
    let mut s = Session::new(model.clone(), tok.clone(), greedy()).unwrap();
    let params = GenerateParams {
        max_tokens: Some(40),
        stop: vec!["never appears \u{1F980}".into(), stop.clone()],
        ..GenerateParams::default()
    };
    let mut g = s.generate_tokens(&prompt, &params).unwrap();
    let mut pieces = String::new();
    for p in &mut g {
        pieces.push_str(&p.unwrap().text);
    }
    assert_eq!(g.stop(), Some(Stop::StopString));
    assert_eq!(pieces, before);
    assert_eq!(g.summary().text, before);
    assert!(g.summary().generated.len() < whole.generated.len());
    assert_eq!(
        whole.generated[..g.summary().generated.len()],
        g.summary().generated[..]
    );
}

#[test]
fn text_pieces_join_to_the_decoded_tokens_and_the_summary_agrees() {
    let (model, tok) = load("tiny-llama.gguf");
    let mut s = Session::new(model.clone(), tok.clone(), greedy()).unwrap();
    s.set_cache_type(CacheType::F16);
    let params = GenerateParams {
        max_tokens: Some(16),
        ..GenerateParams::default()
    };
    let pieces: Vec<_> = s
        .generate("the cat", &params)
        .unwrap()
        .map(Result::unwrap)
        .collect();
    let ids: Vec<u32> = pieces.iter().filter_map(|p| p.token).collect();
    let text: String = pieces.iter().map(|p| p.text.as_str()).collect();
    let mut bytes = Vec::new();
    for &id in &ids {
        bytes.extend_from_slice(tok.piece(id, false).unwrap());
    }
    assert_eq!(text, String::from_utf8_lossy(&bytes));
    // Only a final piece may come without a token.
    assert!(pieces.iter().rev().skip(1).all(|p| p.token.is_some()));
    // The sequence's cache holds the prompt and every generated token but the last, and
    // its logits are the model's for that history (f16 cache).
    let mut seq = model.sequence(CacheType::F16);
    let n = s.sequence().len();
    let want = model
        .forward(&mut seq, &s.history()[..n], 0, Logits::Last)
        .unwrap()
        .to_vec();
    assert_eq!(n + 1, s.history().len());
    assert_eq!(s.sequence().logits(), &want[..]);
}

/// The reference for a session's greedy decisions with penalties, written out with the model
/// and a sampler: `prompt` evaluated from an empty cache, the sampler given `window` (the
/// tokens its repetition penalty considers) before the completion starts (the presence and
/// frequency penalties count the completion's tokens), then one token per pass.
fn reference_decode(
    model: &Model,
    sampling: &SamplerConfig,
    prompt: &[u32],
    window: &[u32],
    n: usize,
) -> Vec<u32> {
    let mut seq = model.sequence(CacheType::F32);
    let mut sampler = Sampler::new(sampling.clone());
    window.iter().for_each(|&t| sampler.accept(t));
    sampler.start_completion();
    let mut row = model
        .forward(&mut seq, prompt, 0, Logits::Last)
        .unwrap()
        .to_vec();
    let mut out = Vec::new();
    for _ in 0..n {
        let t = sampler.sample(&row);
        sampler.accept(t);
        out.push(t);
        let pos = seq.len();
        row = model
            .forward(&mut seq, &[t], pos, Logits::Last)
            .unwrap()
            .to_vec();
    }
    out
}

/// A conversation cut back to a prefix of it ([`Session::keep_prefix`], as a chat turn or a
/// server's prompt cache does) decides its next tokens, under the repetition, presence and
/// frequency penalties, as a fresh session that evaluated only the prefix: the tokens the cut
/// dropped are no longer penalised.
#[test]
fn a_conversation_cut_back_to_a_prefix_penalises_as_a_fresh_one() {
    for name in [
        "tiny-llama.gguf",
        "tiny-qwen2.gguf",
        "tiny-lfm2.gguf",
        "tiny-lfm2moe.gguf",
        "tiny-qwen35.gguf",
    ] {
        let (model, tok) = load(name);
        let sampling = SamplerConfig {
            repeat_penalty: 1.5,
            repeat_last_n: 64,
            presence_penalty: 0.5,
            frequency_penalty: 0.25,
            ..greedy()
        };
        let params = |n| GenerateParams {
            max_tokens: Some(n),
            batch: 5,
            ..GenerateParams::default()
        };
        let prefix = tok
            .encode(
                "Once upon a time, there was a little robot who",
                true,
                false,
            )
            .unwrap();
        let n = 12;
        // A fresh session's tokens after the prefix, and the reference's.
        let mut fresh = Session::new(model.clone(), tok.clone(), sampling.clone()).unwrap();
        let want = fresh
            .generate_tokens(&prefix, &params(n))
            .unwrap()
            .finish()
            .unwrap()
            .generated;
        assert_eq!(
            want,
            reference_decode(&model, &sampling, &prefix, &prefix, n),
            "{name}"
        );
        // A session that held the prefix, the very tokens a fresh one picks after it and more,
        // cut back to the prefix (all but its last token, which is evaluated again).
        let mut s = Session::new(model.clone(), tok.clone(), sampling.clone()).unwrap();
        let longer: Vec<u32> = prefix.iter().chain(&want).copied().collect();
        s.generate_tokens(&longer, &params(8))
            .unwrap()
            .finish()
            .unwrap();
        let before = s.history().to_vec();
        let kept = s.keep_prefix(&prefix);
        assert_eq!(s.history(), &prefix[..kept], "{name}");
        let got = s
            .generate_tokens(&prefix[kept..], &params(n))
            .unwrap()
            .finish()
            .unwrap()
            .generated;
        assert_eq!(got, want, "{name}");
        // Forgetting the conversation (a new cache type) forgets its penalties too.
        let mut s = Session::new(model.clone(), tok.clone(), sampling.clone()).unwrap();
        s.generate_tokens(&longer, &params(8))
            .unwrap()
            .finish()
            .unwrap();
        s.set_cache_type(CacheType::F32);
        let got = s
            .generate_tokens(&prefix, &params(n))
            .unwrap()
            .finish()
            .unwrap()
            .generated;
        assert_eq!(got, want, "{name}: after set_cache_type");
        // The check has teeth: with the dropped tokens still in its window the penalty picks
        // other tokens.
        let stale: Vec<u32> = before.iter().chain(&prefix[kept..]).copied().collect();
        assert_ne!(
            reference_decode(&model, &sampling, &prefix, &stale, n),
            want,
            "{name}: the dropped tokens do not change the decisions; pick another prompt"
        );
    }
}
