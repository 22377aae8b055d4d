//! Judged by Google's artifacts: the GoogleSQL analyzer, the discovery document, live BigQuery (opt-in).

mod atomic_scripts;
mod case_builder;
mod generated;
mod googlesql;
mod live_bigquery;
mod representative;
mod rest_conformance;

use filament_bigquery::model::WriteMode;

/// Whether a mode merges on a primary key (and so needs one), as the tests know it: written
/// here, not asked of the gateway.
fn keyed(write_mode: WriteMode) -> bool {
    matches!(
        write_mode,
        WriteMode::FullUpsert
            | WriteMode::IncrementalUpsert
            | WriteMode::IncrementalDelete
            | WriteMode::CdcMerge
            | WriteMode::History
    )
}
