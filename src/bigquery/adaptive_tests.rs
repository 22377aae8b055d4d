//! Paused time: every latency below is exact, so each assertion pins one rule of the limiter.

use std::sync::atomic::{AtomicUsize, Ordering};

use super::*;
use crate::bigquery::fair::Tenant;
use crate::bigquery::per_destination::ProjectLocation;

/// A call's failure in these tests: BigQuery's pushback, or anything else.
#[derive(Debug)]
struct Refused(RetryClass);

impl Classified for Refused {
    fn retry_class(&self) -> RetryClass {
        self.0
    }
}

/// Runs `calls` calls of `latency` each through `limiter`, `at_once` of them at a time, and
/// returns the most that ran at once. `refuse(i)` makes call `i` report pushback.
async fn drive(
    limiter: &AdaptiveConcurrency,
    calls: usize,
    at_once: usize,
    latency: Duration,
    refuse: impl Fn(usize) -> bool,
) -> usize {
    let running = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let work = (0..calls).map(|i| {
        let (running, most) = (Arc::clone(&running), Arc::clone(&most));
        let refused = refuse(i);
        limiter.run(&Tenant::Gateway, async move {
            let now = running.fetch_add(1, Ordering::SeqCst) + 1;
            most.fetch_max(now, Ordering::SeqCst);
            tokio::time::sleep(latency).await;
            running.fetch_sub(1, Ordering::SeqCst);
            if refused { Err(Refused(RetryClass::Pushback)) } else { Ok(()) }
        })
    });
    let ends = futures::StreamExt::buffer_unordered(futures::stream::iter(work), at_once);
    let ends: Vec<Result<(), Refused>> = futures::StreamExt::collect(ends).await;
    assert_eq!(ends.len(), calls);
    most.load(Ordering::SeqCst)
}

#[tokio::test(start_paused = true)]
async fn the_limit_doubles_while_reached_and_stays_within_the_maximum() {
    let limiter = AdaptiveConcurrency::new("test", 40);
    assert_eq!(limiter.limit(), INITIAL_LIMIT);
    let most = drive(&limiter, 600, 100, Duration::from_millis(20), |_| false).await;
    assert_eq!(limiter.limit(), 40, "slow start reaches the maximum and stops there");
    assert!(most <= 40 && most > INITIAL_LIMIT, "at most the limit ran at once: {most}");
}

#[tokio::test(start_paused = true)]
async fn an_unreached_limit_does_not_grow() {
    let limiter = AdaptiveConcurrency::new("test", 64);
    drive(&limiter, 60, 4, Duration::from_millis(10), |_| false).await;
    assert_eq!(limiter.limit(), INITIAL_LIMIT);
}

#[tokio::test(start_paused = true)]
async fn refusals_shrink_the_limit_once_per_round_trip() {
    let limiter = AdaptiveConcurrency::new("test", 64);
    // Eight calls at once, all refused: they started under one limit, so it shrinks once.
    drive(&limiter, 8, 8, Duration::from_millis(20), |_| true).await;
    assert_eq!(limiter.limit(), 6, "8 x {REFUSAL_DECREASE}");
    // Calls started after that decrease count again.
    drive(&limiter, 4, 4, Duration::from_millis(20), |_| true).await;
    assert_eq!(limiter.limit(), 4, "6 x {REFUSAL_DECREASE}, rounded down");
    let most = drive(&limiter, 40, 40, Duration::from_millis(5), |i| i % 2 == 0).await;
    assert_eq!(limiter.limit(), 1, "never below one");
    assert!(most <= 4, "the lower limit holds calls back: {most} ran at once");
}

#[tokio::test(start_paused = true)]
async fn after_a_refusal_the_limit_grows_by_one_per_round_trip() {
    let limiter = AdaptiveConcurrency::new("test", 64);
    drive(&limiter, 8, 8, Duration::from_millis(20), |_| true).await;
    assert_eq!(limiter.limit(), 6);
    drive(&limiter, 80, 40, Duration::from_millis(20), |_| false).await;
    let limit = limiter.limit();
    // 20 round trips of 20 ms at most: additive, not doubling (which would be at 64).
    assert!(limit > 6 && limit <= 6 + 20, "{limit}");
}

