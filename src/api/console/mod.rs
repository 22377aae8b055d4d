//! The web console at `/ui/`: read-only, server-rendered pages over the API's own views (the
//! runs list, a run, an execution with its progress, publications and timeline), read from
//! Postgres so any replica answers. A person signs in by pasting a token (or a Google ID
//! token) once; the gateway answers with a signed session cookie ([`session`]) and every page
//! then acts as that principal, with its scopes (`api::auth::Caller`). Pages are rendered by
//! [`pages`]; every answer carries a strict `Content-Security-Policy` (no script runs, styles
//! only from `/ui/console.css`). Nothing here writes to a run: the only POSTs open and close
//! a session.

pub(crate) mod pages;
mod phases;
pub(crate) mod session;

use std::net::SocketAddr;

use axum::Form;
use axum::extract::rejection::{FormRejection, PathRejection, QueryRejection};
use axum::extract::{ConnectInfo, FromRequestParts, MatchedPath, Path, Query, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use chrono::Utc;
use serde::Deserialize;
use tokio::sync::OwnedSemaphorePermit;

use super::SharedState;
use super::auth::{Caller, RunAccess, principal_limit};
use super::executions::load_execution;
use super::run_list::{ListRunsParams, runs_page};
use super::runs::load_run;
use super::views::{execution_view, run_view};
use crate::audit;
use crate::error::{ErrorCode, Problem};
use crate::model::ExecutionState;

/// What a console page may load and do: its own stylesheet, forms posting to itself; no
/// script, frame, plugin or foreign resource.
const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; style-src 'self'; img-src 'self'; \
     form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

/// The largest sign-in form accepted (an ID token is a few KiB).
const MAX_FORM_BYTES: usize = 16 * 1024;

/// Events an execution page shows at most (the newest): one delivery's bound.
const MAX_TIMELINE_EVENTS: i64 = 1000;

const STYLESHEET: &str = include_str!("console.css");

/// The console's routes, each answer with the console's security headers.
pub(crate) fn routes() -> axum::Router<SharedState> {
    axum::Router::new()
        .route("/ui", get(|| async { Redirect::permanent("/ui/") }))
        .route("/ui/", get(runs_list))
        .route("/ui/console.css", get(stylesheet))
        .route("/ui/sign-in", get(sign_in_form).post(sign_in))
        .route("/ui/sign-out", post(sign_out))
        .route("/ui/runs/{run_id}", get(run_page))
        .route("/ui/runs/{run_id}/executions/{execution_id}", get(execution_page))
        .layer(axum::extract::DefaultBodyLimit::max(MAX_FORM_BYTES))
        .layer(axum::middleware::map_response(security_headers))
}

/// `Strict-Transport-Security` of a gateway reached over TLS: browsers use HTTPS only, for a
/// year.
pub(crate) const HSTS: &str = "max-age=31536000";

async fn security_headers(mut response: Response) -> Response {
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(CONTENT_SECURITY_POLICY));
    headers.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    if !headers.contains_key(header::CACHE_CONTROL) {
        headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    }
    response
}

/// The stylesheet, cached for a few minutes (pages are not cached at all).
async fn stylesheet() -> Response {
    ([(header::CONTENT_TYPE, "text/css; charset=utf-8"), (header::CACHE_CONTROL, "max-age=300")], STYLESHEET)
        .into_response()
}

/// Whether a browser says the request came from another site: such a form may not open or
/// close a session here (login CSRF). `Sec-Fetch-Site` says it; a browser that sends none
/// (older ones) is judged by `Origin`, which must name this host. Clients that send neither
/// (curl, scripts) are not browsers tricked by a page.
fn sent_from_another_site(headers: &HeaderMap) -> bool {
    let text = |name: &str| headers.get(name).and_then(|value| value.to_str().ok());
    if let Some(site) = text("sec-fetch-site") {
        return !matches!(site, "same-origin" | "none");
    }
    let Some(origin) = text(header::ORIGIN.as_str()) else { return false };
    // `Origin: null` (a sandboxed or privacy-sensitive context) names no site: refused too.
    let origin_host = origin.split_once("://").map(|(_, host)| host.trim_end_matches('/'));
    origin_host.is_none_or(|host| Some(host) != text(header::HOST.as_str()))
}

