//! Typed matmul contexts: validated per chip before any FFI call, with memories that borrow
//! them, runs that bind and sync by construction, and one owner thread at a time.

use std::cell::Cell;
use std::marker::PhantomData;

use rknn_chip::{Layout, MatmulType, QuantGranularity, QuantType, Tiles};
use rknn_sys as sys;

use crate::dtype::{Element, MatmulKind};
use crate::error::{Error, Result};
use crate::mem::TensorMem;
use crate::runtime::Runtime;

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
pub struct MatmulBuilder<'rt, K: MatmulKind> {
    rt: &'rt Runtime,
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
    pub fn matmul<K: MatmulKind>(&self, m: usize, k: usize, n: usize) -> MatmulBuilder<'_, K> {
        MatmulBuilder {
            rt: self,
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

impl<'rt, K: MatmulKind> MatmulBuilder<'rt, K> {
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
            None | Some(BQuant::PerLayer { .. }) => (
                QuantGranularity::PerLayer,
                matches!(self.quant_b, Some(BQuant::PerLayer { zp, .. }) if zp != 0),
            ),
            Some(BQuant::PerChannel { zps, .. }) => (QuantGranularity::PerChannel, !zps.is_empty()),
            Some(BQuant::PerGroup { zps, .. }) => (QuantGranularity::PerGroup, !zps.is_empty()),
        };
        QuantType {
            granularity,
            asymmetric,
        }
    }

    /// Checks everything the chip's rules say, without calling the runtime.
    fn validate(&self) -> Result<Vec<usize>> {
        let p = self.rt.platform();
        let t = K::TYPE;
        rknn_chip::check_type(p, t)?;
        rknn_chip::check_kn(p, &self.rt_rules(), t, self.k, self.n)?;
        if self.ac_layout == Layout::TpNorm {
            return Err(Error::Invalid(
                "TP_NORM is a layout of B only; A and C take NORM or NATIVE".into(),
            ));
        }
        if p == rknn_chip::Platform::Rk3588
            && t == MatmulType::I4_I4_I16
            && self.b_layout != Layout::Native
        {
            return Err(Error::Invalid("RKNN_INT4_MM_INT4_TO_INT16 on RK3588 needs B in the native layout (normal B fails at set_io_mem on the hardware)".into()));
        }
        let ms = self.dynamic_m.clone().unwrap_or_else(|| vec![self.m]);
        if ms.is_empty() || ms.len() > sys::RKNN_MAX_DYNAMIC_SHAPE_NUM as usize {
            return Err(Error::Invalid(format!(
                "dynamic M needs 1..={} values, got {}",
                sys::RKNN_MAX_DYNAMIC_SHAPE_NUM,
                ms.len()
            )));
        }
        if let Some(&bad) = ms.iter().find(|&&m| m == 0 || m > i32::MAX as usize) {
            return Err(Error::Rule(rknn_chip::RuleViolation::NotPositive {
                dim: rknn_chip::Dim::M,
                value: bad as i64,
            }));
        }
        for (i, m) in ms.iter().enumerate() {
            if ms[..i].contains(m) {
                return Err(Error::Invalid(format!(
                    "dynamic M value {m} is given twice"
                )));
            }
        }
        if let Some(q) = &self.quant_b {
            let (len, zlen, what) = match q {
                BQuant::PerLayer { .. } => (1, 1, 1),
                BQuant::PerChannel { scales, zps } => (scales.len(), zps.len().max(self.n), self.n),
                BQuant::PerGroup {
                    group_size,
                    scales,
                    zps,
                } => {
                    if *group_size == 0
                        || self.k % group_size != 0
                        || *group_size > i16::MAX as usize
                    {
                        return Err(Error::Rule(rknn_chip::RuleViolation::BadGroupSize {
                            group_size: *group_size as i64,
                            k: self.k,
                        }));
                    }
                    let want = self.n * self.k / group_size;
                    (scales.len(), zps.len().max(want), want)
                }
            };
            if len != what {
                return Err(Error::Size {
                    what: "B quant scales",
                    expected: what,
                    got: len,
                });
            }
            if zlen != what {
                return Err(Error::Size {
                    what: "B quant zero points",
                    expected: what,
                    got: zlen,
                });
            }
        }
        if let Core::Index(i) = self.core {
            if i >= p.npu_cores() || !p.has_core_mask() {
                return Err(Error::Invalid(format!(
                    "{p} has {} NPU core(s){}: core {i} does not exist",
                    p.npu_cores(),
                    if p.has_core_mask() {
                        ""
                    } else {
                        " and no core selection"
                    }
                )));
            }
        }
        Ok(ms)
    }

    fn rt_rules(&self) -> rknn_chip::ShapeRules {
        match self.rt.emulator_instance() {
            Some(e) => e.rules(),
            None => rknn_chip::ShapeRules::accepted(self.rt.platform()),
        }
    }

    /// Validates and creates the context.
    pub fn build(self) -> Result<Matmul<'rt, K>> {
        let ms = self.validate()?;
        let rt = self.rt;
        let api = rt.api();
        let mut info = sys::rknn_matmul_info {
            M: self.m as i32,
            K: self.k as i32,
            N: self.n as i32,
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
            group_size: match &self.quant_b {
                Some(BQuant::PerGroup { group_size, .. }) => *group_size as i16,
                _ => 0,
            },
            ..Default::default()
        };
        let mut ctx: sys::rknn_matmul_ctx = 0;
        let shapes: Vec<(usize, usize, usize)> = ms.iter().map(|&m| (m, self.k, self.n)).collect();
        let ios = if self.dynamic_m.is_some() {
            let create = api.rknn_matmul_create_dynamic_shape.ok_or_else(|| {
                Error::Invalid("this runtime has no rknn_matmul_create_dynamic_shape".into())
            })?;
            let mut sh: Vec<sys::rknn_matmul_shape> = shapes
                .iter()
                .map(|&(m, k, n)| sys::rknn_matmul_shape {
                    M: m as i32,
                    K: k as i32,
                    N: n as i32,
                })
                .collect();
            let mut ios = vec![sys::rknn_matmul_io_attr::default(); sh.len()];
            // SAFETY: `sh` and `ios` hold `shape_num` entries each; the other pointers are valid.
            let rc = unsafe {
                create(
                    &mut ctx,
                    &mut info,
                    sh.len() as i32,
                    sh.as_mut_ptr(),
                    ios.as_mut_ptr(),
                )
            };
            rt.check("rknn_matmul_create_dynamic_shape", rc)?;
            ios
        } else {
            let mut io = sys::rknn_matmul_io_attr::default();
            // SAFETY: valid pointers for the call.
            rt.check("rknn_matmul_create", unsafe {
                (api.rknn_matmul_create)(&mut ctx, &mut info, &mut io)
            })?;
            vec![io]
        };
        let core = ContextCore::new(rt, ctx, ios, shapes, K::TYPE, self.ac_layout, self.b_layout);
        if let Core::Index(i) = self.core {
            // SAFETY: a live context.
            rt.check("rknn_matmul_set_core_mask", unsafe {
                (api.rknn_matmul_set_core_mask)(ctx, 1 << i)
            })?;
        }
        core.set_quant("A", self.quant_a.map(|q| (vec![q.scale], vec![q.zp])))?;
        core.set_quant(
            "B",
            self.quant_b.map(|q| match q {
                BQuant::PerLayer { scale, zp } => (vec![scale], vec![zp]),
                BQuant::PerChannel { scales, zps } | BQuant::PerGroup { scales, zps, .. } => {
                    (scales, zps)
                }
            }),
        )?;
        core.set_quant("C", self.quant_c.map(|q| (vec![q.scale], vec![q.zp])))?;
        Ok(Matmul {
            core,
            _k: PhantomData,
        })
    }
}

