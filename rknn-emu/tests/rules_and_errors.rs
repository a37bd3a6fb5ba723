//! Every platform rule and every error path of the C API: misuse returns the documented code
//! and a reason, never a crash.

mod common;

use common::*;
use rknn_chip::{MatmulType, Platform};
use rknn_emu::last_error;
use rknn_sys::*;

fn create(
    emu: &rknn_emu::Emulator,
    info: rknn_matmul_info,
) -> Result<(rknn_matmul_ctx, rknn_matmul_io_attr), i32> {
    let mut info = info;
    let mut io = rknn_matmul_io_attr::default();
    let mut ctx = 0;
    // SAFETY: valid pointers.
    let rc = unsafe { (emu.api().rknn_matmul_create)(&mut ctx, &mut info, &mut io) };
    if rc == 0 { Ok((ctx, io)) } else { Err(rc) }
}

fn destroy(emu: &rknn_emu::Emulator, ctx: rknn_matmul_ctx) {
    // SAFETY: plain handle call.
    assert_eq!(unsafe { (emu.api().rknn_matmul_destroy)(ctx) }, 0);
}

fn info(t: rknn_matmul_type, m: i32, k: i32, n: i32) -> rknn_matmul_info {
    rknn_matmul_info {
        M: m,
        K: k,
        N: n,
        type_: t,
        ..Default::default()
    }
}

#[test]
fn each_chip_accepts_exactly_its_matmul_types() {
    for p in Platform::ALL {
        let emu = emulator(p);
        for raw in 0..=16u32 {
            let t = MatmulType::from_raw(raw);
            let accepted = t.is_some_and(|t| p.accepts(t));
            // K=64, N=64 satisfy every alignment of every chip.
            match create(&emu, info(raw, 1, 64, 64)) {
                Ok((ctx, _)) => {
                    assert!(accepted, "{p} accepted type {raw}");
                    destroy(&emu, ctx);
                }
                Err(rc) => {
                    assert!(!accepted, "{p} refused type {raw}: {}", last_error());
                    assert_eq!(rc, RKNN_ERR_PARAM_INVALID);
                }
            }
        }
    }
}

#[test]
fn rk3588_refuses_weight_only_types_with_the_reason() {
    let emu = emulator(Platform::Rk3588);
    for t in [
        RKNN_FLOAT16_MM_INT8_TO_FLOAT32,
        RKNN_FLOAT16_MM_INT4_TO_FLOAT32,
        RKNN_INT8_MM_INT4_TO_INT32,
    ] {
        assert_eq!(
            create(&emu, info(t, 1, 64, 64)).unwrap_err(),
            RKNN_ERR_PARAM_INVALID
        );
        let msg = last_error();
        assert!(
            msg.contains("no weight-only") && msg.contains("W4A4"),
            "{msg}"
        );
    }
}

#[test]
fn alignment_is_enforced_per_chip_and_element_type() {
    let cases = [
        (
            Platform::Rk3588,
            RKNN_INT8_MM_INT8_TO_INT32,
            64,
            100,
            "N=100 is not a multiple of 32 required for i8 on RK3588",
        ),
        (
            Platform::Rk3588,
            RKNN_INT8_MM_INT8_TO_INT32,
            48,
            64,
            "K=48 is not a multiple of 32 required for i8 on RK3588",
        ),
        (
            Platform::Rk3588,
            RKNN_FLOAT16_MM_FLOAT16_TO_FLOAT32,
            64,
            24,
            "N=24 is not a multiple of 16 required for f16 on RK3588",
        ),
        (
            Platform::Rk3588,
            RKNN_INT4_MM_INT4_TO_INT16,
            64,
            32,
            "N=32 is not a multiple of 64 required for i4 on RK3588",
        ),
        (
            Platform::Rk3566,
            RKNN_FLOAT16_MM_FLOAT16_TO_FLOAT32,
            24,
            8,
            "K=24 is not a multiple of 16 required for f16 on RK3566",
        ),
        (
            Platform::Rk3562,
            RKNN_FLOAT16_MM_FLOAT16_TO_FLOAT32,
            16,
            8,
            "K=16 is not a multiple of 32 required for f16 on RK3562",
        ),
    ];
    for (p, t, k, n, msg) in cases {
        let emu = emulator(p);
        assert_eq!(
            create(&emu, info(t, 1, k, n)).unwrap_err(),
            RKNN_ERR_PARAM_INVALID
        );
        assert!(last_error().contains(msg), "{} vs {msg}", last_error());
    }
    // The smallest aligned shapes are accepted.
    let emu = emulator(Platform::Rk3566);
    let (ctx, _) = create(&emu, info(RKNN_FLOAT16_MM_FLOAT16_TO_FLOAT32, 1, 16, 8)).unwrap();
    destroy(&emu, ctx);
}

