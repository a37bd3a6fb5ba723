//! A small JSON reader and writer for what the chat code takes as JSON text without serde: the
//! tool list and tool-call arguments given to templates (as Python's `json.loads` gives them:
//! objects in order, integers as integers, other numbers as floats), and the tool calls a model
//! writes. Bounded nesting ([`MAX_DEPTH`]); every failure is a [`JsonError`], never a panic.

use std::fmt::Write as _;

use minijinja::value::Value;

/// The deepest nesting read.
pub(crate) const MAX_DEPTH: usize = 128;

/// A JSON value; objects keep their keys' order (and duplicates, the last of which wins when
/// given to a template, as in Python).
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Json {
    Null,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(String),
    Arr(Vec<Json>),
    Obj(Vec<(String, Json)>),
}

/// Why text is not JSON.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum JsonError {
    /// The text ends inside the value: more text might complete it.
    Incomplete,
    /// Not JSON (at this byte offset), or nested deeper than [`MAX_DEPTH`].
    Invalid(usize),
}

impl Json {
    /// The member `key` of an object (the last one of that name).
    pub(crate) fn get(&self, key: &str) -> Option<&Json> {
        match self {
            Json::Obj(pairs) => pairs.iter().rev().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }

    /// The string, if this is one.
    pub(crate) fn as_str(&self) -> Option<&str> {
        match self {
            Json::Str(s) => Some(s),
            _ => None,
        }
    }

    /// The value as a template gets it from Python: dicts, lists, str, int, float, bool, None.
    pub(crate) fn to_value(&self) -> Value {
        match self {
            Json::Null => Value::from(()),
            Json::Bool(b) => Value::from(*b),
            Json::Int(i) => Value::from(*i),
            Json::Float(f) => Value::from(*f),
            Json::Str(s) => Value::from(s.as_str()),
            Json::Arr(items) => Value::from(items.iter().map(Json::to_value).collect::<Vec<_>>()),
            Json::Obj(pairs) => {
                // A later duplicate wins, in the place of the first, as in a Python dict.
                let mut out: Vec<(String, Value)> = Vec::with_capacity(pairs.len());
                for (k, v) in pairs {
                    match out.iter_mut().find(|(key, _)| key == k) {
                        Some(slot) => slot.1 = v.to_value(),
                        None => out.push((k.clone(), v.to_value())),
                    }
                }
                Value::from_pairs(out)
            }
        }
    }

    /// Compact JSON text (`{"a":1,"b":[true,null]}`), non-ASCII kept.
    pub(crate) fn to_compact(&self) -> String {
        let mut out = String::new();
        self.write(&mut out);
        out
    }

    /// JSON text as Python's `json.dumps(x)` writes it: `", "` and `": "` between items,
    /// every character outside ASCII's printable range escaped (`\u00e9`), floats as Python
    /// prints them.
    pub(crate) fn to_python(&self) -> String {
        let mut out = String::new();
        self.write_python(&mut out);
        out
    }

    fn write_python(&self, out: &mut String) {
        match self {
            Json::Float(f) => out.push_str(&super::python::py_float(*f, true)),
            Json::Str(s) => {
                out.push('"');
                for c in s.chars() {
                    match c {
                        '"' => out.push_str("\\\""),
                        '\\' => out.push_str("\\\\"),
                        '\n' => out.push_str("\\n"),
                        '\r' => out.push_str("\\r"),
                        '\t' => out.push_str("\\t"),
                        '\x08' => out.push_str("\\b"),
                        '\x0c' => out.push_str("\\f"),
                        ' '..='~' => out.push(c),
                        c => {
                            let mut buf = [0u16; 2];
                            for unit in c.encode_utf16(&mut buf) {
                                let _ = write!(out, "\\u{unit:04x}");
                            }
                        }
                    }
                }
                out.push('"');
            }
            Json::Arr(items) => {
                out.push('[');
                for (i, v) in items.iter().enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    v.write_python(out);
                }
                out.push(']');
            }
            Json::Obj(pairs) => {
                out.push('{');
                for (i, (k, v)) in pairs.iter().enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    Json::Str(k.clone()).write_python(out);
                    out.push_str(": ");
                    v.write_python(out);
                }
                out.push('}');
            }
            other => other.write(out),
        }
    }

    fn write(&self, out: &mut String) {
        match self {
            Json::Null => out.push_str("null"),
            Json::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
            Json::Int(i) => {
                let _ = write!(out, "{i}");
            }
            Json::Float(f) if f.is_finite() => {
                let _ = write!(out, "{f:?}");
            }
            Json::Float(_) => out.push_str("null"),
            Json::Str(s) => write_str(s, out),
            Json::Arr(items) => {
                out.push('[');
                for (i, v) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    v.write(out);
                }
                out.push(']');
            }
            Json::Obj(pairs) => {
                out.push('{');
                for (i, (k, v)) in pairs.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    write_str(k, out);
                    out.push(':');
                    v.write(out);
                }
                out.push('}');
            }
        }
    }
}

