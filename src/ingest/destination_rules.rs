//! What an existing destination table asks of each staged value beyond its type, so that a
//! publication never fails on it and never changes it: a `REQUIRED` column (or field) holds a
//! value in every row the publication writes, and a value the publication casts into an
//! existing FLOAT64 column converts exactly (INT64 within ±2^53; NUMERIC when the nearest
//! double, written in the fewest digits that read back as it, is the value sent).
//!
//! [`DestinationRules`] are built from the columns as set-up found the destination
//! (`Column::required`, `Column::published_as`, `bigquery::metadata::as_published_into`) and
//! applied to staged rows: by intake to each batch once the resource's lane has learned them
//! (the batch is refused, 422, nothing recorded), and by the lane to every upload batch before
//! it is appended (rows accepted before set-up finished: the execution fails before the
//! barrier). Each refusal names the column and the row.

use std::sync::Arc;

use arrow_array::cast::AsArray as _;
use arrow_array::types::Int64Type;
use arrow_array::{Array, ArrayRef, RecordBatch};

use super::IngestError;
use super::encode::AppendPayload;
use crate::model::WriteMode;
use crate::model::columns::{BigQueryType, Column};
use crate::model::staging::OP_COLUMN;

/// The largest magnitude up to which every INT64 has an exact FLOAT64 value (2^53).
const EXACT_INT64_IN_FLOAT64: i64 = 1 << 53;

/// Which staged rows the publication writes values from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum WrittenRows {
    All,
    /// `cdc_merge` and `history`: a delete writes no value (it removes or closes the key).
    AllButDeletes,
    /// `incremental_delete`: every row is a delete, only its key is read.
    None,
}

impl WrittenRows {
    fn of(write_mode: WriteMode) -> Self {
        match write_mode {
            WriteMode::IncrementalDelete => WrittenRows::None,
            WriteMode::CdcMerge | WriteMode::History => WrittenRows::AllButDeletes,
            _ => WrittenRows::All,
        }
    }
}

/// The checks an existing destination asks of a resource's staged rows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DestinationRules {
    /// The published columns with a constraint somewhere in them, in column order.
    constrained: Vec<Column>,
    written: WrittenRows,
}

impl DestinationRules {
    /// The rules of `published` (set-up's answer: the staged columns as the destination takes
    /// them) for a resource of `write_mode`.
    pub(crate) fn new(published: &[Column], write_mode: WriteMode) -> Arc<Self> {
        let written = WrittenRows::of(write_mode);
        let constrained = match written {
            WrittenRows::None => Vec::new(),
            _ => published.iter().filter(|c| is_constrained(c)).cloned().collect(),
        };
        Arc::new(Self { constrained, written })
    }

    /// Whether no staged value can break a rule (a new table, or one without REQUIRED columns
    /// or casts into FLOAT64).
    pub(crate) fn is_empty(&self) -> bool {
        self.constrained.is_empty()
    }

    /// Checks one staged batch whose first row is row `first_row` of its body; the first
    /// offending value (by column, then row) is the error.
    pub(crate) fn check(&self, staged: &RecordBatch, first_row: usize) -> Result<(), IngestError> {
        if self.is_empty() {
            return Ok(());
        }
        let rows = self.written_rows(staged, first_row);
        for column in &self.constrained {
            let Some(array) = staged.column_by_name(&column.staged_name()) else {
                return Err(IngestError::Arrow(format!("staged rows lack column {:?}", column.name)));
            };
            check_column(array, column, &column.name, &rows)?;
        }
        Ok(())
    }

    /// Checks every payload of one body (intake, once the lane has learned the rules).
    pub(crate) fn check_payloads(&self, payloads: &[AppendPayload]) -> Result<(), IngestError> {
        for payload in payloads {
            match &payload.batch {
                Some(batch) => self.check(batch, payload.first_row)?,
                None if self.is_empty() => {}
                None => return Err(IngestError::Arrow("a payload lacks the staged rows to check".into())),
            }
        }
        Ok(())
    }

    /// Each staged row's index in its body, `None` for a row the publication writes no value of.
    fn written_rows(&self, staged: &RecordBatch, first_row: usize) -> Vec<Option<usize>> {
        let all = (0..staged.num_rows()).map(|i| Some(first_row + i));
        let ops = staged.column_by_name(OP_COLUMN).and_then(|ops| ops.as_string_opt::<i32>().cloned());
        match (self.written, ops) {
            (WrittenRows::AllButDeletes, Some(ops)) => {
                all.zip(ops.iter()).map(|(row, op)| row.filter(|_| op != Some("delete"))).collect()
            }
            _ => all.collect(),
        }
    }
}

/// Whether the column, or a field in it, is REQUIRED or cast into FLOAT64.
fn is_constrained(column: &Column) -> bool {
    let nested = match &column.bigquery_type {
        BigQueryType::Struct(fields) => fields.iter().any(is_constrained),
        _ => false,
    };
    (column.required && !column.repeated) || casts_into_float64(column) || nested
}

/// The publication casts the column's values into FLOAT64 (the only lossy coercion).
fn casts_into_float64(column: &Column) -> bool {
    column.published_as == Some(BigQueryType::Float64) && column.bigquery_type != BigQueryType::Float64
}

