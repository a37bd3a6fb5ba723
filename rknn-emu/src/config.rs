//! The emulator's configuration: the chip it plays, the policies for behaviour the public
//! sources leave \[open\], and the size of the field hazards it reproduces.

use rknn_chip::{Int4ConverterInput, Platform, ShapeRules};

use crate::cost::CostModel;

/// Which cost model an instance keeps modelled device time with (see [`crate::cost`]). A
/// policy resolved against [`EmuConfig::platform`] when the instance is created, like
/// [`RulesPolicy`].
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub enum CostPolicy {
    /// The platform's model, if it has one ([`CostModel::for_platform`]: RK3588's, calibrated,
    /// and RK3576's, built from public figures and RK3588's calibration; default).
    #[default]
    Calibrated,
    /// This model, whatever the platform.
    Custom(CostModel),
    /// No modelled time.
    Off,
}

impl CostPolicy {
    /// The model this policy means on `platform`.
    pub fn resolve(self, platform: Platform) -> Option<CostModel> {
        match self {
            CostPolicy::Calibrated => CostModel::for_platform(platform).copied(),
            CostPolicy::Custom(m) => Some(m),
            CostPolicy::Off => None,
        }
    }
}

/// How many NPU cores the cost model takes to be streaming at once during a run (they share
/// the DDR bandwidth). The emulator cannot observe the device's concurrency (the host's threads
/// are not the NPU's cores), so it infers it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum BusyCores {
    /// The distinct cores among the live contexts that have run at least once (default): one
    /// context alone is one core; one context per core driven from one thread each, as the
    /// engine and `mm_concurrent` do, is all of them. A context on the automatic core (mask 0)
    /// counts as core 0.
    #[default]
    ActiveContexts,
    /// Always this many.
    Fixed(usize),
}

/// Which shape limits an instance enforces beyond the per-chip tables. A policy, not the
/// limits themselves: it is resolved against [`EmuConfig::platform`] when the instance is
/// created, so changing only the platform never keeps another chip's limits.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum RulesPolicy {
    /// What the runtime demonstrably accepts on the chip ([`ShapeRules::accepted`], default).
    #[default]
    Accepted,
    /// The user guide's stricter limits ([`ShapeRules::strict`]).
    Strict,
    /// Exactly these limits, whatever the chip.
    Custom(ShapeRules),
}

impl RulesPolicy {
    /// The limits this policy means on `platform`.
    pub const fn resolve(self, platform: Platform) -> ShapeRules {
        match self {
            RulesPolicy::Accepted => ShapeRules::accepted(platform),
            RulesPolicy::Strict => ShapeRules::strict(platform),
            RulesPolicy::Custom(rules) => rules,
        }
    }
}

/// What i4 × i4 → i16 does when a sum leaves the i16 range (K > 511 with extreme values).
/// The hardware's behaviour is \[open\] (a weak hint says saturate).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Overflow {
    /// Clamp to `i16::MIN..=i16::MAX` (default).
    Saturate,
    /// Keep the low 16 bits (two's complement wrap).
    Wrap,
}

/// Rounding of requantised outputs (i8 → i8, and f32 → f16 never uses this: IEEE
/// round-to-nearest-even there). The hardware's mode is \[open\].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rounding {
    /// Round half away from zero (default).
    HalfAwayFromZero,
    /// Round half to even.
    HalfEven,
}

/// The nibble order of int4 B in the native layout, as `rknn_B_normal_layout_to_native_layout`
/// writes it and a run reads it (\[open\]; normal and native A are low nibble first \[hw\]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum NibbleOrder {
    /// The even element of each byte in the low nibble, as in every other int4 layout (default).
    #[default]
    LowFirst,
    /// The even element in the high nibble.
    HighFirst,
}

/// When an input bound in the native layout is read (\[open\]: whether the runtime copies or
/// rearranges it at `set_io_mem`, or the NPU reads the memory when it runs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum NativeInputs {
    /// By every run, from the memory's device view: a write synced after the bind is seen
    /// without binding again (default).
    #[default]
    AtRun,
    /// Once, at `set_io_mem`, like an input in a normal layout.
    AtBind,
}

