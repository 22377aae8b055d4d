//! `widen_columns` (issue 54): the widening is checked at set-up and done by the publication,
//! after the commit's barrier, with an `ALTER TABLE` job labelled with the run; an execution
//! aborted before it leaves the shared table's column types as they were, and declaring it
//! needs the `commit` action.

use std::sync::Arc;
use std::time::Duration;

use arrow_array::{ArrayRef, Decimal128Array, Int64Array};
use arrow_schema::{DataType, Field};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::support::arrow::{batch, ipc_stream};
use crate::support::principals::{PrincipalsFile, entry, new_token};
use crate::support::{Gateway, GatewayOptions, assert_problem, eventually, send};

/// Rows (`id`, `amount`) with `amount` an INT64 (`7`) or a NUMERIC(20, 2) (`12.50`).
fn amounts(id: i64, numeric: bool) -> Vec<u8> {
    let (amount_type, amount): (DataType, ArrayRef) = if numeric {
        let decimals = Decimal128Array::from(vec![1_250]).with_precision_and_scale(20, 2).unwrap();
        (DataType::Decimal128(20, 2), Arc::new(decimals))
    } else {
        (DataType::Int64, Arc::new(Int64Array::from(vec![7])))
    };
    let fields = vec![Field::new("id", DataType::Int64, false), Field::new("amount", amount_type, true)];
    ipc_stream(&[batch(fields, vec![Arc::new(Int64Array::from(vec![id])), amount])])
}

/// The type of column `column` of table `table` in the gateway's dataset, as `tables.get` on
/// the emulator answers.
async fn column_type(gw: &Gateway, table: &str, column: &str) -> String {
    let url = format!(
        "http://{}/bigquery/v2/projects/{}/datasets/{}/tables/{table}",
        gw.emulator_rest, gw.project, gw.dataset
    );
    let table: Value = reqwest::get(url).await.unwrap().json().await.unwrap();
    let fields = table["schema"]["fields"].as_array().unwrap_or_else(|| panic!("{table}"));
    let field = fields.iter().find(|f| f["name"] == column).unwrap_or_else(|| panic!("{table}"));
    field["type"].as_str().unwrap().to_string()
}

/// Run `r` with resources `narrow` and `wide` (declared `widen_columns`) into table `m`, whose
/// `amount` column execution `e1` created INT64.
async fn table_with_an_int64_amount(gw: &Gateway) {
    gw.create_run("r").await;
    gw.declare("r", "narrow", json!({"write_mode": "full_append", "table": "m"})).await;
    gw.declare("r", "wide", json!({"write_mode": "full_append", "table": "m", "widen_columns": true})).await;
    gw.open_new_execution("r", "e1").await;
    gw.post_accepted("r", "e1", "narrow", None, amounts(1, false)).await;
    assert_eq!(gw.commit_and_wait("r", "e1").await["state"], "committed");
    assert_eq!(column_type(gw, "m", "amount").await, "INT64");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_aborted_execution_with_widen_columns_leaves_the_column_type_unchanged() {
    let gw = Gateway::spawn().await;
    table_with_an_int64_amount(&gw).await;
    gw.open_new_execution("r", "e2").await;
    gw.post_accepted("r", "e2", "wide", None, amounts(2, true)).await;
    // Set-up ran (and checked the widening): the row is appended to the staging table.
    eventually(Duration::from_secs(30), "the row to be appended", || async {
        let (_, execution) = gw.json(Method::GET, "/v1/runs/r/executions/e2", None).await;
        (execution["resources"][0]["rows_acknowledged"] == 1).then_some(())
    })
    .await;
    let (status, aborted) = gw.json(Method::POST, "/v1/runs/r/executions/e2/abort", None).await;
    assert_eq!(status, StatusCode::OK, "{aborted}");
    assert_eq!(aborted["state"], "aborted", "{aborted}");
    // No `ALTER TABLE` was ever submitted (the emulator's catalog does not follow one anyway,
    // docs/testing.md), and the table says INT64.
    let proxy = gw.rest_conformance.as_ref().unwrap();
    assert!(proxy.queries().iter().all(|q| !q.contains("ALTER TABLE")), "{:?}", proxy.queries());
    assert_eq!(column_type(&gw, "m", "amount").await, "INT64", "the shared table is as it was");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_committed_execution_widens_the_column_with_a_job_labelled_with_the_run() {
    let gw = Gateway::spawn().await;
    table_with_an_int64_amount(&gw).await;
    gw.open_new_execution("r", "e2").await;
    gw.post_accepted("r", "e2", "wide", None, amounts(2, true)).await;
    assert_eq!(gw.commit_and_wait("r", "e2").await["state"], "committed");
    let rows = gw.query(&format!("SELECT CAST(amount AS STRING) FROM {}.m ORDER BY id", gw.dataset)).await;
    let amounts: Vec<f64> = rows.iter().map(|r| r[0].as_str().unwrap().parse().unwrap()).collect();
    assert_eq!(amounts, [7.0, 12.5], "widened, nothing rounded");
    let proxy = gw.rest_conformance.as_ref().unwrap();
    let inserts = proxy.requests("POST", "/jobs");
    let alter = inserts
        .iter()
        .find(|r| r.body["configuration"]["query"]["query"].as_str().is_some_and(|q| q.contains("ALTER TABLE")))
        .unwrap_or_else(|| panic!("the widening job: {inserts:?}"));
    let labels = &alter.body["configuration"]["labels"];
    assert_eq!(labels["filament_job"], "widening", "{labels}");
    assert_eq!(labels["filament_run"], "r", "{labels}");
    assert_eq!(labels["filament_execution"], "e2", "{labels}");
    assert_eq!(labels["filament_resource"], "wide", "{labels}");
    assert_eq!(labels["filament_principal"], "default", "{labels}");
}

#[tokio::test(flavor = "multi_thread")]
async fn declaring_widen_columns_needs_the_commit_action() {
    let (writer, committer) = (new_token(), new_token());
    let file = PrincipalsFile::new(&[
        entry("writer", &[&writer], "destinations = [\"filament-demo.*\"]\nactions = [\"write\", \"read\"]"),
        entry("committer", &[&committer], "destinations = [\"filament-demo.*\"]\nactions = [\"write\", \"commit\"]"),
    ]);
    let (name, path) = file.env();
    let gw = GatewayOptions::new().env(name, &path).spawn().await;
    let declaration = json!({"write_mode": "full_append", "widen_columns": true});
    for (token, run) in [(&writer, "w"), (&committer, "c")] {
        let body = json!({"run_id": run, "destination": {"project": "filament-demo", "dataset": gw.dataset}});
        let created = send(gw.unauthenticated(Method::POST, "/v1/runs").bearer_auth(token).json(&body)).await;
        assert_eq!(created.0, StatusCode::CREATED, "{}", created.1);
    }
    let declare = |token: &str, run: &str| {
        gw.unauthenticated(Method::PUT, &format!("/v1/runs/{run}/resources/t")).bearer_auth(token).json(&declaration)
    };
    let refused = assert_problem(send(declare(&writer, "w")).await, StatusCode::FORBIDDEN, "action_not_permitted");
    assert!(refused["detail"].as_str().unwrap().contains("widen_columns"), "{refused}");
    let (status, declared) = send(declare(&committer, "c")).await;
    assert_eq!(status, StatusCode::OK, "{declared}");
}
