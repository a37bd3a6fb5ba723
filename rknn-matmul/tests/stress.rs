//! Stress and leak checks, one body per test on every backend (`common::backend_test!`; on a
//! board the descriptor counts are the dma-buf handles themselves):
//!
//! * threads each with their own contexts and engines running GEMMs for a bounded time, every
//!   result compared with a naive reference;
//! * threads sharing one engine, forwarding through shared linears while registering and
//!   dropping their own, for a bounded time, every result compared;
//! * 10 000 allocate/free cycles and 2 000 context create/destroy cycles, after which the
//!   runtime's live-handle count and the process's open file descriptors (`/proc/self/fd`) are
//!   back at their start values.
//!
//! The tests of this file take one lock, so the descriptor counts see no other test's files
//! (and, with it held, open every backend's shared runtime, whose first opening would).
//! `RKNPU_STRESS_SECS` sets the time each timed test runs (default 1.5 s).

mod common;

use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use common::backend_test;
use rknn_matmul::engine::{Engine, EngineConfig, WeightFormat};
use rknn_matmul::*;

/// Every test of this file takes it: those that count descriptors must not see another's.
/// Another test's variant may open a backend's shared runtime at any time (the drop-in's
/// `dlopen` and NPU lock are descriptors), so all of them are opened first, with the lock held.
fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    let guard = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    common::open_shared_runtimes();
    guard
}

fn budget() -> Duration {
    let secs = std::env::var("RKNPU_STRESS_SECS")
        .ok()
        .and_then(|s| s.parse::<f64>().ok())
        .unwrap_or(1.5);
    Duration::from_secs_f64(secs)
}

/// Open file descriptors of this process (the directory handle of the listing included, the
/// same on every call).
fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .expect("/proc/self/fd")
        .count()
}

/// The emulator's live contexts, memories and orphaned memories, when the backend is the
/// built-in emulator.
#[cfg(feature = "emulator")]
fn emulator_counts(rt: &Runtime) -> Option<(usize, usize, usize)> {
    rt.emulator_instance().map(|e| {
        let s = e.stats();
        (s.contexts, s.memories, s.orphaned_memories)
    })
}

#[cfg(not(feature = "emulator"))]
fn emulator_counts(_rt: &Runtime) -> Option<(usize, usize, usize)> {
    None
}

fn random(rng: &mut fastrand::Rng, len: usize) -> Vec<f32> {
    (0..len).map(|_| (rng.f32() - 0.5) * 4.0).collect()
}

fn engine_on(rt: &Runtime, cores: usize) -> Engine {
    let cfg = EngineConfig {
        cores: Some(cores.min(rt.npu_cores())),
        pinning: rknn_matmul::engine::topology::Pinning::None,
        ..EngineConfig::default()
    };
    Engine::new(rt, cfg).expect("an engine")
}

backend_test!(
    #[cfg_attr(miri, ignore = "timed: meaningless under Miri")]
    threads_with_their_own_contexts_and_engines_for_a_bounded_time
);
fn threads_with_their_own_contexts_and_engines_for_a_bounded_time(rt: &Runtime) {
    let _serial = serial();
    let rt = common::runtime_with(rt, |_| {});
    let (live0, fds0) = (rt.handle_budget().live(), open_fds());
    let until = Instant::now() + budget();
    let counts: Vec<(usize, usize)> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..3u64)
            .map(|t| {
                let rt = rt.clone();
                s.spawn(move || {
                    let mut rng = fastrand::Rng::with_seed(t);
                    // Its own contexts, memories reused across runs, B bound once.
                    let shapes = [(1, 64, 32), (5, 96, 64), (17, 128, 32)];
                    let mms: Vec<_> = shapes
                        .iter()
                        .map(|&(m, k, n)| {
                            let mm = rt.matmul::<I8xI8ToI32>(m, k, n).build().unwrap();
                            let mems = (
                                mm.alloc_a().unwrap(),
                                mm.alloc_b().unwrap(),
                                mm.alloc_c().unwrap(),
                            );
                            (mm, mems)
                        })
                        .collect();
                    let mut mms = mms;
                    // And its own engine, one core (the NPU cores are shared by the threads).
                    let engine = engine_on(&rt, 1);
                    let (n, k) = (40, 72);
                    let w = random(&mut rng, n * k);
                    let lin = engine.linear(&w, n, k, WeightFormat::W8A8).unwrap();
                    let (mut gemms, mut forwards) = (0, 0);
                    while Instant::now() < until {
                        let i = rng.usize(..mms.len());
                        let (m, k2, n2) = shapes[i];
                        let (mm, (a, b, c)) = &mut mms[i];
                        let av: Vec<i8> = (0..m * k2).map(|_| rng.i8(..)).collect();
                        let bv: Vec<i8> = (0..k2 * n2).map(|_| rng.i8(..)).collect();
                        a.write(&av).unwrap();
                        b.write(&bv).unwrap();
                        mm.run(a, b, c).unwrap();
                        let want = common::naive_i8(&av, &bv, m, k2, n2);
                        let got: Vec<i64> =
                            c.as_slice()[..m * n2].iter().map(|&x| x.into()).collect();
                        assert_eq!(got, want, "thread {t}, shape {i}");
                        gemms += 1;
                        let rows = rng.usize(1..4);
                        let x = random(&mut rng, rows * k);
                        let y = lin.forward_vec(&x, rows).unwrap();
                        let want = common::reference_w8a8(&x, &w, rows, k, n);
                        assert!(
                            y.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()),
                            "thread {t}: engine result"
                        );
                        forwards += 1;
                    }
                    (gemms, forwards)
                })
            })
            .collect();
        workers.into_iter().map(|w| w.join().unwrap()).collect()
    });
    eprintln!("per thread (GEMMs, forwards) in {:?}: {counts:?}", budget());
    assert!(counts.iter().all(|&(g, f)| g > 0 && f > 0));
    assert_eq!(rt.handle_budget().live(), live0);
    assert_eq!(open_fds(), fds0);
    assert!(rt.take_release_errors().is_empty());
}

