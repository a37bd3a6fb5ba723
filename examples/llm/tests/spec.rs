//! Speculative decoding is lossless: greedy output with `--spec lookup` is token-identical to
//! greedy output without it, on the f32 path and the NPU path (emulator, and the drop-in
//! library through dlopen), on small random models and on the demo model.

mod common;

use std::path::{Path, PathBuf};

use serde_json::Value as Json;

fn decode(model: &Path, prompt: &Path, extra: &[&str], envs: &[(&str, &Path)]) -> Json {
    let _turn = extra.contains(&"npu").then(|| {
        common::NPU
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    });
    let mut cmd = common::llm_decode();
    cmd.args([
        "-m",
        model.to_str().unwrap(),
        "-f",
        prompt.to_str().unwrap(),
    ])
    .args(["-n", "40", "--temp", "0", "-t", "2", "--json"])
    .args(extra);
    common::run_json(cmd, envs)
}

fn prompts() -> Vec<PathBuf> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("benches/spec_prompts");
    let mut p: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    p.sort();
    p
}

/// Runs every prompt on `model` with and without speculation on each backend, and checks the
/// tokens are identical and that speculation actually drafted and accepted somewhere.
/// A backend's flags and the environment it needs.
type Backend<'a> = (&'a [&'a str], &'a [(&'a str, &'a Path)]);

