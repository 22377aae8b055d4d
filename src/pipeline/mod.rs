//! Upload lanes: per execution and resource, an ordered queue of encoded AppendRows payloads and
//! a worker that prepares the tables (dataset, destination, staging table, PENDING stream) on
//! its first item and appends with explicit row offsets.
//!
//! This is the seam of the upload pipeline: the API hands each accepted batch to
//! [`Pipeline::enqueue`]; commit calls [`Pipeline::drain`] and receives one [`LaneReport`] per
//! resource. This first slice uploads sequentially (one outstanding append per lane); windows,
//! the shared byte budget and retries replace [`lane::run_lane`]'s loop without changing the seam.

mod lane;

pub use lane::{LaneReport, LaneTarget, STAGING_TABLE_TTL, staging_table_name, table_path};

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::{RwLock, mpsc};
use tokio_util::sync::CancellationToken;

use crate::bigquery::BigQuery;
use crate::error::Problem;
use crate::ingest::encode::AppendPayload;
use crate::store::Store;

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
    /// commit, abort and redelivery hold it exclusively while they change the state. So a batch
    /// is either fully accepted before a transition or rejected after it.
    pub gate: RwLock<()>,
    lanes: Mutex<HashMap<String, Lane>>,
    cancel: CancellationToken,
}

#[derive(Debug)]
struct Lane {
    sender: mpsc::UnboundedSender<Vec<AppendPayload>>,
    worker: tokio::task::JoinHandle<Result<LaneReport, Problem>>,
}

/// Owns every execution's upload lanes.
#[derive(Debug, Clone)]
pub struct Pipeline {
    bigquery: BigQuery,
    store: Store,
    executions: Arc<Mutex<HashMap<ExecutionKey, Arc<ExecutionUploads>>>>,
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic while holding these short locks leaves consistent data; keep serving.
    mutex.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Pipeline {
    pub fn new(bigquery: BigQuery, store: Store) -> Self {
        Self { bigquery, store, executions: Arc::default() }
    }

    /// The uploads of the execution's current `delivery`, created on first use. A newer delivery
    /// replaces (and cancels) the uploads of an older one.
    pub fn execution(&self, key: &ExecutionKey, delivery: i32) -> Arc<ExecutionUploads> {
        let mut executions = lock(&self.executions);
        let uploads = Arc::new(ExecutionUploads {
            delivery,
            gate: RwLock::new(()),
            lanes: Mutex::default(),
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

    /// Queues one batch request's payloads (in order) on the resource's lane, starting the lane
    /// with `target()` on the resource's first batch. Call with the gate held shared.
    pub fn enqueue(
        &self,
        uploads: &ExecutionUploads,
        resource: &str,
        target: impl FnOnce() -> LaneTarget,
        payloads: Vec<AppendPayload>,
    ) {
        let mut lanes = lock(&uploads.lanes);
        let lane = lanes.entry(resource.to_string()).or_insert_with(|| {
            let (sender, receiver) = mpsc::unbounded_channel();
            let worker = tokio::spawn(lane::run_lane(
                self.bigquery.clone(),
                self.store.clone(),
                target(),
                receiver,
                uploads.cancel.clone(),
            ));
            Lane { sender, worker }
        });
        // A closed lane has failed (and failed its execution) or was cancelled; `drain` reports why.
        let _ = lane.sender.send(payloads);
    }

    /// Ends the uploads of an execution: closes every lane and waits for it to drain.
    pub async fn drain(&self, key: &ExecutionKey, delivery: i32) -> Result<Vec<LaneReport>, Problem> {
        let uploads = match lock(&self.executions).get(key) {
            Some(u) if u.delivery == delivery => Arc::clone(u),
            _ => return Ok(Vec::new()),
        };
        let lanes: Vec<(String, Lane)> = lock(&uploads.lanes).drain().collect();
        let mut reports = Vec::with_capacity(lanes.len());
        let mut first_error = None;
        for (resource, lane) in lanes {
            drop(lane.sender);
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
