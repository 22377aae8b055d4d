//! Atomic executions (issue 58 item 4): every destination published in one multi-statement
//! transaction, one job. Against the emulator (which rolls every table of a failed
//! transaction back): a transaction whose third statement fails leaves all three tables as
//! they were, and the corrected redelivery publishes all three once. Against the REST proxy: a
//! transaction cancelled for a concurrent update runs again once and publishes once. What a
//! transaction cannot hold is refused when the execution opens or at the declaration.

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use super::held::hold;
use crate::support::arrow::{ids, ipc_stream};
use crate::support::rest_proxy::{JobMode, RestProxy};
use crate::support::rows::count_rows_and_ids;
use crate::support::{Gateway, GatewayOptions, assert_problem, required_env};

const TABLES: [&str; 3] = ["a", "b", "c"];

/// Run `run` (atomic: `atomic`) into the gateway's dataset with `TABLES` declared full_append.
async fn atomic_run(gw: &Gateway, run: &str, atomic: bool) {
    let body = json!({"run_id": run, "destination": {"project": gw.project, "dataset": gw.dataset}, "atomic": atomic});
    let (status, created) = gw.json(Method::POST, "/v1/runs", Some(body)).await;
    assert_eq!((status, created["atomic"].as_bool()), (StatusCode::CREATED, Some(atomic)), "{created}");
    for table in TABLES {
        gw.declare(run, table, json!({"write_mode": "full_append"})).await;
    }
}

/// Opens `execution` and sends `rows` ids to each table: `a` gets `rows`, `b` one more, `c`
/// two more.
async fn deliver(gw: &Gateway, run: &str, execution: &str, first: i64, rows: i64) -> Value {
    let (status, opened) = gw.open_execution(run, execution).await;
    assert!(status.is_success(), "{opened}");
    for (extra, table) in TABLES.iter().enumerate() {
        let end = first + rows + extra as i64;
        gw.post_accepted(run, execution, table, None, ipc_stream(&[ids(first..end)])).await;
    }
    opened
}

async fn counts(gw: &Gateway) -> Vec<(i64, i64)> {
    let mut counts = Vec::new();
    for table in TABLES {
        counts.push(count_rows_and_ids(gw, table).await);
    }
    counts
}

