//! Operations endpoints (no token): liveness, readiness, Prometheus metrics, the OpenAPI document.

use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::SharedState;
use super::problems;
use crate::error::Problem;

/// Readiness of one dependency.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub(crate) struct ReadinessCheck {
    pub(crate) name: String,
    pub(crate) ok: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) error: Option<String>,
}

/// Readiness report.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub(crate) struct Readiness {
    pub(crate) ready: bool,
    pub(crate) checks: Vec<ReadinessCheck>,
}

/// 200 while the process serves.
#[utoipa::path(get, path = "/healthz", tag = "operations", responses((status = 200, description = "Serving", body = String)))]
pub(crate) async fn healthz() -> &'static str {
    "ok"
}

/// 200 when Postgres and BigQuery are reachable (and credentials yield a token) and the replica
/// is not shutting down, else 503.
#[utoipa::path(
    get, path = "/readyz", tag = "operations",
    responses(
        (status = 200, description = "Ready", body = Readiness),
        (status = 503, description = "A dependency is not reachable, or the replica is shutting down (check `serving`)", body = Readiness),
    )
)]
pub(crate) async fn readyz(State(state): State<SharedState>) -> (StatusCode, axum::Json<Readiness>) {
    let (postgres, bigquery) =
        tokio::join!(state.store.ping(), state.bigquery.probe(&state.settings.readiness_project));
    let checks = vec![
        ReadinessCheck { name: "postgres".into(), ok: postgres.is_ok(), error: postgres.err().map(|e| e.to_string()) },
        ReadinessCheck {
            name: "bigquery".into(),
            ok: bigquery.is_ok(),
            error: bigquery.err().map(|e| e.problem(crate::bigquery::error::Stage::Readiness).to_string()),
        },
        ReadinessCheck {
            name: "serving".into(),
            ok: !state.replica.is_draining(),
            error: state.replica.is_draining().then(|| "shutting down: handing its executions over".into()),
        },
    ];
    let ready = checks.iter().all(|c| c.ok);
    let status = if ready { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
    (status, axum::Json(Readiness { ready, checks }))
}

/// Prometheus text exposition.
#[utoipa::path(get, path = "/metrics", tag = "operations", responses((status = 200, description = "Prometheus text format", body = String, content_type = "text/plain")))]
pub(crate) async fn metrics(State(state): State<SharedState>) -> Response {
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], state.metrics.render()).into_response()
}

/// This document.
#[utoipa::path(
    get, path = "/openapi.json", tag = "operations",
    responses(
        (status = 200, description = "The OpenAPI 3.1 document", body = Object),
        problems::OpenApiDocumentProblems,
    )
)]
pub(crate) async fn openapi_document() -> Response {
    match serde_json::from_str::<serde_json::Value>(&super::openapi_json()) {
        Ok(document) => axum::Json(document).into_response(),
        Err(e) => Problem::internal(format!("OpenAPI document: {e}")).into_response(),
    }
}
