//! The ID-token tests' keys, tokens and fake JWKS server.

use parking_lot::Mutex as StdMutex;

use reqwest::StatusCode;
use reqwest::header::CACHE_CONTROL;

use std::sync::atomic::AtomicU16;

use aws_lc_rs::rand::SystemRandom;
use aws_lc_rs::rsa::{KeyPair, KeySize};
use aws_lc_rs::signature::{KeyPair as _, RSA_PKCS1_SHA256};
use axum::extract::State;
use axum::response::{IntoResponse as _, Response};
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use futures::future::join_all;
use reqwest::header::CONTENT_TYPE;
use serde_json::json;
use tokio::sync::watch;

use super::*;

pub(super) const AUDIENCE: &str = "https://gateway.example.com";
pub(super) const EMAIL: &str = "loader@acme-prod.iam.gserviceaccount.com";

pub(super) fn b64(bytes: impl AsRef<[u8]>) -> String {
    URL_SAFE_NO_PAD.encode(bytes)
}

pub(super) fn now_unix_secs() -> i64 {
    jsonwebtoken::get_current_timestamp() as i64
}

/// An RSA signing key made in the test, published the way Google publishes its keys.
pub(super) struct SigningKey {
    pub(super) kid: String,
    pub(super) key_pair: KeyPair,
}

impl SigningKey {
    pub(super) fn generate(kid: &str) -> Self {
        Self { kid: kid.to_string(), key_pair: KeyPair::generate(KeySize::Rsa2048).unwrap() }
    }

    pub(super) fn jwk(&self) -> Value {
        let public = self.key_pair.public_key();
        json!({
            "kty": "RSA", "alg": "RS256", "use": "sig", "kid": self.kid,
            "n": b64(public.modulus().big_endian_without_leading_zero()),
            "e": b64(public.exponent().big_endian_without_leading_zero()),
        })
    }

    /// A JWS over `header` and `claims` with RS256 (aws-lc-rs directly: jsonwebtoken's
    /// `EncodingKey::from_rsa_der` wants PKCS#1, and aws-lc-rs exports PKCS#8 only).
    pub(super) fn sign(&self, header: &Value, claims: &Value) -> String {
        let message = format!("{}.{}", b64(header.to_string()), b64(claims.to_string()));
        let mut signature = vec![0; self.key_pair.public_modulus_len()];
        self.key_pair.sign(&RSA_PKCS1_SHA256, &SystemRandom::new(), message.as_bytes(), &mut signature).unwrap();
        format!("{message}.{}", b64(signature))
    }

    pub(super) fn token(&self, claims: &Value) -> String {
        self.sign(&json!({"alg": "RS256", "kid": self.kid, "typ": "JWT"}), claims)
    }
}

pub(super) fn valid_claims() -> Value {
    let now = now_unix_secs();
    json!({
        "iss": "https://accounts.google.com", "aud": AUDIENCE, "azp": "1234567890", "sub": "1234567890",
        "email": EMAIL, "email_verified": true, "iat": now, "exp": now + 3600,
    })
}

/// Valid claims with `changes` applied (a `null` removes the claim).
pub(super) fn claims_with(changes: Value) -> Value {
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
pub(super) fn forged_token(kid: &str) -> String {
    let header = json!({"alg": "RS256", "kid": kid});
    format!("{}.{}.{}", b64(header.to_string()), b64(valid_claims().to_string()), b64([7u8; 256]))
}

pub(super) fn jwks_document(keys: &[&SigningKey]) -> Value {
    json!({"keys": keys.iter().map(|key| key.jwk()).collect::<Vec<_>>()})
}

/// Google's JWKS endpoint on loopback: serves the document and `Cache-Control` it is given,
/// counts requests, and can hold its answers (a slow Google) or fail them.
pub(super) struct FakeJwks {
    url: String,
    state: Arc<FakeJwksState>,
}

pub(super) struct FakeJwksState {
    document: StdMutex<Value>,
    cache_control: StdMutex<String>,
    status: AtomicU16,
    requests: AtomicU64,
    held: watch::Sender<bool>,
}

pub(super) async fn serve_jwks(State(state): State<Arc<FakeJwksState>>) -> Response {
    state.requests.fetch_add(1, Ordering::SeqCst);
    let _ = state.held.subscribe().wait_for(|held| !*held).await;
    let status = StatusCode::from_u16(state.status.load(Ordering::SeqCst)).unwrap();
    let cache_control = state.cache_control.lock().clone();
    let body = state.document.lock().to_string();
    (status, [(CACHE_CONTROL, cache_control), (CONTENT_TYPE, "application/json".to_string())], body).into_response()
}

impl FakeJwks {
    pub(super) async fn start(keys: &[&SigningKey], cache_control: &str) -> Self {
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

    pub(super) fn verifier(&self) -> IdTokenVerifier {
        self.verifier_with_interval(UNKNOWN_KID_REFETCH_INTERVAL)
    }

    pub(super) fn verifier_with_interval(&self, refetch_interval: Duration) -> IdTokenVerifier {
        let settings = IdTokenSettings { audience: AUDIENCE.to_string(), jwks_url: self.url.clone() };
        IdTokenVerifier::with_refetch_interval(settings, reqwest::Client::new(), refetch_interval)
    }

    pub(super) fn publish(&self, document: Value) {
        *self.state.document.lock() = document;
    }

    pub(super) fn set_cache_control(&self, cache_control: &str) {
        *self.state.cache_control.lock() = cache_control.to_string();
    }

    pub(super) fn answer_with(&self, status: u16) {
        self.state.status.store(status, Ordering::SeqCst);
    }

    pub(super) fn hold(&self, held: bool) {
        self.state.held.send_replace(held);
    }

    pub(super) fn requests(&self) -> u64 {
        self.state.requests.load(Ordering::SeqCst)
    }
}

/// Verifies every token concurrently, each in its own task.
pub(super) async fn verify_all(
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
/// Moves the verifier's clock (tokio's) forward by `by` at once: paused, advanced, resumed,
/// so the fake JWKS server and the HTTP client go on in real time.
pub(super) async fn jump(by: Duration) {
    tokio::time::pause();
    tokio::time::advance(by).await;
    tokio::time::resume();
}

pub(super) async fn eventually(what: &str, condition: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !condition() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

pub(super) async fn refusal(verifier: &IdTokenVerifier, token: &str) -> IdTokenRejected {
    verifier.verify(token).await.expect_err("the token must be refused")
}
