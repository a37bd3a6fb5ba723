//! `llm-decode`: runs a GGUF model (llama / qwen2 family) on a prompt, with llama.cpp's flags.
//!
//! ```text
//! llm-decode -m MODEL.gguf -p "The capital of France is" -n 32 --temp 0
//! llm-decode -m MODEL.gguf --system "Be brief." -p "Why is the sky blue?"
//! llm-decode -m MODEL.gguf --chat
//! llm-decode -m MODEL.gguf --chat-template-file T.jinja --reasoning off -p "Hi"
//! llm-decode -m MODEL.gguf --perplexity text.txt --json
//! llm-decode -m MODEL.gguf -p "hello" --tokenize
//! ```
//!
//! The generated text goes to stdout as it is produced (after the prompt, as llama.cpp echoes
//! it); the load progress bar and the closing summary go to stderr. With `--json`, stdout
//! carries only one JSON object at the end. Errors are one line on stderr and exit status 1.
//!
//! With `--chat`, `--system`, `--chat-template-file` or `--reasoning` the prompt is a chat: the
//! model's `tokenizer.chat_template` (or the file's) rendered as Hugging Face's
//! `apply_chat_template` does ([`rknn_llm::chat`]). A model without a template gets the plain
//! text, with a warning.

use std::fs::File;
use std::io::{BufRead, BufWriter, IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::{Parser, ValueEnum};
use serde_json::json;

use rknn_llm::chat::{ChatOptions, ChatTemplate, Message, encode_prompt};
use rknn_llm::gguf::GgufFile;
use rknn_llm::model::{CacheOutcome, Model, host_pool};
use rknn_llm::perplexity::{PerplexityParams, Scoring, perplexity};
use rknn_llm::sample::SamplerConfig;
use rknn_llm::session::{GenerateParams, Generation, Session, rate};
use rknn_llm::spec::PromptLookup;
use rknn_llm::tokenizer::Tokenizer;
use rknn_matmul::engine::Engine;

#[path = "shared/backend.rs"]
mod backend;
use backend::{BackendArgs, backend_name};

type Error = Box<dyn std::error::Error + Send + Sync>;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum SpecArg {
    /// No speculation.
    None,
    /// Prompt lookup: the tokens that followed the latest earlier occurrence of the last
    /// n-gram, verified in one forward pass (lossless).
    Lookup,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Reasoning {
    /// The model reasons before it answers (`enable_thinking=true`).
    On,
    /// It answers directly (`enable_thinking=false`).
    Off,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum PplScoring {
    /// llama-perplexity's: chunks of the context size, each beginning with BOS, the second
    /// half of each scored (the text needs two chunks at least).
    SecondHalf,
    /// Every token but the first, in windows of the context size each beginning with BOS.
    EveryToken,
}

/// Runs a GGUF language model (llama / qwen2 architectures) on a prompt.
#[derive(Debug, Parser)]
#[command(name = "llm-decode", version, args_override_self = true)]
struct Args {
    /// The GGUF model file.
    #[arg(short = 'm', long, required_unless_present_any = ["weight_cache_list", "weight_cache_clear"])]
    model: Option<PathBuf>,
    /// List the weight cache's files (least recently used first) and exit.
    #[arg(long)]
    weight_cache_list: bool,
    /// Empty the weight cache and exit.
    #[arg(long)]
    weight_cache_clear: bool,
    /// The prompt text.
    #[arg(short = 'p', long, conflicts_with = "file")]
    prompt: Option<String>,
    /// Read the prompt from a file.
    #[arg(short = 'f', long)]
    file: Option<PathBuf>,
    /// Tokens to generate; 0 only evaluates the prompt, -1 runs until end of generation or a
    /// full context.
    #[arg(
        short = 'n',
        long = "n-predict",
        default_value_t = 128,
        allow_negative_numbers = true
    )]
    n_predict: i64,
    /// Threads of the host path (default: all available cores).
    #[arg(short = 't', long)]
    threads: Option<usize>,
    /// Where the weight matmuls run and how weights and the KV cache are stored.
    #[command(flatten)]
    backend: BackendArgs,
    /// Speculative decoding (lossless: greedy output is token-identical, sampling keeps the
    /// output distribution).
    #[arg(long, value_enum, default_value_t = SpecArg::None)]
    spec: SpecArg,
    /// Drafted tokens per verify pass at most.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u16).range(1..=64))]
    draft_max: u16,
    /// The longest n-gram prompt lookup matches (then shorter ones, down to 3-grams).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u16).range(1..=16))]
    ngram: u16,
    /// Context size: the most positions the KV cache holds (default 4096, or the trained
    /// context if shorter; with --perplexity 512, llama-perplexity's chunk size; 0 is the
    /// trained context; more than it is refused).
    #[arg(short = 'c', long = "ctx-size", value_name = "N")]
    ctx_size: Option<usize>,
    /// Tokens per forward call while evaluating a prompt.
    #[arg(short = 'b', long = "batch-size", default_value_t = 128)]
    batch_size: usize,
    /// Sampling temperature; 0 is greedy.
    #[arg(long, default_value_t = 0.8)]
    temp: f32,
    /// Top-k sampling; 0 disables.
    #[arg(long = "top-k", default_value_t = 40)]
    top_k: usize,
    /// Top-p (nucleus) sampling; 1.0 disables.
    #[arg(long = "top-p", default_value_t = 0.95)]
    top_p: f32,
    /// Penalty for repeating recent tokens; 1.0 disables.
    #[arg(long = "repeat-penalty", default_value_t = 1.0)]
    repeat_penalty: f32,
    /// How many recent tokens the repeat penalty considers.
    #[arg(long = "repeat-last-n", default_value_t = 64)]
    repeat_last_n: usize,
    /// OpenAI's presence penalty: subtracted from the logit of every token the completion has
    /// generated; 0 disables.
    #[arg(
        long = "presence-penalty",
        default_value_t = 0.0,
        allow_negative_numbers = true
    )]
    presence_penalty: f32,
    /// OpenAI's frequency penalty: subtracted once per time the completion generated the
    /// token; 0 disables.
    #[arg(
        long = "frequency-penalty",
        default_value_t = 0.0,
        allow_negative_numbers = true
    )]
    frequency_penalty: f32,
    /// Random seed (default: chosen at start and printed in the summary).
    #[arg(long)]
    seed: Option<u64>,
    /// Interactive chat: each line of stdin is a user message (the prompt, if any, is the first).
    #[arg(long)]
    chat: bool,
    /// System message; wraps the prompt in the model's chat template.
    #[arg(long)]
    system: Option<String>,
    /// The chat template (Jinja) instead of the model's tokenizer.chat_template; the prompt is
    /// wrapped in it.
    #[arg(long, value_name = "FILE")]
    chat_template_file: Option<PathBuf>,
    /// Whether a reasoning model thinks before it answers (the template's enable_thinking:
    /// Qwen3, SmolLM3); the prompt is wrapped in the chat template.
    #[arg(long, value_enum)]
    reasoning: Option<Reasoning>,
    /// Print one JSON object at the end instead of streaming text.
    #[arg(long)]
    json: bool,
    /// Score a text file teacher-forced and print its perplexity (as llama-perplexity does:
    /// chunks of the context size, the second half of each scored).
    #[arg(long, value_name = "FILE")]
    perplexity: Option<PathBuf>,
    /// Which tokens --perplexity scores.
    #[arg(long, value_enum, default_value_t = PplScoring::SecondHalf, requires = "perplexity")]
    perplexity_scoring: PplScoring,
    /// Score at most the first N chunks (windows) of the --perplexity text.
    #[arg(long, value_name = "N", requires = "perplexity")]
    chunks: Option<std::num::NonZeroUsize>,
    /// Write every evaluated (with --perplexity: scored) position's logits to FILE as raw
    /// little-endian f32 rows of n_vocab.
    #[arg(long = "dump-logits", value_name = "FILE")]
    dump_logits: Option<PathBuf>,
    /// Print the prompt's token ids and exit (works on vocabulary-only files).
    #[arg(long)]
    tokenize: bool,
}

