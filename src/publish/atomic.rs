//! Atomic publication (issue 58 item 4): an execution opened `atomic` publishes every
//! destination in one query job, a multi-statement transaction ([`sql::atomic_script`]) of
//! each resource's statement in the plan's order (tables in declaration order, a table's
//! resources in declaration order), so BigQuery changes every table or none.
//!
//! - **One job id and one fingerprint.** The job id is keyed like every publication's
//!   ([`job_id::atomic_job_id`]); the fingerprint is the SHA-256 of every resource's
//!   fingerprint in order. Each resource's publication record carries both, and a redelivery
//!   is decided from all of them together ([`decide_transaction`]): it reuses the job (the
//!   same resources and content, done), re-attaches to it (running) or is refused
//!   (`replay_mismatch`), as one table's publication is.
//! - **A failed transaction changed nothing**, so unlike one table's failed publication it does
//!   not refuse a redelivery: the next delivery submits its transaction under the next
//!   attempt's job id.
//! - **Retries**: a transaction BigQuery cancelled for a concurrent update (it cancels, never
//!   queues, conflicting transactions) fails in passing and runs again under the next
//!   attempt's id ([`decide::runs_again`], the publication retry policy).
//! - **What it may hold** ([`refusal`]): at most [`MAX_ATOMIC_TABLES`] tables, no
//!   `direct_append` (its rows are committed outside any job) and no `widen_columns` (DDL,
//!   which a transaction cannot hold). Checked when the execution opens and at every
//!   declaration of its run, never at publication.

use std::collections::BTreeSet;
use std::time::Duration;

use sha2::{Digest as _, Sha256};
use tokio::time::Instant;

use super::decide::{self, PublicationResult, PublishOutcome};
use super::destination::Effects;
use super::plan::{DestinationPlan, PlannedPublication};
use super::reconcile::Reconciled;
use super::{Publisher, job_id, sql};
use crate::bigquery::BigQueryError;
use crate::bigquery::error::Stage;
use crate::bigquery::jobs::{JobOutcome, QueryJob, statement_sha256};
use crate::bigquery::per_destination::ProjectLocation;
use crate::bigquery::retry::{Failure, RetryDriver};
use crate::error::{ErrorCode, Problem};
use crate::model::write_options::DeclaredPath;
use crate::model::{JobCost, PublicationState};
use crate::store::{Event, NewPublication, PublicationEnd, PublicationRecord, Publishing, ResourceRecord, RunRecord};
use crate::telemetry;

/// The most destination tables one BigQuery transaction may change.
pub(crate) const MAX_ATOMIC_TABLES: usize = 100;

/// Why `resources` (a run's declarations) cannot be published in one transaction
/// (`atomic_publication_unsupported`), or `None` when they can.
pub(crate) fn refusal(resources: &[ResourceRecord]) -> Option<Problem> {
    let tables: BTreeSet<&str> = resources.iter().map(|r| r.table_name.as_str()).collect();
    let named = |wanted: fn(&ResourceRecord) -> bool| {
        resources.iter().filter(|r| wanted(r)).map(|r| r.resource.to_string()).collect::<Vec<_>>()
    };
    let mut reasons = Vec::new();
    if tables.len() > MAX_ATOMIC_TABLES {
        reasons.push(format!("{} destination tables (at most {MAX_ATOMIC_TABLES})", tables.len()));
    }
    let direct = named(|r| r.write_options.write_path == DeclaredPath::Direct);
    if !direct.is_empty() {
        reasons.push(format!("direct_append, committed outside any query job ({})", direct.join(", ")));
    }
    let widened = named(|r| r.write_options.widen_columns);
    if !widened.is_empty() {
        reasons.push(format!("widen_columns, whose ALTER TABLE no transaction holds ({})", widened.join(", ")));
    }
    (!reasons.is_empty()).then(|| {
        Problem::new(
            ErrorCode::AtomicPublicationUnsupported,
            format!("an atomic execution publishes in one transaction, which cannot hold {}", reasons.join("; ")),
        )
        .with_hint("declare the resources without these options, split them across runs, or open the execution with atomic: false")
    })
}

