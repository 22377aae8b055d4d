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
//! - **Bounds.** The limit stays within 1 and the maximum (`FILAMENT_MAX_CONCURRENT_PREPARES`,
//!   `FILAMENT_MAX_CONCURRENT_PUBLICATIONS`), and starts at [`INITIAL_LIMIT`] (the fixed value
//!   it replaced), except where BigQuery documents the concurrency it allows
//!   ([`AdaptiveConcurrency::starting_at`]: publications start at its 100 concurrent queries).
//!
//! The limit and its decreases are in `/metrics`: `filament_bigquery_concurrency_limit`,
//! `filament_bigquery_concurrency_in_flight` and `filament_bigquery_concurrency_decreases_total`
//! (by `operation` and `reason`). A refusal only slows calls down: retrying is the caller's
//! budget (`bigquery::retry`).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::retry::{Classified, RetryClass};
use crate::telemetry;

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
    /// `prepare`, `publication`: the metrics' `operation` label.
    operation: &'static str,
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
        metrics::gauge!(telemetry::BIGQUERY_CONCURRENCY_IN_FLIGHT, "operation" => self.limiter.operation)
            .set(state.in_flight as f64);
    }
}

impl AdaptiveConcurrency {
    /// A limit for `operation` starting at [`INITIAL_LIMIT`] (or `maximum` when lower).
    pub(crate) fn new(operation: &'static str, maximum: usize) -> Self {
        Self::starting_at(operation, INITIAL_LIMIT, maximum)
    }

    /// A limit for `operation` starting at `initial` (or `maximum` when lower): where BigQuery
    /// documents the concurrency it allows (100 interactive queries per project), the limit
    /// starts there and only learns down, instead of ramping up on every gateway start.
    pub(crate) fn starting_at(operation: &'static str, initial: usize, maximum: usize) -> Self {
        let maximum = maximum.max(1);
        let limit = initial.clamp(1, maximum);
        metrics::gauge!(telemetry::BIGQUERY_CONCURRENCY_LIMIT, "operation" => operation).set(limit as f64);
        let state = LimitState {
            limit,
            debt: 0,
            in_flight: 0,
            slow_start: true,
            decreases: 0,
            mean_latency_seconds: None,
            window: Window::new(),
        };
        let limiter =
            Limiter { operation, maximum, permits: Arc::new(Semaphore::new(limit)), state: Mutex::new(state) };
        Self { limiter: Arc::new(limiter) }
    }

    /// The current limit.
    #[cfg(test)]
    pub(crate) fn limit(&self) -> usize {
        self.limiter.lock().limit
    }

    /// Runs `call` once a place under the limit is free (waiting in arrival order); its
    /// result tells the limit whether BigQuery pushed back, and otherwise how long it took.
    pub(crate) async fn run<T, E: Classified>(&self, call: impl Future<Output = Result<T, E>>) -> Result<T, E> {
        let permit = self.acquire().await;
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

    async fn acquire(&self) -> Permit {
        let semaphore = Arc::clone(&self.limiter.permits);
        // The semaphore is never closed.
        let permit = semaphore.acquire_owned().await.ok();
        let mut state = self.limiter.lock();
        state.in_flight += 1;
        state.window.most_in_flight = state.window.most_in_flight.max(state.in_flight);
        metrics::gauge!(telemetry::BIGQUERY_CONCURRENCY_IN_FLIGHT, "operation" => self.limiter.operation)
            .set(state.in_flight as f64);
        Permit { limiter: Arc::clone(&self.limiter), permit }
    }
}

impl Limiter {
    fn lock(&self) -> std::sync::MutexGuard<'_, LimitState> {
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
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
        metrics::gauge!(telemetry::BIGQUERY_CONCURRENCY_LIMIT, "operation" => self.operation).set(state.limit as f64);
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
        metrics::gauge!(telemetry::BIGQUERY_CONCURRENCY_LIMIT, "operation" => self.operation).set(state.limit as f64);
        metrics::counter!(telemetry::BIGQUERY_CONCURRENCY_DECREASES, "operation" => self.operation,
            "reason" => reason.label())
        .increment(1);
        tracing::info!(
            operation = self.operation,
            limit = state.limit,
            reason = reason.label(),
            "bigquery.concurrency.decreased"
        );
    }
}

#[cfg(test)]
#[path = "adaptive_tests.rs"]
mod tests;
