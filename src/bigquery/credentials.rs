//! Credentials: Application Default Credentials through google-cloud-auth, or anonymous
//! credentials for the emulator. ADC lookup does not fail until a token is fetched, hence
//! [`probe`] at start-up, in `/readyz` and before a connection test, each within a deadline.
//! Failures name where ADC looked ([`CredentialSource`]) and keep the fix in the hint.

use std::path::PathBuf;
use std::time::Duration;

use google_cloud_auth::credentials::{Builder, CacheableResource, Credentials, CredentialsProvider, anonymous};
use http::{Extensions, HeaderMap};

use super::{BigQueryError, BigQueryResult};

/// BigQuery's OAuth scope (covers the Storage Write API).
const SCOPES: &[&str] = &["https://www.googleapis.com/auth/bigquery"];

/// Where Application Default Credentials come from, in ADC's order.
#[derive(Debug, Clone)]
pub(crate) enum CredentialSource {
    /// The emulator: anonymous credentials.
    Anonymous,
    /// The key file `GOOGLE_APPLICATION_CREDENTIALS` names.
    KeyFile(PathBuf),
    /// gcloud's application-default credentials file.
    Gcloud(PathBuf),
    /// Neither exists: only the metadata server (GKE Workload Identity, Compute Engine) is
    /// left. `gcloud_path` is where gcloud's file was looked for.
    MetadataServer { gcloud_path: Option<PathBuf> },
}

impl CredentialSource {
    /// The source ADC will use, found the way google-cloud-auth finds it.
    pub(crate) fn detect(emulator: bool) -> Self {
        if emulator {
            return Self::Anonymous;
        }
        if let Some(path) = std::env::var_os("GOOGLE_APPLICATION_CREDENTIALS").filter(|p| !p.is_empty()) {
            return Self::KeyFile(path.into());
        }
        let gcloud_path = std::env::var_os("HOME")
            .map(|home| PathBuf::from(home).join(".config/gcloud/application_default_credentials.json"));
        match gcloud_path {
            Some(path) if path.exists() => Self::Gcloud(path),
            gcloud_path => Self::MetadataServer { gcloud_path },
        }
    }

    /// Why no token could be had from this source: `what` is what went wrong.
    fn failure(&self, what: &str) -> BigQueryError {
        BigQueryError::Credentials(match self {
            Self::Anonymous => format!("anonymous credentials failed: {what}"),
            Self::KeyFile(path) => {
                format!(
                    "could not obtain Google credentials from {} (GOOGLE_APPLICATION_CREDENTIALS): {what}",
                    path.display()
                )
            }
            Self::Gcloud(path) => format!("could not obtain Google credentials from {}: {what}", path.display()),
            Self::MetadataServer { gcloud_path } => {
                let gcloud = gcloud_path.as_ref().map_or_else(
                    || "gcloud's application_default_credentials.json cannot be located (HOME is not set)".to_string(),
                    |path| format!("{} does not exist", path.display()),
                );
                format!(
                    "could not find default credentials: GOOGLE_APPLICATION_CREDENTIALS is not set, {gcloud}, and the metadata server {what}"
                )
            }
        })
    }
}

/// Anonymous credentials for the emulator, otherwise Application Default Credentials. Fails
/// here only when ADC points at something unusable (for example a missing key file); a missing
/// ADC altogether shows when a token is first fetched ([`probe`]).
pub(crate) fn build(source: &CredentialSource) -> BigQueryResult<Credentials> {
    if matches!(source, CredentialSource::Anonymous) {
        return Ok(anonymous::Builder::new().build());
    }
    let adc =
        Builder::default().with_scopes(SCOPES.iter().copied()).build().map_err(|e| source.failure(&e.to_string()))?;
    Ok(Credentials::from(BoundedUniverseDomain { inner: adc, deadline: super::CREDENTIALS_DEADLINE }))
}

/// Authorization headers for one gRPC call (cached and refreshed before expiry by the crate).
pub(crate) async fn headers(credentials: &Credentials) -> BigQueryResult<HeaderMap> {
    match credentials.headers(Extensions::new()).await {
        Ok(CacheableResource::New { data, .. }) => Ok(data),
        Ok(CacheableResource::NotModified) => Ok(HeaderMap::new()),
        Err(e) => Err(BigQueryError::Credentials(format!("could not obtain Google credentials: {e}"))),
    }
}

/// Whether the credentials yield a token within `deadline`, naming the source when not.
pub(crate) async fn probe(
    credentials: &Credentials,
    source: &CredentialSource,
    deadline: Duration,
) -> BigQueryResult<()> {
    match tokio::time::timeout(deadline, credentials.headers(Extensions::new())).await {
        Ok(Ok(_)) => Ok(()),
        // Without any ADC the crate reports the metadata server's absence as "transient
        // errors"; say what it means instead (the raw error goes to the debug log).
        Ok(Err(e)) if matches!(source, CredentialSource::MetadataServer { .. }) => {
            tracing::debug!(error = %e, "metadata server token fetch failed");
            Err(source.failure("did not provide a token"))
        }
        Ok(Err(e)) => Err(source.failure(&format!("failed: {e}"))),
        Err(_) => Err(source.failure(&format!("did not answer within {} s", deadline.as_secs()))),
    }
}

/// ADC credentials whose universe-domain lookup (a metadata-server call the REST clients make
/// when they are built) gives up after a deadline instead of hanging where no metadata server
/// answers; `None` means the default universe (`googleapis.com`, or
/// `GOOGLE_CLOUD_UNIVERSE_DOMAIN`).
#[derive(Debug)]
pub(crate) struct BoundedUniverseDomain {
    pub(crate) inner: Credentials,
    pub(crate) deadline: Duration,
}

impl CredentialsProvider for BoundedUniverseDomain {
    async fn headers(
        &self,
        extensions: Extensions,
    ) -> Result<CacheableResource<HeaderMap>, google_cloud_auth::errors::CredentialsError> {
        self.inner.headers(extensions).await
    }

    async fn universe_domain(&self) -> Option<String> {
        tokio::time::timeout(self.deadline, self.inner.universe_domain()).await.ok().flatten()
    }
}
