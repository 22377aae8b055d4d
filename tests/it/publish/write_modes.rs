//! Every write mode end to end through the emulator, each checked against an end state the test
//! computes itself (a model of the operations in `(seq, row)` order), and the lossless types.

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow_array::{
    Decimal128Array, Int64Array, RecordBatch, StringArray, Time32MillisecondArray, Time64MicrosecondArray, UInt64Array,
};
use arrow_schema::{DataType, Field, TimeUnit};
use serde_json::{Value, json};

use crate::support::arrow::{batch, ids, ipc_stream};
use crate::support::rows::{count_rows, int, seed_table};
use crate::support::{Gateway, TestRun};

/// One change row of the `accounts` resource.
#[derive(Clone, Copy)]
struct Change {
    id: i64,
    name: &'static str,
    /// NUMERIC(20, 4) as ten-thousandths.
    balance: i128,
    op: &'static str,
}

fn change(id: i64, name: &'static str, balance: i128, op: &'static str) -> Change {
    Change { id, name, balance, op }
}

fn changes_batch(changes: &[Change]) -> RecordBatch {
    batch(
        vec![
            Field::new("id", DataType::Int64, false),
            Field::new("name", DataType::Utf8, true),
            Field::new("balance", DataType::Decimal128(20, 4), true),
            Field::new("_filament_op", DataType::Utf8, false),
        ],
        vec![
            Arc::new(Int64Array::from_iter_values(changes.iter().map(|c| c.id))),
            Arc::new(StringArray::from_iter_values(changes.iter().map(|c| c.name))),
            Arc::new(
                Decimal128Array::from_iter_values(changes.iter().map(|c| c.balance))
                    .with_precision_and_scale(20, 4)
                    .unwrap(),
            ),
            Arc::new(StringArray::from_iter_values(changes.iter().map(|c| c.op))),
        ],
    )
}

/// The expected table after applying `batches` (each with its `seq`) in `(seq, row)` order.
fn apply(mut model: BTreeMap<i64, (String, i128)>, batches: &[(i64, Vec<Change>)]) -> BTreeMap<i64, (String, i128)> {
    let mut ordered: Vec<&(i64, Vec<Change>)> = batches.iter().collect();
    ordered.sort_by_key(|(seq, _)| *seq);
    for (_, changes) in ordered {
        for c in changes {
            if c.op == "delete" {
                model.remove(&c.id);
            } else {
                model.insert(c.id, (c.name.to_string(), c.balance));
            }
        }
    }
    model
}

async fn accounts(gw: &Gateway, table: &str) -> BTreeMap<i64, (String, i128)> {
    gw.query(&format!("SELECT id, name, CAST(balance * 10000 AS INT64) FROM {}.{table} ORDER BY id", gw.dataset))
        .await
        .iter()
        .map(|r| (int(&r[0]), (r[1].as_str().unwrap().to_string(), i128::from(int(&r[2])))))
        .collect()
}

async fn post(gw: &Gateway, run: &str, execution: &str, resource: &str, seq: Option<i64>, body: &RecordBatch) {
    gw.post_accepted(run, execution, resource, seq, ipc_stream(std::slice::from_ref(body))).await;
}

async fn commit(gw: &Gateway, run: &str, execution: &str) -> Value {
    let committed = gw.commit_and_wait(run, execution).await;
    assert_eq!(committed["state"], "committed", "{committed}");
    committed
}

