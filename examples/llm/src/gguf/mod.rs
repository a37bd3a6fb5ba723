//! The GGUF container: header, metadata, tensor directory, alignment, zero-copy tensor views
//! into the memory-mapped file, and dequantization of the common block formats to f32.
//!
//! Layout (little-endian, versions 2 and 3): magic `GGUF`, u32 version, u64 tensor count, u64
//! metadata count; the metadata entries (string key, u32 type tag, value); the tensor
//! directory (string name, u32 dimension count, u64 dimensions innermost first, u32 ggml type,
//! u64 offset into the data section); padding to `general.alignment` (default 32); the data
//! section.
//!
//! Reading is defensive: every count and length is checked against the bytes left in the file
//! before anything is allocated, every size is computed with checked arithmetic, and each
//! broken rule is a [`GgufError`] naming it and the values involved.

mod dequant;
mod error;
mod types;
mod value;

use std::collections::HashMap;
use std::fs::File;
use std::path::Path;
use std::sync::Arc;

pub use dequant::{dequantize, dequantize_row_bytes};
pub use error::GgufError;
pub use types::{GgmlType, QK_K};
use value::MAX_ARRAY_DEPTH;
pub use value::{Array, Metadata, Value, ValueType};

/// The file magic, `GGUF` read as a little-endian u32.
const MAGIC: [u8; 4] = *b"GGUF";
/// Alignment of the data section and of every tensor when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// Most dimensions a ggml tensor has.
pub const MAX_DIMS: usize = 4;

/// One entry of the tensor directory.
#[derive(Debug, Clone)]
pub struct TensorInfo {
    name: String,
    dims: Vec<u64>,
    ty: GgmlType,
    offset: u64,
    n_elements: u64,
    n_bytes: u64,
}

impl TensorInfo {
    /// The tensor's name (`"blk.0.attn_q.weight"`, ...).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Dimensions in ggml order: `dims()[0]` is the innermost (contiguous) one, the row length
    /// of a weight matrix; `dims()[1]` the number of rows.
    pub fn dims(&self) -> &[u64] {
        &self.dims
    }

    /// The element type.
    pub fn ty(&self) -> GgmlType {
        self.ty
    }

    /// Offset of the first byte in the data section.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// The number of elements.
    pub fn n_elements(&self) -> u64 {
        self.n_elements
    }

    /// The number of bytes of data.
    pub fn n_bytes(&self) -> u64 {
        self.n_bytes
    }

    /// The innermost dimension (1 for a 0-dimensional tensor).
    pub fn row_len(&self) -> u64 {
        self.dims.first().copied().unwrap_or(1)
    }

    /// The number of rows: the product of all dimensions but the innermost.
    pub fn n_rows(&self) -> u64 {
        // Cannot overflow: the full product was checked when the directory was read.
        self.dims.iter().skip(1).product()
    }

    /// The entry of matrix `i` of a 3-D tensor (a stack of `dims()[2]` matrices of
    /// `dims()[0] × dims()[1]`, such as a mixture-of-experts layer's experts): named
    /// `{name}[{i}]`, of dimensions `[dims()[0], dims()[1]]`, its bytes the `i`-th slab of the
    /// tensor's. `None` when the tensor is not 3-D or `i` is past its last matrix. Read it with
    /// [`GgufFile::view_entry`].
    pub fn matrix(&self, i: usize) -> Option<TensorInfo> {
        let [k, n, count] = self.dims[..] else {
            return None;
        };
        if i as u64 >= count {
            return None;
        }
        // Within the tensor's checked sizes: count matrices of n_bytes / count each.
        let bytes = self.n_bytes / count;
        Some(TensorInfo {
            name: format!("{}[{i}]", self.name),
            dims: vec![k, n],
            ty: self.ty,
            offset: self.offset + bytes * i as u64,
            n_elements: k * n,
            n_bytes: bytes,
        })
    }
}

/// A tensor's directory entry and its bytes, borrowed from the file without copying.
#[derive(Debug, Clone, Copy)]
pub struct TensorView<'a> {
    info: &'a TensorInfo,
    data: &'a [u8],
    /// The file's bytes, and where `data` starts in them.
    backing: &'a Backing,
    start: usize,
}

