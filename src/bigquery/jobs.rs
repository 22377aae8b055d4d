//! Query jobs with caller-chosen, deterministic job ids: `jobs.insert`, then, unless the job
//! ended already, `jobs.getQueryResults` long polls (each answers as soon as the job completes,
//! or after `timeoutMs`; with `maxResults=0`, as Google's clients wait for a query), then one
//! `jobs.get` for its outcome and statistics. A 409 on insert means a job exists under the id
//! already: it is fetched and, only when it is ours ([`foreign_because`]: the statement we
//! submit, or one recorded under the id before, in GoogleSQL), awaited and its outcome taken;
//! never re-run. Any other job there fails with [`BigQueryError::ForeignJob`].

use std::time::Duration;

use google_cloud_bigquery_v2::model::{Job, JobConfiguration, JobConfigurationQuery, JobReference, ScriptOptions};
use sha2::{Digest as _, Sha256};

use super::retry::{Backoff, Failure, RetryClass, RetryDriver, RetryPolicy};
use super::{BigQuery, BigQueryError, BigQueryResult, rest_call};

/// How long one `jobs.getQueryResults` asks BigQuery to wait for the job (it may answer sooner;
/// well inside the REST call's deadline).
const LONG_POLL: Duration = Duration::from_secs(30);
/// Delays between long polls that failed in passing.
const LONG_POLL_BACKOFF: Backoff = Backoff::new(Duration::from_millis(500), Duration::from_secs(10));
use crate::model::JobCost;

/// How a finished job ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct JobOutcome {
    /// `statistics.query.numDmlAffectedRows`, when BigQuery reports it.
    pub(crate) rows_affected: Option<i64>,
    /// Whether the job already existed (submitted earlier under the same id).
    pub(crate) reused: bool,
    pub(crate) cost: JobCost,
}

fn job_cost(job: &Job) -> JobCost {
    let Some(statistics) = job.statistics.as_ref() else { return JobCost::default() };
    let query = statistics.query.as_ref();
    let dml = query.and_then(|q| q.dml_stats.as_ref());
    JobCost {
        bytes_processed: query.and_then(|q| q.total_bytes_processed).or(statistics.total_bytes_processed),
        bytes_billed: query.and_then(|q| q.total_bytes_billed),
        slot_ms: query.and_then(|q| q.total_slot_ms).or(statistics.total_slot_ms),
        rows_inserted: dml.and_then(|d| d.inserted_row_count),
        rows_updated: dml.and_then(|d| d.updated_row_count),
        rows_deleted: dml.and_then(|d| d.deleted_row_count),
    }
}

/// One query job to run.
#[derive(Debug, Clone, Copy)]
pub(crate) struct QueryJob<'a> {
    /// The project the job runs and is billed in (tables it names may live elsewhere).
    pub(crate) project: &'a str,
    pub(crate) location: Option<&'a str>,
    pub(crate) job_id: &'a str,
    /// GoogleSQL.
    pub(crate) sql: &'a str,
    pub(crate) labels: &'a [(&'static str, String)],
    /// The job fails instead of billing more (`bytesBilledLimitExceeded`).
    pub(crate) maximum_bytes_billed: Option<i64>,
    /// A script's limit per statement (`scriptOptions.statementByteBudget`): an atomic
    /// publication's transaction bounds each table's statement as one job per table would.
    pub(crate) statement_byte_budget: Option<i64>,
    /// How long to wait for the job to end.
    pub(crate) timeout: Duration,
    /// The SHA-256 ([`statement_sha256`]) of every statement the gateway recorded under
    /// `job_id` before submitting it (an earlier delivery's, over its own staging table): a
    /// job found under the id running one of them, or `sql`, is ours.
    pub(crate) recorded_statements: &'a [String],
}

/// The SHA-256 of a statement, as publications record it (64 lowercase hex digits).
pub(crate) fn statement_sha256(sql: &str) -> String {
    hex::encode(Sha256::digest(sql.as_bytes()))
}

