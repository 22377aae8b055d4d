use std::collections::HashMap;
use std::sync::Arc;

use arrow_schema::{Field, Schema};
use serde_json::json;

use super::*;
use crate::model::columns::{BigQueryType, Column};
use crate::model::table_layout::{ColumnDescriptions, DESCRIPTION_METADATA_KEY, TableLayout};
use arrow_schema::{DataType, Fields};

fn declared(value: serde_json::Value) -> TableOptionsDeclaration {
    serde_json::from_value(value).expect("a well-formed declaration")
}

fn parse(value: serde_json::Value) -> Result<TableOptions, Problem> {
    TableOptions::parse(&declared(value), WriteMode::FullAppend, &[])
}

fn code(value: serde_json::Value) -> ErrorCode {
    parse(value.clone()).expect_err(&format!("{value} is rejected")).code
}

fn columns() -> Vec<Column> {
    vec![
        Column::new("id", BigQueryType::Int64),
        Column::new("created_at", BigQueryType::Timestamp),
        Column::new("day", BigQueryType::Date),
        Column::new("score", BigQueryType::Float64),
        Column::new("payload", BigQueryType::Json),
        Column::new("region", BigQueryType::String),
        Column::repeated("tags", BigQueryType::String),
        Column::new("at", BigQueryType::Time),
    ]
}

fn resolve(options: serde_json::Value, write_mode: WriteMode, key: &[&str]) -> Result<TableLayout, Problem> {
    let key: Vec<String> = key.iter().map(|k| k.to_string()).collect();
    let options = TableOptions::parse(&declared(options), write_mode, &key)?;
    TableLayout::resolve(Some(&options), write_mode, &key, &columns(), &Fields::empty())
}

#[test]
fn the_three_partitioning_forms_parse_and_show_as_declared() {
    for value in [
        json!({"partitioning": {"field": "created_at", "granularity": "DAY"}}),
        json!({"partitioning": {"granularity": "HOUR"}}),
        json!({"partitioning": {"field": "id", "range": {"start": 0, "end": 1_000_000, "interval": 1000}}}),
    ] {
        let options = parse(value.clone()).unwrap();
        assert_eq!(serde_json::to_value(&options).unwrap(), value);
        assert_eq!(serde_json::from_value::<TableOptions>(value).unwrap(), options, "stored form reads back");
    }
    let ingestion = parse(json!({"partitioning": {"granularity": "MONTH"}})).unwrap();
    assert_eq!(ingestion.partitioning, Some(Partitioning::IngestionTime { granularity: Granularity::Month }));
}

#[test]
fn invalid_partitioning_is_refused_with_its_own_code() {
    for value in [
        json!({"partitioning": {"field": "created_at", "granularity": "WEEK"}}),
        json!({"partitioning": {"field": "created_at", "granularity": "day"}}),
        json!({"partitioning": {}}),
        json!({"partitioning": {"field": "created_at"}}),
        json!({"partitioning": {"field": "bad.name", "granularity": "DAY"}}),
        json!({"partitioning": {"field": "id", "granularity": "DAY", "range": {"start": 0, "end": 10, "interval": 1}}}),
        json!({"partitioning": {"range": {"start": 0, "end": 10, "interval": 1}}}),
        json!({"partitioning": {"field": "id", "range": {"start": 10, "end": 10, "interval": 1}}}),
        json!({"partitioning": {"field": "id", "range": {"start": 0, "end": 10, "interval": 0}}}),
        json!({"partitioning": {"field": "id", "range": {"start": 0, "end": 10_001, "interval": 1}}}),
        json!({"partitioning": {"field": "id", "range": {"start": i64::MIN, "end": i64::MAX, "interval": 1}}}),
    ] {
        assert_eq!(code(value.clone()), ErrorCode::InvalidPartitioning, "{value}");
    }
    let exactly_the_limit =
        json!({"partitioning": {"field": "id", "range": {"start": 0, "end": 10_000, "interval": 1}}});
    assert!(parse(exactly_the_limit).is_ok());
}

