//! Serving many requests on one model: a [`Batcher`] owns `slots` sessions over one shared
//! [`Model`] and decodes every active request in the same forward pass (continuous batching),
//! on one thread of its own, with no async runtime (`llm-server` puts HTTP in front of it).
//!
//! Why one pass for all: decode reads every weight once per pass whatever the number of rows,
//! so on an NPU bound by reading the weights, rows of other requests ride along almost free
//! (the campaign seed measured a pass of 6 rows at about the cost of 1). Each step:
//!
//! 1. every decoding request hands out the token its last pass decided (to its sink) and asks
//!    for one row: the token to feed at its own position;
//! 2. requests still evaluating their prompt add chunks of it, at most
//!    [`ServeConfig::prefill_chunk`] prompt tokens per pass in all (the oldest first), so that
//!    a long new prompt does not stall the running streams;
//! 3. one [`Model::forward_batch`] runs all those rows, each over its own slot's KV cache;
//! 4. each request decides its next token from its own row of logits.
//!
//! The pass is row-wise batch-invariant, so a request's tokens are bit-for-bit those it gets
//! alone (or from `llm-decode` with the same prompt and sampling), whatever else is in flight.
//!
//! **Prompt cache.** A slot keeps its KV cache after its request ends. A new request goes to
//! the free slot whose cached tokens share the longest prefix with its prompt (a chat's next
//! turn, a common system prompt), which evaluates only the rest
//! ([`Session::keep_prefix`]); the logits are the same as from a cold cache.
//!
//! **Admission.** `slots` requests run at once and `queue` more wait; past that,
//! [`Batcher::submit`] refuses with [`ServeError::QueueFull`] (a server answers 503). A
//! request whose sink reports its receiver gone (it returns `false`) is cancelled before the
//! next pass, and so is one past its deadline; either frees its slot at once. A panic inside a
//! pass fails the requests of that pass (their slots are reset) and the batcher goes on.
//!
//! ```
//! use std::sync::{Arc, mpsc};
//! use rknn_llm::gguf::GgufFile;
//! use rknn_llm::model::{HostF32Factory, Model};
//! use rknn_llm::sample::SamplerConfig;
//! use rknn_llm::serve::{Batcher, Event, Request, ServeConfig};
//! use rknn_llm::tokenizer::Tokenizer;
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/llm/tiny-llama.gguf");
//! let file = GgufFile::open(path)?;
//! // An ordinary pool: the batcher's thread runs inside it (see `Batcher::start`).
//! let pool = Arc::new(rayon::ThreadPoolBuilder::new().num_threads(2).build()?);
//! let model = Model::load(&file, &mut HostF32Factory::new(pool.clone()), pool, &mut |_, _| {})?;
//! let tokenizer = Arc::new(Tokenizer::from_gguf(&file)?);
//! let batcher = Batcher::start(Arc::new(model), tokenizer.clone(), ServeConfig::default())?;
//! let (tx, rx) = mpsc::channel();
//! let request = Request {
//!     prompt: tokenizer.encode("Once upon a time", true, true)?,
//!     sampling: SamplerConfig { temperature: 0.0, ..SamplerConfig::default() },
//!     max_tokens: Some(8),
//!     ..Request::default()
//! };
//! batcher.submit(request, Box::new(move |event| tx.send(event).is_ok()))?;
//! let mut text = String::new();
//! for event in rx {
//!     match event {
//!         Event::Piece(piece) => text.push_str(&piece.text),
//!         Event::Done(done) => { assert_eq!(done.completion_tokens, 8); break }
//!         Event::Failed(e) => return Err(e.into()),
//!     }
//! }
//! # Ok(()) }
//! ```

use std::collections::VecDeque;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::mpsc::{Receiver, Sender, channel};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::model::{BatchItem, CacheType, Logits, Model};
use crate::sample::SamplerConfig;
use crate::session::{
    Feed, Gen, GenerateError, GenerateParams, Piece, Session, Step, Stop, modelled,
};
use crate::tokenizer::Tokenizer;

