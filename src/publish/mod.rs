//! Commit and publication: after the lanes drain, finalize each PENDING stream (checking its
//! row count), commit it to its staging table, then publish each destination with one query job
//! (deterministic job id, fingerprint persisted first), delete the staging tables and mark the
//! execution committed, which makes its last checkpoint the run's durable checkpoint.
//!
//! Pure pieces: [`sql`] (statements per write mode), [`job_id`], [`fingerprint`].

pub mod fingerprint;
pub mod job_id;
pub mod sql;

use std::time::Duration;

use futures::StreamExt as _;

use crate::bigquery::write::CommitOutcome;
use crate::bigquery::{BigQuery, BigQueryError};
use crate::error::{ErrorCode, Problem};
use crate::model::{ExecutionState, PublicationState, WriteMode};
use crate::pipeline::table_path;
use crate::pipeline::{ExecutionKey, LaneReport, Pipeline};
use crate::store::{ExecutionRecord, ResourceRecord, RunRecord, Store};
use crate::telemetry;

/// Destinations finalized, committed and published at once per commit. BigQuery runs at most
/// two DML statements per table at a time; these are different tables.
pub const MAX_CONCURRENT_PUBLICATIONS: usize = 8;

/// How one destination's publication ended when it did not fail for good (that is `Err`).
#[derive(Debug, Clone, PartialEq)]
enum PublishOutcome {
    /// Done now, earlier (a redelivery), or nothing to publish.
    Published,
    /// We lost track of the job (timeout, BigQuery unreachable): it may still finish. Its
    /// record stays `running`, so a redelivery re-attaches to it under the same job id.
    Unfinished(Problem),
}

/// Runs commits. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Publisher {
    pub store: Store,
    pub bigquery: BigQuery,
    pub pipeline: Pipeline,
    pub query_job_timeout: Duration,
}

impl Publisher {
    /// Commits one delivery already moved to `committing`. Any failure fails the execution with
    /// its problem; the terminal record is returned either way.
    pub async fn commit(&self, run: &RunRecord, execution: &ExecutionRecord) -> Result<ExecutionRecord, Problem> {
        let key = ExecutionKey { run_id: run.run_id.clone(), execution_id: execution.execution_id.clone() };
        let result = self.commit_inner(run, execution, &key).await;
        self.pipeline.forget(&key, execution.delivery);
        let (run_id, execution_id, delivery) = (&run.run_id, &execution.execution_id, execution.delivery);
        let record = match result {
            Ok(()) => self.store.mark_committed(run_id, execution_id, delivery).await?,
            Err(problem) => {
                tracing::warn!(%run_id, %execution_id, code = %problem.code, detail = %problem.detail, "commit failed");
                self.store.fail_execution(run_id, execution_id, delivery, &problem).await?
            }
        };
        let record = match record {
            Some(record) => record,
            // Aborted or failed by an upload lane meanwhile: report what is stored.
            None => self
                .store
                .get_execution(run_id, execution_id)
                .await?
                .ok_or_else(|| Problem::not_found(format!("execution {execution_id}")))?,
        };
        metrics::counter!(telemetry::EXECUTIONS_FINISHED, "state" => record.state.as_str()).increment(1);
        Ok(record)
    }

