//! Runs and their declared resources.

use chrono::{DateTime, Utc};
use sqlx::Row as _;

use super::{Store, StoreError, StoreResult};
use crate::model::{Batching, Destination, WriteMode};

/// A run as stored.
#[derive(Debug, Clone)]
pub struct RunRecord {
    pub run_id: String,
    pub destination: Destination,
    pub batching: Batching,
    pub definition_sha256: String,
    pub durable_checkpoint: Option<serde_json::Value>,
    pub durable_checkpoint_execution_id: Option<String>,
    pub created_at: DateTime<Utc>,
}

/// A run to create.
#[derive(Debug, Clone)]
pub struct NewRun {
    pub run_id: String,
    pub destination: Destination,
    pub batching: Batching,
    pub definition_sha256: String,
}

/// A declared resource.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResourceRecord {
    pub resource: String,
    pub table_name: String,
    pub write_mode: WriteMode,
    pub primary_key: Vec<String>,
}

fn run_from_row(row: &sqlx::postgres::PgRow) -> StoreResult<RunRecord> {
    let batching: serde_json::Value = row.try_get("batching")?;
    Ok(RunRecord {
        run_id: row.try_get("run_id")?,
        destination: Destination {
            project: row.try_get("project")?,
            dataset: row.try_get("dataset")?,
            location: row.try_get("location")?,
        },
        batching: serde_json::from_value(batching).map_err(|e| StoreError::Corrupt(e.to_string()))?,
        definition_sha256: row.try_get("definition_sha256")?,
        durable_checkpoint: row.try_get("durable_checkpoint")?,
        durable_checkpoint_execution_id: row.try_get("durable_checkpoint_execution_id")?,
        created_at: row.try_get("created_at")?,
    })
}

fn resource_from_row(row: &sqlx::postgres::PgRow) -> StoreResult<ResourceRecord> {
    Ok(ResourceRecord {
        resource: row.try_get("resource")?,
        table_name: row.try_get("table_name")?,
        write_mode: row.try_get("write_mode")?,
        primary_key: row.try_get("primary_key")?,
    })
}

/// Outcome of declaring a resource.
#[derive(Debug)]
pub enum ResourceUpsert {
    Stored(ResourceRecord),
    /// Batches exist and the declaration would change mode, key or table.
    Conflict(ResourceRecord),
}

impl Store {
    /// Inserts the run, or returns the existing one (`created == false`) for the caller to compare.
    pub async fn create_run(&self, run: &NewRun) -> StoreResult<(RunRecord, bool)> {
        let batching = serde_json::to_value(&run.batching).map_err(|e| StoreError::Corrupt(e.to_string()))?;
        let inserted = sqlx::query(
            "INSERT INTO runs (run_id, project, dataset, location, batching, definition_sha256)
             VALUES ($1, $2, $3, $4, $5, $6)
             ON CONFLICT (run_id) DO NOTHING
             RETURNING *",
        )
        .bind(&run.run_id)
        .bind(&run.destination.project)
        .bind(&run.destination.dataset)
        .bind(run.destination.location())
        .bind(batching)
        .bind(&run.definition_sha256)
        .fetch_optional(&self.pool)
        .await?;
        match inserted {
            Some(row) => Ok((run_from_row(&row)?, true)),
            None => {
                let existing = self.get_run(&run.run_id).await?;
                existing.map(|r| (r, false)).ok_or_else(|| StoreError::Corrupt("run vanished".into()))
            }
        }
    }

    pub async fn get_run(&self, run_id: &str) -> StoreResult<Option<RunRecord>> {
        let row = sqlx::query("SELECT * FROM runs WHERE run_id = $1").bind(run_id).fetch_optional(&self.pool).await?;
        row.as_ref().map(run_from_row).transpose()
    }

    pub async fn list_resources(&self, run_id: &str) -> StoreResult<Vec<ResourceRecord>> {
        let rows = sqlx::query("SELECT * FROM resources WHERE run_id = $1 ORDER BY resource")
            .bind(run_id)
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(resource_from_row).collect()
    }

    pub async fn get_resource(&self, run_id: &str, resource: &str) -> StoreResult<Option<ResourceRecord>> {
        let row = sqlx::query("SELECT * FROM resources WHERE run_id = $1 AND resource = $2")
            .bind(run_id)
            .bind(resource)
            .fetch_optional(&self.pool)
            .await?;
        row.as_ref().map(resource_from_row).transpose()
    }

    /// Declares or re-declares a resource. Re-declaring with another mode, key or table is
    /// allowed until the resource has batches; then it is a conflict and nothing changes.
    pub async fn upsert_resource(&self, run_id: &str, declared: &ResourceRecord) -> StoreResult<ResourceUpsert> {
        let mut tx = self.pool.begin().await?;
        let existing = sqlx::query("SELECT * FROM resources WHERE run_id = $1 AND resource = $2 FOR UPDATE")
            .bind(run_id)
            .bind(&declared.resource)
            .fetch_optional(&mut *tx)
            .await?;
        if let Some(row) = existing {
            let current = resource_from_row(&row)?;
            if current == *declared {
                tx.commit().await?;
                return Ok(ResourceUpsert::Stored(current));
            }
            let has_batches: bool =
                sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM batches WHERE run_id = $1 AND resource = $2)")
                    .bind(run_id)
                    .bind(&declared.resource)
                    .fetch_one(&mut *tx)
                    .await?;
            if has_batches {
                tx.rollback().await?;
                return Ok(ResourceUpsert::Conflict(current));
            }
        }
        let row = sqlx::query(
            "INSERT INTO resources (run_id, resource, table_name, write_mode, primary_key)
             VALUES ($1, $2, $3, $4, $5)
             ON CONFLICT (run_id, resource) DO UPDATE
               SET table_name = EXCLUDED.table_name, write_mode = EXCLUDED.write_mode,
                   primary_key = EXCLUDED.primary_key, updated_at = now()
             RETURNING *",
        )
        .bind(run_id)
        .bind(&declared.resource)
        .bind(&declared.table_name)
        .bind(declared.write_mode)
        .bind(&declared.primary_key)
        .fetch_one(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(ResourceUpsert::Stored(resource_from_row(&row)?))
    }
}
