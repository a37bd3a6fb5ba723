//! A vocabulary as the GGUF metadata describes it, and its per-token attributes.

/// Per-token attributes (llama.cpp's `llama_token_attr`), from `tokenizer.ggml.token_type` and
/// the loader's name-based fix-ups.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub struct TokenAttr(u16);

impl TokenAttr {
    /// The unknown token.
    pub const UNKNOWN: Self = Self(1 << 0);
    /// A token the model never uses.
    pub const UNUSED: Self = Self(1 << 1);
    /// An ordinary token.
    pub const NORMAL: Self = Self(1 << 2);
    /// A control token (BOS, EOS, chat markers): rendered only on request.
    pub const CONTROL: Self = Self(1 << 3);
    /// A user-defined token: always cut out of the text whole.
    pub const USER_DEFINED: Self = Self(1 << 4);
    /// A byte-fallback token (`<0x0A>`).
    pub const BYTE: Self = Self(1 << 5);
    /// Whitespace to the token's left is swallowed when it is cut out of text.
    pub const LSTRIP: Self = Self(1 << 7);
    /// Whitespace to the token's right is swallowed when it is cut out of text.
    pub const RSTRIP: Self = Self(1 << 8);

    /// Whether any of `other`'s bits are set.
    pub fn intersects(self, other: Self) -> bool {
        self.0 & other.0 != 0
    }

    /// The raw bits, llama.cpp's values.
    pub fn bits(self) -> u16 {
        self.0
    }

    pub(super) fn with(self, other: Self, on: bool) -> Self {
        if on {
            Self(self.0 | other.0)
        } else {
            Self(self.0 & !other.0)
        }
    }

    pub(super) fn from_token_type(t: i32) -> Self {
        match t {
            1 => Self::NORMAL,
            2 => Self::UNKNOWN,
            3 => Self::CONTROL,
            4 => Self::USER_DEFINED,
            5 => Self::UNUSED,
            6 => Self::BYTE,
            _ => Self(0),
        }
    }
}

impl std::ops::BitOr for TokenAttr {
    type Output = Self;
    fn bitor(self, rhs: Self) -> Self {
        Self(self.0 | rhs.0)
    }
}

/// The two tokenizer families.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum VocabKind {
    /// SentencePiece-style (`tokenizer.ggml.model = "llama"`).
    Spm,
    /// BPE (`gpt2`, `gemma4`).
    Bpe,
}

/// Special token ids. In a [`VocabSpec`] these are the raw values of the GGUF keys (`None`:
/// key absent); in a [`Tokenizer`](super::Tokenizer) they are the resolved ids (`None`: the vocabulary has none).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SpecialIds {
    /// Beginning of sequence (`tokenizer.ggml.bos_token_id`).
    pub bos: Option<u32>,
    /// End of sequence (`eos_token_id`).
    pub eos: Option<u32>,
    /// End of turn (`eot_token_id`; found by name when absent).
    pub eot: Option<u32>,
    /// End of message (`eom_token_id`).
    pub eom: Option<u32>,
    /// Unknown (`unknown_token_id`).
    pub unk: Option<u32>,
    /// Separator (`seperator_token_id`, sic).
    pub sep: Option<u32>,
    /// Padding (`padding_token_id`).
    pub pad: Option<u32>,
    /// Mask (`mask_token_id`).
    pub mask: Option<u32>,
    /// Fill-in-the-middle prefix (`fim_pre_token_id`, or the older `prefix_token_id`).
    pub fim_pre: Option<u32>,
    /// Fill-in-the-middle suffix (`fim_suf_token_id` / `suffix_token_id`).
    pub fim_suf: Option<u32>,
    /// Fill-in-the-middle middle (`fim_mid_token_id` / `middle_token_id`).
    pub fim_mid: Option<u32>,
    /// Fill-in-the-middle padding (`fim_pad_token_id`).
    pub fim_pad: Option<u32>,
    /// Repository marker (`fim_rep_token_id`).
    pub fim_rep: Option<u32>,
    /// File separator (`fim_sep_token_id`).
    pub fim_sep: Option<u32>,
}

/// The tokenizer metadata of a GGUF file as plain data: what [`Tokenizer::from_gguf`](super::Tokenizer::from_gguf) reads,
/// and what [`Tokenizer::from_spec`](super::Tokenizer::from_spec) builds a tokenizer from.
#[derive(Debug, Clone, Default)]
pub struct VocabSpec {
    /// `tokenizer.ggml.model`.
    pub model: String,
    /// `tokenizer.ggml.pre`.
    pub pre: Option<String>,
    /// `tokenizer.ggml.tokens`.
    pub tokens: Vec<String>,
    /// `tokenizer.ggml.scores`.
    pub scores: Option<Vec<f32>>,
    /// `tokenizer.ggml.token_type`.
    pub token_types: Option<Vec<i32>>,
    /// `tokenizer.ggml.merges`, each `"left right"`.
    pub merges: Option<Vec<String>>,
    /// The special token keys.
    pub special: SpecialIds,
    /// `tokenizer.ggml.add_bos_token`.
    pub add_bos: Option<bool>,
    /// `tokenizer.ggml.add_eos_token`.
    pub add_eos: Option<bool>,
    /// `tokenizer.ggml.add_space_prefix`.
    pub add_space_prefix: Option<bool>,
    /// `general.name` (llama.cpp keys a few per-token attributes on it).
    pub name: Option<String>,
    /// `general.architecture`.
    pub architecture: Option<String>,
}
