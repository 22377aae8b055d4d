//! Logging set-up and the Prometheus metrics the gateway exports. Metric names live here so
//! that `/metrics` and `docs/` have one source; stages record through the `metrics` facade.

use std::sync::OnceLock;

use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use tracing_subscriber::EnvFilter;

pub const HTTP_REQUESTS: &str = "filament_http_requests_total";
pub const ROWS_RECEIVED: &str = "filament_rows_received_total";
pub const BYTES_RECEIVED: &str = "filament_bytes_received_total";
pub const BATCHES_QUEUED: &str = "filament_batches_queued_total";
pub const APPENDS: &str = "filament_appends_total";
pub const ROWS_APPENDED: &str = "filament_rows_appended_total";
pub const PUBLICATIONS: &str = "filament_publications_total";
pub const EXECUTIONS_FINISHED: &str = "filament_executions_finished_total";
pub const BYTES_APPENDED: &str = "filament_bytes_appended_total";
pub const APPENDS_IN_FLIGHT: &str = "filament_appends_in_flight";
pub const BUDGET_BYTES_IN_USE: &str = "filament_upload_budget_bytes_in_use";
pub const BACKPRESSURE_WAITS: &str = "filament_backpressure_waits_total";
pub const BACKPRESSURE_REJECTIONS: &str = "filament_backpressure_rejections_total";
pub const APPEND_RETRIES: &str = "filament_append_retries_total";
pub const APPEND_LATENCY: &str = "filament_append_latency_seconds";

/// Logs go to stderr (stdout carries the start-up line with the bound address). `RUST_LOG`
/// overrides the default `info` filter.
pub fn init_logging(format: &str) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    use std::io::IsTerminal as _;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal());
    // A second initialisation (tests) keeps the first subscriber.
    let _ = if format == "json" { builder.json().try_init() } else { builder.try_init() };
}

/// Installs the Prometheus recorder once per process and returns the handle `/metrics` renders.
pub fn metrics_handle() -> PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let recorder = PrometheusBuilder::new().build_recorder();
            let handle = recorder.handle();
            // Fails only when another recorder is installed; the handle still renders ours.
            let _ = metrics::set_global_recorder(recorder);
            describe();
            handle
        })
        .clone()
}

fn describe() {
    use metrics::{Unit, describe_counter, describe_gauge, describe_histogram};
    describe_counter!(HTTP_REQUESTS, "HTTP requests answered, by method, route and status");
    describe_counter!(ROWS_RECEIVED, Unit::Count, "Rows accepted in batch requests");
    describe_counter!(
        BYTES_RECEIVED,
        Unit::Bytes,
        "Arrow IPC bytes accepted in batch requests (after content decoding)"
    );
    describe_counter!(BATCHES_QUEUED, Unit::Count, "Batch requests accepted and queued for upload");
    describe_counter!(APPENDS, Unit::Count, "AppendRows requests, by outcome");
    describe_counter!(ROWS_APPENDED, Unit::Count, "Rows acknowledged by BigQuery");
    describe_counter!(PUBLICATIONS, Unit::Count, "Publication query jobs, by outcome");
    describe_counter!(BYTES_APPENDED, Unit::Bytes, "Uncompressed Arrow bytes acknowledged by BigQuery");
    describe_gauge!(APPENDS_IN_FLIGHT, Unit::Count, "AppendRows requests sent and not yet answered, gateway-wide");
    describe_gauge!(
        BUDGET_BYTES_IN_USE,
        Unit::Bytes,
        "Encoded payload bytes queued or in flight (bounded by the upload budget)"
    );
    describe_counter!(BACKPRESSURE_WAITS, Unit::Count, "Batch requests that waited for the upload budget");
    describe_counter!(
        BACKPRESSURE_REJECTIONS,
        Unit::Count,
        "Batch requests answered 429 because the budget stayed full"
    );
    describe_counter!(APPEND_RETRIES, Unit::Count, "Failed AppendRows attempts that were retried, by gRPC code");
    describe_histogram!(APPEND_LATENCY, Unit::Seconds, "From sending an AppendRows request to its response");
    describe_counter!(EXECUTIONS_FINISHED, Unit::Count, "Executions that reached a terminal state, by state");
}
