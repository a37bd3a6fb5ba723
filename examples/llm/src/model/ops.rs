//! The host operations of the forward pass, each a small function with the arithmetic ggml
//! uses: RMSNorm, RoPE, grouped-query attention, SwiGLU, biases and residuals, and the split of
//! a fused linear's output into its parts.

use rayon::prelude::*;

use super::config::{Config, RopeStyle};
use super::kernels;
use super::kv_cache::{KvRows, LayerKv};

/// `out = x / rms(x) * w` per row, as ggml computes it: squares summed in f64 in order, the
/// mean rounded to f32, the scale `1/sqrt(mean + eps)` in f32, then `(x * scale) * w`.
pub(super) fn rms_norm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let n = w.len();
    by_row_blocks(n, out, x, |out, x| rms_norm_rows(x, w, eps, out));
}

/// Rows per task of the host's row-wise passes (RMSNorm, SwiGLU) on a prompt chunk: a row is
/// about a microsecond of work, a task hand-off about as much.
const ROWS_PER_TASK: usize = 16;

/// `f(out rows, in rows)` over blocks of [`ROWS_PER_TASK`] rows of `width`, on the current
/// rayon pool when there are two blocks or more (a prompt chunk; one decode row stays on this
/// thread) and this thread is in one (the model's; a model with one host thread runs its
/// passes on the calling thread, outside any pool). Each row is computed the same way whatever
/// block it is in.
fn by_row_blocks(width: usize, out: &mut [f32], x: &[f32], f: impl Fn(&mut [f32], &[f32]) + Sync) {
    let block = ROWS_PER_TASK * width;
    if out.len() >= 2 * block && rayon::current_thread_index().is_some() {
        out.par_chunks_mut(block)
            .zip(x.par_chunks(block))
            .for_each(|(o, x)| f(o, x));
    } else {
        f(out, x);
    }
}

/// [`rms_norm`] in place, on rows of `w.len()` (the per-head Q/K norms: one row per head).
pub(super) fn rms_norm_in_place(x: &mut [f32], w: &[f32], eps: f32) {
    let n = w.len();
    for row in x.chunks_exact_mut(n) {
        let sum: f64 = row.iter().map(|&v| f64::from(v * v)).sum();
        let mean = (sum / n as f64) as f32;
        let scale = 1.0 / (mean + eps).sqrt();
        for (o, &g) in row.iter_mut().zip(w) {
            *o = (*o * scale) * g;
        }
    }
}

/// `x *= s`, as ggml_scale.
pub(super) fn scale(x: &mut [f32], s: f32) {
    for v in x {
        *v *= s;
    }
}

/// `cap · tanh(x / cap)` (soft-capping of the final logits or of the attention scores), as ggml
/// computes it: scale by `1/cap`, tanh, scale by `cap`.
pub(super) fn softcap(x: &mut [f32], cap: f32) {
    let inv = 1.0 / cap;
    for v in x {
        *v = (*v * inv).tanh() * cap;
    }
}

/// `gate = gelu(gate) * up` with ggml's f32 GELU ([`Activation::GeluTanh`]): below -10 it is
/// 0, from 10 on the identity, between them the f16 value of GELU at the input rounded to
/// f16.
///
/// [`Activation::GeluTanh`]: super::family::Activation::GeluTanh
pub(super) fn geglu(width: usize, gate: &mut [f32], up: &[f32]) {
    let table = gelu_table();
    by_row_blocks(width, gate, up, |g, u| {
        for (g, &u) in g.iter_mut().zip(u) {
            let x = *g;
            *g = if x <= -10.0 {
                0.0
            } else if x >= 10.0 {
                x * u
            } else {
                table[usize::from(half::f16::from_f32(x).to_bits())] * u
            };
        }
    });
}

