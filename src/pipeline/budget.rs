//! The shared byte budget: queued plus in-flight encoded payloads of the whole gateway. A batch
//! request acquires its payloads' bytes before it is recorded (waiting a bounded time, then
//! answering 429 `backpressure`); the permit travels with the payload and is released the
//! moment BigQuery acknowledges it. Each resource of an execution also holds its bytes against
//! its own **share** (a part of the budget), acquired first: a resource BigQuery acknowledges
//! slowly fills its share and waits, instead of filling the budget and stalling the others.
//!
//! While a request waits, it counts in the [`Pressure`] of what it waits for: every lane while
//! it waits for the budget, its own resource's lane while it waits for the share. Those lanes
//! then send the rows they hold back for a fuller upload batch, since only acknowledged bytes
//! make room (a thousand resources with a small batch each would otherwise fill the budget
//! with rows waiting for their flush interval). A resource that BigQuery acknowledges slowly
//! presses only its own lane, so the other tables keep their full upload batches.
//!
//! The upload budget also counts each AppendRows request's compressed frame from the moment it
//! is queued on its connection until HTTP/2 takes it to send ([`FrameCharge`]): a peer reading
//! slowly fills the budget with frames, and new requests wait, instead of frames piling up
//! beside it. A send never waits for room (the rows it sends are what make room): a frame
//! charged while the budget is full is owed, and the next bytes released pay it first.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};

use crate::error::{ErrorCode, Problem};
use crate::telemetry;

/// Budget accounting granularity: permits are KiB so any budget fits a semaphore's u32 acquire.
const UNIT_BYTES: usize = 1024;

#[derive(Debug, Clone)]
pub(crate) struct ByteBudget {
    semaphore: Arc<Semaphore>,
    capacity_units: usize,
    /// Units of frames charged while the budget had no room, not paid yet.
    debt: Debt,
    pressure: Pressure,
    /// What the budget holds, for answers (`the upload budget`, `the receive budget`).
    name: &'static str,
    /// The gauge of its bytes in use, when it has one.
    gauge: Option<&'static str>,
}

/// How many requests are waiting for room in the budget (or in one resource's share). Lanes
/// holding rows back watch it: while any request waits, they send what they hold.
#[derive(Debug, Clone)]
pub(crate) struct Pressure(Arc<watch::Sender<usize>>);

impl Pressure {
    fn new() -> Self {
        Self(Arc::new(watch::Sender::new(0)))
    }

    /// Counts one waiting request until the returned guard drops.
    fn waiting(&self) -> WaitingRequest {
        self.0.send_modify(|waiting| *waiting += 1);
        WaitingRequest(self.clone())
    }

    pub(crate) fn subscribe(&self) -> watch::Receiver<usize> {
        self.0.subscribe()
    }
}

/// One request counted in [`Pressure`] while it waits.
#[derive(Debug)]
struct WaitingRequest(Pressure);

impl Drop for WaitingRequest {
    fn drop(&mut self) {
        self.0.0.send_modify(|waiting| *waiting -= 1);
    }
}

/// What a budget owes: units of [`FrameCharge`]s it had no room for when they were charged.
/// A [`BudgetPermit`] released while it owes pays the debt with its units first (forgetting
/// them), so the charge counts as soon as anything makes room.
#[derive(Debug, Clone, Default)]
struct Debt(Arc<AtomicUsize>);

impl Debt {
    fn add(&self, units: usize) {
        self.0.fetch_add(units, Ordering::AcqRel);
    }

    /// Takes up to `units` off what is owed; how many it took.
    fn settle(&self, units: usize) -> usize {
        let mut settled = 0;
        let _ = self.0.fetch_update(Ordering::AcqRel, Ordering::Acquire, |owed| {
            settled = owed.min(units);
            Some(owed - settled)
        });
        settled
    }

    fn owed_units(&self) -> usize {
        self.0.load(Ordering::Acquire)
    }
}

/// One compressed AppendRows frame counted in the upload budget while it waits for HTTP/2 to
/// take it ([`ByteBudget::charge_frame`]); dropping it (the transport took the frame, or the
/// connection went away with it) gives its bytes back.
#[derive(Debug)]
pub(crate) struct FrameCharge {
    budget: ByteBudget,
    units: usize,
}

impl Drop for FrameCharge {
    fn drop(&mut self) {
        // What is still owed for it is no longer owed; what was paid (forgotten) comes back.
        let unpaid = self.budget.debt.settle(self.units);
        self.budget.semaphore.add_permits(self.units - unpaid);
        telemetry::send_queue(false, self.units * UNIT_BYTES);
        self.budget.record_gauge();
    }
}

