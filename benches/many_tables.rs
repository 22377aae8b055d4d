//! The many-tables benchmark (`make bench`, after `ingest`): one run of N resources of about
//! 1 MiB each (N = 100, 1,000, 10,000), from the first batch to `committed`, against the
//! simulated BigQuery control plane (`tests/it/support/control_plane.rs`: latencies and limits
//! of metadata calls, stream creation and query jobs) and the null Storage Write sink.
//!
//! For each N: the floor the simulation's limits allow ([`Limits::floor`]), the measured time
//! and their ratio, the gateway's peak RSS and CPU per resource, and whether every row reached
//! the sink exactly once (each resource's stream committed, one publication job each). Each N
//! runs under the "many tables" profile of docs/operations.md (64 set-ups, 100 publications at
//! once); 100 and 1,000 also with the defaults (8 and 8: at 10,000 they would take about an
//! hour) and, when `scripts/bench.sh` built it, with the previous main's binary.
//!
//! Adds `many_tables` to `build/bench/result.json` and its table to `docs/performance.md`.
//! Reports, never asserts timings; rows are asserted exactly.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout, missing_docs)]

extern crate filament_bigquery as _;

#[path = "common/measure.rs"]
mod measure;
#[path = "../tests/it/support/mod.rs"]
mod support;

use std::time::{Duration, Instant};

use futures::StreamExt as _;
use measure::{
    GIB, Gzip, gateway_gzip_level, gateway_settings, gzip_alone, peak_rss_mib, previous_main, process_cpu_seconds,
    sha256_alone,
};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use support::control_plane::{Floor, Limits, SimulatedRest};
use support::fake_write::FakeWrite;
use support::{Gateway, GatewayOptions};

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

/// Which gateway a point measures: this build with its defaults or with the many-tables
/// profile, or another build (the previous main).
struct Contender {
    setting: String,
    env: Vec<(String, String)>,
    binary: Option<std::path::PathBuf>,
}

impl Contender {
    /// This build with its default limits (the product's eight set-ups and eight publications).
    fn defaults() -> Self {
        Contender { setting: DEFAULTS.into(), env: Vec::new(), binary: None }
    }

    /// This build with the "many tables" profile of docs/operations.md.
    fn many_tables_profile() -> Self {
        let env = MANY_TABLES_PROFILE.iter().map(|(name, value)| (name.to_string(), value.to_string())).collect();
        Contender { setting: PROFILE.into(), env, binary: None }
    }

    /// The previous main's binary, when `scripts/bench.sh` built it.
    fn previous_main() -> Option<Self> {
        let previous = previous_main()?;
        let setting = format!("previous main ({})", previous.commit);
        Some(Contender { setting, env: Vec::new(), binary: Some(previous.binary) })
    }
}

const DEFAULTS: &str = "defaults (8 / 8)";
const PROFILE: &str = "many-tables profile (64 / 100)";
/// The "many tables" profile (docs/operations.md): set-ups and publications at once.
const MANY_TABLES_PROFILE: [(&str, &str); 2] =
    [("FILAMENT_MAX_CONCURRENT_PREPARES", "64"), ("FILAMENT_MAX_CONCURRENT_PUBLICATIONS", "100")];

struct Point {
    resources: usize,
    setting: String,
    floor: Floor,
    measured_seconds: f64,
    peak_rss_mib: f64,
    cpu_ms_per_resource: f64,
    rows_exact: bool,
    refused_stream_creations: usize,
    max_running_queries: usize,
    max_open_connections: usize,
    refused_connections: usize,
}

impl Point {
    fn ratio(&self) -> f64 {
        self.measured_seconds / self.floor.seconds()
    }

    fn ratio_to_sequential_floor(&self) -> f64 {
        self.measured_seconds / self.floor.sequential_seconds()
    }

