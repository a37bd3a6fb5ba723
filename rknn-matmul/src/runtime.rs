//! The runtime: which backend runs the matmuls (the real NPU through `librknnrt.so`, or the
//! emulator), the chip, versions, and the guards held for the runtime's life.

use std::path::{Path, PathBuf};

use rknn_chip::Platform;
use rknn_emu::{EmuConfig, Emulator};
use rknn_sys::{self as sys, RknnApi};

use crate::error::{Error, Result, RknnCode, Versions};
use crate::guard::{self, FdLimit, HandleBudget, NpuLock};

/// Which backend to open.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Backend {
    /// The NPU if one is usable, else the emulator (saying why).
    Auto,
    /// The real NPU through `librknnrt.so`.
    Npu,
    /// The emulator, playing this chip.
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
    /// The emulator's configuration (its `platform` is overridden by [`Backend::Emulator`]).
    pub emulator: EmuConfig,
    /// The runtime library to load instead of `$RKNN_RUNTIME_PATH` / `librknnrt.so`.
    pub runtime_path: Option<PathBuf>,
    /// The chip to assume on the NPU instead of reading the device tree.
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
            emulator: EmuConfig::default(),
            runtime_path: None,
            npu_platform: None,
        }
    }
}

enum Inner {
    Npu(RknnApi),
    Emulator(Emulator),
}

/// An open runtime. Contexts are created from it and cannot outlive it; it is `Sync`, so one
/// runtime can serve contexts on several threads (one context per thread).
pub struct Runtime {
    inner: Inner,
    platform: Platform,
    versions: Option<Versions>,
    reason: String,
    fd_limit: Option<FdLimit>,
    pub(crate) budget: HandleBudget,
    lock: Option<NpuLock>,
    mallopt_applied: bool,
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime")
            .field("backend", &self.backend_name())
            .field("platform", &self.platform)
            .field("versions", &self.versions)
            .field("reason", &self.reason)
            .finish()
    }
}

impl Runtime {
    /// Opens the emulator for `platform` with default options.
    ///
    /// ```
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

    /// The NPU if usable, else the emulator (RK3588, or `RKNN_EMU_PLATFORM`);
    /// [`Runtime::selection_reason`] says which and why.
    pub fn auto() -> Result<Runtime> {
        Runtime::open(Backend::Auto, RuntimeOptions::default())
    }

    /// Opens a backend.
    pub fn open(backend: Backend, opts: RuntimeOptions) -> Result<Runtime> {
        match backend {
            Backend::Npu => Runtime::open_npu(&opts),
            Backend::Emulator(p) => {
                Runtime::open_emulator(p, &opts, format!("emulator requested ({})", p.name()))
            }
            Backend::Auto => match Runtime::open_npu(&opts) {
                Ok(rt) => Ok(rt),
                Err(e @ Error::NpuBusy { .. }) => Err(e),
                Err(e) => {
                    let p = std::env::var("RKNN_EMU_PLATFORM")
                        .ok()
                        .and_then(|v| v.parse().ok())
                        .unwrap_or(Platform::Rk3588);
                    Runtime::open_emulator(
                        p,
                        &opts,
                        format!("{e}; using the emulator ({})", p.name()),
                    )
                }
            },
        }
    }

    fn open_emulator(platform: Platform, opts: &RuntimeOptions, reason: String) -> Result<Runtime> {
        let cfg = EmuConfig {
            platform,
            ..opts.emulator.clone()
        };
        let emu_budget = cfg.handle_budget;
        let emu = Emulator::new(cfg)?;
        let mut rt = Runtime::finish(Inner::Emulator(emu), platform, reason, opts, false)?;
        if opts.handle_budget.is_none() {
            rt.budget = HandleBudget::new(rt.budget.budget().min(emu_budget));
        }
        rt.versions = rt.query_versions().ok();
        Ok(rt)
    }

    fn open_npu(opts: &RuntimeOptions) -> Result<Runtime> {
        let platform = match opts.npu_platform {
            Some(p) => p,
            None => detect_platform(Path::new("/")).map_err(Error::NoNpu)?,
        };
        if !platform_has_npu_device(Path::new("/")) && opts.npu_platform.is_none() {
            return Err(Error::NoNpu(format!(
                "{platform} detected but no NPU device node (/dev/dri/renderD* or /dev/rknpu)"
            )));
        }
        // SAFETY: the file is Rockchip's runtime (or a drop-in for it), by the caller's choice of
        // RKNN_RUNTIME_PATH / runtime_path; loading it is the documented way to use the NPU.
        let api = unsafe {
            match &opts.runtime_path {
                Some(p) => RknnApi::load_from(p)?,
                None => RknnApi::load()?,
            }
        };
        let reason = format!("NPU found ({platform}); runtime {}", api.origin());
        let mut rt = Runtime::finish(Inner::Npu(api), platform, reason, opts, true)?;
        // Whether the runtime answers RKNN_QUERY_SDK_VERSION on a matmul context is [open]: a
        // refusal leaves the versions unreported instead of failing the open. A failure to
        // create the throw-away context, though, means the NPU is not usable.
        rt.versions = match rt.query_versions() {
            Ok(v) => Some(v),
            Err(Error::Rknn {
                call: "rknn_query(RKNN_QUERY_SDK_VERSION)",
                ..
            }) => None,
            Err(e) => return Err(e),
        };
        Ok(rt)
    }

