//! Gated delta-net layers (Qwen3.5's linear attention): the host arithmetic and the
//! per-sequence recurrent state.
//!
//! One layer, for the rows of one sequence, as llama.cpp's `models/qwen35.cpp` and ggml's
//! `gated_delta_net` compute it. The one linear of the layer's input gives, per row,
//! `[qkv_mixed (conv_dim) | beta (n_v) | alpha (n_v) | z (value_dim)]`; then, on the host:
//!
//! 1. a causal depthwise convolution of `conv_kernel` taps over `qkv_mixed` (each channel's
//!    taps contiguous, the last on the current row, summed from the oldest; the rows before
//!    the sequence's first count as 0), then SiLU;
//! 2. split into q (`n_k` heads), k (`n_k` heads) and v (`n_v` heads) of `head_dim`; q and k
//!    L2-normalised per head as llama.cpp's `build_gdn_l2_norm`: an RMSNorm with epsilon
//!    `rms_eps / head_dim`, then `× 1/√head_dim`;
//! 3. `β = sigmoid(beta)`, `g = softplus(alpha + ssm_dt.bias) × ssm_a` (the log of the decay);
//! 4. per value head `h` (reading key head `h mod n_k`: ggml's repeat tiles the key heads),
//!    with its state `S` (`head_dim × head_dim`, one row per value dimension `j`):
//!    `S ← S·e^g`; `d_j = (v_j − S_j·k)·β`; `S_j ← S_j + d_j·k`; `o_j = (S_j·q) / √head_dim`;
//! 5. (in the forward pass) per value head, RMSNorm with `ssm_norm` times `silu(z)`, then
//!    `ssm_out`.
//!
//! # The state and its rewinds
//!
//! A layer's state at a position is the convolution's last `conv_kernel − 1` input rows and
//! the `n_v` matrices `S`. Unlike keys and values it is not a list of rows per position: it is
//! overwritten by every row, so stepping back needs a copy of an earlier state. Each layer
//! keeps ([`DeltaState`]):
//!
//! - the state at the sequence's length;
//! - a *base*: the state at `base_pos`, the start of the last pass's last [`REPLAY_ROWS`]
//!   rows, with those rows' recurrence inputs (`qkv_mixed`, beta and alpha: `conv_dim + 2·n_v`
//!   values each). The state at any position from `base_pos` on is the base with the rows up
//!   to it replayed through the same function ([`DeltaState::truncate`]): the same operations
//!   in the same order, so bit for bit the state the pass computed, without running the
//!   layer's linears again. A speculative verify pass (fewer rows than that) rewinds exactly;
//! - up to [`CHECKPOINTS`] checkpoints: the state at the end of each of the last passes of more
//!   than [`REPLAY_ROWS`] rows (prompt chunks).
//!
//! A cut to any other position is not exact: the cache then keeps the latest checkpoint
//! before it (or nothing), and the caller evaluates the rest again
//! (`KvCache::truncate`).

use std::sync::Arc;

use super::config::DeltaNet;
use super::exp::exp;
use super::kernels;

/// Rows of the last pass whose inputs a layer keeps for exact rewinds by replay (the last
/// ones of a longer pass).
pub const REPLAY_ROWS: usize = 64;

/// Checkpoints of the state a layer keeps (at the ends of the last prompt chunks).
pub const CHECKPOINTS: usize = 2;

/// A delta-net layer's host weights and shapes, shared by the model and its sequences' states
/// (a state replays rows with them).
#[derive(Debug)]
pub(crate) struct DeltaParams {
    pub(crate) shape: DeltaNet,
    /// `conv_kernel` taps per channel, channel after channel.
    pub(crate) conv: Vec<f32>,
    /// `ssm_dt.bias`, per value head.
    pub(crate) dt_bias: Vec<f32>,
    /// `ssm_a` (`−e^A_log`), per value head.
    pub(crate) a: Vec<f32>,
    /// The model's RMS epsilon (the L2 norms' is it divided by `head_dim`).
    pub(crate) eps: f32,
}

impl DeltaParams {
    /// Values per row of the recurrence's inputs: `qkv_mixed`, beta, alpha.
    pub(crate) fn input_width(&self) -> usize {
        self.shape.conv_dim() + 2 * self.shape.n_v_heads
    }

    /// Values of the convolution's held rows at the front of a state.
    fn conv_len(&self) -> usize {
        (self.shape.conv_kernel - 1) * self.shape.conv_dim()
    }

