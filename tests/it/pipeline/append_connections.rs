//! AppendRows connections against BigQuery's concurrent-connection limit (10,000 per project
//! in a multi-region): lanes take a connection before their first request, give it back once
//! idle, and stay under `FILAMENT_MAX_APPEND_CONNECTIONS`; a project whose connections are
//! taken slows the run down (RESOURCE_EXHAUSTED is retried) and, if they never come free,
//! fails it with a retryable `quota_exceeded`, never a hung request. The fake counts open
//! calls and refuses those beyond its limit, as BigQuery does. Scaled down: N resources
//! against a limit of N / 10 behave as 10,000 against 1,000 (`make bench` runs 10,000).

use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde_json::json;
use tokio::time::Instant;

use crate::support::arrow::{ids, ipc_stream};
use crate::support::fake_write::{FakeWrite, assert_exact_stream};
use crate::support::rows::post_ids;
use crate::support::{Gateway, GatewayOptions, TestRun, eventually};

const FAST_RETRY: Duration = Duration::from_millis(20);
const OPEN_CONNECTIONS: &str = "filament_append_connections_open";

/// `count` resources, `r0` ... , each posted 7 rows of its own ids, then committed.
async fn post_to_resources_and_commit(gw: &Gateway, count: usize) -> serde_json::Value {
    post_to_resources(gw, count).await;
    gw.commit_and_wait("run", "e").await
}

async fn post_to_resources(gw: &Gateway, count: usize) {
    let resources: Vec<String> = (0..count).map(|i| format!("r{i}")).collect();
    let names: Vec<&str> = resources.iter().map(String::as_str).collect();
    TestRun::new("run", "e").full_append(&names).open(gw).await;
    for (i, resource) in names.iter().enumerate() {
        let first = i as i64 * 100;
        post_ids(gw, resource, first..first + 7).await;
    }
}

fn assert_every_stream_exact(fake: &FakeWrite, count: usize) {
    for i in 0..count {
        let first = i as i64 * 100;
        assert_exact_stream(&fake.stream_for(&format!("_filament_stg_r{i}_")), first..first + 7);
    }
}

/// The Storage Write fake refusing connections beyond `limit` (BigQuery's concurrent-connection
/// limit, scaled down), answering every staging append after `answer_delay`.
async fn fake_with_connection_limit(limit: usize, answer_delay: Duration) -> FakeWrite {
    let fake = FakeWrite::start().await;
    fake.with(|s| {
        s.connection_limit = Some(limit);
        s.table_delays = vec![("_filament_stg_".into(), answer_delay)];
    });
    fake
}

