//! Engine benchmark on the emulator: dispatch overhead of the per-core scheduler, the cost of
//! a trivial 3-context forward at M = 1, and end-to-end throughput at M = 1, 128, 512 compared
//! with the emulator's own single-context matmul in the same run.
//!
//! ```text
//! cargo bench -p rknn-matmul --bench engine            # BENCH_QUICK=1 for a short run
//! ```

use std::time::{Duration, Instant};

use rknn_matmul::engine::topology::Pinning;
use rknn_matmul::engine::{Engine, EngineConfig, WeightFormat};
use rknn_matmul::{I8xI8ToI32, Layout, Platform, Runtime};

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn time_per_call(iters: usize, mut f: impl FnMut()) -> Duration {
    f();
    let samples: Vec<Duration> = (0..9)
        .map(|_| {
            let t = Instant::now();
            for _ in 0..iters {
                f();
            }
            t.elapsed() / iters as u32
        })
        .collect();
    median(samples)
}

fn main() {
    let quick = std::env::var_os("BENCH_QUICK").is_some();
    let rt = Runtime::emulator(Platform::Rk3588).expect("emulator");
    // This machine may have fewer CPUs than the board; do not pin in the benchmark.
    let cfg = EngineConfig {
        pinning: Pinning::None,
        ..EngineConfig::default()
    };
    let engine = Engine::new(&rt, cfg).expect("engine");
    println!(
        "workers: {}, cpus: {}",
        engine.workers(),
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );

    let ping_iters = if quick { 2_000 } else { 20_000 };
    // Baseline: a round trip through std's channels to one thread.
    let (to_tx, to_rx) = std::sync::mpsc::channel::<()>();
    let (back_tx, back_rx) = std::sync::mpsc::channel::<()>();
    let echo = std::thread::spawn(move || {
        while to_rx.recv().is_ok() {
            back_tx.send(()).unwrap();
        }
    });
    let chan = time_per_call(ping_iters, || {
        to_tx.send(()).unwrap();
        back_rx.recv().unwrap();
    });
    drop(to_tx);
    echo.join().unwrap();
    println!(
        "baseline: mpsc channel round trip to 1 thread: {:.2} us",
        chan.as_secs_f64() * 1e6
    );
    for workers in 1..=3 {
        let e = Engine::new(
            &rt,
            EngineConfig {
                cores: Some(workers),
                pinning: Pinning::None,
                ..EngineConfig::default()
            },
        )
        .unwrap();
        let ping = time_per_call(ping_iters, || e.ping().unwrap());
        println!(
            "dispatch round trip to {workers} worker(s) (empty task): {:.2} us",
            ping.as_secs_f64() * 1e6
        );
    }

    let (k, n) = (32, 96); // three shards of 32 columns: one context per core
    let w: Vec<f32> = (0..n * k).map(|i| (i % 13) as f32 - 6.0).collect();
    let lin = engine.linear(&w, n, k, WeightFormat::W8A8).unwrap();
    let x: Vec<f32> = (0..k).map(|i| i as f32 / 7.0).collect();
    let mut out = vec![0.0; n];
    let trivial = time_per_call(if quick { 1_000 } else { 10_000 }, || {
        lin.forward(&x, 1, &mut out).unwrap()
    });
    println!(
        "trivial forward, 3 contexts, M=1 K=32 N=96: {:.2} us per call",
        trivial.as_secs_f64() * 1e6
    );

    let big = if quick { 1024 } else { 4096 };
    let w: Vec<f32> = (0..big * big)
        .map(|i| ((i * 7919) % 255) as f32 / 127.0 - 1.0)
        .collect();
    let lin = engine.linear(&w, big, big, WeightFormat::W8A8).unwrap();
    // Reference: one emulated context doing the whole matmul on this thread.
    println!(
        "\n{:>5} {:>6} {:>6} {:>14} {:>14} {:>8} {:>10}",
        "M", "K", "N", "engine GOPS", "1-ctx GOPS", "ratio", "glue/run"
    );
    for m in [1usize, 128, 512] {
        let x: Vec<f32> = (0..m * big)
            .map(|i| ((i * 31) % 97) as f32 / 50.0 - 1.0)
            .collect();
        let mut out = vec![0.0; m * big];
        let iters = if m == 1 { 20 } else { 2 };
        engine.reset_stats();
        let t = time_per_call(iters, || lin.forward(&x, m, &mut out).unwrap());
        let stats = engine.stats();
        let gops = 2.0 * (m * big * big) as f64 / t.as_secs_f64() / 1e9;
        let mm = rt
            .matmul::<I8xI8ToI32>(m, big, big)
            .b_layout(Layout::Native)
            .ac_layout(Layout::Native)
            .build()
            .unwrap();
        let (a, b, mut c) = (
            mm.alloc_a().unwrap(),
            mm.alloc_b().unwrap(),
            mm.alloc_c().unwrap(),
        );
        let t1 = time_per_call(iters, || mm.run(&a, &b, &mut c).unwrap());
        let g1 = 2.0 * (m * big * big) as f64 / t1.as_secs_f64() / 1e9;
        println!(
            "{m:>5} {big:>6} {big:>6} {gops:>14.2} {g1:>14.2} {:>8.2} {:>10.3}",
            gops / g1,
            stats.glue_to_run_ratio()
        );
    }
    println!("\n{}", engine.stats());
}
