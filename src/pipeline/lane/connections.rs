//! The gateway's AppendRows connections as lanes share them: at most `max_append_connections`
//! open, an idle one kept for minutes as BigQuery advises, and given back at once when another
//! lane waits for a place. The appender (`super::appender`) takes and gives back places.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::Semaphore;
use tokio::time::Instant;

/// How often a lane waiting for a place under `max_append_connections` asks an idle lane again
/// to give its place back (the idle lane it asked may have become busy meanwhile).
const ASK_AGAIN: Duration = Duration::from_secs(1);

/// The gateway's AppendRows connections: at most `max_append_connections` open, each kept
/// while idle for `idle_lifetime` (BigQuery advises connections that live for minutes: short
/// ones inflate its connection quota's use), unless a lane waits for a place, which an idle
/// one then gives back. Cheap to clone (clones share the places).
#[derive(Debug, Clone)]
pub(crate) struct AppendConnections {
    pub(super) places: Arc<Semaphore>,
    /// Lanes waiting for a place ask idle ones to give theirs back.
    pub(super) wanted: Arc<tokio::sync::Notify>,
    /// How many lanes wait for a place: an idle lane woken by a request nobody still makes
    /// (a stored notification) keeps its connection.
    waiting_lanes: Arc<AtomicUsize>,
    pub(crate) idle_lifetime: Duration,
}

/// A lane's request for a place while every place is taken: it counts as waiting and asks an
/// idle lane to give its place back, again every [`ASK_AGAIN`] while it waits.
#[derive(Debug, Default)]
pub(super) struct PlaceRequest {
    asked: Option<Instant>,
    counted: Option<WaitingForAPlace>,
}

impl PlaceRequest {
    /// Brings the request up to date with whether the lane `waits`; when it waits, the instant
    /// to ask again.
    pub(super) fn update(&mut self, connections: &AppendConnections, waits: bool) -> Option<Instant> {
        if !waits {
            *self = Self::default();
            return None;
        }
        self.counted.get_or_insert_with(|| connections.wait_for_a_place());
        if self.asked.is_none_or(|asked| asked.elapsed() >= ASK_AGAIN) {
            connections.ask_for_a_place();
            self.asked = Some(Instant::now());
        }
        self.asked.map(|asked| asked + ASK_AGAIN)
    }
}

/// A lane waiting for a place, counted until dropped.
#[derive(Debug)]
struct WaitingForAPlace(Arc<AtomicUsize>);

impl Drop for WaitingForAPlace {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl AppendConnections {
    pub(crate) fn new(max_append_connections: usize, idle_lifetime: Duration) -> Self {
        Self {
            places: Arc::new(Semaphore::new(max_append_connections)),
            wanted: Arc::default(),
            waiting_lanes: Arc::default(),
            idle_lifetime,
        }
    }

    /// Counts the calling lane as waiting for a place until the guard is dropped.
    fn wait_for_a_place(&self) -> WaitingForAPlace {
        self.waiting_lanes.fetch_add(1, Ordering::SeqCst);
        WaitingForAPlace(Arc::clone(&self.waiting_lanes))
    }

    /// Whether a lane waits for a place now (every place taken, someone counted waiting).
    pub(super) fn someone_waits(&self) -> bool {
        self.exhausted() && self.waiting_lanes.load(Ordering::SeqCst) > 0
    }

    /// Whether every place is taken (a lane needing one waits).
    pub(super) fn exhausted(&self) -> bool {
        self.places.available_permits() == 0
    }

    /// Asks one idle lane to give its place back.
    fn ask_for_a_place(&self) {
        self.wanted.notify_one();
    }
}
