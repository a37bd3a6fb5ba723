//! The GEMM engine against naive references: W8A8 exactly equal to a reference that
//! quantises the same way, F16 within tolerance, identical whatever the number of cores, for
//! any M, K (above the 8192 segment too) and N; safe for many threads at once. One body per
//! test, run on every backend by `common::backend_test!`.

mod common;

use common::backend_test;
use rknn_matmul::engine::{Engine, EngineConfig, MAX_EXACT_K_W8A8, WeightFormat};
use rknn_matmul::{Error, Runtime};

/// An engine of `cores` lanes (at most the chip's) on `rt`, unpinned.
fn engine(rt: &Runtime, cores: usize) -> Engine {
    let cfg = EngineConfig {
        cores: Some(cores.min(rt.npu_cores())),
        pinning: rknn_matmul::engine::topology::Pinning::None,
        ..EngineConfig::default()
    };
    Engine::new(rt, cfg).unwrap()
}

fn random(rng: &mut fastrand::Rng, len: usize) -> Vec<f32> {
    (0..len).map(|_| (rng.f32() - 0.5) * 4.0).collect()
}

backend_test!(w8a8_is_exactly_the_reference_for_random_shapes);
fn w8a8_is_exactly_the_reference_for_random_shapes(rt: &Runtime) {
    let e = engine(rt, 3);
    let mut rng = fastrand::Rng::with_seed(42);
    let mut shapes = vec![
        (1, 8192 + 32, 64),
        (3, 20000, 40),
        (600, 64, 33),
        (129, 300, 100),
        (1, 15360, 96),
        (2, 8193, 7),
    ];
    while shapes.len() < 24 {
        let m = if rng.bool() {
            rng.usize(1..=8)
        } else {
            rng.usize(1..=600)
        };
        let k = rng.usize(32..=20000);
        let n = rng.usize(1..=300);
        if m * k * n <= 40_000_000 {
            shapes.push((m, k, n));
        }
    }
    for (m, k, n) in shapes {
        let w = random(&mut rng, n * k);
        let x = random(&mut rng, m * k);
        let lin = e.linear(&w, n, k, WeightFormat::W8A8).unwrap();
        let got = lin.forward_vec(&x, m).unwrap();
        let want = common::reference_w8a8(&x, &w, m, k, n);
        for (i, (g, r)) in got.iter().zip(&want).enumerate() {
            assert_eq!(
                g.to_bits(),
                r.to_bits(),
                "M={m} K={k} N={n} at {i}: {g} vs {r}"
            );
        }
    }
}

backend_test!(f16_matches_an_f64_reference_within_tolerance);
fn f16_matches_an_f64_reference_within_tolerance(rt: &Runtime) {
    let e = engine(rt, 3);
    let mut rng = fastrand::Rng::with_seed(7);
    for (m, k, n) in [
        (1, 64, 16),
        (5, 8192 + 64, 48),
        (130, 200, 70),
        (1, 1000, 300),
    ] {
        let w = random(&mut rng, n * k);
        let x = random(&mut rng, m * k);
        let lin = e.linear(&w, n, k, WeightFormat::F16).unwrap();
        let got = lin.forward_vec(&x, m).unwrap();
        let h = |v: f32| f64::from(half::f16::from_f32(v).to_f32());
        for r in 0..m {
            for j in 0..n {
                let want: f64 = (0..k).map(|c| h(x[r * k + c]) * h(w[j * k + c])).sum();
                let mag: f64 = (0..k)
                    .map(|c| (h(x[r * k + c]) * h(w[j * k + c])).abs())
                    .sum();
                let g = f64::from(got[r * n + j]);
                assert!(
                    (g - want).abs() <= 1e-5 * mag + 1e-5,
                    "M={m} K={k} N={n} [{r},{j}] {g} vs {want}"
                );
            }
        }
    }
}

backend_test!(results_are_identical_whatever_the_number_of_cores);
fn results_are_identical_whatever_the_number_of_cores(rt: &Runtime) {
    let mut rng = fastrand::Rng::with_seed(9);
    let (m, k, n) = (70, 9000, 130);
    let w = random(&mut rng, n * k);
    let x = random(&mut rng, m * k);
    let mut outs: Vec<(String, Vec<u32>, Vec<u32>)> = Vec::new();
    for cores in 1..=rt.npu_cores() {
        // The caller running core 0's share, or worker threads only.
        for caller_runs_core0 in [true, false] {
            let e = Engine::new(
                rt,
                EngineConfig {
                    cores: Some(cores),
                    caller_runs_core0,
                    pinning: rknn_matmul::engine::topology::Pinning::None,
                    ..EngineConfig::default()
                },
            )
            .unwrap();
            assert_eq!(e.workers(), cores);
            let [w8, f16] = [WeightFormat::W8A8, WeightFormat::F16].map(|f| {
                e.linear(&w, n, k, f)
                    .unwrap()
                    .forward_vec(&x, m)
                    .unwrap()
                    .iter()
                    .map(|v| v.to_bits())
                    .collect::<Vec<u32>>()
            });
            outs.push((
                format!("{cores} cores, caller {caller_runs_core0}"),
                w8,
                f16,
            ));
        }
    }
    for (what, w8, f16) in &outs[1..] {
        assert_eq!(&outs[0].1, w8, "W8A8 with {what}");
        assert_eq!(&outs[0].2, f16, "F16 with {what}");
    }
}

#[test]
fn m_buckets_are_exact_when_small_then_multiples_of_128() {
    let cfg = EngineConfig::default();
    assert_eq!(cfg.bucket(0), 1);
    assert_eq!(cfg.bucket(1), 1);
    assert_eq!(cfg.bucket(2), 2);
    assert_eq!(cfg.bucket(5), 5);
    assert_eq!(cfg.bucket(32), 32);
    assert_eq!(cfg.bucket(33), 64);
    assert_eq!(cfg.bucket(65), 128);
    assert_eq!(cfg.bucket(300), 384);
    assert_eq!(cfg.bucket(512), 512);
    let b = cfg.buckets();
    assert_eq!(b.len(), 32 + 1 + 4);
    assert_eq!(&b[30..], [31, 32, 64, 128, 256, 384, 512]);
    for m in 1..=512 {
        assert!(b.contains(&cfg.bucket(m)), "bucket of {m}");
        assert!(cfg.bucket(m) >= m);
    }
}

backend_test!(stats_count_every_phase_and_weights_are_freed_on_drop);
fn stats_count_every_phase_and_weights_are_freed_on_drop(rt: &Runtime) {
    let rt = common::runtime_with(rt, |_| {});
    let budget = rt.handle_budget();
    let before = budget.live();
    let e = engine(&rt, 3);
    let cores = e.workers();
    let mut rng = fastrand::Rng::with_seed(3);
    let (k, n) = (8192 + 64, 96);
    let lin = e
        .linear(&random(&mut rng, n * k), n, k, WeightFormat::W8A8)
        .unwrap();
    let segments = if e.runtime().platform().k_segment() == Some(8192) {
        2
    } else {
        3
    };
    // A B per shard and K segment, and one shared A and C per core.
    assert_eq!(budget.live() - before, cores * segments + 2 * cores);
    e.reset_stats();
    lin.forward_vec(&random(&mut rng, k), 1).unwrap();
    let s = e.stats();
    assert_eq!(
        (s.forwards, s.quantize.count, s.run.count, s.pack.count),
        (1, 1, (cores * segments) as u64, (cores * segments) as u64)
    );
    assert!(s.collect.count >= (cores * segments) as u64);
    // One row of K in, one of N out: the elements the cost model's host term counts.
    assert_eq!((s.input_elements, s.output_elements), (k as u64, n as u64));
    assert!(s.glue_ns_per_element() > 0.0);
    // With residual activations each input row is two rows of A, and two of C.
    let res = e
        .linear_with(
            &random(&mut rng, n * 64),
            n,
            64,
            WeightFormat::W8A8,
            rknn_matmul::engine::LinearOptions {
                residual_activations: true,
                ..Default::default()
            },
        )
        .unwrap();
    e.reset_stats();
    res.forward_vec(&random(&mut rng, 3 * 64), 3).unwrap();
    let s = e.stats();
    assert_eq!(
        (s.input_elements, s.output_elements),
        (6 * 64, 6 * n as u64)
    );
    drop(res);
    drop(lin);
    assert_eq!(
        budget.live() - before,
        2 * cores,
        "the shared pairs stay with the engine"
    );
    drop(e);
    assert_eq!(budget.live(), before);
}

backend_test!(the_phase_times_add_up_to_the_wall_time_of_a_forward);
/// The phase statistics are real time, whichever clock the engine reads (the CPU's counter
/// where it has a constant-rate one, `Instant` elsewhere): on one lane, where every phase runs
/// on the calling thread one after the other, a forward's phases add up to most of its wall
/// time and never to more.
fn the_phase_times_add_up_to_the_wall_time_of_a_forward(rt: &Runtime) {
    let e = engine(rt, 1);
    let (n, k) = (1024, 2048);
    let mut rng = fastrand::Rng::with_seed(5);
    let lin = e
        .linear(&random(&mut rng, n * k), n, k, WeightFormat::W8A8)
        .unwrap();
    let x = random(&mut rng, k);
    let mut out = vec![0.0; n];
    lin.forward(&x, 1, &mut out).unwrap();
    let mut shares = Vec::new();
    // A preemption between two phases is wall time that no phase holds: try a few times.
    for _ in 0..5 {
        e.reset_stats();
        let t = std::time::Instant::now();
        for _ in 0..10 {
            lin.forward(&x, 1, &mut out).unwrap();
        }
        let wall = t.elapsed().as_secs_f64();
        let s = e.stats();
        let phases = [s.quantize, s.pack, s.run, s.collect, s.wait]
            .iter()
            .map(|p| p.time.as_secs_f64())
            .sum::<f64>();
        let share = phases / wall;
        assert!(
            share <= 1.001,
            "the phases took {phases} s of a {wall} s wall time"
        );
        assert!(s.run.time > s.pack.time, "{s:?}");
        if share >= 0.5 {
            return;
        }
        shares.push(share);
    }
    panic!("the phases held only these shares of the wall time: {shares:?}");
}