/// The order of per-group quantisation parameters of B (\[open\]): the SDK's one setting,
/// shared with the safe layer ([`rknn_chip::GroupOrder`]).
pub use rknn_chip::GroupOrder;

/// Whether `rknn_matmul_set_io_mem` binds a memory created on another context of the same
/// IOMMU domain (\[open\]: the public sources do not say whether Rockchip's runtime accepts a
/// memory of one matmul context in another; sharing A and C between the contexts of one core
/// needs it).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SharedMemories {
    /// Any live memory of the instance in the context's IOMMU domain is bound (default).
    #[default]
    Accept,
    /// A memory created on another context fails with `RKNN_ERR_PARAM_INVALID`; a memory of the
    /// context itself, or one created without a context (`RKNN_MEM_FLAG_ALLOC_NO_CONTEXT` on
    /// handle 0), is bound.
    Refuse,
}

/// Everything an emulator instance can be told.
#[derive(Clone, Debug, PartialEq)]
pub struct EmuConfig {
    /// The chip to emulate (default RK3588).
    pub platform: Platform,
    /// Shape limits beyond the per-chip tables, resolved for `platform` when the instance is
    /// created (default: what the runtime accepts on that chip). [`crate::Emulator::rules`]
    /// gives the resolved limits.
    pub rules: RulesPolicy,
    /// i4 × i4 → i16 overflow policy (default saturate).
    pub i16_overflow: Overflow,
    /// Requantisation rounding (default half away from zero).
    pub rounding: Rounding,
    /// Live memories allowed before `rknn_create_mem*` fails, like the real process running out
    /// of file descriptors near 1020 dma-buf handles under `ulimit -n 1024` (default 1020).
    pub handle_budget: usize,
    /// Bytes one IOMMU domain holds (default 4 GiB).
    pub iommu_domain_bytes: u64,
    /// Emulate non-coherent caches: the device sees CPU writes only after
    /// `rknn_mem_sync(TO_DEVICE)` (or at `set_io_mem`, which reads the data), and the CPU sees
    /// the device's output only after `rknn_mem_sync(FROM_DEVICE)`. Off by default so that C
    /// programs written for coherent memory work; the safe layer's tests turn it on to prove that
    /// it syncs.
    pub strict_cache: bool,
    /// How `rknn_B_normal_layout_to_native_layout` reads int4 B (\[open\], default packed two
    /// per byte as Rockchip's demos do; see [`Int4ConverterInput`]).
    pub int4_converter_input: Int4ConverterInput,
    /// Nibble order of native int4 B (\[open\], default low nibble first).
    pub native_b_nibbles: NibbleOrder,
    /// When native inputs are read (\[open\], default by every run).
    pub native_inputs: NativeInputs,
    /// Order of per-group B quantisation parameters (\[open\], default `[K/G][N]`).
    pub group_order: GroupOrder,
    /// Whether a memory created on one context is bound in another context of the same IOMMU
    /// domain (\[open\], default accept).
    pub shared_memories: SharedMemories,
    /// Whether `rknn_query(RKNN_QUERY_SDK_VERSION)` answers on a matmul context (\[open\],
    /// default yes). When not, it fails with `RKNN_ERR_CTX_INVALID`, as for a handle the
    /// model API does not know.
    pub sdk_version_on_matmul: bool,
    /// Print every error on stderr as the real runtime logs its reasons (`E RKNN: ...`), so a C
    /// program that gets -5 sees why (default on; `RKNN_EMU_LOG=0` turns it off through
    /// [`EmuConfig::from_env`], in the drop-in and in `rknn-matmul`'s default in-process emulator).
    /// The message is also kept for `rknn_emu_last_error` either way.
    pub log_errors: bool,
    /// The cost model that keeps a modelled device time for every run (default: the platform's
    /// calibrated model; [`crate::Emulator::modelled`] reads it).
    pub cost: CostPolicy,
    /// How the cost model counts the cores running at once (default: from the active contexts).
    pub busy_cores: BusyCores,
}

