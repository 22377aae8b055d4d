//! The upload pipeline against the scriptable fake (windows, limits, faults; the budget is in
//! `upload_budget.rs`) and, with a connection-cutting TCP proxy, against the emulator. Every
//! test asserts the exact rows and offsets that end up in the stream: nothing lost, nothing
//! duplicated.

use std::ops::Range;
use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::support::emulator::PrivateEmulator;
use crate::support::fake_write::{AppendFault, FakeWrite, assert_exact_stream};
use crate::support::proxy::CuttingProxy;
use crate::support::rows::{int, post_ids};
use crate::support::{Gateway, GatewayOptions, TestRun, eventually};

/// Appends retried this soon after a scripted fault keep the tests fast.
const FAST_RETRY: Duration = Duration::from_millis(20);

/// Options for a gateway whose appends go to `fake`, retried soon after a fault.
pub(super) fn fast_retries_on(fake: &FakeWrite) -> GatewayOptions {
    GatewayOptions::new().fake_write(fake).bigquery_initial_backoff(FAST_RETRY)
}

/// Run `run` with execution `e` open, upload batches of ten rows, `resources` full_append.
async fn open_with_batches_of_ten(gw: &Gateway, resources: &[&str]) {
    TestRun::new("run", "e").batching(json!({"max_rows": 10})).full_append(resources).open(gw).await;
}

/// Posts the numbered `batches` of ten rows each to `resource`: batch n holds ids 10n to 10n + 9.
async fn post_batches_of_ten(gw: &Gateway, resource: &str, batches: Range<i64>) {
    for batch in batches {
        post_ids(gw, resource, batch * 10..batch * 10 + 10).await;
    }
}

/// Commits execution `e` of run `run` and waits, asserting it committed; the execution.
pub(super) async fn commit(gw: &Gateway) -> Value {
    let committed = gw.commit_and_wait("run", "e").await;
    assert_eq!(committed["state"], "committed", "{committed}");
    committed
}

/// A Storage Write fake that answers each stream's appends 100 ms apart, and holds every answer
/// until the test sets `hold_responses` back to false; a gateway on it with fast retries.
async fn answers_held(resources: &[&str]) -> (FakeWrite, Gateway) {
    let fake = FakeWrite::start().await;
    fake.with(|s| {
        s.table_delays.push((String::new(), Duration::from_millis(100)));
        s.hold_responses = true;
    });
    let gw = fast_retries_on(&fake).spawn().await;
    open_with_batches_of_ten(&gw, resources).await;
    (fake, gw)
}

/// The append retries of execution `e` of run `run` as its timeline recorded them: one
/// `append_retried` event per resource and code, its `count` the attempts it stands for.
async fn recorded_retries(gw: &Gateway) -> Vec<Value> {
    let (status, timeline) = gw.json(Method::GET, "/v1/runs/run/executions/e/events", None).await;
    assert_eq!(status, StatusCode::OK, "{timeline}");
    let events = timeline["events"].as_array().expect("the timeline's events");
    events.iter().filter(|event| event["kind"] == "append_retried").cloned().collect()
}

/// How many failed attempts the recorded retry events stand for.
fn attempts_retried(retries: &[Value]) -> i64 {
    retries.iter().map(|event| event["count"].as_i64().unwrap_or(0)).sum()
}

/// Posts `batches` batches of ten rows (ids 0, 1, ...) to resource `t` of a new run whose
/// upload batches hold ten rows, commits, and checks that every row landed exactly once, in
/// order; the append retries its timeline recorded.
async fn load_in_batches_of_ten(gw: &Gateway, fake: &FakeWrite, batches: i64) -> Vec<Value> {
    open_with_batches_of_ten(gw, &["t"]).await;
    post_batches_of_ten(gw, "t", 0..batches).await;
    let committed = commit(gw).await;
    assert_eq!(committed["resources"][0]["rows_acknowledged"], batches * 10);
    assert_exact_stream(&fake.stream_for("_filament_stg_t_"), 0..batches * 10);
    recorded_retries(gw).await
}

