//! The ingestion benchmark (`make bench`): the release gateway against Postgres, the emulator's
//! REST API and a **null Storage Write sink** (the test suite's scriptable fake in null-sink
//! mode: it inflates every request with ISA-L (`tests/it/support/grpc_inflate.rs`), decodes
//! it, counts rows and acknowledges at once).
//!
//! Figures, all from one run so machine noise cancels in the ratios:
//! - per K concurrent resources (1, 8, 64), at least 1 GiB of Arrow IPC each: end-to-end MB/s
//!   and rows/s (first POST to committed), the gateway's CPU seconds per GiB (from its
//!   `/proc/<pid>/stat`), its peak RSS (`VmHWM`), and gzip alone on the same bytes at the same
//!   level (CPU seconds per GiB of this process's thread): the headline ratio gateway / gzip;
//! - the Python peer (`benches/python_peer.py`): Google's client writing the same Arrow record
//!   batches to PENDING streams of the same sink with gzip on the channel;
//! - head-of-line: 8 fast tables alone, then next to one whose acknowledgements take 500 ms.
//!
//! The gateway's pacing of BigQuery's control-plane quotas is lifted ([`UNPACED_CONTROL_PLANE`]):
//! this benchmark measures the data path against the emulator, which has no quotas, and at
//! K=1024 Google's `tables.insert` and `CreateWriteStream` quotas alone would take minutes of
//! set-up (`benches/many_tables.rs` measures the gateway under them).
//!
//! Writes `build/bench/result.json` and `docs/performance.md`. Reports, never asserts timings.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout, missing_docs)]

// Links the gateway's library and with it ISA-L (its build script links `libisal`), which the
// gzip-alone baselines call through isal-rs.
extern crate filament_bigquery as _;

#[path = "common/io_floor.rs"]
mod io_floor;
#[path = "common/measure.rs"]
mod measure;
#[path = "../tests/it/support/mod.rs"]
mod support;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use arrow_array::{BooleanArray, Float64Array, Int64Array, RecordBatch, StringArray, TimestampMicrosecondArray};
use arrow_schema::{DataType, Field, Schema, TimeUnit};
use measure::{
    GIB, Gzip, GzipAlone, MemoryAtPeak, cpu_seconds, gateway_gzip_level, gateway_settings, gzip_alone, peak_rss_mib,
    previous_main, resident_mib, sha256_alone,
};
use rand::rngs::StdRng;
use rand::seq::IndexedRandom as _;
use rand::{Rng as _, SeedableRng as _};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use support::fake_write::FakeWrite;
use support::{Gateway, GatewayOptions};
use tokio::time::Instant;

const MB: f64 = 1_000_000.0;
const ROWS_PER_BODY: usize = 20_000;
const DISTINCT_BODIES: usize = 8;

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

const WORDS: [&str; 32] = [
    "order",
    "customer",
    "shipped",
    "pending",
    "invoice",
    "berlin",
    "lisbon",
    "paris",
    "express",
    "standard",
    "refund",
    "gift",
    "card",
    "blue",
    "green",
    "large",
    "small",
    "returned",
    "warehouse",
    "north",
    "south",
    "priority",
    "note",
    "delivered",
    "the",
    "a",
    "of",
    "and",
    "with",
    "for",
    "package",
    "label",
];

/// The realistic mix: int64 ids, short and long strings, float64, timestamps, booleans.
fn body(seed: u64) -> Vec<u8> {
    support::arrow::ipc_stream(&[record_batch(seed, ROWS_PER_BODY)])
}

/// [`body`] with its buffers compressed the Arrow way (IPC buffer compression).
fn compressed_body(seed: u64, compression: arrow_ipc::CompressionType) -> Vec<u8> {
    support::arrow::ipc_stream_compressed(&[record_batch(seed, ROWS_PER_BODY)], compression)
}

/// The realistic mix in `rows` rows.
fn record_batch(seed: u64, rows: usize) -> RecordBatch {
    // Seeded: the same data on every run.
    let mut rng = StdRng::seed_from_u64(seed);
    let ids: Vec<i64> = (0..rows as i64).map(|i| seed as i64 * 1_000_000 + i).collect();
    let mut short = Vec::with_capacity(rows);
    let mut long = Vec::with_capacity(rows);
    let mut amounts = Vec::with_capacity(rows);
    let mut times = Vec::with_capacity(rows);
    let mut flags = Vec::with_capacity(rows);
    for i in 0..rows {
        short.push(format!("{}-{}", WORDS.choose(&mut rng).unwrap(), rng.random_range(0..10_000)));
        let words = rng.random_range(8..24);
        let text: Vec<&str> = (0..words).map(|_| *WORDS.choose(&mut rng).unwrap()).collect();
        long.push(format!("{} #{}", text.join(" "), rng.random_range(0..1_000_000)));
        amounts.push(rng.random_range(0..1_000_000) as f64 / 100.0);
        times.push(1_700_000_000_000_000 + i as i64 * 1_000 + rng.random_range(0..1_000));
        flags.push(rng.random_ratio(1, 3));
    }
    RecordBatch::try_new(
        Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("code", DataType::Utf8, true),
            Field::new("description", DataType::Utf8, true),
            Field::new("amount", DataType::Float64, true),
            Field::new("created_at", DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())), true),
            Field::new("active", DataType::Boolean, true),
        ])),
        vec![
            Arc::new(Int64Array::from(ids)),
            Arc::new(StringArray::from(short)),
            Arc::new(StringArray::from(long)),
            Arc::new(Float64Array::from(amounts)),
            Arc::new(TimestampMicrosecondArray::from(times).with_timezone("UTC")),
            Arc::new(BooleanArray::from(flags)),
        ],
    )
    .unwrap()
}

