//! Schema validation and the Arrow -> BigQuery column mapping (the table in
//! `docs/type-mapping.md`), plus the staging layout each write mode needs.
//!
//! Every destination column is created NULLABLE (REPEATED for lists), whatever the Arrow
//! nullability, so later segments and schema evolution never hit BigQuery's REQUIRED rules.
//! TIME, NUMERIC, BIGNUMERIC and JSON values are staged as lossless strings and converted by the
//! publication query ([`crate::publish::sql`]); everything else is staged in its final type.
//! Keyed modes stage `_filament_seq` (order of the row within the execution), CDC modes stage
//! `_filament_op`.

use std::collections::HashSet;
use std::fmt;
use std::sync::Arc;

use arrow_schema::{DataType, Field, Schema, SchemaRef, TimeUnit};
use serde::Serialize;
use sha2::{Digest as _, Sha256};

use super::IngestError;
use crate::model::{WriteMode, validate_column_name};

/// BigQuery's limit on columns per table.
pub const MAX_COLUMNS: usize = 10_000;
/// BigQuery's limit on primary-key columns.
pub const MAX_KEY_COLUMNS: usize = 16;

/// The operation column of CDC modes (client-sent, staged, and kept by `cdc_append`).
pub const OP_COLUMN: &str = "_filament_op";
/// The staged order of a row within its execution: `seq << 32 | row index in the request`.
pub const SEQ_COLUMN: &str = "_filament_seq";
/// Operations a CDC row may carry.
pub const OPERATIONS: [&str; 4] = ["insert", "update", "upsert", "delete"];

/// NUMERIC holds 29 integer digits and 9 decimals; BIGNUMERIC 38 and 38 (its full range is
/// 76.76 digits, but only up to 38 integer digits for every value).
const NUMERIC_INTEGER_DIGITS: i16 = 29;
const NUMERIC_SCALE: i8 = 9;
const BIGNUMERIC_INTEGER_DIGITS: i16 = 38;
const BIGNUMERIC_SCALE: i8 = 38;

/// Field metadata that marks a string column as JSON: the canonical extension type, or
/// `bigquery_type: JSON` for writers that cannot set extension types.
const EXTENSION_NAME_KEY: &str = "ARROW:extension:name";
const JSON_EXTENSION: &str = "arrow.json";
const BIGQUERY_TYPE_KEY: &str = "bigquery_type";

/// A BigQuery column type.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub enum BigQueryType {
    Bool,
    Int64,
    Float64,
    Numeric,
    BigNumeric,
    String,
    Bytes,
    Date,
    Time,
    Datetime,
    Timestamp,
    Json,
    Struct(Vec<Column>),
}

