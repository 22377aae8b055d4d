//! BigQuery's published rate quotas, paced by the gateway before each call so that BigQuery's
//! refusals become rare ([`Quotas`]). What has no published number (query and DML queueing)
//! stays with the adaptive limiter (`super::adaptive`).
//!
//! - **Rates** are token buckets ([`TokenBucket`]) holding the quota's window worth of calls and
//!   refilled continuously: `tables.insert` per second, every REST method per second
//!   (`jobs.insert`, `tables.get`, ...: one bucket each), `CreateWriteStream` per hour or per
//!   minute ([`StreamQuotaReading`]). A caller reserves its token and waits for it, in order;
//!   a refusal from BigQuery all the same ([`Quotas::refused`]) empties the bucket, so the
//!   pace slows at once, and is counted.
//! - **Concurrent REST requests** (long polls included) are held under their quota
//!   ([`ConcurrencyShare`]).
//! - **Fleet shares.** Per-user and per-project quotas are shared by every replica of a fleet:
//!   each replica paces with its share, the quota divided by the live replicas it counts in
//!   Postgres (`replica`), re-divided when one joins, leaves or is lost. A bucket that shrinks
//!   keeps no more tokens than its new share. A replica starts with its share full (counted
//!   before its first call), so a restarted gateway is not slowed for a minute; one that joins
//!   while the others just spent theirs may thus add one share's burst, which BigQuery may
//!   refuse and the pace then absorbs.
//!
//! `/metrics`: `filament_bigquery_quota_rate_per_second`, `filament_bigquery_quota_waiting`
//! and `filament_bigquery_quota_refusals_total` (by `quota`), and `filament_fleet_replicas`.
//! Values and sources: `docs/performance.md`.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::{Notify, watch};
use tokio::time::Instant;

pub(crate) use crate::config::StreamQuotaReading;
use crate::telemetry;

/// The quota values the gateway paces by (defaults: Google's; a project may have raised ones).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct QuotaSettings {
    /// `tables.insert` requests per second per user.
    pub(crate) tables_insert_per_second: f64,
    /// Requests per second per user of each other REST method.
    pub(crate) api_requests_per_second_per_method: f64,
    /// REST requests in flight per user (long polls count).
    pub(crate) concurrent_api_requests: usize,
    /// `CreateWriteStream` calls per hour per project and region.
    pub(crate) create_write_streams_per_hour: f64,
    pub(crate) stream_quota_reading: StreamQuotaReading,
}

impl QuotaSettings {
    /// Google's published quotas (the configuration's defaults).
    #[cfg(test)]
    pub(crate) const GOOGLE: QuotaSettings = QuotaSettings {
        tables_insert_per_second: 10.0,
        api_requests_per_second_per_method: 100.0,
        concurrent_api_requests: 300,
        create_write_streams_per_hour: 10_000.0,
        stream_quota_reading: StreamQuotaReading::PerMinute,
    };

    fn create_write_stream(&self) -> Rate {
        let per_second = self.create_write_streams_per_hour / 3600.0;
        match self.stream_quota_reading {
            StreamQuotaReading::Hourly => Rate { burst: self.create_write_streams_per_hour, per_second },
            StreamQuotaReading::PerMinute => Rate { burst: self.create_write_streams_per_hour / 60.0, per_second },
        }
    }
}

/// The fraction of a rate quota the gateway paces at: requests leave evenly but reach BigQuery
/// with the network's jitter, and the fleet's replicas renew their count every few seconds.
pub(crate) const PACE_FRACTION: f64 = 0.9;

/// A quota as a bucket: `burst` calls at once, refilled at `per_second`.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Rate {
    burst: f64,
    per_second: f64,
}

impl Rate {
    /// A per-second quota: one second's calls at once.
    fn per_second(per_second: f64) -> Self {
        Rate { burst: per_second, per_second }
    }

    /// The pace the gateway keeps under this quota: [`PACE_FRACTION`] of it.
    fn paced(self) -> Rate {
        Rate { burst: self.burst * PACE_FRACTION, per_second: self.per_second * PACE_FRACTION }
    }

    /// This replica's share: the rate divided among the live replicas, nothing once lapsed.
    fn share(self, membership: FleetMembership) -> Rate {
        let fraction = membership.share_of_each_quota();
        Rate { burst: self.burst * fraction, per_second: self.per_second * fraction }
    }

