//! Watches the messages of an Arrow IPC stream ahead of arrow-ipc's decoder, to bound what a
//! body holds once its compressed buffers (IPC buffer compression: LZ4_FRAME, ZSTD) are
//! decompressed.
//!
//! arrow-ipc trusts the uncompressed length written before each compressed buffer and reserves
//! it before decompressing: a few bytes declaring a terabyte would abort the process. So
//! [`MessageFraming`] follows the stream's framing (continuation marker, metadata length,
//! flatbuffer metadata, body) as the bytes arrive, reads those declared lengths and refuses the
//! body (`BodyTooLarge`) before the message that would exceed the limit is complete, that is
//! before the decoder sees its last byte.
//!
//! It also refuses, from each message's metadata and before the decoder sees it, a valid stream
//! using a feature the gateway does not read, naming it ([`refuse_unread_features`]): a
//! big-endian schema (arrow-ipc's push decoder would read its buffers as little-endian), a
//! metadata version other than V4 and V5, a compression codec or method other than LZ4_FRAME and
//! ZSTD buffers, a schema feature flag it does not know; and a schema with a column the gateway
//! cannot load ([`super::schema::refuse_unloadable_columns`]), so no record batch of such a
//! stream is ever decoded (arrow-ipc panics on some, unions whose buffers are not aligned).
//! Anything malformed is left to the decoder to report.

use arrow_ipc::{
    BodyCompressionMethod, CompressionType, Endianness, Feature, Message, MessageHeader, MetadataVersion, RecordBatch,
    root_as_message,
};

use super::IngestError;

/// `0xFFFFFFFF`: the marker before a message's metadata length (Arrow 0.15 and later).
const CONTINUATION_MARKER: [u8; 4] = [0xFF; 4];
/// A compressed buffer's first 8 bytes: its uncompressed length, little-endian; -1 stores the
/// buffer uncompressed.
const UNCOMPRESSED_LENGTH_BYTES: u64 = 8;
const STORED_UNCOMPRESSED: i64 = -1;

/// What the framing learned of a message whose last byte it just passed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CompletedMessage {
    /// A record batch whose bytes a Storage Write request can carry as they are: framed with
    /// the continuation marker (Arrow 0.15 and later) and with uncompressed buffers.
    pub(crate) forwardable_record_batch: bool,
    /// What decoding it allocates beyond the bytes received: its compressed buffers
    /// decompressed (0 when nothing is compressed).
    pub(crate) decompressed_bytes: u64,
}

/// Where in the stream the next bytes belong.
#[derive(Debug)]
enum FramingState {
    /// The 4-byte metadata length, possibly after a continuation marker.
    Prefix {
        bytes: [u8; 4],
        read: usize,
        continuation: bool,
    },
    Metadata {
        size: usize,
        bytes: Vec<u8>,
        continuation: bool,
    },
    Body(MessageBody),
    /// After the end-of-stream marker: the decoder refuses anything more.
    Finished,
}

/// The body of one message: how much is left, and the declared lengths of its compressed
/// buffers as they pass by.
#[derive(Debug)]
struct MessageBody {
    length_bytes: u64,
    position_bytes: u64,
    forwardable_record_batch: bool,
    /// Ordered by offset; `next` is the first not yet complete.
    windows: Vec<LengthWindow>,
    next: usize,
}

/// The 8 bytes at the start of one compressed buffer.
#[derive(Debug)]
struct LengthWindow {
    offset_bytes: u64,
    buffer_length_bytes: u64,
    bytes: [u8; 8],
    filled: u64,
}

impl LengthWindow {
    /// What the buffer holds once decompressed, when its length bytes were all read and valid.
    fn decompressed_bytes(&self) -> Option<u64> {
        if self.filled < UNCOMPRESSED_LENGTH_BYTES {
            return None;
        }
        match i64::from_le_bytes(self.bytes) {
            STORED_UNCOMPRESSED => Some(self.buffer_length_bytes - UNCOMPRESSED_LENGTH_BYTES),
            declared => u64::try_from(declared).ok(),
        }
    }
}

impl MessageBody {
    /// Copies the length bytes that lie in `bytes`, found at `position_bytes` of the body.
    fn observe(&mut self, bytes: &[u8]) {
        let (start, end) = (self.position_bytes, self.position_bytes + bytes.len() as u64);
        for window in &mut self.windows[self.next..] {
            if window.offset_bytes >= end {
                break;
            }
            let from = window.offset_bytes.max(start);
            let to = (window.offset_bytes + UNCOMPRESSED_LENGTH_BYTES).min(end);
            if from < to {
                let target = (from - window.offset_bytes) as usize..(to - window.offset_bytes) as usize;
                window.bytes[target].copy_from_slice(&bytes[(from - start) as usize..(to - start) as usize]);
                window.filled += to - from;
            }
        }
        // Windows are ordered by offset, so those ending before `end` lead the list.
        while self.windows.get(self.next).is_some_and(|w| w.offset_bytes + UNCOMPRESSED_LENGTH_BYTES <= end) {
            self.next += 1;
        }
        self.position_bytes = end;
    }

