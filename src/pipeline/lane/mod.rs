//! One resource's upload lane: where its rows go ([`LaneTarget`]), the clients and limits it
//! shares ([`LaneContext`]) and the two tasks it runs, joined by a channel: the
//! [`accumulator`] coalescing accepted rows into upload batches, and the upload, which sets up
//! the resource's tables and PENDING stream ([`set_up`], or takes over a stream another
//! replica handed over) and appends the batches to it ([`appender`]), each once its staged
//! rows pass what the destination asks of them ([`check_uploads`]; set-up publishes those
//! [`DestinationRules`] in the lane's [`LearnedDestination`], where intake checks later batches
//! against them). A drained lane hands commit a [`LaneReport`]; a failed one fails its execution.

pub(super) mod accumulator;
mod appender;
mod connections;
mod destination_tables;
mod set_up;
mod write_path;

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::{Semaphore, mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use super::admission::QueuedRows;
use crate::bigquery::BigQuery;
use crate::bigquery::fair::Tenant;
use crate::bigquery::per_destination::ProjectLocation;
use crate::bigquery::retry::RetryPolicy;
use crate::bigquery::write::SendQueueAccount;
use crate::error::{ErrorCode, Problem};
use crate::ingest::destination_rules::DestinationRules;
use crate::ingest::prepare::BodySummary;
use crate::model::columns::Column;
use crate::model::staging::{WritePath, staging_table_name};
use crate::model::table_layout::{LayoutDifference, TableLayout};
use crate::model::write_options::DeclaredPath;
use crate::model::{Batching, WriteMode};
use crate::model::{ResourceName, ResourceRef};
use crate::store::Store;
use crate::store::{HandedOverStream, ResourceRecord, RunRecord};
use accumulator::{LanePressure, UploadBatch, accumulate};
use appender::{AppendSettings, Appender, LaneStream};
pub(crate) use connections::AppendConnections;
use destination_tables::DestinationTables;
use set_up::SetUp;

/// Where one lane's rows go.
#[derive(Debug, Clone)]
pub(crate) struct LaneTarget {
    /// The resource in its delivery.
    pub(crate) resource: ResourceRef,
    pub(crate) project: String,
    pub(crate) dataset: String,
    pub(crate) location: Option<String>,
    pub(crate) destination_table: String,
    /// The staging table set-up creates when the lane loads through staging.
    pub(crate) staging_table: String,
    /// The staged columns the publication writes into the destination.
    pub(crate) destination_columns: Vec<Column>,
    /// The columns the publication sets beyond the staged ones (load metadata, soft deletes).
    pub(crate) publication_columns: Vec<Column>,
    /// How the destination table is laid out when the gateway creates it.
    pub(crate) destination_layout: TableLayout,
    /// The staging table's columns (staged types, `_filament_op`, `_filament_seq`).
    pub(crate) staging_columns: Vec<Column>,
    /// The staging schema as one encapsulated IPC message (the writer schema).
    pub(crate) serialized_schema: Bytes,
    /// The canonical schema digest of the body that started the lane: every batch of the
    /// lane has it (the receipt's transaction refuses another).
    pub(crate) schema_sha256: String,
    pub(crate) batching: BatchingPolicy,
    /// Set-up widens an existing column narrower than the batches' type (the resource's
    /// `widen_columns`).
    pub(crate) widen_columns: bool,
    /// The key and `order_by` columns: compared as sent, so never cast into an existing
    /// table's wider type.
    pub(crate) compared_columns: Vec<String>,
    /// The write path the resource declared: set-up writes the stream into the destination
    /// where it asks to and its columns allow ([`write_path`]).
    pub(crate) write_path: DeclaredPath,
    /// The stream a replica that shut down handed over, as the batch that started the lane
    /// found it: the lane goes on appending to it at its recorded offset.
    pub(crate) handed_over: Option<HandedOverStream>,
    /// How the resource's record said the destination's layout differs from the declaration
    /// when the lane started: set-up writes its own finding only when it differs.
    pub(crate) recorded_layout_mismatch: Vec<LayoutDifference>,
    /// The run's principal: the lane's calls to BigQuery take their turns under it.
    pub(crate) tenant: Tenant,
    /// Which staged rows' values the publication writes ([`DestinationRules`]).
    pub(crate) write_mode: WriteMode,
}

/// What the lane learned of its destination that staged rows must satisfy: empty until its
/// set-up finishes (or it takes over a handed-over stream), then the destination's rules for
/// the rest of the delivery. Intake checks each later batch against them.
///
/// The rules were learned from the columns of the lane's first batch, so they hold only for
/// batches of its schema: a batch of another schema is refused by its receipt's transaction
/// (`schema_mismatch`), and checking its rows against rules of other columns is not safe.
#[derive(Debug)]
pub(crate) struct LearnedDestination {
    /// The canonical schema digest of the batch that started the lane (the staging row's).
    schema_sha256: String,
    rules: OnceLock<Arc<DestinationRules>>,
}

impl LearnedDestination {
    /// Nothing learned yet, for a lane whose first batch had the schema of `schema_sha256`.
    pub(crate) fn of_schema(schema_sha256: String) -> Self {
        Self { schema_sha256, rules: OnceLock::new() }
    }

    /// The rules for a batch of the schema of `schema_sha256`, once set-up has learned them:
    /// `None` before, and for a batch of another schema than the lane's.
    pub(crate) fn rules_for(&self, schema_sha256: &str) -> Option<Arc<DestinationRules>> {
        (self.schema_sha256 == schema_sha256).then(|| self.rules.get().cloned()).flatten()
    }
}

/// When accumulated rows become an upload batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BatchingPolicy {
    pub(crate) max_rows: usize,
    /// Encoded bytes per upload batch; never above the AppendRows payload budget.
    pub(crate) max_bytes: usize,
    pub(crate) flush_interval: Duration,
}

