//! The command-line flags of loading a model, shared by `llm-decode` and `llm-server`
//! ([`LoadArgs`], a clap `Args` group to `#[command(flatten)]` into any program's flags), and
//! the [`ModelBuilder`] they make. Feature `cli`.

use std::num::NonZeroU16;
use std::path::PathBuf;

use clap::ValueEnum;

use rknn_matmul::Platform;
use rknn_matmul::engine::WeightFormat;

use crate::builder::{Backend, LoadError, ModelBuilder};
use crate::model::{CacheType, EngineOptions, ExpertPlacement, Residual, WeightCache};

/// `--backend`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum BackendArg {
    /// The NPU if there is one, else the NPU emulator (the same code path either way).
    Auto,
    /// The NPU through librknnrt.so ($RKNN_RUNTIME_PATH to load another, e.g. the emulator's
    /// drop-in library).
    Npu,
    /// The NPU emulator.
    Emulator,
    /// The host f32 reference path (no NPU).
    F32,
}

/// `--residual`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ResidualArg {
    /// None.
    None,
    /// The output head only (top-1 agreement with f32 below the 96 % bar for some seeds).
    Output,
    /// The output head and the feed-forward down projections (default).
    OutputDown,
    /// Every linear (the widest accuracy margin; prefill does twice the integer work).
    All,
}

/// `--npu-experts`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ExpertsArg {
    /// Each expert whole on one NPU core, the chosen experts running on their cores at once
    /// (default).
    PerCore,
    /// Each expert split over every core, one expert after another.
    Split,
}

/// `--cache-type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum CacheTypeArg {
    /// f32 keys and values (exact; the default).
    F32,
    /// f16 keys and values, as llama.cpp's default cache: half the memory and half the bytes
    /// attention reads per position.
    F16,
}

/// `--wtype`. Each variant's accuracy is the demo model's (SmolLM2-135M, teacher-forced
/// against the f32 path, docs/llm.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum WType {
    /// int8 weights and activations (per-channel and per-row scales); every chip. Accuracy:
    /// top-1 96 %, perplexity +0.3 %.
    W8a8,
    /// f16 weights and activations; every chip. Accuracy: top-1 99.8 %, perplexity +0.01 %.
    F16,
    /// int4 weights (per-channel scales, or per group with --int4-group) and f16
    /// activations: half W8A8's weight bytes. RK3576 only (f16 × i4); refused on other chips.
    /// Accuracy: per channel top-1 55 %, perplexity +76 % (one scale per row cannot hold a
    /// 4-bit GGUF's groups); --int4-group 32 top-1 98 %, perplexity +0.01 %.
    W4a16,
    /// int4 weights (per-channel scales) and int8 activations (per-row scales, residual rows
    /// as W8A8's): half W8A8's weight bytes, exact integer sums. RK3576 only (i8 × i4);
    /// refused on other chips. Accuracy: top-1 55 %, perplexity +77 %.
    W4a8,
}

