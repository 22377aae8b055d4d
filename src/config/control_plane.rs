//! The "control plane and quotas" settings: set-up and publication concurrency, how every
//! BigQuery call is retried, publication jobs, BigQuery's rate quotas and per-principal caps.

use clap::Args;

use super::{FairnessArgs, QuotaArgs};

/// BigQuery's control plane: set-up, publication, retries, quotas, fair sharing.
#[derive(Debug, Clone, Args)]
pub struct ControlPlaneArgs {
    /// The most resources setting up at once (creating their dataset, tables and write stream),
    /// per destination project and location (the product's eight by default;
    /// docs/operations.md has a "many tables" profile that raises it). Within it the gateway
    /// finds the concurrency BigQuery allows (adaptive, shrinking on pushback, never above
    /// this). Formerly `FILAMENT_MAX_CONCURRENT_PREPARES`.
    #[arg(long, env = "FILAMENT_MAX_CONCURRENT_SET_UPS", alias = "max-concurrent-prepares", default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=256))]
    pub max_concurrent_set_ups: u32,

    /// The most destination tables publishing at once (one query job per resource), and
    /// streams finalized and committed at once, per commit; publication jobs per job project
    /// and location (the product's eight by default; docs/operations.md has a "many tables"
    /// profile that raises it). Within it the gateway finds the concurrency BigQuery allows
    /// (adaptive, shrinking on pushback or queueing, never above this). A commit of K tables
    /// publishes in about K / the reached concurrency job durations.
    #[arg(long, env = "FILAMENT_MAX_CONCURRENT_PUBLICATIONS", default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=256))]
    pub max_concurrent_publications: u32,

    /// Attempts of every BigQuery call without progress (first included) before it fails:
    /// AppendRows requests, set-up (dataset, tables, write stream) and every REST call.
    /// Publication jobs keep their own attempts. Formerly `FILAMENT_APPEND_MAX_ATTEMPTS`.
    #[arg(long, env = "FILAMENT_BIGQUERY_MAX_ATTEMPTS", alias = "append-max-attempts", default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub bigquery_max_attempts: u32,

    /// First retry delay of every failed BigQuery call (see `FILAMENT_BIGQUERY_MAX_ATTEMPTS`),
    /// and of waiting out a quota, in milliseconds (doubles per attempt, with jitter).
    /// Formerly `FILAMENT_APPEND_INITIAL_BACKOFF_MS`.
    #[arg(
        long,
        env = "FILAMENT_BIGQUERY_INITIAL_BACKOFF_MS",
        alias = "append-initial-backoff-ms",
        default_value_t = 200
    )]
    pub bigquery_initial_backoff_ms: u64,

    /// How long BigQuery's quota pushback (an AppendRows `RESOURCE_EXHAUSTED`: the Storage
    /// Write quota can take minutes to refill; rate limits on set-up and publication jobs) is
    /// waited out, in seconds, before the execution fails with `quota_exceeded`. Meanwhile the
    /// budget fills and batches get 429.
    #[arg(long, env = "FILAMENT_QUOTA_WAIT_SECS", default_value_t = 900)]
    pub quota_wait_secs: u64,

    /// How long a publication query job may run before the execution fails.
    #[arg(long, env = "FILAMENT_QUERY_JOB_TIMEOUT_SECS", default_value_t = 3600, value_parser = clap::value_parser!(u64).range(1..))]
    pub query_job_timeout_secs: u64,

    /// The on-demand price of query processing, in US dollars per TiB, that the plan at the
    /// commit's barrier estimates each publication's cost at (its dry-run bytes times this).
    /// Default: Google's list price, $6.25 per TiB
    /// (<https://cloud.google.com/bigquery/pricing#on_demand_pricing>); set your region's or
    /// your contract's. Estimates only: nothing is refused by price.
    #[arg(long, env = "FILAMENT_ON_DEMAND_PRICE_PER_TIB_USD", default_value_t = crate::model::publication_plan::LIST_ON_DEMAND_PRICE_PER_TIB_USD)]
    pub on_demand_price_per_tib_usd: f64,

    /// BigQuery's rate quotas the fleet paces by.
    #[command(flatten)]
    pub quotas: QuotaArgs,

    /// Per-principal caps.
    #[command(flatten)]
    pub fairness: FairnessArgs,
}