fn check(model: &Path, backends: &[Backend<'_>]) {
    let mut accepted = 0;
    for prompt in prompts() {
        for (backend, envs) in backends {
            let plain = decode(model, &prompt, backend, envs);
            for draft_max in ["8", "3"] {
                let mut args = backend.to_vec();
                args.extend(["--spec", "lookup", "--draft-max", draft_max]);
                let spec = decode(model, &prompt, &args, envs);
                assert_eq!(
                    plain["generated_ids"],
                    spec["generated_ids"],
                    "{} {} {backend:?} draft {draft_max}",
                    model.display(),
                    prompt.display()
                );
                assert_eq!(plain["text"], spec["text"]);
                let s = &spec["stats"]["spec"];
                accepted += s["accepted"].as_u64().unwrap();
                assert!(s["accepted"].as_u64() <= s["drafted"].as_u64());
            }
        }
    }
    assert!(
        accepted > 0,
        "{}: no drafted token was ever accepted",
        model.display()
    );
}

#[test]
fn lookup_is_lossless_on_small_random_models() {
    let lib = common::dropin();
    let npu: &[(&str, &Path)] = &[("RKNN_RUNTIME_PATH", &lib)];
    for name in ["tiny-qwen2.gguf", "tiny-llama.gguf"] {
        let model = common::fixtures().join("llm").join(name);
        check(
            &model,
            &[
                (&["--backend", "f32"], &[]),
                (&["--backend", "emulator"], &[]),
                (&["--backend", "emulator", "--cache-type", "f16"], &[]),
                (&["--backend", "npu", "--platform", "rk3588"], npu),
            ],
        );
    }
}

#[test]
fn lookup_is_lossless_on_the_demo_model() {
    let Some(model) = common::demo_model_forward() else {
        return;
    };
    let lib = common::dropin();
    let npu: &[(&str, &Path)] = &[("RKNN_RUNTIME_PATH", &lib)];
    check(
        &model,
        &[
            (&["--backend", "emulator"], &[]),
            (&["--backend", "npu", "--platform", "rk3588"], npu),
        ],
    );
}

#[test]
fn sampling_with_lookup_runs_and_reports_its_counts() {
    let model = common::fixtures().join("llm/tiny-qwen2.gguf");
    let prompt = prompts().remove(0);
    let args = [
        "--backend",
        "emulator",
        "--spec",
        "lookup",
        "--temp",
        "0.8",
        "--seed",
        "5",
    ];
    let d = decode(&model, &prompt, &args, &[]);
    let s = &d["stats"]["spec"];
    assert_eq!(s["mode"], "lookup");
    assert!(s["tokens_per_pass"].as_f64().unwrap() >= 1.0);
    let again = decode(&model, &prompt, &args, &[]);
    assert_eq!(
        d["generated_ids"], again["generated_ids"],
        "reproducible with a seed"
    );
}

/// A chat turn that ends on an accepted draft has already fed its last token; the next turn
/// must not feed it again. Each turn's line reports the context length, which must be the
/// same with and without speculation (an earlier version fed such a token twice: 87 positions
/// against 86 after this first turn), and so must the replies.
#[test]
fn chat_turns_hold_the_same_context_with_and_without_lookup() {
    use std::io::Write;
    let Some(model) = common::demo_model_forward() else {
        return;
    };
    let input = "Copy this line exactly, nothing else: apples, bread, cheese, dates, eggs, flour, \
                 grapes, honey, ice cream, jam, kiwis, lemons, milk, noodles, oats, pears.\n\
                 Thanks. Now say it once more.\n";
    let chat = |spec: &str| {
        let mut cmd = common::llm_decode();
        cmd.args([
            "-m",
            model.to_str().unwrap(),
            "--chat",
            "-n",
            "13",
            "--temp",
            "0",
        ])
        .args(["-t", "2", "--backend", "emulator", "--spec", spec])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
        let mut child = cmd.spawn().unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(input.as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let err = String::from_utf8(out.stderr).unwrap();
        let contexts: Vec<String> = err
            .split("context ")
            .skip(1)
            .map(|s| s.split('/').next().unwrap().to_string())
            .collect();
        (String::from_utf8(out.stdout).unwrap(), contexts, err)
    };
    let (plain, plain_ctx, _) = chat("none");
    let (spec, spec_ctx, err) = chat("lookup");
    assert_eq!(plain_ctx.len(), 2, "two turns: {plain_ctx:?}");
    assert_eq!(spec_ctx, plain_ctx, "{err}");
    assert_eq!(spec, plain);
}

/// A tiny fixture loaded on `backend` (no weight cache), its context `n_ctx`.
fn load_tiny(name: &str, backend: rknn_llm::Backend) -> rknn_llm::LoadedModel {
    rknn_llm::Model::builder(common::fixtures().join(format!("llm/{name}.gguf")))
        .backend(backend)
        .threads(1)
        .context(256)
        .no_weight_cache()
        .load()
        .unwrap()
}

fn greedy() -> rknn_llm::sample::SamplerConfig {
    rknn_llm::sample::SamplerConfig {
        temperature: 0.0,
        ..Default::default()
    }
}

/// Generates `n` tokens after `prompt` in `session` (reset first).
fn gen_ids(
    session: &mut rknn_llm::session::Session,
    prompt: &[u32],
    n: usize,
    lookup: bool,
) -> (Vec<u32>, rknn_llm::spec::SpecStats) {
    use rknn_llm::session::GenerateParams;
    session.reset();
    let params = GenerateParams {
        max_tokens: Some(n),
        lookup: lookup.then(rknn_llm::spec::PromptLookup::default),
        batch: 7,
        ..GenerateParams::default()
    };
    let out = session
        .generate_tokens(prompt, &params)
        .unwrap()
        .finish()
        .unwrap();
    (out.generated, out.spec)
}

/// Greedy output with a draft model is the target's own, token for token, whatever the draft:
/// itself (every draft accepted), another family's random weights (most rejected: the
/// replacement path), a draft with sliding-window layers (its cache cut back after
/// rejections), each at several draft lengths and composed with prompt lookup; on the f32
/// path and the emulator.
#[test]
fn a_draft_model_is_lossless_with_greedy_decoding() {
    use rknn_llm::Backend;
    for backend in [Backend::F32, Backend::Emulator] {
        let _npu = (backend == Backend::Emulator).then(|| {
            common::NPU
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
        });
        let target = load_tiny("tiny-qwen3", backend);
        let prompts: Vec<Vec<u32>> = [
            "The quick brown fox",
            "Once upon a time, in a small village, a a a",
        ]
        .iter()
        .map(|p| target.tokenizer.encode(p, true, false).unwrap())
        .collect();
        let mut plain = target.session(greedy()).unwrap();
        let want: Vec<Vec<u32>> = prompts
            .iter()
            .map(|p| gen_ids(&mut plain, p, 40, false).0)
            .collect();
        for draft_name in ["tiny-qwen3", "tiny-qwen2", "tiny-gemma3"] {
            let draft = load_tiny(draft_name, backend);
            let (mut drafted, mut accepted) = (0, 0);
            for max in [1, 3, 8] {
                for lookup in [false, true] {
                    let mut s = target.session(greedy()).unwrap();
                    s.set_draft(Some(draft.draft_for(&target, max, 0.0).unwrap()));
                    for (p, want) in prompts.iter().zip(&want) {
                        let (got, stats) = gen_ids(&mut s, p, 40, lookup);
                        assert_eq!(
                            &got, want,
                            "{backend:?} draft {draft_name} max {max} lookup {lookup}"
                        );
                        assert!(stats.model_accepted <= stats.model_drafted);
                        assert!(stats.model_drafted <= stats.drafted);
                        assert!(stats.draft_forwards > 0, "the draft model ran");
                        drafted += stats.model_drafted;
                        accepted += stats.model_accepted;
                    }
                }
            }
            assert!(drafted > 0);
            if draft_name == "tiny-qwen3" {
                assert_eq!(
                    accepted, drafted,
                    "a model drafting for itself is always right"
                );
            } else {
                assert!(
                    accepted < drafted,
                    "{draft_name}: random weights should miss somewhere"
                );
            }
        }
    }
}

/// Sampled output with a draft model is distributed as the target's: the second generated
/// token (the first a draft proposes) over 3000 seeds, against its exact marginal
/// `Σ_a p(a | prompt) p(b | prompt, a)` from the target's own logits (temperature 1, no
/// top-k/top-p: the softmax), by a chi-square test at the 0.1 % level. The draft (another
/// family's random weights) disagrees with the target often, so the rejection rule's
/// replacement draw carries much of the mass.
#[test]
fn a_draft_model_keeps_the_sampled_distribution() {
    use rknn_llm::Backend;
    use rknn_llm::model::{CacheType, Logits};
    let target = load_tiny("tiny-qwen3", Backend::F32);
    let draft = load_tiny("tiny-qwen2", Backend::F32);
    let prompt = target
        .tokenizer
        .encode("Once upon a time", true, false)
        .unwrap();
    let model = &target.model;
    let n_vocab = model.config().n_vocab;
    let softmax = |row: &[f32]| -> Vec<f64> {
        let m = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let e: Vec<f64> = row.iter().map(|&x| f64::from(x - m).exp()).collect();
        let s: f64 = e.iter().sum();
        e.into_iter().map(|x| x / s).collect()
    };
    // The exact marginal of the second token, given a first that does not end the
    // generation; every end-of-generation token is one bin (the generation ends without it).
    let eog = |t: usize| target.tokenizer.is_eog(t as u32);
    let bin = |t: usize| if eog(t) { n_vocab } else { t };
    let mut seq = model.sequence(CacheType::F32);
    let first = softmax(model.forward(&mut seq, &prompt, 0, Logits::Last).unwrap());
    let mut second = vec![0.0f64; n_vocab + 1];
    let going: f64 = (0..n_vocab).filter(|&a| !eog(a)).map(|a| first[a]).sum();
    for (a, &pa) in first.iter().enumerate().filter(|&(a, _)| !eog(a)) {
        let row = model
            .forward(&mut seq, &[a as u32], prompt.len(), Logits::Last)
            .unwrap();
        for (b, pb) in softmax(row).into_iter().enumerate() {
            second[bin(b)] += pa / going * pb;
        }
    }
    let runs = 3000;
    let mut counts = vec![0usize; n_vocab + 1];
    let (mut drafted, mut accepted) = (0, 0);
    for seed in 0..runs {
        let mut s = target
            .session(rknn_llm::sample::SamplerConfig {
                temperature: 1.0,
                top_k: 0,
                top_p: 1.0,
                seed: seed as u64 + 1,
                ..Default::default()
            })
            .unwrap();
        s.set_draft(Some(draft.draft_for(&target, 2, 0.0).unwrap()));
        let (got, stats) = gen_ids(&mut s, &prompt, 2, false);
        match got.len() {
            0 => continue, // the first token ended it
            1 => counts[n_vocab] += 1,
            _ => counts[got[1] as usize] += 1,
        }
        drafted += stats.model_drafted;
        accepted += stats.model_accepted;
    }
    let n: usize = counts.iter().sum();
    assert!(
        n > runs * 9 / 10 && drafted >= n,
        "{n} runs went on, {drafted} drafted"
    );
    assert!(
        accepted > 0 && accepted < drafted,
        "{accepted} of {drafted}"
    );
    // Bins of expected count >= 5, the rest pooled.
    let (mut chi2, mut bins) = (0.0, 0usize);
    let (mut pool_e, mut pool_o) = (0.0, 0.0);
    for (p, &o) in second.iter().zip(&counts) {
        let e = p * n as f64;
        if e >= 5.0 {
            chi2 += (o as f64 - e).powi(2) / e;
            bins += 1;
        } else {
            pool_e += e;
            pool_o += o as f64;
        }
    }
    if pool_e > 0.0 {
        chi2 += (pool_o - pool_e).powi(2) / pool_e;
        bins += 1;
    }
    // The 99.9 % quantile of chi-square with k degrees of freedom (Wilson–Hilferty).
    let k = (bins - 1) as f64;
    let z = 3.0902;
    let limit = k * (1.0 - 2.0 / (9.0 * k) + z * (2.0 / (9.0 * k)).sqrt()).powi(3);
    assert!(
        chi2 < limit,
        "chi-square {chi2:.1} over {bins} bins, limit {limit:.1}"
    );
}

/// A draft of another vocabulary is refused with the rule it breaks, by the library and by
/// `llm-decode -md` (llama.cpp's spelling), before anything is generated.
#[test]
fn a_draft_of_another_vocabulary_is_refused() {
    use rknn_llm::Backend;
    use rknn_llm::spec::DraftError;
    let target = load_tiny("tiny-qwen3", Backend::F32);
    let other_eos = load_tiny("tiny-llama", Backend::F32);
    match other_eos.draft_for(&target, 4, 0.0) {
        Err(DraftError::Special { which: "EOS", .. }) => {}
        r => panic!("expected the EOS mismatch, got {r:?}"),
    }
    let dir = common::fixtures().join("llm");
    let mut cases = vec![
        (dir.join("tiny-llama.gguf"), "0", "EOS token"),
        (dir.join("tiny-qwen3.gguf"), "1.5", "between 0 and 1"),
    ];
    if let Some(demo) = common::demo_model_forward() {
        cases.push((
            demo,
            "0",
            "the draft model's vocabulary has 49152 tokens, the target's 307",
        ));
    }
    for (draft, p_min, rule) in cases {
        let mut cmd = common::llm_decode();
        cmd.args(["-m", dir.join("tiny-qwen3.gguf").to_str().unwrap()])
            .args(["-md", draft.to_str().unwrap(), "--draft-p-min", p_min])
            .args([
                "-p",
                "hello",
                "-n",
                "4",
                "--backend",
                "f32",
                "--no-weight-cache",
            ]);
        let out = cmd.output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{err}");
        assert!(err.contains("--model-draft") && err.contains(rule), "{err}");
    }
}

/// One `DraftModel` (and the models behind it) shared by sessions on four threads at once,
/// each drafting for its own prompt: every thread's greedy output is the model's alone.
#[test]
fn one_draft_model_serves_sessions_on_several_threads() {
    use rknn_llm::Backend;
    let target = load_tiny("tiny-qwen3", Backend::F32);
    let draft = load_tiny("tiny-qwen2", Backend::F32)
        .draft_for(&target, 4, 0.0)
        .unwrap();
    let prompts: Vec<Vec<u32>> = (0..4)
        .map(|i| {
            let text = format!("Story {i}: once upon a time a fox");
            target.tokenizer.encode(&text, true, false).unwrap()
        })
        .collect();
    let mut plain = target.session(greedy()).unwrap();
    let want: Vec<Vec<u32>> = prompts
        .iter()
        .map(|p| gen_ids(&mut plain, p, 32, false).0)
        .collect();
    let got: Vec<(Vec<u32>, usize)> = std::thread::scope(|scope| {
        let handles: Vec<_> = prompts
            .iter()
            .map(|p| {
                let (target, draft) = (&target, draft.clone());
                scope.spawn(move || {
                    let mut s = target.session(greedy()).unwrap();
                    s.set_draft(Some(draft));
                    let (ids, stats) = gen_ids(&mut s, p, 32, false);
                    (ids, stats.model_drafted)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for ((ids, drafted), want) in got.iter().zip(&want) {
        assert_eq!(ids, want);
        assert!(*drafted > 0);
    }
}
