//! End to end through the emulator: append modes, segments, `seq` replay, redelivery,
//! durable checkpoints, the example extractor.

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::support::arrow::{BASE_MICROS, DAY_MS, common_types, gzip, ids, ipc_stream, ipc_stream_compressed};
use crate::support::rows::{count_rows, count_rows_and_ids, int};
use crate::support::{Gateway, TestRun, assert_problem, required_env};

fn date_string(days_since_epoch: i64) -> String {
    (chrono::NaiveDate::from_ymd_opt(1970, 1, 1).unwrap() + chrono::Duration::days(days_since_epoch)).to_string()
}

#[tokio::test(flavor = "multi_thread")]
async fn two_resources_load_every_common_type_and_checkpoint_becomes_durable_at_commit() {
    let gw = Gateway::spawn().await;
    let execution = TestRun::new("run1", "e1")
        .full_append(&["shop.items"])
        .resource("events", json!({"table": "event_log", "write_mode": "incremental_append"}))
        .open(&gw)
        .await;
    assert_eq!(execution["state"], "extracting");

    // Three batches for items (one request with two record batches), two for events.
    let first =
        gw.post_batch("run1", "e1", "shop.items", None, ipc_stream(&[common_types(0..40), common_types(40..50)])).await;
    assert_eq!(first.0, StatusCode::ACCEPTED, "{}", first.1);
    assert_eq!(first.1["seq"], 0);
    assert_eq!(first.1["rows"], 50);
    assert_eq!(first.1["state"], "queued");
    for (seq, range) in [(1, 50..120), (2, 120..121)] {
        let (status, receipt) =
            gw.post_batch("run1", "e1", "shop.items", None, ipc_stream(&[common_types(range)])).await;
        assert_eq!(status, StatusCode::ACCEPTED, "{receipt}");
        assert_eq!(receipt["seq"], seq);
    }
    for range in [0..1000, 1000..2500] {
        let (status, receipt) = gw.post_batch("run1", "e1", "events", None, ipc_stream(&[ids(range)])).await;
        assert_eq!(status, StatusCode::ACCEPTED, "{receipt}");
    }
    let (status, checkpoint) = gw
        .json(Method::POST, "/v1/runs/run1/executions/e1/checkpoints", Some(json!({"checkpoint": {"cursor": 2500}})))
        .await;
    assert_eq!(status, StatusCode::OK, "{checkpoint}");
    assert_eq!(checkpoint["checkpoint_seq"], 0);
    assert_eq!(checkpoint["flushed_rows"], 121 + 2500);

    let (_, run) = gw.json(Method::GET, "/v1/runs/run1", None).await;
    assert_eq!(run["durable_checkpoint"], Value::Null, "not durable before commit: {run}");

    let committed = gw.commit_and_wait("run1", "e1").await;
    assert_eq!(committed["state"], "committed", "{committed}");
    let resources = committed["resources"].as_array().unwrap();
    assert_eq!(resources.len(), 2);
    for resource in resources {
        assert_eq!(resource["rows_received"], resource["rows_acknowledged"], "{resource}");
        assert_eq!(resource["publication"]["state"], "done", "{resource}");
        assert_eq!(resource["publication"]["rows_affected"], resource["rows_received"], "{resource}");
    }
    let (_, run) = gw.json(Method::GET, "/v1/runs/run1", None).await;
    assert_eq!(run["durable_checkpoint"], json!({"cursor": 2500}), "{run}");
    assert_eq!(run["executions"], json!([{"execution_id": "e1", "state": "committed"}]));

    let ds = &gw.dataset;
    let events = gw.query(&format!("SELECT COUNT(*), SUM(id), COUNT(DISTINCT id), SUM(v) FROM {ds}.event_log")).await;
    assert_eq!(events[0].iter().map(int).collect::<Vec<_>>(), [2500, 2500 * 2499 / 2, 2500, 10 * 2500 * 2499 / 2]);

    assert_the_common_types_read_back(&gw).await;
    let _ = DAY_MS;
    // Staging tables are deleted once published.
    let tables = gw.query(&format!("SELECT table_name FROM {ds}.INFORMATION_SCHEMA.TABLES ORDER BY table_name")).await;
    let names: Vec<&str> = tables.iter().map(|r| r[0].as_str().unwrap()).collect();
    assert_eq!(names, ["event_log", "shop_items"]);
}

