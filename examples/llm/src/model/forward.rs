//! The forward pass: token ids at positions of one sequence to logits, read in one sitting.
//!
//! A token's path: embedding row (× √n_embd for gemma, × a scale for granite) → per layer {
//! RMSNorm → Q, K, V projections (+ biases for qwen2) → per-head Q/K RMSNorms (qwen3, gemma3)
//! → RoPE on Q and K (the local layers' own base on a sliding-window model; none on smollm3's
//! NoPE layers) → append K, V to the sequence's cache → causal grouped-query attention (over
//! the last `window` positions on a local layer) → output projection → RMSNorm (gemma3's
//! post-norm) → × granite's residual scale → residual; RMSNorm → gated feed-forward (SiLU or
//! GELU) → RMSNorm (post-norm) → × residual scale → residual } → final RMSNorm → output
//! projection (tied to the embedding when the file has no `output.weight`) → ÷ granite's logit
//! scale → soft-cap if set.
//! On a short-convolution layer (LFM2) the attention's place is taken by: in_proj → B, C, x →
//! append `B ⊙ x` to the sequence's cache → per channel, the causal convolution of the last
//! `l_cache` rows of `B ⊙ x` → `C ⊙` that → out_proj (the matmuls through the seam, the rest
//! on the host).
//! Which of these a model has is its [`Family`](super::family::Family)'s data. Every weight
//! matmul goes through the seam ([`LinearOp`]).
//!
//! Batch invariance: the logits of a position are bit-identical whether it is computed alone
//! or inside a batch of any size, with any thread count. Every float reduction (matmul dot
//! products, attention scores, softmax sums, norms) runs in an order fixed by the vector
//! lengths alone (see [`super::kernels`]); rows are never mixed.

use std::sync::Arc;
use std::time::{Duration, Instant};

#[cfg(doc)]
use super::backend::LinearOp;
use super::config::{Activation, long_rope_at};
use super::delta_net::DeltaState;
use super::error::ModelError;
use super::exp::exp;
use super::kv_cache::{CacheType, KvCache};
use super::load::{Ffn, Model};
use super::ops::{
    ATTENTION_PARALLEL_WORK, RopeTable, add_bias, add_into, attention, geglu, rms_norm,
    rms_norm_in_place, scale, softcap, split_columns, swiglu,
};

/// A short-convolution layer's output for the rows of positions `pos..`: `C ⊙ conv`, where
/// `conv` convolves the held `B ⊙ x` rows (`held`, `width` values per position from position
/// `start` on; positions before 0 count as 0) per channel with `kernel` (`taps` per channel,
/// the last on the current position), summed tap by tap from the oldest position (as ggml's
/// `ssm_conv`). `bcx` holds the rows' `[B | C | x]`, `y` receives them.
fn short_conv(
    kernel: &[f32],
    held: &[f32],
    start: usize,
    pos: usize,
    width: usize,
    bcx: &[f32],
    y: &mut [f32],
) {
    let taps = kernel.len() / width;
    for (i, (row, out)) in bcx
        .chunks_exact(3 * width)
        .zip(y.chunks_exact_mut(width))
        .enumerate()
    {
        let gate = &row[width..2 * width];
        for (ch, (o, &g)) in out.iter_mut().zip(gate).enumerate() {
            let w = &kernel[ch * taps..(ch + 1) * taps];
            let mut sum = 0.0f32;
            for (k, &w) in w.iter().enumerate() {
                // Tap k reads position pos + i + 1 + k - taps.
                let v = match (pos + i + 1 + k).checked_sub(taps) {
                    Some(p) => held[(p - start) * width + ch],
                    None => 0.0,
                };
                sum += v * w;
            }
            *o = g * sum;
        }
    }
}

/// Which rows of logits [`Model::forward`] computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Logits {
    /// None: only fill the KV cache.
    None,
    /// The last token's.
    Last,
    /// Every token's (perplexity, fixtures).
    All,
}

