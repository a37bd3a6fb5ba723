//! The cache file: a header binding it to what made it, the converted linears one after the
//! other, a directory of them and a trailer.
//!
//! ```text
//! magic "RKLLMWC\n" | version u32 | key length u32 | key (UTF-8 lines "field=value") | key XXH3 u64
//! section*          (each linear, at a multiple of 64 bytes: its values, then its scales;
//!                   per-group int4 W4A16: each channel's group scales, then its offsets)
//! directory         count u32, then per linear: name length u32, name, format u8,
//!                   n, k, n_pad, k_pad, offset, values bytes, scales bytes, XXH3 (u64 each)
//! trailer           directory offset u64 | directory length u64 | directory XXH3 u64 | "RKWCEND\n"
//! ```
//!
//! Integers are little-endian. The writer streams each linear's converted rows to a temporary
//! file as they are converted and renames it into place only once the trailer is written and
//! synced, so a crash leaves no half file under the cache's name. The reader maps the file,
//! checks every length against the file's before it allocates or reads, and each section's
//! checksum before its weights are placed. Either way the NPU's lanes pack a linear straight
//! from the mapped section, whose pages are dropped from the process's memory as soon as they
//! are read: a load never holds a linear twice.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use memmap2::{Mmap, MmapOptions, UncheckedAdvice};
use rknn_matmul::engine::{ConvertedBytes, WeightFormat};
use xxhash_rust::xxh3::{Xxh3, xxh3_64};

use super::key::{LAYOUT_VERSION, difference};

/// The file's first bytes.
pub(super) const MAGIC: &[u8; 8] = b"RKLLMWC\n";
/// The trailer's last bytes.
const END: &[u8; 8] = b"RKWCEND\n";
/// The largest key this reader accepts (a key is a few hundred bytes).
const MAX_KEY: u64 = 1 << 20;
/// The trailer's length.
const TRAILER: u64 = 32;
/// Bytes of the fixed head before the key.
const HEAD: u64 = 16;
/// Sections start at multiples of this (values of any format are aligned in a mapping).
const ALIGN: u64 = 64;
/// Bytes checked per step before their pages are given back.
const VERIFY_STEP: usize = 8 << 20;

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

/// Gives back the pages of `map[range]`: they leave this process's resident memory and are
/// read from the file again if touched.
fn release(map: &Mmap, range: Range<usize>) {
    // SAFETY: `map` is a read-only shared mapping of a cache file. MADV_DONTNEED only drops
    // its pages from this process's page tables; a later access reads the same bytes from the
    // file (or the page cache) again, so references into the range stay valid and see the same
    // contents: cache files are never modified in place (the writer publishes them by rename
    // and removing one unlinks it). An out-of-range request is refused by memmap2, not made.
    let _ =
        unsafe { map.unchecked_advise_range(UncheckedAdvice::DontNeed, range.start, range.len()) };
}

/// One linear's converted weights in a mapped cache file: what the engine's lanes pack from.
pub(super) struct Section {
    map: Arc<Mmap>,
    values: Range<usize>,
    scales: Range<usize>,
    /// Bytes per row of values.
    row: usize,
}

impl ConvertedBytes for Section {
    fn values(&self) -> &[u8] {
        &self.map[self.values.clone()]
    }

    fn scales(&self) -> &[u8] {
        &self.map[self.scales.clone()]
    }

    fn placed(&self, rows: Range<usize>) {
        let at = self.values.start + rows.start * self.row;
        release(&self.map, at..at + rows.len() * self.row);
    }
}

impl Section {
    /// Checks the bytes against `hash`, a step at a time, giving their pages back as it goes.
    fn verify(&self, hash: u64) -> bool {
        let mut h = Xxh3::new();
        for r in [self.values.clone(), self.scales.clone()] {
            let mut at = r.start;
            while at < r.end {
                let end = (at + VERIFY_STEP).min(r.end);
                h.update(&self.map[at..end]);
                release(&self.map, at..end);
                at = end;
            }
        }
        h.digest() == hash
    }
}

