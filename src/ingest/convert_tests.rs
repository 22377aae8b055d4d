use arrow_array::builder::{Int64Builder, ListBuilder, MapBuilder, StringBuilder};
use arrow_array::types::Int32Type;
use arrow_array::{
    Date32Array, Date64Array, Decimal128Array, DictionaryArray, Int8Array, LargeListArray, Time32SecondArray,
    Time64NanosecondArray, TimestampMicrosecondArray, TimestampNanosecondArray, UInt64Array,
};
use arrow_schema::Schema;

use super::*;
use crate::error::Problem;
use crate::ingest::scalars::{MAX_DATE_DAYS, MILLIS_PER_DAY, MIN_TIMESTAMP_MICROS};
use crate::ingest::schema::{LoadSpec, map_schema};
use crate::model::WriteMode;
use crate::model::staging::SEQ_COLUMN;

fn batch(fields: Vec<Field>, columns: Vec<ArrayRef>) -> RecordBatch {
    RecordBatch::try_new(Arc::new(Schema::new(fields)), columns).unwrap()
}

fn append() -> LoadSpec<'static> {
    LoadSpec { write_mode: WriteMode::FullAppend, primary_key: &[], order_by: &[] }
}

fn staged(input: &RecordBatch, spec: LoadSpec<'_>) -> Result<RecordBatch, IngestError> {
    let mapped = map_schema(&input.schema(), spec)?;
    to_staging(input, &mapped, 0)
}

fn strings(array: &ArrayRef) -> Vec<Option<String>> {
    array.as_string::<i32>().iter().map(|s| s.map(str::to_string)).collect()
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
            Arc::new(TimestampNanosecondArray::from(vec![Some(1_000), Some(2_000_000), None]).with_timezone("+01:00")),
            Arc::new(dict),
        ],
    );
    let output = staged(&input, append()).unwrap();
    let ts = output.column(1).as_primitive::<arrow_array::types::TimestampMicrosecondType>();
    assert_eq!(ts.iter().collect::<Vec<_>>(), vec![Some(1), Some(2_000), None]);
    assert_eq!(strings(output.column(2)), vec![Some("x".into()), Some("y".into()), Some("x".into())]);
}

#[test]
fn decimals_unsigned_and_times_become_exact_strings() {
    let decimals = Decimal128Array::from(vec![Some(12_345), Some(-105), None, Some(i128::from(i64::MAX) * 10)])
        .with_precision_and_scale(38, 2)
        .unwrap();
    let input = batch(
        vec![
            Field::new("n", DataType::Decimal128(38, 2), true),
            Field::new("u", DataType::UInt64, true),
            Field::new("t", DataType::Time64(TimeUnit::Nanosecond), true),
            Field::new("s", DataType::Time32(TimeUnit::Second), true),
        ],
        vec![
            Arc::new(decimals),
            Arc::new(UInt64Array::from(vec![Some(u64::MAX), Some(0), None, Some(7)])),
            Arc::new(Time64NanosecondArray::from(vec![
                Some(0),
                Some(86_399_999_999_000),
                None,
                Some(45_296_000_001_000),
            ])),
            Arc::new(Time32SecondArray::from(vec![Some(1), None, Some(3_661), Some(86_399)])),
        ],
    );
    let output = staged(&input, append()).unwrap();
    let s = |v: &str| Some(v.to_string());
    assert_eq!(strings(output.column(0)), vec![s("123.45"), s("-1.05"), None, s("922337203685477580.70")]);
    assert_eq!(strings(output.column(1)), vec![s("18446744073709551615"), s("0"), None, s("7")]);
    assert_eq!(strings(output.column(2)), vec![s("00:00:00.000000"), s("23:59:59.999999"), None, s("12:34:56.000001")]);
    assert_eq!(strings(output.column(3)), vec![s("00:00:01.000000"), None, s("01:01:01.000000"), s("23:59:59.000000")]);
}

