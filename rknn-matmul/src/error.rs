//! Errors: every RKNN code mapped, raw codes kept, the C call named by an enum (never a string
//! to match on), versions attached where skew is the likely cause, and every rule a request
//! broke named with its numbers.

use std::path::PathBuf;

use rknn_chip::{ElemKind, Platform, RuleViolation};
use rknn_sys as sys;

use crate::dtype::Scheme;

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

/// The C function a runtime error came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Call {
    /// `rknn_matmul_create`.
    MatmulCreate,
    /// `rknn_matmul_create_dynamic_shape`.
    MatmulCreateDynamicShape,
    /// `rknn_matmul_set_dynamic_shape`.
    MatmulSetDynamicShape,
    /// `rknn_matmul_set_io_mem`.
    MatmulSetIoMem,
    /// `rknn_matmul_set_core_mask`.
    MatmulSetCoreMask,
    /// `rknn_matmul_set_quant_params`.
    MatmulSetQuantParams,
    /// `rknn_matmul_run`.
    MatmulRun,
    /// `rknn_matmul_destroy`.
    MatmulDestroy,
    /// `rknn_B_normal_layout_to_native_layout`.
    BNormalLayoutToNativeLayout,
    /// `rknn_create_mem`.
    CreateMem,
    /// `rknn_create_mem2`.
    CreateMem2,
    /// `rknn_destroy_mem`.
    DestroyMem,
    /// `rknn_mem_sync`.
    MemSync,
    /// `rknn_query(RKNN_QUERY_SDK_VERSION)`.
    QuerySdkVersion,
}

impl Call {
    /// The C name (with the query command for `rknn_query`).
    pub fn c_name(self) -> &'static str {
        match self {
            Call::MatmulCreate => "rknn_matmul_create",
            Call::MatmulCreateDynamicShape => "rknn_matmul_create_dynamic_shape",
            Call::MatmulSetDynamicShape => "rknn_matmul_set_dynamic_shape",
            Call::MatmulSetIoMem => "rknn_matmul_set_io_mem",
            Call::MatmulSetCoreMask => "rknn_matmul_set_core_mask",
            Call::MatmulSetQuantParams => "rknn_matmul_set_quant_params",
            Call::MatmulRun => "rknn_matmul_run",
            Call::MatmulDestroy => "rknn_matmul_destroy",
            Call::BNormalLayoutToNativeLayout => "rknn_B_normal_layout_to_native_layout",
            Call::CreateMem => "rknn_create_mem",
            Call::CreateMem2 => "rknn_create_mem2",
            Call::DestroyMem => "rknn_destroy_mem",
            Call::MemSync => "rknn_mem_sync",
            Call::QuerySdkVersion => "rknn_query(RKNN_QUERY_SDK_VERSION)",
        }
    }
}

impl std::fmt::Display for Call {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.c_name())
    }
}

/// One of the three matrices of C = A × B.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Matrix {
    /// The left operand (activations), \[M, K\].
    A,
    /// The right operand (weights), \[K, N\].
    B,
    /// The result, \[M, N\].
    C,
}

impl Matrix {
    /// A, B, C in the order of `rknn_matmul_io_attr`.
    pub const ALL: [Matrix; 3] = [Matrix::A, Matrix::B, Matrix::C];

    /// Index into `rknn_matmul_io_attr` order.
    pub(crate) fn index(self) -> usize {
        self as usize
    }

    /// The tensor name the runtime uses in `io_attr` and quant params.
    pub fn name(self) -> &'static str {
        match self {
            Matrix::A => "A",
            Matrix::B => "B",
            Matrix::C => "C",
        }
    }
}

impl std::fmt::Display for Matrix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
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