impl BigQueryType {
    /// The type name `tables.insert` takes.
    pub fn type_name(&self) -> &'static str {
        match self {
            BigQueryType::Bool => "BOOL",
            BigQueryType::Int64 => "INT64",
            BigQueryType::Float64 => "FLOAT64",
            BigQueryType::Numeric => "NUMERIC",
            BigQueryType::BigNumeric => "BIGNUMERIC",
            BigQueryType::String => "STRING",
            BigQueryType::Bytes => "BYTES",
            BigQueryType::Date => "DATE",
            BigQueryType::Time => "TIME",
            BigQueryType::Datetime => "DATETIME",
            BigQueryType::Timestamp => "TIMESTAMP",
            BigQueryType::Json => "JSON",
            BigQueryType::Struct(_) => "RECORD",
        }
    }

    /// Whether `name`, as `tables.get` reports a type (legacy or standard spelling), is this type.
    /// Struct fields are compared by [`Column::matches_existing`].
    pub fn is_named(&self, name: &str) -> bool {
        let name = name.to_ascii_uppercase();
        let aliases: &[&str] = match self {
            BigQueryType::Bool => &["BOOL", "BOOLEAN"],
            BigQueryType::Int64 => &["INT64", "INTEGER"],
            BigQueryType::Float64 => &["FLOAT64", "FLOAT"],
            BigQueryType::Numeric => &["NUMERIC", "DECIMAL"],
            BigQueryType::BigNumeric => &["BIGNUMERIC", "BIGDECIMAL"],
            BigQueryType::Struct(_) => &["RECORD", "STRUCT"],
            other => return name == other.type_name(),
        };
        aliases.contains(&name.as_str())
    }

    /// Values staged as strings and converted by the publication query.
    pub fn is_staged_as_string(&self) -> bool {
        matches!(self, BigQueryType::Numeric | BigQueryType::BigNumeric | BigQueryType::Time | BigQueryType::Json)
    }

    /// Whether the publication query must convert the staged value (here or in a nested field).
    pub fn needs_conversion(&self) -> bool {
        match self {
            BigQueryType::Struct(fields) => fields.iter().any(|f| f.bigquery_type.needs_conversion()),
            other => other.is_staged_as_string(),
        }
    }

    /// BigQuery allows these in primary keys (BYTES and TIME compare fine too).
    pub fn is_key_eligible(&self) -> bool {
        !matches!(self, BigQueryType::Float64 | BigQueryType::Json | BigQueryType::Struct(_))
    }

    /// The type rows are staged with.
    pub fn staged(&self) -> BigQueryType {
        match self {
            BigQueryType::Struct(fields) => BigQueryType::Struct(fields.iter().map(Column::staged).collect()),
            other if other.is_staged_as_string() => BigQueryType::String,
            other => other.clone(),
        }
    }

    /// The Arrow type of the staged value (what the Storage Write API expects for the column).
    fn staging_arrow_type(&self) -> DataType {
        match self {
            BigQueryType::Bool => DataType::Boolean,
            BigQueryType::Int64 => DataType::Int64,
            BigQueryType::Float64 => DataType::Float64,
            BigQueryType::Bytes => DataType::Binary,
            BigQueryType::Date => DataType::Date32,
            BigQueryType::Datetime => DataType::Timestamp(TimeUnit::Microsecond, None),
            BigQueryType::Timestamp => DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
            BigQueryType::Struct(fields) => DataType::Struct(fields.iter().map(Column::staging_field).collect()),
            BigQueryType::String
            | BigQueryType::Numeric
            | BigQueryType::BigNumeric
            | BigQueryType::Time
            | BigQueryType::Json => DataType::Utf8,
        }
    }
}

impl fmt::Display for BigQueryType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BigQueryType::Struct(fields) => {
                f.write_str("STRUCT<")?;
                for (i, field) in fields.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    write!(f, "{field}")?;
                }
                f.write_str(">")
            }
            other => f.write_str(other.type_name()),
        }
    }
}

/// One column as the destination (or staging) table holds it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Column {
    pub name: String,
    pub bigquery_type: BigQueryType,
    /// An ARRAY (`REPEATED` mode); otherwise `NULLABLE`.
    pub repeated: bool,
}

impl Column {
    pub fn new(name: impl Into<String>, bigquery_type: BigQueryType) -> Self {
        Self { name: name.into(), bigquery_type, repeated: false }
    }

    pub fn repeated(name: impl Into<String>, bigquery_type: BigQueryType) -> Self {
        Self { name: name.into(), bigquery_type, repeated: true }
    }

    pub fn mode(&self) -> &'static str {
        if self.repeated { "REPEATED" } else { "NULLABLE" }
    }

    pub fn staged(&self) -> Column {
        Column { name: self.name.clone(), bigquery_type: self.bigquery_type.staged(), repeated: self.repeated }
    }

    /// The Arrow field of the staged column: lists for REPEATED columns.
    pub fn staging_field(&self) -> Field {
        let value_type = self.bigquery_type.staged().staging_arrow_type();
        if self.repeated {
            Field::new(&self.name, DataType::List(Arc::new(Field::new_list_field(value_type, true))), true)
        } else {
            Field::new(&self.name, value_type, true)
        }
    }

    /// The SQL type, as error messages and docs show it (`ARRAY<STRUCT<a INT64>>`).
    pub fn sql_type(&self) -> String {
        if self.repeated { format!("ARRAY<{}>", self.bigquery_type) } else { self.bigquery_type.to_string() }
    }
}

