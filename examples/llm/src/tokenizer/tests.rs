//! Unit tests on small hand-made vocabularies: each expected id sequence follows from the
//! algorithm's definition (merge order, score order, partition rules), worked out by hand in
//! the comments. The real vocabularies are tested against llama.cpp in `tests/tokenizer_*.rs`.

use super::*;

/// A byte-level BPE vocabulary: all 256 byte characters, then `extra` tokens, with `merges`.
fn bpe_spec(extra: &[&str], merges: &[&str], pre: &str) -> VocabSpec {
    let chars = bpe::BYTE_TO_CHAR;
    let mut tokens: Vec<String> = chars.iter().map(|c| c.to_string()).collect();
    tokens.extend(extra.iter().map(|s| s.to_string()));
    VocabSpec {
        model: "gpt2".into(),
        pre: Some(pre.into()),
        tokens,
        merges: Some(merges.iter().map(|s| s.to_string()).collect()),
        ..VocabSpec::default()
    }
}

fn id_of(tok: &Tokenizer, text: &str) -> u32 {
    tok.token_id(text)
        .unwrap_or_else(|| panic!("no token {text:?}"))
}

#[test]
fn bpe_merges_lowest_rank_first() {
    // Ranks: "b c" (0) before "a b" (1): "abc" -> a + bc, not ab + c.
    let tok = Tokenizer::from_spec(bpe_spec(&["bc", "ab", "abc"], &["b c", "a b"], "gpt-2"))
        .expect("vocab");
    let ids = tok.encode("abc", false, false).expect("encode");
    assert_eq!(ids, vec![id_of(&tok, "a"), id_of(&tok, "bc")]);
    // With "a bc" added, the two merges chain to the whole word.
    let tok = Tokenizer::from_spec(bpe_spec(
        &["bc", "ab", "abc"],
        &["b c", "a b", "a bc"],
        "gpt-2",
    ))
    .expect("vocab");
    assert_eq!(
        tok.encode("abc", false, false).unwrap(),
        vec![id_of(&tok, "abc")]
    );
}

#[test]
fn bpe_equal_ranks_merge_leftmost_and_words_are_separate() {
    // "a a" applies to the leftmost pair first: "aaa" -> aa + a.
    let tok = Tokenizer::from_spec(bpe_spec(&["aa"], &["a a"], "gpt-2")).expect("vocab");
    let (aa, a) = (id_of(&tok, "aa"), id_of(&tok, "a"));
    assert_eq!(tok.encode("aaa", false, false).unwrap(), vec![aa, a]);
    assert_eq!(tok.encode("aaaa", false, false).unwrap(), vec![aa, aa]);
    // The GPT-2 expression cuts "aa aa" into "aa" and " aa"; the space is byte 0x20 = 'Ġ'.
    let sp = id_of(&tok, "Ġ");
    assert_eq!(tok.encode("aa aa", false, false).unwrap(), vec![aa, sp, aa]);
}

#[test]
fn bpe_ignore_merges_takes_whole_words() {
    // llama3 pre-tokenizer: a word that is a token is taken whole even with no merge path.
    let tok = Tokenizer::from_spec(bpe_spec(&["hello"], &[], "llama-bpe")).expect("vocab");
    assert_eq!(
        tok.encode("hello", false, false).unwrap(),
        vec![id_of(&tok, "hello")]
    );
    // gpt-2 does not: five single characters.
    let tok = Tokenizer::from_spec(bpe_spec(&["hello"], &[], "gpt-2")).expect("vocab");
    assert_eq!(tok.encode("hello", false, false).unwrap().len(), 5);
}

#[test]
fn bpe_bytes_map_through_gpt2_alphabet() {
    let tok = Tokenizer::from_spec(bpe_spec(&[], &[], "gpt-2")).expect("vocab");
    // "é" is bytes C3 A9; their characters are 'Ã' and '©'.
    assert_eq!(
        tok.encode("é", false, false).unwrap(),
        vec![id_of(&tok, "Ã"), id_of(&tok, "©")]
    );
    assert_eq!(tok.token_to_piece(id_of(&tok, "Ã")), &[0xC3]);
    assert_eq!(
        tok.detokenize(&tok.encode("é\n", false, false).unwrap(), false, false)
            .unwrap(),
        "é\n".as_bytes()
    );
}

