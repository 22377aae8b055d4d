//! One operation's adaptive limits as `/metrics` shows them, summed over destinations and
//! never labelled by one: the lowest limit (the most slowed destination), the calls in flight
//! under all of them, and their decreases.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::telemetry;

/// The gauges of one operation (`set_up`, `stream_creation`, `publication`).
#[derive(Debug)]
pub(super) struct OperationGauges {
    pub(super) operation: &'static str,
    /// Each destination's current limit, by its limiter's id.
    limits: Mutex<HashMap<u64, usize>>,
    next_id: AtomicU64,
}

impl OperationGauges {
    pub(super) fn new(operation: &'static str) -> Self {
        Self { operation, limits: Mutex::default(), next_id: AtomicU64::new(0) }
    }

    fn lock(&self) -> parking_lot::MutexGuard<'_, HashMap<u64, usize>> {
        self.limits.lock()
    }

    /// An id for a new limiter.
    pub(super) fn next_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// Shows `limit` (where no destination has one yet: the limit each starts at).
    pub(super) fn show_limit(&self, limit: usize) {
        telemetry::concurrency_limit(self.operation, limit);
    }

    /// Limiter `id`'s limit is now `limit`: the gauge shows the lowest.
    pub(super) fn limit_changed(&self, id: u64, limit: usize) {
        let mut limits = self.lock();
        limits.insert(id, limit);
        if let Some(&lowest) = limits.values().min() {
            self.show_limit(lowest);
        }
    }

    /// Limiter `id` was forgotten (idle).
    pub(super) fn limiter_gone(&self, id: u64) {
        let mut limits = self.lock();
        limits.remove(&id);
        if let Some(&lowest) = limits.values().min() {
            self.show_limit(lowest);
        }
    }

    /// A call entered a place under one of the limits.
    pub(super) fn entered(&self) {
        telemetry::concurrency_place(self.operation, true);
    }

    /// A call left its place.
    pub(super) fn left(&self) {
        telemetry::concurrency_place(self.operation, false);
    }

    /// One of the limits decreased for `reason` (`refusal`, `latency`).
    pub(super) fn decreased(&self, reason: &'static str) {
        telemetry::concurrency_decreased(self.operation, reason);
    }
}
