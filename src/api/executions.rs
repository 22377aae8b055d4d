//! Executions: open (and redeliver), read, checkpoint, pause, commit, abort. State transitions
//! go through [`begin_transition`], which holds the execution's gate exclusively (a
//! `pipeline::Transitioning` guard) so they never interleave with a batch being accepted.

use axum::extract::State;
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::SharedState;
use super::auth::{Caller, RunAccess};
use super::error::{ApiJson, ApiPath, ApiQuery, OptionalApiJson};
use super::problems;
use super::runs::load_run;
use super::views::{ExecutionView, execution_view};
use crate::audit;
use crate::error::{ErrorCode, Problem};
use crate::model::{ExecutionId, ExecutionKey, ExecutionState};
use crate::pipeline::{Pipeline, Transitioning};
use crate::principals::Action;
use crate::publish::{AbortOutcome, CommitStart, CommitThrough};
use crate::replica::{Owned, Ownership};
use crate::store::{Event, ExecutionRecord, OpenExecution, RunRecord};

/// Body of `POST /v1/runs/{run_id}/executions`.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct OpenExecutionRequest {
    /// `[A-Za-z0-9_-]{1,64}`; generated when absent. An existing id starts a new delivery.
    pub(crate) execution_id: Option<String>,
    /// Publish every destination in one multi-statement transaction (all tables change or
    /// none); default: the run's `atomic`. Fixed when the execution is first opened (a new
    /// delivery keeps it). Refused with `atomic_publication_unsupported` when the run's
    /// resources do not fit one transaction (more than 100 tables, `direct_append`,
    /// `widen_columns`).
    pub(crate) atomic: Option<bool>,
}

/// Body of `POST .../checkpoints`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct CheckpointRequest {
    /// Opaque JSON from the source (a cursor, a position), kept exactly as sent (numbers of
    /// any length and precision, key order). Durable once the execution commits.
    #[schema(value_type = Object)]
    pub(crate) checkpoint: Box<serde_json::value::RawValue>,
}

/// Answer of `POST .../checkpoints`.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub(crate) struct CheckpointResponse {
    /// 0, 1, 2, ... within the current delivery.
    pub(crate) checkpoint_seq: i64,
    /// Rows of this delivery queued for upload when the checkpoint was recorded.
    pub(crate) flushed_rows: i64,
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct CommitParams {
    /// Wait for the terminal state (or `staged`, when held) and answer 200 with it. Closing
    /// the connection stops only the waiting: the commit goes on.
    #[serde(default)]
    pub(crate) wait: bool,
    /// Stop at the barrier: stage every stream and record the priced plan, then stay `staged`
    /// with nothing published. The same as the body's `hold`.
    #[serde(default)]
    pub(crate) hold: bool,
}

/// Optional body of `POST .../commit` (no body, or `{}`, commits through publication).
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct CommitRequest {
    /// Stop at the barrier: stage every stream and record the priced plan (`plan` in the
    /// execution), then stay `staged`, nothing published, until a commit without `hold`
    /// publishes it as planned or `abort` deletes its staging tables. A held execution must
    /// be committed within the pending-stream limit counted from its oldest stream
    /// (`FILAMENT_PENDING_STREAM_MAX_AGE_SECS`, 23 h), else that commit fails with
    /// `pending_stream_expired`. The same as the query parameter `hold=true`.
    #[serde(default)]
    pub(crate) hold: bool,
}

/// The run and the execution, or `invalid_identifier` / `not_found` (the run's first).
pub(super) async fn load_execution(
    state: &SharedState,
    caller: &Caller,
    run_id: &str,
    execution_id: &str,
    access: RunAccess,
) -> Result<(RunRecord, ExecutionRecord), Problem> {
    let run = load_run(state, caller, run_id, access).await?;
    let key = ExecutionKey { run_id: run.run_id.clone(), execution_id: ExecutionId::parse(execution_id)? };
    let execution = state.store.get_execution(&key).await?.ok_or_else(|| Problem::not_found(&key))?;
    Ok((run, execution))
}

