//! Encapsulated Arrow IPC messages for the Storage Write API (`ArrowSchema.serialized_schema`,
//! `ArrowRecordBatch.serialized_record_batch`): one schema message, and record-batch messages
//! without schema or end-of-stream marker, each below the AppendRows request budget.

use std::sync::Arc;

use arrow_array::RecordBatch;
use arrow_array::cast::AsArray as _;
use arrow_array::types::Int64Type;
use arrow_ipc::writer::{DictionaryTracker, IpcDataGenerator, IpcWriteContext, IpcWriteOptions, write_message};
use arrow_schema::Schema;
use bytes::Bytes;

use super::IngestError;
use super::convert::seq_values;
use crate::model::staging::SEQ_COLUMN;

/// Protobuf framing of an AppendRowsRequest besides the record batch and schema: stream name,
/// offset, field tags and lengths. Generous on purpose.
pub(crate) const REQUEST_FRAMING_BYTES: usize = 4 * 1024;

/// One AppendRows payload: a record-batch message, the number of rows it holds and the staged
/// rows it encodes (a zero-copy slice), which the pipeline keeps to coalesce small payloads and
/// to check them against the destination (`super::destination_rules`).
#[derive(Debug, Clone)]
pub struct AppendPayload {
    pub(crate) rows: usize,
    /// The index of its first row in the body, which error messages name rows by.
    pub(crate) first_row: usize,
    pub(crate) serialized_record_batch: Bytes,
    pub(crate) batch: Option<RecordBatch>,
}

/// One encapsulated schema message (no end-of-stream marker: the emulator, and BigQuery's
/// contract, expect exactly one message).
pub(crate) fn schema_message(schema: &Schema) -> Bytes {
    let options = IpcWriteOptions::default();
    let encoded = IpcDataGenerator::default().schema_to_bytes_with_dictionary_tracker(
        schema,
        &mut DictionaryTracker::new(false),
        &options,
    );
    let mut out = Vec::new();
    // Writing into a Vec cannot fail.
    let _ = write_message(&mut out, encoded, &options);
    Bytes::from(out)
}

/// One encapsulated record-batch message. Staged batches hold no dictionaries.
pub(crate) fn record_batch_message(batch: &RecordBatch) -> Result<Bytes, IngestError> {
    let options = IpcWriteOptions::default();
    let (dictionaries, encoded) = IpcDataGenerator::default()
        .encode(batch, &mut DictionaryTracker::new(false), &options, &mut IpcWriteContext::default())
        .map_err(|e| IngestError::Arrow(e.to_string()))?;
    debug_assert!(dictionaries.is_empty(), "staged batches are dictionary-free");
    let mut out = Vec::with_capacity(encoded.ipc_message.len() + encoded.arrow_data.len() + 16);
    write_message(&mut out, encoded, &options).map_err(|e| IngestError::Arrow(e.to_string()))?;
    Ok(Bytes::from(out))
}

/// Adds the batch's `seq` to the staged `_filament_seq` (which holds row indices until the
/// receipt assigns the seq) and re-encodes the payloads; the sizes do not change.
pub(crate) fn stamp_seq(payloads: &mut [AppendPayload], seq: i64) -> Result<(), IngestError> {
    for payload in payloads {
        let Some(batch) = payload.batch.as_ref() else {
            return Err(IngestError::Arrow("a payload without its staged rows cannot be stamped".into()));
        };
        let Some((index, _)) = batch.schema().column_with_name(SEQ_COLUMN) else {
            return Ok(());
        };
        let mut columns = batch.columns().to_vec();
        let rows = columns[index].as_primitive::<Int64Type>();
        columns[index] = Arc::new(seq_values(rows, seq));
        let stamped = RecordBatch::try_new(batch.schema(), columns).map_err(|e| IngestError::Arrow(e.to_string()))?;
        payload.serialized_record_batch = record_batch_message(&stamped)?;
        payload.batch = Some(stamped);
    }
    Ok(())
}

/// How large one AppendRows payload may be: its encoded bytes (the request budget less the
/// writer schema and framing) and its rows (the run's `batching.max_rows`, so that a large
/// body is appended in requests of the run's batch size too).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PayloadLimits {
    pub max_bytes: usize,
    pub max_rows: usize,
}

