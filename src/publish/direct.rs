//! Publishing a `direct_append` resource: its lane wrote a PENDING stream into the destination
//! table itself (`pipeline::lane::write_path`), finalized before the barrier; publishing is
//! committing that stream with `BatchCommitWriteStreams`, atomic per table. No staging table,
//! no query job, nothing billed.
//!
//! Exactly once: the streams about to be committed are recorded in the publication (with the
//! fingerprint) before the call, and the outcome after it. A commit whose answer was lost is
//! resolved by asking BigQuery whether the stream shows a commit time. A redelivery that finds
//! the publication done reuses it ([`super::reconcile`]); one that finds it running (the
//! replica stopped while committing) commits the recorded streams, which BigQuery commits at
//! most once, and only when none of them can be committed any more (never committed, now
//! garbage) commits its own.

use tokio::time::Instant;

use super::Publisher;
use super::decide::PublishOutcome;
use crate::bigquery::error::Stage;
use crate::bigquery::write::CommitOutcome;
use crate::bigquery::{BigQueryError, table_path};
use crate::error::{ErrorCode, Problem};
use crate::model::JobCost;
use crate::model::staging::WritePath;
use crate::pipeline::LaneReport;
use crate::store::{Event, NewPublication, PublicationEnd, Publishing, ResourceRecord, RunRecord};
use crate::telemetry;

/// What a direct append's publication record names in place of a query job id: the call that
/// publishes (its streams are in `committed_streams`).
pub(crate) const DIRECT_APPEND_JOB_ID: &str = "BatchCommitWriteStreams";

/// One direct append's publication: what it commits, for which delivery and resource.
pub(super) struct DirectPublication<'a> {
    pub(super) run: &'a RunRecord,
    /// The store's proof that the delivery is publishing.
    pub(super) publishing: &'a Publishing,
    pub(super) resource: &'a ResourceRecord,
    pub(super) fingerprint: &'a str,
    /// This delivery's stream into the destination, when its lane wrote one.
    pub(super) staged: Option<&'a LaneReport>,
    /// The streams an earlier delivery recorded and was committing when it stopped.
    pub(super) earlier_streams: Option<&'a [String]>,
}

/// How committing some streams ended.
enum StreamsCommit {
    Committed,
    /// BigQuery refused them and shows none committed: nothing changed.
    NotCommitted(String),
    /// The answer was lost and BigQuery could not be asked: a redelivery finds out.
    Unknown(BigQueryError),
}

impl Publisher {
    /// Commits the earlier delivery's recorded streams, or this delivery's, into the destination.
    pub(super) async fn publish_direct(&self, publication: &DirectPublication<'_>) -> Result<PublishOutcome, Problem> {
        let (name, delivery) = (&publication.resource.resource, publication.publishing.delivery());
        if let Some(earlier) = publication.earlier_streams {
            match self.commit_recorded(publication, earlier, None).await? {
                StreamsCommit::Committed => return Ok(PublishOutcome::Done),
                StreamsCommit::Unknown(lost) => return Ok(unfinished(lost)),
                StreamsCommit::NotCommitted(why) => {
                    tracing::info!(run_id = %delivery.run_id(), execution_id = %delivery.execution_id(),
                        resource = %name, reason = %why,
                        "the earlier delivery's streams were never committed; committing this delivery's");
                }
            }
        }
        let Some(report @ LaneReport { write_path: WritePath::Direct, .. }) = publication.staged else {
            // An earlier delivery wrote directly and this one through staging (the table
            // changed in between), and the earlier streams were never committed: this
            // delivery's rows sit in a staging table no job is planned to read.
            return Err(Problem::new(
                ErrorCode::PublicationFailed,
                format!("resource {name}: an earlier delivery wrote directly and this one through staging"),
            )
            .with_hint("nothing of this execution was published; load it again under a new execution ID"));
        };
        let streams = [report.stream_name.clone()];
        match self.commit_recorded(publication, &streams, Some(report.rows_acknowledged)).await? {
            StreamsCommit::Committed => Ok(PublishOutcome::Done),
            StreamsCommit::Unknown(lost) => Ok(unfinished(lost)),
            StreamsCommit::NotCommitted(why) => {
                let problem = Problem::new(
                    ErrorCode::UploadFailed,
                    format!("resource {name}: BigQuery refused to commit the stream into the destination: {why}"),
                );
                self.store.finish_publication(delivery, name, PublicationEnd::Failed(&problem), None).await?;
                telemetry::publication_ended("failed");
                Err(problem)
            }
        }
    }

    /// Records `streams` in the publication, commits them and records a commit (`rows`: what
    /// they hold, when known).
    async fn commit_recorded(
        &self,
        publication: &DirectPublication<'_>,
        streams: &[String],
        rows: Option<i64>,
    ) -> Result<StreamsCommit, Problem> {
        let DirectPublication { run, publishing, resource, fingerprint, .. } = publication;
        let delivery = publishing.delivery();
        let destination = format!("{}.{}", run.destination.dataset, resource.table_name);
        let record = NewPublication {
            delivery,
            resource: &resource.resource,
            destination: &destination,
            job_id: DIRECT_APPEND_JOB_ID,
            fingerprint,
            committed_streams: Some(streams),
            statement_sha256: None,
        };
        self.store.begin_publication(&record).await?;
        let name = &resource.resource;
        tracing::info!(run_id = %delivery.run_id(), execution_id = %delivery.execution_id(), resource = %name,
            streams = streams.len(), "bigquery.write.publish.started");
        let started = Instant::now();
        let path = table_path(&run.destination.project, &run.destination.dataset, &resource.table_name);
        let outcome = self.commit_streams(&path, streams).await;
        if let StreamsCommit::Committed = outcome {
            let duration_ms = started.elapsed().as_millis() as u64;
            let job_id = DIRECT_APPEND_JOB_ID;
            let finished =
                Event::PublicationFinished { job_id, duration_ms, rows_affected: rows, bytes_billed: Some(0) };
            let done = PublicationEnd::Done { rows_affected: rows, cost: &JobCost::default() };
            self.store.finish_publication(delivery, name, done, Some(finished)).await?;
            telemetry::publication_ended("done");
        }
        Ok(outcome)
    }

    /// `BatchCommitWriteStreams` of `streams` into the table at `path`. A refusal or a lost
    /// answer is told apart from a commit by the first stream's commit time (the commit is all
    /// or nothing: one committed stream means all were).
    async fn commit_streams(&self, path: &str, streams: &[String]) -> StreamsCommit {
        let writer = self.bigquery.writer();
        let refused = match writer.batch_commit(path, streams.to_vec()).await {
            Ok(CommitOutcome::Committed) => return StreamsCommit::Committed,
            Ok(CommitOutcome::Rejected(errors)) => Ok(errors.join("; ")),
            Err(e) if e.is_retryable() => Err(e),
            Err(e) => Ok(e.to_string()),
        };
        let Some(first) = streams.first() else { return StreamsCommit::Committed };
        match writer.is_committed(first).await {
            Ok(true) => StreamsCommit::Committed,
            Ok(false) => match refused {
                Ok(why) => StreamsCommit::NotCommitted(why),
                Err(lost) => StreamsCommit::Unknown(lost),
            },
            Err(e) => StreamsCommit::Unknown(e),
        }
    }
}

/// A commit whose outcome is unknown: the publication stays running, and a redelivery asks
/// about its recorded streams.
fn unfinished(lost: BigQueryError) -> PublishOutcome {
    telemetry::publication_ended("unfinished");
    PublishOutcome::Unfinished(lost.problem(Stage::Publication))
}
