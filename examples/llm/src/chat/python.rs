//! Values printed as Python prints them, and Python's string methods: what a chat template
//! written for jinja2 expects of `{{ value }}`, `|string`, `|join`, `|trim` and `.strip()`.
//!
//! [`py_repr`] is Python's `repr` (`None`, `True`, `1.0`, `"it's"`, `[1, 'a']`, `{'k': 'v'}`,
//! `(1,)`), [`py_str`] Python's `str`, [`py_float`] the shortest round-tripping float `repr`
//! (also what `json.dumps` writes), and [`py_strip`] `str.strip` with Python's whitespace.
//! Every value visited costs fuel, and nesting deeper than [`MAX_NESTING`] is an error rather
//! than a deep recursion.

use std::fmt::Write as _;

use minijinja::value::{Kwargs, Rest, Value, ValueKind, ValueOrKwargs, from_args};
use minijinja::{Error, ErrorKind, State};

/// How deeply the serializers (printing here, and `tojson`) follow nested values.
pub(super) const MAX_NESTING: usize = 256;

/// Python's whitespace (`str.isspace`): Unicode's, and the four ASCII separators.
fn py_space(c: char) -> bool {
    c.is_whitespace() || ('\x1c'..='\x1f').contains(&c)
}

/// Python's `str.strip(chars)` (`lstrip` / `rstrip` with one side).
pub(super) fn py_strip<'a>(s: &'a str, chars: Option<&str>, left: bool, right: bool) -> &'a str {
    let strip = |c: char| match chars {
        Some(set) => set.contains(c),
        None => py_space(c),
    };
    let s = if left { s.trim_start_matches(strip) } else { s };
    if right { s.trim_end_matches(strip) } else { s }
}

/// Python's string methods: `strip` and its sides with Python's whitespace here, the rest from
/// minijinja-contrib.
pub(super) fn py_methods(
    state: &mut State,
    value: &Value,
    method: &str,
    args: &[Value],
) -> Result<Value, Error> {
    if let (Some(s), "strip" | "lstrip" | "rstrip") = (value.as_str(), method) {
        let (chars,): (Option<&str>,) = from_args(args)?;
        let (left, right) = (method != "rstrip", method != "lstrip");
        return Ok(Value::from(py_strip(s, chars, left, right)));
    }
    minijinja_contrib::pycompat::unknown_method_callback(state, value, method, args)
}

/// Python's `repr` of a float (what `str`, `print` and `json.dumps` write).
pub(super) fn py_float(v: f64, json: bool) -> String {
    if v.is_nan() {
        return (if json { "NaN" } else { "nan" }).into();
    }
    if v.is_infinite() {
        let s = match (json, v > 0.0) {
            (true, true) => "Infinity",
            (true, false) => "-Infinity",
            (false, true) => "inf",
            (false, false) => "-inf",
        };
        return s.into();
    }
    if v == 0.0 {
        return (if v.is_sign_negative() { "-0.0" } else { "0.0" }).into();
    }
    // The shortest digits that round-trip, and the exponent of the first.
    let sci = format!("{:e}", v.abs());
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    let mut out = String::new();
    if v < 0.0 {
        out.push('-');
    }
    let point = exp + 1;
    if -4 < point && point <= 16 {
        if point <= 0 {
            out.push_str("0.");
            out.extend(std::iter::repeat_n('0', (-point) as usize));
            out.push_str(&digits);
        } else if point as usize >= digits.len() {
            out.push_str(&digits);
            out.extend(std::iter::repeat_n('0', point as usize - digits.len()));
            out.push_str(".0");
        } else {
            out.push_str(&digits[..point as usize]);
            out.push('.');
            out.push_str(&digits[point as usize..]);
        }
    } else {
        out.push_str(&digits[..1]);
        if digits.len() > 1 {
            out.push('.');
            out.push_str(&digits[1..]);
        }
        let _ = write!(out, "e{}{:02}", if exp < 0 { '-' } else { '+' }, exp.abs());
    }
    out
}

/// Whether Python's `repr` writes `c` as an escape (control, format, private-use and
/// separator characters other than the space; unassigned code points are not known here).
fn py_unprintable(c: char) -> bool {
    let u = c as u32;
    matches!(u,
        0..=0x1f | 0x7f..=0xa0 | 0xad | 0x600..=0x605 | 0x61c | 0x6dd | 0x70f | 0x1680
        | 0x180e | 0x2000..=0x200f | 0x2028..=0x202f | 0x205f..=0x2064 | 0x2066..=0x206f
        | 0x3000 | 0xe000..=0xf8ff | 0xfeff | 0xfff9..=0xfffb | 0xf0000..)
}

/// Python's `repr` of a string.
fn py_repr_str(s: &str, out: &mut String) {
    let quote = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if py_unprintable(c) => {
                let u = c as u32;
                let _ = match u {
                    0..=0xff => write!(out, "\\x{u:02x}"),
                    0x100..=0xffff => write!(out, "\\u{u:04x}"),
                    _ => write!(out, "\\U{u:08x}"),
                };
            }
            c => out.push(c),
        }
    }
    out.push(quote);
}

pub(super) fn too_deep() -> Error {
    Error::new(
        ErrorKind::InvalidOperation,
        "value nested too deeply to print or serialize",
    )
}

/// Python's `str(value)`: a string as it is, the rest as [`py_repr`] writes it (undefined is
/// empty, as jinja2 prints it). Charges a fuel per value visited.
pub(super) fn py_str(
    state: &State,
    value: &Value,
    out: &mut String,
    depth: usize,
) -> Result<(), Error> {
    match value.kind() {
        ValueKind::String => {
            out.push_str(value.as_str().unwrap_or_default());
            Ok(())
        }
        ValueKind::Undefined => Ok(()),
        _ => py_repr(state, value, out, depth),
    }
}

