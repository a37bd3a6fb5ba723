//! Continuous batching in the library ([`rknn_llm::serve`]), on the tiny committed models:
//! one forward pass over several sequences gives each the logits it gets alone (f32 and the
//! NPU path, every family, a sliding window crossed), and the [`Batcher`] gives every request
//! the tokens `Session::generate` gives it alone, whatever runs beside it, with the prompt
//! cache or without, and frees slots of cancelled, expired and refused requests; requests whose
//! listeners vanish while they wait or evaluate their prompt leave within one step.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Barrier, Mutex, Weak};
use std::time::{Duration, Instant};

use rknn_llm::gguf::GgufFile;
use rknn_llm::model::{
    BackendError, BatchItem, CacheType, EngineFactory, EngineOptions, HostF32Factory,
    LinearFactory, LinearOp, LinearRole, Logits, Model,
};
use rknn_llm::sample::SamplerConfig;
use rknn_llm::serve::{
    Batcher, Event, EventSink, Finished, Metrics, Request, ServeConfig, ServeError, Sink,
};
use rknn_llm::session::{GenerateParams, Session};
use rknn_llm::tokenizer::Tokenizer;
use rknn_matmul::engine::{Engine, EngineConfig};
use rknn_matmul::{Platform, Runtime};

const FAMILIES: [&str; 16] = [
    "tiny-llama",
    "tiny-qwen2",
    "tiny-qwen3",
    "tiny-gemma3",
    "tiny-phi3",
    "tiny-phi3-longrope",
    "tiny-smollm3",
    "tiny-granite",
    "tiny-gemma2",
    "tiny-qwen3moe",
    "tiny-olmoe",
    "tiny-lfm2",
    "tiny-granitemoe",
    "tiny-lfm2moe",
    "tiny-llama-bias",
    "tiny-qwen35",
];

fn pool(threads: usize) -> Arc<rayon::ThreadPool> {
    Arc::new(
        rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap(),
    )
}

fn file(name: &str) -> GgufFile {
    GgufFile::open(common::fixtures().join("llm").join(format!("{name}.gguf"))).unwrap()
}

fn f32_model(name: &str) -> (Arc<Model>, Arc<Tokenizer>) {
    let f = file(name);
    let p = pool(2);
    let model = Model::load(&f, &mut HostF32Factory::new(p.clone()), p, &mut |_, _| {}).unwrap();
    (Arc::new(model), Arc::new(Tokenizer::from_gguf(&f).unwrap()))
}

fn npu_model(name: &str) -> Arc<Model> {
    let f = file(name);
    let rt = Runtime::emulator(Platform::Rk3588).unwrap();
    let engine = Engine::new(&rt, EngineConfig::default()).unwrap();
    let mut factory = EngineFactory::new(engine, EngineOptions::default());
    Arc::new(Model::load(&f, &mut factory, pool(2), &mut |_, _| {}).unwrap())
}

/// Deterministic token ids below `n_vocab`.
fn tokens(seed: u64, n: usize, n_vocab: usize) -> Vec<u32> {
    let mut rng = fastrand::Rng::with_seed(seed);
    (0..n).map(|_| rng.u32(1..n_vocab as u32)).collect()
}

/// Three sequences run alone and then together, through prompts of different lengths at
/// different positions and then decode rows (gemma3's local layers of 12 positions are
/// crossed): every logits row must be the same bits.
fn batched_equals_solo(model: &Model) {
    let n_vocab = model.config().n_vocab;
    let prompts: Vec<Vec<u32>> = [(1, 30), (2, 7), (3, 19)]
        .iter()
        .map(|&(seed, n)| tokens(seed, n, n_vocab))
        .collect();
    // The schedule: per pass, the tokens each sequence feeds (prompt chunks, then decode rows).
    let schedule: Vec<Vec<Vec<u32>>> = {
        let mut passes = Vec::new();
        let chunks = [[13usize, 7, 5], [17, 0, 14]];
        let mut at = [0usize; 3];
        for c in chunks {
            passes.push(
                (0..3)
                    .map(|i| {
                        let to = (at[i] + c[i]).min(prompts[i].len());
                        let part = prompts[i][at[i]..to].to_vec();
                        at[i] = to;
                        part
                    })
                    .collect(),
            );
        }
        for step in 0..6u64 {
            passes.push(
                (0..3)
                    .map(|i| tokens(100 + step * 3 + i, 1, n_vocab))
                    .collect(),
            );
        }
        passes
    };
    let solo: Vec<Vec<Vec<f32>>> = (0..3)
        .map(|i| {
            let mut seq = model.sequence(CacheType::F32);
            let mut pos = 0;
            let mut rows = Vec::new();
            for pass in &schedule {
                let part = &pass[i];
                if part.is_empty() {
                    continue;
                }
                rows.push(
                    model
                        .forward(&mut seq, part, pos, Logits::All)
                        .unwrap()
                        .to_vec(),
                );
                pos += part.len();
            }
            rows
        })
        .collect();
    let mut seqs: Vec<_> = (0..3).map(|_| model.sequence(CacheType::F32)).collect();
    let mut pos = [0usize; 3];
    let mut got: Vec<Vec<Vec<f32>>> = vec![Vec::new(); 3];
    for pass in &schedule {
        let mut items: Vec<BatchItem<'_>> = Vec::new();
        let mut which = Vec::new();
        for (i, seq) in seqs.iter_mut().enumerate() {
            if pass[i].is_empty() {
                continue;
            }
            items.push(BatchItem {
                seq,
                tokens: &pass[i],
                pos: pos[i],
                logits: Logits::All,
            });
            which.push(i);
        }
        model.forward_batch(&mut items).unwrap();
        drop(items);
        for &i in &which {
            got[i].push(seqs[i].logits().to_vec());
            pos[i] += pass[i].len();
        }
        assert_eq!(seqs[0].logits().len() % n_vocab, 0);
    }
    for i in 0..3 {
        assert_eq!(got[i].len(), solo[i].len());
        for (p, (a, b)) in got[i].iter().zip(&solo[i]).enumerate() {
            let same = a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits());
            assert!(same && a.len() == b.len(), "sequence {i}, pass {p}");
        }
    }
}

