//! Publication under real conditions: resources sharing a destination table publish in
//! declaration order, an abort never reports `aborted` over changed tables, and `full_replace`
//! replaces in every first segment of a run (also after a failed attempt, and when the source
//! is empty now).

use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::support::arrow::{batch, ids, ipc_stream};
use crate::support::rest_proxy::{JobMode, RestProxy};
use crate::support::rows::{count_rows, count_rows_if_created, seed_table};
use crate::support::{Gateway, GatewayOptions, TestRun, eventually, required_env};

async fn id_list(gw: &Gateway, table: &str) -> Vec<i64> {
    gw.query(&format!("SELECT id FROM {}.{table} ORDER BY id", gw.dataset))
        .await
        .iter()
        .map(|r| r[0].as_str().unwrap().parse().unwrap())
        .collect()
}

fn keys(range: std::ops::Range<i64>) -> arrow_array::RecordBatch {
    use std::sync::Arc;
    batch(
        vec![arrow_schema::Field::new("id", arrow_schema::DataType::Int64, false)],
        vec![Arc::new(arrow_array::Int64Array::from_iter_values(range))],
    )
}

/// The execution once it ended (within `deadline`).
async fn terminal(gw: &Gateway, run: &str, execution: &str, deadline: Duration) -> Value {
    let path = format!("/v1/runs/{run}/executions/{execution}");
    eventually(deadline, &format!("execution {execution} of run {run} to end"), || async {
        let (status, body) = gw.json(Method::GET, &path, None).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        ["committed", "failed", "aborted"].contains(&body["state"].as_str().unwrap_or("")).then_some(body)
    })
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn resources_sharing_a_table_publish_in_declaration_order() {
    let gw = Gateway::spawn().await;
    // The table exists with both columns first: the emulator adds columns to its catalog only
    // (bqemulator.md), so a table the key-only delete resource created could not take `v`.
    seed_table(&gw, "users", 0..0).await;
    // The delete resource's name sorts first; the upsert was declared first and must run first.
    for attempt in 0..3 {
        let run = format!("r{attempt}");
        let keyed = |mode: &str| json!({"table": "users", "write_mode": mode, "primary_key": ["id"]});
        TestRun::new(&run, "e")
            .resource("z_upserts", keyed("incremental_upsert"))
            .resource("a_deletes", keyed("incremental_delete"))
            .open(&gw)
            .await;
        gw.post_accepted(&run, "e", "z_upserts", None, ipc_stream(&[ids(0..100)])).await;
        gw.post_accepted(&run, "e", "a_deletes", None, ipc_stream(&[keys(0..50)])).await;
        let committed = gw.commit_and_wait(&run, "e").await;
        assert_eq!(committed["state"], "committed", "{committed}");
        assert_eq!(id_list(&gw, "users").await, (50..100).collect::<Vec<_>>(), "attempt {attempt}");
    }
    // Slow-write diagnostics cover the commit too: finalize, stream commit, each job.
    let logs = gw.logs();
    for phase in ["finalize", "commit", "publish"] {
        let timed = logs.lines().any(|l| {
            l.contains("bigquery.write.timing")
                && l.contains(&format!("phase=\"{phase}\""))
                && l.contains("duration_ms=")
        });
        assert!(timed, "no bigquery.write.timing for phase {phase}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn an_abort_either_wins_before_publication_or_is_refused_and_the_commit_completes() {
    let gw = Gateway::spawn().await;
    let mut outcomes = Vec::new();
    for (index, delay_ms) in [0u64, 5, 20, 50, 70, 100, 200, 400].into_iter().enumerate() {
        let (run, table) = (format!("r{index}"), format!("t{index}"));
        TestRun::new(&run, "e").resource("t", json!({"table": table, "write_mode": "full_append"})).open(&gw).await;
        gw.post_accepted(&run, "e", "t", None, ipc_stream(&[ids(0..5_000)])).await;
        let (status, _) = gw.json(Method::POST, &format!("/v1/runs/{run}/executions/e/commit"), None).await;
        assert_eq!(status, StatusCode::ACCEPTED);
        // The abort lands this long after the commit: a sweep over the race, not a wait for a state.
        tokio::time::sleep(Duration::from_millis(delay_ms)).await;
        let (abort_status, abort) = gw.json(Method::POST, &format!("/v1/runs/{run}/executions/e/abort"), None).await;
        let ended = terminal(&gw, &run, "e", Duration::from_secs(60)).await;
        let rows = count_rows_if_created(&gw, &table).await.unwrap_or(0);
        match abort_status {
            StatusCode::OK => {
                assert_eq!(ended["state"], "aborted", "delay {delay_ms}: {ended}");
                assert_eq!(rows, 0, "delay {delay_ms}: aborted, so the destination is unchanged");
            }
            StatusCode::CONFLICT => {
                assert!(
                    ["publication_in_progress", "execution_not_extracting"].contains(&abort["code"].as_str().unwrap()),
                    "{abort}"
                );
                assert_eq!(ended["state"], "committed", "delay {delay_ms}: {ended}");
                assert_eq!(rows, 5_000, "delay {delay_ms}: committed, so every row is published");
            }
            other => panic!("delay {delay_ms}: abort answered {other}: {abort}"),
        }
        outcomes.push(ended["state"].as_str().unwrap().to_string());
    }
    eprintln!("abort outcomes by delay: {outcomes:?}");
    assert_eq!(outcomes[0], "aborted", "an abort right after the commit request wins: {outcomes:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_idle_full_replace_resource_truncates_in_the_first_segment_only() {
    let gw = Gateway::spawn().await;
    seed_table(&gw, "t", 0..50).await;

    // The source is empty now: the run's first execution posts nothing and empties the table.
    let full_replace = json!({"write_mode": "full_replace"});
    TestRun::new("r", "e1").resource("t", full_replace.clone()).resource("never_loaded", full_replace).open(&gw).await;
    assert_eq!(gw.commit_and_wait("r", "e1").await["state"], "committed");
    assert_eq!(count_rows_if_created(&gw, "t").await.unwrap_or(0), 0, "the empty replacement truncated the table");

    // A later segment appends; an idle later segment leaves the table alone.
    gw.open_new_execution("r", "e2").await;
    gw.post_accepted("r", "e2", "t", None, ipc_stream(&[ids(100..110)])).await;
    assert_eq!(gw.commit_and_wait("r", "e2").await["state"], "committed");
    gw.open_new_execution("r", "e3").await;
    assert_eq!(gw.commit_and_wait("r", "e3").await["state"], "committed");
    assert_eq!(id_list(&gw, "t").await, (100..110).collect::<Vec<_>>());
    let url = format!(
        "http://{}/bigquery/v2/projects/{}/datasets/{}/tables/never_loaded",
        gw.emulator_rest, gw.project, gw.dataset
    );
    let missing = reqwest::get(&url).await.unwrap().status();
    assert_eq!(missing, StatusCode::NOT_FOUND, "no table, nothing to do");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_corrected_attempt_after_a_failed_execution_replaces_again() {
    let proxy = RestProxy::start(&required_env("BIGQUERY_EMULATOR_HOST")).await;
    let gw = GatewayOptions::new().rest_proxy(&proxy).spawn().await;
    gw.create_run("r").await;
    gw.declare("r", "a", json!({"table": "ta", "write_mode": "full_replace"})).await;
    gw.declare("r", "b", json!({"table": "tb", "write_mode": "full_append"})).await;
    let load = |execution: &'static str| {
        let gw = &gw;
        async move {
            gw.open_new_execution("r", execution).await;
            gw.post_accepted("r", execution, "a", None, ipc_stream(&[ids(0..10)])).await;
            gw.post_accepted("r", execution, "b", None, ipc_stream(&[ids(0..3)])).await;
            gw.commit_and_wait("r", execution).await
        }
    };
    proxy.set_jobs(JobMode::invalid_query("`tb`", "Query error: boom"));
    let failed = load("e1").await;
    assert_eq!(failed["state"], "failed", "{failed}");
    assert_eq!(count_rows(&gw, "ta").await, 10, "the failed attempt replaced ta");

    proxy.set_jobs(JobMode::Forward);
    let committed = load("e2").await;
    assert_eq!(committed["state"], "committed", "{committed}");
    assert_eq!(id_list(&gw, "ta").await, (0..10).collect::<Vec<_>>(), "replaced again, not appended");
    assert_eq!(count_rows(&gw, "tb").await, 3);
}

#[tokio::test(flavor = "multi_thread")]
async fn transient_job_failures_are_retried_under_attempt_ids() {
    let proxy = RestProxy::start(&required_env("BIGQUERY_EMULATOR_HOST")).await;
    let gw = GatewayOptions::new().rest_proxy(&proxy).spawn().await;
    let failures = [
        ("backendError", "Backend error. Job aborted."),
        ("invalidQuery", "Could not serialize access to table p:d.t due to concurrent update"),
    ];
    for (index, (reason, message)) in failures.into_iter().enumerate() {
        let (run, table) = (format!("r{index}"), format!("t{index}"));
        TestRun::new(&run, "e").resource("t", json!({"table": table, "write_mode": "full_append"})).open(&gw).await;
        gw.post_accepted(&run, "e", "t", None, ipc_stream(&[ids(0..10)])).await;
        proxy.set_jobs(JobMode::FailFirstAttempt { reason: reason.into(), message: message.into() });
        let committed = gw.commit_and_wait(&run, "e").await;
        assert_eq!(committed["state"], "committed", "{reason}: {committed}");
        assert_eq!(count_rows(&gw, &table).await, 10, "{reason}: published once");
        let job_ids: Vec<String> = proxy
            .requests("POST", "/jobs")
            .iter()
            .filter_map(|r| r.body["jobReference"]["jobId"].as_str().map(str::to_string))
            .filter(|id| id.contains(&format!("_{run}_")))
            .collect();
        assert_eq!(job_ids.len(), 2, "{reason}: {job_ids:?}");
        // The retry adds an attempt suffix, and a tag of its own (keyed: not derived from the
        // first attempt's id).
        let (readable, first_tag) = job_ids[0].rsplit_once('_').unwrap();
        let retry = job_ids[1].strip_suffix("-a2").unwrap_or_else(|| panic!("{job_ids:?}"));
        let (retry_readable, retry_tag) = retry.rsplit_once('_').unwrap();
        assert_eq!((retry_readable, retry_tag.len()), (readable, 32), "{job_ids:?}");
        assert_ne!(retry_tag, first_tag, "{job_ids:?}");
        assert_eq!(committed["resources"][0]["publication"]["job_id"], job_ids[1].as_str(), "{committed}");
    }
}
