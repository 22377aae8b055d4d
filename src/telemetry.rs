//! Logging set-up, the Prometheus metrics the gateway exports, and its telemetry events.
//! Metric names live here so that `/metrics` and `docs/` have one source; stages record through
//! the `metrics` facade. An event that is both a log line and metrics is a small struct whose
//! `emit()` writes both (vector's internal events), so the rules (which level, which labels)
//! are written once.

use std::sync::OnceLock;
use std::time::Duration;

use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use tracing_subscriber::EnvFilter;

use crate::config::LogFormat;

mod metric_events;

pub(crate) use metric_events::*;

pub(crate) const HTTP_REQUESTS: &str = "filament_http_requests_total";
pub(crate) const HTTP_CONNECTIONS_CLOSED: &str = "filament_http_connections_closed_total";
pub(crate) const HTTP_CONNECTIONS_REFUSED: &str = "filament_http_connections_refused_total";
pub(crate) const REQUESTS_FORWARDED: &str = "filament_requests_forwarded_total";
pub(crate) const ROWS_RECEIVED: &str = "filament_rows_received_total";
pub(crate) const BYTES_RECEIVED: &str = "filament_bytes_received_total";
pub(crate) const BATCHES_QUEUED: &str = "filament_batches_queued_total";
pub(crate) const APPENDS: &str = "filament_appends_total";
pub(crate) const ROWS_APPENDED: &str = "filament_rows_appended_total";
pub(crate) const PUBLICATIONS: &str = "filament_publications_total";
pub(crate) const EXECUTIONS_FINISHED: &str = "filament_executions_finished_total";
pub(crate) const BYTES_APPENDED: &str = "filament_bytes_appended_total";
pub(crate) const APPENDS_IN_FLIGHT: &str = "filament_appends_in_flight";
pub(crate) const APPEND_CONNECTIONS_OPEN: &str = "filament_append_connections_open";
pub(crate) const BUDGET_BYTES_IN_USE: &str = "filament_upload_budget_bytes_in_use";
pub(crate) const APPEND_SEND_QUEUE_BYTES: &str = "filament_append_send_queue_bytes";
pub(crate) const RECEIVE_BUDGET_BYTES_IN_USE: &str = "filament_receive_budget_bytes_in_use";
/// The two budgets' capacities (`FILAMENT_MAX_BUFFERED_BYTES`, `FILAMENT_MAX_RECEIVING_BYTES`).
pub(crate) const UPLOAD_BUDGET_BYTES: &str = "filament_upload_budget_bytes";
pub(crate) const RECEIVE_BUDGET_BYTES: &str = "filament_receive_budget_bytes";
/// The priced plan at the commit barrier (`publish::pricing`): dry-run bytes, query jobs
/// planned, plans judged against the budgets by `outcome`, publications left unpriced.
pub(crate) const PLAN_BYTES_PROCESSED: &str = "filament_plan_bytes_processed_total";
pub(crate) const PLAN_QUERY_JOBS: &str = "filament_plan_query_jobs_total";
pub(crate) const PLANS: &str = "filament_plans_total";
pub(crate) const PLAN_UNPRICED: &str = "filament_plan_unpriced_total";
/// The allocator's own figures, read when `/metrics` is scraped (`metric_events::allocator_read`).
pub(crate) const ALLOCATOR_ALLOCATED_BYTES: &str = "filament_allocator_allocated_bytes";
pub(crate) const ALLOCATOR_RESIDENT_BYTES: &str = "filament_allocator_resident_bytes";
pub(crate) const ALLOCATOR_RETAINED_BYTES: &str = "filament_allocator_retained_bytes";
/// The pool of received messages' buffers (`ingest::message_buffers`), by `state`: lent or idle.
pub(crate) const MESSAGE_BUFFERS_BYTES: &str = "filament_message_buffers_bytes";
pub(crate) const BACKPRESSURE_WAITS: &str = "filament_backpressure_waits_total";
pub(crate) const BACKPRESSURE_REJECTIONS: &str = "filament_backpressure_rejections_total";
pub(crate) const APPEND_RETRIES: &str = "filament_append_retries_total";
pub(crate) const BIGQUERY_RETRIES: &str = "filament_bigquery_retries_total";
pub(crate) const BIGQUERY_CONCURRENCY_LIMIT: &str = "filament_bigquery_concurrency_limit";
pub(crate) const BIGQUERY_CONCURRENCY_IN_FLIGHT: &str = "filament_bigquery_concurrency_in_flight";
pub(crate) const BIGQUERY_CONCURRENCY_DECREASES: &str = "filament_bigquery_concurrency_decreases_total";
pub(crate) const QUOTA_RATE: &str = "filament_bigquery_quota_rate_per_second";
pub(crate) const QUOTA_WAITING: &str = "filament_bigquery_quota_waiting";
pub(crate) const QUOTA_IN_FLIGHT: &str = "filament_bigquery_quota_in_flight";
pub(crate) const QUOTA_REFUSALS: &str = "filament_bigquery_quota_refusals_total";
pub(crate) const FLEET_REPLICAS: &str = "filament_fleet_replicas";
pub(crate) const FAIR_QUEUE_CALLS_WAITING: &str = "filament_fair_queue_calls_waiting";
pub(crate) const FAIR_QUEUE_PRINCIPALS_WAITING: &str = "filament_fair_queue_principals_waiting";
pub(crate) const PRINCIPAL_CAP_PLACES_HELD: &str = "filament_principal_cap_places_held";
pub(crate) const PRINCIPAL_CAP_REFUSALS: &str = "filament_principal_cap_refusals_total";
/// Spans the exporter's bounded queue dropped (named beside the exporter, in `traces`).
pub(crate) use crate::traces::TRACE_SPANS_DROPPED;
pub(crate) const APPEND_LATENCY: &str = "filament_append_latency_seconds";
pub(crate) const HTTP_REQUEST_DURATION: &str = "filament_http_request_duration_seconds";
pub(crate) const PUBLICATION_DURATION: &str = "filament_publication_duration_seconds";
/// Refused reloads of the principals file and of the TLS pair; refused credentials by reason.
pub(crate) const PRINCIPALS_RELOAD_ERRORS: &str = "filament_principals_reload_errors_total";
pub(crate) const TLS_RELOAD_ERRORS: &str = "filament_tls_reload_errors_total";
pub(crate) const AUDIT_DENIALS: &str = "filament_audit_denials_total";
pub(crate) const PUBLICATION_BYTES_BILLED: &str = "filament_publication_bytes_billed_total";