#[test]
fn one_pass_over_several_sequences_gives_each_its_solo_logits() {
    for name in FAMILIES {
        let (model, _) = f32_model(name);
        batched_equals_solo(&model);
    }
}

#[test]
fn one_npu_pass_over_several_sequences_gives_each_its_solo_logits() {
    for name in [
        "tiny-llama",
        "tiny-gemma3",
        "tiny-lfm2",
        "tiny-lfm2moe",
        "tiny-qwen35",
    ] {
        batched_equals_solo(&npu_model(name));
    }
}

#[test]
fn a_batch_checks_every_item_before_running_any() {
    let (model, _) = f32_model("tiny-llama");
    let n_vocab = model.config().n_vocab as u32;
    let (mut a, mut b) = (
        model.sequence(CacheType::F32),
        model.sequence(CacheType::F32),
    );
    let err = model
        .forward_batch(&mut [
            BatchItem {
                seq: &mut a,
                tokens: &[1, 2, 3],
                pos: 0,
                logits: Logits::Last,
            },
            BatchItem {
                seq: &mut b,
                tokens: &[n_vocab],
                pos: 0,
                logits: Logits::Last,
            },
        ])
        .unwrap_err();
    assert!(err.to_string().contains(&n_vocab.to_string()), "{err}");
    assert_eq!(a.len(), 0, "nothing ran");
}

/// What one request produced through a batcher.
#[derive(Debug)]
struct Outcome {
    tokens: Vec<u32>,
    text: String,
    done: Result<Finished, String>,
}

/// Submits `request` and returns a receiver of its outcome.
fn submit(batcher: &Batcher, request: Request) -> Result<mpsc::Receiver<Outcome>, ServeError> {
    let (tx, rx) = mpsc::channel();
    let mut out = Outcome {
        tokens: Vec::new(),
        text: String::new(),
        done: Err("no end".into()),
    };
    let mut tx = Some(tx);
    batcher.submit(
        request,
        Box::new(move |event| {
            match event {
                Event::Piece(p) => {
                    out.tokens.extend(p.token);
                    out.text.push_str(&p.text);
                    return true;
                }
                Event::Done(d) => out.done = Ok(d),
                Event::Failed(e) => out.done = Err(e.to_string()),
            }
            if let Some(tx) = tx.take() {
                let _ = tx.send(std::mem::replace(
                    &mut out,
                    Outcome {
                        tokens: Vec::new(),
                        text: String::new(),
                        done: Err(String::new()),
                    },
                ));
            }
            true
        }),
    )?;
    Ok(rx)
}

fn wait(rx: mpsc::Receiver<Outcome>) -> Outcome {
    rx.recv_timeout(Duration::from_secs(120))
        .expect("the request ends")
}

/// What `Session::generate_tokens` gives `prompt` alone (a fresh session).
fn solo(model: &Arc<Model>, tok: &Arc<Tokenizer>, r: &Request) -> (Vec<u32>, String) {
    let mut s = Session::new(model.clone(), tok.clone(), r.sampling.clone()).unwrap();
    let params = GenerateParams {
        max_tokens: r.max_tokens,
        stop: r.stop.clone(),
        ..GenerateParams::default()
    };
    let g = s
        .generate_tokens(&r.prompt, &params)
        .unwrap()
        .finish()
        .unwrap();
    (g.generated, g.text)
}