/// Three streams with more batches queued than their windows hold: one stream keeps four
/// appends in flight, and the gateway eight in all (the defaults), the streams sharing them.
#[tokio::test(flavor = "multi_thread")]
async fn at_most_four_appends_per_stream_and_eight_in_all_are_in_flight() {
    let (fake, gw) = answers_held(&["a", "b", "c"]).await;
    // Stream a fills its window of 4 first, so the limits are observed deterministically: the
    // other two streams then share the remaining 4 of the 8 gateway-wide slots.
    post_batches_of_ten(&gw, "a", 0..10).await;
    eventually(Duration::from_secs(30), "stream a to hold a full window", || async {
        let held = fake.with(|s| {
            s.outstanding_per_stream
                .iter()
                .filter(|(name, _)| name.contains("_filament_stg_a_"))
                .map(|(_, n)| *n)
                .sum::<usize>()
        });
        (held == 4).then_some(())
    })
    .await;
    for batch in 0..10 {
        for resource in ["b", "c"] {
            post_ids(&gw, resource, batch * 10..batch * 10 + 10).await;
        }
    }
    // Every batch is queued; now let the fake answer, one request per 100 ms per stream.
    fake.with(|s| s.hold_responses = false);
    commit(&gw).await;
    for resource in ["a", "b", "c"] {
        assert_exact_stream(&fake.stream_for(&format!("_filament_stg_{resource}_")), 0..100);
    }
    fake.with(|s| {
        assert_eq!(s.max_outstanding_per_stream, 4, "the window is 4 per stream and it is used");
        assert!(s.max_outstanding_total <= 8, "at most 8 appends in flight overall: {}", s.max_outstanding_total);
        assert!(s.max_outstanding_total > 4, "several streams upload at once: {}", s.max_outstanding_total);
    });
}

/// The log of an upload: the writer's settings once (gzip at ISA-L's level 1, the windows), the
/// stages of each resource, and per append its rows, bytes and where its time went.
#[tokio::test(flavor = "multi_thread")]
async fn an_upload_logs_the_writers_settings_its_stages_and_each_appends_timing() {
    let fake = FakeWrite::start().await;
    let gw = GatewayOptions::new().fake_write(&fake).spawn().await;
    let _retries = load_in_batches_of_ten(&gw, &fake, 2).await;
    let logs = gw.logs();
    for event in ["bigquery.write.ready", "bigquery.write.prepare.started", "bigquery.write.publish.started"] {
        assert!(logs.contains(event), "missing {event}");
    }
    let ready = logs.lines().find(|l| l.contains("bigquery.write.ready")).unwrap();
    for field in ["compression=gzip-isal-1", "inflight_per_stream=4", "max_inflight_requests=8"] {
        assert!(ready.split_whitespace().any(|word| word == field), "{field} in {ready}");
    }
    let timing = logs
        .lines()
        .find(|l| l.contains("bigquery.write.timing") && l.contains("phase=\"append\""))
        .expect("append timing");
    for field in ["rows=10", "uncompressed_bytes=", "send_ms=", "response_wait_ms="] {
        assert!(timing.contains(field), "{field} in {timing}");
    }
    assert!(logs.lines().any(|l| l.contains("bigquery.write.timing") && l.contains("backpressure_ms=")));
}

