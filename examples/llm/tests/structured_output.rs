//! Structured output: every completion under a JSON Schema parses and validates against it
//! (checked by an independent validator, the `jsonschema` crate, formats included), greedy
//! and sampled, on the f32 path and the NPU path (the emulator); a finished grammar ends the
//! generation (`Stop::Eog`), `max_tokens` cuts it (`Stop::MaxTokens`); GBNF and Lark grammars
//! hold; prompt-lookup drafts stay lossless under a grammar; what the engine cannot enforce is
//! an error naming it. The 28 schemas are `fixtures/structured/schemas.json`; CI runs all of
//! them on a tiny random model (whose random logits wander far more than a real model's) and
//! a third of them on the demo model; `-- --ignored` runs every schema on the demo model on
//! both paths.

mod common;

use std::path::PathBuf;
use std::sync::Arc;

use rknn_llm::constraint::{Grammar, GrammarCompiler, GrammarError, GrammarSpec};
use rknn_llm::sample::SamplerConfig;
use rknn_llm::session::{GenerateParams, Stop};
use rknn_llm::spec::PromptLookup;
use rknn_llm::{Backend, LoadedModel, Model};
use serde_json::Value as Json;

struct Case {
    name: String,
    prompt: String,
    schema: Json,
}

fn cases() -> Vec<Case> {
    let text = std::fs::read_to_string(common::fixtures().join("structured/schemas.json")).unwrap();
    let list: Vec<Json> = serde_json::from_str(&text).unwrap();
    list.into_iter()
        .map(|c| Case {
            name: c["name"].as_str().unwrap().to_string(),
            prompt: c["prompt"].as_str().unwrap().to_string(),
            schema: c["schema"].clone(),
        })
        .collect()
}

fn tiny(name: &str) -> PathBuf {
    common::fixtures().join(format!("llm/{name}.gguf"))
}

fn load(path: PathBuf, backend: Backend) -> LoadedModel {
    Model::builder(path)
        .backend(backend)
        .threads(2)
        .no_weight_cache()
        .context(0)
        .load()
        .unwrap()
}

fn sampling(temperature: f32, seed: u64) -> SamplerConfig {
    SamplerConfig {
        temperature,
        seed,
        ..SamplerConfig::default()
    }
}

/// The completion of `prompt` (as a chat turn when the model has a template) under `grammar`.
fn complete(
    m: &LoadedModel,
    prompt: &str,
    grammar: &Grammar,
    sampler: SamplerConfig,
    max_tokens: usize,
    lookup: Option<PromptLookup>,
) -> (String, Stop) {
    let mut session = m.session(sampler).unwrap();
    let params = GenerateParams {
        max_tokens: Some(max_tokens),
        lookup,
        constraint: Some(grammar.clone()),
        ..GenerateParams::default()
    };
    let summary = match m.chat_template.as_ref().unwrap() {
        Some(t) => session
            .chat(
                t,
                None,
                prompt,
                &rknn_llm::chat::ChatOptions::default(),
                &params,
            )
            .unwrap()
            .finish()
            .unwrap(),
        None => session.generate(prompt, &params).unwrap().finish().unwrap(),
    };
    (summary.text, summary.stop.unwrap())
}

fn validator(schema: &Json) -> jsonschema::Validator {
    jsonschema::options()
        .should_validate_formats(true)
        .build(schema)
        .unwrap()
}

/// Runs `cases` greedy and sampled: every output that ended validates; one cut by the token
/// limit (a random model can write digits or characters for ever where a schema allows it)
/// is allowed only when `may_cut`. Returns the outputs that ended.
fn sweep(m: &LoadedModel, cases: &[Case], seeds: &[u64], what: &str, may_cut: bool) -> usize {
    let compiler = GrammarCompiler::new(&m.tokenizer).unwrap();
    let mut ended = 0;
    for c in cases {
        let grammar = compiler
            .compile(&GrammarSpec::JsonSchema(c.schema.clone()))
            .unwrap_or_else(|e| panic!("{}: {e}", c.name));
        let v = validator(&c.schema);
        let runs = std::iter::once(sampling(0.0, 0)).chain(seeds.iter().map(|&s| sampling(0.8, s)));
        for sampler in runs {
            let temp = sampler.temperature;
            let (text, stop) = complete(m, &c.prompt, &grammar, sampler, 300, None);
            let ctx = format!("{what} {} (temperature {temp}): {text:?}", c.name);
            if may_cut && stop == Stop::MaxTokens {
                continue;
            }
            assert_eq!(stop, Stop::Eog, "{ctx}: the finished grammar must end it");
            let value: Json =
                serde_json::from_str(&text).unwrap_or_else(|e| panic!("{ctx}: not JSON: {e}"));
            if let Err(e) = v.validate(&value) {
                panic!("{ctx}: does not validate: {e}");
            }
            ended += 1;
        }
    }
    ended
}

