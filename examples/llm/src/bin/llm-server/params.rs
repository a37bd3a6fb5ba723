//! Reading the JSON requests: each known field on its own, so that a type error names its
//! parameter; unknown fields are ignored (OpenAI clients send many), and `null` is the same as
//! leaving a field out.

use serde::Deserialize;
use serde_json::{Map, Value};

use rknn_llm::chat::Message;
use rknn_llm::sample::SamplerConfig;

use crate::error::ApiError;

/// A request body: a JSON object.
pub type Obj = Map<String, Value>;

/// The most stop strings a request may give (OpenAI's limit).
pub const MAX_STOP: usize = 4;

/// Parses `bytes` as a JSON object.
pub fn parse_object(bytes: &[u8]) -> Result<Obj, ApiError> {
    let value: Value = serde_json::from_slice(bytes)
        .map_err(|e| ApiError::bad_request(format!("the body is not valid JSON: {e}")))?;
    match value {
        Value::Object(o) => Ok(o),
        other => Err(ApiError::bad_request(format!(
            "the body must be a JSON object, not {}",
            type_name(&other)
        ))),
    }
}

/// The field `name` as a `T`; `None` when absent or null; a 400 naming it otherwise.
pub fn get<'a, T: Deserialize<'a>>(obj: &'a Obj, name: &str) -> Result<Option<T>, ApiError> {
    match obj.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => T::deserialize(v)
            .map(Some)
            .map_err(|e| ApiError::param(name, format!("`{name}`: {e}"))),
    }
}

/// JSON's name of `v`'s type.
fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// How to generate, from the fields every generating endpoint shares.
#[derive(Debug, Clone, PartialEq)]
pub struct Options {
    /// `max_completion_tokens` or `max_tokens` (`None`: until end of generation or a full
    /// slot).
    pub max_tokens: Option<usize>,
    /// The sampler (its seed chosen at random when the request gives none).
    pub sampling: SamplerConfig,
    /// `stop`.
    pub stop: Vec<String>,
    /// `stream`.
    pub stream: bool,
    /// `stream_options.include_usage`.
    pub include_usage: bool,
    /// `cache_prompt` (llama.cpp's; default true).
    pub cache_prompt: bool,
}

/// A number parameter within `lo..=hi`.
fn ranged(obj: &Obj, name: &str, lo: f64, hi: f64) -> Result<Option<f32>, ApiError> {
    match get::<f64>(obj, name)? {
        None => Ok(None),
        Some(v) if v.is_finite() && (lo..=hi).contains(&v) => Ok(Some(v as f32)),
        Some(v) => Err(ApiError::param(
            name,
            format!("`{name}` must be between {lo} and {hi}, not {v}"),
        )),
    }
}

/// A token count of at least 1.
fn count(obj: &Obj, name: &str) -> Result<Option<usize>, ApiError> {
    match get::<i64>(obj, name)? {
        None => Ok(None),
        Some(n) if n >= 1 => Ok(Some(usize::try_from(n).unwrap_or(usize::MAX))),
        Some(n) => Err(ApiError::param(
            name,
            format!("`{name}` must be at least 1, not {n}"),
        )),
    }
}

