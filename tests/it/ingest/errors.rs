//! Every error of this slice: status, stable `code`, and a database that did not change.

use std::sync::Arc;
use std::time::Duration;

use arrow_array::{Int64Array, RecordBatch, StringArray, TimestampNanosecondArray};
use arrow_schema::{DataType, Field, TimeUnit};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::support::arrow::{batch, ids, ipc_stream, ipc_stream_compressed};
use crate::support::rows::post_ids;
use crate::support::{Gateway, GatewayOptions, TestRun, assert_problem, eventually, send};

/// A gateway with run `run`, resource `t` (full_append) and execution `e` extracting.
async fn ready_gateway(options: GatewayOptions) -> Gateway {
    let gw = options.spawn().await;
    TestRun::new("run", "e").full_append(&["t"]).open(&gw).await;
    gw
}

/// Awaits `attempt` (a request not sent before it is awaited), asserts its problem (`status`,
/// `code`) and that the database is unchanged; the problem.
async fn rejected_without_trace(
    gw: &Gateway,
    status: StatusCode,
    code: &str,
    attempt: impl Future<Output = (StatusCode, Value)>,
) -> Value {
    let before = gw.db_snapshot().await;
    let body = assert_problem(attempt.await, status, code);
    assert_eq!(gw.db_snapshot().await, before, "a rejected request changed the state ({code})");
    body
}

