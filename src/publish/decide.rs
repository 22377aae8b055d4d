//! The commit's decisions, as pure functions over plain data, so that each is unit-tested
//! without BigQuery, Postgres or a network, and the GoogleSQL conformance code
//! ([`crate::conformance`]) enumerates the statements through the same choice:
//!
//! - [`choose_statement`]: which statement publishes one resource (none, a truncation, the
//!   deletion that completes a snapshot, or a publication of the staged rows with its replace
//!   flag and key scope), from the resource's write mode and what its delivery staged;
//!   [`statement_sql`] renders the choice with the facts fetched about the destination.
//! - [`runs_again`]: whether a failed publication job runs again under the next job id.
//! - [`failed_before_publishing`] and [`publications_ended`]: how the tables' outcomes combine into the
//!   commit's end, and which staging tables are then safe to delete.
//!
//! The I/O around them (`publish::commit`, `publish::destination`) only fetches the facts and
//! executes what was decided.

use std::time::Duration;

use super::keys_compared::KeysAsCompared;
use super::sql;
use crate::bigquery::BigQueryError;
#[cfg(test)]
use crate::bigquery::retry::RetryAction;
use crate::bigquery::retry::{Backoff, RetryClass, RetryPolicy};
use crate::error::{ErrorCode, Problem};
use crate::model::columns::Column;
use crate::model::write_options::Deletes;
use crate::model::{ResourceName, WriteMode};

/// What one planned publication is, as far as choosing its statement goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PublicationFacts {
    pub(crate) write_mode: WriteMode,
    /// The resource declared `delete_missing` (a snapshot run).
    pub(crate) delete_missing: bool,
    /// Rows its lane staged and committed to the staging table; `None` when no lane ran (no
    /// batch of the resource in this delivery).
    pub(crate) staged_rows: Option<i64>,
    /// No committed execution of the run published this resource yet.
    pub(crate) first_segment: bool,
    /// The execution completes the run's snapshot (it was never paused).
    pub(crate) completes_snapshot: bool,
}

/// Which keys of the destination a keyed publication may touch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ScopeChoice {
    /// The key ranges its batches recorded.
    StagedKeys,
    /// A segment of a `delete_missing` snapshot: its ranges, deleting nothing unsent.
    SnapshotSegment,
    /// The segment that completes a `delete_missing` snapshot: every key.
    SnapshotCompletion,
}

/// The statement that publishes one resource.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StatementChoice {
    /// No job: nothing staged, nothing to replace and no snapshot to complete.
    Nothing,
    /// An empty replacement in the run's first segment: `TRUNCATE`, when the destination exists.
    Truncate,
    /// A snapshot completed without rows of its own: delete the keys the run did not send, when
    /// the destination exists.
    DeleteMissing,
    /// The staged rows, replacing the table's content (`full_replace`'s first segment) or not.
    FromStaging { replace: bool, scope: ScopeChoice },
}

impl StatementChoice {
    /// The destination must be known to exist before the statement runs (a statement on a
    /// missing table fails; nothing needs doing there).
    pub(crate) fn needs_existing_destination(self) -> bool {
        matches!(self, StatementChoice::Truncate | StatementChoice::DeleteMissing)
    }

    /// A script of several statements (`full_replace`'s transaction) rather than one.
    pub(crate) fn is_script(self) -> bool {
        matches!(self, StatementChoice::FromStaging { replace: true, .. })
    }

    /// The generator's path it takes, as the conformance report names it: `insert`, `merge`,
    /// `replace`, `history`, `truncate`, `snapshot_completion` or `delete_missing`; `None` for
    /// no statement.
    pub(crate) fn shape(self, write_mode: WriteMode) -> Option<&'static str> {
        Some(match self {
            StatementChoice::Nothing => return None,
            StatementChoice::Truncate => "truncate",
            StatementChoice::DeleteMissing => "delete_missing",
            StatementChoice::FromStaging { replace: true, .. } => "replace",
            StatementChoice::FromStaging { scope: ScopeChoice::SnapshotCompletion, .. } => "snapshot_completion",
            StatementChoice::FromStaging { .. } if write_mode == WriteMode::History => "history",
            StatementChoice::FromStaging { .. } if write_mode.is_merge() => "merge",
            StatementChoice::FromStaging { .. } => "insert",
        })
    }
}

