//! The handle, [`Batcher`]: it starts the batcher's thread, admits requests (or refuses them
//! at once), reports the metrics, and closes; the thread itself is in `worker.rs`.

use std::sync::mpsc::{Sender, channel, sync_channel};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::model::{Model, ModelError, Pooling};
use crate::tokenizer::Tokenizer;

use super::shared::{Cmd, EmbedJob, Job, Shared, lock, panic_message};
use super::types::{EmbedReply, Metrics, Request, ServeConfig, ServeError, Sink};
use super::worker::Worker;

/// Continuous batching over one model (see the [module documentation](super)). `Send` and
/// `Sync`: submit from any thread.
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

/// What the batcher's thread hands back once it has its model and slots.
type Started<T> = (Arc<Model>, Arc<Tokenizer>, ServeConfig, Arc<Shared>, T);

impl Batcher {
    /// Starts the batcher's thread with `config.slots` empty slots over `model`.
    ///
    /// The thread waits for requests on its own and runs its passes inside the model's pool
    /// while it has work. Any pool serves; the fastest is one the batcher's thread drives (its
    /// member 0), so that each pass runs on it directly:
    /// [`ModelBuilder::serve`](crate::ModelBuilder::serve) loads the model on the batcher's
    /// thread for that. Over a [`host_pool`](crate::model::host_pool) another thread drives,
    /// the passes run on the pool's other threads (or, with one thread in all, on the
    /// batcher's own).
    pub fn start(
        model: Arc<Model>,
        tokenizer: Arc<Tokenizer>,
        config: ServeConfig,
    ) -> Result<Batcher, ServeError> {
        Batcher::start_with(move || Ok((model, tokenizer, config, ()))).map(|(b, ())| b)
    }

