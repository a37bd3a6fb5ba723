//! What only the built-in emulator backend can show: that nothing reached the runtime, that
//! every chip's rules apply when it plays that chip, its own handle limit and error reasons,
//! failed releases reported by the next call, the `auto` fallback, and the `RKNN_EMU_*`
//! variables read by the in-process emulator as by the drop-in library.
//!
//! `RuntimeOptions::default()` configures the in-process emulator from the environment: every
//! test here that relies on the emulator's defaults names them ([`emu`], [`fixed`]), so that a
//! variable inherited by the test process changes nothing.
#![cfg(feature = "emulator")]

mod common;

use rknn_matmul::rknn_chip::{Dim, RuleViolation};
use rknn_matmul::*;

/// Options with the emulator's default configuration, whatever the environment says.
fn fixed() -> RuntimeOptions {
    RuntimeOptions {
        emulator: EmuConfig::default(),
        ..RuntimeOptions::default()
    }
}

/// The emulator playing `p` in its default configuration.
fn emu(p: Platform) -> Runtime {
    Runtime::open(Backend::Emulator(p), fixed()).unwrap()
}

#[test]
fn bad_requests_never_reach_the_runtime() {
    let rt = emu(Platform::Rk3588);
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
    let rt = emu(Platform::Rk3576);
    let e = rt
        .matmul::<I8xI8ToI32>(1, 10240 + 32, 32)
        .build()
        .unwrap_err();
    assert!(
        e.to_string().contains("K=10272 exceeds the limit of 10240"),
        "{e}"
    );
    assert!(
        emu(Platform::Rk3588)
            .matmul::<I8xI8ToI32>(1, 10240 + 32, 32)
            .build()
            .is_ok()
    );
    // RK3566 aligns f16 N to 8.
    let rt = emu(Platform::Rk3566);
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
        ..fixed()
    };
    let rt = Runtime::open(Backend::Emulator(Platform::Rk3588), opts).unwrap();
    assert!(rt.matmul::<I8xI8ToI32>(1, 32, 8192).build().is_err());
}

