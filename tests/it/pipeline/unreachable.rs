//! BigQuery that does not answer, and credentials that do not exist: every call has a
//! deadline, so `/readyz` answers within Kubernetes' probe timeout and the connection test
//! within its own, each saying plainly what is wrong.

use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use tokio::time::Instant;

use crate::support::{Gateway, GatewayOptions, send};

/// A TCP endpoint that accepts connections (into its backlog) and never answers.
fn blackhole() -> (std::net::TcpListener, String) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = listener.local_addr().unwrap().to_string();
    (listener, address)
}

async fn timed(request: reqwest::RequestBuilder) -> (StatusCode, Value, Duration) {
    let started = Instant::now();
    let (status, body) = send(request).await;
    (status, body, started.elapsed())
}

async fn connection_test(gw: &Gateway) -> (StatusCode, Value, Duration) {
    timed(gw.request(Method::POST, "/v1/connections/test").json(&json!({"project": "filament-demo"}))).await
}

#[tokio::test(flavor = "multi_thread")]
async fn an_unreachable_bigquery_gets_answers_within_the_deadlines() {
    let (_hole, address) = blackhole();
    let gw = GatewayOptions::new().rest_host(&address).spawn().await;

    let (status, ready, elapsed) = timed(gw.unauthenticated(Method::GET, "/readyz")).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{ready}");
    assert_eq!(ready["checks"][1]["ok"], false, "{ready}");
    assert!(elapsed < Duration::from_secs(5), "/readyz took {elapsed:?}");

    let (status, problem, elapsed) = connection_test(&gw).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{problem}");
    assert_eq!(problem["code"], "bigquery_unavailable", "{problem}");
    assert!(problem["hint"].as_str().unwrap_or_default().contains(&address), "the hint names the endpoint: {problem}");
    assert!(elapsed < Duration::from_secs(17), "the connection test took {elapsed:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn missing_credentials_are_reported_plainly_and_in_time() {
    // No emulator (empty values count as unset), no GOOGLE_APPLICATION_CREDENTIALS, no HOME and
    // so no gcloud file, and a metadata server that never answers.
    let (_hole, metadata) = blackhole();
    let gw =
        GatewayOptions::new().rest_host("").storage_write_host("").env("GCE_METADATA_HOST", &metadata).spawn().await;

    let (status, ready, elapsed) = timed(gw.unauthenticated(Method::GET, "/readyz")).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{ready}");
    let error = ready["checks"][1]["error"].as_str().unwrap_or_default();
    for expected in
        ["could not find default credentials", "GOOGLE_APPLICATION_CREDENTIALS is not set", "metadata server"]
    {
        assert!(error.contains(expected), "{expected:?} missing from {error}");
    }
    assert!(!error.contains("transient"), "{error}");
    assert!(elapsed < Duration::from_secs(5), "/readyz took {elapsed:?}");

    let (status, problem, elapsed) = connection_test(&gw).await;
    assert_eq!(problem["code"], "missing_credentials", "{problem}");
    assert_eq!(status, StatusCode::BAD_GATEWAY, "{problem}");
    assert!(problem["detail"].as_str().unwrap().contains("could not find default credentials"), "{problem}");
    assert!(problem["hint"].as_str().unwrap().contains("gcloud auth application-default login"), "{problem}");
    assert!(elapsed < Duration::from_secs(15), "the connection test took {elapsed:?}");
    assert!(gw.logs().contains("could not find default credentials"), "the start-up log says so too");
}
