//! The cost model against every documented RK3588 measurement it is calibrated to, and the
//! modelled device time the emulator keeps per run.

mod common;

use common::{Layouts, Run as EmuRun, Values};
use rknn_chip::{MatmulType, Platform};
use rknn_emu::cost::{self, Bound, CAMPAIGN_9B, CostModel, RK3588, Run, TOLERANCE};
use rknn_emu::{BusyCores, CostPolicy, EmuConfig, Emulator};
use rknn_sys::*;

fn run(m: usize, k: usize, n: usize, t: MatmulType, busy: usize) -> cost::RunCost {
    RK3588.run(&Run {
        m,
        k,
        n,
        t,
        busy_cores: busy,
    })
}

#[test]
fn every_calibration_point_is_within_its_tolerance() {
    let points = cost::calibration(&RK3588);
    assert!(points.len() >= 10, "{} points", points.len());
    let mut failures = vec![];
    for p in &points {
        println!(
            "{:<45} measured {:>8.3} modelled {:>8.3} {:<6} error {:+6.1} % (tolerance {:.0} %)",
            p.what,
            p.measured,
            p.modelled,
            p.unit,
            100.0 * p.error(),
            100.0 * p.tolerance
        );
        assert!(p.modelled.is_finite() && p.modelled > 0.0, "{p:?}");
        // A wider tolerance must say why.
        assert!(p.tolerance == TOLERANCE || !p.note.is_empty(), "{p:?}");
        if p.error().abs() > p.tolerance {
            failures.push(p.what);
        }
    }
    assert!(failures.is_empty(), "outside tolerance: {failures:?}");
    // The micro-benchmark points, which involve no host time, are all held to 15 %.
    let micro: Vec<_> = points.iter().filter(|p| p.unit != "tok/s").collect();
    assert!(micro.len() >= 6);
    assert!(micro.iter().all(|p| p.tolerance == TOLERANCE));
}

#[test]
fn the_calibration_is_frozen() {
    // Frozen calibration: changing it needs a re-validation against the table in
    // docs/npu-matmul-performance.md. (An exhaustive literal: a new field fails to compile
    // here until it is frozen too.)
    let frozen = CostModel {
        platform: Platform::Rk3588,
        call_s: 50e-6,
        peak_i8: 2.0e12,
        peak_f16: 1.0e12,
        peak_i4: 4.0e12,
        a_block_bytes: 131_072.0,
        core_bw: 11.2e9,
        ddr_bw: 30.3e9,
        k_segment: Some(8192),
        cliff_ops: 21.5e9,
        cores: 3,
    };
    assert_eq!(RK3588, frozen);
    // Frozen calibration: changing it needs a re-validation against the table in
    // docs/npu-matmul-performance.md.
    assert_eq!(cost::host::DECODE_SHARE, 0.078);
    assert_eq!(cost::host::PREFILL_512_S, 0.203 * 512.0 / 18.28);
    assert_eq!(cost::host::DECODE_SCALING_BUILD_S, 0.078 / 0.89);
    assert_eq!(cost::host::A76_PINNED_DECODE_SPEEDUP, 1.128);
    assert_eq!(cost::host::A76_PINNED_PREFILL_SPEEDUP, 1.189);
    // Frozen calibration: the 9B stand-in the decode bandwidth was fitted with.
    let d = CAMPAIGN_9B;
    assert_eq!(
        (d.layers, d.hidden, d.n_ff, d.q_dim, d.kv_dim, d.vocab),
        (36, 4096, 15360, 4096, 1024, 151_936)
    );
}

