//! Throughput of the engine's host glue kernels against memcpy of the same number of bytes.
//!
//! For each shape (decode m=1 with k=4096 and k=15360, n=4096; prefill m=512, k=4096,
//! n=1024) and kernel, the selected backend and the scalar one are timed, and so is
//! `copy_from_slice` of a buffer half the kernel's traffic (so memcpy moves the same bytes:
//! read + written), interleaved with them in the same run; memcpy counts at its best of a few
//! destination alignments. Figures are GB/s of bytes read + written, best of several
//! batches. The kernels' buffers sit at distinct page offsets (see [`Placed`]).
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

/// Destination offsets tried for memcpy; the fastest counts. At L1-resident sizes glibc's
/// memcpy runs at half speed for some relative alignments of source and destination (4 KiB
/// aliasing), so one arbitrary pair of buffers would flatter the kernels.
const COPY_OFFSETS: [usize; 4] = [0, 64, 1024, 2112];

struct Shape {
    name: &'static str,
    m: usize,
    k: usize,
    n: usize,
}

/// A buffer placed at a chosen address modulo 4 KiB. The kernels, like memcpy, slow down by up
/// to 2x at L1-resident sizes when input and output share their page offset, so each buffer
/// gets its own offset (the placement a caller would choose) instead of whatever malloc gives.
struct Placed<T> {
    storage: Vec<T>,
    start: usize,
    len: usize,
}

impl<T: Copy + Default> Placed<T> {
    /// The `slot`-th buffer: its start is `slot * 576` bytes past a 4 KiB boundary.
    fn new(slot: usize, data: Vec<T>) -> Placed<T> {
        let size = std::mem::size_of::<T>();
        let len = data.len();
        let mut storage = data;
        storage.resize(len + 4096 / size + 1, T::default());
        let base = storage.as_ptr() as usize;
        let want = (slot * 576) % 4096;
        let start = ((want + 4096 - base % 4096) % 4096) / size;
        storage.copy_within(0..len, start);
        Placed {
            storage,
            start,
            len,
        }
    }
}

impl<T> std::ops::Deref for Placed<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        &self.storage[self.start..self.start + self.len]
    }
}

impl<T> std::ops::DerefMut for Placed<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        &mut self.storage[self.start..self.start + self.len]
    }
}

/// Buffers for one shape, shared by both backends.
struct Buffers {
    x: Placed<f32>,
    q: Placed<i8>,
    scales: Placed<f32>,
    packed: Placed<i8>,
    packed16: Placed<f16>,
    c_i32: Placed<i32>,
    acc: Placed<i32>,
    ch_scales: Placed<f32>,
    c_f32: Placed<f32>,
    out: Placed<f32>,
}

impl Buffers {
    fn new(s: &Shape) -> Buffers {
        let mut rng = fastrand::Rng::with_seed(1);
        let (m, k, n) = (s.m, s.k, s.n);
        Buffers {
            x: Placed::new(0, (0..m * k).map(|_| (rng.f32() - 0.5) * 6.0).collect()),
            q: Placed::new(1, (0..m * k).map(|_| rng.i8(-127..=127)).collect()),
            scales: Placed::new(2, (0..m).map(|_| rng.f32() * 0.05).collect()),
            packed: Placed::new(3, vec![0; m * k]),
            packed16: Placed::new(4, vec![f16::ZERO; m * k]),
            c_i32: Placed::new(5, (0..m * n).map(|_| rng.i32(-1 << 20..1 << 20)).collect()),
            acc: Placed::new(6, vec![0; m * n]),
            ch_scales: Placed::new(7, (0..n).map(|_| rng.f32() * 0.01).collect()),
            c_f32: Placed::new(8, (0..m * n).map(|_| rng.f32() - 0.5).collect()),
            out: Placed::new(9, vec![0.0; m * n]),
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
            let len = bytes / 2;
            let src = vec![1u8; len];
            let mut dst = vec![0u8; len + 4096];
            let t = time_per_call(budget, 2 + COPY_OFFSETS.len(), |variant| match variant {
                0 | 1 => run(shape, black_box(&mut bufs), variant == 0),
                v => {
                    let off = COPY_OFFSETS[v - 2];
                    dst[off..off + len].copy_from_slice(black_box(&src));
                    black_box(&mut dst);
                }
            });
            let (t_fast, t_scalar) = (t[0], t[1]);
            let t_copy = t[2..].iter().copied().fold(f64::INFINITY, f64::min);
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