backend_test!(idle_workers_read_the_next_linear_ahead_and_change_no_bit);
fn idle_workers_read_the_next_linear_ahead_and_change_no_bit(rt: &Runtime) {
    let rt = common::runtime_with(rt, |_| {});
    let cores = 2.min(rt.npu_cores());
    let budget = 64 << 10;
    let make = |warm_bytes| {
        let cfg = EngineConfig {
            cores: Some(cores),
            pinning: rknn_matmul::engine::topology::Pinning::None,
            warm_bytes: Some(warm_bytes),
            ..EngineConfig::default()
        };
        Engine::new(&rt, cfg).unwrap()
    };
    let (on, off) = (make(budget), make(0));
    let mut rng = fastrand::Rng::with_seed(21);
    // Three linears run in order, as a model's layers are: (N, K), one above the K segment.
    let shapes = [(96, 200), (320, 96), (64, 8192 + 40)];
    let ws: Vec<Vec<f32>> = shapes
        .iter()
        .map(|&(n, k)| random(&mut rng, n * k))
        .collect();
    let lins = |e: &Engine| -> Vec<_> {
        ws.iter()
            .zip(shapes)
            .map(|(w, (n, k))| e.linear(w, n, k, WeightFormat::W8A8).unwrap())
            .collect()
    };
    let (lin_on, lin_off) = (lins(&on), lins(&off));
    on.reset_stats();
    let rounds = 3;
    for round in 0..rounds {
        for (i, &(n, k)) in shapes.iter().enumerate() {
            let x = random(&mut rng, 2 * k);
            let a = lin_on[i].forward_vec(&x, 2).unwrap();
            let b = lin_off[i].forward_vec(&x, 2).unwrap();
            let want = common::reference_w8a8(&x, &ws[i], 2, k, n);
            for (what, got) in [("reading ahead", &a), ("not reading ahead", &b)] {
                assert!(
                    got.iter()
                        .zip(&want)
                        .all(|(g, w)| g.to_bits() == w.to_bits()),
                    "{what}, round {round}, linear {i}"
                );
            }
            // Host work between two linears, long enough for a whole read-ahead.
            std::thread::sleep(std::time::Duration::from_millis(3));
        }
    }
    let s = on.stats();
    if cores > 1 {
        // The order is known from the first forward of the second round (0 → 1 → 2 → 0): an
        // idle spell after each later forward, each at most the budget of its own shard and
        // as much of the calling thread's lane's.
        let spells = ((rounds - 1) * shapes.len()) as u64;
        assert!(s.warmed_bytes > 0, "nothing read ahead");
        assert!(
            s.warmed_bytes <= spells * 2 * budget as u64,
            "{}",
            s.warmed_bytes
        );
    }
    assert_eq!(off.stats().warmed_bytes, 0);
    // The lanes' own counters add up to the engine's.
    let lanes = on.lane_stats();
    assert_eq!(lanes.len(), cores);
    let sum = |f: fn(&rknn_matmul::engine::Stats) -> u64| lanes.iter().map(f).sum::<u64>();
    assert_eq!(sum(|l| l.run.count), s.run.count);
    assert_eq!(sum(|l| l.warmed_bytes), s.warmed_bytes);
    assert_eq!(
        sum(|l| l.quantize.count),
        0,
        "the callers' quantisation is in no lane"
    );
}

backend_test!(the_read_ahead_budget_changes_while_the_engine_runs);
fn the_read_ahead_budget_changes_while_the_engine_runs(rt: &Runtime) {
    let rt = common::runtime_with(rt, |_| {});
    assert!(
        rt.npu_cores() >= 2,
        "the emulated chip has a worker besides the caller"
    );
    let e = Engine::new(
        &rt,
        EngineConfig {
            cores: Some(2),
            pinning: rknn_matmul::engine::topology::Pinning::None,
            warm_bytes: Some(0),
            ..EngineConfig::default()
        },
    )
    .unwrap();
    let mut rng = fastrand::Rng::with_seed(23);
    let shapes = [(96, 200), (320, 96)];
    let ws: Vec<Vec<f32>> = shapes
        .iter()
        .map(|&(n, k)| random(&mut rng, n * k))
        .collect();
    let lins: Vec<_> = ws
        .iter()
        .zip(shapes)
        .map(|(w, (n, k))| e.linear(w, n, k, WeightFormat::W8A8).unwrap())
        .collect();
    // Three tokens through both linears, with host work between them; every output exact.
    let mut tokens = |what: &str| {
        for token in 0..3 {
            for (i, &(n, k)) in shapes.iter().enumerate() {
                let x = random(&mut rng, k);
                let got = lins[i].forward_vec(&x, 1).unwrap();
                assert_eq!(
                    got,
                    common::reference_w8a8(&x, &ws[i], 1, k, n),
                    "{what}, token {token}, linear {i}"
                );
                std::thread::sleep(std::time::Duration::from_millis(3));
            }
        }
        let read = e.stats().warmed_bytes;
        e.reset_stats();
        read
    };
    assert_eq!(tokens("off"), 0);
    let budget = 4 << 10;
    e.set_warm_bytes(budget);
    assert_eq!(e.warm_bytes(), budget);
    // The order is learned during the first token: each forward of the two later ones is
    // followed by a spell that reads a budget of the worker's own shard of the next linear
    // (each shard is larger than the budget), unless the next task interrupts it.
    let spells = 2 * shapes.len();
    let read = tokens("on");
    assert!(read >= budget as u64, "{read}");
    assert!(read <= (spells * budget) as u64, "{read}");
    e.set_warm_bytes(0);
    assert_eq!(tokens("off again"), 0);
}

backend_test!(without_sharing_every_segment_has_its_own_a_and_c);
fn without_sharing_every_segment_has_its_own_a_and_c(rt: &Runtime) {
    let rt = common::runtime_with(rt, |_| {});
    let e = Engine::new(
        &rt,
        EngineConfig {
            share_io_memories: false,
            pinning: rknn_matmul::engine::topology::Pinning::None,
            ..EngineConfig::default()
        },
    )
    .unwrap();
    let mut rng = fastrand::Rng::with_seed(31);
    let (k, n) = (96, 200);
    let w = random(&mut rng, n * k);
    let lin = e.linear(&w, n, k, WeightFormat::W8A8).unwrap();
    assert_eq!(rt.handle_budget().live(), 3 * e.workers());
    let x = random(&mut rng, 3 * k);
    let got = lin.forward_vec(&x, 3).unwrap();
    assert_eq!(got, common::reference_w8a8(&x, &w, 3, k, n));
}

backend_test!(contexts_split_to_the_n_limit_give_the_bits_of_wide_ones);
fn contexts_split_to_the_n_limit_give_the_bits_of_wide_ones(rt: &Runtime) {
    let mut rng = fastrand::Rng::with_seed(57);
    let engine_with = |limit: Option<usize>| {
        Engine::new(
            rt,
            EngineConfig {
                cores: Some(rt.npu_cores().min(3)),
                max_n_per_context: limit,
                pinning: rknn_matmul::engine::topology::Pinning::None,
                ..EngineConfig::default()
            },
        )
        .unwrap()
    };
    let wide = engine_with(None);
    let lanes = wide.workers();
    // (M, K, N): one segment and two (K > 8192), a prompt-sized M, N not a multiple of
    // anything. Small, as every engine is run on every backend (and under qemu-user).
    for (m, k, n) in [(3, 96, 1000), (2, 8192 + 64, 330), (40, 64, 777)] {
        let w = random(&mut rng, n * k);
        let x = random(&mut rng, m * k);
        let segments = if k > 8192 { 2 } else { 1 };
        let bits = |e: &Engine, f| -> (usize, Vec<u32>) {
            let lin = e.linear(&w, n, k, f).unwrap();
            let out = lin.forward_vec(&x, m).unwrap();
            (lin.contexts(), out.iter().map(|v| v.to_bits()).collect())
        };
        for f in [WeightFormat::W8A8, WeightFormat::F16] {
            let (wide_contexts, want) = bits(&wide, f);
            assert_eq!(
                wide_contexts,
                lanes * segments,
                "{f:?} N={n}: one block per lane"
            );
            // 100 rounds down to 96 (W8A8's alignment is 32, F16's 16 or 32).
            for limit in [32, 100, 256] {
                let e = engine_with(Some(limit));
                assert_eq!(e.max_n_per_context(), limit);
                let (contexts, got) = bits(&e, f);
                assert_eq!(got, want, "{f:?} M={m} K={k} N={n} limit {limit}");
                // Each lane's whole aligned blocks, in contexts of at most `limit` columns.
                let kind = match f {
                    WeightFormat::F16 => rknn_matmul::rknn_chip::ElemKind::F16,
                    _ => rknn_matmul::rknn_chip::ElemKind::I8,
                };
                let align = rt.platform().alignment(kind).unwrap().1;
                let (blocks, per) = (n.div_ceil(align), limit - limit % align);
                let want_contexts: usize = (0..lanes)
                    .map(|i| (blocks / lanes + usize::from(i < blocks % lanes)) * align)
                    .map(|width| width.div_ceil(per))
                    .sum();
                assert_eq!(
                    contexts,
                    want_contexts * segments,
                    "{f:?} N={n} limit {limit}"
                );
            }
        }
        let want = common::reference_w8a8(&x, &w, m, k, n);
        let got = engine_with(Some(64))
            .linear(&w, n, k, WeightFormat::W8A8)
            .unwrap()
            .forward_vec(&x, m)
            .unwrap();
        assert_eq!(got, want, "W8A8 against the reference, M={m} K={k} N={n}");
    }
}

backend_test!(the_default_n_limit_is_the_chips_largest_measured_or_the_user_guides);
fn the_default_n_limit_is_the_chips_largest_measured_or_the_user_guides(rt: &Runtime) {
    let e = engine(rt, 1);
    // The drop-in's rules are its environment's: what the probe found is either answer.
    let want = rt
        .platform()
        .measured_max_n()
        .unwrap_or(rknn_matmul::rknn_chip::USER_GUIDE_MAX_N);
    assert!(
        e.max_n_per_context() == want || e.max_n_per_context() == 4096,
        "{}",
        e.max_n_per_context()
    );
    // The strict shape rules are the user guide's: 4096, and a linear wider than that is
    // split into contexts the rules accept.
    let strict = common::runtime_with(rt, |o| o.strict_shape_rules = true);
    let e = engine(&strict, 1);
    assert_eq!(e.max_n_per_context(), 4096);
    let (k, n) = (64, 4096 * 2 + 96);
    let mut rng = fastrand::Rng::with_seed(3);
    let w = random(&mut rng, n * k);
    let x = random(&mut rng, k);
    let lin = e.linear(&w, n, k, WeightFormat::W8A8).unwrap();
    assert_eq!(lin.contexts(), 3);
    assert_eq!(
        lin.forward_vec(&x, 1).unwrap(),
        common::reference_w8a8(&x, &w, 1, k, n)
    );
}

