//! The LLM on the NPU path: the same engine on the emulator and through the dlopen'd drop-in
//! library gives the same tokens; W8A8 stays within issue 14's accuracy bar against the f32
//! path on ordinary English text; the NPU path is batch invariant too.

mod common;

use std::path::Path;
use std::sync::Arc;

use rknn_llm::gguf::GgufFile;
use rknn_llm::model::{Config, EngineFactory, EngineOptions, HostF32Factory, Logits, Model};
use rknn_llm::tokenizer::Tokenizer;
use rknn_matmul::engine::{Engine, EngineConfig, WeightFormat};
use rknn_matmul::{Platform, Runtime};
use serde_json::Value as Json;

fn pool(threads: usize) -> Arc<rayon::ThreadPool> {
    Arc::new(
        rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap(),
    )
}

fn engine_on(platform: Platform) -> Engine {
    let rt = Runtime::emulator(platform).unwrap();
    Engine::new(&rt, EngineConfig::default()).unwrap()
}

fn npu_model(file: &GgufFile, opts: EngineOptions) -> common::Run {
    npu_model_on(file, opts, Platform::Rk3588)
}

fn npu_model_on(file: &GgufFile, opts: EngineOptions, platform: Platform) -> common::Run {
    let p = pool(2);
    common::Run::new(
        Model::load(
            file,
            &mut EngineFactory::new(engine_on(platform), opts),
            p,
            &mut |_, _| {},
        )
        .unwrap(),
    )
}

fn f32_model(file: &GgufFile) -> common::Run {
    let p = pool(2);
    common::Run::new(
        Model::load(file, &mut HostF32Factory::new(p.clone()), p, &mut |_, _| {}).unwrap(),
    )
}

fn generate(model: &Path, prompt: &str, backend: &[&str], envs: &[(&str, &Path)]) -> Json {
    let mut cmd = common::llm_decode();
    cmd.args([
        "-m",
        model.to_str().unwrap(),
        "-p",
        prompt,
        "-n",
        "24",
        "--temp",
        "0",
    ])
    .args(["-t", "2", "--json"])
    .args(backend);
    common::run_json(cmd, envs)
}

/// `--backend npu` loads the drop-in library with dlopen (the board's code path) and must
/// produce exactly the tokens of `--backend emulator`: the same engine, the same integers.
#[test]
fn the_emulator_and_the_npu_path_give_identical_tokens() {
    let _npu = common::NPU
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    // Every family's tiny model (gemma3's sliding window, phi3's fused tensors, phi3-longrope's
    // LongRoPE and partial rotary, qwen3's head size, smollm3's NoPE layer, granite's scales,
    // gemma2's soft-caps, qwen3moe's, olmoe's and granitemoe's experts (with its shared expert),
    // lfm2's short-convolution layers, lfm2moe's sigmoid-gated experts chosen with a selection
    // bias after a dense layer, qwen35's delta-net layers and gated attention; llama is the
    // demo model's family).
    // The demo model goes through the drop-in in the pessimistic test below.
    let models: Vec<_> = [
        "qwen2",
        "qwen3",
        "gemma3",
        "phi3",
        "phi3-longrope",
        "smollm3",
        "granite",
        "gemma2",
        "qwen3moe",
        "olmoe",
        "lfm2",
        "granitemoe",
        "lfm2moe",
        "qwen35",
    ]
    .iter()
    .map(|f| common::fixtures().join(format!("llm/tiny-{f}.gguf")))
    .collect();
    let lib = common::dropin();
    // The two prompts (one of them long enough for two prefill rows of quantisation lanes)
    // alternate over the families: every family once, both prompts on several families.
    let prompts = [
        "The quick brown fox",
        "Once upon a time, in a small village,",
    ];
    for (i, model) in models.iter().enumerate() {
        let prompt = prompts[i % prompts.len()];
        let emu = generate(model, prompt, &["--backend", "emulator"], &[]);
        let npu = generate(
            model,
            prompt,
            &["--backend", "npu", "--platform", "rk3588"],
            &[("RKNN_RUNTIME_PATH", &lib)],
        );
        assert_eq!(emu["backend"], "emulator");
        assert_eq!(npu["backend"], "npu");
        assert_eq!(npu["stats"]["engine"]["hardware"], false);
        assert_eq!(
            emu["generated_ids"],
            npu["generated_ids"],
            "{} / {prompt:?}",
            model.display()
        );
        assert_eq!(emu["stats"]["wtype"], "w8a8");
        // Every phase of the engine is reported; the calling thread waits at most once
        // per round (a forward at these lengths is one round, or two when the lanes
        // quantise a prompt chunk).
        let engine = &emu["stats"]["engine"];
        for phase in ["quantize", "pack", "run", "collect", "wait"] {
            assert!(engine[phase]["count"].is_u64(), "{phase}: {engine}");
            assert!(
                engine[phase]["s"].as_f64().is_some_and(|s| s >= 0.0),
                "{phase}"
            );
        }
        let forwards = engine["forwards"].as_u64().unwrap();
        assert!(forwards > 0 && engine["wait"]["count"].as_u64().unwrap() <= 2 * forwards);
    }
}

