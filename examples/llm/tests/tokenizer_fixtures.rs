//! Token ids equal to llama.cpp's on a varied set of strings (Unicode, emoji, CJK, digits,
//! whitespace runs, code, special tokens, odd input), with special-token parsing off and on and
//! BOS as the vocabulary asks. The fixtures are llama.cpp's `llama-tokenize` output, written by
//! `scripts/fixtures/gen_tokenizer_fixtures.py`; the vocabularies are SmolLM2's (the demo model,
//! `scripts/fetch-model.sh`), Gemma 3's (`scripts/fetch-model.sh gemma3-270m`: SentencePiece
//! with 262 144 pieces, byte fallback and 165 user-defined tokens) and a few of llama.cpp's
//! vocab-only test files (`scripts/llama-cpp.sh --vocab-only`).

use std::path::{Path, PathBuf};

use rknn_llm::gguf::GgufFile;
use rknn_llm::tokenizer::{StreamDecoder, Tokenizer, VocabKind};
use serde_json::Value;

mod common;

struct Case {
    text: String,
    add_special: bool,
    parse_special: bool,
    ids: Vec<u32>,
    /// llama.cpp's `llama_detokenize` of `ids`, where the fixture records it: (special tokens
    /// rendered, nothing removed), (BOS/EOS removed, control tokens not rendered).
    decoded: Option<(String, String)>,
}

fn read_cases(name: &str) -> Vec<Case> {
    let path = common::fixtures().join("tokenizer").join(name);
    let json: Value = serde_json::from_str(
        &std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display())),
    )
    .expect("fixture is JSON");
    json["cases"]
        .as_array()
        .expect("cases")
        .iter()
        .map(|c| Case {
            text: c["text"].as_str().expect("text").to_owned(),
            add_special: c["add_special"].as_bool().expect("add_special"),
            parse_special: c["parse_special"].as_bool().expect("parse_special"),
            ids: c["ids"]
                .as_array()
                .expect("ids")
                .iter()
                .map(|v| u32::try_from(v.as_u64().expect("id")).expect("id fits u32"))
                .collect(),
            decoded: c.get("decoded").map(|full| {
                let text = |v: &Value| v.as_str().expect("decoded text").to_owned();
                (text(full), text(&c["decoded_plain"]))
            }),
        })
        .collect()
}

fn vocab_file(name: &str) -> PathBuf {
    let cache = std::env::var_os("RKNPU_CACHE").map_or_else(
        || PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/rknpu-rs"),
        PathBuf::from,
    );
    cache.join(format!("llama.cpp/vocab/ggml-vocab-{name}.gguf"))
}