#[test]
fn bpe_missing_byte_tokens_are_dropped_like_llama_cpp() {
    // A vocabulary with only "a" and "b": other bytes have no token; printable ASCII is looked
    // up as a one-character token and skipped when absent, as llama.cpp does.
    let spec = VocabSpec {
        model: "gpt2".into(),
        pre: Some("gpt-2".into()),
        tokens: vec!["a".into(), "b".into()],
        merges: Some(vec![]),
        ..VocabSpec::default()
    };
    let tok = Tokenizer::from_spec(spec).expect("vocab");
    assert_eq!(tok.encode("a€b c", false, false).unwrap(), vec![0, 1]);
}

#[test]
fn special_tokens_partition() {
    let mut spec = bpe_spec(&["<ctl>", "<user>", "<ctl>x"], &[], "gpt-2");
    let mut types = vec![1; spec.tokens.len()];
    let (ctl, user, ctlx) = (256u32, 257u32, 258u32);
    types[ctl as usize] = 3; // control
    types[user as usize] = 4; // user-defined
    types[ctlx as usize] = 3;
    spec.token_types = Some(types);
    let tok = Tokenizer::from_spec(spec).expect("vocab");
    let a = id_of(&tok, "a");
    // Control tokens are only recognised with parse_special; user-defined ones always.
    let plain = tok.encode("a<ctl>a", false, false).unwrap();
    assert!(!plain.contains(&ctl));
    assert_eq!(tok.encode("a<ctl>a", false, true).unwrap(), vec![a, ctl, a]);
    assert_eq!(
        tok.encode("a<user>a", false, false).unwrap(),
        vec![a, user, a]
    );
    // Longest first: "<ctl>x" wins over "<ctl>".
    assert_eq!(
        tok.encode("<ctl>x<ctl>", false, true).unwrap(),
        vec![ctlx, ctl]
    );
    assert_eq!(
        tok.encode("<user><user>", false, false).unwrap(),
        vec![user, user]
    );
    assert_eq!(tok.encode("", false, true).unwrap(), Vec::<u32>::new());
    // Control tokens render only on request.
    assert_eq!(tok.piece(ctl, false).unwrap(), b"");
    assert_eq!(tok.piece(ctl, true).unwrap(), b"<ctl>");
    assert_eq!(tok.piece(user, false).unwrap(), b"<user>");
}

#[test]
fn lstrip_rstrip_swallow_ascii_whitespace() {
    // Phi-3 (by general.name) gives control tokens RSTRIP: the spaces after "<ctl>" vanish.
    let mut spec = bpe_spec(&["<ctl>"], &[], "gpt-2");
    let mut types = vec![1; spec.tokens.len()];
    types[256] = 3;
    spec.token_types = Some(types);
    spec.name = Some("Phi3 mini".into());
    let tok = Tokenizer::from_spec(spec).expect("vocab");
    assert!(tok.token_attr(256).intersects(TokenAttr::RSTRIP));
    let a = id_of(&tok, "a");
    let sp = id_of(&tok, "Ġ");
    assert_eq!(
        tok.encode("a <ctl> \n a", false, true).unwrap(),
        vec![a, sp, 256, a]
    );
}

/// A SentencePiece vocabulary: `<unk>`, `<s>`, `</s>`, the 256 byte tokens, then `pieces`
/// with their scores.
fn spm_spec(pieces: &[(&str, f32)]) -> VocabSpec {
    let mut tokens = vec!["<unk>".to_string(), "<s>".into(), "</s>".into()];
    let mut types = vec![2, 3, 3];
    let mut scores = vec![0.0, 0.0, 0.0];
    for b in 0..=255u8 {
        tokens.push(format!("<0x{b:02X}>"));
        types.push(6);
        scores.push(0.0);
    }
    for (p, s) in pieces {
        tokens.push(p.to_string());
        types.push(1);
        scores.push(*s);
    }
    VocabSpec {
        model: "llama".into(),
        tokens,
        scores: Some(scores),
        token_types: Some(types),
        ..VocabSpec::default()
    }
}

