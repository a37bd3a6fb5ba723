//! `llm-decode`: runs a GGUF model on a prompt, with llama.cpp's flags.
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
//!
//! The model loads through [`rknn_llm::ModelBuilder`] (its flags: [`rknn_llm::cli::LoadArgs`]);
//! each mode is a file: `complete.rs` (a prompt, the default), `chat.rs` (`--chat`),
//! `perplexity.rs` (`--perplexity`), `cache_admin.rs` (`--weight-cache-list`,
//! `--weight-cache-clear`); `report.rs` prints the summary, the engine's and the memory lines and
//! the JSON.

mod cache_admin;
mod chat;
mod complete;
mod perplexity;
mod report;

use std::fs::File;
use std::io::{BufWriter, IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use clap::{Parser, ValueEnum};

use rknn_llm::chat::{ChatOptions, ChatTemplate};
use rknn_llm::cli::LoadArgs;
use rknn_llm::constraint::{GrammarCompiler, GrammarSpec};
use rknn_llm::gguf::GgufFile;
use rknn_llm::sample::SamplerConfig;
use rknn_llm::session::{GenerateParams, Session};
use rknn_llm::spec::PromptLookup;
use rknn_llm::tokenizer::Tokenizer;
use rknn_llm::{LoadError, LoadedModel, Model, ModelBuilder};

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

/// Runs a GGUF language model on a prompt.
#[derive(Debug, Parser)]
#[command(name = "llm-decode", version, args_override_self = true)]
struct Args {
    /// The GGUF model file.
    #[arg(short = 'm', long, required_unless_present_any = ["weight_cache_list", "weight_cache_clear", "kernels"])]
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
    load: LoadArgs,
    /// Speculative decoding (lossless: greedy output is token-identical, sampling keeps the
    /// output distribution).
    #[arg(long, value_enum, default_value_t = SpecArg::None)]
    spec: SpecArg,
    /// Drafted tokens per verify pass at most (prompt lookup's and the draft model's).
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u16).range(1..=64))]
    draft_max: u16,
    /// A draft model for speculative decoding (llama.cpp's -md, also spelled so): a smaller
    /// model of the same vocabulary proposes up to --draft-max tokens, each its own argmax,
    /// and the model verifies them in one pass (lossless). Loaded as the model is (backend,
    /// weights, context); with --spec lookup, it drafts where lookup finds nothing.
    #[arg(long = "model-draft", value_name = "FILE")]
    model_draft: Option<PathBuf>,
    /// The draft model stops drafting where its probability of its next token falls below P
    /// (0 to 1).
    #[arg(
        long = "draft-p-min",
        value_name = "P",
        default_value_t = 0.0,
        requires = "model_draft"
    )]
    draft_p_min: f32,
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
    /// Constrain the output to JSON that validates against this JSON Schema (inline, as
    /// llama.cpp's -j); every token is sampled among those that keep it valid.
    #[arg(
        short = 'j',
        long = "json-schema",
        value_name = "SCHEMA",
        group = "constraint"
    )]
    json_schema: Option<String>,
    /// --json-schema, read from FILE.
    #[arg(long = "json-schema-file", value_name = "FILE", group = "constraint")]
    json_schema_file: Option<PathBuf>,
    /// Constrain the output to this GBNF grammar (llama.cpp's format; a `root` rule), or a
    /// Lark grammar (llguidance's dialect) when it begins with `%llguidance`.
    #[arg(long, value_name = "GRAMMAR", group = "constraint")]
    grammar: Option<String>,
    /// --grammar, read from FILE.
    #[arg(long = "grammar-file", value_name = "FILE", group = "constraint")]
    grammar_file: Option<PathBuf>,
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
    /// Print which host kernels the LLM's host work uses (RKNN_KERNEL_LLM), and why, then
    /// exit (`rknn-info --kernels` gives the SDK's own components).
    #[arg(long)]
    kernels: bool,
}

