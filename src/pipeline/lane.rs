//! One resource's upload lane, two tasks joined by a channel:
//! - the **accumulator** coalesces accepted payloads into upload batches (max rows, max bytes,
//!   flush interval; flushed on demand at checkpoints and at commit), and
//! - the **appender** sends them over an AppendRows connection at explicit row offsets with a
//!   sliding window (refilled per acknowledgement), under the gateway-wide in-flight limit.
//!   Retryable failures tear the connection down (no more sending or receiving), back off, and
//!   replay every unacknowledged request, in order, on a new connection; `ALREADY_EXISTS` on a
//!   replay means the rows had landed.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow_array::RecordBatch;
use bytes::Bytes;
use sha2::{Digest as _, Sha256};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use super::budget::BudgetPermit;
use super::retry::RetryPolicy;
use crate::bigquery::metadata::{missing_columns, type_conflicts};
use crate::bigquery::write::{AppendAck, AppendConnection, append_request, judge_append_response};
use crate::bigquery::{BigQuery, BigQueryError};
use crate::error::{ErrorCode, Problem};
use crate::ingest::encode::{AppendPayload, record_batch_message};
use crate::ingest::schema::Column;
use crate::store::Store;
use crate::telemetry;

/// Staging tables expire on their own after this long, whatever happens to the gateway.
pub const STAGING_TABLE_TTL: Duration = Duration::from_secs(7 * 24 * 3600);

/// Operations at least this long are logged at INFO (`bigquery.write.timing`), others at DEBUG.
const SLOW_OPERATION: Duration = Duration::from_secs(1);

/// Where one lane's rows go.
#[derive(Debug, Clone)]
pub struct LaneTarget {
    pub run_id: String,
    pub execution_id: String,
    pub delivery: i32,
    pub resource: String,
    pub project: String,
    pub dataset: String,
    pub location: Option<String>,
    pub destination_table: String,
    pub staging_table: String,
    /// What the destination table must hold (created or extended with these).
    pub destination_columns: Vec<Column>,
    /// The staging table's columns (staged types, `_filament_op`, `_filament_seq`).
    pub staging_columns: Vec<Column>,
    /// The staging schema as one encapsulated IPC message (the writer schema).
    pub serialized_schema: Bytes,
    pub batching: BatchingPolicy,
}

/// When accumulated rows become an upload batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchingPolicy {
    pub max_rows: usize,
    /// Encoded bytes per upload batch; never above the AppendRows payload budget.
    pub max_bytes: usize,
    pub flush_interval: Duration,
}

/// Shared limits and clients every lane uses.
#[derive(Debug, Clone)]
pub struct LaneContext {
    pub bigquery: BigQuery,
    pub store: Store,
    /// Gateway-wide AppendRows requests in flight.
    pub inflight_requests: Arc<Semaphore>,
    /// Resources being set up (tables, stream) at once.
    pub prepares: Arc<Semaphore>,
    pub inflight_per_stream: usize,
    pub retry: RetryPolicy,
}

/// What a drained lane hands to commit.
#[derive(Debug, Clone)]
pub struct LaneReport {
    pub resource: String,
    pub destination_table: String,
    pub staging_table: String,
    pub destination_columns: Vec<Column>,
    pub stream_name: String,
    /// Rows appended to the stream (acknowledged, in order).
    pub rows_sent: i64,
}

/// Accepted rows of one batch request, with their share of the byte budget.
#[derive(Debug)]
pub struct QueuedRows {
    pub payloads: Vec<AppendPayload>,
    pub permit: BudgetPermit,
}

/// What the API sends a lane.
#[derive(Debug)]
pub enum LaneCommand {
    Rows(QueuedRows),
    /// Queue whatever is accumulated, then answer.
    Flush(oneshot::Sender<()>),
}

/// One upload batch ready to send.
#[derive(Debug)]
struct Upload {
    rows: usize,
    message: Bytes,
    /// Held until the upload is acknowledged: dropping it returns its bytes to the budget.
    _budget: BudgetPermit,
}

/// `projects/p/datasets/d/tables/t`, the Storage Write API's table path.
pub fn table_path(project: &str, dataset: &str, table: &str) -> String {
    format!("projects/{project}/datasets/{dataset}/tables/{table}")
}

