//! Executions, their deliveries and checkpoints, and the durable checkpoint of a run.

use chrono::{DateTime, Utc};
use sqlx::Postgres;
use sqlx::postgres::PgArguments;

use super::{BindKey as _, DELIVERY_KEY, EXECUTION_KEY, Store, StoreError, StoreResult, state_names};
use crate::error::{ErrorCode, Problem};
use crate::model::{
    DeliveryOutcome, DeliveryRef, ExecutionId, ExecutionKey, ExecutionState, PublicationState, ResourceName, RunId,
};

/// The timeline's `ended` event of each delivery the enclosing statement's `failed` CTE failed,
/// written by the same statement (`store::events`).
const RECORD_FAILED_END: &str = "INSERT INTO execution_events (run_id, execution_id, delivery, kind, detail)
     SELECT run_id, execution_id, delivery, 'ended',
            jsonb_strip_nulls(jsonb_build_object('state', state, 'code', error->>'code', 'hint', error->>'hint'))
     FROM failed";

/// An execution as stored; `delivery` is the current delivery.
#[derive(Debug, Clone, sqlx::FromRow)]
pub(crate) struct ExecutionRecord {
    pub(crate) run_id: RunId,
    pub(crate) execution_id: ExecutionId,
    pub(crate) delivery: i32,
    pub(crate) state: ExecutionState,
    #[sqlx(json(nullable))]
    pub(crate) error: Option<Problem>,
    /// When the delivery's commit began publishing (its first destination job); abort is
    /// refused from then on.
    pub(crate) publishing_at: Option<DateTime<Utc>>,
    /// When the delivery was paused: a segment the run resumes later, not the one that
    /// completes its snapshot.
    pub(crate) paused_at: Option<DateTime<Utc>>,
    /// When a commit asked to hold staged the delivery (`staged`, and kept once its second
    /// commit began).
    pub(crate) staged_at: Option<DateTime<Utc>>,
    /// Every destination is published in one multi-statement transaction
    /// (`publish::atomic`); fixed when the execution is first opened.
    pub(crate) atomic: bool,
    /// The replica whose memory holds the open delivery's uploads.
    pub(crate) owner: Option<String>,
    pub(crate) lease_expires_at: Option<DateTime<Utc>>,
    /// Where the owner takes forwarded requests (its advertised URL), when it has one.
    pub(crate) owner_url: Option<String>,
    /// The owner shut down cleanly and released the execution: the next replica adopts it.
    pub(crate) handed_over: bool,
    pub(crate) created_at: DateTime<Utc>,
    pub(crate) updated_at: DateTime<Utc>,
}

impl ExecutionRecord {
    /// Whether this delivery may complete its run's snapshot: it was never paused (a paused one
    /// is a segment the run resumes in a later execution). The first such execution of the run
    /// to commit does ([`Store::snapshot_completed_elsewhere`]).
    pub(crate) fn completes_snapshot(&self) -> bool {
        self.paused_at.is_none()
    }

    pub(crate) fn key(&self) -> ExecutionKey {
        ExecutionKey { run_id: self.run_id.clone(), execution_id: self.execution_id.clone() }
    }

    /// The current delivery.
    pub(crate) fn delivery_ref(&self) -> DeliveryRef {
        self.key().delivery(self.delivery)
    }
}

/// Per resource of the current delivery: what was received and acknowledged.
#[derive(Debug, Clone, sqlx::FromRow)]
pub(crate) struct ResourceProgress {
    pub(crate) resource: ResourceName,
    pub(crate) batches: i64,
    pub(crate) rows_received: i64,
    pub(crate) bytes_received: i64,
    pub(crate) rows_acknowledged: i64,
}

/// A replica's claim on the executions it serves.
#[derive(Debug, Clone)]
pub(crate) struct Lease {
    /// The replica's id (unique per process).
    pub(crate) owner: String,
    /// How long a claim lasts without renewal.
    pub(crate) duration: std::time::Duration,
    /// Where the other replicas forward this one's requests.
    pub(crate) url: Option<String>,
}

impl Lease {
    pub(super) fn seconds(&self) -> f64 {
        self.duration.as_secs_f64()
    }
}

