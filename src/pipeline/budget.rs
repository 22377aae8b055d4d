//! The shared byte budget: queued plus in-flight encoded payloads of the whole gateway. A batch
//! request acquires its payloads' bytes before it is recorded (waiting a bounded time, then
//! answering 429 `backpressure`); the permit travels with the payload and is released the
//! moment BigQuery acknowledges it. Per-resource queues share the budget with no count cap.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::error::{ErrorCode, Problem};
use crate::telemetry;

/// Budget accounting granularity: permits are KiB so any budget fits a semaphore's u32 acquire.
const UNIT_BYTES: usize = 1024;

#[derive(Debug, Clone)]
pub struct ByteBudget {
    semaphore: Arc<Semaphore>,
    capacity_units: usize,
}

/// Bytes held against the budget; released on drop.
#[derive(Debug)]
pub struct BudgetPermit {
    permit: Option<OwnedSemaphorePermit>,
    units: usize,
}

fn units_for(bytes: usize) -> usize {
    bytes.div_ceil(UNIT_BYTES).max(1)
}

impl ByteBudget {
    pub fn new(capacity_bytes: usize) -> Self {
        let capacity_units = units_for(capacity_bytes);
        Self { semaphore: Arc::new(Semaphore::new(capacity_units)), capacity_units }
    }

    pub fn capacity_bytes(&self) -> usize {
        self.capacity_units * UNIT_BYTES
    }

    /// Bytes currently held by queued and in-flight payloads.
    pub fn in_use_bytes(&self) -> usize {
        (self.capacity_units - self.semaphore.available_permits()) * UNIT_BYTES
    }

    /// Waits up to `max_wait` for `bytes`; otherwise a 429 problem with `Retry-After`.
    pub async fn acquire(&self, bytes: usize, max_wait: Duration) -> Result<BudgetPermit, Problem> {
        let units = units_for(bytes);
        if units > self.capacity_units {
            return Err(Problem::new(
                ErrorCode::PayloadTooLarge,
                format!(
                    "the batch encodes to {bytes} bytes, more than the whole upload budget ({} bytes)",
                    self.capacity_bytes()
                ),
            )
            .with_hint("split the data into smaller batch requests"));
        }
        let started = Instant::now();
        let acquired =
            tokio::time::timeout(max_wait, Arc::clone(&self.semaphore).acquire_many_owned(units as u32)).await;
        let waited = started.elapsed();
        if waited >= Duration::from_millis(1) {
            metrics::counter!(telemetry::BACKPRESSURE_WAITS).increment(1);
        }
        match acquired {
            Ok(Ok(permit)) => {
                self.record_gauge();
                Ok(BudgetPermit { permit: Some(permit), units })
            }
            _ => {
                metrics::counter!(telemetry::BACKPRESSURE_REJECTIONS).increment(1);
                let mut problem = Problem::new(
                    ErrorCode::Backpressure,
                    format!(
                        "the upload budget ({} bytes) stayed full for {} ms",
                        self.capacity_bytes(),
                        max_wait.as_millis()
                    ),
                )
                .with_hint("retry after the Retry-After delay; BigQuery is acknowledging slower than batches arrive");
                problem.retry_after_secs = Some(2);
                Err(problem)
            }
        }
    }

    pub fn record_gauge(&self) {
        metrics::gauge!(telemetry::BUDGET_BYTES_IN_USE).set(self.in_use_bytes() as f64);
    }
}

impl BudgetPermit {
    /// A permit holding nothing (payloads created outside the budget, e.g. in tests).
    pub fn empty() -> Self {
        Self { permit: None, units: 0 }
    }

    /// Splits `units_for(bytes)` off into a new permit (capped at what this one holds).
    pub fn split(&mut self, bytes: usize) -> BudgetPermit {
        let units = units_for(bytes).min(self.units);
        let split = self.permit.as_mut().and_then(|p| p.split(units));
        self.units -= if split.is_some() { units } else { 0 };
        BudgetPermit { units: if split.is_some() { units } else { 0 }, permit: split }
    }

    /// Joins another permit into this one.
    pub fn merge(&mut self, mut other: BudgetPermit) {
        match (self.permit.as_mut(), other.permit.take()) {
            (Some(mine), Some(theirs)) => mine.merge(theirs),
            (None, Some(theirs)) => self.permit = Some(theirs),
            _ => {}
        }
        self.units += other.units;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn waits_then_answers_backpressure_and_releases_on_drop() {
        let budget = ByteBudget::new(10 * 1024);
        let held = budget.acquire(8 * 1024, Duration::from_secs(1)).await.unwrap();
        assert_eq!(budget.in_use_bytes(), 8 * 1024);
        let problem = budget.acquire(4 * 1024, Duration::from_secs(1)).await.unwrap_err();
        assert_eq!(problem.code, ErrorCode::Backpressure);
        assert_eq!(problem.retry_after_secs, Some(2));
        let waiter = tokio::spawn({
            let budget = budget.clone();
            async move { budget.acquire(4 * 1024, Duration::from_secs(5)).await.map(|_| ()) }
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
        drop(held);
        assert!(waiter.await.unwrap().is_ok());
        assert_eq!(budget.in_use_bytes(), 0);
        assert_eq!(
            budget.acquire(11 * 1024, Duration::from_secs(1)).await.unwrap_err().code,
            ErrorCode::PayloadTooLarge
        );
    }

    #[tokio::test]
    async fn permits_split_and_merge_without_losing_bytes() {
        let budget = ByteBudget::new(100 * 1024);
        let mut whole = budget.acquire(10 * 1024, Duration::from_secs(1)).await.unwrap();
        let part = whole.split(3 * 1024);
        assert_eq!(budget.in_use_bytes(), 10 * 1024);
        drop(part);
        assert_eq!(budget.in_use_bytes(), 7 * 1024);
        let other = budget.acquire(1024, Duration::from_secs(1)).await.unwrap();
        whole.merge(other);
        drop(whole);
        assert_eq!(budget.in_use_bytes(), 0);
    }
}
