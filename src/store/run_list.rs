//! The runs list (`GET /v1/runs`): runs newest first with their latest execution's progress,
//! filtered and keyset-paginated on `(created_at, run_id)`, in one query served by the indexes
//! of migration 0011 (`runs_created_at`, or `runs_principal_created_at` when the list is one
//! principal's; `executions_run_created_at` for each run's latest execution). `api::run_list`
//! turns the rows into the answer and its page token.

use chrono::{DateTime, Utc};
use sqlx::{Postgres, QueryBuilder};

use super::{Store, StoreResult};
use crate::model::{ExecutionState, RunId};

/// Where a page starts: after this run in the list's order (newest first).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RunListCursor {
    pub(crate) created_at: DateTime<Utc>,
    pub(crate) run_id: String,
}

/// What the list holds: every filter is optional; `principal` is forced to the caller's own
/// name for a caller without `read_all`.
#[derive(Debug, Clone, Default)]
pub(crate) struct RunListQuery {
    pub(crate) principal: Option<String>,
    pub(crate) dataset: Option<String>,
    /// The state of the run's latest execution (a run without one has none and is left out).
    pub(crate) state: Option<ExecutionState>,
    pub(crate) created_after: Option<DateTime<Utc>>,
    pub(crate) created_before: Option<DateTime<Utc>>,
    pub(crate) after: Option<RunListCursor>,
    pub(crate) limit: u32,
}

/// One run of the list with its latest execution (all `None` when it has none yet).
#[derive(Debug, Clone, sqlx::FromRow)]
pub(crate) struct RunListRow {
    pub(crate) run_id: RunId,
    pub(crate) project: String,
    pub(crate) dataset: String,
    pub(crate) principal: String,
    pub(crate) created_at: DateTime<Utc>,
    pub(crate) updated_at: DateTime<Utc>,
    pub(crate) execution_id: Option<String>,
    pub(crate) execution_state: Option<ExecutionState>,
    pub(crate) execution_created_at: Option<DateTime<Utc>>,
    pub(crate) execution_updated_at: Option<DateTime<Utc>>,
    pub(crate) error_code: Option<String>,
    pub(crate) error_hint: Option<String>,
    pub(crate) rows_received: Option<i64>,
    pub(crate) bytes_received: Option<i64>,
    pub(crate) rows_acknowledged: Option<i64>,
}

/// The run, its latest execution and that execution's current delivery's totals.
const RUN_LIST_SELECT: &str = "SELECT r.run_id, r.project, r.dataset, r.principal, r.created_at, r.updated_at,
        e.execution_id, e.state AS execution_state, e.created_at AS execution_created_at,
        e.updated_at AS execution_updated_at, e.error->>'code' AS error_code, e.error->>'hint' AS error_hint,
        received.rows_received, received.bytes_received, acknowledged.rows_acknowledged
 FROM runs r
 LEFT JOIN LATERAL (
     SELECT x.execution_id, x.state, x.delivery, x.error, x.created_at, x.updated_at FROM executions x
     WHERE x.run_id = r.run_id ORDER BY x.created_at DESC, x.execution_id DESC LIMIT 1
 ) e ON true
 LEFT JOIN LATERAL (
     SELECT COALESCE(SUM(b.rows), 0)::BIGINT AS rows_received,
            COALESCE(SUM(b.uncompressed_bytes), 0)::BIGINT AS bytes_received
     FROM batches b
     WHERE b.run_id = r.run_id AND b.execution_id = e.execution_id AND b.delivery = e.delivery
 ) received ON e.execution_id IS NOT NULL
 LEFT JOIN LATERAL (
     SELECT COALESCE(SUM(s.rows_acknowledged), 0)::BIGINT AS rows_acknowledged
     FROM staging_streams s
     WHERE s.run_id = r.run_id AND s.execution_id = e.execution_id AND s.delivery = e.delivery
 ) acknowledged ON e.execution_id IS NOT NULL
 WHERE true";

/// The list's SQL for `query`: only the filters given, so the planner can use the index that
/// matches them, ordered as the index is.
fn run_list_sql(query: &RunListQuery) -> QueryBuilder<'_, Postgres> {
    let mut sql = QueryBuilder::new(RUN_LIST_SELECT);
    if let Some(principal) = &query.principal {
        sql.push(" AND r.principal = ").push_bind(principal);
    }
    if let Some(dataset) = &query.dataset {
        sql.push(" AND r.dataset = ").push_bind(dataset);
    }
    if let Some(state) = query.state {
        sql.push(" AND e.state = ").push_bind(state.as_str());
    }
    if let Some(after) = query.created_after {
        sql.push(" AND r.created_at > ").push_bind(after);
    }
    if let Some(before) = query.created_before {
        sql.push(" AND r.created_at < ").push_bind(before);
    }
    if let Some(cursor) = &query.after {
        sql.push(" AND (r.created_at, r.run_id) < (").push_bind(cursor.created_at);
        sql.push(", ").push_bind(&cursor.run_id).push(")");
    }
    sql.push(" ORDER BY r.created_at DESC, r.run_id DESC LIMIT ").push_bind(i64::from(query.limit));
    sql
}

impl Store {
    /// One page of the runs list.
    pub(crate) async fn list_runs(&self, query: &RunListQuery) -> StoreResult<Vec<RunListRow>> {
        Ok(run_list_sql(query).build_query_as().fetch_all(&self.pool).await?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_filters_given_reach_the_sql_and_the_order_matches_the_indexes() {
        let all = RunListQuery { limit: 50, ..Default::default() };
        let sql = run_list_sql(&all).into_sql();
        assert!(sql.ends_with("WHERE true ORDER BY r.created_at DESC, r.run_id DESC LIMIT $1"), "{sql}");
        let cursor = RunListCursor { created_at: Utc::now(), run_id: "r".into() };
        let one_principal = RunListQuery {
            principal: Some("acme".into()),
            state: Some(ExecutionState::Failed),
            after: Some(cursor),
            limit: 10,
            ..Default::default()
        };
        let sql = run_list_sql(&one_principal).into_sql();
        assert!(
            sql.ends_with(
                "WHERE true AND r.principal = $1 AND e.state = $2 AND (r.created_at, r.run_id) < ($3, $4) \
                 ORDER BY r.created_at DESC, r.run_id DESC LIMIT $5"
            ),
            "{sql}"
        );
    }
}
