//! `delete_missing` snapshots: keys a completing snapshot left out are deleted only when the
//! snapshot completes, across paused segments and runs, as an independent model says.

use std::collections::BTreeMap;

use rand::Rng as _;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use super::{Change, Rank, generate_execution, post_in_reverse, seeded_rng, upserts};
use crate::support::rows::int;
use crate::support::{Gateway, TestRun};

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

/// A `full_upsert` resource with `delete_missing`, its deletes soft or hard.
fn snapshot_declaration(soft: bool) -> Value {
    let mut body = json!({"table": "snap", "write_mode": "full_upsert", "primary_key": ["id"], "delete_missing": true});
    if soft {
        body["table"] = json!("snap_soft");
        body["deletes"] = json!("soft");
    }
    body
}

/// Run 1, one execution; run 2, two paused segments and a completing one; run 1 again; run 3,
/// empty: what each leaves in the destination.
async fn three_snapshot_runs(gw: &Gateway, soft: bool) {
    let table = if soft { "snap_soft" } else { "snap" };
    let run = |n: u32| format!("{table}-{n}");
    // Run 1: one unpaused execution is the whole snapshot.
    gw.create_run(&run(1)).await;
    let declared = gw.declare(&run(1), "s", snapshot_declaration(soft)).await;
    assert_eq!(
        (declared["delete_missing"].clone(), declared["metadata_columns"].clone()),
        (json!(true), json!(["run_id"]))
    );
    gw.open_new_execution(&run(1), "e1").await;
    gw.post_accepted(&run(1), "e1", "s", None, upserts(&[(1, "a"), (2, "a"), (3, "a"), (4, "a"), (5, "a")])).await;
    let committed = gw.commit_and_wait(&run(1), "e1").await;
    assert_eq!(committed["state"], "committed", "{committed}");
    let all_a: Vec<(i64, &str, bool)> = (1..=5).map(|id| (id, "a", false)).collect();
    assert_eq!(snapshot_rows(gw, table, soft).await, expected(&all_a));

    // Run 2 spans two paused segments and a completing one. Keys the run has not reached
    // yet survive the paused segments; the completing one removes 1 and 5.
    TestRun::new(&run(2), "e1").resource("s", snapshot_declaration(soft)).open(gw).await;
    gw.post_accepted(&run(2), "e1", "s", None, upserts(&[(2, "b"), (3, "b"), (2, "c")])).await;
    commit_paused(gw, &run(2), "e1").await;
    let after_first = [(1, "a", false), (2, "c", false), (3, "b", false), (4, "a", false), (5, "a", false)];
    assert_eq!(
        snapshot_rows(gw, table, soft).await,
        expected(&after_first),
        "{table}: a paused segment deletes nothing"
    );
    gw.open_new_execution(&run(2), "e2").await;
    gw.post_accepted(&run(2), "e2", "s", None, upserts(&[(6, "b")])).await;
    commit_paused(gw, &run(2), "e2").await;
    gw.open_new_execution(&run(2), "e3").await;
    gw.post_accepted(&run(2), "e3", "s", None, upserts(&[(4, "b"), (7, "b")])).await;
    let committed = gw.commit_and_wait(&run(2), "e3").await;
    assert_eq!(committed["state"], "committed", "{committed}");
    let mut after_run_2 = vec![(2, "c", false), (3, "b", false), (4, "b", false), (6, "b", false), (7, "b", false)];
    if soft {
        after_run_2.extend([(1, "a", true), (5, "a", true)]);
    }
    assert_eq!(snapshot_rows(gw, table, soft).await, expected(&after_run_2), "{table}: the snapshot of run 2");
    // Run 1's snapshot completed long ago: an unpaused execution opened on it again only
    // upserts, and leaves run 2's keys alone.
    gw.open_new_execution(&run(1), "e2").await;
    gw.post_accepted(&run(1), "e2", "s", None, upserts(&[(8, "later")])).await;
    let committed = gw.commit_and_wait(&run(1), "e2").await;
    assert_eq!(committed["state"], "committed", "{committed}");
    after_run_2.push((8, "later", false));
    assert_eq!(snapshot_rows(gw, table, soft).await, expected(&after_run_2), "{table}: no second completion");

    // Run 3 finds the source empty: its completing execution has no rows of the resource.
    TestRun::new(&run(3), "e1").resource("s", snapshot_declaration(soft)).open(gw).await;
    let committed = gw.commit_and_wait(&run(3), "e1").await;
    assert_eq!(committed["state"], "committed", "{committed}");
    let remaining = snapshot_rows(gw, table, soft).await;
    if soft {
        assert!(remaining.values().all(|(_, deleted)| *deleted) && remaining.len() == 8, "{remaining:?}");
    } else {
        assert!(remaining.is_empty(), "{table}: an empty snapshot empties the table: {remaining:?}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn delete_missing_deletes_only_when_the_snapshot_completes_across_paused_segments() {
    let gw = Gateway::spawn().await;
    for soft in [false, true] {
        three_snapshot_runs(&gw, soft).await;
    }
    // A soft-deleted key comes back with the next snapshot that has it; the first deletion's
    // time stays on the keys still missing.
    let deleted_at = format!("SELECT id, UNIX_MICROS(_filament_deleted_at) FROM {}.snap_soft ORDER BY id", gw.dataset);
    let before = gw.query(&deleted_at).await;
    TestRun::new("snap_soft-4", "e1").resource("s", snapshot_declaration(true)).open(&gw).await;
    gw.post_accepted("snap_soft-4", "e1", "s", None, upserts(&[(1, "back")])).await;
    let committed = gw.commit_and_wait("snap_soft-4", "e1").await;
    assert_eq!(committed["state"], "committed", "{committed}");
    let rows = snapshot_rows(&gw, "snap_soft", true).await;
    assert_eq!(rows[&1], ("back".to_string(), false));
    assert_eq!(rows.values().filter(|(_, deleted)| *deleted).count(), 7, "{rows:?}");
    let after = gw.query(&deleted_at).await;
    assert_eq!(before[1..], after[1..], "keys still missing keep their first deletion time");
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
