//! Record batches -> the staging representation: lossless casts to the Arrow types the Storage
//! Write API expects for each BigQuery column, rejecting values BigQuery cannot hold exactly.

use std::sync::Arc;

use arrow_array::cast::AsArray as _;
use arrow_array::types::{Date64Type, TimestampNanosecondType};
use arrow_array::{Array, ArrayRef, RecordBatch};
use arrow_cast::{CastOptions, cast_with_options};
use arrow_schema::{DataType, TimeUnit};

use super::IngestError;
use super::schema::MappedSchema;

const MILLIS_PER_DAY: i64 = 86_400_000;

/// Converts one incoming batch; `first_row` is the index of its first row within the request
/// body, so errors name the row as the client numbered it.
pub fn to_staging(batch: &RecordBatch, mapped: &MappedSchema, first_row: usize) -> Result<RecordBatch, IngestError> {
    let strict = CastOptions { safe: false, ..Default::default() };
    let mut columns: Vec<ArrayRef> = Vec::with_capacity(batch.num_columns());
    for (index, column) in mapped.columns.iter().enumerate() {
        let mut array = Arc::clone(batch.column(index));
        if let DataType::Dictionary(_, value_type) = array.data_type() {
            let value_type = value_type.as_ref().clone();
            array = cast_with_options(&array, &value_type, &strict).map_err(|e| IngestError::Arrow(e.to_string()))?;
        }
        check_precision(&column.name, &array, first_row)?;
        let target = column.bigquery_type.staging_arrow_type();
        if array.data_type() != &target {
            array = cast_with_options(&array, &target, &strict).map_err(|e| IngestError::PrecisionLoss {
                column: column.name.clone(),
                row: first_row,
                reason: format!("cannot convert {} to {target}: {e}", array.data_type()),
            })?;
        }
        columns.push(array);
    }
    RecordBatch::try_new(Arc::clone(&mapped.staging), columns).map_err(|e| IngestError::Arrow(e.to_string()))
}

/// BigQuery stores microseconds and whole days: reject sub-microsecond timestamps and Date64
/// values that are not whole days instead of truncating them silently.
fn check_precision(column: &str, array: &ArrayRef, first_row: usize) -> Result<(), IngestError> {
    match array.data_type() {
        DataType::Timestamp(TimeUnit::Nanosecond, _) => {
            let values = array.as_primitive::<TimestampNanosecondType>();
            if let Some(row) = first_offending_row(values.iter(), |v| v % 1_000 != 0) {
                return Err(IngestError::PrecisionLoss {
                    column: column.to_string(),
                    row: first_row + row,
                    reason: "timestamp has non-zero nanoseconds; BigQuery stores microseconds".into(),
                });
            }
        }
        DataType::Date64 => {
            let values = array.as_primitive::<Date64Type>();
            if let Some(row) = first_offending_row(values.iter(), |v| v % MILLIS_PER_DAY != 0) {
                return Err(IngestError::PrecisionLoss {
                    column: column.to_string(),
                    row: first_row + row,
                    reason: "Date64 value is not a whole day; BigQuery DATE has no time of day".into(),
                });
            }
        }
        _ => {}
    }
    Ok(())
}

fn first_offending_row(values: impl Iterator<Item = Option<i64>>, offends: impl Fn(i64) -> bool) -> Option<usize> {
    values.enumerate().find_map(|(row, v)| v.filter(|v| offends(*v)).map(|_| row))
}

#[cfg(test)]
mod tests {
    use arrow_array::types::Int32Type;
    use arrow_array::{Date64Array, DictionaryArray, Int8Array, StringArray, TimestampNanosecondArray};
    use arrow_schema::{Field, Schema};

    use super::*;
    use crate::ingest::schema::map_schema;

    fn batch(fields: Vec<Field>, columns: Vec<ArrayRef>) -> RecordBatch {
        RecordBatch::try_new(Arc::new(Schema::new(fields)), columns).unwrap()
    }

    #[test]
    fn converts_to_the_staging_types_losslessly() {
        let dict: DictionaryArray<Int32Type> = vec!["x", "y", "x"].into_iter().collect();
        let input = batch(
            vec![
                Field::new("small", DataType::Int8, true),
                Field::new("ts", DataType::Timestamp(TimeUnit::Nanosecond, Some("+01:00".into())), true),
                Field::new("tag", dict.data_type().clone(), true),
            ],
            vec![
                Arc::new(Int8Array::from(vec![Some(1), None, Some(-3)])),
                Arc::new(
                    TimestampNanosecondArray::from(vec![Some(1_000), Some(2_000_000), None]).with_timezone("+01:00"),
                ),
                Arc::new(dict),
            ],
        );
        let mapped = map_schema(&input.schema()).unwrap();
        let staged = to_staging(&input, &mapped, 0).unwrap();
        assert_eq!(staged.schema(), mapped.staging);
        let ts = staged.column(1).as_primitive::<arrow_array::types::TimestampMicrosecondType>();
        assert_eq!(ts.iter().collect::<Vec<_>>(), vec![Some(1), Some(2_000), None]);
        let tag: &StringArray = staged.column(2).as_string::<i32>();
        assert_eq!(tag.iter().collect::<Vec<_>>(), vec![Some("x"), Some("y"), Some("x")]);
    }

    #[test]
    fn rejects_nanoseconds_and_partial_days_naming_the_row() {
        let input = batch(
            vec![Field::new("ts", DataType::Timestamp(TimeUnit::Nanosecond, None), true)],
            vec![Arc::new(TimestampNanosecondArray::from(vec![Some(1_000), None, Some(1_001)]))],
        );
        let mapped = map_schema(&input.schema()).unwrap();
        match to_staging(&input, &mapped, 10).unwrap_err() {
            IngestError::PrecisionLoss { column, row, .. } => assert_eq!((column.as_str(), row), ("ts", 12)),
            other => panic!("{other:?}"),
        }
        let input = batch(
            vec![Field::new("d", DataType::Date64, true)],
            vec![Arc::new(Date64Array::from(vec![MILLIS_PER_DAY, MILLIS_PER_DAY + 1]))],
        );
        let mapped = map_schema(&input.schema()).unwrap();
        assert!(matches!(to_staging(&input, &mapped, 0), Err(IngestError::PrecisionLoss { row: 1, .. })));
    }
}