#[test]
fn k_limits_follow_the_configured_rules() {
    // RK3588 runs K = 15360 (measured); the other chips keep the header's 10240.
    let emu = emulator(Platform::Rk3588);
    let (ctx, io) = create(&emu, info(RKNN_INT8_MM_INT8_TO_INT32, 1, 15360, 32)).unwrap();
    assert_eq!(io.B.size, 15360 * 32);
    destroy(&emu, ctx);
    let emu = emulator(Platform::Rk3566);
    assert_eq!(
        create(&emu, info(RKNN_INT8_MM_INT8_TO_INT32, 1, 10240 + 32, 32)).unwrap_err(),
        RKNN_ERR_PARAM_INVALID
    );
    assert!(
        last_error().contains("exceeds the limit of 10240"),
        "{}",
        last_error()
    );
    let mut cfg = rknn_emu::EmuConfig::new(Platform::Rk3588);
    cfg.rules = rknn_emu::RulesPolicy::Strict;
    let strict = rknn_emu::Emulator::new(cfg).unwrap();
    assert_eq!(
        create(&strict, info(RKNN_INT8_MM_INT8_TO_INT32, 1, 15360, 32)).unwrap_err(),
        RKNN_ERR_PARAM_INVALID
    );
    assert_eq!(
        create(&strict, info(RKNN_INT8_MM_INT8_TO_INT32, 1, 64, 8192)).unwrap_err(),
        RKNN_ERR_PARAM_INVALID
    );
    assert_eq!(
        create(&strict, info(RKNN_FLOAT16_MM_FLOAT16_TO_FLOAT32, 1, 64, 16)).unwrap_err(),
        RKNN_ERR_PARAM_INVALID
    );
}

#[test]
fn bad_info_fields_are_refused() {
    let emu = emulator(Platform::Rk3588);
    let base = info(RKNN_INT8_MM_INT8_TO_INT32, 1, 64, 64);
    let bad = [
        rknn_matmul_info { M: 0, ..base },
        rknn_matmul_info { K: -32, ..base },
        rknn_matmul_info { type_: 13, ..base },
        rknn_matmul_info {
            B_layout: 3,
            ..base
        },
        rknn_matmul_info {
            AC_layout: 2,
            ..base
        },
        rknn_matmul_info {
            B_quant_type: 6,
            ..base
        },
        rknn_matmul_info {
            B_quant_type: 4,
            group_size: 48,
            ..base
        },
    ];
    for i in bad {
        assert_eq!(
            create(&emu, i).unwrap_err(),
            RKNN_ERR_PARAM_INVALID,
            "{i:?}"
        );
    }
}