    fn finish(
        inner: Inner,
        platform: Platform,
        reason: String,
        opts: &RuntimeOptions,
        npu: bool,
    ) -> Result<Runtime> {
        let lock = if opts.lock.applies(npu) {
            Some(NpuLock::acquire(&opts.lock_path)?)
        } else {
            None
        };
        let fd_limit = if opts.raise_fd_limit.applies(npu) {
            Some(guard::raise_fd_limit()?)
        } else {
            None
        };
        let budget = match (opts.handle_budget, fd_limit) {
            (Some(b), _) => HandleBudget::new(b),
            (None, Some(l)) => HandleBudget::for_fd_limit(l.soft),
            (None, None) => HandleBudget::new(1020),
        };
        let mallopt_applied = opts.mallopt.applies(npu) && guard::disable_malloc_mmap();
        Ok(Runtime {
            inner,
            platform,
            versions: None,
            reason,
            fd_limit,
            budget,
            lock,
            mallopt_applied,
        })
    }

    /// Asks the runtime for its versions (`RKNN_QUERY_SDK_VERSION` on a throw-away matmul
    /// context; whether the real runtime answers this on a matmul context is \[open\]).
    fn query_versions(&self) -> Result<Versions> {
        let api = self.api();
        let mut info = sys::rknn_matmul_info {
            M: 1,
            K: 32,
            N: 32,
            type_: sys::RKNN_INT8_MM_INT8_TO_INT32,
            ..Default::default()
        };
        let mut io = sys::rknn_matmul_io_attr::default();
        let mut ctx: sys::rknn_matmul_ctx = 0;
        // SAFETY: valid pointers for the call.
        self.check("rknn_matmul_create", unsafe {
            (api.rknn_matmul_create)(&mut ctx, &mut info, &mut io)
        })?;
        let mut v = sys::rknn_sdk_version::default();
        let size = std::mem::size_of::<sys::rknn_sdk_version>() as u32;
        // SAFETY: `v` is a valid rknn_sdk_version of `size` bytes.
        let rc = unsafe {
            (api.rknn_query)(
                ctx,
                sys::RKNN_QUERY_SDK_VERSION,
                (&mut v as *mut sys::rknn_sdk_version).cast(),
                size,
            )
        };
        // SAFETY: the context was created above and owns no memories.
        unsafe { (api.rknn_matmul_destroy)(ctx) };
        self.check("rknn_query(RKNN_QUERY_SDK_VERSION)", rc)?;
        let text = |s: &[std::ffi::c_char]| {
            let b: Vec<u8> = s
                .iter()
                .take_while(|&&c| c != 0)
                .map(|&c| c.to_ne_bytes()[0])
                .collect();
            String::from_utf8_lossy(&b).into_owned()
        };
        Ok(Versions {
            runtime: text(&v.api_version),
            driver: text(&v.drv_version),
        })
    }

    /// The function table of the backend.
    pub fn api(&self) -> &RknnApi {
        match &self.inner {
            Inner::Npu(api) => api,
            Inner::Emulator(emu) => emu.api(),
        }
    }

    /// Maps a return code to a result, with the runtime's reason and, where version skew is
    /// the usual cause, the versions.
    pub fn check(&self, call: &'static str, rc: i32) -> Result<()> {
        if rc >= 0 {
            return Ok(());
        }
        let code = RknnCode::from_raw(rc);
        Err(Error::Rknn {
            call,
            code,
            detail: self.last_error(),
            versions: if code.suggests_version_skew() {
                self.versions.clone()
            } else {
                None
            },
        })
    }

    /// The backend's reason for the last failed call on this thread (the emulator keeps one;
    /// the real runtime logs its reasons instead).
    pub(crate) fn last_error(&self) -> Option<String> {
        match self.inner {
            Inner::Emulator(_) => Some(rknn_emu::last_error()),
            Inner::Npu(_) => None,
        }
    }

    /// Whether this is the emulator.
    pub fn is_emulator(&self) -> bool {
        matches!(self.inner, Inner::Emulator(_))
    }

    /// The emulator, when this runtime is one (for its statistics and configuration).
    pub fn emulator_instance(&self) -> Option<&Emulator> {
        match &self.inner {
            Inner::Emulator(e) => Some(e),
            Inner::Npu(_) => None,
        }
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
        &self.reason
    }

    /// The chip.
    pub fn platform(&self) -> Platform {
        self.platform
    }

    /// NPU cores of the chip.
    pub fn npu_cores(&self) -> usize {
        self.platform.npu_cores()
    }

    /// Runtime and driver versions, when the runtime reports them.
    pub fn versions(&self) -> Option<&Versions> {
        self.versions.as_ref()
    }

    /// The file-descriptor limit after raising it (when the guard ran).
    pub fn fd_limit(&self) -> Option<FdLimit> {
        self.fd_limit
    }

    /// The memory-handle budget.
    pub fn handle_budget(&self) -> &HandleBudget {
        &self.budget
    }

    /// The NPU lock, when held.
    pub fn npu_lock(&self) -> Option<&NpuLock> {
        self.lock.as_ref()
    }

    /// Whether the `mallopt(M_MMAP_MAX, 0)` workaround was applied.
    pub fn mallopt_applied(&self) -> bool {
        self.mallopt_applied
    }
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