/// Where the weight matmuls run and how weights and the KV cache are stored.
#[derive(Debug, Clone, clap::Args)]
pub struct LoadArgs {
    /// Where the weight matmuls run.
    #[arg(long, value_enum, default_value_t = BackendArg::Auto)]
    pub backend: BackendArg,
    /// Weight type on the NPU (default w8a8).
    #[arg(long, value_enum)]
    pub wtype: Option<WType>,
    /// W4A16 with per-group int4 weights: a scale and an offset per group of N input features
    /// of each output channel (min/max, which reproduces a Q4_0/Q4_1 GGUF block exactly at
    /// 32) instead of one scale per channel. Only with --wtype w4a16 (RK3576); a multiple of
    /// 32 dividing 4096. Those linears run unrotated; the output head, and tensors the GGUF
    /// stores in more than 5 bits per weight (Q5_0, Q6_K, Q8_0, f16...), stay W8A8.
    #[arg(long, value_name = "N")]
    pub int4_group: Option<NonZeroU16>,
    /// W8A8 without rotating the linears' inputs (a random orthogonal transform that keeps
    /// W8A8 close to f32; on by default).
    #[arg(long)]
    pub no_rotation: bool,
    /// Which W8A8 linears quantise each activation row twice (the row, then its residual: about
    /// 15 bits of precision from int8 arithmetic, for a second row through the NPU). Default:
    /// the model family's (output-down; all for gemma3).
    #[arg(long, value_enum)]
    pub residual: Option<ResidualArg>,
    /// Seed of the W8A8 input rotations (default: the engine's).
    #[arg(long)]
    pub rotation_seed: Option<u64>,
    /// The chip: the one the emulator plays (default rk3588), or the one to assume on the NPU
    /// instead of reading the device tree.
    #[arg(long)]
    pub platform: Option<Platform>,
    /// The largest N of one NPU context (default: the chip's largest measured, 8192 on
    /// RK3588, or 4096 where the runtime refuses it; the engine tries once at start).
    #[arg(long, value_name = "N")]
    pub npu_max_n: Option<usize>,
    /// Give every NPU context its own A and C memories instead of one pair per core (three
    /// handles per context instead of one; the engine does this by itself on a runtime that
    /// refuses a memory of another context).
    #[arg(long)]
    pub npu_no_shared_io: bool,
    /// NPU cores to use (default: all the chip has; on the emulator no more than this
    /// machine's CPUs, since each emulated core is a busy thread).
    #[arg(long, value_name = "N")]
    pub npu_cores: Option<usize>,
    /// Bytes one IOMMU domain holds, in MiB (default 4096, RK3588's driver): weights beyond it
    /// go to the next domain.
    #[arg(long, value_name = "MIB")]
    pub npu_domain_mib: Option<u64>,
    /// Where a mixture of experts' experts go on the NPU cores: each whole on one core (a third
    /// of the contexts and memory handles on three cores, one run per expert linear), or split
    /// over every core like a dense linear.
    /// (default per-core).
    #[arg(long, value_enum)]
    pub npu_experts: Option<ExpertsArg>,
    /// How the KV cache stores keys and values.
    #[arg(long, value_enum, default_value_t = CacheTypeArg::F32)]
    pub cache_type: CacheTypeArg,
    /// Directory of the converted-weight cache: the first load of a model on the NPU backend
    /// converts its weights and writes them there, later loads read them (default:
    /// $XDG_CACHE_HOME/rknn-llm/weights, else ~/.cache/rknn-llm/weights).
    #[arg(long, value_name = "DIR")]
    pub weight_cache: Option<PathBuf>,
    /// Convert the weights on every load, neither reading nor writing the weight cache.
    #[arg(long)]
    pub no_weight_cache: bool,
    /// The weight cache's size cap in GiB: when a new file takes it past, the least recently
    /// used files go first.
    #[arg(long, value_name = "GIB", default_value_t = (WeightCache::DEFAULT_CAP >> 30) as f64)]
    pub weight_cache_cap: f64,
}

