//! Encode throughput of the tokenizer on a few KB of mixed text (English prose, code, CJK,
//! emoji, digits, white-space runs), one thread, and the time to build it from the GGUF
//! metadata (reading the GGUF file and building the tokenizer, separately):
//!
//! ```sh
//! cargo bench -p rknn-llm --bench tokenizer [-- FILE.gguf ...]
//! ```
//!
//! Without arguments it measures the demo model (`models/`) and the llama.cpp vocab-only files
//! in the cache that are present (`scripts/llama-cpp.sh --vocab-only`).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use rknn_llm::gguf::GgufFile;
use rknn_llm::tokenizer::Tokenizer;

const SAMPLE: &str = "The tokenizer cuts text into words with the model's pre-tokenizer, then merges \
bytes by rank. It's fast enough that nobody should notice it: 1234 tokens, 56.78% done!\n\n\
fn main() {\n    let v: Vec<u32> = (0..10).map(|x| x * x).collect();\n    println!(\"{v:?}\");\n}\n\
Ελληνικά, русский, العربية, हिन्दी. 我们今天去公园散步，天气很好。こんにちは、世界！🦙🎉\n\
    indented    text\twith\ttabs   and    runs of spaces.\n<|im_start|>user\nHi<|im_end|>\n";

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn main() {
    let mut files: Vec<PathBuf> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .map(PathBuf::from)
        .collect();
    if files.is_empty() {
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
        files.push(root.join("models/SmolLM2-135M-Instruct.Q4_1.gguf"));
        let cache = std::env::var_os("RKNPU_CACHE").map_or_else(
            || PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/rknpu-rs"),
            PathBuf::from,
        );
        for v in ["llama-spm", "llama-bpe", "qwen2", "gpt-2"] {
            files.push(cache.join(format!("llama.cpp/vocab/ggml-vocab-{v}.gguf")));
        }
    }
    let text = SAMPLE.repeat(8192usize.div_ceil(SAMPLE.len()));
    println!("text: {} bytes, {} chars", text.len(), text.chars().count());
    println!(
        "{:<34} {:>8} {:>9} {:>7} {:>8} {:>11}",
        "vocabulary", "gguf ms", "build ms", "tokens", "MB/s", "tokens/s"
    );
    for path in files.iter().filter(|p| p.exists()) {
        let t = Instant::now();
        let file = GgufFile::open(path).expect("open GGUF");
        let open = t.elapsed();
        let t = Instant::now();
        let tok = Tokenizer::from_gguf(&file).expect("tokenizer");
        let build = t.elapsed();
        let n = tok.encode(&text, false, true).expect("encode").len();
        let times: Vec<Duration> = (0..15)
            .map(|_| {
                let t = Instant::now();
                std::hint::black_box(tok.encode(std::hint::black_box(&text), false, true))
                    .expect("encode");
                t.elapsed()
            })
            .collect();
        let per = median(times).as_secs_f64();
        let name = path.file_name().unwrap_or_default().to_string_lossy();
        println!(
            "{:<34} {:>8.1} {:>9.1} {:>7} {:>8.2} {:>11.0}",
            name,
            open.as_secs_f64() * 1e3,
            build.as_secs_f64() * 1e3,
            n,
            text.len() as f64 / per / 1e6,
            n as f64 / per
        );
    }
}