#[test]
fn the_emulators_own_handle_limit_surfaces_as_an_allocation_error_with_its_reason() {
    let mut opts = RuntimeOptions {
        handle_budget: Some(100),
        ..fixed()
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
    let rt = emu(Platform::Rk3588);
    assert!(rt.handle_budget().budget() <= 1020);
}

#[test]
fn memories_are_freed_before_their_context_exactly_once() {
    let rt = emu(Platform::Rk3588);
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
    let rt = emu(Platform::Rk3588);
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
            ..fixed()
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
    let mut opts = fixed();
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
    let rt = emu(Platform::Rk3566);
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

/// The in-process emulator configured as the drop-in would be under `RKNN_EMU_STRICT_RULES=1`.
fn strict_from_vars() -> Runtime {
    let opts = RuntimeOptions {
        emulator: EmuConfig::from_vars(|n| (n == "RKNN_EMU_STRICT_RULES").then(|| "1".into())),
        ..fixed()
    };
    Runtime::open(Backend::Emulator(Platform::Rk3588), opts).unwrap()
}

/// N = 8192 (i8, K = 32) refused with a typed error naming the user guide's 4096, and N = 4096
/// accepted: what a runtime under the strict rules must do.
fn assert_strict_n_limit(rt: &Runtime) {
    let e = rt.matmul::<I8xI8ToI32>(1, 32, 8192).build().unwrap_err();
    assert!(
        matches!(
            e,
            Error::Rule(RuleViolation::TooLarge {
                dim: Dim::N,
                value: 8192,
                max: 4096,
                ..
            })
        ),
        "{e}"
    );
    assert!(e.to_string().contains("4096"), "{e}");
    let mm = rt.matmul::<I8xI8ToI32>(1, 32, 4096).build().unwrap();
    assert_eq!(mm.shape(), (1, 32, 4096));
}

#[test]
fn the_emulators_strict_rules_are_the_runtimes_shape_rules() {
    let rt = strict_from_vars();
    assert_eq!(rt.shape_rules(), ShapeRules::strict(Platform::Rk3588));
    assert_strict_n_limit(&rt);
    // Nothing reached the emulator: the safe layer refused first.
    assert_eq!(rt.emulator_instance().unwrap().stats().contexts, 0);
    // The default configuration keeps what the runtime accepts.
    let rt = emu(Platform::Rk3588);
    assert_eq!(rt.shape_rules(), ShapeRules::accepted(Platform::Rk3588));
    assert!(rt.matmul::<I8xI8ToI32>(1, 32, 8192).build().is_ok());
}

#[test]
fn custom_emulator_rules_tighten_the_runtimes_rules_limit_by_limit() {
    let mut opts = fixed();
    opts.emulator.rules = rknn_emu::RulesPolicy::Custom(ShapeRules {
        max_k: Some(2048),
        max_n: None,
        f16_n_align: 16,
    });
    opts.strict_shape_rules = true;
    let rt = Runtime::open(Backend::Emulator(Platform::Rk3588), opts).unwrap();
    // The smaller K limit of the emulator, the strict N limit and f16 alignment of the options.
    assert_eq!(
        rt.shape_rules(),
        ShapeRules {
            max_k: Some(2048),
            max_n: Some(4096),
            f16_n_align: 32,
        }
    );
}

/// Set in the child process of [`strict_rules_in_the_environment_reach_both_emulators`].
const STRICT_CHILD: &str = "RKNN_TEST_STRICT_RULES_CHILD";

/// The child's half of [`strict_rules_in_the_environment_reach_both_emulators`]: runs only in a
/// process started with `RKNN_EMU_STRICT_RULES=1` (passes at once otherwise).
#[test]
fn strict_rules_child() {
    if std::env::var_os(STRICT_CHILD).is_none() {
        return;
    }
    assert_eq!(std::env::var("RKNN_EMU_STRICT_RULES").as_deref(), Ok("1"));
    // The in-process emulator with default options, as `llm-decode --backend emulator` opens it.
    let rt = Runtime::emulator(Platform::Rk3588).unwrap();
    assert_eq!(rt.shape_rules(), ShapeRules::strict(Platform::Rk3588));
    assert_strict_n_limit(&rt);
    println!("emulator: strict rules checked");
    // The drop-in under the same environment, on the NPU code path: the safe layer does not
    // know the library's rules, so the library itself refuses at rknn_matmul_create.
    if common::skip_reason(common::TestBackend::Dropin).is_some() {
        return;
    }
    let rt = Runtime::open(Backend::Npu, common::dropin_options()).unwrap();
    assert!(!rt.is_emulator());
    let e = rt.matmul::<I8xI8ToI32>(1, 32, 8192).build().unwrap_err();
    assert!(
        matches!(
            &e,
            Error::Rknn {
                call: Call::MatmulCreate,
                code: RknnCode::ParamInvalid,
                detail: Some(d),
                ..
            } if d.contains("4096")
        ),
        "{e}"
    );
    let mm = rt.matmul::<I8xI8ToI32>(1, 32, 4096).build().unwrap();
    assert_eq!(mm.shape(), (1, 32, 4096));
    println!("dropin: strict rules checked");
}

/// `RKNN_EMU_STRICT_RULES=1` in a program's environment reaches the in-process emulator of
/// `RuntimeOptions::default()` and the drop-in library alike: the same N = 8192 is refused by
/// both. The variable is read when the options are made (and by the drop-in when it is loaded,
/// once per process), so the check runs in a child process with its own environment.
#[test]
#[cfg_attr(miri, ignore = "a child process")]
fn strict_rules_in_the_environment_reach_both_emulators() {
    if std::env::var_os(STRICT_CHILD).is_some() {
        return;
    }
    let exe = std::env::current_exe().unwrap();
    // Under cargo's runner (qemu-user for aarch64) the child goes through the same runner.
    let runner = std::env::var("RKNPU_TEST_RUNNER").unwrap_or_default();
    let mut words = runner.split_whitespace();
    let mut cmd = match words.next() {
        None => std::process::Command::new(&exe),
        Some(program) => {
            let mut cmd = std::process::Command::new(program);
            cmd.args(words).arg(&exe);
            cmd
        }
    };
    cmd.args(["--exact", "strict_rules_child", "--nocapture"]);
    // Only the variable under test configures the emulators.
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("RKNN_EMU_") {
            cmd.env_remove(k);
        }
    }
    cmd.env("RKNN_EMU_STRICT_RULES", "1")
        .env("RKNN_EMU_LOG", "0")
        .env(STRICT_CHILD, "1");
    let Some(out) = common::run_child_test(&mut cmd) else {
        return;
    };
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("1 passed"),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("emulator: strict rules checked"),
        "{stdout}"
    );
    if common::skip_reason(common::TestBackend::Dropin).is_none() {
        assert!(stdout.contains("dropin: strict rules checked"), "{stdout}");
    }
}
