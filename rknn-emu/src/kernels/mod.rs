//! Matrix kernels of the emulator: an exact i8 GEMM with i32 results and an f32-accumulating
//! float GEMM, each with SIMD variants chosen at run time.
//!
//! Both kernels take `A` as `[M, K]` row-major and `B` *transposed*, `Bt` as `[N, K]`
//! row-major, so that every output element is a dot product of two contiguous rows. `C` is
//! `[M, N]` row-major.
//!
//! # Backends
//!
//! A [`KernelBackend`] is one implementation of both kernels:
//!
//! | backend | arch | i8 kernel | f32 kernel | needs |
//! |---|---|---|---|---|
//! | [`Scalar`](KernelBackend::Scalar) | any | plain loops (the reference) | plain loops | nothing |
//! | `Avx2` | x86-64 | sign-extend to i16 + `vpmaddwd` | `vfmadd` (AVX2 + FMA) | `avx2`, `fma` |
//! | `Avx512Vnni` | x86-64 | `vpdpbusd` on 256-bit registers (EVEX, via `asm!`) | as `Avx2` | `avx2`, `fma`, `avx512f`, `avx512vl`, `avx512vnni` |
//! | `Neon` | aarch64 | `smull` + `sadalp` | `fmla` | (always present) |
//! | `NeonDotprod` | aarch64 | `sdot` (via `asm!`) | as `Neon` | `dotprod` |
//!
//! The CPU is probed once per process; [`selected_backend`] is the fastest available one unless
//! a variable names another (see below). [`gemm_i8_i32`], [`gemm_f32`] and [`gemm_i8_native_b`]
//! use the selected backend; [`gemm_i8_i32_with`], [`gemm_f32_with`] and
//! [`gemm_i8_native_b_with`] run a given one (tests and benchmarks use them to compare every
//! backend with the reference).
//!
//! AVX-512 *intrinsics* are not stable at this crate's MSRV (1.85), so the VNNI kernel emits
//! `vpdpbusd` with inline assembly on `ymm` registers (EVEX-encoded, AVX512-VL). The NEON
//! `vdotq_s32` intrinsic is likewise unstable at the MSRV, so `sdot` is emitted with `asm!` too.
//!
//! # Choosing a backend
//!
//! As every host kernel of the SDK ([`rknn_chip::kernel`]), as component `emu`:
//! `RKNN_KERNEL_EMU` or, for every component at once, `RKNN_KERNEL` set to a backend's
//! [name](KernelBackend::name) (`scalar`, `avx2`, `avx512vnni`, `neon`, `neondotprod`; case, `-`
//! and `_` are ignored) forces that backend for [`gemm_i8_i32`], [`gemm_f32`] and
//! [`gemm_i8_native_b`], e.g. `RKNN_KERNEL_EMU=scalar` to rule out a SIMD bug in the emulator's
//! kernels; `RKNN_KERNEL_EMU` wins over `RKNN_KERNEL`. The variables are read once, on the first
//! call; `auto` or an empty value means the default choice. A name that is unknown or not
//! available on this CPU is reported once on stderr and ignored. [`kernel_choice`] says what was
//! chosen and why.
//!
//! # Exactness
//!
//! The i8 kernel is bit-exact on every backend: it computes the integer dot products in
//! (wrapping) i32 arithmetic, so the result equals the mathematical one whenever that fits in
//! an i32, which is guaranteed for `K <= 131071` (`131072 * (-128)^2 = 2^31`). Beyond that all
//! backends return the same value, the true one modulo 2^32.
//!
//! The f32 kernel accumulates in f32 in a backend-dependent order (lanes, then a horizontal
//! sum), so backends may differ in the last bits; each result is within the usual
//! `~K * f32::EPSILON * sum(|a*b|)` of the exact value.
//!
//! # Blocking
//!
//! The SIMD backends compute `C` in register tiles (3 rows x 3 columns on x86-64, 4 x 4 on
//! aarch64, and 1 x 8 for a lone row such as `M = 1`): each tile is a set of simultaneous dot
//! products, so every loaded chunk of `A` serves several columns and every chunk of `B`
//! several rows. Around the tiles, columns are taken in panels of about 256 KiB of `Bt` (so a
//! panel stays in L2 while all rows of `A` go past it) and, when `M > 1`, `K` in blocks of
//! 4 KiB per row (so the rows of `A` a tile reads stay in L1; later blocks add to `C`). For
//! `M >= 64` the f32 kernels first copy each panel of `Bt` into an aligned buffer in tile
//! order. `M = 1` is a plain streaming pass over `Bt`. Details in `kernels/blocking.rs`.
//!
//! Because of the K blocks, the f32 summation order (hence the last bits of a result) also
//! depends on the shape: the same row may round differently as part of `M = 1` and `M = 2`.
//! Results are deterministic for a given backend and shape.
//!
//! The kernels are single-threaded: the emulator runs one NPU-core context per thread.

