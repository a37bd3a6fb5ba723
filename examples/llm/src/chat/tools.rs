//! Tool calling: the tool list given to a template, the form a model writes its calls in (chosen
//! from the template), the parsers that read calls back from its output (whole, or as it
//! streams), and the generic form for templates that take no tools.
//!
//! * [`Tools`]: OpenAI's `tools` list (`[{"type": "function", "function": {"name",
//!   "description", "parameters"}}]`), checked ([`Tools::MAX_TOOLS`],
//!   [`Tools::MAX_JSON_BYTES`], names of 1 to 64 of
//!   `A-Za-z0-9_-`, no duplicates) and given to the template as `tools`
//!   ([`ChatOptions::tools`](super::ChatOptions::tools)).
//! * [`ToolCallFormat`]: how the model writes calls, detected from the template's source by
//!   the markers llama.cpp's `chat.cpp` looks for; [`ToolCallFormat::Generic`] for a template
//!   that does not render `tools` ([`ChatTemplate::renders_tools`](super::ChatTemplate::renders_tools)).
//! * [`parse_tool_calls`] and [`ToolCallStream`](super::ToolCallStream): the calls in a
//!   model's output. Never a panic: output that is not a well-formed call is given back whole
//!   as content, as OpenAI does.
//! * [`phi4mini_messages`]: Phi-4-mini's form (its template takes the tools in the system
//!   message).
//! * [`generic_messages`], [`tool_constraint`]: the generic form (as llama-server's generic
//!   handler: the tools described in a system message, the reply a JSON object with either
//!   `tool_calls` or `response`), and what to constrain the output with for a `tool_choice`.

use std::fmt::Write as _;
use std::sync::Arc;

use minijinja::value::Value;

use super::json::{self, Json, JsonError, write_str};
use super::markup_calls::{
    self, FUNCTION_OPEN, LFM2_CLOSE, LFM2_OPEN, PARAMETER_OPEN, Reader, Schemas, read_calls,
};
use super::message::{Message, ToolCall};
use crate::tokenizer::Tokenizer;

/// One function of a [`Tools`] list.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Function {
    /// The function's name: 1 to 64 of `A-Za-z0-9_-`.
    pub name: String,
    /// Its description, if given.
    pub description: Option<String>,
    /// The JSON Schema of its arguments, as compact JSON text (`{"type":"object"}` when not
    /// given).
    pub parameters: String,
}

/// The tools of a request: OpenAI's `tools` list, checked. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Tools {
    /// The list as given, for the template.
    json: Arc<Json>,
    functions: Arc<[Function]>,
}

impl PartialEq for Tools {
    fn eq(&self, other: &Tools) -> bool {
        self.functions == other.functions && self.json == other.json
    }
}

impl Eq for Tools {}

/// Why a tool list was refused; `index` is the position in the list.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ToolsError {
    /// Not JSON, or not a list.
    #[error("`tools` must be a JSON list of tools: {0}")]
    NotAList(String),
    /// JSON text longer than [`Tools::MAX_JSON_BYTES`].
    #[error("`tools` takes {0} bytes of JSON, more than {max}", max = Tools::MAX_JSON_BYTES)]
    TooLarge(usize),
    /// More tools than [`Tools::MAX_TOOLS`].
    #[error("`tools` lists {0} tools, more than {max}", max = Tools::MAX_TOOLS)]
    TooMany(usize),
    /// A tool that is not a `{"type": "function", "function": {...}}` object.
    #[error("`tools[{index}]`: {reason}")]
    BadTool {
        /// Its position.
        index: usize,
        /// What is wrong.
        reason: String,
    },
    /// Two tools of the same name.
    #[error("`tools[{index}]`: the name {name:?} is used twice")]
    Duplicate {
        /// The position of the second.
        index: usize,
        /// The name.
        name: String,
    },
}

/// Whether `name` is a valid function name (OpenAI's rule).
fn valid_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

impl Tools {
    /// The most tools a list may hold (llama.cpp sets none; OpenAI allows 128).
    pub const MAX_TOOLS: usize = 128;

    /// The longest JSON text of a list (256 KiB): every schema is rendered into the prompt, and
    /// a reply constrained by them compiles them.
    pub const MAX_JSON_BYTES: usize = 256 << 10;

    /// Reads OpenAI's `tools` list from JSON text.
    pub fn from_json(text: &str) -> Result<Tools, ToolsError> {
        if text.len() > Self::MAX_JSON_BYTES {
            return Err(ToolsError::TooLarge(text.len()));
        }
        let json = json::parse(text).map_err(|e| {
            ToolsError::NotAList(match e {
                JsonError::Incomplete => "the text ends early".into(),
                JsonError::Invalid(at) => format!("not JSON at byte {at}"),
            })
        })?;
        let Json::Arr(list) = &json else {
            return Err(ToolsError::NotAList("not a list".into()));
        };
        if list.len() > Self::MAX_TOOLS {
            return Err(ToolsError::TooMany(list.len()));
        }
        let mut functions: Vec<Function> = Vec::with_capacity(list.len());
        for (index, tool) in list.iter().enumerate() {
            let bad = |reason: &str| ToolsError::BadTool {
                index,
                reason: reason.into(),
            };
            if !matches!(tool, Json::Obj(_)) {
                return Err(bad("a tool must be an object"));
            }
            match tool.get("type") {
                Some(Json::Str(t)) if t == "function" => {}
                Some(Json::Str(_)) => {
                    return Err(bad("only tools of type \"function\" are supported"));
                }
                _ => return Err(bad("`type` must be \"function\"")),
            }
            let Some(f @ Json::Obj(_)) = tool.get("function") else {
                return Err(bad("`function` must be an object"));
            };
            let name = match f.get("name") {
                Some(Json::Str(n)) if valid_name(n) => n.clone(),
                Some(Json::Str(_)) => {
                    return Err(bad(
                        "`function.name` must be 1 to 64 letters, digits, underscores or dashes",
                    ));
                }
                _ => return Err(bad("`function.name` must be a string")),
            };
            let description = match f.get("description") {
                None | Some(Json::Null) => None,
                Some(Json::Str(d)) => Some(d.clone()),
                _ => return Err(bad("`function.description` must be a string")),
            };
            let parameters = match f.get("parameters") {
                None | Some(Json::Null) => r#"{"type":"object"}"#.to_string(),
                Some(p @ Json::Obj(_)) => p.to_compact(),
                _ => return Err(bad("`function.parameters` must be a JSON Schema object")),
            };
            if functions.iter().any(|g| g.name == name) {
                return Err(ToolsError::Duplicate { index, name });
            }
            functions.push(Function {
                name,
                description,
                parameters,
            });
        }
        Ok(Tools {
            json: Arc::new(json),
            functions: functions.into(),
        })
    }

    /// The functions, in order.
    pub fn functions(&self) -> &[Function] {
        &self.functions
    }

    /// The function named `name`.
    pub fn function(&self, name: &str) -> Option<&Function> {
        self.functions.iter().find(|f| f.name == name)
    }

    /// The list as the template gets it: as given, objects in order.
    pub(super) fn to_value(&self) -> Value {
        self.json.to_value()
    }
}

/// OpenAI's `tool_choice`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum ToolChoice {
    /// The model chooses between calls and a text reply.
    #[default]
    Auto,
    /// No call: the tools are not given to the template, the output is text.
    None,
    /// At least one call.
    Required,
    /// A call of this function.
    Function(String),
}

