//! The upload pipeline: admission of batch requests under the byte budget ([`admission`]),
//! and per execution and resource a lane ([`lane`]) that sets up the resource's tables and
//! PENDING stream, batches accepted rows and appends them with explicit row offsets (retries
//! decided by [`crate::bigquery::retry`]). The execution's gate ([`gate`]) orders batch
//! acceptance against transitions.
//!
//! How the limits relate (docs/architecture.md has the long form):
//! - [`budget::ByteBudget`]: queued plus in-flight encoded payloads, gateway-wide (64 MiB by
//!   default), with each resource's share. Batch requests reserve it before they are
//!   recorded; acknowledgements release it.
//! - decode slots: batch bodies decoded at once; requests beyond them wait unread.
//! - `inflight_per_stream` (4): outstanding AppendRows requests per stream, a sliding window.
//! - `max_inflight_requests` (8): outstanding AppendRows requests across the gateway.
//! - `max_append_connections` (1,000): AppendRows connections open at once; a lane takes one
//!   before its first request and gives it back once idle (BigQuery limits concurrent
//!   connections per project).
//! - `max_concurrent_set_ups` (8): the most resources creating tables and streams at once in
//!   one project and location, separate from lanes so new tables get set up while established
//!   ones upload; within it the adaptive limit ([`crate::bigquery::adaptive`]) finds what
//!   BigQuery allows, never more, and principals take turns (`crate::bigquery::fair`).
//! - `max_open_lanes_per_principal` (10,000): lanes one principal has open on this replica; a
//!   batch that would open one more is refused (429 `lane_limit`) before anything is recorded.
//!
//! The API admits each batch with [`Pipeline::admit`], hands it to [`Pipeline::enqueue`], asks
//! for [`Pipeline::flush`] at checkpoints, and commit calls [`Pipeline::drain_each`], receiving
//! one [`LaneReport`] per resource as its lane finishes.

pub(crate) mod admission;
pub(crate) mod budget;
pub(crate) mod gate;
pub(crate) mod lane;

pub(crate) use admission::{Admission, Converting, QueuedRows, ReservedBatch};
pub(crate) use gate::{Accepting, DeliveryLanes, Transitioning};
pub(crate) use lane::{LaneContext, LaneReport, LaneTarget};

use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use tokio::sync::{Semaphore, mpsc, oneshot};

use crate::bigquery::BigQuery;
use crate::bigquery::adaptive::AdaptiveLimits;
use crate::bigquery::fair::{CapPlace, PerPrincipalCap, Tenant};
use crate::bigquery::retry::RetryPolicy;
use crate::error::{ErrorCode, Problem};
use crate::ingest::message_buffers::MessageBuffers;
use crate::model::{ExecutionKey, ResourceName};
use crate::store::Store;
use crate::telemetry;
use budget::{ByteBudget, PrincipalShare, ResourceShare};
use gate::{Lane, lock};
use lane::accumulator::LanePressure;
use lane::{AppendTimeouts, LaneCommand, LearnedDestination};

/// Limits of the pipeline (their defaults and meaning: `config`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct PipelineLimits {
    pub(crate) max_buffered_bytes: usize,
    /// One resource's part of `max_buffered_bytes` (of one execution).
    pub(crate) max_buffered_bytes_per_resource: usize,
    /// Batch bodies being converted and encoded at once, gateway-wide (CPU work; the memory
    /// it allocates is held in the budget first).
    pub(crate) max_concurrent_batch_decodes: usize,
    /// Bytes of batch bodies being received and decoded, gateway-wide (with what their
    /// IPC-compressed buffers decompress to): what bounds memory before a request's bytes
    /// reach the budget.
    pub(crate) max_receiving_bytes: usize,
    pub(crate) backpressure_wait: Duration,
    pub(crate) inflight_per_stream: usize,
    pub(crate) max_inflight_requests: usize,
    pub(crate) max_append_connections: usize,
    /// How long an idle AppendRows connection is kept while no lane waits for a place.
    pub(crate) append_connection_idle: Duration,
    pub(crate) max_concurrent_set_ups: usize,
    /// Lanes one principal may have open on this replica.
    pub(crate) max_open_lanes_per_principal: usize,
    /// How appends, `CreateWriteStream` and set-up are retried.
    pub(crate) retry: RetryPolicy,
    pub(crate) append_timeouts: AppendTimeouts,
}

