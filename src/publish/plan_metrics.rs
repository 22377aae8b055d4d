//! The priced plan's metrics (issue 58). To move into `telemetry/metric_events.rs`, with the
//! names in `telemetry.rs` and their descriptions: kept here while `telemetry` is edited
//! elsewhere. No label names a tenant, a run or a table.

/// Bytes the dry runs of every planned publication reported.
pub(crate) const PLAN_BYTES_PROCESSED: &str = "filament_plan_bytes_processed_total";
/// Query jobs planned publications will insert.
pub(crate) const PLAN_QUERY_JOBS: &str = "filament_plan_query_jobs_total";
/// Commits whose plan was judged against the run's budgets, by `outcome` (`within_budget`,
/// `over_budget`).
pub(crate) const PLANS: &str = "filament_plans_total";
/// Planned publications whose statement could not be dry-run.
pub(crate) const PLAN_UNPRICED: &str = "filament_plan_unpriced_total";

/// A commit's plan was priced: its bytes, query jobs and unpriced publications.
pub(crate) fn plan_priced(bytes: i64, query_jobs: i32, unpriced: usize) {
    metrics::counter!(PLAN_BYTES_PROCESSED).increment(bytes.max(0) as u64);
    metrics::counter!(PLAN_QUERY_JOBS).increment(query_jobs.max(0) as u64);
    metrics::counter!(PLAN_UNPRICED).increment(unpriced as u64);
}

/// A priced plan was judged against the run's budgets: `within_budget` or `over_budget`.
pub(crate) fn plan_judged(outcome: &'static str) {
    metrics::counter!(PLANS, "outcome" => outcome).increment(1);
}