/// Posts `rows` as a batch of `resource` (execution `e` of run `run`): refused 422 with `code`
/// and without a trace, its detail naming each of `named`.
async fn batch_refused(gw: &Gateway, resource: &str, rows: RecordBatch, code: &str, named: &[&str]) {
    let attempt = gw.post_batch("run", "e", resource, None, ipc_stream(&[rows]));
    let body = rejected_without_trace(gw, StatusCode::UNPROCESSABLE_ENTITY, code, attempt).await;
    let detail = body["detail"].as_str().unwrap();
    for name in named {
        assert!(detail.contains(name), "the detail names {name}: {body}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn missing_or_wrong_tokens_are_unauthorized() {
    let gw = ready_gateway(GatewayOptions::new()).await;
    for request in [
        gw.unauthenticated(Method::GET, "/v1/runs/run"),
        gw.unauthenticated(Method::GET, "/v1/runs/run").bearer_auth("test-token-wrong"),
    ] {
        rejected_without_trace(&gw, StatusCode::UNAUTHORIZED, "unauthorized", send(request)).await;
    }
    let response = gw.unauthenticated(Method::POST, "/v1/runs").json(&json!({})).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(response.headers()["content-type"], "application/problem+json");
    assert_eq!(response.headers()["www-authenticate"], "Bearer");
}

#[tokio::test(flavor = "multi_thread")]
async fn unknown_ids_are_not_found() {
    let gw = ready_gateway(GatewayOptions::new()).await;
    // A run that does not exist answers as one the caller may not see: `run_not_found`.
    let unknown_run = gw.json(Method::GET, "/v1/runs/nope", None);
    rejected_without_trace(&gw, StatusCode::NOT_FOUND, "run_not_found", unknown_run).await;
    let unknown_execution = gw.json(Method::GET, "/v1/runs/run/executions/nope", None);
    rejected_without_trace(&gw, StatusCode::NOT_FOUND, "not_found", unknown_execution).await;
    let undeclared_resource = gw.post_batch("run", "e", "undeclared", None, ipc_stream(&[ids(0..1)]));
    rejected_without_trace(&gw, StatusCode::NOT_FOUND, "not_found", undeclared_resource).await;
    let batch_of_unknown_execution = gw.post_batch("run", "nope", "t", None, ipc_stream(&[ids(0..1)]));
    rejected_without_trace(&gw, StatusCode::NOT_FOUND, "not_found", batch_of_unknown_execution).await;
    let full_append = Some(json!({"write_mode": "full_append"}));
    let resource_of_unknown_run = gw.json(Method::PUT, "/v1/runs/nope/resources/t", full_append);
    rejected_without_trace(&gw, StatusCode::NOT_FOUND, "run_not_found", resource_of_unknown_run).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_identifiers_and_dataset_ids_are_unprocessable() {
    let gw = ready_gateway(GatewayOptions::new()).await;
    let run = |run_id: &str, dataset: &str| json!({"run_id": run_id, "destination": {"project": "filament-demo", "dataset": dataset}});
    let bad_run_id = gw.json(Method::POST, "/v1/runs", Some(run("bad id!", "ds")));
    rejected_without_trace(&gw, StatusCode::UNPROCESSABLE_ENTITY, "invalid_identifier", bad_run_id).await;
    for dataset in ["my-dataset", "my.dataset"] {
        let attempt = gw.json(Method::POST, "/v1/runs", Some(run("ok_run", dataset)));
        let body = rejected_without_trace(&gw, StatusCode::UNPROCESSABLE_ENTITY, "invalid_dataset_id", attempt).await;
        assert!(body["hint"].as_str().unwrap().contains("letters, numbers, and underscores"), "{body}");
    }
    let full_append = Some(json!({"write_mode": "full_append"}));
    let bad_resource = gw.json(Method::PUT, "/v1/runs/run/resources/bad%20name", full_append);
    rejected_without_trace(&gw, StatusCode::UNPROCESSABLE_ENTITY, "invalid_identifier", bad_resource).await;
    for table in ["users`; DROP TABLE x", "a;b", "_filament_mine"] {
        let declaration = Some(json!({"table": table, "write_mode": "full_append"}));
        let attempt = gw.json(Method::PUT, "/v1/runs/run/resources/r2", declaration);
        rejected_without_trace(&gw, StatusCode::UNPROCESSABLE_ENTITY, "invalid_identifier", attempt).await;
    }
    // Columns: reserved prefix and names beyond BigQuery's flexible column names.
    for name in ["_filament_seq", "has.dot", "price (usd)"] {
        let column = batch(vec![Field::new(name, DataType::Int64, true)], vec![Arc::new(Int64Array::from(vec![1]))]);
        batch_refused(&gw, "t", column, "invalid_identifier", &[]).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn wrong_media_types_and_encodings_are_unsupported() {
    let gw = ready_gateway(GatewayOptions::new()).await;
    let path = "/v1/runs/run/executions/e/resources/t/batches";
    let body = ipc_stream(&[ids(0..3)]);
    for request in [
        gw.request(Method::POST, path).header("content-type", "application/json").body(body.clone()),
        gw.request(Method::POST, path)
            .header("content-type", "application/vnd.apache.arrow.stream")
            .header("content-encoding", "br")
            .body(body.clone()),
        gw.request(Method::POST, "/v1/runs").header("content-type", "text/plain").body("{}"),
    ] {
        rejected_without_trace(&gw, StatusCode::UNSUPPORTED_MEDIA_TYPE, "unsupported_media_type", send(request)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn malformed_or_truncated_ipc_is_invalid() {
    let gw = ready_gateway(GatewayOptions::new()).await;
    let body = ipc_stream(&[ids(0..100)]);
    let (garbage, truncated) = (b"definitely not an arrow stream".to_vec(), body[..body.len() - 40].to_vec());
    for invalid in [garbage, truncated, vec![]] {
        let attempt = gw.post_batch("run", "e", "t", None, invalid);
        rejected_without_trace(&gw, StatusCode::BAD_REQUEST, "invalid_arrow_ipc", attempt).await;
    }
    let without_run_id = gw.json(Method::POST, "/v1/runs", Some(json!({"destination": {"project": "filament-demo"}})));
    rejected_without_trace(&gw, StatusCode::BAD_REQUEST, "invalid_request", without_run_id).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_schema_change_within_a_resource_is_refused() {
    let gw = ready_gateway(GatewayOptions::new()).await;
    post_ids(&gw, "t", 0..5).await;
    // Once the lane has learned its destination's rules from the first schema: a batch of
    // another is refused by its receipt's transaction, never checked against them.
    eventually(Duration::from_secs(30), "the lane's set-up", || async {
        let (status, page) = gw.json(Method::GET, "/v1/runs/run/executions/e/events", None).await;
        assert_eq!(status, StatusCode::OK, "{page}");
        let events = page["events"].as_array()?.clone();
        events.iter().any(|e| e["kind"] == "set_up_finished" && e["resource"] == "t").then_some(())
    })
    .await;
    let other = batch(
        vec![Field::new("id", DataType::Int64, false), Field::new("v", DataType::Utf8, true)],
        vec![Arc::new(Int64Array::from(vec![1])), Arc::new(StringArray::from(vec!["x"]))],
    );
    batch_refused(&gw, "t", other, "schema_mismatch", &["Utf8"]).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn unsupported_types_and_precision_loss_name_the_column() {
    let gw = ready_gateway(GatewayOptions::new()).await;
    // A Null column: BigQuery has no type for it.
    let untyped =
        batch(vec![Field::new("elapsed", DataType::Null, true)], vec![Arc::new(arrow_array::NullArray::new(1))]);
    batch_refused(&gw, "t", untyped, "unsupported_type", &["elapsed"]).await;
    let nanos = batch(
        vec![Field::new("at", DataType::Timestamp(TimeUnit::Nanosecond, None), true)],
        vec![Arc::new(TimestampNanosecondArray::from(vec![1_000, 2_000, 3_001]))],
    );
    batch_refused(&gw, "t", nanos, "precision_loss", &["\"at\"", "row 2"]).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn oversized_bodies_and_rows_are_refused() {
    let options = GatewayOptions::new()
        .env("FILAMENT_MAX_BATCH_BODY_BYTES", "200000")
        .env("FILAMENT_MAX_APPEND_REQUEST_BYTES", "65536");
    let gw = ready_gateway(options).await;
    let too_many_rows = gw.post_batch("run", "e", "t", None, ipc_stream(&[ids(0..20_000)]));
    rejected_without_trace(&gw, StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large", too_many_rows).await;
    let mut values: Vec<String> = (0..10).map(|i| i.to_string()).collect();
    values[6] = "x".repeat(100_000);
    let wide = batch(vec![Field::new("s", DataType::Utf8, true)], vec![Arc::new(StringArray::from(values))]);
    batch_refused(&gw, "t", wide, "row_too_large", &["row 6"]).await;
}

/// IPC buffer compression counts decompressed: 100,000 equal int64 values (800 KB of buffers)
/// compress to a few kilobytes, far below the 200,000-byte limit, and are refused all the same.
#[tokio::test(flavor = "multi_thread")]
async fn compressed_ipc_beyond_the_limit_once_decompressed_is_too_large() {
    let gw = ready_gateway(GatewayOptions::new().env("FILAMENT_MAX_BATCH_BODY_BYTES", "200000")).await;
    let sevens =
        batch(vec![Field::new("id", DataType::Int64, false)], vec![Arc::new(Int64Array::from(vec![7; 100_000]))]);
    for compression in [arrow_ipc::CompressionType::LZ4_FRAME, arrow_ipc::CompressionType::ZSTD] {
        let body = ipc_stream_compressed(std::slice::from_ref(&sevens), compression);
        assert!(body.len() < 200_000, "{compression:?}: {} bytes", body.len());
        let attempt = gw.post_batch("run", "e", "t", None, body);
        rejected_without_trace(&gw, StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large", attempt).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn batches_after_pause_or_commit_conflict() {
    let gw = ready_gateway(GatewayOptions::new()).await;
    let batch_not_extracting = || {
        let attempt = gw.post_batch("run", "e", "t", None, ipc_stream(&[ids(0..3)]));
        rejected_without_trace(&gw, StatusCode::CONFLICT, "execution_not_extracting", attempt)
    };
    let (status, paused) = gw.json(Method::POST, "/v1/runs/run/executions/e/pause", None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(paused["state"], "paused");
    batch_not_extracting().await;
    assert_eq!(gw.commit_and_wait("run", "e").await["state"], "committed");
    batch_not_extracting().await;
    let abort = gw.json(Method::POST, "/v1/runs/run/executions/e/abort", None);
    rejected_without_trace(&gw, StatusCode::CONFLICT, "execution_not_extracting", abort).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn conflicting_definitions_and_missing_keys_are_refused() {
    let gw = ready_gateway(GatewayOptions::new()).await;
    let run =
        |dataset: &str| Some(json!({"run_id": "run", "destination": {"project": "filament-demo", "dataset": dataset}}));
    let (status, _) = gw.json(Method::POST, "/v1/runs", run(&gw.dataset)).await;
    assert_eq!(status, StatusCode::OK, "the same definition again is idempotent");
    let other_dataset = gw.json(Method::POST, "/v1/runs", run("other"));
    rejected_without_trace(&gw, StatusCode::CONFLICT, "run_conflict", other_dataset).await;
    let without_key = gw.json(Method::PUT, "/v1/runs/run/resources/u", Some(json!({"write_mode": "full_upsert"})));
    rejected_without_trace(&gw, StatusCode::UNPROCESSABLE_ENTITY, "primary_key_required", without_key).await;
    let seventeen: Vec<String> = (0..17).map(|i| format!("k{i}")).collect();
    let declaration = Some(json!({"write_mode": "cdc_merge", "primary_key": seventeen}));
    let seventeen_columns_key = gw.json(Method::PUT, "/v1/runs/run/resources/u", declaration);
    rejected_without_trace(&gw, StatusCode::UNPROCESSABLE_ENTITY, "invalid_primary_key", seventeen_columns_key).await;
    // Before batches a resource may be re-declared; after, changes conflict.
    gw.declare("run", "t", json!({"write_mode": "incremental_append"})).await;
    post_ids(&gw, "t", 0..3).await;
    let full_append = Some(json!({"write_mode": "full_append"}));
    let changed = gw.json(Method::PUT, "/v1/runs/run/resources/t", full_append);
    rejected_without_trace(&gw, StatusCode::CONFLICT, "resource_conflict", changed).await;
    let (status, same) =
        gw.json(Method::PUT, "/v1/runs/run/resources/t", Some(json!({"write_mode": "incremental_append"}))).await;
    assert_eq!(status, StatusCode::OK, "{same}");
}

#[tokio::test(flavor = "multi_thread")]
async fn protective_limits_answer_with_their_documented_errors() {
    let options = GatewayOptions::new().env("FILAMENT_MAX_CONCURRENT_REQUESTS", "1");
    let gw = ready_gateway(options).await;
    let long_path = format!("/v1/runs/{}", "r".repeat(5000));
    rejected_without_trace(&gw, StatusCode::URI_TOO_LONG, "uri_too_long", gw.json(Method::GET, &long_path, None)).await;
    let padded = send(gw.request(Method::GET, "/v1/runs/run").header("x-padding", "p".repeat(20_000)));
    rejected_without_trace(&gw, StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE, "headers_too_large", padded).await;
    // Hold the only request slot with a batch whose body trickles in, then ask for more.
    let (sender, slow) = hold_the_only_slot(&gw).await;
    let before = gw.db_snapshot().await;
    let (status, body) = gw.json(Method::GET, "/v1/runs/run", None).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(body["code"], "overloaded");
    sender.send(Ok(ipc_stream(&[ids(0..3)]))).await.unwrap();
    drop(sender);
    let response = slow.await.unwrap().unwrap();
    assert_eq!(response.status(), StatusCode::ACCEPTED);
    assert_ne!(gw.db_snapshot().await, before, "the held request completed");
    let (status, _) = gw.json(Method::GET, "/v1/runs/run", None).await;
    assert_eq!(status, StatusCode::OK, "the slot was released");
}

type HeldRequest = (
    tokio::sync::mpsc::Sender<Result<Vec<u8>, std::io::Error>>,
    tokio::task::JoinHandle<reqwest::Result<reqwest::Response>>,
);

/// Starts a batch request whose body never ends (until the returned sender sends its rows, or
/// is dropped): while the gateway reads it, it holds a request slot.
fn start_held_batch(gw: &Gateway) -> HeldRequest {
    let (sender, receiver) = tokio::sync::mpsc::channel::<Result<Vec<u8>, std::io::Error>>(1);
    let held = gw
        .request(Method::POST, "/v1/runs/run/executions/e/resources/t/batches")
        .header("content-type", "application/vnd.apache.arrow.stream")
        .body(reqwest::Body::wrap_stream(tokio_stream::wrappers::ReceiverStream::new(receiver)))
        .send();
    (sender, tokio::spawn(held))
}

/// Holds the gateway's only request slot with a batch whose body never ends (until the returned
/// sender is dropped): once a probe request is shed while the batch is still being read.
///
/// The probe must come after the batch has reached the gateway: a batch that the probe sheds is
/// answered only once its body ends (the gateway reads and discards it), so it looks just like
/// one holding the slot, and the probes after it are served. So each attempt gives its batch a
/// moment to arrive before probing, and an attempt whose probe was served is made again.
async fn hold_the_only_slot(gw: &Gateway) -> HeldRequest {
    const ARRIVAL: Duration = Duration::from_millis(200);
    crate::support::eventually(Duration::from_secs(20), "a request holding the only slot", || async {
        let (sender, held) = start_held_batch(gw);
        // A head start, not a wait for a state: the probe cannot look without taking the slot.
        tokio::time::sleep(ARRIVAL).await;
        let shed = gw.json(Method::GET, "/v1/runs/run", None).await.0 == StatusCode::SERVICE_UNAVAILABLE;
        (shed && !held.is_finished()).then_some((sender, held))
    })
    .await
}

/// reqwest sends a 32 MiB body without `Expect: 100-continue` to a gateway that sheds it at
/// once: the 503 problem document arrives (the body is read and discarded), not a broken pipe.
#[tokio::test(flavor = "multi_thread")]
async fn an_overloaded_answer_reaches_a_client_still_sending_its_body() {
    let gw = ready_gateway(GatewayOptions::new().env("FILAMENT_MAX_CONCURRENT_REQUESTS", "1")).await;
    let _held = hold_the_only_slot(&gw).await;
    for _ in 0..3 {
        let response = gw
            .request(Method::POST, "/v1/runs/run/executions/e/resources/t/batches")
            .header("content-type", "application/vnd.apache.arrow.stream")
            .body(vec![7u8; 32 << 20])
            .send()
            .await
            .expect("an answer, not an I/O error");
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(response.headers()["retry-after"], "1");
        let problem: serde_json::Value = response.json().await.unwrap();
        assert_eq!(problem["code"], "overloaded", "{problem}");
    }
}

/// A body beyond the limit is answered 413 part-way; the rest (less than the limit again) is
/// read and discarded, so the client gets the answer.
#[tokio::test(flavor = "multi_thread")]
async fn a_too_large_answer_reaches_a_client_still_sending_its_body() {
    let gw = ready_gateway(GatewayOptions::new().env("FILAMENT_MAX_BATCH_BODY_BYTES", "16777216")).await;
    let body = ipc_stream(&[ids(0..1_800_000)]);
    assert!(body.len() > 24 << 20 && body.len() < 32 << 20, "{}", body.len());
    let attempt = gw.post_batch("run", "e", "t", None, body);
    rejected_without_trace(&gw, StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large", attempt).await;
}

/// With `Expect: 100-continue`, a request shed before its body is read gets its answer instead
/// of `100 Continue`: the client need not send the body, and the gateway does not wait for it.
#[tokio::test(flavor = "multi_thread")]
async fn an_early_answer_skips_100_continue() {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let gw = ready_gateway(GatewayOptions::new().env("FILAMENT_MAX_CONCURRENT_REQUESTS", "1")).await;
    let _held = hold_the_only_slot(&gw).await;
    let address = gw.base_url.trim_start_matches("http://").to_string();
    let mut connection = tokio::net::TcpStream::connect(&address).await.unwrap();
    let head = format!(
        "POST /v1/runs/run/executions/e/resources/t/batches HTTP/1.1\r\nhost: {address}\r\nauthorization: Bearer {}\r\n\
         content-type: application/vnd.apache.arrow.stream\r\ncontent-length: 10000000\r\nexpect: 100-continue\r\n\r\n",
        gw.token
    );
    connection.write_all(head.as_bytes()).await.unwrap();
    let mut answer = vec![0u8; 4096];
    let read = tokio::time::timeout(Duration::from_secs(5), connection.read(&mut answer))
        .await
        .expect("an answer without sending the body")
        .unwrap();
    let answer = String::from_utf8_lossy(&answer[..read]);
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    assert!(!answer.contains("100 Continue"), "{answer}");
}

#[tokio::test(flavor = "multi_thread")]
async fn keyed_batches_need_eligible_non_null_keys_and_valid_operations() {
    let gw = ready_gateway(GatewayOptions::new()).await;
    gw.declare("run", "m", json!({"write_mode": "cdc_merge", "primary_key": ["id"]})).await;
    gw.declare("run", "f", json!({"write_mode": "incremental_upsert", "primary_key": ["score"]})).await;
    let id_op = |ids: Vec<Option<i64>>, ops: Vec<Option<&str>>| {
        batch(
            vec![Field::new("id", DataType::Int64, true), Field::new("_filament_op", DataType::Utf8, true)],
            vec![Arc::new(Int64Array::from(ids)), Arc::new(StringArray::from(ops))],
        )
    };
    let null_key = id_op(vec![Some(1), None], vec![Some("insert"); 2]);
    batch_refused(&gw, "m", null_key, "null_primary_key", &["row 1"]).await;
    let unknown_operation = id_op(vec![Some(1), Some(2)], vec![Some("insert"), Some("replace")]);
    batch_refused(&gw, "m", unknown_operation, "invalid_operation", &["row 1"]).await;
    batch_refused(&gw, "m", ids(0..2), "invalid_operation", &[]).await;
    batch_refused(&gw, "t", id_op(vec![Some(1)], vec![Some("insert")]), "invalid_operation", &[]).await;
    let beyond_seq_range = ipc_stream(&[id_op(vec![Some(1)], vec![Some("insert")])]);
    let attempt = gw.post_batch("run", "e", "m", Some(1 << 31), beyond_seq_range);
    rejected_without_trace(&gw, StatusCode::BAD_REQUEST, "invalid_request", attempt).await;
    let float_key = batch(
        vec![Field::new("score", DataType::Float64, false)],
        vec![Arc::new(arrow_array::Float64Array::from(vec![1.5]))],
    );
    batch_refused(&gw, "f", float_key, "invalid_primary_key", &["FLOAT64"]).await;
    let json_field = Field::new("doc", DataType::Utf8, true).with_metadata(std::collections::HashMap::from([(
        "ARROW:extension:name".to_string(),
        "arrow.json".to_string(),
    )]));
    let bad_json =
        batch(vec![json_field], vec![Arc::new(StringArray::from(vec![Some("{\"a\": 1}"), Some("{\"b\": ")]))]);
    batch_refused(&gw, "t", bad_json, "invalid_value", &["row 1"]).await;
}