/// Upload batches default to 20,000 rows, about 8 MiB (the request budget) and a 10 s flush.
pub(crate) const DEFAULT_BATCH_ROWS: usize = 20_000;
pub(crate) const DEFAULT_FLUSH_INTERVAL: Duration = Duration::from_secs(10);

impl BatchingPolicy {
    /// The run's batching settings over the defaults, upload batches never above
    /// `max_payload_bytes` (one AppendRows request's payload).
    pub(crate) fn new(batching: &Batching, max_payload_bytes: usize) -> Self {
        Self {
            max_rows: batching.max_rows.map_or(DEFAULT_BATCH_ROWS, |rows| rows as usize),
            max_bytes: batching.max_bytes.map_or(max_payload_bytes, |bytes| bytes as usize).min(max_payload_bytes),
            flush_interval: batching.flush_interval_ms.map_or(DEFAULT_FLUSH_INTERVAL, Duration::from_millis),
        }
    }
}

impl LaneTarget {
    /// The project and location whose limits the lane's set-up counts against.
    pub(crate) fn project_location(&self) -> ProjectLocation {
        ProjectLocation::new(&self.project, self.location.as_deref())
    }

    /// What the destination table must hold (created or extended with these): the staged
    /// columns, then those the publication sets.
    pub(crate) fn table_columns(&self) -> Vec<Column> {
        self.destination_columns.iter().chain(&self.publication_columns).cloned().collect()
    }

    /// Where the lane of `resource` (declared as `declared`, in `run`) sends the rows of its
    /// first accepted body, `summary`; `handed_over`, the stream it goes on with, if any.
    pub(crate) fn new(
        resource: ResourceRef,
        run: &RunRecord,
        declared: &ResourceRecord,
        summary: BodySummary,
        handed_over: Option<HandedOverStream>,
    ) -> Self {
        let staging_table = staging_table_name(&resource, &declared.table_name);
        let BodySummary {
            mapped,
            serialized_schema,
            max_payload_bytes,
            destination_layout,
            canonical_schema_sha256,
            ..
        } = summary;
        let publication_columns =
            declared.write_options.publication_columns(declared.write_mode, &mapped.destination_columns);
        Self {
            resource,
            project: run.destination.project.clone(),
            dataset: run.destination.dataset.clone(),
            location: run.destination.location().map(str::to_string),
            destination_table: declared.table_name.clone(),
            staging_table,
            destination_columns: mapped.destination_columns,
            publication_columns,
            destination_layout,
            staging_columns: mapped.staging_columns,
            serialized_schema,
            schema_sha256: canonical_schema_sha256,
            batching: BatchingPolicy::new(&run.batching, max_payload_bytes),
            widen_columns: declared.write_options.widen_columns,
            write_path: declared.write_options.write_path,
            handed_over,
            recorded_layout_mismatch: declared.layout_mismatch.clone().unwrap_or_default(),
            tenant: Tenant::principal(&run.principal),
            write_mode: declared.write_mode,
            compared_columns: mapped
                .key_columns
                .iter()
                .chain(&mapped.order_columns)
                .map(|(name, _)| name.clone())
                .collect(),
        }
    }
}

