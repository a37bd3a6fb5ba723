//! The runtime: which backend runs the matmuls (the real NPU through `librknnrt.so`, or the
//! emulator), the chip, versions, the guards held for the runtime's life, and the errors that
//! `Drop` implementations could not return.
//!
//! A [`Runtime`] is a cheap handle (an `Arc` inside): every context holds one, so the backend
//! lives as long as anything made from it, and drop order is right by construction.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use rknn_chip::{GroupOrder, Int4ConverterInput, ModelledTime, Platform, ShapeRules};
use rknn_sys::{self as sys, RknnApi};

use super::guard::{self, FdLimit, HandleBudget, NpuLock};
use crate::error::{Call, Error, Result, Versions};
use crate::result;

/// Which backend to open.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Backend {
    /// The NPU if one is usable, else the emulator (saying why).
    Auto,
    /// The real NPU through `librknnrt.so` (or a library standing in for it: see
    /// [`RuntimeOptions::runtime_path`]).
    Npu,
    /// The emulator, playing this chip (needs the `emulator` feature, on by default).
    Emulator(Platform),
}

/// When a guard applies.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GuardPolicy {
    /// On the real NPU only (the default: the emulator has none of these hazards).
    NpuOnly,
    /// Always, including on the emulator (how the guards are tested).
    Always,
    /// Never (opt-out).
    Never,
}

impl GuardPolicy {
    fn applies(&self, npu: bool) -> bool {
        match self {
            GuardPolicy::NpuOnly => npu,
            GuardPolicy::Always => true,
            GuardPolicy::Never => false,
        }
    }
}

/// How to open a runtime.
#[derive(Clone, Debug)]
pub struct RuntimeOptions {
    /// The exclusive NPU lock (default: on the NPU only).
    pub lock: GuardPolicy,
    /// Where the lock file lives (default [`guard::DEFAULT_LOCK_PATH`]).
    pub lock_path: PathBuf,
    /// The `mallopt(M_MMAP_MAX, 0)` workaround (default: on the NPU only).
    pub mallopt: GuardPolicy,
    /// Raising RLIMIT_NOFILE's soft limit (default: always, except under Miri).
    pub raise_fd_limit: GuardPolicy,
    /// The memory-handle budget; `None` sizes it from the file-descriptor limit (and, on the
    /// emulator, the emulator's own handle budget).
    pub handle_budget: Option<usize>,
    /// Validate shapes with the user guide's stricter limits (K <= 10240, N <= 4096, f16 N
    /// aligned to 32 on RK3588/RK3576) instead of what the runtime demonstrably accepts. Whether
    /// a runtime enforces them is \[open\]. On the in-process emulator, the limits it enforces
    /// itself ([`rknn_emu::EmuConfig::rules`], e.g. from `RKNN_EMU_STRICT_RULES=1`) apply too
    /// (see [`Runtime::shape_rules`]).
    pub strict_shape_rules: bool,
    /// What `rknn_B_normal_layout_to_native_layout` expects for int4 B (\[open\]: Rockchip's
    /// 2.x demos pack two values per byte, a third-party backend passes one per byte). `None`
    /// (the default) reads `$RKNN_INT4_B_CONVERTER_INPUT` when the runtime opens (packed when
    /// unset; an unknown value is an error). On the emulator this also configures the emulator,
    /// so the two always agree.
    pub int4_converter_input: Option<Int4ConverterInput>,
    /// The order of per-group quantisation parameters of B (\[open\], see
    /// [`GroupOrder`]): how a caller of per-group quantisation (the engine's per-group int4
    /// weights) lays out the scales it sets. `None` (the default) reads
    /// `$RKNN_EMU_GROUP_ORDER` when the runtime opens (`k-major` when unset; an unknown value
    /// is an error). On the emulator this also configures the emulator, so the two agree.
    pub group_order: Option<GroupOrder>,
    /// The in-process emulator's configuration (its `platform` is overridden by
    /// [`Backend::Emulator`], its int4 converter input by
    /// [`RuntimeOptions::int4_converter_input`] and its per-group parameter order by
    /// [`RuntimeOptions::group_order`]). The default is
    /// [`rknn_emu::EmuConfig::from_env`]: the in-process emulator honours every `RKNN_EMU_*`
    /// variable the drop-in library does (`RKNN_EMU_PLATFORM` only where no chip is named, as
    /// for [`Backend::Auto`]'s fallback), so a setting given to a program applies whichever
    /// emulator it runs on. A program that wants a fixed configuration sets this field (for
    /// example to [`rknn_emu::EmuConfig::default`]).
    #[cfg(feature = "emulator")]
    pub emulator: rknn_emu::EmuConfig,
    /// The runtime library to load instead of `$RKNN_RUNTIME_PATH` / `librknnrt.so`.
    pub runtime_path: Option<PathBuf>,
    /// The chip to assume on the NPU instead of reading the device tree (also skips the check
    /// for an NPU device node: how the NPU code path runs on the emulator's drop-in library).
    pub npu_platform: Option<Platform>,
}