    async fn commit_inner(
        &self,
        run: &RunRecord,
        execution: &ExecutionRecord,
        key: &ExecutionKey,
    ) -> Result<(), Problem> {
        let reports = self.pipeline.drain(key, execution.delivery).await?;
        // A lane may have failed the execution after draining started.
        if let Some(current) = self.store.get_execution(&run.run_id, &execution.execution_id).await?
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
        let commits: Vec<_> = reports.iter().map(|report| self.commit_stream(run, execution, report)).collect();
        let committed: Vec<Result<(), Problem>> =
            futures::stream::iter(commits).buffer_unordered(MAX_CONCURRENT_PUBLICATIONS).collect().await;
        committed.into_iter().collect::<Result<Vec<()>, Problem>>()?;

        let resources = &self.store.list_resources(&run.run_id).await?;
        let publications: Vec<_> = reports
            .iter()
            .map(|report| async move {
                let outcome = match resources.iter().find(|r| r.resource == report.resource) {
                    Some(resource) => self.publish(run, execution, resource, report).await,
                    None => Err(Problem::internal(format!("resource {} is no longer declared", report.resource))),
                };
                (report, outcome)
            })
            .collect();
        let outcomes: Vec<(&LaneReport, Result<PublishOutcome, Problem>)> =
            futures::stream::iter(publications).buffer_unordered(MAX_CONCURRENT_PUBLICATIONS).collect().await;

        let mut failures: Vec<(String, Problem)> = Vec::new();
        for (report, outcome) in outcomes {
            match outcome {
                Ok(PublishOutcome::Published) => self.delete_staging_table(run, &report.staging_table).await,
                // A job we stopped waiting for may still read its staging table: it expires.
                Ok(PublishOutcome::Unfinished(problem)) => failures.push((report.resource.clone(), problem)),
                Err(problem) => {
                    self.delete_staging_table(run, &report.staging_table).await;
                    failures.push((report.resource.clone(), problem));
                }
            }
        }
        // The first failure's code, every failed destination named in the detail.
        match failures.first() {
            None => Ok(()),
            Some((_, first)) => {
                let detail: Vec<String> = failures.iter().map(|(r, p)| format!("resource {r}: {}", p.detail)).collect();
                Err(Problem { detail: detail.join("; "), ..first.clone() })
            }
        }
    }