/// Operations at least this long are logged at INFO, shorter ones at DEBUG.
pub(crate) const SLOW_OPERATION: Duration = Duration::from_secs(1);

/// Logs at INFO when `$duration` reaches [`SLOW_OPERATION`], at DEBUG otherwise.
macro_rules! log_by_duration {
    ($duration:expr, $($event:tt)+) => {
        if $duration >= SLOW_OPERATION {
            tracing::info!($($event)+)
        } else {
            tracing::debug!($($event)+)
        }
    };
}

fn millis(duration: Duration) -> u64 {
    duration.as_millis() as u64
}

/// `http.connection_closing`: the gateway closes a client connection for one of its limits
/// (`http::server`), counted by reason.
#[derive(Debug)]
pub(crate) struct ConnectionClosing {
    pub(crate) reason: &'static str,
}

impl ConnectionClosing {
    pub(crate) fn emit(&self) {
        metrics::counter!(HTTP_CONNECTIONS_CLOSED, "reason" => self.reason).increment(1);
        tracing::debug!(reason = self.reason, "http.connection_closing");
    }
}

/// `http.connection_refused`: a client connection closed as it was accepted, counted by reason
/// (the peer's address only in the log line).
#[derive(Debug)]
pub(crate) struct ConnectionRefused {
    pub(crate) reason: &'static str,
    pub(crate) peer: std::net::SocketAddr,
}

impl ConnectionRefused {
    pub(crate) fn emit(&self) {
        metrics::counter!(HTTP_CONNECTIONS_REFUSED, "reason" => self.reason).increment(1);
        tracing::debug!(reason = self.reason, peer = %self.peer.ip(), "http.connection_refused");
    }
}

/// `bigquery.write.timing` of one phase of one resource (set_up, ...).
#[derive(Debug)]
pub(crate) struct PhaseTiming<'a> {
    pub(crate) resource: &'a str,
    pub(crate) phase: &'static str,
    pub(crate) duration: Duration,
}

impl PhaseTiming<'_> {
    pub(crate) fn emit(&self) {
        let (resource, phase, duration_ms) = (self.resource, self.phase, millis(self.duration));
        log_by_duration!(self.duration, %resource, phase, duration_ms, "bigquery.write.timing");
    }
}

