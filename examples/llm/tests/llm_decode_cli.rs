//! The `llm-decode` binary end to end on the committed tiny qwen2 model: llama.cpp's prompt ids
//! and greedy tokens (from the forward-pass fixtures), `-n 0`, `--tokenize`, `--perplexity`
//! (llama-perplexity's scoring and every token's) with `--dump-logits`, and one-line errors.

mod common;

use std::process::Output;

use serde_json::Value as Json;

fn llm_decode(args: &[&str]) -> Output {
    common::llm_decode()
        .args(args)
        .output()
        .expect("llm-decode runs")
}

fn tiny() -> String {
    common::fixtures()
        .join("llm/tiny-qwen2.gguf")
        .to_string_lossy()
        .into_owned()
}

/// The first prompt of the tiny-qwen2 fixture: its text, llama.cpp's prompt ids, and the
/// ids llama.cpp generated greedily.
fn fixture_prompt(i: usize) -> (String, Vec<u64>, Vec<u64>) {
    let doc: Json = serde_json::from_slice(
        &std::fs::read(common::fixtures().join("llm/tiny-qwen2.json")).unwrap(),
    )
    .unwrap();
    let p = &doc["prompts"][i];
    let ids: Vec<u64> = p["ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect();
    let n = p["n_prompt"].as_u64().unwrap() as usize;
    (
        p["text"].as_str().unwrap().to_string(),
        ids[..n].to_vec(),
        ids[n..].to_vec(),
    )
}

fn json_out(o: &Output) -> Json {
    assert!(
        o.status.success(),
        "llm-decode failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    serde_json::from_slice(&o.stdout).unwrap()
}

fn ids(v: &Json) -> Vec<u64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap())
        .collect()
}

#[test]
fn greedy_generation_reproduces_llama_cpp() {
    for i in [0, 1, 2] {
        let (text, prompt_ids, gen_ids) = fixture_prompt(i);
        let o = llm_decode(&[
            "-m",
            &tiny(),
            "-p",
            &text,
            "-n",
            "20",
            "--temp",
            "0",
            "-t",
            "2",
            "--backend",
            "f32",
            "--json",
        ]);
        let doc = json_out(&o);
        assert_eq!(ids(&doc["prompt_ids"]), prompt_ids, "prompt {i}");
        // llama.cpp did not stop at end-of-generation tokens; compare up to the first one.
        let got = ids(&doc["generated_ids"]);
        assert!(!got.is_empty() || doc["stats"]["stop"] == "eog");
        assert_eq!(got[..], gen_ids[..got.len()], "prompt {i}");
        if doc["stats"]["stop"] == "n_predict" {
            assert_eq!(got.len(), 20);
        }
        assert_eq!(doc["backend"], "f32");
        assert_eq!(doc["stats"]["cache_type"], "f32", "the default cache");
        assert!(doc["prefill_tok_s"].as_f64().unwrap() > 0.0);
        for key in ["text", "decode_tok_s", "stats"] {
            assert!(doc.get(key).is_some(), "missing {key}");
        }
    }
}

#[test]
fn an_f16_cache_is_reported_and_an_unknown_type_refused() {
    let doc = json_out(&llm_decode(&[
        "-m",
        &tiny(),
        "-p",
        "hello world",
        "-n",
        "4",
        "--cache-type",
        "f16",
        "--json",
    ]));
    assert_eq!(doc["stats"]["cache_type"], "f16");
    let n = ids(&doc["generated_ids"]).len();
    assert!(
        n == 4 || (n < 4 && doc["stats"]["stop"] == "eog"),
        "{n} tokens"
    );
    let o = llm_decode(&["-m", &tiny(), "-p", "x", "--cache-type", "q8"]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("cache-type"));
}

#[test]
fn n_zero_only_evaluates_the_prompt() {
    let o = llm_decode(&["-m", &tiny(), "-p", "hello world", "-n", "0", "--json"]);
    let doc = json_out(&o);
    assert!(ids(&doc["generated_ids"]).is_empty());
    assert_eq!(doc["text"], "");
    assert_eq!(
        doc["stats"]["prompt_tokens"].as_u64(),
        Some(ids(&doc["prompt_ids"]).len() as u64)
    );
}

