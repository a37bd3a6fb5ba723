//! Malformed, truncated and hostile files built in memory: each gives its typed error, never a
//! panic or an allocation the file's size does not justify.

use super::*;

/// A little-endian GGUF image under construction.
#[derive(Default)]
struct B(Vec<u8>);

impl B {
    fn header(version: u32, n_tensors: u64, n_kv: u64) -> Self {
        let mut b = B(b"GGUF".to_vec());
        b.u32(version).u64(n_tensors).u64(n_kv);
        b
    }
    fn u8(&mut self, v: u8) -> &mut Self {
        self.0.push(v);
        self
    }
    fn u32(&mut self, v: u32) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn u64(&mut self, v: u64) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn str(&mut self, s: &str) -> &mut Self {
        self.u64(s.len() as u64);
        self.0.extend_from_slice(s.as_bytes());
        self
    }
    fn kv_u32(&mut self, key: &str, v: u32) -> &mut Self {
        self.str(key).u32(4).u32(v)
    }
    /// A tensor directory entry.
    fn tensor(&mut self, name: &str, dims: &[u64], ty: u32, offset: u64) -> &mut Self {
        self.str(name).u32(dims.len() as u32);
        for &d in dims {
            self.u64(d);
        }
        self.u32(ty).u64(offset)
    }
    /// Pads to `align` and appends `n` data bytes.
    fn data(&mut self, align: usize, n: usize) -> &mut Self {
        let padded = self.0.len().next_multiple_of(align);
        self.0.resize(padded + n, 0x5A);
        self
    }
    fn parse(&self) -> Result<GgufFile, GgufError> {
        GgufFile::from_bytes(self.0.clone())
    }
}

fn err(b: &B) -> GgufError {
    match b.parse() {
        Ok(f) => panic!("parsed a malformed file: {f:?}"),
        Err(e) => e,
    }
}

/// A valid file with one Q4_0 tensor of 2 rows of 64 (4 blocks, 72 bytes) and one F32 vector.
fn valid() -> B {
    let mut b = B::header(3, 2, 1);
    b.kv_u32("general.alignment", 32)
        .tensor("w", &[64, 2], 2, 0)
        .tensor("v", &[3], 0, 160)
        .data(32, 160 + 12);
    b
}

#[test]
fn the_valid_file_parses() {
    let f = valid().parse().unwrap();
    assert_eq!(f.tensor("w").unwrap().data().len(), 72);
    assert_eq!(f.tensor("v").unwrap().data().len(), 12);
    assert_eq!(f.tensor("w").unwrap().row_bytes(), 36);
}

#[test]
fn bad_magic_and_versions() {
    assert!(matches!(err(&B(vec![])), GgufError::BadMagic { .. }));
    assert!(matches!(
        err(&B(b"GGU".to_vec())),
        GgufError::BadMagic { .. }
    ));
    let e = err(&B(b"GGML\x03\0\0\0".to_vec()));
    assert!(e.to_string().contains("not a GGUF file"), "{e}");
    let e = err(&B::header(1, 0, 0));
    assert!(
        matches!(e, GgufError::UnsupportedVersion { version: 1, .. }),
        "{e}"
    );
    let e = err(&B::header(3u32.swap_bytes(), 0, 0));
    assert!(e.to_string().contains("big-endian"), "{e}");
    let e = err(&B(b"GGUF\x03\0".to_vec()));
    assert!(matches!(e, GgufError::Truncated { .. }), "{e}");
}

#[test]
fn every_truncation_of_a_valid_file_is_an_error() {
    let full = valid().0;
    for len in 0..full.len() {
        let e = match GgufFile::from_bytes(full[..len].to_vec()) {
            Ok(_) => panic!("a file truncated to {len} bytes parsed"),
            Err(e) => e,
        };
        // Whatever was cut, the message is one line naming the problem.
        assert!(!e.to_string().contains('\n'), "{e}");
    }
}

