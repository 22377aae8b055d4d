//! One delivery's commit, top to bottom, in the order the product promises:
//!
//! 1. **Staging.** Each lane drains (every row uploaded); as soon as it has, its PENDING stream
//!    is finalized (the row count checked against what was appended) and committed to its
//!    staging table, at most `max_concurrent_publications` streams at once. A `direct_append`
//!    stream is only finalized: it writes into the destination, and its commit is the
//!    publication. No destination changes. The first failure cancels the lanes still uploading.
//! 2. **The barrier.** Only when every lane has drained and every stream is committed is each
//!    publication's statement dry-run and the priced plan recorded and judged against the run's
//!    byte budgets ([`super::pricing`]), and then the delivery marked publishing (the point of
//!    no return, refused when an abort or a lane's failure came first). A failure (an
//!    over-budget plan included) or an abort before it publishes nothing, and every staging
//!    table of the delivery is deleted (no job will read them).
//! 3. **Publication.** At most `max_concurrent_publications` destination tables at once, each
//!    running its resources' publications in declaration order ([`super::destination`]), every
//!    query job under the adaptive publication limit.
//! 4. **The end** ([`decide::publications_ended`]): staging tables deleted except those a job
//!    may still read, and the delivery committed, or failed naming every failed resource.
//!
//! A commit asked to hold ([`CommitThrough::Barrier`]) stops at the barrier instead: what the
//! next commit needs of each stream is recorded and the delivery moved to `staged`, nothing
//! published, its staging tables kept (also when its plan is over the run's budgets: the
//! `staged` event says so, and the next commit fails on it). The next commit, on any replica,
//! takes the staged streams from the store (neither finalized nor committed again) and goes on
//! from the plan, priced again against the destinations as they are then.

use parking_lot::Mutex;

use futures::StreamExt as _;

use super::decide::{self, CommitVerdict};
use super::lifecycle::CommitThrough;
use super::plan::{self, DestinationPlan};
use super::{Committing, Publisher};
use crate::bigquery::error::Stage;
use crate::bigquery::write::CommitOutcome;
use crate::bigquery::{BigQueryError, table_path};
use crate::error::{ErrorCode, Problem};
use crate::model::staging::WritePath;
use crate::model::{DeliveryRef, ExecutionState};
use crate::pipeline::{LaneDrain, LaneReport};
use crate::store::{Event, ExecutionRecord, Publishing, RunRecord, StreamChange, StreamToKeep};
use crate::telemetry::{self, PhaseTiming};

/// How a commit that did not fail ended.
enum CommitEnd {
    /// Every destination was published.
    Committed,
    /// The delivery stopped committing (an abort, or a lane that failed it) before the barrier:
    /// no destination changed, and the record that stopped it stands.
    StoppedBeforePublishing,
    /// Held at the barrier, as asked: `staged`.
    Held,
}

/// A lane's part in the staging phase.
enum ToStage {
    /// A lane (here, or a stream a replica that shut down handed over) whose stream is to be
    /// finalized and committed once drained.
    Draining(LaneDrain),
    /// A stream an earlier, held commit of the delivery staged.
    Staged(LaneReport),
}

/// The first failure of the staging phase, in time (the lanes it cancels fail after it, for
/// that reason only).
#[derive(Default)]
struct FirstFailure(Mutex<Option<Problem>>);

impl FirstFailure {
    fn record(&self, problem: Problem) {
        self.0.lock().get_or_insert(problem);
    }

    fn take(self) -> Option<Problem> {
        self.0.into_inner()
    }
}

impl Publisher {
    /// Commits one delivery [`Self::begin_commit`] moved to `committing`. Any failure fails the
    /// execution with its problem; the terminal record is returned either way.
    pub(crate) async fn commit(&self, committing: Committing) -> Result<ExecutionRecord, Problem> {
        let Committing { run, execution, through } = committing;
        let run = &run;
        let delivery = execution.delivery_ref();
        let result = self.commit_inner(run, &execution, through).await;
        self.pipeline.forget(&delivery.execution, delivery.delivery);
        let ends_here = matches!(result, Ok(CommitEnd::Committed));
        let held = matches!(result, Ok(CommitEnd::Held));
        let record = match result {
            Ok(CommitEnd::Committed) => self.store.mark_committed(&delivery).await?,
            Ok(CommitEnd::StoppedBeforePublishing | CommitEnd::Held) => None,
            Err(problem) => {
                tracing::warn!(run_id = %run.run_id, execution_id = %execution.execution_id, code = %problem.code,
                    detail = %problem.detail, cause = problem.cause.as_deref(), "commit failed");
                // Refused (`None`) when an abort or a lane's failure was recorded first: it stands.
                self.store.fail_execution(&delivery, &problem).await?
            }
        };
        let record = match record {
            Some(record) => record,
            None => self
                .store
                .get_execution(&delivery.execution)
                .await?
                .ok_or_else(|| Problem::not_found(&delivery.execution))?,
        };
        if !(held && record.state == ExecutionState::Staged) {
            telemetry::execution_finished(record.state.as_str());
        }
        if ends_here && record.state == ExecutionState::Committed {
            self.store.record_event(&delivery, None, Event::Ended { state: record.state }).await;
        }
        Ok(record)
    }

