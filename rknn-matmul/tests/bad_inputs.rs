//! The bad-input table of the safe layer and the engine: every case is one bad request (a
//! shape rule of each chip, a type a chip lacks, zero, huge and overflowing dimensions,
//! foreign and mismatched memories, quantisation parameters that are NaN, infinite, negative
//! or of the wrong length, NaN and infinite activations), and asserts the exact typed error,
//! or the documented result, and that nothing panicked. Each case runs under `catch_unwind`,
//! so one failure does not hide the others; the table reports them all.
//!
//! Allocation-heavy cases run in a child process (this test binary again) whose address space
//! is limited to 4 GiB with `setrlimit(RLIMIT_AS)`, as on a 4 GiB board: there an allocation
//! the host cannot back must come back as a typed error, not an abort.
#![cfg(feature = "emulator")]

mod common;

use std::panic::{AssertUnwindSafe, catch_unwind};

use half::f16;
use rknn_matmul::engine::{Engine, EngineConfig, LinearOptions, Rotation, WeightFormat};
use rknn_matmul::rknn_chip::{Dim, MAX_DIM, MatmulType, RuleViolation};
use rknn_matmul::*;

/// One row of the table: a name and a check that returns what went wrong.
type Case = (&'static str, Box<dyn Fn() -> Result<(), String>>);

/// Evaluates `$e` (a `Result`) and checks that it is `Err($pat)` (with an optional guard).
macro_rules! expect_err {
    ($e:expr, $pat:pat $(if $guard:expr)?) => {{
        match $e {
            Err($pat) $(if $guard)? => Ok(()),
            other => Err(format!("got {:?}", other.map(|_| "Ok(..)"))),
        }
    }};
}

fn run_table(cases: Vec<Case>) {
    let mut failed = Vec::new();
    for (name, check) in &cases {
        match catch_unwind(AssertUnwindSafe(check)) {
            Ok(Ok(())) => {}
            Ok(Err(why)) => failed.push(format!("{name}: {why}")),
            Err(p) => {
                let msg = p
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                failed.push(format!("{name}: PANICKED {msg}"));
            }
        }
    }
    eprintln!(
        "{} bad-input cases: {} passed, {} failed",
        cases.len(),
        cases.len() - failed.len(),
        failed.len()
    );
    assert!(failed.is_empty(), "\n{}", failed.join("\n"));
}

fn emu(p: Platform) -> Runtime {
    // The emulator's defaults, whatever `RKNN_EMU_*` the test process inherits.
    let mut opts = RuntimeOptions {
        emulator: EmuConfig::default(),
        ..RuntimeOptions::default()
    };
    opts.emulator.strict_cache = true;
    opts.emulator.log_errors = false;
    Runtime::open(Backend::Emulator(p), opts).expect("the emulator opens")
}

fn engine(rt: &Runtime, cores: usize) -> Engine {
    let cfg = EngineConfig {
        cores: Some(cores),
        pinning: rknn_matmul::engine::topology::Pinning::None,
        ..EngineConfig::default()
    };
    Engine::new(rt, cfg).expect("an engine")
}

/// The (K, N) alignment of i8 and the N alignment of f16 on each chip, from the fact sheet §6
/// (written out here, not read from rknn-chip).
fn aligns(p: Platform) -> (usize, usize, usize) {
    match p {
        Platform::Rk3588 | Platform::Rk3576 => (32, 32, 16),
        Platform::Rk3562 => (32, 16, 8),
        Platform::Rk3566 | Platform::Rk3568 => (32, 16, 8),
    }
}

fn shape_rule_cases() -> Vec<Case> {
    let mut cases: Vec<Case> = Vec::new();
    for p in Platform::ALL {
        let (ka, na, f16na) = aligns(p);
        cases.push((
            leak(format!("{p}: i8 K not a multiple of {ka}")),
            Box::new(move || {
                let k = ka + ka / 2;
                expect_err!(
                    emu(p).matmul::<I8xI8ToI32>(1, k, na).build(),
                    Error::Rule(RuleViolation::Misaligned { dim: Dim::K, value, align, platform, .. })
                        if value == k && align == ka && platform == p
                )
            }),
        ));
        cases.push((
            leak(format!("{p}: i8 N not a multiple of {na}")),
            Box::new(move || {
                let n = na + na / 2;
                expect_err!(
                    emu(p).matmul::<I8xI8ToI32>(1, ka, n).build(),
                    Error::Rule(RuleViolation::Misaligned { dim: Dim::N, value, align, .. })
                        if value == n && align == na
                )
            }),
        ));
        cases.push((
            leak(format!("{p}: f16 N not a multiple of {f16na}")),
            Box::new(move || {
                let n = f16na / 2;
                expect_err!(
                    emu(p).matmul::<F16xF16ToF32>(1, 32, n).build(),
                    Error::Rule(RuleViolation::Misaligned { dim: Dim::N, value, align, .. })
                        if value == n && align == f16na
                )
            }),
        ));
        // K beyond the header's 10240: refused everywhere but RK3588, which ran K = 15360.
        cases.push((
            leak(format!("{p}: K = 10272 against the 10240 limit")),
            Box::new(move || {
                let r = emu(p).matmul::<I8xI8ToI32>(1, 10272, 32).build();
                if p == Platform::Rk3588 {
                    return r
                        .map(drop)
                        .map_err(|e| format!("RK3588 has no K limit: {e}"));
                }
                expect_err!(
                    r,
                    Error::Rule(RuleViolation::TooLarge {
                        dim: Dim::K,
                        value: 10272,
                        max: 10240,
                        ..
                    })
                )
            }),
        ));
    }
    // A type each chip lacks (fact sheet §5).
    type Build = fn(&Runtime) -> Result<()>;
    let lacks: [(Platform, MatmulType, Build); 5] = [
        (Platform::Rk3588, MatmulType::F16_I4_F32, |rt| {
            rt.matmul::<F16xI4ToF32>(1, 64, 64).build().map(drop)
        }),
        (Platform::Rk3576, MatmulType::I4_I4_I16, |rt| {
            rt.matmul::<I4xI4ToI16>(1, 64, 64).build().map(drop)
        }),
        (Platform::Rk3562, MatmulType::F16_F16_F16, |rt| {
            rt.matmul::<F16xF16ToF16>(1, 64, 64).build().map(drop)
        }),
        (Platform::Rk3566, MatmulType::I8_I8_F32, |rt| {
            rt.matmul::<I8xI8ToF32>(1, 64, 64).build().map(drop)
        }),
        (Platform::Rk3568, MatmulType::I8_I8_I8, |rt| {
            rt.matmul::<I8xI8ToI8>(1, 64, 64).build().map(drop)
        }),
    ];
    for (p, t, build) in lacks {
        cases.push((
            leak(format!("{p}: {} is not supported", t.c_name())),
            Box::new(move || {
                expect_err!(
                    build(&emu(p)),
                    Error::Rule(RuleViolation::UnsupportedType { platform, t: got })
                        if platform == p && got == t
                )
            }),
        ));
    }
    cases.push((
        "RK3588: W4A4 with B in the normal layout",
        Box::new(|| {
            expect_err!(
                emu(Platform::Rk3588)
                    .matmul::<I4xI4ToI16>(1, 64, 64)
                    .build(),
                Error::Rule(RuleViolation::NeedsNativeB { .. })
            )
        }),
    ));
    cases.push((
        "RK3566: a core index on a single-core chip",
        Box::new(|| {
            expect_err!(
                emu(Platform::Rk3566)
                    .matmul::<I8xI8ToI32>(1, 32, 32)
                    .core(Core::Index(0))
                    .build(),
                Error::NoSuchCore {
                    core: 0,
                    cores: 1,
                    selectable: false,
                    ..
                }
            )
        }),
    ));
    cases.push((
        "RK3588: core 3 of 3",
        Box::new(|| {
            expect_err!(
                emu(Platform::Rk3588)
                    .matmul::<I8xI8ToI32>(1, 32, 32)
                    .core(Core::Index(3))
                    .build(),
                Error::NoSuchCore {
                    core: 3,
                    cores: 3,
                    selectable: true,
                    ..
                }
            )
        }),
    ));
    cases
}

fn dimension_cases() -> Vec<Case> {
    let rt = || emu(Platform::Rk3588);
    vec![
        (
            "M = 0",
            Box::new(move || {
                expect_err!(
                    rt().matmul::<I8xI8ToI32>(0, 32, 32).build(),
                    Error::Rule(RuleViolation::NotPositive { dim: Dim::M, .. })
                )
            }),
        ),
        (
            "K = i32::MAX + 1 (would truncate in the C struct)",
            Box::new(move || {
                expect_err!(
                    rt().matmul::<I8xI8ToI32>(1, MAX_DIM + 1, 32).build(),
                    Error::Rule(RuleViolation::DimTooLarge { dim: Dim::K, value, .. }) if value == MAX_DIM + 1
                )
            }),
        ),
        (
            "N = usize::MAX",
            Box::new(move || {
                expect_err!(
                    rt().matmul::<I8xI8ToI32>(1, 32, usize::MAX).build(),
                    Error::Rule(RuleViolation::DimTooLarge { dim: Dim::N, .. })
                )
            }),
        ),
        (
            "K × N beyond the runtime's 32-bit sizes",
            Box::new(move || {
                expect_err!(
                    rt().matmul::<I8xI8ToI32>(1, 1 << 16, 1 << 16).build(),
                    Error::SizeOverflow {
                        what: "elements of B (K × N)",
                        ..
                    }
                )
            }),
        ),
        (
            "a dynamic M list of M values that overflow with N",
            Box::new(move || {
                expect_err!(
                    rt().matmul::<I8xI8ToI32>(1, 32, 1 << 20)
                        .dynamic_m(&[1, 1 << 11])
                        .build(),
                    Error::SizeOverflow {
                        what: "elements of C (M × N)",
                        ..
                    }
                )
            }),
        ),
        (
            "513 dynamic M values",
            Box::new(move || {
                let ms: Vec<usize> = (1..=513).collect();
                expect_err!(
                    rt().matmul::<I8xI8ToI32>(1, 32, 32).dynamic_m(&ms).build(),
                    Error::DynamicShapes { max: 512, ref ms } if ms.len() == 513
                )
            }),
        ),
        (
            "A/C in the TP_NORM layout (a layout of B only)",
            Box::new(move || {
                expect_err!(
                    rt().matmul::<I8xI8ToI32>(1, 32, 32)
                        .ac_layout(Layout::TpNorm)
                        .build(),
                    Error::Rule(RuleViolation::BadLayout {
                        matrix: "A/C",
                        value: 2
                    })
                )
            }),
        ),
        (
            "strict rules: N = 8192 beyond the user guide's 4096",
            Box::new(|| {
                let opts = RuntimeOptions {
                    strict_shape_rules: true,
                    emulator: EmuConfig::default(),
                    ..RuntimeOptions::default()
                };
                let rt = Runtime::open(Backend::Emulator(Platform::Rk3588), opts).expect("open");
                expect_err!(
                    rt.matmul::<I8xI8ToI32>(1, 32, 8192).build(),
                    Error::Rule(RuleViolation::TooLarge {
                        dim: Dim::N,
                        value: 8192,
                        max: 4096,
                        ..
                    })
                )
            }),
        ),
    ]
}

fn quant_cases() -> Vec<Case> {
    let rt = || emu(Platform::Rk3588);
    let b = move |q: BQuant| {
        rt().matmul::<I8xI8ToF32>(1, 64, 64)
            .quant_b(q)
            .build()
            .map(drop)
    };
    let mut cases: Vec<Case> = Vec::new();
    for (what, bad) in [
        ("NaN", f32::NAN),
        ("+inf", f32::INFINITY),
        ("negative", -0.5),
        ("zero", 0.0),
    ] {
        cases.push((
            leak(format!("B per-channel scale #5 {what}")),
            Box::new(move || {
                let mut scales = vec![1.0; 64];
                scales[5] = bad;
                expect_err!(
                    b(BQuant::PerChannel { scales, zps: vec![] }),
                    Error::BadScale { matrix: Matrix::B, index: 5, value } if value.to_bits() == bad.to_bits()
                )
            }),
        ));
    }
    cases.push((
        "A scale -inf",
        Box::new(move || {
            expect_err!(
                rt().matmul::<I8xI8ToF32>(1, 64, 64)
                    .quant_a(LayerQuant {
                        scale: f32::NEG_INFINITY,
                        zp: 0
                    })
                    .build(),
                Error::BadScale {
                    matrix: Matrix::A,
                    index: 0,
                    ..
                }
            )
        }),
    ));
    cases.push((
        "C scale NaN (i8 output)",
        Box::new(move || {
            expect_err!(
                rt().matmul::<I8xI8ToI8>(1, 64, 64)
                    .quant_c(LayerQuant {
                        scale: f32::NAN,
                        zp: 3
                    })
                    .build(),
                Error::BadScale {
                    matrix: Matrix::C,
                    index: 0,
                    ..
                }
            )
        }),
    ));
    cases.push((
        "a subnormal scale is positive and finite: accepted",
        Box::new(move || {
            b(BQuant::PerLayer {
                scale: f32::from_bits(1),
                zp: 0,
            })
            .map_err(|e| e.to_string())
        }),
    ));
    cases.push((
        "63 per-channel scales for N = 64",
        Box::new(move || {
            expect_err!(
                b(BQuant::PerChannel {
                    scales: vec![1.0; 63],
                    zps: vec![]
                }),
                Error::QuantLength {
                    matrix: Matrix::B,
                    what: "scales",
                    expected: 64,
                    got: 63,
                    ..
                }
            )
        }),
    ));
    cases.push((
        "65 per-channel zero points for N = 64",
        Box::new(move || {
            expect_err!(
                b(BQuant::PerChannel {
                    scales: vec![1.0; 64],
                    zps: vec![0; 65]
                }),
                Error::QuantLength {
                    what: "zero points",
                    expected: 64,
                    got: 65,
                    ..
                }
            )
        }),
    ));
    cases.push((
        "group size 0",
        Box::new(move || {
            expect_err!(
                b(BQuant::PerGroup {
                    group_size: 0,
                    scales: vec![],
                    zps: vec![]
                }),
                Error::Rule(RuleViolation::BadGroupSize {
                    group_size: 0,
                    k: 64
                })
            )
        }),
    ));
    cases.push((
        "group size 48 does not divide K = 64",
        Box::new(move || {
            expect_err!(
                b(BQuant::PerGroup {
                    group_size: 48,
                    scales: vec![1.0; 64],
                    zps: vec![]
                }),
                Error::Rule(RuleViolation::BadGroupSize {
                    group_size: 48,
                    k: 64
                })
            )
        }),
    ));
    cases.push((
        "group size 65536 beyond the C struct's int16",
        Box::new(move || {
            expect_err!(
                rt().matmul::<I8xI8ToF32>(1, 65536, 32)
                    .quant_b(BQuant::PerGroup {
                        group_size: 65536,
                        scales: vec![1.0; 32],
                        zps: vec![]
                    })
                    .build(),
                Error::Rule(RuleViolation::BadGroupSize {
                    group_size: 65536,
                    ..
                })
            )
        }),
    ));
    cases
}

fn memory_cases() -> Vec<Case> {
    let rt = || emu(Platform::Rk3588);
    vec![
        (
            "C of another context",
            Box::new(move || {
                let rt = rt();
                let (m1, m2) = (
                    rt.matmul::<I8xI8ToI32>(1, 32, 32).build().unwrap(),
                    rt.matmul::<I8xI8ToI32>(1, 32, 32).build().unwrap(),
                );
                let (a, b, mut c) = (
                    m1.alloc_a().unwrap(),
                    m1.alloc_b().unwrap(),
                    m2.alloc_c().unwrap(),
                );
                expect_err!(
                    m1.run(&a, &b, &mut c),
                    Error::ForeignMemory { matrix: Matrix::C }
                )
            }),
        ),
        (
            "a shared A of another runtime",
            Box::new(move || {
                let (r1, r2) = (rt(), rt());
                let m1 = r1.matmul::<I8xI8ToI32>(1, 32, 32).build().unwrap();
                let m2 = r2.matmul::<I8xI8ToI32>(1, 32, 32).build().unwrap();
                let a = m2.alloc_shared_a(0).unwrap();
                let (b, mut c) = (m1.alloc_b().unwrap(), m1.alloc_c().unwrap());
                expect_err!(
                    m1.run(&a, &b, &mut c),
                    Error::ForeignMemory { matrix: Matrix::A }
                )
            }),
        ),
        (
            "A passed as B",
            Box::new(move || {
                let rt = rt();
                let mm = rt.matmul::<I8xI8ToI32>(1, 32, 32).build().unwrap();
                let (a, mut c) = (mm.alloc_a().unwrap(), mm.alloc_c().unwrap());
                expect_err!(
                    mm.run(&a, &a, &mut c),
                    Error::WrongMatrix {
                        allocated_for: Matrix::A,
                        passed_as: Matrix::B
                    }
                )
            }),
        ),
        (
            "a shared A too small for a larger context",
            Box::new(move || {
                let rt = rt();
                let small = rt.matmul::<I8xI8ToI32>(1, 32, 32).build().unwrap();
                let big = rt.matmul::<I8xI8ToI32>(4, 32, 32).build().unwrap();
                let a = small.alloc_shared_a(0).unwrap();
                let (b, mut c) = (big.alloc_b().unwrap(), big.alloc_c().unwrap());
                expect_err!(
                    big.run(&a, &b, &mut c),
                    Error::MemoryTooSmall {
                        matrix: Matrix::A,
                        bytes: 32,
                        needed: 128
                    }
                )
            }),
        ),
        (
            "a shared C of IOMMU domain 1 on a context of domain 0",
            Box::new(move || {
                let rt = rt();
                let d0 = rt.matmul::<I8xI8ToI32>(1, 32, 32).build().unwrap();
                let d1 = rt
                    .matmul::<I8xI8ToI32>(1, 32, 32)
                    .iommu_domain(1)
                    .build()
                    .unwrap();
                let (a, b, mut c) = (
                    d0.alloc_a().unwrap(),
                    d0.alloc_b().unwrap(),
                    d1.alloc_shared_c(0).unwrap(),
                );
                expect_err!(
                    d0.run(&a, &b, &mut c),
                    Error::DomainMismatch {
                        matrix: Matrix::C,
                        memory: 1,
                        context: 0
                    }
                )
            }),
        ),
        (
            "set_m with an M the context was not made for",
            Box::new(move || {
                let rt = rt();
                let mm = rt
                    .matmul::<I8xI8ToI32>(1, 32, 32)
                    .dynamic_m(&[1, 4])
                    .build()
                    .unwrap();
                expect_err!(mm.set_m(2), Error::UnknownM { m: 2, ref shapes } if shapes == &[1, 4])
            }),
        ),
        (
            "a write longer than the memory",
            Box::new(move || {
                let rt = rt();
                let mm = rt.matmul::<I8xI8ToI32>(1, 32, 32).build().unwrap();
                let mut a = mm.alloc_a().unwrap();
                expect_err!(
                    a.write(&[1i8; 33]),
                    Error::Length {
                        expected: 32,
                        got: 33,
                        ..
                    }
                )
            }),
        ),
        (
            "b_to_native on a context with B in the normal layout",
            Box::new(move || {
                let rt = rt();
                let mm = rt.matmul::<I8xI8ToI32>(1, 32, 32).build().unwrap();
                let mut b = mm.alloc_b().unwrap();
                expect_err!(
                    mm.b_to_native(&[0i8; 32 * 32], &mut b),
                    Error::NeedsNativeB {
                        layout: Layout::Norm,
                        ..
                    }
                )
            }),
        ),
        (
            "b_to_native from a source of the wrong length",
            Box::new(move || {
                let rt = rt();
                let mm = rt
                    .matmul::<I8xI8ToI32>(1, 32, 32)
                    .b_layout(Layout::Native)
                    .build()
                    .unwrap();
                let mut b = mm.alloc_b().unwrap();
                expect_err!(
                    mm.b_to_native(&[0i8; 32 * 31], &mut b),
                    Error::Length {
                        expected: 1024,
                        got: 992,
                        ..
                    }
                )
            }),
        ),
        (
            "b_to_native from f16 values into an i8 B",
            Box::new(move || {
                let rt = rt();
                let mm = rt
                    .matmul::<I8xI8ToI32>(1, 32, 32)
                    .b_layout(Layout::Native)
                    .build()
                    .unwrap();
                let mut b = mm.alloc_b().unwrap();
                expect_err!(
                    mm.b_to_native(&[f16::ONE; 32 * 32], &mut b),
                    Error::ElementKind {
                        what: "B source",
                        ..
                    }
                )
            }),
        ),
        (
            "int4 B source value 8 outside -8..=7",
            Box::new(move || {
                let rt = rt();
                let mm = rt
                    .matmul::<I4xI4ToI16>(1, 64, 64)
                    .b_layout(Layout::Native)
                    .build()
                    .unwrap();
                let mut b = mm.alloc_b().unwrap();
                let mut src = vec![0i8; 64 * 64];
                src[100] = 8;
                expect_err!(
                    mm.b_to_native(&src, &mut b),
                    Error::OutOfRange {
                        index: 100,
                        value: 8,
                        ..
                    }
                )
            }),
        ),
        (
            "the sixth memory under a budget of five",
            Box::new(|| {
                let opts = RuntimeOptions {
                    handle_budget: Some(5),
                    emulator: EmuConfig::default(),
                    ..RuntimeOptions::default()
                };
                let rt = Runtime::open(Backend::Emulator(Platform::Rk3588), opts).expect("open");
                let mm = rt.matmul::<I8xI8ToI32>(1, 32, 32).build().unwrap();
                let _held: Vec<_> = (0..5).map(|_| mm.alloc_a().unwrap()).collect();
                expect_err!(mm.alloc_a(), Error::HandleBudget { live: 5, budget: 5 })
            }),
        ),
    ]
}

fn engine_cases() -> Vec<Case> {
    let rt = || emu(Platform::Rk3588);
    let w: Vec<f32> = (0..8 * 64)
        .map(|i| ((i * 37 % 19) as f32 - 9.0) / 4.0)
        .collect();
    let w2 = w.clone();
    let w3 = w.clone();
    vec![
        (
            "engine: weights of the wrong length",
            Box::new(move || {
                expect_err!(
                    engine(&rt(), 1).linear(&[0.0; 10], 3, 4, WeightFormat::W8A8),
                    Error::Length {
                        what: "weights (n × k)",
                        expected: 12,
                        got: 10
                    }
                )
            }),
        ),
        (
            "engine: N = 0",
            Box::new(move || {
                expect_err!(
                    engine(&rt(), 1).linear(&[], 0, 4, WeightFormat::F16),
                    Error::Rule(RuleViolation::NotPositive { dim: Dim::N, .. })
                )
            }),
        ),
        (
            "engine: K beyond the exact i32 sum",
            Box::new(move || {
                let k = rknn_matmul::engine::MAX_EXACT_K_W8A8 + 1;
                expect_err!(
                    engine(&rt(), 1).linear_quantized(&vec![0; k], &[1.0], 1, k),
                    Error::KTooLargeForExactSum { .. }
                )
            }),
        ),
        (
            "engine: quantised weight -128",
            Box::new(move || {
                let mut q = vec![1i8; 2 * 32];
                q[40] = i8::MIN;
                expect_err!(
                    engine(&rt(), 1).linear_quantized(&q, &[1.0, 1.0], 2, 32),
                    Error::OutOfRange {
                        index: 40,
                        value: -128,
                        ..
                    }
                )
            }),
        ),
        (
            "engine: one weight scale for two channels",
            Box::new(move || {
                expect_err!(
                    engine(&rt(), 1).linear_quantized(&[1; 64], &[1.0], 2, 32),
                    Error::Length {
                        expected: 2,
                        got: 1,
                        ..
                    }
                )
            }),
        ),
        (
            "engine: a rotation of 128 channels on a linear of 64",
            Box::new(move || {
                let opts = LinearOptions {
                    rotation: Some(Rotation::hadamard(128, 7)),
                    ..LinearOptions::default()
                };
                expect_err!(
                    engine(&rt(), 1).linear_with(&w, 8, 64, WeightFormat::W8A8, opts),
                    Error::Length {
                        what: "rotation channels (in_features)",
                        expected: 64,
                        got: 128
                    }
                )
            }),
        ),
        (
            "engine: x of the wrong length, out of the wrong length, m × K overflowing",
            Box::new(move || {
                let e = engine(&rt(), 1);
                let lin = e.linear(&w2, 8, 64, WeightFormat::W8A8).unwrap();
                let mut out = vec![0.0; 8];
                expect_err!(
                    lin.forward(&[0.0; 63], 1, &mut out),
                    Error::Length {
                        what: "x (m × in_features)",
                        ..
                    }
                )?;
                expect_err!(
                    lin.forward(&[0.0; 64], 1, &mut out[..7]),
                    Error::Length {
                        what: "out (m × out_features)",
                        ..
                    }
                )?;
                expect_err!(
                    lin.forward(&[0.0; 64], usize::MAX / 8, &mut out),
                    Error::SizeOverflow { .. }
                )
            }),
        ),
        (
            "engine: max_m not a multiple of 128",
            Box::new(move || {
                let cfg = EngineConfig {
                    max_m: 300,
                    ..EngineConfig::default()
                };
                expect_err!(
                    Engine::new(&rt(), cfg),
                    Error::EngineConfig {
                        field: "max_m",
                        value: 300,
                        ..
                    }
                )
            }),
        ),
        (
            "engine: 0 cores and 4 cores on RK3588",
            Box::new(move || {
                for cores in [0, 4] {
                    let cfg = EngineConfig {
                        cores: Some(cores),
                        ..EngineConfig::default()
                    };
                    expect_err!(
                        Engine::new(&rt(), cfg),
                        Error::EngineConfig { field: "cores", .. }
                    )?;
                }
                Ok(())
            }),
        ),
        (
            "engine: an IOMMU domain smaller than one linear",
            Box::new(move || {
                let cfg = EngineConfig {
                    cores: Some(1),
                    iommu_domain_bytes: 1024,
                    pinning: rknn_matmul::engine::topology::Pinning::None,
                    ..EngineConfig::default()
                };
                let e = Engine::new(&rt(), cfg).unwrap();
                expect_err!(
                    e.linear(&w3, 8, 64, WeightFormat::W8A8),
                    Error::EngineConfig {
                        field: "iommu_domain_bytes",
                        value: 1024,
                        ..
                    }
                )
            }),
        ),
    ]
}

/// NaN and infinite activations: the documented results (glue::quantize_rows).
fn activation_cases() -> Vec<Case> {
    let (n, k) = (8, 64);
    let w: Vec<f32> = (0..n * k)
        .map(|i| ((i * 29 % 23) as f32 - 11.0) / 8.0)
        .collect();
    let x: Vec<f32> = (0..2 * k)
        .map(|i| ((i * 13 % 17) as f32 - 8.0) / 4.0)
        .collect();
    let (w1, x1) = (w.clone(), x.clone());
    let (w2, x2) = (w.clone(), x.clone());
    vec![
        (
            "W8A8: a NaN activation quantises to 0",
            Box::new(move || {
                let rt = emu(Platform::Rk3588);
                let lin = engine(&rt, 1).linear(&w, n, k, WeightFormat::W8A8).unwrap();
                let mut xn = x.clone();
                xn[5] = f32::NAN;
                let got = lin.forward_vec(&xn, 2).unwrap();
                let want = common::reference_w8a8(&xn, &w, 2, k, n);
                let same = got
                    .iter()
                    .zip(&want)
                    .all(|(g, r)| g.to_bits() == r.to_bits());
                same.then_some(()).ok_or(format!("{got:?} vs {want:?}"))
            }),
        ),
        (
            "W8A8: an infinite activation makes its row NaN, not the others",
            Box::new(move || {
                let rt = emu(Platform::Rk3588);
                let lin = engine(&rt, 1)
                    .linear(&w1, n, k, WeightFormat::W8A8)
                    .unwrap();
                let mut xi = x1.clone();
                xi[k + 3] = f32::INFINITY;
                let got = lin.forward_vec(&xi, 2).unwrap();
                let want = common::reference_w8a8(&x1[..k], &w1, 1, k, n);
                let first = got[..n]
                    .iter()
                    .zip(&want)
                    .all(|(g, r)| g.to_bits() == r.to_bits());
                let second = got[n..].iter().all(|v| v.is_nan());
                (first && second).then_some(()).ok_or(format!("{got:?}"))
            }),
        ),
        (
            "F16: a NaN activation makes its row NaN, not the others",
            Box::new(move || {
                let rt = emu(Platform::Rk3588);
                let lin = engine(&rt, 1).linear(&w2, n, k, WeightFormat::F16).unwrap();
                let clean = lin.forward_vec(&x2, 2).unwrap();
                let mut xn = x2.clone();
                xn[7] = f32::NAN;
                let got = lin.forward_vec(&xn, 2).unwrap();
                let first = got[..n].iter().all(|v| v.is_nan());
                let second = got[n..]
                    .iter()
                    .zip(&clean[n..])
                    .all(|(g, c)| g.to_bits() == c.to_bits());
                (first && second).then_some(()).ok_or(format!("{got:?}"))
            }),
        ),
    ]
}

/// Names built at run time live for the whole test.
fn leak(s: String) -> &'static str {
    Box::leak(s.into_boxed_str())
}

