//! The key ranges of one batch request (`model::key_ranges`), computed from its staged rows while
//! it is ingested, so publication needs no extra query to bound its MERGE.

use arrow_array::cast::AsArray as _;
use arrow_array::types::{Date32Type, Int64Type, TimestampMicrosecondType};
use arrow_array::{Array, RecordBatch};
use arrow_schema::{DataType, TimeUnit};

use super::encode::AppendPayload;
use super::schema::MappedSchema;
use crate::model::columns::BigQueryType;
use crate::model::key_ranges::{KeyRange, KeyValue};

/// The range of every key column whose BigQuery type is staged as itself and ordered the same
/// way here and in BigQuery (INT64, STRING, DATE, DATETIME, TIMESTAMP) over the staged rows of
/// `payloads`; empty for unkeyed modes or no rows. NUMERIC, BIGNUMERIC and TIME keys are
/// staged as strings, whose order is not theirs: they get no range.
pub(crate) fn key_ranges(payloads: &[AppendPayload], mapped: &MappedSchema) -> Vec<KeyRange> {
    let batches: Vec<&RecordBatch> = payloads.iter().filter_map(|p| p.batch.as_ref()).collect();
    if batches.len() != payloads.len() || batches.iter().all(|b| b.num_rows() == 0) {
        return Vec::new();
    }
    // The staged batches hold each key under its staged name (`Column::staged_name`); the
    // range is recorded under the destination's.
    let ordered = |name: &str| {
        mapped.data_columns.iter().find(|c| c.name == name).filter(|c| {
            !c.repeated
                && matches!(
                    c.bigquery_type,
                    BigQueryType::Int64
                        | BigQueryType::String
                        | BigQueryType::Date
                        | BigQueryType::Datetime
                        | BigQueryType::Timestamp
                )
        })
    };
    mapped
        .key_columns
        .iter()
        .filter_map(|(name, _)| ordered(name))
        .filter_map(|column| column_range(&batches, &column.name, &column.staged_name()))
        .collect()
}

fn column_range(batches: &[&RecordBatch], name: &str, staged_name: &str) -> Option<KeyRange> {
    let mut range: Option<KeyRange> = None;
    for batch in batches {
        let column = batch.column_by_name(staged_name)?;
        let (min, max) = min_max(column.as_ref())?;
        let this = KeyRange { column: name.to_string(), min, max };
        match range.as_mut() {
            Some(range) => {
                if !range.widen(&this) {
                    return None;
                }
            }
            None => range = Some(this),
        }
    }
    range
}