/// The untyped part of a context, which memories borrow.
pub(crate) struct ContextCore<'rt> {
    pub(crate) rt: &'rt Runtime,
    pub(crate) ctx: sys::rknn_matmul_ctx,
    ios: Vec<sys::rknn_matmul_io_attr>,
    shapes: Vec<(usize, usize, usize)>,
    current: Cell<usize>,
    /// What is bound to A, B, C: (memory id, generation at bind time).
    bound: [Cell<Option<(u64, u64)>>; 3],
    t: MatmulType,
    ac_layout: Layout,
    b_layout: Layout,
}

impl<'rt> ContextCore<'rt> {
    fn new(
        rt: &'rt Runtime,
        ctx: sys::rknn_matmul_ctx,
        ios: Vec<sys::rknn_matmul_io_attr>,
        shapes: Vec<(usize, usize, usize)>,
        t: MatmulType,
        ac_layout: Layout,
        b_layout: Layout,
    ) -> Self {
        ContextCore {
            rt,
            ctx,
            ios,
            shapes,
            current: Cell::new(0),
            bound: Default::default(),
            t,
            ac_layout,
            b_layout,
        }
    }

    fn set_quant(&self, name: &str, q: Option<(Vec<f32>, Vec<i32>)>) -> Result<()> {
        let Some((mut scale, mut zp)) = q else {
            return Ok(());
        };
        let set = self.rt.api().rknn_matmul_set_quant_params.ok_or_else(|| {
            Error::Invalid("this runtime has no rknn_matmul_set_quant_params".into())
        })?;
        let mut p = sys::rknn_quant_params::default();
        for (d, s) in p.name.iter_mut().zip(name.bytes()) {
            *d = std::ffi::c_char::from_ne_bytes([s]);
        }
        p.scale = scale.as_mut_ptr();
        p.scale_len = scale.len() as i32;
        if !zp.is_empty() {
            p.zp = zp.as_mut_ptr();
            p.zp_len = zp.len() as i32;
        }
        // SAFETY: `p` points into `scale`/`zp`, alive for the call; the runtime copies the arrays.
        self.rt.check("rknn_matmul_set_quant_params", unsafe {
            set(self.ctx, &mut p)
        })
    }

