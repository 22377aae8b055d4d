//! Counts the DATA payload bytes in the HTTP/2 frames a connection writes (RFC 9113, section
//! 4.1: a 9-byte header of length, type, flags and stream, then the payload), so the server can
//! tell a response body handed to HTTP/2 from one that reached the socket: a peer that holds
//! its flow-control window at zero keeps the first from becoming the second, and pings or
//! window updates the server answers meanwhile do not count as progress.

/// The frame header's length.
const FRAME_HEADER_BYTES: usize = 9;
/// The DATA frame's type.
const DATA: u8 = 0x0;

/// Where in the written frame sequence the connection is.
#[derive(Debug, Default)]
pub(crate) struct DataFrameCounter {
    header: [u8; FRAME_HEADER_BYTES],
    header_filled: usize,
    payload_left: usize,
    payload_is_data: bool,
}

impl DataFrameCounter {
    /// Takes the next bytes written; the DATA payload bytes among them.
    pub(crate) fn data_bytes(&mut self, mut written: &[u8]) -> u64 {
        let mut data = 0;
        while !written.is_empty() {
            if self.payload_left > 0 {
                let taken = self.payload_left.min(written.len());
                if self.payload_is_data {
                    data += taken as u64;
                }
                self.payload_left -= taken;
                written = &written[taken..];
                continue;
            }
            let taken = (FRAME_HEADER_BYTES - self.header_filled).min(written.len());
            self.header[self.header_filled..self.header_filled + taken].copy_from_slice(&written[..taken]);
            self.header_filled += taken;
            written = &written[taken..];
            if self.header_filled == FRAME_HEADER_BYTES {
                let [a, b, c, kind, ..] = self.header;
                self.payload_left = usize::from(a) << 16 | usize::from(b) << 8 | usize::from(c);
                self.payload_is_data = kind == DATA;
                self.header_filled = 0;
            }
        }
        data
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(kind: u8, payload: &[u8]) -> Vec<u8> {
        let length = payload.len();
        let mut frame = vec![(length >> 16) as u8, (length >> 8) as u8, length as u8, kind, 0, 0, 0, 0, 1];
        frame.extend_from_slice(payload);
        frame
    }

    #[test]
    fn only_data_payloads_count_however_the_writes_split_the_frames() {
        let settings = frame(0x4, &[0; 6]);
        let headers = frame(0x1, &[0x88]);
        let data = frame(DATA, b"hello, world");
        let ping_ack = frame(0x6, &[7; 8]);
        let written: Vec<u8> = [settings, headers, data.clone(), ping_ack, data].concat();
        for split in [1, 2, 5, 9, 10, 64, written.len()] {
            let mut counter = DataFrameCounter::default();
            let counted: u64 = written.chunks(split).map(|chunk| counter.data_bytes(chunk)).sum();
            assert_eq!(counted, 24, "writes of {split} bytes");
        }
    }

    #[test]
    fn a_large_data_frame_counts_as_its_bytes_are_written() {
        let mut counter = DataFrameCounter::default();
        let data = frame(DATA, &vec![1; 70_000]);
        assert_eq!(counter.data_bytes(&data[..9 + 1000]), 1000);
        assert_eq!(counter.data_bytes(&data[9 + 1000..]), 69_000);
        assert_eq!(counter.data_bytes(&frame(0x6, &[0; 8])), 0, "a ping after it is not data");
    }
}
