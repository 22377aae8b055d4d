//! Schema validation and the Arrow -> BigQuery column mapping.
//!
//! This slice supports the common types (BOOL, INT64, FLOAT64, STRING, BYTES, DATE, DATETIME,
//! TIMESTAMP); every other Arrow type is rejected with `unsupported_type` naming the column.
//! Every destination column is created NULLABLE, whatever the Arrow nullability, so that later
//! segments and schema evolution never hit BigQuery's REQUIRED restrictions.

use std::collections::HashSet;
use std::fmt;
use std::sync::Arc;

use arrow_schema::{DataType, Field, Schema, SchemaRef, TimeUnit};
use serde::Serialize;
use sha2::{Digest as _, Sha256};

use super::IngestError;
use crate::model::validate_column_name;

/// BigQuery's limit on columns per table.
pub const MAX_COLUMNS: usize = 10_000;

/// A BigQuery column type (standard SQL names, as `tables.insert` expects them).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum BigQueryType {
    Bool,
    Int64,
    Float64,
    String,
    Bytes,
    Date,
    Datetime,
    Timestamp,
}

impl BigQueryType {
    pub fn as_str(self) -> &'static str {
        match self {
            BigQueryType::Bool => "BOOL",
            BigQueryType::Int64 => "INT64",
            BigQueryType::Float64 => "FLOAT64",
            BigQueryType::String => "STRING",
            BigQueryType::Bytes => "BYTES",
            BigQueryType::Date => "DATE",
            BigQueryType::Datetime => "DATETIME",
            BigQueryType::Timestamp => "TIMESTAMP",
        }
    }

    /// Parses the type name `tables.get` reports (legacy and standard spellings).
    pub fn from_table_type(name: &str) -> Option<Self> {
        Some(match name.to_ascii_uppercase().as_str() {
            "BOOL" | "BOOLEAN" => BigQueryType::Bool,
            "INT64" | "INTEGER" => BigQueryType::Int64,
            "FLOAT64" | "FLOAT" => BigQueryType::Float64,
            "STRING" => BigQueryType::String,
            "BYTES" => BigQueryType::Bytes,
            "DATE" => BigQueryType::Date,
            "DATETIME" => BigQueryType::Datetime,
            "TIMESTAMP" => BigQueryType::Timestamp,
            _ => return None,
        })
    }

    /// The Arrow type rows are staged as (what the Storage Write API expects for the column).
    pub fn staging_arrow_type(self) -> DataType {
        match self {
            BigQueryType::Bool => DataType::Boolean,
            BigQueryType::Int64 => DataType::Int64,
            BigQueryType::Float64 => DataType::Float64,
            BigQueryType::String => DataType::Utf8,
            BigQueryType::Bytes => DataType::Binary,
            BigQueryType::Date => DataType::Date32,
            BigQueryType::Datetime => DataType::Timestamp(TimeUnit::Microsecond, None),
            BigQueryType::Timestamp => DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
        }
    }
}

impl fmt::Display for BigQueryType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One column as the destination and staging tables hold it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Column {
    pub name: String,
    pub bigquery_type: BigQueryType,
}

/// A validated batch schema: the incoming Arrow schema, its BigQuery columns and the schema the
/// staged rows are written with.
#[derive(Debug, Clone)]
pub struct MappedSchema {
    pub incoming: SchemaRef,
    pub columns: Vec<Column>,
    pub staging: SchemaRef,
}

impl MappedSchema {
    /// Canonical JSON of the incoming schema (names, Arrow types, nullability): what every later
    /// batch of the resource in this delivery must repeat.
    pub fn canonical_json(&self) -> serde_json::Value {
        canonical_schema_json(&self.incoming)
    }
}

pub fn canonical_schema_json(schema: &Schema) -> serde_json::Value {
    serde_json::Value::Array(
        schema
            .fields()
            .iter()
            .map(|f| serde_json::json!({"name": f.name(), "type": f.data_type().to_string(), "nullable": f.is_nullable()}))
            .collect(),
    )
}

/// SHA-256 (hex) of the canonical schema JSON.
pub fn schema_sha256(canonical: &serde_json::Value) -> String {
    hex::encode(Sha256::digest(canonical.to_string().as_bytes()))
}

/// Maps one Arrow type to its BigQuery column type, or explains why it cannot be loaded.
pub fn bigquery_type(name: &str, data_type: &DataType) -> Result<BigQueryType, IngestError> {
    let unsupported = |reason: &str| IngestError::UnsupportedType {
        column: name.to_string(),
        arrow_type: data_type.to_string(),
        reason: reason.to_string(),
    };
    Ok(match data_type {
        DataType::Boolean => BigQueryType::Bool,
        DataType::Int8 | DataType::Int16 | DataType::Int32 | DataType::Int64 => BigQueryType::Int64,
        DataType::UInt8 | DataType::UInt16 | DataType::UInt32 => BigQueryType::Int64,
        DataType::Float16 | DataType::Float32 | DataType::Float64 => BigQueryType::Float64,
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => BigQueryType::String,
        DataType::Binary | DataType::LargeBinary | DataType::BinaryView | DataType::FixedSizeBinary(_) => {
            BigQueryType::Bytes
        }
        DataType::Date32 | DataType::Date64 => BigQueryType::Date,
        DataType::Timestamp(_, Some(_)) => BigQueryType::Timestamp,
        DataType::Timestamp(_, None) => BigQueryType::Datetime,
        DataType::Dictionary(_, value) => bigquery_type(name, value)?,
        DataType::UInt64 => return Err(unsupported("UInt64 (NUMERIC) is not supported yet; send Int64")),
        DataType::Decimal32(..) | DataType::Decimal64(..) | DataType::Decimal128(..) | DataType::Decimal256(..) => {
            return Err(unsupported("decimals (NUMERIC/BIGNUMERIC) are not supported yet"));
        }
        DataType::Time32(_) | DataType::Time64(_) => return Err(unsupported("TIME is not supported yet")),
        DataType::List(_)
        | DataType::LargeList(_)
        | DataType::FixedSizeList(..)
        | DataType::ListView(_)
        | DataType::LargeListView(_)
        | DataType::Struct(_)
        | DataType::Map(..) => return Err(unsupported("nested types (ARRAY/STRUCT) are not supported yet")),
        _ => return Err(unsupported("BigQuery has no column type for it")),
    })
}

