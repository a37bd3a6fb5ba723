//! The GEMM engine on the emulator against naive references: W8A8 exactly equal to a
//! reference that quantises the same way, F16 within tolerance, identical whatever the number
//! of cores, for any M, K (above the 8192 segment too) and N.

use std::sync::Arc;

use rknn_matmul::engine::{Engine, EngineConfig, WeightFormat};
use rknn_matmul::{Platform, Runtime};

fn engine(cores: usize) -> Engine {
    let rt = Arc::new(Runtime::emulator(Platform::Rk3588).unwrap());
    let cfg = EngineConfig {
        cores: Some(cores),
        pinning: rknn_matmul::engine::topology::Pinning::None,
        ..EngineConfig::default()
    };
    Engine::new(rt, cfg).unwrap()
}

/// Symmetric per-row quantisation, written from the engine's documented formula:
/// scale = amax / 127, q = clamp(round_ties_even(x * (127 / amax)), -127, 127).
fn quantize(row: &[f32]) -> (Vec<i32>, f32) {
    let amax = row.iter().fold(0f32, |a, &x| a.max(x.abs()));
    if amax == 0.0 {
        return (vec![0; row.len()], 0.0);
    }
    let inv = 127.0f32 / amax;
    (
        row.iter()
            .map(|&x| (x * inv).round_ties_even().clamp(-127.0, 127.0) as i32)
            .collect(),
        amax / 127.0,
    )
}

fn reference_w8a8(x: &[f32], w: &[f32], m: usize, k: usize, n: usize) -> Vec<f32> {
    let wq: Vec<(Vec<i32>, f32)> = w.chunks_exact(k).map(quantize).collect();
    let mut out = vec![0f32; m * n];
    for r in 0..m {
        let (xq, xs) = quantize(&x[r * k..(r + 1) * k]);
        for (j, (wj, ws)) in wq.iter().enumerate() {
            let acc: i64 = xq.iter().zip(wj).map(|(&a, &b)| i64::from(a * b)).sum();
            out[r * n + j] = (acc as i32 as f32 * xs) * ws;
        }
    }
    out
}

fn random(rng: &mut fastrand::Rng, len: usize) -> Vec<f32> {
    (0..len).map(|_| (rng.f32() - 0.5) * 4.0).collect()
}

#[test]
fn w8a8_is_exactly_the_reference_for_random_shapes() {
    let e = engine(3);
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
        let want = reference_w8a8(&x, &w, m, k, n);
        for (i, (g, r)) in got.iter().zip(&want).enumerate() {
            assert_eq!(
                g.to_bits(),
                r.to_bits(),
                "M={m} K={k} N={n} at {i}: {g} vs {r}"
            );
        }
    }
}

#[test]
fn f16_matches_an_f64_reference_within_tolerance() {
    let e = engine(3);
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

#[test]
fn results_are_identical_whatever_the_number_of_cores() {
    let mut rng = fastrand::Rng::with_seed(9);
    let (m, k, n) = (70, 9000, 130);
    let w = random(&mut rng, n * k);
    let x = random(&mut rng, m * k);
    let outs: Vec<Vec<u32>> = (1..=3)
        .flat_map(|c| {
            let e = engine(c);
            [WeightFormat::W8A8, WeightFormat::F16].map(|f| {
                e.linear(&w, n, k, f)
                    .unwrap()
                    .forward_vec(&x, m)
                    .unwrap()
                    .iter()
                    .map(|v| v.to_bits())
                    .collect()
            })
        })
        .collect();
    for c in 1..3 {
        assert_eq!(outs[0], outs[2 * c], "W8A8 with {} cores", c + 1);
        assert_eq!(outs[1], outs[2 * c + 1], "F16 with {} cores", c + 1);
    }
}

#[test]
fn m_buckets_are_multiples_of_128_not_powers_of_two() {
    let cfg = EngineConfig::default();
    assert_eq!(cfg.bucket(1), 1);
    assert_eq!(cfg.bucket(2), 128);
    assert_eq!(cfg.bucket(300), 384);
    assert_eq!(cfg.bucket(512), 512);
    assert_eq!(cfg.buckets(), [1, 128, 256, 384, 512]);
}

#[test]
fn stats_count_every_phase_and_weights_are_freed_on_drop() {
    let e = engine(3);
    let emu = e.runtime().emulator_instance().unwrap();
    let before = emu.stats().memories;
    let mut rng = fastrand::Rng::with_seed(3);
    let (k, n) = (8192 + 64, 96);
    let lin = e
        .linear(&random(&mut rng, n * k), n, k, WeightFormat::W8A8)
        .unwrap();
    // 3 shards × 2 K segments × (A, B, C).
    assert_eq!(emu.stats().memories - before, 18);
    e.reset_stats();
    lin.forward_vec(&random(&mut rng, k), 1).unwrap();
    let s = e.stats();
    assert_eq!(
        (s.forwards, s.quantize.count, s.run.count, s.pack.count),
        (1, 1, 6, 6)
    );
    assert!(s.collect.count >= 6);
    drop(lin);
    assert_eq!(emu.stats().memories, before);
}

#[test]
fn bad_sizes_are_errors() {
    let e = engine(1);
    assert!(e.linear(&[1.0; 10], 3, 4, WeightFormat::W8A8).is_err());
    let lin = e.linear(&[1.0; 12], 3, 4, WeightFormat::W8A8).unwrap();
    assert!(lin.forward_vec(&[1.0; 5], 1).is_err());
    let mut out = vec![0.0; 2];
    assert!(lin.forward(&[1.0; 4], 1, &mut out).is_err());
    assert!(
        Engine::new(
            Arc::new(Runtime::emulator(Platform::Rk3588).unwrap()),
            EngineConfig {
                max_m: 100,
                ..EngineConfig::default()
            }
        )
        .is_err()
    );
    assert!(
        Engine::new(
            Arc::new(Runtime::emulator(Platform::Rk3566).unwrap()),
            EngineConfig {
                cores: Some(2),
                ..EngineConfig::default()
            }
        )
        .is_err()
    );
}

#[test]
fn prequantised_weights_and_single_core_chips() {
    let rt = Arc::new(Runtime::emulator(Platform::Rk3566).unwrap());
    let e = Engine::new(
        rt,
        EngineConfig {
            pinning: rknn_matmul::engine::topology::Pinning::None,
            ..EngineConfig::default()
        },
    )
    .unwrap();
    assert_eq!(e.workers(), 1);
    let q: Vec<i8> = (0..5 * 40).map(|i| (i % 7) as i8 - 3).collect();
    let scales = [0.5f32, 1.0, 2.0, 0.25, 1.5];
    let lin = e.linear_quantized(&q, &scales, 5, 40).unwrap();
    let x: Vec<f32> = (0..40).map(|i| i as f32 / 40.0).collect();
    let got = lin.forward_vec(&x, 1).unwrap();
    let (xq, xs) = quantize(&x);
    for j in 0..5 {
        let acc: i32 = (0..40).map(|c| xq[c] * i32::from(q[j * 40 + c])).sum();
        assert_eq!(got[j], (acc as f32 * xs) * scales[j]);
    }
}
