//! The execution timeline (`GET .../events`, issue 24, item 2) against the real gateway and
//! Postgres: an injected append retry (coalesced into one event with its count), the commit's
//! streams, its plan and publication job, the end state, in order; a failed publication job with its
//! code; polling with `after` returns only what is new; a set-up recorded under its old kind
//! (`prepare_finished`) reads as `set_up_finished`.

use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde_json::Value;
use sqlx::Connection as _;

use crate::support::arrow::{ids, ipc_stream};
use crate::support::fake_write::{AppendFault, FakeWrite};
use crate::support::rest_proxy::{JobMode, one_batch_behind_a_proxy};
use crate::support::{Gateway, GatewayOptions, TestRun, assert_problem, eventually};

async fn events(gw: &Gateway, after: i64) -> Value {
    let (status, page) = gw.json(Method::GET, &format!("/v1/runs/r/executions/e/events?after={after}"), None).await;
    assert_eq!(status, StatusCode::OK, "{page}");
    page
}

/// Waits until BigQuery acknowledged `rows` rows of resource `t`.
async fn acknowledged(gw: &Gateway, rows: i64) {
    eventually(Duration::from_secs(30), "the rows to be acknowledged", || async {
        let (_, execution) = gw.json(Method::GET, "/v1/runs/r/executions/e", None).await;
        (execution["resources"][0]["rows_acknowledged"] == rows).then_some(())
    })
    .await;
}

fn kinds(page: &Value) -> Vec<String> {
    page["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|event| match event["resource"].as_str() {
            Some(resource) => format!("{}:{resource}", event["kind"].as_str().unwrap()),
            None => event["kind"].as_str().unwrap().to_string(),
        })
        .collect()
}

fn event<'a>(page: &'a Value, kind: &str) -> &'a Value {
    page["events"].as_array().unwrap().iter().find(|e| e["kind"] == kind).unwrap_or_else(|| panic!("{kind} in {page}"))
}