    /// Starts the batcher's thread, which first calls `make` for its model, tokenizer and
    /// configuration (and anything else the caller wants back, `T`): a model loaded there has
    /// the batcher's thread as its host pool's member 0 ([`ModelBuilder::serve`]). Returns
    /// once the thread serves, or with `make`'s error, or the configuration's.
    ///
    /// [`ModelBuilder::serve`]: crate::ModelBuilder::serve
    pub(crate) fn start_with<T, E>(
        make: impl FnOnce() -> Result<(Arc<Model>, Arc<Tokenizer>, ServeConfig, T), E> + Send + 'static,
    ) -> Result<(Batcher, T), E>
    where
        T: Send + 'static,
        E: From<ServeError> + Send + 'static,
    {
        let (tx, rx) = channel();
        let (ready_tx, ready_rx) = sync_channel::<Result<Started<T>, E>>(1);
        let thread = std::thread::Builder::new()
            .name("rknn-llm-batcher".into())
            .spawn(move || {
                let made = make().and_then(|(model, tokenizer, config, extra)| {
                    let config = resolve(config, &model)?;
                    let shared = Arc::new(Shared::new(config.slots));
                    let worker = Worker::new(&model, &tokenizer, &config, shared.clone(), rx)?;
                    Ok((worker, (model, tokenizer, config, shared, extra)))
                });
                match made {
                    Ok((worker, started)) => {
                        if ready_tx.send(Ok(started)).is_ok() {
                            worker.run();
                        }
                    }
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                    }
                }
            })
            .map_err(|e| ServeError::Config(format!("starting the batcher's thread: {e}")))?;
        match ready_rx.recv() {
            Ok(Ok((model, tokenizer, config, shared, extra))) => {
                let batcher = Batcher {
                    tx: Mutex::new(tx),
                    shared,
                    config,
                    model,
                    tokenizer,
                    thread: Some(thread),
                };
                Ok((batcher, extra))
            }
            Ok(Err(e)) => {
                let _ = thread.join();
                Err(e)
            }
            // The thread ended without a word: `make` panicked.
            Err(_) => {
                let why = match thread.join() {
                    Err(p) => panic_message(&*p),
                    Ok(()) => "it ended".into(),
                };
                Err(ServeError::Internal(format!("starting the batcher: {why}")).into())
            }
        }
    }

    /// Queues `request`; its events go to `sink`. Refused at once, with nothing sent to the
    /// sink, when the prompt cannot be served or every slot and the queue are taken.
    pub fn submit(&self, request: Request, sink: Sink) -> Result<(), ServeError> {
        let checked = self.check(&request);
        let mut st = self.shared.lock();
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

    /// Queues an embeddings request: each of `inputs` (token ids) pooled by `pooling` and
    /// L2-normalised, as [`Model::embed`] computes them; `reply` hears the vectors, or why
    /// the request failed, once. The batcher runs its passes between its decode passes, each
    /// input a sequence of its own (not a slot): at most [`ServeConfig::prefill_chunk`] rows
    /// per pass while requests decode, [`EMBED_PASS_ROWS`] otherwise. Its vectors are those
    /// [`Model::embed`] gives, bit for bit, whatever else runs. It counts against the slots
    /// and the queue as a request does.
    ///
    /// Refused at once, with `reply` not called, when an input is empty, longer than a
    /// slot's context ([`ServeConfig::slot_ctx`]) or holds a token outside the vocabulary
    /// ([`ServeError::Embedding`], naming the input), or when the queue is full.
    ///
    /// [`EMBED_PASS_ROWS`]: crate::model::EMBED_PASS_ROWS
    pub fn embed(
        &self,
        inputs: Vec<Vec<u32>>,
        pooling: Pooling,
        deadline: Option<Instant>,
        reply: EmbedReply,
    ) -> Result<(), ServeError> {
        let checked = match inputs.iter().position(|t| t.len() > self.config.slot_ctx) {
            Some(index) => Err(ServeError::Embedding(ModelError::EmbeddingInput {
                index,
                reason: format!(
                    "{} tokens exceed a slot's context of {}",
                    inputs[index].len(),
                    self.config.slot_ctx
                ),
            })),
            None => self
                .model
                .embedder(inputs, pooling)
                .map_err(ServeError::Embedding),
        };
        let mut st = self.shared.lock();
        let refused = match &checked {
            Err(_) => None,
            Ok(_) if st.closed => Some(ServeError::ShuttingDown),
            Ok(_) if st.admitted >= self.config.slots + self.config.queue => {
                Some(ServeError::QueueFull {
                    slots: self.config.slots,
                    queue: self.config.queue,
                })
            }
            Ok(_) => None,
        };
        let embedder = match (checked, refused) {
            (Err(e), _) | (Ok(_), Some(e)) => {
                st.metrics.refused += 1;
                return Err(e);
            }
            (Ok(e), None) => e,
        };
        let job = EmbedJob {
            embedder,
            reply,
            deadline,
        };
        if lock(&self.tx).send(Cmd::Embed(job)).is_err() {
            st.metrics.refused += 1;
            return Err(ServeError::ShuttingDown);
        }
        st.outstanding += 1;
        st.admitted += 1;
        st.metrics.accepted += 1;
        Ok(())
    }

    /// Why `r` cannot be served by any slot, if it cannot.
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
        let mut st = self.shared.lock();
        let rate = st.decode_rate(Instant::now());
        let mut m = st.metrics.clone();
        m.decode_tok_s = rate;
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
        self.shared.lock().closed = true;
    }

    /// Waits until no request runs or waits, at most `timeout`; whether it got there.
    pub fn wait_idle(&self, timeout: Duration) -> bool {
        let st = self.shared.lock();
        let (st, _) = self
            .shared
            .idle
            .wait_timeout_while(st, timeout, |st| st.outstanding > 0)
            .unwrap_or_else(|e| e.into_inner());
        st.outstanding == 0
    }
}

/// `config` checked against `model`, its slot context resolved.
fn resolve(mut config: ServeConfig, model: &Model) -> Result<ServeConfig, ServeError> {
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
    Ok(config)
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