mod scalar;
mod shape;

#[cfg(target_arch = "aarch64")]
mod aarch64;
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
mod blocking;
#[cfg(target_arch = "x86_64")]
mod x86;

use std::fmt;
use std::sync::OnceLock;

use rknn_chip::KernelChoice;

use shape::check_shapes;
pub use shape::{NATIVE_B_SK, NATIVE_B_STREAM_MAX_M, NativeBShape};

/// One implementation of the matrix kernels.
///
/// Only the variants that make sense for the target architecture exist; whether one can run
/// on this CPU is [`KernelBackend::is_available`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum KernelBackend {
    /// Portable loops; the reference implementation, available everywhere.
    Scalar,
    /// x86-64 AVX2 (i8: sign extension to i16 and `vpmaddwd`) with FMA for f32.
    #[cfg(target_arch = "x86_64")]
    Avx2,
    /// x86-64 AVX512-VNNI `vpdpbusd` (256-bit, via `asm!`) for i8; the `Avx2` kernel for f32.
    #[cfg(target_arch = "x86_64")]
    Avx512Vnni,
    /// aarch64 NEON (i8: `smull` + `sadalp`; f32: `fmla`).
    #[cfg(target_arch = "aarch64")]
    Neon,
    /// aarch64 NEON with the dot-product extension (`sdot`, via `asm!`) for i8; the `Neon`
    /// kernel for f32.
    #[cfg(target_arch = "aarch64")]
    NeonDotprod,
}

impl KernelBackend {
    /// Every backend compiled into this build, slowest (the reference) first.
    pub const ALL: &'static [KernelBackend] = &[
        KernelBackend::Scalar,
        #[cfg(target_arch = "x86_64")]
        KernelBackend::Avx2,
        #[cfg(target_arch = "x86_64")]
        KernelBackend::Avx512Vnni,
        #[cfg(target_arch = "aarch64")]
        KernelBackend::Neon,
        #[cfg(target_arch = "aarch64")]
        KernelBackend::NeonDotprod,
    ];

    /// The backend's lower-case name, as accepted by `RKNN_KERNEL_EMU` and `RKNN_KERNEL`.
    pub fn name(self) -> &'static str {
        match self {
            KernelBackend::Scalar => "scalar",
            #[cfg(target_arch = "x86_64")]
            KernelBackend::Avx2 => "avx2",
            #[cfg(target_arch = "x86_64")]
            KernelBackend::Avx512Vnni => "avx512vnni",
            #[cfg(target_arch = "aarch64")]
            KernelBackend::Neon => "neon",
            #[cfg(target_arch = "aarch64")]
            KernelBackend::NeonDotprod => "neondotprod",
        }
    }

    /// The compiled-in backend called `name`, ignoring case, `-` and `_`.
    pub fn from_name(name: &str) -> Option<KernelBackend> {
        let wanted: String = name
            .chars()
            .filter(|c| *c != '-' && *c != '_')
            .map(|c| c.to_ascii_lowercase())
            .collect();
        KernelBackend::ALL
            .iter()
            .copied()
            .find(|b| b.name() == wanted)
    }

    /// Whether this CPU can run the backend (probed once per process).
    pub fn is_available(self) -> bool {
        available_backends_cached().contains(&self)
    }
}

impl fmt::Display for KernelBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The error of [`gemm_i8_i32_with`] and [`gemm_f32_with`] for a backend this CPU lacks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BackendUnavailable(pub KernelBackend);

impl fmt::Display for BackendUnavailable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "kernel backend `{}` is not available on this CPU (available: {})",
            self.0,
            available_backends_cached()
                .iter()
                .map(|b| b.name())
                .collect::<Vec<_>>()
                .join(", ")
        )
    }
}

impl std::error::Error for BackendUnavailable {}

