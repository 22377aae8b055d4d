//! Several gateway replicas on one Postgres. An open execution's uploads live in the replica
//! that serves it (its owner, holding a lease): the others forward its requests there, or,
//! when they cannot, refuse them loudly (503 `execution_owned_elsewhere`, nothing changed)
//! instead of losing rows; a replica stopped with SIGTERM hands its executions over; a starting
//! replica fails no execution of a live one; a crashed replica's executions fail once its lease
//! expires and are redelivered elsewhere. (`fleet.rs` runs the same behind a load balancer.)

use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde_json::json;

use crate::support::arrow::{gzip, ids, ipc_stream};
use crate::support::lease::outlive_current_leases;
use crate::support::rest_proxy::RestProxy;
use crate::support::rows::count_rows_and_ids;
use crate::support::{Gateway, GatewayOptions, TestRun, assert_problem, eventually, required_env, send};

const LEASE_SECS: &str = "2";

/// Another replica on `first`'s database (same tokens, as a fleet has), loading into the same
/// dataset.
async fn replica_of(first: &Gateway) -> Gateway {
    replica_with(first, GatewayOptions::new()).await
}

async fn replica_with(first: &Gateway, options: GatewayOptions) -> Gateway {
    let mut replica = options
        .database_url(&first.database_url)
        .env("FILAMENT_REPLICA_LEASE_SECS", LEASE_SECS)
        .env("FILAMENT_API_TOKENS", &first.token)
        .spawn()
        .await;
    replica.dataset = first.dataset.clone();
    replica.token = first.token.clone();
    replica
}

async fn first_replica() -> Gateway {
    GatewayOptions::new().env("FILAMENT_REPLICA_LEASE_SECS", LEASE_SECS).spawn().await
}

