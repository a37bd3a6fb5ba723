//! Reading the JSON requests: each known field on its own, so that a type error names its
//! parameter; unknown fields are ignored (OpenAI clients send many), and `null` is the same as
//! leaving a field out.

use serde::Deserialize;
use serde_json::{Map, Value};

use rknn_llm::chat::{Message, ToolCall, ToolChoice, Tools};
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
        let mut message = Message::new(role, content);
        message.tool_calls = tool_calls(m.get("tool_calls"), i)?;
        message.tool_call_id = string_field(m, "tool_call_id", i)?;
        message.name = string_field(m, "name", i)?;
        out.push(message);
    }
    Ok(out)
}

/// The string field `name` of `messages[i]`, if given.
fn string_field(m: &Obj, name: &str, i: usize) -> Result<Option<String>, ApiError> {
    match m.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(other) => Err(ApiError::param(
            format!("messages[{i}].{name}"),
            format!(
                "`messages[{i}].{name}` must be a string, not {}",
                type_name(other)
            ),
        )),
    }
}

/// An assistant message's `tool_calls`: `[{"id", "type": "function", "function": {"name",
/// "arguments"}}]`, the arguments JSON text of an object (or the object itself).
fn tool_calls(v: Option<&Value>, i: usize) -> Result<Vec<ToolCall>, ApiError> {
    let list = match v {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Array(list)) => list,
        Some(other) => {
            return Err(ApiError::param(
                format!("messages[{i}].tool_calls"),
                format!(
                    "`messages[{i}].tool_calls` must be a list, not {}",
                    type_name(other)
                ),
            ));
        }
    };
    let mut out = Vec::with_capacity(list.len());
    for (j, c) in list.iter().enumerate() {
        let param = format!("messages[{i}].tool_calls[{j}]");
        let bad = |why: &str| ApiError::param(param.clone(), format!("`{param}`: {why}"));
        let f = c
            .get("function")
            .ok_or_else(|| bad("`function` is missing"))?;
        let name = f
            .get("name")
            .and_then(Value::as_str)
            .ok_or_else(|| bad("`function.name` must be a string"))?;
        let arguments = match f.get("arguments") {
            None | Some(Value::Null) => "{}".to_string(),
            Some(Value::String(s)) => s.clone(),
            Some(o @ Value::Object(_)) => o.to_string(),
            Some(_) => return Err(bad("`function.arguments` must be a JSON string")),
        };
        let id = match c.get("id") {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) => Some(s.clone()),
            Some(_) => return Err(bad("`id` must be a string")),
        };
        out.push(ToolCall {
            id,
            name: name.to_string(),
            arguments,
        });
    }
    Ok(out)
}

/// A request's tools: the list, `tool_choice` and `parallel_tool_calls`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolRequest {
    /// `tools`, checked (at most [`Tools::MAX_TOOLS`]).
    pub tools: Tools,
    /// `tool_choice` (default `auto`).
    pub choice: ToolChoice,
    /// `parallel_tool_calls` (default true).
    pub parallel: bool,
}

