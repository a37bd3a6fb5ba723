//! The ggml tensor element types a GGUF tensor directory can name.

use std::fmt;

/// A ggml tensor element type, with the block geometry that sizes its data.
///
/// Every type llama.cpp defines is listed so that the directory of any file can be read and
/// sized; [`GgmlType::can_dequantize`] says which ones [`super::dequantize`] converts to f32.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[allow(non_camel_case_types)]
#[non_exhaustive]
pub enum GgmlType {
    /// IEEE binary32.
    F32,
    /// IEEE binary16.
    F16,
    /// 32 values: f16 scale, 16 bytes of 4-bit values offset by 8.
    Q4_0,
    /// 32 values: f16 scale and minimum, 16 bytes of 4-bit values.
    Q4_1,
    /// 32 values: f16 scale, 32 high bits, 16 bytes of low nibbles; offset by 16.
    Q5_0,
    /// 32 values: f16 scale and minimum, 32 high bits, 16 bytes of low nibbles.
    Q5_1,
    /// 32 values: f16 scale, 32 signed bytes.
    Q8_0,
    /// 32 values: f16 scale and sum, 32 signed bytes (an activation format).
    Q8_1,
    /// 256-value super-block of 2-bit values with 4-bit scales and minimums.
    Q2_K,
    /// 256-value super-block of 3-bit values with 6-bit signed scales.
    Q3_K,
    /// 256-value super-block of 4-bit values with 6-bit scales and minimums.
    Q4_K,
    /// 256-value super-block of 5-bit values with 6-bit scales and minimums.
    Q5_K,
    /// 256-value super-block of 6-bit values with 8-bit signed scales.
    Q6_K,
    /// 256-value super-block of 8-bit values with an f32 scale (an activation format).
    Q8_K,
    /// Importance-matrix 2-bit codebook format.
    IQ2_XXS,
    /// Importance-matrix 2-bit codebook format.
    IQ2_XS,
    /// Importance-matrix 3-bit codebook format.
    IQ3_XXS,
    /// Importance-matrix 1-bit codebook format.
    IQ1_S,
    /// 4-bit non-linear format, 32-value blocks.
    IQ4_NL,
    /// Importance-matrix 3-bit codebook format.
    IQ3_S,
    /// Importance-matrix 2-bit codebook format.
    IQ2_S,
    /// 4-bit non-linear format, 256-value super-blocks.
    IQ4_XS,
    /// Signed 8-bit integer.
    I8,
    /// Signed 16-bit integer.
    I16,
    /// Signed 32-bit integer.
    I32,
    /// Signed 64-bit integer.
    I64,
    /// IEEE binary64.
    F64,
    /// Importance-matrix 1-bit codebook format.
    IQ1_M,
    /// bfloat16.
    BF16,
    /// Ternary format, 1.6 bits per value.
    TQ1_0,
    /// Ternary format, 2 bits per value.
    TQ2_0,
    /// Microscaling FP4 (E2M1 values, E8M0 scale per 32).
    MXFP4,
}

impl GgmlType {
    /// The type with ggml id `id`, or `None` for an id this crate does not know.
    pub fn from_id(id: u32) -> Option<Self> {
        use GgmlType::*;
        Some(match id {
            0 => F32,
            1 => F16,
            2 => Q4_0,
            3 => Q4_1,
            6 => Q5_0,
            7 => Q5_1,
            8 => Q8_0,
            9 => Q8_1,
            10 => Q2_K,
            11 => Q3_K,
            12 => Q4_K,
            13 => Q5_K,
            14 => Q6_K,
            15 => Q8_K,
            16 => IQ2_XXS,
            17 => IQ2_XS,
            18 => IQ3_XXS,
            19 => IQ1_S,
            20 => IQ4_NL,
            21 => IQ3_S,
            22 => IQ2_S,
            23 => IQ4_XS,
            24 => I8,
            25 => I16,
            26 => I32,
            27 => I64,
            28 => F64,
            29 => IQ1_M,
            30 => BF16,
            34 => TQ1_0,
            35 => TQ2_0,
            39 => MXFP4,
            _ => return None,
        })
    }

    /// The ggml id written in GGUF files.
    pub fn id(self) -> u32 {
        use GgmlType::*;
        match self {
            F32 => 0,
            F16 => 1,
            Q4_0 => 2,
            Q4_1 => 3,
            Q5_0 => 6,
            Q5_1 => 7,
            Q8_0 => 8,
            Q8_1 => 9,
            Q2_K => 10,
            Q3_K => 11,
            Q4_K => 12,
            Q5_K => 13,
            Q6_K => 14,
            Q8_K => 15,
            IQ2_XXS => 16,
            IQ2_XS => 17,
            IQ3_XXS => 18,
            IQ1_S => 19,
            IQ4_NL => 20,
            IQ3_S => 21,
            IQ2_S => 22,
            IQ4_XS => 23,
            I8 => 24,
            I16 => 25,
            I32 => 26,
            I64 => 27,
            F64 => 28,
            IQ1_M => 29,
            BF16 => 30,
            TQ1_0 => 34,
            TQ2_0 => 35,
            MXFP4 => 39,
        }
    }

