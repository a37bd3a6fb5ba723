//! The seam between the model and whatever multiplies by its weights: the backend.
//!
//! Every weight matmul of the model goes through [`LinearOp`]. The model is built from a GGUF
//! file and a [`LinearFactory`], which receives each weight tensor as a zero-copy view into
//! the file, one at a time, and turns it into a `LinearOp` in the backend's own format (so a
//! backend converts the weights streaming, never holding two copies of the whole model). Two
//! backends exist: the host f32 reference ([`super::host`]) and the NPU engine
//! ([`super::npu`]).

use rknn_chip::LinearRole;
use rknn_matmul::engine::Engine;

use crate::gguf::TensorView;

/// An error from a backend, kept as the backend's own error type.
pub type BackendError = Box<dyn std::error::Error + Send + Sync>;

/// `y = x · Wᵀ` for a weight `W` of `out_features` rows of `in_features`.
pub trait LinearOp: Send + Sync {
    /// Length of an input row (`K`).
    fn in_features(&self) -> usize;

    /// Length of an output row (`N`).
    fn out_features(&self) -> usize;

    /// Multiplies `m` rows: `x` is `m × in_features` and `out` `m × out_features`, both
    /// row-major, `out[i][n] = Σₖ x[i][k] · W[n][k]`.
    ///
    /// Implementations used as the reference must compute each output element the same way
    /// whatever `m` and the thread count (batch invariance).
    fn forward(&self, x: &[f32], m: usize, out: &mut [f32]) -> Result<(), BackendError>;

    /// The weights' format as this implementation holds them, for statistics (`"f32"`,
    /// `"w8a8"`, `"f16"`).
    fn weight_format(&self) -> &'static str;
}

/// Builds the [`LinearOp`] of each weight matrix as the model loads.
pub trait LinearFactory {
    /// The engine the linears run on, when they run on the NPU (or its emulator): the model
    /// keeps it for its statistics and modelled NPU time.
    fn engine(&self) -> Option<&Engine> {
        None
    }

    /// Called once every linear is built, before the model is returned (a factory that writes
    /// what it converted finishes the file here).
    fn finish(&mut self) -> Result<(), BackendError> {
        Ok(())
    }

    /// Converts the weight made of `parts` stacked along the output features (one tensor for
    /// most linears; q, k and v, or gate and up, for the fused linears that read the same
    /// input) for the linear `role`. Each part has dimensions `[in_features, out_i]` and any
    /// dequantizable type.
    fn build(
        &mut self,
        role: LinearRole,
        parts: &[TensorView<'_>],
    ) -> Result<Box<dyn LinearOp>, BackendError>;
}

/// `(in_features, out_features)` of `parts` stacked along the output features, checked.
pub fn stacked_shape(parts: &[TensorView<'_>]) -> Result<(usize, usize), BackendError> {
    let first = parts
        .first()
        .ok_or("a linear needs at least one weight tensor")?;
    let mut n = 0usize;
    let mut k = None;
    for t in parts {
        let dims = t.dims();
        if dims.len() != 2 {
            return Err(format!(
                "tensor {:?}: a linear weight has 2 dimensions, not {dims:?}",
                t.name()
            )
            .into());
        }
        let (tk, tn) = (usize::try_from(dims[0])?, usize::try_from(dims[1])?);
        if *k.get_or_insert(tk) != tk {
            return Err(format!(
                "tensors {:?} and {:?} cannot be fused: {tk} and {} input features",
                first.name(),
                t.name(),
                k.unwrap_or(0)
            )
            .into());
        }
        n = n.checked_add(tn).ok_or("fused output features overflow")?;
    }
    Ok((k.unwrap_or(0), n))
}
