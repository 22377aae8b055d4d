//! `GET /v1/runs`: the runs the caller may read, newest first, with their latest execution.
//! Parses the filters and the opaque page token, scopes the list to the caller's own runs
//! unless it has `read_all`, and asks `store::run_list` for one page (one query, keyset
//! pagination: a page is stable while new runs arrive, since they sort before it).

use axum::extract::State;
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::SharedState;
use super::auth::Caller;
use super::error::ApiQuery;
use super::problems;
use crate::error::{ErrorCode, Problem};
use crate::model::ExecutionState;
use crate::store::{RunListCursor, RunListQuery, RunListRow, Store};

/// Runs per page without `limit`, and at most.
pub(crate) const DEFAULT_RUNS_PER_PAGE: u32 = 50;
pub(crate) const MAX_RUNS_PER_PAGE: u32 = 500;

/// Query of `GET /v1/runs`.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub(crate) struct ListRunsParams {
    /// The state of the run's latest execution (runs without an execution are left out).
    pub(crate) state: Option<ExecutionState>,
    /// The destination dataset.
    pub(crate) dataset: Option<String>,
    /// The principal that created the run (a caller without `read_all` sees only its own).
    pub(crate) principal: Option<String>,
    /// Runs created after this instant (RFC 3339).
    pub(crate) created_after: Option<DateTime<Utc>>,
    /// Runs created before this instant (RFC 3339).
    pub(crate) created_before: Option<DateTime<Utc>>,
    /// Runs per page: 50 by default, at most 500.
    #[param(minimum = 1, maximum = 500)]
    pub(crate) limit: Option<u32>,
    /// `next_page_token` of the previous page, with the same filters.
    pub(crate) page_token: Option<String>,
}

/// The error of a failed latest execution.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub(crate) struct RunListError {
    pub(crate) code: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) hint: Option<String>,
}

/// The latest execution of a listed run: its state and its current delivery's progress.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub(crate) struct LatestExecution {
    pub(crate) execution_id: String,
    pub(crate) state: ExecutionState,
    pub(crate) created_at: DateTime<Utc>,
    pub(crate) rows_received: i64,
    pub(crate) rows_acknowledged: i64,
    pub(crate) bytes_received: i64,
    /// Set when the execution failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) error: Option<RunListError>,
}

/// Where a listed run loads to.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub(crate) struct RunListDestination {
    pub(crate) project: String,
    pub(crate) dataset: String,
}

/// One run of the list.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub(crate) struct RunListItem {
    pub(crate) run_id: String,
    pub(crate) destination: RunListDestination,
    pub(crate) principal: String,
    pub(crate) created_at: DateTime<Utc>,
    /// The later of the run's and its latest execution's last change.
    pub(crate) updated_at: DateTime<Utc>,
    /// Absent until the run's first execution is opened.
    pub(crate) latest_execution: Option<LatestExecution>,
}

/// One page of runs, newest first.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct RunList {
    pub(crate) runs: Vec<RunListItem>,
    /// Pass as `page_token` for the next page; absent on the last page.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) next_page_token: Option<String>,
}

/// The page token's content (base64url of this JSON: opaque to clients).
#[derive(Debug, Serialize, Deserialize)]
struct PageToken {
    created_at: DateTime<Utc>,
    run_id: String,
}

fn encode_page_token(cursor: &RunListCursor) -> String {
    let token = PageToken { created_at: cursor.created_at, run_id: cursor.run_id.clone() };
    // Serialising two plain fields cannot fail.
    URL_SAFE_NO_PAD.encode(serde_json::to_vec(&token).unwrap_or_default())
}

fn decode_page_token(token: &str) -> Result<RunListCursor, Problem> {
    let invalid = || {
        Problem::new(ErrorCode::InvalidPageToken, "page_token is not a token this gateway handed out")
            .with_hint("pass the `next_page_token` of the previous page unchanged, or leave it out for the first page")
    };
    let bytes = URL_SAFE_NO_PAD.decode(token).map_err(|_| invalid())?;
    let token: PageToken = serde_json::from_slice(&bytes).map_err(|_| invalid())?;
    if crate::model::RunId::parse(token.run_id.as_str()).is_err() || !within_postgres_range(token.created_at) {
        return Err(invalid());
    }
    Ok(RunListCursor { created_at: token.created_at, run_id: token.run_id })
}

/// Instants Postgres' `timestamptz` holds and people mean: years 1 to 9999 (chrono parses
/// signed, five-digit years too).
fn within_postgres_range(at: DateTime<Utc>) -> bool {
    (1..=9999).contains(&chrono::Datelike::year(&at))
}