fn requests(tok: &Tokenizer, n: usize) -> Vec<Request> {
    (0..n)
        .map(|i| {
            let prompt = format!(
                "Story {i}: once upon a time, {} little",
                "a very ".repeat(i)
            );
            Request {
                prompt: tok.encode(&prompt, true, true).unwrap(),
                sampling: SamplerConfig {
                    // Half greedy, half sampled with their own seeds and penalties.
                    temperature: if i % 2 == 0 { 0.0 } else { 0.9 },
                    seed: 1000 + i as u64,
                    presence_penalty: if i % 4 == 1 { 0.5 } else { 0.0 },
                    frequency_penalty: if i % 4 == 3 { 0.7 } else { 0.0 },
                    ..SamplerConfig::default()
                },
                max_tokens: Some(12 + 3 * i),
                ..Request::default()
            }
        })
        .collect()
}

#[test]
fn every_request_gets_its_solo_tokens_whatever_runs_beside_it() {
    for name in ["tiny-llama", "tiny-gemma3"] {
        let (model, tok) = f32_model(name);
        let reqs = requests(&tok, 8);
        let want: Vec<_> = reqs.iter().map(|r| solo(&model, &tok, r)).collect();
        let config = ServeConfig {
            slots: 4,
            queue: 8,
            prefill_chunk: 8,
            ..ServeConfig::default()
        };
        let batcher = Arc::new(Batcher::start(model.clone(), tok.clone(), config).unwrap());
        // Eight threads submit at once (the Batcher is Sync).
        let barrier = Arc::new(Barrier::new(reqs.len()));
        let handles: Vec<_> = reqs
            .into_iter()
            .map(|r| {
                let (b, barrier) = (batcher.clone(), barrier.clone());
                std::thread::spawn(move || {
                    barrier.wait();
                    wait(submit(&b, r).unwrap())
                })
            })
            .collect();
        for (i, (h, (tokens, text))) in handles.into_iter().zip(&want).enumerate() {
            let got = h.join().unwrap();
            assert_eq!(&got.tokens, tokens, "{name} request {i}");
            assert_eq!(&got.text, text, "{name} request {i}");
            let done = got.done.unwrap();
            assert_eq!(done.completion_tokens, tokens.len());
            assert_eq!(done.text, *text);
        }
        assert!(batcher.wait_idle(Duration::from_secs(10)));
        let m = batcher.metrics();
        assert_eq!((m.active, m.queued, m.finished), (0, 0, 8), "{m:?}");
        // Batching happened: passes carried more than one decoding request on average.
        assert!(m.decode_rows as f64 > 1.5 * m.passes as f64, "{m:?}");
    }
}

#[test]
fn the_prompt_cache_reuses_a_prefix_and_changes_nothing() {
    let (model, tok) = f32_model("tiny-gemma3");
    let batcher = Batcher::start(
        model.clone(),
        tok.clone(),
        ServeConfig {
            slots: 2,
            ..ServeConfig::default()
        },
    )
    .unwrap();
    let greedy = SamplerConfig {
        temperature: 0.0,
        ..SamplerConfig::default()
    };
    let turn1 = Request {
        prompt: tok
            .encode("The first turn of a long chat, with words", true, true)
            .unwrap(),
        sampling: greedy.clone(),
        max_tokens: Some(20),
        ..Request::default()
    };
    let first = wait(submit(&batcher, turn1.clone()).unwrap());
    // Turn 2: the first prompt, its answer and more (past gemma3's window of 12).
    let mut prompt2 = turn1.prompt.clone();
    prompt2.extend(&first.tokens);
    prompt2.extend(
        tok.encode(" and then the second turn asks again", false, true)
            .unwrap(),
    );
    let turn2 = Request {
        prompt: prompt2,
        ..turn1.clone()
    };
    let cached = wait(submit(&batcher, turn2.clone()).unwrap());
    let cold = wait(
        submit(
            &batcher,
            Request {
                cache_prompt: false,
                ..turn2.clone()
            },
        )
        .unwrap(),
    );
    let (c, k) = (cached.done.unwrap(), cold.done.unwrap());
    assert!(
        c.cached_tokens >= turn1.prompt.len() + first.tokens.len() - 1,
        "{c:?}"
    );
    assert_eq!(k.cached_tokens, 0);
    assert_eq!(cached.tokens, cold.tokens);
    assert_eq!(cached.tokens, solo(&model, &tok, &turn2).0);
}

