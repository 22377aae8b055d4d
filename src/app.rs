//! Wires the gateway together and serves it: connect and migrate Postgres, fail executions whose
//! replica stopped renewing its lease, build the BigQuery clients (probing credentials), then
//! serve the router until SIGTERM/SIGINT. Then the replica turns unready, hands the executions
//! it serves over to the fleet (`replica`), and lets in-flight requests and commits finish. The mapping from
//! the configuration ([`crate::config`], a leaf) to each part's own settings lives here.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use sha2::{Digest as _, Sha256};

use crate::api::auth::Authenticator;
use crate::http::tls::{ReloadingCertificate, TlsFiles};
use crate::principals::Principals;
use crate::principals::id_token::{IdTokenSettings, IdTokenVerifier};
use crate::principals::watch::{self, PrincipalSources};
use tokio_util::task::TaskTracker;

use crate::api::console::session::{ConsoleSessions, MIN_KEY_FILE_BYTES};
use crate::api::{ApiSettings, ApiState, router};
use crate::bigquery::adaptive::{AdaptiveLimits, BIGQUERY_CONCURRENT_QUERIES};
use crate::bigquery::quota::{QuotaSettings, Quotas};
use crate::bigquery::retry::Backoff;
use crate::bigquery::retry::RetryPolicy;
use crate::bigquery::{BigQuery, Endpoints};
use crate::config::{DatabaseConfig, ServeConfig};
use crate::http::server::{self, ConnectionLimits, http1_header_fields_parsed, http1_read_buffer_bytes};
use crate::pipeline::lane::AppendTimeouts;
use crate::pipeline::{Pipeline, PipelineLimits};
use crate::publish::PUBLICATION_RETRY;
use crate::publish::Publisher;
use crate::publish::job_id::JobIdKey;
use crate::replica::Replica;
use crate::store::{Store, StoreSettings};
use crate::telemetry;

/// How long shutdown waits for running commits.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(30);

/// How long shutdown spends handing executions over (draining their appends) before it gives
/// up on the rest, which then fail (`gateway_restarted`): well inside Kubernetes' grace period.
const HANDOVER_GRACE: Duration = Duration::from_secs(20);

/// Longest delay between two attempts of a failed append.
const APPEND_MAX_BACKOFF: Duration = Duration::from_secs(10);

/// Longest delay between two attempts while BigQuery's quota is exhausted.
const QUOTA_MAX_BACKOFF: Duration = Duration::from_secs(30);

fn store_settings(database: &DatabaseConfig) -> StoreSettings {
    StoreSettings { database_url: database.database_url.clone(), max_connections: database.database_max_connections }
}

/// `migrate`: applies the migrations and returns.
pub async fn migrate(database: DatabaseConfig) -> anyhow::Result<()> {
    let store = Store::connect(&store_settings(&database)).await.context("connecting to Postgres")?;
    store.migrate().await.context("applying migrations")?;
    Ok(())
}

/// How calls to BigQuery are retried (`bigquery::retry`): the one policy appends, stream
/// creation, set-up and REST calls share; publications take it with their own attempts and
/// backoff ([`crate::publish::PUBLICATION_RETRY`]).
fn retry_policy(config: &ServeConfig) -> RetryPolicy {
    let initial_backoff = Duration::from_millis(config.control_plane.bigquery_initial_backoff_ms);
    RetryPolicy {
        max_attempts: config.control_plane.bigquery_max_attempts,
        backoff: Backoff::new(initial_backoff, APPEND_MAX_BACKOFF),
        quota_wait: Duration::from_secs(config.control_plane.quota_wait_secs),
        quota_backoff: Backoff::new(initial_backoff, QUOTA_MAX_BACKOFF),
    }
}

