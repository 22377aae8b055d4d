//! Test harness: spawns the real gateway binary against a fresh Postgres database and the
//! bqemulator that `make test` started (`DATABASE_URL`, `BIGQUERY_EMULATOR_HOST`,
//! `BIGQUERY_STORAGE_EMULATOR_HOST`), and gives tests an HTTP client, Arrow builders, a
//! database snapshot (to prove a rejected request changed nothing) and emulator queries.
//!
//! # Which BigQuery stand-in to use
//! - **The shared emulator** (the default: `GatewayOptions::new().spawn()`): anything a user
//!   would see end to end (tables created, rows loaded, MERGE results read back). Where it
//!   differs from BigQuery (`../shared/docs/bqemulator.md`) it is not the judge: SQL goes to
//!   Google's analyzer ([`zetasql`]), request bodies to the discovery document ([`discovery`]).
//! - **A private emulator** ([`emulator`]): a test that may leave it in a bad state (cut
//!   connections mid-append), usually behind the cutting TCP [`proxy`].
//! - **The Storage Write fake** ([`fake_write`]): what the emulator cannot do on demand on the
//!   gRPC side: scripted append faults and quota answers, slow or silent servers, and what was
//!   observed (rows per stream in offset order, requests and connections at once).
//! - **The REST fake** ([`fake_rest`]): chosen REST routes answered with BigQuery's real error
//!   shapes (quota, permission, rate limits), nothing forwarded.
//! - **The REST proxy** ([`rest_proxy`]): the emulator's REST API with every request recorded,
//!   and query jobs taken over when a test needs BigQuery's own answers (409 `duplicate`, a
//!   failed job, jobs that stay RUNNING).
//! - **The control-plane simulation** ([`control_plane`]): many tables at BigQuery's
//!   latencies and limits, with the Storage Write fake set to the same limits; benchmarks and
//!   quota tests, metadata only.

#![allow(dead_code, unreachable_pub)]

pub mod arrow;
pub mod browser;
pub mod control_plane;
pub mod discovery;
pub mod dry_runs;
pub mod emulator;
pub mod emulator_watch;
mod eventually;
pub mod fake_rest;
pub mod fake_write;
pub mod fleet;
mod gateway_calls;
pub mod generated_docs;
mod grpc_inflate;
pub mod jwks;
pub mod lease;
pub mod otlp;
pub mod principals;
pub mod proxy;
pub mod quota_meter;
mod recorded;
pub mod rest_proxy;
pub mod rows;
mod test_run;
pub mod zetasql;

pub use eventually::{eventually, within};
// `benches/ingest.rs` includes this module too and sets up its runs by hand.
#[allow(unused_imports)]
pub use test_run::TestRun;

use std::io::{BufRead as _, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};
use sqlx::{Connection as _, PgConnection};

/// Reads a variable `make test` sets, with a message that says how to run the suite.
pub fn required_env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| {
        panic!("{name} is not set: run the suite with `make test`, which starts Postgres and bqemulator and exports it")
    })
}

/// A port free now, for a process that binds it later (a replica, haproxy, chromedriver, an
/// emulator). Taken below the kernel's ephemeral range (`ip_local_port_range`, 32768 up by
/// default): a port the kernel handed out with `bind(0)` and released can meanwhile become
/// the local port of any test's outgoing connection, and the later bind fails with "Address
/// already in use".
pub fn free_port_for_later_bind() -> u16 {
    let ephemeral_low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    let (low, high) = (10_000u16.min(ephemeral_low / 2), ephemeral_low);
    (0..1000)
        .map(|_| rand::random_range(low..high))
        .find(|port| std::net::TcpListener::bind(("127.0.0.1", *port)).is_ok())
        .expect("a free port below the ephemeral range within 1,000 tries")
}

pub fn random_suffix() -> String {
    hex::encode(rand::random::<[u8; 6]>())
}

fn database_url_for(admin_url: &str, database: &str) -> String {
    let (base, query) = match admin_url.split_once('?') {
        Some((base, query)) => (base, Some(query)),
        None => (admin_url, None),
    };
    let (server, _) = base.rsplit_once('/').expect("DATABASE_URL has a database path");
    match query {
        Some(query) => format!("{server}/{database}?{query}"),
        None => format!("{server}/{database}"),
    }
}

