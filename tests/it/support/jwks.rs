//! Google's JWKS endpoint on loopback, for the ID-token tests: serves the public halves of RSA
//! keys made in the test with the `Cache-Control: max-age` the test sets, counts fetches, rotates
//! keys, and mints tokens signed by them, valid or invalid in each way the gateway must refuse.
//! Point the gateway at it with `FILAMENT_GOOGLE_JWKS_URL` = [`JwksServer::url`].
//!
//! The gateway keeps a key set for its `max-age` and refetches for an unknown `kid` at most once
//! per 30 s. To show it a rotation within a test, serve `max-age=1` until its first fetch
//! ([`JwksServer::set_max_age_secs`]), then [`JwksServer::rotate`], set a long max-age again and
//! wait just over a second: the next token with the new `kid` waits for the one refresh.

use std::sync::atomic::{AtomicU16, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use aws_lc_rs::rand::SystemRandom;
use aws_lc_rs::rsa::{KeyPair, KeySize};
use aws_lc_rs::signature::{KeyPair as _, RSA_PKCS1_SHA256};
use axum::extract::State;
use axum::http::StatusCode;
use axum::http::header::{CACHE_CONTROL, CONTENT_TYPE};
use axum::response::{IntoResponse as _, Response};
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde_json::{Value, json};

/// The path the keys are served at (Google's).
const JWKS_PATH: &str = "/oauth2/v3/certs";

/// The claims of a Google ID token; [`IdTokenClaims::valid`] is one the gateway accepts, and
/// struct update syntax makes the invalid ones:
/// `IdTokenClaims { email_verified: false, ..IdTokenClaims::valid(email, audience) }`.
#[derive(Debug, Clone)]
pub struct IdTokenClaims {
    pub email: String,
    pub email_verified: bool,
    pub aud: String,
    pub iss: String,
    /// `exp` relative to now (negative: expired).
    pub exp_offset_secs: i64,
    /// `iat` relative to now (positive: issued in the future).
    pub iat_offset_secs: i64,
}

impl IdTokenClaims {
    /// A token Google would issue to `email` (a service account) for `audience`: valid for
    /// an hour from now.
    pub fn valid(email: &str, audience: &str) -> Self {
        Self {
            email: email.to_string(),
            email_verified: true,
            aud: audience.to_string(),
            iss: "https://accounts.google.com".to_string(),
            exp_offset_secs: 3600,
            iat_offset_secs: 0,
        }
    }

    /// The JSON payload, with the other claims Google sets.
    pub fn to_json(&self) -> Value {
        let now = unix_now_secs();
        json!({
            "iss": self.iss,
            "aud": self.aud,
            "azp": "109876543210987654321",
            "sub": "109876543210987654321",
            "email": self.email,
            "email_verified": self.email_verified,
            "iat": now + self.iat_offset_secs,
            "exp": now + self.exp_offset_secs,
        })
    }
}

fn unix_now_secs() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock after 1970").as_secs() as i64
}

fn b64(bytes: impl AsRef<[u8]>) -> String {
    URL_SAFE_NO_PAD.encode(bytes)
}

/// An RSA-2048 signing key made in the test.
struct SigningKey {
    kid: String,
    key_pair: KeyPair,
}

impl SigningKey {
    fn generate() -> Self {
        let kid = hex::encode(rand::random::<[u8; 20]>());
        Self { kid, key_pair: KeyPair::generate(KeySize::Rsa2048).expect("generate an RSA key") }
    }

    /// Its public half as a JWK, the way Google publishes it.
    fn jwk(&self) -> Value {
        let public = self.key_pair.public_key();
        json!({
            "kty": "RSA",
            "alg": "RS256",
            "use": "sig",
            "kid": self.kid,
            "n": b64(public.modulus().big_endian_without_leading_zero()),
            "e": b64(public.exponent().big_endian_without_leading_zero()),
        })
    }

    /// A JWS over `header` and `payload` with RS256 (signed with aws-lc-rs: jsonwebtoken's
    /// `EncodingKey::from_rsa_der` wants PKCS#1, which aws-lc-rs does not export).
    fn sign(&self, header: &Value, payload: &Value) -> String {
        let message = format!("{}.{}", b64(header.to_string()), b64(payload.to_string()));
        let mut signature = vec![0; self.key_pair.public_modulus_len()];
        self.key_pair
            .sign(&RSA_PKCS1_SHA256, &SystemRandom::new(), message.as_bytes(), &mut signature)
            .expect("RS256 signature");
        format!("{message}.{}", b64(signature))
    }

    fn rs256_header(&self) -> Value {
        json!({"alg": "RS256", "kid": self.kid, "typ": "JWT"})
    }
}

/// The keys published: the current one signs, the previous one (after a rotation) is still
/// published, as Google keeps the last key in its set for a while.
struct PublishedKeys {
    current: Arc<SigningKey>,
    previous: Option<Arc<SigningKey>>,
}

struct ServerState {
    keys: Mutex<PublishedKeys>,
    max_age_secs: AtomicU64,
    status: AtomicU16,
    fetches: AtomicU64,
}

