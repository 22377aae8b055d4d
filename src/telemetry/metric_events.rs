//! Every metric the gateway records is changed here, by a function named for what happened
//! (a publication ended, a call joined a fair queue, a batch was queued): the metric names,
//! their labels and their units stay in `telemetry`, and a call site says what happened rather
//! than which series moves. No label holds a tenant, a run or a table. The one exception is
//! the trace exporter's dropped spans, counted in `traces`, which imports nothing of the crate.

use std::time::Duration;

use super::*;

/// How a publication ended: `done`, `unfinished` (its outcome unknown, retried), `failed`,
/// `reused` (a redelivery found it published).
pub(crate) fn publication_ended(outcome: &'static str) {
    metrics::counter!(PUBLICATIONS, "outcome" => outcome).increment(1);
}

/// A publication's job ran for `took`, ending as `outcome`.
pub(crate) fn publication_job_took(outcome: &'static str, took: Duration) {
    metrics::histogram!(PUBLICATION_DURATION, "outcome" => outcome).record(took.as_secs_f64());
}

/// An execution reached its end state (`committed`, `failed`, `aborted`).
pub(crate) fn execution_finished(state: &'static str) {
    metrics::counter!(EXECUTIONS_FINISHED, "state" => state).increment(1);
}

/// A commit's plan was priced: its dry-run bytes, query jobs and unpriced publications.
pub(crate) fn plan_priced(bytes: i64, query_jobs: i32, unpriced: usize) {
    metrics::counter!(PLAN_BYTES_PROCESSED).increment(bytes.max(0) as u64);
    metrics::counter!(PLAN_QUERY_JOBS).increment(query_jobs.max(0) as u64);
    metrics::counter!(PLAN_UNPRICED).increment(unpriced as u64);
}

/// A priced plan was judged against the run's budgets: `within_budget` or `over_budget`.
pub(crate) fn plan_judged(outcome: &'static str) {
    metrics::counter!(PLANS, "outcome" => outcome).increment(1);
}

/// The pipeline's budgets were sized: the upload budget and the receive budget, bytes.
pub(crate) fn budgets_configured(upload_bytes: usize, receive_bytes: usize) {
    metrics::gauge!(UPLOAD_BUDGET_BYTES).set(upload_bytes as f64);
    metrics::gauge!(RECEIVE_BUDGET_BYTES).set(receive_bytes as f64);
}

/// The message buffer pool's capacity lent out and idle (`ingest::message_buffers`).
pub(crate) fn message_buffers(lent_bytes: usize, idle_bytes: usize) {
    metrics::gauge!(MESSAGE_BUFFERS_BYTES, "state" => "lent").set(lent_bytes as f64);
    metrics::gauge!(MESSAGE_BUFFERS_BYTES, "state" => "idle").set(idle_bytes as f64);
}

/// The allocator's figures as of now, for a `/metrics` scrape. Only a process whose global
/// allocator is jemalloc (the gateway's binary) has figures to show; elsewhere they stay 0.
pub(crate) fn allocator_read() {
    use tikv_jemalloc_ctl::{epoch, stats};
    if epoch::advance().is_err() {
        return;
    }
    for (name, read) in [
        (ALLOCATOR_ALLOCATED_BYTES, stats::allocated::read as fn() -> tikv_jemalloc_ctl::Result<usize>),
        (ALLOCATOR_RESIDENT_BYTES, stats::resident::read),
        (ALLOCATOR_RETAINED_BYTES, stats::retained::read),
    ] {
        if let Ok(bytes) = read() {
            metrics::gauge!(name).set(bytes as f64);
        }
    }
}

/// A batch request's rows were queued on its lane.
pub(crate) fn batch_queued(rows: u64, uncompressed_bytes: u64) {
    metrics::counter!(BATCHES_QUEUED).increment(1);
    metrics::counter!(ROWS_RECEIVED).increment(rows);
    metrics::counter!(BYTES_RECEIVED).increment(uncompressed_bytes);
}

/// An AppendRows connection opened (`true`) or closed (`false`).
pub(crate) fn append_connection(opened: bool) {
    let gauge = metrics::gauge!(APPEND_CONNECTIONS_OPEN);
    if opened { gauge.increment(1.0) } else { gauge.decrement(1.0) }
}

/// Appends sent and not yet answered grew by `sent` and shrank by `settled` (answered, or
/// given back for replay).
pub(crate) fn appends_in_flight(sent: usize, settled: usize) {
    let gauge = metrics::gauge!(APPENDS_IN_FLIGHT);
    gauge.increment(sent as f64);
    gauge.decrement(settled as f64);
}

/// Compressed frames waiting for HTTP/2 to send them grew (`grew`) or shrank by `bytes`.
pub(crate) fn send_queue(grew: bool, bytes: usize) {
    let gauge = metrics::gauge!(APPEND_SEND_QUEUE_BYTES);
    if grew { gauge.increment(bytes as f64) } else { gauge.decrement(bytes as f64) }
}

/// A batch request waited for room in the upload budget.
pub(crate) fn backpressure_waited() {
    metrics::counter!(BACKPRESSURE_WAITS).increment(1);
}

/// A batch request was answered 429 after waiting for the upload budget.
pub(crate) fn backpressure_refused() {
    metrics::counter!(BACKPRESSURE_REJECTIONS).increment(1);
}

