//! Dequantization of ggml block formats to f32.
//!
//! Each decoder follows the block layouts of ggml and performs the same float operations in
//! the same order as the PyPI `gguf` package's `gguf.quants.dequantize` (scale times value,
//! then minus or plus the offset term, each rounded to f32, never fused), so the results are
//! bit-identical to it; `tests/dequant.rs` checks that on random blocks the package decoded.

use half::f16;

use super::error::GgufError;
use super::types::{GgmlType, QK_K};

/// Converts `src`, whole blocks of type `ty`, to the `dst.len()` f32 values they encode.
///
/// `dst.len()` must be a multiple of the block size and `src` exactly the bytes of that many
/// values.
pub fn dequantize(ty: GgmlType, src: &[u8], dst: &mut [f32]) -> Result<(), GgufError> {
    if !ty.can_dequantize() {
        return Err(GgufError::UnsupportedType { ty });
    }
    let (bs, ts) = (ty.block_size(), ty.type_size());
    if !dst.len().is_multiple_of(bs) {
        return Err(GgufError::BadLength {
            ty,
            reason: format!("{} values are not whole blocks of {bs}", dst.len()),
        });
    }
    let blocks = dst.len() / bs;
    if blocks.checked_mul(ts) != Some(src.len()) {
        return Err(GgufError::BadLength {
            ty,
            reason: format!(
                "{} bytes given for {blocks} blocks of {ts} bytes ({} values)",
                src.len(),
                dst.len()
            ),
        });
    }
    let decode: fn(&[u8], &mut [f32]) = match ty {
        GgmlType::F32 => f32_block,
        GgmlType::F16 => f16_block,
        GgmlType::BF16 => bf16_block,
        GgmlType::Q4_0 => q4_0,
        GgmlType::Q4_1 => q4_1,
        GgmlType::Q5_0 => q5_0,
        GgmlType::Q5_1 => q5_1,
        GgmlType::Q8_0 => q8_0,
        GgmlType::Q2_K => q2_k,
        GgmlType::Q3_K => q3_k,
        GgmlType::Q4_K => q4_k,
        GgmlType::Q5_K => q5_k,
        GgmlType::Q6_K => q6_k,
        _ => return Err(GgufError::UnsupportedType { ty }),
    };
    if bs == 1 {
        // Scalar types: decode in one pass rather than one call per value.
        decode(src, dst);
    } else {
        for (s, d) in src.chunks_exact(ts).zip(dst.chunks_exact_mut(bs)) {
            decode(s, d);
        }
    }
    Ok(())
}

/// Bytes of `n` values of `ty`, or `None` when `n` is not whole blocks or does not fit.
pub fn dequantize_row_bytes(ty: GgmlType, n: usize) -> Option<usize> {
    ty.bytes_for(n as u64).and_then(|b| usize::try_from(b).ok())
}

fn half_at(b: &[u8], i: usize) -> f32 {
    f16::from_le_bytes([b[i], b[i + 1]]).to_f32()
}

fn f32_block(src: &[u8], dst: &mut [f32]) {
    for (d, s) in dst.iter_mut().zip(src.chunks_exact(4)) {
        *d = f32::from_le_bytes([s[0], s[1], s[2], s[3]]);
    }
}

fn f16_block(src: &[u8], dst: &mut [f32]) {
    for (d, s) in dst.iter_mut().zip(src.chunks_exact(2)) {
        *d = f16::from_le_bytes([s[0], s[1]]).to_f32();
    }
}

fn bf16_block(src: &[u8], dst: &mut [f32]) {
    // bfloat16 is the top half of an f32: widening is a shift, NaN payloads included.
    for (d, s) in dst.iter_mut().zip(src.chunks_exact(2)) {
        *d = f32::from_bits(u32::from(u16::from_le_bytes([s[0], s[1]])) << 16);
    }
}

/// Q4_0: `d`, then 16 bytes; byte j holds value j (low nibble) and value j+16 (high nibble).
fn q4_0(b: &[u8], y: &mut [f32]) {
    let d = half_at(b, 0);
    for (j, &q) in b[2..18].iter().enumerate() {
        y[j] = d * (i32::from(q & 0xF) - 8) as f32;
        y[j + 16] = d * (i32::from(q >> 4) - 8) as f32;
    }
}

