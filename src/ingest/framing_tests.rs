//! Streams refused at their schema message by [`super`] (through the body decoder), before any record batch is
//! decoded: a big-endian schema, a metadata version, codec or feature flag the gateway does not
//! read (each by its name), and a column it cannot load (a union, whose batches make arrow-ipc
//! panic when their buffers are not aligned).

use std::sync::Arc;

use arrow_array::{Array as _, ArrayRef, Int32Array, Int64Array, RecordBatch, StringArray, UnionArray};
use arrow_buffer::ScalarBuffer;
use arrow_ipc::{Endianness, Feature, MessageHeader, MetadataVersion, root_as_message};
use arrow_schema::{DataType, Field, Schema, UnionFields};
use bytes::Bytes;
use flatbuffers::FlatBufferBuilder;

use crate::ingest::IngestError;
use crate::ingest::decode::{BodyDecoder, DecodedBody};

fn ipc_stream(batch: &RecordBatch, compression: Option<arrow_ipc::CompressionType>) -> Vec<u8> {
    let options = arrow_ipc::writer::IpcWriteOptions::default().try_with_compression(compression).unwrap();
    let mut out = Vec::new();
    let mut writer = arrow_ipc::writer::StreamWriter::try_new_with_options(&mut out, &batch.schema(), options).unwrap();
    writer.write(batch).unwrap();
    writer.finish().unwrap();
    drop(writer);
    out
}

fn ids() -> RecordBatch {
    let schema = Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, false)]));
    RecordBatch::try_new(schema, vec![Arc::new(Int64Array::from(vec![1, 2, 3]))]).unwrap()
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

/// The messages of a stream, each with its framing (continuation marker, length, metadata,
/// body); the end-of-stream marker is left out.
fn messages(stream: &[u8]) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let mut at = 0;
    while at + 8 <= stream.len() {
        let length = u32::from_le_bytes(stream[at + 4..at + 8].try_into().unwrap()) as usize;
        if length == 0 {
            break;
        }
        let body = root_as_message(&stream[at + 8..at + 8 + length]).unwrap().bodyLength() as usize;
        out.push(stream[at..at + 8 + length + body].to_vec());
        at += 8 + length + body;
    }
    out
}

/// The message's metadata, within its framed bytes.
fn metadata(message: &mut [u8]) -> &mut [u8] {
    let length = u32::from_le_bytes(message[4..8].try_into().unwrap()) as usize;
    &mut message[8..8 + length]
}

/// Where in `metadata` the scalar field `slot` of the table at `table` lies (written, not a
/// default the flatbuffer leaves out).
fn field_position(table: &flatbuffers::Table<'_>, slot: flatbuffers::VOffsetT) -> usize {
    let offset = table.vtable().get(slot);
    assert_ne!(offset, 0, "the field is written");
    table.loc() + usize::from(offset)
}

/// A framed schema message of one Int64 column `id`, with the byte order and features given:
/// arrow-ipc's writer sets neither, so it is built with the generated flatbuffer builders.
fn schema_message(endianness: Endianness, features: &[Feature]) -> Vec<u8> {
    let mut fbb = FlatBufferBuilder::new();
    let name = fbb.create_string("id");
    let mut int = arrow_ipc::IntBuilder::new(&mut fbb);
    int.add_bitWidth(64);
    int.add_is_signed(true);
    let int = int.finish();
    let children = fbb.create_vector::<flatbuffers::WIPOffset<arrow_ipc::Field>>(&[]);
    let mut field = arrow_ipc::FieldBuilder::new(&mut fbb);
    field.add_name(name);
    field.add_type_type(arrow_ipc::Type::Int);
    field.add_type_(int.as_union_value());
    field.add_children(children);
    let field = field.finish();
    let fields = fbb.create_vector(&[field]);
    let features = fbb.create_vector(features);
    let mut schema = arrow_ipc::SchemaBuilder::new(&mut fbb);
    schema.add_endianness(endianness);
    schema.add_fields(fields);
    schema.add_features(features);
    let schema = schema.finish();
    let mut message = arrow_ipc::MessageBuilder::new(&mut fbb);
    message.add_version(MetadataVersion::V5);
    message.add_header_type(MessageHeader::Schema);
    message.add_header(schema.as_union_value());
    message.add_bodyLength(0);
    let message = message.finish();
    fbb.finish(message, None);
    let mut metadata = fbb.finished_data().to_vec();
    metadata.resize(metadata.len().next_multiple_of(8), 0);
    let mut framed = vec![0xFF; 4];
    framed.extend_from_slice(&(metadata.len() as u32).to_le_bytes());
    framed.extend_from_slice(&metadata);
    framed
}

/// Pushes `bytes` in chunks of `chunk_size`, each chunk starting at an address `misalign`
/// bytes past an 8-byte boundary; the first error, from a push or from the end.
fn decode(bytes: &[u8], chunk_size: usize, misalign: usize) -> Result<DecodedBody, IngestError> {
    let mut decoder = BodyDecoder::new(1 << 20);
    for chunk in bytes.chunks(chunk_size) {
        let mut padded = vec![0u8; misalign];
        padded.extend_from_slice(chunk);
        decoder.push(Bytes::from(padded).slice(misalign..))?;
    }
    decoder.finish()
}

