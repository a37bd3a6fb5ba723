//! One matmul context: its configuration, the data taken at `set_io_mem`, and the arithmetic
//! of `rknn_matmul_run` for every matmul type.

use half::f16;
use half::slice::HalfFloatSliceExt;
use rknn_chip::layout::{self, NativeB, TensorDesc};
use rknn_chip::{ElemKind, Layout, MatmulConfig, MatmulType, Platform, QuantGranularity, Tiles};
use rknn_sys as sys;

use crate::config::{EmuConfig, Overflow, Rounding};
use crate::kernels;

/// Quantisation parameters of one matrix, copied from `rknn_matmul_set_quant_params`.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct QuantParams {
    pub(crate) scale: Vec<f32>,
    pub(crate) zp: Vec<i32>,
}

/// The documented defaults: per-layer, scale 1.0, zero point 0 (missing entries read as such).
static DEFAULT_QUANT: QuantParams = QuantParams {
    scale: Vec::new(),
    zp: Vec::new(),
};

impl QuantParams {
    fn scale(&self, i: usize) -> f32 {
        self.scale.get(i).copied().unwrap_or(1.0)
    }
    fn zp(&self, i: usize) -> i32 {
        self.zp.get(i).copied().unwrap_or(0)
    }
}

/// A or B as read at bind time, in the kernel's canonical form.
enum Operand {
    /// Integers (i8, or i4 widened to i8): A as [M, K], B as [N, K].
    Int(Vec<i8>),
    /// Floats (f16 widened, or int B dequantised for the float types): A [M, K], B [N, K].
    Float(Vec<f32>),
}

/// Which memory a matrix is bound to: its registry key and its unique id, so that a memory
/// destroyed after binding is noticed even when a new one reuses its address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct MemRef {
    pub(crate) key: usize,
    pub(crate) id: u64,
}

/// The state of one context.
pub(crate) struct Context {
    pub(crate) base: MatmulConfig,
    pub(crate) shapes: Vec<(usize, usize, usize)>,
    pub(crate) current: usize,
    pub(crate) descs: Vec<[TensorDesc; 3]>,
    pub(crate) domain: i32,
    pub(crate) core_mask: u32,
    /// N and K that the quantisation parameters describe: the context's (every shape's when B
    /// is NORM or NATIVE, which fixes them; the largest for TP_NORM B, as the vendor's
    /// dynamic-shape demo sizes its arrays).
    quant_n: usize,
    quant_k: usize,
    quant: [Option<QuantParams>; 3],
    a: Option<Operand>,
    /// B as read at bind time, and the (K, N) of the shape it was bound for: B stays bound
    /// across `set_dynamic_shape` ("B can not be dynamic, only call set_io_mem once").
    b: Option<(Operand, (usize, usize))>,
    /// The memories A, B and C are bound to.
    pub(crate) bound: [Option<MemRef>; 3],
}

/// An error of a context call: the code returned to C and a message for diagnostics.
pub(crate) type CallResult<T = ()> = Result<T, (i32, String)>;

fn param(msg: impl Into<String>) -> (i32, String) {
    (sys::RKNN_ERR_PARAM_INVALID, msg.into())
}

/// `len` copies of `value`, or `RKNN_ERR_MALLOC_FAIL` when the host is out of memory: sizes
/// come from the caller, and an allocation abort would kill the C caller's process.
pub(crate) fn try_vec<T: Clone>(len: usize, value: T) -> CallResult<Vec<T>> {
    let mut v = Vec::new();
    v.try_reserve_exact(len).map_err(|_| {
        (
            sys::RKNN_ERR_MALLOC_FAIL,
            format!(
                "out of host memory for {len} elements of {} bytes",
                std::mem::size_of::<T>()
            ),
        )
    })?;
    v.resize(len, value);
    Ok(v)
}

impl Context {
    pub(crate) fn new(
        base: MatmulConfig,
        shapes: Vec<(usize, usize, usize)>,
        descs: Vec<[TensorDesc; 3]>,
        domain: i32,
    ) -> Context {
        let quant_n = shapes.iter().map(|s| s.2).max().unwrap_or(base.n);
        let quant_k = shapes.iter().map(|s| s.1).max().unwrap_or(base.k);
        Context {
            base,
            shapes,
            current: 0,
            descs,
            domain,
            core_mask: 0,
            quant_n,
            quant_k,
            quant: [None, None, None],
            a: None,
            b: None,
            bound: [None; 3],
        }
    }