/// Checks `array` (the staged values of `column`, at `path`), whose element `i` belongs to row
/// `rows[i]` (`None`: a value no row writes).
fn check_column(array: &ArrayRef, column: &Column, path: &str, rows: &[Option<usize>]) -> Result<(), IngestError> {
    if column.repeated {
        let (elements, element_rows) = list_elements(array, path, rows)?;
        return check_column(&elements, &column.element(), path, &element_rows);
    }
    if column.required
        && let Some(row) = first_written(rows, |i| array.is_null(i))
    {
        return Err(IngestError::NullInRequiredColumn { column: path.to_string(), row });
    }
    if casts_into_float64(column) {
        return check_exact_in_float64(array, column, path, rows);
    }
    let BigQueryType::Struct(fields) = &column.bigquery_type else { return Ok(()) };
    let record = array.as_struct_opt().ok_or_else(|| IngestError::Arrow(format!("{path} is not a struct")))?;
    // A NULL record holds no field values.
    let field_rows: Vec<Option<usize>> =
        rows.iter().enumerate().map(|(i, row)| row.filter(|_| record.is_valid(i))).collect();
    for field in fields.iter().filter(|f| is_constrained(f)) {
        let Some(values) = record.column_by_name(&field.staged_name()) else {
            return Err(IngestError::Arrow(format!("staged rows lack field {path}.{}", field.name)));
        };
        check_column(values, field, &format!("{path}.{}", field.name), &field_rows)?;
    }
    Ok(())
}

/// The elements of the lists in `array` (only the part its offsets cover) and the row of
/// each; the elements of a NULL list (written as an empty array) belong to no row.
fn list_elements(
    array: &ArrayRef,
    path: &str,
    rows: &[Option<usize>],
) -> Result<(ArrayRef, Vec<Option<usize>>), IngestError> {
    let list = array.as_list_opt::<i32>().ok_or_else(|| IngestError::Arrow(format!("{path} is not a list")))?;
    let offsets = list.value_offsets();
    let (first, last) = (offsets[0] as usize, offsets[offsets.len() - 1] as usize);
    let mut element_rows = vec![None; last - first];
    for (i, row) in rows.iter().enumerate() {
        if row.is_some() && list.is_valid(i) {
            let (start, end) = (offsets[i] as usize - first, offsets[i + 1] as usize - first);
            element_rows[start..end].fill(*row);
        }
    }
    Ok((list.values().slice(first, last - first), element_rows))
}

/// The row of the first element that `offends` among those some row writes.
fn first_written(rows: &[Option<usize>], offends: impl Fn(usize) -> bool) -> Option<usize> {
    rows.iter().enumerate().find_map(|(i, row)| row.filter(|_| offends(i)))
}

/// INT64 values within ±2^53 (every integer there has its own double), NUMERIC and
/// BIGNUMERIC values whose nearest double reads back as the same number.
fn check_exact_in_float64(
    array: &ArrayRef,
    column: &Column,
    path: &str,
    rows: &[Option<usize>],
) -> Result<(), IngestError> {
    let (row, reason) = match &column.bigquery_type {
        BigQueryType::Int64 => {
            let values = array.as_primitive::<Int64Type>();
            let offends = |i| values.is_valid(i) && values.value(i).unsigned_abs() > EXACT_INT64_IN_FLOAT64 as u64;
            let reason = "the table's column is FLOAT64, which holds INT64 values exactly only within ±2^53 \
                          (9,007,199,254,740,992)";
            (first_written(rows, offends), reason)
        }
        BigQueryType::Numeric | BigQueryType::BigNumeric => {
            let values =
                array.as_string_opt::<i32>().ok_or_else(|| IngestError::Arrow(format!("{path} is not text")))?;
            let offends = |i| values.is_valid(i) && !reads_back_from_float64(values.value(i));
            let reason = "the table's column is FLOAT64, and the nearest double does not read back as this \
                          decimal (more significant digits than a double holds)";
            (first_written(rows, offends), reason)
        }
        other => return Err(IngestError::Arrow(format!("{path}: no cast from {other} into FLOAT64"))),
    };
    match row {
        Some(row) => Err(IngestError::PrecisionLoss { column: path.to_string(), row, reason: reason.into() }),
        None => Ok(()),
    }
}

/// Whether the nearest double to `decimal` (Rust's parsing rounds correctly), written in the
/// fewest digits that read back as that double (`{:e}`), is the same number.
fn reads_back_from_float64(decimal: &str) -> bool {
    let Ok(double) = decimal.parse::<f64>() else { return false };
    double.is_finite() && normalized(decimal) == normalized(&format!("{double:e}"))
}

/// A decimal number as (negative, significant digits, power of ten of the last digit); zero
/// is `(false, "", 0)`. Takes plain (`-12.50`) and scientific (`1.25e1`) notation.
fn normalized(number: &str) -> Option<(bool, String, i64)> {
    let (negative, unsigned) = match number.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, number.strip_prefix('+').unwrap_or(number)),
    };
    let (mantissa, exponent) = match unsigned.split_once(['e', 'E']) {
        Some((mantissa, exponent)) => (mantissa, exponent.parse::<i64>().ok()?),
        None => (unsigned, 0),
    };
    let (integer, fraction) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let all_digits = format!("{integer}{fraction}");
    if !all_digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let significant = all_digits.trim_start_matches('0');
    let trimmed = significant.trim_end_matches('0');
    if trimmed.is_empty() {
        return Some((false, String::new(), 0));
    }
    let trailing_zeros = (significant.len() - trimmed.len()) as i64;
    Some((negative, trimmed.to_string(), exponent - fraction.len() as i64 + trailing_zeros))
}

#[cfg(test)]
#[path = "destination_rules_tests.rs"]
mod tests;
