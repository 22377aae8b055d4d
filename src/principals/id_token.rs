//! Google ID tokens as bearer credentials. A bearer value shaped like a JWT ([`looks_like_jwt`])
//! is verified here as an ID token Google signed for this gateway; its verified, lowercased
//! e-mail ([`VerifiedIdentity`]) goes back to `api::auth`, which selects the principal with
//! [`super::PrincipalSet::by_email`]. This module owns the checks and the cache of Google's
//! signing keys (the JWKS); it never logs a token or its claims.
//!
//! The checks: RS256 only, whatever the header asks for; the signature against the key the
//! header's `kid` names in the JWKS; `iss` `accounts.google.com` or
//! `https://accounts.google.com`; `aud` exactly the configured audience; `exp` and `iat` within
//! [`CLOCK_SKEW_LEEWAY_SECS`]; `email_verified` JSON `true`; an `email`. The signature, `exp`,
//! `iss` and `aud` are checked by jsonwebtoken (the maintained JWT crate, over aws-lc-rs like
//! the rest of the gateway's crypto); the stricter shapes of Google's tokens (single-string
//! `iss` and `aud`, `iat`, the e-mail claims) after it.
//!
//! The key set is kept for as long as the JWKS response's `Cache-Control: max-age` says, less
//! its `Age` ([`DEFAULT_JWKS_MAX_AGE`] without one, within [`MIN_JWKS_MAX_AGE`] to
//! [`MAX_JWKS_MAX_AGE`]). Verifications read it without a lock (arc-swap). One fetch runs at a
//! time: its task holds `fetch_lock`. Expired keys stay in use while the refresh runs in the
//! background; only a token whose `kid` is not in the set waits for a fetch, and only when the
//! set is due for a refresh anyway, or the last fetch ended at least
//! [`UNKNOWN_KID_REFETCH_INTERVAL`] ago; otherwise it is refused at once. So forged tokens can
//! make the gateway fetch no more often than `Cache-Control` already does, plus once per 30 s.
//! A failed fetch keeps the keys there were, is logged, and counts as an attempt: the next one
//! is 30 s later.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use arc_swap::ArcSwap;
use jsonwebtoken::errors::{Error as JwtError, ErrorKind};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use reqwest::header::{ACCEPT, HeaderMap};
use serde::Deserialize;
use serde_json::Value;
use tokio::sync::{Mutex, OwnedMutexGuard};

/// Where Google publishes the keys that sign its ID tokens.
pub(crate) const DEFAULT_GOOGLE_JWKS_URL: &str = "https://www.googleapis.com/oauth2/v3/certs";

/// The issuers of Google ID tokens (both forms are in use).
const GOOGLE_ISSUERS: [&str; 2] = ["accounts.google.com", "https://accounts.google.com"];

/// Clock skew allowed on `exp` and `iat`.
pub(crate) const CLOCK_SKEW_LEEWAY_SECS: u64 = 60;

/// A `kid` missing from the cached keys triggers a fetch only this long after the last one
/// ended (unless the keys are due for a refresh anyway); a failed fetch is retried after it too.
pub(crate) const UNKNOWN_KID_REFETCH_INTERVAL: Duration = Duration::from_secs(30);

/// A JWKS fetch, connecting to the last byte of the body, takes at most this long.
const JWKS_FETCH_TIMEOUT: Duration = Duration::from_secs(10);

use super::jwks::{FetchedKeys, JwksFetchError, MAX_JWKS_RESPONSE_BYTES, jwks_max_age, rs256_keys};

/// Google ID token verification, as configured (`FILAMENT_GOOGLE_ID_TOKEN_AUDIENCE`,
/// `FILAMENT_GOOGLE_JWKS_URL`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct IdTokenSettings {
    /// The `aud` a token must carry, exactly.
    pub(crate) audience: String,
    /// Where the signing keys are fetched from ([`DEFAULT_GOOGLE_JWKS_URL`]).
    pub(crate) jwks_url: String,
}

/// Verifies Google ID tokens against a cached copy of Google's keys. Cheap to clone: clones
/// share the cache.
#[derive(Debug, Clone)]
pub(crate) struct IdTokenVerifier {
    inner: Arc<Inner>,
}

