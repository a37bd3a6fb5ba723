//! `rknn-info`: what this machine's NPU (or the emulator) is and can do, like `clinfo`.

use std::process::ExitCode;

use clap::{Parser, ValueEnum};
use rknn_matmul::guard::NpuLock;
use rknn_matmul::{Backend, Platform, Runtime, RuntimeOptions};

#[derive(Clone, Copy, Debug, ValueEnum)]
enum BackendArg {
    Auto,
    Npu,
    Emulator,
}

/// Reports the backend, chip, NPU cores, runtime and driver versions, file-descriptor limits,
/// NPU lock state and the matmul capability table.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Args {
    /// Which backend to open.
    #[arg(long, value_enum, default_value = "auto")]
    backend: BackendArg,
    /// The chip the emulator plays (rk3588, rk3576, rk3562, rk3566, rk3568).
    #[arg(long, default_value = "rk3588")]
    platform: Platform,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let backend = match args.backend {
        BackendArg::Auto => Backend::Auto,
        BackendArg::Npu => Backend::Npu,
        BackendArg::Emulator => Backend::Emulator(args.platform),
    };
    let opts = RuntimeOptions::default();
    let lock_path = opts.lock_path.clone();
    let rt = match Runtime::open(backend, opts) {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("rknn-info: {e}");
            return ExitCode::FAILURE;
        }
    };
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
            "selection_reason": rt.selection_reason(),
            "platform": rt.platform().name(),
            "runtime_version": rt.versions().map(|v| v.runtime.clone()),
            "driver_version": rt.versions().map(|v| v.driver.clone()),
            "npu_cores": rt.npu_cores(),
            "fd_limit": fd.map(|l| serde_json::json!({"soft": l.soft, "hard": l.hard, "soft_before": l.soft_before})),
            "handle_budget": rt.handle_budget().budget(),
            "npu_lock": {"path": lock_path.display().to_string(), "holder_pid": lock_holder},
            "dtypes": dtypes,
        });
        println!("{v}");
        return ExitCode::SUCCESS;
    }
    println!(
        "Backend           {} ({})",
        rt.backend_name(),
        rt.selection_reason()
    );
    println!("Platform          {}", rt.platform());
    println!("NPU cores         {}", rt.npu_cores());
    match rt.versions() {
        Some(v) => println!(
            "Runtime version   {}\nDriver version    {}",
            v.runtime, v.driver
        ),
        None => println!("Versions          not reported"),
    }
    match fd {
        Some(l) => println!(
            "fd limit          soft {} (was {}), hard {}",
            l.soft, l.soft_before, l.hard
        ),
        None => println!("fd limit          not checked"),
    }
    println!(
        "Handle budget     {} NPU memories",
        rt.handle_budget().budget()
    );
    match lock_holder {
        Some(pid) => println!(
            "NPU lock          {} held by pid {pid}",
            lock_path.display()
        ),
        None => println!("NPU lock          {} free", lock_path.display()),
    }
    println!("\nMatmul types:");
    for c in &caps {
        let mark = if c.supported { "yes" } else { "no " };
        println!(
            "  {:>2} {:<36} {:<6} {mark} {}",
            c.matmul_type.raw(),
            c.matmul_type.c_name(),
            c.scheme.to_string(),
            c.reason.as_deref().unwrap_or("")
        );
    }
    ExitCode::SUCCESS
}
