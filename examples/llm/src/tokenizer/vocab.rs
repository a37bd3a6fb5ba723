//! The tokenizer: a vocabulary loaded from its [`VocabSpec`], special-token partitioning, and
//! the two algorithms (SentencePiece-style and byte-level BPE).

use std::borrow::Cow;

// foldhash: several times faster than SipHash on these short keys (loading a 128k-token,
// 280k-merge vocabulary is mostly hashing), and randomly seeded like std's hasher.
use foldhash::{HashMap, HashMapExt};

use super::error::TokenizerError;
use super::pretok::{self, PreTokenizer, PreTokenizerKind};
use super::spec::{SpecialIds, TokenAttr, VocabKind, VocabSpec};
use super::trie::TokenTrie;
use super::{bpe, gguf_keys, spm};

/// A piece of text during special-token partitioning.
#[derive(Debug, Clone, Copy)]
enum Fragment {
    /// Byte range of the input still to tokenize.
    Text(usize, usize),
    /// A special token cut out of the input.
    Token(u32),
}

/// The byte-level BPE state: string table, merges and the byte alphabet.
#[derive(Debug)]
struct BpeTables {
    pre: PreTokenizer,
    kind: PreTokenizerKind,
    /// (left string id, right string id) -> (rank, merged string id).
    merges: HashMap<(u32, u32), (u32, u32)>,
    /// String id of each byte's GPT-2 character (byte-level vocabularies).
    byte_sid: [Option<u32>; 256],
    /// GPT-2's byte-to-character map, or none for SentencePiece-style BPE.
    byte_encode: bool,
    ignore_merges: bool,
}

/// A vocabulary and its tokenizer, built from GGUF metadata.
#[derive(Debug)]
pub struct Tokenizer {
    kind: VocabKind,
    texts: Vec<Box<str>>,
    scores: Vec<f32>,
    attrs: Vec<TokenAttr>,
    /// Every token's text -> its id, then (ids from `n_vocab` on) the other strings merges
    /// produce.
    strings: HashMap<Box<str>, u32>,
    bpe: Option<BpeTables>,
    /// Tokens cut out of text before tokenizing, longest first.
    special_cache: Vec<u32>,
    /// The texts of `special_cache`, to find which occur in a text in one pass.
    special_trie: TokenTrie,
    special: SpecialIds,
    eog: Vec<u32>,
    pieces: Vec<Box<[u8]>>,
    add_bos: bool,
    add_eos: bool,
    add_space_prefix: bool,
    escape_whitespaces: bool,
    clean_spaces: bool,
}

/// Names llama.cpp recognises as end of generation.
const EOG_NAMES: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<｜end▁of▁sentence｜>",
    "[e~[",
];

/// Names tried, in this order, for an end-of-turn token the file does not name.
const EOT_NAMES: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "<｜end▁of▁sentence｜>",
    "<end_of_utterance>",
];
const EOM_NAMES: &[&str] = &["<|eom_id|>"];
const FIM_PRE_NAMES: &[&str] = &[
    "<|fim_prefix|>",
    "<fim-prefix>",
    "<fim_prefix>",
    "<｜fim▁begin｜>",
    "<PRE>",
    "▁<PRE>",
    "<|code_prefix|>",
    "<|prefix|>",
];
const FIM_SUF_NAMES: &[&str] = &[
    "<|fim_suffix|>",
    "<fim-suffix>",
    "<fim_suffix>",
    "<｜fim▁hole｜>",
    "<SUF>",
    "▁<SUF>",
    "<|code_suffix|>",
    "<|suffix|>",
];
const FIM_MID_NAMES: &[&str] = &[
    "<|fim_middle|>",
    "<fim-middle>",
    "<fim_middle>",
    "<｜fim▁end｜>",
    "<MID>",
    "▁<MID>",
    "<|code_middle|>",
    "<|middle|>",
];
const FIM_PAD_NAMES: &[&str] = &["<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"];
const FIM_REP_NAMES: &[&str] = &[
    "<|fim_repo|>",
    "<|repo_name|>",
    "<fim-repo>",
    "<REPO>",
    "<reponame>",
];
const FIM_SEP_NAMES: &[&str] = &["<|file_sep|>"];

/// llama.cpp's token ids are `int32_t`.
const MAX_TOKENS: usize = i32::MAX as usize;

