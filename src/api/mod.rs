//! The HTTP API of the contract (`openapi/openapi.json`, generated from here): axum routes, one file per
//! resource, each handler carrying its `#[utoipa::path]`. Bearer auth guards `/v1`; every error
//! is a problem+json rendered by [`error`]. Handlers call into [`crate::ingest`],
//! [`crate::pipeline`], [`crate::publish`] and [`crate::store`].

pub(crate) mod auth;
pub(crate) mod batches;
pub(crate) mod connection_test;
pub(crate) mod console;
pub(crate) mod error;
mod events;
pub(crate) mod executions;
pub(crate) mod forward;
pub(crate) mod health;
mod problems;
pub(crate) mod run_list;
pub(crate) mod runs;
mod schema_bounds;
pub(crate) mod views;

use std::sync::Arc;
use tokio::time::Instant;

use axum::extract::{MatchedPath, Request, State};
use axum::http::header;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use metrics_exporter_prometheus::PrometheusHandle;
use tokio_util::task::TaskTracker;
use utoipa::OpenApi;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::bigquery::BigQuery;
use crate::error::{ErrorCode, Problem};
use crate::http::{body_deadline, early_answer};
use crate::pipeline::Pipeline;
use crate::publish::Publisher;
use crate::store::Store;
use crate::telemetry;

/// Limits and settings handlers need.
#[derive(Debug, Clone)]
pub(crate) struct ApiSettings {
    pub(crate) max_batch_body_bytes: usize,
    pub(crate) max_append_request_bytes: usize,
    pub(crate) readiness_project: String,
    pub(crate) pending_stream_max_age: std::time::Duration,
    pub(crate) max_uri_bytes: usize,
    pub(crate) max_header_bytes: usize,
    pub(crate) max_header_count: usize,
    /// How fast request bodies must arrive (408 `body_timeout` otherwise).
    pub(crate) body_rate: body_deadline::BodyRate,
    /// `/metrics` answers only a scraper presenting the token of this digest, when set
    /// (`FILAMENT_METRICS_TOKEN`).
    pub(crate) metrics_token_sha256: Option<[u8; 32]>,
    /// The connection tests each principal has in flight, within
    /// `FILAMENT_MAX_CONNECTION_TESTS_PER_PRINCIPAL` (clones share the counts).
    pub(crate) connection_tests: crate::bigquery::fair::PerPrincipalCap,
}

/// Shared state of every handler.
#[derive(Debug)]
pub(crate) struct ApiState {
    pub(crate) store: Store,
    pub(crate) bigquery: BigQuery,
    pub(crate) pipeline: Pipeline,
    pub(crate) publisher: Publisher,
    pub(crate) settings: ApiSettings,
    /// Credentials to principals (`api::auth`).
    pub(crate) auth: auth::Authenticator,
    pub(crate) metrics: PrometheusHandle,
    /// Commits run as tracked tasks, so shutdown can wait for them.
    pub(crate) commits: TaskTracker,
    /// Requests being served; a request that finds none free is shed.
    pub(crate) request_slots: Arc<tokio::sync::Semaphore>,
    /// This replica: its lease on the executions it serves.
    pub(crate) replica: crate::replica::Replica,
    /// Streams requests to the replica serving their execution.
    pub(crate) forwarder: forward::Forwarder,
    /// The web console's sign-in sessions.
    pub(crate) console: console::session::ConsoleSessions,
    /// `/readyz`'s probe of its dependencies, cached briefly (it needs no credential).
    pub(crate) readiness: health::ReadinessProbe,
}

pub(crate) type SharedState = Arc<ApiState>;

#[derive(OpenApi)]
#[openapi(
    info(
        title = "filament-bigquery",
        description = "HTTP ingestion gateway: extractors POST Apache Arrow IPC streams, the gateway loads them into BigQuery through the Storage Write API.",
        license(name = "Apache-2.0", identifier = "Apache-2.0")
    ),
    components(schemas(error::ProblemDocument)),
    modifiers(&BearerAuth),
    tags(
        (name = "runs", description = "Runs and their resources"),
        (name = "executions", description = "Executions: batches, checkpoints, pause, commit, abort"),
        (name = "connections", description = "Connection checks against BigQuery"),
        (name = "operations", description = "Health, readiness, metrics")
    )
)]
struct ApiDoc;

struct BearerAuth;

impl utoipa::Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some("A principal's opaque token (`fbq_...`; the principals file lists its SHA-256)"))
                    .build(),
            ),
        );
        components.add_security_scheme(
            "google_id_token",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .bearer_format("JWT")
                    .description(Some(
                        "A Google-signed ID token for FILAMENT_GOOGLE_ID_TOKEN_AUDIENCE (Workload Identity); its email selects the principal",
                    ))
                    .build(),
            ),
        );
    }
}