#[test]
fn lists_and_maps_stage_as_lists_with_null_lists_empty() {
    let mut tags = ListBuilder::new(StringBuilder::new());
    tags.append_value([Some("a"), Some("b")]);
    tags.append_null();
    tags.append_value([Some("c")]);
    let tags = tags.finish();
    let large = LargeListArray::from_iter_primitive::<arrow_array::types::Int64Type, _, _>(vec![
        Some(vec![Some(1)]),
        Some(vec![]),
        None,
    ]);
    let mut map = MapBuilder::new(None, StringBuilder::new(), Int64Builder::new());
    map.keys().append_value("k");
    map.values().append_value(1);
    map.append(true).unwrap();
    map.append(false).unwrap();
    map.append(true).unwrap();
    let map = map.finish();
    let input = batch(
        vec![
            Field::new("tags", tags.data_type().clone(), true),
            Field::new("large", large.data_type().clone(), true),
            Field::new("m", map.data_type().clone(), true),
        ],
        vec![Arc::new(tags), Arc::new(large), Arc::new(map)],
    );
    let output = staged(&input, append()).unwrap();
    let tags = output.column(0).as_list::<i32>();
    assert_eq!(tags.null_count(), 0);
    assert_eq!(tags.offsets().lengths().collect::<Vec<_>>(), vec![2, 0, 1]);
    assert_eq!(strings(tags.values()), vec![Some("a".into()), Some("b".into()), Some("c".into())]);
    let large = output.column(1).as_list::<i32>();
    assert_eq!(large.offsets().lengths().collect::<Vec<_>>(), vec![1, 0, 0]);
    let m = output.column(2).as_list::<i32>();
    assert_eq!(m.offsets().lengths().collect::<Vec<_>>(), vec![1, 0, 0]);
    let entries = m.values().as_struct();
    assert_eq!(entries.column_names(), vec!["key", "value"]);
}

#[test]
fn refuses_null_elements_nanoseconds_partial_days_and_bad_json_naming_the_row() {
    let mut list = ListBuilder::new(Int64Builder::new());
    list.append_value([Some(1)]);
    list.append_value([Some(2), None]);
    let list = list.finish();
    let input = batch(vec![Field::new("xs", list.data_type().clone(), true)], vec![Arc::new(list)]);
    match staged(&input, append()).unwrap_err() {
        IngestError::InvalidValue { column, row, .. } => assert_eq!((column.as_str(), row), ("xs", 1)),
        other => panic!("{other:?}"),
    }

    let input = batch(
        vec![Field::new("ts", DataType::Timestamp(TimeUnit::Nanosecond, None), true)],
        vec![Arc::new(TimestampNanosecondArray::from(vec![Some(1_000), None, Some(1_001)]))],
    );
    let mapped = map_schema(&input.schema(), append()).unwrap();
    match to_staging(&input, &mapped, 10).unwrap_err() {
        IngestError::PrecisionLoss { column, row, .. } => assert_eq!((column.as_str(), row), ("ts", 12)),
        other => panic!("{other:?}"),
    }

    let input = batch(
        vec![Field::new("t", DataType::Time64(TimeUnit::Nanosecond), true)],
        vec![Arc::new(Time64NanosecondArray::from(vec![Some(1_000), Some(1_500)]))],
    );
    assert!(matches!(staged(&input, append()), Err(IngestError::PrecisionLoss { row: 1, .. })));

    let input = batch(
        vec![Field::new("d", DataType::Date64, true)],
        vec![Arc::new(Date64Array::from(vec![MILLIS_PER_DAY, MILLIS_PER_DAY + 1]))],
    );
    assert!(matches!(staged(&input, append()), Err(IngestError::PrecisionLoss { row: 1, .. })));

    let json = Field::new("j", DataType::Utf8, true).with_metadata(std::collections::HashMap::from([(
        "ARROW:extension:name".to_string(),
        "arrow.json".to_string(),
    )]));
    let input = batch(vec![json], vec![Arc::new(StringArray::from(vec![Some("{\"a\": 1}"), None, Some("{nope")]))]);
    assert!(matches!(staged(&input, append()), Err(IngestError::InvalidValue { row: 2, .. })));
}

