//! The handle, [`Batcher`]: it starts the batcher's thread, admits requests (or refuses them
//! at once), reports the metrics, and closes; the thread itself is in `worker.rs`.

use std::sync::mpsc::{Sender, channel};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::model::Model;
use crate::tokenizer::Tokenizer;

use super::shared::{Cmd, Job, Shared, lock};
use super::types::{Metrics, Request, ServeConfig, ServeError, Sink};
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
        let shared = Arc::new(Shared::new(config.slots));
        let (tx, rx) = channel();
        let worker = Worker::new(&model, &tokenizer, &config, shared.clone(), rx)?;
        let thread = worker.spawn()?;
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
