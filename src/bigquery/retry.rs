//! One retry vocabulary for every call to BigQuery (vector's `RetryLogic`): what a failure
//! means ([`RetryClass`], classified once from the error, whatever the call), whether and when
//! the next attempt runs ([`RetryPolicy`]: attempts, [`Backoff`], quota wait; one type, each
//! caller handed its value by `app.rs`), the failures counted since the last progress
//! ([`FailureStreak`]), and one event per failed attempt ([`Retried`]: `bigquery.write.retry`,
//! naming the operation).
//!
//! A failure is retried at one level only: a REST call retries BigQuery's pushback under its
//! client's policy (`bigquery::rest_call`), unless its caller retries the whole step itself and
//! hands the client [`RetryPolicy::ONCE`] (set-up, a publication's job); the appender and
//! `CreateWriteStream` retry their own calls; a publication runs a failed job again under a new
//! job id (`publish::destination`).
//!
//! The same answer to BigQuery's pushback everywhere: a REST 429 or `rateLimitExceeded` /
//! `quotaExceeded`, a gRPC `RESOURCE_EXHAUSTED`, a job that failed `rateLimitExceeded` or
//! `jobRateLimitExceeded` are [`RetryClass::Pushback`]: retried after a backoff, more slowly
//! and for longer than a transient failure.

use std::fmt::Display;
use std::time::Duration;

use tokio::time::Instant;

use super::BigQueryError;
use crate::telemetry;

/// What a failed attempt means for the next one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RetryClass {
    /// The connection or the service failed in passing: the same call may succeed at once.
    Transient,
    /// BigQuery pushed back (quota, rate limit): retry after a longer wait.
    Pushback,
    /// Retrying cannot help (a refusal, a data error, a missing permission).
    Permanent,
}

impl RetryClass {
    pub(crate) fn of(error: &BigQueryError) -> Self {
        if error.is_pushback() {
            RetryClass::Pushback
        } else if error.is_retryable() || error.is_transient_job_failure() {
            RetryClass::Transient
        } else {
            RetryClass::Permanent
        }
    }
}

/// Anything whose failure can say what it means for the next attempt (the adaptive limiter
/// learns BigQuery's pushback from it).
pub(crate) trait Classified {
    fn retry_class(&self) -> RetryClass;
}

impl Classified for BigQueryError {
    fn retry_class(&self) -> RetryClass {
        RetryClass::of(self)
    }
}

/// Exponential backoff with jitter: before retry `attempt` (1-based) a delay uniform in
/// `[ceiling / 2, ceiling]`, where the ceiling doubles from `initial` up to `max` (half jitter:
/// attempts of many callers spread out, and none retries at once).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Backoff {
    pub(crate) initial: Duration,
    pub(crate) max: Duration,
}

impl Backoff {
    pub(crate) const fn new(initial: Duration, max: Duration) -> Self {
        Self { initial, max }
    }

    /// The delay before retry `attempt` (1-based).
    pub(crate) fn delay(&self, attempt: u32) -> Duration {
        let exponent = attempt.saturating_sub(1).min(20);
        let ceiling = self.initial.saturating_mul(1 << exponent).min(self.max);
        let half = ceiling / 2;
        half + half.mul_f64(rand::random::<f64>())
    }
}

/// What to do after a failed attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RetryAction {
    /// Try again after this delay.
    RetryAfter(Duration),
    /// Give up: the failure is the caller's answer.
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

/// How a caller retries its calls to BigQuery. Two budgets, both counted since the last
/// progress ([`FailureStreak`]):
/// - a transient failure is tried again up to `max_attempts` attempts, after `backoff`;
/// - pushback (a quota, which may take minutes to refill) is tried again, whatever the attempt
///   count, until it has lasted `quota_wait`, after `quota_backoff`: a quota slows a run down,
///   it does not fail one a slower pace completes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RetryPolicy {
    /// Attempts per call, the first included (pushback aside).
    pub(crate) max_attempts: u32,
    /// Delays between attempts after a transient failure.
    pub(crate) backoff: Backoff,
    /// How long pushback is waited out before the call fails.
    pub(crate) quota_wait: Duration,
    /// Delays between attempts while BigQuery pushes back.
    pub(crate) quota_backoff: Backoff,
}

impl RetryPolicy {
    /// One attempt and no retry: for a call whose caller retries the whole step itself.
    pub(crate) const ONCE: RetryPolicy = RetryPolicy {
        max_attempts: 1,
        backoff: Backoff::new(Duration::ZERO, Duration::ZERO),
        quota_wait: Duration::ZERO,
        quota_backoff: Backoff::new(Duration::ZERO, Duration::ZERO),
    };

