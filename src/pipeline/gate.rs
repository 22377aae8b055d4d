//! The in-memory side of one delivery of an execution, and its gate: batch requests hold it
//! shared ([`Accepting`]) while they check the state, record their receipt and enqueue; state
//! transitions (pause, commit, abort, checkpoints, redelivery) hold it exclusively
//! ([`Transitioning`]) while they change the state. So a batch is either fully accepted before
//! a transition or rejected after it. [`Pipeline::enqueue`](super::Pipeline::enqueue) takes an
//! `Accepting` guard and [`Pipeline::flush`](super::Pipeline::flush) a `Transitioning` one, so
//! neither can be called without the gate.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;

use tokio::sync::{OwnedRwLockReadGuard, OwnedRwLockWriteGuard, RwLock, mpsc};
use tokio_util::sync::CancellationToken;

use super::budget::ResourceShare;
use super::lane::{LaneCommand, LaneReport, LearnedDestination};
use crate::error::Problem;
use crate::model::ResourceName;

/// The upload lanes of one delivery of an execution, one per resource, and its gate.
#[derive(Debug)]
pub(crate) struct DeliveryLanes {
    pub(crate) delivery: i32,
    gate: Arc<RwLock<()>>,
    pub(super) by_resource: Mutex<HashMap<ResourceName, Lane>>,
    pub(super) shares: Mutex<HashMap<ResourceName, ResourceShare>>,
    pub(super) cancel: CancellationToken,
}

/// One resource's running lane.
#[derive(Debug)]
pub(super) struct Lane {
    pub(super) commands: mpsc::UnboundedSender<LaneCommand>,
    pub(super) worker: tokio::task::JoinHandle<Result<LaneReport, Problem>>,
    /// The lane's trace span (`crate::traces`): its uploads run under it, and it links to every
    /// request whose rows it uploads.
    pub(super) span: tracing::Span,
    /// What the lane's set-up learned of the destination, which later batches are checked
    /// against.
    pub(super) learned: Arc<LearnedDestination>,
}

/// The gate held shared: no state transition happens while a batch is being accepted.
#[derive(Debug)]
pub(crate) struct Accepting {
    pub(super) lanes: Arc<DeliveryLanes>,
    _gate: OwnedRwLockReadGuard<()>,
}

/// The gate held exclusively: no batch is half-accepted while the state changes.
#[derive(Debug)]
pub(crate) struct Transitioning {
    pub(super) lanes: Arc<DeliveryLanes>,
    _gate: OwnedRwLockWriteGuard<()>,
}

impl DeliveryLanes {
    pub(super) fn new(delivery: i32) -> Self {
        Self {
            delivery,
            gate: Arc::new(RwLock::new(())),
            by_resource: Mutex::default(),
            shares: Mutex::default(),
            cancel: CancellationToken::new(),
        }
    }

    /// Waits for the gate, shared.
    pub(crate) async fn accepting(self: &Arc<Self>) -> Accepting {
        Accepting { lanes: Arc::clone(self), _gate: Arc::clone(&self.gate).read_owned().await }
    }

    /// Waits for the gate, exclusively.
    pub(crate) async fn begin_transition(self: &Arc<Self>) -> Transitioning {
        Transitioning { lanes: Arc::clone(self), _gate: Arc::clone(&self.gate).write_owned().await }
    }
}

impl Transitioning {
    /// The delivery this gate belongs to.
    pub(crate) fn delivery(&self) -> i32 {
        self.lanes.delivery
    }
}

pub(super) fn lock<T>(mutex: &Mutex<T>) -> parking_lot::MutexGuard<'_, T> {
    // A panic while holding these short locks leaves consistent data; keep serving.
    mutex.lock()
}
