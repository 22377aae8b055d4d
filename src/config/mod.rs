//! Command-line and environment configuration (clap derive; every flag has an env var).
//!
//! `serve` runs the gateway (and applies migrations first); `migrate` only applies migrations;
//! `openapi` prints the OpenAPI document; `token new` prints a token; `runs ...` is the
//! operator's view over HTTP (`cli`). A leaf: it depends on no other module; `app` maps
//! these values onto each part's own settings at start-up.

use std::net::SocketAddr;

use clap::{Args, Parser, Subcommand, ValueEnum};

mod connections;
mod fairness;
mod quotas;
pub use connections::ConnectionArgs;
pub use fairness::FairnessArgs;
pub use quotas::{QuotaArgs, StreamQuotaReading};

/// filament-bigquery: HTTP ingestion gateway from Arrow IPC into BigQuery.
#[derive(Debug, Parser)]
#[command(name = "filament-bigquery", version, about)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Apply migrations, then serve the HTTP API.
    Serve(Box<ServeConfig>),
    /// Apply the Postgres migrations and exit.
    Migrate(DatabaseConfig),
    /// Print the OpenAPI document (the checked-in `openapi/openapi.json`) and exit.
    Openapi,
    /// Bearer tokens for the principals file.
    #[command(subcommand)]
    Token(TokenCommand),
    /// Look at runs through the HTTP API of any replica: list, show, watch an execution.
    #[command(subcommand)]
    Runs(RunsCommand),
}

/// Where the operator CLI finds the gateway and who it is.
#[derive(Debug, Clone, Args)]
pub struct GatewayConnection {
    /// Base URL of the gateway (any replica, or the load balancer in front of them).
    #[arg(long, env = "FILAMENT_URL", default_value = "http://127.0.0.1:8080")]
    pub url: String,
    /// Bearer token (a principal's, or a Google ID token) sent with each request. Prefer the
    /// environment variable or `--token-file`: a token on the command line shows in `ps` and in
    /// shell history (it still works, with a warning).
    #[arg(long, env = "FILAMENT_TOKEN", hide_env_values = true, required_unless_present = "token_file")]
    pub token: Option<String>,
    /// A file whose first line is the bearer token.
    #[arg(long, env = "FILAMENT_TOKEN_FILE", conflicts_with = "token")]
    pub token_file: Option<std::path::PathBuf>,
}

impl GatewayConnection {
    /// The bearer token: `--token`/`FILAMENT_TOKEN`, or the first line of the token file.
    pub fn bearer(&self) -> Result<String, String> {
        if let Some(token) = &self.token {
            return Ok(token.trim().to_string());
        }
        let path = self.token_file.as_ref().ok_or("set FILAMENT_TOKEN or FILAMENT_TOKEN_FILE")?;
        let text = std::fs::read_to_string(path).map_err(|e| format!("reading {}: {e}", path.display()))?;
        let token = text.lines().next().unwrap_or_default().trim().to_string();
        if token.is_empty() {
            return Err(format!("{} holds no token on its first line", path.display()));
        }
        Ok(token)
    }
}

#[derive(Debug, Subcommand)]
pub enum RunsCommand {
    /// The runs the token may read, newest first (`GET /v1/runs`; every page).
    List {
        #[command(flatten)]
        gateway: GatewayConnection,
        /// Only runs whose latest execution is in this state.
        #[arg(long)]
        state: Option<String>,
        #[arg(long)]
        dataset: Option<String>,
        #[arg(long)]
        principal: Option<String>,
        /// At most this many runs.
        #[arg(long, default_value_t = 50)]
        limit: usize,
        /// Print the API's JSON (one array of runs) instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// One run: its resources and executions (`GET /v1/runs/{run}`).
    Show {
        #[command(flatten)]
        gateway: GatewayConnection,
        run: String,
        #[arg(long)]
        json: bool,
    },
    /// An execution's timeline (`GET .../events`); with `--follow`, new events as they come
    /// until the execution ends.
    Events {
        #[command(flatten)]
        gateway: GatewayConnection,
        run: String,
        execution: String,
        #[arg(long)]
        follow: bool,
        /// Print each event as the API's JSON, one per line.
        #[arg(long)]
        json: bool,
    },
    /// An execution's progress per resource until it ends: exit 0 when committed, 1 when
    /// failed or aborted (its code and hint printed).
    Watch {
        #[command(flatten)]
        gateway: GatewayConnection,
        run: String,
        execution: String,
        /// Seconds between two looks.
        #[arg(long, default_value_t = 2)]
        interval_secs: u64,
    },
}

#[derive(Debug, Subcommand)]
pub enum TokenCommand {
    /// Print a new random token and the `token_sha256` line to add to the principal's entry.
    New {
        /// The principal the token is for (printed with the line, to paste in the right place).
        #[arg(long)]
        principal: String,
    },
}

#[derive(Debug, Clone, Args)]
pub struct DatabaseConfig {
    /// Postgres connection URL holding runs, executions, batches and publications.
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    pub database_url: String,

