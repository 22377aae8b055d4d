//! The batch-ingest path on arbitrary bytes: incremental IPC decoding (in chunks whose sizes
//! come from the input), schema validation and type mapping, staging conversion and encoding
//! with splitting. It must never panic and never allocate beyond the body limit's order of
//! magnitude (libFuzzer's `-rss_limit_mb` enforces the latter).
#![no_main]

use filament_bigquery::ingest::decode::BodyDecoder;
use filament_bigquery::ingest::encode::PayloadLimits;
use filament_bigquery::ingest::encode_payloads;
use filament_bigquery::ingest::schema::{LoadSpec, map_schema};
use filament_bigquery::model::WriteMode;
use libfuzzer_sys::fuzz_target;

/// Small limits keep each run cheap; the code paths are the same as with production limits.
const MAX_BODY_BYTES: usize = 1 << 20;
const MAX_PAYLOAD_BYTES: usize = 64 * 1024;

const MODES: [WriteMode; 8] = [
    WriteMode::FullAppend,
    WriteMode::FullReplace,
    WriteMode::IncrementalAppend,
    WriteMode::CdcAppend,
    WriteMode::FullUpsert,
    WriteMode::IncrementalUpsert,
    WriteMode::IncrementalDelete,
    WriteMode::CdcMerge,
];

fuzz_target!(
    init: {
        // libfuzzer-sys aborts on every panic, even caught ones; the gateway contains arrow-ipc's
        // panics on malformed messages (they become invalid_arrow_ipc), so only those pass.
        let aborting = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !filament_bigquery::ingest::decode::panic_is_contained() {
                aborting(info);
            }
        }));
    },
    |data: &[u8]| {
    let Some((&chunk_hint, body)) = data.split_first() else { return };
    let chunk_size = usize::from(chunk_hint).max(1) * 17;
    let mut decoder = BodyDecoder::new(MAX_BODY_BYTES);
    for chunk in body.chunks(chunk_size) {
        if decoder.push(bytes::Bytes::copy_from_slice(chunk)).is_err() {
            return;
        }
    }
    let Ok(decoded) = decoder.finish() else { return };
    // The chunk hint also picks the write mode; keyed modes key on the first column.
    let write_mode = MODES[usize::from(chunk_hint) % MODES.len()];
    let primary_key: Vec<String> = decoded.schema.fields().iter().take(1).map(|f| f.name().clone()).collect();
    let Ok(mapped) = map_schema(&decoded.schema, LoadSpec { write_mode, primary_key: &primary_key, order_by: &[] }) else { return };
    let limits = PayloadLimits { max_bytes: MAX_PAYLOAD_BYTES, max_rows: 20_000 };
    let _ = encode_payloads(&decoded, &mapped, limits);
});