backend_test!(bad_n_limits_are_typed_errors_naming_both_numbers);
fn bad_n_limits_are_typed_errors_naming_both_numbers(rt: &Runtime) {
    let with = |rt: &Runtime, limit| {
        Engine::new(
            rt,
            EngineConfig {
                cores: Some(1),
                max_n_per_context: Some(limit),
                ..EngineConfig::default()
            },
        )
    };
    let p = rt.platform();
    let (_, f16_align) = p.alignment(rknn_matmul::rknn_chip::ElemKind::F16).unwrap();
    let (_, i8_align) = p.alignment(rknn_matmul::rknn_chip::ElemKind::I8).unwrap();
    for limit in [0, f16_align.min(i8_align) - 1] {
        let err = with(rt, limit).unwrap_err();
        assert!(
            matches!(err, Error::EngineConfig { field: "max_n_per_context", value, .. } if value == limit),
            "{err}"
        );
        let msg = err.to_string();
        assert!(
            msg.contains(&format!("max_n_per_context={limit} "))
                && msg.contains(&format!("alignment of {}", f16_align.min(i8_align))),
            "{msg}"
        );
    }
    if i8_align > f16_align {
        // Enough for F16 contexts, below W8A8's alignment: refused when a W8A8 linear is made.
        let e = with(rt, f16_align).unwrap();
        let err = e.linear(&[1.0; 64], 1, 64, WeightFormat::W8A8).unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains(&format!("max_n_per_context={f16_align} "))
                && msg.contains(&format!("alignment of {i8_align} for w8a8")),
            "{msg}"
        );
        assert!(e.linear(&[1.0; 64], 1, 64, WeightFormat::F16).is_ok());
    }
    let strict = common::runtime_with(rt, |o| o.strict_shape_rules = true);
    let err = with(&strict, 8192).unwrap_err();
    assert!(
        err.to_string()
            .contains("max_n_per_context=8192 exceeds the shape rules' N limit of 4096"),
        "{err}"
    );
}

