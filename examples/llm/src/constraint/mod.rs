//! Structured output: a grammar that every sampled token must keep satisfiable, so that the
//! completion parses as the grammar says (JSON, JSON that validates against a schema, a Lark or
//! GBNF grammar, a regular expression).
//!
//! The grammar engine is [llguidance](https://crates.io/crates/llguidance), llama.cpp's own
//! optional grammar backend. It was chosen over writing one and over outlines-core because it
//! computes the mask of allowed tokens lazily from a token trie and an Earley parser with a
//! derivative-based lexer (tens of microseconds per token on a 50 000-token vocabulary, no
//! precomputed index per schema, so a new schema costs milliseconds, not seconds), it reads JSON
//! Schema, Lark and regular expressions, and it reports the schema keywords it cannot enforce
//! as errors instead of ignoring them.
//!
//! The pieces:
//! * [`GrammarCompiler`]: built once per tokenizer (the token trie and the lexer's slices;
//!   tens of milliseconds), then compiles each request's [`GrammarSpec`] into a [`Grammar`].
//! * [`Grammar`]: a compiled grammar, cheap to clone and shared; set it as
//!   [`GenerateParams::constraint`](crate::session::GenerateParams::constraint) (or the
//!   batcher's [`Request::constraint`](crate::serve::Request::constraint)). Each generation
//!   starts its own parser state from it.
//! * [`gbnf_to_lark`]: llama.cpp's GBNF grammar format, translated to the Lark dialect the
//!   engine reads.
//!
//! How it samples: before each token, the logits of every token the grammar does not allow
//! are set to minus infinity, then the sampler runs as it would (penalties, top-k, top-p,
//! temperature: the allowed tokens keep their relative weights). Once the grammar is complete
//! and allows nothing more, only the end-of-generation tokens are allowed, so the generation
//! ends with [`Stop::Eog`](crate::session::Stop::Eog) right after the last character the
//! grammar needs; a generation cut by `max_tokens` first ends as usual and its text is an
//! unfinished prefix of a valid one.
//!
//! JSON is generated compactly (`,` and `:` without spaces, no newlines): a small model given
//! the freedom of JSON's whitespace can spend its whole budget on it.

mod gbnf;

use std::sync::Arc;

use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{self, TokEnv, TokRxInfo, TokTrie, TokenizerEnv};
use llguidance::{Matcher, ParserFactory, TokenParser};

use crate::tokenizer::{TokenAttr, Tokenizer};

pub use gbnf::{GbnfError, gbnf_to_lark};

/// The largest grammar or schema source accepted, in bytes (llama-server's own body limit is
/// larger; a schema this size already takes long to compile).
pub const MAX_GRAMMAR_BYTES: usize = 256 * 1024;

/// What to constrain the output to.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum GrammarSpec {
    /// Any JSON object (OpenAI's `response_format: {"type": "json_object"}`).
    JsonObject,
    /// JSON that validates against this JSON Schema (OpenAI's `json_schema`,
    /// llama.cpp's `--json-schema`).
    JsonSchema(serde_json::Value),
    /// A grammar in llguidance's Lark dialect (a `start` rule; `%json {...}` embeds a schema).
    Lark(String),
    /// A grammar in llama.cpp's GBNF (a `root` rule), as llama-server's `grammar` field and
    /// llama.cpp's `--grammar-file` take it.
    Gbnf(String),
    /// Text matching this regular expression (Rust `regex` syntax), whole.
    Regex(String),
}

impl GrammarSpec {
    /// A short name for messages and logs: `json_object`, `json_schema`, `lark`, `gbnf` or
    /// `regex`.
    pub fn kind(&self) -> &'static str {
        match self {
            GrammarSpec::JsonObject => "json_object",
            GrammarSpec::JsonSchema(_) => "json_schema",
            GrammarSpec::Lark(_) => "lark",
            GrammarSpec::Gbnf(_) => "gbnf",
            GrammarSpec::Regex(_) => "regex",
        }
    }
}

