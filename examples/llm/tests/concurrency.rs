//! The library's `Send + Sync` types used from several threads at once, each result checked
//! against the same work done on one thread: the tokenizer, the mapped GGUF file and its
//! tensor views, one linear of each backend (host f32, W8A8 on the emulated NPU) that two
//! threads forward through together, and sessions on several threads over one shared model.

mod common;

use std::sync::Arc;

use rknn_llm::gguf::GgufFile;
use rknn_llm::model::{EngineFactory, EngineOptions, HostF32Factory, LinearFactory, LinearRole};
use rknn_llm::tokenizer::Tokenizer;
use rknn_matmul::engine::{Engine, EngineConfig};
use rknn_matmul::{Platform, Runtime};

const THREADS: usize = 2;
const ROUNDS: usize = 25;

fn tiny_models() -> Vec<GgufFile> {
    ["tiny-llama.gguf", "tiny-qwen2.gguf"]
        .iter()
        .map(|name| GgufFile::open(common::fixtures().join("llm").join(name)).unwrap())
        .collect()
}

#[test]
fn a_tokenizer_and_a_gguf_file_serve_several_threads() {
    let texts = [
        "Hello, world!",
        "  leading spaces and\ttabs\n\nnew lines",
        "numbers 1234567 and 3.14159",
        "émojis 🦀🚀 and CJK 漢字かな",
        "fn main() { println!(\"{}\", 1 + 2); }",
    ];
    for file in tiny_models() {
        let tok = Tokenizer::from_gguf(&file).unwrap();
        let ids: Vec<Vec<u32>> = texts
            .iter()
            .map(|t| tok.encode(t, true, false).unwrap())
            .collect();
        let tensors: Vec<(String, Vec<f32>)> = file
            .tensors()
            .map(|t| (t.name().to_string(), t.to_f32().unwrap()))
            .collect();
        assert!(ids.iter().all(|v| !v.is_empty()) && !tensors.is_empty());
        std::thread::scope(|s| {
            for _ in 0..THREADS {
                s.spawn(|| {
                    for _ in 0..ROUNDS {
                        for (t, want) in texts.iter().zip(&ids) {
                            assert_eq!(&tok.encode(t, true, false).unwrap(), want, "{t:?}");
                        }
                        for (name, want) in &tensors {
                            let got = file.tensor(name).unwrap().to_f32().unwrap();
                            assert!(
                                got.iter()
                                    .zip(want)
                                    .all(|(a, b)| a.to_bits() == b.to_bits())
                            );
                        }
                    }
                });
            }
        });
    }
}

#[test]
fn one_linear_of_each_backend_serves_several_threads() {
    let file = &tiny_models()[0];
    let parts = [file.tensor("blk.0.ffn_down.weight").unwrap()];
    let pool = Arc::new(
        rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .unwrap(),
    );
    let rt = Runtime::emulator(Platform::Rk3588).unwrap();
    let engine = Engine::new(&rt, EngineConfig::default()).unwrap();
    let linears = [
        HostF32Factory::new(pool).build(LinearRole::Down, &parts),
        EngineFactory::new(engine, EngineOptions::default()).build(LinearRole::Down, &parts),
    ];
    for linear in linears {
        let linear = linear.unwrap();
        let (k, n) = (linear.in_features(), linear.out_features());
        // Each thread its own inputs (different row counts), so a mix-up would show.
        let inputs: Vec<(usize, Vec<f32>)> = (0..THREADS)
            .map(|t| {
                let m = 1 + 3 * t;
                let x = (0..m * k)
                    .map(|i| ((i * 31 + t * 7) % 97) as f32 / 48.0 - 1.0)
                    .collect();
                (m, x)
            })
            .collect();
        let alone: Vec<Vec<f32>> = inputs
            .iter()
            .map(|(m, x)| {
                let mut y = vec![0.0; m * n];
                linear.forward(x, *m, &mut y).unwrap();
                y
            })
            .collect();
        assert!(alone.iter().all(|y| y.iter().any(|&v| v != 0.0)));
        std::thread::scope(|s| {
            for ((m, x), want) in inputs.iter().zip(&alone) {
                let linear = &linear;
                s.spawn(move || {
                    let mut y = vec![0.0; m * n];
                    for _ in 0..ROUNDS {
                        linear.forward(x, *m, &mut y).unwrap();
                        assert!(
                            y.iter().zip(want).all(|(a, b)| a.to_bits() == b.to_bits()),
                            "{} linear: a result under concurrency differs",
                            linear.weight_format()
                        );
                    }
                });
            }
        });
    }
}

#[test]
fn sessions_on_several_threads_share_one_model_and_generate_what_one_alone_does() {
    use rknn_llm::model::{CacheType, Logits, Model, Sequence};
    use rknn_llm::sample::SamplerConfig;
    use rknn_llm::session::{GenerateParams, Session};
    fn assert_send<T: Send>() {}
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send::<Session>();
    assert_send::<Sequence>();
    assert_send_sync::<Model>();
    for file in tiny_models() {
        let pool = Arc::new(
            rayon::ThreadPoolBuilder::new()
                .num_threads(2)
                .build()
                .unwrap(),
        );
        let mut factory = HostF32Factory::new(pool.clone());
        let model = Arc::new(Model::load(&file, &mut factory, pool, &mut |_, _| {}).unwrap());
        let tok = Arc::new(Tokenizer::from_gguf(&file).unwrap());
        let greedy = SamplerConfig {
            temperature: 0.0,
            ..SamplerConfig::default()
        };
        let params = GenerateParams {
            max_tokens: Some(12),
            ..GenerateParams::default()
        };
        let prompts = ["once upon a time", "the quick brown fox", "1 2 3 4 5"];
        let run = |prompt: &str| -> (Vec<u32>, Vec<u32>) {
            let mut s = Session::new(model.clone(), tok.clone(), greedy.clone()).unwrap();
            s.set_cache_type(CacheType::F16);
            let g = s.generate(prompt, &params).unwrap().finish().unwrap();
            // The model's logits for the whole history, in one sequence of this thread.
            let mut seq = model.sequence(CacheType::F16);
            let logits = model
                .forward(&mut seq, s.history(), 0, Logits::Last)
                .unwrap();
            (g.generated, logits.iter().map(|v| v.to_bits()).collect())
        };
        let alone: Vec<_> = prompts.iter().map(|p| run(p)).collect();
        assert!(alone.iter().all(|(g, _)| !g.is_empty()));
        std::thread::scope(|s| {
            let handles: Vec<_> = (0..THREADS * prompts.len())
                .map(|i| {
                    let p = prompts[i % prompts.len()];
                    let run = &run;
                    s.spawn(move || {
                        (
                            i % prompts.len(),
                            (0..ROUNDS / 5).map(|_| run(p)).collect::<Vec<_>>(),
                        )
                    })
                })
                .collect();
            for h in handles {
                let (i, got) = h.join().unwrap();
                assert!(
                    got.iter().all(|g| *g == alone[i]),
                    "prompt {i}: a session under concurrency differs"
                );
            }
        });
    }
}
