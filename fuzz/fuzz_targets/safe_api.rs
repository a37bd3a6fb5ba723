//! Random sequences of safe-API calls against the emulator: create contexts of three types with
//! arbitrary shapes, layouts, dynamic M lists, cores and quantisation parameters; allocate,
//! write, convert B to the native layout, run, select M and drop contexts and memories in any
//! order, binding memories of the wrong matrix or of another context.
//!
//! Checked after every call: a bad request is a typed error, and the run errors are exactly
//! the ones the bound memories call for (foreign, wrong matrix, too small, computed here from
//! what the target knows); every successful run equals a reference computed here from the
//! memories' contents (i8 exactly, f16 within the f32 rounding bound, i8 → f32 within one
//! rounding of the exact sum times the scales); at the end every handle is back.
#![no_main]

use half::f16;
use libfuzzer_sys::fuzz_target;
use rknn_matmul::{
    BQuant, Core, Error, F16xF16ToF32, I8xI8ToF32, I8xI8ToI32, LayerQuant, Layout, Matmul, Matrix,
    Platform, Runtime, RuntimeOptions, TensorMem,
};

struct Input<'a>(&'a [u8]);

impl Input<'_> {
    fn u8(&mut self) -> u8 {
        match self.0.split_first() {
            Some((&b, rest)) => {
                self.0 = rest;
                b
            }
            None => 0,
        }
    }
    fn pick<T: Clone>(&mut self, from: &[T]) -> T {
        from[self.u8() as usize % from.len()].clone()
    }
    fn done(&self) -> bool {
        self.0.is_empty()
    }
}

enum Kind {
    I8(Matmul<I8xI8ToI32>),
    F16(Matmul<F16xF16ToF32>),
    /// With A's scale and B's per-channel (or per-layer, one value) scales.
    I8F32(Matmul<I8xI8ToF32>, f32, Vec<f32>),
}

struct Ctx {
    id: usize,
    kind: Kind,
    b_layout: Layout,
    ac_layout: Layout,
}

enum Data {
    I8(TensorMem<i8>),
    I32(TensorMem<i32>),
    F16(TensorMem<f16>),
    F32(TensorMem<f32>),
}

struct Mem {
    ctx: usize,
    matrix: Matrix,
    shared: bool,
    data: Data,
    /// For B converted to the native layout: the normal-layout source, while unchanged.
    native_src: Option<Vec<i64>>,
}

impl Mem {
    fn bytes(&self) -> u64 {
        match &self.data {
            Data::I8(m) => m.bytes(),
            Data::I32(m) => m.bytes(),
            Data::F16(m) => m.bytes(),
            Data::F32(m) => m.bytes(),
        }
    }
}

/// Dims (M, K, N) worth trying: aligned, unaligned, zero, beyond i32, and K past RK3588's
/// 8192-row segment.
const MS: [usize; 8] = [1, 2, 3, 5, 8, 16, 33, 0];
const KS: [usize; 9] = [32, 64, 96, 128, 16, 33, 0, 1 << 31, 8224];
const NS: [usize; 9] = [32, 64, 96, 16, 48, 100, 0, usize::MAX, 1 << 31];

/// A reference read of an operand in its layout: element (row, col) of a logical [rows, cols]
/// matrix stored `layout`, with the RK3588 tiles of the fact sheet (A: sK = 16 for i8, 8 for
/// f16; C: sN = 4 for 32-bit outputs).
fn a_at(layout: Layout, m: usize, k: usize, sk: usize, r: usize, c: usize) -> usize {
    match layout {
        Layout::Native => ((c / sk) * m + r) * sk + c % sk,
        _ => r * k + c,
    }
}

fn c_at(layout: Layout, m: usize, n: usize, r: usize, j: usize) -> usize {
    match layout {
        Layout::Native => ((j / 4) * m + r) * 4 + j % 4,
        _ => r * n + j,
    }
}

fn b_at(layout: Layout, k: usize, n: usize, x: usize, j: usize) -> usize {
    match layout {
        Layout::TpNorm => j * k + x,
        _ => x * n + j,
    }
}

/// The first error `run` must return for these operands, if any (A, then B, then C; per
/// operand: another context's unshared memory, the wrong matrix, too small).
fn expected_error(ctx: &Ctx, ops: [&Mem; 3], needed: [u64; 3]) -> Option<(u8, Matrix)> {
    for (i, (m, matrix)) in ops.iter().zip(Matrix::ALL).enumerate() {
        if m.ctx != ctx.id && !m.shared {
            return Some((0, matrix));
        }
        if m.matrix != matrix {
            return Some((1, matrix));
        }
        if m.bytes() < needed[i] {
            return Some((2, matrix));
        }
    }
    None
}

