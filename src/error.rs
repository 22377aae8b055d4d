//! The closed set of stable error codes of the HTTP contract and the [`Problem`] every stage
//! reports with. Each boundary keeps its own error enum (`bigquery::BigQueryError`,
//! `store::StoreError`, `ingest::IngestError`) and converts into a `Problem`; the HTTP status of
//! a code is decided here and rendered as problem+json in exactly one place (`api::error`).

use std::fmt;

use http::StatusCode;
use serde::{Deserialize, Serialize};

/// Declares the codes in one table: variant, wire string, HTTP status, title.
macro_rules! error_codes {
    ($($variant:ident => $string:literal, $status:ident, $title:literal;)+) => {
        /// A stable, documented error code (`code` in problem+json). Never change a string.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum ErrorCode { $($variant,)+ }

        impl ErrorCode {
            pub const ALL: &'static [ErrorCode] = &[$(ErrorCode::$variant,)+];

            /// The wire string of the code.
            pub fn as_str(self) -> &'static str {
                match self { $(ErrorCode::$variant => $string,)+ }
            }

            /// The HTTP status this code answers with when it is the answer to a request.
            pub fn status(self) -> StatusCode {
                match self { $(ErrorCode::$variant => StatusCode::$status,)+ }
            }

            /// The problem+json `title`.
            pub fn title(self) -> &'static str {
                match self { $(ErrorCode::$variant => $title,)+ }
            }
        }
    };
}

