//! Adaptive concurrency against BigQuery's quotas (`bigquery::adaptive`): a storm of refusals
//! on CreateWriteStream (the project's stream-creation rate) and on query jobs (its concurrent
//! queries) slows the gateway down, shows in `/metrics` as the limit backing off, and completes
//! the run with every row exactly once. Not timed: the assertions are on rows and counters.

use std::time::Duration;

use crate::support::fake_write::{FakeWrite, assert_exact_stream};
use crate::support::rows::{count_rows_and_ids, post_ids};
use crate::support::{Gateway, GatewayOptions, TestRun};

const FAST_RETRY: Duration = Duration::from_millis(20);

/// The value of `series` in the gateway's `/metrics`, 0 when it is not exported.
async fn metric_or_zero(gw: &Gateway, series: &str) -> f64 {
    gw.metric(series).await.unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_create_write_stream_refusal_storm_backs_set_up_off_and_loses_no_row() {
    let fake = FakeWrite::start().await;
    // Two streams a second, each taking 100 ms: eight set-ups at once are refused at once.
    fake.with(|s| {
        s.create_rate_per_second = Some(2);
        s.create_delay = Duration::from_millis(100);
    });
    let gw = GatewayOptions::new()
        .fake_write(&fake)
        .bigquery_initial_backoff(FAST_RETRY)
        .env("FILAMENT_MAX_CONCURRENT_SET_UPS", "32")
        .spawn()
        .await;
    let resources: Vec<String> = (0..16).map(|i| format!("r{i}")).collect();
    let names: Vec<&str> = resources.iter().map(String::as_str).collect();
    TestRun::new("run", "e").full_append(&names).open(&gw).await;
    for (i, resource) in names.iter().enumerate() {
        let first = i as i64 * 100;
        post_ids(&gw, resource, first..first + 7).await;
    }
    let committed = gw.commit_and_wait("run", "e").await;
    assert_eq!(committed["state"], "committed", "{committed}");
    for (i, resource) in names.iter().enumerate() {
        let first = i as i64 * 100;
        assert_exact_stream(&fake.stream_for(&format!("_filament_stg_{resource}_")), first..first + 7);
    }
    let refused = fake.with(|s| s.refused_creates);
    assert!(refused > 0, "the storm happened: no CreateWriteStream was refused");
    let decreases = r#"filament_bigquery_concurrency_decreases_total{operation="stream_creation",reason="refusal"}"#;
    assert!(metric_or_zero(&gw, decreases).await >= 1.0, "{}", gw.metrics().await);
    let limit = gw.metric(r#"filament_bigquery_concurrency_limit{operation="stream_creation"}"#).await;
    assert!(
        limit.is_some_and(|limit| limit < 8.0),
        "the stream-creation limit backed off below its start (8): {limit:?}"
    );
    let retries = r#"filament_bigquery_retries_total{operation="CreateWriteStream",code="RESOURCE_EXHAUSTED"}"#;
    assert!(metric_or_zero(&gw, retries).await >= refused as f64, "every refusal was retried");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_query_job_refusal_storm_backs_publication_off_and_publishes_every_row_once() {
    let gw = GatewayOptions::new().bigquery_initial_backoff(FAST_RETRY).spawn().await;
    let proxy = gw.rest_conformance.clone().expect("the harness proxies REST calls");
    let resources: Vec<String> = (0..6).map(|i| format!("q{i}")).collect();
    let names: Vec<&str> = resources.iter().map(String::as_str).collect();
    TestRun::new("run", "e").full_append(&names).open(&gw).await;
    for resource in &names {
        post_ids(&gw, resource, 0..25).await;
    }
    // More refusals than the calls' own retries (five attempts each): every publication is
    // refused to the end of its REST retries and runs again under its next job id.
    proxy.state.lock().unwrap().refuse_job_inserts = 34;
    let committed = gw.commit_and_wait("run", "e").await;
    assert_eq!(committed["state"], "committed", "{committed}");
    for resource in &names {
        assert_eq!(count_rows_and_ids(&gw, resource).await, (25, 25), "{resource}: every row once");
    }
    assert_eq!(proxy.state.lock().unwrap().refused_job_inserts, 34, "the storm happened");
    let job_ids: Vec<String> = proxy
        .requests("POST", "/jobs")
        .iter()
        .filter_map(|r| r.body["jobReference"]["jobId"].as_str().map(str::to_string))
        .collect();
    assert!(job_ids.iter().any(|id| id.ends_with("-a2")), "refused jobs ran again under a new id: {job_ids:?}");
    let decreases = r#"filament_bigquery_concurrency_decreases_total{operation="publication",reason="refusal"}"#;
    assert!(metric_or_zero(&gw, decreases).await >= 1.0, "{}", gw.metrics().await);
    assert!(gw.metric(r#"filament_bigquery_concurrency_limit{operation="publication"}"#).await.is_some());
    let publications = r#"filament_publications_total{outcome="done"}"#;
    assert_eq!(metric_or_zero(&gw, publications).await, 6.0, "each destination published once");
}
