//! What the probe examples share: the flags, opening the runtime, the cases, filling and
//! checking the matrices, the reference figures (rated, field, model), the table, JSON and
//! plot output.

use std::fmt::Write as _;
use std::time::Duration;

use clap::{Args, ValueEnum};
use half::f16;
use rknn_matmul::rknn_emu::cost::CostModel;
use rknn_matmul::{
    BQuant, Backend, F16xF16ToF32, I4x2, I4xI4ToI16, I8xI8ToI32, Layout, Matmul, MatmulKind,
    Platform, Runtime, RuntimeOptions, TensorMem,
};

/// Which backend runs the matmuls.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum BackendArg {
    /// The NPU if there is one, else the emulator.
    Auto,
    /// The NPU (librknnrt.so, or $RKNN_RUNTIME_PATH).
    Npu,
    /// The emulator.
    Emulator,
}

/// Backend selection flags.
#[derive(Args, Debug, Clone)]
pub struct BackendFlags {
    /// Which backend runs the matmuls.
    #[arg(long, value_enum, default_value = "auto")]
    pub backend: BackendArg,
    /// The chip the emulator plays (also the chip `auto` falls back to), or the chip to
    /// assume on the NPU instead of reading the device tree.
    #[arg(long)]
    pub platform: Option<Platform>,
}

impl BackendFlags {
    /// Opens the runtime the flags describe.
    pub fn open(&self) -> rknn_matmul::Result<Runtime> {
        let mut opts = RuntimeOptions::default();
        let backend = match self.backend {
            BackendArg::Auto => {
                if let Some(p) = self.platform {
                    opts.emulator.platform = p;
                }
                Backend::Auto
            }
            BackendArg::Npu => {
                opts.npu_platform = self.platform;
                Backend::Npu
            }
            BackendArg::Emulator => Backend::Emulator(self.platform.unwrap_or(Platform::Rk3588)),
        };
        Runtime::open(backend, opts)
    }
}

/// The operand type of a case: every type RK3588 multiplies with an exact or f32 result.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Dtype {
    /// int8 × int8 → int32 (`RKNN_INT8_MM_INT8_TO_INT32`).
    I8,
    /// f16 × f16 → f32 (`RKNN_FLOAT16_MM_FLOAT16_TO_FLOAT32`).
    F16,
    /// int4 × int4 → int16 (`RKNN_INT4_MM_INT4_TO_INT16`, W4A4: RK3588's only int4 type).
    I4,
}

impl Dtype {
    pub fn name(self) -> &'static str {
        match self {
            Dtype::I8 => "i8",
            Dtype::F16 => "f16",
            Dtype::I4 => "i4",
        }
    }

    pub fn matmul_type(self) -> rknn_matmul::MatmulType {
        match self {
            Dtype::I8 => I8xI8ToI32::TYPE,
            Dtype::F16 => F16xF16ToF32::TYPE,
            Dtype::I4 => I4xI4ToI16::TYPE,
        }
    }
}

/// Layout of B.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LayoutArg {
    /// The NPU's tiled layout, converted by the runtime's converter.
    Native,
    /// Row-major [K, N].
    Norm,
    /// Transposed, [N, K].
    TpNorm,
}

impl LayoutArg {
    pub fn layout(self) -> Layout {
        match self {
            LayoutArg::Native => Layout::Native,
            LayoutArg::Norm => Layout::Norm,
            LayoutArg::TpNorm => Layout::TpNorm,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            LayoutArg::Native => "native",
            LayoutArg::Norm => "norm",
            LayoutArg::TpNorm => "tp_norm",
        }
    }
}

/// Quantisation type of B (`B_quant_type`), for the integer types.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum QuantArg {
    /// One scale for all of B.
    PerLayer,
    /// One scale per output channel.
    PerChannel,
}

impl QuantArg {
    pub fn name(self) -> &'static str {
        match self {
            QuantArg::PerLayer => "per-layer",
            QuantArg::PerChannel => "per-channel",
        }
    }
}

/// M×K×N, e.g. `4096x4096x4096`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shape {
    pub m: usize,
    pub k: usize,
    pub n: usize,
}

impl std::str::FromStr for Shape {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let dims: Vec<&str> = s.split(['x', 'X', '*']).collect();
        let parse = |d: &str| {
            d.trim()
                .parse::<usize>()
                .ok()
                .filter(|&v| v > 0)
                .ok_or_else(|| format!("{d:?} in {s:?} is not a positive integer"))
        };
        match dims.as_slice() {
            [m, k, n] => Ok(Shape {
                m: parse(m)?,
                k: parse(k)?,
                n: parse(n)?,
            }),
            _ => Err(format!("shape {s:?} is not MxKxN (e.g. 4096x4096x4096)")),
        }
    }
}

