//! Helpers shared by the integration tests of the tools.

use std::process::Command;

/// A `Command` for one of this crate's binaries (`exe` from `env!("CARGO_BIN_EXE_...")`).
/// When the tests themselves run under an emulator (cargo's `runner`, e.g. qemu-user for
/// aarch64), `RKNPU_TEST_RUNNER` names the same runner so the child runs too: without binfmt
/// the kernel cannot execute a foreign binary.
pub fn tool(exe: &str) -> Command {
    let runner = std::env::var("RKNPU_TEST_RUNNER").unwrap_or_default();
    let mut words = runner.split_whitespace();
    match words.next() {
        None => Command::new(exe),
        Some(program) => {
            let mut cmd = Command::new(program);
            cmd.args(words).arg(exe);
            cmd
        }
    }
}
