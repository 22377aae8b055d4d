//! The priced plan at the barrier (issue 58): once every stream is committed to staging and
//! before any publication job, each publication's statement is dry-run; the bytes BigQuery
//! reports (the REST proxy answers them: the emulator says 0) become the plan's bytes and cost,
//! shown in the execution view, the timeline and `/metrics`.

use std::sync::Arc;

use arrow_array::Int64Array;
use arrow_schema::{DataType, Field};
use reqwest::Method;
use serde_json::{Value, json};

use crate::support::arrow::{batch, ids, ipc_stream};
use crate::support::rest_proxy::RestProxy;
use crate::support::{GatewayOptions, TestRun, required_env};

const TIB: i64 = 1 << 40;
const TEN_GIB: i64 = 10 << 30;

/// Rows `(id, v = -id)`.
fn keyed(range: std::ops::Range<i64>) -> arrow_array::RecordBatch {
    batch(
        vec![Field::new("id", DataType::Int64, false), Field::new("v", DataType::Int64, true)],
        vec![
            Arc::new(Int64Array::from_iter_values(range.clone())),
            Arc::new(Int64Array::from_iter_values(range.map(|i| -i))),
        ],
    )
}

fn planned<'a>(plan: &'a Value, resource: &str) -> &'a Value {
    let publications = plan["publications"].as_array().expect("the plan's publications");
    publications.iter().find(|p| p["resource"] == resource).unwrap_or_else(|| panic!("{resource} in {plan}"))
}

fn assert_cost(value: &Value, dollars: f64) {
    let cost = value.as_f64().unwrap_or_else(|| panic!("a cost: {value}"));
    assert!((cost - dollars).abs() < 1e-9, "{cost} is not {dollars}");
}

#[tokio::test(flavor = "multi_thread")]
async fn each_statement_is_dry_run_at_the_barrier_and_its_bytes_priced_to_the_cent() {
    let proxy = RestProxy::start(&required_env("BIGQUERY_EMULATOR_HOST")).await;
    proxy.state.lock().unwrap().dry_runs.bytes =
        vec![("`.`orders`".into(), TIB), ("`users` AS _filament_target".into(), TEN_GIB)];
    let gw = GatewayOptions::new().rest_proxy(&proxy).spawn().await;
    TestRun::new("r", "e")
        .full_append(&["orders"])
        .resource("users", json!({"write_mode": "incremental_upsert", "primary_key": ["id"]}))
        .resource("events", json!({"write_mode": "full_append", "direct_append": true}))
        .open(&gw)
        .await;
    gw.post_accepted("r", "e", "orders", None, ipc_stream(&[ids(0..7)])).await;
    gw.post_accepted("r", "e", "users", None, ipc_stream(&[keyed(0..5)])).await;
    gw.post_accepted("r", "e", "events", None, ipc_stream(&[ids(0..3)])).await;
    let committed = gw.commit_and_wait("r", "e").await;
    assert_eq!(committed["state"], "committed", "{committed}");

    let plan = &committed["plan"];
    assert_eq!((plan["delivery"].as_i64(), plan["price_per_tib_usd"].as_f64()), (Some(1), Some(6.25)), "{plan}");
    assert_eq!(plan["bytes_processed"], TIB + TEN_GIB, "{plan}");
    assert_eq!((plan["query_jobs"].as_i64(), plan["unpriced"].as_i64()), (Some(2), Some(0)), "{plan}");
    // $6.25 for the TiB, $0.06103515625 for the 10 GiB: to the micro-dollar.
    assert_cost(&plan["estimated_cost_usd"], 6.311035);
    let orders = planned(plan, "orders");
    assert_eq!((orders["path"].as_str(), orders["statement"].as_str()), (Some("staging_query"), Some("insert")));
    assert_eq!((orders["bytes_processed"].as_i64(), orders["query_jobs"].as_i64()), (Some(TIB), Some(1)));
    assert_cost(&orders["estimated_cost_usd"], 6.25);
    let users = planned(plan, "users");
    assert_eq!((users["statement"].as_str(), users["bytes_processed"].as_i64()), (Some("merge"), Some(TEN_GIB)));
    assert_cost(&users["estimated_cost_usd"], 0.061035);
    let events = planned(plan, "events");
    assert_eq!((events["path"].as_str(), events["statement"].as_str()), (Some("direct_append"), Some("none")));
    assert_eq!((events["bytes_processed"].as_i64(), events["query_jobs"].as_i64()), (Some(0), Some(0)), "{events}");

    // Every dry run came before the first publication job, and none carried a job id.
    {
        let state = proxy.state.lock().unwrap();
        let inserts: Vec<_> =
            state.requests.iter().filter(|r| r.method == "POST" && r.path.ends_with("/jobs")).collect();
        let is_dry = |r: &&&crate::support::rest_proxy::Recorded| r.body["configuration"]["dryRun"] == true;
        let dry: Vec<_> = inserts.iter().filter(is_dry).collect();
        assert_eq!(dry.len(), 2, "one dry run per statement: {dry:?}");
        assert!(dry.iter().all(|r| r.body["jobReference"].get("jobId").is_none()), "{dry:?}");
        let first_job = inserts.iter().filter(|r| !is_dry(r)).map(|r| r.at).min().expect("publication jobs");
        assert!(dry.iter().all(|r| r.at < first_job), "dry runs at the barrier, before any publication job");
    }

    let (_, timeline) = gw.json(Method::GET, "/v1/runs/r/executions/e/events", None).await;
    let planned_events: Vec<&Value> =
        timeline["events"].as_array().unwrap().iter().filter(|e| e["kind"] == "planned").collect();
    assert_eq!(planned_events.len(), 3, "{timeline}");
    let orders_event = planned_events.iter().find(|e| e["resource"] == "orders").expect("orders planned");
    assert_eq!(orders_event["detail"]["bytes_processed"], TIB, "{orders_event}");
    assert_cost(&orders_event["detail"]["estimated_cost_usd"], 6.25);

    let metrics = gw.metrics().await;
    for series in
        [format!("filament_plan_bytes_processed_total {}", TIB + TEN_GIB), "filament_plan_query_jobs_total 2".into()]
    {
        assert!(metrics.contains(&series), "{series} not in:\n{metrics}");
    }
    assert!(!metrics.contains(&gw.dataset) && !metrics.contains("orders"), "no table names in:\n{metrics}");
}

