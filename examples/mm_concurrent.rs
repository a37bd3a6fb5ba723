//! mm_concurrent: one single-core context per NPU core, run concurrently from one thread each.
//! A combined core mask is rejected for matmul, so this is how all cores are used; the field
//! measured 0.66 / 1.26 / 1.83 TOPS for 1 / 2 / 3 contexts on RK3588 (i8 4096³).
//!
//! ```text
//! cargo run --release --example mm_concurrent -- [--backend auto|npu|emulator] [--platform rk3588] [--quick]
//! ```

use std::process::ExitCode;
use std::time::Instant;

use clap::Parser;
use rknn_matmul::{Core, I8xI8ToI32, Layout};

mod common;

/// One single-core context per NPU core, run concurrently, timing only the runs.
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
    common::run("mm_concurrent", || probe(&args))
}

fn probe(args: &Args) -> Result<(), Box<dyn std::error::Error>> {
    let quick = args.quick;
    let rt = args.backend.open()?;
    println!(
        "backend: {} ({}), {} NPU cores",
        rt.backend_name(),
        rt.selection_reason(),
        rt.npu_cores()
    );
    let (m, k, n) = if quick {
        (256, 1024, 1024)
    } else {
        (1024, 4096, 4096)
    };
    let iters = if quick { 2 } else { 4 };
    let mut single = 0.0;
    for contexts in 1..=rt.npu_cores() {
        let t = Instant::now();
        std::thread::scope(|s| -> Result<(), rknn_matmul::Error> {
            let handles: Vec<_> = (0..contexts)
                .map(|core| {
                    let rt = &rt;
                    s.spawn(move || -> Result<(), rknn_matmul::Error> {
                        let c = if rt.platform().has_core_mask() {
                            Core::Index(core)
                        } else {
                            Core::Auto
                        };
                        let mm = rt
                            .matmul::<I8xI8ToI32>(m, k, n)
                            .b_layout(Layout::Native)
                            .core(c)
                            .build()?;
                        let (mut a, mut b, mut cm) = (mm.alloc_a()?, mm.alloc_b()?, mm.alloc_c()?);
                        a.as_mut_slice().fill(1);
                        b.as_mut_slice().fill(1);
                        for _ in 0..iters {
                            mm.run(&a, &b, &mut cm)?;
                        }
                        Ok(())
                    })
                })
                .collect();
            for h in handles {
                h.join().expect("worker panicked")?;
            }
            Ok(())
        })?;
        let gops = 2.0 * (m * k * n * iters * contexts) as f64 / t.elapsed().as_secs_f64() / 1e9;
        if contexts == 1 {
            single = gops;
        }
        println!(
            "{contexts} context(s): {gops:8.2} GOPS aggregate ({:.2}x one context)",
            gops / single
        );
    }
    Ok(())
}
