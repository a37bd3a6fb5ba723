//! `llm-server` through the official OpenAI Python client: `scripts/test/openai_client.py`
//! (what it checks is in its docstring) against the demo model, plus a tiny-model server with
//! `--api-key` for the client's 401. The client is installed once into a private venv,
//! `${RKNPU_CACHE:-~/.cache/rknpu-rs}/py-openai`, pinned to [`OPENAI`]; when pip cannot install
//! it the test fails with the reason under `RKNPU_REQUIRE_DATA=1` and is skipped otherwise.

mod common;
#[path = "common/server.rs"]
mod server;

use std::io::Read;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use server::{Server, budget};

/// The pinned client (the last 1.x release).
const OPENAI: &str = "1.109.1";

/// Runs `cmd` to its end within `limit` (killed past it), its output collected.
fn run_bounded(mut cmd: Command, limit: Duration) -> Result<Output, String> {
    let what = format!("{cmd:?}");
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("{what}: {e}"))?;
    let drain = |mut r: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut v = Vec::new();
            let _ = r.read_to_end(&mut v);
            v
        })
    };
    let out = drain(Box::new(child.stdout.take().unwrap()));
    let err = drain(Box::new(child.stderr.take().unwrap()));
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(status) = child.try_wait().map_err(|e| e.to_string())? {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!("{what}: still running after {limit:?}, killed"));
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    Ok(Output {
        status,
        stdout: out.join().unwrap(),
        stderr: err.join().unwrap(),
    })
}

/// The venv's python with `openai==OPENAI`, creating it if needed; `None` (skip) when it cannot
/// be made and the data is not required.
fn openai_python() -> Option<PathBuf> {
    let cache = std::env::var_os("RKNPU_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").expect("HOME")).join(".cache/rknpu-rs")
        });
    let dir = cache.join("py-openai");
    let python = dir.join("bin/python");
    let stamp = dir.join(format!(".installed-openai-{OPENAI}"));
    if stamp.exists() && python.exists() {
        return Some(python);
    }
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&cache).unwrap();
    let step = |cmd: Command, limit: u64| -> Result<(), String> {
        let o = run_bounded(cmd, Duration::from_secs(limit))?;
        if o.status.success() {
            Ok(())
        } else {
            Err(format!(
                "{}{}",
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            ))
        }
    };
    let made = (|| {
        let mut venv = Command::new("python3");
        venv.args(["-m", "venv"]).arg(&dir);
        step(venv, 300).map_err(|e| format!("python3 -m venv {}: {e}", dir.display()))?;
        let mut pip = Command::new(&python);
        pip.args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
        ])
        .arg(format!("openai=={OPENAI}"));
        step(pip, 900)
            .map_err(|e| format!("pip install openai=={OPENAI} (is PyPI reachable?): {e}"))?;
        let mut import = Command::new(&python);
        import.args(["-c", "import openai; print(openai.__version__)"]);
        step(import, 120).map_err(|e| format!("import openai: {e}"))
    })();
    match made {
        Ok(()) => {
            std::fs::write(&stamp, OPENAI).unwrap();
            Some(python)
        }
        Err(e) => {
            let _ = std::fs::remove_dir_all(&dir);
            let msg = format!(
                "cannot install the OpenAI client into {}: {e}",
                dir.display()
            );
            if std::env::var("RKNPU_REQUIRE_DATA").is_ok_and(|v| v == "1") {
                panic!("{msg} (RKNPU_REQUIRE_DATA=1)");
            }
            eprintln!("skipped: {msg}");
            None
        }
    }
}

#[test]
fn the_official_openai_client_works() {
    let Some(model) = common::demo_model_forward() else {
        return;
    };
    let Some(python) = openai_python() else {
        return;
    };
    let _serial = server::serial();
    let s = Server::start(
        &model,
        &server::args("--backend auto -t 2 --parallel 2 -c 4096 --pooling mean -a smollm2-test"),
    );
    let auth = Server::start(
        &server::tiny_llama(),
        &server::args("--backend f32 -c 512 --api-key sekrit-7 -a tiny-auth"),
    );
    let script = common::workspace_root().join("scripts/test/openai_client.py");
    let mut cmd = Command::new(&python);
    cmd.arg(&script)
        .arg("--base-url")
        .arg(format!("http://{}/v1", s.addr))
        .args(["--model", "smollm2-test"])
        .arg("--auth-base-url")
        .arg(format!("http://{}/v1", auth.addr))
        .args(["--auth-key", "sekrit-7", "--auth-model", "tiny-auth"]);
    // `tool_choice` required and named functions are constrained: the client checks that they
    // always give a valid call.
    cmd.arg("--tool-choice-required");
    let t = Instant::now();
    let o = run_bounded(cmd, budget(600)).unwrap();
    println!("{}", String::from_utf8_lossy(&o.stdout));
    eprintln!("{}", String::from_utf8_lossy(&o.stderr));
    println!("openai_client.py took {:?}", t.elapsed());
    assert!(
        o.status.success(),
        "openai_client.py failed ({}): {}",
        o.status,
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(s.alive() && auth.alive());
}