/// Bytes held against the budget (and the resource's share); released on drop, paying what
/// the budget owes for frames first ([`Debt`]).
#[derive(Debug)]
pub(crate) struct BudgetPermit {
    permit: Option<OwnedSemaphorePermit>,
    /// The budget `permit` is from: what it owes, its gauge.
    budget: Option<Arc<ByteBudget>>,
    share: Option<OwnedSemaphorePermit>,
    /// The principal's share held by these bytes (`PrincipalShare`), when it has one.
    principal: Option<OwnedSemaphorePermit>,
    units: usize,
    /// Units of the share held: `units`, or fewer for a batch larger than the whole share.
    share_units: usize,
}

/// One resource's part of the budget.
#[derive(Debug, Clone)]
pub(crate) struct ResourceShare {
    semaphore: Arc<Semaphore>,
    capacity_units: usize,
    /// Size of the resource's latest request: the estimate [`Self::wait_for_room`] waits for.
    last_request_units: Arc<AtomicUsize>,
    /// Requests waiting for this share; the resource's lane watches it.
    pressure: Pressure,
}

impl ResourceShare {
    pub(crate) fn new(capacity_bytes: usize) -> Self {
        let capacity_units = units_for(capacity_bytes);
        Self {
            semaphore: Arc::new(Semaphore::new(capacity_units)),
            capacity_units,
            last_request_units: Arc::new(AtomicUsize::new(0)),
            pressure: Pressure::new(),
        }
    }

    pub(crate) fn pressure(&self) -> &Pressure {
        &self.pressure
    }

    /// Waits (up to `max_wait`) until the share has room for a request as large as the
    /// resource's previous one, taking nothing: a request waits here before it reads and
    /// decodes its body, so waiting requests hold no decoded data. After `max_wait`, the 429
    /// `backpressure` problem.
    pub(crate) async fn wait_for_room(&self, max_wait: Duration) -> Result<(), Problem> {
        let units = self.last_request_units.load(Ordering::Relaxed).min(self.capacity_units);
        if units == 0 {
            return Ok(());
        }
        let _waiting = (self.semaphore.available_permits() < units).then(|| self.pressure.waiting());
        match tokio::time::timeout(max_wait, self.semaphore.acquire_many(units as u32)).await {
            Ok(_) => Ok(()),
            Err(_) => Err(backpressure(
                format!("the resource's share of the upload budget ({} bytes)", self.capacity_units * UNIT_BYTES),
                max_wait,
            )),
        }
    }
}

/// One principal's part of the gateway (`max_buffered_bytes`): what its batch requests hold,
/// from admission (their bodies as they arrive) until BigQuery acknowledges their rows. A
/// principal over it waits, holding nothing else, then gets 429 `principal_limit`; the others
/// are served as before.
#[derive(Debug, Clone)]
pub(crate) struct PrincipalShare {
    principal: String,
    semaphore: Arc<Semaphore>,
    capacity_units: usize,
}

impl PrincipalShare {
    pub(crate) fn new(principal: &str, capacity_bytes: usize) -> Self {
        let capacity_units = units_for(capacity_bytes);
        Self { principal: principal.to_string(), semaphore: Arc::new(Semaphore::new(capacity_units)), capacity_units }
    }

    pub(crate) fn capacity_bytes(&self) -> usize {
        self.capacity_units * UNIT_BYTES
    }

    /// Adds `bytes` to what `held` holds, within `max_wait` (else 429 `principal_limit`). A
    /// request holds at most the whole share, so one larger than the share still goes, alone.
    pub(crate) async fn hold_more(
        &self,
        held: &mut Option<OwnedSemaphorePermit>,
        bytes: usize,
        max_wait: Duration,
    ) -> Result<(), Problem> {
        let holding = held.as_ref().map_or(0, OwnedSemaphorePermit::num_permits);
        let units = (holding + units_for(bytes)).min(self.capacity_units).saturating_sub(holding);
        if units == 0 {
            return Ok(());
        }
        match tokio::time::timeout(max_wait, Arc::clone(&self.semaphore).acquire_many_owned(units as u32)).await {
            Ok(Ok(more)) => {
                match held {
                    Some(held) => held.merge(more),
                    None => *held = Some(more),
                }
                Ok(())
            }
            _ => Err(Problem::new(
                ErrorCode::PrincipalLimit,
                format!(
                    "principal {} has its share of the gateway ({} bytes) in use for {} ms",
                    self.principal,
                    self.capacity_bytes(),
                    max_wait.as_millis()
                ),
            )
            .with_hint("retry after Retry-After; the share frees as BigQuery acknowledges the principal's rows")
            .with_retry_after(2)),
        }
    }
}