fn classify(e: &Error) -> (u8, Matrix) {
    match e {
        Error::ForeignMemory { matrix } => (0, *matrix),
        Error::WrongMatrix { passed_as, .. } => (1, *passed_as),
        Error::MemoryTooSmall { matrix, .. } => (2, *matrix),
        other => panic!("unexpected run error: {other}"),
    }
}

fn fill(inp: &mut Input, m: &mut Mem) {
    let seed = inp.u8();
    let mut x = u32::from(seed).wrapping_mul(2_654_435_761) | 1;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        x
    };
    match &mut m.data {
        Data::I8(t) => t.as_mut_slice().iter_mut().for_each(|v| *v = next() as i8),
        Data::I32(t) => t.as_mut_slice().iter_mut().for_each(|v| *v = next() as i32),
        // Finite values: quarters in -8..8 keep every product and sum exact enough to bound.
        Data::F16(t) => t
            .as_mut_slice()
            .iter_mut()
            .for_each(|v| *v = f16::from_f32((next() as i8) as f32 / 16.0)),
        Data::F32(t) => t.as_mut_slice().iter_mut().for_each(|v| *v = next() as f32),
    }
    m.native_src = None;
}

/// Runs `mm` on the three memories and checks the outcome.
fn run_and_check(ctx: &Ctx, a: &Mem, b: &Mem, c: &mut Mem) {
    let (ac, bl) = (ctx.ac_layout, ctx.b_layout);
    macro_rules! go {
        ($mm:expr, $A:ident, $B:ident, $C:ident) => {{
            let io = $mm.io_attr();
            let needed = [io.A.size.into(), io.B.size.into(), io.C.size.into()];
            let expect = expected_error(ctx, [a, b, &*c], needed);
            let (Data::$A(am), Data::$B(bm)) = (&a.data, &b.data) else {
                return;
            };
            let Data::$C(cm) = &mut c.data else {
                return;
            };
            let r = $mm.run(am, bm, cm);
            match (&r, expect) {
                (Ok(()), None) => {}
                (Err(e), Some(want)) => {
                    assert_eq!(classify(e), want, "{e}");
                    return;
                }
                (r, want) => panic!("run gave {r:?}, expected {want:?}"),
            }
            ($mm.shape(), am.as_slice(), bm.as_slice(), cm.as_slice())
        }};
    }
    match &ctx.kind {
        Kind::I8(mm) => {
            let ((m, k, n), a, bs, c) = go!(mm, I8, I8, I32);
            let Some(bv) = b_values(bl, b, bs.iter().map(|&v| i64::from(v))) else {
                return;
            };
            for r in 0..m {
                for j in 0..n {
                    let want: i64 = (0..k)
                        .map(|x| i64::from(a[a_at(ac, m, k, 16, r, x)]) * bv[b_at(bl, k, n, x, j)])
                        .sum();
                    assert_eq!(i64::from(c[c_at(ac, m, n, r, j)]), want, "({r}, {j})");
                }
            }
        }
        Kind::F16(mm) => {
            let ((m, k, n), a, bs, c) = go!(mm, F16, F16, F32);
            // Values are multiples of 1/16 below 8: every product is an exact multiple of
            // 1/256 (in f32 too), and the exact sum is known. The f32 accumulation in any order
            // is within (K - 1) · 2^-24 · Σ|products| of it (exact while the partial sums stay
            // below 2^16, where every multiple of 1/256 is an f32).
            let Some(bv) = b_values(bl, b, bs.iter().map(|v| (v.to_f32() * 16.0) as i64)) else {
                return;
            };
            for r in 0..m {
                for j in 0..n {
                    let terms = (0..k).map(|x| {
                        (a[a_at(ac, m, k, 8, r, x)].to_f32() * 16.0) as i64
                            * bv[b_at(bl, k, n, x, j)]
                    });
                    let (exact, abs) = terms.fold((0i64, 0i64), |(s, t), p| (s + p, t + p.abs()));
                    let got = f64::from(c[c_at(ac, m, n, r, j)]);
                    let bound = (k as f64 - 1.0).max(0.0) * 2f64.powi(-24) * abs as f64 / 256.0;
                    let err = (got - exact as f64 / 256.0).abs();
                    assert!(
                        err <= bound,
                        "({r}, {j}): {got} vs {} (bound {bound})",
                        exact as f64 / 256.0
                    );
                }
            }
        }
        Kind::I8F32(mm, sa, sb) => {
            let ((m, k, n), a, bs, c) = go!(mm, I8, I8, F32);
            let Some(bv) = b_values(bl, b, bs.iter().map(|&v| i64::from(v))) else {
                return;
            };
            for r in 0..m {
                for j in 0..n {
                    let acc: i64 = (0..k)
                        .map(|x| i64::from(a[a_at(ac, m, k, 16, r, x)]) * bv[b_at(bl, k, n, x, j)])
                        .sum();
                    let s = if sb.len() == 1 { sb[0] } else { sb[j] };
                    let want = acc as f64 * f64::from(*sa) * f64::from(s);
                    let got = f64::from(c[c_at(ac, m, n, r, j)]);
                    assert!(
                        (got - want).abs() <= want.abs() * 1e-6 + 1e-30,
                        "({r}, {j}): {got} vs {want}"
                    );
                }
            }
        }
    }
}