#[test]
fn spm_prefix_space_scores_and_byte_fallback() {
    let tok = Tokenizer::from_spec(spm_spec(&[
        ("▁", -1.0),
        ("h", -1.0),
        ("i", -1.0),
        ("▁h", -2.0),
        ("hi", -3.0),
        ("▁hi", -4.0),
    ]))
    .expect("vocab");
    let id = |t: &str| id_of(&tok, t);
    // add_bos defaults to true for SPM; a space is prepended: "▁hi".
    assert!(tok.add_bos());
    assert_eq!(tok.encode("hi", true, false).unwrap(), vec![1, id("▁hi")]);
    // "▁h" (-2) beats "hi" (-3), then "▁h"+"i" = "▁hi" exists.
    assert_eq!(tok.encode("hi", false, false).unwrap(), vec![id("▁hi")]);
    // "é" is not a piece: its two UTF-8 bytes fall back to <0xC3> <0xA9>.
    assert_eq!(
        tok.encode("é", false, false).unwrap(),
        vec![id("▁"), id("<0xC3>"), id("<0xA9>")]
    );
    assert_eq!(tok.token_to_piece(id("<0xC3>")), &[0xC3]);
    assert_eq!(tok.token_to_piece(id("▁hi")), b" hi");
    // Detokenize drops the prefix space again, except after a BOS it removed (llama.cpp).
    let ids = tok.encode("hi é", false, false).unwrap();
    assert_eq!(
        tok.detokenize(&ids, false, false).unwrap(),
        "hi é".as_bytes()
    );
    let ids = tok.encode("hi é", true, false).unwrap();
    assert_eq!(
        tok.detokenize(&ids, true, false).unwrap(),
        " hi é".as_bytes()
    );
}

#[test]
fn spm_missing_byte_token_is_an_error() {
    let mut spec = spm_spec(&[("▁", 0.0)]);
    // Drop <0xC3> by renaming it.
    spec.tokens[3 + 0xC3] = "not a byte".into();
    let tok = Tokenizer::from_spec(spec).expect("vocab");
    assert!(matches!(
        tok.encode("é", false, false),
        Err(TokenizerError::MissingByteToken { byte: 0xC3 })
    ));
}

#[test]
fn loader_errors_name_the_problem() {
    let err = |spec| {
        Tokenizer::from_spec(spec)
            .expect_err("should fail")
            .to_string()
    };
    assert!(
        err(VocabSpec {
            model: "gpt2".into(),
            ..VocabSpec::default()
        })
        .contains("empty")
    );
    let mut s = bpe_spec(&[], &[], "gpt-2");
    s.model = "t5".into();
    assert!(err(s).contains("`t5`"));
    assert!(err(bpe_spec(&[], &[], "kimi-k2")).contains("`kimi-k2`"));
    let mut s = bpe_spec(&[], &[], "gpt-2");
    s.merges = None;
    assert!(err(s).contains("merges"));
    let mut s = bpe_spec(&[], &[], "gpt-2");
    s.tokens.push("a".into());
    assert!(err(s).contains("same text"));
    let mut s = spm_spec(&[]);
    s.scores = Some(vec![0.0; 3]);
    assert!(err(s).contains("tokenizer.ggml.scores` has 3 entries for 259 tokens"));
}

#[test]
fn missing_bos_is_reported_at_encode() {
    let mut s = spm_spec(&[("▁", 0.0)]);
    s.special.bos = Some(100_000); // out of range: ignored, default 1 stays
    let tok = Tokenizer::from_spec(s).expect("vocab");
    assert_eq!(tok.bos(), Some(1));
    // BPE's default BOS is id 11: a five-token vocabulary has none.
    let mut s = bpe_spec(&[], &[], "gpt-2");
    s.add_bos = Some(true);
    s.tokens.truncate(5);
    let tok = Tokenizer::from_spec(s).expect("vocab");
    assert_eq!(tok.bos(), None);
    assert!(matches!(
        tok.encode("a", true, false),
        Err(TokenizerError::MissingSpecial { which: "BOS" })
    ));
}

#[test]
fn eog_set_and_eot_by_name() {
    let s = bpe_spec(
        &["<|im_end|>", "<|endoftext|>", "<|im_start|>"],
        &[],
        "gpt-2",
    );
    let tok = Tokenizer::from_spec(s).expect("vocab");
    // No eot key: "<|im_end|>" comes first in llama.cpp's list of names.
    assert_eq!(tok.eot(), Some(256));
    assert!(tok.is_eog(256) && tok.is_eog(257) && !tok.is_eog(258));
    // Both became control tokens.
    assert!(tok.is_control(256) && tok.is_control(257) && !tok.is_control(258));
    // BPE's default EOS is id 11, and it joins the set.
    assert!(tok.is_eog(11));
}

