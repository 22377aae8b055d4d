//! Uploads that hold up under real conditions: an exhausted Storage Write quota is waited out
//! (then `quota_exceeded`), a network that cuts every connection still loads every row once, a
//! dataset in another location fails the execution before any row is uploaded, and the queue
//! timing counts every wait that can end in 429.

use std::sync::Arc;
use std::time::Duration;

use arrow_array::{Int64Array, StringArray};
use arrow_schema::{DataType, Field};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use tokio::time::Instant;

use crate::support::arrow::{batch, ids, ipc_stream};
use crate::support::fake_write::{AppendFault, FakeWrite, assert_exact_stream};
use crate::support::proxy::CuttingProxy;
use crate::support::rows::post_ok;
use crate::support::{Gateway, GatewayOptions, eventually};

fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

async fn gateway_on_fake(fake: &FakeWrite, extra: &[(&str, &str)]) -> Gateway {
    let mut env = env(&[("BIGQUERY_STORAGE_EMULATOR_HOST", &fake.address)]);
    env.extend(self::env(extra));
    Gateway::spawn_with(GatewayOptions { env, ..Default::default() }).await
}

/// Run `run` with `destination` extras and `batching`, resources full_append, execution `e` open.
async fn prepare_run(gw: &Gateway, destination: Value, batching: Value, resources: &[&str]) {
    let mut target = json!({"project": gw.project, "dataset": gw.dataset});
    if let (Some(target), Some(extra)) = (target.as_object_mut(), destination.as_object()) {
        target.extend(extra.clone());
    }
    let run = json!({"run_id": "run", "destination": target, "batching": batching});
    let (status, body) = gw.json(Method::POST, "/v1/runs", Some(run)).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    for resource in resources {
        gw.declare("run", resource, json!({"write_mode": "full_append"})).await;
    }
    assert_eq!(gw.open_execution("run", "e").await.0, StatusCode::CREATED);
}

/// The append retries of `code` the timeline of execution `e` recorded: one event whose `count`
/// is the failed attempts and whose detail is the latest one's.
async fn recorded_retry(gw: &Gateway, code: &str) -> Value {
    let (status, timeline) = gw.json(Method::GET, "/v1/runs/run/executions/e/events", None).await;
    assert_eq!(status, StatusCode::OK, "{timeline}");
    let events = timeline["events"].as_array().expect("the timeline's events");
    let retried = events.iter().find(|event| event["kind"] == "append_retried" && event["detail"]["code"] == code);
    retried.cloned().unwrap_or_else(|| panic!("an append_retried event of {code} in {timeline}"))
}

#[tokio::test(flavor = "multi_thread")]
async fn an_exhausted_quota_is_waited_out_beyond_the_attempt_limit_and_loads_every_row_once() {
    let fake = FakeWrite::start().await;
    fake.with(|s| s.table_delays.push((String::new(), Duration::from_millis(10))));
    // Ten answers in a row (status and in-response): more than the eight attempts a
    // connection failure gets.
    fake.script((0..10).map(|i| {
        if i % 2 == 0 { AppendFault::Status(tonic::Code::ResourceExhausted) } else { AppendFault::InResponseError(8) }
    }));
    let gw =
        gateway_on_fake(&fake, &[("FILAMENT_BIGQUERY_INITIAL_BACKOFF_MS", "5"), ("FILAMENT_QUOTA_WAIT_SECS", "120")])
            .await;
    prepare_run(&gw, json!({}), json!({"max_rows": 10}), &["t"]).await;
    for batch in 0..10 {
        post_ok(&gw, "t", ipc_stream(&[ids(batch * 10..batch * 10 + 10)])).await;
    }
    let committed = gw.commit_and_wait("run", "e").await;
    assert_eq!(committed["state"], "committed", "{committed}\n{}", gw.logs());
    assert_exact_stream(&fake.stream_for("_filament_stg_t_"), 0..100);
    let retried = recorded_retry(&gw, "RESOURCE_EXHAUSTED").await;
    assert_eq!(retried["count"], 10, "{retried}");
    assert_eq!(retried["detail"]["retryable"], true, "{retried}");
    assert_eq!(retried["detail"]["attempt"], 10, "counted past the attempt limit: {retried}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_quota_that_does_not_refill_answers_backpressure_then_fails_with_quota_exceeded() {
    const QUOTA_WAIT: Duration = Duration::from_secs(5);
    let fake = FakeWrite::start().await;
    fake.with(|s| s.exhausted_until = Some(Instant::now() + Duration::from_secs(3600)));
    let gw = gateway_on_fake(
        &fake,
        &[
            ("FILAMENT_BIGQUERY_INITIAL_BACKOFF_MS", "20"),
            ("FILAMENT_QUOTA_WAIT_SECS", "5"),
            ("FILAMENT_MAX_BUFFERED_BYTES", "1048576"),
            ("FILAMENT_BACKPRESSURE_WAIT_MS", "100"),
        ],
    )
    .await;
    prepare_run(&gw, json!({}), json!({}), &["t"]).await;
    let started = Instant::now();
    // Nothing is acknowledged: the resource's share (512 KiB) fills and batches get 429.
    let mut rejected = None;
    for batch in 0..10 {
        let body = ipc_stream(&[ids(batch * 16_384..(batch + 1) * 16_384)]);
        let (status, response) = gw.post_batch("run", "e", "t", None, body).await;
        if status == StatusCode::TOO_MANY_REQUESTS {
            rejected = Some(response);
            break;
        }
        assert_eq!(status, StatusCode::ACCEPTED, "{response}");
    }
    let rejected = rejected.expect("a full budget answers 429 while the quota is exhausted");
    assert_eq!(rejected["code"], "backpressure", "{rejected}");
    assert!(started.elapsed() < QUOTA_WAIT, "the 429 came during the quota wait");
    let (status, body) = gw.json(Method::POST, "/v1/runs/run/executions/e/commit?wait=true", None).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["state"], "failed", "{body}");
    assert_eq!(body["error"]["code"], "quota_exceeded", "{body}");
    assert!(body["error"]["hint"].as_str().unwrap().contains("AppendRows throughput"), "{body}");
    assert!(started.elapsed() >= QUOTA_WAIT, "failed only after the quota wait: {:?}", started.elapsed());
    let retried = gw.metric("filament_append_retries_total{code=\"RESOURCE_EXHAUSTED\"}").await;
    assert!(retried.unwrap_or(0.0) > 8.0, "retried past the attempt limit: {retried:?}");
    assert!(!fake.stream_for("_filament_stg_t_").committed);
}

