//! The checks: one per fact of `docs/hardware-facts.md` that a runtime can be asked about.
//! Each observes its fact through the C API only, the same way on every runtime.

use std::time::Instant;

use rknn_chip::{ElemKind, Layout, MatmulType, Platform};
use rknn_sys::{self as sys, RknnFunctions};

use super::case::{self, BQuant, Case, alloc_abc, bind_abc, encode, type_name};
use super::check::{Check, Cx, Label, Setting, Side, Unsupported, Values};
use super::observe::{Item, Observation, Value};
use super::raw::{Ctx, Missing, Which};
use super::report::Timing;

type Observed = Result<Observation, Unsupported>;

impl From<Missing> for Unsupported {
    fn from(m: Missing) -> Unsupported {
        Unsupported(format!("the runtime does not export {}", m.0))
    }
}

fn missing(name: String) -> Unsupported {
    Unsupported(name)
}

const STRICT_RULES: Setting = Setting {
    env: "RKNN_EMU_STRICT_RULES",
    values: Values::Fixed(&["1"]),
};

/// Every run with int4 B in the native layout depends on the nibble order (on RK3588 type 10
/// has no other layout), so the checks that run one name it too.
const NIBBLES: Setting = Setting {
    env: "RKNN_EMU_NATIVE_B_NIBBLES",
    values: Values::Fixed(&["high-first"]),
};

/// Every check, in report order.
pub static CHECKS: &[Check] = &[
    Check {
        id: "abi.optional_symbols",
        fact: "which optional functions the runtime exports (the release that introduced each is not public)",
        label: Label::Open,
        hazard: None,
        settings: &[],
        observe: optional_symbols,
    },
    Check {
        id: "abi.sdk_version_on_matmul",
        fact: "rknn_query(RKNN_QUERY_SDK_VERSION) answers on a matmul context",
        label: Label::Open,
        hazard: None,
        settings: &[Setting {
            env: "RKNN_EMU_SDK_VERSION_ON_MATMUL",
            values: Values::Fixed(&["0"]),
        }],
        observe: sdk_version_on_matmul,
    },
    Check {
        id: "abi.model_core_mask",
        fact: "rknn_set_core_mask (model API) on a matmul context acts as rknn_matmul_set_core_mask",
        label: Label::Open,
        hazard: Some("the model API may treat a matmul handle as a model context"),
        settings: &[],
        observe: model_core_mask,
    },
    Check {
        id: "types.accepted",
        fact: "the matmul types the chip accepts (types 6, 12, 15 and the nonexistent 13, 14 refused)",
        label: Label::Doc,
        hazard: None,
        settings: &[Setting {
            env: "RKNN_EMU_PLATFORM",
            values: Values::Fixed(&["rk3588", "rk3576", "rk3562", "rk3566", "rk3568"]),
        }],
        observe: types_accepted,
    },
    Check {
        id: "rules.alignment",
        fact: "K and N alignment per chip and type, as the header gives it",
        label: Label::Doc,
        hazard: None,
        settings: &[],
        observe: alignment,
    },
    Check {
        id: "rules.f16_n_align",
        fact: "f16 N aligned to 16 (header) is accepted on RK3588/RK3576, not only 32 (user guide)",
        label: Label::Open,
        hazard: None,
        settings: &[STRICT_RULES],
        observe: f16_n_align,
    },
    Check {
        id: "rules.k_limit",
        fact: "K above the header's 10240 (RK3588 ran K = 15360)",
        label: Label::Hw,
        hazard: None,
        settings: &[STRICT_RULES],
        observe: k_limit,
    },
    Check {
        id: "rules.n_limit",
        fact: "N above the user guide's 4096 (i8 N = 8192 ran on RK3588)",
        label: Label::Open,
        hazard: None,
        settings: &[STRICT_RULES],
        observe: n_limit,
    },
    Check {
        id: "rules.core_mask",
        fact: "matmul takes single-core masks only; combined masks are rejected",
        label: Label::Hw,
        hazard: None,
        settings: &[],
        observe: core_mask,
    },
    Check {
        id: "rules.i4_normal_b",
        fact: "type 10 with B in a normal layout fails at set_io_mem on RK3588",
        label: Label::Hw,
        hazard: None,
        settings: &[],
        observe: i4_normal_b,
    },
    Check {
        id: "layout.io_attr",
        fact: "io_attr (names, dims, sizes, types) for every type and layout combination",
        label: Label::Doc,
        hazard: None,
        settings: &[],
        observe: io_attr,
    },
    Check {
        id: "layout.c_tile",
        fact: "native C tile of f16 and i8 outputs (16-byte cells suggest 8 and 16)",
        label: Label::Open,
        hazard: None,
        settings: &[],
        observe: c_tile,
    },
    Check {
        id: "layout.runs",
        fact: "every type in every layout combination: native A/B/C index math, int4 packing, TP_NORM",
        label: Label::Doc,
        hazard: None,
        settings: &[NIBBLES],
        observe: layout_runs,
    },
    Check {
        id: "layout.native_b_segments",
        fact: "native B is stored in K segments (8192 rows on RK3588, 4096 on RK3576)",
        label: Label::Doc,
        hazard: None,
        settings: &[],
        observe: native_b_segments,
    },
    Check {
        id: "convert.native_b",
        fact: "rknn_B_normal_layout_to_native_layout output for i8 and f16 B, K segments included",
        label: Label::Doc,
        hazard: None,
        settings: &[],
        observe: convert_native_b,
    },
    Check {
        id: "convert.in_place",
        fact: "the B converter must not run in place (silent corruption; the emulator refuses)",
        label: Label::Hw,
        hazard: None,
        settings: &[],
        observe: convert_in_place,
    },
    Check {
        id: "int4.converter_input",
        fact: "the B converter reads int4 packed two per byte (Rockchip's demos), not one per byte",
        label: Label::Open,
        hazard: None,
        settings: &[Setting {
            env: rknn_chip::INT4_CONVERTER_INPUT_ENV,
            values: Values::Fixed(&["one-per-byte"]),
        }],
        observe: int4_converter_input,
    },
    Check {
        id: "int4.native_b_nibbles",
        fact: "native int4 B holds the even element in the low nibble, like every other int4 layout",
        label: Label::Open,
        hazard: None,
        settings: &[NIBBLES],
        observe: int4_native_b_nibbles,
    },
    Check {
        id: "arith.i8_extremes",
        fact: "i8 x i8 -> i32 is the exact dot product (-128 and 127 at K = 4096)",
        label: Label::Doc,
        hazard: None,
        settings: &[],
        observe: i8_extremes,
    },
    Check {
        id: "arith.i4_edges",
        fact: "int4 -8 and 7 are read as such (two's complement nibbles)",
        label: Label::Hw,
        hazard: None,
        settings: &[NIBBLES],
        observe: i4_edges,
    },
    Check {
        id: "arith.i16_overflow",
        fact: "i4 x i4 -> i16 beyond the i16 range saturates (or wraps)",
        label: Label::Open,
        hazard: None,
        settings: &[Setting {
            env: "RKNN_EMU_I16_OVERFLOW",
            values: Values::Fixed(&["wrap"]),
        }],
        observe: i16_overflow,
    },
    Check {
        id: "arith.requant_rounding",
        fact: "i8 -> i8 requantisation rounds ties half away from zero (or to even)",
        label: Label::Open,
        hazard: None,
        settings: &[Setting {
            env: "RKNN_EMU_ROUNDING",
            values: Values::Fixed(&["half-even"]),
        }],
        observe: requant_rounding,
    },
    Check {
        id: "arith.requant_saturation",
        fact: "i8 -> i8 requantisation saturates to -128..=127",
        label: Label::Open,
        hazard: None,
        settings: &[],
        observe: requant_saturation,
    },
    Check {
        id: "arith.requant_zero_points",
        fact: "i8 -> i8 requantisation applies the zero points of A, B and C",
        label: Label::Open,
        hazard: None,
        settings: &[],
        observe: requant_zero_points,
    },
    Check {
        id: "arith.i8_to_f32",
        fact: "i8 x i8 -> f32 is the integer sum times the scales of A and B",
        label: Label::Doc,
        hazard: None,
        settings: &[],
        observe: i8_to_f32,
    },
    Check {
        id: "arith.f16_accumulation",
        fact: "f16 products are accumulated as in f32 (4096 ones sum to 4096, not 2048)",
        label: Label::Hw,
        hazard: None,
        settings: &[],
        observe: f16_accumulation,
    },
    Check {
        id: "quant.per_channel",
        fact: "per-channel B quantisation (symmetric and asymmetric) gives the dequantised product",
        label: Label::Hw,
        hazard: None,
        settings: &[],
        observe: per_channel,
    },
    Check {
        id: "quant.per_group_order",
        fact: "per-group quant params are ordered [K/G][N]",
        label: Label::Open,
        hazard: None,
        settings: &[Setting {
            env: "RKNN_EMU_GROUP_ORDER",
            values: Values::Fixed(&["n-major"]),
        }],
        observe: per_group_order,
    },
    Check {
        id: "quant.normalised_scale",
        fact: "rknn_matmul_get_quant_params reports max(scale) and scale / max",
        label: Label::Open,
        hazard: None,
        settings: &[],
        observe: normalised_scale,
    },
    Check {
        id: "dynamic.m",
        fact: "dynamic M: B bound once, A and C bound again after each set_dynamic_shape",
        label: Label::Doc,
        hazard: None,
        settings: &[],
        observe: dynamic_m,
    },
    Check {
        id: "dynamic.kn",
        fact: "K/N may differ between shapes only with TP_NORM B, which is then bound per shape",
        label: Label::Doc,
        hazard: None,
        settings: &[],
        observe: dynamic_kn,
    },
    Check {
        id: "sync.without_sync",
        fact: "memories are cacheable: without a sync the device or the CPU sees stale data",
        label: Label::Doc,
        hazard: None,
        settings: &[Setting {
            env: "RKNN_EMU_STRICT_CACHE",
            values: Values::Fixed(&["1"]),
        }],
        observe: without_sync,
    },
    Check {
        id: "sync.native_read_at_run",
        fact: "an input in a native layout is read by every run (a synced write is seen without binding again)",
        label: Label::Open,
        hazard: None,
        settings: &[Setting {
            env: "RKNN_EMU_NATIVE_INPUTS",
            values: Values::Fixed(&["bind"]),
        }],
        observe: native_read_at_run,
    },
    Check {
        id: "memory.shared_between_contexts",
        fact: "a memory allocated on one context can be bound to another of the same IOMMU domain",
        label: Label::Open,
        hazard: None,
        settings: &[Setting {
            env: "RKNN_EMU_SHARED_MEMORIES",
            values: Values::Fixed(&["refuse"]),
        }],
        observe: shared_between_contexts,
    },
    Check {
        id: "memory.cross_domain",
        fact: "a memory of another IOMMU domain is refused at set_io_mem",
        label: Label::Open,
        hazard: None,
        settings: &[],
        observe: cross_domain,
    },
    Check {
        id: "memory.destroyed_before_run",
        fact: "a run after a bound memory was destroyed fails (-8 for A/B, -9 for C)",
        label: Label::Open,
        hazard: Some("the NPU may read or write freed pages (an IOMMU fault)"),
        settings: &[],
        observe: destroyed_before_run,
    },
    Check {
        id: "hazard.handle_budget",
        fact: "about 1020 live NPU memories (dma-buf fds under ulimit -n 1024) before allocation fails",
        label: Label::Hw,
        hazard: Some(
            "allocates 1100 NPU memories; the runtime crashes if the fd limit runs out first",
        ),
        settings: &[Setting {
            env: "RKNN_EMU_HANDLE_BUDGET",
            values: Values::FromSubject(first_int),
        }],
        observe: handle_budget,
    },
    Check {
        id: "hazard.iommu_domain",
        fact: "one IOMMU domain holds 4 GiB",
        label: Label::Doc,
        hazard: Some("allocates 4 GiB of NPU memory"),
        settings: &[Setting {
            env: "RKNN_EMU_IOMMU_DOMAIN_BYTES",
            values: Values::FromSubject(gib_from_count),
        }],
        observe: iommu_domain,
    },
];

