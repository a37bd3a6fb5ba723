//! Choosing the next token from the logits: greedy, or repetition penalty → top-k → top-p →
//! temperature → a draw, in llama.cpp's order, with a seeded generator so runs reproduce.

/// Sampling parameters (llama.cpp's defaults, except that the seed is chosen by the caller).
#[derive(Debug, Clone, PartialEq)]
pub struct SamplerConfig {
    /// Temperature; `<= 0` is greedy (the largest logit, the lowest id among equals).
    pub temperature: f32,
    /// Keep the `top_k` largest logits; 0 keeps all.
    pub top_k: usize,
    /// Keep the smallest set of most likely tokens whose probability reaches `top_p`; `>= 1`
    /// keeps all.
    pub top_p: f32,
    /// Divide positive (multiply negative) logits of recent tokens by this; 1 is off.
    pub repeat_penalty: f32,
    /// How many recent tokens the penalty looks at.
    pub repeat_last_n: usize,
    /// Seed of the generator.
    pub seed: u64,
}

impl Default for SamplerConfig {
    fn default() -> Self {
        SamplerConfig {
            temperature: 0.8,
            top_k: 40,
            top_p: 0.95,
            repeat_penalty: 1.0,
            repeat_last_n: 64,
            seed: 0,
        }
    }
}

/// xorshift64* (Vigna, "An experimental exploration of Marsaglia's xorshift generators",
/// 2016): 64 bits of state, period 2^64 - 1, output `x * 0x2545F4914F6CDD1D`. Seeded through
/// SplitMix64 so that nearby seeds give unrelated streams and seed 0 is valid. Small, fast and
/// fully specified here, so a seed reproduces the same tokens on every platform and version.
#[derive(Debug, Clone)]
pub struct Rng {
    state: u64,
}