fn format_code(f: WeightFormat) -> u8 {
    match f {
        WeightFormat::W8A8 => 1,
        WeightFormat::F16 => 2,
        WeightFormat::W4A16 => 3,
        WeightFormat::W4A8 => 4,
    }
}

fn format_of(code: u8) -> Option<WeightFormat> {
    WeightFormat::ALL
        .into_iter()
        .find(|&f| format_code(f) == code)
}

/// Bytes of `values` values of `format` (int4: two per byte; `values` is whole K-aligned rows,
/// so even).
fn values_bytes(format: WeightFormat, values: u64) -> Option<u64> {
    match format {
        WeightFormat::W8A8 => Some(values),
        WeightFormat::F16 => values.checked_mul(2),
        WeightFormat::W4A16 | WeightFormat::W4A8 => Some(values.div_ceil(2)),
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

/// A section being written ([`Writer::begin`]).
pub(super) struct Pending {
    name: String,
    format: WeightFormat,
    n: u64,
    k: u64,
    offset: u64,
    values: u64,
    scales: Vec<u8>,
    hash: Xxh3,
}

impl Pending {
    /// Takes the next converted rows (values and their scales, as the engine hands them out).
    pub(super) fn rows(
        &mut self,
        w: &mut Writer,
        values: &[u8],
        scales: &[u8],
    ) -> std::io::Result<()> {
        let out = w.out.as_mut().ok_or(std::io::ErrorKind::BrokenPipe)?;
        out.write_all(values)?;
        self.hash.update(values);
        self.values += values.len() as u64;
        self.scales.extend_from_slice(scales);
        Ok(())
    }
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
        // Readable too: each section is mapped back from it to be placed.
        let file = File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&tmp)?;
        let mut w = Writer {
            tmp,
            path: path.to_path_buf(),
            out: Some(BufWriter::with_capacity(1 << 20, file)),
            offset: 0,
            entries: Vec::new(),
        };
        let h = head(key);
        w.write(&h)?;
        Ok(w)
    }

    fn write(&mut self, b: &[u8]) -> std::io::Result<()> {
        let out = self.out.as_mut().ok_or(std::io::ErrorKind::BrokenPipe)?;
        out.write_all(b)?;
        self.offset += b.len() as u64;
        Ok(())
    }

    /// Starts linear `name`'s section ([n, k] in `format`).
    pub(super) fn begin(
        &mut self,
        name: &str,
        format: WeightFormat,
        n: usize,
        k: usize,
    ) -> std::io::Result<Pending> {
        let pad = self.offset.next_multiple_of(ALIGN) - self.offset;
        self.write(&vec![0; pad as usize])?;
        Ok(Pending {
            name: name.to_owned(),
            format,
            n: n as u64,
            k: k as u64,
            offset: self.offset,
            values: 0,
            scales: Vec::new(),
            hash: Xxh3::new(),
        })
    }

    /// Ends section `p` (padded to `n_pad × k_pad`) and maps it back from the file for the
    /// engine to place.
    pub(super) fn end(
        &mut self,
        mut p: Pending,
        (n_pad, k_pad): (usize, usize),
    ) -> std::io::Result<Section> {
        let scales = std::mem::take(&mut p.scales);
        p.hash.update(&scales);
        let out = self.out.as_mut().ok_or(std::io::ErrorKind::BrokenPipe)?;
        out.write_all(&scales)?;
        out.flush()?;
        self.offset = p.offset + p.values + scales.len() as u64;
        let e = Entry {
            name: p.name,
            format: p.format,
            n: p.n,
            k: p.k,
            n_pad: n_pad as u64,
            k_pad: k_pad as u64,
            offset: p.offset,
            values: p.values,
            scales: scales.len() as u64,
            hash: p.hash.digest(),
        };
        let section = map_section(out.get_ref(), &e)?;
        self.entries.push(e);
        Ok(section)
    }

    /// Writes the directory and trailer, syncs, and renames the file into place.
    pub(super) fn commit(mut self) -> std::io::Result<PathBuf> {
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
        let dir_at = self.offset;
        self.write(&dir)?;
        let mut trailer = Vec::with_capacity(TRAILER as usize);
        for v in [dir_at, dir.len() as u64, xxh3_64(&dir)] {
            trailer.extend_from_slice(&v.to_le_bytes());
        }
        trailer.extend_from_slice(END);
        self.write(&trailer)?;
        let out = self.out.take().ok_or(std::io::ErrorKind::BrokenPipe)?;
        let file = out.into_inner().map_err(|e| e.into_error())?;
        let synced = file.sync_all();
        drop(file);
        if let Err(e) = synced.and_then(|()| std::fs::rename(&self.tmp, &self.path)) {
            let _ = std::fs::remove_file(&self.tmp);
            return Err(e);
        }
        // The rename is durable once the directory is synced (best effort: not every file
        // system lets a directory be opened).
        if let Some(d) = self.path.parent().and_then(|d| File::open(d).ok()) {
            let _ = d.sync_all();
        }
        Ok(self.path.clone())
    }
}

