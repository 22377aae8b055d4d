//! Publications Google's SQL analyzer refused before the generator qualified its references
//! (`tests/it/conformance/googlesql.rs`), run end to end against the emulator: keys staged as strings and
//! converted (NUMERIC, BIGNUMERIC), and columns named like the statement's old aliases.

use std::sync::Arc;

use arrow_array::{ArrayRef, Decimal128Array, Int64Array, RecordBatch, StringArray};
use arrow_schema::{DataType, Field};
use serde_json::{Value, json};

use crate::support::arrow::{batch, ipc_stream};
use crate::support::rest_proxy::RestProxy;
use crate::support::{Gateway, GatewayOptions, TestRun, required_env};

fn text(value: &Value) -> String {
    value.as_str().unwrap_or_else(|| panic!("not a string: {value}")).to_string()
}

/// Rows of (`k`: a decimal key of `precision` and `scale` given as its scaled integer, `v`).
fn decimal_keyed(precision: u8, scale: i8, rows: &[(i128, i64)]) -> RecordBatch {
    let keys = Decimal128Array::from_iter_values(rows.iter().map(|(k, _)| *k))
        .with_precision_and_scale(precision, scale)
        .unwrap();
    batch(
        vec![Field::new("k", DataType::Decimal128(precision, scale), false), Field::new("v", DataType::Int64, true)],
        vec![Arc::new(keys), Arc::new(Int64Array::from_iter_values(rows.iter().map(|(_, v)| *v)))],
    )
}

#[tokio::test]
async fn numeric_and_bignumeric_keys_upsert_by_their_converted_value() {
    // The emulator cannot create BIGNUMERIC columns: the proxy creates them NUMERIC (the keys
    // below fit), and the statements run as the gateway wrote them (PARSE_BIGNUMERIC).
    let proxy = RestProxy::start(&required_env("BIGQUERY_EMULATOR_HOST")).await;
    proxy.state.lock().unwrap().bignumeric_as_numeric = true;
    let gw = GatewayOptions::new().rest_proxy(&proxy).spawn().await;
    // NUMERIC(38, 9) and, with 20 decimals, BIGNUMERIC (docs/type-mapping.md).
    let cases = [("numeric_keyed", 38u8, 9i8), ("bignumeric_keyed", 38, 20)];
    let mut run = TestRun::new("r", "e");
    for (table, _, _) in cases {
        run = run.resource(table, json!({"write_mode": "incremental_upsert", "primary_key": ["k"]}));
    }
    run.open(&gw).await;
    let unit = |scale: i8| 10i128.pow(scale as u32);
    for (table, precision, scale) in cases {
        let first = decimal_keyed(precision, scale, &[(unit(scale), 1), (2 * unit(scale) + 5, 2), (unit(scale), 3)]);
        let second = decimal_keyed(precision, scale, &[(2 * unit(scale) + 5, 4), (-unit(scale), 5)]);
        gw.post_accepted("r", "e", table, None, ipc_stream(&[first])).await;
        gw.post_accepted("r", "e", table, None, ipc_stream(&[second])).await;
    }
    let committed = gw.commit_and_wait("r", "e").await;
    assert_eq!(committed["state"], "committed", "{committed}");
    let merges = proxy.queries().into_iter().filter(|q| q.starts_with("MERGE")).collect::<Vec<_>>().join("\n");
    assert!(merges.contains("PARTITION BY PARSE_BIGNUMERIC(_filament_staged.`k`)"), "{merges}");
    assert!(merges.contains("PARTITION BY PARSE_NUMERIC(_filament_staged.`k`)"), "{merges}");
    for (table, _, scale) in cases {
        let sql = format!("SELECT CAST(k AS STRING), v FROM {}.{table} ORDER BY k", gw.dataset);
        let rows: Vec<(f64, String)> =
            gw.query(&sql).await.iter().map(|r| (text(&r[0]).parse::<f64>().unwrap(), text(&r[1]))).collect();
        let small = 5.0 / unit(scale) as f64;
        let expected = vec![(-1.0, "5".to_string()), (1.0, "3".to_string()), (2.0 + small, "4".to_string())];
        assert_eq!(rows.len(), 3, "{table}: every key once: {rows:?}");
        for ((key, value), (expected_key, expected_value)) in rows.iter().zip(&expected) {
            assert!((key - expected_key).abs() < 1e-12, "{table}: {rows:?}");
            assert_eq!(value, expected_value, "{table}: the last row of each key wins: {rows:?}");
        }
    }
}

