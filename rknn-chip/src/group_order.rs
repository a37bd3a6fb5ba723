//! The order of per-group quantisation parameters of B (`rknn_matmul_set_quant_params` with
//! per-group quant type, fact sheet §9): an \[open\] question the SDK keeps as a setting shared
//! by the emulator and the safe layer.
//!
//! The fact sheet infers `[K/G][N]` (the parameter of element (k, n) at `(k / G) · N + n`);
//! nothing public settles it, and the conformance check `quant.per_group_order` asks a board.
//! `RKNN_EMU_GROUP_ORDER=n-major` selects the other reading (`[N][K/G]`).

use std::fmt;
use std::str::FromStr;

/// Environment variable that selects the per-group parameter order: `k-major` or `n-major`.
/// Read by the emulator (in-process and drop-in) and by the safe layer.
pub const GROUP_ORDER_ENV: &str = "RKNN_EMU_GROUP_ORDER";

/// The order of per-group quantisation parameters of B (\[open\], see the module docs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum GroupOrder {
    /// `[K/G][N]`: the parameter of element (k, n) at `(k / G) * N + n` (default).
    #[default]
    KMajor,
    /// `[N][K/G]`: at `n * (K / G) + k / G`.
    NMajor,
}

impl GroupOrder {
    /// The setting's value as written in [`GROUP_ORDER_ENV`]: `k-major` or `n-major`.
    pub const fn name(self) -> &'static str {
        match self {
            GroupOrder::KMajor => "k-major",
            GroupOrder::NMajor => "n-major",
        }
    }

    /// Index of the parameter of group `g` (of `groups` per column) of column `n` (of
    /// `columns`) in this order.
    pub const fn index(self, g: usize, n: usize, groups: usize, columns: usize) -> usize {
        match self {
            GroupOrder::KMajor => g * columns + n,
            GroupOrder::NMajor => n * groups + g,
        }
    }

    /// The setting from [`GROUP_ORDER_ENV`]; the default ([`GroupOrder::KMajor`]) when the
    /// variable is unset or empty.
    pub fn from_env() -> Result<GroupOrder, UnknownGroupOrder> {
        match std::env::var(GROUP_ORDER_ENV) {
            Ok(v) if !v.trim().is_empty() => v.parse(),
            Ok(_) => Ok(GroupOrder::default()),
            Err(std::env::VarError::NotPresent) => Ok(GroupOrder::default()),
            Err(std::env::VarError::NotUnicode(v)) => {
                Err(UnknownGroupOrder(v.to_string_lossy().into_owned()))
            }
        }
    }
}

impl fmt::Display for GroupOrder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A value of the group order setting that is neither `k-major` nor `n-major`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown per-group parameter order {0:?} (set by {GROUP_ORDER_ENV}): expected k-major or n-major"
)]
pub struct UnknownGroupOrder(pub String);

impl FromStr for GroupOrder {
    type Err = UnknownGroupOrder;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "k-major" => Ok(GroupOrder::KMajor),
            "n-major" => Ok(GroupOrder::NMajor),
            _ => Err(UnknownGroupOrder(s.to_string())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_both_orders_and_refuses_others() {
        assert_eq!("k-major".parse(), Ok(GroupOrder::KMajor));
        assert_eq!(" N-Major ".parse(), Ok(GroupOrder::NMajor));
        assert!("row-major".parse::<GroupOrder>().is_err());
    }

    #[test]
    fn indexes_as_the_fact_sheet_says() {
        // 3 groups × 4 columns: (g=2, n=1).
        assert_eq!(GroupOrder::KMajor.index(2, 1, 3, 4), 2 * 4 + 1);
        assert_eq!(GroupOrder::NMajor.index(2, 1, 3, 4), 3 + 2);
    }
}
