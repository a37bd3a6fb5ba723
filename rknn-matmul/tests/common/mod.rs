//! Where the safe-layer and engine suites get their runtimes: one place, so that one test body
//! runs on every backend in the same `cargo test` run.
//!
//! # One body, three backends
//!
//! [`backend_test!`] turns a test body, a function taking the runtime, into a module of three
//! tests of the same name:
//!
//! ```ignore
//! common::backend_test!(#[cfg_attr(miri, ignore = "…")] matmul_works);
//! /// A doc comment, if any, goes on the body.
//! fn matmul_works(rt: &Runtime) {
//!     let mm = rt.matmul::<I8xI8ToI32>(1, 32, 32).build().unwrap();
//!     // …
//! }
//! ```
//!
//! expands to `mod matmul_works { #[test] fn emulator() { … } #[test] fn dropin() { … }
//! #[test] fn npu() { … } }` (the attributes on each), every test calling the body with its
//! backend's shared runtime, or printing one line saying why it skips and passing. (The body
//! stays outside the macro so that rustfmt formats it: it leaves a macro's braces alone.)
//!
//! * `emulator`: the built-in emulator (RK3588) in its default configuration, whatever
//!   `RKNN_EMU_*` variables the test process inherits (`RuntimeOptions::default()` would read
//!   them), with non-coherent cache emulation, so a missing sync fails the tests. Skips when the
//!   crate is built without the `emulator` feature.
//! * `dropin`: the real-NPU code path (`Backend::Npu`, `dlopen`) on the emulator's drop-in
//!   `librknnrt.so`, which cargo builds next to the tests as a dev-dependency (chip from
//!   `RKNN_EMU_PLATFORM`, default rk3588; strict caches through `RKNN_EMU_STRICT_CACHE`, set
//!   before the library is first loaded, since the library reads its configuration then, for
//!   the whole process). Skips under Miri (no `dlopen`) and where the library was not built.
//! * `npu`: the board's `librknnrt.so` (or `RKNN_RUNTIME_PATH`). Runs only with
//!   `RKNN_TEST_BACKEND=npu`: a board run is `RKNN_TEST_BACKEND=npu cargo test -p rknn-matmul`.
//!
//! `RKNN_TEST_BACKEND` (`emulator`, `dropin` or `npu`), when set, runs only that backend's
//! variants; the others skip. A backend it names that cannot run here fails its variants
//! instead of skipping them, so that such a run cannot pass without testing anything.
//!
//! Each backend's runtime is opened once per test binary ([`runtime`]) and shared: on the NPU
//! path it holds the process's NPU lock, and contexts of one runtime may live on many threads.
//! A body that needs a runtime of its own, or other options, opens one of the same backend
//! with [`runtime_with`]`(rt, …)`; one for another chip with [`runtime_for`]`(rt, platform)`.
//! Tests about one backend only call [`runtime`]`(TestBackend::…)` themselves.
#![allow(dead_code)] // Each test binary uses its own part of this module.

use std::path::PathBuf;
use std::sync::OnceLock;

use rknn_matmul::{Backend, Platform, Runtime, RuntimeOptions};

