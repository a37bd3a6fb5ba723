//! The KV cache: keys and values of every past position, in f32 or f16.
//!
//! One buffer per (layer, KV head), each `[position][head_dim]`: attention reads one head's
//! keys (and values) front to back, so they are contiguous and the hardware prefetcher streams
//! them (interleaved heads, `[position][n_head_kv * head_dim]`, made every row a strided read
//! and attention 2–3× slower at long contexts).
//!
//! With [`CacheType::F16`] each value is rounded to the nearest f16 (ties to even) once, when
//! its position is written, and read back exactly (every f16 is an f32): a position's keys and
//! values are the same bits whichever batch wrote them, so the forward pass stays batch-
//! invariant. Attention's row kernels read f16 rows converting them exactly as they load
//! ([`super::kernels::Kernel::dot_rows_f16`]), so its result equals the f32 cache's on the
//! rounded values, bit for bit.

use half::f16;
use half::slice::HalfFloatSliceExt;

/// How the KV cache stores keys and values.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum CacheType {
    /// f32: exact (the reference path against llama.cpp with an F32 cache).
    #[default]
    F32,
    /// f16, as llama.cpp keeps its cache by default: half the memory and half the bytes
    /// attention reads per position, for a rounding of every key and value to 11 bits.
    F16,
}

impl CacheType {
    /// The name `--cache-type` takes.
    pub fn name(self) -> &'static str {
        match self {
            CacheType::F32 => "f32",
            CacheType::F16 => "f16",
        }
    }
}

/// The rows of one (layer, KV head).
#[derive(Debug, Clone)]
pub(crate) enum KvRows {
    F32(Vec<f32>),
    F16(Vec<f16>),
}

impl KvRows {
    fn new(ty: CacheType) -> KvRows {
        match ty {
            CacheType::F32 => KvRows::F32(Vec::new()),
            CacheType::F16 => KvRows::F16(Vec::new()),
        }
    }

    /// Keeps the first `len` values.
    fn truncate(&mut self, len: usize) {
        match self {
            KvRows::F32(v) => v.truncate(len),
            KvRows::F16(v) => v.truncate(len),
        }
    }

    /// Appends `values` (rounded to f16 for an f16 cache).
    pub(crate) fn extend(&mut self, values: &[f32]) {
        match self {
            KvRows::F32(v) => v.extend_from_slice(values),
            KvRows::F16(v) => {
                let start = v.len();
                v.resize(start + values.len(), f16::ZERO);
                v[start..].convert_from_f32_slice(values);
            }
        }
    }
}

/// Keys and values of every past position (see the module documentation).
#[derive(Debug, Default)]
pub struct KvCache {
    k: Vec<KvRows>,
    v: Vec<KvRows>,
    len: usize,
    /// Values per position of one buffer (a head's dimensions).
    head_dim: usize,
    ty: CacheType,
}

impl KvCache {
    /// An empty cache of `buffers` (layers × KV heads) buffers of `head_dim` values per
    /// position.
    pub(crate) fn new(buffers: usize, head_dim: usize, ty: CacheType) -> KvCache {
        KvCache {
            k: vec![KvRows::new(ty); buffers],
            v: vec![KvRows::new(ty); buffers],
            len: 0,
            head_dim,
            ty,
        }
    }

    /// Appends rows of keys `k` and values `v` (`[rows][heads.len() * head_dim]`) to the
    /// buffers `heads`.
    pub(crate) fn append(&mut self, heads: std::ops::Range<usize>, k: &[f32], v: &[f32]) {
        let width = heads.len() * self.head_dim;
        for (cache, new) in [(&mut self.k, k), (&mut self.v, v)] {
            for row in new.chunks_exact(width) {
                for (buf, head) in cache[heads.clone()]
                    .iter_mut()
                    .zip(row.chunks_exact(self.head_dim))
                {
                    buf.extend(head);
                }
            }
        }
    }

    /// The key and value buffers `heads`.
    pub(crate) fn heads(&self, heads: std::ops::Range<usize>) -> (&[KvRows], &[KvRows]) {
        (&self.k[heads.clone()], &self.v[heads])
    }

    /// Records that `len` positions are held (after [`KvCache::append`] of the new ones).
    pub(crate) fn set_len(&mut self, len: usize) {
        self.len = len;
    }

    /// Positions held.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no position is held.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// How keys and values are stored.
    pub fn cache_type(&self) -> CacheType {
        self.ty
    }

    /// Bytes held for keys and values.
    pub fn bytes(&self) -> usize {
        let elem = match self.ty {
            CacheType::F32 => 4,
            CacheType::F16 => 2,
        };
        self.k
            .iter()
            .chain(&self.v)
            .map(|r| match r {
                KvRows::F32(v) => v.len(),
                KvRows::F16(v) => v.len(),
            })
            .sum::<usize>()
            * elem
    }

    /// Keeps the first `pos` positions.
    pub(crate) fn truncate(&mut self, pos: usize) {
        for buf in self.k.iter_mut().chain(self.v.iter_mut()) {
            buf.truncate(pos * self.head_dim);
        }
        self.len = pos.min(self.len);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f16_rows_round_once_whatever_the_batches() {
        let values: Vec<f32> = (0..60).map(|i| (i as f32) * 0.3337 - 7.0).collect();
        let mut rows = KvRows::new(CacheType::F16);
        rows.extend(&values[..21]);
        rows.extend(&values[21..]);
        let KvRows::F16(stored) = &rows else {
            panic!("an f16 cache holds f16 rows")
        };
        let want: Vec<f16> = values.iter().map(|&x| f16::from_f32(x)).collect();
        assert_eq!(stored, &want);
        assert_ne!(
            stored.iter().map(|h| h.to_f32()).collect::<Vec<_>>(),
            values,
            "f16 rounds"
        );
    }

    #[test]
    fn truncation_and_sizes() {
        let mut c = KvCache::new(2, 2, CacheType::F16);
        for r in c.k.iter_mut().chain(c.v.iter_mut()) {
            r.extend(&[1.0; 8]);
        }
        c.len = 4;
        assert_eq!(c.bytes(), 4 * 8 * 2);
        c.truncate(1);
        assert_eq!((c.len(), c.bytes()), (1, 4 * 2 * 2));
        assert_eq!(c.cache_type(), CacheType::F16);
    }
}
