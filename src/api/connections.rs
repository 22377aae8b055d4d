//! `POST /v1/connections/test`: authenticate and run `SELECT 1` as a query job.

use std::time::{Duration, Instant};

use axum::extract::State;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::SharedState;
use super::error::{ApiJson, ProblemDocument};
use crate::error::{ErrorCode, Problem};
use crate::model::ids::{validate_location, validate_project_id};

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
    post, path = "/v1/connections/test", tag = "connections", security(("bearer" = [])),
    request_body = ConnectionTestRequest,
    responses(
        (status = 200, description = "BigQuery answered", body = ConnectionTestResponse),
        (status = 400, description = "Malformed body", body = ProblemDocument, content_type = "application/problem+json"),
        (status = 401, description = "Missing or invalid token", body = ProblemDocument, content_type = "application/problem+json"),
        (status = 415, description = "Not JSON", body = ProblemDocument, content_type = "application/problem+json"),
        (status = 422, description = "Invalid project or location", body = ProblemDocument, content_type = "application/problem+json"),
        (status = 502, description = "BigQuery refused: `service_disabled`, `missing_credentials`, `permission_denied`, ... with a hint", body = ProblemDocument, content_type = "application/problem+json"),
        (status = 503, description = "BigQuery unreachable", body = ProblemDocument, content_type = "application/problem+json"),
    )
)]
pub(crate) async fn test_connection(
    State(state): State<SharedState>,
    ApiJson(request): ApiJson<ConnectionTestRequest>,
) -> Result<axum::Json<ConnectionTestResponse>, Problem> {
    validate_project_id(&request.project)?;
    let location = request.location.as_deref().filter(|l| !l.is_empty());
    if let Some(location) = location {
        validate_location(location)?;
    }
    let started = Instant::now();
    let job_id = format!("filament_connection_test_{}", hex::encode(rand::random::<[u8; 12]>()));
    state
        .bigquery
        .run_query_job(&request.project, location, &job_id, "SELECT 1", Duration::from_secs(60))
        .await
        .map_err(|e| e.to_problem(ErrorCode::BigqueryError))?;
    Ok(axum::Json(ConnectionTestResponse { ok: true, elapsed_ms: started.elapsed().as_millis() as u64 }))
}