#[tokio::test(flavor = "multi_thread")]
async fn a_replica_forwards_an_executions_requests_to_its_owner() {
    let a = first_replica().await;
    let b = replica_of(&a).await;
    TestRun::new("r", "e").full_append(&["t"]).open(&a).await;
    // Batches (one gzip-compressed, forwarded as sent), a checkpoint and the commit all reach
    // `b`; `a`, whose memory holds the uploads, answers them.
    b.post_accepted("r", "e", "t", Some(0), ipc_stream(&[ids(0..10)])).await;
    let compressed = gzip(&ipc_stream(&[ids(10..30)]));
    let answer = send(
        b.request(Method::POST, "/v1/runs/r/executions/e/resources/t/batches?seq=1")
            .header("content-type", "application/vnd.apache.arrow.stream")
            .header("content-encoding", "gzip")
            .body(compressed),
    )
    .await;
    assert_eq!(answer.0, StatusCode::ACCEPTED, "{}", answer.1);
    let (status, _) = b.json(Method::POST, "/v1/runs/r/executions/e/checkpoints", Some(json!({"checkpoint": 7}))).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(b.commit_and_wait("r", "e").await["state"], "committed");
    assert_eq!(count_rows_and_ids(&a, "t").await, (30, 30));
    let metrics = b.metrics().await;
    assert!(metrics.contains("filament_requests_forwarded_total 4"), "{metrics}");
    let (_, run) = b.json(Method::GET, "/v1/runs/r", None).await;
    assert_eq!(run["durable_checkpoint"], 7, "{run}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_replica_that_cannot_reach_the_owner_refuses_and_changes_nothing() {
    // `a` advertises an address nobody listens on: `b` cannot forward to it.
    let a = GatewayOptions::new()
        .env("FILAMENT_REPLICA_LEASE_SECS", LEASE_SECS)
        .env("FILAMENT_ADVERTISE_URL", "http://127.0.0.1:9")
        .spawn()
        .await;
    let b = replica_of(&a).await;
    TestRun::new("r", "e").full_append(&["t"]).open(&a).await;
    let before = a.db_snapshot().await;
    let refused = b.post_batch("r", "e", "t", Some(0), ipc_stream(&[ids(0..10)])).await;
    let problem = assert_problem(refused, StatusCode::SERVICE_UNAVAILABLE, "execution_owned_elsewhere");
    let detail = problem["detail"].as_str().unwrap();
    assert!(detail.contains("could not be reached"), "{problem}");
    assert!(
        !detail.contains("127.0.0.1:9") && !detail.contains("onnect"),
        "no internal URL or transport error: {problem}"
    );
    for action in ["checkpoints", "pause", "commit", "abort"] {
        let body = (action == "checkpoints").then(|| json!({"checkpoint": 1}));
        let answer = b.json(Method::POST, &format!("/v1/runs/r/executions/e/{action}"), body).await;
        assert_problem(answer, StatusCode::SERVICE_UNAVAILABLE, "execution_owned_elsewhere");
    }
    let redelivery = b.open_execution("r", "e").await;
    assert_problem(redelivery, StatusCode::SERVICE_UNAVAILABLE, "execution_owned_elsewhere");
    assert_eq!(a.db_snapshot().await, before, "a refused request changes nothing");

    a.post_accepted("r", "e", "t", Some(0), ipc_stream(&[ids(0..10)])).await;
    assert_eq!(a.commit_and_wait("r", "e").await["state"], "committed");
    assert_eq!(count_rows_and_ids(&a, "t").await, (10, 10));
    // Once committed, any replica reports it.
    let (status, committed) = b.json(Method::POST, "/v1/runs/r/executions/e/commit?wait=true", None).await;
    assert_eq!((status, committed["state"].as_str()), (StatusCode::OK, Some("committed")), "{committed}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_replica_stopped_with_sigterm_hands_its_execution_over() {
    let mut a = first_replica().await;
    let b = replica_of(&a).await;
    TestRun::new("r", "e").full_append(&["t1", "t2"]).open(&a).await;
    a.post_accepted("r", "e", "t1", Some(0), ipc_stream(&[ids(0..40)])).await;
    a.post_accepted("r", "e", "t2", Some(0), ipc_stream(&[ids(0..25)])).await;
    assert!(a.terminate().await.success());
    assert!(a.execution_handed_over("r", "e").await, "the stopped replica handed its execution over");
    let handed_over = streams_of(&b, "e").await;
    assert_eq!(handed_over.iter().map(|s| s.2).collect::<Vec<_>>(), vec![40, 25], "offsets recorded: {handed_over:?}");
    let (_, seen) = b.json(Method::GET, "/v1/runs/r/executions/e", None).await;
    assert_eq!(seen["state"], "extracting", "a clean stop fails nothing: {seen}");
    // `b` adopts it: t1 goes on in the same stream at its offset, t2 gets no more batches and
    // is committed from what `a` recorded.
    b.post_accepted("r", "e", "t1", Some(1), ipc_stream(&[ids(40..60)])).await;
    assert_eq!(b.commit_and_wait("r", "e").await["state"], "committed");
    assert_eq!(count_rows_and_ids(&b, "t1").await, (60, 60));
    assert_eq!(count_rows_and_ids(&b, "t2").await, (25, 25));
    let committed = streams_of(&b, "e").await;
    let names = |streams: &[(String, String, i64)]| streams.iter().map(|s| s.1.clone()).collect::<Vec<_>>();
    assert_eq!(names(&committed), names(&handed_over), "the same streams went on, no new one");
    assert_eq!(committed.iter().map(|s| s.2).collect::<Vec<_>>(), vec![60, 25]);
    // The timeline, from Postgres, tells the hand-over between the two replicas' events.
    let (_, timeline) = b.json(Method::GET, "/v1/runs/r/executions/e/events", None).await;
    let kinds: Vec<&str> = timeline["events"].as_array().unwrap().iter().map(|e| e["kind"].as_str().unwrap()).collect();
    let at = |kind: &str| kinds.iter().position(|k| *k == kind).unwrap_or_else(|| panic!("{kind} in {kinds:?}"));
    assert!(at("delivery_started") < at("handed_over") && at("handed_over") < at("commit_started"), "{kinds:?}");
    assert_eq!(kinds.last(), Some(&"ended"), "{kinds:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn two_replicas_receiving_the_same_commit_publish_once() {
    let proxy = RestProxy::start(&required_env("BIGQUERY_EMULATOR_HOST")).await;
    let a = GatewayOptions::new().rest_proxy(&proxy).env("FILAMENT_REPLICA_LEASE_SECS", LEASE_SECS).spawn().await;
    let b = replica_with(&a, GatewayOptions::new().rest_proxy(&proxy)).await;
    TestRun::new("r", "e").full_append(&["t"]).open(&a).await;
    a.post_accepted("r", "e", "t", Some(0), ipc_stream(&[ids(0..50)])).await;
    let path = "/v1/runs/r/executions/e/commit?wait=true";
    let (on_a, on_b) = tokio::join!(a.json(Method::POST, path, None), b.json(Method::POST, path, None));
    for (status, body) in [on_a, on_b] {
        assert!(status.is_success(), "{status} {body}");
    }
    let committed = a.commit_and_wait("r", "e").await;
    assert_eq!(committed["state"], "committed");
    let publications: Vec<String> = proxy.queries().into_iter().filter(|q| q.contains("INSERT")).collect();
    assert_eq!(publications.len(), 1, "one publication job: {publications:?}");
    assert_eq!(count_rows_and_ids(&a, "t").await, (50, 50));
}

/// Each resource's stream name and acknowledged rows in the execution's current delivery.
async fn streams_of(gw: &Gateway, execution: &str) -> Vec<(String, String, i64)> {
    use sqlx::Connection as _;
    let mut db = sqlx::PgConnection::connect(&gw.database_url).await.unwrap();
    sqlx::query_as(
        "SELECT s.resource, s.stream_name, s.rows_acknowledged FROM staging_streams s JOIN executions e
           ON e.run_id = s.run_id AND e.execution_id = s.execution_id AND e.delivery = s.delivery
         WHERE s.execution_id = $1 AND s.stream_name IS NOT NULL ORDER BY s.resource",
    )
    .bind(execution)
    .fetch_all(&mut db)
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_starting_replica_fails_no_execution_of_a_live_one() {
    let a = first_replica().await;
    TestRun::new("r", "e").full_append(&["t"]).open(&a).await;
    a.post_accepted("r", "e", "t", Some(0), ipc_stream(&[ids(0..50)])).await;
    let c = replica_of(&a).await;
    // `c` sweeps after the lease the execution held when `c` started has run out: the live
    // owner renewed it, so no sweep fails the execution.
    outlive_current_leases(&a.database_url, Duration::from_secs(LEASE_SECS.parse().unwrap())).await;
    let (_, seen) = c.json(Method::GET, "/v1/runs/r/executions/e", None).await;
    assert_eq!(seen["state"], "extracting", "{seen}");
    assert_eq!(a.commit_and_wait("r", "e").await["state"], "committed");
    assert_eq!(count_rows_and_ids(&a, "t").await, (50, 50));
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
    assert_eq!(count_rows_and_ids(&b, "t").await, (100, 100), "every row once");
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

    // A late redelivery of the committed execution with the same content reuses its publication.
    let (status, _) = a.open_execution("r", "e1").await;
    assert_eq!(status, StatusCode::OK);
    for (seq, body) in bodies.iter().enumerate() {
        a.post_accepted("r", "e1", "t", Some(seq as i64), body.clone()).await;
    }
    assert_eq!(a.commit_and_wait("r", "e1").await["state"], "committed");
    let reused = a.metric("filament_publications_total{outcome=\"reused\"}").await;
    assert_eq!(reused, Some(1.0), "the redelivery was recognised and its publication reused");
    assert_eq!(count_rows_and_ids(&a, "t").await, (20, 20), "published once");
}

/// A transition of an execution that already ended registers nothing on the replica that
/// answers it: when the execution is delivered again through another replica, this one
/// forwards its requests there (an entry left behind would make it answer them itself, with
/// 503 `execution_owned_elsewhere`).
#[tokio::test(flavor = "multi_thread")]
async fn transitions_of_an_ended_execution_leave_no_uploads_behind() {
    let a = first_replica().await;
    let b = replica_of(&a).await;
    TestRun::new("r", "e").full_append(&["t"]).open(&a).await;
    a.post_accepted("r", "e", "t", None, ipc_stream(&[ids(0..10)])).await;
    assert_eq!(a.commit_and_wait("r", "e").await["state"], "committed");
    let late = [("commit", StatusCode::OK), ("pause", StatusCode::CONFLICT), ("abort", StatusCode::CONFLICT)];
    for (action, expected) in late {
        let (status, body) = a.json(Method::POST, &format!("/v1/runs/r/executions/e/{action}"), None).await;
        assert_eq!(status, expected, "{action}: {body}");
    }
    // Delivered again through `b`, which serves it now: `a` forwards its batches there (the
    // same content: the redelivery reuses the publication).
    assert_eq!(b.open_execution("r", "e").await.0, StatusCode::OK);
    a.post_accepted("r", "e", "t", None, ipc_stream(&[ids(0..10)])).await;
    assert_eq!(a.commit_and_wait("r", "e").await["state"], "committed");
    assert_eq!(count_rows_and_ids(&a, "t").await, (10, 10));
    assert!(a.metrics().await.contains("filament_requests_forwarded_total 2"), "the batch and the commit");
}

/// Declares resource `t` of run `r` as `full_append` written straight into its table.
fn direct_append_run() -> TestRun {
    TestRun::new("r", "e").resource("t", json!({"write_mode": "full_append", "direct_append": true}))
}

/// Waits until BigQuery acknowledged `rows` rows of resource `t` (appended, not committed).
async fn acknowledged(gw: &Gateway, rows: i64) {
    eventually(Duration::from_secs(30), "the rows to be acknowledged", || async {
        let (_, seen) = gw.json(Method::GET, "/v1/runs/r/executions/e", None).await;
        (seen["resources"][0]["rows_acknowledged"].as_i64() == Some(rows)).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_direct_append_of_a_crashed_replica_lands_once_after_its_redelivery() {
    let mut a = first_replica().await;
    let b = replica_of(&a).await;
    direct_append_run().open(&a).await;
    a.post_accepted("r", "e", "t", Some(0), ipc_stream(&[ids(0..100)])).await;
    // The rows are in the destination's PENDING stream, never committed, when the replica dies.
    acknowledged(&a, 100).await;
    a.kill();
    eventually(Duration::from_secs(15), "the crashed replica's execution to fail", || async {
        let (_, seen) = b.json(Method::GET, "/v1/runs/r/executions/e", None).await;
        (seen["state"] == "failed").then_some(())
    })
    .await;
    let (status, redelivered) = b.open_execution("r", "e").await;
    assert_eq!(status, StatusCode::OK, "{redelivered}");
    b.post_accepted("r", "e", "t", Some(0), ipc_stream(&[ids(0..100)])).await;
    let committed = b.commit_and_wait("r", "e").await;
    assert_eq!(committed["state"], "committed", "{committed}");
    assert_eq!(committed["resources"][0]["publication"]["job_id"], "BatchCommitWriteStreams", "{committed}");
    assert_eq!(count_rows_and_ids(&b, "t").await, (100, 100), "every row once: the lost stream was never committed");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_direct_append_handed_over_at_sigterm_goes_on_in_the_same_stream() {
    let mut a = first_replica().await;
    let b = replica_of(&a).await;
    direct_append_run().open(&a).await;
    a.post_accepted("r", "e", "t", Some(0), ipc_stream(&[ids(0..40)])).await;
    assert!(a.terminate().await.success());
    let handed_over = streams_of(&b, "e").await;
    b.post_accepted("r", "e", "t", Some(1), ipc_stream(&[ids(40..60)])).await;
    let committed = b.commit_and_wait("r", "e").await;
    assert_eq!(committed["state"], "committed", "{committed}");
    let publication = &committed["resources"][0]["publication"];
    assert_eq!(publication["committed_streams"][0].as_str(), Some(handed_over[0].1.as_str()), "{publication}");
    assert_eq!(count_rows_and_ids(&b, "t").await, (60, 60));
}

/// A held (`staged`) execution lives in Postgres and BigQuery only: killing the replica that
/// staged it fails nothing, and another replica publishes one and aborts another.
#[tokio::test(flavor = "multi_thread")]
async fn a_held_execution_outlives_its_replica_and_another_publishes_or_aborts_it() {
    let mut a = first_replica().await;
    let b = replica_of(&a).await;
    TestRun::new("r", "kept").full_append(&["t"]).open(&a).await;
    a.post_accepted("r", "kept", "t", Some(0), ipc_stream(&[ids(0..40)])).await;
    a.open_new_execution("r", "dropped").await;
    a.post_accepted("r", "dropped", "t", Some(0), ipc_stream(&[ids(100..110)])).await;
    for execution in ["kept", "dropped"] {
        crate::publish::held::hold(&a, "r", execution).await;
    }
    a.kill();
    outlive_current_leases(&a.database_url, Duration::from_secs(LEASE_SECS.parse().unwrap())).await;
    for execution in ["kept", "dropped"] {
        let (_, seen) = b.json(Method::GET, &format!("/v1/runs/r/executions/{execution}"), None).await;
        assert_eq!(seen["state"], "staged", "{seen}");
    }
    let (status, aborted) = b.json(Method::POST, "/v1/runs/r/executions/dropped/abort", None).await;
    assert_eq!((status, aborted["state"].as_str()), (StatusCode::OK, Some("aborted")), "{aborted}");
    let committed = b.commit_and_wait("r", "kept").await;
    assert_eq!(committed["state"], "committed", "{committed}");
    assert_eq!(count_rows_and_ids(&b, "t").await, (40, 40), "the kept rows once, none of the aborted");
}
