//! Readers of the call formats whose arguments are not a JSON object as written: Qwen3.5's and
//! Qwen3-Coder's XML calls ([`ToolCallFormat::QwenXml`](super::ToolCallFormat::QwenXml)) and
//! LFM2's Python-style calls ([`ToolCallFormat::Lfm2`](super::ToolCallFormat::Lfm2)).
//!
//! Each reader walks the text one piece of the format at a time ([`Step`]), from where it
//! stopped, and takes a piece only when all of it is there: the whole-text parse
//! ([`read_calls`]) and the streaming reader ([`ToolCallStream`](super::ToolCallStream)) run
//! the same reader, so what is streamed is what the whole text parses to. A call's arguments
//! are built as compact JSON text, a member at a time: `{` and its first member, `,` and each
//! next one, `}` when the call closes (`{}` for a call without arguments).

use super::json::{self, Json, write_str};
use super::message::ToolCall;

/// The parameters schema of a request's function, by name (`None` without tools, or for a
/// function they do not have).
pub(super) type Schemas<'a> = Option<&'a dyn Fn(&str) -> Option<Json>>;

/// Qwen XML: a call's block (the same tags as Hermes'), ...
const CALL_OPEN: &str = "<tool_call>";
const CALL_CLOSE: &str = "</tool_call>";

/// ... its function (`<function=NAME>`), ...
pub(super) const FUNCTION_OPEN: &str = "<function=";
/// ... its end, ...
pub(super) const FUNCTION_CLOSE: &str = "</function>";
/// ... and a parameter (`<parameter=NAME>\nVALUE\n</parameter>`).
pub(super) const PARAMETER_OPEN: &str = "<parameter=";
pub(super) const PARAMETER_CLOSE: &str = "</parameter>";

/// LFM2: the markers around a list of calls (special tokens of its vocabulary).
pub(super) const LFM2_OPEN: &str = "<|tool_call_start|>";
pub(super) const LFM2_CLOSE: &str = "<|tool_call_end|>";

/// One piece read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Step {
    /// A call of this function begins.
    Call(String),
    /// The next piece of the current call's arguments (JSON text).
    Args(String),
    /// The calls are over; text that is not a call follows (from [`Reader::pos`]).
    End,
    /// More text is needed to tell.
    More,
    /// The text breaks the format.
    Bad,
}

/// Whether `text` starts with `lit`: `Some(true)`, `Some(false)` when it cannot, `None` when
/// `text` is a proper beginning of `lit` (more text will tell).
pub(super) fn starts(text: &str, lit: &str) -> Option<bool> {
    if text.starts_with(lit) {
        Some(true)
    } else if lit.starts_with(text) {
        None
    } else {
        Some(false)
    }
}

/// The offset of the first byte at or after `i` that is not JSON whitespace.
pub(super) fn skip_at(text: &str, mut i: usize) -> usize {
    let b = text.as_bytes();
    while i < b.len() && json::is_ws(b[i]) {
        i += 1;
    }
    i
}

/// A reader of one of these formats.
#[derive(Clone, Debug)]
pub(super) enum Reader {
    /// Qwen XML.
    Xml(XmlReader),
    /// LFM2's Python-style calls.
    Py(PyReader),
}

impl Reader {
    /// A Qwen XML reader at `pos`, where a `<tool_call>` begins.
    pub(super) fn xml(pos: usize) -> Reader {
        Reader::Xml(XmlReader {
            pos,
            ..XmlReader::default()
        })
    }

    /// An LFM2 reader at `pos`, where its `<|tool_call_start|>` or a list of calls begins.
    pub(super) fn py(pos: usize) -> Reader {
        Reader::Py(PyReader {
            pos,
            ..PyReader::default()
        })
    }

    /// Reads the next piece of `text` (the same text, grown, at each call).
    pub(super) fn step(&mut self, text: &str, tools: Schemas<'_>) -> Step {
        match self {
            Reader::Xml(r) => r.step(text, tools),
            Reader::Py(r) => r.step(text),
        }
    }

    /// Where the reader is: after the pieces read.
    pub(super) fn pos(&self) -> usize {
        match self {
            Reader::Xml(r) => r.pos,
            Reader::Py(r) => r.pos,
        }
    }

