//! The problem+json answers of each operation, as the OpenAPI document states them. Every
//! operation names the error codes it can answer with; each code's HTTP status, title and
//! advice come from [`crate::error`], so a code is described in one place. The sets below are
//! what every route of a kind can answer; an operation's type (`CreateRunProblems`, ...) adds
//! its own codes, and the document groups them by status.

use std::collections::BTreeMap;

use utoipa::openapi::{ContentBuilder, Ref, RefOr, Response, ResponseBuilder};

use crate::error::ErrorCode::{self, *};

const PROBLEM_JSON: &str = "application/problem+json";

/// Every `/v1` route: authentication, request limits applied before the handler, and the
/// gateway's own failure.
const EVERY_ROUTE: &[ErrorCode] =
    &[Unauthorized, ActionNotPermitted, HeadersTooLarge, UriTooLong, PrincipalLimit, Overloaded, InternalError];
/// Routes with a JSON body (`api::error::ApiJson`).
const JSON_BODY: &[ErrorCode] = &[InvalidRequest, UnsupportedMediaType, PayloadTooLarge, BodyTimeout, InvalidText];
/// Routes naming a run (one of another principal's is answered as a missing one).
const RUN_ROUTE: &[ErrorCode] = &[RunNotFound, InvalidIdentifier];
/// Routes naming an execution, which one replica of the fleet serves.
const EXECUTION_ROUTE: &[ErrorCode] =
    &[RunNotFound, NotFound, InvalidIdentifier, ExecutionOwnedElsewhere, ReplicaDraining, GatewayRestarted];
/// What BigQuery's answers become (`bigquery::error`).
const BIGQUERY_ANSWERS: &[ErrorCode] = &[
    ServiceDisabled,
    MissingCredentials,
    PermissionDenied,
    DatasetLocationMismatch,
    BigqueryUnavailable,
    QuotaExceeded,
    BigqueryError,
];

/// The responses of `codes` (duplicates ignored), one per HTTP status, each listing its codes.
fn problem_responses(sets: &[&[ErrorCode]]) -> BTreeMap<String, RefOr<Response>> {
    let mut by_status: BTreeMap<u16, Vec<ErrorCode>> = BTreeMap::new();
    for &code in sets.iter().flat_map(|set| set.iter()) {
        let codes = by_status.entry(code.status().as_u16()).or_default();
        if !codes.contains(&code) {
            codes.push(code);
        }
    }
    by_status
        .into_iter()
        .map(|(status, codes)| {
            let description = codes.iter().map(|&code| describe(code)).collect::<Vec<_>>().join("; ");
            let content = ContentBuilder::new().schema(Some(Ref::from_schema_name("Problem"))).build();
            let response = ResponseBuilder::new().description(description).content(PROBLEM_JSON, content).build();
            (status.to_string(), RefOr::T(response))
        })
        .collect()
}

fn describe(code: ErrorCode) -> String {
    match code.advice() {
        Some(advice) => format!("`{code}`: {} ({advice})", code.title()),
        None => format!("`{code}`: {}", code.title()),
    }
}

