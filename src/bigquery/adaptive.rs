//! Adaptive concurrency of calls to BigQuery's control plane (set-up of tables and streams,
//! publication jobs), in the manner of Vector's adaptive request concurrency: AIMD on observed
//! latency and refusals, within an operator-set maximum.
//!
//! - **Refusals.** The limiter learns from the classified result of the call it limits
//!   ([`super::retry::Classified`]), as Vector's controller does: a call that ends in BigQuery's
//!   pushback (429, `rateLimitExceeded`, `quotaExceeded`, gRPC `RESOURCE_EXHAUSTED`, a job
//!   failed `jobRateLimitExceeded`) shrinks the limit to [`REFUSAL_DECREASE`] of itself at
//!   once, at most once per round trip (only calls started after the last decrease count, as
//!   TCP counts one loss per window). Callers therefore retry pushback outside the limited
//!   call, one attempt per call (`bigquery::retry`).
//! - **Latency.** Each round trip (a window as long as the average call), the window's mean
//!   latency is compared with the long-term average: above [`LATENCY_GROWTH`] times it (BigQuery
//!   queued the calls: DML waiting behind a table's two, queries beyond the project's
//!   concurrency) the limit shrinks by [`LATENCY_DECREASE`]; otherwise, if the limit was reached
//!   during the window and no call in it was that slow, it grows: doubling until the first
//!   decrease (slow start), then by one.
//! - **Bounds.** The limit stays within 1 and the maximum (`FILAMENT_MAX_CONCURRENT_SET_UPS`,
//!   `FILAMENT_MAX_CONCURRENT_PUBLICATIONS`), and starts at [`INITIAL_LIMIT`] (the fixed value
//!   it replaced), except where BigQuery documents the concurrency it allows
//!   ([`AdaptiveConcurrency::starting_at`]: publications start at its 100 concurrent queries).
//! - **Per destination.** What BigQuery refuses or queues is one project's (its concurrent
//!   queries, its stream creations): [`AdaptiveLimits`] keeps one limit per project and
//!   location (`super::per_destination`), so a project that lowered its quota slows only the
//!   calls into it. Callers waiting for a place take turns by tenant (`super::fair`).
//!
//! The limit and its decreases are in `/metrics`: `filament_bigquery_concurrency_limit` (the
//! lowest limit among the destinations), `filament_bigquery_concurrency_in_flight` (calls under
//! every destination's limit) and `filament_bigquery_concurrency_decreases_total` (by
//! `operation` and `reason`), never by project. A refusal only slows calls down: retrying is
//! the caller's budget (`bigquery::retry`).

mod gauges;

use parking_lot::Mutex;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::fair::{FairQueue, Tenant};
use super::per_destination::{PerDestination, ProjectLocation};
use super::retry::{Classified, RetryClass};
use gauges::OperationGauges;

/// Where the limit starts.
pub(crate) const INITIAL_LIMIT: usize = 8;
/// BigQuery's concurrent interactive queries per project (its documented quota): where the
/// publication limit starts.
pub(crate) const BIGQUERY_CONCURRENT_QUERIES: usize = 100;
/// A window whose mean latency exceeds the long-term mean this many times shrinks the limit.
pub(crate) const LATENCY_GROWTH: f64 = 2.0;
/// The factor of a decrease on latency growth (Vector's default decrease ratio).
pub(crate) const LATENCY_DECREASE: f64 = 0.9;
/// The factor of a decrease on a refusal: gentler than TCP's half, since BigQuery's limits are
/// rates (of stream creations, of queries) that a slightly lower concurrency already meets.
pub(crate) const REFUSAL_DECREASE: f64 = 0.75;
/// Weight of a new window in the long-term mean latency.
const EWMA_WEIGHT: f64 = 0.3;
/// The shortest window (calls answered faster are counted over this long).
const MIN_WINDOW: Duration = Duration::from_millis(50);
/// A window older than this many window lengths when a call ends is stale (a quiet spell).
const STALE_WINDOWS: u32 = 4;

/// One operation's adaptive limit. Cheap to clone (clones share the limit).
#[derive(Debug, Clone)]
pub(crate) struct AdaptiveConcurrency {
    limiter: Arc<Limiter>,
}