/// What `llm-decode` is asked to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// `--kernels`.
    Kernels,
    /// `--weight-cache-list`, `--weight-cache-clear`.
    WeightCache,
    /// `--tokenize`.
    Tokenize,
    /// `--perplexity FILE`.
    Perplexity,
    /// `--chat`.
    Chat,
    /// A prompt (the default).
    Complete,
}

impl Mode {
    /// The mode the flags ask for, once they are checked.
    fn of(args: &Args) -> Result<Mode, Error> {
        if args.batch_size == 0 {
            return Err("--batch-size must be at least 1".into());
        }
        if args.chat && args.json {
            return Err("--json is not available with --chat".into());
        }
        let generating = !(args.kernels
            || args.weight_cache_list
            || args.weight_cache_clear
            || args.tokenize
            || args.perplexity.is_some());
        if args.model_draft.is_some() && !generating {
            return Err(
                "--model-draft drafts tokens while generating; this mode generates none".into(),
            );
        }
        Ok(if args.kernels {
            Mode::Kernels
        } else if args.weight_cache_list || args.weight_cache_clear {
            Mode::WeightCache
        } else if args.tokenize {
            Mode::Tokenize
        } else if args.perplexity.is_some() {
            Mode::Perplexity
        } else if args.chat {
            Mode::Chat
        } else {
            Mode::Complete
        })
    }
}

/// Runs the mode the flags ask for; an error is one line on stderr and exit status 1.
fn main() {
    // llama.cpp's `-md` (`--model-draft`): two letters after one dash, which clap cannot declare.
    let args = Args::parse_from(rknn_llm::cli::rewrite_spellings(
        std::env::args_os(),
        &[("-md", "--model-draft")],
    ));
    let done = match Mode::of(&args) {
        Err(e) => Err(e),
        Ok(Mode::Kernels) => report::print_kernels(args.json),
        Ok(Mode::WeightCache) => cache_admin::run(&args),
        Ok(Mode::Tokenize) => tokenize(&args),
        Ok(mode) => match Prepared::new(&args) {
            Err(e) => Err(e),
            Ok(p) if mode == Mode::Perplexity => perplexity::run(&args, p),
            Ok(p) if mode == Mode::Chat => chat::run(&args, p),
            Ok(p) => complete::run(&args, p),
        },
    };
    if let Err(e) = done {
        let _ = std::io::stdout().flush();
        eprintln!("llm-decode: error: {e}");
        std::process::exit(1);
    }
}

/// What the modes that run the model start from: the model loaded as the flags say, a
/// session over it, the chat template, the generation's parameters.
pub(crate) struct Prepared {
    pub(crate) loaded: LoadedModel,
    /// `--model-draft`'s model, drafting for the session.
    pub(crate) draft: Option<LoadedModel>,
    pub(crate) session: Session,
    /// The chat template, when the prompt is a chat.
    pub(crate) template: Option<ChatTemplate>,
    pub(crate) params: GenerateParams,
    /// `-p`'s text, or `-f`'s file's (`--perplexity`'s file's, in that mode).
    pub(crate) prompt: Option<String>,
    pub(crate) seed: u64,
    /// The peak resident set when the model had loaded.
    pub(crate) load_peak: Option<u64>,
    /// `--dump-logits`.
    pub(crate) dump: Option<SharedFile>,
}