#[test]
fn core_masks_are_single_core_only() {
    let emu = emulator(Platform::Rk3588);
    let (ctx, _) = create(&emu, info(RKNN_INT8_MM_INT8_TO_INT32, 1, 64, 64)).unwrap();
    let set = emu.api().rknn_matmul_set_core_mask;
    // SAFETY: plain handle calls.
    unsafe {
        for ok in [
            RKNN_NPU_CORE_AUTO,
            RKNN_NPU_CORE_0,
            RKNN_NPU_CORE_1,
            RKNN_NPU_CORE_2,
        ] {
            assert_eq!(set(ctx, ok), 0, "mask {ok}");
        }
        for bad in [RKNN_NPU_CORE_0_1, RKNN_NPU_CORE_0_1_2, RKNN_NPU_CORE_ALL, 8] {
            assert_eq!(set(ctx, bad), RKNN_ERR_PARAM_INVALID, "mask {bad}");
        }
    }
    destroy(&emu, ctx);
    let emu = emulator(Platform::Rk3576);
    let (ctx, _) = create(&emu, info(RKNN_INT8_MM_INT8_TO_INT32, 1, 64, 64)).unwrap();
    // SAFETY: plain handle calls.
    unsafe {
        assert_eq!(
            (emu.api().rknn_matmul_set_core_mask)(ctx, RKNN_NPU_CORE_1),
            0
        );
        assert_eq!(
            (emu.api().rknn_matmul_set_core_mask)(ctx, RKNN_NPU_CORE_2),
            RKNN_ERR_PARAM_INVALID
        );
    }
    destroy(&emu, ctx);
    let emu = emulator(Platform::Rk3568);
    let (ctx, _) = create(&emu, info(RKNN_INT8_MM_INT8_TO_INT32, 1, 64, 64)).unwrap();
    // SAFETY: a plain handle call.
    let rc = unsafe { (emu.api().rknn_matmul_set_core_mask)(ctx, RKNN_NPU_CORE_0) };
    assert_eq!(rc, RKNN_ERR_FAIL);
    destroy(&emu, ctx);
}

fn name(attr: &rknn_matmul_tensor_attr) -> String {
    attr.name
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| char::from(c.to_ne_bytes()[0]))
        .collect()
}

#[test]
fn io_attr_reports_names_dims_sizes_and_types() {
    let emu = emulator(Platform::Rk3588);
    // Normal layouts: 2-D.
    let (ctx, io) = create(&emu, info(RKNN_INT8_MM_INT8_TO_INT32, 5, 96, 64)).unwrap();
    assert_eq!([name(&io.A), name(&io.B), name(&io.C)], ["A", "B", "C"]);
    assert_eq!(
        (io.A.n_dims, &io.A.dims[..2], io.A.size, io.A.type_),
        (2, &[5, 96][..], 5 * 96, RKNN_TENSOR_INT8)
    );
    assert_eq!(
        (io.B.n_dims, &io.B.dims[..2], io.B.size),
        (2, &[96, 64][..], 96 * 64)
    );
    assert_eq!(
        (io.C.n_dims, &io.C.dims[..2], io.C.size, io.C.type_),
        (2, &[5, 64][..], 5 * 64 * 4, RKNN_TENSOR_INT32)
    );
    destroy(&emu, ctx);
    // Native: A [K/16, M, 16], B [N/32, K/32, 32, 32], C [N/4, M, 4].
    let native = rknn_matmul_info {
        AC_layout: 1,
        B_layout: 1,
        ..info(RKNN_INT8_MM_INT8_TO_INT32, 5, 96, 64)
    };
    let (ctx, io) = create(&emu, native).unwrap();
    assert_eq!(&io.A.dims[..3], &[6, 5, 16]);
    assert_eq!(&io.B.dims[..4], &[2, 3, 32, 32]);
    assert_eq!(&io.C.dims[..3], &[16, 5, 4]);
    assert_eq!(io.C.size, 64 * 5 * 4);
    destroy(&emu, ctx);
    // TP_NORM B: [N, K].
    let tp = rknn_matmul_info {
        B_layout: 2,
        ..info(RKNN_FLOAT16_MM_FLOAT16_TO_FLOAT16, 2, 64, 32)
    };
    let (ctx, io) = create(&emu, tp).unwrap();
    assert_eq!(&io.B.dims[..2], &[32, 64]);
    assert_eq!(
        (io.B.size, io.C.type_, io.C.size),
        (32 * 64 * 2, RKNN_TENSOR_FLOAT16, 2 * 32 * 2)
    );
    destroy(&emu, ctx);
    // int4: half a byte per element; native C of i16 has 8-wide tiles.
    let i4 = rknn_matmul_info {
        AC_layout: 1,
        B_layout: 1,
        ..info(RKNN_INT4_MM_INT4_TO_INT16, 3, 64, 64)
    };
    let (ctx, io) = create(&emu, i4).unwrap();
    assert_eq!(
        (io.A.size, io.A.type_, &io.A.dims[..3]),
        (3 * 64 / 2, RKNN_TENSOR_INT4, &[2, 3, 32][..])
    );
    assert_eq!(
        (io.B.size, &io.B.dims[..4]),
        (64 * 64 / 2, &[1, 2, 64, 32][..])
    );
    assert_eq!((&io.C.dims[..3], io.C.size), (&[8, 3, 8][..], 64 * 3 * 2));
    destroy(&emu, ctx);
}