/// The identity a verified ID token proves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct VerifiedIdentity {
    /// The token's `email`, lowercased.
    pub(crate) email: String,
    /// When the token expires (`exp`, Unix seconds): a console session it opens ends then.
    pub(crate) expires_at_unix_secs: u64,
}

/// Why a token was refused: never carries the token or its claims beyond what is safe to log.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum IdTokenRejected {
    #[error("the bearer value is not a well-formed JWT")]
    Malformed,
    #[error("the ID token is not signed with RS256")]
    Algorithm,
    #[error("the ID token names a signing key Google does not publish")]
    UnknownKey,
    #[error("the ID token's signature does not verify")]
    Signature,
    #[error("the ID token was not issued by Google")]
    Issuer,
    #[error("the ID token is meant for another audience")]
    Audience,
    #[error("the ID token has expired")]
    Expired,
    #[error("the ID token is issued in the future")]
    IssuedInFuture,
    #[error("the ID token's e-mail is not verified")]
    EmailNotVerified,
    #[error("the ID token carries no e-mail")]
    MissingEmail,
    #[error("Google's signing keys could not be fetched")]
    KeysUnavailable,
}

impl IdTokenRejected {
    /// A stable snake_case name for audit logs and metrics.
    pub(crate) fn reason(self) -> &'static str {
        match self {
            Self::Malformed => "id_token_malformed",
            Self::Algorithm => "id_token_algorithm",
            Self::UnknownKey => "id_token_unknown_key",
            Self::Signature => "id_token_signature",
            Self::Issuer => "id_token_issuer",
            Self::Audience => "id_token_audience",
            Self::Expired => "id_token_expired",
            Self::IssuedInFuture => "id_token_issued_in_future",
            Self::EmailNotVerified => "id_token_email_not_verified",
            Self::MissingEmail => "id_token_missing_email",
            Self::KeysUnavailable => "id_token_keys_unavailable",
        }
    }
}

/// Whether a bearer value has the shape of a JWT (three base64url parts, the header and
/// payload not empty), so it is verified as an ID token rather than looked up as an opaque
/// token. An empty signature counts: `alg: none` tokens are refused as ID tokens.
pub(crate) fn looks_like_jwt(bearer: &str) -> bool {
    let base64url = |part: &str| part.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    let mut parts = bearer.split('.');
    match (parts.next(), parts.next(), parts.next(), parts.next()) {
        (Some(header), Some(payload), Some(signature), None) => {
            // A JSON header (`{"`) always encodes to `eyJ`: opaque tokens with dots stay opaque.
            header.starts_with("eyJ") && !payload.is_empty() && [header, payload, signature].into_iter().all(base64url)
        }
        _ => false,
    }
}

impl IdTokenVerifier {
    pub(crate) fn new(settings: IdTokenSettings, http: reqwest::Client) -> Self {
        Self::with_refetch_interval(settings, http, UNKNOWN_KID_REFETCH_INTERVAL)
    }

    fn with_refetch_interval(settings: IdTokenSettings, http: reqwest::Client, refetch_interval: Duration) -> Self {
        if settings.jwks_url != DEFAULT_GOOGLE_JWKS_URL {
            // Whoever serves these keys can mint tokens for any principal.
            tracing::warn!(jwks_url = %settings.jwks_url, "google id tokens verified against keys from a url other than google's");
        }
        let mut validation = Validation::new(Algorithm::RS256);
        validation.leeway = CLOCK_SKEW_LEEWAY_SECS;
        validation.set_issuer(&GOOGLE_ISSUERS);
        validation.set_audience(&[settings.audience.as_str()]);
        validation.set_required_spec_claims(&["exp", "iss", "aud"]);
        let inner = Inner {
            audience: settings.audience,
            jwks_url: settings.jwks_url,
            validation,
            http,
            keys: ArcSwap::from_pointee(KeySet::default()),
            fetch_lock: Arc::new(Mutex::new(())),
            jwks_fetches: AtomicU64::new(0),
            unknown_kid_refetch_interval: refetch_interval,
        };
        Self { inner: Arc::new(inner) }
    }

