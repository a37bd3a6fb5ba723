//! The safe layer against naive references, and every misuse the API turns into a typed
//! error. One body per test, run on every backend by `common::backend_test!` (`::emulator`,
//! `::dropin`: the NPU code path on the drop-in library, `::npu`: a board).

mod common;

use common::{backend_test, naive_i8, runtime_for};
use half::f16;
use rknn_matmul::*;

fn as_i64<T: Copy + Into<i64>>(v: &[T]) -> Vec<i64> {
    v.iter().map(|&x| x.into()).collect()
}

backend_test!(i8_matmul_matches_a_naive_gemm_in_every_layout);
fn i8_matmul_matches_a_naive_gemm_in_every_layout(rt: &Runtime) {
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
            assert_eq!(as_i64(&cm.as_slice()[..m * n]), want, "{bl:?} M={m}");
        }
    }
}

backend_test!(writes_after_a_run_are_bound_again_before_the_next);
fn writes_after_a_run_are_bound_again_before_the_next(rt: &Runtime) {
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

backend_test!(f16_and_dynamic_shapes_keep_b_bound);
fn f16_and_dynamic_shapes_keep_b_bound(rt: &Runtime) {
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
    let sk = mm.native_tile(Matrix::A).unwrap().0;
    assert_eq!(
        sk,
        rt.platform().tiles(MatmulType::F16_F16_F32).unwrap().a_k
    );
    b.as_mut_slice().fill(f16::from_f32(0.25));
    for m in [9, 1, 4] {
        mm.set_m(m).unwrap();
        assert_eq!(mm.shape(), (m, k, n));
        // Every element of A set to 1 (padding too), so the native layout does not matter.
        a.as_mut_slice().fill(f16::from_f32(1.0));
        mm.run(&a, &b, &mut c).unwrap();
        assert!(c.as_slice()[..m * n].iter().all(|&x| x == 16.0), "M={m}");
    }
    let e = mm.set_m(5).unwrap_err();
    assert!(
        matches!(&e, Error::UnknownM { m: 5, shapes } if shapes == &[1, 4, 9]),
        "{e}"
    );
    assert_eq!(
        e.to_string(),
        "M=5 is not one of this context's shapes (M = 1, 4, 9)"
    );
}

backend_test!(bad_shapes_and_types_are_typed_errors_before_any_ffi_call);
fn bad_shapes_and_types_are_typed_errors_before_any_ffi_call(rt: &Runtime) {
    let p = rt.platform();
    let e = rt.matmul::<I8xI8ToI32>(1, 64, 100).build().unwrap_err();
    assert_eq!(
        e.to_string(),
        format!("N=100 is not a multiple of 32 required for i8 on {p}")
    );
    for (m, k, n, dim) in [(0, 64, 64, "M"), (1, 0, 64, "K"), (1, 64, 0, "N")] {
        let e = rt.matmul::<I8xI8ToI32>(m, k, n).build().unwrap_err();
        assert!(
            matches!(e, Error::Rule(rknn_chip::RuleViolation::NotPositive { .. })),
            "{e}"
        );
        assert!(e.to_string().starts_with(&format!("{dim}=0 ")), "{e}");
    }
    // Above i32::MAX: refused, never truncated by a cast (K = 2^32 + 32 would reach the
    // runtime as 32).
    let e = rt
        .matmul::<I8xI8ToI32>(1, (1 << 32) + 32, 32)
        .build()
        .unwrap_err();
    assert!(e.to_string().contains("4294967328"), "{e}");
    // Sizes the runtime computes must fit its 32-bit fields.
    let e = rt
        .matmul::<I8xI8ToI32>(1 << 20, 1 << 14, 32)
        .build()
        .unwrap_err();
    assert!(matches!(e, Error::SizeOverflow { .. }), "{e}");
    let e = rt
        .matmul::<I8xI8ToI32>(1, 64, 64)
        .ac_layout(Layout::TpNorm)
        .build()
        .unwrap_err();
    assert!(e.to_string().contains("TP_NORM"), "{e}");
    let e = rt
        .matmul::<I8xI8ToI32>(1, 64, 64)
        .core(Core::Index(7))
        .build()
        .unwrap_err();
    assert!(matches!(e, Error::NoSuchCore { core: 7, .. }), "{e}");
    let e = rt
        .matmul::<I8xI8ToI32>(1, 64, 64)
        .dynamic_m(&[1, 1])
        .build()
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "dynamic M needs 1..=512 distinct values; got M=1 twice"
    );
    let e = rt
        .matmul::<I8xI8ToI32>(1, 64, 64)
        .dynamic_m(&[])
        .build()
        .unwrap_err();
    assert!(matches!(e, Error::DynamicShapes { .. }), "{e}");
}