/// How a model writes its calls: chosen from its template ([`ToolCallFormat::detect`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ToolCallFormat {
    /// Hermes and Qwen 2.5 / Qwen 3: `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`,
    /// one block per call, after optional text.
    Hermes,
    /// Llama 3.1 / 3.2: the whole reply is `{"name": ..., "parameters": {...}}` (also after
    /// `<|python_tag|>`; `arguments` is taken for `parameters`; several calls separated by
    /// `;`).
    Llama3,
    /// Mistral: `[TOOL_CALLS][{"name": ..., "arguments": {...}, "id": ...}, ...]` after optional
    /// text.
    Mistral,
    /// Qwen3.5 and Qwen3-Coder (llama.cpp's "Qwen3-Coder" format): XML inside `<tool_call>`,
    /// one block per call, after optional text:
    /// `<tool_call>\n<function=NAME>\n<parameter=P>\nVALUE\n</parameter>\n...</function>\n</tool_call>`.
    /// A parameter's text is a string or JSON by llama.cpp's rule, from the kinds of values
    /// its schema in the request's tools allows ([`parse_tool_calls_for`]): a string only,
    /// the text itself; no string, JSON (and Python's `True` / `False` / `None`, which
    /// Qwen3.5's template writes); a string among others, JSON when the text is a JSON value
    /// of an allowed kind other than a string, else the text. Without the tools
    /// ([`parse_tool_calls`]) every parameter is of any kind.
    QwenXml,
    /// LFM2, LFM2.5 (Liquid AI): `<|tool_call_start|>[name(arg="v", n=1), other()]<|tool_call_end|>`
    /// after optional text, a Python-style list of calls with keyword arguments. An argument is
    /// a Python literal, as llama.cpp's LFM2 parser takes them: a string in either quote with
    /// JSON's escapes (and `\'`), a number as JSON writes it, `True` / `False` / `None` (or
    /// JSON's `true` / `false` / `null`: LFM2.5's template writes a dict as JSON), a list or a
    /// dict of them. The markers are special tokens; a reply that begins with the list is read
    /// as calls too (the closing marker may be left out), as for Phi-4-mini.
    Lfm2,
    /// Phi-4-mini: the tools are given in the system message's `tools` field (JSON text of the
    /// list of functions, which its template writes between `<|tool|>` and `<|/tool|>`), and
    /// the model writes `<|tool_call|>[{"name": ..., "arguments": {...}}, ...]<|/tool_call|>`
    /// after optional text (a single call object is taken for a list of one; the closing tag
    /// may be left out). The markers are special tokens, which the text of a reply does not
    /// carry, so a reply that begins with the list (or with `functools[`, the form vLLM's own
    /// Phi-4-mini template asks for) is read as calls too.
    Phi4Mini,
    /// The generic form, for templates without tools: the whole reply is a JSON object,
    /// `{"tool_calls": [{"name": ..., "arguments": {...}}, ...]}` (or llama.cpp's single
    /// `{"tool_call": {...}}`), or `{"response": "text"}`.
    Generic,
}

impl ToolCallFormat {
    /// The format a template's source asks for, by its markers, as llama.cpp's `chat.cpp`
    /// tells them: `[TOOL_CALLS]` Mistral, `<tool_call>` with `<function=` and `<parameter=`
    /// Qwen XML (unless the template writes `'<tool_call><function=' ~ tool_call.name ~ '>'`
    /// without the newlines, as llama.cpp excludes), `<tool_call>` without `<function=`
    /// Hermes/Qwen (other `<function=` forms take the generic form), `<|tool_list_start|>`
    /// and `<|tool_list_end|>` (LFM2), or `List of tools: [` without them (LFM2.5) LFM2's
    /// Python-style calls, `<|python_tag|>` or the
    /// `ipython` header Llama 3.x, `<|tool|>` and `<|/tool|>` (or vLLM's `functools[`)
    /// Phi-4-mini, else [`Generic`](Self::Generic). Use it only for a template that renders
    /// `tools` ([`ChatTemplate::renders_tools`](super::ChatTemplate::renders_tools)), or a
    /// system message's tools
    /// ([`ChatTemplate::renders_system_tools`](super::ChatTemplate::renders_system_tools)) for
    /// Phi-4-mini; the others take the generic form.
    pub fn detect(source: &str) -> ToolCallFormat {
        if source.contains("[TOOL_CALLS]") {
            ToolCallFormat::Mistral
        } else if (source.contains("<|tool_list_start|>") && source.contains("<|tool_list_end|>"))
            || (source.contains("List of tools: [") && !source.contains("<|tool_list_start|>"))
        {
            ToolCallFormat::Lfm2
        } else if source.contains(HERMES_OPEN)
            && source.contains(FUNCTION_OPEN)
            && source.contains(PARAMETER_OPEN)
            && !source.contains("'<tool_call><function=' ~ tool_call.name ~ '>'")
        {
            ToolCallFormat::QwenXml
        } else if source.contains(HERMES_OPEN) && !source.contains(FUNCTION_OPEN) {
            ToolCallFormat::Hermes
        } else if source.contains("<|python_tag|>")
            || source.contains("<|start_header_id|>ipython<|end_header_id|>")
        {
            ToolCallFormat::Llama3
        } else if (source.contains("<|tool|>") && source.contains("<|/tool|>"))
            || source.contains("functools[")
        {
            ToolCallFormat::Phi4Mini
        } else {
            ToolCallFormat::Generic
        }
    }

    /// The marker text a call starts with, for the formats that have one.
    pub(super) fn marker(self) -> Option<&'static str> {
        match self {
            ToolCallFormat::Hermes | ToolCallFormat::QwenXml => Some(HERMES_OPEN),
            ToolCallFormat::Mistral => Some(MISTRAL_OPEN),
            ToolCallFormat::Phi4Mini => Some(PHI4_OPEN),
            ToolCallFormat::Lfm2 => Some(LFM2_OPEN),
            ToolCallFormat::Llama3 | ToolCallFormat::Generic => None,
        }
    }
}

impl ToolCallFormat {
    /// The marker texts of the format's calls (`<tool_call>`, `[TOOL_CALLS]`,
    /// `<|python_tag|>`, ...).
    pub fn markers(self) -> &'static [&'static str] {
        match self {
            ToolCallFormat::Hermes | ToolCallFormat::QwenXml => &[HERMES_OPEN, HERMES_CLOSE],
            ToolCallFormat::Mistral => &[MISTRAL_OPEN],
            ToolCallFormat::Llama3 => &[PYTHON_TAG],
            ToolCallFormat::Phi4Mini => &[PHI4_OPEN, PHI4_CLOSE],
            ToolCallFormat::Lfm2 => &[LFM2_OPEN, LFM2_CLOSE],
            ToolCallFormat::Generic => &[],
        }
    }

    /// The ids of the format's markers that are control tokens of `tokenizer`'s vocabulary:
    /// a model writes them as one token, which a decoder renders as nothing unless told to
    /// keep it ([`GenerateParams::preserve`](crate::session::GenerateParams::preserve)), and
    /// the reader must see them (Mistral's `[TOOL_CALLS]`, Llama 3.x's `<|python_tag|>`,
    /// Phi-4-mini's `<|tool_call|>`, LFM2's `<|tool_call_start|>`).
    pub fn preserved_tokens(self, tokenizer: &Tokenizer) -> Vec<u32> {
        self.markers()
            .iter()
            .filter_map(|m| tokenizer.token_id(m))
            .filter(|&id| tokenizer.is_control(id))
            .collect()
    }
}

pub(super) const HERMES_OPEN: &str = "<tool_call>";
pub(super) const HERMES_CLOSE: &str = "</tool_call>";
pub(super) const MISTRAL_OPEN: &str = "[TOOL_CALLS]";
pub(super) const PYTHON_TAG: &str = "<|python_tag|>";
/// Phi-4-mini's call markers (special tokens of its vocabulary).
pub(super) const PHI4_OPEN: &str = "<|tool_call|>";
pub(super) const PHI4_CLOSE: &str = "<|/tool_call|>";
/// The word vLLM's own Phi-4-mini template has the model write before its list of calls.
pub(super) const FUNCTOOLS: &str = "functools";

/// A model's output read for calls: the text, and the calls.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ParsedOutput {
    /// The text besides the calls (trimmed at the calls); all of the output when it holds no
    /// well-formed call.
    pub content: String,
    /// The calls, in order; their `id` is the model's (Mistral) or `None`.
    pub calls: Vec<ToolCall>,
}

/// Reads the calls in `text`, written in `format`. Output that is not made of well-formed
/// calls where the format puts them (a cut or malformed call, a call without a name) comes
/// back whole as `content`, without calls. Qwen XML's parameters are typed without a schema
/// (see [`parse_tool_calls_for`]).
pub fn parse_tool_calls(format: ToolCallFormat, text: &str) -> ParsedOutput {
    parse_calls(format, text, None)
}

/// [`parse_tool_calls`] for a reply to a request with `tools`: Qwen XML's parameters are
/// typed by their schemas ([`ToolCallFormat::QwenXml`]); the other formats read the same.
pub fn parse_tool_calls_for(format: ToolCallFormat, text: &str, tools: &Tools) -> ParsedOutput {
    parse_calls(format, text, Some(tools))
}

/// The parameters schema of `tools`' function `name`.
pub(super) fn schema_of(tools: &Tools, name: &str) -> Option<Json> {
    json::parse(&tools.function(name)?.parameters).ok()
}

