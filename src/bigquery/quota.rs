//! BigQuery's published rate quotas, paced by the gateway before each call so that BigQuery's
//! refusals become rare ([`Quotas`]). What has no published number (query and DML queueing)
//! stays with the adaptive limiter (`super::adaptive`).
//!
//! - **Rates** are token buckets ([`TokenBucket`]) holding the quota's window worth of calls and
//!   refilled continuously: `tables.insert` per second, every REST method per second
//!   (`jobs.insert`, `tables.get`, ...: one bucket each; these are quotas per user, the
//!   gateway's credentials), `CreateWriteStream` per hour or per minute
//!   ([`StreamQuotaReading`]), one bucket per project and location as BigQuery counts it. A
//!   refusal from BigQuery all the same ([`TokenBucket::refused`]) empties the bucket, so the
//!   pace slows at once, and is counted.
//! - **Concurrent REST requests** (long polls included) are held under their quota
//!   ([`ConcurrencyShare`]).
//! - **Fair turns.** Callers waiting for a token or a place are queued per tenant in front of
//!   each bucket and share (`super::fair`), so a principal with thousands of calls waiting
//!   delays another's next call by one call of each tenant waiting, not by its whole queue.
//!   Calls carry their tenant in [`TenantQuotas`], the quotas as one tenant's calls meet them.
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

use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

mod concurrency;

use super::fair::{FairQueue, Tenant};
use super::per_destination::{PerDestination, ProjectLocation};
pub(crate) use crate::config::StreamQuotaReading;
use crate::telemetry;
pub(crate) use concurrency::{ConcurrencyShare, InFlight};

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
    /// Whose turn it is to wait for the next token.
    turns: FairQueue,
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
        let turns = FairQueue::new(labels.clone());
        let bucket =
            TokenBucket { labels, quota, fleet, state: Mutex::new(state), waiting: AtomicUsize::new(0), turns };
        bucket.publish(rate);
        bucket
    }

    /// Takes one token for `tenant`'s call, waiting for it when there is none (callers waiting
    /// take turns by tenant, `super::fair`), and for a share while this replica's membership
    /// has lapsed. Cancel-safe: a cancelled wait gives its reserved token back.
    pub(crate) async fn take(&self, tenant: &Tenant) {
        let mut waiting = None;
        let _turn = match self.turns.try_turn() {
            Some(turn) => turn,
            None => {
                waiting = Some(Waiting::new(self));
                self.turns.turn(tenant).await
            }
        };
        loop {
            let Some(wait) = self.reserve(Instant::now()) else {
                waiting.get_or_insert_with(|| Waiting::new(self));
                self.counted_again().await;
                continue;
            };
            if wait.is_zero() {
                return;
            }
            waiting.get_or_insert_with(|| Waiting::new(self));
            let mut reserved = ReservedToken { bucket: self, granted: false };
            tokio::time::sleep(wait).await;
            reserved.granted = true;
            return;
        }
    }

    /// Reserves a token at `now`: how long until it is there; `None` (nothing reserved) while
    /// this replica has no share.
    fn reserve(&self, now: Instant) -> Option<Duration> {
        let mut state = self.state.lock();
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
        let mut state = self.state.lock();
        self.refill(&mut state, Instant::now());
    }

    /// Full, with no caller waiting: a new bucket would be the same.
    fn is_idle(&self) -> bool {
        let mut state = self.state.lock();
        self.refill(&mut state, Instant::now());
        state.tokens >= state.rate.burst && self.waiting.load(Ordering::Relaxed) == 0
    }

    /// BigQuery refused a call this bucket paced: the bucket empties (reservations already
    /// made still wait their turn), so the next calls come at the refill rate.
    pub(crate) fn refused(&self) {
        let mut state = self.state.lock();
        self.refill(&mut state, Instant::now());
        state.tokens = state.tokens.min(0.0);
        telemetry::quota_refused(&self.labels);
    }

    /// This replica's rate now, calls per second.
    #[cfg(test)]
    fn rate_per_second(&self) -> f64 {
        self.quota.share(*self.fleet.borrow()).per_second
    }

    fn publish(&self, rate: Rate) {
        telemetry::quota_rate(self.labels.clone(), rate.per_second);
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

/// A caller waiting for its turn, its token or a share, counted in
/// `filament_bigquery_quota_waiting` until dropped.
struct Waiting<'a> {
    bucket: &'a TokenBucket,
}

impl<'a> Waiting<'a> {
    fn new(bucket: &'a TokenBucket) -> Self {
        bucket.waiting.fetch_add(1, Ordering::Relaxed);
        telemetry::quota_waiting(&bucket.labels, true);
        Waiting { bucket }
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.bucket.waiting.fetch_sub(1, Ordering::Relaxed);
        telemetry::quota_waiting(&self.bucket.labels, false);
    }
}

/// A token reserved and not yet due: a wait that ends before (cancelled) gives it back.
struct ReservedToken<'a> {
    bucket: &'a TokenBucket,
    granted: bool,
}

impl Drop for ReservedToken<'_> {
    fn drop(&mut self) {
        if !self.granted {
            let mut state = self.bucket.state.lock();
            state.tokens += 1.0;
        }
    }
}

/// Every quota the gateway paces, shared by all of this replica's calls (one per process).
#[derive(Debug)]
pub(crate) struct Quotas {
    settings: QuotaSettings,
    fleet: FleetMembershipWatch,
    tables_insert: TokenBucket,
    /// Per project and location: BigQuery counts the stream quota per project and region.
    create_write_stream: PerDestination<TokenBucket>,
    concurrent_api_requests: ConcurrencyShare,
    /// One bucket per REST method, made at its first call.
    per_method: Mutex<HashMap<&'static str, Arc<TokenBucket>>>,
}

