//! A test harness over the C function table, and reference encoders written from the fact
//! sheet's formulas (independent of `rknn_chip::layout`).
#![allow(dead_code)]

use half::f16;
use rknn_emu::{EmuConfig, Emulator};
use rknn_sys::*;

/// A matrix in row-major order, as plain values.
#[derive(Clone, Debug)]
pub enum Values {
    Int(Vec<i32>),
    Float(Vec<f32>),
}

/// Encodes one element of `tensor_type` little-endian (i4 handled by the caller).
fn encode(t: rknn_tensor_type, v: &Values, i: usize, out: &mut Vec<u8>) {
    match (t, v) {
        (RKNN_TENSOR_INT8, Values::Int(x)) => out.push(x[i] as i8 as u8),
        (RKNN_TENSOR_FLOAT16, Values::Float(x)) => out.extend(f16::from_f32(x[i]).to_le_bytes()),
        _ => panic!("cannot encode {t}"),
    }
}

/// Lays out a matrix given row-major as [rows, cols] into the order `order` (a list of source
/// indices, `None` for padding) and encodes it.
fn encode_order(t: rknn_tensor_type, v: &Values, order: &[Option<usize>]) -> Vec<u8> {
    if t == RKNN_TENSOR_INT4 {
        let Values::Int(x) = v else {
            panic!("int4 needs ints")
        };
        let nib: Vec<u8> = order
            .iter()
            .map(|o| o.map_or(0, |i| (x[i] as i8 as u8) & 0xf))
            .collect();
        // Even element in the low nibble.
        return nib
            .chunks(2)
            .map(|p| p[0] | (p.get(1).copied().unwrap_or(0) << 4))
            .collect();
    }
    let mut out = Vec::new();
    let zero = match v {
        Values::Int(_) => Values::Int(vec![0]),
        Values::Float(_) => Values::Float(vec![0.0]),
    };
    for o in order {
        match o {
            Some(i) => encode(t, v, *i, &mut out),
            None => encode(t, &zero, 0, &mut out),
        }
    }
    out
}

/// Order of native A `[ceil(K/sK), M, sK]`: (m, k) at ((k/sK)*M + m)*sK + k%sK.
pub fn native_a_order(m: usize, k: usize, sk: usize) -> Vec<Option<usize>> {
    let mut order = vec![None; k.div_ceil(sk) * m * sk];
    for mm in 0..m {
        for kk in 0..k {
            order[((kk / sk) * m + mm) * sk + kk % sk] = Some(mm * k + kk);
        }
    }
    order
}

/// Order of native B, including K segmentation: T = ceil(K/S) blocks stored one after
/// another, each laid out `[ceil(N/sN), ceil(Ks/sK), sN, sK]` for its own Ks. Source is
/// row-major [K, N].
pub fn native_b_order(
    k: usize,
    n: usize,
    sn: usize,
    sk: usize,
    segment: Option<usize>,
) -> Vec<Option<usize>> {
    let seg = match segment {
        Some(s) if k > s => s,
        _ => k,
    };
    let mut order = Vec::new();
    let mut k0 = 0;
    while k0 < k {
        let ks = seg.min(k - k0);
        let k1 = ks.div_ceil(sk);
        let mut block = vec![None; n.div_ceil(sn) * k1 * sn * sk];
        for kk in 0..ks {
            for nn in 0..n {
                block[((nn / sn) * k1 + kk / sk) * sn * sk + (nn % sn) * sk + kk % sk] =
                    Some((k0 + kk) * n + nn);
            }
        }
        order.extend(block);
        k0 += ks;
    }
    order
}

/// Decodes native C `[ceil(N/sN), M, sN]` into row-major indices.
pub fn native_c_index(m_total: usize, sn: usize, m: usize, n: usize) -> usize {
    ((n / sn) * m_total + m) * sn + n % sn
}

/// Layouts of one run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layouts {
    pub ac_native: bool,
    /// 0 NORM, 1 NATIVE, 2 TP_NORM.
    pub b: i16,
}

pub const ALL_LAYOUTS: [Layouts; 6] = [
    Layouts {
        ac_native: false,
        b: 0,
    },
    Layouts {
        ac_native: false,
        b: 1,
    },
    Layouts {
        ac_native: false,
        b: 2,
    },
    Layouts {
        ac_native: true,
        b: 0,
    },
    Layouts {
        ac_native: true,
        b: 1,
    },
    Layouts {
        ac_native: true,
        b: 2,
    },
];

/// Quant params for one matrix: name, scales, zero points.
pub struct Quant<'a> {
    pub name: &'a str,
    pub scale: Vec<f32>,
    pub zp: Vec<i32>,
}