// ---------------------------------------------------------------------------------------
// Helpers

fn accepted(p: Platform) -> Vec<MatmulType> {
    MatmulType::ALL
        .iter()
        .copied()
        .filter(|t| p.accepts(*t))
        .collect()
}

fn needs(p: Platform, t: MatmulType) -> Result<(), Unsupported> {
    if p.accepts(t) {
        Ok(())
    } else {
        Err(Unsupported(format!("{p} has no {}", t.c_name())))
    }
}

fn types_where(
    p: Platform,
    f: impl Fn(MatmulType) -> bool,
    what: &str,
) -> Result<Vec<MatmulType>, Unsupported> {
    let ts: Vec<MatmulType> = accepted(p).into_iter().filter(|t| f(*t)).collect();
    if ts.is_empty() {
        return Err(Unsupported(format!("{p} has no {what}")));
    }
    Ok(ts)
}

fn observe_cases(side: &Side<'_>, cases: &[Case]) -> Observed {
    let mut items = Vec::new();
    for c in cases {
        c.observe(side.api(), side.platform(), &mut items)
            .map_err(missing)?;
    }
    Ok(items)
}

fn info(t: MatmulType, m: usize, k: usize, n: usize) -> sys::rknn_matmul_info {
    sys::rknn_matmul_info {
        M: m as i32,
        K: k as i32,
        N: n as i32,
        type_: t.raw(),
        ..Default::default()
    }
}

fn code(key: impl Into<String>, rc: i32) -> Item {
    Item::new(key, Value::Code(rc))
}

fn create_code(api: &rknn_sys::RknnApi, key: String, info: &sys::rknn_matmul_info) -> Item {
    code(
        format!("{key}: create"),
        Ctx::create(api, info).err().unwrap_or(0),
    )
}

fn attr_text(a: &sys::rknn_matmul_tensor_attr) -> String {
    let name: String = a
        .name
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c.to_ne_bytes()[0] as char)
        .collect();
    let n = (a.n_dims as usize).min(a.dims.len());
    format!(
        "name={name:?} n_dims={} dims={:?} size={} type={}",
        a.n_dims,
        &a.dims[..n],
        a.size,
        a.type_
    )
}

/// A C scale that keeps i8 outputs of random inputs mostly inside -128..=127. It is odd, so
/// that an integer sum divided by it is never a tie: only arith.requant_rounding asks how ties
/// round.
fn i8_out_quant(t: MatmulType, k: usize) -> Option<(f32, i32)> {
    (t.c == ElemKind::I8).then_some((16.0 * k as f32 - 1.0, 0))
}

fn seed(cx: &Cx, salt: u64) -> u64 {
    cx.seed
        .wrapping_mul(0x9e37_79b9_7f4a_7c15)
        .wrapping_add(salt)
}

