//! The resource declaration's write options (issue 25) end to end through the emulator:
//! `metadata_columns` set by the publication in every statement shape (insert, replace, MERGE),
//! and the declaration's rules (echoed, fixed once batches exist, refused when repeated); the
//! generators the property tests share. `merges.rs`: MERGE and history against independent
//! models; `snapshots.rs`: `delete_missing`.

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow_array::{Int64Array, RecordBatch, StringArray};
use arrow_schema::{DataType, Field};
use rand::rngs::StdRng;
use rand::seq::IndexedRandom as _;
use rand::{Rng as _, SeedableRng as _};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::support::arrow::{batch, ipc_stream};
use crate::support::rows::int;
use crate::support::{Gateway, assert_problem};

mod merges;
mod snapshots;

pub(super) const ALL_METADATA: [&str; 3] = ["loaded_at", "run_id", "execution_id"];

/// `id`, `v` and, for the CDC modes, `_filament_op`.
pub(super) fn rows(rows: &[(i64, &str, &str)], with_op: bool) -> RecordBatch {
    let mut fields = vec![Field::new("id", DataType::Int64, false), Field::new("v", DataType::Utf8, true)];
    let mut columns: Vec<arrow_array::ArrayRef> = vec![
        Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.0))),
        Arc::new(StringArray::from_iter_values(rows.iter().map(|r| r.1))),
    ];
    if with_op {
        fields.push(Field::new("_filament_op", DataType::Utf8, false));
        columns.push(Arc::new(StringArray::from_iter_values(rows.iter().map(|r| r.2))));
    }
    batch(fields, columns)
}

/// Per `id`: (`v`, the execution that published the row, its run, the row's `loaded_at` in
/// microseconds); a missing column answers `""` or 0.
pub(super) async fn published(
    gw: &Gateway,
    table: &str,
    columns: &str,
) -> BTreeMap<i64, (String, String, String, i64)> {
    let sql = format!("SELECT id, v, {columns} FROM {}.{table} ORDER BY id", gw.dataset);
    let text = |v: &Value| v.as_str().unwrap_or_default().to_string();
    gw.query(&sql)
        .await
        .iter()
        .map(|r| (int(&r[0]), (text(&r[1]), text(&r[2]), text(&r[3]), r[4].as_str().map_or(0, |_| int(&r[4])))))
        .collect()
}

pub(super) const METADATA: &str = "_filament_execution_id, _filament_run_id, UNIX_MICROS(_filament_loaded_at)";

pub(super) async fn post(gw: &Gateway, execution: &str, resource: &str, body: &RecordBatch) {
    gw.post_accepted("r", execution, resource, None, ipc_stream(std::slice::from_ref(body))).await;
}

pub(super) async fn commit(gw: &Gateway, execution: &str) {
    let committed = gw.commit_and_wait("r", execution).await;
    assert_eq!(committed["state"], "committed", "{committed}");
}

