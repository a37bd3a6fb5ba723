//! mm_peak: single-context matmul throughput across shapes and layouts, timing only
//! `rknn_matmul_run` (through the safe layer).
//!
//! ```text
//! cargo run --release --example mm_peak -- [--backend auto|npu|emulator] [--platform rk3588] [--quick]
//! ```
//! On the NPU this reproduces the field's ceiling measurement (i8 4096³ on one core: 0.69 TOPS
//! with librknnrt 2.3.2). On the emulator it measures the emulator, which is what CI has.

use std::process::ExitCode;
use std::time::Instant;

use clap::Parser;
use rknn_matmul::{Core, I8xI8ToI32, Layout};

mod common;

/// Single-context matmul throughput across shapes and layouts, timing only the runs.
#[derive(Parser, Debug)]
struct Args {
    #[command(flatten)]
    backend: common::BackendFlags,
    /// Small shapes and few iterations (for CI and the emulator).
    #[arg(long)]
    quick: bool,
}

fn main() -> ExitCode {
    let args = Args::parse();
    common::run("mm_peak", || probe(&args))
}

fn probe(args: &Args) -> Result<(), Box<dyn std::error::Error>> {
    let quick = args.quick;
    let rt = args.backend.open()?;
    println!("backend: {} ({})", rt.backend_name(), rt.selection_reason());
    let big = if quick { 1024 } else { 4096 };
    let cases = [
        ("native B, square", big, big, big, Layout::Native),
        ("native B, prefill M=512", 512, big, big, Layout::Native),
        ("normal B, square", big, big, big, Layout::Norm),
        ("native B, decode M=1", 1, big, big, Layout::Native),
        (
            "native B, K above segment",
            if quick { 64 } else { 512 },
            15360,
            if quick { 256 } else { big },
            Layout::Native,
        ),
    ];
    println!(
        "{:<28} {:>6} {:>6} {:>6} {:>12} {:>10}",
        "case", "M", "K", "N", "ms/run", "GOPS"
    );
    for (name, m, k, n, bl) in cases {
        let core = if rt.platform().has_core_mask() {
            Core::Index(0)
        } else {
            Core::Auto
        };
        let mm = rt
            .matmul::<I8xI8ToI32>(m, k, n)
            .b_layout(bl)
            .core(core)
            .build()?;
        let (mut a, mut b, mut c) = (mm.alloc_a()?, mm.alloc_b()?, mm.alloc_c()?);
        a.as_mut_slice().fill(1);
        b.as_mut_slice().fill(1);
        mm.run(&a, &b, &mut c)?; // warm-up and bind
        let iters = if quick { 2 } else { 5 };
        let t = Instant::now();
        for _ in 0..iters {
            mm.run(&a, &b, &mut c)?;
        }
        let dt = t.elapsed().as_secs_f64() / f64::from(iters);
        let gops = 2.0 * (m * k * n) as f64 / dt / 1e9;
        println!(
            "{name:<28} {m:>6} {k:>6} {n:>6} {:>12.3} {gops:>10.2}",
            dt * 1e3
        );
    }
    Ok(())
}