    /// Runs the rows `rows` (`input_width` values each) from the state `src` (or, when `None`,
    /// from `state` itself) into `state`, writing each row's output (`value_dim` values, before
    /// the gated norm) to `out` when given.
    fn run(
        &self,
        src: Option<&[f32]>,
        state: &mut [f32],
        rows: &[f32],
        mut out: Option<&mut [f32]>,
    ) {
        let d = &self.shape;
        let (hd, nk, nv) = (d.head_dim, d.n_k_heads, d.n_v_heads);
        let (cd, kd) = (d.conv_dim(), d.key_dim());
        let taps = d.conv_kernel;
        let held = self.conv_len();
        let kern = kernels::selected();
        let scale = 1.0 / (hd as f32).sqrt();
        let mut x = vec![0.0f32; cd];
        let mut delta = vec![0.0f32; hd];
        let mut src = src;
        for (r, row) in rows.chunks_exact(self.input_width()).enumerate() {
            let (mixed, beta, alpha) = (&row[..cd], &row[cd..cd + nv], &row[cd + nv..]);
            let from: &[f32] = match src {
                Some(s) => s,
                None => state,
            };
            // 1. The convolution over the held rows and this one, then SiLU.
            for (ch, o) in x.iter_mut().enumerate() {
                let w = &self.conv[ch * taps..(ch + 1) * taps];
                let mut sum = 0.0f32;
                for (k, &w) in w.iter().enumerate() {
                    let v = if k + 1 == taps {
                        mixed[ch]
                    } else {
                        from[k * cd + ch]
                    };
                    sum += v * w;
                }
                *o = sum / (1.0 + exp(-sum));
            }
            // 2. L2 norms of q and k per head.
            for head in x[..2 * kd].chunks_exact_mut(hd) {
                let sum: f64 = head.iter().map(|&v| f64::from(v * v)).sum();
                let mean = (sum / hd as f64) as f32;
                let s = 1.0 / (mean + self.eps / hd as f32).sqrt();
                for v in head.iter_mut() {
                    *v = (*v * s) * scale;
                }
            }
            let (q, rest) = x.split_at(kd);
            let (k, v) = rest.split_at(kd);
            // The held rows move on by one: this row is the newest.
            if held > 0 {
                if let Some(s) = src {
                    state[..held - cd].copy_from_slice(&s[cd..held]);
                } else {
                    state.copy_within(cd..held, 0);
                }
                state[held - cd..held].copy_from_slice(mixed);
            }
            // 3 and 4, per value head.
            for h in 0..nv {
                let b = 1.0 / (1.0 + (-beta[h]).exp());
                let z = alpha[h] + self.dt_bias[h];
                let softplus = if z > 20.0 { z } else { z.exp().ln_1p() };
                let decay = (softplus * self.a[h]).exp();
                let (kh, qh) = (
                    &k[(h % nk) * hd..(h % nk + 1) * hd],
                    &q[(h % nk) * hd..(h % nk + 1) * hd],
                );
                let vh = &v[h * hd..(h + 1) * hd];
                let at = held + h * hd * hd;
                let s = &mut state[at..at + hd * hd];
                match src {
                    Some(from) => {
                        for (o, &i) in s.iter_mut().zip(&from[at..at + hd * hd]) {
                            *o = i * decay;
                        }
                    }
                    None => s.iter_mut().for_each(|o| *o *= decay),
                }
                for (j, dj) in delta.iter_mut().enumerate() {
                    let sk = kern.dot(&s[j * hd..(j + 1) * hd], kh);
                    *dj = (vh[j] - sk) * b;
                }
                for (j, &dj) in delta.iter().enumerate() {
                    for (o, &kv) in s[j * hd..(j + 1) * hd].iter_mut().zip(kh) {
                        *o += kv * dj;
                    }
                }
                if let Some(out) = out.as_deref_mut() {
                    let o = &mut out[(r * nv + h) * hd..(r * nv + h + 1) * hd];
                    for (j, o) in o.iter_mut().enumerate() {
                        *o = kern.dot(&s[j * hd..(j + 1) * hd], qh) * scale;
                    }
                }
            }
            src = None;
        }
    }
}

/// One delta-net layer's state in a sequence (see the module documentation).
#[derive(Debug, Clone)]
pub(crate) struct DeltaState {
    params: Arc<DeltaParams>,
    /// The state at `len`.
    cur: Vec<f32>,
    /// The state at `base_pos`.
    base: Vec<f32>,
    base_pos: usize,
    /// The recurrence inputs of the rows `base_pos..len`.
    rows: Vec<f32>,
    len: usize,
    /// `(position, state)`, oldest first.
    checkpoints: Vec<(usize, Vec<f32>)>,
}

