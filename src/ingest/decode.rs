//! Incremental decoding of a batch body: SHA-256 of the IPC bytes as received (after content
//! decoding), a byte limit on them and on their decompressed buffers ([`MessageFraming`]: IPC
//! buffer compression, LZ4_FRAME and ZSTD), and arrow-ipc's push-based [`StreamDecoder`].

use std::cell::Cell;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;

use arrow_array::RecordBatch;
use arrow_buffer::Buffer;
use arrow_ipc::reader::StreamDecoder;
use arrow_schema::SchemaRef;
use bytes::Bytes;
use sha2::{Digest as _, Sha256};

use super::IngestError;
use super::framing::MessageFraming;
use super::message_buffers::{MessageBuffer, MessageBuffers};

thread_local! {
    static CONTAINING_PANIC: Cell<bool> = const { Cell::new(false) };
}

/// Whether the current thread is inside a decoder call whose panics are contained (reported as
/// `invalid_arrow_ipc`). Panic hooks use it to stay quiet for those and loud for the rest.
pub fn panic_is_contained() -> bool {
    CONTAINING_PANIC.with(Cell::get)
}

/// arrow-ipc panics on some malformed messages (for example buffer offsets beyond the body)
/// instead of returning an error; bodies are untrusted, so such a panic becomes an error here.
fn contained<T>(operation: impl FnOnce() -> T) -> Result<T, IngestError> {
    CONTAINING_PANIC.with(|c| c.set(true));
    let result = catch_unwind(AssertUnwindSafe(operation));
    CONTAINING_PANIC.with(|c| c.set(false));
    result.map_err(|_| IngestError::InvalidIpc("malformed message: buffers outside the message body".into()))
}

/// One record batch of a body, with the bytes of its IPC message when a Storage Write request
/// can carry them as they are (see [`super::framing::CompletedMessage`]).
#[derive(Debug)]
pub(crate) struct DecodedBatch {
    pub(crate) batch: RecordBatch,
    /// The encapsulated message (continuation marker, length, metadata, body) the batch was
    /// decoded from; the batch's buffers point into it.
    pub(crate) forwardable_message: Option<Bytes>,
}

/// What a complete body held.
#[derive(Debug)]
pub struct DecodedBody {
    pub schema: SchemaRef,
    pub(crate) batches: Vec<DecodedBatch>,
    pub(crate) rows: usize,
    /// Bytes of the IPC stream after content decoding.
    pub(crate) uncompressed_bytes: usize,
    /// Lowercase hex SHA-256 of those bytes.
    pub(crate) arrow_ipc_sha256: String,
}

/// Push decoder over the chunks of one body.
#[derive(Debug)]
pub struct BodyDecoder {
    decoder: StreamDecoder,
    framing: MessageFraming,
    hasher: Sha256,
    /// The message being received.
    message: MessageAssembly,
    buffers: Arc<MessageBuffers>,
    batches: Vec<DecodedBatch>,
    received_bytes: usize,
    max_body_bytes: usize,
    /// The message [`Self::push_some`] completed, until it is decoded.
    completed: Option<super::framing::CompletedMessage>,
}

/// What [`BodyDecoder::push_some`] reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Progress {
    /// The bytes belong to a message not yet complete.
    NeedMore,
    /// A message is complete: decoding it allocates `decompressed_bytes` beyond the bytes
    /// received (its IPC-compressed buffers, decompressed).
    MessageComplete { decompressed_bytes: usize },
}

impl BodyDecoder {
    /// A decoder joining each message into a fresh allocation.
    pub fn new(max_body_bytes: usize) -> Self {
        Self::pooled(max_body_bytes, MessageBuffers::unpooled())
    }

    /// A decoder joining each message into a buffer of `buffers` (the replica's pool).
    pub fn pooled(max_body_bytes: usize, buffers: Arc<MessageBuffers>) -> Self {
        Self {
            decoder: StreamDecoder::new(),
            framing: MessageFraming::new(max_body_bytes),
            hasher: Sha256::new(),
            message: MessageAssembly::default(),
            buffers,
            batches: Vec::new(),
            received_bytes: 0,
            max_body_bytes,
            completed: None,
        }
    }