/// Requests with one prompt (a request's `n` choices) evaluate it once: the first takes a
/// slot, the others wait for its prefill and copy its cache, and each still gets the tokens
/// it gets alone, bit for bit (f32 and f16 caches; gemma3's local layers have dropped
/// positions by the end of the 150-token prompt; qwen35's delta-net state is copied from the
/// last pass's replay rows). A request sharing only the start (a common system prompt) copies
/// that start from a slot that is decoding (not on qwen35, whose decoding slot no longer holds
/// the state there).
#[test]
fn requests_sharing_a_prompt_evaluate_it_once() {
    for (name, cache_type) in [
        ("tiny-llama", CacheType::F32),
        ("tiny-gemma3", CacheType::F32),
        ("tiny-gemma3", CacheType::F16),
        ("tiny-lfm2", CacheType::F32),
        ("tiny-lfm2", CacheType::F16),
        ("tiny-lfm2moe", CacheType::F32),
        ("tiny-qwen35", CacheType::F32),
        ("tiny-qwen35", CacheType::F16),
    ] {
        let (model, tok) = f32_model(name);
        let batcher = Batcher::start(
            model.clone(),
            tok.clone(),
            ServeConfig {
                slots: 4,
                prefill_chunk: 32,
                cache_type,
                ..ServeConfig::default()
            },
        )
        .unwrap();
        let prompt = tokens(7, 150, model.config().n_vocab);
        let choices: Vec<Request> = (0..4)
            .map(|i| Request {
                prompt: prompt.clone(),
                sampling: SamplerConfig {
                    temperature: if i == 0 { 0.0 } else { 0.9 },
                    seed: 40 + i,
                    ..SamplerConfig::default()
                },
                max_tokens: Some(10),
                ..Request::default()
            })
            .collect();
        let rxs: Vec<_> = choices
            .iter()
            .map(|r| submit(&batcher, r.clone()).unwrap())
            .collect();
        let mut cached = Vec::new();
        for (i, (rx, r)) in rxs.into_iter().zip(&choices).enumerate() {
            let got = wait(rx);
            let want = solo_cached(&model, &tok, r, cache_type);
            assert_eq!(got.tokens, want, "{name} {cache_type:?} choice {i}");
            cached.push(got.done.unwrap().cached_tokens);
        }
        cached.sort_unstable();
        assert_eq!(
            cached,
            [0, 149, 149, 149],
            "{name} {cache_type:?}: one prefill, three copies"
        );
        // A prompt sharing the first 100 tokens, while a slot decodes with them.
        let mut long = choices[0].clone();
        long.max_tokens = Some(60);
        long.prompt = tokens(8, 120, model.config().n_vocab);
        let decoded = batcher.metrics().decode_rows;
        let running = submit(&batcher, long.clone()).unwrap();
        let mut shared = long.clone();
        shared.max_tokens = Some(5);
        shared.prompt.truncate(100);
        shared.prompt.extend(tokens(9, 20, model.config().n_vocab));
        // Wait until `long` decodes: its prefill is done (a slot holds its prompt).
        let deadline = Instant::now() + Duration::from_secs(60);
        while batcher.metrics().decode_rows == decoded && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(2));
        }
        let got = wait(submit(&batcher, shared.clone()).unwrap());
        assert_eq!(
            got.tokens,
            solo_cached(&model, &tok, &shared, cache_type),
            "{name} {cache_type:?}"
        );
        // A delta-net model's decoding slot no longer holds its state at 100 (only from its
        // last pass on, and at the ends of long prompt passes): the request evaluates afresh.
        let shared_cached = if name == "tiny-qwen35" { 0 } else { 100 };
        assert_eq!(
            got.done.unwrap().cached_tokens,
            shared_cached,
            "{name} {cache_type:?}"
        );
        wait(running).done.unwrap();
    }
}

/// A control token a request preserves comes out as its text (a tool format's marker, for
/// its reader); otherwise as nothing.
#[test]
fn preserved_control_tokens_are_rendered() {
    let (model, tok) = f32_model("tiny-llama");
    let start = tok.token_id("<|im_start|>").unwrap();
    assert!(tok.is_control(start) && !tok.is_eog(start));
    let batcher = Batcher::start(model, tok.clone(), ServeConfig::default()).unwrap();
    let request = |preserve: Vec<u32>| Request {
        prompt: tok.encode("Once upon a time", true, true).unwrap(),
        sampling: SamplerConfig {
            temperature: 0.0,
            logit_bias: vec![(start, 100.0)],
            ..SamplerConfig::default()
        },
        max_tokens: Some(3),
        preserve,
        ..Request::default()
    };
    let kept = wait(submit(&batcher, request(vec![start])).unwrap());
    let plain = wait(submit(&batcher, request(Vec::new())).unwrap());
    assert_eq!(kept.tokens, vec![start; 3]);
    assert_eq!(plain.tokens, kept.tokens);
    assert_eq!(kept.text, "<|im_start|>".repeat(3));
    assert_eq!(plain.text, "");
}

/// [`solo`]'s tokens with a cache of `ty`.
fn solo_cached(model: &Arc<Model>, tok: &Arc<Tokenizer>, r: &Request, ty: CacheType) -> Vec<u32> {
    let mut s = Session::new(model.clone(), tok.clone(), r.sampling.clone()).unwrap();
    s.set_cache_type(ty);
    let params = GenerateParams {
        max_tokens: r.max_tokens,
        ..GenerateParams::default()
    };
    let g = s
        .generate_tokens(&r.prompt, &params)
        .unwrap()
        .finish()
        .unwrap();
    g.generated
}

fn long_request(tok: &Tokenizer) -> Request {
    Request {
        prompt: tok.encode("A story that goes on", true, true).unwrap(),
        sampling: SamplerConfig {
            temperature: 0.0,
            ..SamplerConfig::default()
        },
        max_tokens: None,
        ..Request::default()
    }
}

