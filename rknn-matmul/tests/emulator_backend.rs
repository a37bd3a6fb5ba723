//! What only the built-in emulator backend can show: that nothing reached the runtime, that
//! every chip's rules apply when it plays that chip, its own handle limit and error reasons,
//! failed releases reported by the next call, and the `auto` fallback.
#![cfg(feature = "emulator")]

use rknn_matmul::*;

#[test]
fn bad_requests_never_reach_the_runtime() {
    let rt = Runtime::emulator(Platform::Rk3588).unwrap();
    let contexts = || rt.emulator_instance().unwrap().stats().contexts;
    let _ = rt.matmul::<I8xI8ToI32>(1, 64, 100).build().unwrap_err();
    let _ = rt.matmul::<I8xI8ToI32>(1, 0, 64).build().unwrap_err();
    let _ = rt.matmul::<F16xI4ToF32>(1, 64, 64).build().unwrap_err();
    let _ = rt.matmul::<I4xI4ToI16>(1, 64, 64).build().unwrap_err();
    let _ = rt
        .matmul::<I8xI8ToF32>(1, 64, 64)
        .quant_b(BQuant::PerLayer {
            scale: f32::NAN,
            zp: 0,
        })
        .build()
        .unwrap_err();
    assert_eq!(contexts(), 0);
    let e = rt.matmul::<F16xI4ToF32>(1, 64, 64).build().unwrap_err();
    assert!(
        e.to_string().contains("not supported on RK3588") && e.to_string().contains("W4A4"),
        "{e}"
    );
}

#[test]
fn each_chip_is_validated_with_its_own_rules() {
    // RK3576's K limit is the header's 10240 (RK3588 has none).
    let rt = Runtime::emulator(Platform::Rk3576).unwrap();
    let e = rt
        .matmul::<I8xI8ToI32>(1, 10240 + 32, 32)
        .build()
        .unwrap_err();
    assert!(
        e.to_string().contains("K=10272 exceeds the limit of 10240"),
        "{e}"
    );
    assert!(
        Runtime::emulator(Platform::Rk3588)
            .unwrap()
            .matmul::<I8xI8ToI32>(1, 10240 + 32, 32)
            .build()
            .is_ok()
    );
    // RK3566 aligns f16 N to 8.
    let rt = Runtime::emulator(Platform::Rk3566).unwrap();
    let mm = rt.matmul::<F16xF16ToF32>(1, 16, 8).build().unwrap();
    assert_eq!(mm.shape(), (1, 16, 8));
    // Single-core chips have no core selection.
    let e = rt
        .matmul::<I8xI8ToI32>(1, 64, 64)
        .core(Core::Index(0))
        .build()
        .unwrap_err();
    assert!(e.to_string().contains("no core selection"), "{e}");
    // Strict rules on request: N <= 4096.
    let opts = RuntimeOptions {
        strict_shape_rules: true,
        ..RuntimeOptions::default()
    };
    let rt = Runtime::open(Backend::Emulator(Platform::Rk3588), opts).unwrap();
    assert!(rt.matmul::<I8xI8ToI32>(1, 32, 8192).build().is_err());
}

#[test]
fn the_emulators_own_handle_limit_surfaces_as_an_allocation_error_with_its_reason() {
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
        matches!(&e, Error::AllocFailed { call: Call::CreateMem, detail: Some(d), .. } if d.contains("too many open files")),
        "{e}"
    );
    assert_eq!(
        rt.handle_budget().live(),
        3,
        "a failed allocation gives its handle back"
    );
}

#[test]
fn the_default_budget_is_no_larger_than_the_emulated_devices() {
    // The emulator models a board under `ulimit -n 1024`: ~1020 dma-buf handles.
    let rt = Runtime::emulator(Platform::Rk3588).unwrap();
    assert!(rt.handle_budget().budget() <= 1020);
}

#[test]
fn memories_are_freed_before_their_context_exactly_once() {
    let rt = Runtime::emulator(Platform::Rk3588).unwrap();
    let emu = rt.emulator_instance().unwrap();
    {
        let mm = rt.matmul::<I8xI8ToI32>(1, 32, 32).build().unwrap();
        let mems = (
            mm.alloc_a().unwrap(),
            mm.alloc_b().unwrap(),
            mm.alloc_c().unwrap(),
        );
        assert_eq!(emu.stats().memories, 3);
        drop(mm);
        assert_eq!(
            emu.stats().contexts,
            1,
            "the memories keep the context alive"
        );
        drop(mems);
    }
    let s = emu.stats();
    assert_eq!((s.contexts, s.memories, s.orphaned_memories), (0, 0, 0));
    assert_eq!(rt.handle_budget().live(), 0);
}

#[test]
fn a_failed_release_is_reported_by_the_next_call() {
    let rt = Runtime::emulator(Platform::Rk3588).unwrap();
    let mm = rt.matmul::<I8xI8ToI32>(1, 32, 32).build().unwrap();
    // Destroy the context behind the safe layer's back, so its own destroy in Drop fails.
    // SAFETY: a live context without memories; the safe layer's later destroy of the same
    // handle is refused by the runtime (an unknown handle), which is what is tested.
    let rc = unsafe { (rt.api().rknn_matmul_destroy)(mm.as_raw()) };
    assert_eq!(rc, 0);
    drop(mm);
    let e = rt.matmul::<I8xI8ToI32>(1, 32, 32).build().unwrap_err();
    assert!(
        matches!(&e, Error::ReleaseFailed(inner) if inner.call() == Some(Call::MatmulDestroy)),
        "{e}"
    );
    assert!(
        e.to_string()
            .starts_with("an earlier release failed: rknn_matmul_destroy failed"),
        "{e}"
    );
    // Reported once: the next call works.
    assert!(rt.matmul::<I8xI8ToI32>(1, 32, 32).build().is_ok());
}

