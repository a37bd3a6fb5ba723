//! Where a linear goes: its padded shape, its K segments, each lane's columns (shard) and the
//! IOMMU domain of its memories. Decided once, when the linear is made resident.

use std::sync::Arc;

use rknn_chip::ElemKind;
use rustc_hash::FxHashMap;

use super::config::{EngineConfig, MAX_EXACT_K_W8A8};
use super::format::WeightFormat;
use crate::error::{Error, Result};
use crate::safe::runtime::Runtime;

/// A linear's plan: its shape padded to the chip's alignment, its K segments and each lane's
/// columns.
#[derive(Clone, Debug)]
pub(crate) struct LinearPlan {
    pub(crate) n: usize,
    pub(crate) k: usize,
    pub(crate) k_pad: usize,
    pub(crate) n_pad: usize,
    /// (first K row, rows) per segment.
    pub(crate) segments: Arc<[(usize, usize)]>,
    /// Each lane's columns, if it holds any.
    pub(crate) shards: Vec<Option<ShardPlan>>,
    /// The widest context: each shard is split into blocks of at most this many columns
    /// (a multiple of `n_align`).
    pub(crate) n_block: usize,
    /// The chip's N alignment for the format.
    pub(crate) n_align: usize,
}

impl LinearPlan {
    /// The plan of W [n, k] in `format` on `lanes` lanes of `rt`'s chip: the shape checked
    /// against the chip's rules and padded to its alignment, K split where the chip says
    /// (8192 on RK3588: one context above it ran 14x slower), else below its K limit (a chip
    /// with neither takes K in one context), N split over the lanes in whole aligned blocks,
    /// and each lane's columns into contexts of at most `n_limit` columns.
    pub(crate) fn new(
        rt: &Runtime,
        lanes: usize,
        n: usize,
        k: usize,
        format: WeightFormat,
        n_limit: usize,
    ) -> Result<LinearPlan> {
        rknn_chip::check_dims(1, k, n)?;
        if format == WeightFormat::W8A8 && k > MAX_EXACT_K_W8A8 {
            return Err(Error::KTooLargeForExactSum {
                k,
                max: MAX_EXACT_K_W8A8,
            });
        }
        let (ka, na) = alignment(rt, format)?;
        let n_block = n_limit - n_limit % na;
        if n_block == 0 {
            return Err(Error::EngineConfig {
                field: "max_n_per_context",
                value: n_limit,
                rule: format!(
                    "is below {}'s N alignment of {na} for {}: a context holds whole aligned columns",
                    rt.platform(),
                    format.name()
                ),
            });
        }
        let round = |v: usize, a: usize| v.div_ceil(a) * a;
        let (k_pad, n_pad) = (round(k, ka), round(n, na));
        if k_pad.checked_mul(n_pad).is_none() {
            return Err(Error::SizeOverflow {
                what: "padded weight elements (N × K)",
                value: (k_pad as u128 * n_pad as u128).to_string(),
                limit: "usize",
            });
        }
        let seg = rt
            .platform()
            .k_segment()
            .or(rt.shape_rules().max_k)
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
            shards: plan_shards(n, n_pad, na, lanes),
            n_block,
            n_align: na,
        })
    }

    /// The blocks of a lane's shard, each one context (per K segment) wide: columns relative
    /// to the shard, as equal as the alignment allows.
    pub(crate) fn blocks(&self, shard: &ShardPlan) -> Vec<ShardPlan> {
        let count = shard.width.div_ceil(self.n_block);
        plan_shards(shard.valid, shard.width, self.n_align, count)
            .into_iter()
            .flatten()
            .collect()
    }

    /// The contexts of the linear (every lane's blocks times the K segments).
    pub(crate) fn contexts(&self) -> usize {
        self.shards
            .iter()
            .flatten()
            .map(|p| self.blocks(p).len() * self.segments.len())
            .sum()
    }

    /// Each lane's NPU memory for this linear: its B, and the A and C its contexts run with
    /// (one pair per lane and domain when the contexts share them, else one per context).
    pub(crate) fn lane_needs(
        &self,
        cfg: &EngineConfig,
        format: WeightFormat,
        share: bool,
    ) -> Vec<LaneNeed> {
        let (eb, ec) = format.bytes();
        let ks_max = self.segments.iter().map(|s| s.1).max().unwrap_or(0) as u64;
        let (max_m, segs) = (cfg.max_m as u64, self.segments.len() as u64);
        self.shards
            .iter()
            .enumerate()
            .filter_map(|(lane, p)| {
                let p = p.as_ref()?;
                let blocks = self.blocks(p);
                let widest = blocks.iter().map(|b| b.width).max().unwrap_or(0) as u64;
                let w = p.width as u64;
                let contexts = blocks.len() * self.segments.len();
                let (a, c) = if share {
                    (max_m * ks_max * eb, max_m * widest * ec)
                } else {
                    (max_m * ks_max * eb * contexts as u64, max_m * w * ec * segs)
                };
                Some(LaneNeed {
                    lane,
                    b: w * self.k_pad as u64 * eb,
                    a,
                    c,
                    contexts,
                })
            })
            .collect()
    }
}

