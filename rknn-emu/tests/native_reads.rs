//! Inputs in a native layout are read from their memory by every run (normal layouts are
//! taken at bind time, see `hazards.rs`), in column panels when B is large: results against
//! naive references over shapes with many panels and K segments, the semantics of reading at
//! run time (with and without strict cache emulation), a memory bound as both an input and C,
//! and two contexts whose B and C memories cross.

mod common;

use std::sync::mpsc;
use std::time::Duration;

use common::*;
use rknn_chip::Platform;
use rknn_emu::{EmuConfig, Emulator};
use rknn_sys::*;

const NATIVE: Layouts = Layouts {
    ac_native: true,
    b: 1,
};

fn ints(v: &Values) -> &[i32] {
    match v {
        Values::Int(x) => x,
        Values::Float(_) => panic!("ints expected"),
    }
}

fn floats(v: &Values) -> Vec<f64> {
    match v {
        Values::Int(x) => x.iter().map(|&x| f64::from(x)).collect(),
        Values::Float(x) => x.iter().map(|&x| f64::from(x)).collect(),
    }
}

/// Exact integer products in i64 (B row-major [K, N]).
fn int_reference(a: &[i32], b: &[i32], m: usize, k: usize, n: usize) -> Vec<i64> {
    let mut c = vec![0i64; m * n];
    for i in 0..m {
        for j in 0..n {
            c[i * n + j] = (0..k)
                .map(|x| i64::from(a[i * k + x]) * i64::from(b[x * n + j]))
                .sum();
        }
    }
    c
}

#[test]
fn i8_results_are_exact_over_many_panels_and_k_segments() {
    let mut rng = fastrand::Rng::with_seed(0x00AA_71E5);
    let mut runs = 0;
    // RK3588: 32-column tiles and K segments of 8192; RK3566: 16-column tiles. Rows 1-3 take
    // the native matrix-vector kernel, more rows the unpacked panels (K = 2048: 128 columns a
    // panel; K = 15360: 32 columns a panel, across two segments).
    for (p, shapes) in [
        (
            Platform::Rk3588,
            &[(2048usize, 160usize), (15360, 96), (64, 4096)][..],
        ),
        (Platform::Rk3566, &[(2048, 80), (96, 2000)][..]),
    ] {
        let emu = emulator(p);
        for &(k, n) in shapes {
            for m in [1, 2, 3, 4, 7] {
                for layouts in [
                    NATIVE,
                    Layouts {
                        ac_native: false,
                        b: 1,
                    },
                ] {
                    let a = random_values(&mut rng, RKNN_TENSOR_INT8, m * k);
                    let b = random_values(&mut rng, RKNN_TENSOR_INT8, k * n);
                    let out = Run::new(&emu, RKNN_INT8_MM_INT8_TO_INT32, m, k, n, layouts)
                        .go(&a, &b)
                        .unwrap_or_else(|rc| panic!("{p} M={m} K={k} N={n}: rc {rc}"));
                    let want = int_reference(ints(&a), ints(&b), m, k, n);
                    for (i, (&g, &w)) in ints(&out.c).iter().zip(&want).enumerate() {
                        assert_eq!(i64::from(g), w, "{p} {layouts:?} M={m} K={k} N={n} at {i}");
                    }
                    runs += 1;
                }
            }
        }
    }
    assert_eq!(runs, 50);
}

#[test]
fn i8_to_f32_per_group_params_follow_their_columns_across_panels() {
    // K = 4096: 64 columns a panel, so N = 96 spans two panels and the second one's columns
    // must read their own scales and zero points.
    let emu = emulator(Platform::Rk3588);
    let mut rng = fastrand::Rng::with_seed(77);
    let (k, n, group) = (4096, 96, 64);
    for m in [1, 5] {
        let a = random_values(&mut rng, RKNN_TENSOR_INT8, m * k);
        let b = random_values(&mut rng, RKNN_TENSOR_INT8, k * n);
        let len = n * k / group;
        // Powers of two keep every product of scales exact in f64.
        let sb: Vec<f32> = (0..len).map(|_| 2f32.powi(rng.i32(-8..=-2))).collect();
        let zb: Vec<i32> = (0..len).map(|_| rng.i32(-4..=4)).collect();
        let (sa, za) = (0.25f32, 3);
        let mut run = Run::new(&emu, RKNN_INT8_MM_INT8_TO_FLOAT32, m, k, n, NATIVE);
        run.b_quant_type = RKNN_QUANT_TYPE_PER_GROUP_ASYM as i16;
        run.group_size = group as i16;
        run.quant.push(Quant {
            name: "A",
            scale: vec![sa],
            zp: vec![za],
        });
        run.quant.push(Quant {
            name: "B",
            scale: sb.clone(),
            zp: zb.clone(),
        });
        let out = run.go(&a, &b).unwrap();
        let (ai, bi) = (ints(&a), ints(&b));
        let got = floats(&out.c);
        for i in 0..m {
            for j in 0..n {
                let p = |x: usize| (x / group) * n + j;
                let want: f64 = (0..k)
                    .map(|x| {
                        f64::from(sa)
                            * f64::from(sb[p(x)])
                            * f64::from(ai[i * k + x] - za)
                            * f64::from(bi[x * n + j] - zb[p(x)])
                    })
                    .sum();
                assert_eq!(got[i * n + j], f64::from(want as f32), "M={m} C[{i},{j}]");
            }
        }
    }
}

