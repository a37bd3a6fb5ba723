//! Pre-tokenizers of byte-level BPE vocabularies: the regular expressions that cut text into
//! words before the merges run, selected by the GGUF key `tokenizer.ggml.pre`.
//!
//! llama.cpp applies a list of expressions one after the other; each expression cuts every piece
//! the previous ones left into its matches and the gaps between them (both kept, in order). The
//! expressions are the ones the models' `tokenizer.json` files declare (case-insensitive
//! contractions spelt out as `[sS]`, as llama.cpp does), and an expression only ever sees the
//! piece it cuts, so `$` and look-ahead stop at the piece's end.

use fancy_regex::Regex;

use super::TokenizerError;

/// The GPT-2 expression, shared by many pre-tokenizers.
const GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";

/// Llama 3's expression (digits in runs of up to three).
const LLAMA3: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Qwen 2's expression: Llama 3's with single digits.
const QWEN2: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Qwen 3.5's expression: Qwen 2's with combining marks kept inside words.
const QWEN35: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// DeepSeek's letter class, code point ranges as its tokenizer declares them.
const DEEPSEEK_LETTERS: &str = r"\s?[A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-ՖႠ-ჅᎠ-Ᏽᏸ-ᏽᲐ-ᲺᲽ-Ჿᴀ-ᴫᵫ-ᵷᵹ-ᶚḀ-ἕἘ-Ἕἠ-ὅὈ-Ὅὐ-ὗὙὛὝὟ-ώᾀ-ᾴᾶ-ᾼιῂ-ῄῆ-ῌῐ-ΐῖ-Ίῠ-Ῥῲ-ῴῶ-ῼℂℇℊ-ℓℕℙ-ℝℤΩℨK-ℭℯ-ℴℹℼ-ℿⅅ-ⅉⅎↃↄⰀ-ⱻⱾ-ⳤⳫ-ⳮⳲⳳꙀ-ꙭꚀ-ꚛꜢ-ꝯꝱ-ꞇꞋ-ꞎꭰ-ꮿﬀ-ﬆﬓ-ﬗＡ-Ｚａ-ｚ𐐀-𐑏𐒰-𐓓𐓘-𐓻𐲀-𐲲𐳀-𐳲𑢠-𑣟𞤀-𞥃]+";

// llama.cpp runs the expressions that use no \p{..} class on the code points with every
// non-ASCII white space replaced by U+000B, so such a character never matches a literal class
// that happens to contain it. The two DeepSeek classes below that span white space
// (U+3000, and U+1680 / U+2000.. inside U+0800..U+4E00) are intersected with \S to match that.
/// DeepSeek's punctuation class.
const DEEPSEEK_PUNCT: &str = r"\s?[!-/:-~！-／：-～‘-‟　-。&&\S]+";
/// DeepSeek's CJK / Hangul class.
const DEEPSEEK_CJK: &str = r"[一-龥ࠀ-一가-퟿&&\S]+";

/// Which pre-tokenizer a BPE vocabulary uses (llama.cpp's `LLAMA_VOCAB_PRE_TYPE_*`), for the
/// ones this crate supports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum PreTokenizerKind {
    /// No `tokenizer.ggml.pre` or `default`: llama.cpp's fallback expressions.
    Default,
    /// Llama 3 (`llama-bpe`, `llama3`, `llama-v3`, ...).
    Llama3,
    /// DBRX and Smaug: Llama 3's expression without Llama 3's BOS default.
    Dbrx,
    /// Qwen 2 (`qwen2`, `deepseek-r1-qwen`, ...), StableLM 2 and Hunyuan.
    Qwen2,
    /// Qwen 3.5.
    Qwen35,
    /// GPT-2 (`gpt-2`, `phi-2`, ...), MPT, OLMo, Jais.
    Gpt2,
    /// StarCoder, Refact, Command-R, SmolLM, CodeShell, EXAONE, Minerva: single digits, then
    /// GPT-2.
    StarCoder,
    /// Falcon.
    Falcon,
    /// DeepSeek LLM.
    DeepSeekLlm,
    /// DeepSeek Coder.
    DeepSeekCoder,
    /// Gemma 4: SentencePiece-style BPE over raw UTF-8 (spaces as U+2581), cut only at newlines.
    Gemma4,
}

/// Flags a `tokenizer.ggml.pre` value sets besides the expressions.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PreFlags {
    pub kind: PreTokenizerKind,
    /// Words found whole in the vocabulary skip the merges.
    pub ignore_merges: bool,
    /// The default of `add_bos` when the file does not say.
    pub add_bos: bool,
    /// Detokenization removes spaces before punctuation (llama.cpp's `clean_spaces`).
    pub clean_spaces: bool,
}

