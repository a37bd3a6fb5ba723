//! One matmul context: its configuration, what is bound to it, and the arithmetic of
//! `rknn_matmul_run` for every matmul type.
//!
//! How a run reads its inputs depends on their layout (a documented choice, see
//! `docs/hardware-facts.md`): an input in a normal layout is taken at `set_io_mem` and kept in
//! the kernels' canonical form (the runtime "may rearrange" data at bind, so a write after it is
//! not seen until the next bind); an input in a native layout is already in the device's order,
//! with nothing to rearrange, so every run reads it from the memory's device view, as the NPU
//! reads its DMA buffers when it runs. No copy of native B (the weights) is kept, and the
//! matrix-vector product streams it from the memory in storage order.

use std::cell::RefCell;
use std::sync::Arc;
use std::time::Duration;

use half::f16;
use half::slice::HalfFloatSliceExt;
use rknn_chip::layout::{self, NativeB, TensorDesc};
use rknn_chip::{ElemKind, Layout, MatmulConfig, MatmulType, QuantGranularity, Tiles};
use rknn_sys as sys;

use crate::config::{EmuConfig, GroupOrder, NativeInputs, NibbleOrder, Overflow, Rounding};
use crate::cost::{Run, RunCost};
use crate::kernels::{self, NATIVE_B_SK, NativeBShape};
use crate::memory::Shared;

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

/// A or B in the kernel's canonical form.
enum Operand {
    /// Integers (i8, or i4 widened to i8): A as [M, K], B as [N, K].
    Int(Vec<i8>),
    /// Floats (f16 widened, or int B dequantised for the float types): A [M, K], B [N, K].
    Float(Vec<f32>),
}

/// A borrowed [`Operand`].
#[derive(Clone, Copy)]
enum OperandRef<'a> {
    Int(&'a [i8]),
    Float(&'a [f32]),
}

impl Operand {
    fn as_ref(&self) -> OperandRef<'_> {
        match self {
            Operand::Int(v) => OperandRef::Int(v),
            Operand::Float(v) => OperandRef::Float(v),
        }
    }
}

/// How a bound input reaches the arithmetic.
enum Input {
    /// Normal layouts: read at bind time into canonical form.
    Captured(Operand),
    /// Native layouts: read from the bound memory's device view at every run.
    Live,
}

/// The state of one context.
pub(crate) struct Context {
    pub(crate) base: MatmulConfig,
    pub(crate) shapes: Vec<(usize, usize, usize)>,
    pub(crate) current: usize,
    pub(crate) descs: Vec<[TensorDesc; 3]>,
    pub(crate) domain: i32,
    pub(crate) core_mask: u32,
    /// The order of per-group B quantisation parameters (\[open\], from the configuration).
    group_order: GroupOrder,
    /// N and K that the quantisation parameters describe: the context's (every shape's when B
    /// is NORM or NATIVE, which fixes them; the largest for TP_NORM B, as the vendor's
    /// dynamic-shape demo sizes its arrays).
    quant_n: usize,
    quant_k: usize,
    quant: [Option<QuantParams>; 3],
    a: Option<Input>,
    /// B, and the (K, N) of the shape it was bound for: B stays bound across
    /// `set_dynamic_shape` ("B can not be dynamic, only call set_io_mem once").
    b: Option<(Input, (usize, usize))>,
    /// The memories A, B and C are bound to. Holding them keeps their mappings alive during a
    /// run even if another thread destroys them meanwhile (the next run then fails).
    bound: [Option<Arc<Shared>>; 3],
    /// Its modelled device time, from its first run on (kept by [`crate::instance::Instance`]).
    pub(crate) modelled: Option<ContextModelled>,
    /// The last run costed and its cost: a context runs the same shape on the same core run
    /// after run, and the model's divisions and `Duration` conversion were a third of the
    /// accounting.
    pub(crate) last_cost: Option<(Run, RunCost, Duration)>,
}

/// Modelled device time of one context's runs.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ContextModelled {
    /// The core its runs were put on.
    pub core: usize,
    /// Runs counted.
    pub runs: u64,
    /// Their modelled device time.
    pub total: Duration,
    /// The cost of its last run.
    pub last: Option<RunCost>,
}

impl ContextModelled {
    /// Counts one more run, of cost `c` and modelled time `time`.
    pub(crate) fn add(&mut self, c: &RunCost, time: Duration) {
        self.runs += 1;
        self.total += time;
        self.last = Some(*c);
    }
}

/// An error of a context call: the code returned to C and a message for diagnostics.
pub(crate) type CallResult<T = ()> = Result<T, (i32, String)>;

fn param(msg: impl Into<String>) -> (i32, String) {
    (sys::RKNN_ERR_PARAM_INVALID, msg.into())
}

fn oom<T>(len: usize) -> (i32, String) {
    (
        sys::RKNN_ERR_MALLOC_FAIL,
        format!(
            "out of host memory for {len} elements of {} bytes",
            std::mem::size_of::<T>()
        ),
    )
}

