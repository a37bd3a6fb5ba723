//! What the engine finds out about the runtime when it starts: the two \[open\] facts its
//! defaults rest on, each tried once on tiny contexts, so that a runtime that answers them the
//! pessimistic way costs speed or handles, not a failed first run.
//!
//! * `rules.n_limit`: the widest context ([`EngineConfig::max_n_per_context`]);
//! * `memory.shared_between_contexts`: one A and one C per core
//!   ([`EngineConfig::share_io_memories`]).

use rknn_chip::{Layout, USER_GUIDE_MAX_N};

use super::config::EngineConfig;
use super::format::WeightFormat;
use super::plan::alignment;
use crate::dtype::I8xI8ToI32;
use crate::error::{Error, Result};
use crate::safe::matmul::Core;
use crate::safe::runtime::Runtime;

/// What the engine runs with, after the probes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Resolved {
    /// The largest N of one context.
    pub(crate) n_limit: usize,
    /// Whether the contexts of one core share one A and one C.
    pub(crate) share_io: bool,
}

/// The settings `cfg` asks for on `rt`, defaults probed: a refusal of the optimistic answer is
/// reported on stderr in one line and the engine takes the pessimistic one.
pub(crate) fn resolve(rt: &Runtime, cfg: &EngineConfig) -> Result<Resolved> {
    let n_limit = match cfg.max_n_per_context {
        Some(n) => check_n_limit(rt, n)?,
        None => {
            let want = default_n_limit(rt);
            match try_width(rt, want) {
                Ok(()) => want,
                Err(e) if want > USER_GUIDE_MAX_N => {
                    eprintln!(
                        "rknn-matmul: this runtime refuses a context of N = {want} (rules.n_limit: {e}); \
                         the engine uses contexts of at most N = {USER_GUIDE_MAX_N}: more contexts, \
                         handles and runs per linear"
                    );
                    USER_GUIDE_MAX_N
                }
                Err(e) => return Err(e),
            }
        }
    };
    let share_io = cfg.share_io_memories
        && match try_sharing(rt) {
            Ok(()) => true,
            Err(e) => {
                eprintln!(
                    "rknn-matmul: this runtime does not run a memory of one context bound in another \
                     (memory.shared_between_contexts: {e}); every context gets its own A and C: \
                     3 NPU memory handles per context instead of 1"
                );
                false
            }
        };
    Ok(Resolved { n_limit, share_io })
}

/// The default widest context on `rt`: the chip's largest measured N, bounded by the shape
/// rules the runtime was opened with (the user guide's 4096 under the strict rules).
pub(crate) fn default_n_limit(rt: &Runtime) -> usize {
    let measured = rt.platform().measured_max_n().unwrap_or(USER_GUIDE_MAX_N);
    rt.shape_rules().max_n.map_or(measured, |m| m.min(measured))
}

/// Checks a limit the caller set: at least the chip's smallest N alignment (each format's own
/// alignment is checked when a linear of that format is planned) and within the shape rules.
fn check_n_limit(rt: &Runtime, n: usize) -> Result<usize> {
    let align = WeightFormat::ALL
        .iter()
        .filter_map(|&f| alignment(rt, f).ok().map(|(_, na)| na))
        .min()
        .unwrap_or(1);
    if n < align {
        return Err(Error::EngineConfig {
            field: "max_n_per_context",
            value: n,
            rule: format!(
                "is below {}'s N alignment of {align}: a context holds whole aligned columns",
                rt.platform()
            ),
        });
    }
    if let Some(max) = rt.shape_rules().max_n.filter(|&m| n > m) {
        return Err(Error::EngineConfig {
            field: "max_n_per_context",
            value: n,
            rule: format!(
                "exceeds the shape rules' N limit of {max} on {}",
                rt.platform()
            ),
        });
    }
    Ok(n)
}

/// The core the probes run on: core 0, where the chip has a core mask.
fn core(rt: &Runtime) -> Core {
    if rt.platform().has_core_mask() {
        Core::Index(0)
    } else {
        Core::Auto
    }
}

/// Creates (and drops) a context of N = `n`, configured as the engine's.
fn try_width(rt: &Runtime, n: usize) -> Result<()> {
    let (k, _) = alignment(rt, WeightFormat::W8A8)?;
    rt.matmul::<I8xI8ToI32>(1, k, n)
        .dynamic_m(&[1])
        .ac_layout(Layout::Native)
        .b_layout(Layout::Native)
        .core(core(rt))
        .build()
        .map(drop)
}

/// Why a memory of one context could not be used by another ([`try_sharing`]).
#[derive(Debug)]
enum SharingRefused {
    /// A call failed (the runtime refused the binding, or anything before it).
    Call(Error),
    /// The run returned a wrong element.
    WrongResult {
        row: usize,
        col: usize,
        got: i32,
        want: i32,
    },
}

impl From<Error> for SharingRefused {
    fn from(e: Error) -> Self {
        SharingRefused::Call(e)
    }
}

impl std::fmt::Display for SharingRefused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SharingRefused::Call(e) => e.fmt(f),
            SharingRefused::WrongResult {
                row,
                col,
                got,
                want,
            } => write!(f, "C[{row}][{col}] = {got}, expected {want}"),
        }
    }
}

/// Runs a context with an A and a C allocated on another context of the same core and
/// domain, and checks its result.
fn try_sharing(rt: &Runtime) -> std::result::Result<(), SharingRefused> {
    let (m, k, n) = (2, 32, 32);
    let build = || rt.matmul::<I8xI8ToI32>(m, k, n).core(core(rt)).build();
    let (owner, user) = (build()?, build()?);
    let mut a = owner.alloc_shared_a(0)?;
    let mut c = owner.alloc_shared_c(0)?;
    let mut b = user.alloc_b()?;
    let av: Vec<i8> = (0..m * k).map(|i| (i % 7) as i8 - 3).collect();
    let bv: Vec<i8> = (0..k * n).map(|i| (i % 5) as i8 - 2).collect();
    a.write(&av)?;
    b.write(&bv)?;
    user.run(&a, &b, &mut c)?;
    for row in 0..m {
        for col in 0..n {
            let want: i32 = (0..k)
                .map(|t| i32::from(av[row * k + t]) * i32::from(bv[t * n + col]))
                .sum();
            let got = c.as_slice()[row * n + col];
            if got != want {
                return Err(SharingRefused::WrongResult {
                    row,
                    col,
                    got,
                    want,
                });
            }
        }
    }
    Ok(())
}