/// Q4_1: `d`, `m`, then nibbles as in Q4_0 without the offset; value = d*q + m.
fn q4_1(b: &[u8], y: &mut [f32]) {
    let (d, m) = (half_at(b, 0), half_at(b, 2));
    for (j, &q) in b[4..20].iter().enumerate() {
        y[j] = d * f32::from(q & 0xF) + m;
        y[j + 16] = d * f32::from(q >> 4) + m;
    }
}

/// The 5-bit values of a Q5 block: low nibbles as in Q4_0, bit j of `qh` is value j's 5th bit.
fn q5_values(qh: u32, qs: &[u8]) -> [u8; 32] {
    let mut v = [0u8; 32];
    for (j, &q) in qs.iter().enumerate() {
        let hi0 = ((qh >> j) & 1) as u8;
        let hi1 = ((qh >> (j + 16)) & 1) as u8;
        v[j] = (q & 0xF) | (hi0 << 4);
        v[j + 16] = (q >> 4) | (hi1 << 4);
    }
    v
}

/// Q5_0: `d`, u32 high bits, 16 bytes of nibbles; value = d*(q - 16).
fn q5_0(b: &[u8], y: &mut [f32]) {
    let d = half_at(b, 0);
    let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
    for (o, &q) in y.iter_mut().zip(q5_values(qh, &b[6..22]).iter()) {
        *o = d * (i32::from(q) - 16) as f32;
    }
}

/// Q5_1: `d`, `m`, u32 high bits, nibbles; value = d*q + m.
fn q5_1(b: &[u8], y: &mut [f32]) {
    let (d, m) = (half_at(b, 0), half_at(b, 2));
    let qh = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
    for (o, &q) in y.iter_mut().zip(q5_values(qh, &b[8..24]).iter()) {
        *o = d * f32::from(q) + m;
    }
}

/// Q8_0: `d`, 32 signed bytes; value = q*d.
fn q8_0(b: &[u8], y: &mut [f32]) {
    let d = half_at(b, 0);
    for (o, &q) in y.iter_mut().zip(b[2..34].iter()) {
        *o = f32::from(q as i8) * d;
    }
}

/// Q2_K: 16 scale bytes (low nibble scale, high nibble minimum, one per 16 values), 64 bytes
/// of 2-bit values, `d`, `dmin`. Values come in two halves of 128: in half h, the crumb at
/// shift 2s of byte l is value 128h + 32s + l.
fn q2_k(b: &[u8], y: &mut [f32]) {
    let (scales, qs) = (&b[0..16], &b[16..80]);
    let (d, dmin) = (half_at(b, 80), half_at(b, 82));
    for (i, out) in y.chunks_exact_mut(16).enumerate() {
        let dl = d * f32::from(scales[i] & 0xF);
        let ml = dmin * f32::from(scales[i] >> 4);
        let (half, shift, l0) = (i / 8, 2 * ((i % 8) / 2), 16 * (i % 2));
        for (l, o) in out.iter_mut().enumerate() {
            let q = (qs[32 * half + l0 + l] >> shift) & 3;
            *o = dl * f32::from(q) - ml;
        }
    }
}

/// Q3_K: 32 bytes of high bits, 64 bytes of 2-bit values (laid out as in Q2_K), 12 bytes of
/// sixteen 6-bit scales, `d`. Value i takes its high bit from bit i/32 of `hmask[i % 32]`; a
/// clear bit subtracts 4.
fn q3_k(b: &[u8], y: &mut [f32]) {
    let (hmask, qs, sc) = (&b[0..32], &b[32..96], &b[96..108]);
    let d = half_at(b, 108);
    for (i, out) in y.chunks_exact_mut(16).enumerate() {
        let low = (sc[i % 8] >> (4 * (i / 8))) & 0xF;
        let high = (sc[8 + i % 4] >> (2 * (i / 4))) & 3;
        let scale = i32::from(low | (high << 4)) - 32;
        let dl = d * scale as f32;
        let (half, shift, l0) = (i / 8, 2 * ((i % 8) / 2), 16 * (i % 2));
        for (l, o) in out.iter_mut().enumerate() {
            let idx = 16 * i + l;
            let lo = i32::from((qs[32 * half + l0 + l] >> shift) & 3);
            let hbit = (hmask[idx % 32] >> (idx / 32)) & 1;
            let q = if hbit == 1 { lo } else { lo - 4 };
            *o = dl * q as f32;
        }
    }
}