/// What the message buffer pool may hold, lent and idle: the two budgets (which count the
/// messages' bytes) and a quarter more, the most a buffer's capacity class adds to its
/// message. Below that, at full budgets, buffers would be freed and allocated again at the
/// rate messages arrive, which is what the pool is for avoiding.
fn message_buffers_limit(limits: &PipelineLimits) -> usize {
    let budgets = limits.max_buffered_bytes.saturating_add(limits.max_receiving_bytes);
    budgets.saturating_add(budgets / 4)
}

/// One lane's end: its report once every row is uploaded, or why it failed.
pub(crate) type LaneDrain = std::pin::Pin<Box<dyn Future<Output = Result<LaneReport, Problem>> + Send>>;

/// Owns every execution's upload lanes and the shared limits.
#[derive(Debug, Clone)]
pub(crate) struct Pipeline {
    context: LaneContext,
    budget: ByteBudget,
    receiving: ByteBudget,
    limits: PipelineLimits,
    conversions: Arc<Semaphore>,
    /// The buffers received messages are joined into, bounded by the two budgets together.
    message_buffers: Arc<MessageBuffers>,
    executions: Arc<Mutex<HashMap<ExecutionKey, Arc<DeliveryLanes>>>>,
    /// Each principal's share with its capacity (`max_buffered_bytes`), replaced when a reload
    /// changes it.
    principal_shares: Arc<Mutex<HashMap<String, (usize, PrincipalShare)>>>,
    /// The lanes each principal has open (`max_open_lanes_per_principal`).
    open_lanes: PerPrincipalCap,
}

impl Pipeline {
    pub(crate) fn new(bigquery: BigQuery, store: Store, limits: PipelineLimits) -> Self {
        let budget = ByteBudget::new(limits.max_buffered_bytes, "the upload budget")
            .reporting_to(telemetry::BUDGET_BYTES_IN_USE);
        telemetry::budgets_configured(limits.max_buffered_bytes, limits.max_receiving_bytes);
        Self {
            context: LaneContext {
                upload_budget: Arc::new(budget.clone()),
                bigquery,
                store,
                inflight_requests: Arc::new(Semaphore::new(limits.max_inflight_requests)),
                append_connections: lane::AppendConnections::new(
                    limits.max_append_connections,
                    limits.append_connection_idle,
                ),
                prepares: AdaptiveLimits::new("set_up", limits.max_concurrent_set_ups),
                stream_creations: AdaptiveLimits::new("stream_creation", limits.max_concurrent_set_ups),
                inflight_per_stream: limits.inflight_per_stream,
                retry: limits.retry,
                append_timeouts: limits.append_timeouts,
                destination_tables: Arc::default(),
            },
            budget,
            receiving: ByteBudget::new(limits.max_receiving_bytes, "the receive budget")
                .reporting_to(telemetry::RECEIVE_BUDGET_BYTES_IN_USE),
            conversions: Arc::new(Semaphore::new(limits.max_concurrent_batch_decodes)),
            message_buffers: MessageBuffers::new(message_buffers_limit(&limits)),
            limits,
            executions: Arc::default(),
            principal_shares: Arc::default(),
            open_lanes: PerPrincipalCap::new("open_lanes", limits.max_open_lanes_per_principal),
        }
    }