#[tokio::test(flavor = "multi_thread")]
async fn the_timeline_shows_a_coalesced_retry_the_commit_and_the_end_in_order() {
    let fake = FakeWrite::start().await;
    fake.script([AppendFault::Status(tonic::Code::Unavailable), AppendFault::Status(tonic::Code::Unavailable)]);
    let gw = GatewayOptions::new().fake_write(&fake).bigquery_initial_backoff(Duration::from_millis(20)).spawn().await;
    TestRun::new("r", "e").full_append(&["t"]).open(&gw).await;
    gw.post_accepted("r", "e", "t", Some(0), ipc_stream(&[ids(0..10)])).await;
    acknowledged(&gw, 10).await;
    let before_commit = events(&gw, 0).await;
    assert_eq!(kinds(&before_commit), ["delivery_started", "set_up_finished:t", "append_retried:t"]);
    let retried = event(&before_commit, "append_retried");
    assert_eq!(
        (retried["count"].as_i64(), retried["detail"]["code"].as_str()),
        (Some(2), Some("UNAVAILABLE")),
        "{retried}"
    );
    assert_eq!(retried["detail"]["retryable"], true);
    assert!(event(&before_commit, "set_up_finished")["detail"]["duration_ms"].is_u64());

    let cursor = before_commit["next_after"].as_i64().unwrap();
    assert_eq!(gw.commit_and_wait("r", "e").await["state"], "committed");
    let after_commit = events(&gw, cursor).await;
    assert_eq!(
        kinds(&after_commit),
        [
            "commit_started",
            "stream_committed:t",
            "planned:t",
            "publication_started:t",
            "publication_finished:t",
            "ended"
        ],
        "only what is new since the cursor, in order"
    );
    assert_eq!(event(&after_commit, "stream_committed")["detail"]["rows"], 10);
    // The stream's two events are written by the statements that change its staging row.
    let mut db = sqlx::PgConnection::connect(&gw.database_url).await.unwrap();
    let (stream_name, created, committed): (Option<String>, bool, bool) = sqlx::query_as(
        "SELECT stream_name, stream_created_at IS NOT NULL, committed_at IS NOT NULL FROM staging_streams
         WHERE run_id = 'r' AND execution_id = 'e' AND resource = 't'",
    )
    .fetch_one(&mut db)
    .await
    .unwrap();
    let committed_stream = event(&after_commit, "stream_committed")["detail"]["stream"].as_str();
    assert_eq!((stream_name.as_deref(), created, committed), (committed_stream, true, true));
    let published = event(&after_commit, "publication_finished");
    assert!(published["detail"]["job_id"].as_str().is_some_and(|id| id.starts_with("filament_")), "{published}");
    assert_eq!(event(&after_commit, "publication_started")["detail"]["job_id"], published["detail"]["job_id"]);
    assert_eq!(event(&after_commit, "ended")["detail"]["state"], "committed");
    let ids: Vec<i64> =
        after_commit["events"].as_array().unwrap().iter().map(|e| e["event_id"].as_i64().unwrap()).collect();
    assert!(ids.windows(2).all(|pair| pair[0] < pair[1]) && ids[0] > cursor, "{ids:?}");
    let nothing_new = events(&gw, after_commit["next_after"].as_i64().unwrap()).await;
    assert_eq!(kinds(&nothing_new), Vec::<String>::new());
    assert_eq!(nothing_new["next_after"], after_commit["next_after"], "the cursor stays where it was");
    assert_problem(
        gw.json(Method::GET, "/v1/runs/r/executions/e/events?after=-1", None).await,
        StatusCode::BAD_REQUEST,
        "invalid_request",
    );
    assert_problem(
        gw.json(Method::GET, "/v1/runs/nope/executions/e/events", None).await,
        StatusCode::NOT_FOUND,
        "run_not_found",
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_failed_publication_job_and_the_failed_end_carry_their_code() {
    let (proxy, _fake, gw) = one_batch_behind_a_proxy(0..5).await;
    // The commit may begin while the lane still sets up; waiting makes the order one.
    acknowledged(&gw, 5).await;
    proxy.set_jobs(JobMode::invalid_query("", "Query error: boom"));
    assert_eq!(gw.commit_and_wait("r", "e").await["state"], "failed");
    let timeline = events(&gw, 0).await;
    assert_eq!(
        kinds(&timeline),
        [
            "delivery_started",
            "set_up_finished:t",
            "commit_started",
            "stream_committed:t",
            "planned:t",
            "publication_started:t",
            "publication_failed:t",
            "ended"
        ]
    );
    let failed = event(&timeline, "publication_failed");
    assert_eq!(failed["detail"]["code"], "publication_failed", "{failed}");
    assert!(failed["detail"]["job_id"].is_string(), "{failed}");
    let ended = event(&timeline, "ended");
    assert_eq!(
        (ended["detail"]["state"].as_str(), ended["detail"]["code"].as_str()),
        (Some("failed"), Some("publication_failed"))
    );
}

/// A failure outside a commit (an append BigQuery refuses for good, while extracting) ends the
/// timeline too, with its code, written by the same statement that fails the execution.
#[tokio::test(flavor = "multi_thread")]
async fn an_upload_failure_while_extracting_ends_the_timeline_with_its_code() {
    let fake = FakeWrite::start().await;
    fake.script([AppendFault::InResponseError(3)]);
    let gw = GatewayOptions::new().fake_write(&fake).spawn().await;
    TestRun::new("r", "e").full_append(&["t"]).open(&gw).await;
    gw.post_accepted("r", "e", "t", Some(0), ipc_stream(&[ids(0..10)])).await;
    eventually(Duration::from_secs(30), "the execution to fail", || async {
        let (_, execution) = gw.json(Method::GET, "/v1/runs/r/executions/e", None).await;
        (execution["state"] == "failed").then_some(())
    })
    .await;
    let timeline = events(&gw, 0).await;
    let kinds = kinds(&timeline);
    assert_eq!(kinds.last().map(String::as_str), Some("ended"), "{timeline}");
    assert_eq!(kinds.iter().filter(|kind| *kind == "ended").count(), 1, "{timeline}");
    let ended = event(&timeline, "ended");
    assert_eq!(
        (ended["detail"]["state"].as_str(), ended["detail"]["code"].as_str()),
        (Some("failed"), Some("upload_failed"))
    );
}

/// A gateway whose upload budget (1 MiB) fills from a dozen 128 KiB batches while the fake
/// acknowledges each append only after `ack_delay`, batch requests waiting at most `wait`.
async fn gateway_with_a_small_budget(ack_delay: Duration, wait: Duration) -> (FakeWrite, Gateway) {
    const BUDGET: &str = "1048576";
    let fake = FakeWrite::start().await;
    fake.with(|s| s.table_delays.push((String::new(), ack_delay)));
    let gw = GatewayOptions::new()
        .fake_write(&fake)
        .env("FILAMENT_MAX_BUFFERED_BYTES", BUDGET)
        .env("FILAMENT_MAX_BUFFERED_BYTES_PER_RESOURCE", BUDGET)
        .env("FILAMENT_BACKPRESSURE_WAIT_MS", &wait.as_millis().to_string())
        .spawn()
        .await;
    TestRun::new("r", "e").full_append(&["t"]).open(&gw).await;
    (fake, gw)
}

const ROWS_PER_BATCH: i64 = 8192;

/// The timeline's backpressure event of resource `t`, once it is recorded (after the request
/// answered) and satisfies `done`.
async fn backpressure_event(gw: &Gateway, done: impl Fn(&Value) -> bool) -> Value {
    eventually(Duration::from_secs(10), "the backpressure event", || async {
        let page = events(gw, 0).await;
        let found: Vec<Value> =
            page["events"].as_array().unwrap().iter().filter(|e| e["kind"] == "backpressure_waited").cloned().collect();
        assert!(found.len() <= 2, "waits of one resource coalesce: {found:?}");
        found.last().filter(|event| done(event)).cloned()
    })
    .await
}

/// Batches that wait for room in the budget and then go on are one coalesced event, its
/// `count` the waits and `total_ms` their sum. (Batches that did not wait 100 ms record
/// nothing: the other timelines here have no such event.)
#[tokio::test(flavor = "multi_thread")]
async fn batches_that_waited_for_the_budget_are_one_event_with_their_total_wait() {
    let (_fake, gw) = gateway_with_a_small_budget(Duration::from_millis(1500), Duration::from_secs(20)).await;
    for batch in 0..14 {
        let rows = batch * ROWS_PER_BATCH..(batch + 1) * ROWS_PER_BATCH;
        gw.post_accepted("r", "e", "t", Some(batch), ipc_stream(&[ids(rows)])).await;
    }
    // 14 batches of 128 KiB cannot all fit in 1 MiB: some waited for the acknowledgements.
    let waited = backpressure_event(&gw, |_| true).await;
    assert_eq!((waited["resource"].as_str(), waited["detail"]["code"].as_str()), (Some("t"), Some("backpressure")));
    assert_eq!(waited["detail"]["refused"], 0, "{waited}");
    let (count, total_ms, latest_ms) = (
        waited["count"].as_i64().unwrap(),
        waited["detail"]["total_ms"].as_i64().unwrap(),
        waited["detail"]["waited_ms"].as_i64().unwrap(),
    );
    assert!(latest_ms >= 100 && total_ms >= 100 * count && total_ms >= latest_ms, "{waited}");
}

/// A batch refused with 429 after waiting out the backpressure wait is counted too.
#[tokio::test(flavor = "multi_thread")]
async fn a_batch_refused_for_backpressure_is_on_the_timeline_with_its_wait() {
    let (_fake, gw) = gateway_with_a_small_budget(Duration::from_secs(20), Duration::from_millis(300)).await;
    let mut refused = None;
    for batch in 0..14 {
        let rows = batch * ROWS_PER_BATCH..(batch + 1) * ROWS_PER_BATCH;
        let (status, answer) = gw.post_batch("r", "e", "t", Some(batch), ipc_stream(&[ids(rows)])).await;
        if status == StatusCode::TOO_MANY_REQUESTS {
            refused = Some(answer);
            break;
        }
        assert_eq!(status, StatusCode::ACCEPTED, "{answer}");
    }
    let refused = refused.expect("14 batches of 128 KiB filled a 1 MiB budget acknowledged after 20 s");
    assert_eq!(refused["code"], "backpressure", "{refused}");
    let waited = backpressure_event(&gw, |event| event["detail"]["refused"] == 1).await;
    let latest_ms = waited["detail"]["waited_ms"].as_i64().unwrap();
    assert!((100..=300).contains(&latest_ms), "at most the 300 ms backpressure wait: {waited}");
}

/// `set_up_finished` was `prepare_finished` before its rename: a row a replica of the previous
/// release records under the old kind (during a rolling upgrade) reads under the new one.
#[tokio::test(flavor = "multi_thread")]
async fn a_set_up_recorded_under_its_old_kind_reads_as_set_up_finished() {
    let gw = GatewayOptions::new().spawn().await;
    TestRun::new("r", "e").full_append(&["t"]).open(&gw).await;
    gw.post_accepted("r", "e", "t", Some(0), ipc_stream(&[ids(0..10)])).await;
    acknowledged(&gw, 10).await;
    let mut db = sqlx::PgConnection::connect(&gw.database_url).await.unwrap();
    let renamed = sqlx::query("UPDATE execution_events SET kind = 'prepare_finished' WHERE kind = 'set_up_finished'")
        .execute(&mut db)
        .await
        .unwrap();
    assert_eq!(renamed.rows_affected(), 1);
    assert_eq!(kinds(&events(&gw, 0).await), ["delivery_started", "set_up_finished:t"]);
}