/// Every [open] fact the engine relies on answered the pessimistic way (docs/hardware-facts.md):
/// N <= 4096 per context, no memory shared between contexts, native inputs copied at bind,
/// non-coherent caches, a runtime that reports no SDK version through a matmul context. The
/// engine finds the first two out when it starts, through the drop-in (whose settings the safe
/// layer cannot see) and the in-process emulator alike, and the tokens are those of the default
/// run (the demo model through the drop-in: the board's code path). With per-context memories the demo model needs more handles
/// than the default budget of 1020: a one-line error naming `ulimit -n`, not a crash.
#[test]
fn a_pessimistic_board_gives_the_tokens_of_the_default_one() {
    let Some(model) = common::demo_model_forward() else {
        return;
    };
    let _npu = common::NPU
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let lib = common::dropin();
    let prompt = "The capital of France is";
    let want = generate(&model, prompt, &["--backend", "emulator"], &[]);
    assert_eq!(want["stats"]["engine"]["max_n_per_context"], 8192);
    assert_eq!(want["stats"]["engine"]["shares_io_memories"], true);
    let one = Path::new("1");
    let strict: &[(&str, &Path)] = &[("RKNN_EMU_STRICT_RULES", one)];
    let pessimistic: &[(&str, &Path)] = &[
        ("RKNN_RUNTIME_PATH", &lib),
        ("RKNN_EMU_STRICT_RULES", one),
        ("RKNN_EMU_SHARED_MEMORIES", Path::new("refuse")),
        ("RKNN_EMU_NATIVE_INPUTS", Path::new("bind")),
        ("RKNN_EMU_STRICT_CACHE", one),
        ("RKNN_EMU_SDK_VERSION_ON_MATMUL", Path::new("0")),
        ("RKNN_EMU_HANDLE_BUDGET", Path::new("4096")),
        ("RKNN_EMU_LOG", Path::new("0")),
    ];
    let npu = ["--backend", "npu", "--platform", "rk3588"];
    for (what, backend, envs, shared) in [
        (
            "strict rules, in-process",
            &["--backend", "emulator"][..],
            strict,
            true,
        ),
        (
            "strict rules, drop-in",
            &npu[..],
            &[("RKNN_RUNTIME_PATH", &*lib), strict[0]][..],
            true,
        ),
        ("pessimistic drop-in", &npu[..], pessimistic, false),
    ] {
        let got = generate(&model, prompt, backend, envs);
        let engine = &got["stats"]["engine"];
        assert_eq!(engine["max_n_per_context"], 4096, "{what}");
        assert_eq!(engine["shares_io_memories"], shared, "{what}");
        assert_eq!(got["generated_ids"], want["generated_ids"], "{what}");
    }
    // A budget the model fits in with shared memories (about 2 handles per linear and core)
    // but not with per-context ones (6: its 4 linears per layer give 756 handles on 2 cores,
    // 1116 on 3, beyond the 1020 of `ulimit -n 1024`).
    // In-process, the engine knows the budget and refuses the first linear that does not fit
    // before allocating it; through the drop-in the emulator's allocation fails, as the board's
    // would.
    for (backend, needle) in [
        (&["--backend", "emulator"][..], "needs"),
        (&npu[..], "rknn_create_mem"),
    ] {
        let mut cmd = common::llm_decode();
        cmd.args(["-m", model.to_str().unwrap(), "-p", "Hi", "-n", "1"])
            .args(backend)
            .envs(pessimistic[..pessimistic.len() - 2].iter().copied())
            .env("RKNN_EMU_HANDLE_BUDGET", "600")
            .env("RKNN_EMU_LOG", "0");
        let out = cmd.output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{err}");
        let last = err.lines().last().unwrap_or_default();
        assert!(
            last.starts_with("llm-decode: error:")
                && last.contains(needle)
                && last.contains("ulimit -n"),
            "{err}"
        );
        assert!(!err.contains("panicked"), "{err}");
    }
    let shared = generate(
        &model,
        prompt,
        &npu,
        &[
            ("RKNN_RUNTIME_PATH", &lib),
            ("RKNN_EMU_HANDLE_BUDGET", Path::new("600")),
        ],
    );
    assert_eq!(shared["generated_ids"], want["generated_ids"]);
}