#[test]
fn every_truncation_of_the_gguf_py_fixture_is_an_error() {
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/gguf/all_types.gguf");
    let full = std::fs::read(path).unwrap();
    let f = GgufFile::from_bytes(full.clone()).unwrap();
    // The writer pads the last tensor too; cutting only padding leaves a valid file.
    let end = f
        .tensor_infos()
        .iter()
        .map(|t| f.data_offset() + t.offset() + t.n_bytes())
        .max()
        .unwrap() as usize;
    assert!(GgufFile::from_bytes(full[..end].to_vec()).is_ok());
    for len in 0..end {
        assert!(
            GgufFile::from_bytes(full[..len].to_vec()).is_err(),
            "truncated to {len} bytes"
        );
    }
}

#[test]
fn random_corruption_never_panics() {
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/gguf/all_types.gguf");
    let full = std::fs::read(path).unwrap();
    let mut rng = fastrand::Rng::with_seed(8);
    for _ in 0..20_000 {
        let mut bytes = full.clone();
        // A few bytes of the header or directory, where structure lives.
        let limit = 1344.min(bytes.len());
        for _ in 0..rng.usize(1..4) {
            let i = rng.usize(..limit);
            bytes[i] = if rng.bool() { rng.u8(..) } else { 0xFF };
        }
        if let Ok(f) = GgufFile::from_bytes(bytes) {
            // Whatever parsed must be safe to use.
            for t in f.tensors() {
                if t.ty().can_dequantize() {
                    let _ = t.to_f32();
                }
            }
        }
    }
}

#[test]
fn absurd_counts_are_refused_before_allocating() {
    let e = err(&B::header(3, 0, u64::MAX));
    assert!(
        matches!(
            e,
            GgufError::CountTooLarge {
                count: u64::MAX,
                ..
            }
        ),
        "{e}"
    );
    let e = err(&B::header(3, u64::MAX / 2, 0));
    assert!(e.to_string().contains("tensors: count"), "{e}");
    // An array claiming 2^40 u32 elements in a file of a few bytes.
    let mut b = B::header(3, 0, 1);
    b.str("a").u32(9).u32(4).u64(1 << 40).u32(0);
    let e = err(&b);
    assert!(matches!(e, GgufError::CountTooLarge { .. }), "{e}");
    assert!(e.to_string().contains("elements of \"a\""), "{e}");
    // Strings of an array: each needs at least its 8-byte length.
    let mut b = B::header(3, 0, 1);
    b.str("s").u32(9).u32(8).u64(1000);
    b.0.extend_from_slice(&[0; 100]);
    assert!(matches!(err(&b), GgufError::CountTooLarge { .. }));
    // Count times minimum size overflows u64.
    let mut b = B::header(3, 0, 1);
    b.str("o").u32(9).u32(10).u64(u64::MAX / 4);
    assert!(matches!(err(&b), GgufError::CountTooLarge { .. }));
}

#[test]
fn absurd_string_lengths_are_truncation() {
    let mut b = B::header(3, 0, 1);
    b.u64(u64::MAX).u32(4).u32(0);
    let e = err(&b);
    assert!(
        matches!(
            e,
            GgufError::Truncated {
                needed: u64::MAX,
                ..
            }
        ),
        "{e}"
    );
    let mut b = B::header(3, 0, 1);
    b.str("k").u32(8).u64(1 << 50);
    let e = err(&b);
    assert!(e.to_string().contains("reading k"), "{e}");
}

#[test]
fn unknown_and_invalid_values() {
    let mut b = B::header(3, 0, 1);
    b.str("k").u32(13).u32(0);
    let e = err(&b);
    assert!(
        matches!(e, GgufError::UnknownValueType { tag: 13, .. }),
        "{e}"
    );
    let mut b = B::header(3, 0, 1);
    b.str("k").u32(9).u32(77).u64(0);
    assert!(matches!(
        err(&b),
        GgufError::UnknownValueType { tag: 77, .. }
    ));
    let mut b = B::header(3, 0, 1);
    b.str("k").u32(7).u8(2);
    assert!(matches!(err(&b), GgufError::InvalidBool { byte: 2, .. }));
    let mut b = B::header(3, 0, 1);
    b.u64(2).u8(0xC3).u8(0x28).u32(4).u32(0);
    assert!(matches!(err(&b), GgufError::InvalidUtf8 { .. }));
    let mut b = B::header(3, 0, 1);
    b.str("k").u32(8).u64(1).u8(0xFF);
    let e = err(&b);
    assert!(e.to_string().contains("k: string"), "{e}");
}

