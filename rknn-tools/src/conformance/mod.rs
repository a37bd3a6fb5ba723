//! `rknn-conformance`: the emulator's facts checked against a runtime.
//!
//! A *subject* runtime (on a board Rockchip's `librknnrt.so`; in CI the emulator's drop-in
//! library under some `RKNN_EMU_*` configuration) and a *reference* (the built-in emulator in
//! its default configuration, playing the same chip) are asked the same questions through the
//! C function table, on the same inputs. Each [`Check`] covers one fact of
//! `docs/hardware-facts.md` and ends [`Status::Agree`], [`Status::Differs`] (with the first
//! differing element, both values and the input behind them) or [`Status::Unsupported`].
//!
//! When a check differs, the emulator is run again under each value of the settings that
//! govern the fact ([`Check::settings`]); the one whose answers equal the subject's is named,
//! so a board's report says which `RKNN_EMU_*` setting makes the emulator behave like it.
//!
//! ```
//! use rknn_tools::conformance::{self, Options};
//! use rknn_matmul::{Platform, Runtime};
//! // The emulator against itself agrees on every fact.
//! let subject = Runtime::emulator(Platform::Rk3588)?;
//! let opts = Options { only: vec!["arith.i16_overflow".into()], ..Options::default() };
//! let report = conformance::run(&subject, &opts, |_| {})?;
//! assert_eq!(report.results[0].status, conformance::Status::Agree);
//! # Ok::<(), rknn_matmul::Error>(())
//! ```

mod case;
mod check;
mod checks;
pub mod observe;
pub mod raw;
mod report;
pub mod settings;

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::Instant;

use rknn_matmul::rknn_emu::EmuConfig;
use rknn_matmul::{Backend, GuardPolicy, Platform, Runtime, RuntimeOptions};

pub use check::{Check, CheckResult, Cx, Label, Mode, Setting, Side, Status, Unsupported, Values};
pub use checks::CHECKS;
use observe::Observation;
pub use report::{Report, SubjectInfo, Timing};

/// What to run.
#[derive(Clone, Debug)]
pub struct Options {
    /// Quick or full.
    pub mode: Mode,
    /// Seed of the random inputs.
    pub seed: u64,
    /// Run the hazardous checks on hardware too.
    pub hazardous: bool,
    /// Only the checks whose id equals or starts with one of these (all when empty).
    pub only: Vec<String>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            mode: Mode::Quick,
            seed: 0x5eed,
            hazardous: false,
            only: Vec::new(),
        }
    }
}

/// The emulator in its default configuration playing `platform`, with `overrides` applied as
/// if they were the drop-in's environment.
pub fn emulator(platform: Platform, overrides: &[(&str, &str)]) -> rknn_matmul::Result<Runtime> {
    let mut cfg = EmuConfig::from_vars(|name| {
        if name == "RKNN_EMU_PLATFORM" {
            return overrides.iter().find(|(n, _)| *n == name).map_or_else(
                || Some(platform.name().to_string()),
                |(_, v)| Some(v.to_string()),
            );
        }
        overrides
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v.to_string())
    });
    // Refusals are what many checks observe; the subject's log is the one that matters.
    cfg.log_errors = false;
    let opts = RuntimeOptions {
        int4_converter_input: Some(cfg.int4_converter_input),
        group_order: Some(cfg.group_order),
        raise_fd_limit: GuardPolicy::Never,
        emulator: cfg.clone(),
        ..RuntimeOptions::default()
    };
    Runtime::open(Backend::Emulator(cfg.platform), opts)
}

fn observe(check: &Check, side: &Side<'_>, cx: &Cx) -> Result<Observation, Unsupported> {
    // A bug in one check must not cost the user the rest of the report.
    catch_unwind(AssertUnwindSafe(|| (check.observe)(side, cx))).unwrap_or_else(|p| {
        let msg = p
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| p.downcast_ref::<String>().cloned())
            .unwrap_or_default();
        Err(Unsupported(format!("internal error in the check: {msg}")))
    })
}

/// Runs one check on the subject and the reference, and on emulators under the check's
/// settings when they differ.
pub fn run_check(
    check: &Check,
    subject: &Runtime,
    reference: &Runtime,
    opts: &Options,
) -> CheckResult {
    let start = Instant::now();
    let cx = Cx {
        mode: opts.mode,
        seed: opts.seed,
    };
    let mut result = CheckResult {
        id: check.id,
        fact: check.fact,
        label: check.label,
        status: Status::Agree,
        reason: None,
        difference: None,
        settings: check.settings.iter().map(|s| s.env).collect(),
        matching_setting: None,
        tried: Vec::new(),
        seconds: 0.0,
    };
    let unsupported = |mut r: CheckResult, why: String| {
        r.status = Status::Unsupported;
        r.reason = Some(why);
        r.seconds = start.elapsed().as_secs_f64();
        r
    };
    if let (Some(h), true, false) = (check.hazard, subject.is_hardware(), opts.hazardous) {
        return unsupported(
            result,
            format!("skipped on hardware: {h} (--hazardous runs it)"),
        );
    }
    let s = match observe(check, &Side { rt: subject }, &cx) {
        Ok(o) => o,
        Err(Unsupported(why)) => return unsupported(result, why),
    };
    let r = match observe(check, &Side { rt: reference }, &cx) {
        Ok(o) => o,
        Err(Unsupported(why)) => return unsupported(result, format!("on the reference: {why}")),
    };
    if let Some(d) = observe::compare(&s, &r) {
        result.status = Status::Differs;
        result.difference = Some(d);
        'settings: for setting in check.settings {
            let values: Vec<String> = match setting.values {
                Values::Fixed(v) => v.iter().map(|v| v.to_string()).collect(),
                Values::FromSubject(f) => f(&s).into_iter().collect(),
            };
            for v in values {
                let name = format!("{}={v}", setting.env);
                let Ok(alt) = emulator(subject.platform(), &[(setting.env, &v)]) else {
                    result.tried.push(name);
                    continue;
                };
                let same = observe(check, &Side { rt: &alt }, &cx)
                    .is_ok_and(|o| observe::compare(&s, &o).is_none());
                if same {
                    result.matching_setting = Some(name);
                    break 'settings;
                }
                result.tried.push(name);
            }
        }
    }
    result.seconds = start.elapsed().as_secs_f64();
    result
}

/// Whether `id` is selected by `only`.
pub fn selected(id: &str, only: &[String]) -> bool {
    only.is_empty()
        || only
            .iter()
            .any(|o| id == o || id.starts_with(&format!("{}.", o.trim_end_matches('.'))))
}

/// Runs the selected checks of [`CHECKS`] against `subject`, calling `progress` after each.
pub fn run(
    subject: &Runtime,
    opts: &Options,
    mut progress: impl FnMut(&CheckResult),
) -> rknn_matmul::Result<Report> {
    let start = Instant::now();
    let reference = emulator(subject.platform(), &[])?;
    let mut results = Vec::new();
    for check in CHECKS.iter().filter(|c| selected(c.id, &opts.only)) {
        let r = run_check(check, subject, &reference, opts);
        progress(&r);
        results.push(r);
    }
    let timings = if opts.mode == Mode::Full && selected("timing", &opts.only) {
        checks::timings(subject)
    } else {
        Vec::new()
    };
    Ok(Report {
        subject: SubjectInfo::of(subject),
        mode: opts.mode,
        seed: opts.seed,
        results,
        timings,
        seconds: start.elapsed().as_secs_f64(),
    })
}
