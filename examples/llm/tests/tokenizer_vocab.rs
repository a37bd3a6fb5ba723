//! llama.cpp's own tokenizer test data: every `.inp` string of each `ggml-vocab-*.gguf` whose
//! vocabulary this crate supports must give the ids of the matching `.out` line (tokenized as
//! llama.cpp's test-tokenizer-0 does: no BOS/EOS, special tokens not parsed).
//!
//! The files come from `scripts/llama-cpp.sh --vocab-only` (into
//! `${RKNPU_CACHE:-~/.cache/rknpu-rs}/llama.cpp/vocab`).

use std::path::{Path, PathBuf};

use rknn_llm::tokenizer::Tokenizer;

mod common;

/// The vocabularies with test data this crate supports, and the pre-tokenizer each declares.
const SUPPORTED: &[&str] = &[
    "llama-spm",
    "phi-3",
    "gpt-2",
    "llama-bpe",
    "qwen2",
    "qwen35",
    "starcoder",
    "refact",
    "command-r",
    "falcon",
    "mpt",
    "deepseek-llm",
    "deepseek-coder",
    "gemma-4",
];

fn vocab_dir() -> PathBuf {
    let cache = std::env::var_os("RKNPU_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/rknpu-rs")
        });
    cache.join("llama.cpp/vocab")
}

fn load(path: &Path) -> Tokenizer {
    let file = rknn_llm::gguf::GgufFile::open(path).expect("read GGUF");
    Tokenizer::from_gguf(&file).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Parses a `.inp` / `.out` pair the way llama.cpp's test-tokenizer-0 does.
fn read_tests(inp: &Path, out: &Path) -> Vec<(String, Vec<u32>)> {
    const SEP: &str = "\n__ggml_vocab_test__\n";
    let raw = std::fs::read_to_string(inp).expect("read .inp");
    let mut inputs = Vec::new();
    let mut pos = 0;
    while pos < raw.len() {
        match raw[pos..].find(SEP) {
            Some(i) => {
                inputs.push(raw[pos..pos + i].to_owned());
                pos += i + SEP.len();
            }
            None => {
                inputs.push(raw[pos..].to_owned());
                break;
            }
        }
    }
    let outputs: Vec<Vec<u32>> = std::fs::read_to_string(out)
        .expect("read .out")
        .lines()
        .map(|l| {
            l.split_whitespace()
                .map(|t| t.parse().expect("id in .out"))
                .collect()
        })
        .collect();
    assert_eq!(
        inputs.len(),
        outputs.len(),
        "{}: .inp and .out disagree",
        inp.display()
    );
    inputs.into_iter().zip(outputs).collect()
}

fn run_vocab(name: &str) -> Option<(usize, usize)> {
    let dir = vocab_dir();
    let gguf = common::require(
        dir.join(format!("ggml-vocab-{name}.gguf")),
        "scripts/llama-cpp.sh --vocab-only",
    )?;
    let tok = load(&gguf);
    let tests = read_tests(
        &gguf.with_extension("gguf.inp"),
        &gguf.with_extension("gguf.out"),
    );
    let mut failures = Vec::new();
    for (text, want) in &tests {
        let got = tok
            .encode(text, false, false)
            .unwrap_or_else(|e| panic!("{name}: {text:?}: {e}"));
        if &got != want {
            failures.push(format!("  {text:?}\n    want {want:?}\n    got  {got:?}"));
        }
    }
    random_strings_encode(name, &tok);
    check_specials(name, &tok);
    let passed = tests.len() - failures.len();
    eprintln!(
        "ggml-vocab-{name}: {passed}/{} lines equal to llama.cpp",
        tests.len()
    );
    assert!(
        failures.is_empty(),
        "ggml-vocab-{name}:\n{}",
        failures.join("\n")
    );
    Some((passed, tests.len()))
}

/// The special ids and end-of-generation set equal what llama.cpp reports loading the file
/// (`tests/fixtures/tokenizer/specials.json`, from `llama-tokenize -v`).
fn check_specials(name: &str, tok: &Tokenizer) {
    let path = common::fixtures().join("tokenizer/specials.json");
    let all: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).expect("specials.json")).expect("JSON");
    let info = &all[name];
    assert!(info.is_object(), "{name} missing from specials.json");
    let want = |key: &str| info.get(key).and_then(|v| v.as_u64()).map(|v| v as u32);
    let s = tok.special_ids();
    for (key, ours) in [
        ("bos", s.bos),
        ("eos", s.eos),
        ("eot", s.eot),
        ("eom", s.eom),
        ("unk", s.unk),
        ("sep", s.sep),
        ("pad", s.pad),
        ("mask", s.mask),
        ("fim_pre", s.fim_pre),
        ("fim_suf", s.fim_suf),
        ("fim_mid", s.fim_mid),
        ("fim_pad", s.fim_pad),
        ("fim_rep", s.fim_rep),
        ("fim_sep", s.fim_sep),
    ] {
        assert_eq!(ours, want(key), "{name}: {key}");
    }
    let eog: Vec<u32> = info["eog"]
        .as_array()
        .expect("eog")
        .iter()
        .map(|v| v.as_u64().expect("id") as u32)
        .collect();
    assert_eq!(tok.eog_ids(), eog, "{name}: end-of-generation set");
}

/// Arbitrary strings (any scalar value, plus white space, marks and special-token pieces)
/// tokenize without error into ids inside the vocabulary, in every mode.
fn random_strings_encode(name: &str, tok: &Tokenizer) {
    let mut rng = fastrand::Rng::with_seed(11);
    let pool: Vec<char> =
        " \n\t\r\u{a0}\u{3000}\u{85}\u{2028}aZ09'<|>_/s\u{301}é你🦙\u{fffd}\u{feff}▁"
            .chars()
            .collect();
    for _ in 0..300 {
        let len = rng.usize(0..48);
        let text: String = (0..len)
            .map(|_| {
                if rng.bool() {
                    char::from_u32(rng.u32(0..0x11_0000)).unwrap_or('x')
                } else {
                    pool[rng.usize(0..pool.len())]
                }
            })
            .collect();
        for (add, parse) in [(false, false), (true, true)] {
            let ids = tok
                .encode(&text, add, parse)
                .unwrap_or_else(|e| panic!("{name}: {text:?}: {e}"));
            assert!(
                ids.iter().all(|&id| (id as usize) < tok.n_vocab()),
                "{name}: {text:?}"
            );
        }
    }
}

macro_rules! vocab_tests {
    ($($fn:ident => $name:literal),* $(,)?) => {
        $(
            #[test]
            fn $fn() {
                run_vocab($name);
            }
        )*
        /// Every entry of SUPPORTED has its test.
        #[test]
        fn every_supported_vocab_is_tested() {
            let mut tested = vec![$($name),*];
            let mut listed = SUPPORTED.to_vec();
            tested.sort_unstable();
            listed.sort_unstable();
            assert_eq!(tested, listed);
        }
    };
}

vocab_tests! {
    llama_spm => "llama-spm",
    phi_3 => "phi-3",
    gpt_2 => "gpt-2",
    llama_bpe => "llama-bpe",
    qwen2 => "qwen2",
    qwen35 => "qwen35",
    starcoder => "starcoder",
    refact => "refact",
    command_r => "command-r",
    falcon => "falcon",
    mpt => "mpt",
    deepseek_llm => "deepseek-llm",
    deepseek_coder => "deepseek-coder",
    gemma_4 => "gemma-4",
}
