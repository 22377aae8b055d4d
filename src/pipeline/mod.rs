//! The upload pipeline: per execution and resource, a lane that batches accepted rows and
//! appends them to the resource's PENDING stream with explicit row offsets (see [`lane`]).
//!
//! How the limits relate (docs/architecture.md has the long form):
//! - [`budget::ByteBudget`]: queued plus in-flight encoded payloads, gateway-wide (64 MiB by
//!   default). Batch requests acquire it before they are recorded; acknowledgements release it.
//! - `inflight_per_stream` (4): outstanding AppendRows requests per stream, a sliding window.
//! - `max_inflight_requests` (8): outstanding AppendRows requests across the gateway.
//! - `max_concurrent_prepares` (8): resources creating tables and streams at once, separate from
//!   uploads so new tables get set up while established ones upload.
//!
//! The API hands each accepted batch to [`Pipeline::enqueue`], asks for [`Pipeline::flush`] at
//! checkpoints, and commit calls [`Pipeline::drain`], receiving one [`LaneReport`] per resource.

pub mod budget;
mod lane;
pub mod retry;

pub use lane::{
    BatchingPolicy, LaneCommand, LaneContext, LaneReport, LaneTarget, QueuedRows, STAGING_TABLE_TTL,
    staging_table_name, table_path,
};

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{RwLock, Semaphore, mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use crate::bigquery::BigQuery;
use crate::error::{ErrorCode, Problem};
use crate::store::Store;
use budget::{ByteBudget, ResourceShare};
use retry::RetryPolicy;

/// Limits of the pipeline (defaults from the product contract).
#[derive(Debug, Clone, Copy)]
pub struct PipelineLimits {
    pub max_buffered_bytes: usize,
    /// One resource's part of `max_buffered_bytes` (of one execution).
    pub max_buffered_bytes_per_resource: usize,
    /// Batch bodies being decoded and encoded at once, gateway-wide: what bounds memory before
    /// a request's bytes reach the budget.
    pub max_concurrent_batch_decodes: usize,
    pub backpressure_wait: Duration,
    pub inflight_per_stream: usize,
    pub max_inflight_requests: usize,
    pub max_concurrent_prepares: usize,
    pub retry: RetryPolicy,
}

impl Default for PipelineLimits {
    fn default() -> Self {
        Self {
            max_buffered_bytes: 64 * 1024 * 1024,
            max_buffered_bytes_per_resource: 32 * 1024 * 1024,
            max_concurrent_batch_decodes: 4,
            backpressure_wait: Duration::from_secs(10),
            inflight_per_stream: 4,
            max_inflight_requests: 8,
            max_concurrent_prepares: 8,
            retry: RetryPolicy::default(),
        }
    }
}

/// Identifies one execution.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ExecutionKey {
    pub run_id: String,
    pub execution_id: String,
}

/// In-memory side of one delivery of an execution.
#[derive(Debug)]
pub struct ExecutionUploads {
    pub delivery: i32,
    /// Batch requests hold it shared while they check the state, record and enqueue; pause,
    /// commit, abort, checkpoints and redelivery hold it exclusively while they change the
    /// state. So a batch is either fully accepted before a transition or rejected after it.
    pub gate: RwLock<()>,
    lanes: Mutex<HashMap<String, Lane>>,
    shares: Mutex<HashMap<String, ResourceShare>>,
    cancel: CancellationToken,
}

#[derive(Debug)]
struct Lane {
    commands: mpsc::UnboundedSender<LaneCommand>,
    worker: tokio::task::JoinHandle<Result<LaneReport, Problem>>,
}

