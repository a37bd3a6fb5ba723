//! Typed matmul contexts: validated per chip before any FFI call, owning an `Arc` of their
//! runtime (memories own an `Arc` of their context), binding and syncing by construction, and
//! used by one thread at a time.

use std::cell::Cell;
use std::marker::PhantomData;
use std::sync::Arc;

use rknn_chip::{ElemKind, Int4ConverterInput, Layout, QuantGranularity, QuantType};
use rknn_sys as sys;

use super::context::ContextHandle;
use super::mem::{MemFlags, TensorMem};
use super::runtime::Runtime;
use crate::dtype::{Element, MatmulKind};
use crate::error::{Error, Matrix, Result};
use crate::result;

/// Which NPU core a context runs on.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Core {
    /// The runtime chooses (mask 0).
    #[default]
    Auto,
    /// One core by index (mask `1 << index`). A combined mask is rejected for matmul on the
    /// real runtime (\[hw\]); to use several cores, run one context per core.
    Index(usize),
}

/// Quantisation of B (used by the types with float or requantised outputs).
#[derive(Clone, Debug, PartialEq)]
pub enum BQuant {
    /// One scale and zero point for all of B.
    PerLayer {
        /// Scale.
        scale: f32,
        /// Zero point.
        zp: i32,
    },
    /// One per output channel (N values; `zps` empty for symmetric).
    PerChannel {
        /// N scales.
        scales: Vec<f32>,
        /// 0 or N zero points.
        zps: Vec<i32>,
    },
    /// One per group of `group_size` rows of K per channel: N*K/group_size values in the order
    /// `[K/group_size][N]` (the order is inferred, \[open\]).
    PerGroup {
        /// Rows of K per group; must divide K.
        group_size: usize,
        /// The scales.
        scales: Vec<f32>,
        /// 0 or as many zero points.
        zps: Vec<i32>,
    },
}

/// Scale and zero point of A or C (per layer).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LayerQuant {
    /// Scale.
    pub scale: f32,
    /// Zero point.
    pub zp: i32,
}

/// Configures a [`Matmul`]; made by [`Runtime::matmul`].
#[derive(Debug)]
#[must_use]
pub struct MatmulBuilder<K: MatmulKind> {
    rt: Runtime,
    m: usize,
    k: usize,
    n: usize,
    b_layout: Layout,
    ac_layout: Layout,
    core: Core,
    iommu_domain: i32,
    quant_a: Option<LayerQuant>,
    quant_b: Option<BQuant>,
    quant_c: Option<LayerQuant>,
    dynamic_m: Option<Vec<usize>>,
    _k: PhantomData<K>,
}

impl Runtime {
    /// Starts configuring a matmul context of type `K` for C[M, N] = A[M, K] × B[K, N].
    ///
    /// ```
    /// # if !cfg!(feature = "emulator") { return Ok(()); } // the emulator is not compiled in
    /// use rknn_matmul::{I8xI8ToI32, Platform, Runtime};
    /// let rt = Runtime::emulator(Platform::Rk3588)?;
    /// let mm = rt.matmul::<I8xI8ToI32>(2, 64, 32).build()?;
    /// let mut a = mm.alloc_a()?;
    /// let mut b = mm.alloc_b()?;
    /// let mut c = mm.alloc_c()?;
    /// a.as_mut_slice().fill(2);
    /// b.as_mut_slice().fill(3);
    /// mm.run(&a, &b, &mut c)?;
    /// assert!(c.as_slice().iter().all(|&x| x == 64 * 6));
    /// // A wrong shape is refused before any FFI call, naming the rule:
    /// let err = rt.matmul::<I8xI8ToI32>(1, 64, 100).build().unwrap_err();
    /// assert_eq!(err.to_string(), "N=100 is not a multiple of 32 required for i8 on RK3588");
    /// # Ok::<(), rknn_matmul::Error>(())
    /// ```
    pub fn matmul<K: MatmulKind>(&self, m: usize, k: usize, n: usize) -> MatmulBuilder<K> {
        MatmulBuilder {
            rt: self.clone(),
            m,
            k,
            n,
            b_layout: Layout::Norm,
            ac_layout: Layout::Norm,
            core: Core::Auto,
            iommu_domain: 0,
            quant_a: None,
            quant_b: None,
            quant_c: None,
            dynamic_m: None,
            _k: PhantomData,
        }
    }
}

