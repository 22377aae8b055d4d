//! Upload, finalization and publication overlapped per destination table: each table waits for
//! its own lanes to drain, finalizes and commits its own streams, then publishes at once, while
//! the other tables still upload or finalize (in a run of a thousand small tables the first job
//! starts long before the last stream is created).
//!
//! What a failure changes:
//! - A lane or a stream that fails stops every table that has not begun publishing. Tables
//!   already publishing finish, and the execution fails with the first failure, naming the
//!   resources whose destinations changed. Each one's publication record (done, with its
//!   fingerprint) says so too. A redelivery skips those whose fingerprint matches and
//!   publishes the rest.
//! - When every lane and stream succeeds, or the failure comes before any table began
//!   publishing, this is the same as a commit in phases: nothing changes unless everything
//!   publishes or a publication fails.
//! - Each table marks the delivery publishing before its first job (idempotent, and only while
//!   the execution is committing), so an abort that came before the first table wins and
//!   nothing is published, and an abort after it is refused.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};

use super::destination::{PublishOutcome, Published};
use super::{CommitEnd, Publisher, plan};
use crate::error::Problem;
use crate::model::{DeliveryRef, ResourceName};
use crate::pipeline::{LaneDrain, LaneReport};
use crate::store::{ResourceRecord, RunRecord};

/// What every table's part of one commit shares.
pub(super) struct CommitContext<'a> {
    pub(super) run: &'a RunRecord,
    pub(super) delivery: &'a DeliveryRef,
    pub(super) continuing: &'a [ResourceName],
    pub(super) completes_snapshot: bool,
    /// Streams finalized and committed at once in this commit.
    pub(super) stream_commits: tokio::sync::Semaphore,
}

/// One destination table's part of a commit: its declared resources (in declaration order)
/// and what each of its lanes will report.
pub(super) struct TableWork {
    declared: Vec<ResourceRecord>,
    lanes: Vec<LaneDrain>,
}

/// How one table's part of a commit ended.
pub(super) enum TableEnd {
    /// Its streams were committed and its publications ran, each with its outcome.
    Published(Vec<Published>),
    /// A lane or stream of it failed (or the delivery could not be marked): none of its
    /// publications ran. Its staging tables are kept (they expire).
    Failed(Problem),
    /// Not published: another table failed, or the execution stopped committing.
    Stopped { staging_tables: Vec<String> },
    /// The execution was no longer committing (an abort, or a lane failed it) before the
    /// delivery began publishing: nothing of it changed.
    NotCommitting { staging_tables: Vec<String> },
}

/// Groups the declared resources and the lanes (with the streams a replica handed over, for
/// resources without a lane here) by destination table. A lane of an undeclared resource is an
/// internal error.
pub(super) fn by_table(
    declared: &[ResourceRecord],
    lanes: Vec<(ResourceName, LaneDrain)>,
    handed_over: Vec<crate::store::HandedOverStream>,
) -> Result<Vec<TableWork>, Problem> {
    let mut tables: BTreeMap<&str, TableWork> = BTreeMap::new();
    for record in declared {
        let work =
            tables.entry(&record.table_name).or_insert_with(|| TableWork { declared: Vec::new(), lanes: Vec::new() });
        work.declared.push(record.clone());
    }
    // Looked up once per lane: a run may have thousands of resources.
    let tables_by_resource: HashMap<&ResourceName, &str> =
        declared.iter().map(|record| (&record.resource, record.table_name.as_str())).collect();
    let table_of = |resource: &ResourceName| {
        tables_by_resource
            .get(resource)
            .copied()
            .ok_or_else(|| Problem::internal(format!("a lane of undeclared resource {resource}")))
    };
    let mut with_lane = HashSet::new();
    for (resource, drained) in lanes {
        // Every declared resource's table is a key.
        if let Some(work) = tables.get_mut(table_of(&resource)?) {
            work.lanes.push(drained);
        }
        with_lane.insert(resource);
    }
    for stream in handed_over {
        if with_lane.contains(&stream.resource) {
            continue;
        }
        let table = table_of(&stream.resource)?;
        let report: LaneReport = stream.into();
        let ready: LaneDrain = Box::pin(std::future::ready(Ok(report)));
        if let Some(work) = tables.get_mut(table) {
            work.lanes.push(ready);
        }
    }
    Ok(tables.into_values().collect())
}

