//! The priced plan of a commit (issue 58): what each planned publication will run, the bytes
//! BigQuery's dry run says its statement processes, and what that costs at the configured
//! on-demand price. Pure: the publisher dry-runs ([`crate::publish`]), the store keeps the plan
//! per delivery, the API shows it, and [`over_budget`] judges it against the run's byte budgets
//! before anything is published; docs/cost.md describes it.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// Google's list price for on-demand query processing, US dollars per TiB (2^40 bytes):
/// <https://cloud.google.com/bigquery/pricing#on_demand_pricing> (December 2026).
pub(crate) const LIST_ON_DEMAND_PRICE_PER_TIB_USD: f64 = 6.25;

/// Bytes in a tebibyte, the unit on-demand prices are quoted in.
const BYTES_PER_TIB: f64 = 1_099_511_627_776.0;

/// How a planned publication reaches its destination.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema, sqlx::Type)]
#[serde(rename_all = "snake_case")]
#[sqlx(type_name = "text", rename_all = "snake_case")]
pub(crate) enum PlannedPath {
    /// A query job reads the staging table (or, with no rows staged, only the destination).
    StagingQuery,
    /// The stream written into the destination is committed: no statement, no job.
    DirectAppend,
}

impl PlannedPath {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            PlannedPath::StagingQuery => "staging_query",
            PlannedPath::DirectAppend => "direct_append",
        }
    }
}

/// The kind of statement a planned publication runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema, sqlx::Type)]
#[serde(rename_all = "snake_case")]
#[sqlx(type_name = "text", rename_all = "snake_case")]
pub(crate) enum PlannedStatement {
    /// No statement: a direct append, a publication with nothing to do, or one a redelivery
    /// reuses.
    None,
    /// `INSERT ... SELECT` (the append modes).
    Insert,
    /// `TRUNCATE` and `INSERT` in one transaction (`full_replace`'s first segment).
    TruncateInsert,
    /// `TRUNCATE` alone (an empty replacement).
    Truncate,
    /// `MERGE` (the keyed modes, and a snapshot's completion).
    Merge,
    /// The `history` mode's versioning statements.
    History,
    /// The deletion that completes a snapshot without rows of its own.
    Delete,
}

impl PlannedStatement {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            PlannedStatement::None => "none",
            PlannedStatement::Insert => "insert",
            PlannedStatement::TruncateInsert => "truncate_insert",
            PlannedStatement::Truncate => "truncate",
            PlannedStatement::Merge => "merge",
            PlannedStatement::History => "history",
            PlannedStatement::Delete => "delete",
        }
    }
}

/// One planned publication, priced.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema, sqlx::FromRow)]
pub(crate) struct PricedPublication {
    pub(crate) resource: String,
    /// The destination table in the run's dataset.
    pub(crate) table: String,
    pub(crate) path: PlannedPath,
    pub(crate) statement: PlannedStatement,
    /// Bytes the dry run says the statement processes (0 without a statement); null when it
    /// could not be dry-run (`unpriced` says why).
    pub(crate) bytes_processed: Option<i64>,
    /// Query jobs the publication inserts (0 or 1): what it spends of the project's job
    /// quotas and concurrent-query limit. A direct append makes one `BatchCommitWriteStreams`
    /// call instead.
    pub(crate) query_jobs: i32,
    /// Why the statement has no figure (BigQuery refused to dry-run it, for instance because
    /// a column it names is added or widened only at publication).
    pub(crate) unpriced: Option<String>,
}

/// What `bytes` cost at `price_per_tib_usd`, in US dollars, to the micro-dollar (on-demand
/// pricing bills bytes processed; BigQuery rounds each job up to 10 MB per table read, which
/// this estimate leaves out).
pub(crate) fn estimated_cost_usd(bytes: i64, price_per_tib_usd: f64) -> f64 {
    let dollars = bytes as f64 / BYTES_PER_TIB * price_per_tib_usd;
    (dollars * 1_000_000.0).round() / 1_000_000.0
}

/// The plan's totals: bytes of the priced publications, and query jobs.
pub(crate) fn totals(plan: &[PricedPublication]) -> (i64, i32) {
    // Saturating: a total past i64 is over any budget, never wrapped under one.
    let bytes = plan.iter().filter_map(|p| p.bytes_processed).fold(0i64, i64::saturating_add);
    let jobs = plan.iter().map(|p| p.query_jobs).sum();
    (bytes, jobs)
}

/// The run's byte budgets a plan is judged against.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct ByteBudgets {
    /// The run's `maximum_bytes_billed`: each publication's statement.
    pub(crate) per_publication: Option<i64>,
    /// The run's `maximum_bytes_billed_per_execution`: the plan's total.
    pub(crate) per_execution: Option<i64>,
}