#[test]
fn the_seeds_board_figures_are_reproduced_without_refitting() {
    // The campaign's measured figures, each against the calibrated model as it stands.
    let within = |what: &str, modelled: f64, measured: f64| {
        let error = (modelled - measured) / measured;
        println!(
            "{what:<40} measured {measured:>7.3} modelled {modelled:>7.3} error {:+5.1} %",
            100.0 * error
        );
        assert!(
            error.abs() <= TOLERANCE,
            "{what}: {modelled} against {measured}"
        );
    };
    let p = RK3588.predict_llm(&CAMPAIGN_9B);
    within("9B Q8_0 tg128, unpinned", p.decode_tok_s, 2.98);
    within("9B Q8_0 tg128, A76-pinned", p.decode_pinned_tok_s, 3.35);
    within("9B Q8_0 pp512, unpinned", p.prefill_tok_s, 42.1);
    within("9B Q8_0 pp512, A76-pinned", p.prefill_pinned_tok_s, 51.37);
    let t = MatmulType::I8_I8_I32;
    within(
        "i8 4096³, one core (TOPS)",
        run(4096, 4096, 4096, t, 1).tops(),
        0.69,
    );
    within(
        "i8 4096³, three cores (TOPS)",
        3.0 * run(4096, 4096, 4096, t, 3).tops(),
        1.83,
    );
    let cliff = run(512, 15360, 4096, t, 1);
    within("K = 15360 cliff (TOPS)", cliff.tops(), 0.02);
    within(
        "K = 15360 over 4096³ run time (×)",
        cliff.total_s / run(4096, 4096, 4096, t, 1).total_s,
        14.0,
    );
    // Pinning only ever speeds things up, and the host part of the 9B's prefill is the
    // campaign's measured host time itself.
    assert!(p.decode_pinned_tok_s > p.decode_tok_s && p.prefill_pinned_tok_s > p.prefill_tok_s);
    assert_eq!(p.prefill_host_s, cost::host::PREFILL_512_S);
    assert_eq!(p.prompt, 512);
}

#[test]
fn the_field_figures_come_out_of_the_formula() {
    // i8 4096³ on one core, worked by hand from the documented formula: 32 rows of 4096 bytes
    // fill the 128 KiB block, so B (16 MiB) streams 128 times; A (16 MiB) and C (64 MiB of
    // i32) move once; memory-bound at 11.2 GB/s, plus 50 µs per call.
    let r = run(4096, 4096, 4096, MatmulType::I8_I8_I32, 1);
    let bytes = 128.0 * 16_777_216.0 + 16_777_216.0 + 67_108_864.0;
    assert_eq!(r.passes, 128);
    assert_eq!(r.bytes, bytes);
    assert_eq!(r.bound, Bound::Memory);
    let expected = 50e-6 + bytes / 11.2e9;
    assert!(
        (r.total_s - expected).abs() < 1e-12,
        "{} vs {expected}",
        r.total_s
    );
    assert!((r.tops() - 0.69).abs() < 0.005, "{}", r.tops());
    // K above the 8192-row segment: the cliff rate, whatever the memory term says.
    let c = run(512, 15360, 4096, MatmulType::I8_I8_I32, 1);
    assert_eq!(c.bound, Bound::KCliff);
    assert!((c.total_s - (50e-6 + c.ops / 21.5e9)).abs() < 1e-9);
    // With bandwidth to spare the rated compute rate binds.
    let fast = CostModel {
        core_bw: 1e15,
        ddr_bw: 1e15,
        ..RK3588
    };
    let s = fast.run(&Run {
        m: 4096,
        k: 4096,
        n: 4096,
        t: MatmulType::I8_I8_I32,
        busy_cores: 1,
    });
    assert_eq!(s.bound, Bound::Compute);
    assert!((s.compute_s - s.ops / 2.0e12).abs() < 1e-12);
}

#[test]
fn ddr_is_shared_between_busy_cores() {
    let t = MatmulType::I8_I8_I32;
    let one = run(4096, 4096, 4096, t, 1).tops();
    let three = 3.0 * run(4096, 4096, 4096, t, 3).tops();
    // Three cores share DDR: less than three times one, more than twice.
    assert!(three < 3.0 * one && three > 2.0 * one, "{one} {three}");
    assert_eq!(RK3588.bandwidth(1), RK3588.core_bw);
    assert_eq!(RK3588.bandwidth(3), RK3588.ddr_bw / 3.0);
    // More busy cores than the chip has count as all of them.
    assert_eq!(RK3588.bandwidth(7), RK3588.bandwidth(3));
    // Decode (M = 1) streams B once and is bandwidth-bound.
    let d = run(1, 4096, 4096, t, 3);
    assert_eq!((d.passes, d.bound), (1, Bound::Memory));
}

