//! End to end against real BigQuery, for whoever has a project: `make test-bigquery` runs these
//! (one at a time) when `FILAMENT_TEST_BIGQUERY_PROJECT` and Application Default Credentials
//! are present, and says that it skipped, and why, when they are not (`scripts/test-bigquery.sh`;
//! cost and roles in `docs/testing.md`). `make test` compiles them and runs the skip path only
//! (`--skip live_bigquery::`). Every test creates its datasets with the prefix
//! `filament_live_<unix seconds>_` and deletes them when it ends, failed or not; each run
//! also deletes such datasets older than a day that a killed run left behind.

use std::sync::Arc;
use std::time::Duration;

use arrow_array::builder::{Decimal128Builder, ListBuilder, Time64MicrosecondBuilder};
use arrow_array::{
    Array as _, ArrayRef, Decimal128Array, Int64Array, RecordBatch, StringArray, StructArray, Time64MicrosecondArray,
};
use arrow_schema::{DataType, Field, Fields, TimeUnit};
use filament_bigquery::conformance::shape;
use filament_bigquery::model::WriteMode;
use google_cloud_bigquery_v2::client::{DatasetService, JobService, TableService};
use google_cloud_bigquery_v2::model::{Dataset, DatasetReference, QueryRequest, Table};
use serde_json::{Value, json};

use super::keyed;
use super::representative::representative_cases;
use crate::support::arrow::{batch, ipc_stream};
use crate::support::{Gateway, GatewayOptions, TestRun, random_suffix};

const PREFIX: &str = "filament_live_";
/// Datasets a killed run left behind are deleted once they are this old.
const STALE_AFTER: Duration = Duration::from_secs(24 * 3600);

/// The project and clients of one test; its datasets are deleted on drop.
struct Live {
    project: String,
    location: String,
    datasets: DatasetService,
    tables: TableService,
    jobs: JobService,
    created: Vec<String>,
}

impl Live {
    /// `FILAMENT_TEST_BIGQUERY_PROJECT` with Application Default Credentials (the script checks
    /// both before running the suite, so a missing one fails here rather than skipping).
    async fn connect() -> Self {
        let project = std::env::var("FILAMENT_TEST_BIGQUERY_PROJECT")
            .expect("FILAMENT_TEST_BIGQUERY_PROJECT: run these through `make test-bigquery` (docs/testing.md)");
        let location = std::env::var("FILAMENT_TEST_BIGQUERY_LOCATION").unwrap_or_else(|_| "US".into());
        let datasets = DatasetService::builder().build().await.expect("BigQuery datasets client (ADC)");
        let tables = TableService::builder().build().await.expect("BigQuery tables client (ADC)");
        let jobs = JobService::builder().build().await.expect("BigQuery jobs client (ADC)");
        let live = Self { project, location, datasets, tables, jobs, created: Vec::new() };
        live.delete_stale_datasets().await;
        live
    }

    /// A new dataset of this test (deleted with its tables when the test ends).
    async fn dataset(&mut self) -> String {
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
        let name = format!("{PREFIX}{now}_{}", random_suffix());
        let reference = DatasetReference::new().set_project_id(&self.project).set_dataset_id(&name);
        let dataset = Dataset::new().set_dataset_reference(reference).set_location(&self.location);
        self.datasets.insert_dataset().set_project_id(&self.project).set_dataset(dataset).send().await.unwrap();
        self.created.push(name.clone());
        name
    }

    /// Deletes `filament_live_` datasets older than [`STALE_AFTER`] (their name says when).
    async fn delete_stale_datasets(&self) {
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
        let listed = self.datasets.list_datasets().set_project_id(&self.project).send().await.unwrap();
        for entry in listed.datasets {
            let name = entry.dataset_reference.map(|r| r.dataset_id).unwrap_or_default();
            let created = name.strip_prefix(PREFIX).and_then(|rest| rest.split('_').next()?.parse::<u64>().ok());
            if created.is_some_and(|created| now.saturating_sub(created) > STALE_AFTER.as_secs()) {
                delete_dataset(&self.datasets, &self.project, &name).await;
            }
        }
    }