    /// Maximum number of pooled Postgres connections.
    #[arg(long, env = "FILAMENT_DATABASE_MAX_CONNECTIONS", default_value_t = 16)]
    pub database_max_connections: u32,
}

#[derive(Debug, Clone, Args)]
pub struct ServeConfig {
    /// Address the HTTP API listens on (`127.0.0.1:0` picks a free port; the bound address is
    /// printed on standard output).
    #[arg(long, env = "FILAMENT_LISTEN", default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,

    #[command(flatten)]
    pub database: DatabaseConfig,

    /// Bearer tokens accepted on `/v1`, comma-separated.
    #[arg(long = "api-tokens", env = "FILAMENT_API_TOKENS", value_delimiter = ',', hide_env_values = true)]
    pub api_tokens: Vec<String>,

    /// A TOML file of principals (`[[principal]]` tables: name, token_sha256, destinations,
    /// actions, shares; see docs/security.md), reloaded when it changes and on SIGHUP.
    #[arg(long, env = "FILAMENT_PRINCIPALS_FILE")]
    pub principals_file: Option<std::path::PathBuf>,

    /// With it, a bearer JWT is verified as a Google-signed ID token for exactly this audience
    /// (Workload Identity); its `email` selects the principal (`google_service_accounts`).
    #[arg(long, env = "FILAMENT_GOOGLE_ID_TOKEN_AUDIENCE")]
    pub google_id_token_audience: Option<String>,

    /// Where Google's ID-token signing keys are fetched (JWKS).
    #[arg(long, env = "FILAMENT_GOOGLE_JWKS_URL", default_value = "https://www.googleapis.com/oauth2/v3/certs")]
    pub google_jwks_url: String,

    /// Serve HTTPS with this PEM certificate chain (with `FILAMENT_TLS_KEY_FILE`); a replaced
    /// file is picked up for new connections.
    #[arg(long, env = "FILAMENT_TLS_CERT_FILE")]
    pub tls_cert_file: Option<std::path::PathBuf>,

    /// The PEM private key of `FILAMENT_TLS_CERT_FILE`.
    #[arg(long, env = "FILAMENT_TLS_KEY_FILE")]
    pub tls_key_file: Option<std::path::PathBuf>,

    /// PEM certificates trusted when forwarding to another replica over HTTPS (default: the
    /// public web roots).
    #[arg(long, env = "FILAMENT_FORWARD_CA_FILE")]
    pub forward_ca_file: Option<std::path::PathBuf>,

    /// A file of at least 32 secret bytes the console's session cookies are signed with (by a
    /// key derived from it). Replicas behind one address share it, so a session opened on one
    /// is honoured by all; without it each process signs with a random key of its own.
    #[arg(long, env = "FILAMENT_CONSOLE_SESSION_KEY_FILE")]
    pub console_session_key_file: Option<std::path::PathBuf>,

