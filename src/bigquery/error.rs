//! Errors of the BigQuery boundary (REST and gRPC), classified once: whether a retry can help,
//! and which user-facing problem (with its fix) a failure means.

use crate::error::{ErrorCode, Problem};

/// A failed call to BigQuery.
#[derive(Debug, thiserror::Error)]
pub(crate) enum BigQueryError {
    /// REST call (datasets, tables, jobs) through google-cloud-bigquery-v2.
    #[error("{operation}: {source}")]
    Rest { operation: &'static str, source: google_cloud_gax::error::Error },
    /// gRPC call to the Storage Write API.
    #[error("{operation}: {status}")]
    Grpc { operation: &'static str, status: tonic::Status },
    /// An error carried inside an OK response (AppendRows `error`/`row_errors`, BatchCommit
    /// `stream_errors`, a job's `errorResult`).
    #[error("{operation}: {message}")]
    InResponse { operation: &'static str, code: i32, message: String },
    /// A query job ended with an `errorResult` (it can never run again under its id).
    #[error("query job: {message} ({reason})")]
    JobFailed { reason: String, message: String },
    /// Credentials could not produce a token.
    #[error("credentials: {0}")]
    Credentials(String),
    #[error("{operation}: timed out after {seconds} s")]
    Timeout { operation: &'static str, seconds: u64 },
    /// The answer contradicts what the gateway sent (a row count, an offset).
    #[error("{0}")]
    Inconsistent(String),
    #[error("connecting to the Storage Write API: {0}")]
    Connect(String),
}

/// `errorResult.reason`s of a query job that a new attempt may not meet again.
const TRANSIENT_JOB_REASONS: &[&str] = &["rateLimitExceeded", "backendError", "internalError", "jobBackendError"];

/// gRPC codes Google's clients retry on the Storage Write API.
const RETRYABLE_GRPC: &[tonic::Code] = &[
    tonic::Code::Unavailable,
    tonic::Code::Internal,
    tonic::Code::Aborted,
    tonic::Code::Cancelled,
    tonic::Code::DeadlineExceeded,
    tonic::Code::Unknown,
    tonic::Code::ResourceExhausted,
];

impl BigQueryError {
    pub(crate) fn rest(operation: &'static str) -> impl FnOnce(google_cloud_gax::error::Error) -> Self {
        move |source| BigQueryError::Rest { operation, source }
    }

    pub(crate) fn grpc(operation: &'static str) -> impl FnOnce(tonic::Status) -> Self {
        move |status| BigQueryError::Grpc { operation, status }
    }

    /// The HTTP status of a REST failure, when BigQuery answered.
    pub(crate) fn http_status(&self) -> Option<u16> {
        match self {
            BigQueryError::Rest { source, .. } => source.http_status_code(),
            _ => None,
        }
    }

    /// Whether the same call may succeed later.
    pub(crate) fn is_retryable(&self) -> bool {
        match self {
            BigQueryError::Rest { source, .. } => {
                matches!(source.http_status_code(), Some(429 | 500 | 502 | 503 | 504))
                    || source.is_io()
                    || source.is_connect()
                    || source.is_timeout()
            }
            BigQueryError::Grpc { status, .. } => RETRYABLE_GRPC.contains(&status.code()),
            BigQueryError::InResponse { code, .. } => RETRYABLE_GRPC.iter().any(|c| *c as i32 == *code),
            BigQueryError::Timeout { .. } | BigQueryError::Connect(_) => true,
            BigQueryError::Credentials(_) | BigQueryError::Inconsistent(_) | BigQueryError::JobFailed { .. } => false,
        }
    }

    /// A query job that failed for a passing reason: the same statement may succeed under a new
    /// job id (BigQuery's transient `errorResult` reasons, and a DML conflict with a concurrent
    /// statement on the same table).
    pub(crate) fn is_transient_job_failure(&self) -> bool {
        match self {
            BigQueryError::JobFailed { reason, message } => {
                TRANSIENT_JOB_REASONS.contains(&reason.as_str()) || message.contains("Could not serialize access")
            }
            _ => false,
        }
    }

    /// Whether BigQuery refused for quota (`RESOURCE_EXHAUSTED`, as a status or inside an
    /// AppendRows response): retried for as long as the quota wait allows, not per attempt.
    pub(crate) fn is_quota_exhausted(&self) -> bool {
        const RESOURCE_EXHAUSTED: i32 = tonic::Code::ResourceExhausted as i32;
        match self {
            BigQueryError::Grpc { status, .. } => status.code() == tonic::Code::ResourceExhausted,
            BigQueryError::InResponse { code, .. } => *code == RESOURCE_EXHAUSTED,
            _ => false,
        }
    }

    /// A short name for logs and metric labels: the gRPC code (`UNAVAILABLE`, ...) or the kind.
    pub(crate) fn code_name(&self) -> &'static str {
        match self {
            BigQueryError::Grpc { status, .. } => grpc_code_name(status.code() as i32),
            BigQueryError::InResponse { code, .. } => grpc_code_name(*code),
            BigQueryError::Connect(_) => "connect",
            BigQueryError::Timeout { .. } => "timeout",
            _ => "other",
        }
    }

    /// The message BigQuery gave, for matching and for users.
    fn message(&self) -> String {
        match self {
            BigQueryError::Rest { source, .. } => match source.status() {
                Some(status) => status.message.clone(),
                None => source.to_string(),
            },
            BigQueryError::Grpc { status, .. } => status.message().to_string(),
            other => other.to_string(),
        }
    }

    /// `(reason, metadata)` of the `google.rpc.ErrorInfo` details: from the REST error body
    /// (gax also maps BigQuery's `errors[].reason` to these) or the gRPC status details.
    pub(crate) fn error_infos(&self) -> Vec<(String, std::collections::HashMap<String, String>)> {
        match self {
            BigQueryError::Rest { source, .. } => source
                .status()
                .map(|status| {
                    status
                        .details
                        .iter()
                        .filter_map(|detail| match detail {
                            google_cloud_gax::error::rpc::StatusDetails::ErrorInfo(info) => {
                                Some((info.reason.clone(), info.metadata.clone()))
                            }
                            _ => None,
                        })
                        .collect()
                })
                .unwrap_or_default(),
            BigQueryError::Grpc { status, .. } => grpc_error_infos(status.details()),
            _ => Vec::new(),
        }
    }

    /// Maps the failure to the user-facing problem, recognising the failures users can fix.
    pub(crate) fn to_problem(&self, fallback: ErrorCode) -> Problem {
        let message = self.message();
        let lower = message.to_ascii_lowercase();
        // A token that could not be fetched inside a REST call is the same failure.
        if let BigQueryError::Rest { source, .. } = self
            && source.is_authentication()
        {
            return Problem::new(
                ErrorCode::MissingCredentials,
                format!("could not obtain Google credentials: {source}"),
            )
            .with_hint(
                "attach a service account, configure Workload Identity, or run `gcloud auth application-default login`",
            );
        }
        if let BigQueryError::Credentials(detail) = self {
            return Problem::new(ErrorCode::MissingCredentials, detail.clone()).with_hint(
                "attach a service account, configure Workload Identity, or run `gcloud auth application-default login`",
            );
        }
        if let BigQueryError::JobFailed { reason, message } = self
            && reason == "bytesBilledLimitExceeded"
        {
            return Problem::new(ErrorCode::PublicationTooExpensive, message.clone()).with_hint(
                "the job would bill more than the run's maximum_bytes_billed: raise it, or let the job read less (partition or cluster the destination on the key, see docs/cost.md)",
            );
        }
        if let BigQueryError::Rest { source, .. } = self
            && is_quota(source)
        {
            return Problem::new(ErrorCode::QuotaExceeded, message).with_hint(
                "BigQuery's quota or rate limit named in the detail stayed exhausted through the gateway's retries: wait and retry, spread the load (fewer concurrent runs or tables), or request a higher quota in the Google Cloud console (IAM & Admin > Quotas)",
            );
        }
        let infos = self.error_infos();
        let reasons: Vec<&str> = infos.iter().map(|(reason, _)| reason.as_str()).collect();
        if reasons.contains(&"SERVICE_DISABLED")
            || lower.contains("service_disabled")
            || lower.contains("has not been used in project")
        {
            let service = infos
                .iter()
                .find_map(|(_, metadata)| metadata.get("service").cloned())
                .unwrap_or_else(|| "bigquerystorage.googleapis.com".to_string());
            return Problem::new(ErrorCode::ServiceDisabled, message).with_hint(format!(
                "enable {service} in the project (the gateway needs bigquery.googleapis.com and bigquerystorage.googleapis.com): gcloud services enable {service}"
            ));
        }
        // From datasets.get (HTTP 404) or a job's errorResult ("notFound").
        if lower.contains("not found: dataset") && lower.contains("in location") {
            return dataset_location_mismatch(message);
        }
        if self.is_quota_exhausted() {
            return Problem::new(ErrorCode::QuotaExceeded, message).with_hint(
                "BigQuery's Storage Write API quota (AppendRows throughput) stayed exhausted for FILAMENT_QUOTA_WAIT_SECS: request a quota increase, or lower FILAMENT_MAX_INFLIGHT_REQUESTS",
            );
        }
        let permission = self.http_status() == Some(403)
            || reasons.iter().any(|r| matches!(*r, "accessDenied" | "IAM_PERMISSION_DENIED"))
            || matches!(self, BigQueryError::Grpc { status, .. } if status.code() == tonic::Code::PermissionDenied);
        if permission {
            return Problem::new(ErrorCode::PermissionDenied, message).with_hint(
                "grant the gateway's credential roles/bigquery.jobUser on the project and roles/bigquery.dataEditor on the dataset (creating a dataset needs the project-level grant)",
            );
        }
        if self.is_retryable() && fallback == ErrorCode::BigqueryError {
            return Problem::new(ErrorCode::BigqueryUnavailable, message);
        }
        Problem::new(fallback, message)
    }
}

/// `errors[].reason`s of a REST answer that mean a quota or rate limit was hit.
const QUOTA_REASONS: &[&str] = &["rateLimitExceeded", "quotaExceeded"];

/// Whether a REST answer is a quota condition (403 or 429 with a quota reason), not a refusal.
pub(crate) fn is_quota(error: &google_cloud_gax::error::Error) -> bool {
    let quota_status = matches!(error.http_status_code(), Some(403 | 429));
    let reasons = error.status().map(|status| {
        status.details.iter().any(|detail| {
            matches!(detail, google_cloud_gax::error::rpc::StatusDetails::ErrorInfo(info)
                if QUOTA_REASONS.contains(&info.reason.as_str()))
        })
    });
    quota_status && reasons.unwrap_or(false)
}

/// `dataset_location_mismatch` with its fix: the dataset exists in another location than the
/// run's.
pub(crate) fn dataset_location_mismatch(detail: String) -> Problem {
    Problem::new(ErrorCode::DatasetLocationMismatch, detail)
        .with_hint("the dataset lives in another location: set the run's location to match it, or leave it empty")
}

/// The canonical name of a gRPC status code.
pub(crate) fn grpc_code_name(code: i32) -> &'static str {
    match code {
        1 => "CANCELLED",
        2 => "UNKNOWN",
        3 => "INVALID_ARGUMENT",
        4 => "DEADLINE_EXCEEDED",
        5 => "NOT_FOUND",
        6 => "ALREADY_EXISTS",
        7 => "PERMISSION_DENIED",
        8 => "RESOURCE_EXHAUSTED",
        9 => "FAILED_PRECONDITION",
        10 => "ABORTED",
        11 => "OUT_OF_RANGE",
        12 => "UNIMPLEMENTED",
        13 => "INTERNAL",
        14 => "UNAVAILABLE",
        16 => "UNAUTHENTICATED",
        _ => "OTHER",
    }
}

/// Decodes `ErrorInfo`s from gRPC status details (a serialized `google.rpc.Status`).
fn grpc_error_infos(details: &[u8]) -> Vec<(String, std::collections::HashMap<String, String>)> {
    use googleapis_tonic_google_rpc::google::rpc::{ErrorInfo, Status};
    use prost::Message as _;
    let Ok(status) = Status::decode(details) else { return Vec::new() };
    status
        .details
        .iter()
        .filter(|any| any.type_url.ends_with("google.rpc.ErrorInfo"))
        .filter_map(|any| ErrorInfo::decode(any.value.as_ref()).ok())
        .map(|info| (info.reason, info.metadata.into_iter().collect()))
        .collect()
}

pub(crate) type BigQueryResult<T> = Result<T, BigQueryError>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classifies_grpc_codes_like_googles_clients() {
        for code in [tonic::Code::Unavailable, tonic::Code::ResourceExhausted, tonic::Code::Internal] {
            assert!(BigQueryError::Grpc { operation: "append", status: tonic::Status::new(code, "x") }.is_retryable());
        }
        for code in [tonic::Code::InvalidArgument, tonic::Code::NotFound, tonic::Code::FailedPrecondition] {
            assert!(!BigQueryError::Grpc { operation: "append", status: tonic::Status::new(code, "x") }.is_retryable());
        }
        assert!(
            !BigQueryError::InResponse { operation: "append", code: 11, message: "out of range".into() }.is_retryable()
        );
    }

    #[test]
    fn reads_error_info_from_grpc_status_details() {
        use googleapis_tonic_google_rpc::google::rpc::{ErrorInfo, Status};
        use prost::Message as _;
        let info = ErrorInfo {
            reason: "SERVICE_DISABLED".into(),
            domain: "googleapis.com".into(),
            metadata: [("service".to_string(), "bigquerystorage.googleapis.com".to_string())].into_iter().collect(),
        };
        let details = Status {
            code: 7,
            message: "denied".into(),
            details: vec![prost_types::Any {
                type_url: "type.googleapis.com/google.rpc.ErrorInfo".into(),
                value: info.encode_to_vec(),
            }],
        };
        let status = tonic::Status::with_details(
            tonic::Code::PermissionDenied,
            "Permission denied",
            details.encode_to_vec().into(),
        );
        let error = BigQueryError::Grpc { operation: "CreateWriteStream", status };
        let problem = error.to_problem(ErrorCode::UploadFailed);
        assert_eq!(problem.code, ErrorCode::ServiceDisabled);
        assert!(problem.hint.unwrap().contains("gcloud services enable bigquerystorage.googleapis.com"));
    }

    #[test]
    fn recognises_fixable_failures() {
        let disabled = BigQueryError::Grpc {
            operation: "append",
            status: tonic::Status::permission_denied(
                "BigQuery Storage API has not been used in project 123 before or it is disabled",
            ),
        };
        assert_eq!(disabled.to_problem(ErrorCode::UploadFailed).code, ErrorCode::ServiceDisabled);
        let denied = BigQueryError::Grpc {
            operation: "append",
            status: tonic::Status::permission_denied("Permission bigquery.tables.updateData denied on table"),
        };
        let problem = denied.to_problem(ErrorCode::UploadFailed);
        assert_eq!(problem.code, ErrorCode::PermissionDenied);
        assert!(problem.detail.contains("bigquery.tables.updateData"));
        let quota = BigQueryError::InResponse { operation: "append", code: 8, message: "Exceeds quota".into() };
        let problem = quota.to_problem(ErrorCode::UploadFailed);
        assert_eq!(problem.code, ErrorCode::QuotaExceeded);
        assert!(problem.hint.unwrap().contains("AppendRows throughput"));
        let other = BigQueryError::InResponse { operation: "append", code: 3, message: "bad row".into() };
        assert_eq!(other.to_problem(ErrorCode::UploadFailed).code, ErrorCode::UploadFailed);
    }
}