#[test]
#[cfg_attr(
    miri,
    ignore = "the table opens dozens of emulators: too slow under Miri"
)]
fn every_bad_input_is_a_typed_error_or_its_documented_result() {
    let mut cases = shape_rule_cases();
    cases.extend(dimension_cases());
    cases.extend(quant_cases());
    cases.extend(memory_cases());
    cases.extend(engine_cases());
    cases.extend(activation_cases());
    run_table(cases);
}

/// The address space a child case gets: a 4 GiB board.
const BOARD_BYTES: u64 = 4 << 30;
const CHILD_VAR: &str = "RKNPU_BAD_INPUT_CHILD";

/// The allocation-heavy cases, each run in a child process under [`BOARD_BYTES`].
fn child_cases() -> Vec<Case> {
    vec![
        (
            "f16 A, B and C of 2, 2 and 4 GiB on a 4 GiB board",
            Box::new(|| {
                let rt = emu(Platform::Rk3588);
                let mm = rt
                    .matmul::<F16xF16ToF32>(32736, 32768, 32736)
                    .build()
                    .map_err(|e| e.to_string())?;
                let all = || -> Result<_> { Ok((mm.alloc_a()?, mm.alloc_b()?, mm.alloc_c()?)) };
                expect_err!(
                    all(),
                    Error::AllocFailed { call: Call::CreateMem, ref detail, .. }
                        if detail.as_deref().is_some_and(|d| d.contains("out of memory"))
                )?;
                // Every handle is back after the failure.
                (rt.handle_budget().live() == 0)
                    .then_some(())
                    .ok_or("a handle leaked".into())
            }),
        ),
        (
            "engine: a 24576 × 32768 linear (3 GiB of f32) on a 4 GiB board",
            Box::new(|| engine_too_big(24576, 32768)),
        ),
        (
            "engine: a 16384 × 32768 linear (2 GiB of f32) on a 4 GiB board",
            Box::new(|| engine_too_big(16384, 32768)),
        ),
    ]
}

