//! `rknn-conformance` against the emulator's drop-in `librknnrt.so`: the default configuration
//! agrees on every check, and each setting for an \[open\] behaviour, set in the drop-in's
//! environment, makes exactly the checks that name it report `differs`, with that setting
//! named as the one that makes the emulator match.
//!
//! The drop-in reads its configuration when it is loaded, so every configuration runs in a
//! child process with its own environment.

mod common;

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::Output;
use std::sync::atomic::{AtomicUsize, Ordering};

use rknn_matmul::Platform;
use rknn_tools::conformance::{self, CHECKS, Mode, Options, Status, Values};
use serde_json::Value;

/// The drop-in `librknnrt.so` cargo built for these tests (a dev-dependency), next to them.
fn dropin_library() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    let so = exe.parent().expect("deps directory").join("librknnrt.so");
    assert!(so.exists(), "{} was not built", so.display());
    so
}

/// Runs rknn-conformance on the drop-in playing RK3588 with `env` set; `None` where the binary
/// cannot be started (an aarch64 binary under qemu-user without binfmt).
fn conformance(env: &[(&str, &str)], args: &[&str]) -> Option<Output> {
    // A lock file of its own per run: the tool holds the NPU lock while it checks, and two
    // tests running the same setting at once (this file's tests run in parallel) would
    // otherwise find the other's lock taken and exit with status 2.
    static RUNS: AtomicUsize = AtomicUsize::new(0);
    let lock = std::env::temp_dir().join(format!(
        "rknn-conformance-test-{}-{}-{}.lock",
        std::process::id(),
        RUNS.fetch_add(1, Ordering::Relaxed),
        env.first().map_or("default", |e| e.0)
    ));
    let so = dropin_library();
    let mut cmd = common::tool(env!("CARGO_BIN_EXE_rknn-conformance"));
    cmd.args(["--runtime", so.to_str().unwrap(), "--platform", "rk3588"])
        .args(["--lock-path", lock.to_str().unwrap()])
        .args(args);
    // Only the variables under test configure the drop-in.
    for (k, _) in std::env::vars() {
        if k.starts_with("RKNN_EMU_") || k == rknn_matmul::rknn_chip::INT4_CONVERTER_INPUT_ENV {
            cmd.env_remove(k);
        }
    }
    cmd.env("RKNN_EMU_LOG", "0");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let output = cmd.output();
    let _ = std::fs::remove_file(&lock);
    match output {
        Err(e) if e.raw_os_error() == Some(8) => None,
        Err(e) => panic!("start rknn-conformance: {e}"),
        Ok(out) => {
            let stderr = String::from_utf8_lossy(&out.stderr);
            let ran = !out.stdout.is_empty() || stderr.contains("rknn-conformance");
            ran.then_some(out)
        }
    }
}

fn json(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "{e}: {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

fn with_status<'a>(report: &'a Value, status: &str) -> BTreeSet<&'a str> {
    report["checks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["status"] == status)
        .map(|c| c["id"].as_str().unwrap())
        .collect()
}

