//! A commit asked to hold (issue 58): it drains, stages and plans, then stops in `staged` with
//! nothing published; the next commit publishes what was staged (the streams neither finalized
//! nor committed again), an abort deletes the staging tables and changes nothing, a plan over
//! the run's budgets stays visible until its commit fails, and a held execution outlives the
//! replica that staged it (`fleet/replicas.rs` kills one). The REST proxy answers the dry runs'
//! bytes and records every job and table call.

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::support::arrow::{ids, ipc_stream};
use crate::support::rest_proxy::RestProxy;
use crate::support::rows::{count_rows, count_rows_and_ids, count_rows_if_created};
use crate::support::{Gateway, GatewayOptions, TestRun, assert_problem, required_env};

/// Commits `run`/`execution` asking to hold (`hold=true`, waited for) and returns the view.
pub(crate) async fn hold(gw: &Gateway, run: &str, execution: &str) -> Value {
    let path = format!("/v1/runs/{run}/executions/{execution}/commit?wait=true&hold=true");
    let (status, staged) = gw.json(Method::POST, &path, None).await;
    assert_eq!((status, staged["state"].as_str()), (StatusCode::OK, Some("staged")), "{staged}");
    staged
}

fn event_kinds(timeline: &Value) -> Vec<String> {
    timeline["events"].as_array().unwrap().iter().map(|e| e["kind"].as_str().unwrap().to_string()).collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_held_commit_shows_its_plan_and_publishes_it_on_the_next_commit() {
    let proxy = RestProxy::start(&required_env("BIGQUERY_EMULATOR_HOST")).await;
    proxy.state.lock().unwrap().dry_runs.bytes = vec![("`.`orders`".into(), 1 << 30)];
    let gw = GatewayOptions::new().rest_proxy(&proxy).spawn().await;
    TestRun::new("r", "e")
        .full_append(&["orders"])
        .resource("events", json!({"write_mode": "full_append", "direct_append": true}))
        .open(&gw)
        .await;
    gw.post_accepted("r", "e", "orders", None, ipc_stream(&[ids(0..7)])).await;
    gw.post_accepted("r", "e", "events", None, ipc_stream(&[ids(0..3)])).await;

    // The body's `hold`, without waiting: 202, then `staged`.
    let (status, committing) =
        gw.json(Method::POST, "/v1/runs/r/executions/e/commit", Some(json!({"hold": true}))).await;
    assert_eq!((status, committing["state"].as_str()), (StatusCode::ACCEPTED, Some("committing")), "{committing}");
    let staged = crate::support::eventually(std::time::Duration::from_secs(30), "the commit to hold", || async {
        let (_, seen) = gw.json(Method::GET, "/v1/runs/r/executions/e", None).await;
        (seen["state"] != "committing").then_some(seen)
    })
    .await;
    assert_eq!(staged["state"], "staged", "{staged}");
    assert!(staged["staged_at"].is_string(), "{staged}");
    let plan = &staged["plan"];
    assert_eq!((plan["bytes_processed"].as_i64(), plan["query_jobs"].as_i64()), (Some(1 << 30), Some(1)), "{plan}");
    assert!(plan.get("over_budget").is_none(), "{plan}");
    assert!(proxy.queries().is_empty(), "nothing published while held: {:?}", proxy.queries());
    assert_eq!(count_rows_if_created(&gw, "orders").await.unwrap_or(0), 0);
    assert_eq!(count_rows_if_created(&gw, "events").await.unwrap_or(0), 0, "the direct stream is not committed");

    // Asking to hold again answers the staged execution; delivering it again is refused.
    assert_eq!(hold(&gw, "r", "e").await["staged_at"], staged["staged_at"]);
    assert_problem(gw.open_execution("r", "e").await, StatusCode::CONFLICT, "execution_not_extracting");

    let committed = gw.commit_and_wait("r", "e").await;
    assert_eq!(committed["state"], "committed", "{committed}");
    assert_eq!(count_rows_and_ids(&gw, "orders").await, (7, 7), "every row once");
    assert_eq!(count_rows_and_ids(&gw, "events").await, (3, 3), "every row once");
    assert_eq!(proxy.queries().len(), 1, "one publication job: {:?}", proxy.queries());
    let (_, timeline) = gw.json(Method::GET, "/v1/runs/r/executions/e/events", None).await;
    let kinds = event_kinds(&timeline);
    let stream_commits = kinds.iter().filter(|k| *k == "stream_committed").count();
    assert_eq!(stream_commits, 1, "the staging stream committed once, by the held commit: {kinds:?}");
    let staged_at = kinds.iter().position(|k| k == "staged").expect("a staged event");
    let published_at = kinds.iter().position(|k| k == "publication_started").expect("a publication");
    assert!(staged_at < published_at, "{kinds:?}");
    assert_eq!(kinds.last().map(String::as_str), Some("ended"), "{kinds:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_abort_of_a_held_commit_deletes_its_staging_tables_and_changes_nothing() {
    let proxy = RestProxy::start(&required_env("BIGQUERY_EMULATOR_HOST")).await;
    let gw = GatewayOptions::new().rest_proxy(&proxy).spawn().await;
    TestRun::new("r", "e").resource("t", json!({"write_mode": "full_replace"})).open(&gw).await;
    gw.post_accepted("r", "e", "t", None, ipc_stream(&[ids(0..5)])).await;
    assert_eq!(gw.commit_and_wait("r", "e").await["state"], "committed");
    gw.open_new_execution("r", "e2").await;
    gw.post_accepted("r", "e2", "t", None, ipc_stream(&[ids(100..102)])).await;
    hold(&gw, "r", "e2").await;
    let (status, aborted) = gw.json(Method::POST, "/v1/runs/r/executions/e2/abort", None).await;
    assert_eq!((status, aborted["state"].as_str()), (StatusCode::OK, Some("aborted")), "{aborted}");
    crate::support::eventually(std::time::Duration::from_secs(15), "the staging table deleted", || async {
        (!proxy.requests("DELETE", "/tables/_filament_stg_").is_empty()).then_some(())
    })
    .await;
    assert_eq!(proxy.queries().len(), 1, "only the first execution published: {:?}", proxy.queries());
    assert_eq!(count_rows_and_ids(&gw, "t").await, (5, 5), "the destination as it was");
    let commit = gw.json(Method::POST, "/v1/runs/r/executions/e2/commit", None).await;
    assert_problem(commit, StatusCode::CONFLICT, "execution_not_extracting");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_held_plan_over_budget_stays_staged_and_its_commit_fails_before_any_job() {
    let proxy = RestProxy::start(&required_env("BIGQUERY_EMULATOR_HOST")).await;
    proxy.state.lock().unwrap().dry_runs.bytes = vec![("`.`big`".into(), 300), ("`.`small`".into(), 10)];
    let gw = GatewayOptions::new().rest_proxy(&proxy).spawn().await;
    let body = json!({"run_id": "r", "destination": {"project": gw.project, "dataset": gw.dataset},
        "maximum_bytes_billed": 200});
    let (status, created) = gw.json(Method::POST, "/v1/runs", Some(body)).await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    for table in ["big", "small"] {
        gw.declare("r", table, json!({"write_mode": "full_append"})).await;
    }
    gw.open_new_execution("r", "e").await;
    for table in ["big", "small"] {
        gw.post_accepted("r", "e", table, None, ipc_stream(&[ids(0..4)])).await;
    }
    let staged = hold(&gw, "r", "e").await;
    let over = staged["plan"]["over_budget"].as_str().unwrap_or_else(|| panic!("over budget: {staged}"));
    assert!(over.contains("big (300 bytes)") && !over.contains("small"), "{over}");
    let (_, timeline) = gw.json(Method::GET, "/v1/runs/r/executions/e/events", None).await;
    let staged_event = timeline["events"].as_array().unwrap().iter().find(|e| e["kind"] == "staged").cloned();
    assert!(staged_event.is_some_and(|e| e["detail"]["over_budget"] == over), "{timeline}");
    assert!(proxy.requests("DELETE", "/tables/").is_empty(), "staging kept while held");

    let failed = gw.commit_and_wait("r", "e").await;
    assert_eq!(failed["error"]["code"], "publication_too_expensive", "{failed}");
    assert!(proxy.queries().is_empty(), "no publication job: {:?}", proxy.queries());
    assert_eq!(proxy.requests("DELETE", "/tables/_filament_stg_").len(), 2, "staging deleted at the failure");
    for table in ["big", "small"] {
        assert_eq!(count_rows(&gw, table).await, 0, "{table} unchanged");
    }
}
