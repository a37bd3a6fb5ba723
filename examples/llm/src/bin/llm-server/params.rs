//! Reading the JSON requests: each known field on its own, so that a type error names its
//! parameter, and `null` is the same as leaving a field out. A field this server does not
//! know, or knows but does not honour with the value given, is a 400 naming it
//! ([`check_fields`]; the table is in docs/serving.md): never silently ignored.

use serde::Deserialize;
use serde_json::{Map, Value};

use rknn_llm::chat::{Message, ToolCall, ToolChoice, Tools};
use rknn_llm::constraint::GrammarSpec;
use rknn_llm::sample::SamplerConfig;

use crate::error::ApiError;

/// A request body: a JSON object.
pub type Obj = Map<String, Value>;

/// The most choices a request may ask for (`n`): each takes a slot while it runs.
pub const MAX_N: usize = 8;

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
    /// `n`: choices to generate (each its own request, seeds `seed`, `seed + 1`, ...; the
    /// prompt is evaluated once and shared through the prompt cache).
    pub n: usize,
    /// The grammar the output must follow: `response_format` (`json_object`, `json_schema`),
    /// or llama-server's `json_schema` or `grammar`; and the field it came from.
    pub constraint: Option<(GrammarSpec, &'static str)>,
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
        None => match count(obj, "max_tokens")? {
            Some(n) => Some(n),
            // llama-server's name; -1 is no limit.
            None => match get::<i64>(obj, "n_predict")? {
                None | Some(-1) => None,
                Some(n) => Some(usize::try_from(n).map_err(|_| {
                    ApiError::param(
                        "n_predict",
                        format!("`n_predict` must be -1 or at least 0, not {n}"),
                    )
                })?),
            },
        },
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
    let n = match get::<i64>(obj, "n")? {
        None => 1,
        Some(n) if (1..=MAX_N as i64).contains(&n) => n as usize,
        Some(n) => {
            return Err(ApiError::param(
                "n",
                format!("`n` must be from 1 to {MAX_N} choices, not {n}"),
            ));
        }
    };
    let repeat_penalty =
        ranged(obj, "repeat_penalty", 0.0, 10.0)?.unwrap_or(defaults.repeat_penalty);
    let repeat_last_n = count(obj, "repeat_last_n")?.unwrap_or(defaults.repeat_last_n);
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
    let constraint = constraint(obj)?;
    Ok(Options {
        max_tokens,
        sampling: SamplerConfig {
            temperature,
            top_k,
            top_p,
            seed,
            presence_penalty,
            frequency_penalty,
            repeat_penalty,
            repeat_last_n,
            ..defaults
        },
        n,
        stop,
        stream,
        include_usage,
        cache_prompt,
        constraint,
    })
}

/// The output's grammar, from whichever of `response_format`, `json_schema` and `grammar` the
/// request gives (more than one is a 400: which would win is not obvious).
fn constraint(obj: &Obj) -> Result<Option<(GrammarSpec, &'static str)>, ApiError> {
    let mut found = Vec::new();
    if let Some(spec) = response_format(obj)? {
        found.push((spec, "response_format"));
    }
    match obj.get("json_schema") {
        None | Some(Value::Null) => {}
        Some(v @ (Value::Object(_) | Value::Bool(_))) => {
            found.push((GrammarSpec::JsonSchema(v.clone()), "json_schema"))
        }
        Some(other) => {
            return Err(ApiError::param(
                "json_schema",
                format!(
                    "`json_schema` must be a JSON Schema object, not {}",
                    type_name(other)
                ),
            ));
        }
    }
    if let Some(g) = get::<String>(obj, "grammar")? {
        // llama.cpp's convention: a grammar beginning `%llguidance` is Lark, otherwise GBNF.
        let spec = if g.trim_start().starts_with("%llguidance") {
            GrammarSpec::Lark(g)
        } else {
            GrammarSpec::Gbnf(g)
        };
        found.push((spec, "grammar"));
    }
    if found.len() > 1 {
        let names: Vec<&str> = found.iter().map(|f| f.1).collect();
        return Err(ApiError::param(
            found[1].1,
            format!(
                "give one of `response_format`, `json_schema` and `grammar`, not {}",
                names.join(" and ")
            ),
        ));
    }
    Ok(found.pop())
}

