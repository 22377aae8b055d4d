//! `POST .../resources/{resource}/batches[?seq=N]`: one Arrow IPC stream per request.
//!
//! The handler runs seven steps; their order is carried by the pipeline's admission types
//! (`pipeline::admission`) and ingestion's (`ingest::prepare`), so that a rejected request
//! changes nothing, and every byte it makes the gateway hold is counted before it is
//! allocated: check the request, load what it targets, get admitted (room in the resource's
//! share), read and decode the body under the receive budget, prepare it against the
//! declaration (its staged size known), convert and encode it under the upload budget, then
//! record the receipt and queue the rows under the execution's gate. This module holds the
//! HTTP side only: type rules and sizes are `ingest`'s, batching and lanes the pipeline's.

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use futures::StreamExt as _;
use serde::Deserialize;
use utoipa::IntoParams;

use super::SharedState;
use super::body_deadline::BodyTimedOut;
use super::error::{ApiPath, ApiQuery, ProblemDocument};
use super::executions::load_execution;
use super::views::Receipt;
use crate::error::{ErrorCode, Problem};
use crate::ingest::decode::{BodyDecoder, DecodedBody, Progress};
use crate::ingest::prepare::{BatchLimits, BodySummary, Declaration, PreparedBatch, prepare};
use crate::model::bounds::KeyRange;
use crate::model::staging::staging_table_name;
use crate::model::{ExecutionState, ResourceName, ResourceRef};
use crate::pipeline::{Admission, ExecutionUploads, LaneTarget, ReservedBatch};
use crate::replica::Owned;
use crate::store::{ExecutionRecord, InsertBatch, NewBatch, ReceiptRecord, ResourceRecord, RunRecord};
use crate::telemetry;

pub(crate) const ARROW_STREAM_CONTENT_TYPE: &str = "application/vnd.apache.arrow.stream";

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
        (status = 408, description = "`body_timeout`: the body arrived slower than `FILAMENT_BODY_MIN_RATE_BYTES_PER_SEC`", body = ProblemDocument, content_type = "application/problem+json"),
        (status = 409, description = "`execution_not_extracting`, `batch_conflict`, `resource_conflict` (the resource was declared again while the batch was read)", body = ProblemDocument, content_type = "application/problem+json"),
        (status = 413, description = "`payload_too_large`: the body, or its rows once staged (naming the column), exceed the body limit", body = ProblemDocument, content_type = "application/problem+json"),
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
    let declared_length = declared_length(&headers, state.settings.max_batch_body_bytes)?;
    let mut admission = state.pipeline.admit(&target.uploads, &target.resource.resource, declared_length).await?;
    let body = receive_body(body, &mut admission, state.settings.max_batch_body_bytes).await?;
    let prepared = match prepare_body(&state, &target, params.seq, body).await? {
        Prepared::Replay(answer) => return Ok(answer),
        Prepared::New(prepared) => prepared,
    };
    let converting = admission.reserve(prepared.staged_bytes()).await?;
    let (mut encoded, summary) = prepared.encode()?;
    let key_ranges = encoded.key_ranges.take();
    let reserved = converting.settle(encoded);
    record_and_enqueue(&state, &target, params.seq, summary, key_ranges, reserved).await
}

/// The body's length when the request declares it (not content-encoded), refused at once
/// beyond the body limit.
fn declared_length(headers: &HeaderMap, max_body_bytes: usize) -> Result<Option<usize>, Problem> {
    let Some(length) = headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<u64>().ok()) else {
        return Ok(None);
    };
    if length > max_body_bytes as u64 {
        return Err(crate::ingest::IngestError::BodyTooLarge { limit_bytes: max_body_bytes }.into());
    }
    Ok(Some(length as usize))
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
    /// This replica serves the execution.
    execution: Owned<ExecutionRecord>,
}

/// Step 2: the run, the execution (which must be extracting) and the declared resource.
async fn load_target(
    state: &SharedState,
    run_id: &str,
    execution_id: &str,
    resource: ResourceName,
) -> Result<BatchTarget, Problem> {
    let (run, execution) = load_execution(state, run_id, execution_id).await?;
    let execution = state.replica.claim(execution).await?;
    let declared = state.store.get_resource(&run.run_id, &resource).await?.ok_or_else(|| {
        Problem::not_found(format!("resource {resource} of run {} (declare it with PUT first)", run.run_id))
    })?;
    if !ExecutionState::ACCEPTING_BATCHES.contains(&execution.state) {
        return Err(Problem::new(
            ErrorCode::ExecutionNotExtracting,
            format!("execution {} is {}; it accepts no more batches", execution.execution_id, execution.state),
        ));
    }
    let uploads = state.pipeline.open_delivery(&execution.key(), execution.delivery);
    Ok(BatchTarget { resource: execution.delivery_ref().resource(resource), run, declared, uploads, execution })
}