impl Shape {
    /// Multiply-accumulates ×2.
    pub fn ops(self) -> f64 {
        2.0 * self.m as f64 * self.k as f64 * self.n as f64
    }
}

/// What to run: the flags both probes share.
#[derive(Args, Debug, Clone)]
pub struct CaseFlags {
    /// Shapes to run, MxKxN (repeat or comma-separate). Default: the campaign's.
    #[arg(long = "shape", value_delimiter = ',')]
    pub shapes: Vec<Shape>,
    /// Operand types (repeat or comma-separate).
    #[arg(
        long = "dtype",
        value_enum,
        value_delimiter = ',',
        default_value = "i8"
    )]
    pub dtypes: Vec<Dtype>,
    /// Layouts of B (repeat or comma-separate). Default: the campaign's.
    #[arg(long = "layout", value_enum, value_delimiter = ',')]
    pub layouts: Vec<LayoutArg>,
    /// Quantisation types of B for the integer types (repeat or comma-separate). Default:
    /// the campaign's.
    #[arg(long = "quant", value_enum, value_delimiter = ',')]
    pub quants: Vec<QuantArg>,
    /// Timed runs per case (default 10, 2 with --quick).
    #[arg(long)]
    pub iterations: Option<u32>,
    /// Untimed runs before timing (default 3, 1 with --quick); the first is the checked one.
    #[arg(long)]
    pub warmup: Option<u32>,
    /// Small shapes and few iterations (for CI and the emulator): the campaign's shapes with
    /// 4096 → 256, 512 → 64 and K = 15360 → 8704 (still above the 8192-row segment).
    #[arg(long)]
    pub quick: bool,
    /// One JSON object per case on stdout (the table goes to stderr).
    #[arg(long)]
    pub json: bool,
    /// Writes a plot of the throughput (ours, the model's, the field's, the rated) to this SVG.
    #[arg(long, value_name = "FILE.svg")]
    pub plot: Option<std::path::PathBuf>,
}

impl CaseFlags {
    pub fn iterations(&self) -> u32 {
        self.iterations
            .unwrap_or(if self.quick { 2 } else { 10 })
            .max(1)
    }

    pub fn warmup(&self) -> u32 {
        // The first run is the checked one, so there is always one.
        self.warmup.unwrap_or(if self.quick { 1 } else { 3 }).max(1)
    }

    /// The layouts asked for, or the campaign's (native B) when none were.
    pub fn layouts_or_default(&self) -> Vec<LayoutArg> {
        if self.layouts.is_empty() {
            vec![LayoutArg::Native]
        } else {
            self.layouts.clone()
        }
    }

    /// The quantisation types asked for, or the campaign's (per layer) when none were.
    pub fn quants_or_default(&self) -> Vec<QuantArg> {
        if self.quants.is_empty() {
            vec![QuantArg::PerLayer]
        } else {
            self.quants.clone()
        }
    }

    /// A campaign shape, shrunk for --quick.
    pub fn scaled(&self, s: Shape) -> Shape {
        if !self.quick {
            return s;
        }
        let f = |v: usize| match v {
            4096 => 256,
            512 => 64,
            15360 => 8704,
            v => v,
        };
        Shape {
            m: f(s.m),
            k: f(s.k),
            n: f(s.n),
        }
    }
}

/// One case to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Case {
    pub shape: Shape,
    pub dtype: Dtype,
    pub layout: LayoutArg,
    pub quant: QuantArg,
}

impl Case {
    /// A short label for a plot's axis.
    pub fn short(&self) -> String {
        let Shape { m, k, n } = self.shape;
        let dims = if m == k && k == n {
            format!("{m}³")
        } else {
            format!("{m}x{k}x{n}")
        };
        let l = match self.layout {
            LayoutArg::Native => "nat",
            LayoutArg::Norm => "norm",
            LayoutArg::TpNorm => "tp",
        };
        let q = match self.quant {
            QuantArg::PerLayer => "pl",
            QuantArg::PerChannel => "pc",
        };
        format!("{dims} {} {l}/{q}", self.dtype.name())
    }

    pub fn label(&self) -> String {
        let Shape { m, k, n } = self.shape;
        let dims = if m == k && k == n {
            format!("{m}³")
        } else {
            format!("{m}x{k}x{n}")
        };
        format!(
            "{dims} {} {} {}",
            self.dtype.name(),
            self.layout.name(),
            self.quant.name()
        )
    }
}

