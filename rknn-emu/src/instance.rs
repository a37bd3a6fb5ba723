//! Emulator instances: each has its own configuration, contexts and memories, and its own
//! function table. The C functions carry no instance argument, so every instance owns a slot
//! and its table points at functions monomorphised for that slot.

use std::ops::Deref;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::Duration;

use rknn_chip::ShapeRules;
use rknn_sys::RknnApi;
use rustc_hash::FxHashMap;

use crate::brlock::{BrLock, BrReadGuard, BrWriteGuard};
use crate::config::{BusyCores, EmuConfig};
use crate::context::Context;
use crate::cost::{CostModel, Run, RunCost};
use crate::follow::ContextCell;
use crate::memory::Memories;

/// Slot 0 is the drop-in library's; the others are handed to [`Emulator::new`].
pub(crate) const SLOTS: usize = 16;

/// Handles are unique across instances, so a handle given to the wrong instance is refused.
static NEXT_HANDLE: AtomicU64 = AtomicU64::new(1);

pub(crate) fn next_handle() -> u64 {
    NEXT_HANDLE.fetch_add(1, Ordering::Relaxed)
}

pub(crate) struct Instance {
    pub(crate) cfg: EmuConfig,
    /// `cfg.rules` resolved for `cfg.platform`, once, when the instance is created.
    pub(crate) rules: ShapeRules,
    /// Read by every call (handle lookups), written by creation and destruction: a read lock
    /// lets two emulated cores look up their handles at once (with a mutex they queued on
    /// each other several times per run), and one per thread ([`BrLock`]) keeps them from
    /// writing the same lock word on every call.
    state: BrLock<State>,
    /// Memories still alive when their context was destroyed (the docs say: memories first).
    pub(crate) orphaned: AtomicUsize,
    /// Calls refused because another thread was using the same context.
    pub(crate) concurrent_uses: AtomicUsize,
    /// `cfg.cost` resolved for `cfg.platform`.
    pub(crate) cost: Option<CostModel>,
    /// Modelled device time per NPU core, kept apart from the state so that a run never waits
    /// for it longer than an addition, and apart from each other because the engine's lanes
    /// run on different cores at once (one shared lock was written by both on every run).
    /// Each context's own totals live in the context ([`Context::modelled`]).
    modelled: Box<[CoreModelled]>,
    /// Per core, the live contexts that have run on it (for [`BusyCores::ActiveContexts`]):
    /// read by every run, written only when a context first runs, moves or is destroyed.
    on_core: Box<[AtomicUsize]>,
}

/// One core's modelled totals, on a cache line of its own.
#[repr(align(128))]
#[derive(Default)]
struct CoreModelled(Mutex<CoreTotals>);

#[derive(Default)]
struct CoreTotals {
    runs: u64,
    total: Duration,
    ops: f64,
}

/// The tables every call looks up. Their keys are handles and addresses the emulator hands out
/// itself, never chosen by a caller, so they are hashed with Fx (a multiply) instead of std's
/// keyed SipHash, which guards against chosen keys: a decode forward makes five lookups per
/// lane, 600 per lane per token of the demo model.
#[derive(Default)]
pub(crate) struct State {
    pub(crate) contexts: FxHashMap<u64, Arc<ContextCell>>,
    /// The IOMMU domain of each context (kept outside the context's lock: allocation must not
    /// wait for a run).
    pub(crate) domains: FxHashMap<u64, i32>,
    pub(crate) memories: Memories,
    pub(crate) next_fd: i32,
}

impl State {
    pub(crate) fn add_context(&mut self, handle: u64, c: Context) {
        self.domains.insert(handle, c.domain);
        self.contexts.insert(handle, Arc::new(ContextCell::new(c)));
    }
}

impl Instance {
    fn new(cfg: EmuConfig) -> Instance {
        let cores = cfg.platform.npu_cores().max(1);
        Instance {
            rules: cfg.rules.resolve(cfg.platform),
            cost: cfg.cost.resolve(cfg.platform),
            cfg,
            state: BrLock::new(State {
                next_fd: 100,
                ..State::default()
            }),
            orphaned: AtomicUsize::new(0),
            concurrent_uses: AtomicUsize::new(0),
            modelled: (0..cores).map(|_| CoreModelled::default()).collect(),
            on_core: (0..cores).map(|_| AtomicUsize::new(0)).collect(),
        }
    }