impl Prepared {
    fn new(args: &Args) -> Result<Prepared, Error> {
        let model_path = args.model.clone().ok_or("no model: give -m MODEL.gguf")?;
        // Read before the model loads, so that a missing file is reported at once.
        let prompt = match &args.perplexity {
            Some(path) => Some(
                std::fs::read_to_string(path)
                    .map_err(|e| format!("cannot read {}: {e}", path.display()))?,
            ),
            None => prompt_text(args)?,
        };
        let spec = constraint_spec(args)?;
        let loaded = load_with(args, &model_path, |b| b.load().map(|l| (l, ())))?.0;
        let draft = match &args.model_draft {
            Some(path) => {
                let max = usize::from(args.draft_max);
                let (d, draft) =
                    load_with(args, path, |b| b.load_draft(&loaded, max, args.draft_p_min))
                        .map_err(|e| format!("--model-draft {}: {e}", path.display()))?;
                Some((d, draft))
            }
            None => None,
        };
        let load_peak = report::Memory::rss().map(|r| r.1);
        let seed = args.seed.unwrap_or_else(random_seed);
        let mut session = loaded.session(SamplerConfig {
            temperature: args.temp,
            top_k: args.top_k,
            top_p: args.top_p,
            repeat_penalty: args.repeat_penalty,
            repeat_last_n: args.repeat_last_n,
            seed,
            presence_penalty: args.presence_penalty,
            frequency_penalty: args.frequency_penalty,
            logit_bias: Vec::new(),
        })?;
        let draft = draft.map(|(d, model)| {
            session.set_draft(Some(model));
            d
        });
        let dump = match &args.dump_logits {
            Some(p) => Some(SharedFile::create(p)?),
            None => None,
        };
        let template = match args.perplexity {
            Some(_) => None,
            None => chat_template(args, &loaded)?,
        };
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
            constraint: match spec {
                Some(spec) => Some(
                    GrammarCompiler::new(&loaded.tokenizer)
                        .and_then(|c| c.compile(&spec))
                        .map_err(|e| format!("--{}: {e}", spec_flag(&spec)))?,
                ),
                None => None,
            },
            logprobs: None,
            preserve: Vec::new(),
        };
        Ok(Prepared {
            loaded,
            draft,
            session,
            template,
            params,
            prompt,
            seed,
            load_peak,
            dump,
        })
    }
}

/// The prompt text: `-p`'s, or `-f`'s file's.
fn prompt_text(args: &Args) -> Result<Option<String>, Error> {
    Ok(match (&args.prompt, &args.file) {
        (Some(p), _) => Some(p.clone()),
        (None, Some(f)) => Some(
            std::fs::read_to_string(f)
                .map_err(|e| format!("cannot read prompt file {}: {e}", f.display()))?,
        ),
        (None, None) => None,
    })
}

/// `--tokenize`: the prompt's ids, from the vocabulary alone (no weights are loaded, so a
/// vocabulary-only file works).
fn tokenize(args: &Args) -> Result<(), Error> {
    let path = args
        .model
        .as_deref()
        .ok_or("no model: give -m MODEL.gguf")?;
    let text = prompt_text(args)?.ok_or("--tokenize needs a prompt (-p TEXT or -f FILE)")?;
    let tok = Tokenizer::from_gguf(&GgufFile::open(path)?)?;
    let ids = tok.encode(&text, true, true)?;
    if args.json {
        println!("{}", serde_json::to_string(&ids)?);
    } else {
        for id in ids {
            let piece = String::from_utf8_lossy(tok.token_to_piece(id));
            println!("{id:6} -> {piece:?}");
        }
    }
    Ok(())
}

/// Loads the model at `path` as the flags say, by `how` (a plain load, or as a draft), with a
/// progress bar on stderr; tells where the weights came from on a terminal, and a weight cache
/// that could not be used or written wherever stderr goes.
fn load_with<T>(
    args: &Args,
    path: &Path,
    how: impl FnOnce(ModelBuilder) -> Result<(LoadedModel, T), LoadError>,
) -> Result<(LoadedModel, T), Error> {
    let bar = indicatif::ProgressBar::new(0).with_style(
        indicatif::ProgressStyle::with_template(
            "loading {bar:40.cyan/blue} {bytes}/{total_bytes} ({elapsed})",
        )?
        .progress_chars("=> "),
    );
    let progress = bar.clone();
    let mut builder = args
        .load
        .apply(Model::builder(path))?
        .progress(move |done, total| {
            progress.set_length(total);
            progress.set_position(done);
        });
    if let Some(t) = args.threads {
        builder = builder.threads(t);
    }
    if let Some(c) = args.ctx_size {
        builder = builder.context(c);
    }
    if let Some(f) = &args.chat_template_file {
        builder = builder.chat_template_file(f);
    }
    // This thread drives the model: as its host pool's member 0 it runs each pass itself.
    let (loaded, extra) = how(builder)?;
    bar.finish_and_clear();
    if let Some(c) = &loaded.weight_cache {
        if c.is_warning() || std::io::stderr().is_terminal() {
            eprintln!("llm-decode: {c}");
        }
    }
    Ok((loaded, extra))
}