/// Maps entry `e`'s section of `file` (its bytes written and flushed).
fn map_section(file: &File, e: &Entry) -> std::io::Result<Section> {
    let page = 4096u64;
    let start = e.offset - e.offset % page;
    let len = e.offset + e.values + e.scales - start;
    // SAFETY: a read-only mapping of a file this process is writing and has flushed up to the
    // end of the section; nothing rewrites those bytes (the writer only appends) and the file
    // is not truncated while the mapping lives (it is renamed into place or removed, which
    // leaves the mapped inode intact).
    let map = unsafe {
        MmapOptions::new()
            .offset(start)
            .len(usize::try_from(len).map_err(|_| std::io::ErrorKind::InvalidInput)?)
            .map(file)?
    };
    let at = (e.offset - start) as usize;
    Ok(Section {
        map: Arc::new(map),
        values: at..at + e.values as usize,
        scales: at + e.values as usize..(len as usize),
        row: (e.values / e.n_pad.max(1)) as usize,
    })
}

impl Drop for Writer {
    fn drop(&mut self) {
        if self.out.take().is_some() {
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
}

/// An open, mapped cache file whose head, key, directory and trailer have been checked.
pub(super) struct Reader {
    map: Arc<Mmap>,
    entries: Vec<Entry>,
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap_or_default())
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap_or_default())
}

/// Maps the cache file `file`.
fn map(file: &File) -> Result<Mmap, Invalid> {
    // SAFETY: a read-only mapping of a cache file, which is never modified in place (the
    // writer publishes a complete file by rename; removing one unlinks it, and the mapping
    // keeps the inode). Every read from it is bounds-checked against its length.
    unsafe { Mmap::map(file) }.map_err(|e| Invalid::Io(e.to_string()))
}

/// The key of the cache file `file`, after checking its head (for listing).
pub(super) fn read_key(file: &File) -> Result<String, Invalid> {
    parse_key(&map(file)?)
}

/// The key in the head of `b`, checked.
fn parse_key(b: &[u8]) -> Result<String, Invalid> {
    let len = b.len() as u64;
    if len < HEAD {
        return Err(Invalid::Truncated(format!(
            "{len} bytes, not even a header"
        )));
    }
    if &b[..8] != MAGIC {
        return Err(Invalid::Format("not a weight cache file".into()));
    }
    let version = u32_at(b, 8);
    if version != LAYOUT_VERSION {
        return Err(Invalid::Format(format!(
            "layout version {version}, this build reads {LAYOUT_VERSION}"
        )));
    }
    let key_len = u64::from(u32_at(b, 12));
    if key_len > MAX_KEY {
        return Err(Invalid::Corrupt(format!(
            "a key of {key_len} bytes (at most {MAX_KEY})"
        )));
    }
    if HEAD + key_len + 8 + TRAILER > len {
        return Err(Invalid::Truncated("in the header".into()));
    }
    let end = (HEAD + key_len) as usize;
    if xxh3_64(&b[..end]) != u64_at(b, end) {
        return Err(Invalid::Corrupt("header checksum".into()));
    }
    String::from_utf8(b[HEAD as usize..end].to_vec())
        .map_err(|_| Invalid::Corrupt("key is not UTF-8".into()))
}