impl Default for RuntimeOptions {
    fn default() -> Self {
        RuntimeOptions {
            lock: GuardPolicy::NpuOnly,
            lock_path: PathBuf::from(guard::DEFAULT_LOCK_PATH),
            mallopt: GuardPolicy::NpuOnly,
            raise_fd_limit: if cfg!(miri) {
                GuardPolicy::Never
            } else {
                GuardPolicy::Always
            },
            handle_budget: None,
            strict_shape_rules: false,
            int4_converter_input: None,
            group_order: None,
            #[cfg(feature = "emulator")]
            emulator: rknn_emu::EmuConfig::from_env(),
            runtime_path: None,
            npu_platform: None,
        }
    }
}

/// What fills the function table.
enum Loaded {
    Library(RknnApi),
    #[cfg(feature = "emulator")]
    Emulator(rknn_emu::Emulator),
}

impl Loaded {
    fn api(&self) -> &RknnApi {
        match self {
            Loaded::Library(api) => api,
            #[cfg(feature = "emulator")]
            Loaded::Emulator(emu) => emu.api(),
        }
    }
}

/// Errors that `Drop` could not return, kept until the next call on the runtime reports them.
#[derive(Default)]
struct ReleaseErrors {
    any: AtomicBool,
    errors: Mutex<Vec<Error>>,
}

impl ReleaseErrors {
    fn record(&self, e: Error) {
        self.errors
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(e);
        self.any.store(true, Ordering::Release);
    }

    fn take(&self) -> Vec<Error> {
        if !self.any.load(Ordering::Acquire) {
            return Vec::new();
        }
        let mut errors = self.errors.lock().unwrap_or_else(PoisonError::into_inner);
        self.any.store(false, Ordering::Release);
        std::mem::take(&mut *errors)
    }
}

struct Shared {
    // Dropped last among the fields that matter: nothing made from the runtime outlives it
    // (they all hold the `Arc`), and the lock is released after the backend is gone.
    loaded: Loaded,
    platform: Platform,
    rules: ShapeRules,
    int4_input: Int4ConverterInput,
    group_order: GroupOrder,
    versions: Option<Versions>,
    reason: String,
    fd_limit: Option<FdLimit>,
    budget: HandleBudget,
    released: ReleaseErrors,
    mallopt_applied: bool,
    lock: Option<NpuLock>,
}

impl Drop for Shared {
    fn drop(&mut self) {
        // The last chance to report a failed release: nothing is left to return it from.
        for e in self.released.take() {
            eprintln!("rknn-matmul: {e}");
        }
    }
}

/// An open runtime: cheap to clone (clones share the backend), `Send` and `Sync`, so one
/// runtime serves contexts on several threads (one context per thread at a time).
#[derive(Clone)]
pub struct Runtime {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime")
            .field("backend", &self.backend_name())
            .field("platform", &self.shared.platform)
            .field("versions", &self.shared.versions)
            .field("reason", &self.shared.reason)
            .finish()
    }
}

/// The pieces a backend contributes before the runtime is assembled.
struct Opened {
    loaded: Loaded,
    platform: Platform,
    reason: String,
    npu: bool,
    /// The emulator's own handle limit, when it has one.
    backend_budget: Option<usize>,
    /// The shape limits the in-process emulator enforces itself (its resolved
    /// [`rknn_emu::EmuConfig::rules`]); `None` for a library, whose limits are not known.
    backend_rules: Option<ShapeRules>,
}