    /// Rows of `sql` (GoogleSQL) as arrays of JSON values.
    async fn query(&self, sql: &str) -> Vec<Vec<Value>> {
        let request = QueryRequest::new()
            .set_query(sql)
            .set_use_legacy_sql(false)
            .set_location(&self.location)
            .set_timeout_ms(120_000u32);
        let answer = self.jobs.query().set_project_id(&self.project).set_query_request(request).send().await;
        let answer = answer.unwrap_or_else(|e| panic!("query {sql}: {e}"));
        assert!(answer.job_complete.unwrap_or(false), "query {sql} did not complete within 120 s");
        answer
            .rows
            .iter()
            .map(|row| {
                let row = serde_json::to_value(row).unwrap();
                row["f"].as_array().unwrap().iter().map(|cell| cell["v"].clone()).collect()
            })
            .collect()
    }

    /// A dry run of `sql` (free: BigQuery validates and plans it against the real tables).
    async fn dry_run(&self, sql: &str) -> Result<(), String> {
        let request =
            QueryRequest::new().set_query(sql).set_use_legacy_sql(false).set_location(&self.location).set_dry_run(true);
        let answer = self.jobs.query().set_project_id(&self.project).set_query_request(request).send().await;
        answer.map(|_| ()).map_err(|e| e.to_string())
    }

    /// Creates a table from a `tables.insert` body the gateway would send.
    async fn create_table(&self, dataset: &str, body: &Value) {
        let table: Table = serde_json::from_value(body.clone()).unwrap();
        let insert = self.tables.insert_table().set_project_id(&self.project).set_dataset_id(dataset).set_table(table);
        insert.send().await.unwrap_or_else(|e| panic!("tables.insert {body}: {e}"));
    }

    /// A gateway against real BigQuery, loading into `dataset`.
    async fn gateway(&self, dataset: &str) -> Gateway {
        let mut gw = GatewayOptions::new().live_bigquery(&self.project).spawn().await;
        gw.dataset = dataset.to_string();
        gw
    }
}

async fn delete_dataset(datasets: &DatasetService, project: &str, dataset: &str) {
    let delete = datasets.delete_dataset().set_project_id(project).set_dataset_id(dataset).set_delete_contents(true);
    if let Err(e) = delete.send().await {
        eprintln!("could not delete dataset {project}:{dataset}: {e}");
    }
}

impl Drop for Live {
    /// Deletes the test's datasets, on a runtime of its own (a test's runtime may be unwinding).
    fn drop(&mut self) {
        let (datasets, project, created) =
            (self.datasets.clone(), self.project.clone(), std::mem::take(&mut self.created));
        let cleanup = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            runtime.block_on(async {
                for dataset in created {
                    delete_dataset(&datasets, &project, &dataset).await;
                }
            });
        });
        let _ = cleanup.join();
    }
}

fn text(value: &Value) -> String {
    value.as_str().map(str::to_string).unwrap_or_else(|| value.to_string())
}

