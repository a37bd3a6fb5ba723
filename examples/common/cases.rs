//! The cases the probes run: a shape, an operand type, B's layout and quantisation; their
//! operands (random values whose sums each type holds exactly), building and filling a context
//! for a case, timing its runs, and checking its first result against a host reference.

use std::time::Duration;

use clap::ValueEnum;
use half::f16;
use rknn_matmul::{
    BQuant, F16xF16ToF32, I4x2, I4xI4ToI16, I8xI8ToI32, Layout, Matmul, MatmulKind, Runtime,
    TensorMem,
};

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

/// Times `iters` runs of a ready context.
pub fn time_runs<K: ProbeKind>(r: &mut Ready<K>, iters: u32) -> rknn_matmul::Result<Duration> {
    let t = std::time::Instant::now();
    for _ in 0..iters {
        r.mm.run(&r.a, &r.b, &mut r.c)?;
    }
    Ok(t.elapsed())
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
}