    /// The verified identity of a Google ID token, or why it was refused.
    pub(crate) async fn verify(&self, token: &str) -> Result<VerifiedIdentity, IdTokenRejected> {
        if !looks_like_jwt(token) {
            return Err(IdTokenRejected::Malformed);
        }
        let kid = rs256_key_id(token)?;
        let key = self.inner.key_for(&kid).await?;
        let claims = jsonwebtoken::decode::<GoogleIdTokenClaims>(token, &key, &self.inner.validation)
            .map_err(|error| refusal_of(&error))?
            .claims;
        claims.identity(&self.inner.audience, jsonwebtoken::get_current_timestamp())
    }

    /// How many times the key set was fetched (the tests' view of the cache).
    #[cfg(test)]
    pub(crate) fn jwks_fetches(&self) -> u64 {
        self.inner.jwks_fetches.load(Ordering::Relaxed)
    }
}

/// The `kid` of a token whose header asks for RS256.
fn rs256_key_id(token: &str) -> Result<String, IdTokenRejected> {
    let header = jsonwebtoken::decode_header(token).map_err(|error| match error.kind() {
        // Well-formed JSON that is not a header with an algorithm jsonwebtoken knows (`"alg":
        // "none"`, no `alg`): refused for its algorithm.
        ErrorKind::Json(json) if json.classify() == serde_json::error::Category::Data => IdTokenRejected::Algorithm,
        _ => IdTokenRejected::Malformed,
    })?;
    if header.alg != Algorithm::RS256 {
        return Err(IdTokenRejected::Algorithm);
    }
    header.kid.ok_or(IdTokenRejected::Malformed)
}

/// What a jsonwebtoken failure means for the caller.
fn refusal_of(error: &JwtError) -> IdTokenRejected {
    match error.kind() {
        ErrorKind::InvalidSignature | ErrorKind::InvalidRsaKey(_) => IdTokenRejected::Signature,
        ErrorKind::InvalidAlgorithm | ErrorKind::MissingAlgorithm | ErrorKind::UnsupportedAlgorithm => {
            IdTokenRejected::Algorithm
        }
        ErrorKind::ExpiredSignature => IdTokenRejected::Expired,
        ErrorKind::ImmatureSignature => IdTokenRejected::IssuedInFuture,
        ErrorKind::InvalidIssuer => IdTokenRejected::Issuer,
        ErrorKind::InvalidAudience => IdTokenRejected::Audience,
        ErrorKind::MissingRequiredClaim(claim) if claim == "iss" => IdTokenRejected::Issuer,
        ErrorKind::MissingRequiredClaim(claim) if claim == "aud" => IdTokenRejected::Audience,
        _ => IdTokenRejected::Malformed,
    }
}

/// The claims read after jsonwebtoken has checked the signature, `exp`, `iss` and `aud`. Each is
/// taken as any JSON so that a claim of the wrong type is refused for what it is.
#[derive(Debug, Deserialize)]
struct GoogleIdTokenClaims {
    iss: Option<Value>,
    aud: Option<Value>,
    iat: Option<Value>,
    exp: Option<Value>,
    email: Option<Value>,
    email_verified: Option<Value>,
}

impl GoogleIdTokenClaims {
    fn identity(self, audience: &str, now_unix_secs: u64) -> Result<VerifiedIdentity, IdTokenRejected> {
        // jsonwebtoken also takes a list with one matching member; Google sends single strings.
        let issuer = self.iss.as_ref().and_then(Value::as_str);
        if !issuer.is_some_and(|issuer| GOOGLE_ISSUERS.contains(&issuer)) {
            return Err(IdTokenRejected::Issuer);
        }
        if self.aud.as_ref().and_then(Value::as_str) != Some(audience) {
            return Err(IdTokenRejected::Audience);
        }
        let issued_at_unix_secs = self.iat.as_ref().and_then(Value::as_u64).ok_or(IdTokenRejected::Malformed)?;
        if issued_at_unix_secs > now_unix_secs.saturating_add(CLOCK_SKEW_LEEWAY_SECS) {
            return Err(IdTokenRejected::IssuedInFuture);
        }
        let email = self.email.as_ref().and_then(Value::as_str).filter(|email| !email.is_empty());
        let Some(email) = email else { return Err(IdTokenRejected::MissingEmail) };
        // Google sends a JSON boolean; nothing else (not even the string "true") counts.
        if self.email_verified != Some(Value::Bool(true)) {
            return Err(IdTokenRejected::EmailNotVerified);
        }
        let expires_at_unix_secs = self.exp.as_ref().and_then(Value::as_u64).ok_or(IdTokenRejected::Malformed)?;
        Ok(VerifiedIdentity { email: email.to_lowercase(), expires_at_unix_secs })
    }
}