impl fmt::Display for Column {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.name, self.sql_type())
    }
}

/// What a resource declares that shapes its staging: the write mode and the primary key.
#[derive(Debug, Clone, Copy)]
pub struct LoadSpec<'a> {
    pub write_mode: WriteMode,
    pub primary_key: &'a [String],
}

/// A validated batch schema: the incoming Arrow schema, its BigQuery columns and the staging
/// layout.
#[derive(Debug, Clone)]
pub struct MappedSchema {
    pub incoming: SchemaRef,
    /// The client's data columns (without `_filament_op`), in incoming order.
    pub data_columns: Vec<Column>,
    /// Position of each data column in the incoming schema.
    pub data_indices: Vec<usize>,
    /// Position of `_filament_op` in the incoming schema (CDC modes).
    pub op_index: Option<usize>,
    /// Key columns as named in the schema, in key order, with their incoming positions.
    pub key_columns: Vec<(String, usize)>,
    /// Columns of the destination table: the data columns, plus `_filament_op` for `cdc_append`.
    pub destination_columns: Vec<Column>,
    /// Columns of the staging table: staged data columns, then `_filament_op`, `_filament_seq`.
    pub staging_columns: Vec<Column>,
    /// The Arrow schema staged rows are written with (matches `staging_columns`).
    pub staging: SchemaRef,
    /// Whether `_filament_seq` is staged (the MERGE modes).
    pub stages_seq: bool,
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
            .map(|f| {
                let mut entry = serde_json::json!({"name": f.name(), "type": f.data_type().to_string(), "nullable": f.is_nullable()});
                if is_json_field(f) {
                    entry["json"] = serde_json::Value::Bool(true);
                }
                entry
            })
            .collect(),
    )
}

/// SHA-256 (hex) of the canonical schema JSON.
pub fn schema_sha256(canonical: &serde_json::Value) -> String {
    hex::encode(Sha256::digest(canonical.to_string().as_bytes()))
}

fn is_json_field(field: &Field) -> bool {
    let metadata = field.metadata();
    metadata.get(EXTENSION_NAME_KEY).is_some_and(|v| v == JSON_EXTENSION)
        || metadata.get(BIGQUERY_TYPE_KEY).is_some_and(|v| v.eq_ignore_ascii_case("JSON"))
}

fn unsupported(column: &str, data_type: &DataType, reason: impl Into<String>) -> IngestError {
    IngestError::UnsupportedType {
        column: column.to_string(),
        arrow_type: data_type.to_string(),
        reason: reason.into(),
    }
}

/// The BigQuery type of a decimal with `precision` digits and `scale` decimals.
fn decimal_type(column: &str, data_type: &DataType, precision: u8, scale: i8) -> Result<BigQueryType, IngestError> {
    if scale < 0 {
        return Err(unsupported(column, data_type, "negative decimal scales are not supported; rescale to 0"));
    }
    let integer_digits = i16::from(precision) - i16::from(scale);
    if scale <= NUMERIC_SCALE && integer_digits <= NUMERIC_INTEGER_DIGITS {
        Ok(BigQueryType::Numeric)
    } else if scale <= BIGNUMERIC_SCALE && integer_digits <= BIGNUMERIC_INTEGER_DIGITS {
        Ok(BigQueryType::BigNumeric)
    } else {
        Err(unsupported(
            column,
            data_type,
            "beyond BIGNUMERIC (at most 38 integer digits and 38 decimals); send a string column",
        ))
    }
}

