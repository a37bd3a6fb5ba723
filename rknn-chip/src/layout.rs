//! Native layouts of A, B and C, int4 packing, and the K segmentation of native B
//! (fact sheet §6-7). Pure index math and copies, shared by the emulator (to read what the
//! caller wrote) and the engine (to pack A and unpack C on the hot path).
//!
//! * Native A `[ceil(K/sK), M, sK]`: element (m, k) at `((k / sK) * M + m) * sK + k % sK`.
//! * Native B `[ceil(N/sN), ceil(K/sK), sN, sK]`: element (k, n) at
//!   `((n / sN) * K1 + k / sK) * sN * sK + (n % sN) * sK + k % sK`, `K1 = ceil(K / sK)`.
//!   When K exceeds the chip's segment size S, B is stored as `ceil(K / S)` such blocks one after
//!   another, each laid out for its own K (S is a multiple of sK, so every block but the last is
//!   full).
//! * Native C `[ceil(N/sN), M, sN]`: element (m, n) at `((n / sN) * M + m) * sN + n % sN`.
//!
//! Tiles are padded with zeros; native A and C have no padding in M.

use crate::dtype::{ElemKind, Layout, MatmulType};
use crate::platform::{Platform, Tiles};
use crate::rules::MatmulConfig;

/// Elements of native A (with K padding).
pub const fn native_a_len(m: usize, k: usize, sk: usize) -> usize {
    k.div_ceil(sk) * m * sk
}

/// Elements of native B (with K and N padding; segmentation does not change the total).
pub const fn native_b_len(k: usize, n: usize, sn: usize, sk: usize) -> usize {
    n.div_ceil(sn) * sn * k.div_ceil(sk) * sk
}

/// Elements of native C (with N padding).
pub const fn native_c_len(m: usize, n: usize, sn: usize) -> usize {
    n.div_ceil(sn) * m * sn
}

/// Index of A(m, k) in native A.
#[inline]
pub const fn native_a_index(m_total: usize, sk: usize, m: usize, k: usize) -> usize {
    ((k / sk) * m_total + m) * sk + k % sk
}

/// Index of C(m, n) in native C.
#[inline]
pub const fn native_c_index(m_total: usize, sn: usize, m: usize, n: usize) -> usize {
    ((n / sn) * m_total + m) * sn + n % sn
}

/// The geometry of a native B buffer, segmentation included.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NativeB {
    /// K of the whole matrix.
    pub k: usize,
    /// N of the whole matrix.
    pub n: usize,
    /// Tile N.
    pub sn: usize,
    /// Tile K.
    pub sk: usize,
    /// K rows per segment (equal to the padded K when there is one segment).
    pub segment: usize,
}

impl NativeB {
    /// The geometry for `k` × `n` with tiles `sn` × `sk`, segmented at `segment` rows of K
    /// when K exceeds it (`None`: never segmented).
    pub fn new(k: usize, n: usize, sn: usize, sk: usize, segment: Option<usize>) -> NativeB {
        let padded = k.div_ceil(sk) * sk;
        let segment = match segment {
            Some(s) if k > s => {
                debug_assert!(s % sk == 0, "segment must be a multiple of the K tile");
                s
            }
            _ => padded.max(sk),
        };
        NativeB {
            k,
            n,
            sn,
            sk,
            segment,
        }
    }

    /// Total elements.
    pub fn len(&self) -> usize {
        native_b_len(self.k, self.n, self.sn, self.sk)
    }

    /// Whether the buffer is empty (never, for valid shapes).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Number of K segments.
    pub fn segments(&self) -> usize {
        self.k.div_ceil(self.segment)
    }

    /// Index of B(k, n).
    #[inline]
    pub fn index(&self, k: usize, n: usize) -> usize {
        let s = k / self.segment;
        let ks = (self.k - s * self.segment).min(self.segment);
        let k1 = ks.div_ceil(self.sk);
        let n_pad = self.n.div_ceil(self.sn) * self.sn;
        let kl = k % self.segment;
        s * n_pad * self.segment
            + ((n / self.sn) * k1 + kl / self.sk) * self.sn * self.sk
            + (n % self.sn) * self.sk
            + kl % self.sk
    }

