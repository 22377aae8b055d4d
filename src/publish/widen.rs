//! `widen_columns`: existing destination columns widened to the type the batches send (INT64
//! to NUMERIC, say), the one DDL statement the gateway submits. Set-up checked the widening
//! (every other check ran against the table as it would be widened) and left the table as it
//! was; the publication widens it here, after the commit's barrier and before the resource's
//! statement, with one `ALTER TABLE` query job labelled with the run under a keyed job id. An
//! execution that fails or is aborted before the barrier leaves the column types as they were.

use super::Publisher;
use super::job_id::{self, JobKind};
use super::plan::PlannedPublication;
use super::sql::{TableRef, alter_column_types};
use crate::bigquery::BigQueryError;
use crate::bigquery::jobs::{QueryJob, insert_pushed_back};
use crate::bigquery::metadata::widenings;
use crate::bigquery::retry::RetryDriver;
use crate::model::columns::BigQueryType;
use crate::model::staging::WritePath;
use crate::pipeline::LaneReport;
use crate::store::{Publishing, RunRecord};

impl Publisher {
    /// Widens the destination columns the publication's staged rows need wider, when the
    /// resource declared `widen_columns` and its lane staged rows for a query to read. Nothing
    /// to do when the table has the wider types already (a redelivery after an earlier
    /// delivery widened them) or does not exist.
    pub(super) async fn widen_before_publishing(
        &self,
        run: &RunRecord,
        publishing: &Publishing,
        planned: PlannedPublication<'_>,
    ) -> Result<(), BigQueryError> {
        let (resource, delivery) = (planned.resource, publishing.delivery());
        let Some(staged @ LaneReport { write_path: WritePath::Staging { .. }, .. }) = planned.staged else {
            return Ok(());
        };
        if !resource.write_options.widen_columns {
            return Ok(());
        }
        let (project, dataset, table) = (&run.destination.project, &run.destination.dataset, &resource.table_name);
        let read = |_| self.bigquery.table_fields(project, dataset, table);
        let Some(existing) = self.bigquery.retrying_pushback("tables.get", read).await? else { return Ok(()) };
        let widened: Vec<(String, BigQueryType)> =
            widenings(&existing, &staged.destination_columns).into_iter().map(|(c, t)| (c.to_string(), t)).collect();
        if widened.is_empty() {
            return Ok(());
        }
        let sql = alter_column_types(&TableRef { project, dataset, table }, &widened);
        let job_id = job_id::widening_job_id(&self.job_ids, delivery, &resource.resource, &sql);
        let span = tracing::trace_span!(target: crate::traces::TARGET, "publication.widening",
            resource = %resource.resource, table = %table, bigquery.job_id = %job_id);
        let mut labels = job_id::run_job_labels(JobKind::Widening, run, delivery, &resource.resource);
        labels.extend(crate::traces::trace_id_of(&span).map(|trace_id| (job_id::TRACE_LABEL, trace_id)));
        let job = QueryJob {
            project: run.job_project.as_deref().unwrap_or(project),
            location: run.destination.location(),
            job_id: &job_id,
            sql: &sql,
            labels: &labels,
            maximum_bytes_billed: None,
            statement_byte_budget: None,
            timeout: self.query_job_timeout,
            recorded_statements: &[],
        };
        let names: Vec<&str> = widened.iter().map(|(c, _)| c.as_str()).collect();
        tracing::info!(run_id = %delivery.run_id(), execution_id = %delivery.execution_id(), %table,
            columns = %names.join(","), %job_id, "bigquery.table.columns_widened");
        // Boxed: a query job's future is large.
        // Its job is run again when BigQuery pushed back on jobs.insert: the one level that retries it.
        let run = |_| tracing::Instrument::instrument(Box::pin(self.bigquery.run_query_job(&job)), span.clone());
        RetryDriver::new(&self.retry, "jobs.insert").run(insert_pushed_back, run).await?;
        Ok(())
    }
}
