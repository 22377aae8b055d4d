//! The cases the live suite dry-runs: every statement shape (each write mode, NUMERIC,
//! BIGNUMERIC and TIME values and keys, composite and collated keys, columns named like the
//! statements' aliases and keywords, conversions nested in STRUCTs and ARRAYs, key ranges at
//! their extremes).

use std::sync::Arc;

use arrow_schema::{DataType, Field, Fields, Schema, TimeUnit};
use filament_bigquery::conformance::Case;
use filament_bigquery::model::WriteMode;
use filament_bigquery::model::key_ranges::{KeyRange, KeyValue};
use filament_bigquery::model::write_options::{Deletes, MetadataColumn};

use super::keyed;
use super::live_bigquery::WRITE_MODES;

/// Cases covering every statement shape: each write mode, NUMERIC/BIGNUMERIC/TIME and
/// composite keys, a collated STRING key, columns named like the aliases and keywords,
/// conversions nested in STRUCTs and ARRAYs, key ranges at their extremes.
pub(super) fn representative_cases() -> Vec<(String, Case)> {
    let (data, keys) = (data_fields(), key_shapes());
    let mut cases = Vec::new();
    // history is judged by its statement here (its rows are checked against the emulator).
    for (mode, write_mode) in WRITE_MODES.into_iter().chain([("history", WriteMode::History)]) {
        for (key_name, key_fields, ranges) in &keys {
            let keyed = keyed(write_mode);
            if !keyed && *key_name != "int" {
                continue;
            }
            let mut fields = key_fields.clone();
            fields.extend(data.iter().cloned());
            if mode.starts_with("cdc_") {
                fields.push(Field::new("_filament_op", DataType::Utf8, false));
            }
            let primary_key: Vec<String> =
                if keyed { key_fields.iter().map(|f| f.name().clone()).collect() } else { vec![] };
            let collated_keys = if *key_name == "composite" { vec!["tenant".to_string()] } else { vec![] };
            let case = Case {
                schema: Arc::new(Schema::new(fields)),
                write_mode,
                primary_key,
                collated_keys,
                key_ranges: if keyed { ranges.clone() } else { vec![] },
                // Keyed statements fold by a STRING then a NUMERIC order (issue 25).
                order_by: match write_mode {
                    WriteMode::History => vec!["s".into()],
                    _ if keyed => vec!["t".into(), "s".into()],
                    _ => vec![],
                },
                // Every statement shape sets the load metadata columns too.
                metadata_columns: MetadataColumn::ALL.to_vec(),
                // The keyed modes are judged with soft deletes, the others cannot have them.
                deletes: if keyed && write_mode != WriteMode::History { Deletes::Soft } else { Deletes::Hard },
                // full_upsert is judged as a snapshot: its segment, completion and deletion.
                delete_missing: write_mode == WriteMode::FullUpsert,
            };
            cases.push((format!("{mode}_{key_name}"), case));
        }
    }
    cases
}

/// The data columns every case carries: JSON, NUMERIC, BIGNUMERIC and TIME, nested in a
/// STRUCT and an ARRAY too, and columns named like the statements' aliases and keywords.
fn data_fields() -> [Field; 6] {
    let json = Field::new("doc", DataType::Utf8, true).with_metadata(std::collections::HashMap::from([(
        "ARROW:extension:name".to_string(),
        "arrow.json".to_string(),
    )]));
    let nested = Field::new(
        "nested",
        DataType::Struct(Fields::from(vec![
            Field::new("amount", DataType::Decimal256(76, 38), true),
            Field::new_list("times", Field::new_list_field(DataType::Time64(TimeUnit::Microsecond), true), true),
        ])),
        true,
    );
    [
        Field::new("t", DataType::Utf8, true),
        Field::new("s", DataType::Decimal128(38, 9), true),
        Field::new("order", DataType::Time64(TimeUnit::Microsecond), true),
        json,
        nested,
        Field::new_list("amounts", Field::new_list_field(DataType::Decimal128(38, 9), true), true),
    ]
}

/// The key shapes: an INT64 key with ranges at its extremes, NUMERIC, BIGNUMERIC, and a
/// composite of a collated STRING, a TIMESTAMP and a DATE with ranges at BigQuery's limits.
fn key_shapes() -> Vec<(&'static str, Vec<Field>, Vec<KeyRange>)> {
    vec![
        (
            "int",
            vec![Field::new("id", DataType::Int64, false)],
            vec![KeyRange { column: "id".into(), min: KeyValue::Int64(i64::MIN), max: KeyValue::Int64(i64::MAX) }],
        ),
        ("numeric", vec![Field::new("k", DataType::Decimal128(38, 9), false)], vec![]),
        ("bignumeric", vec![Field::new("k", DataType::Decimal256(76, 38), false)], vec![]),
        (
            "composite",
            vec![
                Field::new("tenant", DataType::Utf8, false),
                Field::new("at", DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())), false),
                Field::new("day", DataType::Date32, false),
            ],
            vec![
                KeyRange {
                    column: "tenant".into(),
                    min: KeyValue::String("a'\\".into()),
                    max: KeyValue::String("🦀".into()),
                },
                KeyRange {
                    column: "at".into(),
                    min: KeyValue::Timestamp(-62_135_596_800_000_000),
                    max: KeyValue::Timestamp(253_402_300_799_999_999),
                },
                KeyRange { column: "day".into(), min: KeyValue::Date(-719_162), max: KeyValue::Date(2_932_896) },
            ],
        ),
    ]
}