    /// The decision after `failed_attempts` consecutive failures of this class (this one
    /// included); `quota_failing_for` is how long BigQuery has pushed back.
    pub(crate) fn decide(&self, class: RetryClass, failed_attempts: u32, quota_failing_for: Duration) -> RetryAction {
        match class {
            RetryClass::Pushback => self.decide_quota(failed_attempts, quota_failing_for),
            RetryClass::Transient if failed_attempts < self.max_attempts => {
                RetryAction::RetryAfter(self.backoff.delay(failed_attempts))
            }
            _ => RetryAction::Fail,
        }
    }

    /// The decision after `failed_attempts` consecutive refusals, BigQuery pushing back for
    /// `failing_for`: wait it out until `quota_wait`.
    fn decide_quota(&self, failed_attempts: u32, failing_for: Duration) -> RetryAction {
        let Some(remaining) = self.quota_wait.checked_sub(failing_for).filter(|r| !r.is_zero()) else {
            return RetryAction::Fail;
        };
        RetryAction::RetryAfter(self.quota_backoff.delay(failed_attempts).min(remaining))
    }
}

/// Consecutive failed attempts since the last progress, counted apart by kind.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct FailureStreak {
    /// Failed attempts other than pushback.
    attempts: u32,
    /// Attempts BigQuery pushed back on.
    quota_attempts: u32,
    /// When the first pushback of the streak happened.
    quota_since: Option<Instant>,
}

impl FailureStreak {
    /// Progress: the next failure starts a new streak.
    pub(crate) fn reset(&mut self) {
        *self = Self::default();
    }

    /// Failed attempts in the streak so far, of either kind (the next attempt is this plus one).
    pub(crate) fn attempts(&self) -> u32 {
        self.attempts + self.quota_attempts
    }

    /// Counts a failure of `class` and returns its attempt number (within its kind) and the
    /// decision.
    pub(crate) fn record(&mut self, policy: &RetryPolicy, class: RetryClass) -> (u32, RetryAction) {
        if class == RetryClass::Pushback {
            self.quota_attempts += 1;
            let failing_for = self.quota_since.get_or_insert_with(Instant::now).elapsed();
            (self.quota_attempts, policy.decide_quota(self.quota_attempts, failing_for))
        } else {
            self.attempts += 1;
            (self.attempts, policy.decide(class, self.attempts, Duration::ZERO))
        }
    }
}

/// One failed attempt of a call to BigQuery: `bigquery.write.retry` (WARN) with the operation,
/// and the retry counters.
#[derive(Debug)]
pub(crate) struct Retried<'a, E: Display> {
    /// `AppendRows`, `CreateWriteStream`, `tables.insert`, `query job`, ...
    pub(crate) operation: &'static str,
    /// The resource whose call failed, when there is one.
    pub(crate) resource: Option<&'a str>,
    /// The gRPC code or the kind of failure (`UNAVAILABLE`, `quota`, `rateLimitExceeded`).
    pub(crate) code: &'a str,
    pub(crate) class: RetryClass,
    /// The failed attempt's number within its budget.
    pub(crate) attempt: u32,
    /// How long until the next attempt; `None` when there is none.
    pub(crate) delay: Option<Duration>,
    /// Row offset of the first unacknowledged request (appends).
    pub(crate) offset: Option<i64>,
    pub(crate) error: &'a E,
}

impl Retried<'_, BigQueryError> {
    /// Reports a failed call to BigQuery whose code and class are `error`'s own; `delay` is the
    /// wait before the next attempt (`None`: there is none).
    pub(crate) fn emit_failed_call(
        operation: &'static str,
        resource: &str,
        error: &BigQueryError,
        attempt: u32,
        delay: Option<Duration>,
        offset: Option<i64>,
    ) {
        let code = error.code_name();
        let class = RetryClass::of(error);
        Retried { operation, resource: Some(resource), code: &code, class, attempt, delay, offset, error }.emit();
    }
}

