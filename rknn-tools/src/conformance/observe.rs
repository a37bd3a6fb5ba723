//! What a check observes on one runtime, and how two observations are compared.
//!
//! An observation is an ordered list of items, each a return code, a number, a text, a matrix
//! or bytes, under a key that says what was done ("i8 M=4 K=64 N=32 B=native: run"). Checks
//! record every code before the values that depend on it and stop recording after a failure,
//! so two runtimes that diverge show it at the first item that differs.

use std::sync::Arc;

use serde_json::{Value as Json, json};

/// One observed value.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    /// A return code of the C API.
    Code(i32),
    /// An integer (a count, a size).
    Int(i64),
    /// A text (a descriptor, present/missing).
    Text(String),
    /// A row-major integer matrix.
    Ints {
        /// Rows and columns.
        shape: (usize, usize),
        /// The elements.
        data: Vec<i64>,
    },
    /// A row-major float matrix, compared within `rel` (relative to max(|reference|, 1)).
    Floats {
        /// Rows and columns.
        shape: (usize, usize),
        /// The elements.
        data: Vec<f64>,
        /// Allowed relative difference.
        rel: f64,
    },
    /// Raw bytes (the converter's output).
    Bytes(Vec<u8>),
}

/// The operands that produced a matrix, kept to show the row of A and column of B behind a
/// differing element.
#[derive(Clone, Debug, Default)]
pub struct Operands {
    /// The configuration, seed and whatever else says how the input was made.
    pub describe: Json,
    /// A as logical values, [M, K] row-major (empty when not a matmul).
    pub a: Vec<f32>,
    /// B as logical values, [K, N] row-major.
    pub b: Vec<f32>,
    /// M, K, N.
    pub mkn: (usize, usize, usize),
}

/// One observed item.
#[derive(Clone, Debug)]
pub struct Item {
    /// What was done.
    pub key: String,
    /// What came of it.
    pub value: Value,
    /// The input behind it.
    pub input: Option<Arc<Operands>>,
}

impl Item {
    /// An item without operands.
    pub fn new(key: impl Into<String>, value: Value) -> Item {
        Item {
            key: key.into(),
            value,
            input: None,
        }
    }
}

/// What one check saw on one runtime.
pub type Observation = Vec<Item>;

/// The first difference between a subject's and a reference's observation.
#[derive(Clone, Debug, PartialEq)]
pub struct Difference {
    /// The item's key (the reference's, where the keys differ).
    pub key: String,
    /// The element within a matrix or byte string: (row, column) or (byte, 0).
    pub index: Option<(usize, usize)>,
    /// The subject's value.
    pub subject: String,
    /// The reference's value.
    pub reference: String,
    /// The input that produced them.
    pub input: Json,
}

impl Difference {
    /// The difference as JSON.
    pub fn to_json(&self) -> Json {
        json!({
            "key": self.key,
            "index": self.index.map(|(r, c)| json!([r, c])),
            "subject": self.subject,
            "reference": self.reference,
            "input": self.input,
        })
    }
}

/// A return code with its name.
pub fn code_text(code: i32) -> String {
    match code {
        0 => "0 (RKNN_SUCC)".into(),
        c => format!(
            "{c} ({})",
            rknn_sys::error_name(c).unwrap_or("unknown code")
        ),
    }
}

fn summary(v: &Value) -> String {
    match v {
        Value::Code(c) => code_text(*c),
        Value::Int(i) => i.to_string(),
        Value::Text(t) => t.clone(),
        Value::Ints { shape, .. } => format!("an integer matrix {}×{}", shape.0, shape.1),
        Value::Floats { shape, .. } => format!("a float matrix {}×{}", shape.0, shape.1),
        Value::Bytes(b) => format!("{} bytes", b.len()),
    }
}

/// The operands behind element (row, col) of a matmul's C: A's row and B's column, shortened
/// to 64 values (with the seed in `describe`, the whole input can be made again).
fn input_json(input: Option<&Arc<Operands>>, index: Option<(usize, usize)>) -> Json {
    let Some(op) = input else {
        return Json::Null;
    };
    let mut j = op.describe.clone();
    let (m, k, n) = op.mkn;
    if let (Some((row, col)), Json::Object(map)) = (index, &mut j) {
        const SHOWN: usize = 64;
        if op.a.len() == m * k && op.b.len() == k * n && row < m && col < n {
            let a_row: Vec<f32> = op.a[row * k..(row + 1) * k]
                .iter()
                .copied()
                .take(SHOWN)
                .collect();
            let b_col: Vec<f32> = (0..k).take(SHOWN).map(|x| op.b[x * n + col]).collect();
            map.insert("a_row".into(), json!(a_row));
            map.insert("b_col".into(), json!(b_col));
            if k > SHOWN {
                map.insert(
                    "note".into(),
                    json!(format!(
                        "a_row and b_col show the first {SHOWN} of K={k} values"
                    )),
                );
            }
        }
    }
    j
}

