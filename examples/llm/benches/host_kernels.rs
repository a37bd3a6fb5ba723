//! The host kernels of a decode token on every backend this CPU has, against the portable
//! scalar reference, measured in the same run (one thread, hot caches):
//!
//! ```sh
//! cargo bench -p rknn-llm --bench host_kernels
//! ```
//!
//! Shapes are the demo model's (SmolLM2-135M): SwiGLU over `n_ff` = 1536 values per layer,
//! and one attention head (64 wide) against 32 cached positions, the middle of a 64-token
//! decode: its scores, their softmax and the weighted sum of the values. Every backend gives
//! the same bits (tested in `model::kernels`); only speed differs.

use std::hint::black_box;

use rknn_llm::model::kernels::Kernel;

mod common;
use common::per_call;

fn main() {
    let n = if std::env::var_os("BENCH_QUICK").is_some() {
        200
    } else {
        20_000
    };
    let wave =
        |len: usize, f: f32| -> Vec<f32> { (0..len).map(|i| (i as f32 * f).sin() * 3.0).collect() };
    let (gate0, up) = (wave(1536, 0.11), wave(1536, 0.37));
    let (q, keys, p) = (wave(64, 0.7), wave(32 * 64, 0.13), wave(32, 0.05));
    let mut gate = gate0.clone();
    let mut scores = vec![0.0f32; 32];
    let mut probs = vec![0.0f32; 32];
    let mut out = vec![0.0f32; 64];
    let kernels: Vec<Kernel> = Kernel::all()
        .iter()
        .copied()
        .filter(|k| k.is_available())
        .collect();
    println!("| kernel | backend | ns per call | scalar / this |");
    println!("|---|---|---:|---:|");
    type Case<'a> = (&'static str, Box<dyn FnMut(Kernel) + 'a>);
    let cases: Vec<Case> = vec![
        (
            "SwiGLU, 1536 values",
            Box::new(|k: Kernel| {
                gate.copy_from_slice(&gate0);
                k.swiglu(black_box(&mut gate), black_box(&up));
            }),
        ),
        (
            "attention scores, 32 keys × 64",
            Box::new(|k: Kernel| k.dot_rows(black_box(&q), black_box(&keys), 64, &mut scores)),
        ),
        (
            "attention softmax, 32 scores",
            Box::new(|k: Kernel| {
                probs.copy_from_slice(&p);
                k.softmax_scaled(black_box(&mut probs), 0.125)
            }),
        ),
        (
            "attention values, 32 rows × 64",
            Box::new(|k: Kernel| {
                out.fill(0.0);
                k.add_scaled_rows(black_box(&p), black_box(&keys), 64, &mut out)
            }),
        ),
    ];
    for (name, mut f) in cases {
        let scalar = per_call(n, || f(Kernel::Scalar));
        for &k in &kernels {
            let t = per_call(n, || f(k));
            println!(
                "| {name} | {} | {:.0} | {:.2} |",
                k.name(),
                t.as_secs_f64() * 1e9,
                scalar.as_secs_f64() / t.as_secs_f64()
            );
        }
    }
}
