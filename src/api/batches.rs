//! `POST .../resources/{resource}/batches[?seq=N]`: one Arrow IPC stream per request.
//!
//! The handler checks what the request says about itself (resource name, `seq`, content
//! headers, declared length) and loads what it names (run, execution, declared resource, the
//! proof that this replica serves the execution); from there the request belongs to
//! [`intake`](crate::intake), which admits, reads, prepares, records and queues it. This module
//! holds the HTTP side only: type rules and sizes are `ingest`'s, batching and lanes the
//! pipeline's, the order of the steps intake's.

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use futures::StreamExt as _;
use serde::Deserialize;
use utoipa::IntoParams;

use super::SharedState;
use super::auth::{Caller, RunAccess};
use super::error::{ApiPath, ApiQuery};
use super::problems;
use super::runs::load_run;
use super::views::Receipt;
use crate::error::{ErrorCode, Problem};
use crate::http::body_deadline::BodyTimedOut;
use crate::ingest::prepare::BatchLimits;
use crate::intake::{Accepted, BatchRequest, BatchTarget, Intake};
use crate::model::{ExecutionId, ExecutionKey, ResourceName};
use crate::principals::Action;

pub(crate) const ARROW_STREAM_CONTENT_TYPE: &str = "application/vnd.apache.arrow.stream";

/// The batch body in OpenAPI: raw bytes of an Arrow IPC stream. Only its schema exists: the
/// handler reads the body as a stream.
pub(crate) struct ArrowIpcStream;

impl utoipa::PartialSchema for ArrowIpcStream {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        use utoipa::openapi::schema::{KnownFormat, ObjectBuilder, SchemaFormat, Type};
        ObjectBuilder::new()
            .schema_type(Type::String)
            .format(Some(SchemaFormat::KnownFormat(KnownFormat::Binary)))
            .description(Some("The batch body in OpenAPI: raw bytes of an Arrow IPC stream."))
            .into()
    }
}

impl utoipa::ToSchema for ArrowIpcStream {}

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
    security(("bearer" = []), ("google_id_token" = [])),
    params(
        ("run_id" = String, Path, description = "Run id"),
        ("execution_id" = String, Path, description = "Execution id"),
        ("resource" = String, Path, description = "Declared resource"),
        ("Content-Encoding" = Option<String>, Header, description = "`gzip` or `zstd`"),
        BatchParams
    ),
    request_body(content = ArrowIpcStream, content_type = "application/vnd.apache.arrow.stream", description = "An Arrow IPC stream: schema message, record batches (buffers optionally LZ4_FRAME or ZSTD compressed), optional end marker. Column names are BigQuery's flexible column names. Field metadata chooses types the Arrow type alone does not: `ARROW:extension:name` = `arrow.json` (JSON), `geoarrow.wkb` on binaries or `geoarrow.wkt` on strings (GEOGRAPHY); `bigquery_type` = `JSON`, `GEOGRAPHY` (strings of WKT or GeoJSON, binaries of WKB) or `RANGE` (a struct of `start` and `end`, Date32 or Timestamp). Interval and Duration columns are INTERVAL. The full mapping: docs/type-mapping.md"),
    responses(
        (status = 202, description = "Accepted and queued for upload", body = Receipt),
        (status = 200, description = "Replay of an accepted `seq` with the same body: the original receipt", body = Receipt),
        problems::BatchProblems,
    )
)]
pub(crate) async fn post_batch(
    State(state): State<SharedState>,
    caller: Caller,
    ApiPath((run_id, execution_id, resource)): ApiPath<(String, String, String)>,
    ApiQuery(params): ApiQuery<BatchParams>,
    headers: HeaderMap,
    body: Body,
) -> Result<Answer, Problem> {
    caller.require(Action::Write)?;
    let resource = check_request(&resource, params.seq, &headers)?;
    let target = load_target(&state, &caller, &run_id, &execution_id, resource).await?;
    let declared_length = declared_length(&headers, state.settings.max_batch_body_bytes)?;
    let intake = Intake {
        store: &state.store,
        pipeline: &state.pipeline,
        replica: &state.replica,
        limits: BatchLimits {
            max_batch_body_bytes: state.settings.max_batch_body_bytes,
            max_append_request_bytes: state.settings.max_append_request_bytes,
        },
    };
    let body = body.into_data_stream().map(|chunk| chunk.map_err(body_read_error));
    let request = BatchRequest {
        target,
        principal: std::sync::Arc::clone(&caller.principal),
        seq: params.seq,
        declared_length,
        body,
    };
    Ok(match intake.accept(request).await? {
        Accepted::Queued(receipt) => (StatusCode::ACCEPTED, axum::Json(receipt.into())),
        Accepted::Replayed(receipt) => (StatusCode::OK, axum::Json(receipt.into())),
    })
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

/// Step 2: the run, the execution (which this replica must serve) and the declared resource.
async fn load_target(
    state: &SharedState,
    caller: &Caller,
    run_id: &str,
    execution_id: &str,
    resource: ResourceName,
) -> Result<BatchTarget, Problem> {
    let run = load_run(state, caller, run_id, RunAccess::Change).await?;
    let key = ExecutionKey { run_id: run.run_id.clone(), execution_id: ExecutionId::parse(execution_id)? };
    let (execution, declared) =
        state.store.get_execution_and_resource(&key, &resource).await?.ok_or_else(|| Problem::not_found(&key))?;
    let execution = state.replica.claim(execution).await?;
    let declared = declared.ok_or_else(|| {
        Problem::not_found(format!("resource {resource} of run {} (declare it with PUT first)", run.run_id))
    })?;
    Ok(BatchTarget { run, declared, execution })
}

/// A body that could not be read: too slow (408 `body_timeout`), or broken (400).
fn body_read_error(error: axum::Error) -> Problem {
    match BodyTimedOut::in_chain(&error) {
        Some(timed_out) => Problem::new(ErrorCode::BodyTimeout, timed_out.to_string())
            .with_hint("send the body faster (FILAMENT_BODY_MIN_RATE_BYTES_PER_SEC), or in smaller batch requests"),
        None => Problem::invalid_request(format!("could not read the request body: {error}")),
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