/// A tool-call format's markers that are control tokens (type 3) are the ones a decoder is
/// told to keep, and only those are rendered; a user-defined one (type 4) is text anyway.
#[test]
fn tool_markers_that_are_control_tokens_are_preserved() {
    use crate::chat::ToolCallFormat;
    let extra = [
        "[TOOL_CALLS]",
        "<tool_call>",
        "</tool_call>",
        "<|im_end|>",
        "<|tool_call_start|>",
        "<|tool_call_end|>",
    ];
    let mut spec = bpe_spec(&extra, &[], "gpt-2");
    let mut types = vec![1; 256];
    types.extend([3, 4, 4, 3, 3, 3]);
    spec.token_types = Some(types);
    let tok = Tokenizer::from_spec(spec).expect("vocab");
    let calls = id_of(&tok, "[TOOL_CALLS]");
    let end = id_of(&tok, "<|im_end|>");
    assert_eq!(ToolCallFormat::Mistral.preserved_tokens(&tok), vec![calls]);
    assert_eq!(
        ToolCallFormat::Hermes.preserved_tokens(&tok),
        Vec::<u32>::new()
    );
    assert_eq!(
        ToolCallFormat::QwenXml.preserved_tokens(&tok),
        Vec::<u32>::new()
    );
    // LFM2's markers, both control tokens of its vocabulary.
    assert_eq!(
        ToolCallFormat::Lfm2.preserved_tokens(&tok),
        vec![
            id_of(&tok, "<|tool_call_start|>"),
            id_of(&tok, "<|tool_call_end|>")
        ]
    );
    assert_eq!(
        ToolCallFormat::Generic.preserved_tokens(&tok),
        Vec::<u32>::new()
    );
    let x = id_of(&tok, "x");
    let mut plain = StreamDecoder::new(&tok);
    let mut kept = StreamDecoder::new(&tok).preserve(&[calls]);
    let (mut a, mut b) = (String::new(), String::new());
    for id in [x, calls, id_of(&tok, "<tool_call>"), end] {
        a += &plain.push(id).unwrap();
        b += &kept.push(id).unwrap();
    }
    assert_eq!(a, "x<tool_call>");
    assert_eq!(b, "x[TOOL_CALLS]<tool_call>");
}

#[test]
fn stream_decoder_holds_back_partial_utf8() {
    let tok = Tokenizer::from_spec(bpe_spec(&[], &[], "gpt-2")).expect("vocab");
    // "🦙" is F0 9F A6 99: four byte tokens.
    let ids = tok.encode("a🦙b", false, false).unwrap();
    assert_eq!(ids.len(), 6);
    let mut d = StreamDecoder::new(&tok);
    assert_eq!(d.push(ids[0]).unwrap(), "a");
    assert_eq!(d.push(ids[1]).unwrap(), "");
    assert_eq!(d.push(ids[2]).unwrap(), "");
    assert_eq!(d.pending(), &[0xF0, 0x9F]);
    assert_eq!(d.push(ids[3]).unwrap(), "");
    assert_eq!(d.push(ids[4]).unwrap(), "🦙");
    assert_eq!(d.push(ids[5]).unwrap(), "b");
    assert_eq!(d.finish(), "");
    // An invalid byte comes out as U+FFFD at once; a truncated character at the end too.
    let byte = |b: u8| id_of(&tok, &bpe::BYTE_TO_CHAR[b as usize].to_string());
    let mut d = StreamDecoder::new(&tok);
    assert_eq!(d.push(byte(0xFF)).unwrap(), "\u{FFFD}");
    assert_eq!(d.push(byte(0xE4)).unwrap(), "");
    assert_eq!(d.push(byte(b'x')).unwrap(), "\u{FFFD}x");
    assert_eq!(d.push(byte(0xE4)).unwrap(), "");
    assert_eq!(d.finish(), "\u{FFFD}");
    assert!(matches!(
        d.push(99_999),
        Err(TokenizerError::IdOutOfRange { id: 99_999, .. })
    ));
}

#[test]
fn clean_spaces_matches_llama_cpp_passes() {
    let clean = |s: &str| {
        let mut v = s.as_bytes().to_vec();
        clean_spaces(&mut v);
        String::from_utf8(v).unwrap()
    };
    // Pass 1: no space before ?!., ; pass 2: " ' " loses both spaces; pass 3: " 's" etc.
    assert_eq!(clean("Hello , world ."), "Hello, world.");
    assert_eq!(clean("rock ' n"), "rock'n");
    assert_eq!(
        clean("it 's we 're I 'm they 'll don 't"),
        "it's we're I'm they 'll don 't"
    );
    assert_eq!(clean(""), "");
    assert_eq!(clean(" "), " ");
}