#[test]
fn narrower_types_move_fewer_bytes() {
    let i8 = run(1, 4096, 4096, MatmulType::I8_I8_I32, 1);
    let i4 = run(1, 4096, 4096, MatmulType::I4_I4_I16, 1);
    let f16 = run(1, 4096, 4096, MatmulType::F16_F16_F32, 1);
    assert!(i4.total_s < i8.total_s && i8.total_s < f16.total_s);
    // Decode time is B's bytes over the bandwidth: f16 B is twice i8's.
    let b = |r: &cost::RunCost| r.total_s - r.call_s;
    assert!((b(&f16) / b(&i8) - 2.0).abs() < 0.01);
    assert!((b(&i8) / b(&i4) - 2.0).abs() < 0.01);
}

#[test]
fn the_9b_stand_in_has_the_campaigns_weight_volume() {
    // ~8.86 GB streamed per decoded token (W8A8: one byte per weight).
    let w = CAMPAIGN_9B.weights() as f64;
    assert!((w / 8.86e9 - 1.0).abs() < 0.01, "{w}");
    let pass = RK3588.decoder_pass(&CAMPAIGN_9B, 1, 1, 3, MatmulType::I8_I8_I32);
    assert_eq!(pass.weight_bytes, w);
    // 7 linears per block, down split into two K segments, and the output projection.
    assert_eq!(pass.runs_per_core, 36 * 8 + 1);
    let p = RK3588.predict_llm(&CAMPAIGN_9B);
    assert!(p.decode_npu_only_tok_s > p.decode_tok_s);
    assert!(p.prefill_npu_only_tok_s > p.prefill_tok_s);
}

#[test]
fn rk3588_and_rk3576_have_models_and_the_single_core_chips_none() {
    assert_eq!(CostModel::for_platform(Platform::Rk3588), Some(&RK3588));
    // RK3576's model is built from public figures (tests/rk3576_cost.rs), not calibrated.
    assert_eq!(
        CostModel::for_platform(Platform::Rk3576),
        Some(&cost::RK3576)
    );
    for p in [Platform::Rk3562, Platform::Rk3566, Platform::Rk3568] {
        assert!(CostModel::for_platform(p).is_none());
        assert!(CostPolicy::Calibrated.resolve(p).is_none());
    }
    assert_eq!(CostPolicy::Off.resolve(Platform::Rk3588), None);
}

fn int_values(len: usize) -> Values {
    Values::Int((0..len).map(|i| (i % 7) as i32 - 3).collect())
}

#[test]
fn the_emulator_keeps_the_modelled_time_of_every_run() {
    let emu = common::emulator(Platform::Rk3588);
    assert_eq!(emu.modelled().runs, 0);
    let (m, k, n) = (8, 64, 32);
    let t = RKNN_INT8_MM_INT8_TO_INT32;
    for _ in 0..2 {
        EmuRun::new(
            &emu,
            t,
            m,
            k,
            n,
            Layouts {
                ac_native: false,
                b: 0,
            },
        )
        .go(&int_values(m * k), &int_values(k * n))
        .unwrap();
    }
    let got = emu.modelled();
    let one = RK3588.modelled_run(m, k, n, MatmulType::I8_I8_I32, 1);
    assert_eq!(got.runs, 2);
    assert_eq!(got.total, 2 * one);
    // Mask 0 (automatic) is put on core 0.
    assert_eq!(
        got.per_core,
        vec![2 * one, Default::default(), Default::default()]
    );
    assert_eq!(got.busiest_core(), 2 * one);
    assert_eq!(got.since(&got).runs, 0);
    emu.reset_modelled();
    assert_eq!(emu.modelled().runs, 0);
}

#[test]
fn a_platform_without_a_model_keeps_none() {
    let emu = common::emulator(Platform::Rk3566);
    EmuRun::new(
        &emu,
        RKNN_INT8_MM_INT8_TO_INT32,
        2,
        32,
        16,
        Layouts {
            ac_native: false,
            b: 0,
        },
    )
    .go(&int_values(64), &int_values(512))
    .unwrap();
    assert!(emu.cost_model().is_none());
    assert_eq!(emu.modelled().runs, 0);
}

