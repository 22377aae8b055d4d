//! The staging contract between ingestion, the upload pipeline and publication: the reserved
//! columns a staging table carries, how a row's order is encoded in `_filament_seq`, how
//! staging tables are named and how long they live, and which way a lane's rows go
//! ([`WritePath`]: through a staging table, or straight into the destination).

use std::time::Duration;

use sha2::{Digest as _, Sha256};

use super::ids::ResourceRef;

/// The operation column of CDC modes (client-sent, staged, and kept by `cdc_append`).
pub(crate) const OP_COLUMN: &str = "_filament_op";
/// Operations a CDC row may carry.
pub(crate) const OPERATIONS: [&str; 4] = ["insert", "update", "upsert", "delete"];

/// The staged order of a row within its execution: `seq << SEQ_SHIFT | row index in the
/// request` (keyed modes only).
pub(crate) const SEQ_COLUMN: &str = "_filament_seq";
/// Rows of one request stay below `2^SEQ_SHIFT`.
pub(crate) const SEQ_SHIFT: u32 = 32;
/// Keyed modes stage `seq << 32 | row` in an INT64, so their `seq` stays below 2^31.
pub(crate) const MAX_KEYED_SEQ: i64 = i32::MAX as i64;

/// Staging tables expire on their own after this long, whatever happens to the gateway.
pub(crate) const STAGING_TABLE_TTL: Duration = Duration::from_secs(7 * 24 * 3600);

/// `_filament_seq` of row `row` of the batch numbered `seq`.
pub(crate) const fn staged_order(seq: i64, row: i64) -> i64 {
    (seq << SEQ_SHIFT) | row
}

/// The staging table of one resource in one delivery: reserved prefix, the destination's name
/// (for people reading the dataset, cut to 900 characters) and 128 bits of a hash that make it
/// unique per delivery: at most 14 + 900 + 1 + 32 = 947 characters, within BigQuery's 1,024.
pub(crate) fn staging_table_name(resource: &ResourceRef, destination_table: &str) -> String {
    let delivery = &resource.delivery;
    let digest = Sha256::digest(
        format!(
            "{}\n{}\n{}\n{}",
            delivery.execution.run_id, delivery.execution.execution_id, delivery.delivery, resource.resource
        )
        .as_bytes(),
    );
    let hash = &hex::encode(digest)[..32];
    let readable: String = destination_table.chars().take(900).collect();
    format!("_filament_stg_{readable}_{hash}")
}

/// Which way a lane's rows reach their destination table, decided once by the lane's set-up
/// (`pipeline::lane::write_path`) and carried in its report to the commit and the publication.
/// A staging table exists only on the staging path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum WritePath {
    /// The PENDING stream writes into this staging table (committed into it before the
    /// barrier); the publication's query job reads it.
    Staging { staging_table: String },
    /// The PENDING stream writes into the destination table itself (the resource declared
    /// `direct_append` and its columns go in as sent); the publication commits the stream.
    Direct,
}

impl WritePath {
    /// The staging table the rows went through; `None` on the direct path, which has none.
    pub(crate) fn staging_table(&self) -> Option<&str> {
        match self {
            WritePath::Staging { staging_table } => Some(staging_table),
            WritePath::Direct => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ids::{DeliveryRef, ExecutionId, ExecutionKey, RunId};

    fn resource(delivery: i32, name: &str) -> ResourceRef {
        let execution =
            ExecutionKey { run_id: RunId::parse("r").unwrap(), execution_id: ExecutionId::parse("e").unwrap() };
        DeliveryRef { execution, delivery }.resource(name.parse().unwrap())
    }

    #[test]
    fn staging_names_are_reserved_unique_and_valid() {
        let a = staging_table_name(&resource(1, "users"), "users");
        let b = staging_table_name(&resource(2, "users"), "users");
        assert_ne!(a, b);
        assert!(a.starts_with("_filament_stg_users_"));
        let hash = a.rsplit_once('_').unwrap().1;
        assert_eq!(hash.len(), 32, "128 bits: {a}");
        assert!(a.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'));
        assert!(staging_table_name(&resource(1, "x"), &"t".repeat(1024)).len() <= 1024);
    }

    #[test]
    fn staged_order_puts_the_row_below_the_seq() {
        assert_eq!(staged_order(3, 5), (3 << 32) | 5);
        assert!(staged_order(MAX_KEYED_SEQ, (1 << SEQ_SHIFT) - 1) > 0, "no overflow into the sign bit");
    }
}
