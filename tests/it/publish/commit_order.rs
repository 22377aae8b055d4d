//! The commit in the product's order (`publish::commit`): every stream finalized, checked and
//! committed to its staging table before any destination changes; a failure or an abort before
//! that publishes nothing and deletes the staging tables; at most eight resources set up and
//! eight tables publishing at once with the default settings.

use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::support::arrow::{ids, ipc_stream};
use crate::support::control_plane::SimulatedRest;
use crate::support::control_plane::limits::Limits;
use crate::support::fake_write::{AppendFault, FakeWrite};
use crate::support::rows::{count_rows, int, post_ids};
use crate::support::{Gateway, GatewayOptions, TestRun, eventually};

/// gRPC `INVALID_ARGUMENT`: BigQuery refuses the append for good.
const INVALID_ARGUMENT: i32 = 3;

/// The staging tables left in the gateway's dataset.
async fn staging_tables_left(gw: &Gateway) -> Vec<String> {
    let sql = format!("SELECT table_name FROM {}.INFORMATION_SCHEMA.TABLES ORDER BY table_name", gw.dataset);
    let tables = gw.query(&sql).await;
    tables
        .iter()
        .filter_map(|row| row[0].as_str())
        .filter(|t| t.starts_with("_filament_stg_"))
        .map(Into::into)
        .collect()
}

/// Waits until the commit that stopped has deleted the staging tables (a lane records its
/// failure before the commit cleans up).
async fn staging_tables_deleted(gw: &Gateway) {
    let proxy = gw.rest_conformance.as_ref().expect("the harness proxies REST calls");
    let created = proxy
        .requests("POST", "/tables")
        .iter()
        .any(|r| r.body["tableReference"]["tableId"].as_str().is_some_and(|table| table.starts_with("_filament_stg_")));
    assert!(created, "the delivery created staging tables");
    eventually(Duration::from_secs(20), "the commit to delete the staging tables", || async {
        staging_tables_left(gw).await.is_empty().then_some(())
    })
    .await;
}

