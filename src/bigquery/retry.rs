//! One retry vocabulary for every call to BigQuery (vector's `RetryLogic`): what a failure
//! means ([`RetryClass`], classified once from the error, whatever the call), whether and when
//! the next attempt runs ([`RetryPolicy`]: attempts, [`Backoff`], quota wait; one type, each
//! caller handed its value by `app.rs`), the failures counted since the last progress
//! ([`FailureStreak`]), one event per failed attempt ([`Retried`]: `bigquery.write.retry`,
//! naming the operation), and the loop that runs them ([`RetryDriver`]).
//!
//! One loop retries: the [`RetryDriver`] runs an operation's attempts under one policy; it
//! owns the [`FailureStreak`], emits [`Retried`], calls the quota hook on pushback and sleeps
//! the policy's delay; the caller only says what a failed attempt is ([`Failure`], from the
//! attempt's answer). A failure is retried at one level only, by construction: the REST client
//! makes each call once (`bigquery::rest_call`, no policy), and the driver wraps the step at one
//! place per operation: set-up as a whole (`pipeline::lane::set_up`), `CreateWriteStream`, a
//! publication's job under a new job id (`publish::publication_job`), a widening's or a
//! connection test's job on `jobs.insert` pushback, a job's polls and `jobs.get`
//! (`bigquery::jobs`), a metadata call that is a step of its own
//! (`BigQuery::retrying_pushback`). The appender keeps its own loop over a connection's requests
//! (replays, reconnects) and uses the same [`FailureStreak`] and [`Retried`].
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
            telemetry::bigquery_call_retried(self.operation, self.code);
        }
        let (operation, code, attempt) = (self.operation, self.code, self.attempt);
        let resource = self.resource.unwrap_or("");
        let delay_ms = self.delay.map(|d| d.as_millis() as u64);
        let class = format!("{:?}", self.class).to_ascii_lowercase();
        tracing::warn!(operation, resource, offset = self.offset, code, class, retryable, attempt, delay_ms,
            error = %self.error, "bigquery.write.retry");
    }
}

/// How one failed attempt is reported and judged: its class, its code (`quota`, the gRPC code, the
/// HTTP status) and what went wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Failure {
    pub(crate) class: RetryClass,
    pub(crate) code: String,
    pub(crate) error: String,
}

impl Failure {
    /// A failed call to BigQuery, with the class and code of its error.
    pub(crate) fn of(error: &BigQueryError) -> Self {
        Self { class: RetryClass::of(error), code: error.code_name(), error: error.to_string() }
    }

    /// BigQuery's pushback on a REST call (`code`: `quota`).
    pub(crate) fn pushback(error: &impl Display) -> Self {
        Self { class: RetryClass::Pushback, code: "quota".into(), error: error.to_string() }
    }
}

/// The one retry loop: runs an operation's attempts under one [`RetryPolicy`]. It owns the
/// streak of failures ([`FailureStreak`]), reports each failed attempt ([`Retried`]), tells the
/// quota when BigQuery pushed back (the `on_pushback` hook) and sleeps the policy's delay. What a
/// failure is the caller says (vector's `RetryLogic`): a function of the attempt's answer,
/// `None` when the answer is the operation's (a success, or a failure not to retry nor report).
#[derive(Clone, Copy)]
pub(crate) struct RetryDriver<'a> {
    policy: &'a RetryPolicy,
    operation: &'static str,
    resource: Option<&'a str>,
    on_pushback: Option<&'a (dyn Fn() + Send + Sync)>,
}

impl<'a> RetryDriver<'a> {
    pub(crate) fn new(policy: &'a RetryPolicy, operation: &'static str) -> Self {
        Self { policy, operation, resource: None, on_pushback: None }
    }

    /// The resource whose calls these are (named in the [`Retried`] event).
    pub(crate) fn resource(self, resource: &'a str) -> Self {
        Self { resource: Some(resource), ..self }
    }

    /// Called after each attempt BigQuery pushed back on, before the wait (a quota's pace).
    pub(crate) fn on_pushback(self, hook: &'a (dyn Fn() + Send + Sync)) -> Self {
        Self { on_pushback: Some(hook), ..self }
    }

    /// Runs `attempt` (given its 1-based number) until `failure` says its answer is the
    /// operation's, or the policy gives up; returns the last answer.
    pub(crate) async fn run<R, Fut>(
        self,
        failure: impl Fn(&R) -> Option<Failure>,
        mut attempt: impl FnMut(u32) -> Fut,
    ) -> R
    where
        Fut: Future<Output = R>,
    {
        let mut streak = FailureStreak::default();
        loop {
            let answer = attempt(streak.attempts() + 1).await;
            let Some(Failure { class, code, error }) = failure(&answer) else { return answer };
            if class == RetryClass::Pushback
                && let Some(hook) = self.on_pushback
            {
                hook();
            }
            let (attempt, action) = streak.record(self.policy, class);
            let (operation, resource, delay) = (self.operation, self.resource, action.delay());
            Retried { operation, resource, code: &code, class, attempt, delay, offset: None, error: &error }.emit();
            match delay {
                Some(delay) => tokio::time::sleep(delay).await,
                None => return answer,
            }
        }
    }
}

#[cfg(test)]
#[path = "retry_tests.rs"]
mod tests;
