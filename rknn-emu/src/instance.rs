//! Emulator instances: each has its own configuration, contexts and memories, and its own
//! function table. The C functions carry no instance argument, so every instance owns a slot
//! and its table points at functions monomorphised for that slot.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{
    Arc, Mutex, MutexGuard, OnceLock, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard,
};
use std::time::Duration;

use rknn_chip::ShapeRules;
use rknn_sys::RknnApi;

use crate::config::{BusyCores, EmuConfig};
use crate::context::Context;
use crate::cost::{CostModel, Run, RunCost};
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
    /// each other several times per run).
    state: RwLock<State>,
    /// Memories still alive when their context was destroyed (the docs say: memories first).
    pub(crate) orphaned: AtomicUsize,
    /// Calls refused because another thread was using the same context.
    pub(crate) concurrent_uses: AtomicUsize,
    /// `cfg.cost` resolved for `cfg.platform`.
    pub(crate) cost: Option<CostModel>,
    /// Modelled device time, kept apart from the state so that a run never waits for it
    /// longer than an addition.
    modelled: Mutex<Modelled>,
}

/// The modelled device time of the runs made so far.
struct Modelled {
    /// Per live context that has run: its core and its totals.
    contexts: HashMap<u64, ContextModelled>,
    /// How many of `contexts` are on each core (index capped at 63), kept with every change
    /// of `contexts` so that a run counts the busy cores without walking all of them (a model
    /// holds hundreds of contexts, and every run of every core asks).
    on_core: [u32; 64],
    total: ModelledTime,
}

impl Default for Modelled {
    fn default() -> Modelled {
        Modelled {
            contexts: HashMap::new(),
            on_core: [0; 64],
            total: ModelledTime::default(),
        }
    }
}

impl Modelled {
    /// Puts context `ctx` on `core` (a context's core changes with its core mask).
    fn place(&mut self, ctx: u64, core: usize) {
        let entry = self.contexts.entry(ctx);
        let new = matches!(entry, std::collections::hash_map::Entry::Vacant(_));
        let c = entry.or_default();
        if !new {
            self.on_core[c.core.min(63)] -= 1;
        }
        c.core = core;
        self.on_core[core.min(63)] += 1;
    }

    fn forget(&mut self, ctx: u64) {
        if let Some(c) = self.contexts.remove(&ctx) {
            self.on_core[c.core.min(63)] -= 1;
        }
    }
}

#[derive(Default)]
pub(crate) struct State {
    pub(crate) contexts: HashMap<u64, Arc<Mutex<Context>>>,
    /// The IOMMU domain of each context (kept outside the context's lock: allocation must not
    /// wait for a run).
    pub(crate) domains: HashMap<u64, i32>,
    pub(crate) memories: Memories,
    pub(crate) next_fd: i32,
}

impl State {
    pub(crate) fn add_context(&mut self, handle: u64, c: Context) {
        self.domains.insert(handle, c.domain);
        self.contexts.insert(handle, Arc::new(Mutex::new(c)));
    }
}

impl Instance {
    fn new(cfg: EmuConfig) -> Instance {
        Instance {
            rules: cfg.rules.resolve(cfg.platform),
            cost: cfg.cost.resolve(cfg.platform),
            cfg,
            state: RwLock::new(State {
                next_fd: 100,
                ..State::default()
            }),
            orphaned: AtomicUsize::new(0),
            concurrent_uses: AtomicUsize::new(0),
            modelled: Mutex::new(Modelled::default()),
        }
    }

    fn modelled(&self) -> MutexGuard<'_, Modelled> {
        // Every update is a few additions that cannot panic half-way.
        self.modelled.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Adds the modelled time of a run that context `ctx` made on the core of `core_mask`.
    pub(crate) fn account_run(
        &self,
        ctx: u64,
        core_mask: u32,
        m: usize,
        k: usize,
        n: usize,
        t: rknn_chip::MatmulType,
    ) {
        let Some(model) = &self.cost else {
            return;
        };
        let cores = self.cfg.platform.npu_cores().max(1);
        // Mask 0 lets the runtime choose; the model has to put the run somewhere.
        let core = if core_mask == 0 {
            0
        } else {
            (core_mask.trailing_zeros() as usize).min(cores - 1)
        };
        let mut md = self.modelled();
        md.place(ctx, core);
        let busy = match self.cfg.busy_cores {
            BusyCores::Fixed(b) => b,
            BusyCores::ActiveContexts => md.on_core.iter().filter(|&&n| n > 0).count(),
        };
        let cost = model.run(&Run {
            m,
            k,
            n,
            t,
            busy_cores: busy.clamp(1, cores),
        });
        let entry = md.contexts.get_mut(&ctx).expect("inserted above");
        entry.add(&cost);
        md.total.add(core, cores, &cost);
    }