backend_test!(a_linear_beyond_the_handle_budget_is_a_typed_error_naming_ulimit);
fn a_linear_beyond_the_handle_budget_is_a_typed_error_naming_ulimit(rt: &Runtime) {
    let rt = common::runtime_with(rt, |o| o.handle_budget = Some(24));
    let engine_with = |limit| {
        Engine::new(
            &rt,
            EngineConfig {
                cores: Some(rt.npu_cores().min(2)),
                max_n_per_context: limit,
                pinning: rknn_matmul::engine::topology::Pinning::None,
                ..EngineConfig::default()
            },
        )
        .unwrap()
    };
    let (k, n) = (64, 1024);
    let w = vec![0.5; n * k];
    // 32 contexts of 32 columns, one B each, and each lane's shared A and C: over 24.
    let narrow = engine_with(Some(32));
    let err = narrow.linear(&w, n, k, WeightFormat::W8A8).unwrap_err();
    assert!(
        matches!(
            err,
            Error::HandlesForLinear {
                contexts: 32,
                budget: 24,
                live: 0,
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("ulimit -n"), "{err}");
    assert_eq!(rt.handle_budget().live(), 0, "nothing allocated for it");
    // The same linear in the default, wider contexts fits, on the same runtime.
    let wide = engine_with(None);
    let lin = wide.linear(&w, n, k, WeightFormat::W8A8).unwrap();
    assert!(rt.handle_budget().live() <= 24);
    let x = vec![1.0; k];
    assert_eq!(
        lin.forward_vec(&x, 1).unwrap(),
        common::reference_w8a8(&x, &w, 1, k, n)
    );
}

/// A runtime that refuses a memory of another context (`memory.shared_between_contexts`
/// answered the pessimistic way): the engine finds out when it starts, gives every context its
/// own A and C, and computes the same bits.
#[cfg(feature = "emulator")]
#[test]
fn a_runtime_refusing_shared_memories_gets_per_context_ones_and_the_same_bits() {
    use rknn_matmul::rknn_emu::SharedMemories;
    use rknn_matmul::{Backend, EmuConfig, Platform, RuntimeOptions};
    let open = |shared_memories| {
        let opts = RuntimeOptions {
            emulator: EmuConfig {
                shared_memories,
                ..EmuConfig::default()
            },
            ..RuntimeOptions::default()
        };
        Runtime::open(Backend::Emulator(Platform::Rk3588), opts).unwrap()
    };
    let mut rng = fastrand::Rng::with_seed(77);
    let (m, k, n) = (3, 8192 + 96, 300);
    let w = random(&mut rng, n * k);
    let x = random(&mut rng, m * k);
    let mut outs = Vec::new();
    for policy in [SharedMemories::Accept, SharedMemories::Refuse] {
        let rt = open(policy);
        let e = engine(&rt, 2);
        assert_eq!(e.shares_io_memories(), policy == SharedMemories::Accept);
        let lin = e.linear(&w, n, k, WeightFormat::W8A8).unwrap();
        // Two K segments per lane: one B each, and with per-context memories an A and a C too.
        let contexts = lin.contexts();
        assert_eq!(contexts, 2 * e.workers());
        let per = if e.shares_io_memories() { 1 } else { 3 };
        let pairs = if e.shares_io_memories() {
            2 * e.workers()
        } else {
            0
        };
        assert_eq!(
            rt.handle_budget().live(),
            per * contexts + pairs,
            "{policy:?}"
        );
        outs.push(lin.forward_vec(&x, m).unwrap());
    }
    assert_eq!(outs[0], outs[1]);
    assert_eq!(outs[0], common::reference_w8a8(&x, &w, m, k, n));
    // Asked not to share, the engine does not, whatever the runtime accepts.
    let rt = open(SharedMemories::Accept);
    let cfg = EngineConfig {
        share_io_memories: false,
        ..EngineConfig::default()
    };
    assert!(!Engine::new(&rt, cfg).unwrap().shares_io_memories());
}

backend_test!(bad_sizes_and_configs_are_typed_errors);
fn bad_sizes_and_configs_are_typed_errors(rt: &Runtime) {
    let e = engine(rt, 1);
    let err = e.linear(&[1.0; 10], 3, 4, WeightFormat::W8A8).unwrap_err();
    assert!(
        matches!(
            err,
            Error::Length {
                expected: 12,
                got: 10,
                ..
            }
        ),
        "{err}"
    );
    assert_eq!(
        err.to_string(),
        "weights (n × k) holds 10 elements where 12 are needed"
    );
    let err = e.linear(&[], 0, 4, WeightFormat::W8A8).unwrap_err();
    assert_eq!(err.to_string(), "N=0 must be at least 1");
    let lin = e.linear(&[1.0; 12], 3, 4, WeightFormat::W8A8).unwrap();
    assert!(matches!(
        lin.forward_vec(&[1.0; 5], 1),
        Err(Error::Length { .. })
    ));
    let mut out = vec![0.0; 2];
    assert!(matches!(
        lin.forward(&[1.0; 4], 1, &mut out),
        Err(Error::Length { .. })
    ));
    // m × K overflowing usize is an error, not a wrapped length that happens to match.
    let err = lin
        .forward(&[1.0; 4], usize::MAX / 2 + 1, &mut out)
        .unwrap_err();
    assert!(matches!(err, Error::SizeOverflow { .. }), "{err}");
    // The exactness bound of the i32 K sum (W = x = 1 at K = 140 000 used to wrap negative).
    let k = MAX_EXACT_K_W8A8 + 1;
    let err = e
        .linear(&vec![1.0; k], 1, k, WeightFormat::W8A8)
        .unwrap_err();
    assert!(matches!(err, Error::KTooLargeForExactSum { .. }), "{err}");
    for max_m in [100, 0, 1 << 40] {
        let err = Engine::new(
            rt,
            EngineConfig {
                max_m,
                ..EngineConfig::default()
            },
        )
        .unwrap_err();
        assert!(
            matches!(err, Error::EngineConfig { field: "max_m", .. }),
            "{err}"
        );
    }
    let err = Engine::new(
        rt,
        EngineConfig {
            cores: Some(rt.npu_cores() + 1),
            ..EngineConfig::default()
        },
    )
    .unwrap_err();
    assert!(
        matches!(err, Error::EngineConfig { field: "cores", .. }),
        "{err}"
    );
}

backend_test!(the_largest_exact_k_is_exact);
fn the_largest_exact_k_is_exact(rt: &Runtime) {
    // All-ones weights and input quantise to 127 × 127 per term: the sum at the bound is the
    // largest exact i32 the engine promises.
    let e = engine(rt, 1);
    let k = MAX_EXACT_K_W8A8;
    let lin = e.linear(&vec![1.0; k], 1, k, WeightFormat::W8A8).unwrap();
    let y = lin.forward_vec(&vec![1.0; k], 1).unwrap();
    let want = ((127 * 127 * k) as f64) * (1.0 / 127.0) * (1.0 / 127.0);
    assert!(
        (f64::from(y[0]) - want).abs() / want < 1e-6,
        "{} vs {want}",
        y[0]
    );
}

backend_test!(prequantised_weights);
fn prequantised_weights(rt: &Runtime) {
    let e = engine(rt, 3);
    let q: Vec<i8> = (0..5 * 40).map(|i| (i % 7) as i8 - 3).collect();
    let scales = [0.5f32, 1.0, 2.0, 0.25, 1.5];
    let lin = e.linear_quantized(&q, &scales, 5, 40).unwrap();
    let x: Vec<f32> = (0..40).map(|i| i as f32 / 40.0).collect();
    let got = lin.forward_vec(&x, 1).unwrap();
    let (xq, xs) = common::quantize(&x);
    for j in 0..5 {
        let acc: i32 = (0..40).map(|c| xq[c] * i32::from(q[j * 40 + c])).sum();
        assert_eq!(got[j], (acc as f32 * xs) * scales[j]);
    }
    let mut bad = q.clone();
    bad[3] = i8::MIN;
    assert!(matches!(
        e.linear_quantized(&bad, &scales, 5, 40),
        Err(Error::OutOfRange { index: 3, .. })
    ));
    assert!(matches!(
        e.linear_quantized(&q, &scales[..4], 5, 40),
        Err(Error::Length {
            expected: 5,
            got: 4,
            ..
        })
    ));
}

backend_test!(many_threads_share_one_engine);
/// Several threads forward through, register on and drop linears of one engine at once; every
/// result is checked. A lost or misrouted task would leave an output unwritten (checked by
/// pre-filling it with NaN) or wrong.
fn many_threads_share_one_engine(rt: &Runtime) {
    let e = engine(rt, 3);
    let mut rng = fastrand::Rng::with_seed(11);
    let shared: Vec<(usize, usize, Vec<f32>)> = [(64, 96), (200, 40), (33, 300)]
        .iter()
        .map(|&(n, k)| (n, k, random(&mut rng, n * k)))
        .collect();
    let linears: Vec<_> = shared
        .iter()
        .map(|(n, k, w)| e.linear(w, *n, *k, WeightFormat::W8A8).unwrap())
        .collect();
    let rounds = if cfg!(miri) { 2 } else { 40 };
    std::thread::scope(|s| {
        for t in 0..4u64 {
            let (e, shared, linears) = (&e, &shared, &linears);
            s.spawn(move || {
                let mut rng = fastrand::Rng::with_seed(100 + t);
                for i in 0..rounds {
                    let which = rng.usize(..shared.len());
                    let (n, k, w) = &shared[which];
                    let m = [1, 2, 5, 130][rng.usize(..4)];
                    let x = random(&mut rng, m * k);
                    let want = common::reference_w8a8(&x, w, m, *k, *n);
                    let mut out = vec![f32::NAN; m * n];
                    if (i + t as usize) % 3 == 0 {
                        // A linear of our own, registered and dropped while others forward.
                        let own = e.linear(w, *n, *k, WeightFormat::W8A8).unwrap();
                        own.forward(&x, m, &mut out).unwrap();
                    } else {
                        linears[which].forward(&x, m, &mut out).unwrap();
                    }
                    for (j, (g, r)) in out.iter().zip(&want).enumerate() {
                        assert_eq!(g.to_bits(), r.to_bits(), "thread {t} round {i} [{j}]");
                    }
                    if i % 7 == 0 {
                        e.ping().unwrap();
                    }
                    if i % 5 == 0 {
                        // The counters, read while the other threads forward: each lane's
                        // runs never exceed the engine's, which are their sum.
                        let (all, lanes) = (e.stats(), e.lane_stats());
                        assert_eq!(lanes.len(), e.workers());
                        let runs: u64 = lanes.iter().map(|l| l.run.count).sum();
                        assert!(lanes.iter().all(|l| l.run.count <= e.stats().run.count));
                        assert!(all.run.count <= runs, "{} > {runs}", all.run.count);
                    }
                }
            });
        }
    });
}

backend_test!(rotated_linears_are_exactly_the_reference_on_rotated_operands_and_closer_to_f32);
fn rotated_linears_are_exactly_the_reference_on_rotated_operands_and_closer_to_f32(rt: &Runtime) {
    use rknn_matmul::engine::{LinearOptions, Rotation};
    let e = engine(rt, 3);
    let mut rng = fastrand::Rng::with_seed(21);
    let (m, k, n) = (4, 576, 96);
    let w = random(&mut rng, n * k);
    // Activations with a few outlier channels, as transformer inputs have.
    let mut x = random(&mut rng, m * k);
    for r in 0..m {
        x[r * k + 7] = 60.0;
        x[r * k + 300] = -45.0;
    }
    let rot = Rotation::hadamard(k, 7);
    let lin = e
        .linear_with(
            &w,
            n,
            k,
            WeightFormat::W8A8,
            LinearOptions {
                rotation: Some(rot.clone()),
                ..Default::default()
            },
        )
        .unwrap();
    assert_eq!(lin.rotation(), Some(&rot));
    let got = lin.forward_vec(&x, m).unwrap();
    let (mut rx, mut rw) = (x.clone(), w.clone());
    rot.apply_rows(&mut rx);
    rot.apply_rows(&mut rw);
    assert_eq!(got, common::reference_w8a8(&rx, &rw, m, k, n));
    // Closer to the exact product than without the rotation.
    let plain = e
        .linear(&w, n, k, WeightFormat::W8A8)
        .unwrap()
        .forward_vec(&x, m)
        .unwrap();
    let exact: Vec<f64> = (0..m * n)
        .map(|i| {
            let (r, j) = (i / n, i % n);
            (0..k)
                .map(|c| f64::from(x[r * k + c]) * f64::from(w[j * k + c]))
                .sum()
        })
        .collect();
    let err = |y: &[f32]| -> f64 {
        y.iter()
            .zip(&exact)
            .map(|(&a, &b)| (f64::from(a) - b).powi(2))
            .sum::<f64>()
            .sqrt()
    };
    assert!(
        err(&got) < 0.5 * err(&plain),
        "rotated {} vs plain {}",
        err(&got),
        err(&plain)
    );
    let e2 = e.linear_with(
        &w,
        n,
        k,
        WeightFormat::W8A8,
        LinearOptions {
            rotation: Some(Rotation::hadamard(k + 64, 7)),
            ..LinearOptions::default()
        },
    );
    assert!(matches!(e2, Err(Error::Length { .. })));
}

backend_test!(prompt_chunks_quantised_on_the_lanes_give_the_bits_of_row_by_row_forwards);
fn prompt_chunks_quantised_on_the_lanes_give_the_bits_of_row_by_row_forwards(rt: &Runtime) {
    // From 32 rows per chunk the engine rotates and quantises on every lane (each a share of
    // the rows) instead of on the caller; a row's output must not depend on where it was
    // quantised, nor on the chunk around it (speculative decoding relies on it), with and
    // without rotation and residual activations, on one core (always the caller) and three.
    use rknn_matmul::engine::{LinearOptions, Rotation};
    let mut rng = fastrand::Rng::with_seed(0x4C41_4E45);
    let (k, n) = (192, 64);
    let w = random(&mut rng, n * k);
    let m = 75;
    let mut x = random(&mut rng, m * k);
    for r in 0..m {
        x[r * k + r % k] = 40.0 + r as f32;
    }
    for (rotate, residual) in [(false, false), (true, false), (false, true), (true, true)] {
        let opts = LinearOptions {
            rotation: rotate.then(|| Rotation::hadamard(k, 11)),
            residual_activations: residual,
            ..LinearOptions::default()
        };
        let mut outs = Vec::new();
        for cores in [1, 3] {
            let e = engine(rt, cores);
            let lin = e
                .linear_with(&w, n, k, WeightFormat::W8A8, opts.clone())
                .unwrap();
            for rows in [m, 33, 32, 31] {
                let got = lin.forward_vec(&x[..rows * k], rows).unwrap();
                let one_by_one: Vec<f32> = x[..rows * k]
                    .chunks_exact(k)
                    .flat_map(|row| lin.forward_vec(row, 1).unwrap())
                    .collect();
                assert!(
                    got.iter()
                        .zip(&one_by_one)
                        .all(|(a, b)| a.to_bits() == b.to_bits()),
                    "rotate {rotate} residual {residual}, {cores} core(s), {rows} rows"
                );
                if rows == m {
                    outs.push(got);
                }
            }
        }
        assert_eq!(outs[0], outs[1], "one core and three");
        if !residual {
            // Without residuals, the reference W8A8 product of the (rotated) operands.
            let (mut rx, mut rw) = (x.clone(), w.clone());
            if let Some(r) = &opts.rotation {
                r.apply_rows(&mut rx);
                r.apply_rows(&mut rw);
            }
            assert_eq!(outs[1], common::reference_w8a8(&rx, &rw, m, k, n));
        }
    }
}

backend_test!(converted_weights_stored_and_placed_again_match_a_converting_load);
fn converted_weights_stored_and_placed_again_match_a_converting_load(rt: &Runtime) {
    use rknn_matmul::engine::{LinearOptions, Rotation};
    let mut rng = fastrand::Rng::with_seed(7);
    // K above the 8192 segment and not aligned; N not aligned; both formats, with a rotation.
    for (format, k, n) in [
        (WeightFormat::W8A8, 8192 + 100, 45),
        (WeightFormat::W8A8, 70, 300),
        (WeightFormat::F16, 130, 33),
    ] {
        let w = random(&mut rng, n * k);
        let x = random(&mut rng, 3 * k);
        let rotation = Some(Rotation::hadamard_mixed(k, 11));
        let opts = LinearOptions {
            rotation: rotation.clone(),
            residual_activations: true,
            ..LinearOptions::default()
        };
        let rows = |first: usize, buf: &mut [f32]| {
            buf.copy_from_slice(&w[first * k..first * k + buf.len()]);
            Ok::<(), Error>(())
        };
        let converting = engine(rt, 3)
            .linear_from_rows(n, k, format, opts.clone(), rows)
            .unwrap();
        let want = converting.forward_vec(&x, 3).unwrap();
        // Converted on one engine, stored as bytes, placed on an engine of another core count.
        let c = engine(rt, 3)
            .convert_from_rows(n, k, format, rotation.as_ref(), rows)
            .unwrap();
        let (values, scales) = (c.values_bytes().to_vec(), c.scales_bytes().to_vec());
        let other = engine(rt, 1);
        let mut stored = other.converted_zeroed(n, k, format).unwrap();
        assert_eq!(stored.padded(), c.padded());
        stored.values_bytes_mut().copy_from_slice(&values);
        stored.scales_bytes_mut().copy_from_slice(&scales);
        let placed = other.linear_from_converted(stored, opts.clone()).unwrap();
        let got = placed.forward_vec(&x, 3).unwrap();
        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&got), bits(&want), "{format} K={k} N={n}");

        // What storage may hand back wrong is refused, naming the rule.
        if format == WeightFormat::W8A8 {
            let mut bad = other.converted_zeroed(n, k, format).unwrap();
            bad.values_bytes_mut().copy_from_slice(&values);
            bad.scales_bytes_mut().copy_from_slice(&scales);
            bad.values_bytes_mut()[5] = 0x80; // i8::MIN
            assert!(matches!(
                other.linear_from_converted(bad, opts.clone()),
                Err(Error::OutOfRange { index: 5, .. })
            ));
            let mut nan = other.converted_zeroed(n, k, format).unwrap();
            nan.values_bytes_mut().copy_from_slice(&values);
            nan.scales_bytes_mut()[..4].copy_from_slice(&f32::NAN.to_le_bytes());
            assert!(matches!(
                other.linear_from_converted(nan, opts.clone()),
                Err(Error::OutOfRange { index: 0, .. })
            ));
            // Garbage in the padding never reaches the NPU: it is zeroed.
            let mut padded = other.converted_zeroed(n, k, format).unwrap();
            padded.values_bytes_mut().copy_from_slice(&values);
            padded.scales_bytes_mut().copy_from_slice(&scales);
            let (_, k_pad) = padded.padded();
            if k_pad > k {
                padded.values_bytes_mut()[k] = 100;
            }
            let last = padded.scales_bytes_mut().len();
            if padded.padded().0 > n {
                padded.scales_bytes_mut()[last - 4..].copy_from_slice(&7.0f32.to_le_bytes());
            }
            let lin = other.linear_from_converted(padded, opts).unwrap();
            assert_eq!(bits(&lin.forward_vec(&x, 3).unwrap()), bits(&want));
        }
    }
}

/// Converted weights held outside the engine (as a mapped file holds them), recording which
/// rows the lanes say they placed.
struct Held {
    values: Vec<u8>,
    scales: Vec<u8>,
    placed: std::sync::Mutex<Vec<std::ops::Range<usize>>>,
}

impl rknn_matmul::engine::ConvertedBytes for Held {
    fn values(&self) -> &[u8] {
        &self.values
    }
    fn scales(&self) -> &[u8] {
        &self.scales
    }
    fn placed(&self, rows: std::ops::Range<usize>) {
        self.placed.lock().unwrap().push(rows);
    }
}

