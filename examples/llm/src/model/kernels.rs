//! The dot product every float reduction of the model is built on, with SIMD variants that
//! compute bit-for-bit the same result as the scalar reference.
//!
//! # The canonical order
//!
//! For `a, b` of length `k`, with `k32 = k - k % 32`:
//!
//! 1. 32 accumulators, `acc[j] = fma(a[i], b[i], acc[j])` for every `i < k32` with
//!    `i % 32 == j`, in increasing `i` (each a fused multiply-add, rounded once);
//! 2. a fixed tree: for `s` in 16, 8, 4, 2, 1: `acc[j] += acc[j + s]` for `j < s`;
//! 3. the tail: `t = fma(a[i], b[i], t)` for `i` in `k32..k`, from `t = 0`;
//! 4. the result is `acc[0] + t`.
//!
//! The order depends only on `k`: never on how many rows a matmul has, which thread computes
//! it, or which backend runs. That is what makes the model's logits batch- and
//! thread-invariant. AVX2 holds the 32 accumulators in four 8-lane registers, NEON in eight
//! 4-lane ones, and both reduce them along the same tree.
//!
//! The backend is chosen once, as every host kernel of the SDK is ([`rknn_matmul::rknn_chip::kernel`]):
//! the fastest this CPU runs, unless `RKNN_KERNEL_LLM` (or `RKNN_KERNEL` for every component)
//! names another. [`kernel_choice`] says what was chosen and why.

use std::sync::OnceLock;

use rknn_matmul::rknn_chip::KernelChoice;

use half::f16;
use half::slice::HalfFloatSliceExt;

/// One implementation of [`dot`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kernel {
    /// Plain Rust with `f32::mul_add`; the reference.
    Scalar,
    /// x86-64 AVX2 + FMA.
    #[cfg(target_arch = "x86_64")]
    Avx2,
    /// aarch64 NEON (always present there).
    #[cfg(target_arch = "aarch64")]
    Neon,
}

impl Kernel {
    /// The backend's name as `RKNN_KERNEL_LLM` spells it.
    pub fn name(self) -> &'static str {
        match self {
            Kernel::Scalar => "scalar",
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx2 => "avx2",
            #[cfg(target_arch = "aarch64")]
            Kernel::Neon => "neon",
        }
    }

    /// Whether this CPU can run the backend.
    pub fn is_available(self) -> bool {
        match self {
            Kernel::Scalar => true,
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx2 => {
                std::arch::is_x86_feature_detected!("avx2")
                    && std::arch::is_x86_feature_detected!("fma")
            }
            #[cfg(target_arch = "aarch64")]
            Kernel::Neon => true,
        }
    }

    /// Every backend compiled for this architecture, fastest first.
    pub fn all() -> &'static [Kernel] {
        &[
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx2,
            #[cfg(target_arch = "aarch64")]
            Kernel::Neon,
            Kernel::Scalar,
        ]
    }

    /// `a · b` in the canonical order on this backend.
    ///
    /// # Panics
    /// If the lengths differ or the backend is not available (see [`Kernel::is_available`]).
    pub fn dot(self, a: &[f32], b: &[f32]) -> f32 {
        assert_eq!(a.len(), b.len(), "dot of unequal lengths");
        match self {
            Kernel::Scalar => dot_scalar(a, b),
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx2 => {
                assert!(self.is_available(), "AVX2/FMA not available");
                // SAFETY: the CPU supports AVX2 and FMA (checked just above); the lengths are
                // equal (asserted), which is all the kernel's pointer arithmetic relies on.
                unsafe { x86::dot_avx2(a, b) }
            }
            #[cfg(target_arch = "aarch64")]
            Kernel::Neon => {
                // SAFETY: NEON is part of the aarch64 baseline; the lengths are equal.
                unsafe { neon::dot_neon(a, b) }
            }
        }
    }
}

