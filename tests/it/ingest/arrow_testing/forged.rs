//! Streams built here beside the Arrow project's files: a big-endian stream of fixed-width
//! columns (a little-endian one with its byte-order flag set and its buffers swapped, which
//! pyarrow reads back to the same values), refused at its schema by byte order; and a union
//! column, refused by name however its body is cut into chunks.

use std::sync::Arc;

use arrow_array::{
    Array as _, ArrayRef, Date32Array, Float32Array, Float64Array, Int16Array, Int32Array, Int64Array, RecordBatch,
    StringArray, TimestampMicrosecondArray, UnionArray,
};
use arrow_buffer::ScalarBuffer;
use arrow_ipc::{Endianness, MessageHeader, MetadataVersion, root_as_message};
use arrow_schema::{DataType, Field, Schema, TimeUnit, UnionFields};
use flatbuffers::{FlatBufferBuilder, WIPOffset};
use reqwest::{Method, StatusCode};

use super::judge;
use super::{EXECUTION, RUN, schema_then_garbage};
use crate::ingest::hostile::{assert_within_memory_bound, healthy};
use crate::support::arrow::ipc_stream;
use crate::support::{Gateway, GatewayOptions, TestRun, assert_problem, send};

/// Every fixed-width type of the test, values that read differently once their bytes are
/// swapped, a null in each nullable column.
fn fixed_width() -> RecordBatch {
    let columns: Vec<(Field, ArrayRef)> = vec![
        (Field::new("i16", DataType::Int16, true), Arc::new(Int16Array::from(vec![Some(1), None, Some(-300)]))),
        (Field::new("i32", DataType::Int32, false), Arc::new(Int32Array::from(vec![1, 70_000, -2]))),
        (Field::new("i64", DataType::Int64, true), Arc::new(Int64Array::from(vec![Some(1 << 40), Some(-5), None]))),
        (Field::new("f32", DataType::Float32, false), Arc::new(Float32Array::from(vec![0.5, -1.25, 3.0e10]))),
        (Field::new("f64", DataType::Float64, true), Arc::new(Float64Array::from(vec![None, Some(2.5), Some(-1e-9)]))),
        (Field::new("day", DataType::Date32, false), Arc::new(Date32Array::from(vec![19_723, 0, -1]))),
        (
            Field::new("at", DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())), true),
            Arc::new(
                TimestampMicrosecondArray::from(vec![Some(1_704_067_200_000_001), None, Some(0)]).with_timezone("UTC"),
            ),
        ),
    ];
    let (fields, arrays): (Vec<Field>, Vec<ArrayRef>) = columns.into_iter().unzip();
    RecordBatch::try_new(Arc::new(Schema::new(fields)), arrays).unwrap()
}

/// A framed message: continuation marker, metadata length, metadata padded to 8 bytes, body.
fn framed(metadata: &[u8], body: &[u8]) -> Vec<u8> {
    let padded = metadata.len().next_multiple_of(8);
    let mut out = vec![0xFF; 4];
    out.extend_from_slice(&(padded as u32).to_le_bytes());
    out.extend_from_slice(metadata);
    out.resize(8 + padded, 0);
    out.extend_from_slice(body);
    out
}

