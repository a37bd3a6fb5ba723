//! Decode and prefill speed of the host f32 path, shaped like llama-bench's `tg` and `pp`
//! tests so the two can be compared on the same model and thread count:
//!
//! ```sh
//! cargo bench -p rknn-llm --bench decode -- MODEL.gguf [-t THREADS] [-n TG] [-p PP] [-r REPS]
//! ```
//!
//! `tg`: N tokens decoded one at a time from an empty cache; `pp`: a prompt of P tokens in one
//! forward call. Token ids are arbitrary (as in llama-bench). Each test runs `-r` times after a
//! warm-up; the mean and standard deviation of tokens per second are printed.

use std::sync::Arc;
use std::time::Instant;

use rknn_llm::gguf::GgufFile;
use rknn_llm::model::{HostF32Factory, Logits, Model};

fn main() {
    let mut args = std::env::args().skip(1).filter(|a| a != "--bench");
    let mut path = None;
    let (mut threads, mut tg, mut pp, mut reps) = (2usize, 128usize, 0usize, 5usize);
    while let Some(a) = args.next() {
        let mut num = |what: &str| -> usize {
            args.next()
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("{what} needs a number"))
        };
        match a.as_str() {
            "-t" => threads = num("-t"),
            "-n" => tg = num("-n"),
            "-p" => pp = num("-p"),
            "-r" => reps = num("-r"),
            _ => path = Some(a),
        }
    }
    let Some(path) = path else {
        eprintln!("usage: decode MODEL.gguf [-t THREADS] [-n TG] [-p PP] [-r REPS]");
        return;
    };
    let pool = Arc::new(
        rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap(),
    );
    let file = GgufFile::open(&path).unwrap();
    let t = Instant::now();
    let mut model = Model::load(
        &file,
        &mut HostF32Factory::new(pool.clone()),
        pool,
        &mut |_, _| {},
    )
    .unwrap();
    eprintln!(
        "loaded {path} in {:.2} s, kernel {}, {threads} threads",
        t.elapsed().as_secs_f64(),
        rknn_llm::model::kernels::selected().name()
    );
    let n_vocab = model.config().n_vocab as u32;
    let report = |name: &str, n: usize, secs: &[f64]| {
        let rates: Vec<f64> = secs.iter().map(|s| n as f64 / s).collect();
        let mean = rates.iter().sum::<f64>() / rates.len() as f64;
        let sd =
            (rates.iter().map(|r| (r - mean).powi(2)).sum::<f64>() / rates.len() as f64).sqrt();
        println!("{name}{n}: {mean:.2} ± {sd:.2} tok/s");
    };
    if pp > 0 {
        let tokens: Vec<u32> = (0..pp as u32).map(|i| (i * 7919 + 1) % n_vocab).collect();
        let mut secs = Vec::new();
        for r in 0..=reps {
            model.reset();
            let t = Instant::now();
            model.forward(&tokens, 0, Logits::Last).unwrap();
            if r > 0 {
                secs.push(t.elapsed().as_secs_f64());
            }
        }
        report("pp", pp, &secs);
    }
    if tg > 0 {
        let mut secs = Vec::new();
        for r in 0..=reps {
            model.reset();
            let t = Instant::now();
            let mut tok = 1u32;
            for pos in 0..tg {
                let l = model.forward(&[tok], pos, Logits::Last).unwrap();
                tok = (l.len() as u32 + pos as u32 * 31) % n_vocab;
            }
            if r > 0 {
                secs.push(t.elapsed().as_secs_f64());
            }
        }
        report("tg", tg, &secs);
    }
    let s = model.stats();
    eprintln!(
        "time split: matmul {:.2} s, attention {:.2} s, other {:.2} s",
        s.matmul.as_secs_f64(),
        s.attention.as_secs_f64(),
        s.other.as_secs_f64()
    );
}