/// Why a grammar could not be compiled or enforced.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GrammarError {
    /// The tokenizer could not be turned into the engine's token trie.
    #[error("the vocabulary cannot be used for constrained decoding: {0}")]
    Vocabulary(String),
    /// The source is larger than [`MAX_GRAMMAR_BYTES`].
    #[error("the {kind} is {bytes} bytes, more than the {max}-byte limit")]
    TooLarge {
        /// What it was (`json_schema`, `gbnf`, ...).
        kind: &'static str,
        /// Its size.
        bytes: usize,
        /// [`MAX_GRAMMAR_BYTES`].
        max: usize,
    },
    /// A GBNF grammar that does not parse.
    #[error(transparent)]
    Gbnf(#[from] GbnfError),
    /// The engine refused the grammar or schema: a syntax error, a schema keyword it cannot
    /// enforce (named in the message), a grammar beyond its limits on size or lexer states.
    #[error("the {kind} cannot be enforced: {message}")]
    Compile {
        /// What it was.
        kind: &'static str,
        /// The engine's reason.
        message: String,
    },
    /// The parser failed while generating (its per-token limits, or a token it rejected).
    #[error("the grammar failed while generating: {0}")]
    Runtime(String),
}

/// Compiles grammars for one tokenizer. Building it scans the vocabulary once (tens of
/// milliseconds for 50 000 tokens); keep it beside the model and compile each request's grammar
/// with it. `Send + Sync`: one compiler serves every thread.
pub struct GrammarCompiler {
    factory: Arc<ParserFactory>,
    n_vocab: usize,
}

impl std::fmt::Debug for GrammarCompiler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GrammarCompiler")
            .field("n_vocab", &self.n_vocab)
            .finish_non_exhaustive()
    }
}

/// The tokenizer as the engine sees it: the trie of every token's bytes (control tokens
/// marked, so that no grammar text can produce them), and the tokenizer itself for the text
/// the grammar forces.
struct TokenizerView {
    trie: TokTrie,
    tokenizer: Arc<Tokenizer>,
}

impl TokenizerEnv for TokenizerView {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<toktrie::TokenId> {
        match std::str::from_utf8(s) {
            Ok(text) => match self.tokenizer.encode(text, false, false) {
                Ok(ids) => ids,
                Err(_) => self.trie.greedy_tokenize(s),
            },
            // A piece of a character: the tokenizer takes text only.
            Err(_) => self.trie.greedy_tokenize(s),
        }
    }
}

impl GrammarCompiler {
    /// A compiler for `tokenizer`'s vocabulary; its end-of-generation tokens are what a
    /// complete grammar allows.
    pub fn new(tokenizer: &Arc<Tokenizer>) -> Result<GrammarCompiler, GrammarError> {
        let n_vocab = tokenizer.n_vocab();
        let eog = tokenizer.eog_ids();
        let Some(&first_eog) = eog.first() else {
            return Err(GrammarError::Vocabulary(
                "it has no end-of-generation token, so a finished grammar could not end the \
                 generation"
                    .into(),
            ));
        };
        let words: Vec<Vec<u8>> = (0..n_vocab as u32)
            .map(|id| {
                let piece = tokenizer.token_to_piece(id);
                if tokenizer
                    .token_attr(id)
                    .intersects(TokenAttr::CONTROL | TokenAttr::UNKNOWN)
                {
                    // The engine's marker for special tokens: never part of text.
                    let mut w = Vec::with_capacity(piece.len() + 1);
                    w.push(TokTrie::SPECIAL_TOKEN_MARKER);
                    w.extend_from_slice(piece);
                    w
                } else {
                    piece.to_vec()
                }
            })
            .collect();
        let vocab_size = u32::try_from(n_vocab)
            .map_err(|_| GrammarError::Vocabulary(format!("{n_vocab} tokens")))?;
        let info = TokRxInfo {
            vocab_size,
            tok_eos: first_eog,
            tok_bos: tokenizer.bos(),
            tok_pad: None,
            tok_unk: None,
            tok_end_of_turn: None,
        };
        let trie = TokTrie::from(&info, &words).with_eos_tokens(eog);
        let env: TokEnv = Arc::new(TokenizerView {
            trie,
            tokenizer: tokenizer.clone(),
        });
        let mut factory =
            ParserFactory::new_simple(&env).map_err(|e| GrammarError::Vocabulary(e.to_string()))?;
        // Errors are returned, never printed by the engine.
        factory.quiet();
        Ok(GrammarCompiler {
            factory: Arc::new(factory),
            n_vocab,
        })
    }