/// `bigquery.write.timing` of one publication job, with what it cost and where; and the bytes
/// billed counted in all (no client-chosen name is a metric label: `/metrics` needs no
/// credential, and a label per table would add a series per table for ever).
#[derive(Debug)]
pub(crate) struct PublishTiming<'a> {
    pub(crate) resource: &'a str,
    pub(crate) dataset: &'a str,
    pub(crate) table: &'a str,
    pub(crate) duration: Duration,
    pub(crate) cost: Option<&'a crate::model::JobCost>,
}

impl PublishTiming<'_> {
    pub(crate) fn emit(&self) {
        let cost = self.cost.cloned().unwrap_or_default();
        if let Some(billed) = cost.bytes_billed.filter(|b| *b > 0) {
            metrics::counter!(PUBLICATION_BYTES_BILLED).increment(billed as u64);
        }
        let (resource, dataset, table, duration_ms) = (self.resource, self.dataset, self.table, millis(self.duration));
        let (bytes_processed, bytes_billed, slot_ms) = (cost.bytes_processed, cost.bytes_billed, cost.slot_ms);
        let (rows_inserted, rows_updated, rows_deleted) = (cost.rows_inserted, cost.rows_updated, cost.rows_deleted);
        log_by_duration!(self.duration, %resource, dataset, table, phase = "publish", duration_ms, bytes_processed,
            bytes_billed, slot_ms, rows_inserted, rows_updated, rows_deleted, "bigquery.write.timing");
    }
}

/// `bigquery.write.timing` of a batch request from its admission until its bytes are in the
/// budget (`duration_ms`, decoding included), and the part of it spent in waits that end in 429
/// when they last too long (`backpressure_ms`: the resource's share, a decode slot, the budget).
#[derive(Debug)]
pub(crate) struct QueueTiming<'a> {
    pub(crate) resource: &'a str,
    pub(crate) rows: usize,
    pub(crate) duration: Duration,
    pub(crate) backpressure: Duration,
}

impl QueueTiming<'_> {
    pub(crate) fn emit(&self) {
        let (resource, rows, duration_ms, backpressure_ms) =
            (self.resource, self.rows, millis(self.duration), millis(self.backpressure));
        log_by_duration!(self.duration, %resource, phase = "queue", duration_ms, backpressure_ms, rows,
            "bigquery.write.timing");
    }
}

/// One AppendRows request BigQuery acknowledged: the append metrics and its
/// `bigquery.write.timing`.
#[derive(Debug)]
pub(crate) struct AppendAcknowledged<'a> {
    pub(crate) resource: &'a str,
    pub(crate) rows: usize,
    pub(crate) uncompressed_bytes: usize,
    /// The rows were already in the stream (a resend after a lost response).
    pub(crate) already_present: bool,
    pub(crate) send: Duration,
    pub(crate) response_wait: Duration,
}

impl AppendAcknowledged<'_> {
    pub(crate) fn emit(&self) {
        metrics::histogram!(APPEND_LATENCY).record(self.response_wait.as_secs_f64());
        let outcome = if self.already_present { "already_present" } else { "appended" };
        metrics::counter!(APPENDS, "outcome" => outcome).increment(1);
        metrics::counter!(ROWS_APPENDED).increment(self.rows as u64);
        metrics::counter!(BYTES_APPENDED).increment(self.uncompressed_bytes as u64);
        let duration = self.send + self.response_wait;
        let (resource, rows, uncompressed_bytes) = (self.resource, self.rows, self.uncompressed_bytes);
        let (duration_ms, send_ms, response_wait_ms) =
            (millis(duration), millis(self.send), millis(self.response_wait));
        log_by_duration!(duration, %resource, phase = "append", duration_ms, rows, uncompressed_bytes, send_ms,
            response_wait_ms, "bigquery.write.timing");
    }
}

/// `bigquery.write.set_up` with `layout_mismatch`: the existing destination table is laid out
/// otherwise than its resource declares. The table is left as it is and loading goes on.
#[derive(Debug)]
pub(crate) struct LayoutMismatch<'a> {
    pub(crate) run_id: &'a str,
    pub(crate) execution_id: &'a str,
    pub(crate) resource: &'a str,
    pub(crate) table: &'a str,
    pub(crate) differences: &'a [crate::model::table_layout::LayoutDifference],
}

