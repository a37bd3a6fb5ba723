//! Decode and prefill speed of `rknn-llm`, shaped like llama-bench's `tg` and `pp` tests so the
//! two can be compared on the same model and thread count, with the machine's streaming-read
//! bandwidth measured in the same run (decode is bound by reading the weights):
//!
//! ```sh
//! cargo bench -p rknn-llm --bench decode -- MODEL.gguf [--backend f32|emulator|npu]
//!     [--cores NPU_CORES] [-t THREADS] [-n TG] [-p PP] [-r REPS] [-d DEPTH]
//!     [--cache-type f32|f16] [--warm BYTES] [--ab-warm PAIRS] [--streams 1,2,4,8] [--json]
//! ```
//!
//! `tg`: N tokens decoded one at a time from an empty cache (or after DEPTH positions of
//! context, llama-bench's `-d`, not timed); `pp`: a prompt of P tokens in one
//! forward call. Token ids are arbitrary (as in llama-bench). Each test runs `-r` times after a
//! warm-up; the mean and standard deviation of tokens per second are printed. `--warm BYTES`
//! sets the engine's read-ahead (`EngineConfig::warm_bytes`); `--ab-warm PAIRS` then times
//! `tg` with it and without it on the same model, switched between runs with
//! `Engine::set_warm_bytes`, PAIRS alternating pairs (ABBA), and prints the geometric mean of
//! the paired ratios with its 95 % interval, and their median. `--streams LIST`: for each B of
//! the list, B sequences decode TG tokens together, one [`Model::forward_batch`] of B rows per
//! step (what `llm-server`'s batcher runs with B requests in flight): the aggregate tok/s, its
//! ratio over one stream, and on the emulator the RK3588 cost model's modelled NPU time of the
//! same passes (busiest core) and its ratio. Both sides run on the same
//! model in one process: a second model loaded beside the first decoded 5-8 % faster on a
//! 2-vCPU guest, because speed follows the memory the weights get. `scripts/bench/llm_vs_llama_cpp.py` runs this beside llama-bench and
//! writes the comparison.

use std::time::Instant;

use rknn_llm::gguf::GgufFile;
use rknn_llm::model::{
    BatchItem, CacheType, Config, EngineFactory, EngineOptions, HostF32Factory, LinearFactory,
    Logits, Model, Residual, Sequence, host_pool,
};
use rknn_matmul::engine::{Engine, EngineConfig};
use rknn_matmul::{Backend, Platform, Runtime};

/// A plain read of a buffer far larger than the caches, split over `threads`: the streaming
/// bandwidth that bounds decode.
struct StreamRead {
    buf: Vec<u64>,
    threads: usize,
}

impl StreamRead {
    fn new(threads: usize) -> StreamRead {
        let words = (512usize << 20) / 8;
        StreamRead {
            buf: (0..words as u64).collect(),
            threads,
        }
    }

    /// GB/s, the best of `passes` passes.
    fn measure(&self, passes: usize) -> f64 {
        let per = self.buf.len() / self.threads;
        let read = |slice: &[u64]| -> u64 {
            let mut lanes = [0u64; 8];
            for c in slice.chunks_exact(8) {
                for (l, &v) in lanes.iter_mut().zip(c) {
                    *l = l.wrapping_add(v);
                }
            }
            lanes.iter().fold(0, |a, &b| a.wrapping_add(b))
        };
        let mut best = 0f64;
        for _ in 0..passes {
            let t = Instant::now();
            let sum: u64 = std::thread::scope(|s| {
                let hs: Vec<_> = self
                    .buf
                    .chunks(per)
                    .take(self.threads)
                    .map(|c| s.spawn(move || read(c)))
                    .collect();
                hs.into_iter()
                    .map(|h| h.join().unwrap())
                    .fold(0, u64::wrapping_add)
            });
            std::hint::black_box(sum);
            best = best.max((per * self.threads * 8) as f64 / t.elapsed().as_secs_f64() / 1e9);
        }
        best
    }
}

