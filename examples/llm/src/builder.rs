//! Loading a model in one place: [`ModelBuilder`] turns settings into a loaded model, its
//! tokenizer and its chat template, on the backend asked for (the NPU, its emulator, or the
//! host f32 path), through the converted-weight cache. `llm-decode` and `llm-server` load
//! through it, and so can any program:
//!
//! ```no_run
//! use rknn_llm::{Backend, Model};
//! use rknn_llm::session::GenerateParams;
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let loaded = Model::builder("models/SmolLM2-135M-Instruct.Q4_1.gguf")
//!     .backend(Backend::Auto) // the NPU if there is one, else the emulator
//!     .context(2048)
//!     .load()?;
//! println!("{} ({})", loaded.backend.name(), loaded.backend_reason);
//! let mut session = loaded.session(Default::default())?;
//! for piece in session.generate("The capital of France is", &GenerateParams::default())? {
//!     print!("{}", piece?.text);
//! }
//! # Ok(()) }
//! ```
//!
//! Why a builder: loading is a dozen decisions (which runtime, the engine's limits, the
//! weights' format and residual policy, where converted weights are kept, the context, the
//! host threads, the chat template) that every program makes the same way; one place makes
//! them, checks them and says which backend it chose and why.

use std::num::NonZeroU16;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rknn_matmul::engine::{Engine, EngineConfig, WeightFormat};
use rknn_matmul::{Platform, Runtime, RuntimeOptions};

use crate::chat::{ChatError, ChatTemplate};
use crate::gguf::{GgufError, GgufFile};
use crate::model::{
    CacheOutcome, CacheType, Config, EngineFactory, EngineOptions, ExpertPlacement, HostF32Factory,
    HostPool, Model, ModelError, Residual, WeightCache, host_pool,
};
use crate::sample::SamplerConfig;
use crate::serve::{Batcher, ServeConfig, ServeError};
use crate::session::{GenerateError, Session};
use crate::spec::{DraftError, DraftModel, check_vocabulary};
use crate::tokenizer::{Tokenizer, TokenizerError};

/// The context size a builder gives a model unless told otherwise, or the trained context if
/// shorter: bounded, so that a model trained for 32k or 128k positions does not take a board's
/// memory by default (llama.cpp's default is 4096 too).
pub const DEFAULT_CONTEXT: usize = 4096;

/// Where a model's weight matmuls run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Backend {
    /// The NPU if one is usable, else the NPU emulator (the same code path either way), as
    /// [`Runtime::auto`] chooses; [`LoadedModel::backend`] says which, and
    /// [`LoadedModel::backend_reason`] why.
    #[default]
    Auto,
    /// The NPU through `librknnrt.so` (`RKNN_RUNTIME_PATH` loads another library, such as the
    /// emulator's drop-in one).
    Npu,
    /// The NPU emulator, in process.
    Emulator,
    /// The host f32 reference path (no NPU): every weight dequantized to f32.
    F32,
}

impl Backend {
    /// `"auto"`, `"npu"`, `"emulator"` or `"f32"` (`llm-decode --backend`'s values).
    pub fn name(self) -> &'static str {
        match self {
            Backend::Auto => "auto",
            Backend::Npu => "npu",
            Backend::Emulator => "emulator",
            Backend::F32 => "f32",
        }
    }
}