/// A JWKS endpoint on `127.0.0.1`, stopped when dropped.
pub struct JwksServer {
    url: String,
    state: Arc<ServerState>,
    /// Signs the tokens whose `kid` the set never names.
    unpublished: SigningKey,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for JwksServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn serve_keys(State(state): State<Arc<ServerState>>) -> Response {
    state.fetches.fetch_add(1, Ordering::SeqCst);
    let status = StatusCode::from_u16(state.status.load(Ordering::SeqCst)).expect("a valid status");
    let document = {
        let keys = state.keys.lock().unwrap();
        let published = std::iter::once(&keys.current).chain(keys.previous.as_ref());
        json!({"keys": published.map(|key| key.jwk()).collect::<Vec<_>>()})
    };
    let cache_control =
        format!("public, max-age={}, must-revalidate, no-transform", state.max_age_secs.load(Ordering::SeqCst));
    (
        status,
        [(CACHE_CONTROL, cache_control), (CONTENT_TYPE, "application/json; charset=UTF-8".to_string())],
        document.to_string(),
    )
        .into_response()
}

impl JwksServer {
    /// Serves one new key with `max-age=3600`.
    pub async fn start() -> Self {
        let state = Arc::new(ServerState {
            keys: Mutex::new(PublishedKeys { current: Arc::new(SigningKey::generate()), previous: None }),
            max_age_secs: AtomicU64::new(3600),
            status: AtomicU16::new(200),
            fetches: AtomicU64::new(0),
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind the JWKS server");
        let url = format!("http://{}{JWKS_PATH}", listener.local_addr().expect("local address"));
        let app = axum::Router::new().route(JWKS_PATH, axum::routing::get(serve_keys)).with_state(Arc::clone(&state));
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Self { url, state, unpublished: SigningKey::generate(), task }
    }

    /// The value for `FILAMENT_GOOGLE_JWKS_URL`.
    pub fn url(&self) -> String {
        self.url.clone()
    }

    /// How many times the key set was requested.
    pub fn fetches(&self) -> u64 {
        self.state.fetches.load(Ordering::SeqCst)
    }

    /// The `max-age` of the answers from now on.
    pub fn set_max_age_secs(&self, max_age_secs: u64) {
        self.state.max_age_secs.store(max_age_secs, Ordering::SeqCst);
    }

    /// Answers with `status` (and the key set) from now on: 500 or 503 make the fetches fail.
    pub fn set_status(&self, status: u16) {
        self.state.status.store(status, Ordering::SeqCst);
    }

    /// Publishes a new signing key, keeping the one it replaces in the set; returns its `kid`.
    pub fn rotate(&self) -> String {
        let mut keys = self.state.keys.lock().unwrap();
        let next = Arc::new(SigningKey::generate());
        let kid = next.kid.clone();
        keys.previous = Some(std::mem::replace(&mut keys.current, next));
        kid
    }

    /// Stops publishing the key the last rotation replaced.
    pub fn withdraw_previous(&self) {
        self.state.keys.lock().unwrap().previous = None;
    }

    /// The `kid` of the key that signs now.
    pub fn current_kid(&self) -> String {
        self.current().kid.clone()
    }

    fn current(&self) -> Arc<SigningKey> {
        Arc::clone(&self.state.keys.lock().unwrap().current)
    }

    /// A token signed with the current key (valid when `claims` are).
    pub fn sign_rs256(&self, claims: &IdTokenClaims) -> String {
        let key = self.current();
        key.sign(&key.rs256_header(), &claims.to_json())
    }

    /// A token signed with the key the last rotation replaced, if there was one.
    pub fn sign_with_previous_key(&self, claims: &IdTokenClaims) -> Option<String> {
        let previous = self.state.keys.lock().unwrap().previous.clone()?;
        Some(previous.sign(&previous.rs256_header(), &claims.to_json()))
    }

    /// A well-signed token whose `kid` the set has never named.
    pub fn sign_with_unknown_kid(&self, claims: &IdTokenClaims) -> String {
        self.unpublished.sign(&self.unpublished.rs256_header(), &claims.to_json())
    }

    /// A token with a fresh random `kid` and a signature nobody made: a thousand of these are a
    /// flood of forgeries, each with a different key id.
    pub fn forged_with_random_kid(&self, claims: &IdTokenClaims) -> String {
        let header = json!({"alg": "RS256", "kid": hex::encode(rand::random::<[u8; 20]>())});
        format!("{}.{}.{}", b64(header.to_string()), b64(claims.to_json().to_string()), b64([7u8; 256]))
    }

    /// An unsigned token (`alg: none`, empty signature) naming the current key.
    pub fn alg_none(&self, claims: &IdTokenClaims) -> String {
        let header = json!({"alg": "none", "kid": self.current_kid(), "typ": "JWT"});
        format!("{}.{}.", b64(header.to_string()), b64(claims.to_json().to_string()))
    }

    /// An HS256 token naming the current key, keyed with that key's public modulus (the
    /// algorithm confusion a verifier that trusts the header falls for).
    pub fn hs256(&self, claims: &IdTokenClaims) -> String {
        let key = self.current();
        let mut header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256);
        header.kid = Some(key.kid.clone());
        let public = key.key_pair.public_key();
        let secret = jsonwebtoken::EncodingKey::from_secret(public.modulus().big_endian_without_leading_zero());
        jsonwebtoken::encode(&header, &claims.to_json(), &secret).expect("HS256 token")
    }
}
