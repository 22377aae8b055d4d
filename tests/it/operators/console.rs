//! The web console (`/ui/`, issue 24, items 3 and 4) against the real gateway, Postgres and
//! emulator. The browser tests drive headless Chromium (support::browser): sign in; a
//! committed run and a failed run with its code and hint; a running execution whose
//! acknowledged rows rise between two of the page's own refreshes; sign out and be refused; a
//! hostile run id and a hostile error message shown as text. Each saves screenshots under
//! `build/console-screenshots/`. The HTTP tests check what a browser does not show: the
//! cookie's attributes, the security headers, scopes, and that the console changes nothing.

use std::time::Duration;

use fantoccini::Locator;
use reqwest::header::{CONTENT_SECURITY_POLICY, LOCATION, SET_COOKIE};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::support::arrow::{ids, ipc_stream};
use crate::support::browser::Browser;
use crate::support::principals::{PrincipalsFile, entry, new_token};
use crate::support::rest_proxy::{JobMode, RestProxy};
use crate::support::{Gateway, GatewayOptions, TestRun, eventually, required_env};

/// A failure message holding markup: the console must show it as text.
/// (Without quotes: a quoted span is a value the gateway redacts before storing the message.)
const HOSTILE_MESSAGE: &str = "Query error: <script>alert(1)</script> near <b>MERGE</b>";

/// Waits until BigQuery acknowledged `rows` rows of the execution's first resource.
async fn acknowledged(gw: &Gateway, run: &str, execution: &str, rows: i64) {
    eventually(Duration::from_secs(30), "the rows to be acknowledged", || async {
        let (_, view) = gw.json(Method::GET, &format!("/v1/runs/{run}/executions/{execution}"), None).await;
        (view["resources"][0]["rows_acknowledged"] == rows).then_some(())
    })
    .await;
}

/// A run of `rows` rows into resource `t`, committed (or failed, when the proxy fails jobs).
async fn loaded_run(gw: &Gateway, run: &str, rows: i64) -> Value {
    TestRun::new(run, "e").full_append(&["t"]).open(gw).await;
    gw.post_accepted(run, "e", "t", None, ipc_stream(&[ids(0..rows)])).await;
    acknowledged(gw, run, "e", rows).await;
    gw.commit_and_wait(run, "e").await
}