/// The upload pipeline's limits from the configuration (defaults and bounds: `config`).
fn pipeline_limits(config: &ServeConfig) -> PipelineLimits {
    PipelineLimits {
        max_buffered_bytes: config.memory.max_buffered_bytes,
        max_buffered_bytes_per_resource: config
            .memory
            .max_buffered_bytes_per_resource
            .unwrap_or(config.memory.max_buffered_bytes / 2)
            .min(config.memory.max_buffered_bytes),
        max_concurrent_batch_decodes: config
            .memory
            .max_concurrent_batch_decodes
            .map_or_else(|| std::thread::available_parallelism().map_or(2, |n| n.get()).max(2), |slots| slots as usize),
        max_receiving_bytes: config
            .memory
            .max_receiving_bytes
            .unwrap_or(config.memory.max_batch_body_bytes.saturating_mul(2)),
        backpressure_wait: Duration::from_millis(config.memory.backpressure_wait_ms),
        inflight_per_stream: config.storage_write.inflight_per_stream as usize,
        max_inflight_requests: config.storage_write.max_inflight_requests as usize,
        max_append_connections: config.storage_write.max_append_connections as usize,
        append_connection_idle: Duration::from_secs(config.storage_write.append_connection_idle_secs),
        max_concurrent_set_ups: config.control_plane.max_concurrent_set_ups as usize,
        max_open_lanes_per_principal: config.control_plane.fairness.max_open_lanes_per_principal as usize,
        retry: retry_policy(config),
        append_timeouts: AppendTimeouts {
            response: Duration::from_secs(config.storage_write.append_response_timeout_secs),
            send: Duration::from_secs(config.storage_write.append_send_timeout_secs),
        },
    }
}

/// The Google ID-token verifier, when an audience is configured. Its keys are fetched over
/// HTTPS only (plain HTTP to a loopback address, for tests and local development: checked by
/// `ServeConfig::validate`), following no redirect and ignoring ambient proxy variables: whoever
/// could answer the fetch could mint identities.
fn id_token_verifier(config: &ServeConfig) -> anyhow::Result<Option<IdTokenVerifier>> {
    let Some(audience) = config.access.google_id_token_audience.as_deref() else { return Ok(None) };
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .no_proxy()
        .build()
        .context("building the JWKS client")?;
    let settings =
        IdTokenSettings { audience: audience.trim().to_string(), jwks_url: config.access.google_jwks_url.clone() };
    Ok(Some(IdTokenVerifier::new(settings, client)))
}

/// `token new --principal NAME`: a new random token (256 bits, prefixed `fbq_` so scanners and
/// people recognise it) and the line that admits it, for the principals file.
pub fn new_token(principal: &str) -> Result<String, String> {
    let name = crate::principals::PrincipalName::parse(principal)?;
    let token = format!("fbq_{}", hex::encode(rand::random::<[u8; 32]>()));
    let digest = hex::encode(Sha256::digest(token.as_bytes()));
    Ok(format!(
        "{token}\n# Give the token above to principal {name}'s extractor; it is not stored anywhere.\n\
         # Add this line to the [[principal]] entry with name = \"{name}\" (or its digest to the existing list):\n\
         token_sha256 = [\"{digest}\"]\n"
    ))
}

/// The console's sessions, signed with the key file's key (or a random one of this process),
/// `Secure` (and `__Host-` prefixed) when clients reach the gateway over TLS.
fn console_sessions(config: &ServeConfig, over_tls: bool) -> anyhow::Result<ConsoleSessions> {
    let lifetime = Duration::from_secs(config.access.console_session_secs);
    let Some(path) = &config.access.console_session_key_file else {
        tracing::warn!(
            "console sessions are signed with a random key of this process (FILAMENT_CONSOLE_SESSION_KEY_FILE \
             unset): another replica, or this one after a restart, asks to sign in again"
        );
        return Ok(ConsoleSessions::new(None, lifetime, over_tls));
    };
    let material =
        std::fs::read(path).with_context(|| format!("reading FILAMENT_CONSOLE_SESSION_KEY_FILE {}", path.display()))?;
    if material.len() < MIN_KEY_FILE_BYTES {
        anyhow::bail!(
            "FILAMENT_CONSOLE_SESSION_KEY_FILE {} holds {} bytes; it needs at least {MIN_KEY_FILE_BYTES} secret bytes \
             (for example `head -c 64 /dev/urandom > console-session.key`)",
            path.display(),
            material.len()
        );
    }
    Ok(ConsoleSessions::new(Some(&material), lifetime, over_tls))
}

