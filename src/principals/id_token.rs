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

    /// How many times the key set was fetched (for tests and a metric).
    #[allow(dead_code, reason = "read by the tests until a metric in `telemetry` reports it")]
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
mod tests {
    use std::sync::Mutex as StdMutex;

    use reqwest::StatusCode;
    use reqwest::header::CACHE_CONTROL;

    use super::super::jwks::{DEFAULT_JWKS_MAX_AGE, MAX_JWKS_MAX_AGE, MIN_JWKS_MAX_AGE};
    use std::sync::atomic::AtomicU16;

    use aws_lc_rs::rand::SystemRandom;
    use aws_lc_rs::rsa::{KeyPair, KeySize};
    use aws_lc_rs::signature::{KeyPair as _, RSA_PKCS1_SHA256};
    use axum::extract::State;
    use axum::response::{IntoResponse as _, Response};
    use base64::Engine as _;
    use base64::engine::general_purpose::URL_SAFE_NO_PAD;
    use futures::future::join_all;
    use reqwest::header::{CONTENT_TYPE, HeaderName, HeaderValue};
    use serde_json::json;
    use tokio::sync::watch;

    use super::*;

    const AUDIENCE: &str = "https://gateway.example.com";
    const EMAIL: &str = "loader@acme-prod.iam.gserviceaccount.com";

    fn b64(bytes: impl AsRef<[u8]>) -> String {
        URL_SAFE_NO_PAD.encode(bytes)
    }

    fn now_unix_secs() -> i64 {
        jsonwebtoken::get_current_timestamp() as i64
    }

    /// An RSA signing key made in the test, published the way Google publishes its keys.
    struct SigningKey {
        kid: String,
        key_pair: KeyPair,
    }

    impl SigningKey {
        fn generate(kid: &str) -> Self {
            Self { kid: kid.to_string(), key_pair: KeyPair::generate(KeySize::Rsa2048).unwrap() }
        }

        fn jwk(&self) -> Value {
            let public = self.key_pair.public_key();
            json!({
                "kty": "RSA", "alg": "RS256", "use": "sig", "kid": self.kid,
                "n": b64(public.modulus().big_endian_without_leading_zero()),
                "e": b64(public.exponent().big_endian_without_leading_zero()),
            })
        }

        /// A JWS over `header` and `claims` with RS256 (aws-lc-rs directly: jsonwebtoken's
        /// `EncodingKey::from_rsa_der` wants PKCS#1, and aws-lc-rs exports PKCS#8 only).
        fn sign(&self, header: &Value, claims: &Value) -> String {
            let message = format!("{}.{}", b64(header.to_string()), b64(claims.to_string()));
            let mut signature = vec![0; self.key_pair.public_modulus_len()];
            self.key_pair.sign(&RSA_PKCS1_SHA256, &SystemRandom::new(), message.as_bytes(), &mut signature).unwrap();
            format!("{message}.{}", b64(signature))
        }

        fn token(&self, claims: &Value) -> String {
            self.sign(&json!({"alg": "RS256", "kid": self.kid, "typ": "JWT"}), claims)
        }
    }

    fn valid_claims() -> Value {
        let now = now_unix_secs();
        json!({
            "iss": "https://accounts.google.com", "aud": AUDIENCE, "azp": "1234567890", "sub": "1234567890",
            "email": EMAIL, "email_verified": true, "iat": now, "exp": now + 3600,
        })
    }

    /// Valid claims with `changes` applied (a `null` removes the claim).
    fn claims_with(changes: Value) -> Value {
        let mut claims = valid_claims();
        for (name, value) in changes.as_object().unwrap() {
            match value {
                Value::Null => claims.as_object_mut().unwrap().remove(name),
                value => claims.as_object_mut().unwrap().insert(name.clone(), value.clone()),
            };
        }
        claims
    }

    /// A token naming `kid` with a signature nobody made (never checked: the key is unknown).
    fn forged_token(kid: &str) -> String {
        let header = json!({"alg": "RS256", "kid": kid});
        format!("{}.{}.{}", b64(header.to_string()), b64(valid_claims().to_string()), b64([7u8; 256]))
    }

    fn jwks_document(keys: &[&SigningKey]) -> Value {
        json!({"keys": keys.iter().map(|key| key.jwk()).collect::<Vec<_>>()})
    }

