//! How a linear y \[m, n\] = x \[m, k\] × Wᵀ (W \[n, k\] resident on the NPU) is split into
//! matmul contexts and runs: its shape padded to the chip's alignment, K in segments, N over
//! the lanes (one per NPU core) in whole aligned blocks, each lane's columns in contexts of at
//! most `max_n_per_context` columns ([`LinearPlan`]); the rows in chunks of at most `max_m`
//! rows of A, each run at its bucket's M ([`m_chunks`], [`m_bucket`]).
//!
//! These are pure functions of shapes and the chip's numbers, and they live here because two
//! crates must give the same answer: the engine of `rknn-matmul` builds its contexts from
//! them, and the cost model of `rknn-emu` prices exactly the runs those contexts make. A change
//! to the split is a change to both.
//!
//! ```
//! use rknn_chip::plan::{Columns, LinearPlan, SplitRules};
//! use rknn_chip::{ElemKind, Platform};
//! // An int8 linear of 96 output columns and K = 15360 on RK3588's three cores.
//! let rules = SplitRules::for_chip(Platform::Rk3588, ElemKind::I8, 8192).unwrap();
//! let plan = LinearPlan::new(96, 15360, 3, &rules)?;
//! // K above RK3588's 8192-row segment: two segments, (first row, rows).
//! assert_eq!(plan.segments, [(0, 8192), (8192, 7168)]);
//! // N: one aligned block of 32 columns per lane.
//! let lanes: Vec<Columns> = plan.shards.iter().flatten().copied().collect();
//! assert_eq!(lanes[2], Columns { n0: 64, width: 32, valid: 32 });
//! assert_eq!(plan.contexts(), 6); // per lane: one block times two segments
//! # Ok::<(), rknn_chip::plan::PlanError>(())
//! ```

use crate::dtype::ElemKind;
use crate::platform::Platform;

/// The numbers a linear's split depends on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SplitRules {
    /// K alignment of the weights' element kind: K is padded to a multiple of it.
    pub k_align: usize,
    /// N alignment: N is padded to a multiple of it, and split only between aligned blocks.
    pub n_align: usize,
    /// The most K rows of one context, rounded down to `k_align`: the chip's K segment (8192 on
    /// RK3588, where one context above it ran 14× slower), or a runtime's K limit. `None`, or a
    /// value below `k_align`: K in one context.
    pub k_segment: Option<usize>,
    /// The most columns of one context, rounded down to `n_align` (at least `n_align`).
    pub max_n_per_context: usize,
}

impl SplitRules {
    /// `platform`'s rules for weights of `kind` ([`Platform::alignment`],
    /// [`Platform::k_segment`]), with contexts of at most `max_n_per_context` columns. `None`
    /// when the chip has no matmul on `kind`.
    pub fn for_chip(
        platform: Platform,
        kind: ElemKind,
        max_n_per_context: usize,
    ) -> Option<SplitRules> {
        let (k_align, n_align) = platform.alignment(kind)?;
        Some(SplitRules {
            k_align,
            n_align,
            k_segment: platform.k_segment(),
            max_n_per_context,
        })
    }
}

/// A linear that cannot be split.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PlanError {
    /// N or K is zero.
    #[error("a linear of N={n}, K={k} has no weights: N and K must be at least 1")]
    Empty {
        /// Output columns.
        n: usize,
        /// Input columns.
        k: usize,
    },
    /// No lane to put the columns on.
    #[error("a linear is split over at least one lane, not 0")]
    NoLanes,
    /// An alignment of zero.
    #[error("alignments must be at least 1 (K {k_align}, N {n_align})")]
    ZeroAlignment {
        /// The K alignment given.
        k_align: usize,
        /// The N alignment given.
        n_align: usize,
    },
    /// The widest context holds no whole aligned block.
    #[error(
        "max_n_per_context={max_n_per_context} is below the N alignment of {n_align}: a context holds whole aligned columns"
    )]
    ContextNarrowerThanAlignment {
        /// The limit given.
        max_n_per_context: usize,
        /// The N alignment.
        n_align: usize,
    },
    /// A lane past the plan's lanes.
    #[error("lane {lane} does not exist: the plan has {lanes} lanes (0..{lanes})")]
    NoSuchLane {
        /// The lane asked for.
        lane: usize,
        /// The plan's lanes.
        lanes: usize,
    },
    /// The padded weights' element count does not fit `usize`.
    #[error("the padded weights, N={n_pad} × K={k_pad}, overflow this machine's address space")]
    TooLarge {
        /// N padded to its alignment.
        n_pad: u128,
        /// K padded to its alignment.
        k_pad: u128,
    },
}