/// What a paced REST call holds while it runs.
pub(crate) type RestPlace<'a> = InFlight<'a>;

impl Quotas {
    pub(crate) fn new(settings: QuotaSettings, fleet: FleetMembershipWatch) -> Self {
        let bucket = |name, rate: Rate| TokenBucket::new(quota_label(name), rate.paced(), fleet.clone());
        let quotas = Quotas {
            tables_insert: bucket("tables.insert", Rate::per_second(settings.tables_insert_per_second)),
            create_write_stream: PerDestination::default(),
            concurrent_api_requests: ConcurrencyShare::new(
                "concurrent_api_requests",
                settings.concurrent_api_requests,
                fleet.clone(),
            ),
            per_method: Mutex::default(),
            settings,
            fleet,
        };
        quotas.publish_stream_rate();
        quotas
    }

    /// Keeps each pacer's rate in `/metrics` current as the fleet changes (between calls too),
    /// for as long as `quotas` lives.
    pub(crate) fn follow_fleet(quotas: &Arc<Quotas>) {
        let (weak, mut fleet) = (Arc::downgrade(quotas), quotas.fleet.clone());
        tokio::spawn(async move {
            while fleet.changed().await.is_ok() {
                let Some(quotas) = weak.upgrade() else { return };
                let mut buckets: Vec<_> = quotas.lock_methods().values().cloned().collect();
                buckets.extend(quotas.create_write_stream.all());
                for bucket in std::iter::once(&quotas.tables_insert).chain(buckets.iter().map(|b| &**b)) {
                    bucket.catch_up();
                }
                quotas.publish_stream_rate();
                // A larger share lets waiting callers in at once.
                quotas.concurrent_api_requests.freed.notify_waiters();
            }
        });
    }

    /// The stream quota's pace in `/metrics` (the same for every destination), from the start.
    fn publish_stream_rate(&self) {
        let rate = self.settings.create_write_stream().paced().share(*self.fleet.borrow());
        telemetry::quota_rate(quota_label("CreateWriteStream"), rate.per_second);
    }

    fn lock_methods(&self) -> parking_lot::MutexGuard<'_, HashMap<&'static str, Arc<TokenBucket>>> {
        self.per_method.lock()
    }

    fn method(&self, method: &'static str) -> Arc<TokenBucket> {
        let mut buckets = self.lock_methods();
        let rate = Rate::per_second(self.settings.api_requests_per_second_per_method).paced();
        Arc::clone(
            buckets
                .entry(method)
                .or_insert_with(|| Arc::new(TokenBucket::new(method_labels(method), rate, self.fleet.clone()))),
        )
    }

    /// The stream quota's bucket of `destination`.
    fn stream_bucket(&self, destination: &ProjectLocation) -> Arc<TokenBucket> {
        let rate = self.settings.create_write_stream().paced();
        let make = || TokenBucket::new(quota_label("CreateWriteStream"), rate, self.fleet.clone());
        self.create_write_stream.of(destination, make, TokenBucket::is_idle)
    }

    /// Waits until REST `method` may be called for `tenant` within every quota it counts
    /// against; the place it returns is held until the call's answer. The place is taken
    /// first: calls that waited for one then go out at the rate quotas' pace, not all at once.
    pub(crate) async fn before_rest_call(&self, tenant: &Tenant, method: &'static str) -> RestPlace<'_> {
        let place = self.concurrent_api_requests.enter(tenant).await;
        if method == "tables.insert" {
            self.tables_insert.take(tenant).await;
        }
        self.method(method).take(tenant).await;
        place
    }

    /// BigQuery refused REST `method` for a rate: its buckets slow down.
    pub(crate) fn rest_refused(&self, method: &'static str) {
        if method == "tables.insert" {
            self.tables_insert.refused();
        }
        self.method(method).refused();
    }
}

/// The quotas as one tenant's calls meet them: every wait takes its turn under that tenant
/// (`super::fair`). Cheap to clone; clones share the quotas.
#[derive(Debug, Clone)]
pub(crate) struct TenantQuotas {
    quotas: Arc<Quotas>,
    tenant: Tenant,
}

impl TenantQuotas {
    pub(crate) fn new(quotas: Arc<Quotas>, tenant: Tenant) -> Self {
        Self { quotas, tenant }
    }

    /// The same quotas for `tenant`'s calls.
    pub(crate) fn on_behalf_of(&self, tenant: Tenant) -> Self {
        Self { quotas: Arc::clone(&self.quotas), tenant }
    }

    pub(crate) fn tenant(&self) -> &Tenant {
        &self.tenant
    }

    /// [`Quotas::before_rest_call`] for this tenant.
    pub(crate) async fn before_rest_call(&self, method: &'static str) -> RestPlace<'_> {
        self.quotas.before_rest_call(&self.tenant, method).await
    }

    /// Waits until `CreateWriteStream` may be called in `destination`.
    pub(crate) async fn before_create_write_stream(&self, destination: &ProjectLocation) {
        self.quotas.stream_bucket(destination).take(&self.tenant).await;
    }

    /// BigQuery refused REST `method` for a rate.
    pub(crate) fn rest_refused(&self, method: &'static str) {
        self.quotas.rest_refused(method);
    }

    /// BigQuery refused `CreateWriteStream` in `destination` for its quota.
    pub(crate) fn create_write_stream_refused(&self, destination: &ProjectLocation) {
        self.quotas.stream_bucket(destination).refused();
    }
}

#[cfg(test)]
#[path = "quota_tests.rs"]
mod tests;
