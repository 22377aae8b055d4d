//! Publication records: one query job per execution and destination table.

use sqlx::Row as _;

use super::{Store, StoreError, StoreResult};
use crate::error::Problem;
use crate::model::PublicationState;

#[derive(Debug, Clone)]
pub struct PublicationRecord {
    pub resource: String,
    pub delivery: i32,
    pub destination: String,
    pub job_id: String,
    pub fingerprint: String,
    pub state: PublicationState,
    pub rows_affected: Option<i64>,
    pub error: Option<Problem>,
}

/// A publication about to be submitted.
#[derive(Debug, Clone)]
pub struct NewPublication<'a> {
    pub run_id: &'a str,
    pub execution_id: &'a str,
    pub resource: &'a str,
    pub delivery: i32,
    /// `dataset.table`.
    pub destination: &'a str,
    pub job_id: &'a str,
    pub fingerprint: &'a str,
}

fn publication_from_row(row: &sqlx::postgres::PgRow) -> StoreResult<PublicationRecord> {
    let error: Option<serde_json::Value> = row.try_get("error")?;
    Ok(PublicationRecord {
        resource: row.try_get("resource")?,
        delivery: row.try_get("delivery")?,
        destination: row.try_get("destination")?,
        job_id: row.try_get("job_id")?,
        fingerprint: row.try_get("fingerprint")?,
        state: row.try_get("state")?,
        rows_affected: row.try_get("rows_affected")?,
        error: error.map(serde_json::from_value).transpose().map_err(|e| StoreError::Corrupt(e.to_string()))?,
    })
}

impl Store {
    pub async fn list_publications(&self, run_id: &str, execution_id: &str) -> StoreResult<Vec<PublicationRecord>> {
        let rows = sqlx::query("SELECT * FROM publications WHERE run_id = $1 AND execution_id = $2 ORDER BY resource")
            .bind(run_id)
            .bind(execution_id)
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(publication_from_row).collect()
    }

    pub async fn get_publication(
        &self,
        run_id: &str,
        execution_id: &str,
        resource: &str,
    ) -> StoreResult<Option<PublicationRecord>> {
        let row = sqlx::query("SELECT * FROM publications WHERE run_id = $1 AND execution_id = $2 AND resource = $3")
            .bind(run_id)
            .bind(execution_id)
            .bind(resource)
            .fetch_optional(&self.pool)
            .await?;
        row.as_ref().map(publication_from_row).transpose()
    }

    /// Whether another execution of the run already published `resource` (a `full_replace`
    /// resource is replaced by the run's first publication and appended to by later segments).
    pub async fn published_by_another_execution(
        &self,
        run_id: &str,
        execution_id: &str,
        resource: &str,
    ) -> StoreResult<bool> {
        let published: bool = sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM publications
                 WHERE run_id = $1 AND resource = $2 AND execution_id <> $3 AND state = 'done')",
        )
        .bind(run_id)
        .bind(resource)
        .bind(execution_id)
        .fetch_one(&self.pool)
        .await?;
        Ok(published)
    }

    /// Persists the job id and fingerprint before the job is submitted.
    pub async fn begin_publication(&self, publication: &NewPublication<'_>) -> StoreResult<()> {
        sqlx::query(
            "INSERT INTO publications (run_id, execution_id, resource, delivery, destination, job_id, fingerprint, state)
             VALUES ($1, $2, $3, $4, $5, $6, $7, 'running')
             ON CONFLICT (run_id, execution_id, resource) DO UPDATE
               SET delivery = EXCLUDED.delivery, destination = EXCLUDED.destination, job_id = EXCLUDED.job_id,
                   fingerprint = EXCLUDED.fingerprint, state = 'running', rows_affected = NULL, error = NULL,
                   updated_at = now()",
        )
        .bind(publication.run_id)
        .bind(publication.execution_id)
        .bind(publication.resource)
        .bind(publication.delivery)
        .bind(publication.destination)
        .bind(publication.job_id)
        .bind(publication.fingerprint)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    pub async fn finish_publication(
        &self,
        run_id: &str,
        execution_id: &str,
        resource: &str,
        state: PublicationState,
        rows_affected: Option<i64>,
        error: Option<&Problem>,
    ) -> StoreResult<()> {
        let error = error.map(serde_json::to_value).transpose().map_err(|e| StoreError::Corrupt(e.to_string()))?;
        sqlx::query(
            "UPDATE publications SET state = $4, rows_affected = $5, error = $6, updated_at = now()
             WHERE run_id = $1 AND execution_id = $2 AND resource = $3",
        )
        .bind(run_id)
        .bind(execution_id)
        .bind(resource)
        .bind(state)
        .bind(rows_affected)
        .bind(error)
        .execute(&self.pool)
        .await?;
        Ok(())
    }
}
