//! This process as one replica of a gateway fleet sharing one Postgres. An open execution's
//! uploads live in the memory of the replica that opened its current delivery (its **owner**),
//! so that replica holds a lease on it in Postgres, renewed while it lives, and advertises where
//! it takes forwarded requests (`api::forward` streams them there). A replica that cannot
//! forward refuses the execution's batches and transitions (503 `execution_owned_elsewhere`,
//! never a silent loss), and any replica fails an execution whose lease expired (its owner
//! crashed) with `gateway_restarted`. A replica that starts never fails work of live replicas.
//! One that shuts down ([`Replica::hand_over`]) drains each execution it owns under its gate,
//! records every stream's acknowledged offset and releases it; the next replica to receive one
//! of its requests adopts it and goes on appending to the same streams. Only what could not be
//! handed over fails.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::bigquery::quota::{FleetMembership, FleetMembershipWatch};
use crate::error::{ErrorCode, Problem};
use crate::model::ExecutionState;
use crate::pipeline::Pipeline;
use crate::store::{Event, ExecutionRecord, Lease, Store};
use crate::telemetry;

/// How often old batch receipts are pruned.
const PRUNE_INTERVAL: Duration = Duration::from_secs(3600);

/// This replica and its lease on the executions it serves.
#[derive(Debug, Clone)]
pub(crate) struct Replica {
    pub(crate) lease: Lease,
    store: Store,
    /// Set on SIGTERM: unready, adopts nothing, opens no execution, hands over what it owns.
    draining: Arc<AtomicBool>,
    /// This replica's place in the fleet: the live replicas as the last renewal counted them,
    /// or lapsed.
    fleet_membership: Arc<tokio::sync::watch::Sender<FleetMembership>>,
    /// Until when the others count this replica live: its last successful renewal's start
    /// plus the lease.
    counted_until: Arc<tokio::sync::watch::Sender<tokio::time::Instant>>,
}

fn gateway_restarted(detail: &str) -> Problem {
    Problem::new(ErrorCode::GatewayRestarted, detail)
        .with_hint("deliver the execution again (POST it with the same execution_id)")
}

impl Replica {
    /// A new replica id: the host name (a Kubernetes pod's name) and a random suffix; `url` is
    /// where the others forward its executions' requests.
    pub(crate) fn new(store: Store, lease_duration: Duration, url: Option<String>) -> Self {
        let host = std::env::var("HOSTNAME").ok().filter(|h| !h.is_empty()).unwrap_or_else(|| "gateway".into());
        let owner = format!("{host}-{}", hex::encode(rand::random::<[u8; 4]>()));
        let fleet_membership = Arc::new(tokio::sync::watch::channel(FleetMembership::ALONE).0);
        let counted_until = Arc::new(tokio::sync::watch::channel(tokio::time::Instant::now() + lease_duration).0);
        let lease = Lease { owner, duration: lease_duration, url };
        Self { lease, store, draining: Arc::default(), fleet_membership, counted_until }
    }

    /// This replica's place among those sharing BigQuery's quotas (`bigquery::quota`): how many
    /// are counted live, or lapsed; kept current by the heartbeat.
    pub(crate) fn fleet_membership(&self) -> FleetMembershipWatch {
        self.fleet_membership.subscribe()
    }

    /// Renews this replica's place in the fleet and counts the live replicas (a replica whose
    /// lease lapsed is lost and no longer counted). On a store failure the last count stands
    /// until the lease it renewed runs out ([`Replica::watch_for_lapse`]).
    pub(crate) async fn renew_fleet_membership(&self) {
        let started = tokio::time::Instant::now();
        match self.store.renew_fleet_membership(&self.lease).await {
            Ok(live_replicas) => {
                let membership = FleetMembership::Counted { live_replicas };
                self.fleet_membership.send_if_modified(|now| std::mem::replace(now, membership) != membership);
                // The row's expiry is set later than this, so the others count this replica
                // at least until then.
                self.counted_until.send_replace(started + self.lease.duration);
                telemetry::fleet_size(live_replicas);
            }
            Err(e) => tracing::warn!(error = %e, "could not renew this replica's place in the fleet"),
        }
    }