/// The eight 6-bit (scale, minimum) pairs of a Q4_K/Q5_K super-block, packed in 12 bytes.
fn k_scale_min(s: &[u8]) -> ([u8; 8], [u8; 8]) {
    let (mut sc, mut mn) = ([0u8; 8], [0u8; 8]);
    for j in 0..4 {
        sc[j] = s[j] & 0x3F;
        mn[j] = s[j + 4] & 0x3F;
        sc[j + 4] = (s[j + 8] & 0xF) | ((s[j] >> 2) & 0x30);
        mn[j + 4] = (s[j + 8] >> 4) | ((s[j + 4] >> 2) & 0x30);
    }
    (sc, mn)
}

/// Q4_K: `d`, `dmin`, 12 scale bytes, 128 bytes of nibbles. Sub-block j of 32 values comes
/// from bytes 32(j/2).. — low nibbles for even j, high for odd; value = d*sc*q - dmin*m.
fn q4_k(b: &[u8], y: &mut [f32]) {
    let (d, dmin) = (half_at(b, 0), half_at(b, 2));
    let (sc, mn) = k_scale_min(&b[4..16]);
    let qs = &b[16..144];
    for (j, out) in y.chunks_exact_mut(32).enumerate() {
        let ds = d * f32::from(sc[j]);
        let dm = dmin * f32::from(mn[j]);
        let shift = 4 * (j % 2);
        for (l, o) in out.iter_mut().enumerate() {
            let q = (qs[32 * (j / 2) + l] >> shift) & 0xF;
            *o = ds * f32::from(q) - dm;
        }
    }
}

/// Q5_K: Q4_K plus 32 bytes of fifth bits: bit j of `qh[l]` belongs to value l of
/// sub-block j.
fn q5_k(b: &[u8], y: &mut [f32]) {
    let (d, dmin) = (half_at(b, 0), half_at(b, 2));
    let (sc, mn) = k_scale_min(&b[4..16]);
    let (qh, qs) = (&b[16..48], &b[48..176]);
    for (j, out) in y.chunks_exact_mut(32).enumerate() {
        let ds = d * f32::from(sc[j]);
        let dm = dmin * f32::from(mn[j]);
        let shift = 4 * (j % 2);
        for (l, o) in out.iter_mut().enumerate() {
            let q = ((qs[32 * (j / 2) + l] >> shift) & 0xF) | (((qh[l] >> j) & 1) << 4);
            *o = ds * f32::from(q) - dm;
        }
    }
}

/// Q6_K: 128 bytes of low nibbles, 64 bytes of 2-bit highs, 16 signed scales, `d`. In half
/// h of 128 values, value 128h + 64n + l (l < 64) has low nibble n of `ql[64h + l]` and the
/// crumb at shift 2((64n + l)/32) of `qh[32h + l % 32]`; value = d*scale*(q - 32).
fn q6_k(b: &[u8], y: &mut [f32]) {
    let (ql, qh, scales) = (&b[0..128], &b[128..192], &b[192..208]);
    let d = half_at(b, 208);
    debug_assert_eq!(y.len(), QK_K);
    for (i, out) in y.chunks_exact_mut(16).enumerate() {
        let ds = d * f32::from(scales[i] as i8);
        for (l, o) in out.iter_mut().enumerate() {
            let idx = 16 * i + l;
            let (h, r) = (idx / 128, idx % 128);
            let (n, k) = (r / 64, r % 64);
            let lo = (ql[64 * h + k] >> (4 * n)) & 0xF;
            let hi = (qh[32 * h + r % 32] >> (2 * (r / 32))) & 3;
            let q = i32::from(lo | (hi << 4)) - 32;
            *o = ds * q as f32;
        }
    }
}