/// The generation options of `obj`; `random_seed` gives the seed of a request without one.
pub fn options(obj: &Obj, random_seed: impl FnOnce() -> u64) -> Result<Options, ApiError> {
    let max_tokens = match count(obj, "max_completion_tokens")? {
        Some(n) => Some(n),
        None => count(obj, "max_tokens")?,
    };
    let defaults = SamplerConfig::default();
    let temperature = ranged(obj, "temperature", 0.0, 2.0)?.unwrap_or(defaults.temperature);
    let top_p = ranged(obj, "top_p", 0.0, 1.0)?.unwrap_or(defaults.top_p);
    let top_k = match get::<i64>(obj, "top_k")? {
        None => defaults.top_k,
        Some(k) if k >= 0 => usize::try_from(k).unwrap_or(usize::MAX),
        Some(k) => {
            return Err(ApiError::param(
                "top_k",
                format!("`top_k` must be at least 0 (0 keeps every token), not {k}"),
            ));
        }
    };
    let presence_penalty = ranged(obj, "presence_penalty", -2.0, 2.0)?.unwrap_or(0.0);
    let frequency_penalty = ranged(obj, "frequency_penalty", -2.0, 2.0)?.unwrap_or(0.0);
    let seed = match obj.get("seed") {
        None | Some(Value::Null) => random_seed(),
        Some(v) => match (v.as_u64(), v.as_i64()) {
            (Some(s), _) => s,
            // llama.cpp's "pick one".
            (None, Some(-1)) => random_seed(),
            _ => {
                return Err(ApiError::param(
                    "seed",
                    format!("`seed` must be an integer from 0 to 2^64 - 1 (or -1), not {v}"),
                ));
            }
        },
    };
    let stop = match obj.get("stop") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(list)) => {
            if list.len() > MAX_STOP {
                return Err(ApiError::param(
                    "stop",
                    format!("`stop` has {} strings, more than {MAX_STOP}", list.len()),
                ));
            }
            let mut out = Vec::with_capacity(list.len());
            for v in list {
                match v {
                    Value::String(s) => out.push(s.clone()),
                    other => {
                        return Err(ApiError::param(
                            "stop",
                            format!("`stop` must list strings, not {}", type_name(other)),
                        ));
                    }
                }
            }
            out
        }
        Some(other) => {
            return Err(ApiError::param(
                "stop",
                format!(
                    "`stop` must be a string or a list of strings, not {}",
                    type_name(other)
                ),
            ));
        }
    };
    // An empty stop string would end every generation before its first token.
    let stop = stop.into_iter().filter(|s| !s.is_empty()).collect();
    match get::<i64>(obj, "n")? {
        None | Some(1) => {}
        Some(n) => {
            return Err(ApiError::param(
                "n",
                format!("only one choice per request is supported (`n` = 1), not {n}"),
            ));
        }
    }
    get::<&str>(obj, "model")?;
    let stream = get::<bool>(obj, "stream")?.unwrap_or(false);
    let include_usage = match obj.get("stream_options") {
        None | Some(Value::Null) => false,
        Some(Value::Object(o)) => get::<bool>(o, "include_usage")
            .map_err(|e| ApiError {
                param: Some("stream_options.include_usage".into()),
                ..e
            })?
            .unwrap_or(false),
        Some(other) => {
            return Err(ApiError::param(
                "stream_options",
                format!(
                    "`stream_options` must be an object, not {}",
                    type_name(other)
                ),
            ));
        }
    };
    let cache_prompt = get::<bool>(obj, "cache_prompt")?.unwrap_or(true);
    Ok(Options {
        max_tokens,
        sampling: SamplerConfig {
            temperature,
            top_k,
            top_p,
            seed,
            presence_penalty,
            frequency_penalty,
            ..defaults
        },
        stop,
        stream,
        include_usage,
        cache_prompt,
    })
}

/// The chat's `messages`: a non-empty list of `{"role": str, "content": str | parts | null}`,
/// where parts are `{"type": "text", "text": str}` objects, concatenated.
pub fn messages(obj: &Obj) -> Result<Vec<Message>, ApiError> {
    let list = match obj.get("messages") {
        None | Some(Value::Null) => {
            return Err(ApiError::param("messages", "`messages` is missing"));
        }
        Some(Value::Array(list)) => list,
        Some(other) => {
            return Err(ApiError::param(
                "messages",
                format!("`messages` must be a list, not {}", type_name(other)),
            ));
        }
    };
    if list.is_empty() {
        return Err(ApiError::param("messages", "`messages` is empty"));
    }
    let mut out = Vec::with_capacity(list.len());
    for (i, m) in list.iter().enumerate() {
        let Value::Object(m) = m else {
            return Err(ApiError::param(
                format!("messages[{i}]"),
                format!("`messages[{i}]` must be an object, not {}", type_name(m)),
            ));
        };
        let role = match m.get("role") {
            Some(Value::String(r)) => r.clone(),
            None | Some(Value::Null) => {
                return Err(ApiError::param(
                    format!("messages[{i}].role"),
                    format!("`messages[{i}].role` is missing"),
                ));
            }
            Some(other) => {
                return Err(ApiError::param(
                    format!("messages[{i}].role"),
                    format!(
                        "`messages[{i}].role` must be a string, not {}",
                        type_name(other)
                    ),
                ));
            }
        };
        let content = content(m.get("content"), i)?;
        out.push(Message::new(role, content));
    }
    Ok(out)
}