/// Python's `repr(value)`: `None`, `True`, `1.0`, `'text'`, `[1, 'a']`, `{'k': 'v'}`,
/// `(1, 2)`.
fn py_repr(state: &State, value: &Value, out: &mut String, depth: usize) -> Result<(), Error> {
    if depth > MAX_NESTING {
        return Err(too_deep());
    }
    state.consume_fuel(1)?;
    match value.kind() {
        ValueKind::Undefined => out.push_str("Undefined"),
        ValueKind::None => out.push_str("None"),
        ValueKind::Bool => out.push_str(if value.is_true() { "True" } else { "False" }),
        ValueKind::Number if value.is_integer() => {
            let _ = write!(out, "{value}");
        }
        ValueKind::Number => out.push_str(&py_float(
            f64::try_from(value.clone()).unwrap_or(f64::NAN),
            false,
        )),
        ValueKind::String => {
            let s = value.as_str().unwrap_or_default();
            state.consume_fuel(s.len() as u64 / 64)?;
            py_repr_str(s, out);
        }
        ValueKind::Bytes => {
            let bytes = value.as_bytes().unwrap_or_default();
            out.push_str("b'");
            for &b in bytes {
                match b {
                    b'\\' | b'\'' => {
                        out.push('\\');
                        out.push(char::from(b));
                    }
                    b'\n' => out.push_str("\\n"),
                    b'\r' => out.push_str("\\r"),
                    b'\t' => out.push_str("\\t"),
                    0x20..=0x7e => out.push(char::from(b)),
                    _ => {
                        let _ = write!(out, "\\x{b:02x}");
                    }
                }
            }
            out.push('\'');
        }
        ValueKind::Seq | ValueKind::Iterable => {
            let tuple = value
                .downcast_object_ref::<minijinja::value::Tuple>()
                .is_some();
            out.push(if tuple { '(' } else { '[' });
            let mut n = 0;
            for (i, item) in value.try_iter()?.enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                py_repr(state, &item, out, depth + 1)?;
                n += 1;
            }
            if tuple && n == 1 {
                out.push(',');
            }
            out.push(if tuple { ')' } else { ']' });
        }
        ValueKind::Map => {
            out.push('{');
            for (i, key) in value.try_iter()?.enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                py_repr(state, &key, out, depth + 1)?;
                out.push_str(": ");
                py_repr(state, &value.get_item(&key)?, out, depth + 1)?;
            }
            out.push('}');
        }
        ValueKind::Plain | ValueKind::Invalid => {
            let _ = write!(out, "{value}");
        }
        // A kind minijinja adds later: its own spelling.
        _ => {
            let _ = write!(out, "{value}");
        }
    }
    Ok(())
}

/// jinja2's `join(value, d='', attribute=None)`: the items as Python's `str` writes them.
pub(super) fn join(
    state: &State,
    value: &Value,
    args: Rest<ValueOrKwargs>,
) -> Result<String, Error> {
    let args: Vec<Value> = args.0.into_iter().map(Value::from).collect();
    let (pos, kwargs): (&[Value], Kwargs) = from_args(&args)?;
    let sep: Option<Value> = match pos.first() {
        Some(v) => Some(v.clone()),
        None => kwargs.get("d")?,
    };
    let attribute: Option<Value> = match pos.get(1) {
        Some(v) => Some(v.clone()),
        None => kwargs.get("attribute")?,
    };
    kwargs.assert_all_used()?;
    if pos.len() > 2 {
        return Err(Error::new(
            ErrorKind::TooManyArguments,
            "join takes at most 2 arguments",
        ));
    }
    let mut sep_text = String::new();
    if let Some(s) = &sep {
        py_str(state, s, &mut sep_text, 0)?;
    }
    let mut out = String::new();
    let items: Box<dyn Iterator<Item = Value>> = match value.kind() {
        ValueKind::String => Box::new(
            value
                .as_str()
                .unwrap_or_default()
                .chars()
                .map(|c| Value::from(c.to_string()))
                .collect::<Vec<_>>()
                .into_iter(),
        ),
        _ => Box::new(value.try_iter()?),
    };
    for (i, item) in items.enumerate() {
        state.consume_fuel(1 + sep_text.len() as u64 / 64)?;
        if i > 0 {
            out.push_str(&sep_text);
        }
        let item = match &attribute {
            Some(a) => attr_path(&item, a)?,
            None => item,
        };
        py_str(state, &item, &mut out, 0)?;
    }
    Ok(out)
}

/// jinja2's attribute getter: `a.b.0` walks attributes and indexes.
fn attr_path(item: &Value, attribute: &Value) -> Result<Value, Error> {
    let Some(path) = attribute.as_str() else {
        return item.get_item(attribute);
    };
    let mut v = item.clone();
    for part in path.split('.') {
        v = match part.parse::<i64>() {
            Ok(i) => v.get_item(&Value::from(i))?,
            Err(_) => v.get_attr(part)?,
        };
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_print_as_python_repr() {
        for (v, want) in [
            (0.1, "0.1"),
            (1e16, "1e+16"),
            (1e15, "1000000000000000.0"),
            (1e-5, "1e-05"),
            (0.0001, "0.0001"),
            (-2.5, "-2.5"),
            (-0.0, "-0.0"),
            (1.5e300, "1.5e+300"),
            (123.456, "123.456"),
        ] {
            assert_eq!(py_float(v, false), want, "{v}");
        }
        assert_eq!(py_float(f64::INFINITY, true), "Infinity");
        assert_eq!(py_float(f64::NAN, false), "nan");
    }
}
