//! The public face of an emulator instance: [`Emulator`] owns a slot of the instance table
//! and the function table of that slot, and reads the instance's counters and modelled time.

use std::sync::atomic::Ordering;
use std::sync::{Arc, PoisonError};

use rknn_chip::{ModelledTime, ShapeRules};
use rknn_sys::RknnApi;

use crate::abi;
use crate::config::EmuConfig;
use crate::context::ContextModelled;
use crate::cost::CostModel;
use crate::instance::{self, Instance, SLOTS};

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
        let slot = instance::occupy(&instance).ok_or(EmuError::NoFreeSlot)?;
        // SAFETY: the table of slot `slot` holds the emulator's `extern "C"` entry points
        // (abi.rs), compiled into the program and so valid for its whole life; each implements
        // the C contract of its entry for the instance now in that slot (it checks every pointer
        // and handle it is given, turns misuse into the runtime's error codes and catches
        // panics at the boundary).
        let api = unsafe { RknnApi::from_functions(abi::functions_for_slot(slot), "rknn-emu") };
        Ok(Emulator {
            slot,
            instance,
            api,
        })
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
        for c in self.instance.core_totals() {
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
        let c = c.lock().unwrap_or_else(PoisonError::into_inner);
        c.modelled
    }

    /// Zeroes the modelled totals (per-context totals too; contexts stay active).
    pub fn reset_modelled(&self) {
        self.instance.reset_modelled();
    }

    /// Bytes allocated in an IOMMU domain.
    pub fn domain_used(&self, domain: i32) -> u64 {
        self.instance.state().memories.domain_used(domain)
    }
}

impl Drop for Emulator {
    fn drop(&mut self) {
        // Waits for the calls in flight on this emulator.
        instance::vacate(self.slot);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::instance::instance;
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
