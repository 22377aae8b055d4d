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
async fn verify_all(verifier: &IdTokenVerifier, tokens: Vec<String>) -> Vec<Result<VerifiedIdentity, IdTokenRejected>> {
    let tasks = tokens.into_iter().map(|token| {
        let verifier = verifier.clone();
        tokio::spawn(async move { verifier.verify(&token).await })
    });
    join_all(tasks).await.into_iter().map(Result::unwrap).collect()
}

/// Polls `condition` every 10 ms for up to 10 s.
/// Moves the verifier's clock (tokio's) forward by `by` at once: paused, advanced, resumed,
/// so the fake JWKS server and the HTTP client go on in real time.
async fn jump(by: Duration) {
    tokio::time::pause();
    tokio::time::advance(by).await;
    tokio::time::resume();
}

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
    let confused = jsonwebtoken::encode(&hs256, &claims, &jsonwebtoken::EncodingKey::from_secret(&modulus)).unwrap();
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
    let altered = format!("{header}.{}.{signature}", b64(claims_with(json!({"email": "root@evil.com"})).to_string()));
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

#[tokio::test]
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
    jump(interval + Duration::from_millis(200)).await;
    assert!(verify_all(&verifier, flood(2)).await.iter().all(|r| *r == Err(IdTokenRejected::UnknownKey)));
    assert!(verify_all(&verifier, flood(3)).await.iter().all(|r| *r == Err(IdTokenRejected::UnknownKey)));
    assert_eq!((verifier.jwks_fetches(), jwks.requests()), (2, 2), "one more fetch after the interval");
}

/// Rotation as Google does it, seen when the cached set expires: the new key is published
/// beside the old one and tokens signed with either arrive at once.
#[tokio::test]
async fn two_hundred_tokens_during_a_key_rotation_all_verify() {
    let old = SigningKey::generate("key-old");
    let jwks = FakeJwks::start(&[&old], "public, max-age=1").await;
    let verifier = jwks.verifier();
    assert!(verifier.verify(&old.token(&valid_claims())).await.is_ok());
    let new = SigningKey::generate("key-new");
    jwks.publish(jwks_document(&[&new, &old]));
    jwks.set_cache_control("public, max-age=3600");
    jump(Duration::from_millis(1200)).await;
    let tokens = (0..200).map(|n| if n % 4 == 3 { &old } else { &new }).map(|key| key.token(&valid_claims()));
    let results = verify_all(&verifier, tokens.collect()).await;
    assert!(results.iter().all(Result::is_ok), "{:?}", results.iter().find(|r| r.is_err()));
    assert_eq!((verifier.jwks_fetches(), jwks.requests()), (2, 2));
}

/// Rotation seen through the unknown-kid refetch (the cached set still fresh), and the old
/// key withdrawn.
#[tokio::test]
async fn a_new_kid_after_the_interval_is_fetched_once_for_all() {
    let old = SigningKey::generate("key-old");
    let jwks = FakeJwks::start(&[&old], "public, max-age=3600").await;
    let interval = Duration::from_secs(1);
    let verifier = jwks.verifier_with_interval(interval);
    assert!(verifier.verify(&old.token(&valid_claims())).await.is_ok());
    let new = SigningKey::generate("key-new");
    jwks.publish(jwks_document(&[&new]));
    jump(interval + Duration::from_millis(200)).await;
    let results = verify_all(&verifier, (0..200).map(|_| new.token(&valid_claims())).collect()).await;
    assert!(results.iter().all(Result::is_ok), "{:?}", results.iter().find(|r| r.is_err()));
    assert_eq!(refusal(&verifier, &old.token(&valid_claims())).await, IdTokenRejected::UnknownKey);
    assert_eq!((verifier.jwks_fetches(), jwks.requests()), (2, 2));
}

#[tokio::test]
async fn expired_keys_keep_serving_while_one_refresh_runs() {
    let key = SigningKey::generate("key-1");
    let jwks = FakeJwks::start(&[&key], "public, max-age=1").await;
    let verifier = jwks.verifier();
    assert!(verifier.verify(&key.token(&valid_claims())).await.is_ok());
    jwks.set_cache_control("public, max-age=3600");
    jwks.hold(true);
    jump(Duration::from_millis(1200)).await;
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
        reasons.iter().all(|r| r.starts_with("id_token_") && r.bytes().all(|b| b.is_ascii_lowercase() || b == b'_'))
    );
    assert_eq!(R::Expired.reason(), "id_token_expired");
}