/// A run of whole aligned columns of a linear's output: a lane's shard, or one context's block
/// of it (then relative to the shard).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Columns {
    /// The first column.
    pub n0: usize,
    /// Columns, a multiple of the N alignment.
    pub width: usize,
    /// Those of them that exist in the output (the rest are padding).
    pub valid: usize,
}

/// A linear's plan: its shape padded to the chip's alignment, its K segments, each lane's
/// columns, and how wide a context may be. Every context is one of a lane's
/// [`blocks`](LinearPlan::blocks) times one of the [`segments`](LinearPlan::segments).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LinearPlan {
    /// Output columns.
    pub n: usize,
    /// Input columns (the reduction).
    pub k: usize,
    /// K padded to the K alignment.
    pub k_pad: usize,
    /// N padded to the N alignment.
    pub n_pad: usize,
    /// (first K row, rows) per segment, in order; together they cover `0..k_pad`.
    pub segments: Vec<(usize, usize)>,
    /// Each lane's columns, if it holds any (fewer aligned blocks than lanes leave the last
    /// lanes empty).
    pub shards: Vec<Option<Columns>>,
    /// The widest context: `max_n_per_context` rounded down to the N alignment.
    pub n_block: usize,
    /// The N alignment.
    pub n_align: usize,
}

impl LinearPlan {
    /// The plan of W \[n, k\] on `lanes` lanes: K and N padded to `rules`' alignment; K in
    /// segments of `rules.k_segment` rows (rounded down to the K alignment) and the rest, or in
    /// one; N split over the lanes in whole aligned blocks, as equal as they go (the first
    /// lanes one block more); each lane's columns in [`LinearPlan::blocks`] of at most
    /// [`LinearPlan::n_block`] columns.
    pub fn new(n: usize, k: usize, lanes: usize, rules: &SplitRules) -> Result<Self, PlanError> {
        let (ka, na) = (rules.k_align, rules.n_align);
        if lanes == 0 {
            return Err(PlanError::NoLanes);
        }
        if ka == 0 || na == 0 {
            return Err(PlanError::ZeroAlignment {
                k_align: ka,
                n_align: na,
            });
        }
        if n == 0 || k == 0 {
            return Err(PlanError::Empty { n, k });
        }
        let limit = rules.max_n_per_context;
        let n_block = limit - limit % na;
        if n_block == 0 {
            return Err(PlanError::ContextNarrowerThanAlignment {
                max_n_per_context: limit,
                n_align: na,
            });
        }
        let round = |v: usize, a: usize| v.div_ceil(a).checked_mul(a);
        let (k_pad, n_pad) = match (round(k, ka), round(n, na)) {
            (Some(kp), Some(np)) if kp.checked_mul(np).is_some() => (kp, np),
            _ => {
                let wide = |v: usize, a: usize| v.div_ceil(a) as u128 * a as u128;
                return Err(PlanError::TooLarge {
                    n_pad: wide(n, na),
                    k_pad: wide(k, ka),
                });
            }
        };
        let seg = rules
            .k_segment
            .map(|s| s - s % ka)
            .filter(|&s| s > 0)
            .unwrap_or(k_pad);
        let segments = (0..k_pad)
            .step_by(seg)
            .map(|k0| (k0, seg.min(k_pad - k0)))
            .collect();
        Ok(LinearPlan {
            n,
            k,
            k_pad,
            n_pad,
            segments,
            shards: split_columns(n, n_pad, na, lanes),
            n_block,
            n_align: na,
        })
    }