/// The chip's (K, N) alignment for `format`, from the chip rules and the runtime's shape rules.
pub(crate) fn alignment(rt: &Runtime, format: WeightFormat) -> Result<(usize, usize)> {
    let kind = format.align_kind();
    let t = format.matmul_type();
    rknn_chip::check_type(rt.platform(), t)?;
    let (ka, mut na) =
        rt.platform()
            .alignment(kind)
            .ok_or(rknn_chip::RuleViolation::UnsupportedType {
                platform: rt.platform(),
                t,
            })?;
    if kind == ElemKind::F16 {
        na = na.max(rt.shape_rules().f16_n_align);
    }
    Ok((ka, na))
}

/// Where the engine's NPU memory goes: bytes used per IOMMU domain, and the size of each
/// lane's shared A and C per (lane, domain, format), so that a linear is placed in the first
/// domain with room for its B memories and for whatever the shared pair must grow by.
#[derive(Default)]
pub(crate) struct DomainPlan {
    used: Vec<u64>,
    io: FxHashMap<(usize, i32, WeightFormat), (u64, u64)>,
}

/// One lane's memory needs for a new linear.
pub(crate) struct LaneNeed {
    lane: usize,
    b: u64,
    a: u64,
    c: u64,
    /// Its contexts (blocks × K segments), each with its own B.
    pub(crate) contexts: usize,
}

/// Where a linear went.
pub(crate) struct Placement {
    pub(crate) domain: i32,
    /// Its B bytes, given back when it is dropped.
    pub(crate) b_bytes: u64,
    /// Lanes whose shared A and C (of that domain and format) are allocated or grown for it:
    /// two more memories each while it is built.
    pub(crate) new_pairs: usize,
}

impl DomainPlan {
    /// The bytes a linear adds to domain `d`.
    fn delta(&self, d: i32, format: WeightFormat, share: bool, needs: &[LaneNeed]) -> u64 {
        needs
            .iter()
            .map(|n| {
                let io = if share {
                    let (a, c) = self.io.get(&(n.lane, d, format)).copied().unwrap_or((0, 0));
                    n.a.saturating_sub(a) + n.c.saturating_sub(c)
                } else {
                    n.a + n.c
                };
                n.b + io
            })
            .sum()
    }

    /// The bytes booked in each domain.
    pub(crate) fn used(&self) -> &[u64] {
        &self.used
    }

    /// Gives back a dropped linear's B bytes (the lanes' shared A and C stay).
    pub(crate) fn release(&mut self, d: i32, b: u64) {
        if let Some(u) = usize::try_from(d).ok().and_then(|d| self.used.get_mut(d)) {
            *u = u.saturating_sub(b);
        }
    }

    /// Places a linear in the first domain with room for it and books its bytes.
    pub(crate) fn place(
        &mut self,
        cap: u64,
        format: WeightFormat,
        share: bool,
        needs: &[LaneNeed],
    ) -> Result<Placement> {
        for d in 0.. {
            let di = usize::try_from(d).unwrap_or(usize::MAX);
            if di == self.used.len() {
                self.used.push(0);
            }
            let delta = self.delta(d, format, share, needs);
            if self.used[di].saturating_add(delta) <= cap {
                self.used[di] += delta;
                let mut new_pairs = 0;
                if share {
                    for n in needs {
                        let e = self.io.entry((n.lane, d, format)).or_default();
                        new_pairs += usize::from(n.a > e.0 || n.c > e.1);
                        *e = (e.0.max(n.a), e.1.max(n.c));
                    }
                }
                return Ok(Placement {
                    domain: d,
                    b_bytes: needs.iter().map(|n| n.b).sum(),
                    new_pairs,
                });
            }
            if self.used[di] == 0 {
                // Even an empty domain cannot hold it.
                return Err(Error::EngineConfig {
                    field: "iommu_domain_bytes",
                    value: usize::try_from(cap).unwrap_or(usize::MAX),
                    rule: format!("is smaller than one linear's {delta} bytes of NPU memory"),
                });
            }
        }
        unreachable!("the domain loop returns")
    }
}

/// One worker's columns of a linear.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ShardPlan {
    /// First output column.
    pub(crate) n0: usize,
    /// Columns (a multiple of the alignment).
    pub(crate) width: usize,
    /// Columns that exist in the output.
    pub(crate) valid: usize,
}

/// Splits `n_pad` aligned columns into `cores` shards of whole `align` blocks, as equal as
/// possible; `n` columns exist in the output.
pub(crate) fn plan_shards(
    n: usize,
    n_pad: usize,
    align: usize,
    cores: usize,
) -> Vec<Option<ShardPlan>> {
    let blocks = n_pad / align;
    let mut n0 = 0;
    (0..cores)
        .map(|i| {
            let b = blocks / cores + usize::from(i < blocks % cores);
            if b == 0 {
                return None;
            }
            let width = b * align;
            let valid = n.saturating_sub(n0).min(width);
            let p = ShardPlan { n0, width, valid };
            n0 += width;
            Some(p)
        })
        .collect()
}
