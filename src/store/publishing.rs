//! The commit's barrier as a type: [`Store::begin_publishing`] marks a committing delivery as
//! publishing and hands back a [`Publishing`], the proof every publication function asks for.
//! Its field is private to this module and nothing else makes one, so no code path can publish
//! a delivery the store did not move to publishing (an abort or a lane's failure recorded
//! first leaves it unmoved, and then there is no proof to publish with).

use super::{BindKey as _, DELIVERY_KEY, Store, StoreResult};
use crate::model::{DeliveryRef, ExecutionState};

/// Proof that the store moved this delivery from committing to publishing: the point of no
/// return, after which an abort is refused. Made only by [`Store::begin_publishing`].
#[derive(Debug)]
pub(crate) struct Publishing {
    delivery: DeliveryRef,
}

impl Publishing {
    /// The delivery the store moved to publishing.
    pub(crate) fn delivery(&self) -> &DeliveryRef {
        &self.delivery
    }
}

impl Store {
    /// Marks the committing delivery as publishing, before its first destination job is
    /// submitted, and returns the proof publication requires; `None` when it is no longer
    /// committing (aborted or failed meanwhile), in which case nothing may be published.
    pub(crate) async fn begin_publishing(&self, delivery: &DeliveryRef) -> StoreResult<Option<Publishing>> {
        let marked = sqlx::query(&format!(
            "UPDATE executions SET publishing_at = COALESCE(publishing_at, now()), updated_at = now()
             WHERE {DELIVERY_KEY} AND state = $4"
        ))
        .bind_delivery(delivery)
        .bind(ExecutionState::Committing)
        .execute(&self.pool)
        .await?;
        Ok((marked.rows_affected() == 1).then(|| Publishing { delivery: delivery.clone() }))
    }
}