    /// Once the lease of the last successful renewal runs out, the other replicas count this one
    /// lost and share the quotas without it: its membership lapses, and it paces no BigQuery
    /// call until a renewal counts it again (a renewal that hangs on an unreachable Postgres
    /// does not keep its share). Runs until `stop`.
    async fn watch_for_lapse(&self, stop: &CancellationToken) {
        let mut counted_until = self.counted_until.subscribe();
        loop {
            let until = *counted_until.borrow_and_update();
            tokio::select! {
                () = stop.cancelled() => return,
                renewed = counted_until.changed() => if renewed.is_err() { return },
                () = tokio::time::sleep_until(until) => {
                    let lapsed = self.fleet_membership.send_if_modified(|now| {
                        std::mem::replace(now, FleetMembership::Lapsed) != FleetMembership::Lapsed
                    });
                    if lapsed {
                        tracing::warn!("fleet membership lapsed: no paced BigQuery call until it is renewed");
                        telemetry::fleet_size(0);
                    }
                    tokio::select! {
                        () = stop.cancelled() => return,
                        renewed = counted_until.changed() => if renewed.is_err() { return },
                    }
                }
            }
        }
    }

    /// How often the heartbeat renews the leases and the fleet membership: a third of the lease.
    fn heartbeat_interval(&self) -> Duration {
        self.lease.duration / 3
    }

    /// Shutting down: from now on unready, adopting and opening nothing.
    pub(crate) fn start_draining(&self) {
        self.draining.store(true, Ordering::SeqCst);
    }

    pub(crate) fn is_draining(&self) -> bool {
        self.draining.load(Ordering::SeqCst)
    }

    /// 503 `replica_draining` while shutting down, for requests that would give this replica
    /// new work (opening an execution, adopting one).
    pub(crate) fn refuse_new_work(&self) -> Result<(), Problem> {
        if !self.is_draining() {
            return Ok(());
        }
        Err(Problem::new(ErrorCode::ReplicaDraining, "this gateway replica is shutting down and takes no new work")
            .with_hint("retry after Retry-After: the load balancer sends it to another replica")
            .with_retry_after(1))
    }

    /// Where to forward a request of `execution`: the owner's URL when another live replica
    /// serves it while it extracts. `None`: this replica answers it itself.
    pub(crate) fn forward_target(&self, execution: &ExecutionRecord) -> Option<String> {
        let extracting = ExecutionState::BEFORE_COMMIT.contains(&execution.state);
        let elsewhere = execution.owner.as_deref().is_some_and(|owner| owner != self.lease.owner);
        let live = execution.lease_expires_at.is_some_and(|expires| expires > chrono::Utc::now());
        // A replica restarted on the same address must not forward to itself (the crashed
        // process's lease is still live): it answers, and refuses, itself.
        let owner_url = execution.owner_url.as_ref().filter(|url| Some(*url) != self.lease.url.as_ref());
        if extracting && elsewhere && live { owner_url.cloned() } else { None }
    }

    /// Fails the executions whose owner stopped renewing its lease.
    pub(crate) async fn sweep(&self) {
        let problem = gateway_restarted(
            "the gateway replica serving this execution stopped (its lease expired); its uploads were lost",
        );
        match self.store.fail_orphaned_executions(None, &problem).await {
            Ok(0) => {}
            Ok(failed) => tracing::warn!(executions = failed, "failed executions whose replica stopped"),
            Err(e) => tracing::warn!(error = %e, "could not sweep orphaned executions"),
        }
    }

    /// Renews this replica's leases and sweeps orphaned executions every third of the lease,
    /// and prunes old batch receipts (retention `retention_days`) at start and every hour,
    /// until `stop`; meanwhile watches for its fleet membership to lapse.
    pub(crate) fn spawn_heartbeat(&self, retention_days: u32, stop: CancellationToken) -> tokio::task::JoinHandle<()> {
        let replica = self.clone();
        tokio::spawn(async move {
            let heartbeat = async {
                let mut ticks = tokio::time::interval(replica.heartbeat_interval());
                let mut prunes = tokio::time::interval(PRUNE_INTERVAL);
                loop {
                    tokio::select! {
                        () = stop.cancelled() => return,
                        _ = ticks.tick() => {
                            if let Err(e) = replica.store.renew_leases(&replica.lease).await {
                                tracing::warn!(error = %e, "could not renew execution leases");
                            }
                            replica.renew_fleet_membership().await;
                            replica.sweep().await;
                        }
                        _ = prunes.tick() => replica.prune(retention_days).await,
                    }
                }
            };
            tokio::join!(heartbeat, replica.watch_for_lapse(&stop));
        })
    }

