//! The batcher's thread: its slots and wait queue, the loop that takes commands, ends the
//! requests nobody waits for, gives waiting ones free slots and steps, and the step itself,
//! phase by phase as the [module documentation](super) numbers them.

use std::collections::VecDeque;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

use crate::model::{BatchItem, EMBED_PASS_ROWS, Logits, Model};
use crate::sample::SamplerConfig;
use crate::session::{
    Feed, GenerateError, GenerateParams, GenerationState, Session, Step, Stop, common_prefix,
    modelled,
};
use crate::tokenizer::Tokenizer;

use super::shared::{Cmd, EmbedJob, Job, Shared, panic_message};
use super::types::{EmbedReply, Event, Finished, ROWS_BUCKETS, ServeConfig, ServeError, Sink};

/// How many more prompt tokens a prefilling slot must be about to hold than any cache holds
/// now for a waiting request to wait for that prefill and copy them ([`Session::keep_prefix_from`])
/// rather than start now and evaluate them itself.
const SHARE_MIN: usize = 16;

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
    Decode(Box<GenerationState>),
}

/// What a slot contributes to a pass.
enum Part {
    Decode(Feed),
    Prompt { from: usize, to: usize },
}

/// Per slot, its part of the next pass (if any).
type Parts = Vec<Option<Part>>;

/// The batcher's thread.
pub(super) struct Worker {
    slots: Vec<Slot>,
    queue: VecDeque<Job>,
    /// Embeddings requests, the front one running (a pass of it after each step).
    embeds: VecDeque<EmbedJob>,
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
    /// The thread's state: `config.slots` empty slots over `model` (`config` checked and
    /// resolved), commands from `rx`.
    pub(super) fn new(
        model: &Arc<Model>,
        tokenizer: &Arc<Tokenizer>,
        config: &ServeConfig,
        shared: Arc<Shared>,
        rx: Receiver<Cmd>,
    ) -> Result<Worker, ServeError> {
        let mut slots = Vec::with_capacity(config.slots);
        for _ in 0..config.slots {
            let mut s = Session::new(model.clone(), tokenizer.clone(), SamplerConfig::default())?;
            s.set_cache_type(config.cache_type);
            s.set_context(config.slot_ctx);
            s.set_draft(config.draft.clone());
            slots.push(Slot {
                session: s,
                job: None,
                last_used: 0,
            });
        }
        Ok(Worker {
            slots,
            queue: VecDeque::new(),
            embeds: VecDeque::new(),
            rx,
            shared,
            config: config.clone(),
            model: model.clone(),
            tokenizer: tokenizer.clone(),
            clock: 0,
            modelled_from: modelled(model),
        })
    }

    /// Serves on this thread (the batcher's) until told to stop or every handle is gone.
    /// It waits for work outside the model's pool and runs it inside: a thread blocked on
    /// the channel must not hold one of the pool's workers (the pool's other users, and the
    /// passes' own parallel work, need them all). When this thread drives the pool (its
    /// member 0: a model loaded here by `ModelBuilder::serve`) each pass runs on it directly.
    pub(super) fn run(mut self) {
        let pool = self.model.pool().clone();
        loop {
            // Nothing to do: sleep until a command (or every handle is gone).
            match self.rx.recv() {
                Ok(Cmd::Submit(job)) => self.queue.push_back(job),
                Ok(Cmd::Embed(job)) => self.embeds.push_back(job),
                Ok(Cmd::Stop) | Err(_) => {
                    self.stop_all();
                    return;
                }
            }
            if !pool.run(|| self.run_busy()) {
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
                Ok(Cmd::Embed(job)) => {
                    self.embeds.push_back(job);
                    continue;
                }
                Ok(Cmd::Stop) => {
                    self.stop_all();
                    return false;
                }
                Err(_) => {}
            }
            let busy = !self.queue.is_empty()
                || !self.embeds.is_empty()
                || self.slots.iter().any(|s| s.job.is_some());
            if !busy {
                return true;
            }
            let now = Instant::now();
            self.end_abandoned(now);
            self.admit();
            self.record_state(now);
            self.step();
            self.embed_pass(Instant::now());
        }
    }