/// Weights the board cannot hold next to the caller's f32 copy: a typed allocation error (of
/// the host's buffers or the NPU memory), never an abort; if it fits, the result must be right.
fn engine_too_big(n: usize, k: usize) -> Result<(), String> {
    let rt = emu(Platform::Rk3588);
    let e = engine(&rt, 1);
    let w = vec![0.5f32; n * k];
    match e.linear(&w, n, k, WeightFormat::W8A8) {
        Ok(lin) => {
            let y = lin
                .forward_vec(&vec![1.0; k], 1)
                .map_err(|e| e.to_string())?;
            let want = k as f32 * 0.5;
            y.iter()
                .all(|&v| (v - want).abs() <= want * 1e-6)
                .then_some(())
                .ok_or(format!("{:?}", &y[..4]))
        }
        Err(err @ (Error::AllocFailed { .. } | Error::HostAlloc { .. })) => {
            eprintln!("{err}");
            drop(e);
            // Everything it had made is freed again.
            (rt.handle_budget().live() == 0)
                .then_some(())
                .ok_or("a handle leaked".into())
        }
        Err(other) => Err(format!("{other}")),
    }
}

/// Runs one child case when this process is a child (`RKNPU_BAD_INPUT_CHILD` names it).
#[test]
#[cfg_attr(miri, ignore = "needs setrlimit and a child process")]
fn child_case() {
    let Ok(name) = std::env::var(CHILD_VAR) else {
        return;
    };
    let lim = libc::rlimit {
        rlim_cur: BOARD_BYTES as libc::rlim_t,
        rlim_max: BOARD_BYTES as libc::rlim_t,
    };
    // SAFETY: a valid rlimit; lowering our own limit has no other effect.
    let rc = unsafe { libc::setrlimit(libc::RLIMIT_AS, &lim) };
    assert_eq!(rc, 0, "setrlimit");
    let cases = child_cases();
    let (_, check) = cases
        .iter()
        .find(|(n, _)| *n == name)
        .expect("a known child case");
    if let Err(why) = check() {
        panic!("{name}: {why}");
    }
}

