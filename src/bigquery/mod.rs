//! Everything that talks to BigQuery: credentials ([`credentials`]), datasets and tables
//! ([`metadata`], REST), query jobs ([`jobs`], REST) and the Storage Write API ([`write`],
//! tonic over the generated googleapis client). Failures are [`BigQueryError`]s, classified once.
//!
//! With `BIGQUERY_EMULATOR_HOST` / `BIGQUERY_STORAGE_EMULATOR_HOST` set, every call goes to the
//! emulator over plain HTTP with anonymous credentials.

pub(crate) mod credentials;
pub(crate) mod error;
pub(crate) mod jobs;
pub(crate) mod metadata;
pub(crate) mod write;

pub(crate) use error::{BigQueryError, BigQueryResult};

use google_cloud_auth::credentials::Credentials;
use google_cloud_bigquery_v2::client::{DatasetService, JobService, TableService};

const BIGQUERY_REST_ENDPOINT: &str = "https://bigquery.googleapis.com";
const BIGQUERY_WRITE_ENDPOINT: &str = "https://bigquerystorage.googleapis.com";

/// Where BigQuery is.
#[derive(Debug, Clone)]
pub(crate) struct Endpoints {
    pub(crate) rest: String,
    pub(crate) grpc: String,
    pub(crate) emulator: bool,
}

impl Endpoints {
    /// BigQuery itself, or the emulator at REST and gRPC `host:port` when both are given.
    pub(crate) fn new(emulator_rest: Option<&str>, emulator_grpc: Option<&str>) -> Self {
        match (emulator_rest, emulator_grpc) {
            (Some(rest), Some(grpc)) => {
                Self { rest: format!("http://{rest}"), grpc: format!("http://{grpc}"), emulator: true }
            }
            _ => Self { rest: BIGQUERY_REST_ENDPOINT.into(), grpc: BIGQUERY_WRITE_ENDPOINT.into(), emulator: false },
        }
    }
}

/// `projects/p/datasets/d/tables/t`, the Storage Write API's table path.
pub(crate) fn table_path(project: &str, dataset: &str, table: &str) -> String {
    format!("projects/{project}/datasets/{dataset}/tables/{table}")
}

/// Clients for BigQuery's REST and gRPC APIs sharing one set of credentials. Cheap to clone.
#[derive(Debug, Clone)]
pub(crate) struct BigQuery {
    pub(crate) datasets: DatasetService,
    pub(crate) tables: TableService,
    pub(crate) jobs: JobService,
    pub(crate) writer: write::WriteClient,
    pub(crate) credentials: Credentials,
}

impl BigQuery {
    /// Clients for `endpoints`; AppendRows requests are gzip-compressed at `append_gzip_level`
    /// (0: uncompressed).
    pub(crate) async fn connect(endpoints: Endpoints, append_gzip_level: u32) -> anyhow::Result<Self> {
        let credentials = credentials::build(endpoints.emulator).map_err(|e| {
            let problem = e.to_problem(crate::error::ErrorCode::MissingCredentials);
            anyhow::anyhow!("{}: {} (hint: {})", problem.code, problem.detail, problem.hint.unwrap_or_default())
        })?;
        let datasets = DatasetService::builder()
            .with_endpoint(&endpoints.rest)
            .with_credentials(credentials.clone())
            .build()
            .await?;
        let tables = TableService::builder()
            .with_endpoint(&endpoints.rest)
            .with_credentials(credentials.clone())
            .build()
            .await?;
        let jobs =
            JobService::builder().with_endpoint(&endpoints.rest).with_credentials(credentials.clone()).build().await?;
        let writer = write::WriteClient::connect(&endpoints.grpc, credentials.clone(), append_gzip_level)?;
        Ok(Self { datasets, tables, jobs, writer, credentials })
    }

    pub(crate) fn writer(&self) -> &write::WriteClient {
        &self.writer
    }

    /// Readiness: credentials produce a token and the REST API answers (any HTTP status proves
    /// it is reachable; only transport and credential failures count as not ready).
    pub(crate) async fn probe(&self, project: &str) -> BigQueryResult<()> {
        credentials::probe(&self.credentials).await?;
        let result = self.datasets.list_datasets().set_project_id(project).set_max_results(1u32).send().await;
        match result {
            Ok(_) => Ok(()),
            Err(e) if e.http_status_code().is_some() => Ok(()),
            Err(e) => Err(BigQueryError::Rest { operation: "datasets.list", source: e }),
        }
    }
}
