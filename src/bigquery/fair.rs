//! Fair sharing of what BigQuery's quotas and the adaptive limits hand out, between tenants:
//! the principals whose runs and requests the calls serve (`principals`; the simple mode's
//! `default` is one), and the gateway's own calls as one more.
//!
//! - **Fair queues** ([`FairQueue`]) stand in front of each token bucket, concurrency share and
//!   adaptive limit (`super::quota`, `super::adaptive`). Calls waiting for a place are queued
//!   per tenant and served by deficit round-robin with equal quanta and a cost of one call
//!   each, which is round-robin across tenants: a tenant with calls waiting is served once in
//!   every round, however many calls another tenant queued. Each tenant's share is thus an equal
//!   part of the place among the tenants waiting for it, and all of it when it waits alone
//!   (nothing is held back for tenants that do not ask). A queue lets one caller at a time wait
//!   at the place it guards (its [`Turn`]): that caller waits there (for its token, its
//!   permit), then gives the turn on, so the first-come order behind the queue never holds
//!   more than one waiter and the order served is the queue's.
//! - **Caps per principal** ([`PerPrincipalCap`]) on places a principal holds for long: its
//!   open lanes (`FILAMENT_MAX_OPEN_LANES_PER_PRINCIPAL`) and its connection tests in flight
//!   (`FILAMENT_MAX_CONNECTION_TESTS_PER_PRINCIPAL`). A principal at its cap is refused at once
//!   (the caller answers 429 with a stable code, having changed nothing), never queued.
//!
//! `/metrics` names no tenant: `filament_fair_queue_calls_waiting` and
//! `filament_fair_queue_principals_waiting` are labelled by queue only (the quota or the
//! operation), summed over the destinations of queues kept per project and location;
//! `filament_principal_cap_places_held` and `filament_principal_cap_refusals_total` by cap.

use parking_lot::Mutex;
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use tokio::sync::oneshot;

use crate::telemetry;

/// Whose call it is, for fair sharing: never a metric label.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) enum Tenant {
    /// The gateway's own calls (readiness, clean-up outside a run's commit or abort).
    Gateway,
    /// A principal, by name.
    Principal(Arc<str>),
}

impl Tenant {
    pub(crate) fn principal(name: &str) -> Self {
        Tenant::Principal(Arc::from(name))
    }
}

/// A round-robin queue of callers per tenant in front of one place (a token bucket, a
/// concurrency share, an adaptive limit).
#[derive(Debug)]
pub(crate) struct FairQueue {
    /// The queue's labels in `/metrics` (the quota or operation; never a tenant).
    labels: Vec<metrics::Label>,
    state: Mutex<QueueState>,
}

#[derive(Debug, Default)]
struct QueueState {
    /// A caller holds the turn. Whenever a call waits, one does.
    turn_taken: bool,
    /// The tenants with calls waiting, the next to be served first.
    rotation: VecDeque<Tenant>,
    /// Each waiting tenant's calls, oldest first (never an empty queue).
    waiting: HashMap<Tenant, VecDeque<Waiter>>,
    next_waiter: u64,
}

#[derive(Debug)]
struct Waiter {
    id: u64,
    wake: oneshot::Sender<()>,
}

/// The turn to wait at the queue's place; given on to the next caller when dropped.
#[derive(Debug)]
pub(crate) struct Turn<'a> {
    queue: &'a FairQueue,
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        self.queue.pass_turn_on(&mut self.queue.lock());
    }
}

/// A call queued for its turn. Dropped before its turn came (a cancelled wait), it leaves the
/// queue; dropped after the turn was handed to it but before it noticed, it gives the turn on.
struct Queued<'a> {
    queue: &'a FairQueue,
    tenant: &'a Tenant,
    id: u64,
    granted: bool,
}

impl Drop for Queued<'_> {
    fn drop(&mut self) {
        if self.granted {
            return;
        }
        let mut state = self.queue.lock();
        let Some(calls) = state.waiting.get_mut(self.tenant).filter(|calls| calls.iter().any(|w| w.id == self.id))
        else {
            // Handed the turn while being cancelled: the next caller takes it.
            self.queue.pass_turn_on(&mut state);
            return;
        };
        calls.retain(|waiter| waiter.id != self.id);
        let emptied = calls.is_empty();
        self.queue.call_left();
        if emptied {
            state.waiting.remove(self.tenant);
            state.rotation.retain(|tenant| tenant != self.tenant);
            self.queue.tenant_left();
        }
    }
}

impl FairQueue {
    pub(crate) fn new(labels: Vec<metrics::Label>) -> Self {
        FairQueue { labels, state: Mutex::default() }
    }

