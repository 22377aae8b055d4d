//! The retry decision of the appender, in one place (vector's `RetryLogic`): whether a failed
//! AppendRows attempt is tried again, and after how long (exponential backoff with full
//! jitter, a bounded number of attempts). What BigQuery failures are retryable at all is
//! classified once, by [`BigQueryError::is_retryable`].

use std::time::Duration;

use crate::bigquery::BigQueryError;

/// What to do after a failed attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RetryAction {
    /// Reconnect after this delay and replay every unacknowledged request.
    RetryAfter(Duration),
    /// Give up: the lane fails its execution.
    Fail,
}

#[derive(Debug, Clone, Copy)]
pub(crate) struct RetryPolicy {
    /// Attempts per request, the first included.
    pub(crate) max_attempts: u32,
    pub(crate) initial_backoff: Duration,
    pub(crate) max_backoff: Duration,
}

impl RetryPolicy {
    /// The decision after `failed_attempts` consecutive failures (this one included).
    pub(crate) fn decide(&self, error: &BigQueryError, failed_attempts: u32) -> RetryAction {
        if error.is_retryable() && failed_attempts < self.max_attempts {
            RetryAction::RetryAfter(self.backoff(failed_attempts))
        } else {
            RetryAction::Fail
        }
    }

    /// Delay before retry number `attempt` (1-based): uniform in [ceiling/2, ceiling], where the
    /// ceiling doubles from `initial_backoff` up to `max_backoff`.
    pub(crate) fn backoff(&self, attempt: u32) -> Duration {
        let exponent = attempt.saturating_sub(1).min(20);
        let ceiling = self.initial_backoff.saturating_mul(1 << exponent).min(self.max_backoff);
        let half = ceiling / 2;
        half + half.mul_f64(rand::random::<f64>())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> RetryPolicy {
        RetryPolicy {
            max_attempts: 8,
            initial_backoff: Duration::from_millis(200),
            max_backoff: Duration::from_secs(10),
        }
    }

    #[test]
    fn backoff_grows_with_jitter_and_is_capped() {
        let policy = policy();
        for attempt in 1..=12 {
            let ceiling = (Duration::from_millis(200) * 2u32.pow(attempt.min(20) - 1)).min(Duration::from_secs(10));
            let delay = policy.backoff(attempt);
            assert!(delay >= ceiling / 2 && delay <= ceiling, "attempt {attempt}: {delay:?}");
        }
    }

    #[test]
    fn retries_retryable_failures_until_the_attempts_run_out() {
        let policy = policy();
        let unavailable = BigQueryError::grpc("AppendRows")(tonic::Status::unavailable("gone"));
        assert!(matches!(policy.decide(&unavailable, 1), RetryAction::RetryAfter(_)));
        assert!(matches!(policy.decide(&unavailable, 7), RetryAction::RetryAfter(_)));
        assert_eq!(policy.decide(&unavailable, 8), RetryAction::Fail, "the eighth failure is the last attempt");
        let invalid = BigQueryError::grpc("AppendRows")(tonic::Status::invalid_argument("bad"));
        assert_eq!(policy.decide(&invalid, 1), RetryAction::Fail);
    }
}