    fn core_totals(&self, core: usize) -> MutexGuard<'_, CoreTotals> {
        // Every update is a few additions that cannot panic half-way.
        self.modelled[core]
            .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Adds the modelled time of a run of `c` (the context, held by the calling run) on the
    /// core of its core mask.
    pub(crate) fn account_run(&self, c: &mut Context) {
        let Some(model) = &self.cost else {
            return;
        };
        let cores = self.modelled.len();
        // Mask 0 lets the runtime choose; the model has to put the run somewhere.
        let core = if c.core_mask == 0 {
            0
        } else {
            (c.core_mask.trailing_zeros() as usize).min(cores - 1)
        };
        let cfg = c.cfg();
        let placed = c.modelled.get_or_insert_with(|| {
            self.on_core[core].fetch_add(1, Ordering::Relaxed);
            ContextModelled {
                core,
                ..ContextModelled::default()
            }
        });
        if placed.core != core {
            self.on_core[placed.core].fetch_sub(1, Ordering::Relaxed);
            self.on_core[core].fetch_add(1, Ordering::Relaxed);
            placed.core = core;
        }
        let busy = match self.cfg.busy_cores {
            BusyCores::Fixed(b) => b,
            BusyCores::ActiveContexts => self
                .on_core
                .iter()
                .filter(|n| n.load(Ordering::Relaxed) > 0)
                .count(),
        };
        let run = Run {
            m: cfg.m,
            k: cfg.k,
            n: cfg.n,
            t: cfg.t,
            busy_cores: busy.clamp(1, cores),
        };
        let (cost, time) = match c.last_cost {
            Some((r, cost, time)) if r == run => (cost, time),
            _ => {
                let cost = model.run(&run);
                let time = cost.time();
                c.last_cost = Some((run, cost, time));
                (cost, time)
            }
        };
        placed.add(&cost, time);
        let mut totals = self.core_totals(core);
        totals.runs += 1;
        totals.total += time;
        totals.ops += cost.ops;
    }

    /// Forgets a context that is being destroyed (it no longer counts as an active core).
    pub(crate) fn forget_context(&self, c: &mut Context) {
        if let Some(placed) = c.modelled.take() {
            self.on_core[placed.core].fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// The live contexts, outside the state's lock (a caller that locks them must not hold
    /// it: a run holds its context and then reads the state).
    fn contexts(&self) -> Vec<Arc<ContextCell>> {
        self.state().contexts.values().cloned().collect()
    }

    /// The instance's state, to read it. A panic inside a call is caught at the ABI boundary and leaves
    /// the state consistent (every mutation is a single insert or remove), so poisoning is
    /// ignored.
    pub(crate) fn state(&self) -> BrReadGuard<'_, State> {
        self.state.read()
    }

    /// The instance's state, to change it (as [`Instance::state`] for poisoning).
    pub(crate) fn state_mut(&self) -> BrWriteGuard<'_, State> {
        self.state.write()
    }
}

/// The instance of each slot. A call holds its slot's read lock from start to end, so that
/// dropping an [`Emulator`] waits for the calls in flight on it (and later calls find the slot
/// empty); a [`BrLock`], because every call of every emulated core takes it.
static INSTANCES: [BrLock<Option<Arc<Instance>>>; SLOTS] = [const { BrLock::new(None) }; SLOTS];
static DROPIN: OnceLock<()> = OnceLock::new();

/// A live instance, kept in its slot while this lives (see [`INSTANCES`]). Hold it for one
/// call only, and do not look the slot up again meanwhile: a read lock taken twice by one
/// thread waits for a writer that is waiting for the first.
pub(crate) struct InstanceRef(BrReadGuard<'static, Option<Arc<Instance>>>);

impl Deref for InstanceRef {
    type Target = Instance;
    fn deref(&self) -> &Instance {
        self.0
            .as_deref()
            .expect("an InstanceRef is made only for an occupied slot")
    }
}

/// The instance behind slot `slot`; slot 0 is created from the environment on first use.
pub(crate) fn instance(slot: usize) -> Option<InstanceRef> {
    if slot == 0 {
        DROPIN.get_or_init(|| {
            *INSTANCES[0].write() = Some(Arc::new(Instance::new(EmuConfig::from_env())));
        });
    }
    let guard = INSTANCES[slot].read();
    guard.is_some().then(|| InstanceRef(guard))
}

/// Why an emulator could not be created.
#[derive(Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum EmuError {
    /// All instance slots are taken by live emulators.
    NoFreeSlot,
}