#[derive(Debug)]
struct Limiter {
    /// `set_up`, `stream_creation`, `publication`: the metrics' `operation` label.
    operation: &'static str,
    /// Its key among the operation's limits in the gauges.
    id: u64,
    /// The project and location it limits calls into (named in its log lines, never in
    /// `/metrics`); none for a limit of its own.
    destination: Option<ProjectLocation>,
    /// The operation's gauges, which every destination's limit reports to.
    gauges: Arc<OperationGauges>,
    /// Whose turn it is to wait for the next place.
    turns: FairQueue,
    maximum: usize,
    /// Holds `limit + debt - in flight` permits: a decrease is paid back by permits released
    /// and forgotten.
    permits: Arc<Semaphore>,
    state: Mutex<LimitState>,
}

#[derive(Debug)]
struct LimitState {
    limit: usize,
    /// Permits to forget as they come back (decreases not yet effective).
    debt: usize,
    in_flight: usize,
    slow_start: bool,
    /// Decreases so far: a refused call that started before the latest one ran under a limit
    /// whose refusal is already counted.
    decreases: u64,
    /// Long-term mean latency, seconds.
    mean_latency_seconds: Option<f64>,
    window: Window,
}

#[derive(Debug)]
struct Window {
    started: Instant,
    latency_sum_seconds: f64,
    calls: u32,
    refused: bool,
    /// A call of the window took more than [`LATENCY_GROWTH`] times the long-term mean.
    slowed: bool,
    /// The most calls in flight at once during the window.
    most_in_flight: usize,
}

impl Window {
    fn new() -> Self {
        Self {
            started: Instant::now(),
            latency_sum_seconds: 0.0,
            calls: 0,
            refused: false,
            slowed: false,
            most_in_flight: 0,
        }
    }
}

#[derive(Debug, Clone, Copy)]
enum Reason {
    Refusal,
    Latency,
}

impl Reason {
    fn label(self) -> &'static str {
        match self {
            Reason::Refusal => "refusal",
            Reason::Latency => "latency",
        }
    }
}

/// A call's place under the limit; given back when dropped.
struct Permit {
    limiter: Arc<Limiter>,
    permit: Option<OwnedSemaphorePermit>,
}

impl Drop for Permit {
    fn drop(&mut self) {
        let mut state = self.limiter.lock();
        state.in_flight -= 1;
        let permit = self.permit.take();
        if state.debt > 0 {
            state.debt -= 1;
            if let Some(permit) = permit {
                permit.forget();
            }
        }
        self.limiter.gauges.left();
    }
}

impl AdaptiveConcurrency {
    /// A limit for `operation` starting at [`INITIAL_LIMIT`] (or `maximum` when lower).
    #[cfg(test)]
    pub(crate) fn new(operation: &'static str, maximum: usize) -> Self {
        Self::starting_at(operation, INITIAL_LIMIT, maximum)
    }

    /// A limit for `operation` starting at `initial` (or `maximum` when lower): where BigQuery
    /// documents the concurrency it allows (100 interactive queries per project), the limit
    /// starts there and only learns down, instead of ramping up on every gateway start.
    #[cfg(test)]
    pub(crate) fn starting_at(operation: &'static str, initial: usize, maximum: usize) -> Self {
        let gauges = Arc::new(OperationGauges::new(operation));
        Self { limiter: Arc::new(Limiter::new(gauges, None, initial, maximum)) }
    }

    /// The current limit.
    #[cfg(test)]
    pub(crate) fn limit(&self) -> usize {
        self.limiter.lock().limit
    }

    /// Runs `tenant`'s `call` once a place under the limit is free (callers waiting take turns
    /// by tenant, each tenant's in arrival order); its result tells the limit whether BigQuery
    /// pushed back, and otherwise how long it took.
    pub(crate) async fn run<T, E: Classified>(
        &self,
        tenant: &Tenant,
        call: impl Future<Output = Result<T, E>>,
    ) -> Result<T, E> {
        let permit = self.acquire(tenant).await;
        let started = Instant::now();
        let decreases_before = self.limiter.lock().decreases;
        // Boxed: set-up and publication futures are large, and nesting them by value
        // overflows debug builds' stacks.
        let answer = Box::pin(call).await;
        match &answer {
            Err(error) if error.retry_class() == RetryClass::Pushback => {
                self.limiter.decrease(Reason::Refusal, Some(decreases_before));
            }
            _ => self.limiter.completed(started),
        }
        drop(permit);
        answer
    }

