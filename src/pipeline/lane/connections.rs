//! The gateway's AppendRows connections as lanes share them: at most `max_append_connections`
//! open, an idle one kept for minutes as BigQuery advises, and given back at once when another
//! lane waits for a place. The appender (`super::appender`) takes and gives back places.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Semaphore;

/// How often a lane waiting for a place under `max_append_connections` asks an idle lane again
/// to give its place back (the idle lane it asked may have become busy meanwhile).
pub(super) const ASK_AGAIN: Duration = Duration::from_secs(1);

/// The gateway's AppendRows connections: at most `max_append_connections` open, each kept
/// while idle for `idle_lifetime` (BigQuery advises connections that live for minutes: short
/// ones inflate its connection quota's use), unless a lane waits for a place, which an idle
/// one then gives back. Cheap to clone (clones share the places).
#[derive(Debug, Clone)]
pub(crate) struct AppendConnections {
    pub(super) places: Arc<Semaphore>,
    /// Lanes waiting for a place ask idle ones to give theirs back.
    pub(super) wanted: Arc<tokio::sync::Notify>,
    pub(crate) idle_lifetime: Duration,
}

impl AppendConnections {
    pub(crate) fn new(max_append_connections: usize, idle_lifetime: Duration) -> Self {
        Self { places: Arc::new(Semaphore::new(max_append_connections)), wanted: Arc::default(), idle_lifetime }
    }

    /// Whether every place is taken (a lane needing one waits).
    pub(super) fn exhausted(&self) -> bool {
        self.places.available_permits() == 0
    }

    /// Asks one idle lane to give its place back.
    pub(super) fn ask_for_a_place(&self) {
        self.wanted.notify_one();
    }
}