#[test]
fn deep_array_nesting_is_refused() {
    let mut b = B::header(3, 0, 1);
    b.str("deep").u32(9);
    for _ in 0..100 {
        b.u32(9).u64(1);
    }
    b.u32(4).u64(0);
    let e = err(&b);
    assert!(matches!(e, GgufError::ArrayTooDeep { .. }), "{e}");
    // Nesting within the limit is fine.
    let mut b = B::header(3, 0, 1);
    b.str("ok").u32(9).u32(9).u64(2);
    b.u32(4).u64(1).u32(7);
    b.u32(4).u64(0);
    let f = b.parse().unwrap();
    let a = f.metadata().get("ok").unwrap().as_array().unwrap();
    assert_eq!(a.as_arrays().unwrap()[0].as_u32s(), Some(&[7u32][..]));
}

#[test]
fn duplicates_are_refused() {
    let mut b = B::header(3, 0, 2);
    b.kv_u32("k", 1).kv_u32("k", 2);
    assert!(matches!(err(&b), GgufError::DuplicateKey { key } if key == "k"));
    let mut b = B::header(3, 2, 0);
    b.tensor("t", &[4], 0, 0)
        .tensor("t", &[4], 0, 32)
        .data(32, 64);
    assert!(matches!(err(&b), GgufError::DuplicateTensor { name } if name == "t"));
}

#[test]
fn alignment_rules() {
    for bad in [0u32, 3, 48] {
        let mut b = B::header(3, 0, 1);
        b.kv_u32("general.alignment", bad);
        let e = err(&b);
        assert!(
            matches!(e, GgufError::BadAlignment { value } if value == u64::from(bad)),
            "{e}"
        );
    }
    let mut b = B::header(3, 0, 1);
    b.str("general.alignment").u32(8).str("32");
    assert!(matches!(err(&b), GgufError::WrongValueType { .. }));
    // A custom alignment moves the data section and binds tensor offsets.
    let mut b = B::header(3, 1, 1);
    b.kv_u32("general.alignment", 256)
        .tensor("t", &[4], 0, 0)
        .data(256, 16);
    let f = b.parse().unwrap();
    assert_eq!(f.data_offset() % 256, 0);
    let mut b = B::header(3, 1, 1);
    b.kv_u32("general.alignment", 64)
        .tensor("t", &[4], 0, 32)
        .data(64, 64);
    let e = err(&b);
    assert!(
        matches!(
            e,
            GgufError::MisalignedTensor {
                offset: 32,
                alignment: 64,
                ..
            }
        ),
        "{e}"
    );
}

#[test]
fn tensor_shape_rules() {
    let one = |dims: &[u64], ty: u32| {
        let mut b = B::header(3, 1, 0);
        b.tensor("t", dims, ty, 0).data(32, 64);
        b
    };
    let e = err(&one(&[1, 1, 1, 1, 1], 0));
    assert!(e.to_string().contains("5 dimensions"), "{e}");
    let e = err(&one(&[1 << 32, 1 << 32], 0));
    assert!(e.to_string().contains("overflows"), "{e}");
    let e = err(&one(&[u64::MAX], 0));
    assert!(e.to_string().contains("beyond int64"), "{e}");
    let e = err(&one(&[48], 2));
    assert!(
        e.to_string()
            .contains("not a multiple of the Q4_0 block size 32"),
        "{e}"
    );
    let e = err(&one(&[16], 5));
    assert!(
        matches!(e, GgufError::UnknownTensorType { type_id: 5, .. }),
        "{e}"
    );
    // Bytes past the end of the data section, and an offset whose end overflows.
    let e = err(&one(&[32], 0));
    assert!(
        matches!(
            e,
            GgufError::TensorOutOfBounds {
                size: 128,
                data_len: 64,
                ..
            }
        ),
        "{e}"
    );
    let mut b = B::header(3, 1, 0);
    b.tensor("t", &[4], 0, u64::MAX - 31).data(32, 64);
    assert!(matches!(err(&b), GgufError::TensorOutOfBounds { .. }));
    // An empty tensor is fine.
    one(&[0, 7], 0).parse().unwrap();
}