fn detect(backend: KernelBackend) -> bool {
    match backend {
        KernelBackend::Scalar => true,
        #[cfg(target_arch = "x86_64")]
        KernelBackend::Avx2 => {
            std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("fma")
        }
        #[cfg(target_arch = "x86_64")]
        KernelBackend::Avx512Vnni => {
            detect(KernelBackend::Avx2)
                && std::arch::is_x86_feature_detected!("avx512f")
                && std::arch::is_x86_feature_detected!("avx512vl")
                && std::arch::is_x86_feature_detected!("avx512vnni")
        }
        #[cfg(target_arch = "aarch64")]
        KernelBackend::Neon => std::arch::is_aarch64_feature_detected!("neon"),
        #[cfg(target_arch = "aarch64")]
        KernelBackend::NeonDotprod => {
            std::arch::is_aarch64_feature_detected!("neon")
                && std::arch::is_aarch64_feature_detected!("dotprod")
        }
    }
}

fn available_backends_cached() -> &'static [KernelBackend] {
    static AVAILABLE: OnceLock<Vec<KernelBackend>> = OnceLock::new();
    AVAILABLE.get_or_init(|| {
        KernelBackend::ALL
            .iter()
            .copied()
            .filter(|&b| detect(b))
            .collect()
    })
}

/// The backends this CPU can run, the reference ([`KernelBackend::Scalar`]) first and the
/// fastest last.
pub fn available_backends() -> Vec<KernelBackend> {
    available_backends_cached().to_vec()
}

/// The component name of these kernels in the SDK's kernel selection ([`rknn_chip::kernel`]).
const KERNEL_COMPONENT: &str = "emu";

/// How the backend of [`gemm_i8_i32`], [`gemm_f32`] and [`gemm_i8_native_b`] was chosen
/// (component `emu`: `RKNN_KERNEL_EMU`, then `RKNN_KERNEL`; see the
/// [module docs](self#choosing-a-backend)). Made once per process; a variable naming a backend
/// that is unknown or not available on this CPU is reported on stderr then, and ignored.
pub fn kernel_choice() -> &'static KernelChoice {
    static CHOICE: OnceLock<KernelChoice> = OnceLock::new();
    CHOICE.get_or_init(|| {
        let names = |backends: &[KernelBackend]| backends.iter().map(|b| b.name()).collect();
        let compiled: Vec<&'static str> = names(KernelBackend::ALL);
        let available: Vec<&'static str> = names(available_backends_cached());
        let choice = KernelChoice::from_env(KERNEL_COMPONENT, &compiled, &available);
        choice.warn();
        choice
    })
}

/// The backend [`gemm_i8_i32`], [`gemm_f32`] and [`gemm_i8_native_b`] use: the one
/// [`kernel_choice`] selected (the fastest available one unless a variable names another).
pub fn selected_backend() -> KernelBackend {
    static SELECTED: OnceLock<KernelBackend> = OnceLock::new();
    *SELECTED.get_or_init(|| {
        KernelBackend::from_name(kernel_choice().selected)
            .filter(|b| b.is_available())
            .unwrap_or(KernelBackend::Scalar)
    })
}

/// `C[i*n + j] = sum_p A[i*k + p] * Bt[j*k + p]`, exactly, in i32, with the selected backend.
///
/// `a` is `[M, K]` row-major, `bt` is B transposed (`[N, K]` row-major), `c` is `[M, N]`
/// row-major; only the first `M*K`, `N*K` and `M*N` elements are used. The result is exact
/// for `K <= 131071` (see the [module docs](self#exactness)).
///
/// # Panics
///
/// If a slice is shorter than its matrix.
pub fn gemm_i8_i32(a: &[i8], bt: &[i8], c: &mut [i32], m: usize, n: usize, k: usize) {
    run_i8(selected_backend(), a, bt, c, m, n, k);
}

/// As [`gemm_i8_i32`] for floats, accumulating in f32, with the selected backend.
///
/// # Panics
///
/// If a slice is shorter than its matrix.
pub fn gemm_f32(a: &[f32], bt: &[f32], c: &mut [f32], m: usize, n: usize, k: usize) {
    run_f32(selected_backend(), a, bt, c, m, n, k);
}

