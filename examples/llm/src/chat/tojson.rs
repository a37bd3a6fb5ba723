//! The `tojson` filter of transformers' chat templates: Python's `json.dumps(x,
//! ensure_ascii=False, indent=..., separators=..., sort_keys=...)`, byte for byte (its
//! separators, its `NaN` and `Infinity`, its `\uXXXX` escapes, keys converted as it converts
//! them), and no HTML escaping, unlike jinja2's and minijinja's own `tojson`. Every value
//! visited costs fuel.

use std::fmt::Write as _;

use minijinja::value::{Kwargs, Rest, Value, ValueKind, ValueOrKwargs, from_args};
use minijinja::{Error, ErrorKind, State};

use super::python::{MAX_NESTING, py_float, too_deep};

/// transformers' `tojson`: `json.dumps(x, ensure_ascii=False, indent=None, separators=None,
/// sort_keys=False)`, positionally or by keyword.
pub(super) fn tojson(
    state: &State,
    value: &Value,
    args: Rest<ValueOrKwargs>,
) -> Result<String, Error> {
    let args: Vec<Value> = args.0.into_iter().map(Value::from).collect();
    let (pos, kwargs): (&[Value], Kwargs) = from_args(&args)?;
    const NAMES: [&str; 4] = ["ensure_ascii", "indent", "separators", "sort_keys"];
    if pos.len() > NAMES.len() {
        return Err(Error::new(
            ErrorKind::TooManyArguments,
            "tojson takes at most 4 arguments",
        ));
    }
    let mut opts: [Option<Value>; 4] = Default::default();
    for (i, name) in NAMES.iter().enumerate() {
        opts[i] = match pos.get(i) {
            Some(v) => Some(v.clone()),
            None => kwargs.get::<Option<Value>>(name)?,
        };
    }
    kwargs.assert_all_used()?;
    let [ensure_ascii, indent, separators, sort_keys] = opts;
    let indent = match indent {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) if v.kind() == ValueKind::String => {
            Some(v.as_str().unwrap_or_default().to_string())
        }
        Some(v) if v.kind() == ValueKind::Bool => Some(" ".repeat(usize::from(v.is_true()))),
        Some(v) => {
            let n = v.as_i64().ok_or_else(|| {
                Error::new(
                    ErrorKind::InvalidOperation,
                    "indent must be an int or a string",
                )
            })?;
            let n = usize::try_from(n.max(0)).unwrap_or(0);
            state.consume_fuel(n as u64 / 64)?;
            if n > 1 << 16 {
                return Err(Error::new(ErrorKind::InvalidOperation, "indent too large"));
            }
            Some(" ".repeat(n))
        }
    };
    let (item_sep, key_sep) = match separators {
        Some(s) if !s.is_none() => {
            let parts: Vec<Value> = s.try_iter()?.collect();
            match parts.as_slice() {
                [a, b] if a.as_str().is_some() && b.as_str().is_some() => (
                    a.as_str().unwrap_or_default().to_string(),
                    b.as_str().unwrap_or_default().to_string(),
                ),
                _ => {
                    return Err(Error::new(
                        ErrorKind::InvalidOperation,
                        "separators must be a pair of strings",
                    ));
                }
            }
        }
        _ if indent.is_some() => (",".into(), ": ".into()),
        _ => (", ".into(), ": ".into()),
    };
    let mut w = Json {
        state,
        ensure_ascii: ensure_ascii.is_some_and(|v| v.is_true()),
        indent,
        item_sep,
        key_sep,
        sort_keys: sort_keys.is_some_and(|v| v.is_true()),
        out: String::new(),
    };
    w.value(value, 0)?;
    Ok(w.out)
}

/// Python's `json.dumps` writer.
struct Json<'a, 't, 'e> {
    state: &'a State<'t, 'e>,
    ensure_ascii: bool,
    indent: Option<String>,
    item_sep: String,
    key_sep: String,
    sort_keys: bool,
    out: String,
}