/// Maps a `tokenizer.ggml.pre` value (absent = `default`) to the pre-tokenizer, as llama.cpp's
/// vocabulary loader does for the names this crate supports.
pub(crate) fn flags_for(pre: &str) -> Result<PreFlags, TokenizerError> {
    use PreTokenizerKind as K;
    let f = |kind, ignore_merges, add_bos, clean_spaces| PreFlags {
        kind,
        ignore_merges,
        add_bos,
        clean_spaces,
    };
    Ok(match pre {
        "default" => f(K::Default, false, false, true),
        "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral" | "midm-2.0"
        | "lfm2" | "jina-v5-nano" => f(K::Llama3, true, true, true),
        "dbrx" | "smaug-bpe" => f(K::Dbrx, false, false, true),
        "qwen2" | "deepseek-r1-qwen" | "kormo" | "f2llmv2" => f(K::Qwen2, false, false, false),
        "stablelm2" | "megrez" => f(K::Qwen2, false, false, true),
        "hunyuan" | "solar-open" => f(K::Qwen2, false, false, false),
        "qwen35" => f(K::Qwen35, false, false, false),
        "gpt-2" | "phi-2" | "jina-es" | "jina-de" | "gigachat" | "jina-v2-es" | "jina-v2-de"
        | "a.x-4.0" | "mellum" | "modern-bert" | "mpt" | "olmo" | "jais" | "exaone4" => {
            f(K::Gpt2, false, false, true)
        }
        "trillion" | "granite-docling" => f(K::Gpt2, false, false, false),
        "starcoder" | "refact" | "codeshell" | "exaone" | "minerva-7b" | "mellum2" => {
            f(K::StarCoder, false, false, true)
        }
        "command-r" | "smollm" => f(K::StarCoder, false, false, false),
        "falcon" => f(K::Falcon, false, false, true),
        "deepseek-llm" => f(K::DeepSeekLlm, false, false, false),
        "deepseek-coder" => f(K::DeepSeekCoder, false, false, false),
        "gemma4" => f(K::Gemma4, false, false, true),
        other => {
            return Err(TokenizerError::UnsupportedPreTokenizer {
                pre: other.to_owned(),
            });
        }
    })
}

/// A compiled pre-tokenizer: its expressions in the order they apply.
#[derive(Debug)]
pub(crate) struct PreTokenizer {
    regexes: Vec<Regex>,
}

impl PreTokenizer {
    pub(crate) fn new(kind: PreTokenizerKind) -> Result<Self, TokenizerError> {
        use PreTokenizerKind as K;
        let patterns: &[&str] = match kind {
            K::Default => &[r"[\p{P}\$\+<=>\^~\|]+", GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"],
            K::Llama3 | K::Dbrx => &[LLAMA3],
            K::Qwen2 => &[QWEN2],
            K::Qwen35 => &[QWEN35],
            K::Gpt2 => &[GPT2],
            K::StarCoder => &[r"\p{N}", GPT2],
            K::Falcon => &[r"[\p{P}\$\+<=>\^~\|`]+", GPT2, r"[0-9][0-9][0-9]"],
            K::DeepSeekLlm => &[
                r"[\r\n]",
                DEEPSEEK_LETTERS,
                DEEPSEEK_PUNCT,
                r"\s+$",
                DEEPSEEK_CJK,
                r"\p{N}+",
            ],
            K::DeepSeekCoder => &[
                r"[\r\n]",
                r"\s?\p{L}+",
                r"\s?\p{P}+",
                DEEPSEEK_CJK,
                r"\p{N}",
            ],
            K::Gemma4 => &[r"[^\n]+|[\n]+"],
        };
        let regexes = patterns
            .iter()
            .map(|p| {
                Regex::new(p).map_err(|e| TokenizerError::Regex {
                    pattern: (*p).to_owned(),
                    message: e.to_string(),
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self { regexes })
    }

    /// Cuts `text` into words, returned as byte ranges of `text` in order, covering it whole.
    pub(crate) fn split(&self, text: &str) -> Result<Vec<(usize, usize)>, TokenizerError> {
        let mut pieces = vec![(0, text.len())];
        let mut next = Vec::new();
        for re in &self.regexes {
            next.clear();
            for &(start, end) in &pieces {
                let piece = &text[start..end];
                let mut last = 0;
                for m in re.find_iter(piece) {
                    let m = m.map_err(|e| TokenizerError::Regex {
                        pattern: re.as_str().to_owned(),
                        message: e.to_string(),
                    })?;
                    if m.start() == m.end() {
                        continue;
                    }
                    if m.start() > last {
                        next.push((start + last, start + m.start()));
                    }
                    next.push((start + m.start(), start + m.end()));
                    last = m.end();
                }
                if last < piece.len() {
                    next.push((start + last, end));
                }
            }
            std::mem::swap(&mut pieces, &mut next);
        }
        Ok(pieces)
    }
}
