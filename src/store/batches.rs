//! Batch receipts and the per-resource staging stream of a delivery.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use sqlx::Row as _;
use sqlx::postgres::PgRow;

use super::{BindKey as _, DELIVERY_KEY, EXECUTION_KEY, RESOURCE_KEY, Store, StoreError, StoreResult, state_names};
use super::{PublicationRecord, ResourceRecord};
use crate::model::columns::Column;
use crate::model::key_ranges::KeyRange;
use crate::model::staging::WritePath;
use crate::model::{DeliveryRef, ExecutionState, ResourceName, ResourceRef};

/// A receipt as stored (the 202/200 answer of a batch request).
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub(crate) struct ReceiptRecord {
    pub(crate) resource: ResourceName,
    pub(crate) seq: i64,
    pub(crate) rows: i64,
    pub(crate) uncompressed_bytes: i64,
    pub(crate) arrow_ipc_sha256: String,
    pub(crate) checkpoint_seq: i64,
    /// Keyed modes: the batch's key ranges (`model::key_ranges`).
    #[sqlx(json(nullable))]
    pub(crate) key_ranges: Option<Vec<KeyRange>>,
}

/// A batch to record, with the schema its resource must keep in this delivery.
#[derive(Debug, Clone)]
pub(crate) struct NewBatch<'a> {
    pub(crate) resource: &'a ResourceRef,
    /// `None`: the next free sequence number.
    pub(crate) seq: Option<i64>,
    pub(crate) rows: i64,
    pub(crate) uncompressed_bytes: i64,
    pub(crate) arrow_ipc_sha256: &'a str,
    pub(crate) arrow_schema: &'a serde_json::Value,
    pub(crate) arrow_schema_sha256: &'a str,
    pub(crate) staging_table: &'a str,
    /// Keyed modes: the batch's key ranges.
    pub(crate) key_ranges: Option<serde_json::Value>,
    /// The declaration the batch was prepared for: recorded only while the resource is still
    /// declared so (a re-declaration waits for this insert, or this insert for it).
    pub(crate) declaration: &'a ResourceRecord,
    /// The replica that takes the batch: recorded only while it serves the execution's delivery
    /// and the execution accepts batches.
    pub(crate) serving_replica: &'a str,
}

/// Outcome of recording a batch.
#[derive(Debug)]
pub(crate) enum InsertBatch {
    /// Recorded; `handed_over`: the resource's stream a replica that shut down handed over,
    /// which a lane this batch starts goes on appending to.
    Inserted { receipt: ReceiptRecord, handed_over: Option<HandedOverStream> },
    /// The sequence number is taken (by a concurrent or earlier request).
    SeqTaken(ReceiptRecord),
    /// The execution no longer takes batches here: another state or delivery, or another owner
    /// (the caller claims it again to learn why, see `intake`).
    NotServing,
    /// Another schema was recorded first for this resource and delivery.
    SchemaMismatch { recorded: serde_json::Value },
    /// The resource was declared otherwise (or no longer exists) since the batch was prepared.
    DeclarationChanged { current: Option<ResourceRecord> },
}

/// The staging side of one resource in one delivery.
#[derive(Debug, Clone, sqlx::FromRow)]
pub(crate) struct StagingStreamRecord {
    pub(crate) stream_created_at: Option<DateTime<Utc>>,
    /// Where its stream writes (the staging path until set-up chose the direct one).
    #[sqlx(flatten)]
    pub(crate) write_path: WritePath,
}

/// What one resource staged in a delivery, as its publication's fingerprint reads it: the
/// staging row's schema digest and the receipts in order.
#[derive(Debug, Clone, Default)]
pub(crate) struct StagedInputs {
    pub(crate) arrow_schema_sha256: String,
    pub(crate) receipts: Vec<ReceiptRecord>,
}

/// What a commit plans and publishes from ([`Store::commit_inputs`]).
#[derive(Debug, Clone, Default)]
pub(crate) struct CommitInputs {
    pub(crate) staged: HashMap<ResourceName, StagedInputs>,
    /// The publication records earlier deliveries of the execution left, by resource.
    pub(crate) earlier_publications: HashMap<ResourceName, PublicationRecord>,
}