/// The field's figure for a case, with its source: librknnrt 2.3.2 on RK3588 at 1 GHz.
pub fn field_tops(case: &Case, contexts: usize) -> Option<(f64, &'static str)> {
    let Shape { m, k, n } = case.shape;
    if case.dtype != Dtype::I8 {
        return None;
    }
    match (m, k, n, contexts) {
        (4096, 4096, 4096, 1) => Some((0.69, "campaign mm_peak")),
        (4096, 4096, 4096, 2) => Some((1.26, "campaign mm_concurrent")),
        (4096, 4096, 4096, 3) => Some((1.83, "campaign mm_concurrent")),
        (512, 15360, 4096, 1) => Some((0.02, "campaign mm_peak")),
        _ => None,
    }
}

/// The rated figure of `contexts` cores (int8 only: Rockchip publishes no f16 or int4 matmul
/// rate).
pub fn rated_tops(rt: &Runtime, dtype: Dtype, contexts: usize) -> Option<f64> {
    model(rt)
        .and_then(|m| m.rated_tops(dtype.matmul_type()))
        .map(|r| r * contexts as f64)
}

/// The chip's calibrated cost model, if it has one.
pub fn model(rt: &Runtime) -> Option<&'static CostModel> {
    CostModel::for_platform(rt.platform())
}

/// The header: what runs the matmul, on which chip, and where the reference figures come from.
pub fn header(rt: &Runtime, what: &str, flags: &CaseFlags) -> String {
    let mut h = String::new();
    let _ = writeln!(h, "{what}");
    if rt.is_hardware() {
        let v = rt.versions().map(|v| format!(", {v}")).unwrap_or_default();
        let _ = writeln!(
            h,
            "matmul runs on: the NPU of {} ({}{v})",
            rt.platform(),
            rt.selection_reason()
        );
    } else {
        let _ = writeln!(
            h,
            "matmul runs on: the host CPU, emulating {} ({}): host times are the emulator's, not the NPU's",
            rt.platform(),
            rt.selection_reason()
        );
    }
    let types: Vec<String> = flags
        .dtypes
        .iter()
        .map(|d| format!("{} = {}", d.name(), d.matmul_type()))
        .collect();
    let _ = writeln!(h, "dtype: {}", types.join("; "));
    let _ = writeln!(
        h,
        "timing: {} run(s) per case after {} warm-up run(s); runs only (no creation, no binding); the first result of every case is checked against a host reference",
        flags.iterations(),
        flags.warmup()
    );
    match model(rt) {
        Some(m) => {
            let _ = writeln!(
                h,
                "rated: {:.1} TOPS per core for i8 (none published for f16 / i4) | field: librknnrt 2.3.2, RK3588 NPU at 1 GHz | model: the {} cost model (rknn_emu::cost), a MODEL of the chip, see docs/npu-matmul-performance.md",
                m.peak_i8 / 1e12,
                m.platform
            );
        }
        None => {
            let _ = writeln!(
                h,
                "rated, field and model figures: none for {} (only RK3588 has field measurements)",
                rt.platform()
            );
        }
    }
    h
}

fn opt(v: Option<f64>, prec: usize) -> String {
    v.map_or_else(|| "–".to_string(), |v| format!("{v:.prec$}"))
}

/// One measured case: what the table, JSON and plot show.
#[derive(Clone, Debug)]
pub struct Measured {
    pub case: Case,
    pub contexts: usize,
    /// Host wall time per run (per context round for `mm_concurrent`).
    pub ms_per_run: f64,
    /// Aggregate over the contexts.
    pub tops: f64,
    pub rated: Option<f64>,
    pub field: Option<f64>,
    /// Modelled device time per run on the chip.
    pub modelled_ms: Option<f64>,
    pub verified: bool,
    /// How the first result was checked.
    pub check: String,
}

impl Measured {
    pub fn pct_of_rated(&self) -> Option<f64> {
        self.rated.map(|r| 100.0 * self.tops / r)
    }

    /// Aggregate modelled throughput.
    pub fn modelled_tops(&self) -> Option<f64> {
        self.modelled_ms
            .map(|ms| self.contexts as f64 * self.case.shape.ops() / (ms * 1e-3) / 1e12)
    }

    pub fn json(&self) -> serde_json::Value {
        let Shape { m, k, n } = self.case.shape;
        serde_json::json!({
            "m": m,
            "k": k,
            "n": n,
            "type": self.case.dtype.name(),
            "layout": self.case.layout.name(),
            "contexts": self.contexts,
            "ms_per_run": self.ms_per_run,
            "tops": self.tops,
            "pct_of_rated": self.pct_of_rated(),
            "verified": self.verified,
            "modelled_ms": self.modelled_ms,
        })
    }
}

