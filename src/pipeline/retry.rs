//! The retry budget of a lane's Storage Write calls (AppendRows, CreateWriteStream): whether a
//! failed attempt is tried again, and after how long. What a failure means is classified once
//! ([`RetryClass`]) and the delays are the shared [`Backoff`] (`bigquery::retry`, the one retry
//! vocabulary of every BigQuery call).
//!
//! Two budgets, both counted since the last acknowledgement (progress resets them):
//! - a retryable failure is tried again up to `max_attempts` attempts;
//! - `RESOURCE_EXHAUSTED` (BigQuery's AppendRows throughput quota, which may take minutes to
//!   refill) is tried again, whatever the attempt count, until it has lasted `quota_wait`,
//!   with backoff capped at `max_quota_backoff`; then the execution fails `quota_exceeded`.

use std::time::Duration;

use tokio::time::Instant;

use crate::bigquery::BigQueryError;
use crate::bigquery::retry::{Backoff, RetryClass};

/// What to do after a failed attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RetryAction {
    /// Reconnect after this delay and replay every unacknowledged request.
    RetryAfter(Duration),
    /// Give up: the lane fails its execution.
    Fail,
}

impl RetryAction {
    /// The delay before the next attempt, when there is one.
    pub(crate) fn delay(self) -> Option<Duration> {
        match self {
            RetryAction::RetryAfter(delay) => Some(delay),
            RetryAction::Fail => None,
        }
    }
}

#[derive(Debug, Clone, Copy)]
pub(crate) struct RetryPolicy {
    /// Attempts per request, the first included (quota failures aside).
    pub(crate) max_attempts: u32,
    /// Delays between attempts after a transient failure.
    pub(crate) backoff: Backoff,
    /// How long `RESOURCE_EXHAUSTED` is waited out before the execution fails.
    pub(crate) quota_wait: Duration,
    /// Delays between attempts while the quota is exhausted (longer at the most).
    pub(crate) quota_backoff: Backoff,
    /// How long the oldest request in flight waits for its answer before the attempt fails
    /// (retryable, as a broken connection).
    pub(crate) response_timeout: Duration,
    /// How long a request waits for the connection to take it (a peer that stopped reading
    /// holds it in HTTP/2 flow control) before the attempt fails, retryable.
    pub(crate) send_timeout: Duration,
}

/// Consecutive failed attempts since the last acknowledgement, as the appender counts them.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct FailureStreak {
    /// Failed attempts other than quota ones.
    attempts: u32,
    /// Failed attempts answered `RESOURCE_EXHAUSTED`.
    quota_attempts: u32,
    /// When the first quota failure of the streak happened.
    quota_since: Option<Instant>,
}

impl FailureStreak {
    /// Progress: the next failure starts a new streak.
    pub(crate) fn reset(&mut self) {
        *self = Self::default();
    }

    /// Counts a quota answer that outlasted a call's own retries (`quota_exceeded`) and returns
    /// its attempt number and the decision.
    pub(crate) fn record_quota(&mut self, policy: &RetryPolicy) -> (u32, RetryAction) {
        self.quota_attempts += 1;
        let failing_for = self.quota_since.get_or_insert_with(Instant::now).elapsed();
        (self.quota_attempts, policy.decide_quota(self.quota_attempts, failing_for))
    }

    /// Counts `error` and returns the attempt number (within its kind) and the decision.
    pub(crate) fn record(&mut self, policy: &RetryPolicy, error: &BigQueryError) -> (u32, RetryAction) {
        if RetryClass::of(error) == RetryClass::Pushback {
            self.record_quota(policy)
        } else {
            self.attempts += 1;
            (self.attempts, policy.decide(error, self.attempts, Duration::ZERO))
        }
    }
}

impl RetryPolicy {
    /// The decision after `failed_attempts` consecutive failures of this kind (this one
    /// included); `quota_failing_for` is how long the quota has been exhausted (pushback).
    pub(crate) fn decide(
        &self,
        error: &BigQueryError,
        failed_attempts: u32,
        quota_failing_for: Duration,
    ) -> RetryAction {
        match RetryClass::of(error) {
            RetryClass::Pushback => self.decide_quota(failed_attempts, quota_failing_for),
            RetryClass::Transient if failed_attempts < self.max_attempts => {
                RetryAction::RetryAfter(self.backoff.delay(failed_attempts))
            }
            _ => RetryAction::Fail,
        }
    }

