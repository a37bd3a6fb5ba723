//! Decode without the LLM: SmolLM2-135M's 121 fused W8A8 linears (random weights) resident in
//! the engine on the emulator, one forward of each at M = 1 per "token", against the machine's
//! streaming-read bandwidth measured in the same run with the same number of threads.
//!
//! ```text
//! cargo bench -p rknn-matmul --bench decode_linears        # BENCH_QUICK=1 for a short run
//! DECODE_CORES=1 cargo bench -p rknn-matmul --bench decode_linears   # one emulated core
//! # for profilers: DECODE_TOKENS=200 (tokens timed), DECODE_PREFILL=0 (skip the M=128 part)
//! # DECODE_SPIN_US=n: the workers' spin before sleeping (EngineConfig::spin)
//! ```
//!
//! Per layer (× 30): qkv N=960 K=576, o N=576 K=576, gate_up N=3072 K=576, down N=576 K=1536;
//! then the head N=49152 K=576: 134.5 MB of int8 weights, every byte read once per token.
//! Decode is bound by reading them, so the figure of merit is the weights' GB/s per token over
//! a plain SIMD streaming read of a buffer larger than the caches. Also reported: one
//! prefill chunk (M = 128) through the same linears, in GOPS, and the engine's phase stats.
//!
//! And where a token's time goes: the same fork-join without the engine. Each lane (the
//! calling thread and one spinning thread per other lane) reads its share of every linear's
//! weights from buffers of the same sizes, linear after linear, waiting for the others after
//! each: once with a plain read, once with the emulator's own M = 1 kernel on native B. Engine
//! tokens and both of these alternate in one loop (`DECODE_ROUNDS`, default 30), so the ratios
//! are paired: the kernel's fork-join against the plain one says whether the emulated NPU
//! streams at the bus's speed, and the engine against the kernel's fork-join is what the
//! engine's per-forward work costs (quantise, hand-off, binding and the runtime's calls,
//! scaling and collecting the output, and the waits).

use std::hint::black_box;
use std::sync::Barrier;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use rknn_emu::kernels::{NativeBShape, gemm_i8_native_b};
use rknn_matmul::engine::topology::Pinning;
use rknn_matmul::engine::{Engine, EngineConfig, Linear};
use rknn_matmul::{Platform, Runtime};

/// (N, K) of one transformer layer's fused linears.
const LAYER: [(usize, usize); 4] = [(960, 576), (576, 576), (3072, 576), (576, 1536)];
const LAYERS: usize = 30;
const HEAD: (usize, usize) = (49152, 576);

/// Sum of the buffer as u64 words, eight independent lanes (the compiler vectorises it with
/// the baseline SIMD), so that the loop is bound by the loads, not by an add chain.
fn sum_words(words: &[u64]) -> u64 {
    let mut acc = [0u64; 8];
    for chunk in words.chunks_exact(8) {
        for (a, &w) in acc.iter_mut().zip(chunk) {
            *a = a.wrapping_add(w);
        }
    }
    acc.iter().fold(0, |s, &a| s.wrapping_add(a))
}

