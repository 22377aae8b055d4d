//! The resource declaration's write options (issue 25) end to end through the emulator:
//! `metadata_columns` set by the publication in every statement shape (insert, replace, MERGE),
//! and the declaration's rules (echoed, fixed once batches exist, refused when repeated).

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
use crate::support::{Gateway, TestRun, assert_problem};

const ALL_METADATA: [&str; 3] = ["loaded_at", "run_id", "execution_id"];

/// `id`, `v` and, for the CDC modes, `_filament_op`.
fn rows(rows: &[(i64, &str, &str)], with_op: bool) -> RecordBatch {
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
async fn published(gw: &Gateway, table: &str, columns: &str) -> BTreeMap<i64, (String, String, String, i64)> {
    let sql = format!("SELECT id, v, {columns} FROM {}.{table} ORDER BY id", gw.dataset);
    let text = |v: &Value| v.as_str().unwrap_or_default().to_string();
    gw.query(&sql)
        .await
        .iter()
        .map(|r| (int(&r[0]), (text(&r[1]), text(&r[2]), text(&r[3]), r[4].as_str().map_or(0, |_| int(&r[4])))))
        .collect()
}

const METADATA: &str = "_filament_execution_id, _filament_run_id, UNIX_MICROS(_filament_loaded_at)";

async fn post(gw: &Gateway, execution: &str, resource: &str, body: &RecordBatch) {
    gw.post_accepted("r", execution, resource, None, ipc_stream(std::slice::from_ref(body))).await;
}

async fn commit(gw: &Gateway, execution: &str) {
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
struct Change {
    id: i64,
    v: Option<String>,
    lsn: i64,
    op: &'static str,
}

/// The property tests' generator, seeded from `FILAMENT_WRITE_OPTIONS_SEED` (25 unless set):
/// every failure message names the seed, and setting it replays the same sequence.
fn seeded_rng() -> (u64, StdRng) {
    let seed = std::env::var("FILAMENT_WRITE_OPTIONS_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(25);
    (seed, StdRng::seed_from_u64(seed))
}

/// Where a change falls in its key's order: (order value or 0, seq, row).
type Rank = (i64, i64, usize);

/// The destination as the model says it must be: key -> (value, order value, soft-deleted).
type Model = BTreeMap<i64, (Option<String>, i64, bool)>;

/// One resource of the property test, and how its model publishes.
struct Modelled {
    name: &'static str,
    declaration: Value,
    /// Declared `order_by: lsn`.
    ordered: bool,
    /// CDC input (`_filament_op`); else plain rows meaning upserts (deletes are not sent).
    cdc: bool,
    soft: bool,
}

impl Modelled {
    /// Applies one publication of `batches` (each with its `seq`) to `model`, as the issue
    /// states the semantics, written without looking at the gateway's SQL: fold each key to
    /// its largest (lsn, seq, row) when ordered, else its largest (seq, row); the folded change
    /// reaches an existing row (a soft-deleted one too) only when it is at least as new
    /// (ordered), or always; a delete removes the row, or (soft) marks it, keeping its values
    /// but for the order value, which becomes the delete's; a delete of an absent key does
    /// nothing.
    fn publish(&self, model: &mut Model, batches: &[(i64, Vec<Change>)]) {
        let mut last: BTreeMap<i64, (Rank, &Change)> = BTreeMap::new();
        for (seq, changes) in batches {
            for (row, change) in changes.iter().filter(|c| self.cdc || c.op != "delete").enumerate() {
                let rank = (if self.ordered { change.lsn } else { 0 }, *seq, row);
                if last.get(&change.id).is_none_or(|(best, _)| rank > *best) {
                    last.insert(change.id, (rank, change));
                }
            }
        }
        for (id, (_, change)) in last {
            let existing = model.get(&id).cloned();
            if self.ordered && existing.as_ref().is_some_and(|(_, lsn, _)| *lsn > change.lsn) {
                continue;
            }
            match (change.op, existing) {
                ("delete", None) => {}
                // The delete's order value only when it orders: otherwise lsn is a data column
                // like any other, and the row keeps it.
                ("delete", Some((v, lsn, _))) if self.soft => {
                    model.insert(id, (v, if self.ordered { change.lsn } else { lsn }, true));
                }
                ("delete", Some(_)) => {
                    model.remove(&id);
                }
                _ => {
                    model.insert(id, (change.v.clone(), change.lsn, false));
                }
            }
        }
    }

    async fn destination(&self, gw: &Gateway) -> Model {
        let deleted = if self.soft { "_filament_deleted_at IS NOT NULL" } else { "FALSE" };
        gw.query(&format!("SELECT id, v, lsn, {deleted} FROM {}.{} ORDER BY id", gw.dataset, self.name))
            .await
            .iter()
            .map(|r| (int(&r[0]), (r[1].as_str().map(str::to_string), int(&r[2]), r[3] == json!("true"))))
            .collect()
    }
}

/// Posts each of `sequenced`'s batches (with its `seq`), last first, to every target resource
/// (name, whether it takes CDC input: plain-row resources get the batch without its deletes,
/// and no empty batch).
async fn post_in_reverse(
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

fn changes_body(changes: &[Change], with_op: bool) -> Vec<u8> {
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
fn generate_execution(rng: &mut StdRng, clock: &mut i64, history: &[Vec<Change>]) -> Vec<Vec<Change>> {
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

/// Every combination the property test publishes in the same executions.
fn modelled_resources() -> Vec<Modelled> {
    let key = json!(["id"]);
    let resource = |name, declaration: Value, ordered, cdc, soft| Modelled { name, declaration, ordered, cdc, soft };
    vec![
        resource("cdc_arrival", json!({"write_mode": "cdc_merge", "primary_key": key}), false, true, false),
        resource(
            "cdc_ordered",
            json!({"write_mode": "cdc_merge", "primary_key": key, "order_by": "lsn", "metadata_columns": ALL_METADATA}),
            true,
            true,
            false,
        ),
        resource(
            "cdc_soft",
            json!({"write_mode": "cdc_merge", "primary_key": key, "deletes": "soft"}),
            false,
            true,
            true,
        ),
        resource(
            "cdc_soft_ordered",
            json!({"write_mode": "cdc_merge", "primary_key": key, "order_by": ["lsn"], "deletes": "soft"}),
            true,
            true,
            true,
        ),
        resource(
            "upsert_ordered",
            json!({"write_mode": "incremental_upsert", "primary_key": key, "order_by": ["lsn"]}),
            true,
            false,
            false,
        ),
        resource(
            "full_upsert_ordered",
            json!({"write_mode": "full_upsert", "primary_key": key, "order_by": ["lsn", "id"]}),
            true,
            false,
            false,
        ),
    ]
}

#[tokio::test(flavor = "multi_thread")]
async fn ordered_soft_and_arrival_merges_match_an_independent_model_after_every_commit() {
    let (seed, mut rng) = seeded_rng();
    let gw = Gateway::spawn().await;
    gw.create_run("r").await;
    let resources = modelled_resources();
    for resource in &resources {
        gw.declare("r", resource.name, resource.declaration.clone()).await;
    }
    let mut models: Vec<Model> = vec![Model::new(); resources.len()];
    let (mut clock, mut history, mut soft_deleted_seen) = (0i64, Vec::new(), false);
    for execution in 0..10 {
        let execution_id = format!("e{execution}");
        gw.open_new_execution("r", &execution_id).await;
        let batches = generate_execution(&mut rng, &mut clock, &history);
        // Posted in reverse seq order: the fold follows seq (and the order values), not arrival.
        let sequenced: Vec<(i64, Vec<Change>)> =
            batches.iter().cloned().enumerate().map(|(i, b)| (i as i64, b)).collect();
        let targets: Vec<(&str, bool)> = resources.iter().map(|r| (r.name, r.cdc)).collect();
        post_in_reverse(&gw, "r", &execution_id, &sequenced, &targets).await;
        commit(&gw, &execution_id).await;
        for (resource, model) in resources.iter().zip(&mut models) {
            resource.publish(model, &sequenced);
            let name = resource.name;
            assert_eq!(
                &resource.destination(&gw).await,
                model,
                "seed {seed}, {name} after {execution_id}: {sequenced:?}"
            );
            soft_deleted_seen |= model.values().any(|(_, _, deleted)| *deleted);
        }
        history.extend(batches);
    }
    assert!(soft_deleted_seen, "seed {seed}: the sequence soft-deleted a row at some commit");
    // Every row the ordered resource holds was stamped by the publication that wrote it.
    let unstamped = gw
        .query(&format!("SELECT COUNT(*) FROM {}.cdc_ordered WHERE _filament_execution_id IS NULL", gw.dataset))
        .await;
    assert_eq!(unstamped, vec![vec![json!("0")]]);
}

#[tokio::test(flavor = "multi_thread")]
async fn order_by_is_checked_against_every_batch() {
    let gw = Gateway::spawn().await;
    gw.create_run("r").await;
    let path = "/v1/runs/r/resources/accounts";
    let on_append = json!({"write_mode": "full_append", "order_by": "lsn"});
    assert_problem(
        gw.json(Method::PUT, path, Some(on_append)).await,
        StatusCode::UNPROCESSABLE_ENTITY,
        "invalid_order_by",
    );
    let declared =
        gw.declare("r", "accounts", json!({"write_mode": "cdc_merge", "primary_key": ["id"], "order_by": "lsn"})).await;
    assert_eq!(declared["order_by"], json!(["lsn"]));
    gw.open_new_execution("r", "e1").await;
    let null_lsn = {
        let fields = vec![
            Field::new("id", DataType::Int64, false),
            Field::new("lsn", DataType::Int64, true),
            Field::new("_filament_op", DataType::Utf8, false),
        ];
        let columns: Vec<arrow_array::ArrayRef> = vec![
            Arc::new(Int64Array::from(vec![1, 2, 3])),
            Arc::new(Int64Array::from(vec![Some(1), Some(2), None])),
            Arc::new(StringArray::from(vec!["insert", "insert", "delete"])),
        ];
        ipc_stream(&[batch(fields, columns)])
    };
    let before = gw.db_snapshot().await;
    let refused = assert_problem(
        gw.post_batch("r", "e1", "accounts", None, null_lsn).await,
        StatusCode::UNPROCESSABLE_ENTITY,
        "invalid_order_by",
    );
    assert!(refused["detail"].as_str().unwrap().contains("\"lsn\" is null in row 2"), "{refused}");
    let missing = ipc_stream(&[rows(&[(1, "a", "insert")], true)]);
    let refused = assert_problem(
        gw.post_batch("r", "e1", "accounts", None, missing).await,
        StatusCode::UNPROCESSABLE_ENTITY,
        "invalid_order_by",
    );
    assert!(refused["detail"].as_str().unwrap().contains("not in the batch's schema"), "{refused}");
    assert_eq!(gw.db_snapshot().await, before, "a refused batch stores nothing");
}

/// `id, v` rows of a `full_upsert` resource.
fn upserts(rows: &[(i64, &str)]) -> Vec<u8> {
    let rows: Vec<(i64, &str, &str)> = rows.iter().map(|(id, v)| (*id, *v, "")).collect();
    ipc_stream(&[self::rows(&rows, false)])
}

/// Per id: (v, soft-deleted) of `table`.
async fn snapshot_rows(gw: &Gateway, table: &str, soft: bool) -> BTreeMap<i64, (String, bool)> {
    let deleted = if soft { "_filament_deleted_at IS NOT NULL" } else { "FALSE" };
    gw.query(&format!("SELECT id, v, {deleted} FROM {}.{table} ORDER BY id", gw.dataset))
        .await
        .iter()
        .map(|r| (int(&r[0]), (r[1].as_str().unwrap_or_default().to_string(), r[2] == json!("true"))))
        .collect()
}

fn expected(rows: &[(i64, &str, bool)]) -> BTreeMap<i64, (String, bool)> {
    rows.iter().map(|(id, v, deleted)| (*id, (v.to_string(), *deleted))).collect()
}

/// Pauses the execution, then commits it: a segment of a run that resumes.
async fn commit_paused(gw: &Gateway, run: &str, execution: &str) {
    let (status, paused) = gw.json(Method::POST, &format!("/v1/runs/{run}/executions/{execution}/pause"), None).await;
    assert_eq!((status, &paused["state"]), (StatusCode::OK, &json!("paused")), "{paused}");
    let committed = gw.commit_and_wait(run, execution).await;
    assert_eq!(committed["state"], "committed", "{committed}");
}

#[tokio::test(flavor = "multi_thread")]
async fn delete_missing_deletes_only_when_the_snapshot_completes_across_paused_segments() {
    let gw = Gateway::spawn().await;
    let declaration = |soft: bool| {
        let mut body =
            json!({"table": "snap", "write_mode": "full_upsert", "primary_key": ["id"], "delete_missing": true});
        if soft {
            body["table"] = json!("snap_soft");
            body["deletes"] = json!("soft");
        }
        body
    };
    for soft in [false, true] {
        let table = if soft { "snap_soft" } else { "snap" };
        let run = |n: u32| format!("{table}-{n}");
        // Run 1: one unpaused execution is the whole snapshot.
        gw.create_run(&run(1)).await;
        let declared = gw.declare(&run(1), "s", declaration(soft)).await;
        assert_eq!(
            (declared["delete_missing"].clone(), declared["metadata_columns"].clone()),
            (json!(true), json!(["run_id"]))
        );
        gw.open_new_execution(&run(1), "e1").await;
        gw.post_accepted(&run(1), "e1", "s", None, upserts(&[(1, "a"), (2, "a"), (3, "a"), (4, "a"), (5, "a")])).await;
        let committed = gw.commit_and_wait(&run(1), "e1").await;
        assert_eq!(committed["state"], "committed", "{committed}");
        let all_a: Vec<(i64, &str, bool)> = (1..=5).map(|id| (id, "a", false)).collect();
        assert_eq!(snapshot_rows(&gw, table, soft).await, expected(&all_a));

        // Run 2 spans two paused segments and a completing one. Keys the run has not reached
        // yet survive the paused segments; the completing one removes 1 and 5.
        TestRun::new(&run(2), "e1").resource("s", declaration(soft)).open(&gw).await;
        gw.post_accepted(&run(2), "e1", "s", None, upserts(&[(2, "b"), (3, "b"), (2, "c")])).await;
        commit_paused(&gw, &run(2), "e1").await;
        let after_first = [(1, "a", false), (2, "c", false), (3, "b", false), (4, "a", false), (5, "a", false)];
        assert_eq!(
            snapshot_rows(&gw, table, soft).await,
            expected(&after_first),
            "{table}: a paused segment deletes nothing"
        );
        gw.open_new_execution(&run(2), "e2").await;
        gw.post_accepted(&run(2), "e2", "s", None, upserts(&[(6, "b")])).await;
        commit_paused(&gw, &run(2), "e2").await;
        gw.open_new_execution(&run(2), "e3").await;
        gw.post_accepted(&run(2), "e3", "s", None, upserts(&[(4, "b"), (7, "b")])).await;
        let committed = gw.commit_and_wait(&run(2), "e3").await;
        assert_eq!(committed["state"], "committed", "{committed}");
        let mut after_run_2 = vec![(2, "c", false), (3, "b", false), (4, "b", false), (6, "b", false), (7, "b", false)];
        if soft {
            after_run_2.extend([(1, "a", true), (5, "a", true)]);
        }
        assert_eq!(snapshot_rows(&gw, table, soft).await, expected(&after_run_2), "{table}: the snapshot of run 2");
        // Run 1's snapshot completed long ago: an unpaused execution opened on it again only
        // upserts, and leaves run 2's keys alone.
        gw.open_new_execution(&run(1), "e2").await;
        gw.post_accepted(&run(1), "e2", "s", None, upserts(&[(8, "later")])).await;
        let committed = gw.commit_and_wait(&run(1), "e2").await;
        assert_eq!(committed["state"], "committed", "{committed}");
        after_run_2.push((8, "later", false));
        assert_eq!(snapshot_rows(&gw, table, soft).await, expected(&after_run_2), "{table}: no second completion");

        // Run 3 finds the source empty: its completing execution has no rows of the resource.
        TestRun::new(&run(3), "e1").resource("s", declaration(soft)).open(&gw).await;
        let committed = gw.commit_and_wait(&run(3), "e1").await;
        assert_eq!(committed["state"], "committed", "{committed}");
        let remaining = snapshot_rows(&gw, table, soft).await;
        if soft {
            assert!(remaining.values().all(|(_, deleted)| *deleted) && remaining.len() == 8, "{remaining:?}");
        } else {
            assert!(remaining.is_empty(), "{table}: an empty snapshot empties the table: {remaining:?}");
        }
    }
    // A soft-deleted key comes back with the next snapshot that has it; the first deletion's
    // time stays on the keys still missing.
    let deleted_at = format!("SELECT id, UNIX_MICROS(_filament_deleted_at) FROM {}.snap_soft ORDER BY id", gw.dataset);
    let before = gw.query(&deleted_at).await;
    TestRun::new("snap_soft-4", "e1").resource("s", declaration(true)).open(&gw).await;
    gw.post_accepted("snap_soft-4", "e1", "s", None, upserts(&[(1, "back")])).await;
    let committed = gw.commit_and_wait("snap_soft-4", "e1").await;
    assert_eq!(committed["state"], "committed", "{committed}");
    let rows = snapshot_rows(&gw, "snap_soft", true).await;
    assert_eq!(rows[&1], ("back".to_string(), false));
    assert_eq!(rows.values().filter(|(_, deleted)| *deleted).count(), 7, "{rows:?}");
    let after = gw.query(&deleted_at).await;
    assert_eq!(before[1..], after[1..], "keys still missing keep their first deletion time");
}

/// One version of a history table: (id, v, lsn, valid_from, valid_to, is_current,
/// deleted), with the validity as lsn values (or, without `order_by`, `valid_to` present or
/// not, as 0 and 1, since the publication's time is not known in advance).
type Version = (i64, Option<String>, i64, i64, Option<i64>, bool, bool);

/// A history table as the issue states it, written without looking at the gateway's SQL.
struct HistoryModel {
    ordered: bool,
    cdc: bool,
    versions: Vec<Version>,
}

impl HistoryModel {
    /// One publication: per key, the changes in (lsn, seq, row) order (without the ones older
    /// than the current version, when ordered), those that differ from the state before them
    /// (a delete's state is "absent"; ordered, a change older than the key's latest moment is
    /// dropped) make the history: each upsert a version, ending where
    /// the next change starts; the first closes the current version.
    fn publish(&mut self, batches: &[(i64, Vec<Change>)]) {
        let mut by_key: BTreeMap<i64, Vec<(Rank, &Change)>> = BTreeMap::new();
        for (seq, changes) in batches {
            for (row, change) in changes.iter().filter(|c| self.cdc || c.op != "delete").enumerate() {
                let rank = (if self.ordered { change.lsn } else { 0 }, *seq, row);
                by_key.entry(change.id).or_default().push((rank, change));
            }
        }
        for (id, mut changes) in by_key {
            changes.sort_by_key(|(rank, _)| *rank);
            let current = self.versions.iter().position(|v| v.0 == id && v.5);
            // The key's latest moment: its current version's start, or where the delete that
            // closed its last version happened.
            let closed_at = self.versions.iter().filter(|v| v.0 == id).filter_map(|v| v.4).max();
            let latest = current.map(|i| self.versions[i].3).or(closed_at);
            let state_of = |c: &Change| (c.op != "delete").then(|| (c.v.clone(), c.lsn));
            let mut previous = current.map(|i| (self.versions[i].1.clone(), self.versions[i].2));
            let mut effective: Vec<&Change> = Vec::new();
            for (_, change) in changes {
                if self.ordered && latest.is_some_and(|at| change.lsn < at) {
                    continue;
                }
                let state = state_of(change);
                if state != previous {
                    effective.push(change);
                }
                previous = state;
            }
            let Some(first) = effective.first() else { continue };
            let from = |c: &Change| if self.ordered { c.lsn } else { 0 };
            let to = |c: &Change| if self.ordered { c.lsn } else { 1 };
            if let Some(i) = current {
                let closed = &mut self.versions[i];
                (closed.4, closed.5, closed.6) = (Some(to(first)), false, first.op == "delete");
            }
            for (i, change) in effective.iter().enumerate().filter(|(_, c)| c.op != "delete") {
                let next = effective.get(i + 1);
                self.versions.push((
                    id,
                    change.v.clone(),
                    change.lsn,
                    from(change),
                    next.map(|n| to(n)),
                    next.is_none(),
                    next.is_some_and(|n| n.op == "delete"),
                ));
            }
        }
    }

    async fn destination(&self, gw: &Gateway, table: &str) -> Vec<Version> {
        let validity = if self.ordered {
            "_filament_valid_from, _filament_valid_to"
        } else {
            "0, IF(_filament_valid_to IS NULL, NULL, 1)"
        };
        let sql = format!(
            "SELECT id, v, lsn, {validity}, _filament_is_current, _filament_deleted_at IS NOT NULL FROM {}.{table}",
            gw.dataset
        );
        let mut versions: Vec<Version> = gw
            .query(&sql)
            .await
            .iter()
            .map(|r| {
                let to = r[4].as_str().map(|_| int(&r[4]));
                let v = r[1].as_str().map(str::to_string);
                (int(&r[0]), v, int(&r[2]), int(&r[3]), to, r[5] == json!("true"), r[6] == json!("true"))
            })
            .collect();
        versions.sort();
        versions
    }

    fn sorted(&self) -> Vec<Version> {
        let mut versions = self.versions.clone();
        versions.sort();
        versions
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn history_keeps_every_version_as_an_independent_model_does() {
    let (seed, mut rng) = seeded_rng();
    let gw = Gateway::spawn().await;
    gw.create_run("r").await;
    let key = json!(["id"]);
    let resources = [
        ("history_cdc", json!({"write_mode": "history", "primary_key": key, "order_by": "lsn"}), true, true),
        ("history_rows", json!({"write_mode": "history", "primary_key": key, "order_by": ["lsn"]}), true, false),
        ("history_by_time", json!({"write_mode": "history", "primary_key": key}), false, true),
    ];
    let mut models = Vec::new();
    for (name, declaration, ordered, cdc) in &resources {
        gw.declare("r", name, declaration.clone()).await;
        models.push(HistoryModel { ordered: *ordered, cdc: *cdc, versions: Vec::new() });
    }
    let (mut clock, mut history) = (0i64, Vec::new());
    for execution in 0..8 {
        let execution_id = format!("e{execution}");
        gw.open_new_execution("r", &execution_id).await;
        let batches = generate_execution(&mut rng, &mut clock, &history);
        let sequenced: Vec<(i64, Vec<Change>)> =
            batches.iter().cloned().enumerate().map(|(i, b)| (i as i64, b)).collect();
        let targets: Vec<(&str, bool)> = resources.iter().map(|(name, _, _, cdc)| (*name, *cdc)).collect();
        post_in_reverse(&gw, "r", &execution_id, &sequenced, &targets).await;
        commit(&gw, &execution_id).await;
        for ((name, ..), model) in resources.iter().zip(&mut models) {
            model.publish(&sequenced);
            let actual = model.destination(&gw, name).await;
            assert_eq!(actual, model.sorted(), "seed {seed}, {name} after {execution_id}: {sequenced:?}");
        }
        history.extend(batches);
    }
    let versions = &models[0].versions;
    assert!(versions.iter().any(|v| v.6), "seed {seed}: a delete closed a version");
    let keys_with_several = versions.iter().filter(|v| !v.5).count();
    assert!(keys_with_several > 3, "seed {seed}: closed versions: {versions:?}");
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

/// A `delete_missing` destination as the issue states it: id -> (v, lsn, soft-deleted, the run
/// that last sent the key).
struct SnapshotModel {
    name: &'static str,
    ordered: bool,
    soft: bool,
    rows: BTreeMap<i64, (String, i64, bool, String)>,
}

impl SnapshotModel {
    /// One segment's upserts: each key's last change (by lsn when ordered, then seq and row)
    /// updates its row (and revives it) when at least as new, and always records the run.
    fn segment(&mut self, run: &str, batches: &[(i64, Vec<Change>)]) {
        let mut last: BTreeMap<i64, (Rank, &Change)> = BTreeMap::new();
        for (seq, changes) in batches {
            for (row, change) in changes.iter().enumerate() {
                let rank = (if self.ordered { change.lsn } else { 0 }, *seq, row);
                if last.get(&change.id).is_none_or(|(best, _)| rank > *best) {
                    last.insert(change.id, (rank, change));
                }
            }
        }
        for (id, (_, change)) in last {
            let v = change.v.clone().unwrap_or_default();
            match self.rows.get_mut(&id) {
                // Older than the row: the values stay, but the key is in the snapshot (alive).
                Some(row) if self.ordered && row.1 > change.lsn => (row.2, row.3) = (false, run.to_string()),
                _ => {
                    self.rows.insert(id, (v, change.lsn, false, run.to_string()));
                }
            }
        }
    }

    /// The snapshot completes: the keys another run sent last are deleted, or marked.
    fn complete(&mut self, run: &str) {
        if self.soft {
            self.rows.values_mut().filter(|row| row.3 != run).for_each(|row| row.2 = true);
        } else {
            self.rows.retain(|_, row| row.3 == run);
        }
    }

    fn declaration(&self) -> Value {
        let mut declaration = json!({"write_mode": "full_upsert", "primary_key": ["id"], "delete_missing": true});
        if self.ordered {
            declaration["order_by"] = json!("lsn");
        }
        if self.soft {
            declaration["deletes"] = json!("soft");
        }
        declaration
    }

    async fn destination(&self, gw: &Gateway) -> BTreeMap<i64, (String, i64, bool, String)> {
        let deleted = if self.soft { "_filament_deleted_at IS NOT NULL" } else { "FALSE" };
        let sql =
            format!("SELECT id, IFNULL(v, ''), lsn, {deleted}, _filament_run_id FROM {}.{}", gw.dataset, self.name);
        let text = |v: &Value| v.as_str().unwrap_or_default().to_string();
        gw.query(&sql)
            .await
            .iter()
            .map(|r| (int(&r[0]), (text(&r[1]), int(&r[2]), r[3] == json!("true"), text(&r[4]))))
            .collect()
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn delete_missing_snapshots_match_an_independent_model_across_runs_and_segments() {
    let (seed, mut rng) = seeded_rng();
    let gw = Gateway::spawn().await;
    let mut models: Vec<SnapshotModel> =
        [("hard", false, false), ("soft", false, true), ("hard_ordered", true, false), ("soft_ordered", true, true)]
            .into_iter()
            .map(|(name, ordered, soft)| SnapshotModel { name, ordered, soft, rows: BTreeMap::new() })
            .collect();
    let (mut clock, mut history) = (0i64, Vec::new());
    let mut deleted_seen = false;
    for run_number in 0..5 {
        let run = format!("snapshot-{run_number}");
        gw.create_run(&run).await;
        for model in &models {
            gw.declare(&run, model.name, model.declaration()).await;
        }
        let executions = rng.random_range(1..=3);
        for execution in 0..executions {
            let execution_id = format!("e{execution}");
            gw.open_new_execution(&run, &execution_id).await;
            // Upserts only (full_upsert takes no deletes); sometimes a segment with no rows.
            let batches: Vec<Vec<Change>> = if rng.random_ratio(1, 5) {
                Vec::new()
            } else {
                generate_execution(&mut rng, &mut clock, &history)
                    .into_iter()
                    .map(|b| b.into_iter().filter(|c| c.op != "delete").collect::<Vec<_>>())
                    .filter(|b| !b.is_empty())
                    .collect()
            };
            let sequenced: Vec<(i64, Vec<Change>)> =
                batches.iter().cloned().enumerate().map(|(i, b)| (i as i64, b)).collect();
            let targets: Vec<(&str, bool)> = models.iter().map(|m| (m.name, false)).collect();
            post_in_reverse(&gw, &run, &execution_id, &sequenced, &targets).await;
            let completes = execution + 1 == executions;
            if completes {
                commit_run(&gw, &run, &execution_id).await;
            } else {
                commit_paused(&gw, &run, &execution_id).await;
            }
            for model in &mut models {
                model.segment(&run, &sequenced);
                if completes {
                    let before = model.rows.clone();
                    model.complete(&run);
                    deleted_seen |= model.rows != before;
                }
                let context = format!("seed {seed}, {} after {run}/{execution_id}: {sequenced:?}", model.name);
                assert_eq!(model.destination(&gw).await, model.rows, "{context}");
            }
            history.extend(batches);
        }
    }
    assert!(deleted_seen, "seed {seed}: a completing snapshot deleted keys it had left out");
}

async fn commit_run(gw: &Gateway, run: &str, execution: &str) {
    let committed = gw.commit_and_wait(run, execution).await;
    assert_eq!(committed["state"], "committed", "{committed}");
}