/// The execution's gate held exclusively, and the execution as it is under the gate, with the
/// proof that this replica may change it: no batch is half-accepted while the caller changes
/// the state. The guard's delivery is the one the transition must name (a newer delivery may
/// have started before the gate was taken). The gate is the delivery's own while extraction
/// goes on (created if no batch came yet); past it, the uploads this replica holds, if any,
/// else a detached gate: a late transition of an ended execution leaves nothing behind.
async fn begin_transition(
    state: &SharedState,
    caller: &Caller,
    run_id: &str,
    execution_id: &str,
) -> Result<(Transitioning, RunRecord, Owned<ExecutionRecord>), Problem> {
    let (_, execution) = load_execution(state, caller, run_id, execution_id, RunAccess::Change).await?;
    let execution = state.replica.claim(execution).await?;
    let (key, delivery) = (execution.key(), execution.delivery);
    let lanes = if ExecutionState::BEFORE_COMMIT.contains(&execution.state) {
        state.pipeline.open_delivery(&key, delivery)
    } else {
        state.pipeline.delivery(&key, delivery).unwrap_or_else(|| Pipeline::detached(delivery))
    };
    let transitioning = lanes.begin_transition().await;
    let (run, current) = load_execution(state, caller, run_id, execution_id, RunAccess::Change).await?;
    let current = state.replica.claim(current).await?;
    Ok((transitioning, run, current))
}

/// 409: the execution is past the state `action` needs; a failed one names why it failed.
fn not_extracting(execution: &ExecutionRecord, action: &str) -> Problem {
    let why = execution.error.as_ref().map(|e| format!(" ({}: {})", e.code, e.detail)).unwrap_or_default();
    Problem::new(
        ErrorCode::ExecutionNotExtracting,
        format!("cannot {action}: execution {} is {}{why}", execution.execution_id, execution.state),
    )
}

/// Open an execution, or start a new delivery of an existing one.
#[utoipa::path(
    post, path = "/v1/runs/{run_id}/executions", tag = "executions", security(("bearer" = []), ("google_id_token" = [])),
    params(("run_id" = String, Path, description = "Run id")),
    request_body(content = OpenExecutionRequest, description = "Optional; `{}` generates an id"),
    responses(
        (status = 201, description = "Execution created (state `extracting`)", body = ExecutionView),
        (status = 200, description = "Existing execution: a new delivery started", body = ExecutionView),
        problems::OpenExecutionProblems,
    )
)]
pub(crate) async fn open_execution(
    State(state): State<SharedState>,
    caller: Caller,
    ApiPath(run_id): ApiPath<String>,
    ApiJson(request): ApiJson<OpenExecutionRequest>,
) -> Result<(StatusCode, axum::Json<ExecutionView>), Problem> {
    caller.require(Action::Write)?;
    let run = load_run(&state, &caller, &run_id, RunAccess::Change).await?;
    // A replica shutting down takes no execution it would have to hand over.
    state.replica.refuse_new_work()?;
    let execution_id = match request.execution_id {
        Some(id) => ExecutionId::parse(id)?,
        None => ExecutionId::generate(),
    };
    let atomic_wanted = request.atomic.unwrap_or(run.atomic);
    let key = ExecutionKey { run_id: run.run_id, execution_id };
    // Hold the current delivery's gate so no batch is half-accepted while the delivery changes.
    let previous = state.store.get_execution(&key).await?;
    if previous.as_ref().map_or(atomic_wanted, |previous| previous.atomic) {
        let resources = state.store.list_resources(&key.run_id).await?;
        if let Some(problem) = crate::publish::atomic::refusal(&resources) {
            return Err(problem);
        }
    }
    // Another live replica holds the open delivery's uploads: it alone can cancel them. An
    // owner whose lease lapsed has its execution failed, and the redelivery goes ahead; a
    // handed-over one is simply delivered again here.
    let previous_delivery = match previous.map(|previous| state.replica.ownership(previous)) {
        Some(Ownership::Elsewhere(problem)) => return Err(problem),
        Some(Ownership::Orphaned(previous)) => {
            state.replica.fail_orphan(&previous).await;
            Some(previous.delivery)
        }
        Some(Ownership::Mine(previous)) => Some(previous.delivery),
        Some(Ownership::HandedOver(previous)) => Some(previous.delivery),
        None => None,
    };
    let lanes = previous_delivery.and_then(|delivery| state.pipeline.delivery(&key, delivery));
    let _transitioning = match &lanes {
        Some(lanes) => Some(lanes.begin_transition().await),
        None => None,
    };
    let (status, record) = match state.store.open_execution(&key, &state.replica.lease, atomic_wanted).await? {
        OpenExecution::Created(record) => (StatusCode::CREATED, record),
        OpenExecution::Redelivered(record) => {
            // The previous delivery's uploads are abandoned: their pending streams are never
            // committed, so none of their rows can become visible.
            state.pipeline.cancel(&key);
            (StatusCode::OK, record)
        }
        OpenExecution::Committing(record) => return Err(not_extracting(&record, "deliver it again")),
    };
    let started = Event::DeliveryStarted { delivery: record.delivery, replica: &state.replica.lease.owner };
    state.store.record_event(&record.delivery_ref(), None, started).await;
    Ok((status, axum::Json(execution_view(&state.store, record).await?)))
}