/// One test body per backend: `backend_test!(#[attribute] name, other_name)` makes, for each
/// function `name(rt: &Runtime)` of the file, the tests `name::emulator`, `name::dropin` and
/// `name::npu` (see the module documentation).
#[allow(unused_macros)] // Not every test binary has backend tests.
macro_rules! backend_test {
    ($($(#[$attr:meta])* $name:ident),+ $(,)?) => {$(
        mod $name {
            #[test]
            $(#[$attr])*
            fn emulator() {
                $crate::common::run(super::$name, $crate::common::TestBackend::Emulator);
            }

            #[test]
            $(#[$attr])*
            fn dropin() {
                $crate::common::run(super::$name, $crate::common::TestBackend::Dropin);
            }

            #[test]
            $(#[$attr])*
            fn npu() {
                $crate::common::run(super::$name, $crate::common::TestBackend::Npu);
            }
        }
    )+};
}
#[allow(unused_imports)]
pub(crate) use backend_test;

/// A backend the tests run on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TestBackend {
    /// The built-in emulator.
    Emulator,
    /// The NPU code path on the drop-in library.
    Dropin,
    /// A real board.
    Npu,
}

impl TestBackend {
    /// Every backend, in the order of a test module's variants.
    pub const ALL: [TestBackend; 3] =
        [TestBackend::Emulator, TestBackend::Dropin, TestBackend::Npu];

    /// Its name in `RKNN_TEST_BACKEND` and as a test variant.
    pub fn name(self) -> &'static str {
        match self {
            TestBackend::Emulator => "emulator",
            TestBackend::Dropin => "dropin",
            TestBackend::Npu => "npu",
        }
    }

    /// The backend a runtime of these tests is on.
    pub fn of(rt: &Runtime) -> TestBackend {
        if rt.is_emulator() {
            TestBackend::Emulator
        } else if selected() == Some(TestBackend::Npu) {
            // The drop-in and a board never run in one process (see `skip_reason`).
            TestBackend::Npu
        } else {
            TestBackend::Dropin
        }
    }
}

impl std::fmt::Display for TestBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The backend `RKNN_TEST_BACKEND` selects, if it is set.
pub fn selected() -> Option<TestBackend> {
    match std::env::var("RKNN_TEST_BACKEND").as_deref() {
        Err(_) | Ok("") => None,
        Ok("emulator") => Some(TestBackend::Emulator),
        Ok("dropin") => Some(TestBackend::Dropin),
        Ok("npu") => Some(TestBackend::Npu),
        Ok(other) => panic!("RKNN_TEST_BACKEND={other:?}: use emulator, dropin or npu"),
    }
}

/// Why `backend` does not run in this process, if it does not. Panics when `RKNN_TEST_BACKEND`
/// selects a backend that cannot run.
pub fn skip_reason(backend: TestBackend) -> Option<String> {
    let selected = selected();
    if let Some(s) = selected {
        if s != backend {
            return Some(format!("RKNN_TEST_BACKEND={s} selects another backend"));
        }
    }
    let reason = match backend {
        TestBackend::Emulator if !cfg!(feature = "emulator") => {
            Some("built without the `emulator` feature".to_string())
        }
        TestBackend::Emulator => None,
        // Checked first: under Miri's isolation even the library's path cannot be read.
        TestBackend::Dropin if cfg!(miri) => Some("no dlopen under Miri".to_string()),
        TestBackend::Dropin => match dropin_library() {
            Some(_) => None,
            None => Some(format!("{} was not built", dropin_library_path().display())),
        },
        TestBackend::Npu if selected.is_none() => {
            Some("a board's runtime: run with RKNN_TEST_BACKEND=npu".to_string())
        }
        TestBackend::Npu => None,
    };
    if let (Some(r), Some(_)) = (&reason, selected) {
        panic!("RKNN_TEST_BACKEND={backend} cannot run here: {r}");
    }
    reason
}

/// `body` on `backend`'s shared runtime, or a line saying why the backend is skipped (what each
/// variant of [`backend_test!`] does).
pub fn run(body: fn(&Runtime), backend: TestBackend) {
    if let Some(rt) = runtime(backend) {
        body(&rt);
    }
}

/// The runtime shared by the tests of `backend`, opened on first use; `None`, with the reason
/// printed, where the backend does not run.
pub fn runtime(backend: TestBackend) -> Option<Runtime> {
    if let Some(reason) = skip_reason(backend) {
        eprintln!("skipped on {backend}: {reason}");
        return None;
    }
    static SHARED: [OnceLock<Runtime>; 3] = [OnceLock::new(), OnceLock::new(), OnceLock::new()];
    let i = TestBackend::ALL.iter().position(|&b| b == backend).unwrap();
    Some(SHARED[i].get_or_init(|| open(backend, |_| {})).clone())
}

/// Opens the shared runtime of every backend that runs here. For tests that count the
/// process's file descriptors: opening one (the drop-in's `dlopen`, its NPU lock) changes the
/// count, and another test's variant may do it at any time before.
pub fn open_shared_runtimes() {
    for b in TestBackend::ALL {
        if skip_reason(b).is_none() {
            runtime(b);
        }
    }
}

/// `librknnrt.so` where cargo builds it for these tests (a dev-dependency): next to the binary.
pub fn dropin_library_path() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    exe.parent().expect("deps directory").join("librknnrt.so")
}

/// The drop-in library, when it was built.
pub fn dropin_library() -> Option<PathBuf> {
    Some(dropin_library_path()).filter(|so| so.exists())
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
        runtime_path: Some(dropin_library().expect("the drop-in library was built")),
        npu_platform: Some(dropin_platform()),
        lock_path: std::env::temp_dir().join(format!("rknn-test-{}.lock", std::process::id())),
        ..RuntimeOptions::default()
    }
}

