//! What one forward of a small linear costs when its state has left the CPU caches, as it has
//! in decode: each token streams every weight (134.5 MB for the demo model) past a 32 MB L3,
//! so a linear's own state (the engine's shard and context wrappers, the runtime's records) is
//! cold when its next forward comes, a token later.
//!
//! ```text
//! cargo bench -p rknn-matmul --bench cold_forward       # BENCH_QUICK=1 for a short run
//! ```
//!
//! 121 W8A8 linears of K = N = 64 (the demo model's count; 4 KB of weights each, so the
//! weights themselves cost nothing), M = 1, on one lane and on two. Three cases, µs per
//! forward, medians of rounds: the same linear again and again (hot); the 121 in turn (their
//! state fits in L2 and L3); the 121 in turn after a 64 MB read before each round (cold, as in
//! decode). Cold minus hot is the per-forward state the cache misses cost.

use std::hint::black_box;
use std::time::Instant;

use rknn_matmul::engine::topology::Pinning;
use rknn_matmul::engine::{Engine, EngineConfig, Linear, WeightFormat};
use rknn_matmul::{Platform, Runtime};

const LINEARS: usize = 121;
const DIM: usize = 64;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// A read of `words` that the compiler cannot drop.
fn read_all(words: &[u64]) -> u64 {
    words.iter().fold(0u64, |a, &w| a.wrapping_add(w))
}

fn main() {
    let quick = std::env::var_os("BENCH_QUICK").is_some();
    let rounds = if quick { 15 } else { 101 };
    let rt = Runtime::emulator(Platform::Rk3588).expect("emulator");
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let flush: Vec<u64> = (0..(64 << 20) / 8).map(|i| i as u64).collect();
    let w: Vec<f32> = (0..DIM * DIM)
        .map(|i| ((i * 7) % 13) as f32 - 6.0)
        .collect();
    let x: Vec<f32> = (0..DIM).map(|i| i as f32 * 0.1 - 3.0).collect();
    let mut out = vec![0.0f32; DIM];
    println!("| lanes | hot (one linear again) | 121 in turn | 121 in turn after a 64 MB read |");
    println!("|---:|---:|---:|---:|");
    for lanes in [1, 2] {
        if lanes > cpus {
            println!("| {lanes} | skipped: more lanes than the {cpus} CPUs | | |");
            continue;
        }
        let cfg = EngineConfig {
            cores: Some(lanes),
            pinning: Pinning::None,
            ..EngineConfig::default()
        };
        let engine = Engine::new(&rt, cfg).expect("engine");
        let linears: Vec<Linear> = (0..LINEARS)
            .map(|_| {
                engine
                    .linear(&w, DIM, DIM, WeightFormat::W8A8)
                    .expect("linear")
            })
            .collect();
        let mut forward = |l: &Linear| l.forward(black_box(&x), 1, &mut out).expect("forward");
        let per_forward = |flush_first: bool, each: &mut dyn FnMut()| {
            let samples: Vec<f64> = (0..rounds)
                .map(|_| {
                    if flush_first {
                        black_box(read_all(&flush));
                    }
                    let t = Instant::now();
                    each();
                    t.elapsed().as_secs_f64() * 1e6 / LINEARS as f64
                })
                .collect();
            median(samples)
        };
        let hot = per_forward(false, &mut || {
            (0..LINEARS).for_each(|_| forward(&linears[0]))
        });
        let turn = per_forward(false, &mut || linears.iter().for_each(&mut forward));
        let cold = per_forward(true, &mut || linears.iter().for_each(&mut forward));
        println!("| {lanes} | {hot:.2} µs | {turn:.2} µs | {cold:.2} µs |");
    }
}