/// OpenAI's `response_format`: `{"type": "text"}` (no constraint), `{"type": "json_object"}`
/// (llama-server's extra `schema` member too) or `{"type": "json_schema", "json_schema":
/// {"name", "schema", "strict", "description"}}`.
fn response_format(obj: &Obj) -> Result<Option<GrammarSpec>, ApiError> {
    const P: &str = "response_format";
    let rf = match obj.get(P) {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Object(o)) => o,
        Some(other) => {
            return Err(ApiError::param(
                P,
                format!("`{P}` must be an object, not {}", type_name(other)),
            ));
        }
    };
    let only = |o: &Obj, allowed: &[&str], at: &str| -> Result<(), ApiError> {
        match o.keys().find(|k| !allowed.contains(&k.as_str())) {
            Some(k) => Err(ApiError::param(
                P,
                format!(
                    "`{at}` has a member `{k}` this server does not know (it knows {})",
                    allowed.join(", ")
                ),
            )),
            None => Ok(()),
        }
    };
    let schema_of = |v: &Value, at: &str| match v {
        Value::Object(_) | Value::Bool(_) => Ok(GrammarSpec::JsonSchema(v.clone())),
        other => Err(ApiError::param(
            P,
            format!(
                "`{at}` must be a JSON Schema object, not {}",
                type_name(other)
            ),
        )),
    };
    let ty = get::<&str>(rf, "type").map_err(|e| ApiError {
        param: Some(P.into()),
        ..e
    })?;
    match ty {
        None => Err(ApiError::param(
            P,
            format!("`{P}` needs a `type`: text, json_object or json_schema"),
        )),
        Some("text") => {
            only(rf, &["type"], P)?;
            Ok(None)
        }
        Some("json_object") => {
            only(rf, &["type", "schema"], P)?;
            match rf.get("schema") {
                None | Some(Value::Null) => Ok(Some(GrammarSpec::JsonObject)),
                Some(v) => schema_of(v, "response_format.schema").map(Some),
            }
        }
        Some("json_schema") => {
            only(rf, &["type", "json_schema"], P)?;
            let Some(Value::Object(js)) = rf.get("json_schema") else {
                return Err(ApiError::param(
                    P,
                    "`response_format.json_schema` must be an object with the `schema` (and `name`)",
                ));
            };
            only(
                js,
                &["name", "schema", "strict", "description"],
                "response_format.json_schema",
            )?;
            if let Some(name) = js.get("name") {
                if !name.is_string() {
                    return Err(ApiError::param(
                        P,
                        "`response_format.json_schema.name` must be a string",
                    ));
                }
            }
            match js.get("strict") {
                None | Some(Value::Null | Value::Bool(_)) => {}
                Some(_) => {
                    return Err(ApiError::param(
                        P,
                        "`response_format.json_schema.strict` must be a boolean",
                    ));
                }
            }
            match js.get("schema") {
                // OpenAI's default when the schema is left out: any JSON object.
                None | Some(Value::Null) => Ok(Some(GrammarSpec::JsonObject)),
                Some(v) => schema_of(v, "response_format.json_schema.schema").map(Some),
            }
        }
        Some(t) => Err(ApiError::param(
            P,
            format!("`{P}.type` must be text, json_object or json_schema, not {t:?}"),
        )),
    }
}

/// The most `top_logprobs` a chat request may ask for (OpenAI's cap), and the most `n_probs`.
pub const MAX_TOP_LOGPROBS: usize = rknn_llm::sample::MAX_TOP_LOGPROBS;

/// The most alternatives a completion's integer `logprobs` may ask for (OpenAI's legacy cap).
pub const MAX_COMPLETION_LOGPROBS: usize = 5;

/// An integer parameter within `0..=hi`.
fn up_to(obj: &Obj, name: &str, hi: usize) -> Result<Option<usize>, ApiError> {
    match get::<i64>(obj, name)? {
        None => Ok(None),
        Some(n) if (0..=hi as i64).contains(&n) => Ok(Some(n as usize)),
        Some(n) => Err(ApiError::param(
            name,
            format!("`{name}` must be an integer from 0 to {hi}, not {n}"),
        )),
    }
}

/// llama-server's `n_probs` (0..=20; 0 is off): the number of alternatives, when positive.
fn n_probs(obj: &Obj) -> Result<Option<usize>, ApiError> {
    Ok(up_to(obj, "n_probs", MAX_TOP_LOGPROBS)?.filter(|&n| n > 0))
}

