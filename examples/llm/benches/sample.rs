//! Choosing a token from one row of logits the size of the demo model's vocabulary (49 152),
//! one thread, against sorting the whole row (what top-k sampling did before it became a
//! single pass), measured in the same run:
//!
//! ```sh
//! cargo bench -p rknn-llm --bench sample
//! ```
//!
//! The row is fixed pseudo-random logits with ties; the sampler uses llama.cpp's defaults
//! (temperature 0.8, top-k 40, top-p 0.95) and then greedy, each with and without a repetition
//! penalty over 64 recent tokens.

use std::hint::black_box;

use rknn_llm::sample::{Rng, Sampler, SamplerConfig};

const VOCAB: usize = 49_152;

mod common;
use common::per_call;

fn main() {
    let mut rng = Rng::new(11);
    let logits: Vec<f32> = (0..VOCAB)
        .map(|_| (rng.next_u64() % 20_000) as f32 / 1000.0 - 10.0)
        .collect();
    let n = if std::env::var_os("BENCH_QUICK").is_some() {
        20
    } else {
        200
    };
    let sort_all = per_call(n, || {
        let mut c: Vec<(u32, f32)> = logits
            .iter()
            .enumerate()
            .map(|(i, &l)| (i as u32, l))
            .collect();
        c.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        c.truncate(40);
        black_box(c);
    });
    println!(
        "vocabulary {VOCAB}, one thread; baseline: sorting the whole row {:.1} µs",
        sort_all.as_secs_f64() * 1e6
    );
    println!("| sampler | µs per token | baseline / this |");
    println!("|---|---:|---:|");
    for (name, temperature, penalty) in [
        ("top-k 40, top-p 0.95, T 0.8", 0.8, 1.0),
        ("the same, repetition penalty 1.1", 0.8, 1.1),
        ("greedy", 0.0, 1.0),
        ("greedy, repetition penalty 1.1", 0.0, 1.1),
    ] {
        let mut s = Sampler::new(SamplerConfig {
            temperature,
            repeat_penalty: penalty,
            seed: 3,
            ..SamplerConfig::default()
        });
        (0..64).for_each(|i| s.accept(i * 701 % VOCAB as u32));
        let t = per_call(n, || {
            black_box(s.sample(black_box(&logits)));
        });
        println!(
            "| {name} | {:.1} | {:.1} |",
            t.as_secs_f64() * 1e6,
            sort_all.as_secs_f64() / t.as_secs_f64()
        );
    }
}