#[test]
fn null_pointers_and_bad_handles_are_errors_not_crashes() {
    let emu = emulator(Platform::Rk3588);
    let api = emu.api();
    let mut io = rknn_matmul_io_attr::default();
    let mut inf = info(RKNN_INT8_MM_INT8_TO_INT32, 1, 64, 64);
    let mut ctx = 0;
    // SAFETY: the emulator checks every pointer; these calls pass NULLs and junk on purpose.
    unsafe {
        assert_eq!(
            (api.rknn_matmul_create)(std::ptr::null_mut(), &mut inf, &mut io),
            RKNN_ERR_PARAM_INVALID
        );
        assert_eq!(
            (api.rknn_matmul_create)(&mut ctx, std::ptr::null_mut(), &mut io),
            RKNN_ERR_PARAM_INVALID
        );
        assert_eq!((api.rknn_matmul_run)(12345), RKNN_ERR_CTX_INVALID);
        assert_eq!((api.rknn_matmul_destroy)(12345), RKNN_ERR_CTX_INVALID);
        assert!((api.rknn_create_mem)(12345, 64).is_null());
        assert_eq!(
            (api.rknn_destroy_mem)(0, std::ptr::null_mut()),
            RKNN_ERR_PARAM_INVALID
        );
        let mut fake = rknn_tensor_mem::default();
        assert_eq!(
            (api.rknn_destroy_mem)(0, &mut fake),
            RKNN_ERR_PARAM_INVALID,
            "unknown memory"
        );

        assert_eq!((api.rknn_matmul_create)(&mut ctx, &mut inf, &mut io), 0);
        assert_eq!(
            (api.rknn_matmul_run)(ctx),
            RKNN_ERR_INPUT_INVALID,
            "nothing bound"
        );
        assert!((api.rknn_create_mem)(ctx, 0).is_null(), "size 0");
        let small = (api.rknn_create_mem)(ctx, io.A.size - 1);
        assert_eq!(
            (api.rknn_matmul_set_io_mem)(ctx, small, &mut io.A),
            RKNN_ERR_PARAM_INVALID,
            "too small"
        );
        assert!(last_error().contains("smaller"), "{}", last_error());
        let mut wrong = io.A;
        wrong.name[0] = b'X' as _;
        assert_eq!(
            (api.rknn_matmul_set_io_mem)(ctx, small, &mut wrong),
            RKNN_ERR_PARAM_INVALID,
            "bad name"
        );
        // A valid name followed by more is another name.
        wrong = io.A;
        wrong.name[1] = b'B' as _;
        assert_eq!(
            (api.rknn_matmul_set_io_mem)(ctx, small, &mut wrong),
            RKNN_ERR_PARAM_INVALID,
            "\"AB\""
        );
        assert!(last_error().contains("\"AB\" is not"), "{}", last_error());
        wrong = io.A;
        wrong.size += 1;
        assert_eq!(
            (api.rknn_matmul_set_io_mem)(ctx, small, &mut wrong),
            RKNN_ERR_PARAM_INVALID,
            "bad size"
        );
        assert_eq!(
            (api.rknn_mem_sync.unwrap())(ctx, small, 7),
            RKNN_ERR_PARAM_INVALID,
            "bad sync mode"
        );
        assert_eq!((api.rknn_destroy_mem)(ctx, small), 0);
        assert_eq!(
            (api.rknn_destroy_mem)(ctx, small),
            RKNN_ERR_PARAM_INVALID,
            "double free"
        );
        let mut q = Quant {
            name: "B",
            scale: vec![1.0, 2.0],
            zp: vec![],
        };
        let mut qp = quant_params(&mut q);
        assert_eq!(
            (api.rknn_matmul_set_quant_params.unwrap())(ctx, &mut qp),
            RKNN_ERR_PARAM_INVALID,
            "per-layer takes 1 scale"
        );
        let mut q = Quant {
            name: "D",
            scale: vec![1.0],
            zp: vec![],
        };
        let mut qp = quant_params(&mut q);
        assert_eq!(
            (api.rknn_matmul_set_quant_params.unwrap())(ctx, &mut qp),
            RKNN_ERR_PARAM_INVALID,
            "bad name"
        );
        let mut sdk = rknn_sdk_version::default();
        let size = std::mem::size_of::<rknn_sdk_version>() as u32;
        assert_eq!(
            (api.rknn_query)(
                ctx,
                RKNN_QUERY_SDK_VERSION,
                (&mut sdk as *mut rknn_sdk_version).cast(),
                size
            ),
            0
        );
        assert!(sdk.api_version.iter().take_while(|&&c| c != 0).count() > 0);
        assert_eq!(
            (api.rknn_query)(ctx, 1, (&mut sdk as *mut rknn_sdk_version).cast(), size),
            RKNN_ERR_PARAM_INVALID
        );
        assert_eq!(
            (api.rknn_query)(
                ctx,
                RKNN_QUERY_SDK_VERSION,
                (&mut sdk as *mut rknn_sdk_version).cast(),
                10
            ),
            RKNN_ERR_PARAM_INVALID
        );
        assert_eq!((api.rknn_matmul_destroy)(ctx), 0);
        assert_eq!(
            (api.rknn_matmul_destroy)(ctx),
            RKNN_ERR_CTX_INVALID,
            "destroyed twice"
        );
    }
}

