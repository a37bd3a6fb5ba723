//! `llm-server`: an OpenAI-compatible HTTP server over one GGUF model, its requests decoded
//! together by [`rknn_llm::serve`]'s continuous batching. llama-server's flags where it has
//! them.
//!
//! ```text
//! llm-server -m MODEL.gguf --port 8080 -c 8192 -np 4
//! curl http://127.0.0.1:8080/v1/chat/completions -d '{"messages":[{"role":"user","content":"Hi"}]}'
//! ```
//!
//! Endpoints: `POST /v1/chat/completions`, `POST /v1/completions` (also without `/v1`),
//! `GET /v1/models`, `GET /health`, `GET /metrics` (Prometheus), `POST /tokenize`,
//! `POST /detokenize`. The port is bound first and the model loads in the background: until
//! it is loaded `/health` and every other endpoint answer 503. SIGTERM or SIGINT stops
//! taking connections and requests, lets the running ones finish (at most
//! `--shutdown-timeout` seconds) and exits 0; a second signal exits at once.
//!
//! One log line on stderr per lifecycle event; no progress bar.

mod api;
mod conn;
mod error;
mod metrics;
mod params;
mod tools;

use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use tokio::net::TcpListener;

use rknn_llm::Model;
use rknn_llm::cli::LoadArgs;
use rknn_llm::constraint::GrammarCompiler;
use rknn_llm::model::Pooling;
use rknn_llm::serve::{Batcher, ServeConfig, ServeError};

use api::{AppState, HttpConfig, Loaded};

/// An error of starting or loading (`Send`, so that the model loads on a thread of its own).
type Error = Box<dyn std::error::Error + Send + Sync>;

/// The environment variable read for the API key when `--api-key` is not given.
const API_KEY_ENV: &str = "LLM_SERVER_API_KEY";

/// How long, after the batcher has ended every request at shutdown, the server waits for
/// the last responses to reach their clients.
const DRAIN: Duration = Duration::from_secs(5);

/// Serves a GGUF language model over HTTP with OpenAI's API (chat and text completions).
#[derive(Debug, Clone, Parser)]
#[command(name = "llm-server", version, args_override_self = true)]
struct Args {
    /// The GGUF model file.
    #[arg(short = 'm', long)]
    model: PathBuf,
    /// The address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// The port to listen on (0 picks a free one; the log line tells which).
    #[arg(long, default_value_t = 8080)]
    port: u16,
    /// Context size shared by the slots: each gets N / --parallel positions (default 4096,
    /// or the trained context if shorter; 0 is the trained context; more than it is refused).
    #[arg(short = 'c', long = "ctx-size", value_name = "N")]
    ctx_size: Option<usize>,
    /// Requests decoded together (slots), also `-np N`.
    #[arg(long, value_name = "N", default_value_t = 4)]
    parallel: usize,
    /// Threads of the host path (default: all available cores).
    #[arg(short = 't', long)]
    threads: Option<usize>,
    /// Require `Authorization: Bearer KEY` (every endpoint but /health); default: the
    /// LLM_SERVER_API_KEY environment variable, if set.
    #[arg(long, value_name = "KEY")]
    api_key: Option<String>,
    /// The chat template (Jinja) instead of the model's tokenizer.chat_template.
    #[arg(long, value_name = "FILE")]
    chat_template_file: Option<PathBuf>,
    /// Requests that may wait for a slot beyond those running; more are refused (503).
    #[arg(long, value_name = "N", default_value_t = ServeConfig::default().queue)]
    queue: usize,
    /// Prompt tokens evaluated per forward pass at most, over all the prompts arriving
    /// (smaller keeps running streams steadier; larger starts new requests sooner).
    #[arg(long, value_name = "N", default_value_t = ServeConfig::default().prefill_chunk)]
    prefill_chunk: usize,
    /// The largest request body, in bytes (413 past it).
    #[arg(long, value_name = "BYTES", default_value_t = 4 << 20)]
    body_limit: usize,
    /// Each request's deadline in seconds (504 past it), also the bound on reading its body.
    #[arg(long, value_name = "SECONDS", default_value_t = 600)]
    timeout: u64,
    /// Seconds a client has to send a request's head (request line and headers), from the
    /// moment the server waits for it (a new or a kept-alive connection); past it the
    /// connection is closed.
    #[arg(long, value_name = "SECONDS", default_value_t = 30)]
    header_timeout: u64,
    /// At shutdown, how long running requests may go on, in seconds.
    #[arg(long, value_name = "SECONDS", default_value_t = 30)]
    shutdown_timeout: u64,
    /// How /v1/embeddings pools an input's hidden states: mean, last or cls (default: the
    /// model's {arch}.pooling_type; without it, embeddings are refused until this is set).
    #[arg(long, value_name = "mean|last|cls")]
    pooling: Option<Pooling>,
    /// The model id /v1/models shows and responses name (default: the file's stem).
    #[arg(short = 'a', long, value_name = "NAME")]
    alias: Option<String>,
    /// A draft model for speculative decoding (also `-md`, llama-server's spelling): a smaller
    /// model of the same vocabulary, loaded as the model is, proposes up to --draft-max tokens
    /// per slot and step, each its own argmax; the step's pass verifies them (lossless).
    #[arg(long = "model-draft", value_name = "FILE")]
    model_draft: Option<PathBuf>,
    /// Tokens the draft model proposes per step at most (1 to 64).
    #[arg(long, alias = "spec-draft-n-max", value_name = "N", default_value_t = 8,
          value_parser = clap::value_parser!(u16).range(1..=64), requires = "model_draft")]
    draft_max: u16,
    /// The draft model stops drafting where its probability of its next token falls below P
    /// (0 to 1).
    #[arg(
        long,
        alias = "spec-draft-p-min",
        value_name = "P",
        default_value_t = 0.0,
        requires = "model_draft"
    )]
    draft_p_min: f32,
    /// Where the weight matmuls run and how weights and the KV cache are stored.
    #[command(flatten)]
    load: LoadArgs,
}