    /// One forward pass of the front embeddings request (after the step, so that running
    /// streams wait for at most one bounded pass of it): at most
    /// [`ServeConfig::prefill_chunk`] rows while any slot serves a request,
    /// [`EMBED_PASS_ROWS`] otherwise. A request past its deadline fails instead, one whose
    /// reply says nobody listens is cancelled; one whose inputs have all run hears its
    /// vectors.
    fn embed_pass(&mut self, now: Instant) {
        let Some(job) = self.embeds.front_mut() else {
            return;
        };
        if job.deadline.is_some_and(|d| now >= d) {
            let job = self.embeds.pop_front().expect("the front exists");
            self.end_embed(job.reply, Err(ServeError::DeadlineExceeded));
            return;
        }
        let listening = catch_unwind(AssertUnwindSafe(|| job.reply.is_listening()));
        if !listening.unwrap_or(false) {
            self.embeds.pop_front();
            self.leave();
            self.ended(Ended::Cancelled);
            return;
        }
        let rows = if self.slots.iter().any(|s| s.job.is_some()) {
            self.config.prefill_chunk
        } else {
            EMBED_PASS_ROWS
        };
        let t = Instant::now();
        let model = &self.model;
        let before = job.embedder.tokens_run();
        let result = catch_unwind(AssertUnwindSafe(|| job.embedder.pass(model, rows)));
        let ran = job.embedder.tokens_run() - before;
        self.record_pass(t.elapsed(), ran, 0);
        let outcome = match result {
            Ok(Ok(false)) => return,
            Ok(Ok(true)) => Ok(()),
            Ok(Err(e)) => Err(ServeError::Embedding(e)),
            Err(panic) => Err(ServeError::Internal(panic_message(&*panic))),
        };
        let job = self.embeds.pop_front().expect("the front exists");
        let answer = outcome.map(|()| job.embedder.finish());
        self.end_embed(job.reply, answer);
    }

    /// Ends an embeddings request: it leaves admission's count, then its reply hears
    /// `answer`.
    fn end_embed(&mut self, reply: EmbedReply, answer: Result<Vec<Vec<f32>>, ServeError>) {
        self.leave();
        let counted = match &answer {
            Ok(_) => Ended::Done,
            Err(ServeError::DeadlineExceeded | ServeError::ShuttingDown) => Ended::Cancelled,
            Err(_) => Ended::Failed,
        };
        // A panicking reply is the caller's: the request has ended either way.
        let _ = catch_unwind(AssertUnwindSafe(|| reply.answer(answer)));
        self.ended(counted);
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
        while let Some(job) = self.embeds.pop_front() {
            self.end_embed(job.reply, Err(ServeError::ShuttingDown));
        }
    }

    /// Ends, before the next pass, the requests nobody waits for any more, each freeing its
    /// place at once (its slot or its place in the queue, and admission's count): those past
    /// their deadline (their sinks hear [`ServeError::DeadlineExceeded`]), and those waiting or
    /// evaluating their prompt whose sink says nobody listens ([`EventSink::is_listening`]:
    /// they have no event to tell, so this is the only way to notice before their first
    /// token). A decoding request's sink is asked by its next piece.
    ///
    /// [`EventSink::is_listening`]: super::EventSink::is_listening
    fn end_abandoned(&mut self, now: Instant) {
        for i in 0..self.slots.len() {
            let Some(job) = &mut self.slots[i].job else {
                continue;
            };
            if job.deadline.is_some_and(|d| now >= d) {
                self.finish(i, End::Failed(ServeError::DeadlineExceeded));
            } else if matches!(job.phase, Phase::Prefill { .. }) && !listening(&mut job.sink) {
                self.finish(i, End::Cancelled);
            }
        }
        let mut waiting = VecDeque::with_capacity(self.queue.len());
        let (mut expired, mut gone) = (Vec::new(), 0);
        for mut job in self.queue.drain(..) {
            if job.request.deadline.is_some_and(|d| now >= d) {
                expired.push(job);
            } else if listening(&mut job.sink) {
                waiting.push_back(job);
            } else {
                gone += 1;
            }
        }
        self.queue = waiting;
        for mut job in expired {
            self.leave();
            deliver(&mut job.sink, Event::Failed(ServeError::DeadlineExceeded));
            self.ended(Ended::Cancelled);
        }
        for _ in 0..gone {
            self.leave();
            self.ended(Ended::Cancelled);
        }
    }

