//! The GGUF reader against a file written by the PyPI `gguf` package's GGUFWriter, with the
//! expectations read back by its GGUFReader (scripts/fixtures/gen_gguf_fixtures.py): every
//! metadata value type, typed and nested arrays, a custom alignment, tensors of several types.

mod common;

use rknn_llm::gguf::{Array, GgufFile, Value, ValueType};
use serde_json::Value as Json;

fn type_name(t: ValueType) -> &'static str {
    match t {
        ValueType::U8 => "UINT8",
        ValueType::I8 => "INT8",
        ValueType::U16 => "UINT16",
        ValueType::I16 => "INT16",
        ValueType::U32 => "UINT32",
        ValueType::I32 => "INT32",
        ValueType::F32 => "FLOAT32",
        ValueType::Bool => "BOOL",
        ValueType::String => "STRING",
        ValueType::Array => "ARRAY",
        ValueType::U64 => "UINT64",
        ValueType::I64 => "INT64",
        ValueType::F64 => "FLOAT64",
    }
}

/// The value as the fixture spells it: floats as bit patterns, integers as numbers, nested
/// arrays flattened (the package's reader flattens them).
fn to_json(v: &Value) -> Json {
    match v {
        Value::U8(x) => (*x).into(),
        Value::I8(x) => (*x).into(),
        Value::U16(x) => (*x).into(),
        Value::I16(x) => (*x).into(),
        Value::U32(x) => (*x).into(),
        Value::I32(x) => (*x).into(),
        Value::U64(x) => (*x).into(),
        Value::I64(x) => (*x).into(),
        Value::F32(x) => x.to_bits().into(),
        Value::F64(x) => x.to_bits().into(),
        Value::Bool(x) => (*x).into(),
        Value::String(s) => s.clone().into(),
        Value::Array(a) => Json::Array(flatten(a)),
    }
}

fn flatten(a: &Array) -> Vec<Json> {
    match a {
        Array::U8(v) => v.iter().map(|&x| x.into()).collect(),
        Array::I8(v) => v.iter().map(|&x| x.into()).collect(),
        Array::U16(v) => v.iter().map(|&x| x.into()).collect(),
        Array::I16(v) => v.iter().map(|&x| x.into()).collect(),
        Array::U32(v) => v.iter().map(|&x| x.into()).collect(),
        Array::I32(v) => v.iter().map(|&x| x.into()).collect(),
        Array::U64(v) => v.iter().map(|&x| x.into()).collect(),
        Array::I64(v) => v.iter().map(|&x| x.into()).collect(),
        Array::F32(v) => v.iter().map(|x| x.to_bits().into()).collect(),
        Array::F64(v) => v.iter().map(|x| x.to_bits().into()).collect(),
        Array::Bool(v) => v.iter().map(|&x| x.into()).collect(),
        Array::String(v) => v.iter().map(|x| x.clone().into()).collect(),
        Array::Array(v) => v.iter().flat_map(flatten).collect(),
    }
}

fn type_chain(v: &Value) -> Vec<&'static str> {
    let mut chain = vec![type_name(v.value_type())];
    let mut arr = v.as_array();
    while let Some(a) = arr {
        chain.push(type_name(a.element_type()));
        arr = a.as_arrays().and_then(|inner| inner.first());
    }
    chain
}

