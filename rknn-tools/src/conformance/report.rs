//! The report: a human summary, and JSON for a bug report.

use std::fmt::Write as _;

use rknn_matmul::Runtime;
use serde_json::{Value as Json, json};

use super::check::{CheckResult, Mode, Status};
use super::settings::{self, EngineSetting};

/// What the subject runtime is.
#[derive(Clone, Debug)]
pub struct SubjectInfo {
    /// Where its function table came from (the library's path).
    pub origin: String,
    /// Whether it is real NPU hardware (not the emulator or its drop-in).
    pub hardware: bool,
    /// The chip.
    pub platform: rknn_matmul::Platform,
    /// The runtime's version, when it reports one.
    pub runtime_version: Option<String>,
    /// The driver's version, when reported.
    pub driver_version: Option<String>,
    /// Optional functions the runtime does not export.
    pub missing_symbols: Vec<&'static str>,
}

impl SubjectInfo {
    /// Describes `rt`.
    pub fn of(rt: &Runtime) -> SubjectInfo {
        SubjectInfo {
            origin: rt.api().origin().to_string(),
            hardware: rt.is_hardware(),
            platform: rt.platform(),
            runtime_version: rt.versions().map(|v| v.runtime.clone()),
            driver_version: rt.versions().map(|v| v.driver.clone()),
            missing_symbols: rt.api().missing_optional(),
        }
    }
}

/// One timing measurement (full mode): what the cost model and the documented figures assume,
/// measured on the subject.
#[derive(Clone, Debug)]
pub struct Timing {
    /// What was timed.
    pub what: String,
    /// Median seconds per run.
    pub seconds: f64,
    /// Integer or float operations per second derived from it.
    pub ops_per_second: f64,
    /// Bytes of B (the weights, as stored: int4 half a byte) per second: at a decode shape,
    /// which reads B once, the DDR bandwidth the run realises.
    pub b_bytes_per_second: f64,
    /// The figure the docs give for a board, to compare with.
    pub documented: &'static str,
}

/// Everything a run found.
#[derive(Clone, Debug)]
pub struct Report {
    /// The subject.
    pub subject: SubjectInfo,
    /// Quick or full.
    pub mode: Mode,
    /// Seed of the random inputs.
    pub seed: u64,
    /// One result per check run.
    pub results: Vec<CheckResult>,
    /// Timing measurements (full mode).
    pub timings: Vec<Timing>,
    /// Seconds the whole run took.
    pub seconds: f64,
}

impl Report {
    /// How many checks ended with `status`.
    pub fn count(&self, status: Status) -> usize {
        self.results.iter().filter(|r| r.status == status).count()
    }

    /// What the runtime answered to each \[open\] fact the engine depends on, and the engine
    /// setting that follows (one per check of [`settings::ENGINE_CHECKS`], "not run" when it
    /// was not selected).
    pub fn engine_settings(&self) -> Vec<EngineSetting> {
        settings::engine_settings(self.subject.platform, &self.results)
    }

    /// The report as one JSON object (the form to attach to a bug report).
    pub fn to_json(&self) -> Json {
        let s = &self.subject;
        json!({
            "tool": "rknn-conformance",
            "tool_version": env!("CARGO_PKG_VERSION"),
            "mode": match self.mode { Mode::Quick => "quick", Mode::Full => "full" },
            "seed": self.seed,
            "subject": {
                "origin": s.origin,
                "hardware": s.hardware,
                "platform": s.platform.name(),
                "runtime_version": s.runtime_version,
                "driver_version": s.driver_version,
                "missing_symbols": s.missing_symbols,
            },
            "reference": format!("rknn-emu {} (default configuration)", env!("CARGO_PKG_VERSION")),
            "summary": {
                "agree": self.count(Status::Agree),
                "differs": self.count(Status::Differs),
                "unsupported": self.count(Status::Unsupported),
            },
            "checks": self.results.iter().map(result_json).collect::<Vec<_>>(),
            "engine_settings": self.engine_settings().iter().map(EngineSetting::to_json).collect::<Vec<_>>(),
            "timings": self.timings.iter().map(|t| json!({
                "what": t.what,
                "seconds": t.seconds,
                "ops_per_second": t.ops_per_second,
                "b_bytes_per_second": t.b_bytes_per_second,
                "documented": t.documented,
            })).collect::<Vec<_>>(),
            "seconds": self.seconds,
        })
    }