    /// Deletes the staging tables of an aborted delivery (best effort: they expire anyway).
    pub async fn discard_staging(&self, run_id: &str, execution_id: &str, delivery: i32) {
        let (run, streams) = match (
            self.store.get_run(run_id).await,
            self.store.list_staging_streams(run_id, execution_id, delivery).await,
        ) {
            (Ok(Some(run)), Ok(streams)) => (run, streams),
            (Err(e), _) | (_, Err(e)) => {
                tracing::warn!(%run_id, %execution_id, error = %e, "could not list staging tables to discard");
                return;
            }
            (Ok(None), _) => return,
        };
        for stream in streams {
            self.delete_staging_table(&run, &stream.staging_table).await;
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
    async fn commit_stream(
        &self,
        run: &RunRecord,
        execution: &ExecutionRecord,
        report: &LaneReport,
    ) -> Result<(), Problem> {
        let writer = self.bigquery.writer();
        let upload_failed = |e: BigQueryError| e.to_problem(ErrorCode::UploadFailed);
        let row_count = writer.finalize(&report.stream_name).await.map_err(upload_failed)?;
        if row_count != report.rows_sent {
            return Err(Problem::new(
                ErrorCode::RowCountMismatch,
                format!(
                    "resource {}: the stream holds {row_count} rows but the gateway appended {}",
                    report.resource, report.rows_sent
                ),
            ));
        }
        let (run_id, execution_id, delivery) = (&run.run_id, &execution.execution_id, execution.delivery);
        self.store.set_stream_finalized(run_id, execution_id, delivery, &report.resource, row_count).await?;
        let path = table_path(&run.destination.project, &run.destination.dataset, &report.staging_table);
        match writer.batch_commit(&path, vec![report.stream_name.clone()]).await {
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
        self.store.set_stream_committed(run_id, execution_id, delivery, &report.resource).await?;
        Ok(())
    }

    /// One query job for the destination, unless this execution already published the same
    /// content (a redelivery), in which case the earlier job stands.
    async fn publish(
        &self,
        run: &RunRecord,
        execution: &ExecutionRecord,
        resource: &ResourceRecord,
        report: &LaneReport,
    ) -> Result<PublishOutcome, Problem> {
        let (run_id, execution_id, delivery) = (&run.run_id, &execution.execution_id, execution.delivery);
        let staging = self
            .store
            .get_staging_stream(run_id, execution_id, delivery, &report.resource)
            .await?
            .ok_or_else(|| Problem::internal(format!("no staging record for {}", report.resource)))?;
        let receipts = self.store.list_receipts(run_id, execution_id, delivery, &report.resource).await?;
        let fingerprint = fingerprint::fingerprint(&fingerprint::FingerprintInput {
            project: &run.destination.project,
            dataset: &run.destination.dataset,
            table: &resource.table_name,
            write_mode: resource.write_mode,
            primary_key: &resource.primary_key,
            arrow_schema_sha256: &staging.arrow_schema_sha256,
            receipts: &receipts,
        });
        let job_id = job_id::publication_job_id(
            run_id,
            execution_id,
            &report.resource,
            &run.destination.dataset,
            &resource.table_name,
            resource.write_mode,
        );
        if let Some(previous) = self.store.get_publication(run_id, execution_id, &report.resource).await? {
            match previous.state {
                PublicationState::Done if previous.fingerprint == fingerprint => {
                    tracing::info!(%run_id, %execution_id, resource = %report.resource, job_id = %previous.job_id,
                        "redelivered execution staged the same content; reusing its publication");
                    metrics::counter!(telemetry::PUBLICATIONS, "outcome" => "reused").increment(1);
                    return Ok(PublishOutcome::Published);
                }
                // Interrupted while its job ran: the same job id re-attaches to that job.
                PublicationState::Running if previous.fingerprint == fingerprint => {}
                PublicationState::Failed => {
                    let detail = previous.error.map(|e| e.detail).unwrap_or_default();
                    return Err(Problem::new(
                        ErrorCode::PublicationFailed,
                        format!("publication job {} failed earlier: {detail}", previous.job_id),
                    )
                    .with_hint("a corrected attempt needs a new execution ID"));
                }
                PublicationState::Done | PublicationState::Running => {
                    return Err(Problem::new(
                        ErrorCode::ReplayMismatch,
                        format!(
                            "this execution was already published by job {} with other content or batch boundaries",
                            previous.job_id
                        ),
                    )
                    .with_hint("a corrected load needs a new execution ID"));
                }
            }
        }
        // full_replace: the run's first publication of the resource replaces the table (even
        // with no rows); later segments append.
        let replace = resource.write_mode == WriteMode::FullReplace
            && !self.store.published_by_another_execution(run_id, execution_id, &report.resource).await?;
        if report.rows_sent == 0 && !replace {
            return Ok(PublishOutcome::Published);
        }
        let project = &run.destination.project;
        let key: Vec<String> = resource
            .primary_key
            .iter()
            .filter_map(|k| report.destination_columns.iter().find(|c| c.name.eq_ignore_ascii_case(k)))
            .map(|c| c.name.clone())
            .collect();
        let statement = sql::publication_statement(&sql::Publication {
            destination: sql::TableRef { project, dataset: &run.destination.dataset, table: &resource.table_name },
            staging: sql::TableRef { project, dataset: &run.destination.dataset, table: &report.staging_table },
            write_mode: resource.write_mode,
            columns: &report.destination_columns,
            key: &key,
            replace,
        });
        let destination_name = format!("{}.{}", run.destination.dataset, resource.table_name);
        self.store
            .begin_publication(&crate::store::NewPublication {
                run_id,
                execution_id,
                resource: &report.resource,
                delivery,
                destination: &destination_name,
                job_id: &job_id,
                fingerprint: &fingerprint,
            })
            .await?;
        tracing::info!(%run_id, %execution_id, resource = %report.resource, %job_id, "bigquery.write.publish.started");
        let outcome = self
            .bigquery
            .run_query_job(project, run.destination.location(), &job_id, &statement, self.query_job_timeout)
            .await;
        match outcome {
            Ok(outcome) => {
                self.store
                    .finish_publication(
                        run_id,
                        execution_id,
                        &report.resource,
                        PublicationState::Done,
                        outcome.rows_affected,
                        None,
                    )
                    .await?;
                metrics::counter!(telemetry::PUBLICATIONS, "outcome" => "done").increment(1);
                Ok(PublishOutcome::Published)
            }
            Err(e) if e.is_retryable() => {
                tracing::warn!(%run_id, %execution_id, resource = %report.resource, %job_id, error = %e,
                    "lost track of the publication job; a redelivery re-attaches to it");
                metrics::counter!(telemetry::PUBLICATIONS, "outcome" => "unfinished").increment(1);
                Ok(PublishOutcome::Unfinished(e.to_problem(ErrorCode::PublicationFailed)))
            }
            Err(e) => {
                let problem = e.to_problem(ErrorCode::PublicationFailed);
                self.store
                    .finish_publication(
                        run_id,
                        execution_id,
                        &report.resource,
                        PublicationState::Failed,
                        None,
                        Some(&problem),
                    )
                    .await?;
                metrics::counter!(telemetry::PUBLICATIONS, "outcome" => "failed").increment(1);
                Err(problem)
            }
        }
    }
}