fn units_for(bytes: usize) -> usize {
    bytes.div_ceil(UNIT_BYTES).max(1)
}

impl ByteBudget {
    pub(crate) fn new(capacity_bytes: usize, name: &'static str) -> Self {
        let capacity_units = units_for(capacity_bytes);
        Self {
            semaphore: Arc::new(Semaphore::new(capacity_units)),
            capacity_units,
            debt: Debt::default(),
            pressure: Pressure::new(),
            name,
            gauge: None,
        }
    }

    /// Reports the bytes in use to `gauge`.
    pub(crate) fn reporting_to(self, gauge: &'static str) -> Self {
        Self { gauge: Some(gauge), ..self }
    }

    /// Counts `frame_bytes` of a compressed frame queued for sending until the returned charge
    /// drops, without waiting: what the budget has free now is taken, the rest is owed.
    pub(crate) fn charge_frame(&self, frame_bytes: usize) -> FrameCharge {
        let units = units_for(frame_bytes);
        let taken = self.semaphore.forget_permits(units);
        self.debt.add(units - taken);
        telemetry::send_queue(true, units * UNIT_BYTES);
        self.record_gauge();
        FrameCharge { budget: self.clone(), units }
    }

    pub(crate) fn pressure(&self) -> &Pressure {
        &self.pressure
    }

    pub(crate) fn capacity_bytes(&self) -> usize {
        self.capacity_units * UNIT_BYTES
    }

    /// Refuses at once (413 `payload_too_large`) `bytes` more for a request that already
    /// holds `held` of this budget, when both together exceed all of it: such a request would
    /// wait for room only it could free, then get a retryable 429 it can never get past.
    pub(crate) fn refuse_more_than_capacity(&self, held: &BudgetPermit, bytes: usize) -> Result<(), Problem> {
        if held.units.saturating_add(units_for(bytes)) <= self.capacity_units {
            return Ok(());
        }
        Err(Problem::new(
            ErrorCode::PayloadTooLarge,
            format!(
                "the batch needs {} bytes of {}, more than all of it ({} bytes)",
                held.bytes().saturating_add(bytes),
                self.name,
                self.capacity_bytes()
            ),
        )
        .with_hint("split the data into smaller batch requests"))
    }

    /// Bytes currently held by queued and in-flight payloads and by frames waiting to be sent
    /// (above the capacity while the budget owes for frames).
    pub(crate) fn in_use_bytes(&self) -> usize {
        (self.capacity_units - self.semaphore.available_permits() + self.debt.owed_units()) * UNIT_BYTES
    }

    /// Waits up to `max_wait` in all for `bytes` of `share` (when given) and of the budget;
    /// otherwise a 429 problem with `Retry-After`.
    pub(crate) async fn acquire(
        &self,
        bytes: usize,
        share: Option<&ResourceShare>,
        max_wait: Duration,
    ) -> Result<BudgetPermit, Problem> {
        let units = units_for(bytes);
        if let Some(share) = share {
            share.last_request_units.store(units, Ordering::Relaxed);
        }
        // A batch larger than a share may still go when the share is otherwise empty.
        let share_units = share.map(|s| units.min(s.capacity_units));
        self.refuse_more_than_capacity(&BudgetPermit::empty(), bytes)?;
        let _waiting_for_share = share
            .zip(share_units)
            .filter(|(share, units)| share.semaphore.available_permits() < *units)
            .map(|(share, _)| share.pressure.waiting());
        let _waiting_for_budget = (self.semaphore.available_permits() < units).then(|| self.pressure.waiting());
        let started = Instant::now();
        let acquired = tokio::time::timeout(max_wait, async {
            let share = match (share, share_units) {
                (Some(share), Some(share_units)) => {
                    Some(Arc::clone(&share.semaphore).acquire_many_owned(share_units as u32).await?)
                }
                _ => None,
            };
            let permit = Arc::clone(&self.semaphore).acquire_many_owned(units as u32).await?;
            Ok::<_, tokio::sync::AcquireError>((permit, share))
        })
        .await;
        let waited = started.elapsed();
        if waited >= Duration::from_millis(1) {
            telemetry::backpressure_waited();
        }
        match acquired {
            Ok(Ok((permit, share))) => {
                self.record_gauge();
                let share_units = share.as_ref().map_or(0, OwnedSemaphorePermit::num_permits);
                let budget = Some(Arc::new(self.clone()));
                Ok(BudgetPermit { permit: Some(permit), budget, share, principal: None, units, share_units })
            }
            _ => Err(backpressure(format!("{} ({} bytes)", self.name, self.capacity_bytes()), max_wait)),
        }
    }

