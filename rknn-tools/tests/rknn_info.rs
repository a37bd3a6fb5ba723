//! The `rknn-info` binary: text and JSON reports on the emulator, flags as users expect them.

mod common;

use std::process::Output;

/// Runs rknn-info; `None` where the binary cannot be started (an aarch64 binary under
/// qemu-user without binfmt: the kernel cannot exec it, or it dies before `main`).
fn rknn_info(args: &[&str]) -> Option<Output> {
    match common::tool(env!("CARGO_BIN_EXE_rknn-info"))
        .args(args)
        .output()
    {
        Err(e) if e.raw_os_error() == Some(8) => None,
        Err(e) => panic!("start rknn-info: {e}"),
        Ok(out) => {
            // rknn-info always prints something (its report, or an error naming itself or
            // clap's "error:"); silence means the binary never ran.
            let stderr = String::from_utf8_lossy(&out.stderr);
            let ran =
                !out.stdout.is_empty() || stderr.contains("rknn-info") || stderr.contains("error:");
            ran.then_some(out)
        }
    }
}

#[test]
fn json_report_has_the_documented_fields() {
    let Some(out) = rknn_info(&["--backend", "emulator", "--platform", "rk3576", "--json"]) else {
        eprintln!("skipped: cannot start rknn-info here");
        return;
    };
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    assert_eq!(v["backend"], "emulator");
    assert_eq!(v["platform"], "rk3576");
    assert_eq!(v["npu_cores"], 2);
    assert!(v["runtime_version"].as_str().unwrap().contains("2.3.2"));
    assert!(v["driver_version"].is_string());
    assert!(v["fd_limit"]["soft"].as_u64().unwrap() >= 1);
    let dtypes = v["dtypes"].as_array().unwrap();
    assert_eq!(dtypes.len(), 13);
    let t7 = dtypes.iter().find(|d| d["type"] == 7).unwrap();
    assert_eq!(t7["name"], "RKNN_FLOAT16_MM_INT4_TO_FLOAT32");
    assert_eq!(t7["scheme"], "W4A16");
    assert_eq!(t7["supported"], true, "RK3576 has weight-only int4");
    assert!(t7["reason"].is_null());
    let t3 = dtypes.iter().find(|d| d["type"] == 3).unwrap();
    assert_eq!(t3["supported"], false);
    assert!(t3["reason"].is_string());
}

#[test]
fn text_report_names_backend_platform_and_refusals() {
    let Some(out) = rknn_info(&["--backend", "emulator"]) else {
        eprintln!("skipped: cannot start rknn-info here");
        return;
    };
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("Backend           emulator"), "{text}");
    assert!(text.contains("RK3588"));
    assert!(
        text.contains("RKNN_FLOAT16_MM_INT4_TO_FLOAT32") && text.contains("no weight-only"),
        "{text}"
    );
}

