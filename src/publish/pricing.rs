//! The priced plan at the barrier (issue 58): once every stream is committed to staging and
//! before the delivery is marked publishing, each planned publication's statement is found as
//! its publication would find it (reading the destination, changing nothing) and dry-run
//! (`dryRun: true`: free, no job, nothing billed; a `jobs.insert` paced by the REST quotas and
//! retried on pushback like every other call). The plan ([`PricedPublication`] per resource)
//! is recorded, each resource's `planned` event written and the totals counted, then the
//! plan is judged against the run's byte budgets ([`over_budget`]): over either, the commit
//! fails with `publication_too_expensive` before the barrier (nothing published, staging
//! deleted); within them it goes on ([`super::commit`]). A statement BigQuery refuses to dry-run (a column it
//! names is added or widened only at publication, say) is recorded unpriced, with BigQuery's
//! reason; its job still carries the run's `maximumBytesBilled`.

use futures::StreamExt as _;

use super::Publisher;
use super::decide::StatementChoice;
use super::destination::{Effects, statement_choice};
use super::plan::{DestinationPlan, PlannedPublication};
use super::reconcile::{PublishBy, Reconciled, publish_by, reconcile};
use crate::bigquery::BigQueryError;
use crate::bigquery::error::Stage;
use crate::error::{ErrorCode, Problem};
use crate::model::publication_plan::{ByteBudgets, PlannedPath, PlannedStatement, PricedPublication, over_budget};
use crate::model::staging::WritePath;
use crate::model::{DeliveryRef, WriteMode};
use crate::store::{Event, RunRecord};
use crate::telemetry;

/// The statement kind the plan names for a statement choice.
pub(super) fn planned_statement(choice: StatementChoice, write_mode: WriteMode) -> PlannedStatement {
    match choice.shape(write_mode) {
        None => PlannedStatement::None,
        Some("insert") => PlannedStatement::Insert,
        Some("replace") => PlannedStatement::TruncateInsert,
        Some("truncate") => PlannedStatement::Truncate,
        Some("history") => PlannedStatement::History,
        Some("delete_missing") => PlannedStatement::Delete,
        // `merge`, `snapshot_completion`.
        Some(_) => PlannedStatement::Merge,
    }
}

