//! Board-only checks: here the runtime is not the emulator, so it is not the oracle the rest of
//! the suite shares with the layout code. They compare what this SDK computes on the host
//! (the engine's native B packing, native A packing and native C reading, all from `rknn-chip`)
//! with what Rockchip's runtime does itself.
//!
//! One body per test on every backend (`common::backend_test!`): on a board,
//! `RKNN_TEST_BACKEND=npu`. Skipped, with a message, where the runtime is an emulator (the
//! built-in one or the drop-in library); `RKNN_BOARD_TESTS_ON_EMULATOR=1` runs them there
//! anyway, which proves the test code but not the facts.

mod common;

use common::backend_test;
use rknn_matmul::rknn_chip::layout::{NativeB, pack_a_native, unpack_c_native};
use rknn_matmul::*;

/// Whether the comparison `what` runs on `rt`: on hardware, or anywhere with
/// `RKNN_BOARD_TESTS_ON_EMULATOR`; otherwise it is skipped with a message.
fn on_a_board(rt: &Runtime, what: &str) -> bool {
    if rt.is_hardware() || std::env::var_os("RKNN_BOARD_TESTS_ON_EMULATOR").is_some() {
        return true;
    }
    eprintln!(
        "skipped: {what} needs a real NPU (the runtime is {})",
        rt.selection_reason()
    );
    false
}

backend_test!(host_packed_native_b_equals_the_runtimes_converter);
/// The engine packs native B on the host (`NativeB::pack_from_nk`, with the tile the runtime
/// reports); the runtime's own converter must produce the same bytes.
fn host_packed_native_b_equals_the_runtimes_converter(rt: &Runtime) {
    if !on_a_board(
        rt,
        "comparing native B with rknn_B_normal_layout_to_native_layout",
    ) {
        return;
    }
    let mut rng = fastrand::Rng::with_seed(5);
    let seg = rt.platform().k_segment();
    let mut shapes = vec![(64, 32), (96, 64), (320, 96)];
    if let Some(s) = seg {
        shapes.push((s + 64, 32)); // the converter's K segmentation too
    }
    for (k, n) in shapes {
        let mm = rt
            .matmul::<I8xI8ToI32>(1, k, n)
            .b_layout(Layout::Native)
            .build()
            .unwrap();
        let b: Vec<i8> = (0..k * n).map(|_| rng.i8(..)).collect();
        let mut by_runtime = mm.alloc_b().unwrap();
        mm.b_to_native(&b, &mut by_runtime).unwrap();
        let (sn, sk) = mm.native_tile(Matrix::B).unwrap();
        let geo = NativeB::new(k, n, sn, sk, seg).expect("geometry");
        let bt: Vec<i8> = (0..n)
            .flat_map(|j| (0..k).map(move |x| (j, x)))
            .map(|(j, x)| b[x * n + j])
            .collect();
        let mut by_host = vec![0i8; geo.len()];
        geo.pack_from_nk(&bt, &mut by_host);
        assert_eq!(
            &by_runtime.as_slice()[..geo.len()],
            &by_host[..],
            "K={k} N={n}"
        );
    }
}

backend_test!(native_a_and_c_agree_with_a_normal_layout_run);
/// Native A written on the host and native C read on the host give the same product as a run
/// with every matrix in the normal layout.
fn native_a_and_c_agree_with_a_normal_layout_run(rt: &Runtime) {
    if !on_a_board(rt, "comparing native A/C with a NORM-layout run") {
        return;
    }
    let mut rng = fastrand::Rng::with_seed(6);
    for (m, k, n) in [(1, 64, 32), (5, 96, 64), (33, 160, 96)] {
        let a: Vec<i8> = (0..m * k).map(|_| rng.i8(..)).collect();
        let b: Vec<i8> = (0..k * n).map(|_| rng.i8(..)).collect();
        let norm = rt.matmul::<I8xI8ToI32>(m, k, n).build().unwrap();
        let (mut an, mut bn, mut cn) = (
            norm.alloc_a().unwrap(),
            norm.alloc_b().unwrap(),
            norm.alloc_c().unwrap(),
        );
        an.write(&a).unwrap();
        bn.write(&b).unwrap();
        norm.run(&an, &bn, &mut cn).unwrap();

        let native = rt
            .matmul::<I8xI8ToI32>(m, k, n)
            .ac_layout(Layout::Native)
            .build()
            .unwrap();
        let (mut aa, mut ba, mut ca) = (
            native.alloc_a().unwrap(),
            native.alloc_b().unwrap(),
            native.alloc_c().unwrap(),
        );
        let (sk, _) = native.native_tile(Matrix::A).unwrap();
        let (sn, _) = native.native_tile(Matrix::C).unwrap();
        pack_a_native(&a, m, k, sk, aa.as_mut_slice());
        ba.write(&b).unwrap();
        native.run(&aa, &ba, &mut ca).unwrap();
        let mut c = vec![0i32; m * n];
        unpack_c_native(ca.as_slice(), m, n, sn, &mut c);
        assert_eq!(&c[..], &cn.as_slice()[..m * n], "M={m} K={k} N={n}");
    }
}
