//! Wires the gateway together and serves it: connect and migrate Postgres, fail executions a
//! previous process left open, build the BigQuery clients (probing credentials), then serve the
//! router until SIGTERM/SIGINT, letting in-flight requests and commits finish.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use sha2::{Digest as _, Sha256};
use tokio_util::task::TaskTracker;

use crate::api::{ApiSettings, ApiState, router};
use crate::bigquery::{BigQuery, Endpoints};
use crate::config::ServeConfig;
use crate::error::{ErrorCode, Problem};
use crate::pipeline::Pipeline;
use crate::publish::Publisher;
use crate::store::Store;
use crate::telemetry;

/// How long shutdown waits for running commits.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(30);

pub async fn serve(config: ServeConfig) -> anyhow::Result<()> {
    let store = Store::connect(&config.database).await.context("connecting to Postgres")?;
    store.migrate().await.context("applying migrations")?;
    let interrupted = store
        .fail_interrupted_executions(
            &Problem::new(
                ErrorCode::GatewayRestarted,
                "the gateway restarted while this execution was open; its uploads were lost",
            )
            .with_hint("deliver the execution again (POST it with the same execution_id)"),
        )
        .await?;
    if interrupted > 0 {
        tracing::warn!(executions = interrupted, "failed executions left open by a previous process");
    }

    let endpoints = Endpoints::from_config(&config);
    let bigquery =
        BigQuery::connect(endpoints.clone(), config.append_gzip_level).await.context("building BigQuery clients")?;
    if let Err(e) = crate::bigquery::credentials::probe(&bigquery.credentials).await {
        // Not fatal: /readyz reports it, and the fix may be applied without a restart.
        let problem = e.to_problem(ErrorCode::MissingCredentials);
        tracing::error!(detail = %problem.detail, hint = problem.hint.as_deref().unwrap_or(""), "credentials probe failed");
    }

    let mut tokens =
        config.api_tokens.iter().map(|t| t.trim().to_string()).filter(|t| !t.is_empty()).collect::<Vec<_>>();
    let generated_token = if tokens.is_empty() && config.dev_generate_token {
        let token = format!("dev-{}", hex::encode(rand::random::<[u8; 16]>()));
        tokens.push(token.clone());
        Some(token)
    } else {
        None
    };

    let pipeline = Pipeline::new(bigquery.clone(), store.clone(), config.pipeline_limits());
    let publisher = Publisher {
        store: store.clone(),
        bigquery: bigquery.clone(),
        pipeline: pipeline.clone(),
        query_job_timeout: config.query_job_timeout(),
    };
    let commits = TaskTracker::new();
    let state = Arc::new(ApiState {
        store,
        bigquery,
        pipeline,
        publisher,
        settings: ApiSettings {
            max_batch_body_bytes: config.max_batch_body_bytes,
            max_append_request_bytes: config.max_append_request_bytes,
            readiness_project: config.readiness_project.clone(),
            pending_stream_max_age: Duration::from_secs(config.pending_stream_max_age_secs),
            max_uri_bytes: config.max_uri_bytes,
            max_header_bytes: config.max_header_bytes,
        },
        token_digests: tokens.iter().map(|t| Sha256::digest(t.as_bytes()).into()).collect(),
        metrics: telemetry::metrics_handle(),
        commits: commits.clone(),
        request_slots: Arc::new(tokio::sync::Semaphore::new(config.max_concurrent_requests as usize)),
    });

    let listener =
        tokio::net::TcpListener::bind(config.listen).await.with_context(|| format!("binding {}", config.listen))?;
    let address = listener.local_addr()?;
    tracing::info!(%address, emulator = endpoints.emulator, rest = %endpoints.rest, grpc = %endpoints.grpc, "gateway listening");
    // Standard output carries exactly these lines, for scripts and the test harness.
    println!("filament-bigquery listening on http://{address}");
    if let Some(token) = &generated_token {
        println!("development token (pass as Authorization: Bearer <token>): {token}");
    }

    axum::serve(listener, router(state)).with_graceful_shutdown(shutdown_signal()).await?;
    commits.close();
    if tokio::time::timeout(SHUTDOWN_GRACE, commits.wait()).await.is_err() {
        tracing::warn!("shutdown: commits still running after the grace period; they fail on the next start");
    }
    tracing::info!("gateway stopped");
    Ok(())
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