impl<'a> TensorView<'a> {
    /// The directory entry.
    pub fn info(&self) -> &'a TensorInfo {
        self.info
    }

    /// The raw bytes in the file's encoding.
    pub fn data(&self) -> &'a [u8] {
        self.data
    }

    /// The name.
    pub fn name(&self) -> &'a str {
        &self.info.name
    }

    /// The dimensions, innermost first.
    pub fn dims(&self) -> &'a [u64] {
        &self.info.dims
    }

    /// The element type.
    pub fn ty(&self) -> GgmlType {
        self.info.ty
    }

    /// Bytes of one row (of [`TensorInfo::row_len`] elements).
    pub fn row_bytes(&self) -> usize {
        // The directory check proved the whole tensor's size fits in the file, hence in usize,
        // and that rows are whole blocks.
        let bs = self.info.ty.block_size() as u64;
        (self.info.row_len() / bs * self.info.ty.type_size() as u64) as usize
    }

    /// Gives back to the system the memory pages of rows `first..first + count` once they
    /// have been converted: a mapped file's pages are dropped from this process's resident
    /// memory (they are read from the file again if touched), so the weights are not held
    /// twice while a model loads. Best effort (nothing for a file held in memory, or where the
    /// system refuses).
    pub fn release_rows(&self, first: usize, count: usize) {
        let rb = self.row_bytes();
        let (Some(at), Some(len)) = (first.checked_mul(rb), count.checked_mul(rb)) else {
            return;
        };
        if at.saturating_add(len) > self.data.len() {
            return;
        }
        // In range: within the tensor's data (checked above), which the directory check put
        // within the file.
        self.backing.release(self.start + at, len);
    }

    /// Dequantizes the whole tensor to a new vector of f32.
    pub fn to_f32(&self) -> Result<Vec<f32>, GgufError> {
        let n = usize::try_from(self.info.n_elements).map_err(|_| GgufError::BadLength {
            ty: self.info.ty,
            reason: format!("{} elements do not fit in memory", self.info.n_elements),
        })?;
        let mut out = vec![0.0; n];
        dequantize(self.info.ty, self.data, &mut out)?;
        Ok(out)
    }

    /// Dequantizes rows `first..first + out.len() / row_len` into `out`, so that a large
    /// tensor can be converted in pieces.
    pub fn rows_to_f32(&self, first: usize, out: &mut [f32]) -> Result<(), GgufError> {
        let ty = self.info.ty;
        let row_len = self.info.row_len() as usize;
        let bad = |reason: String| GgufError::BadLength { ty, reason };
        if row_len == 0 || !out.len().is_multiple_of(row_len) {
            return Err(bad(format!(
                "output of {} values is not whole rows of {row_len}",
                out.len()
            )));
        }
        let rows = out.len() / row_len;
        let rb = self.row_bytes();
        let start = first.checked_mul(rb);
        let end = first.checked_add(rows).and_then(|e| e.checked_mul(rb));
        match (start, end) {
            (Some(s), Some(e)) if e <= self.data.len() => dequantize(ty, &self.data[s..e], out),
            _ => Err(bad(format!(
                "rows {first}..{first}+{rows} past the tensor's {} rows",
                self.info.n_rows()
            ))),
        }
    }
}

/// The bytes behind a [`GgufFile`]: a read-only mapping of the file, or an owned buffer.
enum Backing {
    Mmap(memmap2::Mmap),
    Owned(Vec<u8>),
}

impl std::fmt::Debug for Backing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Backing::Mmap(m) => write!(f, "Mmap({} bytes)", m.len()),
            Backing::Owned(v) => write!(f, "Owned({} bytes)", v.len()),
        }
    }
}

impl Backing {
    fn bytes(&self) -> &[u8] {
        match self {
            Backing::Mmap(m) => m,
            Backing::Owned(v) => v,
        }
    }