impl Kernel {
    /// `out[t] = a · rows[t * stride..t * stride + a.len()]` for every `t`, each in the
    /// canonical order (bit-identical to [`Kernel::dot`]), in one call: attention's scores of
    /// one query head against every cached key, without a dispatch per key.
    ///
    /// # Panics
    /// If `rows` is too short for `out.len()` rows at `stride`, or the backend is not available.
    pub fn dot_rows(self, a: &[f32], rows: &[f32], stride: usize, out: &mut [f32]) {
        check_rows(a.len(), rows.len(), stride, out.len());
        match self {
            Kernel::Scalar => {
                for (t, o) in out.iter_mut().enumerate() {
                    *o = dot_scalar(a, &rows[t * stride..t * stride + a.len()]);
                }
            }
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx2 => {
                assert!(self.is_available(), "AVX2/FMA not available");
                // SAFETY: the CPU supports AVX2 and FMA (checked just above); `check_rows`
                // proved every row `t < out.len()` lies inside `rows`.
                unsafe { x86::dot_rows_avx2(a, rows, stride, out) }
            }
            #[cfg(target_arch = "aarch64")]
            Kernel::Neon => {
                for (t, o) in out.iter_mut().enumerate() {
                    // SAFETY: NEON is baseline; the row has `a.len()` elements.
                    *o = unsafe { neon::dot_neon(a, &rows[t * stride..t * stride + a.len()]) };
                }
            }
        }
    }

    /// `out[j] += p[t] * rows[t * stride + j]` for `t` in increasing order, each product
    /// rounded and then added (no fused multiply-add): attention's weighted sum of the cached
    /// values. Every backend gives the same bits.
    ///
    /// # Panics
    /// If `rows` is too short for `p.len()` rows at `stride`, or the backend is not available.
    pub fn add_scaled_rows(self, p: &[f32], rows: &[f32], stride: usize, out: &mut [f32]) {
        check_rows(out.len(), rows.len(), stride, p.len());
        match self {
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx2 => {
                assert!(self.is_available(), "AVX2/FMA not available");
                // SAFETY: the CPU supports AVX2 (checked just above); the body is safe Rust
                // that the compiler vectorises for it.
                unsafe { x86::add_scaled_rows_avx2(p, rows, stride, out) }
            }
            _ => add_scaled_rows(p, rows, stride, out),
        }
    }
}

impl Kernel {
    /// [`Kernel::dot_rows`] over rows stored as f16 (an f16 KV cache): each row is taken exactly
    /// as f32 (every f16 is one), so the result is `dot_rows` of the converted rows, bit for bit,
    /// on every backend. AVX2 converts in registers (F16C) as it loads; the others convert one
    /// row at a time into a buffer.
    ///
    /// # Panics
    /// As [`Kernel::dot_rows`].
    pub fn dot_rows_f16(self, a: &[f32], rows: &[f16], stride: usize, out: &mut [f32]) {
        check_rows(a.len(), rows.len(), stride, out.len());
        #[cfg(target_arch = "x86_64")]
        if self == Kernel::Avx2 && has_f16c() {
            assert!(self.is_available(), "AVX2/FMA not available");
            // SAFETY: AVX2 and FMA (checked just above) and F16C (`has_f16c`) are available;
            // `check_rows` proved every row `t < out.len()` lies inside `rows`.
            unsafe { x86::dot_rows_f16_avx2(a, rows, stride, out) };
            return;
        }
        let mut row = vec![0.0f32; a.len()];
        for (t, o) in out.iter_mut().enumerate() {
            rows[t * stride..t * stride + a.len()].convert_to_f32_slice(&mut row);
            *o = self.dot(a, &row);
        }
    }

    /// [`Kernel::add_scaled_rows`] over rows stored as f16: the same products and additions in
    /// the same order as on the converted rows, bit for bit, on every backend.
    ///
    /// # Panics
    /// As [`Kernel::add_scaled_rows`].
    pub fn add_scaled_rows_f16(self, p: &[f32], rows: &[f16], stride: usize, out: &mut [f32]) {
        check_rows(out.len(), rows.len(), stride, p.len());
        #[cfg(target_arch = "x86_64")]
        if self == Kernel::Avx2 && has_f16c() {
            assert!(self.is_available(), "AVX2/FMA not available");
            // SAFETY: AVX2 (checked just above) and F16C (`has_f16c`) are available;
            // `check_rows` proved every row `t < p.len()` lies inside `rows`.
            unsafe { x86::add_scaled_rows_f16_avx2(p, rows, stride, out) };
            return;
        }
        // Blocks of rows converted at a time, in increasing `t`: every element of `out` sees
        // the same additions in the same order as in one pass.
        const BLOCK: usize = 64;
        let w = out.len();
        if w == 0 {
            return;
        }
        let mut block = vec![0.0f32; BLOCK.min(p.len()) * w];
        for (b, ps) in p.chunks(BLOCK).enumerate() {
            for (i, dst) in block.chunks_exact_mut(w).take(ps.len()).enumerate() {
                let t = b * BLOCK + i;
                rows[t * stride..t * stride + w].convert_to_f32_slice(dst);
            }
            self.add_scaled_rows(ps, &block[..ps.len() * w], w, out);
        }
    }
}

