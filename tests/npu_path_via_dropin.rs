//! The real-NPU code path end to end, with the emulator's drop-in `librknnrt.so` standing in
//! for Rockchip's library: `Runtime::open(Backend::Npu)` loads it with dlopen through
//! `rknn-sys`, queries versions, takes the NPU guards, probes capabilities by creating
//! contexts, and the engine runs on it. Only the device-tree and device-node checks are
//! bypassed (by naming the chip), since this machine has no NPU.

use std::path::PathBuf;
use std::sync::Arc;

use rknn_matmul::engine::topology::Pinning;
use rknn_matmul::engine::{Engine, EngineConfig, WeightFormat};
use rknn_matmul::{Backend, I8xI8ToI32, Platform, Runtime, RuntimeOptions};

/// `librknnrt.so` that cargo built for this test (a dev-dependency), next to its binary.
fn dropin() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let deps = exe.parent().unwrap();
    let so = deps.join("librknnrt.so");
    assert!(so.exists(), "{} was not built", so.display());
    so
}

fn npu_runtime(tag: &str) -> Runtime {
    let opts = RuntimeOptions {
        runtime_path: Some(dropin()),
        npu_platform: Some(Platform::Rk3588),
        lock_path: std::env::temp_dir()
            .join(format!("rknn-npu-path-{tag}-{}.lock", std::process::id())),
        ..RuntimeOptions::default()
    };
    Runtime::open(Backend::Npu, opts).expect("open the NPU path on the drop-in library")
}

#[test]
fn the_npu_path_loads_the_library_and_takes_its_guards() {
    let rt = npu_runtime("guards");
    assert!(!rt.is_emulator(), "this is the NPU code path");
    assert!(
        rt.selection_reason().contains("librknnrt.so"),
        "{}",
        rt.selection_reason()
    );
    let v = rt.versions().expect("versions through rknn_query");
    assert!(
        v.runtime.contains("2.3.2") && v.driver.contains("rk3588"),
        "{v:?}"
    );
    // The NPU-only guards apply here: the lock is held and mallopt was applied (on glibc).
    assert!(rt.npu_lock().is_some());
    assert_eq!(
        rt.mallopt_applied(),
        cfg!(all(target_os = "linux", target_env = "gnu"))
    );
    assert!(rt.fd_limit().is_some());
}

#[test]
fn the_capability_probe_creates_contexts_and_agrees_with_the_table() {
    let rt = npu_runtime("caps");
    for c in rt.capabilities() {
        assert_eq!(
            c.supported,
            Platform::Rk3588.accepts(c.matmul_type),
            "{:?}",
            c
        );
        if !c.supported {
            assert!(c.reason.is_some());
        }
    }
}

#[test]
fn a_matmul_and_the_engine_run_through_the_loaded_library() {
    let rt = Arc::new(npu_runtime("engine"));
    {
        let mm = rt.matmul::<I8xI8ToI32>(3, 64, 32).build().unwrap();
        let (mut a, mut b, mut c) = (
            mm.alloc_a().unwrap(),
            mm.alloc_b().unwrap(),
            mm.alloc_c().unwrap(),
        );
        a.as_mut_slice()
            .iter_mut()
            .enumerate()
            .for_each(|(i, v)| *v = (i % 7) as i8 - 3);
        b.as_mut_slice()
            .iter_mut()
            .enumerate()
            .for_each(|(i, v)| *v = (i % 5) as i8 - 2);
        mm.run(&a, &b, &mut c).unwrap();
        for r in 0..3 {
            for j in 0..32 {
                let want: i32 = (0..64)
                    .map(|x| {
                        i32::from(a.as_slice()[r * 64 + x]) * i32::from(b.as_slice()[x * 32 + j])
                    })
                    .sum();
                assert_eq!(c.as_slice()[r * 32 + j], want);
            }
        }
    }

    let engine = Engine::new(
        rt,
        EngineConfig {
            pinning: Pinning::None,
            ..EngineConfig::default()
        },
    )
    .unwrap();
    let (n, k) = (70, 9000);
    let w: Vec<f32> = (0..n * k)
        .map(|i| ((i * 37) % 101) as f32 / 50.0 - 1.0)
        .collect();
    let x: Vec<f32> = (0..2 * k)
        .map(|i| ((i * 13) % 89) as f32 / 44.0 - 1.0)
        .collect();
    let lin = engine.linear(&w, n, k, WeightFormat::F16).unwrap();
    let y = lin.forward_vec(&x, 2).unwrap();
    let h = |v: f32| f64::from(half::f16::from_f32(v).to_f32());
    for r in 0..2 {
        for j in 0..n {
            let want: f64 = (0..k).map(|c| h(x[r * k + c]) * h(w[j * k + c])).sum();
            assert!(
                (f64::from(y[r * n + j]) - want).abs() < 1e-2,
                "[{r},{j}] {} vs {want}",
                y[r * n + j]
            );
        }
    }
}