/// The quantisation parameters of one matrix, as the runtime takes them.
struct QuantArrays {
    scales: Vec<f32>,
    zps: Vec<i32>,
}

fn check_scales(matrix: Matrix, scales: &[f32]) -> Result<()> {
    match scales
        .iter()
        .enumerate()
        .find(|(_, s)| !(s.is_finite() && **s > 0.0))
    {
        Some((index, &value)) => Err(Error::BadScale {
            matrix,
            index,
            value,
        }),
        None => Ok(()),
    }
}

fn layer_arrays(matrix: Matrix, q: LayerQuant) -> Result<QuantArrays> {
    check_scales(matrix, &[q.scale])?;
    Ok(QuantArrays {
        scales: vec![q.scale],
        zps: vec![q.zp],
    })
}

impl<K: MatmulKind> MatmulBuilder<K> {
    /// Layout of B: normal [K, N] (default), native, or TP_NORM ([N, K]).
    pub fn b_layout(mut self, l: Layout) -> Self {
        self.b_layout = l;
        self
    }

    /// Layout of A and C: normal (default) or native.
    pub fn ac_layout(mut self, l: Layout) -> Self {
        self.ac_layout = l;
        self
    }

    /// The NPU core (default: auto).
    pub fn core(mut self, c: Core) -> Self {
        self.core = c;
        self
    }

    /// The IOMMU domain of the context's memories (each holds 4 GiB; driver >= 0.9.8).
    pub fn iommu_domain(mut self, d: i32) -> Self {
        self.iommu_domain = d;
        self
    }

    /// Quantisation of A.
    pub fn quant_a(mut self, q: LayerQuant) -> Self {
        self.quant_a = Some(q);
        self
    }

    /// Quantisation of B.
    pub fn quant_b(mut self, q: BQuant) -> Self {
        self.quant_b = Some(q);
        self
    }

    /// Quantisation of C (i8 output).
    pub fn quant_c(mut self, q: LayerQuant) -> Self {
        self.quant_c = Some(q);
        self
    }

    /// Makes a dynamic-shape context for these values of M (K and N fixed); select one with
    /// [`Matmul::set_m`]. Memories are sized for the largest.
    pub fn dynamic_m(mut self, ms: &[usize]) -> Self {
        self.dynamic_m = Some(ms.to_vec());
        self
    }

    fn b_quant_type(&self) -> QuantType {
        let (granularity, asymmetric) = match &self.quant_b {
            None => (QuantGranularity::PerLayer, false),
            Some(BQuant::PerLayer { zp, .. }) => (QuantGranularity::PerLayer, *zp != 0),
            Some(BQuant::PerChannel { zps, .. }) => (QuantGranularity::PerChannel, !zps.is_empty()),
            Some(BQuant::PerGroup { zps, .. }) => (QuantGranularity::PerGroup, !zps.is_empty()),
        };
        QuantType {
            granularity,
            asymmetric,
        }
    }

    /// The M values of the context, checked.
    fn ms(&self) -> Result<Vec<usize>> {
        let ms = self.dynamic_m.clone().unwrap_or_else(|| vec![self.m]);
        let max = sys::RKNN_MAX_DYNAMIC_SHAPE_NUM as usize;
        let duplicate = ms.iter().enumerate().any(|(i, m)| ms[..i].contains(m));
        if ms.is_empty() || ms.len() > max || duplicate {
            return Err(Error::DynamicShapes { ms, max });
        }
        Ok(ms)
    }

