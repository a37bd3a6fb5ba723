//! Errors: every RKNN code mapped, raw codes kept, versions attached where skew is the likely
//! cause, and the rule a request broke named with its numbers.

use std::path::PathBuf;

use rknn_chip::{Platform, RuleViolation};
use rknn_sys as sys;

use crate::capability::Scheme;

/// The RKNN runtime's error codes (fact sheet §3), with unknown values kept raw.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RknnCode {
    /// -1: generic failure.
    Fail,
    /// -2: timeout.
    Timeout,
    /// -3: the NPU device is unavailable.
    DeviceUnavailable,
    /// -4: memory allocation failed.
    MallocFail,
    /// -5: a parameter is invalid (also: a matmul type the chip lacks).
    ParamInvalid,
    /// -6: model invalid.
    ModelInvalid,
    /// -7: context invalid.
    CtxInvalid,
    /// -8: input invalid.
    InputInvalid,
    /// -9: output invalid.
    OutputInvalid,
    /// -10: the runtime and the kernel driver do not match.
    DeviceUnmatch,
    /// -11: incompatible pre-compiled model.
    IncompatiblePreCompileModel,
    /// -12: incompatible optimisation level.
    IncompatibleOptimizationLevel,
    /// -13: target platform mismatch.
    TargetPlatformUnmatch,
    /// Any other code, kept as it came.
    Other(i32),
}

impl RknnCode {
    /// Maps a raw return code (negative).
    pub fn from_raw(code: i32) -> RknnCode {
        match code {
            sys::RKNN_ERR_FAIL => RknnCode::Fail,
            sys::RKNN_ERR_TIMEOUT => RknnCode::Timeout,
            sys::RKNN_ERR_DEVICE_UNAVAILABLE => RknnCode::DeviceUnavailable,
            sys::RKNN_ERR_MALLOC_FAIL => RknnCode::MallocFail,
            sys::RKNN_ERR_PARAM_INVALID => RknnCode::ParamInvalid,
            sys::RKNN_ERR_MODEL_INVALID => RknnCode::ModelInvalid,
            sys::RKNN_ERR_CTX_INVALID => RknnCode::CtxInvalid,
            sys::RKNN_ERR_INPUT_INVALID => RknnCode::InputInvalid,
            sys::RKNN_ERR_OUTPUT_INVALID => RknnCode::OutputInvalid,
            sys::RKNN_ERR_DEVICE_UNMATCH => RknnCode::DeviceUnmatch,
            sys::RKNN_ERR_INCOMPATILE_PRE_COMPILE_MODEL => RknnCode::IncompatiblePreCompileModel,
            sys::RKNN_ERR_INCOMPATILE_OPTIMIZATION_LEVEL_VERSION => {
                RknnCode::IncompatibleOptimizationLevel
            }
            sys::RKNN_ERR_TARGET_PLATFORM_UNMATCH => RknnCode::TargetPlatformUnmatch,
            other => RknnCode::Other(other),
        }
    }

    /// The raw code.
    pub fn raw(self) -> i32 {
        match self {
            RknnCode::Fail => sys::RKNN_ERR_FAIL,
            RknnCode::Timeout => sys::RKNN_ERR_TIMEOUT,
            RknnCode::DeviceUnavailable => sys::RKNN_ERR_DEVICE_UNAVAILABLE,
            RknnCode::MallocFail => sys::RKNN_ERR_MALLOC_FAIL,
            RknnCode::ParamInvalid => sys::RKNN_ERR_PARAM_INVALID,
            RknnCode::ModelInvalid => sys::RKNN_ERR_MODEL_INVALID,
            RknnCode::CtxInvalid => sys::RKNN_ERR_CTX_INVALID,
            RknnCode::InputInvalid => sys::RKNN_ERR_INPUT_INVALID,
            RknnCode::OutputInvalid => sys::RKNN_ERR_OUTPUT_INVALID,
            RknnCode::DeviceUnmatch => sys::RKNN_ERR_DEVICE_UNMATCH,
            RknnCode::IncompatiblePreCompileModel => sys::RKNN_ERR_INCOMPATILE_PRE_COMPILE_MODEL,
            RknnCode::IncompatibleOptimizationLevel => {
                sys::RKNN_ERR_INCOMPATILE_OPTIMIZATION_LEVEL_VERSION
            }
            RknnCode::TargetPlatformUnmatch => sys::RKNN_ERR_TARGET_PLATFORM_UNMATCH,
            RknnCode::Other(c) => c,
        }
    }