/// Pins process `pid` (every thread) to `core` with `taskset`, so the gateway's CPU figures
/// are its own and the sink and load generator do not compete with it; `false` when it
/// cannot (one core, or no `taskset`).
fn pin(pid: u32, core: usize) -> bool {
    if std::thread::available_parallelism().map_or(1, |n| n.get()) < 2 {
        return false;
    }
    std::process::Command::new("taskset")
        .args(["-a", "-p", "-c", &core.to_string(), &pid.to_string()])
        .stdout(std::process::Stdio::null())
        .status()
        .is_ok_and(|status| status.success())
}

/// A gateway against `fake`, of this build or of another build's `binary` (the previous
/// main's), with `extra` settings.
/// Quota settings far above any rate the emulator sees, so that set-ups wait for no pacer (the
/// previous main has no such settings and ignores them).
const UNPACED_CONTROL_PLANE: [(&str, &str); 4] = [
    ("FILAMENT_QUOTA_TABLES_INSERT_PER_SECOND", "100000"),
    ("FILAMENT_QUOTA_API_REQUESTS_PER_SECOND_PER_METHOD", "100000"),
    ("FILAMENT_QUOTA_CREATE_WRITE_STREAMS_PER_HOUR", "100000000"),
    ("FILAMENT_QUOTA_CREATE_WRITE_STREAM_READING", "hourly"),
];

async fn spawn_gateway(binary: Option<&Path>, fake: &FakeWrite, extra: &[(&str, String)]) -> Gateway {
    let mut env = vec![
        ("BIGQUERY_STORAGE_EMULATOR_HOST".to_string(), fake.address.clone()),
        ("RUST_LOG".to_string(), "warn".to_string()),
    ];
    env.extend(UNPACED_CONTROL_PLANE.iter().map(|(name, value)| (name.to_string(), value.to_string())));
    env.extend(gateway_settings());
    env.extend(extra.iter().map(|(k, v)| (k.to_string(), v.clone())));
    let binary = binary.map(Path::to_path_buf);
    let gw = Gateway::spawn_with(GatewayOptions { env, direct_rest: true, binary, ..Default::default() }).await;
    // The benchmark runs on core 0 (`main`), the gateway alone on core 1.
    if PINNED.load(std::sync::atomic::Ordering::SeqCst) {
        pin(gw.pid(), 1);
    }
    gw
}