error_codes! {
    Unauthorized => "unauthorized", UNAUTHORIZED, "Missing or invalid bearer token";
    NotFound => "not_found", NOT_FOUND, "Not found";
    RunNotFound => "run_not_found", NOT_FOUND, "No such run";
    ActionNotPermitted => "action_not_permitted", FORBIDDEN, "Action not permitted to the principal";
    DestinationNotPermitted => "destination_not_permitted", FORBIDDEN, "Destination not permitted to the principal";
    RunIdNotPermitted => "run_id_not_permitted", FORBIDDEN, "Run id not permitted to the principal";
    MethodNotAllowed => "method_not_allowed", METHOD_NOT_ALLOWED, "Method not allowed";
    InvalidIdentifier => "invalid_identifier", UNPROCESSABLE_ENTITY, "Invalid identifier";
    InvalidDatasetId => "invalid_dataset_id", UNPROCESSABLE_ENTITY, "Invalid dataset ID";
    InvalidRequest => "invalid_request", BAD_REQUEST, "Invalid request";
    InvalidPageToken => "invalid_page_token", BAD_REQUEST, "Invalid page token";
    UnsupportedMediaType => "unsupported_media_type", UNSUPPORTED_MEDIA_TYPE, "Unsupported media type";
    InvalidArrowIpc => "invalid_arrow_ipc", BAD_REQUEST, "Invalid Arrow IPC stream";
    SchemaMismatch => "schema_mismatch", UNPROCESSABLE_ENTITY, "Schema changed within the resource";
    UnsupportedType => "unsupported_type", UNPROCESSABLE_ENTITY, "Unsupported Arrow type";
    UnsupportedByteOrder => "unsupported_byte_order", UNPROCESSABLE_ENTITY, "Unsupported Arrow byte order";
    UnsupportedCompressionCodec => "unsupported_compression_codec", UNPROCESSABLE_ENTITY, "Unsupported Arrow IPC compression codec";
    UnsupportedIpcVersion => "unsupported_ipc_version", UNPROCESSABLE_ENTITY, "Unsupported Arrow IPC metadata version";
    UnsupportedIpcFeature => "unsupported_ipc_feature", UNPROCESSABLE_ENTITY, "Unsupported Arrow IPC feature";
    PrecisionLoss => "precision_loss", UNPROCESSABLE_ENTITY, "Value would lose precision";
    InvalidValue => "invalid_value", UNPROCESSABLE_ENTITY, "Value BigQuery cannot store";
    InvalidOperation => "invalid_operation", UNPROCESSABLE_ENTITY, "Invalid operation";
    NullPrimaryKey => "null_primary_key", UNPROCESSABLE_ENTITY, "Null primary key value";
    NullInRequiredColumn => "null_in_required_column", UNPROCESSABLE_ENTITY, "Null in a REQUIRED destination column";
    PrimaryKeyRequired => "primary_key_required", UNPROCESSABLE_ENTITY, "Primary key required";
    InvalidPrimaryKey => "invalid_primary_key", UNPROCESSABLE_ENTITY, "Invalid primary key";
    InvalidOrderBy => "invalid_order_by", UNPROCESSABLE_ENTITY, "Invalid order_by";
    InvalidDeletes => "invalid_deletes", UNPROCESSABLE_ENTITY, "Deletes option not available to the write mode";
    InvalidDeleteMissing => "invalid_delete_missing", UNPROCESSABLE_ENTITY, "delete_missing not available to the write mode";
    InvalidDirectAppend => "invalid_direct_append", UNPROCESSABLE_ENTITY, "direct_append not available to the declaration";
    InvalidPartitioning => "invalid_partitioning", UNPROCESSABLE_ENTITY, "Invalid table partitioning";
    InvalidClustering => "invalid_clustering", UNPROCESSABLE_ENTITY, "Invalid table clustering";
    InvalidTableLabels => "invalid_table_labels", UNPROCESSABLE_ENTITY, "Invalid table labels";
    InvalidTableOptions => "invalid_table_options", UNPROCESSABLE_ENTITY, "Invalid table options";
    RowTooLarge => "row_too_large", UNPROCESSABLE_ENTITY, "Row too large";
    PayloadTooLarge => "payload_too_large", PAYLOAD_TOO_LARGE, "Payload too large";
    BodyTimeout => "body_timeout", REQUEST_TIMEOUT, "Request body too slow";
    InvalidText => "invalid_text", UNPROCESSABLE_ENTITY, "Text the gateway cannot store";
    UriTooLong => "uri_too_long", URI_TOO_LONG, "Request URI too long";
    HeadersTooLarge => "headers_too_large", REQUEST_HEADER_FIELDS_TOO_LARGE, "Request headers too large";
    Overloaded => "overloaded", SERVICE_UNAVAILABLE, "Too many concurrent requests";
    ExecutionNotExtracting => "execution_not_extracting", CONFLICT, "Execution is not extracting";
    PublicationInProgress => "publication_in_progress", CONFLICT, "Publication in progress";
    RunConflict => "run_conflict", CONFLICT, "Run already exists with another definition";
    ResourceConflict => "resource_conflict", CONFLICT, "Resource conflicts with its declaration";
    AtomicPublicationUnsupported => "atomic_publication_unsupported", CONFLICT, "Atomic publication cannot hold these resources";
    BatchConflict => "batch_conflict", CONFLICT, "Batch sequence number reused with other content";
    Backpressure => "backpressure", TOO_MANY_REQUESTS, "Upload budget full";
    PrincipalLimit => "principal_limit", TOO_MANY_REQUESTS, "The principal's share is in use";
    LaneLimit => "lane_limit", TOO_MANY_REQUESTS, "The principal has its most lanes open";
    ReplayMismatch => "replay_mismatch", CONFLICT, "Redelivered execution differs from its publication";
    PublicationFailed => "publication_failed", BAD_GATEWAY, "Publication failed";
    PublicationTooExpensive => "publication_too_expensive", BAD_GATEWAY, "Publication would bill more than allowed";
    ForeignJob => "foreign_job", BAD_GATEWAY, "A job the gateway did not submit holds its job id";
    UploadFailed => "upload_failed", BAD_GATEWAY, "Upload to BigQuery failed";
    RowCountMismatch => "row_count_mismatch", BAD_GATEWAY, "Row count mismatch";
    IncompatibleSchema => "incompatible_schema", UNPROCESSABLE_ENTITY, "Incompatible destination schema";
    RequiredColumnMissing => "required_column_missing", UNPROCESSABLE_ENTITY, "Required destination column missing";
    PendingStreamExpired => "pending_stream_expired", CONFLICT, "Pending stream expired";
    GatewayRestarted => "gateway_restarted", SERVICE_UNAVAILABLE, "Gateway restarted during the execution";
    ExecutionOwnedElsewhere => "execution_owned_elsewhere", SERVICE_UNAVAILABLE, "Execution served by another replica";
    ReplicaDraining => "replica_draining", SERVICE_UNAVAILABLE, "Gateway replica shutting down";
    ServiceDisabled => "service_disabled", BAD_GATEWAY, "BigQuery API disabled";
    MissingCredentials => "missing_credentials", BAD_GATEWAY, "Missing Google credentials";
    PermissionDenied => "permission_denied", BAD_GATEWAY, "Permission denied";
    DatasetLocationMismatch => "dataset_location_mismatch", BAD_GATEWAY, "Dataset location mismatch";
    BigqueryUnavailable => "bigquery_unavailable", SERVICE_UNAVAILABLE, "BigQuery unavailable";
    QuotaExceeded => "quota_exceeded", SERVICE_UNAVAILABLE, "BigQuery quota exceeded";
    BigqueryError => "bigquery_error", BAD_GATEWAY, "BigQuery error";
    NotReady => "not_ready", SERVICE_UNAVAILABLE, "Not ready";
    InternalError => "internal_error", INTERNAL_SERVER_ERROR, "Internal error";
}

