//! The documented type rules to the letter, end to end: a value cast into an existing FLOAT64
//! column loads only when it converts exactly (INT64 within ±2^53, NUMERIC when its double
//! reads back as it), a NULL never reaches an existing REQUIRED column, each refused with its
//! code naming column and row before anything is published (in the lane for rows accepted
//! before set-up learned the table, 422 at the batch after); a run's `max_bytes` caps every
//! append; ARRAY<RANGE> and ARRAY<INTERVAL> are refused by name.

use std::sync::Arc;
use std::time::Duration;

use arrow_array::{ArrayRef, Decimal128Array, Float64Array, Int64Array, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, TimeUnit};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::support::arrow::{batch, ids, ipc_stream};
use crate::support::fake_write::{FakeWrite, assert_exact_stream};
use crate::support::rows::count_rows;
use crate::support::{Gateway, GatewayOptions, TestRun, assert_problem, eventually};

const TWO_TO_53: i64 = 1 << 53;
/// 1234567890123456789.123456789 as NUMERIC(38, 9): 28 significant digits, more than a double holds.
const LONG_DECIMAL: i128 = 1_234_567_890_123_456_789_123_456_789;

/// `id`, `amount` and `price`, typed as the arrays are.
fn measures(ids: Vec<i64>, amount: ArrayRef, price: ArrayRef) -> RecordBatch {
    let id: ArrayRef = Arc::new(Int64Array::from(ids));
    let columns = [("id", id), ("amount", amount), ("price", price)];
    let fields = columns.iter().map(|(name, a)| Field::new(*name, a.data_type().clone(), true)).collect();
    batch(fields, columns.into_iter().map(|(_, a)| a).collect())
}

fn ints(values: Vec<i64>) -> ArrayRef {
    Arc::new(Int64Array::from(values))
}

/// NUMERIC(38, 9) values given in units of 10^-9.
fn decimals(nanos: Vec<i128>) -> ArrayRef {
    Arc::new(Decimal128Array::from(nanos).with_precision_and_scale(38, 9).unwrap())
}

fn jobs_submitted(gw: &Gateway) -> Vec<String> {
    gw.rest_conformance.as_ref().expect("the harness proxies REST calls").queries()
}

/// Table `m` with FLOAT64 `amount` and `price`, holding row 0, loaded by execution `e1` of run
/// `r` (resource `m`, full_append, flushed every 50 ms).
async fn float64_table(gw: &Gateway) {
    TestRun::new("r", "e1").batching(json!({"flush_interval_ms": 50})).full_append(&["m"]).open(gw).await;
    let doubles = |v: f64| Arc::new(Float64Array::from(vec![v])) as ArrayRef;
    gw.post_accepted("r", "e1", "m", None, ipc_stream(&[measures(vec![0], doubles(1.0), doubles(0.25))])).await;
    assert_eq!(gw.commit_and_wait("r", "e1").await["state"], "committed");
}

/// Waits until the lane of `resource` acknowledged `rows` rows: its set-up has finished.
async fn wait_acknowledged(gw: &Gateway, execution: &str, resource: &str, rows: i64) {
    let path = format!("/v1/runs/r/executions/{execution}");
    eventually(Duration::from_secs(30), "the lane's set-up and first append", || async {
        let execution = gw.json(Method::GET, &path, None).await.1;
        let resources = execution["resources"].as_array().cloned().unwrap_or_default();
        let resource = resources.iter().find(|r| r["resource"] == resource)?.clone();
        (resource["rows_acknowledged"].as_i64() == Some(rows)).then_some(())
    })
    .await;
}

/// The execution failed with `code`, its detail naming the batch, the column and the row.
fn assert_failed(ended: &Value, code: &str, column: &str, row: usize) {
    assert_eq!(ended["state"], "failed", "{ended}");
    assert_eq!(ended["error"]["code"], code, "{ended}");
    let detail = ended["error"]["detail"].as_str().unwrap();
    assert!(detail.starts_with("batch seq ") && detail.contains(&format!("column {column:?} row {row}:")), "{ended}");
}

