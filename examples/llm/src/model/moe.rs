//! The mixture-of-experts feed-forward (qwen3moe, olmoe, granitemoe, lfm2moe): route each row,
//! run each chosen expert once over all the rows that chose it, and sum each row's weighted
//! expert outputs; add the shared expert's output, when the layer has one.
//!
//! Routing runs on the host in f32: the router is tiny (`n_expert × n_embd`), and its choice is
//! discrete, so the exact logits keep the NPU path's expert choices those of the f32 reference
//! (a quantised router could flip a near tie and run another expert). Per row, as llama.cpp's
//! `build_moe_ffn` (the family says which gating, whether a selection bias, whether to
//! renormalise):
//!
//! 1. the router's logits (the canonical-order dot product of [`super::kernels`]);
//! 2. probabilities: a softmax (as ggml's: max, `exp(x - max)`, f64 sum), or each logit's
//!    sigmoid `1 / (1 + e^-x)` (lfm2moe);
//! 3. the `k` experts of the highest selection scores, in descending order, ties to the lower
//!    index (llama.cpp's `argsort_top_k` leaves ties to `std::sort`); the score is the
//!    probability, plus the layer's selection bias (`exp_probs_b.bias`) when it has one;
//! 4. each chosen expert weighted by its probability, without the bias, divided by the chosen
//!    ones' f64 sum (clamped to `6.103515625e-5`, as llama.cpp) when the family renormalises.
//!
//! Grouping: the rows are grouped by expert, and each expert runs its two linears (gate and up
//! fused, then down) once on its rows: every touched expert's gate-up as one group of
//! forwards ([`forward_many`]: on the engine, one round of its cores, so experts placed on
//! different cores run at once), then every one's down. Each row's output is then `Σ_rank w_rank · y_rank`,
//! summed in rank order (as llama.cpp adds its expert views), never in the order experts were
//! visited: with linears that are row-invariant (the seam's contract), a row's result is
//! bit-identical whatever rows share its pass. Decode (one row) runs only its `k` experts.
//!
//! The shared expert (granitemoe's `ffn_{gate,up,down}_shexp`) runs on all the rows at once
//! and its output is added, unweighted, to each row's sum (llama.cpp's `moe_out + ffn_shexp`).

use std::time::{Duration, Instant};

use super::backend::{OpJob, forward_many};
use super::config::{Activation, Config, Gating, Moe};
use super::error::ModelError;
use super::kernels;
use super::load::{Expert, Experts, Projection};
use super::ops::{geglu, split_columns, swiglu};