backend_test!(weights_streamed_out_and_placed_from_bytes_match_a_converting_load);
fn weights_streamed_out_and_placed_from_bytes_match_a_converting_load(rt: &Runtime) {
    use rknn_matmul::engine::{LinearOptions, Rotation};
    use std::sync::Arc;
    let mut rng = fastrand::Rng::with_seed(8);
    for (format, k, n) in [
        (WeightFormat::W8A8, 8192 + 100, 300),
        (WeightFormat::F16, 130, 33),
    ] {
        let w = random(&mut rng, n * k);
        let x = random(&mut rng, 2 * k);
        let rotation = Some(Rotation::hadamard_mixed(k, 5));
        let opts = LinearOptions {
            rotation: rotation.clone(),
            residual_activations: false,
            ..LinearOptions::default()
        };
        let rows = |first: usize, buf: &mut [f32]| {
            buf.copy_from_slice(&w[first * k..first * k + buf.len()]);
            Ok::<(), Error>(())
        };
        let e = engine(rt, 3);
        let want = e
            .linear_from_rows(n, k, format, opts.clone(), rows)
            .unwrap()
            .forward_vec(&x, 2)
            .unwrap();
        let (n_pad, k_pad) = e.converted_zeroed(n, k, format).unwrap().padded();
        let row_bytes = k_pad * if format == WeightFormat::F16 { 2 } else { 1 };
        let (mut values, mut scales, mut next) = (Vec::new(), Vec::new(), 0);
        let padded = e
            .convert_to(n, k, format, rotation.as_ref(), rows, |first, v, s| {
                assert_eq!(first, next, "steps in order");
                next += v.len() / row_bytes;
                values.extend_from_slice(v);
                scales.extend_from_slice(s);
                Ok(())
            })
            .unwrap();
        assert_eq!(padded, (n_pad, k_pad));
        assert_eq!(next, n_pad);
        let held = Arc::new(Held {
            values,
            scales,
            placed: Default::default(),
        });
        let lin = e
            .linear_from_bytes(n, k, format, opts.clone(), held.clone())
            .unwrap();
        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        assert_eq!(
            bits(&lin.forward_vec(&x, 2).unwrap()),
            bits(&want),
            "{format}"
        );
        // Every row placed once, and said so.
        let mut placed = held.placed.lock().unwrap().clone();
        placed.sort_by_key(|r| r.start);
        let covered: usize = placed.iter().map(|r| r.len()).sum();
        assert_eq!(covered, n_pad, "{placed:?}");

        // Wrong lengths and bad values are refused by name; a bad value found by a lane too.
        let short = Arc::new(Held {
            values: held.values[1..].to_vec(),
            scales: held.scales.clone(),
            placed: Default::default(),
        });
        assert!(matches!(
            e.linear_from_bytes(n, k, format, opts.clone(), short),
            Err(Error::Length { .. })
        ));
        if format == WeightFormat::W8A8 {
            let mut v = held.values.clone();
            v[k_pad * (n - 1) + 3] = 0x80;
            let bad = Arc::new(Held {
                values: v,
                scales: held.scales.clone(),
                placed: Default::default(),
            });
            let err = e
                .linear_from_bytes(n, k, format, opts.clone(), bad)
                .unwrap_err();
            assert!(
                matches!(err, Error::OutOfRange { index, .. } if index == k_pad * (n - 1) + 3),
                "{err}"
            );
        }
    }
}

backend_test!(linears_placed_whole_on_one_lane_give_the_bits_of_split_ones);
/// A linear placed whole on a lane (`LinearOptions::lane`) holds all its contexts there and
/// gives, bit for bit, what the same linear split over every lane gives: W8A8 with a rotation
/// and residual rows, and F16, for decode rows, a prompt chunk and more rows than one chunk.
/// A lane the engine does not have is a typed error naming both counts.
fn linears_placed_whole_on_one_lane_give_the_bits_of_split_ones(rt: &Runtime) {
    use rknn_matmul::engine::{LinearOptions, Rotation};
    let e = engine(rt, 3);
    let lanes = e.workers();
    let mut rng = fastrand::Rng::with_seed(31);
    let (k, n) = (320, 200);
    let w = random(&mut rng, n * k);
    for (format, residual) in [
        (WeightFormat::W8A8, false),
        (WeightFormat::W8A8, true),
        (WeightFormat::F16, false),
    ] {
        let opts = |lane| LinearOptions {
            rotation: (format == WeightFormat::W8A8).then(|| Rotation::hadamard_mixed(k, 5)),
            residual_activations: residual,
            lane,
            int4_group: None,
        };
        let split = e.linear_with(&w, n, k, format, opts(None)).unwrap();
        for lane in 0..lanes {
            let whole = e.linear_with(&w, n, k, format, opts(Some(lane))).unwrap();
            assert_eq!(whole.lane(), Some(lane));
            assert_eq!(whole.contexts(), 1, "{n} columns fit one context");
            for m in [1, 3, 40, 700] {
                let x = random(&mut rng, m * k);
                let (want, got) = (
                    split.forward_vec(&x, m).unwrap(),
                    whole.forward_vec(&x, m).unwrap(),
                );
                let same = want
                    .iter()
                    .zip(&got)
                    .all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(same, "{format:?} residual {residual} lane {lane} m {m}");
            }
        }
        if lanes > 1 {
            assert_eq!(split.lane(), None);
        }
    }
    let err = e
        .linear_with(
            &w,
            n,
            k,
            WeightFormat::W8A8,
            LinearOptions {
                lane: Some(lanes),
                ..LinearOptions::default()
            },
        )
        .unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains(&format!("lane {lanes} does not exist"))
            && msg.contains(&format!("{lanes} lanes")),
        "{msg}"
    );
}

backend_test!(forward_many_gives_the_bits_of_one_forward_at_a_time);
/// `Linear::forward_many` over linears whole on different lanes, split ones, and a job of more
/// rows than one chunk gives each job the bits of its own `forward`; four threads doing it at
/// once on the same linears each get theirs (outputs pre-filled with NaN: a lost view would
/// leave one unwritten). Linears of two engines in one group are a typed error.
fn forward_many_gives_the_bits_of_one_forward_at_a_time(rt: &Runtime) {
    use rknn_matmul::engine::{ForwardJob, Linear, LinearOptions};
    let e = engine(rt, 3);
    let lanes = e.workers();
    let mut rng = fastrand::Rng::with_seed(41);
    let shapes = [
        (96, 64),
        (130, 200),
        (64, 96),
        (300, 40),
        (33, 128),
        (96, 64),
    ];
    let mut linears = Vec::new();
    let mut weights = Vec::new();
    for (i, &(n, k)) in shapes.iter().enumerate() {
        let w = random(&mut rng, n * k);
        let opts = LinearOptions {
            residual_activations: i % 2 == 1,
            // Every other linear whole on a lane, the rest split over all of them.
            lane: (i % 2 == 0).then_some((i / 2) % lanes),
            ..LinearOptions::default()
        };
        linears.push(e.linear_with(&w, n, k, WeightFormat::W8A8, opts).unwrap());
        weights.push(w);
    }
    let rows = [1usize, 2, 5, 1, 300, 3];
    let check = |rng: &mut fastrand::Rng, who: &str| {
        let xs: Vec<Vec<f32>> = shapes
            .iter()
            .zip(&rows)
            .map(|(&(_, k), &m)| random(rng, m * k))
            .collect();
        let mut outs: Vec<Vec<f32>> = shapes
            .iter()
            .zip(&rows)
            .map(|(&(n, _), &m)| vec![f32::NAN; m * n])
            .collect();
        let mut jobs: Vec<ForwardJob<'_>> = linears
            .iter()
            .zip(&xs)
            .zip(&rows)
            .zip(outs.iter_mut())
            .map(|(((linear, x), &m), out)| ForwardJob { linear, x, m, out })
            .collect();
        Linear::forward_many(&mut jobs).unwrap();
        drop(jobs);
        for (i, ((lin, x), out)) in linears.iter().zip(&xs).zip(&outs).enumerate() {
            let want = lin.forward_vec(x, rows[i]).unwrap();
            let same = want
                .iter()
                .zip(out)
                .all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(same, "{who}: job {i} ({} rows)", rows[i]);
        }
    };
    check(&mut rng, "alone");
    let rounds = if cfg!(miri) { 1 } else { 10 };
    std::thread::scope(|s| {
        for t in 0..4u64 {
            let check = &check;
            s.spawn(move || {
                let mut rng = fastrand::Rng::with_seed(200 + t);
                for r in 0..rounds {
                    check(&mut rng, &format!("thread {t} round {r}"));
                }
            });
        }
    });
    let other = engine(rt, 1);
    let stray = other
        .linear(&weights[0], 96, 64, WeightFormat::W8A8)
        .unwrap();
    let (x, mut y0, mut y1) = (random(&mut rng, 64), vec![0.0; 96], vec![0.0; 96]);
    let err = Linear::forward_many(&mut [
        ForwardJob {
            linear: &linears[0],
            x: &x,
            m: 1,
            out: &mut y0,
        },
        ForwardJob {
            linear: &stray,
            x: &x,
            m: 1,
            out: &mut y1,
        },
    ])
    .unwrap_err();
    assert!(err.to_string().contains("same engine"), "{err}");
}

/// Symmetric per-channel int4, written from the engine's documented formula: `amax` the largest
/// `|w|`; scale `(amax / 7) · r` for the ratio `r` of the least squared error (eight interleaved
/// f32 partial sums), among 1.0, 0.95, …, 0.5 and then ±1..4 hundredths around the best of
/// those (within 0.5..=1.0), the earlier on a tie; q = round_ties_even(clamp(w / scale, -7, 7)).
fn quantize_i4(row: &[f32]) -> (Vec<i32>, f32) {
    let amax = row.iter().fold(0f32, |a, &x| a.max(x.abs()));
    if amax == 0.0 {
        return (vec![0; row.len()], 0.0);
    }
    let q = |x: f32, inv: f32| (x * inv).clamp(-7.0, 7.0).round_ties_even();
    let cost = |r: f32| -> f32 {
        let s = amax / 7.0 * r;
        let inv = 1.0 / s;
        let mut part = [0f32; 8];
        for (i, &x) in row.iter().enumerate() {
            let e = x - s * q(x, inv);
            part[i % 8] += e * e;
        }
        part.iter().sum()
    };
    let mut best = (1.0f32, cost(1.0));
    for i in 1..=10 {
        let r = 1.0 - 0.05 * i as f32;
        // The engine's table spells these ratios as literals: the same f32 values.
        let r = (r * 100.0).round() / 100.0;
        let c = cost(r);
        if c < best.1 {
            best = (r, c);
        }
    }
    let centre = best.0;
    for j in [-4, -3, -2, -1, 1, 2, 3, 4] {
        let r = centre + j as f32 * 0.01;
        if (0.5..=1.0).contains(&r) {
            let c = cost(r);
            if c < best.1 {
                best = (r, c);
            }
        }
    }
    let s = amax / 7.0 * best.0;
    let inv = 1.0 / s;
    (row.iter().map(|&x| q(x, inv) as i32).collect(), s)
}