impl Publisher {
    /// Prices every planned publication of the delivery, records the plan and its events, and
    /// returns it (in the plans' order). A failure to read the state database or the
    /// destination fails the commit before anything is published.
    pub(super) async fn price_plan(
        &self,
        run: &RunRecord,
        delivery: &DeliveryRef,
        plans: &[DestinationPlan<'_>],
        atomic: bool,
    ) -> Result<PricedPlan, Problem> {
        let planned: Vec<PlannedPublication<'_>> =
            plans.iter().flat_map(|destination| destination.publications.iter().copied()).collect();
        // An atomic execution's earlier deliveries are judged on its one transaction.
        let transaction = match atomic && !planned.is_empty() {
            true => Some(self.transaction_plan(run, delivery, &planned).await?.decision),
            false => None,
        };
        let pricing: Vec<_> =
            planned.iter().map(|planned| Box::pin(self.price(run, delivery, *planned, transaction.as_ref()))).collect();
        let priced: Vec<Result<Priced, Problem>> =
            futures::stream::iter(pricing).buffered(self.max_concurrent_publications).collect().await;
        let priced = priced.into_iter().collect::<Result<Vec<_>, _>>()?;
        let begun_earlier = priced.iter().any(|p| p.begun_earlier);
        // A dry run BigQuery could not be asked fails the commit before the barrier, retryable;
        // unless an earlier delivery began to publish, whose redelivery plans on, unpriced.
        if let Some(unasked) = priced.iter().find_map(|p| p.unasked.clone())
            && !begun_earlier
        {
            return Err(unasked);
        }
        let priced: Vec<PricedPublication> = priced.into_iter().map(|p| p.publication).collect();
        self.store.record_plan(delivery, self.price_per_tib_usd, &priced).await?;
        let planned_events: Vec<(Option<&str>, Event<'_>)> = priced
            .iter()
            .map(|publication| {
                let planned = Event::Planned { priced: publication, price_per_tib_usd: self.price_per_tib_usd };
                (Some(publication.resource.as_str()), planned)
            })
            .collect();
        self.store.record_events(delivery, &planned_events).await;
        let (bytes, jobs) = crate::model::publication_plan::totals(&priced);
        telemetry::plan_priced(bytes, jobs, priced.iter().filter(|p| p.unpriced.is_some()).count());
        tracing::info!(run_id = %run.run_id, execution_id = %delivery.execution_id(), publications = priced.len(),
            bytes_processed = bytes, query_jobs = jobs, begun_earlier, "bigquery.write.plan.priced");
        Ok(PricedPlan { publications: priced, begun_earlier })
    }

    /// Prices the plan ([`Self::price_plan`]) and judges it against the run's byte budgets: a
    /// plan over either fails the commit with `publication_too_expensive` before the barrier,
    /// so nothing is published.
    pub(super) async fn price_within_budget(
        &self,
        run: &RunRecord,
        delivery: &DeliveryRef,
        plans: &[DestinationPlan<'_>],
        atomic: bool,
    ) -> Result<Vec<PricedPublication>, Problem> {
        let PricedPlan { publications: priced, begun_earlier } = self.price_plan(run, delivery, plans, atomic).await?;
        if begun_earlier {
            // An earlier delivery passed the barrier and published some of it: the budgets were
            // judged then, and failing now could no longer leave every table unchanged.
            telemetry::plan_judged("begun_earlier");
            return Ok(priced);
        }
        let budgets = ByteBudgets {
            per_publication: run.maximum_bytes_billed,
            per_execution: run.maximum_bytes_billed_per_execution,
        };
        match over_budget(&priced, budgets) {
            None => {
                telemetry::plan_judged("within_budget");
                Ok(priced)
            }
            Some(detail) => {
                telemetry::plan_judged("over_budget");
                let hint = "raise the run's maximum_bytes_billed or maximum_bytes_billed_per_execution, or let the \
                    statements read less (partition or cluster the destination on the key, see docs/cost.md)";
                Err(Problem::new(ErrorCode::PublicationTooExpensive, detail).with_hint(hint))
            }
        }
    }

    /// One planned publication, priced: what [`super::destination`] would run for it, dry-run.
    /// `transaction`: an atomic execution's decision for its one transaction
    /// ([`super::atomic::decide_transaction`]), taken instead of the resource's own record.
    async fn price(
        &self,
        run: &RunRecord,
        delivery: &DeliveryRef,
        planned: PlannedPublication<'_>,
        transaction: Option<&Reconciled>,
    ) -> Result<Priced, Problem> {
        let resource = planned.resource;
        let path = match planned.staged.map(|report| &report.write_path) {
            Some(WritePath::Direct) => PlannedPath::DirectAppend,
            _ => PlannedPath::StagingQuery,
        };
        let mut priced = PricedPublication {
            resource: resource.resource.to_string(),
            table: resource.table_name.clone(),
            path,
            statement: PlannedStatement::None,
            bytes_processed: Some(0),
            query_jobs: 0,
            unpriced: None,
        };
        let (fingerprint, key_ranges) = Self::fingerprint(run, planned)?;
        let (previous, decision, begun_earlier) = earlier(planned, &fingerprint, transaction);
        let written = planned.staged.map(|report| &report.write_path);
        let done = |publication| Ok(Priced { publication, begun_earlier, unasked: None });
        match (&decision, publish_by(&decision, previous, written)) {
            (_, PublishBy::CommittingStreams { .. }) => {
                priced.path = PlannedPath::DirectAppend;
                return done(priced);
            }
            (Reconciled::Reuse { .. }, _) => return done(priced),
            (Reconciled::Refuse(problem), _) => {
                priced.bytes_processed = None;
                priced.unpriced = Some(problem.detail.clone());
                return done(priced);
            }
            (Reconciled::Reattach { .. }, PublishBy::QueryJob) => {
                // Its job was inserted by an earlier delivery: the publication waits for it, and
                // inserts none (nor is its statement priced again).
                priced.statement = planned_statement(statement_choice(planned), resource.write_mode);
                priced.bytes_processed = None;
                priced.unpriced = Some("its job was inserted by an earlier delivery and is reattached".into());
                return done(priced);
            }
            (Reconciled::Submit, PublishBy::QueryJob) => {}
        }
        let Some(statement) = self.statement(run, delivery, planned, &key_ranges, Effects::ReadOnly).await? else {
            return done(priced);
        };
        priced.path = PlannedPath::StagingQuery;
        priced.statement = planned_statement(statement_choice(planned), resource.write_mode);
        priced.query_jobs = 1;
        let project = run.job_project.as_deref().unwrap_or(&run.destination.project);
        let location = run.destination.location();
        let dry_run = |_| self.bigquery.dry_run_query(project, location, &statement.sql);
        match self.bigquery.retrying_pushback("jobs.insert", dry_run).await {
            Ok(bytes) => priced.bytes_processed = Some(bytes),
            Err(e) => {
                tracing::warn!(run_id = %run.run_id, execution_id = %delivery.execution_id(),
                    resource = %resource.resource, error = %e, "the publication's statement could not be dry-run");
                priced.bytes_processed = None;
                priced.unpriced = Some(e.to_string());
                if !refused_dry_run(&e) {
                    let unasked = Some(e.problem(Stage::Setup));
                    return Ok(Priced { publication: priced, begun_earlier, unasked });
                }
            }
        }
        done(priced)
    }
}

/// What the publication of `planned` does given the execution's earlier deliveries: its
/// record, the decision, and whether an earlier delivery began to publish it. An atomic
/// execution's `transaction` decision stands for every resource; a failed transaction changed
/// nothing, so its redelivery (submitted again) has not begun.
fn earlier<'a>(
    planned: PlannedPublication<'a>,
    fingerprint: &str,
    transaction: Option<&Reconciled>,
) -> (Option<&'a crate::store::PublicationRecord>, Reconciled, bool) {
    if let Some(decision) = transaction {
        return (None, decision.clone(), !matches!(decision, Reconciled::Submit));
    }
    let decision = reconcile(planned.earlier, fingerprint);
    (planned.earlier, decision, planned.earlier.is_some())
}

/// One planned publication priced, and whether an earlier delivery of the execution began to
/// publish it (its publication record exists).
struct Priced {
    publication: PricedPublication,
    begun_earlier: bool,
    /// Why BigQuery could not be asked for its dry run (not a refusal of the statement).
    unasked: Option<Problem>,
}

/// The delivery's plan, and whether an earlier delivery of the execution passed the barrier.
pub(super) struct PricedPlan {
    pub(super) publications: Vec<PricedPublication>,
    pub(super) begun_earlier: bool,
}

/// BigQuery answered that it will not run the statement (the request was refused as invalid,
/// or the dry run's job failed), rather than not answering: the plan then records it unpriced.
fn refused_dry_run(error: &BigQueryError) -> bool {
    matches!(error, BigQueryError::JobFailed { .. } | BigQueryError::Inconsistent(_))
        || matches!(error.http_status(), Some(400 | 404))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::publish::decide::ScopeChoice;

    #[test]
    fn each_statement_choice_names_its_kind() {
        let staged = |replace, scope| StatementChoice::FromStaging { replace, scope };
        let cases = [
            (StatementChoice::Nothing, WriteMode::FullAppend, PlannedStatement::None),
            (staged(false, ScopeChoice::StagedKeys), WriteMode::FullAppend, PlannedStatement::Insert),
            (staged(true, ScopeChoice::StagedKeys), WriteMode::FullReplace, PlannedStatement::TruncateInsert),
            (StatementChoice::Truncate, WriteMode::FullReplace, PlannedStatement::Truncate),
            (staged(false, ScopeChoice::StagedKeys), WriteMode::IncrementalUpsert, PlannedStatement::Merge),
            (staged(false, ScopeChoice::SnapshotCompletion), WriteMode::FullUpsert, PlannedStatement::Merge),
            (staged(false, ScopeChoice::StagedKeys), WriteMode::History, PlannedStatement::History),
            (StatementChoice::DeleteMissing, WriteMode::FullUpsert, PlannedStatement::Delete),
        ];
        for (choice, mode, expected) in cases {
            assert_eq!(planned_statement(choice, mode), expected, "{choice:?} in {mode:?}");
        }
    }
}