/// The experts each row of `h` runs, `k` per row in rank order, with their weights: routed by
/// `router` (`n_expert` rows of `n_embd`), choosing by the probabilities plus `bias` when the
/// layer has a selection bias.
pub(super) fn route(
    moe: &Moe,
    router: &[f32],
    bias: Option<&[f32]>,
    h: &[f32],
    n_embd: usize,
) -> Vec<(usize, f32)> {
    let kern = kernels::selected();
    let k = moe.n_expert_used;
    let mut chosen = Vec::with_capacity(h.len() / n_embd * k);
    let mut probs = vec![0.0f32; moe.n_expert];
    let mut scores = vec![0.0f32; moe.n_expert];
    let mut order: Vec<usize> = Vec::with_capacity(moe.n_expert);
    for row in h.chunks_exact(n_embd) {
        for (p, w) in probs.iter_mut().zip(router.chunks_exact(n_embd)) {
            *p = kern.dot(row, w);
        }
        match moe.gating {
            Gating::Softmax => kern.softmax_scaled(&mut probs, 1.0),
            Gating::Sigmoid => {
                for p in probs.iter_mut() {
                    *p = 1.0 / (1.0 + super::exp::exp(-*p));
                }
            }
        }
        let score: &[f32] = match bias {
            Some(b) => {
                for ((s, &p), &b) in scores.iter_mut().zip(&probs).zip(b) {
                    *s = p + b;
                }
                &scores
            }
            None => &probs,
        };
        order.clear();
        order.extend(0..moe.n_expert);
        // Stable: equal scores keep the lower index first.
        order.sort_by(|&a, &b| score[b].total_cmp(&score[a]));
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
    let chosen = route(moe, &layer.router, layer.bias.as_deref(), h, e);
    // The touched experts, each with the (row, rank) slots that chose it, in row order.
    let mut slots: Vec<Vec<usize>> = vec![Vec::new(); layer.experts.len()];
    for (s, &(x, _)) in chosen.iter().enumerate() {
        slots[x].push(s);
    }
    let touched: Vec<(usize, Vec<usize>)> = slots
        .into_iter()
        .enumerate()
        .filter(|(_, rows)| !rows.is_empty())
        .collect();
    let xins: Vec<Vec<f32>> = touched
        .iter()
        .map(|(_, rows)| {
            let mut xin = Vec::with_capacity(rows.len() * e);
            for &s in rows {
                let r = s / k;
                xin.extend_from_slice(&h[r * e..(r + 1) * e]);
            }
            xin
        })
        .collect();
    // Every touched expert's gate-up, then every one's down, each as one group of forwards:
    // on the engine, experts on different cores run at once.
    let rows: Vec<usize> = touched.iter().map(|(_, r)| r.len()).collect();
    let projections = |pick: fn(&Expert) -> &Projection| -> Vec<&Projection> {
        touched
            .iter()
            .map(|&(x, _)| pick(&layer.experts[x]))
            .collect()
    };
    let mut gate_ups = run_group(&projections(|x| &x.gate_up), &xins, &rows, 2 * ff, t_matmul)?;
    let acts: Vec<Vec<f32>> = rows
        .iter()
        .zip(&mut gate_ups)
        .map(|(&n, gate_up)| activate(c, ff, n, gate_up))
        .collect();
    let ys = run_group(&projections(|x| &x.down), &acts, &rows, e, t_matmul)?;
    // Each (row, rank)'s weighted expert output.
    let mut weighted = vec![0.0f32; m * k * e];
    for ((_, rows), y) in touched.iter().zip(&ys) {
        for (&s, yr) in rows.iter().zip(y.chunks_exact(e)) {
            let w = chosen[s].1;
            for (o, &v) in weighted[s * e..(s + 1) * e].iter_mut().zip(yr) {
                *o = v * w;
            }
        }
    }
    // Σ over ranks, in rank order, per row.
    for (o, slots) in out.chunks_exact_mut(e).zip(weighted.chunks_exact(k * e)) {
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
    let t = Instant::now();
    let p = &expert.gate_up;
    p.op.forward(x, n, &mut gate_up)
        .map_err(|err| p.failed(err))?;
    *t_matmul += t.elapsed();
    let act = activate(c, ff, n, &mut gate_up);
    let t = Instant::now();
    let p = &expert.down;
    p.op.forward(&act, n, y).map_err(|err| p.failed(err))?;
    *t_matmul += t.elapsed();
    Ok(())
}

/// `projections[i]` on the `rows[i]` rows of `xs[i]`, each into its own `rows[i] × width`
/// output, as one group ([`forward_many`]); the time is added to `t_matmul`.
fn run_group(
    projections: &[&Projection],
    xs: &[Vec<f32>],
    rows: &[usize],
    width: usize,
    t_matmul: &mut Duration,
) -> Result<Vec<Vec<f32>>, ModelError> {
    let mut outs: Vec<Vec<f32>> = rows.iter().map(|&n| vec![0.0f32; n * width]).collect();
    let t = Instant::now();
    let mut jobs: Vec<OpJob<'_>> = outs
        .iter_mut()
        .zip(projections.iter().zip(xs).zip(rows))
        .map(|(out, ((p, x), &m))| OpJob {
            op: &*p.op,
            x,
            m,
            out,
        })
        .collect();
    let done = forward_many(&mut jobs);
    drop(jobs);
    *t_matmul += t.elapsed();
    // The group fails as one: the error names its first linear.
    done.map_err(|err| projections[0].failed(err))?;
    Ok(outs)
}

/// The gated activation of `n` rows of a fused gate-up output (`2 × ff` each: the gates,
/// then the ups): `n × ff` values, the down projection's input.
fn activate(c: &Config, ff: usize, n: usize, gate_up: &mut [f32]) -> Vec<f32> {
    let (mut gate, mut up) = (vec![0.0f32; n * ff], vec![0.0f32; n * ff]);
    let [gate, up] = split_columns(gate_up, n, [&mut gate, &mut up]);
    match c.family.activation {
        Activation::Silu => swiglu(ff, gate, up),
        Activation::GeluTanh => geglu(ff, gate, up),
    }
    gate.to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// lfm2moe's rule: sigmoid probabilities, the bias changes which experts are chosen, the
    /// weights are the chosen ones' unbiased probabilities over their sum.
    #[test]
    fn the_selection_bias_chooses_and_the_probabilities_weigh() {
        let moe = Moe {
            n_expert: 3,
            n_expert_used: 2,
            n_ff_exp: 1,
            renormalise: true,
            n_ff_shared: None,
            gating: Gating::Sigmoid,
            selection_bias: true,
            n_dense_lead: 0,
        };
        // One input of width 1: the router's logits are its rows, 2, 1 and 0.
        let (router, h) = ([2.0f32, 1.0, 0.0], [1.0f32]);
        let sig = |x: f64| 1.0 / (1.0 + (-x).exp());
        let unbiased = route(&moe, &router, None, &h, 1);
        assert_eq!(unbiased.iter().map(|c| c.0).collect::<Vec<_>>(), [0, 1]);
        let chosen = route(&moe, &router, Some(&[0.0, 0.0, 1.5]), &h, 1);
        let sum = sig(0.0) + sig(2.0);
        let want = [(2, sig(0.0) / sum), (0, sig(2.0) / sum)];
        assert_eq!(chosen.len(), 2);
        for ((x, w), (wx, ww)) in chosen.iter().zip(want) {
            assert_eq!(*x, wx);
            assert!((f64::from(*w) - ww).abs() < 1e-6, "{w} vs {ww}");
        }
    }
}
