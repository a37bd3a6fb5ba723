//! `rknn-info`: what this machine's NPU (or the emulator) is and can do, like `clinfo`.

use std::fmt::Write as _;
use std::process::ExitCode;

use clap::{Parser, ValueEnum};
use rknn_matmul::guard::NpuLock;
use rknn_matmul::{Backend, Platform, Runtime, RuntimeOptions};
use rknn_tools::print_out;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum BackendArg {
    Auto,
    Npu,
    Emulator,
}

/// Reports the backend, chip, NPU cores, runtime and driver versions, file-descriptor limits,
/// NPU lock state and the matmul capability table.
#[derive(Parser, Debug)]
#[command(about, disable_version_flag = true)]
struct Args {
    /// Which backend to open.
    #[arg(long, value_enum, default_value = "auto")]
    backend: BackendArg,
    /// The chip: the one the emulator plays (with `emulator`, or `auto` without an NPU;
    /// default rk3588), or the one to assume on the NPU instead of reading the device tree
    /// (with `npu`). One of rk3588, rk3576, rk3562, rk3566, rk3568.
    #[arg(long)]
    platform: Option<Platform>,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
    /// Print this tool's version and the runtime's and driver's versions, then exit.
    #[arg(short = 'V', long)]
    version: bool,
    /// Print which host kernels each component of the SDK uses (the emulator's matmul kernels,
    /// the engine's glue), and why, then exit. The LLM's host kernels are reported by
    /// `llm-decode --kernels`.
    #[arg(long)]
    kernels: bool,
}

/// The kernel choice of every component of the SDK ([`rknn_chip::kernel`]). The LLM library
/// (`rknn-llm`) is an application on the SDK, not a part of it: `llm-decode --kernels`
/// reports its host kernels.
fn kernel_choices() -> [&'static rknn_chip::KernelChoice; 2] {
    [
        rknn_matmul::rknn_emu::kernels::kernel_choice(),
        rknn_matmul::engine::glue::kernel_choice(),
    ]
}

/// Where the components this tool does not report are reported.
const ELSEWHERE: &str = "The LLM's host kernels (RKNN_KERNEL_LLM): llm-decode --kernels";

fn kernels_json() -> serde_json::Value {
    kernel_choices()
        .iter()
        .map(|c| {
            serde_json::json!({
                "component": c.component,
                "selected": c.selected,
                "available": c.available,
                "compiled": c.compiled,
                "set_by": c.set_by.as_ref().map(|(var, value)| format!("{var}={value}")),
                "ignored": c.ignored,
            })
        })
        .collect()
}

fn kernels_text() -> String {
    let mut s = String::from(
        "Host kernels (RKNN_KERNEL for every component, RKNN_KERNEL_<COMPONENT> for one):\n",
    );
    for c in kernel_choices() {
        let _ = writeln!(s, "  {c}");
    }
    let _ = writeln!(s, "{ELSEWHERE}");
    s
}

fn open(args: &Args) -> Result<(Runtime, std::path::PathBuf), rknn_matmul::Error> {
    // The in-process emulator reads every `RKNN_EMU_*` variable, its log `RKNN_EMU_LOG` (see
    // `main`), as the drop-in does.
    let mut opts = RuntimeOptions::default();
    let backend = match (args.backend, args.platform) {
        (BackendArg::Auto, p) => {
            if let Some(p) = p {
                opts.emulator.platform = p;
            }
            Backend::Auto
        }
        (BackendArg::Npu, p) => {
            opts.npu_platform = p;
            Backend::Npu
        }
        (BackendArg::Emulator, p) => Backend::Emulator(p.unwrap_or(Platform::Rk3588)),
    };
    let lock_path = opts.lock_path.clone();
    Ok((Runtime::open(backend, opts)?, lock_path))
}

