//! `POST .../resources/{resource}/batches[?seq=N]`: one Arrow IPC stream per request.
//!
//! Order of work, so that a rejected request changes nothing: look up and check the state,
//! decode and hash the whole body, validate the schema, convert and encode every row into
//! AppendRows payloads, and only then record the receipt and queue the payloads, both under
//! the execution's gate.

use std::time::Duration;

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use futures::StreamExt as _;
use serde::Deserialize;
use utoipa::IntoParams;

use super::SharedState;
use super::error::{ApiPath, ApiQuery, ProblemDocument};
use super::executions::load_execution;
use super::views::Receipt;
use crate::error::{ErrorCode, Problem};
use crate::ingest::decode::{BodyDecoder, DecodedBody};
use crate::ingest::encode::stamp_seq;
use crate::ingest::encode::{REQUEST_FRAMING_BYTES, schema_message};
use crate::ingest::encode_payloads;
use crate::ingest::schema::{LoadSpec, map_schema, schema_sha256};
use crate::model::{ExecutionState, validate_resource_name};
use crate::pipeline::{BatchingPolicy, ExecutionKey, LaneTarget, QueuedRows, staging_table_name};
use crate::store::{InsertBatch, NewBatch, ReceiptRecord};
use crate::telemetry;

pub const ARROW_STREAM_CONTENT_TYPE: &str = "application/vnd.apache.arrow.stream";

/// Upload batches default to 20,000 rows, about 8 MiB (the request budget) and a 10 s flush.
const DEFAULT_BATCH_ROWS: usize = 20_000;
const DEFAULT_FLUSH_INTERVAL_MS: u64 = 10_000;

/// Keyed modes stage `_filament_seq` = `seq << 32 | row`, so their `seq` stays below 2^31.
const MAX_KEYED_SEQ: i64 = i32::MAX as i64;

/// The batch body in OpenAPI: raw bytes of an Arrow IPC stream.
#[derive(Debug, utoipa::ToSchema)]
#[schema(value_type = String, format = Binary)]
pub struct ArrowIpcStream(#[allow(dead_code)] Vec<u8>);

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct BatchParams {
    /// 0, 1, 2, ... per resource within the current delivery; the same `seq` with the same body
    /// returns the original receipt. Assigned by the gateway when absent. Keyed write modes
    /// (upsert, delete, merge) order rows by (`seq`, row) and take `seq` up to 2147483647.
    #[param(minimum = 0)]
    pub seq: Option<i64>,
}

fn check_content_headers(headers: &HeaderMap) -> Result<(), Problem> {
    let content_type = headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("");
    let essence = content_type.split(';').next().unwrap_or("").trim();
    if !essence.eq_ignore_ascii_case(ARROW_STREAM_CONTENT_TYPE) {
        return Err(Problem::new(
            ErrorCode::UnsupportedMediaType,
            format!("batch bodies must be Content-Type: {ARROW_STREAM_CONTENT_TYPE} (got {content_type:?})"),
        ));
    }
    // The decompression layer removes the encodings it decoded; anything left is unsupported.
    if let Some(encoding) = headers.get(header::CONTENT_ENCODING).and_then(|v| v.to_str().ok())
        && !encoding.trim().eq_ignore_ascii_case("identity")
    {
        return Err(Problem::new(
            ErrorCode::UnsupportedMediaType,
            format!("Content-Encoding {encoding:?} is not supported; use gzip or zstd"),
        ));
    }
    Ok(())
}

async fn decode_body(body: Body, max_body_bytes: usize) -> Result<DecodedBody, Problem> {
    let mut decoder = BodyDecoder::new(max_body_bytes);
    let mut stream = body.into_data_stream();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| Problem::invalid_request(format!("could not read the request body: {e}")))?;
        decoder.push(chunk)?;
    }
    Ok(decoder.finish()?)
}

fn replayed(existing: ReceiptRecord, sha256: &str) -> Result<(StatusCode, axum::Json<Receipt>), Problem> {
    if existing.arrow_ipc_sha256 == sha256 {
        Ok((StatusCode::OK, axum::Json(existing.into())))
    } else {
        Err(Problem::new(
            ErrorCode::BatchConflict,
            format!("seq {} of resource {} was already accepted with other content", existing.seq, existing.resource),
        ))
    }
}