fn cross_site_refusal() -> Response {
    let problem = Problem::new(ErrorCode::ActionNotPermitted, "a page of another site may not sign in or out here")
        .with_hint("open the console's own sign-in page");
    problem_page(None, &problem)
}

/// A page answering a problem, with its status.
fn problem_page(principal: Option<&str>, problem: &Problem) -> Response {
    let mut response = (problem.code.status(), pages::problem(principal, problem)).into_response();
    if let Some(secs) = problem.retry_after_secs {
        response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(secs));
    }
    response
}

/// Where a request was made from, for `audit.denied`.
struct RequestOrigin {
    method: String,
    route: String,
    client: Option<SocketAddr>,
}

impl RequestOrigin {
    fn of(parts: &Parts) -> Self {
        Self {
            method: parts.method.to_string(),
            route: parts.extensions.get::<MatchedPath>().map_or("unmatched", |p| p.as_str()).to_string(),
            client: parts.extensions.get::<ConnectInfo<SocketAddr>>().map(|info| info.0),
        }
    }

    fn denied(&self, principal: &str, reason: &str) {
        let RequestOrigin { method, route, client } = self;
        audit::Denied { principal, method, route, reason, client: *client }.emit();
    }
}

/// The principal signed in to the console, as the request's [`Caller`], holding one of its
/// concurrent requests. Without a valid session the page is the sign-in form, with 401.
pub(crate) struct SignedIn {
    caller: Caller,
    _slot: Option<OwnedSemaphorePermit>,
}

impl SignedIn {
    fn name(&self) -> &str {
        self.caller.name()
    }
}

impl FromRequestParts<SharedState> for SignedIn {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, state: &SharedState) -> Result<Self, Response> {
        let origin = RequestOrigin::of(parts);
        let next = parts.uri.path_and_query().map_or("/ui/", |p| p.as_str()).to_string();
        let refuse = |reason: &str, message: &str| {
            origin.denied(audit::ANONYMOUS, reason);
            (StatusCode::UNAUTHORIZED, pages::sign_in(&next, Some(message))).into_response()
        };
        let claims = state.console.claims_of(&parts.headers, Utc::now()).map_err(|refused| {
            let message = match refused {
                session::NoSession::Absent => "Sign in to see the console.",
                session::NoSession::Expired => "Your session ended: sign in again.",
                session::NoSession::Forged => "This session is not valid here: sign in again.",
            };
            refuse(refused.reason(), message)
        })?;
        let Some(principal) = state.auth.principals.current().by_name(&claims.principal) else {
            return Err(refuse("unknown_principal", "Your principal is no longer configured: sign in again."));
        };
        if let Err(revoked) = claims.check(&principal) {
            return Err(refuse(
                revoked.reason(),
                "Your session ended with the credential it was opened with: sign in again.",
            ));
        }
        let caller = Caller::new(principal, origin.method.clone(), origin.route.clone(), origin.client);
        caller.require_read().map_err(|problem| problem_page(Some(caller.name()), &problem))?;
        let Ok(slot) = state.auth.request_slot(&caller.principal) else {
            return Err(problem_page(Some(caller.name()), &principal_limit(&caller.principal)));
        };
        Ok(SignedIn { caller, _slot: slot })
    }
}

/// The runs list's filters as the console's form sends them (an empty field is no filter).
#[derive(Debug, Default, Deserialize)]
pub(crate) struct RunsFilter {
    pub(crate) state: Option<String>,
    pub(crate) dataset: Option<String>,
    pub(crate) principal: Option<String>,
    pub(crate) created_after: Option<String>,
    pub(crate) created_before: Option<String>,
    pub(crate) page_token: Option<String>,
}

impl RunsFilter {
    /// The filter without its empty fields.
    fn without_empty_fields(self) -> Self {
        let set = |value: Option<String>| value.map(|v| v.trim().to_string()).filter(|v| !v.is_empty());
        Self {
            state: set(self.state),
            dataset: set(self.dataset),
            principal: set(self.principal),
            created_after: set(self.created_after),
            created_before: set(self.created_before),
            page_token: set(self.page_token),
        }
    }

