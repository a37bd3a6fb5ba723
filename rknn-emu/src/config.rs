//! The emulator's configuration: the chip it plays, the policies for behaviour the public
//! sources leave \[open\], and the size of the field hazards it reproduces.

use rknn_chip::{Platform, ShapeRules};

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

/// Everything an emulator instance can be told.
#[derive(Clone, Debug, PartialEq)]
pub struct EmuConfig {
    /// The chip to emulate (default RK3588).
    pub platform: Platform,
    /// Shape limits beyond the per-chip tables (default: what the runtime accepts).
    pub rules: ShapeRules,
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
}

impl EmuConfig {
    /// The default configuration for `platform`.
    pub fn new(platform: Platform) -> EmuConfig {
        EmuConfig {
            platform,
            rules: ShapeRules::accepted(platform),
            i16_overflow: Overflow::Saturate,
            rounding: Rounding::HalfAwayFromZero,
            handle_budget: 1020,
            iommu_domain_bytes: 4 << 30,
            strict_cache: false,
        }
    }

    /// The configuration of the drop-in library, read from the environment:
    ///
    /// | variable | values | default |
    /// |---|---|---|
    /// | `RKNN_EMU_PLATFORM` | rk3588, rk3576, rk3562, rk3566, rk3568 | rk3588 |
    /// | `RKNN_EMU_STRICT_RULES` | 1 = the user guide's stricter shape limits | 0 |
    /// | `RKNN_EMU_I16_OVERFLOW` | saturate, wrap | saturate |
    /// | `RKNN_EMU_ROUNDING` | half-away, half-even | half-away |
    /// | `RKNN_EMU_HANDLE_BUDGET` | live memories | 1020 |
    /// | `RKNN_EMU_STRICT_CACHE` | 1 = non-coherent cache emulation | 0 |
    ///
    /// Unknown values are reported on stderr and replaced by the default, since a C caller has
    /// no other channel for the error.
    pub fn from_env() -> EmuConfig {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
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
            cfg.rules = ShapeRules::strict(platform);
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
        cfg.strict_cache = var("RKNN_EMU_STRICT_CACHE").as_deref() == Some("1");
        cfg
    }
}

impl Default for EmuConfig {
    fn default() -> Self {
        EmuConfig::new(Platform::Rk3588)
    }
}
