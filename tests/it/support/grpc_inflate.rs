//! The fake Storage Write sink's inflate: a request's gzip-compressed gRPC messages are
//! inflated whole by ISA-L before tonic sees them (each frame then flagged uncompressed and the
//! `grpc-encoding` header dropped). BigQuery inflates on its own machines; the fake shares the
//! benchmark's two cores with the gateway, and tonic's inflate (zlib-rs) was most of its CPU.
//! Every byte is still inflated and the gzip trailer's CRC-32 and size checked: a malformed
//! request ends the request stream with an error, and the fake stops reading the connection.

use bytes::{Buf, Bytes, BytesMut};
use futures::{Stream, StreamExt};
use http_body_util::BodyExt;

/// gRPC's length-prefixed message header: the compressed flag, then the big-endian length.
const FRAME_HEADER_BYTES: usize = 5;

/// `request` with its messages inflated, when its `grpc-encoding` is gzip; otherwise as it is.
pub fn inflated(request: http::Request<tonic::body::Body>) -> http::Request<tonic::body::Body> {
    let gzip = request.headers().get("grpc-encoding").is_some_and(|encoding| encoding == "gzip");
    if !gzip {
        return request;
    }
    let (mut parts, body) = request.into_parts();
    parts.headers.remove("grpc-encoding");
    let frames = inflated_frames(body.into_data_stream().map(|chunk| chunk.map_err(std::io::Error::other)));
    let body = http_body_util::StreamBody::new(frames.map(|frame| frame.map(http_body::Frame::data)));
    http::Request::from_parts(parts, tonic::body::Body::new(body))
}

/// The largest message the fake inflates (BigQuery takes AppendRows requests up to 20 MB).
const MAX_MESSAGE_BYTES: usize = 32 * 1024 * 1024;

/// One gRPC message taken from the byte stream.
enum Message {
    /// An uncompressed message: its whole frame, header included, passed on as it is.
    Plain(Bytes),
    /// A gzip member to inflate.
    Gzip(Bytes),
}

/// Re-frames the byte stream's gRPC messages, each inflated and flagged uncompressed.
fn inflated_frames(
    chunks: impl Stream<Item = std::io::Result<Bytes>> + Send + Unpin + 'static,
) -> impl Stream<Item = std::io::Result<Bytes>> + Send + 'static {
    futures::stream::unfold((chunks, BytesMut::new(), false), |(mut chunks, mut pending, failed)| async move {
        if failed {
            return None;
        }
        loop {
            if let Some(message) = next_message(&mut pending) {
                let frame = message.and_then(|message| match message {
                    Message::Plain(frame) => Ok(frame),
                    Message::Gzip(member) => gunzipped_frame(&member),
                });
                let failed = frame.is_err();
                return Some((frame, (chunks, pending, failed)));
            }
            match chunks.next().await {
                Some(Ok(chunk)) => pending.extend_from_slice(&chunk),
                Some(Err(error)) => return Some((Err(error), (chunks, pending, true))),
                None if pending.is_empty() => return None,
                None => {
                    let error = std::io::Error::other("fake: the request body ends inside a gRPC message");
                    return Some((Err(error), (chunks, pending, true)));
                }
            }
        }
    })
}

/// The first complete message of `pending`, taken out of it; an error as soon as its header
/// is wrong.
fn next_message(pending: &mut BytesMut) -> Option<std::io::Result<Message>> {
    let compressed = match pending.first()? {
        0 => false,
        1 => true,
        flag => return Some(Err(std::io::Error::other(format!("fake: gRPC compressed flag {flag}")))),
    };
    let length = u32::from_be_bytes(pending.get(1..FRAME_HEADER_BYTES)?.try_into().unwrap()) as usize;
    if length > MAX_MESSAGE_BYTES {
        return Some(Err(std::io::Error::other(format!("fake: a gRPC message of {length} bytes"))));
    }
    if pending.len() < FRAME_HEADER_BYTES + length {
        return None;
    }
    let mut frame = pending.split_to(FRAME_HEADER_BYTES + length);
    if !compressed {
        return Some(Ok(Message::Plain(frame.freeze())));
    }
    frame.advance(FRAME_HEADER_BYTES);
    Some(Ok(Message::Gzip(frame.freeze())))
}