impl Kernel {
    /// `gate[j] = gate[j] / (1 + e^-gate[j]) * up[j]` (SwiGLU's `silu(gate) * up`, with the
    /// model's own `exp`: Cody–Waite reduction and a degree-7 polynomial). The same IEEE
    /// operations on every backend, so the same bits; AVX2 runs the portable loop eight lanes
    /// at a time instead of the x86-64 baseline's four (aarch64's NEON baseline vectorises it
    /// already).
    ///
    /// # Panics
    /// If the lengths differ or the backend is not available.
    pub fn swiglu(self, gate: &mut [f32], up: &[f32]) {
        assert_eq!(gate.len(), up.len(), "swiglu of unequal lengths");
        match self {
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx2 => {
                assert!(self.is_available(), "AVX2/FMA not available");
                // SAFETY: the CPU supports AVX2 (checked just above); the body is safe Rust
                // that the compiler vectorises for it.
                unsafe { x86::swiglu_avx2(gate, up) }
            }
            _ => swiglu(gate, up),
        }
    }

    /// Attention's softmax of one head's scores, in place: each score times `scale`, then
    /// `e^(s - max)` with the model's own `exp`, the sum of those in f64 in position order,
    /// and each divided by it (times the f32 inverse). The same operations in the same order
    /// on every backend, so the same bits; AVX2 runs the element-wise loops eight lanes wide.
    ///
    /// # Panics
    /// If the backend is not available.
    pub fn softmax_scaled(self, scores: &mut [f32], scale: f32) {
        match self {
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx2 => {
                assert!(self.is_available(), "AVX2/FMA not available");
                // SAFETY: the CPU supports AVX2 (checked just above); the body is safe Rust
                // that the compiler vectorises for it.
                unsafe { x86::softmax_scaled_avx2(scores, scale) }
            }
            _ => softmax_scaled(scores, scale),
        }
    }
}

#[inline(always)]
fn softmax_scaled(scores: &mut [f32], scale: f32) {
    // Separate loops: the element-wise ones vectorise, the maximum and the in-order f64 sum
    // stay sequential (their order is part of the result).
    for s in scores.iter_mut() {
        *s *= scale;
    }
    let max = scores.iter().fold(f32::NEG_INFINITY, |m, &s| m.max(s));
    for s in scores.iter_mut() {
        *s = super::exp::exp(*s - max);
    }
    let sum: f64 = scores.iter().map(|&s| f64::from(s)).sum();
    let inv = (1.0 / sum) as f32;
    for s in scores.iter_mut() {
        *s *= inv;
    }
}

#[inline(always)]
fn swiglu(gate: &mut [f32], up: &[f32]) {
    for (g, &u) in gate.iter_mut().zip(up) {
        *g = *g / (1.0 + super::exp::exp(-*g)) * u;
    }
}

/// Whether the CPU converts f16 in hardware (F16C; every AVX2 CPU in practice, checked anyway).
#[cfg(target_arch = "x86_64")]
fn has_f16c() -> bool {
    std::arch::is_x86_feature_detected!("f16c")
}

/// Panics unless `count` rows of `width` at `stride` fit in `len` elements.
fn check_rows(width: usize, len: usize, stride: usize, count: usize) {
    let need = count
        .checked_sub(1)
        .map_or(Some(0), |last| last.checked_mul(stride)?.checked_add(width))
        .expect("row span overflows usize");
    assert!(
        need <= len,
        "{count} rows of {width} at stride {stride} need {need} elements, got {len}"
    );
}

/// Columns of `out` kept in registers across the rows of [`add_scaled_rows`] (a head of 64).
const SCALED_ROWS_BLOCK: usize = 64;