    /// B's quantisation arrays, with their lengths checked against the shape.
    fn b_arrays(&self) -> Result<Option<QuantArrays>> {
        let (n, k) = (self.n, self.k);
        let Some(q) = &self.quant_b else {
            return Ok(None);
        };
        let (scales, zps, expected, rule) = match q {
            BQuant::PerLayer { scale, zp } => {
                return layer_arrays(
                    Matrix::B,
                    LayerQuant {
                        scale: *scale,
                        zp: *zp,
                    },
                )
                .map(Some);
            }
            BQuant::PerChannel { scales, zps } => (scales, zps, n, "one per output channel: N"),
            BQuant::PerGroup {
                group_size,
                scales,
                zps,
            } => {
                if *group_size == 0 || k % group_size != 0 || *group_size > i16::MAX as usize {
                    return Err(Error::Rule(rknn_chip::RuleViolation::BadGroupSize {
                        group_size: i64::try_from(*group_size).unwrap_or(i64::MAX),
                        k,
                    }));
                }
                // k / group_size <= k, and n * k was checked to fit in the dims check.
                (
                    scales,
                    zps,
                    n * (k / group_size),
                    "one per output channel and group: N × K / group_size",
                )
            }
        };
        if scales.len() != expected {
            return Err(Error::QuantLength {
                matrix: Matrix::B,
                what: "scales",
                expected,
                got: scales.len(),
                rule,
            });
        }
        if !zps.is_empty() && zps.len() != expected {
            return Err(Error::QuantLength {
                matrix: Matrix::B,
                what: "zero points",
                expected,
                got: zps.len(),
                rule,
            });
        }
        check_scales(Matrix::B, scales)?;
        Ok(Some(QuantArrays {
            scales: scales.clone(),
            zps: zps.clone(),
        }))
    }

    /// Checks everything the chip's rules say, without calling the runtime.
    fn validate(&self) -> Result<Vec<usize>> {
        let p = self.rt.platform();
        let t = K::TYPE;
        let ms = self.ms()?;
        for &m in &ms {
            rknn_chip::check_dims(m, self.k, self.n)?;
        }
        // Sizes the runtime computes from the shape must exist: K × N elements of B, and the
        // same products in bytes, fit the runtime's 32-bit sizes.
        let largest_m = ms.iter().copied().max().unwrap_or(self.m);
        for (what, a, b) in [
            ("elements of A (M × K)", largest_m, self.k),
            ("elements of B (K × N)", self.k, self.n),
            ("elements of C (M × N)", largest_m, self.n),
        ] {
            let v = a.checked_mul(b).filter(|v| *v <= u32::MAX as usize / 4);
            if v.is_none() {
                return Err(Error::SizeOverflow {
                    what,
                    value: (a as u128 * b as u128).to_string(),
                    limit: "the runtime's 32-bit tensor sizes",
                });
            }
        }
        rknn_chip::check_type(p, t)?;
        rknn_chip::check_kn(p, &self.rt.shape_rules(), t, self.k, self.n)?;
        rknn_chip::check_layouts(p, t, self.b_layout, self.ac_layout)?;
        if let Core::Index(core) = self.core {
            if core >= p.npu_cores() || !p.has_core_mask() {
                return Err(Error::NoSuchCore {
                    core,
                    platform: p,
                    cores: p.npu_cores(),
                    selectable: p.has_core_mask(),
                });
            }
        }
        Ok(ms)
    }

    /// Validates and creates the context.
    pub fn build(self) -> Result<Matmul<K>> {
        let ms = self.validate()?;
        let b_quant = self.b_arrays()?;
        let a_quant = self
            .quant_a
            .map(|q| layer_arrays(Matrix::A, q))
            .transpose()?;
        let c_quant = self
            .quant_c
            .map(|q| layer_arrays(Matrix::C, q))
            .transpose()?;
        let rt = self.rt.clone();
        // Every dimension was bounded by i32::MAX in `validate`, so these casts are exact.
        let dim = |v: usize| v as i32;
        let mut info = sys::rknn_matmul_info {
            M: dim(ms[0]),
            K: dim(self.k),
            N: dim(self.n),
            type_: K::TYPE.raw(),
            B_layout: self.b_layout.raw() as i16,
            AC_layout: self.ac_layout.raw() as i16,
            B_quant_type: self.b_quant_type().raw() as i16,
            // Zero points of A or C make the A/C quantisation asymmetric.
            AC_quant_type: QuantType {
                granularity: QuantGranularity::PerLayer,
                asymmetric: [self.quant_a, self.quant_c]
                    .iter()
                    .flatten()
                    .any(|q| q.zp != 0),
            }
            .raw() as i16,
            iommu_domain_id: self.iommu_domain,
            // Bounded by i16::MAX in `b_arrays`.
            group_size: match &self.quant_b {
                Some(BQuant::PerGroup { group_size, .. }) => *group_size as i16,
                _ => 0,
            },
            ..Default::default()
        };
        // From here on the handle owns the context: an error below destroys it.
        let (handle, ios) = if self.dynamic_m.is_some() {
            let mut shapes: Vec<sys::rknn_matmul_shape> = ms
                .iter()
                .map(|&m| sys::rknn_matmul_shape {
                    M: dim(m),
                    K: dim(self.k),
                    N: dim(self.n),
                })
                .collect();
            let ctx =
                rt.call(|api| result::matmul_create_dynamic_shape(api, &mut info, &mut shapes))?;
            (ContextHandle::own(rt, ctx.0, self.iommu_domain), ctx.1)
        } else {
            let (handle, io) = ContextHandle::create(&rt, &mut info)?;
            (handle, vec![io])
        };
        let handle = Arc::new(handle);
        if let Core::Index(i) = self.core {
            handle.call(|api, ctx| result::matmul_set_core_mask(api, ctx, 1 << i))?;
        }
        for (matrix, q) in [
            (Matrix::A, a_quant),
            (Matrix::B, b_quant),
            (Matrix::C, c_quant),
        ] {
            if let Some(q) = q {
                handle.call(|api, ctx| {
                    result::matmul_set_quant_params(api, ctx, matrix, &q.scales, &q.zps)
                })?;
            }
        }
        Ok(Matmul {
            handle,
            ios,
            ms,
            k: self.k,
            n: self.n,
            current: Cell::new(0),
            bound: Default::default(),
            ac_layout: self.ac_layout,
            b_layout: self.b_layout,
            _k: PhantomData,
        })
    }
}

