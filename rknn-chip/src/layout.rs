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
//!
//! Every length computed from dimensions is checked: the functions return `None` (or a
//! [`RuleViolation`]) instead of wrapping when a size does not fit in `usize`.

use crate::dtype::{ElemKind, Layout, MatmulType};
use crate::int4::Int4ConverterInput;
use crate::platform::{Platform, Tiles};
use crate::rules::{MatmulConfig, RuleViolation};

/// `d` rounded up to a whole number of tiles of `s`, or `None` for a zero tile or an overflow.
fn padded(d: usize, s: usize) -> Option<usize> {
    if s == 0 {
        return None;
    }
    d.div_ceil(s).checked_mul(s)
}

/// Elements of native A (with K padding); `None` if the length overflows `usize` or `sk` is 0.
pub fn native_a_len(m: usize, k: usize, sk: usize) -> Option<usize> {
    padded(k, sk)?.checked_mul(m)
}

/// Elements of native B (with K and N padding; segmentation does not change the total);
/// `None` if the length overflows `usize` or a tile is 0.
pub fn native_b_len(k: usize, n: usize, sn: usize, sk: usize) -> Option<usize> {
    padded(n, sn)?.checked_mul(padded(k, sk)?)
}

/// Elements of native C (with N padding); `None` if the length overflows `usize` or `sn` is 0.
pub fn native_c_len(m: usize, n: usize, sn: usize) -> Option<usize> {
    padded(n, sn)?.checked_mul(m)
}

/// `a * b` for a length check, `None` on overflow (then no slice can be that long).
fn product(a: usize, b: usize) -> Option<usize> {
    a.checked_mul(b)
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

/// The geometry of a native B buffer, segmentation included. Only [`NativeB::new`] makes one,
/// so its length always fits in `usize` and every index below it is computed without overflow.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
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
    len: usize,
}

impl NativeB {
    /// The geometry for `k` × `n` with tiles `sn` × `sk`, segmented at `segment` rows of K
    /// when K exceeds it (`None`: never segmented).
    ///
    /// `None` when a tile is 0, the segment is not a positive multiple of `sk` (the layout would
    /// not be defined), or the buffer's length does not fit in `usize`.
    pub fn new(
        k: usize,
        n: usize,
        sn: usize,
        sk: usize,
        segment: Option<usize>,
    ) -> Option<NativeB> {
        let len = native_b_len(k, n, sn, sk)?;
        let k_padded = padded(k, sk)?;
        let segment = match segment {
            Some(s) if k > s => {
                if s == 0 || s % sk != 0 {
                    return None;
                }
                s
            }
            _ => k_padded.max(sk),
        };
        Some(NativeB {
            k,
            n,
            sn,
            sk,
            segment,
            len,
        })
    }

    /// Total elements.
    pub fn len(&self) -> usize {
        self.len
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
        assert!(product(self.k, self.n).is_some_and(|l| src.len() >= l) && dst.len() >= self.len());
        dst[..self.len()].fill(T::default());
        self.for_each_run(|k0, n, r| {
            let len = r.len();
            dst[r].copy_from_slice(&src[n * self.k + k0..n * self.k + k0 + len]);
        });
    }

    /// Writes B given row-major (`src` is [K, N]) into native order. Padding is zeroed.
    pub fn pack_from_kn<T: Copy + Default>(&self, src: &[T], dst: &mut [T]) {
        assert!(product(self.k, self.n).is_some_and(|l| src.len() >= l) && dst.len() >= self.len());
        dst[..self.len()].fill(T::default());
        self.for_each_run(|k0, n, r| {
            for (i, d) in dst[r].iter_mut().enumerate() {
                *d = src[(k0 + i) * self.n + n];
            }
        });
    }

    /// Reads native B into [N, K] row-major (B transposed), the form a dot-product kernel wants.
    pub fn unpack_to_nk<T: Copy>(&self, src: &[T], dst: &mut [T]) {
        assert!(src.len() >= self.len() && product(self.k, self.n).is_some_and(|l| dst.len() >= l));
        self.for_each_run(|k0, n, r| {
            let len = r.len();
            dst[n * self.k + k0..n * self.k + k0 + len].copy_from_slice(&src[r]);
        });
    }
}