/// An execution with per-resource progress and publications.
#[utoipa::path(
    get, path = "/v1/runs/{run_id}/executions/{execution_id}", tag = "executions", security(("bearer" = []), ("google_id_token" = [])),
    params(("run_id" = String, Path, description = "Run id"), ("execution_id" = String, Path, description = "Execution id")),
    responses(
        (status = 200, description = "The execution", body = ExecutionView),
        problems::GetExecutionProblems,
    )
)]
pub(crate) async fn get_execution(
    State(state): State<SharedState>,
    caller: Caller,
    ApiPath((run_id, execution_id)): ApiPath<(String, String)>,
) -> Result<axum::Json<ExecutionView>, Problem> {
    caller.require_read()?;
    let (_, execution) = load_execution(&state, &caller, &run_id, &execution_id, RunAccess::Read).await?;
    Ok(axum::Json(execution_view(&state.store, execution).await?))
}

/// Record a checkpoint after every resource's buffered rows were queued for upload.
#[utoipa::path(
    post, path = "/v1/runs/{run_id}/executions/{execution_id}/checkpoints", tag = "executions", security(("bearer" = []), ("google_id_token" = [])),
    params(("run_id" = String, Path, description = "Run id"), ("execution_id" = String, Path, description = "Execution id")),
    request_body = CheckpointRequest,
    responses(
        (status = 200, description = "Checkpoint recorded", body = CheckpointResponse),
        problems::CheckpointProblems,
    )
)]
pub(crate) async fn post_checkpoint(
    State(state): State<SharedState>,
    caller: Caller,
    ApiPath((run_id, execution_id)): ApiPath<(String, String)>,
    ApiJson(request): ApiJson<CheckpointRequest>,
) -> Result<axum::Json<CheckpointResponse>, Problem> {
    caller.require(Action::Write)?;
    let (transitioning, _, execution) = begin_transition(&state, &caller, &run_id, &execution_id).await?;
    if !ExecutionState::BEFORE_COMMIT.contains(&execution.state) || execution.delivery != transitioning.delivery() {
        return Err(not_extracting(&execution, "checkpoint"));
    }
    // With the gate held no batch is being accepted: queue what the lanes accumulated.
    state.pipeline.flush(&transitioning).await;
    let delivery = execution.delivery_ref();
    let flushed_rows: i64 = state.store.resource_progress(&delivery).await?.iter().map(|p| p.rows_received).sum();
    let checkpoint_seq = state.store.add_checkpoint(&delivery, &request.checkpoint, flushed_rows).await?;
    Ok(axum::Json(CheckpointResponse { checkpoint_seq, flushed_rows }))
}