    /// Gives waiting requests the free slots, each the one holding the longest prefix of its
    /// prompt (the least recently used among equals), in the order they came; a request
    /// whose prompt a prefilling slot is about to hold more of ([`SHARE_MIN`] tokens more
    /// than any cache holds now: `n` choices of one prompt, a burst sharing a system prompt)
    /// waits for that prefill, and the ones behind it go first meanwhile.
    fn admit(&mut self) {
        let mut k = 0;
        while k < self.queue.len() {
            let prompt = &self.queue[k].request.prompt;
            let use_cache = self.queue[k].request.cache_prompt;
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
            if use_cache && self.coming(prompt) >= self.held(prompt, None).1 + SHARE_MIN {
                k += 1;
                continue;
            }
            let job = self.queue.remove(k).expect("in the queue");
            self.start(i, job);
        }
    }

    /// The slot (other than `except`) whose cache holds the longest prefix of `prompt`, and
    /// its length (at most all but the prompt's last token).
    fn held(&self, prompt: &[u32], except: Option<usize>) -> (Option<usize>, usize) {
        let limit = prompt.len().saturating_sub(1);
        self.slots
            .iter()
            .enumerate()
            .filter(|&(j, _)| Some(j) != except)
            .map(|(j, s)| {
                let cached = s.session.sequence().len();
                (
                    Some(j),
                    common_prefix(s.session.history(), prompt).min(cached),
                )
            })
            .max_by_key(|&(_, n)| n)
            .map_or((None, 0), |(j, n)| (j, n.min(limit)))
    }

    /// The longest prefix of `prompt` a slot still evaluating its own prompt will hold once
    /// it has.
    fn coming(&self, prompt: &[u32]) -> usize {
        let limit = prompt.len().saturating_sub(1);
        self.slots
            .iter()
            .filter(|s| {
                matches!(
                    s.job,
                    Some(Running {
                        phase: Phase::Prefill { .. },
                        ..
                    })
                )
            })
            .map(|s| common_prefix(s.session.history(), prompt).min(limit))
            .max()
            .unwrap_or(0)
    }

