//! Everything that talks to BigQuery: credentials ([`credentials`]), datasets and tables
//! ([`metadata`], REST; each dataset checked once per process: [`known_datasets`]), query jobs
//! ([`jobs`], REST) and the Storage Write API ([`write`], tonic over the generated googleapis
//! client). Failures are [`BigQueryError`]s, classified once, and retried by one driver
//! ([`retry::RetryDriver`]) at one level: a REST call ([`rest_call`]) is one attempt, paced by
//! the quotas; its caller's step is what the driver runs again.
//!
//! With `BIGQUERY_EMULATOR_HOST` / `BIGQUERY_STORAGE_EMULATOR_HOST` set, every call goes to the
//! emulator over plain HTTP with anonymous credentials.

pub(crate) mod adaptive;
pub(crate) mod append_frame;
pub(crate) mod collation;
pub(crate) mod credentials;
pub(crate) mod error;
pub(crate) mod fair;
pub(crate) mod jobs;
pub(crate) mod known_datasets;
pub(crate) mod metadata;
pub(crate) mod per_destination;
pub(crate) mod quota;
pub(crate) mod retry;
pub(crate) mod row_errors;
pub(crate) mod write;

pub(crate) use error::{BigQueryError, BigQueryResult};
use fair::Tenant;
use quota::{Quotas, TenantQuotas};
use retry::RetryPolicy;

use std::time::Duration;

use credentials::CredentialSource;
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
    /// BigQuery itself, or the emulator at REST and gRPC `host:port` when both are given (an
    /// empty value counts as not given).
    pub(crate) fn new<'a>(emulator_rest: Option<&'a str>, emulator_grpc: Option<&'a str>) -> Self {
        let given = |host: Option<&'a str>| host.filter(|h| !h.is_empty());
        match (given(emulator_rest), given(emulator_grpc)) {
            (Some(rest), Some(grpc)) => {
                Self { rest: format!("http://{rest}"), grpc: format!("http://{grpc}"), emulator: true }
            }
            _ => Self { rest: BIGQUERY_REST_ENDPOINT.into(), grpc: BIGQUERY_WRITE_ENDPOINT.into(), emulator: false },
        }
    }
}

/// `/readyz` answers within Kubernetes' default probe timeout (5 s).
pub(crate) const READINESS_DEADLINE: Duration = Duration::from_secs(4);
/// Credentials yield a token within this, or they count as missing or unusable.
pub(crate) const CREDENTIALS_DEADLINE: Duration = Duration::from_secs(5);
/// `POST /v1/connections/test` answers within this.
pub(crate) const CONNECTION_TEST_DEADLINE: Duration = Duration::from_secs(15);
/// One attempt of a REST call (datasets, tables, `jobs.insert`, one `jobs.get` poll): an
/// unreachable endpoint fails the attempt after this instead of hanging.
pub(crate) const REST_CALL_DEADLINE: Duration = Duration::from_secs(60);

/// `call` within `deadline`, or a retryable [`BigQueryError::Timeout`] naming `operation`.
pub(crate) async fn within<T>(
    operation: &'static str,
    deadline: Duration,
    call: impl Future<Output = BigQueryResult<T>>,
) -> BigQueryResult<T> {
    // Boxed: REST call futures are large, and nesting them by value overflows debug stacks.
    match tokio::time::timeout(deadline, Box::pin(call)).await {
        Ok(result) => result,
        Err(_) => Err(BigQueryError::Timeout { operation, seconds: deadline.as_secs() }),
    }
}

/// One attempt of a REST call (the caller judges BigQuery's errors), paced within BigQuery's
/// rate quotas (`quotas`: waited before the attempt, not counted in its deadline; told of
/// BigQuery's pushback, a 429 or 403 `rateLimitExceeded` / `quotaExceeded`), and within
/// [`REST_CALL_DEADLINE`] or a [`BigQueryError::Timeout`]. It is never retried here: the
/// caller's step is retried by [`retry::RetryDriver`], at one level
/// ([`BigQuery::retrying_pushback`] for a call that is a step of its own).
pub(crate) async fn rest_call<T, Answer>(
    quotas: &TenantQuotas,
    operation: &'static str,
    call: impl FnOnce() -> Answer,
) -> BigQueryResult<Result<T, google_cloud_gax::error::Error>>
where
    Answer: Future<Output = Result<T, google_cloud_gax::error::Error>>,
{
    let answer = {
        let _place = quotas.before_rest_call(operation).await;
        let span = tracing::trace_span!(target: crate::traces::TARGET, "bigquery.rest", otel.name = operation,
            bigquery.operation = operation);
        let answer = within(operation, REST_CALL_DEADLINE, async { Ok(call().await) });
        tracing::Instrument::instrument(answer, span).await?
    };
    if let Err(e) = &answer
        && (e.http_status_code() == Some(429) || error::is_quota(e))
    {
        quotas.rest_refused(operation);
    }
    Ok(answer)
}