#[test]
fn admission_refuses_what_cannot_be_served() {
    let (model, tok) = f32_model("tiny-llama");
    let batcher = Batcher::start(
        model.clone(),
        tok.clone(),
        ServeConfig {
            slots: 1,
            queue: 0,
            slot_ctx: 64,
            ..ServeConfig::default()
        },
    )
    .unwrap();
    let n_vocab = model.config().n_vocab as u32;
    let bad = |prompt: Vec<u32>| {
        submit(
            &batcher,
            Request {
                prompt,
                ..Request::default()
            },
        )
        .err()
        .map(|e| e.to_string())
    };
    assert!(bad(vec![]).unwrap().contains("empty"));
    assert!(bad(vec![1; 65]).unwrap().contains("65 tokens"));
    assert!(bad(vec![n_vocab]).unwrap().contains(&n_vocab.to_string()));
    // One running request (it fills its 64 positions), none may wait.
    let running = submit(&batcher, long_request(&tok)).unwrap();
    let e = submit(&batcher, long_request(&tok)).unwrap_err();
    assert!(
        matches!(e, ServeError::QueueFull { slots: 1, queue: 0 }),
        "{e}"
    );
    let done = wait(running).done.unwrap();
    assert_eq!(done.stop.name(), "context");
    assert_eq!(done.prompt_tokens + done.completion_tokens, 64 + 1);
    // A client that heard the end has left the count: its next request, sent the moment it
    // hears (here from the sink itself), is taken.
    let batcher = Arc::new(batcher);
    let (tx, rx) = mpsc::channel();
    let b = batcher.clone();
    let short = Request {
        max_tokens: Some(2),
        ..long_request(&tok)
    };
    let first = Request {
        max_tokens: Some(2),
        ..long_request(&tok)
    };
    batcher
        .submit(
            first,
            Box::new(move |event| {
                if let Event::Done(_) = event {
                    let next = submit(&b, short.clone()).map_err(|e| e.to_string());
                    let _ = tx.send(next);
                }
                true
            }),
        )
        .unwrap();
    let next = rx.recv_timeout(Duration::from_secs(30)).unwrap();
    let next = next.expect("the slot is free once its client heard the end");
    assert_eq!(wait(next).tokens.len(), 2);
    assert!(batcher.wait_idle(Duration::from_secs(10)));
    let m = batcher.metrics();
    assert_eq!((m.refused, m.finished, m.active), (4, 3, 0), "{m:?}");
}

#[test]
fn a_gone_client_or_a_deadline_frees_the_slot() {
    let (model, tok) = f32_model("tiny-llama");
    let batcher = Batcher::start(
        model,
        tok.clone(),
        ServeConfig {
            slots: 1,
            queue: 4,
            ..ServeConfig::default()
        },
    )
    .unwrap();
    // A sink that stops listening after 3 pieces.
    let (tx, rx) = mpsc::channel();
    let mut seen = 0;
    batcher
        .submit(
            long_request(&tok),
            Box::new(move |event| {
                seen += 1;
                let _ = tx.send(matches!(event, Event::Piece(_)));
                seen < 3
            }),
        )
        .unwrap();
    let mut events = 0;
    while rx.recv_timeout(Duration::from_secs(30)).is_ok() {
        events += 1;
    }
    assert_eq!(events, 3, "no event after the sink said it is gone");
    assert!(batcher.wait_idle(Duration::from_secs(10)));
    // A deadline in the past ends a request at once.
    let expired = Request {
        deadline: Some(Instant::now()),
        ..long_request(&tok)
    };
    let out = wait(submit(&batcher, expired).unwrap());
    assert!(out.done.unwrap_err().contains("deadline"));
    assert!(batcher.wait_idle(Duration::from_secs(10)));
    let m = batcher.metrics();
    assert_eq!((m.cancelled, m.active, m.queued), (2, 0, 0), "{m:?}");
    // The slot serves again.
    let again = Request {
        max_tokens: Some(4),
        ..long_request(&tok)
    };
    assert_eq!(wait(submit(&batcher, again).unwrap()).tokens.len(), 4);
}

#[test]
fn dropping_the_batcher_ends_running_requests() {
    let (model, tok) = f32_model("tiny-llama");
    let batcher = Batcher::start(model, tok.clone(), ServeConfig::default()).unwrap();
    let rx = submit(&batcher, long_request(&tok)).unwrap();
    batcher.close();
    assert!(matches!(
        submit(&batcher, long_request(&tok)),
        Err(ServeError::ShuttingDown)
    ));
    drop(batcher);
    let out = wait(rx);
    assert!(out.done.unwrap_err().contains("shutting down"));
}

/// The f32 backend with an output head that panics (or fails) while `trap` says so.
struct Trapped {
    inner: HostF32Factory,
    trap: Arc<std::sync::atomic::AtomicU8>,
}