#[test]
fn dates_and_timestamps_outside_bigquerys_range_are_refused_naming_the_row() {
    let days = Arc::new(Date32Array::from(vec![Some(0), Some(MAX_DATE_DAYS), Some(MAX_DATE_DAYS + 1)])) as ArrayRef;
    let input = batch(vec![Field::new("d", DataType::Date32, true)], vec![days]);
    match staged(&input, append()) {
        Err(IngestError::InvalidValue { column, row, reason }) => {
            assert_eq!((column.as_str(), row), ("d", 2));
            assert!(reason.contains("outside BigQuery's range"), "{reason}");
        }
        other => panic!("{other:?}"),
    }
    let micros = vec![Some(MIN_TIMESTAMP_MICROS), Some(MIN_TIMESTAMP_MICROS - 1)];
    let at = Arc::new(TimestampMicrosecondArray::from(micros).with_timezone("UTC")) as ArrayRef;
    let input = batch(vec![Field::new("at", at.data_type().clone(), true)], vec![at]);
    assert!(matches!(staged(&input, append()), Err(IngestError::InvalidValue { row: 1, .. })));
    let seconds = Arc::new(arrow_array::TimestampSecondArray::from(vec![Some(253_402_300_800)])) as ArrayRef;
    let input = batch(vec![Field::new("at", seconds.data_type().clone(), true)], vec![seconds]);
    assert!(matches!(staged(&input, append()), Err(IngestError::InvalidValue { row: 0, .. })), "year 10000");
}

#[test]
fn keyed_modes_check_keys_and_operations_and_stage_the_row_order() {
    let key = ["id".to_string()];
    let spec = LoadSpec { write_mode: WriteMode::CdcMerge, primary_key: &key, order_by: &[] };
    let fields = vec![Field::new("id", DataType::Int64, true), Field::new("_filament_op", DataType::Utf8, true)];
    let input = batch(
        fields.clone(),
        vec![Arc::new(Int64Array::from(vec![1, 2])), Arc::new(StringArray::from(vec!["upsert", "delete"]))],
    );
    let mapped = map_schema(&input.schema(), spec).unwrap();
    let output = to_staging(&input, &mapped, 5).unwrap();
    let seq = output.column_by_name(SEQ_COLUMN).unwrap().as_primitive::<arrow_array::types::Int64Type>();
    assert_eq!(seq.values().to_vec(), vec![5, 6]);
    assert_eq!(seq_values(seq, 3).values().to_vec(), vec![(3 << 32) | 5, (3 << 32) | 6]);

    let null_key = batch(
        fields.clone(),
        vec![Arc::new(Int64Array::from(vec![Some(1), None])), Arc::new(StringArray::from(vec!["insert", "insert"]))],
    );
    assert_eq!(staged(&null_key, spec).unwrap_err(), IngestError::NullPrimaryKey { column: "id".into(), row: 1 });
    let order_by = ["LSN".to_string()];
    let ordered = LoadSpec { order_by: &order_by, ..spec };
    let with_lsn = vec![fields[0].clone(), Field::new("lsn", DataType::Int64, true), fields[1].clone()];
    let null_order = batch(
        with_lsn,
        vec![
            Arc::new(Int64Array::from(vec![1, 2])),
            Arc::new(Int64Array::from(vec![Some(7), None])),
            Arc::new(StringArray::from(vec!["insert", "delete"])),
        ],
    );
    let mapped = map_schema(&null_order.schema(), ordered).unwrap();
    let refused = to_staging(&null_order, &mapped, 4).unwrap_err();
    assert_eq!(refused, IngestError::NullOrderBy { column: "lsn".into(), row: 5 }, "a delete needs its order too");
    assert_eq!(Problem::from(refused).code, crate::error::ErrorCode::InvalidOrderBy);
    for ops in [vec![Some("insert"), Some("merge")], vec![None, Some("insert")]] {
        let bad_op =
            batch(fields.clone(), vec![Arc::new(Int64Array::from(vec![1, 2])), Arc::new(StringArray::from(ops))]);
        assert!(matches!(staged(&bad_op, spec), Err(IngestError::InvalidOperation(_))));
    }
}