/// GELU (tanh approximation, in f32) of every f16, rounded to f16: ggml's table, entry for entry.
/// ggml's C `0.5f*x*(1.0f + tanhf(√(2/π)*x*(1.0f + 0.044715f*x*x)))` is compiled with the inner
/// `1 + a·x·x` contracted to a fused multiply-add, and glibc's `tanhf` is correctly rounded: so
/// here `mul_add` and the f64 `tanh` rounded to f32 (the libm `tanhf` of other platforms
/// differs in the last bit now and then).
fn gelu_table() -> &'static [f32] {
    static TABLE: std::sync::OnceLock<Vec<f32>> = std::sync::OnceLock::new();
    TABLE.get_or_init(|| {
        const SQRT_2_OVER_PI: f32 = 0.797_884_6;
        const COEF_A: f32 = 0.044_715;
        (0..=u16::MAX)
            .map(|bits| {
                let x = half::f16::from_bits(bits).to_f32();
                let inner = SQRT_2_OVER_PI * x * (COEF_A * x).mul_add(x, 1.0);
                let tanh = f64::from(inner).tanh() as f32;
                let y = 0.5 * x * (1.0 + tanh);
                half::f16::from_f32(y).to_f32()
            })
            .collect()
    })
}

fn rms_norm_rows(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let n = w.len();
    for (xr, or) in x.chunks_exact(n).zip(out.chunks_exact_mut(n)) {
        let sum: f64 = xr.iter().map(|&v| f64::from(v * v)).sum();
        let mean = (sum / n as f64) as f32;
        let scale = 1.0 / (mean + eps).sqrt();
        for ((o, &v), &g) in or.iter_mut().zip(xr).zip(w) {
            *o = (v * scale) * g;
        }
    }
}

/// The parts of a fused output ([m, Σ widths], row `i` the concatenation of row `i` of each
/// part), each [m, width]: for one row the parts are side by side in `fused` and are returned
/// in place; for more, each is copied out into its buffer (whose length gives its width).
pub(super) fn split_columns<'a, const P: usize>(
    fused: &'a mut [f32],
    m: usize,
    mut parts: [&'a mut Vec<f32>; P],
) -> [&'a mut [f32]; P] {
    let widths = parts.each_ref().map(|p| p.len() / m);
    if m == 1 {
        let mut rest = fused;
        return widths.map(|w| {
            let (part, tail) = std::mem::take(&mut rest).split_at_mut(w);
            rest = tail;
            part
        });
    }
    let row: usize = widths.iter().sum();
    for (i, frow) in fused.chunks_exact(row).enumerate() {
        let mut off = 0;
        for (p, &w) in parts.iter_mut().zip(&widths) {
            p[i * w..(i + 1) * w].copy_from_slice(&frow[off..off + w]);
            off += w;
        }
    }
    parts.map(|p| &mut p[..])
}

pub(super) fn add_bias(x: &mut [f32], b: Option<&[f32]>) {
    if let Some(b) = b {
        for row in x.chunks_exact_mut(b.len()) {
            for (v, &bb) in row.iter_mut().zip(b) {
                *v += bb;
            }
        }
    }
}

pub(super) fn add_into(x: &mut [f32], y: &[f32]) {
    for (a, &b) in x.iter_mut().zip(y) {
        *a += b;
    }
}

/// `gate = silu(gate) * up`, with `silu(g) = g / (1 + e^-g)` ([`exp::exp`]), for rows of
/// `width`, on the selected backend ([`kernels::Kernel::swiglu`]: the same bits on each).
pub(super) fn swiglu(width: usize, gate: &mut [f32], up: &[f32]) {
    let kern = kernels::selected();
    by_row_blocks(width, gate, up, |g, u| kern.swiglu(g, u));
}

/// cos/sin of every rotated pair for the positions of one forward call.
pub(super) struct RopeTable {
    style: RopeStyle,
    head_dim: usize,
    n_rot: usize,
    /// `[m][n_rot / 2]` pairs of (cos, sin).
    cs: Vec<(f32, f32)>,
}

