use arrow_array::builder::{ListBuilder, StringBuilder};
use arrow_array::{Int64Array, StringArray, StructArray};
use arrow_schema::{DataType, Field, Fields, Schema};

use super::*;

const TWO_TO_53: i64 = 1 << 53;

fn cast_into_float64(name: &str, from: BigQueryType) -> Column {
    Column { published_as: Some(BigQueryType::Float64), ..Column::new(name, from) }
}

fn required(column: Column) -> Column {
    Column { required: true, ..column }
}

fn batch(columns: Vec<(&str, ArrayRef)>) -> RecordBatch {
    let fields: Vec<Field> = columns.iter().map(|(n, a)| Field::new(*n, a.data_type().clone(), true)).collect();
    let arrays = columns.into_iter().map(|(_, a)| a).collect();
    RecordBatch::try_new(Arc::new(Schema::new(fields)), arrays).unwrap()
}

fn ints(values: Vec<Option<i64>>) -> ArrayRef {
    Arc::new(Int64Array::from(values))
}

fn strings(values: Vec<Option<&str>>) -> ArrayRef {
    Arc::new(StringArray::from(values))
}

#[test]
fn int64_goes_into_float64_within_two_to_the_53() {
    let rules = DestinationRules::new(&[cast_into_float64("n", BigQueryType::Int64)], WriteMode::FullAppend);
    let fits = batch(vec![("n", ints(vec![Some(TWO_TO_53), Some(-TWO_TO_53), None, Some(0)]))]);
    assert_eq!(rules.check(&fits, 0), Ok(()));
    for beyond in [TWO_TO_53 + 1, -TWO_TO_53 - 1, i64::MIN, i64::MAX] {
        let rows = batch(vec![("n", ints(vec![Some(1), Some(beyond)]))]);
        let error = rules.check(&rows, 10).unwrap_err();
        assert!(matches!(&error, IngestError::PrecisionLoss { column, row: 11, .. } if column == "n"), "{error:?}");
        assert_eq!(error.code(), crate::error::ErrorCode::PrecisionLoss);
    }
}

#[test]
fn a_decimal_goes_into_float64_when_its_double_reads_back_as_it() {
    let rules = DestinationRules::new(&[cast_into_float64("d", BigQueryType::Numeric)], WriteMode::FullAppend);
    let exact = ["0.1", "-12.50", "0.000000001", "123456789012345.6", "9007199254740992", "1e3", "0", "-0.000"];
    for value in exact {
        assert_eq!(rules.check(&batch(vec![("d", strings(vec![Some(value)]))]), 0), Ok(()), "{value}");
    }
    let lossy = ["9007199254740993", "0.12345678901234567891", "12345678901234567890123456789.123456789"];
    for value in lossy {
        let error = rules.check(&batch(vec![("d", strings(vec![None, Some(value)]))]), 0).unwrap_err();
        assert!(matches!(error, IngestError::PrecisionLoss { row: 1, .. }), "{value}: {error:?}");
    }
}

#[test]
fn numbers_normalize_to_their_digits_and_exponent() {
    assert_eq!(normalized("-12.50"), Some((true, "125".into(), -1)));
    assert_eq!(normalized("1.25e1"), Some((false, "125".into(), -1)));
    assert_eq!(normalized("1000"), Some((false, "1".into(), 3)));
    assert_eq!(normalized("-0.0"), Some((false, String::new(), 0)));
    assert_eq!(normalized("1x"), None);
}

#[test]
fn a_null_in_a_required_column_names_its_row() {
    let rules = DestinationRules::new(&[required(Column::new("id", BigQueryType::Int64))], WriteMode::FullAppend);
    assert_eq!(rules.check(&batch(vec![("id", ints(vec![Some(1), Some(2)]))]), 0), Ok(()));
    let error = rules.check(&batch(vec![("id", ints(vec![Some(1), None]))]), 5).unwrap_err();
    assert_eq!(error, IngestError::NullInRequiredColumn { column: "id".into(), row: 6 });
    assert_eq!(error.code(), crate::error::ErrorCode::NullInRequiredColumn);
}

#[test]
fn deletes_whose_values_are_never_written_are_not_checked() {
    let columns = [required(Column::new("v", BigQueryType::Int64))];
    let rows =
        batch(vec![("v", ints(vec![Some(1), None])), (OP_COLUMN, strings(vec![Some("upsert"), Some("delete")]))]);
    assert_eq!(DestinationRules::new(&columns, WriteMode::CdcMerge).check(&rows, 0), Ok(()));
    assert_eq!(DestinationRules::new(&columns, WriteMode::History).check(&rows, 0), Ok(()));
    assert!(DestinationRules::new(&columns, WriteMode::IncrementalDelete).is_empty());
    // cdc_append inserts its deletes as rows.
    let error = DestinationRules::new(&columns, WriteMode::CdcAppend).check(&rows, 0).unwrap_err();
    assert_eq!(error, IngestError::NullInRequiredColumn { column: "v".into(), row: 1 });
}

#[test]
fn required_fields_count_only_in_records_that_are_there_and_list_elements_in_their_rows() {
    let inner = required(Column::new("city", BigQueryType::String));
    let address = Column::new("address", BigQueryType::Struct(vec![inner]));
    let fields = Fields::from(vec![Field::new("city", DataType::Utf8, true)]);
    let record = |cities: Vec<Option<&str>>, valid: Vec<bool>| -> ArrayRef {
        Arc::new(StructArray::new(fields.clone(), vec![strings(cities)], Some(valid.into())))
    };
    let rules = DestinationRules::new(std::slice::from_ref(&address), WriteMode::FullAppend);
    let null_record = batch(vec![("address", record(vec![Some("Oslo"), None], vec![true, false]))]);
    assert_eq!(rules.check(&null_record, 0), Ok(()), "a NULL record has no fields to require");
    let null_field = batch(vec![("address", record(vec![Some("Oslo"), None], vec![true, true]))]);
    let error = rules.check(&null_field, 0).unwrap_err();
    assert_eq!(error, IngestError::NullInRequiredColumn { column: "address.city".into(), row: 1 });

    let prices = cast_into_float64("prices", BigQueryType::Numeric);
    let prices = Column { repeated: true, ..prices };
    let mut lists = ListBuilder::new(StringBuilder::new());
    lists.append_value([Some("1.5")]);
    lists.append_value([Some("2.5"), Some("9007199254740993")]);
    let rows = batch(vec![("prices", Arc::new(lists.finish()) as ArrayRef)]);
    let rules = DestinationRules::new(&[prices], WriteMode::FullAppend);
    assert!(matches!(rules.check(&rows, 0), Err(IngestError::PrecisionLoss { row: 1, .. })));
    assert_eq!(rules.check(&rows.slice(0, 1), 0), Ok(()), "a slice checks its own lists only");
}

#[test]
fn tables_without_required_columns_or_float_casts_have_no_rules() {
    let exact_cast = Column { published_as: Some(BigQueryType::Numeric), ..Column::new("n", BigQueryType::Int64) };
    let rules = DestinationRules::new(&[exact_cast, Column::new("s", BigQueryType::String)], WriteMode::FullAppend);
    assert!(rules.is_empty());
}