/// A matmul context of type `K`: C = A × B on the NPU.
///
/// It owns its runtime (an `Arc` inside [`Runtime`]), and its memories own it, so any drop
/// order is safe: the context is destroyed after its last memory.
///
/// It is `Send` (it can move to a worker thread) but not `Sync`: one context used from two
/// threads at once has caused kernel panics and unkillable hangs on RK3588, so the type system
/// forbids sharing it:
///
/// ```compile_fail,E0277
/// use rknn_matmul::{Runtime, Platform, I8xI8ToI32};
/// let rt = Runtime::emulator(Platform::Rk3588).unwrap();
/// let mm = rt.matmul::<I8xI8ToI32>(1, 32, 32).build().unwrap();
/// std::thread::scope(|s| {
///     s.spawn(|| mm.shape()); // error: `Cell<..>` cannot be shared between threads safely
/// });
/// ```
pub struct Matmul<K: MatmulKind> {
    handle: Arc<ContextHandle>,
    ios: Vec<sys::rknn_matmul_io_attr>,
    ms: Vec<usize>,
    k: usize,
    n: usize,
    current: Cell<usize>,
    /// What is bound to A, B, C: (memory id, generation at bind time).
    bound: [Cell<Option<(u64, u64)>>; 3],
    ac_layout: Layout,
    b_layout: Layout,
    _k: PhantomData<K>,
}

impl<K: MatmulKind> std::fmt::Debug for Matmul<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Matmul")
            .field("type", &K::TYPE.c_name())
            .field("shape", &self.shape())
            .finish()
    }
}

impl<K: MatmulKind> Matmul<K> {
    /// The current (M, K, N).
    pub fn shape(&self) -> (usize, usize, usize) {
        (self.ms[self.current.get()], self.k, self.n)
    }

    /// The M values of a dynamic-shape context (one value otherwise).
    pub fn m_values(&self) -> &[usize] {
        &self.ms
    }

    /// The runtime.
    pub fn runtime(&self) -> &Runtime {
        &self.handle.rt
    }

    /// The raw context handle, for calls the safe layer does not wrap. Using it is `unsafe`
    /// (through the runtime's function table); it stays valid while `self` lives, and must not
    /// be destroyed or used from another thread.
    pub fn as_raw(&self) -> sys::rknn_matmul_ctx {
        self.handle.raw()
    }

    /// The runtime's descriptors of A, B and C for the current shape.
    pub fn io_attr(&self) -> &sys::rknn_matmul_io_attr {
        &self.ios[self.current.get()]
    }

    fn attr(&self, matrix: Matrix) -> &sys::rknn_matmul_tensor_attr {
        let io = self.io_attr();
        match matrix {
            Matrix::A => &io.A,
            Matrix::B => &io.B,
            Matrix::C => &io.C,
        }
    }