impl DeltaState {
    /// The state of an empty sequence.
    pub(crate) fn new(params: Arc<DeltaParams>) -> DeltaState {
        let n = params.shape.state_len();
        DeltaState {
            params,
            cur: vec![0.0; n],
            base: vec![0.0; n],
            base_pos: 0,
            rows: Vec::new(),
            len: 0,
            checkpoints: Vec::new(),
        }
    }

    /// Runs the rows `rows` (recurrence inputs, [`DeltaParams::input_width`] each) at
    /// positions `len..`, writing their outputs (`value_dim` each) to `out`.
    pub(crate) fn pass(&mut self, rows: &[f32], out: &mut [f32]) {
        let p = Arc::clone(&self.params);
        let w = p.input_width();
        let vd = p.shape.value_dim();
        let m = rows.len() / w;
        if m == 0 {
            return;
        }
        // The base: the state before the last REPLAY_ROWS rows of this pass.
        let s = m.saturating_sub(REPLAY_ROWS);
        if s == 0 {
            std::mem::swap(&mut self.base, &mut self.cur);
            p.run(Some(&self.base), &mut self.cur, rows, Some(out));
        } else {
            p.run(
                None,
                &mut self.cur,
                &rows[..s * w],
                Some(&mut out[..s * vd]),
            );
            self.base.copy_from_slice(&self.cur);
            p.run(
                None,
                &mut self.cur,
                &rows[s * w..],
                Some(&mut out[s * vd..]),
            );
        }
        self.base_pos = self.len + s;
        self.rows.clear();
        self.rows.extend_from_slice(&rows[s * w..]);
        self.len += m;
        if m > REPLAY_ROWS {
            if self.checkpoints.len() == CHECKPOINTS {
                self.checkpoints.remove(0);
            }
            self.checkpoints.push((self.len, self.cur.clone()));
        }
    }

    /// Whether the state at `pos` is exactly recoverable: 0, a position from the base on, or a
    /// checkpoint.
    pub(crate) fn can_rewind_to(&self, pos: usize) -> bool {
        pos == 0
            || (self.base_pos..=self.len).contains(&pos)
            || self.checkpoints.iter().any(|&(c, _)| c == pos)
    }

    /// The latest position at or before `pos` whose state is exactly recoverable.
    pub(crate) fn rewind_point(&self, pos: usize) -> usize {
        if self.can_rewind_to(pos) {
            return pos;
        }
        self.checkpoints
            .iter()
            .map(|&(c, _)| c)
            .filter(|&c| c <= pos)
            .max()
            .unwrap_or(0)
    }

    /// Becomes the state at `pos`, which must be exactly recoverable
    /// ([`DeltaState::can_rewind_to`]); otherwise, or at 0, the empty state.
    pub(crate) fn truncate(&mut self, pos: usize) {
        if pos >= self.len {
            return;
        }
        self.checkpoints.retain(|&(c, _)| c <= pos);
        if pos >= self.base_pos {
            let w = self.params.input_width();
            let n = pos - self.base_pos;
            if n == 0 {
                self.cur.copy_from_slice(&self.base);
            } else {
                let p = Arc::clone(&self.params);
                p.run(Some(&self.base), &mut self.cur, &self.rows[..n * w], None);
            }
            self.rows.truncate(n * w);
        } else if let Some((_, s)) = self.checkpoints.iter().find(|&&(c, _)| c == pos) {
            self.cur.copy_from_slice(s);
            self.base.copy_from_slice(s);
            self.base_pos = pos;
            self.rows.clear();
        } else {
            self.cur.iter_mut().for_each(|v| *v = 0.0);
            self.base.iter_mut().for_each(|v| *v = 0.0);
            self.base_pos = 0;
            self.rows.clear();
            self.checkpoints.clear();
            self.len = 0;
            return;
        }
        self.len = pos;
    }

    /// Bytes held: the state, the base, the replay rows, the checkpoints.
    pub(crate) fn bytes(&self) -> usize {
        4 * (self.cur.len()
            + self.base.len()
            + self.rows.len()
            + self.checkpoints.iter().map(|(_, s)| s.len()).sum::<usize>())
    }

    /// Whether `other` is a state of the same layer shape.
    pub(crate) fn same_shape(&self, other: &DeltaState) -> bool {
        self.params.shape == other.params.shape
    }

    /// The most bytes a layer of `shape` holds (with the full replay rows and checkpoints).
    pub(crate) fn max_bytes(shape: &DeltaNet) -> u64 {
        let state = shape.state_len() as u64;
        let rows = (REPLAY_ROWS * (shape.conv_dim() + 2 * shape.n_v_heads)) as u64;
        4 * ((2 + CHECKPOINTS as u64) * state + rows)
    }
}
