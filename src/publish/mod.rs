//! Commit and publication: after the lanes drain, finalize each PENDING stream (checking its
//! row count), commit it to its staging table, then publish each destination with one query job
//! (deterministic job id, fingerprint persisted first), delete the staging tables and mark the
//! execution committed, which makes its last checkpoint the run's durable checkpoint.
//!
//! Publication starts only once the delivery is marked publishing (so an abort before it
//! changes nothing and an abort after it is refused), and follows [`plan`]: resources sharing a
//! destination table publish in declaration order ([`destination`]), tables concurrently.
//!
//! Pure pieces: [`sql`] (statements per write mode), [`job_id`], [`fingerprint`], [`plan`], and
//! [`reconcile`] (what a redelivered publication does).

pub(crate) mod destination;
pub(crate) mod fingerprint;
pub(crate) mod job_id;
mod lifecycle;
mod plan;
pub(crate) mod reconcile;
pub(crate) mod sql;

use std::time::{Duration, Instant};

use futures::StreamExt as _;

use crate::bigquery::error::Stage;
use crate::bigquery::write::CommitOutcome;
use crate::bigquery::{BigQuery, BigQueryError, table_path};
use crate::error::{ErrorCode, Problem};
use crate::model::{DeliveryRef, ExecutionState, ResourceName};
use crate::pipeline::{LaneReport, Pipeline};
use crate::store::{EventKind, ExecutionRecord, RunRecord, Store};
use crate::telemetry::{self, PhaseTiming};
use destination::{PublishOutcome, Published};
pub(crate) use lifecycle::{AbortOutcome, CommitStart, Committing};

/// How a commit that did not fail ended.
enum CommitEnd {
    /// Every destination was published.
    Published,
    /// An abort was recorded before publishing began: no destination changed.
    AbortedBeforePublishing,
}

/// Runs commits. Cheap to clone.
#[derive(Debug, Clone)]
pub(crate) struct Publisher {
    pub(crate) store: Store,
    pub(crate) bigquery: BigQuery,
    pub(crate) pipeline: Pipeline,
    pub(crate) query_job_timeout: Duration,
    /// Destinations finalized, committed and published at once per commit: the most
    /// (`FILAMENT_MAX_CONCURRENT_PUBLICATIONS`). BigQuery runs at most two DML statements per
    /// table at a time; these are different tables.
    pub(crate) max_concurrent_publications: usize,
    /// Publication jobs running at once, gateway-wide: the adaptive limit within
    /// `max_concurrent_publications` ([`crate::bigquery::adaptive`]).
    pub(crate) publications: crate::bigquery::adaptive::AdaptiveConcurrency,
    /// How long BigQuery's pushback on a publication is waited out (`FILAMENT_QUOTA_WAIT_SECS`).
    pub(crate) quota_wait: Duration,
}

impl Publisher {
    /// Commits one delivery [`Self::begin_commit`] moved to `committing`. Any failure fails the
    /// execution with its problem; the terminal record is returned either way.
    pub(crate) async fn commit(&self, committing: Committing) -> Result<ExecutionRecord, Problem> {
        let Committing { run, execution } = committing;
        let run = &run;
        let delivery = execution.delivery_ref();
        let result = self.commit_inner(run, &delivery, execution.completes_snapshot()).await;
        self.pipeline.forget(&delivery.execution, delivery.delivery);
        // A failure records its end with the state (`Store::fail_execution`), an abort before
        // publishing with the abort: only a publication ends here.
        let ends_here = matches!(result, Ok(CommitEnd::Published));
        let record = match result {
            Ok(CommitEnd::Published) => self.store.mark_committed(&delivery).await?,
            // The abort's own record stands: it changed nothing.
            Ok(CommitEnd::AbortedBeforePublishing) => None,
            Err(problem) => {
                tracing::warn!(run_id = %run.run_id, execution_id = %execution.execution_id, code = %problem.code,
                    detail = %problem.detail, cause = problem.cause.as_deref(), "commit failed");
                self.store.fail_execution(&delivery, &problem).await?
            }
        };
        let record = match record {
            Some(record) => record,
            // Aborted or failed by an upload lane meanwhile: report what is stored.
            None => self
                .store
                .get_execution(&delivery.execution)
                .await?
                .ok_or_else(|| Problem::not_found(&delivery.execution))?,
        };
        metrics::counter!(telemetry::EXECUTIONS_FINISHED, "state" => record.state.as_str()).increment(1);
        if ends_here && record.state == ExecutionState::Committed {
            let ended = serde_json::json!({"state": record.state});
            self.store.record_event(&delivery, EventKind::Ended, None, ended).await;
        }
        Ok(record)
    }

