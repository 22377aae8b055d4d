//! Publication records: one query job per execution and destination table.

use super::events::{RECORD_EVENT, bind_event};
use super::{BindKey as _, EXECUTION_KEY, Event, Store, StoreError, StoreResult};
use crate::error::Problem;
use crate::model::{DeliveryRef, ExecutionKey, JobCost, PublicationState, ResourceName};

#[derive(Debug, Clone, sqlx::FromRow)]
pub(crate) struct PublicationRecord {
    pub(crate) resource: ResourceName,
    /// `dataset.table`.
    pub(crate) destination: String,
    pub(crate) job_id: String,
    pub(crate) fingerprint: String,
    pub(crate) state: PublicationState,
    pub(crate) rows_affected: Option<i64>,
    #[sqlx(json(nullable))]
    pub(crate) error: Option<Problem>,
    #[sqlx(flatten)]
    pub(crate) cost: JobCost,
    /// A direct append's publication: the streams it commits into the destination (recorded
    /// before the commit), instead of a query job.
    pub(crate) committed_streams: Option<Vec<String>>,
}

/// How a publication's job ended.
#[derive(Debug, Clone, Copy)]
pub(crate) enum PublicationEnd<'a> {
    /// The job ran; `rows_affected` as BigQuery reports it (DML statistics), and what it
    /// cost.
    Done { rows_affected: Option<i64>, cost: &'a JobCost },
    /// The job failed for good, with the problem it is reported as.
    Failed(&'a Problem),
}

/// A publication about to be submitted.
#[derive(Debug, Clone)]
pub(crate) struct NewPublication<'a> {
    /// The delivery that publishes.
    pub(crate) delivery: &'a DeliveryRef,
    pub(crate) resource: &'a ResourceName,
    /// `dataset.table`.
    pub(crate) destination: &'a str,
    pub(crate) job_id: &'a str,
    pub(crate) fingerprint: &'a str,
    /// A direct append's publication: the streams it is about to commit.
    pub(crate) committed_streams: Option<&'a [String]>,
    /// A query job's: the SHA-256 (hex) of the statement about to be submitted under
    /// `job_id`, added to those recorded under the same id before.
    pub(crate) statement_sha256: Option<&'a str>,
}

impl Store {
    pub(crate) async fn list_publications(&self, execution: &ExecutionKey) -> StoreResult<Vec<PublicationRecord>> {
        Ok(sqlx::query_as(&format!("SELECT * FROM publications WHERE {EXECUTION_KEY} ORDER BY resource"))
            .bind_execution(execution)
            .fetch_all(&self.pool)
            .await?)
    }

    /// Persists the job id, the fingerprint and the statement's digest before the job is
    /// submitted, with the `publication_started` event: one transaction. Returns the digests of
    /// every statement recorded under this job id: this one, and those an earlier delivery
    /// recorded under it when it re-attaches (another job id starts the list again).
    pub(crate) async fn begin_publication(&self, publication: &NewPublication<'_>) -> StoreResult<Vec<String>> {
        let mut tx = self.pool.begin().await?;
        let (recorded,): (Option<Vec<String>>,) = sqlx::query_as(
            "INSERT INTO publications (run_id, execution_id, resource, delivery, destination, job_id, fingerprint, state,
                                       committed_streams, statement_sha256)
             VALUES ($1, $2, $4, $3, $5, $6, $7, $8, $9, $10)
             ON CONFLICT (run_id, execution_id, resource) DO UPDATE
               SET delivery = EXCLUDED.delivery, destination = EXCLUDED.destination, job_id = EXCLUDED.job_id,
                   fingerprint = EXCLUDED.fingerprint, state = EXCLUDED.state, rows_affected = NULL, error = NULL,
                   committed_streams = EXCLUDED.committed_streams, updated_at = now(),
                   statement_sha256 = CASE WHEN publications.job_id = EXCLUDED.job_id
                       THEN ARRAY(SELECT DISTINCT digest
                                  FROM unnest(coalesce(publications.statement_sha256, '{}')
                                              || coalesce(EXCLUDED.statement_sha256, '{}')) AS digest)
                       ELSE EXCLUDED.statement_sha256 END
             RETURNING statement_sha256",
        )
        .bind_delivery(publication.delivery)
        .bind(publication.resource)
        .bind(publication.destination)
        .bind(publication.job_id)
        .bind(publication.fingerprint)
        .bind(PublicationState::Running)
        .bind(publication.committed_streams)
        .bind(publication.statement_sha256.map(|digest| vec![digest.to_string()]))
        .fetch_one(&mut *tx)
        .await?;
        let started = Event::PublicationStarted { job_id: publication.job_id };
        let (detail, resource): (_, &str) = (started.detail(), publication.resource);
        bind_event(RECORD_EVENT, publication.delivery, started.kind(), Some(resource), &detail)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(recorded.unwrap_or_default())
    }

    /// Records how the publication's job ended and, when it ran, what it cost and did, with
    /// its `ended` event on the delivery's timeline: one transaction.
    pub(crate) async fn finish_publication(
        &self,
        delivery: &DeliveryRef,
        resource: &ResourceName,
        end: PublicationEnd<'_>,
        ended: Option<Event<'_>>,
    ) -> StoreResult<()> {
        let execution = &delivery.execution;
        let mut tx = self.pool.begin().await?;
        match end {
            PublicationEnd::Done { rows_affected, cost } => {
                sqlx::query(&format!(
                    "UPDATE publications SET state = $4, rows_affected = $5, error = NULL, updated_at = now(),
                        bytes_processed = $6, bytes_billed = $7, slot_ms = $8,
                        rows_inserted = $9, rows_updated = $10, rows_deleted = $11
                 WHERE {EXECUTION_KEY} AND resource = $3"
                ))
                .bind_execution(execution)
                .bind(resource)
                .bind(PublicationState::Done)
                .bind(rows_affected)
                .bind(cost.bytes_processed)
                .bind(cost.bytes_billed)
                .bind(cost.slot_ms)
                .bind(cost.rows_inserted)
                .bind(cost.rows_updated)
                .bind(cost.rows_deleted)
                .execute(&mut *tx)
                .await?
            }
            PublicationEnd::Failed(problem) => {
                let error = serde_json::to_value(problem).map_err(|e| StoreError::Corrupt(e.to_string()))?;
                sqlx::query(&format!(
                    "UPDATE publications SET state = $4, rows_affected = NULL, error = $5, updated_at = now()
                     WHERE {EXECUTION_KEY} AND resource = $3"
                ))
                .bind_execution(execution)
                .bind(resource)
                .bind(PublicationState::Failed)
                .bind(error)
                .execute(&mut *tx)
                .await?
            }
        };
        if let Some(event) = ended {
            let (detail, resource_name): (_, &str) = (event.detail(), resource);
            bind_event(RECORD_EVENT, delivery, event.kind(), Some(resource_name), &detail).execute(&mut *tx).await?;
        }
        tx.commit().await?;
        Ok(())
    }
}