    fn is_zero(self) -> bool {
        self.per_second <= 0.0
    }
}

/// This replica's place in the fleet, as its heartbeat last counted it in Postgres (`replica`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FleetMembership {
    /// Counted among `live_replicas` (this one included): a share of each quota each.
    Counted { live_replicas: usize },
    /// Not renewed before its lease ran out: the other replicas count it lost and share the
    /// quotas without it, so it has no share until it is counted again.
    Lapsed,
}

impl FleetMembership {
    /// A replica alone, as a gateway starts before its first count.
    pub(crate) const ALONE: FleetMembership = FleetMembership::Counted { live_replicas: 1 };

    /// The fraction of each quota this replica paces at.
    fn share_of_each_quota(self) -> f64 {
        match self {
            FleetMembership::Counted { live_replicas } => 1.0 / live_replicas.max(1) as f64,
            FleetMembership::Lapsed => 0.0,
        }
    }
}

/// This replica's place in the fleet, kept current by the replica heartbeat.
pub(crate) type FleetMembershipWatch = watch::Receiver<FleetMembership>;

/// A fleet of one that never changes (the value outlives its sender).
#[cfg(test)]
fn fleet_of_one() -> FleetMembershipWatch {
    watch::channel(FleetMembership::ALONE).1
}

/// One rate quota, paced as a token bucket with this replica's share.
#[derive(Debug)]
pub(crate) struct TokenBucket {
    /// `quota` (and `method`, for a per-method quota) in `/metrics`.
    labels: Vec<metrics::Label>,
    quota: Rate,
    fleet: FleetMembershipWatch,
    state: Mutex<BucketState>,
    waiting: AtomicUsize,
}

#[derive(Debug)]
struct BucketState {
    /// Tokens at `updated`; negative while callers wait for reserved ones (a cancelled wait
    /// gives its token back).
    tokens: f64,
    updated: Instant,
    /// The share the tokens were counted under.
    rate: Rate,
}

impl TokenBucket {
    fn new(labels: Vec<metrics::Label>, quota: Rate, fleet: FleetMembershipWatch) -> Self {
        let rate = quota.share(*fleet.borrow());
        let state = BucketState { tokens: rate.burst, updated: Instant::now(), rate };
        let bucket = TokenBucket { labels, quota, fleet, state: Mutex::new(state), waiting: AtomicUsize::new(0) };
        bucket.publish(rate);
        bucket
    }

    /// Takes one token, waiting for it when there is none (callers are served in the order they
    /// reserved), and for a share while this replica's membership has lapsed. Cancel-safe: a
    /// cancelled wait gives its reserved token back.
    pub(crate) async fn take(&self) {
        loop {
            let Some(wait) = self.reserve(Instant::now()) else {
                let _waiting = Waiting::new(self, false);
                self.counted_again().await;
                continue;
            };
            if wait.is_zero() {
                return;
            }
            let mut waiting = Waiting::new(self, true);
            tokio::time::sleep(wait).await;
            waiting.holds_reserved_token = false;
            return;
        }
    }

    /// Reserves a token at `now`: how long until it is there; `None` (nothing reserved) while
    /// this replica has no share.
    fn reserve(&self, now: Instant) -> Option<Duration> {
        let mut state = self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        self.refill(&mut state, now);
        if state.rate.is_zero() {
            return None;
        }
        state.tokens -= 1.0;
        Some(match state.tokens >= 0.0 {
            true => Duration::ZERO,
            false => Duration::from_secs_f64(-state.tokens / state.rate.per_second),
        })
    }

    /// Waits until the fleet counts this replica again (forever once its heartbeat is gone).
    async fn counted_again(&self) {
        let mut fleet = self.fleet.clone();
        if fleet.wait_for(|membership| *membership != FleetMembership::Lapsed).await.is_err() {
            std::future::pending::<()>().await;
        }
    }

    /// Brings the tokens to `now` at the share they were counted under, then takes the current
    /// share (keeping no more tokens than its burst).
    fn refill(&self, state: &mut BucketState, now: Instant) {
        let elapsed = now.saturating_duration_since(state.updated).as_secs_f64();
        state.tokens = (state.tokens + elapsed * state.rate.per_second).min(state.rate.burst);
        state.updated = now;
        let rate = self.quota.share(*self.fleet.borrow());
        if rate != state.rate {
            state.rate = rate;
            state.tokens = state.tokens.min(rate.burst);
            self.publish(rate);
        }
    }

