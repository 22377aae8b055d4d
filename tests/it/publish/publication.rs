//! Publication and table management where the emulator differs from BigQuery or cannot fail on
//! demand: the recording REST proxy takes over query jobs (409 reuse, failed jobs, jobs that
//! run a while) and shows the metadata calls; the Storage Write fake takes STRUCT rows.

use std::sync::Arc;
use std::time::Duration;

use arrow_array::builder::{Int64Builder, ListBuilder, MapBuilder, StringBuilder};
use arrow_array::{Array as _, ArrayRef, Int64Array, StringArray, StructArray};
use arrow_schema::{DataType, Field};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::support::arrow::{batch, ids, ipc_stream};
use crate::support::fake_write::FakeWrite;
use crate::support::rest_proxy::{JobMode, RestProxy, one_batch_behind_a_proxy};
use crate::support::rows::count_rows;
use crate::support::{Gateway, GatewayOptions, TestRun, eventually, required_env};

/// Run `r`, execution `e`: twelve `full_append` resources (tables `t00` to `t11` of one
/// dataset), ten rows posted to each at once.
async fn post_to_twelve_tables(gw: &Gateway) {
    let resources: Vec<String> = (0..12).map(|i| format!("t{i:02}")).collect();
    let names: Vec<&str> = resources.iter().map(String::as_str).collect();
    TestRun::new("r", "e").full_append(&names).open(gw).await;
    let posts = resources.iter().map(|r| gw.post_accepted("r", "e", r, None, ipc_stream(&[ids(0..10)])));
    futures::future::join_all(posts).await;
}

/// Twelve destinations, each job running 3 s: at most `maximum` run at once, and the first
/// `at_first` start before any ends (the adaptive limit starts at
/// `FILAMENT_MAX_CONCURRENT_PUBLICATIONS`, 8 by default, and never goes above it).
async fn destinations_publish_at_once(setting: Option<&str>, at_first: usize, maximum: usize) {
    let proxy = RestProxy::start(&required_env("BIGQUERY_EMULATOR_HOST")).await;
    let fake = FakeWrite::start().await;
    let mut options = GatewayOptions::new().rest_proxy(&proxy).fake_write(&fake);
    if let Some(setting) = setting {
        options = options.env("FILAMENT_MAX_CONCURRENT_PUBLICATIONS", setting);
    }
    let gw = options.spawn().await;
    post_to_twelve_tables(&gw).await;
    // Long enough that the first ones are all still running when the last of them starts,
    // even on a loaded machine.
    let job_seconds = Duration::from_secs(3);
    proxy.set_jobs(JobMode::RunFor(job_seconds));
    let committed = gw.commit_and_wait("r", "e").await;
    assert_eq!(committed["state"], "committed", "{committed}");
    let published = committed["resources"].as_array().unwrap();
    assert!(published.iter().all(|r| r["publication"]["state"] == "done"), "{committed}");
    assert_eq!(proxy.queries().len(), 12);
    let state = proxy.state.lock().unwrap();
    assert!(state.max_running <= maximum, "{} ran at once", state.max_running);
    let mut ends: Vec<_> = state.running.values().copied().collect();
    ends.sort();
    let first_end = ends[0];
    let started_before_any_ended = ends.iter().filter(|end| **end - job_seconds < first_end).count();
    assert_eq!(started_before_any_ended, at_first, "jobs started before the first one ended");
}

