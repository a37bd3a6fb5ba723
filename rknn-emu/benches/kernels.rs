//! Throughput of the emulator's matrix kernels: `C[M, N] = A[M, K] * B[K, N]` for `M = 1`
//! (a streaming matrix-vector product) and `M = 512`, with `K = N = 4096`.
//!
//! Run with `cargo bench -p rknn-emu --bench kernels`; pass `--quick` (after `--`) or set
//! `BENCH_QUICK=1` for `K = N = 1024` and `M = 1, 64`. A last table streams a B of 288 MiB
//! (72 MiB quick; K = 576) at `M = 1, 2, 8, 32`, as decode and its verify passes do, against a plain streaming
//! read, then at `M = 1` with two threads at once, each on half of B (the engine's two lanes
//! in decode), against a plain read by two threads; `--dram` runs only that table. Each figure
//! is the best of several runs (at least 3 and at least ~1 s), single-threaded but for that
//! last pair. GOPS counts a multiply and an add as two operations: `2 * M * N * K / time`.
//!
//! Compared, in one run: a textbook triple loop on i8 (`B` as `[K, N]` row-major, i32 sum),
//! `gemm_i8_i32` with every available backend (the scalar one is the plain dot-product loop on
//! the transposed layout, which the compiler may auto-vectorise), at `M = 1` the native-B
//! kernel `gemm_i8_native_b` (B in the NPU's int8 layout), `gemm_f32` likewise, and
//! `matrixmultiply::sgemm` on the same data as f32, with B both in its natural `[K, N]`
//! layout and in the kernels' transposed one (through strides). Slow kernels are timed on fewer rows of `A`
//! and their per-operation rate is extrapolated; the table says so.

use std::hint::black_box;
use std::time::{Duration, Instant};

use rknn_chip::layout::NativeB;
use rknn_emu::kernels::{
    KernelBackend, NATIVE_B_SK, NativeBShape, available_backends, gemm_f32, gemm_f32_with,
    gemm_i8_i32, gemm_i8_i32_with, gemm_i8_native_b, gemm_i8_native_b_with, selected_backend,
};

/// Best wall time of `f` over at least `min_reps` runs and at least `min_total` in total
/// (after one warm-up run).
fn best_time(mut f: impl FnMut(), min_reps: usize, min_total: Duration) -> f64 {
    f();
    let (mut best, mut total, mut reps) = (f64::INFINITY, Duration::ZERO, 0);
    while reps < min_reps || total < min_total {
        let t = Instant::now();
        f();
        let dt = t.elapsed();
        best = best.min(dt.as_secs_f64());
        total += dt;
        reps += 1;
    }
    best
}

/// The textbook loop: `B` row-major `[K, N]`, one i32 sum per output.
fn naive_i8(a: &[i8], b: &[i8], c: &mut [i32], m: usize, n: usize, k: usize) {
    for i in 0..m {
        for j in 0..n {
            let mut s = 0i32;
            for p in 0..k {
                s = s.wrapping_add(i32::from(a[i * k + p]) * i32::from(b[p * n + j]));
            }
            c[i * n + j] = s;
        }
    }
}

/// One line of the results table.
struct Line {
    kernel: String,
    backend: String,
    /// Rows of A actually timed.
    m_timed: usize,
    secs: f64,
    gops: f64,
}

/// Times `run(rows)` on `rows` rows of A: all `m`, or for a slow kernel (`budget` given)
/// fewer when a full run (estimated from one run on a few rows) would take more than `budget`
/// seconds.
fn measure(
    kernel: &str,
    backend: &str,
    (m, n, k): (usize, usize, usize),
    budget: Option<f64>,
    mut run: impl FnMut(usize),
) -> Line {
    let rows = match budget {
        None => m,
        Some(budget) => {
            let probe = m.min(4);
            let t = Instant::now();
            run(probe);
            let est = t.elapsed().as_secs_f64() * m as f64 / probe as f64;
            if est <= budget {
                m
            } else {
                ((budget / est * m as f64) as usize).clamp(probe, m)
            }
        }
    };
    let secs = best_time(|| run(rows), 3, Duration::from_millis(1000));
    let gops = 2.0 * (rows * n * k) as f64 / secs / 1e9;
    eprintln!(
        "  {kernel:<22} {backend:<22} M={rows:<4} {:>10.3} ms {gops:>8.2} GOPS",
        secs * 1e3
    );
    Line {
        kernel: kernel.to_string(),
        backend: backend.to_string(),
        m_timed: rows,
        secs,
        gops,
    }
}

fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name") || l.starts_with("CPU part"))
                .and_then(|l| l.split(':').nth(1))
                .map(|v| v.trim().to_string())
        })
        .unwrap_or_else(|| "unknown".to_string())
}

fn bench_m(m: usize, n: usize, k: usize, rng: &mut fastrand::Rng) {
    let a: Vec<i8> = (0..m * k).map(|_| rng.i8(..)).collect();
    let bt: Vec<i8> = (0..n * k).map(|_| rng.i8(..)).collect();
    // The textbook layout for the naive loop: B as [K, N].
    let mut b = vec![0i8; k * n];
    for j in 0..n {
        for p in 0..k {
            b[p * n + j] = bt[j * k + p];
        }
    }
    let af: Vec<f32> = a.iter().map(|&x| f32::from(x)).collect();
    let btf: Vec<f32> = bt.iter().map(|&x| f32::from(x)).collect();
    let mut ci = vec![0i32; m * n];
    let mut cf = vec![0f32; m * n];
    let shape = (m, n, k);
    // Only the naive loop and the scalar kernels may be timed on fewer rows.
    let slow = Some(1.5);
    let mut lines = Vec::new();

    eprintln!("M={m} N={n} K={k}:");
    lines.push(measure("naive i8 triple loop", "-", shape, slow, |rows| {
        naive_i8(black_box(&a), black_box(&b), &mut ci, rows, n, k);
        black_box(&ci);
    }));

    let mut reference = vec![0i32; m * n];
    gemm_i8_i32_with(KernelBackend::Scalar, &a, &bt, &mut reference, m, n, k).unwrap();
    let budget_of = |b: KernelBackend| {
        if b == KernelBackend::Scalar {
            slow
        } else {
            None
        }
    };
    let selected = selected_backend();
    let selected_label = format!("{selected} (selected)");
    let runs = available_backends()
        .into_iter()
        .map(|b| (Some(b), b.name().to_string(), budget_of(b)))
        .chain([(None, selected_label, budget_of(selected))])
        .collect::<Vec<_>>();

    for (backend, label, budget) in &runs {
        lines.push(measure("gemm_i8_i32", label, shape, *budget, |rows| {
            let (a, bt) = (black_box(&a[..rows * k]), black_box(&bt));
            match backend {
                Some(b) => gemm_i8_i32_with(*b, a, bt, &mut ci, rows, n, k).unwrap(),
                None => gemm_i8_i32(a, bt, &mut ci, rows, n, k),
            }
            black_box(&ci);
        }));
        if let Some(b) = backend {
            gemm_i8_i32_with(*b, &a, &bt, &mut ci, m, n, k).unwrap();
            assert_eq!(ci, reference, "{b} disagrees with the scalar kernel");
        }
    }
    // The native-B kernel (B in the NPU's int8 layout, read in storage order) serves M <= 3.
    if m <= 3 {
        let geo = NativeB::new(k, n, 32, NATIVE_B_SK, None).expect("native B geometry");
        let mut native = vec![0i8; geo.len()];
        geo.pack_from_nk(&bt, &mut native);
        for (backend, label, budget) in &runs {
            lines.push(measure("gemm_i8_native_b", label, shape, *budget, |rows| {
                let s = NativeBShape {
                    m: rows,
                    n,
                    k,
                    sn: 32,
                    lda: k,
                };
                let (a, b) = (black_box(&a[..rows * k]), black_box(&native));
                match backend {
                    Some(be) => gemm_i8_native_b_with(*be, a, b, &mut ci, s, false).unwrap(),
                    None => gemm_i8_native_b(a, b, &mut ci, s, false),
                }
                black_box(&ci);
            }));
            let s = NativeBShape {
                m,
                n,
                k,
                sn: 32,
                lda: k,
            };
            gemm_i8_native_b(&a, &native, &mut ci, s, false);
            assert_eq!(ci, reference, "{label}: the native-B kernel disagrees");
        }
    }
    for (backend, label, budget) in &runs {
        lines.push(measure("gemm_f32", label, shape, *budget, |rows| {
            let (a, bt) = (black_box(&af[..rows * k]), black_box(&btf));
            match backend {
                Some(b) => gemm_f32_with(*b, a, bt, &mut cf, rows, n, k).unwrap(),
                None => gemm_f32(a, bt, &mut cf, rows, n, k),
            }
            black_box(&cf);
        }));
    }

    let bf: Vec<f32> = b.iter().map(|&x| f32::from(x)).collect();
    for (label, b_ptr, rsb, csb) in [
        ("B [K,N]", bf.as_ptr(), n as isize, 1),
        ("B as Bt [N,K]", btf.as_ptr(), 1, k as isize),
    ] {
        lines.push(measure(
            "matrixmultiply::sgemm",
            label,
            shape,
            None,
            |rows| {
                // SAFETY: A is `rows x k` row-major inside `af` (rows <= m); B is `k x n` with the
                // given strides inside `bf` / `btf`, which outlive the call; C is `rows x n`
                // row-major inside `cf`, which nothing else borrows during the call.
                unsafe {
                    matrixmultiply::sgemm(
                        rows,
                        k,
                        n,
                        1.0,
                        black_box(af.as_ptr()),
                        k as isize,
                        1,
                        black_box(b_ptr),
                        rsb,
                        csb,
                        0.0,
                        cf.as_mut_ptr(),
                        n as isize,
                        1,
                    )
                };
                black_box(&cf);
            },
        ));
    }

    let naive = lines[0].gops;
    let sgemm = lines
        .iter()
        .filter(|l| l.kernel.starts_with("matrixmultiply"))
        .map(|l| l.gops)
        .fold(f64::NAN, f64::max);
    println!();
    println!("M = {m}, N = {n}, K = {k}");
    println!();
    println!(
        "| kernel | backend / layout | time for M={m} (ms) | GOPS | / naive | / sgemm | note |"
    );
    println!("|---|---|---:|---:|---:|---:|---|");
    for l in &lines {
        let full_secs = l.secs * m as f64 / l.m_timed as f64;
        let note = if l.m_timed < m {
            format!("timed at M={}, extrapolated", l.m_timed)
        } else {
            String::new()
        };
        println!(
            "| {} | {} | {:.3} | {:.2} | {:.2}x | {:.2}x | {} |",
            l.kernel,
            l.backend,
            full_secs * 1e3,
            l.gops,
            l.gops / naive,
            l.gops / sgemm,
            note
        );
    }
    println!();
    println!(
        "`/ naive`: GOPS over the naive i8 loop's; `/ sgemm`: over the faster sgemm layout's \
         (i8 operations against f32 ones for the i8 rows)."
    );
}