    /// The replica's pool of message buffers, for a batch body's decoder.
    pub(crate) fn message_buffers(&self) -> Arc<MessageBuffers> {
        Arc::clone(&self.message_buffers)
    }

    /// Refuses a batch of `resource` early, its body unread, when it would open a lane and
    /// `principal` (the run's) has its lanes open already (the place is taken under the gate,
    /// [`Pipeline::lane_place`]).
    pub(crate) fn check_lane_room(
        &self,
        lanes: &DeliveryLanes,
        resource: &ResourceName,
        principal: &str,
    ) -> Result<(), Problem> {
        let has_lane = lock(&lanes.by_resource).contains_key(resource);
        match has_lane || !self.open_lanes.refuses(&Tenant::principal(principal)) {
            true => Ok(()),
            false => Err(self.lane_limit(resource)),
        }
    }

    /// The place of the lane a batch of `resource` opens, taken before the batch is recorded:
    /// `None` when the resource's lane is open already, 429 `lane_limit` when `principal` (the
    /// run's) has its lanes open.
    pub(crate) fn lane_place(
        &self,
        accepting: &Accepting,
        resource: &ResourceName,
        principal: &str,
    ) -> Result<Option<CapPlace>, Problem> {
        if lock(&accepting.lanes.by_resource).contains_key(resource) {
            return Ok(None);
        }
        let place = self.open_lanes.try_take(&Tenant::principal(principal));
        place.map(Some).ok_or_else(|| self.lane_limit(resource))
    }

    fn lane_limit(&self, resource: &ResourceName) -> Problem {
        let cap = self.open_lanes.cap();
        Problem::new(
            ErrorCode::LaneLimit,
            format!(
                "resource {resource} would open a lane, and the principal has {cap} lanes open on this gateway \
                 (FILAMENT_MAX_OPEN_LANES_PER_PRINCIPAL); nothing was recorded"
            ),
        )
        .with_hint(
            "each resource with batches in an extracting execution holds a lane until the execution's commit \
             or abort: commit or abort executions, or send fewer resources at once, then retry",
        )
        .with_retry_after(10)
    }

    /// The share of principal `name` holding at most `capacity_bytes` (`None`: no share).
    pub(crate) fn principal_share(&self, name: &str, capacity_bytes: Option<usize>) -> Option<PrincipalShare> {
        let capacity_bytes = capacity_bytes?;
        let mut shares = lock(&self.principal_shares);
        let entry = shares
            .entry(name.to_string())
            .or_insert_with(|| (capacity_bytes, PrincipalShare::new(name, capacity_bytes)));
        if entry.0 != capacity_bytes {
            *entry = (capacity_bytes, PrincipalShare::new(name, capacity_bytes));
        }
        Some(entry.1.clone())
    }

    /// The lanes of the execution's `delivery`, which this replica serves: created on first
    /// use; a newer delivery replaces (and cancels) the lanes of an older one. Only for a
    /// delivery that is open and this replica's (`replica::Owned`): an entry made here lives
    /// until the delivery is drained, cancelled or forgotten.
    pub(crate) fn open_delivery(&self, key: &ExecutionKey, delivery: i32) -> Arc<DeliveryLanes> {
        let mut executions = lock(&self.executions);
        let lanes = Arc::new(DeliveryLanes::new(delivery));
        match executions.get(key) {
            Some(existing) if existing.delivery == delivery => return Arc::clone(existing),
            // A request that read an older delivery: hand it detached lanes; it is rejected
            // when it re-checks the delivery under the gate.
            Some(existing) if existing.delivery > delivery => return lanes,
            Some(existing) => existing.cancel.cancel(),
            None => {}
        }
        executions.insert(key.clone(), Arc::clone(&lanes));
        lanes
    }

    /// The lanes this replica holds for the execution's `delivery`, if any (a lookup: it
    /// creates nothing).
    pub(crate) fn delivery(&self, key: &ExecutionKey, delivery: i32) -> Option<Arc<DeliveryLanes>> {
        lock(&self.executions).get(key).filter(|lanes| lanes.delivery == delivery).map(Arc::clone)
    }