    /// The native tile of `matrix` as the runtime reported it in `io_attr` (never hard-coded:
    /// the fact sheet says to read tile sizes from the returned dims): A's `sK`, B's
    /// `(sN, sK)` as `(dims[2], dims[3])`, C's `sN`. An error if the matrix is not in the
    /// native layout or the runtime reported no usable tile.
    pub fn native_tile(&self, matrix: Matrix) -> Result<(usize, usize)> {
        let attr = self.attr(matrix);
        let layout = if matrix == Matrix::B {
            self.b_layout
        } else {
            self.ac_layout
        };
        let dims: Vec<u32> = attr.dims[..(attr.n_dims as usize).min(attr.dims.len())].to_vec();
        let bad = || Error::BadTensorDims {
            matrix,
            layout,
            dims: dims.clone(),
        };
        if layout != Layout::Native {
            return Err(bad());
        }
        let (i, j) = if matrix == Matrix::B { (2, 3) } else { (2, 2) };
        let (a, b) = (
            dims.get(i).copied().unwrap_or(0),
            dims.get(j).copied().unwrap_or(0),
        );
        if a == 0 || b == 0 {
            return Err(bad());
        }
        Ok((a as usize, b as usize))
    }

    /// The bytes of `matrix` for the largest shape (what its memory must hold).
    pub fn max_bytes(&self, matrix: Matrix) -> u64 {
        self.ios
            .iter()
            .map(|io| {
                u64::from(match matrix {
                    Matrix::A => io.A.size,
                    Matrix::B => io.B.size,
                    Matrix::C => io.C.size,
                })
            })
            .max()
            .unwrap_or(0)
    }

    fn alloc<T: Element>(&self, matrix: Matrix, flags: Option<MemFlags>) -> Result<TensorMem<T>> {
        TensorMem::new(
            self.handle.clone(),
            matrix,
            self.max_bytes(matrix),
            flags,
            false,
        )
    }

    /// A memory of `len` elements (at least this context's largest) that other contexts of the
    /// same runtime and IOMMU domain may bind as well, so that contexts used one after another
    /// (the engine's contexts of one NPU core) share one A and one C instead of a pair each:
    /// every memory holds a dma-buf file descriptor, and a process runs out near 1020.
    ///
    /// Whether Rockchip's runtime accepts a memory allocated on one context in another
    /// context's `set_io_mem` is not documented (\[open\]; the emulator accepts it within an
    /// IOMMU domain).
    fn alloc_shared<T: Element>(&self, matrix: Matrix, len: usize) -> Result<TensorMem<T>> {
        let bytes = len
            .checked_mul(std::mem::size_of::<T>())
            .and_then(|b| u64::try_from(b).ok())
            .ok_or_else(|| Error::SizeOverflow {
                what: "shared memory bytes",
                value: (len as u128 * std::mem::size_of::<T>() as u128).to_string(),
                limit: "u64",
            })?;
        TensorMem::new(
            self.handle.clone(),
            matrix,
            bytes.max(self.max_bytes(matrix)),
            None,
            true,
        )
    }

    /// Allocates an A that other contexts of the same runtime and IOMMU domain may bind too
    /// (see the note on sharing); `len` elements, at least this context's largest A.
    pub fn alloc_shared_a(&self, len: usize) -> Result<TensorMem<K::A>> {
        self.alloc_shared(Matrix::A, len)
    }

    /// Allocates a C that other contexts of the same runtime and IOMMU domain may bind too
    /// (\[open\] on the hardware, see [`Matmul::alloc_shared_a`]).
    pub fn alloc_shared_c(&self, len: usize) -> Result<TensorMem<K::C>> {
        self.alloc_shared(Matrix::C, len)
    }

    /// The IOMMU domain of the context.
    pub fn iommu_domain(&self) -> i32 {
        self.handle.domain
    }

    /// Allocates A, sized for the largest shape.
    pub fn alloc_a(&self) -> Result<TensorMem<K::A>> {
        self.alloc(Matrix::A, None)
    }

    /// Allocates B.
    pub fn alloc_b(&self) -> Result<TensorMem<K::B>> {
        self.alloc(Matrix::B, None)
    }

    /// Allocates C, sized for the largest shape.
    pub fn alloc_c(&self) -> Result<TensorMem<K::C>> {
        self.alloc(Matrix::C, None)
    }