/// [`parse_tool_calls`], with the request's tools when known.
pub(super) fn parse_calls(
    format: ToolCallFormat,
    text: &str,
    tools: Option<&Tools>,
) -> ParsedOutput {
    let lookup = |name: &str| tools.and_then(|t| schema_of(t, name));
    let schemas: Schemas<'_> = Some(&lookup);
    let parsed = match format {
        ToolCallFormat::Hermes => parse_hermes(text),
        ToolCallFormat::QwenXml => parse_markup(text, HERMES_OPEN, Reader::xml, schemas),
        ToolCallFormat::Lfm2 => parse_lfm2(text),
        ToolCallFormat::Llama3 => parse_llama3(text),
        ToolCallFormat::Mistral => parse_mistral(text),
        ToolCallFormat::Phi4Mini => parse_phi4mini(text),
        ToolCallFormat::Generic => parse_generic(text),
    };
    parsed.unwrap_or_else(|| ParsedOutput {
        content: text.to_string(),
        calls: Vec::new(),
    })
}

/// A call object `v` (of JSON text `raw`): `name` (a string) and the arguments under
/// `args_key` (an object; `{}` when absent), and an `id` string if there is one. The
/// arguments are the model's own text of the object without the whitespace outside strings
/// ([`json::strip_ws`]): what [`ToolCallStream`](super::ToolCallStream) sends in pieces as it
/// arrives.
fn call_of(v: &Json, raw: &str, args_key: &str) -> Option<ToolCall> {
    let Json::Obj(_) = v else { return None };
    let name = v.get("name")?.as_str()?;
    if name.is_empty() {
        return None;
    }
    let arguments = match v.get(args_key) {
        None => "{}".to_string(),
        Some(Json::Obj(_)) => json::strip_ws(json::member_text(raw, args_key)?),
        // Arguments given as JSON text of an object, as some models write them.
        Some(Json::Str(s)) => match json::parse(s) {
            Ok(Json::Obj(_)) => json::strip_ws(s),
            _ => return None,
        },
        Some(_) => return None,
    };
    Some(ToolCall {
        id: v.get("id").and_then(Json::as_str).map(str::to_string),
        name: name.to_string(),
        arguments,
    })
}

pub(super) fn skip_ws(s: &str) -> &str {
    s.trim_start_matches([' ', '\t', '\n', '\r'])
}

fn parse_hermes(text: &str) -> Option<ParsedOutput> {
    let first = text.find(HERMES_OPEN)?;
    let mut content = text[..first].trim_end().to_string();
    let mut calls = Vec::new();
    let mut rest = &text[first..];
    loop {
        let after = skip_ws(rest.strip_prefix(HERMES_OPEN)?);
        let (v, end) = json::parse_prefix(after).ok()?;
        calls.push(call_of(&v, &after[..end], "arguments")?);
        let tail = skip_ws(&after[end..]);
        rest = match tail.strip_prefix(HERMES_CLOSE) {
            Some(r) => r,
            // The closing tag cut off by the end of the generation.
            None if tail.is_empty() => tail,
            None => return None,
        };
        let next = skip_ws(rest);
        if next.starts_with(HERMES_OPEN) {
            rest = next;
            continue;
        }
        // Text after the calls (rare) is kept as content.
        let after_calls = rest.trim();
        if !after_calls.is_empty() {
            if !content.is_empty() {
                content.push('\n');
            }
            content.push_str(after_calls);
        }
        return Some(ParsedOutput { content, calls });
    }
}

/// The calls of a format read by a [`Reader`] (made by `reader` at the first `marker`), after
/// the text before them; text after them is kept as content.
fn parse_markup(
    text: &str,
    marker: &str,
    reader: fn(usize) -> Reader,
    tools: Schemas<'_>,
) -> Option<ParsedOutput> {
    let first = text.find(marker)?;
    let (calls, end) = read_calls(reader(first), text, tools)?;
    let mut content = text[..first].trim_end().to_string();
    let after = text[end..].trim();
    if !after.is_empty() {
        if !content.is_empty() {
            content.push('\n');
        }
        content.push_str(after);
    }
    Some(ParsedOutput { content, calls })
}

fn parse_lfm2(text: &str) -> Option<ParsedOutput> {
    // The list alone: the markers are special tokens, which a constrained reply has not.
    if skip_ws(text).starts_with('[') {
        let (calls, end) = read_calls(Reader::py(0), text, None)?;
        return Some(ParsedOutput {
            content: text[end..].trim().to_string(),
            calls,
        });
    }
    parse_markup(text, LFM2_OPEN, Reader::py, None)
}

fn parse_llama3(text: &str) -> Option<ParsedOutput> {
    // JSON's whitespace only, as the streaming reader skips it.
    let t = text.trim_matches([' ', '\t', '\n', '\r']);
    let mut rest = t.strip_prefix(PYTHON_TAG).map_or(t, skip_ws);
    let mut calls = Vec::new();
    loop {
        let (v, end) = json::parse_prefix(rest).ok()?;
        let call = match v.get("parameters") {
            Some(_) => call_of(&v, &rest[..end], "parameters")?,
            None => call_of(&v, &rest[..end], "arguments")?,
        };
        calls.push(call);
        rest = skip_ws(&rest[end..]);
        if rest.is_empty() {
            return Some(ParsedOutput {
                content: String::new(),
                calls,
            });
        }
        rest = skip_ws(rest.strip_prefix(';')?);
        if rest.is_empty() {
            return Some(ParsedOutput {
                content: String::new(),
                calls,
            });
        }
    }
}

fn parse_mistral(text: &str) -> Option<ParsedOutput> {
    let at = text.find(MISTRAL_OPEN)?;
    let after = skip_ws(&text[at + MISTRAL_OPEN.len()..]);
    let (v, end) = json::parse_prefix(after).ok()?;
    if !skip_ws(&after[end..]).is_empty() {
        return None;
    }
    let Json::Arr(items) = v else { return None };
    if items.is_empty() {
        return None;
    }
    let calls = items
        .iter()
        .zip(json::item_texts(&after[..end]))
        .map(|(c, raw)| call_of(c, raw, "arguments"))
        .collect::<Option<Vec<_>>>()?;
    Some(ParsedOutput {
        content: text[..at].trim_end().to_string(),
        calls,
    })
}

fn parse_phi4mini(text: &str) -> Option<ParsedOutput> {
    let start = skip_ws(text);
    // The list alone: the markers are special tokens, not in the reply's text.
    let (mut content, mut rest) = if start.starts_with('[') || start.starts_with(FUNCTOOLS) {
        (
            String::new(),
            start.strip_prefix(FUNCTOOLS).unwrap_or(start),
        )
    } else {
        let at = text.find(PHI4_OPEN)?;
        (
            text[..at].trim_end().to_string(),
            &text[at + PHI4_OPEN.len()..],
        )
    };
    let mut calls = Vec::new();
    loop {
        let after = skip_ws(rest);
        let (v, end) = json::parse_prefix(after).ok()?;
        let raw = &after[..end];
        match &v {
            Json::Arr(items) if !items.is_empty() => {
                for (c, r) in items.iter().zip(json::item_texts(raw)) {
                    calls.push(call_of(c, r, "arguments")?);
                }
            }
            Json::Obj(_) => calls.push(call_of(&v, raw, "arguments")?),
            _ => return None,
        }
        let mut tail = skip_ws(&after[end..]);
        if let Some(r) = tail.strip_prefix(PHI4_CLOSE) {
            tail = skip_ws(r);
        }
        if let Some(r) = tail.strip_prefix(PHI4_OPEN) {
            rest = r;
            continue;
        }
        // Text after the calls is kept as content.
        let after_calls = tail.trim();
        if !after_calls.is_empty() {
            if !content.is_empty() {
                content.push('\n');
            }
            content.push_str(after_calls);
        }
        return Some(ParsedOutput { content, calls });
    }
}

fn parse_generic(text: &str) -> Option<ParsedOutput> {
    let v = json::parse(text).ok()?;
    if let Some(Json::Str(r)) = v.get("response") {
        return Some(ParsedOutput {
            content: r.clone(),
            calls: Vec::new(),
        });
    }
    let calls = match (v.get("tool_calls"), v.get("tool_call")) {
        (Some(Json::Arr(items)), _) if !items.is_empty() => items
            .iter()
            .zip(json::item_texts(json::member_text(text, "tool_calls")?))
            .map(|(c, raw)| call_of(c, raw, "arguments"))
            .collect::<Option<Vec<_>>>()?,
        (None, Some(c)) => vec![call_of(
            c,
            json::member_text(text, "tool_call")?,
            "arguments",
        )?],
        _ => return None,
    };
    Some(ParsedOutput {
        content: String::new(),
        calls,
    })
}

