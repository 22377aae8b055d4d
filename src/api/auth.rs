//! Who is calling: the credential of every `/v1` request selects a principal (an opaque bearer
//! token by its SHA-256 digest, or a Google ID token verified against Google's keys), which the
//! request then carries as its [`Caller`]. The handlers check the caller's scopes through it
//! (actions, the runs it may see, the destinations and run ids it may use); refusals are
//! problems with specific codes, logged as `audit.denied`. A principal's concurrent requests
//! are bounded here (429 `principal_limit`).

use parking_lot::Mutex;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{ConnectInfo, FromRequestParts, MatchedPath, Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, header};
use axum::middleware::Next;
use axum::response::{IntoResponse as _, Response};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::SharedState;
use crate::audit;
use crate::error::{ErrorCode, Problem};
use crate::principals::id_token::{IdTokenVerifier, looks_like_jwt};
use crate::principals::{Action, Credential, Principal, Principals, token_digest};
use crate::store::RunRecord;

/// Turns credentials into principals.
#[derive(Debug, Clone)]
pub(crate) struct Authenticator {
    pub(crate) principals: Principals,
    /// Set with `FILAMENT_GOOGLE_ID_TOKEN_AUDIENCE`.
    pub(crate) id_tokens: Option<IdTokenVerifier>,
    requests: RequestShares,
}

/// Why a request has no principal: the reason `audit.denied` records (never the credential).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NoPrincipal {
    NoCredentials,
    UnknownToken,
    IdToken(crate::principals::id_token::IdTokenRejected),
    UnknownServiceAccount,
}

impl NoPrincipal {
    pub(crate) fn reason(self) -> &'static str {
        match self {
            NoPrincipal::NoCredentials => "no_credentials",
            NoPrincipal::UnknownToken => "unknown_token",
            NoPrincipal::IdToken(rejected) => rejected.reason(),
            NoPrincipal::UnknownServiceAccount => "unknown_service_account",
        }
    }
}

impl Authenticator {
    pub(crate) fn new(principals: Principals, id_tokens: Option<IdTokenVerifier>) -> Self {
        Self { principals, id_tokens, requests: RequestShares::default() }
    }

    /// The principal the request's `Authorization: Bearer` credential selects.
    pub(crate) async fn authenticate(&self, headers: &HeaderMap) -> Result<Arc<Principal>, NoPrincipal> {
        let bearer = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer ").or_else(|| v.strip_prefix("bearer ")))
            .map(str::trim)
            .filter(|token| !token.is_empty())
            .ok_or(NoPrincipal::NoCredentials)?;
        self.authenticate_bearer(bearer).await
    }

    /// The principal a bearer credential (an opaque token or a Google ID token) selects: the
    /// `Authorization` header's, or the token pasted into the console's sign-in form.
    pub(crate) async fn authenticate_bearer(&self, bearer: &str) -> Result<Arc<Principal>, NoPrincipal> {
        self.authenticate_credential(bearer).await.map(|(principal, _)| principal)
    }

    /// The principal a bearer credential selects, and which of its credentials it is (what a
    /// console session is bound to).
    pub(crate) async fn authenticate_credential(
        &self,
        bearer: &str,
    ) -> Result<(Arc<Principal>, Credential), NoPrincipal> {
        let bearer = bearer.trim();
        if bearer.is_empty() {
            return Err(NoPrincipal::NoCredentials);
        }
        let set = self.principals.current();
        match &self.id_tokens {
            Some(verifier) if looks_like_jwt(bearer) => {
                let identity = verifier.verify(bearer).await.map_err(NoPrincipal::IdToken)?;
                let principal = set.by_email(&identity.email).ok_or(NoPrincipal::UnknownServiceAccount)?;
                let credential = Credential::ServiceAccount {
                    email: identity.email,
                    expires_at_unix_secs: identity.expires_at_unix_secs,
                };
                Ok((principal, credential))
            }
            _ => {
                let principal = set.by_token(bearer).ok_or(NoPrincipal::UnknownToken)?;
                Ok((principal, Credential::Token { digest: token_digest(bearer) }))
            }
        }
    }
}

/// Each principal's concurrent requests (`max_concurrent_requests`): a semaphore per principal
/// name and limit, replaced when a reload changes the limit.
#[derive(Debug, Clone, Default)]
struct RequestShares(Arc<Mutex<HashMap<String, RequestShare>>>);

/// A principal's limit and the semaphore enforcing it.
type RequestShare = (usize, Arc<Semaphore>);