/// The staging table of one resource in one delivery: reserved prefix, the destination's name
/// (for people reading the dataset) and a hash that makes it unique per delivery.
pub fn staging_table_name(
    run_id: &str,
    execution_id: &str,
    delivery: i32,
    resource: &str,
    destination_table: &str,
) -> String {
    let digest = Sha256::digest(format!("{run_id}\n{execution_id}\n{delivery}\n{resource}").as_bytes());
    let hash = &hex::encode(digest)[..16];
    let readable: String = destination_table.chars().take(900).collect();
    format!("_filament_stg_{readable}_{hash}")
}

/// `bigquery.write.timing` for one phase: INFO when slow, DEBUG otherwise.
fn log_timing(target: &LaneTarget, phase: &'static str, duration: Duration) {
    let duration_ms = duration.as_millis() as u64;
    if duration >= SLOW_OPERATION {
        tracing::info!(resource = %target.resource, phase, duration_ms, "bigquery.write.timing");
    } else {
        tracing::debug!(resource = %target.resource, phase, duration_ms, "bigquery.write.timing");
    }
}

/// `bigquery.write.timing` for one acknowledged append.
fn log_append_timing(
    target: &LaneTarget,
    rows: usize,
    uncompressed_bytes: usize,
    send: Duration,
    response_wait: Duration,
) {
    let duration = send + response_wait;
    let (duration_ms, send_ms, response_wait_ms) =
        (duration.as_millis() as u64, send.as_millis() as u64, response_wait.as_millis() as u64);
    if duration >= SLOW_OPERATION {
        tracing::info!(resource = %target.resource, phase = "append", duration_ms, rows, uncompressed_bytes, send_ms,
            response_wait_ms, "bigquery.write.timing");
    } else {
        tracing::debug!(resource = %target.resource, phase = "append", duration_ms, rows, uncompressed_bytes, send_ms,
            response_wait_ms, "bigquery.write.timing");
    }
}

pub(super) async fn run_lane(
    context: LaneContext,
    target: LaneTarget,
    commands: mpsc::UnboundedReceiver<LaneCommand>,
    cancel: CancellationToken,
) -> Result<LaneReport, Problem> {
    let (uploads_tx, uploads_rx) = mpsc::unbounded_channel();
    // Its own task: the appender must be able to fail (and fail the execution) at once, while
    // the accumulator would otherwise wait for the lane to be drained.
    let accumulator = tokio::spawn(accumulate(target.batching, commands, uploads_tx));
    let result = tokio::select! {
        result = upload(&context, &target, uploads_rx) => result,
        () = cancel.cancelled() => {
            accumulator.abort();
            return Err(Problem::new(ErrorCode::UploadFailed, format!("uploads of resource {} were cancelled", target.resource)));
        }
    };
    // On failure, dropping the accumulated rows returns their bytes to the budget.
    accumulator.abort();
    if let Err(problem) = &result {
        tracing::warn!(run_id = %target.run_id, execution_id = %target.execution_id, resource = %target.resource,
            code = %problem.code, detail = %problem.detail, "upload lane failed; failing the execution");
        if let Err(e) =
            context.store.fail_execution(&target.run_id, &target.execution_id, target.delivery, problem).await
        {
            tracing::error!(error = %e, "could not record the failed execution");
        }
    }
    result
}

/// Coalesces payloads into upload batches. Payloads at least half a batch go out as encoded at
/// request time; smaller ones accumulate (as staged rows) and are re-encoded together.
async fn accumulate(
    policy: BatchingPolicy,
    mut commands: mpsc::UnboundedReceiver<LaneCommand>,
    uploads: mpsc::UnboundedSender<Upload>,
) {
    let mut pending = Pending::default();
    loop {
        let deadline = pending.started.map(|started| started + policy.flush_interval);
        let command = tokio::select! {
            command = commands.recv() => command,
            () = sleep_until_opt(deadline) => {
                pending.flush(&policy, &uploads);
                continue;
            }
        };
        match command {
            Some(LaneCommand::Rows(rows)) => {
                let QueuedRows { payloads, mut permit } = rows;
                let count = payloads.len();
                for (index, payload) in payloads.into_iter().enumerate() {
                    let share = if index + 1 == count {
                        std::mem::replace(&mut permit, BudgetPermit::empty())
                    } else {
                        permit.split(payload.serialized_record_batch.len())
                    };
                    let big = payload.rows * 2 >= policy.max_rows
                        || payload.serialized_record_batch.len() * 2 >= policy.max_bytes;
                    if big {
                        pending.flush(&policy, &uploads);
                        let _ = uploads.send(Upload {
                            rows: payload.rows,
                            message: payload.serialized_record_batch,
                            _budget: share,
                        });
                        continue;
                    }
                    if pending.rows + payload.rows > policy.max_rows
                        || pending.bytes + payload.serialized_record_batch.len() > policy.max_bytes
                    {
                        pending.flush(&policy, &uploads);
                    }
                    pending.push(payload, share);
                }
            }
            Some(LaneCommand::Flush(done)) => {
                pending.flush(&policy, &uploads);
                let _ = done.send(());
            }
            None => {
                pending.flush(&policy, &uploads);
                return;
            }
        }
    }
}