#[test]
fn every_schema_validates_on_a_tiny_random_model() {
    let m = load(tiny("tiny-qwen2"), Backend::F32);
    let ended = sweep(&m, &cases(), &[1, 2], "tiny-qwen2 f32", true);
    // Most end: the check above ran on them.
    assert!(ended >= 28 * 3 * 2 / 3, "{ended} of {} ended", 28 * 3);
}

fn demo() -> Option<PathBuf> {
    common::require(common::demo_model(), "scripts/fetch-model.sh")
}

#[test]
fn a_third_of_the_schemas_validate_on_the_demo_model_f32_and_npu_paths() {
    let Some(path) = demo() else { return };
    let all = cases();
    let f32_cases: Vec<Case> = all.iter().step_by(3).map(clone_case).collect();
    let npu_cases: Vec<Case> = all.iter().skip(1).step_by(3).map(clone_case).collect();
    let f32 = load(path.clone(), Backend::F32);
    sweep(&f32, &f32_cases, &[7], "demo f32", false);
    let g = GrammarCompiler::new(&f32.tokenizer)
        .unwrap()
        .compile(&GrammarSpec::JsonObject)
        .unwrap();
    for sampler in [sampling(0.0, 0), sampling(0.8, 3)] {
        let (text, stop) = complete(
            &f32,
            "Return a JSON object with the keys city and country for Paris.",
            &g,
            sampler,
            300,
            None,
        );
        assert_eq!(stop, Stop::Eog, "{text:?}");
        assert!(
            serde_json::from_str::<Json>(&text).unwrap().is_object(),
            "{text:?}"
        );
    }
    drop(f32);
    let npu = load(path, Backend::Emulator);
    sweep(&npu, &npu_cases, &[7], "demo npu", false);
}

#[test]
#[ignore = "every schema on the demo model, both paths (minutes): cargo test --release --test structured_output -- --ignored"]
fn every_schema_validates_on_the_demo_model_f32_and_npu_paths() {
    let Some(path) = demo() else { return };
    let all = cases();
    for backend in [Backend::F32, Backend::Emulator] {
        let m = load(path.clone(), backend);
        sweep(&m, &all, &[11, 12], backend.name(), false);
    }
}

fn clone_case(c: &Case) -> Case {
    Case {
        name: c.name.clone(),
        prompt: c.prompt.clone(),
        schema: c.schema.clone(),
    }
}

#[test]
fn max_tokens_cuts_an_unfinished_object() {
    let m = load(tiny("tiny-llama"), Backend::F32);
    let compiler = GrammarCompiler::new(&m.tokenizer).unwrap();
    let schema = serde_json::json!({
        "type": "object",
        "properties": {"essay": {"type": "string", "minLength": 200}},
        "required": ["essay"]
    });
    let g = compiler.compile(&GrammarSpec::JsonSchema(schema)).unwrap();
    let (text, stop) = complete(&m, "Write.", &g, sampling(0.0, 0), 12, None);
    assert_eq!(stop, Stop::MaxTokens);
    assert!(text.starts_with("{\"essay\":\""), "{text:?}");
    assert!(serde_json::from_str::<Json>(&text).is_err(), "{text:?}");
}