/// Outcome of POSTing an execution.
#[derive(Debug)]
pub(crate) enum OpenExecution {
    Created(ExecutionRecord),
    /// The execution existed: a new delivery started.
    Redelivered(ExecutionRecord),
    /// The execution is committing (a redelivery now would race the publication) or staged
    /// (its next commit publishes what it staged; abort it first to deliver it again).
    Committing(ExecutionRecord),
}

/// Binds a new delivery's parameters: the execution's key ($1, $2), its owner's lease ($3 to
/// $5) and its state, extracting ($6).
fn bind_new_delivery<'q>(
    query: sqlx::query::QueryAs<'q, Postgres, ExecutionRecord, PgArguments>,
    key: &'q ExecutionKey,
    lease: &'q Lease,
) -> sqlx::query::QueryAs<'q, Postgres, ExecutionRecord, PgArguments> {
    query.bind_execution(key).bind(&lease.owner).bind(lease.seconds()).bind(&lease.url).bind(ExecutionState::Extracting)
}

fn problem_json(problem: &Problem) -> StoreResult<serde_json::Value> {
    serde_json::to_value(problem).map_err(|e| StoreError::Corrupt(e.to_string()))
}

impl Store {
    /// Creates the execution (delivery 1, publishing atomically when `atomic`) or starts a new
    /// delivery of an existing one (which keeps its `atomic`), owned by `lease.owner`.
    pub(crate) async fn open_execution(
        &self,
        key: &ExecutionKey,
        lease: &Lease,
        atomic: bool,
    ) -> StoreResult<OpenExecution> {
        let mut tx = self.pool.begin().await?;
        // Serialise concurrent opens of the same id on the run row.
        sqlx::query("SELECT 1 FROM runs WHERE run_id = $1 FOR UPDATE").bind(&key.run_id).execute(&mut *tx).await?;
        let existing: Option<ExecutionRecord> =
            sqlx::query_as(&format!("SELECT * FROM executions WHERE {EXECUTION_KEY} FOR UPDATE"))
                .bind_execution(key)
                .fetch_optional(&mut *tx)
                .await?;
        let outcome = match existing {
            None => {
                let record: ExecutionRecord = bind_new_delivery(
                    sqlx::query_as(
                        "INSERT INTO executions (run_id, execution_id, delivery, state, owner, lease_expires_at, owner_url,
                                                 atomic)
                         VALUES ($1, $2, 1, $6, $3, now() + $4 * interval '1 second', $5, $7) RETURNING *",
                    ),
                    key,
                    lease,
                )
                .bind(atomic)
                .fetch_one(&mut *tx)
                .await?;
                sqlx::query("INSERT INTO deliveries (run_id, execution_id, delivery) VALUES ($1, $2, 1)")
                    .bind_execution(key)
                    .execute(&mut *tx)
                    .await?;
                OpenExecution::Created(record)
            }
            Some(current) if matches!(current.state, ExecutionState::Committing | ExecutionState::Staged) => {
                tx.rollback().await?;
                return Ok(OpenExecution::Committing(current));
            }
            Some(current) => {
                sqlx::query(&format!(
                    "UPDATE deliveries SET final_state = COALESCE(final_state, $4)
                     WHERE {DELIVERY_KEY}"
                ))
                .bind_delivery(&current.delivery_ref())
                .bind(DeliveryOutcome::replaced_in(current.state))
                .execute(&mut *tx)
                .await?;
                let sql = format!(
                    "UPDATE executions SET delivery = delivery + 1, state = $6, error = NULL,
                            publishing_at = NULL, paused_at = NULL, staged_at = NULL, finished_at = NULL, updated_at = now(),
                            owner = $3, lease_expires_at = now() + $4 * interval '1 second',
                            owner_url = $5, handed_over = false
                     WHERE {EXECUTION_KEY} RETURNING *"
                );
                let record: ExecutionRecord =
                    bind_new_delivery(sqlx::query_as(&sql), key, lease).fetch_one(&mut *tx).await?;
                sqlx::query("INSERT INTO deliveries (run_id, execution_id, delivery) VALUES ($1, $2, $3)")
                    .bind_delivery(&record.delivery_ref())
                    .execute(&mut *tx)
                    .await?;
                OpenExecution::Redelivered(record)
            }
        };
        tx.commit().await?;
        Ok(outcome)
    }

    pub(crate) async fn get_execution(&self, key: &ExecutionKey) -> StoreResult<Option<ExecutionRecord>> {
        Ok(sqlx::query_as(&format!("SELECT * FROM executions WHERE {EXECUTION_KEY}"))
            .bind_execution(key)
            .fetch_optional(&self.pool)
            .await?)
    }

    pub(crate) async fn list_executions(&self, run_id: &RunId) -> StoreResult<Vec<ExecutionRecord>> {
        Ok(sqlx::query_as("SELECT * FROM executions WHERE run_id = $1 ORDER BY created_at, execution_id")
            .bind(run_id)
            .fetch_all(&self.pool)
            .await?)
    }

    /// Moves the delivery from one of `from` to `to`; `None` when the execution was not in one
    /// of `from` (or another delivery started meanwhile).
    pub(crate) async fn transition_execution(
        &self,
        delivery: &DeliveryRef,
        from: &[ExecutionState],
        to: ExecutionState,
    ) -> StoreResult<Option<ExecutionRecord>> {
        Ok(sqlx::query_as(&format!(
            "UPDATE executions SET state = $5, updated_at = now(),
                    finished_at = CASE WHEN $6 THEN now() END,
                    paused_at = CASE WHEN $5 = 'paused' THEN COALESCE(paused_at, now()) ELSE paused_at END
             WHERE {DELIVERY_KEY} AND state = ANY($4)
             RETURNING *"
        ))
        .bind_delivery(delivery)
        .bind(state_names(from))
        .bind(to)
        .bind(to.is_terminal())
        .fetch_optional(&self.pool)
        .await?)
    }

    /// Aborts the delivery unless it ended or began publishing; `None` otherwise.
    pub(crate) async fn abort_execution(&self, delivery: &DeliveryRef) -> StoreResult<Option<ExecutionRecord>> {
        Ok(sqlx::query_as(&format!(
            "UPDATE executions SET state = $5, updated_at = now(), finished_at = now()
             WHERE {DELIVERY_KEY} AND state = ANY($4)
               AND publishing_at IS NULL
             RETURNING *"
        ))
        .bind_delivery(delivery)
        .bind(state_names(ExecutionState::OPEN))
        .bind(ExecutionState::Aborted)
        .fetch_optional(&self.pool)
        .await?)
    }

    /// The resources another, committed execution of the run published: for them this
    /// execution is a continuing segment (a `full_replace` resource appends); every other
    /// resource is in its first segment (it replaces), including after a failed attempt.
    pub(crate) async fn continuing_resources(&self, key: &ExecutionKey) -> StoreResult<Vec<ResourceName>> {
        Ok(sqlx::query_scalar(
            "SELECT DISTINCT p.resource FROM publications p
             JOIN executions e ON e.run_id = p.run_id AND e.execution_id = p.execution_id
             WHERE p.run_id = $1 AND p.execution_id <> $2 AND p.state = $3 AND e.state = $4",
        )
        .bind_execution(key)
        .bind(PublicationState::Done)
        .bind(ExecutionState::Committed)
        .fetch_all(&self.pool)
        .await?)
    }

    /// Whether another execution of the run already completed its snapshot: it committed
    /// without being paused. Only the first such execution deletes a `delete_missing` run's
    /// missing keys; an unpaused execution opened on the run later only upserts.
    pub(crate) async fn snapshot_completed_elsewhere(&self, key: &ExecutionKey) -> StoreResult<bool> {
        Ok(sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM executions
                            WHERE run_id = $1 AND execution_id <> $2 AND state = $3 AND paused_at IS NULL)",
        )
        .bind_execution(key)
        .bind(ExecutionState::Committed)
        .fetch_one(&self.pool)
        .await?)
    }

    /// Fails the delivery with `problem` unless it already ended.
    pub(crate) async fn fail_execution(
        &self,
        delivery: &DeliveryRef,
        problem: &Problem,
    ) -> StoreResult<Option<ExecutionRecord>> {
        self.fail_open_execution(delivery, problem, "TRUE").await
    }

    /// Fails an open delivery that also meets `extra_condition` (SQL over the execution's row),
    /// recording its end in the run's timeline in the same statement.
    pub(super) async fn fail_open_execution(
        &self,
        delivery: &DeliveryRef,
        problem: &Problem,
        extra_condition: &'static str,
    ) -> StoreResult<Option<ExecutionRecord>> {
        Ok(sqlx::query_as(&format!(
            "WITH failed AS (
                 UPDATE executions SET state = $6, error = $4, updated_at = now(), finished_at = now()
                 WHERE {DELIVERY_KEY} AND state = ANY($5) AND ({extra_condition})
                 RETURNING *
             ), ended AS ({RECORD_FAILED_END})
             SELECT * FROM failed"
        ))
        .bind_delivery(delivery)
        .bind(problem_json(problem)?)
        .bind(state_names(ExecutionState::OPEN))
        .bind(ExecutionState::Failed)
        .fetch_optional(&self.pool)
        .await?)
    }

    /// Marks the delivery committed and, in the same transaction, makes its last checkpoint the
    /// run's durable checkpoint (an execution without checkpoints leaves the previous one). A
    /// delivery failed as orphaned (`gateway_restarted`: its lease lapsed while its owner, alive
    /// but stalled, was publishing) is committed too: its publications did complete.
    pub(crate) async fn mark_committed(&self, delivery: &DeliveryRef) -> StoreResult<Option<ExecutionRecord>> {
        let mut tx = self.pool.begin().await?;
        let committed: Option<ExecutionRecord> = sqlx::query_as(&format!(
            "UPDATE executions SET state = $4, error = NULL, updated_at = now(), finished_at = now()
             WHERE {DELIVERY_KEY}
               AND (state = $5 OR (state = $6 AND publishing_at IS NOT NULL AND error->>'code' = $7))
             RETURNING *"
        ))
        .bind_delivery(delivery)
        .bind(ExecutionState::Committed)
        .bind(ExecutionState::Committing)
        .bind(ExecutionState::Failed)
        .bind(ErrorCode::GatewayRestarted.as_str())
        .fetch_optional(&mut *tx)
        .await?;
        let Some(committed) = committed else {
            tx.rollback().await?;
            return Ok(None);
        };
        sqlx::query(&format!("UPDATE deliveries SET final_state = $4 WHERE {DELIVERY_KEY}"))
            .bind_delivery(delivery)
            .bind(DeliveryOutcome::Committed)
            .execute(&mut *tx)
            .await?;
        sqlx::query(&format!(
            "UPDATE runs SET durable_checkpoint = c.value, durable_checkpoint_execution_id = $2, updated_at = now()
             FROM (SELECT value FROM checkpoints
                   WHERE {DELIVERY_KEY}
                   ORDER BY checkpoint_seq DESC LIMIT 1) c
             WHERE runs.run_id = $1"
        ))
        .bind_delivery(delivery)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(Some(committed))
    }

    /// Records a checkpoint of the delivery; returns its sequence number (0, 1, ...).
    pub(crate) async fn add_checkpoint(
        &self,
        delivery: &DeliveryRef,
        value: &serde_json::value::RawValue,
        flushed_rows: i64,
    ) -> StoreResult<i64> {
        let mut tx = self.pool.begin().await?;
        sqlx::query(&format!("SELECT 1 FROM executions WHERE {EXECUTION_KEY} FOR UPDATE"))
            .bind_execution(&delivery.execution)
            .execute(&mut *tx)
            .await?;
        let seq: i64 = sqlx::query_scalar(&format!(
            "INSERT INTO checkpoints (run_id, execution_id, delivery, checkpoint_seq, value, flushed_rows)
             SELECT $1, $2, $3, COALESCE(MAX(checkpoint_seq) + 1, 0), $4::json, $5
             FROM checkpoints WHERE {DELIVERY_KEY}
             RETURNING checkpoint_seq"
        ))
        .bind_delivery(delivery)
        .bind(value.get())
        .bind(flushed_rows)
        .fetch_one(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(seq)
    }

    /// Received and acknowledged totals per resource of one delivery.
    pub(crate) async fn resource_progress(&self, delivery: &DeliveryRef) -> StoreResult<Vec<ResourceProgress>> {
        Ok(sqlx::query_as(
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
        .bind_delivery(delivery)
        .fetch_all(&self.pool)
        .await?)
    }

    /// Renews the lease of every open execution `lease.owner` serves; returns how many.
    pub(crate) async fn renew_leases(&self, lease: &Lease) -> StoreResult<u64> {
        let renewed = sqlx::query(
            "UPDATE executions SET lease_expires_at = now() + $2 * interval '1 second'
             WHERE owner = $1 AND state = ANY($3)",
        )
        .bind(&lease.owner)
        .bind(lease.seconds())
        .bind(state_names(ExecutionState::LEASED))
        .execute(&self.pool)
        .await?;
        Ok(renewed.rows_affected())
    }

    /// Fails the open executions whose owner stopped renewing its lease (a crashed replica, or
    /// a process from before leases): their uploads were in its memory. With `owner`, fails
    /// that replica's open executions at once instead (it is shutting down).
    pub(crate) async fn fail_orphaned_executions(&self, owner: Option<&str>, problem: &Problem) -> StoreResult<u64> {
        let failed = sqlx::query(&format!(
            "WITH failed AS (
                 UPDATE executions SET state = $4, error = $1, updated_at = now(), finished_at = now()
                 WHERE state = ANY($2)
                   AND (CASE WHEN $3::text IS NULL
                             THEN NOT handed_over AND (lease_expires_at IS NULL OR lease_expires_at < now())
                             ELSE owner = $3 END)
                 RETURNING *
             )
             {RECORD_FAILED_END}"
        ))
        .bind(problem_json(problem)?)
        .bind(state_names(ExecutionState::LEASED))
        .bind(owner)
        .bind(ExecutionState::Failed)
        .execute(&self.pool)
        .await?;
        Ok(failed.rows_affected())
    }

    /// Fails the delivery when its owner stopped renewing its lease (and did not hand it over);
    /// `None` when it is not such an orphan (any more).
    pub(crate) async fn fail_orphaned_delivery(
        &self,
        delivery: &DeliveryRef,
        problem: &Problem,
    ) -> StoreResult<Option<ExecutionRecord>> {
        self.fail_open_execution(
            delivery,
            problem,
            "NOT handed_over AND (lease_expires_at IS NULL OR lease_expires_at < now())",
        )
        .await
    }

    /// The extracting (or paused) executions `owner` serves: what it hands over at shutdown.
    pub(crate) async fn owned_executions(&self, owner: &str) -> StoreResult<Vec<ExecutionRecord>> {
        Ok(sqlx::query_as("SELECT * FROM executions WHERE owner = $1 AND state = ANY($2)")
            .bind(owner)
            .bind(state_names(ExecutionState::BEFORE_COMMIT))
            .fetch_all(&self.pool)
            .await?)
    }

    /// Releases the delivery of `lease.owner` for another replica to adopt (its streams were
    /// drained and recorded first). False when it is no longer this replica's or past commit.
    pub(crate) async fn hand_over_execution(&self, delivery: &DeliveryRef, lease: &Lease) -> StoreResult<bool> {
        let released = sqlx::query(&format!(
            "UPDATE executions SET owner = NULL, owner_url = NULL, lease_expires_at = NULL, handed_over = true,
                    updated_at = now()
             WHERE {DELIVERY_KEY} AND owner = $4 AND state = ANY($5)"
        ))
        .bind_delivery(delivery)
        .bind(&lease.owner)
        .bind(state_names(ExecutionState::BEFORE_COMMIT))
        .execute(&self.pool)
        .await?;
        Ok(released.rows_affected() == 1)
    }

    /// Takes a handed-over execution's delivery for `lease.owner`; `None` when another replica
    /// adopted it first (or it changed meanwhile).
    pub(crate) async fn adopt_execution(
        &self,
        delivery: &DeliveryRef,
        lease: &Lease,
    ) -> StoreResult<Option<ExecutionRecord>> {
        Ok(sqlx::query_as(&format!(
            "UPDATE executions SET owner = $4, owner_url = $5, lease_expires_at = now() + $6 * interval '1 second',
                    handed_over = false, updated_at = now()
             WHERE {DELIVERY_KEY} AND owner IS NULL AND handed_over
               AND state = ANY($7)
             RETURNING *"
        ))
        .bind_delivery(delivery)
        .bind(&lease.owner)
        .bind(&lease.url)
        .bind(lease.seconds())
        .bind(state_names(ExecutionState::BEFORE_COMMIT))
        .fetch_optional(&self.pool)
        .await?)
    }
}