#[test]
fn npu_logits_are_bit_identical_for_any_batch_split() {
    for name in [
        "tiny-qwen2",
        "tiny-gemma3",
        "tiny-qwen3moe",
        "tiny-olmoe",
        "tiny-granitemoe",
        "tiny-lfm2moe",
        "tiny-qwen35",
    ] {
        npu_batch_invariance(name);
    }
}

fn npu_batch_invariance(name: &str) {
    let file = GgufFile::open(common::fixtures().join(format!("llm/{name}.gguf"))).unwrap();
    let mut m = npu_model(&file, EngineOptions::default());
    let n_vocab = m.config().n_vocab as u32;
    let mut rng = fastrand::Rng::with_seed(4);
    let tokens: Vec<u32> = (0..37).map(|_| rng.u32(..n_vocab)).collect();
    let mut run = |chunk: usize| -> Vec<u32> {
        m.reset();
        let mut out = Vec::new();
        for (c, part) in tokens.chunks(chunk).enumerate() {
            let l = m.forward(part, c * chunk, Logits::All).unwrap();
            out.extend(l.iter().map(|v| v.to_bits()));
        }
        out
    };
    let alone = run(1);
    for chunk in [2, 3, 8, 37] {
        assert_eq!(run(chunk), alone, "{name} chunk {chunk}");
    }
}

/// `log softmax(row)[i]` in f64.
fn log_prob(row: &[f32], i: usize) -> f64 {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = row
        .iter()
        .map(|&v| (f64::from(v) - f64::from(max)).exp())
        .sum();
    f64::from(row[i]) - f64::from(max) - sum.ln()
}

fn argmax(row: &[f32]) -> usize {
    let mut best = 0;
    for (i, &v) in row.iter().enumerate() {
        if v > row[best] {
            best = i;
        }
    }
    best
}

/// Issue 14's bar: W8A8 on the emulator, teacher-forced over ordinary English text (written for
/// this test, not produced by a model): top-1 agreement with the f32 path >= 96 % and
/// perplexity within 1 % of it.
#[test]
fn w8a8_stays_within_the_accuracy_bar_on_english_text() {
    let Some(path) = common::demo_model_forward() else {
        return;
    };
    w8a8_accuracy(&path, usize::MAX);
}

