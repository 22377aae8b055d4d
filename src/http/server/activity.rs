//! What one connection is doing, as far as its limits care: requests open, a request head
//! started, responses pending and their progress, writes the socket does not take, and
//! HTTP/2 DATA handed over but not written. [`super::serve_connection`] sleeps until the
//! deadline this gives and closes the connection when it has passed.

use std::sync::{Mutex, PoisonError};

use tokio::sync::Notify;
use tokio::time::Instant;

use super::ConnectionLimits;

/// What one connection is doing, as far as its limits care.
#[derive(Debug)]
pub(super) struct Activity {
    state: Mutex<ActivityState>,
    /// Woken when requests open or close and when a request head starts.
    pub(super) changed: Notify,
}

#[derive(Debug, Clone, Copy)]
struct ActivityState {
    open_requests: usize,
    /// Since when no request is open (or since the connection was accepted).
    waiting_since: Instant,
    /// When the first byte after that arrived: a request head has started (HTTP/1).
    head_started: Option<Instant>,
    /// The connection speaks HTTP/2 (its reads without an open stream are frames such as
    /// pings, not a request head).
    http2: bool,
    /// The connection has read nothing yet.
    fresh: bool,
    /// Responses produced whose bodies are not sent yet.
    responses_pending: usize,
    /// The last progress of a pending response: its body read for sending (or produced).
    response_progress: Instant,
    /// Since when a write waits for the socket to take bytes (it is full: the peer reads
    /// nothing), if one does.
    write_blocked_since: Option<Instant>,
    /// HTTP/2: response body bytes handed over for sending, and those written in DATA frames;
    /// while the first exceed the second, the last time DATA reached the socket.
    body_bytes_handed_over: u64,
    data_bytes_written: u64,
    data_progress: Instant,
}

/// The client preface's first bytes (RFC 9113, section 3.4).
const HTTP2_PREFACE_START: &[u8] = b"PRI *";

impl Activity {
    pub(super) fn new() -> Self {
        let state = ActivityState {
            open_requests: 0,
            waiting_since: Instant::now(),
            head_started: None,
            http2: false,
            fresh: true,
            responses_pending: 0,
            response_progress: Instant::now(),
            write_blocked_since: None,
            body_bytes_handed_over: 0,
            data_bytes_written: 0,
            data_progress: Instant::now(),
        };
        Self { state: Mutex::new(state), changed: Notify::new() }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, ActivityState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Bytes arrived: with no request open, an HTTP/1 request head has started.
    pub(super) fn read(&self, bytes: &[u8]) {
        let mut state = self.lock();
        if state.fresh {
            state.fresh = false;
            state.http2 = bytes.starts_with(HTTP2_PREFACE_START);
        }
        if state.open_requests == 0 && state.head_started.is_none() && !state.http2 {
            state.head_started = Some(Instant::now());
            drop(state);
            self.changed.notify_one();
        }
    }

    pub(super) fn request_opened(&self) {
        let mut state = self.lock();
        state.open_requests += 1;
        state.head_started = None;
        drop(state);
        self.changed.notify_one();
    }

    pub(super) fn request_closed(&self) {
        let mut state = self.lock();
        state.open_requests = state.open_requests.saturating_sub(1);
        if state.open_requests == 0 {
            state.waiting_since = Instant::now();
            state.head_started = None;
        }
        drop(state);
        self.changed.notify_one();
    }

    /// A response was produced: its body is to be sent from now.
    pub(super) fn response_started(&self) {
        let mut state = self.lock();
        state.responses_pending += 1;
        state.response_progress = Instant::now();
        drop(state);
        self.changed.notify_one();
    }

    /// A pending response's body was read for sending (or ended).
    pub(super) fn response_progressed(&self) {
        self.lock().response_progress = Instant::now();
    }

    /// A response body's data frame was handed over for sending.
    pub(super) fn body_handed_over(&self, bytes: u64) {
        let mut state = self.lock();
        if state.body_bytes_handed_over == state.data_bytes_written {
            state.data_progress = Instant::now();
        }
        state.body_bytes_handed_over += bytes;
        drop(state);
        self.changed.notify_one();
    }

    /// HTTP/2 DATA payload reached the socket.
    pub(super) fn data_written(&self, bytes: u64) {
        let mut state = self.lock();
        state.data_bytes_written += bytes;
        state.data_progress = Instant::now();
    }

    pub(super) fn is_http2(&self) -> bool {
        self.lock().http2
    }

    pub(super) fn response_ended(&self) {
        let mut state = self.lock();
        state.responses_pending = state.responses_pending.saturating_sub(1);
        state.response_progress = Instant::now();
    }

    /// A write to the socket waits (`true`: it is full) or went through (`false`).
    pub(super) fn write_blocked(&self, blocked: bool) {
        let mut state = self.lock();
        match (blocked, state.write_blocked_since) {
            (true, None) => {
                state.write_blocked_since = Some(Instant::now());
                drop(state);
                self.changed.notify_one();
            }
            (false, Some(_)) => state.write_blocked_since = None,
            _ => {}
        }
    }

    /// When the connection times out unless something happens first, and why; `None` while a
    /// request is open and its response (if any) makes progress.
    pub(super) fn deadline_and_reason(&self, limits: &ConnectionLimits) -> Option<(Instant, &'static str)> {
        let state = *self.lock();
        let waiting = if state.open_requests > 0 {
            (state.responses_pending > 0).then(|| (state.response_progress + limits.write_timeout, "write_timeout"))
        } else {
            Some(match state.head_started {
                Some(started) => (started + limits.header_read_timeout, "header_timeout"),
                None => (state.waiting_since + limits.idle_timeout, "idle_timeout"),
            })
        };
        let blocked = state.write_blocked_since.map(|since| (since + limits.write_timeout, "write_timeout"));
        // HTTP/2 takes a whole body into its buffers: what the peer's window holds back shows
        // as data handed over and not written.
        let unsent = (state.http2 && state.body_bytes_handed_over > state.data_bytes_written)
            .then(|| (state.data_progress + limits.write_timeout, "write_timeout"));
        [waiting, blocked, unsent].into_iter().flatten().min_by_key(|(deadline, _)| *deadline)
    }

    /// When the connection times out unless something happens first.
    pub(super) fn deadline(&self, limits: &ConnectionLimits) -> Option<Instant> {
        self.deadline_and_reason(limits).map(|(deadline, _)| deadline)
    }

    /// Why the connection must close now, if it must.
    pub(super) fn expired(&self, limits: &ConnectionLimits) -> Option<&'static str> {
        let (deadline, reason) = self.deadline_and_reason(limits)?;
        (Instant::now() >= deadline).then_some(reason)
    }
}

#[cfg(test)]
#[path = "activity_tests.rs"]
mod tests;