fn first_int(o: &Observation) -> Option<String> {
    o.iter().find_map(|i| match i.value {
        Value::Int(v) => Some(v.to_string()),
        _ => None,
    })
}

fn gib_from_count(o: &Observation) -> Option<String> {
    o.iter().find_map(|i| match i.value {
        Value::Int(v) => Some((v << 30).to_string()),
        _ => None,
    })
}

// ---------------------------------------------------------------------------------------
// abi.*

fn optional_symbols(side: &Side<'_>, _: &Cx) -> Observed {
    let missing = side.api().missing_optional();
    Ok(RknnFunctions::OPTIONAL_SYMBOLS
        .iter()
        .map(|s| {
            let v = if missing.contains(s) {
                "missing"
            } else {
                "present"
            };
            Item::new(*s, Value::Text(v.into()))
        })
        .collect())
}

fn sdk_version_on_matmul(side: &Side<'_>, _: &Cx) -> Observed {
    let ctx = Ctx::create(side.api(), &info(MatmulType::I8_I8_I32, 1, 32, 32));
    Ok(match ctx {
        Err(rc) => vec![code("create", rc)],
        Ok(c) => vec![
            code("create", 0),
            code("rknn_query(SDK_VERSION)", c.query_version()),
        ],
    })
}

fn model_core_mask(side: &Side<'_>, _: &Cx) -> Observed {
    let ctx = Ctx::create(side.api(), &info(MatmulType::I8_I8_I32, 1, 32, 32));
    Ok(match ctx {
        Err(rc) => vec![code("create", rc)],
        Ok(c) => vec![
            code("create", 0),
            code(
                "rknn_set_core_mask(matmul ctx, 1)",
                c.model_set_core_mask(1)?,
            ),
        ],
    })
}

// ---------------------------------------------------------------------------------------
// types.* and rules.*

fn types_accepted(side: &Side<'_>, _: &Cx) -> Observed {
    let api = side.api();
    Ok((1..=15u32)
        .map(|raw| {
            let i = sys::rknn_matmul_info {
                M: 1,
                K: 64,
                N: 64,
                type_: raw as sys::rknn_matmul_type,
                ..Default::default()
            };
            create_code(api, format!("type {raw} M=1 K=64 N=64"), &i)
        })
        .collect())
}

fn alignment(side: &Side<'_>, _: &Cx) -> Observed {
    let p = side.platform();
    let mut items = Vec::new();
    for t in accepted(p) {
        let Some((ka, na)) = p.alignment(t.align_kind()) else {
            continue;
        };
        let ks = [ka / 2, ka, ka + ka / 2, 2 * ka];
        // The user guide's f16 N = 32 on RK3588/RK3576 is rules.f16_n_align's question: here
        // only N that both readings agree on.
        let ns = if t.align_kind() == ElemKind::F16
            && matches!(p, Platform::Rk3588 | Platform::Rk3576)
        {
            [8, 24, 32, 64]
        } else {
            [na / 2, na, na + na / 2, 2 * na]
        };
        for k in ks.into_iter().filter(|&k| k > 0) {
            for n in ns.into_iter().filter(|&n| n > 0) {
                items.push(create_code(
                    side.api(),
                    format!("{} K={k} N={n}", type_name(t)),
                    &info(t, 1, k, n),
                ));
            }
        }
    }
    Ok(items)
}

fn f16_n_align(side: &Side<'_>, _: &Cx) -> Observed {
    let p = side.platform();
    if !matches!(p, Platform::Rk3588 | Platform::Rk3576) {
        return Err(Unsupported(format!(
            "the user guide's f16 N = 32 concerns RK3588 and RK3576, not {p}"
        )));
    }
    let ts = types_where(p, |t| t.align_kind() == ElemKind::F16, "f16 type")?;
    let mut items = Vec::new();
    for t in ts {
        for n in [16, 48] {
            items.push(create_code(
                side.api(),
                format!("{} K=32 N={n}", type_name(t)),
                &info(t, 1, 32, n),
            ));
        }
    }
    Ok(items)
}

fn k_limit(side: &Side<'_>, _: &Cx) -> Observed {
    let t = MatmulType::I8_I8_I32;
    Ok([10240, 10272, 15360]
        .into_iter()
        .map(|k| {
            create_code(
                side.api(),
                format!("{} K={k} N=32", type_name(t)),
                &info(t, 1, k, 32),
            )
        })
        .collect())
}

fn n_limit(side: &Side<'_>, _: &Cx) -> Observed {
    let t = MatmulType::I8_I8_I32;
    Ok([4096, 4128, 8192]
        .into_iter()
        .map(|n| {
            create_code(
                side.api(),
                format!("{} K=32 N={n}", type_name(t)),
                &info(t, 1, 32, n),
            )
        })
        .collect())
}

fn core_mask(side: &Side<'_>, _: &Cx) -> Observed {
    let mut items = Vec::new();
    for mask in [0u32, 1, 2, 4, 3, 7] {
        // A fresh context for each mask, so that one refusal cannot change the next answer.
        match Ctx::create(side.api(), &info(MatmulType::I8_I8_I32, 1, 32, 32)) {
            Err(rc) => {
                items.push(code(format!("mask {mask}: create"), rc));
                break;
            }
            Ok(c) => items.push(code(
                format!("rknn_matmul_set_core_mask({mask})"),
                c.set_core_mask(mask),
            )),
        }
    }
    Ok(items)
}

fn i4_normal_b(side: &Side<'_>, cx: &Cx) -> Observed {
    let p = side.platform();
    if p != Platform::Rk3588 {
        return Err(Unsupported(format!("the rule is RK3588's; this is {p}")));
    }
    needs(p, MatmulType::I4_I4_I16)?;
    observe_cases(
        side,
        &[Case::random(MatmulType::I4_I4_I16, 2, 64, 64, seed(cx, 1))],
    )
}

// ---------------------------------------------------------------------------------------
// layout.*

const B_LAYOUTS: [Layout; 3] = [Layout::Norm, Layout::Native, Layout::TpNorm];
const AC_LAYOUTS: [Layout; 2] = [Layout::Norm, Layout::Native];

/// Whether native C of this type has the undocumented tile (layout.c_tile's question).
fn open_c_tile(t: MatmulType, ac: Layout) -> bool {
    ac == Layout::Native && matches!(t.c, ElemKind::F16 | ElemKind::I8)
}

fn io_attr(side: &Side<'_>, _: &Cx) -> Observed {
    let mut items = Vec::new();
    for t in accepted(side.platform()) {
        for b in B_LAYOUTS {
            for ac in AC_LAYOUTS.into_iter().filter(|&ac| !open_c_tile(t, ac)) {
                let (m, k, n) = (5, 64, 128);
                let key = format!(
                    "{} M={m} K={k} N={n} B={} AC={}",
                    type_name(t),
                    case::layout_name(b),
                    case::layout_name(ac)
                );
                let mut i = info(t, m, k, n);
                i.B_layout = b.raw() as i16;
                i.AC_layout = ac.raw() as i16;
                match Ctx::create(side.api(), &i) {
                    Err(rc) => items.push(code(format!("{key}: create"), rc)),
                    Ok(c) => {
                        items.push(code(format!("{key}: create"), 0));
                        for (name, a) in [("A", &c.io().A), ("B", &c.io().B), ("C", &c.io().C)] {
                            items.push(Item::new(
                                format!("{key}: io_attr.{name}"),
                                Value::Text(attr_text(a)),
                            ));
                        }
                    }
                }
            }
        }
    }
    Ok(items)
}

