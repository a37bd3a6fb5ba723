//! Where a linear goes: its plan (padded shape, K segments, each lane's columns, the contexts'
//! widths), made by the SDK's one planner ([`rknn_chip::plan`], which the cost model of the
//! emulator prices too) from this runtime's rules, and the IOMMU domain of its memories.
//! Decided once, when the linear is made resident.

use rknn_chip::ElemKind;
use rknn_chip::plan::{LinearPlan, PlanError, SplitRules};
use rustc_hash::FxHashMap;

use super::config::EngineConfig;
use super::format::{EngineKind, WeightFormat, with_format};
use crate::error::{Error, Result};
use crate::safe::runtime::Runtime;

/// The plan of W [n, k] in `format` on `lanes` lanes of `rt`'s chip: the shape checked
/// against the chip's rules, then split by [`LinearPlan::new`] with [`split_rules`]. With a
/// per-group int4 size `group` ([`super::config::LinearOptions::int4_group`], checked here
/// first), K is padded to a multiple of the group, so that every K segment holds whole
/// groups.
pub(crate) fn linear_plan(
    rt: &Runtime,
    lanes: usize,
    (n, k): (usize, usize),
    format: WeightFormat,
    group: Option<usize>,
    n_limit: usize,
) -> Result<LinearPlan> {
    rknn_chip::check_dims(1, k, n)?;
    if let Some(max) = with_format!(format, K => <K as EngineKind>::MAX_EXACT_K).filter(|&m| k > m)
    {
        return Err(Error::KTooLargeForExactSum { k, max });
    }
    let mut rules = split_rules(rt, format, n_limit)?;
    check_group(group, format, rt.platform(), rules.k_align, rules.k_segment)?;
    if let Some(g) = group {
        // A multiple of the K alignment (checked): the group is the coarser alignment.
        rules.k_align = g;
    }
    LinearPlan::new(n, k, lanes, &rules).map_err(|e| match e {
        PlanError::ContextNarrowerThanAlignment { n_align, .. } => Error::EngineConfig {
            field: "max_n_per_context",
            value: n_limit,
            rule: format!(
                "is below {}'s N alignment of {n_align} for {}: a context holds whole aligned columns",
                rt.platform(),
                format.name()
            ),
        },
        PlanError::TooLarge { n_pad, k_pad } => Error::SizeOverflow {
            what: "padded weight elements (N × K)",
            value: (k_pad * n_pad).to_string(),
            limit: "usize",
        },
        e => Error::Plan(e),
    })
}

/// Checks a per-group int4 size ([`super::config::LinearOptions::int4_group`]) against the format and the
/// chip: W4A16 only, a multiple of the int4 K alignment `k_align`, dividing the K segment
/// `k_segment` (if the chip has one).
pub(crate) fn check_group(
    group: Option<usize>,
    format: WeightFormat,
    platform: rknn_chip::Platform,
    k_align: usize,
    k_segment: Option<usize>,
) -> Result<()> {
    let Some(g) = group else {
        return Ok(());
    };
    let bad = |rule: String| {
        Err(Error::EngineConfig {
            field: "int4_group",
            value: g,
            rule,
        })
    };
    if format != WeightFormat::W4A16 {
        return bad(format!(
            "is for w4a16 only, not {format}: the NPU applies per-group scales only to a float C (W4A8's C is i32), and the other formats have no int4 weights"
        ));
    }
    if g % k_align != 0 {
        return bad(format!(
            "must be a multiple of {platform}'s int4 K alignment of {k_align} (a group is whole aligned K rows)"
        ));
    }
    if let Some(s) = k_segment.filter(|s| s % g != 0) {
        return bad(format!(
            "must divide {platform}'s K segment of {s} (each segment's context holds whole groups)"
        ));
    }
    Ok(())
}

/// What the split depends on, on `rt`: the chip's alignment for `format` under the runtime's
/// shape rules ([`alignment`]), K segments where the chip says (8192 on RK3588: one context
/// above it ran 14x slower), else below the shape rules' K limit (a chip with neither takes K
/// in one context), and contexts of at most `n_limit` columns.
pub(crate) fn split_rules(
    rt: &Runtime,
    format: WeightFormat,
    n_limit: usize,
) -> Result<SplitRules> {
    let (k_align, n_align) = alignment(rt, format)?;
    Ok(SplitRules {
        k_align,
        n_align,
        k_segment: rt.platform().k_segment().or(rt.shape_rules().max_k),
        max_n_per_context: n_limit,
    })
}