impl ErrorCode {
    pub fn from_str_opt(s: &str) -> Option<Self> {
        Self::ALL.iter().copied().find(|c| c.as_str() == s)
    }

    /// What a client does about the code, where that is not to fix the request: the contract
    /// text of the OpenAPI document's problem responses (`api::problems`).
    pub fn advice(self) -> Option<&'static str> {
        Some(match self {
            ErrorCode::Backpressure | ErrorCode::Overloaded | ErrorCode::PrincipalLimit => {
                "retry after `Retry-After` seconds"
            }
            ErrorCode::ExecutionOwnedElsewhere => {
                "another gateway replica serves the execution and could not be reached; retry after `Retry-After`"
            }
            ErrorCode::ReplicaDraining => "this replica is shutting down; retry",
            ErrorCode::LaneLimit => {
                "each resource with batches in an extracting execution holds a lane until its commit or abort; commit or abort executions, then retry after `Retry-After`"
            }
            ErrorCode::GatewayRestarted => "the replica serving the execution stopped; deliver the execution again",
            ErrorCode::PendingStreamExpired => "deliver the execution again and commit it sooner",
            ErrorCode::BodyTimeout => "the body arrived slower than `FILAMENT_BODY_MIN_RATE_BYTES_PER_SEC`",
            ErrorCode::PublicationInProgress => "the commit already submitted destination jobs and runs to its end",
            ErrorCode::BigqueryUnavailable | ErrorCode::QuotaExceeded => "retry later",
            _ => return None,
        })
    }
}

impl Serialize for ErrorCode {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for ErrorCode {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let s = String::deserialize(deserializer)?;
        Self::from_str_opt(&s).ok_or_else(|| serde::de::Error::custom(format!("unknown error code {s}")))
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An error as users see it: a stable code, a specific detail and, where one exists, the fix.
/// Also the shape stored on a failed execution (`error`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Problem {
    #[schema(value_type = String, example = "invalid_identifier")]
    pub code: ErrorCode,
    pub detail: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hint: Option<String>,
    /// Seconds for `Retry-After` (429 only); not part of the stored shape.
    #[serde(skip)]
    #[schema(ignore)]
    pub retry_after_secs: Option<u64>,
    /// What failed inside the gateway (a Postgres error, say), for the log line of the answer
    /// or the failure it becomes: never sent, never stored.
    #[serde(skip)]
    #[schema(ignore)]
    pub cause: Option<String>,
}

impl Problem {
    pub fn new(code: ErrorCode, detail: impl Into<String>) -> Self {
        Self { code, detail: detail.into(), hint: None, retry_after_secs: None, cause: None }
    }

    pub fn with_hint(mut self, hint: impl Into<String>) -> Self {
        self.hint = Some(hint.into());
        self
    }

    /// Sets `Retry-After` (429 and 503 answers).
    pub fn with_retry_after(mut self, seconds: u64) -> Self {
        self.retry_after_secs = Some(seconds);
        self
    }

    pub fn not_found(what: impl fmt::Display) -> Self {
        Self::new(ErrorCode::NotFound, format!("{what} does not exist"))
    }

    pub fn invalid_request(detail: impl Into<String>) -> Self {
        Self::new(ErrorCode::InvalidRequest, detail)
    }

    pub fn internal(detail: impl Into<String>) -> Self {
        Self::new(ErrorCode::InternalError, detail)
    }

    /// Keeps what failed inside, for the log (see [`Problem::cause`]).
    pub fn with_cause(mut self, cause: impl fmt::Display) -> Self {
        self.cause = Some(cause.to_string());
        self
    }
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.code, self.detail)
    }
}

impl std::error::Error for Problem {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip_through_their_wire_strings() {
        for &code in ErrorCode::ALL {
            let json = serde_json::to_value(code).unwrap();
            assert_eq!(json.as_str(), Some(code.as_str()));
            assert_eq!(serde_json::from_value::<ErrorCode>(json).unwrap(), code);
        }
        let strings: std::collections::HashSet<_> = ErrorCode::ALL.iter().map(|c| c.as_str()).collect();
        assert_eq!(strings.len(), ErrorCode::ALL.len(), "wire strings must be unique");
        assert_eq!(ErrorCode::Backpressure.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(ErrorCode::InvalidDatasetId.status(), StatusCode::UNPROCESSABLE_ENTITY);
    }
}