/// Rows of every converted type: `id`, NUMERIC `n`, BIGNUMERIC `big`, TIME `at`, JSON `doc`, a
/// STRUCT `nested` of a NUMERIC and an ARRAY of TIME, an ARRAY of NUMERIC `amounts`, and
/// `_filament_op` when `ops` holds one per row.
fn converted_rows(ids: &[i64], ops: Option<&[&str]>) -> RecordBatch {
    let decimal = |precision: u8, scale: i8, unit: i128| {
        Decimal128Array::from_iter_values(ids.iter().map(|id| i128::from(*id) * unit + 1))
            .with_precision_and_scale(precision, scale)
            .unwrap()
    };
    let json_field = Field::new("doc", DataType::Utf8, true).with_metadata(std::collections::HashMap::from([(
        "ARROW:extension:name".to_string(),
        "arrow.json".to_string(),
    )]));
    let times = Time64MicrosecondArray::from_iter_values(ids.iter().map(|id| id * 1_000_001));
    let mut time_lists = ListBuilder::new(Time64MicrosecondBuilder::new());
    let mut amounts = ListBuilder::new(Decimal128Builder::new().with_precision_and_scale(38, 9).unwrap());
    for id in ids {
        time_lists.values().append_value(id * 2);
        time_lists.append(true);
        amounts.values().append_value(i128::from(*id) * 1_000_000_000 + 500_000_000);
        amounts.append(true);
    }
    let time_lists = time_lists.finish();
    let nested_fields = Fields::from(vec![
        Field::new("amount", DataType::Decimal128(38, 9), true),
        Field::new("times", time_lists.data_type().clone(), true),
    ]);
    let nested = StructArray::new(
        nested_fields.clone(),
        vec![Arc::new(decimal(38, 9, 1_000_000_000)) as ArrayRef, Arc::new(time_lists)],
        None,
    );
    let amounts = amounts.finish();
    let mut fields = vec![
        Field::new("id", DataType::Int64, false),
        Field::new("n", DataType::Decimal128(38, 9), true),
        Field::new("big", DataType::Decimal128(38, 20), true),
        Field::new("at", DataType::Time64(TimeUnit::Microsecond), true),
        json_field,
        Field::new("nested", DataType::Struct(nested_fields), true),
        Field::new("amounts", amounts.data_type().clone(), true),
    ];
    let mut columns: Vec<ArrayRef> = vec![
        Arc::new(Int64Array::from_iter_values(ids.iter().copied())),
        Arc::new(decimal(38, 9, 1_000_000_000)),
        Arc::new(decimal(38, 20, 100_000_000_000_000_000_000)),
        Arc::new(times),
        Arc::new(StringArray::from_iter_values(ids.iter().map(|id| format!("{{\"id\": {id}, \"tags\": [\"a\"]}}")))),
        Arc::new(nested),
        Arc::new(amounts),
    ];
    if let Some(ops) = ops {
        fields.push(Field::new("_filament_op", DataType::Utf8, false));
        columns.push(Arc::new(StringArray::from_iter_values(ops.iter().copied())));
    }
    batch(fields, columns)
}

pub(super) const WRITE_MODES: [(&str, WriteMode); 8] = [
    ("full_replace", WriteMode::FullReplace),
    ("full_append", WriteMode::FullAppend),
    ("full_upsert", WriteMode::FullUpsert),
    ("incremental_append", WriteMode::IncrementalAppend),
    ("incremental_upsert", WriteMode::IncrementalUpsert),
    ("incremental_delete", WriteMode::IncrementalDelete),
    ("cdc_append", WriteMode::CdcAppend),
    ("cdc_merge", WriteMode::CdcMerge),
];

