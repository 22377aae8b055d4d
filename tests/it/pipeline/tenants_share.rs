//! Principals share BigQuery's quotas and the adaptive limits fairly (`bigquery::fair`): while
//! one principal sets up 2,000 one-row resources against a control plane paced at Google's
//! published quotas (`support::control_plane`, with the gateway's `FILAMENT_QUOTA_*` at their
//! defaults, Google's), another principal's one-table execution commits within 30 s; what
//! waits shows in `/metrics` without naming a principal or a project. Caps per principal (open
//! lanes, connection tests in flight) refuse with a stable code and change nothing.

use std::time::Duration;

use futures::StreamExt as _;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use tokio::time::Instant;

use crate::support::arrow::{ids, ipc_stream};
use crate::support::control_plane::SimulatedRest;
use crate::support::control_plane::limits::Limits;
use crate::support::fake_write::FakeWrite;
use crate::support::principals::{PrincipalsFile, entry, new_token};
use crate::support::{Gateway, GatewayOptions, assert_problem, random_suffix, send, within};

/// Resources the bulk principal sets up.
const BULK_RESOURCES: usize = 2_000;
/// How long the other principal's one-table execution may take, commit included.
const SMALL_COMMIT_DEADLINE: Duration = Duration::from_secs(30);

/// A request as the principal holding `token`.
fn as_principal(gw: &Gateway, token: &str, method: Method, path: &str) -> reqwest::RequestBuilder {
    gw.unauthenticated(method, path).bearer_auth(token)
}

/// Sends the request `make` builds until it is answered otherwise than 429 or 503 (the
/// gateway's backpressure and load shedding ask the client to come back), for at most a minute.
async fn send_until_served(make: impl Fn() -> reqwest::RequestBuilder) -> (StatusCode, Value) {
    let answer = within(Duration::from_secs(60), Duration::from_millis(50), || async {
        let (status, body) = send(make()).await;
        let busy = status == StatusCode::TOO_MANY_REQUESTS || status == StatusCode::SERVICE_UNAVAILABLE;
        (!busy).then_some((status, body))
    });
    answer.await.expect("the gateway served the request within a minute")
}

/// Creates `run` as the principal of `token` in `dataset` of the gateway's project, with a
/// 100 ms flush interval (set-ups start as batches arrive), its `resources` declared and
/// execution `e` opened.
async fn open_run(gw: &Gateway, token: &str, run: &str, dataset: &str, resources: &[String]) {
    let body = json!({"run_id": run, "destination": {"project": gw.project, "dataset": dataset},
        "batching": {"flush_interval_ms": 100}});
    let (status, created) = send(as_principal(gw, token, Method::POST, "/v1/runs").json(&body)).await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    let declaration = &json!({"write_mode": "full_append"});
    let declarations = futures::stream::iter(resources.iter().map(|resource| async move {
        let path = format!("/v1/runs/{run}/resources/{resource}");
        let (status, body) = send_until_served(|| as_principal(gw, token, Method::PUT, &path).json(declaration)).await;
        assert_eq!(status, StatusCode::OK, "{body}");
    }));
    declarations.buffer_unordered(32).collect::<Vec<()>>().await;
    let open = json!({"execution_id": "e"});
    let (status, body) =
        send(as_principal(gw, token, Method::POST, &format!("/v1/runs/{run}/executions")).json(&open)).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
}

/// Posts one row to each of `resources` in execution `e` of `run`, 64 at once.
async fn post_one_row_each(gw: &Gateway, token: &str, run: &str, resources: &[String]) {
    let body = ipc_stream(&[ids(0..1)]);
    let body = &body;
    let posts = futures::stream::iter(resources.iter().map(|resource| async move {
        let path = format!("/v1/runs/{run}/executions/e/resources/{resource}/batches");
        let post = || {
            as_principal(gw, token, Method::POST, &path)
                .header("content-type", "application/vnd.apache.arrow.stream")
                .body(body.clone())
        };
        let (status, receipt) = send_until_served(post).await;
        assert_eq!(status, StatusCode::ACCEPTED, "{receipt}");
    }));
    posts.buffer_unordered(64).collect::<Vec<()>>().await;
}

/// The lines of the fair-sharing series in `metrics`.
fn fairness_series(metrics: &str) -> Vec<&str> {
    metrics
        .lines()
        .filter(|line| !line.starts_with('#'))
        .filter(|line| line.contains("filament_fair_queue_") || line.contains("filament_principal_cap_"))
        .collect()
}