fn list(values: &[usize]) -> String {
    values
        .iter()
        .map(usize::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// Everything that can go wrong in this crate. Each variant names the rule that was broken and
/// the values that broke it, so a caller can match on the kind and a user can read the cause.
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
        call: Call,
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
        call: Call,
        /// Bytes asked for.
        bytes: u64,
        /// The runtime's reason, when it gives one.
        detail: Option<String>,
    },
    /// Releasing a context or memory failed earlier, in a `Drop` that could not return the
    /// error; it is reported by the next call on the same runtime.
    #[error("an earlier release failed: {0}")]
    ReleaseFailed(Box<Error>),
    /// The request breaks a rule of the chip (checked before any FFI call).
    #[error(transparent)]
    Rule(#[from] RuleViolation),
    /// A linear cannot be split into contexts ([`rknn_chip::plan`]).
    #[error(transparent)]
    Plan(#[from] rknn_chip::plan::PlanError),
    /// A setting read from the environment has an unknown value.
    #[error(transparent)]
    Setting(#[from] rknn_chip::UnknownInt4ConverterInput),
    /// The per-group parameter order read from the environment has an unknown value.
    #[error(transparent)]
    GroupOrderSetting(#[from] rknn_chip::UnknownGroupOrder),
    /// The runtime library could not be loaded.
    #[error(transparent)]
    Load(#[from] rknn_sys::LoadError),
    /// The loaded runtime lacks an optional function this request needs.
    #[error(
        "the runtime does not export {symbol}, which this needs (an older librknnrt? SDK 2.x required)"
    )]
    MissingFunction {
        /// The C symbol.
        symbol: &'static str,
    },
    /// No usable NPU.
    #[error("no usable NPU: {0}")]
    NoNpu(String),
    /// The emulator was asked for, but this build of `rknn-matmul` has no emulator.
    #[error(
        "the emulator is not compiled in (enable the `emulator` feature of rknn-matmul), and {0}"
    )]
    EmulatorNotCompiled(String),
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
        "memory handle budget exhausted: {live} NPU memories are live and the budget is {budget} (each holds a dma-buf file descriptor; the runtime crashes when the process runs out, near 1020 under ulimit -n 1024): raise the file-descriptor limit with `ulimit -n` (on the emulator, also RKNN_EMU_HANDLE_BUDGET)"
    )]
    HandleBudget {
        /// Live memories.
        live: usize,
        /// The budget.
        budget: usize,
    },
    /// An engine linear needs more memory handles than the budget has left.
    #[error(
        "a linear of N={n}, K={k} needs {needed} more NPU memories ({contexts} contexts, {}), but {live} of the budget of {budget} are live: raise the file-descriptor limit with `ulimit -n` (the budget follows its soft limit; on the emulator, also RKNN_EMU_HANDLE_BUDGET), or load less",
        if *shared { "one B each and the cores' shared A and C" } else { "a B, an A and a C each: this runtime does not share A and C between contexts" }
    )]
    HandlesForLinear {
        /// Output features.
        n: usize,
        /// Input features.
        k: usize,
        /// Memories it would allocate.
        needed: usize,
        /// Its contexts (cores × N blocks × K segments).
        contexts: usize,
        /// Whether its contexts share A and C.
        shared: bool,
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
    /// A slice does not hold the number of elements the operation needs.
    #[error("{what} holds {got} elements where {expected} are needed")]
    Length {
        /// What was passed, with the formula of its length ("x (m × in_features)").
        what: &'static str,
        /// Needed.
        expected: usize,
        /// Given.
        got: usize,
    },
    /// A size computed from the request does not fit the type the runtime or this machine uses.
    #[error("{what} = {value} does not fit {limit}")]
    SizeOverflow {
        /// The quantity, with its formula ("bytes of B (K × N × 1)").
        what: &'static str,
        /// Its value, when it is representable at all (as text: it may exceed u64).
        value: String,
        /// The type or limit it exceeds ("u32, the runtime's memory size").
        limit: &'static str,
    },
    /// A memory of another context was passed.
    #[error(
        "{matrix} was allocated on another context (a memory can only be bound to the context it was allocated on)"
    )]
    ForeignMemory {
        /// Which operand.
        matrix: Matrix,
    },
    /// A shared memory of another IOMMU domain than the context's.
    #[error(
        "{matrix} lives in IOMMU domain {memory} but the context is in domain {context} (each domain is its own device address space)"
    )]
    DomainMismatch {
        /// Which operand.
        matrix: Matrix,
        /// The memory's domain.
        memory: i32,
        /// The context's domain.
        context: i32,
    },
    /// A memory allocated for one matrix was passed as another.
    #[error("a memory allocated for {allocated_for} was passed as {passed_as}")]
    WrongMatrix {
        /// What the memory was allocated for.
        allocated_for: Matrix,
        /// Where it was passed.
        passed_as: Matrix,
    },
    /// A memory smaller than the tensor the runtime would read or write through it.
    #[error(
        "{matrix} memory holds {bytes} bytes but the current shape needs {needed} (an out-of-bounds DMA on the board)"
    )]
    MemoryTooSmall {
        /// Which operand.
        matrix: Matrix,
        /// Its size.
        bytes: u64,
        /// The runtime's tensor size.
        needed: u64,
    },
    /// The runtime returned a memory the CPU cannot use.
    #[error("{call} returned a memory without a usable CPU mapping ({reason})")]
    BadMapping {
        /// The allocation call.
        call: Call,
        /// What was wrong (null address, short size, misaligned).
        reason: String,
    },
    /// `set_m` with an M the context was not created for.
    #[error("M={m} is not one of this context's shapes (M = {})", list(shapes))]
    UnknownM {
        /// The M asked for.
        m: usize,
        /// The context's M values.
        shapes: Vec<usize>,
    },
    /// A dynamic-shape list that the runtime cannot take.
    #[error("dynamic M needs 1..={max} distinct values; got {}", describe_ms(ms, *max))]
    DynamicShapes {
        /// The values given.
        ms: Vec<usize>,
        /// `RKNN_MAX_DYNAMIC_SHAPE_NUM`.
        max: usize,
    },
    /// Quantisation parameters of the wrong length.
    #[error("{matrix} {what}: {got} values given, {expected} needed ({rule})")]
    QuantLength {
        /// The matrix.
        matrix: Matrix,
        /// "scales" or "zero points".
        what: &'static str,
        /// Needed.
        expected: usize,
        /// Given.
        got: usize,
        /// The rule ("one per output channel, N").
        rule: &'static str,
    },
    /// A quantisation scale that is not a positive finite number.
    #[error("{matrix} scale #{index} = {value} must be a positive finite number")]
    BadScale {
        /// The matrix.
        matrix: Matrix,
        /// Position in the scale array.
        index: usize,
        /// The value.
        value: f32,
    },
    /// A core that does not exist, or a chip without core selection.
    #[error("core {core} does not exist: {platform} has {cores} NPU core(s){}", if *selectable { "" } else { " and no core selection" })]
    NoSuchCore {
        /// The index asked for.
        core: usize,
        /// The chip.
        platform: Platform,
        /// Its cores.
        cores: usize,
        /// Whether the chip accepts a core mask at all.
        selectable: bool,
    },
    /// An operation that needs B in the native layout, on a context with another layout.
    #[error("{operation} needs a context with B in the native layout (this one has {layout:?})")]
    NeedsNativeB {
        /// What was asked.
        operation: &'static str,
        /// The context's layout of B.
        layout: rknn_chip::Layout,
    },
    /// A source of the wrong element type.
    #[error("{what} must be {expected} for {matmul_type}, got {got}")]
    ElementKind {
        /// What was passed.
        what: &'static str,
        /// The kind needed.
        expected: ElemKind,
        /// The kind given.
        got: ElemKind,
        /// The context's matmul type (C name).
        matmul_type: &'static str,
    },
    /// A value outside the range of its element type (int4 outside -8..=7).
    #[error("{what}[{index}] = {value} is outside {range}")]
    OutOfRange {
        /// What was passed.
        what: &'static str,
        /// Position.
        index: usize,
        /// Value.
        value: i64,
        /// The allowed range.
        range: &'static str,
    },
    /// The runtime reported tensor dimensions this layer cannot use (tile sizes of a native
    /// layout missing or zero).
    #[error("the runtime reported unusable {matrix} dims for the {layout:?} layout: {dims:?}")]
    BadTensorDims {
        /// The matrix.
        matrix: Matrix,
        /// The layout.
        layout: rknn_chip::Layout,
        /// The dims the runtime returned.
        dims: Vec<u32>,
    },
    /// An engine configuration that breaks a rule.
    #[error("engine config: {field}={value} {rule}")]
    EngineConfig {
        /// The field.
        field: &'static str,
        /// Its value.
        value: usize,
        /// The rule it breaks.
        rule: String,
    },
    /// The host could not allocate a buffer this operation needs (its size follows from the
    /// request, e.g. a copy of the weights): out of memory, reported instead of aborting.
    #[error("the host could not allocate {bytes} bytes for {what} (out of memory)")]
    HostAlloc {
        /// The buffer.
        what: &'static str,
        /// Its size.
        bytes: u64,
    },
    /// An engine worker panicked while running a task; the engine should be dropped.
    #[error("engine worker {worker} panicked while running a task")]
    WorkerPanicked {
        /// The worker (NPU core) index.
        worker: usize,
    },
    /// The K-segment sum of an int8 linear could exceed i32, so it would not be exact.
    #[error(
        "K={k} is too large for an exact integer linear: the i32 accumulator is exact only for K <= {max} (the largest product times K must stay below 2^31: 127 × 127 for W8A8, 127 × 7 for W4A8)"
    )]
    KTooLargeForExactSum {
        /// K asked for.
        k: usize,
        /// The largest exact K.
        max: usize,
    },
    /// The emulator could not start.
    #[cfg(feature = "emulator")]
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

fn describe_ms(ms: &[usize], max: usize) -> String {
    if ms.is_empty() {
        return "none".into();
    }
    if ms.len() > max {
        return format!("{} values", ms.len());
    }
    match ms.iter().enumerate().find(|(i, m)| ms[..*i].contains(m)) {
        Some((_, m)) => format!("M={m} twice"),
        None => list(ms),
    }
}

impl Error {
    /// The raw RKNN code, for errors that came from the runtime.
    pub fn rknn_code(&self) -> Option<i32> {
        match self {
            Error::Rknn { code, .. } => Some(code.raw()),
            Error::ReleaseFailed(e) => e.rknn_code(),
            _ => None,
        }
    }

    /// The C call, for errors that came from the runtime.
    pub fn call(&self) -> Option<Call> {
        match self {
            Error::Rknn { call, .. } | Error::AllocFailed { call, .. } => Some(*call),
            Error::ReleaseFailed(e) => e.call(),
            _ => None,
        }
    }
}

/// Result alias.
pub type Result<T, E = Error> = std::result::Result<T, E>;
