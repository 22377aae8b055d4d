//! MERGE and history publications against independent models: ordered, soft and arrival
//! merges and history versions after every commit of generated executions, and `order_by`
//! checked against every batch.

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow_array::{Int64Array, StringArray};
use arrow_schema::{DataType, Field};

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use super::{ALL_METADATA, Change, Rank, commit, generate_execution, post_in_reverse, rows, seeded_rng};
use crate::support::arrow::{batch, ipc_stream};
use crate::support::rows::int;
use crate::support::{Gateway, assert_problem};

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