/// `shop_items` holds the 121 rows of [`common_types`], every fifth NULL past its id, each
/// value as sent.
async fn assert_the_common_types_read_back(gw: &Gateway) {
    let ds = &gw.dataset;
    let rows = gw
        .query(&format!(
            "SELECT id, flag, small, ratio, amount, name, long_name, TO_BASE64(blob), CAST(day AS STRING), CAST(day64 AS STRING),
                    UNIX_MICROS(TIMESTAMP(local_time, 'UTC')), UNIX_MICROS(instant), UNIX_MICROS(instant_ns)
             FROM {ds}.shop_items ORDER BY id"
        ))
        .await;
    assert_eq!(rows.len(), 121);
    for (i, row) in rows.iter().enumerate() {
        let i = i as i64;
        assert_eq!(int(&row[0]), i);
        if i % 5 == 0 {
            assert!(row[1..].iter().all(Value::is_null), "row {i} should be null past id: {row:?}");
            continue;
        }
        assert_eq!(row[1], json!(if i % 2 == 0 { "true" } else { "false" }), "row {i}");
        assert_eq!(int(&row[2]), i % 100);
        assert_eq!(row[3].as_str().unwrap().parse::<f64>().unwrap(), i as f64 / 4.0);
        assert_eq!(row[4].as_str().unwrap().parse::<f64>().unwrap(), i as f64 * 1.25);
        assert_eq!(row[5], json!(format!("name-{i}-é")));
        assert_eq!(row[6], json!(format!("long-{i}")));
        use base64::Engine as _;
        assert_eq!(row[7], json!(base64::engine::general_purpose::STANDARD.encode([(i % 256) as u8, 0, 255])));
        assert_eq!(row[8], json!(date_string(19_000 + i)));
        assert_eq!(row[9], json!(date_string(19_000 + i)));
        assert_eq!(int(&row[10]), BASE_MICROS + i * 1_000_001);
        assert_eq!(int(&row[11]), BASE_MICROS + i * 3_000_007);
        assert_eq!(int(&row[12]), BASE_MICROS + i * 7);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_second_execution_appends_a_segment_and_moves_the_durable_checkpoint() {
    let gw = Gateway::spawn().await;
    gw.create_run("run").await;
    gw.declare("run", "t", json!({"write_mode": "incremental_append"})).await;
    for (execution, range, cursor) in [("seg1", 0..100, 1), ("seg2", 100..250, 2)] {
        gw.open_new_execution("run", execution).await;
        let (status, body) = gw.post_batch("run", execution, "t", Some(0), ipc_stream(&[ids(range)])).await;
        assert_eq!(status, StatusCode::ACCEPTED, "{body}");
        let (status, checkpoint) = gw
            .json(
                Method::POST,
                &format!("/v1/runs/run/executions/{execution}/checkpoints"),
                Some(json!({"checkpoint": cursor})),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{checkpoint}");
        assert_eq!(gw.commit_and_wait("run", execution).await["state"], "committed");
        let (_, run) = gw.json(Method::GET, "/v1/runs/run", None).await;
        assert_eq!(run["durable_checkpoint"], json!(cursor));
        assert_eq!(run["durable_checkpoint_execution_id"], json!(execution));
    }
    let counts = gw.query(&format!("SELECT COUNT(*), COUNT(DISTINCT id), MAX(id) FROM {}.t", gw.dataset)).await;
    assert_eq!(counts[0].iter().map(int).collect::<Vec<_>>(), [250, 250, 249]);
}

#[tokio::test(flavor = "multi_thread")]
async fn seq_replay_returns_the_same_receipt_and_adds_no_rows() {
    let gw = Gateway::spawn().await;
    TestRun::new("run", "e").full_append(&["t"]).open(&gw).await;
    let body = ipc_stream(&[ids(0..10)]);
    let (status, receipt) = gw.post_batch("run", "e", "t", Some(0), body.clone()).await;
    assert_eq!(status, StatusCode::ACCEPTED);
    let before = gw.db_snapshot().await;
    let (status, replay) = gw.post_batch("run", "e", "t", Some(0), body.clone()).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(replay, receipt);
    let conflict = gw.post_batch("run", "e", "t", Some(0), ipc_stream(&[ids(0..11)])).await;
    assert_problem(conflict, StatusCode::CONFLICT, "batch_conflict");
    assert_eq!(gw.db_snapshot().await, before, "replays change nothing");
    // Without seq the next number is assigned.
    let next = gw.post_accepted("run", "e", "t", None, ipc_stream(&[ids(10..15)])).await;
    assert_eq!(next["seq"], 1);
    gw.commit_and_wait("run", "e").await;
    assert_eq!(count_rows_and_ids(&gw, "t").await, (15, 15));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_redelivered_committed_execution_publishes_once_and_a_changed_one_is_refused() {
    let gw = Gateway::spawn().await;
    gw.create_run("run").await;
    gw.declare("run", "t", json!({"write_mode": "full_append"})).await;
    // The first delivery opens the execution (201), every later one reopens it (200).
    let deliver = |opened_status: StatusCode, range: std::ops::Range<i64>| {
        let gw = &gw;
        async move {
            let (status, opened) = gw.open_execution("run", "e").await;
            assert_eq!(status, opened_status, "{opened}");
            let (status, body) = gw.post_batch("run", "e", "t", Some(0), ipc_stream(&[ids(range)])).await;
            assert_eq!(status, StatusCode::ACCEPTED, "{body}");
            gw.json(Method::POST, "/v1/runs/run/executions/e/commit?wait=true", None).await
        }
    };
    let (_, first) = deliver(StatusCode::CREATED, 0..20).await;
    assert_eq!(first["state"], "committed", "{first}");
    let (status, second) = deliver(StatusCode::OK, 0..20).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(second["state"], "committed", "{second}");
    assert_eq!(second["delivery"], 2);
    assert_eq!(count_rows(&gw, "t").await, 20, "the redelivery reused the publication");

    let (_, third) = deliver(StatusCode::OK, 0..21).await;
    assert_eq!(third["state"], "failed", "{third}");
    assert_eq!(third["error"]["code"], "replay_mismatch", "{third}");
    assert_eq!(count_rows(&gw, "t").await, 20);
}

#[tokio::test(flavor = "multi_thread")]
async fn gzip_and_zstd_bodies_are_decoded_and_hashed_after_decoding() {
    use sha2::Digest as _;
    let gw = Gateway::spawn().await;
    TestRun::new("run", "e").full_append(&["t"]).open(&gw).await;
    let path = "/v1/runs/run/executions/e/resources/t/batches";
    let plain = ipc_stream(&[ids(0..100)]);
    let zstd = zstd::encode_all(&plain[..], 3).unwrap();
    for (encoding, body) in [("gzip", gzip(&plain)), ("zstd", zstd)] {
        let (status, receipt) = crate::support::send(
            gw.request(Method::POST, path)
                .header("content-type", "application/vnd.apache.arrow.stream")
                .header("content-encoding", encoding)
                .body(body),
        )
        .await;
        assert_eq!(status, StatusCode::ACCEPTED, "{encoding}: {receipt}");
        assert_eq!(receipt["uncompressed_bytes"], plain.len());
        assert_eq!(receipt["arrow_ipc_sha256"], hex::encode(sha2::Sha256::digest(&plain)));
    }
    gw.commit_and_wait("run", "e").await;
    assert_eq!(count_rows(&gw, "t").await, 200);
}

/// Arrow IPC buffer compression (as pyarrow's `IpcWriteOptions(compression=...)` writes it):
/// LZ4_FRAME and ZSTD bodies are accepted with the same receipts (hash and size of the bytes as
/// received), replays and exact loading.
#[tokio::test(flavor = "multi_thread")]
async fn lz4_and_zstd_compressed_ipc_batches_load_exactly_once() {
    use arrow_ipc::CompressionType;
    const LZ4_FRAME: CompressionType = CompressionType::LZ4_FRAME;
    const ZSTD: CompressionType = CompressionType::ZSTD;
    use sha2::Digest as _;
    let gw = Gateway::spawn().await;
    TestRun::new("run", "e").full_append(&["t"]).open(&gw).await;
    let bodies = [
        ipc_stream_compressed(&[ids(0..20_000), ids(20_000..30_000)], LZ4_FRAME),
        ipc_stream_compressed(&[ids(30_000..50_000)], ZSTD),
    ];
    for (seq, body) in bodies.iter().enumerate() {
        let (status, receipt) = gw.post_batch("run", "e", "t", Some(seq as i64), body.clone()).await;
        assert_eq!(status, StatusCode::ACCEPTED, "{receipt}");
        assert_eq!(receipt["uncompressed_bytes"], body.len());
        assert_eq!(receipt["arrow_ipc_sha256"], hex::encode(sha2::Sha256::digest(body)));
        let (status, replay) = gw.post_batch("run", "e", "t", Some(seq as i64), body.clone()).await;
        assert_eq!(status, StatusCode::OK, "{replay}");
        assert_eq!(replay, receipt);
    }
    assert_eq!(gw.commit_and_wait("run", "e").await["state"], "committed");
    let ds = &gw.dataset;
    let totals = gw.query(&format!("SELECT COUNT(*), COUNT(DISTINCT id), SUM(id), SUM(v) FROM {ds}.t")).await;
    assert_eq!(
        totals[0].iter().map(int).collect::<Vec<_>>(),
        [50_000, 50_000, 50_000 * 49_999 / 2, 10 * 50_000 * 49_999 / 2]
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn the_example_extractor_loads_exactly_its_rows() {
    let python = required_env("FILAMENT_TOOLS_PYTHON");
    let gw = Gateway::spawn().await;
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/extractor.py");
    let output = tokio::process::Command::new(python)
        .args([
            script,
            "--gateway",
            &gw.base_url,
            "--token",
            &gw.token,
            "--dataset",
            &gw.dataset,
            "--project",
            &gw.project,
        ])
        .output()
        .await
        .expect("run the example");
    assert!(
        output.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    let ds = &gw.dataset;
    let users =
        gw.query(&format!("SELECT COUNT(*), COUNT(DISTINCT id), MIN(id), MAX(id) FROM {ds}.public_users")).await;
    assert_eq!(users[0].iter().map(int).collect::<Vec<_>>(), [300, 300, 0, 299]);
    let orders = gw.query(&format!("SELECT COUNT(*), COUNT(note), MAX(order_id) FROM {ds}.orders")).await;
    assert_eq!(orders[0].iter().map(int).collect::<Vec<_>>(), [100, 66, 99]);
    let (_, run) = gw.json(Method::GET, "/v1/runs/example_run", None).await;
    assert_eq!(run["durable_checkpoint"], json!({"cursor": "2024-03-01"}));
}
