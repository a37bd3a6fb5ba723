//! mm_concurrent: one single-core context per NPU core, run at once from one thread each,
//! timing only the runs (as `mm_peak` does), each context's first result checked against a host
//! reference.
//!
//! ```text
//! cargo run --release --example mm_concurrent -- [--backend auto|npu|emulator] [--platform rk3588]
//!     [--shape 4096x4096x4096] [--dtype i8,f16,i4] [--layout native] [--quant per-layer]
//!     [--contexts 1,2,3] [--iterations N] [--warmup N] [--quick] [--json] [--plot FILE.svg]
//! ```
//!
//! A combined core mask is rejected for matmul, so this is how all cores are used. The field
//! measured 0.66 / 1.26 / 1.83 TOPS for 1 / 2 / 3 contexts on RK3588 (i8 4096³; its probe timed
//! context creation too). See docs/npu-matmul-performance.md.

use std::process::ExitCode;
use std::sync::Barrier;
use std::time::{Duration, Instant};

use clap::Parser;
use rknn_matmul::{F16xF16ToF32, I4xI4ToI16, I8xI8ToI32, Runtime};

mod common;
use common::cases::{Case, Check, Dtype, ProbeKind, Shape, core, prepare, time_runs};
use common::flags::{BackendFlags, CaseFlags};
use common::report::{Measured, Out, field_tops, header, modelled_ms, rated_tops, table_header};

/// One single-core context per NPU core, run concurrently, timing only the runs; each
/// context's first result is checked against a host reference.
#[derive(Parser, Debug)]
#[command(name = "mm_concurrent")]
struct Args {
    #[command(flatten)]
    backend: BackendFlags,
    #[command(flatten)]
    cases: CaseFlags,
    /// Numbers of concurrent contexts to run (repeat or comma-separate). Default: 1 up to the
    /// chip's NPU cores.
    #[arg(long, value_delimiter = ',')]
    contexts: Vec<usize>,
}

fn main() -> ExitCode {
    let args = Args::parse();
    common::run("mm_concurrent", || probe(&args))
}

fn probe(args: &Args) -> Result<bool, Box<dyn std::error::Error>> {
    let f = &args.cases;
    let rt = args.backend.open()?;
    let cores = rt.npu_cores();
    let counts: Vec<usize> = if args.contexts.is_empty() {
        (1..=cores).collect()
    } else {
        args.contexts.clone()
    };
    if let Some(&bad) = counts.iter().find(|&&c| c == 0 || c > cores) {
        return Err(format!(
            "--contexts {bad}: {} has {cores} NPU core(s), and each context gets its own",
            rt.platform()
        )
        .into());
    }
    let shapes = if f.shapes.is_empty() {
        vec![f.scaled(Shape {
            m: 4096,
            k: 4096,
            n: 4096,
        })]
    } else {
        f.shapes.clone()
    };
    let layouts = f.layouts_or_default();
    let quants = f.quants_or_default();
    let out = Out::new(f.json);
    out.text(&header(
        &rt,
        &format!(
            "mm_concurrent: 1 to {cores} single-core contexts at once, one thread each, timing rknn_matmul_run only"
        ),
        f,
    ));
    out.text(&table_header("case × contexts (scaling)"));
    let mut all_ok = true;
    let mut rows = vec![];
    for &dtype in &f.dtypes {
        for &shape in &shapes {
            for &layout in &layouts {
                for &quant in &quants {
                    let case = Case {
                        shape,
                        dtype,
                        layout,
                        quant,
                    };
                    let mut single = None;
                    for &n in &counts {
                        let r = match dtype {
                            Dtype::I8 => measure::<I8xI8ToI32>(&rt, &case, f, n),
                            Dtype::F16 => measure::<F16xF16ToF32>(&rt, &case, f, n),
                            Dtype::I4 => measure::<I4xI4ToI16>(&rt, &case, f, n),
                        };
                        match r {
                            Ok(m) => {
                                all_ok &= m.verified;
                                let base = *single.get_or_insert(m.tops / n as f64);
                                let label =
                                    format!("{} × {n} ({:.2}x)", case.label(), m.tops / base);
                                out.case(&label, &m);
                                rows.push(m);
                            }
                            Err(e) => {
                                out.text(&format!("{} × {n}: not run: {e}", case.label()));
                            }
                        }
                    }
                }
            }
        }
    }
    if let Some(path) = &f.plot {
        let labels: Vec<String> = rows
            .iter()
            .map(|r| format!("{} × {}", r.case.short(), r.contexts))
            .collect();
        let refs: Vec<&Measured> = rows.iter().collect();
        let ours = if rt.is_hardware() {
            format!("ours ({} NPU)", rt.platform())
        } else {
            "ours (host CPU emulating)".to_string()
        };
        common::plot::draw(
            path,
            "mm_concurrent: aggregate over concurrent contexts",
            &labels,
            &refs,
            &ours,
        )?;
        out.text(&format!("plot written to {}", path.display()));
    }
    Ok(all_ok)
}

