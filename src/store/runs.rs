//! Runs and their declared resources.

use chrono::{DateTime, Utc};
use sqlx::{FromRow as _, Row as _};

use super::executions::ExecutionRecord;
use super::{BindKey as _, Store, StoreError, StoreResult, state_names};
use crate::model::table_layout::LayoutDifference;
use crate::model::table_options::TableOptions;
use crate::model::write_options::WriteOptions;
use crate::model::{Batching, Destination, ExecutionKey, ExecutionState, ResourceName, ResourceRef, RunId, WriteMode};

/// A run as stored.
#[derive(Debug, Clone, sqlx::FromRow)]
pub(crate) struct RunRecord {
    pub(crate) run_id: RunId,
    #[sqlx(flatten)]
    pub(crate) destination: Destination,
    #[sqlx(json)]
    pub(crate) batching: Batching,
    /// Project the publication jobs run in; `None`: the destination's.
    pub(crate) job_project: Option<String>,
    pub(crate) maximum_bytes_billed: Option<i64>,
    /// Most bytes every publication of one execution may process together, judged on the plan.
    pub(crate) maximum_bytes_billed_per_execution: Option<i64>,
    /// Every execution publishes all its destinations in one multi-statement transaction
    /// (`publish::atomic`), unless it opens with `atomic: false`.
    pub(crate) atomic: bool,
    pub(crate) definition_sha256: String,
    /// The principal that created the run (`principals`); it alone sees it, with `read_all`
    /// principals.
    pub(crate) principal: String,
    /// As the extractor sent it (a `json` column: verbatim text).
    #[sqlx(json(nullable))]
    pub(crate) durable_checkpoint: Option<Box<serde_json::value::RawValue>>,
    pub(crate) durable_checkpoint_execution_id: Option<String>,
    pub(crate) created_at: DateTime<Utc>,
}

/// A run to create.
#[derive(Debug, Clone)]
pub(crate) struct NewRun {
    pub(crate) run_id: RunId,
    pub(crate) destination: Destination,
    pub(crate) batching: Batching,
    pub(crate) job_project: Option<String>,
    pub(crate) maximum_bytes_billed: Option<i64>,
    pub(crate) maximum_bytes_billed_per_execution: Option<i64>,
    pub(crate) atomic: bool,
    pub(crate) definition_sha256: String,
    pub(crate) principal: String,
}

/// The `resources` columns a [`ResourceRecord`] reads, from the table as `d`: none shares a
/// name with a column of `executions`, so both records read from one joined row.
const DECLARED_RESOURCE_COLUMNS: &str =
    "d.resource, d.table_name, d.write_mode, d.primary_key, d.table_options, d.write_options, d.layout_mismatch";

/// A declared resource.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub(crate) struct ResourceRecord {
    pub(crate) resource: ResourceName,
    pub(crate) table_name: String,
    pub(crate) write_mode: WriteMode,
    pub(crate) primary_key: Vec<String>,
    #[sqlx(json(nullable))]
    pub(crate) table_options: Option<TableOptions>,
    #[sqlx(json)]
    pub(crate) write_options: WriteOptions,
    /// How the existing destination table's layout differs from `table_options` (last set-up);
    /// not part of the declaration.
    #[sqlx(json(nullable))]
    pub(crate) layout_mismatch: Option<Vec<LayoutDifference>>,
}

impl ResourceRecord {
    /// Whether `other` declares the same thing (mode, key, table, table and write options).
    pub(crate) fn same_declaration(&self, other: &ResourceRecord) -> bool {
        self.resource == other.resource
            && self.table_name == other.table_name
            && self.write_mode == other.write_mode
            && self.primary_key == other.primary_key
            && self.table_options == other.table_options
            && self.write_options == other.write_options
    }
}

/// Outcome of declaring a resource.
#[derive(Debug)]
pub(crate) enum ResourceUpsert {
    Stored(ResourceRecord),
    /// Batches exist and the declaration would change mode, key or table.
    Conflict(ResourceRecord),
}

