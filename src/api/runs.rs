//! `POST /v1/runs`, `GET /v1/runs/{run_id}`, `PUT /v1/runs/{run_id}/resources/{resource}`.

use std::collections::HashSet;

use axum::extract::State;
use axum::http::StatusCode;
use serde::Deserialize;
use sha2::{Digest as _, Sha256};
use utoipa::ToSchema;

use super::SharedState;
use super::auth::{Caller, RunAccess};
use super::error::{ApiJson, ApiPath};
use super::problems;
use super::views::{ResourceView, RunView, run_view};
use crate::audit;
use crate::error::{ErrorCode, Problem};
use crate::model::columns::MAX_KEY_COLUMNS;
use crate::model::ids::{default_table_name, validate_column_name, validate_project_id, validate_table_name};
use crate::model::table_options::{TableOptions, TableOptionsDeclaration};
use crate::model::write_options::{DeclaredWriteOptions, Deletes, MetadataColumn, OrderByDeclaration, WriteOptions};
use crate::model::{Batching, Destination, ResourceName, RunId, WriteMode};
use crate::principals::Action;
use crate::store::{NewRun, ResourceRecord, ResourceUpsert, RunRecord};

/// Body of `POST /v1/runs`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct CreateRunRequest {
    /// `[A-Za-z0-9_-]{1,64}`; generated when absent.
    pub(crate) run_id: Option<String>,
    pub(crate) destination: Destination,
    pub(crate) batching: Option<Batching>,
    /// Project the publication jobs run and are billed in (a Google Cloud project ID);
    /// default: the destination's. The data stays in the destination project.
    pub(crate) job_project: Option<String>,
    /// Most bytes one publication job may bill; a job that would bill more fails with
    /// `publication_too_expensive` (and the figure it needed).
    pub(crate) maximum_bytes_billed: Option<i64>,
    /// Most bytes every publication of one execution may process together. Judged, with
    /// `maximum_bytes_billed` per publication, on the plan the commit makes at its barrier
    /// (each statement dry-run): an execution over either fails with
    /// `publication_too_expensive`, naming the tables and their bytes, before any publication
    /// job; nothing is published and its staging tables are deleted. A publication BigQuery
    /// cannot dry-run counts as over this budget.
    pub(crate) maximum_bytes_billed_per_execution: Option<i64>,
    /// Publish every destination of each execution in one multi-statement transaction (one
    /// query job: all tables change or none), instead of one job per table. The run's resources
    /// must then fit one transaction: at most 100 destination tables, no `direct_append` and
    /// no `widen_columns` (`atomic_publication_unsupported` at the declaration that breaks it).
    /// An execution may choose otherwise when it opens. Default false (docs/write-modes.md).
    pub(crate) atomic: Option<bool>,
}

