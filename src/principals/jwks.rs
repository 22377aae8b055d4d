//! Google's JWKS documents, read: the RS256 signing keys by `kid` and how long the response may
//! be kept (its `Cache-Control` and `Age`). `id_token` fetches the document and caches what
//! this returns.

use std::collections::HashMap;
use std::error::Error as _;
use std::sync::Arc;
use std::time::Duration;

use jsonwebtoken::DecodingKey;
use reqwest::StatusCode;
use reqwest::header::{AGE, CACHE_CONTROL, HeaderMap};
use serde::Deserialize;
use serde_json::Value;

/// How long keys are kept when the JWKS response has no `max-age`.
pub(super) const DEFAULT_JWKS_MAX_AGE: Duration = Duration::from_secs(5 * 60);
/// Bounds on the `max-age` taken from the response: `no-cache` or `max-age=0` must not make
/// every request a fetch, nor a huge value keep keys Google has withdrawn.
pub(super) const MIN_JWKS_MAX_AGE: Duration = Duration::from_secs(1);
pub(super) const MAX_JWKS_MAX_AGE: Duration = Duration::from_secs(24 * 60 * 60);
/// Google's key set is about 2 KiB; anything past this is not one.
pub(super) const MAX_JWKS_RESPONSE_BYTES: usize = 1024 * 1024;

pub(super) struct FetchedKeys {
    pub(super) keys_by_kid: HashMap<String, Arc<DecodingKey>>,
    pub(super) max_age: Duration,
}

/// Why a JWKS fetch failed (logged, never shown to a caller).
#[derive(Debug, thiserror::Error)]
pub(super) enum JwksFetchError {
    #[error("{}", error_chain(.0))]
    Http(#[from] reqwest::Error),
    #[error("answered {0}")]
    Status(StatusCode),
    #[error("the response is larger than {MAX_JWKS_RESPONSE_BYTES} bytes")]
    TooLarge,
    #[error("the response is not a JWKS: {0}")]
    Json(#[from] serde_json::Error),
    #[error("the key set has no RS256 signing key")]
    NoUsableKeys,
}

/// An error and its sources, `: `-separated (reqwest's own message omits the cause).
fn error_chain(error: &reqwest::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// The JWKS document; entries are read one by one, so one we cannot use does not spoil the rest.
#[derive(Deserialize)]
struct JwksDocument {
    keys: Vec<Value>,
}

/// One RSA key of a JWKS (RFC 7517); other key types lack `n` and `e` and are left out.
#[derive(Deserialize)]
struct RsaJwk {
    kid: String,
    kty: String,
    alg: Option<String>,
    #[serde(rename = "use")]
    key_use: Option<String>,
    n: String,
    e: String,
}

/// The RS256 signing keys of a JWKS document, by `kid`.
pub(super) fn rs256_keys(body: &[u8]) -> Result<HashMap<String, Arc<DecodingKey>>, JwksFetchError> {
    let document: JwksDocument = serde_json::from_slice(body)?;
    let keys: HashMap<_, _> = document
        .keys
        .into_iter()
        .filter_map(|entry| serde_json::from_value::<RsaJwk>(entry).ok())
        .filter(|jwk| {
            jwk.kty == "RSA"
                && jwk.alg.as_deref().is_none_or(|alg| alg == "RS256")
                && jwk.key_use.as_deref().is_none_or(|key_use| key_use == "sig")
        })
        .filter_map(|jwk| {
            let key = DecodingKey::from_rsa_components(&jwk.n, &jwk.e).ok()?;
            Some((jwk.kid, Arc::new(key)))
        })
        .collect();
    if keys.is_empty() { Err(JwksFetchError::NoUsableKeys) } else { Ok(keys) }
}

/// How long a JWKS response may be kept (RFC 9111): its `max-age` (none with `no-cache` or
/// `no-store`) less its `Age`, [`DEFAULT_JWKS_MAX_AGE`] without one, within the bounds.
pub(super) fn jwks_max_age(headers: &HeaderMap) -> Duration {
    let mut max_age = None;
    let mut no_cache = false;
    let directives = headers.get_all(CACHE_CONTROL).iter().filter_map(|value| value.to_str().ok());
    for directive in directives.flat_map(|value| value.split(',')).map(|d| d.trim().to_ascii_lowercase()) {
        if directive == "no-cache" || directive == "no-store" {
            no_cache = true;
        } else if let Some(secs) = directive.strip_prefix("max-age=") {
            max_age = secs.trim_matches('"').parse::<u64>().ok().map(Duration::from_secs).or(max_age);
        }
    }
    let lifetime = if no_cache { Duration::ZERO } else { max_age.unwrap_or(DEFAULT_JWKS_MAX_AGE) };
    let age = headers.get(AGE).and_then(|value| value.to_str().ok()).and_then(|value| value.trim().parse().ok());
    lifetime.saturating_sub(Duration::from_secs(age.unwrap_or(0))).clamp(MIN_JWKS_MAX_AGE, MAX_JWKS_MAX_AGE)
}
