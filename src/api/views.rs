//! Response bodies of the API (the contract's Run, Resource, Execution, Receipt) and their
//! construction from stored records.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::error::Problem;
use crate::model::publication_plan::{self, PricedPublication};
use crate::model::table_layout::LayoutDifference;
use crate::model::table_options::TableOptionsDeclaration;
use crate::model::write_options::{DeclaredPath, Deletes, MetadataColumn};
use crate::model::{Batching, Destination, ExecutionState, JobCost, PublicationState, WriteMode};
use crate::store::{
    ExecutionRecord, PlanRow, PublicationRecord, ReceiptRecord, ResourceProgress, ResourceRecord, RunRecord, Store,
};

/// A declared resource.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub(crate) struct ResourceView {
    pub(crate) resource: String,
    /// Destination table in the run's dataset.
    pub(crate) table: String,
    pub(crate) write_mode: WriteMode,
    pub(crate) primary_key: Vec<String>,
    /// The declared table layout, when one was declared.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) table_options: Option<TableOptionsDeclaration>,
    /// The columns ordering its changes, when declared (keyed modes).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) order_by: Vec<String>,
    /// The load metadata columns its publications set, when any were declared.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) metadata_columns: Vec<MetadataColumn>,
    /// What a delete does, when soft (absent: hard).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) deletes: Option<Deletes>,
    /// Whether the run is a snapshot whose completing publication deletes the keys it did not
    /// send (absent: false).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub(crate) delete_missing: bool,
    /// Whether an existing column narrower than the batches' type is widened (absent: false).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub(crate) widen_columns: bool,
    /// Whether the rows are written straight into the destination (absent: false).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub(crate) direct_append: bool,
    /// How the existing destination table's layout differs from `table_options`, as the last
    /// upload found (the table is left as it is and loading goes on); absent when it does not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) layout_mismatch: Option<Vec<LayoutDifference>>,
}

impl From<ResourceRecord> for ResourceView {
    fn from(r: ResourceRecord) -> Self {
        Self {
            resource: r.resource.into(),
            table: r.table_name,
            write_mode: r.write_mode,
            primary_key: r.primary_key,
            table_options: r.table_options.map(TableOptionsDeclaration::from),
            order_by: r.write_options.order_by,
            metadata_columns: r.write_options.metadata_columns,
            deletes: (r.write_options.deletes == Deletes::Soft).then_some(Deletes::Soft),
            delete_missing: r.write_options.delete_missing,
            widen_columns: r.write_options.widen_columns,
            direct_append: r.write_options.write_path == DeclaredPath::Direct,
            layout_mismatch: r.layout_mismatch,
        }
    }
}

/// An execution's id and state, as listed on its run.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub(crate) struct ExecutionSummary {
    pub(crate) execution_id: String,
    pub(crate) state: ExecutionState,
}

/// A run.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub(crate) struct RunView {
    pub(crate) run_id: String,
    pub(crate) destination: Destination,
    pub(crate) batching: Batching,
    /// Project the publication jobs run and are billed in, when not the destination's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) job_project: Option<String>,
    /// Most bytes one publication job may bill, when limited.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) maximum_bytes_billed: Option<i64>,
    /// Most bytes every publication of one execution may process together, when limited.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) maximum_bytes_billed_per_execution: Option<i64>,
    /// Its executions publish every destination in one transaction (unless one opened with
    /// `atomic: false`).
    #[serde(default)]
    pub(crate) atomic: bool,
    /// The principal that created the run.
    #[schema(example = "acme-orders")]
    pub(crate) principal: String,
    pub(crate) resources: Vec<ResourceView>,
    pub(crate) executions: Vec<ExecutionSummary>,
    /// The last checkpoint of the last execution that committed, or null.
    #[schema(value_type = Option<Object>)]
    pub(crate) durable_checkpoint: Option<Box<serde_json::value::RawValue>>,
    /// The execution that made `durable_checkpoint` durable.
    pub(crate) durable_checkpoint_execution_id: Option<String>,
    pub(crate) created_at: DateTime<Utc>,
}

/// The publication (query job) of one destination table.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub(crate) struct PublicationView {
    /// The query job that published, or `BatchCommitWriteStreams` for a direct append.
    pub(crate) job_id: String,
    pub(crate) state: PublicationState,
    pub(crate) rows_affected: Option<i64>,
    pub(crate) error: Option<Problem>,
    /// What the job cost and did, when BigQuery reported it.
    #[serde(flatten)]
    pub(crate) cost: JobCost,
    /// A direct append: the write streams committed into the destination (or being committed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) committed_streams: Option<Vec<String>>,
}

