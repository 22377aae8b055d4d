//! The fairness benchmark of issue 23 (`cargo bench --bench fairness`, run by `make bench`):
//! principal `flood` keeps 32 batches of 8 MiB in flight against the gateway's 64 MiB upload
//! budget with a 16 MiB share of its own, BigQuery being the suite's Storage Write fake in
//! null-sink mode (acknowledging at once); principal `steady` posts one small batch a second.
//! Reports `steady`'s acceptance latency (p50, p99, max) and what `flood` was answered; asserts
//! only that `steady` was never refused (the correctness part is
//! `principals::a_principal_over_its_share_is_refused_while_another_is_served`).
//!
//! Without `--bench` (`cargo test --all-targets`) a 3-second smoke run, nothing reported.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout, missing_docs)]

extern crate filament_bigquery as _;

#[path = "../tests/it/support/mod.rs"]
mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use support::arrow::{ids, ipc_stream};
use support::fake_write::FakeWrite;
use support::principals::{PrincipalsFile, entry, new_token};
use support::{Gateway, GatewayOptions, send};
use tokio::time::Instant;

const FLOOD_CONCURRENCY: usize = 32;
const FLOOD_BATCH_ROWS: i64 = 1 << 20; // 8 MiB of int64 ids
const BUDGET_BYTES: u64 = 64 << 20;
const FLOOD_SHARE_BYTES: u64 = 16 << 20;

async fn as_principal(gw: &Gateway, token: &str, method: Method, path: &str, body: Value) -> StatusCode {
    send(gw.unauthenticated(method, path).bearer_auth(token).json(&body)).await.0
}

async fn post(gw: &Gateway, token: &str, run: &str, body: Vec<u8>) -> (StatusCode, Value) {
    let path = format!("/v1/runs/{run}/executions/e/resources/{run}/batches");
    let request = gw
        .unauthenticated(Method::POST, &path)
        .bearer_auth(token)
        .header("content-type", "application/vnd.apache.arrow.stream")
        .body(body);
    send(request).await
}

/// What `flood` was answered, by kind.
#[derive(Default)]
struct FloodAnswers {
    accepted: AtomicUsize,
    principal_limit: AtomicUsize,
    other: AtomicUsize,
}

async fn flood(gw: Arc<Gateway>, token: String, until: Instant, answers: Arc<FloodAnswers>) {
    let body = ipc_stream(&[ids(0..FLOOD_BATCH_ROWS)]);
    while Instant::now() < until {
        let (status, answer) = post(&gw, &token, "flood", body.clone()).await;
        let counter = match status {
            StatusCode::ACCEPTED => &answers.accepted,
            StatusCode::TOO_MANY_REQUESTS if answer["code"] == "principal_limit" => {
                answers.principal_limit.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
            _ => {
                if answers.other.fetch_add(1, Ordering::Relaxed) == 0 {
                    println!("flood's first other answer: {status} {answer}");
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

/// `flood`'s entry: its 16 MiB share (`FILAMENT_BENCH_NO_SHARE=1`: none, for comparison).
fn flood_scope() -> String {
    let destinations = "destinations = [\"filament-demo.*\"]";
    if std::env::var_os("FILAMENT_BENCH_NO_SHARE").is_some() {
        destinations.to_string()
    } else {
        format!("{destinations}\nmax_buffered_bytes = {FLOOD_SHARE_BYTES}")
    }
}

fn percentile(sorted_ms: &[f64], fraction: f64) -> f64 {
    let rank = ((sorted_ms.len() as f64 * fraction).ceil() as usize).clamp(1, sorted_ms.len());
    sorted_ms[rank - 1]
}

async fn run(duration: Duration) -> (Vec<f64>, Arc<FloodAnswers>) {
    let (flood_token, steady_token) = (new_token(), new_token());
    let file = PrincipalsFile::new(&[
        entry("flood", &[&flood_token], &flood_scope()),
        entry("steady", &[&steady_token], "destinations = [\"filament-demo.*\"]"),
    ]);
    let fake = FakeWrite::start().await;
    fake.with(|s| s.null_sink = true);
    let (name, path) = file.env();
    let gw = GatewayOptions::new()
        .fake_write(&fake)
        .env(name, &path)
        .env("FILAMENT_MAX_BUFFERED_BYTES", &BUDGET_BYTES.to_string())
        .env("RUST_LOG", "warn")
        .spawn()
        .await;
    let gw = Arc::new(gw);
    for (token, run) in [(&flood_token, "flood"), (&steady_token, "steady")] {
        let run_body = json!({"run_id": run, "destination": {"project": "filament-demo", "dataset": gw.dataset}});
        assert_eq!(as_principal(&gw, token, Method::POST, "/v1/runs", run_body).await, StatusCode::CREATED);
        let resource = format!("/v1/runs/{run}/resources/{run}");
        assert_eq!(
            as_principal(&gw, token, Method::PUT, &resource, json!({"write_mode": "full_append"})).await,
            StatusCode::OK
        );
        let open = format!("/v1/runs/{run}/executions");
        assert_eq!(
            as_principal(&gw, token, Method::POST, &open, json!({"execution_id": "e"})).await,
            StatusCode::CREATED
        );
    }
    let until = Instant::now() + duration;
    let answers = Arc::new(FloodAnswers::default());
    let flooders: Vec<_> = (0..FLOOD_CONCURRENCY)
        .map(|_| tokio::spawn(flood(Arc::clone(&gw), flood_token.clone(), until, Arc::clone(&answers))))
        .collect();
    let mut latencies_ms = Vec::new();
    let mut next = 0i64;
    while Instant::now() < until {
        let started = Instant::now();
        let (status, answer) =
            post(&gw, &steady_token, "steady", ipc_stream(&[ids(next * 100..(next + 1) * 100)])).await;
        assert_eq!(status, StatusCode::ACCEPTED, "steady's batch {next} was refused: {answer}");
        latencies_ms.push(started.elapsed().as_secs_f64() * 1000.0);
        next += 1;
        tokio::time::sleep(Duration::from_secs(1).saturating_sub(started.elapsed())).await;
    }
    for flooder in flooders {
        flooder.await.unwrap();
    }
    latencies_ms.sort_by(f64::total_cmp);
    (latencies_ms, answers)
}

fn main() {
    let measuring = std::env::args().any(|arg| arg == "--bench");
    let duration = Duration::from_secs(if measuring { 60 } else { 3 });
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    let (latencies_ms, answers) = runtime.block_on(run(duration));
    if !measuring {
        println!("fairness smoke (not a measurement): steady posted {} batches, none refused", latencies_ms.len());
        return;
    }
    println!(
        "fairness: steady {} batches, none refused; acceptance p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms; \
         flood accepted {} batches of 8 MiB, refused {} with principal_limit, {} otherwise",
        latencies_ms.len(),
        percentile(&latencies_ms, 0.5),
        percentile(&latencies_ms, 0.99),
        latencies_ms.last().copied().unwrap_or_default(),
        answers.accepted.load(Ordering::Relaxed),
        answers.principal_limit.load(Ordering::Relaxed),
        answers.other.load(Ordering::Relaxed),
    );
}