fn load(path: &Path) -> Tokenizer {
    let file = GgufFile::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    Tokenizer::from_gguf(&file).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The special tokens and end-of-generation set llama.cpp reported for the vocabulary (the
/// fixture's `llama_cpp` record, from its load log).
fn check_special(tok: &Tokenizer, fixture: &str) {
    let path = common::fixtures().join("tokenizer").join(fixture);
    let json: Value =
        serde_json::from_str(&std::fs::read_to_string(&path).expect("fixture")).expect("JSON");
    let info = &json["llama_cpp"];
    let want = |key: &str| info.get(key).and_then(Value::as_u64).map(|v| v as u32);
    let s = tok.special_ids();
    for (key, ours) in [
        ("bos", s.bos),
        ("eos", s.eos),
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
        assert_eq!(ours, want(key), "{fixture}: {key}");
    }
    // Where several tokens could be the end of turn and the file names none, llama.cpp takes
    // whichever its hash map yields first; both are end-of-generation tokens either way.
    if fixture == "smollm2.json" {
        assert_eq!((want("eot"), s.eot), (Some(0), Some(2)));
    } else {
        assert_eq!(s.eot, want("eot"), "{fixture}: eot");
    }
    let eog: Vec<u32> = info["eog"]
        .as_array()
        .expect("eog")
        .iter()
        .map(|v| v.as_u64().expect("id") as u32)
        .collect();
    assert_eq!(tok.eog_ids(), eog, "{fixture}: end-of-generation set");
}

/// Compares every case; returns the number of cases after asserting all passed.
fn check(tok: &Tokenizer, fixture: &str) -> usize {
    check_special(tok, fixture);
    let cases = read_cases(fixture);
    let mut failures = Vec::new();
    for c in &cases {
        let got = tok
            .encode(&c.text, c.add_special, c.parse_special)
            .unwrap_or_else(|e| panic!("{fixture}: {:?}: {e}", c.text));
        if got != c.ids {
            failures.push(format!(
                "  {:?} (add_special {}, parse_special {})\n    want {:?}\n    got  {:?}",
                c.text, c.add_special, c.parse_special, c.ids, got
            ));
        }
    }
    eprintln!(
        "{fixture}: {}/{} cases equal to llama.cpp",
        cases.len() - failures.len(),
        cases.len()
    );
    assert!(failures.is_empty(), "{fixture}:\n{}", failures.join("\n"));
    cases.len()
}

#[test]
fn smollm2_ids_equal_llama_cpp() {
    let Some(model) = common::require(common::demo_model(), "scripts/fetch-model.sh") else {
        return;
    };
    let tok = load(&model);
    assert_eq!(tok.kind(), VocabKind::Bpe);
    let n = check(&tok, "smollm2.json");
    assert!(
        n >= 400,
        "the fixture should hold at least 200 strings in two modes"
    );
}

#[test]
fn smollm2_metadata() {
    let Some(model) = common::require(common::demo_model(), "scripts/fetch-model.sh") else {
        return;
    };
    let tok = load(&model);
    assert_eq!(tok.n_vocab(), 49152);
    assert_eq!(tok.bos(), Some(1));
    assert_eq!(tok.eos(), Some(2));
    // No eot key in the file: found by its text, `<|im_end|>` before `<|endoftext|>`.
    assert_eq!(tok.eot(), Some(2));
    // `<reponame>` is found as the FIM repository token, which llama.cpp counts as EOG.
    assert_eq!(tok.eog_ids(), &[0, 2, 4]);
    assert!(!tok.add_bos());
    assert!(tok.is_eog(0) && tok.is_eog(2) && !tok.is_eog(1));
    assert_eq!(tok.token_to_piece(1), b"<|im_start|>");
    assert_eq!(tok.token_text(198), Some("Ċ"));
    assert_eq!(tok.token_to_piece(198), b"\n");
}

/// Byte-level BPE loses nothing: decoding the ids of any text (control tokens rendered) gives
/// the text back, in one piece or streamed token by token.
#[test]
fn smollm2_round_trip_and_stream() {
    let Some(model) = common::require(common::demo_model(), "scripts/fetch-model.sh") else {
        return;
    };
    let tok = load(&model);
    for c in read_cases("smollm2.json") {
        let text = tok.detokenize(&c.ids, false, true).expect("ids in range");
        assert_eq!(
            String::from_utf8_lossy(&text),
            c.text,
            "detokenize {:?}",
            c.ids
        );
        let mut stream = StreamDecoder::new(&tok).render_special(true);
        let mut streamed = String::new();
        for &id in &c.ids {
            streamed += &stream.push(id).expect("id in range");
        }
        streamed += &stream.finish();
        assert_eq!(streamed, c.text);
    }
}

#[test]
fn gemma3_ids_equal_llama_cpp() {
    let Some(model) = common::require(common::gemma3_model(), "scripts/fetch-model.sh gemma3-270m")
    else {
        return;
    };
    let tok = load(&model);
    assert_eq!(tok.kind(), VocabKind::Spm);
    let n = check(&tok, "gemma3.json");
    assert!(
        n >= 1200,
        "the fixture should hold at least 300 strings in four modes"
    );
}

#[test]
fn gemma3_metadata() {
    let Some(model) = common::require(common::gemma3_model(), "scripts/fetch-model.sh gemma3-270m")
    else {
        return;
    };
    let tok = load(&model);
    assert_eq!(tok.n_vocab(), 262_144);
    assert_eq!(
        (tok.bos(), tok.eos(), tok.eot()),
        (Some(2), Some(1), Some(106))
    );
    assert!(tok.add_bos() && !tok.add_eos() && !tok.add_space_prefix());
    assert_eq!(tok.token_text(105), Some("<start_of_turn>"));
    assert!(tok.is_control(105) && tok.is_eog(106) && !tok.is_eog(105));
    // `</s>` is user-defined in the file; llama.cpp makes it control (an end-of-generation
    // name), so it is no longer cut out of text with special parsing off.
    assert!(tok.is_control(212) && tok.is_eog(212));
    assert_eq!(tok.token_to_piece(108), b"\n\n");
    assert_eq!(tok.token_to_piece(248), b"\n");
    assert_eq!(tok.token_to_piece(9259), b"Hello");
}

/// Decoding equals llama.cpp's `llama_detokenize` on every case: special tokens rendered and
/// nothing removed, BOS removed and control tokens dropped, and streamed token by token.
#[test]
fn gemma3_decode_equal_llama_cpp() {
    let Some(model) = common::require(common::gemma3_model(), "scripts/fetch-model.sh gemma3-270m")
    else {
        return;
    };
    let tok = load(&model);
    let cases = read_cases("gemma3.json");
    let mut failures = Vec::new();
    for c in &cases {
        let (full, plain) = c
            .decoded
            .as_ref()
            .expect("gemma3.json records the decoded text");
        let got_full = tok.detokenize(&c.ids, false, true).expect("ids in range");
        let got_plain = tok.detokenize(&c.ids, true, false).expect("ids in range");
        let mut stream = StreamDecoder::new(&tok).render_special(true);
        let mut streamed = String::new();
        for &id in &c.ids {
            streamed += &stream.push(id).expect("id in range");
        }
        streamed += &stream.finish();
        if got_full != full.as_bytes() || got_plain != plain.as_bytes() || streamed != *full {
            failures.push(format!(
                "  {:?}\n    want {full:?} / {plain:?}\n    got  {:?} / {:?} / streamed {streamed:?}",
                c.ids,
                String::from_utf8_lossy(&got_full),
                String::from_utf8_lossy(&got_plain)
            ));
        }
    }
    eprintln!(
        "gemma3.json: {}/{} decodes equal to llama.cpp",
        cases.len() - failures.len(),
        cases.len()
    );
    assert!(failures.is_empty(), "gemma3.json:\n{}", failures.join("\n"));
}

/// GPT-2's byte-to-character map (printable Latin-1 to itself, the rest from U+0100 on).
fn gpt2_byte_char(b: u8) -> char {
    let printable = |b: u8| matches!(b, 0x21..=0x7E | 0xA1..=0xAC | 0xAE..=0xFF);
    if printable(b) {
        return char::from(b);
    }
    let rank = (0..b).filter(|&x| !printable(x)).count() as u32;
    char::from_u32(0x100 + rank).expect("below U+0144")
}

/// Random strings (any scalar value, biased to the awkward ones) encode without error and
/// round-trip, except for the bytes SmolLM2's vocabulary has no token for (0x04, 0xF1, ...),
/// which llama.cpp drops.
#[test]
fn smollm2_random_strings_round_trip() {
    let Some(model) = common::require(common::demo_model(), "scripts/fetch-model.sh") else {
        return;
    };
    let tok = load(&model);
    let has_token: Vec<bool> = (0..=255u8)
        .map(|b| tok.token_id(&gpt2_byte_char(b).to_string()).is_some())
        .collect();
    assert!(!has_token[0xF1] && has_token[b'a' as usize]);
    let mut rng = fastrand::Rng::with_seed(7);
    let pools: [&[char]; 4] = [
        &[
            ' ', '\n', '\t', '\r', '\u{a0}', '\u{3000}', '\u{200b}', '\u{85}',
        ],
        &['a', 'Z', '0', '9', '\'', 's', '<', '|', '>', '_'],
        &[
            'é',
            '\u{301}',
            '你',
            '🦙',
            '\u{fffd}',
            '\u{feff}',
            '\u{10ffff}',
            '\u{e000}',
        ],
        &[
            '<', '|', 'i', 'm', '_', 's', 't', 'a', 'r', 'e', 'n', 'd', '>',
        ],
    ];
    for _ in 0..2000 {
        let len = rng.usize(0..64);
        let text: String = (0..len)
            .map(|_| match rng.u8(0..5) {
                0 => char::from_u32(rng.u32(0..0x11_0000)).unwrap_or('x'),
                k => {
                    let pool = pools[usize::from(k - 1)];
                    pool[rng.usize(0..pool.len())]
                }
            })
            .collect();
        for parse_special in [false, true] {
            let ids = tok
                .encode(&text, true, parse_special)
                .unwrap_or_else(|e| panic!("{text:?}: {e}"));
            let back = tok.detokenize(&ids, false, true).expect("ids in range");
            let kept: Vec<u8> = text
                .bytes()
                .filter(|&b| has_token[usize::from(b)])
                .collect();
            assert_eq!(back, kept, "{text:?}");
        }
    }
}

macro_rules! vocab_fixture_tests {
    ($($fn:ident => $name:literal),* $(,)?) => {
        $(
            #[test]
            fn $fn() {
                let Some(path) = common::require(
                    vocab_file($name),
                    "scripts/llama-cpp.sh --vocab-only",
                ) else {
                    return;
                };
                check(&load(&path), concat!($name, ".json"));
            }
        )*
    };
}

vocab_fixture_tests! {
    llama_spm_ids_equal_llama_cpp => "llama-spm",
    llama_bpe_ids_equal_llama_cpp => "llama-bpe",
    qwen2_ids_equal_llama_cpp => "qwen2",
    phi_3_ids_equal_llama_cpp => "phi-3",
    gpt_2_ids_equal_llama_cpp => "gpt-2",
}