/// One field of the schema message: arrow-ipc's writer has no byte-order option, so the
/// schema is built with its generated flatbuffer builders (fixed-width types only).
fn ipc_field<'a>(fbb: &mut FlatBufferBuilder<'a>, field: &Field) -> WIPOffset<arrow_ipc::Field<'a>> {
    let name = fbb.create_string(field.name());
    let (type_type, type_) = match field.data_type() {
        DataType::Int16 | DataType::Int32 | DataType::Int64 => {
            let mut int = arrow_ipc::IntBuilder::new(fbb);
            int.add_bitWidth(field.data_type().primitive_width().unwrap() as i32 * 8);
            int.add_is_signed(true);
            (arrow_ipc::Type::Int, int.finish().as_union_value())
        }
        DataType::Float32 | DataType::Float64 => {
            let mut float = arrow_ipc::FloatingPointBuilder::new(fbb);
            let double = field.data_type() == &DataType::Float64;
            float.add_precision(if double { arrow_ipc::Precision::DOUBLE } else { arrow_ipc::Precision::SINGLE });
            (arrow_ipc::Type::FloatingPoint, float.finish().as_union_value())
        }
        DataType::Date32 => {
            let mut date = arrow_ipc::DateBuilder::new(fbb);
            date.add_unit(arrow_ipc::DateUnit::DAY);
            (arrow_ipc::Type::Date, date.finish().as_union_value())
        }
        DataType::Timestamp(TimeUnit::Microsecond, Some(zone)) => {
            let zone = fbb.create_string(zone);
            let mut timestamp = arrow_ipc::TimestampBuilder::new(fbb);
            timestamp.add_unit(arrow_ipc::TimeUnit::MICROSECOND);
            timestamp.add_timezone(zone);
            (arrow_ipc::Type::Timestamp, timestamp.finish().as_union_value())
        }
        other => panic!("not a fixed-width type of the test: {other}"),
    };
    let children = fbb.create_vector::<WIPOffset<arrow_ipc::Field>>(&[]);
    let mut built = arrow_ipc::FieldBuilder::new(fbb);
    built.add_name(name);
    built.add_nullable(field.is_nullable());
    built.add_type_type(type_type);
    built.add_type_(type_);
    built.add_children(children);
    built.finish()
}

/// The schema message of `schema`, declaring big-endian buffers.
fn big_endian_schema_message(schema: &Schema) -> Vec<u8> {
    let mut fbb = FlatBufferBuilder::new();
    let fields: Vec<_> = schema.fields().iter().map(|field| ipc_field(&mut fbb, field)).collect();
    let fields = fbb.create_vector(&fields);
    let mut ipc_schema = arrow_ipc::SchemaBuilder::new(&mut fbb);
    ipc_schema.add_endianness(Endianness::Big);
    ipc_schema.add_fields(fields);
    let ipc_schema = ipc_schema.finish();
    let mut message = arrow_ipc::MessageBuilder::new(&mut fbb);
    message.add_version(MetadataVersion::V5);
    message.add_header_type(MessageHeader::Schema);
    message.add_header(ipc_schema.as_union_value());
    message.add_bodyLength(0);
    let message = message.finish();
    fbb.finish(message, None);
    framed(fbb.finished_data(), &[])
}

/// The record-batch messages of a little-endian stream of `batch`, with every value buffer's
/// elements byte-swapped (validity bitmaps are bits, the same in either order): a big-endian
/// writer's record batches. The metadata, a flatbuffer, is little-endian in both.
fn big_endian_record_batches(batch: &RecordBatch) -> Vec<u8> {
    let stream = ipc_stream(std::slice::from_ref(batch));
    let mut out = Vec::new();
    let mut at = 0;
    loop {
        let length = u32::from_le_bytes(stream[at + 4..at + 8].try_into().unwrap()) as usize;
        if length == 0 {
            break;
        }
        let metadata = &stream[at + 8..at + 8 + length];
        let message = root_as_message(metadata).unwrap();
        let mut body = stream[at + 8 + length..at + 8 + length + message.bodyLength() as usize].to_vec();
        if let Some(record_batch) = message.header_as_record_batch() {
            let buffers: Vec<_> = record_batch.buffers().unwrap().iter().collect();
            // Two buffers per fixed-width column: validity, then values.
            for (column, pair) in batch.columns().iter().zip(buffers.chunks(2)) {
                let width = column.data_type().primitive_width().unwrap();
                let values = &mut body[pair[1].offset() as usize..][..pair[1].length() as usize];
                values.chunks_mut(width).for_each(<[u8]>::reverse);
            }
            out.extend_from_slice(&framed(metadata, &body));
        }
        at += 8 + length + body.len();
    }
    out.extend_from_slice(&[0xFF, 0xFF, 0xFF, 0xFF, 0, 0, 0, 0]);
    out
}

/// What pyarrow reads from `stream`.
async fn read_by_pyarrow(stream: &[u8]) -> serde_json::Value {
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), stream).unwrap();
    judge::dump(file.path()).await
}