/// An extractor's HTTP client: a request may take 120 s in all.
///
/// Without reqwest's `TCP_USER_TIMEOUT` of 30 s (its default since 0.13; Python's and Go's
/// clients set none): a body the gateway holds unread under backpressure stalls its socket at
/// a zero window, and at K=1024 one stalled longer than 30 s; the kernel then ended the
/// connection with `ETIMEDOUT` though the gateway was answering its probes.
pub fn extractor_http_client() -> reqwest::ClientBuilder {
    reqwest::Client::builder().timeout(Duration::from_secs(120)).tcp_user_timeout(None)
}

/// The harness's HTTP client: plain, or trusting `ca_pem` for a gateway serving HTTPS.
fn http_client(ca_pem: Option<&str>) -> reqwest::Client {
    let mut builder = extractor_http_client();
    if let Some(pem) = ca_pem {
        builder = builder.add_root_certificate(reqwest::Certificate::from_pem(pem.as_bytes()).expect("CA PEM"));
    }
    builder.build().expect("http client")
}

/// Creates `database` on the cluster `admin_url` points at; its URL.
async fn fresh_database(admin_url: &str, database: &str) -> String {
    let mut admin = PgConnection::connect(admin_url).await.expect("connect to the admin database");
    sqlx::query(&format!("CREATE DATABASE {database}")).execute(&mut admin).await.expect("create database");
    database_url_for(admin_url, database)
}

/// The base URL a freshly spawned gateway announces on its first stdout line (within 60 s).
async fn listening_address(child: &mut Child, stderr_path: &std::path::Path) -> String {
    let stdout = child.stdout.take().expect("stdout");
    let first_line = tokio::task::spawn_blocking(move || {
        let mut reader = BufReader::new(stdout);
        let mut line = String::new();
        reader.read_line(&mut line).map(|_| line)
    });
    let log = || std::fs::read_to_string(stderr_path).unwrap_or_default();
    let line = tokio::time::timeout(Duration::from_secs(60), first_line)
        .await
        .unwrap_or_else(|_| panic!("gateway did not start; log: {}", log()))
        .expect("join")
        .expect("read stdout");
    line.trim()
        .strip_prefix("filament-bigquery listening on ")
        .unwrap_or_else(|| panic!("unexpected first line {line:?}; log: {}", log()))
        .to_string()
}

/// A gateway process with its own database; killed on drop.
pub struct Gateway {
    child: Child,
    pub base_url: String,
    pub token: String,
    pub database_url: String,
    pub dataset: String,
    pub project: String,
    pub stderr_path: std::path::PathBuf,
    /// REST `host:port` of the emulator this gateway uses.
    pub emulator_rest: String,
    /// The proxy judging this gateway's REST calls by BigQuery's discovery document (unless
    /// the test pointed them elsewhere).
    pub rest_conformance: Option<rest_proxy::RestProxy>,
    http: reqwest::Client,
    /// This test's use of the shared emulator (which a crash report names), when it uses it.
    _emulator_use: Option<emulator_watch::EmulatorUse>,
}

/// How to spawn a gateway, as a builder:
/// `GatewayOptions::new().fake_write(&fake).env("K", "V").spawn().await`.
/// The fields stay public for `benches/ingest.rs`, which builds the struct directly.
#[derive(Debug, Default, Clone)]
pub struct GatewayOptions {
    /// Extra environment, applied over the defaults `spawn` sets.
    pub env: Vec<(String, String)>,
    /// Reuse an existing database (restart scenarios) instead of creating one.
    pub database_url: Option<String>,
    /// REST calls go straight to the emulator instead of through a proxy that judges each by
    /// BigQuery's discovery document (the benchmark measures without it).
    pub direct_rest: bool,
    /// Real BigQuery in this project, with Application Default Credentials (`make
    /// test-bigquery`), instead of the emulator.
    pub live_bigquery_project: Option<String>,
    /// The CA (PEM) the test's HTTP client trusts, for a gateway serving HTTPS.
    pub trusted_ca_pem: Option<String>,
    /// Another build of the gateway to run instead of this one's (the benchmarks measure the
    /// previous main beside it).
    pub binary: Option<std::path::PathBuf>,
}

impl GatewayOptions {
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets one variable of the gateway's environment; a later value for the same name wins.
    pub fn env(mut self, name: &str, value: &str) -> Self {
        self.env.retain(|(k, _)| k != name);
        self.env.push((name.to_string(), value.to_string()));
        self
    }

