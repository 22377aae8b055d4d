//! The many-tables benchmark (`make bench`, after `ingest`): runs of N resources of about 1 MiB
//! each (N = 100, 1,000 and 10,000, or the list in `FILAMENT_BENCH_MANY_TABLES`), from the first
//! batch to `committed`, against the simulated BigQuery control plane under Google's published
//! quotas (`tests/it/support/control_plane/`: latencies, the REST quotas, the stream quota,
//! query jobs) and the null Storage Write sink.
//!
//! A point beyond 1,000 resources runs on a clock [`LARGE_POINT_TIME_SCALE`] times faster
//! (`FILAMENT_BENCH_TIME_SCALE` sets it; 1 runs it in real time): 10,000 new tables take at
//! least 2,000 s of `tables.insert` under the real quotas, more than `make bench`'s hour
//! allows beside the other points. Every quota's rate and every latency of the simulation, the
//! gateway's quota settings and the run's flush interval are scaled
//! ([`Limits::on_faster_clock`]), the time is reported in simulated seconds (wall seconds times
//! the scale) beside the real floor, and what is not simulated (the gateway's CPU, Postgres)
//! weighs the scale times more: the ratio is an upper bound.
//!
//! Each N runs on one replica and on three sharing one database (each with its own run of N/3
//! resources, at once), under both readings of the stream quota (hourly, per minute), on the
//! staging path and with `direct_append` (the stream written into the destination and
//! committed there: no staging table, no query job). For each: the floor the quotas allow
//! ([`Limits::floor`]), the measured time and their ratio, calls per resource (REST, gRPC,
//! Postgres transactions), the highest use of any quota (at most 1.0 when the fleet paced
//! within them) and the refusals, peak RSS and CPU per resource (summed over the replicas),
//! and whether every row reached the sink exactly once. Every point runs under the "many
//! tables" profile of docs/operations.md (64 set-ups, 100 publications at once); the previous
//! main, when `scripts/bench.sh` built it, runs the 100-resource point on one replica.
//!
//! Adds `many_tables` to `build/bench/result.json` and its table to `docs/performance.md`.
//! Reports, never asserts timings; rows are asserted exactly.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout, missing_docs)]

extern crate filament_bigquery as _;

#[path = "common/measure.rs"]
mod measure;
#[path = "../tests/it/support/mod.rs"]
mod support;

use std::time::Duration;

use futures::StreamExt as _;
use measure::{
    GIB, Gzip, gateway_gzip_level, gateway_settings, gzip_alone, peak_rss_mib, previous_main, process_cpu_seconds,
    sha256_alone,
};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use support::control_plane::SimulatedRest;
use support::control_plane::limits::{Floor, Limits, StreamQuota};
use support::fake_write::FakeWrite;
use support::{Gateway, GatewayOptions};
use tokio::time::Instant;

/// How much faster than real time a point beyond 1,000 resources runs by default.
const LARGE_POINT_TIME_SCALE: f64 = 8.0;

/// Rows per resource: with the `ids` column and a padding string, about 1 MiB of Arrow IPC.
const ROWS_PER_RESOURCE: i64 = 16_384;
/// Throughput used for the data floor when `build/bench/result.json` has no K=64 figure.
const DEFAULT_THROUGHPUT_MB_PER_SECOND: f64 = 300.0;

/// The one body every resource posts (its ids are unique within the resource).
fn body() -> Vec<u8> {
    use arrow_array::{Int64Array, RecordBatch, StringArray};
    use arrow_schema::{DataType, Field, Schema};
    let schema = std::sync::Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("payload", DataType::Utf8, false),
    ]));
    let ids = Int64Array::from_iter_values(0..ROWS_PER_RESOURCE);
    let payload = StringArray::from_iter_values((0..ROWS_PER_RESOURCE).map(|i| format!("{i:0>48}")));
    let batch = RecordBatch::try_new(schema, vec![std::sync::Arc::new(ids), std::sync::Arc::new(payload)]).unwrap();
    support::arrow::ipc_stream(&[batch])
}

/// Which gateway a point measures: this build, or another build (the previous main).
struct Contender {
    setting: String,
    binary: Option<std::path::PathBuf>,
}