/// Sum of the words, in eight independent lanes so that the loads, not an add chain, bound it.
fn sum_words(words: &[u64]) -> u64 {
    let mut acc = [0u64; 8];
    for chunk in words.chunks_exact(8) {
        for (a, &w) in acc.iter_mut().zip(chunk) {
            *a = a.wrapping_add(w);
        }
    }
    acc.iter().fold(0, |s, &a| s.wrapping_add(a))
}

/// `M = 1` with B far beyond the caches, as in decode: the selected backend's kernels, in GB/s
/// of B, against a plain streaming read of as many bytes on this thread.
fn bench_dram(n: usize, k: usize, rng: &mut fastrand::Rng) {
    let a: Vec<i8> = (0..k).map(|_| rng.i8(..)).collect();
    let bt: Vec<i8> = (0..n * k).map(|_| rng.i8(..)).collect();
    let geo = NativeB::new(k, n, 32, NATIVE_B_SK, None).expect("native B geometry");
    let mut native = vec![0i8; geo.len()];
    geo.pack_from_nk(&bt, &mut native);
    let words: Vec<u64> = (0..(n * k / 8) as u64).collect();
    let mut c = vec![0i32; n];
    let gbs = |secs: f64| (n * k) as f64 / secs / 1e9;
    let time = |f: &mut dyn FnMut()| best_time(f, 5, Duration::from_millis(500));
    let stream = gbs(time(&mut || {
        black_box(sum_words(black_box(&words)));
    }));
    let dot = gbs(time(&mut || {
        gemm_i8_i32(black_box(&a), black_box(&bt), &mut c, 1, n, k);
        black_box(&c);
    }));
    let shape = NativeBShape {
        m: 1,
        n,
        k,
        sn: 32,
        lda: k,
    };
    let nat = gbs(time(&mut || {
        gemm_i8_native_b(black_box(&a), black_box(&native), &mut c, shape, false);
        black_box(&c);
    }));
    // More rows: a linear whose activations are quantised twice (row and residual) runs 2,
    // speculative verify passes 2-32.
    let more: Vec<(usize, f64)> = [2, 8, 32]
        .into_iter()
        .map(|m| {
            let am: Vec<i8> = (0..m * k).map(|_| rng.i8(..)).collect();
            let mut cm = vec![0i32; m * n];
            let shape = NativeBShape { m, ..shape };
            let g = gbs(time(&mut || {
                gemm_i8_native_b(black_box(&am), black_box(&native), &mut cm, shape, false);
                black_box(&cm);
            }));
            (m, g)
        })
        .collect();
    // Two threads at once, each on its half of B (the engine's two lanes in decode): the
    // memory bus, not one core, is the limit, and the kernel should reach the same share of it
    // as a plain read by two threads.
    let (half, words_half) = (native.len() / 2, words.len() / 2);
    let half_shape = NativeBShape { n: n / 2, ..shape };
    let pair = |f: &(dyn Fn(usize) + Sync)| {
        std::thread::scope(|s| {
            let other = s.spawn(|| f(1));
            f(0);
            other.join().expect("no panic");
        })
    };
    let stream2 = gbs(time(&mut || {
        pair(&|i| {
            black_box(sum_words(black_box(&words[i * words_half..][..words_half])));
        })
    }));
    let nat2 = gbs(time(&mut || {
        pair(&|i| {
            let mut ci = vec![0i32; n / 2];
            let b = &native[i * half..][..half];
            gemm_i8_native_b(black_box(&a), black_box(b), &mut ci, half_shape, false);
            black_box(&ci);
        })
    }));
    println!();
    println!(
        "M = 1, N = {n}, K = {k}: B is {} MiB, beyond the caches (selected backend `{}`)",
        (n * k) >> 20,
        selected_backend()
    );
    println!();
    println!("| kernel | GB/s of B | / streaming read |");
    println!("|---|---:|---:|");
    for (name, g) in [
        ("streaming read (sum of u64 words)".to_string(), stream),
        ("gemm_i8_i32 (B as [N, K])".to_string(), dot),
        ("gemm_i8_native_b (native B)".to_string(), nat),
    ]
    .into_iter()
    .chain(
        more.iter()
            .map(|&(m, g)| (format!("gemm_i8_native_b (native B), M = {m}"), g)),
    ) {
        println!("| {name} | {g:.2} | {:.2} |", g / stream);
    }
    println!();
    println!("Two threads at once, each on half of B:");
    println!();
    println!("| kernel | GB/s of B | / streaming read, 2 threads |");
    println!("|---|---:|---:|");
    println!("| streaming read, 2 threads | {stream2:.2} | 1.00 |");
    println!(
        "| gemm_i8_native_b (native B), 2 threads | {nat2:.2} | {:.2} |",
        nat2 / stream2
    );
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick")
        || std::env::var("BENCH_QUICK").is_ok_and(|v| !v.is_empty() && v != "0");
    let (n, k, ms) = if quick {
        (1024, 1024, [1, 64])
    } else {
        (4096, 4096, [1, 512])
    };
    println!(
        "rknn-emu kernels: CPU {:?}, {} logical CPUs, backends available {:?}, selected `{}`{}",
        cpu_model(),
        std::thread::available_parallelism().map_or(0, |p| p.get()),
        available_backends()
            .iter()
            .map(|b| b.name())
            .collect::<Vec<_>>(),
        selected_backend(),
        if quick { " (quick sizes)" } else { "" }
    );
    let mut rng = fastrand::Rng::with_seed(42);
    // `--dram`: only the matrix-vector table (the decode case).
    let dram_only = std::env::args().any(|a| a == "--dram");
    for m in ms.into_iter().filter(|_| !dram_only) {
        bench_m(m, n, k, &mut rng);
    }
    // K = 576: the hidden size of the model the decode benchmark of rknn-matmul plays.
    bench_dram(if quick { 131_072 } else { 524_288 }, 576, &mut rng);
}
