//! Setting up one lane's destination before its first append: the dataset, the destination
//! table (created with the resource's layout, or checked and extended with missing NULLABLE
//! columns, its layout compared with the declaration and never changed), the staging table
//! (expiring after [`STAGING_TABLE_TTL`], without layout: it is read whole once by the
//! publication) and its PENDING write stream, whose name is recorded in Postgres before any row
//! is sent. The [`super::appender`] appends to that stream. A resource declared `direct_append`
//! whose columns go in as sent gets no staging table: its stream writes into the destination
//! ([`super::write_path`]). A declared widening (`widen_columns`) is checked here and left to
//! the publication, after the commit's barrier (`publish::widen`).

use tokio::time::Instant;

use google_cloud_bigquery_v2::model::{Table, TableFieldSchema};

use super::destination_tables::DestinationTable;
use super::write_path::{self, Chosen};
use super::{LaneContext, LaneTarget};
use crate::bigquery::error::{Stage, dataset_location_mismatch};
use crate::bigquery::metadata::{
    layout_differences, published_columns, required_columns_missing, type_conflicts, widenings,
};
use crate::bigquery::retry::{Classified, Failure, RetryClass, RetryDriver};
use crate::bigquery::{BigQuery, BigQueryError, table_path};
use crate::error::{ErrorCode, Problem};
use crate::model::columns::{BigQueryType, Column};
use crate::model::staging::{STAGING_TABLE_TTL, WritePath};
use crate::model::table_layout::LayoutDifference;
use crate::store::StreamChange;
use crate::telemetry::{LayoutMismatch, PhaseTiming};

/// Sets up the lane's tables and stream under the adaptive set-up limit of its project and
/// location ([`crate::bigquery::adaptive`], at most `max_concurrent_set_ups` at once into one;
/// `CreateWriteStream` under a limit of its own within it), taking turns with the other
/// principals' set-ups (`crate::bigquery::fair`); returns the PENDING stream's name and the
/// columns as the destination takes them.
///
/// The [`RetryDriver`] here is the one level that retries BigQuery's pushback on the set-up's
/// REST calls: the client makes each once, a refusal ends the attempt (which tells the limit),
/// and the whole set-up runs again after the retry policy's quota backoff (every step is
/// idempotent) until the pushback has lasted its `quota_wait`: a quota slows a run down, it
/// does not fail one a slower pace completes.
pub(super) async fn set_up(
    context: &LaneContext,
    target: &LaneTarget,
    destination: &DestinationTable,
) -> Result<SetUp, Problem> {
    let (bigquery, location) = (&context.bigquery, target.project_location());
    let attempt = |_| {
        let set_up = set_up_once(context, bigquery, target, destination);
        context.prepares.run(&location, bigquery.tenant(), set_up)
    };
    let pushed_back = |answer: &Result<SetUp, SetUpFailure>| match answer {
        Err(SetUpFailure::PushedBack(problem)) => Some(Failure::pushback(&problem.detail)),
        _ => None,
    };
    let driver = RetryDriver::new(&context.retry, "set_up").resource(&target.resource.resource);
    match driver.run(pushed_back, attempt).await {
        Ok(set_up) => Ok(set_up),
        Err(SetUpFailure::PushedBack(problem) | SetUpFailure::Failed(problem)) => Err(problem),
    }
}

/// Why a set-up attempt ended without a stream.
#[derive(Debug)]
enum SetUpFailure {
    /// BigQuery pushed back on one of its REST calls (`quota_exceeded`): the set-up runs again.
    PushedBack(Problem),
    /// Anything else, `CreateWriteStream`'s own retries run out included.
    Failed(Problem),
}

/// A problem of set-up's own (a location or layout refused, a store failure) is never pushback:
/// BigQuery's pushback arrives as a [`BigQueryError`] and is told there.
impl From<Problem> for SetUpFailure {
    fn from(problem: Problem) -> Self {
        SetUpFailure::Failed(problem)
    }
}

impl From<BigQueryError> for SetUpFailure {
    /// Pushback is told by the error itself (a bare 429 too, and a job failed for its rate
    /// limits), before it becomes a problem.
    fn from(error: BigQueryError) -> Self {
        let problem = error.problem(Stage::Setup);
        match RetryClass::of(&error) {
            RetryClass::Pushback => SetUpFailure::PushedBack(problem),
            _ => SetUpFailure::Failed(problem),
        }
    }
}

