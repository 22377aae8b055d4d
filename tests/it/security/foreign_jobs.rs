//! A job is ours or it is refused (issue 54): job ids carry a tag keyed by the fleet's secret,
//! so they cannot be predicted from the run id, and a job found under one of our ids (409 on
//! `jobs.insert`) is taken as the publication only when it runs the statement the gateway
//! recorded under that id. The recording REST proxy plays BigQuery's 409 and `jobs.get`
//! answers (the emulator runs a duplicate job id again instead). Every job says whose it is:
//! its labels name the principal, and the run when there is one.

use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde_json::json;
use sqlx::{Connection as _, PgConnection};

use crate::support::arrow::{ids, ipc_stream};
use crate::support::rest_proxy::{JobMode, RestProxy};
use crate::support::rows::count_rows;
use crate::support::{Gateway, GatewayOptions, TestRun, required_env};

/// The job ids of every `jobs.insert` the proxy saw, in order.
fn inserted_job_ids(proxy: &RestProxy) -> Vec<String> {
    proxy
        .requests("POST", "/jobs")
        .iter()
        .filter_map(|r| r.body["jobReference"]["jobId"].as_str().map(str::to_string))
        .collect()
}

/// Someone who may create jobs in the job project ran `SELECT 1` under the publication's job id
/// first, with the labels the gateway's job carries: BigQuery answers the gateway's insert 409
/// and the job is DONE. It is not the publication: the execution fails with `foreign_job`,
/// nothing is recorded as published, the destination holds none of the rows, and the staging
/// table is kept.
#[tokio::test(flavor = "multi_thread")]
async fn a_job_created_first_under_the_publications_id_is_not_taken_as_the_publication() {
    let proxy = RestProxy::start(&required_env("BIGQUERY_EMULATOR_HOST")).await;
    let gw = GatewayOptions::new().rest_proxy(&proxy).spawn().await;
    TestRun::new("r", "e").full_append(&["t"]).open(&gw).await;
    gw.post_accepted("r", "e", "t", None, ipc_stream(&[ids(0..5)])).await;
    proxy.set_jobs(JobMode::Foreign { query: "SELECT 1".into() });
    let failed = gw.commit_until_ended("r", "e").await;
    assert_eq!(failed["state"], "failed", "{failed}");
    assert_eq!(failed["error"]["code"], "foreign_job", "{failed}");
    let publication = &failed["resources"][0]["publication"];
    assert_eq!(publication["state"], "failed", "nothing recorded as published: {failed}");
    let job_id = publication["job_id"].as_str().unwrap();
    assert_eq!(inserted_job_ids(&proxy), [job_id], "one insert, never a retry under another id");
    assert!(proxy.requests("DELETE", "/tables/_filament_stg_").is_empty(), "the staging table is kept");
    proxy.set_jobs(JobMode::Forward);
    assert_eq!(count_rows(&gw, "t").await, 0, "the destination is unchanged");
}

/// The same run, execution, dataset and table on two fleets (each its own database, so its own
/// key) get different job ids: the id cannot be told from the run id, only its readable part.
#[tokio::test(flavor = "multi_thread")]
async fn job_ids_cannot_be_predicted_from_the_run_id() {
    let first = Gateway::spawn().await;
    let mut second = Gateway::spawn().await;
    second.dataset = first.dataset.clone();
    let mut job_ids = Vec::new();
    for gw in [&first, &second] {
        TestRun::new("r", "e").full_append(&["t"]).open(gw).await;
        gw.post_accepted("r", "e", "t", None, ipc_stream(&[ids(0..3)])).await;
        let committed = gw.commit_and_wait("r", "e").await;
        assert_eq!(committed["state"], "committed", "{committed}");
        job_ids.push(committed["resources"][0]["publication"]["job_id"].as_str().unwrap().to_string());
    }
    let (readable, tag) = job_ids[0].rsplit_once('_').unwrap();
    assert_eq!(tag.len(), 32, "a 128-bit tag: {}", job_ids[0]);
    assert!(job_ids[1].starts_with(readable), "{job_ids:?}");
    assert_ne!(job_ids[0], job_ids[1], "another fleet's key, another id");
}

