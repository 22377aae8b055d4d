//! Which publications a commit runs, and in what order: pure, from the run's resources in
//! declaration order and the drained lanes' reports. Resources that share a destination table
//! publish one after another in the order they were declared (concurrent DML on one table
//! races, and BigQuery refuses it with "Could not serialize access"); different tables publish
//! concurrently. A `full_replace` resource that received no rows still publishes (an empty
//! replacement truncates its table) when the execution is the run's first segment; a
//! `delete_missing` resource that received no rows still publishes (it deletes the keys the run
//! did not send) when the execution completes the run's snapshot.

use crate::error::Problem;
use crate::model::{ResourceName, WriteMode};
use crate::pipeline::LaneReport;
use crate::store::{CommitInputs, PublicationRecord, ResourceRecord, StagedInputs};

/// One resource's publication.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PlannedPublication<'a> {
    pub(crate) resource: &'a ResourceRecord,
    /// What its lane staged; `None` for an empty replacement (no lane ever started).
    pub(crate) staged: Option<&'a LaneReport>,
    /// What the lane's receipts and schema say it staged (read once per commit), which the
    /// fingerprint covers; `None` when nothing was staged.
    pub(crate) staged_inputs: Option<&'a StagedInputs>,
    /// The publication record an earlier delivery of the execution left for the resource.
    pub(crate) earlier: Option<&'a PublicationRecord>,
    /// No committed execution of the run published this resource yet: its first segment
    /// (`full_replace` replaces).
    pub(crate) first_segment: bool,
    /// The execution completes the run's snapshot (it was never paused): a `delete_missing`
    /// resource deletes the keys the run did not send.
    pub(crate) completes_snapshot: bool,
}

/// The publications into one destination table, in declaration order.
#[derive(Debug, Clone)]
pub(crate) struct DestinationPlan<'a> {
    pub(crate) table: &'a str,
    pub(crate) publications: Vec<PlannedPublication<'a>>,
}

/// Groups the publications by destination table. `declared` is in declaration order;
/// `continuing` lists the resources a committed execution of the run already published (the
/// others are in their first segment; empty replacements run only there); `completes_snapshot`
/// whether the execution completes the run's snapshot; `inputs` what each staged resource's
/// receipts and schema say and the earlier deliveries' publication records
/// ([`crate::store::Store::commit_inputs`]). A report of an undeclared resource is an internal
/// error.
pub(crate) fn plan<'a>(
    declared: &'a [ResourceRecord],
    reports: &'a [LaneReport],
    inputs: &'a CommitInputs,
    continuing: &[ResourceName],
    completes_snapshot: bool,
) -> Result<Vec<DestinationPlan<'a>>, Problem> {
    if let Some(orphan) = reports.iter().find(|r| !declared.iter().any(|d| d.resource == r.resource)) {
        return Err(Problem::internal(format!("resource {} is no longer declared", orphan.resource)));
    }
    let mut destinations: Vec<DestinationPlan<'a>> = Vec::new();
    for resource in declared {
        let staged = reports.iter().find(|r| r.resource == resource.resource);
        let first_segment = !continuing.contains(&resource.resource);
        let empty_replacement = resource.write_mode == WriteMode::FullReplace && first_segment;
        let empty_snapshot_end = resource.write_options.delete_missing && completes_snapshot;
        if staged.is_none() && !empty_replacement && !empty_snapshot_end {
            continue;
        }
        let staged_inputs = staged.and_then(|_| inputs.staged.get(&resource.resource));
        let earlier = inputs.earlier_publications.get(&resource.resource);
        let publication =
            PlannedPublication { resource, staged, staged_inputs, earlier, first_segment, completes_snapshot };
        match destinations.iter_mut().find(|d| d.table == resource.table_name) {
            Some(destination) => destination.publications.push(publication),
            None => destinations.push(DestinationPlan { table: &resource.table_name, publications: vec![publication] }),
        }
    }
    Ok(destinations)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Nothing staged and no earlier publication (the plan only reads the reports here).
    fn no_inputs() -> &'static CommitInputs {
        Box::leak(Box::default())
    }
    use crate::model::staging::WritePath;

    fn resource(name: &str, table: &str, write_mode: WriteMode) -> ResourceRecord {
        ResourceRecord {
            resource: name.parse().unwrap(),
            table_name: table.into(),
            write_mode,
            primary_key: vec!["id".into()],
            table_options: None,
            write_options: Default::default(),
            layout_mismatch: None,
        }
    }

    fn report(name: &str) -> LaneReport {
        LaneReport {
            resource: name.parse().unwrap(),
            write_path: WritePath::Staging { staging_table: format!("_filament_stg_{name}") },
            destination_columns: Vec::new(),
            stream_name: format!("stream-{name}"),
            rows_acknowledged: 1,
        }
    }

    fn names(plans: &[DestinationPlan<'_>]) -> Vec<(String, Vec<String>)> {
        plans
            .iter()
            .map(|d| (d.table.to_string(), d.publications.iter().map(|p| p.resource.resource.to_string()).collect()))
            .collect()
    }

    #[test]
    fn resources_sharing_a_table_publish_in_declaration_order() {
        // Declared: the upsert first, then the delete (whose name sorts first), then another table.
        let declared = [
            resource("z_upserts", "users", WriteMode::IncrementalUpsert),
            resource("a_deletes", "users", WriteMode::IncrementalDelete),
            resource("orders", "orders", WriteMode::FullAppend),
        ];
        let reports = [report("a_deletes"), report("orders"), report("z_upserts")];
        let plans = plan(&declared, &reports, no_inputs(), &[], true).unwrap();
        assert_eq!(
            names(&plans),
            [
                ("users".to_string(), vec!["z_upserts".to_string(), "a_deletes".to_string()]),
                ("orders".to_string(), vec!["orders".to_string()]),
            ]
        );
    }

    #[test]
    fn an_idle_full_replace_resource_replaces_only_in_the_first_segment() {
        let declared =
            [resource("snapshot", "snapshot", WriteMode::FullReplace), resource("log", "log", WriteMode::FullAppend)];
        let first = plan(&declared, &[], no_inputs(), &[], true).unwrap();
        assert_eq!(names(&first), [("snapshot".to_string(), vec!["snapshot".to_string()])]);
        assert!(first[0].publications[0].staged.is_none() && first[0].publications[0].first_segment);
        let later = plan(&declared, &[], no_inputs(), &["snapshot".parse().unwrap()], true).unwrap();
        assert!(later.is_empty(), "a later segment leaves the table alone");
    }

    #[test]
    fn an_idle_delete_missing_resource_publishes_only_when_the_snapshot_completes() {
        let mut snapshot = resource("snapshot", "snapshot", WriteMode::FullUpsert);
        snapshot.write_options.delete_missing = true;
        let declared = [snapshot, resource("upserts", "upserts", WriteMode::FullUpsert)];
        let completing = plan(&declared, &[], no_inputs(), &["snapshot".parse().unwrap()], true).unwrap();
        assert_eq!(names(&completing), [("snapshot".to_string(), vec!["snapshot".to_string()])]);
        assert!(completing[0].publications[0].staged.is_none() && completing[0].publications[0].completes_snapshot);
        assert!(plan(&declared, &[], no_inputs(), &[], false).unwrap().is_empty(), "a paused segment deletes nothing");
    }

    #[test]
    fn a_report_without_a_declaration_is_an_internal_error() {
        assert!(plan(&[], &[report("ghost")], no_inputs(), &[], true).is_err());
    }
}
