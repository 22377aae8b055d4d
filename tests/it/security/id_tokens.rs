//! Google ID tokens as credentials, through the whole gateway (issue 23, item 3): a JWKS server
//! on loopback with keys made in the test; the gateway verifies each token against it and the
//! token's e-mail selects the principal.

use std::sync::Arc;
use std::time::Duration;

use reqwest::{Method, StatusCode};

use crate::support::jwks::{IdTokenClaims, JwksServer};
use crate::support::principals::{PrincipalsFile, new_token};
use crate::support::{Gateway, GatewayOptions, assert_problem, eventually, send};

const AUDIENCE: &str = "https://filament-bigquery.test";
const EMAIL: &str = "loader@acme-prod.iam.gserviceaccount.com";

/// A gateway accepting ID tokens for [`AUDIENCE`] from `jwks`, where [`EMAIL`] is principal
/// `loader` (reading its runs).
async fn gateway(jwks: &JwksServer) -> (Gateway, PrincipalsFile) {
    let entry = format!(
        "[[principal]]\nname = \"loader\"\ngoogle_service_accounts = [\"{EMAIL}\"]\ndestinations = [\"filament-demo.*\"]\n"
    );
    let file = PrincipalsFile::new(&[entry]);
    let (name, path) = file.env();
    let gw = GatewayOptions::new()
        .env(name, &path)
        .env("FILAMENT_GOOGLE_ID_TOKEN_AUDIENCE", AUDIENCE)
        .env("FILAMENT_GOOGLE_JWKS_URL", &jwks.url())
        .spawn()
        .await;
    (gw, file)
}

async fn get_as(gw: &Gateway, token: &str) -> (StatusCode, serde_json::Value) {
    send(gw.unauthenticated(Method::GET, "/v1/runs/none").bearer_auth(token)).await
}

