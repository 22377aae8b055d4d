//! `direct_append`: an append-mode resource whose columns go in as sent writes its PENDING
//! stream into the destination and is published by committing it, with no staging table and
//! no query job (the REST proxy shows every call), exactly once through redeliveries; one whose
//! values need the publication query loads through staging and its timeline says why.

use std::sync::Arc;

use arrow_array::{ArrayRef, Decimal128Array, Int64Array};
use arrow_schema::{DataType, Field};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::support::arrow::{batch, ids, ipc_stream};
use crate::support::fake_write::FakeWrite;
use crate::support::rest_proxy::RestProxy;
use crate::support::rows::count_rows_and_ids;
use crate::support::{Gateway, GatewayOptions, TestRun, assert_problem, required_env};

const DIRECT: &str = "BatchCommitWriteStreams";

async fn gateway_behind_a_proxy() -> (RestProxy, Gateway) {
    let proxy = RestProxy::start(&required_env("BIGQUERY_EMULATOR_HOST")).await;
    let gw = GatewayOptions::new().rest_proxy(&proxy).spawn().await;
    (proxy, gw)
}

/// Run `r`, execution `e`, resource `t` into table `t` as `write_mode`, declared `direct_append`.
async fn open_direct(gw: &Gateway, write_mode: &str) {
    let declaration = json!({"write_mode": write_mode, "direct_append": true});
    TestRun::new("r", "e").resource("t", declaration).open(gw).await;
}