/// Why a job found under one of our ids is not ours, or `None` when it is: its query is the
/// statement `query` submits, or one recorded under the id, run as GoogleSQL and not as a dry
/// run. The text decides alone: every table the gateway's statements name is fully qualified,
/// so the same text does the same thing whatever else the job's configuration says; who
/// created it and its labels prove nothing (labels are copied as easily as ids are read).
pub(crate) fn foreign_because(job: &Job, query: &QueryJob<'_>) -> Option<&'static str> {
    let Some(configuration) = job.configuration.as_ref() else { return Some("it has no configuration") };
    let Some(statement) = configuration.query.as_ref() else { return Some("it is not a query job") };
    if configuration.dry_run == Some(true) {
        return Some("it is a dry run");
    }
    if statement.use_legacy_sql != Some(false) {
        return Some("it runs legacy SQL");
    }
    let digest = statement_sha256(&statement.query);
    let ours = statement.query == query.sql || query.recorded_statements.contains(&digest);
    (!ours).then_some("it runs another statement than the one the gateway submits under this id")
}

/// The job's `errorResult`, its message without the row values it may quote (a statement
/// converts staged values into GEOGRAPHY, RANGE, INTERVAL or JSON, and BigQuery's message
/// quotes the one it refused): stored, shown and logged as row errors are.
fn job_error(job: &Job) -> Option<BigQueryError> {
    let error = job.status.as_ref()?.error_result.as_ref()?;
    let message = super::row_errors::without_row_values(&error.message);
    Some(BigQueryError::JobFailed { reason: error.reason.clone(), message })
}

fn is_done(job: &Job) -> bool {
    job.status.as_ref().is_some_and(|s| s.state == "DONE")
}

fn rows_affected(job: &Job) -> Option<i64> {
    job.statistics.as_ref()?.query.as_ref()?.num_dml_affected_rows
}

impl BigQuery {
    /// Runs the query job and waits for it, up to its timeout. `jobs.insert` is made once: its
    /// caller runs a refused job again ([`insert_pushed_back`] tells it), the one level that
    /// retries it; reading the job's state (`jobs.getQueryResults`, `jobs.get`) is retried here,
    /// since no caller could run it again without running the job again.
    pub(crate) async fn run_query_job(&self, query: &QueryJob<'_>) -> BigQueryResult<JobOutcome> {
        let QueryJob { project, location, job_id, sql, labels, maximum_bytes_billed, timeout, .. } = *query;
        let script = query.statement_byte_budget.map(|bytes| ScriptOptions::new().set_statement_byte_budget(bytes));
        let mut reference = JobReference::new().set_project_id(project).set_job_id(job_id);
        if let Some(location) = location {
            reference = reference.set_location(location);
        }
        let statement = JobConfigurationQuery::new()
            .set_query(sql)
            .set_use_legacy_sql(false)
            .set_or_clear_maximum_bytes_billed(maximum_bytes_billed)
            .set_or_clear_script_options(script);
        let job = Job::new().set_job_reference(reference).set_configuration(
            JobConfiguration::new()
                .set_query(statement)
                .set_labels(labels.iter().map(|(k, v)| (k.to_string(), v.clone()))),
        );
        let insert = || self.jobs.insert_job().set_project_id(project).set_job(job.clone()).send();
        let (mut job, reused) = match rest_call(&self.quotas, "jobs.insert", insert).await? {
            Ok(job) => (job, false),
            Err(e) if e.http_status_code() == Some(409) => (self.existing_job(query).await?, true),
            Err(e) => return Err(BigQueryError::rest("jobs.insert")(e)),
        };
        if !is_done(&job) {
            self.wait_for_job(project, location, job_id, timeout).await?;
            job = self.get_job(project, location, job_id).await?;
        }
        if !is_done(&job) {
            // Never read as success: the outcome is unknown and the job may still finish.
            return Err(BigQueryError::Timeout { operation: "query job", seconds: timeout.as_secs() });
        }
        if let Some(error) = job_error(&job) {
            return Err(error);
        }
        Ok(JobOutcome { rows_affected: rows_affected(&job), reused, cost: job_cost(&job) })
    }

    /// Dry-runs `sql` in `project` (`configuration.dryRun`: BigQuery validates and plans the
    /// statement, runs and bills nothing, creates no job, so no job id is sent): the bytes it
    /// reports the statement would process (`totalBytesProcessed`). One `jobs.insert`, paced by
    /// the REST quotas; its caller retries pushback ([`BigQuery::retrying_pushback`]).
    pub(crate) async fn dry_run_query(&self, project: &str, location: Option<&str>, sql: &str) -> BigQueryResult<i64> {
        let statement = JobConfigurationQuery::new().set_query(sql).set_use_legacy_sql(false);
        let mut job = Job::new().set_configuration(JobConfiguration::new().set_dry_run(true).set_query(statement));
        if let Some(location) = location {
            job = job.set_job_reference(JobReference::new().set_project_id(project).set_location(location));
        }
        let insert = || self.jobs.insert_job().set_project_id(project).set_job(job.clone()).send();
        let job = rest_call(&self.quotas, "jobs.insert", insert).await?.map_err(BigQueryError::rest("jobs.insert"))?;
        if let Some(error) = job_error(&job) {
            return Err(error);
        }
        job_cost(&job)
            .bytes_processed
            .ok_or_else(|| BigQueryError::Inconsistent("the dry run answered no totalBytesProcessed".into()))
    }

    /// Waits up to `timeout` for the job to complete, with `jobs.getQueryResults` long polls
    /// (an answer that the job is still running starts the next poll at once). An answer other
    /// than a passing failure ends the wait: `jobs.get` then tells how it ended. A poll that
    /// failed in passing or was pushed back is retried by the driver after [`LONG_POLL_BACKOFF`],
    /// within the job's deadline.
    async fn wait_for_job(
        &self,
        project: &str,
        location: Option<&str>,
        job_id: &str,
        timeout: Duration,
    ) -> BigQueryResult<()> {
        let deadline = tokio::time::Instant::now() + timeout;
        // The deadline bounds the attempts.
        let policy = RetryPolicy {
            max_attempts: u32::MAX,
            backoff: LONG_POLL_BACKOFF,
            quota_wait: timeout,
            quota_backoff: LONG_POLL_BACKOFF,
        };
        let driver = RetryDriver::new(&policy, "jobs.getQueryResults").resource(job_id);
        let failure = |answer: &Poll| match answer {
            Poll::Failed(e) => Some(Failure::of(e)),
            _ => None,
        };
        loop {
            let poll = |_| self.poll_job(project, location, job_id, deadline);
            match driver.run(failure, poll).await {
                Poll::Complete => return Ok(()),
                Poll::Running => {}
                Poll::Failed(e) => return Err(e),
                Poll::Expired => {
                    return Err(BigQueryError::Timeout { operation: "query job", seconds: timeout.as_secs() });
                }
            }
        }
    }

    /// One `jobs.getQueryResults` long poll, waiting at most until `deadline`.
    async fn poll_job(
        &self,
        project: &str,
        location: Option<&str>,
        job_id: &str,
        deadline: tokio::time::Instant,
    ) -> Poll {
        let remaining = deadline.saturating_duration_since(tokio::time::Instant::now());
        if remaining.is_zero() {
            return Poll::Expired;
        }
        let wait_ms = remaining.min(LONG_POLL).as_millis() as u32;
        let poll = || {
            let request = self
                .jobs
                .get_query_results()
                .set_project_id(project)
                .set_job_id(job_id)
                .set_timeout_ms(wait_ms)
                .set_max_results(0u32);
            match location {
                Some(location) => request.set_location(location).send(),
                None => request.send(),
            }
        };
        match rest_call(&self.quotas, "jobs.getQueryResults", poll).await {
            Ok(Ok(answer)) if answer.job_complete.unwrap_or(false) => Poll::Complete,
            Ok(Ok(_)) => Poll::Running,
            Ok(Err(e)) if e.http_status_code() == Some(429) || super::error::is_quota(&e) => {
                Poll::Failed(BigQueryError::rest("jobs.getQueryResults")(e))
            }
            // The job failed, or cannot be read: jobs.get says which.
            Ok(Err(e)) if e.http_status_code().is_some_and(|status| status < 500) => Poll::Complete,
            Ok(Err(e)) => Poll::Failed(BigQueryError::rest("jobs.getQueryResults")(e)),
            Err(e) => Poll::Failed(e),
        }
    }

    /// The job already under `query`'s id (`jobs.insert` answered 409), when it is ours.
    async fn existing_job(&self, query: &QueryJob<'_>) -> BigQueryResult<Job> {
        let job = self.get_job(query.project, query.location, query.job_id).await?;
        match foreign_because(&job, query) {
            None => Ok(job),
            Some(why) => Err(BigQueryError::ForeignJob { job_id: query.job_id.to_string(), why }),
        }
    }

    pub(crate) async fn get_job(&self, project: &str, location: Option<&str>, job_id: &str) -> BigQueryResult<Job> {
        let get = || {
            let request = self.jobs.get_job().set_project_id(project).set_job_id(job_id);
            match location {
                Some(location) => request.set_location(location).send(),
                None => request.send(),
            }
        };
        let get =
            |_| async { rest_call(&self.quotas, "jobs.get", get).await?.map_err(BigQueryError::rest("jobs.get")) };
        self.retrying_pushback("jobs.get", get).await
    }
}

/// What one long poll found.
enum Poll {
    /// The job completed, or cannot be read (`jobs.get` tells which).
    Complete,
    /// The job is still running: poll again.
    Running,
    Failed(BigQueryError),
    /// The job's deadline passed.
    Expired,
}

/// Whether `outcome` is BigQuery's pushback on `jobs.insert` (the job was not created), which the
/// caller retries by running the job again; its [`Failure`] when it is.
pub(crate) fn insert_pushed_back<T>(outcome: &BigQueryResult<T>) -> Option<Failure> {
    match outcome {
        Err(e @ BigQueryError::Rest { operation: "jobs.insert", .. }) if RetryClass::of(e) == RetryClass::Pushback => {
            Some(Failure::pushback(e))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn query_job<'a>(sql: &'a str, recorded: &'a [String]) -> QueryJob<'a> {
        QueryJob {
            project: "p",
            location: None,
            job_id: "filament_r_e_d_t_full_append_0123",
            sql,
            labels: &[],
            maximum_bytes_billed: None,
            statement_byte_budget: None,
            timeout: Duration::from_secs(1),
            recorded_statements: recorded,
        }
    }

    fn existing(sql: &str, legacy: Option<bool>) -> Job {
        let query = JobConfigurationQuery::new().set_query(sql).set_or_clear_use_legacy_sql(legacy);
        Job::new().set_configuration(JobConfiguration::new().set_query(query))
    }

    #[test]
    fn a_job_running_our_statement_in_googlesql_is_ours() {
        let ours = "INSERT INTO `p`.`d`.`t` SELECT * FROM `p`.`d`.`_filament_stg_t_1`";
        assert_eq!(foreign_because(&existing(ours, Some(false)), &query_job(ours, &[])), None);
    }

    #[test]
    fn a_statement_recorded_under_the_id_by_an_earlier_delivery_is_ours() {
        let earlier = "INSERT INTO `p`.`d`.`t` SELECT * FROM `p`.`d`.`_filament_stg_t_1`";
        let now = "INSERT INTO `p`.`d`.`t` SELECT * FROM `p`.`d`.`_filament_stg_t_2`";
        let recorded = [statement_sha256(earlier)];
        assert_eq!(foreign_because(&existing(earlier, Some(false)), &query_job(now, &recorded)), None);
        assert!(foreign_because(&existing(earlier, Some(false)), &query_job(now, &[])).is_some());
    }

    #[test]
    fn anything_else_under_our_id_is_foreign() {
        let ours = "INSERT INTO `p`.`d`.`t` SELECT * FROM `p`.`d`.`s`";
        let recorded = [statement_sha256(ours)];
        let job = query_job(ours, &recorded);
        assert!(foreign_because(&existing("SELECT 1", Some(false)), &job).is_some(), "another statement");
        assert!(foreign_because(&existing(ours, Some(true)), &job).is_some(), "legacy SQL reads it otherwise");
        assert!(foreign_because(&existing(ours, None), &job).is_some(), "legacy SQL is jobs.insert's default");
        assert!(foreign_because(&Job::new(), &job).is_some(), "no configuration");
        let dry = Job::new().set_configuration(
            JobConfiguration::new()
                .set_dry_run(true)
                .set_query(JobConfigurationQuery::new().set_query(ours).set_use_legacy_sql(false)),
        );
        assert!(foreign_because(&dry, &job).is_some(), "a dry run ran nothing");
    }
}