    /// Starts `job` in slot `i`: keeps the cached prefix and begins the prompt.
    fn start(&mut self, i: usize, job: Job) {
        self.clock += 1;
        let r = job.request;
        // The longest prefix held: this slot's own, or another slot's copied.
        let other = match self.held(&r.prompt, Some(i)) {
            (Some(j), n) if r.cache_prompt => {
                Some(j).filter(|_| n > common_prefix(self.slots[i].session.history(), &r.prompt))
            }
            _ => None,
        };
        let slot = &mut self.slots[i];
        slot.last_used = self.clock;
        if !r.cache_prompt {
            slot.session.reset();
        }
        let kept = match other {
            Some(j) => {
                let (to, from) = two_slots(&mut self.slots, i, j);
                to.session.keep_prefix_from(&from.session, &r.prompt)
            }
            None => slot.session.keep_prefix(&r.prompt),
        };
        let slot = &mut self.slots[i];
        let s = &mut slot.session;
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
            let mut st = self.shared.lock();
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
                #[cfg(feature = "constraint")]
                constraint: r.constraint,
                logprobs: r.logprobs,
                preserve: r.preserve,
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

    /// One forward pass over every running request, in the four steps of the module
    /// documentation.
    fn step(&mut self) {
        let now = Instant::now();
        let mut parts = self.decode_rows(now);
        self.prompt_chunks(&mut parts);
        if parts.iter().all(Option::is_none) {
            return;
        }
        let failure = self.forward(&parts);
        self.decide(parts, failure);
    }

    /// Step 1: each decoding request hands out the token its last pass decided, and asks for
    /// a row (its part): the token to feed at its own position. A request that ends here (its
    /// sink gone, a stop, its limit) has no part.
    fn decode_rows(&mut self, now: Instant) -> Parts {
        let mut parts: Parts = (0..self.slots.len()).map(|_| None).collect();
        // `i` indexes the slots, which `finish` takes by index.
        #[allow(clippy::needless_range_loop)]
        for i in 0..self.slots.len() {
            let Some(job) = &self.slots[i].job else {
                continue;
            };
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
                            self.shared.lock().count_token(now);
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
        parts
    }

    /// Step 2: requests still evaluating their prompt add chunks of it, the oldest request
    /// first, [`ServeConfig::prefill_chunk`] tokens in all at most.
    fn prompt_chunks(&self, parts: &mut Parts) {
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
    }

    /// Step 3: one [`Model::forward_batch`] over every part, each over its own slot's cache;
    /// why it failed (an error, or a panic), if it did.
    fn forward(&mut self, parts: &[Option<Part>]) -> Option<ServeError> {
        let t = Instant::now();
        let mut items: Vec<BatchItem<'_>> = Vec::new();
        for (slot, part) in self.slots.iter_mut().zip(parts) {
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
        let result = catch_unwind(AssertUnwindSafe(|| model.forward_batch(&mut items)));
        drop(items);
        self.record_pass(t.elapsed(), rows, decode_rows);
        match result {
            Ok(Ok(())) => None,
            Ok(Err(e)) => Some(ServeError::Generate(e.into())),
            Err(panic) => Some(ServeError::Internal(panic_message(&*panic))),
        }
    }

    /// Step 4: each request takes its row of logits: a decoding one decides its next token
    /// with its own sampler, one whose prompt is all evaluated decides its first. After a
    /// failed pass (`failure`), each request of the pass fails and its slot is reset.
    fn decide(&mut self, parts: Parts, failure: Option<ServeError>) {
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
                            &job.params,
                        );
                        job.first_token = Some(job.submitted.elapsed());
                        p.map(|p| {
                            let g = GenerationState::new(&self.tokenizer, p, &job.params, false);
                            job.phase = Phase::Decode(Box::new(g));
                        })
                    } else {
                        Ok(())
                    }
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
        if let Some(out) = summary {
            let mut st = self.shared.lock();
            st.metrics.draft_tokens += out.spec.model_drafted as u64;
            st.metrics.draft_accepted += out.spec.model_accepted as u64;
        }
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
        let mut st = self.shared.lock();
        st.admitted = st.admitted.saturating_sub(1);
    }

    /// Counts an ended request and wakes [`Batcher::wait_idle`](super::Batcher::wait_idle).
    fn ended(&self, end: Ended) {
        let mut st = self.shared.lock();
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

    /// The slots' and the queue's state after admission (every end updates them too), and the
    /// rate window moved on to `now`.
    fn record_state(&self, now: Instant) {
        let mut st = self.shared.lock();
        st.slide_window(now);
        st.metrics.active = self.slots.iter().filter(|s| s.job.is_some()).count();
        st.metrics.queued = self.queue.len();
    }

    /// Counts a pass of `rows` rows (`decode_rows` of them decode rows) that took `took`.
    fn record_pass(&self, took: Duration, rows: usize, decode_rows: usize) {
        let modelled = modelled(&self.model)
            .zip(self.modelled_from.as_ref())
            .map(|(now, from)| now.since(from).busiest_core().as_secs_f64());
        let mut st = self.shared.lock();
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

/// Slot `i` to change and slot `j` to read (`i != j`).
fn two_slots(slots: &mut [Slot], i: usize, j: usize) -> (&mut Slot, &Slot) {
    if i < j {
        let (a, b) = slots.split_at_mut(j);
        (&mut a[i], &b[0])
    } else {
        let (a, b) = slots.split_at_mut(i);
        (&mut b[0], &a[j])
    }
}

/// Hands `event` to `sink`: whether somebody still listens (a panicking sink does not).
fn deliver(sink: &mut Sink, event: Event) -> bool {
    catch_unwind(AssertUnwindSafe(|| sink.send(event))).unwrap_or(false)
}

/// Whether `sink` says somebody still listens (a panicking sink does not).
fn listening(sink: &mut Sink) -> bool {
    catch_unwind(AssertUnwindSafe(|| sink.is_listening())).unwrap_or(false)
}

/// The same error again, for each request of a failed pass.
fn copy_error(e: &ServeError) -> ServeError {
    ServeError::Internal(e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::GgufFile;
    use crate::model::HostF32Factory;
    use crate::serve::EventSink;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::mpsc::channel;

    /// A worker over the tiny llama model, on no thread (its methods are called directly).
    fn worker(slots: usize) -> Worker {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/llm/tiny-llama.gguf"
        );
        let file = GgufFile::open(path).unwrap();
        let pool = Arc::new(
            rayon::ThreadPoolBuilder::new()
                .num_threads(1)
                .build()
                .unwrap(),
        );
        let mut factory = HostF32Factory::new(pool.clone());
        let model = Arc::new(Model::load(&file, &mut factory, pool, &mut |_, _| {}).unwrap());
        let tokenizer = Arc::new(Tokenizer::from_gguf(&file).unwrap());
        let config = ServeConfig {
            slots,
            slot_ctx: 64,
            ..ServeConfig::default()
        };
        let shared = Arc::new(Shared::new(slots));
        let (_tx, rx) = channel();
        Worker::new(&model, &tokenizer, &config, shared, rx).unwrap()
    }

    /// A sink that says whether it listens as `listening` says (panicking on `None`) and
    /// counts the events it is sent.
    struct Probe {
        listening: Option<bool>,
        sent: Arc<AtomicUsize>,
    }

    impl EventSink for Probe {
        fn send(&mut self, _: Event) -> bool {
            self.sent.fetch_add(1, Ordering::SeqCst);
            true
        }
        fn is_listening(&mut self) -> bool {
            self.listening.expect("a probe that panics")
        }
    }

    /// Queues a job of `prompt` (as `Batcher::submit` would have admitted it).
    fn queue(w: &mut Worker, prompt: Vec<u32>, sink: Sink, deadline: Option<Instant>) {
        let request = super::super::Request {
            prompt,
            deadline,
            ..Default::default()
        };
        {
            let mut st = w.shared.lock();
            st.admitted += 1;
            st.outstanding += 1;
        }
        w.queue.push_back(Job {
            request,
            sink,
            submitted: Instant::now(),
        });
    }

    #[test]
    fn waiting_requests_nobody_waits_for_leave_before_the_pass() {
        let mut w = worker(1);
        let sent: Vec<Arc<AtomicUsize>> = (0..6).map(|_| Arc::default()).collect();
        let probe = |i: usize, listening: Option<bool>| -> Sink {
            Box::new(Probe {
                listening,
                sent: sent[i].clone(),
            })
        };
        let past = Some(Instant::now());
        queue(&mut w, vec![1, 2], probe(0, Some(true)), None);
        queue(&mut w, vec![1, 3], probe(1, Some(false)), None);
        queue(&mut w, vec![1, 4], probe(2, None), None);
        queue(&mut w, vec![1, 5], probe(3, Some(true)), past);
        queue(&mut w, vec![1, 6], probe(4, Some(true)), None);
        // A plain closure cannot be asked: it stays.
        let closure_sent = sent[5].clone();
        queue(
            &mut w,
            vec![1, 7],
            Box::new(move |_| {
                closure_sent.fetch_add(1, Ordering::SeqCst);
                true
            }),
            None,
        );
        w.end_abandoned(Instant::now());
        let left: Vec<u32> = w.queue.iter().map(|j| j.request.prompt[1]).collect();
        assert_eq!(left, [2, 6, 7], "the listening ones, in their order");
        let events: Vec<usize> = sent.iter().map(|s| s.load(Ordering::SeqCst)).collect();
        // Only the expired one hears why (DeadlineExceeded); the gone ones hear nothing.
        assert_eq!(events, [0, 0, 0, 1, 0, 0]);
        let st = w.shared.lock();
        assert_eq!((st.admitted, st.outstanding), (3, 3));
        assert_eq!((st.metrics.cancelled, st.metrics.queued), (3, 3));
    }

    #[test]
    fn a_prefilling_request_nobody_listens_to_frees_its_slot() {
        let mut w = worker(2);
        let sent: Vec<Arc<AtomicUsize>> = (0..2).map(|_| Arc::default()).collect();
        for (i, s) in sent.iter().enumerate() {
            let sink = Box::new(Probe {
                listening: Some(true),
                sent: s.clone(),
            });
            queue(&mut w, vec![1, 2 + i as u32, 3, 4], sink, None);
        }
        w.admit();
        assert!(w.slots.iter().all(|s| s.job.is_some()));
        // The second stops listening before its prompt is evaluated.
        if let Some(job) = &mut w.slots[1].job {
            job.sink = Box::new(Probe {
                listening: Some(false),
                sent: sent[1].clone(),
            });
        }
        w.end_abandoned(Instant::now());
        assert!(w.slots[0].job.is_some() && w.slots[1].job.is_none());
        assert_eq!(sent[1].load(Ordering::SeqCst), 0, "told nothing");
        let st = w.shared.lock();
        assert_eq!(
            (st.admitted, st.metrics.active, st.metrics.cancelled),
            (1, 1, 1)
        );
    }
}