    /// Allocates A with explicit allocation flags (`rknn_create_mem2`).
    pub fn alloc_a_with(&self, flags: MemFlags) -> Result<TensorMem<K::A>> {
        self.alloc(Matrix::A, Some(flags))
    }

    /// Allocates B with explicit allocation flags (`rknn_create_mem2`).
    pub fn alloc_b_with(&self, flags: MemFlags) -> Result<TensorMem<K::B>> {
        self.alloc(Matrix::B, Some(flags))
    }

    /// Allocates C with explicit allocation flags (`rknn_create_mem2`).
    pub fn alloc_c_with(&self, flags: MemFlags) -> Result<TensorMem<K::C>> {
        self.alloc(Matrix::C, Some(flags))
    }

    /// Selects M on a dynamic-shape context. A and C are bound again by the next run; B stays
    /// bound, as the vendor's usage requires ("B can not be dynamic, only call set_io_mem
    /// once").
    pub fn set_m(&self, m: usize) -> Result<()> {
        let i = self
            .ms
            .iter()
            .position(|&x| x == m)
            .ok_or_else(|| Error::UnknownM {
                m,
                shapes: self.ms.clone(),
            })?;
        if i == self.current.get() {
            return Ok(());
        }
        // Bounded by i32::MAX when the context was built.
        let mut s = sys::rknn_matmul_shape {
            M: m as i32,
            K: self.k as i32,
            N: self.n as i32,
        };
        self.handle
            .call(|api, ctx| result::matmul_set_dynamic_shape(api, ctx, &mut s))?;
        self.current.set(i);
        self.bound[Matrix::A.index()].set(None);
        self.bound[Matrix::C.index()].set(None);
        Ok(())
    }

    /// Binds `mem` as `matrix` unless the same, unchanged memory is bound already; syncs inputs
    /// to the device first.
    fn bind<T: Element>(&self, matrix: Matrix, mem: &TensorMem<T>) -> Result<()> {
        if !mem.belongs_to(&self.handle) {
            if !mem.is_shared() || !mem.runtime().same(&self.handle.rt) {
                return Err(Error::ForeignMemory { matrix });
            }
            if mem.domain() != self.handle.domain {
                return Err(Error::DomainMismatch {
                    matrix,
                    memory: mem.domain(),
                    context: self.handle.domain,
                });
            }
        }
        if mem.matrix() != matrix {
            return Err(Error::WrongMatrix {
                allocated_for: mem.matrix(),
                passed_as: matrix,
            });
        }
        let needed = self.attr(matrix).size;
        if mem.bytes() < u64::from(needed) {
            return Err(Error::MemoryTooSmall {
                matrix,
                bytes: mem.bytes(),
                needed: needed.into(),
            });
        }
        let stamp = mem.stamp();
        let slot = &self.bound[matrix.index()];
        if slot.get() == Some(stamp) {
            return Ok(());
        }
        if matrix != Matrix::C {
            mem.sync(sys::RKNN_MEMORY_SYNC_TO_DEVICE)?;
        }
        // The whole attribute (about 350 bytes) is copied only for the call: a run checks B
        // and C, bound already, on every forward, when their attributes are cold in the cache.
        let mut attr = *self.attr(matrix);
        let raw = mem.raw();
        self.handle.call(|api, ctx| {
            // SAFETY: a live memory of this context (checked above), at least as large as the
            // tensor (checked above); it stays alive while bound because `run` borrows it for the
            // call and every later run binds again unless this exact memory is passed again.
            unsafe { result::matmul_set_io_mem(api, ctx, raw, &mut attr) }
        })?;
        slot.set(Some(stamp));
        Ok(())
    }

    /// Runs C = A × B. Memories written since they were last bound are synced to the device
    /// and bound again first; C is synced back before this returns.
    pub fn run(
        &self,
        a: &TensorMem<K::A>,
        b: &TensorMem<K::B>,
        c: &mut TensorMem<K::C>,
    ) -> Result<()> {
        self.bind(Matrix::A, a)?;
        self.bind(Matrix::B, b)?;
        self.bind(Matrix::C, c)?;
        let call = self.handle.enter()?;
        // SAFETY: A, B and C are bound to live memories of this context, borrowed for the call.
        let ran = unsafe { result::matmul_run(call.api, call.ctx) };
        call.rt.with_versions(ran)?;
        drop(call);
        c.sync(sys::RKNN_MEMORY_SYNC_FROM_DEVICE)
    }

