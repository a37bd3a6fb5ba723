//! The converted-weight cache: the first load of a GGUF on the NPU backend converts its
//! weights (dequantise, rotate, quantise to W8A8 or convert to F16, pad to the chip) and writes
//! them, engine-ready, to a cache file; later loads read them from it straight into the NPU's
//! memories, with no conversion.
//!
//! A cache file is bound to what made it by its key ([`CONVERTER`], the layout version, the
//! GGUF's path, size, modification time and a hash of its header and tensor directory, the
//! chip, the weight format, the rotation and its seed, the residual policy, the per-group
//! int4 size), and carries a
//! checksum of its directory and of every linear's weights. A file that does not match
//! (stale, truncated, corrupt, another chip or version) is reported in one line
//! ([`CacheOutcome::Rebuilt`]) and rebuilt, never used: a linear's weights are checked before
//! they are placed, and a load that meets a bad one drops what it built and converts. Writing
//! goes to a temporary file renamed into place once complete and synced. A directory that
//! cannot be written degrades to converting ([`CacheOutcome::NotWritten`]).
//!
//! What is stored is the converted rows in the order the NPU sums them, before each context's
//! native packing: the packing is a permutation the lanes do as they place a linear, and
//! keeping it out of the file lets one file serve any core count and context width.

mod file;
mod key;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

use rknn_matmul::engine::{Engine, Linear, LinearOptions, WeightFormat};

use super::backend::BackendError;
use super::config::Config;
use super::error::ModelError;
use super::host_pool::HostPool;
use super::load::{Model, Progress};
use super::npu::{EngineFactory, EngineOptions, Rows, WeightStore};
use crate::gguf::GgufFile;
pub use file::Invalid;
use file::{Reader, Section, Writer};
pub use key::{CONVERTER, LAYOUT_VERSION};

/// The suffix of cache files.
const SUFFIX: &str = "rkwc";

/// A directory of converted-weight files with a size cap: when a new file takes the total
/// past it, the least recently used files go first (a load that reads a file marks it used).
#[derive(Debug, Clone)]
pub struct WeightCache {
    dir: PathBuf,
    cap: u64,
}

/// One file of a [`WeightCache`].
#[derive(Debug, Clone)]
pub struct CacheEntry {
    /// Its path.
    pub path: PathBuf,
    /// Its size.
    pub bytes: u64,
    /// When it was last used (written or read).
    pub used: SystemTime,
    /// The GGUF it was made from and its settings (its key), or why its header is unusable.
    pub key: Result<String, Invalid>,
}

/// How a load used the cache: one line for the user ([`std::fmt::Display`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum CacheOutcome {
    /// The weights were read from this file.
    Hit(PathBuf),
    /// The weights were converted and written to this file (the first load).
    Written(PathBuf),
    /// The file could not be used (why) and was rebuilt.
    Rebuilt {
        /// The file.
        path: PathBuf,
        /// Why the old one was not used.
        reason: Invalid,
    },
    /// The weights were converted but could not be written (why): the next load converts
    /// again.
    NotWritten {
        /// The file it would have been.
        path: PathBuf,
        /// Why.
        reason: String,
    },
}

impl CacheOutcome {
    /// `"hit"`, `"written"`, `"rebuilt"` or `"not written"`.
    pub fn name(&self) -> &'static str {
        match self {
            CacheOutcome::Hit(_) => "hit",
            CacheOutcome::Written(_) => "written",
            CacheOutcome::Rebuilt { .. } => "rebuilt",
            CacheOutcome::NotWritten { .. } => "not written",
        }
    }

    /// The cache file (read, written, or that would have been written).
    pub fn path(&self) -> &Path {
        match self {
            CacheOutcome::Hit(p) | CacheOutcome::Written(p) => p,
            CacheOutcome::Rebuilt { path, .. } | CacheOutcome::NotWritten { path, .. } => path,
        }
    }

    /// Whether the user should hear of it even when not watching a terminal: the file was
    /// not usable, or could not be written.
    pub fn is_warning(&self) -> bool {
        matches!(
            self,
            CacheOutcome::Rebuilt { .. } | CacheOutcome::NotWritten { .. }
        )
    }
}

