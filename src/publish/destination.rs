//! Publishing one destination table: its planned publications one after another, each one
//! query job ([`super::publication_job`]: keyed job ids, recorded before the job is submitted),
//! unless this execution already published the same content (a redelivery, decided by
//! [`reconcile`]). What runs is decided in [`super::decide`]; this module fetches the
//! destination's facts the decision needs and executes it.

use super::decide::{self, PublicationResult, PublishOutcome, StatementChoice};
use super::direct::DirectPublication;
use super::keys_compared::{KeysAsCompared, is_string_range, string_key_columns};
use super::plan::{DestinationPlan, PlannedPublication};
use super::publication_job::{PublicationJob, Statement};
use super::reconcile::{PublishBy, Reconciled, publish_by, reconcile};
use super::{Publisher, fingerprint, sql};

use crate::bigquery::BigQueryError;
use crate::bigquery::collation::collated_columns;
use crate::bigquery::error::Stage;
use crate::error::Problem;
use crate::model::DeliveryRef;
use crate::model::columns::{Column, same_name};
use crate::model::key_ranges::{KeyRange, covering_ranges};
use crate::model::staging::{WritePath, staging_table_name};
use crate::store::{Publishing, ResourceRecord, RunRecord};
use crate::telemetry;

/// What finding a publication's statement may do to its destination.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Effects {
    /// Add the columns a snapshot's deletion reads (at publication, after the barrier).
    PrepareDestination,
    /// Read only (the plan at the barrier, before anything may change).
    ReadOnly,
}

/// Which statement publishes `planned` ([`decide::choose_statement`]).
pub(super) fn statement_choice(planned: PlannedPublication<'_>) -> StatementChoice {
    let resource = planned.resource;
    decide::choose_statement(decide::PublicationFacts {
        write_mode: resource.write_mode,
        delete_missing: resource.write_options.delete_missing,
        staged_rows: planned.staged.map(|report| report.rows_acknowledged),
        first_segment: planned.first_segment,
        completes_snapshot: planned.completes_snapshot,
    })
}

impl Publisher {
    /// The destination's publications in order. After one fails (or its outcome is unknown),
    /// the later ones are not submitted: the table stays as a prefix of the declared order left it.
    pub(super) async fn publish_destination(
        &self,
        run: &RunRecord,
        publishing: &Publishing,
        destination: DestinationPlan<'_>,
    ) -> Vec<PublicationResult> {
        let mut results = Vec::with_capacity(destination.publications.len());
        let mut blocked = false;
        for planned in destination.publications {
            let outcome = if blocked {
                Err(decide::blocked_by_earlier(destination.table))
            } else {
                self.publish(run, publishing, planned).await
            };
            blocked |= !matches!(outcome, Ok(PublishOutcome::Done));
            // A direct append wrote no staging table.
            let staging_table = planned.staged.and_then(|report| report.write_path.staging_table()).map(str::to_string);
            results.push(PublicationResult { resource: planned.resource.resource.clone(), staging_table, outcome });
        }
        results
    }

    /// One query job for the resource (or the commit of its direct stream), unless this
    /// execution already published the same content.
    async fn publish(
        &self,
        run: &RunRecord,
        publishing: &Publishing,
        planned: PlannedPublication<'_>,
    ) -> Result<PublishOutcome, Problem> {
        let (resource, delivery) = (planned.resource, publishing.delivery());
        let (fingerprint, key_ranges) = Self::fingerprint(run, planned)?;
        let previous = planned.earlier;
        let decision = reconcile(previous, &fingerprint);
        let written = planned.staged.map(|report| &report.write_path);
        if let PublishBy::CommittingStreams { earlier_streams } = publish_by(&decision, previous, written) {
            let staged = planned.staged;
            let direct =
                DirectPublication { run, publishing, resource, fingerprint: &fingerprint, staged, earlier_streams };
            return self.publish_direct(&direct).await;
        }
        let recorded_job_id = match &decision {
            Reconciled::Submit => None,
            Reconciled::Reattach { job_id } => Some(job_id.as_str()),
            Reconciled::Reuse { job_id } => {
                tracing::info!(run_id = %run.run_id, execution_id = %delivery.execution_id(),
                    resource = %resource.resource, %job_id,
                    "redelivered execution staged the same content; reusing its publication");
                telemetry::publication_ended("reused");
                return Ok(PublishOutcome::Done);
            }
            Reconciled::Refuse(problem) => return Err(problem.clone()),
        };
        if let Err(e) = self.widen_before_publishing(run, publishing, planned).await {
            let problem = e.problem(Stage::Publication);
            return match e {
                BigQueryError::ForeignJob { .. } => Ok(PublishOutcome::ForeignJob(problem)),
                _ => Err(problem),
            };
        }
        match self.statement(run, delivery, planned, &key_ranges, Effects::PrepareDestination).await? {
            Some(statement) => {
                let job = PublicationJob { run, publishing, resource, fingerprint, statement, recorded_job_id };
                self.run_and_record(&job).await
            }
            None => Ok(PublishOutcome::Done),
        }
    }