#[tokio::test]
async fn every_write_mode_loads_every_converted_type() {
    let mut live = Live::connect().await;
    let dataset = live.dataset().await;
    let gw = live.gateway(&dataset).await;
    let mut run = TestRun::new("live", "e1");
    for (mode, write_mode) in WRITE_MODES {
        let key = if keyed(write_mode) { json!(["id"]) } else { json!([]) };
        run = run.resource(mode, json!({"write_mode": mode, "primary_key": key}));
    }
    run.open(&gw).await;
    for (mode, _) in WRITE_MODES {
        let cdc = mode.starts_with("cdc_");
        let (first_ops, second_ops) = (["insert", "insert", "insert"], ["update", "delete"]);
        let first = converted_rows(&[1, 2, 3], cdc.then_some(&first_ops[..]));
        let second = converted_rows(&[2, 3], cdc.then_some(&second_ops[..]));
        gw.post_accepted("live", "e1", mode, None, ipc_stream(&[first])).await;
        gw.post_accepted("live", "e1", mode, None, ipc_stream(&[second])).await;
    }
    let committed = gw.commit_and_wait("live", "e1").await;
    assert_eq!(committed["state"], "committed", "{committed}");
    let expected_ids: [(&str, &[i64]); 8] = [
        ("full_replace", &[1, 2, 2, 3, 3]),
        ("full_append", &[1, 2, 2, 3, 3]),
        ("full_upsert", &[1, 2, 3]),
        ("incremental_append", &[1, 2, 2, 3, 3]),
        ("incremental_upsert", &[1, 2, 3]),
        ("incremental_delete", &[]),
        ("cdc_append", &[1, 2, 2, 3, 3]),
        ("cdc_merge", &[1, 2]),
    ];
    for (table, ids) in expected_ids {
        let sql = format!(
            "SELECT id, CAST(n AS STRING), CAST(big AS STRING), CAST(`at` AS STRING), TO_JSON_STRING(doc),
                    CAST(nested.amount AS STRING), ARRAY_LENGTH(nested.times), CAST(amounts[OFFSET(0)] AS STRING)
             FROM `{}`.`{dataset}`.`{table}` ORDER BY id",
            live.project
        );
        let rows = live.query(&sql).await;
        let found: Vec<i64> = rows.iter().map(|r| text(&r[0]).parse().unwrap()).collect();
        assert_eq!(found, ids, "{table}: the rows each mode leaves");
        for row in &rows {
            let id: i64 = text(&row[0]).parse().unwrap();
            assert_eq!(text(&row[1]), format!("{id}.000000001"), "{table}: NUMERIC exact");
            assert_eq!(text(&row[2]), format!("{id}.00000000000000000001"), "{table}: BIGNUMERIC exact");
            assert_eq!(text(&row[6]), "1", "{table}: an ARRAY of TIME inside a STRUCT");
            assert_eq!(text(&row[7]), format!("{id}.5"), "{table}: an ARRAY of NUMERIC");
            assert!(text(&row[4]).contains(&format!("\"id\":{id}")), "{table}: JSON parsed: {row:?}");
        }
    }
}

/// Rows of (`k` NUMERIC(38, 9) as its scaled integer, `t`, `s`, `order`).
fn aliased(rows: &[(i128, &str, &str, i64)]) -> RecordBatch {
    let keys = Decimal128Array::from_iter_values(rows.iter().map(|r| r.0)).with_precision_and_scale(38, 9).unwrap();
    batch(
        vec![
            Field::new("k", DataType::Decimal128(38, 9), false),
            Field::new("t", DataType::Utf8, true),
            Field::new("s", DataType::Utf8, true),
            Field::new("order", DataType::Int64, true),
        ],
        vec![
            Arc::new(keys),
            Arc::new(StringArray::from_iter_values(rows.iter().map(|r| r.1))),
            Arc::new(StringArray::from_iter_values(rows.iter().map(|r| r.2))),
            Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.3))),
        ],
    )
}

#[tokio::test]
async fn a_numeric_key_upserts_into_columns_named_like_the_aliases() {
    let mut live = Live::connect().await;
    let dataset = live.dataset().await;
    let gw = live.gateway(&dataset).await;
    TestRun::new("live", "e1")
        .resource("aliased", json!({"write_mode": "incremental_upsert", "primary_key": ["k"]}))
        .open(&gw)
        .await;
    let billion = 1_000_000_000;
    gw.post_accepted(
        "live",
        "e1",
        "aliased",
        None,
        ipc_stream(&[aliased(&[(billion, "a", "a", 1), (2, "b", "b", 2)])]),
    )
    .await;
    assert_eq!(gw.commit_and_wait("live", "e1").await["state"], "committed");
    gw.open_new_execution("live", "e2").await;
    gw.post_accepted("live", "e2", "aliased", None, ipc_stream(&[aliased(&[(billion, "A", "S", 9)])])).await;
    let committed = gw.commit_and_wait("live", "e2").await;
    assert_eq!(committed["state"], "committed", "{committed}");
    let sql = format!("SELECT CAST(k AS STRING), t, s, `order` FROM `{}`.`{dataset}`.aliased ORDER BY k", live.project);
    let rows: Vec<String> =
        live.query(&sql).await.iter().map(|r| r.iter().map(text).collect::<Vec<_>>().join(",")).collect();
    assert_eq!(rows, ["0.000000002,b,b,2", "1,A,S,9"]);
}

