//! The field hazards the emulator reproduces, and the semantics of binding, syncing, dynamic
//! shapes and the B converter.

mod common;

use common::*;
use rknn_chip::Platform;
use rknn_emu::{EmuConfig, Emulator, SharedMemories, last_error};
use rknn_sys::*;

fn ctx_i8(emu: &Emulator, m: i32, k: i32, n: i32) -> (rknn_matmul_ctx, rknn_matmul_io_attr) {
    let mut info = rknn_matmul_info {
        M: m,
        K: k,
        N: n,
        type_: RKNN_INT8_MM_INT8_TO_INT32,
        ..Default::default()
    };
    let mut io = rknn_matmul_io_attr::default();
    let mut ctx = 0;
    // SAFETY: valid pointers for the call.
    let rc = unsafe { (emu.api().rknn_matmul_create)(&mut ctx, &mut info, &mut io) };
    assert_eq!(rc, 0);
    (ctx, io)
}

#[test]
fn the_handle_budget_fails_allocation_like_the_device() {
    let mut cfg = EmuConfig::new(Platform::Rk3588);
    cfg.handle_budget = 40;
    let emu = Emulator::new(cfg).unwrap();
    let (ctx, _) = ctx_i8(&emu, 1, 32, 32);
    let api = emu.api();
    // SAFETY: memories are created and destroyed on a live context.
    unsafe {
        let mems: Vec<_> = (0..40).map(|_| (api.rknn_create_mem)(ctx, 64)).collect();
        assert!(mems.iter().all(|m| !m.is_null()));
        assert!(
            (api.rknn_create_mem)(ctx, 64).is_null(),
            "the 41st allocation fails"
        );
        assert!(
            last_error().contains("too many open files"),
            "{}",
            last_error()
        );
        assert_eq!((api.rknn_destroy_mem)(ctx, mems[0]), 0);
        let again = (api.rknn_create_mem)(ctx, 64);
        assert!(!again.is_null(), "freeing one makes room");
        assert_eq!((api.rknn_destroy_mem)(ctx, again), 0);
        for m in &mems[1..] {
            assert_eq!((api.rknn_destroy_mem)(ctx, *m), 0);
        }
        assert_eq!((api.rknn_matmul_destroy)(ctx), 0);
    }
    assert_eq!(emu.stats().memories, 0);
    assert_eq!(EmuConfig::new(Platform::Rk3588).handle_budget, 1020);
}

#[test]
fn each_iommu_domain_holds_a_bounded_number_of_bytes() {
    let mut cfg = EmuConfig::new(Platform::Rk3588);
    cfg.iommu_domain_bytes = 1 << 20; // scaled down from 4 GiB for the test
    let emu = Emulator::new(cfg).unwrap();
    let api = emu.api();
    let make = |domain: i32| {
        let mut info = rknn_matmul_info {
            M: 1,
            K: 32,
            N: 32,
            type_: RKNN_INT8_MM_INT8_TO_INT32,
            iommu_domain_id: domain,
            ..Default::default()
        };
        let mut io = rknn_matmul_io_attr::default();
        let mut ctx = 0;
        // SAFETY: valid pointers for the call.
        let rc = unsafe { (api.rknn_matmul_create)(&mut ctx, &mut info, &mut io) };
        assert_eq!(rc, 0);
        ctx
    };
    let (c0, c1) = (make(0), make(1));
    // SAFETY: memories on live contexts.
    unsafe {
        let big = (api.rknn_create_mem)(c0, 768 << 10);
        assert!(!big.is_null());
        assert!(
            (api.rknn_create_mem)(c0, 512 << 10).is_null(),
            "domain 0 is full"
        );
        assert!(
            last_error().contains("IOMMU domain 0 is full"),
            "{}",
            last_error()
        );
        let other = (api.rknn_create_mem)(c1, 512 << 10);
        assert!(!other.is_null(), "domain 1 has its own space");
        assert_eq!(emu.domain_used(0), 768 << 10);
        assert_eq!(emu.domain_used(1), 512 << 10);
        assert_eq!((api.rknn_destroy_mem)(c0, big), 0);
        assert_eq!((api.rknn_destroy_mem)(c1, other), 0);
        assert_eq!(emu.domain_used(0), 0);
        assert_eq!((api.rknn_matmul_destroy)(c0), 0);
        assert_eq!((api.rknn_matmul_destroy)(c1), 0);
    }
    assert_eq!(EmuConfig::new(Platform::Rk3588).iommu_domain_bytes, 4 << 30);
}