impl Rng {
    /// A generator for `seed`.
    pub fn new(seed: u64) -> Self {
        let mut z = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        Rng {
            state: if z == 0 { 0x2545_F491_4F6C_DD1D } else { z },
        }
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.state;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.state = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in `[0, 1)` with 53 random bits.
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

/// A sampler: its parameters, generator and the recent tokens for the repetition penalty.
#[derive(Debug, Clone)]
pub struct Sampler {
    config: SamplerConfig,
    rng: Rng,
    recent: std::collections::VecDeque<u32>,
    candidates: Vec<(u32, f32)>,
}

impl Sampler {
    /// A sampler with `config`, its generator seeded with `config.seed`.
    pub fn new(config: SamplerConfig) -> Self {
        Sampler {
            rng: Rng::new(config.seed),
            recent: std::collections::VecDeque::with_capacity(config.repeat_last_n + 1),
            candidates: Vec::new(),
            config,
        }
    }

    /// The parameters.
    pub fn config(&self) -> &SamplerConfig {
        &self.config
    }

    /// Records a token of the context (prompt or generated) for the repetition penalty.
    pub fn accept(&mut self, token: u32) {
        if self.config.repeat_last_n == 0 {
            return;
        }
        if self.recent.len() == self.config.repeat_last_n {
            self.recent.pop_front();
        }
        self.recent.push_back(token);
    }

    /// Picks the next token from one row of logits (ids are positions in `logits`).
    pub fn sample(&mut self, logits: &[f32]) -> u32 {
        match self.distribution(logits) {
            Dist::Greedy(t) => t,
            Dist::Probs(probs) => {
                let u = self.rng.next_f64();
                draw(&probs, &self.candidates, u, None)
            }
        }
    }

    /// Decides whether the token `drafted` (proposed by a draft that gave it all its
    /// probability, as prompt lookup does) stands at the position of `logits`, by the
    /// speculative-sampling rule, which leaves the output distribution exactly that of
    /// [`Sampler::sample`]: greedy keeps it if it is the argmax, else the argmax replaces it;
    /// with sampling it is kept with probability `p(drafted)`, else the replacement is drawn
    /// from `p` without `drafted`, renormalised.
    pub fn verify(&mut self, logits: &[f32], drafted: u32) -> Verdict {
        match self.distribution(logits) {
            Dist::Greedy(t) if t == drafted => Verdict::Accept,
            Dist::Greedy(t) => Verdict::Reject(t),
            Dist::Probs(probs) => {
                let p_draft = self
                    .candidates
                    .iter()
                    .zip(&probs)
                    .find(|(c, _)| c.0 == drafted)
                    .map_or(0.0, |(_, &p)| p);
                if self.rng.next_f64() < p_draft {
                    return Verdict::Accept;
                }
                // The residual max(0, p - q) with q a point mass on `drafted`: p without it.
                let rest = 1.0 - p_draft;
                let u = self.rng.next_f64() * rest;
                Verdict::Reject(draw(&probs, &self.candidates, u, Some(drafted)))
            }
        }
    }

    /// The distribution the next token is drawn from: the argmax (temperature 0), or the
    /// candidates (left in `self.candidates`) with their probabilities after the repetition
    /// penalty, top-k, top-p and temperature, in llama.cpp's order.
    fn distribution(&mut self, logits: &[f32]) -> Dist {
        let c = &self.config;
        self.candidates.clear();
        self.candidates
            .extend(logits.iter().enumerate().map(|(i, &l)| (i as u32, l)));
        // Repetition penalty, once per distinct recent token.
        if c.repeat_penalty != 1.0 && c.repeat_penalty > 0.0 {
            let mut seen: Vec<u32> = self.recent.iter().copied().collect();
            seen.sort_unstable();
            seen.dedup();
            for t in seen {
                if let Some(cand) = self.candidates.get_mut(t as usize) {
                    cand.1 = if cand.1 > 0.0 {
                        cand.1 / c.repeat_penalty
                    } else {
                        cand.1 * c.repeat_penalty
                    };
                }
            }
        }
        if c.temperature <= 0.0 {
            return Dist::Greedy(greedy(&self.candidates));
        }
        // Largest first, lowest id first among equals; NaN logits sort last.
        let by_logit = |a: &(u32, f32), b: &(u32, f32)| {
            b.1.partial_cmp(&a.1)
                .unwrap_or_else(|| a.1.is_nan().cmp(&b.1.is_nan()))
                .then(a.0.cmp(&b.0))
        };
        if c.top_k > 0 && c.top_k < self.candidates.len() {
            self.candidates
                .select_nth_unstable_by(c.top_k - 1, by_logit);
            self.candidates.truncate(c.top_k);
        }
        self.candidates.sort_by(by_logit);
        // top-p on the distribution before temperature, as llama.cpp orders its chain.
        if c.top_p < 1.0 {
            let probs = softmax(&self.candidates, 1.0);
            let mut cum = 0.0;
            let mut keep = probs.len();
            for (i, p) in probs.iter().enumerate() {
                cum += p;
                if cum >= f64::from(c.top_p) {
                    keep = i + 1;
                    break;
                }
            }
            self.candidates.truncate(keep.max(1));
        }
        Dist::Probs(softmax(&self.candidates, c.temperature))
    }
}

/// The outcome of [`Sampler::verify`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The drafted token stands.
    Accept,
    /// It does not; this token takes its place.
    Reject(u32),
}

/// A next-token distribution.
enum Dist {
    Greedy(u32),
    Probs(Vec<f64>),
}

/// The candidate where the cumulative probability (skipping `skip`) passes `u`.
fn draw(probs: &[f64], candidates: &[(u32, f32)], u: f64, skip: Option<u32>) -> u32 {
    let mut cum = 0.0;
    let mut last = None;
    for (p, cand) in probs.iter().zip(candidates) {
        if Some(cand.0) == skip {
            continue;
        }
        cum += p;
        last = Some(cand.0);
        if u < cum {
            return cand.0;
        }
    }
    // Rounding left `cum` a hair below the total and `u` above it: the last candidate.
    last.unwrap_or(0)
}

/// The id of the largest logit, the lowest among equals (NaN never wins).
pub fn greedy(candidates: &[(u32, f32)]) -> u32 {
    let mut best: Option<(u32, f32)> = None;
    for &(id, l) in candidates {
        if l.is_nan() {
            continue;
        }
        if best.is_none_or(|(_, b)| l > b) {
            best = Some((id, l));
        }
    }
    best.map_or(0, |b| b.0)
}

/// Probabilities of the candidates at `temperature`, in f64, summing to 1.
fn softmax(candidates: &[(u32, f32)], temperature: f32) -> Vec<f64> {
    let t = f64::from(temperature);
    let max = candidates
        .iter()
        .map(|c| f64::from(c.1))
        .fold(f64::NEG_INFINITY, f64::max);
    let mut p: Vec<f64> = candidates
        .iter()
        .map(|c| {
            let v = ((f64::from(c.1) - max) / t).exp();
            if v.is_nan() { 0.0 } else { v }
        })
        .collect();
    let sum: f64 = p.iter().sum();
    if sum > 0.0 {
        p.iter_mut().for_each(|x| *x /= sum);
    }
    p
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(temperature: f32, top_k: usize, top_p: f32) -> SamplerConfig {
        SamplerConfig {
            temperature,
            top_k,
            top_p,
            repeat_penalty: 1.0,
            repeat_last_n: 64,
            seed: 7,
        }
    }

    #[test]
    fn greedy_is_argmax_with_lowest_id_on_ties() {
        let mut s = Sampler::new(cfg(0.0, 40, 0.95));
        assert_eq!(s.sample(&[0.1, 3.0, -1.0, 3.0]), 1);
        assert_eq!(s.sample(&[f32::NAN, -5.0]), 1);
    }

    #[test]
    fn repetition_penalty_follows_the_sign() {
        let mut s = Sampler::new(SamplerConfig {
            repeat_penalty: 2.0,
            ..cfg(0.0, 0, 1.0)
        });
        s.accept(0);
        // 4.0 / 2 = 2.0 < 3.0: token 1 wins now.
        assert_eq!(s.sample(&[4.0, 3.0]), 1);
        let mut s = Sampler::new(SamplerConfig {
            repeat_penalty: 2.0,
            ..cfg(0.0, 0, 1.0)
        });
        s.accept(1);
        // -1.0 * 2 = -2.0 < -1.5.
        assert_eq!(s.sample(&[-1.5, -1.0]), 0);
    }

    #[test]
    fn same_seed_same_tokens_and_frequencies_follow_the_distribution() {
        let logits = [0.0f32, (2.0f32).ln(), (3.0f32).ln(), (4.0f32).ln()]; // p ∝ 1:2:3:4
        let draw = |seed| {
            let mut s = Sampler::new(SamplerConfig {
                seed,
                ..cfg(1.0, 0, 1.0)
            });
            (0..20000).map(|_| s.sample(&logits)).collect::<Vec<_>>()
        };
        let a = draw(1);
        assert_eq!(a, draw(1));
        assert_ne!(a, draw(2));
        let mut counts = [0usize; 4];
        a.iter().for_each(|&t| counts[t as usize] += 1);
        for (i, &c) in counts.iter().enumerate() {
            let want = 20000.0 * (i + 1) as f64 / 10.0;
            assert!(
                (c as f64 - want).abs() < 4.0 * want.sqrt() + 20.0,
                "{counts:?}"
            );
        }
    }

    #[test]
    fn top_k_and_top_p_restrict_the_candidates() {
        let logits = [0.0f32, 1.0, 2.0, 3.0, 4.0];
        let mut s = Sampler::new(cfg(5.0, 2, 1.0));
        for _ in 0..500 {
            assert!(s.sample(&logits) >= 3);
        }
        // p(4) = e^4 / Σ ≈ 0.636, p(3) ≈ 0.234: top-p 0.8 keeps exactly {4, 3}.
        let mut s = Sampler::new(cfg(5.0, 0, 0.8));
        let picks: std::collections::BTreeSet<u32> = (0..2000).map(|_| s.sample(&logits)).collect();
        assert_eq!(picks.into_iter().collect::<Vec<_>>(), vec![3, 4]);
        // A tiny top-p keeps only the best.
        let mut s = Sampler::new(cfg(1.0, 0, 0.01));
        assert!((0..100).all(|_| s.sample(&logits) == 4));
    }

    #[test]
    fn rng_is_the_documented_xorshift64_star() {
        // Recomputed by hand from the definition for state 1.
        let mut r = Rng { state: 1 };
        let x1 = 1u64 ^ (1 << 25);
        let x1 = x1 ^ (x1 >> 27);
        assert_eq!(r.next_u64(), x1.wrapping_mul(0x2545_F491_4F6C_DD1D));
        let mut r = Rng::new(0);
        let v: Vec<f64> = (0..1000).map(|_| r.next_f64()).collect();
        assert!(v.iter().all(|&x| (0.0..1.0).contains(&x)));
        let mean = v.iter().sum::<f64>() / 1000.0;
        assert!((mean - 0.5).abs() < 0.05);
    }

    #[test]
    fn verify_is_exact_for_greedy() {
        let mut s = Sampler::new(cfg(0.0, 0, 1.0));
        let logits = [0.1f32, 2.0, 0.5];
        assert_eq!(s.verify(&logits, 1), Verdict::Accept);
        assert_eq!(s.verify(&logits, 2), Verdict::Reject(1));
    }

    /// Speculative sampling leaves the distribution unchanged: the token at a position is
    /// distributed as `p` whatever the drafted token was.
    #[test]
    fn verify_keeps_the_distribution_for_any_draft() {
        let logits = [1.0f32, 0.5, -0.3, 0.0];
        let mut s = Sampler::new(cfg(0.8, 0, 1.0));
        let p = match s.distribution(&logits) {
            Dist::Probs(p) => p,
            Dist::Greedy(_) => unreachable!(),
        };
        let ids: Vec<u32> = s.candidates.iter().map(|c| c.0).collect();
        let n = 200_000;
        for drafted in [0u32, 2, 3] {
            let mut s = Sampler::new(SamplerConfig {
                seed: 9 + u64::from(drafted),
                ..cfg(0.8, 0, 1.0)
            });
            let mut counts = [0usize; 4];
            for _ in 0..n {
                let t = match s.verify(&logits, drafted) {
                    Verdict::Accept => drafted,
                    Verdict::Reject(t) => {
                        assert_ne!(t, drafted);
                        t
                    }
                };
                counts[t as usize] += 1;
            }
            for (id, &pi) in ids.iter().zip(&p) {
                let f = counts[*id as usize] as f64 / n as f64;
                assert!(
                    (f - pi).abs() < 0.005,
                    "draft {drafted}: token {id} {f} vs {pi}"
                );
            }
        }
    }
}
