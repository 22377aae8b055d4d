//! Quota answers from BigQuery's REST API are a passing condition, not a refusal: retried with
//! backoff, and when they persist reported as `quota_exceeded` with the quota named.

use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde_json::json;
use tokio::time::Instant;

use crate::support::GatewayOptions;
use crate::support::fake_rest::{FakeRest, RestAnswer, bigquery_error};

#[tokio::test(flavor = "multi_thread")]
async fn rest_quota_answers_are_retried_then_reported_as_quota_exceeded() {
    let quotas = [
        ("busy-project", 403, "quotaExceeded", "Quota exceeded: Your project exceeded quota for concurrent queries."),
        ("rated-project", 429, "rateLimitExceeded", "Exceeded rate limits: too many api requests per user per method"),
    ];
    let mut answers = Vec::new();
    for (project, status, reason, message) in quotas {
        let path: &'static str = Box::leak(format!("/projects/{project}/jobs").into_boxed_str());
        let name = if status == 403 { "PERMISSION_DENIED" } else { "RESOURCE_EXHAUSTED" };
        answers.push(RestAnswer {
            method: "POST",
            path_contains: path,
            status,
            body: bigquery_error(status, name, message, reason, vec![]),
        });
    }
    let fake = FakeRest::start(answers).await;
    let gw = GatewayOptions::new().fake_rest(&fake).spawn().await;
    for (project, _, _, message) in quotas {
        let started = Instant::now();
        let (status, problem) = gw.json(Method::POST, "/v1/connections/test", Some(json!({"project": project}))).await;
        assert_eq!(problem["code"], "quota_exceeded", "{project}: {problem}");
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{problem}");
        assert!(problem["detail"].as_str().unwrap().contains(message), "{problem}");
        assert!(problem["hint"].as_str().unwrap().contains("quota"), "{problem}");
        let attempts = fake.hits("POST", &format!("/projects/{project}/jobs"));
        assert!(attempts >= 4, "{project}: the quota answer was retried ({attempts} attempts)");
        assert!(started.elapsed() < Duration::from_secs(15), "{project}: answered in {:?}", started.elapsed());
    }
    let metrics = gw.metrics().await;
    let series: Vec<&str> = metrics.lines().filter(|l| l.starts_with("filament_bigquery_retries_total{")).collect();
    let retried_inserts: f64 = series
        .iter()
        .filter(|line| line.contains("operation=\"jobs.insert\""))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert!(retried_inserts >= 8.0, "each retry is counted: {series:?}");
    assert!(series.iter().all(|line| line.contains("operation=\"jobs.insert\"")), "only job inserts: {series:?}");
}