/// `s` as a JSON string literal.
pub(crate) fn write_str(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// The whole of `text` (whitespace around allowed) as one JSON value.
pub(crate) fn parse(text: &str) -> Result<Json, JsonError> {
    let (v, end) = parse_prefix(text)?;
    let rest = &text.as_bytes()[end..];
    match rest.iter().position(|b| !b.is_ascii_whitespace()) {
        None => Ok(v),
        Some(i) => Err(JsonError::Invalid(end + i)),
    }
}

/// Whether `b` is JSON whitespace (space, tab, line feed, carriage return).
pub(crate) fn is_ws(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\r')
}

/// `text` without the JSON whitespace outside its strings: the compact form of a model's JSON
/// as it wrote it (its numbers and escapes kept). Appending text to `text` only appends to
/// the result, so the result can be sent in pieces as the text arrives.
pub(crate) fn strip_ws(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let (mut in_str, mut esc) = (false, false);
    for c in text.chars() {
        if in_str {
            if esc {
                esc = false;
            } else if c == '\\' {
                esc = true;
            } else if c == '"' {
                in_str = false;
            }
        } else if c == '"' {
            in_str = true;
        } else if c.is_ascii() && is_ws(c as u8) {
            continue;
        }
        out.push(c);
    }
    out
}

/// The text of the value of the member `key` (the last of that name) of the JSON object
/// `text` (whitespace around allowed); `None` when `text` is no object or has no such member.
pub(crate) fn member_text<'a>(text: &'a str, key: &str) -> Option<&'a str> {
    let b = text.as_bytes();
    let mut i = skip(b, 0);
    if b.get(i) != Some(&b'{') {
        return None;
    }
    i = skip(b, i + 1);
    let mut found = None;
    if b.get(i) == Some(&b'}') {
        return None;
    }
    loop {
        let (k, n) = parse_prefix(&text[i..]).ok()?;
        i = skip(b, i + n);
        if b.get(i) != Some(&b':') {
            return None;
        }
        let start = skip(b, i + 1);
        let (_, n) = parse_prefix(&text[start..]).ok()?;
        if k.as_str() == Some(key) {
            found = Some(&text[start..start + n]);
        }
        i = skip(b, start + n);
        match b.get(i) {
            Some(b',') => i = skip(b, i + 1),
            Some(b'}') => return found,
            _ => return None,
        }
    }
}

/// The texts of the items of the JSON list `text` (whitespace around allowed); empty when
/// `text` is no list.
pub(crate) fn item_texts(text: &str) -> Vec<&str> {
    let b = text.as_bytes();
    let mut out = Vec::new();
    let mut i = skip(b, 0);
    if b.get(i) != Some(&b'[') {
        return out;
    }
    i = skip(b, i + 1);
    if b.get(i) == Some(&b']') {
        return out;
    }
    loop {
        let Ok((_, n)) = parse_prefix(&text[i..]) else {
            return Vec::new();
        };
        out.push(&text[i..i + n]);
        i = skip(b, i + n);
        match b.get(i) {
            Some(b',') => i = skip(b, i + 1),
            Some(b']') => return out,
            _ => return Vec::new(),
        }
    }
}

/// The offset of the first byte at or after `i` that is not JSON whitespace.
fn skip(b: &[u8], mut i: usize) -> usize {
    while i < b.len() && is_ws(b[i]) {
        i += 1;
    }
    i
}

/// The JSON value at the start of `text` (after whitespace), and the byte offset just past it.
pub(crate) fn parse_prefix(text: &str) -> Result<(Json, usize), JsonError> {
    let mut p = Parser {
        s: text.as_bytes(),
        text,
        i: 0,
    };
    p.ws();
    let v = p.value(0)?;
    Ok((v, p.i))
}

struct Parser<'a> {
    s: &'a [u8],
    text: &'a str,
    i: usize,
}