/// Bytes of weights a decode token reads on the NPU path: every linear of every layer and the
/// output head, one byte per int8 weight.
fn weight_bytes(c: &Config) -> f64 {
    let (e, qd, kvd, ff) = (
        c.n_embd,
        c.n_head * c.head_dim,
        c.n_head_kv * c.head_dim,
        c.n_ff,
    );
    (c.n_layer * (e * (qd + 2 * kvd) + qd * e + 2 * e * ff + ff * e) + c.n_vocab * e) as f64
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Decodes `tg` tokens one at a time after `context` (not timed) from an empty cache; tok/s.
fn tg_rate(model: &Model, seq: &mut Sequence, context: &[u32], tg: usize) -> f64 {
    let n_vocab = model.config().n_vocab as u32;
    seq.reset();
    // The context before the timed tokens (llama-bench's `-d`), not timed.
    for (c, chunk) in context.chunks(128).enumerate() {
        model.forward(seq, chunk, c * 128, Logits::None).unwrap();
    }
    let depth = context.len();
    let t = Instant::now();
    let mut tok = 1u32;
    for pos in depth..depth + tg {
        let l = model.forward(seq, &[tok], pos, Logits::Last).unwrap();
        tok = (l.len() as u32 + pos as u32 * 31) % n_vocab;
    }
    tg as f64 / t.elapsed().as_secs_f64()
}

/// `streams` sequences decode `tg` tokens together, one batched pass per step, after a
/// prompt of 16 tokens each (not timed): (aggregate tok/s, modelled NPU seconds of the timed
/// passes, when the emulator models them).
fn batched_rate(
    model: &Model,
    engine: Option<&Engine>,
    streams: usize,
    tg: usize,
) -> (f64, Option<f64>) {
    let n_vocab = model.config().n_vocab as u32;
    let mut seqs: Vec<Sequence> = (0..streams)
        .map(|_| model.sequence(CacheType::F32))
        .collect();
    for (i, seq) in seqs.iter_mut().enumerate() {
        let prompt: Vec<u32> = (0..16u32)
            .map(|j| (j * 7919 + i as u32 * 131 + 1) % n_vocab)
            .collect();
        model.forward(seq, &prompt, 0, Logits::Last).unwrap();
    }
    let modelled = || engine.and_then(|e| e.runtime().modelled_time());
    let m0 = modelled();
    let t = Instant::now();
    let mut toks: Vec<[u32; 1]> = (0..streams).map(|i| [i as u32 + 1]).collect();
    for step in 0..tg {
        let mut items: Vec<BatchItem<'_>> = seqs
            .iter_mut()
            .zip(&toks)
            .map(|(seq, tok)| BatchItem {
                seq,
                tokens: tok,
                pos: 16 + step,
                logits: Logits::Last,
            })
            .collect();
        model.forward_batch(&mut items).unwrap();
        drop(items);
        for (i, (seq, tok)) in seqs.iter().zip(&mut toks).enumerate() {
            tok[0] = (seq.logits().len() as u32 + (step * 31 + i) as u32) % n_vocab;
        }
    }
    let rate = (streams * tg) as f64 / t.elapsed().as_secs_f64();
    let npu = m0
        .zip(modelled())
        .map(|(a, b)| b.since(&a).busiest_core().as_secs_f64());
    (rate, npu)
}

fn mean_sd(rates: &[f64]) -> (f64, f64) {
    let mean = rates.iter().sum::<f64>() / rates.len() as f64;
    let sd = (rates.iter().map(|r| (r - mean).powi(2)).sum::<f64>() / rates.len() as f64).sqrt();
    (mean, sd)
}

fn main() {
    let mut args = std::env::args().skip(1).filter(|a| a != "--bench");
    let mut path = None;
    let (mut threads, mut tg, mut pp, mut reps) = (2usize, 128usize, 0usize, 5usize);
    let (mut backend, mut json, mut cores) = ("f32".to_string(), false, None);
    let mut opts = EngineOptions::default();
    let mut cache = CacheType::F32;
    let mut depth = 0usize;
    let mut warm = None;
    let mut ab_pairs = 0usize;
    let mut streams: Vec<usize> = Vec::new();
    while let Some(a) = args.next() {
        let mut next = |what: &str| {
            args.next()
                .unwrap_or_else(|| panic!("{what} needs a value"))
        };
        match a.as_str() {
            "-t" => threads = next("-t").parse().expect("-t number"),
            "-n" => tg = next("-n").parse().expect("-n number"),
            "-p" => pp = next("-p").parse().expect("-p number"),
            "-r" => reps = next("-r").parse().expect("-r number"),
            "-d" => depth = next("-d").parse().expect("-d number"),
            "--backend" => backend = next("--backend"),
            "--cores" => cores = Some(next("--cores").parse().expect("--cores number")),
            "--warm" => warm = Some(next("--warm").parse().expect("--warm bytes")),
            "--ab-warm" => ab_pairs = next("--ab-warm").parse().expect("--ab-warm pairs"),
            "--json" => json = true,
            "--streams" => {
                streams = next("--streams")
                    .split(',')
                    .map(|b| b.parse().expect("--streams 1,2,4,8"))
                    .collect()
            }
            "--residual" => {
                opts.residual = match next("--residual").as_str() {
                    "none" => Residual::None,
                    "output" => Residual::Output,
                    "output-down" => Residual::OutputAndDown,
                    "all" => Residual::All,
                    other => panic!("--residual none|output|output-down|all, not {other}"),
                }
            }
            "--no-rotation" => opts.rotate = false,
            "--cache-type" => {
                cache = match next("--cache-type").as_str() {
                    "f32" => CacheType::F32,
                    "f16" => CacheType::F16,
                    other => panic!("--cache-type f32|f16, not {other}"),
                }
            }
            _ => path = Some(a),
        }
    }
    let Some(path) = path else {
        eprintln!(
            "usage: decode MODEL.gguf [--backend f32|emulator|npu] [-t THREADS] [-n TG] [-p PP] [-r REPS] [-d DEPTH] [--cache-type f32|f16] [--warm BYTES] [--ab-warm PAIRS] [--json]"
        );
        return;
    };
    let pool = host_pool(threads).unwrap();
    let file = GgufFile::open(&path).unwrap();
    let rt = match backend.as_str() {
        "f32" => None,
        "emulator" => Some(Runtime::emulator(Platform::Rk3588).unwrap()),
        "npu" => Some(Runtime::open(Backend::Npu, Default::default()).unwrap()),
        other => panic!("unknown backend {other}"),
    };
    let engine = rt.as_ref().map(|rt| {
        let cfg = EngineConfig {
            cores,
            warm_bytes: warm,
            ..EngineConfig::default()
        };
        Engine::new(rt, cfg).unwrap()
    });
    let mut factory: Box<dyn LinearFactory> = match &engine {
        None => Box::new(HostF32Factory::new(pool.clone())),
        Some(e) => Box::new(EngineFactory::new(e.clone(), opts)),
    };
    let t = Instant::now();
    let model = Model::load(&file, factory.as_mut(), pool.clone(), &mut |_, _| {}).unwrap();
    let mut seq = model.sequence(cache);
    let load_s = t.elapsed().as_secs_f64();
    eprintln!("loaded {path} in {load_s:.2} s, backend {backend}, {threads} threads");
    let n_vocab = model.config().n_vocab as u32;
    let mut results = serde_json::Map::new();
    if pp > 0 {
        let tokens: Vec<u32> = (0..pp as u32).map(|i| (i * 7919 + 1) % n_vocab).collect();
        let mut rates = Vec::new();
        for r in 0..=reps {
            seq.reset();
            let t = Instant::now();
            model.forward(&mut seq, &tokens, 0, Logits::Last).unwrap();
            if r > 0 {
                rates.push(pp as f64 / t.elapsed().as_secs_f64());
            }
        }
        let (m, sd) = mean_sd(&rates);
        println!("pp{pp}: {m:.2} ± {sd:.2} tok/s");
        results.insert(format!("pp{pp}"), serde_json::json!({"mean": m, "sd": sd}));
    }
    // Measured beside each timed decode run as well as at the end: this machine's memory
    // bandwidth moves by tens of percent within minutes, and decode's share of the limit is
    // only meaningful against a read taken at the same time.
    let stream = StreamRead::new(threads);
    if tg > 0 {
        let mut rates = Vec::new();
        let mut shares = Vec::new();
        let context: Vec<u32> = (0..depth as u32)
            .map(|i| (i * 104_729 + 3) % n_vocab)
            .collect();
        let stats_before = engine.as_ref().map(|e| e.stats());
        for r in 0..=reps {
            let before = stream.measure(2);
            let rate = tg_rate(&model, &mut seq, &context, tg);
            let after = stream.measure(2);
            if r > 0 {
                rates.push(rate);
                shares.push(rate * weight_bytes(model.config()) / 1e9 / before.max(after));
            }
        }
        let (m, sd) = mean_sd(&rates);
        let name = match depth {
            0 => format!("tg{tg}"),
            d => format!("tg{tg}@d{d}"),
        };
        println!("{name}: {m:.2} ± {sd:.2} tok/s");
        results.insert(name.clone(), serde_json::json!({"mean": m, "sd": sd}));
        let share = median(shares.clone());
        println!(
            "{name}: {:.1} % of the streaming limit (median of {} runs, each against the better of two reads of {threads} threads right before and after it; range {:.1}-{:.1} %)",
            100.0 * share,
            shares.len(),
            100.0 * shares.iter().copied().fold(f64::MAX, f64::min),
            100.0 * shares.iter().copied().fold(0.0, f64::max)
        );
        results.insert("decode_share_paired".into(), share.into());
        if let (Some(e), Some(s0)) = (&engine, stats_before) {
            // The fork-join's cost in decode: the calling thread waiting for a busy worker.
            let s = e.stats();
            let tokens = ((reps + 1) * tg) as f64;
            let ms = (s.wait.time - s0.wait.time).as_secs_f64() * 1e3 / tokens;
            let per_token = |n: u64, n0: u64| (n - n0) as f64 / tokens;
            println!(
                "{name}: the calling thread waited for the worker {ms:.3} ms per token, in {:.1} of its {:.0} forwards",
                per_token(s.wait.count, s0.wait.count),
                per_token(s.forwards, s0.forwards)
            );
            results.insert("decode_wait_ms_per_token".into(), ms.into());
        }
        if let (Some(engine), true) = (&engine, ab_pairs > 0) {
            // The same decode on the same model with the workers' read-ahead off, the two
            // alternating (ABBA): the machine's drift hits both alike. The first run of each
            // setting relearns the order of the linears within its first token.
            let on = engine.warm_bytes();
            let mut rate = |warm: usize| {
                engine.set_warm_bytes(warm);
                tg_rate(&model, &mut seq, &context, tg)
            };
            let mut ratios = Vec::new();
            for p in 0..ab_pairs {
                let (a, b) = if p % 2 == 0 {
                    let a = rate(on);
                    (a, rate(0))
                } else {
                    let b = rate(0);
                    (rate(on), b)
                };
                ratios.push(a / b);
            }
            engine.set_warm_bytes(on);
            // The paired ratios' geometric mean with its 95 % interval (t ≈ 1.97 from about
            // 100 pairs on), and their median.
            let logs: Vec<f64> = ratios.iter().map(|r| r.ln()).collect();
            let n = logs.len() as f64;
            let mean = logs.iter().sum::<f64>() / n;
            let sd =
                (logs.iter().map(|l| (l - mean).powi(2)).sum::<f64>() / (n - 1.0).max(1.0)).sqrt();
            let half = 1.97 * sd / n.sqrt();
            ratios.sort_by(f64::total_cmp);
            let med = ratios[ratios.len() / 2];
            println!(
                "{name} with read-ahead / without: geometric mean {:.3} (95 % interval {:.3}-{:.3}), median {med:.3} over {ab_pairs} pairs (range {:.3}-{:.3})",
                mean.exp(),
                (mean - half).exp(),
                (mean + half).exp(),
                ratios[0],
                ratios[ratios.len() - 1]
            );
            results.insert("read_ahead_ratio".into(), med.into());
        }
    }
    if !streams.is_empty() {
        // Each B after a warm-up run of it; the best of `reps` runs (the machine drifts).
        let mut base: Option<(f64, Option<f64>)> = None;
        println!(
            "| streams | aggregate tok/s | × one stream | modelled RK3588 tok/s | × one stream |"
        );
        println!("|---:|---:|---:|---:|---:|");
        for &b in &streams {
            batched_rate(&model, engine.as_ref(), b, tg.min(16));
            let (rate, npu) = (0..reps.max(1))
                .map(|_| batched_rate(&model, engine.as_ref(), b, tg))
                .max_by(|x, y| x.0.total_cmp(&y.0))
                .unwrap();
            let npu_rate = npu.map(|s| (b * tg) as f64 / s);
            let (r0, n0) = *base.get_or_insert((rate, npu_rate));
            let fmt = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.1}"));
            println!(
                "| {b} | {rate:.1} | {:.2} | {} | {} |",
                rate / r0,
                fmt(npu_rate),
                npu_rate
                    .zip(n0)
                    .map_or("-".to_string(), |(n, n0)| format!("{:.2}", n / n0))
            );
            results.insert(
                format!("streams{b}"),
                serde_json::json!({"tok_s": rate, "modelled_tok_s": npu_rate}),
            );
        }
    }
    let bw = stream.measure(4);
    println!("stream read, {threads} threads: {bw:.2} GB/s");
    results.insert("stream_read_gb_s".into(), bw.into());
    let s = seq.stats();
    eprintln!(
        "time split: matmul {:.2} s, attention {:.2} s, other {:.2} s",
        s.matmul.as_secs_f64(),
        s.attention.as_secs_f64(),
        s.other.as_secs_f64()
    );
    if let Some(e) = &engine {
        let st = e.stats();
        eprintln!(
            "engine: quantize {:.2} s, pack {:.2} s, run {:.2} s, collect {:.2} s over {} forwards, {:.1} MB read ahead; \
             the calling thread waited for the worker {:.2} s, in {} of them",
            st.quantize.time.as_secs_f64(),
            st.pack.time.as_secs_f64(),
            st.run.time.as_secs_f64(),
            st.collect.time.as_secs_f64(),
            st.forwards,
            st.warmed_bytes as f64 / 1e6,
            st.wait.time.as_secs_f64(),
            st.wait.count
        );
        for (i, l) in e.lane_stats().iter().enumerate() {
            eprintln!(
                "  lane {i}: pack {:.2} s, run {:.2} s, collect {:.2} s, {:.1} MB read ahead",
                l.pack.time.as_secs_f64(),
                l.run.time.as_secs_f64(),
                l.collect.time.as_secs_f64(),
                l.warmed_bytes as f64 / 1e6
            );
        }
    }
    if json {
        results.insert("backend".into(), backend.into());
        results.insert("threads".into(), threads.into());
        results.insert("load_s".into(), load_s.into());
        println!("{}", serde_json::Value::Object(results));
    }
}