/// Shared limits and clients every lane uses.
#[derive(Debug, Clone)]
pub(crate) struct LaneContext {
    pub(crate) bigquery: BigQuery,
    pub(crate) store: Store,
    /// The upload budget, where connections count the compressed frames they queue.
    pub(crate) upload_budget: Arc<dyn SendQueueAccount>,
    /// Gateway-wide AppendRows requests in flight.
    pub(crate) inflight_requests: Arc<Semaphore>,
    /// Gateway-wide AppendRows connections open (`max_append_connections`) and how long an
    /// idle one lives.
    pub(crate) append_connections: AppendConnections,
    /// Resources being set up (tables, stream) at once: the adaptive set-up limits, one per
    /// project and location.
    pub(crate) prepares: crate::bigquery::adaptive::AdaptiveLimits,
    /// `CreateWriteStream` calls at once: the adaptive stream-creation limits (BigQuery limits
    /// their rate per project and region).
    pub(crate) stream_creations: crate::bigquery::adaptive::AdaptiveLimits,
    pub(crate) inflight_per_stream: usize,
    pub(crate) retry: RetryPolicy,
    pub(crate) append_timeouts: AppendTimeouts,
    /// The destination tables each delivery's lanes have read, so resources sharing a table
    /// read it once.
    pub(crate) destination_tables: Arc<DestinationTables>,
}

/// When an AppendRows attempt counts as failed although its connection stays open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct AppendTimeouts {
    /// How long the oldest request in flight waits for its answer before the attempt fails
    /// (retryable, as a broken connection).
    pub(crate) response: Duration,
    /// How long a request waits for the connection to take it (a peer that stopped reading
    /// holds it in HTTP/2 flow control) before the attempt fails, retryable.
    pub(crate) send: Duration,
}

/// What a drained lane hands to commit.
#[derive(Debug, Clone)]
pub(crate) struct LaneReport {
    pub(crate) resource: ResourceName,
    /// Where the stream writes: a staging table (committed before the barrier, read by the
    /// publication's query job), or the destination itself (the publication commits it).
    pub(crate) write_path: WritePath,
    pub(crate) destination_columns: Vec<Column>,
    pub(crate) stream_name: String,
    /// Rows appended to the stream (acknowledged, in order).
    pub(crate) rows_acknowledged: i64,
}

impl From<crate::store::HandedOverStream> for LaneReport {
    /// A stream drained by a replica that shut down, whose lane did not run here.
    fn from(stream: crate::store::HandedOverStream) -> Self {
        Self {
            resource: stream.resource,
            write_path: stream.write_path,
            destination_columns: stream.destination_columns,
            stream_name: stream.stream_name,
            rows_acknowledged: stream.rows_acknowledged,
        }
    }
}

/// What the API sends a lane.
#[derive(Debug)]
pub(crate) enum LaneCommand {
    Rows(QueuedRows),
    /// Queue whatever is accumulated, then answer.
    Flush(oneshot::Sender<()>),
}

/// Runs the lane until its command channel closes and everything is appended, it fails (and
/// fails the execution), or it is cancelled.
pub(super) async fn run_lane(
    context: LaneContext,
    target: LaneTarget,
    commands: mpsc::UnboundedReceiver<LaneCommand>,
    pressure: LanePressure,
    cancel: CancellationToken,
    learned: Arc<LearnedDestination>,
) -> Result<LaneReport, Problem> {
    let context = LaneContext { bigquery: context.bigquery.on_behalf_of(target.tenant.clone()), ..context };
    let (upload_batches_tx, upload_batches_rx) = mpsc::unbounded_channel();
    // Its own task: the appender must be able to fail (and fail the execution) at once, while
    // the accumulator would otherwise wait for the lane to be drained.
    let accumulator = tokio::spawn(accumulate(target.batching, commands, upload_batches_tx, pressure));
    let result = tokio::select! {
        result = upload(&context, &target, upload_batches_rx, &learned) => result,
        () = cancel.cancelled() => {
            accumulator.abort();
            let detail = format!("uploads of resource {} were cancelled", target.resource.resource);
            return Err(Problem::new(ErrorCode::UploadFailed, detail));
        }
    };
    // On failure, dropping the accumulated rows returns their bytes to the budget.
    accumulator.abort();
    if let Err(problem) = &result {
        let delivery = &target.resource.delivery;
        tracing::warn!(run_id = %delivery.run_id(), execution_id = %delivery.execution_id(),
            resource = %target.resource.resource, code = %problem.code, detail = %problem.detail,
            cause = problem.cause.as_deref(), "upload lane failed; failing the execution");
        if let Err(e) = context.store.fail_execution(delivery, problem).await {
            tracing::error!(error = %e, "could not record the failed execution");
        }
    }
    result
}

