//! Emulator instances: each has its own configuration, contexts and memories, and its own
//! function table. The C functions carry no instance argument, so every instance owns a slot
//! and its table points at functions monomorphised for that slot.

use std::ops::Deref;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{
    Arc, Mutex, MutexGuard, OnceLock, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard,
};
use std::time::Duration;

use rknn_chip::ShapeRules;
use rustc_hash::FxHashMap;

use crate::config::{BusyCores, EmuConfig};
use crate::context::{Context, ContextModelled};
use crate::cost::{CostModel, Run};
use crate::memory::Memories;

/// Slot 0 is the drop-in library's; the others are handed to emulators by [`occupy`].
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

/// The modelled totals of the runs made on one core.
#[derive(Clone, Copy, Default)]
pub(crate) struct CoreTotals {
    /// Runs counted.
    pub(crate) runs: u64,
    /// Their modelled device time.
    pub(crate) total: Duration,
    /// Their operations (2 per multiply-accumulate).
    pub(crate) ops: f64,
}

/// The tables every call looks up. Their keys are handles and addresses the emulator hands out
/// itself, never chosen by a caller, so they are hashed with Fx (a multiply) instead of std's
/// keyed SipHash, which guards against chosen keys: a decode forward makes five lookups per
/// lane, 600 per lane per token of the demo model.
#[derive(Default)]
pub(crate) struct State {
    /// Each context behind its own lock: a call on a context holds it, and a second call on
    /// the same context meanwhile is refused (`try_lock`).
    pub(crate) contexts: FxHashMap<u64, Arc<Mutex<Context>>>,
    /// The IOMMU domain of each context (kept outside the context's lock: allocation must not
    /// wait for a run).
    pub(crate) domains: FxHashMap<u64, i32>,
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
    pub(crate) fn new(cfg: EmuConfig) -> Instance {
        let cores = cfg.platform.npu_cores().max(1);
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
            modelled: (0..cores).map(|_| CoreModelled::default()).collect(),
            on_core: (0..cores).map(|_| AtomicUsize::new(0)).collect(),
        }
    }

    fn totals(&self, core: usize) -> MutexGuard<'_, CoreTotals> {
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
        let mut totals = self.totals(core);
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

    /// The modelled totals of each core, in core order.
    pub(crate) fn core_totals(&self) -> Vec<CoreTotals> {
        (0..self.modelled.len())
            .map(|core| *self.totals(core))
            .collect()
    }

    /// Zeroes the modelled totals, per core and per context (contexts stay active).
    pub(crate) fn reset_modelled(&self) {
        for core in 0..self.modelled.len() {
            *self.totals(core) = CoreTotals::default();
        }
        // The live contexts, collected outside the state's lock (a caller that locks them must
        // not hold it: a run holds its context and then reads the state).
        let contexts: Vec<_> = self.state().contexts.values().cloned().collect();
        for c in contexts {
            let mut c = c.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some(m) = &mut c.modelled {
                *m = ContextModelled {
                    core: m.core,
                    ..ContextModelled::default()
                };
            }
        }
    }

    /// The instance's state, to read it. A panic inside a call is caught at the ABI boundary and leaves
    /// the state consistent (every mutation is a single insert or remove), so poisoning is
    /// ignored.
    pub(crate) fn state(&self) -> RwLockReadGuard<'_, State> {
        read(&self.state)
    }

    /// The instance's state, to change it (as [`Instance::state`] for poisoning).
    pub(crate) fn state_mut(&self) -> RwLockWriteGuard<'_, State> {
        write(&self.state)
    }
}

/// Locks `lock` to read, ignoring poisoning: every change under the emulator's locks is one
/// insert, remove or assignment, so a panic leaves the value consistent.
fn read<T>(lock: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    lock.read().unwrap_or_else(PoisonError::into_inner)
}

/// Locks `lock` to write, ignoring poisoning (as [`read`]).
fn write<T>(lock: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    lock.write().unwrap_or_else(PoisonError::into_inner)
}

/// The instance of each slot. A call holds its slot's read lock from start to end, so that
/// emptying the slot when an emulator is dropped ([`vacate`]) waits for the calls in flight on
/// it (and later calls find the slot empty).
static INSTANCES: [RwLock<Option<Arc<Instance>>>; SLOTS] = [const { RwLock::new(None) }; SLOTS];
static DROPIN: OnceLock<()> = OnceLock::new();

/// A live instance, kept in its slot while this lives (see [`INSTANCES`]). Hold it for one
/// call only, and do not look the slot up again meanwhile: a read lock taken twice by one
/// thread waits for a writer that is waiting for the first.
pub(crate) struct InstanceRef(RwLockReadGuard<'static, Option<Arc<Instance>>>);

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
            *write(&INSTANCES[0]) = Some(Arc::new(Instance::new(EmuConfig::from_env())));
        });
    }
    let guard = read(&INSTANCES[slot]);
    guard.is_some().then(|| InstanceRef(guard))
}

/// Puts `instance` in a free slot other than the drop-in library's and returns the slot, or
/// `None` when every slot is taken.
pub(crate) fn occupy(instance: &Arc<Instance>) -> Option<usize> {
    for (slot, entry) in INSTANCES.iter().enumerate().skip(1) {
        // A taken slot is passed over without its write lock, which would wait for the
        // calls in flight on that emulator (a long run would stall this one's creation).
        if read(entry).is_some() {
            continue;
        }
        let mut entry = write(entry);
        if entry.is_none() {
            *entry = Some(instance.clone());
            return Some(slot);
        }
    }
    None
}

/// Empties slot `slot` once the calls in flight on its instance have returned; contexts and
/// memories still alive are freed with the instance.
pub(crate) fn vacate(slot: usize) {
    *write(&INSTANCES[slot]) = None;
}
