//! Token ids to text as they are generated.
//!
//! A token may end inside a multi-byte UTF-8 character (byte-fallback tokens always carry single
//! bytes, byte-level BPE tokens can split a character too), so the decoder holds back the bytes
//! of an incomplete character until the tokens that complete it arrive. Bytes that can never
//! become valid UTF-8 come out as U+FFFD at once instead of stalling the stream.

use std::ops::Deref;

use super::error::TokenizerError;
use super::vocab::Tokenizer;

/// Streaming detokenizer over a [`Tokenizer`] (borrowed, `&Tokenizer`, or shared,
/// `Arc<Tokenizer>`): [`push`](Self::push) each generated id, print what it returns, and call
/// [`finish`](Self::finish) at the end.
#[derive(Debug)]
pub struct StreamDecoder<T: Deref<Target = Tokenizer>> {
    tokenizer: T,
    pending: Vec<u8>,
    render_special: bool,
    preserved: Vec<u32>,
}

impl<T: Deref<Target = Tokenizer>> StreamDecoder<T> {
    /// A decoder that renders control tokens (end-of-turn markers and the like) as nothing, as
    /// llama.cpp's tools print generated text.
    pub fn new(tokenizer: T) -> Self {
        Self {
            tokenizer,
            pending: Vec::new(),
            render_special: false,
            preserved: Vec::new(),
        }
    }

    /// Renders control and unknown tokens as their text (`<|im_end|>`) when `yes`.
    pub fn render_special(mut self, yes: bool) -> Self {
        self.render_special = yes;
        self
    }

    /// Renders these control tokens as their text even when others are rendered as nothing
    /// (llama.cpp's `preserved_tokens`: a tool-call format's markers, such as Mistral's
    /// `[TOOL_CALLS]`, which its reader must see).
    pub fn preserve(mut self, ids: &[u32]) -> Self {
        self.preserved = ids.to_vec();
        self
    }

    /// Adds one token and returns the text that is now complete (possibly empty).
    pub fn push(&mut self, id: u32) -> Result<String, TokenizerError> {
        let special = self.render_special || self.preserved.contains(&id);
        let piece = self.tokenizer.piece(id, special)?;
        self.pending.extend_from_slice(piece);
        Ok(self.drain(false))
    }

    /// Ends the stream: returns the held-back bytes, an incomplete character as U+FFFD.
    pub fn finish(&mut self) -> String {
        self.drain(true)
    }

    /// Bytes held back waiting for the rest of a character.
    pub fn pending(&self) -> &[u8] {
        &self.pending
    }

    fn drain(&mut self, flush: bool) -> String {
        let mut out = String::new();
        let mut rest: &[u8] = &self.pending;
        loop {
            match std::str::from_utf8(rest) {
                Ok(s) => {
                    out.push_str(s);
                    rest = &[];
                    break;
                }
                Err(e) => {
                    let (valid, after) = rest.split_at(e.valid_up_to());
                    // The prefix was just validated.
                    out.push_str(std::str::from_utf8(valid).unwrap_or_default());
                    match e.error_len() {
                        Some(n) => {
                            out.push('\u{FFFD}');
                            rest = &after[n..];
                        }
                        None if flush => {
                            out.push('\u{FFFD}');
                            rest = &[];
                            break;
                        }
                        None => {
                            rest = after;
                            break;
                        }
                    }
                }
            }
        }
        let keep = rest.len();
        let len = self.pending.len();
        self.pending.drain(..len - keep);
        out
    }
}