/// Sets up the lane's tables and stream (or takes over the stream a replica handed over, at
/// its recorded offset), publishes what the destination asks of staged rows in `learned`, then
/// checks and appends every upload batch it receives until `upload_batches` closes and all are
/// acknowledged.
async fn upload(
    context: &LaneContext,
    target: &LaneTarget,
    upload_batches: mpsc::UnboundedReceiver<UploadBatch>,
    learned: &LearnedDestination,
) -> Result<LaneReport, Problem> {
    // Held until the lane drains, so the delivery's other lanes into this table find what it read.
    let (project, dataset) = (&target.project, &target.dataset);
    let destination = context.destination_tables.of(&target.resource, project, dataset, &target.destination_table);
    let (set_up, start_offset) = match target.handed_over.clone() {
        // Another replica drained this stream and shut down: go on at its recorded offset.
        Some(stream) => {
            let set_up = SetUp {
                stream_name: stream.stream_name,
                destination_columns: stream.destination_columns,
                write_path: stream.write_path,
            };
            (set_up, stream.rows_acknowledged)
        }
        None => (set_up::set_up(context, target, &destination).await?, 0),
    };
    let SetUp { stream_name, destination_columns, write_path } = set_up;
    let rules =
        Arc::clone(learned.rules.get_or_init(|| DestinationRules::new(&destination_columns, target.write_mode)));
    let stream = LaneStream { context, target, stream_name: &stream_name };
    let settings = AppendSettings::of_lane(context, target, &stream_name, start_offset);
    let (checked_tx, checked_rx) = mpsc::unbounded_channel();
    let checking = check_uploads(&rules, upload_batches, checked_tx);
    let ((), rows_acknowledged) = tokio::try_join!(checking, Appender::run(&stream, settings, checked_rx))?;
    Ok(LaneReport {
        resource: target.resource.resource.clone(),
        write_path,
        destination_columns,
        stream_name,
        rows_acknowledged,
    })
}

/// Passes each upload batch on to the appender once its staged rows pass `rules` (then drops
/// them: only the encoded message goes on). The first that does not fails the lane, and with
/// it the execution, before the barrier: rows accepted before set-up learned the destination
/// (later batches were checked at intake). The error names the batch's `seq`, column and row.
async fn check_uploads(
    rules: &DestinationRules,
    mut upload_batches: mpsc::UnboundedReceiver<UploadBatch>,
    checked: mpsc::UnboundedSender<UploadBatch>,
) -> Result<(), Problem> {
    while let Some(mut upload) = upload_batches.recv().await {
        for staged in std::mem::take(&mut upload.staged) {
            let refused = |problem: Problem| Problem {
                detail: format!("batch seq {}: {}", staged.seq, problem.detail),
                ..problem
            };
            match &staged.batch {
                Some(batch) => rules.check(batch, staged.first_row).map_err(|e| refused(e.into()))?,
                None if rules.is_empty() => {}
                None => return Err(Problem::internal("an upload batch lacks the staged rows to check")),
            }
        }
        if checked.send(upload).is_err() {
            // The appender ended: its own result says why.
            return Ok(());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_are_given_only_for_batches_of_the_schema_they_were_learned_from() {
        let learned = LearnedDestination::of_schema("first".into());
        assert!(learned.rules_for("first").is_none(), "nothing learned before set-up");
        let rules = DestinationRules::new(&[], WriteMode::FullAppend);
        learned.rules.set(Arc::clone(&rules)).unwrap();
        assert!(learned.rules_for("first").is_some_and(|given| Arc::ptr_eq(&given, &rules)));
        assert!(learned.rules_for("another").is_none(), "a batch of another schema is refused by its receipt");
    }
}