#[tokio::test]
async fn table_options_lay_out_the_destination() {
    let mut live = Live::connect().await;
    let dataset = live.dataset().await;
    let gw = live.gateway(&dataset).await;
    let options = json!({
        "partitioning": {"field": "id", "range": {"start": 0, "end": 1000, "interval": 10}},
        "clustering": ["name"],
        "require_partition_filter": false,
        "expiration_days": 1,
        "description": "live test",
        "labels": {"suite": "live"},
    });
    TestRun::new("live", "e1")
        .resource("laid_out", json!({"write_mode": "full_append", "table_options": options}))
        .open(&gw)
        .await;
    let rows = batch(
        vec![Field::new("id", DataType::Int64, false), Field::new("name", DataType::Utf8, true)],
        vec![Arc::new(Int64Array::from(vec![1, 500])), Arc::new(StringArray::from(vec!["a", "b"]))],
    );
    gw.post_accepted("live", "e1", "laid_out", None, ipc_stream(&[rows])).await;
    assert_eq!(gw.commit_and_wait("live", "e1").await["state"], "committed");
    let table = live.tables.get_table().set_project_id(&live.project).set_dataset_id(&dataset).set_table_id("laid_out");
    let table = serde_json::to_value(table.send().await.unwrap()).unwrap();
    assert_eq!(table["rangePartitioning"]["field"], "id", "{table}");
    assert_eq!(table["clustering"]["fields"], json!(["name"]), "{table}");
    assert_eq!((&table["description"], &table["labels"]["suite"]), (&json!("live test"), &json!("live")), "{table}");
    assert!(table["expirationTime"].as_str().is_some(), "{table}");
}

#[tokio::test]
async fn resources_sharing_a_table_and_a_redelivery_publish_once() {
    let mut live = Live::connect().await;
    let dataset = live.dataset().await;
    let gw = live.gateway(&dataset).await;
    TestRun::new("live", "e1")
        .resource("first", json!({"write_mode": "full_append", "table": "shared"}))
        .resource("second", json!({"write_mode": "full_append", "table": "shared"}))
        .open(&gw)
        .await;
    let ids = |range: std::ops::Range<i64>| {
        batch(vec![Field::new("id", DataType::Int64, false)], vec![Arc::new(Int64Array::from_iter_values(range))])
    };
    for (resource, range) in [("first", 0..10), ("second", 10..15)] {
        gw.post_accepted("live", "e1", resource, Some(0), ipc_stream(&[ids(range)])).await;
    }
    assert_eq!(gw.commit_and_wait("live", "e1").await["state"], "committed");
    // The same execution delivered again with the same content: nothing is published twice.
    let (status, _) = gw.open_execution("live", "e1").await;
    assert_eq!(status, reqwest::StatusCode::OK);
    for (resource, range) in [("first", 0..10), ("second", 10..15)] {
        gw.post_accepted("live", "e1", resource, Some(0), ipc_stream(&[ids(range)])).await;
    }
    assert_eq!(gw.commit_and_wait("live", "e1").await["state"], "committed");
    let sql = format!("SELECT COUNT(*), COUNT(DISTINCT id) FROM `{}`.`{dataset}`.shared", live.project);
    let counts = live.query(&sql).await;
    assert_eq!((text(&counts[0][0]), text(&counts[0][1])), ("15".into(), "15".into()), "every row exactly once");
}

#[tokio::test]
async fn every_statement_shape_dry_runs_against_real_tables() {
    let mut live = Live::connect().await;
    let dataset = live.dataset().await;
    let mut failures = Vec::new();
    let mut statements = 0;
    for (table, case) in representative_cases() {
        let shaped = shape(&case, &live.project, &dataset, &table).unwrap();
        live.create_table(&dataset, &shaped.destination.body).await;
        live.create_table(&dataset, &shaped.staging.body).await;
        for statement in &shaped.statements {
            statements += 1;
            if let Err(error) = live.dry_run(&statement.sql).await {
                failures.push(format!("{table} ({}): {error}\n{}", statement.shape, statement.sql));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "BigQuery refused {} of {statements} statements:\n{}",
        failures.len(),
        failures.join("\n\n")
    );
    eprintln!("live BigQuery: {statements} statements dry-run, none refused");
}
