//! The cache file: a header binding it to what made it, the converted linears one after the
//! other, a directory of them and a trailer.
//!
//! ```text
//! magic "RKLLMWC\n" | version u32 | key length u32 | key (UTF-8 lines "field=value") | key XXH3 u64
//! section*          (each linear: its values, then its scales)
//! directory         count u32, then per linear: name length u32, name, format u8,
//!                   n, k, n_pad, k_pad, offset, values bytes, scales bytes, XXH3 (u64 each)
//! trailer           directory offset u64 | directory length u64 | directory XXH3 u64 | "RKWCEND\n"
//! ```
//!
//! Integers are little-endian. The writer streams sections to a temporary file and renames it
//! into place only once the trailer is written and synced, so a crash leaves no half file under
//! the cache's name; the reader checks every length against the file's before it allocates,
//! and each section's checksum before its weights are used.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use rknn_matmul::engine::{ConvertedWeights, WeightFormat};
use xxhash_rust::xxh3::{Xxh3, xxh3_64};

/// The file's first bytes.
pub(super) const MAGIC: &[u8; 8] = b"RKLLMWC\n";
/// The trailer's last bytes.
const END: &[u8; 8] = b"RKWCEND\n";
/// The layout of the file and of the converted weights in it. Changing either changes this.
pub const LAYOUT_VERSION: u32 = 1;
/// The largest key this reader accepts (a key is a few hundred bytes).
const MAX_KEY: u64 = 1 << 20;
/// The trailer's length.
const TRAILER: u64 = 32;
/// Bytes of the fixed head before the key.
const HEAD: u64 = 16;

/// Why a cache file cannot be used: one line for the user, then it is rebuilt.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Invalid {
    /// Not a cache file, or written by another layout version.
    #[error("{0}")]
    Format(String),
    /// Shorter than its own lengths say.
    #[error("truncated ({0})")]
    Truncated(String),
    /// A checksum does not match.
    #[error("corrupt ({0})")]
    Corrupt(String),
    /// Made from another file or with other settings.
    #[error("stale ({0})")]
    Stale(String),
    /// Reading failed.
    #[error("unreadable ({0})")]
    Io(String),
}

/// One linear's entry in the directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Entry {
    pub(super) name: String,
    pub(super) format: WeightFormat,
    pub(super) n: u64,
    pub(super) k: u64,
    pub(super) n_pad: u64,
    pub(super) k_pad: u64,
    offset: u64,
    values: u64,
    scales: u64,
    hash: u64,
}

fn format_code(f: WeightFormat) -> u8 {
    match f {
        WeightFormat::W8A8 => 1,
        WeightFormat::F16 => 2,
    }
}

fn format_of(code: u8) -> Option<WeightFormat> {
    WeightFormat::ALL
        .into_iter()
        .find(|&f| format_code(f) == code)
}

/// Bytes per value of `format`.
fn value_bytes(format: WeightFormat) -> u64 {
    match format {
        WeightFormat::W8A8 => 1,
        WeightFormat::F16 => 2,
    }
}

/// The head: magic, version, key and its checksum.
fn head(key: &str) -> Vec<u8> {
    let mut h = Vec::with_capacity(key.len() + 24);
    h.extend_from_slice(MAGIC);
    h.extend_from_slice(&LAYOUT_VERSION.to_le_bytes());
    h.extend_from_slice(&(key.len() as u32).to_le_bytes());
    h.extend_from_slice(key.as_bytes());
    let sum = xxh3_64(&h);
    h.extend_from_slice(&sum.to_le_bytes());
    h
}

/// A cache file being written: a temporary file renamed into place by [`Writer::commit`],
/// removed if dropped before.
pub(super) struct Writer {
    tmp: PathBuf,
    path: PathBuf,
    out: Option<BufWriter<File>>,
    offset: u64,
    entries: Vec<Entry>,
}

impl Writer {
    /// Starts `path` (its directory created if needed) with `key`.
    pub(super) fn create(path: &Path, key: &str) -> std::io::Result<Writer> {
        let dir = path.parent().unwrap_or(Path::new("."));
        std::fs::create_dir_all(dir)?;
        let name = path
            .file_name()
            .map_or_else(Default::default, |n| n.to_string_lossy());
        let tmp = dir.join(format!(".{name}.tmp-{}", std::process::id()));
        let mut out = BufWriter::with_capacity(1 << 20, File::create(&tmp)?);
        let h = head(key);
        let mut w = Writer {
            tmp,
            path: path.to_path_buf(),
            out: None,
            offset: h.len() as u64,
            entries: Vec::new(),
        };
        out.write_all(&h)?;
        w.out = Some(out);
        Ok(w)
    }