    /// Uploads of no one's: the gate of a transition on a delivery this replica holds nothing
    /// of (a committing or ended execution), which no batch request shares.
    pub(crate) fn detached(delivery: i32) -> Arc<DeliveryLanes> {
        Arc::new(DeliveryLanes::new(delivery))
    }

    /// Whether this process holds lanes of the execution (it serves it, as far as it knows:
    /// the handlers check the lease).
    pub(crate) fn holds(&self, key: &ExecutionKey) -> bool {
        lock(&self.executions).contains_key(key)
    }

    /// How long a batch request waits for room before 429 `backpressure`.
    pub(crate) fn backpressure_wait(&self) -> std::time::Duration {
        self.limits.backpressure_wait
    }

    /// Lets a batch request of `resource` in (step 1 of [`admission`]): waits for room in the
    /// resource's share, within the backpressure wait (then 429). `expected_body_bytes` (the
    /// body's length when the request declares it) is held in the receive budget at once, so
    /// requests that declare their length never wait for it half-read.
    pub(crate) async fn admit(
        &self,
        lanes: &DeliveryLanes,
        resource: &ResourceName,
        expected_body_bytes: Option<usize>,
        principal: Option<PrincipalShare>,
    ) -> Result<Admission, Problem> {
        let admitted_at = Instant::now();
        let deadline = admitted_at + self.limits.backpressure_wait;
        let share = self.resource_share(lanes, resource);
        share.wait_for_room(self.limits.backpressure_wait).await?;
        let mut admission = Admission {
            resource: resource.clone(),
            share,
            budget: self.budget.clone(),
            receiving: self.receiving.clone(),
            conversions: Arc::clone(&self.conversions),
            deadline,
            admitted_at,
            waited: admitted_at.elapsed(),
            received: budget::BudgetPermit::empty(),
            principal,
            principal_held: None,
        };
        if let Some(bytes) = expected_body_bytes {
            admission.hold_received(bytes).await?;
        }
        Ok(admission)
    }

    /// The resource's part of the upload budget in this delivery.
    fn resource_share(&self, lanes: &DeliveryLanes, resource: &ResourceName) -> ResourceShare {
        lock(&lanes.shares)
            .entry(resource.clone())
            .or_insert_with(|| ResourceShare::new(self.limits.max_buffered_bytes_per_resource))
            .clone()
    }

    /// What the resource's lane in this delivery learned its destination asks of staged rows
    /// of the schema of `schema_sha256`, once its set-up has finished (`None` before, with no
    /// lane yet, or for a batch of another schema than the lane's, which its receipt refuses).
    pub(crate) fn destination_rules(
        &self,
        lanes: &DeliveryLanes,
        resource: &ResourceName,
        schema_sha256: &str,
    ) -> Option<Arc<crate::ingest::destination_rules::DestinationRules>> {
        lock(&lanes.by_resource).get(resource).and_then(|lane| lane.learned.rules_for(schema_sha256))
    }