const END_OF_STREAM: [u8; 8] = [0xFF, 0xFF, 0xFF, 0xFF, 0, 0, 0, 0];

/// A framed record-batch message whose metadata is not a flatbuffer: the decoder would fail on
/// it, so a refusal that names something else was decided before it.
fn garbage_message() -> Vec<u8> {
    let mut message = vec![0xFF; 4];
    message.extend_from_slice(&16u32.to_le_bytes());
    message.extend_from_slice(b"not a flatbuffer");
    message
}

#[test]
fn a_big_endian_schema_is_refused_by_its_byte_order_at_the_schema_message() {
    let big_endian = || IngestError::UnsupportedByteOrder { byte_order: "big-endian".into() };
    let mut decoder = BodyDecoder::new(1 << 20);
    let schema = schema_message(Endianness::Big, &[]);
    assert_eq!(decoder.push(Bytes::from(schema.clone())), Err(big_endian()));
    let mut with_garbage = schema;
    with_garbage.extend_from_slice(&garbage_message());
    for chunk_size in [1, 7, with_garbage.len()] {
        assert_eq!(decode(&with_garbage, chunk_size, 0).err(), Some(big_endian()), "chunks of {chunk_size}");
    }
    // The same schema little-endian, followed by a little-endian batch of its column, loads.
    let mut little = schema_message(Endianness::Little, &[]);
    for message in messages(&ipc_stream(&ids(), None)).into_iter().skip(1) {
        little.extend_from_slice(&message);
    }
    assert_eq!(decode(&little, 5, 0).unwrap().rows, 3);
}

#[test]
fn an_unknown_feature_flag_is_refused_by_name_and_known_ones_are_read() {
    let refused = decode(&schema_message(Endianness::Little, &[Feature(7)]), 3, 0);
    assert_eq!(refused.err(), Some(IngestError::UnsupportedIpcFeature { feature: "number 7".into() }));
    let mut known = schema_message(Endianness::Little, &[Feature::DICTIONARY_REPLACEMENT, Feature::COMPRESSED_BODY]);
    known.extend_from_slice(&END_OF_STREAM);
    assert_eq!(decode(&known, 3, 0).unwrap().rows, 0);
}

#[test]
fn a_metadata_version_other_than_v4_and_v5_is_refused_by_name_in_any_message() {
    let stream = ipc_stream(&ids(), None);
    for (message_index, version, name) in [(0, MetadataVersion::V3, "V3"), (1, MetadataVersion(5), "number 5")] {
        let mut messages = messages(&stream);
        let metadata = metadata(&mut messages[message_index]);
        let at = field_position(&root_as_message(metadata).unwrap()._tab, arrow_ipc::Message::VT_VERSION);
        metadata[at..at + 2].copy_from_slice(&version.0.to_le_bytes());
        let forged = messages.concat();
        let refused = decode(&forged, 64, 0).err();
        assert_eq!(refused, Some(IngestError::UnsupportedIpcVersion { version: name.into() }));
    }
}

#[test]
fn a_compression_codec_other_than_lz4_and_zstd_is_refused_by_name() {
    let stream = ipc_stream(&ids(), Some(arrow_ipc::CompressionType::ZSTD));
    let mut messages = messages(&stream);
    let metadata = metadata(&mut messages[1]);
    let batch = root_as_message(metadata).unwrap().header_as_record_batch().unwrap();
    let at = field_position(&batch.compression().unwrap()._tab, arrow_ipc::BodyCompression::VT_CODEC);
    metadata[at] = 7;
    let refused = decode(&messages.concat(), 16, 0).err();
    assert_eq!(refused, Some(IngestError::UnsupportedCompressionCodec { codec: "number 7".into() }));
}

/// arrow-ipc panics decoding a union whose buffers are not aligned, which the body's chunks
/// decide: the union is refused at the schema, by name, in every chunking and alignment.
#[test]
fn a_union_column_is_refused_at_the_schema_in_every_chunking_and_alignment() {
    let stream = ipc_stream(&union_batch(), None);
    let either = |e: Result<_, IngestError>| match e {
        Err(IngestError::UnsupportedType { column, arrow_type, .. }) => {
            column == "either" && arrow_type.contains("Union")
        }
        _ => false,
    };
    for chunk_size in (1..=17).chain([64, stream.len()]) {
        for misalign in 0..8 {
            assert!(either(decode(&stream, chunk_size, misalign).map(|_| ())), "chunks of {chunk_size}, +{misalign}");
        }
    }
    let mut schema_then_garbage = messages(&stream)[0].clone();
    schema_then_garbage.extend_from_slice(&garbage_message());
    assert!(either(decode(&schema_then_garbage, 9, 3).map(|_| ())));
}
