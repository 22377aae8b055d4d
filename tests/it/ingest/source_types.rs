//! What real sources send, end to end against the emulator: GEOGRAPHY (GeoArrow WKB, WKT),
//! RANGE (a bounded DATE range, a TIMESTAMP range without an end), INTERVAL (MonthDayNano,
//! Duration) and flexible column names (a key among them), in the write modes that take them;
//! values the gateway must refuse (a malformed geometry, an inverted range, an interval beyond
//! BigQuery's range, a forbidden name), each with its 422 and nothing staged; and narrower
//! numbers loaded into an existing table's wider columns.

use std::collections::HashMap;
use std::sync::Arc;

use arrow_array::types::IntervalMonthDayNano;
use arrow_array::{
    ArrayRef, BinaryArray, Date32Array, DurationMicrosecondArray, Float64Array, Int64Array, IntervalMonthDayNanoArray,
    RecordBatch, StringArray, StructArray, TimestampMicrosecondArray,
};
use arrow_schema::{DataType, Field, IntervalUnit, TimeUnit};
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::support::arrow::{batch, ipc_stream};
use crate::support::{Gateway, TestRun, assert_problem};

/// `POINT(1 2)` and `POINT(-3.5 40.25)` as little-endian WKB.
const WKB_POINTS: [&str; 2] =
    ["0101000000000000000000f03f0000000000000040", "01010000000000000000000cc00000000000204440"];
/// 2024-01-01 and 2024-02-01 in days since 1970-01-01, and 2024-01-01T00:00:00.000001Z.
const JAN_1_DAYS: i32 = 19_723;
const FEB_1_DAYS: i32 = 19_754;
const JAN_1_MICROS: i64 = 1_704_067_200_000_001;

fn with_metadata(field: Field, key: &str, value: &str) -> Field {
    field.with_metadata(HashMap::from([(key.to_string(), value.to_string())]))
}

fn range_of(start: ArrayRef, end: ArrayRef) -> (Field, ArrayRef) {
    let fields =
        vec![Field::new("start", start.data_type().clone(), true), Field::new("end", end.data_type().clone(), true)];
    let array = Arc::new(StructArray::try_new(fields.clone().into(), vec![start, end], None).unwrap()) as ArrayRef;
    (Field::new("range", DataType::Struct(fields.into()), true), array)
}

/// One row per key: every type and name of the issue, values derived from the row's index.
fn source_rows(keys: &[&str], overrides: impl FnOnce(&mut Vec<(Field, ArrayRef)>)) -> RecordBatch {
    let n = keys.len();
    let wkb: Vec<Vec<u8>> = (0..n).map(|i| hex::decode(WKB_POINTS[i % 2]).unwrap()).collect();
    let (stay_field, stay) =
        range_of(Arc::new(Date32Array::from(vec![JAN_1_DAYS; n])), Arc::new(Date32Array::from(vec![FEB_1_DAYS; n])));
    let (open_field, open) = range_of(
        Arc::new(TimestampMicrosecondArray::from(vec![JAN_1_MICROS; n]).with_timezone("UTC")),
        Arc::new(TimestampMicrosecondArray::from(vec![None::<i64>; n]).with_timezone("UTC")),
    );
    let mut columns: Vec<(Field, ArrayRef)> = vec![
        (Field::new("first name", DataType::Utf8, false), Arc::new(StringArray::from(keys.to_vec()))),
        (
            Field::new("Größe", DataType::Int64, true),
            Arc::new(Int64Array::from_iter_values((0..n as i64).map(|i| 180 + i))),
        ),
        (
            Field::new("revenue-2024", DataType::Float64, true),
            Arc::new(Float64Array::from_iter_values((0..n).map(|i| i as f64 + 0.5))),
        ),
        (
            Field::new("a&b", DataType::Utf8, true),
            Arc::new(StringArray::from_iter_values((0..n).map(|i| format!("v{i}")))),
        ),
        (
            with_metadata(Field::new("shape", DataType::Binary, true), "ARROW:extension:name", "geoarrow.wkb"),
            Arc::new(BinaryArray::from_iter_values(wkb.iter())),
        ),
        (
            with_metadata(Field::new("outline", DataType::Utf8, true), "ARROW:extension:name", "geoarrow.wkt"),
            Arc::new(StringArray::from(vec!["LINESTRING(0 0, 1 1)"; n])),
        ),
        (with_metadata(stay_field.with_name("stay"), "bigquery_type", "RANGE"), stay),
        (with_metadata(open_field.with_name("open"), "bigquery_type", "RANGE"), open),
        (
            Field::new("wait", DataType::Interval(IntervalUnit::MonthDayNano), true),
            Arc::new(IntervalMonthDayNanoArray::from(vec![IntervalMonthDayNano::new(14, -3, 3_723_000_004_000); n])),
        ),
        (
            Field::new("took", DataType::Duration(TimeUnit::Microsecond), true),
            Arc::new(DurationMicrosecondArray::from(vec![90_061_000_001; n])),
        ),
    ];
    overrides(&mut columns);
    let (fields, arrays) = columns.into_iter().unzip();
    batch(fields, arrays)
}

