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

/// Compiles `tests/c/matmul_check.c` against our clean-room header, links it to the drop-in
/// library and runs it. Needs a native C compiler, so it runs only on x86_64 hosts (under qemu
/// the test binary cannot run the host's compiler's output).
#[test]
#[cfg_attr(not(target_arch = "x86_64"), ignore = "needs a native C toolchain")]
fn an_unmodified_c_program_runs_against_the_dropin_library() {
    let so = dropin_path();
    let lib_dir = so.parent().unwrap();
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let out = std::env::temp_dir().join(format!("rknn_matmul_check_{}", std::process::id()));
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let build = Command::new(&cc)
        .arg("-O1")
        .arg("-Wall")
        .arg("-Werror")
        .arg("-I")
        .arg(manifest.join("../rknn-sys/include"))
        .arg(manifest.join("tests/c/matmul_check.c"))
        .arg("-L")
        .arg(lib_dir)
        .arg("-lrknnrt")
        .arg("-o")
        .arg(&out)
        .output()
        .expect("run the C compiler");
    assert!(
        build.status.success(),
        "cc failed: {}",
        String::from_utf8_lossy(&build.stderr)
    );
    let run = Command::new(&out)
        .env("LD_LIBRARY_PATH", lib_dir)
        .env("RKNN_EMU_PLATFORM", "rk3588")
        .output()
        .unwrap();
    let _ = std::fs::remove_file(&out);
    assert!(
        run.status.success(),
        "C program failed: {}{}",
        String::from_utf8_lossy(&run.stdout),
        String::from_utf8_lossy(&run.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&run.stdout).trim(), "ok");
}