#[tokio::test(flavor = "multi_thread")]
async fn cdc_merge_folds_every_key_to_its_last_operation_and_cdc_append_keeps_them_all() {
    let gw = Gateway::spawn().await;
    TestRun::new("r", "e1")
        .resource("accounts", json!({"write_mode": "cdc_merge", "primary_key": ["id"]}))
        .resource("audit", json!({"table": "accounts_log", "write_mode": "cdc_append"}))
        .open(&gw)
        .await;

    let initial: Vec<Change> = (0..20).map(|id| change(id, "a", i128::from(id) * 15_000, "insert")).collect();
    post(&gw, "r", "e1", "accounts", None, &changes_batch(&initial)).await;
    post(&gw, "r", "e1", "audit", None, &changes_batch(&initial)).await;
    commit(&gw, "r", "e1").await;
    let mut model = apply(BTreeMap::new(), &[(0, initial.clone())]);
    assert_eq!(accounts(&gw, "accounts").await, model);

    // Sent out of order: seq 1 first. The fold follows (seq, row), not arrival.
    let later = vec![
        change(3, "b3", 1, "update"),
        change(4, "x", 0, "delete"),
        change(4, "again", 44_444, "insert"),
        change(5, "five", 5, "update"),
        change(5, "", 0, "delete"),
        change(6, "v1", 1, "upsert"),
        change(6, "v2", 2, "upsert"),
        change(6, "v3", 123_456_789_012_345, "upsert"),
        change(7, "", 0, "delete"),
        change(99, "", 0, "delete"),
    ];
    let earlier = vec![
        change(3, "first3", 3, "update"),
        change(4, "", 0, "delete"),
        change(30, "new", -12_345, "upsert"),
        change(8, "gone", 8, "update"),
        change(8, "", 0, "delete"),
        change(8, "back", 88, "insert"),
    ];
    gw.open_new_execution("r", "e2").await;
    post(&gw, "r", "e2", "accounts", Some(1), &changes_batch(&later)).await;
    post(&gw, "r", "e2", "accounts", Some(0), &changes_batch(&earlier)).await;
    post(&gw, "r", "e2", "audit", Some(0), &changes_batch(&earlier)).await;
    post(&gw, "r", "e2", "audit", Some(1), &changes_batch(&later)).await;
    let committed = commit(&gw, "r", "e2").await;
    model = apply(model, &[(1, later.clone()), (0, earlier.clone())]);
    assert_eq!(accounts(&gw, "accounts").await, model);
    assert_eq!(model.get(&4).map(|(n, _)| n.as_str()), Some("again"), "delete then re-insert");
    assert!(!model.contains_key(&5) && !model.contains_key(&7), "update then delete, delete");
    let accounts_view =
        committed["resources"].as_array().unwrap().iter().find(|r| r["resource"] == "accounts").unwrap();
    assert_eq!(accounts_view["publication"]["state"], "done", "{accounts_view}");

    let log = gw
        .query(&format!(
            "SELECT _filament_op, COUNT(*) FROM {}.accounts_log GROUP BY _filament_op ORDER BY 1",
            gw.dataset
        ))
        .await;
    let mut expected: BTreeMap<&str, i64> = BTreeMap::new();
    for c in initial.iter().chain(&earlier).chain(&later) {
        *expected.entry(c.op).or_default() += 1;
    }
    let actual: BTreeMap<&str, i64> = log.iter().map(|r| (r[0].as_str().unwrap(), int(&r[1]))).collect();
    assert_eq!(actual, expected);
}

fn id_value(rows: &[(i64, i64)]) -> RecordBatch {
    batch(
        vec![Field::new("id", DataType::Int64, false), Field::new("v", DataType::Int64, true)],
        vec![
            Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.0))),
            Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.1))),
        ],
    )
}