impl From<PublicationRecord> for PublicationView {
    fn from(p: PublicationRecord) -> Self {
        Self {
            job_id: p.job_id,
            state: p.state,
            rows_affected: p.rows_affected,
            error: p.error,
            cost: p.cost,
            committed_streams: p.committed_streams,
        }
    }
}

/// Progress of one resource in the execution's current delivery.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub(crate) struct ExecutionResourceView {
    pub(crate) resource: String,
    pub(crate) table: String,
    pub(crate) write_mode: WriteMode,
    pub(crate) batches: i64,
    pub(crate) rows_received: i64,
    pub(crate) bytes_received: i64,
    /// Rows BigQuery acknowledged into the pending stream.
    pub(crate) rows_acknowledged: i64,
    pub(crate) publication: Option<PublicationView>,
}

/// One planned publication of the plan at the barrier.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub(crate) struct PlannedPublicationView {
    #[serde(flatten)]
    pub(crate) priced: PricedPublication,
    /// `bytes_processed` at the plan's `price_per_tib_usd`, in US dollars (null when unpriced).
    pub(crate) estimated_cost_usd: Option<f64>,
}

/// The priced plan the commit recorded at its barrier, before anything was published: each
/// publication's statement dry-run (docs/cost.md).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub(crate) struct PlanView {
    /// The delivery whose commit planned it.
    pub(crate) delivery: i32,
    pub(crate) planned_at: DateTime<Utc>,
    /// The on-demand price per TiB the costs are estimated at (`FILAMENT_ON_DEMAND_PRICE_PER_TIB_USD`
    /// when planned).
    pub(crate) price_per_tib_usd: f64,
    /// Bytes of every priced publication.
    pub(crate) bytes_processed: i64,
    /// `bytes_processed` at `price_per_tib_usd`, in US dollars.
    pub(crate) estimated_cost_usd: f64,
    /// Query jobs the publication inserts.
    pub(crate) query_jobs: i32,
    /// Publications whose statement could not be dry-run (not counted in the totals).
    pub(crate) unpriced: usize,
    /// On a `staged` execution whose plan is over the run's byte budgets: why a commit of it
    /// would fail (`publication_too_expensive`, naming each table and its bytes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) over_budget: Option<String>,
    pub(crate) publications: Vec<PlannedPublicationView>,
}

/// The plan view of the stored rows; `None` before the commit reached its barrier.
fn plan_view(rows: Vec<PlanRow>) -> Option<PlanView> {
    let first = rows.first()?;
    let (delivery, planned_at, price) = (first.delivery, first.planned_at, first.price_per_tib_usd);
    let priced: Vec<PricedPublication> = rows.into_iter().map(|row| row.priced).collect();
    let (bytes_processed, query_jobs) = publication_plan::totals(&priced);
    let unpriced = priced.iter().filter(|p| p.unpriced.is_some()).count();
    let publications = priced
        .into_iter()
        .map(|priced| PlannedPublicationView {
            estimated_cost_usd: priced.bytes_processed.map(|bytes| publication_plan::estimated_cost_usd(bytes, price)),
            priced,
        })
        .collect();
    Some(PlanView {
        delivery,
        planned_at,
        price_per_tib_usd: price,
        bytes_processed,
        estimated_cost_usd: publication_plan::estimated_cost_usd(bytes_processed, price),
        query_jobs,
        unpriced,
        over_budget: None,
        publications,
    })
}

/// A staged execution's plan, with why a commit of it would fail when it is over the run's
/// budgets (judged as the commit judges it).
async fn staged_plan(
    store: &Store,
    execution: &ExecutionRecord,
    plan: Option<PlanView>,
) -> Result<Option<PlanView>, Problem> {
    let Some(mut plan) = plan else { return Ok(None) };
    if execution.state != ExecutionState::Staged {
        return Ok(Some(plan));
    }
    let Some(run) = store.get_run(&execution.run_id).await? else { return Ok(Some(plan)) };
    let budgets = publication_plan::ByteBudgets {
        per_publication: run.maximum_bytes_billed,
        per_execution: run.maximum_bytes_billed_per_execution,
    };
    let priced: Vec<PricedPublication> = plan.publications.iter().map(|p| p.priced.clone()).collect();
    plan.over_budget = publication_plan::over_budget(&priced, budgets);
    Ok(Some(plan))
}