backend_test!(quantisation_parameters_are_checked);
fn quantisation_parameters_are_checked(rt: &Runtime) {
    let Some(rt) = runtime_for(rt, Platform::Rk3588) else {
        return;
    };
    let build = |q: BQuant| rt.matmul::<I8xI8ToF32>(1, 64, 64).quant_b(q).build();
    let e = build(BQuant::PerChannel {
        scales: vec![1.0; 63],
        zps: vec![],
    })
    .unwrap_err();
    assert!(
        matches!(
            e,
            Error::QuantLength {
                matrix: Matrix::B,
                expected: 64,
                got: 63,
                ..
            }
        ),
        "{e}"
    );
    // Zero points shorter than N are refused too (not padded silently).
    let e = build(BQuant::PerChannel {
        scales: vec![1.0; 64],
        zps: vec![0; 10],
    })
    .unwrap_err();
    assert!(
        matches!(
            e,
            Error::QuantLength {
                what: "zero points",
                expected: 64,
                got: 10,
                ..
            }
        ),
        "{e}"
    );
    let e = build(BQuant::PerGroup {
        group_size: 48,
        scales: vec![],
        zps: vec![],
    })
    .unwrap_err();
    assert!(e.to_string().contains("group_size=48"), "{e}");
    let e = build(BQuant::PerGroup {
        group_size: 32,
        scales: vec![1.0; 2 * 64],
        zps: vec![1; 5],
    })
    .unwrap_err();
    assert!(
        matches!(
            e,
            Error::QuantLength {
                expected: 128,
                got: 5,
                ..
            }
        ),
        "{e}"
    );
    for bad in [f32::NAN, f32::INFINITY, -1.0, 0.0] {
        let e = build(BQuant::PerLayer { scale: bad, zp: 0 }).unwrap_err();
        assert!(
            matches!(
                e,
                Error::BadScale {
                    matrix: Matrix::B,
                    index: 0,
                    ..
                }
            ),
            "{e}"
        );
        let e = rt
            .matmul::<I8xI8ToF32>(1, 64, 64)
            .quant_a(LayerQuant { scale: bad, zp: 0 })
            .build()
            .unwrap_err();
        assert!(
            matches!(
                e,
                Error::BadScale {
                    matrix: Matrix::A,
                    ..
                }
            ),
            "{e}"
        );
    }
    let mut scales = vec![1.0; 64];
    scales[17] = f32::NAN;
    let e = build(BQuant::PerChannel {
        scales,
        zps: vec![],
    })
    .unwrap_err();
    assert!(matches!(e, Error::BadScale { index: 17, .. }), "{e}");
}

