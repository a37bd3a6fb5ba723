//! The GGUF reader on the demo model (SmolLM2-135M-Instruct, Q4_1), against what the PyPI
//! `gguf` package's reader reports for that file.

mod common;

use rknn_llm::gguf::{GgmlType, GgufFile};

#[test]
fn demo_model_header_metadata_and_directory() {
    let Some(path) = common::require(common::demo_model(), "scripts/fetch-model.sh") else {
        return;
    };
    let f = GgufFile::open(&path).unwrap();
    assert_eq!(f.version(), 3);
    let md = f.metadata();
    assert_eq!(md.len(), 33);
    assert_eq!(md.get_str("general.architecture"), Some("llama"));
    assert_eq!(md.get("llama.block_count").unwrap().as_u32(), Some(30));
    assert_eq!(md.get("llama.context_length").unwrap().as_u32(), Some(8192));
    assert_eq!(
        md.get("llama.rope.freq_base").unwrap().as_f32(),
        Some(100000.0)
    );
    assert_eq!(
        md.get("tokenizer.ggml.add_bos_token").unwrap().as_bool(),
        Some(false)
    );
    let tokens = md
        .get("tokenizer.ggml.tokens")
        .and_then(|v| v.as_array())
        .and_then(|a| a.as_strings())
        .unwrap();
    assert_eq!(tokens.len(), 49152);
    let types = md
        .get("tokenizer.ggml.token_type")
        .and_then(|v| v.as_array())
        .and_then(|a| a.as_i32s())
        .unwrap();
    assert_eq!(types.len(), 49152);
    let merges = md.get("tokenizer.ggml.merges").unwrap().as_array().unwrap();
    assert_eq!(merges.len(), 48900);

    assert_eq!(f.tensor_infos().len(), 272);
    let emb = f.tensor("token_embd.weight").unwrap();
    assert_eq!(emb.dims(), &[576, 49152]);
    assert_eq!(emb.ty(), GgmlType::Q8_0);
    // The `gguf` package reports absolute file offsets.
    assert_eq!(f.data_offset() + emb.info().offset(), 1785664);
    let down = f.tensor("blk.0.ffn_down.weight").unwrap();
    assert_eq!(down.dims(), &[1536, 576]);
    assert_eq!(down.ty(), GgmlType::Q4_1);
    assert_eq!(f.data_offset() + down.info().offset(), 31868992);
    assert_eq!(down.data().len(), 1536 / 32 * 20 * 576);
}