#[test]
fn byte_token_parse_is_lenient() {
    assert_eq!(parse_byte_token("<0x0A>"), 0x0A);
    assert_eq!(parse_byte_token("<0xff>"), 0xFF);
    assert_eq!(parse_byte_token("<0xZ>"), 0);
    assert_eq!(parse_byte_token("<"), 0);
}

#[test]
fn pre_tokenizers_compile() {
    use PreTokenizerKind as K;
    for k in [
        K::Default,
        K::Llama3,
        K::Dbrx,
        K::Qwen2,
        K::Qwen35,
        K::Gpt2,
        K::StarCoder,
        K::Falcon,
        K::DeepSeekLlm,
        K::DeepSeekCoder,
        K::Gemma4,
    ] {
        PreTokenizer::new(k).unwrap_or_else(|e| panic!("{k:?}: {e}"));
    }
}

#[test]
fn pre_tokenizer_pieces() {
    let split = |k, text: &str| -> Vec<String> {
        let p = PreTokenizer::new(k).unwrap();
        p.split(text)
            .unwrap()
            .into_iter()
            .map(|(s, e)| text[s..e].to_string())
            .collect()
    };
    // GPT-2: contractions, space-prefixed words, whitespace before a word split off.
    assert_eq!(
        split(PreTokenizerKind::Gpt2, "I'm  here 123!"),
        ["I", "'m", " ", " here", " 123", "!"]
    );
    // Llama 3: digits in threes, newline runs kept with preceding spaces.
    assert_eq!(
        split(PreTokenizerKind::Llama3, "12345 \n\nx"),
        ["123", "45", " \n\n", "x"]
    );
    // StarCoder / SmolLM: every digit alone.
    assert_eq!(
        split(PreTokenizerKind::StarCoder, "a 12"),
        ["a", " ", "1", "2"]
    );
    // `\s+(?!\S)`: a run before a non-space gives its last character to the next piece; a
    // lone white space before a word is a piece of its own (GPT-2 has no plain `\s+`).
    assert_eq!(
        split(PreTokenizerKind::Gpt2, "a \t\n b\tc  "),
        ["a", " \t\n", " b", "\t", "c", "  "]
    );
    assert_eq!(
        split(PreTokenizerKind::Llama3, "a  \tb\t"),
        ["a", "  ", "\tb", "\t"]
    );
    // Runs longer than fancy-regex's backtracking stack (a million entries) still split.
    let long = " ".repeat(1_500_000) + "x";
    for k in [
        PreTokenizerKind::Gpt2,
        PreTokenizerKind::Llama3,
        PreTokenizerKind::Qwen2,
    ] {
        let pieces = split(k, &long);
        assert_eq!(pieces.len(), 2, "{k:?}");
        assert_eq!(pieces[1], " x");
    }
    assert_eq!(
        split(PreTokenizerKind::Gpt2, &"\n ".repeat(600_000)).len(),
        1
    );
}

/// A GGUF image with no tensors and the given metadata, for the key-reading tests.
mod gguf_image {
    pub enum V<'a> {
        U32(u32),
        I32(i32),
        Bool(bool),
        Str(&'a str),
        Strs(Vec<String>),
        I32s(Vec<i32>),
        F32s(Vec<f32>),
    }

    fn string(out: &mut Vec<u8>, s: &str) {
        out.extend((s.len() as u64).to_le_bytes());
        out.extend(s.as_bytes());
    }

    pub fn build(kvs: &[(&str, V)]) -> crate::gguf::GgufFile {
        let mut out = b"GGUF".to_vec();
        out.extend(3u32.to_le_bytes());
        out.extend(0u64.to_le_bytes());
        out.extend((kvs.len() as u64).to_le_bytes());
        for (k, v) in kvs {
            string(&mut out, k);
            match v {
                V::U32(x) => {
                    out.extend(4u32.to_le_bytes());
                    out.extend(x.to_le_bytes());
                }
                V::I32(x) => {
                    out.extend(5u32.to_le_bytes());
                    out.extend(x.to_le_bytes());
                }
                V::Bool(x) => {
                    out.extend(7u32.to_le_bytes());
                    out.push(u8::from(*x));
                }
                V::Str(s) => {
                    out.extend(8u32.to_le_bytes());
                    string(&mut out, s);
                }
                V::Strs(a) => {
                    out.extend(9u32.to_le_bytes());
                    out.extend(8u32.to_le_bytes());
                    out.extend((a.len() as u64).to_le_bytes());
                    for s in a {
                        string(&mut out, s);
                    }
                }
                V::I32s(a) => {
                    out.extend(9u32.to_le_bytes());
                    out.extend(5u32.to_le_bytes());
                    out.extend((a.len() as u64).to_le_bytes());
                    a.iter().for_each(|x| out.extend(x.to_le_bytes()));
                }
                V::F32s(a) => {
                    out.extend(9u32.to_le_bytes());
                    out.extend(6u32.to_le_bytes());
                    out.extend((a.len() as u64).to_le_bytes());
                    a.iter().for_each(|x| out.extend(x.to_le_bytes()));
                }
            }
        }
        crate::gguf::GgufFile::from_bytes(out).expect("valid GGUF image")
    }
}