    pub(crate) fn forget(&self, id: u64) {
        for b in &self.bound {
            if b.get().is_some_and(|(i, _)| i == id) {
                b.set(None);
            }
        }
    }

    fn io(&self) -> &sys::rknn_matmul_io_attr {
        &self.ios[self.current.get()]
    }

    /// The largest size in bytes of matrix `which` over the shapes.
    fn max_bytes(&self, which: usize) -> usize {
        self.ios
            .iter()
            .map(|io| [io.A.size, io.B.size, io.C.size][which] as usize)
            .max()
            .unwrap_or(0)
    }

    fn attr(&self, which: usize) -> sys::rknn_matmul_tensor_attr {
        let io = self.io();
        [io.A, io.B, io.C][which]
    }

    /// Binds `mem` to `which` unless the same, unchanged memory is bound already; syncs inputs
    /// to the device first.
    fn bind<T: Element>(&self, which: usize, mem: &TensorMem<'_, T>) -> Result<()> {
        if !mem.belongs_to(self) {
            return Err(Error::Invalid(format!(
                "{} was allocated on another context",
                ["A", "B", "C"][which]
            )));
        }
        let stamp = mem.stamp();
        if self.bound[which].get() == Some(stamp) {
            return Ok(());
        }
        if which < 2 {
            mem.sync(sys::RKNN_MEMORY_SYNC_TO_DEVICE)?;
        }
        let mut attr = self.attr(which);
        // SAFETY: a live memory of this context, at least as large as the attr says (sized from
        // io_attr at allocation), and the attr the runtime returned.
        let rc = unsafe { (self.rt.api().rknn_matmul_set_io_mem)(self.ctx, mem.raw(), &mut attr) };
        self.rt.check("rknn_matmul_set_io_mem", rc)?;
        self.bound[which].set(Some(stamp));
        Ok(())
    }
}

impl Drop for ContextCore<'_> {
    fn drop(&mut self) {
        // Memories borrow the context, so all of them are gone already: the documented order.
        // SAFETY: a live context, destroyed once.
        let rc = unsafe { (self.rt.api().rknn_matmul_destroy)(self.ctx) };
        debug_assert_eq!(rc, 0, "rknn_matmul_destroy failed");
    }
}

/// A matmul context of type `K`: C = A × B on the NPU.
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
pub struct Matmul<'rt, K: MatmulKind> {
    core: ContextCore<'rt>,
    _k: PhantomData<K>,
}

impl<K: MatmulKind> std::fmt::Debug for Matmul<'_, K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Matmul")
            .field("type", &K::TYPE.c_name())
            .field("shape", &self.shape())
            .finish()
    }
}