/// Converts a random normal-layout B into `mem` through `c`, checking the outcome.
fn convert(c: &Ctx, mem: &mut Mem, seed: u8) {
    let foreign = mem.ctx != c.id;
    macro_rules! convert {
        ($mm:expr, $B:ident, $val:expr, $back:expr) => {{
            let Data::$B(dst) = &mut mem.data else {
                return;
            };
            let (_, k, n) = $mm.shape();
            let src: Vec<_> = (0..k * n)
                .map(|x| $val((x as u32).wrapping_mul(seed as u32 * 7 + 3) as i8))
                .collect();
            let r = $mm.b_to_native(&src, dst);
            match (&r, c.b_layout == Layout::Native, foreign) {
                (Ok(()), true, false) => {
                    mem.native_src = Some(src.iter().map($back).collect());
                }
                (Err(Error::NeedsNativeB { .. }), false, _) => {}
                (Err(Error::ForeignMemory { matrix: Matrix::B }), true, true) => {}
                (Err(Error::MemoryTooSmall { .. }), true, false) => {}
                (r, native, foreign) => {
                    panic!("b_to_native: {r:?} (native {native}, foreign {foreign})")
                }
            }
        }};
    }
    match &c.kind {
        Kind::I8(mm) => convert!(mm, I8, |v: i8| v, |&v: &i8| i64::from(v)),
        Kind::I8F32(mm, ..) => convert!(mm, I8, |v: i8| v, |&v: &i8| i64::from(v)),
        Kind::F16(mm) => convert!(
            mm,
            F16,
            |v: i8| f16::from_f32(v as f32 / 16.0),
            |v: &f16| (v.to_f32() * 16.0) as i64
        ),
    }
}

/// Whether `data` has the element type of `matrix` in a context of this kind.
fn fits(kind: &Kind, matrix: Matrix, data: &Data) -> bool {
    matches!(
        (kind, matrix, data),
        (
            Kind::I8(_) | Kind::I8F32(..),
            Matrix::A | Matrix::B,
            Data::I8(_)
        ) | (Kind::I8(_), Matrix::C, Data::I32(_))
            | (Kind::I8F32(..), Matrix::C, Data::F32(_))
            | (Kind::F16(_), Matrix::A | Matrix::B, Data::F16(_))
            | (Kind::F16(_), Matrix::C, Data::F32(_))
    )
}

/// B's values in the normal or transposed layout (as they were written), or the normal-layout
/// source of a native B; `None` when a native B was written directly.
fn b_values(layout: Layout, b: &Mem, raw: impl Iterator<Item = i64>) -> Option<Vec<i64>> {
    match layout {
        Layout::Native => b.native_src.clone(),
        _ => Some(raw.collect()),
    }
}