fn api_settings(config: &ServeConfig) -> ApiSettings {
    ApiSettings {
        max_batch_body_bytes: config.memory.max_batch_body_bytes,
        max_append_request_bytes: config.storage_write.max_append_request_bytes,
        readiness_project: config.infrastructure.readiness_project.clone(),
        pending_stream_max_age: Duration::from_secs(config.storage_write.pending_stream_max_age_secs),
        max_uri_bytes: config.http.max_uri_bytes,
        max_header_bytes: config.http.max_header_bytes,
        max_header_count: config.http.max_header_count as usize,
        body_rate: crate::http::body_deadline::BodyRate {
            initial: Duration::from_secs(config.http.body_read_timeout_secs),
            min_rate_bytes_per_sec: config.http.body_min_rate_bytes_per_sec,
            max_duration: Duration::from_secs(config.http.body_max_read_secs),
        },
        metrics_token_sha256: config.access.metrics_token.as_deref().map(crate::principals::token_digest),
        connection_tests: crate::bigquery::fair::PerPrincipalCap::new(
            "connection_tests",
            config.control_plane.fairness.max_connection_tests_per_principal as usize,
        ),
    }
}

/// The quotas this replica paces BigQuery's calls by, its share counted before the first call
/// (a replica joining a fleet starts with its share, not the whole) and kept current.
async fn paced_quotas(config: &ServeConfig, replica: &Replica) -> Arc<Quotas> {
    replica.renew_fleet_membership().await;
    let quotas = Arc::new(Quotas::new(quota_settings(config), replica.fleet_membership()));
    Quotas::follow_fleet(&quotas);
    quotas
}

pub async fn serve(config: ServeConfig) -> anyhow::Result<()> {
    // Installed before anything records: a gauge set at start (the fleet count, each quota
    // pacer's rate) is otherwise lost until it changes.
    let metrics = telemetry::metrics_handle();
    let limits = pipeline_limits(&config);
    let store =
        Store::connect(&store_settings(&config.infrastructure.database)).await.context("connecting to Postgres")?;
    store.migrate().await.context("applying migrations")?;
    let connection_limits = connection_limits(&config);
    let listener = bind(config.http.listen, &connection_limits)?;
    let address = listener.local_addr()?;
    let tls = tls_certificate(&config)?;
    let scheme = tls.as_ref().map_or("http", |_| "https");
    let advertise_url = advertised_url(config.fleet.advertise_url.as_deref(), address, scheme);
    let replica = Replica::new(store.clone(), Duration::from_secs(config.fleet.replica_lease_secs), advertise_url);
    // Only executions whose replica stopped renewing its lease fail: live replicas keep theirs.
    replica.sweep().await;
    tracing::info!(replica = %replica.lease.owner, lease_secs = config.fleet.replica_lease_secs,
        advertise_url = replica.lease.url.as_deref().unwrap_or("none (no forwarding to this replica)"), "gateway replica");
    let endpoints = endpoints(&config);
    let quotas = paced_quotas(&config, &replica).await;
    let bigquery =
        connect_bigquery(&endpoints, config.storage_write.append_gzip_level, retry_policy(&config), quotas).await?;

    let (sources, principals, generated_token) = initial_principals(&config)?;
    let stop_watching = tokio_util::sync::CancellationToken::new();
    let watcher = tokio::spawn(watch::keep_current(sources, principals.clone(), stop_watching.clone()));

    let pipeline = Pipeline::new(bigquery.clone(), store.clone(), limits);
    let job_ids = job_id_key(&config, &store).await?;
    let publisher = publisher(&config, &store, &bigquery, &pipeline, job_ids);
    log_write_settings(&bigquery, &limits, &publisher);
    let commits = TaskTracker::new();
    let state = Arc::new(ApiState {
        store,
        bigquery,
        pipeline,
        publisher,
        settings: api_settings(&config),
        auth: Authenticator::new(principals.clone(), id_token_verifier(&config)?),
        metrics,
        commits: commits.clone(),
        request_slots: Arc::new(tokio::sync::Semaphore::new(config.http.max_concurrent_requests as usize)),
        replica: replica.clone(),
        forwarder: forwarder(&config)?,
        console: console_sessions(&config, tls.is_some() || config.http.behind_tls)?,
        readiness: crate::api::health::ReadinessProbe::default(),
    });
    let stop_heartbeat = tokio_util::sync::CancellationToken::new();
    let heartbeat = replica.spawn_heartbeat(config.infrastructure.retention_days, stop_heartbeat.clone());

    tracing::info!(%address, emulator = endpoints.emulator, rest = %endpoints.rest, grpc = %endpoints.grpc, "gateway listening");
    // Standard output carries exactly these lines, for scripts and the test harness.
    println!("filament-bigquery listening on {scheme}://{address}");
    if let Some(token) = &generated_token {
        println!("development token (pass as Authorization: Bearer <token>): {token}");
    }

    let drained = hand_over_on_signal(
        replica.clone(),
        state.pipeline.clone(),
        Duration::from_secs(config.fleet.shutdown_delay_secs),
    );
    let acceptor = tls.as_ref().map(|certificate| {
        tokio::spawn(Arc::clone(certificate).keep_current(stop_watching.clone()));
        tokio_rustls::TlsAcceptor::from(certificate.server_config())
    });
    server::serve(listener, router(state), connection_limits, acceptor, drained).await;
    commits.close();
    if tokio::time::timeout(SHUTDOWN_GRACE, commits.wait()).await.is_err() {
        tracing::warn!("shutdown: commits still running after the grace period; they fail");
    }
    stop_heartbeat.cancel();
    stop_watching.cancel();
    let _ = heartbeat.await;
    let _ = watcher.await;
    replica.release().await;
    tracing::info!("gateway stopped");
    Ok(())
}