    /// The API's parameters for this filter: the same checks, the same codes.
    fn to_params(&self) -> Result<ListRunsParams, Problem> {
        let state = match self.state.as_deref() {
            None => None,
            Some(name) => Some(parse_state(name)?),
        };
        let instant = |field: &str, value: &Option<String>| {
            value
                .as_deref()
                .map(|text| {
                    chrono::DateTime::parse_from_rfc3339(text).map(|at| at.with_timezone(&Utc)).map_err(|_| {
                        Problem::invalid_request(format!("{field} {text:?} is not an RFC 3339 instant"))
                            .with_hint("write it as 2026-12-01T08:00:00Z")
                    })
                })
                .transpose()
        };
        Ok(ListRunsParams {
            state,
            dataset: self.dataset.clone(),
            principal: self.principal.clone(),
            created_after: instant("created_after", &self.created_after)?,
            created_before: instant("created_before", &self.created_before)?,
            limit: None,
            page_token: self.page_token.clone(),
        })
    }

    /// The query string of this filter's page after `page_token`.
    pub(crate) fn query_with_page_token(&self, page_token: &str) -> String {
        let fields = [
            ("state", self.state.as_deref()),
            ("dataset", self.dataset.as_deref()),
            ("principal", self.principal.as_deref()),
            ("created_after", self.created_after.as_deref()),
            ("created_before", self.created_before.as_deref()),
            ("page_token", Some(page_token)),
        ];
        let present: Vec<(&str, &str)> = fields.into_iter().filter_map(|(k, v)| v.map(|v| (k, v))).collect();
        serde_urlencoded::to_string(present).unwrap_or_default()
    }
}

fn parse_state(name: &str) -> Result<ExecutionState, Problem> {
    serde_json::from_value(serde_json::Value::String(name.to_string())).map_err(|_| {
        Problem::invalid_request(format!("state {name:?} is not an execution state"))
            .with_hint("extracting, paused, committing, committed, failed or aborted")
    })
}

async fn runs_list(
    State(state): State<SharedState>,
    signed: SignedIn,
    filter: Result<Query<RunsFilter>, QueryRejection>,
) -> Response {
    let filter = match filter {
        Ok(Query(filter)) => filter.without_empty_fields(),
        Err(rejection) => return problem_page(Some(signed.name()), &Problem::invalid_request(rejection.body_text())),
    };
    let page = async { runs_page(&state.store, &signed.caller, filter.to_params()?).await }.await;
    match page {
        Ok(list) => pages::runs(signed.name(), &filter, &list).into_response(),
        Err(problem) => problem_page(Some(signed.name()), &problem),
    }
}

async fn run_page(
    State(state): State<SharedState>,
    signed: SignedIn,
    run_id: Result<Path<String>, PathRejection>,
) -> Response {
    let view = async {
        let Path(run_id) = run_id.map_err(|rejection| Problem::invalid_request(rejection.body_text()))?;
        let run = load_run(&state, &signed.caller, &run_id, RunAccess::Read).await?;
        run_view(&state.store, run).await
    }
    .await;
    match view {
        Ok(view) => pages::run(signed.name(), &view).into_response(),
        Err(problem) => problem_page(Some(signed.name()), &problem),
    }
}

async fn execution_page(
    State(state): State<SharedState>,
    signed: SignedIn,
    ids: Result<Path<(String, String)>, PathRejection>,
) -> Response {
    let page = async {
        let Path((run_id, execution_id)) = ids.map_err(|rejection| Problem::invalid_request(rejection.body_text()))?;
        let (run, execution) = load_execution(&state, &signed.caller, &run_id, &execution_id, RunAccess::Read).await?;
        let events = state.store.latest_events(&execution.key(), MAX_TIMELINE_EVENTS).await?;
        let view = execution_view(&state.store, execution).await?;
        let project = run.job_project.unwrap_or(run.destination.project);
        let location = run.destination.location.filter(|l| !l.is_empty()).unwrap_or_else(|| "US".to_string());
        let jobs = pages::JobConsole { project: &project, location: &location };
        Ok::<_, Problem>(pages::execution(signed.name(), &view, &events, &jobs))
    }
    .await;
    match page {
        Ok(markup) => markup.into_response(),
        Err(problem) => problem_page(Some(signed.name()), &problem),
    }
}

/// The client's address, when the server recorded it.
struct ClientAddress(Option<SocketAddr>);

impl<S: Send + Sync> FromRequestParts<S> for ClientAddress {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        Ok(ClientAddress(parts.extensions.get::<ConnectInfo<SocketAddr>>().map(|info| info.0)))
    }
}

#[derive(Debug, Default, Deserialize)]
struct SignInQuery {
    next: Option<String>,
}

