//! The safe layer over the emulator: results against a naive GEMM, every guard, and every
//! misuse the API turns into a typed error.

use half::f16;
use rknn_matmul::guard::NpuLock;
use rknn_matmul::*;

fn strict_runtime(p: Platform) -> Runtime {
    // Non-coherent cache emulation: results are right only if the layer syncs both ways.
    let mut opts = RuntimeOptions::default();
    opts.emulator.strict_cache = true;
    Runtime::open(Backend::Emulator(p), opts).unwrap()
}

fn naive_i8(a: &[i8], b: &[i8], m: usize, k: usize, n: usize) -> Vec<i32> {
    let mut c = vec![0i32; m * n];
    for i in 0..m {
        for j in 0..n {
            c[i * n + j] = (0..k)
                .map(|x| i32::from(a[i * k + x]) * i32::from(b[x * n + j]))
                .sum();
        }
    }
    c
}

#[test]
fn i8_matmul_matches_a_naive_gemm_in_every_layout() {
    let rt = strict_runtime(Platform::Rk3588);
    let mut rng = fastrand::Rng::with_seed(1);
    // Miri interprets every instruction: keep its shapes small.
    let shapes: &[(usize, usize, usize)] = if cfg!(miri) {
        &[(1, 32, 32), (3, 64, 32)]
    } else {
        &[(1, 32, 32), (7, 96, 64), (33, 160, 96)]
    };
    for &(m, k, n) in shapes {
        let a: Vec<i8> = (0..m * k).map(|_| rng.i8(..)).collect();
        let b: Vec<i8> = (0..k * n).map(|_| rng.i8(..)).collect();
        let want = naive_i8(&a, &b, m, k, n);
        for bl in [Layout::Norm, Layout::Native, Layout::TpNorm] {
            let mm = rt
                .matmul::<I8xI8ToI32>(m, k, n)
                .b_layout(bl)
                .build()
                .unwrap();
            let (mut am, mut bm, mut cm) = (
                mm.alloc_a().unwrap(),
                mm.alloc_b().unwrap(),
                mm.alloc_c().unwrap(),
            );
            am.write(&a).unwrap();
            match bl {
                Layout::Norm => bm.write(&b).unwrap(),
                Layout::Native => mm.b_to_native(&b, &mut bm).unwrap(),
                Layout::TpNorm => {
                    let bt: Vec<i8> = (0..n)
                        .flat_map(|j| (0..k).map(|x| b[x * n + j]).collect::<Vec<_>>())
                        .collect();
                    bm.write(&bt).unwrap();
                }
            }
            mm.run(&am, &bm, &mut cm).unwrap();
            assert_eq!(&cm.as_slice()[..m * n], &want[..], "{bl:?} M={m}");
        }
    }
}

#[test]
fn writes_after_a_run_are_bound_again_before_the_next() {
    let rt = strict_runtime(Platform::Rk3588);
    let mm = rt.matmul::<I8xI8ToI32>(1, 32, 32).build().unwrap();
    let (mut a, mut b, mut c) = (
        mm.alloc_a().unwrap(),
        mm.alloc_b().unwrap(),
        mm.alloc_c().unwrap(),
    );
    b.as_mut_slice().fill(1);
    for v in [1i8, 2, -3] {
        a.as_mut_slice().fill(v);
        mm.run(&a, &b, &mut c).unwrap();
        assert!(
            c.as_slice().iter().all(|&x| x == 32 * i32::from(v)),
            "A = {v}"
        );
    }
    // Resident B: unchanged B is not re-bound, changed B is.
    b.as_mut_slice().fill(2);
    mm.run(&a, &b, &mut c).unwrap();
    assert!(c.as_slice().iter().all(|&x| x == -3 * 2 * 32));
}

