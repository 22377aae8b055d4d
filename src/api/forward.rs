//! Forwarding to the replica that serves an execution. An extracting execution's uploads live in
//! the memory of its owner (`replica`); a request for it that reaches another replica (a load
//! balancer without run affinity) is streamed, body and answer, to the owner's advertised URL
//! unchanged (still compressed, headers and token as sent). The owner answers it as if it had
//! received it; a forwarded request is never forwarded again (the owner that lost the execution
//! meanwhile answers 503 `execution_owned_elsewhere`, and the client retries).
//!
//! Which requests: everything under `/v1/runs/{run}/executions/{execution}`, and the POST that
//! redelivers an execution (its id is in the small JSON body, read here first). Anything else,
//! and any execution this replica serves or that is not extracting, goes on to the handlers.

use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderName, HeaderValue, Method, Uri, header};
use axum::middleware::Next;
use axum::response::{IntoResponse as _, Response};
use http_body_util::BodyExt as _;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

use super::SharedState;
use crate::error::{ErrorCode, Problem};
use crate::model::{ExecutionId, ExecutionKey, RunId};
use crate::principals::Action;

/// Marks a forwarded request (its value: the forwarding replica's id).
pub(crate) const FORWARDED_BY: HeaderName = HeaderName::from_static("x-filament-forwarded-by");

/// Opening a connection to the owner: replicas share a network, so this is short.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// The JSON body of `POST /v1/runs/{run}/executions` is read to find the execution id; larger
/// bodies are passed on to the handler unread (it refuses them).
const MAX_OPEN_BODY_BYTES: usize = 64 * 1024;

/// The HTTP/1 client replicas forward with (pooled connections): plain HTTP, or HTTPS to a
/// replica advertising an `https://` URL (verified against `tls`).
#[derive(Debug, Clone)]
pub(crate) struct Forwarder {
    client: Client<HttpsConnector<HttpConnector>, Body>,
}

impl Forwarder {
    pub(crate) fn new(tls: rustls::ClientConfig) -> Self {
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(CONNECT_TIMEOUT));
        connector.set_nodelay(true);
        connector.enforce_http(false);
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http()
            .enable_http1()
            .wrap_connector(connector);
        Self { client: Client::builder(TokioExecutor::new()).build(connector) }
    }
}

/// Which execution a request is about, read from its path.
enum Addressed {
    /// `/v1/runs/{run}/executions/{execution}[/...]`.
    Execution(ExecutionKey),
    /// `POST /v1/runs/{run}/executions`: the execution id is in the body.
    Open(RunId),
    Other,
}

fn addressed(method: &Method, uri: &Uri) -> Addressed {
    let segments: Vec<&str> = uri.path().trim_matches('/').split('/').collect();
    let (Some(run), Some(&"executions")) = (segments.get(2), segments.get(3)) else { return Addressed::Other };
    if segments.first() != Some(&"v1") || segments.get(1) != Some(&"runs") {
        return Addressed::Other;
    }
    let Ok(run_id) = RunId::parse(*run) else { return Addressed::Other };
    match segments.get(4) {
        Some(execution) => match ExecutionId::parse(*execution) {
            Ok(execution_id) => Addressed::Execution(ExecutionKey { run_id, execution_id }),
            Err(_) => Addressed::Other,
        },
        None if method == Method::POST => Addressed::Open(run_id),
        None => Addressed::Other,
    }
}

/// Middleware: forwards the request to the owner of its execution when another live replica
/// serves it; otherwise hands it to the handlers.
pub(crate) async fn forward_to_owner(State(state): State<SharedState>, request: Request, next: Next) -> Response {
    // Unauthenticated requests are refused by the handlers' guard, without a lookup here. The
    // owner authenticates a forwarded request again from its own credential (sent unchanged):
    // it is never trusted more than a direct one.
    if request.headers().contains_key(&FORWARDED_BY) {
        return next.run(request).await;
    }
    let Ok(principal) = state.auth.authenticate(request.headers()).await else { return next.run(request).await };
    let (key, request) = match addressed(request.method(), request.uri()) {
        Addressed::Other => return next.run(request).await,
        Addressed::Execution(key) => (key, request),
        Addressed::Open(run_id) => match read_open_request(run_id, request).await {
            (Some(key), request) => (key, request),
            (None, request) => return next.run(request).await,
        },
    };
    // Uploads held here: this replica serves it (no lookup on the affinity path).
    if state.pipeline.holds(&key) {
        return next.run(request).await;
    }
    // Only a run the caller sees is forwarded: another principal's is answered here, as a
    // missing one, by the handlers (no timing or answer of another replica tells it apart).
    let sees_run = match state.store.get_run(&key.run_id).await {
        Ok(Some(run)) => run.principal == principal.name.as_str() || principal.may(Action::ReadAll),
        _ => false,
    };
    if !sees_run {
        return next.run(request).await;
    }
    let owner_url = match state.store.get_execution(&key).await {
        Ok(Some(execution)) => state.replica.forward_target(&execution),
        // The handler reports a missing execution or an unreachable store.
        _ => None,
    };
    match owner_url {
        Some(url) => forward(&state, &url, request).await,
        None => next.run(request).await,
    }
}