#[tokio::test(flavor = "multi_thread")]
async fn metadata_columns_are_set_by_each_publication_in_every_statement_shape() {
    let gw = Gateway::spawn().await;
    gw.create_run("r").await;
    let merged = gw
        .declare(
            "r",
            "accounts",
            json!({"write_mode": "cdc_merge", "primary_key": ["id"], "metadata_columns": ALL_METADATA}),
        )
        .await;
    assert_eq!(merged["metadata_columns"], json!(ALL_METADATA), "the declaration is echoed: {merged}");
    gw.declare("r", "log", json!({"write_mode": "full_append", "metadata_columns": ["run_id", "loaded_at"]})).await;
    gw.declare("r", "snapshot", json!({"write_mode": "full_replace", "metadata_columns": ["execution_id"]})).await;

    gw.open_new_execution("r", "e1").await;
    let first: Vec<(i64, &str, &str)> = (0..6).map(|id| (id, "a", "insert")).collect();
    post(&gw, "e1", "accounts", &rows(&first, true)).await;
    post(&gw, "e1", "log", &rows(&first, false)).await;
    post(&gw, "e1", "snapshot", &rows(&first, false)).await;
    commit(&gw, "e1").await;
    let after_e1 = published(&gw, "accounts", METADATA).await;
    assert_eq!(after_e1.len(), 6);
    let loaded_e1 = after_e1[&0].3;
    assert!(loaded_e1 > 0, "loaded_at is set: {after_e1:?}");
    for (id, (v, execution, run, loaded)) in &after_e1 {
        assert_eq!((v.as_str(), execution.as_str(), run.as_str()), ("a", "e1", "r"), "row {id}");
        assert_eq!(*loaded, loaded_e1, "one loaded_at for every row of one publication (row {id})");
    }

    // A later execution: updated and inserted keys carry it, the others keep the first, and a
    // deleted key is gone with its metadata.
    gw.open_new_execution("r", "e2").await;
    let changes = [(1, "b", "update"), (2, "", "delete"), (9, "new", "insert"), (1, "c", "upsert")];
    post(&gw, "e2", "accounts", &rows(&changes, true)).await;
    post(&gw, "e2", "log", &rows(&[(100, "x", "")], false)).await;
    post(&gw, "e2", "snapshot", &rows(&[(7, "only", "")], false)).await;
    commit(&gw, "e2").await;
    let after_e2 = published(&gw, "accounts", METADATA).await;
    let keys: Vec<i64> = after_e2.keys().copied().collect();
    assert_eq!(keys, [0, 1, 3, 4, 5, 9]);
    for (id, (v, execution, _, loaded)) in &after_e2 {
        let changed = [1, 9].contains(id);
        assert_eq!(execution, if changed { "e2" } else { "e1" }, "row {id}");
        assert_eq!(*loaded > loaded_e1, changed, "row {id}: loaded_at moves only with the row");
        if *id == 1 {
            assert_eq!(v, "c", "the last operation of the key wins");
        }
    }
    let loaded_e2: std::collections::BTreeSet<i64> =
        after_e2.iter().filter(|(id, _)| [1, 9].contains(*id)).map(|(_, r)| r.3).collect();
    assert_eq!(loaded_e2.len(), 1, "one loaded_at per publication: {after_e2:?}");

    // The append keeps every row with the run and the time of the publication that wrote it;
    // the replacement (a later segment appends) carries the execution of each segment.
    let log = gw
        .query(&format!(
            "SELECT _filament_run_id, COUNT(*), COUNT(DISTINCT _filament_loaded_at) FROM {}.log GROUP BY 1",
            gw.dataset
        ))
        .await;
    assert_eq!(log, vec![vec![json!("r"), json!("7"), json!("2")]], "{log:?}");
    let snapshot = gw
        .query(&format!("SELECT _filament_execution_id, COUNT(*) FROM {}.snapshot GROUP BY 1 ORDER BY 1", gw.dataset))
        .await;
    assert_eq!(snapshot, vec![vec![json!("e1"), json!("6")], vec![json!("e2"), json!("1")]], "{snapshot:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn metadata_columns_are_part_of_the_declaration() {
    let gw = Gateway::spawn().await;
    gw.create_run("r").await;
    let path = "/v1/runs/r/resources/users";
    let repeated = json!({"write_mode": "full_append", "metadata_columns": ["run_id", "run_id"]});
    let refused =
        assert_problem(gw.json(Method::PUT, path, Some(repeated)).await, StatusCode::BAD_REQUEST, "invalid_request");
    assert!(refused["detail"].as_str().unwrap().contains("\"run_id\" twice"), "{refused}");
    let unknown = json!({"write_mode": "full_append", "metadata_columns": ["loaded_by"]});
    assert_problem(gw.json(Method::PUT, path, Some(unknown)).await, StatusCode::BAD_REQUEST, "invalid_request");
    let (status, run) = gw.json(Method::GET, "/v1/runs/r", None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(run["resources"], json!([]), "a refused declaration stores nothing: {run}");

    // Listed in another order, the same declaration: idempotent.
    gw.declare("r", "users", json!({"write_mode": "full_append", "metadata_columns": ["run_id", "loaded_at"]})).await;
    let again = gw
        .declare("r", "users", json!({"write_mode": "full_append", "metadata_columns": ["loaded_at", "run_id"]}))
        .await;
    assert_eq!(again["metadata_columns"], json!(["loaded_at", "run_id"]));
    gw.open_new_execution("r", "e1").await;
    post(&gw, "e1", "users", &rows(&[(1, "a", "")], false)).await;
    let changed = json!({"write_mode": "full_append", "metadata_columns": ["loaded_at"]});
    assert_problem(gw.json(Method::PUT, path, Some(changed)).await, StatusCode::CONFLICT, "resource_conflict");
    let dropped = json!({"write_mode": "full_append"});
    assert_problem(gw.json(Method::PUT, path, Some(dropped)).await, StatusCode::CONFLICT, "resource_conflict");
    commit(&gw, "e1").await;
    let rows = gw.query(&format!("SELECT id, _filament_run_id FROM {}.users", gw.dataset)).await;
    assert_eq!(rows, vec![vec![json!("1"), json!("r")]]);
}

/// One generated change: key, value (NULL sometimes), order value, operation.
#[derive(Debug, Clone)]
pub(super) struct Change {
    pub(super) id: i64,
    pub(super) v: Option<String>,
    pub(super) lsn: i64,
    pub(super) op: &'static str,
}

/// `id, v` rows of a `full_upsert` resource.
pub(super) fn upserts(rows: &[(i64, &str)]) -> Vec<u8> {
    let rows: Vec<(i64, &str, &str)> = rows.iter().map(|(id, v)| (*id, *v, "")).collect();
    ipc_stream(&[self::rows(&rows, false)])
}

/// Where a change falls in its key's order: (order value or 0, seq, row).
pub(super) type Rank = (i64, i64, usize);

/// The property tests' generator, seeded from `FILAMENT_WRITE_OPTIONS_SEED` (25 unless set):
/// every failure message names the seed, and setting it replays the same sequence.
pub(super) fn seeded_rng() -> (u64, StdRng) {
    let seed = std::env::var("FILAMENT_WRITE_OPTIONS_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(25);
    (seed, StdRng::seed_from_u64(seed))
}

/// Posts each of `sequenced`'s batches (with its `seq`), last first, to every target resource
/// (name, whether it takes CDC input: plain-row resources get the batch without its deletes,
/// and no empty batch).
pub(super) async fn post_in_reverse(
    gw: &Gateway,
    run: &str,
    execution: &str,
    sequenced: &[(i64, Vec<Change>)],
    targets: &[(&str, bool)],
) {
    for (seq, changes) in sequenced.iter().rev() {
        for (name, cdc) in targets {
            let sent: Vec<Change> = changes.iter().filter(|c| *cdc || c.op != "delete").cloned().collect();
            if !sent.is_empty() {
                gw.post_accepted(run, execution, name, Some(*seq), changes_body(&sent, *cdc)).await;
            }
        }
    }
}

pub(super) fn changes_body(changes: &[Change], with_op: bool) -> Vec<u8> {
    let mut fields = vec![
        Field::new("id", DataType::Int64, false),
        Field::new("v", DataType::Utf8, true),
        Field::new("lsn", DataType::Int64, true),
    ];
    let mut columns: Vec<arrow_array::ArrayRef> = vec![
        Arc::new(Int64Array::from_iter_values(changes.iter().map(|c| c.id))),
        Arc::new(StringArray::from_iter(changes.iter().map(|c| c.v.as_deref()))),
        Arc::new(Int64Array::from_iter_values(changes.iter().map(|c| c.lsn))),
    ];
    if with_op {
        fields.push(Field::new("_filament_op", DataType::Utf8, false));
        columns.push(Arc::new(StringArray::from_iter_values(changes.iter().map(|c| c.op))));
    }
    ipc_stream(&[batch(fields, columns)])
}

/// One execution's batches: fresh changes with growing order values, sometimes a late one
/// (older than what the destination holds) or a replay of an earlier batch.
pub(super) fn generate_execution(rng: &mut StdRng, clock: &mut i64, history: &[Vec<Change>]) -> Vec<Vec<Change>> {
    let mut batches = Vec::new();
    for _ in 0..rng.random_range(1..=3) {
        if rng.random_ratio(1, 4)
            && let Some(replayed) = history.choose(rng)
        {
            batches.push(replayed.clone());
            continue;
        }
        let rows = rng.random_range(1..=7);
        let changes = (0..rows)
            .map(|_| {
                // A tie with a change published earlier: the same key and order value, other
                // values (a tie goes to the newer publication).
                let earlier: Vec<&Change> = history.iter().flatten().collect();
                if rng.random_ratio(1, 6)
                    && let Some(tied) = earlier.choose(rng)
                {
                    let op = *["update", "upsert", "delete"].choose(rng).unwrap();
                    return Change {
                        id: tied.id,
                        v: Some(format!("tie{}", rng.random_range(0..100))),
                        lsn: tied.lsn,
                        op,
                    };
                }
                *clock += rng.random_range(1..=3);
                let late = rng.random_ratio(1, 5);
                let op = *["insert", "update", "upsert", "delete"].choose(rng).unwrap();
                Change {
                    id: rng.random_range(0..8),
                    v: rng.random_ratio(3, 4).then(|| format!("v{}", rng.random_range(0..100))),
                    // Ties too: the same order value for several changes of a key.
                    lsn: if late { *clock - rng.random_range(10..30) } else { *clock / 2 },
                    op,
                }
            })
            .collect();
        batches.push(changes);
    }
    batches
}

#[tokio::test(flavor = "multi_thread")]
async fn a_redelivery_with_write_options_publishes_nothing_twice() {
    let gw = Gateway::spawn().await;
    gw.create_run("r").await;
    let options = json!({"write_mode": "cdc_merge", "primary_key": ["id"], "order_by": "lsn", "deletes": "soft",
        "metadata_columns": ALL_METADATA});
    gw.declare("r", "accounts", options).await;
    gw.declare("r", "snap", json!({"write_mode": "full_upsert", "primary_key": ["id"], "delete_missing": true})).await;
    let changes = [
        Change { id: 1, v: Some("a".into()), lsn: 5, op: "insert" },
        Change { id: 2, v: Some("b".into()), lsn: 6, op: "insert" },
        Change { id: 2, v: None, lsn: 7, op: "delete" },
    ];
    let deliver = |opened: StatusCode, pause: bool| {
        let (gw, changes) = (&gw, &changes);
        async move {
            let (status, body) = gw.open_execution("r", "e").await;
            assert_eq!(status, opened, "{body}");
            gw.post_accepted("r", "e", "accounts", Some(0), changes_body(changes, true)).await;
            gw.post_accepted("r", "e", "snap", Some(0), upserts(&[(1, "a")])).await;
            if pause {
                let (status, paused) = gw.json(Method::POST, "/v1/runs/r/executions/e/pause", None).await;
                assert_eq!(status, StatusCode::OK, "{paused}");
            }
            gw.json(Method::POST, "/v1/runs/r/executions/e/commit?wait=true", None).await.1
        }
    };
    let published = format!(
        "SELECT id, v, lsn, _filament_deleted_at IS NOT NULL, UNIX_MICROS(_filament_loaded_at) FROM {}.accounts ORDER BY id",
        gw.dataset
    );
    let first = deliver(StatusCode::CREATED, false).await;
    assert_eq!(first["state"], "committed", "{first}");
    let after_first = gw.query(&published).await;
    assert_eq!(after_first.len(), 1, "key 2 was inserted and deleted within the delivery: {after_first:?}");
    let second = deliver(StatusCode::OK, false).await;
    assert_eq!((second["state"].clone(), second["delivery"].clone()), (json!("committed"), json!(2)), "{second}");
    assert_eq!(
        gw.query(&published).await,
        after_first,
        "the redelivery reused the publication: same rows, same loaded_at"
    );
    // A redelivery that pauses would not complete the snapshot the first delivery completed.
    let third = deliver(StatusCode::OK, true).await;
    assert_eq!(
        (third["state"].clone(), third["error"]["code"].clone()),
        (json!("failed"), json!("replay_mismatch")),
        "{third}"
    );
    assert_eq!(gw.query(&published).await, after_first);
}