impl Authenticator {
    /// A slot for one more request of `principal` (`max_concurrent_requests`); `Err` when it
    /// has its share in flight.
    pub(crate) fn request_slot(&self, principal: &Principal) -> Result<Option<OwnedSemaphorePermit>, ()> {
        self.requests.try_acquire(principal)
    }
}

impl RequestShares {
    /// A slot for one more request of `principal`, or `None` when it has its share in flight.
    fn try_acquire(&self, principal: &Principal) -> Result<Option<OwnedSemaphorePermit>, ()> {
        let Some(limit) = principal.max_concurrent_requests else { return Ok(None) };
        let semaphore = {
            let mut shares = self.0.lock();
            let entry = shares
                .entry(principal.name.as_str().to_string())
                .or_insert_with(|| (limit, Arc::new(Semaphore::new(limit))));
            if entry.0 != limit {
                *entry = (limit, Arc::new(Semaphore::new(limit)));
            }
            Arc::clone(&entry.1)
        };
        semaphore.try_acquire_owned().map(Some).map_err(|_| ())
    }
}

/// The principal a request is made by; every `/v1` handler takes it.
#[derive(Debug, Clone)]
pub(crate) struct Caller {
    pub(crate) principal: Arc<Principal>,
    /// For `audit.denied`: how the request was addressed.
    method: String,
    route: String,
    client: Option<SocketAddr>,
}

impl<S: Send + Sync> FromRequestParts<S> for Caller {
    type Rejection = Problem;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Problem> {
        // Every `/v1` route is behind `require_principal`, which inserts it.
        parts.extensions.get::<Caller>().cloned().ok_or_else(|| unauthorized("no credentials"))
    }
}

/// What a request does to a run: reads it, or changes it (only its own principal may).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RunAccess {
    Read,
    Change,
}

impl Caller {
    /// The caller of a request authenticated elsewhere than `require_principal` (the console's
    /// session cookie).
    pub(crate) fn new(principal: Arc<Principal>, method: String, route: String, client: Option<SocketAddr>) -> Self {
        Self { principal, method, route, client }
    }

    pub(crate) fn name(&self) -> &str {
        self.principal.name.as_str()
    }

    fn denied(&self, reason: &str) {
        audit::Denied { principal: self.name(), method: &self.method, route: &self.route, reason, client: self.client }
            .emit();
    }

    /// 403 `action_not_permitted` unless the principal may `action`.
    pub(crate) fn require(&self, action: Action) -> Result<(), Problem> {
        if self.principal.may(action) {
            return Ok(());
        }
        self.denied(ErrorCode::ActionNotPermitted.as_str());
        Err(Problem::new(
            ErrorCode::ActionNotPermitted,
            format!("principal {} may not {}", self.name(), action.as_str()),
        )
        .with_hint("ask the gateway's operator to add the action to the principal's `actions`"))
    }

    /// Reading needs `read` (its own runs) or `read_all`.
    pub(crate) fn require_read(&self) -> Result<(), Problem> {
        if self.principal.may(Action::ReadAll) { Ok(()) } else { self.require(Action::Read) }
    }

    /// Whether the caller sees every principal's runs (`read_all`), not only its own.
    pub(crate) fn reads_all(&self) -> bool {
        self.principal.may(Action::ReadAll)
    }

    /// Whether the caller may see `run`: its own, or every run with `read_all`. A run it may
    /// not see is answered as one that does not exist.
    pub(crate) fn sees(&self, run: &RunRecord) -> bool {
        let sees = run.principal == self.name() || self.principal.may(Action::ReadAll);
        if !sees {
            self.denied("run_of_another_principal");
        }
        sees
    }

    /// `run` as `access` needs it: any run the caller sees for reading; only its own for a
    /// change (resources, executions, batches, checkpoints, pause, commit, abort), whatever
    /// `read_all` lets it read, and only while the run is within the principal's scopes as
    /// the principals file stands now (its run-id prefix, its destinations, its job project:
    /// an operator who narrows a principal narrows its old runs too). 404 `run_not_found` for a
    /// run it does not see, 403 `action_not_permitted` for another's run it only reads, and
    /// the scope's own 403 (`run_id_not_permitted`, `destination_not_permitted`) for one of its
    /// runs now outside its scopes.
    pub(crate) fn require_access(&self, run: RunRecord, access: RunAccess) -> Result<RunRecord, Problem> {
        if !self.sees(&run) {
            return Err(Problem::new(ErrorCode::RunNotFound, format!("no run {}", run.run_id)));
        }
        if access == RunAccess::Change && run.principal != self.name() {
            self.denied("change_of_another_principals_run");
            return Err(Problem::new(
                ErrorCode::ActionNotPermitted,
                format!(
                    "principal {} may read run {} of principal {} but not change it",
                    self.name(),
                    run.run_id,
                    run.principal
                ),
            )
            .with_hint("only the principal that created a run writes to, commits or aborts it"));
        }
        if access == RunAccess::Change {
            self.require_run_id(&run.run_id)?;
            self.require_destination(&run.destination.project, &run.destination.dataset)?;
            if let Some(project) = &run.job_project {
                self.require_project(project)?;
            }
        }
        Ok(run)
    }