impl Json<'_, '_, '_> {
    fn newline(&mut self, depth: usize) -> Result<(), Error> {
        if let Some(ind) = &self.indent {
            self.out.push('\n');
            self.state.consume_fuel((ind.len() * depth) as u64 / 64)?;
            for _ in 0..depth {
                self.out.push_str(ind);
            }
        }
        Ok(())
    }

    fn string(&mut self, s: &str) {
        self.out.push('"');
        for c in s.chars() {
            match c {
                '"' => self.out.push_str("\\\""),
                '\\' => self.out.push_str("\\\\"),
                '\n' => self.out.push_str("\\n"),
                '\r' => self.out.push_str("\\r"),
                '\t' => self.out.push_str("\\t"),
                '\x08' => self.out.push_str("\\b"),
                '\x0c' => self.out.push_str("\\f"),
                c if (c as u32) < 0x20 || (self.ensure_ascii && !(' '..='~').contains(&c)) => {
                    let mut buf = [0u16; 2];
                    for unit in c.encode_utf16(&mut buf) {
                        let _ = write!(self.out, "\\u{unit:04x}");
                    }
                }
                c => self.out.push(c),
            }
        }
        self.out.push('"');
    }

    /// A key as `json.dumps` converts it: strings as they are, numbers, booleans and None
    /// spelled out.
    fn key(&self, key: &Value) -> Result<String, Error> {
        Ok(match key.kind() {
            ValueKind::String => key.as_str().unwrap_or_default().to_string(),
            ValueKind::Bool => (if key.is_true() { "true" } else { "false" }).into(),
            ValueKind::None => "null".into(),
            ValueKind::Number if key.is_integer() => key.to_string(),
            ValueKind::Number => py_float(f64::try_from(key.clone()).unwrap_or(f64::NAN), true),
            k => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    format!("keys must be str, int, float, bool or None, not {k}"),
                ));
            }
        })
    }

    fn value(&mut self, value: &Value, depth: usize) -> Result<(), Error> {
        if depth > MAX_NESTING {
            return Err(too_deep());
        }
        self.state.consume_fuel(1)?;
        match value.kind() {
            ValueKind::None => self.out.push_str("null"),
            ValueKind::Bool => self
                .out
                .push_str(if value.is_true() { "true" } else { "false" }),
            ValueKind::Number if value.is_integer() => {
                let _ = write!(self.out, "{value}");
            }
            ValueKind::Number => self.out.push_str(&py_float(
                f64::try_from(value.clone()).unwrap_or(f64::NAN),
                true,
            )),
            ValueKind::String => {
                let s = value.as_str().unwrap_or_default();
                self.state.consume_fuel(s.len() as u64 / 16)?;
                self.string(s);
            }
            ValueKind::Seq | ValueKind::Iterable => {
                let items: Vec<Value> = value.try_iter()?.collect();
                if items.is_empty() {
                    self.out.push_str("[]");
                    return Ok(());
                }
                self.out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        let sep = std::mem::take(&mut self.item_sep);
                        self.out.push_str(&sep);
                        self.item_sep = sep;
                    }
                    self.newline(depth + 1)?;
                    self.value(item, depth + 1)?;
                }
                self.newline(depth)?;
                self.out.push(']');
            }
            ValueKind::Map => {
                let mut pairs = Vec::new();
                for key in value.try_iter()? {
                    let v = value.get_item(&key)?;
                    pairs.push((self.key(&key)?, v));
                }
                if self.sort_keys {
                    self.state.consume_fuel(pairs.len() as u64)?;
                    pairs.sort_by(|a, b| a.0.cmp(&b.0));
                }
                if pairs.is_empty() {
                    self.out.push_str("{}");
                    return Ok(());
                }
                self.out.push('{');
                for (i, (k, v)) in pairs.iter().enumerate() {
                    if i > 0 {
                        let sep = std::mem::take(&mut self.item_sep);
                        self.out.push_str(&sep);
                        self.item_sep = sep;
                    }
                    self.newline(depth + 1)?;
                    self.string(k);
                    let sep = std::mem::take(&mut self.key_sep);
                    self.out.push_str(&sep);
                    self.key_sep = sep;
                    self.value(v, depth + 1)?;
                }
                self.newline(depth)?;
                self.out.push('}');
            }
            k => {
                let what = match k {
                    ValueKind::Undefined => "Undefined".to_string(),
                    k => k.to_string(),
                };
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    format!("Object of type {what} is not JSON serializable"),
                ));
            }
        }
        Ok(())
    }
}