/// Stop accepting batches; accepted uploads keep running so commit can drain them.
#[utoipa::path(
    post, path = "/v1/runs/{run_id}/executions/{execution_id}/pause", tag = "executions", security(("bearer" = []), ("google_id_token" = [])),
    params(("run_id" = String, Path, description = "Run id"), ("execution_id" = String, Path, description = "Execution id")),
    responses(
        (status = 200, description = "Execution paused", body = ExecutionView),
        problems::PauseProblems,
    )
)]
pub(crate) async fn pause_execution(
    State(state): State<SharedState>,
    caller: Caller,
    ApiPath((run_id, execution_id)): ApiPath<(String, String)>,
) -> Result<axum::Json<ExecutionView>, Problem> {
    caller.require(Action::Write)?;
    let (transitioning, _, execution) = begin_transition(&state, &caller, &run_id, &execution_id).await?;
    let delivery = execution.key().delivery(transitioning.delivery());
    let paused =
        state.store.transition_execution(&delivery, ExecutionState::BEFORE_COMMIT, ExecutionState::Paused).await?;
    match paused {
        Some(record) => {
            state.store.record_event(&delivery, None, Event::Paused).await;
            Ok(axum::Json(execution_view(&state.store, record).await?))
        }
        None => Err(not_extracting(
            &load_execution(&state, &caller, &run_id, &execution_id, RunAccess::Change).await?.1,
            "pause",
        )),
    }
}

/// Finish extraction and publish: drain uploads, commit streams, run one query job per table.
///
/// Once asked, a commit runs to its end (`committed` or `failed`) whoever waits: a client that
/// stops waiting (closes the connection of `wait=true`, times out, exits) cancels nothing.
/// `POST .../abort` is the way to cancel, accepted until publication starts (the first
/// destination job; then 409 `publication_in_progress` and the commit finishes). To learn the
/// outcome, or to retry after a lost answer, use the same execution id: `GET` it, or commit it
/// again (200 once committed; with `wait=true` it waits for a commit still running; 409
/// `execution_not_extracting` once it failed or was aborted). A new delivery of a committed
/// execution publishes nothing twice (its fingerprint is matched); a retry under a new execution
/// id is a new load, and appends its rows again.
#[utoipa::path(
    post, path = "/v1/runs/{run_id}/executions/{execution_id}/commit", tag = "executions", security(("bearer" = []), ("google_id_token" = [])),
    params(("run_id" = String, Path, description = "Run id"), ("execution_id" = String, Path, description = "Execution id"), CommitParams),
    request_body(content = Option<CommitRequest>, description = "Optional; `{\"hold\": true}` stops at the barrier (`staged`)"),
    responses(
        (status = 202, description = "Committing (poll the execution)", body = ExecutionView),
        (status = 200, description = "With `wait=true`, or already committed (or staged, when held): the execution in that state", body = ExecutionView),
        problems::CommitProblems,
    )
)]
pub(crate) async fn commit_execution(
    State(state): State<SharedState>,
    caller: Caller,
    ApiPath((run_id, execution_id)): ApiPath<(String, String)>,
    ApiQuery(params): ApiQuery<CommitParams>,
    OptionalApiJson(request): OptionalApiJson<CommitRequest>,
) -> Result<(StatusCode, axum::Json<ExecutionView>), Problem> {
    caller.require(Action::Commit)?;
    let hold = params.hold || request.is_some_and(|request| request.hold);
    let through = if hold { CommitThrough::Barrier } else { CommitThrough::Publication };
    let (transitioning, run, execution) = begin_transition(&state, &caller, &run_id, &execution_id).await?;
    let max_age = state.settings.pending_stream_max_age;
    let lease = &state.replica.lease;
    let started = state.publisher.begin_commit(transitioning, (run, execution), through, max_age, lease).await?;
    let committing = match started {
        CommitStart::Started(committing) => committing,
        CommitStart::Current(current) => return already_committing(&state, *current, params.wait).await,
    };
    audit::execution_committed(caller.name(), &run_id, &execution_id);
    let publisher = state.publisher.serving(&committing.run);
    let started = committing.execution.clone();
    // The commit runs after the answer, in a trace of the gateway's own linked to the request:
    // the trace id its jobs are labelled with is never one a caller chose.
    let request = crate::traces::current_span_context();
    let span = tracing::trace_span!(target: crate::traces::TARGET, parent: None, "execution.commit",
        run_id = %run_id, execution_id = %execution_id);
    crate::traces::follow(&span, None, request.as_slice());
    let commit = async move { publisher.commit(*committing).await };
    let task = state.commits.spawn(tracing::Instrument::instrument(commit, span));
    if !params.wait {
        return Ok((StatusCode::ACCEPTED, axum::Json(execution_view(&state.store, started).await?)));
    }
    let record = match task.await {
        Ok(result) => result?,
        Err(e) => return Err(Problem::internal(format!("commit task stopped: {e}"))),
    };
    Ok((StatusCode::OK, axum::Json(execution_view(&state.store, record).await?)))
}