/// How a [`Batcher`] serves.
#[derive(Clone, Debug, PartialEq)]
pub struct ServeConfig {
    /// Requests decoded together at most (llama-server's `--parallel`); each has a slot with
    /// its own KV cache. At least 1.
    pub slots: usize,
    /// Positions per slot (0: the model's context size, [`Model::n_ctx`]). A server sharing a
    /// total context among its slots, as llama-server's `-c` does, sets the total divided by
    /// `slots`.
    pub slot_ctx: usize,
    /// Requests that may wait for a slot beyond those running; more are refused
    /// ([`ServeError::QueueFull`]).
    pub queue: usize,
    /// Prompt tokens evaluated per forward pass at most, over all requests still evaluating
    /// their prompt (at least 1). Smaller keeps the running streams' inter-token latency
    /// steadier while a prompt arrives; larger gets the new request its first token sooner.
    pub prefill_chunk: usize,
    /// How each slot's cache stores keys and values.
    pub cache_type: CacheType,
}

impl Default for ServeConfig {
    fn default() -> Self {
        ServeConfig {
            slots: 4,
            slot_ctx: 0,
            queue: 64,
            prefill_chunk: 64,
            cache_type: CacheType::F32,
        }
    }
}

/// One completion to generate.
#[derive(Clone, Debug, PartialEq)]
pub struct Request {
    /// The prompt's token ids (a BOS included where the vocabulary wants one).
    pub prompt: Vec<u32>,
    /// How to sample (greedy at temperature 0).
    pub sampling: SamplerConfig,
    /// Tokens to generate at most (`None`: until end of generation or a full slot).
    pub max_tokens: Option<usize>,
    /// Text that ends the generation where it appears (left out of the output).
    pub stop: Vec<String>,
    /// Whether the request may reuse a slot's cached prefix (llama-server's `cache_prompt`;
    /// the output is the same either way).
    pub cache_prompt: bool,
    /// When the request is cancelled ([`ServeError::DeadlineExceeded`]) if still running.
    pub deadline: Option<Instant>,
}

impl Default for Request {
    fn default() -> Self {
        Request {
            prompt: Vec::new(),
            sampling: SamplerConfig::default(),
            max_tokens: None,
            stop: Vec::new(),
            cache_prompt: true,
            deadline: None,
        }
    }
}

/// What a request's sink receives: pieces, then one `Done` or one `Failed`.
#[derive(Debug)]
pub enum Event {
    /// A generated token and the text it releases (see [`Piece`]).
    Piece(Piece),
    /// The request ended normally.
    Done(Finished),
    /// The request failed; nothing follows.
    Failed(ServeError),
}

/// How a request ended.
#[derive(Clone, Debug, PartialEq)]
pub struct Finished {
    /// Why generation stopped.
    pub stop: Stop,
    /// Tokens of the prompt.
    pub prompt_tokens: usize,
    /// Of those, the ones a slot's cache already held (not evaluated again).
    pub cached_tokens: usize,
    /// Tokens generated.
    pub completion_tokens: usize,
    /// The generated text (up to a stop string, which is left out).
    pub text: String,
    /// From submission to the first token's logits (waiting for a slot included).
    pub time_to_first_token: Duration,
    /// From the first token's logits to the end.
    pub decode_time: Duration,
    /// The slot that served it.
    pub slot: usize,
}

/// Why a request was refused or failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServeError {
    /// Every slot is busy and the wait queue is full.
    #[error("all {slots} slots are busy and {queue} requests are waiting already")]
    QueueFull {
        /// Slots.
        slots: usize,
        /// The wait queue's length.
        queue: usize,
    },
    /// The prompt does not fit in a slot.
    #[error("the prompt has {tokens} tokens, more than a slot's context of {n_ctx}")]
    PromptTooLong {
        /// Prompt tokens.
        tokens: usize,
        /// Positions per slot.
        n_ctx: usize,
    },
    /// The prompt has no token.
    #[error("the prompt is empty")]
    EmptyPrompt,
    /// A prompt id outside the vocabulary.
    #[error("token id {token} is outside the vocabulary of {n_vocab}")]
    BadToken {
        /// The id.
        token: u32,
        /// Tokens in the vocabulary.
        n_vocab: usize,
    },
    /// The batcher is shutting down and takes no new request, or ended this one.
    #[error("the server is shutting down")]
    ShuttingDown,
    /// The request's deadline passed before it finished.
    #[error("the request's deadline passed")]
    DeadlineExceeded,
    /// The configuration is unusable.
    #[error("bad serving configuration: {0}")]
    Config(String),
    /// Generation failed (the forward pass or the tokenizer refused).
    #[error(transparent)]
    Generate(#[from] GenerateError),
    /// A panic inside the request's forward pass or its sink; the batcher goes on.
    #[error("internal error: {0}")]
    Internal(String),
}

