use std::collections::HashMap;

use arrow_schema::TimeUnit;

use crate::error::ErrorCode;

use super::typed::{BIGQUERY_TYPE_KEY, EXTENSION_NAME_KEY, JSON_EXTENSION};
use super::*;

fn schema(fields: Vec<Field>) -> SchemaRef {
    Arc::new(Schema::new(fields))
}

fn append() -> LoadSpec<'static> {
    LoadSpec { write_mode: WriteMode::FullAppend, primary_key: &[], order_by: &[] }
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
        DataType::Struct(vec![Field::new("k", DataType::Utf8, false), Field::new("v", DataType::Float64, true)].into()),
        false,
    );
    let address = DataType::Struct(
        vec![Field::new("city", DataType::Utf8, true), Field::new("at", DataType::Time64(TimeUnit::Microsecond), true)]
            .into(),
    );
    let dictionary = DataType::Dictionary(Box::new(DataType::Int32), Box::new(DataType::Utf8));
    let pairs: Vec<(Field, &str)> = vec![
        (Field::new("b", DataType::Boolean, false), "BOOL"),
        (Field::new("i8", DataType::Int8, true), "INT64"),
        (Field::new("u32", DataType::UInt32, true), "INT64"),
        (Field::new("u64", DataType::UInt64, true), "NUMERIC"),
        (Field::new("f16", DataType::Float16, true), "FLOAT64"),
        (Field::new("s", DataType::LargeUtf8, true), "STRING"),
        (Field::new("v", DataType::Utf8View, true), "STRING"),
        (Field::new("bin", DataType::FixedSizeBinary(16), true), "BYTES"),
        (Field::new("d", DataType::Date64, true), "DATE"),
        (Field::new("t32", DataType::Time32(TimeUnit::Millisecond), true), "TIME"),
        (Field::new("t64", DataType::Time64(TimeUnit::Nanosecond), true), "TIME"),
        (Field::new("ts", DataType::Timestamp(TimeUnit::Nanosecond, Some("+02:00".into())), true), "TIMESTAMP"),
        (Field::new("dt", DataType::Timestamp(TimeUnit::Second, None), true), "DATETIME"),
        (Field::new("n", DataType::Decimal128(38, 9), true), "NUMERIC"),
        (Field::new("bn", DataType::Decimal128(38, 10), true), "BIGNUMERIC"),
        (Field::new("bn2", DataType::Decimal256(76, 38), true), "BIGNUMERIC"),
        (Field::new("dict", dictionary, true), "STRING"),
        (json, "JSON"),
        (json_by_key, "JSON"),
        (Field::new("tags", DataType::List(item(DataType::Utf8)), true), "ARRAY<STRING>"),
        (Field::new("big", DataType::LargeList(item(DataType::Int32)), true), "ARRAY<INT64>"),
        (Field::new("pair", DataType::FixedSizeList(item(DataType::Float32), 2), true), "ARRAY<FLOAT64>"),
        (Field::new("address", address, true), "STRUCT<city STRING, at TIME>"),
        (Field::new("m", DataType::Map(Arc::new(entries), false), true), "ARRAY<STRUCT<key STRING, value FLOAT64>>"),
    ];
    let (fields, expected): (Vec<Field>, Vec<&str>) = pairs.into_iter().unzip();
    let names: Vec<String> = fields.iter().map(|f| f.name().clone()).collect();
    let actual = sql_types(fields);
    for ((name, actual), expected) in names.iter().zip(&actual).zip(&expected) {
        assert_eq!(actual, expected, "column {name}");
    }
    assert_eq!(actual.len(), expected.len());
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
        (DataType::Decimal256(76, 0), "weird"),
        (list_of_list, "weird"),
        (DataType::ListView(item(DataType::Int64)), "weird"),
        (DataType::Struct(vec![Field::new("d", DataType::Null, true)].into()), "weird.d"),
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
        vec![Field::new("has.dot", DataType::Utf8, true)],
        vec![Field::new("tab\there", DataType::Utf8, true)],
        vec![Field::new("a", DataType::Utf8, true), Field::new("A", DataType::Utf8, true)],
        vec![Field::new("größe", DataType::Utf8, true), Field::new("GRÖßE", DataType::Utf8, true)],
        vec![Field::new("s", DataType::Struct(vec![Field::new("bad(name)", DataType::Utf8, true)].into()), true)],
        vec![Field::new("é".repeat(301), DataType::Utf8, true)],
        vec![],
    ] {
        assert!(matches!(map_schema(&schema(fields), append()), Err(IngestError::InvalidColumn(_))));
    }
}