/// `-c`'s default: bounded, so that a model trained for 32k or 128k positions does not take a
/// board's memory by default (llama.cpp's default is 4096 too).
const DEFAULT_CTX_SIZE: usize = 4096;

fn main() {
    let args = Args::parse();
    if let Err(e) = run(args) {
        let _ = std::io::stdout().flush();
        eprintln!("llm-decode: error: {e}");
        std::process::exit(1);
    }
}

/// Loads the model and runs the prompt (or the chat, the perplexity, the tokenization) that
/// `args` ask for. The decode loop is here: each piece the session's iterator returns is
/// printed as it comes.
fn run(args: Args) -> Result<(), Error> {
    if args.batch_size == 0 {
        return Err("--batch-size must be at least 1".into());
    }
    if args.chat && args.json {
        return Err("--json is not available with --chat".into());
    }
    if args.weight_cache_list || args.weight_cache_clear {
        return weight_cache_command(&args);
    }
    let model_path = args.model.clone().ok_or("no model: give -m MODEL.gguf")?;
    let t_load = Instant::now();
    let file = GgufFile::open(&model_path)?;
    if !args.tokenize {
        // An unsupported architecture is the first thing to report, before the vocabulary.
        rknn_llm::model::Config::from_gguf(&file)?;
    }
    let tok = Tokenizer::from_gguf(&file)?;
    let prompt_text = match (&args.prompt, &args.file) {
        (Some(p), _) => Some(p.clone()),
        (None, Some(f)) => Some(
            std::fs::read_to_string(f)
                .map_err(|e| format!("cannot read prompt file {}: {e}", f.display()))?,
        ),
        (None, None) => None,
    };

    if args.tokenize {
        let text = prompt_text.ok_or("--tokenize needs a prompt (-p TEXT or -f FILE)")?;
        return print_tokens(&tok, &text, args.json);
    }
    let templated = args.chat
        || args.system.is_some()
        || args.chat_template_file.is_some()
        || args.reasoning.is_some();
    let template = match templated {
        true => chat_template(&file, &tok, &args)?,
        false => None,
    };
    let chat_options = ChatOptions {
        enable_thinking: args.reasoning.map(|r| r == Reasoning::On),
        ..ChatOptions::default()
    };

    let threads = match args.threads {
        Some(0) => return Err("--threads must be at least 1".into()),
        Some(t) => t,
        None => std::thread::available_parallelism().map_or(1, |n| n.get()),
    };
    // This thread drives the model: as the pool's member 0 it runs each pass itself.
    let pool = host_pool(threads)?;
    let (mut model, weight_cache) = load_model(&model_path, &file, pool, &args)?;
    model.set_context(
        args.ctx_size
            .unwrap_or(DEFAULT_CTX_SIZE.min(model.config().n_ctx)),
    )?;
    let model = Arc::new(model);
    let seed = args.seed.unwrap_or_else(random_seed);
    let sampling = SamplerConfig {
        temperature: args.temp,
        top_k: args.top_k,
        top_p: args.top_p,
        repeat_penalty: args.repeat_penalty,
        repeat_last_n: args.repeat_last_n,
        seed,
        presence_penalty: args.presence_penalty,
        frequency_penalty: args.frequency_penalty,
    };
    let mut session = Session::new(model.clone(), Arc::new(tok), sampling)?;
    session.set_cache_type(args.backend.cache_type());
    let load_time = t_load.elapsed();
    let load_peak = Memory::rss().map(|r| r.1);
    let dump = match &args.dump_logits {
        Some(p) => Some(SharedFile::create(p)?),
        None => None,
    };

    if let Some(path) = &args.perplexity {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        return run_perplexity(&model, &session, &text, &args, dump);
    }
    if let Some(d) = &dump {
        session.set_logits_tap(Some(Box::new(d.clone())));
    }
    let params = GenerateParams {
        max_tokens: usize::try_from(args.n_predict).ok(),
        stop: Vec::new(),
        lookup: match args.spec {
            SpecArg::None => None,
            SpecArg::Lookup => Some(PromptLookup {
                draft_max: usize::from(args.draft_max),
                ngram_max: usize::from(args.ngram),
                ngram_min: usize::from(args.ngram).min(PromptLookup::default().ngram_min),
            }),
        },
        batch: args.batch_size,
    };
    if args.chat {
        return chat(
            &mut session,
            template.as_ref(),
            &chat_options,
            args.system.as_deref(),
            prompt_text.as_deref(),
            &params,
        );
    }

    let text = prompt_text.ok_or("no prompt: give -p TEXT or -f FILE (or --chat)")?;
    let (prompt_ids, echo) = match &template {
        Some(t) => {
            let mut messages = Vec::new();
            if let Some(system) = &args.system {
                messages.push(Message::system(system.as_str()));
            }
            messages.push(Message::user(text.as_str()));
            let rendered = t.render(&messages, true, &chat_options)?;
            (
                encode_prompt(session.tokenizer(), &rendered)?,
                String::new(),
            )
        }
        None => (session.tokenizer().encode(&text, true, true)?, text.clone()),
    };
    if prompt_ids.is_empty() {
        return Err("the prompt is empty after tokenization".into());
    }
    let stream = !args.json;
    let mut stdout = std::io::stdout();
    if stream {
        print!("{echo}");
        stdout.flush()?;
    }
    let mut generation = session.generate_tokens(&prompt_ids, &params)?;
    for piece in &mut generation {
        let piece = piece?;
        if stream && !piece.text.is_empty() {
            stdout.write_all(piece.text.as_bytes())?;
            stdout.flush()?;
        }
    }
    let out = generation.summary().clone();
    drop(generation);
    if stream {
        println!();
    }
    if let Some(d) = &dump {
        d.lock().flush()?;
    }
    let engine = model.engine();
    let stats = session.sequence().stats().clone();
    let summary = Summary {
        speculating: args.spec != SpecArg::None,
        load_time,
        out: &out,
        threads,
        seed,
        backend: backend_name(engine),
    };
    summary.print();
    if let Some(e) = engine {
        eprintln!("{}", engine_line(e));
    }
    let modelled = out.modelled.map(|(p, d)| {
        let cores = engine.map_or(0, rknn_matmul::engine::Engine::workers);
        (rate(out.prompt_tokens, p), rate(out.decisions, d), cores)
    });
    let mut memory = Memory::measure(&model, session.sequence().cache().cache_type());
    memory.load_peak = load_peak;
    eprintln!("{}", memory.line());
    if let Some((p, d, cores)) = modelled {
        eprintln!(
            "modelled RK3588 (cost model of the NPU time only, {cores} cores): prefill {p:.1} tok/s, decode {d:.1} tok/s"
        );
    }
    if args.json {
        let doc = json!({
            "prompt_ids": prompt_ids,
            "generated_ids": out.generated,
            "text": out.text,
            "prefill_tok_s": out.prefill_tok_s(),
            "decode_tok_s": out.decode_tok_s(),
            "backend": backend_name(engine),
            "stats": {
                "modelled_rk3588": modelled.map(|(p, d, cores)| json!({
                    "prefill_tok_s": p,
                    "decode_tok_s": d,
                    "cores": cores,
                    "note": "rknn_emu::cost model of the NPU time only (docs/npu-matmul-performance.md)",
                })),
                "wtype": model.backend_kind(),
                "engine": engine.map(engine_json),
                "load_s": load_time.as_secs_f64(),
                "prompt_tokens": prompt_ids.len(),
                "generated_tokens": out.generated.len(),
                "prefill_s": out.prefill_time.as_secs_f64(),
                "decode_s": out.decode_time.as_secs_f64(),
                "decode_forwards": out.decode_forwards,
                "spec": spec_json(&args, &out),
                "stop": out.stop.map_or("none", |s| s.name()),
                "threads": threads,
                "kernel": rknn_llm::model::kernels::selected().name(),
                "seed": seed,
                "n_ctx": model.n_ctx(),
                "n_ctx_train": model.config().n_ctx,
                "cache_type": session.sequence().cache().cache_type().name(),
                "memory": memory.json(),
                "weight_cache": weight_cache.as_ref().map(|c| json!({
                    "outcome": c.name(),
                    "path": c.path().display().to_string(),
                    "line": c.to_string(),
                })),
                "matmul_s": stats.matmul.as_secs_f64(),
                "attention_s": stats.attention.as_secs_f64(),
                "other_s": stats.other.as_secs_f64(),
            },
        });
        println!("{doc}");
    }
    Ok(())
}