/// What one worker reports: when its timed runs began and ended, its context's modelled time
/// per run, and its check.
struct Report {
    begin: Instant,
    end: Instant,
    modelled_ms: Option<f64>,
    check: Check,
}

/// Runs `contexts` contexts at once, one per core: each thread builds its context, fills and
/// checks it and warms it up; then all start together and only the runs are timed.
fn measure<K: ProbeKind>(
    rt: &Runtime,
    case: &Case,
    f: &CaseFlags,
    contexts: usize,
) -> Result<Measured, Box<dyn std::error::Error + Send + Sync>> {
    let iters = f.iterations();
    // Every worker and this thread; a worker that fails still arrives, so none waits forever.
    let start = Barrier::new(contexts + 1);
    let reports = std::thread::scope(|s| {
        let workers: Vec<_> = (0..contexts)
            .map(|i| {
                let start = &start;
                s.spawn(move || {
                    let ready = prepare::<K>(rt, case, core(rt, i), i as u64).and_then(|mut r| {
                        time_runs(&mut r, f.warmup() - 1)?;
                        Ok(r)
                    });
                    start.wait();
                    let mut r = ready?;
                    let begin = Instant::now();
                    time_runs(&mut r, iters)?;
                    let end = Instant::now();
                    // Read while every context is still alive: the emulator's model counts the
                    // cores of the active contexts.
                    let modelled_ms = modelled_ms(rt, &r.mm, contexts);
                    Ok::<_, Box<dyn std::error::Error + Send + Sync>>((r, begin, end, modelled_ms))
                })
            })
            .collect();
        start.wait();
        workers
            .into_iter()
            .map(|w| w.join().expect("a probe worker panicked"))
            .collect::<Vec<_>>()
    });
    let mut done = vec![];
    for r in reports {
        // The contexts are dropped here, after every worker has finished its runs.
        let (ready, begin, end, modelled_ms) = r?;
        done.push(Report {
            begin,
            end,
            modelled_ms,
            check: ready.check.clone(),
        });
    }
    // Wall time of the round: from the first context's start to the last one's end (on a host
    // with fewer CPUs than contexts, the emulated contexts take turns).
    let wall = match (
        done.iter().map(|r| r.begin).min(),
        done.iter().map(|r| r.end).max(),
    ) {
        (Some(b), Some(e)) => e - b,
        _ => Duration::ZERO,
    };
    let per_run = wall.as_secs_f64() / f64::from(iters);
    let modelled_ms = done
        .iter()
        .map(|r| r.modelled_ms)
        .try_fold(0f64, |acc, m| m.map(|m| acc.max(m)));
    let failed: Vec<&Check> = done.iter().map(|r| &r.check).filter(|c| !c.ok).collect();
    let check = match failed.first() {
        None => Check {
            ok: true,
            text: format!("{} (each context)", done[0].check.text),
        },
        Some(c) => (*c).clone(),
    };
    Ok(Measured {
        case: *case,
        contexts,
        ms_per_run: per_run * 1e3,
        tops: contexts as f64 * case.shape.ops() / per_run / 1e12,
        rated: rated_tops(rt, case.dtype, contexts),
        field: field_tops(case, contexts).map(|f| f.0),
        modelled_ms,
        verified: check.ok,
        check: check.text,
    })
}