backend_test!(
    #[cfg_attr(miri, ignore = "timed: meaningless under Miri")]
    threads_sharing_one_engine_forward_register_and_drop_for_a_bounded_time
);
fn threads_sharing_one_engine_forward_register_and_drop_for_a_bounded_time(rt: &Runtime) {
    let _serial = serial();
    let rt = common::runtime_with(rt, |_| {});
    let (live0, fds0) = (rt.handle_budget().live(), open_fds());
    let engine = engine_on(&rt, 3);
    let mut rng = fastrand::Rng::with_seed(7);
    let shared: Vec<(usize, usize, Vec<f32>)> = [(64, 96), (33, 200)]
        .iter()
        .map(|&(n, k)| (n, k, random(&mut rng, n * k)))
        .collect();
    let linears: Vec<_> = shared
        .iter()
        .map(|(n, k, w)| engine.linear(w, *n, *k, WeightFormat::W8A8).unwrap())
        .collect();
    let until = Instant::now() + budget();
    let counts: Vec<usize> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..4u64)
            .map(|t| {
                let (engine, shared, linears) = (&engine, &shared, &linears);
                s.spawn(move || {
                    let mut rng = fastrand::Rng::with_seed(100 + t);
                    let mut rounds = 0;
                    while Instant::now() < until {
                        let which = rng.usize(..shared.len());
                        let (n, k, w) = &shared[which];
                        let m = [1, 3, 130][rng.usize(..3)];
                        let x = random(&mut rng, m * k);
                        let mut out = vec![f32::NAN; m * n];
                        if rng.usize(..4) == 0 {
                            // Its own linear, registered and dropped while the others forward.
                            let own = engine.linear(w, *n, *k, WeightFormat::W8A8).unwrap();
                            own.forward(&x, m, &mut out).unwrap();
                        } else {
                            linears[which].forward(&x, m, &mut out).unwrap();
                        }
                        let want = common::reference_w8a8(&x, w, m, *k, *n);
                        assert!(
                            out.iter()
                                .zip(&want)
                                .all(|(a, b)| a.to_bits() == b.to_bits()),
                            "thread {t} round {rounds}"
                        );
                        rounds += 1;
                    }
                    rounds
                })
            })
            .collect();
        workers.into_iter().map(|w| w.join().unwrap()).collect()
    });
    eprintln!(
        "forwards per thread on one engine in {:?}: {counts:?}",
        budget()
    );
    assert!(counts.iter().all(|&r| r > 0));
    drop(linears);
    drop(engine);
    assert_eq!(rt.handle_budget().live(), live0);
    assert_eq!(open_fds(), fds0);
    assert!(rt.take_release_errors().is_empty());
}

