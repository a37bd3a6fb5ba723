//! The GGUF reader and the model loader on arbitrary bytes: the header, metadata and tensor
//! directory are parsed; whatever parses is used as a caller would (every tensor viewed and
//! dequantized whole and row by row, the two compared; the model configuration, tokenizer and
//! f32 model built from it; two tokens run through a loaded model). Any panic, abort or
//! sanitizer report is a finding.
#![no_main]

use std::sync::{Arc, OnceLock};

use libfuzzer_sys::fuzz_target;
use rknn_llm::gguf::GgufFile;
use rknn_llm::model::{CacheType, Config, HostF32Factory, Logits, Model};
use rknn_llm::tokenizer::Tokenizer;

fn pool() -> Arc<rayon::ThreadPool> {
    static POOL: OnceLock<Arc<rayon::ThreadPool>> = OnceLock::new();
    POOL.get_or_init(|| {
        Arc::new(
            rayon::ThreadPoolBuilder::new()
                .num_threads(1)
                .build()
                .expect("a one-thread pool"),
        )
    })
    .clone()
}

fuzz_target!(|data: &[u8]| {
    let Ok(file) = GgufFile::from_bytes(data.to_vec()) else {
        return;
    };
    for (key, value) in file.metadata().iter() {
        let _ = (key.len(), value.as_str(), value.as_u64(), value.as_f32());
    }
    for t in file.tensors() {
        let info = t.info();
        assert_eq!(t.data().len() as u64, info.n_bytes());
        assert_eq!(info.dims().iter().product::<u64>(), info.n_elements());
        if !t.ty().can_dequantize() {
            assert!(t.to_f32().is_err());
            continue;
        }
        // Sizes are bounded by the input: at most 32 values per 2 bytes (F16 is 1 per 2, the
        // block formats at most 256 per 84).
        let all = t.to_f32().expect("a parsed, dequantizable tensor converts");
        assert_eq!(all.len() as u64, info.n_elements());
        let row = info.row_len() as usize;
        // An empty tensor may claim any row length: nothing to convert.
        if info.n_elements() == 0 {
            continue;
        }
        // Row by row must give the same bits as the whole tensor.
        let rows = (info.n_rows() as usize).min(4);
        let mut part = vec![0f32; rows * row];
        t.rows_to_f32(0, &mut part).expect("rows in range");
        for (a, b) in part.iter().zip(&all) {
            assert_eq!(a.to_bits(), b.to_bits());
        }
        // One row past the end is refused.
        let mut one = vec![0f32; row];
        assert!(t.rows_to_f32(info.n_rows() as usize, &mut one).is_err());
    }
    if let Ok(tok) = Tokenizer::from_gguf(&file) {
        if let Ok(ids) = tok.encode("Hello world <|im_start|> 123", true, true) {
            assert!(ids.iter().all(|&id| (id as usize) < tok.n_vocab()));
            let _ = tok.detokenize(&ids, true, true);
        }
    }
    if Config::from_gguf(&file).is_err() {
        return;
    }
    let mut factory = HostF32Factory::new(pool());
    let Ok(model) = Model::load(&file, &mut factory, pool(), &mut |_, _| {}) else {
        return;
    };
    let c = model.config().clone();
    if c.n_vocab == 0 || c.n_ctx < 2 {
        return;
    }
    let mut seq = model.sequence(CacheType::F32);
    let logits = model
        .forward(&mut seq, &[0, (c.n_vocab - 1) as u32], 0, Logits::All)
        .expect("two in-vocabulary tokens within the context");
    assert_eq!(logits.len(), 2 * c.n_vocab);
});