pub fn table_header(first: &str) -> String {
    format!(
        "{first:<34} {:>10} {:>8} {:>7} {:>7} | {:>10} {:>8} | {:>8} | check",
        "ms/run", "TOPS", "%rated", "rated", "model ms", "model", "field"
    )
}

pub fn table_row(first: &str, r: &Measured) -> String {
    format!(
        "{first:<34} {:>10.3} {:>8.4} {:>7} {:>7} | {:>10} {:>8} | {:>8} | {}",
        r.ms_per_run,
        r.tops,
        opt(r.pct_of_rated(), 1),
        opt(r.rated, 1),
        opt(r.modelled_ms, 3),
        opt(r.modelled_tops(), 4),
        opt(r.field, 2),
        r.check
    )
}

/// Prints the table to stdout, or to stderr with the JSON lines on stdout.
pub struct Out {
    json: bool,
}

impl Out {
    pub fn new(json: bool) -> Out {
        Out { json }
    }

    pub fn text(&self, s: &str) {
        if self.json {
            eprintln!("{s}");
        } else {
            println!("{s}");
        }
    }

    pub fn case(&self, first: &str, r: &Measured) {
        self.text(&table_row(first, r));
        if self.json {
            println!("{}", r.json());
        }
    }
}

/// A deterministic generator per case, so a mismatch can be reproduced.
pub fn rng(case: &Case, salt: u64) -> fastrand::Rng {
    let Shape { m, k, n } = case.shape;
    fastrand::Rng::with_seed((m as u64) << 40 ^ (k as u64) << 20 ^ n as u64 ^ salt)
}

/// The operands of a case as logical values (exact in f32), A [M, K] and B [K, N] row-major.
pub struct Operands {
    pub a: Vec<f32>,
    pub b: Vec<f32>,
}

/// What a probe needs of a matmul type: filling A and B from logical values in any layout of B,
/// reading C, and how exact the result must be.
pub trait ProbeKind: MatmulKind + Sized {
    /// Random logical values whose K-long dot products the type holds exactly (or, for f16,
    /// within f32 accumulation).
    fn operands(rng: &mut fastrand::Rng, s: Shape) -> Operands;

    fn store_a(vals: &[f32], dst: &mut [Self::A]);

    /// Writes B ([K, N] values) into `dst` in the context's layout.
    fn store_b(
        mm: &Matmul<Self>,
        layout: LayoutArg,
        s: Shape,
        vals: &[f32],
        dst: &mut TensorMem<Self::B>,
    ) -> rknn_matmul::Result<()>;

    fn c_at(c: &[Self::C], i: usize) -> f64;

    /// Allowed |C - reference| for an entry whose terms sum to `abs_sum` in magnitude.
    fn tolerance(abs_sum: f64) -> f64;
}

/// B's values in the order of a normal-layout buffer.
fn b_in_layout(layout: LayoutArg, s: Shape, vals: &[f32]) -> Vec<f32> {
    match layout {
        LayoutArg::TpNorm => (0..s.n)
            .flat_map(|j| (0..s.k).map(move |kk| vals[kk * s.n + j]))
            .collect(),
        _ => vals.to_vec(),
    }
}

fn ints(rng: &mut fastrand::Rng, len: usize, lo: i32, hi: i32) -> Vec<f32> {
    (0..len).map(|_| rng.i32(lo..=hi) as f32).collect()
}

impl ProbeKind for I8xI8ToI32 {
    fn operands(rng: &mut fastrand::Rng, s: Shape) -> Operands {
        Operands {
            a: ints(rng, s.m * s.k, -128, 127),
            b: ints(rng, s.k * s.n, -128, 127),
        }
    }
    fn store_a(vals: &[f32], dst: &mut [i8]) {
        for (d, v) in dst.iter_mut().zip(vals) {
            *d = *v as i8;
        }
    }
    fn store_b(
        mm: &Matmul<Self>,
        layout: LayoutArg,
        s: Shape,
        vals: &[f32],
        dst: &mut TensorMem<i8>,
    ) -> rknn_matmul::Result<()> {
        let v: Vec<i8> = b_in_layout(layout, s, vals)
            .iter()
            .map(|&x| x as i8)
            .collect();
        if layout == LayoutArg::Native {
            mm.b_to_native(&v, dst)
        } else {
            dst.write(&v)
        }
    }
    fn c_at(c: &[i32], i: usize) -> f64 {
        f64::from(c[i])
    }
    fn tolerance(_: f64) -> f64 {
        0.0
    }
}

