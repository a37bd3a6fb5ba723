//! The host backend: weights dequantized to f32 and multiplied with the canonical-order dot
//! product of [`super::kernels`], multi-threaded over output features. The reference the NPU
//! path is measured against.

use std::sync::Arc;

use rknn_chip::LinearRole;

use super::backend::{BackendError, LinearFactory, LinearOp, stacked_shape};
use super::host_pool::HostPool;
use super::kernels;
use crate::gguf::TensorView;

/// The host backend: f32 weights, rayon threads.
#[derive(Debug, Clone)]
pub struct HostF32Factory {
    pool: Arc<rayon::ThreadPool>,
}

impl HostF32Factory {
    /// A factory whose linears run on `pool` (a [`HostPool`], or any rayon pool behind an
    /// `Arc`).
    pub fn new(pool: impl Into<HostPool>) -> Self {
        HostF32Factory {
            pool: pool.into().thread_pool().clone(),
        }
    }
}

impl LinearFactory for HostF32Factory {
    fn build(
        &mut self,
        _role: LinearRole,
        parts: &[TensorView<'_>],
    ) -> Result<Box<dyn LinearOp>, BackendError> {
        let (k, n) = stacked_shape(parts)?;
        let mut w = Vec::with_capacity(n * k);
        for t in parts {
            w.extend_from_slice(&t.to_f32()?);
        }
        Ok(Box::new(F32Linear::new(w, n, k, self.pool.clone())?))
    }
}

/// A weight held as f32, `out_features × in_features` row-major.
pub struct F32Linear {
    w: Vec<f32>,
    n: usize,
    k: usize,
    pool: Arc<rayon::ThreadPool>,
}

impl std::fmt::Debug for F32Linear {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("F32Linear")
            .field("out_features", &self.n)
            .field("in_features", &self.k)
            .finish()
    }
}

/// Weight rows one task multiplies by every input row while they stay in L1.
const ROW_BLOCK: usize = 8;

impl F32Linear {
    /// A linear from `w`, `n` rows of `k`.
    pub fn new(
        w: Vec<f32>,
        n: usize,
        k: usize,
        pool: Arc<rayon::ThreadPool>,
    ) -> Result<Self, BackendError> {
        if n.checked_mul(k) != Some(w.len()) {
            return Err(format!("weight of {} values is not {n} × {k}", w.len()).into());
        }
        Ok(F32Linear { w, n, k, pool })
    }

    /// Computes output features `rows` for all `m` inputs into `out_t`, laid out
    /// `[rows.len()][m]` (feature-major, so tasks own disjoint slices).
    fn block(&self, x: &[f32], m: usize, first: usize, out_t: &mut [f32]) {
        let k = self.k;
        let kern = kernels::selected();
        let rows = out_t.len() / m;
        for rb in (0..rows).step_by(ROW_BLOCK) {
            let re = (rb + ROW_BLOCK).min(rows);
            for i in 0..m {
                let xi = &x[i * k..(i + 1) * k];
                for r in rb..re {
                    let n = first + r;
                    out_t[r * m + i] = kern.dot(xi, &self.w[n * k..(n + 1) * k]);
                }
            }
        }
    }
}

impl LinearOp for F32Linear {
    fn in_features(&self) -> usize {
        self.k
    }

    fn out_features(&self) -> usize {
        self.n
    }

    fn weight_format(&self) -> &'static str {
        "f32"
    }

    fn forward(&self, x: &[f32], m: usize, out: &mut [f32]) -> Result<(), BackendError> {
        let (n, k) = (self.n, self.k);
        if m.checked_mul(k) != Some(x.len()) || m.checked_mul(n) != Some(out.len()) {
            return Err(format!(
                "linear {n}×{k}: input of {} and output of {} values for {m} rows",
                x.len(),
                out.len()
            )
            .into());
        }
        if m == 0 || n == 0 {
            return Ok(());
        }
        // Several tasks per thread so a thread slowed by a neighbour does not hold up the rest.
        let threads = self.pool.current_num_threads();
        let chunk = n.div_ceil(threads * 4).next_multiple_of(ROW_BLOCK).min(n);
        // Each task's columns: on the pool, or with one thread on the calling thread itself
        // (whichever it is: a one-thread pool may be another thread's, which would never run
        // work handed to it). Every column is computed the same way either way.
        let run = |buf: &mut [f32], rows: usize| {
            let width = chunk * rows;
            if threads == 1 {
                for (c, o) in buf.chunks_mut(width).enumerate() {
                    self.block(x, rows, c * chunk, o);
                }
            } else {
                use rayon::prelude::*;
                self.pool.install(|| {
                    buf.par_chunks_mut(width)
                        .enumerate()
                        .for_each(|(c, o)| self.block(x, rows, c * chunk, o));
                });
            }
        };
        if m == 1 {
            run(out, 1);
        } else {
            let mut out_t = vec![0.0f32; m * n];
            run(&mut out_t, m);
            for (j, col) in out_t.chunks_exact(m).enumerate() {
                for (i, &v) in col.iter().enumerate() {
                    out[i * n + j] = v;
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(t: usize) -> Arc<rayon::ThreadPool> {
        Arc::new(
            rayon::ThreadPoolBuilder::new()
                .num_threads(t)
                .build()
                .unwrap(),
        )
    }

    #[test]
    fn matches_naive_and_is_batch_and_thread_invariant() {
        let mut rng = fastrand::Rng::with_seed(3);
        let (n, k, m) = (37, 70, 5);
        let w: Vec<f32> = (0..n * k).map(|_| rng.f32() - 0.5).collect();
        let x: Vec<f32> = (0..m * k).map(|_| rng.f32() - 0.5).collect();
        let one = F32Linear::new(w.clone(), n, k, pool(1)).unwrap();
        let two = F32Linear::new(w.clone(), n, k, pool(2)).unwrap();
        let mut batch = vec![0.0; m * n];
        one.forward(&x, m, &mut batch).unwrap();
        for i in 0..m {
            for j in 0..n {
                let exact: f64 = (0..k)
                    .map(|c| f64::from(x[i * k + c]) * f64::from(w[j * k + c]))
                    .sum();
                assert!((f64::from(batch[i * n + j]) - exact).abs() < 1e-5);
            }
        }
        let mut b2 = vec![0.0; m * n];
        two.forward(&x, m, &mut b2).unwrap();
        assert_eq!(batch, b2, "thread count changes results");
        for i in 0..m {
            let mut row = vec![0.0; n];
            two.forward(&x[i * k..(i + 1) * k], 1, &mut row).unwrap();
            assert_eq!(row, batch[i * n..(i + 1) * n], "row {i} alone differs");
        }
        assert!(one.forward(&x, m + 1, &mut batch).is_err());
    }
}
