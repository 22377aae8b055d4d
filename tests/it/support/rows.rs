//! Rows in and out, as most tests move them: batches posted to execution `e` of run `run` (the
//! names [`super::TestRun::new`] is usually given), and what the destination tables hold
//! afterwards (the emulator answers every cell as a string).

use std::ops::Range;

use serde_json::Value;

use super::arrow::{ids, ipc_stream};
use super::{Gateway, TestRun, bigquery_query_at};

/// Posts `body` as a batch of `resource` (execution `e` of run `run`, no `seq`), asserting 202.
pub async fn post_ok(gw: &Gateway, resource: &str, body: Vec<u8>) {
    gw.post_accepted("run", "e", resource, None, body).await;
}

/// Posts the rows `ids` (one Int64 column `id`) as a batch of `resource`, asserting 202.
pub async fn post_ids(gw: &Gateway, resource: &str, range: Range<i64>) {
    post_ok(gw, resource, ipc_stream(&[ids(range)])).await;
}

/// Loads the rows `ids` into table `table` through a run of its own (`seed`, execution `e`, a
/// full_append resource named as the table), committed: a destination that exists, and holds
/// rows, before the run under test.
pub async fn seed_table(gw: &Gateway, table: &str, rows: Range<i64>) {
    TestRun::new("seed", "e").full_append(&[table]).open(gw).await;
    gw.post_accepted("seed", "e", table, None, ipc_stream(&[ids(rows)])).await;
    let committed = gw.commit_and_wait("seed", "e").await;
    assert_eq!(committed["state"], "committed", "{committed}");
}

/// A query answer's cell holding an integer.
pub fn int(v: &Value) -> i64 {
    v.as_str().and_then(|s| s.parse().ok()).unwrap_or_else(|| panic!("not an integer: {v}"))
}

/// Rows of `table` in the gateway's dataset (which must exist).
pub async fn count_rows(gw: &Gateway, table: &str) -> i64 {
    count_rows_if_created(gw, table).await.unwrap_or_else(|| panic!("no table {table}: the emulator answered no rows"))
}

/// Rows of `table` in the gateway's dataset; `None` when it was never created (the emulator
/// answers no rows).
pub async fn count_rows_if_created(gw: &Gateway, table: &str) -> Option<i64> {
    let rows = gw.query(&format!("SELECT COUNT(*) FROM {}.{table}", gw.dataset)).await;
    rows.first().map(|row| int(&row[0]))
}

/// Rows of `table` in the gateway's dataset and distinct values of its `id` column: equal
/// figures mean every row landed once.
pub async fn count_rows_and_ids(gw: &Gateway, table: &str) -> (i64, i64) {
    count_rows_and_ids_at(&gw.emulator_rest, &gw.project, &gw.dataset, table).await
}

/// [`count_rows_and_ids`] of `dataset.table` on the emulator whose REST API is at `host`.
pub async fn count_rows_and_ids_at(host: &str, project: &str, dataset: &str, table: &str) -> (i64, i64) {
    let sql = format!("SELECT COUNT(*), COUNT(DISTINCT id) FROM {dataset}.{table}");
    let rows = bigquery_query_at(host, project, &sql).await;
    let row = rows.first().unwrap_or_else(|| panic!("no answer to {sql}"));
    (int(&row[0]), int(&row[1]))
}
