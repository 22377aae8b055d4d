//! What the gateway applies when it creates a destination table: a resource's declared
//! [`TableOptions`] resolved against the columns of its first batch ([`TableLayout`]: column
//! types checked, the keyed modes' default clustering, column descriptions from Arrow field
//! metadata), and how an existing table's layout differs from the declaration
//! ([`LayoutDifference`]; an existing table is never re-laid out).

use std::collections::BTreeMap;

use arrow_schema::{DataType, Fields};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::WriteMode;
use super::columns::{BigQueryType, Column};
use super::request_bounds::MAX_CLUSTERING_COLUMNS;
use super::table_options::{
    Granularity, MAX_COLUMN_DESCRIPTION_CHARS, Partitioning, TableOptions, invalid_clustering, invalid_partitioning,
};
use crate::error::{ErrorCode, Problem};

/// Arrow field metadata key whose value becomes the column's description.
pub(crate) const DESCRIPTION_METADATA_KEY: &str = "description";

/// The columns to cluster by when the table is created: the declared ones, or in a keyed mode
/// the primary key's first (up to 4) clusterable columns.
fn clustering_for(
    options: &TableOptions,
    write_mode: WriteMode,
    primary_key: &[String],
    columns: &[Column],
) -> Vec<String> {
    if let Some(declared) = &options.clustering {
        return declared.clone();
    }
    if !write_mode.is_merge() {
        return Vec::new();
    }
    primary_key
        .iter()
        .filter_map(|key| find_column(columns, key))
        .filter(|column| is_clusterable(column))
        .map(|column| column.name.clone())
        .take(MAX_CLUSTERING_COLUMNS)
        .collect()
}

/// What the gateway applies when it creates the destination table: the declared options
/// checked against the batch's columns, with the column spellings of the schema.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct TableLayout {
    pub(crate) partitioning: Option<Partitioning>,
    pub(crate) clustering: Vec<String>,
    pub(crate) require_partition_filter: bool,
    pub(crate) expiration_days: Option<i64>,
    pub(crate) description: Option<String>,
    pub(crate) labels: BTreeMap<String, String>,
    pub(crate) column_descriptions: ColumnDescriptions,
    /// The options as declared (explicitly), what an existing table is compared with.
    pub(crate) declared: Option<TableOptions>,
}

impl TableLayout {
    /// Resolves the declared options against the destination columns of a batch and takes the
    /// column descriptions from its Arrow fields (`invalid_partitioning`, `invalid_clustering`,
    /// `invalid_table_options` when a column does not fit).
    pub(crate) fn resolve(
        declared: Option<&TableOptions>,
        write_mode: WriteMode,
        primary_key: &[String],
        columns: &[Column],
        arrow_fields: &Fields,
    ) -> Result<Self, Problem> {
        let options = declared.cloned().unwrap_or_default();
        let partitioning = match &options.partitioning {
            Some(partitioning) => Some(check_partition_column(partitioning, columns)?),
            None => None,
        };
        let mut clustering = Vec::new();
        for name in clustering_for(&options, write_mode, primary_key, columns) {
            clustering.push(check_clustering_column(&name, columns)?);
        }
        Ok(Self {
            partitioning,
            clustering,
            require_partition_filter: options.require_partition_filter.unwrap_or(false),
            expiration_days: options.expiration_days,
            description: options.description,
            labels: options.labels,
            column_descriptions: ColumnDescriptions::from_arrow(arrow_fields)?,
            declared: declared.cloned(),
        })
    }
}

fn find_column<'a>(columns: &'a [Column], name: &str) -> Option<&'a Column> {
    columns.iter().find(|c| c.name.eq_ignore_ascii_case(name))
}

/// Clustering takes top-level, non-repeated INT64, STRING, BOOL, DATE, DATETIME, TIMESTAMP,
/// NUMERIC, BIGNUMERIC, GEOGRAPHY and RANGE columns (BigQuery documentation, Introduction to
/// clustered tables, Clustered table limitations).
pub(crate) fn is_clusterable(column: &Column) -> bool {
    !column.repeated
        && matches!(
            column.bigquery_type,
            BigQueryType::Int64
                | BigQueryType::String
                | BigQueryType::Bool
                | BigQueryType::Date
                | BigQueryType::Datetime
                | BigQueryType::Timestamp
                | BigQueryType::Numeric
                | BigQueryType::BigNumeric
                | BigQueryType::Geography(_)
                | BigQueryType::Range(_)
        )
}