/// The page has no script element: markup from data stayed text (the CSP would also keep an
/// inline script from running, so its absence from the document is what shows the escaping).
async fn assert_no_script_ran(browser: &Browser) {
    let scripts = browser.client.find_all(Locator::Css("script")).await.unwrap();
    assert!(scripts.is_empty(), "a script element reached the page:\n{}", browser.source().await);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_signed_in_browser_sees_committed_and_failed_runs_and_is_refused_after_signing_out() {
    let proxy = RestProxy::start(&required_env("BIGQUERY_EMULATOR_HOST")).await;
    let gw = GatewayOptions::new().rest_proxy(&proxy).spawn().await;
    assert_eq!(loaded_run(&gw, "console-ok", 5).await["state"], "committed");
    // A job over the run's byte limit: a failure with a code and a hint.
    let reason = "bytesBilledLimitExceeded".to_string();
    proxy.set_jobs(JobMode::Fail { query_contains: String::new(), reason, message: HOSTILE_MESSAGE.into() });
    let failed = loaded_run(&gw, "console-bad", 3).await;
    assert_eq!(failed["state"], "failed", "{failed}");
    let browser = Browser::start().await;

    browser.goto(&gw.url("/ui/")).await;
    assert_eq!(browser.text("#refusal").await, "Sign in to see the console.");
    browser.screenshot("sign-in").await;
    browser.sign_in(&gw.token).await;
    assert_eq!(browser.text("#principal").await, "default");
    let committed_row = browser.text("tr[data-run='console-ok']").await;
    assert!(committed_row.contains("committed"), "{committed_row}");
    let failed_row = browser.text("tr[data-run='console-bad']").await;
    let (code, hint) = (failed["error"]["code"].as_str().unwrap(), failed["error"]["hint"].as_str().unwrap());
    assert_eq!(code, "publication_too_expensive");
    assert!(failed_row.contains("failed") && failed_row.contains(code), "{failed_row}");
    assert!(failed_row.contains(hint), "the hint {hint:?} is not in {failed_row}");
    browser.screenshot("runs-list").await;

    browser.goto(&gw.url("/ui/runs/console-bad/executions/e")).await;
    assert_eq!(browser.text(".error-box .error-code").await, code);
    assert_eq!(browser.text(".error-box .hint").await, format!("Hint: {hint}"));
    assert_eq!(browser.text("h1 .state").await, "failed");
    let publication = browser.text("tr[data-resource='t'] .publication").await;
    assert!(publication.contains(HOSTILE_MESSAGE), "the job's message is shown as text: {publication}");
    assert_no_script_ran(&browser).await;
    browser.screenshot("failed-execution").await;

    browser.goto(&gw.url("/ui/runs/console-ok/executions/e")).await;
    assert_eq!(browser.text("tr[data-resource='t'] .rows-acknowledged").await, "5");
    let job = browser.client.find(Locator::Css("a.job")).await.unwrap();
    let href = job.attr("href").await.unwrap().unwrap_or_default();
    let job_id = job.text().await.unwrap();
    assert!(
        href.starts_with(&format!(
            "https://console.cloud.google.com/bigquery?project={}&j=bq%3AUS%3A{job_id}",
            gw.project
        )),
        "{href}"
    );
    assert!(browser.text("#timeline").await.contains("publication_finished"));
    // The plan the commit priced at its barrier (the emulator's dry runs answer 0 bytes).
    let planned =
        gw.json(Method::GET, "/v1/runs/console-ok/executions/e", None).await.1["plan"]["publications"][0].clone();
    assert_eq!(browser.text("#plan tr[data-resource='t'] .statement").await, planned["statement"].as_str().unwrap());
    assert_eq!(browser.text("#plan tr[data-resource='t'] .bytes").await, planned["bytes_processed"].to_string());
    // Each phase of the resource as a bar on one time axis, the plan's figures beside it.
    let bars = browser.client.find_all(Locator::Css("#phases g[data-resource='t'] rect.phase")).await.unwrap();
    let mut phases = Vec::new();
    for bar in bars {
        phases.push(bar.attr("data-phase").await.unwrap().unwrap_or_default());
    }
    assert_eq!(phases, ["set-up", "upload", "stream commit", "plan", "publication"]);
    let figures = browser.text("#phases g[data-resource='t'] .plan-figures").await;
    assert_eq!(figures, format!("t · {} B · $0.000000", planned["bytes_processed"]));
    browser.screenshot("committed-execution").await;

    browser.goto(&gw.url("/ui/runs/console-ok")).await;
    let resources = browser.text("#resources").await;
    assert!(resources.contains("full_append"), "{resources}");
    assert!(browser.text("#executions").await.contains("committed"));
    browser.screenshot("run").await;

    browser.client.find(Locator::Css("#sign-out")).await.unwrap().click().await.unwrap();
    browser.text("form.sign-in").await;
    browser.goto(&gw.url("/ui/runs/console-ok")).await;
    assert_eq!(browser.text("#refusal").await, "Sign in to see the console.");
    let cookies = browser.client.get_all_cookies().await.unwrap();
    assert!(cookies.iter().all(|cookie| cookie.name() != "filament_session"), "{cookies:?}");
    browser.close().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_running_execution_page_shows_acknowledged_rows_rising_between_its_own_refreshes() {
    let gw = Gateway::spawn().await;
    TestRun::new("console-live", "e").full_append(&["t"]).open(&gw).await;
    gw.post_accepted("console-live", "e", "t", None, ipc_stream(&[ids(0..5)])).await;
    acknowledged(&gw, "console-live", "e", 5).await;
    let browser = Browser::start().await;
    // Signing in from the page asked for comes back to it.
    browser.goto(&gw.url("/ui/runs/console-live/executions/e")).await;
    browser.sign_in(&gw.token).await;
    assert_eq!(browser.text("#execution-id").await, "e");
    assert_eq!(browser.text("h1 .state").await, "extracting");
    assert_eq!(browser.text("tr[data-resource='t'] .rows-acknowledged").await, "5");
    browser.screenshot("running-execution-before").await;

    gw.post_accepted("console-live", "e", "t", None, ipc_stream(&[ids(5..12)])).await;
    // No navigation from here: the page reloads itself while the execution has not ended.
    browser.wait_for_text("tr[data-resource='t'] .rows-acknowledged", "the page to refresh to 12", |t| t == "12").await;
    browser.screenshot("running-execution-after").await;
    gw.commit_and_wait("console-live", "e").await;
    browser.wait_for_text("h1 .state", "the page to show the commit", |t| t == "committed").await;
    let refresh = browser.client.find_all(Locator::Css("meta[http-equiv='refresh']")).await.unwrap();
    assert!(refresh.is_empty(), "a final execution stops refreshing");
    browser.close().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_hostile_run_id_in_the_address_is_shown_as_text() {
    let gw = Gateway::spawn().await;
    let browser = Browser::start().await;
    browser.goto(&gw.url("/ui/sign-in")).await;
    browser.sign_in(&gw.token).await;
    browser.goto(&gw.url("/ui/runs/%3Cscript%3Ealert(1)%3C%2Fscript%3E")).await;
    assert_eq!(browser.text(".error-box .error-code").await, "invalid_identifier");
    let detail = browser.text(".error-box .detail").await;
    assert!(detail.contains("<script>alert(1)</script>"), "{detail}");
    assert_no_script_ran(&browser).await;
    browser.screenshot("hostile-run-id").await;
    browser.close().await;
}

/// An HTTP client that does not follow redirects, as the tests below read each answer.
fn client() -> reqwest::Client {
    reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build().unwrap()
}

/// Signs in with `token`; the session cookie (`name=value`).
async fn session(gw: &Gateway, token: &str) -> String {
    let answer = client().post(gw.url("/ui/sign-in")).form(&[("token", token), ("next", "/ui/")]).send().await.unwrap();
    assert_eq!(answer.status(), StatusCode::SEE_OTHER);
    assert_eq!(answer.headers()[LOCATION], "/ui/");
    let set_cookie = answer.headers()[SET_COOKIE].to_str().unwrap().to_string();
    for attribute in ["HttpOnly", "SameSite=Strict", "Path=/ui/", "Max-Age="] {
        assert!(set_cookie.contains(attribute), "{attribute} missing: {set_cookie}");
    }
    assert!(!set_cookie.contains(token), "the cookie carries the principal, never the token: {set_cookie}");
    set_cookie.split(';').next().unwrap().to_string()
}

async fn page(gw: &Gateway, path: &str, cookie: Option<&str>) -> (StatusCode, String) {
    let mut request = client().get(gw.url(path));
    if let Some(cookie) = cookie {
        request = request.header("cookie", cookie);
    }
    let answer = request.send().await.unwrap();
    let csp = answer.headers().get(CONTENT_SECURITY_POLICY).map(|v| v.to_str().unwrap().to_string());
    assert!(csp.as_deref().is_some_and(|csp| csp.starts_with("default-src 'none'")), "{path}: {csp:?}");
    (answer.status(), answer.text().await.unwrap())
}

#[tokio::test(flavor = "multi_thread")]
async fn console_pages_are_scoped_to_the_principal_signed_in_and_change_nothing() {
    let (acme, other, writer) = (new_token(), new_token(), new_token());
    let file = PrincipalsFile::new(&[
        entry("acme", &[&acme], "destinations = [\"filament-demo.*\"]"),
        entry("other", &[&other], "destinations = [\"filament-demo.*\"]"),
        entry("writer", &[&writer], "destinations = [\"filament-demo.*\"]\nactions = [\"write\"]"),
    ]);
    let (name, path) = file.env();
    let gw = GatewayOptions::new().env(name, &path).spawn().await;
    for (token, run) in [(&acme, "acme-run"), (&other, "other-run")] {
        let body = json!({"run_id": run, "destination": {"project": gw.project, "dataset": gw.dataset}});
        let answer = gw.unauthenticated(Method::POST, "/v1/runs").bearer_auth(token).json(&body).send().await.unwrap();
        assert_eq!(answer.status(), StatusCode::CREATED);
    }
    let before = gw.db_snapshot().await;

    let (status, body) = page(&gw, "/ui/", None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");
    let cookie = session(&gw, &acme).await;
    let (status, body) = page(&gw, "/ui/", Some(&cookie)).await;
    assert_eq!(status, StatusCode::OK);
    assert!(body.contains("acme-run") && !body.contains("other-run"), "{body}");
    let (status, body) = page(&gw, "/ui/runs/other-run", Some(&cookie)).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(body.contains("run_not_found"), "{body}");
    let (status, body) = page(&gw, "/ui/?state=done", Some(&cookie)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(body.contains("invalid_request"), "{body}");

    let tampered = cookie.replace(".acme", ".other");
    assert_ne!(tampered, cookie);
    assert_eq!(page(&gw, "/ui/", Some(&tampered)).await.0, StatusCode::UNAUTHORIZED);
    let refused = client().post(gw.url("/ui/sign-in")).form(&[("token", "fbq_not_a_token")]).send().await.unwrap();
    assert_eq!(refused.status(), StatusCode::UNAUTHORIZED);
    assert!(refused.text().await.unwrap().contains("unknown_token"));
    let refused = client().post(gw.url("/ui/sign-in")).form(&[("token", writer.as_str())]).send().await.unwrap();
    assert_eq!(refused.status(), StatusCode::FORBIDDEN, "a principal that may not read gets no session");
    let forged = client()
        .post(gw.url("/ui/sign-in"))
        .header("sec-fetch-site", "cross-site")
        .form(&[("token", acme.as_str())])
        .send()
        .await
        .unwrap();
    assert_eq!(forged.status(), StatusCode::FORBIDDEN, "another site's form opens no session");
    assert!(forged.headers().get(SET_COOKIE).is_none());
    let elsewhere = client()
        .post(gw.url("/ui/sign-in"))
        .form(&[("token", acme.as_str()), ("next", "https://evil.example/ui/")])
        .send()
        .await
        .unwrap();
    assert_eq!(elsewhere.headers()[LOCATION], "/ui/", "only console pages are followed after sign-in");
    let posted = client().post(gw.url("/ui/runs/acme-run")).header("cookie", &cookie).send().await.unwrap();
    assert_eq!(posted.status(), StatusCode::METHOD_NOT_ALLOWED, "the console never writes");
    assert_eq!(gw.db_snapshot().await, before, "browsing the console changed the database");
}

/// A console session is bound to the credential that opened it: rotating that token out of the
/// principals file ends it at its next page (a session of the token kept stands), and
/// `sessions_not_before` ends every session the principal opened before it.
#[tokio::test(flavor = "multi_thread")]
async fn a_session_ends_with_its_token_and_when_the_operator_ends_the_principals_sessions() {
    let (old, kept) = (new_token(), new_token());
    let scopes = "destinations = [\"filament-demo.*\"]";
    let file = PrincipalsFile::new(&[entry("acme", &[&old, &kept], scopes)]);
    let (name, path) = file.env();
    let gw = GatewayOptions::new().env(name, &path).spawn().await;
    let (with_old, with_kept) = (session(&gw, &old).await, session(&gw, &kept).await);
    assert_eq!(page(&gw, "/ui/", Some(&with_old)).await.0, StatusCode::OK);
    assert_eq!(page(&gw, "/ui/", Some(&with_kept)).await.0, StatusCode::OK);

    file.write(&[entry("acme", &[&kept], scopes)]);
    eventually(Duration::from_secs(15), "the rotated token's session to end", || async {
        (page(&gw, "/ui/", Some(&with_old)).await.0 == StatusCode::UNAUTHORIZED).then_some(())
    })
    .await;
    assert_eq!(page(&gw, "/ui/", Some(&with_kept)).await.0, StatusCode::OK, "the kept token's session stands");
    assert!(gw.logs().contains("session_credential_removed"), "the refusal is audited");

    // The operator ends every session of acme opened before the next whole second.
    let cut_off = chrono::DateTime::from_timestamp(chrono::Utc::now().timestamp() + 1, 0).unwrap();
    let ended = format!("{scopes}\nsessions_not_before = \"{}\"", cut_off.to_rfc3339());
    file.write(&[entry("acme", &[&kept], &ended)]);
    eventually(Duration::from_secs(15), "the operator's cut-off to end the session", || async {
        (page(&gw, "/ui/", Some(&with_kept)).await.0 == StatusCode::UNAUTHORIZED).then_some(())
    })
    .await;
    eventually(Duration::from_secs(15), "a session opened after the cut-off to stand", || async {
        let fresh = session(&gw, &kept).await;
        (page(&gw, "/ui/", Some(&fresh)).await.0 == StatusCode::OK).then_some(())
    })
    .await;
}

/// A sign-in form posted by a browser that sends no `Sec-Fetch-Site` is judged by `Origin`.
#[tokio::test(flavor = "multi_thread")]
async fn a_sign_in_without_sec_fetch_site_from_another_origin_is_refused() {
    let gw = Gateway::spawn().await;
    let host = gw.base_url.trim_start_matches("http://").to_string();
    let sign_in = |origin: String| {
        client()
            .post(gw.url("/ui/sign-in"))
            .header("origin", origin)
            .form(&[("token", gw.token.as_str()), ("next", "/ui/")])
            .send()
    };
    let refused = sign_in("https://evil.example".into()).await.unwrap();
    assert_eq!(refused.status(), StatusCode::FORBIDDEN);
    assert!(refused.headers().get(SET_COOKIE).is_none(), "no session for a cross-site form");
    let same_origin = sign_in(format!("http://{host}")).await.unwrap();
    assert_eq!(same_origin.status(), StatusCode::SEE_OTHER, "the console's own form");
}

/// Behind a TLS-terminating load balancer (`FILAMENT_BEHIND_TLS`) the session cookie is
/// `Secure` and `__Host-` prefixed (path `/`), and every answer carries HSTS.
#[tokio::test(flavor = "multi_thread")]
async fn behind_tls_the_session_cookie_is_host_prefixed_and_secure_and_answers_carry_hsts() {
    let gw = GatewayOptions::new().env("FILAMENT_BEHIND_TLS", "true").spawn().await;
    let answer = client()
        .post(gw.url("/ui/sign-in"))
        .form(&[("token", gw.token.as_str()), ("next", "/ui/")])
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), StatusCode::SEE_OTHER);
    let set_cookie = answer.headers()[SET_COOKIE].to_str().unwrap().to_string();
    let attributes: Vec<&str> = set_cookie.split("; ").collect();
    assert!(set_cookie.starts_with("__Host-filament_session="), "{set_cookie}");
    assert!(attributes.contains(&"Secure") && attributes.contains(&"Path=/"), "{set_cookie}");
    assert!(!set_cookie.contains("Domain"), "{set_cookie}");
    for answer in [answer, client().get(gw.url("/healthz")).send().await.unwrap()] {
        let hsts = answer.headers().get("strict-transport-security").map(|v| v.to_str().unwrap().to_string());
        assert_eq!(hsts.as_deref(), Some("max-age=31536000"));
    }
}
