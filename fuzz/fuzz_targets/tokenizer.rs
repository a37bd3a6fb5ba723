//! The tokenizers on arbitrary text and arbitrary ids, with every supported vocabulary type:
//! SentencePiece-style with byte fallback, byte-level BPE under each pre-tokenizer, and
//! Gemma 4's SentencePiece-style BPE. The vocabularies are small ones built here (the byte
//! alphabet, a few merges, control tokens), so the target needs no fetched data.
//!
//! Checked: every id is inside the vocabulary; byte-level BPE without space clean-up gives the
//! text back (detokenize and the stream decoder), since every byte has a symbol; ids outside
//! the vocabulary are typed errors, never a panic.
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use rknn_llm::tokenizer::{StreamDecoder, Tokenizer, TokenizerError, VocabSpec};

/// GPT-2's printable stand-in for each byte (the byte itself when printable, else U+0100 on).
fn byte_symbol(b: u8) -> char {
    let keep = |b: u8| matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
    if keep(b) {
        return char::from(b);
    }
    let n = (0..b).filter(|&x| !keep(x)).count() as u32;
    char::from_u32(256 + n).expect("a valid code point")
}

const WORDS: [&str; 14] = [
    "the", "he", "in", "ing", "er", "an", "on", "at", "12", "()", "  ", "\n\n", "é", "日本",
];
const CONTROL: [&str; 3] = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"];

/// Byte-level BPE: the 256 byte symbols, merges building WORDS (with and without a leading
/// space), and control tokens.
fn byte_level(pre: &str) -> VocabSpec {
    let mut tokens: Vec<String> = (0..=255u8).map(|b| byte_symbol(b).to_string()).collect();
    let mut merges = Vec::new();
    for w in WORDS.iter().flat_map(|w| [w.to_string(), format!(" {w}")]) {
        let syms: Vec<String> = w.bytes().map(|b| byte_symbol(b).to_string()).collect();
        let mut acc = syms[0].clone();
        for s in &syms[1..] {
            let merged = format!("{acc}{s}");
            if !tokens.contains(&merged) {
                merges.push(format!("{acc} {s}"));
                tokens.push(merged.clone());
            }
            acc = merged;
        }
    }
    let mut types = vec![1; tokens.len()];
    for c in CONTROL {
        tokens.push(c.to_string());
        types.push(3);
    }
    VocabSpec {
        model: "gpt2".into(),
        pre: Some(pre.into()),
        tokens,
        token_types: Some(types),
        merges: Some(merges),
        ..VocabSpec::default()
    }
}

/// SentencePiece-style: unknown, BOS, EOS, 256 byte tokens, pieces with scores.
fn spm() -> VocabSpec {
    let mut tokens = vec!["<unk>".to_string(), "<s>".into(), "</s>".into()];
    let mut types = vec![2, 3, 3];
    let mut scores = vec![0.0, 0.0, 0.0];
    for b in 0..=255u8 {
        tokens.push(format!("<0x{b:02X}>"));
        types.push(6);
        scores.push(0.0);
    }
    for (i, p) in [
        "▁", "▁the", "▁a", "t", "h", "e", "he", "the", "in", "ing", "▁in", "é", "日",
    ]
    .iter()
    .enumerate()
    {
        tokens.push(p.to_string());
        types.push(1);
        scores.push(-(i as f32));
    }
    VocabSpec {
        model: "llama".into(),
        tokens,
        scores: Some(scores),
        token_types: Some(types),
        ..VocabSpec::default()
    }
}

