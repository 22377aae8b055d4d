//! Arrow IPC bodies for tests.

use std::sync::Arc;

use arrow_array::{
    ArrayRef, BinaryArray, BooleanArray, Date32Array, Date64Array, Float32Array, Float64Array, Int8Array, Int64Array,
    LargeStringArray, RecordBatch, StringArray, TimestampMicrosecondArray, TimestampNanosecondArray,
};
use arrow_ipc::CompressionType;
use arrow_ipc::writer::{IpcWriteOptions, StreamWriter};
use arrow_schema::{DataType, Field, Schema, TimeUnit};

/// An Arrow IPC stream of `batches` (all with the first batch's schema).
pub fn ipc_stream(batches: &[RecordBatch]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut writer = StreamWriter::try_new(&mut out, &batches[0].schema()).unwrap();
    for batch in batches {
        writer.write(batch).unwrap();
    }
    writer.finish().unwrap();
    drop(writer);
    out
}

/// An Arrow IPC stream of `batches` whose record-batch buffers are compressed with `compression`
/// (Arrow's own buffer compression, as pyarrow's `IpcWriteOptions(compression=...)` writes it).
pub fn ipc_stream_compressed(batches: &[RecordBatch], compression: CompressionType) -> Vec<u8> {
    let options = IpcWriteOptions::default().try_with_compression(Some(compression)).unwrap();
    let mut out = Vec::new();
    let mut writer = StreamWriter::try_new_with_options(&mut out, &batches[0].schema(), options).unwrap();
    for batch in batches {
        writer.write(batch).unwrap();
    }
    writer.finish().unwrap();
    drop(writer);
    out
}

/// `bytes` gzip-compressed, as a body sent with `Content-Encoding: gzip`.
pub fn gzip(bytes: &[u8]) -> Vec<u8> {
    use std::io::Write as _;
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    encoder.write_all(bytes).unwrap();
    encoder.finish().unwrap()
}

pub fn batch(fields: Vec<Field>, columns: Vec<ArrayRef>) -> RecordBatch {
    RecordBatch::try_new(Arc::new(Schema::new(fields)), columns).unwrap()
}

/// Two int64 columns `id` and `v` (v = id * 10).
pub fn ids(range: std::ops::Range<i64>) -> RecordBatch {
    batch(
        vec![Field::new("id", DataType::Int64, false), Field::new("v", DataType::Int64, true)],
        vec![
            Arc::new(Int64Array::from_iter_values(range.clone())),
            Arc::new(Int64Array::from_iter_values(range.map(|i| i * 10))),
        ],
    )
}

pub const DAY_MS: i64 = 86_400_000;
pub const BASE_MICROS: i64 = 1_700_000_000_000_000;

/// Every common type, with nulls in every nullable column on rows divisible by 5, and several
/// Arrow encodings that map to the same BigQuery type (Int8, Float32, LargeUtf8, Date64,
/// nanosecond timestamps with whole microseconds).
pub fn common_types(range: std::ops::Range<i64>) -> RecordBatch {
    let ids: Vec<i64> = range.collect();
    let null_every_5 = |i: &i64| i % 5 != 0;
    batch(
        vec![
            Field::new("id", DataType::Int64, false),
            Field::new("flag", DataType::Boolean, true),
            Field::new("small", DataType::Int8, true),
            Field::new("ratio", DataType::Float32, true),
            Field::new("amount", DataType::Float64, true),
            Field::new("name", DataType::Utf8, true),
            Field::new("long_name", DataType::LargeUtf8, true),
            Field::new("blob", DataType::Binary, true),
            Field::new("day", DataType::Date32, true),
            Field::new("day64", DataType::Date64, true),
            Field::new("local_time", DataType::Timestamp(TimeUnit::Microsecond, None), true),
            Field::new("instant", DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())), true),
            Field::new("instant_ns", DataType::Timestamp(TimeUnit::Nanosecond, Some("+02:00".into())), true),
        ],
        vec![
            Arc::new(Int64Array::from(ids.clone())),
            Arc::new(ids.iter().map(|i| null_every_5(i).then_some(i % 2 == 0)).collect::<BooleanArray>()),
            Arc::new(ids.iter().map(|i| null_every_5(i).then_some((i % 100) as i8)).collect::<Int8Array>()),
            Arc::new(ids.iter().map(|i| null_every_5(i).then_some(*i as f32 / 4.0)).collect::<Float32Array>()),
            Arc::new(ids.iter().map(|i| null_every_5(i).then_some(*i as f64 * 1.25)).collect::<Float64Array>()),
            Arc::new(ids.iter().map(|i| null_every_5(i).then(|| format!("name-{i}-é"))).collect::<StringArray>()),
            Arc::new(ids.iter().map(|i| null_every_5(i).then(|| format!("long-{i}"))).collect::<LargeStringArray>()),
            Arc::new(BinaryArray::from_iter(
                ids.iter().map(|i| null_every_5(i).then(|| vec![(*i % 256) as u8, 0, 255])),
            )),
            Arc::new(ids.iter().map(|i| null_every_5(i).then_some(19_000 + *i as i32)).collect::<Date32Array>()),
            Arc::new(ids.iter().map(|i| null_every_5(i).then_some((19_000 + i) * DAY_MS)).collect::<Date64Array>()),
            Arc::new(
                ids.iter()
                    .map(|i| null_every_5(i).then_some(BASE_MICROS + i * 1_000_001))
                    .collect::<TimestampMicrosecondArray>(),
            ),
            Arc::new(
                ids.iter()
                    .map(|i| null_every_5(i).then_some(BASE_MICROS + i * 3_000_007))
                    .collect::<TimestampMicrosecondArray>()
                    .with_timezone("UTC"),
            ),
            Arc::new(
                ids.iter()
                    .map(|i| null_every_5(i).then_some((BASE_MICROS + i * 7) * 1_000))
                    .collect::<TimestampNanosecondArray>()
                    .with_timezone("+02:00"),
            ),
        ],
    )
}
