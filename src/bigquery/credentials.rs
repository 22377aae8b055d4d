//! Credentials: Application Default Credentials through google-cloud-auth, or anonymous
//! credentials for the emulator. ADC lookup does not fail until a token is fetched, hence
//! [`probe`] at start-up and in `/readyz`.

use google_cloud_auth::credentials::{Builder, CacheableResource, Credentials, anonymous};
use http::{Extensions, HeaderMap};

use super::{BigQueryError, BigQueryResult};

/// BigQuery's OAuth scope (covers the Storage Write API).
const SCOPES: &[&str] = &["https://www.googleapis.com/auth/bigquery"];

/// Anonymous credentials for the emulator, otherwise Application Default Credentials. Fails
/// here only when ADC points at something unusable (for example a missing key file); a missing
/// ADC altogether shows when a token is first fetched ([`probe`]).
pub(crate) fn build(emulator: bool) -> BigQueryResult<Credentials> {
    if emulator {
        return Ok(anonymous::Builder::new().build());
    }
    Builder::default()
        .with_scopes(SCOPES.iter().copied())
        .build()
        .map_err(|e| BigQueryError::Credentials(e.to_string()))
}

/// Authorization headers for one gRPC call (cached and refreshed before expiry by the crate).
pub(crate) async fn headers(credentials: &Credentials) -> BigQueryResult<HeaderMap> {
    match credentials.headers(Extensions::new()).await {
        Ok(CacheableResource::New { data, .. }) => Ok(data),
        Ok(CacheableResource::NotModified) => Ok(HeaderMap::new()),
        Err(e) => Err(BigQueryError::Credentials(e.to_string())),
    }
}

pub(crate) async fn probe(credentials: &Credentials) -> BigQueryResult<()> {
    headers(credentials).await.map(|_| ())
}
