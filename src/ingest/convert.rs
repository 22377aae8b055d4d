//! Record batches -> the staging representation: lossless conversions to the Arrow types the
//! Storage Write API expects for each staged column, rejecting values BigQuery cannot hold
//! exactly (naming column and row), checking keys and operations, and adding `_filament_seq`.
//!
//! Conversions: integers, floats, binaries and strings widen; timestamps become microseconds in
//! UTC (DATETIME without zone); TIME, NUMERIC and BIGNUMERIC become exact strings
//! (`HH:MM:SS.ffffff`, the decimal's digits); JSON strings are checked to parse; GEOGRAPHY,
//! RANGE and INTERVAL values are checked and staged by [`super::geography`],
//! [`super::range_values`] and [`super::interval`]; lists, large and fixed-size lists and maps
//! become lists, a null list an empty one. Columns are staged under their staged names
//! (`Column::staged_name`).

use std::sync::Arc;

use arrow_array::cast::AsArray as _;
use arrow_array::types::{Time32MillisecondType, Time32SecondType, Time64MicrosecondType, Time64NanosecondType};
use arrow_array::{
    Array, ArrayRef, BooleanArray, Int64Array, ListArray, MapArray, RecordBatch, StringArray, StructArray,
};
use arrow_buffer::OffsetBuffer;
use arrow_schema::{DataType, Field, TimeUnit};

use super::scalars::{self, RowOf, cast_strict, first_offending_row, invalid_value};
use super::schema::MappedSchema;
use super::{IngestError, geography, interval, range_values};
use crate::model::columns::{BigQueryType, Column};
use crate::model::staging::{OPERATIONS, staged_order};

const MICROS_PER_DAY: i64 = 86_400_000_000;

/// Converts one incoming batch; `first_row` is the index of its first row within the request
/// body, so errors name the row as the client numbered it. `_filament_seq` (when staged) holds
/// the row index only: [`super::encode::stamp_seq`] adds the batch's `seq` once it is known.
pub(crate) fn to_staging(
    batch: &RecordBatch,
    mapped: &MappedSchema,
    first_row: usize,
) -> Result<RecordBatch, IngestError> {
    let top_level = move |index: usize| first_row + index;
    for (name, index) in &mapped.key_columns {
        let array = batch.column(*index);
        if array.null_count() > 0
            && let Some(row) = (0..array.len()).find(|&i| array.is_null(i))
        {
            return Err(IngestError::NullPrimaryKey { column: name.clone(), row: first_row + row });
        }
    }
    for (name, index) in &mapped.order_columns {
        let array = batch.column(*index);
        if array.null_count() > 0
            && let Some(row) = (0..array.len()).find(|&i| array.is_null(i))
        {
            return Err(IngestError::NullOrderBy { column: name.clone(), row: first_row + row });
        }
    }
    let mut columns: Vec<ArrayRef> = Vec::with_capacity(mapped.staging_columns.len());
    for (column, index) in mapped.data_columns.iter().zip(&mapped.data_indices) {
        columns.push(stage(batch.column(*index), column, &column.name, &top_level)?);
    }
    match mapped.op_index {
        Some(index) => columns.push(operations(batch.column(index), first_row)?),
        // `history` with plain rows: every row an upsert.
        None if mapped.stages_op => columns.push(arrow_array::new_null_array(&DataType::Utf8, batch.num_rows())),
        None => {}
    }
    if mapped.stages_seq {
        let rows = (first_row..first_row + batch.num_rows()).map(|row| row as i64);
        columns.push(Arc::new(Int64Array::from_iter_values(rows)));
    }
    RecordBatch::try_new(Arc::clone(&mapped.staging), columns).map_err(|e| IngestError::Arrow(e.to_string()))
}

/// `_filament_op` as plain strings, every value one of [`OPERATIONS`].
fn operations(array: &ArrayRef, first_row: usize) -> Result<ArrayRef, IngestError> {
    let strings = cast_strict(array, &DataType::Utf8)?;
    for (row, value) in strings.as_string::<i32>().iter().enumerate() {
        match value {
            Some(op) if OPERATIONS.contains(&op) => {}
            Some(op) => {
                let shown: String = op.chars().take(20).collect();
                return Err(IngestError::InvalidOperation(format!(
                    "row {}: _filament_op {shown:?} is not one of insert, update, upsert, delete",
                    first_row + row
                )));
            }
            None => {
                return Err(IngestError::InvalidOperation(format!("row {}: _filament_op is null", first_row + row)));
            }
        }
    }
    Ok(strings)
}