impl Runtime {
    /// Opens the emulator for `platform` with default options (so configured by the
    /// `RKNN_EMU_*` variables, see [`RuntimeOptions::emulator`]).
    ///
    /// ```
    /// # if !cfg!(feature = "emulator") { return Ok(()); } // the emulator is not compiled in
    /// use rknn_matmul::{Runtime, Platform};
    /// let rt = Runtime::emulator(Platform::Rk3588)?;
    /// assert!(rt.is_emulator());
    /// assert_eq!(rt.npu_cores(), 3);
    /// # Ok::<(), rknn_matmul::Error>(())
    /// ```
    pub fn emulator(platform: Platform) -> Result<Runtime> {
        Runtime::open(Backend::Emulator(platform), RuntimeOptions::default())
    }

    /// Opens the real NPU with default options.
    pub fn npu() -> Result<Runtime> {
        Runtime::open(Backend::Npu, RuntimeOptions::default())
    }

    /// The NPU if usable, else the emulator playing the platform of
    /// [`RuntimeOptions::emulator`] (by default `RKNN_EMU_PLATFORM`, else RK3588);
    /// [`Runtime::selection_reason`] says which and why.
    pub fn auto() -> Result<Runtime> {
        Runtime::open(Backend::Auto, RuntimeOptions::default())
    }

    /// Opens a backend.
    pub fn open(backend: Backend, mut opts: RuntimeOptions) -> Result<Runtime> {
        if opts.int4_converter_input.is_none() {
            opts.int4_converter_input = Some(Int4ConverterInput::from_env()?);
        }
        if opts.group_order.is_none() {
            opts.group_order = Some(GroupOrder::from_env()?);
        }
        let opened = match backend {
            Backend::Npu => open_npu(&opts)?,
            Backend::Emulator(p) => {
                open_emulator(p, &opts, format!("emulator requested ({})", p.name()))?
            }
            Backend::Auto => match open_npu(&opts) {
                Ok(o) => o,
                Err(e @ Error::NpuBusy { .. }) => return Err(e),
                Err(e) => {
                    let p = fallback_platform(&opts);
                    open_emulator(p, &opts, format!("{e}; using the emulator ({})", p.name()))?
                }
            },
        };
        Runtime::assemble(opened, &opts)
    }

    fn assemble(o: Opened, opts: &RuntimeOptions) -> Result<Runtime> {
        let lock = if opts.lock.applies(o.npu) {
            Some(NpuLock::acquire(&opts.lock_path)?)
        } else {
            None
        };
        let fd_limit = if opts.raise_fd_limit.applies(o.npu) {
            Some(guard::raise_fd_limit()?)
        } else {
            None
        };
        let mut budget = match (opts.handle_budget, fd_limit) {
            (Some(b), _) => b,
            (None, Some(l)) => HandleBudget::for_fd_limit(l.soft).budget(),
            (None, None) => 1020,
        };
        if opts.handle_budget.is_none() {
            if let Some(b) = o.backend_budget {
                budget = budget.min(b);
            }
        }
        let mallopt_applied = opts.mallopt.applies(o.npu) && guard::disable_malloc_mmap();
        let requested = if opts.strict_shape_rules {
            ShapeRules::strict(o.platform)
        } else {
            ShapeRules::accepted(o.platform)
        };
        // Validate at least what the backend enforces, so that a request the in-process
        // emulator would refuse fails here with a typed error, as it does on every other rule.
        let rules = match o.backend_rules {
            Some(enforced) => tightest(requested, enforced),
            None => requested,
        };
        let mut rt = Runtime {
            shared: Arc::new(Shared {
                loaded: o.loaded,
                platform: o.platform,
                rules,
                int4_input: opts.int4_converter_input.unwrap_or_default(),
                group_order: opts.group_order.unwrap_or_default(),
                versions: None,
                reason: o.reason,
                fd_limit,
                budget: HandleBudget::new(budget),
                released: ReleaseErrors::default(),
                mallopt_applied,
                lock,
            }),
        };
        // Whether the runtime answers RKNN_QUERY_SDK_VERSION on a matmul context is [open]: a
        // refusal leaves the versions unreported instead of failing the open. A failure to
        // create the throw-away context, though, means the backend is not usable.
        let versions = match rt.query_versions() {
            Ok(v) => Some(v),
            Err(e) if e.call() == Some(Call::QuerySdkVersion) => None,
            Err(e) => return Err(e),
        };
        Arc::get_mut(&mut rt.shared)
            .expect("the runtime is not shared before open returns")
            .versions = versions;
        Ok(rt)
    }