/// `len` copies of `value`, or `RKNN_ERR_MALLOC_FAIL` when the host is out of memory: sizes
/// come from the caller, and an allocation abort would kill the C caller's process.
pub(crate) fn try_vec<T: Clone>(len: usize, value: T) -> CallResult<Vec<T>> {
    let mut v = Vec::new();
    v.try_reserve_exact(len).map_err(|_| oom::<T>(len))?;
    v.resize(len, value);
    Ok(v)
}

/// The first `len` elements of a reused buffer, grown if needed (its old contents stay: every
/// user overwrites what it reads), or `RKNN_ERR_MALLOC_FAIL`.
fn grow<T: Clone + Default>(v: &mut Vec<T>, len: usize) -> CallResult<&mut [T]> {
    if v.len() < len {
        v.try_reserve_exact(len - v.len())
            .map_err(|_| oom::<T>(len))?;
        v.resize(len, T::default());
    }
    Ok(&mut v[..len])
}

/// Buffers a run needs, kept per thread (each emulated NPU core is one thread) so that runs
/// allocate nothing once they have seen their largest shape, and no context holds buffers of
/// its own between runs.
#[derive(Default)]
struct Scratch {
    /// A's elements as read, before the native layout is undone.
    raw_i8: Vec<i8>,
    raw_f32: Vec<f32>,
    /// A in canonical form, when read at run time.
    a_i8: Vec<i8>,
    a_f32: Vec<f32>,
    /// A column panel of B in canonical form [w, K], unpacked from native B.
    panel_i8: Vec<i8>,
    panel_f32: Vec<f32>,
    /// A panel of results [M, w].
    sums_i32: Vec<i32>,
    sums_f32: Vec<f32>,
    /// B's bytes, when the same memory is also bound as C.
    b_copy: Vec<u8>,
}

/// Scratch buffers larger than this are freed after the run that needed them, so that an
/// occasional large run does not pin its memory on the thread.
const KEEP_BYTES: usize = 8 << 20;