impl RopeTable {
    /// The angles as ggml computes them: `theta_scale = base^(-2/n_rot)` in f32, the angle of
    /// pair `i` at position `p` the f32 running product `p * theta_scale^i` (times the linear
    /// scale `freq_scale`, divided by the file's per-pair frequency factor if any); cos and
    /// sin times [`Config::rope_attn_factor`], as ggml's `rope_yarn` multiplies them by its
    /// `mscale`.
    pub(super) fn new(
        c: &Config,
        (base, freq_scale): (f32, f32),
        freq_factors: Option<&[f32]>,
        pos: usize,
        m: usize,
    ) -> Self {
        let half = c.n_rot / 2;
        let theta_scale = base.powf(-2.0 / c.n_rot as f32);
        let mut cs = Vec::with_capacity(m * half);
        for p in pos..pos + m {
            let mut theta = p as f32;
            for i in 0..half {
                let ff = freq_factors.map_or(1.0, |f| f[i]);
                let t = freq_scale * (theta / ff);
                cs.push((t.cos() * c.rope_attn_factor, t.sin() * c.rope_attn_factor));
                theta *= theta_scale;
            }
        }
        RopeTable {
            style: c.rope_style,
            head_dim: c.head_dim,
            n_rot: c.n_rot,
            cs,
        }
    }

    /// Rotates every head of every row of `x` (`[m][n_heads * head_dim]`).
    pub(super) fn apply(&self, x: &mut [f32], n_heads: usize) {
        let half = self.n_rot / 2;
        for (r, row) in x.chunks_exact_mut(n_heads * self.head_dim).enumerate() {
            let cs = &self.cs[r * half..(r + 1) * half];
            for head in row.chunks_exact_mut(self.head_dim) {
                for (i, &(cos, sin)) in cs.iter().enumerate() {
                    let (a, b) = match self.style {
                        RopeStyle::Adjacent => (2 * i, 2 * i + 1),
                        RopeStyle::Halves => (i, i + half),
                    };
                    let (x0, x1) = (head[a], head[b]);
                    head[a] = x0 * cos - x1 * sin;
                    head[b] = x0 * sin + x1 * cos;
                }
            }
        }
    }
}

/// Causal grouped-query attention of the `m` query rows at positions `pos..pos + m` over one
/// layer's cached keys/values (one buffer per KV head, see [`KvCache`], holding positions
/// `kv.start..pos + m`); `out` is `[m][n_head * head_dim]`.
///
/// Per (row, head): the visible positions are `0..=p` for the row at position `p`, or its last
/// `window` of them on a local layer; scores `q·k` with the canonical dot product, soft-capped
/// where the model says so ([`Config::attn_softcap`], before the scale), times `scale`;
/// softmax with the maximum subtracted and the sum of exponentials in f64, in position order;
/// the output `Σ_t p_t v_t` accumulated in position order. Nothing depends on `m` or on what
/// else the buffers hold.
///
/// [`KvCache`]: super::kv_cache::KvCache
/// Work (rows × heads × positions × head size) from which [`attention`] is split over the pool.
/// Below it the pass is over in tens of microseconds, less than waking the pool costs, and a
/// woken pool thread competes for the CPUs with the engine's workers (decode at short contexts).
pub(super) const ATTENTION_PARALLEL_WORK: usize = 1 << 18;