impl std::fmt::Display for CacheOutcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CacheOutcome::Hit(p) => write!(f, "weights read from the cache {}", p.display()),
            CacheOutcome::Written(p) => write!(f, "weights converted, cached in {}", p.display()),
            CacheOutcome::Rebuilt { path, reason } => write!(
                f,
                "weight cache {} not used: {reason}; converted and rebuilt",
                path.display()
            ),
            CacheOutcome::NotWritten { path, reason } => write!(
                f,
                "warning: weights converted but not cached ({} : {reason}); the next load converts again",
                path.display()
            ),
        }
    }
}

impl WeightCache {
    /// The default cap: 16 GiB, two 8B models' W8A8 weights.
    pub const DEFAULT_CAP: u64 = 16 << 30;

    /// A cache in `dir` (created when first written) holding at most `cap` bytes.
    pub fn new(dir: impl Into<PathBuf>, cap: u64) -> WeightCache {
        WeightCache {
            dir: dir.into(),
            cap,
        }
    }

    /// The default directory: `$XDG_CACHE_HOME/rknn-llm/weights`, else
    /// `$HOME/.cache/rknn-llm/weights`.
    pub fn default_dir() -> Option<PathBuf> {
        let base = std::env::var_os("XDG_CACHE_HOME")
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
        Some(base.join("rknn-llm").join("weights"))
    }

    /// Its directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Its cap in bytes.
    pub fn cap(&self) -> u64 {
        self.cap
    }

    /// Its files, least recently used first (none if the directory does not exist).
    pub fn entries(&self) -> std::io::Result<Vec<CacheEntry>> {
        let read = match std::fs::read_dir(&self.dir) {
            Ok(r) => r,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(e),
        };
        let mut out = Vec::new();
        for d in read {
            let path = d?.path();
            if path.extension().is_none_or(|e| e != SUFFIX) {
                continue;
            }
            let Ok(f) = std::fs::File::open(&path) else {
                continue;
            };
            let meta = f.metadata()?;
            out.push(CacheEntry {
                key: file::read_key(&f),
                bytes: meta.len(),
                used: meta.modified()?,
                path,
            });
        }
        out.sort_by_key(|e| e.used);
        Ok(out)
    }

    /// Removes every file (and any temporary file a crashed writer left); returns how many
    /// files and bytes went.
    pub fn clear(&self) -> std::io::Result<(usize, u64)> {
        let (mut files, mut bytes) = (0, 0);
        let read = match std::fs::read_dir(&self.dir) {
            Ok(r) => r,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok((0, 0)),
            Err(e) => return Err(e),
        };
        for d in read {
            let d = d?;
            let name = d.file_name().to_string_lossy().into_owned();
            let ours = name.ends_with(&format!(".{SUFFIX}"))
                || (name.starts_with('.') && name.contains(&format!(".{SUFFIX}.tmp-")));
            if ours {
                let len = d.metadata().map_or(0, |m| m.len());
                std::fs::remove_file(d.path())?;
                files += 1;
                bytes += len;
            }
        }
        Ok((files, bytes))
    }

    /// Removes the least recently used files until the total is within the cap, never
    /// `keep`; returns the removed files.
    fn trim(&self, keep: &Path) -> Vec<PathBuf> {
        let Ok(entries) = self.entries() else {
            return Vec::new();
        };
        let mut total: u64 = entries.iter().map(|e| e.bytes).sum();
        let mut removed = Vec::new();
        for e in entries {
            if total <= self.cap {
                break;
            }
            if e.path != keep && std::fs::remove_file(&e.path).is_ok() {
                total -= e.bytes;
                removed.push(e.path);
            }
        }
        removed
    }

    /// The file of `key`.
    fn path_of(&self, gguf: &Path, key: &key::Key) -> PathBuf {
        let stem = gguf
            .file_stem()
            .map_or_else(|| "model".into(), |s| s.to_string_lossy());
        self.dir
            .join(format!("{stem}-{:016x}.{SUFFIX}", key.name_hash()))
    }
}