/// A snapshot of what a [`Batcher`] has done ([`Batcher::metrics`]).
#[derive(Clone, Debug, Default, PartialEq)]
#[non_exhaustive]
pub struct Metrics {
    /// Slots.
    pub slots: usize,
    /// Slots serving a request now.
    pub active: usize,
    /// Requests waiting for a slot.
    pub queued: usize,
    /// Requests accepted.
    pub accepted: u64,
    /// Requests refused at submission (any [`ServeError`] from [`Batcher::submit`]).
    pub refused: u64,
    /// Requests that ended with [`Event::Done`].
    pub finished: u64,
    /// Requests cancelled (sink gone, deadline, shutdown).
    pub cancelled: u64,
    /// Requests that failed otherwise.
    pub failed: u64,
    /// Prompt tokens of accepted requests.
    pub prompt_tokens: u64,
    /// Of those, tokens reused from a slot's cache.
    pub cached_tokens: u64,
    /// Tokens generated.
    pub completion_tokens: u64,
    /// Forward passes run.
    pub passes: u64,
    /// Rows in those passes (prompt chunks and decode rows).
    pub pass_rows: u64,
    /// Decode rows in those passes (one per decoding request per pass).
    pub decode_rows: u64,
    /// Rows of the last pass.
    pub last_pass_rows: usize,
    /// Passes by rows, in buckets of at most 1, 2, 4, 8, 16, 32, 64, 128 and more rows.
    pub rows_histogram: [u64; ROWS_BUCKETS.len() + 1],
    /// Seconds spent in forward passes.
    pub busy_seconds: f64,
    /// Tokens generated per second over the last [`RATE_WINDOW`].
    pub decode_tok_s: f64,
    /// The modelled RK3588 NPU time (busiest core) of every pass so far, in seconds, when the
    /// matmuls run on the in-process emulator (its cost model, not this machine's time).
    pub modelled_npu_seconds: Option<f64>,
}

/// Upper bounds of [`Metrics::rows_histogram`]'s buckets (the last bucket has no bound).
pub const ROWS_BUCKETS: [usize; 8] = [1, 2, 4, 8, 16, 32, 64, 128];

/// The window of [`Metrics::decode_tok_s`].
pub const RATE_WINDOW: Duration = Duration::from_secs(10);

/// Where a request's events go: returns `false` once nobody listens (the request is then
/// cancelled). Called on the batcher's thread, so it must not block.
pub type Sink = Box<dyn FnMut(Event) -> bool + Send>;

/// What [`Batcher::submit`] hands the batcher's thread.
struct Job {
    request: Request,
    sink: Sink,
    submitted: Instant,
}

enum Cmd {
    Submit(Job),
    Stop,
}

/// State shared by the handle and the thread.
struct Shared {
    state: Mutex<SharedState>,
    idle: Condvar,
}

#[derive(Default)]
struct SharedState {
    metrics: Metrics,
    /// Requests accepted and not ended (running or waiting), as admission counts them: one
    /// leaves before its client hears the end, so that a client answered may at once send
    /// the next request.
    admitted: usize,
    /// The same, as [`Batcher::wait_idle`] counts them: one leaves once counted in the metrics.
    outstanding: usize,
    closed: bool,
    /// Tokens generated per recent pass, for the rate.
    recent: VecDeque<(Instant, usize)>,
}