/// The first difference between `subject` and `reference`, or `None` when they agree.
pub fn compare(subject: &[Item], reference: &[Item]) -> Option<Difference> {
    for (s, r) in subject.iter().zip(reference) {
        if s.key != r.key {
            return Some(Difference {
                key: r.key.clone(),
                index: None,
                subject: format!("{} = {}", s.key, summary(&s.value)),
                reference: format!("{} = {}", r.key, summary(&r.value)),
                input: input_json(r.input.as_ref(), None),
            });
        }
        if let Some((index, sv, rv)) = first_difference(&s.value, &r.value) {
            return Some(Difference {
                key: r.key.clone(),
                index,
                subject: sv,
                reference: rv,
                input: input_json(r.input.as_ref(), index),
            });
        }
    }
    let missing = |items: &[Item]| {
        items
            .first()
            .map(|i| format!("{} = {}", i.key, summary(&i.value)))
    };
    if subject.len() < reference.len() {
        let r = &reference[subject.len()];
        return Some(Difference {
            key: r.key.clone(),
            index: None,
            subject: "nothing (the subject stopped earlier)".into(),
            reference: missing(&reference[subject.len()..]).unwrap_or_default(),
            input: input_json(r.input.as_ref(), None),
        });
    }
    if subject.len() > reference.len() {
        let s = &subject[reference.len()];
        return Some(Difference {
            key: s.key.clone(),
            index: None,
            subject: missing(&subject[reference.len()..]).unwrap_or_default(),
            reference: "nothing (the reference stopped earlier)".into(),
            input: input_json(s.input.as_ref(), None),
        });
    }
    None
}

type Found = (Option<(usize, usize)>, String, String);

fn first_difference(s: &Value, r: &Value) -> Option<Found> {
    match (s, r) {
        (
            Value::Ints {
                shape: ss,
                data: sd,
            },
            Value::Ints {
                shape: rs,
                data: rd,
            },
        ) if ss == rs && sd.len() == rd.len() => {
            let i = sd.iter().zip(rd).position(|(a, b)| a != b)?;
            Some((
                Some((i / rs.1, i % rs.1)),
                sd[i].to_string(),
                rd[i].to_string(),
            ))
        }
        (
            Value::Floats {
                shape: ss,
                data: sd,
                ..
            },
            Value::Floats {
                shape: rs,
                data: rd,
                rel,
            },
        ) if ss == rs && sd.len() == rd.len() => {
            let close = |a: f64, b: f64| {
                // NaN anywhere is a difference unless both are NaN.
                (a.is_nan() && b.is_nan()) || (a - b).abs() <= rel * b.abs().max(1.0)
            };
            let i = sd.iter().zip(rd).position(|(&a, &b)| !close(a, b))?;
            Some((
                Some((i / rs.1, i % rs.1)),
                sd[i].to_string(),
                rd[i].to_string(),
            ))
        }
        (Value::Bytes(sb), Value::Bytes(rb)) if sb.len() == rb.len() => {
            let i = sb.iter().zip(rb).position(|(a, b)| a != b)?;
            Some((
                Some((i, 0)),
                format!("byte {i} = {:#04x}", sb[i]),
                format!("byte {i} = {:#04x}", rb[i]),
            ))
        }
        (a, b) if a == b => None,
        (a, b) => Some((None, summary(a), summary(b))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_differing_element_with_row_and_column() {
        let op = Arc::new(Operands {
            describe: json!({"type": 2}),
            a: vec![1.0, 2.0, 3.0, 4.0],
            b: vec![5.0, 6.0, 7.0, 8.0],
            mkn: (2, 2, 2),
        });
        let m = |d: Vec<i64>| Item {
            key: "C".into(),
            value: Value::Ints {
                shape: (2, 2),
                data: d,
            },
            input: Some(op.clone()),
        };
        assert_eq!(
            compare(&[m(vec![19, 22, 43, 50])], &[m(vec![19, 22, 43, 50])]),
            None
        );
        let d = compare(&[m(vec![19, 22, 40, 50])], &[m(vec![19, 22, 43, 50])]).unwrap();
        assert_eq!(d.index, Some((1, 0)));
        assert_eq!((d.subject.as_str(), d.reference.as_str()), ("40", "43"));
        assert_eq!(d.input["a_row"], json!([3.0, 4.0]));
        assert_eq!(d.input["b_col"], json!([5.0, 7.0]));
        assert_eq!(d.input["type"], 2);
    }

    #[test]
    fn codes_keys_lengths_and_tolerances() {
        let code = |k: &str, c| Item::new(k, Value::Code(c));
        let d = compare(&[code("create", -5)], &[code("create", 0)]).unwrap();
        assert_eq!(d.subject, "-5 (RKNN_ERR_PARAM_INVALID)");
        assert_eq!(d.reference, "0 (RKNN_SUCC)");
        let d = compare(&[code("create", 0)], &[code("create", 0), code("run", 0)]).unwrap();
        assert_eq!(d.key, "run");
        assert!(d.subject.contains("stopped earlier"));
        let f = |x: f64| {
            Item::new(
                "C",
                Value::Floats {
                    shape: (1, 1),
                    data: vec![x],
                    rel: 1e-3,
                },
            )
        };
        assert_eq!(compare(&[f(1000.5)], &[f(1000.0)]), None);
        assert!(compare(&[f(1002.0)], &[f(1000.0)]).is_some());
        assert!(compare(&[f(f64::NAN)], &[f(1.0)]).is_some());
        let d = compare(
            &[Item::new("B", Value::Bytes(vec![1, 2, 0x30]))],
            &[Item::new("B", Value::Bytes(vec![1, 2, 0x03]))],
        )
        .unwrap();
        assert_eq!(d.index, Some((2, 0)));
        assert_eq!(d.subject, "byte 2 = 0x30");
    }
}