impl Parser<'_> {
    fn ws(&mut self) {
        while self.i < self.s.len() && matches!(self.s[self.i], b' ' | b'\t' | b'\n' | b'\r') {
            self.i += 1;
        }
    }

    fn peek(&self) -> Result<u8, JsonError> {
        self.s.get(self.i).copied().ok_or(JsonError::Incomplete)
    }

    fn invalid(&self) -> JsonError {
        JsonError::Invalid(self.i)
    }

    fn literal(&mut self, word: &[u8], v: Json) -> Result<Json, JsonError> {
        let avail = &self.s[self.i..];
        let n = avail.len().min(word.len());
        if avail[..n] != word[..n] {
            return Err(self.invalid());
        }
        if n < word.len() {
            return Err(JsonError::Incomplete);
        }
        self.i += word.len();
        Ok(v)
    }

    fn value(&mut self, depth: usize) -> Result<Json, JsonError> {
        if depth > MAX_DEPTH {
            return Err(self.invalid());
        }
        match self.peek()? {
            b'n' => self.literal(b"null", Json::Null),
            b't' => self.literal(b"true", Json::Bool(true)),
            b'f' => self.literal(b"false", Json::Bool(false)),
            b'"' => self.string().map(Json::Str),
            b'[' => {
                self.i += 1;
                let mut items = Vec::new();
                self.ws();
                if self.peek()? == b']' {
                    self.i += 1;
                    return Ok(Json::Arr(items));
                }
                loop {
                    self.ws();
                    items.push(self.value(depth + 1)?);
                    self.ws();
                    match self.peek()? {
                        b',' => self.i += 1,
                        b']' => {
                            self.i += 1;
                            return Ok(Json::Arr(items));
                        }
                        _ => return Err(self.invalid()),
                    }
                }
            }
            b'{' => {
                self.i += 1;
                let mut pairs = Vec::new();
                self.ws();
                if self.peek()? == b'}' {
                    self.i += 1;
                    return Ok(Json::Obj(pairs));
                }
                loop {
                    self.ws();
                    if self.peek()? != b'"' {
                        return Err(self.invalid());
                    }
                    let k = self.string()?;
                    self.ws();
                    if self.peek()? != b':' {
                        return Err(self.invalid());
                    }
                    self.i += 1;
                    self.ws();
                    let v = self.value(depth + 1)?;
                    pairs.push((k, v));
                    self.ws();
                    match self.peek()? {
                        b',' => self.i += 1,
                        b'}' => {
                            self.i += 1;
                            return Ok(Json::Obj(pairs));
                        }
                        _ => return Err(self.invalid()),
                    }
                }
            }
            b'-' | b'0'..=b'9' => self.number(),
            _ => Err(self.invalid()),
        }
    }

    fn number(&mut self) -> Result<Json, JsonError> {
        let start = self.i;
        let digits = |p: &mut Self| {
            let from = p.i;
            while p.i < p.s.len() && p.s[p.i].is_ascii_digit() {
                p.i += 1;
            }
            p.i - from
        };
        if self.s[self.i] == b'-' {
            self.i += 1;
        }
        let int_start = self.i;
        let n = digits(self);
        if n == 0 {
            return if self.i == self.s.len() {
                Err(JsonError::Incomplete)
            } else {
                Err(self.invalid())
            };
        }
        if n > 1 && self.s[int_start] == b'0' {
            return Err(JsonError::Invalid(int_start));
        }
        let mut float = false;
        if self.s.get(self.i) == Some(&b'.') {
            self.i += 1;
            float = true;
            if digits(self) == 0 {
                return self.cut_or_invalid();
            }
        }
        if matches!(self.s.get(self.i), Some(b'e' | b'E')) {
            self.i += 1;
            float = true;
            if matches!(self.s.get(self.i), Some(b'+' | b'-')) {
                self.i += 1;
            }
            if digits(self) == 0 {
                return self.cut_or_invalid();
            }
        }
        let text = &self.text[start..self.i];
        if !float {
            if let Ok(i) = text.parse::<i64>() {
                return Ok(Json::Int(i));
            }
        }
        // Python keeps big integers exact; a float is the nearest this crate carries.
        text.parse::<f64>()
            .map(Json::Float)
            .map_err(|_| JsonError::Invalid(start))
    }

    fn cut_or_invalid(&self) -> Result<Json, JsonError> {
        if self.i == self.s.len() {
            Err(JsonError::Incomplete)
        } else {
            Err(self.invalid())
        }
    }

    fn hex4(&mut self) -> Result<u32, JsonError> {
        let mut v = 0;
        for _ in 0..4 {
            let c = self.peek()?;
            let d = (c as char).to_digit(16).ok_or_else(|| self.invalid())?;
            v = v * 16 + d;
            self.i += 1;
        }
        Ok(v)
    }

    fn string(&mut self) -> Result<String, JsonError> {
        self.i += 1; // the opening quote
        let mut out = String::new();
        loop {
            let from = self.i;
            while self.i < self.s.len() && !matches!(self.s[self.i], b'"' | b'\\' | 0..=0x1f) {
                self.i += 1;
            }
            // The run ends at an ASCII byte or the end: a character boundary.
            out.push_str(&self.text[from..self.i]);
            match self.peek()? {
                b'"' => {
                    self.i += 1;
                    return Ok(out);
                }
                b'\\' => {
                    self.i += 1;
                    let c = self.peek()?;
                    self.i += 1;
                    match c {
                        b'"' => out.push('"'),
                        b'\\' => out.push('\\'),
                        b'/' => out.push('/'),
                        b'b' => out.push('\x08'),
                        b'f' => out.push('\x0c'),
                        b'n' => out.push('\n'),
                        b'r' => out.push('\r'),
                        b't' => out.push('\t'),
                        b'u' => {
                            let hi = self.hex4()?;
                            let c = if (0xd800..0xdc00).contains(&hi) {
                                // A surrogate pair, or a lone high surrogate (U+FFFD).
                                if self.s.get(self.i..self.i + 2) == Some(b"\\u") {
                                    let save = self.i;
                                    self.i += 2;
                                    let lo = self.hex4()?;
                                    if (0xdc00..0xe000).contains(&lo) {
                                        char::from_u32(
                                            0x10000 + ((hi - 0xd800) << 10) + (lo - 0xdc00),
                                        )
                                    } else {
                                        self.i = save;
                                        None
                                    }
                                } else if self.i + 2 > self.s.len() {
                                    return Err(JsonError::Incomplete);
                                } else {
                                    None
                                }
                            } else {
                                char::from_u32(hi)
                            };
                            out.push(c.unwrap_or('\u{fffd}'));
                        }
                        _ => return Err(JsonError::Invalid(self.i - 1)),
                    }
                }
                _ => return Err(self.invalid()), // a control character
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Python's `json.dumps` (its output pasted from Python 3).
    #[test]
    fn python_json_is_json_dumps() {
        let v = parse(
            "{\"d\": \"\u{e9} \\\"q\\\" \\\\ \\n\\t\\u0001\\u007f \u{1f642}\", \"n\": [1, 2.5, 1e20, 1e-7, null, true], \"e\": {}}",
        )
        .unwrap();
        assert_eq!(
            v.to_python(),
            r#"{"d": "\u00e9 \"q\" \\ \n\t\u0001\u007f \ud83d\ude42", "n": [1, 2.5, 1e+20, 1e-07, null, true], "e": {}}"#
        );
    }

    /// A model's JSON without the whitespace outside strings, and the texts of members and
    /// items.
    #[test]
    fn raw_texts_of_members_and_items() {
        assert_eq!(
            strip_ws(" {\"a b\" : [1 ,\n 2.50e1],\t\"c\": \" x \\\" y \"} "),
            r#"{"a b":[1,2.50e1],"c":" x \" y "}"#
        );
        let obj = r#" { "k": {"x": [1, "}"]}, "k" : 2 , "j": "k" } "#;
        assert_eq!(member_text(obj, "k"), Some("2"));
        assert_eq!(member_text(obj, "j"), Some(r#""k""#));
        assert_eq!(member_text(obj, "x"), None);
        assert_eq!(member_text("[1]", "k"), None);
        assert_eq!(
            item_texts(r#"[ {"a": 1} , "]", [2] ]"#),
            [r#"{"a": 1}"#, r#""]""#, "[2]"]
        );
        assert!(item_texts("{}").is_empty());
    }

    #[test]
    fn values_read_and_written() {
        let v = parse(r#" {"a": [1, -2.5, 1e3, true, false, null], "b": "x\"\\\n\u00e9\ud83d\ude42", "c": {}} "#)
            .unwrap();
        assert_eq!(
            v.get("a").unwrap(),
            &Json::Arr(vec![
                Json::Int(1),
                Json::Float(-2.5),
                Json::Float(1000.0),
                Json::Bool(true),
                Json::Bool(false),
                Json::Null
            ])
        );
        assert_eq!(v.get("b").and_then(Json::as_str), Some("x\"\\\né🙂"));
        assert_eq!(
            v.to_compact(),
            r#"{"a":[1,-2.5,1000.0,true,false,null],"b":"x\"\\\né🙂","c":{}}"#
        );
        assert_eq!(parse(&v.to_compact()).unwrap(), v);
    }

    #[test]
    fn incomplete_and_invalid_are_told_apart() {
        for cut in [
            r#"{"a": [1, 2"#,
            r#"{"a"#,
            "tru",
            "-",
            "1.",
            r#""\u00"#,
            "[",
            "{\"a\":",
        ] {
            assert_eq!(parse(cut), Err(JsonError::Incomplete), "{cut}");
        }
        for bad in [
            "{a: 1}",
            "[1,]",
            "01",
            "tx",
            "\"\u{1}\"",
            "{} x",
            "\"\\q\"",
            "+1",
        ] {
            assert!(matches!(parse(bad), Err(JsonError::Invalid(_))), "{bad}");
        }
        let deep = "[".repeat(MAX_DEPTH + 2);
        assert!(matches!(parse(&deep), Err(JsonError::Invalid(_))));
        assert_eq!(parse_prefix("{} tail").unwrap(), (Json::Obj(vec![]), 2));
    }
}