/// Writes row-major A [M, K] into native A `[ceil(K/sk), M, sk]`, zeroing the K padding.
///
/// # Panics
/// If `src` or `dst` is shorter than the shape needs, or `sk` is 0.
pub fn pack_a_native<T: Copy + Default>(src: &[T], m: usize, k: usize, sk: usize, dst: &mut [T]) {
    let len = native_a_len(m, k, sk).expect("native A length overflows or sk is 0");
    assert!(product(m, k).is_some_and(|l| src.len() >= l) && dst.len() >= len);
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
///
/// # Panics
/// If `src` or `dst` is shorter than the shape needs, or `sk` is 0.
pub fn unpack_a_native<T: Copy>(src: &[T], m: usize, k: usize, sk: usize, dst: &mut [T]) {
    let len = native_a_len(m, k, sk).expect("native A length overflows or sk is 0");
    assert!(src.len() >= len && product(m, k).is_some_and(|l| dst.len() >= l));
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
/// element kind and size in bytes (int4 counts half a byte). Made by [`io_descs`], which checks
/// that the element count and the byte size fit (the size in a `uint32_t`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
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
    elements: usize,
    bytes: usize,
}

impl TensorDesc {
    /// Number of elements (product of the dims).
    pub fn elements(&self) -> usize {
        self.elements
    }

    /// Size in bytes (at most `u32::MAX`).
    pub fn size_bytes(&self) -> usize {
        self.bytes
    }
}

/// The descriptors of A, B and C for a configuration, exactly as `rknn_matmul_create` reports
/// them.
///
/// Errors: [`RuleViolation::UnsupportedType`] if the chip has no tiles for the type,
/// [`RuleViolation::SizeOverflow`] if a size does not fit in `usize`, and
/// [`RuleViolation::TooManyBytes`] if a matrix needs more bytes than the `uint32_t size` of a
/// tensor attribute holds.
pub fn io_descs(platform: Platform, cfg: &MatmulConfig) -> Result<[TensorDesc; 3], RuleViolation> {
    let tiles = platform
        .tiles(cfg.t)
        .ok_or(RuleViolation::UnsupportedType { platform, t: cfg.t })?;
    io_descs_with(tiles, cfg)
}

/// As [`io_descs`], with explicit tiles (which must not be 0).
pub fn io_descs_with(tiles: Tiles, cfg: &MatmulConfig) -> Result<[TensorDesc; 3], RuleViolation> {
    let MatmulConfig { t, m, k, n, .. } = *cfg;
    let overflow = |matrix| RuleViolation::SizeOverflow { matrix, m, k, n };
    let tile_dims = [tiles.a_k, tiles.b_n, tiles.b_k, tiles.c_n];
    if tile_dims.contains(&0) {
        // A zero tile has no layout; the size of the first matrix that uses it is undefined.
        return Err(overflow("A"));
    }
    let d = |name, dims: &[usize], kind: ElemKind, layout| {
        let mut all = [0; 4];
        all[..dims.len()].copy_from_slice(dims);
        let elements = dims
            .iter()
            .try_fold(1usize, |acc, &d| acc.checked_mul(d))
            .ok_or(overflow(name))?;
        let bytes = kind.bytes_for(elements).ok_or(overflow(name))?;
        Ok(TensorDesc {
            name,
            dims: all,
            n_dims: dims.len(),
            kind,
            layout,
            elements,
            bytes,
        })
    };
    let a = match cfg.ac_layout {
        Layout::Native => d(
            "A",
            &[k.div_ceil(tiles.a_k), m, tiles.a_k],
            t.a,
            Layout::Native,
        )?,
        _ => d("A", &[m, k], t.a, Layout::Norm)?,
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
        )?,
        Layout::TpNorm => d("B", &[n, k], t.b, Layout::TpNorm)?,
        Layout::Norm => d("B", &[k, n], t.b, Layout::Norm)?,
    };
    let c = match cfg.ac_layout {
        Layout::Native => d(
            "C",
            &[n.div_ceil(tiles.c_n), m, tiles.c_n],
            t.c,
            Layout::Native,
        )?,
        _ => d("C", &[m, n], t.c, Layout::Norm)?,
    };
    // After every size is known, so that an overflow anywhere is reported as such first.
    for desc in [&a, &b, &c] {
        if u32::try_from(desc.bytes).is_err() {
            return Err(RuleViolation::TooManyBytes {
                matrix: desc.name,
                bytes: desc.bytes,
                max: u32::MAX as usize,
            });
        }
    }
    Ok([a, b, c])
}

/// The native-B geometry of a configuration on a chip (tiles and segment size). `None` if the
/// chip has no tiles for the type or the length overflows `usize`.
pub fn native_b_geometry(platform: Platform, t: MatmulType, k: usize, n: usize) -> Option<NativeB> {
    let tiles = platform.tiles(t)?;
    NativeB::new(k, n, tiles.b_n, tiles.b_k, platform.k_segment())
}

/// Bytes `rknn_B_normal_layout_to_native_layout` reads for a row-major [K, N] B of `kind`:
/// two bytes per f16/bf16 element, one per i8, and for int4 what `int4` says (\[open\], see
/// [`Int4ConverterInput`]). `None` if the size overflows `usize`.
pub fn converter_input_len(
    kind: ElemKind,
    k: usize,
    n: usize,
    int4: Int4ConverterInput,
) -> Option<usize> {
    let count = k.checked_mul(n)?;
    match (kind, int4) {
        (ElemKind::I4, Int4ConverterInput::Packed) => ElemKind::I4.bytes_for(count),
        (ElemKind::I4, Int4ConverterInput::OnePerByte) => Some(count),
        _ => kind.bytes_for(count),
    }
}