impl std::fmt::Display for EmuError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EmuError::NoFreeSlot => write!(
                f,
                "all {} emulator instances are in use; drop one first",
                SLOTS - 1
            ),
        }
    }
}

impl std::error::Error for EmuError {}

/// Counters an emulator keeps about how it was used, for tests of the layers above.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EmuStats {
    /// Live matmul contexts.
    pub contexts: usize,
    /// Live memories.
    pub memories: usize,
    /// Memories that were still alive when their context was destroyed.
    pub orphaned_memories: usize,
    /// Calls refused because another thread was inside a call on the same context.
    pub concurrent_uses: usize,
}

/// Modelled device time of the runs an emulator made ([`crate::cost`]): a model of the chip,
/// not a measurement.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ModelledTime {
    /// Runs counted.
    pub runs: u64,
    /// Their modelled device time, summed over every core.
    pub total: Duration,
    /// Per NPU core, the modelled time of the runs made on it.
    pub per_core: Vec<Duration>,
    /// Operations (2 per multiply-accumulate) of the runs.
    pub ops: f64,
}

impl ModelledTime {
    /// The modelled device time of the busiest core: the NPU's wall time for work split
    /// evenly over the cores and run on all of them at once (as the engine's linears are).
    pub fn busiest_core(&self) -> Duration {
        self.per_core.iter().copied().max().unwrap_or_default()
    }

    /// The difference since an earlier snapshot of the same emulator (for timing one phase,
    /// e.g. prefill then decode).
    pub fn since(&self, earlier: &ModelledTime) -> ModelledTime {
        ModelledTime {
            runs: self.runs.saturating_sub(earlier.runs),
            total: self.total.saturating_sub(earlier.total),
            per_core: self
                .per_core
                .iter()
                .enumerate()
                .map(|(i, t)| {
                    t.saturating_sub(earlier.per_core.get(i).copied().unwrap_or_default())
                })
                .collect(),
            ops: (self.ops - earlier.ops).max(0.0),
        }
    }
}

/// Modelled device time of one context's runs.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ContextModelled {
    /// The core its runs were put on.
    pub core: usize,
    /// Runs counted.
    pub runs: u64,
    /// Their modelled device time.
    pub total: Duration,
    /// The cost of its last run.
    pub last: Option<RunCost>,
}

impl ContextModelled {
    fn add(&mut self, c: &RunCost, time: Duration) {
        self.runs += 1;
        self.total += time;
        self.last = Some(*c);
    }
}

/// An emulated RKNN runtime with its own configuration, contexts and memories.
///
/// Its function table may be called from any number of threads. Dropping the emulator waits
/// for the calls in flight on it to return, then frees its contexts and memories; a call made
/// afterwards through a copy of the table fails with `RKNN_ERR_CTX_INVALID` ("this emulator
/// instance was dropped").
///
/// ```
/// use rknn_emu::{EmuConfig, Emulator};
/// use rknn_chip::Platform;
/// let emu = Emulator::new(EmuConfig::new(Platform::Rk3576)).unwrap();
/// let api = emu.api(); // the same rknn-sys function table librknnrt.so fills
/// assert!(api.rknn_matmul_create_dynamic_shape.is_some());
/// ```
pub struct Emulator {
    pub(crate) slot: usize,
    instance: Arc<Instance>,
    api: RknnApi,
}

impl std::fmt::Debug for Emulator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Emulator")
            .field("slot", &self.slot)
            .field("config", &self.instance.cfg)
            .finish()
    }
}

impl Emulator {
    /// Starts an emulator instance.
    pub fn new(cfg: EmuConfig) -> Result<Emulator, EmuError> {
        let instance = Arc::new(Instance::new(cfg));
        for (slot, entry) in INSTANCES.iter().enumerate().skip(1) {
            // A taken slot is passed over without its write lock, which would wait for the
            // calls in flight on that emulator (a long run would stall this one's creation).
            if entry.read().is_some() {
                continue;
            }
            let mut entry = entry.write();
            if entry.is_none() {
                *entry = Some(instance.clone());
                let api = RknnApi::from_functions(crate::abi::functions_for_slot(slot), "rknn-emu");
                return Ok(Emulator {
                    slot,
                    instance,
                    api,
                });
            }
        }
        Err(EmuError::NoFreeSlot)
    }

    /// The function table of this instance.
    pub fn api(&self) -> &RknnApi {
        &self.api
    }