backend_test!(core_selection_and_quantised_types);
fn core_selection_and_quantised_types(rt: &Runtime) {
    let Some(rt) = runtime_for(rt, Platform::Rk3588) else {
        return;
    };
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

backend_test!(memories_of_another_context_or_matrix_are_refused);
fn memories_of_another_context_or_matrix_are_refused(rt: &Runtime) {
    let m1 = rt.matmul::<I8xI8ToI32>(1, 32, 32).build().unwrap();
    let m2 = rt.matmul::<I8xI8ToI32>(1, 32, 32).build().unwrap();
    let (a, b) = (m1.alloc_a().unwrap(), m1.alloc_b().unwrap());
    let mut c1 = m1.alloc_c().unwrap();
    let mut c2 = m2.alloc_c().unwrap();
    let e = m1.run(&a, &b, &mut c2).unwrap_err();
    assert!(
        matches!(e, Error::ForeignMemory { matrix: Matrix::C }),
        "{e}"
    );
    assert_eq!(
        e.to_string(),
        "C was allocated on another context (a memory can only be bound to the context it was allocated on)"
    );
    // An A memory passed as B type-checks (both i8) but is refused: on a board binding it would
    // be an out-of-bounds DMA whenever the sizes differ.
    let e = m1.run(&a, &a, &mut c1).unwrap_err();
    assert!(
        matches!(
            e,
            Error::WrongMatrix {
                allocated_for: Matrix::A,
                passed_as: Matrix::B
            }
        ),
        "{e}"
    );
    m1.run(&a, &b, &mut c1).unwrap();
}

backend_test!(any_drop_order_is_safe_and_everything_is_freed_once);
fn any_drop_order_is_safe_and_everything_is_freed_once(rt: &Runtime) {
    // A runtime of its own: its live-memory count is not shared with other tests.
    let rt = common::runtime_with(rt, |_| {});
    let live = rt.handle_budget().live();
    let mm = rt.matmul::<I8xI8ToI32>(1, 32, 32).build().unwrap();
    let (mut a, b, mut c) = (
        mm.alloc_a().unwrap(),
        mm.alloc_b().unwrap(),
        mm.alloc_c().unwrap(),
    );
    assert_eq!(rt.handle_budget().live(), live + 3);
    mm.run(&a, &b, &mut c).unwrap();
    // The context goes first: the memories keep it alive.
    drop(mm);
    a.as_mut_slice().fill(3);
    drop(b);
    drop(a);
    assert_eq!(rt.handle_budget().live(), live + 1);
    drop(c);
    assert_eq!(rt.handle_budget().live(), live);
    assert!(rt.take_release_errors().is_empty());
}

backend_test!(contexts_and_memories_move_to_other_threads);
fn contexts_and_memories_move_to_other_threads(rt: &Runtime) {
    let mm = rt.matmul::<I8xI8ToI32>(2, 64, 32).build().unwrap();
    let (mut a, mut b, mut c) = (
        mm.alloc_a().unwrap(),
        mm.alloc_b().unwrap(),
        mm.alloc_c().unwrap(),
    );
    a.as_mut_slice().fill(1);
    b.as_mut_slice().fill(2);
    // A context and its memories move to a worker thread together, as the engine's do.
    let c = std::thread::spawn(move || {
        mm.run(&a, &b, &mut c).unwrap();
        c
    })
    .join()
    .unwrap();
    assert!(c.as_slice()[..64].iter().all(|&x| x == 128));
    // Several threads, each with its own context of one shared runtime, at once.
    std::thread::scope(|s| {
        for t in 0..4i8 {
            let rt = rt.clone();
            s.spawn(move || {
                let mm = rt.matmul::<I8xI8ToI32>(1, 32, 32).build().unwrap();
                let (mut a, mut b, mut c) = (
                    mm.alloc_a().unwrap(),
                    mm.alloc_b().unwrap(),
                    mm.alloc_c().unwrap(),
                );
                for i in 0..20i8 {
                    a.as_mut_slice().fill(t);
                    b.as_mut_slice().fill(i);
                    mm.run(&a, &b, &mut c).unwrap();
                    assert!(
                        c.as_slice()
                            .iter()
                            .all(|&x| x == 32 * i32::from(t) * i32::from(i))
                    );
                }
            });
        }
    });
    // A memory dropped on another thread than its context's.
    let mm = rt.matmul::<I8xI8ToI32>(1, 32, 32).build().unwrap();
    let a = mm.alloc_a().unwrap();
    std::thread::spawn(move || drop(a)).join().unwrap();
    drop(mm);
    assert!(rt.take_release_errors().is_empty());
}

backend_test!(the_handle_budget_is_a_typed_error_before_the_runtime_fails);
fn the_handle_budget_is_a_typed_error_before_the_runtime_fails(rt: &Runtime) {
    if let Some(l) = rt.fd_limit() {
        // Sized from the (raised) fd limit, keeping room for the process's other files.
        assert!(rt.handle_budget().budget() < l.soft as usize, "{l:?}");
    }
    let rt = common::runtime_with(rt, |o| o.handle_budget = Some(5));
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
}

backend_test!(capabilities_and_schemes);
fn capabilities_and_schemes(rt: &Runtime) {
    let caps = rt.capabilities();
    let p = rt.platform();
    for c in &caps {
        assert_eq!(c.supported, p.accepts(c.matmul_type), "{c:?}");
    }
    if p == Platform::Rk3588 {
        for s in [Scheme::W8A16, Scheme::W4A16, Scheme::W4A8] {
            let e = rt.require(s).unwrap_err().to_string();
            assert!(
                e.contains("no weight-only") && e.contains("W4A4") && e.contains("outliers"),
                "{e}"
            );
        }
        assert_eq!(rt.require(Scheme::W4A4).unwrap(), [MatmulType::I4_I4_I16]);
    }
}

backend_test!(int4_w4a4_runs_with_native_b_from_the_converter);
fn int4_w4a4_runs_with_native_b_from_the_converter(rt: &Runtime) {
    let Some(rt) = runtime_for(rt, Platform::Rk3588) else {
        return;
    };
    let (m, k, n) = (3, 64, 64);
    let mut rng = fastrand::Rng::with_seed(44);
    let a: Vec<i8> = (0..m * k).map(|_| rng.i8(-8..=7)).collect();
    let b: Vec<i8> = (0..k * n).map(|_| rng.i8(-8..=7)).collect();
    // RK3588 refuses int4 with B in the normal layout ([hw]: it fails at set_io_mem).
    let e = rt.matmul::<I4xI4ToI16>(m, k, n).build().unwrap_err();
    assert!(e.to_string().contains("native"), "{e}");
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
    assert_eq!(as_i64(&cm.as_slice()[..m * n]), naive_i8(&a, &b, m, k, n));
    // The converter refuses a source of the wrong length, kind or range.
    let e = mm.b_to_native(&b[..10], &mut bm).unwrap_err();
    assert!(
        matches!(
            e,
            Error::Length {
                expected: 4096,
                got: 10,
                ..
            }
        ),
        "{e}"
    );
    let e = mm.b_to_native(&vec![0i16; k * n], &mut bm).unwrap_err();
    assert!(matches!(e, Error::ElementKind { .. }), "{e}");
    let mut bad = b.clone();
    bad[5] = 8;
    let e = mm.b_to_native(&bad, &mut bm).unwrap_err();
    assert!(
        matches!(
            e,
            Error::OutOfRange {
                index: 5,
                value: 8,
                ..
            }
        ),
        "{e}"
    );
}

backend_test!(i8_to_i8_with_an_asymmetric_output);
fn i8_to_i8_with_an_asymmetric_output(rt: &Runtime) {
    let Some(rt) = runtime_for(rt, Platform::Rk3588) else {
        return;
    };
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

backend_test!(allocation_flags_reach_the_runtime);
fn allocation_flags_reach_the_runtime(rt: &Runtime) {
    let mm = rt.matmul::<I8xI8ToI32>(1, 32, 32).build().unwrap();
    for flags in [
        MemFlags::CACHEABLE,
        MemFlags::NON_CACHEABLE,
        MemFlags::TRY_ALLOC_SRAM,
    ] {
        let (mut a, mut b, mut c) = (
            mm.alloc_a_with(flags).unwrap(),
            mm.alloc_b_with(flags).unwrap(),
            mm.alloc_c_with(flags).unwrap(),
        );
        a.as_mut_slice().fill(1);
        b.as_mut_slice().fill(1);
        mm.run(&a, &b, &mut c).unwrap();
        assert!(c.as_slice().iter().all(|&x| x == 32), "{flags:?}");
    }
}

#[test]
fn int4_packing_helpers() {
    for lo in -8..=7i8 {
        for hi in -8..=7i8 {
            assert_eq!(I4x2::new(lo, hi).get(), (lo, hi));
        }
    }
}

#[test]
fn error_codes_map() {
    for raw in -13..=-1 {
        let c = RknnCode::from_raw(raw);
        assert_eq!(c.raw(), raw);
        assert!(!matches!(c, RknnCode::Other(_)));
    }
    assert_eq!(RknnCode::from_raw(-99), RknnCode::Other(-99));
    assert!(RknnCode::from_raw(-10).suggests_version_skew());
    assert!(!RknnCode::from_raw(-5).suggests_version_skew());
}

backend_test!(shared_memories_serve_several_contexts_of_one_domain);
fn shared_memories_serve_several_contexts_of_one_domain(rt: &Runtime) {
    let mut rng = fastrand::Rng::with_seed(12);
    // Contexts of different K and N, one shared A and one shared C for all of them.
    let shapes = [(64, 32), (128, 96), (32, 64)];
    let ctxs: Vec<_> = shapes
        .iter()
        .map(|&(k, n)| rt.matmul::<I8xI8ToI32>(2, k, n).build().unwrap())
        .collect();
    let mut a = ctxs[0].alloc_shared_a(2 * 128).unwrap();
    let mut c = ctxs[0].alloc_shared_c(2 * 96).unwrap();
    assert!(a.is_shared() && c.is_shared());
    for round in 0..2 {
        for (mm, &(k, n)) in ctxs.iter().zip(&shapes) {
            let av: Vec<i8> = (0..2 * k).map(|_| rng.i8(..)).collect();
            let bv: Vec<i8> = (0..k * n).map(|_| rng.i8(..)).collect();
            let mut b = mm.alloc_b().unwrap();
            b.write(&bv).unwrap();
            a.write(&av).unwrap();
            mm.run(&a, &b, &mut c).unwrap();
            assert_eq!(
                as_i64(&c.as_slice()[..2 * n]),
                naive_i8(&av, &bv, 2, k, n),
                "round {round} K={k} N={n}"
            );
        }
    }
    // A shared memory too small for a context is refused, not bound.
    let small = ctxs[0].alloc_shared_a(1).unwrap();
    let (b1, mut c1) = (ctxs[1].alloc_b().unwrap(), ctxs[1].alloc_c().unwrap());
    let e = ctxs[1].run(&small, &b1, &mut c1).unwrap_err();
    assert!(
        matches!(
            e,
            Error::MemoryTooSmall {
                matrix: Matrix::A,
                ..
            }
        ),
        "{e}"
    );
    // Another IOMMU domain is another address space.
    let other = rt
        .matmul::<I8xI8ToI32>(2, 64, 32)
        .iommu_domain(1)
        .build()
        .unwrap();
    let (b2, mut c2) = (other.alloc_b().unwrap(), other.alloc_c().unwrap());
    let e = other.run(&a, &b2, &mut c2).unwrap_err();
    assert!(
        matches!(
            e,
            Error::DomainMismatch {
                matrix: Matrix::A,
                memory: 0,
                context: 1
            }
        ),
        "{e}"
    );
    // A memory of another runtime is foreign even when shared.
    let rt2 = common::runtime_with(rt, |_| {});
    let mm2 = rt2.matmul::<I8xI8ToI32>(2, 64, 32).build().unwrap();
    let (b3, mut c3) = (mm2.alloc_b().unwrap(), mm2.alloc_c().unwrap());
    let e = mm2.run(&a, &b3, &mut c3).unwrap_err();
    assert!(
        matches!(e, Error::ForeignMemory { matrix: Matrix::A }),
        "{e}"
    );
}