    /// BigQuery's REST API (tables, jobs) at `address` instead of the shared emulator's.
    pub fn rest_host(self, address: &str) -> Self {
        self.env("BIGQUERY_EMULATOR_HOST", address)
    }

    /// The Storage Write API at `address` instead of the shared emulator's.
    pub fn storage_write_host(self, address: &str) -> Self {
        self.env("BIGQUERY_STORAGE_EMULATOR_HOST", address)
    }

    /// Appends go to the scriptable Storage Write fake.
    pub fn fake_write(self, fake: &fake_write::FakeWrite) -> Self {
        self.storage_write_host(&fake.address)
    }

    /// REST calls go to the scripted REST fake.
    pub fn fake_rest(self, fake: &fake_rest::FakeRest) -> Self {
        self.rest_host(&fake.address)
    }

    /// REST calls go through the recording proxy (which forwards to the emulator).
    pub fn rest_proxy(self, proxy: &rest_proxy::RestProxy) -> Self {
        self.rest_host(&proxy.address)
    }

    /// The first retry of a failed BigQuery call waits `backoff` (fault tests keep it short).
    pub fn bigquery_initial_backoff(self, backoff: Duration) -> Self {
        self.env("FILAMENT_BIGQUERY_INITIAL_BACKOFF_MS", &backoff.as_millis().to_string())
    }

    /// Real BigQuery in `project` with the caller's Application Default Credentials.
    pub fn live_bigquery(mut self, project: &str) -> Self {
        self.live_bigquery_project = Some(project.to_string());
        self
    }

    /// Reuses the database at `url` (a restart) instead of creating a fresh one.
    /// The harness's client trusts `ca_pem` (a gateway given `FILAMENT_TLS_CERT_FILE`).
    pub fn trusting_ca(mut self, ca_pem: &str) -> Self {
        self.trusted_ca_pem = Some(ca_pem.to_string());
        self
    }

    pub fn database_url(mut self, url: &str) -> Self {
        self.database_url = Some(url.to_string());
        self
    }

    pub async fn spawn(self) -> Gateway {
        Gateway::spawn_with(self).await
    }
}

impl Gateway {
    pub async fn spawn() -> Self {
        GatewayOptions::new().spawn().await
    }

    /// Spawns with `options`; tests write `options.spawn()`, `benches/ingest.rs` calls this.
    pub async fn spawn_with(options: GatewayOptions) -> Self {
        let admin_url = required_env("DATABASE_URL");
        let suffix = random_suffix();
        let database_url = match &options.database_url {
            Some(url) => url.clone(),
            None => fresh_database(&admin_url, &format!("fbq_test_{suffix}")).await,
        };
        let token = format!("test-token-{}", random_suffix());
        let log_dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"));
        let stderr_path = log_dir.join(format!("gateway-{suffix}.log"));
        let stderr = std::fs::File::create(&stderr_path).expect("create log file");
        let binary = options.binary.clone().unwrap_or_else(|| env!("CARGO_BIN_EXE_filament-bigquery").into());
        let mut command = Command::new(binary);
        command
            .arg("serve")
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("FILAMENT_LISTEN", "127.0.0.1:0")
            .env("DATABASE_URL", &database_url)
            .env("FILAMENT_API_TOKENS", &token)
            .env("RUST_LOG", "info,filament_bigquery=debug")
            .stdout(Stdio::piped())
            .stderr(Stdio::from(stderr));
        let emulator_use = match options.live_bigquery_project {
            Some(_) => None,
            None => Some(emulator_watch::EmulatorWatch::shared().use_for_test().await),
        };
        let (project, emulator_rest, rest_conformance) = match &options.live_bigquery_project {
            Some(project) => {
                // Application Default Credentials: a key file, gcloud's, or the metadata server.
                for name in ["GOOGLE_APPLICATION_CREDENTIALS", "HOME", "CLOUDSDK_CONFIG", "GOOGLE_CLOUD_QUOTA_PROJECT"]
                {
                    if let Ok(value) = std::env::var(name) {
                        command.env(name, value);
                    }
                }
                (project.clone(), String::new(), None)
            }
            None => Self::emulated(&mut command, &options).await,
        };
        for (k, v) in &options.env {
            command.env(k, v);
        }
        let mut child = command.spawn().expect("spawn the gateway binary");
        let base_url = listening_address(&mut child, &stderr_path).await;
        Self {
            child,
            base_url,
            token,
            database_url,
            dataset: format!("t_{suffix}"),
            project,
            stderr_path,
            emulator_rest,
            rest_conformance,
            http: http_client(options.trusted_ca_pem.as_deref()),
            _emulator_use: emulator_use,
        }
    }