    /// Compiles `spec`. A schema keyword the engine cannot enforce is an error naming it,
    /// never a looser constraint.
    pub fn compile(&self, spec: &GrammarSpec) -> Result<Grammar, GrammarError> {
        let kind = spec.kind();
        let too_large = |bytes: usize| {
            (bytes > MAX_GRAMMAR_BYTES).then_some(GrammarError::TooLarge {
                kind,
                bytes,
                max: MAX_GRAMMAR_BYTES,
            })
        };
        let top = match spec {
            GrammarSpec::JsonObject => json_grammar(serde_json::json!({"type": "object"})),
            GrammarSpec::JsonSchema(schema) => {
                let text = serde_json::to_string(schema).map_err(|e| GrammarError::Compile {
                    kind,
                    message: e.to_string(),
                })?;
                if let Some(e) = too_large(text.len()) {
                    return Err(e);
                }
                if !schema.is_object() && !schema.is_boolean() {
                    return Err(GrammarError::Compile {
                        kind,
                        message: "a JSON Schema is an object (or true/false)".into(),
                    });
                }
                json_grammar(schema.clone())
            }
            GrammarSpec::Lark(src) | GrammarSpec::Gbnf(src) | GrammarSpec::Regex(src) => {
                if let Some(e) = too_large(src.len()) {
                    return Err(e);
                }
                match spec {
                    GrammarSpec::Lark(_) => TopLevelGrammar::from_lark(src.clone()),
                    GrammarSpec::Gbnf(_) => TopLevelGrammar::from_lark(gbnf_to_lark(src)?),
                    _ => TopLevelGrammar::from_regex(src),
                }
            }
        };
        let parser = self
            .factory
            .create_parser(top)
            .map_err(|e| GrammarError::Compile {
                kind,
                message: e.to_string(),
            })?;
        Ok(Grammar {
            inner: Arc::new(GrammarInner {
                parser,
                kind,
                n_vocab: self.n_vocab,
            }),
        })
    }
}

/// The engine's grammar for `schema`, with compact separators and no free whitespace.
fn json_grammar(mut schema: serde_json::Value) -> TopLevelGrammar {
    strict_formats(&mut schema);
    if let Some(obj) = schema.as_object_mut() {
        obj.entry("x-guidance").or_insert(serde_json::json!({
            "whitespace_flexible": false,
            "item_separator": ",",
            "key_separator": ":",
        }));
    }
    TopLevelGrammar::from_json_schema(schema)
}

/// The engine's `date`, `time` and `date-time` accept a leap second (`:60`) at any minute
/// and February 29 in any year, which validators refuse (RFC 3339 allows `:60` only where a
/// leap second was inserted). Each such `format` is replaced by a pattern that admits a subset
/// of the valid values, without either: every output still validates.
fn strict_formats(schema: &mut serde_json::Value) {
    const DATE: &str = "[0-9]{4}-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12][0-9]|3[01])|(?:0[469]|11)-(?:0[1-9]|[12][0-9]|30)|02-(?:0[1-9]|1[0-9]|2[0-8]))";
    const TIME: &str = "(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\\.[0-9]{1,6})?(?:[zZ]|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])";
    match schema {
        serde_json::Value::Object(obj) => {
            let pattern = match obj.get("format").and_then(|f| f.as_str()) {
                Some("date") => Some(format!("^{DATE}$")),
                Some("time") => Some(format!("^{TIME}$")),
                Some("date-time") => Some(format!("^{DATE}[tT]{TIME}$")),
                _ => None,
            };
            if let (Some(p), false) = (pattern, obj.contains_key("pattern")) {
                obj.remove("format");
                obj.insert("pattern".into(), p.into());
            }
            for (key, value) in obj.iter_mut() {
                // Data, not schemas.
                if !matches!(key.as_str(), "const" | "enum" | "default" | "examples") {
                    strict_formats(value);
                }
            }
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(strict_formats),
        _ => {}
    }
}

struct GrammarInner {
    parser: TokenParser,
    kind: &'static str,
    n_vocab: usize,
}

/// A compiled grammar: clones share it. Each generation that uses it starts a fresh parser
/// state from it.
#[derive(Clone)]
pub struct Grammar {
    inner: Arc<GrammarInner>,
}

impl std::fmt::Debug for Grammar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Grammar")
            .field("kind", &self.inner.kind)
            .finish_non_exhaustive()
    }
}

