//! `e^x` for the host's SwiGLU and softmax, as plain arithmetic that the compiler vectorises.
//!
//! Why not `f32::exp`: it is a call into the C library per element, which keeps the loops
//! around it scalar (SwiGLU takes `n_ff` of them per row and layer, softmax one per cached
//! position and head: 46 000 and, 1 500 positions into a generation, 405 000 per token of the
//! demo model), and its result is whatever that library computes on the machine at hand.
//! This one is the same few IEEE operations everywhere (no fused multiply-add, no table), so the
//! host part of a forward pass gives the same bits on x86-64 and aarch64, on every backend.
//!
//! The method is the classic one (Cody and Waite's reduction, Cephes' `expf` polynomial):
//! `x = n ln 2 + r` with `n` an integer and `|r| <= ln 2 / 2`, `e^r` by a degree-7 polynomial,
//! and `2^n` built in the exponent bits. Inputs are clamped to `[-87, 88]`, where `2^n` is a
//! normal number, so the result is never infinite, zero or subnormal: below the range it is
//! about `1.6e-38` instead of a smaller number or 0, above it `e^88`. Neither matters where it
//! is used: a softmax term that small vanishes against the maximum's `1`, and SwiGLU's
//! `g / (1 + e^-g)` is then `g` or within `1e-37` of 0. NaN stays NaN. Relative error within
//! a few units in the last place of the correctly rounded result (tested against `f64::exp`).

/// `log2(e)`.
const LOG2E: f32 = std::f32::consts::LOG2_E;
/// `ln 2` split in two so that `n * LN2_HI` is exact for the `n` that occur (|n| <= 127).
const LN2_HI: f32 = 0.693_359_4;
const LN2_LO: f32 = -2.121_944_4e-4;
/// `1.5 * 2^23`: adding it rounds a float of magnitude below `2^22` to an integer (to nearest,
/// ties to even) and leaves that integer in the low bits of the mantissa.
const ROUNDER: f32 = 12_582_912.0;
/// The clamp: `e^x` for `x` in this range has a normal `2^n` (`n` in `-126..=127`).
const X_MIN: f32 = -87.0;
const X_MAX: f32 = 88.0;

/// `e^x`, see the module documentation for its range and accuracy.
#[inline(always)]
pub(crate) fn exp(x: f32) -> f32 {
    // NaN stays NaN through `clamp`.
    let x = x.clamp(X_MIN, X_MAX);
    let t = x * LOG2E + ROUNDER;
    let n = t - ROUNDER;
    let n_bits = (t.to_bits() as i32).wrapping_sub(ROUNDER.to_bits() as i32);
    let r = (x - n * LN2_HI) - n * LN2_LO;
    let r2 = r * r;
    let p = ((((1.987_569_1e-4 * r + 1.398_199_9e-3) * r + 8.333_452e-3) * r + 4.166_579_6e-2) * r
        + 1.666_666_5e-1)
        * r
        + 0.5;
    let e_r = p * r2 + r + 1.0;
    let scale = f32::from_bits((n_bits.wrapping_add(127) << 23) as u32);
    e_r * scale
}

#[cfg(test)]
mod tests {
    use super::exp;

    /// Units in the last place between `got` and the exactly computed `e^x` rounded to f32.
    fn ulps(got: f32, x: f32) -> f64 {
        let want = f64::from(x).exp();
        let ulp = f64::from(f32::EPSILON) * (want as f32).abs() as f64;
        (f64::from(got) - want).abs() / ulp
    }

    #[test]
    fn is_within_a_few_ulps_of_exp_over_the_range() {
        let mut worst = 0.0f64;
        let mut x = -87.0f32;
        while x < 88.0 {
            worst = worst.max(ulps(exp(x), x));
            x += 0.000_37;
        }
        // Inputs near 0, where the polynomial alone carries the result.
        for i in -1000..=1000 {
            let x = i as f32 * 1e-6;
            worst = worst.max(ulps(exp(x), x));
        }
        assert!(worst < 3.0, "worst error {worst} ulp");
        assert_eq!(exp(0.0), 1.0);
    }

    #[test]
    fn clamps_instead_of_overflowing_and_keeps_nan() {
        assert_eq!(exp(1000.0), exp(88.0));
        assert!(exp(88.0).is_finite() && exp(88.0) > 1e38);
        assert_eq!(exp(-1000.0), exp(-87.0));
        assert_eq!(exp(f32::NEG_INFINITY), exp(-87.0));
        let tiny = exp(-1000.0);
        assert!(tiny > 0.0 && tiny.is_normal() && tiny < 1.7e-38, "{tiny}");
        assert!(exp(f32::NAN).is_nan());
    }

    #[test]
    fn silu_built_on_it_stays_finite_at_the_extremes() {
        let silu = |g: f32| g / (1.0 + exp(-g));
        assert_eq!(silu(1e6), 1e6);
        assert!(silu(-1e6).abs() < 1e-30);
        assert!(silu(-1e6) <= 0.0);
        assert_eq!(silu(0.0), 0.0);
    }
}