impl Classified for SetUpFailure {
    fn retry_class(&self) -> RetryClass {
        match self {
            SetUpFailure::PushedBack(_) => RetryClass::Pushback,
            SetUpFailure::Failed(_) => RetryClass::Permanent,
        }
    }
}

/// What set-up hands the appender.
#[derive(Debug, Clone)]
pub(super) struct SetUp {
    /// The PENDING stream the lane appends to.
    pub(super) stream_name: String,
    /// The staged columns as the destination takes them: the lane's, with the casts into an
    /// existing table's wider types (`Column::published_as`).
    pub(super) destination_columns: Vec<Column>,
    /// Where the stream writes: the staging table, or the destination itself.
    pub(super) write_path: WritePath,
}

/// One attempt at the lane's set-up: the dataset, the destination, the staging table, the
/// stream (its name recorded in Postgres before any row is sent).
async fn set_up_once(
    context: &LaneContext,
    bigquery: &BigQuery,
    target: &LaneTarget,
    destination: &DestinationTable,
) -> Result<SetUp, SetUpFailure> {
    let started = Instant::now();
    let resource = &target.resource;
    tracing::info!(run_id = %resource.delivery.run_id(), execution_id = %resource.delivery.execution_id(),
        resource = %resource.resource, table = %target.destination_table, "bigquery.write.prepare.started");
    let (project, dataset) = (target.project.as_str(), target.dataset.as_str());
    let existing_location = bigquery.ensure_dataset(project, dataset, target.location.as_deref()).await?;
    check_location(target, existing_location.as_deref())?;
    let DestinationSetUp { destination_columns, widened_at_publication } =
        set_up_destination(context, bigquery, target, destination).await?;
    let (staging_table, staging_columns) = (&target.staging_table, &target.staging_columns);
    let Chosen { path, declined } = write_path::choose(
        target.write_path,
        staging_table,
        staging_columns,
        &destination_columns,
        &widened_at_publication,
    );
    let stream_table = match &path {
        WritePath::Direct => &target.destination_table,
        WritePath::Staging { staging_table } => {
            let expires_at_ms = chrono::Utc::now().timestamp_millis() + STAGING_TABLE_TTL.as_millis() as i64;
            bigquery
                .create_staging_table(project, dataset, staging_table, staging_columns, Some(expires_at_ms))
                .await?;
            staging_table
        }
    };
    // A stream created by an attempt whose answer was lost stays empty and is never committed.
    // Stream creation has its own limit: BigQuery's rate limit on it is the project's, and its
    // refusals say nothing about the table calls.
    // Its own retries ran out: not run again here.
    let stream_name = create_pending_stream(context, target, &table_path(project, dataset, stream_table))
        .await
        .map_err(|e| SetUpFailure::Failed(e.problem(Stage::Upload)))?;
    let duration = started.elapsed();
    let (duration_ms, table) = (duration.as_millis() as u64, target.destination_table.as_str());
    let declined = declined.as_deref();
    let created = StreamChange::Created { stream_name: &stream_name, duration_ms, table, path: &path, declined };
    context.store.change_stream(resource, created).await.map_err(Problem::from)?;
    PhaseTiming { resource: &resource.resource, phase: "set_up", duration }.emit();
    Ok(SetUp { stream_name, destination_columns, write_path: path })
}

/// Runs `CreateWriteStream` again after transient failures and pushback, as the retry policy
/// decides (a connection cut under it must not fail the execution). Each attempt first waits
/// its turn under the stream quota (`bigquery::quota`; a refusal slows that pace), then takes a
/// place under the stream-creation limit, which learns from its result; the backoff is waited
/// without one, so a refused lane does not keep others from creating theirs.
async fn create_pending_stream(
    context: &LaneContext,
    target: &LaneTarget,
    table_path: &str,
) -> Result<String, BigQueryError> {
    let (quotas, destination) = (&context.bigquery.quotas, target.project_location());
    let attempt = |_| async {
        quotas.before_create_write_stream(&destination).await;
        let create = context.bigquery.writer().create_pending_stream(table_path);
        context.stream_creations.run(&destination, quotas.tenant(), create).await
    };
    let refused = || quotas.create_write_stream_refused(&destination);
    let failure = |answer: &Result<String, BigQueryError>| answer.as_ref().err().map(Failure::of);
    let driver = RetryDriver::new(&context.retry, "CreateWriteStream").resource(&target.resource.resource);
    driver.on_pushback(&refused).run(failure, attempt).await
}