/// The statements the gateway submitted as query jobs (through the harness's REST proxy).
fn jobs_submitted(gw: &Gateway) -> Vec<String> {
    gw.rest_conformance.as_ref().expect("the harness proxies REST calls").queries()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_late_permanent_append_failure_on_one_table_leaves_every_destination_unchanged() {
    // `fast` holds three rows from an earlier run, loaded through the emulator's Storage Write API.
    let earlier = Gateway::spawn().await;
    TestRun::new("earlier", "e").resource("fast", json!({"write_mode": "full_replace"})).open(&earlier).await;
    earlier.post_accepted("earlier", "e", "fast", None, ipc_stream(&[ids(0..3)])).await;
    assert_eq!(earlier.commit_and_wait("earlier", "e").await["state"], "committed");
    assert_eq!(count_rows(&earlier, "fast").await, 3);

    // Into the same dataset: `slow`'s appends are refused for good a few seconds after the commit.
    let fake = FakeWrite::start().await;
    fake.with(|s| {
        s.table_delays.push(("_filament_stg_slow_".into(), Duration::from_secs(3)));
        s.table_faults.push(("_filament_stg_slow_".into(), AppendFault::InResponseError(INVALID_ARGUMENT)));
    });
    let mut gw = GatewayOptions::new().fake_write(&fake).spawn().await;
    gw.dataset.clone_from(&earlier.dataset);
    TestRun::new("run", "e")
        .resource("fast", json!({"write_mode": "full_replace"}))
        .resource("slow", json!({"write_mode": "full_append"}))
        .open(&gw)
        .await;
    post_ids(&gw, "fast", 100..102).await;
    post_ids(&gw, "slow", 0..20).await;
    let ended = gw.commit_and_wait("run", "e").await;

    assert_eq!(ended["state"], "failed", "{ended}");
    assert_eq!(ended["error"]["code"], "upload_failed", "the refused append's code: {ended}");
    let fast = fake.stream_for("_filament_stg_fast_");
    assert!(fast.committed && fast.ids == [100, 101], "fast was staged whole before slow failed: {fast:?}");
    assert!(jobs_submitted(&gw).is_empty(), "no destination was published: {:?}", jobs_submitted(&gw));
    assert_eq!(count_rows(&earlier, "fast").await, 3, "fast keeps its three rows");
    staging_tables_deleted(&gw).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_row_count_mismatch_at_finalize_fails_the_execution_and_publishes_nothing() {
    let fake = FakeWrite::start().await;
    fake.with(|s| s.finalize_row_count_error.push(("_filament_stg_short_".into(), -1)));
    let gw = GatewayOptions::new().fake_write(&fake).spawn().await;
    TestRun::new("run", "e").full_append(&["short", "whole"]).open(&gw).await;
    post_ids(&gw, "short", 0..10).await;
    post_ids(&gw, "whole", 0..10).await;
    let ended = gw.commit_and_wait("run", "e").await;
    assert_eq!(ended["state"], "failed", "{ended}");
    assert_eq!(ended["error"]["code"], "row_count_mismatch", "{ended}");
    assert!(jobs_submitted(&gw).is_empty(), "{:?}", jobs_submitted(&gw));
    staging_tables_deleted(&gw).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_abort_while_the_commit_waits_for_uploads_publishes_nothing_and_deletes_the_staging_tables() {
    let fake = FakeWrite::start().await;
    fake.with(|s| s.table_delays.push(("_filament_stg_slow_".into(), Duration::from_secs(3))));
    let gw = GatewayOptions::new().fake_write(&fake).spawn().await;
    TestRun::new("run", "e").full_append(&["fast", "slow"]).open(&gw).await;
    post_ids(&gw, "fast", 0..10).await;
    post_ids(&gw, "slow", 0..10).await;
    let (status, body) = gw.json(Method::POST, "/v1/runs/run/executions/e/commit", None).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    eventually(Duration::from_secs(10), "fast's stream to be committed to staging", || async {
        fake.with(|s| s.streams.values().any(|st| st.table.contains("_filament_stg_fast_") && st.committed))
            .then_some(())
    })
    .await;
    let (status, aborted) = gw.json(Method::POST, "/v1/runs/run/executions/e/abort", None).await;
    assert_eq!(status, StatusCode::OK, "the commit had not begun publishing: {aborted}");
    assert_eq!(aborted["state"], "aborted");
    staging_tables_deleted(&gw).await;
    let (_, execution) = gw.json(Method::GET, "/v1/runs/run/executions/e", None).await;
    assert_eq!(execution["state"], "aborted", "the abort stands: {execution}");
    assert!(jobs_submitted(&gw).is_empty(), "{:?}", jobs_submitted(&gw));
}

#[tokio::test(flavor = "multi_thread")]
async fn twenty_tables_set_up_and_publish_at_most_eight_at_once_with_the_default_settings() {
    const TABLES: usize = 20;
    let limits = Limits::quick();
    let fake = FakeWrite::start().await;
    limits.apply_to(&fake);
    let rest = SimulatedRest::start(limits, 0).await;
    let gw = GatewayOptions::new().fake_write(&fake).rest_host(&rest.address).spawn().await;
    let names: Vec<String> = (0..TABLES).map(|i| format!("t{i:02}")).collect();
    let resources: Vec<&str> = names.iter().map(String::as_str).collect();
    TestRun::new("run", "e").full_append(&resources).open(&gw).await;
    for name in &names {
        post_ids(&gw, name, 0..5).await;
    }
    let ended: Value = gw.commit_and_wait("run", "e").await;
    assert_eq!(ended["state"], "committed", "{ended}");
    let counters = rest.counters();
    assert_eq!((counters.jobs_inserted, counters.dry_runs), (TABLES, TABLES), "a dry run and a job per table");
    let most_set_ups = fake.with(|s| s.max_creates_in_progress);
    assert!((2..=8).contains(&most_set_ups), "streams created at once: {most_set_ups}");
    assert!((2..=8).contains(&counters.max_running_queries), "jobs at once: {}", counters.max_running_queries);
    let logs = gw.logs();
    let ready = logs.lines().find(|l| l.contains("bigquery.write.ready")).expect("the writer's settings are logged");
    assert!(ready.contains("max_concurrent_set_ups=8") && ready.contains("max_concurrent_publications=8"), "{ready}");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_empty_append_or_upsert_resource_submits_no_query_job() {
    let gw = Gateway::spawn().await;
    TestRun::new("run", "e")
        .resource("appends", json!({"write_mode": "full_append"}))
        .resource("upserts", json!({"write_mode": "incremental_upsert", "primary_key": ["id"]}))
        .resource("loaded", json!({"write_mode": "full_append"}))
        .open(&gw)
        .await;
    post_ids(&gw, "loaded", 0..4).await;
    assert_eq!(gw.commit_and_wait("run", "e").await["state"], "committed");
    let jobs = jobs_submitted(&gw);
    assert_eq!(jobs.len(), 1, "only the resource that staged rows publishes: {jobs:?}");
    assert!(jobs[0].contains("`loaded`"), "{jobs:?}");
    let rows = gw.query(&format!("SELECT COUNT(*) FROM {}.loaded", gw.dataset)).await;
    assert_eq!(int(&rows[0][0]), 4);
}

#[tokio::test(flavor = "multi_thread")]
async fn after_an_abort_answers_no_append_of_the_execution_is_sent() {
    let fake = FakeWrite::start().await;
    // Appends are received and held unanswered: the lane's window (4) fills and it waits.
    fake.with(|s| s.hold_responses = true);
    let gw = GatewayOptions::new().fake_write(&fake).spawn().await;
    TestRun::new("run", "e").batching(json!({"max_rows": 10})).full_append(&["t"]).open(&gw).await;
    for seq in 0..20 {
        let first = seq * 10;
        gw.post_accepted("run", "e", "t", Some(seq), ipc_stream(&[ids(first..first + 10)])).await;
    }
    eventually(Duration::from_secs(10), "the lane's window to fill", || async {
        fake.with(|s| (s.append_requests >= 4).then_some(()))
    })
    .await;
    let sent_before = fake.with(|s| s.append_requests);
    let (status, aborted) = gw.json(Method::POST, "/v1/runs/run/executions/e/abort", None).await;
    assert_eq!(status, StatusCode::OK, "{aborted}");
    // Answered now, the held appends would let a lane that still ran send the next ones.
    fake.with(|s| s.hold_responses = false);
    eventually(Duration::from_secs(10), "the aborted lane to close its AppendRows connection", || async {
        fake.with(|s| (s.open_connections == 0).then_some(()))
    })
    .await;
    assert_eq!(fake.with(|s| s.append_requests), sent_before, "no append after the abort answered");
    assert_eq!(fake.with(|s| s.connections), 1, "no connection opened after the abort answered");
}