#[tokio::test(flavor = "multi_thread")]
async fn values_an_existing_float64_column_cannot_hold_exactly_fail_the_execution_before_anything_is_published() {
    let gw = Gateway::spawn().await;
    float64_table(&gw).await;
    let jobs = jobs_submitted(&gw).len();
    // The lane learns the table after these rows are accepted: they are checked in the lane.
    gw.open_new_execution("r", "e2").await;
    let beyond = measures(vec![1, 2], ints(vec![TWO_TO_53, TWO_TO_53 + 1]), decimals(vec![12_500_000_000, 1]));
    gw.post_accepted("r", "e2", "m", None, ipc_stream(&[beyond])).await;
    assert_failed(&gw.commit_until_ended("r", "e2").await, "precision_loss", "amount", 1);
    gw.open_new_execution("r", "e3").await;
    let long = measures(vec![3], ints(vec![5]), decimals(vec![LONG_DECIMAL]));
    gw.post_accepted("r", "e3", "m", None, ipc_stream(&[long])).await;
    assert_failed(&gw.commit_until_ended("r", "e3").await, "precision_loss", "price", 0);
    assert_eq!(jobs_submitted(&gw).len(), jobs, "no publication job: {:?}", jobs_submitted(&gw));
    assert_eq!(count_rows(&gw, "m").await, 1, "the destination holds e1's row only");
}

