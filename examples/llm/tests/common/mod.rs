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