#[test]
fn f16_and_dynamic_shapes() {
    let rt = strict_runtime(Platform::Rk3588);
    let (k, n) = (64, 32);
    let mm = rt
        .matmul::<F16xF16ToF32>(1, k, n)
        .dynamic_m(&[1, 4, 9])
        .ac_layout(Layout::Native)
        .build()
        .unwrap();
    let (mut a, mut b, mut c) = (
        mm.alloc_a().unwrap(),
        mm.alloc_b().unwrap(),
        mm.alloc_c().unwrap(),
    );
    assert_eq!(mm.tiles().0, Some(8), "native A tile from io_attr");
    b.as_mut_slice().fill(f16::from_f32(0.25));
    for m in [9, 1, 4] {
        mm.set_m(m).unwrap();
        assert_eq!(mm.shape(), (m, k, n));
        // Native A with tile 8: every element set to 1 (padding too), so layout does not matter here.
        a.as_mut_slice().fill(f16::from_f32(1.0));
        mm.run(&a, &b, &mut c).unwrap();
        assert!(c.as_slice()[..m * n].iter().all(|&x| x == 16.0), "M={m}");
    }
    assert!(matches!(mm.set_m(5), Err(Error::Invalid(msg)) if msg.contains("M=5")));
}

#[test]
fn bad_shapes_and_types_are_typed_errors_before_any_ffi_call() {
    let rt = Runtime::emulator(Platform::Rk3588).unwrap();
    let e = rt.matmul::<I8xI8ToI32>(1, 64, 100).build().unwrap_err();
    assert_eq!(
        e.to_string(),
        "N=100 is not a multiple of 32 required for i8 on RK3588"
    );
    let e = rt.matmul::<F16xI4ToF32>(1, 64, 64).build().unwrap_err();
    assert!(
        e.to_string().contains("not supported on RK3588") && e.to_string().contains("W4A4"),
        "{e}"
    );
    let e = rt.matmul::<I4xI4ToI16>(1, 64, 64).build().unwrap_err();
    assert!(e.to_string().contains("native layout"), "{e}");
    let e = rt.matmul::<I8xI8ToI32>(0, 64, 64).build().unwrap_err();
    assert_eq!(e.to_string(), "M=0 must be at least 1");
    let e = rt
        .matmul::<I8xI8ToI32>(1, 64, 64)
        .ac_layout(Layout::TpNorm)
        .build()
        .unwrap_err();
    assert!(e.to_string().contains("TP_NORM"));
    let e = rt
        .matmul::<I8xI8ToI32>(1, 64, 64)
        .core(Core::Index(3))
        .build()
        .unwrap_err();
    assert!(e.to_string().contains("3 NPU core"), "{e}");
    let e = rt
        .matmul::<I8xI8ToF32>(1, 64, 64)
        .quant_b(BQuant::PerChannel {
            scales: vec![1.0; 63],
            zps: vec![],
        })
        .build()
        .unwrap_err();
    assert!(
        matches!(
            e,
            Error::Size {
                expected: 64,
                got: 63,
                ..
            }
        ),
        "{e}"
    );
    let e = rt
        .matmul::<I8xI8ToF32>(1, 64, 64)
        .quant_b(BQuant::PerGroup {
            group_size: 48,
            scales: vec![],
            zps: vec![],
        })
        .build()
        .unwrap_err();
    assert!(e.to_string().contains("group_size=48"), "{e}");
    let e = rt
        .matmul::<I8xI8ToI32>(1, 64, 64)
        .dynamic_m(&[1, 1])
        .build()
        .unwrap_err();
    assert!(e.to_string().contains("twice"));
    // Nothing reached the runtime.
    assert_eq!(rt.emulator_instance().unwrap().stats().contexts, 0);
    // The single-core chips have no core selection.
    let rt = Runtime::emulator(Platform::Rk3566).unwrap();
    assert!(
        rt.matmul::<I8xI8ToI32>(1, 64, 64)
            .core(Core::Index(0))
            .build()
            .is_err()
    );
}

#[test]
fn core_selection_and_quantised_types() {
    let rt = strict_runtime(Platform::Rk3588);
    for core in 0..3 {
        let mm = rt
            .matmul::<I8xI8ToF32>(2, 64, 32)
            .core(Core::Index(core))
            .quant_a(LayerQuant { scale: 0.5, zp: 0 })
            .quant_b(BQuant::PerChannel {
                scales: (0..32).map(|j| 1.0 / (j + 1) as f32).collect(),
                zps: vec![],
            })
            .build()
            .unwrap();
        let (mut a, mut b, mut c) = (
            mm.alloc_a().unwrap(),
            mm.alloc_b().unwrap(),
            mm.alloc_c().unwrap(),
        );
        a.as_mut_slice().fill(4);
        b.as_mut_slice().fill(2);
        mm.run(&a, &b, &mut c).unwrap();
        for (j, &x) in c.as_slice()[..32].iter().enumerate() {
            let want = 0.5 * (1.0 / (j + 1) as f64) * 64.0 * 8.0;
            assert!(
                (f64::from(x) - want).abs() < 1e-4,
                "core {core} col {j}: {x} vs {want}"
            );
        }
    }
}