#[test]
#[cfg_attr(miri, ignore = "files: not under Miri's isolation")]
fn auto_falls_back_to_the_emulator_and_says_why() {
    let rt = Runtime::auto().unwrap();
    // No NPU on CI machines: the reason names what was missing.
    if rt.is_emulator() {
        assert!(
            rt.selection_reason().contains("using the emulator"),
            "{}",
            rt.selection_reason()
        );
        assert!(!rt.is_hardware());
    }
}

#[test]
fn the_int4_converter_input_setting_reaches_the_emulator() {
    for input in [Int4ConverterInput::Packed, Int4ConverterInput::OnePerByte] {
        let opts = RuntimeOptions {
            int4_converter_input: Some(input),
            ..RuntimeOptions::default()
        };
        let rt = Runtime::open(Backend::Emulator(Platform::Rk3588), opts).unwrap();
        assert_eq!(rt.int4_converter_input(), input);
        let (m, k, n) = (1, 64, 64);
        let mm = rt
            .matmul::<I4xI4ToI16>(m, k, n)
            .b_layout(Layout::Native)
            .build()
            .unwrap();
        let (mut a, mut b, mut c) = (
            mm.alloc_a().unwrap(),
            mm.alloc_b().unwrap(),
            mm.alloc_c().unwrap(),
        );
        let bsrc: Vec<i8> = (0..k * n).map(|i| (i % 15) as i8 - 7).collect();
        a.as_mut_slice().fill(I4x2::new(1, 1));
        mm.b_to_native(&bsrc, &mut b).unwrap();
        mm.run(&a, &b, &mut c).unwrap();
        for j in 0..n {
            let want: i32 = (0..k).map(|x| i32::from(bsrc[x * n + j])).sum();
            assert_eq!(i32::from(c.as_slice()[j]), want, "{input:?} col {j}");
        }
    }
}

#[test]
fn weights_beyond_one_iommu_domain_spread_over_the_next_ones() {
    use rknn_matmul::engine::{Engine, EngineConfig, WeightFormat};
    const DOMAIN: u64 = 1 << 20;
    let mut opts = RuntimeOptions::default();
    opts.emulator.iommu_domain_bytes = DOMAIN;
    let rt = Runtime::open(Backend::Emulator(Platform::Rk3588), opts).unwrap();
    let cfg = EngineConfig {
        cores: Some(2),
        max_m: 128,
        iommu_domain_bytes: DOMAIN,
        pinning: rknn_matmul::engine::topology::Pinning::None,
        ..EngineConfig::default()
    };
    let e = Engine::new(&rt, cfg.clone()).unwrap();
    let (n, k) = (512, 512);
    let w: Vec<f32> = (0..n * k)
        .map(|i| ((i * 7919) % 255) as f32 / 127.0 - 1.0)
        .collect();
    let x: Vec<f32> = (0..2 * k)
        .map(|i| ((i * 31) % 97) as f32 / 48.0 - 1.0)
        .collect();
    let want = e
        .linear(&w, n, k, WeightFormat::W8A8)
        .unwrap()
        .forward_vec(&x, 2)
        .unwrap();
    let linears: Vec<_> = (0..6)
        .map(|_| e.linear(&w, n, k, WeightFormat::W8A8).unwrap())
        .collect();
    let domains: Vec<i32> = linears.iter().map(|l| l.iommu_domain()).collect();
    assert!(domains.windows(2).all(|d| d[0] <= d[1]), "{domains:?}");
    assert!(
        *domains.last().unwrap() >= 2,
        "six linears of 256 KiB spread: {domains:?}"
    );
    for l in &linears {
        assert_eq!(
            l.forward_vec(&x, 2).unwrap(),
            want,
            "domain {}",
            l.iommu_domain()
        );
    }
    let emu = rt.emulator_instance().unwrap();
    for d in 0..=*domains.last().unwrap() {
        assert!(
            emu.domain_used(d) <= DOMAIN,
            "domain {d}: {}",
            emu.domain_used(d)
        );
    }
    // An engine that believes a domain holds 4 GiB overfills the first one: a typed error.
    let naive = Engine::new(
        &rt,
        EngineConfig {
            iommu_domain_bytes: 4 << 30,
            ..cfg
        },
    )
    .unwrap();
    let overfull: Result<Vec<_>, _> = (0..6)
        .map(|_| naive.linear(&w, n, k, WeightFormat::W8A8))
        .collect();
    assert!(
        matches!(overfull, Err(Error::AllocFailed { .. })),
        "{overfull:?}"
    );
}

#[test]
fn a_single_core_chip_runs_the_engine_on_one_lane() {
    use rknn_matmul::engine::{Engine, EngineConfig};
    let rt = Runtime::emulator(Platform::Rk3566).unwrap();
    let e = Engine::new(&rt, EngineConfig::default()).unwrap();
    assert_eq!(e.workers(), 1);
    let w: Vec<f32> = (0..5 * 40).map(|i| (i % 7) as f32 - 3.0).collect();
    let lin = e
        .linear(&w, 5, 40, rknn_matmul::engine::WeightFormat::W8A8)
        .unwrap();
    let y = lin.forward_vec(&[1.0; 40], 1).unwrap();
    for (j, &v) in y.iter().enumerate() {
        let want: f32 = w[j * 40..(j + 1) * 40].iter().sum();
        assert!(
            (v - want).abs() < 0.05 * want.abs().max(1.0),
            "{j}: {v} vs {want}"
        );
    }
}