/// `-c` bounds the sequence: generation that fills it stops with `stop: context` after exactly
/// `c - prompt + 1` tokens (the last one decided from position `c - 1`'s logits, never fed); 0
/// is the trained context; beyond it is refused with both numbers.
#[test]
fn ctx_size_bounds_the_context() {
    let o = llm_decode(&[
        "-m",
        &tiny(),
        "-p",
        "hello world",
        "-n",
        "100",
        "--temp",
        "0",
        "-c",
        "12",
        "--json",
    ]);
    let doc = json_out(&o);
    let prompt = ids(&doc["prompt_ids"]).len();
    assert_eq!(doc["stats"]["stop"], "context");
    assert_eq!(doc["stats"]["n_ctx"], 12);
    assert_eq!(ids(&doc["generated_ids"]).len(), 12 - prompt + 1);
    let trained = doc["stats"]["n_ctx_train"].as_u64().unwrap();
    let o = llm_decode(&["-m", &tiny(), "-p", "hi", "-n", "0", "-c", "0", "--json"]);
    assert_eq!(json_out(&o)["stats"]["n_ctx"], trained);
    // The default: 4096, or the trained context if shorter (512 here).
    let o = llm_decode(&["-m", &tiny(), "-p", "hi", "-n", "0", "--json"]);
    assert_eq!(json_out(&o)["stats"]["n_ctx"], trained.min(4096));
    let over = (trained + 1).to_string();
    one_line_error(
        &llm_decode(&["-m", &tiny(), "-p", "hi", "-c", &over]),
        &format!("context size {over} exceeds the model's trained context of {trained}"),
    );
}

#[test]
fn streamed_text_is_prompt_then_generation() {
    let (text, _, _) = fixture_prompt(0);
    let o = llm_decode(&[
        "-m",
        &tiny(),
        "-p",
        &text,
        "-n",
        "8",
        "--temp",
        "0",
        "--seed",
        "1",
    ]);
    assert!(o.status.success());
    let out = String::from_utf8(o.stdout).unwrap();
    assert!(out.starts_with(&text), "{out:?}");
    let err = String::from_utf8(o.stderr).unwrap();
    assert!(
        err.contains("prompt:") && err.contains("tok/s") && err.contains("load"),
        "{err}"
    );
}

#[test]
fn seeded_sampling_reproduces() {
    let run = || {
        json_out(&llm_decode(&[
            "-m",
            &tiny(),
            "-p",
            "the world",
            "-n",
            "12",
            "--seed",
            "99",
            "--temp",
            "1.5",
            "--json",
        ]))["generated_ids"]
            .clone()
    };
    assert_eq!(run(), run());
}

#[test]
fn tokenize_prints_llama_cpp_ids() {
    let (text, prompt_ids, _) = fixture_prompt(1);
    let doc = json_out(&llm_decode(&[
        "-m",
        &tiny(),
        "-p",
        &text,
        "--tokenize",
        "--json",
    ]));
    assert_eq!(ids(&doc), prompt_ids);
}

/// The mean, `llama-perplexity`'s `±` and the running perplexities after each chunk of the
/// negative log-likelihoods `v` of the scored tokens, `per_chunk` to a chunk.
fn llama_perplexity_summary(v: &[f64], per_chunk: usize) -> (f64, f64, Vec<f64>) {
    let n = v.len() as f64;
    let mean = v.iter().sum::<f64>() / n;
    let mean2 = v.iter().map(|x| x * x).sum::<f64>() / n;
    let error = mean.exp() * ((mean2 - mean * mean) / (n - 1.0)).sqrt();
    let running = (1..=v.len() / per_chunk)
        .map(|c| {
            let s = &v[..c * per_chunk];
            (s.iter().sum::<f64>() / s.len() as f64).exp()
        })
        .collect();
    (mean, error, running)
}

/// The negative log-likelihood of `token` under the logits `row`.
fn nll(row: &[f32], token: u64) -> f64 {
    let lse = row.iter().map(|&v| f64::from(v).exp()).sum::<f64>().ln();
    lse - f64::from(row[token as usize])
}