#[allow(clippy::too_many_arguments)]
pub(super) fn attention(
    c: &Config,
    pool: Option<&rayon::ThreadPool>,
    q: &[f32],
    kv: &LayerKv<'_>,
    window: Option<usize>,
    scale: f32,
    pos: usize,
    out: &mut [f32],
) {
    let (hd, qd) = (c.head_dim, c.q_dim());
    let m = q.len() / qd;
    let group = c.n_head / c.n_head_kv;
    let (k_cache, v_cache) = (kv.keys, kv.values);
    let kern = kernels::selected();
    thread_local! {
        /// One head's scores, kept per thread (decode calls this 270 times per token).
        static SCORES: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    let one = |idx: usize, o: &mut [f32]| {
        let (r, h) = (idx / c.n_head, idx % c.n_head);
        let g = h / group;
        // Visible positions lo..=p, at offsets lo - start.. of the buffers.
        let p = pos + r;
        let lo = window.map_or(0, |w| (p + 1).saturating_sub(w));
        let (first, n_t) = ((lo - kv.start) * hd, p + 1 - lo);
        let mut scores = SCORES.with_borrow_mut(std::mem::take);
        scores.clear();
        scores.resize(n_t, 0.0);
        let qh = &q[r * qd + h * hd..r * qd + (h + 1) * hd];
        match &k_cache[g] {
            KvRows::F32(keys) => kern.dot_rows(qh, &keys[first..], hd, &mut scores),
            KvRows::F16(keys) => kern.dot_rows_f16(qh, &keys[first..], hd, &mut scores),
        }
        if let Some(cap) = c.attn_softcap {
            softcap(&mut scores, cap);
        }
        kern.softmax_scaled(&mut scores, scale);
        o.fill(0.0);
        match &v_cache[g] {
            KvRows::F32(values) => kern.add_scaled_rows(&scores, &values[first..], hd, o),
            KvRows::F16(values) => kern.add_scaled_rows_f16(&scores, &values[first..], hd, o),
        }
        SCORES.with_borrow_mut(|s| *s = scores);
    };
    match pool {
        None => out
            .chunks_mut(hd)
            .enumerate()
            .for_each(|(idx, o)| one(idx, o)),
        // One task per (row, query head), each writing its own head_dim slice of `out`.
        Some(pool) => pool.install(|| {
            out.par_chunks_mut(hd)
                .enumerate()
                .for_each(|(idx, o)| one(idx, o));
        }),
    }
    debug_assert_eq!(out.len(), m * qd);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn test_config(
        n_embd: usize,
        n_head: usize,
        n_head_kv: usize,
        hd: usize,
        n_ctx: usize,
    ) -> Config {
        Config {
            family: crate::model::FAMILIES[0],
            n_vocab: 16,
            n_embd,
            n_layer: 1,
            n_head,
            n_head_kv,
            head_dim: hd,
            n_ff: 32,
            n_ctx,
            rms_eps: 1e-5,
            rope_base: 10_000.0,
            rope_freq_scale: 1.0,
            n_rot: hd,
            rope_attn_factor: 1.0,
            long_rope: None,
            rope_style: RopeStyle::Adjacent,
            attn_scale: 1.0 / (hd as f32).sqrt(),
            embd_scale: None,
            residual_scale: None,
            sliding_window: None,
            delta_net: None,
            gated_attention: false,
            ffn_norm: "ffn_norm.weight",
            attn_softcap: None,
            final_logit_softcap: None,
            logit_scale: None,
            no_rope_step: None,
            pooling_type: None,
            moe: None,
            short_conv: None,
            output_norm: "output_norm.weight",
        }
    }

    fn layer<'a>(keys: &'a [KvRows], values: &'a [KvRows], start: usize) -> LayerKv<'a> {
        LayerKv {
            keys,
            values,
            start,
        }
    }

    #[test]
    fn split_columns_gives_each_part_its_columns_in_place_or_copied() {
        for m in [1, 3] {
            // Row i: part a = [10i, 10i+1], part b = [10i+2, 10i+3, 10i+4].
            let mut fused: Vec<f32> = (0..m)
                .flat_map(|i| (0..5).map(move |j| (10 * i + j) as f32))
                .collect();
            let (mut a, mut b) = (vec![0.0; 2 * m], vec![0.0; 3 * m]);
            let [pa, pb] = split_columns(&mut fused, m, [&mut a, &mut b]);
            let want = |w: usize, off: usize| -> Vec<f32> {
                (0..m)
                    .flat_map(|i| (0..w).map(move |j| (10 * i + off + j) as f32))
                    .collect()
            };
            assert_eq!(pa, &want(2, 0)[..], "m={m}");
            assert_eq!(pb, &want(3, 2)[..], "m={m}");
        }
    }

    #[test]
    fn attention_gives_the_same_bits_on_one_thread_and_on_the_pool() {
        let c = test_config(48, 6, 2, 8, 64);
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .unwrap();
        let mut rng = fastrand::Rng::with_seed(5);
        let (pos, m, hd) = (7, 5, c.head_dim);
        let mut random = |n: usize| (0..n).map(|_| rng.f32() - 0.5).collect::<Vec<f32>>();
        let q = random(m * c.q_dim());
        let k: Vec<Vec<f32>> = (0..c.n_head_kv).map(|_| random((pos + m) * hd)).collect();
        let v: Vec<Vec<f32>> = (0..c.n_head_kv).map(|_| random((pos + m) * hd)).collect();
        let rows = |x: &[Vec<f32>]| -> Vec<KvRows> { x.iter().cloned().map(KvRows::F32).collect() };
        let (kr, vr) = (rows(&k), rows(&v));
        let mut serial = vec![0.0; m * c.q_dim()];
        let mut parallel = serial.clone();
        attention(
            &c,
            None,
            &q,
            &layer(&kr, &vr, 0),
            None,
            c.attn_scale,
            pos,
            &mut serial,
        );
        attention(
            &c,
            Some(&pool),
            &q,
            &layer(&kr, &vr, 0),
            None,
            c.attn_scale,
            pos,
            &mut parallel,
        );
        let bits = |x: &[f32]| x.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&serial), bits(&parallel));
        // And it is causal softmax attention (f64 reference).
        assert_is_attention(&c, &q, &k, &v, pos, None, &serial);
    }

    #[test]
    fn windowed_attention_sees_the_last_window_positions_whatever_the_buffers_start() {
        let c = test_config(32, 4, 2, 8, 64);
        let mut rng = fastrand::Rng::with_seed(9);
        let (pos, m, hd, w) = (9, 4, c.head_dim, 5);
        let mut random = |n: usize| (0..n).map(|_| rng.f32() - 0.5).collect::<Vec<f32>>();
        let q = random(m * c.q_dim());
        let k: Vec<Vec<f32>> = (0..c.n_head_kv).map(|_| random((pos + m) * hd)).collect();
        let v: Vec<Vec<f32>> = (0..c.n_head_kv).map(|_| random((pos + m) * hd)).collect();
        let from = |x: &[Vec<f32>], start: usize| -> Vec<KvRows> {
            x.iter()
                .map(|b| KvRows::F32(b[start * hd..].to_vec()))
                .collect()
        };
        let mut full = vec![0.0; m * c.q_dim()];
        let (kf, vf) = (from(&k, 0), from(&v, 0));
        attention(
            &c,
            None,
            &q,
            &layer(&kf, &vf, 0),
            Some(w),
            c.attn_scale,
            pos,
            &mut full,
        );
        // The first query (position 9) sees 5..=9: buffers from position 5 on give the same bits.
        let (kd, vd) = (from(&k, pos + 1 - w), from(&v, pos + 1 - w));
        let mut dropped = vec![0.0; m * c.q_dim()];
        let kv = layer(&kd, &vd, pos + 1 - w);
        attention(&c, None, &q, &kv, Some(w), c.attn_scale, pos, &mut dropped);
        let bits = |x: &[f32]| x.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&full), bits(&dropped));
        // And it is softmax attention over positions p - w + 1 ..= p (f64 reference).
        assert_is_attention(&c, &q, &k, &v, pos, Some(w), &full);
    }

    /// `got` is causal softmax attention of the rows of `q` at `pos..` over the positions each
    /// sees (the last `window` of them, if set), computed in f64 from the definition.
    fn assert_is_attention(
        c: &Config,
        q: &[f32],
        k: &[Vec<f32>],
        v: &[Vec<f32>],
        pos: usize,
        window: Option<usize>,
        got: &[f32],
    ) {
        let (hd, group) = (c.head_dim, c.n_head / c.n_head_kv);
        for r in 0..q.len() / c.q_dim() {
            for h in 0..c.n_head {
                let (g, qh) = (h / group, &q[(r * c.n_head + h) * hd..][..hd]);
                let p = pos + r;
                let seen: Vec<usize> = (window.map_or(0, |w| p + 1 - w)..=p).collect();
                let scores: Vec<f64> = seen
                    .iter()
                    .map(|&t| {
                        let kt = &k[g][t * hd..(t + 1) * hd];
                        let d: f64 = qh.iter().zip(kt).map(|(&a, &b)| f64::from(a * b)).sum();
                        d / (hd as f64).sqrt()
                    })
                    .collect();
                let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
                let sum: f64 = e.iter().sum();
                for j in 0..hd {
                    let want: f64 = seen
                        .iter()
                        .zip(&e)
                        .map(|(&t, &et)| et / sum * f64::from(v[g][t * hd + j]))
                        .sum();
                    let o = f64::from(got[(r * c.n_head + h) * hd + j]);
                    assert!((o - want).abs() < 1e-5, "row {r} head {h}: {o} vs {want}");
                }
            }
        }
    }

    #[test]
    fn geglu_is_ggml_gelu_of_the_f16_input_rounded_to_f16_times_up() {
        let xs: Vec<f32> = (-1200..1200).map(|i| i as f32 * 0.01 + 0.0037).collect();
        let mut g = xs.clone();
        let up: Vec<f32> = xs.iter().map(|x| 1.5 - x * 0.1).collect();
        geglu(xs.len(), &mut g, &up);
        for ((&x, &u), &got) in xs.iter().zip(&up).zip(&g) {
            let want = if x <= -10.0 {
                0.0
            } else if x >= 10.0 {
                x * u
            } else {
                // The documented formula in f64 at the f16 input, rounded to f16.
                let h = f64::from(half::f16::from_f32(x).to_f32());
                let gelu = 0.5
                    * h
                    * (1.0
                        + ((2.0 / std::f64::consts::PI).sqrt() * h * (1.0 + 0.044715 * h * h))
                            .tanh());
                half::f16::from_f64(gelu).to_f32() * u
            };
            // f32 vs f64 evaluation may land on the neighbouring f16 at a rounding boundary, and
            // f32 cancels `1 + tanh(..)` to 0 for x below about -5 (GELU is below 1e-6 there).
            let ulp = half::f16::from_f32(want / u.max(1e-3)).to_f32().abs() * 2f32.powi(-10);
            assert!(
                (got - want).abs() <= ulp * u.abs() + 1e-6,
                "x={x}: {got} vs {want}"
            );
        }
    }

    #[test]
    fn attention_over_an_f16_cache_is_attention_over_its_rounded_values() {
        // On one thread and on the pool: exactly the f32 cache's result on the f16-rounded keys
        // and values (every kernel backend is checked against that in `kernels`).
        let c = test_config(128, 4, 2, 32, 512);
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .unwrap();
        let mut rng = fastrand::Rng::with_seed(6);
        let (pos, m, hd) = (150, 3, c.head_dim);
        let mut random = |n: usize| (0..n).map(|_| rng.f32() * 4.0 - 2.0).collect::<Vec<f32>>();
        let q = random(m * c.q_dim());
        let k: Vec<Vec<f32>> = (0..c.n_head_kv).map(|_| random((pos + m) * hd)).collect();
        let v: Vec<Vec<f32>> = (0..c.n_head_kv).map(|_| random((pos + m) * hd)).collect();
        let round = |x: &Vec<f32>| -> Vec<f32> {
            x.iter().map(|&y| half::f16::from_f32(y).to_f32()).collect()
        };
        let exact_rows =
            |x: &[Vec<f32>]| -> Vec<KvRows> { x.iter().map(|b| KvRows::F32(round(b))).collect() };
        let half_rows = |x: &[Vec<f32>]| -> Vec<KvRows> {
            x.iter()
                .map(|b| {
                    let mut r = KvRows::F16(Vec::new());
                    r.extend(b);
                    r
                })
                .collect()
        };
        let mut want = vec![0.0; m * c.q_dim()];
        let (ek, ev) = (exact_rows(&k), exact_rows(&v));
        attention(
            &c,
            None,
            &q,
            &layer(&ek, &ev, 0),
            None,
            c.attn_scale,
            pos,
            &mut want,
        );
        let bits = |x: &[f32]| x.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        for pool in [None, Some(&pool)] {
            let mut got = vec![0.0; m * c.q_dim()];
            let (hk, hv) = (half_rows(&k), half_rows(&v));
            attention(
                &c,
                pool,
                &q,
                &layer(&hk, &hv, 0),
                None,
                c.attn_scale,
                pos,
                &mut got,
            );
            assert_eq!(bits(&got), bits(&want), "pool: {}", pool.is_some());
        }
    }
}