/// Whether `answer` is BigQuery's pushback on a REST call (as a [`retry::Failure`] with the code
/// `quota`): what [`BigQuery::retrying_pushback`] retries.
pub(crate) fn rest_pushback<T>(answer: &BigQueryResult<T>) -> Option<retry::Failure> {
    match answer {
        Err(e @ BigQueryError::Rest { .. }) if e.is_pushback() => Some(retry::Failure::pushback(e)),
        _ => None,
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
    pub(crate) credential_source: CredentialSource,
    pub(crate) endpoints: Endpoints,
    /// Datasets found or created by this process (shared by every clone).
    pub(crate) known_datasets: std::sync::Arc<known_datasets::KnownDatasets>,
    /// How a REST call that is a step of its own retries BigQuery's pushback
    /// ([`BigQuery::retrying_pushback`]).
    rest_retry: RetryPolicy,
    /// The rate quotas every call is paced by (shared by every clone), met as the tenant
    /// these clients call for (the gateway's own, or a principal's: [`BigQuery::on_behalf_of`]).
    pub(crate) quotas: TenantQuotas,
}

impl BigQuery {
    /// Clients for `endpoints`; AppendRows requests are gzip-compressed at `append_gzip_level`
    /// (0: uncompressed); a REST call that is a step of its own retries pushback as `rest_retry`
    /// says ([`BigQuery::retrying_pushback`]).
    pub(crate) async fn connect(
        endpoints: Endpoints,
        append_gzip_level: u32,
        rest_retry: RetryPolicy,
        quotas: std::sync::Arc<Quotas>,
    ) -> anyhow::Result<Self> {
        let credential_source = CredentialSource::detect(endpoints.emulator);
        let credentials = credentials::build(&credential_source).map_err(|e| {
            let problem = e.problem(error::Stage::Credentials);
            anyhow::anyhow!("{}: {} (hint: {})", problem.code, problem.detail, problem.hint.unwrap_or_default())
        })?;
        let rest = &endpoints.rest;
        let (datasets, tables, jobs) = tokio::join!(
            DatasetService::builder().with_endpoint(rest).with_credentials(credentials.clone()).build(),
            TableService::builder().with_endpoint(rest).with_credentials(credentials.clone()).build(),
            JobService::builder().with_endpoint(rest).with_credentials(credentials.clone()).build(),
        );
        let (datasets, tables, jobs) = (datasets?, tables?, jobs?);
        let writer = write::WriteClient::connect(&endpoints.grpc, credentials.clone(), append_gzip_level)?;
        let known_datasets = Default::default();
        Ok(Self {
            datasets,
            tables,
            jobs,
            writer,
            credentials,
            credential_source,
            endpoints,
            known_datasets,
            rest_retry,
            quotas: TenantQuotas::new(quotas, Tenant::Gateway),
        })
    }

    /// These clients calling for `tenant`: its calls take their turns under it at every quota
    /// and limit (`fair`). Cheap: the clients and quotas are shared.
    pub(crate) fn on_behalf_of(&self, tenant: Tenant) -> Self {
        Self { quotas: self.quotas.on_behalf_of(tenant), ..self.clone() }
    }

    /// The tenant these clients call for.
    pub(crate) fn tenant(&self) -> &Tenant {
        self.quotas.tenant()
    }

    /// `step`, one REST call of these clients (`operation`) that no larger step of its caller
    /// runs again, retried on BigQuery's pushback as the clients' policy says: the one level
    /// that retries it (a step that is run again as a whole, set-up or a publication's job,
    /// calls the clients directly, each call made once).
    pub(crate) async fn retrying_pushback<T, Step>(
        &self,
        operation: &'static str,
        step: impl FnMut(u32) -> Step,
    ) -> BigQueryResult<T>
    where
        Step: Future<Output = BigQueryResult<T>>,
    {
        retry::RetryDriver::new(&self.rest_retry, operation).run(rest_pushback, step).await
    }

    pub(crate) fn writer(&self) -> &write::WriteClient {
        &self.writer
    }

    /// Whether the credentials yield a token within `deadline`.
    pub(crate) async fn probe_credentials(&self, deadline: Duration) -> BigQueryResult<()> {
        credentials::probe(&self.credentials, &self.credential_source, deadline).await
    }

    /// Readiness, within [`READINESS_DEADLINE`]: credentials produce a token and the REST API
    /// answers (any HTTP status proves it is reachable; only transport and credential failures
    /// count as not ready).
    pub(crate) async fn probe(&self, project: &str) -> BigQueryResult<()> {
        let started = tokio::time::Instant::now();
        self.probe_credentials(READINESS_DEADLINE).await?;
        let list = async {
            match self.datasets.list_datasets().set_project_id(project).set_max_results(1u32).send().await {
                Ok(_) => Ok(()),
                Err(e) if e.http_status_code().is_some() => Ok(()),
                Err(e) => Err(BigQueryError::Rest { operation: "datasets.list", source: e }),
            }
        };
        within("datasets.list", READINESS_DEADLINE.saturating_sub(started.elapsed()), list).await
    }
}
