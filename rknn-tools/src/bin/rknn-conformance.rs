//! `rknn-conformance`: checks the emulator's facts against a runtime. On a board it runs
//! Rockchip's `librknnrt.so` and the built-in emulator side by side on the same inputs; on a
//! machine without an NPU, point it at the emulator's drop-in library (`--runtime`,
//! `--platform`). See docs/conformance.md.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use rknn_matmul::{Backend, Platform, Runtime, RuntimeOptions};
use rknn_tools::conformance::{self, CHECKS, Mode, Options, Status};
use rknn_tools::print_out;

/// Checks the emulator's facts (types, layouts, rounding, quantisation, dynamic shapes, memory
/// hazards...) against a runtime and reports each as agree, differs or unsupported.
#[derive(Parser, Debug)]
#[command(about, version)]
struct Args {
    /// The runtime library to check (default: $RKNN_RUNTIME_PATH, else librknnrt.so from the
    /// loader's path). The emulator's drop-in library works too.
    #[arg(long, value_name = "PATH")]
    runtime: Option<PathBuf>,
    /// The chip, instead of reading the device tree (needed with the drop-in on a machine
    /// without an NPU): rk3588, rk3576, rk3562, rk3566 or rk3568.
    #[arg(long)]
    platform: Option<Platform>,
    /// More shapes, layouts and seeds, and timing measurements (under ten minutes).
    #[arg(long, conflicts_with = "quick")]
    full: bool,
    /// Small shapes only (the default; under a minute).
    #[arg(long)]
    quick: bool,
    /// Print one JSON object (attach it to a bug report).
    #[arg(long)]
    json: bool,
    /// Run only this check, or every check of an area (`arith`); repeatable.
    #[arg(long = "check", value_name = "ID")]
    checks: Vec<String>,
    /// Seed of the random inputs.
    #[arg(long, default_value_t = Options::default().seed)]
    seed: u64,
    /// Also run, on hardware, the checks that risk a fault or a large allocation.
    #[arg(long)]
    hazardous: bool,
    /// Exit with 1 unless every check agrees (unsupported included): the CI's gate.
    #[arg(long)]
    strict: bool,
    /// List the checks and exit.
    #[arg(long)]
    list: bool,
    /// The NPU lock file (default /tmp/rknn-npu.lock), held while the checks run.
    #[arg(long, value_name = "PATH")]
    lock_path: Option<PathBuf>,
}

fn list() -> String {
    let mut s = String::new();
    for c in CHECKS {
        let settings: Vec<&str> = c.settings.iter().map(|s| s.env).collect();
        s.push_str(&format!("{:<34} [{}] {}\n", c.id, c.label.name(), c.fact));
        if !settings.is_empty() {
            s.push_str(&format!("{:<34} setting: {}\n", "", settings.join(", ")));
        }
        if let Some(h) = c.hazard {
            s.push_str(&format!("{:<34} hazardous on a board: {h}\n", ""));
        }
    }
    s
}

fn main() -> ExitCode {
    let args = Args::parse();
    if args.list {
        print_out(&list());
        return ExitCode::SUCCESS;
    }
    if let Some(unknown) = args.checks.iter().find(|o| {
        !CHECKS
            .iter()
            .any(|c| conformance::selected(c.id, std::slice::from_ref(o)))
            && o.as_str() != "timing"
    }) {
        eprintln!("rknn-conformance: no check is named {unknown:?} (see --list)");
        return ExitCode::from(2);
    }
    let mut opts = RuntimeOptions {
        runtime_path: args.runtime.clone(),
        npu_platform: args.platform,
        ..RuntimeOptions::default()
    };
    if let Some(p) = &args.lock_path {
        opts.lock_path = p.clone();
    }
    let subject = match Runtime::open(Backend::Npu, opts) {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("rknn-conformance: cannot open the runtime to check: {e}");
            if args.platform.is_none() {
                eprintln!(
                    "  (without an NPU, check the emulator's drop-in: --runtime target/release/librknnrt.so --platform rk3588)"
                );
            }
            return ExitCode::from(2);
        }
    };
    // The drop-in plays the chip RKNN_EMU_PLATFORM names; checking it as another chip would
    // report the chips' differences, not the runtime's.
    if let (false, Some(v)) = (subject.is_hardware(), subject.versions()) {
        let name = subject.platform().name();
        if v.driver.starts_with("emulated ") && !v.driver.contains(name) {
            eprintln!(
                "rknn-conformance: warning: the runtime says {:?} but the checks assume {name} (--platform / RKNN_EMU_PLATFORM)",
                v.driver
            );
        }
    }
    let run_opts = Options {
        mode: if args.full { Mode::Full } else { Mode::Quick },
        seed: args.seed,
        hazardous: args.hazardous,
        only: args.checks.clone(),
    };
    let report = match conformance::run(&subject, &run_opts, |_| {}) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("rknn-conformance: cannot open the reference emulator: {e}");
            return ExitCode::from(2);
        }
    };
    if args.json {
        print_out(&format!("{:#}\n", report.to_json()));
    } else {
        print_out(&report.to_text());
    }
    let failed =
        report.count(Status::Differs) > 0 || (args.strict && report.count(Status::Unsupported) > 0);
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
