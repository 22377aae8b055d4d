//! Identifiers, write modes and states shared by every stage, with the validation rules of the
//! contract (`../shared/docs/api-v1.md`). Anything that reaches SQL or a BigQuery name passes
//! through one of the validated newtypes here first.

use std::fmt;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::error::{ErrorCode, Problem};

/// Prefix reserved for the gateway's own staging columns and tables.
pub const RESERVED_PREFIX: &str = "_filament_";

fn all_chars(s: &str, allowed: impl Fn(char) -> bool) -> bool {
    s.chars().all(allowed)
}

fn invalid(kind: &str, value: &str, rule: &str) -> Problem {
    // Echo at most a bounded prefix of the offending value.
    let shown: String = value.chars().take(80).collect();
    Problem::new(ErrorCode::InvalidIdentifier, format!("{kind} {shown:?} is invalid: {rule}"))
}

/// `run_id` / `execution_id`: `[A-Za-z0-9_-]{1,64}`.
pub fn validate_id(kind: &str, value: &str) -> Result<(), Problem> {
    let ok = (1..=64).contains(&value.len()) && all_chars(value, |c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if ok { Ok(()) } else { Err(invalid(kind, value, "use 1 to 64 of A-Z a-z 0-9 _ -")) }
}

/// Resource names: `[A-Za-z0-9_.-]{1,128}`.
pub fn validate_resource_name(value: &str) -> Result<(), Problem> {
    let ok = (1..=128).contains(&value.len())
        && all_chars(value, |c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'));
    if ok { Ok(()) } else { Err(invalid("resource", value, "use 1 to 128 of A-Z a-z 0-9 _ . -")) }
}

/// Table names: `[A-Za-z0-9_]{1,1024}`, and not in the reserved namespace.
pub fn validate_table_name(value: &str) -> Result<(), Problem> {
    let ok = (1..=1024).contains(&value.len()) && all_chars(value, |c| c.is_ascii_alphanumeric() || c == '_');
    if !ok {
        return Err(invalid("table", value, "use 1 to 1024 of A-Z a-z 0-9 _"));
    }
    if value.to_ascii_lowercase().starts_with(RESERVED_PREFIX) {
        return Err(invalid("table", value, "the prefix _filament_ is reserved"));
    }
    Ok(())
}

/// The default table of a resource: its name with every other character replaced by `_`.
pub fn default_table_name(resource: &str) -> String {
    resource.chars().map(|c| if c.is_ascii_alphanumeric() || c == '_' { c } else { '_' }).collect()
}

/// Column names: `[A-Za-z_][A-Za-z0-9_]{0,299}`; the prefix `_filament_` is reserved.
pub fn validate_column_name(value: &str) -> Result<(), Problem> {
    let mut chars = value.chars();
    let first_ok = chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
    let ok = first_ok && value.len() <= 300 && chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
    if !ok {
        return Err(invalid("column", value, "start with a letter or _, then up to 299 of A-Z a-z 0-9 _"));
    }
    if value.to_ascii_lowercase().starts_with(RESERVED_PREFIX) {
        return Err(invalid("column", value, "the prefix _filament_ is reserved for the gateway"));
    }
    Ok(())
}

/// BigQuery dataset IDs: letters, digits and underscores, at most 1,024 characters.
pub fn validate_dataset_id(value: &str) -> Result<(), Problem> {
    let ok = (1..=1024).contains(&value.len()) && all_chars(value, |c| c.is_ascii_alphanumeric() || c == '_');
    if ok {
        Ok(())
    } else {
        let shown: String = value.chars().take(80).collect();
        Err(Problem::new(ErrorCode::InvalidDatasetId, format!("dataset ID {shown:?} is invalid"))
            .with_hint("Dataset IDs allow only letters, numbers, and underscores (no hyphens or dots)."))
    }
}

/// Google Cloud project IDs (6-30 of lowercase letters, digits, hyphens; legacy domain-scoped
/// IDs `example.com:proj` are also accepted). Validated because they reach job references and SQL.
pub fn validate_project_id(value: &str) -> Result<(), Problem> {
    let (domain, project) = match value.rsplit_once(':') {
        Some((d, p)) => (Some(d), p),
        None => (None, value),
    };
    let project_ok = (1..=63).contains(&project.len())
        && all_chars(project, |c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && project.starts_with(|c: char| c.is_ascii_lowercase());
    let domain_ok =
        domain.is_none_or(|d| !d.is_empty() && all_chars(d, |c| c.is_ascii_alphanumeric() || c == '.' || c == '-'));
    if project_ok && domain_ok {
        Ok(())
    } else {
        Err(invalid("project", value, "use a Google Cloud project ID (lowercase letters, digits, hyphens)"))
    }
}

/// BigQuery locations (`US`, `EU`, `europe-west1`, ...).
pub fn validate_location(value: &str) -> Result<(), Problem> {
    let ok = (1..=64).contains(&value.len()) && all_chars(value, |c| c.is_ascii_alphanumeric() || c == '-');
    if ok { Ok(()) } else { Err(invalid("location", value, "use a BigQuery location such as US, EU or europe-west1")) }
}

/// How a resource's rows reach its destination table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema, sqlx::Type)]
#[serde(rename_all = "snake_case")]
#[sqlx(type_name = "text", rename_all = "snake_case")]
pub enum WriteMode {
    FullReplace,
    FullAppend,
    FullUpsert,
    IncrementalAppend,
    IncrementalUpsert,
    IncrementalDelete,
    CdcAppend,
    CdcMerge,
}

impl WriteMode {
    pub fn as_str(self) -> &'static str {
        match self {
            WriteMode::FullReplace => "full_replace",
            WriteMode::FullAppend => "full_append",
            WriteMode::FullUpsert => "full_upsert",
            WriteMode::IncrementalAppend => "incremental_append",
            WriteMode::IncrementalUpsert => "incremental_upsert",
            WriteMode::IncrementalDelete => "incremental_delete",
            WriteMode::CdcAppend => "cdc_append",
            WriteMode::CdcMerge => "cdc_merge",
        }
    }

    /// Modes published with a MERGE keyed on the primary key (which they need), folding each
    /// key to its last operation by the staged `_filament_seq`.
    pub fn is_merge(self) -> bool {
        matches!(
            self,
            WriteMode::FullUpsert | WriteMode::IncrementalUpsert | WriteMode::IncrementalDelete | WriteMode::CdcMerge
        )
    }

    /// Modes that need a primary key.
    pub fn requires_primary_key(self) -> bool {
        self.is_merge()
    }
}

impl fmt::Display for WriteMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Lifecycle of an execution: `extracting -> paused -> committing -> committed | failed`;
/// `aborted` from any non-terminal state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema, sqlx::Type)]
#[serde(rename_all = "snake_case")]
#[sqlx(type_name = "text", rename_all = "snake_case")]
pub enum ExecutionState {
    Extracting,
    Paused,
    Committing,
    Committed,
    Failed,
    Aborted,
}

impl ExecutionState {
    pub fn is_terminal(self) -> bool {
        matches!(self, ExecutionState::Committed | ExecutionState::Failed | ExecutionState::Aborted)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            ExecutionState::Extracting => "extracting",
            ExecutionState::Paused => "paused",
            ExecutionState::Committing => "committing",
            ExecutionState::Committed => "committed",
            ExecutionState::Failed => "failed",
            ExecutionState::Aborted => "aborted",
        }
    }
}

impl fmt::Display for ExecutionState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// State of one destination table's publication query job.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema, sqlx::Type)]
#[serde(rename_all = "snake_case")]
#[sqlx(type_name = "text", rename_all = "snake_case")]
pub enum PublicationState {
    Running,
    Done,
    Failed,
}

/// Where a run loads: one BigQuery dataset.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Destination {
    /// Google Cloud project ID.
    #[schema(example = "my-project")]
    pub project: String,
    /// BigQuery dataset ID (letters, digits, underscores); created when missing.
    #[schema(example = "raw_filament")]
    pub dataset: String,
    /// Dataset location (for example `US`, `EU`); empty or absent lets BigQuery decide.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub location: Option<String>,
}