#[test]
fn f16_results_are_within_tolerance_over_many_panels() {
    // f16 K = 4096: 16 columns a panel of f32, so N = 48 is three panels.
    let emu = emulator(Platform::Rk3588);
    let mut rng = fastrand::Rng::with_seed(78);
    let (k, n) = (4096, 48);
    for (t, f16_out) in [
        (RKNN_FLOAT16_MM_FLOAT16_TO_FLOAT32, false),
        (RKNN_FLOAT16_MM_FLOAT16_TO_FLOAT16, true),
    ] {
        for m in [1, 6] {
            let a = random_values(&mut rng, RKNN_TENSOR_FLOAT16, m * k);
            let b = random_values(&mut rng, RKNN_TENSOR_FLOAT16, k * n);
            let out = Run::new(&emu, t, m, k, n, NATIVE).go(&a, &b).unwrap();
            let (af, bf) = (floats(&a), floats(&b));
            let got = floats(&out.c);
            for i in 0..m {
                for j in 0..n {
                    let want: f64 = (0..k).map(|x| af[i * k + x] * bf[x * n + j]).sum();
                    let mag: f64 = (0..k).map(|x| (af[i * k + x] * bf[x * n + j]).abs()).sum();
                    let mut tol = 1e-5 * mag + 1e-6;
                    if f16_out {
                        tol += want.abs() / 1024.0;
                    }
                    let g = got[i * n + j];
                    assert!((g - want).abs() <= tol, "M={m} C[{i},{j}]={g} want {want}");
                }
            }
        }
    }
}

/// A native i8 context M=1 K=32 N=32 with A, B and C memories.
struct Small<'a> {
    emu: &'a Emulator,
    ctx: rknn_matmul_ctx,
    io: rknn_matmul_io_attr,
    mems: [*mut rknn_tensor_mem; 3],
}

impl<'a> Small<'a> {
    fn new(emu: &'a Emulator) -> Small<'a> {
        let api = emu.api();
        let mut info = rknn_matmul_info {
            M: 1,
            K: 32,
            N: 32,
            type_: RKNN_INT8_MM_INT8_TO_INT32,
            B_layout: 1,
            AC_layout: 1,
            ..Default::default()
        };
        let mut io = rknn_matmul_io_attr::default();
        let mut ctx = 0;
        // SAFETY: valid pointers for the calls; memories of the reported sizes.
        unsafe {
            assert_eq!((api.rknn_matmul_create)(&mut ctx, &mut info, &mut io), 0);
            let mems = [io.A.size, io.B.size, io.C.size].map(|s| (api.rknn_create_mem)(ctx, s));
            assert!(mems.iter().all(|m| !m.is_null()));
            Small { emu, ctx, io, mems }
        }
    }

    /// Fills memory `i` (CPU view) with `v`.
    fn fill(&self, i: usize, v: i8) {
        let size = [self.io.A.size, self.io.B.size][i] as usize;
        // SAFETY: a live memory of `size` bytes.
        unsafe { std::ptr::write_bytes((*self.mems[i]).virt_addr.cast::<u8>(), v as u8, size) };
    }

    fn bind_all(&mut self) {
        let api = self.emu.api();
        // SAFETY: live memories of the context, attrs from its io_attr.
        unsafe {
            for (mem, attr) in
                self.mems
                    .iter()
                    .zip([&mut self.io.A, &mut self.io.B, &mut self.io.C])
            {
                assert_eq!((api.rknn_matmul_set_io_mem)(self.ctx, *mem, attr), 0);
            }
        }
    }

    fn sync(&self, i: usize, mode: rknn_mem_sync_mode) {
        // SAFETY: a live memory of the context.
        let rc = unsafe { (self.emu.api().rknn_mem_sync.unwrap())(self.ctx, self.mems[i], mode) };
        assert_eq!(rc, 0);
    }

    /// Runs and returns C[0] as the CPU sees it.
    fn run(&self) -> i32 {
        // SAFETY: a live context with its memories bound; C holds at least one i32.
        unsafe {
            assert_eq!((self.emu.api().rknn_matmul_run)(self.ctx), 0);
            *((*self.mems[2]).virt_addr as *const i32)
        }
    }
}

impl Drop for Small<'_> {
    fn drop(&mut self) {
        let api = self.emu.api();
        // SAFETY: the context's own memories, then the context.
        unsafe {
            for m in self.mems {
                assert_eq!((api.rknn_destroy_mem)(self.ctx, m), 0);
            }
            assert_eq!((api.rknn_matmul_destroy)(self.ctx), 0);
        }
    }
}

