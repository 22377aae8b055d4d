//! `POST .../resources/{resource}/batches[?seq=N]`: one Arrow IPC stream per request.
//!
//! The handler runs five named steps; the order is carried by the pipeline's admission types
//! (`pipeline::admission`), so that a rejected request changes nothing and nothing is queued
//! without room in the budget: check the request, load what it targets, get admitted (share
//! and decode slot), decode and encode the whole body, reserve its bytes, then record the
//! receipt and queue the rows under the execution's gate.

use std::time::Duration;

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use bytes::Bytes;
use futures::StreamExt as _;
use serde::Deserialize;
use utoipa::IntoParams;

use super::SharedState;
use super::error::{ApiPath, ApiQuery, ProblemDocument};
use super::executions::load_execution;
use super::views::Receipt;
use crate::error::{ErrorCode, Problem};
use crate::ingest::decode::{BodyDecoder, DecodedBody};
use crate::ingest::encode::{REQUEST_FRAMING_BYTES, schema_message};
use crate::ingest::schema::{LoadSpec, MappedSchema, map_schema, schema_sha256};
use crate::ingest::{bounds, encode_payloads};
use crate::model::bounds::KeyRange;
use crate::model::staging::{MAX_KEYED_SEQ, staging_table_name};
use crate::model::table_layout::TableLayout;
use crate::model::{ExecutionState, ResourceName, ResourceRef};
use crate::pipeline::{BatchingPolicy, EncodedBatch, ExecutionUploads, LaneTarget, ReservedBatch};
use crate::store::{InsertBatch, NewBatch, ReceiptRecord, ResourceRecord, RunRecord};
use crate::telemetry;

pub(crate) const ARROW_STREAM_CONTENT_TYPE: &str = "application/vnd.apache.arrow.stream";

/// Upload batches default to 20,000 rows, about 8 MiB (the request budget) and a 10 s flush.
const DEFAULT_BATCH_ROWS: usize = 20_000;
const DEFAULT_FLUSH_INTERVAL_MS: u64 = 10_000;

/// The batch body in OpenAPI: raw bytes of an Arrow IPC stream.
#[derive(Debug, utoipa::ToSchema)]
#[schema(value_type = String, format = Binary)]
pub(crate) struct ArrowIpcStream(#[allow(dead_code)] Vec<u8>);

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct BatchParams {
    /// 0, 1, 2, ... per resource within the current delivery; the same `seq` with the same body
    /// returns the original receipt. Assigned by the gateway when absent. Keyed write modes
    /// (upsert, delete, merge) order rows by (`seq`, row) and take `seq` up to 2147483647.
    #[param(minimum = 0)]
    pub(crate) seq: Option<i64>,
}

type Answer = (StatusCode, axum::Json<Receipt>);

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
    request_body(content = ArrowIpcStream, content_type = "application/vnd.apache.arrow.stream", description = "An Arrow IPC stream: schema message, record batches (buffers optionally LZ4_FRAME or ZSTD compressed), optional end marker"),
    responses(
        (status = 202, description = "Accepted and queued for upload", body = Receipt),
        (status = 200, description = "Replay of an accepted `seq` with the same body: the original receipt", body = Receipt),
        (status = 400, description = "`invalid_arrow_ipc` or malformed request", body = ProblemDocument, content_type = "application/problem+json"),
        (status = 401, description = "Missing or invalid token", body = ProblemDocument, content_type = "application/problem+json"),
        (status = 404, description = "No such run, execution or resource", body = ProblemDocument, content_type = "application/problem+json"),
        (status = 409, description = "`execution_not_extracting`, `batch_conflict`", body = ProblemDocument, content_type = "application/problem+json"),
        (status = 413, description = "`payload_too_large`", body = ProblemDocument, content_type = "application/problem+json"),
        (status = 415, description = "`unsupported_media_type`", body = ProblemDocument, content_type = "application/problem+json"),
        (status = 422, description = "`invalid_identifier`, `schema_mismatch`, `unsupported_type`, `precision_loss`, `invalid_value`, `invalid_operation`, `invalid_primary_key`, `null_primary_key`, `row_too_large`, `invalid_partitioning`, `invalid_clustering`, `invalid_table_options` (the declared table options do not fit the schema)", body = ProblemDocument, content_type = "application/problem+json"),
        (status = 429, description = "`backpressure`: retry after `Retry-After` seconds", body = ProblemDocument, content_type = "application/problem+json"),
        (status = 503, description = "`execution_owned_elsewhere`: another gateway replica serves the execution and could not be reached (retry after `Retry-After`); `replica_draining`: this replica is shutting down (retry); `gateway_restarted`: the replica that served it stopped (deliver the execution again)", body = ProblemDocument, content_type = "application/problem+json"),
    )
)]
pub(crate) async fn post_batch(
    State(state): State<SharedState>,
    ApiPath((run_id, execution_id, resource)): ApiPath<(String, String, String)>,
    ApiQuery(params): ApiQuery<BatchParams>,
    headers: HeaderMap,
    body: Body,
) -> Result<Answer, Problem> {
    let resource = check_request(&resource, params.seq, &headers)?;
    let target = load_target(&state, &run_id, &execution_id, resource).await?;
    let admission = state.pipeline.admit(&target.uploads, &target.resource.resource).await?;
    let encoded = match decode_and_encode(&state, &target, params.seq, body).await? {
        Decoded::Replay(answer) => return Ok(answer),
        Decoded::New(encoded) => *encoded,
    };
    let reserved = admission.reserve(encoded.batch).await?;
    record_and_enqueue(&state, &target, params.seq, encoded.accepted, reserved).await
}