    /// The quant params of A (0), B (1) or C (2), or the defaults when none were set.
    fn quant_or_default(&self, which: usize) -> &QuantParams {
        self.quant[which].as_ref().unwrap_or(&DEFAULT_QUANT)
    }

    /// The configuration of the current shape.
    pub(crate) fn cfg(&self) -> MatmulConfig {
        let (m, k, n) = self.shapes[self.current];
        MatmulConfig {
            m,
            k,
            n,
            ..self.base
        }
    }

    pub(crate) fn current_descs(&self) -> &[TensorDesc; 3] {
        &self.descs[self.current]
    }

    /// Selects a creation shape. A and C are unbound, since their sizes change and the
    /// documented order is set_dynamic_shape, then set_io_mem; B stays bound, as the vendor's
    /// dynamic-shape usage binds it once (a TP_NORM B whose K or N changes must be bound again:
    /// `run` says so).
    pub(crate) fn set_shape(&mut self, m: usize, k: usize, n: usize) -> CallResult {
        let i = self
            .shapes
            .iter()
            .position(|&s| s == (m, k, n))
            .ok_or_else(|| {
                param(format!(
                    "shape M={m} K={k} N={n} is not one of the {} shapes given at creation",
                    self.shapes.len()
                ))
            })?;
        self.current = i;
        self.a = None;
        self.bound[0] = None;
        self.bound[2] = None;
        Ok(())
    }

    /// Stores quantisation parameters for "A", "B" or "C", checking their lengths.
    pub(crate) fn set_quant(&mut self, name: &str, scale: Vec<f32>, zp: Vec<i32>) -> CallResult {
        let cfg = self.cfg();
        let (slot, expected) = match name {
            "A" => (0, 1),
            "B" => (
                1,
                match cfg.b_quant.granularity {
                    QuantGranularity::PerLayer => 1,
                    QuantGranularity::PerChannel => self.quant_n,
                    QuantGranularity::PerGroup => self.quant_n * (self.quant_k / cfg.group_size),
                },
            ),
            "C" => (
                2,
                if cfg.ac_quant.granularity == QuantGranularity::PerChannel {
                    self.quant_n
                } else {
                    1
                },
            ),
            other => {
                return Err(param(format!(
                    "quant params name {other:?} is not \"A\", \"B\" or \"C\""
                )));
            }
        };
        if scale.len() != expected {
            return Err(param(format!(
                "{name}: scale_len={} but {expected} expected for this quant type",
                scale.len()
            )));
        }
        if !zp.is_empty() && zp.len() != expected {
            return Err(param(format!(
                "{name}: zp_len={} but 0 or {expected} expected",
                zp.len()
            )));
        }
        if scale.iter().any(|s| !s.is_finite() || *s <= 0.0) {
            return Err(param(format!("{name}: scales must be positive and finite")));
        }
        self.quant[slot] = Some(QuantParams { scale, zp });
        Ok(())
    }

    /// The single normalised scale of `rknn_matmul_get_quant_params` (i8 → i32, per-channel B).
    /// What the runtime normalises is \[open\]; the emulator reports the largest B scale, and
    /// writes the per-channel scales divided by it when the caller passes an array.
    pub(crate) fn normalised_b_scale(&self) -> CallResult<(f32, Vec<f32>)> {
        let cfg = self.cfg();
        if cfg.t != MatmulType::I8_I8_I32 || cfg.b_quant.granularity != QuantGranularity::PerChannel
        {
            return Err(param(
                "get_quant_params is only for RKNN_INT8_MM_INT8_TO_INT32 with per-channel B",
            ));
        }
        let b = self.quant[1]
            .as_ref()
            .ok_or_else(|| param("B has no quant params yet"))?;
        let max = b.scale.iter().copied().fold(0.0f32, f32::max);
        Ok((max, b.scale.iter().map(|s| s / max).collect()))
    }