#[test]
fn from_gguf_reads_the_keys() {
    use gguf_image::{V, build};
    let tokens: Vec<String> = bpe::BYTE_TO_CHAR.iter().map(|c| c.to_string()).collect();
    let file = build(&[
        ("general.name", V::Str("toy")),
        ("tokenizer.ggml.model", V::Str("gpt2")),
        ("tokenizer.ggml.pre", V::Str("smollm")),
        ("tokenizer.ggml.tokens", V::Strs(tokens.clone())),
        ("tokenizer.ggml.merges", V::Strs(vec!["a b".into()])),
        // Scores as i32, as some converters write them.
        ("tokenizer.ggml.scores", V::I32s(vec![0; 256])),
        ("tokenizer.ggml.bos_token_id", V::U32(5)),
        // -1 means "none" in some files: the default (11) stays.
        ("tokenizer.ggml.eos_token_id", V::I32(-1)),
        ("tokenizer.ggml.add_bos_token", V::Bool(true)),
    ]);
    let tok = Tokenizer::from_gguf(&file).expect("tokenizer");
    assert_eq!(tok.pre_tokenizer(), Some(PreTokenizerKind::StarCoder));
    assert_eq!(
        (tok.bos(), tok.eos(), tok.add_bos()),
        (Some(5), Some(11), true)
    );
    // Token i is byte i's character; the merge "a b" gives "ab", not a token: byte fallback.
    assert_eq!(tok.encode("ab", true, false).unwrap(), vec![5, 0x61, 0x62]);
}

#[test]
fn from_gguf_rejects_wrong_types_by_key() {
    use gguf_image::{V, build};
    let err = |kvs: &[(&str, V)]| Tokenizer::from_gguf(&build(kvs)).unwrap_err().to_string();
    assert_eq!(
        err(&[]),
        "GGUF metadata key `tokenizer.ggml.model` is missing"
    );
    assert_eq!(
        err(&[("tokenizer.ggml.model", V::U32(1))]),
        "GGUF metadata key `tokenizer.ggml.model` should be a string"
    );
    assert_eq!(
        err(&[("tokenizer.ggml.model", V::Str("llama"))]),
        "GGUF metadata key `tokenizer.ggml.tokens` is missing"
    );
    assert_eq!(
        err(&[
            ("tokenizer.ggml.model", V::Str("llama")),
            ("tokenizer.ggml.tokens", V::I32s(vec![1, 2])),
        ]),
        "GGUF metadata key `tokenizer.ggml.tokens` should be an array of strings"
    );
    let toks = V::Strs(vec!["<unk>".into(), "<s>".into()]);
    assert_eq!(
        err(&[
            ("tokenizer.ggml.model", V::Str("llama")),
            ("tokenizer.ggml.tokens", toks),
            ("tokenizer.ggml.scores", V::Strs(vec!["x".into()])),
        ]),
        "GGUF metadata key `tokenizer.ggml.scores` should be an array of f32 or i32"
    );
    let toks = V::Strs(vec!["<unk>".into(), "<s>".into()]);
    assert_eq!(
        err(&[
            ("tokenizer.ggml.model", V::Str("llama")),
            ("tokenizer.ggml.tokens", toks),
            ("tokenizer.ggml.token_type", V::F32s(vec![1.0, 1.0])),
        ]),
        "GGUF metadata key `tokenizer.ggml.token_type` should be an array of i32"
    );
    let toks = V::Strs(vec!["<unk>".into(), "<s>".into()]);
    assert_eq!(
        err(&[
            ("tokenizer.ggml.model", V::Str("llama")),
            ("tokenizer.ggml.tokens", toks),
            ("tokenizer.ggml.add_bos_token", V::U32(1)),
        ]),
        "GGUF metadata key `tokenizer.ggml.add_bos_token` should be a bool"
    );
}
