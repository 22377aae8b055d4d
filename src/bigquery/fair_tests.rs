//! Paused time: every wait below is exact, so each assertion pins one rule of the queue.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Semaphore;
use tokio::time::Instant;

use super::*;

fn queue() -> Arc<FairQueue> {
    Arc::new(FairQueue::new(vec![metrics::Label::from_static_parts("queue", "test")]))
}

/// A place that serves one call every `service`: a one-permit semaphore held that long, the
/// callers passing through `queue` first.
#[derive(Clone)]
struct PacedPlace {
    queue: Arc<FairQueue>,
    place: Arc<Semaphore>,
    service: Duration,
}

impl PacedPlace {
    fn new(service: Duration) -> Self {
        Self { queue: queue(), place: Arc::new(Semaphore::new(1)), service }
    }

    /// One call of `tenant`: its turn, then the place, then its service; when it was served.
    async fn call(&self, tenant: Tenant, start: Instant) -> Duration {
        let turn = self.queue.turn(&tenant).await;
        let permit = self.place.acquire().await.unwrap();
        drop(turn);
        let served = start.elapsed();
        tokio::time::sleep(self.service).await;
        drop(permit);
        served
    }

    fn spawn_calls(&self, tenant: &Tenant, calls: usize, start: Instant) -> Vec<tokio::task::JoinHandle<Duration>> {
        (0..calls)
            .map(|_| {
                let (place, tenant) = (self.clone(), tenant.clone());
                tokio::spawn(async move { place.call(tenant, start).await })
            })
            .collect()
    }
}

/// Lets every spawned task run until it waits: paused time moves on only once every task is
/// idle.
async fn settle() {
    tokio::time::sleep(Duration::from_millis(1)).await;
}

#[tokio::test(start_paused = true)]
async fn a_principal_with_one_call_is_served_within_one_round_of_another_with_a_thousand() {
    let place = PacedPlace::new(Duration::from_millis(100));
    let (bulk, small) = (Tenant::principal("bulk"), Tenant::principal("small"));
    let start = Instant::now();
    let bulk_calls = place.spawn_calls(&bulk, 1_000, start);
    settle().await;
    assert_eq!(place.queue.calls_waiting(), 998, "one call holds the place, one the turn, the rest wait for it");
    let small_call = place.spawn_calls(&small, 1, start).pop().unwrap();
    let served = small_call.await.unwrap();
    // Bulk's first call held the place when small came and its second had the turn; in the
    // round small joined, bulk (queued first) has one call before it.
    assert_eq!(served, Duration::from_millis(300), "served within one round, not after a thousand calls");
    let mut bulk_served = Vec::new();
    for call in bulk_calls {
        bulk_served.push(call.await.unwrap());
    }
    bulk_served.sort();
    assert_eq!(bulk_served.last().copied(), Some(Duration::from_millis(100_000)), "bulk lost one call's time");
}

#[tokio::test(start_paused = true)]
async fn tenants_waiting_are_served_in_turn_each_in_its_own_order() {
    let place = PacedPlace::new(Duration::from_millis(10));
    let tenants: Vec<Tenant> = ["a", "b", "c"].into_iter().map(Tenant::principal).collect();
    let start = Instant::now();
    // `a` holds the place; then 3 calls of each, `a` first (its first of them takes the turn
    // before `b` and `c` come).
    let first = place.spawn_calls(&tenants[0], 1, start);
    settle().await;
    let mut calls = Vec::new();
    for tenant in &tenants {
        calls.push(place.spawn_calls(tenant, 3, start));
        settle().await;
    }
    let mut served: Vec<(Duration, &str)> = Vec::new();
    for (tenant, handles) in ["a", "b", "c"].into_iter().zip(calls) {
        for handle in handles {
            served.push((handle.await.unwrap(), tenant));
        }
    }
    for handle in first {
        assert_eq!(handle.await.unwrap(), Duration::ZERO);
    }
    served.sort();
    let order: Vec<&str> = served.iter().map(|(_, tenant)| *tenant).collect();
    assert_eq!(order, ["a", "a", "b", "c", "a", "b", "c", "b", "c"]);
}

#[tokio::test(start_paused = true)]
async fn a_cancelled_wait_leaves_the_queue_and_a_cancelled_turn_passes_on() {
    let queue = queue();
    let tenant = Tenant::principal("a");
    let held = queue.try_turn().expect("free");
    assert!(queue.try_turn().is_none(), "one turn at a time");
    // A waiter that gives up leaves nothing behind.
    assert!(tokio::time::timeout(Duration::from_millis(1), queue.turn(&tenant)).await.is_err());
    assert_eq!(queue.calls_waiting(), 0);
    // A waiter handed the turn as it is dropped gives it on.
    let other = Tenant::principal("b");
    let mut waiting = Box::pin(queue.turn(&other));
    assert!(futures::poll!(waiting.as_mut()).is_pending());
    drop(held);
    drop(waiting);
    let next = tokio::time::timeout(Duration::from_millis(1), queue.turn(&tenant)).await;
    assert!(next.is_ok(), "the turn came back free");
}

#[test]
fn a_principal_at_its_cap_is_refused_and_its_places_come_back() {
    let cap = PerPrincipalCap::new("test", 2);
    let (a, b) = (Tenant::principal("a"), Tenant::principal("b"));
    let first = cap.try_take(&a).expect("below the cap");
    let _second = cap.try_take(&a).expect("at the cap");
    assert!(cap.refuses(&a) && cap.try_take(&a).is_none(), "a third is refused");
    assert!(cap.try_take(&b).is_some(), "another principal is not");
    drop(first);
    assert!(cap.try_take(&a).is_some(), "a place given back is taken again");
    let forced = cap.take_regardless(&a);
    assert!(cap.refuses(&a));
    drop(forced);
}
