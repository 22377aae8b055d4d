//! The priced plan of each execution (`publication_plans`): recorded at the commit's barrier,
//! before any publication, one row per planned publication; a redelivery's plan replaces the
//! earlier delivery's in one transaction.

use chrono::{DateTime, Utc};

use super::{BindKey as _, DELIVERY_KEY, EXECUTION_KEY, Store, StoreResult};
use crate::model::publication_plan::PricedPublication;
use crate::model::{DeliveryRef, ExecutionKey};

/// One planned publication as stored, with the delivery that planned it and the price in force.
#[derive(Debug, Clone, sqlx::FromRow)]
pub(crate) struct PlanRow {
    #[sqlx(flatten)]
    pub(crate) priced: PricedPublication,
    pub(crate) delivery: i32,
    pub(crate) price_per_tib_usd: f64,
    pub(crate) planned_at: DateTime<Utc>,
}

impl Store {
    /// Records the delivery's plan at `price_per_tib_usd`, replacing any earlier delivery's;
    /// nothing when the delivery is no longer the execution's, or already past its barrier.
    pub(crate) async fn record_plan(
        &self,
        delivery: &DeliveryRef,
        price_per_tib_usd: f64,
        plan: &[PricedPublication],
    ) -> StoreResult<()> {
        let column = |f: fn(&PricedPublication) -> String| plan.iter().map(f).collect::<Vec<_>>();
        let resources = column(|p| p.resource.clone());
        let tables = column(|p| p.table.clone());
        let paths: Vec<&str> = plan.iter().map(|p| p.path.as_str()).collect();
        let statements: Vec<&str> = plan.iter().map(|p| p.statement.as_str()).collect();
        let bytes: Vec<Option<i64>> = plan.iter().map(|p| p.bytes_processed).collect();
        let jobs: Vec<i32> = plan.iter().map(|p| p.query_jobs).collect();
        let unpriced: Vec<Option<String>> = plan.iter().map(|p| p.unpriced.clone()).collect();
        let mut tx = self.pool.begin().await?;
        // Only while this delivery is the execution's, before its barrier: a replica that lost
        // the execution meanwhile must not replace the current delivery's plan.
        let current: Option<i32> = sqlx::query_scalar(&format!(
            "SELECT delivery FROM executions WHERE {DELIVERY_KEY} AND publishing_at IS NULL FOR UPDATE"
        ))
        .bind_delivery(delivery)
        .fetch_optional(&mut *tx)
        .await?;
        if current.is_none() {
            return Ok(());
        }
        sqlx::query(&format!("DELETE FROM publication_plans WHERE {EXECUTION_KEY}"))
            .bind_execution(&delivery.execution)
            .execute(&mut *tx)
            .await?;
        sqlx::query(
            "INSERT INTO publication_plans (run_id, execution_id, delivery, price_per_tib_usd, resource, \"table\",
                                            path, statement, bytes_processed, query_jobs, unpriced)
             SELECT $1, $2, $3, $4, * FROM UNNEST($5::text[], $6::text[], $7::text[], $8::text[], $9::bigint[],
                                                  $10::int[], $11::text[])",
        )
        .bind_delivery(delivery)
        .bind(price_per_tib_usd)
        .bind(resources)
        .bind(tables)
        .bind(paths)
        .bind(statements)
        .bind(bytes)
        .bind(jobs)
        .bind(unpriced)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(())
    }

    /// The plan of the execution's current delivery, by resource (empty before its commit
    /// reached the barrier).
    pub(crate) async fn list_plan(&self, execution: &ExecutionKey) -> StoreResult<Vec<PlanRow>> {
        Ok(sqlx::query_as(&format!(
            "SELECT resource, \"table\", path, statement, bytes_processed, query_jobs, unpriced, delivery,
                    price_per_tib_usd, planned_at
             FROM publication_plans p WHERE {EXECUTION_KEY}
               AND delivery = (SELECT e.delivery FROM executions e WHERE e.run_id = p.run_id
                                                                   AND e.execution_id = p.execution_id)
             ORDER BY resource"
        ))
        .bind_execution(execution)
        .fetch_all(&self.pool)
        .await?)
    }
}
