//! `llm-decode`: runs a GGUF model on a prompt (in progress).

fn main() {
    eprintln!("llm-decode: not written yet");
    std::process::exit(2);
}