impl ProbeKind for F16xF16ToF32 {
    fn operands(rng: &mut fastrand::Rng, s: Shape) -> Operands {
        let mut f = |len: usize| {
            (0..len)
                .map(|_| f16::from_f32(rng.f32() * 2.0 - 1.0).to_f32())
                .collect()
        };
        Operands {
            a: f(s.m * s.k),
            b: f(s.k * s.n),
        }
    }
    fn store_a(vals: &[f32], dst: &mut [f16]) {
        for (d, v) in dst.iter_mut().zip(vals) {
            *d = f16::from_f32(*v);
        }
    }
    fn store_b(
        mm: &Matmul<Self>,
        layout: LayoutArg,
        s: Shape,
        vals: &[f32],
        dst: &mut TensorMem<f16>,
    ) -> rknn_matmul::Result<()> {
        let v: Vec<f16> = b_in_layout(layout, s, vals)
            .iter()
            .map(|&x| f16::from_f32(x))
            .collect();
        if layout == LayoutArg::Native {
            mm.b_to_native(&v, dst)
        } else {
            dst.write(&v)
        }
    }
    fn c_at(c: &[f32], i: usize) -> f64 {
        f64::from(c[i])
    }
    fn tolerance(abs_sum: f64) -> f64 {
        // f32 accumulation in any order: a few ulps of f32 per term at most.
        1e-5 * abs_sum + 1e-6
    }
}

impl ProbeKind for I4xI4ToI16 {
    fn operands(rng: &mut fastrand::Rng, s: Shape) -> Operands {
        // i16 holds a K-long sum of products up to 32767: full-range int4 while 64·K fits,
        // narrower values beyond (the hardware's overflow behaviour is [open]).
        let r = if 64 * s.k <= 32767 {
            8
        } else if 4 * s.k <= 32767 {
            2
        } else {
            1
        };
        Operands {
            a: ints(rng, s.m * s.k, -r, r - 1),
            b: ints(rng, s.k * s.n, -r, r - 1),
        }
    }
    fn store_a(vals: &[f32], dst: &mut [I4x2]) {
        for (d, p) in dst.iter_mut().zip(vals.chunks(2)) {
            *d = I4x2::new(p[0] as i8, p.get(1).map_or(0, |v| *v as i8));
        }
    }
    fn store_b(
        mm: &Matmul<Self>,
        layout: LayoutArg,
        s: Shape,
        vals: &[f32],
        dst: &mut TensorMem<I4x2>,
    ) -> rknn_matmul::Result<()> {
        let v = b_in_layout(layout, s, vals);
        if layout == LayoutArg::Native {
            let one: Vec<i8> = v.iter().map(|&x| x as i8).collect();
            mm.b_to_native(&one, dst)
        } else {
            let mut packed = vec![I4x2::default(); v.len().div_ceil(2)];
            Self::store_a(&v, &mut packed);
            dst.write(&packed)
        }
    }
    fn c_at(c: &[i16], i: usize) -> f64 {
        f64::from(c[i])
    }
    fn tolerance(_: f64) -> f64 {
        0.0
    }
}

/// Builds a context for a case on `core` (or the automatic core), fills A and B, runs once and
/// checks C against the host reference; returns the context and its memories, bound and ready
/// to be timed.
pub struct Ready<K: ProbeKind> {
    pub mm: Matmul<K>,
    pub a: TensorMem<K::A>,
    pub b: TensorMem<K::B>,
    pub c: TensorMem<K::C>,
    pub check: Check,
}

/// The outcome of checking a first result.
#[derive(Clone, Debug)]
pub struct Check {
    pub ok: bool,
    pub text: String,
}

/// Entries checked when C is too large to check whole.
const SAMPLES: usize = 2048;

pub fn prepare<K: ProbeKind>(
    rt: &Runtime,
    case: &Case,
    core: rknn_matmul::Core,
    salt: u64,
) -> Result<Ready<K>, Box<dyn std::error::Error + Send + Sync>> {
    let s = case.shape;
    let mut builder = rt
        .matmul::<K>(s.m, s.k, s.n)
        .b_layout(case.layout.layout())
        .core(core);
    if K::TYPE.is_integer() {
        builder = builder.quant_b(match case.quant {
            QuantArg::PerLayer => BQuant::PerLayer { scale: 1.0, zp: 0 },
            QuantArg::PerChannel => BQuant::PerChannel {
                scales: vec![1.0; s.n],
                zps: vec![],
            },
        });
    }
    let mm = builder.build()?;
    let (mut a, mut b, mut c) = (mm.alloc_a()?, mm.alloc_b()?, mm.alloc_c()?);
    let mut rng = rng(case, salt);
    let ops = K::operands(&mut rng, s);
    K::store_a(&ops.a, a.as_mut_slice());
    K::store_b(&mm, case.layout, s, &ops.b, &mut b)?;
    mm.run(&a, &b, &mut c)?;
    let check = verify::<K>(&ops, s, c.as_slice(), &mut rng);
    Ok(Ready { mm, a, b, c, check })
}

