//! Executions, their deliveries and checkpoints, and the durable checkpoint of a run.

use chrono::{DateTime, Utc};
use sqlx::Row as _;

use super::{Store, StoreError, StoreResult};
use crate::error::Problem;
use crate::model::ExecutionState;

/// An execution as stored; `delivery` is the current delivery.
#[derive(Debug, Clone)]
pub struct ExecutionRecord {
    pub run_id: String,
    pub execution_id: String,
    pub delivery: i32,
    pub state: ExecutionState,
    pub error: Option<Problem>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

/// Per resource of the current delivery: what was received and acknowledged.
#[derive(Debug, Clone)]
pub struct ResourceProgress {
    pub resource: String,
    pub batches: i64,
    pub rows_received: i64,
    pub bytes_received: i64,
    pub rows_acknowledged: i64,
}

/// Outcome of POSTing an execution.
#[derive(Debug)]
pub enum OpenExecution {
    Created(ExecutionRecord),
    /// The execution existed: a new delivery started.
    Redelivered(ExecutionRecord),
    /// The execution is committing; a redelivery now would race the publication.
    Committing(ExecutionRecord),
}

fn execution_from_row(row: &sqlx::postgres::PgRow) -> StoreResult<ExecutionRecord> {
    let error: Option<serde_json::Value> = row.try_get("error")?;
    Ok(ExecutionRecord {
        run_id: row.try_get("run_id")?,
        execution_id: row.try_get("execution_id")?,
        delivery: row.try_get("delivery")?,
        state: row.try_get("state")?,
        error: error.map(serde_json::from_value).transpose().map_err(|e| StoreError::Corrupt(e.to_string()))?,
        created_at: row.try_get("created_at")?,
        updated_at: row.try_get("updated_at")?,
    })
}

fn problem_json(problem: &Problem) -> StoreResult<serde_json::Value> {
    serde_json::to_value(problem).map_err(|e| StoreError::Corrupt(e.to_string()))
}

impl Store {
    /// Creates the execution (delivery 1) or starts a new delivery of an existing one.
    pub async fn open_execution(&self, run_id: &str, execution_id: &str) -> StoreResult<OpenExecution> {
        let mut tx = self.pool.begin().await?;
        // Serialise concurrent opens of the same id on the run row.
        sqlx::query("SELECT 1 FROM runs WHERE run_id = $1 FOR UPDATE").bind(run_id).execute(&mut *tx).await?;
        let existing = sqlx::query("SELECT * FROM executions WHERE run_id = $1 AND execution_id = $2 FOR UPDATE")
            .bind(run_id)
            .bind(execution_id)
            .fetch_optional(&mut *tx)
            .await?;
        let outcome = match existing {
            None => {
                let row = sqlx::query(
                    "INSERT INTO executions (run_id, execution_id, delivery, state)
                     VALUES ($1, $2, 1, 'extracting') RETURNING *",
                )
                .bind(run_id)
                .bind(execution_id)
                .fetch_one(&mut *tx)
                .await?;
                sqlx::query("INSERT INTO deliveries (run_id, execution_id, delivery) VALUES ($1, $2, 1)")
                    .bind(run_id)
                    .bind(execution_id)
                    .execute(&mut *tx)
                    .await?;
                OpenExecution::Created(execution_from_row(&row)?)
            }
            Some(row) => {
                let current = execution_from_row(&row)?;
                if current.state == ExecutionState::Committing {
                    tx.rollback().await?;
                    return Ok(OpenExecution::Committing(current));
                }
                sqlx::query(
                    "UPDATE deliveries SET final_state = COALESCE(final_state, $4)
                     WHERE run_id = $1 AND execution_id = $2 AND delivery = $3",
                )
                .bind(run_id)
                .bind(execution_id)
                .bind(current.delivery)
                .bind(if current.state.is_terminal() { current.state.as_str() } else { "redelivered" })
                .execute(&mut *tx)
                .await?;
                let row = sqlx::query(
                    "UPDATE executions SET delivery = delivery + 1, state = 'extracting', error = NULL,
                            finished_at = NULL, updated_at = now()
                     WHERE run_id = $1 AND execution_id = $2 RETURNING *",
                )
                .bind(run_id)
                .bind(execution_id)
                .fetch_one(&mut *tx)
                .await?;
                let record = execution_from_row(&row)?;
                sqlx::query("INSERT INTO deliveries (run_id, execution_id, delivery) VALUES ($1, $2, $3)")
                    .bind(run_id)
                    .bind(execution_id)
                    .bind(record.delivery)
                    .execute(&mut *tx)
                    .await?;
                OpenExecution::Redelivered(record)
            }
        };
        tx.commit().await?;
        Ok(outcome)
    }

