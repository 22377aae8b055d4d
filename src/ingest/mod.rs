//! Batch bodies, from HTTP bytes to AppendRows payloads.
//!
//! [`decode::BodyDecoder`] consumes the (content-decoded) body chunk by chunk: it hashes the IPC
//! bytes as received (SHA-256), counts them against the body limit and feeds arrow-ipc's push
//! decoder; [`framing`] bounds what IPC-compressed buffers (LZ4_FRAME, ZSTD) decompress to by
//! the same limit before the decoder allocates it. [`schema`] validates the schema (names, reserved prefix, supported types) and maps
//! it to BigQuery columns. [`convert`] turns each record batch into the staging representation
//! (lossless casts, precision checks) and [`encode`] serialises it as encapsulated IPC messages
//! split below the AppendRows request budget and the run's `batching.max_bytes`. The result goes
//! to [`crate::pipeline`], whose lanes check it against an existing destination with
//! [`destination_rules`].

pub(crate) mod convert;
pub mod decode;
pub(crate) mod destination_rules;
pub mod encode;
mod framing;
mod geography;
mod interval;
pub(crate) mod key_ranges;
pub mod message_buffers;
pub(crate) mod prepare;
mod range_values;
mod scalars;
pub mod schema;
pub(crate) mod staged_size;

use std::sync::Arc;

use arrow_array::RecordBatch;
use bytes::Bytes;

use crate::error::{ErrorCode, Problem};

/// Converts every record batch of a decoded body to the staging representation and encodes it
/// as AppendRows payloads within `limits`; fails on the first bad value or row, so nothing of a
/// rejected body is queued.
pub fn encode_payloads(
    body: &decode::DecodedBody,
    mapped: &schema::MappedSchema,
    limits: encode::PayloadLimits,
) -> Result<Vec<encode::AppendPayload>, IngestError> {
    if body.rows as u64 >= 1u64 << crate::model::staging::SEQ_SHIFT {
        return Err(IngestError::TooManyRows { rows: body.rows });
    }
    let mut payloads = Vec::new();
    let mut first_row = 0;
    for decoded in &body.batches {
        let batch = &decoded.batch;
        let staged = convert::to_staging(batch, mapped, first_row)?;
        match forwardable(decoded, &staged, limits) {
            Some(message) => payloads.push(encode::AppendPayload {
                rows: staged.num_rows(),
                first_row,
                serialized_record_batch: message,
                batch: Some(staged),
            }),
            None => encode::split_into_payloads(&staged, first_row, limits, &mut payloads)?,
        }
        first_row += batch.num_rows();
    }
    Ok(payloads)
}

/// The body's own record-batch message, when it already is what the staging schema would
/// encode: staging kept every column as received (same arrays, same order, none added) and
/// the message fits one request. Then no byte is decoded into new buffers or encoded again.
fn forwardable(decoded: &decode::DecodedBatch, staged: &RecordBatch, limits: encode::PayloadLimits) -> Option<Bytes> {
    let message = decoded.forwardable_message.as_ref()?;
    let received = decoded.batch.columns();
    let unchanged = staged.num_rows() > 0
        && staged.num_columns() == received.len()
        && staged.columns().iter().zip(received).all(|(staged, received)| Arc::ptr_eq(staged, received));
    let fits = message.len() <= limits.max_bytes && staged.num_rows() <= limits.max_rows;
    (unchanged && fits).then(|| message.clone())
}

/// Why a batch body was rejected. Every variant is the client's to fix; none is retryable.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum IngestError {
    #[error("the body is not a valid Arrow IPC stream: {0}")]
    InvalidIpc(String),
    #[error("the body exceeds the limit of {limit_bytes} bytes after content decoding (Arrow buffers decompressed)")]
    BodyTooLarge { limit_bytes: usize },
    #[error(
        "the body's rows take {staged_bytes} bytes once staged, above the limit of {limit_bytes} bytes; column {column:?} alone takes {column_bytes} bytes (dictionary indices, string views and narrow integers expand when converted)"
    )]
    StagedTooLarge { staged_bytes: usize, limit_bytes: usize, column: String, column_bytes: usize },
    #[error("column {column:?} has Arrow type {arrow_type}, which is not supported: {reason}")]
    UnsupportedType { column: String, arrow_type: String, reason: String },
    #[error(
        "the stream's schema says its buffers are {byte_order}; the gateway reads little-endian Arrow IPC streams only"
    )]
    UnsupportedByteOrder { byte_order: String },
    #[error(
        "a record batch of the stream is compressed with codec {codec}; the gateway reads buffers compressed with LZ4_FRAME or ZSTD"
    )]
    UnsupportedCompressionCodec { codec: String },
    #[error(
        "the stream's messages have Arrow IPC metadata version {version}; the gateway reads V4 (Arrow 0.8 to 0.17) and V5 (Arrow 1.0 and later)"
    )]
    UnsupportedIpcVersion { version: String },
    #[error("the stream's schema declares Arrow IPC feature {feature}, which the gateway does not know")]
    UnsupportedIpcFeature { feature: String },
    #[error("{0}")]
    InvalidColumn(String),
    #[error("column {column:?} row {row}: {reason}")]
    PrecisionLoss { column: String, row: usize, reason: String },
    #[error("column {column:?} row {row}: {reason}")]
    InvalidValue { column: String, row: usize, reason: String },
    #[error("{0}")]
    InvalidOperation(String),
    #[error("{0}")]
    InvalidPrimaryKey(String),
    #[error("key column {column:?} is null in row {row}")]
    NullPrimaryKey { column: String, row: usize },
    #[error("column {column:?} row {row}: NULL, and the destination table's column is REQUIRED")]
    NullInRequiredColumn { column: String, row: usize },
    #[error("{0}")]
    InvalidOrderBy(String),
    #[error("order_by column {column:?} is null in row {row}")]
    NullOrderBy { column: String, row: usize },
    #[error("the body holds {rows} rows; one request takes fewer than 2^32")]
    TooManyRows { rows: usize },
    #[error(
        "row {row} encodes to {row_bytes} bytes, above the {limit_bytes}-byte payload limit (the append request budget, or the run's batching.max_bytes when smaller)"
    )]
    RowTooLarge { row: usize, row_bytes: usize, limit_bytes: usize },
    #[error("arrow: {0}")]
    Arrow(String),
}