#[test]
fn handles_of_one_emulator_are_invalid_in_another() {
    let (e1, e2) = (emulator(Platform::Rk3588), emulator(Platform::Rk3588));
    let (ctx, _) = create(&e1, info(RKNN_INT8_MM_INT8_TO_INT32, 1, 64, 64)).unwrap();
    // SAFETY: a plain handle call.
    let rc = unsafe { (e2.api().rknn_matmul_run)(ctx) };
    assert_eq!(rc, RKNN_ERR_CTX_INVALID);
    destroy(&e1, ctx);
}

#[test]
fn int4_b_in_normal_layout_fails_at_set_io_mem_on_rk3588() {
    // Measured on RK3588: type 10 with B_layout NORM is created but fails at set_io_mem.
    let emu = emulator(Platform::Rk3588);
    let mut run = Run::new(
        &emu,
        RKNN_INT4_MM_INT4_TO_INT16,
        1,
        64,
        64,
        Layouts {
            ac_native: false,
            b: 0,
        },
    );
    let v = Values::Int(vec![1; 64 * 64]);
    assert_eq!(run.go(&v, &v).unwrap_err(), RKNN_ERR_PARAM_INVALID);
    assert!(last_error().contains("native"), "{}", last_error());
}

#[test]
fn get_quant_params_reports_the_normalised_per_channel_scale() {
    let emu = emulator(Platform::Rk3588);
    let i = rknn_matmul_info {
        B_quant_type: RKNN_QUANT_TYPE_PER_CHANNEL_SYM as i16,
        ..info(RKNN_INT8_MM_INT8_TO_INT32, 1, 32, 32)
    };
    let (ctx, _) = create(&emu, i).unwrap();
    let scales: Vec<f32> = (1..=32).map(|x| x as f32 * 0.5).collect();
    let mut q = Quant {
        name: "B",
        scale: scales.clone(),
        zp: vec![],
    };
    let mut qp = quant_params(&mut q);
    let mut out = vec![0f32; 32];
    let mut get = quant_params(&mut Quant {
        name: "B",
        scale: vec![],
        zp: vec![],
    });
    get.scale = out.as_mut_ptr();
    get.scale_len = 32;
    let mut norm = 0f32;
    // SAFETY: valid pointers; `out` holds 32 floats.
    unsafe {
        assert_eq!(
            (emu.api().rknn_matmul_set_quant_params.unwrap())(ctx, &mut qp),
            0
        );
        assert_eq!(
            (emu.api().rknn_matmul_get_quant_params.unwrap())(ctx, &mut get, &mut norm),
            0
        );
    }
    assert_eq!(norm, 16.0);
    assert!(out.iter().zip(&scales).all(|(o, s)| *o == s / 16.0));
    destroy(&emu, ctx);
}

