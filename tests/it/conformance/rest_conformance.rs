//! Every kind of REST call the gateway makes, judged by BigQuery's discovery document: the
//! recording proxy (`support::rest_proxy`) checks each request against it and answers one that
//! BigQuery would refuse with 400, so these runs would fail; here they also assert that the
//! proxy saw every method and found nothing, and that it does refuse a request BigQuery would.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use arrow_array::{Int64Array, StringArray, TimestampMicrosecondArray};
use arrow_schema::{DataType, Field, TimeUnit};
use reqwest::Method;
use serde_json::{Value, json};

use crate::support::arrow::{BASE_MICROS, batch, ids, ipc_stream};
use crate::support::rest_proxy::{JobMode, RestProxy};
use crate::support::{GatewayOptions, required_env};

/// Rows with a described key, a TIMESTAMP to partition on and a STRING to cluster by; with
/// `extra`, one more column (a later execution's schema evolution: `tables.patch`).
fn events(extra: bool) -> arrow_array::RecordBatch {
    let described =
        |field: Field, text: &str| field.with_metadata(HashMap::from([("description".to_string(), text.to_string())]));
    let mut fields = vec![
        described(Field::new("id", DataType::Int64, false), "Event key"),
        Field::new("at", DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())), true),
        Field::new("region", DataType::Utf8, true),
    ];
    let mut columns: Vec<arrow_array::ArrayRef> = vec![
        Arc::new(Int64Array::from(vec![1, 2, 3])),
        Arc::new(TimestampMicrosecondArray::from(vec![BASE_MICROS; 3]).with_timezone("UTC")),
        Arc::new(StringArray::from(vec!["a", "b", "c"])),
    ];
    if extra {
        fields.push(Field::new("added", DataType::Int64, true));
        columns.push(Arc::new(Int64Array::from(vec![7, 8, 9])));
    }
    batch(fields, columns)
}

#[tokio::test]
async fn every_rest_call_the_gateway_makes_follows_bigquerys_discovery_document() {
    let proxy = RestProxy::start(&required_env("BIGQUERY_EMULATOR_HOST")).await;
    let gw = GatewayOptions::new().rest_proxy(&proxy).spawn().await;
    let run = json!({
        "run_id": "r",
        "destination": {"project": gw.project, "dataset": gw.dataset, "location": "US"},
        "job_project": gw.project,
        "maximum_bytes_billed": 1_000_000_000,
    });
    let (status, body) = gw.json(Method::POST, "/v1/runs", Some(run)).await;
    assert_eq!(status, reqwest::StatusCode::CREATED, "{body}");
    let laid_out = json!({
        "partitioning": {"field": "at", "granularity": "DAY"},
        "clustering": ["region"],
        "require_partition_filter": false,
        "expiration_days": 30,
        "description": "Events",
        "labels": {"team": "data", "tier": ""},
    });
    let ranged = json!({"partitioning": {"field": "id", "range": {"start": 0, "end": 100, "interval": 10}}});
    gw.declare(
        "r",
        "events",
        json!({"write_mode": "incremental_upsert", "primary_key": ["id"], "table_options": laid_out}),
    )
    .await;
    gw.declare("r", "ranged", json!({"write_mode": "full_replace", "table_options": ranged})).await;
    gw.open_new_execution("r", "e1").await;
    gw.post_accepted("r", "e1", "events", None, ipc_stream(&[events(false)])).await;
    gw.post_accepted("r", "e1", "ranged", None, ipc_stream(&[ids(0..5)])).await;
    assert_eq!(gw.commit_and_wait("r", "e1").await["state"], "committed");

    // A second execution adds a column (tables.patch), and its jobs are polled (jobs.get).
    proxy.set_jobs(JobMode::RunFor(Duration::from_millis(300)));
    gw.open_new_execution("r", "e2").await;
    gw.post_accepted("r", "e2", "events", None, ipc_stream(&[events(true)])).await;
    assert_eq!(gw.commit_and_wait("r", "e2").await["state"], "committed");

    let problems = proxy.problems();
    assert!(problems.is_empty(), "requests BigQuery's discovery document refuses:\n{}", problems.join("\n"));
    let seen = |method: &str, path_part: &str| !proxy.requests(method, path_part).is_empty();
    let calls = [
        ("GET", "/datasets/", "datasets.get"),
        ("POST", "/datasets", "datasets.insert"),
        ("GET", "/tables/", "tables.get"),
        ("POST", "/tables", "tables.insert"),
        ("PATCH", "/tables/", "tables.patch"),
        ("DELETE", "/tables/", "tables.delete"),
        ("POST", "/jobs", "jobs.insert"),
        ("GET", "/jobs/", "jobs.get"),
    ];
    for (method, path_part, call) in calls {
        assert!(seen(method, path_part), "{call} was exercised");
    }
    let inserts = proxy.requests("POST", "/tables");
    let destination = inserts.iter().find(|r| r.body["tableReference"]["tableId"] == "events").expect("events created");
    for part in ["timePartitioning", "clustering", "expirationTime", "description", "labels"] {
        assert!(destination.body.get(part).is_some(), "the checked body carries {part}: {}", destination.body);
    }
    let job = proxy.requests("POST", "/jobs").into_iter().next().unwrap();
    assert!(job.body["configuration"]["labels"].is_object(), "{}", job.body);
    assert_eq!(job.body["configuration"]["query"]["maximumBytesBilled"], "1000000000", "{}", job.body);
}

#[tokio::test]
async fn the_proxy_refuses_what_bigquery_would_refuse() {
    let proxy = RestProxy::start(&required_env("BIGQUERY_EMULATOR_HOST")).await;
    let url = format!("http://{}/bigquery/v2/projects/filament-demo/datasets/d/tables", proxy.address);
    let bad: [(&str, Value); 3] = [
        ("an unknown field", json!({"tableReference": {"tableId": "t"}, "schemaa": {}})),
        ("an int64 as a number", json!({"tableReference": {"tableId": "t"}, "expirationTime": 86_400_000})),
        ("an output-only field", json!({"tableReference": {"tableId": "t"}, "creationTime": "1"})),
    ];
    for (what, body) in bad {
        let response = reqwest::Client::new().post(&url).json(&body).send().await.unwrap();
        assert_eq!(response.status(), reqwest::StatusCode::BAD_REQUEST, "{what}");
        let answer: Value = response.json().await.unwrap();
        assert!(answer["error"]["message"].as_str().unwrap().contains("discovery document"), "{what}: {answer}");
    }
    assert_eq!(proxy.problems().len(), 3, "{:#?}", proxy.problems());
}