/// Continuous batching over one model (see the module documentation). `Send` and `Sync`:
/// submit from any thread.
pub struct Batcher {
    tx: Mutex<Sender<Cmd>>,
    shared: Arc<Shared>,
    config: ServeConfig,
    model: Arc<Model>,
    tokenizer: Arc<Tokenizer>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for Batcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Batcher")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl Batcher {
    /// Starts the batcher's thread with `config.slots` empty slots over `model`.
    ///
    /// The thread waits for requests on its own and runs its passes inside the model's pool
    /// while it has work (so that each pass runs on it directly), so the pool must take work
    /// from other threads: an ordinary rayon pool, or a [`host_pool`](crate::model::host_pool)
    /// whose calling thread is not the one waiting for the batcher.
    pub fn start(
        model: Arc<Model>,
        tokenizer: Arc<Tokenizer>,
        mut config: ServeConfig,
    ) -> Result<Batcher, ServeError> {
        if config.slots == 0 {
            return Err(ServeError::Config("at least one slot is needed".into()));
        }
        if config.prefill_chunk == 0 {
            return Err(ServeError::Config(
                "the prefill chunk must be at least 1 token".into(),
            ));
        }
        if config.slot_ctx == 0 {
            config.slot_ctx = model.n_ctx();
        }
        if config.slot_ctx > model.n_ctx() {
            return Err(ServeError::Config(format!(
                "a slot of {} positions is larger than the model's context of {}",
                config.slot_ctx,
                model.n_ctx()
            )));
        }
        let mut slots = Vec::with_capacity(config.slots);
        for _ in 0..config.slots {
            let mut s = Session::new(model.clone(), tokenizer.clone(), SamplerConfig::default())?;
            s.set_cache_type(config.cache_type);
            s.set_context(config.slot_ctx);
            slots.push(Slot {
                session: s,
                job: None,
                last_used: 0,
            });
        }
        let shared = Arc::new(Shared {
            state: Mutex::new(SharedState {
                metrics: Metrics {
                    slots: config.slots,
                    ..Metrics::default()
                },
                ..SharedState::default()
            }),
            idle: Condvar::new(),
        });
        let (tx, rx) = channel();
        let mut worker = Worker {
            slots,
            queue: VecDeque::new(),
            rx,
            shared: shared.clone(),
            config: config.clone(),
            model: model.clone(),
            tokenizer: tokenizer.clone(),
            clock: 0,
            modelled_from: modelled(&model),
        };
        let pool = model.pool().clone();
        let thread = std::thread::Builder::new()
            .name("rknn-llm-batcher".into())
            .spawn(move || worker.run(&pool))
            .map_err(|e| ServeError::Config(format!("starting the batcher's thread: {e}")))?;
        Ok(Batcher {
            tx: Mutex::new(tx),
            shared,
            config,
            model,
            tokenizer,
            thread: Some(thread),
        })
    }

    /// Queues `request`; its events go to `sink`. Refused at once, with nothing sent to the
    /// sink, when the prompt cannot be served or every slot and the queue are taken.
    pub fn submit(&self, request: Request, sink: Sink) -> Result<(), ServeError> {
        let checked = self.check(&request);
        let mut st = lock(&self.shared.state);
        let refused = match checked {
            Some(e) => Some(e),
            None if st.closed => Some(ServeError::ShuttingDown),
            None if st.admitted >= self.config.slots + self.config.queue => {
                Some(ServeError::QueueFull {
                    slots: self.config.slots,
                    queue: self.config.queue,
                })
            }
            None => None,
        };
        if let Some(e) = refused {
            st.metrics.refused += 1;
            return Err(e);
        }
        let job = Job {
            request,
            sink,
            submitted: Instant::now(),
        };
        if lock(&self.tx).send(Cmd::Submit(job)).is_err() {
            st.metrics.refused += 1;
            return Err(ServeError::ShuttingDown);
        }
        st.outstanding += 1;
        st.admitted += 1;
        st.metrics.accepted += 1;
        Ok(())
    }

    fn check(&self, r: &Request) -> Option<ServeError> {
        let n_vocab = self.model.config().n_vocab;
        if r.prompt.is_empty() {
            return Some(ServeError::EmptyPrompt);
        }
        if r.prompt.len() > self.config.slot_ctx {
            return Some(ServeError::PromptTooLong {
                tokens: r.prompt.len(),
                n_ctx: self.config.slot_ctx,
            });
        }
        let bad = r.prompt.iter().find(|&&t| t as usize >= n_vocab);
        bad.map(|&token| ServeError::BadToken { token, n_vocab })
    }

    /// What it has done so far.
    pub fn metrics(&self) -> Metrics {
        let mut st = lock(&self.shared.state);
        let now = Instant::now();
        while st
            .recent
            .front()
            .is_some_and(|(t, _)| now.duration_since(*t) > RATE_WINDOW)
        {
            st.recent.pop_front();
        }
        let tokens: usize = st.recent.iter().map(|(_, n)| n).sum();
        let span = st
            .recent
            .front()
            .map_or(Duration::ZERO, |(t, _)| now.duration_since(*t));
        let mut m = st.metrics.clone();
        m.decode_tok_s = if span > Duration::from_millis(100) {
            tokens as f64 / span.as_secs_f64()
        } else {
            0.0
        };
        m
    }

    /// The configuration (with [`ServeConfig::slot_ctx`] resolved).
    pub fn config(&self) -> &ServeConfig {
        &self.config
    }

    /// The model.
    pub fn model(&self) -> &Arc<Model> {
        &self.model
    }

