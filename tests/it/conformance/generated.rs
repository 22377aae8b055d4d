//! The resource schemas the GoogleSQL property tests generate (proptest strategies): every
//! write mode; every key-eligible type as a key, alone and in composite keys, with key ranges
//! at the extremes of every literal type; every converted type at top level and nested in
//! STRUCTs and ARRAYs; names that collide with the statements' aliases and keywords, in any
//! case, and flexible names; collated STRING keys; `order_by`, soft deletes and snapshots.
//! Each case carries the features it exercises, for the coverage check.

use std::collections::BTreeSet;

use arrow_schema::{DataType, Field, TimeUnit};
use filament_bigquery::conformance::Case;
use filament_bigquery::model::WriteMode;
use filament_bigquery::model::key_ranges::KeyValue;
use filament_bigquery::model::write_options::MetadataColumn;
use proptest::prelude::*;

use super::case_builder::CaseBuilder;

/// Names that collide with the generator's aliases, old and new spellings (`T`, `S`, `e0`,
/// `o0`), with GoogleSQL keywords and function names, in varied case.
pub(super) const TRICKY_NAMES: &[&str] = &[
    "t",
    "T",
    "s",
    "S",
    "e0",
    "O0",
    "e1",
    "o1",
    "order",
    "ORDER",
    "Select",
    "from",
    "where",
    "qualify",
    "QUALIFY",
    "merge",
    "using",
    "on",
    "when",
    "matched",
    "partition",
    "by",
    "row_number",
    "struct",
    "array",
    "unnest",
    "offset",
    "with",
    "target",
    "source",
    "staged",
    "key",
    "value",
    "null",
    "true",
    "if",
    "cast",
    "time",
    "date",
    "json",
    "numeric",
    "delete",
    "update",
    "insert",
    "set",
    "into",
    "values",
    "not",
    "and",
    "between",
    "collate",
    "_",
    "_k",
    "row",
];

/// A generated column type: the Arrow type an extractor sends, or a JSON string column.
#[derive(Debug, Clone)]
pub(super) enum Generated {
    Scalar(DataType),
    Json,
    /// A column typed by field metadata: (Arrow type, metadata key, value, BigQuery type).
    Marked(DataType, &'static str, &'static str, &'static str),
    List(Box<Generated>),
    Struct(Vec<(String, Generated)>),
}

impl Generated {
    pub(super) fn field(&self, name: &str) -> Field {
        match self {
            Generated::Scalar(data_type) => Field::new(name, data_type.clone(), true),
            Generated::Json => {
                Field::new(name, DataType::Utf8, true).with_metadata(std::collections::HashMap::from([(
                    "ARROW:extension:name".to_string(),
                    "arrow.json".to_string(),
                )]))
            }
            Generated::Marked(data_type, key, value, _) => Field::new(name, data_type.clone(), true)
                .with_metadata(std::collections::HashMap::from([(key.to_string(), value.to_string())])),
            Generated::List(item) => Field::new_list(name, item.field("item"), true),
            Generated::Struct(fields) => Field::new_struct(
                name,
                fields.iter().map(|(name, generated)| generated.field(name)).collect::<Vec<_>>(),
                true,
            ),
        }
    }

    /// A RANGE or INTERVAL value, which no list may hold (`docs/type-mapping.md`).
    fn is_range_or_interval(&self) -> bool {
        matches!(
            self,
            Generated::Marked(_, _, _, "RANGE") | Generated::Scalar(DataType::Interval(_) | DataType::Duration(_))
        )
    }

