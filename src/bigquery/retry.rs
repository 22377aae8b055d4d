//! One retry vocabulary for every call to BigQuery (vector's `RetryLogic`): what a failure
//! means ([`RetryClass`], classified once from the error, whatever the call), how long to wait
//! before the next attempt ([`Backoff`]: exponential with jitter), and one event per failed
//! attempt ([`Retried`]: `bigquery.write.retry`, naming the operation). Each caller keeps its own
//! budget of attempts: the appender counts failures without progress and waits a quota out by
//! time (`pipeline::retry`), a REST call retries pushback a few times (`bigquery::rest_call`), a
//! publication runs a failed job again under a new job id (`publish::destination`).
//!
//! The same answer to BigQuery's pushback everywhere: a REST 429 or `rateLimitExceeded` /
//! `quotaExceeded`, a gRPC `RESOURCE_EXHAUSTED`, a job that failed `rateLimitExceeded` or
//! `jobRateLimitExceeded` are [`RetryClass::Pushback`]: retried after a backoff, more slowly
//! and for longer than a transient failure.

use std::fmt::Display;
use std::time::Duration;

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
        if self.class == RetryClass::Pushback {
            super::adaptive::note_pushback();
        }
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
}