    /// Queues one batch request's rows on the resource's lane, starting the lane with
    /// `target()` on the resource's first batch.
    /// `place` is the lane's place under the principal's cap ([`Pipeline::lane_place`]).
    pub(crate) fn enqueue(
        &self,
        accepting: &Accepting,
        resource: &ResourceName,
        target: impl FnOnce() -> LaneTarget,
        rows: QueuedRows,
        place: Option<CapPlace>,
    ) {
        let delivery_lanes = &accepting.lanes;
        let share = self.resource_share(delivery_lanes, resource);
        let request = crate::traces::current_span_context();
        let mut by_resource = lock(&delivery_lanes.by_resource);
        let mut started = false;
        let lane = by_resource.entry(resource.clone()).or_insert_with(|| {
            started = true;
            let (commands, receiver) = mpsc::unbounded_channel();
            let pressure =
                LanePressure { budget: self.budget.pressure().subscribe(), share: share.pressure().subscribe() };
            // The lane runs after the answer: its span continues the trace of the request that
            // started it, and links to every request whose rows it uploads (below).
            let span = tracing::trace_span!(target: crate::traces::TARGET, "lane.upload", resource = %resource);
            crate::traces::follow(&span, request.as_ref(), &[]);
            let target = target();
            // Another request's lane took the place it was admitted with.
            let place = place.unwrap_or_else(|| self.open_lanes.take_regardless(&target.tenant));
            let learned = Arc::new(LearnedDestination::of_schema(target.schema_sha256.clone()));
            let cancel = delivery_lanes.cancel.clone();
            let lane = lane::run_lane(self.context.clone(), target, receiver, pressure, cancel, Arc::clone(&learned));
            let lane = async move {
                let _place = place;
                lane.await
            };
            Lane { commands, worker: tokio::spawn(tracing::Instrument::instrument(lane, span.clone())), span, learned }
        });
        if let Some(request) = request.as_ref().filter(|_| !started) {
            crate::traces::follow(&lane.span, None, std::slice::from_ref(request));
        }
        // A closed lane has failed (and failed its execution) or was cancelled; `drain` reports why.
        let _ = lane.commands.send(LaneCommand::Rows(rows));
    }

    /// Queues every lane's accumulated rows for upload (checkpoints).
    pub(crate) async fn flush(&self, transitioning: &Transitioning) {
        let waits: Vec<oneshot::Receiver<()>> = lock(&transitioning.lanes.by_resource)
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

    /// Ends the lanes of an execution: closes every lane (flushing what it accumulated) and
    /// waits for all of them to drain; the first failure, or every report.
    pub(crate) async fn drain(&self, key: &ExecutionKey, delivery: i32) -> Result<Vec<LaneReport>, Problem> {
        let mut reports = Vec::new();
        let mut first_error = None;
        for (_, drained) in self.drain_each(key, delivery) {
            match drained.await {
                Ok(report) => reports.push(report),
                Err(problem) => {
                    first_error.get_or_insert(problem);
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

    /// Closes the input of every lane of the execution's `delivery` and returns, per resource,
    /// what its lane reports once it has uploaded everything (commit awaits each destination's
    /// lanes on their own, so a destination publishes while others still upload).
    pub(crate) fn drain_each(&self, key: &ExecutionKey, delivery: i32) -> Vec<(ResourceName, LaneDrain)> {
        let delivery_lanes = match lock(&self.executions).get(key) {
            Some(u) if u.delivery == delivery => Arc::clone(u),
            _ => return Vec::new(),
        };
        let lanes: Vec<(ResourceName, Lane)> = lock(&delivery_lanes.by_resource).drain().collect();
        lanes
            .into_iter()
            .map(|(resource, lane)| {
                drop(lane.commands);
                let name = resource.clone();
                let drained: LaneDrain = Box::pin(async move {
                    match lane.worker.await {
                        Ok(result) => result,
                        Err(join_error) => {
                            Err(Problem::internal(format!("upload worker of {name} stopped: {join_error}")))
                        }
                    }
                });
                (resource, drained)
            })
            .collect()
    }

    /// Cancels the lanes of an execution (abort, redelivery) and forgets them.
    pub(crate) fn cancel(&self, key: &ExecutionKey) {
        if let Some(lanes) = lock(&self.executions).remove(key) {
            lanes.cancel.cancel();
        }
    }

    /// Forgets a finished execution's (already drained) lanes.
    pub(crate) fn forget(&self, key: &ExecutionKey, delivery: i32) {
        let mut executions = lock(&self.executions);
        if executions.get(key).is_some_and(|u| u.delivery == delivery) {
            executions.remove(key);
        }
    }
}