    /// Drops the pages of bytes `at..at + len` from this process's resident memory (a mapped
    /// file's; nothing for bytes held in memory, or past the end). Best effort.
    fn release(&self, at: usize, len: usize) {
        if at
            .checked_add(len)
            .is_none_or(|end| end > self.bytes().len())
        {
            return;
        }
        if let Backing::Mmap(map) = self {
            // SAFETY: the mapping is a read-only shared mapping of a file. MADV_DONTNEED on it
            // only drops pages from this process's page tables; a later access reads the same
            // bytes from the file (or the page cache) again, so references into the range stay
            // valid and see the same contents (the file is not modified while it is open, the
            // contract of `open`). The range is within the mapping (checked above).
            let _ =
                unsafe { map.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, at, len) };
        }
    }
}

/// Bytes of a [`GgufFile`] that outlive the borrow of the file ([`GgufFile::shared`]): the
/// mapping stays open while they live.
#[derive(Clone)]
pub struct SharedBytes {
    backing: Arc<Backing>,
    start: usize,
    len: usize,
}

impl std::fmt::Debug for SharedBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedBytes")
            .field("len", &self.len)
            .finish()
    }
}

impl SharedBytes {
    /// Gives back to the system the memory pages of these bytes in a mapped file, once read:
    /// a read of a few bytes maps the whole page-cache folio holding them (up to MiBs; the
    /// token embedding's rows, one per token, kept 11 MiB of Qwen2-0.5B's resident over 21
    /// tokens), which a later read maps again from the page cache. Best effort, as
    /// [`TensorView::release_rows`].
    pub fn release(&self) {
        self.backing.release(self.start, self.len);
    }
}

impl std::ops::Deref for SharedBytes {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        &self.backing.bytes()[self.start..self.start + self.len]
    }
}

/// An open GGUF file: parsed header, metadata and tensor directory, and the file's bytes
/// (memory-mapped by [`GgufFile::open`]) for zero-copy tensor views.
pub struct GgufFile {
    backing: Arc<Backing>,
    version: u32,
    metadata: Metadata,
    tensors: Vec<TensorInfo>,
    tensor_index: HashMap<String, usize>,
    alignment: u64,
    data_offset: u64,
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("version", &self.version)
            .field("metadata_entries", &self.metadata.len())
            .field("tensors", &self.tensors.len())
            .field("alignment", &self.alignment)
            .field("data_offset", &self.data_offset)
            .field("len", &self.backing.bytes().len())
            .finish()
    }
}