impl Contender {
    fn this_build() -> Self {
        Contender { setting: PROFILE.into(), binary: None }
    }

    /// The previous main's binary, when `scripts/bench.sh` built it.
    fn previous_main() -> Option<Self> {
        let previous = previous_main()?;
        Some(Contender { setting: format!("previous main ({})", previous.commit), binary: Some(previous.binary) })
    }
}

const PROFILE: &str = "many-tables profile (64 / 100)";
/// The "many tables" profile (docs/operations.md): set-ups and publications at once. Under the
/// set-up limit's old name (`FILAMENT_MAX_CONCURRENT_SET_UPS` now) for as long as it is
/// accepted, so that the previous main's binary, which knows only that one, reads it too.
const MANY_TABLES_PROFILE: [(&str, &str); 2] =
    [("FILAMENT_MAX_CONCURRENT_PREPARES", "64"), ("FILAMENT_MAX_CONCURRENT_PUBLICATIONS", "100")];

/// Which way the rows reach their tables.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum WritePath {
    /// The seed's: a staging table per resource, published by a query job.
    Staging,
    /// `direct_append`: the stream writes into the destination and its commit publishes.
    DirectAppend,
}

impl WritePath {
    fn name(self) -> &'static str {
        match self {
            WritePath::Staging => "staging",
            WritePath::DirectAppend => "direct_append",
        }
    }
}

/// What one point runs.
struct Scenario<'a> {
    resources: usize,
    replicas: usize,
    stream_quota: StreamQuota,
    path: WritePath,
    contender: &'a Contender,
    /// The simulation's clock, this many times faster than real time (1.0: real time).
    time_scale: f64,
    /// How Postgres transactions are counted ([`Counting`]).
    counting: Counting,
}

/// How a point counts Postgres transactions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Counting {
    /// Read after every backend published its counts ([`POSTGRES_STATS_PUBLISHED_WITHIN`]
    /// before and after the run), with the bench's 3 s lease (a heartbeat every second).
    Settled,
    /// Settled, with the gateway's default 30 s lease: the per-resource work, little else.
    SettledDefaultLease,
    /// Read at once (smoke points that assert no count): the last seconds are missing.
    Unsettled,
}

/// Calls per resource, by kind.
#[derive(Debug, Clone, Copy)]
struct Calls {
    rest: f64,
    grpc: f64,
    postgres: f64,
}

struct Point {
    resources: usize,
    replicas: usize,
    stream_quota: StreamQuota,
    path: WritePath,
    setting: String,
    floor: Floor,
    /// Simulated seconds: wall seconds times `time_scale`.
    measured_seconds: f64,
    time_scale: f64,
    peak_rss_mib: f64,
    cpu_ms_per_resource: f64,
    rows_exact: bool,
    calls_per_resource: Calls,
    max_quota_use: f64,
    busiest_quota: String,
    quota_refusals: usize,
    max_running_queries: usize,
    max_open_connections: usize,
}

impl Point {
    fn ratio(&self) -> f64 {
        self.measured_seconds / self.floor.seconds()
    }

    /// The point as a row of the table in docs/performance.md (and the line the run prints).
    fn markdown_row(&self) -> String {
        let (floor, calls) = (self.floor, self.calls_per_resource);
        format!(
            "| {} | {} | {} | {} | {} | {:.1} ({:.1} / {:.1} / {:.1}, then {:.1}) | {:.1}{} | {:.2} | {:.1} / {:.1} / {:.1} | {:.2} ({}) | {} | {:.0} | {:.2} | {} |",
            self.resources,
            self.replicas,
            self.stream_quota.name(),
            self.path.name(),
            self.setting,
            floor.seconds(),
            floor.tables_insert_seconds,
            floor.stream_creation_seconds,
            floor.data_seconds,
            floor.publication_seconds,
            self.measured_seconds,
            if self.time_scale == 1.0 { String::new() } else { format!(" (clock x{})", self.time_scale) },
            self.ratio(),
            calls.rest,
            calls.grpc,
            calls.postgres,
            self.max_quota_use,
            self.busiest_quota,
            self.quota_refusals,
            self.peak_rss_mib,
            self.cpu_ms_per_resource,
            self.rows_exact
        )
    }