enum Prepared {
    /// The `seq` was accepted before: the answer is its receipt (or a conflict).
    Replay(Answer),
    New(Box<PreparedBatch>),
}

/// Step 4: the body checked against the declaration and the resource's earlier batches in
/// this delivery, its staged size known; or the receipt of a `seq` accepted before.
async fn prepare_body(
    state: &SharedState,
    target: &BatchTarget,
    seq: Option<i64>,
    body: DecodedBody,
) -> Result<Prepared, Problem> {
    let declared = &target.declared;
    let declaration = Declaration {
        write_mode: declared.write_mode,
        primary_key: &declared.primary_key,
        table_options: declared.table_options.as_ref(),
    };
    let limits = BatchLimits {
        max_batch_body_bytes: state.settings.max_batch_body_bytes,
        max_append_request_bytes: state.settings.max_append_request_bytes,
    };
    let prepared = prepare(body, declaration, seq, &limits)?;
    let summary = prepared.summary();
    if let Some(seq) = seq
        && let Some(existing) = state.store.find_receipt(&target.resource, seq).await?
    {
        return replayed(existing, &summary.arrow_ipc_sha256).map(Prepared::Replay);
    }
    if let Some(staging) = state.store.get_staging_stream(&target.resource).await?
        && staging.arrow_schema_sha256 != summary.canonical_schema_sha256
    {
        return Err(schema_mismatch(&target.resource.resource, &staging.arrow_schema, &summary.canonical_schema));
    }
    Ok(Prepared::New(Box::new(prepared)))
}

/// Step 3: reads and decodes the body, holding what it receives (and what IPC-compressed
/// buffers decompress to) in the receive budget before decoding allocates it. The body's
/// deadline (`api::body_deadline`) ends a slow one with 408 `body_timeout`.
async fn receive_body(body: Body, admission: &mut Admission, max_body_bytes: usize) -> Result<DecodedBody, Problem> {
    let mut decoder = BodyDecoder::new(max_body_bytes);
    let mut stream = body.into_data_stream();
    let (mut received, mut held) = (0usize, admission.received_bytes());
    while let Some(chunk) = stream.next().await {
        let mut chunk = chunk.map_err(body_read_error)?;
        received = received.saturating_add(chunk.len());
        if received > max_body_bytes {
            return Err(crate::ingest::IngestError::BodyTooLarge { limit_bytes: max_body_bytes }.into());
        }
        if received > held {
            admission.hold_received(received - held).await?;
            held = received;
        }
        while !chunk.is_empty() {
            if let Progress::MessageComplete { decompressed_bytes } = decoder.push_some(&mut chunk)? {
                admission.hold_received(decompressed_bytes).await?;
                decoder.decode_completed()?;
            }
        }
    }
    Ok(decoder.finish()?)
}

/// A body that could not be read: too slow (408 `body_timeout`), or broken (400).
fn body_read_error(error: axum::Error) -> Problem {
    match BodyTimedOut::in_chain(&error) {
        Some(timed_out) => Problem::new(ErrorCode::BodyTimeout, timed_out.to_string())
            .with_hint("send the body faster (FILAMENT_BODY_MIN_RATE_BYTES_PER_SEC), or in smaller batch requests"),
        None => Problem::invalid_request(format!("could not read the request body: {error}")),
    }
}

/// Step 7: under the execution's gate (shared), re-check the state, record the receipt, stamp
/// the rows with its `seq` and queue them on the resource's lane.
async fn record_and_enqueue(
    state: &SharedState,
    target: &BatchTarget,
    seq: Option<i64>,
    body: BodySummary,
    key_ranges: Option<Vec<KeyRange>>,
    reserved: ReservedBatch,
) -> Result<Answer, Problem> {
    let accepting = target.uploads.accepting().await;
    // Re-check under the gate: a transition or redelivery may have happened while decoding.
    let delivery = &target.resource.delivery;
    let (_, current) = load_execution(state, delivery.run_id(), delivery.execution_id()).await?;
    // The owner may have handed the execution over meanwhile (it is shutting down).
    let current = state.replica.claim(current).await?;
    if !ExecutionState::ACCEPTING_BATCHES.contains(&current.state) || current.delivery != target.execution.delivery {
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
            key_ranges: key_ranges.as_ref().map(|ranges| serde_json::json!(ranges)),
            declaration: &target.declared,
        })
        .await?;
    let receipt = match inserted {
        InsertBatch::Inserted(receipt) => receipt,
        InsertBatch::SeqTaken(existing) => return replayed(existing, &body.arrow_ipc_sha256),
        InsertBatch::SchemaMismatch { recorded } => {
            return Err(schema_mismatch(&target.resource.resource, &recorded, &body.canonical_schema));
        }
        InsertBatch::DeclarationChanged { current } => return Err(redeclared(&target.declared, current.as_ref())),
    };
    let queued = reserved.accept(&receipt)?;
    let (rows, uncompressed_bytes) = (body.rows as u64, body.uncompressed_bytes as u64);
    let lane_target = || LaneTarget::new(target.resource.clone(), &target.run, &target.declared, body);
    state.pipeline.enqueue(&accepting, &target.resource.resource, lane_target, queued);
    metrics::counter!(telemetry::BATCHES_QUEUED).increment(1);
    metrics::counter!(telemetry::ROWS_RECEIVED).increment(rows);
    metrics::counter!(telemetry::BYTES_RECEIVED).increment(uncompressed_bytes);
    Ok((StatusCode::ACCEPTED, axum::Json(receipt.into())))
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