/// What an atomic delivery publishing `planned` (resource names) under `fingerprint` does,
/// given every publication record of its execution, and the attempt a new job starts at:
///
/// | earlier records                                                    | decision          |
/// |--------------------------------------------------------------------|-------------------|
/// | none                                                               | submit, attempt 1 |
/// | all failed (a failed transaction changed nothing)                  | submit, the attempt after the last |
/// | one job, this fingerprint, exactly these resources, all done       | reuse it          |
/// | the same, some running                                             | re-attach to it   |
/// | anything else                                                      | `replay_mismatch` |
pub(super) fn decide_transaction(
    records: &[PublicationRecord],
    planned: &[&str],
    fingerprint: &str,
) -> (Reconciled, u32) {
    let Some(first) = records.first() else { return (Reconciled::Submit, 1) };
    if records.iter().all(|r| r.state == PublicationState::Failed) {
        let last = records.iter().map(|r| job_id::attempt_of(&r.job_id)).max().unwrap_or(0);
        return (Reconciled::Submit, last + 1);
    }
    let one_job = records
        .iter()
        .all(|r| r.job_id == first.job_id && r.fingerprint == fingerprint && r.state != PublicationState::Failed);
    let same_resources = records.len() == planned.len()
        && planned.iter().all(|resource| records.iter().any(|r| r.resource.to_string() == *resource));
    let job_id = first.job_id.clone();
    if one_job && same_resources {
        if records.iter().all(|r| r.state == PublicationState::Done) {
            return (Reconciled::Reuse { job_id }, 1);
        }
        let attempt = job_id::attempt_of(&job_id);
        return (Reconciled::Reattach { job_id }, attempt);
    }
    let problem = Problem::new(
        ErrorCode::ReplayMismatch,
        format!("this execution's transaction was already published by job {job_id} with other resources or content"),
    )
    .with_hint("a corrected load needs a new execution ID");
    (Reconciled::Refuse(problem), 1)
}

/// The transaction fingerprint and its decision for the delivery's `planned` publications
/// (each resource's fingerprint and key ranges, in order, for the statements).
pub(super) struct TransactionPlan {
    pub(super) fingerprint: String,
    pub(super) decision: Reconciled,
    pub(super) first_attempt: u32,
    pub(super) key_ranges: Vec<Vec<crate::model::key_ranges::KeyRange>>,
}

/// The fingerprint of the whole transaction: every resource's, in publication order.
fn transaction_fingerprint(fingerprints: &[(String, String)]) -> String {
    let mut hasher = Sha256::new();
    for (resource, fingerprint) in fingerprints {
        hasher.update(format!("{}:{resource}{}:{fingerprint}", resource.len(), fingerprint.len()).as_bytes());
    }
    hex::encode(hasher.finalize())
}

/// The transaction about to run: its script, the resources it publishes, under which
/// fingerprint, from which attempt.
struct Transaction<'a> {
    run: &'a RunRecord,
    publishing: &'a Publishing,
    resources: Vec<&'a ResourceRecord>,
    fingerprint: String,
    script: String,
    /// The job id an earlier delivery recorded (re-attaching), and the attempt to start at.
    recorded_job_id: Option<String>,
    first_attempt: u32,
}

impl Publisher {
    /// Publishes every planned publication of the delivery in one transaction; each resource's
    /// result is the transaction's.
    pub(super) async fn publish_atomic(
        &self,
        run: &RunRecord,
        publishing: &Publishing,
        plans: Vec<DestinationPlan<'_>>,
    ) -> Vec<PublicationResult> {
        let planned: Vec<PlannedPublication<'_>> =
            plans.iter().flat_map(|destination| destination.publications.iter().copied()).collect();
        let outcome = self.publish_transaction(run, publishing, &planned).await;
        planned
            .iter()
            .map(|p| PublicationResult {
                resource: p.resource.resource.clone(),
                staging_table: p.staged.and_then(|report| report.write_path.staging_table()).map(str::to_string),
                outcome: outcome.clone(),
            })
            .collect()
    }