/// The same bar on Gemma-3-270M (262 144-token head, sliding-window layers), in windows of 1024
/// positions (twice its window of 512), each from an empty cache and beginning with BOS, as
/// llama-perplexity scores (Gemma without its BOS is another model: in a window that began
/// mid-text its activations grew outliers that cost W8A8 1 % of perplexity).
#[test]
fn w8a8_stays_within_the_accuracy_bar_on_gemma3() {
    let Some(path) = common::gemma3_model_forward() else {
        return;
    };
    w8a8_accuracy(&path, 1024);
}

/// Teacher-forced over the committed English text in windows of `window` positions: W8A8 on
/// RK3588 within issue 14's bar.
fn w8a8_accuracy(path: &Path, window: usize) {
    let file = GgufFile::open(path).unwrap();
    // The family's residual policy, as llm-decode takes it by default.
    let family = Config::from_gguf(&file).unwrap().family;
    let (top1, rel) = accuracy(
        path,
        window,
        usize::MAX,
        Platform::Rk3588,
        family.engine_options(),
    );
    assert!(top1 >= 0.96, "top-1 agreement {top1}");
    assert!(rel.abs() <= 0.01, "perplexity {rel:+}");
}

/// Teacher-forced over the committed English text (its first `limit` tokens) in windows of
/// `window` positions, the engine on `platform` with `opts` against the f32 path: (top-1
/// agreement, relative change of perplexity), printed.
fn accuracy(
    path: &Path,
    window: usize,
    limit: usize,
    platform: Platform,
    opts: EngineOptions,
) -> (f64, f64) {
    let file = GgufFile::open(path).unwrap();
    let tok = Tokenizer::from_gguf(&file).unwrap();
    let text = std::fs::read_to_string(common::fixtures().join("text/eval_english.txt")).unwrap();
    let mut all = tok.encode(&text, true, false).unwrap();
    assert!(all.len() >= 1500, "{} tokens", all.len());
    all.truncate(limit);
    // Windows of `window` positions, every one beginning with the text's BOS (if it has one).
    let bos = all[0];
    let has_bos = tok.encode("", true, false).unwrap() == [bos];
    let mut windows: Vec<Vec<u32>> = Vec::new();
    let mut rest = &all[..];
    while rest.len() > 1 {
        let mut w = Vec::with_capacity(window.min(rest.len() + 1));
        if has_bos && !windows.is_empty() {
            w.push(bos);
        }
        let take = (window - w.len()).min(rest.len());
        w.extend_from_slice(&rest[..take]);
        rest = &rest[take..];
        windows.push(w);
    }
    let mut reference = f32_model(&file);
    let mut w8a8 = npu_model_on(&file, opts, platform);
    let n_vocab = reference.config().n_vocab;
    let (mut agree, mut scored) = (0usize, 0usize);
    let (mut nll_ref, mut nll_q) = (0f64, 0f64);
    for ids in &windows {
        reference.reset();
        w8a8.reset();
        for (c, chunk) in ids.chunks(128).enumerate() {
            let pos = c * 128;
            let a = reference.forward(chunk, pos, Logits::All).unwrap().to_vec();
            let b = w8a8.forward(chunk, pos, Logits::All).unwrap();
            for (r, (ra, rb)) in a
                .chunks_exact(n_vocab)
                .zip(b.chunks_exact(n_vocab))
                .enumerate()
            {
                let Some(&next) = ids.get(pos + r + 1) else {
                    continue;
                };
                scored += 1;
                agree += usize::from(argmax(ra) == argmax(rb));
                nll_ref -= log_prob(ra, next as usize);
                nll_q -= log_prob(rb, next as usize);
            }
        }
    }
    let top1 = agree as f64 / scored as f64;
    let (ppl_ref, ppl_q) = (
        (nll_ref / scored as f64).exp(),
        (nll_q / scored as f64).exp(),
    );
    let rel = ppl_q / ppl_ref - 1.0;
    eprintln!(
        "{} {platform} {}{}: {scored} positions: top-1 agreement {:.2} %, perplexity {ppl_q:.3} vs f32 {ppl_ref:.3} ({:+.2} %)",
        path.display(),
        opts.format,
        opts.int4_group
            .map_or(String::new(), |g| format!(" group {g}")),
        100.0 * top1,
        100.0 * rel
    );
    (top1, rel)
}