impl Destination {
    pub fn validate(&self) -> Result<(), Problem> {
        validate_project_id(&self.project)?;
        validate_dataset_id(&self.dataset)?;
        if let Some(location) = self.location.as_deref().filter(|l| !l.is_empty()) {
            validate_location(location)?;
        }
        Ok(())
    }

    /// The location, treating an empty string as absent.
    pub fn location(&self) -> Option<&str> {
        self.location.as_deref().filter(|l| !l.is_empty())
    }
}

/// Per-run overrides of the upload batching policy.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Batching {
    /// Rows per upload batch (default 20,000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1, maximum = 1_000_000)]
    pub max_rows: Option<u64>,
    /// Encoded bytes per upload batch (default about 8 MiB).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1024, maximum = 9_437_184)]
    pub max_bytes: Option<u64>,
    /// Flush interval in milliseconds (default 10,000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 10, maximum = 3_600_000)]
    pub flush_interval_ms: Option<u64>,
}

impl Batching {
    pub fn validate(&self) -> Result<(), Problem> {
        let check = |name: &str, value: Option<u64>, min: u64, max: u64| match value {
            Some(v) if !(min..=max).contains(&v) => {
                Err(Problem::invalid_request(format!("batching.{name} must be between {min} and {max}")))
            }
            _ => Ok(()),
        };
        check("max_rows", self.max_rows, 1, 1_000_000)?;
        check("max_bytes", self.max_bytes, 1024, 9 * 1024 * 1024)?;
        check("flush_interval_ms", self.flush_interval_ms, 10, 3_600_000)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identifiers_follow_the_contract() {
        assert!(validate_id("run_id", "run-1_A").is_ok());
        assert!(validate_id("run_id", "").is_err());
        assert!(validate_id("run_id", &"a".repeat(65)).is_err());
        assert!(validate_id("run_id", "a b").is_err());
        assert!(validate_resource_name("public.users-v2").is_ok());
        assert!(validate_resource_name("users;drop").is_err());
        assert_eq!(default_table_name("public.users-v2"), "public_users_v2");
        assert!(validate_table_name("users`; DROP").is_err());
        assert!(validate_table_name("_filament_x").is_err());
        assert!(validate_column_name("_id").is_ok());
        assert!(validate_column_name("1abc").is_err());
        assert!(validate_column_name("_FILAMENT_seq").is_err());
        assert!(validate_column_name("a-b").is_err());
    }

    #[test]
    fn dataset_ids_reject_hyphens_and_dots_with_a_hint() {
        assert!(validate_dataset_id("raw_data_1").is_ok());
        for bad in ["raw-data", "raw.data", ""] {
            let problem = validate_dataset_id(bad).unwrap_err();
            assert_eq!(problem.code, ErrorCode::InvalidDatasetId);
            assert!(problem.hint.unwrap().contains("letters, numbers, and underscores"));
        }
    }

    #[test]
    fn project_ids() {
        assert!(validate_project_id("my-project-123").is_ok());
        assert!(validate_project_id("example.com:my-project").is_ok());
        assert!(validate_project_id("My Project").is_err());
        assert!(validate_project_id("p`x").is_err());
    }
}