impl LoadArgs {
    /// `builder` with these flags' settings.
    pub fn apply(&self, builder: ModelBuilder) -> Result<ModelBuilder, LoadError> {
        if !(self.weight_cache_cap.is_finite() && self.weight_cache_cap >= 0.0) {
            return Err(LoadError::Setting {
                setting: "--weight-cache-cap",
                value: self.weight_cache_cap.to_string(),
                rule: "must be a size in GiB",
            });
        }
        if self.backend == BackendArg::F32 {
            // The NPU's settings mean nothing on the host's f32 path: refused, not ignored.
            let npu_only = [
                (
                    "--wtype",
                    self.wtype
                        .and_then(|w| Some(w.to_possible_value()?.get_name().to_string())),
                ),
                (
                    "--residual",
                    self.residual
                        .and_then(|r| Some(r.to_possible_value()?.get_name().to_string())),
                ),
                ("--no-rotation", self.no_rotation.then(String::new)),
                ("--int4-group", self.int4_group.map(|g| g.to_string())),
                ("--rotation-seed", self.rotation_seed.map(|n| n.to_string())),
                (
                    "--npu-experts",
                    self.npu_experts
                        .and_then(|e| Some(e.to_possible_value()?.get_name().to_string())),
                ),
                ("--npu-cores", self.npu_cores.map(|n| n.to_string())),
                ("--npu-max-n", self.npu_max_n.map(|n| n.to_string())),
                (
                    "--npu-domain-mib",
                    self.npu_domain_mib.map(|n| n.to_string()),
                ),
                (
                    "--npu-no-shared-io",
                    self.npu_no_shared_io.then(String::new),
                ),
            ];
            if let Some((flag, Some(value))) = npu_only.into_iter().find(|(_, v)| v.is_some()) {
                return Err(LoadError::Setting {
                    setting: flag,
                    value,
                    rule: "sets the NPU engine or its weights, which --backend f32 does not use",
                });
            }
        }
        if let (Some(g), false) = (self.int4_group, self.wtype == Some(WType::W4a16)) {
            return Err(LoadError::Setting {
                setting: "--int4-group",
                value: g.to_string(),
                rule: "needs --wtype w4a16 (per-group scales are applied to the NPU's float C)",
            });
        }
        let mut b = builder
            .int4_group(self.int4_group)
            .backend(match self.backend {
                BackendArg::Auto => Backend::Auto,
                BackendArg::Npu => Backend::Npu,
                BackendArg::Emulator => Backend::Emulator,
                BackendArg::F32 => Backend::F32,
            })
            .weight_format(match self.wtype.unwrap_or(WType::W8a8) {
                WType::W8a8 => WeightFormat::W8A8,
                WType::F16 => WeightFormat::F16,
                WType::W4a16 => WeightFormat::W4A16,
                WType::W4a8 => WeightFormat::W4A8,
            })
            .rotation(!self.no_rotation)
            .rotation_seed(self.rotation_seed.unwrap_or(EngineOptions::default().seed))
            .share_io_memories(!self.npu_no_shared_io)
            .expert_placement(match self.npu_experts {
                Some(ExpertsArg::PerCore) | None => ExpertPlacement::PerCore,
                Some(ExpertsArg::Split) => ExpertPlacement::Split,
            })
            .kv_cache(match self.cache_type {
                CacheTypeArg::F32 => CacheType::F32,
                CacheTypeArg::F16 => CacheType::F16,
            })
            .weight_cache_cap((self.weight_cache_cap * (1u64 << 30) as f64) as u64);
        if let Some(p) = self.platform {
            b = b.platform(p);
        }
        if let Some(r) = self.residual {
            b = b.residual(match r {
                ResidualArg::None => Residual::None,
                ResidualArg::Output => Residual::Output,
                ResidualArg::OutputDown => Residual::OutputAndDown,
                ResidualArg::All => Residual::All,
            });
        }
        if let Some(n) = self.npu_max_n {
            b = b.max_n_per_context(n);
        }
        if let Some(n) = self.npu_cores {
            b = b.npu_cores(n);
        }
        if let Some(mib) = self.npu_domain_mib {
            let bytes = mib.checked_mul(1 << 20).ok_or(LoadError::Setting {
                setting: "--npu-domain-mib",
                value: mib.to_string(),
                rule: "does not fit in bytes",
            })?;
            b = b.iommu_domain_bytes(bytes);
        }
        if let Some(dir) = &self.weight_cache {
            b = b.weight_cache_dir(dir);
        }
        if self.no_weight_cache {
            b = b.no_weight_cache();
        }
        Ok(b)
    }

    /// The weight cache the flags name (`None` with `--no-weight-cache`, or when no directory
    /// is given and there is no home directory).
    pub fn weight_cache(&self) -> Result<Option<WeightCache>, LoadError> {
        Ok(self
            .apply(ModelBuilder::new(PathBuf::new()))?
            .weight_cache())
    }
}

/// llama.cpp spells some flags as two or more letters after one dash (`-np`, `-md`), which
/// clap cannot declare (a short flag is one character: `-md` would parse as `-m d`). Every
/// argument before a `--` that is exactly such a spelling, or the spelling and `=VALUE`,
/// becomes its long flag (with `=VALUE`), before clap parses. `spellings` pairs each dash
/// spelling with its long flag, e.g. `("-md", "--model-draft")`.
pub fn rewrite_spellings(
    args: impl IntoIterator<Item = std::ffi::OsString>,
    spellings: &[(&str, &str)],
) -> Vec<std::ffi::OsString> {
    use std::ffi::OsString;
    let mut out = Vec::new();
    let mut rest = false;
    for a in args {
        if !rest {
            if a == "--" {
                rest = true;
            } else if let Some(long) = spellings.iter().find(|(s, _)| a == *s).map(|p| p.1) {
                out.push(OsString::from(long));
                continue;
            } else if let Some(arg) = a.to_str() {
                let found = spellings.iter().find_map(|(s, long)| {
                    let v = arg.strip_prefix(s)?.strip_prefix('=')?;
                    Some(format!("{long}={v}"))
                });
                if let Some(f) = found {
                    out.push(OsString::from(f));
                    continue;
                }
            }
        }
        out.push(a);
    }
    out
}