/// Where to go after signing in: a console page, else the runs list.
fn console_path(next: Option<&str>) -> &str {
    next.filter(|path| path.starts_with("/ui/") && path.chars().all(|c| c.is_ascii_graphic() && c != '\\'))
        .unwrap_or("/ui/")
}

async fn sign_in_form(query: Result<Query<SignInQuery>, QueryRejection>) -> Response {
    let query = query.map(|Query(q)| q).unwrap_or_default();
    pages::sign_in(console_path(query.next.as_deref()), None).into_response()
}

#[derive(Debug, Deserialize)]
struct SignInForm {
    token: String,
    next: Option<String>,
}

async fn sign_in(
    State(state): State<SharedState>,
    ClientAddress(client): ClientAddress,
    request_headers: HeaderMap,
    form: Result<Form<SignInForm>, FormRejection>,
) -> Response {
    if sent_from_another_site(&request_headers) {
        return cross_site_refusal();
    }
    let Ok(Form(form)) = form else {
        return (StatusCode::BAD_REQUEST, pages::sign_in("/ui/", Some("Paste a token to sign in."))).into_response();
    };
    let next = console_path(form.next.as_deref()).to_string();
    let (principal, credential) = match state.auth.authenticate_credential(&form.token).await {
        Ok(authenticated) => authenticated,
        Err(refusal) => {
            let reason = refusal.reason();
            audit::Denied { principal: audit::ANONYMOUS, method: "POST", route: "/ui/sign-in", reason, client }.emit();
            let message = format!("The gateway does not accept this token ({}).", refusal.reason());
            return (StatusCode::UNAUTHORIZED, pages::sign_in(&next, Some(&message))).into_response();
        }
    };
    let caller = Caller::new(principal, "POST".into(), "/ui/sign-in".into(), client);
    if let Err(problem) = caller.require_read() {
        // require_read recorded the refusal.
        return (StatusCode::FORBIDDEN, pages::sign_in(&next, Some(&problem.detail))).into_response();
    }
    let name = caller.name();
    audit::console_signed_in(name, client);
    let mut headers = HeaderMap::new();
    headers.insert(header::SET_COOKIE, state.console.open(name, &credential, Utc::now()));
    (headers, Redirect::to(&next)).into_response()
}

async fn sign_out(State(state): State<SharedState>, request_headers: HeaderMap) -> Response {
    if sent_from_another_site(&request_headers) {
        return cross_site_refusal();
    }
    if let Ok(claims) = state.console.claims_of(&request_headers, Utc::now()) {
        audit::console_signed_out(&claims.principal);
    }
    let mut headers = HeaderMap::new();
    headers.insert(header::SET_COOKIE, state.console.close());
    (headers, Redirect::to("/ui/sign-in")).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_console_paths_are_followed_after_sign_in() {
        assert_eq!(console_path(Some("/ui/runs/r?x=1")), "/ui/runs/r?x=1");
        for elsewhere in [
            "https://evil.example/",
            "//evil.example/ui/",
            "/v1/runs",
            "/ui/\\evil",
            "/ui/\r\nSet-Cookie: x",
            "/ui/é",
            "/ui/ x",
        ] {
            assert_eq!(console_path(Some(elsewhere)), "/ui/", "{elsewhere:?}");
        }
        assert_eq!(console_path(None), "/ui/");
    }

    #[test]
    fn a_filter_keeps_its_fields_on_the_next_page_and_refuses_what_the_api_refuses() {
        let filter =
            RunsFilter { state: Some("failed".into()), dataset: Some("raw & co".into()), ..Default::default() };
        assert_eq!(filter.query_with_page_token("abc"), "state=failed&dataset=raw+%26+co&page_token=abc");
        assert_eq!(filter.to_params().unwrap().state, Some(ExecutionState::Failed));
        let bad = RunsFilter { state: Some("done".into()), ..Default::default() };
        assert_eq!(bad.to_params().unwrap_err().code, ErrorCode::InvalidRequest);
        let bad = RunsFilter { created_after: Some("yesterday".into()), ..Default::default() };
        assert_eq!(bad.to_params().unwrap_err().code, ErrorCode::InvalidRequest);
        let empty = RunsFilter { dataset: Some("  ".into()), ..Default::default() }.without_empty_fields();
        assert!(empty.dataset.is_none());
    }
}