    /// The same linear whole on `lane`: every column in that lane's shard, the other lanes
    /// empty (a mixture of experts places each expert on one core, so the chosen experts of a
    /// token run on different cores at once, one run each, instead of each expert split over
    /// every core). Its blocks and segments follow the same rules as a split plan's.
    ///
    /// ```
    /// use rknn_chip::plan::{LinearPlan, SplitRules};
    /// let rules = SplitRules { k_align: 32, n_align: 32, k_segment: Some(8192), max_n_per_context: 4096 };
    /// let plan = LinearPlan::new(1000, 64, 3, &rules)?.on_lane(2)?;
    /// assert_eq!(plan.lane_contexts(), [0, 0, 1]);
    /// let whole = plan.shards[2].unwrap();
    /// assert_eq!((whole.n0, whole.width, whole.valid), (0, 1024, 1000));
    /// # Ok::<(), rknn_chip::plan::PlanError>(())
    /// ```
    pub fn on_lane(mut self, lane: usize) -> Result<Self, PlanError> {
        let lanes = self.shards.len();
        if lane >= lanes {
            return Err(PlanError::NoSuchLane { lane, lanes });
        }
        self.shards = vec![None; lanes];
        self.shards[lane] = Some(Columns {
            n0: 0,
            width: self.n_pad,
            valid: self.n,
        });
        Ok(self)
    }

    /// The lane holding every column, if one does ([`LinearPlan::on_lane`], or a plan whose
    /// other lanes got no aligned block).
    pub fn only_lane(&self) -> Option<usize> {
        let mut held = self.shards.iter().enumerate().filter(|(_, s)| s.is_some());
        match (held.next(), held.next()) {
            (Some((lane, _)), None) => Some(lane),
            _ => None,
        }
    }

    /// The blocks of a lane's `shard`, one context (per K segment) each: the fewest that are
    /// at most [`LinearPlan::n_block`] wide, as equal as the alignment allows (the first ones
    /// one aligned block wider), columns relative to the shard.
    pub fn blocks(&self, shard: &Columns) -> Vec<Columns> {
        let count = shard.width.div_ceil(self.n_block);
        if count == 0 || self.n_align == 0 {
            return Vec::new();
        }
        split_columns(shard.valid, shard.width, self.n_align, count)
            .into_iter()
            .flatten()
            .collect()
    }

    /// Each lane's contexts (its blocks times the K segments; 0 for a lane without columns).
    pub fn lane_contexts(&self) -> Vec<usize> {
        self.shards
            .iter()
            .map(|s| s.map_or(0, |s| self.blocks(&s).len() * self.segments.len()))
            .collect()
    }

    /// The contexts of the linear, over every lane.
    pub fn contexts(&self) -> usize {
        self.lane_contexts().iter().sum()
    }
}

/// Splits `n_pad` columns into `parts` runs of whole `align` blocks, as equal as possible (the
/// first ones one block more); `n` columns exist. A part without a block is `None`.
fn split_columns(n: usize, n_pad: usize, align: usize, parts: usize) -> Vec<Option<Columns>> {
    let blocks = n_pad / align;
    let mut n0 = 0;
    (0..parts)
        .map(|i| {
            let b = blocks / parts + usize::from(i < blocks % parts);
            if b == 0 {
                return None;
            }
            let width = b * align;
            let valid = n.saturating_sub(n0).min(width);
            let c = Columns { n0, width, valid };
            n0 += width;
            Some(c)
        })
        .collect()
}

/// Up to this many rows of A, every M is its own bucket ([`m_bucket`]).
pub const EXACT_M_BUCKETS: usize = 32;