    /// Google's JWKS endpoint on loopback: serves the document and `Cache-Control` it is given,
    /// counts requests, and can hold its answers (a slow Google) or fail them.
    struct FakeJwks {
        url: String,
        state: Arc<FakeJwksState>,
    }

    struct FakeJwksState {
        document: StdMutex<Value>,
        cache_control: StdMutex<String>,
        status: AtomicU16,
        requests: AtomicU64,
        held: watch::Sender<bool>,
    }

    async fn serve_jwks(State(state): State<Arc<FakeJwksState>>) -> Response {
        state.requests.fetch_add(1, Ordering::SeqCst);
        let _ = state.held.subscribe().wait_for(|held| !*held).await;
        let status = StatusCode::from_u16(state.status.load(Ordering::SeqCst)).unwrap();
        let cache_control = state.cache_control.lock().unwrap().clone();
        let body = state.document.lock().unwrap().to_string();
        (status, [(CACHE_CONTROL, cache_control), (CONTENT_TYPE, "application/json".to_string())], body).into_response()
    }

    impl FakeJwks {
        async fn start(keys: &[&SigningKey], cache_control: &str) -> Self {
            let state = Arc::new(FakeJwksState {
                document: StdMutex::new(jwks_document(keys)),
                cache_control: StdMutex::new(cache_control.to_string()),
                status: AtomicU16::new(200),
                requests: AtomicU64::new(0),
                held: watch::channel(false).0,
            });
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let url = format!("http://{}/oauth2/v3/certs", listener.local_addr().unwrap());
            let router = axum::Router::new()
                .route("/oauth2/v3/certs", axum::routing::get(serve_jwks))
                .with_state(Arc::clone(&state));
            tokio::spawn(async move { axum::serve(listener, router).await });
            Self { url, state }
        }

        fn verifier(&self) -> IdTokenVerifier {
            self.verifier_with_interval(UNKNOWN_KID_REFETCH_INTERVAL)
        }

        fn verifier_with_interval(&self, refetch_interval: Duration) -> IdTokenVerifier {
            let settings = IdTokenSettings { audience: AUDIENCE.to_string(), jwks_url: self.url.clone() };
            IdTokenVerifier::with_refetch_interval(settings, reqwest::Client::new(), refetch_interval)
        }

        fn publish(&self, document: Value) {
            *self.state.document.lock().unwrap() = document;
        }

        fn set_cache_control(&self, cache_control: &str) {
            *self.state.cache_control.lock().unwrap() = cache_control.to_string();
        }

        fn answer_with(&self, status: u16) {
            self.state.status.store(status, Ordering::SeqCst);
        }

        fn hold(&self, held: bool) {
            self.state.held.send_replace(held);
        }

        fn requests(&self) -> u64 {
            self.state.requests.load(Ordering::SeqCst)
        }
    }

    /// Verifies every token concurrently, each in its own task.
    async fn verify_all(
        verifier: &IdTokenVerifier,
        tokens: Vec<String>,
    ) -> Vec<Result<VerifiedIdentity, IdTokenRejected>> {
        let tasks = tokens.into_iter().map(|token| {
            let verifier = verifier.clone();
            tokio::spawn(async move { verifier.verify(&token).await })
        });
        join_all(tasks).await.into_iter().map(Result::unwrap).collect()
    }