/// Compares C with a host reference: every entry when that is cheap, else a random sample.
fn verify<K: ProbeKind>(ops: &Operands, s: Shape, c: &[K::C], rng: &mut fastrand::Rng) -> Check {
    let whole = s.m * s.n <= SAMPLES || s.ops() <= 2e8;
    let entries: Vec<(usize, usize)> = if whole {
        (0..s.m)
            .flat_map(|i| (0..s.n).map(move |j| (i, j)))
            .collect()
    } else {
        (0..SAMPLES)
            .map(|_| (rng.usize(..s.m), rng.usize(..s.n)))
            .collect()
    };
    let mut bad = 0usize;
    let mut first_bad = None;
    for &(i, j) in &entries {
        let (mut sum, mut abs) = (0f64, 0f64);
        for kk in 0..s.k {
            let p = f64::from(ops.a[i * s.k + kk]) * f64::from(ops.b[kk * s.n + j]);
            sum += p;
            abs += p.abs();
        }
        let got = K::c_at(c, i * s.n + j);
        if (got - sum).abs() > K::tolerance(abs) {
            bad += 1;
            first_bad.get_or_insert((i, j, got, sum));
        }
    }
    let what = if whole {
        format!("all {} entries", entries.len())
    } else {
        format!("{} sampled entries", entries.len())
    };
    match first_bad {
        None => Check {
            ok: true,
            text: format!("verified ({what})"),
        },
        Some((i, j, got, want)) => Check {
            ok: false,
            text: format!(
                "WRONG: {bad} of {what} differ, first C[{i}][{j}] = {got} instead of {want}"
            ),
        },
    }
}

/// The core of context `i`: its own core where the chip has core masks.
pub fn core(rt: &Runtime, i: usize) -> rknn_matmul::Core {
    if rt.platform().has_core_mask() {
        rknn_matmul::Core::Index(i)
    } else {
        rknn_matmul::Core::Auto
    }
}

/// The modelled device time of a context's last run: the emulator's own account when the
/// emulator ran it, else the model's prediction for `busy` cores at once.
pub fn modelled_ms<K: ProbeKind>(rt: &Runtime, mm: &Matmul<K>, busy: usize) -> Option<f64> {
    if let Some(emu) = rt.emulator_instance() {
        #[allow(clippy::useless_conversion)] // 32-bit on 32-bit ARM.
        let key = u64::from(mm.as_raw());
        if let Some(c) = emu.context_modelled(key) {
            return c.last.map(|l| l.total_s * 1e3);
        }
    }
    let (m, k, n) = mm.shape();
    model(rt).map(|md| md.modelled_run(m, k, n, K::TYPE, busy).as_secs_f64() * 1e3)
}

/// Times `iters` runs of a ready context.
pub fn time_runs<K: ProbeKind>(r: &mut Ready<K>, iters: u32) -> rknn_matmul::Result<Duration> {
    let t = std::time::Instant::now();
    for _ in 0..iters {
        r.mm.run(&r.a, &r.b, &mut r.c)?;
    }
    Ok(t.elapsed())
}

