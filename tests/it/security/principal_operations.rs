//! Operating principals (issue 23): minting a token, reading every run with `read_all`, a
//! narrowed principal, SIGHUP without a principals file, a development token refused beside
//! real credentials, and `/metrics` that names no principal and can ask for a scrape token.
//! Every refusal is specific and changes nothing.

use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde_json::json;

use super::principals::{Tokens, as_principal, gateway_with_acme_run, post_batch_as, run_routes};
use crate::support::arrow::{ids, ipc_stream};
use crate::support::principals::{PrincipalsFile, digest, entry, new_token};
use crate::support::{Gateway, GatewayOptions, assert_problem, eventually};

/// `token new --principal NAME` prints a fresh `fbq_` token of 256 random bits and the exact
/// `token_sha256` line for it; that line in the file makes the token the principal's.
#[tokio::test(flavor = "multi_thread")]
async fn token_new_prints_a_token_and_the_line_that_admits_it() {
    let token_new = |principal: &str| {
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_filament-bigquery"))
            .args(["token", "new", "--principal", principal])
            .env_clear()
            .output()
            .unwrap();
        (output.status.success(), String::from_utf8_lossy(&output.stdout).into_owned())
    };
    let (ok, printed) = token_new("acme");
    assert!(ok, "{printed}");
    let token = printed.lines().next().unwrap().trim().to_string();
    let hex = token.strip_prefix("fbq_").expect("the fbq_ prefix");
    assert!(hex.len() >= 64 && hex.bytes().all(|b| b.is_ascii_hexdigit()), "256 bits at least: {token}");
    let line = printed.lines().find(|l| l.starts_with("token_sha256 = ")).expect("the line to add");
    assert_eq!(line, format!("token_sha256 = [\"{}\"]", digest(&token)));
    assert_ne!(token_new("acme").1, printed, "a new token each time");
    assert!(!token_new("not a name").0, "an invalid principal name is refused");
    let file = PrincipalsFile::new(&[]);
    file.write_text(&format!("[[principal]]\nname = \"acme\"\n{line}\ndestinations = [\"filament-demo.*\"]\n"));
    let (name, path) = file.env();
    let gw = GatewayOptions::new().env(name, &path).spawn().await;
    let body = json!({"run_id": "r", "destination": {"project": "filament-demo", "dataset": gw.dataset}});
    let (status, created) = as_principal(&gw, &token, Method::POST, "/v1/runs", Some(body)).await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    assert_eq!(created["principal"], "acme");
}

/// `read_all` is for reading: a principal with it and every write action still changes only
/// its own runs. On every changing route of another's run it gets 403 `action_not_permitted`
/// (it may read the run, so no 404), and nothing changes; reading works.
#[tokio::test(flavor = "multi_thread")]
async fn read_all_reads_every_run_but_changes_only_its_own() {
    let tokens = Tokens::new();
    let (gw, file, run, _) = gateway_with_acme_run(&tokens).await;
    let orchestrator = new_token();
    let mut entries = tokens.entries();
    let actions = "destinations = [\"filament-demo.*\"]\nactions = [\"write\", \"commit\", \"abort\", \"read_all\"]";
    entries.push(entry("orchestrator", &[&orchestrator], actions));
    file.write(&entries);
    let run_path = format!("/v1/runs/{run}");
    eventually(Duration::from_secs(15), "the reloaded file to admit the orchestrator", || async {
        (as_principal(&gw, &orchestrator, Method::GET, &run_path, None).await.0 == StatusCode::OK).then_some(())
    })
    .await;
    let before = gw.db_snapshot().await;
    for (method, path, body) in run_routes(&run).into_iter().filter(|(method, _, _)| *method != Method::GET) {
        let refused = as_principal(&gw, &orchestrator, method.clone(), &path, body).await;
        let problem = assert_problem(refused, StatusCode::FORBIDDEN, "action_not_permitted");
        assert!(problem["detail"].as_str().unwrap().contains("not change it"), "{method} {path}: {problem}");
    }
    let batch = format!("/v1/runs/{run}/executions/e/resources/t/batches?seq=1");
    let refused = post_batch_as(&gw, &orchestrator, &batch, ipc_stream(&[ids(10..20)])).await;
    assert_problem(refused, StatusCode::FORBIDDEN, "action_not_permitted");
    assert_eq!(gw.db_snapshot().await, before, "refusals changed nothing");
    let events = format!("/v1/runs/{run}/executions/e/events");
    for path in [run_path.clone(), format!("{run_path}/executions/e"), events] {
        assert_eq!(as_principal(&gw, &orchestrator, Method::GET, &path, None).await.0, StatusCode::OK, "{path}");
    }
}

/// In the simple mode (`FILAMENT_API_TOKENS`, no principals file) a SIGHUP, the reload signal,
/// reloads nothing and leaves the gateway serving (without a handler it would end the process).
#[tokio::test(flavor = "multi_thread")]
async fn a_sighup_without_a_principals_file_keeps_the_gateway_serving() {
    let gw = Gateway::spawn().await;
    let hangup = std::process::Command::new("kill").args(["-HUP", &gw.pid().to_string()]).status().unwrap();
    assert!(hangup.success());
    eventually(Duration::from_secs(10), "the SIGHUP to be noted", || async {
        gw.logs().contains("principals.reload_skipped").then_some(())
    })
    .await;
    let (status, page) = gw.json(Method::GET, "/v1/runs", None).await;
    assert_eq!(status, StatusCode::OK, "still serving after SIGHUP: {page}");
}

