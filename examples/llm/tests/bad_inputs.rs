//! The bad-input table of the flagship: truncated, corrupted and hostile GGUF files, unknown
//! types, hostile model configurations, broken vocabularies, ids and prompts beyond the
//! vocabulary and the context, invalid UTF-8. Each case asserts the exact typed error (or the
//! documented result) and that nothing panicked; each runs under `catch_unwind`, so the table
//! reports every failure at once. The files are built here, byte by byte.

mod common;

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;

use rknn_llm::gguf::{GgmlType, GgufError, GgufFile};
use rknn_llm::model::{Config, HostF32Factory, Logits, Model, ModelError};
use rknn_llm::tokenizer::{StreamDecoder, Tokenizer, TokenizerError, VocabSpec};

type Case = (&'static str, Box<dyn Fn() -> Result<(), String>>);

macro_rules! expect_err {
    ($e:expr, $pat:pat $(if $guard:expr)?) => {{
        match $e {
            Err($pat) $(if $guard)? => Ok(()),
            other => Err(format!("got {:?}", other.map(|_| "Ok(..)"))),
        }
    }};
}

fn run_table(cases: Vec<Case>) {
    let mut failed = Vec::new();
    for (name, check) in &cases {
        match catch_unwind(AssertUnwindSafe(check)) {
            Ok(Ok(())) => {}
            Ok(Err(why)) => failed.push(format!("{name}: {why}")),
            Err(p) => {
                let msg = p
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                failed.push(format!("{name}: PANICKED {msg}"));
            }
        }
    }
    eprintln!(
        "{} bad-input cases: {} passed, {} failed",
        cases.len(),
        cases.len() - failed.len(),
        failed.len()
    );
    assert!(failed.is_empty(), "\n{}", failed.join("\n"));
}

/// A little-endian GGUF image under construction.
#[derive(Clone)]
struct B(Vec<u8>);

impl B {
    fn new(n_tensors: u64, n_kv: u64) -> B {
        B::version(3, n_tensors, n_kv)
    }
    fn version(v: u32, n_tensors: u64, n_kv: u64) -> B {
        let mut b = B(b"GGUF".to_vec());
        b.u32(v).u64(n_tensors).u64(n_kv);
        b
    }
    fn u8(&mut self, v: u8) -> &mut Self {
        self.0.push(v);
        self
    }
    fn u32(&mut self, v: u32) -> &mut Self {
        self.0.extend(v.to_le_bytes());
        self
    }
    fn u64(&mut self, v: u64) -> &mut Self {
        self.0.extend(v.to_le_bytes());
        self
    }
    fn str(&mut self, s: &str) -> &mut Self {
        self.u64(s.len() as u64);
        self.0.extend(s.as_bytes());
        self
    }
    fn kv_u64(&mut self, k: &str, v: u64) -> &mut Self {
        self.str(k).u32(10).u64(v)
    }
    fn kv_str(&mut self, k: &str, v: &str) -> &mut Self {
        self.str(k).u32(8).str(v)
    }
    fn kv_f32(&mut self, k: &str, v: f32) -> &mut Self {
        self.str(k).u32(6);
        self.0.extend(v.to_le_bytes());
        self
    }
    fn kv_u32s(&mut self, k: &str, v: &[u32]) -> &mut Self {
        self.str(k).u32(9).u32(4).u64(v.len() as u64);
        for &x in v {
            self.u32(x);
        }
        self
    }
    fn kv_bools(&mut self, k: &str, v: &[bool]) -> &mut Self {
        self.str(k).u32(9).u32(7).u64(v.len() as u64);
        for &x in v {
            self.u8(u8::from(x));
        }
        self
    }
    fn tensor(&mut self, name: &str, dims: &[u64], ty: u32, offset: u64) -> &mut Self {
        self.str(name).u32(dims.len() as u32);
        for &d in dims {
            self.u64(d);
        }
        self.u32(ty).u64(offset)
    }
    /// Pads to 32 and appends `n` data bytes.
    fn data(&mut self, n: usize) -> &mut Self {
        let padded = self.0.len().next_multiple_of(32);
        self.0.resize(padded + n, 0x11);
        self
    }
    fn parse(&self) -> Result<GgufFile, GgufError> {
        GgufFile::from_bytes(self.0.clone())
    }
}

/// A qwen35 configuration (width 8, 2 heads, delta-net heads of 4: 2 key and 4 value heads,
/// a kernel of 4; only the embedding's tensor) of `layers` layers whose
/// `qwen35.attention.recurrent_layers` is `recurrent`.
fn qwen35(layers: u64, recurrent: &[bool]) -> B {
    let mut b = config_of("qwen35", 1, 8, 8, layers, 2, None);
    b.kv_u64("qwen35.vocab_size", 4)
        .kv_u64("qwen35.ssm.conv_kernel", 4)
        .kv_u64("qwen35.ssm.state_size", 4)
        .kv_u64("qwen35.ssm.group_count", 2)
        .kv_u64("qwen35.ssm.time_step_rank", 4)
        .kv_u64("qwen35.ssm.inner_size", 16)
        .kv_u32s("qwen35.rope.dimension_sections", &[1, 1, 0, 0])
        .kv_bools("qwen35.attention.recurrent_layers", recurrent);
    b.tensor("token_embd.weight", &[8, 4], 0, 0).data(128);
    b
}

/// A llama configuration (no tensors yet) with these sizes.
fn llama(n_tensors: u64, embd: u64, layers: u64, heads: u64, head_dim: Option<u64>) -> B {
    config_of("llama", n_tensors, 0, embd, layers, heads, head_dim)
}

/// An lfm2 configuration (width 8, 2 heads, vocabulary 4, no tensors yet) of `layers` layers
/// with a kernel of `l_cache` taps and these per-layer KV-head counts.
fn lfm2(l_cache: u64, kv_heads: &[u32], layers: u64) -> B {
    let mut b = config_of("lfm2", 0, 3, 8, layers, 2, None);
    b.kv_u64("lfm2.vocab_size", 4)
        .kv_u64("lfm2.shortconv.l_cache", l_cache)
        .kv_u32s("lfm2.attention.head_count_kv", kv_heads);
    b
}

/// A configuration of architecture `arch` with these sizes, and room for `extra_kv` more keys.
fn config_of(
    arch: &str,
    n_tensors: u64,
    extra_kv: u64,
    embd: u64,
    layers: u64,
    heads: u64,
    head_dim: Option<u64>,
) -> B {
    let mut b = B::new(n_tensors, 7 + u64::from(head_dim.is_some()) + extra_kv);
    b.kv_str("general.architecture", arch)
        .kv_u64(&format!("{arch}.embedding_length"), embd)
        .kv_u64(&format!("{arch}.block_count"), layers)
        .kv_u64(&format!("{arch}.feed_forward_length"), 8)
        .kv_u64(&format!("{arch}.attention.head_count"), heads)
        .kv_u64(&format!("{arch}.context_length"), 16)
        .kv_f32(&format!("{arch}.attention.layer_norm_rms_epsilon"), 1e-5);
    if let Some(d) = head_dim {
        b.kv_u64(&format!("{arch}.attention.key_length"), d);
    }
    b
}

fn pool() -> Arc<rayon::ThreadPool> {
    Arc::new(
        rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build()
            .expect("a pool"),
    )
}

fn load(file: &GgufFile) -> Result<Model, ModelError> {
    let pool = pool();
    Model::load(
        file,
        &mut HostF32Factory::new(pool.clone()),
        pool,
        &mut |_, _| {},
    )
}

fn gguf_cases() -> Vec<Case> {
    vec![
        (
            "empty file",
            Box::new(
                || expect_err!(B(vec![]).parse(), GgufError::BadMagic { ref found } if found.is_empty()),
            ),
        ),
        (
            "GGML magic",
            Box::new(|| expect_err!(B(b"GGMLxxxx".to_vec()).parse(), GgufError::BadMagic { .. })),
        ),
        (
            "version 1 (32-bit counts)",
            Box::new(|| {
                expect_err!(
                    B::version(1, 0, 0).parse(),
                    GgufError::UnsupportedVersion { version: 1, .. }
                )
            }),
        ),
        (
            "a big-endian file",
            Box::new(|| {
                expect_err!(
                    B::version(3u32.swap_bytes(), 0, 0).parse(),
                    GgufError::UnsupportedVersion { hint, .. } if hint.contains("big-endian")
                )
            }),
        ),
        (
            "header cut inside the tensor count",
            Box::new(|| {
                let mut b = B::new(0, 0);
                b.0.truncate(10);
                expect_err!(
                    b.parse(),
                    GgufError::Truncated {
                        offset: 8,
                        needed: 8,
                        remaining: 2,
                        ..
                    }
                )
            }),
        ),
        (
            "2^64 - 1 metadata entries in a 24-byte file",
            Box::new(|| {
                expect_err!(
                    B::new(0, u64::MAX).parse(),
                    GgufError::CountTooLarge {
                        count: u64::MAX,
                        ..
                    }
                )
            }),
        ),
        (
            "a key of 2^63 bytes",
            Box::new(|| {
                let mut b = B::new(0, 1);
                b.u64(1 << 63).u64(0);
                expect_err!(b.parse(), GgufError::Truncated { needed, .. } if needed == 1 << 63)
            }),
        ),
        (
            "metadata type 13",
            Box::new(|| {
                let mut b = B::new(0, 1);
                b.str("k").u32(13);
                expect_err!(b.parse(), GgufError::UnknownValueType { tag: 13, .. })
            }),
        ),
        (
            "a key that is not UTF-8",
            Box::new(|| {
                let mut b = B::new(0, 1);
                b.u64(2).u8(0xC3).u8(0x28).u32(4).u32(0);
                expect_err!(b.parse(), GgufError::InvalidUtf8 { offset: 32, .. })
            }),
        ),
        (
            "a bool byte of 2",
            Box::new(|| {
                let mut b = B::new(0, 1);
                b.str("k").u32(7).u8(2);
                expect_err!(b.parse(), GgufError::InvalidBool { byte: 2, .. })
            }),
        ),
        (
            "arrays nested 100 deep",
            Box::new(|| {
                let mut b = B::new(0, 1);
                b.str("deep").u32(9);
                for _ in 0..100 {
                    b.u32(9).u64(1);
                }
                expect_err!(b.parse(), GgufError::ArrayTooDeep { .. })
            }),
        ),
        (
            "a key twice",
            Box::new(|| {
                let mut b = B::new(0, 2);
                b.kv_u64("k", 1).kv_u64("k", 2);
                expect_err!(b.parse(), GgufError::DuplicateKey { ref key } if key == "k")
            }),
        ),
        (
            "general.alignment 48",
            Box::new(|| {
                let mut b = B::new(0, 1);
                b.kv_u64("general.alignment", 48);
                expect_err!(b.parse(), GgufError::BadAlignment { value: 48 })
            }),
        ),
        (
            "general.alignment as a string",
            Box::new(|| {
                let mut b = B::new(0, 1);
                b.kv_str("general.alignment", "32");
                expect_err!(
                    b.parse(),
                    GgufError::WrongValueType {
                        found: "string",
                        ..
                    }
                )
            }),
        ),
        (
            "tensor type 5 (removed from ggml)",
            Box::new(|| {
                let mut b = B::new(1, 0);
                b.tensor("t", &[32], 5, 0).data(64);
                expect_err!(b.parse(), GgufError::UnknownTensorType { type_id: 5, .. })
            }),
        ),
        (
            "five dimensions",
            Box::new(|| {
                let mut b = B::new(1, 0);
                b.tensor("t", &[1, 1, 1, 1, 1], 0, 0).data(64);
                expect_err!(b.parse(), GgufError::BadShape { ref reason, .. } if reason.contains("5 dimensions"))
            }),
        ),
        (
            "element count overflowing u64",
            Box::new(|| {
                let mut b = B::new(1, 0);
                b.tensor("t", &[1 << 32, 1 << 32], 0, 0).data(64);
                expect_err!(b.parse(), GgufError::BadShape { ref reason, .. } if reason.contains("overflows"))
            }),
        ),
        (
            "a Q4_K row of 100 values (not whole 256-value blocks)",
            Box::new(|| {
                let mut b = B::new(1, 0);
                b.tensor("t", &[100], GgmlType::Q4_K.id(), 0).data(256);
                expect_err!(b.parse(), GgufError::BadShape { ref reason, .. } if reason.contains("block size 256"))
            }),
        ),
        (
            "a tensor offset of 16 with alignment 32",
            Box::new(|| {
                let mut b = B::new(1, 0);
                b.tensor("t", &[4], 0, 16).data(64);
                expect_err!(
                    b.parse(),
                    GgufError::MisalignedTensor {
                        offset: 16,
                        alignment: 32,
                        ..
                    }
                )
            }),
        ),
        (
            "a tensor running past the end of the file",
            Box::new(|| {
                let mut b = B::new(1, 0);
                b.tensor("t", &[64], 0, 0).data(100);
                expect_err!(
                    b.parse(),
                    GgufError::TensorOutOfBounds {
                        size: 256,
                        data_len: 100,
                        ..
                    }
                )
            }),
        ),
        (
            "an empty tensor in a file that ends before its data section",
            Box::new(|| {
                // The directory ends 9 bytes short of the 32-byte boundary; viewing the tensor
                // used to slice past the end of the file.
                let mut b = B::new(1, 0);
                b.tensor("t", &[0], 0, 0);
                expect_err!(
                    b.parse(),
                    GgufError::TensorOutOfBounds {
                        size: 0,
                        data_len: 0,
                        ..
                    }
                )
            }),
        ),
        (
            "a duplicate tensor name",
            Box::new(|| {
                let mut b = B::new(2, 0);
                b.tensor("t", &[4], 0, 0).tensor("t", &[4], 0, 32).data(64);
                expect_err!(b.parse(), GgufError::DuplicateTensor { ref name } if name == "t")
            }),
        ),
        (
            "dequantizing Q8_K (a type without a decoder)",
            Box::new(|| {
                let mut b = B::new(1, 0);
                b.tensor("t", &[256], GgmlType::Q8_K.id(), 0).data(292);
                let f = b.parse().map_err(|e| e.to_string())?;
                let t = f.tensor("t").ok_or("no tensor")?;
                expect_err!(
                    t.to_f32(),
                    GgufError::UnsupportedType { ty: GgmlType::Q8_K }
                )
            }),
        ),
        (
            "rows past the end of a tensor",
            Box::new(|| {
                let mut b = B::new(1, 0);
                b.tensor("t", &[4, 2], 0, 0).data(32);
                let f = b.parse().map_err(|e| e.to_string())?;
                let t = f.tensor("t").ok_or("no tensor")?;
                expect_err!(t.rows_to_f32(2, &mut [0.0; 4]), GgufError::BadLength { .. })
            }),
        ),
    ]
}

/// The fixture `tiny` with the last byte of the first occurrence of `name` (a key or a tensor
/// name) turned into `X`, so that the name is no longer there.
fn renamed(tiny: &str, name: &[u8]) -> Result<GgufFile, String> {
    let mut bytes = std::fs::read(common::fixtures().join(format!("llm/{tiny}.gguf")))
        .map_err(|e| e.to_string())?;
    let at = find(&bytes, name).ok_or("name not in the fixture")?;
    bytes[at + name.len() - 1] = b'X';
    GgufFile::from_bytes(bytes).map_err(|e| e.to_string())
}

/// Where `needle` first occurs in `hay`.
fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// The fixture `tiny` with the first dimension of tensor `name` set to `d` (in the header; the
/// data stays where it was).
fn reshaped(tiny: &str, name: &[u8], d: u64) -> Result<GgufFile, String> {
    let mut bytes = std::fs::read(common::fixtures().join(format!("llm/{tiny}.gguf")))
        .map_err(|e| e.to_string())?;
    // The name, then its u32 dimension count, then the u64 dimensions.
    let at = find(&bytes, name).ok_or("tensor not in the fixture")? + name.len() + 4;
    bytes[at..at + 8].copy_from_slice(&d.to_le_bytes());
    GgufFile::from_bytes(bytes).map_err(|e| e.to_string())
}

/// A `arch` file (width 8, 2 heads, vocabulary 4) whose only tensors are the embedding and
/// `name` (a vector of 8).
fn with_tensor(arch: &str, name: &str) -> Result<GgufFile, String> {
    let mut b = config_of(arch, 2, 0, 8, 1, 2, None);
    b.tensor("token_embd.weight", &[8, 4], 0, 0)
        .tensor(name, &[8], 0, 128)
        .data(160);
    b.parse().map_err(|e| e.to_string())
}

/// tiny-qwen3moe.gguf with the u32 or u64 value of the key ending in `key` set to `v`.
fn patched_moe(key: &[u8], v: u64) -> Result<GgufFile, String> {
    patched("tiny-qwen3moe", key, v)
}

/// The fixture `tiny` with the u32 or u64 value of the key ending in `key` set to `v`.
fn patched(tiny: &str, key: &[u8], v: u64) -> Result<GgufFile, String> {
    patched_keys(tiny, &[(key, v)])
}

/// The fixture `tiny` with the u32 or u64 values of the keys ending in each `key` set to `v`.
fn patched_keys(tiny: &str, keys: &[(&[u8], u64)]) -> Result<GgufFile, String> {
    let mut bytes = std::fs::read(common::fixtures().join(format!("llm/{tiny}.gguf")))
        .map_err(|e| e.to_string())?;
    for &(key, v) in keys {
        let at = find(&bytes, key).ok_or("key not in the fixture")? + key.len();
        let ty = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap());
        match ty {
            4 => bytes[at + 4..at + 8].copy_from_slice(&(v as u32).to_le_bytes()),
            10 => bytes[at + 4..at + 12].copy_from_slice(&v.to_le_bytes()),
            other => return Err(format!("type {other}")),
        }
    }
    GgufFile::from_bytes(bytes).map_err(|e| e.to_string())
}

