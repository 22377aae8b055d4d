//! The settings of fair sharing between principals (`bigquery::fair`): caps on what one
//! principal holds of a replica for long. The turns principals take at BigQuery's quotas and
//! the adaptive limits need no setting.

use clap::Args;

/// Per-principal caps (each replica counts its own).
#[derive(Debug, Clone, Args)]
pub struct FairnessArgs {
    /// Lanes one principal may have open on this replica: each resource with batches in one of
    /// its extracting executions holds one (set-up, accumulation, an AppendRows connection)
    /// until the execution's commit or abort. A batch that would open one more is refused
    /// with 429 `lane_limit`, nothing recorded.
    #[arg(long, env = "FILAMENT_MAX_OPEN_LANES_PER_PRINCIPAL", default_value_t = 10_000, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub max_open_lanes_per_principal: u32,

    /// Connection tests (`POST /v1/connections/test`: a query job each, holding a BigQuery
    /// REST place while it runs) one principal may have in flight on this replica; beyond it
    /// 429 `principal_limit` at once.
    #[arg(long, env = "FILAMENT_MAX_CONNECTION_TESTS_PER_PRINCIPAL", default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=1_000))]
    pub max_connection_tests_per_principal: u32,
}
