//! One matmul through the C API, as every check that runs one does it: create, set quant
//! params, allocate from the sizes `io_attr` reports, write A and B in the configured layouts
//! (tiles read from the runtime's own `io_attr`, so a run check is independent of the layout
//! checks), sync, bind, run, sync back, read C into row-major values.

use std::sync::Arc;

use half::f16;
use rknn_chip::layout::{self, NativeB};
use rknn_chip::{ElemKind, Layout, MatmulType, Platform};
use rknn_sys as sys;
use serde_json::json;

use super::observe::{Item, Observation, Operands, Value};
use super::raw::{Ctx, Mem, Which};

/// Quantisation of B.
#[derive(Clone, Debug, Default, PartialEq)]
pub enum BQuant {
    /// None set (the runtime's defaults).
    #[default]
    Unset,
    /// One scale and zero point.
    Layer(f32, i32),
    /// N scales and 0 or N zero points.
    Channel(Vec<f32>, Vec<i32>),
    /// Group size G, N × K / G scales and 0 or as many zero points, in the order given.
    Group(usize, Vec<f32>, Vec<i32>),
}

impl BQuant {
    /// A short JSON description: the kind, the lengths and the first values.
    fn describe(&self) -> serde_json::Value {
        let first = |v: &[f32]| v.iter().take(8).copied().collect::<Vec<f32>>();
        let first_zp = |v: &[i32]| v.iter().take(8).copied().collect::<Vec<i32>>();
        match self {
            BQuant::Unset => serde_json::Value::Null,
            BQuant::Layer(s, z) => json!({"per": "layer", "scale": s, "zp": z}),
            BQuant::Channel(s, z) => json!({
                "per": "channel", "scales": s.len(), "first_scales": first(s),
                "zps": z.len(), "first_zps": first_zp(z),
            }),
            BQuant::Group(g, s, z) => json!({
                "per": "group", "group_size": g, "order": "[K/G][N]", "scales": s.len(),
                "first_scales": first(s), "zps": z.len(), "first_zps": first_zp(z),
            }),
        }
    }
}

/// One matmul configuration with its inputs.
#[derive(Clone, Debug)]
pub struct Case {
    /// The type.
    pub t: MatmulType,
    /// M, K, N.
    pub m: usize,
    /// K.
    pub k: usize,
    /// N.
    pub n: usize,
    /// Layout of B.
    pub b_layout: Layout,
    /// Layout of A and C.
    pub ac_layout: Layout,
    /// A as logical values [M, K].
    pub a: Vec<f32>,
    /// B as logical values [K, N].
    pub b: Vec<f32>,
    /// Scale and zero point of A.
    pub qa: Option<(f32, i32)>,
    /// Quantisation of B.
    pub qb: BQuant,
    /// Scale and zero point of C.
    pub qc: Option<(f32, i32)>,
    /// The seed the inputs were made from (reported with a difference).
    pub seed: u64,
}

/// Short name of a layout in keys.
pub fn layout_name(l: Layout) -> &'static str {
    match l {
        Layout::Norm => "norm",
        Layout::Native => "native",
        Layout::TpNorm => "tp_norm",
    }
}

/// Short name of a matmul type in keys: its number and element kinds.
pub fn type_name(t: MatmulType) -> String {
    format!("type {} ({}x{}->{})", t.raw(), t.a, t.b, t.c)
}

impl Case {
    /// A case with random inputs of the type's ranges from `seed`, no quant params, normal
    /// layouts.
    pub fn random(t: MatmulType, m: usize, k: usize, n: usize, seed: u64) -> Case {
        let mut rng = fastrand::Rng::with_seed(seed);
        let a = random_values(&mut rng, t.a, m * k);
        let b = random_values(&mut rng, t.b, k * n);
        Case {
            t,
            m,
            k,
            n,
            b_layout: Layout::Norm,
            ac_layout: Layout::Norm,
            a,
            b,
            qa: None,
            qb: BQuant::Unset,
            qc: None,
            seed,
        }
    }

    /// The same case with other layouts.
    pub fn layouts(mut self, b: Layout, ac: Layout) -> Case {
        self.b_layout = b;
        self.ac_layout = ac;
        self
    }

