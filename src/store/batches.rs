//! Batch receipts and the per-resource staging stream of a delivery.

use chrono::{DateTime, Utc};
use sqlx::Row as _;

use super::{Store, StoreResult};

/// A receipt as stored (the 202/200 answer of a batch request).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReceiptRecord {
    pub resource: String,
    pub seq: i64,
    pub rows: i64,
    pub uncompressed_bytes: i64,
    pub arrow_ipc_sha256: String,
    pub checkpoint_seq: i64,
}

/// A batch to record, with the schema its resource must keep in this delivery.
#[derive(Debug, Clone)]
pub struct NewBatch<'a> {
    pub run_id: &'a str,
    pub execution_id: &'a str,
    pub delivery: i32,
    pub resource: &'a str,
    /// `None`: the next free sequence number.
    pub seq: Option<i64>,
    pub rows: i64,
    pub uncompressed_bytes: i64,
    pub arrow_ipc_sha256: &'a str,
    pub arrow_schema: &'a serde_json::Value,
    pub arrow_schema_sha256: &'a str,
    pub staging_table: &'a str,
}

/// Outcome of recording a batch.
#[derive(Debug)]
pub enum InsertBatch {
    Inserted(ReceiptRecord),
    /// The sequence number is taken (by a concurrent or earlier request).
    SeqTaken(ReceiptRecord),
    /// Another schema was recorded first for this resource and delivery.
    SchemaMismatch {
        recorded: serde_json::Value,
    },
}

/// The staging side of one resource in one delivery.
#[derive(Debug, Clone)]
pub struct StagingStreamRecord {
    pub resource: String,
    pub arrow_schema: serde_json::Value,
    pub arrow_schema_sha256: String,
    pub staging_table: String,
    pub stream_name: Option<String>,
    pub stream_created_at: Option<DateTime<Utc>>,
    pub rows_acknowledged: i64,
    pub finalized_row_count: Option<i64>,
    pub committed_at: Option<DateTime<Utc>>,
}

fn receipt_from_row(row: &sqlx::postgres::PgRow) -> StoreResult<ReceiptRecord> {
    Ok(ReceiptRecord {
        resource: row.try_get("resource")?,
        seq: row.try_get("seq")?,
        rows: row.try_get("rows")?,
        uncompressed_bytes: row.try_get("uncompressed_bytes")?,
        arrow_ipc_sha256: row.try_get("arrow_ipc_sha256")?,
        checkpoint_seq: row.try_get("checkpoint_seq")?,
    })
}

fn staging_from_row(row: &sqlx::postgres::PgRow) -> StoreResult<StagingStreamRecord> {
    Ok(StagingStreamRecord {
        resource: row.try_get("resource")?,
        arrow_schema: row.try_get("arrow_schema")?,
        arrow_schema_sha256: row.try_get("arrow_schema_sha256")?,
        staging_table: row.try_get("staging_table")?,
        stream_name: row.try_get("stream_name")?,
        stream_created_at: row.try_get("stream_created_at")?,
        rows_acknowledged: row.try_get("rows_acknowledged")?,
        finalized_row_count: row.try_get("finalized_row_count")?,
        committed_at: row.try_get("committed_at")?,
    })
}

impl Store {
    pub async fn find_receipt(
        &self,
        run_id: &str,
        execution_id: &str,
        delivery: i32,
        resource: &str,
        seq: i64,
    ) -> StoreResult<Option<ReceiptRecord>> {
        let row = sqlx::query(
            "SELECT * FROM batches WHERE run_id = $1 AND execution_id = $2 AND delivery = $3 AND resource = $4 AND seq = $5",
        )
        .bind(run_id)
        .bind(execution_id)
        .bind(delivery)
        .bind(resource)
        .bind(seq)
        .fetch_optional(&self.pool)
        .await?;
        row.as_ref().map(receipt_from_row).transpose()
    }

    /// The ordered receipts of one resource in one delivery.
    pub async fn list_receipts(
        &self,
        run_id: &str,
        execution_id: &str,
        delivery: i32,
        resource: &str,
    ) -> StoreResult<Vec<ReceiptRecord>> {
        let rows = sqlx::query(
            "SELECT * FROM batches WHERE run_id = $1 AND execution_id = $2 AND delivery = $3 AND resource = $4 ORDER BY seq",
        )
        .bind(run_id)
        .bind(execution_id)
        .bind(delivery)
        .bind(resource)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(receipt_from_row).collect()
    }

