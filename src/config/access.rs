//! The "who may call" settings: the principals and their tokens, Google ID tokens, the
//! console's sessions, and the `/metrics` credential (`principals`, `api::auth`).

use clap::Args;

/// Who may call the API, the console and `/metrics`.
#[derive(Debug, Clone, Args)]
pub struct AccessArgs {
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

    /// Where Google's ID-token signing keys are fetched (JWKS): https:// (plain http only to a
    /// loopback address).
    #[arg(long, env = "FILAMENT_GOOGLE_JWKS_URL", default_value = "https://www.googleapis.com/oauth2/v3/certs")]
    pub google_jwks_url: String,

    /// When set, `/metrics` answers only a scraper presenting `Authorization: Bearer <this>`
    /// (at least 16 characters; Prometheus: `authorization: {credentials_file: ...}`); 401
    /// otherwise. Unset, `/metrics` needs no credential (it names no tenant either way).
    #[arg(long, env = "FILAMENT_METRICS_TOKEN", hide_env_values = true)]
    pub metrics_token: Option<String>,

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
}