/// Send one Arrow IPC stream of rows for a resource.
#[utoipa::path(
    post, path = "/v1/runs/{run_id}/executions/{execution_id}/resources/{resource}/batches", tag = "executions",
    security(("bearer" = [])),
    params(
        ("run_id" = String, Path, description = "Run id"),
        ("execution_id" = String, Path, description = "Execution id"),
        ("resource" = String, Path, description = "Declared resource"),
        ("Content-Encoding" = Option<String>, Header, description = "`gzip` or `zstd`"),
        BatchParams
    ),
    request_body(content = ArrowIpcStream, content_type = "application/vnd.apache.arrow.stream", description = "An Arrow IPC stream: schema message, record batches, optional end marker"),
    responses(
        (status = 202, description = "Accepted and queued for upload", body = Receipt),
        (status = 200, description = "Replay of an accepted `seq` with the same body: the original receipt", body = Receipt),
        (status = 400, description = "`invalid_arrow_ipc` or malformed request", body = ProblemDocument, content_type = "application/problem+json"),
        (status = 401, description = "Missing or invalid token", body = ProblemDocument, content_type = "application/problem+json"),
        (status = 404, description = "No such run, execution or resource", body = ProblemDocument, content_type = "application/problem+json"),
        (status = 409, description = "`execution_not_extracting`, `batch_conflict`", body = ProblemDocument, content_type = "application/problem+json"),
        (status = 413, description = "`payload_too_large`", body = ProblemDocument, content_type = "application/problem+json"),
        (status = 415, description = "`unsupported_media_type`", body = ProblemDocument, content_type = "application/problem+json"),
        (status = 422, description = "`invalid_identifier`, `schema_mismatch`, `unsupported_type`, `precision_loss`, `invalid_value`, `invalid_operation`, `invalid_primary_key`, `null_primary_key`, `row_too_large`", body = ProblemDocument, content_type = "application/problem+json"),
        (status = 429, description = "`backpressure`: retry after `Retry-After` seconds", body = ProblemDocument, content_type = "application/problem+json"),
    )
)]
pub async fn post_batch(
    State(state): State<SharedState>,
    ApiPath((run_id, execution_id, resource)): ApiPath<(String, String, String)>,
    ApiQuery(params): ApiQuery<BatchParams>,
    headers: HeaderMap,
    body: Body,
) -> Result<(StatusCode, axum::Json<Receipt>), Problem> {
    validate_resource_name(&resource)?;
    if params.seq.is_some_and(|seq| seq < 0) {
        return Err(Problem::invalid_request("seq must be 0 or greater"));
    }
    check_content_headers(&headers)?;
    let execution = load_execution(&state, &run_id, &execution_id).await?;
    let run = state.store.get_run(&run_id).await?.ok_or_else(|| Problem::not_found(format!("run {run_id}")))?;
    let declared = state.store.get_resource(&run_id, &resource).await?.ok_or_else(|| {
        Problem::not_found(format!("resource {resource} of run {run_id} (declare it with PUT first)"))
    })?;
    if execution.state != ExecutionState::Extracting {
        return Err(Problem::new(
            ErrorCode::ExecutionNotExtracting,
            format!("execution {execution_id} is {}; it accepts no more batches", execution.state),
        ));
    }

    // Memory: wait for room in the resource's share before reading the body, and decode under
    // a gateway-wide slot held until the encoded bytes are in the budget. Requests that wait
    // hold unread bodies, not decoded data.
    let key = ExecutionKey { run_id: run_id.clone(), execution_id: execution_id.clone() };
    let uploads = state.pipeline.execution(&key, execution.delivery);
    let share = state.pipeline.resource_share(&uploads, &resource);
    // One wait in all: the share, a decode slot and the budget share the backpressure wait.
    let wait_started = std::time::Instant::now();
    let max_wait = state.pipeline.limits.backpressure_wait;
    share.wait_for_room(max_wait).await?;
    let decode_slot = state.pipeline.batch_decode_slot(max_wait.saturating_sub(wait_started.elapsed())).await?;
    let body = decode_body(body, state.settings.max_batch_body_bytes).await?;
    let spec = LoadSpec { write_mode: declared.write_mode, primary_key: &declared.primary_key };
    let mapped = map_schema(&body.schema, spec)?;
    if mapped.stages_seq && params.seq.is_some_and(|seq| seq > MAX_KEYED_SEQ) {
        return Err(Problem::invalid_request(format!(
            "write mode {} orders rows by (seq, row): seq must be at most {MAX_KEYED_SEQ}",
            declared.write_mode
        )));
    }
    let canonical_schema = mapped.canonical_json();
    let canonical_schema_sha256 = schema_sha256(&canonical_schema);
    let delivery = execution.delivery;
    if let Some(seq) = params.seq
        && let Some(existing) = state.store.find_receipt(&run_id, &execution_id, delivery, &resource, seq).await?
    {
        return replayed(existing, &body.arrow_ipc_sha256);
    }
    if let Some(staging) = state.store.get_staging_stream(&run_id, &execution_id, delivery, &resource).await?
        && staging.arrow_schema_sha256 != canonical_schema_sha256
    {
        return Err(schema_mismatch(&resource, &staging.arrow_schema, &canonical_schema));
    }
    let serialized_schema = schema_message(&mapped.staging);
    let max_payload_bytes = state
        .settings
        .max_append_request_bytes
        .saturating_sub(REQUEST_FRAMING_BYTES + serialized_schema.len())
        .max(1024);
    let mut payloads = encode_payloads(&body, &mapped, max_payload_bytes)?;
    let encoded_bytes: usize = payloads.iter().map(|p| p.serialized_record_batch.len()).sum();
    // Room in the resource's share and the upload budget first (waiting, then 429): nothing is
    // recorded without it.
    let queue_started = std::time::Instant::now();
    let remaining_wait = max_wait.saturating_sub(wait_started.elapsed());
    let permit = state.pipeline.budget.acquire(encoded_bytes, Some(&share), remaining_wait).await?;
    drop(body.batches);
    drop(decode_slot);
    let backpressure_ms = queue_started.elapsed().as_millis() as u64;
    if backpressure_ms >= 1000 {
        tracing::info!(%resource, phase = "queue", backpressure_ms, rows = body.rows, "bigquery.write.timing");
    } else {
        tracing::debug!(%resource, phase = "queue", backpressure_ms, rows = body.rows, "bigquery.write.timing");
    }

    let _gate = uploads.gate.read().await;
    // Re-check under the gate: a transition or redelivery may have happened while decoding.
    let current = load_execution(&state, &run_id, &execution_id).await?;
    if current.state != ExecutionState::Extracting || current.delivery != delivery {
        return Err(Problem::new(
            ErrorCode::ExecutionNotExtracting,
            format!(
                "execution {execution_id} is {} (delivery {}); it accepts no more batches",
                current.state, current.delivery
            ),
        ));
    }
    let staging_table = staging_table_name(&run_id, &execution_id, delivery, &resource, &declared.table_name);
    let inserted = state
        .store
        .insert_batch(&NewBatch {
            run_id: &run_id,
            execution_id: &execution_id,
            delivery,
            resource: &resource,
            seq: params.seq,
            rows: body.rows as i64,
            uncompressed_bytes: body.uncompressed_bytes as i64,
            arrow_ipc_sha256: &body.arrow_ipc_sha256,
            arrow_schema: &canonical_schema,
            arrow_schema_sha256: &canonical_schema_sha256,
            staging_table: &staging_table,
        })
        .await?;
    let receipt = match inserted {
        InsertBatch::Inserted(receipt) => receipt,
        InsertBatch::SeqTaken(existing) => return replayed(existing, &body.arrow_ipc_sha256),
        InsertBatch::SchemaMismatch { recorded } => {
            return Err(schema_mismatch(&resource, &recorded, &canonical_schema));
        }
    };
    if mapped.stages_seq {
        // Same sizes as budgeted: only the values of `_filament_seq` change.
        stamp_seq(&mut payloads, receipt.seq).map_err(|e| Problem::internal(e.to_string()))?;
    }
    let batching = BatchingPolicy {
        max_rows: run.batching.max_rows.map_or(DEFAULT_BATCH_ROWS, |rows| rows as usize),
        max_bytes: run.batching.max_bytes.map_or(max_payload_bytes, |bytes| bytes as usize).min(max_payload_bytes),
        flush_interval: Duration::from_millis(run.batching.flush_interval_ms.unwrap_or(DEFAULT_FLUSH_INTERVAL_MS)),
    };
    state.pipeline.enqueue(
        &uploads,
        &resource,
        || LaneTarget {
            run_id: run_id.clone(),
            execution_id: execution_id.clone(),
            delivery,
            resource: resource.clone(),
            project: run.destination.project.clone(),
            dataset: run.destination.dataset.clone(),
            location: run.destination.location().map(str::to_string),
            destination_table: declared.table_name.clone(),
            staging_table,
            destination_columns: mapped.destination_columns.clone(),
            staging_columns: mapped.staging_columns.clone(),
            serialized_schema,
            batching,
        },
        QueuedRows { payloads, permit },
    );
    metrics::counter!(telemetry::BATCHES_QUEUED).increment(1);
    metrics::counter!(telemetry::ROWS_RECEIVED).increment(body.rows as u64);
    metrics::counter!(telemetry::BYTES_RECEIVED).increment(body.uncompressed_bytes as u64);
    Ok((StatusCode::ACCEPTED, axum::Json(receipt.into())))
}

fn schema_mismatch(resource: &str, recorded: &serde_json::Value, received: &serde_json::Value) -> Problem {
    Problem::new(
        ErrorCode::SchemaMismatch,
        format!("resource {resource} changed schema within the execution: first batch had {recorded}, this one has {received}"),
    )
    .with_hint("every batch of a resource within one execution must have the same schema")
}
