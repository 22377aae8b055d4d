//! The only module that talks to Postgres (sqlx, runtime-checked queries). It persists runs,
//! resources, executions and their deliveries, batch receipts, checkpoints, staging streams,
//! publications and their priced plans, and what a held commit staged; the API and the publisher read and write durable state through [`Store`].
//!
//! Conditional updates (`... WHERE state = ANY(...)`, the state sets bound from
//! [`ExecutionState`](crate::model::ExecutionState)) make state transitions safe against
//! concurrent requests; callers learn whether a transition happened from the returned row.
//! Methods take typed keys ([`ExecutionKey`], [`DeliveryRef`], [`ResourceRef`]) and rows come
//! back through `sqlx::FromRow`.

mod batches;
mod events;
mod executions;
mod fleet;
mod job_id_keys;
mod plans;
mod publications;
mod publishing;
mod run_list;
mod runs;
mod staged;

pub(crate) use batches::{CommitInputs, HandedOverStream, InsertBatch, NewBatch, ReceiptRecord, StagedInputs};
pub(crate) use events::{BACKPRESSURE_EVENT_MIN_MS, Event, EventKind, EventRecord, StreamChange};
pub(crate) use executions::{ExecutionRecord, Lease, OpenExecution, ResourceProgress};
pub(crate) use plans::PlanRow;
pub(crate) use publications::{NewPublication, PublicationEnd, PublicationRecord};
pub(crate) use publishing::Publishing;
pub(crate) use run_list::{RunListCursor, RunListQuery, RunListRow};
pub(crate) use runs::{NewRun, ResourceRecord, ResourceUpsert, RunRecord};
pub(crate) use staged::StreamToKeep;

use std::time::Duration;

use sqlx::postgres::{PgArguments, PgConnectOptions, PgPoolOptions};
use sqlx::query::{Query, QueryAs, QueryScalar};
use sqlx::{ConnectOptions as _, PgPool, Postgres};

use crate::error::Problem;
use crate::model::{DeliveryRef, ExecutionKey, ExecutionState, ResourceRef};

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations");

/// Errors of the Postgres boundary.
#[derive(Debug, thiserror::Error)]
pub(crate) enum StoreError {
    #[error("postgres: {0}")]
    Database(#[from] sqlx::Error),
    #[error("migration: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    #[error("stored value is corrupt: {0}")]
    Corrupt(String),
}

/// How to reach the database.
#[derive(Debug, Clone)]
pub(crate) struct StoreSettings {
    pub(crate) database_url: String,
    pub(crate) max_connections: u32,
}

/// The answer to a failure of the state database; the error itself is logged where the
/// problem ends (a 5xx answer, a failed execution), not here.
impl From<StoreError> for Problem {
    fn from(err: StoreError) -> Self {
        Problem::internal("the gateway could not read or write its state database; retry later").with_cause(err)
    }
}

pub(crate) type StoreResult<T> = Result<T, StoreError>;

/// Handle on the state database; cheap to clone.
#[derive(Debug, Clone)]
pub(crate) struct Store {
    pool: PgPool,
}

impl Store {
    pub(crate) async fn connect(settings: &StoreSettings) -> StoreResult<Self> {
        let options: PgConnectOptions = settings
            .database_url
            .parse::<PgConnectOptions>()?
            .log_statements(tracing::log::LevelFilter::Trace)
            .log_slow_statements(tracing::log::LevelFilter::Warn, Duration::from_secs(2));
        let pool = PgPoolOptions::new()
            .max_connections(settings.max_connections)
            .acquire_timeout(Duration::from_secs(10))
            .connect_with(options)
            .await?;
        Ok(Self { pool })
    }

    pub(crate) async fn migrate(&self) -> StoreResult<()> {
        MIGRATOR.run(&self.pool).await?;
        Ok(())
    }

    /// Readiness: one round trip.
    pub(crate) async fn ping(&self) -> StoreResult<()> {
        sqlx::query("SELECT 1").execute(&self.pool).await?;
        Ok(())
    }
}

/// The key conditions of the rows of one execution, delivery and resource of a delivery, as
/// [`BindKey`] binds them (`$1`, `$2`, ...).
const EXECUTION_KEY: &str = "run_id = $1 AND execution_id = $2";
const DELIVERY_KEY: &str = "run_id = $1 AND execution_id = $2 AND delivery = $3";
const RESOURCE_KEY: &str = "run_id = $1 AND execution_id = $2 AND delivery = $3 AND resource = $4";

/// The names of `states`, for `state = ANY($n)`.
fn state_names(states: &[ExecutionState]) -> Vec<&'static str> {
    states.iter().map(|s| s.as_str()).collect()
}

/// Binds a key's columns in their usual order (`run_id, execution_id[, delivery[, resource]]`)
/// as the next parameters of a query.
trait BindKey<'q>: Sized {
    fn bind_execution(self, key: &'q ExecutionKey) -> Self;
    fn bind_delivery(self, delivery: &'q DeliveryRef) -> Self;
    fn bind_resource(self, resource: &'q ResourceRef) -> Self;
}

macro_rules! bind_key_impl {
    () => {
        fn bind_execution(self, key: &'q ExecutionKey) -> Self {
            self.bind(&key.run_id).bind(&key.execution_id)
        }

        fn bind_delivery(self, delivery: &'q DeliveryRef) -> Self {
            self.bind_execution(&delivery.execution).bind(delivery.delivery)
        }

        fn bind_resource(self, resource: &'q ResourceRef) -> Self {
            self.bind_delivery(&resource.delivery).bind(&resource.resource)
        }
    };
}

impl<'q> BindKey<'q> for Query<'q, Postgres, PgArguments> {
    bind_key_impl!();
}

impl<'q, O> BindKey<'q> for QueryAs<'q, Postgres, O, PgArguments> {
    bind_key_impl!();
}

impl<'q, O> BindKey<'q> for QueryScalar<'q, Postgres, O, PgArguments> {
    bind_key_impl!();
}
