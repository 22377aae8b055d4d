//! Admission of one batch request into the upload pipeline, as a sequence of types (InfluxDB
//! 3's validator type-state), so the steps cannot run out of order and every byte a request
//! makes the gateway hold is counted before it is allocated:
//!
//! 1. [`Pipeline::admit`](super::Pipeline::admit) waits for room in the resource's share of
//!    the budget, before the body is read: an [`Admission`].
//! 2. Intake (`crate::intake`) reads and decodes the body, holding what it receives (and
//!    what IPC-compressed buffers decompress to) against the gateway's **receive budget**
//!    ([`Admission::hold_received`]): a slow client holds the few bytes it sent, never a slot.
//! 3. [`Admission::reserve`] waits for a conversion slot, then holds what the body's encoded
//!    rows take at most (its staged size, computed from the decoded arrays) in the resource's
//!    share and the upload budget: a [`Converting`]. The staged rows themselves exist only
//!    while it converts, one body per conversion slot.
//! 4. [`Converting::settle`] takes the encoded body, keeps exactly its encoded bytes in the
//!    budget and gives the rest, the conversion slot and the received bytes back: a
//!    [`ReservedBatch`]. All the waits share one backpressure deadline; past it the request is
//!    answered 429 and nothing was recorded.
//! 5. [`ReservedBatch::accept`] takes the receipt the store recorded and stamps the batch's
//!    `seq` into the staged rows: [`QueuedRows`], the only thing a lane accepts. So nothing is
//!    enqueued without a budget permit, and nothing is stamped before its receipt exists.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::budget::{BudgetPermit, ByteBudget, PrincipalShare, ResourceShare};
use crate::error::{ErrorCode, Problem};
use crate::ingest::encode::{AppendPayload, stamp_seq};
use crate::ingest::prepare::EncodedBody;
use crate::model::ResourceName;
use crate::store::ReceiptRecord;
use crate::telemetry::QueueTiming;

/// A batch request let in: room in its resource's share, with what is left of the
/// backpressure wait, and the bytes it has received so far.
#[derive(Debug)]
pub(crate) struct Admission {
    pub(super) resource: ResourceName,
    pub(super) share: ResourceShare,
    pub(super) budget: ByteBudget,
    pub(super) receiving: ByteBudget,
    pub(super) conversions: Arc<Semaphore>,
    pub(super) deadline: Instant,
    /// When `Pipeline::admit` started, and how long the request waited for room so far.
    pub(super) admitted_at: Instant,
    pub(super) waited: Duration,
    /// Bytes of the body received and decoded, held in the receive budget.
    pub(super) received: BudgetPermit,
    /// The principal's share, when it has one, and what the request holds of it.
    pub(super) principal: Option<PrincipalShare>,
    pub(super) principal_held: Option<OwnedSemaphorePermit>,
}

/// An admitted request converting its body: a conversion slot, and what conversion allocates
/// at most held in the upload budget.
#[derive(Debug)]
pub(crate) struct Converting {
    resource: ResourceName,
    permit: BudgetPermit,
    admitted_at: Instant,
    waited: Duration,
    principal_held: Option<OwnedSemaphorePermit>,
    _received: BudgetPermit,
    _conversion_slot: OwnedSemaphorePermit,
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
    /// The receipt's `seq`, which a refusal in the lane names the rows by.
    seq: i64,
}

impl Admission {
    /// What is left of the backpressure wait.
    fn remaining_wait(&self) -> Duration {
        self.deadline.saturating_duration_since(Instant::now())
    }

    /// Bytes of the body held in the receive budget so far.
    pub(crate) fn received_bytes(&self) -> usize {
        self.received.bytes()
    }

    /// Holds `bytes` more of the body (received, or to be decompressed) in the principal's
    /// share (first: a principal over it holds nothing else while it waits, then 429
    /// `principal_limit`) and in the receive budget, waiting out the rest of the deadline (then
    /// 429 `backpressure`). A body needing more than the whole receive budget (its bytes and
    /// their decompressed buffers together) is refused at once, 413 `payload_too_large`.
    pub(crate) async fn hold_received(&mut self, bytes: usize) -> Result<(), Problem> {
        if bytes == 0 {
            return Ok(());
        }
        self.receiving.refuse_more_than_capacity(&self.received, bytes)?;
        let started = Instant::now();
        if let Some(share) = &self.principal {
            let remaining = self.remaining_wait();
            share.hold_more(&mut self.principal_held, bytes, remaining).await?;
        }
        let more = self.receiving.acquire(bytes, None, self.remaining_wait()).await?;
        self.waited += started.elapsed();
        self.received.merge(more);
        Ok(())
    }

    /// Waits for a conversion slot, then holds `staged_bytes` (what the encoded rows take at
    /// most) in the resource's share and the upload budget, within the rest of the deadline
    /// (then 429 `backpressure`).
    pub(crate) async fn reserve(self, staged_bytes: usize) -> Result<Converting, Problem> {
        let started = Instant::now();
        let slot = tokio::time::timeout(self.remaining_wait(), Arc::clone(&self.conversions).acquire_owned()).await;
        let conversion_slot = match slot {
            Ok(Ok(slot)) => slot,
            _ => {
                return Err(Problem::new(
                    ErrorCode::Backpressure,
                    "every conversion slot stayed busy until the backpressure wait ran out",
                )
                .with_hint("retry after the Retry-After delay")
                .with_retry_after(1));
            }
        };
        let permit = self.budget.acquire(staged_bytes, Some(&self.share), self.remaining_wait()).await?;
        Ok(Converting {
            resource: self.resource,
            permit,
            admitted_at: self.admitted_at,
            waited: self.waited + started.elapsed(),
            principal_held: self.principal_held,
            _received: self.received,
            _conversion_slot: conversion_slot,
        })
    }
}