/// The request's `tools`, `tool_choice` and `parallel_tool_calls`; `None` without tools (an
/// absent or empty list), when `tool_choice` may only be `none` or `auto`.
pub fn tools(obj: &Obj) -> Result<Option<ToolRequest>, ApiError> {
    let tools = match obj.get("tools") {
        None | Some(Value::Null) => None,
        Some(Value::Array(list)) if list.is_empty() => None,
        Some(list @ Value::Array(_)) => Some(
            Tools::from_json(&list.to_string())
                .map_err(|e| ApiError::param("tools", e.to_string()))?,
        ),
        Some(other) => {
            return Err(ApiError::param(
                "tools",
                format!("`tools` must be a list, not {}", type_name(other)),
            ));
        }
    };
    let choice = match obj.get("tool_choice") {
        None | Some(Value::Null) => ToolChoice::Auto,
        Some(Value::String(s)) if s == "auto" => ToolChoice::Auto,
        Some(Value::String(s)) if s == "none" => ToolChoice::None,
        Some(Value::String(s)) if s == "required" => ToolChoice::Required,
        Some(Value::Object(o)) => match o.get("function").and_then(|f| f.get("name")) {
            Some(Value::String(name)) => ToolChoice::Function(name.clone()),
            _ => {
                return Err(ApiError::param(
                    "tool_choice",
                    "`tool_choice` names a function as {\"type\": \"function\", \"function\": {\"name\": ...}}",
                ));
            }
        },
        Some(other) => {
            return Err(ApiError::param(
                "tool_choice",
                format!(
                    "`tool_choice` must be \"auto\", \"none\", \"required\" or a function, not {other}"
                ),
            ));
        }
    };
    let parallel = get::<bool>(obj, "parallel_tool_calls")?.unwrap_or(true);
    let Some(tools) = tools else {
        return match choice {
            ToolChoice::Auto | ToolChoice::None => Ok(None),
            _ => Err(ApiError::param(
                "tool_choice",
                "`tool_choice` asks for a call, but `tools` lists none",
            )),
        };
    };
    if let ToolChoice::Function(name) = &choice {
        if tools.function(name).is_none() {
            return Err(ApiError::param(
                "tool_choice",
                format!("`tool_choice` names {name:?}, which `tools` does not list"),
            ));
        }
    }
    Ok(Some(ToolRequest {
        tools,
        choice,
        parallel,
    }))
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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

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
        assert_eq!(
            m[2],
            Message {
                name: Some("x".into()),
                ..Message::assistant("")
            }
        );
        assert_eq!(m[3].role, "tool-ish");
    }

    #[test]
    fn messages_carry_tool_calls_and_results() {
        let m = messages(&obj(json!({"messages": [
            {"role": "user", "content": "weather?"},
            {"role": "assistant", "content": null, "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}},
                {"id": "call_2", "type": "function", "function": {"name": "now", "arguments": {"tz": "UTC"}}}
            ]},
            {"role": "tool", "tool_call_id": "call_1", "name": "get_weather", "content": "sunny"},
        ]})))
        .expect("valid");
        assert_eq!(
            m[1],
            Message::assistant_calls(
                "",
                vec![
                    ToolCall {
                        id: Some("call_1".into()),
                        ..ToolCall::new("get_weather", "{\"city\": \"Paris\"}")
                    },
                    ToolCall {
                        id: Some("call_2".into()),
                        ..ToolCall::new("now", "{\"tz\":\"UTC\"}")
                    },
                ]
            )
        );
        assert_eq!(
            m[2],
            Message {
                name: Some("get_weather".into()),
                ..Message::tool("call_1", "sunny")
            }
        );
        for body in [
            json!({"messages": [{"role": "assistant", "tool_calls": {}}]}),
            json!({"messages": [{"role": "assistant", "tool_calls": [{"id": "x"}]}]}),
            json!({"messages": [{"role": "assistant", "tool_calls": [{"function": {"name": 1}}]}]}),
            json!({"messages": [{"role": "assistant", "tool_calls": [{"function": {"name": "a", "arguments": 1}}]}]}),
            json!({"messages": [{"role": "tool", "content": "x", "tool_call_id": 3}]}),
        ] {
            let e = messages(&obj(body.clone())).expect_err(&body.to_string());
            assert!(
                e.param
                    .as_deref()
                    .is_some_and(|p| p.starts_with("messages[0].")),
                "{body}: {e:?}"
            );
        }
    }

    #[test]
    fn tools_and_tool_choice() {
        let weather = json!({"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}});
        assert_eq!(tools(&obj(json!({}))), Ok(None));
        assert_eq!(
            tools(&obj(json!({"tools": [], "tool_choice": "auto"}))),
            Ok(None)
        );
        let t = tools(&obj(
            json!({"tools": [weather], "parallel_tool_calls": false}),
        ))
        .expect("valid")
        .expect("some");
        assert_eq!((t.choice, t.parallel), (ToolChoice::Auto, false));
        assert_eq!(t.tools.functions()[0].name, "get_weather");
        for (choice, want) in [
            (json!("none"), ToolChoice::None),
            (json!("required"), ToolChoice::Required),
            (
                json!({"type": "function", "function": {"name": "get_weather"}}),
                ToolChoice::Function("get_weather".into()),
            ),
        ] {
            let t = tools(&obj(json!({"tools": [weather], "tool_choice": choice})))
                .unwrap()
                .unwrap();
            assert_eq!(t.choice, want);
            assert!(t.parallel);
        }
        let many: Vec<Value> = (0..=Tools::MAX_TOOLS)
            .map(|i| json!({"type": "function", "function": {"name": format!("f{i}")}}))
            .collect();
        for (body, param) in [
            (json!({"tools": {}}), "tools"),
            (json!({"tools": [1]}), "tools"),
            (
                json!({"tools": [{"type": "function", "function": {"name": "a b"}}]}),
                "tools",
            ),
            (json!({"tools": many}), "tools"),
            (
                json!({"tools": [weather], "tool_choice": "sometimes"}),
                "tool_choice",
            ),
            (
                json!({"tools": [weather], "tool_choice": {"type": "function"}}),
                "tool_choice",
            ),
            (
                json!({"tools": [weather], "tool_choice": {"type": "function", "function": {"name": "other"}}}),
                "tool_choice",
            ),
            (json!({"tool_choice": "required"}), "tool_choice"),
            (
                json!({"tools": [weather], "parallel_tool_calls": "yes"}),
                "parallel_tool_calls",
            ),
        ] {
            let e = tools(&obj(body.clone())).expect_err(&body.to_string());
            assert_eq!(e.param.as_deref(), Some(param), "{body}");
            assert_eq!(e.status.as_u16(), 400);
        }
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