    /// The converted BigQuery types inside, with where they sit (`top`, `struct`, `array`)
    /// and their depth.
    pub(super) fn conversions(&self, depth: usize, container: &str, found: &mut BTreeSet<String>) {
        let converted = match self {
            Generated::Json => Some("JSON"),
            Generated::Scalar(DataType::Decimal128(_, scale)) if *scale > 9 => Some("BIGNUMERIC"),
            Generated::Scalar(DataType::Decimal128(..) | DataType::UInt64) => Some("NUMERIC"),
            Generated::Scalar(DataType::Decimal256(..)) => Some("BIGNUMERIC"),
            Generated::Scalar(DataType::Time32(_) | DataType::Time64(_)) => Some("TIME"),
            Generated::Scalar(DataType::Interval(_) | DataType::Duration(_)) => Some("INTERVAL"),
            Generated::Marked(_, _, _, bigquery_type) => Some(*bigquery_type),
            Generated::Scalar(_) => None,
            Generated::List(item) => return item.conversions(depth + 1, "array", found),
            Generated::Struct(fields) => {
                for (name, field) in fields {
                    if !is_plain(name) {
                        found.insert("flexible name of a struct field".into());
                    }
                    field.conversions(depth + 1, "struct", found);
                }
                return;
            }
        };
        if let Some(converted) = converted {
            found.insert(format!("converted {converted} in {container}"));
            if depth >= 2 {
                found.insert(format!("converted {converted} nested deeper"));
            }
        }
    }
}

pub(super) fn scalar() -> impl Strategy<Value = Generated> {
    let types = vec![
        DataType::Boolean,
        DataType::Int8,
        DataType::Int32,
        DataType::Int64,
        DataType::UInt32,
        DataType::UInt64,
        DataType::Float32,
        DataType::Float64,
        DataType::Utf8,
        DataType::LargeUtf8,
        DataType::Utf8View,
        DataType::Binary,
        DataType::FixedSizeBinary(16),
        DataType::Date32,
        DataType::Time32(TimeUnit::Millisecond),
        DataType::Time64(TimeUnit::Microsecond),
        DataType::Timestamp(TimeUnit::Microsecond, None),
        DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
        DataType::Decimal128(38, 9),
        DataType::Decimal128(20, 4),
        DataType::Decimal128(38, 20),
        DataType::Decimal256(76, 38),
        DataType::Dictionary(Box::new(DataType::Int32), Box::new(DataType::Utf8)),
    ];
    let range = |element: DataType| {
        DataType::Struct(vec![Field::new("start", element.clone(), true), Field::new("end", element, true)].into())
    };
    let marked = vec![
        Generated::Marked(DataType::Binary, "ARROW:extension:name", "geoarrow.wkb", "GEOGRAPHY"),
        Generated::Marked(DataType::Utf8, "ARROW:extension:name", "geoarrow.wkt", "GEOGRAPHY"),
        Generated::Marked(DataType::LargeUtf8, "bigquery_type", "GEOGRAPHY", "GEOGRAPHY"),
        Generated::Marked(range(DataType::Date32), "bigquery_type", "RANGE", "RANGE"),
        Generated::Marked(range(DataType::Timestamp(TimeUnit::Microsecond, None)), "bigquery_type", "RANGE", "RANGE"),
        Generated::Marked(
            range(DataType::Timestamp(TimeUnit::Nanosecond, Some("UTC".into()))),
            "bigquery_type",
            "RANGE",
            "RANGE",
        ),
        Generated::Scalar(DataType::Interval(arrow_schema::IntervalUnit::MonthDayNano)),
        Generated::Scalar(DataType::Interval(arrow_schema::IntervalUnit::YearMonth)),
        Generated::Scalar(DataType::Duration(TimeUnit::Microsecond)),
    ];
    prop_oneof![
        9 => proptest::sample::select(types).prop_map(Generated::Scalar),
        1 => Just(Generated::Json),
        3 => proptest::sample::select(marked),
    ]
}

/// Types BigQuery accepts in a key, with the BigQuery type each maps to.
pub(super) fn key_type() -> impl Strategy<Value = (DataType, &'static str)> {
    proptest::sample::select(vec![
        (DataType::Int64, "INT64"),
        (DataType::Utf8, "STRING"),
        (DataType::Boolean, "BOOL"),
        (DataType::Binary, "BYTES"),
        (DataType::Date32, "DATE"),
        (DataType::Time64(TimeUnit::Microsecond), "TIME"),
        (DataType::Timestamp(TimeUnit::Microsecond, None), "DATETIME"),
        (DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())), "TIMESTAMP"),
        (DataType::Decimal128(38, 9), "NUMERIC"),
        (DataType::Decimal256(76, 38), "BIGNUMERIC"),
    ])
}