/// The value of `series` (name and labels as exported) in `metrics`.
fn value_of(metrics: &str, series: &str) -> Option<f64> {
    metrics.lines().find_map(|line| line.strip_prefix(series)?.strip_prefix(' ')?.trim().parse().ok())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_principal_setting_up_two_thousand_tables_leaves_anothers_commit_within_thirty_seconds() {
    // Google's published quotas and latencies: 10 tables.insert a second per user, 10,000
    // CreateWriteStream an hour per project (167 a minute), 100 REST calls a second per method.
    let limits = Limits::default();
    let fake = FakeWrite::start().await;
    limits.apply_to(&fake);
    let rest = SimulatedRest::start(limits, 0).await;
    let small_token = new_token();
    let file = PrincipalsFile::new(&[entry("small", &[&small_token], "destinations = [\"filament-demo.*\"]")]);
    let (name, path) = file.env();
    // The bulk principal is the simple mode's `default` (the harness's token); the gateway's
    // FILAMENT_QUOTA_* are left at their defaults, Google's.
    let gw = GatewayOptions::new().fake_write(&fake).rest_host(&rest.address).env(name, &path).spawn().await;
    let bulk_token = gw.token.clone();

    let bulk_run = format!("bulk_{}", random_suffix());
    let bulk_resources: Vec<String> = (0..BULK_RESOURCES).map(|i| format!("r{i:04}")).collect();
    open_run(&gw, &bulk_token, &bulk_run, &gw.dataset, &bulk_resources).await;
    post_one_row_each(&gw, &bulk_token, &bulk_run, &bulk_resources).await;
    let queued = gw.metric("filament_fair_queue_calls_waiting{operation=\"set_up\"}").await;
    let set_up = rest.calls_of("tables.insert") / 2;
    assert!(set_up < BULK_RESOURCES / 2, "bulk's set-ups are still running ({set_up} of {BULK_RESOURCES} done)");

    let started = Instant::now();
    let small_run = format!("small_{}", random_suffix());
    let small_dataset = format!("{}_small", gw.dataset);
    let table = vec!["only".to_string()];
    open_run(&gw, &small_token, &small_run, &small_dataset, &table).await;
    post_one_row_each(&gw, &small_token, &small_run, &table).await;
    let commit = as_principal(&gw, &small_token, Method::POST, &format!("/v1/runs/{small_run}/executions/e/commit"));
    let (status, body) = send(commit).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    let metrics_while_waiting = gw.metrics().await;
    let execution = format!("/v1/runs/{small_run}/executions/e");
    let ended = within(SMALL_COMMIT_DEADLINE.saturating_sub(started.elapsed()), Duration::from_millis(100), || async {
        let (status, body) = send(as_principal(&gw, &small_token, Method::GET, &execution)).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        (body["state"] != "extracting" && body["state"] != "committing").then_some(body)
    })
    .await;
    let set_up_meanwhile = rest.calls_of("tables.insert") / 2;
    let ended = ended.unwrap_or_else(|| {
        panic!(
            "the small principal's one-table execution did not end within {SMALL_COMMIT_DEADLINE:?} while the bulk \
             principal set up {BULK_RESOURCES} tables ({set_up} set up when it started, {set_up_meanwhile} by now)"
        )
    });
    assert_eq!(ended["state"], "committed", "{ended}");
    let committed_rows: i64 = fake.with(|s| s.streams.values().filter(|st| st.committed).map(|st| st.rows).sum());
    assert_eq!(committed_rows, 1, "the small principal's row, and none of bulk's yet");
    assert!(rest.calls_of("tables.insert") / 2 < BULK_RESOURCES, "bulk was still setting up when small committed");

    // What waits is shown by queue, never by principal or project.
    assert!(queued.is_some_and(|calls| calls > 0.0), "bulk's set-ups waited their turn: {queued:?}");
    let series = fairness_series(&metrics_while_waiting);
    assert!(!series.is_empty(), "{metrics_while_waiting}");
    let principals_waiting =
        value_of(&metrics_while_waiting, "filament_fair_queue_principals_waiting{operation=\"set_up\"}");
    assert!(principals_waiting.is_some_and(|principals| principals >= 1.0), "{series:#?}");
    for line in &series {
        for named in ["default", "small", gw.project.as_str(), gw.dataset.as_str()] {
            assert!(!line.contains(named), "a fairness series names {named:?}: {line}");
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_principal_at_its_open_lanes_cap_is_refused_changing_nothing_and_another_is_served() {
    let other_token = new_token();
    let file = PrincipalsFile::new(&[entry("other", &[&other_token], "destinations = [\"filament-demo.*\"]")]);
    let (name, path) = file.env();
    let gw = GatewayOptions::new().env(name, &path).env("FILAMENT_MAX_OPEN_LANES_PER_PRINCIPAL", "2").spawn().await;
    let token = gw.token.clone();
    let resources: Vec<String> = ["a", "b", "c"].into_iter().map(str::to_string).collect();
    open_run(&gw, &token, "capped", &gw.dataset, &resources).await;
    post_one_row_each(&gw, &token, "capped", &resources[..2]).await;
    // A second batch of a resource with a lane opens none.
    post_one_row_each(&gw, &token, "capped", &resources[..1]).await;

    let before = gw.db_snapshot().await;
    let (status, problem) = gw.post_batch("capped", "e", "c", Some(7), ipc_stream(&[ids(0..1)])).await;
    let problem = assert_problem((status, problem), StatusCode::TOO_MANY_REQUESTS, "lane_limit");
    assert!(problem["detail"].as_str().unwrap().contains("FILAMENT_MAX_OPEN_LANES_PER_PRINCIPAL"), "{problem}");
    assert!(problem["hint"].as_str().unwrap().contains("commit or abort"), "{problem}");
    assert_eq!(gw.db_snapshot().await, before, "the refused batch changed nothing");
    let refusals = gw.metric("filament_principal_cap_refusals_total{cap=\"open_lanes\"}").await;
    assert!(refusals.is_some_and(|refused| refused >= 1.0), "{refusals:?}");

    // Another principal's lanes are its own.
    let other_dataset = format!("{}_other", gw.dataset);
    open_run(&gw, &other_token, "other", &other_dataset, &resources).await;
    post_one_row_each(&gw, &other_token, "other", &resources[..2]).await;

    // The commit gives the lanes back: the refused resource goes in the next execution.
    let committed = gw.commit_and_wait("capped", "e").await;
    assert_eq!(committed["state"], "committed", "{committed}");
    gw.open_new_execution("capped", "e2").await;
    gw.post_accepted("capped", "e2", "c", Some(7), ipc_stream(&[ids(0..1)])).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_principal_at_its_connection_tests_cap_is_refused_and_another_is_served() {
    // A project whose queries take 6 s: each connection test holds its place that long.
    let limits = Limits { query: Duration::from_secs(6), concurrent_dml_per_table: 100, ..Limits::quick() };
    let rest = SimulatedRest::start(limits, 0).await;
    let other_token = new_token();
    let file = PrincipalsFile::new(&[entry("other", &[&other_token], "destinations = [\"filament-demo.*\"]")]);
    let (name, path) = file.env();
    let gw = GatewayOptions::new()
        .rest_host(&rest.address)
        .env(name, &path)
        .env("FILAMENT_MAX_CONNECTION_TESTS_PER_PRINCIPAL", "2")
        .spawn()
        .await;
    let url = gw.url("/v1/connections/test");
    let test = |token: String| {
        send(reqwest::Client::new().post(&url).bearer_auth(token).json(&json!({"project": "filament-demo"})))
    };
    let token = gw.token.clone();
    let in_flight = [tokio::spawn(test(token.clone())), tokio::spawn(test(token.clone()))];
    let started = Instant::now();
    let jobs_started = within(Duration::from_secs(5), Duration::from_millis(20), || async {
        (rest.counters().jobs_inserted >= 2).then_some(())
    });
    jobs_started.await.expect("both connection tests submitted their job");
    let refused = assert_problem(test(token.clone()).await, StatusCode::TOO_MANY_REQUESTS, "principal_limit");
    assert!(started.elapsed() < Duration::from_secs(3), "refused at once, not after the tests in flight");
    assert!(refused["detail"].as_str().unwrap().contains("connection tests"), "{refused}");
    assert_eq!(rest.counters().jobs_inserted, 2, "the refused test submitted no job");
    let (status, answer) = test(other_token).await;
    assert_eq!(status, StatusCode::OK, "another principal's test runs: {answer}");
    for test in in_flight {
        let (status, answer) = test.await.unwrap();
        assert_eq!(status, StatusCode::OK, "{answer}");
    }
    let (status, answer) = test(token).await;
    assert_eq!(status, StatusCode::OK, "the places came back: {answer}");
}