impl Reader {
    /// Opens and maps `path` and checks it was written with `key`; the first difference is
    /// the error.
    pub(super) fn open(path: &Path, key: &str) -> Result<Reader, Invalid> {
        let file = File::open(path).map_err(|e| Invalid::Io(e.to_string()))?;
        let map = map(&file)?;
        let found = parse_key(&map)?;
        if found != key {
            return Err(Invalid::Stale(difference(key, &found)));
        }
        let len = map.len() as u64;
        let data_start = HEAD + key.len() as u64 + 8;
        let t = &map[(len - TRAILER) as usize..];
        if &t[24..] != END {
            return Err(Invalid::Truncated("no trailer at the end".into()));
        }
        let (dir_at, dir_len, dir_sum) = (u64_at(t, 0), u64_at(t, 8), u64_at(t, 16));
        if dir_at < data_start || dir_at.checked_add(dir_len) != Some(len - TRAILER) {
            return Err(Invalid::Truncated(format!(
                "the trailer's directory at {dir_at}+{dir_len} does not end where it starts, at {}",
                len - TRAILER
            )));
        }
        let dir = &map[dir_at as usize..(len - TRAILER) as usize];
        if xxh3_64(dir) != dir_sum {
            return Err(Invalid::Corrupt("directory checksum".into()));
        }
        let entries = parse_directory(dir, data_start, dir_at)?;
        Ok(Reader {
            map: Arc::new(map),
            entries,
        })
    }

    /// The entry of linear `name`.
    pub(super) fn entry(&self, name: &str) -> Option<&Entry> {
        self.entries.iter().find(|e| e.name == name)
    }

    /// `e`'s section, its checksum checked (its pages given back as they are read).
    pub(super) fn section(&self, e: &Entry) -> Result<Section, Invalid> {
        let (at, values) = (e.offset as usize, e.values as usize);
        let s = Section {
            map: self.map.clone(),
            values: at..at + values,
            scales: at + values..at + values + e.scales as usize,
            row: (e.values / e.n_pad.max(1)) as usize,
        };
        if !s.verify(e.hash) {
            return Err(Invalid::Corrupt(format!("checksum of {}", e.name)));
        }
        Ok(s)
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
            .and_then(|e| values_bytes(format, e));
        let mut want_scales = match format {
            WeightFormat::W8A8 | WeightFormat::W4A16 | WeightFormat::W4A8 => n_pad.checked_mul(4),
            WeightFormat::F16 => Some(0),
        };
        // Per-group W4A16: per output channel a scale and an offset per group, the groups
        // dividing k_pad (the group size is the key's; the engine checks the exact length).
        let per_group = n_pad.checked_mul(8).filter(|&b| b > 0).and_then(|b| {
            let groups = scales / b;
            (scales % b == 0 && groups > 0 && k_pad % groups == 0).then_some(scales)
        });
        if format == WeightFormat::W4A16 && per_group.is_some() {
            want_scales = per_group;
        }
        if n > n_pad || k > k_pad || want_values != Some(values) || want_scales != Some(scales) {
            return Err(bad(format!(
                "{name}: {values}+{scales} bytes for {n}×{k} padded to {n_pad}×{k_pad}"
            )));
        }
        let stop = offset
            .checked_add(values)
            .and_then(|o| o.checked_add(scales));
        let expected = next.next_multiple_of(ALIGN);
        if offset != expected || stop.is_none_or(|s| s > end) {
            return Err(bad(format!("{name}: at {offset}, expected at {expected}")));
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