pub fn quant_params(q: &mut Quant) -> rknn_quant_params {
    let mut p = rknn_quant_params::default();
    for (d, s) in p.name.iter_mut().zip(q.name.bytes()) {
        *d = std::ffi::c_char::from_ne_bytes([s]);
    }
    p.scale = q.scale.as_mut_ptr();
    p.scale_len = q.scale.len() as i32;
    if !q.zp.is_empty() {
        p.zp = q.zp.as_mut_ptr();
        p.zp_len = q.zp.len() as i32;
    }
    p
}

/// One complete matmul through the function table: create, quant params, memories, write A and
/// B in the configured layouts (tiles read from the returned dims), bind, run, read C back to
/// row-major values. Returns the runtime's error code on failure.
pub struct Run<'a> {
    pub emu: &'a Emulator,
    pub t: rknn_matmul_type,
    pub m: usize,
    pub k: usize,
    pub n: usize,
    pub layouts: Layouts,
    pub b_quant_type: i16,
    pub group_size: i16,
    pub quant: Vec<Quant<'a>>,
}

#[derive(Debug)]
pub struct Output {
    pub c: Values,
    pub io: rknn_matmul_io_attr,
}

impl<'a> Run<'a> {
    pub fn new(
        emu: &'a Emulator,
        t: rknn_matmul_type,
        m: usize,
        k: usize,
        n: usize,
        layouts: Layouts,
    ) -> Self {
        Run {
            emu,
            t,
            m,
            k,
            n,
            layouts,
            b_quant_type: 0,
            group_size: 0,
            quant: vec![],
        }
    }

    pub fn info(&self) -> rknn_matmul_info {
        rknn_matmul_info {
            M: self.m as i32,
            K: self.k as i32,
            N: self.n as i32,
            type_: self.t,
            B_layout: self.layouts.b,
            AC_layout: self.layouts.ac_native as i16,
            B_quant_type: self.b_quant_type,
            group_size: self.group_size,
            ..Default::default()
        }
    }

    pub fn go(&mut self, a: &Values, b: &Values) -> Result<Output, i32> {
        let api = self.emu.api();
        let mut info = self.info();
        let mut io = rknn_matmul_io_attr::default();
        let mut ctx: rknn_matmul_ctx = 0;
        let (m, k, n) = (self.m, self.k, self.n);
        // SAFETY: all pointers are valid for each call; memories are written within the sizes
        // the runtime reported and destroyed before the context.
        unsafe {
            let rc = (api.rknn_matmul_create)(&mut ctx, &mut info, &mut io);
            if rc != 0 {
                return Err(rc);
            }
            let result = (|| {
                for q in &mut self.quant {
                    let mut p = quant_params(q);
                    let rc = (api.rknn_matmul_set_quant_params.unwrap())(ctx, &mut p);
                    if rc != 0 {
                        return Err(rc);
                    }
                }
                let a_bytes = match io.A.n_dims {
                    2 => encode_order(io.A.type_, a, &(0..m * k).map(Some).collect::<Vec<_>>()),
                    3 => encode_order(io.A.type_, a, &native_a_order(m, k, io.A.dims[2] as usize)),
                    d => panic!("A has {d} dims"),
                };
                let b_order: Vec<Option<usize>> = match self.layouts.b {
                    0 => (0..k * n).map(Some).collect(),
                    2 => (0..n)
                        .flat_map(|nn| (0..k).map(move |kk| Some(kk * n + nn)))
                        .collect(),
                    _ => {
                        let seg = self.emu.config().platform.k_segment();
                        native_b_order(k, n, io.B.dims[2] as usize, io.B.dims[3] as usize, seg)
                    }
                };
                let b_bytes = encode_order(io.B.type_, b, &b_order);
                assert_eq!(a_bytes.len(), io.A.size as usize, "A size");
                assert_eq!(b_bytes.len(), io.B.size as usize, "B size");
                let mems = [io.A.size, io.B.size, io.C.size].map(|s| (api.rknn_create_mem)(ctx, s));
                if mems.iter().any(|p| p.is_null()) {
                    return Err(RKNN_ERR_MALLOC_FAIL);
                }
                let out = (|| {
                    std::ptr::copy_nonoverlapping(
                        a_bytes.as_ptr(),
                        (*mems[0]).virt_addr.cast(),
                        a_bytes.len(),
                    );
                    std::ptr::copy_nonoverlapping(
                        b_bytes.as_ptr(),
                        (*mems[1]).virt_addr.cast(),
                        b_bytes.len(),
                    );
                    let sync = api.rknn_mem_sync.unwrap();
                    assert_eq!(sync(ctx, mems[0], RKNN_MEMORY_SYNC_TO_DEVICE), 0);
                    assert_eq!(sync(ctx, mems[1], RKNN_MEMORY_SYNC_TO_DEVICE), 0);
                    for (mem, attr) in mems.iter().zip([&mut io.A, &mut io.B, &mut io.C]) {
                        let rc = (api.rknn_matmul_set_io_mem)(ctx, *mem, attr);
                        if rc != 0 {
                            return Err(rc);
                        }
                    }
                    let rc = (api.rknn_matmul_run)(ctx);
                    if rc != 0 {
                        return Err(rc);
                    }
                    assert_eq!(sync(ctx, mems[2], RKNN_MEMORY_SYNC_FROM_DEVICE), 0);
                    let raw = std::slice::from_raw_parts(
                        (*mems[2]).virt_addr as *const u8,
                        io.C.size as usize,
                    );
                    Ok(decode_c(&io.C, raw, m, n))
                })();
                for mem in mems {
                    assert_eq!((api.rknn_destroy_mem)(ctx, mem), 0);
                }
                out
            })();
            assert_eq!((api.rknn_matmul_destroy)(ctx), 0);
            result.map(|c| Output { c, io })
        }
    }
}