/// A message's content as text.
fn content(v: Option<&Value>, i: usize) -> Result<String, ApiError> {
    let param = || format!("messages[{i}].content");
    match v {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(parts)) => {
            let mut text = String::new();
            for (j, p) in parts.iter().enumerate() {
                let kind = p.get("type").and_then(Value::as_str);
                match (kind, p.get("text")) {
                    (Some("text"), Some(Value::String(t))) => text.push_str(t),
                    (Some("text"), _) => {
                        return Err(ApiError::param(
                            param(),
                            format!("`messages[{i}].content[{j}].text` must be a string"),
                        ));
                    }
                    (Some(other), _) => {
                        return Err(ApiError::param(
                            param(),
                            format!(
                                "`messages[{i}].content[{j}]` is of type {other:?}: only \"text\" parts are supported"
                            ),
                        ));
                    }
                    (None, _) => {
                        return Err(ApiError::param(
                            param(),
                            format!(
                                "`messages[{i}].content[{j}]` must be an object with a \"type\""
                            ),
                        ));
                    }
                }
            }
            Ok(text)
        }
        Some(other) => Err(ApiError::param(
            param(),
            format!(
                "`messages[{i}].content` must be a string or a list of parts, not {}",
                type_name(other)
            ),
        )),
    }
}

/// The completion's `prompt`: a string, or a list of one string.
pub fn prompt(obj: &Obj) -> Result<String, ApiError> {
    match obj.get("prompt") {
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(list)) => match list.as_slice() {
            [Value::String(s)] => Ok(s.clone()),
            _ => Err(ApiError::param(
                "prompt",
                "`prompt` must be a string or a list of exactly one string",
            )),
        },
        None | Some(Value::Null) => Err(ApiError::param("prompt", "`prompt` is missing")),
        Some(other) => Err(ApiError::param(
            "prompt",
            format!("`prompt` must be a string, not {}", type_name(other)),
        )),
    }
}

/// The most inputs one embeddings request may give (OpenAI's limit is 2048; each input here
/// runs through the model, so a request is bounded to what a few seconds can embed).
pub const MAX_EMBED_INPUTS: usize = 256;

/// The fields an embeddings request may give; any other is refused (400 naming it).
pub const EMBED_FIELDS: [&str; 5] = ["input", "model", "encoding_format", "dimensions", "user"];

/// An embeddings request's `input`.
#[derive(Debug, Clone, PartialEq)]
pub enum EmbedInput {
    /// Texts, to be tokenized.
    Texts(Vec<String>),
    /// Token ids, one list per input.
    Tokens(Vec<Vec<u32>>),
}

/// What an embeddings request asks.
#[derive(Debug, Clone, PartialEq)]
pub struct EmbedRequest {
    /// The inputs.
    pub input: EmbedInput,
    /// `encoding_format: "base64"`: each vector as its little-endian f32 bytes in base64.
    pub base64: bool,
}

/// An embeddings request's fields: `input` (a string, a list of strings, a list of token ids,
/// or a list of such lists; none empty, at most [`MAX_EMBED_INPUTS`]), `encoding_format`
/// (`float` or `base64`), `dimensions` (only the model's own width, `n_embd`: the vectors
/// cannot be shortened), `model` and `user` (accepted, not used). Any other field is a 400
/// naming it: nothing asked is silently ignored.
pub fn embed_request(obj: &Obj, n_embd: usize) -> Result<EmbedRequest, ApiError> {
    if let Some(k) = obj.keys().find(|k| !EMBED_FIELDS.contains(&k.as_str())) {
        return Err(ApiError::param(
            k.as_str(),
            format!(
                "unknown field `{k}`: an embeddings request takes {}",
                EMBED_FIELDS.map(|f| format!("`{f}`")).join(", ")
            ),
        ));
    }
    get::<String>(obj, "model")?;
    get::<String>(obj, "user")?;
    let base64 = match get::<String>(obj, "encoding_format")?.as_deref() {
        None | Some("float") => false,
        Some("base64") => true,
        Some(other) => {
            return Err(ApiError::param(
                "encoding_format",
                format!("`encoding_format` must be \"float\" or \"base64\", not {other:?}"),
            ));
        }
    };
    if let Some(d) = get::<i64>(obj, "dimensions")? {
        if usize::try_from(d).ok() != Some(n_embd) {
            return Err(ApiError::param(
                "dimensions",
                format!(
                    "`dimensions` {d} is not supported: this model's embeddings have {n_embd} \
                     dimensions and cannot be shortened"
                ),
            ));
        }
    }
    let input = embed_input(obj.get("input"))?;
    Ok(EmbedRequest { input, base64 })
}

