//! One publication's query job, attempt after attempt: each attempt's job id (keyed,
//! [`super::job_id`]), the fingerprint and the statement's digest recorded before the job is
//! submitted; the job run under the adaptive publication limit; how the last attempt ended
//! recorded. A re-attachment (a redelivery finding its publication running) runs its first
//! attempt under the job id the record holds, so it finds the earlier job whatever key ids are
//! computed with now; a job found under the id that is not ours ([`BigQueryError::ForeignJob`])
//! fails the publication, nothing recorded as published and its staging table kept.

use std::time::Duration;

use tokio::time::Instant;

use super::Publisher;
use super::decide::{self, PublishOutcome};
use super::job_id::{self, JobKind};
use crate::bigquery::BigQueryError;
use crate::bigquery::error::Stage;
use crate::bigquery::jobs::{JobOutcome, QueryJob, statement_sha256};
use crate::bigquery::per_destination::ProjectLocation;
use crate::bigquery::retry::{Failure, RetryDriver};
use crate::error::Problem;
use crate::model::DeliveryRef;
use crate::pipeline::LaneReport;
use crate::store::{Event, NewPublication, PublicationEnd, Publishing, ResourceRecord, RunRecord};
use crate::telemetry::{self, PublishTiming};

/// What a publication writes into its destination.
pub(super) struct Statement<'a> {
    /// The staged rows, or `None` for an empty replacement (a truncation).
    pub(super) staged: Option<&'a LaneReport>,
    pub(super) sql: String,
}

/// One publication's query job: what it runs, for which delivery and resource, under which
/// fingerprint.
pub(super) struct PublicationJob<'a> {
    pub(super) run: &'a RunRecord,
    /// The store's proof that the delivery is publishing.
    pub(super) publishing: &'a Publishing,
    pub(super) resource: &'a ResourceRecord,
    pub(super) fingerprint: String,
    pub(super) statement: Statement<'a>,
    /// The job id an earlier delivery recorded (and may have submitted its job under) when
    /// this one re-attaches: the first attempt runs under it.
    pub(super) recorded_job_id: Option<&'a str>,
}

impl PublicationJob<'_> {
    /// The delivery the job publishes.
    fn delivery(&self) -> &DeliveryRef {
        self.publishing.delivery()
    }

    /// The project and location the job runs in, whose publication limit it counts against.
    fn project_location(&self) -> ProjectLocation {
        let project = self.run.job_project.as_deref().unwrap_or(&self.run.destination.project);
        ProjectLocation::new(project, self.run.destination.location())
    }

    /// `dataset.table`.
    fn destination(&self) -> String {
        format!("{}.{}", self.run.destination.dataset, self.resource.table_name)
    }
}

/// How one attempt's job ended, under which job id, after how long.
struct Submitted {
    job_id: String,
    outcome: Result<JobOutcome, BigQueryError>,
    duration: Duration,
}

/// One attempt about to be submitted: its job id and the digests of the statements recorded
/// under it (this attempt's included).
struct Attempt {
    job_id: String,
    recorded_statements: Vec<String>,
}

impl Publisher {
    /// The job id of attempt `attempt` (1-based) of `job`, under the current key.
    fn attempt_job_id(&self, job: &PublicationJob<'_>, attempt: u32) -> String {
        job_id::publication_job_id(&self.job_ids, job.delivery(), job.resource, &job.run.destination.dataset, attempt)
    }

    /// Runs the publication's job, and runs it again under the next attempt's job id while
    /// [`decide::runs_again`] says it may (BigQuery's passing reasons, its rate limits, a DML
    /// conflict, `jobs.insert` pushed back) and the publication's retry policy says when (the
    /// [`RetryDriver`]: the one level that runs a refused job again).
    pub(super) async fn run_and_record(&self, job: &PublicationJob<'_>) -> Result<PublishOutcome, Problem> {
        let first = job.recorded_job_id.map_or(1, job_id::attempt_of);
        let digest = statement_sha256(&job.statement.sql);
        let attempt = |n: u32| {
            let job_id = match (n, job.recorded_job_id) {
                (1, Some(recorded)) => recorded.to_string(),
                _ => self.attempt_job_id(job, first + n - 1),
            };
            self.attempt(job, job_id, &digest)
        };
        let runs_again = |answer: &Result<Submitted, Problem>| match answer {
            Ok(Submitted { outcome: Err(e), .. }) if decide::runs_again(e) => Some(Failure::of(e)),
            _ => None,
        };
        let driver = RetryDriver::new(&self.retry, "query job").resource(&job.resource.resource);
        let Submitted { job_id, outcome, duration } = driver.run(runs_again, attempt).await?;
        self.record_outcome(job, &job_id, outcome, duration).await
    }