impl Converting {
    /// How long the request waited for room (its resource's share, the receive and upload
    /// budgets, a conversion slot).
    pub(crate) fn waited(&self) -> std::time::Duration {
        self.waited
    }

    /// Keeps the encoded bytes of `encoded` in the budget, gives back the rest of the staged
    /// size, and ends the request's hold on received bytes and its slot.
    pub(crate) fn settle(self, encoded: EncodedBody) -> ReservedBatch {
        let encoded_bytes: usize = encoded.payloads.iter().map(|p| p.serialized_record_batch.len()).sum();
        let Converting { resource, permit, admitted_at, waited, principal_held, .. } = self;
        let mut kept = permit.keep(encoded_bytes);
        if let Some(principal) = principal_held {
            kept = kept.with_principal(principal);
        }
        QueueTiming { resource: &resource, rows: encoded.rows, duration: admitted_at.elapsed(), backpressure: waited }
            .emit();
        ReservedBatch { payloads: encoded.payloads, stages_seq: encoded.stages_seq, permit: kept }
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
        Ok(QueuedRows { payloads, permit: self.permit, seq: receipt.seq })
    }
}

impl QueuedRows {
    /// The payloads, their part of the budget and the batch's `seq`.
    pub(super) fn into_parts(self) -> (Vec<AppendPayload>, BudgetPermit, i64) {
        (self.payloads, self.permit, self.seq)
    }

    /// Rows outside the budget, for the lane's own tests.
    #[cfg(test)]
    pub(super) fn unbudgeted(payloads: Vec<AppendPayload>) -> Self {
        Self { payloads, permit: BudgetPermit::empty(), seq: 0 }
    }
}

#[cfg(test)]
mod tests {
    //! Paused time: every wait ends at its exact instant.

    use super::*;

    const WAIT: Duration = Duration::from_secs(5);

    struct Gateway {
        budget: ByteBudget,
        receiving: ByteBudget,
        conversions: Arc<Semaphore>,
    }

    impl Gateway {
        fn new() -> Self {
            Self {
                budget: ByteBudget::new(64 * 1024, "the upload budget"),
                receiving: ByteBudget::new(16 * 1024, "the receive budget"),
                conversions: Arc::new(Semaphore::new(1)),
            }
        }

        /// A request let in now, with the whole backpressure wait ahead of it.
        fn admit(&self) -> Admission {
            let now = Instant::now();
            Admission {
                resource: "orders".parse().expect("a resource name"),
                share: ResourceShare::new(32 * 1024),
                budget: self.budget.clone(),
                receiving: self.receiving.clone(),
                conversions: Arc::clone(&self.conversions),
                deadline: now + WAIT,
                admitted_at: now,
                waited: Duration::ZERO,
                received: BudgetPermit::empty(),
                principal: None,
                principal_held: None,
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn busy_conversion_slots_answer_backpressure_at_the_deadline() {
        let gateway = Gateway::new();
        let busy = Arc::clone(&gateway.conversions).acquire_owned().await.expect("a slot");
        let started = Instant::now();
        let problem = gateway.admit().reserve(1024).await.expect_err("no slot frees up");
        assert_eq!(problem.code, ErrorCode::Backpressure);
        assert_eq!(started.elapsed(), WAIT, "refused at the deadline, not before or after");
        drop(busy);
        let converting = gateway.admit().reserve(1024).await.expect("a free slot");
        assert_eq!(converting.waited(), Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn every_wait_of_a_request_shares_one_deadline() {
        let gateway = Gateway::new();
        // The receive budget is full for 3 s.
        let full = gateway.receiving.acquire(16 * 1024, None, WAIT).await.expect("room");
        let release = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(3)).await;
            drop(full);
        });
        let busy = Arc::clone(&gateway.conversions).acquire_owned().await.expect("a slot");
        let started = Instant::now();
        let mut admission = gateway.admit();
        admission.hold_received(1024).await.expect("room after 3 s");
        assert_eq!(started.elapsed(), Duration::from_secs(3));
        // The conversion slot stays busy: the request gets what is left of its wait, 2 s.
        let problem = admission.reserve(1024).await.expect_err("no slot frees up");
        assert_eq!(problem.code, ErrorCode::Backpressure);
        assert_eq!(started.elapsed(), WAIT, "one deadline for every wait, not one per wait");
        release.await.expect("released");
        drop(busy);
    }

    #[tokio::test(start_paused = true)]
    async fn the_time_a_request_waited_is_counted_across_its_waits() {
        let gateway = Gateway::new();
        let busy = Arc::clone(&gateway.conversions).acquire_owned().await.expect("a slot");
        let free_slot = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(2)).await;
            drop(busy);
        });
        let full = gateway.receiving.acquire(16 * 1024, None, WAIT).await.expect("room");
        let free_room = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(1)).await;
            drop(full);
        });
        let mut admission = gateway.admit();
        admission.hold_received(1024).await.expect("room after 1 s");
        let converting = admission.reserve(1024).await.expect("a slot after 2 s");
        assert_eq!(converting.waited(), Duration::from_secs(2), "1 s for room, then 1 s more for a slot");
        free_slot.await.expect("freed");
        free_room.await.expect("freed");
    }
}