#[test]
fn a_context_used_from_two_threads_at_once_is_refused() {
    let emu = emulator(Platform::Rk3588);
    let (m, k, n) = (64, 4096, 1024); // a run long enough to overlap
    let (ctx, mut io) = ctx_i8(&emu, m, k, n);
    let api = emu.api();
    // SAFETY: memories on a live context, destroyed before it.
    let mems = unsafe {
        let mems = [io.A.size, io.B.size, io.C.size].map(|s| (api.rknn_create_mem)(ctx, s));
        for (mem, attr) in mems.iter().zip([&mut io.A, &mut io.B, &mut io.C]) {
            assert_eq!((api.rknn_matmul_set_io_mem)(ctx, *mem, attr), 0);
        }
        mems
    };
    let run = api.rknn_matmul_run;
    let mut refused = 0;
    for _ in 0..20 {
        let codes: Vec<i32> = std::thread::scope(|s| {
            // SAFETY: the emulator detects the concurrent use; that is what is tested.
            let hs: Vec<_> = (0..2)
                .map(|_| s.spawn(move || unsafe { run(ctx) }))
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert!(
            codes.iter().all(|&c| c == 0 || c == RKNN_ERR_FAIL),
            "{codes:?}"
        );
        refused += codes.iter().filter(|&&c| c == RKNN_ERR_FAIL).count();
        if refused > 0 {
            break;
        }
    }
    assert!(
        refused > 0,
        "two concurrent runs never collided in 20 tries"
    );
    assert_eq!(emu.stats().concurrent_uses, refused);
    // SAFETY: as above.
    unsafe {
        for mem in mems {
            assert_eq!((api.rknn_destroy_mem)(ctx, mem), 0);
        }
        assert_eq!((api.rknn_matmul_destroy)(ctx), 0);
    }
}

/// Writes `a` and `b` into A and B, binds A, B, C, runs and returns C[0].
fn bind_run(
    emu: &Emulator,
    ctx: rknn_matmul_ctx,
    io: &mut rknn_matmul_io_attr,
    mems: &[*mut rknn_tensor_mem; 3],
    fill: i8,
    rebind: bool,
) -> i32 {
    let api = emu.api();
    // SAFETY: live memories of at least the io sizes.
    unsafe {
        std::ptr::write_bytes(
            (*mems[0]).virt_addr.cast::<u8>(),
            fill as u8,
            io.A.size as usize,
        );
        if rebind {
            for (mem, attr) in mems.iter().zip([&mut io.A, &mut io.B, &mut io.C]) {
                assert_eq!((api.rknn_matmul_set_io_mem)(ctx, *mem, attr), 0);
            }
        }
        assert_eq!((api.rknn_matmul_run)(ctx), 0);
        *((*mems[2]).virt_addr as *const i32)
    }
}

#[test]
fn set_io_mem_takes_the_data_at_bind_time() {
    let emu = emulator(Platform::Rk3588);
    let (ctx, mut io) = ctx_i8(&emu, 1, 32, 32);
    let api = emu.api();
    // SAFETY: memories on a live context.
    let mems = unsafe { [io.A.size, io.B.size, io.C.size].map(|s| (api.rknn_create_mem)(ctx, s)) };
    // SAFETY: B is K*N bytes.
    unsafe { std::ptr::write_bytes((*mems[1]).virt_addr.cast::<u8>(), 1, io.B.size as usize) };
    assert_eq!(bind_run(&emu, ctx, &mut io, &mems, 2, true), 64);
    // Writing A without binding again is not seen: the documented write → bind → run order.
    assert_eq!(bind_run(&emu, ctx, &mut io, &mems, 3, false), 64);
    assert_eq!(bind_run(&emu, ctx, &mut io, &mems, 3, true), 96);
    // SAFETY: destroy in the documented order.
    unsafe {
        for m in mems {
            assert_eq!((api.rknn_destroy_mem)(ctx, m), 0);
        }
        assert_eq!((api.rknn_matmul_destroy)(ctx), 0);
    }
}

#[test]
fn strict_cache_emulation_needs_syncs_in_both_directions() {
    let mut cfg = EmuConfig::new(Platform::Rk3588);
    cfg.strict_cache = true;
    let emu = Emulator::new(cfg).unwrap();
    let (ctx, mut io) = ctx_i8(&emu, 1, 32, 32);
    let api = emu.api();
    let sync = api.rknn_mem_sync.unwrap();
    // SAFETY: memories on a live context, written within their sizes.
    unsafe {
        let mems = [io.A.size, io.B.size, io.C.size].map(|s| (api.rknn_create_mem)(ctx, s));
        std::ptr::write_bytes((*mems[0]).virt_addr.cast::<u8>(), 2, io.A.size as usize);
        std::ptr::write_bytes((*mems[1]).virt_addr.cast::<u8>(), 1, io.B.size as usize);
        // No TO_DEVICE sync: the device still sees zeros.
        for (mem, attr) in mems.iter().zip([&mut io.A, &mut io.B, &mut io.C]) {
            assert_eq!((api.rknn_matmul_set_io_mem)(ctx, *mem, attr), 0);
        }
        assert_eq!((api.rknn_matmul_run)(ctx), 0);
        assert_eq!(sync(ctx, mems[2], RKNN_MEMORY_SYNC_FROM_DEVICE), 0);
        assert_eq!(
            *((*mems[2]).virt_addr as *const i32),
            0,
            "unsynced inputs are stale"
        );
        assert_eq!(sync(ctx, mems[0], RKNN_MEMORY_SYNC_TO_DEVICE), 0);
        assert_eq!(sync(ctx, mems[1], RKNN_MEMORY_SYNC_TO_DEVICE), 0);
        for (mem, attr) in mems.iter().zip([&mut io.A, &mut io.B, &mut io.C]) {
            assert_eq!((api.rknn_matmul_set_io_mem)(ctx, *mem, attr), 0);
        }
        assert_eq!((api.rknn_matmul_run)(ctx), 0);
        assert_eq!(
            *((*mems[2]).virt_addr as *const i32),
            0,
            "output not visible before FROM_DEVICE"
        );
        assert_eq!(sync(ctx, mems[2], RKNN_MEMORY_SYNC_FROM_DEVICE), 0);
        assert_eq!(*((*mems[2]).virt_addr as *const i32), 64);
        for m in mems {
            assert_eq!((api.rknn_destroy_mem)(ctx, m), 0);
        }
        assert_eq!((api.rknn_matmul_destroy)(ctx), 0);
    }
}

#[test]
fn destroying_a_context_before_its_memories_is_counted() {
    let emu = emulator(Platform::Rk3588);
    let (ctx, _) = ctx_i8(&emu, 1, 32, 32);
    let api = emu.api();
    // SAFETY: the misuse under test; the memory stays valid and is freed afterwards.
    unsafe {
        let m = (api.rknn_create_mem)(ctx, 64);
        assert_eq!((api.rknn_matmul_destroy)(ctx), 0);
        assert_eq!(emu.stats().orphaned_memories, 1);
        assert_eq!((api.rknn_destroy_mem)(ctx, m), 0);
    }
    assert_eq!(
        emu.stats(),
        rknn_emu::EmuStats {
            orphaned_memories: 1,
            ..Default::default()
        }
    );
}

#[test]
fn dynamic_shapes_select_one_of_the_creation_shapes() {
    let emu = emulator(Platform::Rk3588);
    let api = emu.api();
    let mut info = rknn_matmul_info {
        type_: RKNN_INT8_MM_INT8_TO_INT32,
        ..Default::default()
    };
    let mut shapes = [1, 4, 16].map(|m| rknn_matmul_shape { M: m, K: 64, N: 32 });
    let mut ios = [rknn_matmul_io_attr::default(); 3];
    let mut ctx = 0;
    let mut rng = fastrand::Rng::with_seed(5);
    // SAFETY: valid pointers and lengths; memories sized for the largest shape.
    unsafe {
        let create = api.rknn_matmul_create_dynamic_shape.unwrap();
        let set = api.rknn_matmul_set_dynamic_shape.unwrap();
        assert_eq!(
            create(
                &mut ctx,
                &mut info,
                3,
                shapes.as_mut_ptr(),
                ios.as_mut_ptr()
            ),
            0
        );
        assert_eq!(ios.map(|io| io.A.dims[0]), [1, 4, 16]);
        let mems =
            [ios[2].A.size, ios[2].B.size, ios[2].C.size].map(|s| (api.rknn_create_mem)(ctx, s));
        let b: Vec<i8> = (0..64 * 32).map(|_| rng.i8(..)).collect();
        std::ptr::copy_nonoverlapping(b.as_ptr(), (*mems[1]).virt_addr.cast(), b.len());
        for (i, s) in shapes.iter_mut().enumerate() {
            assert_eq!(set(ctx, s), 0);
            let m = s.M as usize;
            let a: Vec<i8> = (0..m * 64).map(|_| rng.i8(..)).collect();
            std::ptr::copy_nonoverlapping(a.as_ptr(), (*mems[0]).virt_addr.cast(), a.len());
            assert_eq!(
                (api.rknn_matmul_run)(ctx),
                RKNN_ERR_INPUT_INVALID,
                "switching shape unbinds"
            );
            let io = &mut ios[i];
            for (mem, attr) in mems.iter().zip([&mut io.A, &mut io.B, &mut io.C]) {
                assert_eq!((api.rknn_matmul_set_io_mem)(ctx, *mem, attr), 0);
            }
            assert_eq!((api.rknn_matmul_run)(ctx), 0);
            let c = std::slice::from_raw_parts((*mems[2]).virt_addr as *const i32, m * 32);
            for r in 0..m {
                for col in 0..32 {
                    let want: i32 = (0..64)
                        .map(|x| i32::from(a[r * 64 + x]) * i32::from(b[x * 32 + col]))
                        .sum();
                    assert_eq!(c[r * 32 + col], want);
                }
            }
        }
        let mut bad = rknn_matmul_shape { M: 2, K: 64, N: 32 };
        assert_eq!(set(ctx, &mut bad), RKNN_ERR_PARAM_INVALID);
        for m in mems {
            assert_eq!((api.rknn_destroy_mem)(ctx, m), 0);
        }
        assert_eq!((api.rknn_matmul_destroy)(ctx), 0);
        assert_eq!(
            create(
                &mut ctx,
                &mut info,
                0,
                shapes.as_mut_ptr(),
                ios.as_mut_ptr()
            ),
            RKNN_ERR_PARAM_INVALID
        );
    }
}

#[test]
fn the_b_converter_matches_the_documented_layout_and_refuses_aliasing() {
    use rknn_chip::Int4ConverterInput::{OnePerByte, Packed};
    let mut rng = fastrand::Rng::with_seed(9);
    for (p, t, int4) in [
        (Platform::Rk3588, RKNN_INT8_MM_INT8_TO_INT32, Packed),
        (Platform::Rk3588, RKNN_FLOAT16_MM_FLOAT16_TO_FLOAT32, Packed),
        (Platform::Rk3588, RKNN_INT4_MM_INT4_TO_INT16, Packed),
        (Platform::Rk3588, RKNN_INT4_MM_INT4_TO_INT16, OnePerByte),
        (Platform::Rk3576, RKNN_INT8_MM_INT8_TO_INT32, Packed),
        (Platform::Rk3576, RKNN_INT8_MM_INT4_TO_INT32, Packed),
        (Platform::Rk3576, RKNN_INT8_MM_INT4_TO_INT32, OnePerByte),
        (Platform::Rk3566, RKNN_FLOAT16_MM_FLOAT16_TO_FLOAT32, Packed),
    ] {
        let emu = Emulator::new(EmuConfig {
            int4_converter_input: int4,
            ..EmuConfig::new(p)
        })
        .unwrap();
        let conv = emu.api().rknn_B_normal_layout_to_native_layout.unwrap();
        let mt = rknn_chip::MatmulType::from_raw(t).unwrap();
        let tiles = p.tiles(mt).unwrap();
        for (k, n) in [(64usize, 64usize), (8192 + 64, 64), (4096 + 32, 128)] {
            let max_k = rknn_chip::ShapeRules::accepted(p)
                .max_k
                .unwrap_or(usize::MAX);
            if k > max_k {
                continue;
            }
            let (_, tb) = operand_types(t);
            let b = random_values(&mut rng, tb, k * n);
            let order = native_b_order(k, n, tiles.b_n, tiles.b_k, p.k_segment());
            // The converter's input, row-major [K, N]: int4 packed two per byte (even element
            // in the low nibble, as Rockchip's demos pack it) or one per byte, per the setting.
            let input: Vec<u8> = match &b {
                Values::Int(v) if mt.b == rknn_chip::ElemKind::I4 && int4 == Packed => v
                    .chunks(2)
                    .map(|c| (c[0] as u8 & 0xf) | ((c[1] as u8 & 0xf) << 4))
                    .collect(),
                Values::Int(v) => v.iter().map(|&x| x as i8 as u8).collect(),
                Values::Float(v) => v
                    .iter()
                    .flat_map(|&x| half::f16::from_f32(x).to_le_bytes())
                    .collect(),
            };
            let want: Vec<u8> = match (&b, mt.b) {
                (Values::Int(v), rknn_chip::ElemKind::I4) => {
                    let nib: Vec<u8> = order
                        .iter()
                        .map(|o| o.map_or(0, |i| v[i] as u8 & 0xf))
                        .collect();
                    nib.chunks(2).map(|c| c[0] | (c[1] << 4)).collect()
                }
                (Values::Int(v), _) => order
                    .iter()
                    .map(|o| o.map_or(0, |i| v[i] as i8 as u8))
                    .collect(),
                (Values::Float(v), _) => order
                    .iter()
                    .flat_map(|o| half::f16::from_f32(o.map_or(0.0, |i| v[i])).to_le_bytes())
                    .collect(),
            };
            let mut out = vec![0xAAu8; want.len()];
            let mut info = rknn_matmul_info {
                M: 1,
                K: k as i32,
                N: n as i32,
                type_: t,
                B_layout: 1,
                ..Default::default()
            };
            let mut inp = input.clone();
            // SAFETY: buffers of the sizes the converter reads and writes.
            let rc = unsafe {
                conv(
                    inp.as_mut_ptr().cast(),
                    out.as_mut_ptr().cast(),
                    k as i32,
                    n as i32,
                    &mut info,
                )
            };
            assert_eq!(rc, 0, "{p} {t} {int4} K={k}: {}", last_error());
            assert!(out == want, "{p} type {t} {int4} K={k} N={n}");
            // In place: refused, not corrupted.
            let mut same = vec![0u8; want.len().max(input.len())];
            same[..input.len()].copy_from_slice(&input);
            let ptr = same.as_mut_ptr().cast();
            // SAFETY: the aliasing is the point; the emulator refuses before touching memory.
            let rc = unsafe { conv(ptr, ptr, k as i32, n as i32, &mut info) };
            assert_eq!(rc, RKNN_ERR_PARAM_INVALID);
            assert_eq!(&same[..input.len()], &input[..], "input untouched");
        }
    }
}

#[test]
fn wrapped_fd_and_phys_memories_use_the_callers_mapping() {
    let emu = emulator(Platform::Rk3588);
    let (ctx, mut io) = ctx_i8(&emu, 1, 32, 32);
    let api = emu.api();
    let mut backing = vec![0u8; 4096];
    let mut b = vec![1u8; io.B.size as usize];
    let mut c = vec![0u8; io.C.size as usize];
    // SAFETY: the caller-owned buffers outlive the memories wrapping them.
    unsafe {
        backing[100..100 + 32].fill(3);
        let a =
            (api.rknn_create_mem_from_fd.unwrap())(ctx, 7, backing.as_mut_ptr().cast(), 32, 100);
        let bm =
            (api.rknn_create_mem_from_phys.unwrap())(ctx, 0x1000, b.as_mut_ptr().cast(), io.B.size);
        let cm =
            (api.rknn_create_mem_from_phys.unwrap())(ctx, 0x2000, c.as_mut_ptr().cast(), io.C.size);
        assert!(!a.is_null() && !bm.is_null() && !cm.is_null());
        assert_eq!(
            ((*a).fd, (*a).offset, (*a).flags),
            (7, 100, RKNN_TENSOR_MEMORY_FLAGS_FROM_FD)
        );
        for (mem, attr) in [a, bm, cm].iter().zip([&mut io.A, &mut io.B, &mut io.C]) {
            assert_eq!((api.rknn_matmul_set_io_mem)(ctx, *mem, attr), 0);
        }
        assert_eq!((api.rknn_matmul_run)(ctx), 0);
        assert_eq!(
            i32::from_le_bytes(c[..4].try_into().unwrap()),
            96,
            "data at virt_addr + offset"
        );
        assert!(
            (api.rknn_create_mem_from_fd.unwrap())(ctx, 7, std::ptr::null_mut(), 32, 0).is_null()
        );
        for m in [a, bm, cm] {
            assert_eq!((api.rknn_destroy_mem)(ctx, m), 0);
        }
        assert_eq!((api.rknn_matmul_destroy)(ctx), 0);
    }
}

fn create_dynamic(
    emu: &Emulator,
    info: &mut rknn_matmul_info,
    shapes: &mut [rknn_matmul_shape],
    ios: &mut [rknn_matmul_io_attr],
) -> Result<rknn_matmul_ctx, i32> {
    let create = emu.api().rknn_matmul_create_dynamic_shape.unwrap();
    let mut ctx = 0;
    // SAFETY: `ios` has one entry per shape.
    let rc = unsafe {
        create(
            &mut ctx,
            info,
            shapes.len() as i32,
            shapes.as_mut_ptr(),
            ios.as_mut_ptr(),
        )
    };
    if rc == 0 { Ok(ctx) } else { Err(rc) }
}

fn naive_i8(a: &[i8], b: &[i8], m: usize, k: usize, n: usize) -> Vec<i32> {
    let mut c = vec![0i32; m * n];
    for r in 0..m {
        for col in 0..n {
            c[r * n + col] = (0..k)
                .map(|x| i32::from(a[r * k + x]) * i32::from(b[x * n + col]))
                .sum();
        }
    }
    c
}

#[test]
fn dynamic_shapes_keep_b_bound_as_the_vendor_binds_it_once() {
    // The vendor's dynamic-shape usage: set shape 0, bind B once, then per shape set the shape
    // and bind only A and C.
    let emu = emulator(Platform::Rk3588);
    let api = emu.api();
    let (k, n) = (64usize, 32usize);
    let mut info = rknn_matmul_info {
        type_: RKNN_INT8_MM_INT8_TO_INT32,
        B_layout: RKNN_MM_LAYOUT_NATIVE as i16,
        ..Default::default()
    };
    let mut shapes = [1, 4, 16].map(|m| rknn_matmul_shape { M: m, K: 64, N: 32 });
    let mut ios = [rknn_matmul_io_attr::default(); 3];
    let ctx = create_dynamic(&emu, &mut info, &mut shapes, &mut ios).unwrap();
    let set = api.rknn_matmul_set_dynamic_shape.unwrap();
    let conv = api.rknn_B_normal_layout_to_native_layout.unwrap();
    let mut rng = fastrand::Rng::with_seed(13);
    let b: Vec<i8> = (0..k * n).map(|_| rng.i8(..)).collect();
    // SAFETY: memories sized for the largest shape; converter buffers of the reported sizes.
    unsafe {
        let mems =
            [ios[2].A.size, ios[2].B.size, ios[2].C.size].map(|s| (api.rknn_create_mem)(ctx, s));
        let mut b_in = b.clone();
        info.K = k as i32;
        info.N = n as i32;
        assert_eq!(
            conv(
                b_in.as_mut_ptr().cast(),
                (*mems[1]).virt_addr,
                k as i32,
                n as i32,
                &mut info
            ),
            0
        );
        assert_eq!(set(ctx, &mut shapes[0]), 0);
        assert_eq!(
            (api.rknn_matmul_set_io_mem)(ctx, mems[1], &mut ios[0].B),
            0,
            "B bound once"
        );
        // Twice over the shapes: the modelled time follows each shape change (checked below).
        for i in (0..2).flat_map(|_| 0..3) {
            let s = &mut shapes[i];
            assert_eq!(set(ctx, s), 0);
            let m = s.M as usize;
            let a: Vec<i8> = (0..m * k).map(|_| rng.i8(..)).collect();
            std::ptr::copy_nonoverlapping(a.as_ptr(), (*mems[0]).virt_addr.cast(), a.len());
            assert_eq!((api.rknn_matmul_set_io_mem)(ctx, mems[0], &mut ios[i].A), 0);
            assert_eq!((api.rknn_matmul_set_io_mem)(ctx, mems[2], &mut ios[i].C), 0);
            assert_eq!((api.rknn_matmul_run)(ctx), 0, "shape {i}: {}", last_error());
            let c = std::slice::from_raw_parts((*mems[2]).virt_addr as *const i32, m * n);
            assert_eq!(c, &naive_i8(&a, &b, m, k, n)[..], "shape M={m}");
        }
        let at =
            |m| rknn_emu::cost::RK3588.modelled_run(m, k, n, rknn_chip::MatmulType::I8_I8_I32, 1);
        assert_eq!(emu.modelled().total, 2 * (at(1) + at(4) + at(16)));
        for m in mems {
            assert_eq!((api.rknn_destroy_mem)(ctx, m), 0);
        }
        assert_eq!((api.rknn_matmul_destroy)(ctx), 0);
    }
}

#[test]
fn dynamic_shapes_with_b_norm_or_native_share_k_and_n() {
    let emu = emulator(Platform::Rk3588);
    for b_layout in [RKNN_MM_LAYOUT_NORM, RKNN_MM_LAYOUT_NATIVE] {
        let mut info = rknn_matmul_info {
            type_: RKNN_INT8_MM_INT8_TO_INT32,
            B_layout: b_layout as i16,
            ..Default::default()
        };
        let mut shapes = [
            rknn_matmul_shape { M: 1, K: 64, N: 32 },
            rknn_matmul_shape { M: 4, K: 64, N: 64 },
        ];
        let mut ios = [rknn_matmul_io_attr::default(); 2];
        assert_eq!(
            create_dynamic(&emu, &mut info, &mut shapes, &mut ios).unwrap_err(),
            RKNN_ERR_PARAM_INVALID
        );
        assert!(last_error().contains("same K and N"), "{}", last_error());
    }
}

#[test]
fn a_tp_norm_b_must_be_bound_again_when_k_or_n_changes() {
    // The vendor's "two feature" mode: TP_NORM B may change K and N per shape, and is bound
    // again for each. Forgetting to is an error, not a run on a B of the wrong shape.
    let emu = emulator(Platform::Rk3588);
    let api = emu.api();
    let mut info = rknn_matmul_info {
        type_: RKNN_INT8_MM_INT8_TO_INT32,
        B_layout: RKNN_MM_LAYOUT_TP_NORM as i16,
        ..Default::default()
    };
    let mut shapes = [
        rknn_matmul_shape { M: 2, K: 64, N: 32 },
        rknn_matmul_shape { M: 2, K: 32, N: 64 },
    ];
    let mut ios = [rknn_matmul_io_attr::default(); 2];
    let ctx = create_dynamic(&emu, &mut info, &mut shapes, &mut ios).unwrap();
    let set = api.rknn_matmul_set_dynamic_shape.unwrap();
    // SAFETY: memories of the largest sizes; every write within them.
    unsafe {
        let mems = [
            ios[0].A.size,
            ios[0].B.size,
            ios[0].C.size.max(ios[1].C.size),
        ]
        .map(|s| (api.rknn_create_mem)(ctx, s));
        std::ptr::write_bytes((*mems[0]).virt_addr.cast::<u8>(), 1, 2 * 64);
        std::ptr::write_bytes((*mems[1]).virt_addr.cast::<u8>(), 1, 64 * 32);
        for (i, s) in shapes.iter_mut().enumerate() {
            assert_eq!(set(ctx, s), 0);
            assert_eq!((api.rknn_matmul_set_io_mem)(ctx, mems[0], &mut ios[i].A), 0);
            assert_eq!((api.rknn_matmul_set_io_mem)(ctx, mems[2], &mut ios[i].C), 0);
            if i == 0 {
                assert_eq!((api.rknn_matmul_set_io_mem)(ctx, mems[1], &mut ios[i].B), 0);
                assert_eq!((api.rknn_matmul_run)(ctx), 0);
                assert_eq!(*((*mems[2]).virt_addr as *const i32), 64);
            } else {
                assert_eq!((api.rknn_matmul_run)(ctx), RKNN_ERR_INPUT_INVALID);
                assert!(
                    last_error().contains("B was bound for K=64 N=32"),
                    "{}",
                    last_error()
                );
                assert_eq!((api.rknn_matmul_set_io_mem)(ctx, mems[1], &mut ios[i].B), 0);
                assert_eq!((api.rknn_matmul_run)(ctx), 0);
                assert_eq!(*((*mems[2]).virt_addr as *const i32), 32);
            }
        }
        for m in mems {
            assert_eq!((api.rknn_destroy_mem)(ctx, m), 0);
        }
        assert_eq!((api.rknn_matmul_destroy)(ctx), 0);
    }
}

#[test]
fn per_channel_scales_of_a_dynamic_context_have_the_contexts_n() {
    // Quant params are set once, before any set_dynamic_shape: their length is the context's N
    // (the largest N of the shapes, as the vendor's demo sizes them), not the first shape's.
    let emu = emulator(Platform::Rk3588);
    let api = emu.api();
    let set_quant = api.rknn_matmul_set_quant_params.unwrap();
    let mut info = rknn_matmul_info {
        type_: RKNN_INT8_MM_INT8_TO_FLOAT32,
        B_layout: RKNN_MM_LAYOUT_TP_NORM as i16,
        B_quant_type: RKNN_QUANT_TYPE_PER_CHANNEL_SYM as i16,
        ..Default::default()
    };
    let mut shapes = [
        rknn_matmul_shape { M: 1, K: 64, N: 32 },
        rknn_matmul_shape { M: 1, K: 64, N: 64 },
    ];
    let mut ios = [rknn_matmul_io_attr::default(); 2];
    let ctx = create_dynamic(&emu, &mut info, &mut shapes, &mut ios).unwrap();
    let scales: Vec<f32> = (1..=64).map(|i| i as f32 / 8.0).collect();
    // SAFETY: quant params point at live vectors; memories sized for the largest shape.
    unsafe {
        for len in [32usize, 65] {
            let mut q = Quant {
                name: "B",
                scale: vec![1.0; len],
                zp: vec![],
            };
            assert_eq!(
                set_quant(ctx, &mut quant_params(&mut q)),
                RKNN_ERR_PARAM_INVALID,
                "{len} scales"
            );
        }
        let mut q = Quant {
            name: "B",
            scale: scales.clone(),
            zp: vec![],
        };
        assert_eq!(
            set_quant(ctx, &mut quant_params(&mut q)),
            0,
            "{}",
            last_error()
        );
        // Run the second shape: column j is scaled by scales[j] (A = 1, B = 1: sum = 64).
        let set = api.rknn_matmul_set_dynamic_shape.unwrap();
        let mems =
            [ios[1].A.size, ios[1].B.size, ios[1].C.size].map(|s| (api.rknn_create_mem)(ctx, s));
        std::ptr::write_bytes((*mems[0]).virt_addr.cast::<u8>(), 1, ios[1].A.size as usize);
        std::ptr::write_bytes((*mems[1]).virt_addr.cast::<u8>(), 1, ios[1].B.size as usize);
        assert_eq!(set(ctx, &mut shapes[1]), 0);
        for (mem, attr) in mems
            .iter()
            .zip([&mut ios[1].A, &mut ios[1].B, &mut ios[1].C])
        {
            assert_eq!((api.rknn_matmul_set_io_mem)(ctx, *mem, attr), 0);
        }
        assert_eq!((api.rknn_matmul_run)(ctx), 0, "{}", last_error());
        let c = std::slice::from_raw_parts((*mems[2]).virt_addr as *const f32, 64);
        for (j, &v) in c.iter().enumerate() {
            assert_eq!(v, 64.0 * scales[j], "column {j}");
        }
        for m in mems {
            assert_eq!((api.rknn_destroy_mem)(ctx, m), 0);
        }
        assert_eq!((api.rknn_matmul_destroy)(ctx), 0);
    }
}

#[test]
fn a_memory_of_another_iommu_domain_cannot_be_bound() {
    let emu = emulator(Platform::Rk3588);
    let api = emu.api();
    let make = |domain: i32| {
        let mut info = rknn_matmul_info {
            M: 1,
            K: 32,
            N: 32,
            type_: RKNN_INT8_MM_INT8_TO_INT32,
            iommu_domain_id: domain,
            ..Default::default()
        };
        let mut io = rknn_matmul_io_attr::default();
        let mut ctx = 0;
        // SAFETY: valid pointers.
        let rc = unsafe { (api.rknn_matmul_create)(&mut ctx, &mut info, &mut io) };
        assert_eq!(rc, 0);
        (ctx, io)
    };
    let (c0, mut io0) = make(0);
    let (c1, _) = make(1);
    let (c0b, _) = make(0);
    // SAFETY: memories on live contexts, destroyed before them.
    unsafe {
        let foreign = (api.rknn_create_mem)(c1, io0.A.size);
        assert_eq!(
            (api.rknn_matmul_set_io_mem)(c0, foreign, &mut io0.A),
            RKNN_ERR_PARAM_INVALID
        );
        assert!(
            last_error().contains("IOMMU domain 1") && last_error().contains("domain 0"),
            "{}",
            last_error()
        );
        // Another context of the same domain shares its address space.
        let same = (api.rknn_create_mem)(c0b, io0.A.size);
        assert_eq!((api.rknn_matmul_set_io_mem)(c0, same, &mut io0.A), 0);
        assert_eq!((api.rknn_destroy_mem)(c1, foreign), 0);
        assert_eq!((api.rknn_destroy_mem)(c0b, same), 0);
        for c in [c0, c1, c0b] {
            assert_eq!((api.rknn_matmul_destroy)(c), 0);
        }
    }
}

/// A memory of another context of the same domain, and one of the context itself, bound to a
/// context under `policy`; returns the two `set_io_mem` codes and the last error after the first.
fn bind_foreign_and_own(policy: SharedMemories) -> (i32, String, i32) {
    let mut cfg = EmuConfig::new(Platform::Rk3588);
    cfg.shared_memories = policy;
    cfg.log_errors = false;
    let emu = Emulator::new(cfg).unwrap();
    let api = emu.api();
    let (ctx, mut io) = ctx_i8(&emu, 1, 32, 32);
    let (other, _) = ctx_i8(&emu, 1, 32, 32);
    // SAFETY: memories on live contexts, destroyed before them.
    unsafe {
        let foreign = (api.rknn_create_mem)(other, io.A.size);
        let own = (api.rknn_create_mem)(ctx, io.A.size);
        assert!(!foreign.is_null() && !own.is_null());
        let foreign_rc = (api.rknn_matmul_set_io_mem)(ctx, foreign, &mut io.A);
        let why = last_error();
        let own_rc = (api.rknn_matmul_set_io_mem)(ctx, own, &mut io.A);
        assert_eq!((api.rknn_destroy_mem)(other, foreign), 0);
        assert_eq!((api.rknn_destroy_mem)(ctx, own), 0);
        for c in [ctx, other] {
            assert_eq!((api.rknn_matmul_destroy)(c), 0);
        }
        (foreign_rc, why, own_rc)
    }
}

#[test]
fn a_memory_of_another_context_is_bound_by_default() {
    assert_eq!(EmuConfig::default().shared_memories, SharedMemories::Accept);
    let (foreign, _, own) = bind_foreign_and_own(SharedMemories::Accept);
    assert_eq!((foreign, own), (0, 0));
}

#[test]
fn shared_memories_refuse_fails_a_memory_of_another_context_and_says_why() {
    let (foreign, why, own) = bind_foreign_and_own(SharedMemories::Refuse);
    assert_eq!(foreign, RKNN_ERR_PARAM_INVALID);
    assert!(
        why.contains("created on context")
            && why.contains("refuses a memory of another context")
            && why.contains("RKNN_EMU_SHARED_MEMORIES=refuse"),
        "{why}"
    );
    assert_eq!(own, 0, "a memory of the context itself is still bound");
}

#[test]
fn shared_memories_refuse_still_binds_a_memory_allocated_without_a_context() {
    let mut cfg = EmuConfig::new(Platform::Rk3588);
    cfg.shared_memories = SharedMemories::Refuse;
    let emu = Emulator::new(cfg).unwrap();
    let api = emu.api();
    let (ctx, mut io) = ctx_i8(&emu, 1, 32, 32);
    let create2 = api.rknn_create_mem2.unwrap();
    // SAFETY: a memory without a context, bound to and destroyed before a live context.
    unsafe {
        let mem = create2(0, io.A.size.into(), RKNN_MEM_FLAG_ALLOC_NO_CONTEXT.into());
        assert!(!mem.is_null(), "{}", last_error());
        assert_eq!((api.rknn_matmul_set_io_mem)(ctx, mem, &mut io.A), 0);
        assert_eq!((api.rknn_destroy_mem)(0, mem), 0);
        assert_eq!((api.rknn_matmul_destroy)(ctx), 0);
    }
}

#[test]
fn a_run_after_a_bound_memory_was_destroyed_fails() {
    for (victim, code) in [
        (0, RKNN_ERR_INPUT_INVALID),
        (1, RKNN_ERR_INPUT_INVALID),
        (2, RKNN_ERR_OUTPUT_INVALID),
    ] {
        let emu = emulator(Platform::Rk3588);
        let (ctx, mut io) = ctx_i8(&emu, 1, 32, 32);
        let api = emu.api();
        // SAFETY: memories on a live context; the destroyed one is never touched again.
        unsafe {
            let mut mems = [io.A.size, io.B.size, io.C.size].map(|s| (api.rknn_create_mem)(ctx, s));
            for (mem, attr) in mems.iter().zip([&mut io.A, &mut io.B, &mut io.C]) {
                assert_eq!((api.rknn_matmul_set_io_mem)(ctx, *mem, attr), 0);
            }
            assert_eq!((api.rknn_matmul_run)(ctx), 0);
            assert_eq!((api.rknn_destroy_mem)(ctx, mems[victim]), 0);
            // A new memory may land at the freed address: still not the bound memory.
            mems[victim] = (api.rknn_create_mem)(ctx, [io.A.size, io.B.size, io.C.size][victim]);
            assert_eq!((api.rknn_matmul_run)(ctx), code, "matrix {victim}");
            let name = ["A", "B", "C"][victim];
            assert!(
                last_error().contains(&format!("{name}'s memory was destroyed")),
                "{}",
                last_error()
            );
            // Binding the new memory makes the context usable again.
            let attr = [&mut io.A, &mut io.B, &mut io.C]
                .into_iter()
                .nth(victim)
                .unwrap();
            assert_eq!((api.rknn_matmul_set_io_mem)(ctx, mems[victim], attr), 0);
            assert_eq!((api.rknn_matmul_run)(ctx), 0);
            for m in mems {
                assert_eq!((api.rknn_destroy_mem)(ctx, m), 0);
            }
            assert_eq!((api.rknn_matmul_destroy)(ctx), 0);
        }
    }
}

/// Runs test `name` of this binary again in a child process with `CHILD_ENV` set, and returns
/// its exit status and output; `None` (after saying why) where no child can run, as under
/// qemu-user without binfmt.
fn in_child(name: &str) -> Option<std::process::Output> {
    let out = match std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", name, "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, "1")
        .output()
    {
        Ok(out) => out,
        Err(e) if e.raw_os_error() == Some(8) => {
            eprintln!("skipped: cannot start a child process here ({e})");
            return None;
        }
        Err(e) => panic!("spawn the child: {e}"),
    };
    if !String::from_utf8_lossy(&out.stdout).contains("running 1 test") {
        eprintln!(
            "skipped: the child process did not start ({})",
            String::from_utf8_lossy(&out.stderr).trim()
        );
        return None;
    }
    Some(out)
}

const CHILD_ENV: &str = "RKNN_EMU_TEST_CHILD";

fn is_child() -> bool {
    std::env::var_os(CHILD_ENV).is_some()
}

#[cfg(unix)]
#[test]
#[cfg_attr(miri, ignore = "mmap guard pages and child processes")]
fn memories_are_page_aligned_mappings_whose_overrun_faults() {
    let emu = emulator(Platform::Rk3588);
    let (ctx, _) = ctx_i8(&emu, 1, 32, 32);
    let api = emu.api();
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
    // SAFETY: writes stay within the page-rounded mapping until the child's deliberate overrun.
    unsafe {
        let mem = (api.rknn_create_mem)(ctx, 100);
        let base = (*mem).virt_addr.cast::<u8>();
        assert_eq!(
            base.addr() % page,
            0,
            "page aligned, like a dma-buf mapping"
        );
        // The rounding up to the page is mapped (a board maps whole pages too).
        base.add(page - 1).write_volatile(1);
        if is_child() {
            // The first byte after the rounded size is the guard page: this write faults.
            base.add(page).write_volatile(1);
            // Not reached when the guard works; exit cleanly so the parent sees the difference.
            std::process::exit(0);
        }
        assert_eq!((api.rknn_destroy_mem)(ctx, mem), 0);
        assert_eq!((api.rknn_matmul_destroy)(ctx), 0);
    }
    let Some(out) = in_child("memories_are_page_aligned_mappings_whose_overrun_faults") else {
        return;
    };
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(
        out.status.signal(),
        Some(libc::SIGSEGV),
        "an overrun into the guard page must fault: {:?}",
        out.status
    );
}

#[cfg(unix)]
#[test]
#[cfg_attr(miri, ignore = "setrlimit and child processes")]
fn huge_allocations_under_a_small_address_space_return_null() {
    if !is_child() {
        let Some(out) = in_child("huge_allocations_under_a_small_address_space_return_null") else {
            return;
        };
        assert!(
            out.status.success(),
            "the child must finish, not abort: {:?}\n{}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        return;
    }
    // A small board: 2 GiB of address space for the whole process (this child only).
    let limit = libc::rlimit {
        rlim_cur: 2 << 30,
        rlim_max: 2 << 30,
    };
    // SAFETY: a valid rlimit for this process.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_AS, &limit) }, 0);
    let emu = emulator(Platform::Rk3588);
    let (ctx, _) = ctx_i8(&emu, 1, 32, 32);
    let api = emu.api();
    let create2 = api.rknn_create_mem2.unwrap();
    // SAFETY: allocation calls on a live context; only non-NULL results are freed.
    unsafe {
        assert!((api.rknn_create_mem)(ctx, 0xFFFF_FFFF).is_null());
        let msg = last_error();
        assert!(msg.contains("could not map 4294967295 bytes"), "{msg}");
        assert!(create2(ctx, 0xFFFF_FFFF, 0).is_null());
        assert!(create2(ctx, 3 << 30, 0).is_null());
        assert!(create2(ctx, 1 << 40, 0).is_null());
        assert!(last_error().contains("uint32_t"), "{}", last_error());
        assert!(create2(ctx, u64::MAX, 0).is_null());
        // Strict cache emulation maps twice: 2 x 1 GiB does not fit, and the first mapping is
        // released when the second fails...
        let mut cfg = EmuConfig::new(Platform::Rk3588);
        cfg.strict_cache = true;
        let strict = Emulator::new(cfg).unwrap();
        let (c2, _) = ctx_i8(&strict, 1, 32, 32);
        assert!((strict.api().rknn_create_mem)(c2, 1 << 30).is_null());
        // ...so 1 GiB still fits (it would not beside a leaked 1 GiB).
        let ok = (api.rknn_create_mem)(ctx, 1 << 30);
        assert!(!ok.is_null(), "{}", last_error());
        assert_eq!((api.rknn_destroy_mem)(ctx, ok), 0);
        assert_eq!(emu.stats().memories, 0);
        assert_eq!(emu.domain_used(0), 0, "failed allocations are not charged");
        assert_eq!((api.rknn_matmul_destroy)(ctx), 0);
        assert_eq!((strict.api().rknn_matmul_destroy)(c2), 0);

        // Binding reads A into host buffers: a 1 GiB f16 A needs 3 GiB more here, which this
        // address space does not have. The bind fails with an error instead of aborting.
        let mut info = rknn_matmul_info {
            M: 16384,
            K: 32768,
            N: 16,
            type_: RKNN_FLOAT16_MM_FLOAT16_TO_FLOAT32,
            ..Default::default()
        };
        let mut io = rknn_matmul_io_attr::default();
        let mut big = 0;
        assert_eq!((api.rknn_matmul_create)(&mut big, &mut info, &mut io), 0);
        assert_eq!(io.A.size, 1 << 30);
        let a = (api.rknn_create_mem)(big, io.A.size);
        assert!(!a.is_null(), "{}", last_error());
        assert_eq!(
            (api.rknn_matmul_set_io_mem)(big, a, &mut io.A),
            RKNN_ERR_MALLOC_FAIL
        );
        assert!(
            last_error().contains("out of host memory"),
            "{}",
            last_error()
        );
        assert_eq!((api.rknn_destroy_mem)(big, a), 0);
        assert_eq!((api.rknn_matmul_destroy)(big), 0);
    }
}