/// Types `order_by` takes, with the BigQuery type each maps to.
pub(super) fn order_type() -> impl Strategy<Value = (DataType, &'static str)> {
    proptest::sample::select(vec![
        (DataType::Int64, "INT64"),
        (DataType::Utf8, "STRING"),
        (DataType::Date32, "DATE"),
        (DataType::Timestamp(TimeUnit::Microsecond, None), "DATETIME"),
        (DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())), "TIMESTAMP"),
        (DataType::Decimal128(38, 9), "NUMERIC"),
        (DataType::Decimal256(76, 38), "BIGNUMERIC"),
    ])
}

pub(super) fn any_type() -> impl Strategy<Value = Generated> {
    scalar().prop_recursive(4, 32, 4, |inner| {
        prop_oneof![
            inner
                .clone()
                .prop_filter("BigQuery has no ARRAY of ARRAY; ARRAY<RANGE> and ARRAY<INTERVAL> are refused", |g| {
                    !matches!(g, Generated::List(_)) && !g.is_range_or_interval()
                })
                .prop_map(|item| Generated::List(Box::new(item))),
            proptest::collection::vec((name(), inner), 1..4).prop_map(|fields| Generated::Struct(unique(fields))),
        ]
    })
}

/// BigQuery's flexible column names: spaces, every special character it allows (the quote
/// and the characters around a backtick among them), letters and marks of other scripts,
/// leading digits, and names that differ only in case (outside ASCII too).
pub(super) const FLEXIBLE_NAMES: &[&str] = &[
    "first name",
    "Größe",
    "GRÖßE",
    "revenue-2024",
    "a&b",
    "it's",
    "a'b''c",
    "<tag>",
    "#1",
    "x|y",
    "50% off",
    "a=b+c",
    "k:v",
    "名前",
    "имя",
    "café",
    "CAFÉ",
    "e\u{301}",
    "2024",
    "order by",
    " padded ",
    "a_\u{203f}_b",
    "x\u{2014}y",
];