/// How a load with a cache went, kept by the caller while the factory owns the store.
#[derive(Default)]
struct Report {
    /// Reading: the first reason the file could not be used.
    invalid: Option<Invalid>,
    /// Writing: why it stopped, and the file once committed.
    write_failed: Option<String>,
    written: Option<PathBuf>,
}

type Shared = Arc<std::sync::Mutex<Report>>;

fn lock(r: &Shared) -> std::sync::MutexGuard<'_, Report> {
    r.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Reads every linear from a checked cache file.
struct ReadStore {
    reader: Reader,
    report: Shared,
}

impl ReadStore {
    fn fail(&self, why: Invalid) -> BackendError {
        lock(&self.report).invalid.get_or_insert(why.clone());
        Box::new(why)
    }
}

impl WeightStore for ReadStore {
    fn linear(
        &mut self,
        engine: &Engine,
        name: &str,
        n: usize,
        k: usize,
        format: WeightFormat,
        opts: LinearOptions,
        _rows: &mut Rows<'_>,
    ) -> Result<Linear, BackendError> {
        let Some(e) = self.reader.entry(name) else {
            return Err(self.fail(Invalid::Stale(format!("it has no {name}"))));
        };
        if (e.format, e.n, e.k) != (format, n as u64, k as u64) {
            let why = format!(
                "{name} is {} {}×{}, the model needs {format} {n}×{k}",
                e.format, e.n, e.k
            );
            return Err(self.fail(Invalid::Stale(why)));
        }
        let section = match self.reader.section(e) {
            Ok(s) => s,
            Err(why) => return Err(self.fail(why)),
        };
        // Lengths and padding are the engine's to check: a file padded for another chip is
        // refused there, as stale.
        engine
            .linear_from_bytes(n, k, format, opts, Arc::new(section))
            .map_err(|err| match err {
                rknn_matmul::Error::Length { .. } => {
                    self.fail(Invalid::Stale(format!("{name}: {err}")))
                }
                other => Box::new(other) as BackendError,
            })
    }

    fn finish(&mut self) {}
}

/// Converts every linear into a new cache file as it goes, and places it from there.
struct WriteStore {
    writer: Option<Writer>,
    report: Shared,
}

impl WeightStore for WriteStore {
    fn linear(
        &mut self,
        engine: &Engine,
        name: &str,
        n: usize,
        k: usize,
        format: WeightFormat,
        opts: LinearOptions,
        rows: &mut Rows<'_>,
    ) -> Result<Linear, BackendError> {
        if let Some(w) = &mut self.writer {
            let mut io: Option<std::io::Error> = None;
            let mut written = || -> Result<Section, BackendError> {
                let mut p = w.begin(name, format, n, k).map_err(|e| {
                    io = Some(std::io::Error::new(e.kind(), e.to_string()));
                    Box::new(e) as BackendError
                })?;
                let padded = engine.convert_to_with(
                    n,
                    k,
                    format,
                    &opts,
                    &mut *rows,
                    |_, values, scales| {
                        p.rows(w, values, scales).map_err(|e| {
                            io = Some(std::io::Error::new(e.kind(), e.to_string()));
                            Box::new(e) as BackendError
                        })
                    },
                )?;
                w.end(p, padded).map_err(|e| {
                    io = Some(std::io::Error::new(e.kind(), e.to_string()));
                    Box::new(e) as BackendError
                })
            };
            match written() {
                Ok(section) => {
                    return Ok(engine.linear_from_bytes(n, k, format, opts, Arc::new(section))?);
                }
                Err(e) if io.is_none() => return Err(e),
                Err(_) => {
                    let why = io.map_or_else(String::new, |e| e.to_string());
                    lock(&self.report).write_failed.get_or_insert(why);
                    self.writer = None;
                }
            }
        }
        engine.linear_from_rows(n, k, format, opts, rows)
    }

