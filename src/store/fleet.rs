//! The live replicas of a fleet (`fleet_replicas`): each renews its row with its leases, so each
//! knows how many share BigQuery's quotas (`bigquery::quota`).

use super::{Lease, Store, StoreResult};

impl Store {
    /// Renews this replica's row for a lease's duration, forgets replicas whose row lapsed, and
    /// counts the live ones (this one included).
    pub(crate) async fn renew_fleet_membership(&self, lease: &Lease) -> StoreResult<usize> {
        let mut tx = self.pool.begin().await?;
        sqlx::query(
            "INSERT INTO fleet_replicas (replica_id, expires_at) VALUES ($1, now() + $2 * interval '1 second')
             ON CONFLICT (replica_id) DO UPDATE SET expires_at = EXCLUDED.expires_at",
        )
        .bind(&lease.owner)
        .bind(lease.duration.as_secs_f64())
        .execute(&mut *tx)
        .await?;
        sqlx::query("DELETE FROM fleet_replicas WHERE expires_at < now()").execute(&mut *tx).await?;
        let (live,): (i64,) = sqlx::query_as("SELECT count(*) FROM fleet_replicas").fetch_one(&mut *tx).await?;
        tx.commit().await?;
        Ok(usize::try_from(live).unwrap_or(1).max(1))
    }

    /// This replica leaves the fleet (it shuts down): the others take its share at their next
    /// renewal.
    pub(crate) async fn leave_fleet(&self, lease: &Lease) -> StoreResult<()> {
        sqlx::query("DELETE FROM fleet_replicas WHERE replica_id = $1").bind(&lease.owner).execute(&self.pool).await?;
        Ok(())
    }
}