#[test]
fn changing_only_the_platform_takes_that_chips_rules() {
    // The configuration holds a policy, resolved for the platform when the instance starts:
    // `..Default::default()` (RK3588's defaults) must not keep RK3588's limits.
    for p in Platform::ALL {
        let emu = rknn_emu::Emulator::new(rknn_emu::EmuConfig {
            platform: p,
            ..Default::default()
        })
        .unwrap();
        assert_eq!(emu.rules(), rknn_chip::ShapeRules::accepted(p), "{p}");
        // K above the header's 10240: only RK3588 runs it (measured up to 15360).
        let k_big = create(&emu, info(RKNN_INT8_MM_INT8_TO_INT32, 1, 10240 + 32, 32));
        match p {
            Platform::Rk3588 => destroy(&emu, k_big.unwrap().0),
            _ => {
                assert_eq!(k_big.unwrap_err(), RKNN_ERR_PARAM_INVALID, "{p}");
                assert!(last_error().contains("10240"), "{p}: {}", last_error());
            }
        }
        // f16 with N = 8: the alignment of RK3562/3566/3568, not of RK3588/3576 (16).
        let n8 = create(&emu, info(RKNN_FLOAT16_MM_FLOAT16_TO_FLOAT32, 1, 32, 8));
        match p {
            Platform::Rk3588 | Platform::Rk3576 => {
                assert_eq!(n8.unwrap_err(), RKNN_ERR_PARAM_INVALID, "{p}");
                assert!(
                    last_error().contains("N=8 is not a multiple of 16"),
                    "{p}: {}",
                    last_error()
                );
            }
            _ => destroy(
                &emu,
                n8.unwrap_or_else(|rc| panic!("{p}: {rc} {}", last_error()))
                    .0,
            ),
        }
    }
}

#[test]
fn the_strict_policy_is_resolved_per_chip_too() {
    for p in Platform::ALL {
        let emu = rknn_emu::Emulator::new(rknn_emu::EmuConfig {
            platform: p,
            rules: rknn_emu::RulesPolicy::Strict,
            ..Default::default()
        })
        .unwrap();
        assert_eq!(emu.rules(), rknn_chip::ShapeRules::strict(p), "{p}");
        // N = 4096 is the guide's limit on every chip; 4096 + 32 is refused.
        let (ctx, _) = create(&emu, info(RKNN_INT8_MM_INT8_TO_INT32, 1, 64, 4096)).unwrap();
        destroy(&emu, ctx);
        assert_eq!(
            create(&emu, info(RKNN_INT8_MM_INT8_TO_INT32, 1, 64, 4096 + 32)).unwrap_err(),
            RKNN_ERR_PARAM_INVALID
        );
    }
    let custom = rknn_chip::ShapeRules {
        max_k: Some(64),
        ..rknn_chip::ShapeRules::accepted(Platform::Rk3566)
    };
    let emu = rknn_emu::Emulator::new(rknn_emu::EmuConfig {
        platform: Platform::Rk3566,
        rules: rknn_emu::RulesPolicy::Custom(custom),
        ..Default::default()
    })
    .unwrap();
    assert_eq!(emu.rules(), custom);
    assert_eq!(
        create(&emu, info(RKNN_INT8_MM_INT8_TO_INT32, 1, 96, 32)).unwrap_err(),
        RKNN_ERR_PARAM_INVALID
    );
}