#[test]
fn gbnf_lark_and_regex_hold() {
    let m = load(tiny("tiny-llama"), Backend::F32);
    let tok = &m.tokenizer;
    let compiler = GrammarCompiler::new(tok).unwrap();
    let gbnf = "root ::= \"(\" expr \")\"\n\
                expr ::= term ((\"+\" | \"-\") term){0,3}\n\
                term ::= [1-9] [0-9]{0,2} | \"(\" expr \")\"\n";
    let lark = "%llguidance {}\nstart: \"yes\" | \"no\" | \"maybe: \" NUM\nNUM: /[0-9]{1,3}/\n";
    let specs = [
        (GrammarSpec::Gbnf(gbnf.into()), None),
        (
            GrammarSpec::Lark(lark.into()),
            Some(r"^(yes|no|maybe: [0-9]{1,3})$"),
        ),
        (
            GrammarSpec::Regex("[a-z]{2,5}@[a-z]{2,5}\\.(org|com)".into()),
            Some(r"^[a-z]{2,5}@[a-z]{2,5}\.(org|com)$"),
        ),
    ];
    for (spec, pattern) in specs {
        let g = compiler.compile(&spec).unwrap();
        for seed in 0..4 {
            let (text, stop) = complete(&m, "Go:", &g, sampling(1.0, seed), 200, None);
            assert_eq!(stop, Stop::Eog, "{} {text:?}", spec.kind());
            match &spec {
                GrammarSpec::Gbnf(_) => assert!(balanced_sum(&text), "{text:?}"),
                _ => {
                    let re = fancy_regex::Regex::new(pattern.unwrap()).unwrap();
                    assert!(re.is_match(&text).unwrap(), "{text:?}");
                }
            }
            assert!(g.accepts(tok, &text).unwrap(), "{text:?}");
        }
    }
}

/// Whether `s` is `(expr)` of the test's GBNF: terms of 1-3 digits (no leading zero) or
/// parenthesised expressions, joined by up to three `+`/`-`.
fn balanced_sum(s: &str) -> bool {
    fn expr(b: &[u8], i: &mut usize) -> bool {
        if !term(b, i) {
            return false;
        }
        let mut n = 0;
        while *i < b.len() && (b[*i] == b'+' || b[*i] == b'-') && n < 3 {
            *i += 1;
            if !term(b, i) {
                return false;
            }
            n += 1;
        }
        true
    }
    fn term(b: &[u8], i: &mut usize) -> bool {
        if *i < b.len() && b[*i] == b'(' {
            *i += 1;
            if !expr(b, i) || *i >= b.len() || b[*i] != b')' {
                return false;
            }
            *i += 1;
            return true;
        }
        if *i >= b.len() || !(b'1'..=b'9').contains(&b[*i]) {
            return false;
        }
        *i += 1;
        let mut d = 0;
        while *i < b.len() && b[*i].is_ascii_digit() && d < 2 {
            *i += 1;
            d += 1;
        }
        true
    }
    let b = s.as_bytes();
    let mut i = 0;
    term(b, &mut i) && b.first() == Some(&b'(') && i == b.len()
}

#[test]
fn prompt_lookup_stays_lossless_under_a_grammar() {
    let Some(path) = demo() else { return };
    let m = load(path, Backend::F32);
    let compiler = GrammarCompiler::new(&m.tokenizer).unwrap();
    let schema = serde_json::json!({
        "type": "object",
        "properties": {"words": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 6}},
        "required": ["words"], "additionalProperties": false
    });
    let g = compiler.compile(&GrammarSpec::JsonSchema(schema)).unwrap();
    let prompt = "Repeat as a JSON list of words: the cat sat on the mat, the cat sat on the mat.";
    let plain = complete(&m, prompt, &g, sampling(0.0, 0), 80, None);
    let lookup = complete(
        &m,
        prompt,
        &g,
        sampling(0.0, 0),
        80,
        Some(PromptLookup::default()),
    );
    assert_eq!(plain, lookup);
}

