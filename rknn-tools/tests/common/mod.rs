//! Helpers shared by the integration tests of the tools.

use std::process::Command;

/// A `Command` for one of this crate's binaries (`exe` from `env!("CARGO_BIN_EXE_...")`).
/// When the tests themselves run under an emulator (cargo's `runner`, e.g. qemu-user for
/// aarch64), `RKNPU_TEST_RUNNER` names the same runner so the child runs too: without binfmt
/// the kernel cannot execute a foreign binary.
///
/// The child does not inherit the test process's `RKNN_EMU_*` variables: both the drop-in and
/// the tools' in-process emulator read them, and a test sets the ones it is about itself.
pub fn tool(exe: &str) -> Command {
    let runner = std::env::var("RKNPU_TEST_RUNNER").unwrap_or_default();
    let mut words = runner.split_whitespace();
    let mut cmd = match words.next() {
        None => Command::new(exe),
        Some(program) => {
            let mut cmd = Command::new(program);
            cmd.args(words).arg(exe);
            cmd
        }
    };
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("RKNN_EMU_") {
            cmd.env_remove(k);
        }
    }
    cmd
}