/// Maps one Arrow field to its BigQuery column, or explains why it cannot be loaded. `path` is
/// the column's name as error messages show it (`address.city` for nested fields).
pub fn bigquery_column(path: &str, field: &Field) -> Result<Column, IngestError> {
    let data_type = field.data_type();
    let name = field.name().clone();
    let value_field = |data_type: &DataType| {
        Field::new(field.name(), data_type.clone(), true).with_metadata(field.metadata().clone())
    };
    match data_type {
        DataType::Dictionary(_, value) => bigquery_column(path, &value_field(value)),
        DataType::List(item) | DataType::LargeList(item) | DataType::FixedSizeList(item, _) => {
            let element = bigquery_column(path, &item.as_ref().clone().with_name(field.name()))?;
            if element.repeated {
                return Err(unsupported(
                    path,
                    data_type,
                    "BigQuery has no ARRAY of ARRAY; wrap the inner list in a struct",
                ));
            }
            Ok(Column::repeated(name, element.bigquery_type))
        }
        DataType::Map(entries, _) => {
            let DataType::Struct(kv) = entries.data_type() else {
                return Err(unsupported(path, data_type, "malformed map"));
            };
            let fields = kv
                .iter()
                .zip(["key", "value"])
                .map(|(f, n)| bigquery_column(&format!("{path}.{n}"), &f.as_ref().clone().with_name(n)))
                .collect::<Result<Vec<_>, _>>()?;
            if fields.iter().any(|f| f.repeated && f.name == "key") {
                return Err(unsupported(path, data_type, "map keys must be scalars"));
            }
            Ok(Column::repeated(name, BigQueryType::Struct(fields)))
        }
        DataType::Struct(children) => {
            if children.is_empty() {
                return Err(unsupported(path, data_type, "BigQuery has no STRUCT without fields"));
            }
            let mut seen = HashSet::new();
            let mut fields = Vec::with_capacity(children.len());
            for child in children {
                let child_path = format!("{path}.{}", child.name());
                validate_column_name(child.name()).map_err(|p| IngestError::InvalidColumn(p.detail))?;
                if !seen.insert(child.name().to_ascii_lowercase()) {
                    return Err(IngestError::InvalidColumn(format!("field {child_path:?} appears twice")));
                }
                fields.push(bigquery_column(&child_path, child)?);
            }
            Ok(Column::new(name, BigQueryType::Struct(fields)))
        }
        scalar => Ok(Column::new(name, scalar_type(path, scalar, is_json_field(field))?)),
    }
}

fn scalar_type(path: &str, data_type: &DataType, json: bool) -> Result<BigQueryType, IngestError> {
    Ok(match data_type {
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View if json => BigQueryType::Json,
        _ if json => return Err(unsupported(path, data_type, "JSON columns must be strings")),
        DataType::Boolean => BigQueryType::Bool,
        DataType::Int8 | DataType::Int16 | DataType::Int32 | DataType::Int64 => BigQueryType::Int64,
        DataType::UInt8 | DataType::UInt16 | DataType::UInt32 => BigQueryType::Int64,
        DataType::UInt64 => BigQueryType::Numeric,
        DataType::Float16 | DataType::Float32 | DataType::Float64 => BigQueryType::Float64,
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => BigQueryType::String,
        DataType::Binary | DataType::LargeBinary | DataType::BinaryView | DataType::FixedSizeBinary(_) => {
            BigQueryType::Bytes
        }
        DataType::Date32 | DataType::Date64 => BigQueryType::Date,
        DataType::Time32(_) | DataType::Time64(_) => BigQueryType::Time,
        DataType::Timestamp(_, Some(_)) => BigQueryType::Timestamp,
        DataType::Timestamp(_, None) => BigQueryType::Datetime,
        DataType::Decimal32(precision, scale)
        | DataType::Decimal64(precision, scale)
        | DataType::Decimal128(precision, scale)
        | DataType::Decimal256(precision, scale) => decimal_type(path, data_type, *precision, *scale)?,
        DataType::ListView(_) | DataType::LargeListView(_) => {
            return Err(unsupported(path, data_type, "list views are not supported; send a List"));
        }
        _ => return Err(unsupported(path, data_type, "BigQuery has no column type for it")),
    })
}