fn check_partition_column(partitioning: &Partitioning, columns: &[Column]) -> Result<Partitioning, Problem> {
    let Some(field) = partitioning.field() else { return Ok(partitioning.clone()) };
    let column = find_column(columns, field)
        .ok_or_else(|| invalid_partitioning(format!("partitioning field {field:?} is not a column of the batches")))?;
    let fits = !column.repeated
        && match partitioning {
            Partitioning::TimeUnitColumn { granularity: Granularity::Hour, .. } => {
                matches!(column.bigquery_type, BigQueryType::Datetime | BigQueryType::Timestamp)
            }
            Partitioning::TimeUnitColumn { .. } => {
                matches!(column.bigquery_type, BigQueryType::Date | BigQueryType::Datetime | BigQueryType::Timestamp)
            }
            Partitioning::IntegerRange { .. } => column.bigquery_type == BigQueryType::Int64,
            Partitioning::IngestionTime { .. } => true,
        };
    if !fits {
        let wanted = match partitioning {
            Partitioning::TimeUnitColumn { granularity: Granularity::Hour, .. } => "DATETIME or TIMESTAMP (HOUR)",
            Partitioning::TimeUnitColumn { .. } => "DATE, DATETIME or TIMESTAMP",
            _ => "INT64",
        };
        return Err(invalid_partitioning(format!(
            "partitioning field {} is {}; {} partitioning needs a {wanted} column",
            column.name,
            column.sql_type(),
            partitioning.describe()
        )));
    }
    Ok(partitioning.with_field(&column.name))
}

fn check_clustering_column(name: &str, columns: &[Column]) -> Result<String, Problem> {
    let column = find_column(columns, name)
        .ok_or_else(|| invalid_clustering(format!("clustering column {name:?} is not a column of the batches")))?;
    if !is_clusterable(column) {
        return Err(invalid_clustering(format!(
            "clustering column {} is {}; BigQuery clusters by top-level INT64, STRING, BOOL, DATE, DATETIME, \
             TIMESTAMP, NUMERIC, BIGNUMERIC, GEOGRAPHY or RANGE columns",
            column.name,
            column.sql_type()
        )));
    }
    Ok(column.name.clone())
}

/// Column descriptions from Arrow field metadata `description`, nested like the columns
/// (STRUCT fields, also inside lists). Names compare case-insensitively.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct ColumnDescriptions {
    by_lowercase_name: BTreeMap<String, ColumnDescription>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct ColumnDescription {
    text: Option<String>,
    fields: ColumnDescriptions,
}

impl ColumnDescriptions {
    /// `invalid_table_options` when a description is longer than BigQuery allows.
    pub(crate) fn from_arrow(fields: &Fields) -> Result<Self, Problem> {
        let mut by_lowercase_name = BTreeMap::new();
        for field in fields {
            let text = field.metadata().get(DESCRIPTION_METADATA_KEY).filter(|t| !t.is_empty()).cloned();
            if let Some(text) = &text {
                let chars = text.chars().count();
                if chars > MAX_COLUMN_DESCRIPTION_CHARS {
                    return Err(Problem::new(
                        ErrorCode::InvalidTableOptions,
                        format!(
                            "the Arrow description of column {} has {chars} characters; BigQuery allows at most \
                             {MAX_COLUMN_DESCRIPTION_CHARS}",
                            field.name()
                        ),
                    ));
                }
            }
            let fields = match struct_fields(field.data_type()) {
                Some(inner) => Self::from_arrow(inner)?,
                None => Self::default(),
            };
            if text.is_some() || !fields.by_lowercase_name.is_empty() {
                by_lowercase_name.insert(field.name().to_ascii_lowercase(), ColumnDescription { text, fields });
            }
        }
        Ok(Self { by_lowercase_name })
    }

    /// The description of the column `name`.
    pub(crate) fn text(&self, name: &str) -> Option<&str> {
        self.by_lowercase_name.get(&name.to_ascii_lowercase())?.text.as_deref()
    }

    /// The descriptions of the fields of the STRUCT column `name`.
    pub(crate) fn fields(&self, name: &str) -> Option<&ColumnDescriptions> {
        self.by_lowercase_name.get(&name.to_ascii_lowercase()).map(|d| &d.fields)
    }
}

/// The fields of a struct, or of the structs of a list.
fn struct_fields(data_type: &DataType) -> Option<&Fields> {
    match data_type {
        DataType::Struct(fields) => Some(fields),
        DataType::List(item) | DataType::LargeList(item) | DataType::FixedSizeList(item, _) => {
            struct_fields(item.data_type())
        }
        _ => None,
    }
}

/// One way an existing destination table's layout differs from the declaration (the table is
/// left as it is; `layout_mismatch` on the resource view and the `bigquery.write.set_up` event).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub(crate) struct LayoutDifference {
    /// `partitioning`, `clustering` or `require_partition_filter`.
    pub(crate) option: String,
    /// What the existing table has.
    pub(crate) table: String,
    /// What the declaration asks for.
    pub(crate) declared: String,
}