/// A byte budget (its gauge's name) holds `bytes` now.
pub(crate) fn budget_in_use(gauge: &'static str, bytes: usize) {
    metrics::gauge!(gauge).set(bytes as f64);
}

/// A request was forwarded to the replica that owns its execution.
pub(crate) fn request_forwarded() {
    metrics::counter!(REQUESTS_FORWARDED).increment(1);
}

/// An HTTP request was answered (`route` the template, never the path).
pub(crate) fn http_request_answered(method: String, route: String, status: u16, took: Duration) {
    metrics::counter!(HTTP_REQUESTS, "method" => method, "route" => route, "status" => status.to_string()).increment(1);
    metrics::histogram!(HTTP_REQUEST_DURATION).record(took.as_secs_f64());
}

/// A request was refused for a missing or insufficient credential (`reason`: the code).
pub(crate) fn access_denied(reason: &str) {
    metrics::counter!(AUDIT_DENIALS, "reason" => reason.to_string()).increment(1);
}

/// A replaced principals file was refused; the principals in force stay.
pub(crate) fn principals_reload_refused() {
    metrics::counter!(PRINCIPALS_RELOAD_ERRORS).increment(1);
}

/// A replaced TLS certificate or key was refused; the certificate in force stays.
pub(crate) fn tls_reload_refused() {
    metrics::counter!(TLS_RELOAD_ERRORS).increment(1);
}

/// The fleet has `replicas` live replicas (0 once this one stops counting).
pub(crate) fn fleet_size(replicas: usize) {
    metrics::gauge!(FLEET_REPLICAS).set(replicas as f64);
}

/// A BigQuery call failed and is retried (`operation`, `code`); AppendRows' also by code alone.
pub(crate) fn bigquery_call_retried(operation: &'static str, code: &str) {
    metrics::counter!(BIGQUERY_RETRIES, "operation" => operation, "code" => code.to_string()).increment(1);
    if operation == "AppendRows" {
        metrics::counter!(APPEND_RETRIES, "code" => code.to_string()).increment(1);
    }
}

/// An adaptive limit (`operation`'s) is now `limit`.
pub(crate) fn concurrency_limit(operation: &'static str, limit: usize) {
    metrics::gauge!(BIGQUERY_CONCURRENCY_LIMIT, "operation" => operation).set(limit as f64);
}

/// A call took (`true`) or left (`false`) a place under `operation`'s adaptive limit.
pub(crate) fn concurrency_place(operation: &'static str, taken: bool) {
    let gauge = metrics::gauge!(BIGQUERY_CONCURRENCY_IN_FLIGHT, "operation" => operation);
    if taken { gauge.increment(1.0) } else { gauge.decrement(1.0) }
}

/// `operation`'s adaptive limit decreased for `reason` (`refusal`, `latency`).
pub(crate) fn concurrency_decreased(operation: &'static str, reason: &'static str) {
    metrics::counter!(BIGQUERY_CONCURRENCY_DECREASES, "operation" => operation, "reason" => reason).increment(1);
}

/// A fair queue (its labels: the quota or operation) holds one call more (`true`) or less.
pub(crate) fn fair_queue_calls(labels: &[metrics::Label], joined: bool) {
    let gauge = metrics::gauge!(FAIR_QUEUE_CALLS_WAITING, labels.to_vec());
    if joined { gauge.increment(1.0) } else { gauge.decrement(1.0) }
}

/// A principal started (`true`) or stopped waiting in a fair queue.
pub(crate) fn fair_queue_principals(labels: &[metrics::Label], joined: bool) {
    let gauge = metrics::gauge!(FAIR_QUEUE_PRINCIPALS_WAITING, labels.to_vec());
    if joined { gauge.increment(1.0) } else { gauge.decrement(1.0) }
}

/// A per-principal cap's place was taken (`true`) or given back.
pub(crate) fn principal_cap_place(cap: &'static str, taken: bool) {
    let gauge = metrics::gauge!(PRINCIPAL_CAP_PLACES_HELD, "cap" => cap);
    if taken { gauge.increment(1.0) } else { gauge.decrement(1.0) }
}

/// A principal at its cap was refused.
pub(crate) fn principal_cap_refused(cap: &'static str) {
    metrics::counter!(PRINCIPAL_CAP_REFUSALS, "cap" => cap).increment(1);
}

/// BigQuery refused a call under a paced quota (its labels).
pub(crate) fn quota_refused(labels: &[metrics::Label]) {
    metrics::counter!(QUOTA_REFUSALS, labels.to_vec()).increment(1);
}

/// A paced quota's rate on this replica is now `per_second`.
pub(crate) fn quota_rate(labels: Vec<metrics::Label>, per_second: f64) {
    metrics::gauge!(QUOTA_RATE, labels).set(per_second);
}

/// A call started (`true`) or stopped waiting for a paced quota's token.
pub(crate) fn quota_waiting(labels: &[metrics::Label], started: bool) {
    let gauge = metrics::gauge!(QUOTA_WAITING, labels.to_vec());
    if started { gauge.increment(1.0) } else { gauge.decrement(1.0) }
}

/// A concurrency quota (`quota`) has `in_flight` calls now.
pub(crate) fn quota_in_flight(quota: &'static str, in_flight: usize) {
    metrics::gauge!(QUOTA_IN_FLIGHT, "quota" => quota).set(in_flight as f64);
}