impl Store {
    /// Inserts the run, or returns the existing one (`created == false`) for the caller to compare.
    pub(crate) async fn create_run(&self, run: &NewRun) -> StoreResult<(RunRecord, bool)> {
        let batching = serde_json::to_value(&run.batching).map_err(|e| StoreError::Corrupt(e.to_string()))?;
        let inserted = sqlx::query_as::<_, RunRecord>(
            "INSERT INTO runs (run_id, project, dataset, location, batching, definition_sha256, job_project, maximum_bytes_billed, principal,
                               maximum_bytes_billed_per_execution, atomic)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)
             ON CONFLICT (run_id) DO NOTHING
             RETURNING *",
        )
        .bind(&run.run_id)
        .bind(&run.destination.project)
        .bind(&run.destination.dataset)
        .bind(run.destination.location())
        .bind(batching)
        .bind(&run.definition_sha256)
        .bind(&run.job_project)
        .bind(run.maximum_bytes_billed)
        .bind(&run.principal)
        .bind(run.maximum_bytes_billed_per_execution)
        .bind(run.atomic)
        .fetch_optional(&self.pool)
        .await?;
        match inserted {
            Some(run) => Ok((run, true)),
            None => {
                let existing = self.get_run(&run.run_id).await?;
                existing.map(|r| (r, false)).ok_or_else(|| StoreError::Corrupt("run vanished".into()))
            }
        }
    }

    /// Whether an execution of the run that publishes atomically has not ended: the run's
    /// declarations must then fit one transaction.
    pub(crate) async fn has_open_atomic_execution(&self, run_id: &RunId) -> StoreResult<bool> {
        Ok(sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM executions WHERE run_id = $1 AND atomic AND state = ANY($2))",
        )
        .bind(run_id)
        .bind(state_names(ExecutionState::OPEN))
        .fetch_one(&self.pool)
        .await?)
    }

    pub(crate) async fn get_run(&self, run_id: &RunId) -> StoreResult<Option<RunRecord>> {
        Ok(sqlx::query_as("SELECT * FROM runs WHERE run_id = $1").bind(run_id).fetch_optional(&self.pool).await?)
    }

    /// The run's resources, by name.
    pub(crate) async fn list_resources(&self, run_id: &RunId) -> StoreResult<Vec<ResourceRecord>> {
        Ok(sqlx::query_as("SELECT * FROM resources WHERE run_id = $1 ORDER BY resource")
            .bind(run_id)
            .fetch_all(&self.pool)
            .await?)
    }

    /// The run's resources in the order they were first declared.
    pub(crate) async fn list_resources_by_declaration(&self, run_id: &RunId) -> StoreResult<Vec<ResourceRecord>> {
        Ok(sqlx::query_as("SELECT * FROM resources WHERE run_id = $1 ORDER BY created_at, resource")
            .bind(run_id)
            .fetch_all(&self.pool)
            .await?)
    }

    /// The execution and, when its run declared it, `resource`, read in one statement (a batch
    /// request needs both); `None` when there is no such execution.
    pub(crate) async fn get_execution_and_resource(
        &self,
        key: &ExecutionKey,
        resource: &ResourceName,
    ) -> StoreResult<Option<(ExecutionRecord, Option<ResourceRecord>)>> {
        let row = sqlx::query(&format!(
            "SELECT e.*, {DECLARED_RESOURCE_COLUMNS} FROM executions e
             LEFT JOIN resources d ON d.run_id = e.run_id AND d.resource = $3
             WHERE e.run_id = $1 AND e.execution_id = $2"
        ))
        .bind_execution(key)
        .bind(resource)
        .fetch_optional(&self.pool)
        .await?;
        let Some(row) = row else { return Ok(None) };
        let execution = ExecutionRecord::from_row(&row)?;
        let declared = match row.try_get::<Option<ResourceName>, _>("resource")? {
            Some(_) => Some(ResourceRecord::from_row(&row)?),
            None => None,
        };
        Ok(Some((execution, declared)))
    }

    /// Records how the existing destination table's layout differs from the declaration
    /// (`[]`: it does not, or nothing was declared to compare).
    pub(crate) async fn set_layout_mismatch(
        &self,
        resource: &ResourceRef,
        differences: &[LayoutDifference],
    ) -> StoreResult<()> {
        let mismatch = (!differences.is_empty()).then_some(sqlx::types::Json(differences));
        sqlx::query("UPDATE resources SET layout_mismatch = $3 WHERE run_id = $1 AND resource = $2")
            .bind(resource.delivery.run_id())
            .bind(&resource.resource)
            .bind(mismatch)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// Declares or re-declares a resource. Re-declaring with another mode, key, table or table
    /// options is allowed until the resource has batches; then it is a conflict and nothing
    /// changes.
    pub(crate) async fn upsert_resource(
        &self,
        run_id: &RunId,
        declared: &ResourceRecord,
    ) -> StoreResult<ResourceUpsert> {
        let mut tx = self.pool.begin().await?;
        let existing: Option<ResourceRecord> =
            sqlx::query_as("SELECT * FROM resources WHERE run_id = $1 AND resource = $2 FOR UPDATE")
                .bind(run_id)
                .bind(&declared.resource)
                .fetch_optional(&mut *tx)
                .await?;
        if let Some(current) = existing {
            if current.same_declaration(declared) {
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
        let stored: ResourceRecord = sqlx::query_as(
            "INSERT INTO resources (run_id, resource, table_name, write_mode, primary_key, table_options, write_options)
             VALUES ($1, $2, $3, $4, $5, $6, $7)
             ON CONFLICT (run_id, resource) DO UPDATE
               SET table_name = EXCLUDED.table_name, write_mode = EXCLUDED.write_mode,
                   primary_key = EXCLUDED.primary_key, table_options = EXCLUDED.table_options,
                   write_options = EXCLUDED.write_options,
                   layout_mismatch = NULL, updated_at = now()
             RETURNING *",
        )
        .bind(run_id)
        .bind(&declared.resource)
        .bind(&declared.table_name)
        .bind(declared.write_mode)
        .bind(&declared.primary_key)
        .bind(declared.table_options.as_ref().map(sqlx::types::Json))
        .bind(sqlx::types::Json(&declared.write_options))
        .fetch_one(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(ResourceUpsert::Stored(stored))
    }
}