#[test]
fn native_inputs_are_read_by_every_run() {
    let emu = emulator(Platform::Rk3588);
    let mut s = Small::new(&emu);
    s.fill(0, 2);
    s.fill(1, 1);
    s.bind_all();
    assert_eq!(s.run(), 64);
    // No bind in between: the run reads the memories as they are now.
    s.fill(0, 3);
    assert_eq!(s.run(), 96);
    s.fill(1, -2);
    assert_eq!(s.run(), -192);
}

#[test]
fn native_inputs_still_need_a_sync_under_strict_cache_emulation() {
    let mut cfg = EmuConfig::new(Platform::Rk3588);
    cfg.strict_cache = true;
    let emu = Emulator::new(cfg).unwrap();
    let mut s = Small::new(&emu);
    s.fill(0, 2);
    s.fill(1, 1);
    s.sync(0, RKNN_MEMORY_SYNC_TO_DEVICE);
    s.sync(1, RKNN_MEMORY_SYNC_TO_DEVICE);
    s.bind_all();
    s.run();
    s.sync(2, RKNN_MEMORY_SYNC_FROM_DEVICE);
    assert_eq!(s.run(), 64);
    s.fill(0, 3);
    s.run();
    s.sync(2, RKNN_MEMORY_SYNC_FROM_DEVICE);
    assert_eq!(s.run(), 64, "the device has not seen the CPU's write yet");
    s.sync(0, RKNN_MEMORY_SYNC_TO_DEVICE);
    s.run();
    assert_eq!(s.run(), 64, "C not synced back yet");
    s.sync(2, RKNN_MEMORY_SYNC_FROM_DEVICE);
    assert_eq!(s.run(), 96);
}

#[test]
fn one_memory_bound_as_b_and_as_c_reads_b_before_writing_c() {
    let emu = emulator(Platform::Rk3588);
    let api = emu.api();
    let mut rng = fastrand::Rng::with_seed(5);
    // M = 1 and M = 5 (the two native paths); B (K x N bytes) is larger than C (M x N x 4).
    for m in [1usize, 5] {
        let (k, n) = (64usize, 32usize);
        let mut info = rknn_matmul_info {
            M: m as i32,
            K: k as i32,
            N: n as i32,
            type_: RKNN_INT8_MM_INT8_TO_INT32,
            B_layout: 1,
            AC_layout: 1,
            ..Default::default()
        };
        let mut io = rknn_matmul_io_attr::default();
        let mut ctx = 0;
        let a = random_values(&mut rng, RKNN_TENSOR_INT8, m * k);
        let b = random_values(&mut rng, RKNN_TENSOR_INT8, k * n);
        let a_bytes: Vec<u8> = native_a_order(m, k, 16)
            .iter()
            .map(|o| o.map_or(0, |i| ints(&a)[i] as i8 as u8))
            .collect();
        let b_bytes: Vec<u8> = native_b_order(k, n, 32, 32, Some(8192))
            .iter()
            .map(|o| o.map_or(0, |i| ints(&b)[i] as i8 as u8))
            .collect();
        // SAFETY: valid pointers; memories written within their sizes.
        unsafe {
            assert_eq!((api.rknn_matmul_create)(&mut ctx, &mut info, &mut io), 0);
            assert!(io.B.size >= io.C.size);
            let ma = (api.rknn_create_mem)(ctx, io.A.size);
            let mbc = (api.rknn_create_mem)(ctx, io.B.size);
            std::ptr::copy_nonoverlapping(a_bytes.as_ptr(), (*ma).virt_addr.cast(), a_bytes.len());
            std::ptr::copy_nonoverlapping(b_bytes.as_ptr(), (*mbc).virt_addr.cast(), b_bytes.len());
            assert_eq!((api.rknn_matmul_set_io_mem)(ctx, ma, &mut io.A), 0);
            assert_eq!((api.rknn_matmul_set_io_mem)(ctx, mbc, &mut io.B), 0);
            assert_eq!((api.rknn_matmul_set_io_mem)(ctx, mbc, &mut io.C), 0);
            assert_eq!((api.rknn_matmul_run)(ctx), 0);
            let want = int_reference(ints(&a), ints(&b), m, k, n);
            let c = (*mbc).virt_addr as *const i32;
            for i in 0..m {
                for j in 0..n {
                    let got = *c.add(native_c_index(m, 4, i, j));
                    assert_eq!(i64::from(got), want[i * n + j], "M={m} C[{i},{j}]");
                }
            }
            assert_eq!((api.rknn_destroy_mem)(ctx, ma), 0);
            assert_eq!((api.rknn_destroy_mem)(ctx, mbc), 0);
            assert_eq!((api.rknn_matmul_destroy)(ctx), 0);
        }
    }
}