fn valid() -> IdTokenClaims {
    IdTokenClaims::valid(EMAIL, AUDIENCE)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_valid_id_token_selects_its_principal_and_each_flawed_one_is_refused() {
    let jwks = JwksServer::start().await;
    let (gw, _file) = gateway(&jwks).await;
    let (status, body) = get_as(&gw, &jwks.sign_rs256(&valid())).await;
    assert_eq!((status, body["code"].as_str()), (StatusCode::NOT_FOUND, Some("run_not_found")), "authenticated");
    let flawed = [
        ("wrong aud", jwks.sign_rs256(&IdTokenClaims { aud: "https://other.test".into(), ..valid() })),
        ("wrong iss", jwks.sign_rs256(&IdTokenClaims { iss: "https://evil.example".into(), ..valid() })),
        ("expired", jwks.sign_rs256(&IdTokenClaims { exp_offset_secs: -120, iat_offset_secs: -3720, ..valid() })),
        ("alg none", jwks.alg_none(&valid())),
        ("HS256", jwks.hs256(&valid())),
        ("unknown kid", jwks.sign_with_unknown_kid(&valid())),
        ("email not verified", jwks.sign_rs256(&IdTokenClaims { email_verified: false, ..valid() })),
        ("unknown account", jwks.sign_rs256(&IdTokenClaims::valid("stranger@x.iam.gserviceaccount.com", AUDIENCE))),
    ];
    for (case, token) in flawed {
        let problem = assert_problem(get_as(&gw, &token).await, StatusCode::UNAUTHORIZED, "unauthorized");
        assert!(!problem.to_string().contains(&token), "{case}: the answer never echoes the token");
    }
    let logs = gw.logs();
    assert!(logs.contains("id_token_expired") || logs.contains("expired"), "the audit names the reason");
    // An opaque token still works alongside (the harness's FILAMENT_API_TOKENS).
    assert_eq!(send(gw.request(Method::GET, "/v1/runs/none")).await.0, StatusCode::NOT_FOUND);
    assert_eq!(get_as(&gw, &new_token()).await.0, StatusCode::UNAUTHORIZED);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_thousand_tokens_with_unknown_kids_cause_at_most_one_fetch_per_30_s() {
    let jwks = JwksServer::start().await;
    let (gw, _file) = gateway(&jwks).await;
    assert_eq!(get_as(&gw, &jwks.sign_rs256(&valid())).await.0, StatusCode::NOT_FOUND, "keys fetched once");
    let fetched_before = jwks.fetches();
    let gw = Arc::new(gw);
    let forged: Vec<String> = (0..1000).map(|_| jwks.forged_with_random_kid(&valid())).collect();
    let started = tokio::time::Instant::now();
    let mut tasks = Vec::new();
    for chunk in forged.chunks(50) {
        let (gw, chunk) = (Arc::clone(&gw), chunk.to_vec());
        tasks.push(tokio::spawn(async move {
            for token in chunk {
                assert_eq!(get_as(&gw, &token).await.0, StatusCode::UNAUTHORIZED);
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let fetches = jwks.fetches() - fetched_before;
    let allowed = 1 + started.elapsed().as_secs() / 30;
    assert!(fetches <= allowed, "{fetches} fetches for 1,000 forged tokens in {:?}", started.elapsed());
}

#[tokio::test(flavor = "multi_thread")]
async fn two_hundred_concurrent_valid_tokens_during_a_key_rotation_all_succeed() {
    let jwks = JwksServer::start().await;
    jwks.set_max_age_secs(1);
    let (gw, _file) = gateway(&jwks).await;
    assert_eq!(get_as(&gw, &jwks.sign_rs256(&valid())).await.0, StatusCode::NOT_FOUND);
    // Google rotates: the new key is published, the old one stays for a while.
    jwks.rotate();
    jwks.set_max_age_secs(3600);
    // The key set cached under max-age 1 s goes stale, so the tokens below make it fetch again.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let gw = Arc::new(gw);
    let mut tokens: Vec<String> = (0..199).map(|_| jwks.sign_rs256(&valid())).collect();
    tokens.push(jwks.sign_with_previous_key(&valid()).expect("the previous key is still published"));
    let tasks: Vec<_> = tokens
        .into_iter()
        .map(|token| {
            let gw = Arc::clone(&gw);
            tokio::spawn(async move { get_as(&gw, &token).await })
        })
        .collect();
    for task in tasks {
        let (status, body) = task.await.unwrap();
        assert_eq!(status, StatusCode::NOT_FOUND, "authenticated during the rotation: {body}");
    }
    assert!(jwks.fetches() <= 3, "{} fetches", jwks.fetches());
}

/// The console's sign-in form takes an ID token as well: its e-mail's principal gets the
/// session, for no longer than the token lasts, and only while the principal lists the service
/// account; an expired one is refused with the reason.
#[tokio::test(flavor = "multi_thread")]
async fn an_id_token_signs_in_to_the_console_as_its_principal() {
    let jwks = JwksServer::start().await;
    let (gw, file) = gateway(&jwks).await;
    let http = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build().unwrap();
    let sign_in = |token: String| http.post(gw.url("/ui/sign-in")).form(&[("token", token)]).send();
    let answer = sign_in(jwks.sign_rs256(&valid())).await.unwrap();
    assert_eq!(answer.status(), StatusCode::SEE_OTHER);
    let set_cookie = answer.headers()["set-cookie"].to_str().unwrap().to_string();
    let max_age: u64 = set_cookie.split("Max-Age=").nth(1).unwrap().split(';').next().unwrap().parse().unwrap();
    assert!(max_age <= 3600, "the session ends when the ID token would, not after 8 h: {set_cookie}");
    let cookie = set_cookie.split(';').next().unwrap().to_string();
    assert!(cookie.ends_with(".loader"), "the session names the principal: {cookie}");
    let page = http.get(gw.url("/ui/")).header("cookie", &cookie).send().await.unwrap();
    assert_eq!(page.status(), StatusCode::OK);
    assert!(page.text().await.unwrap().contains("signed in as"));
    // The operator removes the service account from the principal: its session ends.
    let token_only = "[[principal]]\nname = \"loader\"\ntoken_sha256 = [\"9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08\"]\ndestinations = [\"filament-demo.*\"]\n";
    file.write_text(token_only);
    eventually(Duration::from_secs(15), "the removed service account's session to end", || async {
        let page = http.get(gw.url("/ui/")).header("cookie", &cookie).send().await.unwrap();
        (page.status() == StatusCode::UNAUTHORIZED).then_some(())
    })
    .await;
    let expired = jwks.sign_rs256(&IdTokenClaims { exp_offset_secs: -120, iat_offset_secs: -3720, ..valid() });
    let refused = sign_in(expired).await.unwrap();
    assert_eq!(refused.status(), StatusCode::UNAUTHORIZED);
    assert!(refused.text().await.unwrap().contains("id_token_expired"));
}