/// A file the session's logits tap and `run` share (the tap is `Send + 'static`).
#[derive(Clone)]
struct SharedFile(Arc<std::sync::Mutex<BufWriter<File>>>);

impl SharedFile {
    fn create(p: &std::path::Path) -> Result<SharedFile, Error> {
        let f = File::create(p).map_err(|e| format!("cannot create {}: {e}", p.display()))?;
        Ok(SharedFile(Arc::new(std::sync::Mutex::new(BufWriter::new(
            f,
        )))))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BufWriter<File>> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl Write for SharedFile {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.lock().write(buf)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.lock().flush()
    }
}

fn print_tokens(tok: &Tokenizer, text: &str, json: bool) -> Result<(), Error> {
    let ids = tok.encode(text, true, true)?;
    if json {
        println!("{}", serde_json::to_string(&ids)?);
    } else {
        for id in ids {
            let piece = String::from_utf8_lossy(tok.token_to_piece(id));
            println!("{id:6} -> {piece:?}");
        }
    }
    Ok(())
}

/// The engine's per-phase times, one line.
fn engine_line(e: &Engine) -> String {
    let s = e.stats();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    format!(
        "engine: {} on {} ({}), {} cores, contexts of N <= {}, A/C {}, {} forwards | quantize {:.0} ms, pack {:.0} ms, run {:.0} ms, collect {:.0} ms, waiting for workers {:.0} ms in {} rounds",
        e.runtime().backend_name(),
        e.runtime().platform(),
        e.runtime().selection_reason(),
        e.workers(),
        e.max_n_per_context(),
        if e.shares_io_memories() {
            "shared per core"
        } else {
            "per context"
        },
        s.forwards,
        ms(s.quantize.time),
        ms(s.pack.time),
        ms(s.run.time),
        ms(s.collect.time),
        ms(s.wait.time),
        s.wait.count
    )
}

fn engine_json(e: &Engine) -> serde_json::Value {
    let s = e.stats();
    let phase =
        |p: &rknn_matmul::engine::PhaseStats| json!({"count": p.count, "s": p.time.as_secs_f64()});
    json!({
        "runtime": e.runtime().backend_name(),
        "hardware": e.runtime().is_hardware(),
        "platform": e.runtime().platform().name(),
        "selection_reason": e.runtime().selection_reason(),
        "cores": e.workers(),
        "max_n_per_context": e.max_n_per_context(),
        "shares_io_memories": e.shares_io_memories(),
        "iommu_domain_bytes": e.domain_bytes(),
        "handles": {
            "live": e.runtime().handle_budget().live(),
            "budget": e.runtime().handle_budget().budget(),
        },
        "forwards": s.forwards,
        "quantize": phase(&s.quantize),
        "pack": phase(&s.pack),
        "run": phase(&s.run),
        "collect": phase(&s.collect),
        "wait": phase(&s.wait),
    })
}

/// Loads the model on the backend `args` name, with a progress bar on stderr.
fn load_model(
    path: &Path,
    file: &GgufFile,
    pool: Arc<rayon::ThreadPool>,
    args: &Args,
) -> Result<(Model, Option<CacheOutcome>), Error> {
    let bar = indicatif::ProgressBar::new(0).with_style(
        indicatif::ProgressStyle::with_template(
            "loading {bar:40.cyan/blue} {bytes}/{total_bytes} ({elapsed})",
        )?
        .progress_chars("=> "),
    );
    let mut progress = |done: u64, total: u64| {
        bar.set_length(total);
        bar.set_position(done);
    };
    let (model, cache) = backend::load_model(path, file, pool, &args.backend, &mut progress)?;
    bar.finish_and_clear();
    // Where the weights came from, on a terminal (as the progress bar); a cache that could not
    // be used or written is a warning wherever stderr goes.
    if let Some(c) = &cache {
        if c.is_warning() || std::io::stderr().is_terminal() {
            eprintln!("llm-decode: {c}");
        }
    }
    Ok((model, cache))
}

/// The chat template: `--chat-template-file`'s, else the model's; `None` (with a warning)
/// when the model has none, so that the prompt is plain text.
fn chat_template(
    file: &GgufFile,
    tok: &Tokenizer,
    args: &Args,
) -> Result<Option<ChatTemplate>, Error> {
    let template = match &args.chat_template_file {
        Some(path) => {
            let source = std::fs::read_to_string(path)
                .map_err(|e| format!("cannot read chat template {}: {e}", path.display()))?;
            Some(ChatTemplate::new(path.display().to_string(), source)?.with_tokens_of(tok))
        }
        None => ChatTemplate::from_gguf(file, tok)?,
    };
    if template.is_none() {
        eprintln!(
            "llm-decode: warning: {} has no chat template (tokenizer.chat_template): the prompt is plain text (--chat-template-file FILE gives one)",
            args.model.as_deref().unwrap_or(Path::new("")).display()
        );
    }
    Ok(template)
}

/// `--weight-cache-list` and `--weight-cache-clear`.
fn weight_cache_command(args: &Args) -> Result<(), Error> {
    let Some(cache) = args.backend.weight_cache()? else {
        return Err(
            "no weight cache (--no-weight-cache, or no home directory: give --weight-cache DIR)"
                .into(),
        );
    };
    if args.weight_cache_clear {
        let (files, bytes) = cache.clear()?;
        println!(
            "removed {files} file(s), {:.1} MiB, from {}",
            bytes as f64 / (1u64 << 20) as f64,
            cache.dir().display()
        );
        return Ok(());
    }
    let entries = cache.entries()?;
    let total: u64 = entries.iter().map(|e| e.bytes).sum();
    println!(
        "{}: {} file(s), {:.1} of {:.1} GiB (least recently used first)",
        cache.dir().display(),
        entries.len(),
        total as f64 / (1u64 << 30) as f64,
        cache.cap() as f64 / (1u64 << 30) as f64
    );
    for e in entries {
        let what = match &e.key {
            Ok(key) => key
                .lines()
                .filter(|l| {
                    ["gguf=", "chip=", "weight format=", "rotation seed="]
                        .iter()
                        .any(|p| l.starts_with(p))
                })
                .collect::<Vec<_>>()
                .join(", "),
            Err(why) => format!("unusable: {why}"),
        };
        let age = e.used.elapsed().map_or(0, |d| d.as_secs());
        println!(
            "{:>9.1} MiB  used {age} s ago  {}  ({what})",
            e.bytes as f64 / (1u64 << 20) as f64,
            e.path.display()
        );
    }
    Ok(())
}

/// The process's resident memory against what the model holds.
struct Memory {
    footprint: rknn_llm::model::Footprint,
    /// (current, peak) resident set, from /proc/self/status (Linux).
    rss: Option<(u64, u64)>,
    /// The peak when the model had loaded.
    load_peak: Option<u64>,
}

impl Memory {
    /// (current, peak) resident set now, from /proc/self/status (Linux).
    fn rss() -> Option<(u64, u64)> {
        let status = std::fs::read_to_string("/proc/self/status").ok()?;
        let kib = |key: &str| -> Option<u64> {
            let line = status.lines().find(|l| l.starts_with(key))?;
            let v = line[key.len()..].trim().trim_end_matches("kB").trim();
            v.parse::<u64>().ok().map(|k| k * 1024)
        };
        kib("VmRSS:").zip(kib("VmHWM:"))
    }