/// The answer to a commit of an execution another request committed or is committing (waited
/// for with `wait`), or 409 when it ended otherwise.
async fn already_committing(
    state: &SharedState,
    current: ExecutionRecord,
    wait: bool,
) -> Result<(StatusCode, axum::Json<ExecutionView>), Problem> {
    match current.state {
        ExecutionState::Committed | ExecutionState::Staged => {
            Ok((StatusCode::OK, axum::Json(execution_view(&state.store, current).await?)))
        }
        ExecutionState::Committing => {
            let record = if wait { wait_for_terminal(state, &current.key()).await? } else { current };
            let status = if record.state.is_resting() { StatusCode::OK } else { StatusCode::ACCEPTED };
            Ok((status, axum::Json(execution_view(&state.store, record).await?)))
        }
        _ => Err(not_extracting(&current, "commit")),
    }
}

/// Polls until another request's commit ends (or holds, `staged`), for at most the publication
/// job timeout (then the current record, still committing: answered 202).
async fn wait_for_terminal(state: &SharedState, key: &ExecutionKey) -> Result<ExecutionRecord, Problem> {
    let deadline = tokio::time::Instant::now() + state.publisher.query_job_timeout;
    loop {
        let record = state.store.get_execution(key).await?.ok_or_else(|| Problem::not_found(key))?;
        if record.state.is_resting() || tokio::time::Instant::now() >= deadline {
            return Ok(record);
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}

/// Abandon the execution: uploads are cancelled and nothing of it is published; every
/// destination stays as it was. Accepted until a commit submits its first destination job;
/// from then on destinations may change, so abort answers 409 `publication_in_progress` (naming
/// the destinations already submitted) and the commit runs to its end (`committed` or
/// `failed`). Staging tables are deleted (a committing execution's by its commit).
#[utoipa::path(
    post, path = "/v1/runs/{run_id}/executions/{execution_id}/abort", tag = "executions", security(("bearer" = []), ("google_id_token" = [])),
    params(("run_id" = String, Path, description = "Run id"), ("execution_id" = String, Path, description = "Execution id")),
    responses(
        (status = 200, description = "Execution aborted", body = ExecutionView),
        problems::AbortProblems,
    )
)]
pub(crate) async fn abort_execution(
    State(state): State<SharedState>,
    caller: Caller,
    ApiPath((run_id, execution_id)): ApiPath<(String, String)>,
) -> Result<axum::Json<ExecutionView>, Problem> {
    caller.require(Action::Abort)?;
    let (transitioning, run, execution) = begin_transition(&state, &caller, &run_id, &execution_id).await?;
    match state.publisher.abort(transitioning, run, execution, &state.commits).await? {
        AbortOutcome::Aborted(record) => {
            audit::execution_aborted(caller.name(), &run_id, &execution_id);
            Ok(axum::Json(execution_view(&state.store, record).await?))
        }
        AbortOutcome::Refused(current)
            if current.state == ExecutionState::Committing && current.publishing_at.is_some() =>
        {
            Err(publication_in_progress(&state, &current).await?)
        }
        AbortOutcome::Refused(current) => Err(not_extracting(&current, "abort")),
    }
}

/// 409 for an abort that comes after the commit began changing destinations.
async fn publication_in_progress(state: &SharedState, execution: &ExecutionRecord) -> Result<Problem, Problem> {
    let submitted: Vec<String> = state
        .store
        .list_publications(&execution.key())
        .await?
        .into_iter()
        .filter(|p| p.state != crate::model::PublicationState::Failed)
        .map(|p| p.destination)
        .collect();
    let listed = if submitted.is_empty() { "none yet".to_string() } else { submitted.join(", ") };
    Ok(Problem::new(
        ErrorCode::PublicationInProgress,
        format!(
            "execution {} is publishing (destinations submitted: {listed}); the commit runs to its end",
            execution.execution_id
        ),
    )
    .with_hint(
        "wait for the commit's outcome (GET the execution); a committed load is undone with a new load, not an abort",
    ))
}