/// `bigquery.write.ready`: the writer's settings and the concurrency limits in force.
fn log_write_settings(bigquery: &BigQuery, limits: &PipelineLimits, publisher: &Publisher) {
    tracing::info!(
        compression = %bigquery.writer().compression(),
        max_inflight_requests = limits.max_inflight_requests,
        max_append_connections = limits.max_append_connections,
        inflight_per_stream = limits.inflight_per_stream,
        max_concurrent_set_ups = limits.max_concurrent_set_ups,
        max_concurrent_publications = publisher.max_concurrent_publications,
        max_buffered_bytes = limits.max_buffered_bytes,
        "bigquery.write.ready"
    );
}

/// The BigQuery quotas the fleet paces by, as the operator set them (defaults: Google's).
fn quota_settings(config: &ServeConfig) -> QuotaSettings {
    QuotaSettings {
        tables_insert_per_second: config.control_plane.quotas.quota_tables_insert_per_second,
        api_requests_per_second_per_method: config.control_plane.quotas.quota_api_requests_per_second_per_method,
        concurrent_api_requests: config.control_plane.quotas.quota_concurrent_api_requests as usize,
        create_write_streams_per_hour: config.control_plane.quotas.quota_create_write_streams_per_hour,
        stream_quota_reading: config.control_plane.quotas.quota_create_write_stream_reading,
    }
}

/// The key of job-id tags: `FILAMENT_JOB_ID_KEY_FILE`'s, else the fleet's newest generation in
/// Postgres (this replica's random key becomes generation 1 when there is none yet).
async fn job_id_key(config: &ServeConfig, store: &Store) -> anyhow::Result<JobIdKey> {
    let key = match &config.fleet.job_id_key_file {
        Some(path) => {
            let secret =
                std::fs::read(path).with_context(|| format!("reading FILAMENT_JOB_ID_KEY_FILE {}", path.display()))?;
            JobIdKey::new(secret, format!("FILAMENT_JOB_ID_KEY_FILE {}", path.display()))
        }
        None => {
            let stored = store.job_id_key(&rand::random::<[u8; 32]>()).await.context("reading the job-id key")?;
            JobIdKey::new(stored.secret, format!("postgres generation {}", stored.generation))
        }
    };
    let key = key.map_err(anyhow::Error::msg)?;
    tracing::info!(source = %key.source, "job ids keyed");
    Ok(key)
}

