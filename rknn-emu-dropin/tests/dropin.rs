//! The drop-in library, used the two ways users will: loaded by `rknn-sys`'s loader from
//! Rust, and linked by an unmodified C program.

use std::path::PathBuf;
use std::process::Command;

use rknn_sys::*;

/// The drop-in library cargo built for this test run: the lib target is a cdylib and an rlib,
/// and building it for the tests writes `deps/librknnrt.so` next to this test's binary.
fn dropin_path() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let deps = exe.parent().unwrap();
    [
        deps.join("librknnrt.so"),
        deps.parent().unwrap().join("librknnrt.so"),
    ]
    .into_iter()
    .find(|p| p.exists())
    .unwrap_or_else(|| panic!("librknnrt.so was not built next to {}", deps.display()))
}

#[test]
fn the_loader_opens_the_dropin_library_and_runs_a_matmul() {
    // SAFETY: the file is this workspace's emulator library.
    let api = unsafe { RknnApi::load_from(dropin_path()) }.expect("load librknnrt.so");
    assert!(matches!(api.origin(), ApiOrigin::Loaded(_)));
    assert!(
        api.missing_optional().is_empty(),
        "the emulator exports every function"
    );
    let last_error = api
        .rknn_emu_last_error
        .expect("the loader resolves the emulator's extension");

    let (m, k, n) = (2usize, 64usize, 32usize);
    let mut info = rknn_matmul_info {
        M: m as i32,
        K: k as i32,
        N: n as i32,
        type_: RKNN_INT8_MM_INT8_TO_INT32,
        ..Default::default()
    };
    let mut io = rknn_matmul_io_attr::default();
    let mut ctx: rknn_matmul_ctx = 0;
    let mut rng = fastrand::Rng::with_seed(7);
    let a: Vec<i8> = (0..m * k).map(|_| rng.i8(..)).collect();
    let b: Vec<i8> = (0..k * n).map(|_| rng.i8(..)).collect();
    // SAFETY: every pointer is valid for its call; memories are written within their sizes and
    // destroyed before the context.
    unsafe {
        assert_eq!((api.rknn_matmul_create)(&mut ctx, &mut info, &mut io), 0);
        let mems = [io.A.size, io.B.size, io.C.size].map(|s| (api.rknn_create_mem)(ctx, s));
        assert!(mems.iter().all(|p| !p.is_null()));
        std::ptr::copy_nonoverlapping(a.as_ptr(), (*mems[0]).virt_addr.cast(), a.len());
        std::ptr::copy_nonoverlapping(b.as_ptr(), (*mems[1]).virt_addr.cast(), b.len());
        for (mem, attr) in mems.iter().zip([&mut io.A, &mut io.B, &mut io.C]) {
            assert_eq!((api.rknn_matmul_set_io_mem)(ctx, *mem, attr), 0);
        }
        assert_eq!((api.rknn_matmul_run)(ctx), 0);
        let c = std::slice::from_raw_parts((*mems[2]).virt_addr as *const i32, m * n);
        for i in 0..m {
            for j in 0..n {
                let want: i32 = (0..k)
                    .map(|x| i32::from(a[i * k + x]) * i32::from(b[x * n + j]))
                    .sum();
                assert_eq!(c[i * n + j], want, "C[{i},{j}]");
            }
        }
        for mem in mems {
            assert_eq!((api.rknn_destroy_mem)(ctx, mem), 0);
        }
        assert_eq!((api.rknn_matmul_destroy)(ctx), 0);
        // The library's own error message, through the table (the library has its own copy of
        // the emulator, so only the table can reach its messages).
        assert_eq!((api.rknn_matmul_run)(ctx), RKNN_ERR_CTX_INVALID);
        let msg = std::ffi::CStr::from_ptr(last_error()).to_string_lossy();
        assert!(msg.contains("is not a live matmul context"), "{msg}");
    }
}

#[test]
fn rknn_runtime_path_selects_the_library() {
    // Run in a child process: the environment is process-wide.
    if std::env::var_os("DROPIN_CHILD").is_some() {
        // SAFETY: RKNN_RUNTIME_PATH names this workspace's emulator library.
        let api = unsafe { RknnApi::load() }.expect("load via RKNN_RUNTIME_PATH");
        assert_eq!(api.origin(), &ApiOrigin::Loaded(dropin_path()));
        return;
    }
    let status = match Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "rknn_runtime_path_selects_the_library",
            "--nocapture",
        ])
        .env("DROPIN_CHILD", "1")
        .env(RKNN_RUNTIME_PATH_ENV, dropin_path())
        .output()
    {
        Ok(out) => out,
        // qemu-user without binfmt cannot exec a child of the emulated architecture (ENOEXEC).
        Err(e) if e.raw_os_error() == Some(8) => {
            eprintln!("skipped: cannot start a child process here ({e})");
            return;
        }
        Err(e) => panic!("spawn the child: {e}"),
    };
    let stdout = String::from_utf8_lossy(&status.stdout);
    if !stdout.contains("running 1 test") {
        // The child never reached the test harness: under qemu-user the kernel may start the
        // emulated binary without its sysroot. Nothing about the loader was tested then.
        eprintln!(
            "skipped: the child process did not start ({})",
            String::from_utf8_lossy(&status.stderr).trim()
        );
        return;
    }
    assert!(status.status.success(), "{stdout}");
}