fn c_tile(side: &Side<'_>, cx: &Cx) -> Observed {
    let p = side.platform();
    let ts = types_where(
        p,
        |t| matches!(t.c, ElemKind::F16 | ElemKind::I8),
        "type with f16 or i8 output",
    )?;
    let mut items = Vec::new();
    for (i, t) in ts.into_iter().enumerate() {
        let (m, k, n) = (5, 64, 128);
        let b = if p == Platform::Rk3588 && t.b == ElemKind::I4 {
            Layout::Native
        } else {
            Layout::Norm
        };
        let mut c = Case::random(t, m, k, n, seed(cx, 100 + i as u64)).layouts(b, Layout::Native);
        c.qc = i8_out_quant(t, k);
        let key = c.name();
        if let Ok(ctx) = Ctx::create(side.api(), &c.info()) {
            items.push(Item::new(
                format!("{key}: io_attr.C"),
                Value::Text(attr_text(&ctx.io().C)),
            ));
        }
        c.observe(side.api(), p, &mut items).map_err(missing)?;
    }
    Ok(items)
}

fn layout_runs(side: &Side<'_>, cx: &Cx) -> Observed {
    let p = side.platform();
    let shapes: &[(usize, usize, usize)] = if cx.full() {
        &[(1, 64, 64), (5, 128, 64), (33, 96, 128), (2, 320, 192)]
    } else {
        &[(5, 64, 128)]
    };
    let mut cases = Vec::new();
    for t in accepted(p) {
        for b in B_LAYOUTS {
            // RK3588 refuses type 10 with a normal B (rules.i4_normal_b).
            if p == Platform::Rk3588 && t == MatmulType::I4_I4_I16 && b != Layout::Native {
                continue;
            }
            for ac in AC_LAYOUTS.into_iter().filter(|&ac| !open_c_tile(t, ac)) {
                for &(m, k, n) in shapes {
                    let salt = cases.len() as u64;
                    let mut c = Case::random(t, m, k, n, seed(cx, 200 + salt)).layouts(b, ac);
                    c.qc = i8_out_quant(t, k);
                    cases.push(c);
                }
            }
        }
    }
    observe_cases(side, &cases)
}

fn native_b_segments(side: &Side<'_>, cx: &Cx) -> Observed {
    let p = side.platform();
    let Some(seg) = p.k_segment() else {
        return Err(Unsupported(format!("no K segment is documented for {p}")));
    };
    let ts = types_where(
        p,
        |t| t == MatmulType::I8_I8_I32 || t == MatmulType::F16_F16_F32,
        "i8 -> i32 or f16 -> f32 type",
    )?;
    let cases: Vec<Case> = ts
        .into_iter()
        .enumerate()
        .map(|(i, t)| {
            Case::random(t, 2, seg + 64, 32, seed(cx, 300 + i as u64))
                .layouts(Layout::Native, Layout::Norm)
        })
        .collect();
    observe_cases(side, &cases)
}

// ---------------------------------------------------------------------------------------
// convert.* and int4.*

fn convert_native_b(side: &Side<'_>, cx: &Cx) -> Observed {
    let p = side.platform();
    let ts = types_where(
        p,
        |t| matches!(t.b, ElemKind::I8 | ElemKind::F16),
        "type with i8 or f16 B",
    )?;
    let big_k = p.k_segment().map_or(128, |s| s + 64);
    let mut items = Vec::new();
    for (i, t) in ts.into_iter().enumerate() {
        for (k, n) in [(64, 64), (big_k, 32)] {
            let key = format!("{} K={k} N={n}", type_name(t));
            let c = Case::random(t, 1, k, n, seed(cx, 400 + i as u64))
                .layouts(Layout::Native, Layout::Norm);
            let ctx = match Ctx::create(side.api(), &c.info()) {
                Ok(ctx) => ctx,
                Err(rc) => {
                    items.push(code(format!("{key}: create"), rc));
                    continue;
                }
            };
            let mut input = encode(t.b, &c.b);
            let mut out = vec![0u8; ctx.io().B.size as usize];
            let rc = Ctx::convert_b(side.api(), &mut input, &mut out, k, n, &c.info())?;
            items.push(code(format!("{key}: convert"), rc));
            if rc == 0 {
                items.push(Item::new(format!("{key}: native B"), Value::Bytes(out)));
            }
        }
    }
    Ok(items)
}

fn convert_in_place(side: &Side<'_>, cx: &Cx) -> Observed {
    let t = MatmulType::I8_I8_I32;
    let c = Case::random(t, 1, 64, 64, seed(cx, 500)).layouts(Layout::Native, Layout::Norm);
    let mut buf = encode(t.b, &c.b);
    let rc = Ctx::convert_b_in_place(side.api(), &mut buf, 64, 64, &c.info())?;
    Ok(vec![code("convert with B_input == B_output", rc)])
}

fn int4_b_types(p: Platform) -> Result<Vec<MatmulType>, Unsupported> {
    types_where(p, |t| t.b == ElemKind::I4, "int4 B")
}

fn int4_converter_input(side: &Side<'_>, cx: &Cx) -> Observed {
    let p = side.platform();
    let mut items = Vec::new();
    for (i, t) in int4_b_types(p)?.into_iter().enumerate() {
        let (m, k, n) = (3, 64, 128);
        let c = Case::random(t, m, k, n, seed(cx, 600 + i as u64))
            .layouts(Layout::Native, Layout::Norm);
        let key = c.name();
        let ctx = match Ctx::create(side.api(), &c.info()) {
            Ok(ctx) => ctx,
            Err(rc) => {
                items.push(code(format!("{key}: create"), rc));
                continue;
            }
        };
        items.push(code(format!("{key}: create"), 0));
        // Packed two per byte, as Rockchip's demos pass it; the buffer is as long as the other
        // reading (one per byte) would read, zero past the packed data.
        let mut input = encode(ElemKind::I4, &c.b);
        input.resize(k * n, 0);
        let mut native = vec![0u8; ctx.io().B.size as usize];
        let rc = Ctx::convert_b(side.api(), &mut input, &mut native, k, n, &c.info())?;
        items.push(code(format!("{key}: convert packed B"), rc));
        if rc != 0 {
            continue;
        }
        let Some((mut a, mut b, mut cm)) = alloc_abc(&ctx, &key, &mut items) else {
            continue;
        };
        a.write_synced(&c.encode_a(ctx.attr(Which::A)));
        b.write_synced(&native);
        cm.write_synced(&[]);
        if !bind_abc(&ctx, [&a, &b, &cm], &key, &mut items) {
            continue;
        }
        let rc = ctx.run();
        items.push(code(format!("{key}: run"), rc));
        if rc == 0 {
            cm.sync(sys::RKNN_MEMORY_SYNC_FROM_DEVICE);
            items.push(c.read_c(&ctx, &cm, &key));
        }
    }
    Ok(items)
}

fn int4_native_b_nibbles(side: &Side<'_>, cx: &Cx) -> Observed {
    let p = side.platform();
    let cases: Vec<Case> = int4_b_types(p)?
        .into_iter()
        .enumerate()
        .map(|(i, t)| {
            Case::random(t, 3, 64, 128, seed(cx, 700 + i as u64))
                .layouts(Layout::Native, Layout::Norm)
        })
        .collect();
    observe_cases(side, &cases)
}

// ---------------------------------------------------------------------------------------
// arith.*