/// The publication jobs' settings and their adaptive limit (starting at BigQuery's concurrent
/// queries, within `FILAMENT_MAX_CONCURRENT_PUBLICATIONS`).
fn publisher(
    config: &ServeConfig,
    store: &Store,
    bigquery: &BigQuery,
    pipeline: &Pipeline,
    job_ids: JobIdKey,
) -> Publisher {
    let maximum = config.control_plane.max_concurrent_publications as usize;
    Publisher {
        store: store.clone(),
        bigquery: bigquery.clone(),
        pipeline: pipeline.clone(),
        query_job_timeout: Duration::from_secs(config.control_plane.query_job_timeout_secs),
        max_concurrent_publications: maximum,
        publications: AdaptiveLimits::starting_at("publication", BIGQUERY_CONCURRENT_QUERIES, maximum),
        retry: RetryPolicy {
            quota_wait: Duration::from_secs(config.control_plane.quota_wait_secs),
            ..PUBLICATION_RETRY
        },
        job_ids,
        price_per_tib_usd: config.control_plane.on_demand_price_per_tib_usd,
    }
}

/// The BigQuery clients, their credentials probed once (a failure is logged, not fatal:
/// `/readyz` reports it, and the fix may be applied without a restart).
async fn connect_bigquery(
    endpoints: &Endpoints,
    append_gzip_level: u32,
    rest_retry: RetryPolicy,
    quotas: Arc<Quotas>,
) -> anyhow::Result<BigQuery> {
    let bigquery = BigQuery::connect(endpoints.clone(), append_gzip_level, rest_retry, quotas)
        .await
        .context("building BigQuery clients")?;
    if let Err(e) = bigquery.probe_credentials(crate::bigquery::CREDENTIALS_DEADLINE).await {
        let problem = e.problem(crate::bigquery::error::Stage::Credentials);
        tracing::error!(detail = %problem.detail, hint = problem.hint.as_deref().unwrap_or(""), "credentials probe failed");
    }
    Ok(bigquery)
}

/// The client forwarding requests to the replica serving an execution (HTTPS trusting
/// `FILAMENT_FORWARD_CA_FILE` too, when set).
fn forwarder(config: &ServeConfig) -> anyhow::Result<crate::api::forward::Forwarder> {
    let tls = crate::http::tls::forwarding_client_config(config.fleet.forward_ca_file.as_deref())
        .map_err(anyhow::Error::msg)
        .context("FILAMENT_FORWARD_CA_FILE")?;
    Ok(crate::api::forward::Forwarder::new(tls))
}

/// Where principals come from: the file, and `FILAMENT_API_TOKENS` as principal `default`.
fn principal_sources(config: &ServeConfig) -> PrincipalSources {
    let api_tokens = config.access.api_tokens.iter().map(|t| t.trim().to_string()).filter(|t| !t.is_empty()).collect();
    PrincipalSources { file: config.access.principals_file.clone(), api_tokens }
}

/// The principals in force at start, their sources (for reloads), and the development token
/// generated (printed once) when nothing else is configured and `--dev-generate-token` was
/// passed: a reload keeps it.
fn initial_principals(config: &ServeConfig) -> anyhow::Result<(PrincipalSources, Principals, Option<String>)> {
    let mut sources = principal_sources(config);
    // `ServeConfig::validate` refused it beside configured tokens or a principals file.
    let generated_token = if config.access.dev_generate_token {
        let token = format!("dev-{}", hex::encode(rand::random::<[u8; 16]>()));
        sources.api_tokens.push(token.clone());
        Some(token)
    } else {
        None
    };
    let principals = Principals::new(sources.load().context("loading the principals")?);
    Ok((sources, principals, generated_token))
}

/// Descriptors kept for everything but client connections: the Postgres pool, BigQuery's
/// channels and REST connections, forwarding, files.
const RESERVED_FILE_DESCRIPTORS: u64 = 256;

/// The listening socket, its backlog as long as the connections served at once.
fn bind(listen: std::net::SocketAddr, limits: &ConnectionLimits) -> anyhow::Result<tokio::net::TcpListener> {
    server::listen(listen, limits.max_connections).with_context(|| format!("binding {listen}"))
}