/// Whether `main` pinned this process to core 0 (then each gateway goes to core 1).
static PINNED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Creates the run (with `FILAMENT_BENCH_MAX_ROWS`, the run's `batching.max_rows`: the bodies'
/// 20,000 rows weigh about 3 MB, so only more rows per upload batch let larger request budgets
/// (`FILAMENT_BENCH_GATEWAY_ENV=FILAMENT_MAX_APPEND_REQUEST_BYTES=...`) fill), declares the
/// resources and opens the execution.
async fn start_run(gw: &Gateway, resources: &[String]) {
    match std::env::var("FILAMENT_BENCH_MAX_ROWS") {
        Ok(max_rows) => {
            let max_rows: u64 = max_rows.parse().expect("FILAMENT_BENCH_MAX_ROWS is a number of rows");
            let destination = json!({"project": gw.project, "dataset": gw.dataset});
            let run = json!({"run_id": "bench", "destination": destination, "batching": {"max_rows": max_rows}});
            let (status, body) = gw.json(Method::POST, "/v1/runs", Some(run)).await;
            assert_eq!(status, StatusCode::CREATED, "{body}");
        }
        Err(_) => {
            gw.create_run("bench").await;
        }
    }
    for resource in resources {
        gw.declare("bench", resource, json!({"write_mode": "full_append"})).await;
    }
    let (status, body) = gw.open_execution("bench", "e").await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
}

/// Posts `count` bodies of `set` to `resource` in turn, waiting out 429s as an extractor does:
/// for their `Retry-After` (a body refused under backpressure is sent again whole, so resending
/// sooner only adds refusals: at K=1024, 50 ms made 13,149 of them and 4.7 MB/s).
async fn post_bodies(gw: &Gateway, resource: &str, set: &BodySet, first: usize, count: usize) -> u64 {
    let (bodies, path) = (&set.bodies, format!("/v1/runs/bench/executions/e/resources/{resource}/batches"));
    let mut rows = 0;
    for i in 0..count {
        let body = bodies[(first + i) % bodies.len()].clone();
        loop {
            let mut request =
                gw.request(Method::POST, &path).header("content-type", "application/vnd.apache.arrow.stream");
            if let Some(encoding) = set.content_encoding {
                request = request.header("content-encoding", encoding);
            }
            let response = request.body(body.clone()).send().await.expect("request");
            let status = response.status();
            let retry_after_secs = response.headers().get("retry-after").and_then(|v| v.to_str().ok()?.parse().ok());
            let receipt: serde_json::Value = response.json().await.expect("a JSON answer");
            match status {
                StatusCode::ACCEPTED => {
                    rows += receipt["rows"].as_u64().unwrap();
                    break;
                }
                StatusCode::TOO_MANY_REQUESTS => {
                    tokio::time::sleep(Duration::from_secs(retry_after_secs.unwrap_or(1))).await;
                }
                other => panic!("batch refused: {other} {receipt}"),
            }
        }
    }
    rows
}

/// Bodies posted in turn, with what their rows weigh as plain Arrow IPC (the figures count plain
/// bytes, so compressed bodies compare with plain ones).
struct BodySet {
    name: &'static str,
    bodies: Vec<Vec<u8>>,
    plain_bytes: Vec<u64>,
    /// The bodies' HTTP `Content-Encoding`, when compressed as a whole.
    content_encoding: Option<&'static str>,
}

impl BodySet {
    fn plain(name: &'static str, bodies: Vec<Vec<u8>>) -> Self {
        let plain_bytes = bodies.iter().map(|b| b.len() as u64).collect();
        BodySet { name, bodies, plain_bytes, content_encoding: None }
    }
}

struct Throughput {
    /// `this build` or `previous main`.
    build: &'static str,
    k: usize,
    bodies: &'static str,
    /// Plain Arrow IPC bytes of the rows posted, and the bytes actually sent.
    bytes: u64,
    sent_bytes: u64,
    rows: u64,
    /// First POST to committed, and first POST to the last receipt (the rest is the commit).
    seconds: f64,
    receipts_seconds: f64,
    /// Requests answered 429 `backpressure` (and sent again).
    refused: u64,
    cpu_seconds: f64,
    peak_rss_mib: f64,
    /// The budgets and the allocator at the largest resident set sampled (every 200 ms).
    memory: MemoryAtPeak,
}

impl Throughput {
    fn mb_per_second(&self) -> f64 {
        self.bytes as f64 / MB / self.seconds
    }

    fn cpu_seconds_per_gib(&self) -> f64 {
        self.cpu_seconds / (self.bytes as f64 / GIB)
    }
}

/// K resources post `total_bytes` (plain) of `set` concurrently, then commit, on this build's
/// gateway or another build's `binary` (the previous main's); every row must reach the sink
/// exactly once.
async fn run_k(binary: Option<&Path>, k: usize, set: &BodySet, total_bytes: u64) -> Throughput {
    let fake = FakeWrite::start().await;
    fake.with(|s| s.null_sink = true);
    let gw = spawn_gateway(binary, &fake, &[]).await;
    let pid = gw.pid();
    let resources: Vec<String> = (0..k).map(|i| format!("r{i:02}")).collect();
    start_run(&gw, &resources).await;
    let per_resource = (total_bytes / k as u64).div_ceil(set.plain_bytes[0]).max(1) as usize;
    let cpu_before = cpu_seconds(&format!("/proc/{pid}/stat"));
    let started = Instant::now();
    let posting =
        futures::future::join_all(resources.iter().enumerate().map(|(i, r)| post_bodies(&gw, r, set, i, per_resource)));
    let (posted, memory) = while_sampling_memory(&gw, pid, posting).await;
    let receipts_seconds = started.elapsed().as_secs_f64();
    let refused = gw.metric("filament_backpressure_rejections_total").await.unwrap_or_default() as u64;
    let committed = gw.commit_and_wait("bench", "e").await;
    let seconds = started.elapsed().as_secs_f64();
    let cpu_seconds = cpu_seconds(&format!("/proc/{pid}/stat")) - cpu_before;
    assert_eq!(committed["state"], "committed", "{committed}");
    let rows: u64 = posted.iter().sum();
    let sunk: i64 = fake.with(|s| s.streams.values().map(|st| st.rows).sum());
    assert_eq!(sunk as u64, rows, "every row reached the sink exactly once");
    let posted_indexes = || (0..k).flat_map(|i| (0..per_resource).map(move |j| (i + j) % set.bodies.len()));
    let bytes = posted_indexes().map(|b| set.plain_bytes[b]).sum();
    let sent_bytes = posted_indexes().map(|b| set.bodies[b].len() as u64).sum();
    let peak_rss_mib = peak_rss_mib(pid);
    Throughput {
        build: if binary.is_some() { "previous main" } else { "this build" },
        k,
        bodies: set.name,
        bytes,
        sent_bytes,
        rows,
        seconds,
        receipts_seconds,
        refused,
        cpu_seconds,
        peak_rss_mib,
        memory,
    }
}

/// The I/O floor ([`io_floor`]) in place of the gateway: K resources post `total_bytes` of `set`
/// concurrently to a floor process against a fresh null sink, then finish their streams; every
/// row must reach the sink exactly once. Its CPU is the floor process's own.
async fn run_floor(k: usize, set: &BodySet, total_bytes: u64) -> Throughput {
    let fake = FakeWrite::start().await;
    fake.with(|s| s.null_sink = true);
    let floor = io_floor::IoFloor::spawn(&fake.address);
    if PINNED.load(std::sync::atomic::Ordering::SeqCst) {
        pin(floor.pid(), 1);
    }
    let client = support::extractor_http_client().build().unwrap();
    let per_resource = (total_bytes / k as u64).div_ceil(set.plain_bytes[0]).max(1) as usize;
    let cpu_before = measure::process_cpu_seconds(floor.pid());
    let started = Instant::now();
    let post_one = |i: usize| {
        let (client, origin) = (&client, &floor.origin);
        async move {
            let mut rows = 0;
            for j in 0..per_resource {
                let body = set.bodies[(i + j) % set.bodies.len()].clone();
                let (status, receipt) =
                    support::send(client.post(format!("{origin}/streams/r{i:04}")).body(body)).await;
                assert_eq!(status, StatusCode::ACCEPTED, "{receipt}");
                rows += receipt.as_u64().unwrap();
            }
            rows
        }
    };
    let posted = futures::future::join_all((0..k).map(post_one)).await;
    let receipts_seconds = started.elapsed().as_secs_f64();
    let finish = |i: usize| support::send(client.post(format!("{}/streams/r{i:04}/finish", floor.origin)));
    for (status, acknowledged) in futures::future::join_all((0..k).map(finish)).await {
        assert_eq!(status, StatusCode::OK, "{acknowledged}");
    }
    let seconds = started.elapsed().as_secs_f64();
    let cpu_seconds = measure::process_cpu_seconds(floor.pid()) - cpu_before;
    let rows: u64 = posted.iter().sum();
    let sunk: i64 = fake.with(|s| s.streams.values().map(|st| st.rows).sum());
    assert_eq!(sunk as u64, rows, "every row reached the sink exactly once through the floor");
    let posted_indexes = || (0..k).flat_map(|i| (0..per_resource).map(move |j| (i + j) % set.bodies.len()));
    let bytes = posted_indexes().map(|b| set.plain_bytes[b]).sum();
    let sent_bytes = posted_indexes().map(|b| set.bodies[b].len() as u64).sum();
    Throughput {
        build: "I/O floor",
        k,
        bodies: set.name,
        bytes,
        sent_bytes,
        rows,
        seconds,
        receipts_seconds,
        refused: 0,
        cpu_seconds,
        peak_rss_mib: peak_rss_mib(floor.pid()),
        memory: MemoryAtPeak::default(),
    }
}

/// Runs `work` while sampling the gateway's resident set and `/metrics` every 200 ms; its
/// output and the memory at the largest sample.
async fn while_sampling_memory<T>(gw: &Gateway, pid: u32, work: impl Future<Output = T>) -> (T, MemoryAtPeak) {
    let peak = std::cell::Cell::new(MemoryAtPeak::default());
    let sampling = async {
        loop {
            let metrics = gw.metrics().await;
            peak.set(peak.get().max(MemoryAtPeak::sample(resident_mib(pid), &metrics)));
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    };
    let output = tokio::select! {
        output = work => output,
        _ = sampling => unreachable!("the sampling never ends"),
    };
    (output, peak.get())
}

/// Throughput (MB/s) of 8 fast tables until the sink holds all their rows, with or without
/// a ninth table whose every acknowledgement takes 500 ms.
async fn head_of_line(bodies: &[Vec<u8>], with_slow: bool, fast_bytes: u64) -> f64 {
    let set = &BodySet::plain("plain", bodies.to_vec());
    let fake = FakeWrite::start().await;
    fake.with(|s| {
        s.null_sink = true;
        s.table_delays.push(("slow".to_string(), Duration::from_millis(500)));
    });
    let gw = spawn_gateway(None, &fake, &[("FILAMENT_BACKPRESSURE_WAIT_MS", "100".to_string())]).await;
    let mut resources: Vec<String> = (0..8).map(|i| format!("fast{i}")).collect();
    if with_slow {
        resources.push("slow".to_string());
    }
    start_run(&gw, &resources).await;
    let per_resource = (fast_bytes / 8).div_ceil(bodies[0].len() as u64) as usize;
    let started = Instant::now();
    let slow = async {
        if with_slow {
            // It keeps sending for as long as the fast tables run.
            post_bodies(&gw, "slow", set, 0, per_resource * 2).await;
        }
    };
    let fast = async {
        let rows: u64 =
            futures::future::join_all((0..8).map(|i| post_bodies(&gw, &resources[i], set, i, per_resource)))
                .await
                .iter()
                .sum();
        // Until the sink holds every fast row (the commit would wait for the slow table).
        loop {
            let sunk: i64 =
                fake.with(|s| s.streams.values().filter(|st| st.table.contains("fast")).map(|st| st.rows).sum());
            if sunk as u64 >= rows {
                break started.elapsed().as_secs_f64();
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    let seconds = tokio::select! {
        seconds = fast => seconds,
        () = async { slow.await; std::future::pending::<()>().await } => unreachable!(),
    };
    let (status, _) = gw.json(Method::POST, "/v1/runs/bench/executions/e/abort", None).await;
    assert_eq!(status, StatusCode::OK);
    (per_resource as u64 * 8 * bodies[0].len() as u64) as f64 / MB / seconds
}

/// The Python peer: Google's client on the same record batches, `streams` PENDING streams in
/// parallel threads. Returns its MB/s, or why it could not run.
fn python_peer(bodies: &[Vec<u8>], total_bytes: u64, streams: usize) -> Result<f64, String> {
    let python = std::env::var("FILAMENT_TOOLS_PYTHON").map_err(|_| "FILAMENT_TOOLS_PYTHON is not set".to_string())?;
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let fake = runtime.block_on(async {
        let fake = FakeWrite::start().await;
        fake.with(|s| s.null_sink = true);
        fake
    });
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("python-peer");
    std::fs::create_dir_all(&dir).unwrap();
    for (i, body) in bodies.iter().enumerate() {
        std::fs::write(dir.join(format!("body{i}.arrows")), body).unwrap();
    }
    let per_stream = (total_bytes / streams as u64).div_ceil(bodies[0].len() as u64);
    let output = std::process::Command::new(python)
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/benches/python_peer.py"))
        .args(["--endpoint", &fake.address, "--bodies", dir.to_str().unwrap()])
        .args(["--streams", &streams.to_string(), "--bodies-per-stream", &per_stream.to_string()])
        .output()
        .map_err(|e| e.to_string())?;
    if !output.status.success() {
        return Err(String::from_utf8_lossy(&output.stderr).lines().last().unwrap_or("failed").to_string());
    }
    let result: Value = serde_json::from_slice(&output.stdout).map_err(|e| e.to_string())?;
    let sunk: i64 = fake.with(|s| s.streams.values().filter(|st| st.committed).map(|st| st.rows).sum());
    if sunk != result["rows"].as_i64().unwrap_or(-1) {
        return Err(format!("the sink holds {sunk} committed rows, the peer reported {}", result["rows"]));
    }
    drop(runtime);
    Ok(result["bytes"].as_f64().unwrap() / MB / result["seconds"].as_f64().unwrap())
}

fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines().find(|l| l.starts_with("model name")).map(|l| l.split(':').nth(1).unwrap().trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    // The machine's cores, not this process's (pinned to one by then).
    let cores = std::fs::read_to_string("/proc/cpuinfo")
        .map_or(0, |c| c.lines().filter(|l| l.starts_with("processor")).count());
    let memory_gib = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| m.lines().next().and_then(|l| l.split_whitespace().nth(1)).and_then(|kb| kb.parse::<f64>().ok()))
        .map_or(0.0, |kb| kb / 1024.0 / 1024.0);
    format!("{cores} cores ({cpu}), {memory_gib:.0} GiB RAM")
}

fn main() {
    // The bench binary run again as the I/O floor's server (`run_floor`): serves and exits.
    io_floor::serve_if_asked();
    // `cargo bench` passes `--bench`; `cargo test --all-targets` runs this target without it:
    // then only a small smoke run (exact rows at the sink still checked), nothing written.
    if !std::env::args().any(|arg| arg == "--bench") {
        smoke();
        return;
    }
    let total_bytes = env_or("FILAMENT_BENCH_BYTES", 1 << 30);
    let gzip_level = gateway_gzip_level();
    let bodies: Vec<Vec<u8>> = (0..DISTINCT_BODIES as u64).map(body).collect();
    if let Ok(k) = std::env::var("FILAMENT_BENCH_ONLY_K") {
        one_point(k.parse().expect("FILAMENT_BENCH_ONLY_K is a number of resources"), bodies, total_bytes);
        return;
    }
    let body_mib = bodies[0].len() as f64 / 1024.0 / 1024.0;
    println!(
        "bench: {} bodies of {ROWS_PER_BODY} rows ({body_mib:.1} MiB), {:.2} GiB per run",
        DISTINCT_BODIES,
        total_bytes as f64 / GIB
    );
    let pinned = pin(std::process::id(), 0);
    PINNED.store(pinned, std::sync::atomic::Ordering::SeqCst);
    println!(
        "bench: {}",
        if pinned {
            "load generator and sink on core 0, gateway on core 1"
        } else {
            "not pinned (one core, or no taskset)"
        }
    );
    let gzip = gzip_baselines(&bodies);
    let gateway_gzip = gzip.iter().find(|g| g.name == Gzip::gateway(gzip_level).name()).unwrap().clone();
    let sha256 = sha256_alone(&bodies, 256 << 20);
    println!(
        "SHA-256 alone: {sha256:.2} CPU s/GiB; the CPU floor ({} + SHA-256): {:.2}",
        gateway_gzip.name,
        gateway_gzip.cpu_seconds_per_gib + sha256
    );

    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    let mut runs = Vec::new();
    let mut io_floor = Vec::new();
    let plain = BodySet::plain("plain", bodies.clone());
    let small = small_bodies();
    // K=64 twice: its peak RSS against the budgets is judged on two runs (issue 54, item 6).
    // Each K's I/O floor runs just before the gateway's first run at that K.
    for k in [1, 8, 64, 64, 1024] {
        let set = if k >= 1024 { &small } else { &plain };
        if !io_floor.iter().any(|floor: &Throughput| floor.k == k) {
            io_floor.push(report(runtime.block_on(run_floor(k, set, total_bytes)), &gateway_gzip));
        }
        runs.push(report(runtime.block_on(run_k(None, k, set, total_bytes)), &gateway_gzip));
    }
    for set in compressed_body_sets(&plain) {
        runs.push(report(runtime.block_on(run_k(None, 8, &set, total_bytes / 2)), &gateway_gzip));
    }
    // The previous main, same bodies, same run: K=8's CPU and K=64's memory.
    let previous = previous_main();
    let previous_runs: Vec<Throughput> = match &previous {
        Some(previous) => [8, 64]
            .into_iter()
            .map(|k| report(runtime.block_on(run_k(Some(&previous.binary), k, &plain, total_bytes)), &gateway_gzip))
            .collect(),
        None => Vec::new(),
    };
    let fast_bytes = (total_bytes / 4).max(64 << 20);
    let alone = runtime.block_on(head_of_line(&bodies, false, fast_bytes));
    let beside_slow = runtime.block_on(head_of_line(&bodies, true, fast_bytes));
    println!(
        "head-of-line: 8 fast tables {alone:.1} MB/s alone, {beside_slow:.1} MB/s next to a slow one ({:.0}%)",
        beside_slow / alone * 100.0
    );
    drop(runtime);
    let peer = python_peer(&bodies, total_bytes, 8);
    match &peer {
        Ok(mbps) => println!("python peer (8 streams): {mbps:.1} MB/s"),
        Err(why) => println!("python peer: not run: {why}"),
    }
    let previous_main = previous.as_ref().map(|p| (p.commit.as_str(), previous_runs.as_slice()));
    let results = Results {
        runs: &runs,
        io_floor: &io_floor,
        previous_main,
        gzip_level,
        gzip: &gzip,
        gateway_gzip: &gateway_gzip,
        total_bytes,
        sha256,
        pinned,
    };
    write_results(&results, (alone, beside_slow), &peer);
}

/// `FILAMENT_BENCH_ONLY_K=K`: one plain run at K resources (1 MiB bodies from K=1024 on),
/// unpinned unless `FILAMENT_BENCH_PIN=1`,
/// printed and not written anywhere: for profiling one point (`perf record -p`). With a
/// previous main (`FILAMENT_BENCH_PREVIOUS_GATEWAY`), both builds run the point in turn,
/// `FILAMENT_BENCH_ROUNDS` times (default 3), so a change's cost shows beside the machine's noise.
fn one_point(k: usize, bodies: Vec<Vec<u8>>, total_bytes: u64) {
    let set = if k >= 1024 { small_bodies() } else { BodySet::plain("plain", bodies) };
    // `FILAMENT_BENCH_PIN=1`: pinned as `make bench` pins (load generator on core 0, gateway on 1).
    if std::env::var("FILAMENT_BENCH_PIN").is_ok_and(|pin| pin == "1") {
        PINNED.store(pin(std::process::id(), 0), std::sync::atomic::Ordering::SeqCst);
    }
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    let previous = previous_main();
    let rounds = if previous.is_some() { env_or("FILAMENT_BENCH_ROUNDS", 3) } else { 1 };
    let floor = runtime.block_on(run_floor(k, &set, total_bytes));
    println!(
        "the I/O floor, K={k}: {:.1} MB/s, {:.2} CPU s/GiB, peak RSS {:.1} MiB",
        floor.mb_per_second(),
        floor.cpu_seconds_per_gib(),
        floor.peak_rss_mib
    );
    for round in 1..=rounds {
        let builds = std::iter::once(("this build".to_string(), None))
            .chain(previous.iter().map(|p| (format!("previous main {}", p.commit), Some(p.binary.as_path()))));
        for (build, binary) in builds {
            let run = runtime.block_on(run_k(binary, k, &set, total_bytes));
            println!(
                "round {round}, {build}, K={k}: {:.1} MB/s, {:.2} gateway CPU s/GiB ({:.2}x the I/O floor), peak RSS {:.1} MiB ({}), {:.1} s ({:.1} s to the last receipt, {} requests refused with 429)",
                run.mb_per_second(),
                run.cpu_seconds_per_gib(),
                run.cpu_seconds_per_gib() / floor.cpu_seconds_per_gib(),
                run.peak_rss_mib,
                run.memory.describe(),
                run.seconds,
                run.receipts_seconds,
                run.refused
            );
        }
    }
}

/// gzip alone on the benchmark's bodies, per implementation and level.
fn gzip_baselines(bodies: &[Vec<u8>]) -> Vec<GzipAlone> {
    use isal::CompressionLevel::{One, Three, Zero};
    let measured: Vec<GzipAlone> = [
        (Gzip::Isal(Zero), 256 << 20),
        (Gzip::Isal(One), 256 << 20),
        (Gzip::Isal(Three), 256 << 20),
        (Gzip::ZlibRs(1), 256 << 20),
        (Gzip::ZlibRs(6), 64 << 20),
    ]
    .into_iter()
    .map(|(gzip, bytes)| gzip_alone(bodies, gzip, bytes))
    .collect();
    for g in &measured {
        println!("gzip alone, {}: {:.2} CPU s/GiB, ratio {:.2}", g.name, g.cpu_seconds_per_gib, g.ratio);
    }
    measured
}

/// K=1024's bodies: about 1 MiB each (one per resource).
fn small_bodies() -> BodySet {
    let rows = (ROWS_PER_BODY as u64 * (1 << 20) / body(0).len() as u64) as usize;
    BodySet::plain(
        "1 MiB",
        (0..DISTINCT_BODIES as u64).map(|seed| support::arrow::ipc_stream(&[record_batch(seed, rows)])).collect(),
    )
}

/// The plain bodies again with LZ4_FRAME and ZSTD buffer compression, and whole, zstd level 3
/// (`Content-Encoding: zstd`, as the Python client sends them by default).
fn compressed_body_sets(plain: &BodySet) -> Vec<BodySet> {
    use arrow_ipc::CompressionType;
    let mut sets: Vec<BodySet> = [("lz4", CompressionType::LZ4_FRAME), ("zstd", CompressionType::ZSTD)]
        .into_iter()
        .map(|(name, compression)| {
            let bodies = (0..DISTINCT_BODIES as u64).map(|seed| compressed_body(seed, compression)).collect();
            BodySet { name, bodies, plain_bytes: plain.plain_bytes.clone(), content_encoding: None }
        })
        .collect();
    sets.push(BodySet {
        name: "HTTP zstd",
        bodies: plain.bodies.iter().map(|body| zstd::encode_all(body.as_slice(), 3).unwrap()).collect(),
        plain_bytes: plain.plain_bytes.clone(),
        content_encoding: Some("zstd"),
    });
    sets
}

fn report(run: Throughput, gateway_gzip: &GzipAlone) -> Throughput {
    println!(
        "{}: K={:>4} {:>5} bodies: {:>7.1} MB/s, {:>9.0} rows/s, gateway {:.2} CPU s/GiB ({:.2}x gzip alone), peak RSS {:.0} MiB",
        run.build,
        run.k,
        run.bodies,
        run.mb_per_second(),
        run.rows as f64 / run.seconds,
        run.cpu_seconds_per_gib(),
        run.cpu_seconds_per_gib() / gateway_gzip.cpu_seconds_per_gib,
        run.peak_rss_mib
    );
    run
}

/// The benchmark's path on 32 MiB at K = 1 and 8 (and K = 8 with compressed IPC bodies): proves
/// it still runs and loads every row exactly once, without timing anything or touching docs/.
fn smoke() {
    let plain = BodySet::plain("plain", (0..DISTINCT_BODIES as u64).map(body).collect());
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    for k in [1, 8] {
        let run = runtime.block_on(run_k(None, k, &plain, 32 << 20));
        println!("bench smoke (cargo test, not a measurement): K={k} loaded {} rows exactly once", run.rows);
    }
    for set in compressed_body_sets(&plain) {
        let run = runtime.block_on(run_k(None, 8, &set, 16 << 20));
        println!("bench smoke: K=8 {} bodies loaded {} rows exactly once", set.name, run.rows);
    }
    let floor = runtime.block_on(run_floor(8, &plain, 32 << 20));
    println!("bench smoke: the I/O floor at K=8 loaded {} rows exactly once", floor.rows);
}

/// What one benchmark run measured, for the result file and docs/performance.md.
struct Results<'a> {
    runs: &'a [Throughput],
    /// The I/O floor at K = 1, 8, 64 (plain bodies) and 1024 (1 MiB bodies), measured in this run.
    io_floor: &'a [Throughput],
    /// The previous main's commit and its runs (K=8 and K=64, plain bodies), when measured.
    previous_main: Option<(&'a str, &'a [Throughput])>,
    gzip_level: u32,
    gzip: &'a [GzipAlone],
    gateway_gzip: &'a GzipAlone,
    total_bytes: u64,
    /// SHA-256 alone, CPU s/GiB: with gzip alone at the gateway's level, the CPU floor.
    sha256: f64,
    pinned: bool,
}

impl Results<'_> {
    /// gzip alone at the gateway's level plus SHA-256 alone, CPU s/GiB.
    fn cpu_floor(&self) -> f64 {
        self.gateway_gzip.cpu_seconds_per_gib + self.sha256
    }

    /// The I/O floor measured on the same K and bodies as `r`, if any.
    fn floor_of(&self, r: &Throughput) -> Option<&Throughput> {
        self.io_floor.iter().find(|floor| floor.k == r.k && floor.bodies == r.bodies)
    }

    /// One run's figures for `result.json`.
    fn run_json(&self, r: &Throughput) -> Value {
        let floor = self.floor_of(r);
        let mut run = json!({
            "k": r.k,
            "bodies": r.bodies,
            "bytes": r.bytes,
            "sent_bytes": r.sent_bytes,
            "rows": r.rows,
            "seconds": r.seconds,
            "seconds_to_last_receipt": r.receipts_seconds,
            "refused_with_429": r.refused,
            "mb_per_second": r.mb_per_second(),
            "rows_per_second": r.rows as f64 / r.seconds,
            "gateway_cpu_seconds_per_gib": r.cpu_seconds_per_gib(),
            "cpu_ratio_to_gzip": r.cpu_seconds_per_gib() / self.gateway_gzip.cpu_seconds_per_gib,
            "gateway_cpu_over_floor": r.cpu_seconds_per_gib() / self.cpu_floor(),
            "gateway_mb_per_second_per_core": r.bytes as f64 / MB / r.cpu_seconds,
            "peak_rss_mib": r.peak_rss_mib,
            "memory_at_largest_sample": r.memory.json(),
        });
        run["io_floor_cpu_seconds_per_gib"] = json!(floor.map(Throughput::cpu_seconds_per_gib));
        run["over_io_floor"] = json!(floor.map(|floor| r.cpu_seconds_per_gib() / floor.cpu_seconds_per_gib()));
        run["io_floor_mb_per_second"] = json!(floor.map(Throughput::mb_per_second));
        run["mb_per_second_of_io_floor"] = json!(floor.map(|floor| r.mb_per_second() / floor.mb_per_second()));
        run
    }

    /// One run's row of the table in docs/performance.md, its K column labelled `k_label`.
    fn run_row(&self, k_label: &str, r: &Throughput) -> String {
        let floor = self.floor_of(r);
        let or_dash = |figure: Option<f64>, digits: usize| figure.map_or("-".to_string(), |f| format!("{f:.digits$}"));
        format!(
            "| {} | {} | {:.1} | {:.0} | {:.2} | {:.2} | {:.2} | {:.2} | {} | {} | {} | {:.0} | {:.0} |\n",
            k_label,
            r.bodies,
            r.mb_per_second(),
            r.rows as f64 / r.seconds,
            r.cpu_seconds_per_gib(),
            self.gateway_gzip.cpu_seconds_per_gib,
            r.cpu_seconds_per_gib() / self.gateway_gzip.cpu_seconds_per_gib,
            r.cpu_seconds_per_gib() / self.cpu_floor(),
            or_dash(floor.map(Throughput::cpu_seconds_per_gib), 2),
            or_dash(floor.map(|floor| r.cpu_seconds_per_gib() / floor.cpu_seconds_per_gib()), 2),
            or_dash(floor.map(Throughput::mb_per_second), 1),
            r.bytes as f64 / MB / r.cpu_seconds,
            r.peak_rss_mib
        )
    }
}

fn write_results(results: &Results, head_of_line: (f64, f64), peer: &Result<f64, String>) {
    let k8 = results.runs.iter().find(|r| r.k == 8 && r.bodies == "plain").map(Throughput::mb_per_second);
    let peer_ratio = peer.as_ref().ok().zip(k8).map(|(peer, ours)| ours / peer);
    let mut result = json!({
        "machine": machine(),
        "load_average_at_end": load_average(),
        "bytes_per_run": results.total_bytes,
        "gzip_level": results.gzip_level,
        "gzip_alone": results.gzip.iter().map(|g| json!({
            "implementation": g.name, "cpu_seconds_per_gib": g.cpu_seconds_per_gib, "ratio": g.ratio,
        })).collect::<Vec<_>>(),
        "gateway_gzip": results.gateway_gzip.name,
        "sha256_alone_cpu_seconds_per_gib": results.sha256,
        "cpu_floor_seconds_per_gib": results.cpu_floor(),
        "io_floor": results.io_floor.iter().map(|floor| json!({
            "k": floor.k, "bodies": floor.bodies, "cpu_seconds_per_gib": floor.cpu_seconds_per_gib(),
            "mb_per_second": floor.mb_per_second(), "seconds": floor.seconds, "peak_rss_mib": floor.peak_rss_mib,
        })).collect::<Vec<_>>(),
        "pinned": results.pinned,
        "runs": results.runs.iter().map(|r| results.run_json(r)).collect::<Vec<_>>(),
        "head_of_line": {"fast_alone_mb_per_second": head_of_line.0, "fast_beside_slow_mb_per_second": head_of_line.1,
                         "kept": head_of_line.1 / head_of_line.0},
        "python_peer": match peer { Ok(mbps) => json!({"mb_per_second": mbps, "ours_k8_ratio": peer_ratio}), Err(why) => json!({"error": why}) },
    });
    result["k64_memory_against_budgets"] = k64_memory_against_budgets(results.runs);
    if let Some((commit, runs)) = results.previous_main {
        result["previous_main"] = json!({
            "commit": commit,
            "runs": runs.iter().map(|r| results.run_json(r)).collect::<Vec<_>>(),
        });
    }
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    std::fs::create_dir_all(root.join("build/bench")).unwrap();
    std::fs::write(root.join("build/bench/result.json"), serde_json::to_string_pretty(&result).unwrap()).unwrap();
    let md = results_markdown(results, &result, head_of_line, peer, peer_ratio);
    support::generated_docs::replace_section(&root.join("docs/performance.md"), "bench", &md);
}

/// How far above the configured budgets K=64's peak resident set went, in each run: at most
/// `K64_MIB_ABOVE_BUDGETS` is the target (docs/performance.md).
const K64_MIB_ABOVE_BUDGETS: f64 = 64.0;

fn k64_memory_against_budgets(runs: &[Throughput]) -> Value {
    let k64: Vec<&Throughput> = runs.iter().filter(|r| r.k == 64 && r.bodies == "plain").collect();
    let budgets_mib = k64.iter().map(|r| r.memory.budgets_mib).fold(0.0, f64::max);
    let allowed_peak_mib = budgets_mib + K64_MIB_ABOVE_BUDGETS;
    let peaks_mib: Vec<f64> = k64.iter().map(|r| r.peak_rss_mib).collect();
    json!({
        "budgets_mib": budgets_mib,
        "allowed_peak_mib": allowed_peak_mib,
        "peaks_mib": peaks_mib,
        "within": !peaks_mib.is_empty() && peaks_mib.iter().all(|&peak| peak <= allowed_peak_mib),
    })
}

/// The 1-, 5- and 15-minute load averages, for the record (other work on the machine skews runs).
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

fn results_markdown(
    results: &Results,
    result: &Value,
    head_of_line: (f64, f64),
    peer: &Result<f64, String>,
    peer_ratio: Option<f64>,
) -> String {
    let mut md = String::new();
    md.push_str("Measured by `make bench` (`benches/ingest.rs`): the release gateway against Postgres, the\n");
    md.push_str("emulator's REST API and a null Storage Write sink (the test fake in null-sink mode: it\n");
    md.push_str("inflates every request whole with ISA-L, checking its CRC, decodes it, counts rows and\n");
    md.push_str("acknowledges at once). The sink and the load generator run on the same machine, so they\n");
    md.push_str("compete with the gateway for the cores. The gateway's pacing of BigQuery's control-plane\n");
    md.push_str("quotas is lifted (the emulator has none; the many-tables benchmark below measures them).\n");
    md.push_str("Each run posts Arrow IPC bodies of 20,000 rows (int64 id, short and long strings, float64,\n");
    md.push_str("timestamp, boolean) from K resources concurrently, then commits (K=1024: one body of about\n");
    md.push_str("1 MiB per resource; `lz4`/`zstd`: the same rows with Arrow IPC buffer compression; `HTTP\n");
    md.push_str("zstd`: the plain bodies compressed whole, `Content-Encoding: zstd` level 3, as the Python\n");
    md.push_str("client sends them; figures per plain Arrow byte). Every run asserts that the sink holds\n");
    md.push_str("every row exactly once. This\n");
    md.push_str("file is written by the benchmark; the raw figures are in `build/bench/result.json`.\n\n");
    md.push_str(&format!(
        "Machine: {}; load average at the end {}. Data per run: {:.2} GiB (compressed bodies: half). AppendRows gzip: {} (`FILAMENT_APPEND_GZIP_LEVEL` {}).\n\n",
        result["machine"].as_str().unwrap(),
        result["load_average_at_end"].as_str().unwrap(),
        results.total_bytes as f64 / GIB,
        results.gateway_gzip.name,
        results.gzip_level
    ));
    md.push_str(&format!(
        "CPU floor: gzip alone at the gateway's level plus SHA-256 alone ({:.2}), {:.2} CPU s/GiB; {}.\n\n",
        results.sha256,
        results.cpu_floor(),
        if results.pinned { "gateway pinned to core 1, load generator and sink to core 0" } else { "not pinned" }
    ));
    md.push_str("I/O floor (`benches/common/io_floor.rs`, measured in this run just before the gateway at each K, on core 1 like it): a\n");
    md.push_str(
        "separate process doing the least any gateway must do with the same bodies over the same loopback sockets\n",
    );
    md.push_str("and null sink: hyper reads each body, SHA-256 hashes it, the IPC stream is cut into its messages,\n");
    md.push_str(
        "and each record batch goes as one AppendRows request, gzipped by ISA-L at the gateway's level, over\n",
    );
    md.push_str("one HTTP/2 connection per stream; nothing else (no Postgres, no decoding, no budgets).\n\n");
    md.push_str("| K | bodies | MB/s (plain Arrow) | rows/s | gateway CPU s/GiB | gzip alone CPU s/GiB | ratio | over the CPU floor | I/O floor CPU s/GiB | over the I/O floor | I/O floor MB/s | gateway MB/s per core | peak RSS MiB |\n");
    md.push_str("|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for r in results.runs {
        md.push_str(&results.run_row(&r.k.to_string(), r));
    }
    if let Some((commit, runs)) = results.previous_main {
        for r in runs {
            md.push_str(&results.run_row(&format!("{} (previous main, `{commit}`)", r.k), r));
        }
    }
    let k64 = &result["k64_memory_against_budgets"];
    md.push_str(&format!(
        "\nK=64's peak RSS against the budgets (upload and receive, {:.0} MiB): {} MiB in its two runs, at most {:.0} allowed: {}.\n",
        k64["budgets_mib"].as_f64().unwrap_or(0.0),
        k64["peaks_mib"].as_array().map_or(String::new(), |peaks| peaks
            .iter()
            .map(|peak| format!("{:.0}", peak.as_f64().unwrap_or(0.0)))
            .collect::<Vec<_>>()
            .join(" and ")),
        k64["allowed_peak_mib"].as_f64().unwrap_or(0.0),
        if k64["within"].as_bool() == Some(true) { "within" } else { "over" }
    ));
    md.push_str("\ngzip alone on the same bodies (one thread):\n\n| implementation and level | CPU s/GiB | compressed to |\n|---|---|---|\n");
    for g in results.gzip {
        md.push_str(&format!("| {} | {:.2} | {:.1}% |\n", g.name, g.cpu_seconds_per_gib, g.ratio * 100.0));
    }
    md.push_str(&format!(
        "\nHead-of-line: 8 fast tables reach {:.1} MB/s alone and {:.1} MB/s next to a table whose every acknowledgement takes 500 ms ({:.0}% kept).\n",
        head_of_line.0, head_of_line.1, head_of_line.1 / head_of_line.0 * 100.0
    ));
    match peer {
        Ok(mbps) => md.push_str(&format!(
            "\nPython peer (`benches/python_peer.py`: google-cloud-bigquery-storage, Arrow rows on 8 PENDING streams in threads, gzip on the channel, same record batches, same sink): {mbps:.1} MB/s; the gateway at K=8 is {:.1}x that.\n",
            peer_ratio.unwrap_or(0.0)
        )),
        Err(why) => md.push_str(&format!("\nPython peer: not run ({why}).\n")),
    }
    md
}