#[tokio::test(flavor = "multi_thread")]
async fn more_resources_than_connections_all_load_within_the_gateways_cap() {
    // BigQuery's limit, with answers slow enough that connections overlap.
    let fake = fake_with_connection_limit(4, Duration::from_millis(50)).await;
    let gw = GatewayOptions::new().fake_write(&fake).env("FILAMENT_MAX_APPEND_CONNECTIONS", "4").spawn().await;
    let committed = post_to_resources_and_commit(&gw, 40).await;
    assert_eq!(committed["state"], "committed", "{committed}");
    assert_every_stream_exact(&fake, 40);
    let (opened, most_open, refused) = fake.with(|s| (s.connections, s.max_open_connections, s.refused_connections));
    assert!(opened >= 40, "one connection per resource at least: {opened}");
    assert!(most_open <= 4, "{most_open} connections were open at once, above the cap of 4");
    assert_eq!(refused, 0, "the gateway's cap kept it under BigQuery's limit");
    assert_eq!(gw.metric(OPEN_CONNECTIONS).await, Some(0.0), "every connection was given back");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_idle_lane_gives_its_connection_back_and_opens_another_for_its_next_batch() {
    let fake = FakeWrite::start().await;
    let gw = GatewayOptions::new().fake_write(&fake).env("FILAMENT_APPEND_CONNECTION_IDLE_SECS", "2").spawn().await;
    TestRun::new("run", "e").batching(json!({"flush_interval_ms": 50})).full_append(&["t"]).open(&gw).await;
    post_ids(&gw, "t", 0..7).await;
    eventually(Duration::from_secs(20), "the first batch's connection is closed once idle", || async {
        let (rows, open) = fake.with(|s| (s.streams.values().map(|st| st.rows).sum::<i64>(), s.open_connections));
        (rows == 7 && open == 0).then_some(())
    })
    .await;
    assert_eq!(gw.metric(OPEN_CONNECTIONS).await, Some(0.0));
    post_ids(&gw, "t", 7..12).await;
    let committed = gw.commit_and_wait("run", "e").await;
    assert_eq!(committed["state"], "committed", "{committed}");
    // The second connection carried the writer schema again: its rows decoded and landed.
    assert_exact_stream(&fake.stream_for("_filament_stg_t_"), 0..12);
    assert_eq!(fake.with(|s| s.connections), 2, "one connection per batch, the first closed while idle");
}

/// The 10,000-resource case scaled down: the gateway's cap (1,000 by default) is above what
/// the project has left, so BigQuery refuses connections; lanes back off and retry, and every
/// row still arrives once.
#[tokio::test(flavor = "multi_thread")]
async fn connections_refused_by_bigquery_slow_the_run_and_every_row_still_loads() {
    let fake = fake_with_connection_limit(3, Duration::from_millis(200)).await;
    let gw = GatewayOptions::new().fake_write(&fake).bigquery_initial_backoff(FAST_RETRY).spawn().await;
    post_to_resources(&gw, 30).await;
    // Every lane set up before the commit, so that their first appends start together: set-ups
    // paced by the tables.insert quota would otherwise let lanes finish one after another.
    eventually(Duration::from_secs(30), "every lane has its stream", || async {
        (fake.with(|s| s.streams.len()) == 30).then_some(())
    })
    .await;
    let committed = gw.commit_and_wait("run", "e").await;
    assert_eq!(committed["state"], "committed", "{committed}");
    assert_every_stream_exact(&fake, 30);
    let (most_open, refused) = fake.with(|s| (s.max_open_connections, s.refused_connections));
    assert!(refused > 0, "the limit was reached: no connection was refused");
    assert!(most_open <= 3, "{most_open} open at once");
    let retries = r#"filament_append_retries_total{code="RESOURCE_EXHAUSTED"}"#;
    assert!(gw.metric(retries).await.unwrap_or(0.0) >= 1.0, "{}", gw.metrics().await);
}

/// Connections that never come free: the run fails with a retryable `quota_exceeded` once
/// `FILAMENT_QUOTA_WAIT_SECS` has passed, its commit answered, nothing published.
#[tokio::test(flavor = "multi_thread")]
async fn connections_that_never_come_free_fail_the_execution_retryably_without_hanging() {
    let fake = FakeWrite::start().await;
    fake.with(|s| s.connection_limit = Some(0));
    let gw = GatewayOptions::new()
        .fake_write(&fake)
        .bigquery_initial_backoff(FAST_RETRY)
        .env("FILAMENT_QUOTA_WAIT_SECS", "2")
        .spawn()
        .await;
    TestRun::new("run", "e").full_append(&["a", "b", "c"]).open(&gw).await;
    for resource in ["a", "b", "c"] {
        let (status, body) = gw.post_batch("run", "e", resource, None, ipc_stream(&[ids(0..7)])).await;
        assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    }
    let started = Instant::now();
    let (status, body) = gw.json(Method::POST, "/v1/runs/run/executions/e/commit?wait=true", None).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["state"], "failed", "{body}");
    assert_eq!(body["error"]["code"], "quota_exceeded", "a retryable answer: {body}");
    assert!(started.elapsed() < Duration::from_secs(60), "answered, not hung: {:?}", started.elapsed());
    let (refused, any_committed) = fake.with(|s| (s.refused_connections, s.streams.values().any(|st| st.committed)));
    assert!(refused > 3, "every lane kept trying: {refused} refusals");
    assert!(!any_committed, "nothing was committed");
    assert_eq!(gw.metric(OPEN_CONNECTIONS).await, Some(0.0), "the failed lanes gave their places back");
}