struct TrappedOp {
    inner: Box<dyn LinearOp>,
    trap: Arc<std::sync::atomic::AtomicU8>,
}

impl LinearOp for TrappedOp {
    fn in_features(&self) -> usize {
        self.inner.in_features()
    }
    fn out_features(&self) -> usize {
        self.inner.out_features()
    }
    fn forward(&self, x: &[f32], m: usize, out: &mut [f32]) -> Result<(), BackendError> {
        match self.trap.load(std::sync::atomic::Ordering::SeqCst) {
            1 => panic!("a trapped output head"),
            2 => Err("a failing output head".into()),
            _ => self.inner.forward(x, m, out),
        }
    }
    fn weight_format(&self) -> &'static str {
        "trapped"
    }
}

impl LinearFactory for Trapped {
    fn build(
        &mut self,
        role: LinearRole,
        parts: &[rknn_llm::gguf::TensorView<'_>],
    ) -> Result<Box<dyn LinearOp>, BackendError> {
        let inner = self.inner.build(role, parts)?;
        Ok(match role {
            LinearRole::Output => Box::new(TrappedOp {
                inner,
                trap: self.trap.clone(),
            }),
            _ => inner,
        })
    }
}

#[test]
fn a_panic_or_a_failure_in_a_pass_fails_its_requests_and_the_batcher_goes_on() {
    let f = file("tiny-llama");
    let tok = Arc::new(Tokenizer::from_gguf(&f).unwrap());
    let p = pool(2);
    let trap = Arc::new(std::sync::atomic::AtomicU8::new(0));
    let mut factory = Trapped {
        inner: HostF32Factory::new(p.clone()),
        trap: trap.clone(),
    };
    let model = Arc::new(Model::load(&f, &mut factory, p, &mut |_, _| {}).unwrap());
    let batcher = Batcher::start(model.clone(), tok.clone(), ServeConfig::default()).unwrap();
    let request = Request {
        max_tokens: Some(6),
        ..long_request(&tok)
    };
    let want = solo(&model, &tok, &request).0;
    for (mode, says) in [
        (1, "internal error: a trapped output head"),
        (2, "a failing output head"),
    ] {
        trap.store(mode, std::sync::atomic::Ordering::SeqCst);
        let out = wait(submit(&batcher, request.clone()).unwrap());
        let e = out.done.unwrap_err();
        assert!(e.contains(says), "{e}");
        trap.store(0, std::sync::atomic::Ordering::SeqCst);
        let out = wait(submit(&batcher, request.clone()).unwrap());
        assert_eq!(
            out.tokens, want,
            "the slot serves again, from a clean cache"
        );
    }
    assert!(batcher.wait_idle(Duration::from_secs(10)));
    let m = batcher.metrics();
    assert_eq!((m.failed, m.finished, m.active), (2, 2, 0), "{m:?}");
}

/// A sink into a channel whose sender can tell that the receiving end is gone without sending
/// (as tokio's `Sender::is_closed` does; std's channel cannot): the listener holds the
/// receiver and a token, and has vanished once it dropped them. It counts what it is sent.
struct Watched {
    tx: mpsc::Sender<Event>,
    listener: Weak<()>,
    sent: Arc<AtomicUsize>,
}

impl EventSink for Watched {
    fn send(&mut self, event: Event) -> bool {
        self.sent.fetch_add(1, Ordering::SeqCst);
        self.tx.send(event).is_ok()
    }

    fn is_listening(&mut self) -> bool {
        self.listener.strong_count() > 0
    }
}

/// A listener of a [`Watched`] sink: dropping it is the client vanishing.
struct Listener {
    _events: mpsc::Receiver<Event>,
    _token: Arc<()>,
}

fn watched(sent: &Arc<AtomicUsize>) -> (Sink, Listener) {
    let (tx, events) = mpsc::channel();
    let token = Arc::new(());
    let sink = Watched {
        tx,
        listener: Arc::downgrade(&token),
        sent: sent.clone(),
    };
    (
        Box::new(sink),
        Listener {
            _events: events,
            _token: token,
        },
    )
}

/// Holds the batcher's thread at every piece of the requests it gates: the thread stops in the
/// first phase of a step, inside the sink, until the test lets it go on, so that the test acts
/// between two steps and knows how many passes ran.
struct Gate {
    reached: mpsc::Receiver<()>,
    go: Option<mpsc::SyncSender<()>>,
    go_rx: Arc<Mutex<mpsc::Receiver<()>>>,
    reached_tx: mpsc::Sender<()>,
}

impl Gate {
    fn new() -> Gate {
        let (reached_tx, reached) = mpsc::channel();
        let (go, go_rx) = mpsc::sync_channel(0);
        Gate {
            reached,
            go: Some(go),
            go_rx: Arc::new(Mutex::new(go_rx)),
            reached_tx,
        }
    }