/// A chat's log-probabilities: `logprobs: true` with `top_logprobs` alternatives (0..=20,
/// default 0; given without `logprobs: true`, a 400), else llama-server's `n_probs`.
pub fn chat_logprobs(obj: &Obj) -> Result<Option<usize>, ApiError> {
    let on = get::<bool>(obj, "logprobs")?.unwrap_or(false);
    let top = up_to(obj, "top_logprobs", MAX_TOP_LOGPROBS)?;
    match (on, top) {
        (true, top) => Ok(Some(top.unwrap_or(0))),
        (false, Some(_)) => Err(ApiError::param(
            "top_logprobs",
            "`top_logprobs` needs `logprobs` set to true",
        )),
        (false, None) => n_probs(obj),
    }
}

/// A completion's log-probabilities: the integer `logprobs` (0..=5, OpenAI's legacy API:
/// the chosen token's and that many alternatives), else llama-server's `n_probs`.
pub fn completion_logprobs(obj: &Obj) -> Result<Option<usize>, ApiError> {
    match up_to(obj, "logprobs", MAX_COMPLETION_LOGPROBS)? {
        Some(n) => Ok(Some(n)),
        None => n_probs(obj),
    }
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

/// The generating endpoints, for [`check_fields`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Endpoint {
    /// `/v1/chat/completions`.
    Chat,
    /// `/v1/completions`.
    Completion,
}

/// Fields read by [`options`] and the handlers, on both endpoints.
const SHARED: &[&str] = &[
    "model",
    "max_tokens",
    "temperature",
    "top_p",
    "top_k",
    "seed",
    "stop",
    "presence_penalty",
    "frequency_penalty",
    "logit_bias",
    "n",
    "stream",
    "stream_options",
    "cache_prompt",
    "n_probs",
    "json_schema",
    "grammar",
    "response_format",
    "repeat_penalty",
    "repeat_last_n",
    "n_predict",
    // Identifiers and labels for the caller's bookkeeping; they do not change the answer.
    "user",
    "safety_identifier",
    "prompt_cache_key",
    "metadata",
    // Accepted with the values that ask for what the server does (checked below).
    "store",
    "service_tier",
];

/// Chat-only fields.
const CHAT: &[&str] = &[
    "messages",
    "max_completion_tokens",
    "logprobs",
    "top_logprobs",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "modalities",
];

/// Completion-only fields.
const COMPLETION: &[&str] = &["prompt", "logprobs", "echo", "best_of", "suffix"];

/// OpenAI's fields that ask for what this server does not do, with why (a 400 when given
/// a value other than `null`).
const NOT_HONOURED: &[(&str, &str)] = &[
    (
        "audio",
        "audio output is not supported: the model writes text",
    ),
    (
        "prediction",
        "predicted outputs are not supported (llm-decode's --spec lookup drafts from the prompt instead)",
    ),
    (
        "reasoning_effort",
        "reasoning effort is not supported: a reasoning model thinks as its chat template says",
    ),
    ("verbosity", "verbosity is not supported"),
    ("web_search_options", "web search is not supported"),
    (
        "functions",
        "`functions` is OpenAI's deprecated form: give `tools`",
    ),
    (
        "function_call",
        "`function_call` is OpenAI's deprecated form: give `tool_choice`",
    ),
];