/// A publication whose job the gateway lost track of is re-attached to by a redelivery under
/// the job id its record holds, even after the fleet's key was rotated and the replica
/// restarted: the job BigQuery has under that id (409) ran the first delivery's statement (over
/// its own staging table), which the record names, so it is taken, and the statement never runs
/// under another id.
#[tokio::test(flavor = "multi_thread")]
async fn a_redelivery_after_a_key_rotation_reattaches_under_the_recorded_job_id() {
    let proxy = RestProxy::start(&required_env("BIGQUERY_EMULATOR_HOST")).await;
    let mut gw = GatewayOptions::new().rest_proxy(&proxy).env("FILAMENT_QUERY_JOB_TIMEOUT_SECS", "2").spawn().await;
    TestRun::new("r", "e").full_append(&["t"]).open(&gw).await;
    gw.post_accepted("r", "e", "t", None, ipc_stream(&[ids(0..5)])).await;
    proxy.set_jobs(JobMode::RunFor(Duration::from_secs(600)));
    let unfinished = gw.commit_and_wait("r", "e").await;
    assert_eq!(unfinished["resources"][0]["publication"]["state"], "running", "{unfinished}");
    let job_id = unfinished["resources"][0]["publication"]["job_id"].as_str().unwrap().to_string();
    gw.kill();

    // The operator rotates the key (docs/operations.md) and the replica restarts.
    let mut database = PgConnection::connect(&gw.database_url).await.unwrap();
    sqlx::query(
        "INSERT INTO job_id_keys (generation, secret)
         SELECT max(generation) + 1, decode(replace(gen_random_uuid()::text || gen_random_uuid()::text, '-', ''), 'hex')
         FROM job_id_keys",
    )
    .execute(&mut database)
    .await
    .unwrap();
    let mut restarted = GatewayOptions::new().rest_proxy(&proxy).database_url(&gw.database_url).spawn().await;
    restarted.dataset = gw.dataset.clone();
    proxy.set_jobs(JobMode::AlreadyExists);
    let (status, redelivered) = restarted.open_execution("r", "e").await;
    assert_eq!(status, StatusCode::OK, "{redelivered}");
    restarted.post_accepted("r", "e", "t", None, ipc_stream(&[ids(0..5)])).await;
    let committed = restarted.commit_and_wait("r", "e").await;
    assert_eq!(committed["state"], "committed", "{committed}");
    assert_eq!(committed["resources"][0]["publication"]["job_id"], job_id.as_str(), "{committed}");
    assert_eq!(inserted_job_ids(&proxy), [job_id.clone(), job_id], "the recorded id, never a new one");
    let statements = proxy.queries();
    assert_ne!(statements[0], statements[1], "each delivery's statement reads its own staging table");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_connection_test_job_is_labelled_with_the_principal_that_asked() {
    let gw = Gateway::spawn().await;
    let (status, body) = gw.json(Method::POST, "/v1/connections/test", Some(json!({"project": "filament-demo"}))).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let proxy = gw.rest_conformance.as_ref().unwrap();
    let inserted = proxy.requests("POST", "/jobs");
    assert_eq!(inserted.len(), 1, "{inserted:?}");
    let job = &inserted[0].body;
    assert_eq!(job["configuration"]["labels"]["filament_job"], "connection_test", "{job}");
    assert_eq!(job["configuration"]["labels"]["filament_principal"], "default", "{job}");
    let random = job["jobReference"]["jobId"].as_str().unwrap().trim_start_matches("filament_connection_test_");
    assert_eq!(random.len(), 32, "128 random bits: {job}");
}