#[tokio::test(flavor = "multi_thread")]
async fn a_big_endian_stream_of_fixed_width_columns_is_refused_at_its_schema_by_byte_order() {
    let batch = fixed_width();
    let little_endian = ipc_stream(std::slice::from_ref(&batch));
    let mut big_endian = big_endian_schema_message(&batch.schema());
    big_endian.extend_from_slice(&big_endian_record_batches(&batch));
    // A faithful big-endian stream: pyarrow reads it, byte-swapped, to the same values.
    let (read_little, read_big) = (read_by_pyarrow(&little_endian).await, read_by_pyarrow(&big_endian).await);
    assert_eq!((&read_little["byte_order"], &read_big["byte_order"]), (&"little".into(), &"big".into()));
    assert_eq!(read_big["rows"], read_little["rows"], "pyarrow reads the big-endian stream to the same values");

    let gw = GatewayOptions::new().spawn().await;
    TestRun::new(RUN, EXECUTION).full_append(&["t"]).open(&gw).await;
    let before = gw.db_snapshot().await;
    for body in [big_endian.clone(), schema_then_garbage(&big_endian)] {
        let problem = assert_problem(
            gw.post_batch(RUN, EXECUTION, "t", None, body).await,
            StatusCode::UNPROCESSABLE_ENTITY,
            "unsupported_byte_order",
        );
        assert!(problem["detail"].as_str().unwrap().contains("big-endian"), "{problem}");
    }
    assert_eq!(gw.db_snapshot().await, before, "a refused stream changed the state");
    healthy(&gw).await;
    assert_within_memory_bound(&gw);
    // The same values little-endian load.
    let receipt = gw.post_accepted(RUN, EXECUTION, "t", None, little_endian).await;
    assert_eq!(receipt["rows"], 3);
}

/// A sparse union of Int32 and Utf8 beside an Int64 column.
fn union_batch() -> RecordBatch {
    let fields =
        UnionFields::try_new([5, 7], [Field::new("i", DataType::Int32, true), Field::new("s", DataType::Utf8, true)])
            .unwrap();
    let children: Vec<ArrayRef> =
        vec![Arc::new(Int32Array::from(vec![1, 0, 3])), Arc::new(StringArray::from(vec!["", "b", ""]))];
    let union = UnionArray::try_new(fields, ScalarBuffer::from(vec![5i8, 7, 5]), None, children).unwrap();
    let schema = Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("either", union.data_type().clone(), false),
    ]);
    RecordBatch::try_new(Arc::new(schema), vec![Arc::new(Int64Array::from(vec![1, 2, 3])), Arc::new(union)]).unwrap()
}

/// Posts `body` after a request head `padding` bytes longer: where the body's messages lie in
/// the gateway's read buffer, so how their buffers are aligned, moves with it.
async fn post_shifted(gw: &Gateway, body: Vec<u8>, padding: usize) -> (StatusCode, serde_json::Value) {
    let request = gw
        .request(Method::POST, &format!("/v1/runs/{RUN}/executions/{EXECUTION}/resources/t/batches"))
        .header("content-type", "application/vnd.apache.arrow.stream")
        .header("x-padding", "p".repeat(padding + 1))
        .body(body);
    send(request).await
}

/// arrow-ipc panics decoding a union whose buffers are not aligned, which depends on where the
/// body falls in the gateway's read buffer: refused at the schema, the union is named every
/// time, at every alignment.
#[tokio::test(flavor = "multi_thread")]
async fn a_union_column_is_refused_by_name_twenty_times_out_of_twenty() {
    let gw = GatewayOptions::new().spawn().await;
    TestRun::new(RUN, EXECUTION).full_append(&["t"]).open(&gw).await;
    let built = ipc_stream(&[union_batch()]);
    let upstream = std::fs::read(format!("{}/integration/cpp-21.0.0/generated_union.stream", judge::DATA)).unwrap();
    let before = gw.db_snapshot().await;
    for attempt in 0..20 {
        let (body, column) = if attempt < 10 { (&built, "either") } else { (&upstream, "sparse_1") };
        let answer = post_shifted(&gw, body.clone(), attempt).await;
        let problem = assert_problem(answer, StatusCode::UNPROCESSABLE_ENTITY, "unsupported_type");
        let detail = problem["detail"].as_str().unwrap();
        assert!(detail.contains(&format!("column {column:?}")) && detail.contains("Union"), "{attempt}: {problem}");
    }
    assert_eq!(gw.db_snapshot().await, before, "a refused stream changed the state");
    healthy(&gw).await;
}