    /// Polls `condition` every 10 ms for up to 10 s.
    async fn eventually(what: &str, condition: impl Fn() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !condition() {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    async fn refusal(verifier: &IdTokenVerifier, token: &str) -> IdTokenRejected {
        verifier.verify(token).await.expect_err("the token must be refused")
    }

    #[tokio::test]
    async fn a_valid_token_verifies_to_its_lowercased_email() {
        let key = SigningKey::generate("key-1");
        let jwks = FakeJwks::start(&[&key], "public, max-age=3600").await;
        let verifier = jwks.verifier();
        let mixed_case = key.token(&claims_with(json!({"email": "Loader@ACME-prod.iam.gserviceaccount.com"})));
        let verified = verifier.verify(&mixed_case).await.expect("verified");
        assert_eq!(verified.email, EMAIL);
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
        assert!(verified.expires_at_unix_secs.abs_diff(now + 3600) <= 5, "its exp: {verified:?}");
        let short_issuer = key.token(&claims_with(json!({"iss": "accounts.google.com"})));
        assert!(verifier.verify(&short_issuer).await.is_ok());
        assert_eq!((verifier.jwks_fetches(), jwks.requests()), (1, 1), "one fetch, then the cache");
    }

    #[tokio::test]
    async fn the_audience_must_be_ours_and_the_issuer_googles() {
        let key = SigningKey::generate("key-1");
        let jwks = FakeJwks::start(&[&key], "max-age=3600").await;
        let verifier = jwks.verifier();
        for (changes, expected) in [
            (json!({"aud": "https://other.example.com"}), IdTokenRejected::Audience),
            (json!({"aud": [AUDIENCE]}), IdTokenRejected::Audience),
            (json!({"aud": [AUDIENCE, "https://other.example.com"]}), IdTokenRejected::Audience),
            (json!({"aud": null}), IdTokenRejected::Audience),
            (json!({"iss": "https://evil.example.com"}), IdTokenRejected::Issuer),
            (json!({"iss": "https://accounts.google.com/"}), IdTokenRejected::Issuer),
            (json!({"iss": ["https://accounts.google.com"]}), IdTokenRejected::Issuer),
            (json!({"iss": "https://cloud.google.com/iap"}), IdTokenRejected::Issuer),
            (json!({"iss": null}), IdTokenRejected::Issuer),
        ] {
            assert_eq!(refusal(&verifier, &key.token(&claims_with(changes.clone()))).await, expected, "{changes}");
        }
    }

    #[tokio::test]
    async fn expiry_and_issue_time_allow_sixty_seconds_of_skew() {
        let key = SigningKey::generate("key-1");
        let jwks = FakeJwks::start(&[&key], "max-age=3600").await;
        let verifier = jwks.verifier();
        let now = now_unix_secs();
        for changes in [json!({"exp": now - 30}), json!({"iat": now + 30})] {
            assert!(verifier.verify(&key.token(&claims_with(changes.clone()))).await.is_ok(), "{changes}");
        }
        for (changes, expected) in [
            (json!({"exp": now - 120, "iat": now - 3720}), IdTokenRejected::Expired),
            (json!({"iat": now + 120}), IdTokenRejected::IssuedInFuture),
            (json!({"exp": null}), IdTokenRejected::Malformed),
            (json!({"exp": "tomorrow"}), IdTokenRejected::Malformed),
            (json!({"iat": null}), IdTokenRejected::Malformed),
        ] {
            assert_eq!(refusal(&verifier, &key.token(&claims_with(changes.clone()))).await, expected, "{changes}");
        }
    }

    #[tokio::test]
    async fn only_rs256_is_accepted_whatever_the_header_asks() {
        let key = SigningKey::generate("key-1");
        let jwks = FakeJwks::start(&[&key], "max-age=3600").await;
        let verifier = jwks.verifier();
        let claims = valid_claims();
        let none = format!("{}.{}.", b64(json!({"alg": "none", "kid": key.kid}).to_string()), b64(claims.to_string()));
        assert_eq!(refusal(&verifier, &none).await, IdTokenRejected::Algorithm);
        let mut hs256 = jsonwebtoken::Header::new(Algorithm::HS256);
        hs256.kid = Some(key.kid.clone());
        let secret = jsonwebtoken::EncodingKey::from_secret(b"a shared secret nobody should have");
        assert_eq!(
            refusal(&verifier, &jsonwebtoken::encode(&hs256, &claims, &secret).unwrap()).await,
            IdTokenRejected::Algorithm
        );
        // The classic confusion: HMAC keyed with the public key the verifier holds.
        let modulus = key.key_pair.public_key().modulus().big_endian_without_leading_zero().to_vec();
        let confused =
            jsonwebtoken::encode(&hs256, &claims, &jsonwebtoken::EncodingKey::from_secret(&modulus)).unwrap();
        assert_eq!(refusal(&verifier, &confused).await, IdTokenRejected::Algorithm);
        let rs384 = key.sign(&json!({"alg": "RS384", "kid": key.kid}), &claims);
        assert_eq!(refusal(&verifier, &rs384).await, IdTokenRejected::Algorithm);
        let no_kid = key.sign(&json!({"alg": "RS256"}), &claims);
        assert_eq!(refusal(&verifier, &no_kid).await, IdTokenRejected::Malformed);
        let impostor = SigningKey { kid: key.kid.clone(), key_pair: KeyPair::generate(KeySize::Rsa2048).unwrap() };
        assert_eq!(refusal(&verifier, &impostor.token(&claims)).await, IdTokenRejected::Signature);
        let token = key.token(&claims);
        let (signed, signature) = token.rsplit_once('.').unwrap();
        let (header, _) = signed.split_once('.').unwrap();
        let altered =
            format!("{header}.{}.{signature}", b64(claims_with(json!({"email": "root@evil.com"})).to_string()));
        assert_eq!(refusal(&verifier, &altered).await, IdTokenRejected::Signature);
        assert!(verifier.verify(&token).await.is_ok());
    }

    #[tokio::test]
    async fn the_email_must_be_present_and_verified() {
        let key = SigningKey::generate("key-1");
        let jwks = FakeJwks::start(&[&key], "max-age=3600").await;
        let verifier = jwks.verifier();
        for (changes, expected) in [
            (json!({"email_verified": false}), IdTokenRejected::EmailNotVerified),
            (json!({"email_verified": "true"}), IdTokenRejected::EmailNotVerified),
            (json!({"email_verified": null}), IdTokenRejected::EmailNotVerified),
            (json!({"email": null}), IdTokenRejected::MissingEmail),
            (json!({"email": ""}), IdTokenRejected::MissingEmail),
            (json!({"email": 42}), IdTokenRejected::MissingEmail),
        ] {
            assert_eq!(refusal(&verifier, &key.token(&claims_with(changes.clone()))).await, expected, "{changes}");
        }
    }

    #[tokio::test]
    async fn bearer_values_that_are_not_jwts_are_malformed_and_fetch_nothing() {
        assert!(looks_like_jwt("eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiIxIn0.c2ln"));
        assert!(looks_like_jwt("eyJhbGciOiJub25lIn0.eyJzdWIiOiIxIn0."));
        for opaque in ["fbq_0123456789abcdef", "a.b", "a.b.c.d", ".b.c", "a..c", "a.b.c d", "a.b+c.d", "", "a=.b.c"] {
            assert!(!looks_like_jwt(opaque), "{opaque:?}");
        }
        let jwks = FakeJwks::start(&[], "max-age=3600").await;
        let verifier = jwks.verifier();
        for malformed in ["fbq_0123456789abcdef", "abc.def.ghi", "e30.e30", "eyJhbGciOi.e30.e30"] {
            assert_eq!(refusal(&verifier, malformed).await, IdTokenRejected::Malformed, "{malformed}");
        }
        // `{"x":1}` as the header: valid JSON naming no algorithm.
        assert_eq!(refusal(&verifier, "eyJ4IjoxfQ.e30.e30").await, IdTokenRejected::Algorithm);
        assert_eq!(jwks.requests(), 0);
    }

    #[tokio::test]
    async fn an_unknown_kid_is_refused_without_a_fetch_within_the_interval() {
        let key = SigningKey::generate("key-1");
        let jwks = FakeJwks::start(&[&key], "max-age=3600").await;
        let verifier = jwks.verifier();
        assert!(verifier.verify(&key.token(&valid_claims())).await.is_ok());
        let unpublished = SigningKey::generate("key-unpublished");
        assert_eq!(refusal(&verifier, &unpublished.token(&valid_claims())).await, IdTokenRejected::UnknownKey);
        assert_eq!((verifier.jwks_fetches(), jwks.requests()), (1, 1));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_thousand_unknown_kids_fetch_nothing_within_thirty_seconds() {
        let key = SigningKey::generate("key-1");
        let jwks = FakeJwks::start(&[&key], "max-age=3600").await;
        let verifier = jwks.verifier();
        assert!(verifier.verify(&key.token(&valid_claims())).await.is_ok());
        let forged = (0..1000).map(|n| forged_token(&format!("forged-{n}"))).collect();
        let results = verify_all(&verifier, forged).await;
        assert!(results.iter().all(|result| *result == Err(IdTokenRejected::UnknownKey)));
        assert_eq!((verifier.jwks_fetches(), jwks.requests()), (1, 1));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn unknown_kids_share_one_fetch_per_interval() {
        let key = SigningKey::generate("key-1");
        let jwks = FakeJwks::start(&[&key], "max-age=3600").await;
        let interval = Duration::from_secs(3);
        let verifier = jwks.verifier_with_interval(interval);
        let flood = |round: usize| (0..1000).map(|n| forged_token(&format!("forged-{round}-{n}"))).collect::<Vec<_>>();
        // Before any keys: the whole flood waits for one fetch.
        assert!(verify_all(&verifier, flood(0)).await.iter().all(|r| *r == Err(IdTokenRejected::UnknownKey)));
        assert_eq!(jwks.requests(), 1);
        assert!(verify_all(&verifier, flood(1)).await.iter().all(|r| *r == Err(IdTokenRejected::UnknownKey)));
        assert_eq!(jwks.requests(), 1, "within the interval");
        tokio::time::sleep(interval + Duration::from_millis(200)).await;
        assert!(verify_all(&verifier, flood(2)).await.iter().all(|r| *r == Err(IdTokenRejected::UnknownKey)));
        assert!(verify_all(&verifier, flood(3)).await.iter().all(|r| *r == Err(IdTokenRejected::UnknownKey)));
        assert_eq!((verifier.jwks_fetches(), jwks.requests()), (2, 2), "one more fetch after the interval");
    }

    /// Rotation as Google does it, seen when the cached set expires: the new key is published
    /// beside the old one and tokens signed with either arrive at once.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn two_hundred_tokens_during_a_key_rotation_all_verify() {
        let old = SigningKey::generate("key-old");
        let jwks = FakeJwks::start(&[&old], "public, max-age=1").await;
        let verifier = jwks.verifier();
        assert!(verifier.verify(&old.token(&valid_claims())).await.is_ok());
        let new = SigningKey::generate("key-new");
        jwks.publish(jwks_document(&[&new, &old]));
        jwks.set_cache_control("public, max-age=3600");
        tokio::time::sleep(Duration::from_millis(1200)).await;
        let tokens = (0..200).map(|n| if n % 4 == 3 { &old } else { &new }).map(|key| key.token(&valid_claims()));
        let results = verify_all(&verifier, tokens.collect()).await;
        assert!(results.iter().all(Result::is_ok), "{:?}", results.iter().find(|r| r.is_err()));
        assert_eq!((verifier.jwks_fetches(), jwks.requests()), (2, 2));
    }

    /// Rotation seen through the unknown-kid refetch (the cached set still fresh), and the old
    /// key withdrawn.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_new_kid_after_the_interval_is_fetched_once_for_all() {
        let old = SigningKey::generate("key-old");
        let jwks = FakeJwks::start(&[&old], "public, max-age=3600").await;
        let interval = Duration::from_secs(1);
        let verifier = jwks.verifier_with_interval(interval);
        assert!(verifier.verify(&old.token(&valid_claims())).await.is_ok());
        let new = SigningKey::generate("key-new");
        jwks.publish(jwks_document(&[&new]));
        tokio::time::sleep(interval + Duration::from_millis(200)).await;
        let results = verify_all(&verifier, (0..200).map(|_| new.token(&valid_claims())).collect()).await;
        assert!(results.iter().all(Result::is_ok), "{:?}", results.iter().find(|r| r.is_err()));
        assert_eq!(refusal(&verifier, &old.token(&valid_claims())).await, IdTokenRejected::UnknownKey);
        assert_eq!((verifier.jwks_fetches(), jwks.requests()), (2, 2));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn expired_keys_keep_serving_while_one_refresh_runs() {
        let key = SigningKey::generate("key-1");
        let jwks = FakeJwks::start(&[&key], "public, max-age=1").await;
        let verifier = jwks.verifier();
        assert!(verifier.verify(&key.token(&valid_claims())).await.is_ok());
        jwks.set_cache_control("public, max-age=3600");
        jwks.hold(true);
        tokio::time::sleep(Duration::from_millis(1200)).await;
        let tokens = || (0..50).map(|_| key.token(&valid_claims())).collect::<Vec<_>>();
        let results = tokio::time::timeout(Duration::from_secs(5), verify_all(&verifier, tokens()))
            .await
            .expect("verifications with a known kid must not wait for the refresh");
        assert!(results.iter().all(Result::is_ok));
        eventually("the refresh to reach the server", || jwks.requests() == 2).await;
        assert!(verify_all(&verifier, tokens()).await.iter().all(Result::is_ok));
        assert_eq!((verifier.jwks_fetches(), jwks.requests()), (2, 2), "one refresh at a time");
        jwks.hold(false);
        let refreshed = || verifier.inner.keys.load().refresh_due_at.is_some_and(|due| due > Instant::now());
        eventually("the refreshed keys", refreshed).await;
        assert!(verifier.verify(&key.token(&valid_claims())).await.is_ok());
        assert_eq!((verifier.jwks_fetches(), jwks.requests()), (2, 2));
    }

    #[tokio::test]
    async fn a_failed_fetch_without_keys_refuses_and_counts_as_an_attempt() {
        let key = SigningKey::generate("key-1");
        let jwks = FakeJwks::start(&[&key], "max-age=3600").await;
        jwks.answer_with(500);
        let interval = Duration::from_secs(1);
        let verifier = jwks.verifier_with_interval(interval);
        let token = key.token(&valid_claims());
        assert_eq!(refusal(&verifier, &token).await, IdTokenRejected::KeysUnavailable);
        assert_eq!(refusal(&verifier, &token).await, IdTokenRejected::KeysUnavailable);
        assert_eq!(jwks.requests(), 1, "the failure counts as an attempt");
        jwks.answer_with(200);
        tokio::time::sleep(interval + Duration::from_millis(200)).await;
        assert!(verifier.verify(&token).await.is_ok());
        assert_eq!((verifier.jwks_fetches(), jwks.requests()), (2, 2));
    }

    #[tokio::test]
    async fn a_failed_refresh_keeps_the_keys_there_were() {
        let key = SigningKey::generate("key-1");
        let jwks = FakeJwks::start(&[&key], "max-age=1").await;
        let verifier = jwks.verifier_with_interval(Duration::from_secs(3));
        assert!(verifier.verify(&key.token(&valid_claims())).await.is_ok());
        jwks.answer_with(503);
        tokio::time::sleep(Duration::from_millis(1200)).await;
        assert!(verifier.verify(&key.token(&valid_claims())).await.is_ok(), "stale keys serve");
        eventually("the failed refresh", || {
            verifier.inner.keys.load().refresh_due_at.is_some_and(|due| due > Instant::now())
        })
        .await;
        for _ in 0..20 {
            assert!(verifier.verify(&key.token(&valid_claims())).await.is_ok());
        }
        assert_eq!(jwks.requests(), 2, "no retry before the interval");
    }

    #[tokio::test]
    async fn an_unreachable_oversized_or_unusable_jwks_gives_keys_unavailable() {
        let key = SigningKey::generate("key-1");
        let token = key.token(&valid_claims());
        let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap().local_addr().unwrap();
        let settings = IdTokenSettings { audience: AUDIENCE.to_string(), jwks_url: format!("http://{closed}/certs") };
        let unreachable = IdTokenVerifier::new(settings, reqwest::Client::new());
        assert_eq!(refusal(&unreachable, &token).await, IdTokenRejected::KeysUnavailable);
        let padding = "x".repeat(MAX_JWKS_RESPONSE_BYTES);
        let oversized = json!({"keys": [key.jwk()], "padding": padding});
        let ec_only = json!({"keys": [{"kty": "EC", "kid": "key-1", "crv": "P-256", "x": "AA", "y": "AA"}]});
        for document in [oversized, ec_only, json!({"not": "a jwks"})] {
            let jwks = FakeJwks::start(&[], "max-age=3600").await;
            jwks.publish(document);
            assert_eq!(refusal(&jwks.verifier(), &token).await, IdTokenRejected::KeysUnavailable);
            assert_eq!(jwks.requests(), 1);
        }
    }

    #[test]
    fn only_rs256_signing_keys_are_taken_from_a_jwks() {
        let key = SigningKey::generate("key-1");
        let with = |changes: Value| {
            let mut jwk = key.jwk();
            for (name, value) in changes.as_object().unwrap() {
                jwk.as_object_mut().unwrap().insert(name.clone(), value.clone());
            }
            jwk
        };
        let document = json!({"keys": [
            key.jwk(),
            with(json!({"kid": "no-alg", "alg": null, "use": null})),
            with(json!({"kid": "rs512", "alg": "RS512"})),
            with(json!({"kid": "for-encryption", "use": "enc"})),
            with(json!({"kid": "bad-modulus", "n": "!!"})),
            with(json!({"kid": 7})),
            {"kty": "EC", "kid": "ec", "crv": "P-256", "x": "AA", "y": "AA"},
        ]});
        let keys = rs256_keys(document.to_string().as_bytes()).unwrap();
        let mut kids: Vec<&str> = keys.keys().map(String::as_str).collect();
        kids.sort_unstable();
        assert_eq!(kids, ["key-1", "no-alg"]);
        assert!(matches!(rs256_keys(b"{\"keys\": []}"), Err(JwksFetchError::NoUsableKeys)));
        assert!(matches!(rs256_keys(b"<html>"), Err(JwksFetchError::Json(_))));
    }

    #[test]
    fn cache_control_sets_how_long_keys_are_kept() {
        let max_age = |headers: &[(&'static str, &str)]| {
            let mut map = HeaderMap::new();
            for (name, value) in headers {
                map.append(HeaderName::from_static(name), HeaderValue::from_str(value).unwrap());
            }
            jwks_max_age(&map)
        };
        let secs = Duration::from_secs;
        assert_eq!(max_age(&[]), DEFAULT_JWKS_MAX_AGE);
        assert_eq!(max_age(&[("cache-control", "public, max-age=19528, must-revalidate, no-transform")]), secs(19528));
        assert_eq!(max_age(&[("cache-control", "Public, Max-Age=600"), ("age", "100")]), secs(500));
        assert_eq!(max_age(&[("cache-control", "public"), ("cache-control", "max-age=60")]), secs(60));
        assert_eq!(max_age(&[("cache-control", "max-age=60"), ("age", "600")]), MIN_JWKS_MAX_AGE);
        assert_eq!(max_age(&[("cache-control", "max-age=0")]), MIN_JWKS_MAX_AGE);
        assert_eq!(max_age(&[("cache-control", "no-cache, max-age=600")]), MIN_JWKS_MAX_AGE);
        assert_eq!(max_age(&[("cache-control", "no-store")]), MIN_JWKS_MAX_AGE);
        assert_eq!(max_age(&[("cache-control", "max-age=99999999999")]), MAX_JWKS_MAX_AGE);
        assert_eq!(max_age(&[("cache-control", "max-age=soon")]), DEFAULT_JWKS_MAX_AGE);
    }

    #[test]
    fn an_unknown_kid_fetches_only_when_the_keys_are_due_or_after_the_interval() {
        let start = Instant::now();
        let secs = Duration::from_secs;
        let key = Arc::new(DecodingKey::from_rsa_components("AQAB", "AQAB").unwrap());
        let fetched = KeySet {
            keys_by_kid: Arc::new(HashMap::from([("key-1".to_string(), key)])),
            refresh_due_at: Some(start + secs(300)),
            last_fetch_ended_at: Some(start),
        };
        let lookup =
            |set: &KeySet, kid: &str, after: Duration| set.lookup(kid, start + after, UNKNOWN_KID_REFETCH_INTERVAL);
        assert!(matches!(lookup(&fetched, "key-1", secs(10)), KeyLookup::Found { refresh_due: false, .. }));
        assert!(matches!(lookup(&fetched, "key-1", secs(300)), KeyLookup::Found { refresh_due: true, .. }));
        assert!(matches!(lookup(&fetched, "other", secs(29)), KeyLookup::Refused(IdTokenRejected::UnknownKey)));
        assert!(matches!(lookup(&fetched, "other", secs(30)), KeyLookup::Fetch));
        assert!(matches!(lookup(&KeySet::default(), "key-1", secs(0)), KeyLookup::Fetch), "never fetched");
        let failed = KeySet {
            keys_by_kid: Arc::default(),
            refresh_due_at: Some(start + UNKNOWN_KID_REFETCH_INTERVAL),
            last_fetch_ended_at: Some(start),
        };
        assert!(matches!(lookup(&failed, "key-1", secs(29)), KeyLookup::Refused(IdTokenRejected::KeysUnavailable)));
        assert!(matches!(lookup(&failed, "key-1", secs(30)), KeyLookup::Fetch));
    }

    #[test]
    fn refusal_reasons_are_stable_and_distinct() {
        use IdTokenRejected as R;
        let all = [
            R::Malformed,
            R::Algorithm,
            R::UnknownKey,
            R::Signature,
            R::Issuer,
            R::Audience,
            R::Expired,
            R::IssuedInFuture,
            R::EmailNotVerified,
            R::MissingEmail,
            R::KeysUnavailable,
        ];
        let reasons: std::collections::HashSet<&str> = all.iter().map(|r| r.reason()).collect();
        assert_eq!(reasons.len(), all.len());
        assert!(
            reasons
                .iter()
                .all(|r| r.starts_with("id_token_") && r.bytes().all(|b| b.is_ascii_lowercase() || b == b'_'))
        );
        assert_eq!(R::Expired.reason(), "id_token_expired");
    }
}
