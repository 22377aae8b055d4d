//! Table layout at creation: a resource's `table_options` (partitioning, clustering,
//! descriptions, labels) shape the destination table the gateway creates, read back through the
//! emulator's REST API (`tables.get`) or, for what the emulator drops (range partitioning), from
//! the `tables.insert` the REST proxy recorded. An existing table is never re-laid out: a
//! different layout is reported as `layout_mismatch`. Invalid options get their own codes and
//! change nothing.

use std::collections::HashMap;
use std::sync::Arc;

use arrow_array::{ArrayRef, Float64Array, Int64Array, RecordBatch, StringArray, TimestampMicrosecondArray};
use arrow_schema::{DataType, Field, TimeUnit};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::support::arrow::{BASE_MICROS, batch, ids, ipc_stream};
use crate::support::rest_proxy::RestProxy;
use crate::support::rows::count_rows;
use crate::support::{Gateway, GatewayOptions, TestRun, assert_problem, required_env};

const HOUR_MICROS: i64 = 3_600_000_000;

fn described(field: Field, description: &str) -> Field {
    field.with_metadata(HashMap::from([("description".to_string(), description.to_string())]))
}

/// `id` (described), `created_at` TIMESTAMP, `region` (described) and `score` FLOAT64.
fn events(range: std::ops::Range<i64>) -> RecordBatch {
    let ids: Vec<i64> = range.collect();
    let columns: Vec<ArrayRef> = vec![
        Arc::new(Int64Array::from(ids.clone())),
        Arc::new(
            TimestampMicrosecondArray::from(ids.iter().map(|i| BASE_MICROS + i * HOUR_MICROS).collect::<Vec<_>>())
                .with_timezone("UTC"),
        ),
        Arc::new(StringArray::from(ids.iter().map(|i| format!("region-{}", i % 3)).collect::<Vec<_>>())),
        Arc::new(Float64Array::from(ids.iter().map(|i| *i as f64 / 2.0).collect::<Vec<_>>())),
    ];
    batch(
        vec![
            described(Field::new("id", DataType::Int64, false), "Event key"),
            Field::new("created_at", DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())), true),
            described(Field::new("region", DataType::Utf8, true), "Where it happened"),
            Field::new("score", DataType::Float64, true),
        ],
        columns,
    )
}

/// The table's metadata as the emulator's REST API returns it (`tables.get`).
async fn table_metadata(gw: &Gateway, table: &str) -> Value {
    let url = format!(
        "http://{}/bigquery/v2/projects/{}/datasets/{}/tables/{table}",
        gw.emulator_rest, gw.project, gw.dataset
    );
    let response = reqwest::get(url).await.expect("tables.get");
    assert!(response.status().is_success(), "tables.get {table}: {}", response.status());
    response.json().await.expect("table JSON")
}

fn field<'a>(table: &'a Value, name: &str) -> &'a Value {
    table["schema"]["fields"].as_array().unwrap().iter().find(|f| f["name"] == name).expect("the field")
}

async fn resource_view(gw: &Gateway, run: &str) -> Value {
    let (status, view) = gw.json(Method::GET, &format!("/v1/runs/{run}"), None).await;
    assert_eq!(status, StatusCode::OK, "{view}");
    view["resources"][0].clone()
}

fn declared_layout() -> Value {
    json!({
        "partitioning": {"field": "created_at", "granularity": "DAY"},
        "clustering": ["region", "id"],
        "description": "Events as they happened",
        "labels": {"team": "data-eng", "tier": ""},
    })
}

#[tokio::test(flavor = "multi_thread")]
async fn a_created_table_has_the_declared_partitioning_clustering_descriptions_and_labels() {
    let gw = Gateway::spawn().await;
    let declaration = json!({"write_mode": "full_append", "table_options": declared_layout()});
    TestRun::new("r", "e").resource("events", declaration).open(&gw).await;
    gw.post_accepted("r", "e", "events", None, ipc_stream(&[events(0..50)])).await;
    assert_eq!(gw.commit_and_wait("r", "e").await["state"], "committed");

    let table = table_metadata(&gw, "events").await;
    assert_eq!(table["timePartitioning"]["type"], "DAY", "{table}");
    assert_eq!(table["timePartitioning"]["field"], "created_at", "{table}");
    assert_eq!(table["clustering"]["fields"], json!(["region", "id"]), "{table}");
    assert_eq!(table["description"], "Events as they happened", "{table}");
    assert_eq!(table["labels"], json!({"team": "data-eng", "tier": ""}), "{table}");
    assert_eq!(field(&table, "id")["description"], "Event key");
    assert_eq!(field(&table, "region")["description"], "Where it happened");
    assert!(field(&table, "score").get("description").is_none_or(Value::is_null), "{table}");
    assert_eq!(count_rows(&gw, "events").await, 50);

    let view = resource_view(&gw, "r").await;
    assert_eq!(view["table_options"], declared_layout(), "{view}");
    assert!(view.get("layout_mismatch").is_none(), "a created table matches: {view}");
}