impl GgufFile {
    /// Opens and memory-maps the file at `path` and reads its header, metadata and directory.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, GgufError> {
        let path = path.as_ref();
        let io = |source| GgufError::Io {
            path: path.to_path_buf(),
            source,
        };
        let file = File::open(path).map_err(io)?;
        // SAFETY: the mapping is read-only and private to this process. Its contents are only
        // defined while no other process truncates or rewrites the file; model files are not
        // modified while they are being served, and this is the same contract every
        // memory-mapping model loader relies on. All parsing is bounds-checked against the
        // mapping's length, so even a concurrently modified file cannot make us read outside it.
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io)?;
        Self::parse(Arc::new(Backing::Mmap(map)))
    }

    /// Reads a GGUF image held in memory (tests, embedded files).
    pub fn from_bytes(bytes: Vec<u8>) -> Result<Self, GgufError> {
        Self::parse(Arc::new(Backing::Owned(bytes)))
    }

    fn parse(backing: Arc<Backing>) -> Result<Self, GgufError> {
        let bytes = backing.bytes();
        let mut r = Reader { buf: bytes, pos: 0 };
        let magic = &bytes[..bytes.len().min(4)];
        if magic != MAGIC {
            return Err(GgufError::BadMagic {
                found: magic.to_vec(),
            });
        }
        r.pos = 4;
        let version = r.u32("version")?;
        if version != 2 && version != 3 {
            let hint = if version.swap_bytes() <= 3 {
                "; this looks like a big-endian file"
            } else {
                ""
            };
            return Err(GgufError::UnsupportedVersion { version, hint });
        }
        let n_tensors = r.u64("tensor count")?;
        let n_kv = r.u64("metadata count")?;
        // Each entry is at least its key length (8), type tag (4) and a 1-byte value; each
        // tensor at least its name length (8), dimension count (4), type (4) and offset (8).
        r.check_count("metadata entries", n_kv, 13)?;
        let mut metadata = Metadata::default();
        for _ in 0..n_kv {
            let key = r.string("metadata key")?;
            let tag = r.u32(&format!("type of {key:?}"))?;
            let value = r.value(&key, tag, 0)?;
            metadata
                .insert(key, value)
                .map_err(|(key, _)| GgufError::DuplicateKey { key })?;
        }

        let alignment = match metadata.get("general.alignment") {
            None => DEFAULT_ALIGNMENT,
            Some(v) => {
                let a = v.as_u64().ok_or_else(|| GgufError::WrongValueType {
                    key: "general.alignment".into(),
                    expected: "an unsigned integer",
                    found: v.value_type().name(),
                })?;
                if !a.is_power_of_two() {
                    return Err(GgufError::BadAlignment { value: a });
                }
                a
            }
        };

        r.check_count("tensors", n_tensors, 24)?;
        let mut tensors = Vec::with_capacity(n_tensors as usize);
        let mut tensor_index = HashMap::with_capacity(n_tensors as usize);
        for _ in 0..n_tensors {
            let info = r.tensor_info()?;
            if tensor_index.contains_key(&info.name) {
                return Err(GgufError::DuplicateTensor { name: info.name });
            }
            tensor_index.insert(info.name.clone(), tensors.len());
            tensors.push(info);
        }

        let file_len = bytes.len() as u64;
        let data_offset = (r.pos as u64)
            .checked_next_multiple_of(alignment)
            .ok_or(GgufError::BadAlignment { value: alignment })?;
        // A file without tensors (a vocabulary-only file) may end before the padding.
        let data_len = file_len.saturating_sub(data_offset);
        for t in &tensors {
            if t.offset % alignment != 0 {
                return Err(GgufError::MisalignedTensor {
                    tensor: t.name.clone(),
                    offset: t.offset,
                    alignment,
                });
            }
            // Measured from the start of the file: a file that ends before its data section
            // (data_len 0) must not let even an empty tensor start past its end.
            if t.offset
                .checked_add(t.n_bytes)
                .and_then(|end| end.checked_add(data_offset))
                .is_none_or(|end| end > file_len)
            {
                return Err(GgufError::TensorOutOfBounds {
                    tensor: t.name.clone(),
                    offset: t.offset,
                    size: t.n_bytes,
                    data_len,
                });
            }
        }

        Ok(GgufFile {
            backing,
            version,
            metadata,
            tensors,
            tensor_index,
            alignment,
            data_offset,
        })
    }

    /// The GGUF version (2 or 3).
    pub fn version(&self) -> u32 {
        self.version
    }

    /// The metadata table.
    pub fn metadata(&self) -> &Metadata {
        &self.metadata
    }

    /// Gives back to the system the memory pages of the header, metadata and tensor directory
    /// ([`GgufFile::header_bytes`]) of a mapped file: once parsed they are read only for the
    /// converted-weight cache's key, which reads them from the file again. The vocabulary
    /// makes them several MB (6.7 MB for a 256 000-token one). Best effort, as
    /// [`TensorView::release_rows`].
    pub fn release_header(&self) {
        self.backing.release(0, self.data_offset as usize);
    }

    /// Gives back to the system every memory page of a mapped file's tensor data: what a
    /// loader calls once it has converted the weights. Reading a tensor maps more pages than
    /// it reads (the kernel maps its neighbours around each fault, up to 64 KB, and a whole
    /// large folio where the page cache holds one), so pages of weights already converted
    /// and released come back as their neighbours are read; this drops them all. Bytes read
    /// later (an embedding row per token) come back from the file. Best effort, as
    /// [`TensorView::release_rows`].
    pub fn release_data(&self) {
        let start = self.data_offset as usize;
        let len = self.backing.bytes().len().saturating_sub(start);
        self.backing.release(start, len);
    }

    /// Forgets the parsed metadata arrays whose keys start with `prefix` (every entry of
    /// that kind, whatever its element type; scalars and strings stay), returning how many
    /// were dropped: a loader that has built its
    /// [`Tokenizer`](crate::tokenizer::Tokenizer) from `tokenizer.` no longer needs the
    /// vocabulary's token, score, type and merge lists (Qwen2's 151 936 tokens and 151 387
    /// merges are ~15 MB as `String`s), which would otherwise stay allocated for as long as
    /// the file is open, while its weights are converted. A later [`GgufFile::metadata`]
    /// lookup of one of them finds nothing; the file's bytes ([`GgufFile::header_bytes`])
    /// are unchanged.
    pub fn drop_metadata_arrays(&mut self, prefix: &str) -> usize {
        self.metadata.remove_arrays(prefix)
    }

    /// The alignment of the data section and tensors.
    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// Offset of the data section in the file.
    pub fn data_offset(&self) -> u64 {
        self.data_offset
    }

    /// The tensor directory in file order.
    pub fn tensor_infos(&self) -> &[TensorInfo] {
        &self.tensors
    }

    /// The tensor called `name`, as a view into the file's bytes.
    pub fn tensor(&self, name: &str) -> Option<TensorView<'_>> {
        let info = &self.tensors[*self.tensor_index.get(name)?];
        Some(self.view(info))
    }

    /// All tensors in file order.
    pub fn tensors(&self) -> impl Iterator<Item = TensorView<'_>> {
        self.tensors.iter().map(|info| self.view(info))
    }

    /// The header, metadata and tensor directory: every byte before the tensor data (what a
    /// cache of converted weights hashes to know the file it was made from).
    pub fn header_bytes(&self) -> &[u8] {
        // In range: the data offset was checked against the file length when parsed.
        &self.backing.bytes()[..self.data_offset as usize]
    }

    /// The bytes of `view` kept alive beyond the borrow of the file, without copying them (the
    /// token embedding's quantised rows, read a row per token).
    pub fn shared(&self, view: &TensorView<'_>) -> SharedBytes {
        let start = (self.data_offset + view.info.offset) as usize;
        SharedBytes {
            backing: self.backing.clone(),
            start,
            len: view.data.len(),
        }
    }

    /// Gives back to the system the memory pages that hold `view`'s bytes once they have been
    /// converted ([`TensorView::release_rows`] of all its rows).
    pub fn release(&self, view: &TensorView<'_>) {
        view.release_rows(0, view.info.n_rows() as usize);
    }

    /// A view of `info`, an entry made from one of this file's tensors
    /// ([`TensorInfo::matrix`]); `None` when its bytes are not within the file's data.
    pub fn view_entry<'a>(&'a self, info: &'a TensorInfo) -> Option<TensorView<'a>> {
        let start = self.data_offset.checked_add(info.offset)?;
        let end = start.checked_add(info.n_bytes)?;
        (end <= self.backing.bytes().len() as u64).then(|| self.view(info))
    }

    fn view<'a>(&'a self, info: &'a TensorInfo) -> TensorView<'a> {
        // In range and representable: checked against the file length when parsed.
        let start = (self.data_offset + info.offset) as usize;
        let data = &self.backing.bytes()[start..start + info.n_bytes as usize];
        TensorView {
            info,
            data,
            backing: &self.backing,
            start,
        }
    }
}

