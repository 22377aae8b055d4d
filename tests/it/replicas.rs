//! Several gateway replicas on one Postgres. An open execution's uploads live in the replica
//! that serves it (its owner, holding a lease): the others refuse its batches and transitions
//! loudly (503 `execution_owned_elsewhere`, nothing changed) instead of losing rows; a starting
//! replica fails no execution of a live one; a crashed replica's executions fail once its lease
//! expires and are redelivered elsewhere.

use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde_json::json;

use crate::support::arrow::{ids, ipc_stream};
use crate::support::{Gateway, GatewayOptions, TestRun, assert_problem, eventually};

const LEASE_SECS: &str = "2";

/// Another replica on `first`'s database, loading into the same dataset.
async fn replica_of(first: &Gateway) -> Gateway {
    let mut replica = GatewayOptions::new()
        .database_url(&first.database_url)
        .env("FILAMENT_REPLICA_LEASE_SECS", LEASE_SECS)
        .spawn()
        .await;
    replica.dataset = first.dataset.clone();
    replica
}

async fn first_replica() -> Gateway {
    GatewayOptions::new().env("FILAMENT_REPLICA_LEASE_SECS", LEASE_SECS).spawn().await
}

async fn count(gw: &Gateway, table: &str) -> Vec<serde_json::Value> {
    gw.query(&format!("SELECT COUNT(*), COUNT(DISTINCT id) FROM {}.{table}", gw.dataset)).await[0].clone()
}

