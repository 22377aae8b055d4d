//! Bounded waiting: every poll in the suite has a deadline and, when it passes, says what it
//! waited for instead of hanging the run.

use std::future::Future;
use std::time::Duration;

/// How long `eventually` sleeps between two tries.
const POLL_INTERVAL: Duration = Duration::from_millis(20);

/// Calls `probe` until it answers `Some`, sleeping briefly between tries, and returns that value.
/// Panics naming `what` once `timeout` has passed, including when a single try outlives it.
///
/// The probe is a closure returning a future (`|| async { .. }`) rather than an async closure:
/// the futures of async closures are not known to be `Send` inside `tokio::spawn`.
pub async fn eventually<T, F, P>(timeout: Duration, what: &str, probe: P) -> T
where
    P: FnMut() -> F,
    F: Future<Output = Option<T>>,
{
    within(timeout, POLL_INTERVAL, probe)
        .await
        .unwrap_or_else(|| panic!("gave up after {timeout:?} waiting for {what}"))
}

/// Calls `probe` every `interval` until it answers `Some` and returns that value, or `None` once
/// `timeout` has passed (a try that outlives it included): for callers that say themselves what
/// they gave up on, or that try at a pace of their own (a client retrying after a pause).
pub async fn within<T, F, P>(timeout: Duration, interval: Duration, mut probe: P) -> Option<T>
where
    P: FnMut() -> F,
    F: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        match tokio::time::timeout_at(deadline, probe()).await {
            Ok(Some(value)) => return Some(value),
            Ok(None) if tokio::time::Instant::now() < deadline => tokio::time::sleep(interval).await,
            Ok(None) | Err(_) => return None,
        }
    }
}

#[cfg(test)]
mod tests {
    #[allow(unused_imports)] // `benches/ingest.rs` includes this file; its tests do not run there
    use super::*;

    #[tokio::test(start_paused = true)]
    #[should_panic(expected = "gave up after 1s waiting for the answer")]
    async fn a_probe_that_never_answers_fails_naming_what_it_waited_for() {
        eventually(Duration::from_secs(1), "the answer", || async { None::<()> }).await;
    }

    #[tokio::test(start_paused = true)]
    #[should_panic(expected = "gave up after 1s waiting for a slow answer")]
    async fn a_probe_that_outlives_the_deadline_fails_too() {
        eventually(Duration::from_secs(1), "a slow answer", || async {
            tokio::time::sleep(Duration::from_secs(3600)).await;
            Some(())
        })
        .await;
    }

    #[tokio::test(start_paused = true)]
    async fn the_first_answer_is_returned() {
        let mut tries = 0;
        let answer = eventually(Duration::from_secs(1), "the third try", || {
            tries += 1;
            std::future::ready((tries == 3).then_some(tries))
        })
        .await;
        assert_eq!(answer, 3);
    }

    #[tokio::test(start_paused = true)]
    async fn within_tries_at_its_interval_and_answers_none_after_the_deadline() {
        let started = tokio::time::Instant::now();
        let mut tries = 0;
        let answer = within(Duration::from_secs(1), Duration::from_millis(300), || {
            tries += 1;
            std::future::ready(None::<()>)
        })
        .await;
        assert_eq!(answer, None);
        assert!((4..=5).contains(&tries), "tries at 0, 0.3, 0.6 and 0.9 s (and one at the deadline): {tries}");
        assert!(started.elapsed() >= Duration::from_secs(1));
    }
}
