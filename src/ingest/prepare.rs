//! A decoded batch body on its way to AppendRows payloads, in two typed steps:
//!
//! 1. [`prepare`]: the schema mapped and checked against the resource's declaration, the
//!    declared table layout resolved against it, and the size of its staged form computed from
//!    the decoded arrays ([`super::staged_size`]; refused beyond the body limit): a
//!    [`PreparedBatch`], nothing converted yet, so the caller can reserve
//!    [`PreparedBatch::staged_bytes`] of memory before anything expands.
//! 2. [`PreparedBatch::encode`]: every record batch converted to the staging representation
//!    and encoded as payloads below the request budget: an [`EncodedBody`] (what the pipeline
//!    queues) and its [`BodySummary`] (what the receipt records and the lane is told).
//!
//! Nothing here reads HTTP or touches state: `intake` reads the body, the store records
//! the receipt, the pipeline queues the rows.

use bytes::Bytes;

use super::decode::DecodedBody;
use super::encode::{AppendPayload, PayloadLimits, REQUEST_FRAMING_BYTES, schema_message};
use super::schema::{LoadSpec, MappedSchema, map_schema, schema_sha256};
use super::staged_size::{StagedSize, staged_size};
use super::{IngestError, encode_payloads, key_ranges};
use crate::error::Problem;
use crate::model::WriteMode;
use crate::model::key_ranges::KeyRange;
use crate::model::staging::MAX_KEYED_SEQ;
use crate::model::table_layout::TableLayout;
use crate::model::table_options::TableOptions;

/// What a resource declares that shapes its batches.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Declaration<'a> {
    pub(crate) write_mode: WriteMode,
    pub(crate) primary_key: &'a [String],
    pub(crate) order_by: &'a [String],
    pub(crate) table_options: Option<&'a TableOptions>,
}

/// The limits a batch body is prepared under.
#[derive(Debug, Clone, Copy)]
pub(crate) struct BatchLimits {
    /// The body limit, also the most its staged form may take.
    pub(crate) max_batch_body_bytes: usize,
    /// One AppendRows request: payload, writer schema and framing.
    pub(crate) max_append_request_bytes: usize,
}

/// A body whose schema fits its declaration, not converted yet.
#[derive(Debug)]
pub(crate) struct PreparedBatch {
    body: DecodedBody,
    summary: BodySummary,
    staged: StagedSize,
}

/// What the receipt and the resource's lane need of an accepted body.
#[derive(Debug, Clone)]
pub(crate) struct BodySummary {
    pub(crate) rows: usize,
    pub(crate) uncompressed_bytes: usize,
    pub(crate) arrow_ipc_sha256: String,
    /// The incoming schema in canonical JSON: every batch of the resource in the delivery must
    /// repeat it.
    pub(crate) canonical_schema: serde_json::Value,
    pub(crate) canonical_schema_sha256: String,
    pub(crate) mapped: MappedSchema,
    /// The staging schema as one encapsulated IPC message (the writer schema).
    pub(crate) serialized_schema: Bytes,
    /// The largest payload of one AppendRows request: what the request budget leaves beside
    /// its writer schema and framing, and never above the run's `batching.max_bytes`.
    pub(crate) max_payload_bytes: usize,
    /// The most rows of one AppendRows request: the run's batch size.
    pub(crate) max_payload_rows: usize,
    /// The declared table options resolved against this schema.
    pub(crate) destination_layout: TableLayout,
}

/// The body's rows, converted and encoded: what the pipeline queues once its receipt exists.
#[derive(Debug)]
pub(crate) struct EncodedBody {
    pub(crate) payloads: Vec<AppendPayload>,
    pub(crate) rows: usize,
    /// Whether the payloads carry `_filament_seq`, to be stamped once the receipt exists.
    pub(crate) stages_seq: bool,
    /// Keyed modes: the batch's key ranges, recorded with its receipt.
    pub(crate) key_ranges: Option<Vec<KeyRange>>,
}

/// Step 1 (see the module documentation): checks `body` against `declared` and sizes its
/// staged form; `seq` is the request's (keyed modes stage it in 32 bits); `run_batch` the run's
/// batch size (`batching.max_rows`, and `max_bytes` or `usize::MAX`), which no AppendRows
/// request of the body exceeds.
pub(crate) fn prepare(
    body: DecodedBody,
    declared: Declaration<'_>,
    seq: Option<i64>,
    limits: &BatchLimits,
    run_batch: PayloadLimits,
) -> Result<PreparedBatch, Problem> {
    let spec =
        LoadSpec { write_mode: declared.write_mode, primary_key: declared.primary_key, order_by: declared.order_by };
    let mapped = map_schema(&body.schema, spec)?;
    let destination_layout = TableLayout::resolve(
        declared.table_options,
        declared.write_mode,
        declared.primary_key,
        &mapped.destination_columns,
        mapped.incoming.fields(),
    )?;
    if mapped.stages_seq && seq.is_some_and(|seq| seq > MAX_KEYED_SEQ) {
        return Err(Problem::invalid_request(format!(
            "write mode {} orders rows by (seq, row): seq must be at most {MAX_KEYED_SEQ}",
            declared.write_mode
        )));
    }
    let staged = staged_size(&body, &mapped, limits.max_batch_body_bytes)?;
    let canonical_schema = mapped.canonical_json();
    let canonical_schema_sha256 = schema_sha256(&canonical_schema);
    let serialized_schema = schema_message(&mapped.staging);
    let request_payload_bytes =
        limits.max_append_request_bytes.saturating_sub(REQUEST_FRAMING_BYTES + serialized_schema.len()).max(1024);
    let max_payload_bytes = request_payload_bytes.min(run_batch.max_bytes);
    let summary = BodySummary {
        rows: body.rows,
        uncompressed_bytes: body.uncompressed_bytes,
        arrow_ipc_sha256: body.arrow_ipc_sha256.clone(),
        canonical_schema,
        canonical_schema_sha256,
        mapped,
        serialized_schema,
        max_payload_bytes,
        max_payload_rows: run_batch.max_rows,
        destination_layout,
    };
    Ok(PreparedBatch { body, summary, staged })
}

impl PreparedBatch {
    pub(crate) fn summary(&self) -> &BodySummary {
        &self.summary
    }

    /// What the encoded rows take at most: their staged size (the encoding adds only framing,
    /// counted in it).
    pub(crate) fn staged_bytes(&self) -> usize {
        self.staged.bytes
    }

    /// Step 2: converts and encodes every row; fails on the first bad value or row, so
    /// nothing of a rejected body is queued.
    pub(crate) fn encode(self) -> Result<(EncodedBody, BodySummary), IngestError> {
        let Self { body, summary, .. } = self;
        let limits = PayloadLimits { max_bytes: summary.max_payload_bytes, max_rows: summary.max_payload_rows };
        let payloads = encode_payloads(&body, &summary.mapped, limits)?;
        let stages_seq = summary.mapped.stages_seq;
        let key_ranges = stages_seq.then(|| key_ranges::key_ranges(&payloads, &summary.mapped));
        Ok((EncodedBody { payloads, rows: body.rows, stages_seq, key_ranges }, summary))
    }
}