/// The documented W4A8 result: int4 weights per channel ([`quantize_i4`]), int8 activations per
/// row (`common::quantize`; with `residual`, also the residual `x - s·q` quantised the same
/// way), exact integer sums, then `(acc · row scale) · channel scale`, or with the residual
/// `(acc₀ · s₀ + acc₁ · s₁) · channel scale`.
fn reference_w4a8(x: &[f32], w: &[f32], m: usize, k: usize, n: usize, residual: bool) -> Vec<f32> {
    let wq: Vec<(Vec<i32>, f32)> = w.chunks_exact(k).map(quantize_i4).collect();
    let dot = |a: &[i32], b: &[i32]| -> i32 {
        let s: i64 = a.iter().zip(b).map(|(&a, &b)| i64::from(a * b)).sum();
        i32::try_from(s).unwrap()
    };
    let mut out = vec![0f32; m * n];
    for r in 0..m {
        let row = &x[r * k..(r + 1) * k];
        let (q1, s1) = common::quantize(row);
        let e: Vec<f32> = row
            .iter()
            .zip(&q1)
            .map(|(&v, &q)| v - s1 * q as f32)
            .collect();
        let (q2, s2) = common::quantize(&e);
        for (j, (wj, ws)) in wq.iter().enumerate() {
            out[r * n + j] = if residual {
                (dot(&q1, wj) as f32 * s1 + dot(&q2, wj) as f32 * s2) * ws
            } else {
                (dot(&q1, wj) as f32 * s1) * ws
            };
        }
    }
    out
}

/// RK3576 runtimes of `rt`'s backend: on the emulator, one per setting of the two \[open\]
/// int4 questions (the converter's input packing, and the nibble order of native B that the
/// converter writes and a run reads); on the drop-in or a board, `rt` itself when it is an
/// RK3576 (the process's settings). Empty, with the reason printed, elsewhere.
fn rk3576_runtimes(rt: &Runtime) -> Vec<(String, Runtime)> {
    use rknn_matmul::Platform;
    #[cfg(feature = "emulator")]
    if common::TestBackend::of(rt) == common::TestBackend::Emulator {
        use rknn_matmul::rknn_emu::NibbleOrder;
        use rknn_matmul::{Backend, Int4ConverterInput, RuntimeOptions};
        let mut all = Vec::new();
        for input in [Int4ConverterInput::Packed, Int4ConverterInput::OnePerByte] {
            for nibbles in [NibbleOrder::LowFirst, NibbleOrder::HighFirst] {
                let (_, base) = common::options_for(common::TestBackend::Emulator);
                let opts = RuntimeOptions {
                    int4_converter_input: Some(input),
                    emulator: rknn_matmul::EmuConfig {
                        native_b_nibbles: nibbles,
                        ..base.emulator.clone()
                    },
                    ..base
                };
                let rt = Runtime::open(Backend::Emulator(Platform::Rk3576), opts).unwrap();
                all.push((format!("converter input {input}, native B {nibbles:?}"), rt));
            }
        }
        return all;
    }
    if rt.platform() == Platform::Rk3576 {
        let what = format!("converter input {}", rt.int4_converter_input());
        return vec![(what, rt.clone())];
    }
    eprintln!(
        "skipped: the {} backend is a {}, not an RK3576",
        common::TestBackend::of(rt),
        rt.platform()
    );
    Vec::new()
}

/// Shapes for the int4 formats on RK3576: K in two segments (4096 + 100), K odd and below the
/// alignment (33, padded to 64: the last pair holds one value and one padding nibble), N not
/// a multiple of int4's 64, M above the exact buckets.
const INT4_SHAPES: [(usize, usize, usize); 4] = [
    (1, 4096 + 100, 70),
    (3, 33, 130),
    (2, 64, 64),
    (130, 200, 65),
];

backend_test!(w4a8_is_exactly_the_reference_on_rk3576_under_every_int4_setting);
/// W4A8 on RK3576 equals, bit for bit, the documented integer arithmetic (int4 weights per
/// channel, int8 activations per row, with and without the residual row), under both
/// converter-input settings and both native-B nibble orders, on one lane and on two.
fn w4a8_is_exactly_the_reference_on_rk3576_under_every_int4_setting(rt: &Runtime) {
    use rknn_matmul::engine::LinearOptions;
    let mut rng = fastrand::Rng::with_seed(43);
    let cases: Vec<_> = INT4_SHAPES
        .iter()
        .map(|&(m, k, n)| (m, k, n, random(&mut rng, n * k), random(&mut rng, m * k)))
        .collect();
    for (what, rt) in rk3576_runtimes(rt) {
        for cores in [2, 1] {
            let e = engine(&rt, cores);
            for (m, k, n, w, x) in &cases {
                let (m, k, n) = (*m, *k, *n);
                for residual in [false, true] {
                    let opts = LinearOptions {
                        residual_activations: residual,
                        ..LinearOptions::default()
                    };
                    let lin = e.linear_with(w, n, k, WeightFormat::W4A8, opts).unwrap();
                    // RK3576 splits K in segments of 4096: as many contexts per segment as a
                    // linear of one segment has.
                    let one = e.linear(&w[..n * 32], n, 32, WeightFormat::W4A8).unwrap();
                    assert_eq!(lin.contexts(), one.contexts() * k.div_ceil(4096), "K={k}");
                    let got = lin.forward_vec(x, m).unwrap();
                    let want = reference_w4a8(x, w, m, k, n, residual);
                    for (i, (g, r)) in got.iter().zip(&want).enumerate() {
                        assert_eq!(
                            g.to_bits(),
                            r.to_bits(),
                            "{what}, {cores} core(s), M={m} K={k} N={n} residual={residual} at {i}: {g} vs {r}"
                        );
                    }
                }
            }
        }
        println!("w4a8 checked: {what}");
    }
}

backend_test!(w4a16_matches_an_f64_reference_on_rk3576_under_every_int4_setting);
/// W4A16 on RK3576 against an f64 reference of its documented arithmetic: the int4 weights of
/// [`quantize_i4`] times the f16 activations, summed, times the channel scale (f16 products
/// summed in f32 on the NPU: a tolerance, not bits), under every int4 setting; every setting
/// and core count gives the same bits.
fn w4a16_matches_an_f64_reference_on_rk3576_under_every_int4_setting(rt: &Runtime) {
    let mut rng = fastrand::Rng::with_seed(44);
    let cases: Vec<_> = INT4_SHAPES
        .iter()
        .map(|&(m, k, n)| (m, k, n, random(&mut rng, n * k), random(&mut rng, m * k)))
        .collect();
    let h = |v: f32| f64::from(half::f16::from_f32(v).to_f32());
    let mut first: Vec<Vec<u32>> = Vec::new();
    for (what, rt) in rk3576_runtimes(rt) {
        for cores in [2, 1] {
            let e = engine(&rt, cores);
            for (i, (m, k, n, w, x)) in cases.iter().enumerate() {
                let (m, k, n) = (*m, *k, *n);
                let lin = e.linear(w, n, k, WeightFormat::W4A16).unwrap();
                let got = lin.forward_vec(x, m).unwrap();
                for (j, wj) in w.chunks_exact(k).enumerate() {
                    let (q, ws) = quantize_i4(wj);
                    let ws = f64::from(ws);
                    for r in 0..m {
                        let xr = &x[r * k..(r + 1) * k];
                        let want: f64 =
                            ws * (0..k).map(|c| h(xr[c]) * f64::from(q[c])).sum::<f64>();
                        let mag: f64 = ws
                            * (0..k)
                                .map(|c| (h(xr[c]) * f64::from(q[c])).abs())
                                .sum::<f64>();
                        let g = f64::from(got[r * n + j]);
                        assert!(
                            (g - want).abs() <= 1e-5 * mag + 1e-6,
                            "{what}, {cores} core(s), M={m} K={k} N={n} [{r},{j}] {g} vs {want}"
                        );
                    }
                }
                let bits: Vec<u32> = got.iter().map(|f| f.to_bits()).collect();
                match first.get(i) {
                    Some(b) => assert_eq!(&bits, b, "{what}, {cores} core(s), M={m} K={k} N={n}"),
                    None => first.push(bits),
                }
            }
        }
        println!("w4a16 checked: {what}");
    }
}

backend_test!(int4_converted_weights_are_packed_two_per_byte_and_stored_and_placed_again);
/// The int4 formats' converted weights: two values per byte, one scale per channel; stored as
/// bytes and placed again (from a copy or from the bytes themselves) they give the bits of a
/// converting load; a stored -8 (outside the symmetric range) is refused naming the rule, and
/// garbage in the padding nibbles never reaches the NPU.
fn int4_converted_weights_are_packed_two_per_byte_and_stored_and_placed_again(rt: &Runtime) {
    use rknn_matmul::engine::{LinearOptions, Rotation};
    let Some((_, rt)) = rk3576_runtimes(rt).into_iter().next() else {
        return;
    };
    let mut rng = fastrand::Rng::with_seed(45);
    for (format, k, n) in [
        (WeightFormat::W4A8, 4096 + 33, 70),
        (WeightFormat::W4A16, 33, 130),
        (WeightFormat::W4A8, 33, 64),
    ] {
        let w = random(&mut rng, n * k);
        let x = random(&mut rng, 3 * k);
        let rotation = Some(Rotation::hadamard_mixed(k, 11));
        let opts = LinearOptions {
            rotation: rotation.clone(),
            residual_activations: true,
            ..LinearOptions::default()
        };
        let rows = |first: usize, buf: &mut [f32]| {
            buf.copy_from_slice(&w[first * k..first * k + buf.len()]);
            Ok::<(), Error>(())
        };
        let e = engine(&rt, 2);
        let want = e
            .linear_from_rows(n, k, format, opts.clone(), rows)
            .unwrap()
            .forward_vec(&x, 3)
            .unwrap();
        let c = e
            .convert_from_rows(n, k, format, rotation.as_ref(), rows)
            .unwrap();
        let (n_pad, k_pad) = c.padded();
        assert_eq!((n_pad % 64, k_pad % 32), (0, 0), "int4's alignment");
        assert_eq!(
            c.values_bytes().len(),
            n_pad * k_pad / 2,
            "two values per byte"
        );
        assert_eq!(c.scales().len(), n_pad, "one scale per channel");
        // The first row, unpacked (even column low), is the documented quantisation.
        let mut rw = w[..k].to_vec();
        rotation.as_ref().unwrap().apply_rows(&mut rw);
        let (q, s) = quantize_i4(&rw);
        assert_eq!(c.scales()[0], s);
        let first: Vec<i32> = c.values_bytes()[..k.div_ceil(2)]
            .iter()
            .flat_map(|&b| [i32::from(((b << 4) as i8) >> 4), i32::from((b as i8) >> 4)])
            .take(k)
            .collect();
        assert_eq!(first, q);
        let (values, scales) = (c.values_bytes().to_vec(), c.scales_bytes().to_vec());
        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();

        let other = engine(&rt, 1);
        let stored = |values: &[u8]| {
            let mut s = other.converted_zeroed(n, k, format).unwrap();
            s.values_bytes_mut().copy_from_slice(values);
            s.scales_bytes_mut().copy_from_slice(&scales);
            s
        };
        let placed = other
            .linear_from_converted(stored(&values), opts.clone())
            .unwrap();
        assert_eq!(
            bits(&placed.forward_vec(&x, 3).unwrap()),
            bits(&want),
            "{format}"
        );
        let held = std::sync::Arc::new(Held {
            values: values.clone(),
            scales: scales.clone(),
            placed: Default::default(),
        });
        let from_bytes = other
            .linear_from_bytes(n, k, format, opts.clone(), held)
            .unwrap();
        assert_eq!(
            bits(&from_bytes.forward_vec(&x, 3).unwrap()),
            bits(&want),
            "{format}"
        );

        // A -8 in the high nibble of byte 2 (value 5).
        let mut bad = values.clone();
        bad[2] = (bad[2] & 0x0f) | 0x80;
        let e8 = other.linear_from_converted(stored(&bad), opts.clone());
        assert!(
            matches!(&e8, Err(Error::OutOfRange { index: 5, value: -8, range, .. }) if range.contains("-7..=7")),
            "{e8:?}"
        );
        // Padding: the high nibble of the last pair of row 0 (K is odd) and a padding byte,
        // even holding -8, are zeroed, not refused.
        let mut padded = values.clone();
        padded[k / 2] = (padded[k / 2] & 0x0f) | 0x80;
        padded[k_pad / 2 - 1] = 0x88;
        let lin = other.linear_from_converted(stored(&padded), opts).unwrap();
        assert_eq!(
            bits(&lin.forward_vec(&x, 3).unwrap()),
            bits(&want),
            "{format}"
        );
    }
}

