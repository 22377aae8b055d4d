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
pub async fn eventually<T, F, P>(timeout: Duration, what: &str, mut probe: P) -> T
where
    P: FnMut() -> F,
    F: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        match tokio::time::timeout_at(deadline, probe()).await {
            Ok(Some(value)) => return value,
            Ok(None) if tokio::time::Instant::now() < deadline => tokio::time::sleep(POLL_INTERVAL).await,
            Ok(None) | Err(_) => panic!("gave up after {timeout:?} waiting for {what}"),
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
}
