//! Every block decoder on arbitrary bytes: the first byte picks the type, the rest are its
//! blocks. Whole blocks decode, block by block the same as all at once; lengths that are not
//! whole blocks are typed errors.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rknn_llm::gguf::{GgmlType, GgufError, dequantize};

const TYPES: [GgmlType; 13] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q2_K,
    GgmlType::Q3_K,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
];

fuzz_target!(|data: &[u8]| {
    let Some((&sel, src)) = data.split_first() else {
        return;
    };
    let ty = TYPES[sel as usize % TYPES.len()];
    let (bs, ts) = (ty.block_size(), ty.type_size());
    let blocks = src.len() / ts;
    let mut all = vec![0f32; blocks * bs];
    dequantize(ty, &src[..blocks * ts], &mut all).expect("whole blocks decode");
    let mut one = vec![0f32; bs];
    for (b, chunk) in src.chunks_exact(ts).enumerate() {
        dequantize(ty, chunk, &mut one).expect("one block decodes");
        for (x, y) in one.iter().zip(&all[b * bs..]) {
            assert_eq!(x.to_bits(), y.to_bits(), "{ty} block {b}");
        }
    }
    // Bytes that are not whole blocks, or an output that is not whole blocks, are refused.
    if src.len() % ts != 0 {
        let e = dequantize(ty, src, &mut all).unwrap_err();
        assert!(matches!(e, GgufError::BadLength { .. }), "{e}");
    }
    if bs > 1 {
        let mut short = vec![0f32; bs - 1];
        let e = dequantize(ty, &src[..0], &mut short).unwrap_err();
        assert!(matches!(e, GgufError::BadLength { .. }), "{e}");
    }
});