/// Refuses a dataset that exists in another location than the run's (compared
/// case-insensitively: `US` and `us` are one location) before any row is uploaded: otherwise
/// it would only show at publication, once every row was sent.
fn check_location(target: &LaneTarget, existing: Option<&str>) -> Result<(), Problem> {
    let (Some(wanted), Some(existing)) = (target.location.as_deref(), existing) else { return Ok(()) };
    if existing.is_empty() || existing.eq_ignore_ascii_case(wanted) {
        return Ok(());
    }
    Err(dataset_location_mismatch(format!(
        "dataset {}:{} is in location {existing}, the run's location is {wanted}",
        target.project, target.dataset
    )))
}

/// What set-up found the destination takes.
struct DestinationSetUp {
    /// The staged columns as the destination takes them (as widened, when it will be).
    destination_columns: Vec<Column>,
    /// The existing columns the publication widens (`widen_columns`), after the commit's
    /// barrier: set-up checked the widening, and leaves the table's types as they are.
    widened_at_publication: Vec<String>,
}

/// Creates the destination table with its layout, or checks that the existing one takes the
/// batches' columns (existing columns are never altered here: a declared widening is checked
/// and left to the publication), adds the missing ones and reports a layout other than the
/// declared one.
///
/// Reads the table once per delivery (`destination`, held by every lane of the delivery into
/// it, one set-up at a time): a set-up that finds the table as the last one read it, and leaves
/// it so, leaves it remembered; one that creates or alters it leaves it to be read again.
async fn set_up_destination(
    context: &LaneContext,
    bigquery: &BigQuery,
    target: &LaneTarget,
    destination: &DestinationTable,
) -> Result<DestinationSetUp, SetUpFailure> {
    let mut last_read = destination.lock().await;
    let layout = &target.destination_layout;
    let (project, dataset) = (target.project.as_str(), target.dataset.as_str());
    let (table, wanted) = (&target.destination_table, &target.table_columns());
    let existing_table = match last_read.take() {
        Some(table) => Some(table),
        None => bigquery.get_table(project, dataset, table).await?,
    };
    let Some(existing_table) = existing_table else {
        bigquery.create_destination_table(project, dataset, table, wanted, layout).await?;
        record_layout_mismatch(context, target, &[]).await.map_err(Problem::from)?;
        let destination_columns = target.destination_columns.clone();
        return Ok(DestinationSetUp { destination_columns, widened_at_publication: Vec::new() });
    };
    report_layout(context, target, &existing_table).await?;
    let existing = existing_table.schema.as_ref().map(|s| s.fields.clone()).unwrap_or_default();
    // Widening (declared `widen_columns`) is decided and every check runs against the table as
    // it would be after it; the table itself is widened by the publication, after the commit's
    // barrier (`publish::widen`): a delivery that fails or is aborted leaves its types as they were.
    let widened: Vec<(String, BigQueryType)> = match target.widen_columns {
        true => {
            widenings(&existing, &target.destination_columns).into_iter().map(|(c, t)| (c.to_string(), t)).collect()
        }
        false => Vec::new(),
    };
    let as_widened = with_types(existing.clone(), &widened);
    let destination_columns = check_compatible(target, &as_widened)?;
    // The patch sends the table's schema as it is, with the added columns after it.
    let added = add_missing_columns(bigquery, target, &existing).await?;
    if added == 0 {
        *last_read = Some(existing_table);
    }
    let widened_at_publication = widened.into_iter().map(|(column, _)| column).collect();
    Ok(DestinationSetUp { destination_columns, widened_at_publication })
}