#[test]
fn memories_of_another_context_are_refused() {
    let rt = Runtime::emulator(Platform::Rk3588).unwrap();
    let m1 = rt.matmul::<I8xI8ToI32>(1, 32, 32).build().unwrap();
    let m2 = rt.matmul::<I8xI8ToI32>(1, 32, 32).build().unwrap();
    let (a, b) = (m1.alloc_a().unwrap(), m1.alloc_b().unwrap());
    let mut c2 = m2.alloc_c().unwrap();
    let e = m1.run(&a, &b, &mut c2).unwrap_err();
    assert!(
        e.to_string().contains("C was allocated on another context"),
        "{e}"
    );
}

#[test]
fn memories_are_freed_before_their_context_exactly_once() {
    let rt = Runtime::emulator(Platform::Rk3588).unwrap();
    let emu = rt.emulator_instance().unwrap();
    {
        let mm = rt.matmul::<I8xI8ToI32>(1, 32, 32).build().unwrap();
        let _mems = (
            mm.alloc_a().unwrap(),
            mm.alloc_b().unwrap(),
            mm.alloc_c().unwrap(),
        );
        assert_eq!(emu.stats().memories, 3);
        assert_eq!(rt.handle_budget().live(), 3);
    }
    let s = emu.stats();
    assert_eq!((s.contexts, s.memories, s.orphaned_memories), (0, 0, 0));
    assert_eq!(rt.handle_budget().live(), 0);
}

#[test]
fn the_handle_budget_is_a_typed_error_before_the_runtime_fails() {
    let opts = RuntimeOptions {
        handle_budget: Some(5),
        ..RuntimeOptions::default()
    };
    let rt = Runtime::open(Backend::Emulator(Platform::Rk3588), opts).unwrap();
    let mm = rt.matmul::<I8xI8ToI32>(1, 32, 32).build().unwrap();
    let held: Vec<_> = (0..5).map(|_| mm.alloc_a().unwrap()).collect();
    let e = mm.alloc_a().unwrap_err();
    assert!(
        matches!(e, Error::HandleBudget { live: 5, budget: 5 }),
        "{e}"
    );
    assert!(e.to_string().contains("file descriptor"));
    drop(held);
    assert!(mm.alloc_a().is_ok());
    // The default budget is no larger than the emulator's (and the device's) ~1020 handles.
    let rt = Runtime::emulator(Platform::Rk3588).unwrap();
    assert!(rt.handle_budget().budget() <= 1020);
}

#[test]
fn the_emulators_own_handle_limit_surfaces_as_an_allocation_error() {
    let mut opts = RuntimeOptions {
        handle_budget: Some(100),
        ..RuntimeOptions::default()
    };
    opts.emulator.handle_budget = 3;
    let rt = Runtime::open(Backend::Emulator(Platform::Rk3588), opts).unwrap();
    let mm = rt.matmul::<I8xI8ToI32>(1, 32, 32).build().unwrap();
    let _held: Vec<_> = (0..3).map(|_| mm.alloc_a().unwrap()).collect();
    let e = mm.alloc_a().unwrap_err();
    assert!(
        matches!(&e, Error::AllocFailed { detail: Some(d), .. } if d.contains("too many open files")),
        "{e}"
    );
    assert_eq!(
        rt.handle_budget().live(),
        3,
        "a failed allocation gives its handle back"
    );
}

#[test]
#[cfg_attr(
    miri,
    ignore = "libc calls, files or processes: not under Miri's isolation"
)]
fn the_fd_limit_is_raised_toward_the_hard_limit() {
    let rt = Runtime::emulator(Platform::Rk3588).unwrap();
    let l = rt.fd_limit().expect("raised by default");
    assert!(l.soft >= l.soft_before);
    assert!(l.soft == l.hard.min(1 << 20), "{l:?}");
}