    pub async fn get_execution(&self, run_id: &str, execution_id: &str) -> StoreResult<Option<ExecutionRecord>> {
        let row = sqlx::query("SELECT * FROM executions WHERE run_id = $1 AND execution_id = $2")
            .bind(run_id)
            .bind(execution_id)
            .fetch_optional(&self.pool)
            .await?;
        row.as_ref().map(execution_from_row).transpose()
    }

    pub async fn list_executions(&self, run_id: &str) -> StoreResult<Vec<ExecutionRecord>> {
        let rows = sqlx::query("SELECT * FROM executions WHERE run_id = $1 ORDER BY created_at, execution_id")
            .bind(run_id)
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(execution_from_row).collect()
    }

    /// Moves the current delivery from one of `from` to `to`; `None` when the execution was not
    /// in one of `from` (or another delivery started meanwhile).
    pub async fn transition_execution(
        &self,
        run_id: &str,
        execution_id: &str,
        delivery: i32,
        from: &[ExecutionState],
        to: ExecutionState,
    ) -> StoreResult<Option<ExecutionRecord>> {
        let from: Vec<&str> = from.iter().map(|s| s.as_str()).collect();
        let row = sqlx::query(
            "UPDATE executions SET state = $5, updated_at = now(),
                    finished_at = CASE WHEN $5 IN ('committed', 'failed', 'aborted') THEN now() END
             WHERE run_id = $1 AND execution_id = $2 AND delivery = $3 AND state = ANY($4)
             RETURNING *",
        )
        .bind(run_id)
        .bind(execution_id)
        .bind(delivery)
        .bind(&from)
        .bind(to.as_str())
        .fetch_optional(&self.pool)
        .await?;
        row.as_ref().map(execution_from_row).transpose()
    }

    /// Fails the current delivery with `problem` unless it already ended.
    pub async fn fail_execution(
        &self,
        run_id: &str,
        execution_id: &str,
        delivery: i32,
        problem: &Problem,
    ) -> StoreResult<Option<ExecutionRecord>> {
        let row = sqlx::query(
            "UPDATE executions SET state = 'failed', error = $4, updated_at = now(), finished_at = now()
             WHERE run_id = $1 AND execution_id = $2 AND delivery = $3
               AND state IN ('extracting', 'paused', 'committing')
             RETURNING *",
        )
        .bind(run_id)
        .bind(execution_id)
        .bind(delivery)
        .bind(problem_json(problem)?)
        .fetch_optional(&self.pool)
        .await?;
        row.as_ref().map(execution_from_row).transpose()
    }

