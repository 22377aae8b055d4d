//! A delivery's way out of extraction, owned here rather than by the handlers: beginning a
//! commit (the pending-stream age check, the move to `committing`, from extraction or from
//! `staged` where a commit asked to hold stopped), and aborting (the lanes cancelled, the
//! staging tables discarded). Both run under the execution's gate held
//! exclusively (a [`Transitioning`] guard) and on an execution this replica may change (an
//! [`Owned`] record), so no batch is half-accepted meanwhile and no other replica's uploads are
//! touched. The commit itself runs as a task: [`Publisher::commit`].

use std::time::Duration;

use super::Publisher;
use crate::error::{ErrorCode, Problem};
use crate::model::ExecutionState;
use crate::pipeline::Transitioning;
use crate::replica::Owned;
use crate::store::{Event, ExecutionRecord, Lease, RunRecord};

/// Where a commit stops: at the end, or at the barrier (`hold`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CommitThrough {
    /// Stage, plan, then publish every destination.
    Publication,
    /// Stage and plan, then stop in `staged` with nothing published: a later commit publishes
    /// what was staged, an abort discards it.
    Barrier,
}

/// A delivery this request moved to `committing`: the commit task publishes it.
#[derive(Debug, Clone)]
pub(crate) struct Committing {
    pub(crate) run: RunRecord,
    /// Its record as moved; `staged_at` is set when an earlier commit held it at the barrier,
    /// and then its streams are already staged.
    pub(crate) execution: ExecutionRecord,
    pub(crate) through: CommitThrough,
}

/// What a commit request leads to.
#[derive(Debug)]
pub(crate) enum CommitStart {
    /// This request began the commit.
    Started(Box<Committing>),
    /// The execution was not before its commit: its current record (committing already,
    /// committed, or ended otherwise).
    Current(Box<ExecutionRecord>),
}

/// What an abort request leads to.
#[derive(Debug)]
pub(crate) enum AbortOutcome {
    Aborted(ExecutionRecord),
    /// Not aborted: its current record (ended, or publishing: `publishing_at` is set).
    Refused(ExecutionRecord),
}

impl Publisher {
    /// Begins the commit of `execution`'s current delivery: refuses (and fails) it when its
    /// oldest pending stream is older than `pending_stream_max_age` (BigQuery discards
    /// uncommitted streams after about 24 hours), then moves it to `committing`. The gate is
    /// released once the state moved: no batch can be accepted any more. A `staged` delivery
    /// moves back to `committing` under `lease` (this replica publishes it), unless this commit
    /// asks to hold again (then its current record).
    pub(crate) async fn begin_commit(
        &self,
        transitioning: Transitioning,
        (run, execution): (RunRecord, Owned<ExecutionRecord>),
        through: CommitThrough,
        pending_stream_max_age: Duration,
        lease: &Lease,
    ) -> Result<CommitStart, Problem> {
        self.refuse_expired_streams(&run, &execution, pending_stream_max_age).await?;
        let delivery = execution.key().delivery(transitioning.delivery());
        let moved = match (execution.state, through) {
            (ExecutionState::Staged, CommitThrough::Barrier) => None,
            (ExecutionState::Staged, CommitThrough::Publication) => self.store.resume_staged(&delivery, lease).await?,
            _ => {
                self.store
                    .transition_execution(&delivery, ExecutionState::BEFORE_COMMIT, ExecutionState::Committing)
                    .await?
            }
        };
        drop(transitioning);
        match moved {
            Some(execution) => {
                self.store.record_event(&delivery, None, Event::CommitStarted).await;
                Ok(CommitStart::Started(Box::new(Committing { run, execution, through })))
            }
            None => {
                let current = self.store.get_execution(&delivery.execution).await?;
                Ok(CommitStart::Current(Box::new(current.ok_or_else(|| Problem::not_found(&delivery.execution))?)))
            }
        }
    }

    /// Fails the delivery with `pending_stream_expired` when its oldest stream is older than
    /// `limit`; nothing was published. A held (`staged`) delivery is bound by the same limit,
    /// counted from the same stream: its staging tables are deleted then.
    async fn refuse_expired_streams(
        &self,
        run: &RunRecord,
        execution: &ExecutionRecord,
        limit: Duration,
    ) -> Result<(), Problem> {
        let staged = execution.state == ExecutionState::Staged;
        if !ExecutionState::BEFORE_COMMIT.contains(&execution.state) && !staged {
            return Ok(());
        }
        let streams = self.store.list_staging_streams(&execution.delivery_ref()).await?;
        let Some(oldest) = streams.iter().filter_map(|s| s.stream_created_at).min() else { return Ok(()) };
        let age = chrono::Utc::now() - oldest;
        if age.to_std().unwrap_or_default() <= limit {
            return Ok(());
        }
        let problem = Problem::new(
            ErrorCode::PendingStreamExpired,
            format!(
                "the execution's oldest pending stream is {} minutes old, beyond the {}-minute limit; BigQuery discards uncommitted streams after about 24 hours",
                age.num_minutes(),
                limit.as_secs() / 60
            ),
        )
        .with_hint("deliver the execution again and commit it sooner");
        let delivery = execution.delivery_ref();
        if staged {
            // Only while still staged: another commit may have resumed it meanwhile.
            if self.store.fail_staged_execution(&delivery, &problem).await?.is_some() {
                self.serving(run).discard_staging(run, &delivery).await;
            }
            return Err(problem);
        }
        self.pipeline.cancel(&execution.key());
        self.store.fail_execution(&delivery, &problem).await?;
        Err(problem)
    }

    /// Aborts the delivery unless its commit began publishing: its lanes are cancelled, and
    /// its staging tables deleted in the background. Those of a committing delivery are deleted
    /// by its commit, which stops before the barrier (it may be committing streams meanwhile).
    pub(crate) async fn abort(
        &self,
        transitioning: Transitioning,
        run: RunRecord,
        execution: Owned<ExecutionRecord>,
        background: &tokio_util::task::TaskTracker,
    ) -> Result<AbortOutcome, Problem> {
        let delivery = execution.key().delivery(transitioning.delivery());
        let Some(aborted) = self.store.abort_execution(&delivery).await? else {
            let current = self.store.get_execution(&delivery.execution).await?;
            return Ok(AbortOutcome::Refused(current.ok_or_else(|| Problem::not_found(&delivery.execution))?));
        };
        drop(transitioning);
        self.store.record_event(&delivery, None, Event::Ended { state: ExecutionState::Aborted }).await;
        self.pipeline.cancel(&aborted.key());
        if execution.state != ExecutionState::Committing {
            let publisher = self.serving(&run);
            background.spawn(async move { publisher.discard_staging(&run, &delivery).await });
        }
        Ok(AbortOutcome::Aborted(aborted))
    }
}