#[test]
fn clustering_labels_and_the_other_options_each_have_a_code() {
    let cases = [
        (json!({"clustering": ["a", "b", "c", "d", "e"]}), ErrorCode::InvalidClustering),
        (json!({"clustering": ["a", "A"]}), ErrorCode::InvalidClustering),
        (json!({"clustering": ["_filament_op"]}), ErrorCode::InvalidClustering),
        (json!({"labels": {"Team": "x"}}), ErrorCode::InvalidTableLabels),
        (json!({"labels": {"1team": "x"}}), ErrorCode::InvalidTableLabels),
        (json!({"labels": {"": "x"}}), ErrorCode::InvalidTableLabels),
        (json!({"labels": {"team": "Data"}}), ErrorCode::InvalidTableLabels),
        (json!({"labels": {"team": "a.b"}}), ErrorCode::InvalidTableLabels),
        (json!({"labels": {("k".repeat(64)): "x"}}), ErrorCode::InvalidTableLabels),
        (json!({"labels": {"team": ("v".repeat(64))}}), ErrorCode::InvalidTableLabels),
        (json!({"require_partition_filter": true}), ErrorCode::InvalidTableOptions),
        (json!({"expiration_days": 0}), ErrorCode::InvalidTableOptions),
        (json!({"expiration_days": 36_501}), ErrorCode::InvalidTableOptions),
        (json!({"description": ("d".repeat(16_385))}), ErrorCode::InvalidTableOptions),
    ];
    for (value, expected) in cases {
        assert_eq!(code(value.clone()), expected, "{value}");
    }
    let many: BTreeMap<String, String> = (0..65).map(|i| (format!("k{i}"), String::new())).collect();
    assert_eq!(code(json!({ "labels": many })), ErrorCode::InvalidTableLabels);
    let fine = json!({
        "clustering": ["a", "b", "c", "d"],
        "labels": {"team": "", "cost-center_2": "data-eng", ("k".repeat(63)): ("v".repeat(63)), "équipe": "données"},
        "expiration_days": 36_500,
        "description": ("d".repeat(16_384)),
    });
    parse(fine).unwrap();
}

#[test]
fn a_merge_mode_requires_a_partition_filter_only_on_a_key_column() {
    let filtered = |field: &str| {
        declared(json!({"partitioning": {"field": field, "granularity": "DAY"}, "require_partition_filter": true}))
    };
    let key = ["id".to_string(), "created_at".to_string()];
    assert!(TableOptions::parse(&filtered("created_at"), WriteMode::CdcMerge, &key).is_ok());
    assert!(TableOptions::parse(&filtered("updated_at"), WriteMode::FullAppend, &key).is_ok());
    let refused = TableOptions::parse(&filtered("updated_at"), WriteMode::IncrementalUpsert, &key).unwrap_err();
    assert_eq!(refused.code, ErrorCode::InvalidTableOptions);
    assert!(refused.detail.contains("primary-key column"), "{}", refused.detail);
    let ingestion = declared(json!({"partitioning": {"granularity": "DAY"}, "require_partition_filter": true}));
    assert!(TableOptions::parse(&ingestion, WriteMode::CdcMerge, &key).is_err());
}