    /// The fingerprint of what the resource staged in this delivery (nothing, for an empty
    /// replacement), and the key ranges covering its batches.
    pub(super) fn fingerprint(
        run: &RunRecord,
        planned: PlannedPublication<'_>,
    ) -> Result<(String, Vec<KeyRange>), Problem> {
        let resource = planned.resource;
        let (schema_sha256, receipts) = match (planned.staged, planned.staged_inputs) {
            (Some(_), Some(inputs)) => (inputs.arrow_schema_sha256.as_str(), inputs.receipts.as_slice()),
            (Some(report), None) => {
                return Err(Problem::internal(format!("no staging record for {}", report.resource)));
            }
            (None, _) => ("", &[][..]),
        };
        let fingerprint = fingerprint::fingerprint(&fingerprint::FingerprintInput {
            project: &run.destination.project,
            dataset: &run.destination.dataset,
            table: &resource.table_name,
            write_mode: resource.write_mode,
            primary_key: &resource.primary_key,
            write_options: &resource.write_options,
            completes_snapshot: planned.completes_snapshot,
            arrow_schema_sha256: schema_sha256,
            receipts,
        });
        let ranges = covering_ranges(receipts.iter().map(|r| r.key_ranges.as_deref()));
        Ok((fingerprint, ranges))
    }