async fn id_values(gw: &Gateway, table: &str) -> BTreeMap<i64, i64> {
    gw.query(&format!("SELECT id, v FROM {}.{table} ORDER BY id", gw.dataset))
        .await
        .iter()
        .map(|r| (int(&r[0]), int(&r[1])))
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn upserts_and_deletes_converge_on_the_last_value_per_key() {
    let gw = Gateway::spawn().await;
    TestRun::new("r", "e1")
        .resource("users", json!({"write_mode": "incremental_upsert", "primary_key": ["id"]}))
        .resource("users_deleted", json!({"table": "users", "write_mode": "incremental_delete", "primary_key": ["id"]}))
        .resource("users_full", json!({"table": "users", "write_mode": "full_upsert", "primary_key": ["id"]}))
        .open(&gw)
        .await;

    let mut model = BTreeMap::new();
    let first: Vec<(i64, i64)> = (0..10).map(|i| (i, i * 10)).collect();
    let second: Vec<(i64, i64)> = (0..4).map(|i| (i, -1)).chain([(0, -2)]).collect();
    post(&gw, "r", "e1", "users", None, &id_value(&first)).await;
    post(&gw, "r", "e1", "users", None, &id_value(&second)).await;
    // An empty upsert resource in the same execution runs no query and changes nothing.
    post(&gw, "r", "e1", "users_full", None, &id_value(&[])).await;
    commit(&gw, "r", "e1").await;
    model.extend(first.iter().chain(&second).copied());
    assert_eq!(id_values(&gw, "users").await, model);
    assert_eq!(model[&0], -2, "the same key twice in one batch: the later row wins");

    gw.open_new_execution("r", "e2").await;
    let deleted =
        batch(vec![Field::new("id", DataType::Int64, false)], vec![Arc::new(Int64Array::from(vec![1, 2, 42]))]);
    post(&gw, "r", "e2", "users_deleted", None, &deleted).await;
    commit(&gw, "r", "e2").await;
    for id in [1, 2, 42] {
        model.remove(&id);
    }
    assert_eq!(id_values(&gw, "users").await, model);

    gw.open_new_execution("r", "e3").await;
    post(&gw, "r", "e3", "users_full", None, &id_value(&[(5, 555), (100, 1000), (5, 556)])).await;
    commit(&gw, "r", "e3").await;
    model.extend([(5, 556), (100, 1000)]);
    assert_eq!(id_values(&gw, "users").await, model);
}

#[tokio::test(flavor = "multi_thread")]
async fn full_replace_replaces_once_per_run_and_an_empty_replacement_truncates() {
    let gw = Gateway::spawn().await;
    seed_table(&gw, "t", 0..50).await;

    TestRun::new("r1", "e1").resource("t", json!({"write_mode": "full_replace"})).open(&gw).await;
    post(&gw, "r1", "e1", "t", None, &ids(100..130)).await;
    commit(&gw, "r1", "e1").await;
    let count = |rows: Vec<Vec<Value>>| rows[0].iter().map(int).collect::<Vec<_>>();
    let stats = format!("SELECT COUNT(*), MIN(id), MAX(id) FROM {}.t", gw.dataset);
    assert_eq!(count(gw.query(&stats).await), [30, 100, 129], "replaced");

    // A later segment of the same run (a resumed run) appends to what the first one wrote.
    gw.open_new_execution("r1", "e2").await;
    post(&gw, "r1", "e2", "t", None, &ids(130..140)).await;
    commit(&gw, "r1", "e2").await;
    assert_eq!(count(gw.query(&stats).await), [40, 100, 139], "second segment appended");

    // A new run whose replacement is empty (a schema-only stream) leaves the table empty.
    TestRun::new("r2", "e1").resource("t", json!({"write_mode": "full_replace"})).open(&gw).await;
    post(&gw, "r2", "e1", "t", None, &ids(0..0)).await;
    let committed = commit(&gw, "r2", "e1").await;
    assert_eq!(committed["resources"][0]["publication"]["state"], "done", "{committed}");
    assert_eq!(count_rows(&gw, "t").await, 0);
}

/// BIGNUMERIC is left to the unit tests and the SQL snapshots: the emulator cannot create a
/// BIGNUMERIC column (500 on `tables.insert`).
#[tokio::test(flavor = "multi_thread")]
async fn numeric_unsigned_and_time_values_arrive_exactly() {
    let gw = Gateway::spawn().await;
    TestRun::new("r", "e").full_append(&["exact"]).open(&gw).await;
    let amounts = [Some(123_456_789_012_345_678_901_234_567_890_i128), Some(-1), Some(10_000_000_000), None];
    let body = batch(
        vec![
            Field::new("id", DataType::Int64, false),
            Field::new("amount", DataType::Decimal128(38, 9), true),
            Field::new("counter", DataType::UInt64, true),
            Field::new("at", DataType::Time64(TimeUnit::Microsecond), true),
            Field::new("at_ms", DataType::Time32(TimeUnit::Millisecond), true),
        ],
        vec![
            Arc::new(Int64Array::from(vec![0, 1, 2, 3])),
            Arc::new(Decimal128Array::from(amounts.to_vec()).with_precision_and_scale(38, 9).unwrap()),
            Arc::new(UInt64Array::from(vec![Some(u64::MAX), Some(0), Some(1 << 63), None])),
            Arc::new(Time64MicrosecondArray::from(vec![Some(0), Some(86_399_999_999), Some(45_296_000_001), None])),
            Arc::new(Time32MillisecondArray::from(vec![Some(1), Some(86_399_999), None, Some(3_723_004)])),
        ],
    );
    post(&gw, "r", "e", "exact", None, &body).await;
    commit(&gw, "r", "e").await;
    // The emulator renders NUMERIC like Python's Decimal (`1E-9`, `10.000000000`) and TIME with
    // six decimals: compare canonical forms (no exponent, no trailing zeros).
    let rows =
        gw.query(&format!("SELECT id, amount, counter, `at`, at_ms FROM {}.exact ORDER BY id", gw.dataset)).await;
    let got: Vec<Vec<Option<String>>> =
        rows.iter().map(|r| r[1..].iter().map(|v| v.as_str().map(canonical)).collect()).collect();
    let s = |v: &str| Some(v.to_string());
    assert_eq!(
        got,
        vec![
            vec![s("123456789012345678901.23456789"), s("18446744073709551615"), s("00:00:00"), s("00:00:00.001")],
            vec![s("-0.000000001"), s("0"), s("23:59:59.999999"), s("23:59:59.999")],
            vec![s("10"), s("9223372036854775808"), s("12:34:56.000001"), None],
            vec![None, None, None, s("01:02:03.004")],
        ]
    );
}

/// A decimal or time string without exponent and without trailing fractional zeros.
fn canonical(text: &str) -> String {
    if text.contains(':') {
        return if text.contains('.') {
            text.trim_end_matches('0').trim_end_matches('.').to_string()
        } else {
            text.into()
        };
    }
    let (mantissa, exponent) = match text.split_once(['E', 'e']) {
        Some((m, e)) => (m, e.parse::<i64>().unwrap()),
        None => (text, 0),
    };
    let (sign, mantissa) = mantissa.strip_prefix('-').map_or(("", mantissa), |m| ("-", m));
    let (whole, fraction) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let digits = format!("{whole}{fraction}");
    // The value is digits * 10^(point - len(digits)).
    let point = whole.len() as i64 + exponent;
    let (int_part, frac_part) = if point <= 0 {
        ("0".to_string(), format!("{}{digits}", "0".repeat((-point) as usize)))
    } else if point as usize >= digits.len() {
        (format!("{digits}{}", "0".repeat(point as usize - digits.len())), String::new())
    } else {
        (digits[..point as usize].to_string(), digits[point as usize..].to_string())
    };
    let int_part = int_part.trim_start_matches('0');
    let int_part = if int_part.is_empty() { "0" } else { int_part };
    let frac_part = frac_part.trim_end_matches('0');
    let sign = if int_part == "0" && frac_part.is_empty() { "" } else { sign };
    if frac_part.is_empty() { format!("{sign}{int_part}") } else { format!("{sign}{int_part}.{frac_part}") }
}