/// llama-server's `-np` (`--parallel`) and `-md` (`--model-draft`), rewritten before clap
/// parses ([`rknn_llm::cli::rewrite_spellings`]).
fn rewrite_np(args: impl IntoIterator<Item = OsString>) -> Vec<OsString> {
    rknn_llm::cli::rewrite_spellings(args, SPELLINGS)
}

/// llama-server's spellings of two letters after one dash.
const SPELLINGS: &[(&str, &str)] = &[("-np", "--parallel"), ("-md", "--model-draft")];

/// Parses the flags (after `-np`), starts a small async runtime and serves; exits with the status.
fn main() {
    let args = Args::parse_from(rewrite_np(std::env::args_os()));
    // The HTTP side stays light (two workers); the model runs on its own pool, and blocking
    // work (loading, rendering, tokenizing) on tokio's blocking threads.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .max_blocking_threads(32)
        .thread_name("llm-server-io")
        .enable_all()
        .build();
    let code = match runtime {
        Ok(rt) => rt.block_on(run(args)),
        Err(e) => {
            eprintln!("llm-server: error: cannot start the async runtime: {e}");
            1
        }
    };
    // Exits without waiting for blocking threads (a model still loading at a signal).
    std::process::exit(code);
}

/// Serves until a signal; the exit status.
async fn run(args: Args) -> i32 {
    match serve(args).await {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("llm-server: error: {e}");
            1
        }
    }
}

/// What the numeric flags resolve to.
#[derive(Debug, Clone)]
struct Settings {
    /// Host threads.
    threads: usize,
    /// The request deadline.
    timeout: Duration,
    /// The bound on reading a request's head.
    header_timeout: Duration,
    /// The shutdown grace.
    shutdown_timeout: Duration,
}

impl Settings {
    /// Checks the flags that no value parser checks.
    fn from_args(args: &Args) -> Result<Settings, Error> {
        let at_least_one = [
            ("--parallel", args.parallel as u64),
            ("--prefill-chunk", args.prefill_chunk as u64),
            ("--body-limit", args.body_limit as u64),
            ("--timeout", args.timeout),
            ("--header-timeout", args.header_timeout),
        ];
        for (flag, v) in at_least_one {
            if v == 0 {
                return Err(format!("{flag} must be at least 1").into());
            }
        }
        let threads = match args.threads {
            Some(0) => return Err("--threads must be at least 1".into()),
            Some(t) => t,
            None => std::thread::available_parallelism().map_or(1, |n| n.get()),
        };
        Ok(Settings {
            threads,
            timeout: Duration::from_secs(args.timeout),
            header_timeout: Duration::from_secs(args.header_timeout),
            shutdown_timeout: Duration::from_secs(args.shutdown_timeout),
        })
    }
}