/// Draws TOPS per point: ours, the model's, the field's and the rated, on a log scale.
pub fn plot(
    path: &std::path::Path,
    title: &str,
    labels: &[String],
    rows: &[&Measured],
    ours_label: &str,
) -> Result<(), Box<dyn std::error::Error>> {
    use plotters::prelude::*;
    let n = rows.len().max(1);
    let values = rows.iter().flat_map(|r| {
        [Some(r.tops), r.modelled_tops(), r.field, r.rated]
            .into_iter()
            .flatten()
    });
    let (lo, hi) = values.fold((f64::MAX, f64::MIN), |(lo, hi), v| (lo.min(v), hi.max(v)));
    let (lo, hi) = if lo > hi {
        (1e-3, 1.0)
    } else {
        (lo / 2.0, hi * 8.0)
    };
    let width = (150 + 140 * n).max(960) as u32;
    let root = SVGBackend::new(path, (width, 540)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(-0.5f64..(n as f64 - 0.5), (lo..hi).log_scale())?;
    chart
        .configure_mesh()
        .x_labels(n)
        .x_label_formatter(&|x| {
            let i = x.round();
            if (x - i).abs() < 1e-6 && i >= 0.0 {
                labels.get(i as usize).cloned().unwrap_or_default()
            } else {
                String::new()
            }
        })
        .x_label_style(("sans-serif", 13))
        .disable_x_mesh()
        .y_desc("TOPS (log scale)")
        .draw()?;
    let series = |f: &dyn Fn(&Measured) -> Option<f64>| -> Vec<(f64, f64)> {
        rows.iter()
            .enumerate()
            .filter_map(|(i, r)| f(r).map(|v| (i as f64, v)))
            .collect()
    };
    let ours = series(&|r| Some(r.tops));
    let modelled = series(&|r| r.modelled_tops());
    let field = series(&|r| r.field);
    let rated = series(&|r| r.rated);
    // Field figures are hollow rings drawn around the points (the model matches them where it
    // was calibrated); lines only guide the eye between the cases.
    let styles = [
        (ours, BLUE, ours_label.to_string(), false),
        (modelled, RED, "RK3588 cost model".to_string(), false),
        (field, GREEN, "field (librknnrt 2.3.2)".to_string(), true),
        (
            rated,
            BLACK,
            "rated (2 TOPS per core, i8)".to_string(),
            false,
        ),
    ];
    for (points, color, name, ring) in styles {
        if points.is_empty() {
            continue;
        }
        if ring {
            chart
                .draw_series(
                    points
                        .into_iter()
                        .map(move |p| Circle::new(p, 9, color.stroke_width(3))),
                )?
                .label(name)
                .legend(move |(x, y)| Circle::new((x + 10, y), 6, color.stroke_width(2)));
        } else {
            chart
                .draw_series(LineSeries::new(points.clone(), color.mix(0.4)))?
                .label(name)
                .legend(move |(x, y)| Circle::new((x + 10, y), 4, color.filled()));
            chart.draw_series(
                points
                    .into_iter()
                    .map(move |p| Circle::new(p, 5, color.filled())),
            )?;
        }
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperRight)
        .draw()?;
    root.present()?;
    Ok(())
}

/// Runs `main`, printing an error with `Display` (not `Debug`) and exiting non-zero.
pub fn run(
    name: &str,
    main: impl FnOnce() -> Result<bool, Box<dyn std::error::Error>>,
) -> std::process::ExitCode {
    match main() {
        Ok(true) => std::process::ExitCode::SUCCESS,
        Ok(false) => {
            eprintln!("{name}: a result differed from the host reference (see the table)");
            std::process::ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("{name}: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rknn_matmul::{Core, Platform};

    /// The emulator in its default configuration, whatever `RKNN_EMU_*` the tests inherit.
    fn emulator() -> Runtime {
        let opts = rknn_matmul::RuntimeOptions {
            emulator: rknn_matmul::EmuConfig::default(),
            ..rknn_matmul::RuntimeOptions::default()
        };
        Runtime::open(rknn_matmul::Backend::Emulator(Platform::Rk3588), opts).unwrap()
    }

    fn case(m: usize, k: usize, n: usize, dtype: Dtype, layout: LayoutArg) -> Case {
        Case {
            shape: Shape { m, k, n },
            dtype,
            layout,
            quant: QuantArg::PerLayer,
        }
    }

    #[test]
    fn shapes_parse_and_bad_ones_say_why() {
        assert_eq!(
            "4096x512x32".parse::<Shape>(),
            Ok(Shape {
                m: 4096,
                k: 512,
                n: 32
            })
        );
        let e = "4096x0x32".parse::<Shape>().unwrap_err();
        assert!(e.contains("\"0\"") && e.contains("positive"), "{e}");
        assert!("64x64".parse::<Shape>().unwrap_err().contains("MxKxN"));
    }

    #[test]
    fn every_type_and_layout_is_verified_against_the_host_reference() {
        let rt = emulator();
        for (dtype, layout) in [
            (Dtype::I8, LayoutArg::Native),
            (Dtype::I8, LayoutArg::Norm),
            (Dtype::I8, LayoutArg::TpNorm),
            (Dtype::F16, LayoutArg::Native),
            (Dtype::F16, LayoutArg::Norm),
            (Dtype::I4, LayoutArg::Native),
        ] {
            let c = case(5, 96, 128, dtype, layout);
            let check = match dtype {
                Dtype::I8 => prepare::<I8xI8ToI32>(&rt, &c, Core::Index(1), 0).map(|r| r.check),
                Dtype::F16 => prepare::<F16xF16ToF32>(&rt, &c, Core::Auto, 0).map(|r| r.check),
                Dtype::I4 => prepare::<I4xI4ToI16>(&rt, &c, Core::Auto, 0).map(|r| r.check),
            }
            .unwrap();
            assert!(check.ok, "{c:?}: {}", check.text);
            assert_eq!(check.text, "verified (all 640 entries)");
        }
    }

    #[test]
    fn a_wrong_entry_is_caught() {
        let s = Shape { m: 3, k: 64, n: 32 };
        let mut rng = fastrand::Rng::with_seed(7);
        let ops = I8xI8ToI32::operands(&mut rng, s);
        // The reference, computed independently of `verify`.
        let mut c: Vec<i32> = (0..s.m * s.n)
            .map(|idx| {
                let (i, j) = (idx / s.n, idx % s.n);
                (0..s.k)
                    .map(|kk| ops.a[i * s.k + kk] as i32 * ops.b[kk * s.n + j] as i32)
                    .sum()
            })
            .collect();
        assert!(verify::<I8xI8ToI32>(&ops, s, &c, &mut rng).ok);
        c[2 * s.n + 5] += 1;
        let check = verify::<I8xI8ToI32>(&ops, s, &c, &mut rng);
        assert!(!check.ok);
        assert!(check.text.contains("C[2][5]"), "{}", check.text);
        // f16: an error far beyond f32 accumulation is caught, rounding is not.
        let ops = F16xF16ToF32::operands(&mut rng, s);
        let mut c: Vec<f32> = (0..s.m * s.n)
            .map(|idx| {
                let (i, j) = (idx / s.n, idx % s.n);
                (0..s.k)
                    .map(|kk| ops.a[i * s.k + kk] * ops.b[kk * s.n + j])
                    .sum()
            })
            .collect();
        assert!(verify::<F16xF16ToF32>(&ops, s, &c, &mut rng).ok);
        c[0] += 0.01;
        assert!(!verify::<F16xF16ToF32>(&ops, s, &c, &mut rng).ok);
    }

    #[test]
    fn large_results_are_sampled() {
        let rt = emulator();
        let r = prepare::<I8xI8ToI32>(
            &rt,
            &case(512, 1024, 512, Dtype::I8, LayoutArg::Native),
            Core::Auto,
            0,
        )
        .unwrap();
        assert_eq!(r.check.text, "verified (2048 sampled entries)");
    }

    #[test]
    fn int4_stays_within_i16() {
        // 64·K > 32767 from K = 512 on: narrower values keep every sum exact.
        let mut rng = fastrand::Rng::with_seed(1);
        for k in [64, 1024, 8704] {
            let ops = I4xI4ToI16::operands(&mut rng, Shape { m: 1, k, n: 1 });
            let max = ops.a.iter().chain(&ops.b).fold(0f32, |m, v| m.max(v.abs()));
            assert!(f64::from(max * max) * k as f64 <= 32767.0, "k={k}");
        }
    }

    #[test]
    fn json_has_exactly_the_fields_of_the_issue() {
        let m = Measured {
            case: case(1, 64, 32, Dtype::I8, LayoutArg::Native),
            contexts: 2,
            ms_per_run: 1.0,
            tops: 0.5,
            rated: Some(4.0),
            field: None,
            modelled_ms: Some(2.0),
            verified: true,
            check: String::new(),
        };
        let v = m.json();
        let mut keys: Vec<&str> = v.as_object().unwrap().keys().map(|k| k.as_str()).collect();
        keys.sort_unstable();
        let mut want = [
            "m",
            "k",
            "n",
            "type",
            "layout",
            "contexts",
            "ms_per_run",
            "tops",
            "pct_of_rated",
            "verified",
            "modelled_ms",
        ];
        want.sort_unstable();
        assert_eq!(keys, want);
        assert_eq!(v["pct_of_rated"], 12.5);
        assert_eq!(v["type"], "i8");
        assert_eq!(v["layout"], "native");
        // The model's throughput is aggregated over the contexts: 2 × 4096 ops in 2 ms.
        assert!((m.modelled_tops().unwrap() - 2.0 * 4096.0 / 2e-3 / 1e12).abs() < 1e-12);
    }

    #[test]
    fn field_figures_only_for_the_measured_cases() {
        let sq = case(4096, 4096, 4096, Dtype::I8, LayoutArg::Norm);
        assert_eq!(field_tops(&sq, 1).unwrap().0, 0.69);
        assert_eq!(field_tops(&sq, 3).unwrap().0, 1.83);
        let f16 = Case {
            dtype: Dtype::F16,
            ..sq
        };
        assert!(field_tops(&f16, 1).is_none());
        assert!(field_tops(&case(256, 256, 256, Dtype::I8, LayoutArg::Norm), 1).is_none());
    }
}