fn v1_routes() -> OpenApiRouter<SharedState> {
    OpenApiRouter::new()
        .routes(routes!(runs::create_run, run_list::list_runs))
        .routes(routes!(runs::get_run))
        .routes(routes!(runs::put_resource))
        .routes(routes!(executions::open_execution))
        .routes(routes!(executions::get_execution))
        .routes(routes!(events::execution_events))
        .routes(routes!(batches::post_batch))
        .routes(routes!(executions::post_checkpoint))
        .routes(routes!(executions::pause_execution))
        .routes(routes!(executions::commit_execution))
        .routes(routes!(executions::abort_execution))
        .routes(routes!(connection_test::test_connection))
}

fn operations_routes() -> OpenApiRouter<SharedState> {
    OpenApiRouter::new()
        .routes(routes!(health::healthz))
        .routes(routes!(health::readyz))
        .routes(routes!(health::metrics))
        .routes(routes!(health::openapi_document))
}

/// The OpenAPI document, generated from the handlers.
pub(crate) fn openapi() -> utoipa::openapi::OpenApi {
    let mut document = OpenApiRouter::<SharedState>::with_openapi(ApiDoc::openapi())
        .merge(v1_routes())
        .merge(operations_routes())
        .into_openapi();
    schema_bounds::apply(&mut document);
    plain_optional_bodies(document)
}

/// An optional request body (`Option<T>` in a handler's `request_body`) is generated as
/// `oneOf: [null, T]`, which client generators mishandle (openapi-python-client serialises its
/// unset value); not `required` already says it may be left out, so its schema becomes `T`.
fn plain_optional_bodies(document: utoipa::openapi::OpenApi) -> utoipa::openapi::OpenApi {
    let Ok(mut value) = serde_json::to_value(&document) else { return document };
    let bodies = value["paths"].as_object_mut().into_iter().flat_map(|paths| paths.values_mut());
    for body in bodies.flat_map(|item| item.as_object_mut().into_iter().flat_map(|ops| ops.values_mut())) {
        let Some(request_body) = body.get_mut("requestBody") else { continue };
        if request_body.get("required").and_then(serde_json::Value::as_bool) == Some(true) {
            continue;
        }
        for media in request_body["content"].as_object_mut().into_iter().flat_map(|content| content.values_mut()) {
            let schema = &mut media["schema"];
            let Some(choices) = schema.get("oneOf").and_then(serde_json::Value::as_array) else { continue };
            let not_null: Vec<&serde_json::Value> = choices.iter().filter(|c| c["type"] != "null").collect();
            if let [only] = not_null[..]
                && not_null.len() + 1 == choices.len()
            {
                *schema = only.clone();
            }
        }
    }
    serde_json::from_value(value).unwrap_or(document)
}

/// The OpenAPI document as the checked-in `openapi/openapi.json` holds it.
pub fn openapi_json() -> String {
    // Serialising a generated document cannot fail.
    openapi().to_pretty_json().unwrap_or_default()
}

/// The complete router with its middleware.
pub(crate) fn router(state: SharedState) -> axum::Router {
    let v1 = v1_routes().route_layer(middleware::from_fn_with_state(Arc::clone(&state), auth::require_principal));
    let (router, _) =
        OpenApiRouter::with_openapi(ApiDoc::openapi()).merge(v1).merge(operations_routes()).split_for_parts();
    router
        .merge(console::routes())
        // Route layers run after routing, so requests are counted by their route template.
        .route_layer(middleware::from_fn_with_state(Arc::clone(&state), record_request))
        .fallback(|| async { Problem::new(ErrorCode::NotFound, "no such route") })
        .method_not_allowed_fallback(|| async {
            Problem::new(ErrorCode::MethodNotAllowed, "the route does not accept this method")
        })
        .layer(tower_http::decompression::RequestDecompressionLayer::new().pass_through_unaccepted(true))
        // Before decompression: a forwarded body travels as the client sent it.
        .layer(middleware::from_fn_with_state(Arc::clone(&state), forward::forward_to_owner))
        .layer(middleware::from_fn_with_state(Arc::clone(&state), protect))
        .layer(middleware::from_fn_with_state(
            unread_body_drain(&state.settings),
            early_answer::answer_after_reading_body,
        ))
        .layer(tower_http::trace::TraceLayer::new_for_http())
        .layer(middleware::map_response_with_state(Arc::clone(&state), strict_transport_security))
        .with_state(state)
}

