//! The GGUF keys the tokenizer reads, gathered into a [`VocabSpec`].

use super::error::TokenizerError;
use super::spec::{SpecialIds, VocabSpec};
use crate::gguf::{Metadata, Value};

fn get<'a>(
    m: &'a Metadata,
    key: &'static str,
    expected: &'static str,
    conv: impl FnOnce(&'a Value) -> Option<()>,
) -> Result<Option<&'a Value>, TokenizerError> {
    match m.get(key) {
        None => Ok(None),
        Some(v) => match conv(v) {
            Some(()) => Ok(Some(v)),
            None => Err(TokenizerError::WrongType { key, expected }),
        },
    }
}

fn string(m: &Metadata, key: &'static str) -> Result<Option<String>, TokenizerError> {
    Ok(get(m, key, "a string", |v| v.as_str().map(drop))?
        .and_then(Value::as_str)
        .map(str::to_owned))
}

fn boolean(m: &Metadata, key: &'static str) -> Result<Option<bool>, TokenizerError> {
    Ok(get(m, key, "a bool", |v| v.as_bool().map(drop))?.and_then(Value::as_bool))
}

/// A token id: any integer type; a value outside u32 (files write -1 for "none") is absent.
fn id(m: &Metadata, key: &'static str) -> Result<Option<u32>, TokenizerError> {
    Ok(get(m, key, "an integer", |v| v.as_i64().map(drop))?.and_then(Value::as_u32))
}

fn strings(m: &Metadata, key: &'static str) -> Result<Option<Vec<String>>, TokenizerError> {
    let v = get(m, key, "an array of strings", |v| {
        v.as_array().and_then(|a| a.as_strings()).map(drop)
    })?;
    Ok(v.and_then(Value::as_array)
        .and_then(|a| a.as_strings())
        .map(<[String]>::to_vec))
}

/// Scores: float32, or int32 as some converters write them.
fn scores(m: &Metadata, key: &'static str) -> Result<Option<Vec<f32>>, TokenizerError> {
    let Some(a) = get(m, key, "an array of f32 or i32", |v| {
        let a = v.as_array()?;
        (a.as_f32s().is_some() || a.as_i32s().is_some()).then_some(())
    })?
    .and_then(Value::as_array) else {
        return Ok(None);
    };
    Ok(a.as_f32s()
        .map(<[f32]>::to_vec)
        .or_else(|| a.as_i32s().map(|v| v.iter().map(|&x| x as f32).collect())))
}

fn i32s(m: &Metadata, key: &'static str) -> Result<Option<Vec<i32>>, TokenizerError> {
    let v = get(m, key, "an array of i32", |v| {
        v.as_array().and_then(|a| a.as_i32s()).map(drop)
    })?;
    Ok(v.and_then(Value::as_array)
        .and_then(|a| a.as_i32s())
        .map(<[i32]>::to_vec))
}

pub(crate) fn read_spec(m: &Metadata) -> Result<VocabSpec, TokenizerError> {
    let model = string(m, "tokenizer.ggml.model")?.ok_or(TokenizerError::MissingKey {
        key: "tokenizer.ggml.model",
    })?;
    let tokens = strings(m, "tokenizer.ggml.tokens")?.ok_or(TokenizerError::MissingKey {
        key: "tokenizer.ggml.tokens",
    })?;
    let special = SpecialIds {
        bos: id(m, "tokenizer.ggml.bos_token_id")?,
        eos: id(m, "tokenizer.ggml.eos_token_id")?,
        eot: id(m, "tokenizer.ggml.eot_token_id")?,
        eom: id(m, "tokenizer.ggml.eom_token_id")?,
        unk: id(m, "tokenizer.ggml.unknown_token_id")?,
        sep: id(m, "tokenizer.ggml.seperator_token_id")?,
        pad: id(m, "tokenizer.ggml.padding_token_id")?,
        mask: id(m, "tokenizer.ggml.mask_token_id")?,
        // llama.cpp reads the older prefix/suffix/middle keys after the fim_* ones: they win.
        fim_pre: id(m, "tokenizer.ggml.prefix_token_id")?
            .or(id(m, "tokenizer.ggml.fim_pre_token_id")?),
        fim_suf: id(m, "tokenizer.ggml.suffix_token_id")?
            .or(id(m, "tokenizer.ggml.fim_suf_token_id")?),
        fim_mid: id(m, "tokenizer.ggml.middle_token_id")?
            .or(id(m, "tokenizer.ggml.fim_mid_token_id")?),
        fim_pad: id(m, "tokenizer.ggml.fim_pad_token_id")?,
        fim_rep: id(m, "tokenizer.ggml.fim_rep_token_id")?,
        fim_sep: id(m, "tokenizer.ggml.fim_sep_token_id")?,
    };
    Ok(VocabSpec {
        model,
        pre: string(m, "tokenizer.ggml.pre")?,
        tokens,
        scores: scores(m, "tokenizer.ggml.scores")?,
        token_types: i32s(m, "tokenizer.ggml.token_type")?,
        merges: strings(m, "tokenizer.ggml.merges")?,
        special,
        add_bos: boolean(m, "tokenizer.ggml.add_bos_token")?,
        add_eos: boolean(m, "tokenizer.ggml.add_eos_token")?,
        add_space_prefix: boolean(m, "tokenizer.ggml.add_space_prefix")?,
        name: string(m, "general.name")?,
        architecture: string(m, "general.architecture")?,
    })
}