/// An execution.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub(crate) struct ExecutionView {
    pub(crate) run_id: String,
    pub(crate) execution_id: String,
    /// Current delivery (1 for the first POST, +1 for each redelivery).
    pub(crate) delivery: i32,
    pub(crate) state: ExecutionState,
    /// Every destination is published in one multi-statement transaction.
    #[serde(default)]
    pub(crate) atomic: bool,
    pub(crate) error: Option<Problem>,
    pub(crate) resources: Vec<ExecutionResourceView>,
    /// The priced plan of its commit, once the commit reached the barrier (absent before).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) plan: Option<PlanView>,
    /// When a commit asked to hold staged this delivery (absent otherwise).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) staged_at: Option<DateTime<Utc>>,
    pub(crate) created_at: DateTime<Utc>,
    pub(crate) updated_at: DateTime<Utc>,
}

/// The answer to an accepted batch: the rows are encoded and queued for upload.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub(crate) struct Receipt {
    pub(crate) resource: String,
    pub(crate) seq: i64,
    pub(crate) rows: i64,
    /// Bytes of the Arrow IPC stream after content decoding.
    pub(crate) uncompressed_bytes: i64,
    /// Lowercase hex SHA-256 of the Arrow IPC bytes as received (after content decoding).
    pub(crate) arrow_ipc_sha256: String,
    /// Always `queued`: accepted, not yet queryable.
    #[schema(example = "queued")]
    pub(crate) state: String,
}

impl From<ReceiptRecord> for Receipt {
    fn from(r: ReceiptRecord) -> Self {
        Self {
            resource: r.resource.into(),
            seq: r.seq,
            rows: r.rows,
            uncompressed_bytes: r.uncompressed_bytes,
            arrow_ipc_sha256: r.arrow_ipc_sha256,
            state: "queued".into(),
        }
    }
}

pub(crate) async fn run_view(store: &Store, run: RunRecord) -> Result<RunView, Problem> {
    let resources = store.list_resources(&run.run_id).await?;
    let executions = store.list_executions(&run.run_id).await?;
    Ok(RunView {
        run_id: run.run_id.into(),
        destination: run.destination,
        batching: run.batching,
        job_project: run.job_project,
        maximum_bytes_billed: run.maximum_bytes_billed,
        maximum_bytes_billed_per_execution: run.maximum_bytes_billed_per_execution,
        atomic: run.atomic,
        principal: run.principal,
        resources: resources.into_iter().map(ResourceView::from).collect(),
        executions: executions
            .into_iter()
            .map(|e| ExecutionSummary { execution_id: e.execution_id.into(), state: e.state })
            .collect(),
        durable_checkpoint: run.durable_checkpoint,
        durable_checkpoint_execution_id: run.durable_checkpoint_execution_id,
        created_at: run.created_at,
    })
}

pub(crate) async fn execution_view(store: &Store, execution: ExecutionRecord) -> Result<ExecutionView, Problem> {
    let resources = store.list_resources(&execution.run_id).await?;
    let progress: Vec<ResourceProgress> = store.resource_progress(&execution.delivery_ref()).await?;
    let publications = store.list_publications(&execution.key()).await?;
    let plan = staged_plan(store, &execution, plan_view(store.list_plan(&execution.key()).await?)).await?;
    let views = progress
        .into_iter()
        .map(|p| {
            let declared = resources.iter().find(|r| r.resource == p.resource);
            let publication = publications
                .iter()
                .find(|publication| publication.resource == p.resource)
                .cloned()
                .map(PublicationView::from);
            ExecutionResourceView {
                table: declared.map(|r| r.table_name.clone()).unwrap_or_default(),
                write_mode: declared.map(|r| r.write_mode).unwrap_or(WriteMode::FullAppend),
                resource: p.resource.into(),
                batches: p.batches,
                rows_received: p.rows_received,
                bytes_received: p.bytes_received,
                rows_acknowledged: p.rows_acknowledged,
                publication,
            }
        })
        .collect();
    Ok(ExecutionView {
        run_id: execution.run_id.into(),
        execution_id: execution.execution_id.into(),
        delivery: execution.delivery,
        state: execution.state,
        atomic: execution.atomic,
        error: execution.error,
        resources: views,
        plan,
        staged_at: execution.staged_at,
        created_at: execution.created_at,
        updated_at: execution.updated_at,
    })
}