/// C's `isspace` in the "C" locale.
fn is_c_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | 0x0B | 0x0C | b'\r')
}

impl Tokenizer {
    /// Builds the tokenizer from a GGUF file's metadata (works on vocabulary-only files).
    pub fn from_gguf(file: &crate::gguf::GgufFile) -> Result<Self, TokenizerError> {
        Self::from_spec(gguf_keys::read_spec(file.metadata())?)
    }

    /// Builds the tokenizer from metadata already read.
    pub fn from_spec(spec: VocabSpec) -> Result<Self, TokenizerError> {
        let n = spec.tokens.len();
        if n == 0 {
            return Err(TokenizerError::EmptyVocab);
        }
        if n > MAX_TOKENS {
            return Err(TokenizerError::TooManyTokens { n, max: MAX_TOKENS });
        }
        for (key, len) in [
            ("tokenizer.ggml.scores", spec.scores.as_ref().map(Vec::len)),
            (
                "tokenizer.ggml.token_type",
                spec.token_types.as_ref().map(Vec::len),
            ),
        ] {
            if let Some(len) = len.filter(|&len| len < n) {
                return Err(TokenizerError::ArrayTooShort {
                    key,
                    len,
                    n_tokens: n,
                });
            }
        }

        // Family, defaults and pre-tokenizer, as llama.cpp's loader sets them.
        let (kind, pre_name) = match spec.model.as_str() {
            "llama" => (VocabKind::Spm, None),
            "gpt2" => (
                VocabKind::Bpe,
                Some(spec.pre.as_deref().unwrap_or("default")),
            ),
            "gemma4" => (VocabKind::Bpe, Some("gemma4")),
            other => {
                return Err(TokenizerError::UnsupportedModel {
                    model: other.to_owned(),
                });
            }
        };
        let pre_flags = pre_name.map(pretok::flags_for).transpose()?;
        let mut special = match kind {
            VocabKind::Spm => SpecialIds {
                bos: Some(1),
                eos: Some(2),
                unk: Some(0),
                ..SpecialIds::default()
            },
            VocabKind::Bpe if spec.model == "gemma4" => SpecialIds::default(),
            VocabKind::Bpe => SpecialIds {
                bos: Some(11),
                eos: Some(11),
                ..SpecialIds::default()
            },
        };
        let (mut add_bos, mut add_eos, add_space_prefix_default, clean_spaces) = match pre_flags {
            None => (true, false, true, false),
            Some(f) => (f.add_bos, false, false, f.clean_spaces),
        };
        let add_space_prefix = spec.add_space_prefix.unwrap_or(add_space_prefix_default);
        let escape_whitespaces = pre_flags.is_some_and(|f| f.kind == PreTokenizerKind::Gemma4);

        // Tokens, scores, attributes and the string table.
        let mut texts = Vec::with_capacity(n);
        let mut strings: HashMap<Box<str>, u32> = HashMap::with_capacity(n);
        for (i, t) in spec.tokens.into_iter().enumerate() {
            let t: Box<str> = if t.is_empty() {
                format!("[EMPTY_{i}]").into()
            } else {
                t.into()
            };
            if let Some(&first) = strings.get(&t) {
                return Err(TokenizerError::DuplicateToken {
                    text: t.into(),
                    first,
                    second: i as u32,
                });
            }
            strings.insert(t.clone(), i as u32);
            texts.push(t);
        }
        let scores = match spec.scores {
            Some(mut s) => {
                s.truncate(n);
                s
            }
            None => vec![0.0; n],
        };
        let mut attrs: Vec<TokenAttr> = match &spec.token_types {
            Some(t) => t[..n]
                .iter()
                .map(|&t| TokenAttr::from_token_type(t))
                .collect(),
            None => vec![TokenAttr::NORMAL; n],
        };

        let bpe = match (kind, pre_flags) {
            (VocabKind::Bpe, Some(flags)) => {
                let merges = spec
                    .merges
                    .as_deref()
                    .ok_or(TokenizerError::MissingMerges)?;
                Some(Self::build_bpe(flags, merges, &mut strings)?)
            }
            _ => None,
        };

        // Special ids: a default outside the vocabulary is dropped, a key outside it ignored.
        let in_range = |id: Option<u32>| id.filter(|&id| (id as usize) < n);
        {
            let s = &mut special;
            for (slot, key) in [
                (&mut s.bos, spec.special.bos),
                (&mut s.eos, spec.special.eos),
                (&mut s.eot, spec.special.eot),
                (&mut s.eom, spec.special.eom),
                (&mut s.unk, spec.special.unk),
                (&mut s.sep, spec.special.sep),
                (&mut s.pad, spec.special.pad),
                (&mut s.mask, spec.special.mask),
                (&mut s.fim_pre, spec.special.fim_pre),
                (&mut s.fim_suf, spec.special.fim_suf),
                (&mut s.fim_mid, spec.special.fim_mid),
                (&mut s.fim_pad, spec.special.fim_pad),
                (&mut s.fim_rep, spec.special.fim_rep),
                (&mut s.fim_sep, spec.special.fim_sep),
            ] {
                *slot = in_range(*slot);
                if let Some(id) = in_range(key) {
                    *slot = Some(id);
                }
            }
        }
        if let Some(b) = spec.add_bos {
            add_bos = b;
        }
        if let Some(b) = spec.add_eos {
            add_eos = b;
        }
        if pre_flags.is_some_and(|f| f.kind == PreTokenizerKind::Gemma4) {
            // llama.cpp forces BOS for Gemma 4 whatever the file says.
            add_bos = true;
        }

        let id_of = |name: &str| strings.get(name).copied().filter(|&id| (id as usize) < n);
        // Tokens the file does not name are found by their text; a found one becomes control.
        for (slot, names) in [
            (&mut special.eot, EOT_NAMES),
            (&mut special.eom, EOM_NAMES),
            (&mut special.fim_pre, FIM_PRE_NAMES),
            (&mut special.fim_suf, FIM_SUF_NAMES),
            (&mut special.fim_mid, FIM_MID_NAMES),
            (&mut special.fim_pad, FIM_PAD_NAMES),
            (&mut special.fim_rep, FIM_REP_NAMES),
            (&mut special.fim_sep, FIM_SEP_NAMES),
        ] {
            if slot.is_none() {
                if let Some(id) = names.iter().find_map(|name| id_of(name)) {
                    *slot = Some(id);
                    attrs[id as usize] = attrs[id as usize] | TokenAttr::CONTROL;
                }
            }
        }
        // Control tokens named "unused" are unused.
        for (t, a) in texts.iter().zip(attrs.iter_mut()) {
            if a.intersects(TokenAttr::CONTROL) && t.contains("unused") {
                *a = *a | TokenAttr::UNUSED;
            }
        }

        // End of generation.
        let mut eog: Vec<u32> = [special.fim_pad, special.fim_rep, special.fim_sep]
            .into_iter()
            .flatten()
            .collect();
        for name in EOG_NAMES {
            if let Some(id) = id_of(name) {
                eog.push(id);
                attrs[id as usize] = attrs[id as usize] | TokenAttr::CONTROL;
            }
        }
        // gpt-oss: these render always.
        for name in ["<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"] {
            if let Some(id) = id_of(name) {
                attrs[id as usize] = TokenAttr::USER_DEFINED;
            }
        }
        eog.extend(
            [special.eos, special.eot, special.eom]
                .into_iter()
                .flatten(),
        );
        eog.sort_unstable();
        eog.dedup();
        let eog_has = |eog: &[u32], name: &str| eog.iter().any(|&id| &*texts[id as usize] == name);
        // o200k_harmony and solar-open: `<|end|>` ends a message, not the generation.
        if (eog_has(&eog, "<|return|>") && eog_has(&eog, "<|call|>") && eog_has(&eog, "<|end|>"))
            || (eog_has(&eog, "<|calls|>")
                && eog_has(&eog, "<|flush|>")
                && eog_has(&eog, "<|end|>"))
        {
            if let Some(id) = id_of("<|end|>") {
                eog.retain(|&e| e != id);
                attrs[id as usize] = TokenAttr::USER_DEFINED;
            }
        }
        // Gemma 4 and PLaMo: `</s>` is an ordinary token there.
        if (eog_has(&eog, "<|tool_response>") || eog_has(&eog, "<|plamo:eos|>"))
            && eog_has(&eog, "</s>")
        {
            if let Some(id) = id_of("</s>") {
                eog.retain(|&e| e != id);
                attrs[id as usize] = TokenAttr::NORMAL;
            }
        }

        // Longest first; ties by id (llama.cpp's order among equal lengths is unspecified).
        let mut special_cache: Vec<u32> = (0..n as u32)
            .filter(|&id| {
                attrs[id as usize]
                    .intersects(TokenAttr::CONTROL | TokenAttr::USER_DEFINED | TokenAttr::UNKNOWN)
            })
            .collect();
        special_cache.sort_by_key(|&id| std::cmp::Reverse(texts[id as usize].len()));
        let special_trie = TokenTrie::new(special_cache.iter().map(|&id| &*texts[id as usize]));

        let mut tok = Self {
            kind,
            texts,
            scores,
            attrs,
            strings,
            bpe,
            special_cache,
            special_trie,
            special,
            eog,
            pieces: Vec::new(),
            add_bos,
            add_eos,
            add_space_prefix,
            escape_whitespaces,
            clean_spaces,
        };
        tok.pieces = (0..n as u32).map(|id| tok.render_piece(id)).collect();

        // Per-model attributes llama.cpp sets by name (after the caches above, as it does).
        let name = spec.name.unwrap_or_default().to_ascii_lowercase();
        let pre = spec.pre.unwrap_or_default();
        let arch = spec.architecture.unwrap_or_default();
        let mut set = |text: &str, attr: TokenAttr, on: bool| {
            if let Some(id) = id_of_in(&tok.strings, text, n) {
                tok.attrs[id as usize] = tok.attrs[id as usize].with(attr, on);
            }
        };
        if ["jina-v2-de", "jina-v2-es", "jina-v2-code"]
            .iter()
            .any(|p| pre.contains(p))
            || ["nomic-bert-moe", "jina-bert-v3"]
                .iter()
                .any(|a| arch.contains(a))
        {
            set("<mask>", TokenAttr::LSTRIP, true);
        } else if name.contains("phi-3") || name.contains("phi3") {
            for id in tok.special_cache.clone() {
                tok.attrs[id as usize] = tok.attrs[id as usize].with(TokenAttr::RSTRIP, true);
            }
            let mut set = |text: &str, attr: TokenAttr, on: bool| {
                if let Some(id) = id_of_in(&tok.strings, text, n) {
                    tok.attrs[id as usize] = tok.attrs[id as usize].with(attr, on);
                }
            };
            set("</s>", TokenAttr::RSTRIP, true);
            for t in ["<unk>", "<s>", "<|endoftext|>"] {
                set(t, TokenAttr::RSTRIP, false);
            }
        } else if name.contains("modern-bert") {
            set("[MASK]", TokenAttr::LSTRIP, true);
        }
        Ok(tok)
    }

