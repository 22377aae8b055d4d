//! One AppendRows request as a gRPC length-prefixed message, built here rather than by tonic's
//! encoder: tonic compresses with zlib at a fixed gzip level 6, about ten times the CPU of level
//! 1, and compression is most of the gateway's CPU (`docs/performance.md`).
//!
//! The request is protobuf-encoded in two parts, the small fields first and the record batch's
//! bytes last (protobuf fields may come in any order), and both parts go straight into ISA-L's
//! gzip (igzip: faster than zlib-rs at level 1, with a better ratio): the record batch, often
//! the very bytes the extractor sent, is read once, by the compressor, and never copied into a
//! contiguous encoded request. [`super::write`] sends the frames.

use std::io::Write as _;

use bytes::{BufMut as _, Bytes, BytesMut};
use googleapis_tonic_google_cloud_bigquery_storage_v1::google::cloud::bigquery::storage::v1::{
    AppendRowsRequest, ArrowRecordBatch, append_rows_request,
};
use prost::Message as _;
use prost::encoding::{WireType, encode_key, encode_varint, encoded_len_varint, key_len};

/// ISA-L's gzip levels: it has 0 (fastest, largest), 1 and 3 (its smallest).
/// `FILAMENT_APPEND_GZIP_LEVEL` 1 is ISA-L level 1; 2 to 9 ask for smaller requests: level 3.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum GzipLevel {
    Fast,
    Small,
}

impl GzipLevel {
    /// The level for a `FILAMENT_APPEND_GZIP_LEVEL` setting; 0 is uncompressed.
    pub(crate) fn from_setting(setting: u32) -> Option<Self> {
        match setting {
            0 => None,
            1 => Some(Self::Fast),
            _ => Some(Self::Small),
        }
    }

    fn isal(self) -> isal::CompressionLevel {
        match self {
            Self::Fast => isal::CompressionLevel::One,
            Self::Small => isal::CompressionLevel::Three,
        }
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Fast => "gzip-isal-1",
            Self::Small => "gzip-isal-3",
        }
    }
}

/// Input fed to ISA-L per call: its stateful encoder gathers a call's whole output before
/// writing it on, so pieces keep that buffer small and in cache.
const GZIP_INPUT_PIECE_BYTES: usize = 256 * 1024;

/// `AppendRowsRequest.arrow_rows`, `ArrowData.writer_schema`, `ArrowData.rows` and
/// `ArrowRecordBatch.serialized_record_batch`.
const ARROW_ROWS_FIELD: u32 = 5;
const ARROW_DATA_WRITER_SCHEMA_FIELD: u32 = 1;
const ARROW_DATA_ROWS_FIELD: u32 = 2;
const SERIALIZED_RECORD_BATCH_FIELD: u32 = 1;

/// A request's protobuf encoding as two byte runs whose concatenation decodes to the request:
/// every field but the record batch's bytes, then those bytes (shared, not copied).
#[derive(Debug)]
struct RequestWire {
    head: Vec<u8>,
    record_batch: Bytes,
}

impl RequestWire {
    fn new(request: &AppendRowsRequest) -> Self {
        let Some(append_rows_request::Rows::ArrowRows(arrow)) = &request.rows else {
            return Self { head: request.encode_to_vec(), record_batch: Bytes::new() };
        };
        let batch = arrow.rows.clone().unwrap_or_default();
        let record_batch = batch.serialized_record_batch.clone();
        if record_batch.is_empty() {
            // Nothing to share; prost's own encoding leaves the empty field out.
            return Self { head: request.encode_to_vec(), record_batch };
        }
        let other_fields = AppendRowsRequest { rows: None, ..request.clone() };
        let batch_fields = ArrowRecordBatch { serialized_record_batch: Bytes::new(), ..batch };
        let batch_length = batch_fields.encoded_len()
            + key_len(SERIALIZED_RECORD_BATCH_FIELD)
            + encoded_len_varint(record_batch.len() as u64)
            + record_batch.len();
        let schema_length = arrow.writer_schema.as_ref().map_or(0, |schema| {
            let length = schema.encoded_len();
            key_len(ARROW_DATA_WRITER_SCHEMA_FIELD) + encoded_len_varint(length as u64) + length
        });
        let arrow_length =
            schema_length + key_len(ARROW_DATA_ROWS_FIELD) + encoded_len_varint(batch_length as u64) + batch_length;
        let mut head = Vec::with_capacity(other_fields.encoded_len() + schema_length + 64);
        other_fields.encode_raw(&mut head);
        encode_key(ARROW_ROWS_FIELD, WireType::LengthDelimited, &mut head);
        encode_varint(arrow_length as u64, &mut head);
        if let Some(schema) = &arrow.writer_schema {
            prost::encoding::message::encode(ARROW_DATA_WRITER_SCHEMA_FIELD, schema, &mut head);
        }
        encode_key(ARROW_DATA_ROWS_FIELD, WireType::LengthDelimited, &mut head);
        encode_varint(batch_length as u64, &mut head);
        batch_fields.encode_raw(&mut head);
        encode_key(SERIALIZED_RECORD_BATCH_FIELD, WireType::LengthDelimited, &mut head);
        encode_varint(record_batch.len() as u64, &mut head);
        Self { head, record_batch }
    }

