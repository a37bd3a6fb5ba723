//! The settings for \[open\] behaviours that `rknn-conformance` names: each one changes exactly
//! the behaviour it describes, checked against references computed here from the settings'
//! definitions (independent of the emulator's code paths).

mod common;

use common::{Layouts, Quant, Run, Values, native_b_order};
use rknn_chip::Platform;
use rknn_emu::{EmuConfig, Emulator, GroupOrder, NativeInputs, NibbleOrder, SharedMemories};
use rknn_sys::*;

fn emulator(change: impl FnOnce(&mut EmuConfig)) -> Emulator {
    let mut cfg = EmuConfig::new(Platform::Rk3588);
    cfg.log_errors = false;
    change(&mut cfg);
    Emulator::new(cfg).unwrap()
}

fn naive(a: &[i32], b: &[i32], m: usize, k: usize, n: usize) -> Vec<i32> {
    let mut c = vec![0i32; m * n];
    for i in 0..m {
        for j in 0..n {
            c[i * n + j] = (0..k).map(|x| a[i * k + x] * b[x * n + j]).sum();
        }
    }
    c
}

#[test]
fn every_variable_is_read_by_from_vars() {
    let vars = [
        ("RKNN_EMU_IOMMU_DOMAIN_BYTES", "2147483648"),
        ("RKNN_EMU_NATIVE_B_NIBBLES", "high-first"),
        ("RKNN_EMU_NATIVE_INPUTS", "bind"),
        ("RKNN_EMU_GROUP_ORDER", "n-major"),
        ("RKNN_EMU_SDK_VERSION_ON_MATMUL", "0"),
        ("RKNN_EMU_SHARED_MEMORIES", "refuse"),
        ("RKNN_INT4_B_CONVERTER_INPUT", "one-per-byte"),
        ("RKNN_EMU_PLATFORM", "rk3576"),
    ];
    let cfg = EmuConfig::from_vars(|name| {
        vars.iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v.to_string())
    });
    assert_eq!(cfg.iommu_domain_bytes, 2 << 30);
    assert_eq!(cfg.native_b_nibbles, NibbleOrder::HighFirst);
    assert_eq!(cfg.native_inputs, NativeInputs::AtBind);
    assert_eq!(cfg.group_order, GroupOrder::NMajor);
    assert!(!cfg.sdk_version_on_matmul);
    assert_eq!(cfg.shared_memories, SharedMemories::Refuse);
    assert_eq!(
        cfg.int4_converter_input,
        rknn_chip::Int4ConverterInput::OnePerByte
    );
    assert_eq!(cfg.platform, Platform::Rk3576);
    // Unknown values keep the defaults.
    let cfg = EmuConfig::from_vars(|name| {
        name.starts_with("RKNN_EMU_")
            .then(|| "bogus".to_string())
            .filter(|_| name != "RKNN_EMU_PLATFORM")
    });
    assert_eq!(cfg, EmuConfig::default());
}

/// The converter's output under high-first is the low-first output with every byte's nibbles
/// exchanged, and a run reads it back consistently.
#[test]
fn high_first_nibbles_swap_the_converter_output_and_are_read_back() {
    let (m, k, n) = (3, 64, 128);
    let mut rng = fastrand::Rng::with_seed(7);
    let a: Vec<i32> = (0..m * k).map(|_| rng.i32(-8..=7)).collect();
    let b: Vec<i32> = (0..k * n).map(|_| rng.i32(-8..=7)).collect();
    let packed: Vec<u8> = b
        .chunks(2)
        .map(|p| (p[0] as u8 & 0xf) | ((p[1] as u8 & 0xf) << 4))
        .collect();
    let convert = |emu: &Emulator| {
        let mut info = rknn_matmul_info {
            M: m as i32,
            K: k as i32,
            N: n as i32,
            type_: RKNN_INT4_MM_INT4_TO_INT16,
            B_layout: 1,
            ..Default::default()
        };
        let mut input = packed.clone();
        let mut out = vec![0u8; k * n / 2];
        // SAFETY: buffers of the sizes the call reads and writes, distinct.
        let rc = unsafe {
            (emu.api().rknn_B_normal_layout_to_native_layout.unwrap())(
                input.as_mut_ptr().cast(),
                out.as_mut_ptr().cast(),
                k as i32,
                n as i32,
                &mut info,
            )
        };
        assert_eq!(rc, 0);
        out
    };
    let low = convert(&emulator(|_| {}));
    let high_emu = emulator(|c| c.native_b_nibbles = NibbleOrder::HighFirst);
    let high = convert(&high_emu);
    let swapped: Vec<u8> = low.iter().map(|b| (b & 0x0f) << 4 | b >> 4).collect();
    assert_eq!(high, swapped);
    assert_ne!(high, low);

    // A run on the high-first emulator given B encoded low first reads each pair of storage
    // positions exchanged: B'(s) = B(order[p ^ 1]) where order[p] = s.
    let order = native_b_order(k, n, 64, 32, Some(8192));
    let mut b_read = vec![0i32; k * n];
    for (p, src) in order.iter().enumerate() {
        if let Some(s) = src {
            b_read[*s] = order[p ^ 1].map_or(0, |t| b[t]);
        }
    }
    let layouts = Layouts {
        ac_native: false,
        b: 1,
    };
    let out = Run::new(&high_emu, RKNN_INT4_MM_INT4_TO_INT16, m, k, n, layouts)
        .go(&Values::Int(a.clone()), &Values::Int(b.clone()))
        .unwrap();
    let Values::Int(c) = out.c else {
        panic!("int C")
    };
    assert_eq!(c, naive(&a, &b_read, m, k, n));
    assert_ne!(c, naive(&a, &b, m, k, n));
}