    /// Consumes one chunk. Each message is decoded as soon as its last byte arrives, and only
    /// once the framing has accepted its decompressed size, so a body is never buffered whole
    /// beyond its decoded batches (whose buffers are the message bytes, joined once).
    pub fn push(&mut self, mut chunk: Bytes) -> Result<(), IngestError> {
        while !chunk.is_empty() {
            if let Progress::MessageComplete { .. } = self.push_some(&mut chunk)? {
                self.decode_completed()?;
            }
        }
        Ok(())
    }

    /// Takes the bytes of `chunk` up to the end of the next message (the rest stays in
    /// `chunk`). When a message is complete, the caller may account for what decoding it
    /// allocates, then calls [`Self::decode_completed`] before pushing more.
    pub fn push_some(&mut self, chunk: &mut Bytes) -> Result<Progress, IngestError> {
        let taken = self.framing.advance(chunk)?;
        self.received_bytes = self.received_bytes.saturating_add(taken);
        if self.received_bytes > self.max_body_bytes {
            return Err(IngestError::BodyTooLarge { limit_bytes: self.max_body_bytes });
        }
        let piece = chunk.split_to(taken);
        self.hasher.update(&piece);
        let remaining = self.framing.body_bytes_remaining();
        self.message.push(piece, remaining, self.max_body_bytes, &self.buffers);
        Ok(match self.framing.take_completed() {
            Some(completed) => {
                self.completed = Some(completed);
                Progress::MessageComplete { decompressed_bytes: completed.decompressed_bytes as usize }
            }
            None => Progress::NeedMore,
        })
    }

    /// The bytes the body holds in memory, to count in the receive budget: those received,
    /// and the room the message in progress has taken beyond them (its buffer is taken at its
    /// whole length once the length is known).
    pub fn bytes_to_hold(&self) -> usize {
        self.received_bytes.saturating_add(self.message.bytes_ahead())
    }

    /// Decodes the message [`Self::push_some`] completed.
    pub fn decode_completed(&mut self) -> Result<(), IngestError> {
        match self.completed.take() {
            Some(completed) => self.decode_message(completed.forwardable_record_batch),
            None => Ok(()),
        }
    }

    /// Feeds the pieces received since the last complete message to the decoder, as one buffer.
    fn decode_message(&mut self, forwardable_record_batch: bool) -> Result<(), IngestError> {
        let message = self.message.take(&self.buffers);
        let mut buffer = Buffer::from(message.clone());
        while !buffer.is_empty() {
            match contained(|| self.decoder.decode(&mut buffer))? {
                Ok(Some(batch)) => {
                    let forwardable_message = forwardable_record_batch.then(|| message.clone());
                    self.batches.push(DecodedBatch { batch, forwardable_message });
                }
                Ok(None) => {}
                Err(e) => return Err(IngestError::InvalidIpc(e.to_string())),
            }
        }
        Ok(())
    }

    /// Ends the body: a truncated stream or one without a schema is invalid.
    pub fn finish(mut self) -> Result<DecodedBody, IngestError> {
        self.decode_completed()?;
        if !self.message.is_empty() {
            // The end-of-stream marker, or the start of a message that never completed.
            self.decode_message(false)?;
        }
        self.decoder.finish().map_err(|e| IngestError::InvalidIpc(format!("truncated stream: {e}")))?;
        let schema = self
            .decoder
            .schema()
            .ok_or_else(|| IngestError::InvalidIpc("the stream holds no schema message".into()))?;
        let rows = self.batches.iter().map(|decoded| decoded.batch.num_rows()).sum();
        Ok(DecodedBody {
            schema,
            batches: self.batches,
            rows,
            uncompressed_bytes: self.received_bytes,
            arrow_ipc_sha256: hex::encode(self.hasher.finalize()),
        })
    }
}

/// The bytes of the message being received: its first pieces (slices of the connection's
/// reads) until its length is known, then one buffer of that length the rest is copied into,
/// so the reads' buffers are not held until the message completes.
#[derive(Debug, Default)]
struct MessageAssembly {
    pieces: Vec<Bytes>,
    buffer: Option<MessageBuffer>,
}

