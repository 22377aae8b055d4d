//! This process as one replica of a gateway fleet sharing one Postgres. An open execution's
//! uploads live in the memory of the replica that opened its current delivery (its **owner**),
//! so that replica holds a lease on it in Postgres, renewed while it lives. Other replicas
//! refuse the execution's batches and transitions (503 `execution_owned_elsewhere`, never a
//! silent loss), and any replica fails an execution whose lease expired (its owner crashed)
//! with `gateway_restarted`. A replica that starts never fails work of live replicas; one that
//! shuts down fails what it still owns once its commits finished.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::error::{ErrorCode, Problem};
use crate::model::ExecutionState;
use crate::store::{ExecutionRecord, Lease, Store};

/// How often old batch receipts are pruned.
const PRUNE_INTERVAL: Duration = Duration::from_secs(3600);

/// This replica and its lease on the executions it serves.
#[derive(Debug, Clone)]
pub(crate) struct Replica {
    pub(crate) lease: Lease,
    store: Store,
}

fn gateway_restarted(detail: &str) -> Problem {
    Problem::new(ErrorCode::GatewayRestarted, detail)
        .with_hint("deliver the execution again (POST it with the same execution_id)")
}

impl Replica {
    /// A new replica id: the host name (a Kubernetes pod's name) and a random suffix.
    pub(crate) fn new(store: Store, lease_duration: Duration) -> Self {
        let host = std::env::var("HOSTNAME").ok().filter(|h| !h.is_empty()).unwrap_or_else(|| "gateway".into());
        let owner = format!("{host}-{}", hex::encode(rand::random::<[u8; 4]>()));
        Self { lease: Lease { owner, duration: lease_duration }, store }
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
    /// until `stop`.
    pub(crate) fn spawn_heartbeat(&self, retention_days: u32, stop: CancellationToken) -> tokio::task::JoinHandle<()> {
        let replica = self.clone();
        tokio::spawn(async move {
            let mut ticks = tokio::time::interval(replica.lease.duration / 3);
            let mut prunes = tokio::time::interval(PRUNE_INTERVAL);
            loop {
                tokio::select! {
                    () = stop.cancelled() => return,
                    _ = ticks.tick() => {
                        if let Err(e) = replica.store.renew_leases(&replica.lease).await {
                            tracing::warn!(error = %e, "could not renew execution leases");
                        }
                        replica.sweep().await;
                    }
                    _ = prunes.tick() => replica.prune(retention_days).await,
                }
            }
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

    /// At shutdown, after the commits finished: what this replica still owns cannot go on.
    pub(crate) async fn release(&self) {
        let problem = gateway_restarted("the gateway replica serving this execution shut down; its uploads were lost");
        match self.store.fail_orphaned_executions(Some(&self.lease.owner), &problem).await {
            Ok(0) => {}
            Ok(failed) => tracing::warn!(executions = failed, "shutdown: failed the executions this replica served"),
            Err(e) => tracing::warn!(error = %e, "shutdown: could not fail this replica's executions"),
        }
    }

    /// Whether this replica may take batches for the execution or change its extraction state
    /// (checkpoint, pause, commit, abort before the commit): it owns it. Otherwise 503
    /// `execution_owned_elsewhere` (retry; a router with run affinity avoids it), or, when the
    /// owner's lease expired, the execution is failed and `gateway_restarted` answered. A
    /// committing or ended execution is any replica's to read and to report on.
    pub(crate) async fn check_owner(&self, execution: &ExecutionRecord) -> Result<(), Problem> {
        let extracting = ExecutionState::BEFORE_COMMIT.contains(&execution.state);
        if !extracting || execution.owner.as_deref() == Some(self.lease.owner.as_str()) {
            return Ok(());
        }
        let live = execution.lease_expires_at.is_some_and(|expires| expires > chrono::Utc::now());
        if !live {
            self.sweep().await;
            return Err(gateway_restarted(
                "the gateway replica serving this execution stopped (its lease expired); its uploads were lost",
            ));
        }
        let owner = execution.owner.as_deref().unwrap_or("another replica");
        Err(Problem::new(
            ErrorCode::ExecutionOwnedElsewhere,
            format!(
                "execution {} is served by gateway replica {owner}, whose memory holds its uploads",
                execution.execution_id
            ),
        )
        .with_hint("retry after Retry-After; route requests by run id (load-balancer affinity) so an execution's requests reach one replica")
        .with_retry_after(1))
    }
}