    /// Calls `f(k0, n, range)` for every run of `sk` (or fewer, at the end of K) elements of one
    /// column that are contiguous in the native buffer: elements `B(k0.., n)` live at `range`.
    fn for_each_run(&self, mut f: impl FnMut(usize, usize, std::ops::Range<usize>)) {
        for n in 0..self.n {
            let mut k0 = 0;
            while k0 < self.k {
                let len = (self.sk - k0 % self.sk).min(self.k - k0);
                let start = self.index(k0, n);
                f(k0, n, start..start + len);
                k0 += len;
            }
        }
    }

    /// Writes B given transposed (`src` is [N, K] row-major) into native order. Padding in `dst`
    /// is zeroed.
    pub fn pack_from_nk<T: Copy + Default>(&self, src: &[T], dst: &mut [T]) {
        assert!(src.len() >= self.k * self.n && dst.len() >= self.len());
        dst[..self.len()].fill(T::default());
        self.for_each_run(|k0, n, r| {
            let len = r.len();
            dst[r].copy_from_slice(&src[n * self.k + k0..n * self.k + k0 + len]);
        });
    }

    /// Writes B given row-major (`src` is [K, N]) into native order. Padding is zeroed.
    pub fn pack_from_kn<T: Copy + Default>(&self, src: &[T], dst: &mut [T]) {
        assert!(src.len() >= self.k * self.n && dst.len() >= self.len());
        dst[..self.len()].fill(T::default());
        self.for_each_run(|k0, n, r| {
            for (i, d) in dst[r].iter_mut().enumerate() {
                *d = src[(k0 + i) * self.n + n];
            }
        });
    }

    /// Reads native B into [N, K] row-major (B transposed), the form a dot-product kernel wants.
    pub fn unpack_to_nk<T: Copy>(&self, src: &[T], dst: &mut [T]) {
        assert!(src.len() >= self.len() && dst.len() >= self.k * self.n);
        self.for_each_run(|k0, n, r| {
            let len = r.len();
            dst[n * self.k + k0..n * self.k + k0 + len].copy_from_slice(&src[r]);
        });
    }
}

/// Writes row-major A [M, K] into native A `[ceil(K/sk), M, sk]`, zeroing the K padding.
pub fn pack_a_native<T: Copy + Default>(src: &[T], m: usize, k: usize, sk: usize, dst: &mut [T]) {
    let len = native_a_len(m, k, sk);
    assert!(src.len() >= m * k && dst.len() >= len);
    for (kt, tile) in dst[..len].chunks_exact_mut(m * sk).enumerate() {
        let k0 = kt * sk;
        let w = sk.min(k - k0);
        for (row, cell) in tile.chunks_exact_mut(sk).enumerate() {
            cell[..w].copy_from_slice(&src[row * k + k0..row * k + k0 + w]);
            cell[w..].fill(T::default());
        }
    }
}

/// Reads native A into row-major [M, K].
pub fn unpack_a_native<T: Copy>(src: &[T], m: usize, k: usize, sk: usize, dst: &mut [T]) {
    let len = native_a_len(m, k, sk);
    assert!(src.len() >= len && dst.len() >= m * k);
    for (kt, tile) in src[..len].chunks_exact(m * sk).enumerate() {
        let k0 = kt * sk;
        let w = sk.min(k - k0);
        for (row, cell) in tile.chunks_exact(sk).enumerate() {
            dst[row * k + k0..row * k + k0 + w].copy_from_slice(&cell[..w]);
        }
    }
}

/// Writes row-major C [M, N] into native C `[ceil(N/sn), M, sn]`, zeroing the N padding.
pub fn pack_c_native<T: Copy + Default>(src: &[T], m: usize, n: usize, sn: usize, dst: &mut [T]) {
    // Native C has the same shape as native A with N in the role of K.
    pack_a_native(src, m, n, sn, dst)
}

/// Reads native C into row-major [M, N].
pub fn unpack_c_native<T: Copy>(src: &[T], m: usize, n: usize, sn: usize, dst: &mut [T]) {
    unpack_a_native(src, m, n, sn, dst)
}