    /// Appends linear `name`'s converted weights.
    pub(super) fn add(&mut self, name: &str, w: &ConvertedWeights) -> std::io::Result<()> {
        let out = self.out.as_mut().ok_or(std::io::ErrorKind::BrokenPipe)?;
        let (values, scales) = (w.values_bytes(), w.scales_bytes());
        out.write_all(values)?;
        out.write_all(scales)?;
        let mut h = Xxh3::new();
        h.update(values);
        h.update(scales);
        let (n_pad, k_pad) = w.padded();
        self.entries.push(Entry {
            name: name.to_owned(),
            format: w.format(),
            n: w.out_features() as u64,
            k: w.in_features() as u64,
            n_pad: n_pad as u64,
            k_pad: k_pad as u64,
            offset: self.offset,
            values: values.len() as u64,
            scales: scales.len() as u64,
            hash: h.digest(),
        });
        self.offset += (values.len() + scales.len()) as u64;
        Ok(())
    }

    /// Writes the directory and trailer, syncs, and renames the file into place.
    pub(super) fn commit(mut self) -> std::io::Result<PathBuf> {
        let mut out = self.out.take().ok_or(std::io::ErrorKind::BrokenPipe)?;
        let mut dir = Vec::new();
        dir.extend_from_slice(&(self.entries.len() as u32).to_le_bytes());
        for e in &self.entries {
            dir.extend_from_slice(&(e.name.len() as u32).to_le_bytes());
            dir.extend_from_slice(e.name.as_bytes());
            dir.push(format_code(e.format));
            for v in [
                e.n, e.k, e.n_pad, e.k_pad, e.offset, e.values, e.scales, e.hash,
            ] {
                dir.extend_from_slice(&v.to_le_bytes());
            }
        }
        out.write_all(&dir)?;
        for v in [self.offset, dir.len() as u64, xxh3_64(&dir)] {
            out.write_all(&v.to_le_bytes())?;
        }
        out.write_all(END)?;
        let file = out.into_inner().map_err(|e| e.into_error())?;
        file.sync_all()?;
        drop(file);
        std::fs::rename(&self.tmp, &self.path)?;
        // The rename is durable once the directory is synced (best effort: not every file
        // system lets a directory be opened).
        if let Some(d) = self.path.parent().and_then(|d| File::open(d).ok()) {
            let _ = d.sync_all();
        }
        Ok(self.path.clone())
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        if self.out.take().is_some() {
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
}

/// An open cache file whose head, key, directory and trailer have been checked.
pub(super) struct Reader {
    file: File,
    entries: Vec<Entry>,
}

/// Reads `len` bytes at `at`, which the caller checked are inside the file.
fn read_at(file: &File, at: u64, len: u64, what: &str) -> Result<Vec<u8>, Invalid> {
    let mut buf = vec![0u8; len as usize];
    file.read_exact_at(&mut buf, at)
        .map_err(|e| Invalid::Io(format!("{what}: {e}")))?;
    Ok(buf)
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap_or_default())
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap_or_default())
}

/// The key a file at `path` was written with, after checking its head (for listing).
pub(super) fn read_key(file: &File, len: u64) -> Result<String, Invalid> {
    if len < HEAD {
        return Err(Invalid::Truncated(format!(
            "{len} bytes, not even a header"
        )));
    }
    let h = read_at(file, 0, HEAD, "header")?;
    if &h[..8] != MAGIC {
        return Err(Invalid::Format("not a weight cache file".into()));
    }
    let version = u32_at(&h, 8);
    if version != LAYOUT_VERSION {
        return Err(Invalid::Format(format!(
            "layout version {version}, this build reads {LAYOUT_VERSION}"
        )));
    }
    let key_len = u64::from(u32_at(&h, 12));
    if key_len > MAX_KEY {
        return Err(Invalid::Corrupt(format!(
            "a key of {key_len} bytes (at most {MAX_KEY})"
        )));
    }
    if HEAD + key_len + 8 + TRAILER > len {
        return Err(Invalid::Truncated("in the header".into()));
    }
    let rest = read_at(file, HEAD, key_len + 8, "key")?;
    let (key, sum) = rest.split_at(key_len as usize);
    let mut whole = h;
    whole.extend_from_slice(key);
    if xxh3_64(&whole) != u64_at(sum, 0) {
        return Err(Invalid::Corrupt("header checksum".into()));
    }
    String::from_utf8(key.to_vec()).map_err(|_| Invalid::Corrupt("key is not UTF-8".into()))
}

