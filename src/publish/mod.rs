//! Commit and publication: after the lanes drain, finalize each PENDING stream (checking its
//! row count), commit it to its staging table, then publish each destination with one query job
//! (deterministic job id, fingerprint persisted first), delete the staging tables and mark the
//! execution committed, which makes its last checkpoint the run's durable checkpoint.
//!
//! Pure pieces: [`sql`] (statements per write mode), [`job_id`], [`fingerprint`], and
//! [`reconcile`] (what a redelivered publication does).

pub(crate) mod fingerprint;
pub(crate) mod job_id;
pub(crate) mod reconcile;
pub(crate) mod sql;

use std::time::Duration;

use futures::StreamExt as _;

use crate::bigquery::write::CommitOutcome;
use crate::bigquery::{BigQuery, BigQueryError, table_path};
use crate::error::{ErrorCode, Problem};
use crate::model::{DeliveryRef, ExecutionState, PublicationState, ResourceName, WriteMode};
use crate::pipeline::{LaneReport, Pipeline};
use crate::store::{ExecutionRecord, NewPublication, ResourceRecord, RunRecord, Store};
use crate::telemetry;
use reconcile::{Reconciled, reconcile};

/// Destinations finalized, committed and published at once per commit. BigQuery runs at most
/// two DML statements per table at a time; these are different tables.
pub(crate) const MAX_CONCURRENT_PUBLICATIONS: usize = 8;

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
pub(crate) struct Publisher {
    pub(crate) store: Store,
    pub(crate) bigquery: BigQuery,
    pub(crate) pipeline: Pipeline,
    pub(crate) query_job_timeout: Duration,
}

