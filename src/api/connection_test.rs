//! `POST /v1/connections/test`: authenticate and run `SELECT 1` as a query job, labelled with
//! the principal that asked (its cost is someone's). A principal has at most
//! `FILAMENT_MAX_CONNECTION_TESTS_PER_PRINCIPAL` in flight (429 `principal_limit` beyond, at
//! once), and its tests' BigQuery calls take their turns under it (`bigquery::fair`): a project
//! whose queries queue holds that principal's places only.

use std::time::Duration;

use tokio::time::Instant;

use axum::extract::State;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::SharedState;
use super::auth::Caller;
use super::error::ApiJson;
use super::problems;
use crate::bigquery::error::Stage;
use crate::bigquery::fair::Tenant;
use crate::bigquery::jobs::{QueryJob, insert_pushed_back};
use crate::bigquery::retry::{Backoff, RetryDriver, RetryPolicy};
use crate::bigquery::{BigQueryError, CONNECTION_TEST_DEADLINE, CREDENTIALS_DEADLINE, within};
use crate::error::{ErrorCode, Problem};
use crate::model::ids::{validate_location, validate_project_id};
use crate::principals::Action;
use crate::publish::job_id::{JobKind, principal_job_labels};

/// A connection test reports BigQuery's pushback within its deadline: a few retries (about
/// 0.5, 1, 2 and 4 s) rather than the quota wait of an upload.
const CONNECTION_TEST_RETRY: RetryPolicy = RetryPolicy {
    max_attempts: 1,
    backoff: Backoff::new(Duration::ZERO, Duration::ZERO),
    quota_wait: Duration::from_secs(8),
    quota_backoff: Backoff::new(Duration::from_millis(700), Duration::from_secs(6)),
};

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct ConnectionTestRequest {
    pub(crate) project: String,
    pub(crate) location: Option<String>,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub(crate) struct ConnectionTestResponse {
    pub(crate) ok: bool,
    pub(crate) elapsed_ms: u64,
}

/// Check credentials and access: runs `SELECT 1` as a query job in the project and location.
#[utoipa::path(
    post, path = "/v1/connections/test", tag = "connections", security(("bearer" = []), ("google_id_token" = [])),
    request_body = ConnectionTestRequest,
    responses(
        (status = 200, description = "BigQuery answered", body = ConnectionTestResponse),
        problems::ConnectionTestProblems,
    )
)]
pub(crate) async fn test_connection(
    State(state): State<SharedState>,
    caller: Caller,
    ApiJson(request): ApiJson<ConnectionTestRequest>,
) -> Result<axum::Json<ConnectionTestResponse>, Problem> {
    caller.require(Action::Write)?;
    validate_project_id(&request.project)?;
    caller.require_project(&request.project)?;
    let location = request.location.as_deref().filter(|l| !l.is_empty());
    if let Some(location) = location {
        validate_location(location)?;
    }
    let tenant = Tenant::principal(caller.name());
    let Some(_in_flight) = state.settings.connection_tests.try_take(&tenant) else {
        return Err(connection_tests_limit(caller.name(), state.settings.connection_tests.cap()));
    };
    let started = Instant::now();
    let bigquery = &state.bigquery.on_behalf_of(tenant);
    bigquery.probe_credentials(CREDENTIALS_DEADLINE).await.map_err(|e| e.problem(Stage::Credentials))?;
    // 128 random bits: no one can create a job under the id first.
    let job_id = format!("filament_connection_test_{}", hex::encode(rand::random::<[u8; 16]>()));
    // Its cost is the principal's.
    let labels = principal_job_labels(JobKind::ConnectionTest, caller.name());
    let remaining = CONNECTION_TEST_DEADLINE.saturating_sub(started.elapsed());
    let query = QueryJob {
        project: &request.project,
        location,
        job_id: &job_id,
        sql: "SELECT 1",
        labels: &labels,
        maximum_bytes_billed: None,
        statement_byte_budget: None,
        timeout: remaining,
        recorded_statements: &[],
    };
    // Its job is run again when BigQuery pushed back on jobs.insert: the one level that retries it.
    let run = |_| bigquery.run_query_job(&query);
    let job = RetryDriver::new(&CONNECTION_TEST_RETRY, "jobs.insert").run(insert_pushed_back, run);
    within("connection test", remaining, job).await.map_err(|e| connection_problem(&e, &bigquery.endpoints.rest))?;
    Ok(axum::Json(ConnectionTestResponse { ok: true, elapsed_ms: started.elapsed().as_millis() as u64 }))
}

/// 429 `principal_limit`: the principal has its most connection tests in flight.
fn connection_tests_limit(principal: &str, cap: usize) -> Problem {
    Problem::new(
        ErrorCode::PrincipalLimit,
        format!(
            "principal {principal} has {cap} connection tests in flight (FILAMENT_MAX_CONNECTION_TESTS_PER_PRINCIPAL)"
        ),
    )
    .with_hint("wait for the connection tests in flight to answer (within 15 s), then retry")
    .with_retry_after(2)
}

/// The connection test's problem: BigQuery's own diagnosis, or for an endpoint that did not
/// answer in time, `bigquery_unavailable` naming the endpoint.
fn connection_problem(error: &BigQueryError, endpoint: &str) -> Problem {
    let problem = error.problem(Stage::Setup);
    match error {
        BigQueryError::Timeout { seconds, .. } => problem.with_hint(format!(
            "BigQuery's REST API at {endpoint} did not answer within {seconds} s: check that the gateway can reach it (DNS, firewall, proxy, Private Google Access)"
        )),
        _ => problem,
    }
}