    /// A sink that stops at each piece until let go (and runs freely once the gate is open).
    fn sink(&self) -> Sink {
        let (reached, go) = (self.reached_tx.clone(), self.go_rx.clone());
        Box::new(move |event| {
            if let Event::Piece(_) = event {
                if reached.send(()).is_ok() {
                    let _ = go.lock().unwrap().recv();
                }
            }
            true
        })
    }

    /// Waits until the batcher's thread stops at a gated piece.
    fn wait(&self) {
        self.reached
            .recv_timeout(Duration::from_secs(60))
            .expect("the batcher reaches a gated piece");
    }

    /// Lets the stopped thread go on.
    fn release(&self) {
        self.go.as_ref().unwrap().send(()).unwrap();
    }

    /// Lets everything run freely from now on.
    fn open(mut self) {
        drop(self.go.take());
        // A thread stopped at a piece now sees the closed channel and goes on.
    }
}

/// Two requests decode in the two slots, held between steps; 48 more wait with sinks that can
/// be asked whether anyone listens. Their listeners vanish: by the running requests' next
/// token (one pass later) the queue is empty, the 48 are counted cancelled without an event,
/// and 48 new requests are accepted in their places and served.
#[test]
fn queued_requests_whose_listeners_vanish_leave_within_one_step() {
    let (model, tok) = f32_model("tiny-llama");
    let batcher = Batcher::start(
        model.clone(),
        tok.clone(),
        ServeConfig {
            slots: 2,
            queue: 48,
            slot_ctx: 64,
            ..ServeConfig::default()
        },
    )
    .unwrap();
    let gate = Gate::new();
    for _ in 0..2 {
        batcher.submit(long_request(&tok), gate.sink()).unwrap();
    }
    // The second request may be admitted a pass after the first: go on, piece by piece,
    // until a pass with both decoding (one pass, two decode rows) has just run. That stop is
    // step k: the first decoding request stops at its piece.
    gate.wait();
    let at = |m: Metrics| (m.passes, m.decode_rows);
    let mut last = at(batcher.metrics());
    loop {
        gate.release();
        gate.wait();
        let now = at(batcher.metrics());
        if now == (last.0 + 1, last.1 + 2) {
            break;
        }
        last = now;
    }
    let sent = Arc::new(AtomicUsize::new(0));
    let listeners: Vec<Listener> = (0..48)
        .map(|i| {
            let (sink, listener) = watched(&sent);
            let request = Request {
                prompt: tokens(i, 20, model.config().n_vocab),
                ..long_request(&tok)
            };
            batcher.submit(request, sink).unwrap();
            listener
        })
        .collect();
    let full = batcher.submit(long_request(&tok), Box::new(|_| true));
    assert!(
        matches!(full, Err(ServeError::QueueFull { .. })),
        "{full:?}"
    );
    let passes = batcher.metrics().passes;
    drop(listeners);
    // The rest of step k (the other request's piece, the pass), then step k + 1.
    gate.release();
    gate.wait();
    gate.release();
    gate.wait();
    let m = batcher.metrics();
    assert_eq!(m.passes, passes + 1, "one pass between the two pieces");
    assert_eq!((m.queued, m.active, m.cancelled), (0, 2, 48), "{m:?}");
    assert_eq!(
        sent.load(Ordering::SeqCst),
        0,
        "nothing sent to a vanished listener"
    );
    // Their admission places are free: 48 new requests are taken, and each is served.
    let short = Request {
        max_tokens: Some(3),
        ..long_request(&tok)
    };
    let want = solo(&model, &tok, &short).0;
    let waiting: Vec<_> = (0..48)
        .map(|_| submit(&batcher, short.clone()).expect("a free place"))
        .collect();
    gate.release();
    gate.open();
    for rx in waiting {
        assert_eq!(wait(rx).tokens, want);
    }
    assert!(batcher.wait_idle(Duration::from_secs(60)));
    let m = batcher.metrics();
    assert_eq!((m.finished, m.cancelled, m.queued), (50, 48, 0), "{m:?}");
}

/// A request evaluating a long prompt (one token per pass), whose listener vanishes, frees its
/// slot before the next pass without an event; the same prompt then reuses what it evaluated
/// and gets its solo tokens.
#[test]
fn a_prefilling_request_whose_listener_vanishes_frees_its_slot_before_the_next_pass() {
    let (model, tok) = f32_model("tiny-llama");
    let batcher = Batcher::start(
        model.clone(),
        tok.clone(),
        ServeConfig {
            slots: 2,
            slot_ctx: 128,
            prefill_chunk: 1,
            ..ServeConfig::default()
        },
    )
    .unwrap();
    let gate = Gate::new();
    batcher.submit(long_request(&tok), gate.sink()).unwrap();
    gate.wait();
    let sent = Arc::new(AtomicUsize::new(0));
    let prompt = tokens(7, 40, model.config().n_vocab);
    let (sink, listener) = watched(&sent);
    let request = Request {
        prompt: prompt.clone(),
        max_tokens: Some(6),
        ..long_request(&tok)
    };
    batcher.submit(request.clone(), sink).unwrap();
    // A few passes of its prompt (one token each).
    for _ in 0..4 {
        gate.release();
        gate.wait();
    }
    let m = batcher.metrics();
    assert_eq!((m.active, m.queued), (2, 0), "{m:?}");
    let passes = m.passes;
    drop(listener);
    gate.release();
    gate.wait();
    let m = batcher.metrics();
    assert_eq!(m.passes, passes + 1);
    assert_eq!((m.active, m.cancelled), (1, 1), "{m:?}");
    assert_eq!(
        sent.load(Ordering::SeqCst),
        0,
        "no event before its first token"
    );
    gate.release();
    gate.open();
    // The slot holds part of the prompt: the same request reuses it and gets its solo tokens.
    let again = wait(submit(&batcher, request.clone()).unwrap());
    let done = again.done.unwrap();
    assert!(
        done.cached_tokens > 0 && done.cached_tokens < prompt.len(),
        "{done:?}"
    );
    assert_eq!(again.tokens, solo(&model, &tok, &request).0);
}

#[test]
fn a_model_whose_pool_another_thread_drives_is_served_not_stalled() {
    // A host_pool's member 0 is the thread that built it, and a batcher's own thread never
    // enters that pool: with two threads the passes run on the other one, with one (nothing
    // else would ever run them) on the batcher's thread itself. Either way every request gets
    // its solo tokens, the solo runs here on the pool's driving thread.
    for threads in [1, 2] {
        std::thread::spawn(move || {
            let f = file("tiny-llama");
            let pool = rknn_llm::model::host_pool(threads).unwrap();
            assert_eq!(pool.driver(), Some(std::thread::current().id()));
            let model = Arc::new(
                Model::load(
                    &f,
                    &mut HostF32Factory::new(pool.clone()),
                    pool,
                    &mut |_, _| {},
                )
                .unwrap(),
            );
            let tok = Arc::new(Tokenizer::from_gguf(&f).unwrap());
            let batcher =
                Batcher::start(model.clone(), tok.clone(), ServeConfig::default()).unwrap();
            let reqs = requests(&tok, 3);
            let rxs: Vec<_> = reqs
                .iter()
                .map(|r| submit(&batcher, r.clone()).unwrap())
                .collect();
            for (r, rx) in reqs.iter().zip(rxs) {
                let got = wait(rx);
                assert!(got.done.is_ok(), "{threads} threads: {:?}", got.done);
                assert_eq!(
                    (got.tokens, got.text),
                    solo(&model, &tok, r),
                    "{threads} threads"
                );
            }
        })
        .join()
        .unwrap();
    }
}

#[test]
fn the_builder_serves_on_the_batchers_own_thread() {
    // `ModelBuilder::serve` loads the model on the batcher's thread, which drives its pool:
    // the requests get their solo tokens, as from any batcher, and the model serves this
    // thread too (its one host thread is the batcher's: this thread runs its own passes).
    let path = common::fixtures().join("llm/tiny-llama.gguf");
    let (loaded, batcher) = rknn_llm::Model::builder(&path)
        .backend(rknn_llm::Backend::F32)
        .threads(1)
        .serve(|loaded| {
            Ok(ServeConfig {
                slots: 2,
                slot_ctx: loaded.model.n_ctx() / 2,
                ..ServeConfig::default()
            })
        })
        .unwrap();
    let driver = loaded
        .model
        .pool()
        .driver()
        .expect("the batcher's thread drives it");
    assert_ne!(driver, std::thread::current().id());
    assert_eq!(batcher.config().slot_ctx, loaded.model.n_ctx() / 2);
    let (model, tok) = (loaded.model.clone(), loaded.tokenizer.clone());
    let reqs = requests(&tok, 4);
    let rxs: Vec<_> = reqs
        .iter()
        .map(|r| submit(&batcher, r.clone()).unwrap())
        .collect();
    for (r, rx) in reqs.iter().zip(rxs) {
        let got = wait(rx);
        assert!(got.done.is_ok(), "{:?}", got.done);
        assert_eq!((got.tokens, got.text), solo(&model, &tok, r));
    }

    // What the batcher refuses, or the load, comes back as the builder's error.
    let refused = rknn_llm::Model::builder(&path)
        .backend(rknn_llm::Backend::F32)
        .serve(|_| {
            Ok(ServeConfig {
                slots: 0,
                ..ServeConfig::default()
            })
        });
    assert!(
        matches!(
            refused,
            Err(rknn_llm::LoadError::Serve(ServeError::Config(_)))
        ),
        "{refused:?}"
    );
    let missing = rknn_llm::Model::builder(common::fixtures().join("llm/none.gguf"))
        .serve(|_| Ok(ServeConfig::default()));
    assert!(
        matches!(missing, Err(rknn_llm::LoadError::Gguf(_))),
        "{missing:?}"
    );
}