/// A stream whose lane ran on a replica that shut down cleanly: every accepted row of it was
/// acknowledged at `rows_acknowledged`, where the adopting replica goes on appending, and what
/// commit needs is recorded.
#[derive(Debug, Clone, sqlx::FromRow)]
pub(crate) struct HandedOverStream {
    pub(crate) resource: ResourceName,
    pub(crate) stream_name: String,
    pub(crate) rows_acknowledged: i64,
    #[sqlx(json)]
    pub(crate) destination_columns: Vec<Column>,
    /// Where the stream writes.
    #[sqlx(flatten)]
    pub(crate) write_path: WritePath,
}

/// A staging row's write path, as its columns hold it: the staging table it was named (always
/// recorded, with the first batch) and `direct_append`, set when set-up chose the direct path
/// (no staging table was created then).
impl<'r> sqlx::FromRow<'r, PgRow> for WritePath {
    fn from_row(row: &'r PgRow) -> Result<Self, sqlx::Error> {
        if row.try_get::<bool, _>("direct_append")? {
            return Ok(WritePath::Direct);
        }
        Ok(WritePath::Staging { staging_table: row.try_get("staging_table")? })
    }
}

/// Whether the batch's replica still serves its delivery and the execution accepts batches:
/// it may have changed while the body was read (a transition, a redelivery, a hand-over),
/// checked in the receipt's transaction rather than by a read of its own.
async fn serves_delivery(tx: &mut sqlx::PgConnection, batch: &NewBatch<'_>) -> StoreResult<bool> {
    let serving: Option<bool> = sqlx::query(&format!(
        "SELECT state = ANY($4) AND owner IS NOT DISTINCT FROM $5 FROM executions WHERE {DELIVERY_KEY}"
    ))
    .bind_delivery(&batch.resource.delivery)
    .bind(state_names(ExecutionState::ACCEPTING_BATCHES))
    .bind(batch.serving_replica)
    .fetch_optional(tx)
    .await?
    .map(|row| row.try_get(0))
    .transpose()?;
    Ok(serving == Some(true))
}

/// The advisory lock that lets one replica at a time prune.
const PRUNE_LOCK: i64 = 0x66696c_7072756e;

/// Streams a replica handed over (their acknowledged rows and columns recorded) that are not
/// finalized yet; callers add the delivery's key. A batch's receipt answers the same of its
/// resource's row (`insert_batch`).
const HANDED_OVER_STREAMS: &str = "SELECT resource, staging_table, stream_name, rows_acknowledged, destination_columns,
            direct_append
     FROM staging_streams
     WHERE destination_columns IS NOT NULL AND stream_name IS NOT NULL AND finalized_row_count IS NULL";

impl Store {
    pub(crate) async fn find_receipt(&self, resource: &ResourceRef, seq: i64) -> StoreResult<Option<ReceiptRecord>> {
        Ok(sqlx::query_as(&format!("SELECT * FROM batches WHERE {RESOURCE_KEY} AND seq = $5"))
            .bind_resource(resource)
            .bind(seq)
            .fetch_optional(&self.pool)
            .await?)
    }

