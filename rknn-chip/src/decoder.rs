//! The linears of a decoder as the engine runs them ([`LinearRole`]), and which of them quantise
//! each input row twice ([`Residual`]).
//!
//! Not a chip fact: these live here, beside the [`plan`](crate::plan) that splits each linear,
//! because two crates that do not depend on each other name them, the cost model of `rknn-emu`
//! (which prices a decoder's linears) and the LLM library `rknn-llm` (which builds them), and
//! this is the lowest crate both reach. One definition keeps the cost model's decoder the
//! LLM's.

/// Which linear of a decoder a weight is, so a backend can treat them differently (the output
/// head decides the next token directly, for instance). The engine's layout fuses the linears
/// that read the same input.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LinearRole {
    /// q, k and v fused: N = q_dim + 2 · kv_dim, K = hidden.
    Qkv,
    /// The attention output projection (o): N = hidden, K = q_dim.
    AttnOutput,
    /// gate and up fused: N = 2 · n_ff, K = hidden.
    GateUp,
    /// The feed-forward down projection: N = hidden, K = n_ff.
    Down,
    /// The output head (the vocabulary's logits): N = vocab, K = hidden.
    Output,
}

/// Which linears quantise each input row twice, as itself and as the residual of the first
/// quantisation, and so run two rows of A per input row: about 15 bits of activation precision
/// from int8 arithmetic, for a second row of A (little in decode, bound by reading the weights;
/// twice the NPU work in prefill).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Residual {
    /// None.
    None,
    /// The output head only.
    Output,
    /// The output head and the feed-forward down projections (whose inputs, SwiGLU outputs,
    /// are the most heavy-tailed): the engine's default.
    OutputAndDown,
    /// Every linear.
    All,
}

impl Residual {
    /// Whether a linear of `role` has residual activations.
    ///
    /// ```
    /// use rknn_chip::{LinearRole, Residual};
    /// assert!(Residual::OutputAndDown.applies(LinearRole::Down));
    /// assert!(!Residual::Output.applies(LinearRole::Down));
    /// ```
    pub fn applies(self, role: LinearRole) -> bool {
        match self {
            Residual::None => false,
            Residual::Output => role == LinearRole::Output,
            Residual::OutputAndDown => matches!(role, LinearRole::Output | LinearRole::Down),
            Residual::All => true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_policy_covers_its_linears_and_the_wider_ones_more() {
        let roles = [
            LinearRole::Qkv,
            LinearRole::AttnOutput,
            LinearRole::GateUp,
            LinearRole::Down,
            LinearRole::Output,
        ];
        let covered = |r: Residual| -> Vec<LinearRole> {
            roles.iter().copied().filter(|&l| r.applies(l)).collect()
        };
        assert_eq!(covered(Residual::None), []);
        assert_eq!(covered(Residual::Output), [LinearRole::Output]);
        assert_eq!(
            covered(Residual::OutputAndDown),
            [LinearRole::Down, LinearRole::Output]
        );
        assert_eq!(covered(Residual::All), roles);
    }
}