/// Refuses, with a 400 naming it, every field of `obj` that `endpoint` does not know and every
/// known field whose value asks for what the server does not do.
pub fn check_fields(obj: &Obj, endpoint: Endpoint) -> Result<(), ApiError> {
    let own = match endpoint {
        Endpoint::Chat => CHAT,
        Endpoint::Completion => COMPLETION,
    };
    for (key, value) in obj {
        if value.is_null() {
            continue;
        }
        if let Some((_, why)) = NOT_HONOURED.iter().find(|(k, _)| k == key) {
            return Err(ApiError::param(key.as_str(), format!("`{key}`: {why}")));
        }
        if !SHARED.contains(&key.as_str()) && !own.contains(&key.as_str()) {
            let other = match endpoint {
                Endpoint::Chat => COMPLETION
                    .contains(&key.as_str())
                    .then_some("/v1/completions"),
                Endpoint::Completion => CHAT
                    .contains(&key.as_str())
                    .then_some("/v1/chat/completions"),
            };
            let hint = other.map_or(String::new(), |e| format!(" (it is a field of {e})"));
            return Err(ApiError::param(
                key.as_str(),
                format!(
                    "unknown field `{key}`{hint}: this server refuses what it would not honour (docs/serving.md lists the fields)"
                ),
            ));
        }
    }
    let refuse = |key: &str, why: String| Err(ApiError::param(key, why));
    match obj.get("store") {
        None | Some(Value::Null | Value::Bool(false)) => {}
        Some(_) => {
            return refuse(
                "store",
                "`store`: this server does not store completions (only `false`)".into(),
            );
        }
    }
    match obj.get("service_tier").map(|v| v.as_str()) {
        None | Some(Some("auto" | "default")) => {}
        Some(_) if obj["service_tier"].is_null() => {}
        Some(_) => {
            return refuse(
                "service_tier",
                "`service_tier`: one tier here (`auto` or `default`)".into(),
            );
        }
    }
    match obj.get("modalities") {
        None | Some(Value::Null) => {}
        Some(Value::Array(m)) if m.iter().all(|v| v == "text") && !m.is_empty() => {}
        Some(_) => return refuse("modalities", "`modalities`: only [\"text\"]".into()),
    }
    match obj.get("echo") {
        None | Some(Value::Null | Value::Bool(false)) => {}
        Some(_) => {
            return refuse(
                "echo",
                "`echo`: the prompt is not echoed (only `false`)".into(),
            );
        }
    }
    match obj.get("suffix") {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) if s.is_empty() => {}
        Some(_) => {
            return refuse(
                "suffix",
                "`suffix`: fill-in-the-middle is not supported".into(),
            );
        }
    }
    if let Some(best_of) = get::<i64>(obj, "best_of")? {
        let n = get::<i64>(obj, "n")?.unwrap_or(1);
        if best_of != n {
            return refuse(
                "best_of",
                format!(
                    "`best_of`: only equal to `n` ({n}): completions are not ranked, not {best_of}"
                ),
            );
        }
    }
    match obj.get("metadata") {
        None | Some(Value::Null) => {}
        Some(Value::Object(m)) if m.len() <= 16 && m.values().all(|v| v.is_string()) => {}
        Some(_) => {
            return refuse(
                "metadata",
                "`metadata` must be an object of at most 16 strings".into(),
            );
        }
    }
    for key in ["user", "safety_identifier", "prompt_cache_key"] {
        get::<&str>(obj, key)?;
    }
    Ok(())
}

/// The most entries `logit_bias` may have (OpenAI's cap).
pub const MAX_LOGIT_BIAS: usize = 300;

