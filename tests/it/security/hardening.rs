//! Operating guarantees: no row values in logs or error bodies, the connection test, graceful
//! shutdown on SIGTERM, refusing to start without tokens.

use std::sync::Arc;
use std::time::Duration;

use arrow_array::{Int64Array, StringArray, TimestampNanosecondArray};
use arrow_schema::{DataType, Field, TimeUnit};
use reqwest::{Method, StatusCode};
use serde_json::json;

use crate::support::arrow::{batch, ids, ipc_stream};
use crate::support::rows::{count_rows, count_rows_and_ids};
use crate::support::{Gateway, GatewayOptions, TestRun, eventually, required_env, send};

const MARKER: &str = "ZZ-SECRET-ROW-VALUE-7f3a";

#[tokio::test(flavor = "multi_thread")]
async fn row_values_never_reach_logs_or_error_bodies() {
    let gw = Gateway::spawn().await;
    TestRun::new("run", "e").full_append(&["t", "t2"]).open(&gw).await;
    let rows = |n: usize| {
        batch(
            vec![Field::new("id", DataType::Int64, true), Field::new("secret", DataType::Utf8, true)],
            vec![
                Arc::new(Int64Array::from_iter_values(0..n as i64)),
                Arc::new(StringArray::from_iter_values((0..n).map(|i| format!("{MARKER}-{i}")))),
            ],
        )
    };
    let mut bodies = Vec::new();
    let (status, accepted) = gw.post_batch("run", "e", "t", None, ipc_stream(&[rows(50)])).await;
    assert_eq!(status, StatusCode::ACCEPTED);
    bodies.push(accepted.to_string());
    // Rejections that look at values: schema change, precision loss, truncated IPC, conflict.
    let changed = batch(
        vec![Field::new("id", DataType::Utf8, true), Field::new("secret", DataType::Utf8, true)],
        vec![Arc::new(StringArray::from(vec![MARKER])), Arc::new(StringArray::from(vec![MARKER]))],
    );
    bodies.push(gw.post_batch("run", "e", "t", None, ipc_stream(&[changed])).await.1.to_string());
    let nanos = batch(
        vec![
            Field::new("at", DataType::Timestamp(TimeUnit::Nanosecond, None), true),
            Field::new("secret", DataType::Utf8, true),
        ],
        vec![Arc::new(TimestampNanosecondArray::from(vec![1_001])), Arc::new(StringArray::from(vec![MARKER]))],
    );
    let (status, precision) = gw.post_batch("run", "e", "t2", None, ipc_stream(&[nanos])).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{precision}");
    bodies.push(precision.to_string());
    let full = ipc_stream(&[rows(10)]);
    bodies.push(gw.post_batch("run", "e", "t", None, full[..full.len() - 30].to_vec()).await.1.to_string());
    bodies.push(gw.post_batch("run", "e", "t", Some(0), ipc_stream(&[rows(3)])).await.1.to_string());
    let committed = gw.commit_and_wait("run", "e").await;
    assert_eq!(committed["state"], "committed");
    bodies.push(committed.to_string());
    assert_eq!(
        gw.query(&format!("SELECT COUNT(*) FROM {}.t WHERE STARTS_WITH(secret, '{MARKER}')", gw.dataset)).await[0][0],
        "50"
    );

    for body in &bodies {
        assert!(!body.contains(MARKER), "an answer carries a row value: {body}");
    }
    let logs = gw.logs();
    assert!(logs.contains("bigquery.write.timing"), "debug logs were captured");
    assert!(!logs.contains(MARKER), "the log carries a row value");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_connection_test_runs_a_query_job() {
    let gw = Gateway::spawn().await;
    let (status, body) = gw.json(Method::POST, "/v1/connections/test", Some(json!({"project": "filament-demo"}))).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["ok"], true);
    assert!(body["elapsed_ms"].is_u64());
    let (status, body) = gw.json(Method::POST, "/v1/connections/test", Some(json!({"project": "Not A Project"}))).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(body["code"], "invalid_identifier");
}

#[tokio::test(flavor = "multi_thread")]
async fn sigterm_lets_a_running_commit_finish() {
    let mut gw = Gateway::spawn().await;
    TestRun::new("run", "e").full_append(&["t"]).open(&gw).await;
    for i in 0..5 {
        let (status, _) = gw.post_batch("run", "e", "t", None, ipc_stream(&[ids(i * 1000..(i + 1) * 1000)])).await;
        assert_eq!(status, StatusCode::ACCEPTED);
    }
    let (status, body) = gw.json(Method::POST, "/v1/runs/run/executions/e/commit", None).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    let exit = gw.terminate().await;
    assert!(exit.success(), "graceful exit: {exit:?}");
    assert!(gw.logs().contains("gateway stopped"));
    // The commit finished before the process exited.
    assert_eq!(count_rows(&gw, "t").await, 5000);
    let restarted = GatewayOptions::new().database_url(&gw.database_url).spawn().await;
    let (_, execution) = send(restarted.request(Method::GET, "/v1/runs/run/executions/e")).await;
    assert_eq!(execution["state"], "committed", "{execution}");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_interrupted_execution_fails_at_restart_and_a_redelivery_loads_every_row_once() {
    // A crashed replica's executions fail once its lease (2 s here) expires.
    let mut gw = GatewayOptions::new().env("FILAMENT_REPLICA_LEASE_SECS", "2").spawn().await;
    TestRun::new("run", "e").full_append(&["t"]).open(&gw).await;
    let (status, _) = gw.post_batch("run", "e", "t", Some(0), ipc_stream(&[ids(0..700)])).await;
    assert_eq!(status, StatusCode::ACCEPTED);
    gw.kill();
    let mut restarted =
        GatewayOptions::new().database_url(&gw.database_url).env("FILAMENT_REPLICA_LEASE_SECS", "2").spawn().await;
    restarted.dataset = gw.dataset.clone();
    let execution = eventually(Duration::from_secs(15), "the crashed replica's execution to fail", || async {
        let (_, execution) = restarted.json(Method::GET, "/v1/runs/run/executions/e", None).await;
        (execution["state"] == "failed").then_some(execution)
    })
    .await;
    assert_eq!(execution["state"], "failed", "{execution}");
    assert_eq!(execution["error"]["code"], "gateway_restarted");
    let (status, redelivered) = restarted.open_execution("run", "e").await;
    assert_eq!(status, StatusCode::OK, "{redelivered}");
    assert_eq!(redelivered["delivery"], 2);
    for (seq, range) in [(0, 0..700), (1, 700..1000)] {
        let (status, body) = restarted.post_batch("run", "e", "t", Some(seq), ipc_stream(&[ids(range)])).await;
        assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    }
    assert_eq!(restarted.commit_and_wait("run", "e").await["state"], "committed");
    assert_eq!(count_rows_and_ids(&restarted, "t").await, (1000, 1000));
}

#[test]
fn the_gateway_refuses_to_start_without_tokens() {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_filament-bigquery"))
        .arg("serve")
        .env_clear()
        .env("DATABASE_URL", required_env("DATABASE_URL"))
        .env("FILAMENT_LISTEN", "127.0.0.1:0")
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("no API token configured"), "{stderr}");
}