    /// The statement to run ([`decide::choose_statement`]), with the destination's facts it
    /// needs fetched first; `None` when there is nothing to do (nothing staged, no replacement
    /// and no snapshot to complete, or a truncation or deletion of a table that does not exist).
    /// `effects` says whether the destination may be prepared for it (the plan at the barrier
    /// only reads).
    pub(super) async fn statement<'a>(
        &self,
        run: &RunRecord,
        delivery: &DeliveryRef,
        planned: PlannedPublication<'a>,
        key_ranges: &[KeyRange],
        effects: Effects,
    ) -> Result<Option<Statement<'a>>, Problem> {
        let resource = planned.resource;
        let options = &resource.write_options;
        let choice = statement_choice(planned);
        let (project, dataset) = (&run.destination.project, &run.destination.dataset);
        let destination = sql::TableRef { project, dataset, table: &resource.table_name };
        if choice.needs_existing_destination()
            && !self.destination_ready(&destination, resource, choice, effects).await?
        {
            return Ok(None);
        }
        let staged = match choice {
            StatementChoice::FromStaging { .. } => planned.staged,
            _ => None,
        };
        let no_columns: &[Column] = &[];
        let columns = staged.map_or(no_columns, |report| report.destination_columns.as_slice());
        let key = sql::key_as_named(&resource.primary_key, columns);
        let order_by = sql::key_as_named(&options.order_by, columns);
        let compared = match staged {
            Some(_) => self.keys_as_compared(&destination, columns, &key, key_ranges).await?,
            None => KeysAsCompared { ranges: Vec::new(), collations: Vec::new() },
        };
        let staging_table = match staged.map(|report| &report.write_path) {
            Some(WritePath::Staging { staging_table }) => staging_table.clone(),
            // A lane that wrote directly runs a statement only when it re-attaches to an earlier
            // delivery's query job (`reconcile::publish_by`), the job under the recorded id
            // being that delivery's: the statement names the staging table this delivery would
            // have had, which was never created.
            Some(WritePath::Direct) => {
                staging_table_name(&delivery.resource(resource.resource.clone()), &resource.table_name)
            }
            None => String::new(),
        };
        let inputs = decide::StatementInputs {
            destination: destination.clone(),
            staging: sql::TableRef { project, dataset, table: &staging_table },
            write_mode: resource.write_mode,
            columns,
            key: &key,
            order_by: &order_by,
            compared: &compared,
            metadata: sql::LoadMetadata {
                columns: &options.metadata_columns,
                run_id: delivery.run_id(),
                execution_id: delivery.execution_id(),
            },
            deletes: options.deletes,
        };
        Ok(decide::statement_sql(choice, &inputs).map(|sql| Statement { staged, sql }))
    }

    /// Whether the destination of a truncation or a snapshot's deletion exists; before the
    /// deletion, with the columns it reads added (unless `effects` only reads).
    async fn destination_ready(
        &self,
        destination: &sql::TableRef<'_>,
        resource: &ResourceRecord,
        choice: StatementChoice,
        effects: Effects,
    ) -> Result<bool, Problem> {
        if choice == StatementChoice::DeleteMissing && effects == Effects::PrepareDestination {
            return self.prepare_snapshot_end(destination, resource).await;
        }
        let (project, dataset, table) = (destination.project, destination.dataset, destination.table);
        let read = |_| self.bigquery.table_fields(project, dataset, table);
        let exists = self.bigquery.retrying_pushback("tables.get", read).await;
        Ok(exists.map_err(|e| e.problem(Stage::Publication))?.is_some())
    }

    /// Before a snapshot completes without rows of its own: whether the destination exists,
    /// with the columns the deletion reads added (as a prepare would have added them: a run
    /// whose rows all came in earlier segments did, but an empty snapshot prepared nothing).
    async fn prepare_snapshot_end(
        &self,
        destination: &sql::TableRef<'_>,
        resource: &ResourceRecord,
    ) -> Result<bool, Problem> {
        let fail = |e: BigQueryError| e.problem(Stage::Publication);
        let (project, dataset, table) = (destination.project, destination.dataset, destination.table);
        let read = |_| self.bigquery.table_fields(project, dataset, table);
        let Some(existing) = self.bigquery.retrying_pushback("tables.get", read).await.map_err(fail)? else {
            return Ok(false);
        };
        let wanted = resource.write_options.publication_columns(resource.write_mode, &[]);
        let add = |_| self.bigquery.add_missing_columns(project, dataset, table, &existing, &wanted);
        self.bigquery.retrying_pushback("tables.patch", add).await.map_err(fail)?;
        Ok(true)
    }

    /// How the destination compares the publication's STRING keys ([`KeysAsCompared::in_table`]),
    /// read from its schema when a key column (or a key range) is a STRING. A schema that
    /// cannot be read fails the publication (a redelivery publishes it): folded by code point,
    /// keys a collated column holds as one would reach the MERGE as several rows.
    async fn keys_as_compared(
        &self,
        destination: &sql::TableRef<'_>,
        columns: &[Column],
        key: &[String],
        key_ranges: &[KeyRange],
    ) -> Result<KeysAsCompared, Problem> {
        let string_keys = string_key_columns(columns, key);
        if string_keys.is_empty() && !key_ranges.iter().any(is_string_range) {
            return Ok(KeysAsCompared { ranges: key_ranges.to_vec(), collations: Vec::new() });
        }
        let read = |_| self.bigquery.get_table(destination.project, destination.dataset, destination.table);
        let table = self.bigquery.retrying_pushback("tables.get", read).await;
        let table = table.map_err(|e| e.problem(Stage::Publication))?.unwrap_or_default();
        let compared = KeysAsCompared::in_table(&table, &string_keys, key_ranges);
        let collated = collated_columns(&table);
        for key_column in &string_keys {
            let has_own = compared.collations.iter().any(|(column, _)| same_name(column, key_column));
            if !has_own && collated.iter().any(|column| same_name(column, key_column)) {
                tracing::warn!(
                    table = destination.table,
                    column = key_column,
                    "key column reports no collation of its own under a table default collation: folded by code point"
                );
            }
        }
        Ok(compared)
    }
}
