//! Schema validation and the Arrow -> BigQuery column mapping (the table in
//! `docs/type-mapping.md`), plus the staging layout each write mode needs.
//!
//! Every destination column is created NULLABLE (REPEATED for lists), whatever the Arrow
//! nullability, so later segments and schema evolution never hit BigQuery's REQUIRED rules.
//! TIME, NUMERIC, BIGNUMERIC and JSON values are staged as lossless strings and converted by the
//! publication query (`publish::sql`); everything else is staged in its final type.
//! Keyed modes stage `_filament_seq` (order of the row within the execution), CDC modes stage
//! `_filament_op` (the staging contract is `model::staging`).

use std::collections::HashSet;
use std::sync::Arc;

use arrow_schema::{DataType, Field, Schema, SchemaRef};
use sha2::{Digest as _, Sha256};

use self::typed::Marked;
use super::IngestError;
use crate::model::WriteMode;
use crate::model::columns::{BigQueryType, Column, MAX_COLUMNS, MAX_KEY_COLUMNS, MAX_RECORD_DEPTH, same_name};
use crate::model::ids::validate_column_name;
use crate::model::staging::{OP_COLUMN, SEQ_COLUMN};

/// NUMERIC holds 29 integer digits and 9 decimals; BIGNUMERIC 38 and 38 (its full range is
/// 76.76 digits, but only up to 38 integer digits for every value).
const NUMERIC_INTEGER_DIGITS: i16 = 29;
const NUMERIC_SCALE: i8 = 9;
const BIGNUMERIC_INTEGER_DIGITS: i16 = 38;
const BIGNUMERIC_SCALE: i8 = 38;

/// What a resource declares that shapes its staging: the write mode, the primary key and the
/// columns ordering its changes (`order_by`, keyed modes; empty: arrival order).
#[derive(Debug, Clone, Copy)]
pub struct LoadSpec<'a> {
    pub write_mode: WriteMode,
    pub primary_key: &'a [String],
    pub order_by: &'a [String],
}

/// A validated batch schema: the incoming Arrow schema, its BigQuery columns and the staging
/// layout.
#[derive(Debug, Clone)]
pub struct MappedSchema {
    pub(crate) incoming: SchemaRef,
    /// The client's data columns (without `_filament_op`), in incoming order.
    pub(crate) data_columns: Vec<Column>,
    /// Position of each data column in the incoming schema.
    pub(crate) data_indices: Vec<usize>,
    /// Position of `_filament_op` in the incoming schema (CDC modes).
    pub(crate) op_index: Option<usize>,
    /// Key columns as named in the schema, in key order, with their incoming positions.
    pub(crate) key_columns: Vec<(String, usize)>,
    /// `order_by` columns as named in the schema, in declared order, with their incoming
    /// positions (never NULL in a batch).
    pub(crate) order_columns: Vec<(String, usize)>,
    /// Columns of the destination table: the data columns, plus `_filament_op` for `cdc_append`.
    pub(crate) destination_columns: Vec<Column>,
    /// Columns of the staging table: staged data columns, then `_filament_op`, `_filament_seq`.
    pub(crate) staging_columns: Vec<Column>,
    /// The Arrow schema staged rows are written with (matches `staging_columns`).
    pub(crate) staging: SchemaRef,
    /// Whether `_filament_seq` is staged (the MERGE modes).
    pub(crate) stages_seq: bool,
    /// Whether `_filament_op` is staged: the CDC modes', and `history`'s always (NULL, meaning
    /// upserts, when its batches send plain rows).
    pub(crate) stages_op: bool,
}

impl MappedSchema {
    /// Canonical JSON of the incoming schema (names, Arrow types, nullability): what every later
    /// batch of the resource in this delivery must repeat.
    pub(crate) fn canonical_json(&self) -> serde_json::Value {
        canonical_schema_json(&self.incoming)
    }
}

