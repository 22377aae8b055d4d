//! The destination tables the lanes of one execution have read, so that resources loading into
//! one table read its metadata once per execution instead of once each (`tables.get` counts
//! against BigQuery's per-method request rate, shared by the fleet). Set-up
//! (`set_up::set_up_destination`) asks here before it reads, creates or alters a destination.
//!
//! One [`DestinationTable`] per delivery of an execution and table (a redelivery sets its
//! lanes up again, so it reads again), alive while a lane of that execution holds
//! it (a lane holds it from its set-up until it drains at commit, so every lane of an execution
//! sees the same one). Its lock serializes the set-ups of one table: they read, create and add
//! columns to the same table, and one after another they see each other's changes. What it
//! remembers is the table as BigQuery last answered it; a set-up that creates or alters the
//! table forgets it (the next one reads the table again), so what is remembered is never older
//! than the last change this execution made.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::{Arc, Weak};

use google_cloud_bigquery_v2::model::Table;
use tokio::sync::{Mutex as AsyncMutex, MutexGuard};

use crate::model::ResourceRef;
use crate::model::ids::DeliveryRef;

/// Which table of which delivery: the delivery, then project, dataset and table.
type TableOfDelivery = (DeliveryRef, String, String, String);

/// The table one execution's lanes load into, as last read.
#[derive(Debug, Default)]
pub(crate) struct DestinationTable {
    last_read: AsyncMutex<Option<Table>>,
}

impl DestinationTable {
    /// Waits for the other set-ups of this table, then holds it: what the guard holds is the
    /// table as last read (`None`: not read yet, or changed since).
    pub(crate) async fn lock(&self) -> MutexGuard<'_, Option<Table>> {
        self.last_read.lock().await
    }
}

/// Every execution's destination tables held by a lane, in this process.
#[derive(Debug, Default)]
pub(crate) struct DestinationTables {
    registry: Mutex<Registry>,
}

#[derive(Debug, Default)]
struct Registry {
    tables: HashMap<TableOfDelivery, Weak<DestinationTable>>,
    /// Entries at which the next insertion first sweeps out the tables no lane holds: twice
    /// what the last sweep left, so sweeping costs a constant per lane.
    sweep_at_entries: usize,
}

/// Entries below which the registry does not sweep.
const SWEEP_FROM_ENTRIES: usize = 64;

impl DestinationTables {
    /// The table `table` of `resource`'s delivery: the one another lane of the delivery
    /// holds, or a new one. The caller holds it as long as its lane lives.
    pub(crate) fn of(
        &self,
        resource: &ResourceRef,
        project: &str,
        dataset: &str,
        table: &str,
    ) -> Arc<DestinationTable> {
        let key = (resource.delivery.clone(), project.to_string(), dataset.to_string(), table.to_string());
        let mut registry = self.registry.lock();
        if let Some(held) = registry.tables.get(&key).and_then(Weak::upgrade) {
            return held;
        }
        if registry.tables.len() >= registry.sweep_at_entries.max(SWEEP_FROM_ENTRIES) {
            registry.tables.retain(|_, table| table.strong_count() > 0);
            registry.sweep_at_entries = 2 * registry.tables.len();
        }
        let fresh = Arc::new(DestinationTable::default());
        registry.tables.insert(key, Arc::downgrade(&fresh));
        fresh
    }

    /// Tables some lane still holds (tests).
    #[cfg(test)]
    fn held(&self) -> usize {
        self.registry.lock().tables.values().filter(|table| table.strong_count() > 0).count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ids::{ExecutionId, ExecutionKey, RunId};

    fn resource(execution: &str, name: &str) -> ResourceRef {
        let execution =
            ExecutionKey { run_id: RunId::parse("r").unwrap(), execution_id: ExecutionId::parse(execution).unwrap() };
        DeliveryRef { execution, delivery: 1 }.resource(name.parse().unwrap())
    }

    #[tokio::test]
    async fn lanes_of_one_delivery_share_a_table_and_other_executions_do_not() {
        let tables = DestinationTables::default();
        let first = tables.of(&resource("e1", "a"), "p", "d", "t");
        let same_table = tables.of(&resource("e1", "b"), "p", "d", "t");
        let other_execution = tables.of(&resource("e2", "a"), "p", "d", "t");
        let other_table = tables.of(&resource("e1", "a"), "p", "d", "u");
        assert!(Arc::ptr_eq(&first, &same_table));
        assert!(!Arc::ptr_eq(&first, &other_execution));
        assert!(!Arc::ptr_eq(&first, &other_table));
        *first.lock().await = Some(Table::new().set_id("p:d.t"));
        assert_eq!(same_table.lock().await.as_ref().map(|t| t.id.as_str()), Some("p:d.t"));
        assert!(other_execution.lock().await.is_none());
    }

    #[test]
    fn a_table_no_lane_holds_is_forgotten() {
        let tables = DestinationTables::default();
        let held = tables.of(&resource("e1", "a"), "p", "d", "t");
        drop(tables.of(&resource("e1", "a"), "p", "d", "dropped"));
        assert_eq!(tables.held(), 1);
        let again = tables.of(&resource("e1", "a"), "p", "d", "dropped");
        assert!(again.last_read.try_lock().is_ok_and(|last_read| last_read.is_none()), "a new one, nothing read");
        for i in 0..200 {
            drop(tables.of(&resource("e1", "a"), "p", "d", &format!("t{i}")));
        }
        let entries = tables.registry.lock().tables.len();
        assert!(entries < 200, "swept: {entries} entries");
        assert!(Arc::ptr_eq(&held, &tables.of(&resource("e1", "b"), "p", "d", "t")));
    }
}