#[inline(always)]
fn add_scaled_rows(p: &[f32], rows: &[f32], stride: usize, out: &mut [f32]) {
    // Column blocks accumulate in a local array (registers) over every row, instead of a load
    // and a store of `out` per row; each element still sees the same products in row order.
    const B: usize = SCALED_ROWS_BLOCK;
    let w = out.len();
    let whole = w - w % B;
    for (j0, o) in out[..whole].chunks_exact_mut(B).enumerate() {
        let j0 = j0 * B;
        let mut acc: [f32; B] = (&*o).try_into().expect("a whole block");
        for (t, &pt) in p.iter().enumerate() {
            let r: &[f32; B] = rows[t * stride + j0..t * stride + j0 + B]
                .try_into()
                .expect("a whole block");
            for (a, &v) in acc.iter_mut().zip(r) {
                *a += pt * v;
            }
        }
        o.copy_from_slice(&acc);
    }
    for (t, &pt) in p.iter().enumerate() {
        for (o, &v) in out[whole..]
            .iter_mut()
            .zip(&rows[t * stride + whole..t * stride + w])
        {
            *o += pt * v;
        }
    }
}

/// The component name of these kernels in the kernel convention.
pub const KERNEL_COMPONENT: &str = "llm";

/// The backend [`dot`] uses, and why ([`rknn_matmul::rknn_chip::kernel`]), chosen once.
pub fn kernel_choice() -> &'static KernelChoice {
    static CHOICE: OnceLock<KernelChoice> = OnceLock::new();
    CHOICE.get_or_init(|| {
        // `all` is fastest first; the convention lists the reference first.
        let compiled: Vec<&'static str> = Kernel::all().iter().rev().map(|k| k.name()).collect();
        let available: Vec<&'static str> = Kernel::all()
            .iter()
            .rev()
            .filter(|k| k.is_available())
            .map(|k| k.name())
            .collect();
        let choice = KernelChoice::from_env(KERNEL_COMPONENT, &compiled, &available);
        choice.warn();
        choice
    })
}

/// The backend [`dot`] uses ([`kernel_choice`]).
pub fn selected() -> Kernel {
    static SELECTED: OnceLock<Kernel> = OnceLock::new();
    *SELECTED.get_or_init(|| {
        let name = kernel_choice().selected;
        Kernel::all()
            .iter()
            .copied()
            .find(|k| k.name() == name)
            .unwrap_or(Kernel::Scalar)
    })
}

/// `a · b` in the canonical order (see the module documentation), on the selected backend.
///
/// # Panics
/// If the lengths differ.
#[inline]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    selected().dot(a, b)
}

/// The reference implementation of the canonical order.
fn dot_scalar(a: &[f32], b: &[f32]) -> f32 {
    let k32 = a.len() - a.len() % 32;
    let mut acc = [0.0f32; 32];
    for (ca, cb) in a[..k32].chunks_exact(32).zip(b[..k32].chunks_exact(32)) {
        for j in 0..32 {
            acc[j] = ca[j].mul_add(cb[j], acc[j]);
        }
    }
    let mut s = 16;
    while s > 0 {
        for j in 0..s {
            acc[j] += acc[j + s];
        }
        s /= 2;
    }
    acc[0] + tail(&a[k32..], &b[k32..])
}