/// Smallest and largest non-null value of a staged key column, when its type is ordered here.
fn min_max(array: &dyn Array) -> Option<(KeyValue, KeyValue)> {
    fn bounds<T: Ord + Copy>(values: impl Iterator<Item = Option<T>>) -> Option<(T, T)> {
        values.flatten().fold(None, |acc, v| Some(acc.map_or((v, v), |(lo, hi): (T, T)| (lo.min(v), hi.max(v)))))
    }
    match array.data_type() {
        DataType::Int64 => {
            bounds(array.as_primitive::<Int64Type>().iter()).map(|(lo, hi)| (KeyValue::Int64(lo), KeyValue::Int64(hi)))
        }
        DataType::Date32 => {
            bounds(array.as_primitive::<Date32Type>().iter()).map(|(lo, hi)| (KeyValue::Date(lo), KeyValue::Date(hi)))
        }
        DataType::Timestamp(TimeUnit::Microsecond, zone) => {
            let (lo, hi) = bounds(array.as_primitive::<TimestampMicrosecondType>().iter())?;
            Some(match zone {
                Some(_) => (KeyValue::Timestamp(lo), KeyValue::Timestamp(hi)),
                None => (KeyValue::Datetime(lo), KeyValue::Datetime(hi)),
            })
        }
        DataType::Utf8 => {
            let strings = array.as_string::<i32>();
            let mut values = strings.iter().flatten();
            let first = values.next()?;
            let (lo, hi) = values.fold((first, first), |(lo, hi), v| {
                (if v.as_bytes() < lo.as_bytes() { v } else { lo }, if v.as_bytes() > hi.as_bytes() { v } else { hi })
            });
            Some((KeyValue::String(lo.to_string()), KeyValue::String(hi.to_string())))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow_array::{Float64Array, Int64Array, StringArray};
    use arrow_schema::{Field, Schema};

    use super::*;
    use crate::ingest::encode::record_batch_message;
    use crate::ingest::schema::{LoadSpec, map_schema};
    use crate::model::WriteMode;

    fn payload(ids: Vec<i64>, names: Vec<&str>) -> (AppendPayload, Arc<Schema>) {
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("name", DataType::Utf8, false),
            Field::new("score", DataType::Float64, true),
        ]));
        let rows = ids.len();
        let batch = RecordBatch::try_new(
            Arc::clone(&schema),
            vec![
                Arc::new(Int64Array::from(ids)),
                Arc::new(StringArray::from(names)),
                Arc::new(Float64Array::from(vec![0.5; rows])),
            ],
        )
        .unwrap();
        (
            AppendPayload {
                rows,
                first_row: 0,
                serialized_record_batch: record_batch_message(&batch).unwrap(),
                batch: Some(batch),
            },
            schema,
        )
    }

    #[test]
    fn ranges_cover_every_payload_for_ordered_key_types_only() {
        let (a, schema) = payload(vec![7, -2, 40], vec!["m", "b", "z"]);
        let (b, _) = payload(vec![3], vec!["a"]);
        let key = ["id".to_string(), "name".to_string()];
        let mapped = map_schema(
            &schema,
            LoadSpec { write_mode: WriteMode::IncrementalUpsert, primary_key: &key, order_by: &[] },
        )
        .unwrap();
        let ranges = key_ranges(&[a.clone(), b], &mapped);
        assert_eq!(
            ranges,
            vec![
                KeyRange { column: "id".into(), min: KeyValue::Int64(-2), max: KeyValue::Int64(40) },
                KeyRange {
                    column: "name".into(),
                    min: KeyValue::String("a".into()),
                    max: KeyValue::String("z".into())
                },
            ]
        );
        let append =
            map_schema(&schema, LoadSpec { write_mode: WriteMode::FullAppend, primary_key: &[], order_by: &[] })
                .unwrap();
        assert!(key_ranges(&[a], &append).is_empty(), "no key, no range");
    }

    #[test]
    fn keys_staged_as_strings_get_no_range() {
        // NUMERIC is staged as its decimal string ("10.5" < "9.0" as text): no range.
        let schema = Arc::new(Schema::new(vec![Field::new("amount", DataType::Decimal128(10, 1), false)]));
        let decimals = arrow_array::Decimal128Array::from(vec![105, 90]).with_precision_and_scale(10, 1).unwrap();
        let incoming = RecordBatch::try_new(Arc::clone(&schema), vec![Arc::new(decimals)]).unwrap();
        let key = ["amount".to_string()];
        let mapped = map_schema(
            &schema,
            LoadSpec { write_mode: WriteMode::IncrementalUpsert, primary_key: &key, order_by: &[] },
        )
        .unwrap();
        let staged = crate::ingest::convert::to_staging(&incoming, &mapped, 0).unwrap();
        let payload = AppendPayload {
            rows: 2,
            first_row: 0,
            serialized_record_batch: record_batch_message(&staged).unwrap(),
            batch: Some(staged),
        };
        assert!(key_ranges(&[payload], &mapped).is_empty());
    }

    #[test]
    fn a_flexible_key_gets_its_range_from_its_staged_column_under_its_own_name() {
        let schema = Arc::new(Schema::new(vec![Field::new("customer id", DataType::Int64, false)]));
        let incoming =
            RecordBatch::try_new(Arc::clone(&schema), vec![Arc::new(Int64Array::from(vec![5, -1, 9]))]).unwrap();
        let key = ["customer id".to_string()];
        let spec = LoadSpec { write_mode: WriteMode::IncrementalUpsert, primary_key: &key, order_by: &[] };
        let mapped = map_schema(&schema, spec).unwrap();
        let staged = crate::ingest::convert::to_staging(&incoming, &mapped, 0).unwrap();
        assert!(staged.column_by_name("customer id").is_none(), "staged under a generated name");
        let payload = AppendPayload {
            rows: 3,
            first_row: 0,
            serialized_record_batch: record_batch_message(&staged).unwrap(),
            batch: Some(staged),
        };
        let range = KeyRange { column: "customer id".into(), min: KeyValue::Int64(-1), max: KeyValue::Int64(9) };
        assert_eq!(key_ranges(&[payload], &mapped), vec![range]);
    }
}