    /// Brings the bucket to now under the current share (its rate in `/metrics` too).
    fn catch_up(&self) {
        let mut state = self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        self.refill(&mut state, Instant::now());
    }

    /// BigQuery refused a call this bucket paced: the bucket empties (reservations already
    /// made still wait their turn), so the next calls come at the refill rate.
    pub(crate) fn refused(&self) {
        let mut state = self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        self.refill(&mut state, Instant::now());
        state.tokens = state.tokens.min(0.0);
        metrics::counter!(telemetry::QUOTA_REFUSALS, self.labels.clone()).increment(1);
    }

    /// This replica's rate now, calls per second.
    #[cfg(test)]
    fn rate_per_second(&self) -> f64 {
        self.quota.share(*self.fleet.borrow()).per_second
    }

    fn publish(&self, rate: Rate) {
        metrics::gauge!(telemetry::QUOTA_RATE, self.labels.clone()).set(rate.per_second);
    }
}

/// The labels of a quota's pacer in `/metrics`.
fn quota_label(quota: &'static str) -> Vec<metrics::Label> {
    vec![metrics::Label::from_static_parts("quota", quota)]
}

/// The labels of one REST method's pacer under the per-method quota.
fn method_labels(method: &'static str) -> Vec<metrics::Label> {
    vec![
        metrics::Label::from_static_parts("quota", "api_requests_per_method"),
        metrics::Label::from_static_parts("method", method),
    ]
}

/// A caller waiting for its token (or for a share), counted in
/// `filament_bigquery_quota_waiting` until dropped. A wait that ends while it holds a reserved
/// token not yet granted (cancelled) gives the token back.
struct Waiting<'a> {
    bucket: &'a TokenBucket,
    holds_reserved_token: bool,
}

impl<'a> Waiting<'a> {
    fn new(bucket: &'a TokenBucket, holds_reserved_token: bool) -> Self {
        bucket.waiting.fetch_add(1, Ordering::Relaxed);
        metrics::gauge!(telemetry::QUOTA_WAITING, bucket.labels.clone()).increment(1.0);
        Waiting { bucket, holds_reserved_token }
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.bucket.waiting.fetch_sub(1, Ordering::Relaxed);
        metrics::gauge!(telemetry::QUOTA_WAITING, self.bucket.labels.clone()).decrement(1.0);
        if self.holds_reserved_token {
            let mut state = self.bucket.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            state.tokens += 1.0;
        }
    }
}

/// At most this replica's share of a concurrency quota in flight.
#[derive(Debug)]
pub(crate) struct ConcurrencyShare {
    name: &'static str,
    quota: usize,
    fleet: FleetMembershipWatch,
    in_flight: Mutex<usize>,
    freed: Notify,
}

/// A place under a [`ConcurrencyShare`], given back when dropped.
#[derive(Debug)]
pub(crate) struct InFlight<'a>(&'a ConcurrencyShare);

impl ConcurrencyShare {
    fn new(name: &'static str, quota: usize, fleet: FleetMembershipWatch) -> Self {
        ConcurrencyShare { name, quota, fleet, in_flight: Mutex::new(0), freed: Notify::new() }
    }

    /// This replica's share: the quota divided among the replicas, at least one call; none
    /// while its membership has lapsed.
    pub(crate) fn limit(&self) -> usize {
        match *self.fleet.borrow() {
            FleetMembership::Counted { live_replicas } => (self.quota / live_replicas.max(1)).max(1),
            FleetMembership::Lapsed => 0,
        }
    }

    /// Waits for a place.
    pub(crate) async fn enter(&self) -> InFlight<'_> {
        loop {
            // Registered before the check, so a place freed meanwhile wakes this caller.
            let freed = self.freed.notified();
            tokio::pin!(freed);
            freed.as_mut().enable();
            {
                let mut in_flight = self.in_flight.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                if *in_flight < self.limit() {
                    *in_flight += 1;
                    metrics::gauge!(telemetry::QUOTA_IN_FLIGHT, "quota" => self.name).set(*in_flight as f64);
                    return InFlight(self);
                }
            }
            freed.await;
        }
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        let mut in_flight = self.0.in_flight.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        *in_flight -= 1;
        metrics::gauge!(telemetry::QUOTA_IN_FLIGHT, "quota" => self.0.name).set(*in_flight as f64);
        self.0.freed.notify_one();
    }
}

