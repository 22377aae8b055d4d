//! Operations endpoints, auth on every `/v1` route, and the OpenAPI document's drift.

use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::support::arrow::{ids, ipc_stream};
use crate::support::{Gateway, GatewayOptions, TestRun, assert_problem, eventually, send};

const OPENAPI_PATH: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/openapi/openapi.json");

#[test]
fn the_checked_in_openapi_document_matches_the_handlers() {
    let generated = filament_bigquery::api::openapi_json();
    if std::env::var_os("UPDATE_OPENAPI").is_some() {
        std::fs::write(OPENAPI_PATH, format!("{generated}\n")).unwrap();
    }
    let checked_in = std::fs::read_to_string(OPENAPI_PATH).expect("openapi/openapi.json exists");
    assert_eq!(
        checked_in.trim_end(),
        generated,
        "openapi/openapi.json is stale: run `make openapi` (or UPDATE_OPENAPI=1 cargo test)"
    );
    let document: Value = serde_json::from_str(&generated).unwrap();
    assert_eq!(document["openapi"], "3.1.0");
}

/// The OpenAPI document the gateway serves (`/openapi.json`, without a token).
async fn served_document(gw: &Gateway) -> Value {
    let (status, served) = send(gw.unauthenticated(Method::GET, "/openapi.json")).await;
    assert_eq!(status, StatusCode::OK);
    served
}

#[tokio::test(flavor = "multi_thread")]
async fn the_served_openapi_document_is_the_checked_in_one() {
    let gw = Gateway::spawn().await;
    let checked_in: Value = serde_json::from_str(&std::fs::read_to_string(OPENAPI_PATH).unwrap()).unwrap();
    assert_eq!(served_document(&gw).await, checked_in);
}

/// Every operation of the served document: those under `/v1` answer 401 without a token and
/// document their security, the others are public.
#[tokio::test(flavor = "multi_thread")]
async fn every_v1_route_needs_a_token_and_documents_it() {
    let gw = Gateway::spawn().await;
    let served = served_document(&gw).await;
    let mut v1_operations = 0;
    for (path, item) in served["paths"].as_object().unwrap() {
        for (method, operation) in item.as_object().unwrap() {
            let method: Method = method.to_uppercase().parse().unwrap();
            let concrete = path.replace("{run_id}", "r").replace("{execution_id}", "e").replace("{resource}", "x");
            let response = send(gw.unauthenticated(method.clone(), &concrete)).await;
            if path.starts_with("/v1/") {
                v1_operations += 1;
                assert_eq!(response.0, StatusCode::UNAUTHORIZED, "{method} {path}");
                assert_eq!(response.1["code"], "unauthorized");
                assert!(operation["security"].is_array(), "{method} {path} documents its security");
            } else {
                assert_ne!(response.0, StatusCode::UNAUTHORIZED, "{method} {path} is public");
            }
        }
    }
    assert_eq!(v1_operations, 13, "every /v1 operation of the router is in the document");
}

#[tokio::test(flavor = "multi_thread")]
async fn healthz_answers_ok_and_readyz_names_its_three_checks() {
    let gw = Gateway::spawn().await;
    let (status, body) = send(gw.unauthenticated(Method::GET, "/healthz")).await;
    assert_eq!((status, body), (StatusCode::OK, Value::String("ok".into())));
    let (status, ready) = send(gw.unauthenticated(Method::GET, "/readyz")).await;
    assert_eq!(status, StatusCode::OK, "{ready}");
    let checks: Vec<&str> = ready["checks"].as_array().unwrap().iter().map(|c| c["name"].as_str().unwrap()).collect();
    assert_eq!(checks, ["postgres", "bigquery", "serving"], "{ready}");
}