    /// Records a batch atomically: the resource's staging row (first batch fixes the schema),
    /// then the receipt with the next or the requested `seq` and the current checkpoint position.
    pub async fn insert_batch(&self, batch: &NewBatch<'_>) -> StoreResult<InsertBatch> {
        let mut tx = self.pool.begin().await?;
        sqlx::query(
            "INSERT INTO staging_streams (run_id, execution_id, delivery, resource, arrow_schema, arrow_schema_sha256, staging_table)
             VALUES ($1, $2, $3, $4, $5, $6, $7)
             ON CONFLICT DO NOTHING",
        )
        .bind(batch.run_id)
        .bind(batch.execution_id)
        .bind(batch.delivery)
        .bind(batch.resource)
        .bind(batch.arrow_schema)
        .bind(batch.arrow_schema_sha256)
        .bind(batch.staging_table)
        .execute(&mut *tx)
        .await?;
        // Lock the staging row: batches of one resource are numbered one at a time.
        let (recorded_sha, recorded_schema): (String, serde_json::Value) = sqlx::query_as(
            "SELECT arrow_schema_sha256, arrow_schema FROM staging_streams
             WHERE run_id = $1 AND execution_id = $2 AND delivery = $3 AND resource = $4 FOR UPDATE",
        )
        .bind(batch.run_id)
        .bind(batch.execution_id)
        .bind(batch.delivery)
        .bind(batch.resource)
        .fetch_one(&mut *tx)
        .await?;
        if recorded_sha != batch.arrow_schema_sha256 {
            tx.rollback().await?;
            return Ok(InsertBatch::SchemaMismatch { recorded: recorded_schema });
        }
        if let Some(seq) = batch.seq {
            let existing = sqlx::query(
                "SELECT * FROM batches WHERE run_id = $1 AND execution_id = $2 AND delivery = $3 AND resource = $4 AND seq = $5",
            )
            .bind(batch.run_id)
            .bind(batch.execution_id)
            .bind(batch.delivery)
            .bind(batch.resource)
            .bind(seq)
            .fetch_optional(&mut *tx)
            .await?;
            if let Some(row) = existing {
                tx.rollback().await?;
                return Ok(InsertBatch::SeqTaken(receipt_from_row(&row)?));
            }
        }
        let row = sqlx::query(
            "INSERT INTO batches (run_id, execution_id, delivery, resource, seq, rows, uncompressed_bytes, arrow_ipc_sha256, checkpoint_seq)
             SELECT $1, $2, $3, $4,
                    COALESCE($5, (SELECT COALESCE(MAX(seq) + 1, 0) FROM batches
                                  WHERE run_id = $1 AND execution_id = $2 AND delivery = $3 AND resource = $4)),
                    $6, $7, $8,
                    (SELECT COUNT(*) FROM checkpoints WHERE run_id = $1 AND execution_id = $2 AND delivery = $3)
             RETURNING *",
        )
        .bind(batch.run_id)
        .bind(batch.execution_id)
        .bind(batch.delivery)
        .bind(batch.resource)
        .bind(batch.seq)
        .bind(batch.rows)
        .bind(batch.uncompressed_bytes)
        .bind(batch.arrow_ipc_sha256)
        .fetch_one(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(InsertBatch::Inserted(receipt_from_row(&row)?))
    }

    pub async fn get_staging_stream(
        &self,
        run_id: &str,
        execution_id: &str,
        delivery: i32,
        resource: &str,
    ) -> StoreResult<Option<StagingStreamRecord>> {
        let row = sqlx::query(
            "SELECT * FROM staging_streams WHERE run_id = $1 AND execution_id = $2 AND delivery = $3 AND resource = $4",
        )
        .bind(run_id)
        .bind(execution_id)
        .bind(delivery)
        .bind(resource)
        .fetch_optional(&self.pool)
        .await?;
        row.as_ref().map(staging_from_row).transpose()
    }

    pub async fn list_staging_streams(
        &self,
        run_id: &str,
        execution_id: &str,
        delivery: i32,
    ) -> StoreResult<Vec<StagingStreamRecord>> {
        let rows = sqlx::query(
            "SELECT * FROM staging_streams WHERE run_id = $1 AND execution_id = $2 AND delivery = $3 ORDER BY resource",
        )
        .bind(run_id)
        .bind(execution_id)
        .bind(delivery)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(staging_from_row).collect()
    }

    /// Records the PENDING stream's name as soon as it exists (before any commit).
    pub async fn set_stream_name(
        &self,
        run_id: &str,
        execution_id: &str,
        delivery: i32,
        resource: &str,
        stream_name: &str,
    ) -> StoreResult<()> {
        sqlx::query(
            "UPDATE staging_streams SET stream_name = $5, stream_created_at = now()
             WHERE run_id = $1 AND execution_id = $2 AND delivery = $3 AND resource = $4",
        )
        .bind(run_id)
        .bind(execution_id)
        .bind(delivery)
        .bind(resource)
        .bind(stream_name)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    pub async fn add_rows_acknowledged(
        &self,
        run_id: &str,
        execution_id: &str,
        delivery: i32,
        resource: &str,
        rows: i64,
    ) -> StoreResult<()> {
        sqlx::query(
            "UPDATE staging_streams SET rows_acknowledged = rows_acknowledged + $5
             WHERE run_id = $1 AND execution_id = $2 AND delivery = $3 AND resource = $4",
        )
        .bind(run_id)
        .bind(execution_id)
        .bind(delivery)
        .bind(resource)
        .bind(rows)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    pub async fn set_stream_finalized(
        &self,
        run_id: &str,
        execution_id: &str,
        delivery: i32,
        resource: &str,
        row_count: i64,
    ) -> StoreResult<()> {
        sqlx::query(
            "UPDATE staging_streams SET finalized_row_count = $5
             WHERE run_id = $1 AND execution_id = $2 AND delivery = $3 AND resource = $4",
        )
        .bind(run_id)
        .bind(execution_id)
        .bind(delivery)
        .bind(resource)
        .bind(row_count)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    pub async fn set_stream_committed(
        &self,
        run_id: &str,
        execution_id: &str,
        delivery: i32,
        resource: &str,
    ) -> StoreResult<()> {
        sqlx::query(
            "UPDATE staging_streams SET committed_at = now()
             WHERE run_id = $1 AND execution_id = $2 AND delivery = $3 AND resource = $4",
        )
        .bind(run_id)
        .bind(execution_id)
        .bind(delivery)
        .bind(resource)
        .execute(&self.pool)
        .await?;
        Ok(())
    }
}
