use std::sync::Arc;

use arrow_array::builder::StringViewBuilder;
use arrow_array::{DictionaryArray, Int8Array, Int32Array, RecordBatch, StringArray};
use arrow_schema::{Field, Schema};

use super::*;
use crate::ingest::decode::BodyDecoder;
use crate::ingest::schema::{LoadSpec, map_schema};
use crate::model::WriteMode;

fn decoded(batch: RecordBatch) -> (DecodedBody, MappedSchema) {
    let mut bytes = Vec::new();
    let mut writer = arrow_ipc::writer::StreamWriter::try_new(&mut bytes, &batch.schema()).unwrap();
    writer.write(&batch).unwrap();
    writer.finish().unwrap();
    drop(writer);
    let mut decoder = BodyDecoder::new(usize::MAX);
    decoder.push(bytes::Bytes::from(bytes)).unwrap();
    let body = decoder.finish().unwrap();
    let mapped =
        map_schema(&body.schema, LoadSpec { write_mode: WriteMode::FullAppend, primary_key: &[], order_by: &[] })
            .unwrap();
    (body, mapped)
}

#[test]
fn a_dictionary_counts_each_index_as_the_value_it_selects() {
    let value = "x".repeat(1 << 20);
    let keys = Int32Array::from(vec![0; 1000]);
    let dictionary = DictionaryArray::try_new(keys, Arc::new(StringArray::from(vec![value]))).unwrap();
    let field = Field::new("doc", dictionary.data_type().clone(), false);
    let (body, mapped) =
        decoded(RecordBatch::try_new(Arc::new(Schema::new(vec![field])), vec![Arc::new(dictionary)]).unwrap());
    let refused = staged_size(&body, &mapped, 64 << 20).unwrap_err();
    assert_eq!(
        refused,
        IngestError::StagedTooLarge {
            staged_bytes: refused_bytes(&refused),
            limit_bytes: 64 << 20,
            column: "doc".into(),
            column_bytes: 1000 * (1 << 20) + 1001 * OFFSET_BYTES,
        }
    );
}

fn refused_bytes(error: &IngestError) -> usize {
    match error {
        IngestError::StagedTooLarge { staged_bytes, .. } => *staged_bytes,
        _ => 0,
    }
}

#[test]
fn views_count_by_their_lengths_and_narrow_integers_widen() {
    // 300 views of one 1 MiB value, stored once.
    let long = "y".repeat(1 << 20);
    let mut builder = StringViewBuilder::new().with_deduplicate_strings();
    for _ in 0..300 {
        builder.append_value(&long);
    }
    let views = builder.finish();
    let field = Field::new("v", views.data_type().clone(), false);
    let (body, mapped) =
        decoded(RecordBatch::try_new(Arc::new(Schema::new(vec![field])), vec![Arc::new(views)]).unwrap());
    let size = staged_size(&body, &mapped, usize::MAX).unwrap();
    assert!(size.largest_column_bytes >= 300 << 20, "{size:?}");

    let narrow = Int8Array::from(vec![1i8; 1_000_000]);
    let field = Field::new("n", DataType::Int8, false);
    let (body, mapped) =
        decoded(RecordBatch::try_new(Arc::new(Schema::new(vec![field])), vec![Arc::new(narrow)]).unwrap());
    let size = staged_size(&body, &mapped, usize::MAX).unwrap();
    assert_eq!(size.largest_column_bytes, 8_000_000, "INT64 staged: eight bytes a row");
    assert!(staged_size(&body, &mapped, 4_000_000).is_err(), "1 MB received, 8 MB staged");
}

/// The kinds of Arrow column the property test sends, each converted by `convert.rs`.
#[derive(Debug, Clone, Copy)]
enum Kind {
    Int8,
    UInt32,
    Int64,
    Float32,
    Boolean,
    Utf8,
    LargeUtf8,
    Utf8View,
    Binary,
    DictionaryUtf8,
    Date32,
    TimestampMicros,
    Time64Micros,
    Decimal128,
    ListInt32,
    StructOfTwo,
    /// Twelve members: framing is paid per nested field, not per column.
    WideStruct,
}

const KINDS: [Kind; 17] = [
    Kind::Int8,
    Kind::UInt32,
    Kind::Int64,
    Kind::Float32,
    Kind::Boolean,
    Kind::Utf8,
    Kind::LargeUtf8,
    Kind::Utf8View,
    Kind::Binary,
    Kind::DictionaryUtf8,
    Kind::Date32,
    Kind::TimestampMicros,
    Kind::Time64Micros,
    Kind::Decimal128,
    Kind::ListInt32,
    Kind::StructOfTwo,
    Kind::WideStruct,
];