    /// The name of the case in keys.
    pub fn name(&self) -> String {
        format!(
            "{} M={} K={} N={} B={} AC={}",
            type_name(self.t),
            self.m,
            self.k,
            self.n,
            layout_name(self.b_layout),
            layout_name(self.ac_layout)
        )
    }

    /// `rknn_matmul_info` of the case.
    pub fn info(&self) -> sys::rknn_matmul_info {
        let (bq, group) = match &self.qb {
            BQuant::Unset => (0, 0),
            BQuant::Layer(_, zp) => (i16::from(*zp != 0), 0),
            BQuant::Channel(_, zps) => (if zps.is_empty() { 2 } else { 3 }, 0),
            BQuant::Group(g, _, zps) => (if zps.is_empty() { 4 } else { 5 }, *g),
        };
        let ac_asym = [self.qa, self.qc].iter().flatten().any(|q| q.1 != 0);
        sys::rknn_matmul_info {
            M: self.m as i32,
            K: self.k as i32,
            N: self.n as i32,
            type_: self.t.raw(),
            B_layout: self.b_layout.raw() as i16,
            AC_layout: self.ac_layout.raw() as i16,
            B_quant_type: bq,
            AC_quant_type: i16::from(ac_asym),
            group_size: i16::try_from(group).unwrap_or(i16::MAX),
            ..Default::default()
        }
    }

    fn operands(&self) -> Arc<Operands> {
        Arc::new(Operands {
            describe: json!({
                "type": self.t.raw(),
                "type_name": self.t.c_name(),
                "m": self.m, "k": self.k, "n": self.n,
                "b_layout": layout_name(self.b_layout),
                "ac_layout": layout_name(self.ac_layout),
                "quant_a": self.qa.map(|q| json!([q.0, q.1])),
                "quant_b": self.qb.describe(),
                "quant_c": self.qc.map(|q| json!([q.0, q.1])),
                "seed": self.seed,
            }),
            a: self.a.clone(),
            b: self.b.clone(),
            mkn: (self.m, self.k, self.n),
        })
    }