    fn finish(&mut self) {
        if let Some(w) = self.writer.take() {
            let done = w.commit();
            let mut r = lock(&self.report);
            match done {
                Ok(p) => r.written = Some(p),
                Err(e) => {
                    r.write_failed.get_or_insert(e.to_string());
                }
            }
        }
    }
}

impl Model {
    /// As [`Model::load`] on `engine` with `opts`, through the converted-weight `cache`: reads
    /// the weights from `cache`'s file for `file` (opened from `path`) when it is valid, else
    /// converts them and writes the file. Returns how the cache was used, one line for the
    /// user. Logits are bit-identical either way.
    pub fn load_cached(
        path: &Path,
        file: &GgufFile,
        engine: Engine,
        opts: EngineOptions,
        cache: &WeightCache,
        pool: impl Into<HostPool>,
        progress: Progress<'_>,
    ) -> Result<(Model, CacheOutcome), ModelError> {
        let config = Config::from_gguf(file)?;
        Model::load_cached_config(
            path,
            file,
            config,
            engine,
            opts,
            cache,
            pool.into(),
            progress,
        )
    }

    /// [`Model::load_cached`] with `file`'s configuration already read.
    #[allow(clippy::too_many_arguments)] // Model::load_cached's, and the configuration.
    pub(crate) fn load_cached_config(
        path: &Path,
        file: &GgufFile,
        config: Config,
        engine: Engine,
        opts: EngineOptions,
        cache: &WeightCache,
        pool: HostPool,
        progress: Progress<'_>,
    ) -> Result<(Model, CacheOutcome), ModelError> {
        let chip = engine.runtime().platform().to_string();
        let key = key::Key::new(path, file, &chip, &opts).map_err(|e| ModelError::Unsupported {
            what: format!("reading {} for the weight cache: {e}", path.display()),
        })?;
        let text = key.text();
        let at = cache.path_of(path, &key);
        let mut stale = None;
        if at.exists() {
            match Reader::open(&at, &text) {
                Ok(reader) => {
                    let report = Shared::default();
                    let store = ReadStore {
                        reader,
                        report: report.clone(),
                    };
                    let mut factory =
                        EngineFactory::with_store(engine.clone(), opts, Box::new(store));
                    let loaded = Model::load_config(
                        file,
                        config.clone(),
                        &mut factory,
                        pool.clone(),
                        progress,
                    );
                    drop(factory);
                    let invalid = lock(&report).invalid.take();
                    match (loaded, invalid) {
                        (Ok(model), _) => {
                            mark_used(&at);
                            return Ok((model, CacheOutcome::Hit(at)));
                        }
                        (Err(_), Some(why)) => stale = Some(why),
                        (Err(e), None) => return Err(e),
                    }
                }
                Err(why) => stale = Some(why),
            }
        }
        let report = Shared::default();
        let writer = match Writer::create(&at, &text) {
            Ok(w) => Some(w),
            Err(e) => {
                lock(&report).write_failed = Some(e.to_string());
                None
            }
        };
        let store = WriteStore {
            writer,
            report: report.clone(),
        };
        let mut factory = EngineFactory::with_store(engine, opts, Box::new(store));
        let model = Model::load_config(file, config, &mut factory, pool, progress)?;
        drop(factory);
        let r = std::mem::take(&mut *lock(&report));
        let outcome = match (r.written, r.write_failed, stale) {
            (Some(p), _, None) => CacheOutcome::Written(p),
            (Some(p), _, Some(reason)) => CacheOutcome::Rebuilt { path: p, reason },
            (None, reason, _) => CacheOutcome::NotWritten {
                path: at.clone(),
                reason: reason.unwrap_or_else(|| "not written".into()),
            },
        };
        cache.trim(&at);
        Ok((model, outcome))
    }
}

/// Marks a file used now (its modification time: the order the cap removes files in).
fn mark_used(path: &Path) {
    if let Ok(f) = std::fs::File::options().append(true).open(path) {
        let _ = f.set_modified(SystemTime::now());
    }
}
