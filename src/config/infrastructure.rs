//! The "infrastructure" settings: Postgres, the BigQuery emulator, the readiness probe's
//! project, retention and the log format.

use clap::{Args, ValueEnum};

use super::DatabaseConfig;

/// What the gateway runs on and how it reports.
#[derive(Debug, Clone, Args)]
pub struct InfrastructureArgs {
    #[command(flatten)]
    pub database: DatabaseConfig,

    /// REST `host:port` of a BigQuery emulator (plain HTTP, anonymous credentials).
    #[arg(long, env = "BIGQUERY_EMULATOR_HOST")]
    pub bigquery_emulator_host: Option<String>,

    /// gRPC `host:port` of the emulator's Storage Write API (plain HTTP/2, anonymous).
    #[arg(long, env = "BIGQUERY_STORAGE_EMULATOR_HOST")]
    pub bigquery_storage_emulator_host: Option<String>,

    /// Project used by `/readyz` to check that the BigQuery REST API answers.
    #[arg(long, env = "FILAMENT_READINESS_PROJECT", default_value = "filament-readiness")]
    pub readiness_project: String,

    /// Batch receipts of deliveries that ended longer ago than this many days are pruned
    /// (hourly, by one replica at a time); executions, publications with their fingerprints and
    /// durable checkpoints stay, so a late redelivery is still recognised.
    #[arg(long, env = "FILAMENT_RETENTION_DAYS", default_value_t = 30, value_parser = clap::value_parser!(u32).range(0..=36_500))]
    pub retention_days: u32,

    /// Log format: `text` for people, `json` for log pipelines.
    #[arg(long, env = "FILAMENT_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

/// How logs are written (to stderr).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line, for log pipelines.
    Json,
}