impl<'rt, K: MatmulKind> Matmul<'rt, K> {
    /// The current (M, K, N).
    pub fn shape(&self) -> (usize, usize, usize) {
        self.core.shapes[self.core.current.get()]
    }

    /// The raw context handle, for calls the safe layer does not wrap. Using it is `unsafe`
    /// (through the runtime's function table); it stays valid while `self` lives, and must not
    /// be destroyed or used from another thread.
    pub fn as_raw(&self) -> sys::rknn_matmul_ctx {
        self.core.ctx
    }

    /// The runtime's descriptors of A, B and C for the current shape.
    pub fn io_attr(&self) -> &sys::rknn_matmul_io_attr {
        self.core.io()
    }

    /// Native tile sizes as the runtime reported them in `io_attr` (never hard-coded: the fact
    /// sheet says to read them from the returned dims). `None` for matrices in normal layout.
    pub fn tiles(&self) -> (Option<usize>, Option<(usize, usize)>, Option<usize>) {
        let io = self.core.io();
        let native = self.core.ac_layout == Layout::Native;
        (
            native.then_some(io.A.dims[2] as usize),
            (self.core.b_layout == Layout::Native)
                .then_some((io.B.dims[2] as usize, io.B.dims[3] as usize)),
            native.then_some(io.C.dims[2] as usize),
        )
    }

    /// The chip's tile table for this type (for code that packs before a context exists).
    pub fn chip_tiles(&self) -> Option<Tiles> {
        self.core.rt.platform().tiles(self.core.t)
    }