/// Time spent per phase, summed over forward calls.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Stats {
    /// Forward calls.
    pub forward_calls: u64,
    /// Tokens processed.
    pub tokens: u64,
    /// In [`LinearOp::forward`].
    pub matmul: Duration,
    /// In attention (scores, softmax, weighted values).
    pub attention: Duration,
    /// Everything else (norms, RoPE, embedding, SwiGLU, residuals).
    pub other: Duration,
}

/// The state of one sequence: its KV cache, its last logits and its timings. Made by
/// [`Model::sequence`]; any number of them may run over one model.
#[derive(Debug)]
pub struct Sequence {
    cache: KvCache,
    /// Positions it may hold.
    n_ctx: usize,
    /// The model's [`LongRope::original_ctx`](super::LongRope::original_ctx), if it has one.
    long_rope_original_ctx: Option<usize>,
    logits: Vec<f32>,
    stats: Stats,
}

impl Sequence {
    /// Positions the sequence may hold (its context size).
    pub fn n_ctx(&self) -> usize {
        self.n_ctx
    }

    /// Positions held in the cache.
    pub fn len(&self) -> usize {
        self.cache.len()
    }

    /// Whether the cache holds no position.
    pub fn is_empty(&self) -> bool {
        self.cache.is_empty()
    }

    /// The KV cache.
    pub fn cache(&self) -> &KvCache {
        &self.cache
    }

    /// The logits of the last [`Model::forward`], `n_vocab` per row.
    pub fn logits(&self) -> &[f32] {
        &self.logits
    }

    /// Accumulated timings.
    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    /// Holds at most `n_ctx` positions from now on (never more than the model's context
    /// size, [`Model::n_ctx`]); cached positions past it are dropped.
    ///
    /// On a LongRoPE model ([`Config::long_rope`]) the context size picks the RoPE factors
    /// ([`LongRope::uses_long`]); a limit that switches them forgets every cached position
    /// (their keys were rotated with the other factors).
    ///
    /// [`Config::long_rope`]: super::Config::long_rope
    /// [`LongRope::uses_long`]: super::LongRope::uses_long
    pub fn limit_context(&mut self, n_ctx: usize) {
        let old = self.n_ctx;
        self.n_ctx = self.n_ctx.min(n_ctx);
        if self
            .long_rope_original_ctx
            .is_some_and(|o| long_rope_at(o, old) != long_rope_at(o, self.n_ctx))
        {
            self.cache.truncate(0);
        }
        if self.cache.len() > self.n_ctx {
            self.cache.truncate(self.n_ctx);
        }
    }

    /// Whether it rotates with a LongRoPE model's long factors (false without LongRoPE).
    fn uses_long_rope(&self) -> bool {
        self.long_rope_original_ctx
            .is_some_and(|o| long_rope_at(o, self.n_ctx))
    }

    /// Forgets every cached position.
    pub fn reset(&mut self) {
        self.cache.truncate(0);
    }

    /// Becomes a copy of `from`'s first `len` cached positions (a sequence of the same model
    /// and cache type): the keys and values evaluating those tokens here would write, bit for
    /// bit, for the cost of a copy. False, and nothing changed, when `from` does not hold
    /// them (fewer positions; a sliding-window layer that dropped keys a query at `len` sees,
    /// or a short-convolution layer the rows it reads; a delta-net layer's state that cannot be
    /// recovered there exactly; keys rotated with the other LongRoPE factors)
    /// or stores another type, or `len` is past this sequence's context.
    pub fn copy_prefix(&mut self, from: &Sequence, len: usize) -> bool {
        len <= self.n_ctx
            && self.uses_long_rope() == from.uses_long_rope()
            && self.cache.copy_prefix(&from.cache, len)
    }