impl<E: Display> Retried<'_, E> {
    pub(crate) fn emit(&self) {
        let retryable = self.delay.is_some();
        if retryable {
            metrics::counter!(telemetry::BIGQUERY_RETRIES, "operation" => self.operation, "code" => self.code.to_string())
                .increment(1);
            if self.operation == "AppendRows" {
                metrics::counter!(telemetry::APPEND_RETRIES, "code" => self.code.to_string()).increment(1);
            }
        }
        let (operation, code, attempt) = (self.operation, self.code, self.attempt);
        let resource = self.resource.unwrap_or("");
        let delay_ms = self.delay.map(|d| d.as_millis() as u64);
        let class = format!("{:?}", self.class).to_ascii_lowercase();
        tracing::warn!(operation, resource, offset = self.offset, code, class, retryable, attempt, delay_ms,
            error = %self.error, "bigquery.write.retry");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_with_jitter_up_to_its_ceiling() {
        let backoff = Backoff::new(Duration::from_millis(200), Duration::from_secs(10));
        for attempt in 1..30 {
            let ceiling =
                Duration::from_millis(200).saturating_mul(1 << (attempt - 1).min(20)).min(Duration::from_secs(10));
            let delay = backoff.delay(attempt);
            assert!(delay >= ceiling / 2 && delay <= ceiling, "attempt {attempt}: {delay:?}");
        }
    }

    #[test]
    fn pushback_is_one_class_whatever_the_call() {
        let grpc = BigQueryError::Grpc {
            operation: "AppendRows",
            status: tonic::Status::resource_exhausted("Exceeds 'AppendRows throughput' quota"),
        };
        let job = BigQueryError::JobFailed { reason: "jobRateLimitExceeded".into(), message: "too many".into() };
        let unavailable = BigQueryError::Grpc { operation: "AppendRows", status: tonic::Status::unavailable("x") };
        let refused = BigQueryError::JobFailed { reason: "invalidQuery".into(), message: "bad".into() };
        assert_eq!((RetryClass::of(&grpc), RetryClass::of(&job)), (RetryClass::Pushback, RetryClass::Pushback));
        assert_eq!(RetryClass::of(&unavailable), RetryClass::Transient);
        assert_eq!(RetryClass::of(&refused), RetryClass::Permanent);
    }

    fn policy() -> RetryPolicy {
        RetryPolicy {
            max_attempts: 8,
            backoff: Backoff::new(Duration::from_millis(200), Duration::from_secs(10)),
            quota_wait: Duration::from_secs(900),
            quota_backoff: Backoff::new(Duration::from_millis(200), Duration::from_secs(30)),
        }
    }

    #[test]
    fn retries_retryable_failures_until_the_attempts_run_out() {
        let policy = policy();
        let unavailable = BigQueryError::grpc("AppendRows")(tonic::Status::unavailable("gone"));
        assert!(matches!(policy.decide(RetryClass::of(&unavailable), 1, Duration::ZERO), RetryAction::RetryAfter(_)));
        assert!(matches!(policy.decide(RetryClass::of(&unavailable), 7, Duration::ZERO), RetryAction::RetryAfter(_)));
        assert_eq!(
            policy.decide(RetryClass::of(&unavailable), 8, Duration::ZERO),
            RetryAction::Fail,
            "the eighth is the last"
        );
        let invalid = BigQueryError::grpc("AppendRows")(tonic::Status::invalid_argument("bad"));
        assert_eq!(policy.decide(RetryClass::of(&invalid), 1, Duration::ZERO), RetryAction::Fail);
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
                let RetryAction::RetryAfter(delay) =
                    policy.decide(RetryClass::of(quota), attempt, Duration::from_secs(60))
                else {
                    panic!("attempt {attempt} is retried while the wait lasts");
                };
                assert!(delay <= Duration::from_secs(30), "backoff capped at 30 s: {delay:?}");
            }
            // The last delay ends with the wait; past it the execution fails.
            let RetryAction::RetryAfter(last) = policy.decide(RetryClass::of(quota), 40, Duration::from_secs(899))
            else {
                panic!("retried until the wait is over");
            };
            assert!(last <= Duration::from_secs(1), "{last:?}");
            assert_eq!(policy.decide(RetryClass::of(quota), 2, Duration::from_secs(900)), RetryAction::Fail);
        }
    }

    #[test]
    fn a_streak_counts_quota_failures_apart_and_progress_resets_it() {
        let policy = RetryPolicy { max_attempts: 2, quota_wait: Duration::from_secs(3600), ..policy() };
        let quota = BigQueryError::grpc("AppendRows")(tonic::Status::resource_exhausted("quota"));
        let unavailable = BigQueryError::grpc("AppendRows")(tonic::Status::unavailable("gone"));
        let mut streak = FailureStreak::default();
        for expected in 1..=20 {
            let (attempt, action) = streak.record(&policy, RetryClass::of(&quota));
            assert_eq!(attempt, expected);
            assert!(matches!(action, RetryAction::RetryAfter(_)));
        }
        assert!(matches!(streak.record(&policy, RetryClass::of(&unavailable)), (1, RetryAction::RetryAfter(_))));
        assert_eq!(streak.record(&policy, RetryClass::of(&unavailable)), (2, RetryAction::Fail));
        streak.reset();
        assert!(matches!(streak.record(&policy, RetryClass::of(&unavailable)), (1, RetryAction::RetryAfter(_))));
    }
}