impl Reader {
    /// Opens `path` and checks it was written with `key`; the first difference is the error.
    pub(super) fn open(path: &Path, key: &str) -> Result<Reader, Invalid> {
        let file = File::open(path).map_err(|e| Invalid::Io(e.to_string()))?;
        let len = file
            .metadata()
            .map_err(|e| Invalid::Io(e.to_string()))?
            .len();
        let found = read_key(&file, len)?;
        if found != key {
            return Err(Invalid::Stale(super::key::difference(key, &found)));
        }
        let data_start = HEAD + key.len() as u64 + 8;
        let t = read_at(&file, len - TRAILER, TRAILER, "trailer")?;
        if &t[24..] != END {
            return Err(Invalid::Truncated("no trailer at the end".into()));
        }
        let (dir_at, dir_len, dir_sum) = (u64_at(&t, 0), u64_at(&t, 8), u64_at(&t, 16));
        if dir_at < data_start || dir_at.checked_add(dir_len) != Some(len - TRAILER) {
            return Err(Invalid::Truncated(format!(
                "the trailer's directory at {dir_at}+{dir_len} does not end where it starts, at {}",
                len - TRAILER
            )));
        }
        let dir = read_at(&file, dir_at, dir_len, "directory")?;
        if xxh3_64(&dir) != dir_sum {
            return Err(Invalid::Corrupt("directory checksum".into()));
        }
        let entries = parse_directory(&dir, data_start, dir_at)?;
        Ok(Reader { file, entries })
    }

    /// The entry of linear `name`.
    pub(super) fn entry(&self, name: &str) -> Option<&Entry> {
        self.entries.iter().find(|e| e.name == name)
    }

    /// Reads `e`'s weights into `w` (zeroed, of `e`'s padded shape) and checks its checksum.
    pub(super) fn read_into(&self, e: &Entry, w: &mut ConvertedWeights) -> Result<(), Invalid> {
        let (values, scales) = (w.values_bytes_mut().len(), w.scales_bytes_mut().len());
        if (values as u64, scales as u64) != (e.values, e.scales) {
            return Err(Invalid::Stale(format!(
                "{}: {}+{} bytes stored, the engine pads it to {values}+{scales}",
                e.name, e.values, e.scales
            )));
        }
        let io = |what: &str, err: std::io::Error| Invalid::Io(format!("{} {what}: {err}", e.name));
        self.file
            .read_exact_at(w.values_bytes_mut(), e.offset)
            .map_err(|err| io("values", err))?;
        self.file
            .read_exact_at(w.scales_bytes_mut(), e.offset + e.values)
            .map_err(|err| io("scales", err))?;
        let mut h = Xxh3::new();
        h.update(w.values_bytes());
        h.update(w.scales_bytes());
        if h.digest() != e.hash {
            return Err(Invalid::Corrupt(format!("checksum of {}", e.name)));
        }
        Ok(())
    }
}

/// The directory's entries, each checked to lie between `start` and `end` of the file, in
/// order and without overlap, with lengths that match its shape.
fn parse_directory(dir: &[u8], start: u64, end: u64) -> Result<Vec<Entry>, Invalid> {
    let bad = |what: String| Invalid::Corrupt(format!("directory: {what}"));
    let mut at = 0usize;
    let mut take = |n: usize| -> Result<&[u8], Invalid> {
        let s = dir
            .get(at..at + n)
            .ok_or_else(|| bad("shorter than its entries".into()))?;
        at += n;
        Ok(s)
    };
    let count = u32::from_le_bytes(take(4)?.try_into().unwrap_or_default());
    // Each entry takes at least 4 + 1 + 64 bytes: no more entries than that are reserved.
    let mut entries = Vec::with_capacity((count as usize).min(dir.len() / 69));
    let mut next = start;
    for _ in 0..count {
        let name_len = u32::from_le_bytes(take(4)?.try_into().unwrap_or_default()) as usize;
        let name = String::from_utf8(take(name_len)?.to_vec())
            .map_err(|_| bad("a name that is not UTF-8".into()))?;
        let format =
            format_of(take(1)?[0]).ok_or_else(|| bad(format!("{name}: unknown format")))?;
        let mut v = [0u64; 8];
        for x in &mut v {
            *x = u64::from_le_bytes(take(8)?.try_into().unwrap_or_default());
        }
        let [n, k, n_pad, k_pad, offset, values, scales, hash] = v;
        let want_values = n_pad
            .checked_mul(k_pad)
            .and_then(|e| e.checked_mul(value_bytes(format)));
        let want_scales = match format {
            WeightFormat::W8A8 => n_pad.checked_mul(4),
            WeightFormat::F16 => Some(0),
        };
        if n > n_pad || k > k_pad || want_values != Some(values) || want_scales != Some(scales) {
            return Err(bad(format!(
                "{name}: {values}+{scales} bytes for {n}×{k} padded to {n_pad}×{k_pad}"
            )));
        }
        let stop = offset
            .checked_add(values)
            .and_then(|o| o.checked_add(scales));
        if offset != next || stop.is_none_or(|s| s > end) {
            return Err(bad(format!("{name}: at {offset}, expected at {next}")));
        }
        next = stop.unwrap_or(end);
        entries.push(Entry {
            name,
            format,
            n,
            k,
            n_pad,
            k_pad,
            offset,
            values,
            scales,
            hash,
        });
    }
    if at != dir.len() || next != end {
        return Err(bad("sections and directory do not meet".into()));
    }
    Ok(entries)
}