    /// Whether the text may end here with the calls read so far whole.
    pub(super) fn may_end(&self) -> bool {
        match self {
            Reader::Xml(r) => matches!(r.state, XmlState::Between | XmlState::AfterFunction),
            Reader::Py(r) => matches!(r.state, PyState::AfterList | PyState::Between),
        }
    }
}

/// The calls of `text` read from `from` on by `reader`, and where the text after them begins;
/// `None` when the text there is not well-formed calls (a cut call included).
pub(super) fn read_calls(
    mut reader: Reader,
    text: &str,
    tools: Schemas<'_>,
) -> Option<(Vec<ToolCall>, usize)> {
    let mut calls: Vec<ToolCall> = Vec::new();
    loop {
        match reader.step(text, tools) {
            Step::Call(name) => calls.push(ToolCall::new(name, String::new())),
            Step::Args(piece) => calls.last_mut()?.arguments.push_str(&piece),
            Step::End => return (!calls.is_empty()).then_some((calls, reader.pos())),
            // The text may end here (what is left, a cut closing tag, is text after them).
            Step::More => {
                return (reader.may_end() && !calls.is_empty()).then_some((calls, reader.pos()));
            }
            Step::Bad => return None,
        }
    }
}

/// Whether `name` may be a function's or a parameter's name in a tag: not empty, and no
/// whitespace or `<` / `>` in it.
fn tag_name(name: &str) -> bool {
    !name.is_empty() && !name.contains(|c: char| c.is_whitespace() || c == '<' || c == '>')
}

