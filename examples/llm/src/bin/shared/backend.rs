//! The backend flags `llm-decode` and `llm-server` share (where the weight matmuls run and how
//! the weights and the KV cache are stored), and loading a model with them.
//!
//! Included by both binaries with `#[path]`, so it is compiled into each of them.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use clap::ValueEnum;

use rknn_llm::gguf::GgufFile;
use rknn_llm::model::{
    CacheOutcome, CacheType, Config, EngineFactory, EngineOptions, HostF32Factory, Model, Residual,
    WeightCache,
};
use rknn_matmul::engine::{Engine, EngineConfig, WeightFormat};
use rknn_matmul::{Platform, Runtime, RuntimeOptions};

/// An error of opening the backend or loading the model (`Send`, so that a server can load on
/// a thread of its own).
pub type Error = Box<dyn std::error::Error + Send + Sync>;

/// `--backend`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Backend {
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

/// `--cache-type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum CacheTypeArg {
    /// f32 keys and values (exact; the default).
    F32,
    /// f16 keys and values, as llama.cpp's default cache: half the memory and half the bytes
    /// attention reads per position.
    F16,
}

/// `--wtype`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum WType {
    /// int8 weights and activations (per-channel and per-row scales).
    W8a8,
    /// f16 weights and activations.
    F16,
}

/// Where the weight matmuls run and how weights and the KV cache are stored.
#[derive(Debug, Clone, clap::Args)]
pub struct BackendArgs {
    /// Where the weight matmuls run.
    #[arg(long, value_enum, default_value_t = Backend::Auto)]
    pub backend: Backend,
    /// Weight type on the NPU.
    #[arg(long, value_enum, default_value_t = WType::W8a8)]
    pub wtype: WType,
    /// W8A8 without rotating the linears' inputs (a random orthogonal transform that keeps
    /// W8A8 close to f32; on by default).
    #[arg(long)]
    pub no_rotation: bool,
    /// Which W8A8 linears quantise each activation row twice (the row, then its residual: about
    /// 15 bits of precision from int8 arithmetic, for a second row through the NPU). Default:
    /// the model family's (output-down; all for gemma3).
    #[arg(long, value_enum)]
    pub residual: Option<ResidualArg>,
    /// Seed of the W8A8 input rotations.
    #[arg(long, default_value_t = EngineOptions::default().seed)]
    pub rotation_seed: u64,
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

impl BackendArgs {
    /// The weight cache the flags name (`None` with `--no-weight-cache`, or when no directory
    /// is given and there is no home directory).
    pub fn weight_cache(&self) -> Result<Option<WeightCache>, Error> {
        if !(self.weight_cache_cap.is_finite() && self.weight_cache_cap >= 0.0) {
            return Err(format!(
                "--weight-cache-cap must be a size in GiB, not {}",
                self.weight_cache_cap
            )
            .into());
        }
        if self.no_weight_cache {
            return Ok(None);
        }
        let dir = self.weight_cache.clone().or_else(WeightCache::default_dir);
        let cap = (self.weight_cache_cap * (1u64 << 30) as f64) as u64;
        Ok(dir.map(|d| WeightCache::new(d, cap)))
    }

    /// The KV cache type `--cache-type` names.
    pub fn cache_type(&self) -> CacheType {
        match self.cache_type {
            CacheTypeArg::F32 => CacheType::F32,
            CacheTypeArg::F16 => CacheType::F16,
        }
    }
}

/// "npu", "emulator" or "f32": what runs the weight matmuls.
pub fn backend_name(engine: Option<&Engine>) -> &'static str {
    match engine {
        None => "f32",
        Some(e) if e.runtime().is_emulator() => "emulator",
        Some(_) => "npu",
    }
}

/// Opens the runtime and engine `--backend` names (none for f32).
pub fn open_engine(args: &BackendArgs) -> Result<Option<Engine>, Error> {
    let mut opts = RuntimeOptions::default();
    let backend = match args.backend {
        Backend::F32 => return Ok(None),
        Backend::Auto => {
            if let Some(p) = args.platform {
                opts.emulator.platform = p;
            }
            rknn_matmul::Backend::Auto
        }
        Backend::Npu => {
            opts.npu_platform = args.platform;
            rknn_matmul::Backend::Npu
        }
        Backend::Emulator => {
            rknn_matmul::Backend::Emulator(args.platform.unwrap_or(Platform::Rk3588))
        }
    };
    let rt = Runtime::open(backend, opts)?;
    let defaults = EngineConfig::default();
    let domain = match args.npu_domain_mib {
        Some(mib) => mib
            .checked_mul(1 << 20)
            .ok_or_else(|| format!("--npu-domain-mib {mib} does not fit in bytes"))?,
        None => defaults.iommu_domain_bytes,
    };
    let cfg = EngineConfig {
        cores: args.npu_cores,
        max_n_per_context: args.npu_max_n,
        share_io_memories: !args.npu_no_shared_io,
        iommu_domain_bytes: domain,
        ..defaults
    };
    Ok(Some(Engine::new(&rt, cfg)?))
}

/// Loads `file`'s model (opened from `path`) on the backend `args` name, its host work on
/// `pool`, through the weight cache unless `--no-weight-cache`; `progress` hears the bytes
/// loaded so far and the total. Returns how the weight cache was used (none on the f32 path).
pub fn load_model(
    path: &Path,
    file: &GgufFile,
    pool: Arc<rayon::ThreadPool>,
    args: &BackendArgs,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<(Model, Option<CacheOutcome>), Error> {
    let cache = args.weight_cache()?;
    let model = match open_engine(args)? {
        None => (
            Model::load(file, &mut HostF32Factory::new(pool.clone()), pool, progress)?,
            None,
        ),
        Some(e) => {
            let opts = EngineOptions {
                format: match args.wtype {
                    WType::W8a8 => WeightFormat::W8A8,
                    WType::F16 => WeightFormat::F16,
                },
                rotate: !args.no_rotation,
                residual: match args.residual {
                    None => Config::from_gguf(file)?.family.w8a8_residual,
                    Some(ResidualArg::None) => Residual::None,
                    Some(ResidualArg::Output) => Residual::Output,
                    Some(ResidualArg::OutputDown) => Residual::OutputAndDown,
                    Some(ResidualArg::All) => Residual::All,
                },
                seed: args.rotation_seed,
            };
            match &cache {
                Some(c) => {
                    let (m, outcome) = Model::load_cached(path, file, e, opts, c, pool, progress)?;
                    (m, Some(outcome))
                }
                None => (
                    Model::load(file, &mut EngineFactory::new(e, opts), pool, progress)?,
                    None,
                ),
            }
        }
    };
    Ok(model)
}