impl PartialEq for Grammar {
    /// The same compiled grammar (clones of one [`GrammarCompiler::compile`]).
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }
}

impl Grammar {
    /// What it was compiled from (`json_schema`, `gbnf`, ...).
    pub fn kind(&self) -> &'static str {
        self.inner.kind
    }

    /// A fresh parser state at the start of the output.
    pub fn start(&self) -> Constraint {
        Constraint {
            matcher: Matcher::new(Ok(self.inner.parser.clone())),
            n_vocab: self.inner.n_vocab,
        }
    }

    /// Whether `text` is a complete output of the grammar (tokenized as the model would
    /// write it, so a text the model could write only with other tokens may be refused).
    pub fn accepts(&self, tokenizer: &Tokenizer, text: &str) -> Result<bool, GrammarError> {
        let ids = tokenizer
            .encode(text, false, false)
            .map_err(|e| GrammarError::Runtime(e.to_string()))?;
        let mut c = self.start();
        for &id in &ids {
            if !c.allows(id)? {
                return Ok(false);
            }
            c.commit(id)?;
        }
        c.is_accepting()
    }
}

/// One generation's parser state: which tokens may come next, advanced by each token
/// generated.
pub struct Constraint {
    matcher: Matcher,
    n_vocab: usize,
}

impl std::fmt::Debug for Constraint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Constraint")
            .field("stopped", &self.matcher.is_stopped())
            .finish_non_exhaustive()
    }
}

impl Constraint {
    fn runtime(&self, e: impl std::fmt::Display) -> GrammarError {
        GrammarError::Runtime(e.to_string())
    }

    /// Sets the logits of every token the grammar does not allow next to minus infinity
    /// (ids at or past the vocabulary's size too). Once the grammar is complete, only the
    /// end-of-generation tokens remain.
    pub fn mask(&mut self, logits: &mut [f32]) -> Result<(), GrammarError> {
        let allowed = self
            .matcher
            .compute_mask_or_eos()
            .map_err(|e| self.runtime(e))?;
        if allowed.is_zero() {
            return Err(GrammarError::Runtime(
                "no token can continue the output".into(),
            ));
        }
        let words = allowed.as_slice();
        for (w, chunk) in logits.chunks_mut(32).enumerate() {
            let bits = words.get(w).copied().unwrap_or(0);
            if bits == u32::MAX && chunk.len() == 32 {
                continue;
            }
            for (b, l) in chunk.iter_mut().enumerate() {
                if bits & (1 << b) == 0 {
                    *l = f32::NEG_INFINITY;
                }
            }
        }
        Ok(())
    }

    /// Whether the grammar allows `token` next.
    pub fn allows(&mut self, token: u32) -> Result<bool, GrammarError> {
        if token as usize >= self.n_vocab {
            return Ok(false);
        }
        let allowed = self
            .matcher
            .compute_mask_or_eos()
            .map_err(|e| self.runtime(e))?;
        Ok(allowed.is_allowed(token))
    }

    /// Advances past `token` (which the grammar must allow).
    pub fn commit(&mut self, token: u32) -> Result<(), GrammarError> {
        self.matcher
            .consume_token(token)
            .map_err(|e| self.runtime(e))
    }

    /// Whether the output so far is complete (an end-of-generation token is allowed now).
    pub fn is_accepting(&mut self) -> Result<bool, GrammarError> {
        if self.matcher.is_stopped() {
            return Ok(true);
        }
        self.matcher.is_accepting().map_err(|e| self.runtime(e))
    }
}
