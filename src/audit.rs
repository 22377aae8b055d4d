//! The audit trail: one structured event per security decision and per state change, at
//! INFO under the `audit` target (`audit.denied`, `audit.run_created`,
//! `audit.execution_committed`, `audit.execution_aborted`, `audit.principals_reloaded`,
//! `audit.console_signed_in`, `audit.console_signed_out`). An
//! event names principals, routes, runs and reason codes; never a token, a digest, a claim
//! beyond the principal's name, or a payload.

use std::net::SocketAddr;

/// The name used for a request no principal was found for.
pub(crate) const ANONYMOUS: &str = "anonymous";

/// `audit.denied`: a request refused for who made it (401, 403, or 404 for a run it may not see).
#[derive(Debug)]
pub(crate) struct Denied<'a> {
    pub(crate) principal: &'a str,
    pub(crate) method: &'a str,
    pub(crate) route: &'a str,
    /// The problem code or the credential's refusal reason (`id_token_expired`, ...).
    pub(crate) reason: &'a str,
    pub(crate) client: Option<SocketAddr>,
}

impl Denied<'_> {
    pub(crate) fn emit(&self) {
        let Denied { principal, method, route, reason, client } = *self;
        // By reason only: a principal's name belongs in the audit log, not in an unauthenticated
        // scrape.
        crate::telemetry::access_denied(reason);
        let client = client.map(|address| address.to_string());
        tracing::info!(target: "audit", principal, method, route, reason, client = client.as_deref(), "audit.denied");
    }
}

/// `audit.run_created`.
pub(crate) fn run_created(principal: &str, run_id: &str, project: &str, dataset: &str) {
    tracing::info!(target: "audit", principal, run_id, project, dataset, "audit.run_created");
}

/// `audit.execution_committed`: the commit began (the execution is committing).
pub(crate) fn execution_committed(principal: &str, run_id: &str, execution_id: &str) {
    tracing::info!(target: "audit", principal, run_id, execution_id, "audit.execution_committed");
}

/// `audit.execution_aborted`.
pub(crate) fn execution_aborted(principal: &str, run_id: &str, execution_id: &str) {
    tracing::info!(target: "audit", principal, run_id, execution_id, "audit.execution_aborted");
}

/// `audit.principals_reloaded`: counts only.
pub(crate) fn principals_reloaded(principals: usize, tokens: usize, service_accounts: usize) {
    tracing::info!(target: "audit", principals, tokens, service_accounts, "audit.principals_reloaded");
}

/// `audit.console_signed_in`: a console session was opened for the principal.
pub(crate) fn console_signed_in(principal: &str, client: Option<SocketAddr>) {
    let client = client.map(|address| address.to_string());
    tracing::info!(target: "audit", principal, client = client.as_deref(), "audit.console_signed_in");
}

/// `audit.console_signed_out`.
pub(crate) fn console_signed_out(principal: &str) {
    tracing::info!(target: "audit", principal, "audit.console_signed_out");
}