async fn sleep_until_opt(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

#[derive(Debug, Default)]
struct Pending {
    pieces: Vec<AppendPayload>,
    permit: Option<BudgetPermit>,
    rows: usize,
    bytes: usize,
    /// When the oldest accumulated rows arrived (tokio's clock, so tests can pause time).
    started: Option<tokio::time::Instant>,
}

impl Pending {
    fn push(&mut self, payload: AppendPayload, permit: BudgetPermit) {
        self.rows += payload.rows;
        self.bytes += payload.serialized_record_batch.len();
        self.started.get_or_insert_with(tokio::time::Instant::now);
        match self.permit.as_mut() {
            Some(held) => held.merge(permit),
            None => self.permit = Some(permit),
        }
        self.pieces.push(payload);
    }

    fn flush(&mut self, policy: &BatchingPolicy, uploads: &mpsc::UnboundedSender<Upload>) {
        let pieces = std::mem::take(&mut self.pieces);
        let permit = self.permit.take().unwrap_or_else(BudgetPermit::empty);
        let rows = std::mem::take(&mut self.rows);
        self.bytes = 0;
        self.started = None;
        if pieces.is_empty() {
            return;
        }
        if pieces.len() > 1 {
            let batches: Option<Vec<RecordBatch>> = pieces.iter().map(|p| p.batch.clone()).collect();
            if let Some(batches) = batches
                && let Some(schema) = batches.first().map(RecordBatch::schema)
                && let Ok(combined) = arrow_select::concat::concat_batches(&schema, &batches)
                && let Ok(message) = record_batch_message(&combined)
                && message.len() <= policy.max_bytes
            {
                let _ = uploads.send(Upload { rows, message, _budget: permit });
                return;
            }
        }
        // One piece, or coalescing did not fit: send the pieces as encoded at request time.
        let mut permit = permit;
        let count = pieces.len();
        for (index, piece) in pieces.into_iter().enumerate() {
            let share = if index + 1 == count {
                std::mem::replace(&mut permit, BudgetPermit::empty())
            } else {
                permit.split(piece.serialized_record_batch.len())
            };
            let _ = uploads.send(Upload { rows: piece.rows, message: piece.serialized_record_batch, _budget: share });
        }
    }
}

async fn prepare(context: &LaneContext, target: &LaneTarget) -> Result<String, Problem> {
    let _slot =
        Arc::clone(&context.prepares).acquire_owned().await.map_err(|_| Problem::internal("prepare limiter closed"))?;
    let started = Instant::now();
    tracing::info!(run_id = %target.run_id, execution_id = %target.execution_id, resource = %target.resource,
        table = %target.destination_table, "bigquery.write.prepare.started");
    let bigquery = &context.bigquery;
    let fail = |e: BigQueryError| e.to_problem(ErrorCode::BigqueryError);
    let (project, dataset) = (target.project.as_str(), target.dataset.as_str());
    bigquery.ensure_dataset(project, dataset, target.location.as_deref()).await.map_err(fail)?;
    let (table, wanted) = (&target.destination_table, &target.destination_columns);
    match bigquery.table_fields(project, dataset, table).await.map_err(fail)? {
        None => {
            bigquery.create_table(project, dataset, table, wanted, None).await.map_err(fail)?;
        }
        Some(existing) => {
            let conflicts = type_conflicts(&existing, wanted);
            if !conflicts.is_empty() {
                let list: Vec<String> = conflicts
                    .iter()
                    .map(|(c, has, wants)| format!("{c} is {has} in the table, the batches send {wants}"))
                    .collect();
                return Err(Problem::new(
                    ErrorCode::IncompatibleSchema,
                    format!("table {dataset}.{table}: {}", list.join("; ")),
                )
                .with_hint("existing columns are never altered: send the table's type, or load into a new table"));
            }
            let missing = missing_columns(&existing, wanted);
            if !missing.is_empty() {
                let names: Vec<&str> = missing.iter().map(|c| c.name.as_str()).collect();
                tracing::info!(run_id = %target.run_id, execution_id = %target.execution_id, %table,
                    columns = %names.join(","), "bigquery.table.columns_added");
                bigquery.add_columns(project, dataset, table, &existing, &missing).await.map_err(fail)?;
            }
        }
    }
    let expires_at_ms = chrono::Utc::now().timestamp_millis() + STAGING_TABLE_TTL.as_millis() as i64;
    bigquery
        .create_table(project, dataset, &target.staging_table, &target.staging_columns, Some(expires_at_ms))
        .await
        .map_err(fail)?;
    let stream_name = bigquery
        .writer()
        .create_pending_stream(&table_path(project, dataset, &target.staging_table))
        .await
        .map_err(|e| e.to_problem(ErrorCode::UploadFailed))?;
    context
        .store
        .set_stream_name(&target.run_id, &target.execution_id, target.delivery, &target.resource, &stream_name)
        .await?;
    log_timing(target, "prepare", started.elapsed());
    Ok(stream_name)
}

/// A request sent and not yet acknowledged; it keeps its payload for replay.
#[derive(Debug)]
struct InFlight {
    offset: i64,
    upload: Upload,
    sent_at: Instant,
    send_duration: Duration,
    _slot: OwnedSemaphorePermit,
}

/// The appender: sliding window over one connection, replay on failure.
async fn upload(
    context: &LaneContext,
    target: &LaneTarget,
    mut uploads: mpsc::UnboundedReceiver<Upload>,
) -> Result<LaneReport, Problem> {
    let stream_name = prepare(context, target).await?;
    let writer = context.bigquery.writer();
    let window = context.inflight_per_stream.max(1);
    let mut queue: VecDeque<Upload> = VecDeque::new();
    let mut in_flight: VecDeque<InFlight> = VecDeque::new();
    let mut connection: Option<AppendConnection> = None;
    let mut next_offset: i64 = 0;
    let mut acknowledged_rows: i64 = 0;
    let mut input_open = true;
    let mut failed_attempts: u32 = 0;
    let mut rows_recorded: i64 = 0;

    loop {
        if !input_open && queue.is_empty() && in_flight.is_empty() {
            break;
        }
        let can_send = in_flight.len() < window && !queue.is_empty();
        tokio::select! {
            biased;
            response = next_response(&mut connection), if !in_flight.is_empty() => {
                let Some(front) = in_flight.front() else { continue };
                let result = response.and_then(|r| judge_append_response(front.offset, r));
                match result {
                    Ok(ack) => {
                        failed_attempts = 0;
                        let Some(done) = in_flight.pop_front() else { continue };
                        let response_wait = done.sent_at.elapsed();
                        metrics::histogram!(telemetry::APPEND_LATENCY).record(response_wait.as_secs_f64());
                        metrics::counter!(telemetry::APPENDS, "outcome" => match ack {
                            AppendAck::Appended => "appended",
                            AppendAck::AlreadyPresent => "already_present",
                        }).increment(1);
                        metrics::counter!(telemetry::ROWS_APPENDED).increment(done.upload.rows as u64);
                        metrics::counter!(telemetry::BYTES_APPENDED).increment(done.upload.message.len() as u64);
                        log_append_timing(target, done.upload.rows, done.upload.message.len(), done.send_duration, response_wait);
                        acknowledged_rows += done.upload.rows as i64;
                        // Retire the request: its payload and budget are released here.
                        drop(done);
                        metrics::gauge!(telemetry::APPENDS_IN_FLIGHT).decrement(1.0);
                        // Progress for the execution view; not needed for correctness.
                        if context.store.add_rows_acknowledged(&target.run_id, &target.execution_id, target.delivery,
                            &target.resource, acknowledged_rows - rows_recorded).await.is_ok() {
                            rows_recorded = acknowledged_rows;
                        }
                    }
                    Err(error) => {
                        let code = error_code_name(&error);
                        let retryable = error.is_retryable() && failed_attempts + 1 < context.retry.max_attempts;
                        metrics::counter!(telemetry::APPEND_RETRIES, "code" => code).increment(u64::from(retryable));
                        tracing::warn!(resource = %target.resource, offset = in_flight.front().map(|f| f.offset),
                            code, retryable, attempt = failed_attempts + 1, error = %error, "bigquery.write.retry");
                        if !retryable {
                            return Err(error.to_problem(ErrorCode::UploadFailed));
                        }
                        failed_attempts += 1;
                        // Stop sending and receiving; everything after the last acknowledgement is
                        // treated as not applied and replayed, in order, on a new connection.
                        drop(connection.take());
                        tokio::time::sleep(context.retry.backoff(failed_attempts)).await;
                        match reconnect(writer, target, &stream_name, &mut in_flight).await {
                            Ok(open) => connection = Some(open),
                            // Judged on the next turn like a failed response (no connection).
                            Err(e) if e.is_retryable() => {}
                            Err(e) => return Err(e.to_problem(ErrorCode::UploadFailed)),
                        }
                    }
                }
            }
            slot = Arc::clone(&context.inflight_requests).acquire_owned(), if can_send => {
                let Ok(slot) = slot else { return Err(Problem::internal("in-flight limiter closed")) };
                let Some(upload) = queue.pop_front() else { continue };
                let started = Instant::now();
                let offset = next_offset;
                next_offset += upload.rows as i64;
                let first = connection.is_none();
                let request = append_request(&stream_name, first.then(|| target.serialized_schema.clone()), offset,
                    upload.message.clone());
                let sent = match connection.as_ref() {
                    Some(open) => open.send(&request),
                    None => match writer.open_append_connection(&stream_name, vec![request]).await {
                        Ok(open) => { connection = Some(open); Ok(()) }
                        Err(e) => Err(e),
                    },
                };
                metrics::gauge!(telemetry::APPENDS_IN_FLIGHT).increment(1.0);
                in_flight.push_back(InFlight { offset, upload, sent_at: Instant::now(), send_duration: started.elapsed(), _slot: slot });
                if let Err(error) = sent {
                    // Judge it like a failed response: the next loop sees no connection.
                    if !error.is_retryable() {
                        return Err(error.to_problem(ErrorCode::UploadFailed));
                    }
                    connection = None;
                }
            }
            upload = uploads.recv(), if input_open => {
                match upload {
                    Some(upload) => queue.push_back(upload),
                    None => input_open = false,
                }
            }
        }
    }
    Ok(LaneReport {
        resource: target.resource.clone(),
        destination_table: target.destination_table.clone(),
        staging_table: target.staging_table.clone(),
        destination_columns: target.destination_columns.clone(),
        stream_name,
        rows_sent: acknowledged_rows,
    })
}

async fn next_response(
    connection: &mut Option<AppendConnection>,
) -> Result<
    googleapis_tonic_google_cloud_bigquery_storage_v1::google::cloud::bigquery::storage::v1::AppendRowsResponse,
    BigQueryError,
> {
    match connection.as_mut() {
        Some(open) => open.next_response().await,
        None => Err(BigQueryError::Grpc {
            operation: "AppendRows",
            status: tonic::Status::unavailable("no AppendRows connection"),
        }),
    }
}

/// A new connection carrying every unacknowledged request again, in order (the first with the
/// writer schema).
async fn reconnect(
    writer: &crate::bigquery::write::WriteClient,
    target: &LaneTarget,
    stream_name: &str,
    in_flight: &mut VecDeque<InFlight>,
) -> Result<AppendConnection, BigQueryError> {
    let requests = in_flight
        .iter()
        .enumerate()
        .map(|(index, f)| {
            let schema = (index == 0).then(|| target.serialized_schema.clone());
            append_request(stream_name, schema, f.offset, f.upload.message.clone())
        })
        .collect();
    let connection = writer.open_append_connection(stream_name, requests).await?;
    let now = Instant::now();
    for f in in_flight.iter_mut() {
        f.sent_at = now;
    }
    Ok(connection)
}

fn error_code_name(error: &BigQueryError) -> &'static str {
    match error {
        BigQueryError::Grpc { status, .. } => grpc_code_name(status.code() as i32),
        BigQueryError::InResponse { code, .. } => grpc_code_name(*code),
        BigQueryError::Connect(_) => "connect",
        BigQueryError::Timeout { .. } => "timeout",
        _ => "other",
    }
}