/// Body of `PUT /v1/runs/{run_id}/resources/{resource}`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct PutResourceRequest {
    /// Destination table (`[A-Za-z0-9_]{1,1024}`); default: the resource name with every other
    /// character replaced by `_`.
    pub(crate) table: Option<String>,
    pub(crate) write_mode: WriteMode,
    /// Key columns (1 to 16), required by the upsert, delete and merge modes.
    pub(crate) primary_key: Option<Vec<String>>,
    /// Layout of the destination table, applied when the gateway creates it (an existing table
    /// is never re-laid out; a different layout is reported as `layout_mismatch`).
    pub(crate) table_options: Option<TableOptionsDeclaration>,
    /// Load metadata columns the publication sets on every row it writes, in every write mode:
    /// `loaded_at` (`_filament_loaded_at` TIMESTAMP, the publication's time), `run_id`
    /// (`_filament_run_id` STRING), `execution_id` (`_filament_execution_id` STRING). Added to
    /// the destination like any new column (NULLABLE); each listed at most once.
    pub(crate) metadata_columns: Option<Vec<MetadataColumn>>,
    /// Keyed modes: a column, or a list compared in order, that orders the changes: the largest
    /// value wins when a key changes more than once (ties: arrival order), and a staged row
    /// changes a destination row only when its value is at least the row's, so a replayed or
    /// late change never rolls a row back. INT64, NUMERIC, BIGNUMERIC, DATE, DATETIME,
    /// TIMESTAMP or STRING columns of the batches, never NULL.
    pub(crate) order_by: Option<OrderByDeclaration>,
    /// Keyed modes: `hard` (default) removes a deleted row; `soft` keeps it with its last
    /// values and sets `_filament_deleted_at` (TIMESTAMP, the publication's time), which a later
    /// insert, update or upsert of the key clears (declare the upsert resources of a table
    /// whose deletes are soft `soft` too, so their upserts clear it).
    pub(crate) deletes: Option<Deletes>,
    /// `full_upsert`: the run is a snapshot of the source. The publication that completes it
    /// (of the first execution committed without being paused) deletes, or soft-deletes, every
    /// key of the destination the run did not send; earlier (paused) segments delete nothing.
    /// Adds the `run_id` metadata column, which records the run that last sent each key.
    pub(crate) delete_missing: Option<bool>,
    /// An existing destination column narrower than what the batches send is widened to the
    /// batches' type (`ALTER TABLE ... ALTER COLUMN ... SET DATA TYPE`, for the pairs BigQuery
    /// supports: INT64 to NUMERIC, BIGNUMERIC or FLOAT64; NUMERIC to BIGNUMERIC or FLOAT64)
    /// instead of failing with `incompatible_schema`. Checked at set-up, widened by the
    /// publication after the commit's barrier (an execution that fails or is aborted before it
    /// leaves the types as they were). The only DDL the gateway submits; declaring it needs the
    /// `commit` action; off by default (absent: false).
    pub(crate) widen_columns: Option<bool>,
    /// Append modes (`full_append`, `incremental_append`, `cdc_append`) without
    /// `metadata_columns`: the rows are written straight into the destination table's PENDING
    /// stream and committed at publication with `BatchCommitWriteStreams` (atomic per table):
    /// no staging table, no query job, no bytes billed. Applies when every column goes into
    /// the table as sent (no TIME, NUMERIC, BIGNUMERIC, JSON, GEOGRAPHY, RANGE or INTERVAL
    /// value, which are converted by a query; no flexible name; no cast into a wider column);
    /// otherwise the resource loads through staging and its timeline says why. Off by default.
    pub(crate) direct_append: Option<bool>,
}

/// The run, if the caller may see it (its own, or any with `read_all`); otherwise the same
/// 404 `run_not_found` as for a run that does not exist, so no run's existence leaks.
pub(super) async fn load_run(
    state: &SharedState,
    caller: &Caller,
    run_id: &str,
    access: RunAccess,
) -> Result<RunRecord, Problem> {
    let run_id = RunId::parse(run_id)?;
    match state.store.get_run(&run_id).await? {
        Some(run) => caller.require_access(run, access),
        None => Err(Problem::new(ErrorCode::RunNotFound, format!("no run {run_id}"))),
    }
}