    fn lock(&self) -> parking_lot::MutexGuard<'_, QueueState> {
        self.state.lock()
    }

    /// The turn at once, when no call holds it (and so none waits).
    pub(crate) fn try_turn(&self) -> Option<Turn<'_>> {
        let mut state = self.lock();
        if state.turn_taken {
            return None;
        }
        state.turn_taken = true;
        Some(Turn { queue: self })
    }

    /// Waits for `tenant`'s turn: after every tenant queued before it in this round had one
    /// call served. Cancel-safe.
    pub(crate) async fn turn<'a>(&'a self, tenant: &'a Tenant) -> Turn<'a> {
        let (id, woken) = {
            let mut state = self.lock();
            if !state.turn_taken {
                state.turn_taken = true;
                return Turn { queue: self };
            }
            let id = state.next_waiter;
            state.next_waiter += 1;
            let (wake, woken) = oneshot::channel();
            let calls = state.waiting.entry(tenant.clone()).or_default();
            let first_of_tenant = calls.is_empty();
            calls.push_back(Waiter { id, wake });
            if first_of_tenant {
                state.rotation.push_back(tenant.clone());
                telemetry::fair_queue_principals(&self.labels, true);
            }
            telemetry::fair_queue_calls(&self.labels, true);
            (id, woken)
        };
        let mut queued = Queued { queue: self, tenant, id, granted: false };
        // The sender is dropped only once it sent (the turn is this caller's) or after `Queued`
        // took the waiter out, which happens only when this future is dropped.
        let _ = woken.await;
        queued.granted = true;
        Turn { queue: self }
    }

    /// Hands the turn to the next tenant's oldest call, or frees it when none waits.
    fn pass_turn_on(&self, state: &mut QueueState) {
        while let Some(tenant) = state.rotation.pop_front() {
            let Some(calls) = state.waiting.get_mut(&tenant) else { continue };
            let waiter = calls.pop_front();
            if calls.is_empty() {
                state.waiting.remove(&tenant);
                self.tenant_left();
            } else {
                state.rotation.push_back(tenant);
            }
            let Some(waiter) = waiter else { continue };
            self.call_left();
            if waiter.wake.send(()).is_ok() {
                return;
            }
        }
        state.turn_taken = false;
    }

    fn call_left(&self) {
        telemetry::fair_queue_calls(&self.labels, false);
    }

    fn tenant_left(&self) {
        telemetry::fair_queue_principals(&self.labels, false);
    }

    /// Calls waiting, in all.
    #[cfg(test)]
    pub(crate) fn calls_waiting(&self) -> usize {
        self.lock().waiting.values().map(VecDeque::len).sum()
    }
}

/// What each principal holds of something capped per principal (its open lanes, its
/// connection tests in flight). Cheap to clone (clones share the counts).
#[derive(Debug, Clone)]
pub(crate) struct PerPrincipalCap {
    /// `open_lanes`, `connection_tests`: the `cap` label in `/metrics`.
    name: &'static str,
    cap: usize,
    held: Arc<Mutex<HashMap<Tenant, usize>>>,
}

/// One place under a [`PerPrincipalCap`], given back when dropped.
#[derive(Debug)]
pub(crate) struct CapPlace {
    cap: PerPrincipalCap,
    tenant: Tenant,
}

impl Drop for CapPlace {
    fn drop(&mut self) {
        let mut held = self.cap.lock();
        if let Some(count) = held.get_mut(&self.tenant) {
            *count -= 1;
            if *count == 0 {
                held.remove(&self.tenant);
            }
        }
        telemetry::principal_cap_place(self.cap.name, false);
    }
}

impl PerPrincipalCap {
    /// At most `cap` places per tenant of `name` (`open_lanes`, `connection_tests`).
    pub(crate) fn new(name: &'static str, cap: usize) -> Self {
        PerPrincipalCap { name, cap: cap.max(1), held: Arc::default() }
    }

    fn lock(&self) -> parking_lot::MutexGuard<'_, HashMap<Tenant, usize>> {
        self.held.lock()
    }

    /// The cap.
    pub(crate) fn cap(&self) -> usize {
        self.cap
    }

    /// Whether `tenant` holds its cap, so that a request needing a place is refused (counted
    /// as a refusal; nothing taken).
    pub(crate) fn refuses(&self, tenant: &Tenant) -> bool {
        let full = self.lock().get(tenant).is_some_and(|&count| count >= self.cap);
        if full {
            telemetry::principal_cap_refused(self.name);
        }
        full
    }

    /// A place for `tenant`, or `None` (counted as a refusal) when it holds its cap.
    pub(crate) fn try_take(&self, tenant: &Tenant) -> Option<CapPlace> {
        let mut held = self.lock();
        let count = held.entry(tenant.clone()).or_default();
        if *count >= self.cap {
            telemetry::principal_cap_refused(self.name);
            return None;
        }
        *count += 1;
        drop(held);
        Some(self.counted(tenant))
    }

    /// A place for `tenant` whatever it holds: for what was admitted under the cap already
    /// (a lane started by a request whose own place another request's lane took).
    pub(crate) fn take_regardless(&self, tenant: &Tenant) -> CapPlace {
        *self.lock().entry(tenant.clone()).or_default() += 1;
        self.counted(tenant)
    }

    fn counted(&self, tenant: &Tenant) -> CapPlace {
        telemetry::principal_cap_place(self.name, true);
        CapPlace { cap: self.clone(), tenant: tenant.clone() }
    }
}

#[cfg(test)]
#[path = "fair_tests.rs"]
mod tests;