/// A case of `t` with A and B given by functions of (row, k) and (k, column).
fn designed(
    t: MatmulType,
    (m, k, n): (usize, usize, usize),
    a: impl Fn(usize, usize) -> f32,
    b: impl Fn(usize, usize) -> f32,
) -> Case {
    let mut c = Case::random(t, m, k, n, 0);
    c.a = (0..m * k).map(|i| a(i / k, i % k)).collect();
    c.b = (0..k * n).map(|i| b(i / n, i % n)).collect();
    c
}

fn i8_extremes(side: &Side<'_>, _: &Cx) -> Observed {
    let t = MatmulType::I8_I8_I32;
    let pick = |sel: usize, x: usize| match sel % 3 {
        0 => -128.0,
        1 => 127.0,
        _ => [127.0, -128.0][x % 2],
    };
    let c = designed(t, (3, 4096, 32), pick, |x, j| pick(j, x));
    observe_cases(side, &[c])
}

fn i4_edges(side: &Side<'_>, _: &Cx) -> Observed {
    let p = side.platform();
    let mut cases = Vec::new();
    for t in int4_b_types(p)? {
        let (lo, hi) = match t.a {
            ElemKind::I4 => (-8.0, 7.0),
            ElemKind::I8 => (-128.0, 127.0),
            _ => (-2.0, 2.0),
        };
        let a = move |r: usize, x: usize| match r % 3 {
            0 => lo,
            1 => hi,
            _ => [hi, lo][x % 2],
        };
        let b = |x: usize, j: usize| match j % 3 {
            0 => -8.0,
            1 => 7.0,
            _ => [7.0, -8.0][x % 2],
        };
        cases.push(designed(t, (3, 64, 128), a, b).layouts(Layout::Native, Layout::Norm));
    }
    observe_cases(side, &cases)
}

fn i16_overflow(side: &Side<'_>, _: &Cx) -> Observed {
    let p = side.platform();
    let t = MatmulType::I4_I4_I16;
    needs(p, t)?;
    // Columns of -8 or 7; rows that sum to 65536, 32768 (one past i16::MAX), 32704 (inside)
    // and -57344 / 50176.
    let a = |r: usize, x: usize| match r {
        0 => -8.0,
        1 => {
            if x < 512 {
                -8.0
            } else {
                0.0
            }
        }
        2 => {
            if x < 511 {
                -8.0
            } else {
                0.0
            }
        }
        _ => 7.0,
    };
    let b = |_: usize, j: usize| if j % 2 == 0 { -8.0 } else { 7.0 };
    let c = designed(t, (4, 1024, 64), a, b).layouts(Layout::Native, Layout::Norm);
    observe_cases(side, &[c])
}

fn requant_case(p: Platform) -> Result<MatmulType, Unsupported> {
    let t = MatmulType::I8_I8_I8;
    needs(p, t)?;
    Ok(t)
}

fn requant_rounding(side: &Side<'_>, _: &Cx) -> Observed {
    let t = requant_case(side.platform())?;
    // C = (2r - 7)(j + 1) / 2: a tie wherever both factors are odd.
    let a = |r: usize, x: usize| if x == 0 { 2.0 * r as f32 - 7.0 } else { 0.0 };
    let b = |x: usize, j: usize| if x == 0 { j as f32 + 1.0 } else { 0.0 };
    let mut c = designed(t, (8, 32, 32), a, b);
    c.qa = Some((1.0, 0));
    c.qb = BQuant::Layer(1.0, 0);
    c.qc = Some((2.0, 0));
    observe_cases(side, &[c])
}

fn requant_saturation(side: &Side<'_>, _: &Cx) -> Observed {
    let t = requant_case(side.platform())?;
    // Sums 126, 127, 128, 227, -127, -128, -129, -228.
    let extra = [-1.0, 0.0, 1.0, 100.0, 1.0, 0.0, -1.0, -100.0];
    let a = move |r: usize, x: usize| match x {
        0 => {
            if r < 4 {
                127.0
            } else {
                -128.0
            }
        }
        1 => extra[r],
        _ => 0.0,
    };
    let b = |x: usize, _: usize| if x < 2 { 1.0 } else { 0.0 };
    let mut c = designed(t, (8, 32, 32), a, b);
    c.qa = Some((1.0, 0));
    c.qb = BQuant::Layer(1.0, 0);
    c.qc = Some((1.0, 0));
    observe_cases(side, &[c])
}

fn requant_zero_points(side: &Side<'_>, cx: &Cx) -> Observed {
    let t = requant_case(side.platform())?;
    let mut c = Case::random(t, 4, 64, 32, seed(cx, 800));
    // sA sB / sC = 1 / 511: an integer over an odd number is never a tie (rounding is
    // arith.requant_rounding's question).
    c.qa = Some((0.5, 3));
    c.qb = BQuant::Layer(0.25, -2);
    c.qc = Some((63.875, 5));
    observe_cases(side, &[c])
}

fn i8_to_f32(side: &Side<'_>, cx: &Cx) -> Observed {
    let t = MatmulType::I8_I8_F32;
    needs(side.platform(), t)?;
    let mut c = Case::random(t, 4, 64, 32, seed(cx, 900));
    c.qa = Some((0.05, 0));
    c.qb = BQuant::Layer(0.02, 0);
    observe_cases(side, &[c])
}

fn f16_accumulation(side: &Side<'_>, _: &Cx) -> Observed {
    let ts = types_where(
        side.platform(),
        |t| t.a == ElemKind::F16 && t.b == ElemKind::F16,
        "f16 x f16 type",
    )?;
    let cases: Vec<Case> = ts
        .into_iter()
        .map(|t| {
            designed(
                t,
                (2, 4096, 32),
                |r, _| if r == 0 { 1.0 } else { 0.5 },
                |_, _| 1.0,
            )
        })
        .collect();
    observe_cases(side, &cases)
}

// ---------------------------------------------------------------------------------------
// quant.*

/// Types whose output depends on B's quant params: integer B, output not i32/i16.
fn dequantising_types(p: Platform) -> Result<Vec<MatmulType>, Unsupported> {
    types_where(
        p,
        |t| {
            matches!(t.b, ElemKind::I8 | ElemKind::I4)
                && matches!(t.c, ElemKind::F32 | ElemKind::F16 | ElemKind::I8)
        },
        "type that dequantises B",
    )
}

fn per_channel(side: &Side<'_>, cx: &Cx) -> Observed {
    let mut cases = Vec::new();
    for (i, t) in dequantising_types(side.platform())?.into_iter().enumerate() {
        let (m, k, n) = (3, 64, 64);
        let scales: Vec<f32> = (0..n).map(|j| 0.01 * (1 + j % 7) as f32).collect();
        // Scales of 0.01 steps are not dyadic: no sum of these sizes lands on a tie.
        for zps in [vec![], (0..n).map(|j| (j % 5) as i32 - 2).collect()] {
            let mut c = Case::random(t, m, k, n, seed(cx, 1000 + i as u64));
            c.qb = BQuant::Channel(scales.clone(), zps);
            c.qc = (t.c == ElemKind::I8).then_some((64.0, 0));
            cases.push(c);
        }
    }
    observe_cases(side, &cases)
}

fn per_group_order(side: &Side<'_>, cx: &Cx) -> Observed {
    let mut cases = Vec::new();
    for (i, t) in dequantising_types(side.platform())?.into_iter().enumerate() {
        let (m, k, n, g) = (2, 128, 64, 32);
        // Distinct scales for every (group, column), given in the [K/G][N] order.
        let scales: Vec<f32> = (0..k / g)
            .flat_map(|gi| (0..n).map(move |j| 0.001 * (1 + gi * n + j) as f32))
            .collect();
        let mut c = Case::random(t, m, k, n, seed(cx, 1100 + i as u64));
        c.qb = BQuant::Group(g, scales, vec![]);
        c.qc = (t.c == ElemKind::I8).then_some((255.0, 0));
        cases.push(c);
    }
    observe_cases(side, &cases)
}