/// One raw native-B run whose B is rewritten (and synced) after the bind, without binding
/// again: returns C of the second run.
fn rewrite_native_b_after_bind(emu: &Emulator) -> (Vec<i32>, Vec<i32>, Vec<i32>) {
    let api = emu.api();
    let (m, k, n) = (2usize, 32usize, 32usize);
    let a = vec![1i8; m * k];
    let b1 = vec![1i8; k * n];
    let b2 = vec![2i8; k * n];
    let mut info = rknn_matmul_info {
        M: m as i32,
        K: k as i32,
        N: n as i32,
        type_: RKNN_INT8_MM_INT8_TO_INT32,
        B_layout: 1,
        ..Default::default()
    };
    let mut io = rknn_matmul_io_attr::default();
    let mut ctx: rknn_matmul_ctx = 0;
    // SAFETY: valid pointers; memories written within their sizes and destroyed before the
    // context. With one tile in each direction native B (all equal values) is B itself.
    unsafe {
        assert_eq!((api.rknn_matmul_create)(&mut ctx, &mut info, &mut io), 0);
        let mems = [io.A.size, io.B.size, io.C.size].map(|s| (api.rknn_create_mem)(ctx, s));
        let sync = api.rknn_mem_sync.unwrap();
        let write = |mem: *mut rknn_tensor_mem, v: &[i8]| {
            std::ptr::copy_nonoverlapping(v.as_ptr(), (*mem).virt_addr.cast(), v.len());
            assert_eq!(sync(ctx, mem, RKNN_MEMORY_SYNC_TO_DEVICE), 0);
        };
        write(mems[0], &a);
        write(mems[1], &b1);
        for (mem, attr) in mems.iter().zip([&mut io.A, &mut io.B, &mut io.C]) {
            assert_eq!((api.rknn_matmul_set_io_mem)(ctx, *mem, attr), 0);
        }
        let read = || {
            assert_eq!((api.rknn_matmul_run)(ctx), 0);
            assert_eq!(sync(ctx, mems[2], RKNN_MEMORY_SYNC_FROM_DEVICE), 0);
            std::slice::from_raw_parts((*mems[2]).virt_addr as *const i32, m * n).to_vec()
        };
        let first = read();
        write(mems[1], &b2);
        let second = read();
        // Bound again: both settings see the new B.
        assert_eq!((api.rknn_matmul_set_io_mem)(ctx, mems[1], &mut io.B), 0);
        let rebound = read();
        for mem in mems {
            assert_eq!((api.rknn_destroy_mem)(ctx, mem), 0);
        }
        assert_eq!((api.rknn_matmul_destroy)(ctx), 0);
        (first, second, rebound)
    }
}