    /// Asks the runtime for its versions on a throw-away matmul context.
    fn query_versions(&self) -> Result<Versions> {
        let mut info = sys::rknn_matmul_info {
            M: 1,
            K: 32,
            N: 32,
            type_: sys::RKNN_INT8_MM_INT8_TO_INT32,
            ..Default::default()
        };
        // Raw calls: a context handle is a layer above the runtime.
        let (ctx, _) = self.call(|api| result::matmul_create(api, &mut info))?;
        let versions = self.call(|api| result::query_sdk_version(api, ctx));
        // SAFETY: the context just created, with no memories, destroyed once.
        let destroyed = unsafe { result::matmul_destroy(self.api(), ctx) };
        let versions = versions?;
        destroyed?;
        Ok(versions)
    }

    /// Runs a result-layer call: first reports a release that failed earlier (a `Drop` could
    /// not return it), then makes the call and attaches the versions to errors for which a
    /// runtime/driver mismatch is the usual cause. Every FFI call of the safe layer goes
    /// through here, or through the same two steps ([`Runtime::check_released`],
    /// [`Runtime::with_versions`]) on a context's hot path.
    pub(crate) fn call<T>(&self, f: impl FnOnce(&RknnApi) -> Result<T>) -> Result<T> {
        self.check_released()?;
        self.with_versions(f(self.api()))
    }

    /// The first release that failed since the last report, as [`Error::ReleaseFailed`].
    pub(crate) fn check_released(&self) -> Result<()> {
        match self.shared.released.take().into_iter().next() {
            Some(e) => Err(Error::ReleaseFailed(Box::new(e))),
            None => Ok(()),
        }
    }

    /// `r`, with the runtime's versions attached to an error for which a runtime/driver
    /// mismatch is the usual cause.
    pub(crate) fn with_versions<T>(&self, r: Result<T>) -> Result<T> {
        r.map_err(|e| match e {
            Error::Rknn {
                call,
                code,
                detail,
                versions: None,
            } if code.suggests_version_skew() => Error::Rknn {
                call,
                code,
                detail,
                versions: self.shared.versions.clone(),
            },
            e => e,
        })
    }

    /// Records the outcome of a release made in `Drop`, so that a failure is reported by the
    /// next call on this runtime instead of being lost.
    pub(crate) fn released(&self, r: Result<()>) {
        if let Err(e) = r {
            self.shared.released.record(e);
        }
    }

    /// Takes the errors of releases (context or memory destroys in `Drop`) that failed since
    /// the last call reported them. The next fallible call would otherwise report the first.
    pub fn take_release_errors(&self) -> Vec<Error> {
        self.shared.released.take()
    }

    /// The function table of the backend, for calls the safe layer does not wrap (see
    /// [`crate::Matmul::as_raw`]).
    pub fn api(&self) -> &RknnApi {
        self.shared.loaded.api()
    }

    /// Whether this is the built-in emulator.
    pub fn is_emulator(&self) -> bool {
        match &self.shared.loaded {
            Loaded::Library(_) => false,
            #[cfg(feature = "emulator")]
            Loaded::Emulator(_) => true,
        }
    }

    /// Whether the matmuls run on real NPU hardware: a loaded library that is not the
    /// emulator's drop-in (which identifies itself by its `rknn_emu_last_error` extension).
    pub fn is_hardware(&self) -> bool {
        !self.is_emulator() && self.api().rknn_emu_last_error.is_none()
    }

    /// The emulator, when this runtime is one (for its statistics).
    #[cfg(feature = "emulator")]
    pub fn emulator_instance(&self) -> Option<&rknn_emu::Emulator> {
        match &self.shared.loaded {
            Loaded::Emulator(e) => Some(e),
            Loaded::Library(_) => None,
        }
    }

