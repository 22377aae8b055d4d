//! Command-line and environment configuration (clap derive; every flag has an env var).
//!
//! `serve` runs the gateway (and applies migrations first); `migrate` only applies migrations;
//! `openapi` prints the OpenAPI document; `token new` prints a token; `runs ...` is the
//! operator's view over HTTP (`cli`). A leaf: it depends on no other module but `model`'s
//! limits; `app` maps these values onto each part's own settings at start-up.
//!
//! `serve`'s settings come in groups, one file each and one heading each in `--help` (the
//! README and docs/operations.md list them under the same headings): HTTP and hardening
//! (`http`), who may call (`access`), memory and batches (`memory`), Storage Write
//! (`storage_write`), control plane and quotas (`control_plane`), fleet (`fleet`),
//! infrastructure (`infrastructure`). `validate` checks them all at once, before anything
//! starts; `renamed` accepts the old names of renamed settings for one release.

use clap::{Args, Parser, Subcommand};

mod access;
mod connections;
mod control_plane;
mod fairness;
mod fleet;
mod http;
mod infrastructure;
mod memory;
mod quotas;
pub mod renamed;
mod storage_write;
mod validate;
pub use access::AccessArgs;
pub use connections::ConnectionArgs;
pub use control_plane::ControlPlaneArgs;
pub use fairness::FairnessArgs;
pub use fleet::FleetArgs;
pub use http::HttpArgs;
pub use infrastructure::{InfrastructureArgs, LogFormat};
pub use memory::MemoryArgs;
pub use quotas::{QuotaArgs, StreamQuotaReading};
pub use storage_write::StorageWriteArgs;
pub use validate::InvalidSettings;

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

/// `serve`'s settings, by group (each under its own heading in `--help`).
#[derive(Debug, Clone, Args)]
pub struct ServeConfig {
    #[command(flatten, next_help_heading = "HTTP and hardening")]
    pub http: HttpArgs,

    #[command(flatten, next_help_heading = "Who may call")]
    pub access: AccessArgs,

    #[command(flatten, next_help_heading = "Memory and batches")]
    pub memory: MemoryArgs,

    #[command(flatten, next_help_heading = "Storage Write")]
    pub storage_write: StorageWriteArgs,

    #[command(flatten, next_help_heading = "Control plane and quotas")]
    pub control_plane: ControlPlaneArgs,

    #[command(flatten, next_help_heading = "Fleet")]
    pub fleet: FleetArgs,

    #[command(flatten, next_help_heading = "Infrastructure")]
    pub infrastructure: InfrastructureArgs,
}

/// The headings of `serve --help`, in order.
pub const SERVE_HELP_HEADINGS: [&str; 7] = [
    "HTTP and hardening",
    "Who may call",
    "Memory and batches",
    "Storage Write",
    "Control plane and quotas",
    "Fleet",
    "Infrastructure",
];

#[cfg(test)]
mod tests;