/// Owns every execution's upload lanes and the shared limits.
#[derive(Debug, Clone)]
pub struct Pipeline {
    context: LaneContext,
    pub budget: ByteBudget,
    pub limits: PipelineLimits,
    batch_decodes: Arc<Semaphore>,
    executions: Arc<Mutex<HashMap<ExecutionKey, Arc<ExecutionUploads>>>>,
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic while holding these short locks leaves consistent data; keep serving.
    mutex.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Pipeline {
    pub fn new(bigquery: BigQuery, store: Store, limits: PipelineLimits) -> Self {
        tracing::info!(
            compression = %bigquery.writer().compression(),
            max_inflight_requests = limits.max_inflight_requests,
            inflight_per_stream = limits.inflight_per_stream,
            max_concurrent_prepares = limits.max_concurrent_prepares,
            max_buffered_bytes = limits.max_buffered_bytes,
            "bigquery.write.ready"
        );
        Self {
            context: LaneContext {
                bigquery,
                store,
                inflight_requests: Arc::new(Semaphore::new(limits.max_inflight_requests)),
                prepares: Arc::new(Semaphore::new(limits.max_concurrent_prepares)),
                inflight_per_stream: limits.inflight_per_stream,
                retry: limits.retry,
            },
            budget: ByteBudget::new(limits.max_buffered_bytes),
            batch_decodes: Arc::new(Semaphore::new(limits.max_concurrent_batch_decodes)),
            limits,
            executions: Arc::default(),
        }
    }

    /// The uploads of the execution's current `delivery`, created on first use. A newer delivery
    /// replaces (and cancels) the uploads of an older one.
    pub fn execution(&self, key: &ExecutionKey, delivery: i32) -> Arc<ExecutionUploads> {
        let mut executions = lock(&self.executions);
        let uploads = Arc::new(ExecutionUploads {
            delivery,
            gate: RwLock::new(()),
            lanes: Mutex::default(),
            shares: Mutex::default(),
            cancel: CancellationToken::new(),
        });
        match executions.get(key) {
            Some(existing) if existing.delivery == delivery => return Arc::clone(existing),
            // A request that read an older delivery: hand it detached uploads; it is rejected
            // when it re-checks the delivery under the gate.
            Some(existing) if existing.delivery > delivery => return uploads,
            Some(existing) => existing.cancel.cancel(),
            None => {}
        }
        executions.insert(key.clone(), Arc::clone(&uploads));
        uploads
    }

    /// A slot to decode and encode one batch body, waiting up to `max_wait` (then 429
    /// `backpressure`): bodies beyond the slots stay unread in their connections.
    pub async fn batch_decode_slot(&self, max_wait: Duration) -> Result<tokio::sync::OwnedSemaphorePermit, Problem> {
        match tokio::time::timeout(max_wait, Arc::clone(&self.batch_decodes).acquire_owned()).await {
            Ok(Ok(slot)) => Ok(slot),
            _ => {
                let mut problem = Problem::new(
                    ErrorCode::Backpressure,
                    format!(
                        "{} batch bodies were being decoded for {} ms",
                        self.limits.max_concurrent_batch_decodes,
                        max_wait.as_millis()
                    ),
                )
                .with_hint("retry after the Retry-After delay");
                problem.retry_after_secs = Some(1);
                Err(problem)
            }
        }
    }

    /// The resource's part of the upload budget in this delivery.
    pub fn resource_share(&self, uploads: &ExecutionUploads, resource: &str) -> ResourceShare {
        lock(&uploads.shares)
            .entry(resource.to_string())
            .or_insert_with(|| ResourceShare::new(self.limits.max_buffered_bytes_per_resource))
            .clone()
    }

    /// Queues one batch request's rows on the resource's lane, starting the lane with
    /// `target()` on the resource's first batch. Call with the gate held shared.
    pub fn enqueue(
        &self,
        uploads: &ExecutionUploads,
        resource: &str,
        target: impl FnOnce() -> LaneTarget,
        rows: QueuedRows,
    ) {
        let mut lanes = lock(&uploads.lanes);
        let lane = lanes.entry(resource.to_string()).or_insert_with(|| {
            let (commands, receiver) = mpsc::unbounded_channel();
            let worker = tokio::spawn(lane::run_lane(self.context.clone(), target(), receiver, uploads.cancel.clone()));
            Lane { commands, worker }
        });
        // A closed lane has failed (and failed its execution) or was cancelled; `drain` reports why.
        let _ = lane.commands.send(LaneCommand::Rows(rows));
        self.budget.record_gauge();
    }

    /// Queues every lane's accumulated rows for upload (checkpoints). Call with the gate held.
    pub async fn flush(&self, uploads: &ExecutionUploads) {
        let waits: Vec<oneshot::Receiver<()>> = lock(&uploads.lanes)
            .values()
            .filter_map(|lane| {
                let (done, wait) = oneshot::channel();
                lane.commands.send(LaneCommand::Flush(done)).ok().map(|()| wait)
            })
            .collect();
        for wait in waits {
            // A lane that ended meanwhile has nothing left to flush.
            let _ = wait.await;
        }
    }

    /// Ends the uploads of an execution: closes every lane (flushing what it accumulated) and
    /// waits for it to drain.
    pub async fn drain(&self, key: &ExecutionKey, delivery: i32) -> Result<Vec<LaneReport>, Problem> {
        let uploads = match lock(&self.executions).get(key) {
            Some(u) if u.delivery == delivery => Arc::clone(u),
            _ => return Ok(Vec::new()),
        };
        let lanes: Vec<(String, Lane)> = lock(&uploads.lanes).drain().collect();
        let mut reports = Vec::with_capacity(lanes.len());
        let mut first_error = None;
        for (resource, lane) in lanes {
            drop(lane.commands);
            match lane.worker.await {
                Ok(Ok(report)) => reports.push(report),
                Ok(Err(problem)) => {
                    first_error.get_or_insert(problem);
                }
                Err(join_error) => {
                    first_error
                        .get_or_insert(Problem::internal(format!("upload worker of {resource} stopped: {join_error}")));
                }
            }
        }
        self.budget.record_gauge();
        match first_error {
            Some(problem) => Err(problem),
            None => {
                reports.sort_by(|a, b| a.resource.cmp(&b.resource));
                Ok(reports)
            }
        }
    }

    /// Cancels the uploads of an execution (abort, redelivery) and forgets them.
    pub fn cancel(&self, key: &ExecutionKey) {
        if let Some(uploads) = lock(&self.executions).remove(key) {
            uploads.cancel.cancel();
        }
    }

    /// Forgets a finished execution's (already drained) uploads.
    pub fn forget(&self, key: &ExecutionKey, delivery: i32) {
        let mut executions = lock(&self.executions);
        if executions.get(key).is_some_and(|u| u.delivery == delivery) {
            executions.remove(key);
        }
    }
}
