//! What the probe examples share: the backend flags and opening the runtime.

use clap::{Args, ValueEnum};
use rknn_matmul::{Backend, Platform, Runtime, RuntimeOptions};

/// Which backend runs the matmuls.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum BackendArg {
    /// The NPU if there is one, else the emulator.
    Auto,
    /// The NPU (librknnrt.so, or $RKNN_RUNTIME_PATH).
    Npu,
    /// The emulator.
    Emulator,
}

/// Backend selection flags.
#[derive(Args, Debug, Clone)]
pub struct BackendFlags {
    /// Which backend runs the matmuls.
    #[arg(long, value_enum, default_value = "auto")]
    pub backend: BackendArg,
    /// The chip the emulator plays (also the chip `auto` falls back to), or the chip to
    /// assume on the NPU instead of reading the device tree.
    #[arg(long)]
    pub platform: Option<Platform>,
}

impl BackendFlags {
    /// Opens the runtime the flags describe.
    pub fn open(&self) -> rknn_matmul::Result<Runtime> {
        let mut opts = RuntimeOptions::default();
        let backend = match self.backend {
            BackendArg::Auto => {
                if let Some(p) = self.platform {
                    opts.emulator.platform = p;
                }
                Backend::Auto
            }
            BackendArg::Npu => {
                opts.npu_platform = self.platform;
                Backend::Npu
            }
            BackendArg::Emulator => Backend::Emulator(self.platform.unwrap_or(Platform::Rk3588)),
        };
        Runtime::open(backend, opts)
    }
}

/// Runs `main`, printing an error with `Display` (not `Debug`) and exiting non-zero.
pub fn run(
    name: &str,
    main: impl FnOnce() -> Result<(), Box<dyn std::error::Error>>,
) -> std::process::ExitCode {
    match main() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{name}: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