/// Validates names (contract rules, reserved prefix, case-insensitive uniqueness, column count),
/// types, the operation column and the key, and builds the staging layout for `spec`.
pub fn map_schema(schema: &SchemaRef, spec: LoadSpec<'_>) -> Result<MappedSchema, IngestError> {
    if schema.fields().is_empty() {
        return Err(IngestError::InvalidColumn("the schema has no columns".into()));
    }
    if schema.fields().len() > MAX_COLUMNS {
        return Err(IngestError::InvalidColumn(format!(
            "the schema has {} columns; BigQuery allows at most {MAX_COLUMNS}",
            schema.fields().len()
        )));
    }
    let cdc = matches!(spec.write_mode, WriteMode::CdcAppend | WriteMode::CdcMerge);
    let mut seen = HashSet::with_capacity(schema.fields().len());
    let mut data_columns = Vec::with_capacity(schema.fields().len());
    let mut data_indices = Vec::with_capacity(schema.fields().len());
    let mut op_index = None;
    for (index, field) in schema.fields().iter().enumerate() {
        if field.name() == OP_COLUMN {
            if !cdc {
                return Err(IngestError::InvalidOperation(format!(
                    "write mode {} takes no {OP_COLUMN} column (only cdc_append and cdc_merge do)",
                    spec.write_mode
                )));
            }
            let string_like = |t: &DataType| matches!(t, DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View);
            let ok = match field.data_type() {
                DataType::Dictionary(_, value) => string_like(value),
                other => string_like(other),
            };
            if !ok {
                return Err(IngestError::InvalidOperation(format!(
                    "{OP_COLUMN} must be a string column, not {}",
                    field.data_type()
                )));
            }
            op_index = Some(index);
            continue;
        }
        validate_column_name(field.name()).map_err(|p| IngestError::InvalidColumn(p.detail))?;
        if !seen.insert(field.name().to_ascii_lowercase()) {
            return Err(IngestError::InvalidColumn(format!(
                "column {:?} appears twice (BigQuery column names are case-insensitive)",
                field.name()
            )));
        }
        data_columns.push(bigquery_column(field.name(), field)?);
        data_indices.push(index);
    }
    if cdc && op_index.is_none() {
        return Err(IngestError::InvalidOperation(format!(
            "write mode {} needs a {OP_COLUMN} column (insert, update, upsert or delete per row)",
            spec.write_mode
        )));
    }
    if data_columns.is_empty() {
        return Err(IngestError::InvalidColumn("the schema has no data columns".into()));
    }
    let key_columns = key_columns(spec, &data_columns, &data_indices)?;

    let op_column = Column::new(OP_COLUMN, BigQueryType::String);
    let mut destination_columns = data_columns.clone();
    if spec.write_mode == WriteMode::CdcAppend {
        destination_columns.push(op_column.clone());
    }
    let stages_seq = spec.write_mode.is_merge();
    let mut staging_columns: Vec<Column> = data_columns.iter().map(Column::staged).collect();
    if op_index.is_some() {
        staging_columns.push(op_column);
    }
    if stages_seq {
        staging_columns.push(Column::new(SEQ_COLUMN, BigQueryType::Int64));
    }
    let staging = Arc::new(Schema::new(staging_columns.iter().map(Column::staging_field).collect::<Vec<_>>()));
    Ok(MappedSchema {
        incoming: Arc::clone(schema),
        data_columns,
        data_indices,
        op_index,
        key_columns,
        destination_columns,
        staging_columns,
        staging,
        stages_seq,
    })
}