    /// Keeps the first `len` cached positions (no change if it holds fewer). On a model with
    /// sliding-window or short-convolution layers, a cut further back than they keep (more than
    /// [`REWIND`](super::REWIND) positions before the last pass) keeps none; on a model with
    /// delta-net layers (Qwen3.5), a cut to a position their state cannot be recovered at
    /// exactly (before the last pass's last [`REPLAY_ROWS`](super::REPLAY_ROWS) rows, and not
    /// a checkpoint) keeps the latest checkpoint before it, or none: read [`Sequence::len`]
    /// after it.
    pub fn truncate(&mut self, len: usize) {
        self.cache.truncate(len);
    }
}

/// One sequence's share of a batched forward pass ([`Model::forward_batch`]): `tokens` at
/// positions `pos..pos + tokens.len()` of `seq`, and which of their logits to compute.
#[derive(Debug)]
pub struct BatchItem<'a> {
    /// The sequence (its cache and where its logits land).
    pub seq: &'a mut Sequence,
    /// The tokens to run.
    pub tokens: &'a [u32],
    /// The position of the first (at most the cached positions; a smaller one drops the
    /// cached positions from there on).
    pub pos: usize,
    /// Which rows' logits.
    pub logits: Logits,
}

impl Model {
    /// An empty sequence whose cache stores keys and values as `ty`, of the model's context
    /// size ([`Model::n_ctx`]).
    pub fn sequence(&self, ty: CacheType) -> Sequence {
        let c = &self.config;
        // A short-convolution layer keeps its `B ⊙ x` rows like a local layer its keys, with
        // a window of its kernel's length.
        let windows = (0..c.n_layer).map(|l| c.window(l).or(c.conv(l))).collect();
        let conv: Vec<_> = (0..c.n_layer)
            .map(|l| c.conv(l).map(|_| c.n_embd))
            .collect();
        // A delta-net layer keeps its recurrent state (and what it takes to step back).
        let delta = self
            .layers
            .iter()
            .map(|l| {
                l.delta
                    .as_ref()
                    .map(|d| DeltaState::new(Arc::clone(&d.params)))
            })
            .collect();
        Sequence {
            cache: KvCache::with_conv(windows, &conv, c.n_head_kv, c.head_dim, ty)
                .with_delta(delta),
            n_ctx: self.n_ctx,
            long_rope_original_ctx: c.long_rope.as_ref().map(|l| l.original_ctx),
            logits: Vec::new(),
            stats: Stats::default(),
        }
    }