    /// The tokenizer.
    pub fn tokenizer(&self) -> &Arc<Tokenizer> {
        &self.tokenizer
    }

    /// Takes no new request from now on ([`ServeError::ShuttingDown`]); those accepted go on.
    pub fn close(&self) {
        lock(&self.shared.state).closed = true;
    }

    /// Waits until no request runs or waits, at most `timeout`; whether it got there.
    pub fn wait_idle(&self, timeout: Duration) -> bool {
        let st = lock(&self.shared.state);
        let (st, _) = self
            .shared
            .idle
            .wait_timeout_while(st, timeout, |st| st.outstanding > 0)
            .unwrap_or_else(|e| e.into_inner());
        st.outstanding == 0
    }
}

impl Drop for Batcher {
    /// Ends every request still running ([`ServeError::ShuttingDown`]) and joins the thread.
    fn drop(&mut self) {
        self.close();
        let _ = lock(&self.tx).send(Cmd::Stop);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A mutex's guard, also after a panic elsewhere (the state stays consistent: every update
/// is a few plain stores).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// One slot: a session (its cache kept between requests, the prompt cache) and the request
/// it serves.
struct Slot {
    session: Session,
    job: Option<Running>,
    /// When it last took a request (least recently used first among equals).
    last_used: u64,
}

/// A request in a slot.
struct Running {
    sink: Sink,
    submitted: Instant,
    params: GenerateParams,
    deadline: Option<Instant>,
    prompt_tokens: usize,
    cached_tokens: usize,
    /// The order it took its slot in (prompt chunks go to the oldest first).
    order: u64,
    phase: Phase,
    /// When the first token's logits were there.
    first_token: Option<Duration>,
}

enum Phase {
    /// Evaluating `pending` (from position `start`): `done` of them so far.
    Prefill {
        prompt: Vec<u32>,
        start: usize,
        pending: Vec<u32>,
        done: usize,
        began: Instant,
        modelled_from: Option<rknn_matmul::ModelledTime>,
    },
    Decode(Box<Gen>),
}

/// What a slot contributes to a pass.
enum Part {
    Decode(Feed),
    Prompt { from: usize, to: usize },
}

/// The batcher's thread.
struct Worker {
    slots: Vec<Slot>,
    queue: VecDeque<Job>,
    rx: Receiver<Cmd>,
    shared: Arc<Shared>,
    config: ServeConfig,
    model: Arc<Model>,
    tokenizer: Arc<Tokenizer>,
    clock: u64,
    modelled_from: Option<rknn_matmul::ModelledTime>,
}

/// How a running request ends (what [`Worker::finish`] is told).
enum End {
    Done,
    Cancelled,
    Failed(ServeError),
}

/// How it was counted.
enum Ended {
    Done,
    Cancelled,
    Failed,
}

impl Worker {
    /// Waits for work outside the model's pool, and runs it inside: a thread blocked on the
    /// channel must not hold one of the pool's workers (the pool's other users, and the
    /// passes' own parallel work, need them all).
    fn run(&mut self, pool: &rayon::ThreadPool) {
        loop {
            // Nothing to do: sleep until a command (or every handle is gone).
            match self.rx.recv() {
                Ok(Cmd::Submit(job)) => self.queue.push_back(job),
                Ok(Cmd::Stop) | Err(_) => {
                    self.stop_all();
                    return;
                }
            }
            if !pool.install(|| self.run_busy()) {
                return;
            }
        }
    }

    /// Runs passes until nothing is left to do (true) or it is told to stop (false).
    fn run_busy(&mut self) -> bool {
        loop {
            match self.rx.try_recv() {
                Ok(Cmd::Submit(job)) => {
                    self.queue.push_back(job);
                    continue; // take every waiting command before the next pass
                }
                Ok(Cmd::Stop) => {
                    self.stop_all();
                    return false;
                }
                Err(_) => {}
            }
            let busy = !self.queue.is_empty() || self.slots.iter().any(|s| s.job.is_some());
            if !busy {
                return true;
            }
            self.admit();
            self.step();
        }
    }

    /// Ends everything: running and waiting requests fail with `ShuttingDown`.
    fn stop_all(&mut self) {
        for i in 0..self.slots.len() {
            if self.slots[i].job.is_some() {
                self.finish(i, End::Failed(ServeError::ShuttingDown));
            }
        }
        while let Some(mut job) = self.queue.pop_front() {
            self.leave();
            deliver(&mut job.sink, Event::Failed(ServeError::ShuttingDown));
            self.ended(Ended::Cancelled);
        }
    }

    /// Gives waiting requests the free slots, each the one holding the longest prefix of its
    /// prompt (the least recently used among equals).
    fn admit(&mut self) {
        let now = Instant::now();
        while let Some(job) = self.queue.front() {
            if job.request.deadline.is_some_and(|d| now >= d) {
                let mut job = self.queue.pop_front().expect("the front exists");
                self.leave();
                deliver(&mut job.sink, Event::Failed(ServeError::DeadlineExceeded));
                self.ended(Ended::Cancelled);
                continue;
            }
            let prompt = &job.request.prompt;
            let use_cache = job.request.cache_prompt;
            let best = self
                .slots
                .iter()
                .enumerate()
                .filter(|(_, s)| s.job.is_none())
                .max_by_key(|(_, s)| {
                    let common = if use_cache {
                        common_prefix(s.session.history(), prompt)
                    } else {
                        0
                    };
                    (common, std::cmp::Reverse(s.last_used))
                })
                .map(|(i, _)| i);
            let Some(i) = best else { return };
            let job = self.queue.pop_front().expect("the front exists");
            self.start(i, job);
        }
    }

    /// Starts `job` in slot `i`: keeps the cached prefix and begins the prompt.
    fn start(&mut self, i: usize, job: Job) {
        self.clock += 1;
        let slot = &mut self.slots[i];
        slot.last_used = self.clock;
        let s = &mut slot.session;
        let r = job.request;
        if !r.cache_prompt {
            s.reset();
        }
        let kept = s.keep_prefix(&r.prompt);
        s.set_sampling(r.sampling.clone());
        let began = Instant::now();
        let modelled_from = modelled(&self.model);
        let rest = r.prompt[kept..].to_vec();
        let (start, pending) = match s.begin_prefill(&rest) {
            Ok(p) => p,
            Err(e) => {
                // Not reached: the prompt has a token past the kept prefix.
                let mut sink = job.sink;
                self.leave();
                deliver(&mut sink, Event::Failed(e.into()));
                self.ended(Ended::Failed);
                return;
            }
        };
        let cached = start;
        {
            let mut st = lock(&self.shared.state);
            st.metrics.prompt_tokens += r.prompt.len() as u64;
            st.metrics.cached_tokens += cached as u64;
        }
        slot.job = Some(Running {
            sink: job.sink,
            submitted: job.submitted,
            params: GenerateParams {
                max_tokens: r.max_tokens,
                stop: r.stop,
                lookup: None,
                batch: self.config.prefill_chunk,
            },
            deadline: r.deadline,
            prompt_tokens: r.prompt.len(),
            cached_tokens: cached,
            order: self.clock,
            phase: Phase::Prefill {
                prompt: rest,
                start,
                pending,
                done: 0,
                began,
                modelled_from,
            },
            first_token: None,
        });
    }

    /// One forward pass over every running request (see the module documentation).
    fn step(&mut self) {
        let now = Instant::now();
        let mut parts: Vec<Option<Part>> = (0..self.slots.len()).map(|_| None).collect();
        // 1. Decoding requests hand out their decided tokens and ask for a row (`i` indexes
        // the slots, which `finish` takes by index).
        #[allow(clippy::needless_range_loop)]
        for i in 0..self.slots.len() {
            let Some(job) = &self.slots[i].job else {
                continue;
            };
            if job.deadline.is_some_and(|d| now >= d) {
                self.finish(i, End::Failed(ServeError::DeadlineExceeded));
                continue;
            }
            if !matches!(job.phase, Phase::Decode(_)) {
                continue;
            }
            loop {
                let slot = &mut self.slots[i];
                let job = slot.job.as_mut().expect("running");
                let Phase::Decode(g) = &mut job.phase else {
                    unreachable!("decoding")
                };
                match g.step(&mut slot.session) {
                    Step::Feed(feed) => {
                        parts[i] = Some(Part::Decode(feed));
                        break;
                    }
                    Step::Item(Some(Ok(piece))) => {
                        if piece.token.is_some() {
                            // Counted before the client hears of it (and of the end).
                            count_token(&self.shared, now);
                        }
                        if !deliver(&mut job.sink, Event::Piece(piece)) {
                            self.finish(i, End::Cancelled);
                            break;
                        }
                    }
                    Step::Item(Some(Err(e))) => {
                        self.finish(i, End::Failed(e.into()));
                        break;
                    }
                    Step::Item(None) => {
                        self.finish(i, End::Done);
                        break;
                    }
                }
            }
        }
        // 2. Prompt chunks, the oldest request first, within the budget.
        let mut order: Vec<(u64, usize)> = self
            .slots
            .iter()
            .enumerate()
            .filter_map(|(i, s)| match &s.job {
                Some(j) if matches!(j.phase, Phase::Prefill { .. }) => Some((j.order, i)),
                _ => None,
            })
            .collect();
        order.sort_unstable();
        let mut budget = self.config.prefill_chunk;
        for (_, i) in order {
            if budget == 0 {
                break;
            }
            let Some(Running {
                phase: Phase::Prefill { pending, done, .. },
                ..
            }) = &self.slots[i].job
            else {
                continue;
            };
            let take = (pending.len() - done).min(budget);
            budget -= take;
            parts[i] = Some(Part::Prompt {
                from: *done,
                to: done + take,
            });
        }
        self.record_state(now);
        if parts.iter().all(Option::is_none) {
            return;
        }
        // 3. One pass.
        let t = Instant::now();
        let result = {
            let mut items: Vec<BatchItem<'_>> = Vec::new();
            for (slot, part) in self.slots.iter_mut().zip(&parts) {
                let (Some(part), Some(job)) = (part, &slot.job) else {
                    continue;
                };
                let (tokens, pos, logits) = match (part, &job.phase) {
                    (Part::Decode(f), _) => (&f.fed[..], f.pos, f.logits),
                    (Part::Prompt { from, to }, Phase::Prefill { start, pending, .. }) => {
                        let which = if *to == pending.len() {
                            Logits::Last
                        } else {
                            Logits::None
                        };
                        (&pending[*from..*to], start + from, which)
                    }
                    (Part::Prompt { .. }, Phase::Decode(_)) => unreachable!("prefilling"),
                };
                items.push(BatchItem {
                    seq: slot.session.seq_mut(),
                    tokens,
                    pos,
                    logits,
                });
            }
            let rows: usize = items.iter().map(|it| it.tokens.len()).sum();
            let decode_rows = parts
                .iter()
                .filter(|p| matches!(p, Some(Part::Decode(_))))
                .count();
            let model = &self.model;
            let r = catch_unwind(AssertUnwindSafe(|| model.forward_batch(&mut items)));
            (r, rows, decode_rows)
        };
        let (result, rows, decode_rows) = result;
        self.record_pass(t.elapsed(), rows, decode_rows);
        let failure: Option<ServeError> = match result {
            Ok(Ok(())) => None,
            Ok(Err(e)) => Some(ServeError::Generate(e.into())),
            Err(panic) => Some(ServeError::Internal(panic_message(&*panic))),
        };
        // 4. Each request takes its row.
        for (i, part) in parts.into_iter().enumerate() {
            let Some(part) = part else { continue };
            if let Some(e) = &failure {
                self.slots[i].session.reset();
                self.finish(i, End::Failed(copy_error(e)));
                continue;
            }
            let slot = &mut self.slots[i];
            let job = slot.job.as_mut().expect("running");
            let outcome: Result<(), GenerateError> = match (&part, &mut job.phase) {
                (Part::Decode(feed), Phase::Decode(g)) => g.fed(&mut slot.session, feed),
                (
                    Part::Prompt { to, .. },
                    Phase::Prefill {
                        prompt,
                        pending,
                        done,
                        began,
                        modelled_from,
                        ..
                    },
                ) => {
                    *done = *to;
                    if *done == pending.len() {
                        let p = slot.session.decide_first(
                            prompt,
                            pending.len(),
                            *began,
                            modelled_from.take(),
                        );
                        job.first_token = Some(job.submitted.elapsed());
                        let g = Gen::new(&self.tokenizer, p, &job.params, false);
                        job.phase = Phase::Decode(Box::new(g));
                    }
                    Ok(())
                }
                _ => unreachable!("a part matches its phase"),
            };
            if let Err(e) = outcome {
                self.finish(i, End::Failed(e.into()));
            }
        }
    }

    /// Ends slot `i`'s request: the sink hears why, the slot is free. Its cache stays for the
    /// prompt cache (what a cancelled request generated too: the next request's prefix match
    /// decides what of it is reused), but after a failure.
    fn finish(&mut self, i: usize, end: End) {
        let slot = &mut self.slots[i];
        let Some(mut job) = slot.job.take() else {
            return;
        };
        self.leave();
        let slot = &mut self.slots[i];
        let summary = match &mut job.phase {
            Phase::Decode(g) => {
                g.cancel(&mut slot.session, Stop::MaxTokens);
                Some(g.summary())
            }
            Phase::Prefill { .. } => None,
        };
        let counted = match end {
            End::Done => {
                let out = summary.expect("done after decoding");
                let done = Finished {
                    stop: out.stop.unwrap_or(Stop::MaxTokens),
                    prompt_tokens: job.prompt_tokens,
                    cached_tokens: job.cached_tokens,
                    completion_tokens: out.generated.len(),
                    text: out.text.clone(),
                    time_to_first_token: job.first_token.unwrap_or_default(),
                    decode_time: out.decode_time,
                    slot: i,
                };
                if deliver(&mut job.sink, Event::Done(done)) {
                    Ended::Done
                } else {
                    Ended::Cancelled
                }
            }
            End::Cancelled => Ended::Cancelled,
            End::Failed(e) => {
                let cancelled =
                    matches!(e, ServeError::DeadlineExceeded | ServeError::ShuttingDown);
                deliver(&mut job.sink, Event::Failed(e));
                if cancelled {
                    Ended::Cancelled
                } else {
                    slot.session.reset();
                    Ended::Failed
                }
            }
        };
        self.ended(counted);
    }

    /// A request leaves admission's count, before its client hears how it ended.
    fn leave(&self) {
        let mut st = lock(&self.shared.state);
        st.admitted = st.admitted.saturating_sub(1);
    }

    /// Counts an ended request and wakes [`Batcher::wait_idle`].
    fn ended(&self, end: Ended) {
        let mut st = lock(&self.shared.state);
        st.outstanding = st.outstanding.saturating_sub(1);
        match end {
            Ended::Done => st.metrics.finished += 1,
            Ended::Cancelled => st.metrics.cancelled += 1,
            Ended::Failed => st.metrics.failed += 1,
        }
        if st.outstanding == 0 {
            self.shared.idle.notify_all();
        }
        st.metrics.active = self.slots.iter().filter(|s| s.job.is_some()).count();
        st.metrics.queued = self.queue.len();
    }

    /// The slots' and the queue's state, and the rate window moved on to `now`.
    fn record_state(&self, now: Instant) {
        let mut st = lock(&self.shared.state);
        while st
            .recent
            .front()
            .is_some_and(|(t, _)| now.duration_since(*t) > RATE_WINDOW)
        {
            st.recent.pop_front();
        }
        st.metrics.active = self.slots.iter().filter(|s| s.job.is_some()).count();
        st.metrics.queued = self.queue.len();
    }

    fn record_pass(&self, took: Duration, rows: usize, decode_rows: usize) {
        let modelled = modelled(&self.model)
            .zip(self.modelled_from.as_ref())
            .map(|(now, from)| now.since(from).busiest_core().as_secs_f64());
        let mut st = lock(&self.shared.state);
        let m = &mut st.metrics;
        m.passes += 1;
        m.pass_rows += rows as u64;
        m.decode_rows += decode_rows as u64;
        m.last_pass_rows = rows;
        let bucket = ROWS_BUCKETS
            .iter()
            .position(|&b| rows <= b)
            .unwrap_or(ROWS_BUCKETS.len());
        m.rows_histogram[bucket] += 1;
        m.busy_seconds += took.as_secs_f64();
        m.modelled_npu_seconds = modelled;
    }
}

/// Counts a generated token (and its step, `now`, for the rate).
fn count_token(shared: &Shared, now: Instant) {
    let mut st = lock(&shared.state);
    st.metrics.completion_tokens += 1;
    match st.recent.back_mut() {
        Some((t, n)) if *t == now => *n += 1,
        _ => st.recent.push_back((now, 1)),
    }
}

/// Hands `event` to `sink`: whether somebody still listens (a panicking sink does not).
fn deliver(sink: &mut Sink, event: Event) -> bool {
    catch_unwind(AssertUnwindSafe(|| sink(event))).unwrap_or(false)
}

/// The same error again, for each request of a failed pass.
fn copy_error(e: &ServeError) -> ServeError {
    ServeError::Internal(e.to_string())
}

/// A panic's message.
fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic in the forward pass".into())
}

/// The length of the longest common prefix.
fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}