fn normalised_scale(side: &Side<'_>, _: &Cx) -> Observed {
    let t = MatmulType::I8_I8_I32;
    let (k, n) = (64, 32);
    let mut c = Case::random(t, 1, k, n, 0);
    let scales: Vec<f32> = (0..n).map(|j| 0.01 * (1 + j % 5) as f32).collect();
    c.qb = BQuant::Channel(scales, vec![]);
    let mut items = Vec::new();
    let ctx = match Ctx::create(side.api(), &c.info()) {
        Ok(ctx) => ctx,
        Err(rc) => return Ok(vec![code("create", rc)]),
    };
    items.push(code("create", 0));
    if !c
        .set_quant(&ctx, "per-channel B", &mut items)
        .map_err(missing)?
    {
        return Ok(items);
    }
    let (rc, scale, array) = ctx.get_quant(n)?;
    items.push(code("get_quant_params", rc));
    if rc == 0 {
        let f = |data: Vec<f64>| Value::Floats {
            shape: (1, data.len()),
            data,
            rel: 1e-6,
        };
        items.push(Item::new("normalised scale", f(vec![f64::from(scale)])));
        items.push(Item::new(
            "scale array written",
            f(array.into_iter().map(f64::from).collect()),
        ));
    }
    Ok(items)
}

// ---------------------------------------------------------------------------------------
// dynamic.*

fn dynamic_m(side: &Side<'_>, cx: &Cx) -> Observed {
    let p = side.platform();
    let mut types = vec![MatmulType::I8_I8_I32];
    if cx.full() && p.accepts(MatmulType::F16_F16_F32) {
        types.push(MatmulType::F16_F16_F32);
    }
    let mut items = Vec::new();
    for (ti, t) in types.into_iter().enumerate() {
        let (k, n) = (64, 64);
        let ms = [1usize, 4, 33];
        let shapes: Vec<(usize, usize, usize)> = ms.iter().map(|&m| (m, k, n)).collect();
        let base = Case::random(t, 1, k, n, seed(cx, 1200 + ti as u64));
        let key = format!("{} M={ms:?} K={k} N={n}", type_name(t));
        let ctx = match Ctx::create_dynamic(side.api(), &base.info(), &shapes)? {
            Ok(c) => c,
            Err(rc) => {
                items.push(code(format!("{key}: create_dynamic_shape"), rc));
                continue;
            }
        };
        items.push(code(format!("{key}: create_dynamic_shape"), 0));
        let max =
            |f: fn(&sys::rknn_matmul_io_attr) -> u32| ctx.ios.iter().map(f).max().unwrap_or(0);
        let (sa, sb, sc) = (max(|io| io.A.size), ctx.ios[0].B.size, max(|io| io.C.size));
        let mems = (
            ctx.alloc(sa.max(1)),
            ctx.alloc(sb.max(1)),
            ctx.alloc(sc.max(1)),
        );
        let (Some(mut a), Some(mut b), Some(mut c)) = mems else {
            items.push(Item::new(
                format!("{key}: create_mem"),
                Value::Text("failed".into()),
            ));
            continue;
        };
        for (i, &(m, _, _)) in shapes.iter().enumerate() {
            let skey = format!("{key}: M={m}");
            let rc = ctx.set_shape(i, (m, k, n))?;
            items.push(code(format!("{skey}: set_dynamic_shape"), rc));
            if rc != 0 {
                break;
            }
            if i == 0 {
                b.write_synced(&base.encode_b(ctx.attr(Which::B), p));
                let rc = ctx.bind(&b, Which::B);
                items.push(code(format!("{skey}: set_io_mem B (once)"), rc));
                if rc != 0 {
                    break;
                }
            }
            let mut sc = Case::random(t, m, k, n, seed(cx, 1300 + i as u64));
            sc.b = base.b.clone();
            a.write_synced(&sc.encode_a(ctx.attr(Which::A)));
            c.write_synced(&[]);
            let ra = ctx.bind(&a, Which::A);
            items.push(code(format!("{skey}: set_io_mem A"), ra));
            let rc = ctx.bind(&c, Which::C);
            items.push(code(format!("{skey}: set_io_mem C"), rc));
            if ra != 0 || rc != 0 {
                break;
            }
            let rc = ctx.run();
            items.push(code(format!("{skey}: run"), rc));
            if rc != 0 {
                break;
            }
            c.sync(sys::RKNN_MEMORY_SYNC_FROM_DEVICE);
            items.push(sc.read_c(&ctx, &c, &skey));
        }
    }
    Ok(items)
}

fn dynamic_kn(side: &Side<'_>, cx: &Cx) -> Observed {
    let p = side.platform();
    let t = MatmulType::I8_I8_I32;
    let shapes = [(2usize, 64usize, 32usize), (2, 128, 32)];
    let mut items = Vec::new();
    let base = Case::random(t, 2, 64, 32, seed(cx, 1400));
    let norm = Ctx::create_dynamic(side.api(), &base.info(), &shapes)?;
    items.push(code(
        "B=norm, K 64 then 128: create_dynamic_shape",
        norm.err().unwrap_or(0),
    ));
    let tp = base.clone().layouts(Layout::TpNorm, Layout::Norm);
    let ctx = match Ctx::create_dynamic(side.api(), &tp.info(), &shapes)? {
        Ok(c) => c,
        Err(rc) => {
            items.push(code("B=tp_norm, K 64 then 128: create_dynamic_shape", rc));
            return Ok(items);
        }
    };
    items.push(code("B=tp_norm, K 64 then 128: create_dynamic_shape", 0));
    let max = |f: fn(&sys::rknn_matmul_io_attr) -> u32| ctx.ios.iter().map(f).max().unwrap_or(0);
    let (sa, sb, sc) = (
        max(|io| io.A.size),
        max(|io| io.B.size),
        max(|io| io.C.size),
    );
    let cases: Vec<Case> = shapes
        .iter()
        .enumerate()
        .map(|(i, &(m, k, n))| {
            Case::random(t, m, k, n, seed(cx, 1410 + i as u64))
                .layouts(Layout::TpNorm, Layout::Norm)
        })
        .collect();
    let mems = (ctx.alloc(sa), ctx.alloc(sb), ctx.alloc(sb), ctx.alloc(sc));
    let (Some(mut a), Some(mut b0), Some(mut b1), Some(mut c)) = mems else {
        items.push(Item::new("create_mem", Value::Text("failed".into())));
        return Ok(items);
    };
    for (i, cs) in cases.iter().enumerate() {
        let key = format!("B=tp_norm K={}", cs.k);
        let rc = ctx.set_shape(i, (cs.m, cs.k, cs.n))?;
        items.push(code(format!("{key}: set_dynamic_shape"), rc));
        if rc != 0 {
            return Ok(items);
        }
        a.write_synced(&cs.encode_a(ctx.attr(Which::A)));
        c.write_synced(&[]);
        items.push(code(format!("{key}: set_io_mem A"), ctx.bind(&a, Which::A)));
        items.push(code(format!("{key}: set_io_mem C"), ctx.bind(&c, Which::C)));
        let b = if i == 0 { &mut b0 } else { &mut b1 };
        b.write_synced(&cs.encode_b(ctx.attr(Which::B), p));
        if i == 1 {
            // B is still the one bound for K = 64.
            items.push(code(
                format!("{key}: run with the B bound for K=64"),
                ctx.run(),
            ));
        }
        items.push(code(format!("{key}: set_io_mem B"), ctx.bind(b, Which::B)));
        let rc = ctx.run();
        items.push(code(format!("{key}: run"), rc));
        if rc == 0 {
            c.sync(sys::RKNN_MEMORY_SYNC_FROM_DEVICE);
            items.push(cs.read_c(&ctx, &c, &key));
        }
    }
    Ok(items)
}