    /// Runs `tokens` at positions `pos..pos + tokens.len()` of `seq` and returns the requested
    /// logits, `n_vocab` per row (the last row's, every row's, or none).
    ///
    /// `pos` may be at most the number of cached positions; a smaller `pos` first drops the
    /// cached positions from `pos` on (to re-run a different continuation).
    ///
    /// The pass runs on the model's pool. Called from a thread of that pool (a pool from
    /// [`host_pool`](super::host_pool::host_pool) on the calling thread) it runs on this thread
    /// directly; from elsewhere it is handed to a pool thread, which costs a wake-up per pass.
    pub fn forward<'s>(
        &self,
        seq: &'s mut Sequence,
        tokens: &[u32],
        pos: usize,
        which: Logits,
    ) -> Result<&'s [f32], ModelError> {
        self.forward_batch(&mut [BatchItem {
            seq: &mut *seq,
            tokens,
            pos,
            logits: which,
        }])?;
        Ok(&seq.logits)
    }

    /// Runs several sequences in one forward pass: every item's tokens are rows of the same
    /// matmuls (one read of the weights for all of them), while each item's attention runs over
    /// its own sequence's cache at its own positions. Each item's logits land in its sequence
    /// ([`Sequence::logits`]).
    ///
    /// The pass is row-wise batch-invariant: an item's logits are bit-identical to what
    /// [`Model::forward`] computes for it alone. Every item is checked (as `forward` checks
    /// its input) before anything runs; an error names the first item refused, and no cache
    /// has changed then. A backend failure during the pass leaves the items' caches undefined:
    /// truncate or reset them.
    pub fn forward_batch(&self, items: &mut [BatchItem<'_>]) -> Result<(), ModelError> {
        self.forward_rows(items, None)
    }

    /// [`Model::forward_batch`], or, with `hidden`, the final hidden states (after the final
    /// norm, before the output projection) of the rows each item's [`Logits`] selects, in
    /// item order, `n_embd` per row, instead of logits: the output projection is skipped and
    /// no sequence's logits are written.
    pub(super) fn forward_rows(
        &self,
        items: &mut [BatchItem<'_>],
        mut hidden: Option<&mut Vec<f32>>,
    ) -> Result<(), ModelError> {
        if self.pool.current_num_threads() > 1 && self.pool.current_thread_index().is_none() {
            // The whole pass on a pool thread: its parallel loops then split work among the
            // pool's threads directly instead of each waking the pool from outside. With one
            // host thread the calling thread does all the host work itself, whichever thread
            // it is: a one-thread pool may be another thread's (`host_pool`), and work handed
            // to it would wait for that thread.
            return self.pool.install(|| self.forward_rows(items, hidden));
        }
        if let Some(h) = hidden.as_deref_mut() {
            h.clear();
        }
        let c = &self.config;
        for it in items.iter() {
            self.check(it)?;
        }
        for it in items.iter_mut() {
            it.seq.cache.truncate(it.pos);
            it.seq.logits.clear();
        }
        let m: usize = items.iter().map(|it| it.tokens.len()).sum();
        if m == 0 {
            return Ok(());
        }
        // Row ranges of the items in the stacked activations.
        let mut rows = Vec::with_capacity(items.len());
        let mut r0 = 0;
        for it in items.iter() {
            rows.push(r0..r0 + it.tokens.len());
            r0 += it.tokens.len();
        }
        let t_start = Instant::now();
        let mut t_matmul = Duration::ZERO;
        let mut t_attn = Duration::ZERO;
        let (e, qd, kvd) = (c.n_embd, c.q_dim(), c.kv_dim());

        let mut x = vec![0.0f32; m * e];
        let all_tokens = items.iter().flat_map(|it| it.tokens.iter());
        for (row, &t) in x.chunks_exact_mut(e).zip(all_tokens) {
            let s = t as usize * self.embd_row_bytes;
            crate::gguf::dequantize(self.embd_ty, &self.embd[s..s + self.embd_row_bytes], row)?;
            if let Some(f) = c.embd_scale {
                scale(row, f);
            }
        }
        // The rows are read: the file's pages they mapped are not held between passes.
        self.embd.release();
        let fam = c.family;
        let ropes: Vec<_> = items
            .iter()
            .map(|it| {
                let n = it.tokens.len();
                let freqs = match &c.long_rope {
                    Some(lr) => Some(lr.factors(it.seq.n_ctx)),
                    None => self.rope_freqs.as_deref(),
                };
                let global = RopeTable::new(c, (c.rope_base, c.rope_freq_scale), freqs, it.pos, n);
                let local = c
                    .sliding_window
                    .as_ref()
                    .map(|s| RopeTable::new(c, (s.rope_base, s.rope_freq_scale), freqs, it.pos, n));
                (global, local)
            })
            .collect();
        // Where the family scales the queries, the softmax's scale is 1 (exact).
        let score_scale = if fam.scale_queries { 1.0 } else { c.attn_scale };
        let mut h = vec![0.0f32; m * e];
        // Qwen3.5's attn_q gives queries and gate values, per head.
        let qw = if c.gated_attention { 2 * qd } else { qd };
        let mut qkv = vec![0.0f32; m * (qw + 2 * kvd)];
        let mut qg = vec![0.0f32; if c.gated_attention { m * qw } else { 0 }];
        let mut attn_gate = vec![0.0f32; if c.gated_attention { m * qd } else { 0 }];
        let mut q = vec![0.0f32; m * qd];
        let mut k = vec![0.0f32; m * kvd];
        let mut v = vec![0.0f32; m * kvd];
        let mut att = vec![0.0f32; m * qd];
        // A short-convolution layer's in_proj output (B, C, x), B ⊙ x and C ⊙ conv.
        let conv_rows = if c.short_conv.is_some() { m } else { 0 };
        let mut bcx = vec![0.0f32; conv_rows * 3 * e];
        let mut bx = vec![0.0f32; conv_rows * e];
        let mut y = vec![0.0f32; conv_rows * e];
        // A delta-net layer's projection ([qkv_mixed | beta | alpha | z]) and output.
        let (dw, dv) = match &c.delta_net {
            Some(d) => (
                d.conv_dim() + 2 * d.n_v_heads + d.value_dim(),
                d.value_dim(),
            ),
            None => (0, 0),
        };
        let mut dproj = vec![0.0f32; m * dw];
        let mut dout = vec![0.0f32; m * dv];
        let mut gate_up = vec![0.0f32; m * 2 * c.n_ff];
        let mut gate = vec![0.0f32; m * c.n_ff];
        let mut up = vec![0.0f32; m * c.n_ff];

        for (l, layer) in self.layers.iter().enumerate() {
            // Attention block (or short-convolution block).
            rms_norm(&x, &layer.attn_norm, c.rms_eps, &mut h);
            let mixed: &[f32] = if let Some(dl) = &layer.delta {
                let t = Instant::now();
                let p = &layer.wqkv;
                p.op.forward(&h, m, &mut dproj).map_err(|e| p.failed(e))?;
                t_matmul += t.elapsed();
                let t = Instant::now();
                let iw = dl.params.input_width();
                let mut inputs = Vec::new();
                for (it, r) in items.iter_mut().zip(&rows) {
                    // The recurrence's inputs of the item's rows, side by side.
                    inputs.clear();
                    for row in dproj[r.start * dw..r.end * dw].chunks_exact(dw) {
                        inputs.extend_from_slice(&row[..iw]);
                    }
                    let state =
                        it.seq
                            .cache
                            .delta_mut(l)
                            .ok_or_else(|| ModelError::Unsupported {
                                what: "a delta-net layer in a sequence of another model".into(),
                            })?;
                    state.pass(&inputs, &mut dout[r.start * dv..r.end * dv]);
                }
                // Per value head: RMSNorm with ssm_norm, times silu(z).
                for (row, out) in dproj.chunks_exact(dw).zip(dout.chunks_exact_mut(dv)) {
                    rms_norm_in_place(out, &dl.norm, c.rms_eps);
                    for (o, &z) in out.iter_mut().zip(&row[iw..]) {
                        *o *= z / (1.0 + exp(-z));
                    }
                }
                t_attn += t.elapsed();
                &dout
            } else if let Some(kernel) = &layer.conv {
                let t = Instant::now();
                let p = &layer.wqkv;
                p.op.forward(&h, m, &mut bcx).map_err(|e| p.failed(e))?;
                t_matmul += t.elapsed();
                for (it, r) in items.iter_mut().zip(&rows) {
                    let (bcx, bx) = (
                        &bcx[r.start * 3 * e..r.end * 3 * e],
                        &mut bx[r.start * e..r.end * e],
                    );
                    for (row, out) in bcx.chunks_exact(3 * e).zip(bx.chunks_exact_mut(e)) {
                        let (b, x) = (&row[..e], &row[2 * e..]);
                        for ((o, &b), &x) in out.iter_mut().zip(b).zip(x) {
                            *o = b * x;
                        }
                    }
                    it.seq.cache.append(l, bx, &[]);
                    let (held, start) = it.seq.cache.conv_rows(l);
                    let y = &mut y[r.start * e..r.end * e];
                    short_conv(kernel, held, start, it.pos, e, bcx, y);
                }
                &y
            } else {
                let t = Instant::now();
                let p = &layer.wqkv;
                p.op.forward(&h, m, &mut qkv).map_err(|e| p.failed(e))?;
                t_matmul += t.elapsed();
                // One row (decode) holds q, k and v side by side: use them in place.
                let [q, k, v] = if c.gated_attention {
                    let [qg, k, v] = split_columns(&mut qkv, m, [&mut qg, &mut k, &mut v]);
                    // Per head: head_dim queries, then head_dim gate values.
                    let hd = c.head_dim;
                    for ((pair, q), g) in qg
                        .chunks_exact(2 * hd)
                        .zip(q.chunks_exact_mut(hd))
                        .zip(attn_gate.chunks_exact_mut(hd))
                    {
                        q.copy_from_slice(&pair[..hd]);
                        g.copy_from_slice(&pair[hd..]);
                    }
                    [&mut q[..], k, v]
                } else {
                    split_columns(&mut qkv, m, [&mut q, &mut k, &mut v])
                };
                add_bias(q, layer.bq.as_deref());
                add_bias(k, layer.bk.as_deref());
                add_bias(v, layer.bv.as_deref());
                if let (Some(qn), Some(kn)) = (&layer.q_norm, &layer.k_norm) {
                    rms_norm_in_place(q, qn, c.rms_eps);
                    rms_norm_in_place(k, kn, c.rms_eps);
                }
                let window = c.window(l);
                let t = Instant::now();
                for ((it, r), (global, local)) in items.iter_mut().zip(&rows).zip(&ropes) {
                    let (q, k, v) = (
                        &mut q[r.start * qd..r.end * qd],
                        &mut k[r.start * kvd..r.end * kvd],
                        &v[r.start * kvd..r.end * kvd],
                    );
                    let rope = match (window, local) {
                        (Some(_), Some(local)) => local,
                        _ => global,
                    };
                    if c.rotates(l) {
                        rope.apply(q, c.n_head);
                        rope.apply(k, c.n_head_kv);
                    }
                    if fam.scale_queries {
                        scale(q, c.attn_scale);
                    }
                    it.seq.cache.append(l, k, v);
                    let (pos, n) = (it.pos, it.tokens.len());
                    let seen = window.map_or(pos + n, |w| w.min(pos + n));
                    let work = n * c.n_head * seen * c.head_dim;
                    let kv = it.seq.cache.layer(l);
                    let parallel =
                        work >= ATTENTION_PARALLEL_WORK && self.pool.current_num_threads() > 1;
                    let pool = parallel.then_some(&*self.pool);
                    let out = &mut att[r.start * qd..r.end * qd];
                    attention(c, pool, q, &kv, window, score_scale, pos, out);
                }
                if c.gated_attention {
                    for (o, &g) in att.iter_mut().zip(&attn_gate) {
                        *o *= 1.0 / (1.0 + exp(-g));
                    }
                }
                t_attn += t.elapsed();
                &att
            };
            let t = Instant::now();
            let p = &layer.wo;
            p.op.forward(mixed, m, &mut h).map_err(|e| p.failed(e))?;
            t_matmul += t.elapsed();
            add_bias(&mut h, layer.bo.as_deref());
            if let Some(w) = &layer.attn_post_norm {
                rms_norm_in_place(&mut h, w, c.rms_eps);
            }
            if let Some(s) = c.residual_scale {
                scale(&mut h, s);
            }
            add_into(&mut x, &h);

            // Feed-forward block.
            rms_norm(&x, &layer.ffn_norm, c.rms_eps, &mut h);
            match &layer.ffn {
                Ffn::Moe(experts) => {
                    let mut y = vec![0.0f32; m * e];
                    super::moe::forward(c, experts, &h, m, &mut y, &mut t_matmul)?;
                    h = y;
                }
                Ffn::Dense(ffn) => {
                    let t = Instant::now();
                    let p = &ffn.gate_up;
                    p.op.forward(&h, m, &mut gate_up).map_err(|e| p.failed(e))?;
                    t_matmul += t.elapsed();
                    let [gate, up] = split_columns(&mut gate_up, m, [&mut gate, &mut up]);
                    add_bias(gate, layer.b_gate.as_deref());
                    add_bias(up, layer.b_up.as_deref());
                    match fam.activation {
                        Activation::Silu => swiglu(c.n_ff, gate, up),
                        Activation::GeluTanh => geglu(c.n_ff, gate, up),
                    }
                    let t = Instant::now();
                    let p = &ffn.down;
                    p.op.forward(gate, m, &mut h).map_err(|e| p.failed(e))?;
                    t_matmul += t.elapsed();
                    add_bias(&mut h, layer.b_down.as_deref());
                }
            }
            if let Some(w) = &layer.ffn_post_norm {
                rms_norm_in_place(&mut h, w, c.rms_eps);
            }
            if let Some(s) = c.residual_scale {
                scale(&mut h, s);
            }
            add_into(&mut x, &h);
        }
        for it in items.iter_mut() {
            let (pos, n) = (it.pos, it.tokens.len());
            it.seq.cache.set_len(pos, pos + n);
        }

        // The rows whose logits are asked for, in item order.
        let wanted: Vec<std::ops::Range<usize>> = items
            .iter()
            .zip(&rows)
            .map(|(it, r)| match it.logits {
                Logits::None => r.start..r.start,
                Logits::Last if r.is_empty() => r.start..r.start,
                Logits::Last => r.end - 1..r.end,
                Logits::All => r.clone(),
            })
            .collect();
        let n: usize = wanted.iter().map(|r| r.len()).sum();
        if n > 0 {
            let mut sel = Vec::with_capacity(n * e);
            for r in &wanted {
                sel.extend_from_slice(&x[r.start * e..r.end * e]);
            }
            let mut normed = vec![0.0f32; n * e];
            rms_norm(&sel, &self.output_norm, c.rms_eps, &mut normed);
            if let Some(h) = hidden {
                *h = normed;
            } else {
                let mut logits = vec![0.0f32; n * c.n_vocab];
                let t = Instant::now();
                let p = &self.output;
                p.op.forward(&normed, n, &mut logits)
                    .map_err(|e| p.failed(e))?;
                t_matmul += t.elapsed();
                if let Some(s) = c.logit_scale {
                    scale(&mut logits, 1.0 / s);
                }
                if let Some(cap) = c.final_logit_softcap {
                    softcap(&mut logits, cap);
                }
                let mut at = 0;
                for (it, r) in items.iter_mut().zip(&wanted) {
                    let len = r.len() * c.n_vocab;
                    it.seq.logits.extend_from_slice(&logits[at..at + len]);
                    at += len;
                }
            }
        }
        let total = t_start.elapsed();
        for it in items.iter_mut() {
            let s = &mut it.seq.stats;
            s.forward_calls += 1;
            s.tokens += it.tokens.len() as u64;
            s.matmul += t_matmul;
            s.attention += t_attn;
            s.other += total.saturating_sub(t_matmul + t_attn);
        }
        Ok(())
    }

    /// The checks of one item of a pass, before anything runs.
    fn check(&self, it: &BatchItem<'_>) -> Result<(), ModelError> {
        let (seq, pos, m) = (&*it.seq, it.pos, it.tokens.len());
        let n_vocab = self.config.n_vocab;
        if pos > seq.cache.len() {
            return Err(ModelError::BadPosition {
                pos,
                cached: seq.cache.len(),
            });
        }
        if pos.checked_add(m).is_none_or(|end| end > seq.n_ctx) {
            return Err(ModelError::ContextOverflow {
                pos,
                n_tokens: m,
                n_ctx: seq.n_ctx,
            });
        }
        if !seq.cache.can_rewind_to(pos) {
            return Err(ModelError::RewindPastWindow {
                pos,
                cached: seq.cache.len(),
            });
        }
        if let Some(&token) = it.tokens.iter().find(|&&t| t as usize >= n_vocab) {
            return Err(ModelError::BadToken { token, n_vocab });
        }
        Ok(())
    }
}