/// Each lane's NPU memory for linear `plan`: its B, and the A and C its contexts run with
/// (one pair per lane and domain when the contexts share them, else one per context).
pub(crate) fn lane_needs(
    plan: &LinearPlan,
    cfg: &EngineConfig,
    format: WeightFormat,
    share: bool,
) -> Vec<LaneNeed> {
    let (ea, ec) = format.bytes();
    let ks_max = plan.segments.iter().map(|s| s.1).max().unwrap_or(0) as u64;
    let (max_m, segs) = (cfg.max_m as u64, plan.segments.len() as u64);
    plan.shards
        .iter()
        .enumerate()
        .filter_map(|(lane, p)| {
            let p = p.as_ref()?;
            let blocks = plan.blocks(p);
            let widest = blocks.iter().map(|b| b.width).max().unwrap_or(0) as u64;
            let w = p.width as u64;
            let contexts = blocks.len() * plan.segments.len();
            let (a, c) = if share {
                (max_m * ks_max * ea, max_m * widest * ec)
            } else {
                (max_m * ks_max * ea * contexts as u64, max_m * w * ec * segs)
            };
            Some(LaneNeed {
                lane,
                b: format.b_bytes(w * plan.k_pad as u64),
                a,
                c,
                contexts,
            })
        })
        .collect()
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

#[cfg(all(test, feature = "emulator"))]
mod tests {
    use std::time::Duration;

    use rknn_chip::plan::{LinearPlan, SplitRules};
    use rknn_chip::{LinearRole, Platform};
    use rknn_emu::cost::{ENGINE_LAYOUT, EngineLayout, EngineLinear, RK3588, Run};

    use crate::engine::topology::Pinning;
    use crate::engine::{Engine, EngineConfig, WeightFormat};
    use crate::safe::runtime::Runtime;

    /// The contexts an engine builds and runs for a linear are the planner's for the chip's
    /// numbers, which is the plan the cost model prices: the linear's plan; the runs of one
    /// forward on the emulator (one per context) and the device time its cost model gave each
    /// core (every context's own K and N, on its lane's core) against the same contexts costed
    /// from the planner's widths and segments; and against
    /// [`rknn_emu::cost::CostModel::engine_linear`].
    #[test]
    fn the_engines_contexts_are_the_planners_and_the_cost_models() {
        let rt = Runtime::emulator(Platform::Rk3588).unwrap();
        let emu = rt.emulator_instance().unwrap();
        // (lanes, max_n_per_context): the default (8192 on RK3588), the user guide's 4096,
        // one that rounds down to the alignment, one narrower than most linears.
        for (lanes, limit) in [(3, None), (3, Some(4096)), (2, Some(100)), (1, Some(64))] {
            let cfg = EngineConfig {
                cores: Some(lanes),
                max_n_per_context: limit,
                pinning: Pinning::None,
                ..EngineConfig::default()
            };
            let engine = Engine::new(&rt, cfg).unwrap();
            let max_n = engine.max_n_per_context();
            // One column; K in two segments (15360: 8192 + 7168; 8300, padded to 8320: 8192 +
            // 128); N not a multiple of the alignment; N over many contexts.
            for (n, k) in [(1, 32), (96, 15360), (300, 8300), (777, 64), (5000, 96)] {
                // The formats RK3588 runs (the int4 ones are refused: no weight-only int4).
                for format in [WeightFormat::W8A8, WeightFormat::F16] {
                    let what = format!("{format:?} N={n} K={k} lanes={lanes} max_n={max_n}");
                    let w: Vec<f32> = (0..n * k).map(|i| (i % 13) as f32 - 6.0).collect();
                    let lin = engine.linear(&w, n, k, format).unwrap();
                    let rules =
                        SplitRules::for_chip(Platform::Rk3588, format.align_kind(), max_n).unwrap();
                    let want = LinearPlan::new(n, k, lanes, &rules).unwrap();
                    assert_eq!(lin.plan(), &want, "{what}");
                    let t = format.matmul_type();
                    let layout = EngineLayout {
                        max_n_per_context: max_n,
                        ..ENGINE_LAYOUT
                    };
                    let l = EngineLinear {
                        role: LinearRole::Qkv,
                        n,
                        k,
                        residual: false,
                    };
                    assert_eq!(
                        RK3588.engine_plan(&l, lanes, t, &layout).unwrap(),
                        want,
                        "{what}"
                    );

                    // Every context runs once (so each counts as its core's), then one forward
                    // of one row is timed.
                    let x = vec![0.5f32; k];
                    lin.forward_vec(&x, 1).unwrap();
                    emu.reset_modelled();
                    lin.forward_vec(&x, 1).unwrap();
                    let got = emu.modelled();
                    assert_eq!(got.runs as usize, want.contexts(), "{what}");
                    let busy = want.shards.iter().flatten().count();
                    for (lane, shard) in want.shards.iter().enumerate() {
                        let mut time = Duration::ZERO;
                        for block in shard.iter().flat_map(|s| want.blocks(s)) {
                            for &(_, ks) in &want.segments {
                                let run = Run {
                                    m: 1,
                                    k: ks,
                                    n: block.width,
                                    t,
                                    busy_cores: busy,
                                };
                                time += RK3588.run(&run).time();
                            }
                        }
                        assert_eq!(got.per_core[lane], time, "{what}: lane {lane}");
                    }
                    let priced = RK3588.engine_linear(&l, 1, lanes, t, &layout);
                    let lane_contexts = want.lane_contexts();
                    let busiest = lane_contexts.iter().max().copied().unwrap();
                    assert_eq!(priced.runs_per_core as usize, busiest, "{what}");
                    // The model's seconds against the emulator's whole nanoseconds per run.
                    let slack = 1e-9 * busiest as f64;
                    let modelled = got.busiest_core().as_secs_f64();
                    assert!(
                        (priced.npu_s - modelled).abs() <= slack,
                        "{what}: {priced:?} vs {got:?}"
                    );
                }
            }
        }
    }
}