pub(crate) fn canonical_schema_json(schema: &Schema) -> serde_json::Value {
    serde_json::Value::Array(
        schema
            .fields()
            .iter()
            .map(|f| {
                let mut entry = serde_json::json!({"name": f.name(), "type": f.data_type().to_string(), "nullable": f.is_nullable()});
                match typed::marked(f.name(), f) {
                    Ok(Some(Marked::Json)) => entry["json"] = serde_json::Value::Bool(true),
                    Ok(Some(other)) => entry["marked"] = other.canonical_name().into(),
                    Ok(None) | Err(_) => {}
                }
                entry
            })
            .collect(),
    )
}

/// SHA-256 (hex) of the canonical schema JSON.
pub(crate) fn schema_sha256(canonical: &serde_json::Value) -> String {
    hex::encode(Sha256::digest(canonical.to_string().as_bytes()))
}

pub(super) fn unsupported(column: &str, data_type: &DataType, reason: impl Into<String>) -> IngestError {
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
pub(crate) fn bigquery_column(path: &str, field: &Field) -> Result<Column, IngestError> {
    let data_type = field.data_type();
    let name = field.name().clone();
    let marked = typed::marked(path, field)?;
    let is_container = matches!(
        data_type,
        DataType::List(_) | DataType::LargeList(_) | DataType::FixedSizeList(..) | DataType::Map(..)
    );
    if marked.is_some() && (is_container || matches!(data_type, DataType::Struct(_)) && marked != Some(Marked::Range)) {
        return Err(unsupported(
            path,
            data_type,
            "a JSON or GEOGRAPHY mark belongs on a string or binary field (for an array, on its item field), \
             a RANGE mark on a struct of start and end",
        ));
    }
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
            if matches!(element.bigquery_type, BigQueryType::Range(_) | BigQueryType::Interval) {
                return Err(unsupported(path, data_type, repeated_range_or_interval(&element.bigquery_type)));
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
        DataType::Struct(children) if marked == Some(Marked::Range) => {
            Ok(Column::new(name, typed::range_type(path, data_type, children)?))
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
                if !seen.insert(child.name().to_lowercase()) {
                    return Err(IngestError::InvalidColumn(format!("field {child_path:?} appears twice")));
                }
                fields.push(bigquery_column(&child_path, child)?);
            }
            Ok(Column::new(name, BigQueryType::Struct(fields)))
        }
        scalar => match marked {
            Some(marked) => Ok(Column::new(name, typed::marked_scalar(path, scalar, marked)?)),
            None => Ok(Column::new(name, scalar_type(path, scalar)?)),
        },
    }
}

/// Why an ARRAY of RANGE or INTERVAL is refused: nothing shows that `tables.insert` takes a
/// REPEATED field of these types (BigQuery's discovery document lists RANGE without a word on
/// REPEATED ranges and does not list INTERVAL; the documentation of repeated columns names
/// neither), and the emulator accepting one proves nothing (docs/type-mapping.md).
fn repeated_range_or_interval(element: &BigQueryType) -> String {
    format!(
        "ARRAY<{element}>: BigQuery documents no REPEATED {} column for tables.insert; send each value in a \
         struct field (ARRAY<STRUCT<...>>) or as separate columns",
        element.type_name()
    )
}

fn scalar_type(path: &str, data_type: &DataType) -> Result<BigQueryType, IngestError> {
    Ok(match data_type {
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
        DataType::Timestamp(_, Some(zone)) if zone.chars().any(char::is_control) => {
            return Err(unsupported(path, data_type, "the time zone name holds control characters"));
        }
        DataType::Timestamp(_, Some(_)) => BigQueryType::Timestamp,
        DataType::Timestamp(_, None) => BigQueryType::Datetime,
        DataType::Decimal32(precision, scale)
        | DataType::Decimal64(precision, scale)
        | DataType::Decimal128(precision, scale)
        | DataType::Decimal256(precision, scale) => decimal_type(path, data_type, *precision, *scale)?,
        DataType::Interval(_) | DataType::Duration(_) => BigQueryType::Interval,
        DataType::ListView(_) | DataType::LargeListView(_) => {
            return Err(unsupported(path, data_type, "list views are not supported; send a List"));
        }
        _ => return Err(unsupported(path, data_type, "BigQuery has no column type for it")),
    })
}

