//! The mixture-of-experts feed-forward (qwen3moe, olmoe, granitemoe): route each row, run each
//! chosen expert once over all the rows that chose it, and sum each row's weighted expert
//! outputs; add the shared expert's output, when the layer has one.
//!
//! Routing runs on the host in f32: the router is tiny (`n_expert × n_embd`), and its choice is
//! discrete, so the exact logits keep the NPU path's expert choices those of the f32 reference
//! (a quantised router could flip a near tie and run another expert). Per row: the router's
//! logits (the canonical-order dot product of [`super::kernels`]), a softmax (as ggml's: max,
//! `exp(x - max)`, f64 sum), the `k` most probable experts in descending probability, ties to
//! the lower index (llama.cpp's `argsort_top_k` leaves ties to `std::sort`), each weighted by
//! its probability, divided by the chosen ones' f64 sum (clamped to `6.103515625e-5`, as
//! llama.cpp) when the family renormalises.
//!
//! Grouping: the rows are grouped by expert, and each expert runs its two linears (gate and up
//! fused, then down) once on its rows. Each row's output is then `Σ_rank w_rank · y_rank`,
//! summed in rank order (as llama.cpp adds its expert views), never in the order experts were
//! visited: with linears that are row-invariant (the seam's contract), a row's result is
//! bit-identical whatever rows share its pass. Decode (one row) runs only its `k` experts.
//!
//! The shared expert (granitemoe's `ffn_{gate,up,down}_shexp`) runs on all the rows at once
//! and its output is added, unweighted, to each row's sum (llama.cpp's `moe_out + ffn_shexp`).

use std::time::{Duration, Instant};

use super::config::{Activation, Config, Moe};
use super::error::ModelError;
use super::kernels;
use super::load::{Expert, Experts};
use super::ops::{geglu, split_columns, swiglu};

/// The experts each row runs, `k` per row in rank order, with their weights.
pub(super) fn route(moe: &Moe, router: &[f32], h: &[f32], n_embd: usize) -> Vec<(usize, f32)> {
    let kern = kernels::selected();
    let k = moe.n_expert_used;
    let mut chosen = Vec::with_capacity(h.len() / n_embd * k);
    let mut probs = vec![0.0f32; moe.n_expert];
    let mut order: Vec<usize> = Vec::with_capacity(moe.n_expert);
    for row in h.chunks_exact(n_embd) {
        for (p, w) in probs.iter_mut().zip(router.chunks_exact(n_embd)) {
            *p = kern.dot(row, w);
        }
        kern.softmax_scaled(&mut probs, 1.0);
        order.clear();
        order.extend(0..moe.n_expert);
        // Stable: equal probabilities keep the lower index first.
        order.sort_by(|&a, &b| probs[b].total_cmp(&probs[a]));
        let top = &order[..k];
        let norm = if moe.renormalise {
            let sum: f64 = top.iter().map(|&x| f64::from(probs[x])).sum();
            (sum as f32).max(6.103_515_6e-5)
        } else {
            1.0
        };
        chosen.extend(top.iter().map(|&x| {
            let w = probs[x];
            (x, if moe.renormalise { w / norm } else { w })
        }));
    }
    chosen
}

/// The mixture's output for the `m` rows of `h` (normalised, `n_embd` each) into `out`; the
/// time in the linears is added to `t_matmul`.
pub(super) fn forward(
    c: &Config,
    layer: &Experts,
    h: &[f32],
    m: usize,
    out: &mut [f32],
    t_matmul: &mut Duration,
) -> Result<(), ModelError> {
    let moe = &layer.moe;
    let (e, k, ff) = (c.n_embd, moe.n_expert_used, moe.n_ff_exp);
    let chosen = route(moe, &layer.router, h, e);
    // Each (row, rank)'s weighted expert output.
    let mut ys = vec![0.0f32; m * k * e];
    let mut rows: Vec<usize> = Vec::with_capacity(m * k);
    for (x, expert) in layer.experts.iter().enumerate() {
        // The (row, rank) slots that chose expert x, in row order.
        rows.clear();
        rows.extend((0..m * k).filter(|&s| chosen[s].0 == x));
        let n = rows.len();
        if n == 0 {
            continue;
        }
        let mut xin = Vec::with_capacity(n * e);
        for &s in &rows {
            let r = s / k;
            xin.extend_from_slice(&h[r * e..(r + 1) * e]);
        }
        let mut y = vec![0.0f32; n * e];
        run_expert(c, expert, ff, &xin, n, &mut y, t_matmul)?;
        for (&s, yr) in rows.iter().zip(y.chunks_exact(e)) {
            let w = chosen[s].1;
            for (o, &v) in ys[s * e..(s + 1) * e].iter_mut().zip(yr) {
                *o = v * w;
            }
        }
    }
    // Σ over ranks, in rank order, per row.
    for (o, slots) in out.chunks_exact_mut(e).zip(ys.chunks_exact(k * e)) {
        o.copy_from_slice(&slots[..e]);
        for y in slots[e..].chunks_exact(e) {
            for (a, &b) in o.iter_mut().zip(y) {
                *a += b;
            }
        }
    }
    if let (Some(expert), Some(fs)) = (&layer.shared, moe.n_ff_shared) {
        let mut y = vec![0.0f32; m * e];
        run_expert(c, expert, fs, h, m, &mut y, t_matmul)?;
        for (a, &b) in out.iter_mut().zip(&y) {
            *a += b;
        }
    }
    Ok(())
}

/// One gated feed-forward of hidden width `ff` (an expert's) on the `n` rows of `x` into `y`;
/// the time in its linears is added to `t_matmul`.
fn run_expert(
    c: &Config,
    expert: &Expert,
    ff: usize,
    x: &[f32],
    n: usize,
    y: &mut [f32],
    t_matmul: &mut Duration,
) -> Result<(), ModelError> {
    let mut gate_up = vec![0.0f32; n * 2 * ff];
    let (mut gate, mut up) = (vec![0.0f32; n * ff], vec![0.0f32; n * ff]);
    let t = Instant::now();
    let p = &expert.gate_up;
    p.op.forward(x, n, &mut gate_up)
        .map_err(|err| p.failed(err))?;
    *t_matmul += t.elapsed();
    let [gate, up] = split_columns(&mut gate_up, n, [&mut gate, &mut up]);
    match c.family.activation {
        Activation::Silu => swiglu(ff, gate, up),
        Activation::GeluTanh => geglu(ff, gate, up),
    }
    let t = Instant::now();
    let p = &expert.down;
    p.op.forward(gate, n, y).map_err(|err| p.failed(err))?;
    *t_matmul += t.elapsed();
    Ok(())
}