    fn build_bpe(
        flags: pretok::PreFlags,
        merges: &[String],
        strings: &mut HashMap<Box<str>, u32>,
    ) -> Result<BpeTables, TokenizerError> {
        let mut intern = |s: &str| -> u32 {
            if let Some(&id) = strings.get(s) {
                return id;
            }
            let id = strings.len() as u32;
            strings.insert(s.into(), id);
            id
        };
        let mut table = HashMap::with_capacity(merges.len());
        let mut joined = String::new();
        for (rank, m) in merges.iter().enumerate() {
            // Split at the first space after the first byte, as llama.cpp does (a merge whose
            // left side is a space itself stays possible).
            let Some(pos) = m.as_bytes().iter().skip(1).position(|&b| b == b' ') else {
                continue;
            };
            let (left, right) = (&m[..pos + 1], &m[pos + 2..]);
            if right.is_empty() {
                continue;
            }
            let (l, r) = (intern(left), intern(right));
            joined.clear();
            joined.push_str(left);
            joined.push_str(right);
            let merged = intern(&joined);
            let rank = u32::try_from(rank).map_err(|_| TokenizerError::TooManyTokens {
                n: merges.len(),
                max: u32::MAX as usize,
            })?;
            // The first occurrence of a pair keeps its rank.
            table.entry((l, r)).or_insert((rank, merged));
        }
        if strings.len() > u32::MAX as usize {
            return Err(TokenizerError::TooManyTokens {
                n: strings.len(),
                max: u32::MAX as usize,
            });
        }
        let byte_encode = flags.kind != PreTokenizerKind::Gemma4;
        let mut byte_sid = [None; 256];
        for (b, c) in bpe::BYTE_TO_CHAR.iter().enumerate() {
            byte_sid[b] = strings.get(c.encode_utf8(&mut [0; 4]) as &str).copied();
        }
        Ok(BpeTables {
            pre: PreTokenizer::new(flags.kind)?,
            kind: flags.kind,
            merges: table,
            byte_sid,
            byte_encode,
            ignore_merges: flags.ignore_merges,
        })
    }

