//! Errors of the BigQuery boundary (REST and gRPC), classified once: whether a retry can help
//! ([`super::retry::RetryClass`]), and which user-facing problem a failure means: the failures
//! users can fix are one table ([`DIAGNOSES`], each with its fix), and any other failure takes
//! the default code of the [`Stage`] it happened at.

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
    InResponse { operation: &'static str, code: tonic::Code, message: String },
    /// A query job ended with an `errorResult` (it can never run again under its id).
    #[error("query job: {message} ({reason})")]
    JobFailed { reason: String, message: String },
    /// A job exists under the id the gateway chose and is not the one it submits
    /// (`bigquery::jobs::foreign_because`): its outcome is never taken.
    #[error("job {job_id} exists and is not the gateway's: {why}")]
    ForeignJob { job_id: String, why: &'static str },
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

/// `errorResult.reason`s of a query job that a new attempt (under a new job id) may not meet
/// again (BigQuery documentation, Error messages: "Retry the job with a new
/// jobId").
const TRANSIENT_JOB_REASONS: &[&str] = &["backendError", "internalError", "jobBackendError", "jobInternalError"];
/// `errorResult.reason`s of a query job that BigQuery refused for its rate limits: pushback.
const PUSHBACK_JOB_REASONS: &[&str] = &["rateLimitExceeded", "jobRateLimitExceeded"];

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
            BigQueryError::InResponse { code, .. } => RETRYABLE_GRPC.contains(code),
            BigQueryError::Timeout { .. } | BigQueryError::Connect(_) => true,
            BigQueryError::Credentials(_)
            | BigQueryError::Inconsistent(_)
            | BigQueryError::JobFailed { .. }
            | BigQueryError::ForeignJob { .. } => false,
        }
    }

    /// A query job that failed for a passing reason: the same statement may succeed under a new
    /// job id (BigQuery's transient `errorResult` reasons, a DML conflict with a concurrent
    /// statement on the same table, and a multi-statement transaction cancelled by a concurrent
    /// update: BigQuery cancels a conflicting transaction rather than queueing it).
    pub(crate) fn is_transient_job_failure(&self) -> bool {
        match self {
            BigQueryError::JobFailed { reason, message } => {
                TRANSIENT_JOB_REASONS.contains(&reason.as_str())
                    || message.contains("Could not serialize access")
                    || message.contains("aborted due to concurrent update")
            }
            _ => false,
        }
    }

    /// Whether BigQuery refused for quota (`RESOURCE_EXHAUSTED`, as a status or inside an
    /// AppendRows response): retried for as long as the quota wait allows, not per attempt.
    pub(crate) fn is_quota_exhausted(&self) -> bool {
        match self {
            BigQueryError::Grpc { status, .. } => status.code() == tonic::Code::ResourceExhausted,
            BigQueryError::InResponse { code, .. } => *code == tonic::Code::ResourceExhausted,
            _ => false,
        }
    }

    /// Whether BigQuery pushed back: a quota or rate limit, on any API (gRPC
    /// `RESOURCE_EXHAUSTED`; REST 429, or 403 with `rateLimitExceeded` / `quotaExceeded`; a job
    /// that failed for its rate limits).
    pub(crate) fn is_pushback(&self) -> bool {
        match self {
            BigQueryError::Rest { source, .. } => source.http_status_code() == Some(429) || is_quota(source),
            BigQueryError::JobFailed { reason, .. } => PUSHBACK_JOB_REASONS.contains(&reason.as_str()),
            _ => self.is_quota_exhausted(),
        }
    }

    /// A short name for logs and metric labels: the gRPC code (`UNAVAILABLE`, ...), the HTTP
    /// status of a REST answer, the job's reason, or the kind.
    pub(crate) fn code_name(&self) -> String {
        match self {
            BigQueryError::Grpc { status, .. } => grpc_code_name(status.code()).to_string(),
            BigQueryError::InResponse { code, .. } => grpc_code_name(*code).to_string(),
            BigQueryError::Rest { source, .. } => match source.http_status_code() {
                Some(status) => format!("http_{status}"),
                None if source.is_timeout() => "timeout".into(),
                None => "io".into(),
            },
            BigQueryError::JobFailed { reason, .. } => reason.clone(),
            BigQueryError::ForeignJob { .. } => "foreign_job".into(),
            BigQueryError::Connect(_) => "connect".into(),
            BigQueryError::Timeout { .. } => "timeout".into(),
            BigQueryError::Credentials(_) => "credentials".into(),
            BigQueryError::Inconsistent(_) => "inconsistent".into(),
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

    /// The user-facing problem of a failure at `stage`: a failure users can fix, recognised
    /// ([`DIAGNOSES`]), or the stage's own code.
    pub(crate) fn problem(&self, stage: Stage) -> Problem {
        self.diagnose().unwrap_or_else(|| Problem::new(stage.code(self), self.message()))
    }

    /// The failure users can fix that this is, if it is one: the first row of [`DIAGNOSES`]
    /// that recognises it.
    pub(crate) fn diagnose(&self) -> Option<Problem> {
        DIAGNOSES.iter().find_map(|diagnosis| (diagnosis.recognise)(self))
    }
}

/// Where a call to BigQuery failed: what a failure users cannot fix is reported as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stage {
    /// Datasets, tables, write streams before the first append (`bigquery_error`, or
    /// `bigquery_unavailable` when a retry could help).
    Setup,
    /// Appends, finalize and commit of streams (`upload_failed`).
    Upload,
    /// Publication query jobs and what they read first (`publication_failed`).
    Publication,
    /// Credentials (`missing_credentials`).
    Credentials,
    /// A check of BigQuery's reachability (`bigquery_unavailable`).
    Readiness,
}

