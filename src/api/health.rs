//! Operations endpoints (no token): liveness, readiness, Prometheus metrics, the OpenAPI document.
//! Anyone can call them, so none does uncached work per request: readiness probes its
//! dependencies at most once per [`READINESS_CACHE`] (callers meanwhile share the answer), and
//! the OpenAPI document is serialised once.

use std::sync::LazyLock;
use std::time::Duration;

use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::SharedState;
use super::problems;
use crate::error::Problem;

/// Readiness of one dependency.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
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
    let mut checks = state.readiness.dependencies(&state).await;
    checks.push(ReadinessCheck {
        name: "serving".into(),
        ok: !state.replica.is_draining(),
        error: state.replica.is_draining().then(|| "shutting down: handing its executions over".into()),
    });
    let ready = checks.iter().all(|c| c.ok);
    let status = if ready { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
    (status, axum::Json(Readiness { ready, checks }))
}

/// How long a readiness probe of Postgres and BigQuery answers `/readyz`.
pub(crate) const READINESS_CACHE: Duration = Duration::from_secs(2);

/// The last probe of `/readyz`'s dependencies, and when it was made.
#[derive(Debug, Default)]
pub(crate) struct ReadinessProbe {
    last: tokio::sync::Mutex<Option<(tokio::time::Instant, Vec<ReadinessCheck>)>>,
}

impl ReadinessProbe {
    /// Postgres's and BigQuery's checks: the last probe's while it is fresh, else a new one
    /// (one at a time: concurrent callers wait for it and share it).
    async fn dependencies(&self, state: &SharedState) -> Vec<ReadinessCheck> {
        let mut last = self.last.lock().await;
        if let Some((probed_at, checks)) = last.as_ref()
            && probed_at.elapsed() < READINESS_CACHE
        {
            return checks.clone();
        }
        let (postgres, bigquery) =
            tokio::join!(state.store.ping(), state.bigquery.probe(&state.settings.readiness_project));
        let checks = vec![
            ReadinessCheck {
                name: "postgres".into(),
                ok: postgres.is_ok(),
                error: postgres.err().map(|e| e.to_string()),
            },
            ReadinessCheck {
                name: "bigquery".into(),
                ok: bigquery.is_ok(),
                error: bigquery.err().map(|e| e.problem(crate::bigquery::error::Stage::Readiness).to_string()),
            },
        ];
        *last = Some((tokio::time::Instant::now(), checks.clone()));
        checks
    }
}

/// Prometheus text exposition.
#[utoipa::path(
    get, path = "/metrics", tag = "operations",
    responses(
        (status = 200, description = "Prometheus text format", body = String, content_type = "text/plain"),
        problems::MetricsProblems,
    )
)]
pub(crate) async fn metrics(State(state): State<SharedState>, headers: axum::http::HeaderMap) -> Response {
    if let Some(expected) = &state.settings.metrics_token_sha256 {
        let presented = headers
            .get(header::AUTHORIZATION)
            .and_then(|value| value.to_str().ok())
            .and_then(|value| value.strip_prefix("Bearer "))
            .map(crate::principals::token_digest);
        let admitted =
            presented.is_some_and(|digest| bool::from(subtle::ConstantTimeEq::ct_eq(&digest[..], &expected[..])));
        if !admitted {
            let problem = Problem::new(
                crate::error::ErrorCode::Unauthorized,
                "/metrics needs the scrape token (FILAMENT_METRICS_TOKEN) as Authorization: Bearer <token>",
            );
            let mut response = problem.into_response();
            response.headers_mut().insert(header::WWW_AUTHENTICATE, axum::http::HeaderValue::from_static("Bearer"));
            return response;
        }
    }
    crate::telemetry::allocator_read();
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
    match OPENAPI_DOCUMENT.as_ref() {
        Ok(document) => ([(header::CONTENT_TYPE, "application/json")], document.clone()).into_response(),
        Err(e) => Problem::internal(format!("OpenAPI document: {e}")).into_response(),
    }
}

/// The OpenAPI document, serialised once (compact).
static OPENAPI_DOCUMENT: LazyLock<Result<bytes::Bytes, String>> = LazyLock::new(|| {
    let document: serde_json::Value = serde_json::from_str(&super::openapi_json()).map_err(|e| e.to_string())?;
    serde_json::to_vec(&document).map(bytes::Bytes::from).map_err(|e| e.to_string())
});