    /// The body's size with its buffers decompressed (its own size when nothing is compressed).
    fn decompressed_bytes(&self) -> u64 {
        if self.windows.is_empty() {
            return self.length_bytes;
        }
        self.windows.iter().filter_map(LengthWindow::decompressed_bytes).fold(0, u64::saturating_add)
    }
}

/// Follows one stream's messages; see the module documentation.
#[derive(Debug)]
pub(crate) struct MessageFraming {
    state: FramingState,
    decompressed_bytes: u64,
    max_decompressed_bytes: u64,
    /// Set when [`Self::advance`] stopped at the end of a message body.
    completed: Option<CompletedMessage>,
}

impl MessageFraming {
    pub(crate) fn new(max_decompressed_bytes: usize) -> Self {
        Self {
            state: FramingState::Prefix { bytes: [0; 4], read: 0, continuation: false },
            decompressed_bytes: 0,
            max_decompressed_bytes: max_decompressed_bytes as u64,
            completed: None,
        }
    }

    /// The message whose body the last [`Self::advance`] ended with, if it ended one (once).
    pub(crate) fn take_completed(&mut self) -> Option<CompletedMessage> {
        self.completed.take()
    }

    /// The bytes of the current message's body still to come, once its metadata was read (so
    /// the whole message's length is known), while they are.
    pub(crate) fn body_bytes_remaining(&self) -> Option<u64> {
        match &self.state {
            FramingState::Body(body) => Some(body.length_bytes - body.position_bytes),
            _ => None,
        }
    }

    /// Follows `bytes` up to the end of at most one message body and returns how many it took
    /// (at least one). Fails when that message would take the stream's decompressed size
    /// beyond the limit: the caller must then not pass these bytes to the decoder.
    pub(crate) fn advance(&mut self, bytes: &[u8]) -> Result<usize, IngestError> {
        let mut taken = 0;
        while taken < bytes.len() {
            let rest = &bytes[taken..];
            match &mut self.state {
                FramingState::Prefix { .. } => taken += self.advance_prefix(rest)?,
                FramingState::Metadata { size, bytes: metadata, continuation } => {
                    let wanted = (*size - metadata.len()).min(rest.len());
                    metadata.extend_from_slice(&rest[..wanted]);
                    taken += wanted;
                    if metadata.len() == *size {
                        let body = message_body(metadata, *continuation)?;
                        self.state = FramingState::Body(body);
                        if self.finish_body_if_complete()? {
                            return Ok(taken);
                        }
                    }
                }
                FramingState::Body(body) => {
                    let wanted = (body.length_bytes - body.position_bytes).min(rest.len() as u64) as usize;
                    body.observe(&rest[..wanted]);
                    taken += wanted;
                    if self.finish_body_if_complete()? {
                        return Ok(taken);
                    }
                }
                FramingState::Finished => return Ok(bytes.len()),
            }
        }
        Ok(taken)
    }

    fn advance_prefix(&mut self, rest: &[u8]) -> Result<usize, IngestError> {
        let FramingState::Prefix { bytes, read, continuation } = &mut self.state else {
            return Ok(0);
        };
        let wanted = (4 - *read).min(rest.len());
        bytes[*read..*read + wanted].copy_from_slice(&rest[..wanted]);
        *read += wanted;
        if *read == 4 {
            if !*continuation && *bytes == CONTINUATION_MARKER {
                (*continuation, *read) = (true, 0);
                return Ok(wanted);
            }
            self.state = match u32::from_le_bytes(*bytes) as usize {
                0 => FramingState::Finished,
                size => FramingState::Metadata {
                    size,
                    bytes: Vec::with_capacity(size.min(64 * 1024)),
                    continuation: *continuation,
                },
            };
        }
        Ok(wanted)
    }

    /// At the end of a body: counts it against the limit and expects the next message.
    fn finish_body_if_complete(&mut self) -> Result<bool, IngestError> {
        let FramingState::Body(body) = &self.state else {
            return Ok(false);
        };
        if body.position_bytes < body.length_bytes {
            return Ok(false);
        }
        self.decompressed_bytes = self.decompressed_bytes.saturating_add(body.decompressed_bytes());
        if self.decompressed_bytes > self.max_decompressed_bytes {
            return Err(IngestError::BodyTooLarge { limit_bytes: self.max_decompressed_bytes as usize });
        }
        let decompressed_bytes = if body.windows.is_empty() { 0 } else { body.decompressed_bytes() };
        self.completed =
            Some(CompletedMessage { forwardable_record_batch: body.forwardable_record_batch, decompressed_bytes });
        self.state = FramingState::Prefix { bytes: [0; 4], read: 0, continuation: false };
        Ok(true)
    }
}