    /// Deletes batch receipts no redelivery can need any more (see `Store::prune_receipts`).
    async fn prune(&self, retention_days: u32) {
        match self.store.prune_receipts(retention_days).await {
            Ok(Some(pruned)) => tracing::info!(receipts = pruned, retention_days, "store.pruned"),
            Ok(None) => tracing::debug!("another replica is pruning"),
            Err(e) => tracing::warn!(error = %e, "could not prune old receipts"),
        }
    }

    /// At shutdown, after the hand-over and the commits: what this replica still owns cannot go on.
    /// It also leaves the fleet: the others take its share of BigQuery's quotas at their next
    /// renewal (not before: until here it still finishes commits).
    pub(crate) async fn release(&self) {
        if let Err(e) = self.store.leave_fleet(&self.lease).await {
            tracing::warn!(error = %e, "shutdown: could not leave the fleet (its place lapses with its lease)");
        }
        let problem = gateway_restarted("the gateway replica serving this execution shut down; its uploads were lost");
        match self.store.fail_orphaned_executions(Some(&self.lease.owner), &problem).await {
            Ok(0) => {}
            Ok(failed) => tracing::warn!(executions = failed, "shutdown: failed the executions this replica served"),
            Err(e) => tracing::warn!(error = %e, "shutdown: could not fail this replica's executions"),
        }
    }

    /// Takes over an execution another replica handed over at shutdown (a write: the lease
    /// moves to this replica), or `execution_owned_elsewhere` when another one adopted it first.
    pub(crate) async fn adopt(&self, execution: ExecutionRecord) -> Result<Owned<ExecutionRecord>, Problem> {
        self.refuse_new_work()?;
        if let Some(adopted) = self.store.adopt_execution(&execution.delivery_ref(), &self.lease).await? {
            tracing::info!(run_id = %adopted.run_id, execution_id = %adopted.execution_id,
                delivery = adopted.delivery, "replica.adopted");
            let handed_over = Event::HandedOver { replica: &self.lease.owner };
            self.store.record_event(&adopted.delivery_ref(), None, handed_over).await;
            return Ok(Owned(adopted));
        }
        Err(Problem::new(
            ErrorCode::ExecutionOwnedElsewhere,
            format!("execution {} was just taken over by another gateway replica", execution.execution_id),
        )
        .with_hint("retry after Retry-After")
        .with_retry_after(1))
    }

    /// Fails an execution whose owner stopped renewing its lease (a write): the answer is
    /// `gateway_restarted` either way (another replica may have failed it first).
    pub(crate) async fn fail_orphan(&self, execution: &ExecutionRecord) -> Problem {
        let problem = gateway_restarted(
            "the gateway replica serving this execution stopped (its lease expired); its uploads were lost",
        );
        match self.store.fail_orphaned_delivery(&execution.delivery_ref(), &problem).await {
            Ok(Some(_)) => tracing::warn!(run_id = %execution.run_id, execution_id = %execution.execution_id,
                "failed an execution whose replica stopped"),
            Ok(None) => {}
            Err(e) => tracing::warn!(error = %e, "could not fail an orphaned execution"),
        }
        problem
    }

    /// At shutdown, before the server stops: hands every execution this replica owns over
    /// (see [`Self::hand_over_one`]). New opens and adoptions are refused meanwhile, so a few
    /// passes see every execution; what is left is failed by [`Self::release`].
    pub(crate) async fn hand_over(&self, pipeline: &Pipeline) {
        for _ in 0..3 {
            let owned = match self.store.owned_executions(&self.lease.owner).await {
                Ok(owned) if owned.is_empty() => return,
                Ok(owned) => owned,
                Err(e) => {
                    tracing::warn!(error = %e, "shutdown: could not list this replica's executions");
                    return;
                }
            };
            for execution in owned {
                if let Err(problem) = self.hand_over_one(pipeline, &execution).await {
                    tracing::warn!(run_id = %execution.run_id, execution_id = %execution.execution_id,
                        code = %problem.code, detail = %problem.detail, "shutdown: could not hand the execution over");
                }
            }
        }
    }