/// Reads the small JSON body of an open/redeliver request for its `execution_id`, and puts it
/// back.
async fn read_open_request(run_id: RunId, request: Request) -> (Option<ExecutionKey>, Request) {
    let (parts, body) = request.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, MAX_OPEN_BODY_BYTES).await else {
        // Too large or cut: the handler answers with what it finds (an empty body).
        return (None, Request::from_parts(parts, Body::empty()));
    };
    let execution_id = serde_json::from_slice::<serde_json::Value>(&bytes)
        .ok()
        .and_then(|body| body.get("execution_id").and_then(|id| id.as_str()).map(ExecutionId::parse))
        .and_then(Result::ok);
    let key = execution_id.map(|execution_id| ExecutionKey { run_id, execution_id });
    (key, Request::from_parts(parts, Body::from(bytes)))
}

/// Streams the request to `owner_url` and its answer back. An owner that cannot be reached
/// gets the client a retryable 503 (a crashed owner's executions fail when its lease expires).
async fn forward(state: &SharedState, owner_url: &str, request: Request) -> Response {
    let (mut parts, body) = request.into_parts();
    let path_and_query = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    let target = match format!("{}{path_and_query}", owner_url.trim_end_matches('/')).parse::<Uri>() {
        Ok(uri) => uri,
        Err(e) => return unreachable_owner(owner_url, &format!("invalid advertised URL: {e}")),
    };
    parts.uri = target;
    parts.headers.remove(header::HOST);
    parts.headers.remove(header::CONNECTION);
    if let Ok(by) = HeaderValue::from_str(&state.replica.lease.owner) {
        parts.headers.insert(FORWARDED_BY, by);
    }
    crate::telemetry::request_forwarded();
    match state.forwarder.client.request(Request::from_parts(parts, body)).await {
        Ok(answer) => answer.map(|body| Body::new(body.map_err(axum::Error::new))),
        Err(e) => unreachable_owner(owner_url, &e.to_string()),
    }
}

/// The client's answer names neither the replica's internal URL nor the transport's error
/// (both are logged).
fn unreachable_owner(owner_url: &str, error: &str) -> Response {
    tracing::warn!(owner_url, error, "could not forward to the replica serving the execution");
    Problem::new(ErrorCode::ExecutionOwnedElsewhere, "the gateway replica serving this execution could not be reached")
        .with_hint("retry after Retry-After; if that replica is gone, the execution fails once its lease expires")
        .with_retry_after(1)
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key_of(method: Method, path: &str) -> Option<(String, Option<String>)> {
        match addressed(&method, &path.parse().unwrap()) {
            Addressed::Execution(key) => Some((key.run_id.to_string(), Some(key.execution_id.to_string()))),
            Addressed::Open(run_id) => Some((run_id.to_string(), None)),
            Addressed::Other => None,
        }
    }

    #[test]
    fn requests_are_addressed_by_their_path() {
        let execution = Some(("r1".to_string(), Some("e1".to_string())));
        assert_eq!(key_of(Method::POST, "/v1/runs/r1/executions/e1/resources/t/batches?seq=3"), execution);
        assert_eq!(key_of(Method::POST, "/v1/runs/r1/executions/e1/commit"), execution);
        assert_eq!(key_of(Method::GET, "/v1/runs/r1/executions/e1"), execution);
        assert_eq!(key_of(Method::POST, "/v1/runs/r1/executions"), Some(("r1".to_string(), None)));
        assert_eq!(key_of(Method::GET, "/v1/runs/r1/executions"), None);
        assert_eq!(key_of(Method::PUT, "/v1/runs/r1/resources/t"), None);
        assert_eq!(key_of(Method::GET, "/v1/runs/r1"), None);
        assert_eq!(key_of(Method::GET, "/metrics"), None);
        assert_eq!(key_of(Method::GET, "/v2/runs/r1/executions/e1"), None);
        assert_eq!(key_of(Method::GET, "/v1/runs/bad%20id/executions/e1"), None);
    }
}