#[test]
#[cfg_attr(
    miri,
    ignore = "libc calls, files or processes: not under Miri's isolation"
)]
fn mallopt_and_the_lock_follow_their_policies() {
    let dir = std::env::temp_dir().join(format!("rknn-lock-policy-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let rt = Runtime::emulator(Platform::Rk3588).unwrap();
    assert!(
        !rt.mallopt_applied() && rt.npu_lock().is_none(),
        "NPU-only guards stay off on the emulator"
    );
    let opts = RuntimeOptions {
        mallopt: GuardPolicy::Always,
        lock: GuardPolicy::Always,
        lock_path: dir.join("npu.lock"),
        ..RuntimeOptions::default()
    };
    let rt = Runtime::open(Backend::Emulator(Platform::Rk3588), opts).unwrap();
    assert_eq!(
        rt.mallopt_applied(),
        cfg!(all(target_os = "linux", target_env = "gnu"))
    );
    assert_eq!(
        std::fs::read_to_string(dir.join("npu.lock")).unwrap(),
        std::process::id().to_string()
    );
    drop(rt);
    assert_eq!(
        NpuLock::holder(&dir.join("npu.lock")),
        None,
        "released on drop"
    );
}

/// A second process trying to take the NPU while this one holds it gets "NPU busy (held by
/// pid N)". The child is this test binary, re-run with an environment variable.
#[test]
#[cfg_attr(
    miri,
    ignore = "libc calls, files or processes: not under Miri's isolation"
)]
fn a_second_process_gets_npu_busy_with_the_holders_pid() {
    let lock = match std::env::var_os("RKNN_LOCK_CHILD") {
        Some(path) => {
            let opts = RuntimeOptions {
                lock: GuardPolicy::Always,
                lock_path: path.into(),
                ..RuntimeOptions::default()
            };
            let e = Runtime::open(Backend::Emulator(Platform::Rk3588), opts).unwrap_err();
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
        None => std::env::temp_dir().join(format!("rknn-busy-{}.lock", std::process::id())),
    };
    let opts = RuntimeOptions {
        lock: GuardPolicy::Always,
        lock_path: lock.clone(),
        ..RuntimeOptions::default()
    };
    let rt = Runtime::open(Backend::Emulator(Platform::Rk3588), opts).unwrap();
    let out = match std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "a_second_process_gets_npu_busy_with_the_holders_pid",
            "--nocapture",
        ])
        .env("RKNN_LOCK_CHILD", &lock)
        .env("RKNN_LOCK_PARENT", std::process::id().to_string())
        .output()
    {
        Ok(out) => out,
        // qemu-user without binfmt cannot exec a child of the emulated architecture.
        Err(e) if e.raw_os_error() == Some(ENOEXEC) => {
            eprintln!("skipped: cannot start a child process here ({e})");
            return;
        }
        Err(e) => panic!("spawn the child: {e}"),
    };
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !stdout.contains("running 1 test") {
        // The child never reached the test harness (qemu-user starting an emulated binary
        // without its sysroot): the lock was not exercised.
        eprintln!(
            "skipped: the child process did not start ({})",
            String::from_utf8_lossy(&out.stderr).trim()
        );
        return;
    }
    assert!(out.status.success(), "{stdout}");
    assert!(stdout.contains("1 passed"), "{stdout}");
    drop(rt);
    let _ = std::fs::remove_file(lock);
}

#[test]
fn capabilities_and_schemes() {
    let rt = Runtime::emulator(Platform::Rk3588).unwrap();
    let caps = rt.capabilities();
    let supported: Vec<u32> = caps
        .iter()
        .filter(|c| c.supported)
        .map(|c| c.matmul_type.raw())
        .collect();
    assert_eq!(supported, [1, 2, 3, 4, 9, 10]);
    for s in [Scheme::W8A16, Scheme::W4A16, Scheme::W4A8] {
        let e = rt.require(s).unwrap_err().to_string();
        assert!(
            e.contains("no weight-only") && e.contains("W4A4") && e.contains("outliers"),
            "{e}"
        );
    }
    assert_eq!(rt.require(Scheme::W4A4).unwrap(), [MatmulType::I4_I4_I16]);
    let rt = Runtime::emulator(Platform::Rk3576).unwrap();
    assert!(
        rt.require(Scheme::W4A16)
            .unwrap()
            .contains(&MatmulType::F16_I4_F32)
    );
    let e = rt.require(Scheme::W4A4).unwrap_err().to_string();
    assert!(e.contains("RK3576") && e.contains("F16"), "{e}");
}

