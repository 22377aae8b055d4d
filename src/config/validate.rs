//! The one validation step of `serve`'s settings: every check clap's parsers cannot make,
//! run once before anything starts, reporting every invalid setting at once, each by its
//! environment variable.

use super::ServeConfig;
use crate::model::MAX_APPEND_PAYLOAD_BYTES;

/// Smallest accepted `FILAMENT_MAX_APPEND_REQUEST_BYTES`.
const MIN_APPEND_REQUEST_BYTES: usize = 64 * 1024;

/// Shortest accepted API or metrics token.
const MIN_TOKEN_CHARS: usize = 16;

/// Every invalid setting found, each naming its environment variable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidSettings(pub Vec<String>);

impl std::fmt::Display for InvalidSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "invalid configuration: {}", self.0.join("; "))
    }
}

impl std::error::Error for InvalidSettings {}

impl ServeConfig {
    /// Checks what clap cannot (consistent pairs, usable tokens and URLs, limits within
    /// BigQuery's), every group at once.
    pub fn validate(&self) -> Result<(), InvalidSettings> {
        let mut problems = Vec::new();
        self.check_access(&mut problems);
        self.check_transport(&mut problems);
        self.check_storage_write(&mut problems);
        let price = self.control_plane.on_demand_price_per_tib_usd;
        if !(price.is_finite() && price >= 0.0) {
            problems.push(format!(
                "FILAMENT_ON_DEMAND_PRICE_PER_TIB_USD must be a number of dollars, 0 or more (got {price})"
            ));
        }
        if problems.is_empty() { Ok(()) } else { Err(InvalidSettings(problems)) }
    }

    /// Who may call: tokens, the development token, Google ID tokens.
    fn check_access(&self, problems: &mut Vec<String>) {
        let access = &self.access;
        if access.metrics_token.as_deref().is_some_and(|token| token.trim().len() < MIN_TOKEN_CHARS) {
            problems.push("FILAMENT_METRICS_TOKEN must be at least 16 characters long".into());
        }
        if access.api_tokens.iter().any(|t| t.trim().len() < MIN_TOKEN_CHARS) {
            problems.push("every API token (FILAMENT_API_TOKENS) must be at least 16 characters long".into());
        }
        // A generated token is the all-powerful `default` principal's: never beside real ones.
        if access.dev_generate_token && (!access.api_tokens.is_empty() || access.principals_file.is_some()) {
            problems.push(
                "--dev-generate-token (FILAMENT_DEV_GENERATE_TOKEN) is for local development only: it is \
                 refused when FILAMENT_API_TOKENS or FILAMENT_PRINCIPALS_FILE is set"
                    .into(),
            );
        }
        if access.api_tokens.is_empty() && access.principals_file.is_none() && !access.dev_generate_token {
            problems.push(
                "no API token configured: set FILAMENT_API_TOKENS or FILAMENT_PRINCIPALS_FILE (or pass \
                 --dev-generate-token for local development)"
                    .into(),
            );
        }
        if access.google_id_token_audience.as_deref().is_some_and(|audience| audience.trim().is_empty()) {
            problems.push("FILAMENT_GOOGLE_ID_TOKEN_AUDIENCE is empty".into());
        }
        if access.google_id_token_audience.is_some() {
            problems.extend(jwks_url_problem(&access.google_jwks_url));
        }
    }

    /// Pairs that go together: TLS certificate and key, the emulator's two hosts; no forwarding
    /// in clear from a gateway serving HTTPS.
    fn check_transport(&self, problems: &mut Vec<String>) {
        let given = |host: &Option<String>| host.as_deref().is_some_and(|h| !h.is_empty());
        let infrastructure = &self.infrastructure;
        if given(&infrastructure.bigquery_emulator_host) != given(&infrastructure.bigquery_storage_emulator_host) {
            problems.push("set both BIGQUERY_EMULATOR_HOST and BIGQUERY_STORAGE_EMULATOR_HOST, or neither".into());
        }
        if self.http.tls_cert_file.is_some() != self.http.tls_key_file.is_some() {
            problems.push("set both FILAMENT_TLS_CERT_FILE and FILAMENT_TLS_KEY_FILE, or neither".into());
        }
        let advertised = self.fleet.advertise_url.as_deref().map(str::trim).unwrap_or_default();
        if self.http.tls_cert_file.is_some() && advertised.to_ascii_lowercase().starts_with("http://") {
            // Forwarded requests carry the caller's credential: never in clear from a TLS fleet.
            problems.push(
                "FILAMENT_ADVERTISE_URL is http:// while the gateway serves HTTPS: advertise its https:// URL".into(),
            );
        }
    }

    /// AppendRows requests within BigQuery's limit.
    fn check_storage_write(&self, problems: &mut Vec<String>) {
        let bytes = self.storage_write.max_append_request_bytes;
        if !(MIN_APPEND_REQUEST_BYTES..=MAX_APPEND_PAYLOAD_BYTES).contains(&bytes) {
            problems.push("FILAMENT_MAX_APPEND_REQUEST_BYTES must be between 64 KiB and 19 MiB".into());
        }
    }
}

/// Google's signing keys are fetched over HTTPS only (plain HTTP to a loopback address, for
/// tests and local development): whoever could answer the fetch could mint identities.
fn jwks_url_problem(url: &str) -> Option<String> {
    let Ok(jwks_url) = reqwest::Url::parse(url) else {
        return Some(format!("FILAMENT_GOOGLE_JWKS_URL {url:?} is not a URL"));
    };
    let host = jwks_url.host_str().unwrap_or_default().trim_start_matches('[').trim_end_matches(']');
    let loopback = host == "localhost" || host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback());
    let allowed = jwks_url.scheme() == "https" || (jwks_url.scheme() == "http" && loopback);
    (!allowed).then(|| "FILAMENT_GOOGLE_JWKS_URL must be https:// (plain http only to a loopback address)".into())
}
