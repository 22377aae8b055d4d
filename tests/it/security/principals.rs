//! Principals (issue 23): scoped credentials from a file reloaded without a restart. Every
//! refusal is specific and changes nothing (a database snapshot before and after), a run of
//! another principal is answered as one that does not exist, the audit trail records each
//! decision, and no log line ever holds a token or its digest.

use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::support::arrow::{ids, ipc_stream};
use crate::support::principals::{PrincipalsFile, digest, entry, new_token};
use crate::support::{Gateway, GatewayOptions, assert_problem, eventually, random_suffix, send};

/// Tokens of the principals every test here declares.
pub(super) struct Tokens {
    pub(super) acme: String,
    pub(super) other: String,
    pub(super) reader: String,
    pub(super) operator: String,
}

impl Tokens {
    pub(super) fn new() -> Self {
        Self { acme: new_token(), other: new_token(), reader: new_token(), operator: new_token() }
    }

    /// `acme` writes to `filament-demo.acme_*` with runs named `acme-*`; `other` writes
    /// anywhere in the project; `reader` only reads its own runs; `operator` reads every run and,
    /// writing nowhere, names no destination.
    pub(super) fn entries(&self) -> Vec<String> {
        vec![
            entry("acme", &[&self.acme], "destinations = [\"filament-demo.acme_*\"]\nrun_id_prefix = \"acme-\""),
            entry("other", &[&self.other], "destinations = [\"filament-demo.*\"]"),
            entry("reader", &[&self.reader], "destinations = [\"filament-demo.*\"]\nactions = [\"read\"]"),
            entry("operator", &[&self.operator], "actions = [\"read_all\"]"),
        ]
    }
}

pub(super) async fn as_principal(
    gw: &Gateway,
    token: &str,
    method: Method,
    path: &str,
    body: Option<Value>,
) -> (StatusCode, Value) {
    let mut request = gw.unauthenticated(method, path).bearer_auth(token);
    if let Some(body) = body {
        request = request.json(&body);
    }
    send(request).await
}

pub(super) async fn post_batch_as(gw: &Gateway, token: &str, path: &str, body: Vec<u8>) -> (StatusCode, Value) {
    let request = gw
        .unauthenticated(Method::POST, path)
        .bearer_auth(token)
        .header("content-type", "application/vnd.apache.arrow.stream")
        .body(body);
    send(request).await
}

/// A gateway with the four principals, and acme's run `acme-<suffix>` with resource `t`
/// declared and execution `e` open with one batch.
pub(super) async fn gateway_with_acme_run(tokens: &Tokens) -> (Gateway, PrincipalsFile, String, String) {
    let file = PrincipalsFile::new(&tokens.entries());
    let (name, path) = file.env();
    let gw = GatewayOptions::new().env(name, &path).spawn().await;
    let run = format!("acme-{}", random_suffix());
    let dataset = format!("acme_{}", random_suffix());
    let body = json!({"run_id": run, "destination": {"project": "filament-demo", "dataset": dataset}});
    let (status, created) = as_principal(&gw, &tokens.acme, Method::POST, "/v1/runs", Some(body)).await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    assert_eq!(created["principal"], "acme");
    let declaration = json!({"write_mode": "full_append"});
    let (status, _) =
        as_principal(&gw, &tokens.acme, Method::PUT, &format!("/v1/runs/{run}/resources/t"), Some(declaration)).await;
    assert_eq!(status, StatusCode::OK);
    let open = json!({"execution_id": "e"});
    let (status, _) =
        as_principal(&gw, &tokens.acme, Method::POST, &format!("/v1/runs/{run}/executions"), Some(open)).await;
    assert_eq!(status, StatusCode::CREATED);
    let batch = format!("/v1/runs/{run}/executions/e/resources/t/batches?seq=0");
    let (status, receipt) = post_batch_as(&gw, &tokens.acme, &batch, ipc_stream(&[ids(0..10)])).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{receipt}");
    (gw, file, run, dataset)
}

