//! The upload budget against the scriptable fake: it bounds the bytes sent and not yet
//! acknowledged (rows and the compressed frames waiting for HTTP/2 to send them), answers 429
//! when full, and lets rows held back go out when a request waits for it. Every test asserts
//! the exact rows that end up in the stream.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::json;

use super::windows_and_faults::{commit, fast_retries_on};
use crate::support::arrow::{ids, ipc_stream};
use crate::support::fake_write::{FakeWrite, STALL, assert_exact_stream};
use crate::support::{Gateway, GatewayOptions, TestRun, eventually};

/// Compressed frames waiting for HTTP/2 to send them count in the upload budget: while a peer
/// that stopped reading holds a connection's later requests (uncompressed, 1.6 MB each, more
/// than its 1 MiB window), their frames hold the budget beside their rows, so nine batches of
/// 1.6 MB no longer fit a 16 MiB budget (the rows alone would) and a request is answered 429.
/// Once the connection is replaced the frames give their bytes back and every row loads once.
#[tokio::test(flavor = "multi_thread")]
async fn frames_waiting_to_be_sent_count_in_the_upload_budget() {
    const BUDGET: usize = 16 * 1024 * 1024;
    const ROWS_PER_BATCH: i64 = 100_000;
    let fake = FakeWrite::start().await;
    fake.with(|s| s.stall_reading_connections = 1);
    let gw = fast_retries_on(&fake)
        .env("FILAMENT_APPEND_GZIP_LEVEL", "0")
        .env("FILAMENT_APPEND_SEND_TIMEOUT_SECS", "10")
        .env("FILAMENT_INFLIGHT_PER_STREAM", "16")
        .env("FILAMENT_MAX_INFLIGHT_REQUESTS", "16")
        .env("FILAMENT_MAX_BUFFERED_BYTES", &BUDGET.to_string())
        .env("FILAMENT_MAX_BUFFERED_BYTES_PER_RESOURCE", &BUDGET.to_string())
        .env("FILAMENT_BACKPRESSURE_WAIT_MS", "1000")
        .spawn()
        .await;
    TestRun::new("run", "e").batching(json!({"max_rows": ROWS_PER_BATCH})).full_append(&["t"]).open(&gw).await;
    let rows_of = |seq: i64| seq * ROWS_PER_BATCH..(seq + 1) * ROWS_PER_BATCH;
    let mut refused = Vec::new();
    let mut queued_frame_bytes = 0.0_f64;
    let mut accepted = 0;
    for seq in 0..9 {
        let (status, body) = gw.post_batch("run", "e", "t", Some(seq), ipc_stream(&[ids(rows_of(seq))])).await;
        match status {
            StatusCode::ACCEPTED => {
                // Its request (and frame) exists before the next batch asks for room: otherwise
                // the next batch could be admitted against the rows alone, as if frames were free.
                accepted += 1;
                requests_handed_to_connections(&gw, accepted, ROWS_PER_BATCH).await;
            }
            StatusCode::TOO_MANY_REQUESTS => {
                assert_eq!(body["code"], "backpressure", "{body}");
                refused.push(seq);
            }
            other => panic!("batch {seq}: {other} {body}"),
        }
        let queued = gw.metric("filament_append_send_queue_bytes").await.unwrap_or(0.0);
        queued_frame_bytes = queued_frame_bytes.max(queued);
    }
    assert!(!refused.is_empty(), "nine batches of rows fit the budget only without their frames");
    assert!(queued_frame_bytes >= 1.5e6, "frames waited to be sent: at most {queued_frame_bytes} bytes");
    let rejected = AtomicUsize::new(0);
    for seq in refused {
        post_until_accepted(&gw, "t", seq, ipc_stream(&[ids(rows_of(seq))]), &rejected).await;
    }
    commit(&gw).await;
    assert_exact_stream(&fake.stream_for("_filament_stg_t_"), 0..9 * ROWS_PER_BATCH);
    // The frames the stalled call never took are given back when that call ends: the fake holds
    // it open for `STALL` from its first request, whenever the commit finished meanwhile (it
    // may take less or more than that, depending on how fast the emulator publishes).
    eventually(STALL + Duration::from_secs(30), "the send queue to give its bytes back", || async {
        (gw.metric("filament_append_send_queue_bytes").await == Some(0.0)).then_some(())
    })
    .await;
}

/// Waits until `count` AppendRows requests of `rows_per_request` rows were handed to a
/// connection (in flight now, or already acknowledged).
async fn requests_handed_to_connections(gw: &Gateway, count: i64, rows_per_request: i64) {
    eventually(Duration::from_secs(5), "the lane to hand its requests to the connection", || async {
        let in_flight = gw.metric("filament_appends_in_flight").await.unwrap_or(0.0) as i64;
        let acknowledged = gw.metric("filament_rows_appended_total").await.unwrap_or(0.0) as i64 / rows_per_request;
        (in_flight + acknowledged >= count).then_some(())
    })
    .await;
}