/// Step 1: what the request says about itself (resource name, `seq`, content headers).
fn check_request(resource: &str, seq: Option<i64>, headers: &HeaderMap) -> Result<ResourceName, Problem> {
    let resource = ResourceName::parse(resource)?;
    if seq.is_some_and(|seq| seq < 0) {
        return Err(Problem::invalid_request("seq must be 0 or greater"));
    }
    check_content_headers(headers)?;
    Ok(resource)
}

/// What a batch request loads into: the run, the declared resource, the execution's current
/// delivery and its uploads.
struct BatchTarget {
    run: RunRecord,
    declared: ResourceRecord,
    resource: ResourceRef,
    uploads: std::sync::Arc<ExecutionUploads>,
}

/// Step 2: the run, the execution (which must be extracting) and the declared resource.
async fn load_target(
    state: &SharedState,
    run_id: &str,
    execution_id: &str,
    resource: ResourceName,
) -> Result<BatchTarget, Problem> {
    let (run, execution) = load_execution(state, run_id, execution_id).await?;
    state.replica.check_owner(&execution).await?;
    let declared = state.store.get_resource(&run.run_id, &resource).await?.ok_or_else(|| {
        Problem::not_found(format!("resource {resource} of run {} (declare it with PUT first)", run.run_id))
    })?;
    if !ExecutionState::ACCEPTING_BATCHES.contains(&execution.state) {
        return Err(Problem::new(
            ErrorCode::ExecutionNotExtracting,
            format!("execution {} is {}; it accepts no more batches", execution.execution_id, execution.state),
        ));
    }
    let uploads = state.pipeline.execution(&execution.key(), execution.delivery);
    Ok(BatchTarget { resource: execution.delivery_ref().resource(resource), run, declared, uploads })
}

/// What the receipt and the lane need of a decoded body once its batches are gone.
struct AcceptedBody {
    rows: usize,
    uncompressed_bytes: usize,
    arrow_ipc_sha256: String,
    canonical_schema: serde_json::Value,
    canonical_schema_sha256: String,
    mapped: MappedSchema,
    serialized_schema: Bytes,
    max_payload_bytes: usize,
    /// Keyed modes: the batch's key ranges, recorded with its receipt.
    key_ranges: Option<Vec<KeyRange>>,
    /// The declared table options resolved against this schema.
    destination_layout: TableLayout,
}