    /// The transaction's fingerprint and what this delivery does with it
    /// ([`decide_transaction`] over every publication record of the execution).
    pub(super) async fn transaction_plan(
        &self,
        run: &RunRecord,
        delivery: &crate::model::DeliveryRef,
        planned: &[PlannedPublication<'_>],
    ) -> Result<TransactionPlan, Problem> {
        let mut fingerprints = Vec::with_capacity(planned.len());
        let mut key_ranges = Vec::with_capacity(planned.len());
        for publication in planned {
            let (fingerprint, ranges) = Self::fingerprint(run, *publication)?;
            fingerprints.push((publication.resource.resource.to_string(), fingerprint));
            key_ranges.push(ranges);
        }
        let fingerprint = transaction_fingerprint(&fingerprints);
        let records = self.store.list_publications(&delivery.execution).await?;
        let names: Vec<&str> = fingerprints.iter().map(|(resource, _)| resource.as_str()).collect();
        let (decision, first_attempt) = decide_transaction(&records, &names, &fingerprint);
        Ok(TransactionPlan { fingerprint, decision, first_attempt, key_ranges })
    }

    async fn publish_transaction(
        &self,
        run: &RunRecord,
        publishing: &Publishing,
        planned: &[PlannedPublication<'_>],
    ) -> Result<PublishOutcome, Problem> {
        if planned.is_empty() {
            return Ok(PublishOutcome::Done);
        }
        let delivery = publishing.delivery();
        let TransactionPlan { fingerprint, decision, first_attempt, key_ranges } =
            self.transaction_plan(run, delivery, planned).await?;
        let recorded_job_id = match decision {
            Reconciled::Submit => None,
            Reconciled::Reattach { job_id } => Some(job_id),
            Reconciled::Reuse { .. } => {
                telemetry::publication_ended("reused");
                return Ok(PublishOutcome::Done);
            }
            Reconciled::Refuse(problem) => return Err(problem),
        };
        let mut statements = Vec::with_capacity(planned.len());
        for (publication, ranges) in planned.iter().zip(&key_ranges) {
            let statement = self.statement(run, delivery, *publication, ranges, Effects::PrepareDestination).await?;
            statements.extend(statement.map(|statement| statement.sql));
        }
        if statements.is_empty() {
            return Ok(PublishOutcome::Done);
        }
        let script = sql::atomic_script(statements.iter().map(String::as_str));
        let resources = planned.iter().map(|p| p.resource).collect();
        let transaction =
            Transaction { run, publishing, resources, fingerprint, script, recorded_job_id, first_attempt };
        self.run_transaction(&transaction).await
    }

    /// Runs the transaction's job, again under the next attempt's id while
    /// [`decide::runs_again`] says it may, and records how it ended for every resource.
    async fn run_transaction(&self, transaction: &Transaction<'_>) -> Result<PublishOutcome, Problem> {
        let digest = statement_sha256(&transaction.script);
        let delivery = transaction.publishing.delivery();
        let dataset = &transaction.run.destination.dataset;
        let attempt = |n: u32| {
            let job_id = match (n, &transaction.recorded_job_id) {
                (1, Some(recorded)) => recorded.clone(),
                _ => job_id::atomic_job_id(&self.job_ids, delivery, dataset, transaction.first_attempt + n - 1),
            };
            self.transaction_attempt(transaction, job_id, &digest)
        };
        let runs_again = |answer: &Result<(String, Result<JobOutcome, BigQueryError>, Duration), Problem>| match answer
        {
            Ok((_, Err(e), _)) if decide::runs_again(e) => Some(Failure::of(e)),
            _ => None,
        };
        let driver = RetryDriver::new(&self.retry, "query job").resource("atomic");
        let (job_id, outcome, duration) = driver.run(runs_again, attempt).await?;
        self.record_transaction(transaction, &job_id, outcome, duration).await
    }

    /// One attempt: every resource's publication recorded under its job id, the fingerprint
    /// and the script's digest, then the job submitted under the adaptive publication limit.
    async fn transaction_attempt(
        &self,
        transaction: &Transaction<'_>,
        job_id: String,
        digest: &str,
    ) -> Result<(String, Result<JobOutcome, BigQueryError>, Duration), Problem> {
        let (run, delivery) = (transaction.run, transaction.publishing.delivery());
        let mut recorded_statements = Vec::new();
        for resource in &transaction.resources {
            let destination = format!("{}.{}", run.destination.dataset, resource.table_name);
            let record = NewPublication {
                delivery,
                resource: &resource.resource,
                destination: &destination,
                job_id: &job_id,
                fingerprint: &transaction.fingerprint,
                committed_streams: None,
                statement_sha256: Some(digest),
            };
            for digest in self.store.begin_publication(&record).await? {
                if !recorded_statements.contains(&digest) {
                    recorded_statements.push(digest);
                }
            }
        }
        tracing::info!(run_id = %delivery.run_id(), execution_id = %delivery.execution_id(), %job_id,
            resources = transaction.resources.len(), "bigquery.write.publish.atomic_started");
        let labels = job_id::run_job_labels(job_id::JobKind::Publication, run, delivery, "atomic");
        let query = QueryJob {
            project: run.job_project.as_deref().unwrap_or(&run.destination.project),
            location: run.destination.location(),
            job_id: &job_id,
            sql: &transaction.script,
            labels: &labels,
            // Each statement within the run's per-publication budget, the whole transaction
            // within its per-execution budget (as the plan judged them).
            maximum_bytes_billed: run.maximum_bytes_billed_per_execution,
            statement_byte_budget: run.maximum_bytes_billed,
            timeout: self.query_job_timeout,
            recorded_statements: &recorded_statements,
        };
        let project_location = ProjectLocation::new(query.project, run.destination.location());
        let started = Instant::now();
        let outcome =
            self.publications.run(&project_location, self.bigquery.tenant(), self.bigquery.run_query_job(&query)).await;
        Ok((job_id, outcome, started.elapsed()))
    }

    /// Records how the transaction's last attempt ended, for every resource it publishes: done
    /// (its cost on the first resource, so the execution's sum counts it once), unfinished
    /// (the records stay running: a redelivery re-attaches) or failed.
    async fn record_transaction(
        &self,
        transaction: &Transaction<'_>,
        job_id: &str,
        outcome: Result<JobOutcome, BigQueryError>,
        duration: Duration,
    ) -> Result<PublishOutcome, Problem> {
        let delivery = transaction.publishing.delivery();
        let duration_ms = duration.as_millis() as u64;
        let no_cost = JobCost::default();
        match outcome {
            Ok(outcome) => {
                for (i, resource) in transaction.resources.iter().enumerate() {
                    let (rows_affected, cost) =
                        if i == 0 { (outcome.rows_affected, &outcome.cost) } else { (None, &no_cost) };
                    let bytes_billed = cost.bytes_billed;
                    let finished = Event::PublicationFinished { job_id, duration_ms, rows_affected, bytes_billed };
                    let done = PublicationEnd::Done { rows_affected, cost };
                    self.store.finish_publication(delivery, &resource.resource, done, Some(finished)).await?;
                }
                telemetry::publication_ended("done");
                Ok(PublishOutcome::Done)
            }
            Err(e) if e.is_retryable() => {
                tracing::warn!(run_id = %delivery.run_id(), execution_id = %delivery.execution_id(), %job_id,
                    error = %e, "lost track of the atomic publication job; a redelivery re-attaches to it");
                telemetry::publication_ended("unfinished");
                Ok(PublishOutcome::Unfinished(e.problem(Stage::Publication)))
            }
            Err(e) => {
                let problem = e.problem(Stage::Publication);
                let (code, hint) = (problem.code, problem.hint.as_deref());
                for resource in &transaction.resources {
                    let failed = Event::PublicationFailed { job_id, duration_ms, code, hint };
                    let end = PublicationEnd::Failed(&problem);
                    self.store.finish_publication(delivery, &resource.resource, end, Some(failed)).await?;
                }
                telemetry::publication_ended("failed");
                match e {
                    BigQueryError::ForeignJob { .. } => Ok(PublishOutcome::ForeignJob(problem)),
                    _ => Err(problem),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::WriteMode;
    use crate::model::write_options::WriteOptions;

    fn resource(name: &str, table: &str, options: WriteOptions) -> ResourceRecord {
        ResourceRecord {
            resource: name.parse().unwrap(),
            table_name: table.into(),
            write_mode: WriteMode::FullAppend,
            primary_key: vec![],
            table_options: None,
            write_options: options,
            layout_mismatch: None,
        }
    }

    #[test]
    fn a_transaction_holds_a_hundred_tables_and_no_direct_append_or_widening() {
        let hundred: Vec<ResourceRecord> =
            (0..100).map(|i| resource(&format!("r{i}"), &format!("t{i}"), WriteOptions::default())).collect();
        assert!(refusal(&hundred).is_none());
        // Two resources into one table are one table.
        let mut shared = hundred.clone();
        shared.push(resource("again", "t0", WriteOptions::default()));
        assert!(refusal(&shared).is_none());
        let mut over = hundred.clone();
        over.push(resource("r100", "t100", WriteOptions::default()));
        let problem = refusal(&over).expect("101 tables");
        assert_eq!(problem.code, ErrorCode::AtomicPublicationUnsupported);
        assert!(problem.detail.contains("101 destination tables (at most 100)"), "{}", problem.detail);
        let direct =
            resource("events", "events", WriteOptions { write_path: DeclaredPath::Direct, ..WriteOptions::default() });
        let widened = resource("wide", "wide", WriteOptions { widen_columns: true, ..WriteOptions::default() });
        let detail = refusal(&[direct, widened]).expect("refused").detail;
        assert!(detail.contains("direct_append, committed outside any query job (events)"), "{detail}");
        assert!(detail.contains("widen_columns, whose ALTER TABLE no transaction holds (wide)"), "{detail}");
    }

    fn record(resource: &str, job_id: &str, fingerprint: &str, state: PublicationState) -> PublicationRecord {
        PublicationRecord {
            resource: resource.parse().unwrap(),
            destination: format!("raw.{resource}"),
            job_id: job_id.into(),
            fingerprint: fingerprint.into(),
            state,
            rows_affected: None,
            error: None,
            cost: JobCost::default(),
            committed_streams: None,
        }
    }

    #[test]
    fn a_redelivery_is_decided_from_every_record_of_the_transaction() {
        use PublicationState::{Done, Failed, Running};
        let decide = |records: &[PublicationRecord], planned: &[&str]| decide_transaction(records, planned, "f");
        assert_eq!(decide(&[], &["a", "b"]), (Reconciled::Submit, 1));
        let both = |state_a, state_b| [record("a", "j", "f", state_a), record("b", "j", "f", state_b)];
        assert_eq!(decide(&both(Done, Done), &["a", "b"]), (Reconciled::Reuse { job_id: "j".into() }, 1));
        assert_eq!(decide(&both(Done, Running), &["a", "b"]), (Reconciled::Reattach { job_id: "j".into() }, 1));
        let retried = [record("a", "j-a3", "f", Running), record("b", "j-a3", "f", Running)];
        assert_eq!(decide(&retried, &["a", "b"]), (Reconciled::Reattach { job_id: "j-a3".into() }, 3));
        // A failed transaction changed nothing: the next runs under the attempt after the last.
        let failed = [record("a", "j-a2", "other", Failed), record("b", "j-a2", "other", Failed)];
        assert_eq!(decide(&failed, &["a", "b", "c"]), (Reconciled::Submit, 3));
        let mismatch = |records: &[PublicationRecord], planned: &[&str]| matches!(decide(records, planned).0, Reconciled::Refuse(p) if p.code == ErrorCode::ReplayMismatch);
        // A resource the earlier transaction did not publish, one it did that is not planned
        // now, other content, a mixture of jobs or of outcomes: never taken as published.
        assert!(mismatch(&[record("b", "j", "f", Done)], &["a", "b"]));
        assert!(mismatch(&both(Done, Done), &["a"]));
        assert!(mismatch(&[record("a", "j", "g", Done), record("b", "j", "g", Done)], &["a", "b"]));
        assert!(mismatch(&[record("a", "j", "f", Done), record("b", "k", "f", Done)], &["a", "b"]));
        assert!(mismatch(&both(Done, Failed), &["a", "b"]));
    }

    #[test]
    fn the_transaction_fingerprint_covers_every_resource_in_order() {
        let pair = |a: &str, b: &str| vec![("a".to_string(), a.to_string()), ("b".to_string(), b.to_string())];
        let one = transaction_fingerprint(&pair("1", "2"));
        assert_eq!(one, transaction_fingerprint(&pair("1", "2")));
        assert_ne!(one, transaction_fingerprint(&pair("1", "3")));
        assert_ne!(one, transaction_fingerprint(&pair("2", "1")));
        assert_eq!(one.len(), 64);
    }
}
