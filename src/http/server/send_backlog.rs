//! What one connection's answers hold unsent, and how fast they leave: the pure accounting
//! behind two of a connection's limits ([`super::activity::Activity`] asks it, under its lock).
//!
//! - **Unsent bytes.** An answer counts from the moment its handler produced it (its body's
//!   size hint: a rendered answer waits in its body before HTTP/2 even asks for it) until its
//!   bytes reach the socket: for HTTP/2 the DATA payload written (`http2_frames`), for HTTP/1
//!   every byte written, and nothing once hyper has flushed (it holds no more). A connection
//!   that already holds [`SendLimits::max_unsent_bytes`] may not start another answer: it is
//!   closed, so one connection holds at most that plus one answer.
//! - **Rate.** While anything is unsent or a write waits for the socket (the backlog), the
//!   connection owes, in every window of [`SendLimits::window`], the smaller of
//!   `min_rate_bytes_per_sec x window` and what was unsent when the window opened (at least
//!   one byte); a window that ends owing closes the connection. Unlike a deadline reset by
//!   any progress, a peer taking a byte now and then (a `WINDOW_UPDATE` of 1 per stream, a
//!   receive buffer opened a crack) does not keep its answers and its connection.
//!
//! An HTTP/2 stream reset by the peer drops what hyper had buffered for it: an answer dropped
//! before its end takes its handed-over bytes off the count (at most all of them). One the peer
//! resets after it was handed over whole stays counted, so such a connection closes a window
//! later than it would have idle: the peer's own cost.

use std::time::Duration;

use tokio::time::Instant;

/// How much a connection may hold unsent and how fast it must send it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SendLimits {
    pub(crate) max_unsent_bytes: u64,
    pub(crate) min_rate_bytes_per_sec: u64,
    pub(crate) window: Duration,
}

/// Why a connection's sending ends it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum SendVerdict {
    /// An answer started while the connection held its whole allowance unsent.
    UnsentBytes,
    /// A window ended with less sent than it owed.
    SendRate,
}

/// One window of the rate rule.
#[derive(Debug, Clone, Copy)]
struct Window {
    opened: Instant,
    sent_at_open: u64,
    owed_bytes: u64,
}

/// One connection's unsent answers and the window they are judged in.
#[derive(Debug, Clone, Copy)]
pub(super) struct SendBacklog {
    limits: SendLimits,
    /// Answers' bytes not handed to hyper yet (what their size hints announced).
    unhanded_bytes: u64,
    /// Bytes handed to hyper and not yet written.
    handed_unwritten_bytes: u64,
    /// Every byte counted as sent (HTTP/2: DATA payload; HTTP/1: all written).
    sent_bytes: u64,
    /// Since when a write waits for the socket to take bytes, if one does.
    write_blocked_since: Option<Instant>,
    /// An answer started over the allowance.
    over_allowance: bool,
    window: Option<Window>,
}

impl SendBacklog {
    pub(super) fn new(limits: SendLimits) -> Self {
        Self {
            limits,
            unhanded_bytes: 0,
            handed_unwritten_bytes: 0,
            sent_bytes: 0,
            write_blocked_since: None,
            over_allowance: false,
            window: None,
        }
    }

    /// Bytes the connection's answers hold and the socket has not taken.
    pub(super) fn unsent_bytes(&self) -> u64 {
        self.unhanded_bytes + self.handed_unwritten_bytes
    }

    /// Nothing unsent and no write waiting.
    pub(super) fn is_empty(&self) -> bool {
        self.unsent_bytes() == 0 && self.write_blocked_since.is_none()
    }

    /// A handler produced an answer whose body announces `announced_bytes` (at least).
    pub(super) fn answer_started(&mut self, announced_bytes: u64, now: Instant) {
        if self.unsent_bytes() >= self.limits.max_unsent_bytes {
            self.over_allowance = true;
        }
        self.unhanded_bytes += announced_bytes;
        self.refresh(now);
    }

    /// hyper took `bytes` of an answer's body, `announced_bytes` of them counted when it started.
    pub(super) fn handed_over(&mut self, bytes: u64, announced_bytes: u64, now: Instant) {
        self.unhanded_bytes = self.unhanded_bytes.saturating_sub(announced_bytes);
        self.handed_unwritten_bytes += bytes;
        self.refresh(now);
    }

    /// An answer's body was dropped: `unhanded_bytes` of what it announced never went out, and
    /// if it ended early (`handed_bytes` given to a stream then reset), neither did those.
    pub(super) fn answer_dropped(&mut self, unhanded_bytes: u64, discarded_bytes: u64, now: Instant) {
        self.unhanded_bytes = self.unhanded_bytes.saturating_sub(unhanded_bytes);
        self.handed_unwritten_bytes = self.handed_unwritten_bytes.saturating_sub(discarded_bytes);
        self.refresh(now);
    }

    /// The socket took `bytes` of the answers.
    pub(super) fn written(&mut self, bytes: u64, now: Instant) {
        self.handed_unwritten_bytes = self.handed_unwritten_bytes.saturating_sub(bytes);
        self.sent_bytes += bytes;
        self.refresh(now);
    }

    /// HTTP/1: hyper flushed whatever it held.
    pub(super) fn flushed(&mut self, now: Instant) {
        self.handed_unwritten_bytes = 0;
        self.refresh(now);
    }

    /// A write waits for the socket (`true`) or went through (`false`).
    pub(super) fn write_blocked(&mut self, blocked: bool, now: Instant) {
        match (blocked, self.write_blocked_since) {
            (true, None) => self.write_blocked_since = Some(now),
            (false, Some(_)) => self.write_blocked_since = None,
            _ => {}
        }
        self.refresh(now);
    }

    /// Opens a window when a backlog appears, closes it when the backlog is gone.
    fn refresh(&mut self, now: Instant) {
        match (self.is_empty(), self.window) {
            (false, None) => self.window = Some(self.open_window(now)),
            (true, Some(_)) => self.window = None,
            _ => {}
        }
    }

    fn open_window(&self, now: Instant) -> Window {
        let at_rate = self.limits.min_rate_bytes_per_sec.saturating_mul(self.limits.window.as_secs().max(1));
        Window { opened: now, sent_at_open: self.sent_bytes, owed_bytes: at_rate.min(self.unsent_bytes().max(1)) }
    }

    /// When the sending must be judged next, and whether it has already failed.
    pub(super) fn deadline(&self, now: Instant) -> Option<Instant> {
        if self.over_allowance {
            return Some(now);
        }
        self.window.map(|window| window.opened + self.limits.window)
    }

    /// The verdict at `now`: a window that ended having sent what it owed opens the next.
    pub(super) fn judge(&mut self, now: Instant) -> Option<SendVerdict> {
        if self.over_allowance {
            return Some(SendVerdict::UnsentBytes);
        }
        let window = self.window?;
        if now < window.opened + self.limits.window {
            return None;
        }
        if self.sent_bytes - window.sent_at_open < window.owed_bytes {
            return Some(SendVerdict::SendRate);
        }
        self.window = Some(self.open_window(now));
        None
    }
}

#[cfg(test)]
#[path = "send_backlog_tests.rs"]
mod tests;