    fn measure(model: &Model, ty: rknn_llm::model::CacheType) -> Memory {
        Memory {
            footprint: model.footprint(ty),
            rss: Memory::rss(),
            load_peak: None,
        }
    }

    fn line(&self) -> String {
        let f = &self.footprint;
        let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
        let rss = match self.rss {
            Some((now, peak)) => format!(
                "peak RSS {:.0} MiB ({:.2}× the model's; {:.0} MiB by the end of loading), now {:.0} MiB",
                mib(peak),
                peak as f64 / f.total().max(1) as f64,
                mib(self.load_peak.unwrap_or(0)),
                mib(now)
            ),
            None => "RSS unknown".into(),
        };
        format!(
            "memory: {rss} | model: weights {:.0} MiB + host tensors {:.0} MiB + KV cache at -c {:.0} MiB",
            mib(f.weights),
            mib(f.host),
            mib(f.kv)
        )
    }

    fn json(&self) -> serde_json::Value {
        let f = &self.footprint;
        json!({
            "peak_rss_bytes": self.rss.map(|r| r.1),
            "load_peak_rss_bytes": self.load_peak,
            "rss_bytes": self.rss.map(|r| r.0),
            "weight_bytes": f.weights,
            "host_tensor_bytes": f.host,
            "kv_bytes": f.kv,
            "model_bytes": f.total(),
            "peak_rss_over_model": self.rss.map(|r| r.1 as f64 / f.total().max(1) as f64),
        })
    }
}

fn random_seed() -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    nanos ^ (u64::from(std::process::id()) << 32)
}