/// Refuses a schema with a column the gateway cannot load (its type, a mark on the wrong type, a
/// nested field's name): what [`map_schema`] refuses column by column, whatever the write mode.
/// The framing ([`super::framing`]) runs it on the schema message, before any record batch of
/// the stream is decoded, so such a stream is refused by name even where arrow-ipc would fail
/// on its batches (it panics on union buffers that are not aligned).
pub(crate) fn refuse_unloadable_columns(schema: &Schema) -> Result<(), IngestError> {
    schema.fields().iter().try_for_each(|field| bigquery_column(field.name(), field).map(drop))
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
    let incoming = incoming_columns(schema, spec.write_mode)?;
    check_table_limits(schema, &incoming.data_columns)?;
    let key_columns = key_columns(spec, &incoming.data_columns, &incoming.data_indices)?;
    let order_columns = order_columns(spec, &incoming.data_columns, &incoming.data_indices)?;
    let mut mapped = staging_layout(schema, spec.write_mode, incoming, key_columns);
    mapped.order_columns = order_columns;
    Ok(mapped)
}

/// BigQuery's limits on a table's shape ([`MAX_COLUMNS`] counting nested fields,
/// [`MAX_RECORD_DEPTH`]), refused here rather than by `tables.insert` once rows are staged.
fn check_table_limits(schema: &Schema, columns: &[Column]) -> Result<(), IngestError> {
    let count: usize = columns.iter().map(Column::column_count).sum();
    if count > MAX_COLUMNS {
        return Err(IngestError::InvalidColumn(format!(
            "the schema has {count} columns counting nested fields; BigQuery allows at most {MAX_COLUMNS}"
        )));
    }
    for (column, field) in columns.iter().zip(schema.fields().iter().filter(|f| f.name() != OP_COLUMN)) {
        let depth = column.record_depth();
        if depth > MAX_RECORD_DEPTH {
            return Err(unsupported(
                &column.name,
                field.data_type(),
                format!("it nests {depth} levels of STRUCT; BigQuery allows at most {MAX_RECORD_DEPTH}"),
            ));
        }
    }
    Ok(())
}

/// The client's columns of one schema: data columns (validated and mapped) and `_filament_op`.
struct IncomingColumns {
    data_columns: Vec<Column>,
    data_indices: Vec<usize>,
    op_index: Option<usize>,
}

fn incoming_columns(schema: &Schema, write_mode: WriteMode) -> Result<IncomingColumns, IngestError> {
    let cdc = matches!(write_mode, WriteMode::CdcAppend | WriteMode::CdcMerge);
    let takes_op = cdc || write_mode == WriteMode::History;
    let mut seen = HashSet::with_capacity(schema.fields().len());
    let mut incoming = IncomingColumns {
        data_columns: Vec::with_capacity(schema.fields().len()),
        data_indices: Vec::with_capacity(schema.fields().len()),
        op_index: None,
    };
    for (index, field) in schema.fields().iter().enumerate() {
        if field.name() == OP_COLUMN {
            check_operation_field(field, write_mode, takes_op)?;
            incoming.op_index = Some(index);
            continue;
        }
        validate_column_name(field.name()).map_err(|p| IngestError::InvalidColumn(p.detail))?;
        if !seen.insert(field.name().to_lowercase()) {
            return Err(IngestError::InvalidColumn(format!(
                "column {:?} appears twice (BigQuery column names are case-insensitive)",
                field.name()
            )));
        }
        incoming.data_columns.push(bigquery_column(field.name(), field)?);
        incoming.data_indices.push(index);
    }
    if cdc && incoming.op_index.is_none() {
        return Err(IngestError::InvalidOperation(format!(
            "write mode {write_mode} needs a {OP_COLUMN} column (insert, update, upsert or delete per row)"
        )));
    }
    if incoming.data_columns.is_empty() {
        return Err(IngestError::InvalidColumn("the schema has no data columns".into()));
    }
    Ok(incoming)
}