backend_test!(
    #[cfg_attr(miri, ignore = "10 000 cycles: too slow under Miri")]
    ten_thousand_allocate_free_cycles_leave_no_handle_and_no_descriptor
);
fn ten_thousand_allocate_free_cycles_leave_no_handle_and_no_descriptor(rt: &Runtime) {
    let _serial = serial();
    let rt = common::runtime_with(rt, |_| {});
    let mm = rt.matmul::<I8xI8ToI32>(4, 64, 32).build().unwrap();
    let (live0, fds0) = (rt.handle_budget().live(), open_fds());
    let mut held = Vec::new();
    for i in 0..10_000usize {
        let mut a = mm.alloc_a().unwrap();
        a.as_mut_slice()[0] = i as i8;
        // Some cycles keep a few memories alive across cycles, freed in another order.
        if i % 97 == 0 {
            held.push(a);
        }
        if held.len() > 8 {
            held.swap_remove(i % held.len());
        }
    }
    drop(held);
    assert_eq!(rt.handle_budget().live(), live0);
    assert_eq!(open_fds(), fds0);
    if let Some((_, memories, _)) = emulator_counts(&rt) {
        assert_eq!(memories, 0);
    }
    assert!(rt.take_release_errors().is_empty());
}

backend_test!(
    #[cfg_attr(miri, ignore = "2 000 cycles: too slow under Miri")]
    two_thousand_context_cycles_leave_no_handle_and_no_descriptor
);
fn two_thousand_context_cycles_leave_no_handle_and_no_descriptor(rt: &Runtime) {
    let _serial = serial();
    let rt = common::runtime_with(rt, |_| {});
    let (live0, fds0) = (rt.handle_budget().live(), open_fds());
    let contexts0 = emulator_counts(&rt).map(|c| c.0);
    for i in 0..2_000usize {
        let mm = rt.matmul::<I8xI8ToI32>(1 + i % 3, 32, 32).build().unwrap();
        // Every tenth context gets its memories and a run; they outlive it by a moment.
        if i % 10 == 0 {
            let (mut a, mut b, mut c) = (
                mm.alloc_a().unwrap(),
                mm.alloc_b().unwrap(),
                mm.alloc_c().unwrap(),
            );
            a.as_mut_slice().fill(1);
            b.as_mut_slice().fill(2);
            mm.run(&a, &b, &mut c).unwrap();
            assert_eq!(c.as_slice()[0], 64);
            drop(mm);
            drop((a, b, c));
        }
    }
    assert_eq!(rt.handle_budget().live(), live0);
    assert_eq!(open_fds(), fds0);
    if let Some((contexts, memories, orphaned)) = emulator_counts(&rt) {
        assert_eq!(Some(contexts), contexts0);
        assert_eq!((memories, orphaned), (0, 0));
    }
    assert!(rt.take_release_errors().is_empty());
}

backend_test!(a_small_engine_shared_by_two_threads);
/// The engine's scheduler with real threads, small enough for Miri (`.ci/miri` runs it): two
/// threads forward through one shared linear on a two-lane engine (the caller's lane and a
/// worker thread) while one of them registers and drops a linear of its own.
fn a_small_engine_shared_by_two_threads(rt: &Runtime) {
    // Serial with the tests that count this process's descriptors: making an engine opens and
    // closes some (the CPU topology under /sys, the runtime library), which a count taken
    // meanwhile would see.
    let _serial = serial();
    let rt = common::runtime_with(rt, |_| {});
    let engine = engine_on(&rt, 2);
    let (n, k) = (40, 32);
    let mut rng = fastrand::Rng::with_seed(3);
    let w = random(&mut rng, n * k);
    let lin = engine.linear(&w, n, k, WeightFormat::W8A8).unwrap();
    // The same weights whole on the last lane, run in one round with the split linear.
    let whole = engine
        .linear_with(
            &w,
            n,
            k,
            WeightFormat::W8A8,
            rknn_matmul::engine::LinearOptions {
                lane: Some(engine.workers() - 1),
                ..Default::default()
            },
        )
        .unwrap();
    std::thread::scope(|s| {
        for t in 0..2u64 {
            let (engine, lin, whole, w) = (&engine, &lin, &whole, &w);
            s.spawn(move || {
                let mut rng = fastrand::Rng::with_seed(10 + t);
                for i in 0..2 {
                    let x = random(&mut rng, 2 * k);
                    let want = common::reference_w8a8(&x, w, 2, k, n);
                    let y = if t == 1 && i == 1 {
                        let own = engine.linear(w, n, k, WeightFormat::W8A8).unwrap();
                        own.forward_vec(&x, 2).unwrap()
                    } else if t == 0 && i == 1 {
                        use rknn_matmul::engine::{ForwardJob, Linear};
                        let (mut y, mut y2) = (vec![f32::NAN; 2 * n], vec![f32::NAN; 2 * n]);
                        Linear::forward_many(&mut [
                            ForwardJob {
                                linear: lin,
                                x: &x,
                                m: 2,
                                out: &mut y,
                            },
                            ForwardJob {
                                linear: whole,
                                x: &x,
                                m: 2,
                                out: &mut y2,
                            },
                        ])
                        .unwrap();
                        assert!(
                            y2.iter()
                                .zip(&want)
                                .all(|(a, b)| a.to_bits() == b.to_bits())
                        );
                        y
                    } else {
                        lin.forward_vec(&x, 2).unwrap()
                    };
                    assert!(y.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()));
                }
            });
        }
    });
    drop(whole);
    drop(lin);
    drop(engine);
    assert_eq!(rt.handle_budget().live(), 0);
}