/// Posts batch `seq` of `resource` until it is accepted, counting the 429 answers in `rejected`.
async fn post_until_accepted(gw: &Gateway, resource: &str, seq: i64, body: Vec<u8>, rejected: &AtomicUsize) {
    eventually(Duration::from_secs(120), &format!("batch {seq} of {resource} to be accepted"), || async {
        let (status, response) = gw.post_batch("run", "e", resource, Some(seq), body.clone()).await;
        if status == StatusCode::TOO_MANY_REQUESTS {
            assert_eq!(response["code"], "backpressure");
            assert_eq!(response["status"], 429);
            rejected.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        assert_eq!(status, StatusCode::ACCEPTED, "{response}");
        Some(())
    })
    .await;
}

/// 16 MiB of rows, sixteen times the upload budget, posted six requests at a time to two tables
/// that the fake acknowledges slowly. The budget holds every accepted payload until BigQuery
/// acknowledges it, so what BigQuery has received and not yet acknowledged (the fake's peak of
/// unanswered record-batch bytes) stays within it, and a request that finds it full is answered
/// 429 instead of buffered. Each table's share is the whole budget, so it is the gateway-wide
/// budget that bounds the two together; without it the windows (four appends per stream, eight
/// in all, of up to 256 KiB each) would let about twice the budget out at once.
#[tokio::test(flavor = "multi_thread")]
async fn the_upload_budget_bounds_unacknowledged_bytes_and_answers_429_when_full() {
    const BUDGET: usize = 1024 * 1024;
    const ROWS_PER_BATCH: i64 = 8192; // 128 KiB of Arrow per batch
    const BATCHES: i64 = 128;
    const RESOURCES: [&str; 2] = ["a", "b"];
    let fake = FakeWrite::start().await;
    fake.with(|s| s.table_delays.push((String::new(), Duration::from_millis(60))));
    let gw = fast_retries_on(&fake)
        .env("FILAMENT_MAX_BUFFERED_BYTES", &BUDGET.to_string())
        .env("FILAMENT_MAX_BUFFERED_BYTES_PER_RESOURCE", &BUDGET.to_string())
        .env("FILAMENT_BACKPRESSURE_WAIT_MS", "100")
        .spawn()
        .await;
    let gw = Arc::new(gw);
    TestRun::new("run", "e").full_append(&RESOURCES).open(&gw).await;
    // Batch n goes to table a when n is even, to b when odd; each is retried after a 429.
    let resource_of = |batch: i64| RESOURCES[(batch % 2) as usize];
    let rows_of = |batch: i64| batch * ROWS_PER_BATCH..(batch + 1) * ROWS_PER_BATCH;
    let rejected = Arc::new(AtomicUsize::new(0));
    let mut workers = Vec::new();
    for worker in 0..6 {
        let gw = Arc::clone(&gw);
        let rejected = Arc::clone(&rejected);
        workers.push(tokio::spawn(async move {
            for batch in (worker..BATCHES).step_by(6) {
                let body = ipc_stream(&[ids(rows_of(batch))]);
                post_until_accepted(&gw, resource_of(batch), batch, body, &rejected).await;
            }
        }));
    }
    for worker in workers {
        worker.await.unwrap();
    }
    commit(&gw).await;
    let unacknowledged = fake.with(|s| s.max_bytes_in_flight);
    assert!(
        unacknowledged <= BUDGET,
        "BigQuery held {unacknowledged} bytes unacknowledged at once, more than the {BUDGET}-byte budget"
    );
    assert!(unacknowledged >= BUDGET / 4, "the uploads used the budget: at most {unacknowledged} bytes in flight");
    assert!(rejected.load(Ordering::Relaxed) > 0, "a full budget answers 429");
    for (index, resource) in RESOURCES.iter().enumerate() {
        let mut staged = fake.stream_for(&format!("_filament_stg_{resource}_")).ids;
        staged.sort_unstable();
        let sent: Vec<i64> = (index as i64..BATCHES).step_by(2).flat_map(rows_of).collect();
        assert_eq!(staged, sent, "every row of {resource} exactly once");
    }
}

/// Thirty-two resources with one small batch each, four times what the budget holds: each lane
/// holds its rows back for a fuller upload batch (the flush interval is a minute), so the
/// budget fills. A request that then waits for room makes every lane send what it holds, and
/// every request is accepted within the backpressure wait (30 s, half the flush interval)
/// instead of 429: the held rows do not wait for their interval with the budget full.
#[tokio::test(flavor = "multi_thread")]
async fn rows_held_back_go_out_when_a_request_waits_for_the_budget() {
    const BUDGET: u64 = 1024 * 1024;
    const ROWS_PER_BATCH: i64 = 8192; // 128 KiB of Arrow, below half an upload batch
    let fake = FakeWrite::start().await;
    let gw = GatewayOptions::new()
        .fake_write(&fake)
        .env("FILAMENT_MAX_BUFFERED_BYTES", &BUDGET.to_string())
        .env("FILAMENT_BACKPRESSURE_WAIT_MS", "30000")
        .spawn()
        .await;
    let names: Vec<String> = (0..32).map(|i| format!("t{i:02}")).collect();
    let resources: Vec<&str> = names.iter().map(String::as_str).collect();
    let flush_interval = json!({"flush_interval_ms": 60_000});
    TestRun::new("run", "e").batching(flush_interval).full_append(&resources).open(&gw).await;
    let posts = resources.iter().enumerate().map(|(i, resource)| {
        let first = i as i64 * ROWS_PER_BATCH;
        gw.post_batch("run", "e", resource, Some(0), ipc_stream(&[ids(first..first + ROWS_PER_BATCH)]))
    });
    for (resource, (status, body)) in resources.iter().zip(futures::future::join_all(posts).await) {
        assert_eq!(status, StatusCode::ACCEPTED, "{resource}: {body}");
    }
    let waits = gw.metric("filament_backpressure_waits_total").await;
    assert!(waits.is_some_and(|waits| waits > 0.0), "requests waited for the full budget: {waits:?}");
    commit(&gw).await;
    for (i, resource) in resources.iter().enumerate() {
        let first = i as i64 * ROWS_PER_BATCH;
        assert_exact_stream(&fake.stream_for(&format!("_filament_stg_{resource}_")), first..first + ROWS_PER_BATCH);
    }
}