    async fn acquire(&self, tenant: &Tenant) -> Permit {
        let semaphore = Arc::clone(&self.limiter.permits);
        // One caller at a time waits at the semaphore: the one whose turn it is.
        let turn = self.limiter.turns.turn(tenant).await;
        // The semaphore is never closed.
        let permit = semaphore.acquire_owned().await.ok();
        drop(turn);
        let mut state = self.limiter.lock();
        state.in_flight += 1;
        state.window.most_in_flight = state.window.most_in_flight.max(state.in_flight);
        self.limiter.gauges.entered();
        Permit { limiter: Arc::clone(&self.limiter), permit }
    }
}

impl Limiter {
    /// A limit of calls into `destination` reporting to its operation's `gauges`.
    fn new(gauges: Arc<OperationGauges>, destination: Option<ProjectLocation>, initial: usize, maximum: usize) -> Self {
        let maximum = maximum.max(1);
        let limit = initial.clamp(1, maximum);
        let operation = gauges.operation;
        let state = LimitState {
            limit,
            debt: 0,
            in_flight: 0,
            slow_start: true,
            decreases: 0,
            mean_latency_seconds: None,
            window: Window::new(),
        };
        let limiter = Limiter {
            operation,
            id: gauges.next_id(),
            destination,
            turns: FairQueue::new(vec![metrics::Label::from_static_parts("operation", operation)]),
            gauges,
            maximum,
            permits: Arc::new(Semaphore::new(limit)),
            state: Mutex::new(state),
        };
        limiter.gauges.limit_changed(limiter.id, limit);
        limiter
    }

    fn lock(&self) -> parking_lot::MutexGuard<'_, LimitState> {
        self.state.lock()
    }

    /// A call started at `started` ended: counts its latency, and at the end of a window
    /// adjusts the limit.
    fn completed(&self, started: Instant) {
        let latency = started.elapsed().as_secs_f64();
        let mut state = self.lock();
        // A round trip: the long-term mean, or this call before there is one.
        let round_trip = state.mean_latency_seconds.unwrap_or(latency);
        let window_length = Duration::from_secs_f64(round_trip).max(MIN_WINDOW);
        // After a quiet spell the window's calls belong to another load: start afresh.
        if state.window.started.elapsed() > window_length * STALE_WINDOWS {
            state.window = Window { most_in_flight: state.in_flight, ..Window::new() };
        }
        state.window.calls += 1;
        state.window.latency_sum_seconds += latency;
        if state.mean_latency_seconds.is_some_and(|mean| latency > mean * LATENCY_GROWTH) {
            state.window.slowed = true;
        }
        if state.window.started.elapsed() < window_length {
            return;
        }
        let fresh = Window { most_in_flight: state.in_flight, ..Window::new() };
        let window = std::mem::replace(&mut state.window, fresh);
        if window.refused {
            return;
        }
        let window_mean = window.latency_sum_seconds / f64::from(window.calls);
        let mean = *state.mean_latency_seconds.get_or_insert(window_mean);
        state.mean_latency_seconds = Some(mean + EWMA_WEIGHT * (window_mean - mean));
        if window_mean > mean * LATENCY_GROWTH {
            drop(state);
            self.decrease(Reason::Latency, None);
        } else if !window.slowed && window.most_in_flight >= state.limit {
            self.increase(&mut state);
        }
    }

    fn increase(&self, state: &mut LimitState) {
        let step = if state.slow_start { state.limit } else { 1 };
        let wanted = (state.limit + step).min(self.maximum);
        let mut added = wanted - state.limit;
        state.limit = wanted;
        let repaid = added.min(state.debt);
        state.debt -= repaid;
        added -= repaid;
        self.permits.add_permits(added);
        self.gauges.limit_changed(self.id, state.limit);
    }

    /// Shrinks the limit, unless the call (started when `started_after` decreases had been
    /// made) began before the latest decrease: it ran under the old limit, whose refusal is
    /// already counted.
    fn decrease(&self, reason: Reason, started_after: Option<u64>) {
        let mut state = self.lock();
        if matches!(reason, Reason::Refusal) {
            state.window.refused = true;
        }
        if started_after.is_some_and(|decreases| decreases != state.decreases) {
            return;
        }
        let factor = match reason {
            Reason::Refusal => REFUSAL_DECREASE,
            Reason::Latency => LATENCY_DECREASE,
        };
        let wanted = ((state.limit as f64 * factor).floor() as usize).max(1);
        state.decreases += 1;
        state.slow_start = false;
        if wanted == state.limit {
            return;
        }
        let removed = state.limit - wanted;
        state.limit = wanted;
        // Free permits are taken away at once, the rest as calls end.
        let mut taken = 0;
        while taken < removed
            && let Ok(permit) = Arc::clone(&self.permits).try_acquire_owned()
        {
            permit.forget();
            taken += 1;
        }
        state.debt += removed - taken;
        self.gauges.limit_changed(self.id, state.limit);
        self.gauges.decreased(reason.label());
        tracing::info!(
            operation = self.operation,
            project = self.destination.as_ref().map(ProjectLocation::project),
            location = self.destination.as_ref().map(ProjectLocation::location),
            limit = state.limit,
            reason = reason.label(),
            "bigquery.concurrency.decreased"
        );
    }
}

