//! The settings of BigQuery's rate quotas the fleet paces by (`bigquery::quota`): Google's
//! published values by default, the operator's where a project has raised ones.

use clap::{Args, ValueEnum};

/// BigQuery's rate quotas, for the whole fleet (each replica paces its share).
#[derive(Debug, Clone, Args)]
pub struct QuotaArgs {
    /// `tables.insert` requests per second the fleet makes (BigQuery's quota per user: 10).
    /// Every replica paces its share: this divided by the live replicas.
    #[arg(long, env = "FILAMENT_QUOTA_TABLES_INSERT_PER_SECOND", default_value_t = 10.0, value_parser = positive_rate)]
    pub quota_tables_insert_per_second: f64,

    /// Requests per second the fleet makes of each other BigQuery REST method (`jobs.insert`,
    /// `tables.get`, ...; BigQuery's quota per user and method: 100).
    #[arg(long, env = "FILAMENT_QUOTA_API_REQUESTS_PER_SECOND_PER_METHOD", default_value_t = 100.0, value_parser = positive_rate)]
    pub quota_api_requests_per_second_per_method: f64,

    /// BigQuery REST requests the fleet has in flight at once, long polls included (BigQuery's
    /// quota per user: 300).
    #[arg(long, env = "FILAMENT_QUOTA_CONCURRENT_API_REQUESTS", default_value_t = 300, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub quota_concurrent_api_requests: u32,

    /// `CreateWriteStream` calls per hour the fleet makes (BigQuery's quota per project and
    /// region: 10,000).
    #[arg(long, env = "FILAMENT_QUOTA_CREATE_WRITE_STREAMS_PER_HOUR", default_value_t = 10_000.0, value_parser = positive_rate)]
    pub quota_create_write_streams_per_hour: f64,

    /// How the stream quota is read: `per_minute` (a sixtieth of the hourly quota at once, as the
    /// console shows it: never refused) or `hourly` (the whole hour's at once: faster for a
    /// burst of new tables, refused if BigQuery enforces it per minute).
    #[arg(long, env = "FILAMENT_QUOTA_CREATE_WRITE_STREAM_READING", value_enum, default_value_t = StreamQuotaReading::PerMinute)]
    pub quota_create_write_stream_reading: StreamQuotaReading,
}

/// How the `CreateWriteStream` quota (10,000 streams per hour per project and region) is read:
/// as one hourly bucket, or as the 167 per minute the console shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
#[value(rename_all = "snake_case")]
pub enum StreamQuotaReading {
    /// 10,000 at once, refilled over the hour.
    Hourly,
    /// A sixtieth of the hourly quota at once, refilled over the minute (the safe reading).
    PerMinute,
}

/// A quota rate: a finite number above zero.
fn positive_rate(text: &str) -> Result<f64, String> {
    match text.trim().parse::<f64>() {
        Ok(rate) if rate.is_finite() && rate > 0.0 => Ok(rate),
        _ => Err(format!("{text:?} is not a rate above zero")),
    }
}