#[test]
fn what_cannot_be_enforced_is_an_error_naming_it() {
    let tok = Arc::new(
        rknn_llm::tokenizer::Tokenizer::from_gguf(
            &rknn_llm::gguf::GgufFile::open(tiny("tiny-llama")).unwrap(),
        )
        .unwrap(),
    );
    let compiler = GrammarCompiler::new(&tok).unwrap();
    let err = |spec: GrammarSpec| compiler.compile(&spec).unwrap_err().to_string();
    for (schema, keyword) in [
        (
            serde_json::json!({"type": "array", "uniqueItems": true}),
            "uniqueItems",
        ),
        (
            serde_json::json!({"if": {"required": ["a"]}, "then": {"required": ["b"]}}),
            "if",
        ),
        (serde_json::json!({"not": {"type": "string"}}), "not"),
        (
            serde_json::json!({"type": "array", "contains": {"type": "integer"}}),
            "contains",
        ),
        (
            serde_json::json!({"$ref": "https://example.com/x.json"}),
            "https://example.com/x.json",
        ),
    ] {
        let e = err(GrammarSpec::JsonSchema(schema));
        assert!(e.contains(keyword), "{keyword}: {e}");
    }
    let e = err(GrammarSpec::JsonSchema(
        serde_json::json!({"type": "string", "format": "no-such-format"}),
    ));
    assert!(e.contains("no-such-format"), "{e}");
    let e = err(GrammarSpec::JsonSchema(serde_json::json!("object")));
    assert!(e.contains("a JSON Schema is an object"), "{e}");
    let e = err(GrammarSpec::Gbnf("root ::= undefined-rule\n".into()));
    assert!(e.contains("`undefined-rule`, which is not defined"), "{e}");
    let e = err(GrammarSpec::Lark("start: ( \n".into()));
    assert!(e.contains("lark"), "{e}");
    let big = format!("%llguidance {{}}\nstart: \"{}\"\n", "a".repeat(300_000));
    assert!(matches!(
        compiler.compile(&GrammarSpec::Lark(big)),
        Err(GrammarError::TooLarge { .. })
    ));
    // A grammar with no way to end compiles, but yields no finished output: refused by the
    // engine as it builds (an infinitely recursive rule has no finite string).
    let r = compiler.compile(&GrammarSpec::Gbnf("root ::= \"a\" root\n".into()));
    if let Ok(g) = r {
        let mut c = g.start();
        assert!(!c.is_accepting().unwrap());
    }
}

/// `GrammarCompiler` and `Grammar` are shared across threads (the server compiles on its
/// blocking threads while the batcher drives grammars): the same compiler compiling on two
/// threads at once, and one grammar driven by two threads at once, give what one thread gives.
#[test]
fn a_compiler_and_a_grammar_are_shared_by_threads() {
    let m = load(tiny("tiny-llama"), Backend::F32);
    let compiler = GrammarCompiler::new(&m.tokenizer).unwrap();
    let schema = serde_json::json!({
        "type": "object",
        "properties": {"a": {"enum": ["x", "yy", "zzz"]}, "b": {"type": "integer", "minimum": 0, "maximum": 9}},
        "required": ["a", "b"], "additionalProperties": false
    });
    let n_vocab = m.model.config().n_vocab;
    // A greedy walk over fixed logits that favour a different token at each step.
    let walk = |g: &Grammar| -> Vec<u32> {
        let mut c = g.start();
        let mut out = Vec::new();
        for step in 0..40u32 {
            let mut row: Vec<f32> = (0..n_vocab as u32)
                .map(|t| ((t.wrapping_mul(2_654_435_761) ^ step) % 1000) as f32)
                .collect();
            c.mask(&mut row).unwrap();
            let best = (0..n_vocab)
                .max_by(|&a, &b| row[a].total_cmp(&row[b]).then(b.cmp(&a)))
                .unwrap() as u32;
            if m.tokenizer.is_eog(best) {
                break;
            }
            c.commit(best).unwrap();
            out.push(best);
        }
        out
    };
    let spec = GrammarSpec::JsonSchema(schema);
    let alone = walk(&compiler.compile(&spec).unwrap());
    let text = m.tokenizer.detokenize(&alone, false, false).unwrap();
    let doc: Json = serde_json::from_slice(&text).unwrap();
    assert!(doc["a"].is_string() && doc["b"].is_u64(), "{doc}");
    let shared = compiler.compile(&spec).unwrap();
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..2)
            .map(|_| {
                s.spawn(|| {
                    let own = compiler.compile(&spec).unwrap();
                    (walk(&own), walk(&shared))
                })
            })
            .collect();
        for h in handles {
            assert_eq!(h.join().unwrap(), (alone.clone(), alone.clone()));
        }
    });
}