impl ListRunsParams {
    /// The store's query for `caller`: its own runs unless it has `read_all` (`None`: it asked
    /// for another principal's runs, of which it sees none).
    fn into_query(self, caller: &Caller) -> Result<Option<RunListQuery>, Problem> {
        let limit = self.limit.unwrap_or(DEFAULT_RUNS_PER_PAGE);
        if !(1..=MAX_RUNS_PER_PAGE).contains(&limit) {
            return Err(Problem::new(
                ErrorCode::InvalidRequest,
                format!("limit {limit} is outside 1 to {MAX_RUNS_PER_PAGE}"),
            ));
        }
        for (name, at) in [("created_after", self.created_after), ("created_before", self.created_before)] {
            if at.is_some_and(|at| !within_postgres_range(at)) {
                return Err(Problem::invalid_request(format!("{name} is outside the years 1 to 9999")));
            }
        }
        if let Some(dataset) = &self.dataset {
            crate::model::ids::validate_dataset_id(dataset)?;
        }
        if let Some(principal) = &self.principal {
            crate::principals::PrincipalName::parse(principal)
                .map_err(|rule| Problem::invalid_request(format!("principal filter: {rule}")))?;
        }
        let principal = match self.principal {
            _ if caller.reads_all() => self.principal,
            Some(other) if other != caller.name() => return Ok(None),
            _ => Some(caller.name().to_string()),
        };
        let after = self.page_token.as_deref().map(decode_page_token).transpose()?;
        Ok(Some(RunListQuery {
            principal,
            dataset: self.dataset,
            state: self.state,
            created_after: self.created_after,
            created_before: self.created_before,
            after,
            limit,
        }))
    }
}

fn list_item(row: RunListRow) -> RunListItem {
    let latest_execution = match (row.execution_id, row.execution_state, row.execution_created_at) {
        (Some(execution_id), Some(state), Some(created_at)) => Some(LatestExecution {
            execution_id,
            state,
            created_at,
            rows_received: row.rows_received.unwrap_or(0),
            rows_acknowledged: row.rows_acknowledged.unwrap_or(0),
            bytes_received: row.bytes_received.unwrap_or(0),
            error: row.error_code.map(|code| RunListError { code, hint: row.error_hint }),
        }),
        _ => None,
    };
    RunListItem {
        run_id: row.run_id.to_string(),
        destination: RunListDestination { project: row.project, dataset: row.dataset },
        principal: row.principal,
        created_at: row.created_at,
        updated_at: row.execution_updated_at.map_or(row.updated_at, |at| at.max(row.updated_at)),
        latest_execution,
    }
}

/// The runs the caller may read, newest first.
#[utoipa::path(
    get, path = "/v1/runs", tag = "runs", security(("bearer" = []), ("google_id_token" = [])),
    params(ListRunsParams),
    responses(
        (status = 200, description = "One page of runs, newest first", body = RunList),
        problems::ListRunsProblems,
    )
)]
pub(crate) async fn list_runs(
    State(state): State<SharedState>,
    caller: Caller,
    ApiQuery(params): ApiQuery<ListRunsParams>,
) -> Result<axum::Json<RunList>, Problem> {
    Ok(axum::Json(runs_page(&state.store, &caller, params).await?))
}

/// One page of the runs `caller` may read (the API's and the console's).
pub(crate) async fn runs_page(store: &Store, caller: &Caller, params: ListRunsParams) -> Result<RunList, Problem> {
    caller.require_read()?;
    let Some(query) = params.into_query(caller)? else {
        return Ok(RunList { runs: Vec::new(), next_page_token: None });
    };
    let rows = store.list_runs(&query).await?;
    let full_page = rows.len() == query.limit as usize;
    let next_page_token = rows
        .last()
        .filter(|_| full_page)
        .map(|last| encode_page_token(&RunListCursor { created_at: last.created_at, run_id: last.run_id.to_string() }));
    Ok(RunList { runs: rows.into_iter().map(list_item).collect(), next_page_token })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_page_token_round_trips_to_the_microsecond_and_anything_else_is_refused() {
        let created_at = DateTime::parse_from_rfc3339("2026-12-01T10:11:12.123456Z").unwrap().with_timezone(&Utc);
        let cursor = RunListCursor { created_at, run_id: "run-7".into() };
        assert_eq!(decode_page_token(&encode_page_token(&cursor)).unwrap(), cursor);
        let forged = |created_at: &str, run_id: &str| {
            URL_SAFE_NO_PAD.encode(format!("{{\"created_at\":\"{created_at}\",\"run_id\":\"{run_id}\"}}"))
        };
        let (nul, far) = (forged("2026-12-01T00:00:00Z", "r\\u0000"), forged("-10000-01-01T00:00:00Z", "r"));
        for bad in ["", "not base64!", "e30", &URL_SAFE_NO_PAD.encode(b"{\"run_id\":1}"), &nul, &far] {
            assert_eq!(decode_page_token(bad).unwrap_err().code, ErrorCode::InvalidPageToken, "{bad}");
        }
    }
}