impl Stage {
    fn code(self, error: &BigQueryError) -> ErrorCode {
        match self {
            Stage::Setup if error.is_retryable() => ErrorCode::BigqueryUnavailable,
            Stage::Setup => ErrorCode::BigqueryError,
            Stage::Upload => ErrorCode::UploadFailed,
            Stage::Publication => ErrorCode::PublicationFailed,
            Stage::Credentials => ErrorCode::MissingCredentials,
            Stage::Readiness => ErrorCode::BigqueryUnavailable,
        }
    }
}

/// A failure users can fix: how it is recognised, and the problem with its fix.
struct Diagnosis {
    recognise: fn(&BigQueryError) -> Option<Problem>,
}

const CREDENTIALS_HINT: &str =
    "attach a service account, configure Workload Identity, or run `gcloud auth application-default login`";

/// The failures users can fix, in the order they are recognised (the first that matches wins).
const DIAGNOSES: &[Diagnosis] = &[
    // A job under our id that we did not submit.
    Diagnosis {
        recognise: |e| {
            match e {
            BigQueryError::ForeignJob { .. } => Some(Problem::new(ErrorCode::ForeignJob, e.to_string()).with_hint(
                "someone who may create jobs in the job project created a job under the gateway's job id; its outcome was not taken and nothing was recorded as published (the staging table is kept): find who in the project's job history (INFORMATION_SCHEMA.JOBS), then load again under a new execution ID",
            )),
            _ => None,
        }
        },
    },
    // A token that could not be fetched, at start-up or inside a REST call.
    Diagnosis {
        recognise: |e| {
            match e {
                BigQueryError::Credentials(detail) => Some(Problem::new(ErrorCode::MissingCredentials, detail.clone())),
                BigQueryError::Rest { source, .. } if source.is_authentication() => Some(Problem::new(
                    ErrorCode::MissingCredentials,
                    format!("could not obtain Google credentials: {source}"),
                )),
                _ => None,
            }
            .map(|problem| problem.with_hint(CREDENTIALS_HINT))
        },
    },
    // A job over the run's maximum_bytes_billed.
    Diagnosis {
        recognise: |e| {
            match e {
            BigQueryError::JobFailed { reason, message } if reason == "bytesBilledLimitExceeded" => Some(
                Problem::new(ErrorCode::PublicationTooExpensive, message.clone()).with_hint(
                    "the job would bill more than the run's maximum_bytes_billed: raise it, or let the job read less (partition or cluster the destination on the key, see docs/cost.md)",
                ),
            ),
            _ => None,
        }
        },
    },
    // A REST quota or rate limit that outlasted the retries.
    Diagnosis {
        recognise: |e| {
            match e {
            BigQueryError::Rest { source, .. } if is_quota(source) => Some(
                Problem::new(ErrorCode::QuotaExceeded, e.message()).with_hint(
                    "BigQuery's quota or rate limit named in the detail stayed exhausted through the gateway's retries: wait and retry, spread the load (fewer concurrent runs or tables), or request a higher quota in the Google Cloud console (IAM & Admin > Quotas)",
                ),
            ),
            _ => None,
        }
        },
    },
    // The BigQuery or BigQuery Storage API disabled in the project.
    Diagnosis { recognise: service_disabled },
    // The dataset lives in another location (datasets.get 404, or a job's notFound).
    Diagnosis {
        recognise: |e| {
            let lower = e.message().to_ascii_lowercase();
            (lower.contains("not found: dataset") && lower.contains("in location"))
                .then(|| dataset_location_mismatch(e.message()))
        },
    },
    // The Storage Write throughput quota stayed exhausted for the quota wait.
    Diagnosis {
        recognise: |e| {
            e.is_quota_exhausted().then(|| {
                Problem::new(ErrorCode::QuotaExceeded, e.message()).with_hint(
                    "BigQuery's Storage Write API quota (AppendRows throughput) stayed exhausted for FILAMENT_QUOTA_WAIT_SECS: request a quota increase, or lower FILAMENT_MAX_INFLIGHT_REQUESTS",
                )
            })
        },
    },
    // A missing permission, named in the message.
    Diagnosis { recognise: permission_denied },
];