    /// The device time a cost model of the chip gives the runs made so far (in all and per
    /// NPU core, with their runs and operations), when this runtime is the in-process emulator
    /// and the emulator has a cost model of its chip (what the chip would take, not what this
    /// machine took); `None` on any other backend, and for a chip without a cost model (or with
    /// the emulator's cost model turned off), where there is no modelled time to report.
    pub fn modelled_time(&self) -> Option<ModelledTime> {
        #[cfg(feature = "emulator")]
        if let Some(e) = self.emulator_instance() {
            return e.cost_model().is_some().then(|| e.modelled());
        }
        None
    }

    /// "npu" or "emulator".
    pub fn backend_name(&self) -> &'static str {
        if self.is_emulator() {
            "emulator"
        } else {
            "npu"
        }
    }

    /// Why this backend was chosen.
    pub fn selection_reason(&self) -> &str {
        &self.shared.reason
    }

    /// The chip.
    pub fn platform(&self) -> Platform {
        self.shared.platform
    }

    /// The shape rules requests are validated against: the accepted or the strict rules (see
    /// [`RuntimeOptions::strict_shape_rules`]), on the in-process emulator tightened by every
    /// limit the emulator enforces itself ([`rknn_emu::Emulator::rules`]; under
    /// `RKNN_EMU_STRICT_RULES=1` the strict rules).
    pub fn shape_rules(&self) -> ShapeRules {
        self.shared.rules
    }

    /// What the B converter expects for int4 (see [`RuntimeOptions::int4_converter_input`]).
    pub fn int4_converter_input(&self) -> Int4ConverterInput {
        self.shared.int4_input
    }

    /// The order of per-group quantisation parameters of B (see
    /// [`RuntimeOptions::group_order`]).
    pub fn group_order(&self) -> GroupOrder {
        self.shared.group_order
    }

    /// NPU cores of the chip.
    pub fn npu_cores(&self) -> usize {
        self.shared.platform.npu_cores()
    }

    /// Runtime and driver versions, when the runtime reports them.
    pub fn versions(&self) -> Option<&Versions> {
        self.shared.versions.as_ref()
    }

    /// The file-descriptor limit after raising it (when the guard ran).
    pub fn fd_limit(&self) -> Option<FdLimit> {
        self.shared.fd_limit
    }

    /// The memory-handle budget.
    pub fn handle_budget(&self) -> &HandleBudget {
        &self.shared.budget
    }

    /// The NPU lock, when held.
    pub fn npu_lock(&self) -> Option<&NpuLock> {
        self.shared.lock.as_ref()
    }

    /// Whether two handles are the same runtime.
    pub(crate) fn same(&self, other: &Runtime) -> bool {
        Arc::ptr_eq(&self.shared, &other.shared)
    }

    /// Whether the `mallopt(M_MMAP_MAX, 0)` workaround was applied.
    pub fn mallopt_applied(&self) -> bool {
        self.shared.mallopt_applied
    }
}

/// The chip `auto` falls back to: the emulator configuration's (`RKNN_EMU_PLATFORM` by
/// default, see [`RuntimeOptions::emulator`]). Without the emulator it only names the chip in
/// the error.
fn fallback_platform(_opts: &RuntimeOptions) -> Platform {
    #[cfg(feature = "emulator")]
    return _opts.emulator.platform;
    #[cfg(not(feature = "emulator"))]
    std::env::var("RKNN_EMU_PLATFORM")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(Platform::Rk3588)
}

/// The rules that hold where both `a` and `b` hold: the smaller of each limit, and an f16 N
/// alignment that is a multiple of both.
fn tightest(a: ShapeRules, b: ShapeRules) -> ShapeRules {
    let min = |x: Option<usize>, y: Option<usize>| match (x, y) {
        (Some(x), Some(y)) => Some(x.min(y)),
        (x, y) => x.or(y),
    };
    let gcd = |mut x: usize, mut y: usize| {
        while y != 0 {
            (x, y) = (y, x % y);
        }
        x
    };
    let (x, y) = (a.f16_n_align, b.f16_n_align);
    ShapeRules {
        max_k: min(a.max_k, b.max_k),
        max_n: min(a.max_n, b.max_n),
        f16_n_align: if x == 0 || y == 0 {
            x.max(y)
        } else {
            x / gcd(x, y) * y
        },
    }
}