backend_test!(linears_dropped_while_idle_workers_read_them_ahead);
/// Idle workers read the next linear's weights ahead, those of the calling thread's lane by
/// address: a linear dropped while a worker reads it ahead must never have its weights read
/// after they are freed (natively a fault: the emulator unmaps them; Miri runs this test too)
/// nor change a bit of any result, while another thread changes the read-ahead budget.
/// (Threads sharing an engine while it reads ahead, which it does by default on the emulator:
/// `threads_sharing_one_engine_...` above.)
fn linears_dropped_while_idle_workers_read_them_ahead(rt: &Runtime) {
    let _serial = serial();
    let rt = common::runtime_with(rt, |_| {});
    let cfg = EngineConfig {
        cores: Some(2.min(rt.npu_cores())),
        pinning: rknn_matmul::engine::topology::Pinning::None,
        // Every byte of these shards (4 MiB each natively: a worker is then still reading when
        // the caller drops the linear; smaller under Miri, which checks every access but runs
        // slowly).
        warm_bytes: Some(8 << 20),
        ..EngineConfig::default()
    };
    let engine = Engine::new(&rt, cfg).expect("an engine");
    let (n, k) = if cfg!(miri) { (64, 64) } else { (1024, 8192) };
    // Under Miri one round: the first drops the linear the workers read ahead (see run_rounds).
    let rounds = if cfg!(miri) { 1 } else { 12 };
    let mut rng = fastrand::Rng::with_seed(30);
    let done = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        // Off, small and whole by turns, while the workers read ahead.
        let (engine, done) = (&engine, &done);
        s.spawn(move || {
            // Under Miri, whose threads take turns on one interpreter, a bounded number of
            // changes, so that this thread's spinning does not slow the rest.
            let changes = if cfg!(miri) { 64 } else { usize::MAX };
            for b in [0, 4 << 10, 8 << 20].into_iter().cycle().take(changes) {
                if done.load(std::sync::atomic::Ordering::Relaxed) {
                    break;
                }
                engine.set_warm_bytes(b);
                std::thread::yield_now();
            }
            engine.set_warm_bytes(8 << 20);
        });
        run_rounds(engine, rounds, (n, k), &mut rng);
        done.store(true, std::sync::atomic::Ordering::Relaxed);
    });
    // With the budget whole again, the order is learned anew and read ahead.
    engine.reset_stats();
    run_rounds(&engine, if cfg!(miri) { 1 } else { 2 }, (n, k), &mut rng);
    assert!(engine.stats().warmed_bytes > 0, "nothing was read ahead");
    drop(engine);
    assert_eq!(rt.handle_budget().live(), 0);
}

/// `rounds` rounds of three linears, each forwarded twice in order and dropped one after the
/// other; the first round's results checked bit for bit.
fn run_rounds(engine: &Engine, rounds: usize, (n, k): (usize, usize), rng: &mut fastrand::Rng) {
    for r in 0..rounds {
        let ws: Vec<Vec<f32>> = (0..3).map(|_| random(rng, n * k)).collect();
        let mut lins: Vec<_> = ws
            .iter()
            .map(|w| Some(engine.linear(w, n, k, WeightFormat::W8A8).unwrap()))
            .collect();
        // Twice in order, so that the workers learn it: after the last forward a worker reads
        // the first linear ahead, which every third round drops first, at once.
        let mut ran = Vec::new();
        for _ in 0..2 {
            for (i, lin) in lins.iter().enumerate() {
                let x = random(rng, k);
                let y = lin.as_ref().unwrap().forward_vec(&x, 1).unwrap();
                ran.push((i, x, y));
            }
        }
        for i in 0..3 {
            lins[(r + i) % 3] = None;
        }
        // The bits of every result, checked once (the naive reference is the slow part).
        for (i, x, y) in ran.into_iter().filter(|_| r == 0) {
            let want = common::reference_w8a8(&x, &ws[i], 1, k, n);
            assert!(y.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()));
        }
    }
}
