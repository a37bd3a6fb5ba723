//! Where the safe-layer and engine suites get their runtime: one place, so that the same test
//! bodies run on every backend.
//!
//! `RKNN_TEST_BACKEND` selects it:
//! * `emulator` (the default when the `emulator` feature is on): the built-in emulator with
//!   non-coherent cache emulation, so a missing sync fails the tests;
//! * `dropin` (the default without the feature): the real-NPU code path (`Backend::Npu`,
//!   `dlopen`) on the emulator's drop-in `librknnrt.so`, which cargo builds next to the tests
//!   (chip from `RKNN_EMU_PLATFORM`, default rk3588);
//! * `npu`: the board's `librknnrt.so` (or `RKNN_RUNTIME_PATH`).
//!
//! The runtime is opened once per test binary and shared: on the NPU path it holds the
//! process's NPU lock, and contexts of one runtime may live on many threads.
#![allow(dead_code)] // Each test binary uses its own part of this module.

use std::path::PathBuf;
use std::sync::OnceLock;

use rknn_matmul::{Backend, Platform, Runtime, RuntimeOptions};

/// The backend under test.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TestBackend {
    /// The built-in emulator.
    Emulator,
    /// The NPU code path on the drop-in library.
    Dropin,
    /// A real board.
    Npu,
}

pub fn backend() -> TestBackend {
    match std::env::var("RKNN_TEST_BACKEND").as_deref() {
        Ok("npu") => TestBackend::Npu,
        Ok("dropin") => TestBackend::Dropin,
        Ok("emulator") if cfg!(feature = "emulator") => TestBackend::Emulator,
        Ok("emulator") => panic!("RKNN_TEST_BACKEND=emulator needs the `emulator` feature"),
        Ok(other) => panic!("RKNN_TEST_BACKEND={other:?}: use emulator, dropin or npu"),
        Err(_) if cfg!(feature = "emulator") => TestBackend::Emulator,
        Err(_) => TestBackend::Dropin,
    }
}

/// `librknnrt.so` that cargo built for these tests (a dev-dependency), next to the binary.
pub fn dropin_library() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    let so = exe.parent().expect("deps directory").join("librknnrt.so");
    assert!(so.exists(), "{} was not built", so.display());
    so
}

/// The chip the drop-in library plays.
pub fn dropin_platform() -> Platform {
    std::env::var("RKNN_EMU_PLATFORM")
        .ok()
        .and_then(|p| p.parse().ok())
        .unwrap_or(Platform::Rk3588)
}

/// Options for the NPU code path on the drop-in library.
pub fn dropin_options() -> RuntimeOptions {
    RuntimeOptions {
        runtime_path: Some(dropin_library()),
        npu_platform: Some(dropin_platform()),
        lock_path: std::env::temp_dir().join(format!("rknn-test-{}.lock", std::process::id())),
        ..RuntimeOptions::default()
    }
}

/// The backend and options of the selected test backend.
pub fn options() -> (Backend, RuntimeOptions) {
    match backend() {
        #[cfg(feature = "emulator")]
        TestBackend::Emulator => {
            let mut opts = RuntimeOptions::default();
            opts.emulator.strict_cache = true;
            (Backend::Emulator(Platform::Rk3588), opts)
        }
        #[cfg(not(feature = "emulator"))]
        TestBackend::Emulator => unreachable!("checked in backend()"),
        TestBackend::Dropin => {
            // The drop-in reads its configuration when it is loaded; strict caches prove the
            // safe layer syncs. Only Rust code reads the environment in this process, and std
            // serialises that, so setting it before the first load is sound.
            static STRICT: OnceLock<()> = OnceLock::new();
            STRICT.get_or_init(|| {
                if std::env::var_os("RKNN_EMU_STRICT_CACHE").is_none() {
                    // SAFETY: see above.
                    unsafe { std::env::set_var("RKNN_EMU_STRICT_CACHE", "1") };
                }
            });
            (Backend::Npu, dropin_options())
        }
        TestBackend::Npu => (Backend::Npu, RuntimeOptions::default()),
    }
}

/// A private runtime of the selected backend with changed options (it shares the process's
/// NPU lock with the others).
pub fn runtime_with(change: impl FnOnce(&mut RuntimeOptions)) -> Runtime {
    let (backend, mut opts) = options();
    change(&mut opts);
    Runtime::open(backend.clone(), opts)
        .unwrap_or_else(|e| panic!("open the {backend:?} test backend: {e}"))
}

/// The runtime every backend-agnostic test uses.
pub fn runtime() -> Runtime {
    static RT: OnceLock<Runtime> = OnceLock::new();
    RT.get_or_init(|| runtime_with(|_| {})).clone()
}

/// A runtime playing `platform`, where the backend can (the emulator plays any chip; the
/// drop-in and a board only their own). `None` means: skip, with the reason printed.
pub fn runtime_for(platform: Platform) -> Option<Runtime> {
    let rt = runtime();
    if rt.platform() == platform {
        return Some(rt);
    }
    #[cfg(feature = "emulator")]
    if backend() == TestBackend::Emulator {
        let mut opts = RuntimeOptions::default();
        opts.emulator.strict_cache = true;
        return Some(Runtime::open(Backend::Emulator(platform), opts).expect("open the emulator"));
    }
    eprintln!(
        "skipped for {platform}: the {:?} backend is a {}",
        backend(),
        rt.platform()
    );
    None
}

/// C = A × B for i8 in normal layouts, exactly, in i64 (a reference that cannot wrap).
pub fn naive_i8(a: &[i8], b: &[i8], m: usize, k: usize, n: usize) -> Vec<i64> {
    let mut c = vec![0i64; m * n];
    for i in 0..m {
        for j in 0..n {
            c[i * n + j] = (0..k)
                .map(|x| i64::from(a[i * k + x]) * i64::from(b[x * n + j]))
                .sum();
        }
    }
    c
}

/// Symmetric per-row quantisation, written from the engine's documented formula:
/// scale = amax / 127, q = clamp(round_ties_even(x * (127 / amax)), -127, 127).
pub fn quantize(row: &[f32]) -> (Vec<i32>, f32) {
    let amax = row.iter().fold(0f32, |a, &x| a.max(x.abs()));
    if amax == 0.0 {
        return (vec![0; row.len()], 0.0);
    }
    let inv = 127.0f32 / amax;
    (
        row.iter()
            .map(|&x| (x * inv).round_ties_even().clamp(-127.0, 127.0) as i32)
            .collect(),
        amax / 127.0,
    )
}

/// The engine's documented W8A8 result for `x` ([m, k]) against `w` ([n, k]): per-row
/// symmetric int8 of x and of each weight row ([`quantize`]; NaN becomes 0), exact sums in the
/// NPU's i32, then `(acc · row scale) · channel scale`.
pub fn reference_w8a8(x: &[f32], w: &[f32], m: usize, k: usize, n: usize) -> Vec<f32> {
    let wq: Vec<(Vec<i32>, f32)> = w.chunks_exact(k).map(quantize).collect();
    let mut out = vec![0f32; m * n];
    for r in 0..m {
        let (xq, xs) = quantize(&x[r * k..(r + 1) * k]);
        for (j, (wj, ws)) in wq.iter().enumerate() {
            let acc: i64 = xq.iter().zip(wj).map(|(&a, &b)| i64::from(a * b)).sum();
            out[r * n + j] = (acc as i32 as f32 * xs) * ws;
        }
    }
    out
}