/// The verifier's shared state.
struct Inner {
    audience: String,
    jwks_url: String,
    /// jsonwebtoken's share of the checks: RS256, the signature, `exp`, `iss`, `aud`.
    validation: Validation,
    http: reqwest::Client,
    /// The keys in force, replaced whole by each fetch.
    keys: ArcSwap<KeySet>,
    /// Held by the one task fetching the key set, for the whole fetch.
    fetch_lock: Arc<Mutex<()>>,
    jwks_fetches: AtomicU64,
    unknown_kid_refetch_interval: Duration,
}

impl fmt::Debug for Inner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdTokenVerifier")
            .field("audience", &self.audience)
            .field("jwks_url", &self.jwks_url)
            .field("jwks_fetches", &self.jwks_fetches)
            .finish_non_exhaustive()
    }
}

/// One fetched key set and when it is due for a refresh.
#[derive(Default)]
struct KeySet {
    keys_by_kid: Arc<HashMap<String, Arc<DecodingKey>>>,
    /// From `Cache-Control`, or the retry after a failed fetch; `None`: never fetched.
    refresh_due_at: Option<Instant>,
    /// When the last fetch, successful or not, ended.
    last_fetch_ended_at: Option<Instant>,
}

/// What to do about a token's `kid`.
enum KeyLookup {
    Found {
        key: Arc<DecodingKey>,
        refresh_due: bool,
    },
    /// Wait for a fetch (the one under way, or one this request starts), then look again.
    Fetch,
    Refused(IdTokenRejected),
}

impl KeySet {
    fn lookup(&self, kid: &str, now: Instant, refetch_interval: Duration) -> KeyLookup {
        let refresh_due = self.refresh_due_at.is_none_or(|due_at| now >= due_at);
        if let Some(key) = self.keys_by_kid.get(kid) {
            return KeyLookup::Found { key: Arc::clone(key), refresh_due };
        }
        let refetch_allowed =
            self.last_fetch_ended_at.is_none_or(|ended_at| now.duration_since(ended_at) >= refetch_interval);
        if refresh_due || refetch_allowed { KeyLookup::Fetch } else { KeyLookup::Refused(self.missing_key()) }
    }

    /// Why a `kid` the set does not hold is refused.
    fn missing_key(&self) -> IdTokenRejected {
        if self.keys_by_kid.is_empty() { IdTokenRejected::KeysUnavailable } else { IdTokenRejected::UnknownKey }
    }
}

impl Inner {
    /// The key `kid` names, from the cache when it has it (starting a background refresh when
    /// the cache is due), else after the fetch [`KeySet::lookup`] allows.
    async fn key_for(self: &Arc<Self>, kid: &str) -> Result<Arc<DecodingKey>, IdTokenRejected> {
        match self.keys.load().lookup(kid, Instant::now(), self.unknown_kid_refetch_interval) {
            KeyLookup::Found { key, refresh_due } => {
                if refresh_due {
                    self.refresh_in_background();
                }
                Ok(key)
            }
            KeyLookup::Refused(rejected) => Err(rejected),
            KeyLookup::Fetch => self.fetch_then_lookup(kid).await,
        }
    }

    /// Starts a refresh unless one is under way; the caller goes on with the keys it has.
    fn refresh_in_background(self: &Arc<Self>) {
        let Ok(guard) = Arc::clone(&self.fetch_lock).try_lock_owned() else { return };
        let inner = Arc::clone(self);
        tokio::spawn(async move {
            // Someone may have refreshed between our look and the lock.
            if inner.keys.load().refresh_due_at.is_none_or(|due_at| Instant::now() >= due_at) {
                inner.fetch_and_publish(guard).await;
            }
        });
    }