/// Packs int4 values (one per `i8`, each in -8..=7) two per byte, even element in the low
/// nibble (fact sheet §7, \[hw\] for normal and native A). An odd count leaves the last high
/// nibble zero. Values outside -8..=7 are truncated to their low four bits.
pub fn pack_i4(values: &[i8], dst: &mut [u8]) {
    assert!(dst.len() >= values.len().div_ceil(2));
    for (d, pair) in dst.iter_mut().zip(values.chunks(2)) {
        let lo = pair[0] as u8 & 0x0f;
        let hi = pair.get(1).map_or(0, |&v| v as u8 & 0x0f);
        *d = lo | (hi << 4);
    }
}

/// Unpacks `dst.len()` int4 values (sign-extended to `i8`) from `src`.
pub fn unpack_i4(src: &[u8], dst: &mut [i8]) {
    assert!(src.len() >= dst.len().div_ceil(2));
    for (i, d) in dst.iter_mut().enumerate() {
        let byte = src[i / 2];
        let nib = if i % 2 == 0 { byte << 4 } else { byte & 0xf0 };
        *d = (nib as i8) >> 4;
    }
}

/// What `io_attr` reports for one matrix: dims (2-D normal, 3-D native A/C, 4-D native B),
/// element kind and size in bytes (int4 counts half a byte).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TensorDesc {
    /// "A", "B" or "C".
    pub name: &'static str,
    /// Dims; only the first `n_dims` are used.
    pub dims: [usize; 4],
    /// Number of dims.
    pub n_dims: usize,
    /// Element kind.
    pub kind: ElemKind,
    /// Layout.
    pub layout: Layout,
}

impl TensorDesc {
    /// Number of elements (product of the dims).
    pub fn elements(&self) -> usize {
        self.dims[..self.n_dims].iter().product()
    }

    /// Size in bytes.
    pub fn size_bytes(&self) -> usize {
        self.kind.bytes_for(self.elements())
    }
}

/// The descriptors of A, B and C for a configuration, exactly as `rknn_matmul_create` reports
/// them. `None` if the chip has no tiles for the type.
pub fn io_descs(platform: Platform, cfg: &MatmulConfig) -> Option<[TensorDesc; 3]> {
    let tiles = platform.tiles(cfg.t)?;
    Some(io_descs_with(tiles, cfg))
}

/// As [`io_descs`], with explicit tiles.
pub fn io_descs_with(tiles: Tiles, cfg: &MatmulConfig) -> [TensorDesc; 3] {
    let MatmulConfig { t, m, k, n, .. } = *cfg;
    let d = |name, dims: &[usize], kind, layout| {
        let mut all = [0; 4];
        all[..dims.len()].copy_from_slice(dims);
        TensorDesc {
            name,
            dims: all,
            n_dims: dims.len(),
            kind,
            layout,
        }
    };
    let a = match cfg.ac_layout {
        Layout::Native => d(
            "A",
            &[k.div_ceil(tiles.a_k), m, tiles.a_k],
            t.a,
            Layout::Native,
        ),
        _ => d("A", &[m, k], t.a, Layout::Norm),
    };
    let b = match cfg.b_layout {
        Layout::Native => d(
            "B",
            &[
                n.div_ceil(tiles.b_n),
                k.div_ceil(tiles.b_k),
                tiles.b_n,
                tiles.b_k,
            ],
            t.b,
            Layout::Native,
        ),
        Layout::TpNorm => d("B", &[n, k], t.b, Layout::TpNorm),
        Layout::Norm => d("B", &[k, n], t.b, Layout::Norm),
    };
    let c = match cfg.ac_layout {
        Layout::Native => d(
            "C",
            &[n.div_ceil(tiles.c_n), m, tiles.c_n],
            t.c,
            Layout::Native,
        ),
        _ => d("C", &[m, n], t.c, Layout::Norm),
    };
    [a, b, c]
}

/// The native-B geometry of a configuration on a chip (tiles and segment size).
pub fn native_b_geometry(platform: Platform, t: MatmulType, k: usize, n: usize) -> Option<NativeB> {
    let tiles = platform.tiles(t)?;
    Some(NativeB::new(
        k,
        n,
        tiles.b_n,
        tiles.b_k,
        platform.k_segment(),
    ))
}
