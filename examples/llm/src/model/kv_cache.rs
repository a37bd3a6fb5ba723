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
//!
//! A local (sliding-window) layer keeps only what its window needs: after each pass, positions
//! no later query can see are dropped from the front of its buffers once they add up to more
//! than the window again (a copy amortised over that many positions), except the last
//! [`REWIND`] positions' windows, so a caller may still step back that far (a rejected draft,
//! a regenerated reply). Such a layer holds at most about `2 × (window + REWIND)` positions
//! plus the last pass's tokens, whatever the context.
//!
//! A short-convolution layer (LFM2) keeps its `B ⊙ x` rows here the same way: one buffer of
//! `n_embd` f32 values per position (whatever the cache type) and no values, local with a
//! window of its kernel's length, so truncating, rewinding and copying a prefix treat it as
//! they treat a sliding-window layer.
//!
//! A gated delta-net layer (Qwen3.5) holds no rows here: its recurrent state, with what it
//! keeps to step back exactly, is a [`DeltaState`] (see `examples/llm/src/model/delta_net.rs`).
//! Truncating to a position that state cannot recover exactly keeps the latest position
//! before it that every layer can (a checkpoint, or 0).

use half::f16;
use half::slice::HalfFloatSliceExt;

use super::delta_net::DeltaState;

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

    /// Becomes the first `len` values of `from` (of the same type), reusing its allocation.
    fn copy_prefix(&mut self, from: &KvRows, len: usize) {
        match (self, from) {
            (KvRows::F32(to), KvRows::F32(from)) => {
                to.clear();
                to.extend_from_slice(&from[..len]);
            }
            (KvRows::F16(to), KvRows::F16(from)) => {
                to.clear();
                to.extend_from_slice(&from[..len]);
            }
            _ => unreachable!("a cache copies from a cache of its own type"),
        }
    }

    /// Drops the first `n` values.
    fn drain_front(&mut self, n: usize) {
        match self {
            KvRows::F32(v) => drop(v.drain(..n)),
            KvRows::F16(v) => drop(v.drain(..n)),
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

/// Positions a caller may step back from the start of the last pass and still find every key
/// a local layer's window needs (see the module documentation).
pub const REWIND: usize = 64;

/// One layer's view of the cache: its KV heads' buffers, which hold positions `start..`.
pub(crate) struct LayerKv<'a> {
    pub(crate) keys: &'a [KvRows],
    pub(crate) values: &'a [KvRows],
    /// The first position the buffers hold (0 unless the layer is local).
    pub(crate) start: usize,
}

/// Where one layer's buffers are and what they hold.
#[derive(Debug, Clone, PartialEq)]
struct Shape {
    /// Its first buffer in `k` (and `v`).
    first: usize,
    /// Its buffers (KV heads; 1 for a short-convolution layer).
    heads: usize,
    /// Values per position of one buffer (a head's dimensions; `n_embd` for a
    /// short-convolution layer).
    width: usize,
    /// Whether its `v` buffers hold values (not on a short-convolution layer).
    values: bool,
}

/// Keys and values of every past position (see the module documentation).
#[derive(Debug, Default)]
pub struct KvCache {
    k: Vec<KvRows>,
    v: Vec<KvRows>,
    len: usize,
    /// Per layer: its buffers.
    shapes: Vec<Shape>,
    /// Per layer: its sliding window, if local, and the first position its buffers hold.
    windows: Vec<Option<usize>>,
    starts: Vec<usize>,
    ty: CacheType,
    /// Per layer: its recurrent state if it is a delta-net layer.
    delta: Vec<Option<DeltaState>>,
}

impl KvCache {
    /// An empty cache of one buffer per (layer, KV head), `head_dim` values per position; layer
    /// `l` is local with window `w` when `windows[l]` is `Some(w)`.
    #[cfg(test)]
    pub(crate) fn new(
        windows: Vec<Option<usize>>,
        heads: usize,
        head_dim: usize,
        ty: CacheType,
    ) -> KvCache {
        let conv = vec![None; windows.len()];
        KvCache::with_conv(windows, &conv, heads, head_dim, ty)
    }

    /// [`KvCache::new`], except that a layer `l` with `conv[l] = Some(width)` is a
    /// short-convolution layer: one buffer of `width` f32 values per position (its `B ⊙ x`
    /// rows, whatever `ty`: llama.cpp keeps that state in f32), no values, and its window
    /// (`windows[l]`, its kernel length) says which positions it keeps.
    pub(crate) fn with_conv(
        windows: Vec<Option<usize>>,
        conv: &[Option<usize>],
        heads: usize,
        head_dim: usize,
        ty: CacheType,
    ) -> KvCache {
        let (mut k, mut v, mut shapes) = (Vec::new(), Vec::new(), Vec::new());
        for l in 0..windows.len() {
            let (n, width, values, rows) = match conv.get(l).copied().flatten() {
                Some(width) => (1, width, false, CacheType::F32),
                None => (heads, head_dim, true, ty),
            };
            shapes.push(Shape {
                first: k.len(),
                heads: n,
                width,
                values,
            });
            k.extend((0..n).map(|_| KvRows::new(rows)));
            v.extend((0..n).map(|_| KvRows::new(rows)));
        }
        KvCache {
            k,
            v,
            len: 0,
            shapes,
            starts: vec![0; windows.len()],
            delta: vec![None; windows.len()],
            windows,
            ty,
        }
    }

    /// The cache with the delta-net layers' states `delta` (one entry per layer, `Some` on a
    /// delta-net layer, whose key and value buffers stay empty).
    pub(crate) fn with_delta(mut self, delta: Vec<Option<DeltaState>>) -> KvCache {
        debug_assert_eq!(delta.len(), self.windows.len());
        self.delta = delta;
        self
    }

    /// Layer `layer`'s delta-net state.
    pub(crate) fn delta_mut(&mut self, layer: usize) -> Option<&mut DeltaState> {
        self.delta.get_mut(layer).and_then(|d| d.as_mut())
    }

    /// The range of layer `layer`'s buffers in `k` and `v`.
    fn range(&self, layer: usize) -> std::ops::Range<usize> {
        let s = &self.shapes[layer];
        s.first..s.first + s.heads
    }

    /// Layer `layer`'s buffers that hold anything: its keys, and its values unless it is a
    /// short-convolution layer.
    fn buffers_mut(&mut self, layer: usize) -> impl Iterator<Item = &mut KvRows> {
        let r = self.range(layer);
        let vr = if self.shapes[layer].values {
            r.clone()
        } else {
            r.start..r.start
        };
        self.k[r].iter_mut().chain(&mut self.v[vr])
    }

    /// Appends rows of keys `k` and values `v` (`[rows][heads * head_dim]`) to layer `layer`
    /// (on a short-convolution layer, rows of its `width` in `k`, and `v` empty).
    pub(crate) fn append(&mut self, layer: usize, k: &[f32], v: &[f32]) {
        let heads = self.range(layer);
        let (hd, values) = (self.shapes[layer].width, self.shapes[layer].values);
        let width = heads.len() * hd;
        debug_assert!(values || v.is_empty());
        for (cache, new) in [(&mut self.k, k), (&mut self.v, v)] {
            for row in new.chunks_exact(width) {
                for (buf, head) in cache[heads.clone()].iter_mut().zip(row.chunks_exact(hd)) {
                    buf.extend(head);
                }
            }
        }
    }

    /// Layer `layer`'s buffers.
    pub(crate) fn layer(&self, layer: usize) -> LayerKv<'_> {
        let heads = self.range(layer);
        LayerKv {
            keys: &self.k[heads.clone()],
            values: &self.v[heads],
            start: self.starts[layer],
        }
    }

    /// A short-convolution layer's rows, `width` values per position, from the position
    /// returned on.
    pub(crate) fn conv_rows(&self, layer: usize) -> (&[f32], usize) {
        match &self.k[self.shapes[layer].first] {
            KvRows::F32(rows) => (rows, self.starts[layer]),
            KvRows::F16(_) => unreachable!("a short-convolution layer holds f32 rows"),
        }
    }

    /// Records that `len` positions are held after a pass that appended positions `pos..len`,
    /// and drops what the local layers no longer need (see the module documentation).
    pub(crate) fn set_len(&mut self, pos: usize, len: usize) {
        self.len = len;
        for l in 0..self.windows.len() {
            let Some(w) = self.windows[l] else { continue };
            // The first key a query at `pos - REWIND` or later can see.
            let keep_from = pos.saturating_sub(REWIND).saturating_sub(w - 1);
            let drop = keep_from.saturating_sub(self.starts[l]);
            if drop < w + REWIND {
                continue;
            }
            let hd = self.shapes[l].width;
            for buf in self.buffers_mut(l) {
                buf.drain_front(drop * hd);
            }
            self.starts[l] += drop;
        }
    }

    /// Whether the cache can be cut back to `pos` positions and go on from there: every local
    /// layer (and short-convolution layer) still holds the positions a query at `pos` reads
    /// (always, back to 0).
    pub fn can_rewind_to(&self, pos: usize) -> bool {
        pos == 0
            || (self.windows.iter().zip(&self.starts).all(|(w, &start)| {
                start == 0 || w.is_some_and(|w| (pos + 1).saturating_sub(w) >= start)
            }) && self.delta.iter().flatten().all(|d| d.can_rewind_to(pos)))
    }

    /// The latest position at or before `pos` the cache can be cut back to exactly
    /// ([`KvCache::can_rewind_to`]): `pos` itself, a delta-net checkpoint, or 0.
    fn rewind_point(&self, pos: usize) -> usize {
        if self.can_rewind_to(pos) {
            return pos;
        }
        let p = self
            .delta
            .iter()
            .flatten()
            .map(|d| d.rewind_point(pos))
            .min()
            .unwrap_or(0);
        if p < pos && self.can_rewind_to(p) {
            p
        } else {
            0
        }
    }

    /// Positions held.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no position is held.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// How keys and values are stored (a short-convolution layer's rows are f32 whatever it
    /// says).
    pub fn cache_type(&self) -> CacheType {
        self.ty
    }

    /// Bytes of the delta-net layers' states (f32 whatever the cache type), part of
    /// [`KvCache::bytes`].
    pub fn recurrent_bytes(&self) -> usize {
        self.delta.iter().flatten().map(|d| d.bytes()).sum()
    }

    /// Bytes held for keys and values (and short-convolution rows, and delta-net states).
    pub fn bytes(&self) -> usize {
        self.k
            .iter()
            .chain(&self.v)
            .map(|r| match r {
                KvRows::F32(v) => v.len() * 4,
                KvRows::F16(v) => v.len() * 2,
            })
            .sum::<usize>()
            + self
                .delta
                .iter()
                .flatten()
                .map(|d| d.bytes())
                .sum::<usize>()
    }

    /// Becomes a copy of the first `len` positions of `from`, a cache of the same model and
    /// type (what evaluating those tokens here would have written, bit for bit); false, and
    /// nothing changed, when `from` does not hold them all (fewer positions, or a local layer
    /// that dropped keys a query at `len` sees: [`KvCache::can_rewind_to`]) or is of another
    /// shape or type.
    pub(crate) fn copy_prefix(&mut self, from: &KvCache, len: usize) -> bool {
        let same = self.ty == from.ty
            && self.shapes == from.shapes
            && self.windows == from.windows
            && self.delta.len() == from.delta.len()
            && self
                .delta
                .iter()
                .zip(&from.delta)
                .all(|(a, b)| match (a, b) {
                    (None, None) => true,
                    (Some(a), Some(b)) => a.same_shape(b),
                    _ => false,
                });
        if !same || len > from.len || !from.can_rewind_to(len) {
            return false;
        }
        for (to, from) in self.delta.iter_mut().zip(&from.delta) {
            if let (Some(to), Some(from)) = (to.as_mut(), from) {
                to.clone_from(from);
                to.truncate(len);
            }
        }
        for (l, &start) in from.starts.iter().enumerate() {
            let start = if len == 0 { 0 } else { start };
            let shape = &self.shapes[l];
            // A delta-net layer's buffers are empty (its state is copied above).
            let rows = if self.delta[l].is_some() {
                0
            } else {
                len - start
            };
            let values = rows * shape.width;
            let buffers = self.range(l);
            let vbuffers = if shape.values {
                buffers.clone()
            } else {
                buffers.start..buffers.start
            };
            for (to, from, r) in [
                (&mut self.k, &from.k, buffers),
                (&mut self.v, &from.v, vbuffers),
            ] {
                for (t, f) in to[r.clone()].iter_mut().zip(&from[r]) {
                    t.copy_prefix(f, values);
                }
            }
            self.starts[l] = start;
        }
        self.len = len;
        true
    }

    /// Keeps the first `pos` positions; when a local layer no longer holds what a query at
    /// `pos` sees, or a delta-net layer cannot recover its state there
    /// ([`KvCache::can_rewind_to`]), keeps the latest position before it that it can: a
    /// delta-net checkpoint, or none.
    pub(crate) fn truncate(&mut self, pos: usize) {
        let pos = self.rewind_point(pos.min(self.len));
        for d in self.delta.iter_mut().flatten() {
            d.truncate(pos);
        }
        for l in 0..self.starts.len() {
            let keep = pos.saturating_sub(self.starts[l]) * self.shapes[l].width;
            for buf in self.buffers_mut(l) {
                buf.truncate(if pos == 0 { 0 } else { keep });
            }
        }
        if pos == 0 {
            self.starts.iter_mut().for_each(|s| *s = 0);
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
    fn a_local_layer_keeps_its_window_and_the_rewind_margin_only() {
        // Layer 0 global, layer 1 local with a window of 8; one head of 2 values.
        let w = 8;
        let mut c = KvCache::new(vec![None, Some(w)], 1, 2, CacheType::F32);
        let mut len = 0;
        for step in 0..400 {
            // Passes of 1..=5 positions, the value of a position its index.
            let m = 1 + step % 5;
            let rows: Vec<f32> = (len..len + m).flat_map(|p| [p as f32; 2]).collect();
            for l in 0..2 {
                c.append(l, &rows, &rows);
            }
            c.set_len(len, len + m);
            let pos = len;
            len += m;
            let local = c.layer(1);
            let KvRows::F32(keys) = &local.keys[0] else {
                unreachable!()
            };
            // What it holds is positions start..len, in order.
            assert_eq!(keys.len(), (len - local.start) * 2);
            assert_eq!(keys[0], local.start as f32);
            // Bounded, and enough for any query from REWIND before the pass on.
            assert!(
                len - local.start <= 2 * (w + REWIND) + m,
                "holds {}",
                len - local.start
            );
            assert!(c.can_rewind_to(pos.saturating_sub(REWIND)));
        }
        let start = c.layer(1).start;
        assert!(start > 0);
        assert!(
            !c.can_rewind_to(start),
            "a query at {start} needs positions before it"
        );
        // A cut the local layer cannot serve keeps nothing.
        c.truncate(start);
        assert_eq!((c.len(), c.layer(1).start, c.bytes()), (0, 0, 0));
    }

    /// The keys and values of `layer`'s one head, as f32.
    fn rows(c: &KvCache, layer: usize) -> (Vec<f32>, Vec<f32>, usize) {
        let l = c.layer(layer);
        let f = |r: &KvRows| match r {
            KvRows::F32(v) => v.clone(),
            KvRows::F16(v) => v.iter().map(|h| h.to_f32()).collect(),
        };
        (f(&l.keys[0]), f(&l.values[0]), l.start)
    }

    #[test]
    fn a_copied_prefix_is_what_truncating_a_copy_keeps() {
        for ty in [CacheType::F32, CacheType::F16] {
            let w = 8;
            let mut c = KvCache::new(vec![None, Some(w)], 1, 2, ty);
            for pos in 0..300 {
                let k = [pos as f32, -(pos as f32)];
                let v = [0.5 * pos as f32, 1.0];
                for l in 0..2 {
                    c.append(l, &k, &v);
                }
                c.set_len(pos, pos + 1);
            }
            assert!(c.layer(1).start > 0, "the local layer dropped positions");
            let mut to = KvCache::new(vec![None, Some(w)], 1, 2, ty);
            let first = c.layer(1).start + w - 1;
            for len in [0, first, 299, 300] {
                assert!(to.copy_prefix(&c, len), "{len}");
                let mut want = KvCache::new(vec![None, Some(w)], 1, 2, ty);
                want.k = c.k.clone();
                want.v = c.v.clone();
                want.starts = c.starts.clone();
                want.len = c.len;
                want.truncate(len);
                assert_eq!(to.len(), len);
                for l in 0..2 {
                    assert_eq!(rows(&to, l), rows(&want, l), "{ty:?} {len} layer {l}");
                }
            }
            // Positions the local layer dropped, more than it holds, another shape or type:
            // refused, nothing changed.
            let before = (rows(&to, 0), rows(&to, 1), to.len());
            let other_ty = if ty == CacheType::F32 {
                CacheType::F16
            } else {
                CacheType::F32
            };
            for (from, len) in [
                (&c, 5),
                (&c, first - 1),
                (&c, 301),
                (&KvCache::new(vec![None, None], 1, 2, ty), 0),
                (&KvCache::new(vec![None, Some(w)], 1, 2, other_ty), 0),
            ] {
                assert!(!to.copy_prefix(from, len), "{len}");
                assert_eq!((rows(&to, 0), rows(&to, 1), to.len()), before);
            }
        }
    }

    #[test]
    fn truncation_and_sizes() {
        let mut c = KvCache::new(vec![None, None], 1, 2, CacheType::F16);
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