/// Every quota the gateway paces, shared by all of this replica's calls (one per process).
#[derive(Debug)]
pub(crate) struct Quotas {
    settings: QuotaSettings,
    fleet: FleetMembershipWatch,
    tables_insert: TokenBucket,
    create_write_stream: TokenBucket,
    concurrent_api_requests: ConcurrencyShare,
    /// One bucket per REST method, made at its first call.
    per_method: Mutex<HashMap<&'static str, std::sync::Arc<TokenBucket>>>,
}

/// What a paced REST call holds while it runs.
pub(crate) type RestPlace<'a> = InFlight<'a>;

impl Quotas {
    pub(crate) fn new(settings: QuotaSettings, fleet: FleetMembershipWatch) -> Self {
        let bucket = |name, rate: Rate| TokenBucket::new(quota_label(name), rate.paced(), fleet.clone());
        Quotas {
            tables_insert: bucket("tables.insert", Rate::per_second(settings.tables_insert_per_second)),
            create_write_stream: bucket("CreateWriteStream", settings.create_write_stream()),
            concurrent_api_requests: ConcurrencyShare::new(
                "concurrent_api_requests",
                settings.concurrent_api_requests,
                fleet.clone(),
            ),
            per_method: Mutex::default(),
            settings,
            fleet,
        }
    }

    /// Keeps each pacer's rate in `/metrics` current as the fleet changes (between calls too),
    /// for as long as `quotas` lives.
    pub(crate) fn follow_fleet(quotas: &std::sync::Arc<Quotas>) {
        let (weak, mut fleet) = (std::sync::Arc::downgrade(quotas), quotas.fleet.clone());
        tokio::spawn(async move {
            while fleet.changed().await.is_ok() {
                let Some(quotas) = weak.upgrade() else { return };
                let methods: Vec<_> = quotas.lock_methods().values().cloned().collect();
                for bucket in
                    [&quotas.tables_insert, &quotas.create_write_stream].into_iter().chain(methods.iter().map(|b| &**b))
                {
                    bucket.catch_up();
                }
                // A larger share lets waiting callers in at once.
                quotas.concurrent_api_requests.freed.notify_waiters();
            }
        });
    }

    fn lock_methods(&self) -> std::sync::MutexGuard<'_, HashMap<&'static str, std::sync::Arc<TokenBucket>>> {
        self.per_method.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn method(&self, method: &'static str) -> std::sync::Arc<TokenBucket> {
        let mut buckets = self.lock_methods();
        let rate = Rate::per_second(self.settings.api_requests_per_second_per_method).paced();
        std::sync::Arc::clone(
            buckets.entry(method).or_insert_with(|| {
                std::sync::Arc::new(TokenBucket::new(method_labels(method), rate, self.fleet.clone()))
            }),
        )
    }

    /// Waits until REST `method` may be called within every quota it counts against; the
    /// place it returns is held until the call's answer. The place is taken first: calls that
    /// waited for one then go out at the rate quotas' pace, not all at once.
    pub(crate) async fn before_rest_call(&self, method: &'static str) -> RestPlace<'_> {
        let place = self.concurrent_api_requests.enter().await;
        if method == "tables.insert" {
            self.tables_insert.take().await;
        }
        self.method(method).take().await;
        place
    }

    /// Waits until `CreateWriteStream` may be called.
    pub(crate) async fn before_create_write_stream(&self) {
        self.create_write_stream.take().await;
    }

    /// BigQuery refused REST `method` for a rate: its buckets slow down.
    pub(crate) fn rest_refused(&self, method: &'static str) {
        if method == "tables.insert" {
            self.tables_insert.refused();
        }
        self.method(method).refused();
    }

    /// BigQuery refused `CreateWriteStream` for its quota.
    pub(crate) fn create_write_stream_refused(&self) {
        self.create_write_stream.refused();
    }
}

#[cfg(test)]
#[path = "quota_tests.rs"]
mod tests;