/// [`gemm_i8_i32`] with the given backend.
///
/// # Errors
///
/// [`BackendUnavailable`] (and `c` untouched) if this CPU cannot run `backend`.
///
/// # Panics
///
/// If a slice is shorter than its matrix.
pub fn gemm_i8_i32_with(
    backend: KernelBackend,
    a: &[i8],
    bt: &[i8],
    c: &mut [i32],
    m: usize,
    n: usize,
    k: usize,
) -> Result<(), BackendUnavailable> {
    if !backend.is_available() {
        return Err(BackendUnavailable(backend));
    }
    run_i8(backend, a, bt, c, m, n, k);
    Ok(())
}

/// [`gemm_f32`] with the given backend.
///
/// # Errors
///
/// [`BackendUnavailable`] (and `c` untouched) if this CPU cannot run `backend`.
///
/// # Panics
///
/// If a slice is shorter than its matrix.
pub fn gemm_f32_with(
    backend: KernelBackend,
    a: &[f32],
    bt: &[f32],
    c: &mut [f32],
    m: usize,
    n: usize,
    k: usize,
) -> Result<(), BackendUnavailable> {
    if !backend.is_available() {
        return Err(BackendUnavailable(backend));
    }
    run_f32(backend, a, bt, c, m, n, k);
    Ok(())
}

