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
    /// OpenAI's presence penalty: subtracted once from the logit of every token generated at
    /// least once in the current completion; 0 is off.
    pub presence_penalty: f32,
    /// OpenAI's frequency penalty: subtracted from a token's logit once per time it was
    /// generated in the current completion; 0 is off.
    pub frequency_penalty: f32,
    /// OpenAI's `logit_bias`: added to these tokens' logits before the penalties (as
    /// llama.cpp's chain orders them); a bias of −∞ bans a token. Ids past the vocabulary
    /// are ignored (a server checks them first).
    pub logit_bias: Vec<(u32, f32)>,
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
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            logit_bias: Vec::new(),
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

/// A sampler: its parameters, generator, the recent tokens for the repetition penalty and the
/// current completion's token counts for OpenAI's presence and frequency penalties.
#[derive(Debug, Clone)]
pub struct Sampler {
    config: SamplerConfig,
    rng: Rng,
    recent: std::collections::VecDeque<u32>,
    /// Times each token was accepted since [`Sampler::start_completion`].
    counts: std::collections::BTreeMap<u32, u32>,
    candidates: Vec<(u32, f32)>,
}

impl Sampler {
    /// A sampler with `config`, its generator seeded with `config.seed`.
    pub fn new(config: SamplerConfig) -> Self {
        Sampler {
            rng: Rng::new(config.seed),
            recent: std::collections::VecDeque::with_capacity(config.repeat_last_n + 1),
            counts: std::collections::BTreeMap::new(),
            candidates: Vec::new(),
            config,
        }
    }

    /// The parameters.
    pub fn config(&self) -> &SamplerConfig {
        &self.config
    }

    /// Starts a completion: the presence and frequency penalties count the tokens accepted
    /// from now on (the generated ones; call it after accepting the prompt).
    pub fn start_completion(&mut self) {
        self.counts.clear();
    }

    /// Records a token of the context (prompt or generated) for the penalties.
    pub fn accept(&mut self, token: u32) {
        let c = &self.config;
        if c.presence_penalty != 0.0 || c.frequency_penalty != 0.0 {
            *self.counts.entry(token).or_insert(0) += 1;
        }
        if self.config.repeat_last_n == 0 {
            return;
        }
        if self.recent.len() == self.config.repeat_last_n {
            self.recent.pop_front();
        }
        self.recent.push_back(token);
    }

    /// Replaces the recent tokens the repetition penalty considers with the last
    /// `repeat_last_n` of `context`: after the context was cut back (a rewind), the penalty
    /// considers only what is left of it. The presence and frequency penalties' counts are the
    /// current completion's and stay.
    pub fn set_recent(&mut self, context: &[u32]) {
        self.recent.clear();
        let n = self.config.repeat_last_n;
        self.recent
            .extend(&context[context.len().saturating_sub(n)..]);
    }

