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
    let status =
        BigQueryError::grpc("AppendRows")(tonic::Status::resource_exhausted("Exceeds 'AppendRows throughput' quota"));
    let code = tonic::Code::ResourceExhausted;
    let in_response = BigQueryError::InResponse { operation: "AppendRows", code, message: "quota".into() };
    for quota in [&status, &in_response] {
        for attempt in [1, 8, 50, 500] {
            let RetryAction::RetryAfter(delay) = policy.decide(RetryClass::of(quota), attempt, Duration::from_secs(60))
            else {
                panic!("attempt {attempt} is retried while the wait lasts");
            };
            assert!(delay <= Duration::from_secs(30), "backoff capped at 30 s: {delay:?}");
        }
        // The last delay ends with the wait; past it the execution fails.
        let RetryAction::RetryAfter(last) = policy.decide(RetryClass::of(quota), 40, Duration::from_secs(899)) else {
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

/// The driver's tests: paused time, so the waits are the policy's, to the millisecond.
mod driver {
    use std::sync::atomic::{AtomicU32, Ordering};

    use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusRecorder};
    use tokio::time::Instant;

    use super::super::*;

    const ATTEMPTS: u32 = 4;
    const QUOTA_WAIT: Duration = Duration::from_secs(60);

    fn policy() -> RetryPolicy {
        RetryPolicy {
            max_attempts: ATTEMPTS,
            backoff: Backoff::new(Duration::from_millis(200), Duration::from_secs(1)),
            quota_wait: QUOTA_WAIT,
            quota_backoff: Backoff::new(Duration::from_secs(1), Duration::from_secs(8)),
        }
    }

    /// An answer of one attempt: its number, or the class it failed with.
    type Answer = Result<u32, RetryClass>;

    fn judged(answer: &Answer) -> Option<Failure> {
        let class = *answer.as_ref().err()?;
        Some(Failure { class, code: format!("{class:?}"), error: "failed".into() })
    }

    /// Attempts failing with `class` until attempt `succeeds_at` (never when `None`).
    fn attempts(class: RetryClass, succeeds_at: Option<u32>) -> impl FnMut(u32) -> std::future::Ready<Answer> {
        move |n| std::future::ready(if Some(n) == succeeds_at { Ok(n) } else { Err(class) })
    }

    /// The `filament_bigquery_retries_total` of `operation` the recorder counted.
    fn retries(recorder: &PrometheusRecorder, operation: &str) -> u32 {
        let rendered = recorder.handle().render();
        let line = rendered.lines().find(|l| {
            l.starts_with("filament_bigquery_retries_total{") && l.contains(&format!("operation=\"{operation}\""))
        });
        line.and_then(|l| l.rsplit(' ').next()?.parse().ok()).unwrap_or(0)
    }

    #[tokio::test(start_paused = true)]
    async fn transient_failures_are_retried_up_to_the_policys_attempts() {
        let recorder = PrometheusBuilder::new().build_recorder();
        let _local = metrics::set_default_local_recorder(&recorder);
        let policy = policy();
        let tried = AtomicU32::new(0);
        let counted = |n| {
            tried.fetch_add(1, Ordering::SeqCst);
            attempts(RetryClass::Transient, None)(n)
        };
        let started = Instant::now();
        let answer = RetryDriver::new(&policy, "transient").run(judged, counted).await;
        assert_eq!(answer, Err(RetryClass::Transient));
        assert_eq!(tried.load(Ordering::SeqCst), ATTEMPTS);
        assert_eq!(retries(&recorder, "transient"), ATTEMPTS - 1, "one retry counted per retried attempt");
        // Three backoffs of at most 200 ms, 400 ms, 800 ms, each at least half of it.
        let waited = started.elapsed();
        assert!(waited >= Duration::from_millis(700) && waited <= Duration::from_millis(1400), "{waited:?}");

        let answer = RetryDriver::new(&policy, "recovers").run(judged, attempts(RetryClass::Transient, Some(3))).await;
        assert_eq!(answer, Ok(3), "an attempt that succeeds ends the retries");
        assert_eq!(retries(&recorder, "recovers"), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn permanent_failures_and_answers_are_not_retried() {
        let recorder = PrometheusBuilder::new().build_recorder();
        let _local = metrics::set_default_local_recorder(&recorder);
        let policy = policy();
        let started = Instant::now();
        let answer = RetryDriver::new(&policy, "permanent").run(judged, attempts(RetryClass::Permanent, None)).await;
        assert_eq!(answer, Err(RetryClass::Permanent));
        let answer = RetryDriver::new(&policy, "answered").run(judged, attempts(RetryClass::Transient, Some(1))).await;
        assert_eq!(answer, Ok(1));
        let not_judged = |_: &Answer| None;
        let answer = RetryDriver::new(&policy, "answer").run(not_judged, attempts(RetryClass::Transient, None)).await;
        assert_eq!(answer, Err(RetryClass::Transient), "a failure the caller does not judge one is its answer");
        assert_eq!(started.elapsed(), Duration::ZERO, "no wait");
        assert_eq!((retries(&recorder, "permanent"), retries(&recorder, "answer")), (0, 0));
    }

    #[tokio::test(start_paused = true)]
    async fn pushback_is_waited_out_for_the_quota_wait_and_tells_the_hook() {
        let recorder = PrometheusBuilder::new().build_recorder();
        let _local = metrics::set_default_local_recorder(&recorder);
        let policy = policy();
        let refusals = AtomicU32::new(0);
        let hook = || {
            refusals.fetch_add(1, Ordering::SeqCst);
        };
        let tried = AtomicU32::new(0);
        let counted = |n| {
            tried.fetch_add(1, Ordering::SeqCst);
            attempts(RetryClass::Pushback, None)(n)
        };
        let started = Instant::now();
        let driver = RetryDriver::new(&policy, "pushback").resource("t").on_pushback(&hook);
        let answer = driver.run(judged, counted).await;
        assert_eq!(answer, Err(RetryClass::Pushback));
        assert_eq!(started.elapsed(), QUOTA_WAIT, "waited the quota wait, the last delay cut to its end");
        let tried = tried.load(Ordering::SeqCst);
        assert!(tried > ATTEMPTS, "pushback is retried by time, not attempts: {tried}");
        assert_eq!(refusals.load(Ordering::SeqCst), tried, "the hook hears every pushback");
        assert_eq!(retries(&recorder, "pushback"), tried - 1);

        let hook_unheard = || panic!("no pushback");
        let driver = RetryDriver::new(&policy, "transient").on_pushback(&hook_unheard);
        assert_eq!(driver.run(judged, attempts(RetryClass::Transient, Some(2))).await, Ok(2));
    }

    #[tokio::test(start_paused = true)]
    async fn pushback_and_transient_failures_keep_their_own_budgets() {
        let policy = policy();
        // Pushback on every other attempt: the transient ones still fail after their attempts.
        let mixed =
            |n: u32| std::future::ready(Err(if n % 2 == 1 { RetryClass::Pushback } else { RetryClass::Transient }));
        let tried = AtomicU32::new(0);
        let counted = |n| {
            tried.fetch_add(1, Ordering::SeqCst);
            mixed(n)
        };
        assert_eq!(RetryDriver::new(&policy, "mixed").run(judged, counted).await, Err(RetryClass::Transient));
        assert_eq!(tried.load(Ordering::SeqCst), 2 * ATTEMPTS, "four transient failures, four pushbacks");
    }
}