    /// The token's text as it prints (llama.cpp's `token_to_piece` with `special` rendering).
    fn render_piece(&self, id: u32) -> Box<[u8]> {
        let i = id as usize;
        let attr = self.attrs[i];
        let text = &*self.texts[i];
        if attr.intersects(TokenAttr::UNKNOWN | TokenAttr::CONTROL | TokenAttr::USER_DEFINED) {
            return text.as_bytes().into();
        }
        if attr.intersects(TokenAttr::NORMAL) {
            return match self.kind {
                VocabKind::Spm => unescape_whitespace(text),
                VocabKind::Bpe if self.escape_whitespaces => unescape_whitespace(text),
                VocabKind::Bpe => decode_byte_level(text).into(),
            };
        }
        if attr.intersects(TokenAttr::BYTE) {
            return [parse_byte_token(text)].into();
        }
        Box::default()
    }

    /// The family of the vocabulary.
    pub fn kind(&self) -> VocabKind {
        self.kind
    }

    /// The pre-tokenizer of a BPE vocabulary.
    pub fn pre_tokenizer(&self) -> Option<PreTokenizerKind> {
        self.bpe.as_ref().map(|b| b.kind)
    }

    /// Number of tokens.
    pub fn n_vocab(&self) -> usize {
        self.texts.len()
    }