/// Whether the prompt is a chat (rendered with the chat template).
fn templated(args: &Args) -> bool {
    args.chat
        || args.system.is_some()
        || args.chat_template_file.is_some()
        || args.reasoning.is_some()
}

/// The chat template when the prompt is a chat: `--chat-template-file`'s, else the model's;
/// `None` (with a warning) when the model has none, so that the prompt is plain text.
fn chat_template(args: &Args, loaded: &LoadedModel) -> Result<Option<ChatTemplate>, Error> {
    if !templated(args) {
        return Ok(None);
    }
    let template = loaded.chat_template.clone()?;
    if template.is_none() {
        eprintln!(
            "llm-decode: warning: {} has no chat template (tokenizer.chat_template): the prompt is plain text (--chat-template-file FILE gives one)",
            loaded.path.display()
        );
    }
    Ok(template)
}

/// The template's options the flags set.
fn chat_options(args: &Args) -> ChatOptions {
    ChatOptions {
        enable_thinking: args.reasoning.map(|r| r == Reasoning::On),
        ..ChatOptions::default()
    }
}

fn random_seed() -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    nanos ^ (u64::from(std::process::id()) << 32)
}

/// A file the session's logits tap and the modes share (the tap is `Send + 'static`).
#[derive(Clone)]
struct SharedFile(Arc<std::sync::Mutex<BufWriter<File>>>);

impl SharedFile {
    fn create(p: &Path) -> Result<SharedFile, Error> {
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

/// The grammar of --json-schema(-file) or --grammar(-file), read and parsed before the model
/// loads so that a bad file is reported at once.
fn constraint_spec(args: &Args) -> Result<Option<GrammarSpec>, Error> {
    let read = |flag: &str, path: &PathBuf| {
        std::fs::read_to_string(path)
            .map_err(|e| format!("{flag}: cannot read {}: {e}", path.display()))
    };
    let schema = |flag: &str, text: &str| -> Result<GrammarSpec, Error> {
        let v: serde_json::Value =
            serde_json::from_str(text).map_err(|e| format!("{flag}: not JSON: {e}"))?;
        Ok(GrammarSpec::JsonSchema(v))
    };
    let grammar = |text: String| {
        if text.trim_start().starts_with("%llguidance") {
            GrammarSpec::Lark(text)
        } else {
            GrammarSpec::Gbnf(text)
        }
    };
    let spec = if let Some(s) = &args.json_schema {
        schema("--json-schema", s)?
    } else if let Some(p) = &args.json_schema_file {
        schema("--json-schema-file", &read("--json-schema-file", p)?)?
    } else if let Some(g) = &args.grammar {
        grammar(g.clone())
    } else if let Some(p) = &args.grammar_file {
        grammar(read("--grammar-file", p)?)
    } else {
        return Ok(None);
    };
    if args.perplexity.is_some() {
        return Err("a grammar constrains generation; --perplexity scores a text as it is".into());
    }
    Ok(Some(spec))
}

/// The flag a grammar came from, for messages.
fn spec_flag(spec: &GrammarSpec) -> &'static str {
    match spec {
        GrammarSpec::JsonSchema(_) => "json-schema",
        _ => "grammar",
    }
}