/// 409 `resource_conflict`: the resource was declared otherwise while the batch was prepared
/// for its previous declaration; nothing was recorded.
fn redeclared(prepared_for: &ResourceRecord, current: Option<&ResourceRecord>) -> Problem {
    let now = match current {
        None => "it is no longer declared".to_string(),
        Some(current) => format!(
            "it is now {} with primary key [{}] into table {} (the batch was read as {} with primary key [{}] into table {})",
            current.write_mode,
            current.primary_key.join(", "),
            current.table_name,
            prepared_for.write_mode,
            prepared_for.primary_key.join(", "),
            prepared_for.table_name
        ),
    };
    Problem::new(
        ErrorCode::ResourceConflict,
        format!(
            "resource {} was declared again while this batch was read: {now}; nothing was recorded",
            prepared_for.resource
        ),
    )
    .with_hint("send the batch again: it is read under the resource's current declaration")
}

/// Differing columns named in a `schema_mismatch` answer, at most (the rest are counted).
const SHOWN_SCHEMA_DIFFERENCES: usize = 10;

fn schema_mismatch(resource: &ResourceName, recorded: &serde_json::Value, received: &serde_json::Value) -> Problem {
    let differences = schema_differences(recorded, received);
    let shown: Vec<&str> = differences.iter().take(SHOWN_SCHEMA_DIFFERENCES).map(String::as_str).collect();
    let more = differences.len().saturating_sub(SHOWN_SCHEMA_DIFFERENCES);
    let more = if more > 0 { format!(", and {more} more") } else { String::new() };
    Problem::new(
        ErrorCode::SchemaMismatch,
        format!("resource {resource} changed schema within the execution: {}{more}", shown.join("; ")),
    )
    .with_hint("every batch of a resource within one execution must have the same schema")
}

/// How two canonical schemas (`[{"name", "type", "nullable"}]`) differ, column by column.
fn schema_differences(recorded: &serde_json::Value, received: &serde_json::Value) -> Vec<String> {
    let columns =
        |schema: &serde_json::Value| -> Vec<serde_json::Value> { schema.as_array().cloned().unwrap_or_default() };
    let (recorded, received) = (columns(recorded), columns(received));
    let name = |column: &serde_json::Value| column["name"].as_str().unwrap_or_default().to_string();
    let describe = |column: &serde_json::Value| {
        let nullable = if column["nullable"] == true { "nullable" } else { "not null" };
        let json = if column["json"] == true { ", JSON" } else { "" };
        format!("{} ({nullable}{json})", column["type"].as_str().unwrap_or_default())
    };
    let mut differences = Vec::new();
    for (position, column) in received.iter().enumerate() {
        match recorded.iter().position(|r| name(r) == name(column)) {
            None => differences.push(format!("column {:?} is new", name(column))),
            Some(was) if recorded[was] != *column => differences.push(format!(
                "column {:?} was {}, is {}",
                name(column),
                describe(&recorded[was]),
                describe(column)
            )),
            Some(was) if was != position => {
                differences.push(format!("column {:?} moved from position {was} to {position}", name(column)));
            }
            Some(_) => {}
        }
    }
    for column in &recorded {
        if !received.iter().any(|r| name(r) == name(column)) {
            differences.push(format!("column {:?} is missing", name(column)));
        }
    }
    differences
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_schema_mismatch_names_the_differing_columns_bounded() {
        let column = |name: &str, kind: &str| serde_json::json!({"name": name, "type": kind, "nullable": true});
        let recorded: Vec<_> = (0..10_000).map(|i| column(&format!("c{i}"), "Int64")).collect();
        let mut received = recorded.clone();
        received[3] = column("c3", "Utf8");
        received.push(column("extra", "Int64"));
        received.remove(0);
        let problem = schema_mismatch(
            &"r".parse().unwrap(),
            &serde_json::Value::Array(recorded),
            &serde_json::Value::Array(received),
        );
        assert!(
            problem.detail.contains("column \"c3\" was Int64 (nullable), is Utf8 (nullable)"),
            "{}",
            problem.detail
        );
        assert!(problem.detail.contains("more"), "{}", problem.detail);
        assert!(problem.detail.len() < 2000, "bounded: {} bytes", problem.detail.len());
    }
}