#[inline]
fn tail(a: &[f32], b: &[f32]) -> f32 {
    let mut t = 0.0f32;
    for (x, y) in a.iter().zip(b) {
        t = x.mul_add(*y, t);
    }
    t
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    // The body is one `unsafe` block: at the MSRV (1.85) the value-only intrinsics are
    // `unsafe fn`s too, while newer compilers consider them safe inside `#[target_feature]`
    // functions. The block also holds the raw-pointer loads, so it is never unused.
    use std::arch::x86_64::*;

    /// # Safety
    /// The CPU must support AVX2 and FMA, and every row `t < out.len()`
    /// (`rows[t * stride..t * stride + a.len()]`) must lie inside `rows`.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn dot_rows_avx2(a: &[f32], rows: &[f32], stride: usize, out: &mut [f32]) {
        for (t, o) in out.iter_mut().enumerate() {
            // SAFETY: the features are the caller's contract, as is the row's extent.
            *o = unsafe { dot_avx2(a, rows.get_unchecked(t * stride..t * stride + a.len())) };
        }
    }

    /// # Safety
    /// The CPU must support AVX2 (the loop is the portable one, vectorised for it).
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn add_scaled_rows_avx2(
        p: &[f32],
        rows: &[f32],
        stride: usize,
        out: &mut [f32],
    ) {
        super::add_scaled_rows(p, rows, stride, out);
    }

    /// # Safety
    /// The CPU must support AVX2 (the loops are the portable ones, vectorised for it).
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn softmax_scaled_avx2(scores: &mut [f32], scale: f32) {
        super::softmax_scaled(scores, scale);
    }

    /// # Safety
    /// The CPU must support AVX2 (the loop is the portable one, vectorised for it).
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn swiglu_avx2(gate: &mut [f32], up: &[f32]) {
        super::swiglu(gate, up);
    }

    /// # Safety
    /// The CPU must support AVX2 and FMA, and `a.len() == b.len()`.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn dot_avx2(a: &[f32], b: &[f32]) -> f32 {
        let k32 = a.len() - a.len() % 32;
        let (pa, pb) = (a.as_ptr(), b.as_ptr());
        // SAFETY: AVX2 and FMA are available (the caller's contract); every load reads 8
        // floats at i + 8q + 8 <= k32 <= the length of both slices.
        let head = unsafe {
            let mut r = [_mm256_setzero_ps(); 4];
            let mut i = 0;
            while i < k32 {
                for (q, reg) in r.iter_mut().enumerate() {
                    let x = _mm256_loadu_ps(pa.add(i + 8 * q));
                    let y = _mm256_loadu_ps(pb.add(i + 8 * q));
                    *reg = _mm256_fmadd_ps(x, y, *reg);
                }
                i += 32;
            }
            // Lane j of the canonical order is lane j % 8 of register j / 8.
            let r0 = _mm256_add_ps(r[0], r[2]); // s = 16
            let r1 = _mm256_add_ps(r[1], r[3]);
            let v = _mm256_add_ps(r0, r1); // s = 8
            let v4 = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1)); // s = 4
            let v2 = _mm_add_ps(v4, _mm_movehl_ps(v4, v4)); // s = 2
            let v1 = _mm_add_ss(v2, _mm_shuffle_ps(v2, v2, 1)); // s = 1
            _mm_cvtss_f32(v1)
        };
        head + super::tail(&a[k32..], &b[k32..])
    }
    /// # Safety
    /// The CPU must support AVX2, FMA and F16C, and every row `t < out.len()`
    /// (`rows[t * stride..t * stride + a.len()]`) must lie inside `rows`.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn dot_rows_f16_avx2(
        a: &[f32],
        rows: &[half::f16],
        stride: usize,
        out: &mut [f32],
    ) {
        for (t, o) in out.iter_mut().enumerate() {
            // SAFETY: the features are the caller's contract, as is the row's extent.
            *o = unsafe { dot_f16_avx2(a, rows.get_unchecked(t * stride..t * stride + a.len())) };
        }
    }

    /// [`dot_avx2`] with `b` in f16, converted exactly as it is loaded: the same operations in
    /// the same order on the same values.
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA and F16C, and `a.len() == b.len()`.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn dot_f16_avx2(a: &[f32], b: &[half::f16]) -> f32 {
        let k32 = a.len() - a.len() % 32;
        let (pa, pb) = (a.as_ptr(), b.as_ptr());
        // SAFETY: AVX2, FMA and F16C are available (the caller's contract); every load reads 8
        // elements at i + 8q + 8 <= k32 <= the length of both slices (f16 is 2 bytes).
        let head = unsafe {
            let mut r = [_mm256_setzero_ps(); 4];
            let mut i = 0;
            while i < k32 {
                for (q, reg) in r.iter_mut().enumerate() {
                    let x = _mm256_loadu_ps(pa.add(i + 8 * q));
                    let y = _mm256_cvtph_ps(_mm_loadu_si128(pb.add(i + 8 * q).cast()));
                    *reg = _mm256_fmadd_ps(x, y, *reg);
                }
                i += 32;
            }
            let r0 = _mm256_add_ps(r[0], r[2]);
            let r1 = _mm256_add_ps(r[1], r[3]);
            let v = _mm256_add_ps(r0, r1);
            let v4 = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
            let v2 = _mm_add_ps(v4, _mm_movehl_ps(v4, v4));
            let v1 = _mm_add_ss(v2, _mm_shuffle_ps(v2, v2, 1));
            _mm_cvtss_f32(v1)
        };
        let mut tail = [0.0f32; 32];
        let tail = &mut tail[..a.len() - k32];
        for (t, h) in tail.iter_mut().zip(&b[k32..]) {
            *t = h.to_f32();
        }
        head + super::tail(&a[k32..], tail)
    }

    /// `out[j] += p[t] * f32(rows[t * stride + j])`, rows in increasing `t`, each product
    /// rounded and then added, as [`super::add_scaled_rows`] on the converted rows.
    ///
    /// # Safety
    /// The CPU must support AVX2 and F16C, and every row `t < p.len()`
    /// (`rows[t * stride..t * stride + out.len()]`) must lie inside `rows`.
    #[target_feature(enable = "avx2,f16c")]
    pub(super) unsafe fn add_scaled_rows_f16_avx2(
        p: &[f32],
        rows: &[half::f16],
        stride: usize,
        out: &mut [f32],
    ) {
        const B: usize = super::SCALED_ROWS_BLOCK;
        let w = out.len();
        let whole = w - w % B;
        // SAFETY: AVX2 and F16C are available (the caller's contract); the loads of row `t`
        // read `rows[t * stride + j0..t * stride + j0 + B]` with `j0 + B <= whole <= w`, inside
        // the row; `out`'s block `j0..j0 + B` is inside `out`.
        unsafe {
            for j0 in (0..whole).step_by(B) {
                let o = out.as_mut_ptr().add(j0);
                let mut acc = [_mm256_setzero_ps(); B / 8];
                for (q, a) in acc.iter_mut().enumerate() {
                    *a = _mm256_loadu_ps(o.add(8 * q));
                }
                for (t, &pt) in p.iter().enumerate() {
                    let pv = _mm256_set1_ps(pt);
                    let r = rows.as_ptr().add(t * stride + j0);
                    for (q, a) in acc.iter_mut().enumerate() {
                        let v = _mm256_cvtph_ps(_mm_loadu_si128(r.add(8 * q).cast()));
                        *a = _mm256_add_ps(*a, _mm256_mul_ps(pv, v));
                    }
                }
                for (q, a) in acc.iter().enumerate() {
                    _mm256_storeu_ps(o.add(8 * q), *a);
                }
            }
        }
        for (t, &pt) in p.iter().enumerate() {
            for (o, h) in out[whole..]
                .iter_mut()
                .zip(&rows[t * stride + whole..t * stride + w])
            {
                *o += pt * h.to_f32();
            }
        }
    }
}

