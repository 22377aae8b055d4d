//! The layout a resource declares for its destination table (`table_options` on PUT resource):
//! partitioning, clustering, the partition filter requirement, expiration, description and
//! labels. The wire form ([`TableOptionsDeclaration`]) is parsed once into [`TableOptions`]
//! (every rule that needs no column types; `invalid_partitioning`, `invalid_clustering`,
//! `invalid_table_labels`, `invalid_table_options`), stored with the resource, and resolved
//! against the batch schema into a [`super::table_layout::TableLayout`] (column types, the keyed
//! modes' default clustering, column descriptions from Arrow field metadata) that
//! `bigquery::metadata` applies when the gateway creates the table.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::WriteMode;
use super::ids::validate_column_name;
use super::request_bounds::{
    EXPIRATION_DAYS, MAX_CLUSTERING_COLUMNS, MAX_LABELS, MAX_TABLE_DESCRIPTION_CHARS, RANGE_INTERVAL,
};
use crate::error::{ErrorCode, Problem};

/// BigQuery's limit on the characters of a label key or value.
pub(crate) const MAX_LABEL_CHARS: usize = 63;
/// BigQuery's limit on partitions of an integer-range partitioned table.
pub(crate) const MAX_RANGE_PARTITIONS: i64 = 10_000;
/// BigQuery's limit on a column description, in characters.
pub(crate) const MAX_COLUMN_DESCRIPTION_CHARS: usize = 1_024;

/// `table_options` of a resource declaration, as sent and as shown.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct TableOptionsDeclaration {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) partitioning: Option<PartitioningDeclaration>,
    /// Up to `maxItems` top-level columns of a clusterable type (INT64, STRING, BOOL, DATE, DATETIME,
    /// TIMESTAMP, NUMERIC, BIGNUMERIC). Absent in a keyed mode: the primary key's first clusterable
    /// columns, as many as allowed. `[]`: no clustering.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) clustering: Option<Vec<String>>,
    /// Queries must filter on the partitioning column (needs `partitioning`; in a MERGE mode the
    /// partitioning field must be a primary-key column, so the MERGE's key range filters it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) require_partition_filter: Option<bool>,
    /// The table expires this many days after the gateway creates it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) expiration_days: Option<i64>,
    /// Table description (at most `maxLength` characters).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) description: Option<String>,
    /// Table labels: at most `maxProperties`; keys 1-63 characters of lowercase letters, digits, `_` and `-`,
    /// starting with a letter; values 0-63 of the same characters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) labels: Option<BTreeMap<String, String>>,
}

/// `{"field", "granularity"}` (time-unit column), `{"granularity"}` (ingestion time) or
/// `{"field", "range"}` (integer range on an INT64 column).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct PartitioningDeclaration {
    /// A DATE, DATETIME or TIMESTAMP column (with `granularity`) or an INT64 column (with `range`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) field: Option<String>,
    /// `HOUR`, `DAY`, `MONTH` or `YEAR` (DATE columns: not `HOUR`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(pattern = "^(HOUR|DAY|MONTH|YEAR)$", example = "DAY")]
    pub(crate) granularity: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) range: Option<IntegerRange>,
}

/// Integer-range partitions: `[start, end)` cut every `interval` (at most 10,000 partitions).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct IntegerRange {
    pub(crate) start: i64,
    pub(crate) end: i64,
    pub(crate) interval: i64,
}

/// A time-unit partition granularity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Granularity {
    Hour,
    Day,
    Month,
    Year,
}

impl Granularity {
    fn parse(value: &str) -> Result<Self, Problem> {
        match value {
            "HOUR" => Ok(Granularity::Hour),
            "DAY" => Ok(Granularity::Day),
            "MONTH" => Ok(Granularity::Month),
            "YEAR" => Ok(Granularity::Year),
            other => Err(invalid_partitioning(format!(
                "granularity {:?} is not one of HOUR, DAY, MONTH, YEAR",
                shown(other)
            ))),
        }
    }

    /// The `timePartitioning.type` BigQuery takes and reports.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Granularity::Hour => "HOUR",
            Granularity::Day => "DAY",
            Granularity::Month => "MONTH",
            Granularity::Year => "YEAR",
        }
    }
}

/// How the destination table is partitioned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Partitioning {
    /// By a DATE, DATETIME or TIMESTAMP column.
    TimeUnitColumn { field: String, granularity: Granularity },
    /// By the load time (`_PARTITIONTIME`).
    IngestionTime { granularity: Granularity },
    /// By an INT64 column.
    IntegerRange { field: String, range: IntegerRange },
}