/// Converts one column (or nested field) to its staged representation.
pub(super) fn stage(array: &ArrayRef, column: &Column, path: &str, row_of: RowOf<'_>) -> Result<ArrayRef, IngestError> {
    let array = match array.data_type() {
        DataType::Dictionary(_, value_type) => cast_strict(array, value_type)?,
        _ => Arc::clone(array),
    };
    if column.repeated {
        return stage_list(&array, column, path, row_of);
    }
    match &column.bigquery_type {
        BigQueryType::Struct(fields) => stage_struct(&array, fields, path, row_of),
        BigQueryType::Time => time_strings(&array, path, row_of),
        BigQueryType::Numeric | BigQueryType::BigNumeric => cast_strict(&array, &DataType::Utf8),
        BigQueryType::Geography(encoding) => geography::stage_geographies(&array, *encoding, path, row_of),
        BigQueryType::Range(element) => range_values::stage_ranges(&array, *element, path, row_of),
        BigQueryType::Interval => interval::stage_intervals(&array, path, row_of),
        BigQueryType::Json => {
            let strings = cast_strict(&array, &DataType::Utf8)?;
            for (index, value) in strings.as_string::<i32>().iter().enumerate() {
                if let Some(text) = value
                    && let Err(e) = serde_json::from_str::<serde::de::IgnoredAny>(text)
                {
                    return Err(invalid_value(path, row_of(index), format!("not valid JSON: {e}")));
                }
            }
            Ok(strings)
        }
        _ => scalars::stage_scalar(&array, column, path, row_of),
    }
}

fn stage_struct(array: &ArrayRef, fields: &[Column], path: &str, row_of: RowOf<'_>) -> Result<ArrayRef, IngestError> {
    let input = array.as_struct_opt().ok_or_else(|| IngestError::Arrow(format!("{path} is not a struct")))?;
    let children = fields
        .iter()
        .zip(input.columns())
        .map(|(field, child)| stage(child, field, &format!("{path}.{}", field.name), row_of))
        .collect::<Result<Vec<_>, _>>()?;
    let staged_fields: Vec<Field> = fields.iter().map(Column::staging_field).collect();
    let output = StructArray::try_new(staged_fields.into(), children, input.nulls().cloned())
        .map_err(|e| IngestError::Arrow(e.to_string()))?;
    Ok(Arc::new(output))
}

/// Lists, large lists, fixed-size lists and maps as a `List` of staged elements. BigQuery has
/// no NULL array: a null list is written as an empty one. A null element is refused.
fn stage_list(array: &ArrayRef, column: &Column, path: &str, row_of: RowOf<'_>) -> Result<ArrayRef, IngestError> {
    let list: ListArray = match array.data_type() {
        DataType::List(_) => array.as_list::<i32>().clone(),
        DataType::Map(..) => map_as_list(array.as_map())?,
        _ => cast_strict(array, &DataType::List(Arc::new(Field::new_list_field(array_item_type(array)?, true))))?
            .as_list::<i32>()
            .clone(),
    };
    let offsets = list.value_offsets();
    let values = list.values();
    let mut keep_all = true;
    for row in 0..list.len() {
        let (start, end) = (offsets[row] as usize, offsets[row + 1] as usize);
        if list.is_null(row) {
            keep_all &= start == end;
        } else if let Some(element) = (start..end).find(|&i| values.is_null(i)) {
            return Err(invalid_value(
                path,
                row_of(row),
                format!("element {} is null; BigQuery arrays cannot hold NULL", element - start),
            ));
        }
    }
    // Keep only the elements of non-null lists, with offsets rebuilt from 0. Only null lists
    // that still span elements need a filter; otherwise the values are one contiguous slice.
    let mut lengths = Vec::with_capacity(list.len());
    let mut mask = (!keep_all).then(|| vec![false; values.len()]);
    for row in 0..list.len() {
        let (start, end) = (offsets[row] as usize, offsets[row + 1] as usize);
        let length = if list.is_null(row) { 0 } else { end - start };
        lengths.push(length);
        if let Some(mask) = mask.as_mut() {
            mask[start..start + length].fill(true);
        }
    }
    let first = offsets.first().copied().unwrap_or(0) as usize;
    let last = offsets.last().copied().unwrap_or(0) as usize;
    let kept: ArrayRef = match mask {
        Some(mask) => arrow_select::filter::filter(values.as_ref(), &BooleanArray::from(mask))
            .map_err(|e| IngestError::Arrow(e.to_string()))?,
        None => values.slice(first, last - first),
    };
    // Elements map back to the row holding them.
    let new_offsets = OffsetBuffer::<i32>::from_lengths(lengths);
    let element_row = |index: usize| {
        let row = new_offsets.partition_point(|&o| o as usize <= index).saturating_sub(1);
        row_of(row)
    };
    let staged_values = stage(&kept, &column.element(), path, &element_row)?;
    let item = Field::new_list_field(staged_values.data_type().clone(), true);
    let output = ListArray::try_new(Arc::new(item), new_offsets, staged_values, None)
        .map_err(|e| IngestError::Arrow(e.to_string()))?;
    Ok(Arc::new(output))
}