#[test]
fn quick_mode_against_the_dropin_agrees_on_every_check() {
    let Some(out) = conformance(&[], &["--quick", "--strict", "--json"]) else {
        eprintln!("skipped: cannot start rknn-conformance here");
        return;
    };
    let report = json(&out);
    assert!(
        out.status.success(),
        "{report:#}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let checks = report["checks"].as_array().unwrap();
    assert_eq!(checks.len(), CHECKS.len());
    let agree = with_status(&report, "agree");
    assert_eq!(agree.len(), CHECKS.len(), "{report:#}");
    assert_eq!(report["summary"]["agree"], CHECKS.len());
    assert_eq!(report["subject"]["platform"], "rk3588");
    assert_eq!(report["subject"]["hardware"], false);
    assert!(
        report["subject"]["origin"]
            .as_str()
            .unwrap()
            .contains("librknnrt.so")
    );
    assert!(
        report["subject"]["runtime_version"]
            .as_str()
            .unwrap()
            .contains("rknn-emu")
    );
    // The hazardous checks run on the drop-in (it is not hardware).
    assert!(agree.contains("memory.destroyed_before_run"));
}

/// A non-default value for every setting the checks name: the first listed value, or for
/// values read off the subject, one chosen here (with the value the tool must name).
fn flips() -> Vec<(&'static str, String, String)> {
    let mut out: Vec<(&'static str, String, String)> = Vec::new();
    for c in CHECKS {
        for s in c.settings {
            // The chip is not an [open] behaviour: checking a drop-in as another chip is
            // covered by `a_drop_in_playing_another_chip_is_named`.
            if s.env == "RKNN_EMU_PLATFORM" || out.iter().any(|f| f.0 == s.env) {
                continue;
            }
            let (set, named) = match (s.env, s.values) {
                (_, Values::Fixed(v)) => (v[0].to_string(), v[0].to_string()),
                ("RKNN_EMU_HANDLE_BUDGET", _) => ("600".into(), "600".into()),
                // 2.5 GiB: two 1 GiB memories fit, so the tool names 2 GiB.
                ("RKNN_EMU_IOMMU_DOMAIN_BYTES", _) => ("2684354560".into(), "2147483648".into()),
                (env, _) => panic!("no test value for {env}"),
            };
            out.push((s.env, set, named));
        }
    }
    out
}

#[test]
fn each_open_setting_makes_exactly_its_checks_differ() {
    let flips = flips();
    assert!(flips.len() >= 11, "{flips:?}");
    for (env, value, named) in flips {
        let Some(out) = conformance(&[(env, &value)], &["--quick", "--json"]) else {
            eprintln!("skipped: cannot start rknn-conformance here");
            return;
        };
        let report = json(&out);
        assert!(
            !out.status.success(),
            "{env}={value}: exit 1 when a check differs"
        );
        let expected: BTreeSet<&str> = CHECKS
            .iter()
            .filter(|c| c.settings.iter().any(|s| s.env == env))
            .map(|c| c.id)
            .collect();
        assert_eq!(
            with_status(&report, "differs"),
            expected,
            "{env}={value}: the checks that differ"
        );
        assert!(with_status(&report, "unsupported").is_empty(), "{report:#}");
        for c in report["checks"].as_array().unwrap() {
            if c["status"] == "differs" {
                assert_eq!(
                    c["matching_setting"],
                    format!("{env}={named}"),
                    "{env}={value}: {c:#}"
                );
                let d = &c["difference"];
                assert!(d["subject"] != d["reference"], "{c:#}");
            }
        }
    }
}

#[test]
fn a_drop_in_playing_another_chip_is_named() {
    let Some(out) = conformance(
        &[("RKNN_EMU_PLATFORM", "rk3576")],
        &["--json", "--check", "types.accepted"],
    ) else {
        eprintln!("skipped: cannot start rknn-conformance here");
        return;
    };
    let report = json(&out);
    let c = &report["checks"][0];
    assert_eq!(c["status"], "differs");
    assert_eq!(c["matching_setting"], "RKNN_EMU_PLATFORM=rk3576");
    // RK3588 has type 3, RK3576 does not: the first difference.
    assert_eq!(c["difference"]["key"], "type 3 M=1 K=64 N=64: create");
    assert_eq!(c["difference"]["subject"], "-5 (RKNN_ERR_PARAM_INVALID)");
    assert!(String::from_utf8_lossy(&out.stderr).contains("warning"));
}

#[test]
fn text_report_names_the_difference_and_the_setting() {
    let Some(out) = conformance(
        &[("RKNN_EMU_ROUNDING", "half-even")],
        &["--check", "arith.requant_rounding"],
    ) else {
        eprintln!("skipped: cannot start rknn-conformance here");
        return;
    };
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.contains("differs     arith.requant_rounding"),
        "{text}"
    );
    // Row 0 of A is (-7, 0, ...) and row 0 of B is (1, 2, 3, ...): C[0] = -7 (j + 1) / 2.
    // Column 0 gives -3.5 (-4 either way), column 1 -7 (exact), column 2 -10.5: -11 half away
    // from zero, -10 half to even.
    assert!(text.contains("C at [0, 2]"), "{text}");
    assert!(text.contains("subject:   -10"), "{text}");
    assert!(text.contains("reference: -11"), "{text}");
    assert!(
        text.contains("the emulator matches with RKNN_EMU_ROUNDING=half-even"),
        "{text}"
    );
    assert!(text.contains("0 agree, 1 differ, 0 unsupported"), "{text}");
}

#[test]
fn list_and_bad_arguments() {
    let Some(out) = conformance(&[], &["--list"]) else {
        eprintln!("skipped: cannot start rknn-conformance here");
        return;
    };
    let text = String::from_utf8_lossy(&out.stdout);
    for c in CHECKS {
        assert!(text.contains(c.id), "{} missing from --list", c.id);
    }
    assert!(text.contains("setting: RKNN_EMU_I16_OVERFLOW"));
    let out = conformance(&[], &["--check", "no.such_check"]).unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no check is named"));
}

/// In process: the emulator as the subject under a changed policy, its first difference
/// computed here by hand.
#[test]
fn the_first_difference_is_the_element_the_policies_disagree_on() {
    let subject =
        conformance::emulator(Platform::Rk3588, &[("RKNN_EMU_I16_OVERFLOW", "wrap")]).unwrap();
    let opts = Options {
        only: vec!["arith.i16_overflow".into()],
        ..Options::default()
    };
    let report = conformance::run(&subject, &opts, |_| {}).unwrap();
    let r = &report.results[0];
    assert_eq!(r.status, Status::Differs);
    let d = r.difference.as_ref().unwrap();
    // Row 0 of A and column 0 of B are 1024 times -8: 65536, which saturates to 32767 and
    // wraps to 0.
    assert_eq!(d.index, Some((0, 0)));
    assert_eq!((d.subject.as_str(), d.reference.as_str()), ("0", "32767"));
    let a_row = d.input["a_row"].as_array().unwrap();
    assert!(a_row.iter().all(|v| v.as_f64() == Some(-8.0)));
    let b_col = d.input["b_col"].as_array().unwrap();
    assert!(b_col.iter().all(|v| v.as_f64() == Some(-8.0)));
    assert_eq!(d.input["k"], 1024);
    assert_eq!(
        r.matching_setting.as_deref(),
        Some("RKNN_EMU_I16_OVERFLOW=wrap")
    );
}

/// In process, every chip: the emulator against itself never differs, and the checks a chip
/// cannot run say why.
#[test]
fn every_chip_agrees_with_itself_or_says_why_not() {
    for p in Platform::ALL {
        let subject = conformance::emulator(p, &[]).unwrap();
        let report = conformance::run(&subject, &Options::default(), |_| {}).unwrap();
        assert_eq!(
            report.count(Status::Differs),
            0,
            "{p}: {}",
            report.to_text()
        );
        for r in &report.results {
            if r.status == Status::Unsupported {
                let why = r.reason.as_deref().unwrap();
                assert!(why.contains(&p.to_string()), "{p} {}: {why}", r.id);
            }
        }
        let agree = report.count(Status::Agree);
        let expected_min = if p == Platform::Rk3588 {
            CHECKS.len()
        } else {
            20
        };
        assert!(
            agree >= expected_min,
            "{p}: {agree} agree\n{}",
            report.to_text()
        );
    }
}

/// In process: full mode runs more cases and measures the timings.
#[test]
fn full_mode_adds_cases_and_timings() {
    let subject = conformance::emulator(Platform::Rk3588, &[]).unwrap();
    let opts = Options {
        mode: Mode::Full,
        only: vec!["layout.runs".into(), "dynamic".into()],
        ..Options::default()
    };
    let report = conformance::run(&subject, &opts, |_| {}).unwrap();
    assert_eq!(report.results.len(), 3);
    assert!(report.results.iter().all(|r| r.status == Status::Agree));
    // "timing" was not selected.
    assert!(report.timings.is_empty());
    let json = report.to_json();
    assert_eq!(json["mode"], "full");

    let opts = Options {
        mode: Mode::Full,
        only: vec!["timing".into()],
        ..Options::default()
    };
    let report = conformance::run(&subject, &opts, |_| {}).unwrap();
    assert!(report.results.is_empty());
    assert!(report.timings.len() >= 2, "{:?}", report.timings);
    for t in &report.timings {
        assert!(t.seconds > 0.0 && t.ops_per_second > 0.0, "{t:?}");
    }
    assert!(report.to_text().contains("TOPS"));
}

/// On RK3576, full mode's timings add each int4 type at the decode shape, per channel and (for
/// the float outputs) per group of 32 and 128, with the weight bytes per second each realised.
#[test]
fn full_mode_times_the_int4_types_on_rk3576() {
    let subject = conformance::emulator(Platform::Rk3576, &[]).unwrap();
    let opts = Options {
        mode: Mode::Full,
        only: vec!["timing".into()],
        ..Options::default()
    };
    let report = conformance::run(&subject, &opts, |_| {}).unwrap();
    let what: Vec<&str> = report.timings.iter().map(|t| t.what.as_str()).collect();
    for want in [
        "f16xi4->f32 M=1 K=1024 N=1024, native B",
        "f16xi4->f32 M=1 K=1024 N=1024, per group of 32, native B",
        "f16xi4->f32 M=1 K=1024 N=1024, per group of 128, native B",
        "i8xi4->i32 M=1 K=1024 N=1024, native B",
    ] {
        assert!(what.contains(&want), "{want} in {what:?}");
    }
    assert!(
        !what
            .iter()
            .any(|w| w.starts_with("i8xi4->i32") && w.contains("group"))
    );
    for t in &report.timings {
        // int4 B is half a byte an element: bytes per second = K·N / 2 / seconds.
        if t.what.contains("xi4->") {
            let want = 1024.0 * 1024.0 / 2.0 / t.seconds;
            assert!((t.b_bytes_per_second / want - 1.0).abs() < 1e-9, "{t:?}");
        }
    }
    assert!(report.to_text().contains("GB/s of B"));
    assert!(
        report.to_json()["timings"][0]["b_bytes_per_second"]
            .as_f64()
            .unwrap()
            > 0.0
    );
}

fn doc(name: &str) -> String {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../docs")
        .join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The check ids a line of a doc names, as `` `area.name` ``.
fn named_checks(line: &str) -> Vec<&str> {
    line.split('`')
        .skip(1)
        .step_by(2)
        .filter(|w| CHECKS.iter().any(|c| c.id == *w))
        .collect()
}

#[test]
fn every_open_fact_names_the_check_that_settles_it() {
    let facts = doc("hardware-facts.md");
    let open_rows: Vec<&str> = facts
        .lines()
        .filter(|l| l.starts_with('|') && l.contains("[open]"))
        .collect();
    assert!(open_rows.len() >= 15, "{} [open] rows", open_rows.len());
    for row in open_rows {
        assert!(
            row.contains("conformance: `") && !named_checks(row).is_empty(),
            "an [open] fact without its rknn-conformance check: {row}"
        );
    }
    // Every id the fact sheet cites exists.
    for part in facts.split("conformance: ").skip(1) {
        let cited = part.split('|').next().unwrap();
        for id in cited.split('`').skip(1).step_by(2) {
            assert!(CHECKS.iter().any(|c| c.id == id), "no check {id}");
        }
    }
}

#[test]
fn the_conformance_doc_lists_every_check_and_setting() {
    let text = doc("conformance.md");
    for c in CHECKS {
        assert!(
            text.contains(&format!("| `{}` |", c.id)),
            "{} not in docs/conformance.md",
            c.id
        );
        for s in c.settings {
            assert!(
                text.contains(&format!("| `{}` |", s.env)),
                "{} not in the settings table",
                s.env
            );
        }
        if let Some(h) = c.hazard {
            assert!(text.contains(h), "{}: hazard not documented", c.id);
        }
    }
}

/// Quick mode runs the four checks the engine's defaults rest on, and the report says what
/// the runtime answered and which engine setting follows, in the JSON and in the text.
#[test]
fn the_report_names_the_engine_settings_that_follow() {
    let Some(out) = conformance(&[], &["--quick", "--json"]) else {
        eprintln!("skipped: cannot start rknn-conformance here");
        return;
    };
    let report = json(&out);
    let settings = report["engine_settings"].as_array().unwrap();
    let answer = |id: &str| -> (String, String) {
        let s = settings
            .iter()
            .find(|s| s["check"] == id)
            .unwrap_or_else(|| panic!("{id} missing: {settings:?}"));
        (
            s["answer"].as_str().unwrap().to_string(),
            s["setting"].as_str().unwrap().to_string(),
        )
    };
    assert_eq!(settings.len(), 4, "{settings:?}");
    let (a, s) = answer("rules.n_limit");
    assert_eq!(a, "N=8192 accepted");
    assert!(s.starts_with("EngineConfig::max_n_per_context 8192"), "{s}");
    let (a, s) = answer("memory.shared_between_contexts");
    assert!(a.starts_with("accepted"), "{a}");
    assert!(s.starts_with("EngineConfig::share_io_memories on"), "{s}");
    assert!(answer("memory.cross_domain").0.starts_with("refused"));
    assert!(
        answer("sync.native_read_at_run")
            .0
            .starts_with("read at every run")
    );

    // The user guide's N limit: refused, and the engine's 4096; the other checks not run.
    let Some(out) = conformance(
        &[("RKNN_EMU_STRICT_RULES", "1")],
        &["--quick", "--check", "rules.n_limit"],
    ) else {
        return;
    };
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("\nengine settings "), "{text}");
    assert!(
        text.contains("  rules.n_limit: N=8192 refused (")
            && text.contains("-> EngineConfig::max_n_per_context 4096 ("),
        "{text}"
    );
    assert!(
        text.contains("  memory.cross_domain: not run (not selected) -> nothing follows"),
        "{text}"
    );
}
