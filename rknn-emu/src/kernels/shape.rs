//! The shapes the kernels take, and their checks: shared by the dispatch in `kernels/mod.rs`
//! and by every backend.

/// The operands of [`gemm_i8_native_b`](super::gemm_i8_native_b): A row-major with a row
/// stride, B in the NPU's native int8 layout, C row-major `[m, n]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NativeBShape {
    /// Rows of A and C.
    pub m: usize,
    /// Columns of B and C; a multiple of `sn`.
    pub n: usize,
    /// The shared dimension; a multiple of [`NATIVE_B_SK`].
    pub k: usize,
    /// Columns per native tile of B (`Tiles::b_n` of the chip: 32 on RK3588 and RK3576, 16 on
    /// the others); one of 8, 16, 24 or 32.
    pub sn: usize,
    /// Row stride of A, at least `k` (A may be a column block of a wider matrix).
    pub lda: usize,
}

/// K per native tile of int8 B on every chip (`Tiles::b_k`).
pub const NATIVE_B_SK: usize = 32;

/// The most rows of A for which [`gemm_i8_native_b`](super::gemm_i8_native_b) streams B once
/// for all rows; above, it runs register tiles over B in place. Measured on the development
/// machine (Zen 4, VNNI, prompt forwards of the demo model on two emulated cores): the
/// streaming kernel is ahead at M = 4, 8 and 16 (503, 609, 728 tok/s against 347, 521, 680 with
/// the tiles) and level at 32 (877 against 858).
pub const NATIVE_B_STREAM_MAX_M: usize = 32;

impl NativeBShape {
    /// Panics unless the shape is one the kernel takes and the slices hold it.
    pub(super) fn check(&self, a_len: usize, b_len: usize, c_len: usize) {
        let NativeBShape { m, n, k, sn, lda } = *self;
        assert!(
            matches!(sn, 8 | 16 | 24 | 32) && n % sn == 0 && k % NATIVE_B_SK == 0 && lda >= k,
            "gemm_i8_native_b: unsupported shape {self:?} (sn in 8, 16, 24, 32; n % sn == 0; \
             k % 32 == 0; lda >= k)"
        );
        let a_need = match m {
            0 => 0,
            m => (m - 1)
                .checked_mul(lda)
                .and_then(|x| x.checked_add(k))
                .expect("gemm_i8_native_b: A size overflows usize"),
        };
        let b_need = n
            .checked_mul(k)
            .expect("gemm_i8_native_b: B size overflows usize");
        let c_need = m
            .checked_mul(n)
            .expect("gemm_i8_native_b: C size overflows usize");
        assert!(
            a_len >= a_need && b_len >= b_need && c_len >= c_need,
            "gemm_i8_native_b: slices too short for {self:?}: A has {a_len} (needs {a_need}), \
             B has {b_len} (needs {b_need}), C has {c_len} (needs {c_need})"
        );
    }
}

/// Panics unless the slices hold the `[M, K]`, `[N, K]` and `[M, N]` matrices.
pub(super) fn check_shapes(
    a_len: usize,
    bt_len: usize,
    c_len: usize,
    m: usize,
    n: usize,
    k: usize,
) {
    let size = |r: usize, c: usize, what: &str| {
        r.checked_mul(c)
            .unwrap_or_else(|| panic!("gemm: {what} size {r} x {c} overflows usize"))
    };
    let (a_need, bt_need, c_need) = (size(m, k, "A"), size(n, k, "Bt"), size(m, n, "C"));
    assert!(
        a_len >= a_need && bt_len >= bt_need && c_len >= c_need,
        "gemm: slices too short for M={m} N={n} K={k}: A has {a_len} (needs {a_need}), \
         Bt has {bt_len} (needs {bt_need}), C has {c_len} (needs {c_need})"
    );
}