#[tokio::test(flavor = "multi_thread")]
async fn once_the_lane_knows_the_float64_column_an_inexact_batch_gets_422_and_exact_values_load_as_sent() {
    let gw = Gateway::spawn().await;
    float64_table(&gw).await;
    gw.open_new_execution("r", "e2").await;
    let exact = measures(vec![3, 4], ints(vec![TWO_TO_53, -TWO_TO_53]), decimals(vec![12_500_000_000, -1_000_000]));
    gw.post_accepted("r", "e2", "m", None, ipc_stream(&[exact])).await;
    wait_acknowledged(&gw, "e2", "m", 2).await;
    let before = gw.db_snapshot().await;
    let cases = [
        (measures(vec![5, 6], ints(vec![7, -TWO_TO_53 - 1]), decimals(vec![0, 0])), "amount", 1),
        (measures(vec![7], ints(vec![7]), decimals(vec![LONG_DECIMAL])), "price", 0),
    ];
    for (rows, column, row) in cases {
        let problem = assert_problem(
            gw.post_batch("r", "e2", "m", None, ipc_stream(&[rows])).await,
            StatusCode::UNPROCESSABLE_ENTITY,
            "precision_loss",
        );
        let detail = problem["detail"].as_str().unwrap();
        assert!(
            detail.starts_with(&format!("column {column:?} row {row}:")) && detail.contains("FLOAT64"),
            "{problem}"
        );
    }
    assert_eq!(gw.db_snapshot().await, before, "a refused batch records nothing");
    assert_eq!(gw.commit_and_wait("r", "e2").await["state"], "committed");
    let sql = format!("SELECT id, CAST(amount AS INT64), CAST(price AS STRING) FROM {}.m ORDER BY id", gw.dataset);
    let rows: Vec<(String, String, f64)> = gw
        .query(&sql)
        .await
        .iter()
        .map(|r| {
            (r[0].as_str().unwrap().into(), r[1].as_str().unwrap().into(), r[2].as_str().unwrap().parse().unwrap())
        })
        .collect();
    let expected = [
        ("0".to_string(), "1".to_string(), 0.25),
        ("3".into(), TWO_TO_53.to_string(), 12.5),
        ("4".into(), (-TWO_TO_53).to_string(), -0.001),
    ];
    assert_eq!(rows, expected, "2^53 read back exactly");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_null_for_an_existing_required_column_is_refused_and_nothing_is_published() {
    let gw = Gateway::spawn().await;
    TestRun::new("r", "e1").batching(json!({"flush_interval_ms": 50})).full_append(&["seed", "req"]).open(&gw).await;
    gw.post_accepted("r", "e1", "seed", None, ipc_stream(&[ids(0..1)])).await;
    assert_eq!(gw.commit_and_wait("r", "e1").await["state"], "committed", "the dataset exists");
    gw.query(&format!("CREATE TABLE {}.req (id INT64 NOT NULL, note STRING NOT NULL, extra STRING)", gw.dataset)).await;
    let notes = |ids: Vec<i64>, notes: Vec<Option<&str>>| {
        let fields = vec![Field::new("id", DataType::Int64, true), Field::new("note", DataType::Utf8, true)];
        batch(fields, vec![Arc::new(Int64Array::from(ids)), Arc::new(StringArray::from(notes))])
    };
    let jobs = jobs_submitted(&gw).len();
    // Accepted before the lane learned the table: refused in the lane, before the barrier.
    gw.open_new_execution("r", "e2").await;
    gw.post_accepted("r", "e2", "req", None, ipc_stream(&[notes(vec![1, 2], vec![Some("a"), None])])).await;
    assert_failed(&gw.commit_until_ended("r", "e2").await, "null_in_required_column", "note", 1);
    assert_eq!(jobs_submitted(&gw).len(), jobs, "nothing published: {:?}", jobs_submitted(&gw));
    assert_eq!(count_rows(&gw, "req").await, 0);
    // Once the lane knows the table: 422 at the batch, the execution goes on.
    gw.open_new_execution("r", "e3").await;
    gw.post_accepted("r", "e3", "req", None, ipc_stream(&[notes(vec![3], vec![Some("c")])])).await;
    wait_acknowledged(&gw, "e3", "req", 1).await;
    let problem = assert_problem(
        gw.post_batch("r", "e3", "req", None, ipc_stream(&[notes(vec![4, 5], vec![Some("d"), None])])).await,
        StatusCode::UNPROCESSABLE_ENTITY,
        "null_in_required_column",
    );
    assert!(problem["detail"].as_str().unwrap().starts_with("column \"note\" row 1:"), "{problem}");
    assert_eq!(gw.commit_and_wait("r", "e3").await["state"], "committed");
    let rows = gw.query(&format!("SELECT id, note FROM {}.req ORDER BY id", gw.dataset)).await;
    assert_eq!(rows, [vec![json!("3"), json!("c")]], "the refused batch left nothing");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_runs_max_bytes_caps_every_append_of_a_large_body() {
    const MAX_BYTES: usize = 1 << 20;
    let fake = FakeWrite::start().await;
    let gw = GatewayOptions::new().fake_write(&fake).spawn().await;
    let batching = json!({"max_bytes": MAX_BYTES, "max_rows": 1_000_000});
    TestRun::new("r", "e").batching(batching).full_append(&["t"]).open(&gw).await;
    // 400,000 rows of two INT64 columns: one 6.4 MB record batch, then bodies of 0.6 and 1.6 MB.
    for range in [0..400_000, 400_000..440_000, 440_000..540_000] {
        gw.post_accepted("r", "e", "t", None, ipc_stream(&[ids(range)])).await;
    }
    assert_eq!(gw.commit_and_wait("r", "e").await["state"], "committed");
    assert_exact_stream(&fake.stream_for("_filament_stg_t_"), 0..540_000);
    let sizes = fake.with(|s| s.payload_bytes.clone());
    assert!(sizes.len() >= 7, "the large bodies were split: {sizes:?}");
    assert!(sizes.iter().all(|bytes| *bytes <= MAX_BYTES), "an append above {MAX_BYTES} bytes: {sizes:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn arrays_of_ranges_and_intervals_are_refused_at_the_schema_by_name() {
    let gw = Gateway::spawn().await;
    TestRun::new("r", "e").full_append(&["t"]).open(&gw).await;
    let before = gw.db_snapshot().await;
    let range = DataType::Struct(
        vec![Field::new("start", DataType::Date32, true), Field::new("end", DataType::Date32, true)].into(),
    );
    let marked_range = Field::new("item", range, true)
        .with_metadata(std::collections::HashMap::from([("bigquery_type".to_string(), "RANGE".to_string())]));
    let cases = [
        (Field::new_list("stays", marked_range, true), "ARRAY<RANGE<DATE>>"),
        (
            Field::new_list("waits", Field::new("item", DataType::Duration(TimeUnit::Second), true), true),
            "ARRAY<INTERVAL>",
        ),
    ];
    for (field, shown) in cases {
        let column = field.name().clone();
        let empty = arrow_array::new_empty_array(field.data_type());
        let body = ipc_stream(&[batch(vec![field], vec![empty])]);
        let problem = assert_problem(
            gw.post_batch("r", "e", "t", None, body).await,
            StatusCode::UNPROCESSABLE_ENTITY,
            "unsupported_type",
        );
        let detail = problem["detail"].as_str().unwrap();
        assert!(detail.contains(&format!("column {column:?}")) && detail.contains(shown), "{problem}");
    }
    assert_eq!(gw.db_snapshot().await, before, "nothing recorded");
}
