//! The GGUF keys the tokenizer reads, gathered into a [`VocabSpec`].

use super::{SpecialIds, TokenizerError, VocabSpec};

/// Typed access to GGUF metadata: `Ok(None)` for an absent key, an error for a key of the wrong
/// type.
pub(crate) trait Metadata {
    fn string(&self, key: &'static str) -> Result<Option<String>, TokenizerError>;
    fn u32(&self, key: &'static str) -> Result<Option<u32>, TokenizerError>;
    fn bool(&self, key: &'static str) -> Result<Option<bool>, TokenizerError>;
    fn strings(&self, key: &'static str) -> Result<Option<Vec<String>>, TokenizerError>;
    /// A numeric array as f32 (scores are f32, or i32 in some files).
    fn f32s(&self, key: &'static str) -> Result<Option<Vec<f32>>, TokenizerError>;
    fn i32s(&self, key: &'static str) -> Result<Option<Vec<i32>>, TokenizerError>;
}

pub(crate) fn read_spec(m: &impl Metadata) -> Result<VocabSpec, TokenizerError> {
    let model = m
        .string("tokenizer.ggml.model")?
        .ok_or(TokenizerError::MissingKey {
            key: "tokenizer.ggml.model",
        })?;
    let tokens = m
        .strings("tokenizer.ggml.tokens")?
        .ok_or(TokenizerError::MissingKey {
            key: "tokenizer.ggml.tokens",
        })?;
    let special = SpecialIds {
        bos: m.u32("tokenizer.ggml.bos_token_id")?,
        eos: m.u32("tokenizer.ggml.eos_token_id")?,
        eot: m.u32("tokenizer.ggml.eot_token_id")?,
        eom: m.u32("tokenizer.ggml.eom_token_id")?,
        unk: m.u32("tokenizer.ggml.unknown_token_id")?,
        sep: m.u32("tokenizer.ggml.seperator_token_id")?,
        pad: m.u32("tokenizer.ggml.padding_token_id")?,
        mask: m.u32("tokenizer.ggml.mask_token_id")?,
        // The older prefix/suffix/middle keys are read after the new ones and win, as in
        // llama.cpp.
        fim_pre: m
            .u32("tokenizer.ggml.prefix_token_id")?
            .or(m.u32("tokenizer.ggml.fim_pre_token_id")?),
        fim_suf: m
            .u32("tokenizer.ggml.suffix_token_id")?
            .or(m.u32("tokenizer.ggml.fim_suf_token_id")?),
        fim_mid: m
            .u32("tokenizer.ggml.middle_token_id")?
            .or(m.u32("tokenizer.ggml.fim_mid_token_id")?),
        fim_pad: m.u32("tokenizer.ggml.fim_pad_token_id")?,
        fim_rep: m.u32("tokenizer.ggml.fim_rep_token_id")?,
        fim_sep: m.u32("tokenizer.ggml.fim_sep_token_id")?,
    };
    Ok(VocabSpec {
        model,
        pre: m.string("tokenizer.ggml.pre")?,
        tokens,
        scores: m.f32s("tokenizer.ggml.scores")?,
        token_types: m.i32s("tokenizer.ggml.token_type")?,
        merges: m.strings("tokenizer.ggml.merges")?,
        special,
        add_bos: m.bool("tokenizer.ggml.add_bos_token")?,
        add_eos: m.bool("tokenizer.ggml.add_eos_token")?,
        add_space_prefix: m.bool("tokenizer.ggml.add_space_prefix")?,
        name: m.string("general.name")?,
        architecture: m.string("general.architecture")?,
    })
}
