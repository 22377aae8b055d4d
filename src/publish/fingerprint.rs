//! The SHA-256 fingerprint of what an execution staged for one destination. Persisted before
//! the publication job is submitted; a redelivered execution reuses the earlier job only when
//! its fingerprint is identical.

use sha2::{Digest as _, Sha256};

use crate::model::WriteMode;
use crate::store::ReceiptRecord;

/// What the fingerprint covers.
#[derive(Debug)]
pub(crate) struct FingerprintInput<'a> {
    pub(crate) project: &'a str,
    pub(crate) dataset: &'a str,
    pub(crate) table: &'a str,
    pub(crate) write_mode: WriteMode,
    pub(crate) primary_key: &'a [String],
    pub(crate) arrow_schema_sha256: &'a str,
    pub(crate) receipts: &'a [ReceiptRecord],
}

/// Hex SHA-256 over a canonical JSON of the inputs; receipts contribute (seq, rows, IPC SHA-256,
/// checkpoint position) in `seq` order.
pub(crate) fn fingerprint(input: &FingerprintInput<'_>) -> String {
    let receipts: Vec<_> = input
        .receipts
        .iter()
        .map(|r| serde_json::json!([r.seq, r.rows, r.arrow_ipc_sha256, r.checkpoint_seq]))
        .collect();
    let canonical = serde_json::json!({
        "version": 1,
        "destination": [input.project, input.dataset, input.table],
        "write_mode": input.write_mode,
        "primary_key": input.primary_key,
        "schema": input.arrow_schema_sha256,
        "receipts": receipts,
    });
    hex::encode(Sha256::digest(canonical.to_string().as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn receipt(seq: i64, sha: &str, checkpoint_seq: i64) -> ReceiptRecord {
        ReceiptRecord {
            resource: "r".parse().unwrap(),
            seq,
            rows: 10,
            uncompressed_bytes: 100,
            arrow_ipc_sha256: sha.into(),
            checkpoint_seq,
            key_ranges: None,
        }
    }

    #[test]
    fn changes_with_content_and_boundaries() {
        let base = [receipt(0, "aa", 0), receipt(1, "bb", 0)];
        let input = |receipts: &'static [ReceiptRecord]| FingerprintInput {
            project: "p",
            dataset: "d",
            table: "t",
            write_mode: WriteMode::FullAppend,
            primary_key: &[],
            arrow_schema_sha256: "s",
            receipts,
        };
        let leaked: &'static [ReceiptRecord] = Box::leak(Box::new(base.clone()));
        let a = fingerprint(&input(leaked));
        assert_eq!(a, fingerprint(&input(leaked)));
        let changed: &'static [ReceiptRecord] = Box::leak(Box::new([receipt(0, "aa", 0), receipt(1, "cc", 0)]));
        assert_ne!(a, fingerprint(&input(changed)));
        let moved_checkpoint: &'static [ReceiptRecord] =
            Box::leak(Box::new([receipt(0, "aa", 0), receipt(1, "bb", 1)]));
        assert_ne!(a, fingerprint(&input(moved_checkpoint)));
    }
}