#[tokio::test(start_paused = true)]
async fn calls_slowing_down_shrink_the_limit() {
    let limiter = AdaptiveConcurrency::new("test", 64);
    drive(&limiter, 64, 8, Duration::from_millis(10), |_| false).await;
    let before = limiter.limit();
    // BigQuery starts queueing: every call now takes ten times as long.
    drive(&limiter, 48, 16, Duration::from_millis(100), |_| false).await;
    assert!(limiter.limit() < before, "{} after {before}", limiter.limit());
}

#[tokio::test(start_paused = true)]
async fn a_failure_other_than_pushback_is_not_a_refusal() {
    let limiter = AdaptiveConcurrency::new("test", 64);
    let failed: Result<(), Refused> =
        limiter.run(&Tenant::Gateway, async { Err(Refused(RetryClass::Permanent)) }).await;
    assert!(failed.is_err());
    let transient: Result<(), Refused> =
        limiter.run(&Tenant::Gateway, async { Err(Refused(RetryClass::Transient)) }).await;
    assert!(transient.is_err());
    assert_eq!(limiter.limit(), INITIAL_LIMIT, "only pushback shrinks the limit");
    let refused: Result<(), Refused> =
        limiter.run(&Tenant::Gateway, async { Err(Refused(RetryClass::Pushback)) }).await;
    assert!(refused.is_err());
    assert_eq!(limiter.limit(), 6, "learned from the result of the call, with no log line involved");
}

#[tokio::test(start_paused = true)]
async fn one_projects_refusals_shrink_only_that_projects_limit() {
    let limits = AdaptiveLimits::new("test", 64);
    let (refusing, other) = (ProjectLocation::new("lowered-quota", Some("EU")), ProjectLocation::new("p", Some("EU")));
    let tenant = Tenant::principal("a");
    let calls = (0..8).map(|_| limits.run(&refusing, &tenant, refused_after(Duration::from_millis(20))));
    futures::future::join_all(calls).await;
    assert_eq!(limits.limit_of(&refusing), Some(6), "8 x {REFUSAL_DECREASE}");
    let answered: Result<(), Refused> = limits.run(&other, &Tenant::principal("b"), async { Ok(()) }).await;
    assert!(answered.is_ok());
    assert_eq!(limits.limit_of(&other), Some(INITIAL_LIMIT), "another project's limit is its own");
    let same_project_elsewhere = ProjectLocation::new("lowered-quota", Some("US"));
    assert_eq!(limits.limit_of(&same_project_elsewhere), None, "a location is a destination of its own");
    assert_eq!(limits.limit_of(&ProjectLocation::new("lowered-quota", Some("eu"))), Some(6), "case-insensitive");
}

/// A call that BigQuery refuses after `latency`.
async fn refused_after(latency: Duration) -> Result<(), Refused> {
    tokio::time::sleep(latency).await;
    Err(Refused(RetryClass::Pushback))
}

#[tokio::test(start_paused = true)]
async fn a_principals_one_set_up_waits_one_round_behind_another_principals_thousand() {
    let limits = AdaptiveLimits::new("set_up", 1);
    let destination = ProjectLocation::new("p", None);
    let started = Instant::now();
    let bulk: Vec<_> = (0..1_000)
        .map(|_| {
            let (limits, destination) = (limits.clone(), destination.clone());
            tokio::spawn(async move {
                let call = async {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    Ok::<(), Refused>(())
                };
                limits.run(&destination, &Tenant::principal("bulk"), call).await
            })
        })
        .collect();
    // Paused time moves on once every bulk call waits.
    tokio::time::sleep(Duration::from_millis(1)).await;
    let small = Tenant::principal("small");
    let served = limits.run(&destination, &small, async { Ok::<_, Refused>(started.elapsed()) }).await.unwrap();
    // The call running and the one whose turn it was when small came, then one of bulk's in
    // the round small joined: small runs third, not a thousand-and-first.
    assert_eq!(served, Duration::from_millis(300), "served within one round");
    for call in bulk {
        call.await.unwrap().unwrap();
    }
}