/// Gemma 4: raw UTF-8 pieces with U+2581 for spaces, byte fallback, merges.
fn gemma4() -> VocabSpec {
    let mut tokens = vec!["<pad>".to_string(), "<eos>".into(), "<bos>".into()];
    let mut types = vec![3, 3, 3];
    for b in 0..=255u8 {
        tokens.push(format!("<0x{b:02X}>"));
        types.push(6);
    }
    let mut merges = Vec::new();
    for p in ["▁", "t", "h", "e", "i", "n", "g", "é", "日", "本"] {
        tokens.push(p.into());
        types.push(1);
    }
    for (l, r) in [
        ("t", "h"),
        ("th", "e"),
        ("▁", "the"),
        ("i", "n"),
        ("in", "g"),
        ("日", "本"),
    ] {
        merges.push(format!("{l} {r}"));
        tokens.push(format!("{l}{r}"));
        types.push(1);
    }
    VocabSpec {
        model: "gemma4".into(),
        tokens,
        token_types: Some(types),
        merges: Some(merges),
        special: rknn_llm::tokenizer::SpecialIds {
            bos: Some(2),
            eos: Some(1),
            ..Default::default()
        },
        ..VocabSpec::default()
    }
}

/// The pre-tokenizer names, one per kind, and whether detokenizing cleans spaces (which makes
/// the round trip lossy by design).
const PRES: [(&str, bool); 10] = [
    ("default", true),
    ("llama-bpe", true),
    ("dbrx", true),
    ("qwen2", false),
    ("qwen35", false),
    ("gpt-2", true),
    ("smollm", false),
    ("falcon", true),
    ("deepseek-llm", false),
    ("deepseek-coder", false),
];

/// (tokenizer, whether the byte-level round trip must hold).
fn vocabs() -> &'static [(Tokenizer, bool)] {
    static V: OnceLock<Vec<(Tokenizer, bool)>> = OnceLock::new();
    V.get_or_init(|| {
        let mut v: Vec<(Tokenizer, bool)> = PRES
            .iter()
            .map(|&(pre, clean)| {
                let t = Tokenizer::from_spec(byte_level(pre)).expect("the byte-level vocabulary");
                (t, !clean)
            })
            .collect();
        v.push((
            Tokenizer::from_spec(spm()).expect("the SentencePiece vocabulary"),
            false,
        ));
        v.push((
            Tokenizer::from_spec(gemma4()).expect("the Gemma 4 vocabulary"),
            false,
        ));
        v
    })
}

fuzz_target!(|data: &[u8]| {
    let [sel, flags, rest @ ..] = data else {
        return;
    };
    let vocabs = vocabs();
    let (tok, round_trip) = &vocabs[*sel as usize % vocabs.len()];
    let n = tok.n_vocab();
    let (add_special, parse_special) = (flags & 1 != 0, flags & 2 != 0);
    let text = String::from_utf8_lossy(rest);
    let ids = tok
        .encode(&text, add_special, parse_special)
        .expect("encoding any text with a complete vocabulary");
    assert!(ids.iter().all(|&id| (id as usize) < n), "{ids:?}");
    let bytes = tok
        .detokenize(&ids, add_special, parse_special)
        .expect("ids from encode are in range");
    let mut stream = StreamDecoder::new(tok).render_special(parse_special);
    let mut streamed = String::new();
    for &id in &ids {
        streamed.push_str(&stream.push(id).expect("ids from encode are in range"));
    }
    streamed.push_str(&stream.finish());
    if *round_trip && !add_special && !parse_special {
        assert_eq!(bytes, text.as_bytes(), "{text:?} -> {ids:?}");
        assert_eq!(streamed, text, "{ids:?}");
    }
    // Arbitrary ids, some past the vocabulary.
    let raw: Vec<u32> = rest
        .chunks_exact(2)
        .map(|c| u32::from(u16::from_le_bytes([c[0], c[1]])) % (n as u32 + 8))
        .collect();
    let bad = raw.iter().find(|&&id| id as usize >= n);
    match (tok.detokenize(&raw, false, flags & 4 != 0), bad) {
        (Ok(_), None) => {}
        (Err(TokenizerError::IdOutOfRange { id, n_vocab }), Some(&b)) => {
            assert_eq!((id, n_vocab), (b, n));
        }
        (r, b) => panic!("detokenize {raw:?}: {r:?} (first out of range: {b:?})"),
    }
    let mut stream = StreamDecoder::new(tok);
    for &id in &raw {
        match stream.push(id) {
            Ok(_) => assert!((id as usize) < n),
            Err(e) => assert!(matches!(e, TokenizerError::IdOutOfRange { .. }) && id as usize >= n),
        }
    }
    let _ = stream.finish();
});