/// The backend and options a runtime of `backend` is opened with.
pub fn options_for(backend: TestBackend) -> (Backend, RuntimeOptions) {
    match backend {
        #[cfg(feature = "emulator")]
        TestBackend::Emulator => {
            let opts = RuntimeOptions {
                emulator: rknn_matmul::EmuConfig {
                    strict_cache: true,
                    ..rknn_matmul::EmuConfig::default()
                },
                ..RuntimeOptions::default()
            };
            (Backend::Emulator(Platform::Rk3588), opts)
        }
        #[cfg(not(feature = "emulator"))]
        TestBackend::Emulator => unreachable!("skipped without the `emulator` feature"),
        TestBackend::Dropin => {
            // The drop-in reads its configuration when it is loaded; strict caches prove the
            // safe layer syncs. Only Rust code reads the environment in this process, the
            // test binary's through its std (which serialises that) and the drop-in's only
            // once loaded, which happens after this, so setting it before the first load is
            // sound.
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

/// The backend and options of the runtime `rt` of these tests was opened with.
pub fn options(rt: &Runtime) -> (Backend, RuntimeOptions) {
    options_for(TestBackend::of(rt))
}

fn open(backend: TestBackend, change: impl FnOnce(&mut RuntimeOptions)) -> Runtime {
    let (b, mut opts) = options_for(backend);
    change(&mut opts);
    Runtime::open(b, opts).unwrap_or_else(|e| panic!("open the {backend} test backend: {e}"))
}

/// A private runtime of `rt`'s backend with changed options (it shares the process's NPU lock
/// with the others). Options of the drop-in library itself are the process's environment,
/// read once at load: they cannot change here.
pub fn runtime_with(rt: &Runtime, change: impl FnOnce(&mut RuntimeOptions)) -> Runtime {
    open(TestBackend::of(rt), change)
}

/// A runtime of `rt`'s backend playing `platform`, where the backend can (the emulator plays
/// any chip; the drop-in and a board only their own). `None` means: skip, with the reason
/// printed.
pub fn runtime_for(rt: &Runtime, platform: Platform) -> Option<Runtime> {
    if rt.platform() == platform {
        return Some(rt.clone());
    }
    let backend = TestBackend::of(rt);
    #[cfg(feature = "emulator")]
    if backend == TestBackend::Emulator {
        let (_, opts) = options_for(backend);
        return Some(Runtime::open(Backend::Emulator(platform), opts).expect("open the emulator"));
    }
    eprintln!(
        "skipped for {platform}: the {backend} backend is a {}",
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

/// Runs `cmd`, a child of this test binary running one test (`--exact NAME`), and returns its
/// output; `None`, with the reason printed, when the child cannot run here (ENOEXEC: an aarch64
/// test binary under qemu-user without binfmt, or a child that never reached the test harness,
/// such as qemu-user starting an emulated binary without its sysroot).
pub fn run_child_test(cmd: &mut std::process::Command) -> Option<std::process::Output> {
    const ENOEXEC: i32 = 8;
    let out = match cmd.output() {
        Ok(out) => out,
        Err(e) if e.raw_os_error() == Some(ENOEXEC) => {
            eprintln!("skipped: cannot start a child process here ({e})");
            return None;
        }
        Err(e) => panic!("spawn the child: {e}"),
    };
    if !String::from_utf8_lossy(&out.stdout).contains("running 1 test") {
        eprintln!(
            "skipped: the child process did not start ({})",
            String::from_utf8_lossy(&out.stderr).trim()
        );
        return None;
    }
    Some(out)
}
