//! Errors of the BigQuery boundary (REST and gRPC), classified once: whether a retry can help,
//! and which user-facing problem (with its fix) a failure means.

use crate::error::{ErrorCode, Problem};

/// A failed call to BigQuery.
#[derive(Debug, thiserror::Error)]
pub enum BigQueryError {
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
    pub fn rest(operation: &'static str) -> impl FnOnce(google_cloud_gax::error::Error) -> Self {
        move |source| BigQueryError::Rest { operation, source }
    }

    pub fn grpc(operation: &'static str) -> impl FnOnce(tonic::Status) -> Self {
        move |status| BigQueryError::Grpc { operation, status }
    }

    /// The HTTP status of a REST failure, when BigQuery answered.
    pub fn http_status(&self) -> Option<u16> {
        match self {
            BigQueryError::Rest { source, .. } => source.http_status_code(),
            _ => None,
        }
    }

    pub fn is_not_found(&self) -> bool {
        self.http_status() == Some(404)
    }

    pub fn is_already_exists(&self) -> bool {
        self.http_status() == Some(409)
    }

    /// Whether the same call may succeed later.
    pub fn is_retryable(&self) -> bool {
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
            BigQueryError::Credentials(_) | BigQueryError::Inconsistent(_) => false,
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

    /// Maps the failure to the user-facing problem, recognising the failures users can fix.
    pub fn to_problem(&self, fallback: ErrorCode) -> Problem {
        let message = self.message();
        let lower = message.to_ascii_lowercase();
        if let BigQueryError::Credentials(detail) = self {
            return Problem::new(
                ErrorCode::MissingCredentials,
                format!("could not obtain Google credentials: {detail}"),
            )
            .with_hint(
                "attach a service account, configure Workload Identity, or run `gcloud auth application-default login`",
            );
        }
        if lower.contains("service_disabled") || lower.contains("has not been used in project") {
            return Problem::new(ErrorCode::ServiceDisabled, message)
                .with_hint("enable bigquery.googleapis.com and bigquerystorage.googleapis.com in the project");
        }
        if lower.contains("not found: dataset") && lower.contains("in location") {
            return Problem::new(ErrorCode::DatasetLocationMismatch, message).with_hint(
                "the dataset lives in another location: set the run's location to match it, or leave it empty",
            );
        }
        let permission = self.http_status() == Some(403)
            || matches!(self, BigQueryError::Grpc { status, .. } if status.code() == tonic::Code::PermissionDenied);
        if permission || lower.contains("permission") && lower.contains("denied") {
            return Problem::new(ErrorCode::PermissionDenied, message).with_hint(
                "grant the gateway's credential roles/bigquery.jobUser on the project and roles/bigquery.dataEditor on the dataset",
            );
        }
        if self.is_retryable() && fallback == ErrorCode::BigqueryError {
            return Problem::new(ErrorCode::BigqueryUnavailable, message);
        }
        Problem::new(fallback, message)
    }
}

pub type BigQueryResult<T> = Result<T, BigQueryError>;

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
        let other = BigQueryError::InResponse { operation: "append", code: 3, message: "bad row".into() };
        assert_eq!(other.to_problem(ErrorCode::UploadFailed).code, ErrorCode::UploadFailed);
    }
}