#[tokio::test(flavor = "multi_thread")]
async fn the_window_refills_per_acknowledgement() {
    let (fake, gw) = answers_held(&["t"]).await;
    post_batches_of_ten(&gw, "t", 0..12).await;
    fake.with(|s| s.hold_responses = false);
    commit(&gw).await;
    assert_exact_stream(&fake.stream_for("_filament_stg_t_"), 0..120);
    // Every batch was queued before the fake answered its first request, then it answered one
    // per 100 ms: a window refilled per acknowledgement sends each new request while three are
    // still outstanding; one that waited for all four would send to an empty stream.
    let arrivals: Vec<usize> = fake.with(|s| s.outstanding_at_arrival.iter().map(|(_, before)| *before).collect());
    assert_eq!(arrivals.len(), 12);
    assert_eq!(&arrivals[..4], &[0, 1, 2, 3], "the window fills to four");
    assert!(arrivals[4..].iter().all(|before| *before == 3), "refilled one by one: {arrivals:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn resources_set_up_at_once_stay_within_the_maximum() {
    let fake = FakeWrite::start().await;
    fake.with(|s| s.create_delay = Duration::from_millis(400));
    let gw = fast_retries_on(&fake).env("FILAMENT_MAX_CONCURRENT_SET_UPS", "8").spawn().await;
    let resources: Vec<String> = (0..12).map(|i| format!("r{i}")).collect();
    let names: Vec<&str> = resources.iter().map(String::as_str).collect();
    TestRun::new("run", "e").full_append(&names).open(&gw).await;
    for resource in &names {
        post_ids(&gw, resource, 0..5).await;
    }
    commit(&gw).await;
    let max = fake.with(|s| s.max_creates_in_progress);
    assert!((2..=8).contains(&max), "stream creations in parallel: {max}");
    assert_eq!(fake.with(|s| s.streams.len()), 12);
}

#[tokio::test(flavor = "multi_thread")]
async fn lost_responses_and_dropped_connections_neither_lose_nor_duplicate_rows() {
    let fake = FakeWrite::start().await;
    fake.with(|s| s.table_delays.push((String::new(), Duration::from_millis(20))));
    fake.script([
        AppendFault::Delay(Duration::ZERO),
        AppendFault::DropResponseAfterApply,
        AppendFault::Delay(Duration::ZERO),
        AppendFault::Delay(Duration::ZERO),
        AppendFault::InResponseError(13),
        AppendFault::Delay(Duration::ZERO),
        AppendFault::CloseBeforeApply,
        AppendFault::Delay(Duration::ZERO),
        AppendFault::DropResponseAfterApply,
        AppendFault::Status(tonic::Code::ResourceExhausted),
    ]);
    let gw = fast_retries_on(&fake).spawn().await;
    let retries = load_in_batches_of_ten(&gw, &fake, 20).await;
    assert!(fake.with(|s| s.connections) >= 4, "each failure reconnected");
    assert!(attempts_retried(&retries) >= 4, "{retries:?}");
    assert!(retries.iter().all(|event| event["detail"]["retryable"] == true), "{retries:?}");
    let metrics = gw.metrics().await;
    for name in [
        "filament_append_retries_total{code=\"UNAVAILABLE\"}",
        "filament_append_retries_total{code=\"INTERNAL\"}",
        "filament_appends_total{outcome=\"already_present\"}",
        "filament_bytes_appended_total",
        "filament_append_latency_seconds",
        "filament_appends_in_flight 0",
        "filament_upload_budget_bytes_in_use 0",
    ] {
        assert!(metrics.contains(name), "missing {name} in\n{metrics}");
    }
}

/// A connection that stays open but stops answering (a hung server, a half-dead proxy) is
/// replaced once the oldest request has waited `FILAMENT_APPEND_RESPONSE_TIMEOUT_SECS`; the
/// unanswered request had landed, its replay is answered `ALREADY_EXISTS`.
#[tokio::test(flavor = "multi_thread")]
async fn a_connection_that_stops_answering_is_replaced_without_losing_or_duplicating_rows() {
    let fake = FakeWrite::start().await;
    fake.script([AppendFault::Delay(Duration::ZERO), AppendFault::HangAfterApply]);
    let gw = fast_retries_on(&fake).env("FILAMENT_APPEND_RESPONSE_TIMEOUT_SECS", "2").spawn().await;
    let retries = load_in_batches_of_ten(&gw, &fake, 6).await;
    assert_eq!(fake.with(|s| s.connections), 2, "the silent connection was replaced once");
    assert_eq!(attempts_retried(&retries), 1, "{retries:?}");
    assert_eq!(retries[0]["detail"]["code"], "timeout", "{retries:?}");
}

/// A peer that stops reading an AppendRows call (its HTTP/2 flow-control window stays shut)
/// holds the requests behind the one it read: once one has waited
/// `FILAMENT_APPEND_SEND_TIMEOUT_SECS` to be sent, the connection is replaced and the
/// unacknowledged requests replayed at their offsets.
#[tokio::test(flavor = "multi_thread")]
async fn a_connection_whose_peer_stops_reading_is_replaced_without_losing_or_duplicating_rows() {
    let fake = FakeWrite::start().await;
    fake.with(|s| s.stall_reading_connections = 1);
    let gw = fast_retries_on(&fake)
        // Uncompressed, so each request (1.6 MB) is more than the fake's 1 MiB HTTP/2 window.
        .env("FILAMENT_APPEND_GZIP_LEVEL", "0")
        .env("FILAMENT_APPEND_SEND_TIMEOUT_SECS", "2")
        .spawn()
        .await;
    TestRun::new("run", "e").batching(json!({"max_rows": 100_000})).full_append(&["t"]).open(&gw).await;
    for part in 0..6 {
        post_ids(&gw, "t", part * 100_000..(part + 1) * 100_000).await;
    }
    commit(&gw).await;
    assert_exact_stream(&fake.stream_for("_filament_stg_t_"), 0..600_000);
    let retries = recorded_retries(&gw).await;
    assert!(attempts_retried(&retries) >= 1, "the stalled send was retried: {retries:?}");
    assert!(retries.iter().all(|event| event["detail"]["code"] == "timeout"), "only send timeouts: {retries:?}");
    assert!(fake.with(|s| s.connections) >= 2, "the stalled connection was replaced");
}

/// The routing header of every Storage Write call: AppendRows names its stream as it is (as
/// Google's Python writer and BigQuery's documentation write it), unary calls URL-encode the
/// resource they name (as Google's Go and Java clients do).
#[tokio::test(flavor = "multi_thread")]
async fn storage_write_calls_carry_googles_routing_headers() {
    let fake = FakeWrite::start().await;
    let gw = GatewayOptions::new().fake_write(&fake).spawn().await;
    let _retries = load_in_batches_of_ten(&gw, &fake, 1).await;
    let stream = fake.with(|s| s.streams.keys().next().cloned()).unwrap();
    let headers = fake.with(|s| s.routing_headers.clone());
    let of = |method: &str| headers.iter().filter(|(m, _)| m == method).map(|(_, h)| h.clone()).collect::<Vec<_>>();
    assert_eq!(of("AppendRows"), [format!("write_stream={stream}")], "{headers:?}");
    let (table, _) = stream.rsplit_once("/streams/").unwrap();
    assert_eq!(of("CreateWriteStream"), [format!("parent={}", table.replace('/', "%2F"))], "{headers:?}");
    assert_eq!(of("FinalizeWriteStream"), [format!("name={}", stream.replace('/', "%2F"))], "{headers:?}");
    assert_eq!(of("BatchCommitWriteStreams"), [format!("parent={}", table.replace('/', "%2F"))], "{headers:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn permanent_append_errors_fail_the_execution_without_a_retry() {
    let cases = [
        (AppendFault::InResponseError(3), "INVALID_ARGUMENT"),
        (AppendFault::InResponseError(11), "OUT_OF_RANGE"),
        (AppendFault::Status(tonic::Code::PermissionDenied), "PERMISSION_DENIED"),
    ];
    for (fault, name) in cases {
        let fake = FakeWrite::start().await;
        fake.script([fault]);
        let gw = fast_retries_on(&fake).spawn().await;
        TestRun::new("run", "e").full_append(&["t"]).open(&gw).await;
        post_ids(&gw, "t", 0..10).await;
        let (status, body) = gw.json(Method::POST, "/v1/runs/run/executions/e/commit?wait=true", None).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        assert_eq!(body["state"], "failed", "{name}: {body}");
        let expected = if name == "PERMISSION_DENIED" { "permission_denied" } else { "upload_failed" };
        assert_eq!(body["error"]["code"], expected, "{name}: {body}");
        let retries = recorded_retries(&gw).await;
        assert_eq!(attempts_retried(&retries), 1, "{name}: {retries:?}");
        assert_eq!(retries[0]["detail"]["retryable"], false, "{name}: the failure is recorded as permanent");
        assert_eq!(fake.with(|s| s.append_requests), 1, "{name}: no retry of a permanent error");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_slow_table_does_not_stall_a_fast_one() {
    let fake = FakeWrite::start().await;
    fake.with(|s| s.table_delays.push(("_filament_stg_slow_".into(), Duration::from_millis(400))));
    let gw = fast_retries_on(&fake).spawn().await;
    open_with_batches_of_ten(&gw, &["slow", "fast"]).await;
    post_batches_of_ten(&gw, "slow", 0..8).await;
    post_batches_of_ten(&gw, "fast", 0..40).await;
    // Poll until the fast table is fully acknowledged; the slow one must still be uploading.
    let progress = eventually(Duration::from_secs(30), "the fast table to be fully acknowledged", || async {
        let (status, execution) = gw.json(Method::GET, "/v1/runs/run/executions/e", None).await;
        assert_eq!(status, StatusCode::OK, "{execution}");
        let resources = execution["resources"].as_array().unwrap();
        let get = |name: &str| resources.iter().find(|r| r["resource"] == name).cloned().unwrap();
        let (fast, slow) = (get("fast"), get("slow"));
        (fast["rows_acknowledged"] == fast["rows_received"]).then_some(slow)
    })
    .await;
    assert!(
        progress["rows_acknowledged"].as_i64().unwrap() < progress["rows_received"].as_i64().unwrap(),
        "the fast table finished first: {progress}"
    );
    commit(&gw).await;
    assert_exact_stream(&fake.stream_for("_filament_stg_fast_"), 0..400);
    assert_exact_stream(&fake.stream_for("_filament_stg_slow_"), 0..80);
}

#[tokio::test(flavor = "multi_thread")]
async fn connections_cut_mid_stream_to_the_emulator_still_load_every_row_once() {
    // A private emulator: a connection cut in the middle of an append may leave it unusable.
    let emulator = PrivateEmulator::start().await;
    // Cut the first two connections after 200 KB and 150 KB (gzip-compressed) sent toward the emulator.
    let proxy = CuttingProxy::start(&emulator.grpc, vec![200_000, 150_000]).await;
    let gw = GatewayOptions::new()
        .rest_host(&emulator.rest)
        .storage_write_host(&proxy.address)
        .bigquery_initial_backoff(Duration::from_millis(50))
        .spawn()
        .await;
    TestRun::new("run", "e").batching(json!({"max_rows": 5000})).full_append(&["t"]).open(&gw).await;
    for batch in 0..40 {
        post_ids(&gw, "t", batch * 5000..(batch + 1) * 5000).await;
    }
    let committed = gw.commit_and_wait("run", "e").await;
    assert_eq!(committed["state"], "committed", "{committed}\n{}", gw.logs());
    assert!(proxy.cuts() >= 2, "the proxy cut {} connections", proxy.cuts());
    let counts =
        gw.query(&format!("SELECT COUNT(*), COUNT(DISTINCT id), MIN(id), MAX(id) FROM {}.t", gw.dataset)).await;
    let counts: Vec<i64> = counts[0].iter().map(int).collect();
    assert_eq!(counts, [200_000, 200_000, 0, 199_999]);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_lost_commit_response_is_resolved_by_asking_bigquery() {
    let fake = FakeWrite::start().await;
    fake.with(|s| s.lose_commit_response = true);
    let gw = fast_retries_on(&fake).spawn().await;
    TestRun::new("run", "e").full_append(&["t"]).open(&gw).await;
    post_ids(&gw, "t", 0..50).await;
    commit(&gw).await;
    assert_eq!(fake.with(|s| s.get_write_stream_calls), 1, "the commit was checked, not redone");
    assert_exact_stream(&fake.stream_for("_filament_stg_t_"), 0..50);
}

#[tokio::test(flavor = "multi_thread")]
async fn commit_refuses_pending_streams_older_than_the_limit() {
    let fake = FakeWrite::start().await;
    let gw = fast_retries_on(&fake).env("FILAMENT_PENDING_STREAM_MAX_AGE_SECS", "0").spawn().await;
    TestRun::new("run", "e").full_append(&["t"]).open(&gw).await;
    post_ids(&gw, "t", 0..5).await;
    // Once the store records the stream's creation, the stream is older than 0 s.
    eventually(Duration::from_secs(10), "the store to record the lane's write stream", || async {
        (recorded_streams(&gw).await > 0).then_some(())
    })
    .await;
    let (status, body) = gw.json(Method::POST, "/v1/runs/run/executions/e/commit", None).await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert_eq!(body["code"], "pending_stream_expired");
    let (_, execution) = gw.json(Method::GET, "/v1/runs/run/executions/e", None).await;
    assert_eq!(execution["state"], "failed");
    assert_eq!(execution["error"]["code"], "pending_stream_expired");
    assert!(!fake.stream_for("_filament_stg_t_").committed);
}

/// Write streams the gateway's store records as created.
async fn recorded_streams(gw: &Gateway) -> i64 {
    use sqlx::Connection as _;
    let mut db = sqlx::PgConnection::connect(&gw.database_url).await.unwrap();
    sqlx::query_scalar("SELECT COUNT(*) FROM staging_streams WHERE stream_created_at IS NOT NULL")
        .fetch_one(&mut db)
        .await
        .unwrap()
}

/// The run's batch size bounds every AppendRows request, also those of one body larger than it.
#[tokio::test(flavor = "multi_thread")]
async fn a_body_of_more_rows_than_the_runs_batch_size_is_appended_in_requests_of_that_size() {
    let fake = FakeWrite::start().await;
    let gw = GatewayOptions::new().fake_write(&fake).spawn().await;
    TestRun::new("run", "e").batching(json!({"max_rows": 1000})).full_append(&["t"]).open(&gw).await;
    post_ids(&gw, "t", 0..2500).await;
    commit(&gw).await;
    let stream = fake.stream_for("_filament_stg_t_");
    assert_exact_stream(&stream, 0..2500);
    let rows_per_request: Vec<usize> = stream.appends.iter().map(|(_, rows)| *rows).collect();
    assert_eq!(rows_per_request, [1000, 1000, 500]);
}

/// `bigquery.write.timing` of an operation shorter than a second is DEBUG, of a longer one
/// INFO: at the default `info` level only the slow ones are logged.
#[tokio::test(flavor = "multi_thread")]
async fn only_operations_of_a_second_or_more_log_their_timing_at_info() {
    let fake = FakeWrite::start().await;
    fake.with(|s| s.table_delays.push(("_filament_stg_slow_".into(), Duration::from_millis(1500))));
    let gw = GatewayOptions::new().fake_write(&fake).env("RUST_LOG", "info").spawn().await;
    TestRun::new("run", "e").full_append(&["slow", "fast"]).open(&gw).await;
    post_ids(&gw, "slow", 0..5).await;
    post_ids(&gw, "fast", 0..5).await;
    commit(&gw).await;
    let logs = gw.logs();
    let appends: Vec<&str> =
        logs.lines().filter(|l| l.contains("bigquery.write.timing") && l.contains("phase=\"append\"")).collect();
    assert!(appends.iter().any(|l| l.contains("resource=slow") && l.contains("INFO")), "{appends:?}");
    assert!(!appends.iter().any(|l| l.contains("resource=fast")), "a fast append logs at DEBUG: {appends:?}");
}