    /// Records a batch atomically: the resource's staging row (first batch fixes the schema),
    /// then the receipt with the next or the requested `seq` and the current checkpoint position.
    pub(crate) async fn insert_batch(&self, batch: &NewBatch<'_>) -> StoreResult<InsertBatch> {
        let mut tx = self.pool.begin().await?;
        if !serves_delivery(&mut tx, batch).await? {
            tx.rollback().await?;
            return Ok(InsertBatch::NotServing);
        }
        // Shared with other batches, exclusive of a re-declaration (`upsert_resource` locks the
        // row FOR UPDATE): the declaration cannot change between this check and the commit.
        let current: Option<ResourceRecord> =
            sqlx::query_as("SELECT * FROM resources WHERE run_id = $1 AND resource = $2 FOR SHARE")
                .bind(batch.resource.delivery.run_id())
                .bind(&batch.resource.resource)
                .fetch_optional(&mut *tx)
                .await?;
        if !current.as_ref().is_some_and(|current| current.same_declaration(batch.declaration)) {
            tx.rollback().await?;
            return Ok(InsertBatch::DeclarationChanged { current });
        }
        // The staging row, recorded by the resource's first batch and locked by every batch (a
        // conflict's DO UPDATE locks the row as FOR UPDATE would, and answers what it recorded):
        // batches of one resource are numbered one at a time.
        // It also answers whether a replica that shut down handed the resource's stream over
        // (what `HANDED_OVER_STREAMS` selects), for the lane this batch may start.
        let staging: PgRow = sqlx::query(
            "INSERT INTO staging_streams (run_id, execution_id, delivery, resource, arrow_schema, arrow_schema_sha256, staging_table)
             VALUES ($1, $2, $3, $4, $5, $6, $7)
             ON CONFLICT (run_id, execution_id, delivery, resource)
                 DO UPDATE SET arrow_schema_sha256 = staging_streams.arrow_schema_sha256
             RETURNING arrow_schema_sha256, arrow_schema, resource, staging_table, stream_name, rows_acknowledged,
                       destination_columns, direct_append,
                       (destination_columns IS NOT NULL AND stream_name IS NOT NULL
                        AND finalized_row_count IS NULL) AS handed_over",
        )
        .bind_resource(batch.resource)
        .bind(batch.arrow_schema)
        .bind(batch.arrow_schema_sha256)
        .bind(batch.staging_table)
        .fetch_one(&mut *tx)
        .await?;
        if staging.try_get::<String, _>("arrow_schema_sha256")? != batch.arrow_schema_sha256 {
            tx.rollback().await?;
            return Ok(InsertBatch::SchemaMismatch { recorded: staging.try_get("arrow_schema")? });
        }
        let handed_over = match staging.try_get::<bool, _>("handed_over")? {
            true => Some(<HandedOverStream as sqlx::FromRow<'_, PgRow>>::from_row(&staging)?),
            false => None,
        };
        if let Some(seq) = batch.seq {
            let existing: Option<ReceiptRecord> =
                sqlx::query_as(&format!("SELECT * FROM batches WHERE {RESOURCE_KEY} AND seq = $5"))
                    .bind_resource(batch.resource)
                    .bind(seq)
                    .fetch_optional(&mut *tx)
                    .await?;
            if let Some(existing) = existing {
                tx.rollback().await?;
                return Ok(InsertBatch::SeqTaken(existing));
            }
        }
        let inserted: ReceiptRecord = sqlx::query_as(&format!(
            "INSERT INTO batches (run_id, execution_id, delivery, resource, seq, rows, uncompressed_bytes, arrow_ipc_sha256, checkpoint_seq, key_ranges)
             SELECT $1, $2, $3, $4,
                    COALESCE($5, (SELECT COALESCE(MAX(seq) + 1, 0) FROM batches WHERE {RESOURCE_KEY})),
                    $6, $7, $8,
                    (SELECT COUNT(*) FROM checkpoints WHERE {DELIVERY_KEY}),
                    $9
             RETURNING *",
        ))
        .bind_resource(batch.resource)
        .bind(batch.seq)
        .bind(batch.rows)
        .bind(batch.uncompressed_bytes)
        .bind(batch.arrow_ipc_sha256)
        .bind(&batch.key_ranges)
        .fetch_one(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(InsertBatch::Inserted { receipt: inserted, handed_over })
    }

    /// Deletes the batch receipts of deliveries that ended more than `retention_days` ago (a
    /// replaced delivery ended when the next one started). No redelivery needs them: a new
    /// delivery starts from nothing, and publications keep their fingerprints. One replica at a
    /// time prunes (a transaction-scoped advisory lock); `None` when another one holds it.
    pub(crate) async fn prune_receipts(&self, retention_days: u32) -> StoreResult<Option<u64>> {
        let mut tx = self.pool.begin().await?;
        let locked: bool =
            sqlx::query_scalar("SELECT pg_try_advisory_xact_lock($1)").bind(PRUNE_LOCK).fetch_one(&mut *tx).await?;
        if !locked {
            tx.rollback().await?;
            return Ok(None);
        }
        let pruned = sqlx::query(
            "DELETE FROM batches b USING executions e
             WHERE e.run_id = b.run_id AND e.execution_id = b.execution_id
               AND ((b.delivery = e.delivery AND e.finished_at < now() - $1 * interval '1 day')
                 OR (b.delivery < e.delivery AND EXISTS (
                        SELECT 1 FROM deliveries n
                        WHERE n.run_id = b.run_id AND n.execution_id = b.execution_id
                          AND n.delivery = b.delivery + 1 AND n.started_at < now() - $1 * interval '1 day')))",
        )
        .bind(f64::from(retention_days))
        .execute(&mut *tx)
        .await?;
        // The timelines of executions that ended as long ago go with their receipts.
        sqlx::query(
            "DELETE FROM execution_events ev USING executions e
             WHERE e.run_id = ev.run_id AND e.execution_id = ev.execution_id
               AND e.finished_at < now() - $1 * interval '1 day'",
        )
        .bind(f64::from(retention_days))
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(Some(pruned.rows_affected()))
    }

    pub(crate) async fn list_staging_streams(&self, delivery: &DeliveryRef) -> StoreResult<Vec<StagingStreamRecord>> {
        Ok(sqlx::query_as(&format!("SELECT * FROM staging_streams WHERE {DELIVERY_KEY} ORDER BY resource"))
            .bind_delivery(delivery)
            .fetch_all(&self.pool)
            .await?)
    }

    /// What a commit plans and publishes from, read in one transaction once per commit (the
    /// plan's pricing and the publication both read it): every resource's [`StagedInputs`] in
    /// the delivery, and the publication records of the execution's earlier deliveries (the
    /// commit holds the execution's lease: nothing else writes them meanwhile).
    pub(crate) async fn commit_inputs(&self, delivery: &DeliveryRef) -> StoreResult<CommitInputs> {
        let mut tx = self.pool.begin().await?;
        let schemas: Vec<(ResourceName, String)> =
            sqlx::query_as(&format!("SELECT resource, arrow_schema_sha256 FROM staging_streams WHERE {DELIVERY_KEY}"))
                .bind_delivery(delivery)
                .fetch_all(&mut *tx)
                .await?;
        let receipts: Vec<ReceiptRecord> =
            sqlx::query_as(&format!("SELECT * FROM batches WHERE {DELIVERY_KEY} ORDER BY resource, seq"))
                .bind_delivery(delivery)
                .fetch_all(&mut *tx)
                .await?;
        let publications: Vec<PublicationRecord> =
            sqlx::query_as(&format!("SELECT * FROM publications WHERE {EXECUTION_KEY}"))
                .bind_execution(&delivery.execution)
                .fetch_all(&mut *tx)
                .await?;
        tx.commit().await?;
        let mut staged: HashMap<ResourceName, StagedInputs> = schemas
            .into_iter()
            .map(|(resource, arrow_schema_sha256)| {
                (resource, StagedInputs { arrow_schema_sha256, receipts: Vec::new() })
            })
            .collect();
        for receipt in receipts {
            if let Some(inputs) = staged.get_mut(&receipt.resource) {
                inputs.receipts.push(receipt);
            }
        }
        let earlier_publications = publications.into_iter().map(|record| (record.resource.clone(), record)).collect();
        Ok(CommitInputs { staged, earlier_publications })
    }

    pub(crate) async fn add_rows_acknowledged(&self, resource: &ResourceRef, rows: i64) -> StoreResult<()> {
        sqlx::query(&format!(
            "UPDATE staging_streams SET rows_acknowledged = rows_acknowledged + $5 WHERE {RESOURCE_KEY}"
        ))
        .bind_resource(resource)
        .bind(rows)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    pub(crate) async fn set_stream_finalized(&self, resource: &ResourceRef, row_count: i64) -> StoreResult<()> {
        sqlx::query(&format!("UPDATE staging_streams SET finalized_row_count = $5 WHERE {RESOURCE_KEY}"))
            .bind_resource(resource)
            .bind(row_count)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// Records a drained stream at hand-over: its exact acknowledged row count and what commit
    /// needs of it.
    pub(crate) async fn record_handed_over_stream(
        &self,
        resource: &ResourceRef,
        rows_acknowledged: i64,
        destination_columns: &[Column],
    ) -> StoreResult<()> {
        let columns = serde_json::to_value(destination_columns).map_err(|e| StoreError::Corrupt(e.to_string()))?;
        sqlx::query(&format!(
            "UPDATE staging_streams SET rows_acknowledged = $5, destination_columns = $6 WHERE {RESOURCE_KEY}"
        ))
        .bind_resource(resource)
        .bind(rows_acknowledged)
        .bind(columns)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// The delivery's streams handed over by a replica that shut down.
    pub(crate) async fn handed_over_streams(&self, delivery: &DeliveryRef) -> StoreResult<Vec<HandedOverStream>> {
        Ok(sqlx::query_as(&format!("{HANDED_OVER_STREAMS} AND {DELIVERY_KEY} ORDER BY resource"))
            .bind_delivery(delivery)
            .fetch_all(&self.pool)
            .await?)
    }
}
