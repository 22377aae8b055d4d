//! What one connection is doing, as far as its limits care: the protocol hyper serves it with
//! (as its requests show: hyper-util's auto builder reads the preface however it arrives),
//! requests open, a request head started, responses pending and whether hyper asks for their
//! bodies, and what its answers hold unsent ([`SendBacklog`]). [`super::serve_connection`]
//! sleeps until the deadline this gives and closes the connection once it has passed; the
//! accept loop asks whether it is idle (the longest idle is closed when every connection is
//! taken and another waits).

use parking_lot::Mutex;

use tokio::sync::Notify;
use tokio::time::Instant;

use super::ConnectionLimits;
use super::send_backlog::{SendBacklog, SendVerdict};
use crate::http::http2_frames::DataFrameCounter;

/// Why the gateway closes a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CloseReason {
    /// No request open and none started for the idle timeout.
    IdleTimeout,
    /// A request head (or, on a connection with no request yet, its first) not complete in time.
    HeaderTimeout,
    /// Answers left slower than the minimum rate over a window, or hyper stopped asking for one.
    SendRate,
    /// An answer started while the connection held its allowance of unsent bytes.
    UnsentBytes,
    /// Idle while every connection was taken and another waited.
    IdleAtCapacity,
    /// The server stops.
    Shutdown,
}

impl CloseReason {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::IdleTimeout => "idle_timeout",
            Self::HeaderTimeout => "header_timeout",
            Self::SendRate => "send_rate",
            Self::UnsentBytes => "unsent_bytes",
            Self::IdleAtCapacity => "idle_at_capacity",
            Self::Shutdown => "shutdown",
        }
    }

    /// A connection closed for what it holds is dropped at once, without a grace period.
    pub(super) fn is_abrupt(self) -> bool {
        matches!(self, Self::SendRate | Self::UnsentBytes)
    }
}

/// The protocol hyper serves the connection with, once a request showed it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Protocol {
    Unknown,
    Http1,
    Http2,
}

/// What one connection is doing, as far as its limits care.
#[derive(Debug)]
pub(super) struct Activity {
    limits: ConnectionLimits,
    state: Mutex<ActivityState>,
    /// Woken when requests open or close, a request head starts, an answer starts or a write
    /// blocks, and when the accept loop asks the connection to close.
    pub(super) changed: Notify,
}

#[derive(Debug, Clone, Copy)]
struct ActivityState {
    protocol: Protocol,
    open_requests: usize,
    /// Since when no request is open (or since the connection was accepted).
    waiting_since: Instant,
    /// When the first byte after that arrived: a request head has started (HTTP/1, or a
    /// connection whose first request has not come yet).
    head_started: Option<Instant>,
    /// Responses produced whose bodies hyper has not finished taking.
    responses_pending: usize,
    /// The last time hyper asked a pending response's body for data.
    response_progress: Instant,
    sending: SendBacklog,
    /// The accept loop asked the connection to close.
    close_requested: Option<CloseReason>,
}

impl Activity {
    pub(super) fn new(limits: ConnectionLimits) -> Self {
        let now = Instant::now();
        let state = ActivityState {
            protocol: Protocol::Unknown,
            open_requests: 0,
            waiting_since: now,
            head_started: None,
            responses_pending: 0,
            response_progress: now,
            sending: SendBacklog::new(limits.sending),
            close_requested: None,
        };
        Self { limits, state: Mutex::new(state), changed: Notify::new() }
    }