    /// The decision after `failed_attempts` consecutive quota answers, the quota exhausted
    /// for `failing_for`: wait it out until `quota_wait`.
    fn decide_quota(&self, failed_attempts: u32, failing_for: Duration) -> RetryAction {
        let Some(remaining) = self.quota_wait.checked_sub(failing_for).filter(|r| !r.is_zero()) else {
            return RetryAction::Fail;
        };
        RetryAction::RetryAfter(self.quota_backoff.delay(failed_attempts).min(remaining))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> RetryPolicy {
        RetryPolicy {
            max_attempts: 8,
            backoff: Backoff::new(Duration::from_millis(200), Duration::from_secs(10)),
            quota_wait: Duration::from_secs(900),
            quota_backoff: Backoff::new(Duration::from_millis(200), Duration::from_secs(30)),
            response_timeout: Duration::from_secs(300),
            send_timeout: Duration::from_secs(60),
        }
    }

    #[test]
    fn retries_retryable_failures_until_the_attempts_run_out() {
        let policy = policy();
        let unavailable = BigQueryError::grpc("AppendRows")(tonic::Status::unavailable("gone"));
        assert!(matches!(policy.decide(&unavailable, 1, Duration::ZERO), RetryAction::RetryAfter(_)));
        assert!(matches!(policy.decide(&unavailable, 7, Duration::ZERO), RetryAction::RetryAfter(_)));
        assert_eq!(policy.decide(&unavailable, 8, Duration::ZERO), RetryAction::Fail, "the eighth is the last");
        let invalid = BigQueryError::grpc("AppendRows")(tonic::Status::invalid_argument("bad"));
        assert_eq!(policy.decide(&invalid, 1, Duration::ZERO), RetryAction::Fail);
    }

    #[test]
    fn an_exhausted_quota_is_waited_out_by_time_not_attempts() {
        let policy = policy();
        let status = BigQueryError::grpc("AppendRows")(tonic::Status::resource_exhausted(
            "Exceeds 'AppendRows throughput' quota",
        ));
        let code = tonic::Code::ResourceExhausted;
        let in_response = BigQueryError::InResponse { operation: "AppendRows", code, message: "quota".into() };
        for quota in [&status, &in_response] {
            for attempt in [1, 8, 50, 500] {
                let RetryAction::RetryAfter(delay) = policy.decide(quota, attempt, Duration::from_secs(60)) else {
                    panic!("attempt {attempt} is retried while the wait lasts");
                };
                assert!(delay <= Duration::from_secs(30), "backoff capped at 30 s: {delay:?}");
            }
            // The last delay ends with the wait; past it the execution fails.
            let RetryAction::RetryAfter(last) = policy.decide(quota, 40, Duration::from_secs(899)) else {
                panic!("retried until the wait is over");
            };
            assert!(last <= Duration::from_secs(1), "{last:?}");
            assert_eq!(policy.decide(quota, 2, Duration::from_secs(900)), RetryAction::Fail);
        }
    }

    #[test]
    fn a_streak_counts_quota_failures_apart_and_progress_resets_it() {
        let policy = RetryPolicy { max_attempts: 2, quota_wait: Duration::from_secs(3600), ..policy() };
        let quota = BigQueryError::grpc("AppendRows")(tonic::Status::resource_exhausted("quota"));
        let unavailable = BigQueryError::grpc("AppendRows")(tonic::Status::unavailable("gone"));
        let mut streak = FailureStreak::default();
        for expected in 1..=20 {
            let (attempt, action) = streak.record(&policy, &quota);
            assert_eq!(attempt, expected);
            assert!(matches!(action, RetryAction::RetryAfter(_)));
        }
        assert!(matches!(streak.record(&policy, &unavailable), (1, RetryAction::RetryAfter(_))));
        assert_eq!(streak.record(&policy, &unavailable), (2, RetryAction::Fail));
        streak.reset();
        assert!(matches!(streak.record(&policy, &unavailable), (1, RetryAction::RetryAfter(_))));
    }
}