/// `input`, checked as [`embed_request`] says.
fn embed_input(v: Option<&Value>) -> Result<EmbedInput, ApiError> {
    let bad = |m: String| ApiError::param("input", m);
    let list = match v {
        None | Some(Value::Null) => return Err(bad("`input` is missing".into())),
        Some(Value::String(s)) if s.is_empty() => {
            return Err(bad("`input` is an empty string".into()));
        }
        Some(Value::String(s)) => return Ok(EmbedInput::Texts(vec![s.clone()])),
        Some(Value::Array(list)) => list,
        Some(other) => {
            return Err(bad(format!(
                "`input` must be a string, a list of strings, a list of token ids or a list of \
                 such lists, not {}",
                type_name(other)
            )));
        }
    };
    if list.is_empty() {
        return Err(bad("`input` is an empty list".into()));
    }
    // A flat list of numbers is one input's token ids.
    if list.iter().all(Value::is_number) {
        return Ok(EmbedInput::Tokens(vec![token_ids(list, "input")?]));
    }
    if list.len() > MAX_EMBED_INPUTS {
        return Err(bad(format!(
            "`input` has {} inputs, more than the {MAX_EMBED_INPUTS} a request may give",
            list.len()
        )));
    }
    match &list[0] {
        Value::String(_) => {
            let mut texts = Vec::with_capacity(list.len());
            for (i, v) in list.iter().enumerate() {
                match v {
                    Value::String(s) if s.is_empty() => {
                        return Err(bad(format!("`input[{i}]` is an empty string")));
                    }
                    Value::String(s) => texts.push(s.clone()),
                    other => {
                        return Err(bad(format!(
                            "`input[{i}]` must be a string like `input[0]`, not {}",
                            type_name(other)
                        )));
                    }
                }
            }
            Ok(EmbedInput::Texts(texts))
        }
        Value::Array(_) => {
            let mut lists = Vec::with_capacity(list.len());
            for (i, v) in list.iter().enumerate() {
                let name = format!("input[{i}]");
                match v {
                    Value::Array(ids) if ids.is_empty() => {
                        return Err(bad(format!("`{name}` is an empty list of token ids")));
                    }
                    Value::Array(ids) => lists.push(token_ids(ids, &name)?),
                    other => {
                        return Err(bad(format!(
                            "`{name}` must be a list of token ids like `input[0]`, not {}",
                            type_name(other)
                        )));
                    }
                }
            }
            Ok(EmbedInput::Tokens(lists))
        }
        other => Err(bad(format!(
            "`input[0]` must be a string or a list of token ids, not {}",
            type_name(other)
        ))),
    }
}