fn transactions(proxy: &RestProxy) -> usize {
    proxy.queries().iter().filter(|sql| sql.starts_with("BEGIN TRANSACTION;")).count()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_failing_statement_leaves_every_table_as_it_was_and_the_corrected_redelivery_publishes_all_once() {
    let proxy = RestProxy::start(&required_env("BIGQUERY_EMULATOR_HOST")).await;
    let gw = GatewayOptions::new().rest_proxy(&proxy).spawn().await;
    atomic_run(&gw, "r", true).await;
    let opened = deliver(&gw, "r", "e0", 0, 2).await;
    assert_eq!(opened["atomic"], true, "{opened}");
    assert_eq!(gw.commit_and_wait("r", "e0").await["state"], "committed");
    let before = counts(&gw).await;
    assert_eq!(before, [(2, 2), (3, 3), (4, 4)]);
    assert_eq!((transactions(&proxy), proxy.queries().len()), (1, 1), "one job for three tables");

    deliver(&gw, "r", "e", 100, 3).await;
    hold(&gw, "r", "e").await;
    // The third destination goes away before the commit: its INSERT fails inside the
    // transaction, after the first two statements ran.
    let dropped = reqwest::Client::new()
        .delete(format!(
            "http://{}/bigquery/v2/projects/{}/datasets/{}/tables/c",
            gw.emulator_rest, gw.project, gw.dataset
        ))
        .send()
        .await
        .unwrap();
    assert!(dropped.status().is_success(), "{dropped:?}");
    let failed = gw.commit_and_wait("r", "e").await;
    assert_eq!(failed["state"], "failed", "{failed}");
    let detail = failed["error"]["detail"].as_str().unwrap_or_default().to_string();
    assert!(detail.contains(".c was not found"), "the job's error: {failed}");
    assert_eq!(failed["error"]["code"], "publication_failed", "{failed}");
    assert_eq!(count_rows_and_ids(&gw, "a").await, (2, 2), "a as it was");
    assert_eq!(count_rows_and_ids(&gw, "b").await, (3, 3), "b as it was");
    assert_eq!(transactions(&proxy), 2);

    // Delivered again (its set-up creates `c` again): all three once.
    let (status, redelivered) = gw.open_execution("r", "e").await;
    assert_eq!((status, redelivered["delivery"].as_i64()), (StatusCode::OK, Some(2)), "{redelivered}");
    for (extra, table) in TABLES.iter().enumerate() {
        gw.post_accepted("r", "e", table, None, ipc_stream(&[ids(100..103 + extra as i64)])).await;
    }
    let committed = gw.commit_and_wait("r", "e").await;
    assert_eq!(committed["state"], "committed", "{committed}");
    assert_eq!(counts(&gw).await, [(5, 5), (7, 7), (5, 5)], "each row once; c holds only e's");
    assert_eq!(transactions(&proxy), 3);
    let jobs: Vec<&Value> =
        committed["resources"].as_array().unwrap().iter().map(|r| &r["publication"]["job_id"]).collect();
    assert!(
        jobs.iter().all(|job| *job == jobs[0]) && jobs[0].as_str().is_some_and(|id| id.ends_with("-a2")),
        "{jobs:?}"
    );

    // The failed transaction changed nothing, so the redelivery's plan was priced and judged
    // afresh (not left unpriced as "failed earlier").
    assert_eq!(committed["plan"]["unpriced"], 0, "{committed}");

    // Committing again finds it committed; a further delivery of the same content reuses the
    // transaction's job: nothing runs again.
    assert_eq!(gw.commit_and_wait("r", "e").await["state"], "committed");
    gw.open_execution("r", "e").await;
    for (extra, table) in TABLES.iter().enumerate() {
        gw.post_accepted("r", "e", table, None, ipc_stream(&[ids(100..103 + extra as i64)])).await;
    }
    assert_eq!(gw.commit_and_wait("r", "e").await["state"], "committed");
    assert_eq!(counts(&gw).await, [(5, 5), (7, 7), (5, 5)], "nothing published twice");
    assert_eq!(transactions(&proxy), 3);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_transaction_cancelled_by_a_concurrent_update_runs_again_once_and_publishes_once() {
    let proxy = RestProxy::start(&required_env("BIGQUERY_EMULATOR_HOST")).await;
    proxy.set_jobs(JobMode::FailFirstAttempt {
        reason: "invalidQuery".into(),
        message: "Transaction is aborted due to concurrent update against table raw.a".into(),
    });
    let gw = GatewayOptions::new().rest_proxy(&proxy).spawn().await;
    atomic_run(&gw, "r", false).await;
    let (status, opened) =
        gw.json(Method::POST, "/v1/runs/r/executions", Some(json!({"execution_id": "e", "atomic": true}))).await;
    assert_eq!((status, opened["atomic"].as_bool()), (StatusCode::CREATED, Some(true)), "{opened}");
    for (extra, table) in TABLES.iter().enumerate() {
        gw.post_accepted("r", "e", table, None, ipc_stream(&[ids(0..2 + extra as i64)])).await;
    }
    let committed = gw.commit_and_wait("r", "e").await;
    assert_eq!(committed["state"], "committed", "{committed}");
    assert_eq!(counts(&gw).await, [(2, 2), (3, 3), (4, 4)], "every row once");
    assert_eq!(transactions(&proxy), 2, "the cancelled transaction and its retry: {:?}", proxy.queries());
}

#[tokio::test(flavor = "multi_thread")]
async fn what_one_transaction_cannot_hold_is_refused_when_the_execution_opens_or_at_the_declaration() {
    let gw = GatewayOptions::new().spawn().await;
    atomic_run(&gw, "atomic", true).await;
    let declared = gw
        .json(
            Method::PUT,
            "/v1/runs/atomic/resources/events",
            Some(json!({"write_mode": "full_append", "direct_append": true})),
        )
        .await;
    let refused = assert_problem(declared, StatusCode::CONFLICT, "atomic_publication_unsupported");
    assert!(refused["detail"].as_str().unwrap().contains("direct_append"), "{refused}");
    let (_, run) = gw.json(Method::GET, "/v1/runs/atomic", None).await;
    assert_eq!(run["resources"].as_array().unwrap().len(), 3, "nothing declared: {run}");

    // A run of 101 tables publishes per table; an execution asking for atomic is refused.
    atomic_run(&gw, "wide", false).await;
    for i in 3..101 {
        gw.declare("wide", &format!("t{i}"), json!({"write_mode": "full_append"})).await;
    }
    let opened =
        gw.json(Method::POST, "/v1/runs/wide/executions", Some(json!({"execution_id": "e", "atomic": true}))).await;
    let refused = assert_problem(opened, StatusCode::CONFLICT, "atomic_publication_unsupported");
    assert!(refused["detail"].as_str().unwrap().contains("101 destination tables (at most 100)"), "{refused}");
    let (status, _) = gw.json(Method::GET, "/v1/runs/wide/executions/e", None).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "no execution opened");
    let (status, opened) = gw.open_execution("wide", "e").await;
    assert_eq!((status, opened["atomic"].as_bool()), (StatusCode::CREATED, Some(false)), "{opened}");

    // While an atomic execution is open, its run's declarations must fit it too.
    atomic_run(&gw, "mixed", false).await;
    let (status, _) =
        gw.json(Method::POST, "/v1/runs/mixed/executions", Some(json!({"execution_id": "e", "atomic": true}))).await;
    assert_eq!(status, StatusCode::CREATED);
    let declared = gw
        .json(
            Method::PUT,
            "/v1/runs/mixed/resources/wide",
            Some(json!({"write_mode": "full_append", "widen_columns": true})),
        )
        .await;
    assert_problem(declared, StatusCode::CONFLICT, "atomic_publication_unsupported");
}
