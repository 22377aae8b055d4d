//! The SHA-256 fingerprint of what an execution staged for one destination. Persisted before
//! the publication job is submitted; a redelivered execution reuses the earlier job only when
//! its fingerprint is identical.

use sha2::{Digest as _, Sha256};

use crate::model::WriteMode;
use crate::model::write_options::WriteOptions;
use crate::store::ReceiptRecord;

/// What the fingerprint covers.
#[derive(Debug)]
pub(crate) struct FingerprintInput<'a> {
    pub(crate) project: &'a str,
    pub(crate) dataset: &'a str,
    pub(crate) table: &'a str,
    pub(crate) write_mode: WriteMode,
    pub(crate) primary_key: &'a [String],
    pub(crate) write_options: &'a WriteOptions,
    /// Whether the delivery completes the run's snapshot (covered under `delete_missing` only,
    /// where it decides whether the publication deletes).
    pub(crate) completes_snapshot: bool,
    pub(crate) arrow_schema_sha256: &'a str,
    pub(crate) receipts: &'a [ReceiptRecord],
}

/// Hex SHA-256 over a canonical JSON of the inputs; receipts contribute (seq, rows, IPC SHA-256,
/// checkpoint position) in `seq` order. Write options other than the defaults are covered
/// (the defaults are left out, so fingerprints recorded before the options existed still match).
pub(crate) fn fingerprint(input: &FingerprintInput<'_>) -> String {
    let receipts: Vec<_> = input
        .receipts
        .iter()
        .map(|r| serde_json::json!([r.seq, r.rows, r.arrow_ipc_sha256, r.checkpoint_seq]))
        .collect();
    let mut canonical = serde_json::json!({
        "version": 1,
        "destination": [input.project, input.dataset, input.table],
        "write_mode": input.write_mode,
        "primary_key": input.primary_key,
        "schema": input.arrow_schema_sha256,
        "receipts": receipts,
    });
    if !input.write_options.is_default() {
        canonical["write_options"] = serde_json::json!(input.write_options);
    }
    if input.write_options.delete_missing {
        canonical["completes_snapshot"] = serde_json::json!(input.completes_snapshot);
    }
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
        let defaults = WriteOptions::default();
        let input = |receipts: &'static [ReceiptRecord]| FingerprintInput {
            project: "p",
            dataset: "d",
            table: "t",
            write_mode: WriteMode::FullAppend,
            primary_key: &[],
            write_options: &defaults,
            completes_snapshot: true,
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

    #[test]
    fn covers_write_options_and_leaves_the_defaults_out() {
        use crate::model::write_options::{DeclaredWriteOptions, MetadataColumn};
        let receipts = [receipt(0, "aa", 0)];
        let with = |write_options: &WriteOptions| {
            fingerprint(&FingerprintInput {
                project: "p",
                dataset: "d",
                table: "t",
                write_mode: WriteMode::FullAppend,
                primary_key: &[],
                write_options,
                completes_snapshot: true,
                arrow_schema_sha256: "s",
                receipts: &receipts,
            })
        };
        let defaults = with(&WriteOptions::default());
        // The version-1 shape before write options existed, computed by hand.
        let before = serde_json::json!({"version": 1, "destination": ["p", "d", "t"], "write_mode": "full_append",
            "primary_key": [], "schema": "s", "receipts": [[0, 10, "aa", 0]]});
        assert_eq!(defaults, hex::encode(Sha256::digest(before.to_string().as_bytes())));
        let metadata = WriteOptions::parse(
            WriteMode::FullAppend,
            DeclaredWriteOptions { metadata_columns: Some(&[MetadataColumn::LoadedAt]), ..Default::default() },
        )
        .unwrap();
        assert_ne!(defaults, with(&metadata));
    }

    #[test]
    fn a_snapshot_segment_and_its_completion_differ() {
        let receipts = [receipt(0, "aa", 0)];
        let options = WriteOptions { delete_missing: true, ..WriteOptions::default() };
        let with = |completes_snapshot| {
            fingerprint(&FingerprintInput {
                project: "p",
                dataset: "d",
                table: "t",
                write_mode: WriteMode::FullUpsert,
                primary_key: &[],
                write_options: &options,
                completes_snapshot,
                arrow_schema_sha256: "s",
                receipts: &receipts,
            })
        };
        assert_ne!(with(true), with(false));
    }
}