/// A list of token ids (non-negative integers that fit 32 bits), `name` in messages.
fn token_ids(list: &[Value], name: &str) -> Result<Vec<u32>, ApiError> {
    list.iter()
        .enumerate()
        .map(|(j, v)| {
            v.as_u64()
                .and_then(|x| u32::try_from(x).ok())
                .ok_or_else(|| {
                    ApiError::param(
                        "input",
                        format!("`{name}[{j}]` must be a token id (an integer from 0), not {v}"),
                    )
                })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn embedding_inputs_take_every_form() {
        let req = |v: Value| embed_request(&obj(v), 8);
        let texts = |t: &[&str]| EmbedInput::Texts(t.iter().map(|s| s.to_string()).collect());
        assert_eq!(req(json!({"input": "a"})).unwrap().input, texts(&["a"]));
        assert_eq!(
            req(json!({"input": ["a", "b"]})).unwrap().input,
            texts(&["a", "b"])
        );
        assert_eq!(
            req(json!({"input": [1, 2]})).unwrap().input,
            EmbedInput::Tokens(vec![vec![1, 2]])
        );
        assert_eq!(
            req(json!({"input": [[1], [2, 3]]})).unwrap().input,
            EmbedInput::Tokens(vec![vec![1], vec![2, 3]])
        );
        let r = req(
            json!({"input": "a", "encoding_format": "base64", "model": "m", "user": "u",
            "dimensions": 8}),
        )
        .unwrap();
        assert!(r.base64);
    }

    #[test]
    fn bad_embedding_requests_name_their_rule() {
        let err = |v: Value| embed_request(&obj(v), 8).unwrap_err();
        let many: Vec<String> = (0..=MAX_EMBED_INPUTS).map(|i| i.to_string()).collect();
        for (body, param, words) in [
            (json!({}), "input", "missing"),
            (json!({"input": ""}), "input", "empty string"),
            (json!({"input": []}), "input", "empty list"),
            (
                json!({"input": ["a", ""]}),
                "input",
                "`input[1]` is an empty string",
            ),
            (
                json!({"input": [[1], []]}),
                "input",
                "`input[1]` is an empty list",
            ),
            (
                json!({"input": ["a", 1]}),
                "input",
                "`input[1]` must be a string",
            ),
            (
                json!({"input": [[1], "a"]}),
                "input",
                "`input[1]` must be a list",
            ),
            (
                json!({"input": [-1]}),
                "input",
                "`input[0]` must be a token id",
            ),
            (
                json!({"input": [[1, 2.5]]}),
                "input",
                "`input[0][1]` must be a token id",
            ),
            (
                json!({"input": [true]}),
                "input",
                "`input[0]` must be a string or",
            ),
            (json!({"input": 3}), "input", "not a number"),
            (json!({"input": many}), "input", "more than the 256"),
            (
                json!({"input": "a", "dimensions": 4}),
                "dimensions",
                "cannot be shortened",
            ),
            (
                json!({"input": "a", "encoding_format": "hex"}),
                "encoding_format",
                "\"hex\"",
            ),
            (
                json!({"input": "a", "pooling": "mean"}),
                "pooling",
                "unknown field `pooling`",
            ),
            (json!({"input": "a", "model": 3}), "model", "`model`"),
        ] {
            let e = err(body.clone());
            assert_eq!(e.param.as_deref(), Some(param), "{body}: {e}");
            assert!(e.message.contains(words), "{body}: {e}");
            assert_eq!(e.status.as_u16(), 400);
        }
    }

    fn obj(v: Value) -> Obj {
        match v {
            Value::Object(o) => o,
            _ => Obj::new(),
        }
    }

    fn opts(v: Value) -> Result<Options, ApiError> {
        options(&obj(v), || 7)
    }

    #[test]
    fn defaults_are_llama_servers() {
        let o = opts(json!({})).expect("no field is fine");
        assert_eq!(o.max_tokens, None);
        assert_eq!(o.sampling.temperature, 0.8);
        assert_eq!(o.sampling.top_p, 0.95);
        assert_eq!(o.sampling.top_k, 40);
        assert_eq!(o.sampling.seed, 7);
        assert!(o.cache_prompt && !o.stream && !o.include_usage && o.stop.is_empty());
    }

    #[test]
    fn fields_are_read() {
        let o = opts(json!({
            "max_tokens": 5, "max_completion_tokens": 9, "temperature": 0, "top_p": 0.5,
            "top_k": 0, "seed": 3, "stop": ["a", ""], "presence_penalty": -1.5,
            "frequency_penalty": 2, "n": 1, "stream": true, "stream_options": {"include_usage": true},
            "cache_prompt": false, "model": "x", "unknown": {"ignored": true}
        }))
        .expect("valid");
        assert_eq!(o.max_tokens, Some(9));
        assert_eq!(o.sampling.temperature, 0.0);
        assert_eq!(o.sampling.top_k, 0);
        assert_eq!(o.sampling.seed, 3);
        assert_eq!(o.stop, vec!["a".to_string()]);
        assert_eq!(o.sampling.presence_penalty, -1.5);
        assert_eq!(o.sampling.frequency_penalty, 2.0);
        assert!(o.stream && o.include_usage && !o.cache_prompt);
        assert_eq!(
            opts(json!({"stop": "x", "seed": -1})).map(|o| o.stop),
            Ok(vec!["x".into()])
        );
    }

    #[test]
    fn bad_parameters_name_themselves() {
        for (body, param) in [
            (json!({"max_tokens": 0}), "max_tokens"),
            (json!({"max_tokens": -3}), "max_tokens"),
            (json!({"max_tokens": 1.5}), "max_tokens"),
            (
                json!({"max_completion_tokens": "9"}),
                "max_completion_tokens",
            ),
            (json!({"temperature": 2.5}), "temperature"),
            (json!({"temperature": "hot"}), "temperature"),
            (json!({"top_p": -0.1}), "top_p"),
            (json!({"top_k": -1}), "top_k"),
            (json!({"seed": -2}), "seed"),
            (json!({"seed": 1.5}), "seed"),
            (json!({"stop": ["a", "b", "c", "d", "e"]}), "stop"),
            (json!({"stop": [1]}), "stop"),
            (json!({"stop": 1}), "stop"),
            (json!({"presence_penalty": 3}), "presence_penalty"),
            (json!({"frequency_penalty": -2.01}), "frequency_penalty"),
            (json!({"n": 2}), "n"),
            (json!({"stream": "yes"}), "stream"),
            (json!({"stream_options": true}), "stream_options"),
            (
                json!({"stream_options": {"include_usage": 1}}),
                "stream_options.include_usage",
            ),
            (json!({"cache_prompt": 1}), "cache_prompt"),
            (json!({"model": 1}), "model"),
        ] {
            let e = opts(body.clone()).expect_err(&body.to_string());
            assert_eq!(e.param.as_deref(), Some(param), "{body}");
            assert_eq!(e.status.as_u16(), 400);
        }
    }

    #[test]
    fn messages_take_strings_and_text_parts() {
        let m = messages(&obj(json!({"messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
            {"role": "assistant", "content": null, "name": "x"},
            {"role": "tool-ish", "content": "fine"},
        ]})))
        .expect("valid");
        assert_eq!(m[1], Message::user("ab"));
        assert_eq!(m[2], Message::assistant(""));
        assert_eq!(m[3].role, "tool-ish");
    }

    #[test]
    fn bad_messages_are_400() {
        for body in [
            json!({}),
            json!({"messages": []}),
            json!({"messages": "hi"}),
            json!({"messages": [1]}),
            json!({"messages": [{"content": "x"}]}),
            json!({"messages": [{"role": 1, "content": "x"}]}),
            json!({"messages": [{"role": "user", "content": 1}]}),
            json!({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}),
            json!({"messages": [{"role": "user", "content": [{"type": "text"}]}]}),
            json!({"messages": [{"role": "user", "content": ["x"]}]}),
        ] {
            let e = messages(&obj(body.clone())).expect_err(&body.to_string());
            assert!(
                e.param
                    .as_deref()
                    .is_some_and(|p| p.starts_with("messages")),
                "{body}"
            );
        }
    }

    #[test]
    fn prompts_are_a_string_or_one_in_a_list() {
        assert_eq!(prompt(&obj(json!({"prompt": "a"}))), Ok("a".into()));
        assert_eq!(prompt(&obj(json!({"prompt": ["b"]}))), Ok("b".into()));
        for body in [
            json!({}),
            json!({"prompt": ["a", "b"]}),
            json!({"prompt": [1, 2]}),
            json!({"prompt": 3}),
        ] {
            assert!(prompt(&obj(body)).is_err());
        }
    }

    #[test]
    fn the_body_must_be_a_json_object() {
        assert!(parse_object(b"{").is_err());
        assert!(parse_object(b"[1]").is_err());
        assert!(parse_object(b"{\"a\":1}").is_ok());
    }
}
