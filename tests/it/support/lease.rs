//! Execution leases as the store keeps them: for tests that must let the leases replicas hold
//! run out, by the clock the sweeps judge them by (Postgres' `now()`).

use std::time::Duration;

use sqlx::postgres::PgPoolOptions;

use super::eventually;

/// Waits until every execution lease recorded now has expired, and a sweep interval more: a
/// replica renews its leases and sweeps every third of the lease (`src/replica.rs`), so by then
/// every running replica has swept at least once with those leases expired, and an execution
/// still extracting was kept alive by renewals alone. Never waits more than the lease and its
/// third (plus a little for the sweep itself).
pub async fn outlive_current_leases(database_url: &str, lease: Duration) {
    let sweep_interval = lease / 3 + Duration::from_millis(250);
    let db = PgPoolOptions::new().max_connections(1).connect(database_url).await.expect("connect");
    let latest: Option<f64> =
        sqlx::query_scalar("SELECT EXTRACT(EPOCH FROM MAX(lease_expires_at))::float8 FROM executions")
            .fetch_one(&db)
            .await
            .unwrap();
    let until = latest.expect("an execution holds a lease") + sweep_interval.as_secs_f64();
    let what = format!("the leases held now to expire and a sweep interval ({sweep_interval:?}) to pass");
    eventually(lease * 2 + sweep_interval, &what, || async {
        let now: f64 = sqlx::query_scalar("SELECT EXTRACT(EPOCH FROM now())::float8").fetch_one(&db).await.unwrap();
        (now > until).then_some(())
    })
    .await;
}
