//! mm_peak: single-context matmul throughput across shapes, types, layouts and quantisation
//! types, timing only `rknn_matmul_run` (through the safe layer), each case's first result
//! checked against a host reference.
//!
//! ```text
//! cargo run --release --example mm_peak -- [--backend auto|npu|emulator] [--platform rk3588]
//!     [--shape 4096x4096x4096,...] [--dtype i8,f16,i4] [--layout native,norm,tp-norm]
//!     [--quant per-layer,per-channel] [--iterations N] [--warmup N] [--quick] [--json]
//!     [--plot FILE.svg]
//! ```
//!
//! The default cases are the field campaign's: i8 4096³ (native B per channel, native per
//! layer, normal per layer), M = 512 prefill, and K = 15360 above the 8192-row segment. On the
//! NPU this measures the chip (the field: 0.69 TOPS at 4096³, 34 % of a core's rated 2.0); on
//! the emulator it measures the host CPU and prints the RK3588 cost model's figure beside it.
//! See docs/npu-matmul-performance.md.

use std::process::ExitCode;

use clap::Parser;
use rknn_matmul::{F16xF16ToF32, I4xI4ToI16, I8xI8ToI32, Runtime};

mod common;
use common::cases::{Case, Dtype, LayoutArg, ProbeKind, QuantArg, Shape, core, prepare, time_runs};
use common::flags::{BackendFlags, CaseFlags};
use common::report::{Measured, Out, field_tops, header, modelled_ms, rated_tops, table_header};

/// Single-context matmul throughput across shapes, types, layouts and quantisation types,
/// timing only the runs; each case's first result is checked against a host reference.
#[derive(Parser, Debug)]
#[command(name = "mm_peak")]
struct Args {
    #[command(flatten)]
    backend: BackendFlags,
    #[command(flatten)]
    cases: CaseFlags,
}

fn main() -> ExitCode {
    let args = Args::parse();
    common::run("mm_peak", || probe(&args))
}

/// The campaign's cases: (shape, layout, quant).
const CAMPAIGN: [(Shape, LayoutArg, QuantArg); 5] = [
    (SQUARE, LayoutArg::Native, QuantArg::PerChannel),
    (
        Shape {
            m: 512,
            k: 4096,
            n: 4096,
        },
        LayoutArg::Native,
        QuantArg::PerChannel,
    ),
    (SQUARE, LayoutArg::Native, QuantArg::PerLayer),
    (SQUARE, LayoutArg::Norm, QuantArg::PerLayer),
    (
        Shape {
            m: 512,
            k: 15360,
            n: 4096,
        },
        LayoutArg::Native,
        QuantArg::PerChannel,
    ),
];

const SQUARE: Shape = Shape {
    m: 4096,
    k: 4096,
    n: 4096,
};

/// The cases the flags ask for: the campaign's when no shape, layout or quantisation type is
/// given, else every combination of the given ones (the campaign's shapes, native B and
/// per-layer quantisation standing in for the ones not given); each for every dtype.
fn cases(f: &CaseFlags) -> Vec<Case> {
    let base: Vec<(Shape, LayoutArg, QuantArg)> =
        if f.shapes.is_empty() && f.layouts.is_empty() && f.quants.is_empty() {
            CAMPAIGN.to_vec()
        } else {
            let shapes = if f.shapes.is_empty() {
                let mut s: Vec<Shape> = CAMPAIGN.iter().map(|c| c.0).collect();
                s.sort_by_key(|s| (s.m, s.k, s.n));
                s.dedup();
                s
            } else {
                f.shapes.clone()
            };
            let layouts = f.layouts_or_default();
            let quants = f.quants_or_default();
            let mut all = vec![];
            for &s in &shapes {
                for &l in &layouts {
                    for &q in &quants {
                        all.push((s, l, q));
                    }
                }
            }
            all
        };
    f.dtypes
        .iter()
        .flat_map(|&dtype| {
            base.iter().map(move |&(shape, layout, quant)| Case {
                shape: if f.shapes.is_empty() {
                    f.scaled(shape)
                } else {
                    shape
                },
                dtype,
                layout,
                quant,
            })
        })
        .collect()
}

fn probe(args: &Args) -> Result<bool, Box<dyn std::error::Error>> {
    let f = &args.cases;
    let rt = args.backend.open()?;
    let out = Out::new(f.json);
    out.text(&header(
        &rt,
        "mm_peak: one context on one NPU core, timing rknn_matmul_run only",
        f,
    ));
    out.text(&table_header("case (M×K×N type B-layout B-quant)"));
    let mut all_ok = true;
    let mut rows = vec![];
    for case in cases(f) {
        let r = match case.dtype {
            Dtype::I8 => measure::<I8xI8ToI32>(&rt, &case, f),
            Dtype::F16 => measure::<F16xF16ToF32>(&rt, &case, f),
            Dtype::I4 => measure::<I4xI4ToI16>(&rt, &case, f),
        };
        match r {
            Ok(m) => {
                all_ok &= m.verified;
                out.case(&case.label(), &m);
                rows.push(m);
            }
            // A case the chip refuses (say int4 with a normal-layout B) is reported, not run.
            Err(e) => out.text(&format!("{:<34} not run: {e}", case.label())),
        }
    }
    if let Some(path) = &f.plot {
        let labels: Vec<String> = rows.iter().map(|r| r.case.short()).collect();
        let refs: Vec<&Measured> = rows.iter().collect();
        let ours = if rt.is_hardware() {
            format!("ours ({} NPU)", rt.platform())
        } else {
            "ours (host CPU emulating)".to_string()
        };
        common::plot::draw(path, "mm_peak: one context", &labels, &refs, &ours)?;
        out.text(&format!("plot written to {}", path.display()));
    }
    Ok(all_ok)
}

fn measure<K: ProbeKind>(
    rt: &Runtime,
    case: &Case,
    f: &CaseFlags,
) -> Result<Measured, Box<dyn std::error::Error + Send + Sync>> {
    let mut ready = prepare::<K>(rt, case, core(rt, 0), 0)?;
    // The first run (in `prepare`) was the checked one; the rest of the warm-up follows.
    time_runs(&mut ready, f.warmup() - 1)?;
    let iters = f.iterations();
    let dt = time_runs(&mut ready, iters)?.as_secs_f64() / f64::from(iters);
    Ok(Measured {
        case: *case,
        contexts: 1,
        ms_per_run: dt * 1e3,
        tops: case.shape.ops() / dt / 1e12,
        rated: rated_tops(rt, case.dtype, 1),
        field: field_tops(case, 1).map(|f| f.0),
        modelled_ms: modelled_ms(rt, &ready.mm, 1),
        verified: ready.check.ok,
        check: ready.check.text.clone(),
    })
}