/// The demo model's linears on all three RK3588 cores fit the handle budget of a board under
/// `ulimit -n 1024` (~1020 dma-buf handles, which the emulator enforces): fused linears and
/// one shared A and C per core.
#[test]
fn the_demo_model_fits_the_handle_budget_on_three_cores() {
    let Some(path) = common::demo_model_forward() else {
        return;
    };
    let file = GgufFile::open(&path).unwrap();
    let rt = Runtime::emulator(Platform::Rk3588).unwrap();
    let cfg = EngineConfig {
        cores: Some(3),
        ..EngineConfig::default()
    };
    let engine = Engine::new(&rt, cfg).unwrap();
    let budget = rt.handle_budget().budget();
    assert!(budget <= 1020);
    let model = Model::load(
        &file,
        &mut EngineFactory::new(engine.clone(), EngineOptions::default()),
        pool(2),
        &mut |_, _| {},
    )
    .unwrap();
    let live = rt.handle_budget().live();
    let contexts = rt.emulator_instance().unwrap().stats().contexts;
    eprintln!("{live} memories + {contexts} contexts of a budget of {budget}");
    assert!(live + contexts <= budget, "{live} + {contexts} > {budget}");
    drop(model);
}

/// A model larger than one IOMMU domain (an 8B model's 7 GiB of W8A8 is two of RK3588's
/// 4 GiB domains) spreads over as many as it needs and gives the logits of one domain: tried
/// at small scale, the tiny model (0.8 MB of NPU memory) over domains of 768 KiB (its head alone needs 0.74 MB with its A and C).
#[test]
fn a_model_spread_over_many_iommu_domains_gives_the_same_logits() {
    let file = GgufFile::open(common::fixtures().join("llm/tiny-llama.gguf")).unwrap();
    let rt = Runtime::emulator(Platform::Rk3588).unwrap();
    let logits = |domain: u64| {
        let cfg = EngineConfig {
            iommu_domain_bytes: domain,
            ..EngineConfig::default()
        };
        let engine = Engine::new(&rt, cfg).unwrap();
        let mut f = EngineFactory::new(engine.clone(), EngineOptions::default());
        let mut run =
            common::Run::new(Model::load(&file, &mut f, pool(2), &mut |_, _| {}).unwrap());
        let out: Vec<u32> = run
            .forward(&[1, 5, 9, 2], 0, Logits::All)
            .unwrap()
            .iter()
            .map(|v| v.to_bits())
            .collect();
        (out, engine.domain_bytes())
    };
    let (one, used_one) = logits(EngineConfig::default().iommu_domain_bytes);
    let (many, used_many) = logits(768 << 10);
    assert_eq!(used_one.len(), 1, "{used_one:?}");
    assert!(used_many.len() > 1, "{used_many:?}");
    assert!(used_many.iter().all(|&b| b <= 768 << 10), "{used_many:?}");
    assert!(used_many.iter().sum::<u64>() >= used_one[0]);
    assert_eq!(one, many);
}