/// What an early answer reads of an unread request body: up to twice the body limit, so a body
/// refused by its declared length is drained whole, as one refused part-way (at the limit) is
/// drained to its end.
fn unread_body_drain(settings: &ApiSettings) -> early_answer::UnreadBodyDrain {
    early_answer::UnreadBodyDrain { max_bytes: 2 * settings.max_batch_body_bytes as u64 }
}

/// `Strict-Transport-Security` on every answer of a gateway reached over TLS (it serves HTTPS
/// or sits behind a TLS-terminating load balancer, `FILAMENT_BEHIND_TLS`).
async fn strict_transport_security(State(state): State<SharedState>, mut response: Response) -> Response {
    if state.console.is_secure() {
        response
            .headers_mut()
            .insert(axum::http::header::STRICT_TRANSPORT_SECURITY, axum::http::HeaderValue::from_static(console::HSTS));
    }
    response
}

/// Limits that protect the service, checked before anything else: a `Host` on HTTP/1.1 (RFC
/// 9112, section 3.2), URI length, header count and size, concurrent requests (shed with 503
/// rather than queued, so memory stays bounded), and the rate its body must arrive at.
async fn protect(State(state): State<SharedState>, request: Request, next: Next) -> Response {
    if let Err(problem) = check_request_head(&state.settings, &request) {
        return problem.into_response();
    }
    let Ok(_slot) = Arc::clone(&state.request_slots).try_acquire_owned() else {
        return Problem::new(ErrorCode::Overloaded, "the gateway is serving as many requests as it accepts at once")
            .with_hint("retry after the Retry-After delay, or send fewer requests in parallel")
            .with_retry_after(1)
            .into_response();
    };
    let (parts, body) = request.into_parts();
    let body = axum::body::Body::new(body_deadline::DeadlineBody::new(body, state.settings.body_rate));
    next.run(Request::from_parts(parts, body)).await
}

/// The request head within the gateway's limits (those hyper lets it answer: a head larger than
/// the connection's read buffer is refused by hyper itself with a bare 431).
fn check_request_head(settings: &ApiSettings, request: &Request) -> Result<(), Problem> {
    let http11 = request.version() == axum::http::Version::HTTP_11;
    if http11 && !request.headers().contains_key(header::HOST) {
        return Err(Problem::invalid_request("an HTTP/1.1 request must carry a Host header (RFC 9112, section 3.2)"));
    }
    let uri_bytes = request.uri().to_string().len();
    if uri_bytes > settings.max_uri_bytes {
        return Err(Problem::new(
            ErrorCode::UriTooLong,
            format!("the request URI has {uri_bytes} bytes; at most {} are accepted", settings.max_uri_bytes),
        ));
    }
    let header_count = request.headers().len();
    if header_count > settings.max_header_count {
        return Err(Problem::new(
            ErrorCode::HeadersTooLarge,
            format!("the request has {header_count} header fields; at most {} are accepted", settings.max_header_count),
        ));
    }
    let header_bytes: usize = request.headers().iter().map(|(name, value)| name.as_str().len() + value.len()).sum();
    if header_bytes > settings.max_header_bytes {
        return Err(Problem::new(
            ErrorCode::HeadersTooLarge,
            format!(
                "the request headers have {header_bytes} bytes; at most {} are accepted",
                settings.max_header_bytes
            ),
        ));
    }
    Ok(())
}

/// Counts and times each request, under a span that continues the caller's `traceparent` only
/// when the request authenticates as a principal (anyone else's starts a trace of its own: an
/// anonymous caller neither forces its spans to be sampled nor joins another's trace).
async fn record_request(State(state): State<SharedState>, request: Request, next: Next) -> Response {
    let method = request.method().to_string();
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map(|p| p.as_str().to_string())
        .unwrap_or_else(|| "unmatched".to_string());
    let started = Instant::now();
    let span = tracing::trace_span!(target: crate::traces::TARGET, "http.request",
        otel.name = %format_args!("{method} {route}"), http.request.method = %method, http.route = %route,
        http.response.status_code = tracing::field::Empty);
    if crate::traces::would_continue(&span, request.headers()) && authenticates(&state, request.headers()).await {
        crate::traces::continue_remote_trace(&span, request.headers());
    }
    let response = tracing::Instrument::instrument(next.run(request), span.clone()).await;
    span.record("http.response.status_code", response.status().as_u16());
    telemetry::http_request_answered(method, route, response.status().as_u16(), started.elapsed());
    response
}

/// Whether the request's one `Authorization` credential selects a principal (what
/// `auth::require_principal` decides again for `/v1` routes).
async fn authenticates(state: &ApiState, headers: &axum::http::HeaderMap) -> bool {
    headers.get_all(header::AUTHORIZATION).iter().count() == 1 && state.auth.authenticate(headers).await.is_ok()
}