impl MessageAssembly {
    /// Adds the next piece; `body_bytes_remaining` is what the framing still expects of the
    /// message's body after it, when known. A message declaring more than `max_body_bytes`
    /// gets no buffer (its body is refused before it is all received).
    fn push(
        &mut self,
        piece: Bytes,
        body_bytes_remaining: Option<u64>,
        max_body_bytes: usize,
        buffers: &Arc<MessageBuffers>,
    ) {
        if let Some(buffer) = &mut self.buffer {
            buffer.extend(&piece);
            return;
        }
        self.pieces.push(piece);
        let Some(remaining) = body_bytes_remaining.filter(|&remaining| remaining > 0) else { return };
        let received: usize = self.pieces.iter().map(Bytes::len).sum();
        let length_bytes =
            usize::try_from(remaining).map_or(usize::MAX, |remaining| received.saturating_add(remaining));
        if length_bytes > max_body_bytes {
            return;
        }
        let Some(mut buffer) = buffers.lease(length_bytes) else { return };
        for piece in self.pieces.drain(..) {
            buffer.extend(&piece);
        }
        self.buffer = Some(buffer);
    }

    fn is_empty(&self) -> bool {
        self.pieces.is_empty() && self.buffer.is_none()
    }

    /// The buffer's room not yet filled.
    fn bytes_ahead(&self) -> usize {
        self.buffer.as_ref().map_or(0, MessageBuffer::unfilled_bytes)
    }

    /// The message as one buffer (the piece itself when it came in one), leaving this empty.
    fn take(&mut self, buffers: &Arc<MessageBuffers>) -> Bytes {
        match self.buffer.take() {
            Some(buffer) => buffer.freeze(),
            None => buffers.join(std::mem::take(&mut self.pieces)),
        }
    }
}

#[cfg(test)]
mod tests {
    use arrow_array::{Int64Array, StringArray};
    use arrow_ipc::writer::StreamWriter;
    use arrow_schema::{DataType, Field, Schema};

    use super::*;

    pub(crate) fn ipc_stream(batches: &[RecordBatch]) -> Vec<u8> {
        let mut out = Vec::new();
        let mut writer = StreamWriter::try_new(&mut out, &batches[0].schema()).unwrap();
        for b in batches {
            writer.write(b).unwrap();
        }
        writer.finish().unwrap();
        drop(writer);
        out
    }

    fn compressed_ipc_stream(batches: &[RecordBatch], compression: arrow_ipc::CompressionType) -> Vec<u8> {
        let options = arrow_ipc::writer::IpcWriteOptions::default().try_with_compression(Some(compression)).unwrap();
        let mut out = Vec::new();
        let mut writer = StreamWriter::try_new_with_options(&mut out, &batches[0].schema(), options).unwrap();
        for b in batches {
            writer.write(b).unwrap();
        }
        writer.finish().unwrap();
        drop(writer);
        out
    }

    /// 100,000 zeros in one int64 column: 800,000 bytes that compress to almost nothing.
    fn zeros() -> RecordBatch {
        let schema = Arc::new(Schema::new(vec![Field::new("z", DataType::Int64, false)]));
        RecordBatch::try_new(schema, vec![Arc::new(Int64Array::from(vec![0; 100_000]))]).unwrap()
    }

    fn decode_in_chunks(bytes: &[u8], chunk_size: usize, max_body_bytes: usize) -> Result<DecodedBody, IngestError> {
        let mut decoder = BodyDecoder::new(max_body_bytes);
        for chunk in bytes.chunks(chunk_size) {
            decoder.push(bytes::Bytes::copy_from_slice(chunk))?;
        }
        decoder.finish()
    }

    /// A large message arriving in many reads is copied into one pooled buffer as it arrives
    /// (the reads' buffers are not kept), decoded exactly, and the buffer is back in the pool
    /// once the last batch viewing it is dropped.
    #[test]
    fn a_large_message_is_assembled_in_a_pooled_buffer_that_comes_back() {
        let batches = vec![zeros(), zeros()];
        let bytes = ipc_stream(&batches);
        let pool = MessageBuffers::new(16 << 20);
        let mut decoder = BodyDecoder::pooled(4 << 20, Arc::clone(&pool));
        let mut chunks = bytes.chunks(4096).map(bytes::Bytes::copy_from_slice);
        let first = chunks.next().unwrap();
        let first_read = first.clone();
        decoder.push(first).unwrap();
        assert!(first_read.is_unique(), "the first read's bytes were copied, not kept");
        let first_message_bytes = decoder.bytes_to_hold();
        assert!(first_message_bytes >= 800_000, "the first message's whole buffer is counted: {first_message_bytes}");
        chunks.try_for_each(|chunk| decoder.push(chunk)).unwrap();
        assert_eq!(decoder.bytes_to_hold(), bytes.len(), "once complete, what was received");
        let body = decoder.finish().unwrap();
        assert_eq!(body.batches.iter().map(|d| d.batch.clone()).collect::<Vec<_>>(), batches);
        assert_eq!(body.arrow_ipc_sha256, hex::encode(Sha256::digest(&bytes)));
        let (lent, idle) = pool.held_bytes();
        assert!(lent >= 1_600_000 && idle == 0, "both messages' buffers are lent: {lent} {idle}");
        drop(body);
        assert_eq!(pool.held_bytes(), (0, lent));
    }