/// One batch of 42 rows loaded and committed shows in `/metrics`: rows received, queued,
/// appended, the publication, the append and the batch request by route and status.
#[tokio::test(flavor = "multi_thread")]
async fn metrics_count_the_rows_batches_appends_and_publication_of_a_load() {
    let gw = Gateway::spawn().await;
    TestRun::new("run", "e").full_append(&["t"]).open(&gw).await;
    let (status, _) = gw.post_batch("run", "e", "t", None, ipc_stream(&[ids(0..42)])).await;
    assert_eq!(status, StatusCode::ACCEPTED);
    gw.commit_and_wait("run", "e").await;
    let metrics = gw.metrics().await;
    for expected in [
        "filament_rows_received_total 42",
        "filament_batches_queued_total 1",
        "filament_rows_appended_total 42",
        "filament_publications_total{outcome=\"done\"} 1",
        "filament_appends_total{outcome=\"appended\"}",
        "filament_http_requests_total{method=\"POST\",route=\"/v1/runs/{run_id}/executions/{execution_id}/resources/{resource}/batches\",status=\"202\"} 1",
    ] {
        assert!(metrics.contains(expected), "missing {expected:?} in:\n{metrics}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn readiness_fails_when_bigquery_is_unreachable() {
    let gw = GatewayOptions::new().rest_host("127.0.0.1:9").storage_write_host("127.0.0.1:9").spawn().await;
    let (status, ready) = send(gw.unauthenticated(Method::GET, "/readyz")).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{ready}");
    assert_eq!(ready["checks"][0]["ok"], true);
    assert_eq!(ready["checks"][1]["name"], "bigquery");
    assert_eq!(ready["checks"][1]["ok"], false);
}

#[tokio::test(flavor = "multi_thread")]
async fn schemathesis_finds_no_server_error_and_no_undocumented_status() {
    let python = crate::support::required_env("FILAMENT_TOOLS_PYTHON");
    let st = std::path::Path::new(&python).with_file_name("st");
    let gw = Gateway::spawn().await;
    let output = tokio::process::Command::new(st)
        .args(["run", OPENAPI_PATH, "--url", &gw.base_url])
        .args(["-H", &format!("Authorization: Bearer {}", gw.token)])
        .args(["--checks", "not_a_server_error,status_code_conformance", "--max-examples", "25", "--seed", "7"])
        .env("PYTHONPATH", concat!(env!("CARGO_MANIFEST_DIR"), "/tests/schemathesis"))
        .env("SCHEMATHESIS_HOOKS", "hooks")
        .env("NO_COLOR", "1")
        .output()
        .await
        .expect("run schemathesis");
    let report = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{report}\n{}", String::from_utf8_lossy(&output.stderr));
    assert!(report.contains("passed"), "{report}");
    assert!(!gw.logs().contains("panicked"), "the gateway panicked");
}

#[tokio::test(flavor = "multi_thread")]
async fn readiness_turns_false_on_sigterm_while_the_replica_still_serves() {
    let mut gw = GatewayOptions::new().env("FILAMENT_SHUTDOWN_DELAY_SECS", "3").spawn().await;
    TestRun::new("run", "e").full_append(&["t"]).open(&gw).await;
    gw.signal_terminate();
    let unready = eventually(Duration::from_secs(5), "readiness to turn false", || async {
        let (status, ready) = send(gw.unauthenticated(Method::GET, "/readyz")).await;
        (status == StatusCode::SERVICE_UNAVAILABLE).then_some(ready)
    })
    .await;
    let serving = unready["checks"].as_array().unwrap().iter().find(|c| c["name"] == "serving").cloned();
    assert_eq!(serving.as_ref().map(|c| c["ok"].clone()), Some(json!(false)), "{unready}");
    // Still serving during the delay: its own execution's batches are accepted, new executions
    // go elsewhere.
    gw.post_accepted("run", "e", "t", Some(0), ipc_stream(&[ids(0..5)])).await;
    let refused = gw.open_execution("run", "other").await;
    assert_problem(refused, StatusCode::SERVICE_UNAVAILABLE, "replica_draining");
    assert!(gw.terminate().await.success());
    assert!(gw.execution_handed_over("run", "e").await, "the stopped replica handed its execution over");
}