fn array_item_type(array: &ArrayRef) -> Result<DataType, IngestError> {
    match array.data_type() {
        DataType::LargeList(item) | DataType::FixedSizeList(item, _) => Ok(item.data_type().clone()),
        other => Err(IngestError::Arrow(format!("{other} is not a list"))),
    }
}

/// A map's entries as a list of `STRUCT<key, value>`.
fn map_as_list(map: &MapArray) -> Result<ListArray, IngestError> {
    let entries = map.entries();
    let fields: Vec<Field> = entries
        .fields()
        .iter()
        .zip(["key", "value"])
        .map(|(f, name)| f.as_ref().clone().with_name(name).with_nullable(true))
        .collect();
    let renamed = StructArray::try_new(fields.into(), entries.columns().to_vec(), entries.nulls().cloned())
        .map_err(|e| IngestError::Arrow(e.to_string()))?;
    let item = Field::new_list_field(renamed.data_type().clone(), true);
    ListArray::try_new(Arc::new(item), map.offsets().clone(), Arc::new(renamed), map.nulls().cloned())
        .map_err(|e| IngestError::Arrow(e.to_string()))
}

/// TIME as `HH:MM:SS.ffffff` (what `CAST(s AS TIME)` reads exactly).
fn time_strings(array: &ArrayRef, path: &str, row_of: RowOf<'_>) -> Result<ArrayRef, IngestError> {
    let micros: Vec<Option<i64>> = match array.data_type() {
        DataType::Time32(TimeUnit::Second) => {
            array.as_primitive::<Time32SecondType>().iter().map(|v| v.map(|s| i64::from(s) * 1_000_000)).collect()
        }
        DataType::Time32(TimeUnit::Millisecond) => {
            array.as_primitive::<Time32MillisecondType>().iter().map(|v| v.map(|ms| i64::from(ms) * 1_000)).collect()
        }
        DataType::Time64(TimeUnit::Microsecond) => array.as_primitive::<Time64MicrosecondType>().iter().collect(),
        DataType::Time64(TimeUnit::Nanosecond) => {
            let values = array.as_primitive::<Time64NanosecondType>();
            if let Some(row) = first_offending_row(values.iter(), |v| v % 1_000 != 0) {
                return Err(IngestError::PrecisionLoss {
                    column: path.to_string(),
                    row: row_of(row),
                    reason: "time has non-zero nanoseconds; BigQuery TIME stores microseconds".into(),
                });
            }
            values.iter().map(|v| v.map(|ns| ns / 1_000)).collect()
        }
        other => return Err(IngestError::Arrow(format!("{other} is not a time"))),
    };
    let mut strings = Vec::with_capacity(micros.len());
    for (index, value) in micros.into_iter().enumerate() {
        strings.push(match value {
            Some(us) if !(0..MICROS_PER_DAY).contains(&us) => {
                return Err(invalid_value(path, row_of(index), "time of day outside 00:00:00 to 23:59:59.999999"));
            }
            Some(us) => Some(format_time(us)),
            None => None,
        });
    }
    Ok(Arc::new(StringArray::from(strings)))
}

fn format_time(micros: i64) -> String {
    let seconds = micros / 1_000_000;
    format!("{:02}:{:02}:{:02}.{:06}", seconds / 3600, seconds / 60 % 60, seconds % 60, micros % 1_000_000)
}

/// `_filament_seq` values for rows of batch `seq`: its row indices plus `seq << 32`.
pub(crate) fn seq_values(row_indices: &Int64Array, seq: i64) -> Int64Array {
    Int64Array::from_iter_values(row_indices.values().iter().map(|&row| staged_order(seq, row)))
}

#[cfg(test)]
#[path = "convert_tests.rs"]
mod tests;
