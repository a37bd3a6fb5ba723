//! What the handle ([`Batcher`](super::Batcher)) and its thread share: the commands the handle
//! sends ([`Cmd`]), and the state both read and write under one mutex ([`Shared`]): the
//! metrics, the admission count, whether it is closed.

use std::collections::VecDeque;
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::types::{EmbedReply, Metrics, RATE_WINDOW, Request, Sink};
use crate::model::Embedder;

/// What [`Batcher::submit`](super::Batcher::submit) hands the batcher's thread.
pub(super) struct Job {
    pub(super) request: Request,
    pub(super) sink: Sink,
    pub(super) submitted: Instant,
}

/// What [`Batcher::embed`](super::Batcher::embed) hands the batcher's thread.
pub(super) struct EmbedJob {
    pub(super) embedder: Embedder,
    pub(super) reply: EmbedReply,
    pub(super) deadline: Option<Instant>,
}

/// What the handle tells its thread.
pub(super) enum Cmd {
    /// A request accepted by admission.
    Submit(Job),
    /// An embeddings request accepted by admission.
    Embed(EmbedJob),
    /// End every request and return (the handle is dropped).
    Stop,
}

/// State shared by the handle and the thread.
pub(super) struct Shared {
    pub(super) state: Mutex<SharedState>,
    /// Notified when no request is left ([`SharedState::outstanding`] reaches 0).
    pub(super) idle: Condvar,
}

impl Shared {
    /// A batcher of `slots` slots that has done nothing yet.
    pub(super) fn new(slots: usize) -> Shared {
        Shared {
            state: Mutex::new(SharedState {
                metrics: Metrics {
                    slots,
                    ..Metrics::default()
                },
                ..SharedState::default()
            }),
            idle: Condvar::new(),
        }
    }

    /// The state, also after a panic elsewhere (it stays consistent: every update is a few
    /// plain stores).
    pub(super) fn lock(&self) -> MutexGuard<'_, SharedState> {
        lock(&self.state)
    }
}

#[derive(Default)]
pub(super) struct SharedState {
    pub(super) metrics: Metrics,
    /// Requests accepted and not ended (running or waiting), as admission counts them: one
    /// leaves before its client hears the end, so that a client answered may at once send
    /// the next request.
    pub(super) admitted: usize,
    /// The same, as [`Batcher::wait_idle`](super::Batcher::wait_idle) counts them: one leaves
    /// once counted in the metrics.
    pub(super) outstanding: usize,
    /// No new request is taken.
    pub(super) closed: bool,
    /// Tokens generated per recent pass, for the rate.
    pub(super) recent: VecDeque<(Instant, usize)>,
}

impl SharedState {
    /// Forgets the passes older than [`RATE_WINDOW`] at `now`.
    pub(super) fn slide_window(&mut self, now: Instant) {
        while self
            .recent
            .front()
            .is_some_and(|(t, _)| now.duration_since(*t) > RATE_WINDOW)
        {
            self.recent.pop_front();
        }
    }

    /// Tokens per second over the window at `now` (0 over less than 100 ms).
    pub(super) fn decode_rate(&mut self, now: Instant) -> f64 {
        self.slide_window(now);
        let tokens: usize = self.recent.iter().map(|(_, n)| n).sum();
        let span = self
            .recent
            .front()
            .map_or(Duration::ZERO, |(t, _)| now.duration_since(*t));
        if span > Duration::from_millis(100) {
            tokens as f64 / span.as_secs_f64()
        } else {
            0.0
        }
    }

    /// Counts a generated token (and its step, `now`, for the rate).
    pub(super) fn count_token(&mut self, now: Instant) {
        self.metrics.completion_tokens += 1;
        match self.recent.back_mut() {
            Some((t, n)) if *t == now => *n += 1,
            _ => self.recent.push_back((now, 1)),
        }
    }
}

/// A mutex's guard, also after a panic elsewhere.
pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A panic's message.
pub(super) fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".into())
}