/// Validates names (contract rules, reserved prefix, case-insensitive uniqueness, column count)
/// and types, and builds the staging schema.
pub fn map_schema(schema: &SchemaRef) -> Result<MappedSchema, IngestError> {
    if schema.fields().is_empty() {
        return Err(IngestError::InvalidColumn("the schema has no columns".into()));
    }
    if schema.fields().len() > MAX_COLUMNS {
        return Err(IngestError::InvalidColumn(format!(
            "the schema has {} columns; BigQuery allows at most {MAX_COLUMNS}",
            schema.fields().len()
        )));
    }
    let mut seen = HashSet::with_capacity(schema.fields().len());
    let mut columns = Vec::with_capacity(schema.fields().len());
    let mut staging_fields = Vec::with_capacity(schema.fields().len());
    for field in schema.fields() {
        validate_column_name(field.name()).map_err(|p| IngestError::InvalidColumn(p.detail))?;
        if !seen.insert(field.name().to_ascii_lowercase()) {
            return Err(IngestError::InvalidColumn(format!(
                "column {:?} appears twice (BigQuery column names are case-insensitive)",
                field.name()
            )));
        }
        let bigquery_type = bigquery_type(field.name(), field.data_type())?;
        staging_fields.push(Field::new(field.name(), bigquery_type.staging_arrow_type(), true));
        columns.push(Column { name: field.name().clone(), bigquery_type });
    }
    Ok(MappedSchema { incoming: Arc::clone(schema), columns, staging: Arc::new(Schema::new(staging_fields)) })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn schema(fields: Vec<Field>) -> SchemaRef {
        Arc::new(Schema::new(fields))
    }

    #[test]
    fn maps_the_common_types() {
        let mapped = map_schema(&schema(vec![
            Field::new("b", DataType::Boolean, false),
            Field::new("i8", DataType::Int8, true),
            Field::new("u32", DataType::UInt32, true),
            Field::new("f", DataType::Float32, true),
            Field::new("s", DataType::LargeUtf8, true),
            Field::new("v", DataType::Utf8View, true),
            Field::new("bin", DataType::FixedSizeBinary(16), true),
            Field::new("d", DataType::Date64, true),
            Field::new("ts", DataType::Timestamp(TimeUnit::Nanosecond, Some("+02:00".into())), true),
            Field::new("dt", DataType::Timestamp(TimeUnit::Second, None), true),
            Field::new("dict", DataType::Dictionary(Box::new(DataType::Int32), Box::new(DataType::Utf8)), true),
        ]))
        .unwrap();
        let types: Vec<&str> = mapped.columns.iter().map(|c| c.bigquery_type.as_str()).collect();
        assert_eq!(
            types,
            [
                "BOOL",
                "INT64",
                "INT64",
                "FLOAT64",
                "STRING",
                "STRING",
                "BYTES",
                "DATE",
                "TIMESTAMP",
                "DATETIME",
                "STRING"
            ]
        );
        assert!(mapped.staging.fields().iter().all(|f| f.is_nullable()));
        assert_eq!(
            mapped.staging.field(8).data_type(),
            &DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into()))
        );
    }

    #[test]
    fn rejects_unsupported_types_naming_the_column() {
        for data_type in [
            DataType::Null,
            DataType::Duration(TimeUnit::Second),
            DataType::Time64(TimeUnit::Microsecond),
            DataType::Decimal128(10, 2),
            DataType::List(Arc::new(Field::new("item", DataType::Int64, true))),
        ] {
            let err = map_schema(&schema(vec![Field::new("weird", data_type.clone(), true)])).unwrap_err();
            match err {
                IngestError::UnsupportedType { column, .. } => assert_eq!(column, "weird", "{data_type}"),
                other => panic!("{data_type}: {other:?}"),
            }
        }
    }

    #[test]
    fn rejects_bad_reserved_and_duplicate_names() {
        for fields in [
            vec![Field::new("_filament_op", DataType::Utf8, true)],
            vec![Field::new("has space", DataType::Utf8, true)],
            vec![Field::new("a", DataType::Utf8, true), Field::new("A", DataType::Utf8, true)],
            vec![],
        ] {
            assert!(matches!(map_schema(&schema(fields)), Err(IngestError::InvalidColumn(_))));
        }
    }

    #[test]
    fn schema_fingerprint_changes_with_type_or_nullability() {
        let a = canonical_schema_json(&Schema::new(vec![Field::new("x", DataType::Int64, true)]));
        let b = canonical_schema_json(&Schema::new(vec![Field::new("x", DataType::Int32, true)]));
        let c = canonical_schema_json(&Schema::new(vec![Field::new("x", DataType::Int64, false)]));
        assert_ne!(schema_sha256(&a), schema_sha256(&b));
        assert_ne!(schema_sha256(&a), schema_sha256(&c));
        assert_eq!(schema_sha256(&a), schema_sha256(&a.clone()));
    }
}
