//! RANGE values: a `Struct{start, end}` staged as BigQuery's range literal text
//! (`[2024-01-01, UNBOUNDED)`), which the publication casts to `RANGE<DATE|DATETIME|TIMESTAMP>`.
//! `start` and `end` go through the same checks as DATE, DATETIME and TIMESTAMP columns
//! (microseconds, years 0001 to 9999); a NULL bound is unbounded; a range whose start is not
//! before its end is `invalid_value` naming the row.

use std::sync::Arc;

use arrow_array::cast::AsArray as _;
use arrow_array::types::{Date32Type, TimestampMicrosecondType};
use arrow_array::{Array, ArrayRef, StringArray};

use super::IngestError;
use super::scalars::{RowOf, invalid_value, stage_scalar};
use crate::model::columns::{BigQueryType, Column, RangeElement};

/// Days from 0001-01-01 (day 1 of the common era, for chrono) to 1970-01-01.
const UNIX_EPOCH_DAYS_FROM_CE: i32 = 719_163;

/// One bound as its staged number: days (DATE) or microseconds (DATETIME, TIMESTAMP).
fn bounds(array: &ArrayRef, element: RangeElement) -> Vec<Option<i64>> {
    match element {
        RangeElement::Date => array.as_primitive::<Date32Type>().iter().map(|d| d.map(i64::from)).collect(),
        RangeElement::Datetime | RangeElement::Timestamp => {
            array.as_primitive::<TimestampMicrosecondType>().iter().collect()
        }
    }
}

/// A bound as the range literal writes it (`UNBOUNDED` for NULL).
fn bound_text(value: Option<i64>, element: RangeElement) -> String {
    let Some(value) = value else { return "UNBOUNDED".to_string() };
    match element {
        RangeElement::Date => i32::try_from(value)
            .ok()
            .and_then(|days| chrono::NaiveDate::from_num_days_from_ce_opt(days + UNIX_EPOCH_DAYS_FROM_CE))
            .map_or_else(String::new, |date| date.format("%Y-%m-%d").to_string()),
        RangeElement::Datetime | RangeElement::Timestamp => {
            let zone = if element == RangeElement::Timestamp { "+00" } else { "" };
            chrono::DateTime::from_timestamp_micros(value)
                .map_or_else(String::new, |at| format!("{}{zone}", at.naive_utc().format("%Y-%m-%d %H:%M:%S%.6f")))
        }
    }
}

/// The staged range literals of a RANGE column.
pub(crate) fn stage_ranges(
    array: &ArrayRef,
    element: RangeElement,
    path: &str,
    row_of: RowOf<'_>,
) -> Result<ArrayRef, IngestError> {
    let input = array.as_struct_opt().ok_or_else(|| IngestError::Arrow(format!("{path} is not a struct")))?;
    let element_type = match element {
        RangeElement::Date => BigQueryType::Date,
        RangeElement::Datetime => BigQueryType::Datetime,
        RangeElement::Timestamp => BigQueryType::Timestamp,
    };
    let staged_bound = |index: usize, name: &str| {
        stage_scalar(input.column(index), &Column::new(name, element_type.clone()), &format!("{path}.{name}"), row_of)
    };
    let (starts, ends) = (bounds(&staged_bound(0, "start")?, element), bounds(&staged_bound(1, "end")?, element));
    let mut staged = Vec::with_capacity(input.len());
    for (index, (start, end)) in starts.into_iter().zip(ends).enumerate() {
        if input.is_null(index) {
            staged.push(None);
            continue;
        }
        if let (Some(start), Some(end)) = (start, end)
            && start >= end
        {
            let (shown_start, shown_end) = (bound_text(Some(start), element), bound_text(Some(end), element));
            return Err(invalid_value(
                path,
                row_of(index),
                format!("range start {shown_start} is not before its end {shown_end}"),
            ));
        }
        staged.push(Some(format!("[{}, {})", bound_text(start, element), bound_text(end, element))));
    }
    Ok(Arc::new(StringArray::from(staged)))
}

#[cfg(test)]
mod tests {
    use arrow_array::{Date32Array, StructArray, TimestampNanosecondArray};
    use arrow_buffer::NullBuffer;
    use arrow_schema::Field;

    use super::*;

    fn range(start: ArrayRef, end: ArrayRef, nulls: Option<NullBuffer>) -> ArrayRef {
        let fields = vec![
            Field::new("start", start.data_type().clone(), true),
            Field::new("end", end.data_type().clone(), true),
        ];
        Arc::new(StructArray::try_new(fields.into(), vec![start, end], nulls).unwrap())
    }

    fn staged(array: &ArrayRef, element: RangeElement) -> Result<Vec<Option<String>>, IngestError> {
        let out = stage_ranges(array, element, "r", &|row| row)?;
        Ok(out.as_string::<i32>().iter().map(|v| v.map(str::to_string)).collect())
    }

    #[test]
    fn ranges_stage_as_literals_with_unbounded_ends() {
        let start = Arc::new(Date32Array::from(vec![Some(19_723), None, Some(0), Some(1)])) as ArrayRef;
        let end = Arc::new(Date32Array::from(vec![Some(19_754), Some(0), None, Some(2)])) as ArrayRef;
        let nulls = Some(NullBuffer::from(vec![true, true, true, false]));
        let s = |v: &str| Some(v.to_string());
        assert_eq!(
            staged(&range(start, end, nulls), RangeElement::Date).unwrap(),
            vec![s("[2024-01-01, 2024-02-01)"), s("[UNBOUNDED, 1970-01-01)"), s("[1970-01-01, UNBOUNDED)"), None]
        );
        let utc = |v: Vec<Option<i64>>| Arc::new(TimestampNanosecondArray::from(v).with_timezone("UTC")) as ArrayRef;
        let timestamps = range(utc(vec![Some(1_000)]), utc(vec![None]), None);
        assert_eq!(
            staged(&timestamps, RangeElement::Timestamp).unwrap(),
            vec![s("[1970-01-01 00:00:00.000001+00, UNBOUNDED)")]
        );
        let naive = |v: Vec<Option<i64>>| Arc::new(TimestampNanosecondArray::from(v)) as ArrayRef;
        let datetimes = range(naive(vec![Some(-1_000)]), naive(vec![Some(0)]), None);
        assert_eq!(
            staged(&datetimes, RangeElement::Datetime).unwrap(),
            vec![s("[1969-12-31 23:59:59.999999, 1970-01-01 00:00:00.000000)")]
        );
    }

    #[test]
    fn an_inverted_or_empty_range_and_a_lossy_bound_are_refused_naming_the_row() {
        let start = Arc::new(Date32Array::from(vec![1, 5])) as ArrayRef;
        let end = Arc::new(Date32Array::from(vec![2, 5])) as ArrayRef;
        match staged(&range(start, end, None), RangeElement::Date) {
            Err(IngestError::InvalidValue { column, row, reason }) => {
                assert_eq!((column.as_str(), row), ("r", 1));
                assert!(reason.contains("not before its end"), "{reason}");
            }
            other => panic!("{other:?}"),
        }
        let naive = |v: Vec<Option<i64>>| Arc::new(TimestampNanosecondArray::from(v)) as ArrayRef;
        let lossy = range(naive(vec![Some(1)]), naive(vec![None]), None);
        assert!(matches!(
            staged(&lossy, RangeElement::Datetime),
            Err(IngestError::PrecisionLoss { column, .. }) if column == "r.start"
        ));
    }
}