/// The statement for one resource:
///
/// | staged rows        | `full_replace`, first segment | snapshot completes | otherwise |
/// |--------------------|-------------------------------|--------------------|-----------|
/// | some (> 0)         | replace                       | merge, every key   | publish   |
/// | a lane, no rows    | replace (empties the table)   | delete missing     | nothing   |
/// | no lane            | truncate                      | delete missing     | nothing   |
///
/// A `full_replace` resource in a later segment appends (publish). A keyed publication is
/// scoped to its staged key ranges; a `delete_missing` segment too; its completion to every key.
pub(crate) fn choose_statement(facts: PublicationFacts) -> StatementChoice {
    let replace = facts.write_mode == WriteMode::FullReplace && facts.first_segment;
    let snapshot_end = facts.delete_missing && facts.completes_snapshot;
    match facts.staged_rows {
        Some(rows) if rows > 0 || replace => {
            let scope = match (facts.delete_missing, snapshot_end) {
                (_, true) => ScopeChoice::SnapshotCompletion,
                (true, false) => ScopeChoice::SnapshotSegment,
                (false, _) => ScopeChoice::StagedKeys,
            };
            StatementChoice::FromStaging { replace, scope }
        }
        _ if snapshot_end => StatementChoice::DeleteMissing,
        None if replace => StatementChoice::Truncate,
        _ => StatementChoice::Nothing,
    }
}

/// Everything a chosen statement is rendered from (the destination's facts already fetched).
#[derive(Debug, Clone)]
pub(crate) struct StatementInputs<'a> {
    pub(crate) destination: sql::TableRef<'a>,
    /// The staging table (read only by [`StatementChoice::FromStaging`]).
    pub(crate) staging: sql::TableRef<'a>,
    pub(crate) write_mode: WriteMode,
    pub(crate) columns: &'a [Column],
    /// Key and `order_by` columns, named as in `columns`.
    pub(crate) key: &'a [String],
    pub(crate) order_by: &'a [String],
    pub(crate) compared: &'a KeysAsCompared,
    pub(crate) metadata: sql::LoadMetadata<'a>,
    pub(crate) deletes: Deletes,
}

/// The SQL of `choice`, or `None` for [`StatementChoice::Nothing`].
pub(crate) fn statement_sql(choice: StatementChoice, inputs: &StatementInputs<'_>) -> Option<String> {
    let (replace, scope) = match choice {
        StatementChoice::Nothing => return None,
        StatementChoice::Truncate => return Some(sql::truncate_statement(&inputs.destination)),
        StatementChoice::DeleteMissing => {
            let run_id = inputs.metadata.run_id;
            return Some(sql::delete_missing_statement(&inputs.destination, run_id, inputs.deletes));
        }
        StatementChoice::FromStaging { replace, scope } => (replace, scope),
    };
    let ranges = &inputs.compared.ranges;
    let scope = match scope {
        ScopeChoice::StagedKeys => sql::MergeScope::StagedKeys(ranges),
        ScopeChoice::SnapshotSegment => sql::MergeScope::SnapshotSegment(ranges),
        ScopeChoice::SnapshotCompletion => sql::MergeScope::SnapshotCompletion,
    };
    Some(sql::publication_statement(&sql::Publication {
        destination: inputs.destination.clone(),
        staging: inputs.staging.clone(),
        write_mode: inputs.write_mode,
        columns: inputs.columns,
        key: inputs.key,
        order_by: inputs.order_by,
        scope,
        key_collations: &inputs.compared.collations,
        replace,
        metadata: inputs.metadata,
        deletes: inputs.deletes,
    }))
}

/// How a publication's failed jobs run again: four attempts in all after a passing failure, a
/// slower backoff than appends' (a job is heavier than a request), pushback waited out for the
/// operator's quota wait (set by `app.rs`).
pub(crate) const PUBLICATION_RETRY: RetryPolicy = RetryPolicy {
    max_attempts: 4,
    backoff: Backoff::new(Duration::from_millis(1400), Duration::from_secs(30)),
    quota_wait: Duration::from_secs(900),
    quota_backoff: Backoff::new(Duration::from_millis(1400), Duration::from_secs(30)),
};