    fn alloc<T: Element>(&self, which: usize) -> Result<TensorMem<'_, T>> {
        let bytes = self.core.max_bytes(which);
        TensorMem::new(&self.core, bytes.div_ceil(std::mem::size_of::<T>()))
    }

    /// Allocates A, sized for the largest shape.
    pub fn alloc_a(&self) -> Result<TensorMem<'_, K::A>> {
        self.alloc(0)
    }

    /// Allocates B.
    pub fn alloc_b(&self) -> Result<TensorMem<'_, K::B>> {
        self.alloc(1)
    }

    /// Allocates C, sized for the largest shape.
    pub fn alloc_c(&self) -> Result<TensorMem<'_, K::C>> {
        self.alloc(2)
    }

    /// Selects M on a dynamic-shape context. Bindings are redone by the next run.
    pub fn set_m(&self, m: usize) -> Result<()> {
        let (_, k, n) = self.shape();
        let i = self
            .core
            .shapes
            .iter()
            .position(|s| s.0 == m)
            .ok_or_else(|| {
                Error::Invalid(format!(
                    "M={m} is not one of this context's shapes {:?}",
                    self.core.shapes.iter().map(|s| s.0).collect::<Vec<_>>()
                ))
            })?;
        if i == self.core.current.get() {
            return Ok(());
        }
        let set = self
            .core
            .rt
            .api()
            .rknn_matmul_set_dynamic_shape
            .ok_or_else(|| Error::Invalid("not a dynamic-shape context".into()))?;
        let mut s = sys::rknn_matmul_shape {
            M: m as i32,
            K: k as i32,
            N: n as i32,
        };
        // SAFETY: a live context and a valid shape pointer.
        let rc = unsafe { set(self.core.ctx, &mut s) };
        self.core.rt.check("rknn_matmul_set_dynamic_shape", rc)?;
        self.core.current.set(i);
        for b in &self.core.bound {
            b.set(None);
        }
        Ok(())
    }

    /// Runs C = A × B. Memories written since they were last bound are synced to the device
    /// and bound again first; C is synced back before this returns.
    pub fn run(
        &self,
        a: &TensorMem<'_, K::A>,
        b: &TensorMem<'_, K::B>,
        c: &mut TensorMem<'_, K::C>,
    ) -> Result<()> {
        self.core.bind(0, a)?;
        self.core.bind(1, b)?;
        self.core.bind(2, c)?;
        // SAFETY: a live context with A, B and C bound to live memories (they borrow it).
        let rc = unsafe { (self.core.rt.api().rknn_matmul_run)(self.core.ctx) };
        self.core.rt.check("rknn_matmul_run", rc)?;
        c.sync(sys::RKNN_MEMORY_SYNC_FROM_DEVICE)
    }

    /// Converts B from normal [K, N] into the native layout in `dst`, with the chip's K
    /// segmentation (`rknn_B_normal_layout_to_native_layout`). For int4 B, `src` holds one value
    /// per element (-8..=7); they are passed packed two per byte or one per byte as
    /// `rknn_chip::Int4ConverterInput` says for this runtime (\[open\]). Source and destination cannot alias: `dst` is borrowed mutably, so
    /// the in-place conversion that corrupts B on the hardware cannot be written:
    ///
    /// ```compile_fail,E0502
    /// # use rknn_matmul::{Runtime, Platform, I8xI8ToI32, Layout};
    /// # let rt = Runtime::emulator(Platform::Rk3588).unwrap();
    /// let mm = rt.matmul::<I8xI8ToI32>(1, 32, 32).b_layout(Layout::Native).build().unwrap();
    /// let mut b = mm.alloc_b().unwrap();
    /// mm.b_to_native(b.as_slice(), &mut b).unwrap(); // error: `b` is borrowed twice
    /// ```
    pub fn b_to_native<S: Element>(&self, src: &[S], dst: &mut TensorMem<'_, K::B>) -> Result<()> {
        let (_, k, n) = self.shape();
        let expect_kind = if K::B::KIND == rknn_chip::ElemKind::I4 {
            rknn_chip::ElemKind::I8
        } else {
            K::B::KIND
        };
        if S::KIND != expect_kind {
            return Err(Error::Invalid(format!(
                "B source must be {expect_kind} for {}",
                K::TYPE.c_name()
            )));
        }
        if src.len() != k * n {
            return Err(Error::Size {
                what: "B (normal layout)",
                expected: k * n,
                got: src.len(),
            });
        }
        if self.core.b_layout != Layout::Native {
            return Err(Error::Invalid(
                "b_to_native needs a context with B in the native layout".into(),
            ));
        }
        let conv = self
            .core
            .rt
            .api()
            .rknn_B_normal_layout_to_native_layout
            .ok_or_else(|| Error::Invalid("this runtime has no B layout converter".into()))?;
        let needed = self.core.io().B.size as usize;
        if dst.len() * std::mem::size_of::<K::B>() < needed {
            return Err(Error::Size {
                what: "B memory bytes",
                expected: needed,
                got: dst.len() * std::mem::size_of::<K::B>(),
            });
        }
        let mut info = sys::rknn_matmul_info {
            M: self.shape().0 as i32,
            K: k as i32,
            N: n as i32,
            type_: K::TYPE.raw(),
            B_layout: 1,
            ..Default::default()
        };
        // int4 B: the converter's input form is [open] (rknn_chip::Int4ConverterInput); pass the
        // one the runtime is set to read (packed two per byte by default, as Rockchip's demos).
        let int4 = match self.core.rt.emulator_instance() {
            Some(e) => e.config().int4_converter_input,
            None => rknn_chip::Int4ConverterInput::from_env()
                .map_err(|e| Error::Invalid(e.to_string()))?,
        };
        let packed: Option<Vec<u8>> = if K::B::KIND == rknn_chip::ElemKind::I4
            && int4 == rknn_chip::Int4ConverterInput::Packed
        {
            let vals = src
                .iter()
                .map(|x| (x as &dyn std::any::Any).downcast_ref::<i8>().copied())
                .collect::<Option<Vec<i8>>>()
                .ok_or_else(|| Error::Invalid("int4 B source must be i8 values".into()))?;
            let mut bytes = vec![0u8; vals.len().div_ceil(2)];
            rknn_chip::layout::pack_i4(&vals, &mut bytes);
            Some(bytes)
        } else {
            None
        };
        let input: *const std::ffi::c_void = match &packed {
            Some(p) => p.as_ptr().cast(),
            None => src.as_ptr().cast(),
        };
        let out = dst.as_mut_slice();
        // SAFETY: the input holds K*N elements (checked; packed int4: K*N/2 bytes, the form the
        // runtime reads) and `out` the native size (checked); they cannot alias (shared vs unique
        // borrow, or a fresh vector); the converter only reads and writes within those sizes.
        let rc = unsafe {
            conv(
                input as *mut _,
                out.as_mut_ptr().cast(),
                k as i32,
                n as i32,
                &mut info,
            )
        };
        self.core
            .rt
            .check("rknn_B_normal_layout_to_native_layout", rc)
    }
}