#[test]
fn vocab_only_file_without_data_section() {
    let mut b = B::header(3, 0, 1);
    b.str("tokenizer.ggml.model").u32(8).str("gpt2");
    let f = b.parse().unwrap();
    assert_eq!(f.metadata().get_str("tokenizer.ggml.model"), Some("gpt2"));
    assert_eq!(f.tensors().count(), 0);
}

#[test]
fn dropping_metadata_arrays_keeps_every_other_entry_and_the_tensors() {
    // Keys in file order: a string array and a u32 array under the prefix, a string and a u32
    // under it (scalars stay), an array outside it.
    let mut b = B::header(3, 1, 6);
    b.str("tokenizer.ggml.tokens")
        .u32(9)
        .u32(8)
        .u64(2)
        .str("a")
        .str("b");
    b.str("tokenizer.ggml.model").u32(8).str("gpt2");
    b.str("other.list").u32(9).u32(4).u64(1).u32(5);
    b.str("tokenizer.ggml.token_type")
        .u32(9)
        .u32(4)
        .u64(2)
        .u32(1)
        .u32(1);
    b.kv_u32("tokenizer.ggml.bos_token_id", 7);
    b.kv_u32("general.alignment", 32);
    b.tensor("v", &[3], 0, 0).data(32, 12);
    let mut f = b.parse().unwrap();
    let header = f.header_bytes().to_vec();
    assert_eq!(f.drop_metadata_arrays("tokenizer."), 2);
    let m = f.metadata();
    let keys: Vec<&str> = m.iter().map(|(k, _)| k).collect();
    assert_eq!(
        keys,
        [
            "tokenizer.ggml.model",
            "other.list",
            "tokenizer.ggml.bos_token_id",
            "general.alignment"
        ]
    );
    // The index follows the moved entries.
    assert!(m.get("tokenizer.ggml.tokens").is_none());
    assert_eq!(m.get_str("tokenizer.ggml.model"), Some("gpt2"));
    assert_eq!(
        m.get("tokenizer.ggml.bos_token_id").unwrap().as_u32(),
        Some(7)
    );
    let list = m.get("other.list").unwrap().as_array().unwrap();
    assert_eq!(list.as_u32s(), Some(&[5u32][..]));
    assert_eq!(f.header_bytes(), header.as_slice());
    assert_eq!(f.tensor("v").unwrap().data().len(), 12);
    assert_eq!(f.drop_metadata_arrays("tokenizer."), 0);
}

#[test]
fn released_pages_of_a_mapped_file_read_back_the_same_bytes() {
    // A file of several pages, so that the releases cover whole pages of the mapping.
    let mut b = B::header(3, 1, 1);
    b.kv_u32("general.alignment", 32);
    b.tensor("w", &[64, 512], 0, 0).data(32, 64 * 512 * 4);
    let path = std::env::temp_dir().join(format!("rknn-llm-release-{}.gguf", std::process::id()));
    std::fs::write(&path, &b.0).unwrap();
    let f = GgufFile::open(&path).unwrap();
    let (header, data) = (
        f.header_bytes().to_vec(),
        f.tensor("w").unwrap().data().to_vec(),
    );
    f.release_header();
    f.release_data();
    f.tensor("w").unwrap().release_rows(3, 100);
    let same = f.header_bytes() == header.as_slice() && f.tensor("w").unwrap().data() == data;
    drop(f);
    std::fs::remove_file(&path).unwrap();
    assert!(same, "a released page read back different bytes");
    assert_eq!(data.len(), 64 * 512 * 4);
    assert!(data.iter().all(|&x| x == 0x5A));
}