impl Publisher {
    /// Commits one delivery already moved to `committing`. Any failure fails the execution with
    /// its problem; the terminal record is returned either way.
    pub(crate) async fn commit(
        &self,
        run: &RunRecord,
        execution: &ExecutionRecord,
    ) -> Result<ExecutionRecord, Problem> {
        let delivery = execution.delivery_ref();
        let result = self.commit_inner(run, &delivery).await;
        self.pipeline.forget(&delivery.execution, delivery.delivery);
        let record = match result {
            Ok(()) => self.store.mark_committed(&delivery).await?,
            Err(problem) => {
                tracing::warn!(run_id = %run.run_id, execution_id = %execution.execution_id, code = %problem.code,
                    detail = %problem.detail, "commit failed");
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
        Ok(record)
    }

    async fn commit_inner(&self, run: &RunRecord, delivery: &DeliveryRef) -> Result<(), Problem> {
        let reports = self.pipeline.drain(&delivery.execution, delivery.delivery).await?;
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
            futures::stream::iter(commits).buffer_unordered(MAX_CONCURRENT_PUBLICATIONS).collect().await;
        committed.into_iter().collect::<Result<Vec<()>, Problem>>()?;

        let resources = &self.store.list_resources(&run.run_id).await?;
        let publications: Vec<_> = reports
            .iter()
            .map(|report| async move {
                let outcome = match resources.iter().find(|r| r.resource == report.resource) {
                    Some(resource) => self.publish(run, delivery, resource, report).await,
                    None => Err(Problem::internal(format!("resource {} is no longer declared", report.resource))),
                };
                (report, outcome)
            })
            .collect();
        let outcomes: Vec<(&LaneReport, Result<PublishOutcome, Problem>)> =
            futures::stream::iter(publications).buffer_unordered(MAX_CONCURRENT_PUBLICATIONS).collect().await;

        let mut failures: Vec<(ResourceName, Problem)> = Vec::new();
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
        let resource = delivery.resource(report.resource.clone());
        self.store.set_stream_finalized(&resource, row_count).await?;
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
        self.store.set_stream_committed(&resource).await?;
        Ok(())
    }

    /// One query job for the destination, unless this execution already published the same
    /// content (a redelivery), in which case the earlier job stands.
    async fn publish(
        &self,
        run: &RunRecord,
        delivery: &DeliveryRef,
        resource: &ResourceRecord,
        report: &LaneReport,
    ) -> Result<PublishOutcome, Problem> {
        let staged = delivery.resource(report.resource.clone());
        let staging = self
            .store
            .get_staging_stream(&staged)
            .await?
            .ok_or_else(|| Problem::internal(format!("no staging record for {}", report.resource)))?;
        let receipts = self.store.list_receipts(&staged).await?;
        let fingerprint = fingerprint::fingerprint(&fingerprint::FingerprintInput {
            project: &run.destination.project,
            dataset: &run.destination.dataset,
            table: &resource.table_name,
            write_mode: resource.write_mode,
            primary_key: &resource.primary_key,
            arrow_schema_sha256: &staging.arrow_schema_sha256,
            receipts: &receipts,
        });
        let previous = self.store.get_publication(&delivery.execution, &report.resource).await?;
        match reconcile(previous.as_ref(), &fingerprint) {
            Reconciled::Submit | Reconciled::Reattach => {}
            Reconciled::Reuse { job_id } => {
                tracing::info!(run_id = %run.run_id, execution_id = %delivery.execution_id(),
                    resource = %report.resource, %job_id,
                    "redelivered execution staged the same content; reusing its publication");
                metrics::counter!(telemetry::PUBLICATIONS, "outcome" => "reused").increment(1);
                return Ok(PublishOutcome::Published);
            }
            Reconciled::Refuse(problem) => return Err(problem),
        }
        // full_replace: the run's first publication of the resource replaces the table (even
        // with no rows); later segments append.
        let replace = resource.write_mode == WriteMode::FullReplace
            && !self.store.published_by_another_execution(&delivery.execution, &report.resource).await?;
        if report.rows_sent == 0 && !replace {
            return Ok(PublishOutcome::Published);
        }
        let statement = statement_for(run, resource, report, replace);
        self.run_and_record(run, delivery, resource, report, &fingerprint, &statement).await
    }

    /// Records the publication (job id and fingerprint) before submitting its job, runs the job
    /// and records how it ended.
    async fn run_and_record(
        &self,
        run: &RunRecord,
        delivery: &DeliveryRef,
        resource: &ResourceRecord,
        report: &LaneReport,
        fingerprint: &str,
        statement: &str,
    ) -> Result<PublishOutcome, Problem> {
        let (run_id, execution_id) = (delivery.run_id(), delivery.execution_id());
        let job_id = job_id::publication_job_id(
            run_id,
            execution_id,
            &report.resource,
            &run.destination.dataset,
            &resource.table_name,
            resource.write_mode,
        );
        let destination = format!("{}.{}", run.destination.dataset, resource.table_name);
        self.store
            .begin_publication(&NewPublication {
                delivery,
                resource: &report.resource,
                destination: &destination,
                job_id: &job_id,
                fingerprint,
            })
            .await?;
        tracing::info!(%run_id, %execution_id, resource = %report.resource, %job_id, "bigquery.write.publish.started");
        let project = &run.destination.project;
        let outcome = self
            .bigquery
            .run_query_job(project, run.destination.location(), &job_id, statement, self.query_job_timeout)
            .await;
        let (execution, resource) = (&delivery.execution, &report.resource);
        match outcome {
            Ok(outcome) => {
                let rows = outcome.rows_affected;
                self.store.finish_publication(execution, resource, PublicationState::Done, rows, None).await?;
                metrics::counter!(telemetry::PUBLICATIONS, "outcome" => "done").increment(1);
                Ok(PublishOutcome::Published)
            }
            Err(e) if e.is_retryable() => {
                tracing::warn!(%run_id, %execution_id, %resource, %job_id, error = %e,
                    "lost track of the publication job; a redelivery re-attaches to it");
                metrics::counter!(telemetry::PUBLICATIONS, "outcome" => "unfinished").increment(1);
                Ok(PublishOutcome::Unfinished(e.to_problem(ErrorCode::PublicationFailed)))
            }
            Err(e) => {
                let problem = e.to_problem(ErrorCode::PublicationFailed);
                let failed = PublicationState::Failed;
                self.store.finish_publication(execution, resource, failed, None, Some(&problem)).await?;
                metrics::counter!(telemetry::PUBLICATIONS, "outcome" => "failed").increment(1);
                Err(problem)
            }
        }
    }
}

/// The statement that publishes `report`'s staged rows into the resource's destination.
fn statement_for(run: &RunRecord, resource: &ResourceRecord, report: &LaneReport, replace: bool) -> String {
    let project = &run.destination.project;
    let key: Vec<String> = resource
        .primary_key
        .iter()
        .filter_map(|k| report.destination_columns.iter().find(|c| c.name.eq_ignore_ascii_case(k)))
        .map(|c| c.name.clone())
        .collect();
    sql::publication_statement(&sql::Publication {
        destination: sql::TableRef { project, dataset: &run.destination.dataset, table: &resource.table_name },
        staging: sql::TableRef { project, dataset: &run.destination.dataset, table: &report.staging_table },
        write_mode: resource.write_mode,
        columns: &report.destination_columns,
        key: &key,
        replace,
    })
}