/// The rows of `table` as text, ordered by the key: every column as BigQuery reads it back.
async fn read_back(gw: &Gateway, table: &str) -> Vec<String> {
    let sql = format!(
        "SELECT `first name`, CAST(`Größe` AS STRING), CAST(`revenue-2024` AS STRING), `a&b`, \
         ST_ASTEXT(shape), ST_ASTEXT(outline), CAST(RANGE_START(stay) AS STRING), CAST(RANGE_END(stay) AS STRING), \
         CAST(UNIX_MICROS(RANGE_START(open)) AS STRING), CAST(RANGE_END(open) IS NULL AS STRING), \
         CAST(DATETIME '2000-01-01 00:00:00' + wait AS STRING), \
         CAST(UNIX_MICROS(TIMESTAMP '2000-01-01 00:00:00+00' + took) AS STRING) \
         FROM {}.`{table}` ORDER BY `first name`",
        gw.dataset
    );
    let text = |v: &Value| v.as_str().map_or("NULL".to_string(), str::to_string);
    gw.query(&sql).await.iter().map(|row| row.iter().map(text).collect::<Vec<_>>().join("|")).collect()
}

/// The row `key` holding the values of index `i` of [`source_rows`].
fn expected(key: &str, i: usize) -> String {
    let point = ["POINT (1 2)", "POINT (-3.5 40.25)"][i % 2];
    format!(
        "{key}|{}|{}|v{i}|{point}|LINESTRING (0 0, 1 1)|2024-01-01|2024-02-01|{JAN_1_MICROS}|true|2001-02-26 01:02:03.000004|946774861000001",
        180 + i,
        i as f64 + 0.5
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn geography_range_interval_and_flexible_names_read_back_as_sent_in_every_mode() {
    let gw = Gateway::spawn().await;
    let keyed = |mode: &str| json!({"write_mode": mode, "primary_key": ["first name"]});
    TestRun::new("r", "e")
        .resource("appended", json!({"write_mode": "full_append"}))
        .resource("replaced", json!({"write_mode": "full_replace"}))
        .resource("incremental", json!({"write_mode": "incremental_append"}))
        .resource("upserted", keyed("incremental_upsert"))
        .resource("snapshot", keyed("full_upsert"))
        .open(&gw)
        .await;
    let plain = source_rows(&["ann", "bob"], |_| {});
    for resource in ["appended", "replaced", "incremental"] {
        gw.post_accepted("r", "e", resource, None, ipc_stream(std::slice::from_ref(&plain))).await;
    }
    // Keyed: "ann" twice; its second row (index 2) wins the fold.
    let repeated = source_rows(&["ann", "bob", "ann"], |_| {});
    for resource in ["upserted", "snapshot"] {
        gw.post_accepted("r", "e", resource, None, ipc_stream(std::slice::from_ref(&repeated))).await;
    }
    let committed = gw.commit_and_wait("r", "e").await;
    assert_eq!(committed["state"], "committed", "{committed}");
    for table in ["appended", "replaced", "incremental"] {
        assert_eq!(read_back(&gw, table).await, [expected("ann", 0), expected("bob", 1)], "{table}");
    }
    for table in ["upserted", "snapshot"] {
        assert_eq!(read_back(&gw, table).await, [expected("ann", 2), expected("bob", 1)], "{table}");
    }
    let fields = gw.query(&format!(
        "SELECT column_name, data_type FROM {}.INFORMATION_SCHEMA.COLUMNS WHERE table_name = 'appended' ORDER BY ordinal_position",
        gw.dataset
    ))
    .await;
    let names: Vec<String> = fields.iter().map(|row| row[0].as_str().unwrap_or_default().to_string()).collect();
    assert_eq!(names[..4], ["first name", "Größe", "revenue-2024", "a&b"], "{fields:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn malformed_geometry_inverted_range_long_interval_and_forbidden_name_are_refused_with_nothing_staged() {
    let gw = Gateway::spawn().await;
    TestRun::new("r", "e").resource("t", json!({"write_mode": "full_append"})).open(&gw).await;
    let before = gw.db_snapshot().await;
    let not_wkb = source_rows(&["a", "b"], |columns| {
        columns[4].1 = Arc::new(BinaryArray::from_iter_values([hex::decode(WKB_POINTS[0]).unwrap(), vec![1, 2, 3]]));
    });
    let projected = source_rows(&["a"], |columns| {
        columns[5].1 = Arc::new(StringArray::from(vec!["POINT(1113194.9 2273030.9)"]));
    });
    let inverted = source_rows(&["a", "b"], |columns| {
        let (field, array) = range_of(
            Arc::new(Date32Array::from(vec![JAN_1_DAYS, FEB_1_DAYS])),
            Arc::new(Date32Array::from(vec![FEB_1_DAYS, JAN_1_DAYS])),
        );
        columns[6] = (with_metadata(field.with_name("stay"), "bigquery_type", "RANGE"), array);
    });
    let too_long = source_rows(&["a"], |columns| {
        columns[8].1 = Arc::new(IntervalMonthDayNanoArray::from(vec![IntervalMonthDayNano::new(120_001, 0, 0)]));
    });
    let finer = source_rows(&["a"], |columns| {
        columns[9] = (
            Field::new("took", DataType::Duration(TimeUnit::Nanosecond), true),
            Arc::new(arrow_array::DurationNanosecondArray::from(vec![1_500])),
        );
    });
    let cases = [
        (not_wkb, "invalid_value", "shape", 1),
        (projected, "invalid_value", "outline", 0),
        (inverted, "invalid_value", "stay", 1),
        (too_long, "invalid_value", "wait", 0),
        (finer, "precision_loss", "took", 0),
    ];
    for (rows, code, column, row) in cases {
        let problem = assert_problem(
            gw.post_batch("r", "e", "t", None, ipc_stream(&[rows])).await,
            StatusCode::UNPROCESSABLE_ENTITY,
            code,
        );
        let detail = problem["detail"].as_str().unwrap();
        assert!(detail.starts_with(&format!("column {column:?} row {row}")), "{problem}");
    }
    for forbidden in ["price (usd)", "a.b", "_PARTITIONTIME", "x`y"] {
        let rows = source_rows(&["a"], |columns| columns[3].0 = Field::new(forbidden, DataType::Utf8, true));
        let problem = assert_problem(
            gw.post_batch("r", "e", "t", None, ipc_stream(&[rows])).await,
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_identifier",
        );
        assert!(problem["detail"].as_str().unwrap().contains(&format!("{forbidden:?}")), "{problem}");
    }
    assert_eq!(gw.db_snapshot().await, before, "a refused batch changes nothing");
}

fn measured(columns: Vec<ArrayRef>) -> RecordBatch {
    let fields: Vec<Field> = ["id", "amount", "price"]
        .iter()
        .zip(&columns)
        .map(|(name, array)| Field::new(*name, array.data_type().clone(), true))
        .collect();
    batch(fields, columns)
}

#[tokio::test(flavor = "multi_thread")]
async fn int64_batches_publish_into_existing_float64_and_numeric_columns() {
    let gw = Gateway::spawn().await;
    TestRun::new("r", "e1").full_append(&["m"]).open(&gw).await;
    let decimal = arrow_array::Decimal128Array::from(vec![1_250]).with_precision_and_scale(20, 2).unwrap();
    let wide =
        measured(vec![Arc::new(Int64Array::from(vec![1])), Arc::new(Float64Array::from(vec![0.5])), Arc::new(decimal)]);
    gw.post_accepted("r", "e1", "m", None, ipc_stream(&[wide])).await;
    let first = gw.commit_and_wait("r", "e1").await;
    assert_eq!(first["state"], "committed", "{first}");
    gw.open_new_execution("r", "e2").await;
    let narrow = measured(vec![
        Arc::new(Int64Array::from(vec![2])),
        Arc::new(Int64Array::from(vec![4_096])),
        Arc::new(Int64Array::from(vec![-7])),
    ]);
    gw.post_accepted("r", "e2", "m", None, ipc_stream(&[narrow])).await;
    let committed = gw.commit_and_wait("r", "e2").await;
    assert_eq!(committed["state"], "committed", "{committed}");
    let rows = gw
        .query(&format!("SELECT id, CAST(amount AS STRING), CAST(price AS STRING) FROM {}.m ORDER BY id", gw.dataset))
        .await;
    let text: Vec<Vec<&str>> = rows.iter().map(|r| r.iter().map(|v| v.as_str().unwrap_or("NULL")).collect()).collect();
    assert_eq!(text[0][0], "1");
    assert_eq!(text[1][0], "2");
    assert_eq!(text[1][1].parse::<f64>().unwrap(), 4_096.0, "{text:?}");
    assert_eq!(text[1][2].parse::<f64>().unwrap(), -7.0, "{text:?}");
    let columns = gw
        .query(&format!(
            "SELECT column_name, data_type FROM {}.INFORMATION_SCHEMA.COLUMNS WHERE table_name = 'm' ORDER BY ordinal_position",
            gw.dataset
        ))
        .await;
    let types: Vec<&str> = columns.iter().map(|r| r[1].as_str().unwrap_or_default()).collect();
    assert!(types[1].starts_with("FLOAT") && types[2].starts_with("NUMERIC"), "unaltered: {columns:?}");
    // A key is compared as sent: an INT64 key is not cast into the table's NUMERIC column.
    gw.declare("r", "keyed", json!({"write_mode": "incremental_upsert", "table": "m", "primary_key": ["price"]})).await;
    gw.open_new_execution("r", "e3").await;
    let keys = measured(vec![
        Arc::new(Int64Array::from(vec![3])),
        Arc::new(Float64Array::from(vec![1.0])),
        Arc::new(Int64Array::from(vec![5])),
    ]);
    gw.post_accepted("r", "e3", "keyed", None, ipc_stream(&[keys])).await;
    let refused = gw.commit_until_ended("r", "e3").await;
    assert_eq!(refused["error"]["code"], "incompatible_schema", "{refused}");
    assert!(refused["error"]["detail"].as_str().unwrap().contains("price is a key or order_by column"), "{refused}");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_existing_required_column_the_batches_omit_is_refused_before_anything_is_staged() {
    let gw = Gateway::spawn().await;
    TestRun::new("r", "e1").full_append(&["first", "required"]).open(&gw).await;
    let ids = |column: &str| {
        batch(vec![Field::new(column, DataType::Int64, true)], vec![Arc::new(Int64Array::from(vec![1]))])
    };
    gw.post_accepted("r", "e1", "first", None, ipc_stream(&[ids("id")])).await;
    assert_eq!(gw.commit_and_wait("r", "e1").await["state"], "committed", "the dataset exists");
    gw.query(&format!("CREATE TABLE {}.required (id INT64 NOT NULL, note STRING)", gw.dataset)).await;
    gw.open_new_execution("r", "e2").await;
    let (status, _) = gw.post_batch("r", "e2", "required", None, ipc_stream(&[ids("other")])).await;
    assert_eq!(status, StatusCode::ACCEPTED);
    let failed = gw.commit_until_ended("r", "e2").await;
    assert_eq!(failed["state"], "failed", "{failed}");
    assert_eq!(failed["error"]["code"], "required_column_missing", "{failed}");
    assert!(failed["error"]["detail"].as_str().unwrap().contains("id"), "{failed}");
    let resources = failed["resources"].as_array().unwrap();
    let required = resources.iter().find(|r| r["resource"] == "required").expect("the resource");
    assert_eq!(
        (required["rows_received"].as_i64(), required["rows_acknowledged"].as_i64()),
        (Some(1), Some(0)),
        "nothing staged: {failed}"
    );
    let rows = gw.query(&format!("SELECT COUNT(*) FROM {}.required", gw.dataset)).await;
    assert_eq!(rows[0][0], "0");
}

#[tokio::test(flavor = "multi_thread")]
async fn widen_columns_widens_an_existing_int64_column_to_numeric_and_loads() {
    let gw = Gateway::spawn().await;
    gw.create_run("r").await;
    gw.declare("r", "narrow", json!({"write_mode": "full_append", "table": "m"})).await;
    let strict = gw.declare("r", "strict", json!({"write_mode": "full_append", "table": "m"})).await;
    assert!(strict.get("widen_columns").is_none(), "off by default: {strict}");
    let widening =
        gw.declare("r", "wide", json!({"write_mode": "full_append", "table": "m", "widen_columns": true})).await;
    assert_eq!(widening["widen_columns"], true, "{widening}");
    gw.open_new_execution("r", "e1").await;
    let ints = measured(vec![Arc::new(Int64Array::from(vec![1])), Arc::new(Int64Array::from(vec![7]))]);
    gw.post_accepted("r", "e1", "narrow", None, ipc_stream(&[ints])).await;
    assert_eq!(gw.commit_and_wait("r", "e1").await["state"], "committed");
    let decimals = |id: i64| {
        let amount = arrow_array::Decimal128Array::from(vec![1_250]).with_precision_and_scale(20, 2).unwrap();
        measured(vec![Arc::new(Int64Array::from(vec![id])), Arc::new(amount)])
    };
    // Without the opt-in, NUMERIC into the INT64 column fails as the seed says.
    gw.open_new_execution("r", "e2").await;
    gw.post_accepted("r", "e2", "strict", None, ipc_stream(&[decimals(2)])).await;
    let refused = gw.commit_until_ended("r", "e2").await;
    assert_eq!(refused["error"]["code"], "incompatible_schema", "{refused}");
    gw.open_new_execution("r", "e3").await;
    gw.post_accepted("r", "e3", "wide", None, ipc_stream(&[decimals(3)])).await;
    let committed = gw.commit_and_wait("r", "e3").await;
    assert_eq!(committed["state"], "committed", "{committed}");
    let rows = gw.query(&format!("SELECT id, CAST(amount AS STRING) FROM {}.m ORDER BY id", gw.dataset)).await;
    let amounts: Vec<(String, f64)> = rows
        .iter()
        .map(|r| (r[0].as_str().unwrap().to_string(), r[1].as_str().unwrap().parse::<f64>().unwrap()))
        .collect();
    assert_eq!(amounts, [("1".to_string(), 7.0), ("3".to_string(), 12.5)], "widened, nothing rounded");
}