#[test]
#[cfg_attr(miri, ignore = "needs setrlimit and a child process")]
fn allocation_heavy_cases_under_a_4_gib_address_space() {
    if std::env::var_os(CHILD_VAR).is_some() {
        return;
    }
    // qemu-user maps the guest's address space inside its own: a 4 GiB limit on the emulator
    // process says nothing about the guest. Native x86-64 runs them; elsewhere on request.
    if !cfg!(target_arch = "x86_64") && std::env::var_os("RKNPU_RLIMIT_TESTS").is_none() {
        eprintln!("skipped: RLIMIT_AS cases run natively on x86-64 (set RKNPU_RLIMIT_TESTS=1)");
        return;
    }
    let exe = std::env::current_exe().expect("this test binary");
    let mut failed = Vec::new();
    for (name, _) in child_cases() {
        let out = std::process::Command::new(&exe)
            .args(["--exact", "child_case", "--nocapture", "--test-threads=1"])
            .env(CHILD_VAR, name)
            .output()
            .expect("run the child");
        if !out.status.success() {
            failed.push(format!(
                "{name}: {} {}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            ));
        }
    }
    eprintln!(
        "{} allocation-heavy cases under RLIMIT_AS = 4 GiB, {} failed",
        child_cases().len(),
        failed.len()
    );
    assert!(failed.is_empty(), "\n{}", failed.join("\n"));
}
