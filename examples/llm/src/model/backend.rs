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

    /// The engine linear behind this op, when it is one: [`forward_many`] runs such linears
    /// as one round of the engine's lanes (default: none).
    fn engine_linear(&self) -> Option<&rknn_matmul::engine::Linear> {
        None
    }
}

/// One forward of [`forward_many`]: `out` (`m × out_features`) = `x` (`m × in_features`)
/// through `op`.
pub struct OpJob<'a> {
    /// The linear.
    pub op: &'a dyn LinearOp,
    /// The input rows.
    pub x: &'a [f32],
    /// Rows.
    pub m: usize,
    /// The output rows, written in place.
    pub out: &'a mut [f32],
}

impl std::fmt::Debug for OpJob<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpJob")
            .field("in_features", &self.op.in_features())
            .field("out_features", &self.op.out_features())
            .field("m", &self.m)
            .finish_non_exhaustive()
    }
}

/// Runs independent forwards (a mixture's chosen experts): as one round of the engine's
/// lanes when every op is an engine linear ([`rknn_matmul::engine::Linear::forward_many`]:
/// experts placed whole on different cores run at once), else one after another. Each
/// output is what the op's own [`LinearOp::forward`] gives, bit for bit.
pub fn forward_many(jobs: &mut [OpJob<'_>]) -> Result<(), BackendError> {
    let linears: Option<Vec<&rknn_matmul::engine::Linear>> =
        jobs.iter().map(|j| j.op.engine_linear()).collect();
    match linears {
        Some(linears) if jobs.len() > 1 => {
            let mut engine_jobs: Vec<rknn_matmul::engine::ForwardJob<'_>> = jobs
                .iter_mut()
                .zip(linears)
                .map(|(j, linear)| rknn_matmul::engine::ForwardJob {
                    linear,
                    x: j.x,
                    m: j.m,
                    out: &mut *j.out,
                })
                .collect();
            Ok(rknn_matmul::engine::Linear::forward_many(&mut engine_jobs)?)
        }
        _ => jobs
            .iter_mut()
            .try_for_each(|j| j.op.forward(j.x, j.m, j.out)),
    }
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

    /// As [`LinearFactory::build`], for a linear of expert `expert` of a mixture (its gate-up
    /// and its down get the same number): a factory may place experts apart (the engine's:
    /// each whole on one core, [`ExpertPlacement::PerCore`](super::ExpertPlacement)).
    /// Default: as any linear.
    fn build_expert(
        &mut self,
        role: LinearRole,
        parts: &[TensorView<'_>],
        expert: usize,
    ) -> Result<Box<dyn LinearOp>, BackendError> {
        let _ = expert;
        self.build(role, parts)
    }
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