    /// Converts B from normal [K, N] into the native layout in `dst`, with the chip's K
    /// segmentation (`rknn_B_normal_layout_to_native_layout`). For int4 B, `src` holds one value
    /// per element (-8..=7); the runtime is given them packed two per byte or one per byte, as
    /// [`Runtime::int4_converter_input`] says (\[open\]). Source and destination cannot alias:
    /// `dst` is borrowed mutably, so the in-place conversion that corrupts B on the hardware
    /// cannot be written:
    ///
    /// ```compile_fail,E0502
    /// # use rknn_matmul::{Runtime, Platform, I8xI8ToI32, Layout};
    /// # let rt = Runtime::emulator(Platform::Rk3588).unwrap();
    /// let mm = rt.matmul::<I8xI8ToI32>(1, 32, 32).b_layout(Layout::Native).build().unwrap();
    /// let mut b = mm.alloc_b().unwrap();
    /// mm.b_to_native(b.as_slice(), &mut b).unwrap(); // error: `b` is borrowed twice
    /// ```
    pub fn b_to_native<S: Element>(&self, src: &[S], dst: &mut TensorMem<K::B>) -> Result<()> {
        let (m, k, n) = self.shape();
        let int4 = K::B::KIND == ElemKind::I4;
        let expected = if int4 { ElemKind::I8 } else { K::B::KIND };
        if S::KIND != expected {
            return Err(Error::ElementKind {
                what: "B source",
                expected,
                got: S::KIND,
                matmul_type: K::TYPE.c_name(),
            });
        }
        if self.b_layout != Layout::Native {
            return Err(Error::NeedsNativeB {
                operation: "b_to_native",
                layout: self.b_layout,
            });
        }
        // K × N was bounded when the context was built.
        if src.len() != k * n {
            return Err(Error::Length {
                what: "B source (K × N, normal layout)",
                expected: k * n,
                got: src.len(),
            });
        }
        if !dst.belongs_to(&self.handle) {
            return Err(Error::ForeignMemory { matrix: Matrix::B });
        }
        let needed = u64::from(self.io_attr().B.size);
        if dst.bytes() < needed {
            return Err(Error::MemoryTooSmall {
                matrix: Matrix::B,
                bytes: dst.bytes(),
                needed,
            });
        }
        // The source's bytes, little-endian (one copy, not one allocation per element: an
        // engine converts every int4 weight of a model through here).
        let bytes: Vec<u8> = if cfg!(target_endian = "little") {
            crate::dtype::as_bytes(src).to_vec()
        } else {
            src.iter().flat_map(|v| v.to_le_bytes_vec()).collect()
        };
        let input: Vec<u8> = if int4 {
            if let Some((index, &b)) = bytes
                .iter()
                .enumerate()
                .find(|(_, b)| !(-8..=7).contains(&(**b as i8)))
            {
                return Err(Error::OutOfRange {
                    what: "int4 B source",
                    index,
                    value: i64::from(b as i8),
                    range: "-8..=7",
                });
            }
            match self.runtime().int4_converter_input() {
                Int4ConverterInput::OnePerByte => bytes,
                Int4ConverterInput::Packed => {
                    let values: Vec<i8> = bytes.iter().map(|&b| b as i8).collect();
                    let mut out = vec![0u8; values.len().div_ceil(2)];
                    rknn_chip::layout::pack_i4(&values, &mut out);
                    out
                }
            }
        } else {
            bytes
        };
        let mut info = sys::rknn_matmul_info {
            M: m as i32,
            K: k as i32,
            N: n as i32,
            type_: K::TYPE.raw(),
            B_layout: Layout::Native.raw() as i16,
            ..Default::default()
        };
        let mut out = vec![0u8; std::mem::size_of_val(dst.as_slice())];
        self.runtime().call(|api| {
            result::b_normal_to_native(api, &input, &mut out, k as i32, n as i32, &mut info)
        })?;
        for (d, bytes) in dst
            .as_mut_slice()
            .iter_mut()
            .zip(out.chunks_exact(std::mem::size_of::<K::B>()))
        {
            *d = K::B::from_le_bytes_slice(bytes);
        }
        Ok(())
    }
}