async fn set_up_finished(gw: &Gateway) -> Value {
    let (status, page) = gw.json(Method::GET, "/v1/runs/r/executions/e/events", None).await;
    assert_eq!(status, StatusCode::OK, "{page}");
    let events = page["events"].as_array().unwrap();
    let prepared = events.iter().find(|e| e["kind"] == "set_up_finished" && e["resource"] == "t");
    prepared.unwrap_or_else(|| panic!("set_up_finished in {page}"))["detail"].clone()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_direct_append_commits_its_stream_into_the_destination_with_no_staging_table_and_no_job() {
    let (proxy, gw) = gateway_behind_a_proxy().await;
    open_direct(&gw, "incremental_append").await;
    gw.post_accepted("r", "e", "t", Some(0), ipc_stream(&[ids(0..25)])).await;
    gw.post_accepted("r", "e", "t", Some(1), ipc_stream(&[ids(25..40)])).await;
    let committed = gw.commit_and_wait("r", "e").await;
    assert_eq!(committed["state"], "committed", "{committed}");
    let publication = &committed["resources"][0]["publication"];
    assert_eq!((publication["job_id"].as_str(), publication["rows_affected"].as_i64()), (Some(DIRECT), Some(40)));
    assert_eq!(publication["committed_streams"].as_array().map(Vec::len), Some(1), "{publication}");
    assert_eq!(count_rows_and_ids(&gw, "t").await, (40, 40));
    assert_eq!(set_up_finished(&gw).await["path"], "direct_append");
    assert!(proxy.requests("POST", "/jobs").is_empty(), "no query job: {:?}", proxy.requests("POST", "/jobs"));
    let created = proxy.requests("POST", &format!("/datasets/{}/tables", gw.dataset));
    assert_eq!(created.len(), 1, "the destination only, no staging table: {created:?}");
    assert!(proxy.requests("DELETE", "/tables/").is_empty(), "no staging table to delete");
    let (_, declared) = gw.json(Method::GET, "/v1/runs/r", None).await;
    assert_eq!(declared["resources"][0]["direct_append"], true, "{declared}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_redelivered_direct_append_publishes_once_and_a_changed_replay_is_refused() {
    let (_proxy, gw) = gateway_behind_a_proxy().await;
    open_direct(&gw, "full_append").await;
    let body = ipc_stream(&[ids(0..30)]);
    gw.post_accepted("r", "e", "t", Some(0), body.clone()).await;
    assert_eq!(gw.commit_and_wait("r", "e").await["state"], "committed");

    // The extractor did not see the answer and delivers the execution again, unchanged.
    let (status, redelivered) = gw.open_execution("r", "e").await;
    assert_eq!(status, StatusCode::OK, "{redelivered}");
    gw.post_accepted("r", "e", "t", Some(0), body).await;
    assert_eq!(gw.commit_and_wait("r", "e").await["state"], "committed");
    let reused = gw.metric("filament_publications_total{outcome=\"reused\"}").await;
    assert_eq!(reused, Some(1.0), "the redelivery was recognised and its publication reused");
    assert_eq!(count_rows_and_ids(&gw, "t").await, (30, 30), "committed once");

    // Delivered again with other rows: refused, and the table keeps what was published.
    gw.open_execution("r", "e").await;
    gw.post_accepted("r", "e", "t", Some(0), ipc_stream(&[ids(100..105)])).await;
    let replayed = gw.commit_and_wait("r", "e").await;
    assert_eq!(
        (replayed["state"].as_str(), replayed["error"]["code"].as_str()),
        (Some("failed"), Some("replay_mismatch"))
    );
    assert_eq!(count_rows_and_ids(&gw, "t").await, (30, 30));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_direct_append_whose_values_the_query_converts_loads_through_staging_and_says_why() {
    let (proxy, gw) = gateway_behind_a_proxy().await;
    open_direct(&gw, "full_append").await;
    let amounts =
        Decimal128Array::from(vec![1_500_000_000_i128, 2_250_000_000]).with_precision_and_scale(38, 9).unwrap();
    let fields =
        vec![Field::new("id", DataType::Int64, false), Field::new("amount", DataType::Decimal128(38, 9), true)];
    let columns: Vec<ArrayRef> = vec![Arc::new(Int64Array::from(vec![1, 2])), Arc::new(amounts)];
    gw.post_accepted("r", "e", "t", Some(0), ipc_stream(&[batch(fields, columns)])).await;
    let committed = gw.commit_and_wait("r", "e").await;
    assert_eq!(committed["state"], "committed", "{committed}");
    assert_ne!(committed["resources"][0]["publication"]["job_id"], DIRECT, "{committed}");
    let prepared = set_up_finished(&gw).await;
    assert_eq!(prepared["path"], "staging", "{prepared}");
    let declined = prepared["direct_append_declined"].as_str().unwrap_or_default();
    assert!(declined.contains("amount is NUMERIC"), "{prepared}");
    assert_eq!(proxy.queries().len(), 1, "the publication's query job");
    assert_eq!(count_rows_and_ids(&gw, "t").await, (2, 2));
}

#[tokio::test(flavor = "multi_thread")]
async fn direct_append_is_refused_outside_the_append_modes_and_beside_metadata_columns() {
    let gw = GatewayOptions::new().spawn().await;
    gw.create_run("r").await;
    for declaration in [
        json!({"write_mode": "incremental_upsert", "primary_key": ["id"], "direct_append": true}),
        json!({"write_mode": "full_append", "metadata_columns": ["run_id"], "direct_append": true}),
    ] {
        let refused = gw.json(Method::PUT, "/v1/runs/r/resources/t", Some(declaration)).await;
        assert_problem(refused, StatusCode::UNPROCESSABLE_ENTITY, "invalid_direct_append");
    }
    let (_, run) = gw.json(Method::GET, "/v1/runs/r", None).await;
    assert_eq!(run["resources"], json!([]), "nothing declared: {run}");
}

/// The fake's streams into table `t` itself (not a staging table): (committed, rows) of each.
fn destination_streams(fake: &FakeWrite) -> Vec<(bool, i64)> {
    fake.with(|s| {
        let direct = s.streams.values().filter(|st| st.table.ends_with("/tables/t"));
        direct.map(|st| (st.committed, st.rows)).collect()
    })
}

#[tokio::test(flavor = "multi_thread")]
async fn a_direct_commit_whose_answer_was_lost_is_resolved_by_asking_bigquery() {
    let fake = FakeWrite::start().await;
    fake.with(|s| s.lose_commit_response = true);
    let gw = GatewayOptions::new().fake_write(&fake).spawn().await;
    open_direct(&gw, "full_append").await;
    gw.post_accepted("r", "e", "t", Some(0), ipc_stream(&[ids(0..50)])).await;
    let committed = gw.commit_and_wait("r", "e").await;
    assert_eq!(committed["state"], "committed", "{committed}");
    assert_eq!(fake.with(|s| s.get_write_stream_calls), 1, "the commit was checked, not redone");
    assert_eq!(destination_streams(&fake), [(true, 50)]);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_redelivery_commits_the_streams_an_unfinished_direct_publication_recorded_and_not_its_own() {
    let fake = FakeWrite::start().await;
    // The commit happens, its answer is lost and BigQuery cannot be asked: the outcome is unknown.
    let unreachable = tonic::Status::unavailable("fake: BigQuery unreachable");
    fake.with(|s| (s.lose_commit_response, s.get_write_stream_error) = (true, Some(unreachable)));
    let gw = GatewayOptions::new().fake_write(&fake).spawn().await;
    open_direct(&gw, "full_append").await;
    let body = ipc_stream(&[ids(0..50)]);
    gw.post_accepted("r", "e", "t", Some(0), body.clone()).await;
    let unknown = gw.commit_and_wait("r", "e").await;
    assert_eq!(unknown["state"], "failed", "{unknown}");
    let publication = &unknown["resources"][0]["publication"];
    assert_eq!(publication["state"], "running", "the outcome is unknown, not failed: {publication}");
    let recorded = publication["committed_streams"][0].as_str().unwrap().to_string();

    fake.with(|s| (s.lose_commit_response, s.get_write_stream_error) = (false, None));
    let (status, redelivered) = gw.open_execution("r", "e").await;
    assert_eq!(status, StatusCode::OK, "{redelivered}");
    gw.post_accepted("r", "e", "t", Some(0), body).await;
    let committed = gw.commit_and_wait("r", "e").await;
    assert_eq!(committed["state"], "committed", "{committed}");
    let publication = &committed["resources"][0]["publication"];
    assert_eq!(publication["committed_streams"][0].as_str(), Some(recorded.as_str()), "{publication}");
    let mut streams = destination_streams(&fake);
    streams.sort_unstable();
    assert_eq!(streams, [(false, 50), (true, 50)], "the earlier stream committed, the redelivery's never");
}