    /// Takes A or B from memory at bind time, as the runtime does (it may rearrange the data at
    /// this point, so later writes are not seen until the next bind).
    pub(crate) fn bind_input(
        &mut self,
        platform: Platform,
        which: usize,
        bytes: &[u8],
        mem: MemRef,
    ) -> CallResult {
        let cfg = self.cfg();
        let desc = self.current_descs()[which];
        let tiles = platform
            .tiles(cfg.t)
            .ok_or_else(|| param("no tiles for this type"))?;
        let count = desc.elements();
        let operand = match desc.kind {
            ElemKind::I8 | ElemKind::I4 => {
                let mut v = try_vec(count, 0i8)?;
                if desc.kind == ElemKind::I4 {
                    layout::unpack_i4(bytes, &mut v);
                } else {
                    v.iter_mut().zip(bytes).for_each(|(d, &s)| *d = s as i8);
                }
                Operand::Int(v)
            }
            ElemKind::F16 => {
                let mut h = try_vec(count, f16::ZERO)?;
                h.iter_mut()
                    .zip(bytes.chunks_exact(2))
                    .for_each(|(d, c)| *d = f16::from_le_bytes([c[0], c[1]]));
                let mut v = try_vec(count, 0f32)?;
                h.convert_to_f32_slice(&mut v);
                Operand::Float(v)
            }
            other => return Err(param(format!("input of kind {other} cannot be bound"))),
        };
        let seg = platform.k_segment();
        let operand = match operand {
            Operand::Int(v) => Operand::Int(canonical(&v, which, &desc, &cfg, tiles, seg)?),
            Operand::Float(v) => Operand::Float(canonical(&v, which, &desc, &cfg, tiles, seg)?),
        };
        if which == 0 {
            self.a = Some(operand);
        } else {
            self.b = Some((self.dequantise_b(operand)?, (cfg.k, cfg.n)));
        }
        self.bound[which] = Some(mem);
        Ok(())
    }

    /// For the float-A types with integer B, turns B into floats with B's quant params.
    fn dequantise_b(&self, bt: Operand) -> CallResult<Operand> {
        let cfg = self.cfg();
        Ok(match bt {
            Operand::Int(v) if cfg.t.a == ElemKind::F16 => {
                let q = self.quant_or_default(1);
                let (n, k) = (cfg.n, cfg.k);
                let mut out = try_vec(v.len(), 0f32)?;
                for col in 0..n {
                    for kk in 0..k {
                        let i = b_param_index(&cfg, self.quant_n, kk, col);
                        out[col * k + kk] =
                            (i32::from(v[col * k + kk]) - q.zp(i)) as f32 * q.scale(i);
                    }
                }
                Operand::Float(out)
            }
            other => other,
        })
    }

    pub(crate) fn unbind_all(&mut self) {
        self.a = None;
        self.b = None;
        self.bound = [None; 3];
    }

    /// Checks that A and B are bound, for the current shape.
    pub(crate) fn require_inputs(&self) -> CallResult {
        self.inputs().map(|_| ())
    }

    fn inputs(&self) -> CallResult<(&Operand, &Operand)> {
        let cfg = self.cfg();
        Ok(match (&self.a, &self.b) {
            (Some(a), Some((b, (bk, bn)))) => {
                if (*bk, *bn) != (cfg.k, cfg.n) {
                    return Err((
                        sys::RKNN_ERR_INPUT_INVALID,
                        format!(
                            "B was bound for K={bk} N={bn} but the current shape has K={} N={}: bind B again after set_dynamic_shape",
                            cfg.k, cfg.n
                        ),
                    ));
                }
                (a, b)
            }
            _ => {
                return Err((
                    sys::RKNN_ERR_INPUT_INVALID,
                    "A and B must be bound with set_io_mem before run (after set_dynamic_shape, bind A and C again; B stays bound)".into(),
                ));
            }
        })
    }

    /// Computes C for the bound inputs and returns it as bytes in C's layout.
    pub(crate) fn run(&self, emu: &EmuConfig) -> CallResult<Vec<u8>> {
        let cfg = self.cfg();
        let (a, b) = self.inputs()?;
        let (m, k, n) = (cfg.m, cfg.k, cfg.n);
        let out = match (a, b) {
            (Operand::Int(a), Operand::Int(bt)) => self.run_int(emu, &cfg, a, bt)?,
            (Operand::Float(a), Operand::Float(bt)) => {
                let mut c = try_vec(m * n, 0f32)?;
                kernels::gemm_f32(a, bt, &mut c, m, n, k);
                match cfg.t.c {
                    ElemKind::F16 => Out::F16(c.iter().map(|&x| f16::from_f32(x)).collect()),
                    _ => Out::F32(c),
                }
            }
            _ => {
                return Err((
                    sys::RKNN_ERR_FAIL,
                    "operand kinds do not match the matmul type".into(),
                ));
            }
        };
        let desc = self.current_descs()[2];
        let c_n = emu.platform.tiles(cfg.t).map_or(4, |t| t.c_n);
        Ok(out.into_bytes(desc.layout == Layout::Native, m, n, c_n))
    }

