//! Dequantization against the PyPI `gguf` package: random blocks of every supported type and
//! the f32 values `gguf.quants.dequantize` gave for them (scripts/fixtures/gen_quant_fixtures.py),
//! compared bit for bit.

mod common;

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

fn fixture(ty: GgmlType) -> (Vec<u8>, Vec<f32>) {
    let dir = common::fixtures().join("quant");
    let name = ty.name().to_lowercase();
    let blocks = std::fs::read(dir.join(format!("{name}.blocks"))).unwrap();
    let expected = std::fs::read(dir.join(format!("{name}.f32")))
        .unwrap()
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    (blocks, expected)
}

#[test]
fn every_type_is_bit_exact_against_gguf_py() {
    for ty in TYPES {
        assert!(ty.can_dequantize(), "{ty}");
        let (blocks, expected) = fixture(ty);
        assert_eq!(expected.len(), 4096, "{ty} fixture");
        let mut got = vec![f32::NAN; expected.len()];
        dequantize(ty, &blocks, &mut got).unwrap();
        let mismatches: Vec<_> = got
            .iter()
            .zip(&expected)
            .enumerate()
            .filter(|(_, (g, e))| g.to_bits() != e.to_bits())
            .take(5)
            .collect();
        assert!(
            mismatches.is_empty(),
            "{ty}: first mismatches (index, (got, expected)): {mismatches:?}"
        );
    }
}

#[test]
fn blocks_decode_independently() {
    // Decoding block by block gives the same values as decoding the run at once.
    for ty in TYPES {
        let (blocks, expected) = fixture(ty);
        let (bs, ts) = (ty.block_size(), ty.type_size());
        let mut got = vec![0.0f32; bs];
        for (i, b) in blocks.chunks_exact(ts).enumerate().step_by(7) {
            dequantize(ty, b, &mut got).unwrap();
            for (g, e) in got.iter().zip(&expected[i * bs..]) {
                assert_eq!(g.to_bits(), e.to_bits(), "{ty} block {i}");
            }
        }
    }
}

#[test]
fn inconsistent_lengths_are_refused() {
    let mut out = vec![0.0f32; 64];
    let err = dequantize(GgmlType::Q4_0, &[0u8; 35], &mut out).unwrap_err();
    assert!(matches!(err, GgufError::BadLength { .. }), "{err}");
    assert!(err.to_string().contains("35 bytes"), "{err}");
    let err = dequantize(GgmlType::Q4_K, &[0u8; 144], &mut out).unwrap_err();
    assert!(err.to_string().contains("not whole blocks of 256"), "{err}");
    let err = dequantize(GgmlType::IQ2_XXS, &[0u8; 66], &mut vec![0.0; 256]).unwrap_err();
    assert!(
        matches!(
            err,
            GgufError::UnsupportedType {
                ty: GgmlType::IQ2_XXS
            }
        ),
        "{err}"
    );
}