#[test]
fn partitioning_and_clustering_columns_are_checked_against_the_batch() {
    let partitioned =
        resolve(json!({"partitioning": {"field": "CREATED_AT", "granularity": "HOUR"}}), WriteMode::FullAppend, &[]);
    assert_eq!(
        partitioned.unwrap().partitioning,
        Some(Partitioning::TimeUnitColumn { field: "created_at".into(), granularity: Granularity::Hour }),
        "the schema's spelling"
    );
    let cases = [
        (json!({"partitioning": {"field": "missing", "granularity": "DAY"}}), ErrorCode::InvalidPartitioning),
        (json!({"partitioning": {"field": "region", "granularity": "DAY"}}), ErrorCode::InvalidPartitioning),
        (json!({"partitioning": {"field": "day", "granularity": "HOUR"}}), ErrorCode::InvalidPartitioning),
        (
            json!({"partitioning": {"field": "created_at", "range": {"start": 0, "end": 9, "interval": 1}}}),
            ErrorCode::InvalidPartitioning,
        ),
        (json!({"clustering": ["missing"]}), ErrorCode::InvalidClustering),
        (json!({"clustering": ["score"]}), ErrorCode::InvalidClustering),
        (json!({"clustering": ["payload"]}), ErrorCode::InvalidClustering),
        (json!({"clustering": ["tags"]}), ErrorCode::InvalidClustering),
        (json!({"clustering": ["at"]}), ErrorCode::InvalidClustering),
    ];
    for (value, expected) in cases {
        let error = resolve(value.clone(), WriteMode::FullAppend, &[]).expect_err(&value.to_string());
        assert_eq!(error.code, expected, "{value}: {}", error.detail);
    }
    let day = resolve(json!({"partitioning": {"field": "day", "granularity": "YEAR"}}), WriteMode::FullAppend, &[]);
    assert!(day.is_ok());
    let range = resolve(
        json!({"partitioning": {"field": "id", "range": {"start": 0, "end": 9, "interval": 1}}}),
        WriteMode::FullAppend,
        &[],
    );
    assert!(range.is_ok());
}

#[test]
fn keyed_modes_cluster_by_their_first_clusterable_key_columns_unless_told_otherwise() {
    let key = ["score", "id", "region", "created_at", "day", "at"];
    let layout = resolve(json!({}), WriteMode::CdcMerge, &key).unwrap();
    assert_eq!(layout.clustering, ["id", "region", "created_at", "day"], "FLOAT64 and TIME skipped, at most 4");
    let undeclared =
        TableLayout::resolve(None, WriteMode::IncrementalUpsert, &["id".into()], &columns(), &Fields::empty());
    assert_eq!(undeclared.unwrap().clustering, ["id"]);
    assert!(resolve(json!({"clustering": []}), WriteMode::CdcMerge, &key).unwrap().clustering.is_empty());
    assert_eq!(resolve(json!({"clustering": ["region"]}), WriteMode::CdcMerge, &key).unwrap().clustering, ["region"]);
    assert!(resolve(json!({}), WriteMode::FullAppend, &[]).unwrap().clustering.is_empty(), "unkeyed: none");
}

#[test]
fn column_descriptions_come_from_arrow_field_metadata_nested_too() {
    let described = |name: &str, data_type: DataType, text: &str| {
        Field::new(name, data_type, true)
            .with_metadata(HashMap::from([(DESCRIPTION_METADATA_KEY.to_string(), text.to_string())]))
    };
    let inner = Fields::from(vec![described("city", DataType::Utf8, "Where"), Field::new("zip", DataType::Utf8, true)]);
    let schema = Schema::new(vec![
        described("id", DataType::Int64, "The key"),
        Field::new("plain", DataType::Utf8, true),
        Field::new("addresses", DataType::List(Arc::new(Field::new_list_field(DataType::Struct(inner), true))), true),
    ]);
    let descriptions = ColumnDescriptions::from_arrow(schema.fields()).unwrap();
    assert_eq!(descriptions.text("ID"), Some("The key"));
    assert_eq!(descriptions.text("plain"), None);
    assert_eq!(descriptions.text("addresses"), None);
    let nested = descriptions.fields("addresses").unwrap();
    assert_eq!((nested.text("city"), nested.text("zip")), (Some("Where"), None));

    let long = Schema::new(vec![described("id", DataType::Int64, &"x".repeat(1025))]);
    assert_eq!(ColumnDescriptions::from_arrow(long.fields()).unwrap_err().code, ErrorCode::InvalidTableOptions);
}