impl LayoutMismatch<'_> {
    pub(crate) fn emit(&self) {
        let (run_id, execution_id, resource, table) = (self.run_id, self.execution_id, self.resource, self.table);
        let described: Vec<String> = self
            .differences
            .iter()
            .map(|d| format!("{}: table has {}, declared {}", d.option, d.table, d.declared))
            .collect();
        let layout_mismatch = described.join("; ");
        tracing::warn!(run_id, execution_id, resource, table, %layout_mismatch, "bigquery.write.set_up");
    }
}

/// Logs go to stderr (stdout carries the start-up line with the bound address). `RUST_LOG`
/// overrides the default `info` filter. `traces`, when configured (`crate::traces`), exports
/// the trace spans beside the logs (the log filter does not apply to them, nor theirs to logs).
pub fn init_logging(format: LogFormat, traces: Option<&opentelemetry_sdk::trace::SdkTracerProvider>) {
    use std::io::IsTerminal as _;
    use tracing_subscriber::Layer as _;
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let logs = tracing_subscriber::fmt::layer().with_writer(std::io::stderr).with_ansi(std::io::stderr().is_terminal());
    let logs = match format {
        LogFormat::Json => logs.json().with_filter(filter).boxed(),
        LogFormat::Text => logs.with_filter(filter).boxed(),
    };
    let traces = traces.map(crate::traces::layer);
    // A second initialisation (tests) keeps the first subscriber.
    let _ = tracing_subscriber::registry().with(logs).with(traces).try_init();
}

/// Installs the Prometheus recorder once per process and returns the handle `/metrics` renders.
pub(crate) fn metrics_handle() -> PrometheusHandle {
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
    use metrics::{Unit, describe_counter, describe_gauge};
    describe_counter!(HTTP_REQUESTS, "HTTP requests answered, by method, route and status");
    describe_counter!(
        HTTP_CONNECTIONS_CLOSED,
        Unit::Count,
        "Client connections the gateway closed for a limit, by reason"
    );
    describe_counter!(
        HTTP_CONNECTIONS_REFUSED,
        Unit::Count,
        "Client connections closed as they were accepted, by reason"
    );
    describe_counter!(REQUESTS_FORWARDED, "Requests streamed to the replica serving their execution");
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
        "Encoded payload bytes queued or in flight, plus compressed frames waiting to be sent (the upload budget)"
    );
    describe_gauge!(
        APPEND_SEND_QUEUE_BYTES,
        Unit::Bytes,
        "Compressed AppendRows frames queued for HTTP/2 to send, counted in the upload budget"
    );
    describe_gauge!(
        RECEIVE_BUDGET_BYTES_IN_USE,
        Unit::Bytes,
        "Batch body bytes received and decoded, not yet converted (the receive budget)"
    );
    describe_counter!(BACKPRESSURE_WAITS, Unit::Count, "Batch requests that waited for the upload budget");
    describe_counter!(
        BACKPRESSURE_REJECTIONS,
        Unit::Count,
        "Batch requests answered 429 because the budget stayed full"
    );
    describe_counter!(APPEND_RETRIES, Unit::Count, "Failed AppendRows attempts that were retried, by gRPC code");
    describe_counter!(
        BIGQUERY_RETRIES,
        Unit::Count,
        "Failed attempts of any BigQuery call that were retried, by operation and code"
    );
    describe_quotas_and_traces();
    describe_uploads_and_timings();
    describe_plans_and_memory();
}

/// The priced plans at the commit barrier, the budgets' capacities and the allocator.
fn describe_plans_and_memory() {
    use metrics::{Unit, describe_counter, describe_gauge};
    describe_counter!(
        PLAN_BYTES_PROCESSED,
        Unit::Bytes,
        "Bytes the dry runs of planned publication statements reported they would process"
    );
    describe_counter!(PLAN_QUERY_JOBS, Unit::Count, "Query jobs that planned publications will insert");
    describe_counter!(PLANS, Unit::Count, "Commit plans judged against the run's byte budgets, by outcome");
    describe_counter!(PLAN_UNPRICED, Unit::Count, "Planned publications whose statement could not be dry-run");
    describe_gauge!(UPLOAD_BUDGET_BYTES, Unit::Bytes, "The upload budget's capacity (FILAMENT_MAX_BUFFERED_BYTES)");
    describe_gauge!(RECEIVE_BUDGET_BYTES, Unit::Bytes, "The receive budget's capacity (FILAMENT_MAX_RECEIVING_BYTES)");
    describe_gauge!(
        ALLOCATOR_ALLOCATED_BYTES,
        Unit::Bytes,
        "Bytes the gateway's allocations hold (jemalloc stats.allocated)"
    );
    describe_gauge!(
        ALLOCATOR_RESIDENT_BYTES,
        Unit::Bytes,
        "Bytes of the allocator's pages resident in memory, freed pages it keeps included (jemalloc stats.resident)"
    );
    describe_gauge!(
        ALLOCATOR_RETAINED_BYTES,
        Unit::Bytes,
        "Virtual memory the allocator keeps mapped without pages behind it (jemalloc stats.retained)"
    );
    describe_gauge!(
        MESSAGE_BUFFERS_BYTES,
        Unit::Bytes,
        "Capacity of the pooled buffers received messages are joined into, lent (holding a message) or idle"
    );
}

