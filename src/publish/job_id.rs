//! Deterministic publication job ids: the same run, execution, destination and write mode
//! always produce the same id, so a redelivered execution finds its earlier job (BigQuery answers
//! 409 for an existing id) instead of publishing twice.

use sha2::{Digest as _, Sha256};

use crate::model::DeliveryRef;
use crate::store::ResourceRecord;

/// BigQuery's limit on job id length.
const MAX_JOB_ID_LEN: usize = 1024;
/// Room kept for the attempt suffix (`-a2`, ..., `-a99`).
const ATTEMPT_SUFFIX_LEN: usize = 4;

fn sanitize(part: &str) -> String {
    part.chars().map(|c| if c.is_ascii_alphanumeric() || c == '_' || c == '-' { c } else { '_' }).collect()
}

/// `filament_{run}_{execution}_{dataset}_{table}_{mode}_{hash}`, in BigQuery's job-id alphabet.
/// The short hash of the unsanitised parts, and of the resource (two resources may publish
/// into one table with one mode), keeps ids distinct when sanitising or truncating would make
/// two of them equal.
pub(crate) fn publication_job_id(delivery: &DeliveryRef, resource: &ResourceRecord, dataset: &str) -> String {
    let (run_id, execution_id) = (delivery.run_id(), delivery.execution_id());
    let (table, write_mode, resource) = (&resource.table_name, resource.write_mode, &resource.resource);
    let digest =
        Sha256::digest(format!("{run_id}\n{execution_id}\n{resource}\n{dataset}\n{table}\n{write_mode}").as_bytes());
    let hash = &hex::encode(digest)[..12];
    let readable = sanitize(&format!("filament_{run_id}_{execution_id}_{dataset}_{table}_{write_mode}"));
    let budget = MAX_JOB_ID_LEN - ATTEMPT_SUFFIX_LEN - hash.len() - 1;
    let readable: String = readable.chars().take(budget).collect();
    format!("{readable}_{hash}")
}

/// The job id of attempt `attempt` (1-based) of a publication: the deterministic id, then
/// `-a2`, `-a3`, ... for retries after a transient failure (a failed job can never run again
/// under its id). A redelivery walks the same sequence, so it recognises every attempt.
pub(crate) fn attempt_job_id(base: &str, attempt: u32) -> String {
    if attempt <= 1 { base.to_string() } else { format!("{base}-a{attempt}") }
}

/// BigQuery label values: lowercase letters, digits, `_` and `-`, at most 63 characters.
fn label_value(part: &str) -> String {
    part.chars()
        .map(|c| if c.is_ascii_alphanumeric() || c == '_' || c == '-' { c.to_ascii_lowercase() } else { '_' })
        .take(63)
        .collect()
}

/// The label of a publication job carrying its trace id (`crate::traces`), when traces are on.
pub(crate) const TRACE_LABEL: &str = "filament_trace_id";

/// The labels of a publication job, so users find it in `INFORMATION_SCHEMA.JOBS` and billing
/// exports: `filament_run`, `filament_execution`, `filament_resource`.
pub(crate) fn publication_labels(delivery: &DeliveryRef, resource: &str) -> Vec<(&'static str, String)> {
    vec![
        ("filament_run", label_value(delivery.run_id())),
        ("filament_execution", label_value(delivery.execution_id())),
        ("filament_resource", label_value(resource)),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::model::{ExecutionId, ExecutionKey, RunId, WriteMode};

    fn delivery(run: &str, execution: &str) -> DeliveryRef {
        ExecutionKey { run_id: RunId::parse(run).unwrap(), execution_id: ExecutionId::parse(execution).unwrap() }
            .delivery(1)
    }

    fn resource(name: &str, table: &str, write_mode: WriteMode) -> ResourceRecord {
        ResourceRecord {
            resource: name.parse().unwrap(),
            table_name: table.into(),
            write_mode,
            primary_key: vec![],
            table_options: None,
            write_options: Default::default(),
            layout_mismatch: None,
        }
    }

    #[test]
    fn job_ids_are_deterministic_valid_and_distinct() {
        let users = resource("users", "users", WriteMode::FullAppend);
        let a = publication_job_id(&delivery("run-1", "exec-1"), &users, "raw");
        assert_eq!(a, publication_job_id(&delivery("run-1", "exec-1"), &users, "raw"));
        assert!(a.starts_with("filament_run-1_exec-1_raw_users_full_append_"));
        assert_ne!(a, publication_job_id(&delivery("run-1", "exec-2"), &users, "raw"));
        let incremental = resource("users", "users", WriteMode::IncrementalAppend);
        assert_ne!(a, publication_job_id(&delivery("run-1", "exec-1"), &incremental, "raw"));
        let other = resource("users_2", "users", WriteMode::FullAppend);
        assert_ne!(a, publication_job_id(&delivery("run-1", "exec-1"), &other, "raw"));
        let longest = resource(&"x".repeat(128), &"t".repeat(1024), WriteMode::CdcMerge);
        let long = publication_job_id(&delivery(&"r".repeat(64), &"e".repeat(64)), &longest, &"d".repeat(1024));
        assert!(attempt_job_id(&long, 99).len() <= MAX_JOB_ID_LEN);
        let labels = publication_labels(&delivery("Run-1", &"E".repeat(64)), "public.Users");
        assert_eq!(labels[0], ("filament_run", "run-1".to_string()));
        assert_eq!(labels[1].1.len(), 63);
        assert_eq!(labels[2].1, "public_users");
        assert_eq!(attempt_job_id(&a, 1), a);
        assert_eq!(attempt_job_id(&a, 2), format!("{a}-a2"));
        assert!(long.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-'));
    }
}
