//! What the probes report: the reference figures a measurement is set against (the rated
//! figure, the field's, the cost model's), the header saying what ran where, the table, and
//! one JSON object per case.

use std::fmt::Write as _;

use rknn_matmul::rknn_emu::cost::CostModel;
use rknn_matmul::{Matmul, Runtime};

use super::cases::{Case, Dtype, ProbeKind, Shape};
use super::flags::CaseFlags;

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::common::cases::{LayoutArg, QuantArg};

    fn case(m: usize, k: usize, n: usize, dtype: Dtype, layout: LayoutArg) -> Case {
        Case {
            shape: Shape { m, k, n },
            dtype,
            layout,
            quant: QuantArg::PerLayer,
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