    /// Waits for the fetch lock, looks again (whoever held it may have fetched what we need or
    /// used up the allowance), and fetches if still allowed.
    async fn fetch_then_lookup(self: &Arc<Self>, kid: &str) -> Result<Arc<DecodingKey>, IdTokenRejected> {
        let guard = Arc::clone(&self.fetch_lock).lock_owned().await;
        match self.keys.load().lookup(kid, Instant::now(), self.unknown_kid_refetch_interval) {
            KeyLookup::Found { key, .. } => return Ok(key),
            KeyLookup::Refused(rejected) => return Err(rejected),
            KeyLookup::Fetch => {}
        }
        // Its own task: a request that gives up (its client went away) does not abandon the
        // fetch half-way, so every fetch started is counted and published.
        let inner = Arc::clone(self);
        let fetch = tokio::spawn(async move { inner.fetch_and_publish(guard).await });
        if fetch.await.is_err() {
            return Err(IdTokenRejected::KeysUnavailable);
        }
        let keys = self.keys.load();
        match keys.lookup(kid, Instant::now(), self.unknown_kid_refetch_interval) {
            KeyLookup::Found { key, .. } => Ok(key),
            KeyLookup::Refused(rejected) => Err(rejected),
            // Just fetched: no second fetch for the same request.
            KeyLookup::Fetch => Err(keys.missing_key()),
        }
    }

    /// Fetches the key set and publishes it; on failure keeps the keys there were and retries
    /// no sooner than the refetch interval. `_guard` is the fetch lock, released at the end.
    async fn fetch_and_publish(&self, _guard: OwnedMutexGuard<()>) {
        self.jwks_fetches.fetch_add(1, Ordering::Relaxed);
        let fetched = self.fetch_keys().await;
        // Freshness counts from the end of the fetch, so a slow answer with a short max-age
        // cannot leave the set due at once (a fetch loop).
        let ended_at = Instant::now();
        let next = match fetched {
            Ok(FetchedKeys { keys_by_kid, max_age }) => KeySet {
                keys_by_kid: Arc::new(keys_by_kid),
                refresh_due_at: Some(ended_at + max_age),
                last_fetch_ended_at: Some(ended_at),
            },
            Err(error) => {
                tracing::warn!(jwks_url = %self.jwks_url, %error, "google jwks fetch failed");
                KeySet {
                    keys_by_kid: Arc::clone(&self.keys.load().keys_by_kid),
                    refresh_due_at: Some(ended_at + self.unknown_kid_refetch_interval),
                    last_fetch_ended_at: Some(ended_at),
                }
            }
        };
        self.keys.store(Arc::new(next));
    }

    async fn fetch_keys(&self) -> Result<FetchedKeys, JwksFetchError> {
        let (headers, body) = self.get_jwks().await?;
        Ok(FetchedKeys { keys_by_kid: rs256_keys(&body)?, max_age: jwks_max_age(&headers) })
    }

    /// The JWKS response's headers and body (at most [`MAX_JWKS_RESPONSE_BYTES`]).
    async fn get_jwks(&self) -> Result<(HeaderMap, Vec<u8>), JwksFetchError> {
        let request = self.http.get(&self.jwks_url).header(ACCEPT, "application/json");
        let mut response = request.timeout(JWKS_FETCH_TIMEOUT).send().await?;
        if !response.status().is_success() {
            return Err(JwksFetchError::Status(response.status()));
        }
        if response.content_length().is_some_and(|length| length > MAX_JWKS_RESPONSE_BYTES as u64) {
            return Err(JwksFetchError::TooLarge);
        }
        let headers = response.headers().clone();
        let mut body = Vec::new();
        while let Some(chunk) = response.chunk().await? {
            if body.len() + chunk.len() > MAX_JWKS_RESPONSE_BYTES {
                return Err(JwksFetchError::TooLarge);
            }
            body.extend_from_slice(&chunk);
        }
        Ok((headers, body))
    }
}

#[cfg(test)]
#[path = "id_token_tests.rs"]
mod tests;