    /// 403 `destination_not_permitted` unless a `destinations` pattern matches.
    pub(crate) fn require_destination(&self, project: &str, dataset: &str) -> Result<(), Problem> {
        if self.principal.may_write_to(project, dataset) {
            return Ok(());
        }
        self.denied(ErrorCode::DestinationNotPermitted.as_str());
        Err(Problem::new(
            ErrorCode::DestinationNotPermitted,
            format!("principal {} may not write to project {project}, dataset {dataset}", self.name()),
        )
        .with_hint("the principal's `destinations` patterns name the project.dataset pairs it may write to"))
    }

    /// 403 `destination_not_permitted` unless some `destinations` pattern names the project
    /// (connection tests, job projects).
    pub(crate) fn require_project(&self, project: &str) -> Result<(), Problem> {
        if self.principal.destinations.iter().any(|pattern| pattern.matches_project(project)) {
            return Ok(());
        }
        self.denied(ErrorCode::DestinationNotPermitted.as_str());
        Err(Problem::new(
            ErrorCode::DestinationNotPermitted,
            format!("principal {} may not use project {project}", self.name()),
        ))
    }

    /// A generated run id, starting with the principal's `run_id_prefix` when it has one.
    pub(crate) fn generated_run_id(&self) -> crate::model::RunId {
        let generated = crate::model::RunId::generate();
        match &self.principal.run_id_prefix {
            None => generated,
            Some(prefix) => {
                let id = format!("{prefix}{generated}");
                let id = &id[..id.len().min(crate::model::ids::MAX_ID_CHARS)];
                crate::model::RunId::parse(id).unwrap_or(generated)
            }
        }
    }

    /// 403 `run_id_not_permitted` unless the run id starts with the principal's `run_id_prefix`.
    pub(crate) fn require_run_id(&self, run_id: &str) -> Result<(), Problem> {
        if self.principal.may_name_run(run_id) {
            return Ok(());
        }
        self.denied(ErrorCode::RunIdNotPermitted.as_str());
        let prefix = self.principal.run_id_prefix.as_deref().unwrap_or_default();
        Err(Problem::new(
            ErrorCode::RunIdNotPermitted,
            format!("principal {} may name (and change) only runs whose id starts with {prefix:?}", self.name()),
        ))
    }
}

/// 429 `principal_limit`: the principal has its share of concurrent requests in flight.
pub(crate) fn principal_limit(principal: &Principal) -> Problem {
    Problem::new(
        ErrorCode::PrincipalLimit,
        format!("principal {} has as many requests in flight as its share allows", principal.name),
    )
    .with_hint("retry after Retry-After, or send fewer requests at once (max_concurrent_requests)")
    .with_retry_after(1)
}

fn unauthorized(detail: &str) -> Problem {
    Problem::new(
        ErrorCode::Unauthorized,
        format!("send Authorization: Bearer <token> with a configured credential ({detail})"),
    )
}

/// Middleware of every `/v1` route: authenticates the request (401 otherwise), bounds the
/// principal's concurrent requests (429 `principal_limit`), and hands the handlers its
/// [`Caller`].
pub(crate) async fn require_principal(State(state): State<SharedState>, mut request: Request, next: Next) -> Response {
    let method = request.method().to_string();
    let route = request.extensions().get::<MatchedPath>().map_or("unmatched", |p| p.as_str()).to_string();
    let client = request.extensions().get::<ConnectInfo<SocketAddr>>().map(|info| info.0);
    if request.headers().get_all(header::AUTHORIZATION).iter().count() > 1 {
        return Problem::invalid_request("send one Authorization header; this request has several").into_response();
    }
    let principal = match state.auth.authenticate(request.headers()).await {
        Ok(principal) => principal,
        Err(refusal) => {
            audit::Denied {
                principal: audit::ANONYMOUS,
                method: &method,
                route: &route,
                reason: refusal.reason(),
                client,
            }
            .emit();
            let mut response = unauthorized(refusal.reason()).into_response();
            response.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            return response;
        }
    };
    let Ok(_slot) = state.auth.request_slot(&principal) else {
        return principal_limit(&principal).into_response();
    };
    request.extensions_mut().insert(Caller { principal, method, route, client });
    next.run(request).await
}