/// A column of `kind` with `rows` values drawn from `rng` (some NULL when `nullable`).
fn column(kind: Kind, rows: usize, nullable: bool, rng: &mut rand::rngs::StdRng) -> ArrayRef {
    use arrow_array::builder::{
        BinaryBuilder, BooleanBuilder, Date32Builder, Decimal128Builder, Float32Builder, Int8Builder, Int32Builder,
        Int64Builder, LargeStringBuilder, ListBuilder, StringBuilder, StringDictionaryBuilder,
        Time64MicrosecondBuilder, TimestampMicrosecondBuilder, UInt32Builder,
    };
    use arrow_array::types::Int32Type as Keys;
    use rand::Rng as _;
    let present = |rng: &mut rand::rngs::StdRng| !nullable || rng.random_bool(0.8);
    let text = |rng: &mut rand::rngs::StdRng| "é".repeat(rng.random_range(0..40));
    macro_rules! build {
        ($builder:expr, $value:expr) => {{
            let mut builder = $builder;
            for _ in 0..rows {
                if present(rng) { builder.append_value($value(&mut *rng)) } else { builder.append_null() }
            }
            Arc::new(builder.finish()) as ArrayRef
        }};
    }
    match kind {
        Kind::Int8 => build!(Int8Builder::new(), |r: &mut rand::rngs::StdRng| r.random::<i8>()),
        Kind::UInt32 => build!(UInt32Builder::new(), |r: &mut rand::rngs::StdRng| r.random::<u32>()),
        Kind::Int64 => build!(Int64Builder::new(), |r: &mut rand::rngs::StdRng| r.random::<i64>()),
        Kind::Float32 => build!(Float32Builder::new(), |r: &mut rand::rngs::StdRng| r.random::<f32>()),
        Kind::Boolean => build!(BooleanBuilder::new(), |r: &mut rand::rngs::StdRng| r.random::<bool>()),
        Kind::Utf8 => build!(StringBuilder::new(), text),
        Kind::LargeUtf8 => build!(LargeStringBuilder::new(), text),
        Kind::Utf8View => build!(StringViewBuilder::new(), text),
        Kind::Binary => build!(BinaryBuilder::new(), |r: &mut rand::rngs::StdRng| text(r).into_bytes()),
        Kind::DictionaryUtf8 => build!(StringDictionaryBuilder::<Keys>::new(), |r: &mut rand::rngs::StdRng| {
            ["a", "bb", "a longer value"][r.random_range(0..3)]
        }),
        Kind::Date32 => build!(Date32Builder::new(), |r: &mut rand::rngs::StdRng| r.random_range(-700_000..2_900_000)),
        Kind::TimestampMicros => build!(TimestampMicrosecondBuilder::new(), |r: &mut rand::rngs::StdRng| {
            r.random_range(-62_135_596_800_000_000..253_402_300_799_999_999)
        }),
        Kind::Time64Micros => {
            build!(Time64MicrosecondBuilder::new(), |r: &mut rand::rngs::StdRng| { r.random_range(0..86_400_000_000) })
        }
        Kind::Decimal128 => {
            build!(Decimal128Builder::new().with_precision_and_scale(38, 9).unwrap(), |r: &mut rand::rngs::StdRng| r
                .random_range(-(10i128.pow(38) - 1)..10i128.pow(38)))
        }
        Kind::ListInt32 => {
            let mut builder = ListBuilder::new(Int32Builder::new());
            for _ in 0..rows {
                for _ in 0..rng.random_range(0..5) {
                    builder.values().append_value(rng.random());
                }
                builder.append(true);
            }
            Arc::new(builder.finish())
        }
        Kind::StructOfTwo => {
            let name = column(Kind::Utf8, rows, false, rng);
            let amount = column(Kind::Int64, rows, false, rng);
            let fields = vec![
                Arc::new(Field::new("name", DataType::Utf8, false)),
                Arc::new(Field::new("amount", DataType::Int64, false)),
            ];
            Arc::new(arrow_array::StructArray::new(fields.into(), vec![name, amount], None))
        }
        Kind::WideStruct => {
            let members: Vec<ArrayRef> = (0..12).map(|_| column(Kind::Int64, rows, false, rng)).collect();
            let fields: Vec<Arc<Field>> =
                (0..12).map(|i| Arc::new(Field::new(format!("m{i}"), DataType::Int64, false))).collect();
            Arc::new(arrow_array::StructArray::new(fields.into(), members, None))
        }
    }
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig { cases: 64, ..Default::default() })]

    /// The estimate covers what conversion and encoding produce, whatever the types (one
    /// payload per received batch: framing is counted per batch).
    #[test]
    fn the_staged_size_covers_the_encoded_payloads(
        kinds in proptest::collection::vec(proptest::sample::select(KINDS.to_vec()), 1..6),
        rows in 0usize..300,
        nullable in proptest::bool::ANY,
        seed in proptest::prelude::any::<u64>(),
    ) {
        use rand::SeedableRng as _;
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let arrays: Vec<ArrayRef> = kinds.iter().map(|kind| column(*kind, rows, nullable, &mut rng)).collect();
        let fields: Vec<Field> = arrays
            .iter()
            .enumerate()
            .map(|(i, array)| Field::new(format!("c{i}"), array.data_type().clone(), true))
            .collect();
        let batch = RecordBatch::try_new(Arc::new(Schema::new(fields)), arrays).unwrap();
        let (body, mapped) = decoded(batch);
        let size = staged_size(&body, &mapped, usize::MAX).unwrap();
        let limits = crate::ingest::encode::PayloadLimits { max_bytes: usize::MAX / 2, max_rows: 20_000 };
        let payloads = crate::ingest::encode_payloads(&body, &mapped, limits).unwrap();
        let encoded: usize = payloads.iter().map(|p| p.serialized_record_batch.len()).sum();
        proptest::prop_assert!(encoded <= size.bytes, "{kinds:?} x {rows} rows: encoded {encoded} > staged {}", size.bytes);
    }
}