/// A mixture's experts placed whole on one core each (`ExpertPlacement::PerCore`, the default)
/// give the logits of experts split over every core, bit for bit, for a prompt and for decode
/// rows, and hold one context per expert linear instead of one per core holding columns:
/// exactly the planner's difference, counted by the emulator.
#[test]
fn experts_whole_on_one_core_give_the_logits_of_split_experts_with_fewer_contexts() {
    use rknn_chip::ElemKind;
    use rknn_chip::plan::{LinearPlan, SplitRules};
    use rknn_llm::model::ExpertPlacement;
    for name in [
        "tiny-qwen3moe",
        "tiny-olmoe",
        "tiny-granitemoe",
        "tiny-lfm2moe",
    ] {
        let file = GgufFile::open(common::fixtures().join(format!("llm/{name}.gguf"))).unwrap();
        let mut runs = Vec::new();
        for experts in [ExpertPlacement::PerCore, ExpertPlacement::Split] {
            let rt = Runtime::emulator(Platform::Rk3588).unwrap();
            let cfg = EngineConfig {
                cores: Some(3),
                ..EngineConfig::default()
            };
            let engine = Engine::new(&rt, cfg).unwrap();
            let opts = EngineOptions {
                experts,
                ..EngineOptions::default()
            };
            let model = Model::load(
                &file,
                &mut EngineFactory::new(engine.clone(), opts),
                pool(2),
                &mut |_, _| {},
            )
            .unwrap();
            let contexts = rt.emulator_instance().unwrap().stats().contexts;
            let mut m = common::Run::new(model);
            let n_vocab = m.config().n_vocab as u32;
            let mut rng = fastrand::Rng::with_seed(9);
            let tokens: Vec<u32> = (0..29).map(|_| rng.u32(..n_vocab)).collect();
            let mut bits: Vec<u32> = m
                .forward(&tokens[..25], 0, Logits::All)
                .unwrap()
                .iter()
                .map(|v| v.to_bits())
                .collect();
            for (i, &t) in tokens[25..].iter().enumerate() {
                let l = m.forward(&[t], 25 + i, Logits::All).unwrap();
                bits.extend(l.iter().map(|v| v.to_bits()));
            }
            runs.push((bits, contexts, m.config().clone()));
        }
        let (per_core, split) = (&runs[0], &runs[1]);
        assert!(
            per_core.0 == split.0,
            "{name}: the placements' logits differ"
        );
        // Each expert linear: the split plan's contexts against one.
        let c = &per_core.2;
        let moe = c.moe.as_ref().unwrap();
        let rules = SplitRules::for_chip(Platform::Rk3588, ElemKind::I8, 8192).unwrap();
        let ctx = |n: usize, k: usize| LinearPlan::new(n, k, 3, &rules).unwrap().contexts();
        let per_expert = ctx(2 * moe.n_ff_exp, c.n_embd) - 1 + ctx(c.n_embd, moe.n_ff_exp) - 1;
        let moe_layers = c.n_layer - moe.n_dense_lead;
        assert_eq!(
            split.1 - per_core.1,
            moe_layers * moe.n_expert * per_expert,
            "{name}: contexts {} per core, {} split",
            per_core.1,
            split.1
        );
    }
}