#[tokio::test(flavor = "multi_thread")]
async fn only_the_replica_serving_an_execution_changes_it() {
    let a = first_replica().await;
    let b = replica_of(&a).await;
    TestRun::new("r", "e").full_append(&["t"]).open(&a).await;
    let before = a.db_snapshot().await;
    let refused = b.post_batch("r", "e", "t", Some(0), ipc_stream(&[ids(0..10)])).await;
    let problem = assert_problem(refused, StatusCode::SERVICE_UNAVAILABLE, "execution_owned_elsewhere");
    assert!(problem["hint"].as_str().unwrap().contains("affinity"), "{problem}");
    for action in ["checkpoints", "pause", "commit", "abort"] {
        let body = (action == "checkpoints").then(|| json!({"checkpoint": 1}));
        let answer = b.json(Method::POST, &format!("/v1/runs/r/executions/e/{action}"), body).await;
        assert_problem(answer, StatusCode::SERVICE_UNAVAILABLE, "execution_owned_elsewhere");
    }
    let redelivery = b.open_execution("r", "e").await;
    assert_problem(redelivery, StatusCode::SERVICE_UNAVAILABLE, "execution_owned_elsewhere");
    assert_eq!(a.db_snapshot().await, before, "a refused request changes nothing");
    let (status, seen) = b.json(Method::GET, "/v1/runs/r/executions/e", None).await;
    assert_eq!((status, seen["state"].as_str()), (StatusCode::OK, Some("extracting")), "any replica reads it");

    a.post_accepted("r", "e", "t", Some(0), ipc_stream(&[ids(0..10)])).await;
    assert_eq!(a.commit_and_wait("r", "e").await["state"], "committed");
    assert_eq!(count(&a, "t").await, vec![json!("10"), json!("10")]);
    let (status, committed) = b.json(Method::POST, "/v1/runs/r/executions/e/commit?wait=true", None).await;
    assert_eq!((status, committed["state"].as_str()), (StatusCode::OK, Some("committed")), "{committed}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_starting_replica_fails_no_execution_of_a_live_one() {
    let a = first_replica().await;
    TestRun::new("r", "e").full_append(&["t"]).open(&a).await;
    a.post_accepted("r", "e", "t", Some(0), ipc_stream(&[ids(0..50)])).await;
    let c = replica_of(&a).await;
    // Longer than the lease: the live owner renews it, so no sweep fails the execution.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (_, seen) = c.json(Method::GET, "/v1/runs/r/executions/e", None).await;
    assert_eq!(seen["state"], "extracting", "{seen}");
    assert_eq!(a.commit_and_wait("r", "e").await["state"], "committed");
    assert_eq!(count(&a, "t").await, vec![json!("50"), json!("50")]);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_crashed_replicas_execution_fails_after_its_lease_and_is_redelivered_elsewhere() {
    let mut a = first_replica().await;
    let b = replica_of(&a).await;
    TestRun::new("r", "e").full_append(&["t"]).open(&a).await;
    TestRun::new("r2", "other").full_append(&["u"]).open(&b).await;
    a.post_accepted("r", "e", "t", Some(0), ipc_stream(&[ids(0..100)])).await;
    b.post_accepted("r2", "other", "u", Some(0), ipc_stream(&[ids(0..20)])).await;
    a.kill();
    let failed = eventually(Duration::from_secs(15), "the crashed replica's execution to fail", || async {
        let (_, seen) = b.json(Method::GET, "/v1/runs/r/executions/e", None).await;
        (seen["state"] == "failed").then_some(seen)
    })
    .await;
    assert_eq!(failed["error"]["code"], "gateway_restarted", "{failed}");
    let (status, redelivered) = b.open_execution("r", "e").await;
    assert_eq!((status, redelivered["delivery"].as_i64()), (StatusCode::OK, Some(2)), "{redelivered}");
    b.post_accepted("r", "e", "t", Some(0), ipc_stream(&[ids(0..100)])).await;
    assert_eq!(b.commit_and_wait("r", "e").await["state"], "committed");
    assert_eq!(count(&b, "t").await, vec![json!("100"), json!("100")], "every row once");
    assert_eq!(b.commit_and_wait("r2", "other").await["state"], "committed", "the live replica's work went on");
}

async fn receipts_of(gw: &Gateway, execution: &str) -> i64 {
    use sqlx::Connection as _;
    let mut db = sqlx::PgConnection::connect(&gw.database_url).await.unwrap();
    sqlx::query_scalar("SELECT COUNT(*) FROM batches WHERE execution_id = $1")
        .bind(execution)
        .fetch_one(&mut db)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn ended_deliveries_lose_their_receipts_and_a_late_redelivery_is_still_recognised() {
    let a = first_replica().await;
    TestRun::new("r", "e1").full_append(&["t"]).open(&a).await;
    let bodies = [ipc_stream(&[ids(0..10)]), ipc_stream(&[ids(10..20)])];
    for (seq, body) in bodies.iter().enumerate() {
        a.post_accepted("r", "e1", "t", Some(seq as i64), body.clone()).await;
    }
    assert_eq!(a.commit_and_wait("r", "e1").await["state"], "committed");
    a.open_new_execution("r", "e2").await;
    a.post_accepted("r", "e2", "t", Some(0), ipc_stream(&[ids(20..25)])).await;

    // A replica with a retention of 0 days prunes at start: the ended delivery's receipts go,
    // the open execution's stay.
    let mut pruner = GatewayOptions::new()
        .database_url(&a.database_url)
        .env("FILAMENT_RETENTION_DAYS", "0")
        .env("FILAMENT_REPLICA_LEASE_SECS", LEASE_SECS)
        .spawn()
        .await;
    pruner.dataset = a.dataset.clone();
    eventually(Duration::from_secs(15), "the ended delivery's receipts to be pruned", || async {
        (receipts_of(&a, "e1").await == 0).then_some(())
    })
    .await;
    assert_eq!(receipts_of(&a, "e2").await, 1, "an open execution keeps its receipts");
    assert!(pruner.logs().contains("store.pruned"));

    // A late redelivery of the committed execution with the same content reuses its publication.
    let (status, _) = a.open_execution("r", "e1").await;
    assert_eq!(status, StatusCode::OK);
    for (seq, body) in bodies.iter().enumerate() {
        a.post_accepted("r", "e1", "t", Some(seq as i64), body.clone()).await;
    }
    assert_eq!(a.commit_and_wait("r", "e1").await["state"], "committed");
    assert!(a.logs().contains("reusing its publication"), "the redelivery was recognised");
    assert_eq!(count(&a, "t").await, vec![json!("20"), json!("20")], "published once");
}