    /// Marks the delivery committed and, in the same transaction, makes its last checkpoint the
    /// run's durable checkpoint (an execution without checkpoints leaves the previous one).
    pub async fn mark_committed(
        &self,
        run_id: &str,
        execution_id: &str,
        delivery: i32,
    ) -> StoreResult<Option<ExecutionRecord>> {
        let mut tx = self.pool.begin().await?;
        let row = sqlx::query(
            "UPDATE executions SET state = 'committed', updated_at = now(), finished_at = now()
             WHERE run_id = $1 AND execution_id = $2 AND delivery = $3 AND state = 'committing'
             RETURNING *",
        )
        .bind(run_id)
        .bind(execution_id)
        .bind(delivery)
        .fetch_optional(&mut *tx)
        .await?;
        let Some(row) = row else {
            tx.rollback().await?;
            return Ok(None);
        };
        sqlx::query(
            "UPDATE deliveries SET final_state = 'committed' WHERE run_id = $1 AND execution_id = $2 AND delivery = $3",
        )
        .bind(run_id)
        .bind(execution_id)
        .bind(delivery)
        .execute(&mut *tx)
        .await?;
        sqlx::query(
            "UPDATE runs SET durable_checkpoint = c.value, durable_checkpoint_execution_id = $2, updated_at = now()
             FROM (SELECT value FROM checkpoints
                   WHERE run_id = $1 AND execution_id = $2 AND delivery = $3
                   ORDER BY checkpoint_seq DESC LIMIT 1) c
             WHERE runs.run_id = $1",
        )
        .bind(run_id)
        .bind(execution_id)
        .bind(delivery)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(Some(execution_from_row(&row)?))
    }

    /// Records a checkpoint of the current delivery; returns its sequence number (0, 1, ...).
    pub async fn add_checkpoint(
        &self,
        run_id: &str,
        execution_id: &str,
        delivery: i32,
        value: &serde_json::Value,
        flushed_rows: i64,
    ) -> StoreResult<i64> {
        let mut tx = self.pool.begin().await?;
        sqlx::query("SELECT 1 FROM executions WHERE run_id = $1 AND execution_id = $2 FOR UPDATE")
            .bind(run_id)
            .bind(execution_id)
            .execute(&mut *tx)
            .await?;
        let seq: i64 = sqlx::query_scalar(
            "INSERT INTO checkpoints (run_id, execution_id, delivery, checkpoint_seq, value, flushed_rows)
             SELECT $1, $2, $3, COALESCE(MAX(checkpoint_seq) + 1, 0), $4, $5
             FROM checkpoints WHERE run_id = $1 AND execution_id = $2 AND delivery = $3
             RETURNING checkpoint_seq",
        )
        .bind(run_id)
        .bind(execution_id)
        .bind(delivery)
        .bind(value)
        .bind(flushed_rows)
        .fetch_one(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(seq)
    }

    /// Received and acknowledged totals per resource of one delivery.
    pub async fn resource_progress(
        &self,
        run_id: &str,
        execution_id: &str,
        delivery: i32,
    ) -> StoreResult<Vec<ResourceProgress>> {
        let rows = sqlx::query(
            "SELECT s.resource, s.rows_acknowledged,
                    COUNT(b.seq) AS batches,
                    COALESCE(SUM(b.rows), 0)::BIGINT AS rows_received,
                    COALESCE(SUM(b.uncompressed_bytes), 0)::BIGINT AS bytes_received
             FROM staging_streams s
             LEFT JOIN batches b USING (run_id, execution_id, delivery, resource)
             WHERE s.run_id = $1 AND s.execution_id = $2 AND s.delivery = $3
             GROUP BY s.resource, s.rows_acknowledged
             ORDER BY s.resource",
        )
        .bind(run_id)
        .bind(execution_id)
        .bind(delivery)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|row| {
                Ok(ResourceProgress {
                    resource: row.try_get("resource")?,
                    batches: row.try_get("batches")?,
                    rows_received: row.try_get("rows_received")?,
                    bytes_received: row.try_get("bytes_received")?,
                    rows_acknowledged: row.try_get("rows_acknowledged")?,
                })
            })
            .collect()
    }

    /// At start-up: executions left open by a previous process cannot resume (their queued
    /// payloads and pending streams lived in that process), so they fail and the extractor
    /// redelivers them. Assumes one gateway process per database.
    pub async fn fail_interrupted_executions(&self, problem: &Problem) -> StoreResult<u64> {
        let done = sqlx::query(
            "UPDATE executions SET state = 'failed', error = $1, updated_at = now(), finished_at = now()
             WHERE state IN ('extracting', 'paused', 'committing')",
        )
        .bind(problem_json(problem)?)
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected())
    }
}