/// Rows of (`id`, `t`, `s`, `order`, `_filament_op`); the op column only when `ops` is set.
fn aliased(rows: &[(i64, &str, &str, i64, &str)], ops: bool) -> RecordBatch {
    let mut fields = vec![
        Field::new("id", DataType::Int64, false),
        Field::new("t", DataType::Utf8, true),
        Field::new("s", DataType::Utf8, true),
        Field::new("order", DataType::Int64, true),
    ];
    let mut columns: Vec<ArrayRef> = vec![
        Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.0))),
        Arc::new(StringArray::from_iter_values(rows.iter().map(|r| r.1))),
        Arc::new(StringArray::from_iter_values(rows.iter().map(|r| r.2))),
        Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.3))),
    ];
    if ops {
        fields.push(Field::new("_filament_op", DataType::Utf8, false));
        columns.push(Arc::new(StringArray::from_iter_values(rows.iter().map(|r| r.4))));
    }
    batch(fields, columns)
}

#[tokio::test]
async fn upserts_and_cdc_merges_update_columns_named_t_s_and_order() {
    let gw = Gateway::spawn().await;
    TestRun::new("r", "e1")
        .resource("upserted", json!({"write_mode": "incremental_upsert", "primary_key": ["id"]}))
        .resource("merged", json!({"write_mode": "cdc_merge", "primary_key": ["id"]}))
        .open(&gw)
        .await;
    let initial = [(1, "t1", "s1", 10, "insert"), (2, "t2", "s2", 20, "insert"), (3, "t3", "s3", 30, "insert")];
    gw.post_accepted("r", "e1", "upserted", None, ipc_stream(&[aliased(&initial, false)])).await;
    gw.post_accepted("r", "e1", "merged", None, ipc_stream(&[aliased(&initial, true)])).await;
    assert_eq!(gw.commit_and_wait("r", "e1").await["state"], "committed");

    // A second execution matches the existing rows: their t, s and order are updated.
    gw.open_new_execution("r", "e2").await;
    let changes = [(1, "T1", "S1", 11, "update"), (2, "x", "x", 0, "delete"), (4, "t4", "s4", 40, "insert")];
    gw.post_accepted("r", "e2", "upserted", None, ipc_stream(&[aliased(&changes, false)])).await;
    gw.post_accepted("r", "e2", "merged", None, ipc_stream(&[aliased(&changes, true)])).await;
    let committed = gw.commit_and_wait("r", "e2").await;
    assert_eq!(committed["state"], "committed", "{committed}");

    let upserted = rows_of(&gw, "upserted").await;
    assert_eq!(upserted, ["1,T1,S1,11", "2,x,x,0", "3,t3,s3,30", "4,t4,s4,40"], "an upsert updates every column");
    let merged = rows_of(&gw, "merged").await;
    assert_eq!(merged, ["1,T1,S1,11", "3,t3,s3,30", "4,t4,s4,40"], "cdc_merge deletes key 2");
}

/// The rows of `table` as `id,t,s,order` lines.
async fn rows_of(gw: &Gateway, table: &str) -> Vec<String> {
    let sql = format!("SELECT id, t, s, `order` FROM {}.{table} ORDER BY id", gw.dataset);
    gw.query(&sql).await.iter().map(|r| r.iter().map(text).collect::<Vec<_>>().join(",")).collect()
}