#[tokio::test(flavor = "multi_thread")]
async fn range_partitioning_and_the_keyed_default_clustering_reach_tables_insert() {
    let proxy = RestProxy::start(&required_env("BIGQUERY_EMULATOR_HOST")).await;
    let gw = GatewayOptions::new().rest_proxy(&proxy).spawn().await;
    let range = json!({"field": "id", "range": {"start": 0, "end": 1_000_000, "interval": 1000}});
    let declaration = json!({
        "write_mode": "incremental_upsert",
        "primary_key": ["id"],
        "table_options": {"partitioning": range, "require_partition_filter": true, "expiration_days": 30},
    });
    TestRun::new("r", "e").resource("users", declaration).open(&gw).await;
    gw.post_accepted("r", "e", "users", None, ipc_stream(&[ids(0..20)])).await;
    assert_eq!(gw.commit_and_wait("r", "e").await["state"], "committed");

    let inserts = proxy.requests("POST", "/tables");
    let users = inserts.iter().find(|r| r.body["tableReference"]["tableId"] == "users").expect("tables.insert users");
    assert_eq!(
        users.body["rangePartitioning"],
        json!({"field": "id", "range": {"start": "0", "end": "1000000", "interval": "1000"}})
    );
    assert_eq!(users.body["clustering"], json!({"fields": ["id"]}), "keyed: clustered by the key");
    assert_eq!(users.body["requirePartitionFilter"], true);
    let expires_at: i64 = users.body["expirationTime"].as_str().unwrap().parse().unwrap();
    let in_30_days = chrono::Utc::now().timestamp_millis() + 30 * 86_400_000;
    assert!((in_30_days - expires_at).abs() < 600_000, "expires in 30 days: {expires_at}");
    for staging in inserts.iter().filter(|r| r.body["tableReference"]["tableId"] != "users") {
        for layout in ["rangePartitioning", "timePartitioning", "clustering", "requirePartitionFilter", "labels"] {
            assert!(staging.body.get(layout).is_none(), "the staging table gets no {layout}: {}", staging.body);
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn an_existing_table_with_another_layout_is_left_alone_and_reported() {
    let gw = Gateway::spawn().await;
    TestRun::new("seed", "e").full_append(&["events"]).open(&gw).await;
    gw.post_accepted("seed", "e", "events", None, ipc_stream(&[events(0..10)])).await;
    assert_eq!(gw.commit_and_wait("seed", "e").await["state"], "committed");

    let declaration = json!({"write_mode": "full_append", "table_options": declared_layout()});
    TestRun::new("r", "e").resource("events", declaration).open(&gw).await;
    gw.post_accepted("r", "e", "events", None, ipc_stream(&[events(10..30)])).await;
    assert_eq!(gw.commit_and_wait("r", "e").await["state"], "committed", "loading goes on");

    let table = table_metadata(&gw, "events").await;
    assert!(table.get("timePartitioning").is_none_or(Value::is_null), "not re-laid out: {table}");
    assert!(table.get("clustering").is_none_or(Value::is_null), "not re-laid out: {table}");
    assert_eq!(count_rows(&gw, "events").await, 30);
    let view = resource_view(&gw, "r").await;
    assert_eq!(
        view["layout_mismatch"],
        json!([
            {"option": "partitioning", "table": "none", "declared": "DAY on created_at"},
            {"option": "clustering", "table": "none", "declared": "region, id"},
        ]),
        "{view}"
    );
    let logged = gw.logs().lines().any(|l| {
        l.contains("bigquery.write.set_up") && l.contains("layout_mismatch") && l.contains("DAY on created_at")
    });
    assert!(logged, "a bigquery.write.set_up event reports the mismatch:\n{}", gw.logs());
}

#[tokio::test(flavor = "multi_thread")]
async fn invalid_table_options_each_get_their_code_and_change_nothing() {
    let gw = Gateway::spawn().await;
    gw.create_run("r").await;
    let declared = gw.declare("r", "events", json!({"write_mode": "full_append"})).await;
    let cases = [
        (json!({"partitioning": {"field": "created_at", "granularity": "WEEK"}}), "invalid_partitioning"),
        (
            json!({"partitioning": {"field": "id", "range": {"start": 0, "end": 100_000, "interval": 1}}}),
            "invalid_partitioning",
        ),
        (json!({"clustering": ["a", "b", "c", "d", "e"]}), "invalid_clustering"),
        (json!({"labels": {"Team": "data"}}), "invalid_table_labels"),
        (json!({"labels": {"team": "Data Eng"}}), "invalid_table_labels"),
        (json!({"require_partition_filter": true}), "invalid_table_options"),
        (json!({"expiration_days": 0}), "invalid_table_options"),
    ];
    let before = gw.db_snapshot().await;
    for (options, code) in cases {
        let body = json!({"write_mode": "full_append", "table_options": options});
        let answer = gw.json(Method::PUT, "/v1/runs/r/resources/events", Some(body)).await;
        assert_problem(answer, StatusCode::UNPROCESSABLE_ENTITY, code);
    }
    let keyed_filter = json!({
        "write_mode": "cdc_merge", "primary_key": ["id"],
        "table_options": {"partitioning": {"field": "created_at", "granularity": "DAY"}, "require_partition_filter": true},
    });
    let answer = gw.json(Method::PUT, "/v1/runs/r/resources/events", Some(keyed_filter)).await;
    assert_problem(answer, StatusCode::UNPROCESSABLE_ENTITY, "invalid_table_options");
    let unknown = json!({"write_mode": "full_append", "table_options": {"partition": {}}});
    let answer = gw.json(Method::PUT, "/v1/runs/r/resources/events", Some(unknown)).await;
    assert_problem(answer, StatusCode::BAD_REQUEST, "invalid_request");
    assert_eq!(gw.db_snapshot().await, before, "rejected declarations change nothing");
    assert_eq!(resource_view(&gw, "r").await, declared);
}

#[tokio::test(flavor = "multi_thread")]
async fn options_that_do_not_fit_the_batch_schema_refuse_the_batch_and_change_nothing() {
    let gw = Gateway::spawn().await;
    TestRun::new("r", "e").open(&gw).await;
    let cases = [
        (json!({"partitioning": {"field": "region", "granularity": "DAY"}}), "invalid_partitioning"),
        (json!({"partitioning": {"field": "missing", "granularity": "DAY"}}), "invalid_partitioning"),
        (
            json!({"partitioning": {"field": "created_at", "range": {"start": 0, "end": 10, "interval": 1}}}),
            "invalid_partitioning",
        ),
        (json!({"clustering": ["score"]}), "invalid_clustering"),
        (json!({"clustering": ["missing"]}), "invalid_clustering"),
    ];
    for (options, code) in cases {
        gw.declare("r", "events", json!({"write_mode": "full_append", "table_options": options})).await;
        let before = gw.db_snapshot().await;
        let answer = gw.post_batch("r", "e", "events", Some(0), ipc_stream(&[events(0..5)])).await;
        let problem = assert_problem(answer, StatusCode::UNPROCESSABLE_ENTITY, code);
        assert!(problem["detail"].as_str().unwrap().starts_with("table_options."), "{problem}");
        assert_eq!(gw.db_snapshot().await, before, "the refused batch changed nothing");
    }
    let long = "x".repeat(1025);
    let described_too_long = batch(
        vec![described(Field::new("id", DataType::Int64, false), &long)],
        vec![Arc::new(Int64Array::from(vec![1]))],
    );
    gw.declare("r", "events", json!({"write_mode": "full_append"})).await;
    let answer = gw.post_batch("r", "e", "events", Some(0), ipc_stream(&[described_too_long])).await;
    assert_problem(answer, StatusCode::UNPROCESSABLE_ENTITY, "invalid_table_options");

    // The options are part of the declaration: fixed once the resource has batches.
    let clustered = json!({"write_mode": "full_append", "table_options": {"clustering": ["region"]}});
    gw.declare("r", "events", clustered.clone()).await;
    gw.post_accepted("r", "e", "events", Some(0), ipc_stream(&[events(0..5)])).await;
    gw.declare("r", "events", clustered).await;
    let reclustered = json!({"write_mode": "full_append", "table_options": {"clustering": ["id"]}});
    let answer = gw.json(Method::PUT, "/v1/runs/r/resources/events", Some(reclustered)).await;
    assert_problem(answer, StatusCode::CONFLICT, "resource_conflict");
}