struct EncodedRequest {
    batch: EncodedBatch,
    accepted: AcceptedBody,
}

enum Decoded {
    /// The `seq` was accepted before: the answer is its receipt (or a conflict).
    Replay(Answer),
    New(Box<EncodedRequest>),
}

/// Step 3: decode and hash the whole body, validate its schema against the declaration and the
/// resource's earlier batches, and encode every row into AppendRows payloads.
async fn decode_and_encode(
    state: &SharedState,
    target: &BatchTarget,
    seq: Option<i64>,
    body: Body,
) -> Result<Decoded, Problem> {
    let body = decode_body(body, state.settings.max_batch_body_bytes).await?;
    let declared = &target.declared;
    let spec = LoadSpec { write_mode: declared.write_mode, primary_key: &declared.primary_key };
    let mapped = map_schema(&body.schema, spec)?;
    let destination_layout = TableLayout::resolve(
        declared.table_options.as_ref(),
        declared.write_mode,
        &declared.primary_key,
        &mapped.destination_columns,
        mapped.incoming.fields(),
    )?;
    if mapped.stages_seq && seq.is_some_and(|seq| seq > MAX_KEYED_SEQ) {
        return Err(Problem::invalid_request(format!(
            "write mode {} orders rows by (seq, row): seq must be at most {MAX_KEYED_SEQ}",
            declared.write_mode
        )));
    }
    let canonical_schema = mapped.canonical_json();
    let canonical_schema_sha256 = schema_sha256(&canonical_schema);
    if let Some(seq) = seq
        && let Some(existing) = state.store.find_receipt(&target.resource, seq).await?
    {
        return replayed(existing, &body.arrow_ipc_sha256).map(Decoded::Replay);
    }
    if let Some(staging) = state.store.get_staging_stream(&target.resource).await?
        && staging.arrow_schema_sha256 != canonical_schema_sha256
    {
        return Err(schema_mismatch(&target.resource.resource, &staging.arrow_schema, &canonical_schema));
    }
    let serialized_schema = schema_message(&mapped.staging);
    let max_payload_bytes = state
        .settings
        .max_append_request_bytes
        .saturating_sub(REQUEST_FRAMING_BYTES + serialized_schema.len())
        .max(1024);
    let payloads = encode_payloads(&body, &mapped, max_payload_bytes)?;
    let key_ranges = mapped.stages_seq.then(|| bounds::key_ranges(&payloads, &mapped));
    let batch = EncodedBatch { payloads, rows: body.rows, stages_seq: mapped.stages_seq };
    let accepted = AcceptedBody {
        rows: body.rows,
        uncompressed_bytes: body.uncompressed_bytes,
        arrow_ipc_sha256: body.arrow_ipc_sha256,
        canonical_schema,
        canonical_schema_sha256,
        mapped,
        serialized_schema,
        max_payload_bytes,
        key_ranges,
        destination_layout,
    };
    Ok(Decoded::New(Box::new(EncodedRequest { batch, accepted })))
}