fn main() -> ExitCode {
    let args = Args::parse();
    if args.kernels && !args.json {
        print_out(&kernels_text());
        return ExitCode::SUCCESS;
    }
    // Probing the capability table asks the runtime for every matmul type, and an emulator
    // logs each one it refuses as an error line: these are answers, not errors, so its log is
    // off unless the user asked for it (`RKNN_EMU_LOG`).
    let quiet = std::env::var_os("RKNN_EMU_LOG").is_none();
    if quiet {
        // SAFETY: no other thread exists yet (nothing has been spawned), so nothing reads the
        // environment concurrently; a drop-in library loaded later reads it once.
        unsafe { std::env::set_var("RKNN_EMU_LOG", "0") };
    }
    let (rt, lock_path) = match open(&args) {
        Ok(r) => r,
        Err(e) if args.version => {
            print_out(&format!(
                "rknn-info {}\nruntime: unavailable ({e})\n",
                env!("CARGO_PKG_VERSION")
            ));
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("rknn-info: {e}");
            return ExitCode::FAILURE;
        }
    };
    if args.version {
        let versions = match rt.versions() {
            Some(v) => format!("runtime {}\ndriver {}", v.runtime, v.driver),
            None => "runtime and driver versions not reported".to_string(),
        };
        print_out(&format!(
            "rknn-info {} ({} backend, {})\n{versions}\n",
            env!("CARGO_PKG_VERSION"),
            rt.backend_name(),
            rt.platform()
        ));
        return ExitCode::SUCCESS;
    }
    // On stderr, so also before a JSON report: the runtime's lines go there in both cases.
    if rt.is_hardware() {
        eprintln!(
            "rknn-info: probing the matmul types; the runtime logs each one it rejects (E RKNN lines): those are expected"
        );
    }
    let caps = rt.capabilities();
    let fd = rt.fd_limit();
    let lock_holder = match rt.npu_lock() {
        Some(_) => Some(std::process::id()),
        None => NpuLock::holder(&lock_path),
    };
    if args.json {
        let dtypes: Vec<serde_json::Value> = caps
            .iter()
            .map(|c| {
                serde_json::json!({
                    "type": c.matmul_type.raw(),
                    "name": c.matmul_type.c_name(),
                    "scheme": c.scheme.to_string(),
                    "supported": c.supported,
                    "reason": c.reason,
                })
            })
            .collect();
        let v = serde_json::json!({
            "backend": rt.backend_name(),
            "hardware": rt.is_hardware(),
            "selection_reason": rt.selection_reason(),
            "platform": rt.platform().name(),
            "runtime_version": rt.versions().map(|v| v.runtime.clone()),
            "driver_version": rt.versions().map(|v| v.driver.clone()),
            "npu_cores": rt.npu_cores(),
            "fd_limit": fd.map(|l| serde_json::json!({"soft": l.soft, "hard": l.hard, "soft_before": l.soft_before})),
            "handle_budget": rt.handle_budget().budget(),
            "npu_lock": {"path": lock_path.display().to_string(), "holder_pid": lock_holder},
            "dtypes": dtypes,
            "kernels": kernels_json(),
        });
        print_out(&format!("{v}\n"));
        return ExitCode::SUCCESS;
    }
    let mut s = String::new();
    // Writing into a String cannot fail.
    let _ = writeln!(
        s,
        "Backend           {} ({})",
        rt.backend_name(),
        rt.selection_reason()
    );
    let _ = writeln!(s, "Platform          {}", rt.platform());
    let _ = writeln!(s, "NPU cores         {}", rt.npu_cores());
    let _ = match rt.versions() {
        Some(v) => writeln!(
            s,
            "Runtime version   {}\nDriver version    {}",
            v.runtime, v.driver
        ),
        None => writeln!(s, "Versions          not reported"),
    };
    let _ = match fd {
        Some(l) => writeln!(
            s,
            "fd limit          soft {} (was {}), hard {}",
            l.soft, l.soft_before, l.hard
        ),
        None => writeln!(s, "fd limit          not checked"),
    };
    let _ = writeln!(
        s,
        "Handle budget     {} NPU memories",
        rt.handle_budget().budget()
    );
    let _ = match lock_holder {
        Some(pid) => writeln!(
            s,
            "NPU lock          {} held by pid {pid}",
            lock_path.display()
        ),
        None => writeln!(s, "NPU lock          {} free", lock_path.display()),
    };
    let _ = writeln!(s, "\nMatmul types:");
    for c in &caps {
        let mark = if c.supported { "yes" } else { "no " };
        let _ = writeln!(
            s,
            "  {:>2} {:<36} {:<6} {mark} {}",
            c.matmul_type.raw(),
            c.matmul_type.c_name(),
            c.scheme.to_string(),
            c.reason.as_deref().unwrap_or("")
        );
    }
    let _ = write!(s, "\n{}", kernels_text());
    print_out(&s);
    ExitCode::SUCCESS
}
