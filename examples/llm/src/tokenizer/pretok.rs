//! Pre-tokenizers of byte-level BPE vocabularies: the regular expressions that cut text into
//! words before the merges run, selected by the GGUF key `tokenizer.ggml.pre`.
//!
//! llama.cpp applies a list of expressions one after the other; each expression cuts every piece
//! the previous ones left into its matches and the gaps between them (both kept, in order). The
//! expressions are the ones the models' `tokenizer.json` files declare (case-insensitive
//! contractions spelt out as `[sS]`, as llama.cpp does), and an expression only ever sees the
//! piece it cuts, so `$` and look-ahead stop at the piece's end.
//!
//! The look-ahead `\s+(?!\S)` (a run of white space, less its last character when a non-space
//! follows) is the only construct these expressions need beyond a plain regular expression.
//! fancy-regex runs look-around in a backtracking VM whose stack is capped at a million entries
//! (a white-space run that long fails to match), so the expressions below spell that alternative
//! as `\s+` and [`PreTokenizer::split`] gives the last character back afterwards; with no
//! look-around left, fancy-regex hands the whole expression to the linear-time `regex` engine.
//! Giving the character back is exact: the alternatives before `\s+` cannot match a white-space
//! run without a newline, and the next search starts at the character given back, as the
//! backtracking engine's next search would.

use fancy_regex::Regex;

use super::error::TokenizerError;

/// The GPT-2 expression, shared by many pre-tokenizers; `\s+` stands for `\s+(?!\S)`.
const GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+";

/// Llama 3's expression (digits in runs of up to three); the final `\s+` stands for
/// `\s+(?!\S)|\s+`.
const LLAMA3: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+";

/// Qwen 2's expression: Llama 3's with single digits.
const QWEN2: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+";

/// Qwen 3.5's expression: Qwen 2's with combining marks kept inside words.
const QWEN35: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+";

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

/// How a white-space-only match of an expression is adjusted (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Lookahead {
    /// The expression has no `\s+(?!\S)`.
    None,
    /// GPT-2's `\s+(?!\S)` without a plain `\s+` after it: any white-space run.
    Gpt2,
    /// Llama 3's `\s*[\r\n]+|\s+(?!\S)|\s+`: runs without a newline (the others matched
    /// `\s*[\r\n]+`).
    Llama3,
}

/// A compiled pre-tokenizer: its expressions in the order they apply.
#[derive(Debug)]
pub(crate) struct PreTokenizer {
    regexes: Vec<(Regex, Lookahead)>,
}

impl PreTokenizer {
    pub(crate) fn new(kind: PreTokenizerKind) -> Result<Self, TokenizerError> {
        use Lookahead::{Gpt2 as G, Llama3 as L, None as N};
        use PreTokenizerKind as K;
        let gpt2 = (GPT2, G);
        let patterns: &[(&str, Lookahead)] = match kind {
            K::Default => &[
                (r"[\p{P}\$\+<=>\^~\|]+", N),
                gpt2,
                (r"\p{N}+", N),
                (r"[0-9][0-9][0-9]", N),
            ],
            K::Llama3 | K::Dbrx => &[(LLAMA3, L)],
            K::Qwen2 => &[(QWEN2, L)],
            K::Qwen35 => &[(QWEN35, L)],
            K::Gpt2 => &[gpt2],
            K::StarCoder => &[(r"\p{N}", N), gpt2],
            K::Falcon => &[(r"[\p{P}\$\+<=>\^~\|`]+", N), gpt2, (r"[0-9][0-9][0-9]", N)],
            K::DeepSeekLlm => &[
                (r"[\r\n]", N),
                (DEEPSEEK_LETTERS, N),
                (DEEPSEEK_PUNCT, N),
                (r"\s+$", N),
                (DEEPSEEK_CJK, N),
                (r"\p{N}+", N),
            ],
            K::DeepSeekCoder => &[
                (r"[\r\n]", N),
                (r"\s?\p{L}+", N),
                (r"\s?\p{P}+", N),
                (DEEPSEEK_CJK, N),
                (r"\p{N}", N),
            ],
            K::Gemma4 => &[(r"[^\n]+|[\n]+", N)],
        };
        let regexes = patterns
            .iter()
            .map(|&(p, la)| {
                Regex::new(p)
                    .map(|re| (re, la))
                    .map_err(|e| TokenizerError::Regex {
                        pattern: p.to_owned(),
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
        for (re, lookahead) in &self.regexes {
            next.clear();
            for &(start, end) in &pieces {
                let piece = &text[start..end];
                let (mut pos, mut last) = (0, 0);
                while pos < piece.len() {
                    let found =
                        re.find_from_pos(piece, pos)
                            .map_err(|e| TokenizerError::Regex {
                                pattern: re.as_str().to_owned(),
                                message: e.to_string(),
                            })?;
                    let Some(m) = found else { break };
                    let (m_start, mut m_end) = (m.start(), m.end());
                    if m_end == m_start {
                        // An empty match cuts nothing; step over one character.
                        pos = m_end + piece[m_end..].chars().next().map_or(1, char::len_utf8);
                        continue;
                    }
                    if m_end < piece.len() {
                        m_end = give_back(&piece[m_start..m_end], *lookahead) + m_start;
                    }
                    if m_start > last {
                        next.push((start + last, start + m_start));
                    }
                    next.push((start + m_start, start + m_end));
                    last = m_end;
                    pos = m_end;
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

/// The length `\s+(?!\S)` would have matched for a match `m` that a non-space follows:
/// a white-space run of two or more characters loses its last one.
fn give_back(m: &str, lookahead: Lookahead) -> usize {
    let applies = match lookahead {
        Lookahead::None => false,
        Lookahead::Gpt2 => true,
        Lookahead::Llama3 => !m.contains(['\r', '\n']),
    };
    let mut chars = m.char_indices().rev();
    match (chars.next(), chars.next()) {
        (Some((last, _)), Some(_)) if applies && m.chars().all(char::is_whitespace) => last,
        _ => m.len(),
    }
}
