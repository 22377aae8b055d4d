//! Identifiers of the contract (`openapi/openapi.json`), parsed once at the edge: a
//! [`RunId`], [`ExecutionId`] or [`ResourceName`] exists only when its text is valid, so
//! everything after the API (SQL, BigQuery names, job ids) can take it as it is. The keys
//! [`ExecutionKey`], [`DeliveryRef`] and [`ResourceRef`] name what the store and the pipeline
//! address. Names that are not newtypes (tables, columns, datasets, projects, locations) are
//! validated by the functions here before they reach SQL or BigQuery.

use std::fmt;
use std::ops::Deref;
use std::str::FromStr;

use serde::Serialize;

use crate::error::{ErrorCode, Problem};

/// Prefix reserved for the gateway's own staging columns and tables: no name a client gives
/// may start with it.
pub(crate) const RESERVED_PREFIX: &str = "_filament_";

fn all_chars(s: &str, allowed: impl Fn(char) -> bool) -> bool {
    s.chars().all(allowed)
}

fn invalid(kind: &str, value: &str, rule: &str) -> Problem {
    // Echo at most a bounded prefix of the offending value.
    let shown: String = value.chars().take(80).collect();
    Problem::new(ErrorCode::InvalidIdentifier, format!("{kind} {shown:?} is invalid: {rule}"))
}

/// The longest run or execution id.
pub(crate) const MAX_ID_CHARS: usize = 64;