    /// Points `command` at the emulator `make test` started (its REST calls through a proxy
    /// judging each by BigQuery's discovery document, unless the test chose where they go):
    /// the project, the emulator's REST address for test queries, and the proxy.
    async fn emulated(
        command: &mut Command,
        options: &GatewayOptions,
    ) -> (String, String, Option<rest_proxy::RestProxy>) {
        let rest = required_env("BIGQUERY_EMULATOR_HOST");
        let grpc = required_env("BIGQUERY_STORAGE_EMULATOR_HOST");
        command.env("BIGQUERY_EMULATOR_HOST", &rest).env("BIGQUERY_STORAGE_EMULATOR_HOST", &grpc);
        let rest_chosen = options.env.iter().find(|(k, _)| k == "BIGQUERY_EMULATOR_HOST").map(|(_, v)| v.clone());
        let conformance = match (&rest_chosen, options.direct_rest) {
            (None, false) => Some(rest_proxy::RestProxy::start(&rest).await),
            _ => None,
        };
        if let Some(proxy) = &conformance {
            command.env("BIGQUERY_EMULATOR_HOST", &proxy.address);
        }
        ("filament-demo".into(), rest_chosen.unwrap_or(rest), conformance)
    }

    /// The gateway's process id (benchmarks read its `/proc` accounting).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The gateway's log so far.
    pub fn logs(&self) -> String {
        std::fs::read_to_string(&self.stderr_path).unwrap_or_default()
    }

    /// Sends SIGTERM (without waiting for the exit).
    pub fn signal_terminate(&self) {
        let pid = self.child.id().to_string();
        let status = Command::new("kill").args(["-TERM", &pid]).status().expect("kill");
        assert!(status.success());
    }

    /// Sends SIGTERM and waits for the process to exit.
    pub async fn terminate(&mut self) -> std::process::ExitStatus {
        if self.child.try_wait().expect("wait").is_none() {
            self.signal_terminate();
        }
        let child = &mut self.child;
        eventually(Duration::from_secs(60), "the gateway to exit after SIGTERM", || {
            std::future::ready(child.try_wait().expect("wait"))
        })
        .await
    }

    /// Kills the process abruptly (a crash), keeping its database.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Runs a query on the emulator; rows as arrays of JSON values (strings or nulls).
    pub async fn query(&self, sql: &str) -> Vec<Vec<Value>> {
        bigquery_query_at(&self.emulator_rest, &self.project, sql).await
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub async fn send(request: reqwest::RequestBuilder) -> (StatusCode, Value) {
    let response = request.send().await.expect("request");
    let status = response.status();
    let text = response.text().await.expect("body");
    let value = serde_json::from_str(&text).unwrap_or(Value::String(text));
    (status, value)
}

/// Asserts a problem+json answer with `status` and `code`.
pub fn assert_problem(actual: (StatusCode, Value), status: StatusCode, code: &str) -> Value {
    let (actual_status, body) = actual;
    assert_eq!(actual_status, status, "{body}");
    assert_eq!(body["code"], code, "{body}");
    assert_eq!(body["status"], status.as_u16(), "{body}");
    assert!(body["detail"].as_str().is_some_and(|d| !d.is_empty()), "{body}");
    body
}

/// Queries an emulator through its REST API (jobs.query).
pub async fn bigquery_query_at(host: &str, project: &str, sql: &str) -> Vec<Vec<Value>> {
    let response = reqwest::Client::new()
        .post(format!("http://{host}/bigquery/v2/projects/{project}/queries"))
        .json(&json!({"query": sql, "useLegacySql": false}))
        .timeout(Duration::from_secs(60))
        .send()
        .await
        .expect("query request");
    let status = response.status();
    let body: Value = response.json().await.expect("query response");
    assert!(status.is_success(), "query {sql} failed: {body}");
    body["rows"]
        .as_array()
        .map(|rows| rows.iter().map(|r| r["f"].as_array().unwrap().iter().map(|c| c["v"].clone()).collect()).collect())
        .unwrap_or_default()
}