    async fn commit_inner(
        &self,
        run: &RunRecord,
        delivery: &DeliveryRef,
        completes_snapshot: bool,
    ) -> Result<CommitEnd, Problem> {
        let mut reports = self.pipeline.drain(&delivery.execution, delivery.delivery).await?;
        // Streams a replica handed over at shutdown whose resource got no batch here since.
        for stream in self.store.handed_over_streams(delivery).await? {
            if !reports.iter().any(|report| report.resource == stream.resource) {
                reports.push(stream.into());
            }
        }
        // A lane may have failed the execution after draining started.
        if let Some(current) = self.store.get_execution(&delivery.execution).await?
            && current.state != ExecutionState::Committing
        {
            return Err(current.error.unwrap_or_else(|| {
                Problem::new(
                    ErrorCode::ExecutionNotExtracting,
                    format!("execution is {} instead of committing", current.state),
                )
            }));
        }
        // Every stream lands in its staging table before any destination changes: a failure
        // up to here leaves every destination as it was.
        // (Futures collected first: a borrowing closure inside the stream type would make the
        // spawned commit future not general enough over lifetimes.)
        let commits: Vec<_> = reports.iter().map(|report| self.commit_stream(run, delivery, report)).collect();
        let committed: Vec<Result<(), Problem>> =
            futures::stream::iter(commits).buffer_unordered(self.max_concurrent_publications).collect().await;
        committed.into_iter().collect::<Result<Vec<()>, Problem>>()?;

        // The point of no return: from here destinations change, so an abort is refused. An
        // abort that came first wins, and nothing is published.
        if !self.store.begin_publishing(delivery).await? {
            for report in &reports {
                self.delete_staging_table(run, &report.staging_table).await;
            }
            return Ok(CommitEnd::AbortedBeforePublishing);
        }
        let declared = self.store.list_resources_by_declaration(&run.run_id).await?;
        let continuing = self.store.continuing_resources(&delivery.execution).await?;
        let completes_snapshot =
            completes_snapshot && !self.store.snapshot_completed_elsewhere(&delivery.execution).await?;
        let destinations = plan::plan(&declared, &reports, &continuing, completes_snapshot)?;
        let publications: Vec<_> =
            destinations.into_iter().map(|destination| self.publish_destination(run, delivery, destination)).collect();
        let published: Vec<Vec<Published>> =
            futures::stream::iter(publications).buffer_unordered(self.max_concurrent_publications).collect().await;
        self.outcome(run, published.into_iter().flatten()).await?;
        Ok(CommitEnd::Published)
    }

    /// Deletes the staging tables no job will read again and names every failed destination
    /// (the first failure's code, each failure in the detail).
    async fn outcome(&self, run: &RunRecord, published: impl Iterator<Item = Published>) -> Result<(), Problem> {
        let mut failures: Vec<(ResourceName, Problem)> = Vec::new();
        for Published { resource, staging_table, outcome } in published {
            let problem = match outcome {
                Ok(PublishOutcome::Published) => None,
                // A job we stopped waiting for may still read its staging table: it expires.
                Ok(PublishOutcome::Unfinished(problem)) => {
                    failures.push((resource, problem));
                    continue;
                }
                Err(problem) => Some(problem),
            };
            if let Some(table) = &staging_table {
                self.delete_staging_table(run, table).await;
            }
            if let Some(problem) = problem {
                failures.push((resource, problem));
            }
        }
        match failures.first() {
            None => Ok(()),
            Some((_, first)) => {
                let detail: Vec<String> = failures.iter().map(|(r, p)| format!("resource {r}: {}", p.detail)).collect();
                Err(Problem { detail: detail.join("; "), ..first.clone() })
            }
        }
    }

    /// Deletes the staging tables of an aborted delivery (best effort: they expire anyway).
    pub(crate) async fn discard_staging(&self, run: &RunRecord, delivery: &DeliveryRef) {
        let streams = match self.store.list_staging_streams(delivery).await {
            Ok(streams) => streams,
            Err(e) => {
                tracing::warn!(run_id = %run.run_id, execution_id = %delivery.execution_id(), error = %e,
                    "could not list staging tables to discard");
                return;
            }
        };
        for stream in streams {
            self.delete_staging_table(run, &stream.staging_table).await;
        }
    }

    /// Deletes a staging table no job will read again. It expires on its own anyway, so a
    /// failure is logged, not raised.
    async fn delete_staging_table(&self, run: &RunRecord, table: &str) {
        if let Err(e) = self.bigquery.delete_table(&run.destination.project, &run.destination.dataset, table).await {
            tracing::warn!(%table, error = %e, "could not delete a staging table");
        }
    }

    /// Finalize (row count must match what was appended), then commit the stream. A commit whose
    /// answer was lost is resolved by asking BigQuery whether the stream shows a commit time.
    async fn commit_stream(&self, run: &RunRecord, delivery: &DeliveryRef, report: &LaneReport) -> Result<(), Problem> {
        let writer = self.bigquery.writer();
        let upload_failed = |e: BigQueryError| e.problem(Stage::Upload);
        let timing =
            |phase, started: Instant| PhaseTiming { resource: &report.resource, phase, duration: started.elapsed() };
        let started = Instant::now();
        let row_count = writer.finalize(&report.stream_name).await.map_err(upload_failed)?;
        timing("finalize", started).emit();
        if row_count != report.rows_acknowledged {
            return Err(Problem::new(
                ErrorCode::RowCountMismatch,
                format!(
                    "resource {}: the stream holds {row_count} rows but the gateway appended {}",
                    report.resource, report.rows_acknowledged
                ),
            ));
        }
        let resource = delivery.resource(report.resource.clone());
        self.store.set_stream_finalized(&resource, row_count).await?;
        let path = table_path(&run.destination.project, &run.destination.dataset, &report.staging_table);
        let started = Instant::now();
        let committed = writer.batch_commit(&path, vec![report.stream_name.clone()]).await;
        timing("commit", started).emit();
        match committed {
            Ok(CommitOutcome::Committed) => {}
            Ok(CommitOutcome::Rejected(errors)) => {
                return Err(Problem::new(
                    ErrorCode::UploadFailed,
                    format!(
                        "resource {}: BigQuery refused to commit the stream: {}",
                        report.resource,
                        errors.join("; ")
                    ),
                ));
            }
            Err(e) if e.is_retryable() => {
                if !writer.is_committed(&report.stream_name).await.map_err(upload_failed)? {
                    return Err(upload_failed(e));
                }
            }
            Err(e) => return Err(upload_failed(e)),
        }
        self.store.set_stream_committed(&resource).await?;
        let committed = serde_json::json!({"rows": row_count, "stream": report.stream_name});
        self.store.record_event(delivery, EventKind::StreamCommitted, Some(&report.resource), committed).await;
        Ok(())
    }
}
