//! The field-hazard guards (fd limit, NPU lock between processes, mallopt) and the platform
//! detection, one body per test on every backend (`common::backend_test!`).

mod common;

use common::{TestBackend, backend_test};
use rknn_matmul::guard::NpuLock;
use rknn_matmul::*;

backend_test!(
    #[cfg_attr(miri, ignore = "libc calls: not under Miri's isolation")]
    the_fd_limit_is_raised_toward_the_hard_limit
);
fn the_fd_limit_is_raised_toward_the_hard_limit(rt: &Runtime) {
    let l = rt.fd_limit().expect("raised by default");
    assert!(l.soft >= l.soft_before);
    assert!(l.soft == l.hard.min(1 << 20), "{l:?}");
}

backend_test!(
    #[cfg_attr(miri, ignore = "libc calls, files: not under Miri's isolation")]
    mallopt_and_the_lock_follow_their_policies
);
fn mallopt_and_the_lock_follow_their_policies(shared: &Runtime) {
    // A lock of its own per backend: the variants run at once, in one process.
    let dir = std::env::temp_dir().join(format!(
        "rknn-lock-policy-{}-{}",
        std::process::id(),
        TestBackend::of(shared)
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("npu.lock");
    let rt = common::runtime_with(shared, |o| {
        o.mallopt = GuardPolicy::Always;
        o.lock = GuardPolicy::Always;
        o.lock_path = path.clone();
    });
    assert_eq!(
        rt.mallopt_applied(),
        cfg!(all(target_os = "linux", target_env = "gnu"))
    );
    assert_eq!(
        std::fs::read_to_string(&path).unwrap(),
        std::process::id().to_string()
    );
    // A second runtime of this process shares the lock instead of reporting itself busy.
    let rt2 = common::runtime_with(shared, |o| {
        o.lock = GuardPolicy::Always;
        o.lock_path = path.clone();
    });
    assert_eq!(NpuLock::holder(&path), None, "held by this process");
    drop(rt);
    assert_eq!(
        std::fs::read_to_string(&path).unwrap(),
        std::process::id().to_string()
    );
    drop(rt2);
    assert_eq!(NpuLock::holder(&path), None, "released on drop");
    assert_eq!(std::fs::read_to_string(&path).unwrap(), "");
    let rt = common::runtime_with(shared, |o| {
        o.lock = GuardPolicy::Never;
        o.mallopt = GuardPolicy::Never;
    });
    assert!(rt.npu_lock().is_none());
}

backend_test!(
    #[cfg_attr(miri, ignore = "processes: not under Miri's isolation")]
    a_second_process_gets_npu_busy_with_the_holders_pid
);
/// A second process trying to take the NPU while this one holds it gets "NPU busy (held by
/// pid N)". The child is this test binary, re-run with an environment variable.
fn a_second_process_gets_npu_busy_with_the_holders_pid(shared: &Runtime) {
    let backend = TestBackend::of(shared);
    let lock = match std::env::var_os("RKNN_LOCK_CHILD") {
        Some(path) => {
            let (backend, mut opts) = common::options(shared);
            opts.lock = GuardPolicy::Always;
            opts.lock_path = path.into();
            let e = Runtime::open(backend, opts).unwrap_err();
            let parent = std::env::var("RKNN_LOCK_PARENT").unwrap();
            assert!(
                matches!(&e, Error::NpuBusy { pid: Some(p), .. } if p.to_string() == parent),
                "{e}"
            );
            assert!(
                e.to_string()
                    .starts_with(&format!("NPU busy (held by pid {parent})")),
                "{e}"
            );
            return;
        }
        None => {
            let pid = std::process::id();
            std::env::temp_dir().join(format!("rknn-busy-{pid}-{backend}.lock"))
        }
    };
    let rt = common::runtime_with(shared, |o| {
        o.lock = GuardPolicy::Always;
        o.lock_path = lock.clone();
    });
    // The child runs this backend's variant only.
    let test = format!("a_second_process_gets_npu_busy_with_the_holders_pid::{backend}");
    let mut cmd = std::process::Command::new(std::env::current_exe().unwrap());
    cmd.args(["--exact", &test, "--nocapture"])
        .env("RKNN_LOCK_CHILD", &lock)
        .env("RKNN_LOCK_PARENT", std::process::id().to_string());
    let Some(out) = common::run_child_test(&mut cmd) else {
        return;
    };
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert!(stdout.contains("1 passed"), "{stdout}");
    drop(rt);
    let _ = std::fs::remove_file(lock);
}

#[test]
#[cfg_attr(miri, ignore = "files: not under Miri's isolation")]
fn the_platform_is_read_from_the_device_tree() {
    let root = std::env::temp_dir().join(format!("rknn-fake-root-{}", std::process::id()));
    let dt = root.join("proc/device-tree");
    std::fs::create_dir_all(&dt).unwrap();
    for (compat, want) in [
        (
            &b"friendlyelec,nanopi-r6s\0rockchip,rk3588s\0"[..],
            Ok(Platform::Rk3588),
        ),
        (b"radxa,rock-4d\0rockchip,rk3576\0", Ok(Platform::Rk3576)),
        (b"pine64,quartz64\0rockchip,rk3566\0", Ok(Platform::Rk3566)),
        (b"raspberrypi,5-model-b\0brcm,bcm2712\0", Err(())),
    ] {
        std::fs::write(dt.join("compatible"), compat).unwrap();
        assert_eq!(detect_platform(&root).map_err(|_| ()), want);
    }
    std::fs::remove_dir_all(&root).unwrap();
}

/// The NPU code path on the drop-in library: the library is loaded with dlopen, versions are
/// queried through `rknn_query`, and the NPU-only guards apply. About the drop-in only: the
/// emulator has no library and takes no guards by default, and on a board the versions differ.
#[test]
#[cfg_attr(miri, ignore = "dlopen: not under Miri")]
fn the_npu_path_loads_the_library_and_takes_its_guards() {
    let Some(rt) = common::runtime(TestBackend::Dropin) else {
        return;
    };
    assert!(
        !rt.is_emulator() && !rt.is_hardware(),
        "the NPU code path on the emulator"
    );
    assert!(
        rt.selection_reason().contains("librknnrt.so"),
        "{}",
        rt.selection_reason()
    );
    let v = rt.versions().expect("versions through rknn_query");
    assert!(v.runtime.contains("2.3.2"), "{v:?}");
    assert!(rt.npu_lock().is_some());
    assert_eq!(
        rt.mallopt_applied(),
        cfg!(all(target_os = "linux", target_env = "gnu"))
    );
    assert!(rt.fd_limit().is_some());
}