fn model_cases() -> Vec<Case> {
    let tiny = || {
        GgufFile::open(common::fixtures().join("llm/tiny-llama.gguf"))
            .expect("the tiny-llama fixture")
    };
    vec![
        (
            "no general.architecture",
            Box::new(|| {
                let f = B::new(0, 0).parse().map_err(|e| e.to_string())?;
                expect_err!(load(&f), ModelError::MissingKey { ref key } if key == "general.architecture")
            }),
        ),
        (
            "architecture gpt2",
            Box::new(|| {
                let mut b = B::new(0, 1);
                b.kv_str("general.architecture", "gpt2");
                let f = b.parse().map_err(|e| e.to_string())?;
                expect_err!(
                    load(&f),
                    ModelError::UnsupportedArchitecture { ref arch, ref supported }
                        if arch == "gpt2" && supported == "llama, qwen2, qwen3, gemma3, phi3, smollm3, granite, gemma2, qwen3moe, olmoe, lfm2, granitemoe, lfm2moe, qwen35"
                )
            }),
        ),
        (
            "a gemma3 file without its Q norm",
            Box::new(|| {
                let mut b = config_of("gemma3", 2, 0, 8, 1, 2, Some(4));
                b.tensor("token_embd.weight", &[8, 1], 0, 0)
                    .tensor("blk.0.attn_norm.weight", &[8], 0, 32)
                    .data(64);
                let f = b.parse().map_err(|e| e.to_string())?;
                expect_err!(load(&f), ModelError::MissingTensor { ref name } if name == "blk.0.attn_q_norm.weight")
            }),
        ),
        (
            "a qwen3moe file of 0 experts",
            Box::new(|| {
                let mut b = config_of("qwen3moe", 0, 3, 8, 1, 2, Some(8));
                b.kv_u64("qwen3moe.vocab_size", 4)
                    .kv_u64("qwen3moe.expert_count", 0)
                    .kv_u64("qwen3moe.expert_used_count", 1);
                let f = b.parse().map_err(|e| e.to_string())?;
                expect_err!(load(&f), ModelError::BadKey { ref key, .. } if key == "qwen3moe.expert_count")
            }),
        ),
        (
            "a qwen3moe file of 2^40 experts",
            Box::new(|| {
                let mut b = config_of("qwen3moe", 0, 3, 8, 1, 2, Some(8));
                b.kv_u64("qwen3moe.vocab_size", 4)
                    .kv_u64("qwen3moe.expert_count", 1 << 40)
                    .kv_u64("qwen3moe.expert_used_count", 1);
                let f = b.parse().map_err(|e| e.to_string())?;
                expect_err!(load(&f), ModelError::BadKey { ref key, .. } if key == "qwen3moe.expert_count")
            }),
        ),
        (
            "an olmoe file using more experts than it has",
            Box::new(|| {
                let mut b = config_of("olmoe", 0, 3, 8, 1, 2, Some(8));
                b.kv_u64("olmoe.vocab_size", 4)
                    .kv_u64("olmoe.expert_count", 4)
                    .kv_u64("olmoe.expert_used_count", 5);
                let f = b.parse().map_err(|e| e.to_string())?;
                expect_err!(load(&f), ModelError::BadKey { ref key, .. } if key == "olmoe.expert_used_count")
            }),
        ),
        (
            "an olmoe file using 0 experts",
            Box::new(|| {
                let mut b = config_of("olmoe", 0, 3, 8, 1, 2, Some(8));
                b.kv_u64("olmoe.vocab_size", 4)
                    .kv_u64("olmoe.expert_count", 4)
                    .kv_u64("olmoe.expert_used_count", 0);
                let f = b.parse().map_err(|e| e.to_string())?;
                expect_err!(load(&f), ModelError::BadKey { ref key, .. } if key == "olmoe.expert_used_count")
            }),
        ),
        (
            "a qwen3moe file without its expert count",
            Box::new(|| {
                let mut b = config_of("qwen3moe", 0, 1, 8, 1, 2, Some(8));
                b.kv_u64("qwen3moe.vocab_size", 4);
                let f = b.parse().map_err(|e| e.to_string())?;
                expect_err!(load(&f), ModelError::MissingKey { ref key } if key == "qwen3moe.expert_count")
            }),
        ),
        (
            "a qwen3moe file whose experts are not expert_feed_forward_length wide",
            Box::new(|| {
                let f = patched_moe(b"expert_feed_forward_length", 16)?;
                expect_err!(
                    load(&f),
                    ModelError::BadTensor { ref name, ref expected, ref found, .. }
                        if name == "blk.0.ffn_gate_exps.weight" && expected == &[64, 16, 8] && found == &[64, 32, 8]
                )
            }),
        ),
        (
            "a qwen3moe file of 4 experts whose stacks hold 8",
            Box::new(|| {
                let f = patched_moe(b"qwen3moe.expert_count", 4)?;
                expect_err!(
                    load(&f),
                    ModelError::BadTensor { ref name, .. } if name == "blk.0.ffn_gate_inp.weight"
                )
            }),
        ),
        (
            "a qwen3moe file without its router",
            Box::new(|| {
                let mut bytes = std::fs::read(common::fixtures().join("llm/tiny-qwen3moe.gguf"))
                    .map_err(|e| e.to_string())?;
                let name = b"blk.1.ffn_gate_inp.weight";
                let at = find(&bytes, name).ok_or("no router in the fixture")?;
                bytes[at + name.len() - 8] = b'X';
                let f = GgufFile::from_bytes(bytes).map_err(|e| e.to_string())?;
                expect_err!(load(&f), ModelError::MissingTensor { ref name } if name == "blk.1.ffn_gate_inp.weight")
            }),
        ),
        (
            "a granitemoe file whose shared expert is not expert_shared_feed_forward_length wide",
            Box::new(|| {
                let f = patched("tiny-granitemoe", b"expert_shared_feed_forward_length", 40)?;
                expect_err!(
                    load(&f),
                    ModelError::BadTensor { ref name, ref expected, ref found, .. }
                        if name == "blk.0.ffn_gate_shexp.weight" && expected == &[64, 40] && found == &[64, 48]
                )
            }),
        ),
        (
            "a granitemoe file with shared-expert tensors and a shared width of 0",
            Box::new(|| {
                let f = patched("tiny-granitemoe", b"expert_shared_feed_forward_length", 0)?;
                expect_err!(
                    load(&f),
                    ModelError::Unsupported { ref what }
                        if what.contains("blk.0.ffn_gate_shexp.weight")
                            && what.contains("granitemoe.expert_shared_feed_forward_length")
                )
            }),
        ),
        (
            "a granitemoe file without a shared expert's down matrix",
            Box::new(|| {
                let f = renamed("tiny-granitemoe", b"blk.1.ffn_down_shexp.weight")?;
                expect_err!(load(&f), ModelError::MissingTensor { ref name } if name == "blk.1.ffn_down_shexp.weight")
            }),
        ),
        (
            "a granitemoe file without its logit scale",
            Box::new(|| {
                let f = renamed("tiny-granitemoe", b"granitemoe.logit_scale")?;
                expect_err!(load(&f), ModelError::MissingKey { ref key } if key == "granitemoe.logit_scale")
            }),
        ),
        (
            "a granitemoe file without its expert count",
            Box::new(|| {
                let f = renamed("tiny-granitemoe", b"granitemoe.expert_count")?;
                expect_err!(load(&f), ModelError::MissingKey { ref key } if key == "granitemoe.expert_count")
            }),
        ),
        (
            "an lfm2moe file without a layer's selection bias",
            Box::new(|| {
                let f = renamed("tiny-lfm2moe", b"blk.2.exp_probs_b.bias")?;
                expect_err!(load(&f), ModelError::MissingTensor { ref name } if name == "blk.2.exp_probs_b.bias")
            }),
        ),
        (
            "an lfm2moe file without its gating function",
            Box::new(|| {
                let f = renamed("tiny-lfm2moe", b"lfm2moe.expert_gating_func")?;
                expect_err!(load(&f), ModelError::MissingKey { ref key } if key == "lfm2moe.expert_gating_func")
            }),
        ),
        (
            "an lfm2moe file of gating function 0 (none)",
            Box::new(|| {
                let f = patched("tiny-lfm2moe", b"expert_gating_func", 0)?;
                expect_err!(load(&f), ModelError::BadKey { ref key, .. } if key == "lfm2moe.expert_gating_func")
            }),
        ),
        (
            "an lfm2moe file of gating function 4 (sqrt_softplus, not run here)",
            Box::new(|| {
                let f = patched("tiny-lfm2moe", b"expert_gating_func", 4)?;
                expect_err!(load(&f), ModelError::Unsupported { ref what } if what.contains("lfm2moe.expert_gating_func 4"))
            }),
        ),
        (
            "an lfm2moe file of more leading dense layers than layers",
            Box::new(|| {
                let f = patched("tiny-lfm2moe", b"leading_dense_block_count", 5)?;
                expect_err!(load(&f), ModelError::BadKey { ref key, .. } if key == "lfm2moe.leading_dense_block_count")
            }),
        ),
        (
            "an lfm2moe file whose second layer is said dense but holds experts",
            Box::new(|| {
                let f = patched("tiny-lfm2moe", b"leading_dense_block_count", 2)?;
                expect_err!(load(&f), ModelError::MissingTensor { ref name } if name == "blk.1.ffn_gate.weight")
            }),
        ),
        (
            "an lfm2moe file whose experts are not expert_feed_forward_length wide",
            Box::new(|| {
                let f = patched("tiny-lfm2moe", b"expert_feed_forward_length", 16)?;
                expect_err!(
                    load(&f),
                    ModelError::BadTensor { ref name, ref expected, ref found, .. }
                        if name == "blk.1.ffn_gate_exps.weight" && expected == &[64, 16, 8] && found == &[64, 32, 8]
                )
            }),
        ),
        (
            "an lfm2moe file of more experts than its router has rows",
            Box::new(|| {
                let f = patched("tiny-lfm2moe", b"lfm2moe.expert_count", 9)?;
                expect_err!(
                    load(&f),
                    ModelError::BadTensor { ref name, ref expected, .. }
                        if name == "blk.1.ffn_gate_inp.weight" && expected == &[64, 9]
                )
            }),
        ),
        (
            "an lfm2moe file without its expert width",
            Box::new(|| {
                let f = renamed("tiny-lfm2moe", b"lfm2moe.expert_feed_forward_length")?;
                expect_err!(load(&f), ModelError::MissingKey { ref key } if key == "lfm2moe.expert_feed_forward_length")
            }),
        ),
        (
            "an lfm2moe file whose per-layer expert widths differ on a mixture layer",
            Box::new(|| {
                // Three layers need three tensors (the block count is checked against them).
                let mut b = config_of("lfm2moe", 3, 5, 8, 3, 2, None);
                b.kv_u64("lfm2moe.vocab_size", 4)
                    .kv_u64("lfm2moe.shortconv.l_cache", 3)
                    .kv_u32s("lfm2moe.attention.head_count_kv", &[0, 2, 0])
                    .kv_u64("lfm2moe.leading_dense_block_count", 1)
                    .kv_u32s("lfm2moe.expert_feed_forward_length", &[8, 8, 4]);
                for (i, name) in ["a", "b", "c"].iter().enumerate() {
                    b.tensor(name, &[8], 0, 32 * i as u64);
                }
                b.data(96);
                let f = b.parse().map_err(|e| e.to_string())?;
                expect_err!(
                    load(&f),
                    ModelError::BadKey { ref key, ref reason }
                        if key == "lfm2moe.expert_feed_forward_length" && reason.contains("layer 2")
                )
            }),
        ),
        (
            "a llama attention-output bias of the wrong length",
            Box::new(|| {
                let f = reshaped("tiny-llama-bias", b"blk.1.attn_output.bias", 47)?;
                expect_err!(
                    load(&f),
                    ModelError::BadTensor { ref name, ref expected, ref found, .. }
                        if name == "blk.1.attn_output.bias" && expected == &[48] && found == &[47]
                )
            }),
        ),
        (
            "qwen35 files each without one of its delta-net keys",
            Box::new(|| {
                for key in [
                    "conv_kernel",
                    "state_size",
                    "group_count",
                    "time_step_rank",
                    "inner_size",
                ] {
                    let name = format!("qwen35.ssm.{key}");
                    let f = renamed("tiny-qwen35", name.as_bytes())?;
                    expect_err!(load(&f), ModelError::MissingKey { ref key } if *key == name)?;
                }
                let f = renamed("tiny-qwen35", b"qwen35.rope.dimension_sections")?;
                expect_err!(load(&f), ModelError::MissingKey { ref key } if key == "qwen35.rope.dimension_sections")
            }),
        ),
        (
            "qwen35 convolution kernels of 0 and of 17 taps",
            Box::new(|| {
                for taps in [0, 17] {
                    let f = patched("tiny-qwen35", b"ssm.conv_kernel", taps)?;
                    expect_err!(load(&f), ModelError::BadKey { ref key, .. } if key == "qwen35.ssm.conv_kernel")?;
                }
                Ok(())
            }),
        ),
        (
            "a qwen35 file of 3 value heads over 2 key heads",
            Box::new(|| {
                let f = patched("tiny-qwen35", b"ssm.time_step_rank", 3)?;
                expect_err!(load(&f), ModelError::BadKey { ref key, ref reason } if key == "qwen35.ssm.time_step_rank" && reason.contains("multiple"))
            }),
        ),
        (
            "a qwen35 file whose inner size is not its value heads' width",
            Box::new(|| {
                let f = patched("tiny-qwen35", b"ssm.inner_size", 60)?;
                expect_err!(load(&f), ModelError::BadKey { ref key, .. } if key == "qwen35.ssm.inner_size")
            }),
        ),
        (
            "a qwen35 file whose kernel key says 3 taps where ssm_conv1d holds 4",
            Box::new(|| {
                let f = patched("tiny-qwen35", b"ssm.conv_kernel", 3)?;
                expect_err!(
                    load(&f),
                    ModelError::BadTensor { ref name, ref expected, ref found, .. }
                        if name == "blk.0.ssm_conv1d.weight" && expected == &[3, 128] && found == &[4, 128]
                )
            }),
        ),
        (
            "a llama feed-forward up bias of the wrong length",
            Box::new(|| {
                let f = reshaped("tiny-llama-bias", b"blk.0.ffn_up.bias", 95)?;
                expect_err!(
                    load(&f),
                    ModelError::BadTensor { ref name, ref expected, .. }
                        if name == "blk.0.ffn_up.bias" && expected == &[96]
                )
            }),
        ),
        (
            "a qwen35 file whose value heads (8 of 16, inner size 128) the delta-net tensors do not have",
            Box::new(|| {
                // The inner size follows the value heads: the tensors' shapes are what differs.
                let f = patched_keys(
                    "tiny-qwen35",
                    &[(b"ssm.time_step_rank", 8), (b"ssm.inner_size", 128)],
                )?;
                expect_err!(
                    load(&f),
                    ModelError::BadTensor { ref name, .. } if name == "blk.0.attn_qkv.weight"
                )
            }),
        ),
        (
            "an attention-output bias in a qwen2 file (whose graph has none)",
            Box::new(|| {
                let f = with_tensor("qwen2", "blk.0.attn_output.bias")?;
                expect_err!(
                    load(&f),
                    ModelError::Unsupported { ref what } if what.contains("\"blk.0.attn_output.bias\"")
                )
            }),
        ),
        (
            "a feed-forward down bias in a gemma3 file",
            Box::new(|| {
                let f = with_tensor("gemma3", "blk.0.ffn_down.bias")?;
                expect_err!(
                    load(&f),
                    ModelError::Unsupported { ref what } if what.contains("\"blk.0.ffn_down.bias\"")
                )
            }),
        ),
        (
            "a fused QKV bias in a llama file",
            Box::new(|| {
                let f = with_tensor("llama", "blk.0.attn_qkv.bias")?;
                expect_err!(
                    load(&f),
                    ModelError::Unsupported { ref what } if what.contains("\"blk.0.attn_qkv.bias\"")
                )
            }),
        ),
        (
            "a qwen35 file without blk.0.ssm_dt.bias",
            Box::new(|| {
                let f = renamed("tiny-qwen35", b"blk.0.ssm_dt.bias")?;
                expect_err!(load(&f), ModelError::MissingTensor { ref name } if name == "blk.0.ssm_dt.bias")
            }),
        ),
        (
            "a qwen35 full-attention interval of 0",
            Box::new(|| {
                let f = patched("tiny-qwen35", b"full_attention_interval", 0)?;
                expect_err!(load(&f), ModelError::BadKey { ref key, .. } if key == "qwen35.full_attention_interval")
            }),
        ),
        (
            "a qwen35 recurrent-layers array of 2 entries for 1 layer",
            Box::new(|| {
                let f = qwen35(1, &[true, false])
                    .parse()
                    .map_err(|e| e.to_string())?;
                expect_err!(load(&f), ModelError::BadKey { ref key, ref reason } if key == "qwen35.attention.recurrent_layers" && reason.contains("2 entries for 1 layers"))
            }),
        ),
        (
            "a qwen35 file of 1 layer with a recurrent-layers array of 1 (its first missing tensor)",
            Box::new(|| {
                let f = qwen35(1, &[true]).parse().map_err(|e| e.to_string())?;
                expect_err!(load(&f), ModelError::MissingTensor { ref name } if name == "blk.0.attn_norm.weight")
            }),
        ),
        (
            "a phi3 file with LongRoPE factors and no original context length",
            Box::new(|| {
                let mut b = config_of("phi3", 1, 1, 8, 1, 2, None);
                b.kv_u64("phi3.vocab_size", 4)
                    .tensor("rope_factors_long.weight", &[2], 0, 0)
                    .data(32);
                let f = b.parse().map_err(|e| e.to_string())?;
                expect_err!(
                    load(&f),
                    ModelError::MissingKey { ref key } if key == "phi3.rope.scaling.original_context_length"
                )
            }),
        ),
        (
            "a phi3 file whose LongRoPE factors are not n_rot / 2 long",
            Box::new(|| {
                // Heads of 4: 2 factors expected.
                let mut b = config_of("phi3", 2, 2, 8, 1, 2, None);
                b.kv_u64("phi3.vocab_size", 4)
                    .kv_u64("phi3.rope.scaling.original_context_length", 8)
                    .tensor("rope_factors_long.weight", &[2], 0, 0)
                    .tensor("rope_factors_short.weight", &[3], 0, 0)
                    .data(32);
                let f = b.parse().map_err(|e| e.to_string())?;
                expect_err!(
                    load(&f),
                    ModelError::BadTensor { ref name, ref expected, .. } if name == "rope_factors_short.weight" && expected == &[2]
                )
            }),
        ),
        (
            "a phi3 file with a NaN LongRoPE factor",
            Box::new(|| {
                let mut b = config_of("phi3", 1, 2, 8, 1, 2, None);
                b.kv_u64("phi3.vocab_size", 4)
                    .kv_u64("phi3.rope.scaling.original_context_length", 8)
                    .tensor("rope_factors_long.weight", &[2], 0, 0)
                    .data(0)
                    .u32(0x3f80_0000)
                    .u32(0x7fc0_0000);
                let f = b.parse().map_err(|e| e.to_string())?;
                expect_err!(
                    load(&f),
                    ModelError::BadTensorData { ref name, ref reason } if name == "rope_factors_long.weight" && reason.contains("factor 1 is NaN")
                )
            }),
        ),
        (
            "a phi3 file rotating an odd number of dimensions, or more than the head",
            Box::new(|| {
                for n_rot in [3, 6] {
                    let mut b = config_of("phi3", 0, 2, 8, 1, 2, None);
                    b.kv_u64("phi3.vocab_size", 4)
                        .kv_u64("phi3.rope.dimension_count", n_rot);
                    let f = b.parse().map_err(|e| e.to_string())?;
                    expect_err!(
                        load(&f),
                        ModelError::BadKey { ref key, .. } if key == "phi3.rope.dimension_count"
                    )?;
                }
                Ok(())
            }),
        ),
        (
            "a qwen3 file rotating part of each head",
            Box::new(|| {
                let mut b = config_of("qwen3", 0, 2, 8, 1, 2, Some(4));
                b.kv_u64("qwen3.rope.dimension_count", 2)
                    .kv_u64("qwen3.vocab_size", 4);
                let f = b.parse().map_err(|e| e.to_string())?;
                expect_err!(load(&f), ModelError::Unsupported { ref what } if what.contains("2 of 4 dimensions"))
            }),
        ),
        (
            "a gemma3 sliding-window pattern of the wrong length",
            Box::new(|| {
                let mut b = config_of("gemma3", 0, 3, 8, 3, 2, Some(4));
                b.kv_u64("gemma3.attention.sliding_window", 4)
                    .kv_u64("gemma3.vocab_size", 4);
                b.str("gemma3.attention.sliding_window_pattern")
                    .u32(9)
                    .u32(7)
                    .u64(2)
                    .0
                    .extend([1u8, 0]);
                let f = b.parse().map_err(|e| e.to_string())?;
                expect_err!(
                    load(&f),
                    ModelError::BadKey { ref key, ref reason }
                        if key == "gemma3.attention.sliding_window_pattern" && reason == "2 entries for 3 layers"
                )
            }),
        ),
        (
            "a context size beyond the trained one",
            Box::new(move || {
                let mut m = load(&tiny()).map_err(|e| e.to_string())?;
                let trained = m.config().n_ctx;
                expect_err!(
                    m.set_context(trained + 1),
                    ModelError::ContextTooLarge { asked, trained: t } if asked == trained + 1 && t == trained
                )
            }),
        ),
        (
            "embedding_length as a string",
            Box::new(|| {
                let mut b = B::new(0, 2);
                b.kv_str("general.architecture", "llama")
                    .kv_str("llama.embedding_length", "64");
                let f = b.parse().map_err(|e| e.to_string())?;
                expect_err!(load(&f), ModelError::BadKey { ref key, .. } if key == "llama.embedding_length")
            }),
        ),
        (
            "2^40 heads of 2^40 dimensions (Q width overflows)",
            Box::new(|| {
                let mut b = llama(1, 1 << 40, 1, 1 << 40, Some(1 << 40));
                b.tensor("token_embd.weight", &[1 << 40, 0], 0, 0).data(32);
                let f = b.parse().map_err(|e| e.to_string())?;
                expect_err!(load(&f), ModelError::BadKey { ref key, .. } if key == "llama.attention.head_count")
            }),
        ),
        (
            "2^40 layers in a 300-byte file",
            Box::new(|| {
                let mut b = llama(1, 8, 1 << 40, 2, None);
                b.tensor("token_embd.weight", &[8, 1], 0, 0).data(32);
                let f = b.parse().map_err(|e| e.to_string())?;
                expect_err!(load(&f), ModelError::MissingTensor { ref name } if name == "blk.0.attn_norm.weight")
            }),
        ),
        (
            "a granite file without its logit scale",
            Box::new(|| {
                let mut b = config_of("granite", 0, 1, 8, 1, 2, None);
                b.kv_u64("granite.vocab_size", 4);
                let f = b.parse().map_err(|e| e.to_string())?;
                expect_err!(load(&f), ModelError::MissingKey { ref key } if key == "granite.logit_scale")
            }),
        ),
        (
            "a granite logit scale of 0",
            Box::new(|| {
                let mut b = config_of("granite", 0, 2, 8, 1, 2, None);
                b.kv_u64("granite.vocab_size", 4)
                    .kv_f32("granite.logit_scale", 0.0);
                let f = b.parse().map_err(|e| e.to_string())?;
                expect_err!(load(&f), ModelError::BadKey { ref key, .. } if key == "granite.logit_scale")
            }),
        ),
        (
            "a granite residual scale of infinity",
            Box::new(|| {
                let mut b = config_of("granite", 0, 3, 8, 1, 2, None);
                b.kv_u64("granite.vocab_size", 4)
                    .kv_f32("granite.logit_scale", 8.0)
                    .kv_f32("granite.residual_scale", f32::INFINITY);
                let f = b.parse().map_err(|e| e.to_string())?;
                expect_err!(load(&f), ModelError::BadKey { ref key, .. } if key == "granite.residual_scale")
            }),
        ),
        (
            "a granite embedding scale as a string",
            Box::new(|| {
                let mut b = config_of("granite", 0, 3, 8, 1, 2, None);
                b.kv_u64("granite.vocab_size", 4)
                    .kv_f32("granite.logit_scale", 8.0)
                    .kv_str("granite.embedding_scale", "12");
                let f = b.parse().map_err(|e| e.to_string())?;
                expect_err!(load(&f), ModelError::BadKey { ref key, .. } if key == "granite.embedding_scale")
            }),
        ),
        (
            "a granite RoPE switch as an integer",
            Box::new(|| {
                let mut b = config_of("granite", 0, 3, 8, 1, 2, None);
                b.kv_u64("granite.vocab_size", 4)
                    .kv_f32("granite.logit_scale", 8.0)
                    .kv_u64("granite.rope.scaling.finetuned", 0);
                let f = b.parse().map_err(|e| e.to_string())?;
                expect_err!(load(&f), ModelError::BadKey { ref key, .. } if key == "granite.rope.scaling.finetuned")
            }),
        ),
        (
            "granite's RoPE switch: false leaves every layer unrotated, true or absent none",
            Box::new(|| {
                for switch in [Some(false), Some(true), None] {
                    let mut b =
                        config_of("granite", 0, 2 + u64::from(switch.is_some()), 8, 5, 2, None);
                    b.kv_u64("granite.vocab_size", 4)
                        .kv_f32("granite.logit_scale", 8.0);
                    if let Some(on) = switch {
                        b.str("granite.rope.scaling.finetuned")
                            .u32(7)
                            .u8(u8::from(on));
                    }
                    let f = b.parse().map_err(|e| e.to_string())?;
                    let c = Config::from_gguf(&f).map_err(|e| e.to_string())?;
                    let rotating: Vec<bool> = (0..5).map(|l| c.rotates(l)).collect();
                    if rotating != [switch != Some(false); 5] {
                        return Err(format!("switch {switch:?}: layers rotating {rotating:?}"));
                    }
                }
                Ok(())
            }),
        ),
        (
            "a granite file with a bias on the attention output",
            Box::new(|| {
                let mut b = config_of("granite", 1, 2, 8, 1, 2, None);
                b.kv_u64("granite.vocab_size", 4)
                    .kv_f32("granite.logit_scale", 8.0)
                    .tensor("blk.0.attn_output.bias", &[8], 0, 0)
                    .data(32);
                let f = b.parse().map_err(|e| e.to_string())?;
                expect_err!(
                    load(&f),
                    ModelError::Unsupported { ref what } if what.contains("blk.0.attn_output.bias")
                )
            }),
        ),
        (
            "a gemma2 attention soft-cap of 0",
            Box::new(|| {
                let mut b = config_of("gemma2", 0, 2, 8, 1, 2, None);
                b.kv_u64("gemma2.vocab_size", 4)
                    .kv_f32("gemma2.attn_logit_softcapping", 0.0);
                let f = b.parse().map_err(|e| e.to_string())?;
                expect_err!(load(&f), ModelError::BadKey { ref key, .. } if key == "gemma2.attn_logit_softcapping")
            }),
        ),
        (
            "a negative gemma2 final soft-cap",
            Box::new(|| {
                let mut b = config_of("gemma2", 0, 2, 8, 1, 2, None);
                b.kv_u64("gemma2.vocab_size", 4)
                    .kv_f32("gemma2.final_logit_softcapping", -30.0);
                let f = b.parse().map_err(|e| e.to_string())?;
                expect_err!(load(&f), ModelError::BadKey { ref key, .. } if key == "gemma2.final_logit_softcapping")
            }),
        ),
        (
            "a gemma2 sliding window of 0",
            Box::new(|| {
                let mut b = config_of("gemma2", 0, 2, 8, 1, 2, None);
                b.kv_u64("gemma2.vocab_size", 4)
                    .kv_u64("gemma2.attention.sliding_window", 0);
                let f = b.parse().map_err(|e| e.to_string())?;
                expect_err!(load(&f), ModelError::BadKey { ref key, .. } if key == "gemma2.attention.sliding_window")
            }),
        ),
        (
            "a gemma2 file with an output matrix",
            Box::new(|| {
                let mut b = config_of("gemma2", 1, 1, 8, 1, 2, None);
                b.kv_u64("gemma2.vocab_size", 4)
                    .tensor("output.weight", &[8, 4], 0, 0)
                    .data(128);
                let f = b.parse().map_err(|e| e.to_string())?;
                expect_err!(
                    load(&f),
                    ModelError::Unsupported { ref what } if what.contains("output.weight")
                )
            }),
        ),
        (
            "a gemma2 file of 2^40 layers in 300 bytes (one local-layer flag each)",
            Box::new(|| {
                let mut b = config_of("gemma2", 1, 0, 8, 1 << 40, 2, None);
                b.tensor("token_embd.weight", &[8, 1], 0, 0).data(32);
                let f = b.parse().map_err(|e| e.to_string())?;
                expect_err!(load(&f), ModelError::BadKey { ref key, .. } if key == "gemma2.block_count")
            }),
        ),
        (
            "a smollm3 file of 2^40 layers in 300 bytes",
            Box::new(|| {
                let mut b = config_of("smollm3", 1, 0, 8, 1 << 40, 2, None);
                b.tensor("token_embd.weight", &[8, 1], 0, 0).data(32);
                let f = b.parse().map_err(|e| e.to_string())?;
                expect_err!(load(&f), ModelError::MissingTensor { ref name } if name == "blk.0.attn_norm.weight")
            }),
        ),
        (
            "an lfm2 kernel of 0 taps",
            Box::new(|| {
                let f = lfm2(0, &[0], 1).parse().map_err(|e| e.to_string())?;
                expect_err!(load(&f), ModelError::BadKey { ref key, .. } if key == "lfm2.shortconv.l_cache")
            }),
        ),
        (
            "an lfm2 kernel of 17 taps",
            Box::new(|| {
                let f = lfm2(17, &[0], 1).parse().map_err(|e| e.to_string())?;
                expect_err!(load(&f), ModelError::BadKey { ref key, .. } if key == "lfm2.shortconv.l_cache")
            }),
        ),
        (
            "an lfm2 KV-head array of 3 entries for 2 layers",
            Box::new(|| {
                let f = lfm2(3, &[0, 2, 0], 2).parse().map_err(|e| e.to_string())?;
                expect_err!(load(&f), ModelError::BadKey { ref key, ref reason } if key == "lfm2.attention.head_count_kv" && reason.contains("3 entries for 2 layers"))
            }),
        ),
        (
            "an lfm2 file of 2^40 layers in 300 bytes",
            Box::new(|| {
                let mut b = config_of("lfm2", 1, 1, 8, 1 << 40, 2, None);
                b.kv_u64("lfm2.shortconv.l_cache", 3);
                b.tensor("token_embd.weight", &[8, 1], 0, 0).data(32);
                let f = b.parse().map_err(|e| e.to_string())?;
                expect_err!(load(&f), ModelError::BadKey { ref key, .. } if key == "lfm2.block_count")
            }),
        ),
        (
            "an lfm2 conv kernel stored [n_embd, l_cache] (GGUF dims) instead of [l_cache, n_embd]",
            Box::new(|| {
                let mut b = lfm2(3, &[0], 1);
                b.0[8..16].copy_from_slice(&4u64.to_le_bytes());
                b.tensor("token_embd.weight", &[8, 4], 0, 0)
                    .tensor("blk.0.attn_norm.weight", &[8], 0, 128)
                    .tensor("blk.0.shortconv.in_proj.weight", &[8, 24], 0, 160)
                    .tensor("blk.0.shortconv.conv.weight", &[8, 3], 0, 928)
                    .data(1024);
                let f = b.parse().map_err(|e| e.to_string())?;
                expect_err!(
                    load(&f),
                    ModelError::BadTensor { ref name, ref expected, ref found, .. }
                        if name == "blk.0.shortconv.conv.weight" && expected == &[3, 8] && found == &[8, 3]
                )
            }),
        ),
        (
            "a KV-head count of 0 on a llama layer",
            Box::new(|| {
                let mut b = config_of("llama", 1, 1, 8, 1, 2, None);
                b.kv_u32s("llama.attention.head_count_kv", &[0]);
                b.tensor("token_embd.weight", &[8, 1], 0, 0).data(32);
                let f = b.parse().map_err(|e| e.to_string())?;
                expect_err!(load(&f), ModelError::BadKey { ref key, ref reason } if key == "llama.attention.head_count_kv" && reason.contains("layer 0"))
            }),
        ),
        (
            "3 KV heads for 4 query heads",
            Box::new(|| {
                let mut b = llama(0, 8, 1, 4, None);
                b.0[16..24].copy_from_slice(&8u64.to_le_bytes());
                b.kv_u64("llama.attention.head_count_kv", 3);
                let f = b.parse().map_err(|e| e.to_string())?;
                expect_err!(load(&f), ModelError::BadKey { ref key, .. } if key == "llama.attention.head_count_kv")
            }),
        ),
        (
            "an embedding of the wrong shape",
            Box::new(|| {
                let mut b = llama(1, 8, 1, 2, None);
                b.0[16..24].copy_from_slice(&8u64.to_le_bytes());
                b.kv_u64("llama.vocab_size", 4);
                b.tensor("token_embd.weight", &[8, 3], 0, 0).data(96);
                let f = b.parse().map_err(|e| e.to_string())?;
                expect_err!(
                    load(&f),
                    ModelError::BadTensor { ref name, ref expected, ref found, .. }
                        if name == "token_embd.weight" && expected == &[8, 4] && found == &[8, 3]
                )
            }),
        ),
        (
            "a prompt one token beyond the context",
            Box::new(move || {
                let f = tiny();
                let mut m = common::Run::new(load(&f).map_err(|e| e.to_string())?);
                let n_ctx = m.config().n_ctx;
                let tokens = vec![1u32; n_ctx + 1];
                expect_err!(
                    m.forward(&tokens, 0, Logits::Last),
                    ModelError::ContextOverflow { pos: 0, n_tokens, n_ctx: c } if n_tokens == n_ctx + 1 && c == n_ctx
                )
            }),
        ),
        (
            "a position past the cache",
            Box::new(move || {
                let f = tiny();
                let mut m = common::Run::new(load(&f).map_err(|e| e.to_string())?);
                m.forward(&[1, 2], 0, Logits::None)
                    .map_err(|e| e.to_string())?;
                expect_err!(
                    m.forward(&[3], 5, Logits::Last),
                    ModelError::BadPosition { pos: 5, cached: 2 }
                )
            }),
        ),
        (
            "a token id outside the vocabulary",
            Box::new(move || {
                let f = tiny();
                let mut m = common::Run::new(load(&f).map_err(|e| e.to_string())?);
                let n = m.config().n_vocab;
                expect_err!(
                    m.forward(&[1, n as u32], 0, Logits::Last),
                    ModelError::BadToken { token, n_vocab } if token as usize == n && n_vocab == n
                )
            }),
        ),
    ]
}