#[test]
fn two_contexts_whose_b_and_c_cross_do_not_deadlock() {
    // Context 1 reads P as B and writes Q as C while context 2 reads Q and writes P, on two
    // threads at once: each run locks one memory for reading and one for writing, in one
    // global order. A smoke test of that path (results are racy by construction, only the
    // return codes are checked): a wrong order would deadlock only when both threads take
    // their first lock within the same few nanoseconds, which this cannot force.
    let emu = emulator(Platform::Rk3588);
    let api = emu.api();
    let run = api.rknn_matmul_run;
    let (k, n) = (2048usize, 256usize);
    let mut ctxs = [0 as rknn_matmul_ctx; 2];
    let mut ios = [rknn_matmul_io_attr::default(); 2];
    let mut mems = Vec::new();
    // SAFETY: valid pointers; every memory is at least the size of what it is bound as.
    unsafe {
        for (ctx, io) in ctxs.iter_mut().zip(&mut ios) {
            let mut info = rknn_matmul_info {
                M: 1,
                K: k as i32,
                N: n as i32,
                type_: RKNN_INT8_MM_INT8_TO_INT32,
                B_layout: 1,
                AC_layout: 1,
                ..Default::default()
            };
            assert_eq!((api.rknn_matmul_create)(ctx, &mut info, io), 0);
        }
        let size = ios[0].B.size.max(ios[0].C.size);
        let p =
            (api.rknn_create_mem2.unwrap())(0, size.into(), RKNN_MEM_FLAG_ALLOC_NO_CONTEXT.into());
        let q =
            (api.rknn_create_mem2.unwrap())(0, size.into(), RKNN_MEM_FLAG_ALLOC_NO_CONTEXT.into());
        for (i, (&ctx, io)) in ctxs.iter().zip(&mut ios).enumerate() {
            let a = (api.rknn_create_mem)(ctx, io.A.size);
            let (b, c) = if i == 0 { (p, q) } else { (q, p) };
            assert_eq!((api.rknn_matmul_set_io_mem)(ctx, a, &mut io.A), 0);
            assert_eq!((api.rknn_matmul_set_io_mem)(ctx, b, &mut io.B), 0);
            assert_eq!((api.rknn_matmul_set_io_mem)(ctx, c, &mut io.C), 0);
            mems.push((ctx, a));
        }
        let (done_tx, done_rx) = mpsc::channel();
        let start = std::sync::Arc::new(std::sync::Barrier::new(2));
        for &ctx in &ctxs {
            let (done, start) = (done_tx.clone(), start.clone());
            std::thread::spawn(move || {
                start.wait();
                let ok = (0..2000).all(|_| run(ctx) == 0);
                let _ = done.send(ok);
            });
        }
        for _ in 0..2 {
            let ok = done_rx
                .recv_timeout(Duration::from_secs(120))
                .expect("the runs deadlocked");
            assert!(ok, "a run failed");
        }
        for (ctx, a) in mems {
            assert_eq!((api.rknn_destroy_mem)(ctx, a), 0);
        }
        assert_eq!((api.rknn_destroy_mem)(0, p), 0);
        assert_eq!((api.rknn_destroy_mem)(0, q), 0);
        for ctx in ctxs {
            assert_eq!((api.rknn_matmul_destroy)(ctx), 0);
        }
    }
}