    /// The recent tokens the repetition penalty considers, oldest first.
    #[cfg(test)]
    pub(crate) fn recent(&self) -> Vec<u32> {
        self.recent.iter().copied().collect()
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
    ///
    /// The penalty changes a few logits, so it is kept aside (`penalised`) rather than applied
    /// to a copy of the whole row; greedy and top-k then read the row once. Sorting or
    /// partitioning all of a 49 152-token vocabulary cost 0.43 ms per token on the machine this
    /// was written on, about a tenth of a decode step; the single pass keeps only the k best.
    fn distribution(&mut self, logits: &[f32]) -> Dist {
        let c = &self.config;
        let penalised = self.penalised(logits);
        let row = PenalisedRow {
            logits,
            penalised: &penalised,
        };
        if c.temperature <= 0.0 {
            return Dist::Greedy(greedy_of(row));
        }
        self.candidates.clear();
        if c.top_k > 0 && c.top_k < logits.len() {
            top_k_into(row, c.top_k, &mut self.candidates);
        } else {
            let cands = &mut self.candidates;
            row.for_each(|id, l| cands.push((id, l)));
            cands.sort_by(by_logit);
        }
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

    /// The ids the logit bias and the penalties change and their logits after them, ascending
    /// by id: the bias, the repetition penalty on the recent tokens (positive logits divided
    /// by it, others multiplied), then OpenAI's `logit - count * frequency - (count > 0) *
    /// presence` on the completion's tokens, in llama.cpp's order (none when all are off).
    fn penalised(&self, logits: &[f32]) -> Vec<(u32, f32)> {
        let c = &self.config;
        let n_vocab = logits.len();
        let repeat = c.repeat_penalty != 1.0 && c.repeat_penalty > 0.0;
        let mut seen: Vec<u32> = if repeat {
            self.recent.iter().copied().collect()
        } else {
            Vec::new()
        };
        seen.extend(self.counts.keys());
        seen.extend(c.logit_bias.iter().map(|b| b.0));
        seen.retain(|&t| (t as usize) < n_vocab);
        seen.sort_unstable();
        seen.dedup();
        seen.into_iter()
            .map(|id| {
                let mut l = logits[id as usize];
                for &(_, bias) in c.logit_bias.iter().filter(|b| b.0 == id) {
                    l += bias;
                }
                if repeat && self.recent.contains(&id) {
                    l = if l > 0.0 {
                        l / c.repeat_penalty
                    } else {
                        l * c.repeat_penalty
                    };
                }
                if let Some(&n) = self.counts.get(&id) {
                    l = l - n as f32 * c.frequency_penalty - c.presence_penalty;
                }
                (id, l)
            })
            .collect()
    }
}

/// The candidates' order: largest logit first, lowest id first among equals, NaN last.
fn by_logit(a: &(u32, f32), b: &(u32, f32)) -> std::cmp::Ordering {
    b.1.partial_cmp(&a.1)
        .unwrap_or_else(|| a.1.is_nan().cmp(&b.1.is_nan()))
        .then(a.0.cmp(&b.0))
}

/// A row of logits with the penalties applied: the ids in `penalised` (ascending) have the
/// logits given there.
#[derive(Clone, Copy)]
struct PenalisedRow<'a> {
    logits: &'a [f32],
    penalised: &'a [(u32, f32)],
}

/// A stretch of a [`PenalisedRow`], in id order.
enum Piece<'a> {
    /// Consecutive ids from `first`, their logits as they are.
    Run { first: u32, logits: &'a [f32] },
    /// A penalised id and its logit after the penalty.
    One { id: u32, logit: f32 },
}

impl PenalisedRow<'_> {
    /// Hands `f` the row as runs of plain logits between the penalised ids, and each of those.
    fn pieces(self, mut f: impl FnMut(Piece<'_>)) {
        let mut start = 0usize;
        for &(id, logit) in self.penalised {
            let i = id as usize;
            f(Piece::Run {
                first: start as u32,
                logits: &self.logits[start..i],
            });
            f(Piece::One { id, logit });
            start = i + 1;
        }
        f(Piece::Run {
            first: start as u32,
            logits: &self.logits[start..],
        });
    }

    /// Every `(id, logit)` in id order.
    fn for_each(self, mut f: impl FnMut(u32, f32)) {
        self.pieces(|piece| match piece {
            Piece::Run { first, logits } => {
                for (i, &l) in logits.iter().enumerate() {
                    f(first + i as u32, l);
                }
            }
            Piece::One { id, logit } => f(id, logit),
        });
    }

    /// Each run in blocks of [`BLOCK`]: `f(first_id, block)`, and each penalised id as a block
    /// of one.
    fn blocks(self, mut f: impl FnMut(u32, &[f32])) {
        self.pieces(|piece| match piece {
            Piece::Run { first, logits } => {
                for (b, block) in logits.chunks(BLOCK).enumerate() {
                    f(first + (b * BLOCK) as u32, block);
                }
            }
            Piece::One { id, logit } => f(id, &[logit]),
        });
    }
}

/// Logits per block of the scans below: a block whose largest logit cannot enter is skipped
/// after one vectorised maximum.
const BLOCK: usize = 16;

/// Largest non-NaN value of `xs` (−∞ if none).
fn block_max(xs: &[f32]) -> f32 {
    xs.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x))
}

/// The `k` first of `row` in [`by_logit`]'s order, sorted, into `out` (cleared first), in one
/// pass: an entry enters only if it ranks before the current k-th, which for entries seen in
/// id order means a strictly larger logit (or any number over a NaN).
fn top_k_into(row: PenalisedRow<'_>, k: usize, out: &mut Vec<(u32, f32)>) {
    out.clear();
    row.blocks(|first, block| {
        // A full list with a number as its k-th: only a larger logit enters.
        let worst = (out.len() == k).then(|| out[k - 1].1);
        if worst.is_some_and(|w| !w.is_nan() && block_max(block) <= w) {
            return;
        }
        for (i, &l) in block.iter().enumerate() {
            if out.len() == k {
                let worst = out[k - 1].1;
                if !(l > worst || (worst.is_nan() && !l.is_nan())) {
                    continue;
                }
                out.pop();
            }
            // Later ids rank after earlier equals: before the first entry ranking after it.
            let cand = (first + i as u32, l);
            let at = out.partition_point(|e| by_logit(e, &cand).is_lt());
            out.insert(at, cand);
        }
    });
}