    /// A message declaring a body beyond the limit gets no buffer reserved for it: it is
    /// refused as its bytes arrive.
    #[test]
    fn a_message_declaring_more_than_the_limit_reserves_nothing() {
        let bytes = ipc_stream(&[zeros()]);
        let pool = MessageBuffers::new(16 << 20);
        let mut decoder = BodyDecoder::pooled(400_000, Arc::clone(&pool));
        let refused = bytes.chunks(4096).map(bytes::Bytes::copy_from_slice).try_for_each(|c| decoder.push(c));
        assert!(matches!(refused, Err(IngestError::BodyTooLarge { .. })), "{refused:?}");
        assert_eq!(pool.held_bytes(), (0, 0));
    }

    #[test]
    fn decodes_lz4_and_zstd_compressed_record_batches() {
        use arrow_ipc::CompressionType;
        const LZ4_FRAME: CompressionType = CompressionType::LZ4_FRAME;
        const ZSTD: CompressionType = CompressionType::ZSTD;
        for compression in [LZ4_FRAME, ZSTD] {
            for (batches, rows) in [(vec![sample(), sample()], 6), (vec![zeros(), zeros()], 200_000)] {
                let bytes = compressed_ipc_stream(&batches, compression);
                for chunk_size in [1, 5, 8, 4096, bytes.len()] {
                    let body = decode_in_chunks(&bytes, chunk_size, 4 << 20).unwrap();
                    assert_eq!(body.rows, rows, "{compression:?} in chunks of {chunk_size}");
                    assert_eq!(body.batches.iter().map(|d| d.batch.clone()).collect::<Vec<_>>(), batches);
                    assert_eq!(body.uncompressed_bytes, bytes.len());
                    assert_eq!(body.arrow_ipc_sha256, hex::encode(Sha256::digest(&bytes)));
                }
            }
        }
    }

    /// The limit counts buffers decompressed: a small body of zeros that decompresses beyond it
    /// is refused, and so is one whose buffer declares a terabyte (arrow-ipc would reserve it).
    #[test]
    fn decompressed_size_is_bounded_by_the_body_limit() {
        use arrow_ipc::CompressionType;
        const LZ4_FRAME: CompressionType = CompressionType::LZ4_FRAME;
        const ZSTD: CompressionType = CompressionType::ZSTD;
        for compression in [LZ4_FRAME, ZSTD] {
            let bytes = compressed_ipc_stream(&[zeros()], compression);
            assert!(bytes.len() < 100_000, "{}", bytes.len());
            let too_large = decode_in_chunks(&bytes, 1000, 500_000);
            assert_eq!(too_large.err(), Some(IngestError::BodyTooLarge { limit_bytes: 500_000 }));
            let declared = 800_000i64.to_le_bytes();
            let at = bytes.windows(8).position(|w| w == declared).expect("the zeros' declared length");
            let mut forged = bytes.clone();
            forged[at..at + 8].copy_from_slice(&(1i64 << 40).to_le_bytes());
            for chunk_size in [3, forged.len()] {
                let result = decode_in_chunks(&forged, chunk_size, 1 << 20);
                assert_eq!(result.err(), Some(IngestError::BodyTooLarge { limit_bytes: 1 << 20 }));
            }
        }
    }