fn dumped_rows(path: &std::path::Path) -> Vec<f32> {
    std::fs::read(path)
        .unwrap()
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

/// `--perplexity` by default scores as llama-perplexity: chunks of `-c` tokens, the second half
/// of each (positions 8..15 of a 16-token chunk predict tokens 9..16), reported with its `±`
/// and the running values; the dumped rows are the scored positions' logits.
#[test]
fn perplexity_scores_the_second_half_of_each_chunk() {
    let dir = std::env::temp_dir().join(format!("llm-decode-ppl2-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let text = common::fixtures().join("text/eval_english.txt");
    let text = text.to_str().unwrap();
    let dump = dir.join("logits.bin");
    let doc = json_out(&llm_decode(&[
        "-m",
        &tiny(),
        "--perplexity",
        text,
        "-c",
        "16",
        "--chunks",
        "3",
        "--dump-logits",
        dump.to_str().unwrap(),
        "--json",
        "-b",
        "5",
    ]));
    assert_eq!(doc["scoring"], "second-half");
    assert_eq!(doc["n_ctx"], 16);
    assert_eq!(doc["chunks"], 3);
    assert_eq!(doc["n_scored"], 3 * 7);
    let token_ids = ids(&json_out(&llm_decode(&[
        "-m",
        &tiny(),
        "-f",
        text,
        "--tokenize",
        "--json",
    ])));
    assert_eq!(doc["n_tokens"].as_u64().unwrap() as usize, token_ids.len());
    let rows = dumped_rows(&dump);
    let n_vocab = rows.len() / 21;
    assert_eq!(rows.len(), n_vocab * 21);
    // The tiny vocabulary adds no BOS: chunk c is tokens 16c..16c+16 as they are.
    let mut scored = rows.chunks_exact(n_vocab);
    let mut v = Vec::new();
    for c in 0..3 {
        for p in 8..15 {
            v.push(nll(scored.next().unwrap(), token_ids[16 * c + p + 1]));
        }
    }
    let (mean, error, running) = llama_perplexity_summary(&v, 7);
    assert!((doc["nll"].as_f64().unwrap() - mean).abs() < 1e-9, "{doc}");
    assert!((doc["ppl"].as_f64().unwrap() - mean.exp()).abs() < 1e-9 * mean.exp());
    assert!((doc["ppl_error"].as_f64().unwrap() - error).abs() < 1e-9 * error);
    for (got, want) in doc["running"].as_array().unwrap().iter().zip(&running) {
        assert!((got.as_f64().unwrap() - want).abs() < 1e-9 * want, "{doc}");
    }
    assert_eq!(doc["running"].as_array().unwrap().len(), 3);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Without `-c`, `--perplexity` takes llama-perplexity's chunks of 512, not `llm-decode`'s
/// default context (tiny-qwen3 is trained for 1024).
#[test]
fn perplexity_chunks_default_to_512() {
    let model = common::fixtures().join("llm/tiny-qwen3.gguf");
    let text = common::fixtures().join("text/eval_english.txt");
    for (ctx, want) in [(None, 512), (Some("0"), 1024), (Some("256"), 256)] {
        let mut args = vec![
            "-m",
            model.to_str().unwrap(),
            "--perplexity",
            text.to_str().unwrap(),
            "--chunks",
            "1",
            "--json",
        ];
        if let Some(c) = ctx {
            args.extend(["-c", c]);
        }
        let doc = json_out(&llm_decode(&args));
        assert_eq!(doc["n_ctx"], want, "-c {ctx:?}");
        assert_eq!(doc["n_scored"], want - want / 2 - 1, "-c {ctx:?}");
    }
}

/// `--perplexity-scoring every-token` scores every token but the first (one window: the text
/// is shorter than the context).
#[test]
fn every_token_perplexity_matches_the_dumped_logits() {
    let dir = std::env::temp_dir().join(format!("llm-decode-ppl-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let text_path = dir.join("text.txt");
    std::fs::write(
        &text_path,
        "The theory of the world is in the art of the sea, and the rest.",
    )
    .unwrap();
    let dump = dir.join("logits.bin");
    let doc = json_out(&llm_decode(&[
        "-m",
        &tiny(),
        "--perplexity",
        text_path.to_str().unwrap(),
        "--perplexity-scoring",
        "every-token",
        "--dump-logits",
        dump.to_str().unwrap(),
        "--json",
        "-b",
        "7",
    ]));
    assert_eq!(doc["scoring"], "every-token");
    assert_eq!(doc["chunks"], 1);
    let n_tokens = doc["n_tokens"].as_u64().unwrap() as usize;
    assert_eq!(doc["n_scored"].as_u64().unwrap() as usize, n_tokens - 1);
    let token_ids = ids(&json_out(&llm_decode(&[
        "-m",
        &tiny(),
        "-f",
        text_path.to_str().unwrap(),
        "--tokenize",
        "--json",
    ])));
    assert_eq!(token_ids.len(), n_tokens);
    let rows = dumped_rows(&dump);
    let n_vocab = rows.len() / (n_tokens - 1);
    assert_eq!(rows.len(), n_vocab * (n_tokens - 1));
    let v: Vec<f64> = rows
        .chunks_exact(n_vocab)
        .enumerate()
        .map(|(r, row)| nll(row, token_ids[r + 1]))
        .collect();
    let (mean, error, _) = llama_perplexity_summary(&v, v.len());
    assert!(
        (mean - doc["nll"].as_f64().unwrap()).abs() < 1e-9,
        "{mean} vs {doc}"
    );
    assert!((doc["ppl"].as_f64().unwrap() - mean.exp()).abs() < 1e-9 * mean.exp());
    assert!((doc["ppl_error"].as_f64().unwrap() - error).abs() < 1e-9 * error);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The perplexity flags are refused where they would be ignored (without `--perplexity`), and
/// `--chunks 0`.
#[test]
fn perplexity_flags_are_refused_without_perplexity() {
    let model = tiny();
    for (args, flag) in [
        (&["-p", "x", "--chunks", "2"][..], "--chunks"),
        (
            &["-p", "x", "--perplexity-scoring", "every-token"],
            "--perplexity-scoring",
        ),
        (&["--perplexity", "t.txt", "--chunks", "0"], "--chunks"),
    ] {
        let o = common::llm_decode()
            .args(["-m", &model])
            .args(args)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(flag), "{args:?}: {err}");
    }
}

/// The NPU engine's flags are refused on the f32 backend, which would ignore them; on the
/// emulator `--npu-experts` loads (the demo model has no experts to place).
#[test]
fn npu_and_weight_format_flags_are_refused_on_the_f32_backend() {
    let model = tiny();
    for (flag, value) in [
        ("--npu-experts", Some("split")),
        ("--npu-cores", Some("2")),
        ("--npu-max-n", Some("4096")),
        ("--npu-domain-mib", Some("64")),
        ("--npu-no-shared-io", None),
        ("--wtype", Some("f16")),
        ("--residual", Some("all")),
        ("--no-rotation", None),
        ("--rotation-seed", Some("3")),
        ("--int4-group", Some("32")),
    ] {
        let mut args = vec!["-m", &model, "-p", "x", "-n", "1", "--backend", "f32", flag];
        args.extend(value);
        one_line_error(&llm_decode(&args), flag);
        let o = llm_decode(&args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains("--backend f32"), "{err}");
    }
    let o = llm_decode(&[
        "-m",
        &model,
        "-p",
        "x",
        "-n",
        "1",
        "--backend",
        "emulator",
        "--npu-experts",
        "split",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

/// `--int4-group` needs `--wtype w4a16` (per-group scales are applied to the NPU's float C):
/// with another format, or none, it is refused in one line naming the flag and the rule.
#[test]
fn int4_group_is_refused_without_w4a16() {
    let model = tiny();
    for wtype in [None, Some("w8a8"), Some("w4a8"), Some("f16")] {
        let mut args = vec!["-m", &model, "-p", "x", "-n", "1", "--backend", "emulator"];
        args.extend(["--platform", "rk3576", "--int4-group", "32"]);
        if let Some(w) = wtype {
            args.extend(["--wtype", w]);
        }
        let o = llm_decode(&args);
        one_line_error(&o, "--int4-group");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains("needs --wtype w4a16"), "{wtype:?}: {err}");
    }
}

fn one_line_error(o: &Output, needle: &str) {
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains(needle), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn errors_are_one_line() {
    one_line_error(
        &llm_decode(&["-m", "/nonexistent/model.gguf", "-p", "x"]),
        "cannot read /nonexistent/model.gguf",
    );
    let arch = common::fixtures().join("gguf/all_types.gguf");
    one_line_error(
        &llm_decode(&["-m", arch.to_str().unwrap(), "-p", "x"]),
        "unsupported architecture \"testarch\"",
    );
    // No NPU here (and no RKNN_RUNTIME_PATH pointing at the drop-in library).
    if std::env::var_os("RKNN_RUNTIME_PATH").is_none() {
        one_line_error(
            &llm_decode(&["-m", &tiny(), "-p", "x", "--backend", "npu"]),
            "no usable NPU",
        );
    }
    // The tiny model's context is 512 tokens.
    let long = "abc ".repeat(400);
    one_line_error(
        &llm_decode(&["-m", &tiny(), "-p", &long, "-n", "1"]),
        "context overflow",
    );
    one_line_error(&llm_decode(&["-m", &tiny()]), "no prompt");
    // llama-perplexity's scoring needs two chunks of text, and two scored tokens a chunk.
    let dir = std::env::temp_dir().join(format!("llm-decode-ppl-err-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let short = dir.join("short.txt");
    std::fs::write(&short, "abc ".repeat(20)).unwrap();
    let short = short.to_str().unwrap();
    one_line_error(
        &llm_decode(&["-m", &tiny(), "--perplexity", short]),
        "second-half perplexity with a context of 512 needs at least 1024 tokens; the text has",
    );
    one_line_error(
        &llm_decode(&["-m", &tiny(), "--perplexity", short, "-c", "2"]),
        "second-half perplexity needs a context of at least 3 positions, not 2",
    );
    std::fs::remove_dir_all(&dir).unwrap();
    let not_gguf = common::fixtures().join("llm/tiny-qwen2.json");
    one_line_error(
        &llm_decode(&["-m", not_gguf.to_str().unwrap(), "-p", "x"]),
        "not a GGUF file",
    );
}

/// `scripts/demo.sh`'s default question, read from the script so the two cannot drift apart,
/// answered by the demo model on the default (NPU) path as the demo runs it: the answer is
/// right ("Paris"), not merely fluent.
#[test]
fn the_demo_question_gets_the_right_answer() {
    let Some(model) = common::demo_model_forward() else {
        return;
    };
    let script = std::fs::read_to_string(common::workspace_root().join("scripts/demo.sh")).unwrap();
    let question = script
        .lines()
        .find_map(|l| l.strip_prefix("question=\""))
        .and_then(|l| l.strip_suffix('"'))
        .expect("demo.sh sets question=\"...\"");
    let system = script
        .split("--system \"")
        .nth(1)
        .and_then(|s| s.split('"').next())
        .expect("demo.sh passes --system");
    let o = llm_decode(&[
        "-m",
        model.to_str().unwrap(),
        "--system",
        system,
        "-p",
        question,
        "-n",
        "48",
        "--temp",
        "0",
        "--json",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let doc = json_out(&o);
    let text = doc["text"].as_str().unwrap();
    assert_eq!(
        question, "What is the capital of France?",
        "update the expected answer"
    );
    assert!(text.contains("Paris"), "{question} -> {text:?}");
}

/// `llm-decode --kernels` with the kernel variables set as `vars` (every other one removed).
fn kernels(args: &[&str], vars: &[(&str, &str)]) -> Output {
    let mut cmd = common::llm_decode();
    let inherited: Vec<_> = std::env::vars_os()
        .map(|(k, _)| k)
        .filter(|k| k.to_string_lossy().starts_with("RKNN_KERNEL"))
        .collect();
    for v in inherited {
        cmd.env_remove(v);
    }
    let out = cmd
        .arg("--kernels")
        .args(args)
        .envs(vars.iter().copied())
        .output()
        .expect("llm-decode runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

#[test]
fn kernels_reports_the_llm_host_kernels_by_the_one_convention() {
    // No model needed; the same convention as `rknn-info --kernels` (rknn-chip/src/kernel.rs).
    let doc: Json = serde_json::from_slice(&kernels(&["--json"], &[]).stdout).unwrap();
    let llm = &doc[0];
    assert_eq!(llm["component"], "llm");
    assert!(llm["set_by"].is_null(), "{llm}");
    // The default is the fastest this CPU runs: the last available.
    assert_eq!(
        llm["selected"],
        *llm["available"].as_array().unwrap().last().unwrap()
    );
    for (var, set_by) in [
        ("RKNN_KERNEL", "RKNN_KERNEL=scalar"),
        ("RKNN_KERNEL_LLM", "RKNN_KERNEL_LLM=scalar"),
    ] {
        let doc: Json =
            serde_json::from_slice(&kernels(&["--json"], &[(var, "scalar")]).stdout).unwrap();
        assert_eq!(
            (&doc[0]["selected"], &doc[0]["set_by"]),
            (&"scalar".into(), &set_by.into())
        );
        let text = String::from_utf8(kernels(&[], &[(var, "scalar")]).stdout).unwrap();
        assert!(
            text.contains(&format!("  llm: scalar (set by {set_by})")),
            "{text}"
        );
    }
    // Another component's variable leaves this one alone.
    let doc: Json =
        serde_json::from_slice(&kernels(&["--json"], &[("RKNN_KERNEL_GLUE", "scalar")]).stdout)
            .unwrap();
    assert_eq!(doc[0]["selected"], llm["selected"]);
}

/// `--wtype w4a16` and `w4a8` are RK3576's int4 formats: on RK3588, which has no weight-only
/// int4, each is a one-line error naming the format and the chip, with the capability probe's
/// reason; on RK3576 the tiny model generates with each.
#[test]
fn int4_wtypes_are_refused_on_rk3588_and_run_on_rk3576() {
    let model = tiny();
    for wtype in ["w4a16", "w4a8"] {
        let refused = llm_decode(&[
            "-m",
            &model,
            "-p",
            "x",
            "-n",
            "1",
            "--backend",
            "emulator",
            "--platform",
            "rk3588",
            "--wtype",
            wtype,
        ]);
        let name = wtype.to_uppercase();
        one_line_error(&refused, &format!("{name} is not supported on RK3588"));
        let err = String::from_utf8_lossy(&refused.stderr);
        assert!(err.contains("no weight-only"), "{err}");
        let ran = llm_decode(&[
            "-m",
            &model,
            "-p",
            "x",
            "-n",
            "2",
            "--backend",
            "emulator",
            "--platform",
            "rk3576",
            "--wtype",
            wtype,
            "--no-weight-cache",
            "--json",
        ]);
        assert!(
            ran.status.success(),
            "{}",
            String::from_utf8_lossy(&ran.stderr)
        );
        let v = json_out(&ran);
        assert_eq!(v["stats"]["wtype"], wtype, "{v}");
        assert_eq!(ids(&v["generated_ids"]).len(), 2, "{v}");
    }
}

/// The summary's modelled-speed line names the emulated chip: RK3588's and RK3576's cost models
/// give rates on their own core counts; RK3566 has no cost model, and the line says so instead
/// of printing RK3588 and zeros.
#[test]
fn the_modelled_line_names_the_chip_or_says_it_has_no_cost_model() {
    let model = tiny();
    let run = |platform: &str| {
        let o = llm_decode(&[
            "-m",
            &model,
            "-p",
            "x",
            "-n",
            "2",
            "--backend",
            "emulator",
            "--platform",
            platform,
            "--no-weight-cache",
        ]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8_lossy(&o.stderr).into_owned()
    };
    let rk3588 = run("rk3588");
    assert!(
        rk3588.contains("modelled RK3588 (cost model of the NPU time only, "),
        "{rk3588}"
    );
    let rk3576 = run("rk3576");
    assert!(
        rk3576.contains("modelled RK3576 (cost model of the NPU time only, 2 cores): prefill "),
        "{rk3576}"
    );
    assert!(!rk3576.contains("RK3588"), "{rk3576}");
    assert!(!rk3576.contains(" 0.0 tok/s"), "{rk3576}");
    let rk3566 = run("rk3566");
    assert!(
        rk3566.contains("modelled RK3566: none (the emulator has no cost model of this chip"),
        "{rk3566}"
    );
    assert!(!rk3566.contains("0.0 tok/s"), "{rk3566}");
}