#[test]
fn a_bad_platform_is_a_clear_error() {
    let Some(out) = rknn_info(&["--backend", "emulator", "--platform", "rk9999"]) else {
        eprintln!("skipped: cannot start rknn-info here");
        return;
    };
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("unknown platform"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn platform_with_auto_plays_that_chip_on_a_machine_without_an_npu() {
    let Some(out) = rknn_info(&["--platform", "rk3566", "--json"]) else {
        eprintln!("skipped: cannot start rknn-info here");
        return;
    };
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    if v["backend"] == "emulator" {
        assert_eq!(v["platform"], "rk3566");
        assert_eq!(v["npu_cores"], 1);
    }
}

#[test]
fn version_reports_the_runtime_and_driver() {
    let Some(out) = rknn_info(&["--backend", "emulator", "--version"]) else {
        eprintln!("skipped: cannot start rknn-info here");
        return;
    };
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.starts_with(&format!("rknn-info {}", env!("CARGO_PKG_VERSION"))),
        "{text}"
    );
    assert!(
        text.contains("runtime 2.3.2") && text.contains("driver"),
        "{text}"
    );
}

#[test]
#[cfg(unix)]
fn a_closed_pipe_is_not_a_panic() {
    use std::process::Stdio;
    let child = common::tool(env!("CARGO_BIN_EXE_rknn-info"))
        .args(["--backend", "emulator"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn();
    let Ok(mut child) = child else {
        eprintln!("skipped: cannot start rknn-info here");
        return;
    };
    // Close the reading end before the report is written, like `rknn-info | head -0`.
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() && stderr.is_empty() {
        // A failure that says nothing is a binary that never ran (qemu-user without binfmt).
        eprintln!("skipped: rknn-info did not start here");
        return;
    }
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(out.status.success(), "{stderr}");
}

/// `rknn-info` with the kernel variables set as `vars` (every other one removed).
fn rknn_info_with_kernels(args: &[&str], vars: &[(&str, &str)]) -> Option<Output> {
    let mut cmd = common::tool(env!("CARGO_BIN_EXE_rknn-info"));
    // The known variables, and any other RKNN_KERNEL* the test's own environment has.
    let inherited = std::env::vars_os()
        .map(|(k, _)| k)
        .filter(|k| k.to_string_lossy().starts_with("RKNN_KERNEL"));
    for v in [
        "RKNN_KERNEL",
        "RKNN_KERNEL_EMU",
        "RKNN_KERNEL_GLUE",
        "RKNN_KERNEL_LLM",
    ]
    .map(std::ffi::OsString::from)
    .into_iter()
    .chain(inherited)
    {
        cmd.env_remove(v);
    }
    cmd.envs(vars.iter().copied()).args(args);
    match cmd.output() {
        Err(e) if e.raw_os_error() == Some(8) => None,
        Err(e) => panic!("start rknn-info: {e}"),
        Ok(out) => (!out.stdout.is_empty()).then_some(out),
    }
}

fn kernels(vars: &[(&str, &str)]) -> Option<Vec<serde_json::Value>> {
    let out = rknn_info_with_kernels(&["--backend", "emulator", "--json"], vars)?;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    Some(v["kernels"].as_array().expect("a kernels array").clone())
}

#[test]
fn the_kernel_report_follows_the_one_convention() {
    let Some(all) = kernels(&[("RKNN_KERNEL", "scalar")]) else {
        eprintln!("skipped: cannot start rknn-info here");
        return;
    };
    let names: Vec<&str> = all
        .iter()
        .map(|k| k["component"].as_str().unwrap())
        .collect();
    // The SDK's components; the LLM library's host kernels are llm-decode's to report.
    assert_eq!(names, ["emu", "glue"]);
    for k in &all {
        assert_eq!(k["selected"], "scalar", "{k}");
        assert_eq!(k["set_by"], "RKNN_KERNEL=scalar", "{k}");
        assert!(
            k["available"]
                .as_array()
                .unwrap()
                .contains(&"scalar".into())
        );
    }
    // One component's variable changes that component only.
    let glue = kernels(&[("RKNN_KERNEL_GLUE", "scalar")]).unwrap();
    let defaults = kernels(&[]).unwrap();
    for (k, d) in glue.iter().zip(&defaults) {
        if k["component"] == "glue" {
            assert_eq!(k["selected"], "scalar");
            assert_eq!(k["set_by"], "RKNN_KERNEL_GLUE=scalar");
        } else {
            assert_eq!(k["selected"], d["selected"], "{k}");
            assert!(k["set_by"].is_null(), "{k}");
        }
        // The default is the fastest this CPU runs: the last available.
        assert_eq!(
            d["selected"],
            *d["available"].as_array().unwrap().last().unwrap(),
            "{d}"
        );
    }
    // The text report says the same, one line per component.
    let out = rknn_info_with_kernels(&["--kernels"], &[("RKNN_KERNEL", "scalar")]).unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    for c in ["emu", "glue"] {
        assert!(
            text.contains(&format!("  {c}: scalar (set by RKNN_KERNEL=scalar)")),
            "{text}"
        );
    }
    let out = rknn_info_with_kernels(&["--kernels"], &[("RKNN_KERNEL_GLUE", "scalar")]).unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("RKNN_KERNEL_<COMPONENT>"), "{text}");
    assert!(
        text.contains("glue: scalar (set by RKNN_KERNEL_GLUE=scalar)"),
        "{text}"
    );
    // No line of its own for the LLM's kernels: where they are reported instead.
    assert!(!text.contains("  llm:"), "{text}");
    assert!(
        text.contains("The LLM's host kernels (RKNN_KERNEL_LLM): llm-decode --kernels"),
        "{text}"
    );
}

#[test]
fn probing_the_capability_table_prints_no_error_lines() {
    // As a user runs it: no RKNN_EMU_LOG in the environment.
    let out = common::tool(env!("CARGO_BIN_EXE_rknn-info"))
        .env_remove("RKNN_EMU_LOG")
        .args(["--backend", "emulator"])
        .output();
    let out = match out {
        Err(e) if e.raw_os_error() == Some(8) => None,
        Err(e) => panic!("start rknn-info: {e}"),
        Ok(out) => (!out.stdout.is_empty()).then_some(out),
    };
    let Some(out) = out else {
        eprintln!("skipped: cannot start rknn-info here");
        return;
    };
    assert!(out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("E RKNN"), "{stderr}");
    // The refusals are still reported, in the table.
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("RK3588 has no weight-only"), "{stdout}");
}