fn decode_c(attr: &rknn_matmul_tensor_attr, raw: &[u8], m: usize, n: usize) -> Values {
    let native = attr.n_dims == 3;
    let sn = if native { attr.dims[2] as usize } else { 0 };
    let idx = |mm: usize, nn: usize| {
        if native {
            native_c_index(m, sn, mm, nn)
        } else {
            mm * n + nn
        }
    };
    let at = |i: usize, w: usize| &raw[i * w..i * w + w];
    let cells = (0..m).flat_map(|mm| (0..n).map(move |nn| (mm, nn)));
    match attr.type_ {
        RKNN_TENSOR_INT32 => Values::Int(
            cells
                .map(|(a, b)| i32::from_le_bytes(at(idx(a, b), 4).try_into().unwrap()))
                .collect(),
        ),
        RKNN_TENSOR_INT16 => Values::Int(
            cells
                .map(|(a, b)| i32::from(i16::from_le_bytes(at(idx(a, b), 2).try_into().unwrap())))
                .collect(),
        ),
        RKNN_TENSOR_INT8 => Values::Int(
            cells
                .map(|(a, b)| i32::from(raw[idx(a, b)] as i8))
                .collect(),
        ),
        RKNN_TENSOR_FLOAT32 => Values::Float(
            cells
                .map(|(a, b)| f32::from_le_bytes(at(idx(a, b), 4).try_into().unwrap()))
                .collect(),
        ),
        RKNN_TENSOR_FLOAT16 => Values::Float(
            cells
                .map(|(a, b)| f16::from_le_bytes(at(idx(a, b), 2).try_into().unwrap()).to_f32())
                .collect(),
        ),
        t => panic!("C type {t}"),
    }
}

pub fn emulator(platform: rknn_chip::Platform) -> Emulator {
    Emulator::new(EmuConfig::new(platform)).unwrap()
}

/// Random values for an operand of tensor type `t`, including the extremes.
pub fn random_values(rng: &mut fastrand::Rng, t: rknn_tensor_type, len: usize) -> Values {
    match t {
        RKNN_TENSOR_INT8 => Values::Int(
            (0..len)
                .map(|_| {
                    if rng.u8(..10) == 0 {
                        [-128, 127][rng.usize(..2)]
                    } else {
                        rng.i32(-128..=127)
                    }
                })
                .collect(),
        ),
        RKNN_TENSOR_INT4 => Values::Int((0..len).map(|_| rng.i32(-8..=7)).collect()),
        RKNN_TENSOR_FLOAT16 => Values::Float(
            (0..len)
                .map(|_| f16::from_f32(rng.f32() * 4.0 - 2.0).to_f32())
                .collect(),
        ),
        t => panic!("{t}"),
    }
}

/// The tensor types of A and B for a matmul type.
pub fn operand_types(t: rknn_matmul_type) -> (rknn_tensor_type, rknn_tensor_type) {
    let mt = rknn_chip::MatmulType::from_raw(t).unwrap();
    (mt.a.tensor_type(), mt.b.tensor_type())
}

/// How many random cases each property test runs (`RKNN_EMU_CASES` overrides).
pub fn cases(default: usize) -> usize {
    std::env::var("RKNN_EMU_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}