/// A generated development token is the all-powerful `default` principal's: the gateway
/// refuses to start with one beside configured tokens or a principals file, naming both.
#[tokio::test(flavor = "multi_thread")]
async fn a_development_token_beside_real_credentials_is_refused_at_start() {
    let file = PrincipalsFile::new(&[entry("ops", &[&new_token()], "actions = [\"read_all\"]")]);
    let (name, path) = file.env();
    let settings: [(&str, String); 2] = [(name, path), ("FILAMENT_API_TOKENS", new_token())];
    for (setting, value) in settings {
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_filament-bigquery"))
            .args(["serve", "--dev-generate-token"])
            .env_clear()
            .env("DATABASE_URL", "postgres://127.0.0.1:1/none")
            .env(setting, value)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{setting}: it started");
        assert!(
            stderr.contains("FILAMENT_API_TOKENS") && stderr.contains("FILAMENT_PRINCIPALS_FILE"),
            "{setting}: {stderr}"
        );
        assert!(!String::from_utf8_lossy(&output.stdout).contains("development token"), "{setting}: no token printed");
    }
}

/// `/metrics` needs no credential: after a run, a commit and a denial it names no principal,
/// run, dataset or table (the audit log and the timing events do).
#[tokio::test(flavor = "multi_thread")]
async fn metrics_name_no_principal_run_dataset_or_table() {
    let tokens = Tokens::new();
    let (gw, _file, run, dataset) = gateway_with_acme_run(&tokens).await;
    let (status, _) = as_principal(&gw, &tokens.other, Method::GET, &format!("/v1/runs/{run}"), None).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "a denial was recorded");
    let commit = format!("/v1/runs/{run}/executions/e/commit?wait=true");
    let (status, committed) = as_principal(&gw, &tokens.acme, Method::POST, &commit, None).await;
    assert_eq!((status, committed["state"].as_str()), (StatusCode::OK, Some("committed")), "{committed}");
    let metrics = gw.metrics().await;
    assert!(metrics.contains("filament_audit_denials_total{reason="), "{metrics}");
    for name in ["acme", "\"other\"", &run, &dataset, "principal=", "dataset=", "table=", "resource="] {
        assert!(!metrics.contains(name), "/metrics names {name:?}:\n{metrics}");
    }
}

/// Scopes are the principal's current ones on every changing request: once the operator
/// narrows acme (another run-id prefix, then another dataset), every changing route of its old
/// run is refused with the scope's code and nothing changes; reading it still works.
#[tokio::test(flavor = "multi_thread")]
async fn a_narrowed_principal_is_refused_on_every_changing_route_of_its_old_run_and_nothing_changes() {
    let tokens = Tokens::new();
    let (gw, file, run, _) = gateway_with_acme_run(&tokens).await;
    let redeclare = format!("/v1/runs/{run}/resources/t");
    let narrowings = [
        ("destinations = [\"filament-demo.acme_*\"]\nrun_id_prefix = \"acme2-\"", "run_id_not_permitted"),
        ("destinations = [\"filament-demo.elsewhere_*\"]\nrun_id_prefix = \"acme-\"", "destination_not_permitted"),
    ];
    for (scopes, code) in narrowings {
        let mut entries = tokens.entries();
        entries[0] = entry("acme", &[&tokens.acme], scopes);
        file.write(&entries);
        eventually(Duration::from_secs(15), "the narrowed scopes to apply", || async {
            let declaration = json!({"write_mode": "full_append"});
            let (_, refused) = as_principal(&gw, &tokens.acme, Method::PUT, &redeclare, Some(declaration)).await;
            (refused["code"] == code).then_some(())
        })
        .await;
        let before = gw.db_snapshot().await;
        for (method, path, body) in run_routes(&run).into_iter().filter(|(method, ..)| *method != Method::GET) {
            let refused = as_principal(&gw, &tokens.acme, method.clone(), &path, body).await;
            assert_problem(refused, StatusCode::FORBIDDEN, code);
        }
        let batch = format!("/v1/runs/{run}/executions/e/resources/t/batches?seq=1");
        assert_problem(
            post_batch_as(&gw, &tokens.acme, &batch, ipc_stream(&[ids(10..20)])).await,
            StatusCode::FORBIDDEN,
            code,
        );
        assert_eq!(gw.db_snapshot().await, before, "{code}: refusals changed nothing");
        let (status, view) = as_principal(&gw, &tokens.acme, Method::GET, &format!("/v1/runs/{run}"), None).await;
        assert_eq!(status, StatusCode::OK, "reading its old run still works: {view}");
    }
}

/// With `FILAMENT_METRICS_TOKEN`, `/metrics` answers only a scraper presenting it.
#[tokio::test(flavor = "multi_thread")]
async fn metrics_behind_a_scrape_token_answer_only_the_scraper() {
    let scrape = new_token();
    let gw = GatewayOptions::new().env("FILAMENT_METRICS_TOKEN", &scrape).spawn().await;
    let scraped = |token: Option<String>| {
        let mut request = gw.unauthenticated(Method::GET, "/metrics");
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        async move { request.send().await.unwrap() }
    };
    let refused = scraped(None).await;
    assert_eq!(refused.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(refused.headers()["www-authenticate"], "Bearer");
    assert_eq!(scraped(Some(gw.token.clone())).await.status(), StatusCode::UNAUTHORIZED, "an API token is not it");
    let answered = scraped(Some(scrape)).await;
    assert_eq!(answered.status(), StatusCode::OK);
    assert!(answered.text().await.unwrap().contains("filament_http_requests_total"));
}