fuzz_target!(|data: &[u8]| {
    let mut inp = Input(data);
    let mut opts = RuntimeOptions {
        handle_budget: Some(12),
        raise_fd_limit: rknn_matmul::GuardPolicy::Never,
        ..RuntimeOptions::default()
    };
    opts.emulator.strict_cache = inp.u8() & 1 == 1;
    opts.emulator.log_errors = false;
    let rt = Runtime::open(rknn_matmul::Backend::Emulator(Platform::Rk3588), opts)
        .expect("the emulator opens");
    let mut ctxs: Vec<Ctx> = Vec::new();
    let mut mems: Vec<Mem> = Vec::new();
    let mut next_id = 0;
    let mut ops = 0;
    while !inp.done() && ops < 48 {
        ops += 1;
        match inp.u8() % 9 {
            0 | 1 => {
                let (m, k, n) = (inp.pick(&MS), inp.pick(&KS), inp.pick(&NS));
                let b_layout = inp.pick(&[Layout::Norm, Layout::Native, Layout::TpNorm]);
                let ac_layout = inp.pick(&[Layout::Norm, Layout::Native, Layout::TpNorm]);
                let core = inp.pick(&[Core::Auto, Core::Index(0), Core::Index(2), Core::Index(3)]);
                let dynamic: Option<Vec<usize>> = match inp.u8() % 4 {
                    0 => Some((0..inp.u8() % 4).map(|_| inp.pick(&MS)).collect()),
                    _ => None,
                };
                macro_rules! builder {
                    ($K:ty) => {{
                        let mut bld = rt
                            .matmul::<$K>(m, k, n)
                            .b_layout(b_layout)
                            .ac_layout(ac_layout)
                            .core(core);
                        if let Some(d) = &dynamic {
                            bld = bld.dynamic_m(d);
                        }
                        bld
                    }};
                }
                let kind = match inp.u8() % 3 {
                    0 => builder!(I8xI8ToI32).build().map(Kind::I8),
                    1 => builder!(F16xF16ToF32).build().map(Kind::F16),
                    _ => {
                        let sa = inp.pick(&[0.5f32, 1.0, 1e-3, f32::NAN, -1.0]);
                        let per_channel = inp.u8() % 2 == 0;
                        let len = if per_channel {
                            inp.pick(&[n, n, 1, 0])
                        } else {
                            1
                        };
                        let sb: Vec<f32> = (0..len.min(4096))
                            .map(|j| {
                                inp.pick(&[0.25f32, 2.0, 1.0 / (j + 1) as f32, 0.0, f32::INFINITY])
                            })
                            .collect();
                        let q = if per_channel {
                            BQuant::PerChannel {
                                scales: sb.clone(),
                                zps: vec![],
                            }
                        } else {
                            BQuant::PerLayer {
                                scale: sb[0],
                                zp: 0,
                            }
                        };
                        builder!(I8xI8ToF32)
                            .quant_a(LayerQuant { scale: sa, zp: 0 })
                            .quant_b(q)
                            .build()
                            .map(|mm| Kind::I8F32(mm, sa, sb))
                    }
                };
                match kind {
                    Ok(kind) => {
                        ctxs.push(Ctx {
                            id: next_id,
                            kind,
                            b_layout,
                            ac_layout,
                        });
                        next_id += 1;
                    }
                    // Refused before or by the runtime, with a message.
                    Err(e) => assert!(!e.to_string().is_empty()),
                }
            }
            2 if !ctxs.is_empty() => {
                let c = &ctxs[inp.u8() as usize % ctxs.len()];
                // One memory, or A, B and C at once (what most programs do).
                let which: &[Matrix] = match inp.u8() % 4 {
                    0 => &Matrix::ALL,
                    i => &Matrix::ALL[usize::from(i - 1)..usize::from(i)],
                };
                for &matrix in which {
                    let shared = inp.u8() % 4 == 0;
                    let extra = inp.pick(&[0usize, 1, 4096]);
                    macro_rules! alloc {
                        ($mm:expr, $A:ident, $B:ident, $C:ident) => {
                            match (matrix, shared) {
                                (Matrix::A, false) => $mm.alloc_a().map(Data::$A),
                                (Matrix::A, true) => $mm.alloc_shared_a(extra).map(Data::$A),
                                (Matrix::B, _) => $mm.alloc_b().map(Data::$B),
                                (Matrix::C, false) => $mm.alloc_c().map(Data::$C),
                                (Matrix::C, true) => $mm.alloc_shared_c(extra).map(Data::$C),
                            }
                        };
                    }
                    let r = match &c.kind {
                        Kind::I8(mm) => alloc!(mm, I8, I8, I32),
                        Kind::F16(mm) => alloc!(mm, F16, F16, F32),
                        Kind::I8F32(mm, ..) => alloc!(mm, I8, I8, F32),
                    };
                    match r {
                        Ok(data) => mems.push(Mem {
                            ctx: c.id,
                            matrix,
                            shared: shared && matrix != Matrix::B,
                            data,
                            native_src: None,
                        }),
                        Err(e) => {
                            assert!(
                                matches!(
                                    e,
                                    Error::HandleBudget {
                                        live: 12,
                                        budget: 12
                                    }
                                ),
                                "{e}"
                            );
                            assert_eq!(rt.handle_budget().live(), 12);
                        }
                    }
                }
                // A complete program: write A, write or convert B, run.
                let n = mems.len();
                if which.len() == 3 && n >= 3 && mems[n - 3..].iter().all(|m| m.ctx == c.id) {
                    fill(&mut inp, &mut mems[n - 3]);
                    let seed = inp.u8();
                    match c.b_layout {
                        Layout::Native => convert(c, &mut mems[n - 2], seed),
                        _ => fill(&mut inp, &mut mems[n - 2]),
                    }
                    let mut cm = mems.pop().expect("three memories");
                    run_and_check(c, &mems[n - 3], &mems[n - 2], &mut cm);
                    mems.push(cm);
                }
            }
            3 if !mems.is_empty() => {
                let i = inp.u8() as usize % mems.len();
                fill(&mut inp, &mut mems[i]);
            }
            4 if !ctxs.is_empty() && mems.len() >= 3 => {
                let c = &ctxs[inp.u8() as usize % ctxs.len()];
                // Mostly operands of the right element types (the others cannot be passed).
                let pick = |matrix: Matrix, inp: &mut Input| {
                    let fits: Vec<usize> = (0..mems.len())
                        .filter(|&i| fits(&c.kind, matrix, &mems[i].data))
                        .collect();
                    match (inp.u8() % 4, fits.is_empty()) {
                        (0, _) | (_, true) => inp.u8() as usize % mems.len(),
                        _ => fits[inp.u8() as usize % fits.len()],
                    }
                };
                let (ia, ib, ic) = (
                    pick(Matrix::A, &mut inp),
                    pick(Matrix::B, &mut inp),
                    pick(Matrix::C, &mut inp),
                );
                if ic == ia || ic == ib {
                    continue;
                }
                // C is borrowed mutably: take it out for the call.
                let mut cm = mems.swap_remove(ic);
                let fix = |i: usize| if i == mems.len() { ic } else { i };
                let (ia, ib) = (fix(ia), fix(ib));
                run_and_check(c, &mems[ia], &mems[ib], &mut cm);
                mems.push(cm);
            }
            5 if !ctxs.is_empty() => {
                let c = &ctxs[inp.u8() as usize % ctxs.len()];
                let m = inp.pick(&MS);
                let (r, ms) = match &c.kind {
                    Kind::I8(mm) => (mm.set_m(m), mm.m_values().to_vec()),
                    Kind::F16(mm) => (mm.set_m(m), mm.m_values().to_vec()),
                    Kind::I8F32(mm, ..) => (mm.set_m(m), mm.m_values().to_vec()),
                };
                match r {
                    Ok(()) => assert!(ms.contains(&m)),
                    Err(Error::UnknownM { m: got, shapes }) => {
                        assert!(!ms.contains(&m) && got == m && shapes == ms)
                    }
                    Err(e) => panic!("set_m({m}): {e}"),
                }
            }
            6 if !ctxs.is_empty() && !mems.is_empty() => {
                // B to the native layout from a random normal-layout source.
                let c = &ctxs[inp.u8() as usize % ctxs.len()];
                // Mostly a B of this context.
                let own: Vec<usize> = (0..mems.len())
                    .filter(|&i| mems[i].ctx == c.id && mems[i].matrix == Matrix::B)
                    .collect();
                let i = match (inp.u8() % 4, own.is_empty()) {
                    (0, _) | (_, true) => inp.u8() as usize % mems.len(),
                    _ => own[inp.u8() as usize % own.len()],
                };
                let seed = inp.u8();
                convert(c, &mut mems[i], seed);
            }
            7 if !ctxs.is_empty() => {
                ctxs.swap_remove(inp.u8() as usize % ctxs.len());
            }
            8 if !mems.is_empty() => {
                mems.swap_remove(inp.u8() as usize % mems.len());
            }
            _ => {}
        }
        assert!(rt.handle_budget().live() <= 12);
    }
    drop(ctxs);
    drop(mems);
    assert_eq!(rt.handle_budget().live(), 0);
    let s = rt.emulator_instance().expect("an emulator").stats();
    assert_eq!((s.contexts, s.memories, s.orphaned_memories), (0, 0, 0));
    assert!(rt.take_release_errors().is_empty());
});