    /// Under the execution's gate (no batch half-accepted, no transition running): drains its
    /// lanes (every accepted row appended and acknowledged), records each stream's offset and
    /// columns, and releases the execution for adoption.
    async fn hand_over_one(&self, pipeline: &Pipeline, execution: &ExecutionRecord) -> Result<(), Problem> {
        let key = execution.key();
        let lanes = pipeline.open_delivery(&key, execution.delivery);
        let transitioning = lanes.begin_transition().await;
        let Some(current) = self.store.get_execution(&key).await? else { return Ok(()) };
        let mine = current.owner.as_deref() == Some(self.lease.owner.as_str());
        if !mine || current.delivery != transitioning.delivery() {
            return Ok(());
        }
        let reports = pipeline.drain(&key, current.delivery).await?;
        let delivery = current.delivery_ref();
        for report in &reports {
            let resource = delivery.resource(report.resource.clone());
            self.store
                .record_handed_over_stream(&resource, report.rows_acknowledged, &report.destination_columns)
                .await?;
        }
        let released = self.store.hand_over_execution(&delivery, &self.lease).await?;
        pipeline.forget(&key, current.delivery);
        drop(transitioning);
        tracing::info!(run_id = %current.run_id, execution_id = %current.execution_id, streams = reports.len(),
            released, "replica.handed_over");
        Ok(())
    }

    /// Who may take batches for the execution or change its extraction state (checkpoint,
    /// pause, commit, abort before the commit), decided from the record alone (no I/O): this
    /// replica, when it owns the open execution or the execution is past extraction (a
    /// committing or ended execution is any replica's to read and to report on).
    pub(crate) fn ownership(&self, execution: ExecutionRecord) -> Ownership {
        let extracting = ExecutionState::BEFORE_COMMIT.contains(&execution.state);
        if !extracting || execution.owner.as_deref() == Some(self.lease.owner.as_str()) {
            return Ownership::Mine(Owned(execution));
        }
        if execution.owner.is_none() && execution.handed_over {
            return Ownership::HandedOver(execution);
        }
        let live = execution.lease_expires_at.is_some_and(|expires| expires > chrono::Utc::now());
        if !live {
            return Ownership::Orphaned(execution);
        }
        let owner = execution.owner.as_deref().unwrap_or("another replica");
        Ownership::Elsewhere(
            Problem::new(
                ErrorCode::ExecutionOwnedElsewhere,
                format!(
                    "execution {} is served by gateway replica {owner}, whose memory holds its uploads",
                    execution.execution_id
                ),
            )
            .with_hint("retry after Retry-After; route requests by run id (load-balancer affinity) so an execution's requests reach one replica")
            .with_retry_after(1),
        )
    }

    /// The proof that this replica may act on the execution ([`Self::ownership`]), adopting it
    /// when it was handed over (a write) and failing it when its owner's lease expired (a
    /// write; then `gateway_restarted`). Otherwise 503 `execution_owned_elsewhere`.
    pub(crate) async fn claim(&self, execution: ExecutionRecord) -> Result<Owned<ExecutionRecord>, Problem> {
        match self.ownership(execution) {
            Ownership::Mine(owned) => Ok(owned),
            Ownership::HandedOver(execution) => self.adopt(execution).await,
            Ownership::Orphaned(execution) => Err(self.fail_orphan(&execution).await),
            Ownership::Elsewhere(problem) => Err(problem),
        }
    }
}

/// Whose the execution is, as [`Replica::ownership`] reads its record.
#[derive(Debug)]
pub(crate) enum Ownership {
    Mine(Owned<ExecutionRecord>),
    /// Released by a replica that shut down: [`Replica::adopt`] it.
    HandedOver(ExecutionRecord),
    /// Its owner stopped renewing the lease: [`Replica::fail_orphan`].
    Orphaned(ExecutionRecord),
    /// Another live replica serves it.
    Elsewhere(Problem),
}

/// Proof that this replica may take batches for an execution and change its extraction state:
/// made only by [`Replica::claim`] and [`Replica::adopt`], so a handler that needs one cannot
/// forget the check.
#[derive(Debug, Clone)]
pub(crate) struct Owned<T>(T);

impl<T> std::ops::Deref for Owned<T> {
    type Target = T;

    fn deref(&self) -> &T {
        &self.0
    }
}