#[test]
fn native_inputs_at_bind_ignore_a_write_until_the_next_bind() {
    let (first, second, rebound) = rewrite_native_b_after_bind(&emulator(|_| {}));
    assert!(first.iter().all(|&c| c == 32));
    assert!(second.iter().all(|&c| c == 64), "read at run: {second:?}");
    assert!(rebound.iter().all(|&c| c == 64));
    let (first, second, rebound) =
        rewrite_native_b_after_bind(&emulator(|c| c.native_inputs = NativeInputs::AtBind));
    assert!(first.iter().all(|&c| c == 32));
    assert!(second.iter().all(|&c| c == 32), "read at bind: {second:?}");
    assert!(rebound.iter().all(|&c| c == 64));
}

/// Per-group dequantisation of type 9 with the scales given in either order, against the
/// formula sum_g sB(g, n) * sum_{k in g} a * b.
#[test]
fn group_order_selects_how_per_group_scales_are_indexed() {
    let (m, k, n, g) = (2usize, 128usize, 32usize, 32usize);
    let groups = k / g;
    let mut rng = fastrand::Rng::with_seed(11);
    let a: Vec<i32> = (0..m * k).map(|_| rng.i32(-128..=127)).collect();
    let b: Vec<i32> = (0..k * n).map(|_| rng.i32(-128..=127)).collect();
    // scale(group, column), distinct for every pair.
    let scale = |gi: usize, j: usize| 0.001 * (1 + gi * n + j) as f32;
    let expected: Vec<f64> = (0..m * n)
        .map(|idx| {
            let (i, j) = (idx / n, idx % n);
            (0..groups)
                .map(|gi| {
                    let s: i64 = (gi * g..(gi + 1) * g)
                        .map(|x| i64::from(a[i * k + x]) * i64::from(b[x * n + j]))
                        .sum();
                    s as f64 * f64::from(scale(gi, j))
                })
                .sum()
        })
        .collect();
    for (order, scales) in [
        (
            GroupOrder::KMajor,
            (0..groups)
                .flat_map(|gi| (0..n).map(move |j| scale(gi, j)))
                .collect::<Vec<_>>(),
        ),
        (
            GroupOrder::NMajor,
            (0..n)
                .flat_map(|j| (0..groups).map(move |gi| scale(gi, j)))
                .collect(),
        ),
    ] {
        let emu = emulator(|c| c.group_order = order);
        let mut run = Run::new(
            &emu,
            RKNN_INT8_MM_INT8_TO_FLOAT32,
            m,
            k,
            n,
            Layouts {
                ac_native: false,
                b: 0,
            },
        );
        run.b_quant_type = 4;
        run.group_size = g as i16;
        run.quant = vec![Quant {
            name: "B",
            scale: scales,
            zp: vec![],
        }];
        let Values::Float(c) = run
            .go(&Values::Int(a.clone()), &Values::Int(b.clone()))
            .unwrap()
            .c
        else {
            panic!("float C")
        };
        for (idx, (&got, &want)) in c.iter().zip(&expected).enumerate() {
            assert!(
                (f64::from(got) - want).abs() <= 1e-5 * want.abs().max(1.0),
                "{order:?} C[{idx}] = {got}, expected {want}"
            );
        }
    }
}

#[test]
fn sdk_version_query_on_a_matmul_context_can_be_refused() {
    for (answer, expected) in [(true, 0), (false, RKNN_ERR_CTX_INVALID)] {
        let emu = emulator(|c| c.sdk_version_on_matmul = answer);
        let api = emu.api();
        let mut info = rknn_matmul_info {
            M: 1,
            K: 32,
            N: 32,
            type_: RKNN_INT8_MM_INT8_TO_INT32,
            ..Default::default()
        };
        let mut io = rknn_matmul_io_attr::default();
        let mut ctx: rknn_matmul_ctx = 0;
        let mut v = rknn_sdk_version::default();
        let size = std::mem::size_of::<rknn_sdk_version>() as u32;
        // SAFETY: valid pointers for each call; the version struct is 512 bytes.
        unsafe {
            assert_eq!((api.rknn_matmul_create)(&mut ctx, &mut info, &mut io), 0);
            let rc = (api.rknn_query)(ctx, RKNN_QUERY_SDK_VERSION, (&raw mut v).cast(), size);
            assert_eq!(rc, expected);
            // Without a context the emulator always answers.
            let rc = (api.rknn_query)(0, RKNN_QUERY_SDK_VERSION, (&raw mut v).cast(), size);
            assert_eq!(rc, 0);
            assert_eq!((api.rknn_matmul_destroy)(ctx), 0);
        }
    }
}