    /// How long a console session lasts after sign-in.
    #[arg(long, env = "FILAMENT_CONSOLE_SESSION_SECS", default_value_t = 28_800,
        value_parser = clap::value_parser!(u64).range(60..=2_592_000))]
    pub console_session_secs: u64,

    /// Development only: with no token and no principals file configured, generate a token of
    /// the `default` principal (every action, every destination) and print it at start-up
    /// instead of refusing to start. Refused beside `FILAMENT_API_TOKENS` or a principals file.
    #[arg(long, env = "FILAMENT_DEV_GENERATE_TOKEN", default_value_t = false)]
    pub dev_generate_token: bool,

    /// REST `host:port` of a BigQuery emulator (plain HTTP, anonymous credentials).
    #[arg(long, env = "BIGQUERY_EMULATOR_HOST")]
    pub bigquery_emulator_host: Option<String>,

    /// gRPC `host:port` of the emulator's Storage Write API (plain HTTP/2, anonymous).
    #[arg(long, env = "BIGQUERY_STORAGE_EMULATOR_HOST")]
    pub bigquery_storage_emulator_host: Option<String>,

    /// Largest accepted batch body, after content decoding, and largest size of its Arrow buffers
    /// once decompressed (IPC buffer compression) (413 `payload_too_large` beyond). An answer
    /// given before a body was read waits until up to this many more bytes are read and discarded.
    #[arg(long, env = "FILAMENT_MAX_BATCH_BODY_BYTES", default_value_t = 64 * 1024 * 1024)]
    pub max_batch_body_bytes: usize,

    /// Largest uncompressed Arrow payload of one AppendRows request (BigQuery's hard limit is
    /// 10 MB per request; this leaves room for the request's own framing).
    #[arg(long, env = "FILAMENT_MAX_APPEND_REQUEST_BYTES", default_value_t = 8 * 1024 * 1024)]
    pub max_append_request_bytes: usize,

    /// Queued plus in-flight encoded upload payloads, gateway-wide. When full, batch requests
    /// wait up to `backpressure_wait_ms`, then answer 429 `backpressure`.
    #[arg(long, env = "FILAMENT_MAX_BUFFERED_BYTES", default_value_t = 64 * 1024 * 1024)]
    pub max_buffered_bytes: usize,

    /// One resource's part of the upload budget (per execution), so that a table BigQuery
    /// acknowledges slowly cannot take the whole budget from the others. Default: half of it.
    #[arg(long, env = "FILAMENT_MAX_BUFFERED_BYTES_PER_RESOURCE")]
    pub max_buffered_bytes_per_resource: Option<usize>,

    /// Batch bodies converted and encoded at once, gateway-wide (read bodies beyond it wait):
    /// conversion is CPU-bound, more would not go faster. Default: the number of CPUs (at
    /// least 2). What a conversion allocates is held in the upload budget first.
    #[arg(long, env = "FILAMENT_MAX_CONCURRENT_BATCH_DECODES", value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub max_concurrent_batch_decodes: Option<u32>,

    /// Bytes of batch bodies being received and decoded at once, gateway-wide, counting what
    /// their IPC-compressed buffers decompress to: bounds the memory of bodies not yet in the
    /// upload budget (a request waits for room, then 429 `backpressure`). A slow client holds
    /// only what it has sent. Default: twice `FILAMENT_MAX_BATCH_BODY_BYTES`.
    #[arg(long, env = "FILAMENT_MAX_RECEIVING_BYTES")]
    pub max_receiving_bytes: Option<usize>,

    /// Request bodies (batches and JSON alike) get this many seconds at first, plus one per
    /// `FILAMENT_BODY_MIN_RATE_BYTES_PER_SEC` bytes received; only the time spent waiting for
    /// the client counts. A slower body ends with 408 `body_timeout`.
    #[arg(long, env = "FILAMENT_BODY_READ_TIMEOUT_SECS", default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub body_read_timeout_secs: u64,

    /// The minimum rate of a request body, in bytes per second (see
    /// `FILAMENT_BODY_READ_TIMEOUT_SECS`).
    #[arg(long, env = "FILAMENT_BODY_MIN_RATE_BYTES_PER_SEC", default_value_t = 16 * 1024, value_parser = clap::value_parser!(u64).range(1..))]
    pub body_min_rate_bytes_per_sec: u64,

    /// The longest a request body may take in all, in seconds, from its first byte (408
    /// `body_timeout` beyond).
    #[arg(long, env = "FILAMENT_BODY_MAX_READ_SECS", default_value_t = 600, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub body_max_read_secs: u64,

    /// How long a batch request waits for room in the upload budget before answering 429.
    #[arg(long, env = "FILAMENT_BACKPRESSURE_WAIT_MS", default_value_t = 10_000)]
    pub backpressure_wait_ms: u64,

    /// Outstanding AppendRows requests per stream (a sliding window).
    #[arg(long, env = "FILAMENT_INFLIGHT_PER_STREAM", default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub inflight_per_stream: u32,

    /// Outstanding AppendRows requests across the gateway.
    #[arg(long, env = "FILAMENT_MAX_INFLIGHT_REQUESTS", default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub max_inflight_requests: u32,

    /// AppendRows connections this replica keeps open at once. BigQuery allows 10,000
    /// concurrent connections per project in a multi-region and 1,000 in a region; a lane
    /// beyond it waits for a connection another lane gives back (lanes give theirs back once
    /// idle). Across a fleet, keep the replicas' sum under the project's limit.
    #[arg(long, env = "FILAMENT_MAX_APPEND_CONNECTIONS", default_value_t = 1_000, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub max_append_connections: u32,

    /// Seconds an idle AppendRows connection is kept open while no other lane waits for a
    /// place under `FILAMENT_MAX_APPEND_CONNECTIONS` (one that does makes an idle connection
    /// give its place back at once). BigQuery advises connections that live for minutes.
    #[arg(long, env = "FILAMENT_APPEND_CONNECTION_IDLE_SECS", default_value_t = 300, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub append_connection_idle_secs: u64,

    /// The most resources creating their tables and stream at once, per destination project and
    /// location (the product's eight by default; docs/operations.md has a "many tables" profile that raises it). Within
    /// it the gateway finds the concurrency BigQuery allows (adaptive, shrinking on pushback,
    /// never above this).
    #[arg(long, env = "FILAMENT_MAX_CONCURRENT_PREPARES", default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=256))]
    pub max_concurrent_prepares: u32,

    /// The most destination tables publishing at once (one query job per resource), and
    /// streams finalized and committed at once, per commit; publication jobs per job project
    /// and location (the product's eight by default; docs/operations.md has a "many tables"
    /// profile that raises it). Within it the gateway finds the concurrency BigQuery allows (adaptive, shrinking on
    /// pushback or queueing, never above this). A commit of K tables publishes in about K / the
    /// reached concurrency job durations.
    #[arg(long, env = "FILAMENT_MAX_CONCURRENT_PUBLICATIONS", default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=256))]
    pub max_concurrent_publications: u32,

    /// gzip level of AppendRows requests (ISA-L): 1 (fastest, the default: ISA-L level 1), 2 to 9
    /// (smaller: ISA-L's smallest, level 3), 0 to send them uncompressed.
    #[arg(long, env = "FILAMENT_APPEND_GZIP_LEVEL", default_value_t = 1, value_parser = clap::value_parser!(u32).range(0..=9))]
    pub append_gzip_level: u32,

    /// Attempts per AppendRows request (first included) before the execution fails.
    #[arg(long, env = "FILAMENT_APPEND_MAX_ATTEMPTS", default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub append_max_attempts: u32,

    /// First retry delay of a failed append, in milliseconds (doubles per attempt, with jitter).
    #[arg(long, env = "FILAMENT_APPEND_INITIAL_BACKOFF_MS", default_value_t = 200)]
    pub append_initial_backoff_ms: u64,

    /// How long the oldest AppendRows request in flight waits for its answer, in seconds,
    /// before its connection counts as broken: it is replaced and the requests after the last
    /// acknowledgement are sent again at their offsets (a connection that stays open but never
    /// answers would otherwise hold the lane, and its execution's commit, for ever). The wait
    /// counts from when the request is handed to the connection, so it includes sending the
    /// requests queued before it: keep it well above `FILAMENT_MAX_INFLIGHT_REQUESTS` x the
    /// request size / the uplink's bandwidth (8 x 8 MiB at 10 MB/s: 7 s).
    #[arg(long, env = "FILAMENT_APPEND_RESPONSE_TIMEOUT_SECS", default_value_t = 300, value_parser = clap::value_parser!(u64).range(1..))]
    pub append_response_timeout_secs: u64,

    /// How long an AppendRows request may wait, in seconds, for its connection to start sending
    /// it (HTTP/2 flow control holds requests while the peer reads nothing) before the
    /// connection counts as broken: it is replaced and its requests replayed at the same
    /// offsets. Keep it above `FILAMENT_INFLIGHT_PER_STREAM` x the request size / the uplink's
    /// bandwidth per stream.
    #[arg(long, env = "FILAMENT_APPEND_SEND_TIMEOUT_SECS", default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..))]
    pub append_send_timeout_secs: u64,

    /// How long an AppendRows `RESOURCE_EXHAUSTED` (BigQuery's Storage Write quota, which can
    /// take minutes to refill) is waited out, in seconds, keeping the stream, before the
    /// execution fails with `quota_exceeded`. Meanwhile the budget fills and batches get 429.
    #[arg(long, env = "FILAMENT_QUOTA_WAIT_SECS", default_value_t = 900)]
    pub quota_wait_secs: u64,

    /// BigQuery's rate quotas the fleet paces by.
    #[command(flatten)]
    pub quotas: QuotaArgs,

    /// Per-principal caps.
    #[command(flatten)]
    pub fairness: FairnessArgs,

    /// Refuse to commit an execution whose oldest PENDING stream is older than this (BigQuery
    /// garbage-collects uncommitted streams after about 24 hours).
    #[arg(long, env = "FILAMENT_PENDING_STREAM_MAX_AGE_SECS", default_value_t = 23 * 3600)]
    pub pending_stream_max_age_secs: u64,

    /// Requests served at once; beyond it requests are shed with 503 `overloaded` (and
    /// `Retry-After`) instead of queueing without bound.
    #[arg(long, env = "FILAMENT_MAX_CONCURRENT_REQUESTS", default_value_t = 2048, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub max_concurrent_requests: u32,

    /// Client connections served at once, each one file descriptor; beyond it the gateway stops
    /// accepting and new connections wait in the kernel's listen backlog. Above the requests
    /// served at once (an HTTP/1.1 connection carries one at a time) and below the open-files
    /// limit: the gateway lowers it to that limit less 256 descriptors (Postgres, BigQuery,
    /// files) when `ulimit -n` is smaller.
    #[arg(long, env = "FILAMENT_MAX_CONNECTIONS", default_value_t = 2048, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub max_connections: u32,

    /// How long a connection may take to send a complete request head once its first byte
    /// arrived, in seconds; slower, it is closed (a slowloris client holds a connection no
    /// longer than this).
    #[arg(long, env = "FILAMENT_HEADER_READ_TIMEOUT_SECS", default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub header_read_timeout_secs: u64,

    /// How long a connection with no request open and none started stays open, in seconds
    /// (HTTP/1.1 keep-alive and HTTP/2 alike).
    #[arg(long, env = "FILAMENT_IDLE_TIMEOUT_SECS", default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub idle_timeout_secs: u64,

    /// When set, `/metrics` answers only a scraper presenting `Authorization: Bearer <this>`
    /// (at least 16 characters; Prometheus: `authorization: {credentials_file: ...}`); 401
    /// otherwise. Unset, `/metrics` needs no credential (it names no tenant either way).
    #[arg(long, env = "FILAMENT_METRICS_TOKEN", hide_env_values = true)]
    pub metrics_token: Option<String>,

    /// The gateway sits behind a TLS-terminating load balancer (clients reach it over HTTPS):
    /// console cookies are `Secure` and `__Host-` prefixed and answers carry HSTS, as when it
    /// serves HTTPS itself.
    #[arg(long, env = "FILAMENT_BEHIND_TLS", default_value_t = false)]
    pub behind_tls: bool,

    /// The window, in seconds, over which a connection with answers to send must send them at
    /// `FILAMENT_MIN_SEND_RATE_BYTES_PER_SEC` (or all it held unsent when the window opened, if
    /// less); slower, or with a response body HTTP/2 does not ask for during a window (a peer
    /// whose flow-control window stays at zero), it is closed. A client that stops reading, or
    /// reads a byte now and then, holds a connection for about this long.
    #[arg(long, env = "FILAMENT_WRITE_TIMEOUT_SECS", default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub write_timeout_secs: u64,

    /// What a client connection's answers may hold and how fast they leave; peers' caps.
    #[command(flatten)]
    pub connections: ConnectionArgs,

    /// On shutdown, how long open connections may take to finish their requests once no new
    /// one is accepted, in seconds; the rest are closed.
    #[arg(long, env = "FILAMENT_SHUTDOWN_CONNECTION_WAIT_SECS", default_value_t = 30, value_parser = clap::value_parser!(u64).range(0..=3600))]
    pub shutdown_connection_wait_secs: u64,

    /// Longest accepted request URI, in bytes (414 `uri_too_long` beyond).
    #[arg(long, env = "FILAMENT_MAX_URI_BYTES", default_value_t = 4096)]
    pub max_uri_bytes: usize,

    /// Largest accepted total of request header names and values, in bytes (431
    /// `headers_too_large` beyond).
    #[arg(long, env = "FILAMENT_MAX_HEADER_BYTES", default_value_t = 16 * 1024)]
    pub max_header_bytes: usize,

    /// Most header fields a request may carry (431 `headers_too_large` beyond).
    #[arg(long, env = "FILAMENT_MAX_HEADER_COUNT", default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub max_header_count: u32,

    /// Project used by `/readyz` to check that the BigQuery REST API answers.
    #[arg(long, env = "FILAMENT_READINESS_PROJECT", default_value = "filament-readiness")]
    pub readiness_project: String,

    /// A file of at least 32 secret bytes that job-id tags are keyed with (HMAC-SHA256), so no
    /// one can predict the gateway's next job id. Unset: the fleet's key kept in Postgres
    /// (`job_id_keys`, generated by the first replica). Replicas share it; rotate by replacing
    /// the file and restarting them (docs/operations.md).
    #[arg(long, env = "FILAMENT_JOB_ID_KEY_FILE")]
    pub job_id_key_file: Option<std::path::PathBuf>,

    /// How long a publication query job may run before the execution fails.
    #[arg(long, env = "FILAMENT_QUERY_JOB_TIMEOUT_SECS", default_value_t = 3600, value_parser = clap::value_parser!(u64).range(1..))]
    pub query_job_timeout_secs: u64,

    /// How long a replica's claim on the executions it serves lasts without renewal (renewed
    /// every third of it): an execution whose replica crashed fails this long after.
    #[arg(long, env = "FILAMENT_REPLICA_LEASE_SECS", default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub replica_lease_secs: u64,

    /// Where the other replicas reach this one to forward the requests of executions it serves
    /// (e.g. `http://$(POD_IP):8080`). Unset: the listen address when it names a host, else no
    /// forwarding (other replicas answer 503 `execution_owned_elsewhere` instead).
    #[arg(long, env = "FILAMENT_ADVERTISE_URL")]
    pub advertise_url: Option<String>,

    /// On SIGTERM, how long the replica keeps serving as before while reporting itself unready,
    /// so load balancers stop sending it new requests before it hands its executions over.
    #[arg(long, env = "FILAMENT_SHUTDOWN_DELAY_SECS", default_value_t = 0, value_parser = clap::value_parser!(u64).range(0..=600))]
    pub shutdown_delay_secs: u64,

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