/// One gzip member inflated in one call into an uncompressed gRPC frame, sized by the
/// member's trailer (its size field, checked against what was inflated).
fn gunzipped_frame(member: &[u8]) -> std::io::Result<Bytes> {
    let invalid = |what: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, format!("fake: {what}"));
    let size_field = member.len().checked_sub(4).map(|start| &member[start..]).ok_or_else(|| invalid("short gzip"))?;
    let size = u32::from_le_bytes(size_field.try_into().unwrap()) as usize;
    if size > MAX_MESSAGE_BYTES {
        return Err(invalid(&format!("a gzip member of {size} bytes inflated")));
    }
    let mut frame = vec![0; FRAME_HEADER_BYTES + size];
    frame[1..FRAME_HEADER_BYTES].copy_from_slice(&(size as u32).to_be_bytes());
    let written = isal::decompress_into(member, &mut frame[FRAME_HEADER_BYTES..], isal::Codec::Gzip)
        .map_err(|error| invalid(&format!("gzip: {error}")))?;
    if written != size {
        return Err(invalid("gzip trailer size differs from the inflated size"));
    }
    Ok(Bytes::from(frame))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(compressed: bool, payload: &[u8]) -> Vec<u8> {
        let mut frame = vec![u8::from(compressed)];
        frame.extend_from_slice(&(payload.len() as u32).to_be_bytes());
        frame.extend_from_slice(payload);
        frame
    }

    async fn reframe(body: Vec<u8>, chunk_bytes: usize) -> Vec<std::io::Result<Bytes>> {
        let chunks: Vec<std::io::Result<Bytes>> =
            body.chunks(chunk_bytes).map(|chunk| Ok(Bytes::copy_from_slice(chunk))).collect();
        inflated_frames(futures::stream::iter(chunks)).collect().await
    }

    #[tokio::test]
    async fn messages_split_across_chunks_are_inflated_and_reframed() {
        let message = b"an AppendRows request ".repeat(500);
        let gzipped = isal::compress(message.as_slice(), isal::CompressionLevel::One, isal::Codec::Gzip).unwrap();
        let body = [frame(true, &gzipped), frame(false, b"plain"), frame(true, &gzipped)].concat();
        let frames: Vec<Bytes> = reframe(body, 7).await.into_iter().map(Result::unwrap).collect();
        assert_eq!(frames, [frame(false, &message), frame(false, b"plain"), frame(false, &message)]);
    }

    #[tokio::test]
    async fn a_corrupt_member_or_a_cut_body_fails() {
        let mut gzipped = isal::compress(&b"rows"[..], isal::CompressionLevel::One, isal::Codec::Gzip).unwrap();
        let crc_at = gzipped.len() - 8;
        gzipped[crc_at] ^= 1;
        let corrupt = reframe(frame(true, &gzipped), 3).await;
        assert!(corrupt.len() == 1 && corrupt[0].is_err(), "{corrupt:?}");
        let cut = reframe(frame(false, b"plain")[..7].to_vec(), 3).await;
        assert!(cut.len() == 1 && cut[0].is_err(), "{cut:?}");
        let flag = reframe(vec![2], 1).await;
        assert!(flag.len() == 1 && flag[0].is_err(), "a wrong flag fails on its first byte: {flag:?}");
        let oversized = reframe([&[1][..], &u32::MAX.to_be_bytes()].concat(), 5).await;
        assert!(oversized.len() == 1 && oversized[0].is_err(), "before waiting for 4 GiB: {oversized:?}");
    }
}