/// A running job is awaited with `jobs.getQueryResults` long polls (answered when it completes),
/// then read once with `jobs.get`, not polled on a schedule: a 3-second job takes one long poll.
#[tokio::test(flavor = "multi_thread")]
async fn running_jobs_are_awaited_with_one_long_poll_each() {
    let proxy = RestProxy::start(&required_env("BIGQUERY_EMULATOR_HOST")).await;
    let gw = GatewayOptions::new().rest_proxy(&proxy).spawn().await;
    TestRun::new("r", "e").full_append(&["t"]).open(&gw).await;
    gw.post_accepted("r", "e", "t", None, ipc_stream(&[ids(0..10)])).await;
    proxy.set_jobs(JobMode::RunFor(Duration::from_secs(3)));
    assert_eq!(gw.commit_and_wait("r", "e").await["state"], "committed");
    let long_polls = proxy.requests("GET", "/queries/");
    assert_eq!(long_polls.len(), 1, "{long_polls:?}");
    assert!(
        long_polls[0].path_and_query.contains("timeoutMs=") && long_polls[0].path_and_query.contains("maxResults=0")
    );
    assert_eq!(proxy.requests("GET", "/jobs/").len(), 1, "one jobs.get, for the outcome");
}

#[tokio::test(flavor = "multi_thread")]
async fn eight_destinations_publish_at_once_by_default() {
    // The product's eight: the publication limit starts at its maximum and never exceeds it.
    destinations_publish_at_once(None, 8, 8).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_most_publications_at_once_is_configurable() {
    destinations_publish_at_once(Some("4"), 4, 4).await;
    destinations_publish_at_once(Some("12"), 12, 12).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn resources_sharing_a_dataset_check_it_once() {
    let proxy = RestProxy::start(&required_env("BIGQUERY_EMULATOR_HOST")).await;
    let fake = FakeWrite::start().await;
    let gw = GatewayOptions::new().rest_proxy(&proxy).fake_write(&fake).spawn().await;
    post_to_twelve_tables(&gw).await;
    let committed = gw.commit_and_wait("r", "e").await;
    assert_eq!(committed["state"], "committed", "{committed}");
    let dataset_path = format!("/datasets/{}", gw.dataset);
    let dataset_checks: Vec<_> =
        proxy.requests("GET", &dataset_path).into_iter().filter(|r| r.path.ends_with(&dataset_path)).collect();
    assert_eq!(dataset_checks.len(), 1, "one datasets.get for twelve resources: {dataset_checks:?}");
    let tables_created = proxy.requests("POST", &format!("{dataset_path}/tables")).len();
    assert_eq!(tables_created, 24, "every destination and staging table is still created");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_existing_job_id_is_reused_and_never_run_twice() {
    let proxy = RestProxy::start(&required_env("BIGQUERY_EMULATOR_HOST")).await;
    let gw = GatewayOptions::new().rest_proxy(&proxy).spawn().await;
    TestRun::new("r", "e").full_append(&["t"]).open(&gw).await;
    gw.post_accepted("r", "e", "t", None, ipc_stream(&[ids(0..25)])).await;
    // As if an earlier attempt had submitted the job: insert answers 409, get answers DONE.
    proxy.set_jobs(JobMode::AlreadyExists);
    let committed = gw.commit_and_wait("r", "e").await;
    assert_eq!(committed["state"], "committed", "{committed}");
    assert_eq!(committed["resources"][0]["publication"]["state"], "done", "{committed}");
    let job_id = committed["resources"][0]["publication"]["job_id"].as_str().unwrap().to_string();
    assert_eq!(proxy.requests("POST", "/jobs").len(), 1);
    assert!(!proxy.requests("GET", &format!("/jobs/{job_id}")).is_empty(), "the existing job was fetched");
    proxy.set_jobs(JobMode::Forward);
    // The statement was not run a second time: the staged rows never reached the table.
    assert_eq!(count_rows(&gw, "t").await, 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_failed_job_is_surfaced_on_redelivery_without_a_new_job() {
    let (proxy, _fake, gw) = one_batch_behind_a_proxy(0..5).await;
    proxy.set_jobs(JobMode::invalid_query("", "Query error: boom"));
    let failed = gw.commit_and_wait("r", "e").await;
    assert_eq!(failed["state"], "failed", "{failed}");
    assert_eq!(failed["error"]["code"], "publication_failed", "{failed}");
    assert!(failed["error"]["detail"].as_str().unwrap().contains("boom"), "{failed}");
    assert_eq!(failed["resources"][0]["publication"]["state"], "failed", "{failed}");

    // The extractor redelivers the same execution: the recorded failure answers, no new job.
    let (status, redelivered) = gw.open_execution("r", "e").await;
    assert_eq!(status, StatusCode::OK, "{redelivered}");
    gw.post_accepted("r", "e", "t", None, ipc_stream(&[ids(0..5)])).await;
    let again = gw.commit_and_wait("r", "e").await;
    assert_eq!(again["state"], "failed", "{again}");
    assert_eq!(again["error"]["code"], "publication_failed", "{again}");
    assert!(again["error"]["hint"].as_str().unwrap().contains("new execution"), "{again}");
    assert_eq!(proxy.queries().len(), 1, "no second job for a recorded failure");
}

/// A failed job's message can quote the value the statement could not convert (the GEOGRAPHY,
/// RANGE, INTERVAL and JSON conversions do): the execution's error, the publication's and the
/// timeline keep the reason without the value, as row errors do.
#[tokio::test(flavor = "multi_thread")]
async fn a_failed_jobs_message_is_kept_without_the_values_it_quotes() {
    let (proxy, _fake, gw) = one_batch_behind_a_proxy(0..5).await;
    let message = "Query error: Invalid GEOGRAPHY value: 'POINT(1 SECRET-7)' in column g at [3:5]";
    proxy.set_jobs(JobMode::invalid_query("", message));
    let failed = gw.commit_and_wait("r", "e").await;
    assert_eq!(failed["error"]["code"], "publication_failed", "{failed}");
    let detail = failed["error"]["detail"].as_str().unwrap();
    assert!(detail.contains("Invalid GEOGRAPHY value: \"…\" in column g"), "{failed}");
    let (status, events) = gw.json(Method::GET, "/v1/runs/r/executions/e/events", None).await;
    assert_eq!(status, StatusCode::OK, "{events}");
    for shown in [failed.to_string(), events.to_string(), gw.logs()] {
        assert!(!shown.contains("SECRET-7"), "{shown}");
    }
}

/// A job the gateway stopped waiting for may still run: its staging table is kept (the job
/// reads it), and a redelivery of the execution re-attaches to that job under the same id
/// instead of running the statement again under a new one.
#[tokio::test(flavor = "multi_thread")]
async fn a_job_that_may_still_run_keeps_its_staging_table_and_a_redelivery_reattaches_to_it() {
    let proxy = RestProxy::start(&required_env("BIGQUERY_EMULATOR_HOST")).await;
    let fake = FakeWrite::start().await;
    let gw = GatewayOptions::new()
        .rest_proxy(&proxy)
        .fake_write(&fake)
        .env("FILAMENT_QUERY_JOB_TIMEOUT_SECS", "2")
        .spawn()
        .await;
    TestRun::new("r", "e").full_append(&["t"]).open(&gw).await;
    gw.post_accepted("r", "e", "t", None, ipc_stream(&[ids(0..5)])).await;
    proxy.set_jobs(JobMode::RunFor(Duration::from_secs(60)));
    let unfinished = gw.commit_and_wait("r", "e").await;
    assert_eq!(unfinished["state"], "failed", "{unfinished}");
    assert_eq!(unfinished["resources"][0]["publication"]["state"], "running", "{unfinished}");
    let job_id = unfinished["resources"][0]["publication"]["job_id"].as_str().unwrap().to_string();
    assert!(proxy.requests("DELETE", "/tables/_filament_stg_").is_empty(), "the job may still read its staging table");

    // The job completes; the extractor redelivers the same execution.
    proxy.set_jobs(JobMode::RunFor(Duration::ZERO));
    let (status, redelivered) = gw.open_execution("r", "e").await;
    assert_eq!(status, StatusCode::OK, "{redelivered}");
    gw.post_accepted("r", "e", "t", None, ipc_stream(&[ids(0..5)])).await;
    let committed = gw.commit_and_wait("r", "e").await;
    assert_eq!(committed["state"], "committed", "{committed}");
    assert_eq!(committed["resources"][0]["publication"]["job_id"], job_id.as_str(), "{committed}");
    let inserted: Vec<String> = proxy
        .requests("POST", "/jobs")
        .iter()
        .filter_map(|r| r.body["jobReference"]["jobId"].as_str().map(str::to_string))
        .collect();
    assert_eq!(inserted, [job_id.clone(), job_id], "the same job id, never a new attempt's");
}

/// A gateway whose REST calls `proxy` records, with run `r` whose resource `t` (full_append)
/// execution `e1` loaded five rows into.
async fn one_committed_execution(proxy: &RestProxy) -> Gateway {
    let gw = GatewayOptions::new().rest_proxy(proxy).spawn().await;
    TestRun::new("r", "e1").full_append(&["t"]).open(&gw).await;
    gw.post_accepted("r", "e1", "t", None, ipc_stream(&[ids(0..5)])).await;
    assert_eq!(gw.commit_and_wait("r", "e1").await["state"], "committed");
    gw
}

#[tokio::test(flavor = "multi_thread")]
async fn staging_tables_are_created_to_expire_in_seven_days() {
    let proxy = RestProxy::start(&required_env("BIGQUERY_EMULATOR_HOST")).await;
    let _gw = one_committed_execution(&proxy).await;
    let staging_inserts: Vec<Value> = proxy
        .requests("POST", "/tables")
        .into_iter()
        .map(|r| r.body)
        .filter(|b| b["tableReference"]["tableId"].as_str().is_some_and(|t| t.starts_with("_filament_stg_")))
        .collect();
    assert_eq!(staging_inserts.len(), 1);
    let expires_ms: i64 = staging_inserts[0]["expirationTime"].as_str().unwrap().parse().unwrap();
    let seven_days_ms = 7 * 24 * 3600 * 1000;
    let from_now = expires_ms - chrono::Utc::now().timestamp_millis();
    assert!((seven_days_ms - 3_600_000..=seven_days_ms).contains(&from_now), "expires in {from_now} ms");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_new_column_is_added_with_tables_patch_as_nullable_at_the_end() {
    let proxy = RestProxy::start(&required_env("BIGQUERY_EMULATOR_HOST")).await;
    let gw = one_committed_execution(&proxy).await;
    // The next execution sends one more column: the table gains it (NULLABLE, at the end).
    let wider = batch(
        vec![
            Field::new("id", DataType::Int64, false),
            Field::new("v", DataType::Int64, true),
            Field::new("note", DataType::Utf8, false),
        ],
        vec![
            Arc::new(Int64Array::from(vec![7])),
            Arc::new(Int64Array::from(vec![70])),
            Arc::new(StringArray::from(vec!["hello"])),
        ],
    );
    // The emulator's tables.patch changes only its catalog (not the DuckDB table), so the job
    // that would read the new column is taken over.
    proxy.set_jobs(JobMode::RunFor(Duration::ZERO));
    gw.open_new_execution("r", "e2").await;
    gw.post_accepted("r", "e2", "t", None, ipc_stream(&[wider])).await;
    assert_eq!(gw.commit_and_wait("r", "e2").await["state"], "committed");
    let patches = proxy.requests("PATCH", "/tables/t");
    assert_eq!(patches.len(), 1, "{patches:?}");
    let fields = patches[0].body["schema"]["fields"].as_array().unwrap().clone();
    let names: Vec<&str> = fields.iter().map(|f| f["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["id", "v", "note"]);
    assert_eq!(fields[2]["mode"], "NULLABLE");
    assert_eq!(fields[2]["type"], "STRING");
    let queries = proxy.queries();
    assert!(queries.iter().all(|q| !q.to_uppercase().contains("ALTER")), "{queries:?}");
    assert!(queries.last().unwrap().contains("`note`"), "{queries:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_incompatible_existing_type_fails_naming_the_column_and_both_types() {
    let gw = Gateway::spawn().await;
    TestRun::new("r", "e1").full_append(&["t"]).open(&gw).await;
    gw.post_accepted("r", "e1", "t", None, ipc_stream(&[ids(0..5)])).await;
    assert_eq!(gw.commit_and_wait("r", "e1").await["state"], "committed");
    let text_v = batch(
        vec![Field::new("id", DataType::Int64, false), Field::new("v", DataType::Utf8, true)],
        vec![Arc::new(Int64Array::from(vec![1])), Arc::new(StringArray::from(vec!["x"]))],
    );
    gw.open_new_execution("r", "e2").await;
    let (status, _) = gw.post_batch("r", "e2", "t", None, ipc_stream(&[text_v])).await;
    assert_eq!(status, StatusCode::ACCEPTED);
    // The lane fails the execution when it prepares the table.
    let failed = gw.commit_until_ended("r", "e2").await;
    assert_eq!(failed["state"], "failed", "{failed}");
    assert_eq!(failed["error"]["code"], "incompatible_schema", "{failed}");
    let detail = failed["error"]["detail"].as_str().unwrap();
    assert!(detail.contains("v is INT") && detail.contains("STRING"), "{detail}");
    assert_eq!(count_rows(&gw, "t").await, 5, "unchanged");
}

#[tokio::test(flavor = "multi_thread")]
async fn struct_array_and_map_columns_become_record_and_repeated_fields() {
    let proxy = RestProxy::start(&required_env("BIGQUERY_EMULATOR_HOST")).await;
    let fake = FakeWrite::start().await;
    let gw = GatewayOptions::new().rest_proxy(&proxy).fake_write(&fake).spawn().await;
    TestRun::new("r", "e").full_append(&["orders"]).open(&gw).await;

    let mut tags = ListBuilder::new(StringBuilder::new());
    tags.append_value([Some("a"), Some("b")]);
    tags.append_null();
    tags.append_value([Some("c")]);
    let mut attributes = MapBuilder::new(None, StringBuilder::new(), Int64Builder::new());
    attributes.keys().append_value("size");
    attributes.values().append_value(3);
    attributes.append(true).unwrap();
    attributes.append(true).unwrap();
    attributes.append(false).unwrap();
    let address = StructArray::from(vec![
        (
            Arc::new(Field::new("city", DataType::Utf8, true)),
            Arc::new(StringArray::from(vec!["Oslo", "Rome", "Lima"])) as ArrayRef,
        ),
        (Arc::new(Field::new("zip", DataType::Int64, true)), Arc::new(Int64Array::from(vec![1, 2, 3])) as ArrayRef),
    ]);
    let (tags, attributes) = (tags.finish(), attributes.finish());
    let body = batch(
        vec![
            Field::new("id", DataType::Int64, false),
            Field::new("tags", tags.data_type().clone(), true),
            Field::new("attributes", attributes.data_type().clone(), true),
            Field::new("address", address.data_type().clone(), true),
        ],
        vec![Arc::new(Int64Array::from(vec![1, 2, 3])), Arc::new(tags), Arc::new(attributes), Arc::new(address)],
    );
    gw.post_accepted("r", "e", "orders", None, ipc_stream(&[body])).await;
    proxy.set_jobs(JobMode::RunFor(Duration::ZERO));
    assert_eq!(gw.commit_and_wait("r", "e").await["state"], "committed");

    let created = proxy
        .requests("POST", "/tables")
        .into_iter()
        .find(|r| r.body["tableReference"]["tableId"] == "orders")
        .expect("the destination was created");
    let fields: Vec<(String, String, String)> = created.body["schema"]["fields"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            (f["name"].as_str().unwrap().into(), f["type"].as_str().unwrap().into(), f["mode"].as_str().unwrap().into())
        })
        .collect();
    let field = |n: &str, t: &str, m: &str| (n.to_string(), t.to_string(), m.to_string());
    assert_eq!(
        fields,
        vec![
            field("id", "INT64", "NULLABLE"),
            field("tags", "STRING", "REPEATED"),
            field("attributes", "RECORD", "REPEATED"),
            field("address", "RECORD", "NULLABLE"),
        ]
    );
    let attribute_fields = &created.body["schema"]["fields"][2]["fields"];
    assert_eq!(attribute_fields[0]["name"], "key");
    assert_eq!(attribute_fields[1]["name"], "value");
    assert_eq!(created.body["schema"]["fields"][3]["fields"][1]["type"], "INT64");
    assert_eq!(fake.stream_for("orders").ids, vec![1, 2, 3], "every row reached the stream");
    let insert = proxy.queries().pop().unwrap();
    assert!(insert.contains("`tags`, `attributes`, `address`"), "{insert}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_failure_during_publication_reports_each_destination() {
    let proxy = RestProxy::start(&required_env("BIGQUERY_EMULATOR_HOST")).await;
    let gw = GatewayOptions::new().rest_proxy(&proxy).spawn().await;
    TestRun::new("r", "e").full_append(&["good", "bad"]).open(&gw).await;
    gw.post_accepted("r", "e", "good", None, ipc_stream(&[ids(0..7)])).await;
    gw.post_accepted("r", "e", "bad", None, ipc_stream(&[ids(0..3)])).await;
    proxy.set_jobs(JobMode::invalid_query("`bad`", "Query error: quota"));
    let failed = gw.commit_and_wait("r", "e").await;
    assert_eq!(failed["state"], "failed", "{failed}");
    assert_eq!(failed["error"]["code"], "publication_failed", "{failed}");
    let detail = failed["error"]["detail"].as_str().unwrap();
    assert!(detail.contains("resource bad") && !detail.contains("resource good"), "{detail}");
    let state_of = |resource: &str| {
        failed["resources"].as_array().unwrap().iter().find(|r| r["resource"] == resource).unwrap()["publication"]
            ["state"]
            .clone()
    };
    assert_eq!(state_of("good"), "done");
    assert_eq!(state_of("bad"), "failed");
    assert_eq!(count_rows(&gw, "good").await, 7);
    assert_eq!(count_rows(&gw, "bad").await, 0);
    let (_, run) = gw.json(Method::GET, "/v1/runs/r", None).await;
    assert_eq!(run["durable_checkpoint"], Value::Null, "{run}");
    // Both staging tables are gone: one published, the other's job failed for good.
    let deleted: Vec<String> =
        proxy.requests("DELETE", "/tables/_filament_stg_").iter().map(|r| r.path.clone()).collect();
    assert_eq!(deleted.len(), 2, "{deleted:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn abort_before_commit_deletes_the_staging_tables() {
    let proxy = RestProxy::start(&required_env("BIGQUERY_EMULATOR_HOST")).await;
    let gw = GatewayOptions::new().rest_proxy(&proxy).spawn().await;
    TestRun::new("r", "e").full_append(&["t"]).open(&gw).await;
    gw.post_accepted("r", "e", "t", None, ipc_stream(&[ids(0..7)])).await;
    // Flushed, so the lane sets up: wait for its staging table.
    let (status, _) =
        gw.json(Method::POST, "/v1/runs/r/executions/e/checkpoints", Some(json!({"checkpoint": 1}))).await;
    assert_eq!(status, StatusCode::OK);
    let staging = eventually(Duration::from_secs(10), "the lane to create its staging table", || async {
        proxy
            .requests("POST", "/tables")
            .iter()
            .filter_map(|r| r.body["tableReference"]["tableId"].as_str().map(str::to_string))
            .find(|t| t.starts_with("_filament_stg_"))
    })
    .await;
    let (status, aborted) = gw.json(Method::POST, "/v1/runs/r/executions/e/abort", None).await;
    assert_eq!(status, StatusCode::OK, "{aborted}");
    let deleted = format!("the abort to delete staging table {staging}");
    eventually(Duration::from_secs(10), &deleted, || async {
        (!proxy.requests("DELETE", &format!("/tables/{staging}")).is_empty()).then_some(())
    })
    .await;
}