/// `rows` rows from `first_id`: an id and 128 random hex characters (so gzip cannot shrink a
/// request much below its encoded size).
fn noisy_rows(first_id: i64, rows: usize) -> Vec<u8> {
    let ids = Int64Array::from_iter_values(first_id..first_id + rows as i64);
    let noise = StringArray::from_iter_values((0..rows).map(|_| hex::encode(rand::random::<[u8; 64]>())));
    ipc_stream(&[batch(
        vec![Field::new("id", DataType::Int64, false), Field::new("noise", DataType::Utf8, false)],
        vec![Arc::new(ids), Arc::new(noise)],
    )])
}

/// Against the scriptable fake, not bqemulator: the emulator runs AppendRows handlers on a
/// small thread pool and a handler whose connection was cut keeps its thread, so after a
/// handful of cuts it stops answering at all (the cut-twice test in `pipeline.rs` stays below
/// that).
#[tokio::test(flavor = "multi_thread")]
async fn a_network_that_cuts_every_connection_still_loads_every_row_once() {
    const ROWS_PER_BATCH: usize = 1_000; // about 140 KB encoded, 75 KB gzip-compressed
    const BATCHES: i64 = 24;
    let fake = FakeWrite::start().await;
    fake.with(|s| s.table_delays.push((String::new(), Duration::from_millis(5))));
    let proxy = CuttingProxy::cutting_every(&fake.address, 300_000).await;
    let gw = Gateway::spawn_with(GatewayOptions {
        env: env(&[("BIGQUERY_STORAGE_EMULATOR_HOST", &proxy.address), ("FILAMENT_BIGQUERY_INITIAL_BACKOFF_MS", "50")]),
        ..Default::default()
    })
    .await;
    let resources = ["a", "b", "c"];
    prepare_run(&gw, json!({}), json!({"max_rows": ROWS_PER_BATCH}), &resources).await;
    for batch in 0..BATCHES {
        for resource in resources {
            let body = noisy_rows(batch * ROWS_PER_BATCH as i64, ROWS_PER_BATCH);
            let (status, response) = gw.post_batch("run", "e", resource, None, body).await;
            assert_eq!(status, StatusCode::ACCEPTED, "{response}\n{:?}", proxy.endings());
        }
    }
    let committed = gw.commit_and_wait("run", "e").await;
    let logs = gw.logs();
    assert_eq!(committed["state"], "committed", "{committed}\n{:?}", proxy.endings());
    assert!(proxy.cuts() >= 5, "the proxy cut {} connections", proxy.cuts());
    for resource in resources {
        assert_exact_stream(
            &fake.stream_for(&format!("_filament_stg_{resource}_")),
            0..BATCHES * ROWS_PER_BATCH as i64,
        );
    }
    assert!(!logs.contains("no AppendRows connection"), "the real reconnect error is logged");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_dataset_in_another_location_fails_the_execution_before_any_row_is_uploaded() {
    let gw = Gateway::spawn().await;
    let dataset = json!({"datasetReference": {"projectId": gw.project, "datasetId": gw.dataset}, "location": "EU"});
    let created = reqwest::Client::new()
        .post(format!("http://{}/bigquery/v2/projects/{}/datasets", gw.emulator_rest, gw.project))
        .json(&dataset)
        .send()
        .await
        .unwrap();
    assert!(created.status().is_success(), "{}", created.text().await.unwrap());
    prepare_run(&gw, json!({"location": "us"}), json!({}), &["t"]).await;
    post_ok(&gw, "t", ipc_stream(&[ids(0..10)])).await;
    // The lane fails the execution while preparing, without waiting for a commit.
    let execution = eventually(Duration::from_secs(30), "the execution to fail while preparing", || async {
        let (_, execution) = gw.json(Method::GET, "/v1/runs/run/executions/e", None).await;
        (execution["state"] == "failed").then_some(execution)
    })
    .await;
    assert_eq!(execution["error"]["code"], "dataset_location_mismatch", "{execution}");
    assert!(execution["error"]["detail"].as_str().unwrap().contains("EU"), "{execution}");
    assert!(execution["error"]["hint"].as_str().unwrap().contains("location"), "{execution}");
    assert_eq!(execution["resources"][0]["rows_acknowledged"], 0, "{execution}");
    // The commit finds the execution already failed (its view carries the reason).
    let (status, body) = gw.json(Method::POST, "/v1/runs/run/executions/e/commit?wait=true", None).await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert!(body["detail"].as_str().unwrap().contains("failed"), "{body}");
    let tables = gw.query(&format!("SELECT table_name FROM {}.INFORMATION_SCHEMA.TABLES", gw.dataset)).await;
    assert!(tables.is_empty(), "no table was created: {tables:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn queue_timing_counts_every_wait_that_can_end_in_429() {
    let fake = FakeWrite::start().await;
    fake.with(|s| s.hold_responses = true);
    let gw = Arc::new(
        gateway_on_fake(
            &fake,
            &[("FILAMENT_MAX_BUFFERED_BYTES", "1048576"), ("FILAMENT_BACKPRESSURE_WAIT_MS", "10000")],
        )
        .await,
    );
    prepare_run(&gw, json!({}), json!({}), &["t"]).await;
    // 48 Ki rows encode to about 400 KB: one fills most of the resource's 512 KiB share.
    post_ok(&gw, "t", ipc_stream(&[ids(0..49_152)])).await;
    let second = tokio::spawn({
        let gw = Arc::clone(&gw);
        async move { gw.post_batch("run", "e", "t", None, ipc_stream(&[ids(49_152..98_304)])).await }
    });
    // The wait under test: the fake answers nothing for `HELD`, so for that long the second
    // request waits for room in the share (this sleep is the duration measured, not a wait for
    // something to happen).
    const HELD: Duration = Duration::from_millis(1500);
    tokio::time::sleep(HELD).await;
    assert!(!second.is_finished(), "the second request still waits for the share after {HELD:?}");
    fake.with(|s| s.hold_responses = false);
    let (status, body) = tokio::time::timeout(Duration::from_secs(30), second).await.unwrap().unwrap();
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    let committed = gw.commit_and_wait("run", "e").await;
    assert_eq!(committed["state"], "committed", "{committed}");
    let logs = gw.logs();
    let field = |line: &str, name: &str| -> u64 {
        let start = line.find(&format!("{name}=")).unwrap_or_else(|| panic!("{name} in {line}")) + name.len() + 1;
        line[start..].chars().take_while(char::is_ascii_digit).collect::<String>().parse().unwrap()
    };
    let queue: Vec<(u64, u64)> = logs
        .lines()
        .filter(|l| l.contains("bigquery.write.timing") && l.contains("phase=\"queue\""))
        .map(|l| (field(l, "duration_ms"), field(l, "backpressure_ms")))
        .collect();
    assert_eq!(queue.len(), 2, "{queue:?}");
    let (duration_ms, backpressure_ms) = queue[1];
    let held_ms = HELD.as_millis() as u64 - 100;
    assert!(backpressure_ms >= held_ms, "the wait for the share counts as backpressure: {queue:?}");
    assert!(duration_ms >= backpressure_ms, "{queue:?}");
}
