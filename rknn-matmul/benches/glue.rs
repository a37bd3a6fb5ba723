//! Throughput of the engine's host glue kernels against memcpy of the same number of bytes.
//!
//! For each shape (decode m=1 with k=4096 and k=15360, n=4096; prefill m=512, k=4096,
//! n=1024) and kernel, the selected backend and the scalar one are timed, and so is
//! `copy_from_slice` of a buffer half the kernel's traffic (so memcpy moves the same bytes:
//! read + written) right before, in the same run. Figures are GB/s of bytes read + written,
//! best of several batches.
//!
//! `cargo bench -p rknn-matmul --bench glue`; `BENCH_QUICK=1` for a fast run (shorter timing
//! batches, noisier figures).

use half::f16;
use rknn_matmul::engine::glue;
use std::hint::black_box;
use std::time::{Duration, Instant};

/// Seconds per call of each of `n` variants of `f` (`f(i)` runs variant `i`): the best of
/// `BATCHES` batches per variant, each about `budget / BATCHES` long. The variants' batches
/// alternate, so a burst of load from other processes on the machine hits them alike.
fn time_per_call(budget: Duration, n: usize, mut f: impl FnMut(usize)) -> Vec<f64> {
    const BATCHES: u32 = 7;
    let per_batch = budget / BATCHES;
    let iters: Vec<u64> = (0..n)
        .map(|i| {
            f(i); // warm caches and page in the buffers
            let start = Instant::now();
            f(i);
            let once = start.elapsed().max(Duration::from_nanos(50));
            (per_batch.as_secs_f64() / once.as_secs_f64()).clamp(1.0, 1e7) as u64
        })
        .collect();
    let mut best = vec![f64::INFINITY; n];
    for _ in 0..BATCHES {
        for i in 0..n {
            let t = Instant::now();
            for _ in 0..iters[i] {
                f(i);
            }
            best[i] = best[i].min(t.elapsed().as_secs_f64() / iters[i] as f64);
        }
    }
    best
}

struct Shape {
    name: &'static str,
    m: usize,
    k: usize,
    n: usize,
}

/// Buffers for one shape, shared by both backends.
struct Buffers {
    x: Vec<f32>,
    q: Vec<i8>,
    scales: Vec<f32>,
    packed: Vec<i8>,
    packed16: Vec<f16>,
    c_i32: Vec<i32>,
    acc: Vec<i32>,
    ch_scales: Vec<f32>,
    c_f32: Vec<f32>,
    out: Vec<f32>,
}

impl Buffers {
    fn new(s: &Shape) -> Buffers {
        let mut rng = fastrand::Rng::with_seed(1);
        let (m, k, n) = (s.m, s.k, s.n);
        Buffers {
            x: (0..m * k).map(|_| (rng.f32() - 0.5) * 6.0).collect(),
            q: (0..m * k).map(|_| rng.i8(-127..=127)).collect(),
            scales: (0..m).map(|_| rng.f32() * 0.05).collect(),
            packed: vec![0; m * k],
            packed16: vec![f16::ZERO; m * k],
            c_i32: (0..m * n).map(|_| rng.i32(-1 << 20..1 << 20)).collect(),
            acc: vec![0; m * n],
            ch_scales: (0..n).map(|_| rng.f32() * 0.01).collect(),
            c_f32: (0..m * n).map(|_| rng.f32() - 0.5).collect(),
            out: vec![0.0; m * n],
        }
    }
}

/// The kernels, by name: bytes moved per call and a runner for the selected (`true`) or the
/// scalar (`false`) backend.
type Runner = fn(&Shape, &mut Buffers, bool);