/// Interactive chat: every line of stdin is a user message; each turn renders the whole
/// conversation with the template and the session's KV cache keeps what the previous turns
/// evaluated, so each turn evaluates only its own tokens. Without a template each line is
/// plain text continuing the session.
fn chat(
    session: &mut Session,
    template: Option<&ChatTemplate>,
    options: &ChatOptions,
    system: Option<&str>,
    first: Option<&str>,
    params: &GenerateParams,
) -> Result<(), Error> {
    match template {
        Some(t) => eprintln!(
            "chat (template {}): one message per line, end with Ctrl-D",
            t.name()
        ),
        None => eprintln!("chat (no template: plain text): one message per line, end with Ctrl-D"),
    }
    let n_ctx = session.sequence().n_ctx();
    let mut lines = std::io::stdin().lock().lines();
    let mut pending = first.map(str::to_string);
    let mut stdout = std::io::stdout();
    loop {
        let user = match pending.take() {
            Some(u) => u,
            None => {
                eprint!("> ");
                std::io::stderr().flush()?;
                match lines.next() {
                    Some(line) => line?,
                    None => break,
                }
            }
        };
        if user.trim().is_empty() {
            continue;
        }
        let mut turn = match template {
            Some(t) => session.chat(t, system, &user, options, params)?,
            None => session.generate(&user, params)?,
        };
        for piece in &mut turn {
            stdout.write_all(piece?.text.as_bytes())?;
            stdout.flush()?;
        }
        let out = turn.summary().clone();
        drop(turn);
        println!();
        eprintln!(
            "[{} tokens, {:.1} tok/s, context {}/{n_ctx}]",
            out.generated.len(),
            out.decode_tok_s(),
            session.history().len(),
        );
        if out.stop == Some(rknn_llm::session::Stop::Context) {
            return Err("context overflow: the conversation filled the context".into());
        }
    }
    Ok(())
}