    /// The configuration.
    pub fn config(&self) -> &EmuConfig {
        &self.instance.cfg
    }

    /// The shape limits this instance enforces: the configuration's [`crate::RulesPolicy`]
    /// resolved for its platform.
    pub fn rules(&self) -> ShapeRules {
        self.instance.rules
    }

    /// Usage counters.
    pub fn stats(&self) -> EmuStats {
        let st = self.instance.state();
        EmuStats {
            contexts: st.contexts.len(),
            memories: st.memories.len(),
            orphaned_memories: self.instance.orphaned.load(Ordering::Relaxed),
            concurrent_uses: self.instance.concurrent_uses.load(Ordering::Relaxed),
        }
    }

    /// The cost model keeping modelled device time, if any ([`EmuConfig::cost`]).
    pub fn cost_model(&self) -> Option<&CostModel> {
        self.instance.cost.as_ref()
    }

    /// The modelled device time of every run since the emulator started (or since
    /// [`Emulator::reset_modelled`]): what the chip would have taken, per the cost model. Zero
    /// without a model.
    pub fn modelled(&self) -> ModelledTime {
        let mut t = ModelledTime::default();
        for core in 0..self.instance.modelled.len() {
            let c = self.instance.core_totals(core);
            t.runs += c.runs;
            t.total += c.total;
            t.per_core.push(c.total);
            t.ops += c.ops;
        }
        t
    }

    /// The modelled device time of one live context's runs (`None` if it has not run or has
    /// been destroyed). `ctx` is the handle `rknn_matmul_create` returned.
    pub fn context_modelled(&self, ctx: u64) -> Option<ContextModelled> {
        let c = self.instance.state().contexts.get(&ctx).cloned()?;
        let c = c.ctx.lock().unwrap_or_else(PoisonError::into_inner);
        c.modelled
    }

    /// Zeroes the modelled totals (per-context totals too; contexts stay active).
    pub fn reset_modelled(&self) {
        for core in 0..self.instance.modelled.len() {
            *self.instance.core_totals(core) = CoreTotals::default();
        }
        for c in self.instance.contexts() {
            let mut c = c.ctx.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some(m) = &mut c.modelled {
                *m = ContextModelled {
                    core: m.core,
                    ..ContextModelled::default()
                };
            }
        }
    }

    /// Bytes allocated in an IOMMU domain.
    pub fn domain_used(&self, domain: i32) -> u64 {
        self.instance.state().memories.domain_used(domain)
    }
}

impl Drop for Emulator {
    fn drop(&mut self) {
        // Contexts and memories still alive are freed with the instance.
        *INSTANCES[self.slot].write() = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;
    use std::sync::mpsc;
    use std::time::Duration;

    #[test]
    fn dropping_an_emulator_waits_for_its_calls_in_flight_and_creating_one_does_not() {
        let emu = Emulator::new(EmuConfig::new(rknn_chip::Platform::Rk3588)).unwrap();
        let slot = emu.slot;
        // This thread is inside a call on the emulator (as an ABI function holds it).
        let call = instance(slot).expect("a live emulator's slot is taken");
        let this: *const Instance = &*call;
        // Another emulator can still be made and dropped meanwhile.
        let (tx, rx) = mpsc::channel();
        let maker = std::thread::spawn(move || {
            let other = Emulator::new(EmuConfig::new(rknn_chip::Platform::Rk3576)).unwrap();
            tx.send(other.slot).unwrap();
        });
        let other = rx
            .recv_timeout(Duration::from_secs(20))
            .expect("Emulator::new waited for a call on another emulator");
        assert_ne!(other, slot);
        maker.join().unwrap();
        // Dropping this one waits until the call ends.
        let dropped = Arc::new(AtomicBool::new(false));
        let d = dropped.clone();
        let dropper = std::thread::spawn(move || {
            drop(emu);
            d.store(true, Ordering::SeqCst);
        });
        std::thread::sleep(Duration::from_millis(if cfg!(miri) { 5 } else { 50 }));
        assert!(!dropped.load(Ordering::SeqCst), "dropped during a call");
        assert_eq!(call.cfg.platform, rknn_chip::Platform::Rk3588);
        drop(call);
        dropper.join().unwrap();
        assert!(dropped.load(Ordering::SeqCst));
        // Later calls find the slot empty (they fail with "this emulator instance was dropped"),
        // or taken by an emulator made since.
        assert!(instance(slot).is_none_or(|i| !std::ptr::eq(&*i, this)));
    }
}