/// Create a run (idempotent for the same definition).
#[utoipa::path(
    post, path = "/v1/runs", tag = "runs", security(("bearer" = []), ("google_id_token" = [])),
    request_body = CreateRunRequest,
    responses(
        (status = 201, description = "Run created", body = RunView),
        (status = 200, description = "The same run already exists", body = RunView),
        problems::CreateRunProblems,
    )
)]
pub(crate) async fn create_run(
    State(state): State<SharedState>,
    caller: Caller,
    ApiJson(request): ApiJson<CreateRunRequest>,
) -> Result<(StatusCode, axum::Json<RunView>), Problem> {
    caller.require(Action::Write)?;
    let run_id = match request.run_id {
        Some(id) => RunId::parse(id)?,
        None => caller.generated_run_id(),
    };
    caller.require_run_id(&run_id)?;
    request.destination.validate()?;
    caller.require_destination(&request.destination.project, &request.destination.dataset)?;
    let batching = request.batching.unwrap_or_default();
    batching.validate()?;
    let destination =
        Destination { location: request.destination.location().map(str::to_string), ..request.destination };
    if let Some(project) = &request.job_project {
        validate_project_id(project)?;
        caller.require_project(project)?;
    }
    let billed = crate::model::request_bounds::MAXIMUM_BYTES_BILLED;
    if request.maximum_bytes_billed.is_some_and(|bytes| !billed.contains(bytes)) {
        return Err(Problem::invalid_request(format!("maximum_bytes_billed must be {}", billed.describe())));
    }
    if request.maximum_bytes_billed_per_execution.is_some_and(|bytes| !billed.contains(bytes)) {
        let bounds = billed.describe();
        return Err(Problem::invalid_request(format!("maximum_bytes_billed_per_execution must be {bounds}")));
    }
    let mut definition = serde_json::json!({"destination": destination, "batching": batching});
    // Present only when set, so runs defined before these settings keep their definition.
    if let Some(project) = &request.job_project {
        definition["job_project"] = serde_json::json!(project);
    }
    if let Some(bytes) = request.maximum_bytes_billed {
        definition["maximum_bytes_billed"] = serde_json::json!(bytes);
    }
    if let Some(bytes) = request.maximum_bytes_billed_per_execution {
        definition["maximum_bytes_billed_per_execution"] = serde_json::json!(bytes);
    }
    let atomic = request.atomic.unwrap_or(false);
    if atomic {
        definition["atomic"] = serde_json::json!(true);
    }
    let definition_sha256 = hex::encode(Sha256::digest(definition.to_string().as_bytes()));
    let (run, created) = state
        .store
        .create_run(&NewRun {
            run_id: run_id.clone(),
            destination,
            batching,
            job_project: request.job_project,
            maximum_bytes_billed: request.maximum_bytes_billed,
            maximum_bytes_billed_per_execution: request.maximum_bytes_billed_per_execution,
            atomic,
            definition_sha256: definition_sha256.clone(),
            principal: caller.name().to_string(),
        })
        .await?;
    if !created && run.principal != caller.name() {
        // The id is taken by another principal's run: say no more than that.
        return Err(Problem::new(ErrorCode::RunConflict, format!("run id {run_id} is taken; choose another")));
    }
    if !created && run.definition_sha256 != definition_sha256 {
        return Err(Problem::new(
            ErrorCode::RunConflict,
            format!("run {run_id} already exists with another destination, batching or job settings"),
        ));
    }
    if created {
        audit::run_created(caller.name(), &run.run_id, &run.destination.project, &run.destination.dataset);
    }
    let status = if created { StatusCode::CREATED } else { StatusCode::OK };
    Ok((status, axum::Json(run_view(&state.store, run).await?)))
}

/// A run with its resources, executions and durable checkpoint.
#[utoipa::path(
    get, path = "/v1/runs/{run_id}", tag = "runs", security(("bearer" = []), ("google_id_token" = [])),
    params(("run_id" = String, Path, description = "Run id")),
    responses(
        (status = 200, description = "The run", body = RunView),
        problems::GetRunProblems,
    )
)]
pub(crate) async fn get_run(
    State(state): State<SharedState>,
    caller: Caller,
    ApiPath(run_id): ApiPath<String>,
) -> Result<axum::Json<RunView>, Problem> {
    caller.require_read()?;
    let run = load_run(&state, &caller, &run_id, RunAccess::Read).await?;
    Ok(axum::Json(run_view(&state.store, run).await?))
}

/// 409 `atomic_publication_unsupported` when `declared` would leave the resources of an
/// atomic run (or of a run with an atomic execution open) beyond one transaction.
async fn refuse_what_atomic_publication_cannot_hold(
    state: &SharedState,
    run: &RunRecord,
    declared: &ResourceRecord,
) -> Result<(), Problem> {
    if !run.atomic && !state.store.has_open_atomic_execution(&run.run_id).await? {
        return Ok(());
    }
    let mut resources = state.store.list_resources(&run.run_id).await?;
    resources.retain(|resource| resource.resource != declared.resource);
    resources.push(declared.clone());
    match crate::publish::atomic::refusal(&resources) {
        Some(problem) => Err(problem),
        None => Ok(()),
    }
}

