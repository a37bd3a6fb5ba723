//! Helpers shared by the integration tests: where fetched data lives, and the skip rule.
#![allow(dead_code)]

use std::path::PathBuf;

/// The workspace root (two levels above this crate).
pub fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// This crate's committed fixtures.
pub fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

/// The demo model, fetched by `scripts/fetch-model.sh`.
pub fn demo_model() -> PathBuf {
    workspace_root().join("models/SmolLM2-135M-Instruct.Q4_1.gguf")
}

/// Gemma-3-270M (Q4_K_M), fetched by `scripts/fetch-model.sh gemma3-270m`.
pub fn gemma3_model() -> PathBuf {
    workspace_root().join("models/gemma-3-270m-q4_k_m.gguf")
}

/// `Some(path)` if `path` exists; otherwise prints the skip message and returns `None`, or
/// panics when `RKNPU_REQUIRE_DATA=1` (CI) demands the data.
pub fn require(path: PathBuf, script: &str) -> Option<PathBuf> {
    if path.exists() {
        return Some(path);
    }
    let msg = format!("skipped: {} is missing, run {script}", path.display());
    if std::env::var("RKNPU_REQUIRE_DATA").is_ok_and(|v| v == "1") {
        panic!("{msg} (RKNPU_REQUIRE_DATA=1)");
    }
    eprintln!("{msg}");
    None
}

/// The demo model for a test that runs it forward (hundreds of millions of multiply-adds per
/// token): `None` with a skip message when `RKNPU_TEST_SMALL_MODELS_ONLY=1`, which CI sets for
/// the aarch64 run under qemu-user where such a test would take most of the budget (the tiny
/// committed models check the same code there; the demo model runs natively).
pub fn demo_model_forward() -> Option<PathBuf> {
    if std::env::var("RKNPU_TEST_SMALL_MODELS_ONLY").is_ok_and(|v| v == "1") {
        eprintln!("skipped: RKNPU_TEST_SMALL_MODELS_ONLY=1 (the demo model is not run forward)");
        return None;
    }
    require(demo_model(), "scripts/fetch-model.sh")
}

/// Gemma-3-270M for a test that runs it forward, under the rules of [`demo_model_forward`].
pub fn gemma3_model_forward() -> Option<PathBuf> {
    if std::env::var("RKNPU_TEST_SMALL_MODELS_ONLY").is_ok_and(|v| v == "1") {
        eprintln!("skipped: RKNPU_TEST_SMALL_MODELS_ONLY=1 (Gemma-3-270M is not run forward)");
        return None;
    }
    require(gemma3_model(), "scripts/fetch-model.sh gemma3-270m")
}

/// A `Command` for this crate's `llm-decode` binary. When the tests themselves run under an
/// emulator (cargo's `runner`, e.g. qemu-user for aarch64), `RKNPU_TEST_RUNNER` names the same
/// runner so the child runs too: without binfmt the kernel cannot execute a foreign binary.
pub fn llm_decode() -> std::process::Command {
    let Some(exe) = option_env!("CARGO_BIN_EXE_llm-decode") else {
        panic!("llm-decode is built for the tests that run it (feature `cli`)");
    };
    let runner = std::env::var("RKNPU_TEST_RUNNER").unwrap_or_default();
    let mut words = runner.split_whitespace();
    let mut cmd = match words.next() {
        None => std::process::Command::new(exe),
        Some(program) => {
            let mut cmd = std::process::Command::new(program);
            cmd.args(words).arg(exe);
            cmd
        }
    };
    cmd.env("XDG_CACHE_HOME", test_cache_home());
    cmd
}

/// The cache directory the tests' binaries use (their converted-weight cache goes under it),
/// in cargo's scratch space instead of the user's home: shared by every test of a run, so the
/// tests exercise cached loads too.
#[allow(dead_code)] // Not every test binary spawns one.
pub fn test_cache_home() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("xdg-cache")
}

/// The drop-in `librknnrt.so` cargo built for these tests (a dev-dependency), beside the test
/// binary.
pub fn dropin() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let so = exe.parent().unwrap().join("librknnrt.so");
    assert!(so.exists(), "{} was not built", so.display());
    so
}

/// Runs `llm-decode --json` as `cmd` says (with `envs` set) and returns its JSON, failing
/// with its stderr if it failed.
pub fn run_json(
    mut cmd: std::process::Command,
    envs: &[(&str, &std::path::Path)],
) -> serde_json::Value {
    for (k, v) in envs {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("llm-decode runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The model at `path` on the host f32 path, loaded through the builder with its trained
/// context, its passes on an ordinary pool of `threads`, with one sequence.
pub fn load_f32(path: &std::path::Path, threads: usize) -> Run {
    let loaded = rknn_llm::Model::builder(path)
        .backend(rknn_llm::Backend::F32)
        .pool(rknn_llm::model::HostPool::workers(threads).unwrap())
        .context(0)
        .load()
        .unwrap();
    Run::new(loaded.model)
}

/// A model with one sequence, driven as the tests drive it (forward, reset, the cache).
pub struct Run {
    pub model: std::sync::Arc<rknn_llm::model::Model>,
    pub seq: rknn_llm::model::Sequence,
}

impl Run {
    /// `model` with an empty f32 sequence.
    pub fn new(model: impl Into<std::sync::Arc<rknn_llm::model::Model>>) -> Run {
        let model = model.into();
        let seq = model.sequence(rknn_llm::model::CacheType::F32);
        Run { model, seq }
    }

    /// [`rknn_llm::model::Model::forward`] on the sequence.
    pub fn forward(
        &mut self,
        tokens: &[u32],
        pos: usize,
        which: rknn_llm::model::Logits,
    ) -> Result<&[f32], rknn_llm::model::ModelError> {
        self.model.forward(&mut self.seq, tokens, pos, which)
    }

    pub fn reset(&mut self) {
        self.seq.reset();
    }

    pub fn config(&self) -> &rknn_llm::model::Config {
        self.model.config()
    }

    pub fn cache(&self) -> &rknn_llm::model::KvCache {
        self.seq.cache()
    }

    pub fn stats(&self) -> &rknn_llm::model::Stats {
        self.seq.stats()
    }

    /// A new empty sequence storing keys and values as `ty`.
    pub fn set_cache_type(&mut self, ty: rknn_llm::model::CacheType) {
        self.seq = self.model.sequence(ty);
    }
}

/// The NPU is single-tenant (a second process gets "NPU busy": the NPU path takes the lock
/// file `/tmp/rknn-npu.lock`): runs of `llm-decode --backend npu` in one test binary hold this
/// to take turns.
pub static NPU: std::sync::Mutex<()> = std::sync::Mutex::new(());
