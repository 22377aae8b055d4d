use super::super::jwks::{DEFAULT_JWKS_MAX_AGE, MAX_JWKS_MAX_AGE, MIN_JWKS_MAX_AGE};

use aws_lc_rs::rsa::{KeyPair, KeySize};
use aws_lc_rs::signature::KeyPair as _;
use reqwest::header::{HeaderName, HeaderValue};
use serde_json::json;

use super::*;

#[path = "id_token_test_support.rs"]
mod support;
use support::*;

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