/// A message's body length and, when its buffers are compressed, where their declared lengths
/// lie. `continuation`: the message was framed with the continuation marker.
fn message_body(metadata: &[u8], continuation: bool) -> Result<MessageBody, IngestError> {
    let message =
        root_as_message(metadata).map_err(|e| IngestError::InvalidIpc(format!("unreadable message metadata: {e}")))?;
    let record_batch = record_batch_of(&message);
    refuse_unread_features(&message, record_batch)?;
    let length_bytes = u64::try_from(message.bodyLength())
        .map_err(|_| IngestError::InvalidIpc(format!("negative message body length {}", message.bodyLength())))?;
    let mut windows = Vec::new();
    if let Some(batch) = record_batch.filter(|batch| batch.compression().is_some()) {
        for buffer in batch.buffers().iter().flatten() {
            // Empty buffers carry no length; offsets and lengths the decoder refuses are skipped.
            if let (Ok(offset_bytes), Ok(buffer_length_bytes)) =
                (u64::try_from(buffer.offset()), u64::try_from(buffer.length()))
                && buffer_length_bytes >= UNCOMPRESSED_LENGTH_BYTES
            {
                windows.push(LengthWindow { offset_bytes, buffer_length_bytes, bytes: [0; 8], filled: 0 });
            }
        }
        windows.sort_by_key(|w| w.offset_bytes);
    }
    let forwardable_record_batch = continuation
        && message.header_type() == MessageHeader::RecordBatch
        && message.header_as_record_batch().is_some_and(|batch| batch.compression().is_none());
    Ok(MessageBody { length_bytes, position_bytes: 0, forwardable_record_batch, windows, next: 0 })
}

/// The record batch a record-batch or dictionary-batch message carries.
fn record_batch_of<'a>(message: &Message<'a>) -> Option<RecordBatch<'a>> {
    match message.header_type() {
        MessageHeader::RecordBatch => message.header_as_record_batch(),
        MessageHeader::DictionaryBatch => message.header_as_dictionary_batch().and_then(|d| d.data()),
        _ => None,
    }
}

/// Refuses a message of a valid stream that uses a feature the gateway does not read (see the
/// module documentation), by the feature's name, and a schema with a column the gateway cannot
/// load, by the column's name and type; before anything of it is decoded.
fn refuse_unread_features(message: &Message<'_>, record_batch: Option<RecordBatch<'_>>) -> Result<(), IngestError> {
    let version = message.version();
    if !matches!(version, MetadataVersion::V4 | MetadataVersion::V5) {
        return Err(IngestError::UnsupportedIpcVersion { version: named(version.variant_name(), version.0) });
    }
    if let Some(ipc_schema) = message.header_as_schema() {
        let byte_order = match ipc_schema.endianness() {
            Endianness::Little => None,
            Endianness::Big => Some("big-endian".to_string()),
            other => Some(format!("of byte order number {}", other.0)),
        };
        if let Some(byte_order) = byte_order {
            return Err(IngestError::UnsupportedByteOrder { byte_order });
        }
        let known = [Feature::UNUSED, Feature::DICTIONARY_REPLACEMENT, Feature::COMPRESSED_BODY];
        if let Some(unknown) = ipc_schema.features().into_iter().flatten().find(|feature| !known.contains(feature)) {
            return Err(IngestError::UnsupportedIpcFeature { feature: named(unknown.variant_name(), unknown.0) });
        }
        // A schema arrow-ipc cannot convert is the decoder's to report.
        if let Ok(schema) = arrow_ipc::convert::try_fb_to_schema(ipc_schema) {
            super::schema::refuse_unloadable_columns(&schema)?;
        }
    }
    if let Some(compression) = record_batch.and_then(|batch| batch.compression()) {
        let (codec, method) = (compression.codec(), compression.method());
        let codec_name = named(codec.variant_name(), codec.0);
        if !matches!(codec, CompressionType::LZ4_FRAME | CompressionType::ZSTD) {
            return Err(IngestError::UnsupportedCompressionCodec { codec: codec_name });
        }
        if method != BodyCompressionMethod::BUFFER {
            let method_name = named(method.variant_name(), method.0);
            return Err(IngestError::UnsupportedCompressionCodec {
                codec: format!("{codec_name} by method {method_name}"),
            });
        }
    }
    Ok(())
}

/// A flatbuffer enum value by its name, or by its number when this arrow-ipc does not know it.
fn named(name: Option<&str>, number: impl std::fmt::Display) -> String {
    name.map_or_else(|| format!("number {number}"), str::to_string)
}

#[cfg(test)]
#[path = "framing_tests.rs"]
mod tests;