/// Declares one `IntoResponses` type per operation from the sets and codes it answers with.
macro_rules! problems {
    ($($(#[$doc:meta])* $name:ident = [$($set:expr),+ $(,)?];)+) => {
        $(
            $(#[$doc])*
            pub(crate) struct $name;

            impl utoipa::IntoResponses for $name {
                fn responses() -> BTreeMap<String, RefOr<Response>> {
                    problem_responses(&[$($set),+])
                }
            }
        )+
    };
}

problems! {
    /// `POST /v1/runs`.
    CreateRunProblems = [
        EVERY_ROUTE,
        JSON_BODY,
        &[InvalidIdentifier, InvalidDatasetId, DestinationNotPermitted, RunIdNotPermitted, RunConflict],
    ];
    /// `GET /v1/runs`.
    ListRunsProblems = [EVERY_ROUTE, &[InvalidRequest, InvalidPageToken, InvalidDatasetId]];
    /// `GET /v1/runs/{run_id}`.
    GetRunProblems = [EVERY_ROUTE, RUN_ROUTE];
    /// `PUT /v1/runs/{run_id}/resources/{resource}`.
    PutResourceProblems = [
        EVERY_ROUTE,
        JSON_BODY,
        RUN_ROUTE,
        &[
            ResourceConflict,
            AtomicPublicationUnsupported,
            PrimaryKeyRequired,
            InvalidPrimaryKey,
            InvalidOrderBy,
            InvalidDeletes,
            InvalidDeleteMissing,
            InvalidDirectAppend,
            InvalidPartitioning,
            InvalidClustering,
            InvalidTableLabels,
            InvalidTableOptions,
        ],
    ];
    /// `POST /v1/runs/{run_id}/executions`.
    OpenExecutionProblems = [
        EVERY_ROUTE,
        JSON_BODY,
        RUN_ROUTE,
        &[ExecutionOwnedElsewhere, ReplicaDraining, ExecutionNotExtracting, AtomicPublicationUnsupported],
    ];
    /// `GET /v1/runs/{run_id}/executions/{execution_id}`.
    GetExecutionProblems = [EVERY_ROUTE, RUN_ROUTE];
    /// `GET .../events`.
    EventsProblems = [EVERY_ROUTE, RUN_ROUTE, &[InvalidRequest]];
    /// `POST .../checkpoints`.
    CheckpointProblems = [EVERY_ROUTE, JSON_BODY, EXECUTION_ROUTE, &[ExecutionNotExtracting]];
    /// `POST .../pause`.
    PauseProblems = [EVERY_ROUTE, EXECUTION_ROUTE, &[ExecutionNotExtracting]];
    /// `POST .../commit`.
    CommitProblems = [
        EVERY_ROUTE,
        JSON_BODY,
        EXECUTION_ROUTE,
        &[ExecutionNotExtracting, PendingStreamExpired],
    ];
    /// `POST .../abort`.
    AbortProblems = [EVERY_ROUTE, EXECUTION_ROUTE, &[ExecutionNotExtracting, PublicationInProgress]];
    /// `POST .../resources/{resource}/batches`.
    BatchProblems = [
        EVERY_ROUTE,
        EXECUTION_ROUTE,
        &[
            InvalidRequest,
            InvalidArrowIpc,
            UnsupportedMediaType,
            PayloadTooLarge,
            BodyTimeout,
            ExecutionNotExtracting,
            BatchConflict,
            ResourceConflict,
            SchemaMismatch,
            UnsupportedType,
            UnsupportedByteOrder,
            UnsupportedCompressionCodec,
            UnsupportedIpcVersion,
            UnsupportedIpcFeature,
            PrecisionLoss,
            InvalidValue,
            InvalidOperation,
            InvalidPrimaryKey,
            NullPrimaryKey,
            NullInRequiredColumn,
            InvalidOrderBy,
            RowTooLarge,
            InvalidPartitioning,
            InvalidClustering,
            InvalidTableOptions,
            Backpressure,
            LaneLimit,
        ],
    ];
    /// `POST /v1/connections/test`.
    ConnectionTestProblems = [EVERY_ROUTE, JSON_BODY, &[InvalidIdentifier, DestinationNotPermitted], BIGQUERY_ANSWERS];
    /// `GET /openapi.json`.
    OpenApiDocumentProblems = [&[InternalError]];
    /// `GET /metrics` (401 when `FILAMENT_METRICS_TOKEN` is set and not presented).
    MetricsProblems = [&[Unauthorized]];
}

#[cfg(test)]
mod tests {
    use utoipa::IntoResponses as _;

    use super::*;

    #[test]
    fn codes_are_grouped_under_their_status_once() {
        let responses = BatchProblems::responses();
        let RefOr::T(conflict) = &responses["409"] else { panic!("409 inline") };
        for code in ["execution_not_extracting", "batch_conflict", "resource_conflict"] {
            assert_eq!(conflict.description.matches(&format!("`{code}`")).count(), 1, "{}", conflict.description);
        }
        let RefOr::T(unprocessable) = &responses["422"] else { panic!("422 inline") };
        assert!(unprocessable.description.contains("`invalid_identifier`"), "{}", unprocessable.description);
        assert!(unprocessable.content.contains_key(PROBLEM_JSON));
        assert!(!responses.contains_key("502"), "a batch request never answers with BigQuery's codes");
    }
}