/// Runs the i8 kernel of `backend`, which the caller has checked is available.
fn run_i8(
    backend: KernelBackend,
    a: &[i8],
    bt: &[i8],
    c: &mut [i32],
    m: usize,
    n: usize,
    k: usize,
) {
    check_shapes(a.len(), bt.len(), c.len(), m, n, k);
    debug_assert!(backend.is_available());
    match backend {
        KernelBackend::Scalar => scalar::gemm_i8_i32(a, bt, c, m, n, k),
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the backend is available (checked by every caller), i.e. the CPU has AVX2.
        KernelBackend::Avx2 => unsafe { x86::gemm_i8_i32_avx2(a, bt, c, m, n, k) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the backend is available, i.e. the CPU has AVX2, AVX512-VL and AVX512-VNNI.
        KernelBackend::Avx512Vnni => unsafe { x86::gemm_i8_i32_vnni(a, bt, c, m, n, k) },
        #[cfg(target_arch = "aarch64")]
        // SAFETY: the backend is available, i.e. the CPU has NEON.
        KernelBackend::Neon => unsafe { aarch64::gemm_i8_i32_neon(a, bt, c, m, n, k) },
        #[cfg(target_arch = "aarch64")]
        // SAFETY: the backend is available, i.e. the CPU has NEON and the dot-product extension.
        KernelBackend::NeonDotprod => unsafe { aarch64::gemm_i8_i32_sdot(a, bt, c, m, n, k) },
    }
}

/// Runs the f32 kernel of `backend`, which the caller has checked is available.
fn run_f32(
    backend: KernelBackend,
    a: &[f32],
    bt: &[f32],
    c: &mut [f32],
    m: usize,
    n: usize,
    k: usize,
) {
    check_shapes(a.len(), bt.len(), c.len(), m, n, k);
    debug_assert!(backend.is_available());
    match backend {
        KernelBackend::Scalar => scalar::gemm_f32(a, bt, c, m, n, k),
        #[cfg(target_arch = "x86_64")]
        // SAFETY: both backends are available only if the CPU has AVX2 and FMA.
        KernelBackend::Avx2 | KernelBackend::Avx512Vnni => unsafe {
            x86::gemm_f32_avx2_fma(a, bt, c, m, n, k)
        },
        #[cfg(target_arch = "aarch64")]
        // SAFETY: both backends are available only if the CPU has NEON.
        KernelBackend::Neon | KernelBackend::NeonDotprod => unsafe {
            aarch64::gemm_f32_neon(a, bt, c, m, n, k)
        },
    }
}

/// `C[i, j] (+)= sum_p A[i, p] * B(p, j)`, exactly in wrapping i32, with B in the NPU's native
/// int8 layout `[n / sn][k / 32][sn][32]` (one K segment of it), read in its storage order.
///
/// Up to [`NATIVE_B_STREAM_MAX_M`] rows this is the emulator's matrix-vector product: at small
/// `m` it is bound by reading B, and the native layout read front to back is one sequential
/// stream, which the hardware prefetchers follow at the full memory bandwidth (the dot-product
/// kernel over `[N, K]`, reading eight rows at once, reached about a third of it on the
/// development machine). Each 32 x 32-byte tile is reduced in registers for every row of A
/// while it is in L1, so B is read from memory once whatever `m`. Its cost per row is larger
/// than the register-tiled kernel's ([`gemm_i8_i32`]), so from more rows on the same register
/// tiles run over B in place, stepping through the native layout's strides (no copy of B into
/// `[N, K]`).
///
/// On the AVX512-VNNI backend of a build by Rust 1.89 or later, one 512-bit kernel runs every
/// `m` (row groups over each block of B while it is in cache; see `docs/emulator-performance.md`).
///
/// With `accumulate` the sums are added to C (wrapping), otherwise they overwrite it. Exact
/// for `k <= 131071` like [`gemm_i8_i32`], and bit-identical on every backend.
///
/// # Panics
///
/// If the shape breaks a rule of [`NativeBShape`] or a slice is shorter than its matrix.
pub fn gemm_i8_native_b(a: &[i8], b: &[i8], c: &mut [i32], shape: NativeBShape, accumulate: bool) {
    run_native_b(selected_backend(), a, b, c, shape, accumulate);
}

/// [`gemm_i8_native_b`] with the given backend.
///
/// # Errors
///
/// [`BackendUnavailable`] (and `c` untouched) if this CPU cannot run `backend`.
///
/// # Panics
///
/// As [`gemm_i8_native_b`].
pub fn gemm_i8_native_b_with(
    backend: KernelBackend,
    a: &[i8],
    b: &[i8],
    c: &mut [i32],
    shape: NativeBShape,
    accumulate: bool,
) -> Result<(), BackendUnavailable> {
    if !backend.is_available() {
        return Err(BackendUnavailable(backend));
    }
    run_native_b(backend, a, b, c, shape, accumulate);
    Ok(())
}

/// Runs the native-B kernel of `backend`, which the caller has checked is available.
fn run_native_b(
    backend: KernelBackend,
    a: &[i8],
    b: &[i8],
    c: &mut [i32],
    shape: NativeBShape,
    accumulate: bool,
) {
    shape.check(a.len(), b.len(), c.len());
    debug_assert!(backend.is_available());
    if shape.m == 0 || shape.n == 0 {
        return;
    }
    let tiled = shape.m > NATIVE_B_STREAM_MAX_M;
    match backend {
        KernelBackend::Scalar => scalar::gemm_i8_native_b(a, b, c, shape, accumulate),
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the backend is available (checked by every caller), i.e. the CPU has AVX2;
        // the shape and lengths are checked above.
        KernelBackend::Avx2 if tiled => unsafe {
            x86::native_b_tiled_avx2(a, b, c, shape, accumulate)
        },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the backend is available, i.e. the CPU has AVX2, AVX512-VL and AVX512-VNNI;
        // the shape and lengths are checked above.
        KernelBackend::Avx512Vnni if tiled && !x86::ZMM_BUILT => unsafe {
            x86::native_b_tiled_vnni(a, b, c, shape, accumulate)
        },
        #[cfg(target_arch = "aarch64")]
        // SAFETY: the backend is available, i.e. the CPU has NEON; shape and lengths checked.
        KernelBackend::Neon if tiled => unsafe {
            aarch64::native_b_tiled_neon(a, b, c, shape, accumulate)
        },
        #[cfg(target_arch = "aarch64")]
        // SAFETY: the backend is available, i.e. the CPU has NEON and the dot-product
        // extension; shape and lengths checked.
        KernelBackend::NeonDotprod if tiled => unsafe {
            aarch64::native_b_tiled_sdot(a, b, c, shape, accumulate)
        },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the backend is available (checked by every caller), i.e. the CPU has AVX2;
        // the shape and lengths are checked above.
        KernelBackend::Avx2 => unsafe { x86::native_b_avx2(a, b, c, shape, accumulate) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the backend is available, i.e. the CPU has AVX2, AVX512-VL and AVX512-VNNI;
        // the shape and lengths are checked above.
        KernelBackend::Avx512Vnni => unsafe { x86::native_b_vnni(a, b, c, shape, accumulate) },
        #[cfg(target_arch = "aarch64")]
        // SAFETY: the backend is available, i.e. the CPU has NEON; shape and lengths checked.
        KernelBackend::Neon => unsafe { aarch64::native_b_neon(a, b, c, shape, accumulate) },
        #[cfg(target_arch = "aarch64")]
        // SAFETY: the backend is available, i.e. the CPU has NEON and the dot-product
        // extension; shape and lengths checked.
        KernelBackend::NeonDotprod => unsafe { aarch64::native_b_sdot(a, b, c, shape, accumulate) },
    }
}