/// Streaming-read bandwidth (GB/s) with `threads` threads, each summing its share of `buf`;
/// best of `reps` passes, each timed from the first thread's start to the last one's end.
fn stream_read(buf: &[u64], threads: usize, reps: usize) -> f64 {
    let share = buf.len() / threads;
    let mut best = Duration::MAX;
    for _ in 0..reps {
        let start = Barrier::new(threads);
        let spans: Vec<(Instant, Instant)> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..threads)
                .map(|i| {
                    let part = &buf[i * share..(i + 1) * share];
                    let start = &start;
                    s.spawn(move || {
                        start.wait();
                        let t0 = Instant::now();
                        black_box(sum_words(black_box(part)));
                        (t0, Instant::now())
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let first = spans.iter().map(|s| s.0).min().unwrap();
        let last = spans.iter().map(|s| s.1).max().unwrap();
        best = best.min(last - first);
    }
    (share * threads * 8) as f64 / best.as_secs_f64() / 1e9
}

/// [`sum_words`] over bytes, eight at a time.
fn sum_bytes(bytes: &[i8]) -> u64 {
    let mut acc = [0u64; 8];
    for chunk in bytes.chunks_exact(64) {
        for (a, w) in acc.iter_mut().zip(chunk.chunks_exact(8)) {
            let w: [i8; 8] = w.try_into().expect("8 bytes");
            *a = a.wrapping_add(u64::from_ne_bytes(w.map(|b| b as u8)));
        }
    }
    acc.iter().fold(0, |s, &a| s.wrapping_add(a))
}

/// Each lane's share of each linear (N / lanes columns × K bytes, the engine's even split for
/// these shapes) in its own buffer, the way the engine keeps each shard in its own memory.
struct LaneBuffers {
    shapes: Vec<(usize, usize)>,
    /// `[lane][linear]`.
    bufs: Vec<Vec<Vec<i8>>>,
}

impl LaneBuffers {
    fn new(shapes: &[(usize, usize)], lanes: usize) -> LaneBuffers {
        let bufs = (0..lanes)
            .map(|l| {
                shapes
                    .iter()
                    .map(|&(n, k)| vec![l as i8 + 1; n / lanes * k])
                    .collect()
            })
            .collect();
        LaneBuffers {
            shapes: shapes.to_vec(),
            bufs,
        }
    }

    /// One token: every linear in order, each lane reading its buffer with `read(lane,
    /// linear, bytes)`, all lanes joined after each linear (lane 0 on this thread, the others
    /// spinning on threads that exist only for the token). The time from the first post to
    /// the last join.
    fn fork_join(&self, read: impl Fn(usize, usize, &[i8]) + Sync) -> Duration {
        let lanes = self.bufs.len();
        let linears = self.shapes.len();
        let (posted, joined) = (AtomicUsize::new(0), AtomicUsize::new(0));
        let start = Barrier::new(lanes);
        let (posted, joined, start, read) = (&posted, &joined, &start, &read);
        std::thread::scope(|s| {
            for lane in 1..lanes {
                s.spawn(move || {
                    start.wait();
                    for i in 0..linears {
                        while posted.load(Ordering::Acquire) <= i {
                            std::hint::spin_loop();
                        }
                        read(lane, i, &self.bufs[lane][i]);
                        joined.fetch_add(1, Ordering::Release);
                    }
                });
            }
            start.wait();
            let t = Instant::now();
            for i in 0..linears {
                posted.store(i + 1, Ordering::Release);
                read(0, i, &self.bufs[0][i]);
                while joined.load(Ordering::Acquire) < (i + 1) * (lanes - 1) {
                    std::hint::spin_loop();
                }
            }
            t.elapsed()
        })
    }
}

/// Engine tokens (`engine_token`) against the same fork-join over buffers of the shard sizes
/// without the engine, with a plain read and with the emulator's kernel, in rotating order;
/// prints the medians and the paired ratios.
fn fork_join_without_engine(
    engine_token: &mut dyn FnMut() -> Duration,
    shapes: &[(usize, usize)],
    workers: usize,
    rng: &mut fastrand::Rng,
    rounds: usize,
) {
    let lanes = LaneBuffers::new(shapes, workers);
    let a: Vec<i8> = (0..1536).map(|_| rng.i8(..)).collect();
    let c_len = shapes.iter().map(|&(n, _)| n / workers).max().unwrap_or(0);
    // Each lane's output, allocated once (as the engine's lanes keep theirs).
    let c_bufs: Vec<std::sync::Mutex<Vec<i32>>> = (0..workers)
        .map(|_| std::sync::Mutex::new(vec![0i32; c_len]))
        .collect();
    let plain = || {
        lanes.fork_join(|_, _, bytes| {
            black_box(sum_bytes(black_box(bytes)));
        })
    };
    let kernel = || {
        lanes.fork_join(|lane, i, bytes| {
            let (n, k) = shapes[i];
            let n = n / workers;
            let mut c = c_bufs[lane].lock().expect("a lane's own buffer");
            let shape = NativeBShape {
                m: 1,
                n,
                k,
                sn: 32,
                lda: k,
            };
            gemm_i8_native_b(&a[..k], black_box(bytes), &mut c[..n], shape, false);
            black_box(&*c);
        })
    };
    let (mut eng, mut pl, mut ke) = (Vec::new(), Vec::new(), Vec::new());
    let (mut eng_ke, mut ke_pl) = (Vec::new(), Vec::new());
    for r in 0..rounds {
        // Each measurement first, middle and last in turn.
        let mut t = [Duration::ZERO; 3];
        for j in 0..3 {
            let which = (r + j) % 3;
            t[which] = match which {
                0 => engine_token(),
                1 => plain(),
                _ => kernel(),
            };
        }
        let secs = t.map(|d| d.as_secs_f64());
        eng.push(t[0]);
        pl.push(t[1]);
        ke.push(t[2]);
        eng_ke.push(secs[0] / secs[2]);
        ke_pl.push(secs[2] / secs[1]);
    }
    let ratio = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        (v[v.len() / 2], v[0], v[v.len() - 1])
    };
    let (ek, ek_lo, ek_hi) = ratio(eng_ke);
    let (kp, kp_lo, kp_hi) = ratio(ke_pl);
    let ms = |v: Vec<Duration>| median(v).as_secs_f64() * 1e3;
    println!(
        "\nthe same fork-join without the engine ({workers} lane(s), each its share of every linear, {rounds} rounds, medians):"
    );
    println!(
        "  plain read {:.2} ms/token, the emulator's kernel {:.2} ms, the engine {:.2} ms",
        ms(pl),
        ms(ke),
        ms(eng)
    );
    println!(
        "  kernel / plain read: {kp:.3} (range {kp_lo:.3}-{kp_hi:.3}); engine / kernel: {ek:.3} (range {ek_lo:.3}-{ek_hi:.3})"
    );
}

/// CPU time (user + system) this process has used so far.
fn cpu_time() -> Duration {
    // SAFETY: getrusage writes the struct it is given; a zeroed rusage is a valid value.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: a valid pointer to a rusage struct.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) } != 0 {
        return Duration::ZERO;
    }
    let tv = |t: libc::timeval| {
        Duration::from_secs(t.tv_sec as u64) + Duration::from_micros(t.tv_usec as u64)
    };
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".into())
}

/// A line of /proc/self/status (`VmRSS`, `VmHWM`) in MB.
fn status_mb(key: &str) -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(key))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
        })
        .map_or(f64::NAN, |kb| kb * 1024.0 / 1e6)
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn main() {
    let quick = std::env::var_os("BENCH_QUICK").is_some();
    let env = |name: &str| {
        std::env::var(name)
            .ok()
            .and_then(|v| v.parse::<usize>().ok())
    };
    let tokens = env("DECODE_TOKENS").unwrap_or(if quick { 5 } else { 30 });
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    println!("load average at start: {}", load_average());

    let rt = Runtime::emulator(Platform::Rk3588).expect("emulator");
    let engine = Engine::new(
        &rt,
        EngineConfig {
            pinning: Pinning::None,
            cores: env("DECODE_CORES"),
            spin: env("DECODE_SPIN_US").map_or(EngineConfig::default().spin, |us| {
                Duration::from_micros(us as u64)
            }),
            ..EngineConfig::default()
        },
    )
    .expect("engine");
    let workers = engine.workers();
    println!("engine: {workers} core(s) on {cpus} CPU(s)");

    // Streaming read: 512 MiB (256 MiB quick), well beyond the caches, touched once first.
    let words = if quick { 32 << 20 } else { 64 << 20 };
    let buf: Vec<u64> = (0..words as u64).collect();
    let reps = if quick { 3 } else { 5 };
    let stream: Vec<(usize, f64)> = (1..=workers.max(2))
        .map(|t| (t, stream_read(&buf, t, reps)))
        .collect();
    drop(buf);
    for (t, gbs) in &stream {
        println!("streaming read, {t} thread(s): {gbs:.2} GB/s");
    }
    let stream_same = stream
        .iter()
        .find(|(t, _)| *t == workers)
        .map_or(f64::NAN, |s| s.1);

    let mut rng = fastrand::Rng::with_seed(14);
    let t_reg = Instant::now();
    let shapes: Vec<(usize, usize)> = (0..LAYERS)
        .flat_map(|_| LAYER)
        .chain(std::iter::once(HEAD))
        .collect();
    let linears: Vec<Linear> = shapes
        .iter()
        .map(|&(n, k)| {
            let q: Vec<i8> = (0..n * k).map(|_| rng.i8(-127..=127)).collect();
            let scales: Vec<f32> = (0..n).map(|_| 0.5 + rng.f32() / 100.0).collect();
            engine.linear_quantized(&q, &scales, n, k).expect("linear")
        })
        .collect();
    let weight_bytes: usize = shapes.iter().map(|&(n, k)| n * k).sum();
    println!(
        "registered {} linears, {:.1} MB of int8 weights, in {:.1} s; RSS {:.0} MB",
        linears.len(),
        weight_bytes as f64 / 1e6,
        t_reg.elapsed().as_secs_f64(),
        status_mb("VmRSS:")
    );

    let inputs: Vec<Vec<f32>> = [576usize, 1536]
        .iter()
        .map(|&k| (0..k).map(|_| rng.f32() * 2.0 - 1.0).collect())
        .collect();
    let input = |k: usize, m: usize| -> Vec<f32> {
        let x = &inputs[usize::from(k != 576)];
        x.iter().copied().cycle().take(k * m).collect()
    };
    let decode_x: Vec<Vec<f32>> = shapes.iter().map(|&(_, k)| input(k, 1)).collect();
    let mut outs: Vec<Vec<f32>> = shapes.iter().map(|&(n, _)| vec![0.0; n]).collect();
    let token = |outs: &mut Vec<Vec<f32>>| {
        let t = Instant::now();
        for ((lin, x), out) in linears.iter().zip(&decode_x).zip(outs.iter_mut()) {
            lin.forward(x, 1, out).expect("forward");
        }
        t.elapsed()
    };
    for _ in 0..3 {
        token(&mut outs);
    }
    engine.reset_stats();
    let (cpu0, wall0) = (cpu_time(), Instant::now());
    let times: Vec<Duration> = (0..tokens).map(|_| token(&mut outs)).collect();
    let cpus_used = (cpu_time() - cpu0).as_secs_f64() / wall0.elapsed().as_secs_f64();
    let stats = engine.stats();
    let med = median(times.clone());
    let best = *times.iter().min().unwrap();
    let gbs = |t: Duration| weight_bytes as f64 / t.as_secs_f64() / 1e9;
    println!(
        "\ndecode (M=1), {tokens} tokens: median {:.2} ms/token ({:.1} tok/s), best {:.2} ms",
        med.as_secs_f64() * 1e3,
        1.0 / med.as_secs_f64(),
        best.as_secs_f64() * 1e3
    );
    println!(
        "weights streamed: median {:.2} GB/s, best {:.2} GB/s",
        gbs(med),
        gbs(best)
    );
    println!(
        "ratio to the streaming read with {workers} thread(s) ({stream_same:.2} GB/s): median {:.3}, best {:.3}",
        gbs(med) / stream_same,
        gbs(best) / stream_same
    );
    println!(
        "CPUs used by the process while decoding: {cpus_used:.2} (of {workers} engine thread(s))"
    );
    println!("{stats}");
    println!("RSS after decode {:.0} MB", status_mb("VmRSS:"));

    // Where the token's time goes: the same fork-join, without the engine. Its lanes spin, so
    // it needs a CPU each; the kernel needs whole tiles of 32 columns per lane.
    let splits = shapes.iter().all(|&(n, _)| n % (workers * 32) == 0);
    if workers > cpus || !splits {
        println!(
            "\n(no fork-join without the engine: {workers} lanes on {cpus} CPUs, or shards not in whole tiles)"
        );
    } else {
        let mut engine_token = || token(&mut outs);
        let rounds = env("DECODE_ROUNDS").unwrap_or(if quick { 6 } else { 30 });
        fork_join_without_engine(&mut engine_token, &shapes, workers, &mut rng, rounds);
    }

    if env("DECODE_PREFILL") == Some(0) {
        return;
    }
    // One prefill chunk: M = 128 through every linear.
    let m = 128;
    let prefill_x: Vec<Vec<f32>> = [576usize, 1536].iter().map(|&k| input(k, m)).collect();
    let mut outs: Vec<Vec<f32>> = shapes.iter().map(|&(n, _)| vec![0.0; m * n]).collect();
    let chunk = |outs: &mut Vec<Vec<f32>>| {
        let t = Instant::now();
        for ((lin, &(_, k)), out) in linears.iter().zip(&shapes).zip(outs.iter_mut()) {
            lin.forward(&prefill_x[usize::from(k != 576)], m, out)
                .expect("forward");
        }
        t.elapsed()
    };
    chunk(&mut outs);
    engine.reset_stats();
    let reps = if quick { 1 } else { 3 };
    let t = median((0..reps).map(|_| chunk(&mut outs)).collect());
    let ops = 2.0 * m as f64 * weight_bytes as f64;
    println!(
        "prefill chunk (M=128): {:.1} ms, {:.1} GOPS ({:.0} tok/s of linears)",
        t.as_secs_f64() * 1e3,
        ops / t.as_secs_f64() / 1e9,
        m as f64 / t.as_secs_f64()
    );
    println!("{}", engine.stats());
    println!("RSS after prefill {:.0} MB", status_mb("VmRSS:"));
    println!("load average at end: {}", load_average());
}