impl IngestError {
    pub fn code(&self) -> ErrorCode {
        match self {
            IngestError::InvalidIpc(_) => ErrorCode::InvalidArrowIpc,
            IngestError::BodyTooLarge { .. } | IngestError::StagedTooLarge { .. } => ErrorCode::PayloadTooLarge,
            IngestError::UnsupportedType { .. } => ErrorCode::UnsupportedType,
            IngestError::UnsupportedByteOrder { .. } => ErrorCode::UnsupportedByteOrder,
            IngestError::UnsupportedCompressionCodec { .. } => ErrorCode::UnsupportedCompressionCodec,
            IngestError::UnsupportedIpcVersion { .. } => ErrorCode::UnsupportedIpcVersion,
            IngestError::UnsupportedIpcFeature { .. } => ErrorCode::UnsupportedIpcFeature,
            IngestError::InvalidColumn(_) => ErrorCode::InvalidIdentifier,
            IngestError::PrecisionLoss { .. } => ErrorCode::PrecisionLoss,
            IngestError::InvalidValue { .. } => ErrorCode::InvalidValue,
            IngestError::InvalidOperation(_) => ErrorCode::InvalidOperation,
            IngestError::InvalidPrimaryKey(_) => ErrorCode::InvalidPrimaryKey,
            IngestError::NullPrimaryKey { .. } => ErrorCode::NullPrimaryKey,
            IngestError::NullInRequiredColumn { .. } => ErrorCode::NullInRequiredColumn,
            IngestError::InvalidOrderBy(_) | IngestError::NullOrderBy { .. } => ErrorCode::InvalidOrderBy,
            IngestError::TooManyRows { .. } => ErrorCode::PayloadTooLarge,
            IngestError::RowTooLarge { .. } => ErrorCode::RowTooLarge,
            IngestError::Arrow(_) => ErrorCode::InvalidArrowIpc,
        }
    }
}

impl From<IngestError> for Problem {
    fn from(err: IngestError) -> Self {
        let hint = match &err {
            IngestError::BodyTooLarge { .. } | IngestError::TooManyRows { .. } | IngestError::StagedTooLarge { .. } => {
                Some("split the data into several batch requests")
            }
            IngestError::NullPrimaryKey { .. } => {
                Some("keyed write modes need every key value; drop or repair rows with null keys at the source")
            }
            IngestError::NullOrderBy { .. } => {
                Some("every change of a resource with order_by needs its order value: the largest one wins")
            }
            IngestError::RowTooLarge { .. } => Some(
                "one row must fit one append request (FILAMENT_MAX_APPEND_REQUEST_BYTES, at most BigQuery's 20 MB; a GEOGRAPHY value 9 MiB whatever the setting); shrink or split the row's large values, or raise the run's batching.max_bytes",
            ),
            IngestError::PrecisionLoss { reason, .. } if reason.contains("FLOAT64") => Some(
                "the existing column is FLOAT64: send doubles (Float64) to have the values rounded, or load \
                 into a NUMERIC, BIGNUMERIC or INT64 column",
            ),
            IngestError::PrecisionLoss { .. } => {
                Some("BigQuery stores microseconds at most: truncate or round the values before sending")
            }
            IngestError::UnsupportedByteOrder { .. } => Some(
                "Arrow writes the host's byte order: write the stream on a little-endian host (x86-64, ARM), or with Arrow Java, which always writes little-endian",
            ),
            IngestError::UnsupportedCompressionCodec { .. } => {
                Some("write the stream with LZ4_FRAME or ZSTD buffer compression, or none")
            }
            IngestError::NullInRequiredColumn { .. } => Some(
                "the existing table requires a value in this column: send one in every row, or relax the column to NULLABLE",
            ),
            _ => None,
        };
        let problem = Problem::new(err.code(), err.to_string());
        match hint {
            Some(hint) => problem.with_hint(hint),
            None => problem,
        }
    }
}