    fn run_int(&self, emu: &EmuConfig, cfg: &MatmulConfig, a: &[i8], bt: &[i8]) -> CallResult<Out> {
        let (m, k, n) = (cfg.m, cfg.k, cfg.n);
        let mut acc = try_vec(m * n, 0i32)?;
        Ok(match cfg.t.c {
            ElemKind::I32 => {
                kernels::gemm_i8_i32(a, bt, &mut acc, m, n, k);
                Out::I32(acc)
            }
            ElemKind::I16 => {
                kernels::gemm_i8_i32(a, bt, &mut acc, m, n, k);
                Out::I16(
                    acc.iter()
                        .map(|&x| match emu.i16_overflow {
                            Overflow::Saturate => x.clamp(i16::MIN.into(), i16::MAX.into()) as i16,
                            Overflow::Wrap => x as i16,
                        })
                        .collect(),
                )
            }
            // i8 → f32 and i8 → i8: dequantised sums, per K group when B is per-group.
            ElemKind::F32 | ElemKind::I8 => {
                let real = self.dequantised_sums(cfg, a, bt)?;
                if cfg.t.c == ElemKind::F32 {
                    return Ok(Out::F32(real.iter().map(|&r| r as f32).collect()));
                }
                let qc = self.quant_or_default(2);
                Out::I8(
                    real.iter()
                        .enumerate()
                        .map(|(i, &r)| {
                            let col = i % n;
                            // Per-channel C has one entry per column (checked at set_quant_params).
                            let ci = if qc.scale.len() > 1 { col } else { 0 };
                            let q = round(r / f64::from(qc.scale(ci)), emu.rounding)
                                + f64::from(qc.zp(ci));
                            q.clamp(-128.0, 127.0) as i8
                        })
                        .collect(),
                )
            }
            _ => Out::I32(acc),
        })
    }

    /// sA * sum over K groups of sB(g, n) * sum_{k in g} (a - zA)(b - zB(g, n)), exactly in the
    /// integer part: the zero points are folded in with the row and column sums
    /// (sum (a-za)(b-zb) = sum ab - zb sum a - za sum b + K za zb) so the i8 kernel stays exact.
    /// Computed in f64, so that the i8 → i8 requantisation rounds the exact product of the
    /// integer sum and the scales (up to one f64 rounding), not an f32 approximation of it.
    fn dequantised_sums(&self, cfg: &MatmulConfig, a: &[i8], bt: &[i8]) -> CallResult<Vec<f64>> {
        let (m, k, n) = (cfg.m, cfg.k, cfg.n);
        let qa = self.quant_or_default(0);
        let qb = self.quant_or_default(1);
        let group = if cfg.b_quant.granularity == QuantGranularity::PerGroup {
            cfg.group_size
        } else {
            k
        };
        let za = i64::from(qa.zp(0));
        let mut real = try_vec(m * n, 0f64)?;
        let mut acc = try_vec(m * n, 0i32)?;
        let (mut ag, mut bg) = (vec![0i8; m * group], vec![0i8; n * group]);
        for g0 in (0..k).step_by(group) {
            let (asub, bsub): (&[i8], &[i8]) = if group == k {
                (a, bt)
            } else {
                for r in 0..m {
                    ag[r * group..(r + 1) * group]
                        .copy_from_slice(&a[r * k + g0..r * k + g0 + group]);
                }
                for c in 0..n {
                    bg[c * group..(c + 1) * group]
                        .copy_from_slice(&bt[c * k + g0..c * k + g0 + group]);
                }
                (&ag, &bg)
            };
            kernels::gemm_i8_i32(asub, bsub, &mut acc, m, n, group);
            let row_sums: Vec<i64> = (0..m)
                .map(|r| {
                    asub[r * group..(r + 1) * group]
                        .iter()
                        .map(|&x| i64::from(x))
                        .sum()
                })
                .collect();
            let col_sums: Vec<i64> = (0..n)
                .map(|c| {
                    bsub[c * group..(c + 1) * group]
                        .iter()
                        .map(|&x| i64::from(x))
                        .sum()
                })
                .collect();
            for r in 0..m {
                for c in 0..n {
                    let pi = b_param_index(cfg, self.quant_n, g0, c);
                    let zb = i64::from(qb.zp(pi));
                    let exact = i64::from(acc[r * n + c]) - zb * row_sums[r] - za * col_sums[c]
                        + group as i64 * za * zb;
                    real[r * n + c] +=
                        exact as f64 * f64::from(qa.scale(0)) * f64::from(qb.scale(pi));
                }
            }
        }
        Ok(real)
    }
}