impl Partitioning {
    fn parse(declared: &PartitioningDeclaration) -> Result<Self, Problem> {
        if let Some(field) = &declared.field {
            validate_column_name(field).map_err(|p| invalid_partitioning(p.detail))?;
        }
        match (&declared.field, &declared.granularity, declared.range) {
            (_, Some(_), Some(_)) => Err(invalid_partitioning("give either granularity or range, not both")),
            (None, None, _) => {
                Err(invalid_partitioning("give a granularity (time-unit or ingestion time) or a field and a range"))
            }
            (None, Some(granularity), None) => {
                Ok(Partitioning::IngestionTime { granularity: Granularity::parse(granularity)? })
            }
            (Some(field), Some(granularity), None) => {
                Ok(Partitioning::TimeUnitColumn { field: field.clone(), granularity: Granularity::parse(granularity)? })
            }
            (Some(field), None, Some(range)) => {
                Ok(Partitioning::IntegerRange { field: field.clone(), range: check_range(range)? })
            }
            (Some(_), None, None) => Err(invalid_partitioning("a partitioning field needs a granularity or a range")),
        }
    }

    /// The partitioning column, when the table is partitioned by one.
    pub(crate) fn field(&self) -> Option<&str> {
        match self {
            Partitioning::TimeUnitColumn { field, .. } | Partitioning::IntegerRange { field, .. } => Some(field),
            Partitioning::IngestionTime { .. } => None,
        }
    }

    fn declaration(&self) -> PartitioningDeclaration {
        let (field, granularity, range) = match self {
            Partitioning::TimeUnitColumn { field, granularity } => (Some(field.clone()), Some(*granularity), None),
            Partitioning::IngestionTime { granularity } => (None, Some(*granularity), None),
            Partitioning::IntegerRange { field, range } => (Some(field.clone()), None, Some(*range)),
        };
        PartitioningDeclaration { field, granularity: granularity.map(|g| g.as_str().to_string()), range }
    }

    /// How messages show it: `DAY on created_at`, `DAY by ingestion time`, `range [0, 100) by 10 on id`.
    pub(crate) fn describe(&self) -> String {
        match self {
            Partitioning::TimeUnitColumn { field, granularity } => format!("{} on {field}", granularity.as_str()),
            Partitioning::IngestionTime { granularity } => format!("{} by ingestion time", granularity.as_str()),
            Partitioning::IntegerRange { field, range } => {
                format!("range [{}, {}) by {} on {field}", range.start, range.end, range.interval)
            }
        }
    }

    /// The same field with the column's spelling (BigQuery names are case-insensitive).
    pub(super) fn with_field(&self, spelled: &str) -> Partitioning {
        match self {
            Partitioning::TimeUnitColumn { granularity, .. } => {
                Partitioning::TimeUnitColumn { field: spelled.to_string(), granularity: *granularity }
            }
            Partitioning::IntegerRange { range, .. } => {
                Partitioning::IntegerRange { field: spelled.to_string(), range: *range }
            }
            ingestion @ Partitioning::IngestionTime { .. } => ingestion.clone(),
        }
    }
}

fn check_range(range: IntegerRange) -> Result<IntegerRange, Problem> {
    if !RANGE_INTERVAL.contains(range.interval) {
        return Err(invalid_partitioning(format!(
            "range interval {} must be {}",
            range.interval,
            RANGE_INTERVAL.describe()
        )));
    }
    if range.start >= range.end {
        return Err(invalid_partitioning(format!("range start {} must be below end {}", range.start, range.end)));
    }
    let span = i128::from(range.end) - i128::from(range.start);
    let interval = i128::from(range.interval);
    let partitions = (span + interval - 1) / interval;
    if partitions > i128::from(MAX_RANGE_PARTITIONS) {
        return Err(invalid_partitioning(format!(
            "range [{}, {}) by {} makes {partitions} partitions; BigQuery allows at most {MAX_RANGE_PARTITIONS}",
            range.start, range.end, range.interval
        )));
    }
    Ok(range)
}

/// The parsed `table_options` of a resource. `None` fields were not declared.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "TableOptionsDeclaration", into = "TableOptionsDeclaration")]
pub(crate) struct TableOptions {
    pub(crate) partitioning: Option<Partitioning>,
    /// `Some(vec![])`: explicitly none (no default clustering either).
    pub(crate) clustering: Option<Vec<String>>,
    pub(crate) require_partition_filter: Option<bool>,
    pub(crate) expiration_days: Option<i64>,
    pub(crate) description: Option<String>,
    pub(crate) labels: BTreeMap<String, String>,
}

impl TableOptions {
    /// Every rule that needs no column types. `write_mode` and `primary_key` are the
    /// declaration's (already validated).
    pub(crate) fn parse(
        declared: &TableOptionsDeclaration,
        write_mode: WriteMode,
        primary_key: &[String],
    ) -> Result<Self, Problem> {
        let options = Self::try_from(declared.clone())?;
        if options.require_partition_filter == Some(true) && write_mode.is_merge() {
            let field = options.partitioning.as_ref().and_then(Partitioning::field);
            if !field.is_some_and(|f| primary_key.iter().any(|k| k.eq_ignore_ascii_case(f))) {
                return Err(invalid_table_options(format!(
                    "require_partition_filter in write mode {write_mode} needs partitioning on a primary-key \
                     column: the publication's MERGE filters the destination by its key range only"
                )));
            }
        }
        Ok(options)
    }
}