struct Summary<'a> {
    speculating: bool,
    load_time: Duration,
    out: &'a Generation,
    threads: usize,
    seed: u64,
    backend: &'static str,
}

impl Summary<'_> {
    fn print(&self) {
        let o = self.out;
        eprintln!(
            "prompt: {} tokens, {:.1} tok/s | generated: {} tokens, {:.1} tok/s (stop: {}) | load {:.2} s | {} backend, {} threads, seed {}",
            o.prompt_tokens,
            o.prefill_tok_s(),
            o.generated.len(),
            o.decode_tok_s(),
            o.stop.map_or("none", |s| s.name()),
            self.load_time.as_secs_f64(),
            self.backend,
            self.threads,
            self.seed
        );
        if self.speculating {
            let s = o.spec;
            eprintln!(
                "speculation (prompt lookup): {} verify passes, {} drafted, {} accepted ({:.1} %), {:.2} tokens per forward pass",
                s.passes,
                s.drafted,
                s.accepted,
                100.0 * s.acceptance(),
                o.tokens_per_pass()
            );
        }
    }
}

fn spec_json(args: &Args, o: &Generation) -> serde_json::Value {
    match args.spec {
        SpecArg::None => json!({"mode": "none"}),
        SpecArg::Lookup => json!({
            "mode": "lookup",
            "draft_max": args.draft_max,
            "ngram": args.ngram,
            "passes": o.spec.passes,
            "drafted": o.spec.drafted,
            "accepted": o.spec.accepted,
            "acceptance": o.spec.acceptance(),
            "tokens_per_pass": o.tokens_per_pass(),
        }),
    }
}

