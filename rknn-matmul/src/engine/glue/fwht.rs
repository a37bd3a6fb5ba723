//! The block Walsh–Hadamard transform of the input rotation
//! ([`Rotation`](super::super::rotation::Rotation)), written once for every backend: the
//! portable body here, which the x86-64 backend compiles with AVX2 and gives its own block step.

/// Channels per Hadamard block.
pub const HADAMARD_BLOCK: usize = 64;

/// The body of [`Rotation::apply_rows`](super::super::rotation::Rotation::apply_rows) (`x.len()` a multiple of `k`, `signs` one word per
/// whole block of `k`, `mix` blocks × blocks). Inlined always so that the glue's x86-64 backend compiles
/// it with AVX2; Rust never fuses a multiply and an add, so every backend gives the same bits.
#[inline(always)]
pub(crate) fn rotate_rows(signs: &[u64], mix: Option<&[f32]>, k: usize, x: &mut [f32]) {
    rotate_rows_with(signs, mix, k, x, sign_fwht64);
}

/// One block's step: negate the channels whose bit is set in `signs` (the sign bit flipped,
/// which is what multiplying by -1.0 gives for every value but NaN), then [`fwht64`]. A backend
/// may replace it by one that gives the same bits (the same sign flips, butterflies and
/// scaling in another arrangement).
#[inline(always)]
pub(crate) fn sign_fwht64(block: &mut [f32; HADAMARD_BLOCK], signs: u64) {
    for (j, v) in block.iter_mut().enumerate() {
        *v = f32::from_bits(v.to_bits() ^ (((signs >> j) & 1) as u32) << 31);
    }
    fwht64(block);
}

/// [`rotate_rows`] with `block_step` for each whole block (its signs and transform).
#[inline(always)]
pub(crate) fn rotate_rows_with(
    signs: &[u64],
    mix: Option<&[f32]>,
    k: usize,
    x: &mut [f32],
    block_step: impl Fn(&mut [f32; HADAMARD_BLOCK], u64),
) {
    thread_local! {
        static COPY: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    let blocks = signs.len();
    // A copy of the row for the mix, kept per thread (taken out, so the loops below are in
    // this function's body and get its target features).
    let mut copy = match mix {
        Some(_) => COPY.with_borrow_mut(std::mem::take),
        None => Vec::new(),
    };
    for row in x.chunks_exact_mut(k) {
        for (block, &signs) in row.chunks_exact_mut(HADAMARD_BLOCK).zip(signs) {
            let block: &mut [f32; HADAMARD_BLOCK] =
                block.try_into().expect("chunks_exact gives whole blocks");
            block_step(block, signs);
        }
        if let Some(q) = mix {
            mix_blocks(row, q, blocks, &mut copy);
        }
    }
    if mix.is_some() {
        COPY.with_borrow_mut(|c| *c = copy);
    }
}

/// `row[b*64 + j] = Σ_c q[b][c] · row[c*64 + j]` for every position `j` of the `blocks`
/// blocks, as whole-block multiply-adds (which vectorise over the 64 positions) from `copy`.
#[inline(always)]
fn mix_blocks(row: &mut [f32], q: &[f32], blocks: usize, copy: &mut Vec<f32>) {
    let n = blocks * HADAMARD_BLOCK;
    copy.clear();
    copy.extend_from_slice(&row[..n]);
    for (b, out) in row[..n].chunks_exact_mut(HADAMARD_BLOCK).enumerate() {
        // Accumulated in a local array (registers), not through `out` once per source block.
        let mut acc = [0.0f32; HADAMARD_BLOCK];
        for (&a, src) in q[b * blocks..(b + 1) * blocks]
            .iter()
            .zip(copy.chunks_exact(HADAMARD_BLOCK))
        {
            for (o, &v) in acc.iter_mut().zip(src) {
                *o += a * v;
            }
        }
        out.copy_from_slice(&acc);
    }
}

/// The Walsh–Hadamard transform of 64 values, scaled by 1/8 (orthonormal). Each stage's
/// butterflies are independent, so the compiler vectorises the inner loop.
#[inline(always)]
fn fwht64(v: &mut [f32; HADAMARD_BLOCK]) {
    let mut h = 1;
    while h < HADAMARD_BLOCK {
        for base in (0..HADAMARD_BLOCK).step_by(2 * h) {
            for i in base..base + h {
                let (a, b) = (v[i], v[i + h]);
                v[i] = a + b;
                v[i + h] = a - b;
            }
        }
        h *= 2;
    }
    for x in v.iter_mut() {
        *x *= 0.125;
    }
}