    fn sample() -> RecordBatch {
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("name", DataType::Utf8, true),
        ]));
        RecordBatch::try_new(
            schema,
            vec![
                Arc::new(Int64Array::from(vec![1, 2, 3])),
                Arc::new(StringArray::from(vec![Some("a"), None, Some("c")])),
            ],
        )
        .unwrap()
    }

    #[test]
    fn decodes_across_arbitrary_chunk_boundaries_and_hashes_the_bytes() {
        let bytes = ipc_stream(&[sample(), sample()]);
        for chunk_size in [1, 7, 64, bytes.len()] {
            let mut decoder = BodyDecoder::new(1 << 20);
            for chunk in bytes.chunks(chunk_size) {
                decoder.push(bytes::Bytes::copy_from_slice(chunk)).unwrap();
            }
            let body = decoder.finish().unwrap();
            assert_eq!(body.rows, 6);
            assert_eq!(body.batches.len(), 2);
            assert_eq!(body.uncompressed_bytes, bytes.len());
            assert_eq!(body.arrow_ipc_sha256, hex::encode(Sha256::digest(&bytes)));
        }
    }

    /// A plain record batch keeps its message bytes, exactly as they were in the stream (in any
    /// chunking), and they decode to the batch; a compressed one does not (its buffers would
    /// go out compressed).
    #[test]
    fn plain_record_batches_keep_their_message_bytes() {
        let bytes = ipc_stream(&[sample(), sample()]);
        for chunk_size in [1, 7, 4096, bytes.len()] {
            let body = decode_in_chunks(&bytes, chunk_size, 4 << 20).unwrap();
            let mut end_of_previous = 0;
            for decoded in &body.batches {
                let message = decoded.forwardable_message.as_ref().expect("a plain record batch is forwardable");
                let at = end_of_previous
                    + bytes[end_of_previous..].windows(message.len()).position(|w| w == &message[..]).unwrap();
                end_of_previous = at + message.len();
                let mut stream = crate::ingest::encode::schema_message(&decoded.batch.schema()).to_vec();
                stream.extend_from_slice(message);
                let reader = arrow_ipc::reader::StreamReader::try_new(std::io::Cursor::new(stream), None).unwrap();
                let read: Vec<RecordBatch> = reader.map(Result::unwrap).collect();
                assert_eq!(read, std::slice::from_ref(&decoded.batch), "chunks of {chunk_size}");
            }
        }
        let compressed = compressed_ipc_stream(&[sample()], arrow_ipc::CompressionType::ZSTD);
        let body = decode_in_chunks(&compressed, 5, 4 << 20).unwrap();
        assert!(body.batches.iter().all(|decoded| decoded.forwardable_message.is_none()));
    }

    /// Found by the fuzz target: a record batch whose buffer lies outside the message body made
    /// arrow-ipc panic.
    #[test]
    fn buffers_outside_the_body_are_invalid_not_a_panic() {
        // Fed as the fuzz target feeds it: the first byte sets the chunk size.
        let crash = include_bytes!("../../fuzz/corpus/ingest/regression_buffer_outside_body");
        let mut decoder = BodyDecoder::new(1 << 20);
        let chunk_size = usize::from(crash[0]).max(1) * 17;
        let result = crash[1..]
            .chunks(chunk_size)
            .try_for_each(|chunk| decoder.push(bytes::Bytes::copy_from_slice(chunk)))
            .and_then(|()| decoder.finish().map(|_| ()));
        assert!(matches!(result, Err(IngestError::InvalidIpc(_))), "{result:?}");
    }

    #[test]
    fn rejects_truncated_garbage_empty_and_oversized_bodies() {
        let bytes = ipc_stream(&[sample()]);
        let mut truncated = BodyDecoder::new(1 << 20);
        truncated.push(bytes::Bytes::copy_from_slice(&bytes[..bytes.len() / 2])).unwrap();
        assert!(matches!(truncated.finish(), Err(IngestError::InvalidIpc(_))));

        let mut garbage = BodyDecoder::new(1 << 20);
        let result = garbage
            .push(bytes::Bytes::from_static(b"this is not arrow at all, not even close"))
            .and_then(|()| garbage.finish().map(|_| ()));
        assert!(matches!(result, Err(IngestError::InvalidIpc(_))), "{result:?}");

        assert!(matches!(BodyDecoder::new(10).finish(), Err(IngestError::InvalidIpc(_))));

        let mut small = BodyDecoder::new(16);
        assert_eq!(
            small.push(bytes::Bytes::copy_from_slice(&bytes)),
            Err(IngestError::BodyTooLarge { limit_bytes: 16 })
        );
    }
}