/// `-c`'s default with `--perplexity`: llama-perplexity's, so the two score the same chunks.
const PERPLEXITY_CTX_SIZE: usize = 512;

/// `--perplexity`: the text's perplexity as `--perplexity-scoring` says
/// ([`rknn_llm::perplexity`]), each scored position's logits written to `--dump-logits`; the
/// summary as llama-perplexity prints it.
fn run_perplexity(
    model: &Model,
    session: &Session,
    text: &str,
    args: &Args,
    dump: Option<SharedFile>,
) -> Result<(), Error> {
    let params = PerplexityParams {
        scoring: match args.perplexity_scoring {
            PplScoring::SecondHalf => Scoring::SecondHalf,
            PplScoring::EveryToken => Scoring::EveryToken,
        },
        batch: args.batch_size,
        max_chunks: args.chunks,
    };
    let mut seq = model.sequence(session.sequence().cache().cache_type());
    if args.ctx_size.is_none() {
        seq.limit_context(PERPLEXITY_CTX_SIZE);
    }
    let t = Instant::now();
    let mut dump = dump;
    let p = perplexity(
        model,
        &mut seq,
        session.tokenizer(),
        text,
        &params,
        |row| match &mut dump {
            Some(d) => {
                for v in row {
                    d.write_all(&v.to_le_bytes())?;
                }
                Ok(())
            }
            None => Ok(()),
        },
    )?;
    if let Some(d) = &mut dump {
        d.flush()?;
    }
    eprintln!(
        "perplexity: {} chunks of {} ({} scoring), {} of the text's {} tokens scored, {:.1} tok/s",
        p.chunks,
        p.n_ctx,
        p.scoring,
        p.scored,
        p.tokens,
        rate(p.evaluated, t.elapsed())
    );
    let running: Vec<String> = p
        .running
        .iter()
        .enumerate()
        .map(|(i, v)| format!("[{}]{v:.4}", i + 1))
        .collect();
    eprintln!("{}", running.join(","));
    match p.ppl_error {
        Some(e) => eprintln!("Final estimate: PPL = {:.4} +/- {e:.5}", p.ppl),
        None => eprintln!(
            "Final estimate: PPL = {:.4} (one token scored: no error estimate)",
            p.ppl
        ),
    }
    let engine = model.engine();
    if let Some(e) = engine {
        eprintln!("{}", engine_line(e));
    }
    if args.json {
        println!(
            "{}",
            json!({
                "ppl": p.ppl,
                "ppl_error": p.ppl_error,
                "nll": p.nll,
                "chunks": p.chunks,
                "n_ctx": p.n_ctx,
                "n_tokens": p.tokens,
                "n_scored": p.scored,
                "scoring": p.scoring.name(),
                "running": p.running,
                "backend": backend_name(engine),
                "wtype": model.backend_kind(),
            })
        );
    } else {
        println!("{:.4}", p.ppl);
    }
    Ok(())
}