/// `[A-Za-z0-9_-]{1,64}`: run and execution ids.
fn is_id(value: &str) -> bool {
    (1..=MAX_ID_CHARS).contains(&value.len()) && all_chars(value, |c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
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

/// Prefixes BigQuery reserves for its own columns: "Column names can't use any of the
/// following prefixes: `_TABLE_`, `_FILE_`, `_PARTITION`, `_ROW_TIMESTAMP`, `__ROOT__`,
/// `_COLIDENTIFIER`, `_CHANGE_SEQUENCE_NUMBER`, `_CHANGE_TYPE`, `_CHANGE_TIMESTAMP`"
/// (BigQuery documentation, Specifying a schema, Column names). Compared without regard to
/// case, as BigQuery compares column names ("Duplicate column names are not allowed even if the
/// case differs", same page).
pub(crate) const BIGQUERY_RESERVED_COLUMN_PREFIXES: [&str; 9] = [
    "_TABLE_",
    "_FILE_",
    "_PARTITION",
    "_ROW_TIMESTAMP",
    "__ROOT__",
    "_COLIDENTIFIER",
    "_CHANGE_SEQUENCE_NUMBER",
    "_CHANGE_TYPE",
    "_CHANGE_TIMESTAMP",
];

/// "Column names have a maximum length of 300 characters"
/// (BigQuery documentation, Specifying a schema, Column names).
pub(crate) const MAX_COLUMN_NAME_CHARS: usize = 300;

/// The characters of BigQuery's flexible column names (BigQuery documentation, Specifying a
/// schema, Flexible column names): "any letter in any language" (`\p{L}`), "any numeric
/// character in any language" (`\p{N}`), "any connector punctuation character, including
/// underscores" (`\p{Pc}`), "a hyphen or dash" (`\p{Pd}`), "any mark intended to accompany
/// another character" (`\p{M}`), and the special characters `&`, `%`, `=`, `+`, `:`, `'`, `<`,
/// `>`, `#`, `|` and whitespace (taken here as the space, U+0020: tabs and line breaks are
/// refused). Everything else (`!`, `"`, `$`, `(`, `)`, `*`, `,`, `.`, `/`, `;`, `?`, `@`, `[`,
/// `]`, `\`, `^`, `` ` ``, `{`, `}`, `~`, control characters) is not a column name character.
static FLEXIBLE_NAME_CHARS: std::sync::LazyLock<regex::Regex> = std::sync::LazyLock::new(|| {
    regex::Regex::new(r"^[\p{L}\p{N}\p{Pc}\p{Pd}\p{M}&%=+:'<>#| ]+$").expect("a valid pattern")
});

/// Column names (and STRUCT field names): BigQuery's flexible column names (1 to
/// [`MAX_COLUMN_NAME_CHARS`] characters of [`FLEXIBLE_NAME_CHARS`], a leading digit allowed),
/// none of BigQuery's reserved prefixes, and not the gateway's reserved `_filament_`, all
/// compared without regard to case. Names other than `[A-Za-z_][A-Za-z0-9_]*` are staged under
/// generated names (`Column::staged_name`): the Storage Write API never sees them.
pub(crate) fn validate_column_name(value: &str) -> Result<(), Problem> {
    let length = value.chars().count();
    if length == 0 || length > MAX_COLUMN_NAME_CHARS {
        return Err(invalid("column", value, "have 1 to 300 characters"));
    }
    if !FLEXIBLE_NAME_CHARS.is_match(value) {
        return Err(invalid(
            "column",
            value,
            "hold only letters, marks, numbers, connectors such as _, dashes, spaces and & % = + : ' < > # | \
             (BigQuery's flexible column names)",
        ));
    }
    let folded = case_folded(value);
    let reserved_by_bigquery = |prefix: &&&str| folded.starts_with(&prefix.to_ascii_lowercase());
    if let Some(prefix) = BIGQUERY_RESERVED_COLUMN_PREFIXES.iter().find(reserved_by_bigquery) {
        return Err(invalid("column", value, &format!("BigQuery reserves the prefix {prefix} for its own columns")));
    }
    if folded.starts_with(RESERVED_PREFIX) {
        return Err(invalid("column", value, "the prefix _filament_ is reserved for the gateway"));
    }
    Ok(())
}

/// A name as the reserved prefixes are compared with it: compatibility-normalized (NFKC, so a
/// fullwidth `＿ｆｉｌａｍｅｎｔ＿` or the ligature `ﬁ` is what it looks like), lowercased (Unicode's
/// full mapping), normalized again. Full case folding differs from the full lowercase mapping
/// only where neither gives an ASCII letter of a reserved prefix (`ß`, final sigma, ...).
fn case_folded(value: &str) -> String {
    use unicode_normalization::UnicodeNormalization as _;
    let lowered = value.nfkc().collect::<String>().to_lowercase();
    lowered.nfkc().collect()
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

/// Google Cloud project IDs, which reach job references and SQL. Google's rules
/// (Resource Manager documentation, Creating and managing projects, Before you begin):
/// "Must be 6 to 30 characters in length. Can only contain lowercase letters, numbers, and
/// hyphens. Must start with a letter. Cannot end with a hyphen." Legacy domain-scoped IDs
/// (`example.com:my-project`; BigQuery documentation, Migrating to GoogleSQL)
/// are accepted with a domain of DNS labels (RFC 1035: at most 253 characters, labels of 1 to 63
/// letters, digits and hyphens, neither starting nor ending with a hyphen).
pub(crate) fn validate_project_id(value: &str) -> Result<(), Problem> {
    let (domain, project) = match value.rsplit_once(':') {
        Some((d, p)) => (Some(d), p),
        None => (None, value),
    };
    let project_ok = (6..=30).contains(&project.len())
        && all_chars(project, |c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && project.starts_with(|c: char| c.is_ascii_lowercase())
        && !project.ends_with('-');
    if !project_ok {
        return Err(invalid(
            "project",
            value,
            "use a Google Cloud project ID: 6 to 30 lowercase letters, digits and hyphens, starting with a letter and not ending with a hyphen",
        ));
    }
    if let Some(domain) = domain
        && !is_domain_name(domain)
    {
        return Err(invalid(
            "project",
            value,
            "the domain of a domain-scoped project ID must be a DNS name of at most 253 characters",
        ));
    }
    Ok(())
}

/// A DNS name (RFC 1035): at most 253 characters of dot-separated labels of 1 to 63 letters,
/// digits and hyphens that neither start nor end with a hyphen.
fn is_domain_name(domain: &str) -> bool {
    let label_ok = |label: &str| {
        (1..=63).contains(&label.len())
            && all_chars(label, |c| c.is_ascii_alphanumeric() || c == '-')
            && !label.starts_with('-')
            && !label.ends_with('-')
    };
    (1..=253).contains(&domain.len()) && domain.split('.').all(label_ok)
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
        for lookalike in
            ["\u{FF3F}\u{FF46}ilament_x", "_\u{FB01}lament_x", "_FILAMENT_x", "_\u{FF26}ILAMENT_x", "\u{FF3F}table_x"]
        {
            assert!(validate_column_name(lookalike).is_err(), "{lookalike} folds to a reserved prefix");
        }
        assert!(validate_column_name("_fil\u{00E1}ment_x").is_ok(), "an accented letter is another letter");
        assert!(validate_column_name("_id").is_ok());
        for flexible in [
            "1abc",
            "a-b",
            "first name",
            "Größe",
            "revenue-2024",
            "a&b",
            "x%=+:'<>#|y",
            "名前",
            "é".repeat(300).as_str(),
        ] {
            assert!(validate_column_name(flexible).is_ok(), "{flexible}");
        }
        for forbidden in [
            "", "a.b", "a!b", "a\"b", "a$b", "(a)", "a*b", "a,b", "a/b", "a;b", "a?b", "a@b", "[a]", "a\\b", "a^b",
            "a`b", "{a}", "a~b", "a\tb", "a\nb",
        ] {
            assert!(validate_column_name(forbidden).is_err(), "{forbidden:?}");
        }
        assert!(validate_column_name(&"é".repeat(301)).is_err(), "301 characters");
        assert!(validate_column_name("_FILAMENT_seq").is_err());
        assert!(validate_column_name("_partitiontime x").is_err(), "BigQuery's reserved prefixes, any case");
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
    fn project_ids_follow_googles_rules() {
        assert!(validate_project_id("my-project-123").is_ok());
        assert!(validate_project_id("example.com:my-project").is_ok());
        assert!(validate_project_id(&format!("a{}", "b".repeat(29))).is_ok(), "30 characters");
        for bad in ["My Project", "p`x", "demo", "a", "abcde", "my-project-", "1project", &"a".repeat(31)] {
            assert!(validate_project_id(bad).is_err(), "{bad:?}");
        }
        let long_domain = format!("{}.com:my-project", "a".repeat(10_000));
        for bad in [long_domain.as_str(), ":my-project", "-x.com:my-project", "a..b:my-project", "a b:my-project"] {
            assert!(validate_project_id(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn bigquery_reserved_column_prefixes_are_refused_in_any_case() {
        for reserved in [
            "_PARTITIONTIME",
            "_partitiondate",
            "_TABLE_SUFFIX",
            "_File_name",
            "_ROW_TIMESTAMP",
            "__root__x",
            "_COLIDENTIFIER1",
            "_change_type",
            "_CHANGE_SEQUENCE_NUMBER",
            "_change_timestamp",
        ] {
            let problem = validate_column_name(reserved).unwrap_err();
            assert!(problem.detail.contains("BigQuery reserves the prefix"), "{reserved}: {}", problem.detail);
        }
        for fine in ["partition_time", "_table", "_filex", "table_", "_root_"] {
            assert!(validate_column_name(fine).is_ok(), "{fine}");
        }
        assert!(validate_column_name(&"a".repeat(300)).is_ok());
        assert!(validate_column_name(&"a".repeat(301)).is_err());
    }
}