// ---------------------------------------------------------------------------------------
// sync.*

fn without_sync(side: &Side<'_>, cx: &Cx) -> Observed {
    let p = side.platform();
    let t = MatmulType::I8_I8_I32;
    let cs = Case::random(t, 2, 64, 32, seed(cx, 1500));
    let mut items = Vec::new();
    for (part, sync_inputs, sync_c) in [
        (
            "inputs synced, C read without a sync from the device",
            true,
            false,
        ),
        (
            "inputs written without a sync to the device, C synced",
            false,
            true,
        ),
    ] {
        let ctx = match Ctx::create(side.api(), &cs.info()) {
            Ok(c) => c,
            Err(rc) => return Ok(vec![code("create", rc)]),
        };
        let Some((mut a, mut b, c)) = alloc_abc(&ctx, part, &mut items) else {
            return Ok(items);
        };
        for (mem, data) in [
            (&mut a, cs.encode_a(ctx.attr(Which::A))),
            (&mut b, cs.encode_b(ctx.attr(Which::B), p)),
        ] {
            let bytes = mem.bytes_mut();
            let len = data.len().min(bytes.len());
            bytes[..len].copy_from_slice(&data[..len]);
        }
        if sync_inputs {
            a.sync(sys::RKNN_MEMORY_SYNC_TO_DEVICE);
            b.sync(sys::RKNN_MEMORY_SYNC_TO_DEVICE);
        }
        if !bind_abc(&ctx, [&a, &b, &c], part, &mut items) {
            return Ok(items);
        }
        let rc = ctx.run();
        items.push(code(format!("{part}: run"), rc));
        if rc != 0 {
            return Ok(items);
        }
        if sync_c {
            c.sync(sys::RKNN_MEMORY_SYNC_FROM_DEVICE);
        }
        items.push(cs.read_c(&ctx, &c, part));
    }
    Ok(items)
}

fn native_read_at_run(side: &Side<'_>, cx: &Cx) -> Observed {
    let p = side.platform();
    let t = MatmulType::I8_I8_I32;
    let first = Case::random(t, 2, 64, 32, seed(cx, 1600)).layouts(Layout::Native, Layout::Norm);
    let mut second =
        Case::random(t, 2, 64, 32, seed(cx, 1601)).layouts(Layout::Native, Layout::Norm);
    second.a = first.a.clone();
    let mut items = Vec::new();
    let ctx = match Ctx::create(side.api(), &first.info()) {
        Ok(c) => c,
        Err(rc) => return Ok(vec![code("create", rc)]),
    };
    let key = "native B";
    let Some((mut a, mut b, mut c)) = alloc_abc(&ctx, key, &mut items) else {
        return Ok(items);
    };
    a.write_synced(&first.encode_a(ctx.attr(Which::A)));
    b.write_synced(&first.encode_b(ctx.attr(Which::B), p));
    c.write_synced(&[]);
    if !bind_abc(&ctx, [&a, &b, &c], key, &mut items) {
        return Ok(items);
    }
    for (name, cs) in [
        ("first run", &first),
        ("B rewritten and synced, not bound again", &second),
    ] {
        if std::ptr::eq(cs, &second) {
            b.write_synced(&second.encode_b(ctx.attr(Which::B), p));
        }
        let rc = ctx.run();
        items.push(code(format!("{name}: run"), rc));
        if rc != 0 {
            return Ok(items);
        }
        c.sync(sys::RKNN_MEMORY_SYNC_FROM_DEVICE);
        items.push(cs.read_c(&ctx, &c, name));
    }
    Ok(items)
}

// ---------------------------------------------------------------------------------------
// memory.*

fn with_domain(mut i: sys::rknn_matmul_info, domain: i32) -> sys::rknn_matmul_info {
    i.iommu_domain_id = domain;
    i
}

/// A bound as a memory allocated on a second context of IOMMU domain `domain`. The run is made
/// only within one domain: across domains the NPU would use an address the context's domain
/// does not map (an IOMMU fault on a board), so there only the bind's answer is observed.
fn foreign_a(side: &Side<'_>, cx: &Cx, domain: i32, key: &str) -> Observed {
    let p = side.platform();
    let cs = Case::random(MatmulType::I8_I8_I32, 2, 64, 32, seed(cx, 1700));
    let mut items = Vec::new();
    let (c0, c1) = (
        Ctx::create(side.api(), &cs.info()),
        Ctx::create(side.api(), &with_domain(cs.info(), domain)),
    );
    let (ctx, other) = match (c0, c1) {
        (Ok(a), Ok(b)) => (a, b),
        (a, b) => {
            items.push(code("create (domain 0)", a.err().unwrap_or(0)));
            items.push(code(
                format!("create (domain {domain})"),
                b.err().unwrap_or(0),
            ));
            return Ok(items);
        }
    };
    let Some(mut foreign) = other.alloc(ctx.io().A.size) else {
        items.push(Item::new(
            format!("{key}: create_mem"),
            Value::Text("failed".into()),
        ));
        return Ok(items);
    };
    let Some((_, mut b, mut c)) = alloc_abc(&ctx, key, &mut items) else {
        return Ok(items);
    };
    foreign.write_synced(&cs.encode_a(ctx.attr(Which::A)));
    b.write_synced(&cs.encode_b(ctx.attr(Which::B), p));
    c.write_synced(&[]);
    if !bind_abc(&ctx, [&foreign, &b, &c], key, &mut items) || domain != 0 {
        return Ok(items);
    }
    let rc = ctx.run();
    items.push(code(format!("{key}: run"), rc));
    if rc == 0 {
        c.sync(sys::RKNN_MEMORY_SYNC_FROM_DEVICE);
        items.push(cs.read_c(&ctx, &c, key));
    }
    Ok(items)
}

fn shared_between_contexts(side: &Side<'_>, cx: &Cx) -> Observed {
    foreign_a(side, cx, 0, "A allocated on another context of domain 0")
}

fn cross_domain(side: &Side<'_>, cx: &Cx) -> Observed {
    foreign_a(side, cx, 1, "A allocated on a context of IOMMU domain 1")
}

fn destroyed_before_run(side: &Side<'_>, cx: &Cx) -> Observed {
    let p = side.platform();
    let cs = Case::random(MatmulType::I8_I8_I32, 2, 64, 32, seed(cx, 1800));
    let mut items = Vec::new();
    for (i, name) in ["A", "C"].into_iter().enumerate() {
        let ctx = match Ctx::create(side.api(), &cs.info()) {
            Ok(c) => c,
            Err(rc) => return Ok(vec![code("create", rc)]),
        };
        let key = format!("{name} destroyed after binding");
        let Some((mut a, mut b, mut c)) = alloc_abc(&ctx, &key, &mut items) else {
            return Ok(items);
        };
        a.write_synced(&cs.encode_a(ctx.attr(Which::A)));
        b.write_synced(&cs.encode_b(ctx.attr(Which::B), p));
        c.write_synced(&[]);
        if !bind_abc(&ctx, [&a, &b, &c], &key, &mut items) {
            return Ok(items);
        }
        let rc = if i == 0 { a.destroy() } else { c.destroy() };
        items.push(code(format!("{key}: destroy_mem"), rc));
        items.push(code(format!("{key}: run"), ctx.run()));
    }
    Ok(items)
}