fn spec(model: &str, pre: Option<&str>, tokens: &[&str], merges: Option<&[&str]>) -> VocabSpec {
    VocabSpec {
        model: model.into(),
        pre: pre.map(Into::into),
        tokens: tokens.iter().map(|t| t.to_string()).collect(),
        merges: merges.map(|m| m.iter().map(|t| t.to_string()).collect()),
        ..VocabSpec::default()
    }
}

fn tokenizer_cases() -> Vec<Case> {
    let tiny = || {
        let f = GgufFile::open(common::fixtures().join("llm/tiny-qwen2.gguf"))
            .expect("the tiny-qwen2 fixture");
        Tokenizer::from_gguf(&f).expect("its vocabulary")
    };
    vec![
        (
            "an empty vocabulary",
            Box::new(|| {
                expect_err!(
                    Tokenizer::from_spec(spec("gpt2", None, &[], Some(&[]))),
                    TokenizerError::EmptyVocab
                )
            }),
        ),
        (
            "tokenizer model bert",
            Box::new(|| {
                expect_err!(
                    Tokenizer::from_spec(spec("bert", None, &["a"], None)),
                    TokenizerError::UnsupportedModel { ref model } if model == "bert"
                )
            }),
        ),
        (
            "pre-tokenizer chatglm-bpe",
            Box::new(|| {
                expect_err!(
                    Tokenizer::from_spec(spec("gpt2", Some("chatglm-bpe"), &["a"], Some(&[]))),
                    TokenizerError::UnsupportedPreTokenizer { ref pre } if pre == "chatglm-bpe"
                )
            }),
        ),
        (
            "a BPE vocabulary without merges",
            Box::new(|| {
                expect_err!(
                    Tokenizer::from_spec(spec("gpt2", None, &["a"], None)),
                    TokenizerError::MissingMerges
                )
            }),
        ),
        (
            "the same token text twice",
            Box::new(|| {
                expect_err!(
                    Tokenizer::from_spec(spec("llama", None, &["a", "b", "a"], None)),
                    TokenizerError::DuplicateToken {
                        first: 0,
                        second: 2,
                        ..
                    }
                )
            }),
        ),
        (
            "scores shorter than the tokens",
            Box::new(|| {
                let mut s = spec("llama", None, &["a", "b", "c"], None);
                s.scores = Some(vec![0.0; 2]);
                expect_err!(
                    Tokenizer::from_spec(s),
                    TokenizerError::ArrayTooShort {
                        len: 2,
                        n_tokens: 3,
                        ..
                    }
                )
            }),
        ),
        (
            "detokenizing an id past the vocabulary",
            Box::new(move || {
                let t = tiny();
                let n = t.n_vocab() as u32;
                expect_err!(
                    t.detokenize(&[1, n], false, false),
                    TokenizerError::IdOutOfRange { id, n_vocab } if id == n && n_vocab == n as usize
                )
            }),
        ),
        (
            "streaming an id past the vocabulary",
            Box::new(move || {
                let t = tiny();
                let n = t.n_vocab() as u32;
                expect_err!(
                    StreamDecoder::new(&t).push(n + 7),
                    TokenizerError::IdOutOfRange { .. }
                )
            }),
        ),
        (
            "a stream ending inside a UTF-8 character gives U+FFFD",
            Box::new(move || {
                let t = tiny();
                // "é" is two bytes; its first byte alone is the byte symbol 0xC3.
                let ids = t.encode("é", false, false).map_err(|e| e.to_string())?;
                let first = t
                    .token_id(&char::from_u32(0xC3).ok_or("char")?.to_string())
                    .ok_or("no byte token for 0xC3")?;
                let mut s = StreamDecoder::new(&t);
                let held = s.push(first).map_err(|e| e.to_string())?;
                let end = s.finish();
                (ids.len() <= 2 && held.is_empty() && end == "\u{FFFD}")
                    .then_some(())
                    .ok_or(format!("{ids:?} {held:?} {end:?}"))
            }),
        ),
        (
            "llm-decode: a prompt file that is not UTF-8",
            Box::new(|| {
                let dir = std::env::temp_dir().join(format!("rknpu-bad-{}", std::process::id()));
                std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
                let bad = dir.join("latin1.txt");
                std::fs::write(&bad, b"caf\xe9\n").map_err(|e| e.to_string())?;
                let model = common::fixtures().join("llm/tiny-qwen2.gguf");
                let out = common::llm_decode()
                    .arg("-m")
                    .arg(&model)
                    .arg("-f")
                    .arg(&bad)
                    .arg("--tokenize")
                    .output()
                    .map_err(|e| e.to_string())?;
                let _ = std::fs::remove_dir_all(&dir);
                let err = String::from_utf8_lossy(&out.stderr);
                (out.status.code() == Some(1)
                    && err.lines().count() == 1
                    && err.contains("cannot read prompt file")
                    && err.contains("UTF-8"))
                .then_some(())
                .ok_or(format!("{:?} {err}", out.status))
            }),
        ),
    ]
}

#[test]
fn every_bad_input_is_a_typed_error_or_its_documented_result() {
    let mut cases = gguf_cases();
    cases.extend(model_cases());
    cases.extend(tokenizer_cases());
    run_table(cases);
}