backend_test!(int4_formats_are_refused_on_rk3588_before_anything_is_allocated);
/// On RK3588 (no weight-only int4: [hw]) every way of making or converting a W4A16 or W4A8
/// linear is `Error::Unsupported` naming the format and the chip with the capability probe's
/// reason, before its input is even looked at (a wrong length is not what is reported) and
/// before any NPU memory is taken.
fn int4_formats_are_refused_on_rk3588_before_anything_is_allocated(rt: &Runtime) {
    use rknn_matmul::engine::LinearOptions;
    use rknn_matmul::{Platform, Scheme};
    let Some(rt) = common::runtime_for(rt, Platform::Rk3588) else {
        return;
    };
    let e = engine(&rt, 3);
    let live = rt.handle_budget().live();
    let never = |_: usize, _: &mut [f32]| -> Result<(), Error> { panic!("rows read") };
    for (format, scheme) in [
        (WeightFormat::W4A16, Scheme::W4A16),
        (WeightFormat::W4A8, Scheme::W4A8),
    ] {
        let (n, k) = (64, 64);
        let results = [
            e.linear(&[0.0; 3], n, k, format).map(drop),
            e.linear_from_rows(n, k, format, LinearOptions::default(), never)
                .map(drop),
            e.convert_from_rows(n, k, format, None, never).map(drop),
            e.convert_to(n, k, format, None, never, |_, _, _| Ok(()))
                .map(drop),
            e.converted_zeroed(n, k, format).map(drop),
            e.check_format(format),
        ];
        for r in results {
            let err = r.unwrap_err();
            let msg = err.to_string();
            assert!(
                matches!(&err, Error::Unsupported { scheme: s, platform: Platform::Rk3588, .. } if *s == scheme),
                "{err:?}"
            );
            assert!(
                msg.contains(&format.name().to_uppercase())
                    && msg.contains("RK3588")
                    && msg.contains("no weight-only"),
                "{msg}"
            );
        }
        assert_eq!(rt.handle_budget().live(), live, "no NPU memory taken");
    }
    // The chip's own formats are accepted.
    e.check_format(WeightFormat::W8A8).unwrap();
    e.check_format(WeightFormat::F16).unwrap();
}

/// Set in the children of [`int4_formats_on_the_dropin_as_an_rk3576_under_every_int4_setting`].
const INT4_CHILD: &str = "RKNN_TEST_INT4_CHILD";

/// The int4 tests' drop-in variants in child processes whose drop-in library plays an RK3576
/// (the library reads its chip and its int4 settings from the environment once, when it is
/// loaded), once per setting of the two \[open\] int4 questions: the converter's input packing
/// (`RKNN_INT4_B_CONVERTER_INPUT`, read by the safe layer and the library alike) and the nibble
/// order of native B (`RKNN_EMU_NATIVE_B_NIBBLES`).
#[test]
#[cfg_attr(miri, ignore = "child processes")]
fn int4_formats_on_the_dropin_as_an_rk3576_under_every_int4_setting() {
    if std::env::var_os(INT4_CHILD).is_some() {
        return;
    }
    if let Some(reason) = common::skip_reason(common::TestBackend::Dropin) {
        eprintln!("skipped: {reason}");
        return;
    }
    for input in ["packed", "one-per-byte"] {
        for nibbles in ["low-first", "high-first"] {
            for (test, says) in [
                (
                    "w4a8_is_exactly_the_reference_on_rk3576_under_every_int4_setting::dropin",
                    "w4a8 checked",
                ),
                (
                    "w4a16_matches_an_f64_reference_on_rk3576_under_every_int4_setting::dropin",
                    "w4a16 checked",
                ),
                (
                    "int4_converted_weights_are_packed_two_per_byte_and_stored_and_placed_again::dropin",
                    "",
                ),
            ] {
                let env = [
                    ("RKNN_EMU_NATIVE_B_NIBBLES", nibbles),
                    ("RKNN_INT4_B_CONVERTER_INPUT", input),
                ];
                let what = format!("{test} ({input}, {nibbles})");
                let ran = format!("{says}: converter input {input}");
                if !rk3576_child(test, &env, &what, (!says.is_empty()).then_some(&ran)) {
                    return;
                }
            }
        }
    }
}

/// Runs `test` of this file in a child process whose drop-in library plays an RK3576, with
/// `env` set and every other `RKNN_EMU_*` variable removed, and asserts that it passed and (if
/// given) printed `ran`. `false`: children cannot run here (the reason printed).
fn rk3576_child(test: &str, env: &[(&str, &str)], what: &str, ran: Option<&str>) -> bool {
    let exe = std::env::current_exe().unwrap();
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
    cmd.args(["--exact", test, "--nocapture"]);
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("RKNN_EMU_") {
            cmd.env_remove(k);
        }
    }
    cmd.env("RKNN_EMU_PLATFORM", "rk3576")
        .env("RKNN_EMU_LOG", "0")
        .env("RKNN_TEST_BACKEND", "dropin")
        .env(INT4_CHILD, "1");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let Some(out) = common::run_child_test(&mut cmd) else {
        return false;
    };
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("1 passed"),
        "{what}: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(ran.is_none_or(|r| stdout.contains(r)), "{what}: {stdout}");
    true
}

/// RK3576 runtimes of `rt`'s backend for per-group int4: on the emulator one per order of
/// per-group parameters (\[open\]: `[K/G][N]` or `[N][K/G]`, [`rknn_matmul::GroupOrder`]),
/// set through the runtime's option so the engine writes and the emulator reads the same
/// order; on the drop-in or a board, `rt` itself when it is an RK3576 (the process's setting,
/// `RKNN_EMU_GROUP_ORDER`, which the safe layer and the drop-in read alike).
fn rk3576_group_runtimes(rt: &Runtime) -> Vec<(String, Runtime)> {
    use rknn_matmul::Platform;
    #[cfg(feature = "emulator")]
    if common::TestBackend::of(rt) == common::TestBackend::Emulator {
        use rknn_matmul::{Backend, GroupOrder, RuntimeOptions};
        return [GroupOrder::KMajor, GroupOrder::NMajor]
            .into_iter()
            .map(|order| {
                let (_, base) = common::options_for(common::TestBackend::Emulator);
                let opts = RuntimeOptions {
                    group_order: Some(order),
                    ..base
                };
                let rt = Runtime::open(Backend::Emulator(Platform::Rk3576), opts).unwrap();
                (format!("group order {order}"), rt)
            })
            .collect();
    }
    if rt.platform() == Platform::Rk3576 {
        return vec![(format!("group order {}", rt.group_order()), rt.clone())];
    }
    eprintln!(
        "skipped: the {} backend is a {}, not an RK3576",
        common::TestBackend::of(rt),
        rt.platform()
    );
    Vec::new()
}

/// Per row: `k_pad` values, then `k_pad / g` scales and as many offsets.
type Grouped = (Vec<Vec<i32>>, Vec<Vec<f32>>, Vec<Vec<f32>>);

/// Per-group int4 converted weights unpacked: per row `k_pad` values (-8..=7) and its
/// `k_pad / g` scales and offsets.
fn unpack_grouped(c: &rknn_matmul::engine::ConvertedWeights, g: usize) -> Grouped {
    let (n_pad, k_pad) = c.padded();
    let groups = k_pad / g;
    let mut q = Vec::new();
    let (mut d, mut o) = (Vec::new(), Vec::new());
    for j in 0..n_pad {
        let row = &c.values_bytes()[j * k_pad / 2..(j + 1) * k_pad / 2];
        q.push(
            row.iter()
                .flat_map(|&b| [i32::from(((b << 4) as i8) >> 4), i32::from((b as i8) >> 4)])
                .collect(),
        );
        let p = &c.scales()[j * 2 * groups..(j + 1) * 2 * groups];
        d.push(p[..groups].to_vec());
        o.push(p[groups..].to_vec());
    }
    (q, d, o)
}

