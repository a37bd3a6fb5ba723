//! Grammars from requests (llm-server's `grammar` and `json_schema`, llm-decode's --grammar):
//! the GBNF translation never panics and gives a Lark grammar with a `start` rule or a typed
//! error; whatever compiles (GBNF, Lark or a JSON Schema, by the input's first byte) is driven
//! for a few tokens (mask, then the first allowed token) without a panic, over the tiny test
//! model's vocabulary.
#![no_main]

use std::sync::{Arc, OnceLock};

use libfuzzer_sys::fuzz_target;
use rknn_llm::constraint::{GrammarCompiler, GrammarSpec, gbnf_to_lark};
use rknn_llm::gguf::GgufFile;
use rknn_llm::tokenizer::Tokenizer;

fn compiler() -> &'static GrammarCompiler {
    static C: OnceLock<GrammarCompiler> = OnceLock::new();
    C.get_or_init(|| {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../examples/llm/tests/fixtures/llm/tiny-llama.gguf"
        );
        let tok = Tokenizer::from_gguf(&GgufFile::open(path).unwrap()).unwrap();
        GrammarCompiler::new(&Arc::new(tok)).unwrap()
    })
}

fuzz_target!(|data: &[u8]| {
    let [kind, rest @ ..] = data else {
        return;
    };
    let text = String::from_utf8_lossy(rest).into_owned();
    if let Ok(lark) = gbnf_to_lark(&text) {
        assert!(lark.contains("\nstart: "), "{lark}");
    }
    let spec = match kind % 3 {
        0 => GrammarSpec::Gbnf(text),
        1 => GrammarSpec::Lark(text),
        _ => match serde_json::from_str(&text) {
            Ok(v) => GrammarSpec::JsonSchema(v),
            Err(_) => return,
        },
    };
    let Ok(grammar) = compiler().compile(&spec) else {
        return;
    };
    let mut c = grammar.start();
    let mut row = vec![0.0f32; 512];
    for _ in 0..8 {
        row.fill(0.0);
        if c.mask(&mut row).is_err() {
            return;
        }
        let Some(t) = row.iter().position(|l| l.is_finite()) else {
            return;
        };
        if c.commit(t as u32).is_err() {
            return;
        }
    }
});