impl ServeConfig {
    /// Checks what clap cannot: consistent emulator settings and usable tokens.
    pub fn validate(&self) -> Result<(), String> {
        let given = |host: &Option<String>| host.as_deref().is_some_and(|h| !h.is_empty());
        if given(&self.bigquery_emulator_host) != given(&self.bigquery_storage_emulator_host) {
            return Err("set both BIGQUERY_EMULATOR_HOST and BIGQUERY_STORAGE_EMULATOR_HOST, or neither".into());
        }
        if self.metrics_token.as_deref().is_some_and(|token| token.trim().len() < 16) {
            return Err("FILAMENT_METRICS_TOKEN must be at least 16 characters long".into());
        }
        if self.api_tokens.iter().any(|t| t.trim().len() < 16) {
            return Err("every API token must be at least 16 characters long".into());
        }
        // A generated token is the all-powerful `default` principal's: never beside real ones.
        if self.dev_generate_token && (!self.api_tokens.is_empty() || self.principals_file.is_some()) {
            return Err("--dev-generate-token (FILAMENT_DEV_GENERATE_TOKEN) is for local development only: it is \
                 refused when FILAMENT_API_TOKENS or FILAMENT_PRINCIPALS_FILE is set"
                .into());
        }
        if self.api_tokens.is_empty() && self.principals_file.is_none() && !self.dev_generate_token {
            return Err("no API token configured: set FILAMENT_API_TOKENS or FILAMENT_PRINCIPALS_FILE (or pass \
                 --dev-generate-token for local development)"
                .into());
        }
        if self.tls_cert_file.is_some() != self.tls_key_file.is_some() {
            return Err("set both FILAMENT_TLS_CERT_FILE and FILAMENT_TLS_KEY_FILE, or neither".into());
        }
        if self.google_id_token_audience.as_deref().is_some_and(|audience| audience.trim().is_empty()) {
            return Err("FILAMENT_GOOGLE_ID_TOKEN_AUDIENCE is empty".into());
        }
        Ok(())
    }
}