#[test]
fn error_codes_map_and_keep_versions_where_skew_is_likely() {
    for raw in -13..=-1 {
        let c = RknnCode::from_raw(raw);
        assert_eq!(c.raw(), raw);
        assert!(!matches!(c, RknnCode::Other(_)));
    }
    assert_eq!(RknnCode::from_raw(-99), RknnCode::Other(-99));
    assert!(RknnCode::from_raw(-10).suggests_version_skew());
    let rt = Runtime::emulator(Platform::Rk3588).unwrap();
    let e = rt.check("rknn_matmul_run", -10).unwrap_err().to_string();
    assert!(
        e.contains("RKNN_ERR_DEVICE_UNMATCH (-10)")
            && e.contains("runtime 2.3.2")
            && e.contains("version mismatch"),
        "{e}"
    );
    let e = rt.check("rknn_matmul_run", -5).unwrap_err().to_string();
    assert!(!e.contains("version"), "{e}");
}

#[test]
#[cfg_attr(
    miri,
    ignore = "libc calls, files or processes: not under Miri's isolation"
)]
fn auto_falls_back_to_the_emulator_and_says_why() {
    let rt = Runtime::auto().unwrap();
    // No NPU on CI machines: the reason names what was missing.
    if rt.is_emulator() {
        assert!(
            rt.selection_reason().contains("using the emulator"),
            "{}",
            rt.selection_reason()
        );
    }
}

#[test]
#[cfg_attr(
    miri,
    ignore = "libc calls, files or processes: not under Miri's isolation"
)]
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

#[test]
fn int4_packing_helpers() {
    for lo in -8..=7i8 {
        for hi in -8..=7i8 {
            assert_eq!(I4x2::new(lo, hi).get(), (lo, hi));
        }
    }
}

/// ENOEXEC: the kernel cannot run the file (an aarch64 test binary under qemu-user, with no
/// binfmt handler to start its child).
const ENOEXEC: i32 = 8;

#[test]
fn int4_w4a4_runs_with_native_b_from_the_converter() {
    let rt = strict_runtime(Platform::Rk3588);
    let (m, k, n) = (3, 64, 64);
    let mut rng = fastrand::Rng::with_seed(44);
    let a: Vec<i8> = (0..m * k).map(|_| rng.i8(-8..=7)).collect();
    let b: Vec<i8> = (0..k * n).map(|_| rng.i8(-8..=7)).collect();
    let mm = rt
        .matmul::<I4xI4ToI16>(m, k, n)
        .b_layout(Layout::Native)
        .build()
        .unwrap();
    let (mut am, mut bm, mut cm) = (
        mm.alloc_a().unwrap(),
        mm.alloc_b().unwrap(),
        mm.alloc_c().unwrap(),
    );
    let packed: Vec<I4x2> = a.chunks(2).map(|p| I4x2::new(p[0], p[1])).collect();
    am.write(&packed).unwrap();
    mm.b_to_native(&b, &mut bm).unwrap();
    mm.run(&am, &bm, &mut cm).unwrap();
    let want = naive_i8(&a, &b, m, k, n);
    let got: Vec<i32> = cm.as_slice()[..m * n]
        .iter()
        .map(|&x| i32::from(x))
        .collect();
    assert_eq!(got, want);
    // The converter refuses a source of the wrong element type or length.
    assert!(mm.b_to_native(&b[..10], &mut bm).is_err());
}

#[test]
fn i8_to_i8_with_an_asymmetric_output() {
    let rt = strict_runtime(Platform::Rk3588);
    let mm = rt
        .matmul::<I8xI8ToI8>(1, 32, 32)
        .quant_a(LayerQuant { scale: 1.0, zp: 0 })
        .quant_b(BQuant::PerLayer { scale: 1.0, zp: 0 })
        .quant_c(LayerQuant { scale: 4.0, zp: 10 })
        .build()
        .unwrap();
    let (mut a, mut b, mut c) = (
        mm.alloc_a().unwrap(),
        mm.alloc_b().unwrap(),
        mm.alloc_c().unwrap(),
    );
    a.as_mut_slice().fill(1);
    b.as_mut_slice().fill(3);
    mm.run(&a, &b, &mut c).unwrap();
    // 32 * 3 / 4 + 10 = 34
    assert!(
        c.as_slice().iter().all(|&x| x == 34),
        "{:?}",
        &c.as_slice()[..4]
    );
}