#[cfg(feature = "emulator")]
fn open_emulator(platform: Platform, opts: &RuntimeOptions, reason: String) -> Result<Opened> {
    let cfg = rknn_emu::EmuConfig {
        platform,
        int4_converter_input: opts.int4_converter_input.unwrap_or_default(),
        group_order: opts.group_order.unwrap_or_default(),
        ..opts.emulator.clone()
    };
    let backend_budget = Some(cfg.handle_budget);
    let emu = rknn_emu::Emulator::new(cfg)?;
    let backend_rules = Some(emu.rules());
    Ok(Opened {
        loaded: Loaded::Emulator(emu),
        platform,
        reason,
        npu: false,
        backend_budget,
        backend_rules,
    })
}

#[cfg(not(feature = "emulator"))]
fn open_emulator(platform: Platform, _opts: &RuntimeOptions, reason: String) -> Result<Opened> {
    Err(Error::EmulatorNotCompiled(format!(
        "{reason} (asked to play {platform})"
    )))
}

fn open_npu(opts: &RuntimeOptions) -> Result<Opened> {
    let platform = match opts.npu_platform {
        Some(p) => p,
        None => {
            let p = detect_platform(Path::new("/")).map_err(Error::NoNpu)?;
            if !platform_has_npu_device(Path::new("/")) {
                return Err(Error::NoNpu(format!(
                    "{p} detected but no NPU device node (/dev/dri/renderD* or /dev/rknpu)"
                )));
            }
            p
        }
    };
    // SAFETY: the file is Rockchip's runtime (or a drop-in for it), by the caller's choice of
    // RKNN_RUNTIME_PATH / runtime_path; loading it is the documented way to use the NPU.
    let api = unsafe {
        match &opts.runtime_path {
            Some(p) => RknnApi::load_from(p)?,
            None => RknnApi::load()?,
        }
    };
    let reason = format!("NPU found ({platform}); runtime {}", api.origin());
    Ok(Opened {
        loaded: Loaded::Library(api),
        platform,
        reason,
        npu: true,
        backend_budget: None,
        backend_rules: None,
    })
}

/// Reads the chip from `<root>/proc/device-tree/compatible` (NUL-separated strings such as
/// `rockchip,rk3588`). `root` is `/` on a board; tests pass a fake tree.
pub fn detect_platform(root: &Path) -> std::result::Result<Platform, String> {
    let path = root.join("proc/device-tree/compatible");
    let raw = std::fs::read(&path).map_err(|e| {
        format!(
            "cannot read {}: {e} (not a Rockchip board?)",
            path.display()
        )
    })?;
    let text = String::from_utf8_lossy(&raw);
    for entry in text.split('\0') {
        if let Some(chip) = entry.strip_prefix("rockchip,") {
            // RK3588S and RK3582 share RK3588's NPU.
            let chip = match chip {
                "rk3588s" | "rk3582" => "rk3588",
                other => other,
            };
            if let Ok(p) = chip.parse::<Platform>() {
                return Ok(p);
            }
        }
    }
    Err(format!(
        "no NPU chip in {} ({:?})",
        path.display(),
        text.replace('\0', " ").trim()
    ))
}

/// Whether the NPU's device node exists under `root`.
fn platform_has_npu_device(root: &Path) -> bool {
    root.join("dev/rknpu").exists()
        || std::fs::read_dir(root.join("dev/dri"))
            .map(|d| {
                d.flatten()
                    .any(|e| e.file_name().to_string_lossy().starts_with("renderD"))
            })
            .unwrap_or(false)
}

#[cfg(all(test, feature = "emulator"))]
mod tests {
    use super::*;
    use crate::Call;

    #[test]
    fn versions_are_attached_where_skew_is_the_likely_cause() {
        let rt = Runtime::emulator(Platform::Rk3588).unwrap();
        let skew = rt
            .call(|api| result::check(api, Call::MatmulRun, sys::RKNN_ERR_DEVICE_UNMATCH))
            .unwrap_err()
            .to_string();
        assert!(
            skew.starts_with("rknn_matmul_run failed with RKNN_ERR_DEVICE_UNMATCH (-10)")
                && skew.contains("runtime 2.3.2")
                && skew.contains("version mismatch"),
            "{skew}"
        );
        let plain = rt
            .call(|api| result::check(api, Call::MatmulRun, sys::RKNN_ERR_PARAM_INVALID))
            .unwrap_err()
            .to_string();
        assert!(!plain.contains("version"), "{plain}");
    }
}