/// The emulator's key of a handle (`rknn_matmul_ctx` is 32-bit on 32-bit ARM).
#[allow(clippy::useless_conversion)]
fn key(ctx: rknn_matmul_ctx) -> u64 {
    u64::from(ctx)
}

/// A context on `core` with A, B, C bound, ready to run.
struct Ctx<'a> {
    emu: &'a Emulator,
    ctx: rknn_matmul_ctx,
    mems: [*mut rknn_tensor_mem; 3],
}

impl<'a> Ctx<'a> {
    fn new(emu: &'a Emulator, core: u32, m: usize, k: usize, n: usize) -> Ctx<'a> {
        let api = emu.api();
        let mut info = rknn_matmul_info {
            M: m as i32,
            K: k as i32,
            N: n as i32,
            type_: RKNN_INT8_MM_INT8_TO_INT32,
            ..Default::default()
        };
        let mut io = rknn_matmul_io_attr::default();
        let mut ctx: rknn_matmul_ctx = 0;
        // SAFETY: valid pointers for each call; the memories are destroyed before the context.
        unsafe {
            assert_eq!((api.rknn_matmul_create)(&mut ctx, &mut info, &mut io), 0);
            assert_eq!((api.rknn_matmul_set_core_mask)(ctx, core), 0);
            let mems = [io.A.size, io.B.size, io.C.size].map(|s| (api.rknn_create_mem)(ctx, s));
            for (mem, attr) in mems.iter().zip([&mut io.A, &mut io.B, &mut io.C]) {
                assert_eq!((api.rknn_matmul_set_io_mem)(ctx, *mem, attr), 0);
            }
            Ctx { emu, ctx, mems }
        }
    }

    fn run(&self) {
        // SAFETY: a live context with its memories bound.
        assert_eq!(unsafe { (self.emu.api().rknn_matmul_run)(self.ctx) }, 0);
    }
}

impl Drop for Ctx<'_> {
    fn drop(&mut self) {
        let api = self.emu.api();
        // SAFETY: live memories of a live context, destroyed once.
        unsafe {
            for m in self.mems {
                assert_eq!((api.rknn_destroy_mem)(self.ctx, m), 0);
            }
            assert_eq!((api.rknn_matmul_destroy)(self.ctx), 0);
        }
    }
}

#[test]
fn busy_cores_are_the_cores_of_the_active_contexts() {
    let emu = common::emulator(Platform::Rk3588);
    let (m, k, n) = (256, 4096, 256);
    let t = MatmulType::I8_I8_I32;
    let at = |busy| RK3588.modelled_run(m, k, n, t, busy);
    // Sharing must make a difference at this shape for the test to mean anything.
    assert!(at(3) > at(1));
    let c0 = Ctx::new(&emu, RKNN_NPU_CORE_0, m, k, n);
    c0.run();
    let c1 = Ctx::new(&emu, RKNN_NPU_CORE_1, m, k, n);
    let c2 = Ctx::new(&emu, RKNN_NPU_CORE_2, m, k, n);
    c1.run();
    c2.run();
    c0.run();
    // A second context on core 0 adds no busy core.
    let c0b = Ctx::new(&emu, RKNN_NPU_CORE_0, m, k, n);
    c0b.run();
    let get = |c: &Ctx| emu.context_modelled(key(c.ctx)).unwrap();
    assert_eq!(get(&c0).runs, 2);
    assert_eq!(get(&c0).total, at(1) + at(3));
    assert_eq!(get(&c1).total, at(2));
    assert_eq!((get(&c2).total, get(&c2).core), (at(3), 2));
    assert_eq!(get(&c0b).total, at(3));
    let total = emu.modelled();
    assert_eq!(total.per_core[0], at(1) + 2 * at(3));
    assert_eq!(total.per_core[1], at(2));
    // A context moved to another core counts there, and no longer on its old one.
    drop(c2);
    let api = emu.api();
    // SAFETY: a live context.
    let moved = unsafe { (api.rknn_matmul_set_core_mask)(c0b.ctx, RKNN_NPU_CORE_2) };
    assert_eq!(moved, 0);
    c0b.run();
    assert_eq!((get(&c0b).core, get(&c0b).last.unwrap().time()), (2, at(3)));
    // Destroyed contexts no longer count: cores 1 and 2 are left.
    drop(c0);
    c1.run();
    assert_eq!(get(&c1).last.unwrap().time(), at(2));
    drop((c1, c0b));
    assert!(emu.context_modelled(1).is_none());
}