impl EmuConfig {
    /// The default configuration for `platform`.
    pub fn new(platform: Platform) -> EmuConfig {
        EmuConfig {
            platform,
            rules: RulesPolicy::Accepted,
            i16_overflow: Overflow::Saturate,
            rounding: Rounding::HalfAwayFromZero,
            handle_budget: 1020,
            iommu_domain_bytes: 4 << 30,
            strict_cache: false,
            int4_converter_input: Int4ConverterInput::Packed,
            native_b_nibbles: NibbleOrder::LowFirst,
            native_inputs: NativeInputs::AtRun,
            group_order: GroupOrder::KMajor,
            shared_memories: SharedMemories::Accept,
            sdk_version_on_matmul: true,
            log_errors: true,
            cost: CostPolicy::Calibrated,
            busy_cores: BusyCores::ActiveContexts,
        }
    }

    /// The configuration read from the environment: the drop-in library's (read once, at its
    /// first call), and that of the in-process emulator `rknn-matmul` opens with its default
    /// options (read when the options are made; there `RKNN_EMU_PLATFORM` applies only where the
    /// program names no chip):
    ///
    /// | variable | values | default |
    /// |---|---|---|
    /// | `RKNN_EMU_PLATFORM` | rk3588, rk3576, rk3562, rk3566, rk3568 | rk3588 |
    /// | `RKNN_EMU_STRICT_RULES` | 1 = the user guide's stricter shape limits | 0 |
    /// | `RKNN_EMU_I16_OVERFLOW` | saturate, wrap | saturate |
    /// | `RKNN_EMU_ROUNDING` | half-away, half-even | half-away |
    /// | `RKNN_EMU_HANDLE_BUDGET` | live memories | 1020 |
    /// | `RKNN_EMU_IOMMU_DOMAIN_BYTES` | bytes one IOMMU domain holds | 4294967296 |
    /// | `RKNN_EMU_STRICT_CACHE` | 1 = non-coherent cache emulation | 0 |
    /// | `RKNN_INT4_B_CONVERTER_INPUT` ([`rknn_chip::INT4_CONVERTER_INPUT_ENV`], shared with the safe layer) | packed, one-per-byte | packed |
    /// | `RKNN_EMU_NATIVE_B_NIBBLES` | low-first, high-first | low-first |
    /// | `RKNN_EMU_NATIVE_INPUTS` | run, bind | run |
    /// | `RKNN_EMU_GROUP_ORDER` ([`rknn_chip::GROUP_ORDER_ENV`], shared with the safe layer) | k-major, n-major | k-major |
    /// | `RKNN_EMU_SHARED_MEMORIES` | accept, refuse = a memory of another context is not bound | accept |
    /// | `RKNN_EMU_SDK_VERSION_ON_MATMUL` | 1 = answered, 0 = refused | 1 |
    /// | `RKNN_EMU_LOG` | 0 = no error lines on stderr | 1 |
    ///
    /// Unknown values are reported on stderr and replaced by the default, since a C caller has
    /// no other channel for the error.
    pub fn from_env() -> EmuConfig {
        EmuConfig::from_vars(|name| std::env::var(name).ok())
    }