/// Run `run` into the gateway's dataset with `budgets` (run settings), its `tables` declared
/// full_append, execution `e` open and 5 rows posted to each.
async fn open_with_budgets(gw: &crate::support::Gateway, run: &str, budgets: Value, tables: &[&str]) {
    let mut body = json!({"run_id": run, "destination": {"project": gw.project, "dataset": gw.dataset}});
    body.as_object_mut().unwrap().extend(budgets.as_object().unwrap().clone());
    let (status, created) = gw.json(Method::POST, "/v1/runs", Some(body)).await;
    assert_eq!(status, reqwest::StatusCode::CREATED, "{created}");
    for table in tables {
        gw.declare(run, table, json!({"write_mode": "full_append"})).await;
    }
    gw.open_new_execution(run, "e").await;
    for table in tables {
        gw.post_accepted(run, "e", table, None, ipc_stream(&[ids(0..5)])).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_plan_over_a_byte_budget_fails_before_any_publication_job_and_changes_nothing() {
    let proxy = RestProxy::start(&required_env("BIGQUERY_EMULATOR_HOST")).await;
    proxy.state.lock().unwrap().dry_runs.bytes = ["big", "small", "wide", "narrow"]
        .iter()
        .zip([300, 100, 300, 100])
        .map(|(table, bytes)| (format!("`.`{table}`"), bytes))
        .collect();
    let gw = GatewayOptions::new().rest_proxy(&proxy).spawn().await;
    let (status, refused) = gw
        .json(
            Method::POST,
            "/v1/runs",
            Some(json!({"run_id": "bad", "destination": {"project": gw.project, "dataset": gw.dataset},
                "maximum_bytes_billed_per_execution": 0})),
        )
        .await;
    assert_eq!((status.as_u16(), refused["code"].as_str()), (400, Some("invalid_request")), "{refused}");

    // 400 bytes in all, over the execution's 399; each within the job's 1000.
    let budgets = json!({"maximum_bytes_billed": 1000, "maximum_bytes_billed_per_execution": 399});
    open_with_budgets(&gw, "total", budgets, &["big", "small"]).await;
    let failed = gw.commit_and_wait("total", "e").await;
    assert_eq!(
        (failed["state"].as_str(), failed["error"]["code"].as_str()),
        (Some("failed"), Some("publication_too_expensive")),
        "{failed}"
    );
    let detail = failed["error"]["detail"].as_str().unwrap();
    assert!(
        detail.contains("400 bytes in all")
            && detail.contains("big (300 bytes)")
            && detail.contains("small (100 bytes)"),
        "{detail}"
    );
    assert_eq!(failed["plan"]["bytes_processed"], 400, "the plan stays visible: {failed}");
    let (_, run) = gw.json(Method::GET, "/v1/runs/total", None).await;
    assert_eq!(run["maximum_bytes_billed_per_execution"], 399, "{run}");

    // One table over the job's 200.
    open_with_budgets(&gw, "each", json!({"maximum_bytes_billed": 200}), &["wide", "narrow"]).await;
    let failed = gw.commit_and_wait("each", "e").await;
    assert_eq!(failed["error"]["code"], "publication_too_expensive", "{failed}");
    let detail = failed["error"]["detail"].as_str().unwrap();
    assert!(detail.contains("wide (300 bytes)") && !detail.contains("narrow"), "{detail}");

    assert_eq!(proxy.dry_runs().len(), 4, "{:?}", proxy.dry_runs());
    assert!(proxy.requests("POST", "/jobs").is_empty(), "no job but dry runs: {:?}", proxy.queries());
    let deleted = proxy.requests("DELETE", "/tables/_filament_stg_");
    assert_eq!(deleted.len(), 4, "every staging table deleted: {deleted:?}");
    for table in ["big", "small", "wide", "narrow"] {
        assert_eq!(crate::support::rows::count_rows(&gw, table).await, 0, "{table} unchanged");
    }
    let metrics = gw.metrics().await;
    assert!(metrics.contains("filament_plans_total{outcome=\"over_budget\"} 2"), "{metrics}");
}

/// A statement BigQuery refuses to dry-run is planned unpriced, with BigQuery's reason, and
/// the commit goes on (its job carries `maximumBytesBilled`); under a per-execution budget
/// nothing would bound it, so the execution fails before any job.
#[tokio::test(flavor = "multi_thread")]
async fn a_statement_that_cannot_be_dry_run_is_unpriced_and_fails_only_a_per_execution_budget() {
    let proxy = RestProxy::start(&required_env("BIGQUERY_EMULATOR_HOST")).await;
    {
        let mut state = proxy.state.lock().unwrap();
        state.dry_runs.bytes = vec![("`.`priced`".into(), 100), ("`.`bounded`".into(), 100)];
        state.dry_runs.refused = vec!["`.`unpriced`".into(), "`.`unbounded`".into()];
    }
    let gw = GatewayOptions::new().rest_proxy(&proxy).spawn().await;
    open_with_budgets(&gw, "open", json!({"maximum_bytes_billed": 1000}), &["priced", "unpriced"]).await;
    let committed = gw.commit_and_wait("open", "e").await;
    assert_eq!(committed["state"], "committed", "{committed}");
    let plan = &committed["plan"];
    assert_eq!((plan["bytes_processed"].as_i64(), plan["unpriced"].as_i64()), (Some(100), Some(1)), "{plan}");
    let unpriced = planned(plan, "unpriced");
    assert!(unpriced["bytes_processed"].is_null() && unpriced["estimated_cost_usd"].is_null(), "{unpriced}");
    assert!(unpriced["unpriced"].as_str().is_some_and(|why| why.contains("cannot be inserted")), "{unpriced}");
    assert_eq!((unpriced["statement"].as_str(), unpriced["query_jobs"].as_i64()), (Some("insert"), Some(1)));
    assert_eq!(proxy.queries().len(), 2, "both published");

    open_with_budgets(&gw, "bounded", json!({"maximum_bytes_billed_per_execution": 1000}), &["bounded", "unbounded"])
        .await;
    let failed = gw.commit_and_wait("bounded", "e").await;
    assert_eq!(failed["error"]["code"], "publication_too_expensive", "{failed}");
    let detail = failed["error"]["detail"].as_str().unwrap();
    assert!(
        detail.contains("not priced") && detail.contains("unbounded") && !detail.contains("bounded (100 bytes)"),
        "{detail}"
    );
    assert_eq!(proxy.queries().len(), 2, "no job for the failed execution");
    let metrics = gw.metrics().await;
    assert!(metrics.contains("filament_plan_unpriced_total 2"), "{metrics}");
}

/// Dry runs are REST calls like any other: BigQuery's pushback on one is waited out and the dry
/// run sent again by the retry driver, and the plan gets its figure.
#[tokio::test(flavor = "multi_thread")]
async fn a_dry_run_pushed_back_is_retried_and_priced() {
    let proxy = RestProxy::start(&required_env("BIGQUERY_EMULATOR_HOST")).await;
    {
        let mut state = proxy.state.lock().unwrap();
        state.dry_runs.bytes = vec![("`.`t`".into(), 4096)];
        state.dry_runs.push_back = 2;
    }
    let gw = GatewayOptions::new().rest_proxy(&proxy).spawn().await;
    TestRun::new("r", "e").full_append(&["t"]).open(&gw).await;
    gw.post_accepted("r", "e", "t", None, ipc_stream(&[ids(0..5)])).await;
    let committed = gw.commit_and_wait("r", "e").await;
    assert_eq!(committed["state"], "committed", "{committed}");
    assert_eq!(planned(&committed["plan"], "t")["bytes_processed"], 4096, "{committed}");
    assert_eq!(proxy.dry_runs().len(), 3, "two pushed back, the third answered");
    let metrics = gw.metrics().await;
    let retried = metrics.lines().any(|l| {
        l.starts_with("filament_bigquery_retries_total{")
            && l.contains("operation=\"jobs.insert\"")
            && !l.ends_with(" 0")
    });
    assert!(retried, "the retries are counted:\n{metrics}");
}

/// A dry run BigQuery cannot be asked (it answers 503) is not a refusal of the
/// statement: the commit fails before the barrier with the retryable code, no job inserted.
#[tokio::test(flavor = "multi_thread")]
async fn a_dry_run_bigquery_cannot_answer_fails_the_commit_before_the_barrier_retryably() {
    let proxy = RestProxy::start(&required_env("BIGQUERY_EMULATOR_HOST")).await;
    proxy.state.lock().unwrap().dry_runs.unavailable = true;
    let gw = GatewayOptions::new().rest_proxy(&proxy).spawn().await;
    TestRun::new("r", "e").full_append(&["t"]).open(&gw).await;
    gw.post_accepted("r", "e", "t", None, ipc_stream(&[ids(0..5)])).await;
    let failed = gw.commit_and_wait("r", "e").await;
    assert_eq!(failed["state"], "failed", "{failed}");
    assert_eq!(failed["error"]["code"], "bigquery_unavailable", "{failed}");
    // Only pushback is retried at this level; a 503 ends the commit, which the extractor's
    // redelivery runs again as a whole.
    assert_eq!(proxy.dry_runs().len(), 1, "one dry run, answered 503");
    assert!(proxy.queries().is_empty(), "no publication job");
    assert!(failed["resources"][0]["publication"].is_null(), "{failed}");
}

/// A redelivery of an execution whose first delivery passed the barrier (its job was inserted
/// and may still run) is planned but not judged: failing it over budget could no longer leave
/// every table as it was. Its reattached publication inserts no job and is not priced again.
#[tokio::test(flavor = "multi_thread")]
async fn a_redelivery_past_an_earlier_barrier_is_planned_but_not_judged() {
    use crate::support::rest_proxy::JobMode;
    use std::time::Duration;
    let proxy = RestProxy::start(&required_env("BIGQUERY_EMULATOR_HOST")).await;
    proxy.state.lock().unwrap().dry_runs.bytes = vec![("`.`t`".into(), 100)];
    let gw = GatewayOptions::new().rest_proxy(&proxy).env("FILAMENT_QUERY_JOB_TIMEOUT_SECS", "2").spawn().await;
    open_with_budgets(&gw, "r", json!({"maximum_bytes_billed_per_execution": 1000}), &["t"]).await;
    proxy.set_jobs(JobMode::RunFor(Duration::from_secs(60)));
    let unfinished = gw.commit_and_wait("r", "e").await;
    assert_eq!(unfinished["resources"][0]["publication"]["state"], "running", "{unfinished}");
    assert_eq!(proxy.dry_runs().len(), 1, "the first delivery's plan");

    // Its job completes; meanwhile the statement would read more than the budget.
    proxy.set_jobs(JobMode::RunFor(Duration::ZERO));
    proxy.state.lock().unwrap().dry_runs.bytes = vec![("`.`t`".into(), 5000)];
    let (status, redelivered) = gw.open_execution("r", "e").await;
    assert_eq!(status, reqwest::StatusCode::OK, "{redelivered}");
    gw.post_accepted("r", "e", "t", None, ipc_stream(&[ids(0..5)])).await;
    let committed = gw.commit_and_wait("r", "e").await;
    assert_eq!(committed["state"], "committed", "{committed}");
    let reattached = planned(&committed["plan"], "t");
    assert_eq!(reattached["query_jobs"].as_i64(), Some(0), "{reattached}");
    assert!(reattached["unpriced"].as_str().is_some_and(|why| why.contains("reattached")), "{reattached}");
    assert_eq!(committed["plan"]["delivery"], 2, "{committed}");
    assert_eq!(proxy.dry_runs().len(), 1, "the reattached statement is not dry-run again");
    let metrics = gw.metrics().await;
    assert!(metrics.contains("filament_plans_total{outcome=\"begun_earlier\"} 1"), "{metrics}");
}