/// The context M that `m` rows of A run at, with contexts of at most `max_m` rows: `m` itself
/// up to [`EXACT_M_BUCKETS`] (decode is 1, or 2 with residual activations; a speculative
/// verify pass a few more: padding rows would cost as much as real ones), 64 up to 64, else
/// `m` rounded up to a multiple of 128 (prefill chunks: 300 rows run at 384, not 512, which
/// the field measured as +19 % prefill); at most `max_m`.
///
/// ```
/// use rknn_chip::plan::m_bucket;
/// assert_eq!([1, 32, 33, 64, 65, 300, 600].map(|m| m_bucket(m, 512)), [1, 32, 64, 64, 128, 384, 512]);
/// ```
pub fn m_bucket(m: usize, max_m: usize) -> usize {
    if m <= EXACT_M_BUCKETS {
        m.max(1)
    } else if m <= 64 {
        64
    } else {
        m.div_ceil(128) * 128
    }
    .min(max_m)
}

/// Every bucket of [`m_bucket`]: 1, 2, ..., [`EXACT_M_BUCKETS`], 64, then 128, 256, ...,
/// `max_m` (the M values of a dynamic-shape context).
pub fn m_buckets(max_m: usize) -> Vec<usize> {
    (1..=EXACT_M_BUCKETS)
        .chain(std::iter::once(64))
        .chain((128..=max_m).step_by(128))
        .collect()
}

/// One chunk of a forward's input rows ([`m_chunks`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MChunk {
    /// Its first input row.
    pub first: usize,
    /// Its input rows.
    pub rows: usize,
    /// The context M it runs at: its rows of A (`rows` × rows of A per input row) rounded up
    /// to their [`m_bucket`].
    pub m: usize,
}