impl TryFrom<TableOptionsDeclaration> for TableOptions {
    type Error = Problem;

    fn try_from(declared: TableOptionsDeclaration) -> Result<Self, Problem> {
        let partitioning = declared.partitioning.as_ref().map(Partitioning::parse).transpose()?;
        if let Some(clustering) = &declared.clustering {
            check_clustering_names(clustering)?;
        }
        if declared.require_partition_filter == Some(true) && partitioning.is_none() {
            return Err(invalid_table_options("require_partition_filter needs partitioning"));
        }
        if let Some(days) = declared.expiration_days
            && !EXPIRATION_DAYS.contains(days)
        {
            return Err(invalid_table_options(format!(
                "expiration_days {days} must be {}",
                EXPIRATION_DAYS.describe()
            )));
        }
        if let Some(description) = &declared.description {
            let chars = description.chars().count();
            if chars > MAX_TABLE_DESCRIPTION_CHARS {
                return Err(invalid_table_options(format!(
                    "description has {chars} characters; BigQuery allows at most {MAX_TABLE_DESCRIPTION_CHARS}"
                )));
            }
        }
        let labels = declared.labels.unwrap_or_default();
        check_labels(&labels)?;
        Ok(Self {
            partitioning,
            clustering: declared.clustering,
            require_partition_filter: declared.require_partition_filter,
            expiration_days: declared.expiration_days,
            description: declared.description,
            labels,
        })
    }
}

impl From<TableOptions> for TableOptionsDeclaration {
    fn from(options: TableOptions) -> Self {
        Self {
            partitioning: options.partitioning.as_ref().map(Partitioning::declaration),
            clustering: options.clustering,
            require_partition_filter: options.require_partition_filter,
            expiration_days: options.expiration_days,
            description: options.description,
            labels: (!options.labels.is_empty()).then_some(options.labels),
        }
    }
}

fn check_clustering_names(clustering: &[String]) -> Result<(), Problem> {
    if clustering.len() > MAX_CLUSTERING_COLUMNS {
        return Err(invalid_clustering(format!(
            "{} clustering columns; BigQuery allows at most {MAX_CLUSTERING_COLUMNS}",
            clustering.len()
        )));
    }
    for (i, column) in clustering.iter().enumerate() {
        validate_column_name(column).map_err(|p| invalid_clustering(p.detail))?;
        if clustering[..i].iter().any(|c| c.eq_ignore_ascii_case(column)) {
            return Err(invalid_clustering(format!("clustering column {column:?} appears twice")));
        }
    }
    Ok(())
}

/// BigQuery's label rules: keys 1-63 characters of lowercase letters, digits, `_` and `-`,
/// starting with a lowercase letter; values 0-63 of the same characters; at most 64 labels.
/// (BigQuery allows international lowercase letters too.)
pub(crate) fn check_labels(labels: &BTreeMap<String, String>) -> Result<(), Problem> {
    if labels.len() > MAX_LABELS {
        return Err(invalid_labels(format!("{} labels; BigQuery allows at most {MAX_LABELS}", labels.len())));
    }
    let allowed = |c: char| c.is_lowercase() || c.is_ascii_digit() || c == '_' || c == '-';
    for (key, value) in labels {
        let key_ok = key.chars().next().is_some_and(char::is_lowercase)
            && key.chars().count() <= MAX_LABEL_CHARS
            && key.chars().all(allowed);
        if !key_ok {
            return Err(invalid_labels(format!(
                "label key {:?} must be 1-{MAX_LABEL_CHARS} lowercase letters, digits, _ or -, starting with a letter",
                shown(key)
            )));
        }
        if value.chars().count() > MAX_LABEL_CHARS || !value.chars().all(allowed) {
            return Err(invalid_labels(format!(
                "value of label {key:?} must be 0-{MAX_LABEL_CHARS} lowercase letters, digits, _ or -"
            )));
        }
    }
    Ok(())
}

fn shown(value: &str) -> String {
    value.chars().take(80).collect()
}

pub(super) fn invalid_partitioning(detail: impl Into<String>) -> Problem {
    Problem::new(ErrorCode::InvalidPartitioning, format!("table_options.partitioning: {}", detail.into()))
}

pub(super) fn invalid_clustering(detail: impl Into<String>) -> Problem {
    Problem::new(ErrorCode::InvalidClustering, format!("table_options.clustering: {}", detail.into()))
}

pub(super) fn invalid_labels(detail: impl Into<String>) -> Problem {
    Problem::new(ErrorCode::InvalidTableLabels, format!("table_options.labels: {}", detail.into()))
}

pub(super) fn invalid_table_options(detail: impl Into<String>) -> Problem {
    Problem::new(ErrorCode::InvalidTableOptions, format!("table_options: {}", detail.into()))
}

#[cfg(test)]
mod tests;