    /// The human summary.
    pub fn to_text(&self) -> String {
        let mut out = String::new();
        let s = &self.subject;
        // Writing into a String cannot fail.
        let _ = writeln!(
            out,
            "rknn-conformance {} ({} mode, seed {})",
            env!("CARGO_PKG_VERSION"),
            match self.mode {
                Mode::Quick => "quick",
                Mode::Full => "full",
            },
            self.seed
        );
        let _ = writeln!(
            out,
            "subject:   {} ({}, {})",
            s.origin,
            if s.hardware {
                "hardware"
            } else {
                "not hardware: an emulator"
            },
            s.platform
        );
        let _ = writeln!(
            out,
            "versions:  runtime {}, driver {}",
            s.runtime_version.as_deref().unwrap_or("not reported"),
            s.driver_version.as_deref().unwrap_or("not reported")
        );
        let _ = writeln!(out, "reference: rknn-emu, default configuration\n");
        for r in &self.results {
            let _ = writeln!(
                out,
                "{:<11} {:<34} [{}] {}",
                r.status.name(),
                r.id,
                r.label.name(),
                r.fact
            );
            if let Some(why) = &r.reason {
                let _ = writeln!(out, "            {why}");
            }
            if let Some(d) = &r.difference {
                let at = d
                    .index
                    .map(|(i, j)| format!(" at [{i}, {j}]"))
                    .unwrap_or_default();
                let _ = writeln!(out, "            first difference: {}{at}", d.key);
                let _ = writeln!(out, "              subject:   {}", d.subject);
                let _ = writeln!(out, "              reference: {}", d.reference);
                if !d.input.is_null() {
                    let _ = writeln!(out, "              input:     {}", d.input);
                }
                let _ = match &r.matching_setting {
                    Some(m) => writeln!(out, "            the emulator matches with {m}"),
                    None if r.settings.is_empty() => writeln!(
                        out,
                        "            no RKNN_EMU_* setting covers this: the emulator's rule must change (please report it)"
                    ),
                    None => writeln!(
                        out,
                        "            no setting reproduces it (tried {}): please report it",
                        r.tried.join(", ")
                    ),
                };
            }
        }
        let _ = writeln!(
            out,
            "\nengine settings (what this runtime answered -> what rknn-matmul's engine uses):"
        );
        for e in self.engine_settings() {
            let _ = writeln!(out, "  {}", e.line());
        }
        if !self.timings.is_empty() {
            let _ = writeln!(out, "\ntimings (median of the runs):");
            for t in &self.timings {
                let _ = writeln!(
                    out,
                    "  {:<60} {:>10.3} ms {:>8.3} TOPS {:>7.2} GB/s of B   board: {}",
                    t.what,
                    t.seconds * 1e3,
                    t.ops_per_second / 1e12,
                    t.b_bytes_per_second / 1e9,
                    t.documented
                );
            }
        }
        let _ = writeln!(
            out,
            "\n{} agree, {} differ, {} unsupported ({:.1} s)",
            self.count(Status::Agree),
            self.count(Status::Differs),
            self.count(Status::Unsupported),
            self.seconds
        );
        if s.hardware && self.count(Status::Differs) > 0 {
            let _ = writeln!(
                out,
                "Please attach the output of `rknn-conformance --json` to an issue: see docs/conformance.md."
            );
        }
        out
    }
}

fn result_json(r: &CheckResult) -> Json {
    json!({
        "id": r.id,
        "fact": r.fact,
        "label": r.label.name(),
        "status": r.status.name(),
        "reason": r.reason,
        "difference": r.difference.as_ref().map(|d| d.to_json()),
        "settings": r.settings,
        "matching_setting": r.matching_setting,
        "tried": r.tried,
        "seconds": r.seconds,
    })
}
