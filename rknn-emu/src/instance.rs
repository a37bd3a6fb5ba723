//! Emulator instances: each has its own configuration, contexts and memories, and its own
//! function table. The C functions carry no instance argument, so every instance owns a slot
//! and its table points at functions monomorphised for that slot.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError, RwLock};

use rknn_chip::ShapeRules;
use rknn_sys::RknnApi;

use crate::config::EmuConfig;
use crate::context::Context;
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
    state: Mutex<State>,
    /// Memories still alive when their context was destroyed (the docs say: memories first).
    pub(crate) orphaned: AtomicUsize,
    /// Calls refused because another thread was using the same context.
    pub(crate) concurrent_uses: AtomicUsize,
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
            cfg,
            state: Mutex::new(State {
                next_fd: 100,
                ..State::default()
            }),
            orphaned: AtomicUsize::new(0),
            concurrent_uses: AtomicUsize::new(0),
        }
    }

    /// The instance's state. A panic inside a call is caught at the ABI boundary and leaves
    /// the state consistent (every mutation is a single insert or remove), so poisoning is
    /// ignored.
    pub(crate) fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
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