#[test]
fn file_written_by_gguf_py_reads_as_gguf_py_reads_it() {
    let dir = common::fixtures().join("gguf");
    let expected: Json =
        serde_json::from_slice(&std::fs::read(dir.join("all_types.json")).unwrap()).unwrap();
    let f = GgufFile::open(dir.join("all_types.gguf")).unwrap();
    assert_eq!(
        u64::from(f.version()),
        expected["version"].as_u64().unwrap()
    );
    assert_eq!(f.alignment(), expected["alignment"].as_u64().unwrap());
    assert_eq!(f.data_offset(), expected["data_offset"].as_u64().unwrap());

    let meta = expected["metadata"].as_array().unwrap();
    assert_eq!(f.metadata().len(), meta.len());
    for (entry, (key, value)) in meta.iter().zip(f.metadata().iter()) {
        assert_eq!(key, entry["key"].as_str().unwrap(), "order");
        let types: Vec<&str> = entry["types"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_str().unwrap())
            .collect();
        assert_eq!(type_chain(value), types, "{key}");
        assert_eq!(to_json(value), entry["value"], "{key}");
    }

    // Accessors on a few keys.
    let md = f.metadata();
    assert_eq!(md.get("t.u8").unwrap().as_u32(), Some(200));
    assert_eq!(md.get("t.i8").unwrap().as_i64(), Some(-100));
    assert_eq!(md.get("t.i8").unwrap().as_u32(), None, "negative is no u32");
    assert_eq!(md.get("t.u64").unwrap().as_u32(), None, "too large for u32");
    assert_eq!(md.get("t.f32").unwrap().as_f32(), Some(1e-5));
    assert_eq!(
        md.get("t.f64").unwrap().as_f32(),
        None,
        "no silent narrowing"
    );
    assert_eq!(md.get("t.true").unwrap().as_bool(), Some(true));
    assert_eq!(md.get_str("t.str"), Some("héllo ✓ 世界 🦀"));
    let strs = md.get("t.arr_str").unwrap().as_array().unwrap();
    assert_eq!(strs.as_strings().unwrap()[3], "Ġthe");
    assert_eq!(strs.as_f32s(), None);
    assert_eq!(
        md.get("t.arr_i32").unwrap().as_array().unwrap().as_i32s(),
        Some(&[-1, 2, -3, i32::MAX][..])
    );
    assert!(md.get("missing").is_none());

    let tensors = expected["tensors"].as_array().unwrap();
    assert_eq!(f.tensor_infos().len(), tensors.len());
    for t in tensors {
        let name = t["name"].as_str().unwrap();
        let view = f.tensor(name).unwrap();
        let dims: Vec<u64> = t["dims"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d.as_u64().unwrap())
            .collect();
        assert_eq!(view.dims(), dims, "{name}");
        assert_eq!(view.ty().name(), t["type"].as_str().unwrap(), "{name}");
        assert_eq!(u64::from(view.ty().id()), t["type_id"].as_u64().unwrap());
        assert_eq!(
            view.info().offset(),
            t["offset"].as_u64().unwrap(),
            "{name}"
        );
        assert_eq!(view.data().len() as u64, t["n_bytes"].as_u64().unwrap());
        let bits: Vec<u32> = view.to_f32().unwrap().iter().map(|x| x.to_bits()).collect();
        let want: Vec<u32> = t["values_bits"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| b.as_u64().unwrap() as u32)
            .collect();
        assert_eq!(bits, want, "{name} values");
        // Row-wise conversion agrees with whole-tensor conversion.
        let row_len = view.info().row_len() as usize;
        let mut row = vec![0.0f32; row_len];
        for r in 0..view.info().n_rows() as usize {
            view.rows_to_f32(r, &mut row).unwrap();
            let got: Vec<u32> = row.iter().map(|x| x.to_bits()).collect();
            assert_eq!(got, want[r * row_len..(r + 1) * row_len], "{name} row {r}");
        }
        assert!(
            view.rows_to_f32(view.info().n_rows() as usize, &mut row)
                .is_err()
        );
    }
}

#[test]
fn from_bytes_reads_the_same_as_open() {
    let path = common::fixtures().join("gguf/all_types.gguf");
    let a = GgufFile::open(&path).unwrap();
    let b = GgufFile::from_bytes(std::fs::read(&path).unwrap()).unwrap();
    assert_eq!(a.metadata().len(), b.metadata().len());
    for (x, y) in a.tensors().zip(b.tensors()) {
        assert_eq!(x.data(), y.data());
    }
}

#[test]
fn missing_file_is_an_io_error_naming_the_path() {
    let err = GgufFile::open("/nonexistent/model.gguf").unwrap_err();
    assert!(err.to_string().contains("/nonexistent/model.gguf"), "{err}");
}