impl Publisher {
    /// Awaits the table's lanes, plans its publications, commits its streams and publishes it,
    /// unless `stop` was raised meanwhile; raises `stop` when it cannot go on.
    pub(super) async fn drain_and_publish(
        &self,
        context: &CommitContext<'_>,
        table: TableWork,
        stop: &AtomicBool,
    ) -> TableEnd {
        let TableWork { declared, lanes } = table;
        let drained = futures::future::join_all(lanes).await;
        let mut reports = match drained.into_iter().collect::<Result<Vec<LaneReport>, Problem>>() {
            Ok(reports) => reports,
            Err(problem) => return failed(stop, problem),
        };
        reports.sort_by(|a, b| a.resource.cmp(&b.resource));
        let staging_tables: Vec<String> = reports.iter().map(|report| report.staging_table.clone()).collect();
        let plans = match plan::plan(&declared, &reports, context.continuing, context.completes_snapshot) {
            Ok(plans) => plans,
            Err(problem) => return failed(stop, problem),
        };
        let mut published = Vec::new();
        for destination in plans {
            if let Err(problem) = self.commit_streams(context, &destination).await {
                return failed(stop, problem);
            }
            if stop.load(Ordering::SeqCst) {
                return TableEnd::Stopped { staging_tables };
            }
            // The point of no return for this table: from here it changes.
            match self.store.begin_publishing(context.delivery).await {
                Ok(true) => {}
                Ok(false) => {
                    stop.store(true, Ordering::SeqCst);
                    return TableEnd::NotCommitting { staging_tables };
                }
                Err(error) => return failed(stop, error.into()),
            }
            let (run, delivery) = (context.run, context.delivery);
            published.extend(Box::pin(self.publish_destination(run, delivery, destination)).await);
        }
        TableEnd::Published(published)
    }

    /// Finalizes and commits the streams the destination publishes (at most the commit's
    /// `stream_commits` at once).
    async fn commit_streams(
        &self,
        context: &CommitContext<'_>,
        destination: &plan::DestinationPlan<'_>,
    ) -> Result<(), Problem> {
        for report in destination.publications.iter().filter_map(|p| p.staged) {
            let _slot =
                context.stream_commits.acquire().await.map_err(|_| Problem::internal("stream commits closed"))?;
            self.commit_stream(context.run, context.delivery, report).await?;
        }
        Ok(())
    }

    /// The commit's end from every table's: published, stopped before publishing (staging
    /// tables deleted), or failed (the first failure, naming what changed).
    pub(super) async fn finish(&self, run: &RunRecord, ends: Vec<TableEnd>) -> Result<CommitEnd, Problem> {
        let (mut published, mut failure, mut not_committing, mut unpublished) = (Vec::new(), None, false, Vec::new());
        for end in ends {
            match end {
                TableEnd::Published(results) => published.extend(results),
                TableEnd::Failed(problem) => {
                    failure.get_or_insert(problem);
                }
                TableEnd::Stopped { staging_tables } => unpublished.extend(staging_tables),
                TableEnd::NotCommitting { staging_tables } => {
                    not_committing = true;
                    unpublished.extend(staging_tables);
                }
            }
        }
        if published.is_empty() {
            // Nothing changed. An abort (or a lane's failure, recorded by the lane) that came
            // first stands, whatever the cancelled lanes answered since.
            if not_committing {
                self.delete_staging_tables(run, unpublished).await;
                return Ok(CommitEnd::AbortedBeforePublishing);
            }
            if let Some(problem) = failure {
                return Err(problem);
            }
        }
        let changed: Vec<String> = published
            .iter()
            .filter(|p| matches!(p.outcome, Ok(PublishOutcome::Published)))
            .map(|p| p.resource.to_string())
            .collect();
        let outcome = self.outcome(run, published.into_iter()).await;
        let Some(problem) = failure else { return outcome.map(|()| CommitEnd::Published) };
        let changed = if changed.is_empty() { "none".to_string() } else { changed.join(", ") };
        let detail =
            format!("{}; resources published before it failed (a redelivery skips them): {changed}", problem.detail);
        Err(Problem { detail, ..problem })
    }
}

/// A table that cannot go on: stops the others that have not begun publishing.
fn failed(stop: &AtomicBool, problem: Problem) -> TableEnd {
    stop.store(true, Ordering::SeqCst);
    TableEnd::Failed(problem)
}