    /// Beginning-of-sequence token.
    pub fn bos(&self) -> Option<u32> {
        self.special.bos
    }

    /// End-of-sequence token.
    pub fn eos(&self) -> Option<u32> {
        self.special.eos
    }

    /// End-of-turn token (named in the file, or found by its text such as `<|im_end|>`).
    pub fn eot(&self) -> Option<u32> {
        self.special.eot
    }

    /// All resolved special ids.
    pub fn special_ids(&self) -> &SpecialIds {
        &self.special
    }

    /// Whether encoding with `add_special` prepends BOS.
    pub fn add_bos(&self) -> bool {
        self.add_bos
    }

    /// Whether encoding with `add_special` appends EOS.
    pub fn add_eos(&self) -> bool {
        self.add_eos
    }

    /// Whether SentencePiece-style text gets a leading space.
    pub fn add_space_prefix(&self) -> bool {
        self.add_space_prefix
    }

    /// Whether `id` ends generation (EOS, EOT, `<|im_end|>`, ...).
    pub fn is_eog(&self, id: u32) -> bool {
        self.eog.binary_search(&id).is_ok()
    }

    /// The end-of-generation ids, sorted.
    pub fn eog_ids(&self) -> &[u32] {
        &self.eog
    }

    /// Whether `id` is a control token (rendered only on request).
    pub fn is_control(&self, id: u32) -> bool {
        self.token_attr(id).intersects(TokenAttr::CONTROL)
    }

    /// The token's attributes (empty for ids out of range).
    pub fn token_attr(&self, id: u32) -> TokenAttr {
        self.attrs.get(id as usize).copied().unwrap_or_default()
    }

    /// The token's text as stored in the vocabulary (`Ġhello`, `▁hello`, `<0x0A>`).
    pub fn token_text(&self, id: u32) -> Option<&str> {
        self.texts.get(id as usize).map(|t| &**t)
    }

    /// The token's score (`tokenizer.ggml.scores`, 0 when absent).
    pub fn token_score(&self, id: u32) -> Option<f32> {
        self.scores.get(id as usize).copied()
    }

    /// The id of the token spelled exactly `text` in the vocabulary's own spelling.
    pub fn token_id(&self, text: &str) -> Option<u32> {
        self.strings
            .get(text)
            .copied()
            .filter(|&id| (id as usize) < self.texts.len())
    }

