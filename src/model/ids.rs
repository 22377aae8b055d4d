//! Identifiers of the contract (`../shared/docs/api-v1.md`), parsed once at the edge: a
//! [`RunId`], [`ExecutionId`] or [`ResourceName`] exists only when its text is valid, so
//! everything after the API (SQL, BigQuery names, job ids) can take it as it is. The keys
//! [`ExecutionKey`], [`DeliveryRef`] and [`ResourceRef`] name what the store and the pipeline
//! address. Names that are not newtypes (tables, columns, datasets, projects, locations) are
//! validated by the functions here before they reach SQL or BigQuery.

use std::fmt;
use std::ops::Deref;
use std::str::FromStr;

use serde::Serialize;

use super::staging::RESERVED_PREFIX;
use crate::error::{ErrorCode, Problem};

fn all_chars(s: &str, allowed: impl Fn(char) -> bool) -> bool {
    s.chars().all(allowed)
}

fn invalid(kind: &str, value: &str, rule: &str) -> Problem {
    // Echo at most a bounded prefix of the offending value.
    let shown: String = value.chars().take(80).collect();
    Problem::new(ErrorCode::InvalidIdentifier, format!("{kind} {shown:?} is invalid: {rule}"))
}

/// `[A-Za-z0-9_-]{1,64}`: run and execution ids.
fn is_id(value: &str) -> bool {
    (1..=64).contains(&value.len()) && all_chars(value, |c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

/// A string newtype whose value passed `$valid`; `$kind` names it in problems.
macro_rules! identifier {
    ($(#[$doc:meta])* $name:ident, $kind:literal, $valid:expr, $rule:literal) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, sqlx::Type)]
        #[serde(transparent)]
        #[sqlx(transparent)]
        pub(crate) struct $name(String);

        impl $name {
            /// The identifier, or `invalid_identifier` naming the rule.
            pub(crate) fn parse(value: impl Into<String>) -> Result<Self, Problem> {
                let value = value.into();
                let valid: fn(&str) -> bool = $valid;
                if valid(&value) { Ok(Self(value)) } else { Err(invalid($kind, &value, $rule)) }
            }
        }

        impl FromStr for $name {
            type Err = Problem;

            fn from_str(value: &str) -> Result<Self, Problem> {
                Self::parse(value)
            }
        }

        impl Deref for $name {
            type Target = str;

            fn deref(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl From<$name> for String {
            fn from(id: $name) -> String {
                id.0
            }
        }
    };
}

identifier!(
    /// `run_id`: `[A-Za-z0-9_-]{1,64}`.
    RunId, "run_id", is_id, "use 1 to 64 of A-Z a-z 0-9 _ -"
);
identifier!(
    /// `execution_id`: `[A-Za-z0-9_-]{1,64}`.
    ExecutionId, "execution_id", is_id, "use 1 to 64 of A-Z a-z 0-9 _ -"
);
identifier!(
    /// A resource name: `[A-Za-z0-9_.-]{1,128}`.
    ResourceName,
    "resource",
    |value| (1..=128).contains(&value.len())
        && all_chars(value, |c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-')),
    "use 1 to 128 of A-Z a-z 0-9 _ . -"
);

impl RunId {
    /// A new random id, for runs created without one.
    pub(crate) fn generate() -> Self {
        Self(format!("run_{}", hex::encode(rand::random::<[u8; 12]>())))
    }
}

impl ExecutionId {
    /// A new random id, for executions opened without one.
    pub(crate) fn generate() -> Self {
        Self(format!("exec_{}", hex::encode(rand::random::<[u8; 12]>())))
    }
}

/// One execution of a run.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct ExecutionKey {
    pub(crate) run_id: RunId,
    pub(crate) execution_id: ExecutionId,
}

impl ExecutionKey {
    /// The given delivery of this execution.
    pub(crate) fn delivery(&self, delivery: i32) -> DeliveryRef {
        DeliveryRef { execution: self.clone(), delivery }
    }
}

impl fmt::Display for ExecutionKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "execution {} of run {}", self.execution_id, self.run_id)
    }
}

/// One delivery of an execution: batches, staging streams and checkpoints belong to it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct DeliveryRef {
    pub(crate) execution: ExecutionKey,
    /// 1 for the first POST of the execution, +1 per redelivery.
    pub(crate) delivery: i32,
}

impl DeliveryRef {
    pub(crate) fn run_id(&self) -> &RunId {
        &self.execution.run_id
    }

    pub(crate) fn execution_id(&self) -> &ExecutionId {
        &self.execution.execution_id
    }

    /// One resource's part of this delivery.
    pub(crate) fn resource(&self, resource: ResourceName) -> ResourceRef {
        ResourceRef { delivery: self.clone(), resource }
    }
}

/// One resource within one delivery: its receipts and its staging stream.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct ResourceRef {
    pub(crate) delivery: DeliveryRef,
    pub(crate) resource: ResourceName,
}

/// Table names: `[A-Za-z0-9_]{1,1024}`, and not in the reserved namespace.
pub(crate) fn validate_table_name(value: &str) -> Result<(), Problem> {
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
pub(crate) fn default_table_name(resource: &ResourceName) -> String {
    resource.chars().map(|c| if c.is_ascii_alphanumeric() || c == '_' { c } else { '_' }).collect()
}

/// Column names: `[A-Za-z_][A-Za-z0-9_]{0,299}`; the prefix `_filament_` is reserved.
pub(crate) fn validate_column_name(value: &str) -> Result<(), Problem> {
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
pub(crate) fn validate_dataset_id(value: &str) -> Result<(), Problem> {
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
pub(crate) fn validate_project_id(value: &str) -> Result<(), Problem> {
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
pub(crate) fn validate_location(value: &str) -> Result<(), Problem> {
    let ok = (1..=64).contains(&value.len()) && all_chars(value, |c| c.is_ascii_alphanumeric() || c == '-');
    if ok { Ok(()) } else { Err(invalid("location", value, "use a BigQuery location such as US, EU or europe-west1")) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identifiers_follow_the_contract() {
        assert!(RunId::parse("run-1_A").is_ok());
        assert!(RunId::parse("").is_err());
        assert!(ExecutionId::parse("a".repeat(65)).is_err());
        assert_eq!(RunId::parse("a b").unwrap_err().code, ErrorCode::InvalidIdentifier);
        assert!(RunId::generate().starts_with("run_"));
        assert!(ExecutionId::parse(ExecutionId::generate().to_string()).is_ok());
        let resource: ResourceName = "public.users-v2".parse().unwrap();
        assert!("users;drop".parse::<ResourceName>().is_err());
        assert_eq!(default_table_name(&resource), "public_users_v2");
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