    async fn commit_inner(
        &self,
        run: &RunRecord,
        execution: &ExecutionRecord,
        through: CommitThrough,
    ) -> Result<CommitEnd, Problem> {
        let delivery = &execution.delivery_ref();
        let lanes = match execution.staged_at {
            Some(_) => self.staged_lanes(delivery).await?,
            None => self.lanes_to_stage(delivery).await?,
        };
        let declared = self.store.list_resources_by_declaration(&run.run_id).await?;
        let continuing = self.store.continuing_resources(&delivery.execution).await?;
        let completes_snapshot =
            execution.completes_snapshot() && !self.store.snapshot_completed_elsewhere(&delivery.execution).await?;
        let (mut reports, first_failure) = self.stage(run, delivery, lanes).await;
        reports.sort_by(|a, b| a.resource.cmp(&b.resource));
        // Read once: the plan's pricing and the publication fingerprint from it.
        let commit_inputs = match first_failure {
            Some(_) => Ok(Default::default()),
            None => self.store.commit_inputs(delivery).await.map_err(Problem::from),
        };
        let planned = match (first_failure, &commit_inputs) {
            (Some(problem), _) => Err(problem),
            (None, Err(problem)) => Err(problem.clone()),
            (None, Ok(inputs)) => plan::plan(&declared, &reports, inputs, &continuing, completes_snapshot),
        };
        let planned = match planned {
            Ok(plans) => self.price_within_budget(run, delivery, &plans, execution.atomic).await.map(|_priced| plans),
            Err(problem) => Err(problem),
        };
        if through == CommitThrough::Barrier {
            match &planned {
                Ok(_) => return self.hold(run, delivery, &reports, None).await,
                Err(problem) if problem.code == ErrorCode::PublicationTooExpensive => {
                    return self.hold(run, delivery, &reports, Some(&problem.detail)).await;
                }
                Err(_) => {}
            }
        }
        let plans = match planned {
            Ok(plans) => plans,
            Err(problem) => {
                let verdict = decide::failed_before_publishing(problem, self.staging_tables(delivery).await);
                // Always the failure: nothing was published.
                return self.end(run, verdict).await.map(|()| CommitEnd::StoppedBeforePublishing);
            }
        };
        // The barrier: everything is staged. An abort (or a lane's failure) that came first wins,
        // and then there is no proof to publish with.
        let Some(publishing) = self.store.begin_publishing(delivery).await? else {
            let staging_tables = self.staging_tables(delivery).await;
            self.delete_staging_tables(run, staging_tables).await;
            return Ok(CommitEnd::StoppedBeforePublishing);
        };
        let results = if execution.atomic {
            self.publish_atomic(run, &publishing, plans).await
        } else {
            self.publish_all(run, &publishing, plans).await
        };
        self.end(run, decide::publications_ended(results)).await.map(|()| CommitEnd::Committed)
    }

    /// Stops a commit asked to hold at the barrier: records what the next commit needs of each
    /// stream and moves the delivery to `staged` (`over_budget`: why that commit would fail).
    /// When an abort came first, the staging tables are deleted as for any stop.
    async fn hold(
        &self,
        run: &RunRecord,
        delivery: &DeliveryRef,
        reports: &[LaneReport],
        over_budget: Option<&str>,
    ) -> Result<CommitEnd, Problem> {
        let streams: Vec<StreamToKeep<'_>> = reports
            .iter()
            .map(|report| StreamToKeep {
                resource: &report.resource,
                rows_acknowledged: report.rows_acknowledged,
                destination_columns: &report.destination_columns,
            })
            .collect();
        if self.store.stage_delivery(delivery, &streams).await?.is_none() {
            let staging_tables = self.staging_tables(delivery).await;
            self.delete_staging_tables(run, staging_tables).await;
            return Ok(CommitEnd::StoppedBeforePublishing);
        }
        self.store.record_event(delivery, None, Event::Staged { over_budget }).await;
        tracing::info!(run_id = %run.run_id, execution_id = %delivery.execution_id(), streams = reports.len(),
            over_budget = over_budget.is_some(), "execution.staged");
        Ok(CommitEnd::Held)
    }

    /// The delivery's lanes here, and the streams a replica that shut down handed over for
    /// resources without a lane here (already drained).
    async fn lanes_to_stage(&self, delivery: &DeliveryRef) -> Result<Vec<ToStage>, Problem> {
        let lanes = self.pipeline.drain_each(&delivery.execution, delivery.delivery);
        let handed_over = self.store.handed_over_streams(delivery).await?;
        let with_lane: std::collections::HashSet<_> = lanes.iter().map(|(resource, _)| resource.clone()).collect();
        let ready = handed_over.into_iter().filter(|stream| !with_lane.contains(&stream.resource)).map(|stream| {
            let report: LaneReport = stream.into();
            ToStage::Draining(Box::pin(std::future::ready(Ok(report))))
        });
        Ok(lanes.into_iter().map(|(_, drained)| ToStage::Draining(drained)).chain(ready).collect())
    }