/// Why the plan is over the run's budgets (the detail of `publication_too_expensive`, naming
/// each table over and its bytes), or `None` when it is within them. A publication that could
/// not be priced is within the per-publication budget (its job carries `maximumBytesBilled`,
/// which BigQuery enforces) but over a per-execution budget (nothing else would bound it),
/// unless it runs no job (a redelivery that refuses it: its publication fails on its own).
pub(crate) fn over_budget(plan: &[PricedPublication], budgets: ByteBudgets) -> Option<String> {
    let mut reasons = Vec::new();
    if let Some(limit) = budgets.per_publication {
        let over: Vec<String> = plan
            .iter()
            .filter_map(|p| {
                p.bytes_processed.filter(|bytes| *bytes > limit).map(|bytes| format!("{} ({bytes} bytes)", p.table))
            })
            .collect();
        if !over.is_empty() {
            reasons.push(format!("over the run's maximum_bytes_billed of {limit}: {}", over.join(", ")));
        }
    }
    if let Some(limit) = budgets.per_execution {
        let (total, _) = totals(plan);
        let unpriced: Vec<&str> =
            plan.iter().filter(|p| p.bytes_processed.is_none() && p.query_jobs > 0).map(|p| p.table.as_str()).collect();
        if total > limit {
            let tables: Vec<String> = plan
                .iter()
                .filter_map(|p| {
                    p.bytes_processed.filter(|bytes| *bytes > 0).map(|bytes| format!("{} ({bytes} bytes)", p.table))
                })
                .collect();
            reasons.push(format!(
                "{total} bytes in all, over the run's maximum_bytes_billed_per_execution of {limit}: {}",
                tables.join(", ")
            ));
        }
        if !unpriced.is_empty() {
            reasons.push(format!(
                "not priced, so not within the run's maximum_bytes_billed_per_execution: {}",
                unpriced.join(", ")
            ));
        }
    }
    (!reasons.is_empty()).then(|| format!("the publication would process {}", reasons.join("; ")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tib_costs_the_price_and_smaller_figures_round_to_the_micro_dollar() {
        assert_eq!(estimated_cost_usd(1 << 40, LIST_ON_DEMAND_PRICE_PER_TIB_USD), 6.25);
        assert_eq!(estimated_cost_usd(0, 6.25), 0.0);
        // 100 GiB at $6.25 per TiB: $0.6103515625.
        assert_eq!(estimated_cost_usd(100 << 30, 6.25), 0.610352);
        // 10 MiB: $0.0000596...
        assert_eq!(estimated_cost_usd(10 << 20, 6.25), 0.00006);
        assert_eq!(estimated_cost_usd(1 << 40, 5.0), 5.0);
    }

    fn priced(table: &str, bytes: Option<i64>, jobs: i32) -> PricedPublication {
        PricedPublication {
            resource: table.into(),
            table: table.into(),
            path: PlannedPath::StagingQuery,
            statement: PlannedStatement::Insert,
            bytes_processed: bytes,
            query_jobs: jobs,
            unpriced: bytes.is_none().then(|| "invalidQuery".into()),
        }
    }

    #[test]
    fn totals_count_priced_bytes_and_jobs() {
        assert_eq!(totals(&[priced("a", Some(10), 1), priced("b", None, 1), priced("c", Some(5), 0)]), (15, 2));
    }

    #[test]
    fn a_plan_over_either_budget_names_the_tables_and_their_bytes() {
        let plan = [priced("orders", Some(300), 1), priced("users", Some(100), 1), priced("events", Some(0), 0)];
        assert_eq!(over_budget(&plan, ByteBudgets::default()), None);
        let per_job = ByteBudgets { per_publication: Some(200), per_execution: None };
        assert_eq!(
            over_budget(&plan, per_job).as_deref(),
            Some("the publication would process over the run's maximum_bytes_billed of 200: orders (300 bytes)")
        );
        let per_execution = ByteBudgets { per_publication: Some(300), per_execution: Some(399) };
        assert_eq!(
            over_budget(&plan, per_execution).as_deref(),
            Some(
                "the publication would process 400 bytes in all, over the run's maximum_bytes_billed_per_execution \
                 of 399: orders (300 bytes), users (100 bytes)"
            )
        );
        let within = ByteBudgets { per_publication: Some(300), per_execution: Some(400) };
        assert_eq!(over_budget(&plan, within), None, "a budget is the most allowed, inclusive");
    }

    #[test]
    fn an_unpriced_publication_is_over_a_per_execution_budget_only() {
        let plan = [priced("orders", Some(10), 1), priced("widened", None, 1), priced("refused", None, 0)];
        assert_eq!(
            over_budget(&plan, ByteBudgets { per_publication: Some(1), per_execution: None }).map(|_| ()),
            Some(())
        );
        assert_eq!(over_budget(&plan, ByteBudgets { per_publication: Some(10), per_execution: None }), None);
        let detail = over_budget(&plan, ByteBudgets { per_publication: None, per_execution: Some(1000) });
        assert!(detail.is_some_and(|d| {
            d.ends_with("not priced, so not within the run's maximum_bytes_billed_per_execution: widened")
        }));
    }
}
