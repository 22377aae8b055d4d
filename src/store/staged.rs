//! Held commits (issue 58): a commit asked to hold records what a later commit needs of each
//! stream (its columns and acknowledged rows, as a replica that hands over records them) and
//! moves the delivery to `staged` in one transaction. The next commit, on any replica, moves it
//! back to `committing` under that replica's lease and rebuilds the lane reports from these
//! records ([`crate::publish`]); an abort discards it like any delivery before its barrier.

use super::{BindKey as _, DELIVERY_KEY, ExecutionRecord, HandedOverStream, Lease, Store, StoreError, StoreResult};
use crate::error::Problem;
use crate::model::columns::Column;
use crate::model::{DeliveryRef, ExecutionState};

/// What a held commit records of one stream it staged.
#[derive(Debug, Clone, Copy)]
pub(crate) struct StreamToKeep<'a> {
    pub(crate) resource: &'a str,
    pub(crate) rows_acknowledged: i64,
    pub(crate) destination_columns: &'a [Column],
}

impl Store {
    /// Records each stream's columns and acknowledged rows and moves the delivery from
    /// `committing` to `staged`, in one transaction; `None` (nothing recorded) when it is not
    /// committing before its barrier any more (an abort, or a lane's failure, came first).
    pub(crate) async fn stage_delivery(
        &self,
        delivery: &DeliveryRef,
        streams: &[StreamToKeep<'_>],
    ) -> StoreResult<Option<ExecutionRecord>> {
        let mut tx = self.pool.begin().await?;
        let staged: Option<ExecutionRecord> = sqlx::query_as(&format!(
            "UPDATE executions SET state = $4, staged_at = now(), updated_at = now()
             WHERE {DELIVERY_KEY} AND state = $5 AND publishing_at IS NULL
             RETURNING *"
        ))
        .bind_delivery(delivery)
        .bind(ExecutionState::Staged)
        .bind(ExecutionState::Committing)
        .fetch_optional(&mut *tx)
        .await?;
        if staged.is_none() {
            tx.rollback().await?;
            return Ok(None);
        }
        let resources: Vec<&str> = streams.iter().map(|s| s.resource).collect();
        let rows: Vec<i64> = streams.iter().map(|s| s.rows_acknowledged).collect();
        let columns = streams
            .iter()
            .map(|s| serde_json::to_value(s.destination_columns))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| StoreError::Corrupt(e.to_string()))?;
        sqlx::query(
            "UPDATE staging_streams s SET rows_acknowledged = kept.rows, destination_columns = kept.columns
             FROM UNNEST($4::text[], $5::bigint[], $6::jsonb[]) AS kept (resource, rows, columns)
             WHERE s.run_id = $1 AND s.execution_id = $2 AND s.delivery = $3 AND s.resource = kept.resource",
        )
        .bind_delivery(delivery)
        .bind(resources)
        .bind(rows)
        .bind(columns)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(staged)
    }

    /// Moves the staged delivery back to `committing`, kept from now on by `lease` (the
    /// replica that publishes it); `None` when it is not staged any more.
    pub(crate) async fn resume_staged(
        &self,
        delivery: &DeliveryRef,
        lease: &Lease,
    ) -> StoreResult<Option<ExecutionRecord>> {
        Ok(sqlx::query_as(&format!(
            "UPDATE executions SET state = $4, owner = $5, owner_url = $6,
                    lease_expires_at = now() + $7 * interval '1 second', handed_over = false, updated_at = now()
             WHERE {DELIVERY_KEY} AND state = $8
             RETURNING *"
        ))
        .bind_delivery(delivery)
        .bind(ExecutionState::Committing)
        .bind(&lease.owner)
        .bind(&lease.url)
        .bind(lease.seconds())
        .bind(ExecutionState::Staged)
        .fetch_optional(&self.pool)
        .await?)
    }

    /// Fails the delivery with `problem` only while it is `staged` (a commit that read it
    /// staged must not fail it once another commit resumed it).
    pub(crate) async fn fail_staged_execution(
        &self,
        delivery: &DeliveryRef,
        problem: &Problem,
    ) -> StoreResult<Option<ExecutionRecord>> {
        self.fail_open_execution(delivery, problem, "state = 'staged'").await
    }

    /// The streams a held commit staged for the delivery ([`Self::stage_delivery`]): each
    /// finalized, and committed to its staging table unless it writes into the destination
    /// (`direct_append`: its commit is the publication).
    pub(crate) async fn staged_streams(&self, delivery: &DeliveryRef) -> StoreResult<Vec<HandedOverStream>> {
        Ok(sqlx::query_as(&format!(
            "SELECT resource, staging_table, stream_name, rows_acknowledged, destination_columns, direct_append
             FROM staging_streams
             WHERE {DELIVERY_KEY} AND stream_name IS NOT NULL AND destination_columns IS NOT NULL
               AND finalized_row_count IS NOT NULL
             ORDER BY resource"
        ))
        .bind_delivery(delivery)
        .fetch_all(&self.pool)
        .await?)
    }
}