/// RK3576's int4 formats teacher-forced over the English text against the f32 path, with
/// per-channel int4 scales searched for the least squared error (the rotation on; W4A8 with the
/// family's residual rows): the demo model over its first 512 tokens, and seven tiny families
/// over their first 64. The agreement is printed. The tiny families' bar only catches a broken
/// path (wrong nibbles or scales give next to no agreement: chance is well under 1 % of a
/// vocabulary); the demo model's per-channel bar is the scale search's gain (max-abs scales
/// gave about 42 %, the search about 53 %), short of issue 43's accuracy goal. Per-group W4A16
/// (groups of 32, the head W8A8) is held to that goal: at least 90 % on the demo model's first
/// 512 tokens.
#[test]
fn int4_formats_on_rk3576_stay_close_to_the_f32_path() {
    let tiny = [
        "qwen2", "qwen3", "gemma3", "phi3", "smollm3", "granite", "lfm2",
    ];
    let mut models: Vec<_> = tiny
        .iter()
        .map(|f| {
            (
                common::fixtures().join(format!("llm/tiny-{f}.gguf")),
                64,
                0.2,
            )
        })
        .collect();
    if let Some(path) = common::demo_model_forward() {
        models.push((path, 512, 0.45));
    }
    for (path, limit, bar) in models {
        let file = GgufFile::open(&path).unwrap();
        let family = Config::from_gguf(&file).unwrap().family;
        // The demo model per channel in W4A16 only: W4A8 agrees with it within 0.1 point (its
        // integer arithmetic is checked bit for bit in rknn-matmul's engine tests), and the
        // pass costs as much as the per-group one below.
        let formats: &[WeightFormat] = if limit > 64 {
            &[WeightFormat::W4A16]
        } else {
            &[WeightFormat::W4A16, WeightFormat::W4A8]
        };
        for &format in formats {
            let opts = EngineOptions {
                format,
                ..family.engine_options()
            };
            let (top1, rel) = accuracy(&path, usize::MAX, limit, Platform::Rk3576, opts);
            let what = format!("{} {format}", path.display());
            assert!(top1 >= bar, "{what}: top-1 agreement {top1}");
            assert!(rel.is_finite(), "{what}: perplexity {rel:+}");
        }
    }
    // Per-group W4A16 in groups of 32 (the demo model's Q4_1 blocks, reproduced exactly; the
    // head W8A8): issue 43's bar of 90 % top-1 agreement.
    if let Some(path) = common::demo_model_forward() {
        let file = GgufFile::open(&path).unwrap();
        let opts = EngineOptions {
            format: WeightFormat::W4A16,
            int4_group: std::num::NonZeroU16::new(32),
            ..Config::from_gguf(&file).unwrap().family.engine_options()
        };
        let (top1, rel) = accuracy(&path, usize::MAX, 512, Platform::Rk3576, opts);
        let what = format!("{} w4a16 group 32", path.display());
        assert!(top1 >= 0.90, "{what}: top-1 agreement {top1}");
        assert!(rel.abs() < 0.05, "{what}: perplexity {rel:+}");
    }
}

/// RK3576's int4 formats through the drop-in library (`--backend npu`, the board's code path,
/// the library playing an RK3576) give exactly the tokens of the in-process emulator, under
/// both settings of the \[open\] int4 converter input (`RKNN_INT4_B_CONVERTER_INPUT`, read by the
/// safe layer and the library alike), which give the same tokens too.
#[test]
fn int4_formats_through_the_dropin_give_the_emulators_tokens() {
    let _npu = common::NPU
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let lib = common::dropin();
    let platform = Path::new("rk3576");
    for family in ["qwen2", "gemma3"] {
        let model = common::fixtures().join(format!("llm/tiny-{family}.gguf"));
        for wtype in ["w4a16", "w4a8"] {
            let mut tokens = Vec::new();
            for input in ["packed", "one-per-byte"] {
                let input = Path::new(input);
                let args = |backend| {
                    [
                        "--backend",
                        backend,
                        "--platform",
                        "rk3576",
                        "--wtype",
                        wtype,
                        "--no-weight-cache",
                    ]
                };
                let prompt = "The quick brown fox";
                let conv = ("RKNN_INT4_B_CONVERTER_INPUT", input);
                let emu = generate(&model, prompt, &args("emulator"), &[conv]);
                let npu = generate(
                    &model,
                    prompt,
                    &args("npu"),
                    &[
                        ("RKNN_RUNTIME_PATH", &lib),
                        ("RKNN_EMU_PLATFORM", platform),
                        conv,
                    ],
                );
                let what = format!("{family} {wtype} {}", input.display());
                assert_eq!(
                    (&emu["backend"], &npu["backend"]),
                    (&"emulator".into(), &"npu".into())
                );
                assert_eq!(npu["stats"]["wtype"], wtype, "{what}");
                assert_eq!(emu["generated_ids"], npu["generated_ids"], "{what}");
                tokens.push(emu["generated_ids"].clone());
            }
            assert_eq!(
                tokens[0], tokens[1],
                "{family} {wtype}: both converter inputs"
            );
        }
    }
}