pub(super) fn is_plain(name: &str) -> bool {
    let mut chars = name.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

pub(super) fn name() -> impl Strategy<Value = String> {
    prop_oneof![
        2 => proptest::sample::select(TRICKY_NAMES).prop_map(str::to_string),
        2 => "[a-z][a-z0-9_]{0,8}",
        1 => proptest::sample::select(FLEXIBLE_NAMES).prop_map(str::to_string),
        1 => "[\\p{L}\\p{N}][\\p{L}\\p{M}\\p{N}_ &%=+:'<>#|-]{0,12}",
    ]
}

/// The first of each name, compared case-insensitively as BigQuery compares column names.
pub(super) fn unique<T>(named: Vec<(String, T)>) -> Vec<(String, T)> {
    let mut seen = BTreeSet::new();
    named.into_iter().filter(|(name, _)| seen.insert(name.to_lowercase())).collect()
}

/// BigQuery's DATE range, 0001-01-01 to 9999-12-31, in days from 1970-01-01, and its
/// TIMESTAMP and DATETIME range in microseconds (the gateway refuses values outside them).
pub(super) const DATE_DAYS: (i64, i64) = (-719_162, 2_932_896);
pub(super) const TIMESTAMP_MICROS: (i64, i64) = (-62_135_596_800_000_000, 253_402_300_799_999_999);

/// `value` brought into `[low, high]`.
pub(super) fn within(value: i64, (low, high): (i64, i64)) -> i64 {
    low + value.rem_euclid(high - low + 1)
}

/// One key value of an ordered key type at an extreme of its range or in between.
pub(super) fn key_value(bigquery_type: &str, pick: u8, other: i64) -> Option<(KeyValue, bool)> {
    let extreme = pick % 3 != 2;
    let low = pick.is_multiple_of(3);
    Some(match bigquery_type {
        "INT64" => (
            KeyValue::Int64(if !extreme {
                other
            } else if low {
                i64::MIN
            } else {
                i64::MAX
            }),
            extreme,
        ),
        "DATE" => {
            let days = if !extreme {
                within(other, DATE_DAYS)
            } else if low {
                DATE_DAYS.0
            } else {
                DATE_DAYS.1
            };
            (KeyValue::Date(days as i32), extreme)
        }
        "TIMESTAMP" | "DATETIME" => {
            let micros = if !extreme {
                within(other, TIMESTAMP_MICROS)
            } else if low {
                TIMESTAMP_MICROS.0
            } else {
                TIMESTAMP_MICROS.1
            };
            let value =
                if bigquery_type == "TIMESTAMP" { KeyValue::Timestamp(micros) } else { KeyValue::Datetime(micros) };
            (value, extreme)
        }
        "STRING" => {
            let strings = ["", "'", "\\", "a'b\\c\"", "\n\t\r", "\u{7f}\u{1}", "`", "é", "\u{10FFFF}", "🦀 x"];
            let text = if extreme { strings[(other.unsigned_abs() % strings.len() as u64) as usize] } else { "m" };
            (KeyValue::String(text.to_string()), extreme)
        }
        _ => return None,
    })
}

pub(super) fn ordered(a: &KeyValue, b: &KeyValue) -> bool {
    match (a, b) {
        (KeyValue::Int64(a), KeyValue::Int64(b)) => a <= b,
        (KeyValue::Date(a), KeyValue::Date(b)) => a <= b,
        (KeyValue::Datetime(a), KeyValue::Datetime(b)) | (KeyValue::Timestamp(a), KeyValue::Timestamp(b)) => a <= b,
        (KeyValue::String(a), KeyValue::String(b)) => a.as_bytes() <= b.as_bytes(),
        _ => false,
    }
}

/// A generated case and the features it exercises (for the coverage check).
#[derive(Debug, Clone)]
pub(super) struct GeneratedCase {
    pub(super) case: Case,
    pub(super) features: BTreeSet<String>,
}

/// A generated key column: its name, (Arrow type, BigQuery type), whether a STRING key is
/// collated, and the picks of its key range's bounds.
pub(super) type GeneratedKey = (String, ((DataType, &'static str), bool, (u8, u8, i64, i64)));

pub(super) fn generated_case() -> impl Strategy<Value = GeneratedCase> {
    let key = proptest::collection::vec((name(), key_type(), any::<bool>(), any::<(u8, u8, i64, i64)>()), 1..4);
    let others = proptest::collection::vec((name(), any_type()), 0..5);
    let metadata = proptest::sample::subsequence(MetadataColumn::ALL.to_vec(), 0..=MetadataColumn::ALL.len());
    let modes = proptest::sample::select(WriteMode::ALL.to_vec());
    let order = proptest::collection::vec((name(), order_type()), 0..3);
    let (soft, snapshot) = (any::<bool>(), any::<bool>());
    (modes, key, others, metadata, order, (soft, snapshot)).prop_map(
        |(write_mode, key, others, metadata_columns, order, (soft, snapshot))| {
            let key =
                unique(key.into_iter().map(|(name, kind, collated, picks)| (name, (kind, collated, picks))).collect());
            let mut builder = CaseBuilder::new(write_mode);
            builder.keys(&key);
            builder.order_by(unique(order));
            builder.others(unique(others));
            builder.finish(metadata_columns, soft, snapshot)
        },
    )
}