/// The JSON Schema of one call of `f`: `{"name": f, <args_key>: its parameters}`.
fn call_schema(f: &Function, args_key: &str, out: &mut String) {
    out.push_str(r#"{"type":"object","properties":{"name":{"const":"#);
    write_str(&f.name, out);
    out.push_str("},");
    write_str(args_key, out);
    out.push(':');
    out.push_str(&f.parameters);
    out.push_str(r#"},"required":["name","#);
    write_str(args_key, out);
    out.push_str(r#"],"additionalProperties":false}"#);
}

/// The functions a choice allows: all of them, or the named one (`None`: unknown).
fn allowed<'a>(tools: &'a Tools, choice: &ToolChoice) -> Option<Vec<&'a Function>> {
    match choice {
        ToolChoice::Function(name) => tools.function(name).map(|f| vec![f]),
        _ => Some(tools.functions().iter().collect()),
    }
}

/// The schema of one call of any of `fns`.
fn any_call_schema(fns: &[&Function], args_key: &str) -> String {
    let mut out = String::new();
    if let [f] = fns {
        call_schema(f, args_key, &mut out);
        return out;
    }
    out.push_str(r#"{"anyOf":["#);
    for (i, f) in fns.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        call_schema(f, args_key, &mut out);
    }
    out.push_str("]}");
    out
}

/// The schema of a list of calls (one at most unless `parallel`).
fn calls_schema(fns: &[&Function], args_key: &str, parallel: bool) -> String {
    let max = if parallel { "" } else { r#","maxItems":1"# };
    format!(
        r#"{{"type":"array","items":{},"minItems":1{max}}}"#,
        any_call_schema(fns, args_key)
    )
}

/// The JSON Schema of a generic-form reply (as JSON text): `{"tool_calls": [...]}` (calls of
/// the functions `choice` allows, one at most unless `parallel`), or also `{"response":
/// "..."}` under [`ToolChoice::Auto`]. `None` under [`ToolChoice::None`] or for a function
/// the tools do not have.
pub fn generic_reply_schema(tools: &Tools, choice: &ToolChoice, parallel: bool) -> Option<String> {
    if *choice == ToolChoice::None || tools.functions().is_empty() {
        return None;
    }
    let fns = allowed(tools, choice)?;
    let calls = format!(
        r#"{{"type":"object","properties":{{"tool_calls":{}}},"required":["tool_calls"],"additionalProperties":false}}"#,
        calls_schema(&fns, "arguments", parallel)
    );
    Some(match choice {
        ToolChoice::Auto => format!(
            r#"{{"anyOf":[{calls},{{"type":"object","properties":{{"response":{{"type":"string"}}}},"required":["response"],"additionalProperties":false}}]}}"#
        ),
        _ => calls,
    })
}

/// What to constrain a reply with ([`tool_constraint`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ToolConstraint {
    /// A JSON Schema (JSON text) the whole reply must match.
    JsonSchema(String),
    /// A grammar in llguidance's Lark dialect (its `%json {schema}` rules included).
    Lark(String),
}

/// What a reply must be constrained by so that it is what `choice` asks for, in `format`:
///
/// * the generic form: the reply's JSON Schema ([`generic_reply_schema`]) under `auto`,
///   `required` and a named function;
/// * a model's own format: nothing under `auto` (the model chooses, its output is parsed), a
///   Lark grammar of the format's calls (of the allowed functions, one unless `parallel`;
///   Llama 3.x: one; Qwen XML: each parameter JSON of its schema, or any text where the schema
///   allows a string, as llama.cpp's grammar; Phi-4-mini and LFM2: the list of calls without
///   the markers, special tokens that grammar text cannot produce; LFM2's arguments JSON of
///   their schemas) under `required` and a named function;
/// * nothing under `none`, nor when the named function is not in `tools`.
pub fn tool_constraint(
    format: ToolCallFormat,
    tools: &Tools,
    choice: &ToolChoice,
    parallel: bool,
) -> Option<ToolConstraint> {
    if format == ToolCallFormat::Generic {
        return generic_reply_schema(tools, choice, parallel).map(ToolConstraint::JsonSchema);
    }
    if matches!(choice, ToolChoice::Auto | ToolChoice::None) || tools.functions().is_empty() {
        return None;
    }
    let fns = allowed(tools, choice)?;
    let mut g = String::new();
    match format {
        ToolCallFormat::Hermes => {
            let _ = writeln!(
                g,
                "start: call{}",
                if parallel { " (\"\\n\" call)*" } else { "" }
            );
            g.push_str("call: \"<tool_call>\\n\" json_call \"\\n</tool_call>\"\n");
            let _ = writeln!(g, "json_call: %json {}", any_call_schema(&fns, "arguments"));
        }
        ToolCallFormat::Llama3 => {
            let _ = writeln!(g, "start: %json {}", any_call_schema(&fns, "parameters"));
        }
        ToolCallFormat::Mistral => {
            g.push_str("start: \"[TOOL_CALLS]\" json_calls\n");
            let _ = writeln!(
                g,
                "json_calls: %json {}",
                calls_schema(&fns, "arguments", parallel)
            );
        }
        ToolCallFormat::QwenXml => {
            let _ = writeln!(
                g,
                "start: call{}",
                if parallel { " (\"\\n\" call)*" } else { "" }
            );
            qwen_xml_rules(&fns, &mut g);
        }
        ToolCallFormat::Lfm2 => {
            // The list alone, as for Phi-4-mini: the markers are special tokens.
            let sep = if parallel { " (\", \" call)*" } else { "" };
            let _ = writeln!(g, "start: \"[\" call{sep} \"]\"");
            lfm2_rules(&fns, &mut g);
        }
        ToolCallFormat::Phi4Mini => {
            // The list alone: the model's markers are special tokens, which grammar text
            // cannot produce and the reply's text does not carry.
            let _ = writeln!(
                g,
                "start: %json {}",
                calls_schema(&fns, "arguments", parallel)
            );
        }
        ToolCallFormat::Generic => return None,
    }
    Some(ToolConstraint::Lark(g))
}

/// `text` as a string literal of a Lark grammar.
fn lark_str(text: &str) -> String {
    let mut out = String::new();
    write_str(text, &mut out);
    out
}

/// A function's arguments: each property's name and schema (`{}` when it is not an object),
/// whether the schema requires it, in the schema's order.
fn properties(f: &Function) -> Vec<(String, String, bool)> {
    let Ok(schema) = json::parse(&f.parameters) else {
        return Vec::new();
    };
    let required: Vec<&str> = match schema.get("required") {
        Some(Json::Arr(r)) => r.iter().filter_map(Json::as_str).collect(),
        _ => Vec::new(),
    };
    let Some(Json::Obj(props)) = schema.get("properties") else {
        return Vec::new();
    };
    props
        .iter()
        .map(|(name, s)| {
            let s = match s {
                Json::Obj(_) => s.to_compact(),
                _ => "{}".to_string(),
            };
            (name.clone(), s, required.contains(&name.as_str()))
        })
        .collect()
}

/// The grammar expression of a call's arguments from the rules of its properties (`args`
/// holds each one's rule name and whether it is required): the required ones in order, then
/// any of the optional ones, separated by `sep` (a Lark literal, or empty); empty for none.
fn args_expr(args: &[(String, bool)], sep: &str) -> String {
    let pick = |req: bool| -> Vec<&str> {
        args.iter()
            .filter(|a| a.1 == req)
            .map(|a| a.0.as_str())
            .collect()
    };
    let (required, optional) = (pick(true), pick(false));
    let joint = if sep.is_empty() {
        " ".to_string()
    } else {
        format!(" {sep} ")
    };
    let mut out = required.join(&joint);
    if !optional.is_empty() {
        let any = format!("({})", optional.join(" | "));
        let more = format!("({}{any})*", joint.trim_start());
        if required.is_empty() {
            out = format!("({any} {more})?");
        } else {
            let _ = write!(out, " {more}");
        }
    }
    out
}

/// Qwen XML's rules of a call of any of `fns` (`call`), as llama.cpp's grammar writes it: each
/// parameter `<parameter=P>\nVALUE\n</parameter>\n`, the value JSON of its schema unless the
/// schema allows a string (then any text up to `\n</parameter>\n`).
fn qwen_xml_rules(fns: &[&Function], g: &mut String) {
    let calls: Vec<String> = (0..fns.len()).map(|i| format!("fn_{i}")).collect();
    let _ = writeln!(g, "call: {}", calls.join(" | "));
    for (i, f) in fns.iter().enumerate() {
        let _ = writeln!(
            g,
            "fn_{i}: {}{} \"</function>\\n</tool_call>\"",
            lark_str(&format!("<tool_call>\n<function={}>\n", f.name)),
            if properties(f).is_empty() {
                String::new()
            } else {
                format!(" args_{i}")
            }
        );
        let mut args = Vec::new();
        for (j, (name, schema, required)) in properties(f).into_iter().enumerate() {
            let open = lark_str(&format!("<parameter={name}>\n"));
            let takes_text = json::parse(&schema).map_or(true, |s| markup_calls::allows_string(&s));
            if takes_text {
                let _ = writeln!(g, "p_{i}_{j}: {open} text_{i}_{j}");
                let _ = writeln!(g, "text_{i}_{j}[suffix=\"\\n</parameter>\\n\"]: /(?s:.*)/");
            } else {
                let _ = writeln!(g, "p_{i}_{j}: {open} v_{i}_{j} \"\\n</parameter>\\n\"");
                let _ = writeln!(g, "v_{i}_{j}: %json {schema}");
            }
            args.push((format!("p_{i}_{j}"), required));
        }
        if args.is_empty() {
            continue;
        }
        let _ = writeln!(g, "args_{i}: {}", args_expr(&args, ""));
    }
}

/// LFM2's rules of a call of any of `fns` (`call`): `name(arg=value, ...)`, each value JSON
/// of its schema (a Python literal LFM2's parser reads: strings in double quotes, `true`,
/// `false`, `null`), as llama.cpp's grammar has them.
fn lfm2_rules(fns: &[&Function], g: &mut String) {
    let calls: Vec<String> = (0..fns.len()).map(|i| format!("fn_{i}")).collect();
    let _ = writeln!(g, "call: {}", calls.join(" | "));
    for (i, f) in fns.iter().enumerate() {
        let mut args = Vec::new();
        for (j, (name, schema, required)) in properties(f).into_iter().enumerate() {
            let _ = writeln!(g, "p_{i}_{j}: {} v_{i}_{j}", lark_str(&format!("{name}=")));
            let _ = writeln!(g, "v_{i}_{j}: %json {schema}");
            args.push((format!("p_{i}_{j}"), required));
        }
        let _ = writeln!(
            g,
            "fn_{i}: {} {} \")\"",
            lark_str(&format!("{}(", f.name)),
            args_expr(&args, "\", \"")
        );
    }
}

/// The system text of the generic form: the tools, and the JSON the reply must be.
fn generic_system_text(tools: &Tools, choice: &ToolChoice, parallel: bool) -> Option<String> {
    let schema = generic_reply_schema(tools, choice, parallel)?;
    let fns = allowed(tools, choice)?;
    let mut s =
        String::from("You can call any of the following tools to satisfy the user's requests:\n");
    for f in fns {
        s.push_str(r#"{"name":"#);
        write_str(&f.name, &mut s);
        if let Some(d) = &f.description {
            s.push_str(r#","description":"#);
            write_str(d, &mut s);
        }
        s.push_str(r#","parameters":"#);
        s.push_str(&f.parameters);
        s.push_str("}\n");
    }
    s.push('\n');
    s.push_str(match choice {
        ToolChoice::Auto => {
            "Respond in JSON format, either with `tool_calls` (a request to call tools) or with \
             `response` (a reply to the user's request)"
        }
        _ => "Respond in JSON format with `tool_calls` (a request to call tools)",
    });
    s.push_str(", following this JSON schema: ");
    s.push_str(&schema);
    Some(s)
}

/// The conversation in the generic form, for a template that does not render `tools`: the
/// tools described in a system message (added, or put after the text of the first message
/// when it is a system message) unless `choice` is `none`; an assistant message's calls
/// written as the reply it stands for (`{"tool_calls": [{"name", "arguments"}]}`, after its
/// text); a run of `tool` messages as one user message of `{"tool_response": {"tool_call_id",
/// "name", "content"}}` lines (as llama.cpp's polyfill does), so that templates that know only
/// user and assistant take them.
pub fn generic_messages(
    messages: &[Message],
    tools: &Tools,
    choice: &ToolChoice,
    parallel: bool,
) -> Vec<Message> {
    let mut out: Vec<Message> = Vec::with_capacity(messages.len() + 1);
    if let Some(text) = generic_system_text(tools, choice, parallel) {
        match messages.first() {
            Some(m) if m.role == "system" => {
                out.push(Message::system(format!("{}\n\n{text}", m.content)));
            }
            _ => out.push(Message::system(text)),
        }
    }
    let skip = usize::from(!out.is_empty() && messages.first().is_some_and(|m| m.role == "system"));
    let mut tool_run: Option<Message> = None;
    for m in &messages[skip..] {
        if m.role == "tool" {
            let mut line = String::from(r#"{"tool_response":{"#);
            if let Some(id) = &m.tool_call_id {
                line.push_str(r#""tool_call_id":"#);
                write_str(id, &mut line);
                line.push(',');
            }
            if let Some(name) = &m.name {
                line.push_str(r#""name":"#);
                write_str(name, &mut line);
                line.push(',');
            }
            line.push_str(r#""content":"#);
            write_str(&m.content, &mut line);
            line.push_str("}}");
            match &mut tool_run {
                Some(u) => {
                    u.content.push('\n');
                    u.content.push_str(&line);
                }
                None => tool_run = Some(Message::user(line)),
            }
            continue;
        }
        if let Some(u) = tool_run.take() {
            out.push(u);
        }
        if m.tool_calls.is_empty() {
            out.push(Message {
                tool_calls: Vec::new(),
                ..m.clone()
            });
            continue;
        }
        let mut reply = String::from(r#"{"tool_calls":["#);
        for (i, c) in m.tool_calls.iter().enumerate() {
            if i > 0 {
                reply.push(',');
            }
            reply.push_str(r#"{"name":"#);
            write_str(&c.name, &mut reply);
            reply.push_str(r#","arguments":"#);
            match json::parse(&c.arguments) {
                Ok(a) => reply.push_str(&a.to_compact()),
                Err(_) => write_str(&c.arguments, &mut reply),
            }
            reply.push('}');
        }
        reply.push_str("]}");
        let content = if m.content.is_empty() {
            reply
        } else {
            format!("{}\n{reply}", m.content)
        };
        out.push(Message::new(m.role.clone(), content));
    }
    if let Some(u) = tool_run {
        out.push(u);
    }
    out
}

/// The system text Phi-4-mini's conversation gets when it has no system message of its own:
/// the one its model card shows with tools.
pub const PHI4MINI_SYSTEM: &str = "You are a helpful assistant with some tools.";

/// The conversation in Phi-4-mini's form: the tools (those `choice` allows; none under
/// `none`) as the system message's [`tools`](Message::tools), JSON text of the list of the
/// functions (`[{"name", "description", "parameters"}]`, as the request gives them) written
/// as Python's `json.dumps` writes it, the way its model card passes them; the first message
/// when it is a system message, else one added with [`PHI4MINI_SYSTEM`]. An assistant
/// message's calls are written after its text as the model writes them,
/// `<|tool_call|>[{"name": ..., "arguments": {...}}]<|/tool_call|>` (its template renders
/// only a message's text). `tool` messages are left as they are.
pub fn phi4mini_messages(messages: &[Message], tools: &Tools, choice: &ToolChoice) -> Vec<Message> {
    let mut out: Vec<Message> = Vec::with_capacity(messages.len() + 1);
    let fns = (*choice != ToolChoice::None)
        .then(|| allowed(tools, choice))
        .flatten()
        .filter(|f| !f.is_empty());
    let mut rest = messages;
    if let Some(fns) = fns {
        let Json::Arr(list) = tools.json.as_ref() else {
            unreachable!("a checked tool list is a list")
        };
        let listed: Vec<Json> = list
            .iter()
            .filter_map(|t| t.get("function"))
            .filter(|f| {
                let name = f.get("name").and_then(Json::as_str);
                fns.iter().any(|g| Some(g.name.as_str()) == name)
            })
            .cloned()
            .collect();
        let mut system = match messages.first() {
            Some(m) if m.role == "system" => {
                rest = &messages[1..];
                m.clone()
            }
            _ => Message::system(PHI4MINI_SYSTEM),
        };
        system.tools = Some(Json::Arr(listed).to_python());
        out.push(system);
    }
    for m in rest {
        if m.tool_calls.is_empty() {
            out.push(m.clone());
            continue;
        }
        let calls: Vec<Json> = m
            .tool_calls
            .iter()
            .map(|c| {
                let arguments = json::parse(&c.arguments).unwrap_or(Json::Str(c.arguments.clone()));
                Json::Obj(vec![
                    ("name".into(), Json::Str(c.name.clone())),
                    ("arguments".into(), arguments),
                ])
            })
            .collect();
        let text = format!(
            "{}{PHI4_OPEN}{}{PHI4_CLOSE}",
            m.content,
            Json::Arr(calls).to_python()
        );
        out.push(Message {
            content: text,
            tool_calls: Vec::new(),
            ..m.clone()
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const WEATHER: &str = r#"[{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city.", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
        {"type": "function", "function": {"name": "add", "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}}}]"#;

    fn tools() -> Tools {
        Tools::from_json(WEATHER).unwrap()
    }

    fn call(name: &str, args: &str) -> ToolCall {
        ToolCall::new(name, args)
    }

    #[test]
    fn tool_lists_are_checked() {
        let t = tools();
        assert_eq!(t.functions().len(), 2);
        assert_eq!(
            t.functions()[1].parameters,
            r#"{"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"integer"}}}"#
        );
        assert_eq!(
            t.function("get_weather").unwrap().description.as_deref(),
            Some("The weather in a city.")
        );
        let f = |body: &str| format!(r#"[{{"type": "function", "function": {body}}}]"#);
        for (text, want) in [
            ("{", "NotAList"),
            ("{}", "NotAList"),
            ("[1]", "BadTool"),
            (r#"[{"type": "code_interpreter"}]"#, "BadTool"),
            (r#"[{"function": {"name": "a"}}]"#, "BadTool"),
            (&f(r#"{"name": ""}"#), "BadTool"),
            (&f(r#"{"name": "a b"}"#), "BadTool"),
            (
                &f(&format!(r#"{{"name": "{}"}}"#, "a".repeat(65))),
                "BadTool",
            ),
            (&f(r#"{"name": 3}"#), "BadTool"),
            (&f(r#"{"name": "a", "parameters": []}"#), "BadTool"),
            (&f(r#"{"name": "a", "description": 1}"#), "BadTool"),
            (
                &format!(
                    "[{0}, {0}]",
                    r#"{"type": "function", "function": {"name": "a"}}"#
                ),
                "Duplicate",
            ),
        ] {
            let e = Tools::from_json(text).expect_err(text);
            assert!(format!("{e:?}").starts_with(want), "{text}: {e:?}");
        }
        let many = format!(
            "[{}]",
            (0..=Tools::MAX_TOOLS)
                .map(|i| format!(r#"{{"type": "function", "function": {{"name": "f{i}"}}}}"#))
                .collect::<Vec<_>>()
                .join(",")
        );
        assert_eq!(
            Tools::from_json(&many),
            Err(ToolsError::TooMany(Tools::MAX_TOOLS + 1))
        );
        let huge = f(&format!(
            r#"{{"name": "a", "description": "{}"}}"#,
            "x".repeat(1 << 20)
        ));
        assert_eq!(
            Tools::from_json(&huge),
            Err(ToolsError::TooLarge(huge.len()))
        );
        assert_eq!(
            Tools::from_json(&f(r#"{"name": "a"}"#))
                .unwrap()
                .functions()[0]
                .parameters,
            r#"{"type":"object"}"#
        );
    }

    #[test]
    fn formats_are_told_by_their_markers() {
        assert_eq!(
            ToolCallFormat::detect("x [TOOL_CALLS] <tool_call>"),
            ToolCallFormat::Mistral
        );
        assert_eq!(
            ToolCallFormat::detect("{{ '<tool_call>' }}"),
            ToolCallFormat::Hermes
        );
        assert_eq!(
            ToolCallFormat::detect("<|python_tag|>"),
            ToolCallFormat::Llama3
        );
        assert_eq!(
            ToolCallFormat::detect("<|start_header_id|>ipython<|end_header_id|>"),
            ToolCallFormat::Llama3
        );
        assert_eq!(
            ToolCallFormat::detect("{{ m.content }}"),
            ToolCallFormat::Generic
        );
        assert_eq!(
            ToolCallFormat::detect(
                "{{ '<|' + message['role'] + '|>' + message['content'] + '<|tool|>' + message['tools'] + '<|/tool|>' }}"
            ),
            ToolCallFormat::Phi4Mini
        );
        assert_eq!(
            ToolCallFormat::detect("formatted as functools[{\"name\": ...}]"),
            ToolCallFormat::Phi4Mini
        );
        // Qwen3.5's and Qwen3-Coder's XML calls; a `<function=` form without the newlines
        // is not theirs.
        assert_eq!(
            ToolCallFormat::detect(
                "{{- '<tool_call>\\n<function=' + tool_call.name + '>\\n' }}{{- '<parameter=' + args_name + '>\\n' }}"
            ),
            ToolCallFormat::QwenXml
        );
        assert_eq!(
            ToolCallFormat::detect(
                "{{ '<tool_call><function=' ~ tool_call.name ~ '>' }}<parameter="
            ),
            ToolCallFormat::Generic
        );
        // LFM2 lists its tools between markers, LFM2.5 after `List of tools: [`.
        assert_eq!(
            ToolCallFormat::detect(
                "\"List of tools: <|tool_list_start|>[\" + tools + \"]<|tool_list_end|>\""
            ),
            ToolCallFormat::Lfm2
        );
        assert_eq!(
            ToolCallFormat::detect("\"List of tools: [\" + tools + \"]\""),
            ToolCallFormat::Lfm2
        );
        assert_eq!(
            ToolCallFormat::detect("List of tools: [<|tool_list_start|>"),
            ToolCallFormat::Generic
        );
        // Phi-3.5's template has `<|end|>` but no tool markers.
        assert_eq!(
            ToolCallFormat::detect("{{ '<|user|>\n' + m['content'] + '<|end|>' }}"),
            ToolCallFormat::Generic
        );
    }

    #[test]
    fn hermes_calls_and_text() {
        let out = "Let me look.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 1, \"b\": 2}}\n</tool_call>";
        assert_eq!(
            parse_tool_calls(ToolCallFormat::Hermes, out),
            ParsedOutput {
                content: "Let me look.".into(),
                calls: vec![
                    call("get_weather", r#"{"city":"Paris"}"#),
                    call("add", r#"{"a":1,"b":2}"#)
                ],
            }
        );
        // The closing tag cut off at the end; arguments as JSON text.
        let cut = "<tool_call>\n{\"name\": \"add\", \"arguments\": \"{\\\"a\\\": 1}\"}";
        assert_eq!(
            parse_tool_calls(ToolCallFormat::Hermes, cut).calls,
            [call("add", r#"{"a":1}"#)]
        );
    }

    /// Qwen3.5's XML calls, typed by the tools' schemas or without them.
    #[test]
    fn qwen_xml_calls_and_text() {
        let t = Tools::from_json(
            r#"[{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
                "s": {"type": "string"}, "n": {"type": "integer"}, "b": {"type": "boolean"},
                "o": {"type": "object"}, "u": {"type": ["number", "string"]}}}}}]"#,
        )
        .unwrap();
        let out = "I'll check.\n\n<tool_call>\n<function=f>\n<parameter=s>\n42\n</parameter>\n<parameter=n>\n42\n</parameter>\n<parameter=b>\nTrue\n</parameter>\n<parameter=o>\n{\"k\": [1, \"</x>\"]}\n</parameter>\n<parameter=u>\n1.5e3\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=g>\n</function>\n</tool_call>";
        assert_eq!(
            parse_tool_calls_for(ToolCallFormat::QwenXml, out, &t),
            ParsedOutput {
                content: "I'll check.".into(),
                calls: vec![
                    call(
                        "f",
                        r#"{"s":"42","n":42,"b":true,"o":{"k":[1,"</x>"]},"u":1.5e3}"#
                    ),
                    call("g", "{}"),
                ],
            }
        );
        // Without the tools: JSON that is not a string, else text.
        assert_eq!(
            parse_tool_calls(ToolCallFormat::QwenXml, out).calls[0].arguments,
            r#"{"s":42,"n":42,"b":"True","o":{"k":[1,"</x>"]},"u":1.5e3}"#
        );
        // A multi-line text keeps its lines; the closing tag may be cut off at the end; text
        // after the calls is content.
        let lines = "<tool_call>\n<function=f>\n<parameter=s>\nline 1\n  line \"2\"\n\n</parameter>\n</function>";
        assert_eq!(
            parse_tool_calls_for(ToolCallFormat::QwenXml, lines, &t).calls,
            [call("f", r#"{"s":"line 1\n  line \"2\"\n"}"#)]
        );
        let after = format!("{lines}\n</tool_call>\nDone.");
        assert_eq!(
            parse_tool_calls(ToolCallFormat::QwenXml, &after).content,
            "Done."
        );
        // A closing tag cut short is not dropped.
        let cut = format!("{lines}\n</tool_ca");
        assert_eq!(
            parse_tool_calls(ToolCallFormat::QwenXml, &cut),
            ParsedOutput {
                content: "</tool_ca".into(),
                calls: vec![call("f", r#"{"s":"line 1\n  line \"2\"\n"}"#)],
            }
        );
    }

    /// LFM2's Python-style calls.
    #[test]
    fn lfm2_calls_and_text() {
        let out = "Let me see.<|tool_call_start|>[get_weather(city='Paris, \"FR\"', days=[1, 2.50]), add(a=-1, b={'x': None, \"y\": true}), now()]<|tool_call_end|>";
        assert_eq!(
            parse_tool_calls(ToolCallFormat::Lfm2, out),
            ParsedOutput {
                content: "Let me see.".into(),
                calls: vec![
                    call("get_weather", r#"{"city":"Paris, \"FR\"","days":[1,2.50]}"#),
                    call("add", r#"{"a":-1,"b":{"x":null,"y":true}}"#),
                    call("now", "{}"),
                ],
            }
        );
        // The list alone (a constrained reply), spaces around its parts; text after it.
        assert_eq!(
            parse_tool_calls(ToolCallFormat::Lfm2, " [ add( a=1 ,b=2 ) ,now() ] and more"),
            ParsedOutput {
                content: "and more".into(),
                calls: vec![call("add", r#"{"a":1,"b":2}"#), call("now", "{}")],
            }
        );
        // Two blocks; text after them.
        let two = "<|tool_call_start|>[a(x=\"\\u00e9\\n\")]<|tool_call_end|><|tool_call_start|>[b()]<|tool_call_end|>\nDone.";
        let p = parse_tool_calls(ToolCallFormat::Lfm2, two);
        assert_eq!(p.calls, [call("a", r#"{"x":"é\n"}"#), call("b", "{}")]);
        assert_eq!(p.content, "Done.");
    }

    #[test]
    fn malformed_calls_come_back_as_content() {
        for (format, text) in [
            (
                ToolCallFormat::Hermes,
                "<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 1",
            ),
            (
                ToolCallFormat::Hermes,
                "<tool_call>\n{\"arguments\": {}}\n</tool_call>",
            ),
            (
                ToolCallFormat::Hermes,
                "<tool_call>\n{\"name\": \"\"}\n</tool_call>",
            ),
            (
                ToolCallFormat::Hermes,
                "<tool_call>\n{\"name\": \"a\"} trailing\n</tool_call>",
            ),
            (
                ToolCallFormat::Hermes,
                "<tool_call>\n{\"name\": \"a\", \"arguments\": [1]}\n</tool_call>",
            ),
            (
                ToolCallFormat::Hermes,
                "<tool_call>\nnot json\n</tool_call>",
            ),
            (
                ToolCallFormat::Llama3,
                "{\"name\": \"a\", \"parameters\": {}} and then",
            ),
            (ToolCallFormat::Llama3, "The answer is {\"name\": \"a\"}"),
            (ToolCallFormat::Llama3, "{\"key\": 1}"),
            (ToolCallFormat::Mistral, "[TOOL_CALLS][]"),
            (
                ToolCallFormat::Mistral,
                "[TOOL_CALLS][{\"name\": \"a\", \"arguments\": {}}",
            ),
            (ToolCallFormat::Mistral, "[TOOL_CALLS]{\"name\": \"a\"}"),
            (ToolCallFormat::Generic, "Plain text."),
            (ToolCallFormat::Generic, "{\"tool_calls\": []}"),
            (
                ToolCallFormat::Generic,
                "{\"tool_calls\": [{\"arguments\": {}}]}",
            ),
            (ToolCallFormat::Generic, "{\"response\": 3}"),
            (ToolCallFormat::Generic, "{\"response\": \"x\""),
            (ToolCallFormat::Phi4Mini, "<|tool_call|>[]<|/tool_call|>"),
            (ToolCallFormat::Phi4Mini, "[1, 2] are numbers"),
            (
                ToolCallFormat::Phi4Mini,
                "[{\"name\": \"a\", \"arguments\": [1]}]",
            ),
            (
                ToolCallFormat::Phi4Mini,
                "Call <|tool_call|>{\"arguments\": {}}<|/tool_call|>",
            ),
            (
                ToolCallFormat::Phi4Mini,
                "<|tool_call|>[{\"name\": \"a\", \"arguments\": {}}",
            ),
            (ToolCallFormat::Phi4Mini, "functools"),
            (
                ToolCallFormat::QwenXml,
                "<tool_call>\n<function=f>\n<parameter=s>\nx\n</parameter>\n",
            ),
            (
                ToolCallFormat::QwenXml,
                "<tool_call>\n<function=f>\n<parameter=s>\nx cut",
            ),
            (ToolCallFormat::QwenXml, "<tool_call>\n<function=f"),
            (
                ToolCallFormat::QwenXml,
                "<tool_call>\n<function=>\n</function>\n</tool_call>",
            ),
            (
                ToolCallFormat::QwenXml,
                "<tool_call>\n{\"name\": \"f\"}\n</tool_call>",
            ),
            (
                ToolCallFormat::QwenXml,
                "<tool_call>\n<function=f>\nstray\n</function>\n</tool_call>",
            ),
            (
                ToolCallFormat::QwenXml,
                "<tool_call>\n<function=f>\n</function>\ntrailing",
            ),
            (
                ToolCallFormat::QwenXml,
                "<tool_call>\n<function=a b>\n</function>\n</tool_call>",
            ),
            (
                ToolCallFormat::Lfm2,
                "<|tool_call_start|>[]<|tool_call_end|>",
            ),
            (ToolCallFormat::Lfm2, "<|tool_call_start|>[f(a=1"),
            (ToolCallFormat::Lfm2, "<|tool_call_start|>[f(a='x)]"),
            (
                ToolCallFormat::Lfm2,
                "<|tool_call_start|>[f(1)]<|tool_call_end|>",
            ),
            (
                ToolCallFormat::Lfm2,
                "<|tool_call_start|>[f(a=x)]<|tool_call_end|>",
            ),
            (
                ToolCallFormat::Lfm2,
                "<|tool_call_start|>[f (a=1)]<|tool_call_end|>",
            ),
            (
                ToolCallFormat::Lfm2,
                "<|tool_call_start|>f(a=1)<|tool_call_end|>",
            ),
            (ToolCallFormat::Lfm2, "<|tool_call_start|>[f(a=1) g()]"),
            (ToolCallFormat::Lfm2, "[1, 2] are numbers"),
            (ToolCallFormat::Lfm2, "[f(a=01)]"),
        ] {
            assert_eq!(
                parse_tool_calls(format, text),
                ParsedOutput {
                    content: text.into(),
                    calls: vec![]
                },
                "{format:?} {text}"
            );
        }
    }

    #[test]
    fn llama3_mistral_and_generic_calls() {
        assert_eq!(
            parse_tool_calls(
                ToolCallFormat::Llama3,
                " {\"name\": \"add\", \"parameters\": {\"a\": 1}} "
            )
            .calls,
            [call("add", r#"{"a":1}"#)]
        );
        assert_eq!(
            parse_tool_calls(
                ToolCallFormat::Llama3,
                "<|python_tag|>{\"name\": \"a\", \"arguments\": {}}; {\"name\": \"b\", \"parameters\": {}}"
            )
            .calls,
            [call("a", "{}"), call("b", "{}")]
        );
        let m = parse_tool_calls(
            ToolCallFormat::Mistral,
            "Sure.[TOOL_CALLS][{\"name\": \"add\", \"arguments\": {\"a\": 1}, \"id\": \"abcDEF123\"}]",
        );
        assert_eq!(m.content, "Sure.");
        assert_eq!(m.calls[0].id.as_deref(), Some("abcDEF123"));
        assert_eq!(m.calls[0].arguments, r#"{"a":1}"#);
        assert_eq!(
            parse_tool_calls(
                ToolCallFormat::Generic,
                "{\"response\": \"Hi \\\"you\\\"\"}"
            ),
            ParsedOutput {
                content: "Hi \"you\"".into(),
                calls: vec![]
            }
        );
        assert_eq!(
            parse_tool_calls(
                ToolCallFormat::Generic,
                "{\"tool_call\": {\"name\": \"a\", \"arguments\": {\"x\": [1.5]}}}"
            )
            .calls,
            [call("a", r#"{"x":[1.5]}"#)]
        );
        assert_eq!(
            parse_tool_calls(
                ToolCallFormat::Generic,
                "{\"tool_calls\": [{\"name\": \"a\", \"arguments\": {}}, {\"name\": \"b\"}]}"
            )
            .calls,
            [call("a", "{}"), call("b", "{}")]
        );
    }

    #[test]
    fn constraints_for_each_choice() {
        let t = tools();
        let auto = generic_reply_schema(&t, &ToolChoice::Auto, true).unwrap();
        let schema = json::parse(&auto).unwrap();
        let Some(Json::Arr(branches)) = schema.get("anyOf") else {
            panic!("{auto}")
        };
        assert_eq!(branches.len(), 2);
        let calls = branches[0]
            .get("properties")
            .and_then(|p| p.get("tool_calls"))
            .unwrap();
        assert_eq!(calls.get("maxItems"), None);
        let one = generic_reply_schema(&t, &ToolChoice::Required, false).unwrap();
        let one = json::parse(&one).unwrap();
        let calls = one
            .get("properties")
            .and_then(|p| p.get("tool_calls"))
            .unwrap();
        assert_eq!(calls.get("maxItems"), Some(&Json::Int(1)));
        let named = generic_reply_schema(&t, &ToolChoice::Function("add".into()), true).unwrap();
        assert!(
            named.contains(r#"{"const":"add"}"#) && !named.contains("get_weather"),
            "{named}"
        );
        assert_eq!(generic_reply_schema(&t, &ToolChoice::None, true), None);
        assert_eq!(
            generic_reply_schema(&t, &ToolChoice::Function("nope".into()), true),
            None
        );
        assert_eq!(
            tool_constraint(ToolCallFormat::Generic, &t, &ToolChoice::Auto, true),
            Some(ToolConstraint::JsonSchema(auto))
        );
        assert_eq!(
            tool_constraint(ToolCallFormat::Hermes, &t, &ToolChoice::Auto, true),
            None
        );
        for (format, choice, parallel) in [
            (ToolCallFormat::Hermes, ToolChoice::Required, true),
            (
                ToolCallFormat::Hermes,
                ToolChoice::Function("add".into()),
                false,
            ),
            (ToolCallFormat::Llama3, ToolChoice::Required, true),
            (ToolCallFormat::Mistral, ToolChoice::Required, false),
            (ToolCallFormat::Phi4Mini, ToolChoice::Required, false),
            (
                ToolCallFormat::Phi4Mini,
                ToolChoice::Function("add".into()),
                true,
            ),
            (ToolCallFormat::QwenXml, ToolChoice::Required, true),
            (
                ToolCallFormat::QwenXml,
                ToolChoice::Function("add".into()),
                false,
            ),
            (ToolCallFormat::Lfm2, ToolChoice::Required, true),
            (
                ToolCallFormat::Lfm2,
                ToolChoice::Function("add".into()),
                false,
            ),
        ] {
            let Some(ToolConstraint::Lark(g)) = tool_constraint(format, &t, &choice, parallel)
            else {
                panic!("{format:?} {choice:?}")
            };
            assert!(g.starts_with("start: "), "{g}");
            // Each %json body is one JSON object running to the end of its line.
            for line in g.lines() {
                if let Some(at) = line.find("%json ") {
                    let schema =
                        json::parse(&line[at + 6..]).unwrap_or_else(|e| panic!("{e:?}: {line}"));
                    assert!(matches!(schema, Json::Obj(_)), "{line}");
                }
            }
            assert_eq!(
                g.contains("\\n\" call)*"),
                matches!(format, ToolCallFormat::Hermes | ToolCallFormat::QwenXml) && parallel,
                "{g}"
            );
            if format == ToolCallFormat::QwenXml {
                // A string parameter is text up to its closing tag; the others JSON.
                assert_eq!(g.contains("get_weather"), choice == ToolChoice::Required);
                assert_eq!(
                    g.contains(r#"text_0_0[suffix="\n</parameter>\n"]"#),
                    choice == ToolChoice::Required,
                    "{g}"
                );
                assert!(g.contains(r#"%json {"type":"integer"}"#), "{g}");
            }
            if format == ToolCallFormat::Lfm2 {
                // The list alone; each argument `name=` JSON of its schema.
                assert!(g.starts_with("start: \"[\" call"), "{g}");
                assert_eq!(g.contains("(\", \" call)*"), parallel, "{g}");
                assert!(
                    g.contains(r#"p_0_0: "a=" v_0_0"#) || g.contains(r#""city=""#),
                    "{g}"
                );
            }
            if format == ToolCallFormat::Phi4Mini {
                // The list of calls alone (its markers are special tokens).
                assert!(g.starts_with("start: %json {\"type\":\"array\""), "{g}");
                assert_eq!(g.contains(r#""maxItems":1"#), !parallel, "{g}");
                assert_eq!(g.contains("get_weather"), choice == ToolChoice::Required);
            }
        }
    }

    /// Phi-4-mini's form: the tools in the system message as `json.dumps` writes their
    /// functions, a system message added when there is none, calls written after the text.
    #[test]
    fn the_phi4mini_form_of_a_conversation() {
        let t = tools();
        let msgs = [
            Message::user("Weather in Paris?"),
            Message::assistant_calls(
                "Let me look.",
                vec![ToolCall {
                    id: Some("call_1".into()),
                    ..call("get_weather", r#"{"city":"Paris"}"#)
                }],
            ),
            Message::tool("call_1", "Sunny"),
        ];
        let p = phi4mini_messages(&msgs, &t, &ToolChoice::Auto);
        assert_eq!(p.len(), 4);
        assert_eq!(p[0].content, PHI4MINI_SYSTEM);
        assert_eq!(
            p[0].tools.as_deref(),
            Some(
                r#"[{"name": "get_weather", "description": "The weather in a city.", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}, {"name": "add", "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}}]"#
            )
        );
        assert_eq!(p[1], msgs[0]);
        assert_eq!(
            p[2],
            Message::assistant(
                r#"Let me look.<|tool_call|>[{"name": "get_weather", "arguments": {"city": "Paris"}}]<|/tool_call|>"#
            )
        );
        assert_eq!(p[3], msgs[2]);
        // Its own system message takes the tools; a named function is the only one listed.
        let with_system = [Message::system("Be brief."), msgs[0].clone()];
        let p = phi4mini_messages(&with_system, &t, &ToolChoice::Function("add".into()));
        assert_eq!((p.len(), p[0].content.as_str()), (2, "Be brief."));
        assert!(
            p[0].tools
                .as_deref()
                .unwrap()
                .starts_with(r#"[{"name": "add""#)
        );
        assert!(!p[0].tools.as_deref().unwrap().contains("get_weather"));
        // `none`: no tools, the calls of the history still written.
        let p = phi4mini_messages(&msgs, &t, &ToolChoice::None);
        assert_eq!(p.len(), 3);
        assert!(p.iter().all(|m| m.tools.is_none()));
        assert!(p[1].content.ends_with("<|/tool_call|>"));
        // What the form writes parses back to the calls.
        let back = parse_tool_calls(ToolCallFormat::Phi4Mini, &p[1].content);
        assert_eq!(back.content, "Let me look.");
        assert_eq!(back.calls, [call("get_weather", r#"{"city":"Paris"}"#)]);
    }

    #[test]
    fn the_generic_form_of_a_conversation() {
        let t = tools();
        let msgs = [
            Message::system("Be brief."),
            Message::user("Weather in Paris, and 1 + 2?"),
            Message::assistant_calls(
                "",
                vec![
                    ToolCall {
                        id: Some("call_1".into()),
                        ..call("get_weather", r#"{"city": "Paris"}"#)
                    },
                    ToolCall {
                        id: Some("call_2".into()),
                        ..call("add", r#"{"a":1,"b":2}"#)
                    },
                ],
            ),
            Message::tool("call_1", "Sunny"),
            Message::tool("call_2", "3"),
        ];
        let g = generic_messages(&msgs, &t, &ToolChoice::Auto, true);
        assert_eq!(g.len(), 4);
        assert!(
            g[0].content
                .starts_with("Be brief.\n\nYou can call any of the following tools")
        );
        assert!(g[0].content.contains(
            r#"{"name":"get_weather","description":"The weather in a city.","parameters":{"#
        ));
        assert_eq!(g[1], msgs[1]);
        assert_eq!(
            g[2],
            Message::assistant(
                r#"{"tool_calls":[{"name":"get_weather","arguments":{"city":"Paris"}},{"name":"add","arguments":{"a":1,"b":2}}]}"#
            )
        );
        assert_eq!(
            g[3],
            Message::user(
                "{\"tool_response\":{\"tool_call_id\":\"call_1\",\"content\":\"Sunny\"}}\n{\"tool_response\":{\"tool_call_id\":\"call_2\",\"content\":\"3\"}}"
            )
        );
        // The assistant's reply in the generic form parses back to its calls.
        let back = parse_tool_calls(ToolCallFormat::Generic, &g[2].content);
        assert_eq!(
            back.calls,
            [
                call("get_weather", r#"{"city":"Paris"}"#),
                call("add", r#"{"a":1,"b":2}"#)
            ]
        );
        // `none`: no tools described.
        let n = generic_messages(&msgs[1..2], &t, &ToolChoice::None, true);
        assert_eq!(n, [msgs[1].clone()]);
    }
}
