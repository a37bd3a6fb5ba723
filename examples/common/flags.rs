//! The probes' command-line flags: which backend runs the matmuls, and which cases to run and
//! how (shapes, types, layouts, quantisation, iterations, `--quick`, `--json`, `--plot`).

use clap::{Args, ValueEnum};
use rknn_matmul::{Backend, Platform, Runtime, RuntimeOptions};

use super::cases::{Dtype, LayoutArg, QuantArg, Shape};

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

/// What to run: the flags both probes share.
#[derive(Args, Debug, Clone)]
pub struct CaseFlags {
    /// Shapes to run, MxKxN (repeat or comma-separate). Default: the campaign's.
    #[arg(long = "shape", value_delimiter = ',')]
    pub shapes: Vec<Shape>,
    /// Operand types (repeat or comma-separate).
    #[arg(
        long = "dtype",
        value_enum,
        value_delimiter = ',',
        default_value = "i8"
    )]
    pub dtypes: Vec<Dtype>,
    /// Layouts of B (repeat or comma-separate). Default: the campaign's.
    #[arg(long = "layout", value_enum, value_delimiter = ',')]
    pub layouts: Vec<LayoutArg>,
    /// Quantisation types of B for the integer types (repeat or comma-separate). Default:
    /// the campaign's.
    #[arg(long = "quant", value_enum, value_delimiter = ',')]
    pub quants: Vec<QuantArg>,
    /// Timed runs per case (default 10, 2 with --quick).
    #[arg(long)]
    pub iterations: Option<u32>,
    /// Untimed runs before timing (default 3, 1 with --quick); the first is the checked one.
    #[arg(long)]
    pub warmup: Option<u32>,
    /// Small shapes and few iterations (for CI and the emulator): the campaign's shapes with
    /// 4096 → 256, 512 → 64 and K = 15360 → 8704 (still above the 8192-row segment).
    #[arg(long)]
    pub quick: bool,
    /// One JSON object per case on stdout (the table goes to stderr).
    #[arg(long)]
    pub json: bool,
    /// Writes a plot of the throughput (ours, the model's, the field's, the rated) to this SVG.
    #[arg(long, value_name = "FILE.svg")]
    pub plot: Option<std::path::PathBuf>,
}

impl CaseFlags {
    pub fn iterations(&self) -> u32 {
        self.iterations
            .unwrap_or(if self.quick { 2 } else { 10 })
            .max(1)
    }

    pub fn warmup(&self) -> u32 {
        // The first run is the checked one, so there is always one.
        self.warmup.unwrap_or(if self.quick { 1 } else { 3 }).max(1)
    }

    /// The layouts asked for, or the campaign's (native B) when none were.
    pub fn layouts_or_default(&self) -> Vec<LayoutArg> {
        if self.layouts.is_empty() {
            vec![LayoutArg::Native]
        } else {
            self.layouts.clone()
        }
    }

    /// The quantisation types asked for, or the campaign's (per layer) when none were.
    pub fn quants_or_default(&self) -> Vec<QuantArg> {
        if self.quants.is_empty() {
            vec![QuantArg::PerLayer]
        } else {
            self.quants.clone()
        }
    }

    /// A campaign shape, shrunk for --quick.
    pub fn scaled(&self, s: Shape) -> Shape {
        if !self.quick {
            return s;
        }
        let f = |v: usize| match v {
            4096 => 256,
            512 => 64,
            15360 => 8704,
            v => v,
        };
        Shape {
            m: f(s.m),
            k: f(s.k),
            n: f(s.n),
        }
    }
}