// ---------------------------------------------------------------------------------------
// hazard.*

const HANDLE_LIMIT: usize = 1100;

fn handle_budget(side: &Side<'_>, _: &Cx) -> Observed {
    if side.rt.is_hardware() {
        let soft = side.rt.fd_limit().map_or(0, |l| l.soft);
        if soft < (HANDLE_LIMIT + 128) as u64 {
            return Err(Unsupported(format!(
                "the file-descriptor limit ({soft}) is too low to allocate {HANDLE_LIMIT} memories safely: the runtime crashes when it runs out (raise `ulimit -n`)"
            )));
        }
    }
    let ctx = match Ctx::create(side.api(), &info(MatmulType::I8_I8_I32, 1, 32, 32)) {
        Ok(c) => c,
        Err(rc) => return Ok(vec![code("create", rc)]),
    };
    let mut mems = Vec::new();
    while mems.len() < HANDLE_LIMIT {
        match ctx.alloc(64) {
            Some(m) => mems.push(m),
            None => break,
        }
    }
    Ok(vec![Item::new(
        format!("memories created before the first failure (at most {HANDLE_LIMIT} tried)"),
        Value::Int(mems.len() as i64),
    )])
}

fn iommu_domain(side: &Side<'_>, _: &Cx) -> Observed {
    let mut i = info(MatmulType::I8_I8_I32, 1, 32, 32);
    i.iommu_domain_id = 2;
    let ctx = match Ctx::create(side.api(), &i) {
        Ok(c) => c,
        Err(rc) => return Ok(vec![code("create (domain 2)", rc)]),
    };
    let mut mems = Vec::new();
    while mems.len() < 5 {
        match ctx.alloc(1 << 30) {
            Some(m) => mems.push(m),
            None => break,
        }
    }
    Ok(vec![Item::new(
        "1 GiB memories created in IOMMU domain 2 before the first failure (at most 5 tried)",
        Value::Int(mems.len() as i64),
    )])
}

// ---------------------------------------------------------------------------------------
// Timings (full mode)

/// Median seconds of `runs` runs of a case whose inputs are bound, after one warm-up run.
fn time_case(api: &rknn_sys::RknnApi, p: Platform, cs: &Case, runs: usize) -> Option<f64> {
    let ctx = Ctx::create(api, &cs.info()).ok()?;
    let mut items = Vec::new();
    let (mut a, mut b, c) = alloc_abc(&ctx, "timing", &mut items)?;
    a.write_synced(&cs.encode_a(ctx.attr(Which::A)));
    b.write_synced(&cs.encode_b(ctx.attr(Which::B), p));
    if !bind_abc(&ctx, [&a, &b, &c], "timing", &mut items) || ctx.run() != 0 {
        return None;
    }
    let mut times: Vec<f64> = (0..runs)
        .map(|_| {
            let t = Instant::now();
            let _ = ctx.run();
            t.elapsed().as_secs_f64()
        })
        .collect();
    times.sort_by(f64::total_cmp);
    times.get(times.len() / 2).copied()
}

/// The timing facts the docs and the engine's sizing rely on, measured on the subject: int8
/// at decode and prefill shapes, and where the chip has int4 weights (RK3576) each int4 type
/// at the decode shape, per channel (no NPU quant parameters: the engine applies the scales on
/// the host) and, for the types with a float C, per group of 32 and 128 (the chip's per-group
/// mode, \[open] there). A decode-shaped run reads its weights once, so its B bytes per second
/// is the DDR bandwidth one core realises: what the cost model assumes for RK3576 (11.2 GB/s a
/// core, 15.15 GB/s for all, carried from RK3588) and a board settles.
pub fn timings(subject: &rknn_matmul::Runtime) -> Vec<Timing> {
    let p = subject.platform();
    let i8 = MatmulType::I8_I8_I32;
    let mut shapes = vec![
        (i8, (1, 4096, 4096), None, "decode-sized; no public figure"),
        (
            i8,
            (64, 16384, 256),
            None,
            "K above the 8192 segment: one context ran 14x slower than split K",
        ),
    ];
    // The large ones only where the figures mean something (the emulator would take minutes).
    if subject.is_hardware() {
        shapes.push((i8, (128, 4096, 4096), None, "one core; compare with 4096^3"));
        shapes.push((i8, (4096, 4096, 4096), None, "0.69 TOPS on one RK3588 core"));
    }
    const INT4_DECODE: &str = "RK3576 cost model (assumed): 11.2 GB/s of B a core";
    // The emulator's int4 kernels unpack B at every run: a smaller decode shape there (its
    // times say nothing of a board's anyway).
    let d = if subject.is_hardware() { 4096 } else { 1024 };
    for t in int4_b_types(p).unwrap_or_default() {
        if t.a == ElemKind::I4 {
            // W4A4 (RK3588's type 10) is no engine format.
            continue;
        }
        shapes.push((t, (1, d, d), None, INT4_DECODE));
        if matches!(t.c, ElemKind::F32 | ElemKind::F16) {
            for g in [32, 128] {
                shapes.push((
                    t,
                    (1, d, d),
                    Some(g),
                    "per-group mode [open]; compare with per channel",
                ));
            }
        }
    }
    let mut out = Vec::new();
    for (t, (m, k, n), group, documented) in shapes {
        let mut cs = Case::random(t, m, k, n, 1).layouts(Layout::Native, Layout::Norm);
        if let Some(g) = group {
            // Scales near 1, distinct per (group, column).
            let scales = (0..k / g * n)
                .map(|i| 1.0 + (i % 7) as f32 / 64.0)
                .collect();
            cs.qb = BQuant::Group(g, scales, vec![]);
        }
        let runs = if subject.is_hardware() { 9 } else { 3 };
        if let Some(s) = time_case(subject.api(), p, &cs, runs) {
            let per = group.map_or(String::new(), |g| format!(", per group of {g}"));
            out.push(Timing {
                what: format!("{}x{}->{} M={m} K={k} N={n}{per}, native B", t.a, t.b, t.c),
                seconds: s,
                ops_per_second: 2.0 * (m * k * n) as f64 / s,
                b_bytes_per_second: t.b.bytes_for(k * n).unwrap_or(0) as f64 / s,
                documented,
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_unique_and_settings_are_variables() {
        let mut ids: Vec<&str> = CHECKS.iter().map(|c| c.id).collect();
        ids.sort_unstable();
        let n = ids.len();
        ids.dedup();
        assert_eq!(ids.len(), n, "duplicate check ids");
        for c in CHECKS {
            assert!(c.id.contains('.'), "{}", c.id);
            for s in c.settings {
                assert!(s.env.starts_with("RKNN_"), "{}", s.env);
            }
        }
    }

    #[test]
    fn operands_show_the_row_and_column_behind_an_element() {
        let cs = designed(
            MatmulType::I8_I8_I32,
            (2, 3, 2),
            |r, x| (r * 10 + x) as f32,
            |x, j| (x * 10 + j) as f32,
        );
        let op = super::super::observe::Operands {
            describe: serde_json::json!({}),
            a: cs.a.clone(),
            b: cs.b.clone(),
            mkn: (2, 3, 2),
        };
        assert_eq!(op.a[3..6], [10.0, 11.0, 12.0]);
        assert_eq!([op.b[1], op.b[3], op.b[5]], [1.0, 11.0, 21.0]);
    }
}