#[test]
fn busy_cores_can_be_fixed_and_the_model_replaced() {
    let mut cfg = EmuConfig::new(Platform::Rk3588);
    cfg.busy_cores = BusyCores::Fixed(3);
    let slow = CostModel {
        call_s: 1.0,
        ..RK3588
    };
    cfg.cost = CostPolicy::Custom(slow);
    let emu = Emulator::new(cfg).unwrap();
    let c = Ctx::new(&emu, RKNN_NPU_CORE_1, 4, 64, 32);
    c.run();
    let got = emu.context_modelled(key(c.ctx)).unwrap();
    assert_eq!(
        got.total,
        slow.modelled_run(4, 64, 32, MatmulType::I8_I8_I32, 3)
    );
    assert!(got.total > std::time::Duration::from_secs(1));
    assert_eq!(emu.modelled().per_core[1], got.total);
}

#[test]
fn a_linear_split_over_the_cores_costs_what_the_model_says() {
    // The engine's split of a 96 × 4096 linear at M = 4: one 32-column shard per core.
    let emu = common::emulator(Platform::Rk3588);
    let (m, k, n) = (4, 4096, 96);
    let shards: Vec<Ctx> = [RKNN_NPU_CORE_0, RKNN_NPU_CORE_1, RKNN_NPU_CORE_2]
        .into_iter()
        .map(|core| Ctx::new(&emu, core, m, k, n / 3))
        .collect();
    // Every context runs once before timing, as an engine's first forward does.
    shards.iter().for_each(Ctx::run);
    let before = emu.modelled();
    shards.iter().for_each(Ctx::run);
    let got = emu.modelled().since(&before);
    let want = RK3588.linear(n, k, m, 3, MatmulType::I8_I8_I32);
    assert_eq!(got.runs, 3);
    assert!((got.busiest_core().as_secs_f64() - want.npu_s).abs() < 1e-9);
    assert_eq!(want.runs_per_core, 1);
    assert_eq!(want.weight_bytes, (k * n) as f64);
}

#[test]
fn cores_running_at_once_add_up_their_modelled_time() {
    // One context per core, each run by its own thread, while another thread reads the
    // totals: every core keeps its own (the engine's lanes account their runs at once).
    let mut cfg = EmuConfig::new(Platform::Rk3588);
    cfg.busy_cores = BusyCores::Fixed(1);
    let emu = Emulator::new(cfg).unwrap();
    let (m, k, n) = (1, 64, 32);
    let runs = if cfg!(miri) { 3 } else { 300 };
    let one = RK3588.modelled_run(m, k, n, MatmulType::I8_I8_I32, 1);
    let done = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|s| {
        for core in [RKNN_NPU_CORE_0, RKNN_NPU_CORE_1, RKNN_NPU_CORE_2] {
            let (emu, done) = (&emu, &done);
            s.spawn(move || {
                let c = Ctx::new(emu, core, m, k, n);
                for i in 1..=runs {
                    c.run();
                    let mine = emu.context_modelled(key(c.ctx)).unwrap();
                    assert_eq!((mine.runs, mine.total), (i, one * i as u32));
                }
                done.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            });
        }
        s.spawn(|| {
            let mut last = 0;
            while done.load(std::sync::atomic::Ordering::SeqCst) < 3 {
                let t = emu.modelled();
                assert!(t.runs >= last, "runs went back from {last} to {}", t.runs);
                // Each core's runs and time are read together, never half-updated.
                assert_eq!(t.total, one * t.runs as u32);
                last = t.runs;
            }
        });
    });
    let t = emu.modelled();
    assert_eq!(t.runs, 3 * runs);
    assert_eq!(t.per_core, vec![one * runs as u32; 3]);
    let ops = 2.0 * (m * k * n) as f64 * (3 * runs) as f64;
    assert!(
        (t.ops - ops).abs() <= 1e-9 * ops,
        "{} ops, expected {ops}",
        t.ops
    );
}