/// Step 5: under the execution's gate (shared), re-check the state, record the receipt, stamp
/// the rows with its `seq` and queue them on the resource's lane.
async fn record_and_enqueue(
    state: &SharedState,
    target: &BatchTarget,
    seq: Option<i64>,
    body: AcceptedBody,
    reserved: ReservedBatch,
) -> Result<Answer, Problem> {
    let accepting = target.uploads.accepting().await;
    // Re-check under the gate: a transition or redelivery may have happened while decoding.
    let delivery = &target.resource.delivery;
    let (_, current) = load_execution(state, delivery.run_id(), delivery.execution_id()).await?;
    // The owner may have handed the execution over meanwhile (it is shutting down).
    state.replica.check_owner(&current).await?;
    if !ExecutionState::ACCEPTING_BATCHES.contains(&current.state) || current.delivery != delivery.delivery {
        return Err(Problem::new(
            ErrorCode::ExecutionNotExtracting,
            format!(
                "execution {} is {} (delivery {}); it accepts no more batches",
                current.execution_id, current.state, current.delivery
            ),
        ));
    }
    let staging_table = staging_table_name(&target.resource, &target.declared.table_name);
    let inserted = state
        .store
        .insert_batch(&NewBatch {
            resource: &target.resource,
            seq,
            rows: body.rows as i64,
            uncompressed_bytes: body.uncompressed_bytes as i64,
            arrow_ipc_sha256: &body.arrow_ipc_sha256,
            arrow_schema: &body.canonical_schema,
            arrow_schema_sha256: &body.canonical_schema_sha256,
            staging_table: &staging_table,
            key_ranges: body.key_ranges.as_ref().map(|ranges| serde_json::json!(ranges)),
        })
        .await?;
    let receipt = match inserted {
        InsertBatch::Inserted(receipt) => receipt,
        InsertBatch::SeqTaken(existing) => return replayed(existing, &body.arrow_ipc_sha256),
        InsertBatch::SchemaMismatch { recorded } => {
            return Err(schema_mismatch(&target.resource.resource, &recorded, &body.canonical_schema));
        }
    };
    let queued = reserved.accept(&receipt)?;
    let (rows, uncompressed_bytes) = (body.rows as u64, body.uncompressed_bytes as u64);
    let lane_target = || lane_target(target, body, staging_table);
    state.pipeline.enqueue(&accepting, &target.resource.resource, lane_target, queued);
    metrics::counter!(telemetry::BATCHES_QUEUED).increment(1);
    metrics::counter!(telemetry::ROWS_RECEIVED).increment(rows);
    metrics::counter!(telemetry::BYTES_RECEIVED).increment(uncompressed_bytes);
    Ok((StatusCode::ACCEPTED, axum::Json(receipt.into())))
}

/// Where the resource's lane sends its rows (built on the resource's first batch).
fn lane_target(target: &BatchTarget, body: AcceptedBody, staging_table: String) -> LaneTarget {
    let run = &target.run;
    let batching = &run.batching;
    let max_payload_bytes = body.max_payload_bytes;
    LaneTarget {
        resource: target.resource.clone(),
        project: run.destination.project.clone(),
        dataset: run.destination.dataset.clone(),
        location: run.destination.location().map(str::to_string),
        destination_table: target.declared.table_name.clone(),
        staging_table,
        destination_columns: body.mapped.destination_columns,
        destination_layout: body.destination_layout,
        staging_columns: body.mapped.staging_columns,
        serialized_schema: body.serialized_schema,
        batching: BatchingPolicy {
            max_rows: batching.max_rows.map_or(DEFAULT_BATCH_ROWS, |rows| rows as usize),
            max_bytes: batching.max_bytes.map_or(max_payload_bytes, |bytes| bytes as usize).min(max_payload_bytes),
            flush_interval: Duration::from_millis(batching.flush_interval_ms.unwrap_or(DEFAULT_FLUSH_INTERVAL_MS)),
        },
    }
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

fn replayed(existing: ReceiptRecord, sha256: &str) -> Result<Answer, Problem> {
    if existing.arrow_ipc_sha256 == sha256 {
        Ok((StatusCode::OK, axum::Json(existing.into())))
    } else {
        Err(Problem::new(
            ErrorCode::BatchConflict,
            format!("seq {} of resource {} was already accepted with other content", existing.seq, existing.resource),
        ))
    }
}

fn schema_mismatch(resource: &ResourceName, recorded: &serde_json::Value, received: &serde_json::Value) -> Problem {
    Problem::new(
        ErrorCode::SchemaMismatch,
        format!("resource {resource} changed schema within the execution: first batch had {recorded}, this one has {received}"),
    )
    .with_hint("every batch of a resource within one execution must have the same schema")
}