/// The chunks a forward over `rows` input rows runs in, when each input row takes
/// `rows_per_input` rows of A (2 with residual activations) and a context at most `max_m`:
/// `max_m / rows_per_input` input rows each (at least one), the last one the rest. No chunk for
/// no rows.
///
/// ```
/// use rknn_chip::plan::{MChunk, m_chunks};
/// let chunks: Vec<MChunk> = m_chunks(300, 2, 512).collect();
/// assert_eq!(chunks, [MChunk { first: 0, rows: 256, m: 512 }, MChunk { first: 256, rows: 44, m: 128 }]);
/// ```
pub fn m_chunks(rows: usize, rows_per_input: usize, max_m: usize) -> impl Iterator<Item = MChunk> {
    let per = rows_per_input.max(1);
    let chunk = (max_m / per).max(1);
    (0..rows).step_by(chunk).map(move |first| {
        let n = chunk.min(rows - first);
        MChunk {
            first,
            rows: n,
            m: m_bucket(n * per, max_m),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(ka: usize, na: usize, seg: Option<usize>, max_n: usize) -> SplitRules {
        SplitRules {
            k_align: ka,
            n_align: na,
            k_segment: seg,
            max_n_per_context: max_n,
        }
    }

    /// Every plan covers its padded shape exactly: segments tile `0..k_pad`, the lanes' shards
    /// tile `0..n_pad` in order, each lane's blocks tile its shard, every width is aligned and
    /// no wider than `n_block`, and the valid columns add up to `n`.
    #[test]
    fn plans_tile_the_padded_shape() {
        let mut rng = fastrand::Rng::with_seed(7);
        for _ in 0..2000 {
            let ka = [1, 16, 32][rng.usize(..3)];
            let na = [1, 8, 16, 32, 64][rng.usize(..5)];
            let seg = [None, Some(rng.usize(1..20000))][rng.usize(..2)];
            let r = rules(ka, na, seg, rng.usize(na..=20000));
            let (n, k, lanes) = (rng.usize(1..60000), rng.usize(1..30000), rng.usize(1..=4));
            let p = LinearPlan::new(n, k, lanes, &r).unwrap();
            assert_eq!((p.n_pad % na, p.k_pad % ka), (0, 0));
            assert!(p.n_pad >= n && p.n_pad - n < na && p.k_pad >= k && p.k_pad - k < ka);
            let mut k0 = 0;
            for &(s0, ks) in &p.segments {
                assert_eq!(s0, k0);
                assert!(ks > 0 && ks % ka == 0);
                k0 += ks;
            }
            assert_eq!(k0, p.k_pad);
            let (mut n0, mut valid) = (0, 0);
            assert_eq!(p.shards.len(), lanes);
            for s in p.shards.iter().flatten() {
                assert_eq!(s.n0, n0);
                let blocks = p.blocks(s);
                let (mut c0, mut bvalid) = (0, 0);
                for b in &blocks {
                    assert_eq!(b.n0, c0);
                    assert!(b.width % na == 0 && b.width <= p.n_block && b.width > 0);
                    c0 += b.width;
                    bvalid += b.valid;
                }
                assert_eq!((c0, bvalid), (s.width, s.valid));
                // The fewest blocks, as equal as the alignment allows.
                assert_eq!(blocks.len(), s.width.div_ceil(p.n_block));
                let widths = blocks.iter().map(|b| b.width);
                assert!(widths.clone().max().unwrap() - widths.min().unwrap() <= na);
                n0 += s.width;
                valid += s.valid;
            }
            assert_eq!((n0, valid), (p.n_pad, n));
            // The lanes' shards differ by at most one aligned block, the wider ones first.
            let w: Vec<usize> = p.shards.iter().map(|s| s.map_or(0, |s| s.width)).collect();
            assert!(
                w.windows(2).all(|x| x[0] >= x[1] && x[0] - x[1] <= na),
                "{w:?}"
            );
            let contexts: usize = p
                .shards
                .iter()
                .flatten()
                .map(|s| p.blocks(s).len() * p.segments.len())
                .sum();
            assert_eq!(p.contexts(), contexts);
        }
    }

    #[test]
    fn rk3588_segments_and_blocks() {
        let r = SplitRules::for_chip(Platform::Rk3588, ElemKind::I8, 8192).unwrap();
        assert_eq!((r.k_align, r.n_align, r.k_segment), (32, 32, Some(8192)));
        // K = 8192 is one segment, 8193 pads to 8224: 8192 and 32.
        let p = LinearPlan::new(64, 8192, 3, &r).unwrap();
        assert_eq!(p.segments, [(0, 8192)]);
        let p = LinearPlan::new(64, 8193, 3, &r).unwrap();
        assert_eq!(p.segments, [(0, 8192), (8192, 32)]);
        // N = 64: two blocks of 32 over three lanes, the third empty.
        assert_eq!(
            p.shards,
            [
                Some(Columns {
                    n0: 0,
                    width: 32,
                    valid: 32
                }),
                Some(Columns {
                    n0: 32,
                    width: 32,
                    valid: 32
                }),
                None
            ]
        );
        assert_eq!(p.lane_contexts(), [2, 2, 0]);
        // Qwen2-0.5B's head (151 936 columns): 4748 blocks of 32, 1583 + 1583 + 1582 per lane;
        // 50 656 columns in ceil(50 656 / 8192) = 7 contexts, 7 + 7 + 7 in all.
        let p = LinearPlan::new(151_936, 896, 3, &r).unwrap();
        let w: Vec<usize> = p.shards.iter().flatten().map(|s| s.width).collect();
        assert_eq!(w, [1583 * 32, 1583 * 32, 1582 * 32]);
        assert_eq!(p.lane_contexts(), [7, 7, 7]);
        // 1583 = 7 × 226 + 1 blocks in 7 contexts: 227 in the first, 226 in the rest.
        let b: Vec<usize> = p
            .blocks(&p.shards[0].unwrap())
            .iter()
            .map(|b| b.width / 32)
            .collect();
        assert_eq!(b, [227, 226, 226, 226, 226, 226, 226]);
        // The valid columns end in the last lane: N is a multiple of 32, no padding.
        assert_eq!(p.shards[2].unwrap().valid, 1582 * 32);
    }

    #[test]
    fn the_limit_and_the_segment_round_down_to_the_alignment() {
        // 100 columns per context at alignment 32: 96.
        let p = LinearPlan::new(1000, 64, 1, &rules(32, 32, None, 100)).unwrap();
        assert_eq!(p.n_block, 96);
        assert_eq!(p.contexts(), 1024usize.div_ceil(96));
        // A segment of 100 rows at alignment 32: 96; one below the alignment: K in one.
        let p = LinearPlan::new(8, 300, 1, &rules(32, 8, Some(100), 64)).unwrap();
        assert_eq!(p.segments, [(0, 96), (96, 96), (192, 96), (288, 32)]);
        let p = LinearPlan::new(8, 300, 1, &rules(32, 8, Some(31), 64)).unwrap();
        assert_eq!(p.segments, [(0, 320)]);
    }

    #[test]
    fn bad_shapes_and_rules_are_typed_errors() {
        let r = rules(32, 32, Some(8192), 8192);
        assert_eq!(
            LinearPlan::new(0, 64, 3, &r),
            Err(PlanError::Empty { n: 0, k: 64 })
        );
        assert_eq!(
            LinearPlan::new(64, 0, 3, &r),
            Err(PlanError::Empty { n: 64, k: 0 })
        );
        assert_eq!(LinearPlan::new(64, 64, 0, &r), Err(PlanError::NoLanes));
        assert_eq!(
            LinearPlan::new(64, 64, 1, &rules(0, 32, None, 64)),
            Err(PlanError::ZeroAlignment {
                k_align: 0,
                n_align: 32
            })
        );
        let err = LinearPlan::new(64, 64, 1, &rules(32, 32, None, 31)).unwrap_err();
        assert_eq!(
            err.to_string(),
            "max_n_per_context=31 is below the N alignment of 32: a context holds whole aligned columns"
        );
        let err = LinearPlan::new(usize::MAX - 1, 64, 1, &r).unwrap_err();
        let n_pad = (usize::MAX as u128).div_ceil(32) * 32;
        assert_eq!(err, PlanError::TooLarge { n_pad, k_pad: 64 });
        let err = LinearPlan::new(1 << 40, 1 << 40, 1, &r).unwrap_err();
        assert!(matches!(err, PlanError::TooLarge { .. }), "{err}");
        // A shard without columns has no blocks.
        let p = LinearPlan::new(64, 64, 1, &r).unwrap();
        let none = Columns {
            n0: 0,
            width: 0,
            valid: 0,
        };
        assert!(p.blocks(&none).is_empty());
    }

    #[test]
    fn m_buckets_and_chunks() {
        assert_eq!(m_bucket(0, 512), 1);
        assert_eq!(m_bucket(5, 512), 5);
        assert_eq!(m_bucket(256, 128), 128);
        let b = m_buckets(512);
        assert_eq!(b.len(), 32 + 1 + 4);
        assert_eq!(b[31..], [32, 64, 128, 256, 384, 512]);
        // Every M up to max_m runs at a bucket no smaller than itself.
        for m in 1..=512 {
            let bucket = m_bucket(m, 512);
            assert!(b.contains(&bucket) && bucket >= m, "{m}");
        }
        assert_eq!(m_chunks(0, 1, 512).count(), 0);
        let c: Vec<MChunk> = m_chunks(1100, 1, 512).collect();
        assert_eq!(
            c.iter().map(|c| (c.first, c.rows, c.m)).collect::<Vec<_>>(),
            [(0, 512, 512), (512, 512, 512), (1024, 76, 128)]
        );
        // Decode with residual activations: one input row, two rows of A.
        assert_eq!(
            m_chunks(1, 2, 512).collect::<Vec<_>>(),
            [MChunk {
                first: 0,
                rows: 1,
                m: 2
            }]
        );
        // Rows of A per input row above max_m: one input row per chunk, at max_m.
        assert!(m_chunks(3, 4, 2).all(|c| c.rows == 1 && c.m == 2));
    }
}