    /// The bytes the token stands for, control tokens rendered as their text. Ids out of range
    /// have an empty piece; [`StreamDecoder`](super::StreamDecoder) and [`detokenize`](Self::detokenize) report them.
    pub fn token_to_piece(&self, id: u32) -> &[u8] {
        self.pieces.get(id as usize).map_or(&[], |p| p)
    }

    /// The piece as llama.cpp's `token_to_piece(special)` gives it: control and unknown
    /// tokens are empty unless `special`.
    pub fn piece(&self, id: u32, special: bool) -> Result<&[u8], TokenizerError> {
        let piece = self
            .pieces
            .get(id as usize)
            .ok_or(TokenizerError::IdOutOfRange {
                id,
                n_vocab: self.n_vocab(),
            })?;
        if !special && self.attrs[id as usize].intersects(TokenAttr::CONTROL | TokenAttr::UNKNOWN) {
            return Ok(&[]);
        }
        Ok(piece)
    }

    /// Token ids back to bytes as llama.cpp's `llama_detokenize` does: drops a leading BOS and
    /// trailing EOS the vocabulary adds when `remove_special`, renders control tokens when
    /// `unparse_special`, drops the SentencePiece space prefix, and applies the vocabulary's
    /// space clean-up.
    pub fn detokenize(
        &self,
        ids: &[u32],
        remove_special: bool,
        unparse_special: bool,
    ) -> Result<Vec<u8>, TokenizerError> {
        let mut ids = ids;
        let mut remove_space = self.add_space_prefix;
        if remove_special
            && self.add_bos
            && ids.first().is_some_and(|&t| Some(t) == self.special.bos)
        {
            remove_space = false;
            ids = &ids[1..];
        }
        if remove_special
            && self.add_eos
            && ids.last().is_some_and(|&t| Some(t) == self.special.eos)
        {
            ids = &ids[..ids.len() - 1];
        }
        let mut text = Vec::new();
        for &id in ids {
            let mut piece = self.piece(id, unparse_special)?;
            if remove_space {
                if let Some(rest) = piece.strip_prefix(b" ") {
                    piece = rest;
                }
            }
            remove_space = false;
            text.extend_from_slice(piece);
        }
        if self.clean_spaces {
            clean_spaces(&mut text);
        }
        Ok(text)
    }

    /// Tokenizes `text`. `add_special` adds BOS / EOS as the vocabulary asks
    /// ([`add_bos`](Self::add_bos)); `parse_special` recognises control tokens written in the
    /// text (`<|im_start|>`) as single ids instead of tokenizing their characters.
    pub fn encode(
        &self,
        text: &str,
        add_special: bool,
        parse_special: bool,
    ) -> Result<Vec<u32>, TokenizerError> {
        if u32::try_from(text.len()).is_err() {
            return Err(TokenizerError::TextTooLong { len: text.len() });
        }
        let fragments = self.partition(text, parse_special);
        let mut out = Vec::with_capacity(text.len() / 3 + 2);
        if add_special && self.add_bos {
            out.push(
                self.special
                    .bos
                    .ok_or(TokenizerError::MissingSpecial { which: "BOS" })?,
            );
        }
        match &self.bpe {
            None => {
                let mut prev_special = true;
                for f in fragments {
                    match f {
                        Fragment::Text(s, e) => {
                            let mut t = String::with_capacity(e - s + 3);
                            if self.add_space_prefix && prev_special {
                                t.push(' ');
                            }
                            t.push_str(&text[s..e]);
                            self.encode_spm(&t.replace(' ', "\u{2581}"), &mut out)?;
                            prev_special = false;
                        }
                        Fragment::Token(id) => {
                            out.push(id);
                            prev_special = true;
                        }
                    }
                }
            }
            Some(bpe) => {
                let mut merger = bpe::Merger::default();
                for f in fragments {
                    match f {
                        Fragment::Text(s, e) => {
                            let t = if self.escape_whitespaces {
                                Cow::Owned(text[s..e].replace(' ', "\u{2581}"))
                            } else {
                                Cow::Borrowed(&text[s..e])
                            };
                            self.encode_bpe(bpe, &t, &mut merger, &mut out)?;
                        }
                        Fragment::Token(id) => out.push(id),
                    }
                }
            }
        }
        if add_special && self.add_eos {
            out.push(
                self.special
                    .eos
                    .ok_or(TokenizerError::MissingSpecial { which: "EOS" })?,
            );
        }
        Ok(out)
    }