impl Scratch {
    fn trim(&mut self) {
        fn trim<T>(v: &mut Vec<T>) {
            if v.capacity() * std::mem::size_of::<T>() > KEEP_BYTES {
                *v = Vec::new();
            }
        }
        trim(&mut self.raw_i8);
        trim(&mut self.raw_f32);
        trim(&mut self.a_i8);
        trim(&mut self.a_f32);
        trim(&mut self.panel_i8);
        trim(&mut self.panel_f32);
        trim(&mut self.sums_i32);
        trim(&mut self.sums_f32);
        trim(&mut self.b_copy);
    }
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

/// Bytes of canonical B per column panel: a panel and its rows of results stay in a per-core
/// L2 cache while every row of A goes past them.
const PANEL_BYTES: usize = 256 * 1024;

impl Context {
    pub(crate) fn new(
        base: MatmulConfig,
        shapes: Vec<(usize, usize, usize)>,
        descs: Vec<[TensorDesc; 3]>,
        domain: i32,
        group_order: GroupOrder,
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
            group_order,
            quant_n,
            quant_k,
            quant: [None, None, None],
            a: None,
            b: None,
            bound: [None, None, None],
            modelled: None,
            last_cost: None,
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

    /// Binds A (`which` 0), B (1) or C (2) to a memory. A or B in a normal layout is read now,
    /// as the runtime may rearrange data at this point (later writes are not seen until the
    /// next bind); in a native layout it is read by every run, unless the configuration says
    /// native inputs are read at bind too ([`NativeInputs`], \[open\]).
    pub(crate) fn bind(&mut self, emu: &EmuConfig, which: usize, mem: Arc<Shared>) -> CallResult {
        if which == 2 {
            self.bound[2] = Some(mem);
            return Ok(());
        }
        let platform = emu.platform;
        let cfg = self.cfg();
        let desc = self.current_descs()[which];
        let input = if desc.layout == Layout::Native && emu.native_inputs == NativeInputs::AtRun {
            Input::Live
        } else {
            let tiles = platform
                .tiles(cfg.t)
                .ok_or_else(|| param("no tiles for this type"))?;
            let view = mem.read();
            let mut bytes = &view.bytes()[..desc.size_bytes()];
            let swapped;
            if swaps_nibbles(emu, &desc) {
                let mut copy = try_vec(bytes.len(), 0u8)?;
                copy.copy_from_slice(bytes);
                swap_nibbles(&mut copy);
                swapped = copy;
                bytes = &swapped;
            }
            let operand = match elements(bytes, &desc)? {
                Operand::Int(v) => {
                    let mut d = Vec::new();
                    canonical(&v, which, &desc, &cfg, tiles, platform.k_segment(), &mut d)?;
                    Operand::Int(d)
                }
                Operand::Float(v) => {
                    let mut d = Vec::new();
                    canonical(&v, which, &desc, &cfg, tiles, platform.k_segment(), &mut d)?;
                    Operand::Float(d)
                }
            };
            Input::Captured(if which == 1 {
                self.dequantise_b(operand)?
            } else {
                operand
            })
        };
        if which == 0 {
            self.a = Some(input);
        } else {
            self.b = Some((input, (cfg.k, cfg.n)));
        }
        self.bound[which] = Some(mem);
        Ok(())
    }

    /// For the float-A types with integer B, turns B into floats with B's quant params.
    fn dequantise_b(&self, bt: Operand) -> CallResult<Operand> {
        let cfg = self.cfg();
        Ok(match bt {
            Operand::Int(v) if cfg.t.a == ElemKind::F16 => {
                let mut out = try_vec(v.len(), 0f32)?;
                self.dequantise_panel(&cfg, &v, 0, cfg.n, &mut out);
                Operand::Float(out)
            }
            other => other,
        })
    }

    /// Dequantises columns `j0..j0 + w` of int B, given as `bt` [w, K], into `out` [w, K].
    fn dequantise_panel(
        &self,
        cfg: &MatmulConfig,
        bt: &[i8],
        j0: usize,
        w: usize,
        out: &mut [f32],
    ) {
        let q = self.quant_or_default(1);
        let k = cfg.k;
        if cfg.b_quant.granularity == QuantGranularity::PerLayer {
            // One scale and zero point: the same arithmetic, without an index per element.
            let (zp, scale) = (q.zp(0), q.scale(0));
            for (o, &b) in out[..w * k].iter_mut().zip(&bt[..w * k]) {
                *o = (i32::from(b) - zp) as f32 * scale;
            }
            return;
        }
        for col in 0..w {
            for kk in 0..k {
                let i = b_param_index(self, cfg, kk, j0 + col);
                out[col * k + kk] = (i32::from(bt[col * k + kk]) - q.zp(i)) as f32 * q.scale(i);
            }
        }
    }

    pub(crate) fn unbind_all(&mut self) {
        self.a = None;
        self.b = None;
        self.bound = [None, None, None];
    }

    fn inputs(&self) -> CallResult<(&Input, &Input)> {
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

    /// `rknn_matmul_run`: computes C from the bound inputs and writes it into C's device view.
    pub(crate) fn run(&self, emu: &EmuConfig) -> CallResult {
        let (a_in, b_in) = self.inputs()?;
        let c_mem = self.bound[2].as_ref().ok_or_else(|| {
            (
                sys::RKNN_ERR_OUTPUT_INVALID,
                "C must be bound with set_io_mem before run".to_string(),
            )
        })?;
        // Inputs taken at bind time would still be at hand, but the board reads its memories
        // now: a memory destroyed since is a DMA from freed pages (an IOMMU fault).
        for (i, name) in [(0, "A"), (1, "B")] {
            if self.bound[i].as_ref().is_some_and(|m| m.is_destroyed()) {
                return Err((
                    sys::RKNN_ERR_INPUT_INVALID,
                    format!(
                        "{name}'s memory was destroyed after it was bound with set_io_mem (bound memories must stay alive until the context is destroyed)"
                    ),
                ));
            }
        }
        if c_mem.is_destroyed() {
            return Err(destroyed_c());
        }
        SCRATCH.with(|s| {
            // A run never calls back into the emulator, so the scratch is never borrowed twice.
            let mut s = s.borrow_mut();
            let r = self.compute(emu, a_in, b_in, c_mem, &mut s);
            s.trim();
            r
        })
    }

    fn compute(
        &self,
        emu: &EmuConfig,
        a_in: &Input,
        b_in: &Input,
        c_mem: &Arc<Shared>,
        s: &mut Scratch,
    ) -> CallResult {
        let cfg = self.cfg();
        let descs = *self.current_descs();
        let tiles = emu
            .platform
            .tiles(cfg.t)
            .ok_or_else(|| param("no tiles for this type"))?;
        let seg = emu.platform.k_segment();
        let Scratch {
            raw_i8,
            raw_f32,
            a_i8,
            a_f32,
            panel_i8,
            panel_f32,
            sums_i32,
            sums_f32,
            b_copy,
        } = s;
        let a = match a_in {
            Input::Captured(op) => op.as_ref(),
            Input::Live => {
                let mem = self.bound[0].as_ref().expect("a live input is bound");
                let view = mem.read();
                let bytes = &view.bytes()[..descs[0].size_bytes()];
                // Native A [K / a_k, M, a_k] with one row is A itself (then zero padding).
                let one_row = cfg.m == 1;
                match descs[0].kind {
                    ElemKind::I8 | ElemKind::I4 => {
                        let raw = grow(raw_i8, descs[0].elements())?;
                        read_ints(bytes, descs[0].kind, raw);
                        if one_row {
                            OperandRef::Int(&raw[..cfg.k])
                        } else {
                            canonical(raw, 0, &descs[0], &cfg, tiles, seg, a_i8)?;
                            OperandRef::Int(a_i8)
                        }
                    }
                    ElemKind::F16 => {
                        let raw = grow(raw_f32, descs[0].elements())?;
                        read_f16(bytes, raw);
                        if one_row {
                            OperandRef::Float(&raw[..cfg.k])
                        } else {
                            canonical(raw, 0, &descs[0], &cfg, tiles, seg, a_f32)?;
                            OperandRef::Float(a_f32)
                        }
                    }
                    other => return Err(param(format!("input of kind {other} cannot be bound"))),
                }
            }
        };
        let mut work = Work {
            ctx: self,
            cfg,
            a,
            sums_i32,
            sums_f32,
        };
        let c_len = descs[2].size_bytes();
        match b_in {
            Input::Captured(op) => {
                let mut c = c_mem.write();
                let mut out = CWriter::new(&mut c.bytes()[..c_len], self, emu, &descs[2], tiles);
                let bt = op.as_ref();
                let w = panel_width(cfg.n, cfg.k, 4, 1);
                for j0 in (0..cfg.n).step_by(w) {
                    let w = w.min(cfg.n - j0);
                    let panel = match bt {
                        OperandRef::Int(v) => OperandRef::Int(&v[j0 * cfg.k..(j0 + w) * cfg.k]),
                        OperandRef::Float(v) => OperandRef::Float(&v[j0 * cfg.k..(j0 + w) * cfg.k]),
                    };
                    work.panel(panel, j0, w, &mut out)?;
                }
                out.finish();
            }
            Input::Live => {
                let b_mem = self.bound[1].as_ref().expect("a live input is bound");
                let b_len = descs[1].size_bytes();
                let geo =
                    NativeB::new(cfg.k, cfg.n, tiles.b_n, tiles.b_k, seg).ok_or_else(|| {
                        param(format!("native B of K={} N={} has no layout", cfg.k, cfg.n))
                    })?;
                let swap = swaps_nibbles(emu, &descs[1]);
                if Arc::ptr_eq(b_mem, c_mem) || swap {
                    // B and C are one memory: read B first, then write C over it. (Or B's
                    // nibbles are stored high first: a copy in the kernels' order.)
                    let b = grow(b_copy, b_len)?;
                    b.copy_from_slice(&b_mem.read().bytes()[..b_len]);
                    if swap {
                        swap_nibbles(b);
                    }
                    let mut c = c_mem.write();
                    let mut out =
                        CWriter::new(&mut c.bytes()[..c_len], self, emu, &descs[2], tiles);
                    work.native_b(b, &geo, tiles, panel_i8, panel_f32, &mut out)?;
                    out.finish();
                } else {
                    // Two runs on two threads may lock the same memories crosswise (one's B is
                    // the other's C): take the locks in one global order.
                    let (b_view, mut c_view);
                    if Arc::as_ptr(b_mem) < Arc::as_ptr(c_mem) {
                        b_view = b_mem.read();
                        c_view = c_mem.write();
                    } else {
                        c_view = c_mem.write();
                        b_view = b_mem.read();
                    }
                    let b = &b_view.bytes()[..b_len];
                    let mut out =
                        CWriter::new(&mut c_view.bytes()[..c_len], self, emu, &descs[2], tiles);
                    work.native_b(b, &geo, tiles, panel_i8, panel_f32, &mut out)?;
                    out.finish();
                }
            }
        }
        Ok(())
    }

    /// sA * sum over K groups of sB(g, n) * sum_{k in g} (a - zA)(b - zB(g, n)), exactly in the
    /// integer part: the zero points are folded in with the row and column sums
    /// (sum (a-za)(b-zb) = sum ab - zb sum a - za sum b + K za zb) so the i8 kernel stays exact.
    /// Computed in f64, so that the i8 → i8 requantisation rounds the exact product of the
    /// integer sum and the scales (up to one f64 rounding), not an f32 approximation of it.
    /// `bt` holds columns `j0..j0 + w` of B ([w, K]); the result is [M, w].
    fn dequantised_sums(
        &self,
        cfg: &MatmulConfig,
        a: &[i8],
        bt: &[i8],
        j0: usize,
        w: usize,
    ) -> CallResult<Vec<f64>> {
        let (m, k) = (cfg.m, cfg.k);
        let n = w;
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
                    let pi = b_param_index(self, cfg, g0, j0 + c);
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

fn destroyed_c() -> (i32, String) {
    (
        sys::RKNN_ERR_OUTPUT_INVALID,
        "C's memory was destroyed after it was bound with set_io_mem (bound memories must stay alive until the context is destroyed)".into(),
    )
}

/// One run's arithmetic: canonical A, and the buffers for a panel of results.
struct Work<'a> {
    ctx: &'a Context,
    cfg: MatmulConfig,
    a: OperandRef<'a>,
    sums_i32: &'a mut Vec<i32>,
    sums_f32: &'a mut Vec<f32>,
}

/// 4-byte numbers whose every bit pattern is a valid value and which have no padding.
trait Plain4: Copy {}
impl Plain4 for i32 {}
impl Plain4 for f32 {}

/// The bytes of `v` in memory order (little-endian values on a little-endian host).
fn plain_bytes<T: Plain4>(v: &[T]) -> &[u8] {
    // SAFETY: `T` is i32 or f32 (`Plain4` is private to this module): 4 bytes, no padding, so the
    // `4 * v.len()` bytes at `v`'s address are initialised and borrowed for as long as `v`;
    // u8 has alignment 1.
    unsafe { std::slice::from_raw_parts(v.as_ptr().cast::<u8>(), std::mem::size_of_val(v)) }
}

/// A panel of results, [M, w] row-major.
enum Sums<'a> {
    /// Exact integer sums.
    I32(&'a [i32]),
    /// Dequantised sums (the i8 → f32 and i8 → i8 types).
    F64(&'a [f64]),
    /// Float results.
    F32(&'a [f32]),
}

impl Work<'_> {
    /// Computes columns `j0..j0 + w` of C from `bt` (those columns of B, [w, K]) into `out`.
    fn panel(
        &mut self,
        bt: OperandRef<'_>,
        j0: usize,
        w: usize,
        out: &mut CWriter<'_>,
    ) -> CallResult {
        let (m, k) = (self.cfg.m, self.cfg.k);
        match (self.a, bt) {
            (OperandRef::Int(a), OperandRef::Int(bt)) => match self.cfg.t.c {
                ElemKind::F32 | ElemKind::I8 => {
                    let real = self.ctx.dequantised_sums(&self.cfg, a, bt, j0, w)?;
                    out.put(Sums::F64(&real), j0, w);
                }
                _ => {
                    let acc = grow(self.sums_i32, m * w)?;
                    kernels::gemm_i8_i32(a, bt, acc, m, w, k);
                    out.put(Sums::I32(acc), j0, w);
                }
            },
            (OperandRef::Float(a), OperandRef::Float(bt)) => {
                let c = grow(self.sums_f32, m * w)?;
                kernels::gemm_f32(a, bt, c, m, w, k);
                out.put(Sums::F32(c), j0, w);
            }
            _ => {
                return Err((
                    sys::RKNN_ERR_FAIL,
                    "operand kinds do not match the matmul type".into(),
                ));
            }
        }
        Ok(())
    }

    /// Computes C from native B's bytes (`geo` describes them): the native-B kernel straight
    /// from the bytes when it applies (int8 B, integer C, whole tiles), else column panels
    /// unpacked one at a time into canonical form.
    fn native_b(
        &mut self,
        b: &[u8],
        geo: &NativeB,
        tiles: Tiles,
        panel_i8: &mut Vec<i8>,
        panel_f32: &mut Vec<f32>,
        out: &mut CWriter<'_>,
    ) -> CallResult {
        let cfg = self.cfg;
        let (m, k, n) = (cfg.m, cfg.k, cfg.n);
        if let OperandRef::Int(a) = self.a {
            let direct = cfg.t.b == ElemKind::I8
                && matches!(cfg.t.c, ElemKind::I32 | ElemKind::I16)
                && tiles.b_k == NATIVE_B_SK
                && matches!(tiles.b_n, 8 | 16 | 24 | 32)
                && n % tiles.b_n == 0
                && k % NATIVE_B_SK == 0;
            if direct {
                let acc = grow(self.sums_i32, m * n)?;
                for s in 0..geo.segments() {
                    let k0 = s * geo.segment;
                    let ks = geo.segment.min(k - k0);
                    let start = geo.index(k0, 0);
                    // SAFETY: i8 and u8 have the same size and alignment and every bit pattern
                    // is valid for both; the bytes stay borrowed (and read-locked) meanwhile.
                    let seg: &[i8] =
                        unsafe { std::slice::from_raw_parts(b[start..].as_ptr().cast(), n * ks) };
                    let shape = NativeBShape {
                        m,
                        n,
                        k: ks,
                        sn: tiles.b_n,
                        lda: k,
                    };
                    kernels::gemm_i8_native_b(&a[k0..], seg, acc, shape, s > 0);
                }
                out.put(Sums::I32(acc), 0, n);
                return Ok(());
            }
        }
        let elem = if matches!(self.a, OperandRef::Int(_)) {
            1
        } else {
            4
        };
        let width = panel_width(n, k, elem, tiles.b_n);
        for j0 in (0..n).step_by(width) {
            let w = width.min(n - j0);
            let panel = match (self.a, cfg.t.b) {
                (OperandRef::Int(_), kind) => {
                    let p = grow(panel_i8, w * k)?;
                    unpack_panel_int(b, geo, kind, j0, w, p);
                    OperandRef::Int(p)
                }
                (OperandRef::Float(_), ElemKind::F16) => {
                    let p = grow(panel_f32, w * k)?;
                    unpack_panel_f16(b, geo, j0, w, p);
                    OperandRef::Float(p)
                }
                (OperandRef::Float(_), kind) => {
                    let q = grow(panel_i8, w * k)?;
                    unpack_panel_int(b, geo, kind, j0, w, q);
                    let p = grow(panel_f32, w * k)?;
                    self.ctx.dequantise_panel(&cfg, q, j0, w, p);
                    OperandRef::Float(p)
                }
            };
            self.panel(panel, j0, w, out)?;
        }
        Ok(())
    }
}

/// Columns per panel: about [`PANEL_BYTES`] of canonical B with elements of `elem` bytes, a
/// multiple of `align` (the native tile's N, so that a panel starts at a tile) unless all of N
/// is smaller.
fn panel_width(n: usize, k: usize, elem: usize, align: usize) -> usize {
    let w = PANEL_BYTES / (k.max(1) * elem);
    ((w / align).max(1) * align).min(n).max(1)
}

/// Calls `f(k0, n, start, len)` for each run of elements of one column of native B that are
/// contiguous in its buffer: `B(k0.., n)` is at element `start`, `len` of them.
fn for_each_run(
    geo: &NativeB,
    cols: std::ops::Range<usize>,
    mut f: impl FnMut(usize, usize, usize, usize),
) {
    for n in cols {
        let mut k0 = 0;
        while k0 < geo.k {
            let len = (geo.sk - k0 % geo.sk).min(geo.k - k0);
            f(k0, n, geo.index(k0, n), len);
            k0 += len;
        }
    }
}

/// Columns `j0..j0 + w` of native int B (i8, or i4 two per byte, low nibble first) into
/// `dst` [w, K].
fn unpack_panel_int(b: &[u8], geo: &NativeB, kind: ElemKind, j0: usize, w: usize, dst: &mut [i8]) {
    let k = geo.k;
    for_each_run(geo, j0..j0 + w, |k0, n, start, len| {
        let d = &mut dst[(n - j0) * k + k0..][..len];
        if kind == ElemKind::I4 && start % 2 == 0 {
            // Whole bytes from the run's first (a tile's runs start at even elements).
            for (d, &byte) in d.chunks_mut(2).zip(&b[start / 2..]) {
                d[0] = ((byte << 4) as i8) >> 4;
                if let Some(hi) = d.get_mut(1) {
                    *hi = (byte as i8) >> 4;
                }
            }
        } else if kind == ElemKind::I4 {
            for (e, d) in d.iter_mut().enumerate() {
                *d = i4_at(b, start + e);
            }
        } else {
            for (d, &s) in d.iter_mut().zip(&b[start..start + len]) {
                *d = s as i8;
            }
        }
    });
}

/// Columns `j0..j0 + w` of native f16 B into `dst` [w, K] as f32.
fn unpack_panel_f16(b: &[u8], geo: &NativeB, j0: usize, w: usize, dst: &mut [f32]) {
    let k = geo.k;
    for_each_run(geo, j0..j0 + w, |k0, n, start, len| {
        let d = &mut dst[(n - j0) * k + k0..][..len];
        for (d, c) in d
            .iter_mut()
            .zip(b[2 * start..2 * (start + len)].chunks_exact(2))
        {
            *d = f16::from_le_bytes([c[0], c[1]]).to_f32();
        }
    });
}

/// Element `i` of packed int4 data (two per byte, the even element in the low nibble).
fn i4_at(bytes: &[u8], i: usize) -> i8 {
    let byte = bytes[i / 2];
    let nib = if i % 2 == 0 { byte << 4 } else { byte & 0xf0 };
    (nib as i8) >> 4
}

/// An input's elements in memory order: i8 (i4 widened) or f16 widened to f32.
fn elements(bytes: &[u8], desc: &TensorDesc) -> CallResult<Operand> {
    let count = desc.elements();
    Ok(match desc.kind {
        ElemKind::I8 | ElemKind::I4 => {
            let mut v = try_vec(count, 0i8)?;
            read_ints(bytes, desc.kind, &mut v);
            Operand::Int(v)
        }
        ElemKind::F16 => {
            let mut v = try_vec(count, 0f32)?;
            read_f16(bytes, &mut v);
            Operand::Float(v)
        }
        other => return Err(param(format!("input of kind {other} cannot be bound"))),
    })
}

/// i8 elements, or i4 widened (two per byte, low nibble first), into `dst`.
fn read_ints(bytes: &[u8], kind: ElemKind, dst: &mut [i8]) {
    if kind == ElemKind::I4 {
        layout::unpack_i4(bytes, dst);
    } else {
        dst.iter_mut().zip(bytes).for_each(|(d, &s)| *d = s as i8);
    }
}

/// f16 elements (little-endian, any alignment) widened into `dst`.
fn read_f16(bytes: &[u8], dst: &mut [f32]) {
    const CHUNK: usize = 256;
    let mut h = [f16::ZERO; CHUNK];
    for (d, b) in dst.chunks_mut(CHUNK).zip(bytes.chunks(2 * CHUNK)) {
        let h = &mut h[..d.len()];
        h.iter_mut()
            .zip(b.chunks_exact(2))
            .for_each(|(x, c)| *x = f16::from_le_bytes([c[0], c[1]]));
        h.convert_to_f32_slice(d);
    }
}

/// Index into B's quant arrays for element (k, n): per-layer 0, per-channel n, per-group
/// `(k / G) * stride_n + n` (order `[K/G][N]`, inferred: \[open\]; `stride_n` is the context's
/// N, which the arrays were sized for), or `n * (stride_k / G) + k / G` for [`GroupOrder::NMajor`].
fn b_param_index(ctx: &Context, cfg: &MatmulConfig, k: usize, n: usize) -> usize {
    match cfg.b_quant.granularity {
        QuantGranularity::PerLayer => 0,
        QuantGranularity::PerChannel => n,
        QuantGranularity::PerGroup => match ctx.group_order {
            GroupOrder::KMajor => (k / cfg.group_size) * ctx.quant_n + n,
            GroupOrder::NMajor => n * (ctx.quant_k / cfg.group_size) + k / cfg.group_size,
        },
    }
}

/// Whether an input of this descriptor is int4 B in the native layout stored high nibble
/// first, which the kernels read after [`swap_nibbles`].
fn swaps_nibbles(emu: &EmuConfig, desc: &TensorDesc) -> bool {
    desc.name == "B"
        && desc.kind == ElemKind::I4
        && desc.layout == Layout::Native
        && emu.native_b_nibbles == NibbleOrder::HighFirst
}

/// Exchanges the two nibbles of every byte: high-first int4 data into low-first and back.
pub(crate) fn swap_nibbles(bytes: &mut [u8]) {
    bytes.iter_mut().for_each(|b| *b = b.rotate_left(4));
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

/// Reads A (`which` 0) into [M, K] or B (`which` 1) into [N, K] from the bound layout, into
/// `dst` (resized to exactly that).
fn canonical<T: Copy + Default>(
    src: &[T],
    which: usize,
    desc: &TensorDesc,
    cfg: &MatmulConfig,
    tiles: Tiles,
    segment: Option<usize>,
    dst: &mut Vec<T>,
) -> CallResult {
    let (m, k, n) = (cfg.m, cfg.k, cfg.n);
    // The descriptor's element count was checked at creation; these products are below it.
    if which == 0 {
        let d = grow(dst, m * k)?;
        match desc.layout {
            Layout::Native => layout::unpack_a_native(src, m, k, tiles.a_k, d),
            _ => d.copy_from_slice(&src[..m * k]),
        }
        dst.truncate(m * k);
    } else {
        let d = grow(dst, k * n)?;
        match desc.layout {
            Layout::Native => NativeB::new(k, n, tiles.b_n, tiles.b_k, segment)
                .ok_or_else(|| param(format!("native B of K={k} N={n} has no layout")))?
                .unpack_to_nk(src, d),
            Layout::TpNorm => d.copy_from_slice(&src[..k * n]),
            Layout::Norm => transpose(src, k, n, d),
        }
        dst.truncate(k * n);
    }
    Ok(())
}

/// Writes results into C's bytes in C's layout and element type, panel by panel.
struct CWriter<'a> {
    bytes: &'a mut [u8],
    kind: ElemKind,
    native: bool,
    m: usize,
    n: usize,
    c_n: usize,
    overflow: Overflow,
    rounding: Rounding,
    /// C's quant params (i8 output).
    qc: &'a QuantParams,
}

impl<'a> CWriter<'a> {
    fn new(
        bytes: &'a mut [u8],
        ctx: &'a Context,
        emu: &EmuConfig,
        desc: &TensorDesc,
        tiles: Tiles,
    ) -> CWriter<'a> {
        let cfg = ctx.cfg();
        CWriter {
            bytes,
            kind: cfg.t.c,
            native: desc.layout == Layout::Native,
            m: cfg.m,
            n: cfg.n,
            c_n: tiles.c_n,
            overflow: emu.i16_overflow,
            rounding: emu.rounding,
            qc: ctx.quant_or_default(2),
        }
    }

    /// Calls `f(row, col, index, len)` for every run of elements of columns `j0..j0 + w` that
    /// are contiguous in C: row `row`, columns `col..col + len`, from element `index` of C's
    /// layout on.
    fn runs(&self, j0: usize, w: usize, mut f: impl FnMut(usize, usize, usize, usize)) {
        let (m, n, c_n) = (self.m, self.n, self.c_n);
        if !self.native {
            for i in 0..m {
                f(i, j0, i * n + j0, w);
            }
            return;
        }
        if m == 1 {
            // [ceil(N / c_n), 1, c_n] is row-major.
            f(0, j0, j0, w);
            return;
        }
        // Native C [ceil(N / c_n), M, c_n]: runs of columns within one block.
        let mut col = j0;
        while col < j0 + w {
            let (block, within) = (col / c_n, col % c_n);
            let len = (c_n - within).min(j0 + w - col);
            for i in 0..m {
                f(i, col, (block * m + i) * c_n + within, len);
            }
            col += len;
        }
    }

    /// Writes a panel of results: columns `j0..j0 + w`, `sums` being [M, w].
    ///
    /// The element conversion is chosen once per panel, not per run: native C of i32 on RK3588
    /// is in runs of 4 columns, so a decision per run cost as much as the copy.
    fn put(&mut self, sums: Sums<'_>, j0: usize, w: usize) {
        /// Writes each run of `src` ([M, w]) into `bytes` as `N`-byte little-endian values.
        fn store<S: Copy, const N: usize>(
            this: &CWriter<'_>,
            bytes: &mut [u8],
            src: &[S],
            j0: usize,
            w: usize,
            f: impl Fn(S) -> [u8; N],
        ) {
            this.runs(j0, w, |i, col, idx, len| {
                let from = i * w + col - j0;
                for (d, &s) in bytes[N * idx..N * (idx + len)]
                    .chunks_exact_mut(N)
                    .zip(&src[from..from + len])
                {
                    d.copy_from_slice(&f(s));
                }
            });
        }
        /// As `store` for 4-byte elements already in C's byte order (i32 or f32 C on a
        /// little-endian host): each run is one copy, where the element loop above stays
        /// scalar (7 instructions per element, a twentieth of a decode token's host work).
        fn copy_runs(this: &CWriter<'_>, bytes: &mut [u8], src: &[u8], j0: usize, w: usize) {
            if this.native && this.m > 1 && j0 % this.c_n == 0 && w % this.c_n == 0 {
                // Native C of several rows is runs of one block's c_n columns (16 bytes of
                // i32 on RK3588): copies of a size known here, not a call per run.
                match this.c_n {
                    4 => return copy_blocks::<16>(this, bytes, src, j0, w),
                    8 => return copy_blocks::<32>(this, bytes, src, j0, w),
                    16 => return copy_blocks::<64>(this, bytes, src, j0, w),
                    _ => {}
                }
            }
            this.runs(j0, w, |i, col, idx, len| {
                let from = 4 * (i * w + col - j0);
                bytes[4 * idx..4 * (idx + len)].copy_from_slice(&src[from..from + 4 * len]);
            });
        }
        /// `copy_runs` for whole blocks of native C: `B` bytes (c_n 4-byte columns) per row
        /// and block, block `j0 / c_n + b` at bytes `B·M·(j0 / c_n + b)`, row `i` of it `B·i`
        /// further, from row `i`, columns `j0 + b·c_n ..` of `src` ([M, w]).
        fn copy_blocks<const B: usize>(
            this: &CWriter<'_>,
            bytes: &mut [u8],
            src: &[u8],
            j0: usize,
            w: usize,
        ) {
            let (m, first, blocks) = (this.m, j0 / this.c_n, w / this.c_n);
            let dst = &mut bytes[B * m * first..B * m * (first + blocks)];
            for (b, block) in dst.chunks_exact_mut(B * m).enumerate() {
                for (i, d) in block.chunks_exact_mut(B).enumerate() {
                    let s = 4 * i * w + b * B;
                    d.copy_from_slice(&src[s..s + B]);
                }
            }
        }
        let (overflow, rounding, qc) = (self.overflow, self.rounding, self.qc);
        let mut bytes = std::mem::take(&mut self.bytes);
        match (sums, self.kind) {
            (Sums::I32(v), ElemKind::I16) => store(self, bytes, v, j0, w, |x| {
                match overflow {
                    Overflow::Saturate => x.clamp(i16::MIN.into(), i16::MAX.into()) as i16,
                    Overflow::Wrap => x as i16,
                }
                .to_le_bytes()
            }),
            (Sums::I32(v), _) if cfg!(target_endian = "little") => {
                copy_runs(self, bytes, plain_bytes(v), j0, w)
            }
            (Sums::I32(v), _) => store(self, bytes, v, j0, w, i32::to_le_bytes),
            (Sums::F64(v), ElemKind::I8) => self.runs(j0, w, |i, col, idx, len| {
                let from = i * w + col - j0;
                for (r, (d, &x)) in bytes[idx..idx + len]
                    .iter_mut()
                    .zip(&v[from..from + len])
                    .enumerate()
                {
                    // Per-channel C has one entry per column (checked at set_quant_params).
                    let ci = if qc.scale.len() > 1 { col + r } else { 0 };
                    let q = round(x / f64::from(qc.scale(ci)), rounding) + f64::from(qc.zp(ci));
                    *d = q.clamp(-128.0, 127.0) as i8 as u8;
                }
            }),
            (Sums::F64(v), _) => store(self, bytes, v, j0, w, |x| (x as f32).to_le_bytes()),
            (Sums::F32(v), ElemKind::F16) => {
                store(self, bytes, v, j0, w, |x| f16::from_f32(x).to_le_bytes())
            }
            (Sums::F32(v), _) if cfg!(target_endian = "little") => {
                copy_runs(self, bytes, plain_bytes(v), j0, w)
            }
            (Sums::F32(v), _) => store(self, bytes, v, j0, w, f32::to_le_bytes),
        }
        std::mem::swap(&mut self.bytes, &mut bytes);
    }

    /// Zeroes the padding of native C (the columns past N in its last block).
    fn finish(&mut self) {
        let (n, c_n) = (self.n, self.c_n);
        if !self.native || n % c_n == 0 {
            return;
        }
        let esize = match self.kind {
            ElemKind::I8 => 1,
            ElemKind::I16 | ElemKind::F16 | ElemKind::Bf16 => 2,
            _ => 4,
        };
        let pad = c_n - n % c_n;
        let mut bytes = std::mem::take(&mut self.bytes);
        self.runs(n, pad, |_, _, idx, len| {
            bytes[esize * idx..esize * (idx + len)].fill(0);
        });
        std::mem::swap(&mut self.bytes, &mut bytes);
    }
}