/// Whether a publication whose job failed with `error` may run again under the next attempt's
/// job id ([`PUBLICATION_RETRY`] decides whether and when it does). Only a job that cannot
/// have changed the destination runs again: one BigQuery ran and failed for a passing reason
/// or for its rate limits, or a `jobs.insert` refused for pushback (no job was created; the
/// job's REST calls are made once, this being the one level that retries them).
pub(crate) fn runs_again(error: &BigQueryError) -> bool {
    let class = RetryClass::of(error);
    let refused_before_running =
        matches!(error, BigQueryError::Rest { operation: "jobs.insert", .. }) && class == RetryClass::Pushback;
    let failed_in_passing = matches!(error, BigQueryError::JobFailed { .. }) && class != RetryClass::Permanent;
    refused_before_running || failed_in_passing
}

/// How one publication ended when it did not fail for good.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum PublishOutcome {
    /// Done now, earlier (a redelivery), or nothing to publish.
    Done,
    /// We lost track of the job (timeout, BigQuery unreachable): it may still finish. Its
    /// record stays `running`, so a redelivery re-attaches to it under the same job id.
    Unfinished(Problem),
    /// A job the gateway did not submit holds the publication's job id (`foreign_job`): its
    /// outcome was not taken, the publication is recorded failed, nothing was published, and
    /// the staging table stays (for whoever looks into it; it expires).
    ForeignJob(Problem),
}

/// One resource's publication result, with the staging table it read.
#[derive(Debug)]
pub(crate) struct PublicationResult {
    pub(crate) resource: ResourceName,
    pub(crate) staging_table: Option<String>,
    pub(crate) outcome: Result<PublishOutcome, Problem>,
}

/// What ends a commit, and what it leaves to clean up.
#[derive(Debug, PartialEq)]
pub(crate) struct CommitVerdict {
    /// Staging tables no job will read again: delete them.
    pub(crate) delete_staging_tables: Vec<String>,
    /// Every destination published, or the commit's problem.
    pub(crate) end: Result<(), Problem>,
}

/// The commit's end when staging failed (the first failure in time), before any destination
/// changed: the commit fails with it, and every staging table of the delivery is safe to delete
/// (no publication began, so no job reads them).
pub(crate) fn failed_before_publishing(problem: Problem, staging_tables: Vec<String>) -> CommitVerdict {
    CommitVerdict { delete_staging_tables: staging_tables, end: Err(problem) }
}

/// The commit's end from every publication's result: done when all are, otherwise the first
/// failure's code with every failure in the detail. A staging table is deleted unless its job
/// may still be running (its outcome is unknown: a redelivery re-attaches to it and reads it)
/// or a foreign job held its job id (kept for whoever looks into it).
pub(crate) fn publications_ended(results: Vec<PublicationResult>) -> CommitVerdict {
    let mut failures: Vec<(ResourceName, Problem)> = Vec::new();
    let mut delete_staging_tables = Vec::new();
    for PublicationResult { resource, staging_table, outcome } in results {
        match outcome {
            Ok(PublishOutcome::Done) => delete_staging_tables.extend(staging_table),
            Ok(PublishOutcome::Unfinished(problem) | PublishOutcome::ForeignJob(problem)) => {
                failures.push((resource, problem))
            }
            Err(problem) => {
                delete_staging_tables.extend(staging_table);
                failures.push((resource, problem));
            }
        }
    }
    let end = match failures.first() {
        None => Ok(()),
        Some((_, first)) => {
            let detail: Vec<String> = failures.iter().map(|(r, p)| format!("resource {r}: {}", p.detail)).collect();
            Err(Problem { detail: detail.join("; "), ..first.clone() })
        }
    };
    CommitVerdict { delete_staging_tables, end }
}

/// The problem of a publication not submitted because an earlier one into the same table did
/// not publish: the table stays as the prefix of the declared order left it.
pub(crate) fn blocked_by_earlier(table: &str) -> Problem {
    Problem::new(
        ErrorCode::PublicationFailed,
        format!("not published: an earlier publication into table {table} failed"),
    )
}

#[cfg(test)]
#[path = "decide_tests.rs"]
mod tests;
