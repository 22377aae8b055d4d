//! Commit and publication: after the lanes drain (every row uploaded, so an upload failure
//! still changes no destination), finalize each PENDING stream (checking its row count),
//! commit it to its staging table, and publish its destination with one query job
//! (deterministic job id, fingerprint persisted first), delete the staging tables and mark the
//! execution committed, which makes its last checkpoint the run's durable checkpoint.
//!
//! Publication starts only once the delivery is marked publishing (so an abort before it
//! changes nothing and an abort after it is refused), and follows [`plan`]: resources sharing a
//! destination table publish in declaration order ([`destination`]), tables concurrently, each
//! as soon as its own streams are committed ([`pipelined`]).
//!
//! Pure pieces: [`sql`] (statements per write mode), [`job_id`], [`fingerprint`], [`plan`], and
//! [`reconcile`] (what a redelivered publication does).

pub(crate) mod destination;
pub(crate) mod fingerprint;
pub(crate) mod job_id;
mod lifecycle;
mod pipelined;
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
use crate::store::{EventKind, ExecutionRecord, RunRecord, Store, StreamChange};
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
        let lanes = self.pipeline.drain_each(&delivery.execution, delivery.delivery);
        let handed_over = self.store.handed_over_streams(delivery).await?;
        let declared = self.store.list_resources_by_declaration(&run.run_id).await?;
        let continuing = self.store.continuing_resources(&delivery.execution).await?;
        let completes_snapshot =
            completes_snapshot && !self.store.snapshot_completed_elsewhere(&delivery.execution).await?;
        let tables = pipelined::by_table(&declared, lanes, handed_over)?;
        // The point of no return when there is nothing to publish: an abort that came first wins.
        if tables.is_empty() && !self.store.begin_publishing(delivery).await? {
            return Ok(CommitEnd::AbortedBeforePublishing);
        }
        // Each destination table publishes as soon as its own lanes have drained and its
        // streams are committed, while the others still upload or finalize (`pipelined`).
        let stream_commits = tokio::sync::Semaphore::new(self.max_concurrent_publications);
        let context =
            pipelined::CommitContext { run, delivery, continuing: &continuing, completes_snapshot, stream_commits };
        let stop = std::sync::atomic::AtomicBool::new(false);
        let work: Vec<_> = tables
            .into_iter()
            // Boxed: the future is large, and moving it by value overflows debug stacks.
            .map(|table| Box::pin(self.drain_and_publish(&context, table, &stop)))
            .collect();
        // All at once: a table waiting for a slow lane must not hold back one that is ready.
        // Stream commits are bounded per commit, publication jobs by the adaptive limit.
        let ends = futures::future::join_all(work).await;
        self.finish(run, ends).await
    }

    /// Deletes the staging tables no job will read again and names every failed destination
    /// (the first failure's code, each failure in the detail).
    async fn outcome(&self, run: &RunRecord, published: impl Iterator<Item = Published>) -> Result<(), Problem> {
        let mut failures: Vec<(ResourceName, Problem)> = Vec::new();
        let mut done_with = Vec::new();
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
            done_with.extend(staging_table);
            if let Some(problem) = problem {
                failures.push((resource, problem));
            }
        }
        self.delete_staging_tables(run, done_with).await;
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
        self.delete_staging_tables(run, streams.into_iter().map(|stream| stream.staging_table)).await;
    }

    /// Deletes staging tables no job will read again, `max_concurrent_publications` at once (a
    /// thousand one after another would take minutes). They expire on their own anyway, so a
    /// failure is logged, not raised.
    async fn delete_staging_tables(&self, run: &RunRecord, tables: impl IntoIterator<Item = String>) {
        let (project, dataset) = (&run.destination.project, &run.destination.dataset);
        let deletions: Vec<_> = tables
            .into_iter()
            .map(|table| async move {
                if let Err(e) = self.bigquery.delete_table(project, dataset, &table).await {
                    tracing::warn!(%table, error = %e, "could not delete a staging table");
                }
            })
            .collect();
        futures::stream::iter(deletions).buffer_unordered(self.max_concurrent_publications).collect::<Vec<()>>().await;
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
        let committed = serde_json::json!({"rows": row_count, "stream": report.stream_name});
        self.store.change_stream(&resource, StreamChange::Committed, committed).await?;
        Ok(())
    }
}
