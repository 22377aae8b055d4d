//! Commit and publication of a delivery, in the product's order ([`commit`] reads it top to
//! bottom): every lane drains and every PENDING stream is finalized (its row count checked)
//! and committed to its staging table; only then, once the delivery is marked publishing (an
//! abort before it changes nothing, an abort after it is refused), each destination table is
//! published with one query job per resource (keyed job id, fingerprint and statement digest
//! persisted first, a job found under the id taken only when it is ours; [`destination`],
//! [`publication_job`]), at most `max_concurrent_publications` tables at once; the staging
//! tables are deleted and the execution marked committed, which makes its last checkpoint the
//! run's durable checkpoint. A failure before publication changes no destination.
//!
//! Decisions are pure ([`decide`]: which statement, whether a failed job runs again, how the
//! outcomes combine), as are [`sql`] (statements per write mode), [`job_id`], [`fingerprint`],
//! [`plan`] (which publications, per table in declaration order) and [`reconcile`] (what a
//! redelivered publication does). A `direct_append` resource publishes by committing the
//! stream its lane wrote into the destination ([`direct`]) instead of a query job. A resource
//! declared `widen_columns` has its destination's columns widened after the barrier, before
//! its statement ([`widen`]).
//! At the barrier, before anything is published, every planned publication's statement is
//! dry-run and the priced plan recorded ([`pricing`]).
//! [`lifecycle`] begins a commit and aborts. An execution opened `atomic` publishes every
//! destination in one multi-statement transaction instead ([`atomic`]).

pub(crate) mod atomic;
mod commit;
pub(crate) mod decide;
pub(crate) mod destination;
pub(crate) mod direct;
pub(crate) mod fingerprint;
pub(crate) mod job_id;
pub(crate) mod keys_compared;
mod lifecycle;
mod plan;
mod pricing;
mod publication_job;
pub(crate) mod reconcile;
pub(crate) mod sql;
mod widen;

use std::time::Duration;

use futures::StreamExt as _;

use crate::bigquery::BigQuery;
use crate::bigquery::fair::Tenant;
use crate::model::DeliveryRef;
use crate::model::staging::WritePath;
use crate::pipeline::Pipeline;
use crate::store::{RunRecord, Store};
pub(crate) use decide::PUBLICATION_RETRY;
pub(crate) use lifecycle::{AbortOutcome, CommitStart, CommitThrough, Committing};

/// Runs commits. Cheap to clone.
#[derive(Debug, Clone)]
pub(crate) struct Publisher {
    pub(crate) store: Store,
    pub(crate) bigquery: BigQuery,
    pub(crate) pipeline: Pipeline,
    pub(crate) query_job_timeout: Duration,
    /// Destination tables published at once per commit, and streams finalized and committed at
    /// once per commit (`FILAMENT_MAX_CONCURRENT_PUBLICATIONS`, 8 by default). BigQuery runs
    /// at most two DML statements per table at a time; these are different tables.
    pub(crate) max_concurrent_publications: usize,
    /// Publication jobs running at once in each job project and location: the adaptive limits,
    /// never above `max_concurrent_publications` ([`crate::bigquery::adaptive`]).
    pub(crate) publications: crate::bigquery::adaptive::AdaptiveLimits,
    /// How a failed publication job runs again ([`decide::PUBLICATION_RETRY`], its pushback
    /// waited out for `FILAMENT_QUOTA_WAIT_SECS`).
    pub(crate) retry: crate::bigquery::retry::RetryPolicy,
    /// The fleet's key of job-id tags ([`job_id`]).
    pub(crate) job_ids: job_id::JobIdKey,
    /// The on-demand price per TiB processed the plan at the barrier estimates costs at
    /// (`FILAMENT_ON_DEMAND_PRICE_PER_TIB_USD`, [`pricing`]).
    pub(crate) price_per_tib_usd: f64,
}

impl Publisher {
    /// This publisher calling BigQuery for `run`'s principal: its jobs and table calls take
    /// their turns under it (`crate::bigquery::fair`).
    pub(crate) fn serving(&self, run: &RunRecord) -> Self {
        Self { bigquery: self.bigquery.on_behalf_of(Tenant::principal(&run.principal)), ..self.clone() }
    }

    /// Deletes the staging tables of an aborted delivery (best effort: they expire anyway).
    pub(crate) async fn discard_staging(&self, run: &RunRecord, delivery: &DeliveryRef) {
        let tables = self.staging_tables(delivery).await;
        self.delete_staging_tables(run, tables).await;
    }

    /// Every staging table of the delivery (best effort: they expire anyway). A
    /// `direct_append` stream has none: it writes into the destination, never deleted.
    async fn staging_tables(&self, delivery: &DeliveryRef) -> Vec<String> {
        match self.store.list_staging_streams(delivery).await {
            Ok(streams) => streams
                .into_iter()
                .filter_map(|stream| match stream.write_path {
                    WritePath::Staging { staging_table } => Some(staging_table),
                    WritePath::Direct => None,
                })
                .collect(),
            Err(e) => {
                tracing::warn!(execution_id = %delivery.execution_id(), error = %e,
                    "could not list staging tables to delete; they expire");
                Vec::new()
            }
        }
    }

    /// Deletes staging tables no job will read again, `max_concurrent_publications` at once (a
    /// thousand one after another would take minutes). They expire on their own anyway, so a
    /// failure is logged, not raised.
    async fn delete_staging_tables(&self, run: &RunRecord, tables: impl IntoIterator<Item = String>) {
        let (project, dataset) = (&run.destination.project, &run.destination.dataset);
        let deletions: Vec<_> = tables
            .into_iter()
            .map(|table| async move {
                let delete = |_| self.bigquery.delete_table(project, dataset, &table);
                if let Err(e) = self.bigquery.retrying_pushback("tables.delete", delete).await {
                    tracing::warn!(%table, error = %e, "could not delete a staging table");
                }
            })
            .collect();
        futures::stream::iter(deletions).buffer_unordered(self.max_concurrent_publications).collect::<Vec<()>>().await;
    }
}