/// `_filament_op` belongs to the CDC modes and `history` only, as a string column.
fn check_operation_field(field: &Field, write_mode: WriteMode, takes_op: bool) -> Result<(), IngestError> {
    if !takes_op {
        return Err(IngestError::InvalidOperation(format!(
            "write mode {write_mode} takes no {OP_COLUMN} column (only cdc_append, cdc_merge and history do)"
        )));
    }
    let string_like = |t: &DataType| matches!(t, DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View);
    let ok = match field.data_type() {
        DataType::Dictionary(_, value) => string_like(value),
        other => string_like(other),
    };
    if ok {
        Ok(())
    } else {
        Err(IngestError::InvalidOperation(format!("{OP_COLUMN} must be a string column, not {}", field.data_type())))
    }
}

/// The destination and staging columns of a validated schema.
fn staging_layout(
    schema: &SchemaRef,
    write_mode: WriteMode,
    incoming: IncomingColumns,
    key_columns: Vec<(String, usize)>,
) -> MappedSchema {
    let IncomingColumns { data_columns, data_indices, op_index } = incoming;
    let op_column = Column::new(OP_COLUMN, BigQueryType::String);
    let mut destination_columns = data_columns.clone();
    if write_mode == WriteMode::CdcAppend {
        destination_columns.push(op_column.clone());
    }
    let stages_seq = write_mode.is_merge();
    let mut staging_columns: Vec<Column> = data_columns.iter().map(Column::staged).collect();
    let stages_op = op_index.is_some() || write_mode == WriteMode::History;
    if stages_op {
        staging_columns.push(op_column);
    }
    if stages_seq {
        staging_columns.push(Column::new(SEQ_COLUMN, BigQueryType::Int64));
    }
    let staging = Arc::new(Schema::new(staging_columns.iter().map(Column::staging_field).collect::<Vec<_>>()));
    MappedSchema {
        incoming: Arc::clone(schema),
        data_columns,
        data_indices,
        op_index,
        key_columns,
        order_columns: Vec::new(),
        destination_columns,
        staging_columns,
        staging,
        stages_seq,
        stages_op,
    }
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
            let position = data_columns.iter().position(|c| same_name(&c.name, key)).ok_or_else(|| {
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

/// The declared `order_by` resolved against the schema: every column present, top-level, not
/// repeated and of an ordered type BigQuery compares (INT64, NUMERIC, BIGNUMERIC, DATE,
/// DATETIME, TIMESTAMP, STRING).
fn order_columns(
    spec: LoadSpec<'_>,
    data_columns: &[Column],
    data_indices: &[usize],
) -> Result<Vec<(String, usize)>, IngestError> {
    spec.order_by
        .iter()
        .map(|name| {
            let position = data_columns.iter().position(|c| same_name(&c.name, name)).ok_or_else(|| {
                IngestError::InvalidOrderBy(format!("order_by column {name:?} is not in the batch's schema"))
            })?;
            let column = &data_columns[position];
            if column.repeated || !column.bigquery_type.is_orderable() {
                return Err(IngestError::InvalidOrderBy(format!(
                    "order_by column {name:?} is {}; order by INT64, NUMERIC, BIGNUMERIC, DATE, DATETIME, TIMESTAMP or STRING",
                    column.sql_type()
                )));
            }
            Ok((column.name.clone(), data_indices[position]))
        })
        .collect()
}

#[cfg(test)]
mod tests;
pub(crate) mod typed;
