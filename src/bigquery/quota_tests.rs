use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use super::*;
use crate::bigquery::fair::Tenant;
use crate::bigquery::per_destination::ProjectLocation;

fn fleet(replicas: usize) -> (watch::Sender<FleetMembership>, FleetMembershipWatch) {
    watch::channel(counted(replicas))
}

fn counted(live_replicas: usize) -> FleetMembership {
    FleetMembership::Counted { live_replicas }
}

/// Takes `calls` tokens one after another; when each was granted, from the start.
async fn granted_after(bucket: &TokenBucket, calls: usize) -> Vec<Duration> {
    let start = Instant::now();
    let mut granted = Vec::new();
    for _ in 0..calls {
        bucket.take(&Tenant::Gateway).await;
        granted.push(start.elapsed());
    }
    granted
}

/// Google's quotas with `concurrent_api_requests`, following `fleet`.
fn following_the_fleet(concurrent_api_requests: usize, fleet: FleetMembershipWatch) -> std::sync::Arc<Quotas> {
    let settings = QuotaSettings { concurrent_api_requests, ..QuotaSettings::GOOGLE };
    let quotas = std::sync::Arc::new(Quotas::new(settings, fleet));
    Quotas::follow_fleet(&quotas);
    quotas
}

/// A task that takes a place under the concurrent-requests share and gives it back at once.
fn enter_in_a_task(quotas: &std::sync::Arc<Quotas>) -> tokio::task::JoinHandle<()> {
    let quotas = std::sync::Arc::clone(quotas);
    tokio::spawn(async move {
        let _place = quotas.concurrent_api_requests.enter(&Tenant::Gateway).await;
    })
}

fn millis(durations: &[Duration]) -> Vec<u128> {
    durations.iter().map(Duration::as_millis).collect()
}

#[tokio::test(start_paused = true)]
async fn a_new_bucket_starts_with_its_share_and_then_paces_at_its_rate() {
    let (_sender, fleet) = fleet(2);
    let bucket = TokenBucket::new(quota_label("t"), Rate::per_second(10.0), fleet);
    let granted = granted_after(&bucket, 7).await;
    assert_eq!(millis(&granted), [0, 0, 0, 0, 0, 200, 400]);
}

#[tokio::test(start_paused = true)]
async fn an_idle_bucket_holds_one_window_and_no_more() {
    let (_sender, fleet) = fleet(1);
    let bucket = TokenBucket::new(quota_label("t"), Rate::per_second(10.0), fleet);
    tokio::time::sleep(Duration::from_secs(5)).await;
    let granted = granted_after(&bucket, 12).await;
    assert_eq!(millis(&granted[..10]), [0; 10], "a second's worth at once");
    assert_eq!(millis(&granted[10..]), [100, 200], "then the refill rate");
}

#[tokio::test(start_paused = true)]
async fn waiting_callers_are_served_in_the_order_they_came() {
    let (_sender, fleet) = fleet(1);
    let bucket = std::sync::Arc::new(TokenBucket::new(quota_label("t"), Rate::per_second(4.0), fleet));
    granted_after(&bucket, 4).await;
    let start = Instant::now();
    let callers: Vec<_> = (0..4)
        .map(|_| {
            let bucket = std::sync::Arc::clone(&bucket);
            tokio::spawn(async move {
                bucket.take(&Tenant::Gateway).await;
                start.elapsed()
            })
        })
        .collect();
    let mut granted = Vec::new();
    for caller in callers {
        granted.push(caller.await.unwrap());
    }
    assert_eq!(millis(&granted), [250, 500, 750, 1000]);
}

#[tokio::test(start_paused = true)]
async fn a_fleet_divides_the_rate_and_a_lost_replica_hands_its_share_back() {
    let (sender, fleet) = fleet(2);
    let bucket = TokenBucket::new(quota_label("t"), Rate::per_second(10.0), fleet);
    assert!((bucket.rate_per_second() - 5.0).abs() < 1e-9);
    granted_after(&bucket, 5).await;
    let granted = granted_after(&bucket, 2).await;
    assert_eq!(millis(&granted), [200, 400], "half the rate each");
    sender.send(counted(1)).unwrap();
    assert!((bucket.rate_per_second() - 10.0).abs() < 1e-9);
    let granted = granted_after(&bucket, 2).await;
    assert_eq!(millis(&granted), [100, 200], "the whole rate once alone");
}

