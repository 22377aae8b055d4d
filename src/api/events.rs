//! `GET /v1/runs/{run}/executions/{execution}/events`: the execution's timeline from Postgres
//! (`store::events`), so any replica answers; clients poll with `after` for what is new.

use axum::extract::State;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::SharedState;
use super::auth::{Caller, RunAccess};
use super::error::{ApiPath, ApiQuery};
use super::executions::load_execution;
use super::problems;
use crate::error::{ErrorCode, Problem};
use crate::store::EventRecord;

/// Events per answer without `limit`, and at most.
const DEFAULT_EVENTS_PER_PAGE: u32 = 200;
const MAX_EVENTS_PER_PAGE: u32 = 1000;

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub(crate) struct EventsParams {
    /// Only events after this one (`next_after` of the previous answer); from the start without.
    #[param(minimum = 0)]
    after: Option<i64>,
    /// Events per answer: 200 by default, at most 1000.
    #[param(minimum = 1, maximum = 1000)]
    limit: Option<u32>,
}

/// The execution's events after `after`, oldest first (every delivery).
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct ExecutionEvents {
    events: Vec<EventRecord>,
    /// Pass as `after` to get only newer events (the last event's id, or `after` again).
    next_after: i64,
}

/// The ordered timeline of an execution.
#[utoipa::path(
    get, path = "/v1/runs/{run_id}/executions/{execution_id}/events", tag = "executions",
    security(("bearer" = []), ("google_id_token" = [])),
    params(("run_id" = String, Path, description = "Run id"), ("execution_id" = String, Path, description = "Execution id"), EventsParams),
    responses(
        (status = 200, description = "The events after `after`, oldest first", body = ExecutionEvents),
        problems::EventsProblems,
    )
)]
pub(crate) async fn execution_events(
    State(state): State<SharedState>,
    caller: Caller,
    ApiPath((run_id, execution_id)): ApiPath<(String, String)>,
    ApiQuery(params): ApiQuery<EventsParams>,
) -> Result<axum::Json<ExecutionEvents>, Problem> {
    caller.require_read()?;
    let limit = params.limit.unwrap_or(DEFAULT_EVENTS_PER_PAGE);
    if !(1..=MAX_EVENTS_PER_PAGE).contains(&limit) {
        return Err(Problem::new(
            ErrorCode::InvalidRequest,
            format!("limit {limit} is outside 1 to {MAX_EVENTS_PER_PAGE}"),
        ));
    }
    let after = params.after.unwrap_or(0);
    if after < 0 {
        return Err(Problem::new(ErrorCode::InvalidRequest, "after is negative"));
    }
    let (_, execution) = load_execution(&state, &caller, &run_id, &execution_id, RunAccess::Read).await?;
    let events = state.store.events_after(&execution.key(), after, i64::from(limit)).await?;
    let next_after = events.last().map_or(after, |event| event.event_id);
    Ok(axum::Json(ExecutionEvents { events, next_after }))
}