    fn json(&self, data_cpu_floor_ms: f64) -> Value {
        json!({
            "resources": self.resources,
            "setting": self.setting,
            "floor_seconds": self.floor.seconds(),
            "floor_stream_creation_seconds": self.floor.stream_creation_seconds,
            "floor_publication_seconds": self.floor.publication_seconds,
            "floor_data_seconds": self.floor.data_seconds,
            "sequential_floor_seconds": self.floor.sequential_seconds(),
            "measured_seconds": self.measured_seconds,
            "ratio": self.ratio(),
            "ratio_to_sequential_floor": self.ratio_to_sequential_floor(),
            "peak_rss_mib": self.peak_rss_mib,
            "cpu_ms_per_resource": self.cpu_ms_per_resource,
            "data_cpu_floor_ms_per_resource": data_cpu_floor_ms,
            "cpu_ms_per_resource_beyond_data_floor": self.cpu_ms_per_resource - data_cpu_floor_ms,
            "rows_exact": self.rows_exact,
            "refused_stream_creations": self.refused_stream_creations,
            "max_running_queries": self.max_running_queries,
            "max_open_connections": self.max_open_connections,
            "refused_connections": self.refused_connections,
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

/// Commits and waits for the execution to end (a commit of 10,000 tables outlasts an HTTP
/// request's timeout, so the end is polled, with a deadline). The poll reads the timeline's new
/// events (`after`) for the `ended` one, which costs the gateway the same at 10,000 resources
/// as at 100; `GET` of the execution answers every resource's progress, so polling it every
/// 200 ms would be measured as the gateway's CPU per resource, growing with the run. The
/// execution itself is read once, at the end.
async fn commit_and_await(gw: &Gateway) -> Value {
    let (status, body) = gw.json(Method::POST, "/v1/runs/bench/executions/e/commit", None).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    let seen = std::cell::Cell::new(0_i64);
    let ended = support::within(Duration::from_secs(3600), Duration::from_millis(200), || async {
        let path = format!("/v1/runs/bench/executions/e/events?after={}&limit=1000", seen.get());
        let (status, body) = gw.json(Method::GET, &path, None).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        seen.set(body["next_after"].as_i64().expect("the events answer has next_after"));
        let events = body["events"].as_array().expect("the events answer has events");
        events.iter().any(|event| event["kind"] == "ended").then_some(())
    })
    .await;
    ended.expect("the bench's execution ended within an hour");
    let (status, body) = gw.json(Method::GET, "/v1/runs/bench/executions/e", None).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(["committed", "failed", "aborted"].contains(&body["state"].as_str().unwrap_or("")), "{body}");
    body
}

async fn set_up_run(gw: &Gateway, resources: &[String]) {
    gw.create_run("bench").await;
    let declarations = futures::stream::iter(resources.iter().map(|resource| async move {
        let path = format!("/v1/runs/bench/resources/{resource}");
        let (status, body) =
            send_retrying(|| gw.request(Method::PUT, &path).json(&json!({"write_mode": "full_append"}))).await;
        assert_eq!(status, StatusCode::OK, "{body}");
    }));
    declarations.buffer_unordered(32).collect::<Vec<()>>().await;
    let (status, body) = gw.open_execution("bench", "e").await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
}

/// One run of `resources` resources through the simulation, on `contender`'s gateway.
async fn run_point(resources: usize, contender: &Contender, throughput: f64) -> Point {
    let limits = Limits::default();
    let body = body();
    let fake = FakeWrite::start().await;
    fake.with(|s| s.null_sink = true);
    limits.apply_to(&fake);
    let rest = SimulatedRest::start(limits, body.len() as u64).await;
    let mut env = vec![
        ("BIGQUERY_STORAGE_EMULATOR_HOST".to_string(), fake.address.clone()),
        ("BIGQUERY_EMULATOR_HOST".to_string(), rest.address.clone()),
        ("RUST_LOG".to_string(), std::env::var("FILAMENT_BENCH_RUST_LOG").unwrap_or_else(|_| "warn".into())),
    ];
    env.extend(gateway_settings());
    env.extend(contender.env.iter().cloned());
    let binary = contender.binary.clone();
    let gw = Gateway::spawn_with(GatewayOptions { env, direct_rest: true, binary, ..Default::default() }).await;
    let pid = gw.pid();
    let names: Vec<String> = (0..resources).map(|i| format!("t{i:05}")).collect();
    set_up_run(&gw, &names).await;
    let cpu_before = process_cpu_seconds(pid);
    let started = Instant::now();
    let posts = futures::stream::iter(names.iter().map(|resource| {
        let (gw, body) = (&gw, &body);
        async move {
            let path = format!("/v1/runs/bench/executions/e/resources/{resource}/batches");
            let post = || {
                gw.request(Method::POST, &path)
                    .header("content-type", "application/vnd.apache.arrow.stream")
                    .body(body.clone())
            };
            let (status, receipt) = send_retrying(post).await;
            assert_eq!(status, StatusCode::ACCEPTED, "{receipt}");
        }
    }));
    posts.buffer_unordered(64).collect::<Vec<()>>().await;
    let committed = commit_and_await(&gw).await;
    let measured_seconds = started.elapsed().as_secs_f64();
    let cpu = process_cpu_seconds(pid) - cpu_before;
    assert_eq!(committed["state"], "committed", "{committed}");
    let counters = rest.counters();
    let (committed_streams, rows) = fake.with(|s| {
        let committed: Vec<_> = s.streams.values().filter(|st| st.committed).collect();
        (committed.len(), committed.iter().map(|st| st.rows).sum::<i64>())
    });
    let rows_exact = committed_streams == resources
        && rows == ROWS_PER_RESOURCE * resources as i64
        && counters.jobs_inserted == resources;
    assert!(rows_exact, "{committed_streams} streams committed, {rows} rows, {} jobs", counters.jobs_inserted);
    Point {
        resources,
        setting: contender.setting.clone(),
        floor: limits.floor(resources, body.len() as u64, throughput * 1e6),
        measured_seconds,
        peak_rss_mib: peak_rss_mib(pid),
        cpu_ms_per_resource: cpu * 1000.0 / resources as f64,
        rows_exact,
        refused_stream_creations: fake.with(|s| s.refused_creates),
        max_running_queries: counters.max_running_queries,
        max_open_connections: fake.with(|s| s.max_open_connections),
        refused_connections: fake.with(|s| s.refused_connections),
    }
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

fn main() {
    if !std::env::args().any(|arg| arg == "--bench") {
        // `cargo test --all-targets`: a small smoke run (exact rows still checked).
        let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
        let point = runtime.block_on(run_point(10, &Contender::defaults(), DEFAULT_THROUGHPUT_MB_PER_SECOND));
        println!("many-tables smoke (not a measurement): 10 resources loaded exactly once: {}", point.rows_exact);
        return;
    }
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let (throughput, source) = measured_throughput(root);
    let sizes: Vec<usize> = std::env::var("FILAMENT_BENCH_MANY_TABLES")
        .ok()
        .map(|list| list.split(',').map(|n| n.trim().parse().expect("a number of resources")).collect())
        .unwrap_or_else(|| vec![100, 1_000, 10_000]);
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    let (defaults, profile) = (Contender::defaults(), Contender::many_tables_profile());
    let previous = Contender::previous_main().filter(|_| std::env::var_os("FILAMENT_BENCH_SKIP_PREVIOUS").is_none());
    let mut points = Vec::new();
    for &resources in &sizes {
        // The defaults publish eight tables at a time: 10,000 would take about an hour.
        if resources <= 1_000 {
            if let Some(previous) = &previous {
                points.push(report(runtime.block_on(run_point(resources, previous, throughput))));
            }
            points.push(report(runtime.block_on(run_point(resources, &defaults, throughput))));
        }
        points.push(report(runtime.block_on(run_point(resources, &profile, throughput))));
    }
    write_results(root, &points, throughput, source, data_cpu_floor_ms(&body()));
}

fn report(point: Point) -> Point {
    println!(
        "many tables: {:>6} resources, {:<24} floor {:>6.1} s (streams {:.1}, publication {:.1}, data {:.1}; sequential {:.1}), measured {:>6.1} s ({:.2}x, {:.2}x sequential), peak RSS {:.0} MiB, {:.2} ms CPU per resource, {} stream creations refused, {} queries at once, {} AppendRows connections at once ({} refused)",
        point.resources,
        point.setting,
        point.floor.seconds(),
        point.floor.stream_creation_seconds,
        point.floor.publication_seconds,
        point.floor.data_seconds,
        point.floor.sequential_seconds(),
        point.measured_seconds,
        point.ratio(),
        point.ratio_to_sequential_floor(),
        point.peak_rss_mib,
        point.cpu_ms_per_resource,
        point.refused_stream_creations,
        point.max_running_queries,
        point.max_open_connections,
        point.refused_connections,
    );
    point
}

fn write_results(root: &std::path::Path, points: &[Point], throughput: f64, source: &str, data_cpu_floor_ms: f64) {
    let path = root.join("build/bench/result.json");
    let mut result: Value = std::fs::read_to_string(&path)
        .ok()
        .and_then(|text| serde_json::from_str(&text).ok())
        .unwrap_or_else(|| json!({}));
    let this_build = |p: &&Point| p.setting == DEFAULTS || p.setting == PROFILE;
    let current: Vec<Value> = points.iter().filter(this_build).map(|p| p.json(data_cpu_floor_ms)).collect();
    let previous: Vec<Value> = points.iter().filter(|p| !this_build(p)).map(|p| p.json(data_cpu_floor_ms)).collect();
    result["many_tables"] = json!(current);
    result["many_tables_previous_main"] = json!(previous);
    result["many_tables_data_throughput_mb_per_second"] = json!({"value": throughput, "source": source});
    std::fs::create_dir_all(root.join("build/bench")).unwrap();
    std::fs::write(&path, serde_json::to_string_pretty(&result).unwrap()).unwrap();
    let mut md = String::from(
        "Measured by `make bench` (`benches/many_tables.rs`): one run of N resources of about 1 MiB, first batch to\n\
         `committed`, against the simulated control plane with the default limits below, the null Storage Write sink\n\
         and Postgres on this machine.\n\n\
         | resources | concurrency | floor s (streams / publication / data) | sequential floor s | measured s | ratio | ratio to sequential | peak RSS MiB | CPU ms per resource | rows exact |\n\
         |---|---|---|---|---|---|---|---|---|---|\n",
    );
    for p in points {
        md.push_str(&format!(
            "| {} | {} | {:.1} ({:.1} / {:.1} / {:.1}) | {:.1} | {:.1} | {:.2} | {:.2} | {:.0} | {:.2} | {} |\n",
            p.resources,
            p.setting,
            p.floor.seconds(),
            p.floor.stream_creation_seconds,
            p.floor.publication_seconds,
            p.floor.data_seconds,
            p.floor.sequential_seconds(),
            p.measured_seconds,
            p.ratio(),
            p.ratio_to_sequential_floor(),
            p.peak_rss_mib,
            p.cpu_ms_per_resource,
            p.rows_exact
        ));
    }
    let gzip = Gzip::gateway(gateway_gzip_level()).name();
    md.push_str(&format!(
        "\nData floor at {throughput:.0} MB/s ({source}). CPU floor of one resource's data (gzip alone as the gateway\n\
         compresses, {gzip}, plus SHA-256 alone, on the same body, in one thread): {data_cpu_floor_ms:.2} ms.\n"
    ));
    support::generated_docs::replace_section(&root.join("docs/performance.md"), "many-tables", &md);
}
