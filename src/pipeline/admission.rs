//! Admission of one batch request into the upload pipeline, as a sequence of types (InfluxDB
//! 3's validator type-state), so the steps cannot run out of order:
//!
//! 1. [`Pipeline::admit`](super::Pipeline::admit) waits for room in the resource's share of
//!    the budget (before the body is read) and takes a decode slot: an [`Admission`].
//! 2. The API decodes and encodes the body into an [`EncodedBatch`].
//! 3. [`Admission::reserve`] holds the encoded bytes in the budget (and gives the decode slot
//!    back): a [`ReservedBatch`]. All three waits share one backpressure deadline; past it the
//!    request is answered 429 and nothing was recorded.
//! 4. [`ReservedBatch::accept`] takes the receipt the store recorded and stamps the batch's
//!    `seq` into the staged rows: [`QueuedRows`], the only thing a lane accepts. So nothing is
//!    enqueued without a budget permit, and nothing is stamped before its receipt exists.

use std::time::{Duration, Instant};

use tokio::sync::OwnedSemaphorePermit;

use super::budget::{BudgetPermit, ByteBudget, ResourceShare};
use crate::error::Problem;
use crate::ingest::encode::{AppendPayload, stamp_seq};
use crate::model::ResourceName;
use crate::store::ReceiptRecord;
use crate::telemetry::QueueTiming;

/// A batch request let in: room in its resource's share and a decode slot, with what is left
/// of the backpressure wait.
#[derive(Debug)]
pub(crate) struct Admission {
    pub(super) resource: ResourceName,
    pub(super) share: ResourceShare,
    pub(super) budget: ByteBudget,
    pub(super) deadline: Instant,
    /// When `Pipeline::admit` started, and how long it waited (share and decode slot).
    pub(super) admitted_at: Instant,
    pub(super) waited: Duration,
    /// Held while the body is decoded and encoded, until its bytes are in the budget.
    pub(super) decode_slot: OwnedSemaphorePermit,
}

/// A body decoded, validated and encoded into AppendRows payloads; nothing recorded yet.
#[derive(Debug)]
pub(crate) struct EncodedBatch {
    pub(crate) payloads: Vec<AppendPayload>,
    pub(crate) rows: usize,
    /// Whether the payloads carry `_filament_seq`, to be stamped once the receipt exists.
    pub(crate) stages_seq: bool,
}

/// An encoded batch whose bytes are held in the upload budget.
#[derive(Debug)]
pub(crate) struct ReservedBatch {
    payloads: Vec<AppendPayload>,
    stages_seq: bool,
    permit: BudgetPermit,
}

/// Accepted rows of one batch request, stamped with its receipt's `seq`, with their part of
/// the byte budget: what a lane queues for upload.
#[derive(Debug)]
pub(crate) struct QueuedRows {
    payloads: Vec<AppendPayload>,
    permit: BudgetPermit,
}

impl Admission {
    /// Holds the batch's encoded bytes in the resource's share and the budget, waiting out the
    /// rest of the deadline (then 429 `backpressure`); gives the decode slot back.
    pub(crate) async fn reserve(self, batch: EncodedBatch) -> Result<ReservedBatch, Problem> {
        let encoded_bytes: usize = batch.payloads.iter().map(|p| p.serialized_record_batch.len()).sum();
        let queue_started = Instant::now();
        let remaining_wait = self.deadline.saturating_duration_since(queue_started);
        let permit = self.budget.acquire(encoded_bytes, Some(&self.share), remaining_wait).await?;
        drop(self.decode_slot);
        QueueTiming {
            resource: &self.resource,
            rows: batch.rows,
            duration: self.admitted_at.elapsed(),
            backpressure: self.waited + queue_started.elapsed(),
        }
        .emit();
        Ok(ReservedBatch { payloads: batch.payloads, stages_seq: batch.stages_seq, permit })
    }
}

impl ReservedBatch {
    /// The rows as the receipt numbered them: keyed modes stage `_filament_seq` from the
    /// receipt's `seq` (the encoded sizes do not change, so the budget still holds).
    pub(crate) fn accept(self, receipt: &ReceiptRecord) -> Result<QueuedRows, Problem> {
        let mut payloads = self.payloads;
        if self.stages_seq {
            stamp_seq(&mut payloads, receipt.seq).map_err(|e| Problem::internal(e.to_string()))?;
        }
        Ok(QueuedRows { payloads, permit: self.permit })
    }
}

impl QueuedRows {
    pub(super) fn into_parts(self) -> (Vec<AppendPayload>, BudgetPermit) {
        (self.payloads, self.permit)
    }

    /// Rows outside the budget, for the lane's own tests.
    #[cfg(test)]
    pub(super) fn unbudgeted(payloads: Vec<AppendPayload>) -> Self {
        Self { payloads, permit: BudgetPermit::empty() }
    }
}