/// The most alternatives [`token_logprobs`] lists (OpenAI's cap on `top_logprobs`).
pub const MAX_TOP_LOGPROBS: usize = 20;

/// The log-probabilities of one decided token: the log-softmax of the model's raw logits (no
/// penalty, temperature, top-k/top-p or mask applied) at its position, as OpenAI reports them.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenLogprobs {
    /// The decided token.
    pub token: u32,
    /// Its log-probability.
    pub logprob: f32,
    /// The most likely tokens with their log-probabilities, most likely first (the lowest id
    /// first among equals); as many as asked for, at most [`MAX_TOP_LOGPROBS`] and the
    /// vocabulary.
    pub top: Vec<(u32, f32)>,
}

/// The log-probabilities of `chosen` and of the `top` most likely tokens of `row` (at most
/// [`MAX_TOP_LOGPROBS`]), from the log-softmax of `row`: `l - max - ln Σ exp(l - max)`,
/// within about 1e-6 of the exact value. NaN logits count as −∞. Costs one pass to select the top ones (the single-pass
/// top-k of the sampler, no sort of the row) and one log-sum-exp pass; a `chosen` outside the
/// row gets −∞.
pub fn token_logprobs(row: &[f32], chosen: u32, top: usize) -> TokenLogprobs {
    let top = top.min(MAX_TOP_LOGPROBS).min(row.len());
    let plain = PenalisedRow {
        logits: row,
        penalised: &[],
    };
    let mut best = Vec::with_capacity(top);
    if top > 0 {
        top_k_into(plain, top, &mut best);
    }
    let max = match best.first() {
        Some(&(_, l)) if !l.is_nan() => l,
        _ => block_max(row),
    };
    // ln Σ exp(l): finite, or −∞ when no logit is a number above −∞; ln of the number of +∞
    // logits when there are any (they share all the mass).
    let lse = if max.is_finite() {
        // The host's `e^x` (a few ulp; plain arithmetic the compiler vectorises, where a C
        // library call per element kept this loop scalar), in 8 lanes of f32 over blocks of
        // 64 terms of at most 1 each, the blocks summed in f64.
        let term = |l: f32| {
            let e = crate::model::exp::exp(l - max);
            if e.is_nan() { 0.0 } else { e }
        };
        let sum: f64 = row
            .chunks(64)
            .map(|block| {
                let mut lanes = [0.0f32; 8];
                let mut eights = block.chunks_exact(8);
                for eight in &mut eights {
                    for (acc, &l) in lanes.iter_mut().zip(eight) {
                        *acc += term(l);
                    }
                }
                let rest: f32 = eights.remainder().iter().map(|&l| term(l)).sum();
                f64::from(lanes.iter().sum::<f32>() + rest)
            })
            .sum();
        f64::from(max) + sum.ln()
    } else if max == f32::INFINITY {
        (row.iter().filter(|&&l| l == f32::INFINITY).count() as f64).ln()
    } else {
        f64::NEG_INFINITY
    };
    let lp = |l: f32| -> f32 {
        match (l, max) {
            (l, _) if l.is_nan() || lse == f64::NEG_INFINITY => f32::NEG_INFINITY,
            (f32::INFINITY, f32::INFINITY) => (-lse) as f32,
            (_, f32::INFINITY) => f32::NEG_INFINITY,
            (l, _) => (f64::from(l) - lse) as f32,
        }
    };
    TokenLogprobs {
        token: chosen,
        logprob: row
            .get(chosen as usize)
            .map_or(f32::NEG_INFINITY, |&l| lp(l)),
        top: best.into_iter().map(|(id, l)| (id, lp(l))).collect(),
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
        if *p <= 0.0 {
            // Never drawn, not even by the rounding fallback below (a token a grammar masked
            // out has probability 0).
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
        offer_greedy(&mut best, id, l);
    }
    best.map_or(0, |b| b.0)
}

fn offer_greedy(best: &mut Option<(u32, f32)>, id: u32, l: f32) {
    if !l.is_nan() && best.is_none_or(|(_, b)| l > b) {
        *best = Some((id, l));
    }
}

/// [`greedy`] over a row, a block at a time: a block is looked into only if its largest
/// logit beats the best so far.
fn greedy_of(row: PenalisedRow<'_>) -> u32 {
    let mut best = None;
    row.blocks(|first, block| {
        if best.is_none_or(|(_, b)| block_max(block) > b) {
            for (i, &l) in block.iter().enumerate() {
                offer_greedy(&mut best, first + i as u32, l);
            }
        }
    });
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
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            logit_bias: Vec::new(),
        }
    }

    /// OpenAI's penalties, as its documentation writes them, on a whole row: `mu[j] -
    /// c[j] * frequency - (c[j] > 0) * presence` with `c[j]` the times token j was generated.
    fn openai_penalised(
        logits: &[f32],
        generated: &[u32],
        presence: f32,
        frequency: f32,
    ) -> Vec<f32> {
        logits
            .iter()
            .enumerate()
            .map(|(j, &mu)| {
                let c = generated.iter().filter(|&&t| t as usize == j).count() as f32;
                mu - c * frequency - if c > 0.0 { presence } else { 0.0 }
            })
            .collect()
    }

    #[test]
    fn presence_and_frequency_penalties_follow_openais_formula_over_the_completion() {
        let mut rng = Rng::new(11);
        let n = 50;
        for case in 0..200 {
            let logits: Vec<f32> = (0..n)
                .map(|_| (rng.next_f64() * 8.0 - 4.0) as f32)
                .collect();
            let prompt: Vec<u32> = (0..5).map(|_| (rng.next_u64() % n as u64) as u32).collect();
            let generated: Vec<u32> = (0..(case % 9))
                .map(|_| (rng.next_u64() % n as u64) as u32)
                .collect();
            let (presence, frequency) = ((case % 5) as f32 * 0.5 - 1.0, (case % 7) as f32 * 0.3);
            let config = SamplerConfig {
                presence_penalty: presence,
                frequency_penalty: frequency,
                ..cfg(0.0, 0, 1.0)
            };
            let mut s = Sampler::new(config.clone());
            // The prompt does not count: only what was generated since start_completion.
            prompt.iter().for_each(|&t| s.accept(t));
            s.start_completion();
            generated.iter().for_each(|&t| s.accept(t));
            let want = openai_penalised(&logits, &generated, presence, frequency);
            let best = want
                .iter()
                .enumerate()
                .fold(
                    (0, f32::NEG_INFINITY),
                    |b, (i, &l)| if l > b.1 { (i, l) } else { b },
                );
            assert_eq!(s.sample(&logits) as usize, best.0, "case {case}");
            // With sampling (no top-k/top-p) the candidates carry the penalised logits.
            let mut s = Sampler::new(SamplerConfig {
                temperature: 1.0,
                ..config
            });
            s.start_completion();
            generated.iter().for_each(|&t| s.accept(t));
            s.sample(&logits);
            for &(id, l) in &s.candidates {
                assert_eq!(l, want[id as usize], "case {case} id {id}");
            }
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
    fn set_recent_keeps_the_last_repeat_last_n_tokens_of_the_context() {
        let penalised = |s: &mut Sampler, t: u32| {
            // Token t has the larger logit, 4.0, unless the penalty (2.0) halves it below 3.0.
            let mut row = [3.0f32; 8];
            row[t as usize] = 4.0;
            let other = if t == 0 { 1 } else { 0 };
            row[other] = 3.5;
            s.sample(&row) != t
        };
        let mut s = Sampler::new(SamplerConfig {
            repeat_penalty: 2.0,
            repeat_last_n: 3,
            ..cfg(0.0, 0, 1.0)
        });
        for t in [5, 6, 7] {
            s.accept(t);
        }
        assert!(penalised(&mut s, 7));
        // Rewound to a context of 1 2 3 4: 7 is gone, and only the last three count.
        s.set_recent(&[1, 2, 3, 4]);
        assert!(!penalised(&mut s, 7));
        assert!(!penalised(&mut s, 1));
        for t in [2, 3, 4] {
            assert!(penalised(&mut s, t), "{t}");
        }
        // The window still slides from there.
        s.accept(6);
        assert!(!penalised(&mut s, 2));
        assert!(penalised(&mut s, 6));
        s.set_recent(&[]);
        assert!(!penalised(&mut s, 6));
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

    /// The candidates as the sampler chose them before the single pass: every logit, the
    /// penalty applied in place, the whole row sorted, then cut to k.
    fn reference_candidates(
        logits: &[f32],
        recent: &[u32],
        penalty: f32,
        k: usize,
    ) -> Vec<(u32, f32)> {
        let mut c: Vec<(u32, f32)> = logits
            .iter()
            .enumerate()
            .map(|(i, &l)| (i as u32, l))
            .collect();
        let mut seen = recent.to_vec();
        seen.sort_unstable();
        seen.dedup();
        for t in seen {
            if let Some(cand) = c.get_mut(t as usize) {
                cand.1 = if cand.1 > 0.0 {
                    cand.1 / penalty
                } else {
                    cand.1 * penalty
                };
            }
        }
        c.sort_by(by_logit);
        if k > 0 {
            c.truncate(k);
        }
        c
    }

    #[test]
    fn the_single_pass_top_k_keeps_what_a_full_sort_keeps() {
        let mut rng = Rng::new(5);
        // Few distinct values (ties everywhere), NaN, infinities and signed zeros.
        let pool = [
            -3.0f32,
            -1.0,
            -0.0,
            0.0,
            0.5,
            1.0,
            2.0,
            7.0,
            f32::NAN,
            f32::INFINITY,
            f32::NEG_INFINITY,
        ];
        for trial in 0..300 {
            let n = 1 + (rng.next_u64() % 200) as usize;
            let logits: Vec<f32> = (0..n)
                .map(|_| pool[(rng.next_u64() % pool.len() as u64) as usize])
                .collect();
            let recent: Vec<u32> = (0..(rng.next_u64() % 8))
                .map(|_| (rng.next_u64() % (n as u64 + 3)) as u32)
                .collect();
            let penalty = [1.0f32, 1.3, 2.0][trial % 3];
            for k in [1usize, 2, 5, 40, n.saturating_sub(1).max(1)] {
                if k >= n {
                    continue;
                }
                let mut s = Sampler::new(SamplerConfig {
                    repeat_penalty: penalty,
                    ..cfg(1.0, k, 1.0)
                });
                recent.iter().for_each(|&t| s.accept(t));
                let _ = s.distribution(&logits);
                let want = reference_candidates(&logits, &recent, penalty, k);
                let same = s.candidates.len() == want.len()
                    && s.candidates
                        .iter()
                        .zip(&want)
                        .all(|(a, b)| a.0 == b.0 && a.1.to_bits() == b.1.to_bits());
                assert!(
                    same,
                    "trial {trial} k {k}: {:?} vs {want:?} from {logits:?}",
                    s.candidates
                );
            }
            // Greedy reads the same penalised row.
            let mut s = Sampler::new(SamplerConfig {
                repeat_penalty: penalty,
                ..cfg(0.0, 40, 1.0)
            });
            recent.iter().for_each(|&t| s.accept(t));
            let full = reference_candidates(&logits, &recent, penalty, 0);
            let mut by_id = full.clone();
            by_id.sort_by_key(|c| c.0);
            assert_eq!(s.sample(&logits), greedy(&by_id), "trial {trial}");
        }
    }

    /// The log-softmax of a row the plain way: every logit in f64, `ln(exp(l) / Σ exp)`
    /// with the sum over the whole row (no max taken out: the test rows stay small), ranked
    /// by a full sort.
    fn naive_log_softmax(row: &[f32]) -> Vec<(u32, f64)> {
        let sum: f64 = row.iter().map(|&l| f64::from(l).exp()).sum();
        let mut all: Vec<(u32, f64)> = row
            .iter()
            .enumerate()
            .map(|(i, &l)| (i as u32, (f64::from(l).exp() / sum).ln()))
            .collect();
        all.sort_by(|a, b| b.1.partial_cmp(&a.1).unwrap().then(a.0.cmp(&b.0)));
        all
    }

    #[test]
    fn token_logprobs_are_the_log_softmax_of_the_raw_row() {
        let mut rng = Rng::new(23);
        for trial in 0..200 {
            let n = 1 + (rng.next_u64() % 300) as usize;
            // Ties now and then: values on a grid of quarters.
            let row: Vec<f32> = (0..n)
                .map(|_| ((rng.next_f64() * 40.0 - 20.0) * 4.0).round() as f32 / 4.0)
                .collect();
            let want = naive_log_softmax(&row);
            let chosen = (rng.next_u64() % n as u64) as u32;
            for top in [0usize, 1, 3, 5, 20, 25] {
                let got = token_logprobs(&row, chosen, top);
                assert_eq!(got.token, chosen);
                let exact = want.iter().find(|w| w.0 == chosen).unwrap().1;
                assert!(
                    (f64::from(got.logprob) - exact).abs() < 1e-5,
                    "trial {trial}: {} vs {exact}",
                    got.logprob
                );
                let k = top.min(MAX_TOP_LOGPROBS).min(n);
                assert_eq!(got.top.len(), k, "trial {trial} top {top}");
                for (g, w) in got.top.iter().zip(&want) {
                    assert_eq!(g.0, w.0, "trial {trial} top {top}: {:?}", got.top);
                    assert!((f64::from(g.1) - w.1).abs() < 1e-5, "trial {trial}");
                }
            }
        }
        // The probabilities of the whole row sum to 1.
        let row: Vec<f32> = (0..20).map(|i| (i as f32 * 0.37).sin() * 3.0).collect();
        let total: f64 = (0..20)
            .map(|t| f64::from(token_logprobs(&row, t, 0).logprob).exp())
            .sum();
        assert!((total - 1.0).abs() < 1e-6, "{total}");
    }

    #[test]
    fn token_logprobs_ignore_the_penalties_and_take_degenerate_rows() {
        // Large logits: the max is taken out before exp (the naive form would overflow).
        let got = token_logprobs(&[1000.0, 1000.0 + 2.0f32.ln()], 0, 2);
        // (1000 + ln 2 in f32 is off by up to half an ulp of 1000, 3e-5.)
        assert!((got.logprob - (1.0f32 / 3.0).ln()).abs() < 1e-4);
        assert_eq!(got.top[0].0, 1);
        // NaN and −∞ have no probability; an id outside the row neither.
        let got = token_logprobs(&[f32::NAN, 0.0, f32::NEG_INFINITY, 0.0], 0, 4);
        assert_eq!(got.logprob, f32::NEG_INFINITY);
        let half = -(2.0f32.ln());
        assert!(got.top[0].0 == 1 && (got.top[0].1 - half).abs() < 1e-6);
        assert!(got.top[1].0 == 3 && (got.top[1].1 - half).abs() < 1e-6);
        assert_eq!(got.top[2], (2, f32::NEG_INFINITY));
        assert_eq!(token_logprobs(&[0.0], 5, 0).logprob, f32::NEG_INFINITY);
        // +∞ logits share all the mass; a row with no number has none.
        let got = token_logprobs(&[f32::INFINITY, 3.0, f32::INFINITY], 2, 1);
        assert!((got.logprob - half).abs() < 1e-6);
        assert_eq!(
            token_logprobs(&[f32::INFINITY, 3.0], 1, 0).logprob,
            f32::NEG_INFINITY
        );
        let none = token_logprobs(&[f32::NEG_INFINITY, f32::NAN], 0, 1);
        assert_eq!(none.logprob, f32::NEG_INFINITY);
        assert_eq!(none.top.len(), 1);
        // A sampler with penalties decides on penalised logits; the logprobs stay the raw
        // row's.
        let row = [4.0f32, 3.0];
        let mut s = Sampler::new(SamplerConfig {
            repeat_penalty: 2.0,
            ..cfg(0.0, 0, 1.0)
        });
        s.accept(0);
        assert_eq!(s.sample(&row), 1);
        let got = token_logprobs(&row, 1, 1);
        assert!((f64::from(got.logprob) - naive_log_softmax(&row)[1].1).abs() < 1e-6);
        assert_eq!(got.top[0].0, 0);
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

    #[test]
    fn logit_bias_shifts_and_bans() {
        let logits = [1.0f32, 3.0, 2.0, 0.5];
        let with = |bias: Vec<(u32, f32)>, temperature: f32| {
            let mut s = Sampler::new(SamplerConfig {
                temperature,
                logit_bias: bias,
                seed: 5,
                ..SamplerConfig::default()
            });
            (0..64).map(|_| s.sample(&logits)).collect::<Vec<_>>()
        };
        assert!(with(vec![], 0.0).iter().all(|&t| t == 1));
        // Banned: the next best wins, greedy; sampled, it never comes.
        assert!(
            with(vec![(1, f32::NEG_INFINITY)], 0.0)
                .iter()
                .all(|&t| t == 2)
        );
        assert!(!with(vec![(1, f32::NEG_INFINITY)], 1.0).contains(&1));
        // +3 on token 3 (0.5 + 3 = 3.5 > 3).
        assert!(with(vec![(3, 3.0)], 0.0).iter().all(|&t| t == 3));
        // An id past the row changes nothing.
        assert!(with(vec![(99, 100.0)], 0.0).iter().all(|&t| t == 1));
    }
}
