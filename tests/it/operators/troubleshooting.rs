//! The failures users can fix, recognised from BigQuery's real error shapes wherever they occur
//! (start-up, the connection test, a run) and answered with their code and hint.

use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde_json::json;

use crate::support::arrow::{ids, ipc_stream};
use crate::support::fake_rest::{FakeRest, RestAnswer, bigquery_error, service_disabled_info};
use crate::support::fake_write::FakeWrite;
use crate::support::{GatewayOptions, TestRun, eventually, required_env};

#[tokio::test(flavor = "multi_thread")]
async fn the_connection_test_names_disabled_apis_missing_permissions_and_location_mismatches() {
    let disabled = "BigQuery API has not been used in project 123456 before or it is disabled.";
    let fake = FakeRest::start(vec![RestAnswer {
        method: "POST",
        path_contains: "/projects/disabled-project/jobs",
        status: 403,
        body: bigquery_error(
            403,
            "PERMISSION_DENIED",
            disabled,
            "accessDenied",
            vec![service_disabled_info("bigquery.googleapis.com")],
        ),
    }])
    .await;
    fake.push(RestAnswer {
        method: "POST",
        path_contains: "/projects/locked-project/jobs",
        status: 403,
        body: bigquery_error(
            403,
            "PERMISSION_DENIED",
            "Access Denied: Project locked-project: User does not have bigquery.jobs.create permission in project locked-project.",
            "accessDenied",
            vec![],
        ),
    });
    fake.push(RestAnswer {
        method: "POST",
        path_contains: "/projects/far-project/jobs",
        status: 404,
        body: bigquery_error(
            404,
            "NOT_FOUND",
            "Not found: Dataset far-project:raw was not found in location EU",
            "notFound",
            vec![],
        ),
    });
    let gw = GatewayOptions::new().fake_rest(&fake).spawn().await;
    let test = |project: &'static str| {
        let gw = &gw;
        async move {
            gw.json(Method::POST, "/v1/connections/test", Some(json!({"project": project, "location": "EU"}))).await
        }
    };

    let (status, body) = test("disabled-project").await;
    assert_eq!(status, StatusCode::BAD_GATEWAY, "{body}");
    assert_eq!(body["code"], "service_disabled");
    assert!(body["hint"].as_str().unwrap().contains("gcloud services enable bigquery.googleapis.com"), "{body}");

    let (status, body) = test("locked-project").await;
    assert_eq!(status, StatusCode::BAD_GATEWAY, "{body}");
    assert_eq!(body["code"], "permission_denied");
    assert!(body["detail"].as_str().unwrap().contains("bigquery.jobs.create"), "names the permission: {body}");
    assert!(body["hint"].as_str().unwrap().contains("roles/bigquery.jobUser"), "{body}");

    let (status, body) = test("far-project").await;
    assert_eq!(status, StatusCode::BAD_GATEWAY, "{body}");
    assert_eq!(body["code"], "dataset_location_mismatch");
    assert!(body["hint"].as_str().unwrap().contains("location"), "{body}");
}

/// What Google answers a call to an API the project has not enabled: `PERMISSION_DENIED`, its
/// message naming the project, and as details the `ErrorInfo` (reason `SERVICE_DISABLED`, the
/// service among its metadata), the message again localized and a `Help` link to enable it.
fn service_disabled_status(service: &str, title: &str) -> tonic::Status {
    use googleapis_tonic_google_rpc::google::rpc::{ErrorInfo, Help, LocalizedMessage, Status, help::Link};
    use prost::Message as _;
    let activation_url = format!("https://console.developers.google.com/apis/api/{service}/overview?project=123456");
    let message = format!(
        "{title} has not been used in project 123456 before or it is disabled. Enable it by visiting {activation_url} \
         then retry. If you enabled this API recently, wait a few minutes for the action to propagate to our systems \
         and retry."
    );
    let metadata = [
        ("consumer", "projects/123456"),
        ("service", service),
        ("activationUrl", &activation_url),
        ("serviceTitle", title),
        ("containerInfo", "123456"),
    ];
    let info = ErrorInfo {
        reason: "SERVICE_DISABLED".into(),
        domain: "googleapis.com".into(),
        metadata: metadata.into_iter().map(|(key, value)| (key.to_string(), value.to_string())).collect(),
    };
    let localized = LocalizedMessage { locale: "en-US".into(), message: message.clone() };
    let help = Help {
        links: vec![Link { description: "Google developers console API activation".into(), url: activation_url }],
    };
    let detail = |name: &str, value: Vec<u8>| prost_types::Any {
        type_url: format!("type.googleapis.com/google.rpc.{name}"),
        value,
    };
    let status = Status {
        code: tonic::Code::PermissionDenied as i32,
        message: message.clone(),
        details: vec![
            detail("ErrorInfo", info.encode_to_vec()),
            detail("LocalizedMessage", localized.encode_to_vec()),
            detail("Help", help.encode_to_vec()),
        ],
    };
    tonic::Status::with_details(tonic::Code::PermissionDenied, message, status.encode_to_vec().into())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_disabled_storage_api_fails_the_run_with_its_fix() {
    let fake = FakeWrite::start().await;
    fake.with(|s| {
        s.create_error = Some(service_disabled_status("bigquerystorage.googleapis.com", "BigQuery Storage API"))
    });
    let gw = GatewayOptions::new().fake_write(&fake).spawn().await;
    TestRun::new("run", "e").full_append(&["t"]).open(&gw).await;
    let (status, _) = gw.post_batch("run", "e", "t", None, ipc_stream(&[ids(0..3)])).await;
    assert_eq!(status, StatusCode::ACCEPTED);
    // The lane fails the execution as soon as stream creation is refused.
    let execution = eventually(Duration::from_secs(5), "execution e to fail", || async {
        let (status, execution) = gw.json(Method::GET, "/v1/runs/run/executions/e", None).await;
        assert_eq!(status, StatusCode::OK, "{execution}");
        (execution["state"] == "failed").then_some(execution)
    })
    .await;
    assert_eq!(execution["error"]["code"], "service_disabled", "{execution}");
    assert!(execution["error"]["hint"].as_str().unwrap().contains("bigquerystorage.googleapis.com"));
    let (status, body) = gw.post_batch("run", "e", "t", None, ipc_stream(&[ids(3..6)])).await;
    assert_eq!((status, body["code"].clone()), (StatusCode::CONFLICT, json!("execution_not_extracting")));
}

#[test]
fn unusable_credentials_stop_the_start_with_the_fix() {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_filament-bigquery"))
        .arg("serve")
        .env_clear()
        .env("DATABASE_URL", required_env("DATABASE_URL"))
        .env("FILAMENT_LISTEN", "127.0.0.1:0")
        .env("FILAMENT_API_TOKENS", "a-token-of-sixteen-chars")
        .env("GOOGLE_APPLICATION_CREDENTIALS", "/nonexistent/key.json")
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("missing_credentials"), "{stderr}");
    assert!(stderr.contains("gcloud auth application-default login"), "{stderr}");
}