    fn json(&self, data_cpu_floor_ms: f64) -> Value {
        json!({
            "resources": self.resources,
            "replicas": self.replicas,
            "stream_quota": self.stream_quota.name(),
            "path": self.path.name(),
            "setting": self.setting,
            "floor_seconds": self.floor.seconds(),
            "floor_tables_insert_seconds": self.floor.tables_insert_seconds,
            "floor_stream_creation_seconds": self.floor.stream_creation_seconds,
            "floor_publication_seconds": self.floor.publication_seconds,
            "floor_data_seconds": self.floor.data_seconds,
            "measured_seconds": self.measured_seconds,
            "time_scale": self.time_scale,
            "wall_seconds": self.measured_seconds / self.time_scale,
            "ratio": self.ratio(),
            "calls_per_resource": {
                "rest": self.calls_per_resource.rest,
                "grpc": self.calls_per_resource.grpc,
                "postgres": self.calls_per_resource.postgres,
            },
            "max_quota_use": self.max_quota_use,
            "busiest_quota": self.busiest_quota,
            "quota_refusals": self.quota_refusals,
            "peak_rss_mib": self.peak_rss_mib,
            "cpu_ms_per_resource": self.cpu_ms_per_resource,
            "data_cpu_floor_ms_per_resource": data_cpu_floor_ms,
            "cpu_ms_per_resource_beyond_data_floor": self.cpu_ms_per_resource - data_cpu_floor_ms,
            "rows_exact": self.rows_exact,
            "max_running_queries": self.max_running_queries,
            "max_open_connections": self.max_open_connections,
        })
    }
}

