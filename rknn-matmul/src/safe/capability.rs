//! What a runtime can multiply: every matmul type tried (on the NPU) or looked up (emulator),
//! and requests by quantisation scheme with reasons for refusals.

use rknn_chip::{MatmulType, Platform};
use rknn_sys as sys;

use super::context::ContextHandle;
use super::runtime::Runtime;
use crate::dtype::Scheme;
use crate::error::{Error, Result};

/// One row of the capability table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Capability {
    /// The matmul type.
    pub matmul_type: MatmulType,
    /// Its scheme.
    pub scheme: Scheme,
    /// Whether it runs here.
    pub supported: bool,
    /// Why not (or a note when the probe and the documented table disagree).
    pub reason: Option<String>,
}

fn table_reason(p: Platform, t: MatmulType) -> String {
    if p == Platform::Rk3588 && Scheme::of(t).is_weight_only() {
        "RK3588 has no weight-only int8/int4 matmul (the hardware rejects it with RKNN_ERR_PARAM_INVALID)".to_string()
    } else if [6, 12, 15].contains(&t.raw()) {
        format!("{} is listed for no chip in public sources", t.c_name())
    } else {
        format!("not among {p}'s matmul types")
    }
}

impl Runtime {
    /// The capability table: every matmul type is tried with `rknn_matmul_create` on a minimal
    /// aligned shape (the same probe on the NPU and on the emulator) and compared with the
    /// documented table.
    pub fn capabilities(&self) -> Vec<Capability> {
        let p = self.platform();
        MatmulType::ALL
            .iter()
            .map(|&t| {
                let documented = p.accepts(t);
                let (supported, reason) = match self.try_create(t) {
                    Ok(()) if documented => (true, None),
                    Ok(()) => (
                        true,
                        Some(format!(
                            "runs, although the documented table says it is not supported on {p}"
                        )),
                    ),
                    Err(e) if documented => {
                        (false, Some(format!("documented for {p} but refused: {e}")))
                    }
                    Err(_) => (false, Some(table_reason(p, t))),
                };
                Capability {
                    matmul_type: t,
                    scheme: Scheme::of(t),
                    supported,
                    reason,
                }
            })
            .collect()
    }

    /// Creates (and drops) a minimal context of type `t`: whether this runtime accepts it.
    pub(crate) fn try_create(&self, t: MatmulType) -> Result<()> {
        // K = N = 64 meets every chip's alignment for every type; native B is what int4 needs.
        let mut info = sys::rknn_matmul_info {
            M: 1,
            K: 64,
            N: 64,
            type_: t.raw(),
            B_layout: 1,
            ..Default::default()
        };
        ContextHandle::create(self, &mut info).map(drop)
    }

    /// The matmul types that implement `scheme` here, best first, or an error explaining why
    /// the chip cannot.
    ///
    /// ```
    /// # if !cfg!(feature = "emulator") { return Ok(()); } // the emulator is not compiled in
    /// use rknn_matmul::{Platform, Runtime, Scheme};
    /// let rt = Runtime::emulator(Platform::Rk3588)?;
    /// let err = rt.require(Scheme::W4A16).unwrap_err().to_string();
    /// assert!(err.contains("no weight-only") && err.contains("W4A4"), "{err}");
    /// assert_eq!(rt.require(Scheme::W8A8)?[0].c_name(), "RKNN_INT8_MM_INT8_TO_INT32");
    /// # Ok::<(), rknn_matmul::Error>(())
    /// ```
    pub fn require(&self, scheme: Scheme) -> Result<Vec<MatmulType>> {
        let p = self.platform();
        let types: Vec<MatmulType> = self
            .capabilities()
            .into_iter()
            .filter(|c| c.scheme == scheme && c.supported)
            .map(|c| c.matmul_type)
            .collect();
        if !types.is_empty() {
            return Ok(types);
        }
        let have: Vec<Scheme> = self
            .capabilities()
            .iter()
            .filter(|c| c.supported)
            .map(|c| c.scheme)
            .collect();
        let reason = refusal(p, scheme, &have);
        Err(Error::Unsupported {
            scheme,
            platform: p,
            reason,
        })
    }
}

impl Runtime {
    /// [`Error::Unsupported`] for `t` when the documented table of the chip lacks it, with
    /// the reason [`Runtime::require`] gives (the schemes the chip has from the table): no
    /// context is created, so nothing is allocated and the runtime logs no refusal. `None`
    /// when the table lists `t` (whether this runtime accepts it is then a context away).
    pub(crate) fn documented_refusal(&self, t: MatmulType) -> Option<Error> {
        let p = self.platform();
        if p.accepts(t) {
            return None;
        }
        let have: Vec<Scheme> = MatmulType::ALL
            .iter()
            .filter(|&&t| p.accepts(t))
            .map(|&t| Scheme::of(t))
            .collect();
        let scheme = Scheme::of(t);
        Some(Error::Unsupported {
            scheme,
            platform: p,
            reason: refusal(p, scheme, &have),
        })
    }
}

/// Why `p` cannot run `scheme`: RK3588's missing weight-only modes in words, else the schemes
/// it has (`have`, in any order, repeats allowed).
fn refusal(p: Platform, scheme: Scheme, have: &[Scheme]) -> String {
    if p == Platform::Rk3588 && scheme.is_weight_only() {
        "the RK3588 NPU has no weight-only int8/int4 matmul (types 5, 7 and 11 are rejected by the \
         hardware). Its only int4 mode is W4A4 (RKNN_INT4_MM_INT4_TO_INT16), which quantises the \
         activations to 4 bits as well: transformer activation outliers do not fit, so W4A4 output is \
         unusable for LLMs without rotation tricks. Use W8A8 (int8 weights, per-channel scales on the \
         host) or F16"
            .to_string()
    } else {
        let have: Vec<String> = have
            .iter()
            .map(|s| s.to_string())
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect();
        format!(
            "no matmul type of this scheme runs on {p} (it has: {})",
            have.join(", ")
        )
    }
}