    /// Cuts special tokens out of `text`, longest first.
    fn partition(&self, text: &str, parse_special: bool) -> Vec<Fragment> {
        if text.is_empty() {
            return Vec::new();
        }
        let mut frags = vec![Fragment::Text(0, text.len())];
        let mut next = Vec::new();
        // Only the tokens that occur in the text (in the cache's order) can cut it.
        for index in self.special_trie.occurring(text.as_bytes()) {
            let id = self.special_cache[index as usize];
            let attr = self.attrs[id as usize];
            if !parse_special && attr.intersects(TokenAttr::CONTROL | TokenAttr::UNKNOWN) {
                continue;
            }
            let tok = &*self.texts[id as usize];
            next.clear();
            for &f in &frags {
                let Fragment::Text(start, end) = f else {
                    next.push(f);
                    continue;
                };
                let mut base = start;
                while let Some(pos) = text[base..end].find(tok) {
                    let m = base + pos;
                    let mut left_end = m;
                    if attr.intersects(TokenAttr::LSTRIP) {
                        while left_end > base && is_c_space(text.as_bytes()[left_end - 1]) {
                            left_end -= 1;
                        }
                    }
                    if left_end > base {
                        next.push(Fragment::Text(base, left_end));
                    }
                    next.push(Fragment::Token(id));
                    base = m + tok.len();
                    if attr.intersects(TokenAttr::RSTRIP) {
                        while base < end && is_c_space(text.as_bytes()[base]) {
                            base += 1;
                        }
                    }
                }
                if base < end {
                    next.push(Fragment::Text(base, end));
                }
            }
            std::mem::swap(&mut frags, &mut next);
        }
        frags
    }

    fn encode_spm(&self, text: &str, out: &mut Vec<u32>) -> Result<(), TokenizerError> {
        let pieces = spm::segment(text, |p| {
            self.token_id(p).map(|id| self.scores[id as usize])
        });
        for (s, e) in pieces {
            if let Some(id) = self.token_id(&text[s..e]) {
                out.push(id);
                continue;
            }
            for &b in &text.as_bytes()[s..e] {
                out.push(self.spm_byte_token(b)?);
            }
        }
        Ok(())
    }

    /// The byte-fallback token of a SentencePiece vocabulary: `<0xXX>`, else the byte itself.
    fn spm_byte_token(&self, b: u8) -> Result<u32, TokenizerError> {
        self.token_id(&format!("<0x{b:02X}>"))
            .or_else(|| {
                std::str::from_utf8(&[b])
                    .ok()
                    .and_then(|s| self.token_id(s))
            })
            .ok_or(TokenizerError::MissingByteToken { byte: b })
    }

    fn encode_bpe(
        &self,
        bpe: &BpeTables,
        text: &str,
        merger: &mut bpe::Merger,
        out: &mut Vec<u32>,
    ) -> Result<(), TokenizerError> {
        let n = self.texts.len() as u32;
        let chars = if bpe.byte_encode {
            Some(bpe::BYTE_TO_CHAR)
        } else {
            None
        };
        let mut encoded = String::new();
        for (s, e) in bpe.pre.split(text)? {
            let word = &text[s..e];
            if bpe.ignore_merges {
                let whole = match &chars {
                    Some(chars) => {
                        encoded.clear();
                        encoded.extend(word.bytes().map(|b| chars[b as usize]));
                        self.token_id(&encoded)
                    }
                    None => self.token_id(word),
                };
                if let Some(id) = whole {
                    out.push(id);
                    continue;
                }
            } else if bpe.kind == PreTokenizerKind::Gemma4 && word.bytes().all(|b| b == b'\n') {
                if let Some(id) = self.token_id(word) {
                    out.push(id);
                    continue;
                }
            }
            let rank_of = |l: u32, r: u32| bpe.merges.get(&(l, r)).copied();
            let symbols: Vec<(u32, u32, Option<u32>)> = if bpe.byte_encode {
                let units = word.bytes().map(|b| (1u32, bpe.byte_sid[b as usize]));
                merger
                    .merge(units, rank_of)
                    .map(|s| (s.start, s.len, s.sid))
                    .collect()
            } else {
                let units = word.chars().map(|c| {
                    let sid = self
                        .strings
                        .get(c.encode_utf8(&mut [0; 4]) as &str)
                        .copied();
                    (c.len_utf8() as u32, sid)
                });
                merger
                    .merge(units, rank_of)
                    .map(|s| (s.start, s.len, s.sid))
                    .collect()
            };
            for (start, len, sid) in symbols {
                if let Some(id) = sid.filter(|&id| id < n) {
                    out.push(id);
                    continue;
                }
                // Not a token: one token per byte where one exists, as llama.cpp does (a
                // byte-level vocabulary only has single-character tokens for printable ASCII).
                let bytes = &word.as_bytes()[start as usize..(start + len) as usize];
                for &b in bytes {
                    let id = if bpe.byte_encode {
                        if (0x21..=0x7E).contains(&b) {
                            std::str::from_utf8(&[b])
                                .ok()
                                .and_then(|s| self.token_id(s))
                        } else {
                            None
                        }
                    } else {
                        self.token_id(&format!("<0x{b:02X}>"))
                    };
                    out.extend(id);
                }
            }
        }
        Ok(())
    }
}