/// The table's `rknn_emu_last_error` as a Rust string.
fn table_error(emu: &rknn_emu::Emulator) -> String {
    let f = emu
        .api()
        .rknn_emu_last_error
        .expect("the emulator fills its extension");
    // SAFETY: the emulator returns a NUL-terminated string valid until this thread's next call.
    unsafe { std::ffi::CStr::from_ptr(f()) }
        .to_str()
        .unwrap()
        .to_owned()
}

#[test]
fn the_tables_last_error_entry_says_why_a_call_failed() {
    let emu = emulator(Platform::Rk3588);
    // A fresh thread has no error yet: an empty string, not NULL.
    std::thread::scope(|s| {
        s.spawn(|| assert_eq!(table_error(&emu), ""))
            .join()
            .unwrap();
    });
    assert_eq!(
        create(&emu, info(RKNN_INT8_MM_INT8_TO_INT32, 1, 64, 100)).unwrap_err(),
        RKNN_ERR_PARAM_INVALID
    );
    let msg = table_error(&emu);
    assert_eq!(
        msg,
        "N=100 is not a multiple of 32 required for i8 on RK3588"
    );
    assert_eq!(msg, last_error());
    // Per thread: another thread's failure does not overwrite this one's.
    std::thread::scope(|s| {
        s.spawn(|| {
            // SAFETY: a bad handle is refused, not used.
            let rc = unsafe { (emu.api().rknn_matmul_run)(7) };
            assert_eq!(rc, RKNN_ERR_CTX_INVALID);
            assert!(table_error(&emu).contains("not a live matmul context"));
        })
        .join()
        .unwrap();
    });
    assert_eq!(table_error(&emu), msg);
    // Like errno, a later success leaves the message in place.
    let (ctx, _) = create(&emu, info(RKNN_INT8_MM_INT8_TO_INT32, 1, 64, 64)).unwrap();
    assert_eq!(table_error(&emu), msg);
    destroy(&emu, ctx);
}

#[test]
fn rknn_set_core_mask_acts_on_matmul_contexts_and_refuses_other_handles() {
    let emu = emulator(Platform::Rk3588);
    let set = emu
        .api()
        .rknn_set_core_mask
        .expect("the emulator exports it");
    let (ctx, _) = create(&emu, info(RKNN_INT8_MM_INT8_TO_INT32, 1, 64, 64)).unwrap();
    // SAFETY: plain handle calls.
    unsafe {
        assert_eq!(set(ctx, RKNN_NPU_CORE_1), 0);
        assert_eq!(set(ctx, RKNN_NPU_CORE_0_1_2), RKNN_ERR_PARAM_INVALID);
        assert_eq!(set(0xdead, RKNN_NPU_CORE_0), RKNN_ERR_CTX_INVALID);
    }
    assert!(
        last_error().contains("no model contexts"),
        "{}",
        last_error()
    );
    destroy(&emu, ctx);
}

#[test]
fn a_call_through_a_dropped_emulators_table_is_refused() {
    let emu = emulator(Platform::Rk3588);
    let (ctx, _) = create(&emu, info(RKNN_INT8_MM_INT8_TO_INT32, 1, 64, 64)).unwrap();
    // A C program may keep the function pointers after the runtime is gone.
    let run = emu.api().rknn_matmul_run;
    drop(emu);
    // SAFETY: a handle of the dropped instance; the emulator refuses it rather than using it.
    let rc = unsafe { run(ctx) };
    // The slot may already serve an emulator of another test, which does not know the handle
    // either (handles are unique across instances).
    assert_eq!(rc, RKNN_ERR_CTX_INVALID, "{}", last_error());
}