    /// Whether a version mismatch between runtime and driver is the usual cause.
    pub fn suggests_version_skew(self) -> bool {
        matches!(
            self,
            RknnCode::DeviceUnavailable
                | RknnCode::DeviceUnmatch
                | RknnCode::IncompatiblePreCompileModel
                | RknnCode::IncompatibleOptimizationLevel
                | RknnCode::TargetPlatformUnmatch
        )
    }
}

impl std::fmt::Display for RknnCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match sys::error_name(self.raw()) {
            Some(name) => write!(f, "{name} ({})", self.raw()),
            None => write!(f, "undocumented error code {}", self.raw()),
        }
    }
}

/// Runtime and driver versions, as the runtime reports them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Versions {
    /// The runtime library's version (`api_version`).
    pub runtime: String,
    /// The kernel driver's version (`drv_version`).
    pub driver: String,
}

impl std::fmt::Display for Versions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "runtime {}, driver {}", self.runtime, self.driver)
    }
}

fn skew_note(versions: &Option<Versions>) -> String {
    match versions {
        Some(v) => format!("; {v} (a runtime/driver version mismatch is the usual cause)"),
        None => String::new(),
    }
}

fn detail_note(detail: &Option<String>) -> String {
    match detail {
        Some(d) if !d.is_empty() => format!(": {d}"),
        _ => String::new(),
    }
}

/// Everything that can go wrong in this crate.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A runtime call returned an error code.
    #[error(
        "{call} failed with {code}{}{}",
        detail_note(detail),
        skew_note(versions)
    )]
    Rknn {
        /// The C function.
        call: &'static str,
        /// The code.
        code: RknnCode,
        /// The runtime's reason, when it gives one (the emulator does).
        detail: Option<String>,
        /// Versions, attached when skew is the likely cause.
        versions: Option<Versions>,
    },
    /// A memory allocation returned NULL.
    #[error("{call} returned NULL for {bytes} bytes{}", detail_note(detail))]
    AllocFailed {
        /// The C function.
        call: &'static str,
        /// Bytes asked for.
        bytes: usize,
        /// The runtime's reason, when it gives one.
        detail: Option<String>,
    },
    /// The request breaks a rule of the chip (checked before any FFI call).
    #[error(transparent)]
    Rule(#[from] RuleViolation),
    /// The runtime library could not be loaded.
    #[error(transparent)]
    Load(#[from] rknn_sys::LoadError),
    /// No usable NPU.
    #[error("no usable NPU: {0}")]
    NoNpu(String),
    /// Another process holds the NPU.
    #[error("NPU busy (held by pid {}) — lock file {}; the NPU is single-tenant: two processes driving it have panicked the kernel", pid.map_or("unknown".to_string(), |p| p.to_string()), path.display())]
    NpuBusy {
        /// The holder, when the lock file names it.
        pid: Option<u32>,
        /// The lock file.
        path: PathBuf,
    },
    /// Allocating another memory would exceed the handle budget.
    #[error(
        "memory handle budget exhausted: {live} NPU memories are live and the budget is {budget} (each holds a dma-buf file descriptor; the runtime crashes when the process runs out, near 1020 under ulimit -n 1024)"
    )]
    HandleBudget {
        /// Live memories.
        live: usize,
        /// The budget.
        budget: usize,
    },
    /// The chip cannot run a quantisation scheme.
    #[error("{scheme} is not supported on {platform}: {reason}")]
    Unsupported {
        /// The scheme asked for.
        scheme: Scheme,
        /// The chip.
        platform: Platform,
        /// Why.
        reason: String,
    },
    /// A slice or value does not have the size the context needs.
    #[error("{what}: expected {expected} elements, got {got}")]
    Size {
        /// What was passed.
        what: &'static str,
        /// Needed.
        expected: usize,
        /// Given.
        got: usize,
    },
    /// A request that is invalid for this context.
    #[error("{0}")]
    Invalid(String),
    /// The emulator could not start.
    #[error(transparent)]
    Emulator(#[from] rknn_emu::EmuError),
    /// An operating-system call failed.
    #[error("{what}: {source}")]
    Os {
        /// What was being done.
        what: String,
        /// The error.
        source: std::io::Error,
    },
}

impl Error {
    /// The raw RKNN code, for errors that came from the runtime.
    pub fn rknn_code(&self) -> Option<i32> {
        match self {
            Error::Rknn { code, .. } => Some(code.raw()),
            _ => None,
        }
    }
}

/// Result alias.
pub type Result<T, E = Error> = std::result::Result<T, E>;