fn kernels(s: &Shape) -> Vec<(&'static str, usize, Runner)> {
    let (m, k, n) = (s.m, s.k, s.n);
    vec![
        ("quantize_rows", 4 * m * k + m * k + 4 * m, |s, b, fast| {
            let f = if fast {
                glue::quantize_rows
            } else {
                glue::scalar::quantize_rows
            };
            f(&b.x, s.m, s.k, s.k, &mut b.q, &mut b.scales);
        }),
        ("pack_a_native_i8", 2 * m * k, |s, b, fast| {
            let f = if fast {
                glue::pack_a_native_i8
            } else {
                glue::scalar::pack_a_native_i8
            };
            f(&b.q, s.m, s.k, 0, s.k, 16, &mut b.packed);
        }),
        ("pack_a_native_f16", 4 * m * k + 2 * m * k, |s, b, fast| {
            let f = if fast {
                glue::pack_a_native_f16
            } else {
                glue::scalar::pack_a_native_f16
            };
            f(&b.x, s.m, s.k, 0, s.k, 8, &mut b.packed16);
        }),
        ("accumulate_c_i32 first", 8 * m * n, |s, b, fast| {
            let f = if fast {
                glue::accumulate_c_native_i32
            } else {
                glue::scalar::accumulate_c_native_i32
            };
            f(&b.c_i32, s.m, s.n, 4, &mut b.acc, true);
        }),
        ("accumulate_c_i32 +=", 12 * m * n, |s, b, fast| {
            let f = if fast {
                glue::accumulate_c_native_i32
            } else {
                glue::scalar::accumulate_c_native_i32
            };
            f(&b.c_i32, s.m, s.n, 4, &mut b.acc, false);
        }),
        ("scale_out", 8 * m * n + 4 * m + 4 * n, |s, b, fast| {
            let f = if fast {
                glue::scale_out
            } else {
                glue::scalar::scale_out
            };
            f(
                &b.acc,
                s.m,
                s.n,
                &b.scales,
                &b.ch_scales,
                &mut b.out,
                s.n,
                0,
            );
        }),
        ("accumulate_c_f32 first", 8 * m * n, |s, b, fast| {
            let f = if fast {
                glue::accumulate_c_native_f32
            } else {
                glue::scalar::accumulate_c_native_f32
            };
            f(&b.c_f32, s.m, s.n, 4, &mut b.out, s.n, 0, true);
        }),
        ("accumulate_c_f32 +=", 12 * m * n, |s, b, fast| {
            let f = if fast {
                glue::accumulate_c_native_f32
            } else {
                glue::scalar::accumulate_c_native_f32
            };
            f(&b.c_f32, s.m, s.n, 4, &mut b.out, s.n, 0, false);
        }),
    ]
}

fn main() {
    let quick = std::env::var_os("BENCH_QUICK").is_some_and(|v| !v.is_empty() && v != "0");
    let budget = Duration::from_millis(if quick { 20 } else { 250 });
    let shapes = [
        Shape {
            name: "decode m=1 k=4096 n=4096",
            m: 1,
            k: 4096,
            n: 4096,
        },
        Shape {
            name: "decode m=1 k=15360 n=4096",
            m: 1,
            k: 15360,
            n: 4096,
        },
        Shape {
            name: "prefill m=512 k=4096 n=1024",
            m: 512,
            k: 4096,
            n: 1024,
        },
    ];
    let backend = glue::backend();
    println!(
        "glue kernels, backend `{backend}`{}; GB/s of bytes read + written, best of 7 interleaved batches",
        if quick { " (BENCH_QUICK)" } else { "" }
    );
    println!();
    println!(
        "| shape | kernel | bytes | memcpy GB/s | {backend} GB/s | {backend} / memcpy | scalar GB/s | scalar / memcpy |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|---:|");
    for shape in &shapes {
        let mut bufs = Buffers::new(shape);
        for (name, bytes, run) in kernels(shape) {
            let src = vec![1u8; bytes / 2];
            let mut dst = vec![0u8; bytes / 2];
            let t = time_per_call(budget, 3, |variant| match variant {
                0 => {
                    dst.copy_from_slice(black_box(&src));
                    black_box(&mut dst);
                }
                v => run(shape, black_box(&mut bufs), v == 1),
            });
            let (t_copy, t_fast, t_scalar) = (t[0], t[1], t[2]);
            let gbs = |t: f64| bytes as f64 / t / 1e9;
            let copy = 2.0 * (bytes / 2) as f64 / t_copy / 1e9;
            println!(
                "| {} | {name} | {bytes} | {copy:.1} | {:.1} | {:.2} | {:.1} | {:.2} |",
                shape.name,
                gbs(t_fast),
                gbs(t_fast) / copy,
                gbs(t_scalar),
                gbs(t_scalar) / copy,
            );
        }
    }
}