impl std::fmt::Display for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// What went wrong loading a model through a [`ModelBuilder`]; each names the setting, file or
/// rule.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LoadError {
    /// The GGUF file could not be opened or parsed.
    #[error(transparent)]
    Gguf(#[from] GgufError),
    /// The model: its architecture, metadata, tensors or context, or a backend that refused
    /// a weight.
    #[error(transparent)]
    Model(#[from] ModelError),
    /// The vocabulary.
    #[error("the vocabulary: {0}")]
    Tokenizer(#[from] TokenizerError),
    /// The chat template given to the builder does not compile.
    #[error(transparent)]
    ChatTemplate(ChatError),
    /// A file named in the settings could not be read.
    #[error("cannot read {what} {}: {source}", path.display())]
    Read {
        /// What the file is.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// The NPU runtime or the engine could not start.
    #[error("the NPU runtime: {0}")]
    Runtime(#[from] rknn_matmul::Error),
    /// The host thread pool could not be built.
    #[error("the host thread pool: {0}")]
    Pool(#[from] rayon::ThreadPoolBuildError),
    /// The batcher of [`ModelBuilder::serve`] could not start.
    #[error(transparent)]
    Serve(#[from] ServeError),
    /// The model cannot draft for the target ([`ModelBuilder::load_draft`]).
    #[error("as a draft: {0}")]
    Draft(#[from] DraftError),
    /// A setting is out of its range.
    #[error("{setting} {value}: {rule}")]
    Setting {
        /// The setting (the builder method).
        setting: &'static str,
        /// Its value.
        value: String,
        /// The rule it breaks.
        rule: &'static str,
    },
}

/// Where converted weights are kept.
#[derive(Clone, Debug)]
enum CacheDir {
    /// [`WeightCache::default_dir`] (none without a home directory).
    Default,
    /// This directory.
    Dir(PathBuf),
    /// Nowhere: convert on every load.
    Off,
}

/// Where the chat template comes from.
#[derive(Clone, Debug)]
enum TemplateSource {
    /// The model's `tokenizer.chat_template`.
    Model,
    /// A Jinja file.
    File(PathBuf),
    /// A Jinja source, named.
    Source { name: String, source: String },
}

/// The progress callback: bytes of weights loaded so far, and in all.
type ProgressFn = Box<dyn FnMut(u64, u64) + Send>;

/// Settings for loading a model ([`Model::builder`]); [`ModelBuilder::load`] loads it.
///
/// Every setting has a default that is right on a board: the NPU if there is one (else the
/// emulator), W8A8 weights with rotated inputs and the model family's residual policy, the
/// engine's defaults (all NPU cores, the widest measured context, A and C shared per core), the
/// converted-weight cache in its default directory, a context of [`DEFAULT_CONTEXT`], one host
/// thread per CPU, f32 KV caches and the model's own chat template.
pub struct ModelBuilder {
    path: PathBuf,
    backend: Backend,
    platform: Option<Platform>,
    runtime: Option<RuntimeOptions>,
    engine: EngineConfig,
    format: WeightFormat,
    rotate: bool,
    seed: u64,
    residual: Option<Residual>,
    experts: ExpertPlacement,
    int4_group: Option<NonZeroU16>,
    cache_dir: CacheDir,
    cache_cap: u64,
    context: Option<usize>,
    threads: Option<usize>,
    pool: Option<HostPool>,
    progress: Option<ProgressFn>,
    template: TemplateSource,
    kv_cache: CacheType,
}

impl std::fmt::Debug for ModelBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModelBuilder")
            .field("path", &self.path)
            .field("backend", &self.backend)
            .field("platform", &self.platform)
            .field("engine", &self.engine)
            .field("format", &self.format)
            .field("rotate", &self.rotate)
            .field("seed", &self.seed)
            .field("residual", &self.residual)
            .field("experts", &self.experts)
            .field("int4_group", &self.int4_group)
            .field("cache_dir", &self.cache_dir)
            .field("cache_cap", &self.cache_cap)
            .field("context", &self.context)
            .field("threads", &self.threads)
            .field("template", &self.template)
            .field("kv_cache", &self.kv_cache)
            .finish_non_exhaustive()
    }
}

impl Model {
    /// Settings for loading the GGUF model at `path`, all at their defaults
    /// ([`ModelBuilder`]).
    pub fn builder(path: impl Into<PathBuf>) -> ModelBuilder {
        ModelBuilder::new(path)
    }
}

impl ModelBuilder {
    /// Settings for loading the GGUF model at `path`, all at their defaults.
    pub fn new(path: impl Into<PathBuf>) -> ModelBuilder {
        let weights = EngineOptions::default();
        ModelBuilder {
            path: path.into(),
            backend: Backend::Auto,
            platform: None,
            runtime: None,
            engine: EngineConfig::default(),
            format: weights.format,
            rotate: weights.rotate,
            seed: weights.seed,
            residual: None,
            experts: weights.experts,
            int4_group: weights.int4_group,
            cache_dir: CacheDir::Default,
            cache_cap: WeightCache::DEFAULT_CAP,
            context: None,
            threads: None,
            pool: None,
            progress: None,
            template: TemplateSource::Model,
            kv_cache: CacheType::F32,
        }
    }

    /// Where the weight matmuls run (default [`Backend::Auto`]).
    pub fn backend(mut self, backend: Backend) -> Self {
        self.backend = backend;
        self
    }

    /// The chip: the one the emulator plays (default RK3588), or the one to assume on the NPU
    /// instead of reading the device tree.
    pub fn platform(mut self, platform: Platform) -> Self {
        self.platform = Some(platform);
        self
    }

    /// The runtime's options (default [`RuntimeOptions::default`], which reads the
    /// `RKNN_EMU_*` variables); [`ModelBuilder::platform`] still applies on top.
    pub fn runtime_options(mut self, options: RuntimeOptions) -> Self {
        self.runtime = Some(options);
        self
    }

    /// The engine's configuration (default [`EngineConfig::default`]); the methods below set
    /// one field of it each.
    pub fn engine_config(mut self, config: EngineConfig) -> Self {
        self.engine = config;
        self
    }

    /// NPU cores to use ([`EngineConfig::cores`]).
    pub fn npu_cores(mut self, cores: usize) -> Self {
        self.engine.cores = Some(cores);
        self
    }

    /// The widest NPU context, in columns ([`EngineConfig::max_n_per_context`]).
    pub fn max_n_per_context(mut self, n: usize) -> Self {
        self.engine.max_n_per_context = Some(n);
        self
    }

    /// Whether the contexts of a core share one A and one C memory
    /// ([`EngineConfig::share_io_memories`], default yes).
    pub fn share_io_memories(mut self, share: bool) -> Self {
        self.engine.share_io_memories = share;
        self
    }

    /// Bytes one IOMMU domain holds ([`EngineConfig::iommu_domain_bytes`]).
    pub fn iommu_domain_bytes(mut self, bytes: u64) -> Self {
        self.engine.iommu_domain_bytes = bytes;
        self
    }

    /// The weights' format on the NPU (default [`WeightFormat::W8A8`]). W4A16 and W4A8 run
    /// only where the chip has int4 weights (RK3576); elsewhere [`ModelBuilder::load`] fails
    /// with the runtime's [`Error::Unsupported`](rknn_matmul::Error::Unsupported), naming the
    /// chip and the format, before reading a weight.
    pub fn weight_format(mut self, format: WeightFormat) -> Self {
        self.format = format;
        self
    }

    /// Per-group int4 weights in groups of `group` input features
    /// ([`EngineOptions::int4_group`], default none): W4A16 only
    /// ([`ModelBuilder::weight_format`]; another format is refused by [`ModelBuilder::load`]
    /// before a weight is read). Those linears run unrotated; the output head, and tensors the
    /// GGUF stores in more than [`INT4_GROUP_MAX_GGUF_BITS`](crate::model::INT4_GROUP_MAX_GGUF_BITS)
    /// bits per weight, stay W8A8.
    pub fn int4_group(mut self, group: Option<NonZeroU16>) -> Self {
        self.int4_group = group;
        self
    }

    /// Whether W8A8 linears rotate their inputs ([`EngineOptions::rotate`], default yes).
    pub fn rotation(mut self, rotate: bool) -> Self {
        self.rotate = rotate;
        self
    }

    /// The seed of the W8A8 input rotations ([`EngineOptions::seed`]).
    pub fn rotation_seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }

    /// Which W8A8 linears quantise each activation row twice (default: the model family's,
    /// [`Family::w8a8_residual`](crate::model::Family::w8a8_residual)).
    pub fn residual(mut self, residual: Residual) -> Self {
        self.residual = Some(residual);
        self
    }

    /// Where a mixture's experts go on the NPU's cores (default
    /// [`ExpertPlacement::PerCore`]: each expert whole on one core).
    pub fn expert_placement(mut self, placement: ExpertPlacement) -> Self {
        self.experts = placement;
        self
    }

    /// Keeps converted weights in `dir` (default: [`WeightCache::default_dir`]).
    pub fn weight_cache_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.cache_dir = CacheDir::Dir(dir.into());
        self
    }

    /// The weight cache's size cap in bytes (default [`WeightCache::DEFAULT_CAP`]).
    pub fn weight_cache_cap(mut self, bytes: u64) -> Self {
        self.cache_cap = bytes;
        self
    }

    /// Converts the weights on every load, neither reading nor writing the weight cache.
    pub fn no_weight_cache(mut self) -> Self {
        self.cache_dir = CacheDir::Off;
        self
    }

    /// The context size: the most positions a session's KV cache holds; 0 is the trained
    /// context, more than it is refused (default: [`DEFAULT_CONTEXT`], or the trained context
    /// if shorter).
    pub fn context(mut self, n_ctx: usize) -> Self {
        self.context = Some(n_ctx);
        self
    }

    /// Host threads (at least 1; default: one per CPU), in a [`host_pool`] whose member 0 is
    /// the thread that calls [`ModelBuilder::load`].
    pub fn threads(mut self, threads: usize) -> Self {
        self.threads = Some(threads);
        self
    }

    /// The host pool the model runs on, instead of one of [`ModelBuilder::threads`].
    pub fn pool(mut self, pool: impl Into<HostPool>) -> Self {
        self.pool = Some(pool.into());
        self
    }

    /// Called as the weights load, with the bytes loaded so far and in all.
    pub fn progress(mut self, progress: impl FnMut(u64, u64) + Send + 'static) -> Self {
        self.progress = Some(Box::new(progress));
        self
    }

    /// The chat template in the Jinja file `path`, instead of the model's.
    pub fn chat_template_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.template = TemplateSource::File(path.into());
        self
    }

    /// The chat template `source`, named `name` in errors, instead of the model's.
    pub fn chat_template(mut self, name: impl Into<String>, source: impl Into<String>) -> Self {
        self.template = TemplateSource::Source {
            name: name.into(),
            source: source.into(),
        };
        self
    }

    /// How the KV caches of [`LoadedModel::session`]'s sessions store keys and values
    /// (default f32).
    pub fn kv_cache(mut self, ty: CacheType) -> Self {
        self.kv_cache = ty;
        self
    }

    /// The GGUF file to load.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The weight cache these settings name: `None` when turned off, or when no directory is
    /// given and there is no home directory. The f32 backend converts nothing and uses none.
    pub fn weight_cache(&self) -> Option<WeightCache> {
        let dir = match &self.cache_dir {
            CacheDir::Off => return None,
            CacheDir::Default => WeightCache::default_dir()?,
            CacheDir::Dir(d) => d.clone(),
        };
        Some(WeightCache::new(dir, self.cache_cap))
    }

    /// Loads the model as a draft for `target` (speculative decoding, [`DraftModel`]):
    /// checks the vocabularies first (before any weight loads), gives it the target's context
    /// (or its own trained context if shorter: past it the draft proposes nothing) and, unless
    /// [`ModelBuilder::pool`] gave one, the target's host pool (one thread drives both, one
    /// pass at a time); then [`LoadedModel::draft_for`].
    pub fn load_draft(
        mut self,
        target: &LoadedModel,
        max: usize,
        p_min: f32,
    ) -> Result<(LoadedModel, DraftModel), LoadError> {
        let file = GgufFile::open(&self.path)?;
        check_vocabulary(&Tokenizer::from_gguf(&file)?, &target.tokenizer)?;
        let trained = Config::from_gguf(&file)?.n_ctx;
        drop(file);
        self.context = Some(target.model.n_ctx().min(trained));
        if self.pool.is_none() {
            self.pool = Some(target.model.pool().clone());
        }
        let loaded = self.load()?;
        let draft = loaded.draft_for(target, max, p_min)?;
        Ok((loaded, draft))
    }

    /// Loads the model, its tokenizer and its chat template.
    pub fn load(self) -> Result<LoadedModel, LoadError> {
        let t0 = Instant::now();
        let mut b = self;
        let mut file = GgufFile::open(&b.path)?;
        // The architecture first: an unsupported one is the first thing to report.
        let config = Config::from_gguf(&file)?;
        let tokenizer = Tokenizer::from_gguf(&file)?;
        let chat_template = b.chat_template_of(&file, &tokenizer)?;
        // The tokenizer holds its own copy of the vocabulary's lists: the parsed ones are not
        // held through the weights' conversion, when the load peaks.
        file.drop_metadata_arrays("tokenizer.");
        file.release_header();
        let n_ctx = b.context_of(&config)?;
        let pool = match b.pool.take() {
            Some(p) => p,
            None => host_pool(b.host_threads()?)?,
        };
        let engine = b.open_engine()?;
        let mut progress = b.progress.take();
        let mut report = |done: u64, total: u64| {
            if let Some(p) = &mut progress {
                p(done, total);
            }
        };
        let (mut model, weight_cache, backend, backend_reason) = match engine {
            None => {
                let mut factory = HostF32Factory::new(pool.clone());
                let model = Model::load_config(&file, config, &mut factory, pool, &mut report)?;
                let why = "asked for: the host f32 reference path".to_string();
                (model, None, Backend::F32, why)
            }
            Some(engine) => {
                let (backend, why) = match engine.runtime().is_emulator() {
                    true => (Backend::Emulator, engine.runtime().selection_reason()),
                    false => (Backend::Npu, engine.runtime().selection_reason()),
                };
                let why = why.to_string();
                let opts = EngineOptions {
                    format: b.format,
                    rotate: b.rotate,
                    residual: b.residual.unwrap_or(config.family.w8a8_residual),
                    seed: b.seed,
                    experts: b.experts,
                    int4_group: b.int4_group,
                };
                let (model, outcome) = match b.weight_cache() {
                    Some(cache) => {
                        let (m, o) = Model::load_cached_config(
                            &b.path,
                            &file,
                            config,
                            engine,
                            opts,
                            &cache,
                            pool,
                            &mut report,
                        )?;
                        (m, Some(o))
                    }
                    None => {
                        let mut factory = EngineFactory::new(engine, opts);
                        let m = Model::load_config(&file, config, &mut factory, pool, &mut report)?;
                        (m, None)
                    }
                };
                (model, outcome, backend, why)
            }
        };
        model.set_context(n_ctx)?;
        Ok(LoadedModel {
            model: Arc::new(model),
            tokenizer: Arc::new(tokenizer),
            chat_template,
            weight_cache,
            backend,
            backend_reason,
            kv_cache: b.kv_cache,
            path: b.path,
            load_time: t0.elapsed(),
        })
    }

    /// Loads the model on a new thread which then serves it: a [`Batcher`] whose thread
    /// drives the model's host pool (its member 0, as [`ModelBuilder::load`]'s caller is), so
    /// that each pass runs on it directly. `config` sees the loaded model (its context, say)
    /// and gives the batcher's settings. Returns once the batcher serves, with what was loaded.
    ///
    /// ```no_run
    /// use rknn_llm::Model;
    /// use rknn_llm::serve::ServeConfig;
    ///
    /// # fn main() -> Result<(), rknn_llm::LoadError> {
    /// let (loaded, batcher) = Model::builder("model.gguf").context(8192).serve(|loaded| {
    ///     // Four slots sharing the context, as llama-server's `-c 8192 -np 4`.
    ///     let slot_ctx = loaded.model.n_ctx() / 4;
    ///     Ok(ServeConfig { slots: 4, slot_ctx, ..ServeConfig::default() })
    /// })?;
    /// # Ok(()) }
    /// ```
    pub fn serve<F>(self, config: F) -> Result<(LoadedModel, Batcher), LoadError>
    where
        F: FnOnce(&LoadedModel) -> Result<ServeConfig, ServeError> + Send + 'static,
    {
        let (batcher, loaded) = Batcher::start_with(move || {
            let loaded = self.load()?;
            let config = config(&loaded)?;
            Ok::<_, LoadError>((
                loaded.model.clone(),
                loaded.tokenizer.clone(),
                config,
                loaded,
            ))
        })?;
        Ok((loaded, batcher))
    }

    /// Host threads: the setting, else one per CPU.
    fn host_threads(&self) -> Result<usize, LoadError> {
        match self.threads {
            Some(0) => Err(LoadError::Setting {
                setting: "threads",
                value: "0".into(),
                rule: "must be at least 1",
            }),
            Some(t) => Ok(t),
            None => Ok(std::thread::available_parallelism().map_or(1, |n| n.get())),
        }
    }

    /// The context size for `config`'s model.
    fn context_of(&self, config: &Config) -> Result<usize, LoadError> {
        let trained = config.n_ctx;
        match self.context {
            None => Ok(DEFAULT_CONTEXT.min(trained)),
            Some(0) => Ok(trained),
            Some(n) if n > trained => Err(ModelError::ContextTooLarge { asked: n, trained }.into()),
            Some(n) => Ok(n),
        }
    }

    /// The chat template: the builder's (which must compile), else the model's (kept as the
    /// error when it does not compile: a program that never chats does not need it).
    fn chat_template_of(
        &self,
        file: &GgufFile,
        tokenizer: &Tokenizer,
    ) -> Result<Result<Option<ChatTemplate>, ChatError>, LoadError> {
        let (name, source) = match &self.template {
            TemplateSource::Model => return Ok(ChatTemplate::from_gguf(file, tokenizer)),
            TemplateSource::File(path) => {
                let source = std::fs::read_to_string(path).map_err(|source| LoadError::Read {
                    what: "chat template",
                    path: path.clone(),
                    source,
                })?;
                (path.display().to_string(), source)
            }
            TemplateSource::Source { name, source } => (name.clone(), source.clone()),
        };
        let t = ChatTemplate::new(name, source).map_err(LoadError::ChatTemplate)?;
        Ok(Ok(Some(t.with_tokens_of(tokenizer))))
    }

    /// Opens the runtime and the engine the backend names (none for f32).
    fn open_engine(&self) -> Result<Option<Engine>, LoadError> {
        let mut opts = match &self.runtime {
            Some(o) => o.clone(),
            None => RuntimeOptions::default(),
        };
        if let (Some(g), false) = (self.int4_group, self.format == WeightFormat::W4A16) {
            return Err(LoadError::Setting {
                setting: "int4_group",
                value: g.to_string(),
                rule: "is for the w4a16 weight format only (per-group scales need the NPU's float C)",
            });
        }
        let backend = match self.backend {
            Backend::F32 => return Ok(None),
            Backend::Auto => {
                if let Some(p) = self.platform {
                    opts.emulator.platform = p;
                }
                rknn_matmul::Backend::Auto
            }
            Backend::Npu => {
                opts.npu_platform = self.platform;
                rknn_matmul::Backend::Npu
            }
            Backend::Emulator => {
                rknn_matmul::Backend::Emulator(self.platform.unwrap_or(Platform::Rk3588))
            }
        };
        let rt = Runtime::open(backend, opts)?;
        let engine = Engine::new(&rt, self.engine.clone())?;
        // A format the chip lacks (W4A16 on RK3588) is refused here, naming both, before a
        // weight is read.
        engine.check_format(self.format)?;
        Ok(Some(engine))
    }
}

/// A loaded model and what a program needs to use it ([`ModelBuilder::load`]).
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct LoadedModel {
    /// The model, shared by every session.
    pub model: Arc<Model>,
    /// Its vocabulary.
    pub tokenizer: Arc<Tokenizer>,
    /// The chat template: the builder's, else the model's `tokenizer.chat_template`; `None`
    /// when the model has none, the error when it does not compile.
    pub chat_template: Result<Option<ChatTemplate>, ChatError>,
    /// How the converted-weight cache was used (`None` without a cache or on the f32 path).
    pub weight_cache: Option<CacheOutcome>,
    /// Where the weight matmuls run: [`Backend::Npu`], [`Backend::Emulator`] or
    /// [`Backend::F32`].
    pub backend: Backend,
    /// Why that backend ([`Runtime::selection_reason`], or that f32 was asked for).
    pub backend_reason: String,
    /// How the sessions' KV caches store keys and values ([`ModelBuilder::kv_cache`]).
    pub kv_cache: CacheType,
    /// The GGUF file.
    pub path: PathBuf,
    /// How long loading took.
    pub load_time: Duration,
}

impl LoadedModel {
    /// A new session (one conversation, its own KV cache) over the model, sampling as
    /// `sampling` says.
    pub fn session(&self, sampling: SamplerConfig) -> Result<Session, GenerateError> {
        let mut s = Session::new(self.model.clone(), self.tokenizer.clone(), sampling)?;
        s.set_cache_type(self.kv_cache);
        Ok(s)
    }

    /// This model as a draft for `target` ([`DraftModel::new`]: the same vocabulary, token
    /// for token), proposing at most `max` tokens a pass and stopping where its probability
    /// falls below `p_min`; give it to a session with [`Session::set_draft`].
    pub fn draft_for(
        &self,
        target: &LoadedModel,
        max: usize,
        p_min: f32,
    ) -> Result<DraftModel, DraftError> {
        DraftModel::new(
            self.model.clone(),
            &self.tokenizer,
            &target.tokenizer,
            max,
            p_min,
        )
    }
}