/// Sends `request` again while the gateway answers 429 (backpressure, request slots) or 503
/// with a retryable code; the final answer.
async fn send_retrying(make: impl Fn() -> reqwest::RequestBuilder) -> (StatusCode, Value) {
    loop {
        let (status, body) = support::send(make()).await;
        if status != StatusCode::TOO_MANY_REQUESTS {
            return (status, body);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The states an execution ends in.
const ENDED_STATES: [&str; 3] = ["committed", "failed", "aborted"];

/// Commits and waits for the execution to end (a commit of 10,000 tables outlasts an HTTP
/// request's timeout, so the end is polled, with a deadline). The poll reads the timeline's new
/// events (`after`) for the `ended` one, which costs the gateway the same at 10,000 resources
/// as at 100; `GET` of the execution answers every resource's progress, so polling it every
/// 200 ms would be measured as the gateway's CPU per resource, growing with the run. The
/// execution itself is read once, at the end.
async fn commit_and_await(gw: &Gateway, run: &str) -> Value {
    // One request that waits for the end (no polling, whose reads would count as the gateway's
    // Postgres work per resource); a build that answers at once (202) is polled instead.
    let commit = gw
        .request(Method::POST, &format!("/v1/runs/{run}/executions/e/commit?wait=true"))
        .timeout(Duration::from_secs(3600));
    let (status, body) = support::send(commit).await;
    if status == StatusCode::OK {
        assert!(ENDED_STATES.contains(&body["state"].as_str().unwrap_or("")), "{body}");
        return body;
    }
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    let seen = std::cell::Cell::new(0_i64);
    let ended = support::within(Duration::from_secs(3600), Duration::from_millis(200), || async {
        let path = format!("/v1/runs/{run}/executions/e/events?after={}&limit=1000", seen.get());
        let (status, body) = gw.json(Method::GET, &path, None).await;
        if status == StatusCode::NOT_FOUND {
            // A previous main without the timeline: its execution, read once a second.
            tokio::time::sleep(Duration::from_secs(1)).await;
            let (_, execution) = gw.json(Method::GET, &format!("/v1/runs/{run}/executions/e"), None).await;
            return ENDED_STATES.contains(&execution["state"].as_str().unwrap_or("")).then_some(());
        }
        assert_eq!(status, StatusCode::OK, "{body}");
        seen.set(body["next_after"].as_i64().expect("the events answer has next_after"));
        let events = body["events"].as_array().expect("the events answer has events");
        events.iter().any(|event| event["kind"] == "ended").then_some(())
    })
    .await;
    ended.expect("the bench's execution ended within an hour");
    let (status, body) = gw.json(Method::GET, &format!("/v1/runs/{run}/executions/e"), None).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(ENDED_STATES.contains(&body["state"].as_str().unwrap_or("")), "{body}");
    body
}

/// Creates `run` with its resources and opens its execution `e`. Its batches flush after
/// `flush_interval` (the gateway's 10 s on the point's clock).
async fn set_up_run(gw: &Gateway, run: &str, resources: &[String], write_path: WritePath, flush_interval: Duration) {
    let run_body = json!({
        "run_id": run,
        "destination": {"project": gw.project, "dataset": gw.dataset},
        "batching": {"flush_interval_ms": flush_interval.as_millis() as u64},
    });
    let (status, created) = gw.json(Method::POST, "/v1/runs", Some(run_body)).await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    let declaration = match write_path {
        WritePath::Staging => json!({"write_mode": "full_append"}),
        WritePath::DirectAppend => json!({"write_mode": "full_append", "direct_append": true}),
    };
    let declaration = &declaration;
    let declarations = futures::stream::iter(resources.iter().map(|resource| async move {
        let path = format!("/v1/runs/{run}/resources/{resource}");
        let (status, body) = send_retrying(|| gw.request(Method::PUT, &path).json(&declaration)).await;
        assert_eq!(status, StatusCode::OK, "{body}");
    }));
    declarations.buffer_unordered(32).collect::<Vec<()>>().await;
    let (status, body) = gw.open_execution(run, "e").await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
}

/// Posts one body to each of `resources` in `run`, then commits and waits for its end: the
/// ended execution.
async fn load_run(gw: &Gateway, run: &str, resources: &[String], body: &[u8]) -> Value {
    let posts = futures::stream::iter(resources.iter().map(|resource| async move {
        let path = format!("/v1/runs/{run}/executions/e/resources/{resource}/batches");
        let post = || {
            gw.request(Method::POST, &path)
                .header("content-type", "application/vnd.apache.arrow.stream")
                .body(body.to_vec())
        };
        let (status, receipt) = send_retrying(post).await;
        assert_eq!(status, StatusCode::ACCEPTED, "{receipt}");
    }));
    posts.buffer_unordered(64).collect::<Vec<()>>().await;
    commit_and_await(gw, run).await
}

/// A point whose execution did not commit (the previous main, which does not pace the quotas,
/// can fail under them): its end, and when.
#[derive(Debug)]
struct NotCommitted {
    resources: usize,
    setting: String,
    state: String,
    code: String,
    seconds: f64,
}

impl NotCommitted {
    fn sentence(&self) -> String {
        format!(
            "{} ({} resources): {} after {:.1} s, `{}`",
            self.setting, self.resources, self.state, self.seconds, self.code
        )
    }
}

/// `replicas` gateways on one database, each pacing its share of `limits` (they know each other
/// before the run starts).
async fn spawn_fleet(scenario: &Scenario<'_>, limits: &Limits, fake: &FakeWrite, rest: &SimulatedRest) -> Vec<Gateway> {
    let mut env = vec![
        ("BIGQUERY_STORAGE_EMULATOR_HOST".to_string(), fake.address.clone()),
        ("BIGQUERY_EMULATOR_HOST".to_string(), rest.address.clone()),
        ("RUST_LOG".to_string(), std::env::var("FILAMENT_BENCH_RUST_LOG").unwrap_or_else(|_| "warn".into())),
    ];
    if scenario.counting != Counting::SettledDefaultLease {
        env.push(("FILAMENT_REPLICA_LEASE_SECS".to_string(), "3".to_string()));
    }
    let (replicas, contender) = (scenario.replicas, scenario.contender);
    env.extend(gateway_settings());
    env.extend(MANY_TABLES_PROFILE.iter().map(|(name, value)| (name.to_string(), value.to_string())));
    env.extend(limits.gateway_settings());
    let mut fleet: Vec<Gateway> = Vec::new();
    for _ in 0..replicas {
        let database_url = fleet.first().map(|first| first.database_url.clone());
        let (env, binary) = (env.clone(), contender.binary.clone());
        fleet.push(
            Gateway::spawn_with(GatewayOptions { env, database_url, direct_rest: true, binary, ..Default::default() })
                .await,
        );
    }
    if replicas > 1 {
        for gw in &fleet {
            let counted = support::within(Duration::from_secs(30), Duration::from_millis(200), || async {
                (gw.metric("filament_fleet_replicas").await == Some(replicas as f64)).then_some(())
            });
            counted.await.expect("every replica counts the fleet within 30 s");
        }
    }
    fleet
}

/// How long an idle Postgres 15 backend may keep its transaction counts before publishing
/// them to `pg_stat_database` (`PGSTAT_IDLE_INTERVAL`, 10 s), with a second of room.
const POSTGRES_STATS_PUBLISHED_WITHIN: Duration = Duration::from_secs(11);

/// Postgres transactions committed or rolled back in `database_url`'s database so far; unless
/// `counting` is unsettled, read once every backend has published its counts
/// ([`POSTGRES_STATS_PUBLISHED_WITHIN`]): read at once, the last seconds' are missing.
async fn postgres_transactions(database_url: &str, counting: Counting) -> f64 {
    if counting != Counting::Unsettled {
        tokio::time::sleep(POSTGRES_STATS_PUBLISHED_WITHIN).await;
    }
    let pool = sqlx::PgPool::connect(database_url).await.unwrap();
    let (transactions,): (i64,) = sqlx::query_as(
        "SELECT (xact_commit + xact_rollback)::bigint FROM pg_stat_database WHERE datname = current_database()",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    pool.close().await;
    transactions as f64
}

/// gRPC calls the Storage Write fake answered: unary calls and AppendRows requests.
fn grpc_calls(fake: &FakeWrite) -> usize {
    fake.with(|s| s.routing_headers.iter().filter(|(path, _)| path != "AppendRows").count() + s.append_requests)
}

/// One point: `scenario.resources` resources, split among `scenario.replicas` runs, through
/// the simulation under Google's quotas (on the scenario's clock: [`Limits::on_faster_clock`]).
async fn run_point(scenario: Scenario<'_>, throughput: f64) -> Result<Point, NotCommitted> {
    let limits = Limits { stream_quota: scenario.stream_quota, ..Limits::default() };
    let simulated = limits.on_faster_clock(scenario.time_scale);
    let flush_interval = Duration::from_secs(10).div_f64(scenario.time_scale);
    let body = body();
    let fake = FakeWrite::start().await;
    fake.with(|s| s.null_sink = true);
    simulated.apply_to(&fake);
    let rest = SimulatedRest::start(simulated, body.len() as u64).await;
    let fleet = spawn_fleet(&scenario, &simulated, &fake, &rest).await;
    let names: Vec<String> = (0..scenario.resources).map(|i| format!("t{i:05}")).collect();
    let shares: Vec<&[String]> = names.chunks(scenario.resources.div_ceil(scenario.replicas)).collect();
    for (i, (gw, share)) in fleet.iter().zip(&shares).enumerate() {
        set_up_run(gw, &format!("bench{i}"), share, scenario.path, flush_interval).await;
    }
    let (rest_before, grpc_before) = (rest.rest_calls(), grpc_calls(&fake));
    let postgres_before = postgres_transactions(&fleet[0].database_url, scenario.counting).await;
    let cpu_before: Vec<f64> = fleet.iter().map(|gw| process_cpu_seconds(gw.pid())).collect();
    let started = Instant::now();
    let runs = fleet.iter().zip(&shares).enumerate().map(|(i, (gw, share))| {
        let body = &body;
        async move { load_run(gw, &format!("bench{i}"), share, body).await }
    });
    let ends = futures::future::join_all(runs).await;
    let measured_seconds = started.elapsed().as_secs_f64() * scenario.time_scale;
    if let Some(end) = ends.iter().find(|end| end["state"] != "committed") {
        return Err(NotCommitted {
            resources: scenario.resources,
            setting: scenario.contender.setting.clone(),
            state: end["state"].as_str().unwrap_or("unknown").to_string(),
            code: end["error"]["code"].as_str().unwrap_or("none").to_string(),
            seconds: measured_seconds,
        });
    }
    let cpu: f64 = fleet.iter().zip(&cpu_before).map(|(gw, before)| process_cpu_seconds(gw.pid()) - before).sum();
    let n = scenario.resources as f64;
    let calls_per_resource = Calls {
        rest: (rest.rest_calls() - rest_before) as f64 / n,
        grpc: (grpc_calls(&fake) - grpc_before) as f64 / n,
        postgres: (postgres_transactions(&fleet[0].database_url, scenario.counting).await - postgres_before) / n,
    };
    let counters = rest.counters();
    let (committed_streams, rows) = fake.with(|s| {
        let committed: Vec<_> = s.streams.values().filter(|st| st.committed).collect();
        (committed.len(), committed.iter().map(|st| st.rows).sum::<i64>())
    });
    let jobs_expected = if scenario.path == WritePath::DirectAppend { 0 } else { scenario.resources };
    let rows_exact = committed_streams == scenario.resources
        && rows == ROWS_PER_RESOURCE * n as i64
        && counters.jobs_inserted == jobs_expected;
    assert!(rows_exact, "{committed_streams} streams committed, {rows} rows, {} jobs", counters.jobs_inserted);
    let mut uses = rest.quota_use();
    uses.extend(fake.with(|s| s.create_quota.as_ref().map(support::quota_meter::QuotaUse::from)));
    let busiest = uses.iter().max_by(|a, b| a.max_use.total_cmp(&b.max_use)).cloned().unwrap();
    Ok(Point {
        resources: scenario.resources,
        replicas: scenario.replicas,
        stream_quota: scenario.stream_quota,
        path: scenario.path,
        setting: scenario.contender.setting.clone(),
        floor: limits.floor(
            scenario.resources,
            body.len() as u64,
            throughput * 1e6,
            scenario.path == WritePath::DirectAppend,
        ),
        measured_seconds,
        time_scale: scenario.time_scale,
        peak_rss_mib: fleet.iter().map(|gw| peak_rss_mib(gw.pid())).sum(),
        cpu_ms_per_resource: cpu * 1000.0 / n,
        rows_exact,
        calls_per_resource,
        max_quota_use: busiest.max_use,
        busiest_quota: busiest.name,
        quota_refusals: uses.iter().map(|u| u.refused).sum(),
        max_running_queries: counters.max_running_queries,
        max_open_connections: fake.with(|s| s.max_open_connections),
    })
}

/// CPU milliseconds the data of one resource costs at the least: gzip alone as the gateway
/// compresses (at [`gateway_gzip_level`]) and SHA-256 alone (the receipt's digest) on `body`.
fn data_cpu_floor_ms(body: &[u8]) -> f64 {
    let bodies = [body.to_vec()];
    let gzip = gzip_alone(&bodies, Gzip::gateway(gateway_gzip_level()), 256 << 20).cpu_seconds_per_gib;
    let sha256 = sha256_alone(&bodies, 256 << 20);
    (gzip + sha256) * body.len() as f64 / GIB * 1000.0
}

/// The K=64 plain throughput `ingest` measured in this `make bench` run, MB/s.
fn measured_throughput(root: &std::path::Path) -> (f64, &'static str) {
    let measured = std::fs::read_to_string(root.join("build/bench/result.json"))
        .ok()
        .and_then(|text| serde_json::from_str::<Value>(&text).ok())
        .and_then(|result| {
            result["runs"].as_array()?.iter().find(|r| r["k"] == 64 && r["bodies"] == "plain")?["mb_per_second"]
                .as_f64()
        });
    match measured {
        Some(mbps) => (mbps, "K=64 of this run"),
        None => (DEFAULT_THROUGHPUT_MB_PER_SECOND, "assumed, no K=64 figure"),
    }
}

/// Resources of the smoke run that counts Postgres transactions: enough that the time-driven
/// ones (each replica's heartbeat every second under the bench's 3 s lease) weigh little.
const COUNTED_RESOURCES: usize = 60;

/// The most Postgres transactions per resource the counted smoke run may take (one replica,
/// staging, real time, the default lease; from the first POST to the commit's end, read after
/// every backend published its counts). A regression guard at what this build measures (10.1
/// on this machine: 8.2 counted statement by statement, the rest time-driven) with room
/// (docs/performance.md names each transaction).
const COUNTED_TRANSACTIONS_PER_RESOURCE: f64 = 12.0;

/// `cargo test --all-targets`: one point that counts Postgres transactions per resource.
fn postgres_transactions_smoke(runtime: &tokio::runtime::Runtime, this_build: &Contender) {
    let (stream_quota, path, contender) = (StreamQuota::PerMinute, WritePath::Staging, this_build);
    let counting = Counting::SettledDefaultLease;
    let scenario = Scenario {
        resources: COUNTED_RESOURCES,
        replicas: 1,
        stream_quota,
        path,
        contender,
        time_scale: 1.0,
        counting,
    };
    let point = runtime.block_on(run_point(scenario, DEFAULT_THROUGHPUT_MB_PER_SECOND)).unwrap();
    let per_resource = point.calls_per_resource.postgres;
    println!(
        "many-tables smoke: {COUNTED_RESOURCES} resources on 1 replica, loaded exactly once: {}, {per_resource:.1} Postgres transactions per resource",
        point.rows_exact
    );
    assert!(
        per_resource <= COUNTED_TRANSACTIONS_PER_RESOURCE,
        "{per_resource:.1} Postgres transactions per resource, at most {COUNTED_TRANSACTIONS_PER_RESOURCE} allowed"
    );
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    let this_build = Contender::this_build();
    if !std::env::args().any(|arg| arg == "--bench") {
        // `cargo test --all-targets`: a small smoke run on two replicas (exact rows and the
        // quotas still checked), each path in real time and the seed's on the faster clock.
        let smoke_points =
            [(WritePath::Staging, 1.0), (WritePath::DirectAppend, 1.0), (WritePath::Staging, LARGE_POINT_TIME_SCALE)];
        for (path, time_scale) in smoke_points {
            let stream_quota = StreamQuota::PerMinute;
            let contender = &this_build;
            let counting = Counting::Unsettled;
            let scenario = Scenario { resources: 10, replicas: 2, stream_quota, path, contender, time_scale, counting };
            let point = runtime.block_on(run_point(scenario, DEFAULT_THROUGHPUT_MB_PER_SECOND)).unwrap();
            assert!(
                point.max_quota_use <= 1.0 && point.quota_refusals == 0,
                "{}: {}",
                point.busiest_quota,
                point.max_quota_use
            );
            println!(
                "many-tables smoke (not a measurement): 10 resources on 2 replicas, {} path, clock x{time_scale}, loaded exactly once: {}",
                path.name(),
                point.rows_exact
            );
        }
        postgres_transactions_smoke(&runtime, &this_build);
        return;
    }
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let (throughput, source) = measured_throughput(root);
    let sizes: Vec<usize> = std::env::var("FILAMENT_BENCH_MANY_TABLES")
        .ok()
        .map(|list| list.split(',').map(|n| n.trim().parse().expect("a number of resources")).collect())
        .unwrap_or_else(|| vec![100, 1_000, 10_000]);
    let large_point_time_scale: f64 = std::env::var("FILAMENT_BENCH_TIME_SCALE")
        .map(|scale| scale.parse().expect("FILAMENT_BENCH_TIME_SCALE is a number (1: real time)"))
        .unwrap_or(LARGE_POINT_TIME_SCALE);
    let previous = Contender::previous_main().filter(|_| std::env::var_os("FILAMENT_BENCH_SKIP_PREVIOUS").is_none());
    let mut points = Vec::new();
    let mut not_committed = Vec::new();
    for &resources in &sizes {
        if resources == 100
            && let Some(previous) = &previous
        {
            let (stream_quota, path) = (StreamQuota::PerMinute, WritePath::Staging);
            let scenario = Scenario {
                resources,
                replicas: 1,
                stream_quota,
                path,
                contender: previous,
                time_scale: 1.0,
                counting: Counting::Settled,
            };
            match runtime.block_on(run_point(scenario, throughput)) {
                Ok(point) => points.push(report(point)),
                Err(end) => {
                    println!("many tables: {}", end.sentence());
                    not_committed.push(end);
                }
            }
        }
        // 10,000 new tables take at least half an hour of tables.insert: one replica, one
        // reading, the seed's path, on the faster clock.
        let time_scale = if resources > 1_000 { large_point_time_scale } else { 1.0 };
        let fleets: &[usize] = if resources > 1_000 { &[1] } else { &[1, 3] };
        let readings: &[StreamQuota] =
            if resources > 1_000 { &[StreamQuota::Hourly] } else { &[StreamQuota::Hourly, StreamQuota::PerMinute] };
        let paths: &[WritePath] =
            if resources > 1_000 { &[WritePath::Staging] } else { &[WritePath::Staging, WritePath::DirectAppend] };
        for &path in paths {
            for &replicas in fleets {
                for &stream_quota in readings {
                    let contender = &this_build;
                    let counting = Counting::Settled;
                    let scenario =
                        Scenario { resources, replicas, stream_quota, path, contender, time_scale, counting };
                    let point = runtime.block_on(run_point(scenario, throughput));
                    points.push(report(point.unwrap_or_else(|end| panic!("{}", end.sentence()))));
                }
            }
        }
    }
    write_results(root, &points, &not_committed, (throughput, source), data_cpu_floor_ms(&body()));
}

fn report(point: Point) -> Point {
    println!("many tables: {}", point.markdown_row());
    point
}

fn write_results(
    root: &std::path::Path,
    points: &[Point],
    not_committed: &[NotCommitted],
    (throughput, source): (f64, &str),
    data_cpu_floor_ms: f64,
) {
    let path = root.join("build/bench/result.json");
    let mut result: Value = std::fs::read_to_string(&path)
        .ok()
        .and_then(|text| serde_json::from_str(&text).ok())
        .unwrap_or_else(|| json!({}));
    let this_build = |p: &&Point| p.setting == PROFILE;
    let current: Vec<Value> = points.iter().filter(this_build).map(|p| p.json(data_cpu_floor_ms)).collect();
    let mut previous: Vec<Value> =
        points.iter().filter(|p| !this_build(p)).map(|p| p.json(data_cpu_floor_ms)).collect();
    previous.extend(not_committed.iter().map(|end| {
        json!({"resources": end.resources, "setting": end.setting, "state": end.state, "code": end.code, "seconds": end.seconds})
    }));
    result["many_tables"] = json!(current);
    result["many_tables_previous_main"] = json!(previous);
    result["many_tables_data_throughput_mb_per_second"] = json!({"value": throughput, "source": source});
    std::fs::create_dir_all(root.join("build/bench")).unwrap();
    std::fs::write(&path, serde_json::to_string_pretty(&result).unwrap()).unwrap();
    let mut md = String::from(
        "Measured by `make bench` (`benches/many_tables.rs`): runs of N resources of about 1 MiB, first batch to\n\
         `committed`, against the simulated control plane under Google's published quotas (the model above), the null\n\
         Storage Write sink and Postgres on this machine; three replicas share one database and the quotas. A\n\
         time marked \"clock xS\" ran on a simulation S times faster (every quota's rate and every latency scaled,\n\
         the gateway's quota settings with them) and is wall time times S: an upper bound (the gateway's CPU and\n\
         Postgres are not scaled).\n\n\
         | resources | replicas | stream quota | path | build | floor s (tables.insert / streams / data, then publication) | measured s | ratio | calls per resource (REST / gRPC / Postgres) | max quota use | refusals | peak RSS MiB | CPU ms per resource | rows exact |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for point in points {
        md.push_str(&point.markdown_row());
        md.push('\n');
    }
    for end in not_committed {
        md.push_str(&format!("\nNot committed: {}.\n", end.sentence()));
    }
    let gzip = Gzip::gateway(gateway_gzip_level()).name();
    md.push_str(&format!(
        "\nData floor at {throughput:.0} MB/s ({source}). CPU floor of one resource's data (gzip alone as the gateway\n\
         compresses, {gzip}, plus SHA-256 alone, on the same body, in one thread): {data_cpu_floor_ms:.2} ms.\n"
    ));
    support::generated_docs::replace_section(&root.join("docs/performance.md"), "many-tables", &md);
}
