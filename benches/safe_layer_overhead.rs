//! What the safe layer costs per run: `Matmul::run` (bind checks, cache syncs, error mapping)
//! against the same run through the raw function table, on the emulator, in one process. Then
//! what two threads pay when they run at once, as the engine's lanes do in decode: each thread
//! its own context, all on one emulator instance against each on its own instance (the
//! difference is the per-call state the instance's threads share).
//!
//! ```text
//! cargo bench --bench safe_layer_overhead        # BENCH_QUICK=1 for a short run
//! ```

use std::time::{Duration, Instant};

use rknn_matmul::Platform;
use rknn_matmul::{I8xI8ToI32, Runtime};

fn median_per_call(iters: u32, mut f: impl FnMut()) -> Duration {
    f();
    median_of(9, || {
        let t = Instant::now();
        for _ in 0..iters {
            f();
        }
        t.elapsed() / iters
    })
}

fn main() {
    let iters = if std::env::var_os("BENCH_QUICK").is_some() {
        2_000
    } else {
        20_000
    };
    let rt = Runtime::emulator(Platform::Rk3588).unwrap();
    println!(
        "{:>5} {:>5} {:>5} {:>14} {:>14} {:>8}",
        "M", "K", "N", "safe run us", "raw run us", "ratio"
    );
    for (m, k, n) in [(1usize, 32usize, 32usize), (1, 1024, 1024), (16, 256, 256)] {
        let mm = rt.matmul::<I8xI8ToI32>(m, k, n).build().unwrap();
        let (a, b, mut c) = (
            mm.alloc_a().unwrap(),
            mm.alloc_b().unwrap(),
            mm.alloc_c().unwrap(),
        );
        let safe = median_per_call(iters, || mm.run(&a, &b, &mut c).unwrap());
        // The raw call on the same bound context: the safe layer adds everything else.
        let api = rt.api();
        let raw = median_per_call(iters, || {
            // SAFETY: the context is live and A, B, C are bound (by the runs above).
            let rc = unsafe { (api.rknn_matmul_run)(mm.as_raw()) };
            assert_eq!(rc, 0);
        });
        println!(
            "{m:>5} {k:>5} {n:>5} {:>14.3} {:>14.3} {:>8.2}",
            safe.as_secs_f64() * 1e6,
            raw.as_secs_f64() * 1e6,
            safe.as_secs_f64() / raw.as_secs_f64()
        );
    }
    let pairs_of = |rts: &[&Runtime]| -> Duration {
        let per_thread: Vec<Duration> = std::thread::scope(|s| {
            let hs: Vec<_> = rts
                .iter()
                .map(|&rt| {
                    s.spawn(move || {
                        let mm = rt.matmul::<I8xI8ToI32>(1, 32, 32).build().unwrap();
                        let (mut a, b, mut c) = (
                            mm.alloc_a().unwrap(),
                            mm.alloc_b().unwrap(),
                            mm.alloc_c().unwrap(),
                        );
                        // A written before every run, as the engine does: each run binds and
                        // syncs A, runs and syncs C back (four calls into the runtime).
                        median_per_call(iters, || {
                            a.as_mut_slice()[0] = 1;
                            mm.run(&a, &b, &mut c).unwrap()
                        })
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        per_thread.into_iter().max().unwrap()
    };
    let other = Runtime::emulator(Platform::Rk3588).unwrap();
    let one = median_of(5, || pairs_of(&[&rt, &rt]));
    let two = median_of(5, || pairs_of(&[&rt, &other]));
    let alone = median_of(5, || pairs_of(&[&rt]));
    println!(
        "\nM=1 K=32 N=32, A written before each run: {:.3} us per run alone; two threads at once: {:.3} us on one emulator, {:.3} us on two (ratio {:.2})",
        alone.as_secs_f64() * 1e6,
        one.as_secs_f64() * 1e6,
        two.as_secs_f64() * 1e6,
        one.as_secs_f64() / two.as_secs_f64()
    );
}

fn median_of(n: usize, mut f: impl FnMut() -> Duration) -> Duration {
    let mut v: Vec<Duration> = (0..n).map(|_| f()).collect();
    v.sort();
    v[n / 2]
}