    pub(crate) fn record_gauge(&self) {
        if let Some(gauge) = self.gauge {
            telemetry::budget_in_use(gauge, self.in_use_bytes());
        }
    }
}

/// 429 `backpressure`: `what` stayed full for `waited`.
fn backpressure(what: String, waited: Duration) -> Problem {
    telemetry::backpressure_refused();
    Problem::new(ErrorCode::Backpressure, format!("{what} stayed full for {} ms", waited.as_millis()))
        .with_hint("retry after the Retry-After delay; BigQuery is acknowledging slower than batches arrive")
        .with_retry_after(2)
}

impl BudgetPermit {
    /// A permit holding nothing (payloads created outside the budget, e.g. in tests).
    pub(crate) fn empty() -> Self {
        Self { permit: None, budget: None, share: None, principal: None, units: 0, share_units: 0 }
    }

    /// Divides the permit among pieces of `piece_bytes` each, in order: every piece but the
    /// last gets its own bytes (capped at what is left), the last gets the rest.
    pub(crate) fn divide(mut self, piece_bytes: impl ExactSizeIterator<Item = usize>) -> Vec<BudgetPermit> {
        let count = piece_bytes.len();
        let mut pieces = Vec::with_capacity(count);
        for (index, bytes) in piece_bytes.enumerate() {
            if index + 1 == count {
                pieces.push(std::mem::replace(&mut self, BudgetPermit::empty()));
            } else {
                pieces.push(self.split(bytes));
            }
        }
        pieces
    }

    /// Splits `units_for(bytes)` off into a new permit (capped at what this one holds), with
    /// the matching part of the share.
    fn split(&mut self, bytes: usize) -> BudgetPermit {
        let units = units_for(bytes).min(self.units);
        let Some(split) = self.permit.as_mut().and_then(|p| p.split(units)) else {
            return BudgetPermit::empty();
        };
        self.units -= units;
        let share_units = units.min(self.share_units);
        let share = self.share.as_mut().and_then(|s| s.split(share_units));
        let share_units = if share.is_some() { share_units } else { 0 };
        self.share_units -= share_units;
        let principal_units = units.min(self.principal.as_ref().map_or(0, OwnedSemaphorePermit::num_permits));
        let principal = self.principal.as_mut().and_then(|p| p.split(principal_units));
        BudgetPermit { permit: Some(split), budget: self.budget.clone(), share, principal, units, share_units }
    }

    /// Makes the permit hold `principal`'s share too, as much of it as the permit's bytes
    /// (the rest is given back).
    pub(crate) fn with_principal(mut self, mut principal: OwnedSemaphorePermit) -> BudgetPermit {
        if principal.num_permits() > self.units
            && let Some(kept) = principal.split(self.units)
        {
            principal = kept;
        }
        self.principal = Some(principal);
        self
    }

    /// The bytes this permit holds (whole KiB).
    pub(crate) fn bytes(&self) -> usize {
        self.units * UNIT_BYTES
    }

    /// The part of this permit that holds `bytes` (all of it when it holds less); the rest is
    /// given back.
    pub(crate) fn keep(mut self, bytes: usize) -> BudgetPermit {
        if units_for(bytes) >= self.units {
            return self;
        }
        self.split(bytes)
    }

    /// Joins another permit (of the same resource) into this one.
    pub(crate) fn merge(&mut self, mut other: BudgetPermit) {
        fn join(mine: &mut Option<OwnedSemaphorePermit>, theirs: Option<OwnedSemaphorePermit>) {
            match (mine.as_mut(), theirs) {
                (Some(m), Some(t)) => m.merge(t),
                (None, Some(t)) => *mine = Some(t),
                _ => {}
            }
        }
        join(&mut self.permit, other.permit.take());
        if self.budget.is_none() {
            self.budget = other.budget.take();
        }
        join(&mut self.share, other.share.take());
        join(&mut self.principal, other.principal.take());
        self.units += other.units;
        self.share_units += other.share_units;
    }
}

impl crate::bigquery::write::SendQueueAccount for ByteBudget {
    fn hold(&self, frame_bytes: usize) -> crate::bigquery::write::SendQueueHold {
        Box::new(self.charge_frame(frame_bytes))
    }
}

impl Drop for BudgetPermit {
    fn drop(&mut self) {
        let (Some(budget), Some(mut permit)) = (self.budget.take(), self.permit.take()) else { return };
        let paid = budget.debt.settle(permit.num_permits());
        if let Some(paid) = permit.split(paid) {
            paid.forget();
        }
        drop(permit);
        budget.record_gauge();
    }
}

#[cfg(test)]
#[path = "budget_tests.rs"]
mod tests;