/// Index into B's quant arrays for element (k, n): per-layer 0, per-channel n, per-group
/// `(k / G) * stride_n + n` (order `[K/G][N]`, inferred: \[open\]; `stride_n` is the context's
/// N, which the arrays were sized for).
fn b_param_index(cfg: &MatmulConfig, stride_n: usize, k: usize, n: usize) -> usize {
    match cfg.b_quant.granularity {
        QuantGranularity::PerLayer => 0,
        QuantGranularity::PerChannel => n,
        QuantGranularity::PerGroup => (k / cfg.group_size) * stride_n + n,
    }
}

fn round(x: f64, mode: Rounding) -> f64 {
    match mode {
        Rounding::HalfAwayFromZero => x.round(),
        Rounding::HalfEven => {
            let r = x.round();
            if (x - x.trunc()).abs() == 0.5 && r % 2.0 != 0.0 {
                r - x.signum()
            } else {
                r
            }
        }
    }
}

fn transpose<T: Copy>(src: &[T], rows: usize, cols: usize, dst: &mut [T]) {
    for r in 0..rows {
        for c in 0..cols {
            dst[c * rows + r] = src[r * cols + c];
        }
    }
}

/// Reads A (`which` 0) into [M, K] or B (`which` 1) into [N, K] from the bound layout.
fn canonical<T: Copy + Default>(
    src: &[T],
    which: usize,
    desc: &TensorDesc,
    cfg: &MatmulConfig,
    tiles: Tiles,
    segment: Option<usize>,
) -> CallResult<Vec<T>> {
    let (m, k, n) = (cfg.m, cfg.k, cfg.n);
    // The descriptor's element count was checked at creation; these products are below it.
    if which == 0 {
        let mut d = try_vec(m * k, T::default())?;
        match desc.layout {
            Layout::Native => layout::unpack_a_native(src, m, k, tiles.a_k, &mut d),
            _ => d.copy_from_slice(&src[..m * k]),
        }
        Ok(d)
    } else {
        let mut d = try_vec(k * n, T::default())?;
        match desc.layout {
            Layout::Native => NativeB::new(k, n, tiles.b_n, tiles.b_k, segment)
                .ok_or_else(|| param(format!("native B of K={k} N={n} has no layout")))?
                .unpack_to_nk(src, &mut d),
            Layout::TpNorm => d.copy_from_slice(&src[..k * n]),
            Layout::Norm => transpose(src, k, n, &mut d),
        }
        Ok(d)
    }
}

/// The result of a run in row-major [M, N], before layout and serialisation.
enum Out {
    I32(Vec<i32>),
    I16(Vec<i16>),
    I8(Vec<i8>),
    F32(Vec<f32>),
    F16(Vec<f16>),
}

impl Out {
    fn into_bytes(self, native: bool, m: usize, n: usize, c_n: usize) -> Vec<u8> {
        fn lay<T: Copy + Default>(
            v: Vec<T>,
            native: bool,
            m: usize,
            n: usize,
            c_n: usize,
        ) -> Vec<T> {
            if !native {
                return v;
            }
            // C's descriptor (checked at creation) has exactly this many elements.
            let len = layout::native_c_len(m, n, c_n).unwrap_or(0);
            let mut d = vec![T::default(); len];
            layout::pack_c_native(&v, m, n, c_n, &mut d);
            d
        }
        match self {
            Out::I32(v) => lay(v, native, m, n, c_n)
                .iter()
                .flat_map(|x| x.to_le_bytes())
                .collect(),
            Out::I16(v) => lay(v, native, m, n, c_n)
                .iter()
                .flat_map(|x| x.to_le_bytes())
                .collect(),
            Out::I8(v) => lay(v, native, m, n, c_n).iter().map(|&x| x as u8).collect(),
            Out::F32(v) => lay(v, native, m, n, c_n)
                .iter()
                .flat_map(|x| x.to_le_bytes())
                .collect(),
            Out::F16(v) => lay(v, native, m, n, c_n)
                .iter()
                .flat_map(|x| x.to_le_bytes())
                .collect(),
        }
    }
}