/// Compiles the C file `src` (relative to this crate) against our clean-room header and links
/// it to the drop-in library; returns the executable and the library's directory.
fn compile_c(src: &str) -> (PathBuf, PathBuf) {
    let so = dropin_path();
    let lib_dir = so.parent().unwrap().to_path_buf();
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let stem = std::path::Path::new(src)
        .file_stem()
        .unwrap()
        .to_string_lossy();
    let out = std::env::temp_dir().join(format!("rknn_{stem}_{}", std::process::id()));
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let build = Command::new(&cc)
        .args(["-std=c11", "-O1", "-Wall", "-Wextra", "-Werror"])
        .arg("-I")
        .arg(manifest.join("../rknn-sys/include"))
        .arg(manifest.join(src))
        .arg("-L")
        .arg(&lib_dir)
        .arg("-lrknnrt")
        .arg("-lm")
        .arg("-o")
        .arg(&out)
        .output()
        .expect("run the C compiler");
    assert!(
        build.status.success(),
        "cc {src} failed: {}",
        String::from_utf8_lossy(&build.stderr)
    );
    (out, lib_dir)
}

/// Runs a compiled C program against the drop-in library with `env`, then deletes it.
fn run_c(exe: &PathBuf, lib_dir: &PathBuf, env: &[(&str, &str)]) -> std::process::Output {
    let mut cmd = Command::new(exe);
    cmd.env("LD_LIBRARY_PATH", lib_dir)
        .env("RKNN_EMU_PLATFORM", "rk3588")
        .env_remove("RKNN_EMU_LOG")
        .env_remove("RKNN_EMU_STRICT_CACHE")
        .env_remove("RKNN_INT4_B_CONVERTER_INPUT");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Compiles `tests/c/matmul_check.c` against our clean-room header, links it to the drop-in
/// library and runs it. Needs a native C compiler, so it runs only on x86_64 hosts (under qemu
/// the test binary cannot run the host's compiler's output).
#[test]
#[cfg_attr(not(target_arch = "x86_64"), ignore = "needs a native C toolchain")]
fn an_unmodified_c_program_runs_against_the_dropin_library() {
    let (exe, lib_dir) = compile_c("tests/c/matmul_check.c");
    let run = run_c(&exe, &lib_dir, &[]);
    // The program provokes errors on purpose: the library explains each on stderr, in the
    // runtime's log format, by default...
    let quiet = run_c(&exe, &lib_dir, &[("RKNN_EMU_LOG", "0")]);
    let _ = std::fs::remove_file(&exe);
    assert!(
        run.status.success(),
        "C program failed: {}{}",
        text(&run.stdout),
        text(&run.stderr)
    );
    assert_eq!(text(&run.stdout).trim(), "ok");
    let log = text(&run.stderr);
    assert!(
        log.contains("E RKNN: rknn_matmul_create: RKNN_FLOAT16_MM_INT4_TO_FLOAT32")
            && log.contains("no weight-only")
            && log.contains("(RKNN_ERR_PARAM_INVALID -5)"),
        "{log}"
    );
    assert!(
        log.contains("E RKNN: rknn_matmul_run: context 0xdead is not a live matmul context"),
        "{log}"
    );
    // ...and RKNN_EMU_LOG=0 silences it without changing the results.
    assert!(quiet.status.success());
    assert_eq!(text(&quiet.stdout).trim(), "ok");
    assert_eq!(text(&quiet.stderr), "", "RKNN_EMU_LOG=0 prints nothing");
}

/// The C example of the repository (`examples/c/matmul_demo.c`: int8, f16 with a converted
/// native B, a dynamic-shape context binding B once, int4 on RK3588), run with strict cache
/// emulation so that a missing sync would change its results. It checks itself against naive
/// loops and prints "ok".
#[test]
#[cfg_attr(not(target_arch = "x86_64"), ignore = "needs a native C toolchain")]
fn the_c_example_runs_with_strict_cache_emulation() {
    let (exe, lib_dir) = compile_c("examples/c/matmul_demo.c");
    let strict = run_c(&exe, &lib_dir, &[("RKNN_EMU_STRICT_CACHE", "1")]);
    // The other int4 reading of the converter makes the int4 check fail: the setting is live.
    let other = run_c(
        &exe,
        &lib_dir,
        &[
            ("RKNN_EMU_STRICT_CACHE", "1"),
            ("RKNN_INT4_B_CONVERTER_INPUT", "one-per-byte"),
        ],
    );
    let _ = std::fs::remove_file(&exe);
    let out = text(&strict.stdout);
    assert!(
        strict.status.success(),
        "the C example failed:\n{out}{}",
        text(&strict.stderr)
    );
    for line in [
        "int8  5x96x64: exact",
        "f16   3x64x48 native B: matches",
        "int8  dynamic M = 1, 4, 16 with B bound once: exact",
        "int4  2x64x64 native B: exact",
    ] {
        assert!(out.contains(line), "missing {line:?} in\n{out}");
    }
    assert_eq!(out.lines().last(), Some("ok"));
    assert!(!other.status.success());
    assert!(
        text(&other.stderr).contains("FAIL: int4"),
        "{}",
        text(&other.stderr)
    );
}