fn service_disabled(error: &BigQueryError) -> Option<Problem> {
    let infos = error.error_infos();
    let lower = error.message().to_ascii_lowercase();
    let disabled = infos.iter().any(|(reason, _)| reason == "SERVICE_DISABLED")
        || lower.contains("service_disabled")
        || lower.contains("has not been used in project");
    if !disabled {
        return None;
    }
    let service = infos
        .iter()
        .find_map(|(_, metadata)| metadata.get("service").cloned())
        .unwrap_or_else(|| "bigquerystorage.googleapis.com".to_string());
    Some(Problem::new(ErrorCode::ServiceDisabled, error.message()).with_hint(format!(
        "enable {service} in the project (the gateway needs bigquery.googleapis.com and bigquerystorage.googleapis.com): gcloud services enable {service}"
    )))
}

fn permission_denied(error: &BigQueryError) -> Option<Problem> {
    let infos = error.error_infos();
    let denied = error.http_status() == Some(403)
        || infos.iter().any(|(reason, _)| matches!(reason.as_str(), "accessDenied" | "IAM_PERMISSION_DENIED"))
        || matches!(error, BigQueryError::Grpc { status, .. } if status.code() == tonic::Code::PermissionDenied);
    denied.then(|| {
        Problem::new(ErrorCode::PermissionDenied, error.message()).with_hint(
            "grant the gateway's credential roles/bigquery.jobUser on the project and roles/bigquery.dataEditor on the dataset (creating a dataset needs the project-level grant)",
        )
    })
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
pub(crate) fn grpc_code_name(code: tonic::Code) -> &'static str {
    match code {
        tonic::Code::Ok => "OK",
        tonic::Code::Cancelled => "CANCELLED",
        tonic::Code::Unknown => "UNKNOWN",
        tonic::Code::InvalidArgument => "INVALID_ARGUMENT",
        tonic::Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
        tonic::Code::NotFound => "NOT_FOUND",
        tonic::Code::AlreadyExists => "ALREADY_EXISTS",
        tonic::Code::PermissionDenied => "PERMISSION_DENIED",
        tonic::Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
        tonic::Code::FailedPrecondition => "FAILED_PRECONDITION",
        tonic::Code::Aborted => "ABORTED",
        tonic::Code::OutOfRange => "OUT_OF_RANGE",
        tonic::Code::Unimplemented => "UNIMPLEMENTED",
        tonic::Code::Internal => "INTERNAL",
        tonic::Code::Unavailable => "UNAVAILABLE",
        tonic::Code::DataLoss => "DATA_LOSS",
        tonic::Code::Unauthenticated => "UNAUTHENTICATED",
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
        let out_of_range = tonic::Code::OutOfRange;
        assert!(
            !BigQueryError::InResponse { operation: "append", code: out_of_range, message: "out of range".into() }
                .is_retryable()
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
        let problem = error.problem(Stage::Upload);
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
        assert_eq!(disabled.problem(Stage::Upload).code, ErrorCode::ServiceDisabled);
        let denied = BigQueryError::Grpc {
            operation: "append",
            status: tonic::Status::permission_denied("Permission bigquery.tables.updateData denied on table"),
        };
        let problem = denied.problem(Stage::Upload);
        assert_eq!(problem.code, ErrorCode::PermissionDenied);
        assert!(problem.detail.contains("bigquery.tables.updateData"));
        let code = tonic::Code::ResourceExhausted;
        let quota = BigQueryError::InResponse { operation: "append", code, message: "Exceeds quota".into() };
        let problem = quota.problem(Stage::Upload);
        assert_eq!(problem.code, ErrorCode::QuotaExceeded);
        assert!(problem.hint.unwrap().contains("AppendRows throughput"));
        let code = tonic::Code::InvalidArgument;
        let other = BigQueryError::InResponse { operation: "append", code, message: "bad row".into() };
        assert_eq!(other.problem(Stage::Upload).code, ErrorCode::UploadFailed);
        assert_eq!(other.diagnose(), None, "nothing users can fix: the stage's code");
    }
}
