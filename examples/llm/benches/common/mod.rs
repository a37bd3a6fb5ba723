//! Timing shared by the host benches (`sample`, `host_kernels`).

use std::time::{Duration, Instant};

/// Median time per call of `f` over 9 batches of `n` calls, after one call to warm up.
pub fn per_call(n: usize, mut f: impl FnMut()) -> Duration {
    f();
    let mut v: Vec<Duration> = (0..9)
        .map(|_| {
            let t = Instant::now();
            for _ in 0..n {
                f();
            }
            t.elapsed() / n as u32
        })
        .collect();
    v.sort();
    v[4]
}