    /// The configuration that the variables of [`EmuConfig::from_env`] describe, read through
    /// `var` instead of the environment: how a program builds the configuration a drop-in
    /// library would have under given settings without changing its own environment.
    ///
    /// ```
    /// use rknn_emu::{EmuConfig, Overflow};
    /// let cfg = EmuConfig::from_vars(|name| (name == "RKNN_EMU_I16_OVERFLOW").then(|| "wrap".into()));
    /// assert_eq!(cfg.i16_overflow, Overflow::Wrap);
    /// assert_eq!(EmuConfig::from_vars(|_| None), EmuConfig::default());
    /// ```
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> EmuConfig {
        let var = |name: &str| var(name).filter(|v| !v.is_empty());
        let warn =
            |name: &str, v: &str| eprintln!("rknn-emu: ignoring {name}={v:?} (see rknn-emu docs)");
        let platform = match var("RKNN_EMU_PLATFORM") {
            Some(v) => v.parse().unwrap_or_else(|e| {
                eprintln!("rknn-emu: {e}; using rk3588");
                Platform::Rk3588
            }),
            None => Platform::Rk3588,
        };
        let mut cfg = EmuConfig::new(platform);
        if var("RKNN_EMU_STRICT_RULES").as_deref() == Some("1") {
            cfg.rules = RulesPolicy::Strict;
        }
        match var("RKNN_EMU_I16_OVERFLOW").as_deref() {
            None | Some("saturate") => {}
            Some("wrap") => cfg.i16_overflow = Overflow::Wrap,
            Some(v) => warn("RKNN_EMU_I16_OVERFLOW", v),
        }
        match var("RKNN_EMU_ROUNDING").as_deref() {
            None | Some("half-away") => {}
            Some("half-even") => cfg.rounding = Rounding::HalfEven,
            Some(v) => warn("RKNN_EMU_ROUNDING", v),
        }
        if let Some(v) = var("RKNN_EMU_HANDLE_BUDGET") {
            match v.parse() {
                Ok(n) => cfg.handle_budget = n,
                Err(_) => warn("RKNN_EMU_HANDLE_BUDGET", &v),
            }
        }
        if let Some(v) = var("RKNN_EMU_IOMMU_DOMAIN_BYTES") {
            match v.parse() {
                Ok(n) => cfg.iommu_domain_bytes = n,
                Err(_) => warn("RKNN_EMU_IOMMU_DOMAIN_BYTES", &v),
            }
        }
        cfg.strict_cache = var("RKNN_EMU_STRICT_CACHE").as_deref() == Some("1");
        match var(rknn_chip::INT4_CONVERTER_INPUT_ENV).map(|v| v.parse::<Int4ConverterInput>()) {
            None => {}
            Some(Ok(v)) => cfg.int4_converter_input = v,
            Some(Err(e)) => eprintln!("rknn-emu: {e}; using packed"),
        }
        match var("RKNN_EMU_NATIVE_B_NIBBLES").as_deref() {
            None | Some("low-first") => {}
            Some("high-first") => cfg.native_b_nibbles = NibbleOrder::HighFirst,
            Some(v) => warn("RKNN_EMU_NATIVE_B_NIBBLES", v),
        }
        match var("RKNN_EMU_NATIVE_INPUTS").as_deref() {
            None | Some("run") => {}
            Some("bind") => cfg.native_inputs = NativeInputs::AtBind,
            Some(v) => warn("RKNN_EMU_NATIVE_INPUTS", v),
        }
        match var("RKNN_EMU_GROUP_ORDER").as_deref() {
            None | Some("k-major") => {}
            Some("n-major") => cfg.group_order = GroupOrder::NMajor,
            Some(v) => warn("RKNN_EMU_GROUP_ORDER", v),
        }
        match var("RKNN_EMU_SHARED_MEMORIES").as_deref() {
            None | Some("accept") => {}
            Some("refuse") => cfg.shared_memories = SharedMemories::Refuse,
            Some(v) => warn("RKNN_EMU_SHARED_MEMORIES", v),
        }
        match var("RKNN_EMU_SDK_VERSION_ON_MATMUL").as_deref() {
            None | Some("1") => {}
            Some("0") => cfg.sdk_version_on_matmul = false,
            Some(v) => warn("RKNN_EMU_SDK_VERSION_ON_MATMUL", v),
        }
        match var("RKNN_EMU_LOG").as_deref() {
            None | Some("1") => {}
            Some("0") => cfg.log_errors = false,
            Some(v) => warn("RKNN_EMU_LOG", v),
        }
        cfg
    }
}

impl Default for EmuConfig {
    fn default() -> Self {
        EmuConfig::new(Platform::Rk3588)
    }
}