fn validate_primary_key(write_mode: WriteMode, primary_key: &[String]) -> Result<(), Problem> {
    if write_mode.requires_primary_key() && primary_key.is_empty() {
        return Err(Problem::new(
            ErrorCode::PrimaryKeyRequired,
            format!("write mode {write_mode} needs a primary_key"),
        ));
    }
    if primary_key.len() > MAX_KEY_COLUMNS {
        return Err(Problem::new(
            ErrorCode::InvalidPrimaryKey,
            format!("a primary key has at most {MAX_KEY_COLUMNS} columns"),
        ));
    }
    let mut seen = HashSet::new();
    for column in primary_key {
        validate_column_name(column).map_err(|p| Problem::new(ErrorCode::InvalidPrimaryKey, p.detail))?;
        if !seen.insert(column.to_ascii_lowercase()) {
            return Err(Problem::new(ErrorCode::InvalidPrimaryKey, format!("key column {column:?} appears twice")));
        }
    }
    Ok(())
}

/// Declare a resource (idempotent; its mode, key and table are fixed once it has batches).
#[utoipa::path(
    put, path = "/v1/runs/{run_id}/resources/{resource}", tag = "runs", security(("bearer" = []), ("google_id_token" = [])),
    params(("run_id" = String, Path, description = "Run id"), ("resource" = String, Path, description = "Resource name")),
    request_body = PutResourceRequest,
    responses(
        (status = 200, description = "The resource as declared", body = ResourceView),
        problems::PutResourceProblems,
    )
)]
pub(crate) async fn put_resource(
    State(state): State<SharedState>,
    caller: Caller,
    ApiPath((run_id, resource)): ApiPath<(String, String)>,
    ApiJson(request): ApiJson<PutResourceRequest>,
) -> Result<axum::Json<ResourceView>, Problem> {
    caller.require(Action::Write)?;
    RunId::parse(run_id.as_str())?;
    let resource = ResourceName::parse(resource)?;
    let table_name = request.table.unwrap_or_else(|| default_table_name(&resource));
    validate_table_name(&table_name)?;
    let primary_key = request.primary_key.unwrap_or_default();
    validate_primary_key(request.write_mode, &primary_key)?;
    let table_options = request
        .table_options
        .as_ref()
        .map(|declared| TableOptions::parse(declared, request.write_mode, &primary_key))
        .transpose()?;
    let declared_options = DeclaredWriteOptions {
        order_by: request.order_by.as_ref(),
        metadata_columns: request.metadata_columns.as_deref(),
        deletes: request.deletes,
        delete_missing: request.delete_missing,
        widen_columns: request.widen_columns,
        direct_append: request.direct_append,
    };
    let write_options = WriteOptions::parse(request.write_mode, declared_options)?;
    if write_options.widen_columns {
        // It alters a shared table's column types, at commit: only a principal that may commit.
        caller.require(Action::Commit).map_err(|problem| Problem {
            detail: format!(
                "{}: widen_columns alters the destination's column types when the execution commits",
                problem.detail
            ),
            ..problem
        })?;
    }
    let run = load_run(&state, &caller, &run_id, RunAccess::Change).await?;
    let declared = ResourceRecord {
        resource: resource.clone(),
        table_name,
        write_mode: request.write_mode,
        primary_key,
        table_options,
        write_options,
        layout_mismatch: None,
    };
    refuse_what_atomic_publication_cannot_hold(&state, &run, &declared).await?;
    match state.store.upsert_resource(&run.run_id, &declared).await? {
        ResourceUpsert::Stored(stored) => Ok(axum::Json(stored.into())),
        ResourceUpsert::Conflict(current) => Err(Problem::new(
            ErrorCode::ResourceConflict,
            format!(
                "resource {resource} already has batches as {} into {} (key {:?}); its declaration (mode, key, \
                 table, table_options, order_by, metadata_columns, deletes, delete_missing, widen_columns, \
                 direct_append) cannot change",
                current.write_mode, current.table_name, current.primary_key
            ),
        )),
    }
}