/// OpenAI's `logit_bias`: `{"token id": bias}`, the bias from −100 to 100 (−100 bans the
/// token), the ids within the vocabulary of `n_vocab`.
pub fn logit_bias(obj: &Obj, n_vocab: usize) -> Result<Vec<(u32, f32)>, ApiError> {
    const P: &str = "logit_bias";
    let map = match obj.get(P) {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Object(m)) => m,
        Some(other) => {
            return Err(ApiError::param(
                P,
                format!(
                    "`{P}` must be an object of token ids to biases, not {}",
                    type_name(other)
                ),
            ));
        }
    };
    if map.len() > MAX_LOGIT_BIAS {
        return Err(ApiError::param(
            P,
            format!(
                "`{P}` has {} entries, more than {MAX_LOGIT_BIAS}",
                map.len()
            ),
        ));
    }
    let mut out = Vec::with_capacity(map.len());
    for (k, v) in map {
        let id = k
            .parse::<u32>()
            .ok()
            .filter(|&id| (id as usize) < n_vocab)
            .ok_or_else(|| {
                ApiError::param(
                    P,
                    format!(
                        "`{P}`: {k:?} is not a token id of this model's vocabulary of {n_vocab}"
                    ),
                )
            })?;
        let bias = v
            .as_f64()
            .filter(|b| (-100.0..=100.0).contains(b))
            .ok_or_else(|| {
                ApiError::param(
                    P,
                    format!(
                        "`{P}`: the bias of token {id} must be a number from -100 to 100, not {v}"
                    ),
                )
            })?;
        // -100 bans the token, as OpenAI's does.
        out.push((
            id,
            if bias <= -100.0 {
                f32::NEG_INFINITY
            } else {
                bias as f32
            },
        ));
    }
    Ok(out)
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
            (json!({"n": 9}), "n"),
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
    fn logprobs_follow_openais_fields_and_caps() {
        let chat = |v| chat_logprobs(&obj(v));
        let cmpl = |v| completion_logprobs(&obj(v));
        assert_eq!(chat(json!({})), Ok(None));
        assert_eq!(chat(json!({"logprobs": false})), Ok(None));
        assert_eq!(chat(json!({"logprobs": true})), Ok(Some(0)));
        assert_eq!(
            chat(json!({"logprobs": true, "top_logprobs": 20})),
            Ok(Some(20))
        );
        assert_eq!(
            chat(json!({"logprobs": null, "top_logprobs": null})),
            Ok(None)
        );
        assert_eq!(chat(json!({"n_probs": 3})), Ok(Some(3)));
        assert_eq!(chat(json!({"n_probs": 0})), Ok(None));
        assert_eq!(
            chat(json!({"logprobs": true, "top_logprobs": 2, "n_probs": 7})),
            Ok(Some(2))
        );
        assert_eq!(cmpl(json!({})), Ok(None));
        assert_eq!(cmpl(json!({"logprobs": 0})), Ok(Some(0)));
        assert_eq!(cmpl(json!({"logprobs": 5})), Ok(Some(5)));
        assert_eq!(cmpl(json!({"n_probs": 20})), Ok(Some(20)));
        for (body, param) in [
            (json!({"top_logprobs": 2}), "top_logprobs"),
            (
                json!({"logprobs": false, "top_logprobs": 0}),
                "top_logprobs",
            ),
            (
                json!({"logprobs": true, "top_logprobs": 21}),
                "top_logprobs",
            ),
            (
                json!({"logprobs": true, "top_logprobs": -1}),
                "top_logprobs",
            ),
            (json!({"logprobs": 1}), "logprobs"),
            (json!({"n_probs": 21}), "n_probs"),
        ] {
            let e = chat(body.clone()).expect_err(&body.to_string());
            assert_eq!(e.param.as_deref(), Some(param), "{body}");
        }
        for (body, param) in [
            (json!({"logprobs": 6}), "logprobs"),
            (json!({"logprobs": -1}), "logprobs"),
            (json!({"logprobs": true}), "logprobs"),
            (json!({"n_probs": -1}), "n_probs"),
        ] {
            let e = cmpl(body.clone()).expect_err(&body.to_string());
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

    #[test]
    fn unknown_or_unhonoured_fields_are_refused_by_name() {
        let ok = |v: Value, e: Endpoint| check_fields(&obj(v), e);
        let param = |v: Value, e: Endpoint| ok(v, e).unwrap_err().param.unwrap();
        assert!(
            ok(
                json!({"messages": [], "user": "u", "store": false, "metadata": {"a": "b"},
                          "service_tier": "auto", "modalities": ["text"], "audio": null}),
                Endpoint::Chat
            )
            .is_ok()
        );
        assert!(
            ok(
                json!({"prompt": "x", "echo": false, "best_of": 2, "n": 2, "suffix": ""}),
                Endpoint::Completion
            )
            .is_ok()
        );
        assert_eq!(param(json!({"mirostat": 2}), Endpoint::Chat), "mirostat");
        assert_eq!(
            param(json!({"audio": {"voice": "x"}}), Endpoint::Chat),
            "audio"
        );
        assert_eq!(param(json!({"functions": []}), Endpoint::Chat), "functions");
        assert_eq!(param(json!({"store": true}), Endpoint::Chat), "store");
        assert_eq!(
            param(json!({"modalities": ["text", "audio"]}), Endpoint::Chat),
            "modalities"
        );
        assert_eq!(
            param(json!({"service_tier": "flex"}), Endpoint::Chat),
            "service_tier"
        );
        assert_eq!(param(json!({"echo": true}), Endpoint::Completion), "echo");
        assert_eq!(
            param(json!({"suffix": "end"}), Endpoint::Completion),
            "suffix"
        );
        assert_eq!(
            param(json!({"best_of": 3}), Endpoint::Completion),
            "best_of"
        );
        // A field of the other endpoint says so.
        let e = ok(json!({"messages": []}), Endpoint::Completion).unwrap_err();
        assert!(e.message.contains("/v1/chat/completions"), "{}", e.message);
        assert_eq!(
            param(json!({"top_logprobs": 2}), Endpoint::Completion),
            "top_logprobs"
        );
    }

    #[test]
    fn logit_bias_is_checked_against_the_vocabulary() {
        let lb = |v: Value| logit_bias(&obj(json!({"logit_bias": v})), 100);
        assert_eq!(
            lb(json!({"5": 2.5, "7": -100})).unwrap(),
            vec![(5, 2.5), (7, f32::NEG_INFINITY)]
        );
        for bad in [
            json!({"100": 1}),
            json!({"x": 1}),
            json!({"5": 101}),
            json!({"5": "1"}),
            json!([1]),
        ] {
            assert_eq!(
                lb(bad.clone()).unwrap_err().param.as_deref(),
                Some("logit_bias"),
                "{bad}"
            );
        }
        let many: Map<String, Value> = (0..301).map(|i| (i.to_string(), json!(1))).collect();
        assert!(logit_bias(&obj(json!({"logit_bias": many})), 1000).is_err());
    }
}