    /// Forgets a destroyed context (it no longer counts as an active core).
    pub(crate) fn forget_context(&self, ctx: u64) {
        self.modelled().forget(ctx);
    }

    /// The instance's state, to read it. A panic inside a call is caught at the ABI boundary and leaves
    /// the state consistent (every mutation is a single insert or remove), so poisoning is
    /// ignored.
    pub(crate) fn state(&self) -> RwLockReadGuard<'_, State> {
        self.state.read().unwrap_or_else(PoisonError::into_inner)
    }

    /// The instance's state, to change it (as [`Instance::state`] for poisoning).
    pub(crate) fn state_mut(&self) -> RwLockWriteGuard<'_, State> {
        self.state.write().unwrap_or_else(PoisonError::into_inner)
    }
}

static INSTANCES: [RwLock<Option<Arc<Instance>>>; SLOTS] = [const { RwLock::new(None) }; SLOTS];
static DROPIN: OnceLock<()> = OnceLock::new();

/// The instance behind slot `slot`; slot 0 is created from the environment on first use.
pub(crate) fn instance(slot: usize) -> Option<Arc<Instance>> {
    if slot == 0 {
        DROPIN.get_or_init(|| {
            *INSTANCES[0].write().unwrap_or_else(PoisonError::into_inner) =
                Some(Arc::new(Instance::new(EmuConfig::from_env())));
        });
    }
    INSTANCES[slot]
        .read()
        .unwrap_or_else(PoisonError::into_inner)
        .clone()
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
    fn add(&mut self, core: usize, cores: usize, c: &RunCost) {
        if self.per_core.len() < cores {
            self.per_core.resize(cores, Duration::ZERO);
        }
        let t = c.time();
        self.runs += 1;
        self.total += t;
        self.per_core[core] += t;
        self.ops += c.ops;
    }

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
    fn add(&mut self, c: &RunCost) {
        self.runs += 1;
        self.total += c.time();
        self.last = Some(*c);
    }
}

/// An emulated RKNN runtime with its own configuration, contexts and memories.
///
/// ```
/// use rknn_emu::{EmuConfig, Emulator};
/// use rknn_chip::Platform;
/// let emu = Emulator::new(EmuConfig::new(Platform::Rk3576)).unwrap();
/// let api = emu.api(); // the same rknn-sys function table librknnrt.so fills
/// assert!(api.rknn_matmul_create_dynamic_shape.is_some());
/// ```
pub struct Emulator {
    slot: usize,
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
            let mut entry = entry.write().unwrap_or_else(PoisonError::into_inner);
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
        let mut t = self.instance.modelled().total.clone();
        t.per_core.resize(
            self.instance.cfg.platform.npu_cores().max(1),
            Duration::ZERO,
        );
        t
    }

    /// The modelled device time of one live context's runs (`None` if it has not run or has
    /// been destroyed). `ctx` is the handle `rknn_matmul_create` returned.
    pub fn context_modelled(&self, ctx: u64) -> Option<ContextModelled> {
        self.instance.modelled().contexts.get(&ctx).copied()
    }

    /// Zeroes the modelled totals (per-context totals too; contexts stay active).
    pub fn reset_modelled(&self) {
        let mut md = self.instance.modelled();
        md.total = ModelledTime::default();
        for c in md.contexts.values_mut() {
            *c = ContextModelled {
                core: c.core,
                ..ContextModelled::default()
            };
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
        *INSTANCES[self.slot]
            .write()
            .unwrap_or_else(PoisonError::into_inner) = None;
    }
}
