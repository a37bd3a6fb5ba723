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