#[cfg(target_arch = "aarch64")]
mod neon {
    use std::arch::aarch64::*;

    /// # Safety
    /// `a.len() == b.len()`.
    #[inline]
    pub(super) unsafe fn dot_neon(a: &[f32], b: &[f32]) -> f32 {
        let k32 = a.len() - a.len() % 32;
        let (pa, pb) = (a.as_ptr(), b.as_ptr());
        // SAFETY: NEON is baseline on aarch64; every load reads 4 floats at i + 4q + 4 <= k32.
        unsafe {
            let mut r = [vdupq_n_f32(0.0); 8];
            let mut i = 0;
            while i < k32 {
                for (q, reg) in r.iter_mut().enumerate() {
                    let x = vld1q_f32(pa.add(i + 4 * q));
                    let y = vld1q_f32(pb.add(i + 4 * q));
                    *reg = vfmaq_f32(*reg, x, y);
                }
                i += 32;
            }
            // Lane j of the canonical order is lane j % 4 of register j / 4.
            let s16 = [
                vaddq_f32(r[0], r[4]),
                vaddq_f32(r[1], r[5]),
                vaddq_f32(r[2], r[6]),
                vaddq_f32(r[3], r[7]),
            ];
            let s8 = [vaddq_f32(s16[0], s16[2]), vaddq_f32(s16[1], s16[3])];
            let s4 = vaddq_f32(s8[0], s8[1]);
            let s2 = vadd_f32(vget_low_f32(s4), vget_high_f32(s4));
            let s1 = vget_lane_f32(s2, 0) + vget_lane_f32(s2, 1);
            s1 + super::tail(&a[k32..], &b[k32..])
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn random(rng: &mut fastrand::Rng, n: usize) -> Vec<f32> {
        (0..n).map(|_| rng.f32() * 2.0 - 1.0).collect()
    }

    #[test]
    fn every_backend_equals_the_scalar_reference_bit_for_bit() {
        let mut rng = fastrand::Rng::with_seed(1);
        for k in [0, 1, 7, 31, 32, 33, 64, 95, 576, 1536, 2049] {
            for _ in 0..20 {
                let (a, b) = (random(&mut rng, k), random(&mut rng, k));
                let want = Kernel::Scalar.dot(&a, &b);
                for &kern in Kernel::all() {
                    if kern.is_available() {
                        let got = kern.dot(&a, &b);
                        assert_eq!(got.to_bits(), want.to_bits(), "{} k={k}", kern.name());
                    }
                }
            }
        }
    }

    #[test]
    fn softmax_gives_the_scalar_bits_on_every_backend_and_is_a_softmax() {
        let mut rng = fastrand::Rng::with_seed(8);
        for n in [1, 2, 7, 8, 9, 32, 33, 100, 1500] {
            let mut scores: Vec<f32> = (0..n).map(|_| (rng.f32() - 0.5) * 40.0).collect();
            if n > 3 {
                scores[1] = f32::NEG_INFINITY; // a masked position
                scores[2] = -0.0;
            }
            let scale = 0.125;
            let mut want = scores.clone();
            Kernel::Scalar.softmax_scaled(&mut want, scale);
            // Against softmax in f64.
            let max = scores
                .iter()
                .map(|&s| f64::from(s * scale))
                .fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = scores
                .iter()
                .map(|&s| (f64::from(s * scale) - max).exp())
                .collect();
            let total: f64 = e.iter().sum();
            for (i, (&w, &ei)) in want.iter().zip(&e).enumerate() {
                let p = ei / total;
                assert!(
                    (f64::from(w) - p).abs() <= 1e-6 * p + 1e-30,
                    "n={n} [{i}]: {w} vs {p}"
                );
            }
            for &kern in Kernel::all() {
                if kern.is_available() {
                    let mut got = scores.clone();
                    kern.softmax_scaled(&mut got, scale);
                    let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                    assert_eq!(bits(&got), bits(&want), "{} n={n}", kern.name());
                }
            }
        }
    }

    #[test]
    fn swiglu_gives_the_scalar_bits_on_every_backend() {
        let mut rng = fastrand::Rng::with_seed(6);
        let exact =
            |g: f32, u: f32| (f64::from(g) / (1.0 + (-f64::from(g)).exp()) * f64::from(u)) as f32;
        for n in [0, 1, 7, 8, 9, 31, 1536, 1537] {
            // Values across the clamp of `exp` and its special cases, and a typical spread.
            let mut gate: Vec<f32> = (0..n).map(|_| (rng.f32() - 0.5) * 24.0).collect();
            for (slot, v) in gate.iter_mut().zip([
                0.0,
                -0.0,
                100.0,
                -100.0,
                f32::INFINITY,
                f32::NEG_INFINITY,
                f32::NAN,
            ]) {
                *slot = v;
            }
            let up = random(&mut rng, n);
            let mut want = gate.clone();
            Kernel::Scalar.swiglu(&mut want, &up);
            for (i, (&w, (&g, &u))) in want.iter().zip(gate.iter().zip(&up)).enumerate() {
                // The reference itself against silu · up in f64 (where that is finite).
                let e = exact(g, u);
                if e.is_finite() && g.abs() < 80.0 {
                    assert!(
                        (w - e).abs() <= 1e-6 * e.abs().max(1e-30) + 1e-37,
                        "n={n} [{i}] g={g}: {w} vs {e}"
                    );
                }
            }
            for &kern in Kernel::all() {
                if kern.is_available() {
                    let mut got = gate.clone();
                    kern.swiglu(&mut got, &up);
                    let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                    assert_eq!(bits(&got), bits(&want), "{} n={n}", kern.name());
                }
            }
        }
    }

    #[test]
    fn f16_row_kernels_equal_the_f32_ones_on_the_converted_rows_on_every_backend() {
        let mut rng = fastrand::Rng::with_seed(4);
        for (k, stride, n) in [
            (64, 64, 150),
            (64, 192, 37),
            (33, 40, 70),
            (150, 160, 7),
            (0, 3, 4),
        ] {
            let a = random(&mut rng, k);
            let rows: Vec<f16> = random(&mut rng, n.max(1) * stride)
                .iter()
                .map(|&x| f16::from_f32(x * 3.0))
                .collect();
            let converted: Vec<f32> = rows.iter().map(|h| h.to_f32()).collect();
            let p = random(&mut rng, n);
            let mut want_dots = vec![0.0; n];
            Kernel::Scalar.dot_rows(&a, &converted, stride, &mut want_dots);
            let start = random(&mut rng, k);
            let mut want_sum = start.clone();
            Kernel::Scalar.add_scaled_rows(&p, &converted, stride, &mut want_sum);
            let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
            for &kern in Kernel::all() {
                if !kern.is_available() {
                    continue;
                }
                let mut dots = vec![0.0; n];
                kern.dot_rows_f16(&a, &rows, stride, &mut dots);
                assert_eq!(bits(&dots), bits(&want_dots), "{} dot k={k}", kern.name());
                let mut sum = start.clone();
                kern.add_scaled_rows_f16(&p, &rows, stride, &mut sum);
                assert_eq!(bits(&sum), bits(&want_sum), "{} sum k={k}", kern.name());
            }
        }
    }

    #[test]
    fn row_kernels_equal_their_one_row_definitions_on_every_backend() {
        let mut rng = fastrand::Rng::with_seed(3);
        for (k, stride, n) in [
            (64, 192, 37),
            (64, 64, 1),
            (33, 40, 5),
            (128, 128, 9),
            (150, 160, 7),
            (0, 3, 4),
            (64, 192, 0),
        ] {
            let a = random(&mut rng, k);
            let rows = random(&mut rng, n.max(1) * stride);
            let p = random(&mut rng, n);
            let dots: Vec<u32> = (0..n)
                .map(|t| {
                    Kernel::Scalar
                        .dot(&a, &rows[t * stride..t * stride + k])
                        .to_bits()
                })
                .collect();
            let mut sum = random(&mut rng, k);
            let start = sum.clone();
            for (t, &pt) in p.iter().enumerate() {
                for (o, &v) in sum.iter_mut().zip(&rows[t * stride..]) {
                    *o += pt * v;
                }
            }
            for &kern in Kernel::all() {
                if !kern.is_available() {
                    continue;
                }
                let mut got = vec![0.0; n];
                kern.dot_rows(&a, &rows, stride, &mut got);
                let got: Vec<u32> = got.iter().map(|x| x.to_bits()).collect();
                assert_eq!(got, dots, "{} dot_rows k={k}", kern.name());
                let mut out = start.clone();
                kern.add_scaled_rows(&p, &rows, stride, &mut out);
                assert_eq!(
                    out.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                    sum.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                    "{} add_scaled_rows k={k}",
                    kern.name()
                );
            }
        }
    }

    #[test]
    #[should_panic(expected = "rows of 64 at stride 192")]
    fn row_kernels_refuse_rows_beyond_the_slice() {
        let mut out = [0.0; 3];
        Kernel::Scalar.dot_rows(&[0.0; 64], &[0.0; 2 * 192 + 63], 192, &mut out);
    }

    #[test]
    fn the_reference_is_a_dot_product() {
        // Against f64 arithmetic: within the usual rounding bound.
        let mut rng = fastrand::Rng::with_seed(2);
        for k in [1, 40, 576, 5000] {
            let (a, b) = (random(&mut rng, k), random(&mut rng, k));
            let exact: f64 = a
                .iter()
                .zip(&b)
                .map(|(x, y)| f64::from(*x) * f64::from(*y))
                .sum();
            let abs: f64 = a
                .iter()
                .zip(&b)
                .map(|(x, y)| f64::from((x * y).abs()))
                .sum();
            let got = f64::from(Kernel::Scalar.dot(&a, &b));
            assert!(
                (got - exact).abs() <= abs * k as f64 * f64::from(f32::EPSILON),
                "k={k}: {got} vs {exact}"
            );
        }
        // Integers small enough to be exact.
        let a: Vec<f32> = (0..100).map(|i| i as f32).collect();
        assert_eq!(
            Kernel::Scalar.dot(&a, &a),
            (0..100).map(|i| i * i).sum::<i32>() as f32
        );
    }
}