/// What client connections may hold; `max_connections` within the open-files limit.
fn connection_limits(config: &ServeConfig) -> ConnectionLimits {
    let configured = u64::from(config.http.max_connections);
    let max_connections = match server::open_files_limit() {
        Some(limit) if configured + RESERVED_FILE_DESCRIPTORS > limit => {
            let lowered = limit.saturating_sub(RESERVED_FILE_DESCRIPTORS).max(1);
            tracing::warn!(
                configured,
                open_files_limit = limit,
                lowered,
                "FILAMENT_MAX_CONNECTIONS exceeds the open-files limit (ulimit -n) less 256: lowered"
            );
            lowered
        }
        _ => configured,
    };
    ConnectionLimits {
        read_buffer_bytes: http1_read_buffer_bytes(config.http.max_uri_bytes, config.http.max_header_bytes),
        http1_header_fields_parsed: http1_header_fields_parsed(config.http.max_header_count as usize),
        max_connections: max_connections as usize,
        header_read_timeout: Duration::from_secs(config.http.header_read_timeout_secs),
        idle_timeout: Duration::from_secs(config.http.idle_timeout_secs),
        max_connections_per_peer: config.http.connections.max_connections_per_peer.map(|max| max as usize),
        sending: server::SendLimits {
            max_unsent_bytes: config.http.connections.max_unsent_response_bytes,
            min_rate_bytes_per_sec: config.http.connections.min_send_rate_bytes_per_sec,
            window: Duration::from_secs(config.http.write_timeout_secs),
        },
        shutdown_wait: Duration::from_secs(config.http.shutdown_connection_wait_secs),
        max_header_list_bytes: config.http.max_header_bytes,
    }
}

/// Completes once SIGTERM/SIGINT came and this replica handed its executions over (unready at
/// once, serving as before for `delay`, the hand-over bounded by [`HANDOVER_GRACE`]); the server
/// then stops accepting connections.
async fn hand_over_on_signal(replica: Replica, pipeline: Pipeline, delay: Duration) {
    shutdown_signal().await;
    replica.start_draining();
    tracing::info!(delay_secs = delay.as_secs(), "shutdown: unready; handing executions over");
    tokio::time::sleep(delay).await;
    if tokio::time::timeout(HANDOVER_GRACE, replica.hand_over(&pipeline)).await.is_err() {
        tracing::warn!("shutdown: hand-over still running after the grace period; the rest fails");
    }
}

/// Where other replicas forward to this one: the configured URL, else the listen address when
/// it names a host (not `0.0.0.0` / `::`). `ServeConfig::validate` refused an http:// URL beside
/// TLS: forwarded requests carry the caller's credential, never in clear from a TLS fleet.
fn advertised_url(configured: Option<&str>, listening: std::net::SocketAddr, scheme: &str) -> Option<String> {
    match configured.map(str::trim).filter(|url| !url.is_empty()) {
        Some(url) => Some(url.trim_end_matches('/').to_string()),
        None if listening.ip().is_unspecified() => None,
        None => Some(format!("{scheme}://{listening}")),
    }
}

/// Where BigQuery is: Google's endpoints, or the emulator's when configured.
fn endpoints(config: &ServeConfig) -> Endpoints {
    let infrastructure = &config.infrastructure;
    Endpoints::new(
        infrastructure.bigquery_emulator_host.as_deref(),
        infrastructure.bigquery_storage_emulator_host.as_deref(),
    )
}

/// The certificate to serve HTTPS with, when configured.
fn tls_certificate(config: &ServeConfig) -> anyhow::Result<Option<Arc<ReloadingCertificate>>> {
    let (Some(cert), Some(key)) = (&config.http.tls_cert_file, &config.http.tls_key_file) else { return Ok(None) };
    let files = TlsFiles { cert: cert.clone(), key: key.clone() };
    Ok(Some(ReloadingCertificate::load(files).map_err(anyhow::Error::msg).context("loading the TLS certificate")?))
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = terminate => {},
    }
    tracing::info!("shutdown requested: finishing in-flight requests");
}