    /// The streams a held commit of the delivery staged, as its next commit takes them.
    async fn staged_lanes(&self, delivery: &DeliveryRef) -> Result<Vec<ToStage>, Problem> {
        let streams = self.store.staged_streams(delivery).await?;
        Ok(streams.into_iter().map(|staged| ToStage::Staged(staged.into())).collect())
    }

    /// Staging: awaits every lane, finalizing and committing each stream as soon as its lane
    /// has drained. The reports of the streams committed, and the first failure (which cancels
    /// the lanes still uploading).
    async fn stage(
        &self,
        run: &RunRecord,
        delivery: &DeliveryRef,
        lanes: Vec<ToStage>,
    ) -> (Vec<LaneReport>, Option<Problem>) {
        let stream_commits = tokio::sync::Semaphore::new(self.max_concurrent_publications);
        let first_failure = FirstFailure::default();
        let staged = lanes.into_iter().map(|lane| async {
            let staged = async {
                let drained = match lane {
                    ToStage::Draining(drained) => drained,
                    ToStage::Staged(report) => return Ok(report),
                };
                let report = drained.await?;
                let _slot = stream_commits.acquire().await.map_err(|_| Problem::internal("stream commits closed"))?;
                self.commit_stream(run, delivery, &report).await?;
                Ok::<_, Problem>(report)
            };
            // Boxed: the future is large, and a thousand of them by value overflow debug stacks.
            let staged = Box::pin(staged).await;
            if let Err(problem) = &staged {
                first_failure.record(problem.clone());
                self.pipeline.cancel(&delivery.execution);
            }
            staged.ok()
        });
        let reports = futures::future::join_all(staged).await.into_iter().flatten().collect();
        (reports, first_failure.take())
    }

    /// Finalize (row count must match what was appended), then commit the stream. A commit whose
    /// answer was lost is resolved by asking BigQuery whether the stream shows a commit time.
    async fn commit_stream(&self, run: &RunRecord, delivery: &DeliveryRef, report: &LaneReport) -> Result<(), Problem> {
        let writer = self.bigquery.writer();
        let upload_failed = |e: BigQueryError| e.problem(Stage::Upload);
        let timing = |phase, started: tokio::time::Instant| PhaseTiming {
            resource: &report.resource,
            phase,
            duration: started.elapsed(),
        };
        let started = tokio::time::Instant::now();
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
        let staging_table = match &report.write_path {
            WritePath::Staging { staging_table } => staging_table,
            // Committed into the destination at publication, after the barrier.
            WritePath::Direct => return Ok(self.store.set_stream_finalized(&resource, row_count).await?),
        };
        let path = table_path(&run.destination.project, &run.destination.dataset, staging_table);
        let started = tokio::time::Instant::now();
        let committed = writer.batch_commit(&path, vec![report.stream_name.clone()]).await;
        timing("commit", started).emit();
        match committed {
            Ok(CommitOutcome::Committed) => {}
            Ok(CommitOutcome::Rejected(errors)) => {
                let detail = format!(
                    "resource {}: BigQuery refused to commit the stream: {}",
                    report.resource,
                    errors.join("; ")
                );
                return Err(Problem::new(ErrorCode::UploadFailed, detail));
            }
            Err(e) if e.is_retryable() => {
                if !writer.is_committed(&report.stream_name).await.map_err(upload_failed)? {
                    return Err(upload_failed(e));
                }
            }
            Err(e) => return Err(upload_failed(e)),
        }
        let committed = StreamChange::Committed { stream_name: &report.stream_name, rows: row_count };
        self.store.change_stream(&resource, committed).await?;
        Ok(())
    }

    /// Publication of the delivery the store moved to publishing (`publishing`, the proof): at
    /// most `max_concurrent_publications` destination tables at once, each one's publications
    /// in declaration order.
    async fn publish_all(
        &self,
        run: &RunRecord,
        publishing: &Publishing,
        plans: Vec<DestinationPlan<'_>>,
    ) -> Vec<decide::PublicationResult> {
        // Collected first: a lazily mapped stream's closure is not `Send` for every lifetime.
        let tables: Vec<_> = plans
            .into_iter()
            .map(|destination| Box::pin(self.publish_destination(run, publishing, destination)))
            .collect();
        let results: Vec<Vec<decide::PublicationResult>> =
            futures::stream::iter(tables).buffer_unordered(self.max_concurrent_publications).collect().await;
        results.into_iter().flatten().collect()
    }

    /// Deletes the staging tables the verdict names and returns its end.
    async fn end(&self, run: &RunRecord, verdict: CommitVerdict) -> Result<(), Problem> {
        self.delete_staging_tables(run, verdict.delete_staging_tables).await;
        verdict.end
    }
}