#[tokio::test(start_paused = true)]
async fn a_shrinking_share_keeps_no_more_tokens_than_its_burst() {
    let (sender, fleet) = fleet(1);
    let bucket = TokenBucket::new(quota_label("t"), Rate::per_second(10.0), fleet);
    tokio::time::sleep(Duration::from_secs(5)).await;
    sender.send(counted(5)).unwrap();
    let granted = granted_after(&bucket, 3).await;
    assert_eq!(millis(&granted), [0, 0, 500], "two at once (10 / 5), then 2 per second");
}

#[tokio::test(start_paused = true)]
async fn a_refusal_empties_the_bucket() {
    let (_sender, fleet) = fleet(1);
    let bucket = TokenBucket::new(quota_label("t"), Rate::per_second(10.0), fleet);
    tokio::time::sleep(Duration::from_secs(5)).await;
    bucket.refused();
    let granted = granted_after(&bucket, 2).await;
    assert_eq!(millis(&granted), [100, 200]);
}

#[tokio::test(start_paused = true)]
async fn the_stream_quota_readings_differ_in_their_burst_only() {
    let reading = |stream_quota_reading| QuotaSettings { stream_quota_reading, ..QuotaSettings::GOOGLE };
    let hourly = reading(StreamQuotaReading::Hourly).create_write_stream();
    let per_minute = reading(StreamQuotaReading::PerMinute).create_write_stream();
    assert!((hourly.burst - 10_000.0).abs() < 1e-9);
    assert!((per_minute.burst - 10_000.0 / 60.0).abs() < 1e-9);
    assert!((hourly.per_second - per_minute.per_second).abs() < 1e-9);
    // Per minute: the 167 a minute holds, then one every 0.36 s.
    let (_sender, fleet) = fleet(1);
    let bucket = TokenBucket::new(quota_label("s"), per_minute, fleet);
    tokio::time::sleep(Duration::from_secs(3600)).await;
    let granted = granted_after(&bucket, 168).await;
    assert_eq!(granted[165], Duration::ZERO);
    assert!(granted[166] > Duration::ZERO && granted[167] > Duration::from_millis(360), "{:?}", &granted[165..]);
}

#[tokio::test(start_paused = true)]
async fn concurrent_requests_stay_within_the_share() {
    let (sender, fleet) = fleet(2);
    let share = std::sync::Arc::new(ConcurrencyShare::new("c", 4, fleet));
    let first = share.enter(&Tenant::Gateway).await;
    let _second = share.enter(&Tenant::Gateway).await;
    let waiter = {
        let share = std::sync::Arc::clone(&share);
        tokio::spawn(async move {
            let _third = share.enter(&Tenant::Gateway).await;
        })
    };
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(!waiter.is_finished(), "a third request waits while two of four are this replica's");
    drop(first);
    tokio::time::timeout(Duration::from_secs(1), waiter).await.expect("a freed place lets it in").unwrap();
    sender.send(counted(1)).unwrap();
    assert_eq!(share.limit(), 4);
}

#[tokio::test(start_paused = true)]
async fn tables_insert_waits_for_its_own_quota_and_its_method_bucket() {
    // Paced at 90%: 2 / 0.9 per second is 2 per second.
    let settings = QuotaSettings { tables_insert_per_second: 2.0 / PACE_FRACTION, ..QuotaSettings::GOOGLE };
    let quotas = Quotas::new(settings, fleet_of_one());
    let start = Instant::now();
    for _ in 0..4 {
        drop(quotas.before_rest_call(&Tenant::Gateway, "tables.insert").await);
    }
    let elapsed = start.elapsed();
    assert!(
        elapsed.abs_diff(Duration::from_millis(1000)) < Duration::from_millis(1),
        "two at once, then two at 2 per second: {elapsed:?}"
    );
    let start = Instant::now();
    drop(quotas.before_rest_call(&Tenant::Gateway, "tables.get").await);
    assert_eq!(start.elapsed(), Duration::ZERO, "another method: its own bucket, full");
}