    /// One attempt: its job id, the fingerprint and the statement's digest recorded, then its
    /// job submitted under the adaptive publication limit, which learns from its result.
    async fn attempt(&self, job: &PublicationJob<'_>, job_id: String, digest: &str) -> Result<Submitted, Problem> {
        let destination = job.destination();
        let record = NewPublication {
            delivery: job.delivery(),
            resource: &job.resource.resource,
            destination: &destination,
            job_id: &job_id,
            fingerprint: &job.fingerprint,
            committed_streams: None,
            statement_sha256: Some(digest),
        };
        let recorded_statements = self.store.begin_publication(&record).await?;
        let started = Instant::now();
        let submitted = Attempt { job_id, recorded_statements };
        let outcome =
            self.publications.run(&job.project_location(), self.bigquery.tenant(), self.submit(job, &submitted)).await;
        Ok(Submitted { job_id: submitted.job_id, outcome, duration: started.elapsed() })
    }

    /// Submits the attempt's job and waits for it.
    async fn submit(&self, job: &PublicationJob<'_>, attempt: &Attempt) -> Result<JobOutcome, BigQueryError> {
        let (run, name, job_id) = (job.run, &job.resource.resource, attempt.job_id.as_str());
        let staged_rows = job.statement.staged.map_or(0, |report| report.rows_acknowledged);
        tracing::info!(run_id = %job.delivery().run_id(), execution_id = %job.delivery().execution_id(), resource = %name,
            %job_id, staged_rows, "bigquery.write.publish.started");
        let span = tracing::trace_span!(target: crate::traces::TARGET, "publication.job", resource = %name,
            table = %job.destination(), bigquery.job_id = job_id);
        let mut labels = job_id::run_job_labels(JobKind::Publication, run, job.delivery(), name);
        // BigQuery's job history leads back to the trace.
        labels.extend(crate::traces::trace_id_of(&span).map(|trace_id| (job_id::TRACE_LABEL, trace_id)));
        let query = QueryJob {
            project: run.job_project.as_deref().unwrap_or(&run.destination.project),
            location: run.destination.location(),
            job_id,
            sql: &job.statement.sql,
            labels: &labels,
            maximum_bytes_billed: run.maximum_bytes_billed,
            statement_byte_budget: None,
            timeout: self.query_job_timeout,
            recorded_statements: &attempt.recorded_statements,
        };
        let started = Instant::now();
        let outcome = tracing::Instrument::instrument(self.bigquery.run_query_job(&query), span).await;
        let duration = started.elapsed();
        let outcome_label = match &outcome {
            Ok(_) => "done",
            Err(e) if e.is_retryable() => "unfinished",
            Err(_) => "failed",
        };
        telemetry::publication_job_took(outcome_label, duration);
        let cost = outcome.as_ref().ok().map(|o| &o.cost);
        let (dataset, table) = (run.destination.dataset.as_str(), job.resource.table_name.as_str());
        PublishTiming { resource: name, dataset, table, duration, cost }.emit();
        outcome
    }

    /// Records how the publication's last attempt ended.
    async fn record_outcome(
        &self,
        job: &PublicationJob<'_>,
        job_id: &str,
        outcome: Result<JobOutcome, BigQueryError>,
        duration: Duration,
    ) -> Result<PublishOutcome, Problem> {
        let name = &job.resource.resource;
        let duration_ms = duration.as_millis() as u64;
        match outcome {
            Ok(outcome) => {
                let (rows_affected, bytes_billed) = (outcome.rows_affected, outcome.cost.bytes_billed);
                let finished = Event::PublicationFinished { job_id, duration_ms, rows_affected, bytes_billed };
                let done = PublicationEnd::Done { rows_affected: outcome.rows_affected, cost: &outcome.cost };
                self.store.finish_publication(job.delivery(), name, done, Some(finished)).await?;
                telemetry::publication_ended("done");
                Ok(PublishOutcome::Done)
            }
            Err(e) if e.is_retryable() => {
                tracing::warn!(run_id = %job.delivery().run_id(), execution_id = %job.delivery().execution_id(),
                    resource = %name, %job_id, error = %e, "lost track of the publication job; a redelivery re-attaches to it");
                telemetry::publication_ended("unfinished");
                Ok(PublishOutcome::Unfinished(e.problem(Stage::Publication)))
            }
            Err(e) => {
                let problem = e.problem(Stage::Publication);
                let (code, hint) = (problem.code, problem.hint.as_deref());
                let failed = Event::PublicationFailed { job_id, duration_ms, code, hint };
                self.store
                    .finish_publication(job.delivery(), name, PublicationEnd::Failed(&problem), Some(failed))
                    .await?;
                telemetry::publication_ended("failed");
                match e {
                    BigQueryError::ForeignJob { .. } => {
                        tracing::warn!(run_id = %job.delivery().run_id(), execution_id = %job.delivery().execution_id(),
                            resource = %name, %job_id, error = %e, "a job the gateway did not submit holds the publication's job id");
                        Ok(PublishOutcome::ForeignJob(problem))
                    }
                    _ => Err(problem),
                }
            }
        }
    }
}