/// Binds, loads the model in the background, serves, and shuts down at a signal.
async fn serve(args: Args) -> Result<(), Error> {
    let settings = Settings::from_args(&args)?;
    let mut signals = Signals::new()?;
    let api_key = args
        .api_key
        .clone()
        .or_else(|| std::env::var(API_KEY_ENV).ok())
        .filter(|k| !k.is_empty());
    let alias = args.alias.clone().unwrap_or_else(|| {
        args.model
            .file_stem()
            .map_or_else(|| "model".into(), |s| s.to_string_lossy().into_owned())
    });
    let listener = TcpListener::bind((args.host.as_str(), args.port))
        .await
        .map_err(|e| format!("cannot listen on {}:{}: {e}", args.host, args.port))?;
    let addr = listener.local_addr()?;
    eprintln!("llm-server: listening on http://{addr}");

    let state = Arc::new(AppState::new(HttpConfig {
        alias,
        api_key,
        body_limit: args.body_limit,
        timeout: settings.timeout,
    }));
    let (stop_tx, mut stop_rx) = tokio::sync::watch::channel(false);
    let app = api::router(state.clone());
    let stop = async move {
        let _ = stop_rx.wait_for(|stop| *stop).await;
    };
    let mut server = tokio::spawn(conn::serve(listener, app, settings.header_timeout, stop));

    eprintln!("llm-server: loading {}", args.model.display());
    let t_load = Instant::now();
    let load_args = args.clone();
    let threads = settings.threads;
    let mut loading = tokio::task::spawn_blocking(move || load(&load_args, threads));
    let (loaded, batcher) = tokio::select! {
        r = &mut loading => r.map_err(|e| format!("loading the model failed: {e}"))??,
        () = signals.recv() => {
            eprintln!("llm-server: shutting down (the model was still loading)");
            return Ok(());
        }
        r = &mut server => return Err(server_ended(r)),
    };
    eprintln!(
        "llm-server: model loaded in {:.2} s ({} backend, {} slots of {} positions, {threads} threads)",
        t_load.elapsed().as_secs_f64(),
        loaded.backend,
        loaded.slots,
        loaded.slot_ctx,
    );
    if let Err(why) = &loaded.template {
        eprintln!("llm-server: warning: chat completions are unavailable: {why}");
    }
    let batcher = Arc::new(batcher);
    *state.batcher.lock().unwrap_or_else(|e| e.into_inner()) = Some(batcher.clone());
    // Set once, here: the cell is empty until now.
    let _ = state.loaded.set(loaded);

    tokio::select! {
        () = signals.recv() => {}
        r = &mut server => return Err(server_ended(r)),
    }
    eprintln!("llm-server: shutting down");
    let _ = stop_tx.send(true);
    batcher.close();
    tokio::spawn(async move {
        signals.recv().await;
        eprintln!("llm-server: second signal: exiting now");
        std::process::exit(1);
    });
    let grace = settings.shutdown_timeout;
    let waiter = batcher.clone();
    let idle = tokio::task::spawn_blocking(move || waiter.wait_idle(grace))
        .await
        .unwrap_or(false);
    if !idle {
        eprintln!(
            "llm-server: requests still running after {} s: ending them",
            grace.as_secs()
        );
    }
    // Dropping the last handle ends whatever still runs (ShuttingDown) and joins the thread.
    drop(batcher);
    if let Some(b) = state.take_batcher() {
        let _ = tokio::task::spawn_blocking(move || drop(b)).await;
    }
    if tokio::time::timeout(DRAIN, &mut server).await.is_err() {
        eprintln!("llm-server: some connections were still open");
    }
    eprintln!("llm-server: stopped");
    Ok(())
}

/// The error of a server task that ended before it was told to.
fn server_ended(r: Result<(), tokio::task::JoinError>) -> Error {
    match r {
        Ok(()) => "the HTTP server stopped unexpectedly".into(),
        Err(e) => format!("the HTTP server failed: {e}").into(),
    }
}

