//! The only module that talks to Postgres (sqlx, runtime-checked queries). It persists runs,
//! resources, executions and their deliveries, batch receipts, checkpoints, staging streams and
//! publications; the API and the publisher read and write durable state through [`Store`].
//!
//! Conditional updates (`... WHERE state = ANY(...)`) make state transitions safe against
//! concurrent requests; callers learn whether a transition happened from the returned row.

mod batches;
mod executions;
mod publications;
mod runs;

pub use batches::{InsertBatch, NewBatch, ReceiptRecord, StagingStreamRecord};
pub use executions::{ExecutionRecord, OpenExecution, ResourceProgress};
pub use publications::{NewPublication, PublicationRecord};
pub use runs::{NewRun, ResourceRecord, ResourceUpsert, RunRecord};

use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{ConnectOptions as _, PgPool};

use crate::config::DatabaseConfig;
use crate::error::Problem;

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations");

/// Errors of the Postgres boundary.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("postgres: {0}")]
    Database(#[from] sqlx::Error),
    #[error("migration: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    #[error("stored value is corrupt: {0}")]
    Corrupt(String),
}

impl StoreError {
    /// Connection-level failures are worth retrying; constraint and data errors are not.
    pub fn is_retryable(&self) -> bool {
        matches!(self, StoreError::Database(sqlx::Error::PoolTimedOut | sqlx::Error::Io(_)))
    }

    /// Whether this is a unique-constraint violation (a concurrent insert won).
    pub fn is_unique_violation(&self) -> bool {
        match self {
            StoreError::Database(sqlx::Error::Database(e)) => e.is_unique_violation(),
            _ => false,
        }
    }
}

impl From<StoreError> for Problem {
    fn from(err: StoreError) -> Self {
        tracing::error!(error = %err, "store error");
        Problem::internal("the gateway could not read or write its state database; retry later")
    }
}

pub type StoreResult<T> = Result<T, StoreError>;

/// Handle on the state database; cheap to clone.
#[derive(Debug, Clone)]
pub struct Store {
    pool: PgPool,
}

impl Store {
    pub async fn connect(config: &DatabaseConfig) -> StoreResult<Self> {
        let options: PgConnectOptions = config
            .database_url
            .parse::<PgConnectOptions>()?
            .log_statements(tracing::log::LevelFilter::Trace)
            .log_slow_statements(tracing::log::LevelFilter::Warn, Duration::from_secs(2));
        let pool = PgPoolOptions::new()
            .max_connections(config.database_max_connections)
            .acquire_timeout(Duration::from_secs(10))
            .connect_with(options)
            .await?;
        Ok(Self { pool })
    }

    pub async fn migrate(&self) -> StoreResult<()> {
        MIGRATOR.run(&self.pool).await?;
        Ok(())
    }

    /// Readiness: one round trip.
    pub async fn ping(&self) -> StoreResult<()> {
        sqlx::query("SELECT 1").execute(&self.pool).await?;
        Ok(())
    }
}