/// `existing` with the types of `widened` columns replaced by the wider ones.
fn with_types(mut existing: Vec<TableFieldSchema>, widened: &[(String, BigQueryType)]) -> Vec<TableFieldSchema> {
    for field in &mut existing {
        if let Some((_, wider)) = widened.iter().find(|(c, _)| c == &field.name) {
            field.r#type = wider.type_name().to_string();
        }
    }
    existing
}

/// Records how the destination's layout differs from the declaration, unless the resource's
/// record already says so (the common case: no statement).
async fn record_layout_mismatch(
    context: &LaneContext,
    target: &LaneTarget,
    differences: &[LayoutDifference],
) -> crate::store::StoreResult<()> {
    if differences == target.recorded_layout_mismatch.as_slice() {
        return Ok(());
    }
    context.store.set_layout_mismatch(&target.resource, differences).await
}

/// Compares the existing table's layout with the declared one and records (and logs) how it
/// differs; the table is left as it is.
async fn report_layout(context: &LaneContext, target: &LaneTarget, existing: &Table) -> Result<(), Problem> {
    let differences = match &target.destination_layout.declared {
        Some(declared) => layout_differences(existing, declared),
        None => Vec::new(),
    };
    record_layout_mismatch(context, target, &differences).await?;
    if !differences.is_empty() {
        let delivery = &target.resource.delivery;
        LayoutMismatch {
            run_id: delivery.run_id(),
            execution_id: delivery.execution_id(),
            resource: &target.resource.resource,
            table: &target.destination_table,
            differences: &differences,
        }
        .emit();
    }
    Ok(())
}

/// Checks that the existing table takes the batches' columns: each one as it is or cast into
/// a wider numeric type (never a key or `order_by` column, whose values must compare as sent),
/// every REQUIRED column sent. Returns the staged columns as the table takes them.
fn check_compatible(target: &LaneTarget, existing: &[TableFieldSchema]) -> Result<Vec<Column>, Problem> {
    let (dataset, table, wanted) = (&target.dataset, &target.destination_table, &target.table_columns());
    let published = published_columns(existing, &target.destination_columns);
    let cast_keys = published.iter().filter(|c| c.published_as.is_some() && target.compared_columns.contains(&c.name));
    let mut conflicts: Vec<String> = type_conflicts(existing, wanted)
        .iter()
        .map(|(c, has, wants)| format!("{c} is {has} in the table, the batches send {wants}"))
        .collect();
    conflicts.extend(cast_keys.map(|c| {
        format!("{} is a key or order_by column: it must have the table's type, not be cast into it", c.name)
    }));
    if !conflicts.is_empty() {
        return Err(Problem::new(
            ErrorCode::IncompatibleSchema,
            format!("table {dataset}.{table}: {}", conflicts.join("; ")),
        )
        .with_hint(
            "existing columns are never altered: send the table's type (or a narrower one it coerces \
             from: INT64 into NUMERIC, BIGNUMERIC or FLOAT64, NUMERIC into BIGNUMERIC or FLOAT64), declare \
             widen_columns, or load into a new table",
        ));
    }
    let required = required_columns_missing(existing, wanted);
    if !required.is_empty() {
        return Err(Problem::new(
            ErrorCode::RequiredColumnMissing,
            format!("table {dataset}.{table}: REQUIRED column(s) {} missing from the batches", required.join(", ")),
        )
        .with_hint("send every REQUIRED column of the existing table, with a value in every row"));
    }
    Ok(published)
}

/// Adds the columns the existing table lacks (NULLABLE, with `tables.patch`); how many.
async fn add_missing_columns(
    bigquery: &BigQuery,
    target: &LaneTarget,
    existing: &[TableFieldSchema],
) -> Result<usize, SetUpFailure> {
    let (project, dataset) = (target.project.as_str(), target.dataset.as_str());
    let (table, wanted) = (&target.destination_table, &target.table_columns());
    let added = bigquery.add_missing_columns(project, dataset, table, existing, wanted).await?;
    if !added.is_empty() {
        let names: Vec<&str> = added.iter().map(|c| c.name.as_str()).collect();
        let delivery = &target.resource.delivery;
        tracing::info!(run_id = %delivery.run_id(), execution_id = %delivery.execution_id(), %table,
            columns = %names.join(","), "bigquery.table.columns_added");
    }
    Ok(added.len())
}
