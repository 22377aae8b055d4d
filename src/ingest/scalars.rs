//! What converting any one value shares (the row an index stands for, strict casts, the
//! refusal naming column and row), and the scalar types' staging: widened to the staged Arrow
//! type exactly, timestamps and dates checked for BigQuery's precision and range. Imported by
//! [`super::convert`] and by the typed values it hands columns to ([`super::geography`],
//! [`super::interval`], [`super::range_values`]), which import nothing of it in return.

use std::sync::Arc;

use arrow_array::ArrayRef;
use arrow_array::cast::AsArray as _;
use arrow_array::types::{Date32Type, Date64Type, TimestampMicrosecondType, TimestampNanosecondType};
use arrow_cast::{CastOptions, cast_with_options};
use arrow_schema::{DataType, TimeUnit};

use super::IngestError;
use crate::model::columns::Column;

pub(super) const MILLIS_PER_DAY: i64 = 86_400_000;

/// Maps an index of the array being converted to the row of the request body.
pub(crate) type RowOf<'a> = &'a dyn Fn(usize) -> usize;

pub(super) fn cast_strict(array: &ArrayRef, to: &DataType) -> Result<ArrayRef, IngestError> {
    let strict = CastOptions { safe: false, ..Default::default() };
    cast_with_options(array, to, &strict).map_err(|e| IngestError::Arrow(e.to_string()))
}

pub(super) fn invalid_value(path: &str, row: usize, reason: impl Into<String>) -> IngestError {
    IngestError::InvalidValue { column: path.to_string(), row, reason: reason.into() }
}

/// A scalar column (or a RANGE's bound) cast exactly to its staged type, its timestamps and
/// dates checked for BigQuery's precision and range. A dictionary is read as its values.
pub(super) fn stage_scalar(
    array: &ArrayRef,
    column: &Column,
    path: &str,
    row_of: RowOf<'_>,
) -> Result<ArrayRef, IngestError> {
    let array = match array.data_type() {
        DataType::Dictionary(_, value_type) => cast_strict(array, value_type)?,
        _ => Arc::clone(array),
    };
    let scalar = &column.bigquery_type;
    check_precision(path, &array, row_of)?;
    let target = column.staging_field().data_type().clone();
    let staged = if array.data_type() == &target {
        array
    } else {
        let strict = CastOptions { safe: false, ..Default::default() };
        cast_with_options(&array, &target, &strict).map_err(|e| IngestError::PrecisionLoss {
            column: path.to_string(),
            row: row_of(0),
            reason: format!("cannot convert {} to {scalar}: {e}", array.data_type()),
        })?
    };
    check_range(path, &staged, row_of)?;
    Ok(staged)
}

/// BigQuery's ranges: "DATE: 0001-01-01 to 9999-12-31", "DATETIME: 0001-01-01 00:00:00 to
/// 9999-12-31 23:59:59.999999", "TIMESTAMP: 0001-01-01 00:00:00 to 9999-12-31 23:59:59.999999
/// UTC" (GoogleSQL reference, Data types), in days and
/// microseconds since the epoch. A staged value outside them would make BigQuery refuse the
/// append (and its key range could not be written as a literal).
pub(super) const MIN_DATE_DAYS: i32 = -719_162;
pub(super) const MAX_DATE_DAYS: i32 = 2_932_896;
pub(super) const MIN_TIMESTAMP_MICROS: i64 = -62_135_596_800_000_000;
pub(super) const MAX_TIMESTAMP_MICROS: i64 = 253_402_300_799_999_999;

fn check_range(path: &str, staged: &ArrayRef, row_of: RowOf<'_>) -> Result<(), IngestError> {
    let offending = match staged.data_type() {
        DataType::Date32 => staged
            .as_primitive::<Date32Type>()
            .iter()
            .position(|v| v.is_some_and(|days| !(MIN_DATE_DAYS..=MAX_DATE_DAYS).contains(&days))),
        DataType::Timestamp(TimeUnit::Microsecond, _) => {
            first_offending_row(staged.as_primitive::<TimestampMicrosecondType>().iter(), |micros| {
                !(MIN_TIMESTAMP_MICROS..=MAX_TIMESTAMP_MICROS).contains(&micros)
            })
        }
        _ => None,
    };
    match offending {
        Some(row) => Err(invalid_value(path, row_of(row), "outside BigQuery's range, years 0001 to 9999")),
        None => Ok(()),
    }
}

/// BigQuery stores microseconds and whole days: reject sub-microsecond timestamps and Date64
/// values that are not whole days instead of truncating them silently.
fn check_precision(path: &str, array: &ArrayRef, row_of: RowOf<'_>) -> Result<(), IngestError> {
    let (offending, reason) = match array.data_type() {
        DataType::Timestamp(TimeUnit::Nanosecond, _) => (
            first_offending_row(array.as_primitive::<TimestampNanosecondType>().iter(), |v| v % 1_000 != 0),
            "timestamp has non-zero nanoseconds; BigQuery stores microseconds",
        ),
        DataType::Date64 => (
            first_offending_row(array.as_primitive::<Date64Type>().iter(), |v| v % MILLIS_PER_DAY != 0),
            "Date64 value is not a whole day; BigQuery DATE has no time of day",
        ),
        _ => (None, ""),
    };
    match offending {
        Some(row) => {
            Err(IngestError::PrecisionLoss { column: path.to_string(), row: row_of(row), reason: reason.into() })
        }
        None => Ok(()),
    }
}

pub(super) fn first_offending_row(
    values: impl Iterator<Item = Option<i64>>,
    offends: impl Fn(i64) -> bool,
) -> Option<usize> {
    values.enumerate().find_map(|(row, v)| v.filter(|v| offends(*v)).map(|_| row))
}