fn grpc_code_name(code: i32) -> &'static str {
    match code {
        1 => "CANCELLED",
        2 => "UNKNOWN",
        3 => "INVALID_ARGUMENT",
        4 => "DEADLINE_EXCEEDED",
        5 => "NOT_FOUND",
        6 => "ALREADY_EXISTS",
        7 => "PERMISSION_DENIED",
        8 => "RESOURCE_EXHAUSTED",
        9 => "FAILED_PRECONDITION",
        10 => "ABORTED",
        11 => "OUT_OF_RANGE",
        12 => "UNIMPLEMENTED",
        13 => "INTERNAL",
        14 => "UNAVAILABLE",
        16 => "UNAUTHENTICATED",
        _ => "OTHER",
    }
}

#[cfg(test)]
mod tests {
    use arrow_array::Int64Array;
    use arrow_schema::{DataType, Field, Schema};

    use super::*;

    fn payload(first_id: i64, rows: usize) -> AppendPayload {
        let batch = RecordBatch::try_new(
            Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, true)])),
            vec![Arc::new(Int64Array::from_iter_values(first_id..first_id + rows as i64))],
        )
        .unwrap();
        AppendPayload { rows, serialized_record_batch: record_batch_message(&batch).unwrap(), batch: Some(batch) }
    }

    fn rows(payloads: Vec<AppendPayload>) -> LaneCommand {
        LaneCommand::Rows(QueuedRows { payloads, permit: BudgetPermit::empty() })
    }

    #[tokio::test(start_paused = true)]
    async fn small_rows_wait_for_the_flush_interval_or_the_row_limit() {
        let policy = BatchingPolicy { max_rows: 100, max_bytes: 1 << 20, flush_interval: Duration::from_secs(10) };
        let (commands, receiver) = mpsc::unbounded_channel();
        let (uploads_tx, mut uploads) = mpsc::unbounded_channel();
        tokio::spawn(accumulate(policy, receiver, uploads_tx));

        for i in 0..3 {
            commands.send(rows(vec![payload(i * 10, 10)])).unwrap();
        }
        tokio::time::sleep(Duration::from_millis(9_900)).await;
        assert!(uploads.try_recv().is_err(), "nothing before the flush interval");
        tokio::time::sleep(Duration::from_millis(200)).await;
        let upload = uploads.try_recv().expect("flushed after 10 s");
        assert_eq!(upload.rows, 30, "the three requests were coalesced into one upload");

        // The row limit flushes without waiting: 10 x 10 rows fill one batch of 100.
        for i in 0..11 {
            commands.send(rows(vec![payload(100 + i * 10, 10)])).unwrap();
        }
        tokio::task::yield_now().await;
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert_eq!(uploads.try_recv().expect("full batch").rows, 100);
        assert!(uploads.try_recv().is_err(), "the 11th request waits for more rows");

        // A flush (checkpoint) queues what is left and then answers.
        let (done, flushed) = oneshot::channel();
        commands.send(LaneCommand::Flush(done)).unwrap();
        flushed.await.unwrap();
        assert_eq!(uploads.try_recv().expect("flushed remainder").rows, 10);

        // Payloads of at least half a batch go out as they are, in order.
        commands.send(rows(vec![payload(0, 5), payload(5, 60)])).unwrap();
        drop(commands);
        tokio::time::sleep(Duration::from_millis(1)).await;
        let sizes: Vec<usize> = std::iter::from_fn(|| uploads.try_recv().ok()).map(|u| u.rows).collect();
        assert_eq!(sizes, [5, 60]);
    }

    #[test]
    fn staging_names_are_reserved_unique_and_valid() {
        let a = staging_table_name("r", "e", 1, "users", "users");
        let b = staging_table_name("r", "e", 2, "users", "users");
        assert_ne!(a, b);
        assert!(a.starts_with("_filament_stg_users_"));
        assert!(a.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'));
        assert!(staging_table_name("r", "e", 1, "x", &"t".repeat(1024)).len() <= 1024);
    }
}