/// The pacers of BigQuery's quotas, the fleet and trace export.
fn describe_quotas_and_traces() {
    use metrics::{Unit, describe_counter, describe_gauge};
    describe_gauge!(QUOTA_RATE, "This replica's pace under a BigQuery rate quota (its fleet share), calls per second");
    describe_gauge!(QUOTA_WAITING, Unit::Count, "Calls waiting for their turn under a BigQuery rate quota");
    describe_gauge!(QUOTA_IN_FLIGHT, Unit::Count, "REST requests in flight under the concurrent API requests quota");
    describe_counter!(QUOTA_REFUSALS, Unit::Count, "Calls BigQuery refused for a rate quota the gateway paces");
    describe_gauge!(
        FLEET_REPLICAS,
        Unit::Count,
        "Live replicas sharing BigQuery's quotas, as this replica counts them (0: its own place lapsed)"
    );
    describe_fairness();
    describe_counter!(
        TRACE_SPANS_DROPPED,
        Unit::Count,
        "Trace spans dropped because the export queue was full or the OTLP endpoint refused them"
    );
}

/// Fair queues and per-principal caps (`bigquery::fair`): labelled by queue or cap, never by
/// principal.
fn describe_fairness() {
    use metrics::{Unit, describe_counter, describe_gauge};
    describe_gauge!(
        FAIR_QUEUE_CALLS_WAITING,
        Unit::Count,
        "Calls queued for their turn at a quota or adaptive limit, by queue (summed over destinations)"
    );
    describe_gauge!(
        FAIR_QUEUE_PRINCIPALS_WAITING,
        Unit::Count,
        "Principals with calls queued at a quota or adaptive limit, by queue (counted once per destination)"
    );
    describe_gauge!(PRINCIPAL_CAP_PLACES_HELD, Unit::Count, "Places held under a per-principal cap, all principals");
    describe_counter!(PRINCIPAL_CAP_REFUSALS, Unit::Count, "Requests refused because their principal held its cap");
}

/// Uploads, publications and HTTP timings.
fn describe_uploads_and_timings() {
    use metrics::{Unit, describe_counter, describe_gauge, describe_histogram};
    describe_histogram!(APPEND_LATENCY, Unit::Seconds, "From sending an AppendRows request to its response");
    describe_gauge!(
        APPEND_CONNECTIONS_OPEN,
        Unit::Count,
        "AppendRows connections held by lanes (at most FILAMENT_MAX_APPEND_CONNECTIONS)"
    );
    describe_gauge!(
        BIGQUERY_CONCURRENCY_LIMIT,
        Unit::Count,
        "Calls to BigQuery allowed at once, by operation (set_up, stream_creation, publication): the adaptive limit"
    );
    describe_gauge!(
        BIGQUERY_CONCURRENCY_IN_FLIGHT,
        Unit::Count,
        "Calls to BigQuery running under the limit, by operation"
    );
    describe_counter!(
        BIGQUERY_CONCURRENCY_DECREASES,
        Unit::Count,
        "Decreases of the adaptive limit, by operation and reason (refusal, latency)"
    );
    describe_counter!(EXECUTIONS_FINISHED, Unit::Count, "Executions that reached a terminal state, by state");
    describe_histogram!(HTTP_REQUEST_DURATION, Unit::Seconds, "From receiving an HTTP request to answering it");
    describe_counter!(
        PUBLICATION_BYTES_BILLED,
        Unit::Bytes,
        "Bytes BigQuery billed for publication jobs, by dataset and table"
    );
    describe_histogram!(
        PUBLICATION_DURATION,
        Unit::Seconds,
        "From submitting a publication job to its end, by outcome (done, failed, unfinished)"
    );
}