/// Loads the model and starts the batcher (on a blocking thread).
fn load(args: &Args, threads: usize) -> Result<(Loaded, Batcher), Error> {
    let mut builder = args
        .load
        .apply(Model::builder(&args.model))?
        .threads(threads);
    if let Some(c) = args.ctx_size {
        builder = builder.context(c);
    }
    if let Some(f) = &args.chat_template_file {
        builder = builder.chat_template_file(f);
    }
    let (parallel, queue, prefill_chunk) = (args.parallel, args.queue, args.prefill_chunk);
    let draft_args = args.clone();
    // The model loads on the batcher's own thread, which then drives its host pool.
    let (loaded, batcher) = builder.serve(move |loaded| {
        // `-c` is the context of all the slots together, as llama-server's.
        let total = loaded.model.n_ctx();
        let slot_ctx = total / parallel;
        if slot_ctx == 0 {
            return Err(ServeError::Config(format!(
                "a context of {total} positions leaves none for each of {parallel} slots: raise -c or lower --parallel"
            )));
        }
        let draft = match &draft_args.model_draft {
            Some(path) => {
                let max = usize::from(draft_args.draft_max);
                let (d, draft) = draft_args
                    .load
                    .apply(Model::builder(path))
                    .and_then(|b| b.load_draft(loaded, max, draft_args.draft_p_min))
                    .map_err(|e| ServeError::Config(format!("--model-draft {}: {e}", path.display())))?;
                if let Some(c) = &d.weight_cache {
                    eprintln!("llm-server: draft: {c}");
                }
                Some(draft)
            }
            None => None,
        };
        Ok(ServeConfig {
            slots: parallel,
            slot_ctx,
            queue,
            prefill_chunk,
            cache_type: loaded.kv_cache,
            draft,
        })
    })?;
    if let Some(c) = &loaded.weight_cache {
        eprintln!("llm-server: {c}");
    }
    let template = match &loaded.chat_template {
        Ok(Some(t)) => Ok(Arc::new(t.clone())),
        Ok(None) => Err(format!(
            "the model {} has no chat template (tokenizer.chat_template): start llm-server with --chat-template-file FILE",
            args.model.display()
        )),
        Err(e) => Err(format!(
            "the model's chat template is unusable ({e}): start llm-server with --chat-template-file FILE"
        )),
    };
    let served = Loaded {
        tokenizer: loaded.tokenizer.clone(),
        template,
        slot_ctx: batcher.config().slot_ctx,
        n_ctx_train: loaded.model.config().n_ctx,
        slots: parallel,
        backend: loaded.backend.name(),
        grammars: GrammarCompiler::new(&loaded.tokenizer)
            .map(Arc::new)
            .map_err(|e| e.to_string()),
        pooling: match args.pooling {
            Some(p) => Ok(p),
            None => loaded.model.pooling().map_err(|e| e.to_string()),
        },
        n_embd: loaded.model.config().n_embd,
    };
    Ok((served, batcher))
}

/// SIGTERM and SIGINT, registered at start (so that neither kills the process outright).
#[derive(Debug)]
struct Signals {
    /// SIGTERM.
    #[cfg(unix)]
    term: tokio::signal::unix::Signal,
    /// SIGINT.
    #[cfg(unix)]
    int: tokio::signal::unix::Signal,
}

impl Signals {
    /// Registers the handlers.
    fn new() -> std::io::Result<Signals> {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{SignalKind, signal};
            Ok(Signals {
                term: signal(SignalKind::terminate())?,
                int: signal(SignalKind::interrupt())?,
            })
        }
        #[cfg(not(unix))]
        Ok(Signals {})
    }

    /// The next signal.
    async fn recv(&mut self) {
        #[cfg(unix)]
        tokio::select! {
            _ = self.term.recv() => {}
            _ = self.int.recv() => {}
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn os(v: &[&str]) -> Vec<OsString> {
        v.iter().map(OsString::from).collect()
    }

    #[test]
    fn np_means_parallel() {
        assert_eq!(
            rewrite_np(os(&["llm-server", "-np", "2", "-np=3", "--", "-np"])),
            os(&["llm-server", "--parallel", "2", "--parallel=3", "--", "-np"])
        );
        let args = Args::parse_from(rewrite_np(os(&["llm-server", "-m", "x.gguf", "-np", "2"])));
        assert_eq!(args.parallel, 2);
    }

    #[test]
    fn defaults_are_llama_servers() {
        let a = Args::parse_from(["llm-server", "-m", "x.gguf"]);
        assert_eq!(
            (a.host.as_str(), a.port, a.parallel),
            ("127.0.0.1", 8080, 4)
        );
        assert_eq!((a.queue, a.body_limit, a.timeout), (64, 4 << 20, 600));
        assert_eq!((a.shutdown_timeout, a.header_timeout), (30, 30));
        assert!(Settings::from_args(&a).is_ok());
        for flag in ["--parallel", "--header-timeout"] {
            let zero = Args::parse_from(["llm-server", "-m", "x.gguf", flag, "0"]);
            let e = Settings::from_args(&zero).unwrap_err().to_string();
            assert!(e.contains(flag), "{e}");
        }
    }
}