/// Every route under a run, with a body where it takes one.
pub(super) fn run_routes(run: &str) -> Vec<(Method, String, Option<Value>)> {
    let execution = format!("/v1/runs/{run}/executions/e");
    vec![
        (Method::GET, format!("/v1/runs/{run}"), None),
        (Method::PUT, format!("/v1/runs/{run}/resources/u"), Some(json!({"write_mode": "full_append"}))),
        (Method::POST, format!("/v1/runs/{run}/executions"), Some(json!({"execution_id": "e2"}))),
        (Method::GET, execution.clone(), None),
        (Method::POST, format!("{execution}/checkpoints"), Some(json!({"checkpoint": {"cursor": 1}}))),
        (Method::POST, format!("{execution}/pause"), None),
        (Method::POST, format!("{execution}/commit"), None),
        (Method::POST, format!("{execution}/abort"), None),
    ]
}

#[tokio::test(flavor = "multi_thread")]
async fn another_principals_run_is_answered_as_a_missing_one_on_every_route_and_nothing_changes() {
    let tokens = Tokens::new();
    let (gw, _file, run, _) = gateway_with_acme_run(&tokens).await;
    let before = gw.db_snapshot().await;
    for (method, path, body) in run_routes(&run) {
        let seen = as_principal(&gw, &tokens.other, method.clone(), &path, body.clone()).await;
        let problem = assert_problem(seen, StatusCode::NOT_FOUND, "run_not_found");
        let missing = as_principal(&gw, &tokens.other, method.clone(), &path.replace(&run, "acme-missing"), body).await;
        let missing = assert_problem(missing, StatusCode::NOT_FOUND, "run_not_found");
        assert_eq!(
            problem["detail"].as_str().unwrap().replace(&run, "X"),
            missing["detail"].as_str().unwrap().replace("acme-missing", "X"),
            "{method} {path}"
        );
    }
    let batch = format!("/v1/runs/{run}/executions/e/resources/t/batches?seq=1");
    let seen = post_batch_as(&gw, &tokens.other, &batch, ipc_stream(&[ids(10..20)])).await;
    assert_problem(seen, StatusCode::NOT_FOUND, "run_not_found");
    assert_eq!(gw.db_snapshot().await, before, "refusals changed nothing");
    // The owner and a `read_all` operator see it, with its principal.
    for token in [&tokens.acme, &tokens.operator] {
        let (status, view) = as_principal(&gw, token, Method::GET, &format!("/v1/runs/{run}"), None).await;
        assert_eq!(status, StatusCode::OK, "{view}");
        assert_eq!(view["principal"], "acme");
    }
    assert!(gw.logs().contains("audit.denied"), "the refusals are audited");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_missing_action_is_refused_naming_it_on_every_route_family_and_nothing_changes() {
    let tokens = Tokens::new();
    let (gw, _file, run, dataset) = gateway_with_acme_run(&tokens).await;
    let before = gw.db_snapshot().await;
    let create = json!({"run_id": "r2", "destination": {"project": "filament-demo", "dataset": dataset}});
    let cases = [
        (Method::POST, "/v1/runs".to_string(), Some(create), "write"),
        (Method::PUT, format!("/v1/runs/{run}/resources/u"), Some(json!({"write_mode": "full_append"})), "write"),
        (Method::POST, format!("/v1/runs/{run}/executions"), Some(json!({})), "write"),
        (Method::POST, format!("/v1/runs/{run}/executions/e/checkpoints"), Some(json!({"checkpoint": 1})), "write"),
        (Method::POST, format!("/v1/runs/{run}/executions/e/pause"), None, "write"),
        (Method::POST, format!("/v1/runs/{run}/executions/e/commit"), None, "commit"),
        (Method::POST, format!("/v1/runs/{run}/executions/e/abort"), None, "abort"),
        (Method::POST, "/v1/connections/test".to_string(), Some(json!({"project": "filament-demo"})), "write"),
    ];
    for (method, path, body, action) in cases {
        let seen = as_principal(&gw, &tokens.reader, method.clone(), &path, body).await;
        let problem = assert_problem(seen, StatusCode::FORBIDDEN, "action_not_permitted");
        assert!(problem["detail"].as_str().unwrap().contains(action), "{method} {path}: {problem}");
    }
    let batch = format!("/v1/runs/{run}/executions/e/resources/t/batches?seq=1");
    let seen = post_batch_as(&gw, &tokens.reader, &batch, ipc_stream(&[ids(10..20)])).await;
    assert_problem(seen, StatusCode::FORBIDDEN, "action_not_permitted");
    // An operator may read every run but write none.
    let seen =
        as_principal(&gw, &tokens.operator, Method::POST, &format!("/v1/runs/{run}/executions/e/commit"), None).await;
    assert_problem(seen, StatusCode::FORBIDDEN, "action_not_permitted");
    assert_eq!(gw.db_snapshot().await, before, "refusals changed nothing");
}

#[tokio::test(flavor = "multi_thread")]
async fn destinations_and_run_ids_outside_the_principals_scope_are_refused_and_nothing_changes() {
    let tokens = Tokens::new();
    let (gw, _file, _run, dataset) = gateway_with_acme_run(&tokens).await;
    let before = gw.db_snapshot().await;
    let outside = json!({"run_id": "acme-2", "destination": {"project": "filament-demo", "dataset": "finance"}});
    let problem = assert_problem(
        as_principal(&gw, &tokens.acme, Method::POST, "/v1/runs", Some(outside)).await,
        StatusCode::FORBIDDEN,
        "destination_not_permitted",
    );
    let detail = problem["detail"].as_str().unwrap();
    assert!(detail.contains("filament-demo") && detail.contains("finance"), "{problem}");
    let elsewhere = json!({"run_id": "acme-3", "destination": {"project": "acme-other", "dataset": dataset}});
    assert_problem(
        as_principal(&gw, &tokens.acme, Method::POST, "/v1/runs", Some(elsewhere)).await,
        StatusCode::FORBIDDEN,
        "destination_not_permitted",
    );
    let billed_elsewhere = json!({"run_id": "acme-4", "destination": {"project": "filament-demo", "dataset": dataset}, "job_project": "someone-else"});
    assert_problem(
        as_principal(&gw, &tokens.acme, Method::POST, "/v1/runs", Some(billed_elsewhere)).await,
        StatusCode::FORBIDDEN,
        "destination_not_permitted",
    );
    let unprefixed = json!({"run_id": "orders-1", "destination": {"project": "filament-demo", "dataset": dataset}});
    assert_problem(
        as_principal(&gw, &tokens.acme, Method::POST, "/v1/runs", Some(unprefixed)).await,
        StatusCode::FORBIDDEN,
        "run_id_not_permitted",
    );
    assert_problem(
        as_principal(&gw, &tokens.acme, Method::POST, "/v1/connections/test", Some(json!({"project": "acme-other"})))
            .await,
        StatusCode::FORBIDDEN,
        "destination_not_permitted",
    );
    // Another principal's run id is taken, and nothing more is said about it.
    let taken = json!({"run_id": _run, "destination": {"project": "filament-demo", "dataset": dataset}});
    let problem = assert_problem(
        as_principal(&gw, &tokens.other, Method::POST, "/v1/runs", Some(taken)).await,
        StatusCode::CONFLICT,
        "run_conflict",
    );
    assert!(!problem["detail"].as_str().unwrap().contains("acme_"), "{problem}");
    assert_problem(
        as_principal(&gw, "fbq_not-a-configured-token", Method::GET, "/v1/runs/x", None).await,
        StatusCode::UNAUTHORIZED,
        "unauthorized",
    );
    assert_eq!(gw.db_snapshot().await, before, "refusals changed nothing");
    // Without a run id, acme's runs are named with its prefix.
    let generated = json!({"destination": {"project": "filament-demo", "dataset": dataset}});
    let (status, created) = as_principal(&gw, &tokens.acme, Method::POST, "/v1/runs", Some(generated)).await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    assert!(created["run_id"].as_str().unwrap().starts_with("acme-"), "{created}");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_edited_principals_file_applies_without_a_restart_and_a_broken_one_keeps_the_last() {
    let tokens = Tokens::new();
    let file = PrincipalsFile::new(&tokens.entries());
    let (name, path) = file.env();
    let gw = GatewayOptions::new().env(name, &path).spawn().await;
    let probe = |token: String| {
        let gw = &gw;
        async move { as_principal(gw, &token, Method::GET, "/v1/runs/acme-none", None).await.0 }
    };
    assert_eq!(probe(tokens.acme.clone()).await, StatusCode::NOT_FOUND, "acme's token works");
    // Rotation: acme's entry now lists a new token only.
    let rotated = new_token();
    let mut entries = tokens.entries();
    entries[0] = entry("acme", &[&rotated], "destinations = [\"filament-demo.acme_*\"]");
    file.write(&entries);
    eventually(Duration::from_secs(15), "the old token to be refused", || async {
        (probe(tokens.acme.clone()).await == StatusCode::UNAUTHORIZED).then_some(())
    })
    .await;
    assert_eq!(probe(rotated.clone()).await, StatusCode::NOT_FOUND, "the new token works");
    // A broken file is refused whole: the principals in force stay.
    file.write_text(&format!("{}[[principal]]\nname = \"broken\"\nactions = [\"fly\"]\n", entries.concat()));
    eventually(Duration::from_secs(15), "the refused reload to be counted", || async {
        (gw.metric("filament_principals_reload_errors_total").await.unwrap_or(0.0) >= 1.0).then_some(())
    })
    .await;
    let logs = gw.logs();
    assert!(logs.contains("principals.reload_refused") && logs.contains("line "), "the ERROR names the line");
    assert_eq!(probe(rotated).await, StatusCode::NOT_FOUND, "the previous principals stay in force");
    assert_eq!(probe(tokens.other.clone()).await, StatusCode::NOT_FOUND);
    assert!(logs.contains("audit.principals_reloaded"));
}

#[tokio::test(flavor = "multi_thread")]
async fn the_log_of_a_whole_run_holds_no_token_and_no_digest() {
    let tokens = Tokens::new();
    let (gw, _file, run, _) = gateway_with_acme_run(&tokens).await;
    let _ = as_principal(&gw, &tokens.other, Method::GET, &format!("/v1/runs/{run}"), None).await;
    let _ = as_principal(&gw, "fbq_wrong-token-0123456789", Method::GET, "/v1/runs/x", None).await;
    let commit = format!("/v1/runs/{run}/executions/e/commit?wait=true");
    let (status, committed) = as_principal(&gw, &tokens.acme, Method::POST, &commit, None).await;
    assert_eq!((status, committed["state"].as_str()), (StatusCode::OK, Some("committed")), "{committed}");
    let open = json!({"execution_id": "e2"});
    as_principal(&gw, &tokens.acme, Method::POST, &format!("/v1/runs/{run}/executions"), Some(open)).await;
    let (status, _) =
        as_principal(&gw, &tokens.acme, Method::POST, &format!("/v1/runs/{run}/executions/e2/abort"), None).await;
    assert_eq!(status, StatusCode::OK);
    let logs = gw.logs();
    for event in ["audit.run_created", "audit.execution_committed", "audit.execution_aborted", "audit.denied"] {
        assert!(logs.contains(event), "{event} logged");
    }
    for secret in [tokens.acme.as_str(), tokens.other.as_str(), "fbq_wrong-token-0123456789"] {
        assert!(!logs.contains(secret), "a token in the log");
        assert!(!logs.contains(&digest(secret)), "a digest in the log");
    }
}

/// Principal `flood` floods the gateway with concurrent 1 MiB batches against a 4 MiB share of
/// a 16 MiB budget (BigQuery acknowledging its table slowly); principal `steady` posts a small
/// batch every 100 ms meanwhile. `steady` is never refused, `flood` gets 429 `principal_limit`
/// with `Retry-After`. (The latency figure is the benchmark's, docs/performance.md.)
#[tokio::test(flavor = "multi_thread")]
async fn a_principal_over_its_share_is_refused_while_another_is_served() {
    use crate::support::fake_write::FakeWrite;
    let (flood, steady) = (new_token(), new_token());
    let file = PrincipalsFile::new(&[
        entry("flood", &[&flood], "destinations = [\"filament-demo.*\"]\nmax_buffered_bytes = 4194304"),
        entry("steady", &[&steady], "destinations = [\"filament-demo.*\"]"),
    ]);
    let fake = FakeWrite::start().await;
    fake.with(|s| s.table_delays.push(("stg_flood".into(), Duration::from_millis(400))));
    let (name, path) = file.env();
    let gw = GatewayOptions::new()
        .fake_write(&fake)
        .env(name, &path)
        .env("FILAMENT_MAX_BUFFERED_BYTES", "16777216")
        .env("FILAMENT_BACKPRESSURE_WAIT_MS", "1000")
        .spawn()
        .await;
    let gw = std::sync::Arc::new(gw);
    for (token, run) in [(&flood, "flood"), (&steady, "steady")] {
        let body = json!({"run_id": run, "destination": {"project": "filament-demo", "dataset": gw.dataset}});
        assert_eq!(as_principal(&gw, token, Method::POST, "/v1/runs", Some(body)).await.0, StatusCode::CREATED);
        let path = format!("/v1/runs/{run}/resources/{run}");
        as_principal(&gw, token, Method::PUT, &path, Some(json!({"write_mode": "full_append"}))).await;
        as_principal(
            &gw,
            token,
            Method::POST,
            &format!("/v1/runs/{run}/executions"),
            Some(json!({"execution_id": "e"})),
        )
        .await;
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(6);
    let limited = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut flooders = Vec::new();
    for worker in 0..16i64 {
        let (gw, flood, limited) = (std::sync::Arc::clone(&gw), flood.clone(), std::sync::Arc::clone(&limited));
        flooders.push(tokio::spawn(async move {
            let mut seq = worker * 1000;
            while tokio::time::Instant::now() < deadline {
                let body = ipc_stream(&[ids(seq * 131_072..(seq + 1) * 131_072)]);
                let path = format!("/v1/runs/flood/executions/e/resources/flood/batches?seq={seq}");
                let (status, answer) = post_batch_as(&gw, &flood, &path, body).await;
                match status {
                    StatusCode::ACCEPTED => seq += 1,
                    StatusCode::TOO_MANY_REQUESTS if answer["code"] == "principal_limit" => {
                        limited.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                    other => panic!("flood batch: {other} {answer}"),
                }
            }
        }));
    }
    let mut seq = 0;
    while tokio::time::Instant::now() < deadline {
        let path = format!("/v1/runs/steady/executions/e/resources/steady/batches?seq={seq}");
        let (status, answer) = post_batch_as(&gw, &steady, &path, ipc_stream(&[ids(seq * 100..(seq + 1) * 100)])).await;
        assert_eq!(status, StatusCode::ACCEPTED, "steady batch {seq} refused while flood floods: {answer}");
        seq += 1;
        // The steady extractor's pace: a batch every 100 ms for as long as the flood lasts.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for flooder in flooders {
        flooder.await.unwrap();
    }
    assert!(seq >= 20, "steady posted {seq} batches");
    assert!(limited.load(std::sync::atomic::Ordering::Relaxed) > 0, "flood was held to its share");
}

/// A batch posted to a replica that does not serve the execution is forwarded with the
/// caller's credential, and the serving replica decides as the principal: acme's batch is
/// accepted through the second replica. Only a run the caller sees is forwarded: another
/// principal's batch is answered by the second replica itself as for a missing run, and a
/// token no principal holds is refused there too, forwarding nothing.
#[tokio::test(flavor = "multi_thread")]
async fn a_forwarded_batch_keeps_its_principal() {
    let tokens = Tokens::new();
    let (first, file, run, _) = gateway_with_acme_run(&tokens).await;
    let (name, path) = file.env();
    let second = GatewayOptions::new()
        .database_url(&first.database_url)
        .env(name, &path)
        .env("FILAMENT_API_TOKENS", &first.token)
        .spawn()
        .await;
    let batch = format!("/v1/runs/{run}/executions/e/resources/t/batches?seq=1");
    let refused = post_batch_as(&second, &tokens.other, &batch, ipc_stream(&[ids(10..20)])).await;
    assert_problem(refused, StatusCode::NOT_FOUND, "run_not_found");
    let unknown = post_batch_as(&second, "fbq_nobody-holds-this-token", &batch, ipc_stream(&[ids(10..20)])).await;
    assert_problem(unknown, StatusCode::UNAUTHORIZED, "unauthorized");
    let forwarded = second.metric("filament_requests_forwarded_total").await;
    assert_eq!(forwarded, None, "neither another principal's nor an unknown token's request was forwarded");
    let (status, receipt) = post_batch_as(&second, &tokens.acme, &batch, ipc_stream(&[ids(10..20)])).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{receipt}");
    assert_eq!(second.metric("filament_requests_forwarded_total").await, Some(1.0), "served by the first replica");
    let commit = format!("/v1/runs/{run}/executions/e/commit?wait=true");
    let (status, committed) = as_principal(&second, &tokens.acme, Method::POST, &commit, None).await;
    assert_eq!((status, committed["state"].as_str()), (StatusCode::OK, Some("committed")), "{committed}");
    assert_eq!(committed["resources"][0]["rows_acknowledged"], 20, "both batches, once each: {committed}");
}