/// Encodes `batch` as payloads within `limits`, splitting by rows. A single row above the byte
/// budget fails with its index (`first_row` + its position in `batch`).
pub(crate) fn split_into_payloads(
    batch: &RecordBatch,
    first_row: usize,
    limits: PayloadLimits,
    out: &mut Vec<AppendPayload>,
) -> Result<(), IngestError> {
    let rows = batch.num_rows();
    if rows == 0 {
        return Ok(());
    }
    let max_rows = limits.max_rows.max(1);
    if rows > max_rows {
        let mut offset = 0;
        while offset < rows {
            let length = max_rows.min(rows - offset);
            split_into_payloads(&batch.slice(offset, length), first_row + offset, limits, out)?;
            offset += length;
        }
        return Ok(());
    }
    let max_payload_bytes = limits.max_bytes;
    let message = record_batch_message(batch)?;
    if message.len() <= max_payload_bytes {
        out.push(AppendPayload { rows, first_row, serialized_record_batch: message, batch: Some(batch.clone()) });
        return Ok(());
    }
    if rows == 1 {
        return Err(IngestError::RowTooLarge {
            row: first_row,
            row_bytes: message.len(),
            limit_bytes: max_payload_bytes,
        });
    }
    // Aim for 90% of the budget from the average row size; uneven rows recurse further.
    let bytes_per_row = message.len().div_ceil(rows).max(1);
    let rows_per_chunk = (max_payload_bytes / 10 * 9 / bytes_per_row).clamp(1, rows.div_ceil(2));
    let mut offset = 0;
    while offset < rows {
        let length = rows_per_chunk.min(rows - offset);
        split_into_payloads(&batch.slice(offset, length), first_row + offset, limits, out)?;
        offset += length;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use arrow_array::{Int64Array, StringArray};
    use arrow_ipc::reader::StreamReader;
    use arrow_schema::{DataType, Field};

    use super::*;

    fn batch(values: Vec<String>) -> RecordBatch {
        let n = values.len() as i64;
        RecordBatch::try_new(
            Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, true), Field::new("s", DataType::Utf8, true)])),
            vec![Arc::new(Int64Array::from((0..n).collect::<Vec<_>>())), Arc::new(StringArray::from(values))],
        )
        .unwrap()
    }

    /// Rebuilds a stream from the schema message and payloads, as BigQuery would read them.
    fn read_back(schema: &Schema, payloads: &[AppendPayload]) -> Vec<RecordBatch> {
        let mut stream = schema_message(schema).to_vec();
        for p in payloads {
            stream.extend_from_slice(&p.serialized_record_batch);
        }
        StreamReader::try_new(std::io::Cursor::new(stream), None).unwrap().map(|b| b.unwrap()).collect()
    }

    /// The first (Int64) column of every payload, read back in order.
    fn ids_read_back(input: &RecordBatch, payloads: &[AppendPayload]) -> Vec<i64> {
        read_back(&input.schema(), payloads)
            .iter()
            .flat_map(|b| b.column(0).as_any().downcast_ref::<Int64Array>().unwrap().values().to_vec())
            .collect()
    }

    #[test]
    fn splits_below_the_budget_and_keeps_every_row_in_order() {
        let input = batch((0..1000).map(|i| format!("value-{i}-{}", "x".repeat(i % 50))).collect());
        let mut payloads = Vec::new();
        split_into_payloads(&input, 0, PayloadLimits { max_bytes: 8 * 1024, max_rows: 20_000 }, &mut payloads).unwrap();
        assert!(payloads.len() > 1);
        assert!(payloads.iter().all(|p| p.serialized_record_batch.len() <= 8 * 1024));
        assert_eq!(payloads.iter().map(|p| p.rows).sum::<usize>(), 1000);
        assert_eq!(ids_read_back(&input, &payloads), (0..1000).collect::<Vec<_>>());
    }

    #[test]
    fn a_single_oversized_row_is_reported_with_its_index() {
        let mut values: Vec<String> = (0..10).map(|i| i.to_string()).collect();
        values[7] = "y".repeat(64 * 1024);
        let limits = PayloadLimits { max_bytes: 16 * 1024, max_rows: 20_000 };
        let err = split_into_payloads(&batch(values), 100, limits, &mut Vec::new()).unwrap_err();
        assert!(matches!(err, IngestError::RowTooLarge { row: 107, .. }), "{err:?}");
    }

    #[test]
    fn a_batch_of_more_rows_than_the_run_batches_is_split_into_the_runs_batch_size() {
        let input = batch((0..2_500).map(|i| i.to_string()).collect());
        let mut payloads = Vec::new();
        split_into_payloads(&input, 0, PayloadLimits { max_bytes: 8 << 20, max_rows: 1_000 }, &mut payloads).unwrap();
        assert_eq!(payloads.iter().map(|p| p.rows).collect::<Vec<_>>(), [1_000, 1_000, 500]);
        assert_eq!(ids_read_back(&input, &payloads), (0..2_500).collect::<Vec<_>>());
    }

    #[test]
    fn the_schema_message_has_no_end_of_stream_marker() {
        let message = schema_message(&batch(vec![]).schema());
        assert_eq!(&message[..4], &[0xFF, 0xFF, 0xFF, 0xFF]);
        assert_ne!(&message[message.len() - 8..], &[0xFF, 0xFF, 0xFF, 0xFF, 0, 0, 0, 0]);
    }
}