#[tokio::test(start_paused = true)]
async fn a_waiter_gets_in_when_the_share_grows() {
    let (sender, fleet) = fleet(2);
    let quotas = following_the_fleet(2, fleet);
    let _held = quotas.concurrent_api_requests.enter(&Tenant::Gateway).await;
    let waiter = enter_in_a_task(&quotas);
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(!waiter.is_finished(), "one of two places is this replica's, and it is held");
    sender.send(counted(1)).unwrap();
    tokio::time::timeout(Duration::from_secs(1), waiter).await.expect("the larger share lets it in").unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_cancelled_wait_gives_its_token_back() {
    let (_sender, fleet) = fleet(1);
    let bucket = TokenBucket::new(quota_label("t"), Rate::per_second(10.0), fleet);
    granted_after(&bucket, 10).await;
    // Ten callers give up while waiting: their reservations are not left as debt.
    for _ in 0..10 {
        assert!(tokio::time::timeout(Duration::from_millis(1), bucket.take(&Tenant::Gateway)).await.is_err());
    }
    // 10 ms went by in those waits: the next token is 90 ms away, not a second.
    let granted = granted_after(&bucket, 1).await;
    assert_eq!(millis(&granted), [90]);
}

#[tokio::test(start_paused = true)]
async fn a_lapsed_replica_paces_no_call_until_it_is_counted_again() {
    let (sender, fleet) = fleet(2);
    let bucket = std::sync::Arc::new(TokenBucket::new(quota_label("t"), Rate::per_second(10.0), fleet));
    tokio::time::sleep(Duration::from_secs(5)).await;
    sender.send(FleetMembership::Lapsed).unwrap();
    assert_eq!(bucket.rate_per_second(), 0.0);
    let start = Instant::now();
    let caller = {
        let bucket = std::sync::Arc::clone(&bucket);
        tokio::spawn(async move {
            bucket.take(&Tenant::Gateway).await;
            start.elapsed()
        })
    };
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert!(!caller.is_finished(), "no call while lapsed, its full bucket of before included");
    assert_eq!(bucket.waiting.load(Ordering::Relaxed), 1, "the caller is counted waiting");
    sender.send(counted(1)).unwrap();
    let granted = tokio::time::timeout(Duration::from_secs(1), caller).await.expect("counted again: it goes").unwrap();
    assert_eq!(granted.as_millis(), 60_100, "from an empty bucket, at the whole rate");
    assert_eq!(bucket.waiting.load(Ordering::Relaxed), 0);
}

#[tokio::test(start_paused = true)]
async fn a_lapsed_replica_holds_no_concurrent_request() {
    let (sender, fleet) = fleet(1);
    let quotas = following_the_fleet(4, fleet);
    sender.send(FleetMembership::Lapsed).unwrap();
    assert_eq!(quotas.concurrent_api_requests.limit(), 0);
    let waiter = enter_in_a_task(&quotas);
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert!(!waiter.is_finished(), "no place while lapsed");
    sender.send(counted(3)).unwrap();
    tokio::time::timeout(Duration::from_secs(1), waiter).await.expect("counted again: a place").unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_principals_one_call_takes_its_token_one_round_after_another_principals_thousand() {
    let (_sender, fleet) = fleet(1);
    let bucket = std::sync::Arc::new(TokenBucket::new(quota_label("tables.insert"), Rate::per_second(10.0), fleet));
    granted_after(&bucket, 10).await;
    let start = Instant::now();
    let bulk: Vec<_> = (0..1_000)
        .map(|_| {
            let bucket = std::sync::Arc::clone(&bucket);
            tokio::spawn(async move { bucket.take(&Tenant::principal("bulk")).await })
        })
        .collect();
    // Paused time moves on once every bulk call waits.
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert_eq!(bucket.waiting.load(Ordering::Relaxed), 1_000, "every bulk call is counted waiting");
    bucket.take(&Tenant::principal("small")).await;
    // Bulk's first call had the turn when small came, and bulk was ahead in the round: small's
    // token is the third, not the thousand-and-first.
    assert_eq!(start.elapsed(), Duration::from_millis(300), "one round: one call of bulk's before it");
    for call in bulk {
        call.await.unwrap();
    }
    assert_eq!(start.elapsed(), Duration::from_millis(100_100), "the rate was kept: 1,001 tokens at 10 per second");
}

#[tokio::test(start_paused = true)]
async fn each_destination_paces_its_own_stream_quota() {
    let settings = QuotaSettings { create_write_streams_per_hour: 3_600.0 / PACE_FRACTION, ..QuotaSettings::GOOGLE };
    let quotas = std::sync::Arc::new(Quotas::new(settings, fleet_of_one()));
    let (a, b) = (ProjectLocation::new("a", Some("US")), ProjectLocation::new("b", Some("US")));
    let tenant = TenantQuotas::new(std::sync::Arc::clone(&quotas), Tenant::principal("p"));
    // Per minute: 60 at once, then one a second.
    for _ in 0..60 {
        tenant.before_create_write_stream(&a).await;
    }
    let start = Instant::now();
    tenant.before_create_write_stream(&b).await;
    assert_eq!(start.elapsed(), Duration::ZERO, "project b's bucket is its own, full");
    tenant.create_write_stream_refused(&b);
    tenant.before_create_write_stream(&a).await;
    assert_eq!(start.elapsed(), Duration::from_secs(1), "project a at its own pace, b's refusal aside");
}