    fn len(&self) -> usize {
        self.head.len() + self.record_batch.len()
    }

    fn pieces(&self) -> impl Iterator<Item = &[u8]> {
        std::iter::once(self.head.as_slice()).chain(self.record_batch.chunks(GZIP_INPUT_PIECE_BYTES))
    }
}

/// One gRPC length-prefixed message: compressed flag, big-endian length, the (compressed)
/// protobuf bytes.
pub(crate) fn grpc_frame(request: &AppendRowsRequest, gzip_level: Option<GzipLevel>) -> std::io::Result<Bytes> {
    let wire = RequestWire::new(request);
    let capacity = 5 + if gzip_level.is_some() { wire.len() / 2 } else { wire.len() };
    let mut frame = BytesMut::with_capacity(capacity);
    frame.put_u8(u8::from(gzip_level.is_some()));
    frame.put_u32(0);
    match gzip_level {
        Some(level) => {
            let mut encoder = isal::write::Encoder::new((&mut frame).writer(), level.isal(), isal::Codec::Gzip);
            for piece in wire.pieces() {
                encoder.write_all(piece)?;
            }
            encoder.finish()?;
        }
        None => wire.pieces().for_each(|piece| frame.extend_from_slice(piece)),
    }
    let length = (frame.len() - 5) as u32;
    frame[1..5].copy_from_slice(&length.to_be_bytes());
    Ok(frame.freeze())
}

#[cfg(test)]
mod tests {
    use googleapis_tonic_google_cloud_bigquery_storage_v1::google::cloud::bigquery::storage::v1::ArrowSchema;

    use super::*;

    /// `row_count` is deprecated (BigQuery counts the rows itself) but still a field on the wire:
    /// the frame must carry whatever the request holds.
    #[allow(deprecated)]
    fn arrow_request(writer_schema: Option<&[u8]>, record_batch: Vec<u8>, row_count: i64) -> AppendRowsRequest {
        AppendRowsRequest {
            write_stream: "projects/p/datasets/d/tables/t/streams/s".into(),
            offset: Some(40_000),
            trace_id: "filament".into(),
            rows: Some(append_rows_request::Rows::ArrowRows(append_rows_request::ArrowData {
                writer_schema: writer_schema.map(|s| ArrowSchema { serialized_schema: Bytes::copy_from_slice(s) }),
                rows: Some(ArrowRecordBatch { serialized_record_batch: record_batch.into(), row_count }),
            })),
            ..Default::default()
        }
    }

    fn unframe(frame: &[u8]) -> AppendRowsRequest {
        assert_eq!(u32::from_be_bytes(frame[1..5].try_into().unwrap()) as usize, frame.len() - 5);
        match frame[0] {
            0 => AppendRowsRequest::decode(&frame[5..]).unwrap(),
            _ => {
                let mut decompressed = Vec::new();
                let mut decoder = flate2::read::GzDecoder::new(&frame[5..]);
                std::io::Read::read_to_end(&mut decoder, &mut decompressed).unwrap();
                AppendRowsRequest::decode(decompressed.as_slice()).unwrap()
            }
        }
    }

    /// The two-part encoding decodes (as tonic decodes it: prost, flate2's gzip) to the request,
    /// with and without a writer schema, with a row count, empty and larger than one piece,
    /// plain and at both ISA-L levels.
    #[test]
    fn frames_decode_to_the_request() {
        let large: Vec<u8> = (0..3 * GZIP_INPUT_PIECE_BYTES as u32).map(|i| (i % 251) as u8).collect();
        let requests = [
            arrow_request(Some(b"schema message"), large.clone(), 0),
            arrow_request(None, large, 12_345),
            arrow_request(None, Vec::new(), 0),
            arrow_request(Some(&[7; 300]), vec![1; 200], 3),
            AppendRowsRequest { write_stream: "s".into(), offset: Some(7), ..Default::default() },
        ];
        for request in &requests {
            let wire = RequestWire::new(request);
            assert_eq!(wire.len(), request.encoded_len());
            for level in [None, Some(GzipLevel::Fast), Some(GzipLevel::Small)] {
                let frame = grpc_frame(request, level).unwrap();
                assert_eq!(frame[0], u8::from(level.is_some()));
                assert_eq!(&unframe(&frame), request, "{level:?}");
            }
        }
    }

    /// Compression is on when asked, and pays off on repetitive data.
    #[test]
    fn gzip_frames_are_smaller() {
        let request = arrow_request(None, (0..1_000_000u32).map(|i| (i % 17) as u8).collect(), 0);
        let plain = grpc_frame(&request, None).unwrap();
        for level in [GzipLevel::Fast, GzipLevel::Small] {
            let compressed = grpc_frame(&request, Some(level)).unwrap();
            assert!(compressed.len() < plain.len() / 4, "{level:?}: {} of {}", compressed.len(), plain.len());
        }
    }

    #[test]
    fn gzip_settings_map_to_isal_levels() {
        assert_eq!(GzipLevel::from_setting(0), None);
        assert_eq!(GzipLevel::from_setting(1), Some(GzipLevel::Fast));
        assert_eq!(GzipLevel::from_setting(6), Some(GzipLevel::Small));
    }
}