/// The name of a tag whose text begins at `from` (after `<function=` or `<parameter=`), up to
/// its `>`, and the offset after the `>`.
fn read_tag_name(text: &str, from: usize) -> Result<(&str, usize), Step> {
    let rest = &text[from..];
    match rest.find('>') {
        Some(gt) if tag_name(&rest[..gt]) => Ok((&rest[..gt], from + gt + 1)),
        Some(_) => Err(Step::Bad),
        None if rest.contains(|c: char| c.is_whitespace() || c == '<') => Err(Step::Bad),
        None => Err(Step::More),
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum XmlState {
    /// Before a `<tool_call>` (or the text after the calls).
    #[default]
    Between,
    /// In a `<function=...>`: before a parameter or `</function>`.
    InFunction,
    /// After `</function>`, before `</tool_call>` (which a cut reply may lack).
    AfterFunction,
}

/// The reader of Qwen XML calls:
/// `<tool_call>\n<function=NAME>\n<parameter=P>\nVALUE\n</parameter>\n...</function>\n</tool_call>`.
#[derive(Clone, Debug, Default)]
pub(super) struct XmlReader {
    pos: usize,
    state: XmlState,
    /// Parameters of the current call read.
    params: usize,
    /// The current call's function's parameters schema, when the tools have it.
    schema: Option<Json>,
}

impl XmlReader {
    fn step(&mut self, text: &str, tools: Schemas<'_>) -> Step {
        let at = skip_at(text, self.pos);
        let rest = &text[at..];
        if rest.is_empty() {
            return Step::More;
        }
        match self.state {
            XmlState::Between => match starts(rest, CALL_OPEN) {
                None => Step::More,
                Some(false) => {
                    self.pos = at;
                    Step::End
                }
                Some(true) => {
                    let f = skip_at(text, at + CALL_OPEN.len());
                    match starts(&text[f..], FUNCTION_OPEN) {
                        None => return Step::More,
                        Some(false) => return Step::Bad,
                        Some(true) => {}
                    }
                    let (name, end) = match read_tag_name(text, f + FUNCTION_OPEN.len()) {
                        Ok(n) => n,
                        Err(step) => return step,
                    };
                    self.schema = tools.and_then(|schema_of| schema_of(name));
                    self.pos = end;
                    self.state = XmlState::InFunction;
                    self.params = 0;
                    Step::Call(name.to_string())
                }
            },
            XmlState::InFunction => {
                match starts(rest, FUNCTION_CLOSE) {
                    None => return Step::More,
                    Some(true) => {
                        self.pos = at + FUNCTION_CLOSE.len();
                        self.state = XmlState::AfterFunction;
                        return Step::Args(if self.params == 0 { "{}" } else { "}" }.into());
                    }
                    Some(false) => {}
                }
                match starts(rest, PARAMETER_OPEN) {
                    None => return Step::More,
                    Some(false) => return Step::Bad,
                    Some(true) => {}
                }
                let (name, from) = match read_tag_name(text, at + PARAMETER_OPEN.len()) {
                    Ok(n) => n,
                    Err(step) => return step,
                };
                let Some(len) = text[from..].find(PARAMETER_CLOSE) else {
                    return Step::More;
                };
                let raw = &text[from..from + len];
                let raw = raw.strip_prefix('\n').unwrap_or(raw);
                let raw = raw.strip_suffix('\n').unwrap_or(raw);
                let schema = self
                    .schema
                    .as_ref()
                    .and_then(|s| s.get("properties"))
                    .and_then(|p| p.get(name));
                let Some(value) = xml_value(raw, schema) else {
                    return Step::Bad;
                };
                let mut piece = String::from(if self.params == 0 { "{" } else { "," });
                write_str(name, &mut piece);
                piece.push(':');
                piece.push_str(&value);
                self.params += 1;
                self.pos = from + len + PARAMETER_CLOSE.len();
                Step::Args(piece)
            }
            XmlState::AfterFunction => match starts(rest, CALL_CLOSE) {
                None => Step::More,
                Some(false) => Step::Bad,
                Some(true) => {
                    self.pos = at + CALL_CLOSE.len();
                    self.state = XmlState::Between;
                    self.step(text, tools)
                }
            },
        }
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum PyState {
    /// Before the first `<|tool_call_start|>` (or a list of calls alone).
    #[default]
    Start,
    /// After the marker, before `[`.
    ListOpen,
    /// Before a call's name.
    Name,
    /// In a call's `(...)`: before an argument or `)`.
    Arg,
    /// After an argument: before `,` or `)`.
    AfterArg,
    /// After a call: before `,` or `]`.
    AfterCall,
    /// After `]`: before `<|tool_call_end|>` (which a list alone has not).
    AfterList,
    /// After a block: before another, or the text after the calls.
    Between,
}

/// The reader of LFM2's calls: `<|tool_call_start|>[name(arg="v", n=1), other()]<|tool_call_end|>`,
/// each argument a Python literal ([`py_value`]).
#[derive(Clone, Debug, Default)]
pub(super) struct PyReader {
    pos: usize,
    state: PyState,
    /// Arguments of the current call read.
    args: usize,
}

/// Whether `c` may be in a function's or an argument's name.
fn name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == '-'
}

impl PyReader {
    fn step(&mut self, text: &str) -> Step {
        loop {
            let at = skip_at(text, self.pos);
            let rest = &text[at..];
            if rest.is_empty() {
                return Step::More;
            }
            match self.state {
                PyState::Start | PyState::Between => match starts(rest, LFM2_OPEN) {
                    None => return Step::More,
                    Some(true) => {
                        self.pos = at + LFM2_OPEN.len();
                        self.state = PyState::ListOpen;
                    }
                    Some(false) if self.state == PyState::Start && rest.starts_with('[') => {
                        self.pos = at;
                        self.state = PyState::ListOpen;
                    }
                    Some(false) if self.state == PyState::Start => return Step::Bad,
                    Some(false) => {
                        self.pos = at;
                        return Step::End;
                    }
                },
                PyState::ListOpen => {
                    if !rest.starts_with('[') {
                        return Step::Bad;
                    }
                    self.pos = at + 1;
                    self.state = PyState::Name;
                }
                PyState::Name => {
                    let len = rest.find(|c: char| !name_char(c)).unwrap_or(rest.len());
                    if len == rest.len() {
                        return Step::More;
                    }
                    if len == 0 || !rest[len..].starts_with('(') {
                        return Step::Bad;
                    }
                    self.pos = at + len + 1;
                    self.state = PyState::Arg;
                    self.args = 0;
                    return Step::Call(rest[..len].to_string());
                }
                PyState::Arg => {
                    if rest.starts_with(')') {
                        self.pos = at + 1;
                        self.state = PyState::AfterCall;
                        return Step::Args(if self.args == 0 { "{}" } else { "}" }.into());
                    }
                    let len = rest.find(|c: char| !name_char(c)).unwrap_or(rest.len());
                    if len == rest.len() {
                        return Step::More;
                    }
                    if len == 0 || !rest[len..].starts_with('=') {
                        return Step::Bad;
                    }
                    let value = match py_value(text, at + len + 1, 0) {
                        Ok(v) => v,
                        Err(PyError::Incomplete) => return Step::More,
                        Err(PyError::Invalid) => return Step::Bad,
                    };
                    let mut piece = String::from(if self.args == 0 { "{" } else { "," });
                    write_str(&rest[..len], &mut piece);
                    piece.push(':');
                    piece.push_str(&value.0);
                    self.args += 1;
                    self.pos = value.1;
                    self.state = PyState::AfterArg;
                    return Step::Args(piece);
                }
                PyState::AfterArg => {
                    if rest.starts_with(',') {
                        self.state = PyState::Arg;
                    } else if rest.starts_with(')') {
                        self.state = PyState::AfterCall;
                        self.pos = at + 1;
                        return Step::Args("}".into());
                    } else {
                        return Step::Bad;
                    }
                    self.pos = at + 1;
                }
                PyState::AfterCall => {
                    if rest.starts_with(',') {
                        self.state = PyState::Name;
                    } else if rest.starts_with(']') {
                        self.state = PyState::AfterList;
                    } else {
                        return Step::Bad;
                    }
                    self.pos = at + 1;
                }
                PyState::AfterList => match starts(rest, LFM2_CLOSE) {
                    None => return Step::More,
                    Some(true) => {
                        self.pos = at + LFM2_CLOSE.len();
                        self.state = PyState::Between;
                    }
                    // The closing marker left out (a list alone): what follows is read as
                    // after a block.
                    Some(false) => self.state = PyState::Between,
                },
            }
        }
    }
}

/// Why a Python literal was not read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum PyError {
    /// The text ends inside it (or where more text could change it, as after digits).
    Incomplete,
    /// Not a literal of those read.
    Invalid,
}

/// The Python literal at byte `i` of `text` as compact JSON text, and the offset after it, as
/// llama.cpp's LFM2 grammar takes them: strings in either quote with JSON's escapes (and
/// `\'`), numbers as JSON writes them (kept as written), `True` / `False` / `None` and JSON's
/// `true` / `false` / `null`, lists and dicts (string keys) of them.
fn py_value(text: &str, i: usize, depth: usize) -> Result<(String, usize), PyError> {
    if depth > json::MAX_DEPTH {
        return Err(PyError::Invalid);
    }
    let b = text.as_bytes();
    let Some(&c) = b.get(i) else {
        return Err(PyError::Incomplete);
    };
    match c {
        b'"' | b'\'' => {
            let (s, end) = py_string(text, i)?;
            let mut out = String::new();
            write_str(&s, &mut out);
            Ok((out, end))
        }
        b'[' | b'{' => {
            let dict = c == b'{';
            let close = if dict { b'}' } else { b']' };
            let mut out = String::from(if dict { "{" } else { "[" });
            let mut j = skip_at(text, i + 1);
            let mut first = true;
            loop {
                let Some(&d) = b.get(j) else {
                    return Err(PyError::Incomplete);
                };
                if d == close {
                    out.push(close as char);
                    return Ok((out, j + 1));
                }
                if !first {
                    if d != b',' {
                        return Err(PyError::Invalid);
                    }
                    out.push(',');
                    j = skip_at(text, j + 1);
                }
                first = false;
                if dict {
                    if !matches!(b.get(j), Some(b'"' | b'\'') | None) {
                        return Err(PyError::Invalid);
                    }
                    let (key, end) = py_string(text, j)?;
                    write_str(&key, &mut out);
                    j = skip_at(text, end);
                    match b.get(j) {
                        None => return Err(PyError::Incomplete),
                        Some(b':') => out.push(':'),
                        Some(_) => return Err(PyError::Invalid),
                    }
                    j = skip_at(text, j + 1);
                }
                let (v, end) = py_value(text, j, depth + 1)?;
                out.push_str(&v);
                j = skip_at(text, end);
            }
        }
        b'-' | b'0'..=b'9' => {
            let mut j = i + usize::from(c == b'-');
            let digits = |j: &mut usize| {
                let from = *j;
                while b.get(*j).is_some_and(u8::is_ascii_digit) {
                    *j += 1;
                }
                *j - from
            };
            let int_start = j;
            if digits(&mut j) == 0 {
                return Err(if j == b.len() {
                    PyError::Incomplete
                } else {
                    PyError::Invalid
                });
            }
            if b[int_start] == b'0' && j - int_start > 1 {
                return Err(PyError::Invalid);
            }
            if b.get(j) == Some(&b'.') {
                j += 1;
                if digits(&mut j) == 0 && j < b.len() {
                    return Err(PyError::Invalid);
                }
            }
            if matches!(b.get(j), Some(b'e' | b'E')) {
                j += 1;
                if matches!(b.get(j), Some(b'+' | b'-')) {
                    j += 1;
                }
                if digits(&mut j) == 0 && j < b.len() {
                    return Err(PyError::Invalid);
                }
            }
            match b.get(j) {
                // More digits, a fraction or an exponent may follow.
                None => Err(PyError::Incomplete),
                Some(b'0'..=b'9' | b'.' | b'e' | b'E' | b'+' | b'-') => Err(PyError::Invalid),
                Some(_) => Ok((text[i..j].to_string(), j)),
            }
        }
        b'A'..=b'Z' | b'a'..=b'z' => {
            let len = text[i..]
                .find(|c: char| !c.is_ascii_alphanumeric() && c != '_')
                .ok_or(PyError::Incomplete)?;
            let word = match &text[i..i + len] {
                "True" | "true" => "true",
                "False" | "false" => "false",
                "None" | "null" => "null",
                _ => return Err(PyError::Invalid),
            };
            Ok((word.to_string(), i + len))
        }
        _ => Err(PyError::Invalid),
    }
}

/// The string literal at byte `i` of `text` (in `"` or `'`), decoded, and the offset after it.
fn py_string(text: &str, i: usize) -> Result<(String, usize), PyError> {
    let quote = text.as_bytes().get(i).copied().ok_or(PyError::Incomplete)? as char;
    let mut out = String::new();
    let mut chars = text[i + 1..].char_indices();
    let hex4 = |chars: &mut std::str::CharIndices| -> Result<u32, PyError> {
        let mut n = 0;
        for _ in 0..4 {
            let (_, h) = chars.next().ok_or(PyError::Incomplete)?;
            n = n * 16 + h.to_digit(16).ok_or(PyError::Invalid)?;
        }
        Ok(n)
    };
    loop {
        let (k, c) = chars.next().ok_or(PyError::Incomplete)?;
        if c == quote {
            return Ok((out, i + 1 + k + 1));
        }
        if c != '\\' {
            out.push(c);
            continue;
        }
        let (_, e) = chars.next().ok_or(PyError::Incomplete)?;
        out.push(match e {
            '"' | '\'' | '\\' | '/' => e,
            'b' => '\x08',
            'f' => '\x0c',
            'n' => '\n',
            'r' => '\r',
            't' => '\t',
            'u' => {
                let hi = hex4(&mut chars)?;
                let code = if (0xD800..0xDC00).contains(&hi) {
                    // A surrogate pair: `\uD83D\uDE42`.
                    for want in ['\\', 'u'] {
                        if chars.next().ok_or(PyError::Incomplete)?.1 != want {
                            return Err(PyError::Invalid);
                        }
                    }
                    let lo = hex4(&mut chars)?;
                    if !(0xDC00..0xE000).contains(&lo) {
                        return Err(PyError::Invalid);
                    }
                    0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00)
                } else {
                    hi
                };
                char::from_u32(code).ok_or(PyError::Invalid)?
            }
            _ => return Err(PyError::Invalid),
        });
    }
}

/// The kinds of JSON values a schema allows (a set of the `T_*` bits).
type Types = u8;
const T_OBJ: Types = 1;
const T_ARR: Types = 2;
const T_STR: Types = 4;
const T_NUM: Types = 8;
const T_BOOL: Types = 16;
const T_NULL: Types = 32;
const T_ALL: Types = 63;

/// The kind of a JSON value.
fn kind(v: &Json) -> Types {
    match v {
        Json::Obj(_) => T_OBJ,
        Json::Arr(_) => T_ARR,
        Json::Str(_) => T_STR,
        Json::Int(_) | Json::Float(_) => T_NUM,
        Json::Bool(_) => T_BOOL,
        Json::Null => T_NULL,
    }
}

/// The kinds of values `schema` allows, as llama.cpp's `common_chat_schema::value_types`
/// tells them: its `type` (a name or a list), else its `const` or `enum` values' kinds, else
/// the union of `anyOf` / `oneOf`, the intersection of `allOf`; `properties` alone means an
/// object, `items` a list; anything else (`$ref` included) any kind.
fn schema_types(schema: &Json, depth: usize) -> Types {
    if depth > json::MAX_DEPTH {
        return T_ALL;
    }
    let named = |n: &str| match n {
        "object" => T_OBJ,
        "array" => T_ARR,
        "string" => T_STR,
        "number" | "integer" => T_NUM,
        "boolean" => T_BOOL,
        "null" => T_NULL,
        _ => 0,
    };
    let union = |list: &[Json]| list.iter().fold(0, |t, s| t | schema_types(s, depth + 1));
    match schema.get("type") {
        Some(Json::Str(n)) => return named(n),
        Some(Json::Arr(ns)) => {
            return ns
                .iter()
                .filter_map(Json::as_str)
                .fold(0, |t, n| t | named(n));
        }
        _ => {}
    }
    if let Some(c) = schema.get("const") {
        return kind(c);
    }
    if let Some(Json::Arr(values)) = schema.get("enum") {
        return values.iter().fold(0, |t, v| t | kind(v));
    }
    if let Some(Json::Arr(list)) = schema.get("anyOf").or_else(|| schema.get("oneOf")) {
        return union(list);
    }
    if let Some(Json::Arr(list)) = schema.get("allOf") {
        return list
            .iter()
            .fold(T_ALL, |t, s| t & schema_types(s, depth + 1));
    }
    if schema.get("properties").is_some() {
        T_OBJ
    } else if schema.get("items").is_some() {
        T_ARR
    } else {
        T_ALL
    }
}

/// Whether a value of `schema` may be a string.
pub(super) fn allows_string(schema: &Json) -> bool {
    schema_types(schema, 0) & T_STR != 0
}

/// A Qwen XML parameter's text as a JSON value (compact JSON text), by llama.cpp's rule,
/// from the kinds of values the parameter's schema allows (any kind without a schema):
///
/// * a string only: the text is the string;
/// * no string: the text must be JSON (Python's `True`, `False` and `None`, which Qwen3.5's
///   template writes for `true`, `false` and `null`, are taken for them: llama.cpp would fail
///   the reply), else the call is malformed (`None`);
/// * a string among others: the text is JSON if it is a JSON object, list, number, boolean or
///   `null` of an allowed kind, as written (no whitespace around), else the string.
fn xml_value(raw: &str, schema: Option<&Json>) -> Option<String> {
    let types = schema.map_or(T_ALL, |s| schema_types(s, 0));
    let mut out = String::new();
    if types & T_STR == 0 {
        let t = raw.trim_matches([' ', '\t', '\n', '\r']);
        let t = match t {
            "True" => "true",
            "False" => "false",
            "None" => "null",
            t => t,
        };
        json::parse(t).ok()?;
        return Some(json::strip_ws(t));
    }
    if types != T_STR && !raw.starts_with(|c: char| c.is_ascii_whitespace()) {
        if let Ok(v) = json::parse(raw) {
            if kind(&v) & types & !T_STR != 0 && raw.trim_end() == raw {
                return Some(json::strip_ws(raw));
            }
        }
    }
    write_str(raw, &mut out);
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn schema(text: &str) -> Json {
        json::parse(text).unwrap()
    }

    #[test]
    fn the_kinds_a_schema_allows() {
        for (s, want) in [
            (r#"{"type": "string"}"#, T_STR),
            (r#"{"type": "integer"}"#, T_NUM),
            (r#"{"type": ["string", "null"]}"#, T_STR | T_NULL),
            (r#"{"enum": ["a", 1]}"#, T_STR | T_NUM),
            (r#"{"const": true}"#, T_BOOL),
            (
                r#"{"anyOf": [{"type": "array"}, {"type": "object"}]}"#,
                T_ARR | T_OBJ,
            ),
            (
                r#"{"allOf": [{"type": ["string", "number"]}, {"type": "number"}]}"#,
                T_NUM,
            ),
            (r#"{"properties": {}}"#, T_OBJ),
            (r#"{"items": {}}"#, T_ARR),
            (r##"{"$ref": "#/x"}"##, T_ALL),
            ("{}", T_ALL),
        ] {
            assert_eq!(schema_types(&schema(s), 0), want, "{s}");
        }
    }

    #[test]
    fn python_literals_as_json() {
        for (text, want) in [
            ("'it\\'s \"x\"\nok' ", Ok(r#""it's \"x\"\nok""#)),
            ("\"a\\u00e9\\ud83d\\ude42\\\\\" ", Ok(r#""aé🙂\\""#)),
            ("'two\nlines' ", Ok(r#""two\nlines""#)),
            ("-12.50e+3)", Ok("-12.50e+3")),
            ("0,", Ok("0")),
            ("True)", Ok("true")),
            ("null)", Ok("null")),
            ("None,", Ok("null")),
            (
                "{'a': [1, {\"b\": None}], 'c': false})",
                Ok(r#"{"a":[1,{"b":null}],"c":false}"#),
            ),
            ("[ ])", Ok("[]")),
            ("12", Err(PyError::Incomplete)),
            ("'open", Err(PyError::Incomplete)),
            ("[1, 2", Err(PyError::Incomplete)),
            ("Tru", Err(PyError::Incomplete)),
            ("01)", Err(PyError::Invalid)),
            ("'\\x41')", Err(PyError::Invalid)),
            ("Yes)", Err(PyError::Invalid)),
            ("{1: 2})", Err(PyError::Invalid)),
            ("[1 2])", Err(PyError::Invalid)),
            ("'\\ud83d')", Err(PyError::Invalid)),
            ("(1, 2))", Err(PyError::Invalid)),
        ] {
            let got = py_value(text, 0, 0).map(|(v, _)| v);
            assert_eq!(got.as_deref().map_err(|e| *e), want, "{text:?}");
        }
    }

    #[test]
    fn parameter_values_by_llama_cpps_rule() {
        let string = schema(r#"{"type": "string"}"#);
        let number = schema(r#"{"type": "number"}"#);
        let flag = schema(r#"{"type": "boolean"}"#);
        let either = schema(r#"{"type": ["integer", "string"]}"#);
        let obj = schema(r#"{"type": "object"}"#);
        for (raw, s, want) in [
            ("12", Some(&string), Some(r#""12""#)),
            (
                "say \"hi\"\nnow",
                Some(&string),
                Some(r#""say \"hi\"\nnow""#),
            ),
            ("2.50", Some(&number), Some("2.50")),
            (" 3 ", Some(&number), Some("3")),
            ("three", Some(&number), None),
            ("True", Some(&flag), Some("true")),
            ("None", Some(&flag), Some("null")),
            ("7", Some(&either), Some("7")),
            ("7 apples", Some(&either), Some(r#""7 apples""#)),
            // A kind the schema does not allow stays text.
            ("[1]", Some(&either), Some(r#""[1]""#)),
            ("{\"a\": [1, 2]}", Some(&obj), Some(r#"{"a":[1,2]}"#)),
            ("{\"a\": ", Some(&obj), None),
            // Without a schema: JSON other than a string, else the text.
            ("{\"a\": 1}", None, Some(r#"{"a":1}"#)),
            ("false", None, Some("false")),
            ("\"quoted\"", None, Some(r#""\"quoted\"""#)),
            ("True", None, Some(r#""True""#)),
            (" 1", None, Some(r#"" 1""#)),
        ] {
            assert_eq!(xml_value(raw, s).as_deref(), want, "{raw:?}");
        }
    }
}