backend_test!(per_group_w4a16_matches_an_f64_reference_on_rk3576_under_both_group_orders);
/// Per-group W4A16 ([`LinearOptions::int4_group`]) on RK3576 against an f64 reference of its
/// documented arithmetic, Σ_k x_f16 · (d·q + o) with the converted q, d and o, under both
/// orders of the per-group parameters, on one lane and two: K in two segments (4096 + 96 in
/// groups of 32, 4096 + 100 padded to 4224 in groups of 64) and below one group's worth of
/// padding (200 in groups of 128), odd N, decode (M = 1) and prefill (M = 5, 130).
fn per_group_w4a16_matches_an_f64_reference_on_rk3576_under_both_group_orders(rt: &Runtime) {
    use rknn_matmul::engine::LinearOptions;
    use std::num::NonZeroU16;
    let mut rng = fastrand::Rng::with_seed(46);
    let shapes = [
        (1, 4096 + 96, 67, 32),
        (5, 4096 + 100, 67, 64),
        (130, 200, 33, 128),
        (1, 200, 33, 128),
    ];
    let cases: Vec<_> = shapes
        .iter()
        .map(|&(m, k, n, g)| {
            // Rows of different ranges, some of them offset: an asymmetric grid's case.
            let mut w = random(&mut rng, n * k);
            for (j, row) in w.chunks_exact_mut(k).enumerate() {
                row.iter_mut()
                    .for_each(|v| *v = *v * (1 + j % 3) as f32 + (j % 5) as f32);
            }
            (m, k, n, g, w, random(&mut rng, m * k))
        })
        .collect();
    let h = |v: f32| f64::from(half::f16::from_f32(v).to_f32());
    let mut first: Vec<Vec<u32>> = Vec::new();
    for (what, rt) in rk3576_group_runtimes(rt) {
        for cores in [2, 1] {
            let e = engine(&rt, cores);
            for (i, (m, k, n, g, w, x)) in cases.iter().enumerate() {
                let (m, k, n, g) = (*m, *k, *n, *g);
                let opts = LinearOptions {
                    int4_group: NonZeroU16::new(g as u16),
                    ..LinearOptions::default()
                };
                let lin = e
                    .linear_with(w, n, k, WeightFormat::W4A16, opts.clone())
                    .unwrap();
                let got = lin.forward_vec(x, m).unwrap();
                let rows = |first: usize, buf: &mut [f32]| {
                    buf.copy_from_slice(&w[first * k..first * k + buf.len()]);
                    Ok::<(), Error>(())
                };
                let c = e
                    .convert_from_rows_with(n, k, WeightFormat::W4A16, &opts, rows)
                    .unwrap();
                let (q, d, o) = unpack_grouped(&c, g);
                for j in 0..n {
                    for r in 0..m {
                        let xr = &x[r * k..(r + 1) * k];
                        let term = |c: usize| {
                            let wv = f64::from(d[j][c / g]) * f64::from(q[j][c])
                                + f64::from(o[j][c / g]);
                            h(xr[c]) * wv
                        };
                        let want: f64 = (0..k).map(term).sum();
                        let mag: f64 = (0..k).map(|c| term(c).abs()).sum();
                        let got = f64::from(got[r * n + j]);
                        assert!(
                            (got - want).abs() <= 2e-5 * mag + 1e-5,
                            "{what}, {cores} core(s), M={m} K={k} N={n} G={g} [{r},{j}] {got} vs {want}"
                        );
                    }
                }
                let bits: Vec<u32> = got.iter().map(|f| f.to_bits()).collect();
                match first.get(i) {
                    Some(b) => assert_eq!(&bits, b, "{what}, {cores} core(s), M={m} K={k} N={n}"),
                    None => first.push(bits),
                }
            }
        }
        println!("per-group w4a16 checked: {what}");
    }
}

backend_test!(per_group_int4_is_refused_where_the_rules_say_before_anything_is_allocated);
/// A per-group size with another format than W4A16, not a multiple of int4's K alignment
/// (32), or not dividing RK3576's K segment (4096), is a typed error naming the rule, from
/// every way of making or converting a linear, before the weights are looked at.
fn per_group_int4_is_refused_where_the_rules_say_before_anything_is_allocated(rt: &Runtime) {
    use rknn_matmul::engine::LinearOptions;
    use std::num::NonZeroU16;
    let Some((_, rt)) = rk3576_group_runtimes(rt).into_iter().next() else {
        return;
    };
    let e = engine(&rt, 1);
    for (format, g, says) in [
        (WeightFormat::W4A8, 32, "w4a16 only"),
        (WeightFormat::F16, 32, "w4a16 only"),
        (WeightFormat::W4A16, 48, "multiple of"),
        (WeightFormat::W4A16, 16, "multiple of"),
        (WeightFormat::W4A16, 96, "divide"),
        (WeightFormat::W4A16, 4096 + 32 * 4, "divide"),
        (WeightFormat::W4A16, 192, "divide"),
    ] {
        let opts = LinearOptions {
            int4_group: NonZeroU16::new(g),
            ..LinearOptions::default()
        };
        let is_rule = |r: Result<(), Error>| {
            assert!(
                matches!(&r, Err(Error::EngineConfig { field: "int4_group", value, rule })
                    if *value == usize::from(g) && rule.contains(says)),
                "{format} G={g}: {r:?}"
            );
        };
        // A wrong length would be another error: the rule is checked first.
        is_rule(
            e.linear_with(&[0.0; 3], 64, 64, format, opts.clone())
                .map(drop),
        );
        is_rule(
            e.convert_from_rows_with(64, 64, format, &opts, |_, _| Ok::<(), Error>(()))
                .map(drop),
        );
        is_rule(
            e.converted_zeroed_with(64, 64, format, opts.int4_group)
                .map(drop),
        );
    }
}

backend_test!(per_group_converted_weights_are_stored_and_placed_again);
/// Per-group int4 converted weights: values two per byte (-8 among them), per output channel
/// its group scales then offsets; stored as bytes and placed again (from a copy, from the
/// bytes, and streamed out by `convert_to_with`) they give the bits of a converting load. The
/// group the weights were converted with must be the one they are placed with; a negative
/// scale, or a non-zero value in a group of scale 0, is refused naming the rule.
fn per_group_converted_weights_are_stored_and_placed_again(rt: &Runtime) {
    use rknn_matmul::engine::LinearOptions;
    use std::num::NonZeroU16;
    let Some((_, rt)) = rk3576_group_runtimes(rt).into_iter().next() else {
        return;
    };
    let mut rng = fastrand::Rng::with_seed(47);
    let (n, k, g) = (70, 4096 + 40, 32);
    let w = random(&mut rng, n * k);
    let x = random(&mut rng, 3 * k);
    let opts = LinearOptions {
        int4_group: NonZeroU16::new(g as u16),
        ..LinearOptions::default()
    };
    let rows = |first: usize, buf: &mut [f32]| {
        buf.copy_from_slice(&w[first * k..first * k + buf.len()]);
        Ok::<(), Error>(())
    };
    let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
    let e = engine(&rt, 2);
    let want = e
        .linear_from_rows(n, k, WeightFormat::W4A16, opts.clone(), rows)
        .unwrap()
        .forward_vec(&x, 3)
        .unwrap();
    let c = e
        .convert_from_rows_with(n, k, WeightFormat::W4A16, &opts, rows)
        .unwrap();
    let (n_pad, k_pad) = c.padded();
    assert_eq!(c.int4_group(), opts.int4_group);
    assert_eq!((n_pad, k_pad), (128, 4096 + 64), "K padded to whole groups");
    assert_eq!(
        c.scales().len(),
        n_pad * 2 * k_pad / g,
        "a scale and an offset per group"
    );
    let (values, scales) = (c.values_bytes().to_vec(), c.scales_bytes().to_vec());
    assert!(
        values.iter().any(|&b| b & 0x0f == 0x08 || b & 0xf0 == 0x80),
        "min/max grids store -8"
    );
    // Streamed out a step at a time: the same bytes.
    let (mut sv, mut ss) = (Vec::new(), Vec::new());
    let padded = e
        .convert_to_with(n, k, WeightFormat::W4A16, &opts, rows, |_, v, s| {
            sv.extend_from_slice(v);
            ss.extend_from_slice(s);
            Ok(())
        })
        .unwrap();
    assert_eq!((padded, &sv, &ss), ((n_pad, k_pad), &values, &scales));

    let other = engine(&rt, 1);
    let stored = |values: &[u8], scales: &[u8]| {
        let mut s = other
            .converted_zeroed_with(n, k, WeightFormat::W4A16, opts.int4_group)
            .unwrap();
        s.values_bytes_mut().copy_from_slice(values);
        s.scales_bytes_mut().copy_from_slice(scales);
        s
    };
    let placed = other
        .linear_from_converted(stored(&values, &scales), opts.clone())
        .unwrap();
    assert_eq!(bits(&placed.forward_vec(&x, 3).unwrap()), bits(&want));
    let held = std::sync::Arc::new(Held {
        values: values.clone(),
        scales: scales.clone(),
        placed: Default::default(),
    });
    let from_bytes = other
        .linear_from_bytes(n, k, WeightFormat::W4A16, opts.clone(), held)
        .unwrap();
    assert_eq!(bits(&from_bytes.forward_vec(&x, 3).unwrap()), bits(&want));

    // Placed with another group (or none): refused, naming the group converted with.
    for group in [None, NonZeroU16::new(64)] {
        let other_opts = LinearOptions {
            int4_group: group,
            ..LinearOptions::default()
        };
        let r = other.linear_from_converted(stored(&values, &scales), other_opts);
        assert!(
            matches!(&r, Err(Error::EngineConfig { field: "int4_group", rule, .. }) if rule.contains("(32)")),
            "{group:?}: {r:?}"
        );
    }
    // Row 1's group 2 given scale 0: its values must be 0.
    let per = 2 * k_pad / g;
    let at = (per + 2) * 4;
    let mut zero = scales.clone();
    zero[at..at + 4].copy_from_slice(&0f32.to_le_bytes());
    let r = other.linear_from_converted(stored(&values, &zero), opts.clone());
    assert!(
        matches!(&r, Err(Error::OutOfRange { what: "per-group int4 weights", index, range, .. })
            if (k_pad + 2 * g..k_pad + 3 * g).contains(index) && range.contains("scale 0")),
        "{r:?}"
    );
    let mut negative = scales.clone();
    negative[at..at + 4].copy_from_slice(&(-0.5f32).to_le_bytes());
    let r = other.linear_from_converted(stored(&values, &negative), opts);
    assert!(
        matches!(&r, Err(Error::OutOfRange { what: "per-group int4 scales", index, .. }) if *index == per + 2),
        "{r:?}"
    );
}

/// The per-group int4 tests' drop-in variants in child processes whose drop-in library plays
/// an RK3576, once per \[open\] order of per-group parameters (`RKNN_EMU_GROUP_ORDER`, read
/// by the safe layer, which the engine writes in, and by the library alike): the per-group
/// quant params reach the library through `rknn_matmul_set_quant_params` as on a board.
#[test]
#[cfg_attr(miri, ignore = "child processes")]
fn per_group_int4_on_the_dropin_as_an_rk3576_under_both_group_orders() {
    if std::env::var_os(INT4_CHILD).is_some() {
        return;
    }
    if let Some(reason) = common::skip_reason(common::TestBackend::Dropin) {
        eprintln!("skipped: {reason}");
        return;
    }
    for order in ["k-major", "n-major"] {
        for (test, says) in [
            (
                "per_group_w4a16_matches_an_f64_reference_on_rk3576_under_both_group_orders::dropin",
                "per-group w4a16 checked",
            ),
            (
                "per_group_converted_weights_are_stored_and_placed_again::dropin",
                "",
            ),
        ] {
            let what = format!("{test} ({order})");
            let ran = format!("{says}: group order {order}");
            let env = [("RKNN_EMU_GROUP_ORDER", order)];
            if !rk3576_child(test, &env, &what, (!says.is_empty()).then_some(&ran)) {
                return;
            }
        }
    }
}