/// The declared key resolved against the schema: every key column present, top-level, not
/// repeated and of a key-eligible type.
fn key_columns(
    spec: LoadSpec<'_>,
    data_columns: &[Column],
    data_indices: &[usize],
) -> Result<Vec<(String, usize)>, IngestError> {
    if !spec.write_mode.is_merge() {
        return Ok(Vec::new());
    }
    if spec.primary_key.is_empty() || spec.primary_key.len() > MAX_KEY_COLUMNS {
        return Err(IngestError::InvalidPrimaryKey(format!(
            "write mode {} needs 1 to {MAX_KEY_COLUMNS} key columns",
            spec.write_mode
        )));
    }
    spec.primary_key
        .iter()
        .map(|key| {
            let position = data_columns.iter().position(|c| c.name.eq_ignore_ascii_case(key)).ok_or_else(|| {
                IngestError::InvalidPrimaryKey(format!("key column {key:?} is not in the batch's schema"))
            })?;
            let column = &data_columns[position];
            if column.repeated || !column.bigquery_type.is_key_eligible() {
                return Err(IngestError::InvalidPrimaryKey(format!(
                    "key column {key:?} is {}, which BigQuery cannot use as a key (FLOAT64, JSON, ARRAY and STRUCT are not eligible)",
                    column.sql_type()
                )));
            }
            Ok((column.name.clone(), data_indices[position]))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn schema(fields: Vec<Field>) -> SchemaRef {
        Arc::new(Schema::new(fields))
    }

    fn append() -> LoadSpec<'static> {
        LoadSpec { write_mode: WriteMode::FullAppend, primary_key: &[] }
    }

    fn sql_types(fields: Vec<Field>) -> Vec<String> {
        map_schema(&schema(fields), append()).unwrap().data_columns.iter().map(Column::sql_type).collect()
    }

    fn item(data_type: DataType) -> Arc<Field> {
        Arc::new(Field::new_list_field(data_type, true))
    }

    #[test]
    fn maps_every_supported_type() {
        let json = Field::new("doc", DataType::Utf8, true)
            .with_metadata(HashMap::from([(EXTENSION_NAME_KEY.to_string(), JSON_EXTENSION.to_string())]));
        let json_by_key = Field::new("doc2", DataType::LargeUtf8, true)
            .with_metadata(HashMap::from([(BIGQUERY_TYPE_KEY.to_string(), "json".to_string())]));
        let entries = Field::new(
            "entries",
            DataType::Struct(
                vec![Field::new("k", DataType::Utf8, false), Field::new("v", DataType::Float64, true)].into(),
            ),
            false,
        );
        let types = sql_types(vec![
            Field::new("b", DataType::Boolean, false),
            Field::new("i8", DataType::Int8, true),
            Field::new("u32", DataType::UInt32, true),
            Field::new("u64", DataType::UInt64, true),
            Field::new("f16", DataType::Float16, true),
            Field::new("s", DataType::LargeUtf8, true),
            Field::new("v", DataType::Utf8View, true),
            Field::new("bin", DataType::FixedSizeBinary(16), true),
            Field::new("d", DataType::Date64, true),
            Field::new("t32", DataType::Time32(TimeUnit::Millisecond), true),
            Field::new("t64", DataType::Time64(TimeUnit::Nanosecond), true),
            Field::new("ts", DataType::Timestamp(TimeUnit::Nanosecond, Some("+02:00".into())), true),
            Field::new("dt", DataType::Timestamp(TimeUnit::Second, None), true),
            Field::new("n", DataType::Decimal128(38, 9), true),
            Field::new("bn", DataType::Decimal128(38, 10), true),
            Field::new("bn2", DataType::Decimal256(76, 38), true),
            Field::new("dict", DataType::Dictionary(Box::new(DataType::Int32), Box::new(DataType::Utf8)), true),
            json,
            json_by_key,
            Field::new("tags", DataType::List(item(DataType::Utf8)), true),
            Field::new("big", DataType::LargeList(item(DataType::Int32)), true),
            Field::new("pair", DataType::FixedSizeList(item(DataType::Float32), 2), true),
            Field::new(
                "address",
                DataType::Struct(
                    vec![
                        Field::new("city", DataType::Utf8, true),
                        Field::new("at", DataType::Time64(TimeUnit::Microsecond), true),
                    ]
                    .into(),
                ),
                true,
            ),
            Field::new("m", DataType::Map(Arc::new(entries), false), true),
        ]);
        assert_eq!(
            types,
            [
                "BOOL",
                "INT64",
                "INT64",
                "NUMERIC",
                "FLOAT64",
                "STRING",
                "STRING",
                "BYTES",
                "DATE",
                "TIME",
                "TIME",
                "TIMESTAMP",
                "DATETIME",
                "NUMERIC",
                "BIGNUMERIC",
                "BIGNUMERIC",
                "STRING",
                "JSON",
                "JSON",
                "ARRAY<STRING>",
                "ARRAY<INT64>",
                "ARRAY<FLOAT64>",
                "STRUCT<city STRING, at TIME>",
                "ARRAY<STRUCT<key STRING, value FLOAT64>>",
            ]
        );
    }

    #[test]
    fn stages_lossless_strings_and_microsecond_timestamps() {
        let mapped = map_schema(
            &schema(vec![
                Field::new("n", DataType::Decimal128(10, 2), true),
                Field::new("t", DataType::Time64(TimeUnit::Nanosecond), true),
                Field::new("ts", DataType::Timestamp(TimeUnit::Nanosecond, Some("+02:00".into())), false),
                Field::new("xs", DataType::List(item(DataType::Decimal128(5, 1))), true),
            ]),
            append(),
        )
        .unwrap();
        let staged: Vec<&DataType> = mapped.staging.fields().iter().map(|f| f.data_type()).collect();
        assert_eq!(staged[0], &DataType::Utf8);
        assert_eq!(staged[1], &DataType::Utf8);
        assert_eq!(staged[2], &DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())));
        assert_eq!(staged[3], &DataType::List(item(DataType::Utf8)));
        assert!(mapped.staging.fields().iter().all(|f| f.is_nullable()));
        assert_eq!(mapped.staging_columns[3].sql_type(), "ARRAY<STRING>");
        assert_eq!(mapped.destination_columns[3].sql_type(), "ARRAY<NUMERIC>");
    }

    #[test]
    fn decimal_ranges_choose_numeric_bignumeric_or_refuse() {
        let d = DataType::Decimal256(1, 0);
        assert_eq!(decimal_type("c", &d, 38, 9), Ok(BigQueryType::Numeric));
        assert_eq!(decimal_type("c", &d, 29, 0), Ok(BigQueryType::Numeric));
        assert_eq!(decimal_type("c", &d, 30, 0), Ok(BigQueryType::BigNumeric));
        assert_eq!(decimal_type("c", &d, 20, 10), Ok(BigQueryType::BigNumeric));
        assert_eq!(decimal_type("c", &d, 76, 38), Ok(BigQueryType::BigNumeric));
        assert!(decimal_type("c", &d, 76, 37).is_err(), "39 integer digits");
        assert!(decimal_type("c", &d, 50, 39).is_err(), "39 decimals");
        assert!(decimal_type("c", &d, 10, -2).is_err(), "negative scale");
    }

    #[test]
    fn rejects_unsupported_types_naming_the_column() {
        let list_of_list = DataType::List(item(DataType::List(item(DataType::Int64))));
        for (data_type, column) in [
            (DataType::Null, "weird"),
            (DataType::Duration(TimeUnit::Second), "weird"),
            (DataType::Interval(arrow_schema::IntervalUnit::DayTime), "weird"),
            (DataType::Decimal256(76, 0), "weird"),
            (list_of_list, "weird"),
            (DataType::ListView(item(DataType::Int64)), "weird"),
            (DataType::Struct(vec![Field::new("d", DataType::Duration(TimeUnit::Second), true)].into()), "weird.d"),
            (DataType::Struct(arrow_schema::Fields::empty()), "weird"),
            (
                DataType::Union(
                    arrow_schema::UnionFields::try_new(vec![0], vec![Field::new("a", DataType::Int64, true)]).unwrap(),
                    arrow_schema::UnionMode::Dense,
                ),
                "weird",
            ),
        ] {
            let err = map_schema(&schema(vec![Field::new("weird", data_type.clone(), true)]), append()).unwrap_err();
            match err {
                IngestError::UnsupportedType { column: got, .. } => assert_eq!(got, column, "{data_type}"),
                other => panic!("{data_type}: {other:?}"),
            }
        }
        let json_int = Field::new("j", DataType::Int64, true)
            .with_metadata(HashMap::from([(EXTENSION_NAME_KEY.to_string(), JSON_EXTENSION.to_string())]));
        assert!(matches!(map_schema(&schema(vec![json_int]), append()), Err(IngestError::UnsupportedType { .. })));
    }

    #[test]
    fn rejects_bad_reserved_and_duplicate_names() {
        for fields in [
            vec![Field::new("_filament_seq", DataType::Int64, true)],
            vec![Field::new("has space", DataType::Utf8, true)],
            vec![Field::new("a", DataType::Utf8, true), Field::new("A", DataType::Utf8, true)],
            vec![Field::new("s", DataType::Struct(vec![Field::new("bad-name", DataType::Utf8, true)].into()), true)],
            vec![],
        ] {
            assert!(matches!(map_schema(&schema(fields), append()), Err(IngestError::InvalidColumn(_))));
        }
    }

    #[test]
    fn the_operation_column_belongs_to_cdc_modes_only() {
        let with_op =
            schema(vec![Field::new("id", DataType::Int64, false), Field::new(OP_COLUMN, DataType::Utf8, false)]);
        let without_op = schema(vec![Field::new("id", DataType::Int64, false)]);
        let key = ["id".to_string()];
        let cdc_merge = LoadSpec { write_mode: WriteMode::CdcMerge, primary_key: &key };
        let cdc_append = LoadSpec { write_mode: WriteMode::CdcAppend, primary_key: &[] };
        assert!(matches!(map_schema(&with_op, append()), Err(IngestError::InvalidOperation(_))));
        assert!(matches!(map_schema(&without_op, cdc_merge), Err(IngestError::InvalidOperation(_))));

        let merged = map_schema(&with_op, cdc_merge).unwrap();
        assert_eq!(merged.op_index, Some(1));
        assert_eq!(merged.destination_columns, vec![Column::new("id", BigQueryType::Int64)]);
        let staged: Vec<&str> = merged.staging_columns.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(staged, ["id", OP_COLUMN, SEQ_COLUMN]);

        let appended = map_schema(&with_op, cdc_append).unwrap();
        let destination: Vec<&str> = appended.destination_columns.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(destination, ["id", OP_COLUMN]);
        assert!(!appended.stages_seq);
    }

    #[test]
    fn key_columns_must_exist_and_be_eligible() {
        let fields = schema(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("at", DataType::Time64(TimeUnit::Microsecond), false),
            Field::new("raw", DataType::Binary, false),
            Field::new("n", DataType::Decimal128(10, 2), false),
            Field::new("score", DataType::Float64, true),
            Field::new("tags", DataType::List(item(DataType::Utf8)), true),
            Field::new("s", DataType::Struct(vec![Field::new("a", DataType::Int64, true)].into()), true),
        ]);
        let upsert = |key: &[String]| {
            map_schema(&fields, LoadSpec { write_mode: WriteMode::IncrementalUpsert, primary_key: key })
        };
        let eligible: Vec<String> = ["ID", "at", "raw", "n"].map(String::from).to_vec();
        let mapped = upsert(&eligible).unwrap();
        assert_eq!(mapped.key_columns, vec![("id".into(), 0), ("at".into(), 1), ("raw".into(), 2), ("n".into(), 3)]);
        for bad in ["score", "tags", "s", "missing"] {
            assert!(matches!(upsert(&[bad.to_string()]), Err(IngestError::InvalidPrimaryKey(_))), "{bad}");
        }
        assert!(matches!(upsert(&[]), Err(IngestError::InvalidPrimaryKey(_))));
    }

    #[test]
    fn schema_fingerprint_changes_with_type_nullability_or_json() {
        let a = canonical_schema_json(&Schema::new(vec![Field::new("x", DataType::Utf8, true)]));
        let b = canonical_schema_json(&Schema::new(vec![Field::new("x", DataType::LargeUtf8, true)]));
        let c = canonical_schema_json(&Schema::new(vec![Field::new("x", DataType::Utf8, false)]));
        let d = canonical_schema_json(&Schema::new(vec![
            Field::new("x", DataType::Utf8, true)
                .with_metadata(HashMap::from([(EXTENSION_NAME_KEY.to_string(), JSON_EXTENSION.to_string())])),
        ]));
        for other in [&b, &c, &d] {
            assert_ne!(schema_sha256(&a), schema_sha256(other));
        }
        assert_eq!(schema_sha256(&a), schema_sha256(&a.clone()));
    }
}