#[test]
fn the_operation_column_belongs_to_cdc_modes_only() {
    let with_op = schema(vec![Field::new("id", DataType::Int64, false), Field::new(OP_COLUMN, DataType::Utf8, false)]);
    let without_op = schema(vec![Field::new("id", DataType::Int64, false)]);
    let key = ["id".to_string()];
    let cdc_merge = LoadSpec { write_mode: WriteMode::CdcMerge, primary_key: &key, order_by: &[] };
    let cdc_append = LoadSpec { write_mode: WriteMode::CdcAppend, primary_key: &[], order_by: &[] };
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
        map_schema(&fields, LoadSpec { write_mode: WriteMode::IncrementalUpsert, primary_key: key, order_by: &[] })
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
fn order_by_takes_present_top_level_columns_of_the_ordered_types() {
    let fields = schema(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("lsn", DataType::Int64, true),
        Field::new("Day", DataType::Date32, true),
        Field::new("amount", DataType::Decimal128(38, 9), true),
        Field::new("at", DataType::Time64(TimeUnit::Microsecond), true),
        Field::new("flag", DataType::Boolean, true),
        Field::new("raw", DataType::Binary, true),
        Field::new("score", DataType::Float64, true),
        Field::new("tags", DataType::List(item(DataType::Int64)), true),
        Field::new("_filament_op", DataType::Utf8, false),
    ]);
    let key = ["id".to_string()];
    let ordered = |order_by: &[String]| {
        map_schema(&fields, LoadSpec { write_mode: WriteMode::CdcMerge, primary_key: &key, order_by })
    };
    let mapped = ordered(&["day".to_string(), "LSN".to_string(), "amount".to_string()]).unwrap();
    assert_eq!(mapped.order_columns, vec![("Day".into(), 2), ("lsn".into(), 1), ("amount".into(), 3)]);
    for bad in ["at", "flag", "raw", "score", "tags", "missing"] {
        let refused = ordered(&[bad.to_string()]).unwrap_err();
        assert!(matches!(refused, IngestError::InvalidOrderBy(_)), "{bad}: {refused:?}");
        assert_eq!(refused.code(), ErrorCode::InvalidOrderBy);
    }
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

/// A column nesting `levels` STRUCTs around one INT64.
fn nested(levels: usize) -> Field {
    let mut field = Field::new("leaf", DataType::Int64, true);
    for level in 0..levels {
        field = Field::new(format!("level{level}"), DataType::Struct(vec![field].into()), true);
    }
    field
}

#[test]
fn bigquery_table_limits_are_refused_before_anything_is_staged() {
    assert!(map_schema(&schema(vec![nested(MAX_RECORD_DEPTH)]), append()).is_ok(), "15 levels are allowed");
    let too_deep = map_schema(&schema(vec![nested(MAX_RECORD_DEPTH + 1)]), append()).unwrap_err();
    assert_eq!(too_deep.code(), ErrorCode::UnsupportedType);
    assert!(too_deep.to_string().contains("nests 16 levels of STRUCT"), "{too_deep}");
    // 100 STRUCT columns of 100 fields each: 10,100 columns counting the nested fields.
    let wide: Vec<Field> = (0..100)
        .map(|c| {
            let fields: Vec<Field> = (0..100).map(|f| Field::new(format!("f{f}"), DataType::Int64, true)).collect();
            Field::new(format!("c{c}"), DataType::Struct(fields.into()), true)
        })
        .collect();
    let too_wide = map_schema(&schema(wide), append()).unwrap_err();
    assert!(too_wide.to_string().contains("10100 columns counting nested fields"), "{too_wide}");
    let reserved_nested =
        Field::new("address", DataType::Struct(vec![Field::new("_PARTITIONTIME", DataType::Int64, true)].into()), true);
    let refused = map_schema(&schema(vec![reserved_nested]), append()).unwrap_err();
    assert!(refused.to_string().contains("BigQuery reserves the prefix _PARTITION"), "{refused}");
    let refused = map_schema(&schema(vec![Field::new("_table_suffix", DataType::Int64, true)]), append()).unwrap_err();
    assert_eq!(refused.code(), ErrorCode::InvalidIdentifier, "{refused}");
}

fn marked(name: &str, data_type: DataType, key: &str, value: &str) -> Field {
    Field::new(name, data_type, true).with_metadata(HashMap::from([(key.to_string(), value.to_string())]))
}

fn range_struct(element: DataType) -> DataType {
    DataType::Struct(vec![Field::new("start", element.clone(), true), Field::new("end", element, true)].into())
}

#[test]
fn geography_range_and_interval_columns_map_to_their_types() {
    let utc = DataType::Timestamp(TimeUnit::Nanosecond, Some("UTC".into()));
    let fields = vec![
        marked("wkb", DataType::Binary, EXTENSION_NAME_KEY, "geoarrow.wkb"),
        marked("wkb_view", DataType::BinaryView, EXTENSION_NAME_KEY, "geoarrow.wkb"),
        marked("wkt", DataType::LargeUtf8, EXTENSION_NAME_KEY, "geoarrow.wkt"),
        marked("text", DataType::Utf8, BIGQUERY_TYPE_KEY, "geography"),
        marked("bytes", DataType::LargeBinary, BIGQUERY_TYPE_KEY, "GEOGRAPHY"),
        marked("days", range_struct(DataType::Date32), BIGQUERY_TYPE_KEY, "RANGE"),
        marked("local", range_struct(DataType::Timestamp(TimeUnit::Microsecond, None)), BIGQUERY_TYPE_KEY, "RANGE"),
        marked("at", range_struct(utc), BIGQUERY_TYPE_KEY, "RANGE"),
        Field::new("mdn", DataType::Interval(arrow_schema::IntervalUnit::MonthDayNano), true),
        Field::new("took", DataType::Duration(TimeUnit::Millisecond), true),
        Field::new_list("trail", marked("item", DataType::Utf8, EXTENSION_NAME_KEY, "geoarrow.wkt"), true),
    ];
    assert_eq!(
        sql_types(fields),
        [
            "GEOGRAPHY",
            "GEOGRAPHY",
            "GEOGRAPHY",
            "GEOGRAPHY",
            "GEOGRAPHY",
            "RANGE<DATE>",
            "RANGE<DATETIME>",
            "RANGE<TIMESTAMP>",
            "INTERVAL",
            "INTERVAL",
            "ARRAY<GEOGRAPHY>"
        ]
    );
}

#[test]
fn geoarrow_edges_are_planar_unless_its_metadata_says_spherical() {
    use crate::model::columns::GeographyEncoding;
    let geoarrow = |data_type: DataType, extension: &str, metadata: Option<&str>| {
        let mut entries = HashMap::from([(EXTENSION_NAME_KEY.to_string(), extension.to_string())]);
        if let Some(metadata) = metadata {
            entries.insert("ARROW:extension:metadata".to_string(), metadata.to_string());
        }
        Field::new("g", data_type, true).with_metadata(entries)
    };
    let encoding =
        |field: Field| match map_schema(&schema(vec![field]), append()).unwrap().data_columns[0].bigquery_type {
            BigQueryType::Geography(encoding) => encoding,
            ref other => panic!("{other}"),
        };
    assert_eq!(encoding(geoarrow(DataType::Binary, "geoarrow.wkb", None)), GeographyEncoding::PlanarWkb);
    assert_eq!(
        encoding(geoarrow(DataType::Binary, "geoarrow.wkb", Some(r#"{"crs": "OGC:CRS84"}"#))),
        GeographyEncoding::PlanarWkb
    );
    assert_eq!(
        encoding(geoarrow(DataType::Binary, "geoarrow.wkb", Some(r#"{"edges": "spherical"}"#))),
        GeographyEncoding::Wkb
    );
    assert_eq!(
        encoding(geoarrow(DataType::Utf8, "geoarrow.wkt", Some(r#"{"edges": "planar"}"#))),
        GeographyEncoding::PlanarWkt
    );
    assert_eq!(
        encoding(geoarrow(DataType::Utf8, "geoarrow.wkt", Some(r#"{"edges": "karney"}"#))),
        GeographyEncoding::Wkt
    );
    assert_eq!(encoding(marked("g", DataType::Binary, BIGQUERY_TYPE_KEY, "GEOGRAPHY")), GeographyEncoding::Wkb);
    let on_a_list = Field::new_list("g", Field::new("item", DataType::Utf8, true), true);
    let on_a_list = on_a_list.with_metadata(HashMap::from([(BIGQUERY_TYPE_KEY.to_string(), "GEOGRAPHY".to_string())]));
    let refused = map_schema(&schema(vec![on_a_list]), append());
    assert!(matches!(refused, Err(IngestError::UnsupportedType { .. })), "a mark belongs on the item: {refused:?}");
}

#[test]
fn geoarrow_metadata_longer_than_read_is_refused_and_a_long_crs_is_skipped() {
    use super::typed::MAX_EXTENSION_METADATA_BYTES;
    let with_metadata = |metadata: String| {
        let entries = HashMap::from([
            (EXTENSION_NAME_KEY.to_string(), "geoarrow.wkb".to_string()),
            ("ARROW:extension:metadata".to_string(), metadata),
        ]);
        schema(vec![Field::new("g", DataType::Binary, true).with_metadata(entries)])
    };
    let crs = "x".repeat(MAX_EXTENSION_METADATA_BYTES - 64);
    let fits = with_metadata(format!(r#"{{"crs": "{crs}", "edges": "spherical"}}"#));
    assert!(map_schema(&fits, append()).is_ok());
    let long = with_metadata(format!(r#"{{"crs": "{}", "edges": "spherical"}}"#, "x".repeat(1 << 20)));
    let refused = map_schema(&long, append()).unwrap_err();
    assert!(
        matches!(&refused, IngestError::UnsupportedType { column, reason, .. }
            if column == "g" && reason.contains("more than the 65536 read")),
        "{refused:?}"
    );
}

#[test]
fn misshapen_typed_columns_and_unknown_marks_are_unsupported_and_never_keys() {
    for field in [
        marked("g", DataType::Int64, BIGQUERY_TYPE_KEY, "GEOGRAPHY"),
        marked("g", DataType::Utf8, EXTENSION_NAME_KEY, "geoarrow.wkb"),
        marked("g", DataType::Utf8, EXTENSION_NAME_KEY, "geoarrow.point"),
        marked("r", DataType::Date32, BIGQUERY_TYPE_KEY, "RANGE"),
        marked("r", range_struct(DataType::Int64), BIGQUERY_TYPE_KEY, "RANGE"),
        marked(
            "r",
            DataType::Struct(
                vec![Field::new("end", DataType::Date32, true), Field::new("start", DataType::Date32, true)].into(),
            ),
            BIGQUERY_TYPE_KEY,
            "RANGE",
        ),
        marked("x", DataType::Utf8, BIGQUERY_TYPE_KEY, "BLOB"),
    ] {
        let refused = map_schema(&schema(vec![field.clone()]), append());
        assert!(matches!(refused, Err(IngestError::UnsupportedType { .. })), "{field:?}: {refused:?}");
    }
    let key = ["shape".to_string()];
    let spec = LoadSpec { write_mode: WriteMode::IncrementalUpsert, primary_key: &key, order_by: &[] };
    let fields = vec![marked("shape", DataType::Binary, EXTENSION_NAME_KEY, "geoarrow.wkb")];
    assert!(matches!(map_schema(&schema(fields), spec), Err(IngestError::InvalidPrimaryKey(_))));
}

#[test]
fn flexible_names_are_staged_under_generated_plain_names() {
    let fields = vec![
        Field::new("first name", DataType::Utf8, true),
        Field::new("id", DataType::Int64, true),
        Field::new("s", DataType::Struct(vec![Field::new("Größe", DataType::Int64, true)].into()), true),
    ];
    let mapped = map_schema(&schema(fields), append()).unwrap();
    let staged: Vec<&str> = mapped.staging.fields().iter().map(|f| f.name().as_str()).collect();
    assert!(staged[0].starts_with("_filament_col_") && staged[1] == "id" && staged[2] == "s", "{staged:?}");
    let DataType::Struct(inner) = mapped.staging.field(2).data_type() else { panic!("a struct") };
    assert!(inner[0].name().starts_with("_filament_col_"));
    assert!(staged.iter().chain([inner[0].name().as_str()].iter()).all(|n| crate::model::columns::is_plain_name(n)));
    assert_eq!(mapped.destination_columns[0].name, "first name");
}

#[test]
fn arrays_of_ranges_and_intervals_are_refused_by_name() {
    let ranges =
        Field::new_list("stays", marked("item", range_struct(DataType::Date32), BIGQUERY_TYPE_KEY, "RANGE"), true);
    let intervals = Field::new_list("waits", Field::new("item", DataType::Duration(TimeUnit::Second), true), true);
    for (field, shown) in [(ranges, "ARRAY<RANGE<DATE>>"), (intervals, "ARRAY<INTERVAL>")] {
        let refused = map_schema(&schema(vec![field]), append());
        let Err(IngestError::UnsupportedType { column, reason, .. }) = refused else { panic!("{refused:?}") };
        assert!(["stays", "waits"].contains(&column.as_str()) && reason.contains(shown), "{column}: {reason}");
    }
}