fn id_of_in(strings: &HashMap<Box<str>, u32>, text: &str, n: usize) -> Option<u32> {
    strings.get(text).copied().filter(|&id| (id as usize) < n)
}

/// U+2581 back to spaces (one allocation, of the exact size, for the many tokens without it).
fn unescape_whitespace(text: &str) -> Box<[u8]> {
    if text.contains('\u{2581}') {
        text.replace('\u{2581}', " ").into_bytes().into()
    } else {
        text.as_bytes().into()
    }
}

/// A byte-level BPE token's text back to bytes; characters outside GPT-2's byte alphabet
/// render as llama.cpp renders them (`[UNK_BYTE_0x..]`).
fn decode_byte_level(text: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(text.len());
    for c in text.chars() {
        match bpe::char_to_byte(c) {
            Some(b) => out.push(b),
            None => {
                out.extend_from_slice(b"[UNK_BYTE_0x");
                for b in c.encode_utf8(&mut [0; 4]).bytes() {
                    out.extend_from_slice(format!("{b:02x}").as_bytes());
                }
                out.extend_from_slice(text.as_bytes());
                out.push(b']');
            }
        }
    }
    out
}

/// The byte of a `<0xXX>` token (hex digits at 3..5, read like `strtol`: as many as parse).
pub(super) fn parse_byte_token(text: &str) -> u8 {
    let digits = text.as_bytes().get(3..).unwrap_or_default();
    let mut v = 0u8;
    for &d in digits.iter().take(2) {
        match (d as char).to_digit(16) {
            Some(x) => v = v.wrapping_mul(16).wrapping_add(x as u8),
            None => break,
        }
    }
    v
}

/// llama.cpp's `clean_spaces` passes over detokenized text: no space before `?!.,`, none
/// around a lone apostrophe, none before `'s`, `'m`, `'re`, `'ve`. In place, as llama.cpp
/// does, so a later step sees what an earlier one wrote.
pub(super) fn clean_spaces(text: &mut Vec<u8>) {
    let n = text.len();
    if n == 0 {
        return;
    }
    let mut total = 1;
    for i in 1..n {
        let x = text[i];
        if text[i - 1] == b' ' && matches!(x, b'?' | b'!' | b'.' | b',') {
            total -= 1;
        }
        text[total] = x;
        total += 1;
    }
    text.truncate(total);

    let n = text.len();
    let mut total = 1;
    let mut i = 1;
    while i < n {
        let x = text[i];
        if x == b'\'' && i + 1 < n && text[i - 1] == b' ' && text[i + 1] == b' ' {
            total -= 1;
            i += 1;
            text[i] = 0;
        }
        text[total] = x;
        total += 1;
        i += 1;
    }
    text.truncate(total);

    let n = text.len();
    let mut total = 1;
    for i in 1..n {
        let x = text[i];
        if text[i - 1] == b' ' && x == b'\'' && i + 1 < n {
            let x1 = text[i + 1];
            let drop = match x1 {
                b't' | b'd' => false,
                b's' | b'm' => true,
                _ => i + 2 < n && matches!((x1, text[i + 2]), (b'r', b'e') | (b'v', b'e')),
            };
            if drop {
                total -= 1;
            }
        }
        text[total] = x;
        total += 1;
    }
    text.truncate(total);
}