/// `e` with the field it describes replaced by `what`, for a truncation found before the
/// description was built.
fn rename(e: GgufError, what: String) -> GgufError {
    match e {
        GgufError::Truncated {
            offset,
            needed,
            remaining,
            ..
        } => GgufError::Truncated {
            what,
            offset,
            needed,
            remaining,
        },
        other => other,
    }
}

/// A bounds-checked little-endian cursor over the file's bytes.
struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl Reader<'_> {
    fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    fn take(&mut self, n: u64, what: &str) -> Result<&[u8], GgufError> {
        if n > self.remaining() as u64 {
            return Err(GgufError::Truncated {
                what: what.to_string(),
                offset: self.pos as u64,
                needed: n,
                remaining: self.remaining() as u64,
            });
        }
        let s = &self.buf[self.pos..self.pos + n as usize];
        self.pos += n as usize;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N], GgufError> {
        let s = self.take(N as u64, what)?;
        let mut a = [0; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    fn u32(&mut self, what: &str) -> Result<u32, GgufError> {
        self.array(what).map(u32::from_le_bytes)
    }

    fn u64(&mut self, what: &str) -> Result<u64, GgufError> {
        self.array(what).map(u64::from_le_bytes)
    }

    /// Refuses `count` items of at least `min_size` bytes each that the rest of the file
    /// cannot hold, so that callers may allocate `count` slots.
    fn check_count(&self, what: &str, count: u64, min_size: u64) -> Result<(), GgufError> {
        let remaining = self.remaining() as u64;
        if count.checked_mul(min_size).is_none_or(|b| b > remaining) {
            return Err(GgufError::CountTooLarge {
                what: what.to_string(),
                count,
                min_size,
                offset: self.pos as u64,
                remaining,
            });
        }
        Ok(())
    }

    fn string(&mut self, what: &str) -> Result<String, GgufError> {
        self.string_with(|| what.to_string())
    }

    /// A string whose description for error messages is only built if there is an error
    /// (vocabularies hold tens of thousands of strings).
    fn string_with(&mut self, what: impl Fn() -> String) -> Result<String, GgufError> {
        let len = match self.array::<8>("") {
            Ok(b) => u64::from_le_bytes(b),
            Err(e) => return Err(rename(e, format!("length of {}", what()))),
        };
        let offset = self.pos as u64;
        let bytes = match self.take(len, "") {
            Ok(b) => b,
            Err(e) => return Err(rename(e, what())),
        };
        String::from_utf8(bytes.to_vec()).map_err(|_| GgufError::InvalidUtf8 {
            what: what(),
            offset,
        })
    }

    fn value(&mut self, key: &str, tag: u32, depth: usize) -> Result<Value, GgufError> {
        let ty = ValueType::from_tag(tag).ok_or_else(|| GgufError::UnknownValueType {
            what: key.to_string(),
            tag,
        })?;
        Ok(match ty {
            ValueType::U8 => Value::U8(self.array::<1>(key)?[0]),
            ValueType::I8 => Value::I8(i8::from_le_bytes(self.array(key)?)),
            ValueType::U16 => Value::U16(u16::from_le_bytes(self.array(key)?)),
            ValueType::I16 => Value::I16(i16::from_le_bytes(self.array(key)?)),
            ValueType::U32 => Value::U32(u32::from_le_bytes(self.array(key)?)),
            ValueType::I32 => Value::I32(i32::from_le_bytes(self.array(key)?)),
            ValueType::F32 => Value::F32(f32::from_le_bytes(self.array(key)?)),
            ValueType::U64 => Value::U64(u64::from_le_bytes(self.array(key)?)),
            ValueType::I64 => Value::I64(i64::from_le_bytes(self.array(key)?)),
            ValueType::F64 => Value::F64(f64::from_le_bytes(self.array(key)?)),
            ValueType::Bool => Value::Bool(self.bool(key)?),
            ValueType::String => Value::String(self.string(key)?),
            ValueType::Array => Value::Array(self.array_value(key, depth)?),
        })
    }

    fn bool(&mut self, what: &str) -> Result<bool, GgufError> {
        match self.array::<1>(what)?[0] {
            0 => Ok(false),
            1 => Ok(true),
            byte => Err(GgufError::InvalidBool {
                what: what.to_string(),
                byte,
            }),
        }
    }

    fn array_value(&mut self, key: &str, depth: usize) -> Result<Array, GgufError> {
        if depth >= MAX_ARRAY_DEPTH {
            return Err(GgufError::ArrayTooDeep {
                what: key.to_string(),
            });
        }
        let tag = self.u32(&format!("element type of {key:?}"))?;
        let ty = ValueType::from_tag(tag).ok_or_else(|| GgufError::UnknownValueType {
            what: format!("elements of {key:?}"),
            tag,
        })?;
        let count = self.u64(&format!("element count of {key:?}"))?;
        self.check_count(
            &format!("elements of {key:?}"),
            count,
            ty.min_encoded_size() as u64,
        )?;
        // Bounded by the bytes left in the file (checked just above).
        let n = count as usize;
        macro_rules! fixed {
            ($variant:ident, $t:ty) => {{
                let size = std::mem::size_of::<$t>();
                let bytes = self.take((n * size) as u64, key)?;
                Array::$variant(
                    bytes
                        .chunks_exact(size)
                        .map(|c| <$t>::from_le_bytes(c.try_into().expect("chunk of size")))
                        .collect(),
                )
            }};
        }
        Ok(match ty {
            ValueType::U8 => fixed!(U8, u8),
            ValueType::I8 => fixed!(I8, i8),
            ValueType::U16 => fixed!(U16, u16),
            ValueType::I16 => fixed!(I16, i16),
            ValueType::U32 => fixed!(U32, u32),
            ValueType::I32 => fixed!(I32, i32),
            ValueType::F32 => fixed!(F32, f32),
            ValueType::U64 => fixed!(U64, u64),
            ValueType::I64 => fixed!(I64, i64),
            ValueType::F64 => fixed!(F64, f64),
            ValueType::Bool => {
                let mut v = Vec::with_capacity(n);
                for _ in 0..n {
                    v.push(self.bool(key)?);
                }
                Array::Bool(v)
            }
            ValueType::String => {
                let mut v = Vec::with_capacity(n);
                for i in 0..n {
                    v.push(self.string_with(|| format!("{key}[{i}]"))?);
                }
                Array::String(v)
            }
            ValueType::Array => {
                let mut v = Vec::with_capacity(n);
                for i in 0..n {
                    v.push(self.array_value(&format!("{key}[{i}]"), depth + 1)?);
                }
                Array::Array(v)
            }
        })
    }

    fn tensor_info(&mut self) -> Result<TensorInfo, GgufError> {
        let name = self.string("tensor name")?;
        let n_dims = self.u32(&format!("dimension count of tensor {name:?}"))?;
        let shape_err = |reason: String| GgufError::BadShape {
            tensor: name.clone(),
            reason,
        };
        if n_dims as usize > MAX_DIMS {
            return Err(shape_err(format!(
                "{n_dims} dimensions, at most {MAX_DIMS} allowed"
            )));
        }
        let mut dims = Vec::with_capacity(n_dims as usize);
        for i in 0..n_dims {
            let d = self.u64(&format!("dimension {i} of tensor {name:?}"))?;
            // ggml stores dimensions as int64.
            if d > i64::MAX as u64 {
                return Err(shape_err(format!("dimension {i} is {d}, beyond int64")));
            }
            dims.push(d);
        }
        let type_id = self.u32(&format!("type of tensor {name:?}"))?;
        let ty = GgmlType::from_id(type_id).ok_or_else(|| GgufError::UnknownTensorType {
            tensor: name.clone(),
            type_id,
        })?;
        let offset = self.u64(&format!("offset of tensor {name:?}"))?;
        let n_elements = dims
            .iter()
            .try_fold(1u64, |acc, &d| acc.checked_mul(d))
            .filter(|&n| n <= i64::MAX as u64)
            .ok_or_else(|| shape_err(format!("element count of {dims:?} overflows")))?;
        let row = dims.first().copied().unwrap_or(1);
        if row % ty.block_size() as u64 != 0 {
            return Err(shape_err(format!(
                "row length {row} is not a multiple of the {ty} block size {}",
                ty.block_size()
            )));
        }
        let n_bytes = ty
            .bytes_for(n_elements)
            .ok_or_else(|| shape_err(format!("byte size of {dims:?} {ty} overflows")))?;
        Ok(TensorInfo {
            name,
            dims,
            ty,
            offset,
            n_elements,
            n_bytes,
        })
    }
}

#[cfg(test)]
mod tests;