    fn lock(&self) -> parking_lot::MutexGuard<'_, ActivityState> {
        self.state.lock()
    }

    /// Runs `change` under the lock, then wakes the connection's supervisor.
    fn change(&self, change: impl FnOnce(&mut ActivityState)) {
        change(&mut self.lock());
        self.changed.notify_one();
    }

    /// Bytes arrived: with no request open on a connection not known to be HTTP/2 (whose
    /// frames between requests are pings and window updates), a request head has started.
    pub(super) fn read(&self) {
        let mut state = self.lock();
        if state.open_requests == 0 && state.head_started.is_none() && state.protocol != Protocol::Http2 {
            state.head_started = Some(Instant::now());
            drop(state);
            self.changed.notify_one();
        }
    }

    /// hyper passed on a request of `version`: the protocol is known from the first.
    pub(super) fn request_opened(&self, version: axum::http::Version) {
        self.change(|state| {
            if state.protocol == Protocol::Unknown {
                let http2 = version == axum::http::Version::HTTP_2;
                state.protocol = if http2 { Protocol::Http2 } else { Protocol::Http1 };
            }
            state.open_requests += 1;
            state.head_started = None;
        });
    }

    pub(super) fn request_closed(&self) {
        self.change(|state| {
            state.open_requests = state.open_requests.saturating_sub(1);
            if state.open_requests == 0 {
                state.waiting_since = Instant::now();
                state.head_started = None;
            }
        });
    }

    /// A handler produced an answer whose body announces `announced_bytes` (at least).
    pub(super) fn response_started(&self, announced_bytes: u64) {
        self.change(|state| {
            state.responses_pending += 1;
            state.response_progress = Instant::now();
            state.sending.answer_started(announced_bytes, Instant::now());
        });
    }

    /// hyper asked a pending response's body for data.
    pub(super) fn response_progressed(&self) {
        self.lock().response_progress = Instant::now();
    }

    /// hyper took `bytes` of a body's data, `announced_bytes` of them counted when it started
    /// (bytes no size hint announced may open a send window: the supervisor is woken for them).
    pub(super) fn body_handed_over(&self, bytes: u64, announced_bytes: u64) {
        self.lock().sending.handed_over(bytes, announced_bytes, Instant::now());
        if bytes > announced_bytes {
            self.changed.notify_one();
        }
    }

    /// hyper dropped a response's body (see [`SendBacklog::answer_dropped`]).
    pub(super) fn response_ended(&self, unhanded_bytes: u64, discarded_bytes: u64) {
        let mut state = self.lock();
        state.responses_pending = state.responses_pending.saturating_sub(1);
        state.response_progress = Instant::now();
        state.sending.answer_dropped(unhanded_bytes, discarded_bytes, Instant::now());
    }

    /// The socket took `written`: the answers' bytes among it (HTTP/2: the DATA payload, read
    /// from the frames by `frames`, which sees every byte until the connection shows HTTP/1).
    pub(super) fn written(&self, written: &[u8], frames: &mut DataFrameCounter) {
        let mut state = self.lock();
        let bytes = match state.protocol {
            Protocol::Http1 => written.len() as u64,
            Protocol::Unknown | Protocol::Http2 => frames.data_bytes(written),
        };
        if bytes > 0 {
            state.sending.written(bytes, Instant::now());
        }
    }

    /// hyper flushed what it held: HTTP/1 holds nothing more of its answers.
    pub(super) fn flushed(&self) {
        let mut state = self.lock();
        if state.protocol == Protocol::Http1 {
            state.sending.flushed(Instant::now());
        }
    }

    /// A write to the socket waits (`true`: it is full) or went through (`false`).
    pub(super) fn write_blocked(&self, blocked: bool) {
        let mut state = self.lock();
        let newly = blocked && state.sending.is_empty();
        state.sending.write_blocked(blocked, Instant::now());
        drop(state);
        if newly {
            self.changed.notify_one();
        }
    }

    /// Since when the connection is idle (no request open or started, nothing unsent), if it is.
    pub(super) fn idle_since(&self) -> Option<Instant> {
        let state = self.lock();
        let idle = state.open_requests == 0
            && state.head_started.is_none()
            && state.sending.is_empty()
            && state.close_requested.is_none();
        idle.then_some(state.waiting_since)
    }

    /// The accept loop needs the connection's place.
    pub(super) fn request_close(&self, reason: CloseReason) {
        self.change(|state| state.close_requested = Some(reason));
    }

    /// When the connection closes unless something happens first, and why, for every limit but
    /// the send window's (judged by [`SendBacklog`]); `None` while a request is open and its
    /// response (if any) is asked for.
    fn deadline_and_reason(&self, state: &ActivityState, now: Instant) -> Option<(Instant, CloseReason)> {
        if let Some(reason) = state.close_requested {
            return Some((now, reason));
        }
        let limits = &self.limits;
        if state.open_requests > 0 {
            let not_asked = state.response_progress + limits.sending.window;
            return (state.responses_pending > 0).then_some((not_asked, CloseReason::SendRate));
        }
        Some(match state.head_started {
            Some(started) => (started + limits.header_read_timeout, CloseReason::HeaderTimeout),
            None => (state.waiting_since + limits.idle_timeout, CloseReason::IdleTimeout),
        })
    }

    /// When the connection must be looked at again unless something happens first.
    pub(super) fn deadline(&self) -> Option<Instant> {
        let now = Instant::now();
        let state = *self.lock();
        let other = self.deadline_and_reason(&state, now).map(|(deadline, _)| deadline);
        [other, state.sending.deadline(now)].into_iter().flatten().min()
    }

    /// Why the connection must close now, if it must (a send window that ended having sent
    /// what it owed opens the next).
    pub(super) fn expired(&self) -> Option<CloseReason> {
        let now = Instant::now();
        let mut state = self.lock();
        match state.sending.judge(now) {
            Some(SendVerdict::UnsentBytes) => return Some(CloseReason::UnsentBytes),
            Some(SendVerdict::SendRate) => return Some(CloseReason::SendRate),
            None => {}
        }
        let (deadline, reason) = self.deadline_and_reason(&state, now)?;
        (now >= deadline).then_some(reason)
    }
}

#[cfg(test)]
#[path = "activity_tests.rs"]
mod tests;