    /// Values per block (1 for the plain scalar types).
    pub fn block_size(self) -> usize {
        use GgmlType::*;
        match self {
            F32 | F16 | BF16 | F64 | I8 | I16 | I32 | I64 => 1,
            Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q8_0 | Q8_1 | IQ4_NL | MXFP4 => 32,
            Q2_K | Q3_K | Q4_K | Q5_K | Q6_K | Q8_K | IQ2_XXS | IQ2_XS | IQ3_XXS | IQ1_S
            | IQ3_S | IQ2_S | IQ4_XS | IQ1_M | TQ1_0 | TQ2_0 => QK_K,
        }
    }

    /// Bits per value, the block's scales and minimums included (Q4_0 4.5, Q4_1 5.0, Q4_K 4.5,
    /// Q5_0 5.5, Q6_K 6.5625, Q8_0 8.5, F16 16).
    pub fn bits_per_weight(self) -> f64 {
        (self.type_size() * 8) as f64 / self.block_size() as f64
    }

    /// Bytes per block.
    pub fn type_size(self) -> usize {
        use GgmlType::*;
        match self {
            F32 => 4,
            F16 | BF16 => 2,
            F64 => 8,
            I8 => 1,
            I16 => 2,
            I32 => 4,
            I64 => 8,
            Q4_0 => 18,
            Q4_1 => 20,
            Q5_0 => 22,
            Q5_1 => 24,
            Q8_0 => 34,
            Q8_1 => 36,
            Q2_K => 84,
            Q3_K => 110,
            Q4_K => 144,
            Q5_K => 176,
            Q6_K => 210,
            Q8_K => 292,
            IQ2_XXS => 66,
            IQ2_XS => 74,
            IQ3_XXS => 98,
            IQ1_S => 50,
            IQ4_NL => 18,
            IQ3_S => 110,
            IQ2_S => 82,
            IQ4_XS => 136,
            IQ1_M => 56,
            TQ1_0 => 54,
            TQ2_0 => 66,
            MXFP4 => 17,
        }
    }

    /// Whether [`super::dequantize`] converts this type to f32.
    pub fn can_dequantize(self) -> bool {
        use GgmlType::*;
        matches!(
            self,
            F32 | F16 | BF16 | Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q8_0 | Q2_K | Q3_K | Q4_K | Q5_K | Q6_K
        )
    }

    /// The name llama.cpp and the `gguf` package use (`"Q4_K"`, `"F32"`, ...).
    pub fn name(self) -> &'static str {
        use GgmlType::*;
        match self {
            F32 => "F32",
            F16 => "F16",
            Q4_0 => "Q4_0",
            Q4_1 => "Q4_1",
            Q5_0 => "Q5_0",
            Q5_1 => "Q5_1",
            Q8_0 => "Q8_0",
            Q8_1 => "Q8_1",
            Q2_K => "Q2_K",
            Q3_K => "Q3_K",
            Q4_K => "Q4_K",
            Q5_K => "Q5_K",
            Q6_K => "Q6_K",
            Q8_K => "Q8_K",
            IQ2_XXS => "IQ2_XXS",
            IQ2_XS => "IQ2_XS",
            IQ3_XXS => "IQ3_XXS",
            IQ1_S => "IQ1_S",
            IQ4_NL => "IQ4_NL",
            IQ3_S => "IQ3_S",
            IQ2_S => "IQ2_S",
            IQ4_XS => "IQ4_XS",
            I8 => "I8",
            I16 => "I16",
            I32 => "I32",
            I64 => "I64",
            F64 => "F64",
            IQ1_M => "IQ1_M",
            BF16 => "BF16",
            TQ1_0 => "TQ1_0",
            TQ2_0 => "TQ2_0",
            MXFP4 => "MXFP4",
        }
    }

    /// Bytes of `n` values of this type, or `None` when `n` is not a whole number of blocks
    /// or the size overflows.
    pub fn bytes_for(self, n: u64) -> Option<u64> {
        let bs = self.block_size() as u64;
        if !n.is_multiple_of(bs) {
            return None;
        }
        (n / bs).checked_mul(self.type_size() as u64)
    }
}

impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Values per K-quant super-block.
pub const QK_K: usize = 256;
