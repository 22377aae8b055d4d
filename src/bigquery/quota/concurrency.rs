//! Concurrency quotas (BigQuery's concurrent REST requests per user, long polls included):
//! at most this replica's share of the quota in flight ([`ConcurrencyShare`]), callers
//! waiting for a place taking turns by tenant (`crate::bigquery::fair`).

use parking_lot::Mutex;

use tokio::sync::Notify;

use super::{FleetMembership, FleetMembershipWatch, quota_label};
use crate::bigquery::fair::{FairQueue, Tenant};
use crate::telemetry;

/// At most this replica's share of a concurrency quota in flight.
#[derive(Debug)]
pub(crate) struct ConcurrencyShare {
    name: &'static str,
    quota: usize,
    fleet: FleetMembershipWatch,
    in_flight: Mutex<usize>,
    pub(super) freed: Notify,
    /// Whose turn it is to wait for the next free place.
    turns: FairQueue,
}

/// A place under a [`ConcurrencyShare`], given back when dropped.
#[derive(Debug)]
pub(crate) struct InFlight<'a>(&'a ConcurrencyShare);

impl ConcurrencyShare {
    pub(super) fn new(name: &'static str, quota: usize, fleet: FleetMembershipWatch) -> Self {
        let turns = FairQueue::new(quota_label(name));
        ConcurrencyShare { name, quota, fleet, in_flight: Mutex::new(0), freed: Notify::new(), turns }
    }

    /// This replica's share: the quota divided among the replicas, at least one call; none
    /// while its membership has lapsed.
    pub(crate) fn limit(&self) -> usize {
        match *self.fleet.borrow() {
            FleetMembership::Counted { live_replicas } => (self.quota / live_replicas.max(1)).max(1),
            FleetMembership::Lapsed => 0,
        }
    }

    /// Waits for a place for `tenant`'s call (callers waiting take turns by tenant).
    pub(crate) async fn enter(&self, tenant: &Tenant) -> InFlight<'_> {
        let _turn = self.turns.turn(tenant).await;
        loop {
            // Registered before the check, so a place freed meanwhile wakes this caller.
            let freed = self.freed.notified();
            tokio::pin!(freed);
            freed.as_mut().enable();
            {
                let mut in_flight = self.in_flight.lock();
                if *in_flight < self.limit() {
                    *in_flight += 1;
                    telemetry::quota_in_flight(self.name, *in_flight);
                    return InFlight(self);
                }
            }
            freed.await;
        }
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        let mut in_flight = self.0.in_flight.lock();
        *in_flight -= 1;
        telemetry::quota_in_flight(self.0.name, *in_flight);
        self.0.freed.notify_one();
    }
}