    /// Sets the case's quant params on `ctx`, recording each code; false after a failure.
    pub fn set_quant(
        &self,
        ctx: &Ctx<'_>,
        key: &str,
        items: &mut Observation,
    ) -> Result<bool, String> {
        let mut params: Vec<(&str, Vec<f32>, Vec<i32>)> = Vec::new();
        if let Some((s, z)) = self.qa {
            params.push(("A", vec![s], vec![z]));
        }
        match &self.qb {
            BQuant::Unset => {}
            BQuant::Layer(s, z) => params.push(("B", vec![*s], vec![*z])),
            BQuant::Channel(s, z) | BQuant::Group(_, s, z) => {
                params.push(("B", s.clone(), z.clone()))
            }
        }
        if let Some((s, z)) = self.qc {
            params.push(("C", vec![s], vec![z]));
        }
        for (name, s, z) in params {
            let rc = ctx
                .set_quant(name, &s, &z)
                .map_err(|m| format!("{} is missing", m.0))?;
            items.push(Item::new(
                format!("{key}: set_quant_params {name}"),
                Value::Code(rc),
            ));
            if rc != 0 {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Runs the case on `api` and records create, quant, bind and run codes and C.
    /// `Err` when the runtime lacks a function the case needs (unsupported).
    pub fn observe(
        &self,
        api: &rknn_sys::RknnApi,
        platform: Platform,
        items: &mut Observation,
    ) -> Result<(), String> {
        let key = self.name();
        let ctx = match Ctx::create(api, &self.info()) {
            Ok(c) => c,
            Err(rc) => {
                items.push(Item::new(format!("{key}: create"), Value::Code(rc)));
                return Ok(());
            }
        };
        items.push(Item::new(format!("{key}: create"), Value::Code(0)));
        if !self.set_quant(&ctx, &key, items)? {
            return Ok(());
        }
        let Some((mut a, mut b, mut c)) = alloc_abc(&ctx, &key, items) else {
            return Ok(());
        };
        a.write_synced(&self.encode_a(ctx.attr(Which::A)));
        b.write_synced(&self.encode_b(ctx.attr(Which::B), platform));
        c.bytes_mut().fill(0);
        c.sync(sys::RKNN_MEMORY_SYNC_TO_DEVICE);
        if !bind_abc(&ctx, [&a, &b, &c], &key, items) {
            return Ok(());
        }
        let rc = ctx.run();
        items.push(Item::new(format!("{key}: run"), Value::Code(rc)));
        if rc != 0 {
            return Ok(());
        }
        c.sync(sys::RKNN_MEMORY_SYNC_FROM_DEVICE);
        items.push(self.read_c(&ctx, &c, &key));
        Ok(())
    }

    /// A in the layout `attr` describes (native when it has 3 dims), encoded.
    pub fn encode_a(&self, attr: &sys::rknn_matmul_tensor_attr) -> Vec<u8> {
        let (m, k) = (self.m, self.k);
        if attr.n_dims == 3 && attr.dims[2] > 0 {
            let sk = attr.dims[2] as usize;
            let len = layout::native_a_len(m, k, sk).unwrap_or(0);
            let mut dst = vec![0f32; len];
            layout::pack_a_native(&self.a, m, k, sk, &mut dst);
            encode(self.t.a, &dst)
        } else {
            encode(self.t.a, &self.a)
        }
    }

    /// B in the case's layout (native tiles from `attr`, segments from the chip), encoded.
    pub fn encode_b(&self, attr: &sys::rknn_matmul_tensor_attr, platform: Platform) -> Vec<u8> {
        let (k, n) = (self.k, self.n);
        match self.b_layout {
            Layout::Norm => encode(self.t.b, &self.b),
            Layout::TpNorm => {
                let mut t = vec![0f32; k * n];
                for kk in 0..k {
                    for nn in 0..n {
                        t[nn * k + kk] = self.b[kk * n + nn];
                    }
                }
                encode(self.t.b, &t)
            }
            Layout::Native => {
                let (sn, sk) = if attr.n_dims == 4 {
                    (attr.dims[2] as usize, attr.dims[3] as usize)
                } else {
                    (0, 0)
                };
                match NativeB::new(k, n, sn, sk, platform.k_segment()) {
                    Some(geo) => {
                        let mut dst = vec![0f32; geo.len()];
                        geo.pack_from_kn(&self.b, &mut dst);
                        encode(self.t.b, &dst)
                    }
                    None => Vec::new(),
                }
            }
        }
    }

    /// C read back into row-major values (native when `io_attr` says 3 dims).
    pub fn read_c(&self, ctx: &Ctx<'_>, c: &Mem<'_>, key: &str) -> Item {
        let attr = ctx.attr(Which::C);
        Item {
            key: format!("{key}: C"),
            value: decode_c(self.t.c, attr, c.bytes(), self.m, self.n),
            input: Some(self.operands()),
        }
    }
}

/// Allocates A, B and C of the sizes `io_attr` reports, recording a failure.
pub fn alloc_abc<'c>(
    ctx: &'c Ctx<'_>,
    key: &str,
    items: &mut Observation,
) -> Option<(Mem<'c>, Mem<'c>, Mem<'c>)> {
    let io = *ctx.io();
    let mut mems = Vec::new();
    for (name, size) in [("A", io.A.size), ("B", io.B.size), ("C", io.C.size)] {
        match ctx.alloc(size.max(1)) {
            Some(m) => mems.push(m),
            None => {
                items.push(Item::new(
                    format!("{key}: create_mem {name} ({size} bytes)"),
                    Value::Text("failed".into()),
                ));
                return None;
            }
        }
    }
    let c = mems.pop()?;
    let b = mems.pop()?;
    let a = mems.pop()?;
    Some((a, b, c))
}

/// Binds A, B and C, recording each code; false after a failure.
pub fn bind_abc(ctx: &Ctx<'_>, mems: [&Mem<'_>; 3], key: &str, items: &mut Observation) -> bool {
    for (mem, (which, name)) in
        mems.into_iter()
            .zip([(Which::A, "A"), (Which::B, "B"), (Which::C, "C")])
    {
        let rc = ctx.bind(mem, which);
        items.push(Item::new(
            format!("{key}: set_io_mem {name}"),
            Value::Code(rc),
        ));
        if rc != 0 {
            return false;
        }
    }
    true
}

/// Encodes logical values as `kind` elements, little-endian; int4 two per byte, the even
/// element in the low nibble (\[hw\] for normal and native A; the question for native B).
pub fn encode(kind: ElemKind, values: &[f32]) -> Vec<u8> {
    match kind {
        ElemKind::I4 => {
            let v: Vec<i8> = values.iter().map(|&x| x as i8).collect();
            let mut out = vec![0u8; v.len().div_ceil(2)];
            layout::pack_i4(&v, &mut out);
            out
        }
        ElemKind::I8 => values.iter().map(|&x| x as i8 as u8).collect(),
        ElemKind::F16 => values
            .iter()
            .flat_map(|&x| f16::from_f32(x).to_le_bytes())
            .collect(),
        ElemKind::I16 => values
            .iter()
            .flat_map(|&x| (x as i16).to_le_bytes())
            .collect(),
        ElemKind::I32 => values
            .iter()
            .flat_map(|&x| (x as i32).to_le_bytes())
            .collect(),
        ElemKind::F32 => values.iter().flat_map(|&x| x.to_le_bytes()).collect(),
        _ => Vec::new(),
    }
}

/// C's bytes in the layout `attr` describes, as row-major values of `kind`.
pub fn decode_c(
    kind: ElemKind,
    attr: &sys::rknn_matmul_tensor_attr,
    bytes: &[u8],
    m: usize,
    n: usize,
) -> Value {
    let native = attr.n_dims == 3;
    let sn = if native {
        (attr.dims[2] as usize).max(1)
    } else {
        1
    };
    let index = |i: usize, j: usize| {
        if native {
            layout::native_c_index(m, sn, i, j)
        } else {
            i * n + j
        }
    };
    let width = match kind {
        ElemKind::I8 => 1,
        ElemKind::I16 | ElemKind::F16 | ElemKind::Bf16 => 2,
        _ => 4,
    };
    let at = |e: usize| bytes.get(e * width..(e + 1) * width);
    let cells = (0..m).flat_map(|i| (0..n).map(move |j| (i, j)));
    let mut ints = Vec::with_capacity(m * n);
    let mut floats = Vec::with_capacity(m * n);
    for (i, j) in cells {
        let Some(b) = at(index(i, j)) else {
            return Value::Text(format!(
                "C of {} bytes is too small for element ({i}, {j})",
                bytes.len()
            ));
        };
        match kind {
            ElemKind::I8 => ints.push(i64::from(b[0] as i8)),
            ElemKind::I16 => ints.push(i64::from(i16::from_le_bytes([b[0], b[1]]))),
            ElemKind::I32 => ints.push(i64::from(i32::from_le_bytes([b[0], b[1], b[2], b[3]]))),
            ElemKind::F16 => floats.push(f64::from(f16::from_le_bytes([b[0], b[1]]).to_f32())),
            ElemKind::F32 => floats.push(f64::from(f32::from_le_bytes([b[0], b[1], b[2], b[3]]))),
            other => return Value::Text(format!("C of kind {other} is not decoded")),
        }
    }
    match kind {
        ElemKind::F16 => Value::Floats {
            shape: (m, n),
            data: floats,
            // A few f16 ulps: the board may round its f32 sums differently.
            rel: 1.0 / 256.0,
        },
        ElemKind::F32 => Value::Floats {
            shape: (m, n),
            data: floats,
            rel: 1e-3,
        },
        _ => Value::Ints {
            shape: (m, n),
            data: ints,
        },
    }
}

/// Random logical values of `kind`: i8 with extra weight on -128 and 127, int4 in -8..=7,
/// f16 multiples of 1/64 in [-2, 2] (exact in f16).
pub fn random_values(rng: &mut fastrand::Rng, kind: ElemKind, len: usize) -> Vec<f32> {
    (0..len)
        .map(|_| match kind {
            ElemKind::I8 => match rng.u8(..16) {
                0 => -128.0,
                1 => 127.0,
                _ => f32::from(rng.i8(..)),
            },
            ElemKind::I4 => f32::from(rng.i8(-8..=7)),
            _ => f32::from(rng.i16(-128..=128)) / 64.0,
        })
        .collect()
}