impl Drop for Limiter {
    fn drop(&mut self) {
        self.gauges.limiter_gone(self.id);
    }
}

/// One operation's adaptive limits, one per project and location, made at their first call.
/// Cheap to clone (clones share the limits).
#[derive(Debug, Clone)]
pub(crate) struct AdaptiveLimits {
    gauges: Arc<OperationGauges>,
    initial: usize,
    maximum: usize,
    by_destination: Arc<PerDestination<Limiter>>,
}

impl AdaptiveLimits {
    /// Limits of `operation` starting at [`INITIAL_LIMIT`], each within `maximum`.
    pub(crate) fn new(operation: &'static str, maximum: usize) -> Self {
        Self::starting_at(operation, INITIAL_LIMIT, maximum)
    }

    /// Limits of `operation` starting at `initial`, each within `maximum`
    /// ([`AdaptiveConcurrency::starting_at`]).
    pub(crate) fn starting_at(operation: &'static str, initial: usize, maximum: usize) -> Self {
        let gauges = Arc::new(OperationGauges::new(operation));
        gauges.show_limit(initial.clamp(1, maximum.max(1)));
        Self { gauges, initial, maximum, by_destination: Arc::default() }
    }

    /// The limit of calls into `destination`.
    pub(crate) fn of(&self, destination: &ProjectLocation) -> AdaptiveConcurrency {
        let make = || Limiter::new(Arc::clone(&self.gauges), Some(destination.clone()), self.initial, self.maximum);
        // Forgotten only when no call holds it: then none runs or waits under it.
        AdaptiveConcurrency { limiter: self.by_destination.of(destination, make, |_| true) }
    }

    /// Runs `tenant`'s `call` into `destination` under that destination's limit
    /// ([`AdaptiveConcurrency::run`]).
    pub(crate) async fn run<T, E: Classified>(
        &self,
        destination: &ProjectLocation,
        tenant: &Tenant,
        call: impl Future<Output = Result<T, E>>,
    ) -> Result<T, E> {
        // Boxed before it is handed on: a publication's future is large, and moving it by
        // value through one more frame overflows debug builds' stacks.
        self.of(destination).run(tenant, Box::pin(call)).await
    }

    /// The current limit of `destination`, when it has one.
    #[cfg(test)]
    pub(crate) fn limit_of(&self, destination: &ProjectLocation) -> Option<usize> {
        self.by_destination.get(destination).map(|limiter| limiter.lock().limit)
    }
}

#[cfg(test)]
#[path = "adaptive_tests.rs"]
mod tests;
