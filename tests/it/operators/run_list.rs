//! The runs list (`GET /v1/runs`, issue 24, item 1) against the real gateway and Postgres:
//! newest first with the latest execution's progress, each filter, keyset pagination that a
//! run created between two pages does not shift, and the principals' scopes (a principal never
//! sees another's runs; `read_all` sees all).

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::support::arrow::{ids, ipc_stream};
use crate::support::principals::{PrincipalsFile, entry, new_token};
use crate::support::{Gateway, GatewayOptions, assert_problem};

fn run_ids(page: &Value) -> Vec<String> {
    page["runs"].as_array().unwrap().iter().map(|run| run["run_id"].as_str().unwrap().to_string()).collect()
}

async fn list(gw: &Gateway, query: &str) -> Value {
    let (status, page) = gw.json(Method::GET, &format!("/v1/runs{query}"), None).await;
    assert_eq!(status, StatusCode::OK, "{page}");
    page
}

/// Runs `r00`..`r{count-1}`, created in that order; `r00` gets an execution with ten
/// committed rows, `r01` an aborted one, `r02` one still extracting, the others none.
async fn create_runs(gw: &Gateway, count: usize) {
    for n in 0..count {
        gw.create_run(&format!("r{n:02}")).await;
    }
    gw.declare("r00", "t", json!({"write_mode": "full_append"})).await;
    gw.open_new_execution("r00", "e").await;
    gw.post_accepted("r00", "e", "t", Some(0), ipc_stream(&[ids(0..10)])).await;
    assert_eq!(gw.commit_and_wait("r00", "e").await["state"], "committed");
    gw.open_new_execution("r01", "e").await;
    let (status, aborted) = gw.json(Method::POST, "/v1/runs/r01/executions/e/abort", None).await;
    assert_eq!(status, StatusCode::OK, "{aborted}");
    gw.open_new_execution("r02", "e").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn runs_are_listed_newest_first_with_their_latest_execution_and_filtered() {
    let gw = Gateway::spawn().await;
    create_runs(&gw, 4).await;
    let page = list(&gw, "").await;
    assert_eq!(run_ids(&page), ["r03", "r02", "r01", "r00"]);
    assert!(page.get("next_page_token").is_none(), "one page: {page}");
    let committed = &page["runs"][3];
    assert_eq!(committed["principal"], "default");
    assert_eq!(committed["destination"], json!({"project": gw.project, "dataset": gw.dataset}));
    let latest = &committed["latest_execution"];
    assert_eq!((latest["execution_id"].as_str(), latest["state"].as_str()), (Some("e"), Some("committed")), "{latest}");
    assert_eq!((latest["rows_received"].as_i64(), latest["rows_acknowledged"].as_i64()), (Some(10), Some(10)));
    assert!(latest["bytes_received"].as_i64().unwrap() > 0, "{latest}");
    assert!(page["runs"][0]["latest_execution"].is_null(), "a run without an execution: {page}");
    assert_eq!(run_ids(&list(&gw, "?state=aborted").await), ["r01"]);
    assert_eq!(run_ids(&list(&gw, "?state=extracting").await), ["r02"]);
    assert_eq!(run_ids(&list(&gw, "?state=failed").await), Vec::<String>::new());
    assert_eq!(run_ids(&list(&gw, &format!("?dataset={}", gw.dataset)).await).len(), 4);
    assert_eq!(run_ids(&list(&gw, "?dataset=another_dataset").await), Vec::<String>::new());
    let created = |n: usize| page["runs"][3 - n]["created_at"].as_str().unwrap().to_string();
    let query = |name: &str, value: String| format!("?{}", serde_urlencoded::to_string([(name, value)]).unwrap());
    let after_r01 = list(&gw, &query("created_after", created(1))).await;
    assert_eq!(run_ids(&after_r01), ["r03", "r02"]);
    let before_r02 = list(&gw, &query("created_before", created(2))).await;
    assert_eq!(run_ids(&before_r02), ["r01", "r00"]);
    assert_eq!(run_ids(&list(&gw, "?principal=default&state=committed").await), ["r00"]);
}

#[tokio::test(flavor = "multi_thread")]
async fn pages_stay_stable_while_new_runs_arrive_and_bad_parameters_are_refused() {
    let gw = Gateway::spawn().await;
    create_runs(&gw, 12).await;
    let first = list(&gw, "?limit=5").await;
    assert_eq!(run_ids(&first), ["r11", "r10", "r09", "r08", "r07"]);
    // A run created between two pages sorts before them: the next pages do not shift.
    gw.create_run("r12").await;
    let token = first["next_page_token"].as_str().expect("a next page").to_string();
    let second = list(&gw, &format!("?limit=5&page_token={token}")).await;
    assert_eq!(run_ids(&second), ["r06", "r05", "r04", "r03", "r02"]);
    let token = second["next_page_token"].as_str().expect("a last page").to_string();
    let last = list(&gw, &format!("?limit=5&page_token={token}")).await;
    assert_eq!(run_ids(&last), ["r01", "r00"]);
    assert!(last.get("next_page_token").is_none(), "{last}");
    assert_eq!(run_ids(&list(&gw, "?limit=1").await), ["r12"]);
    assert_eq!(list(&gw, "").await["runs"].as_array().unwrap().len(), 13, "50 per page by default");
    let before = gw.db_snapshot().await;
    for (query, code) in [
        ("?page_token=not-a-token", "invalid_page_token"),
        ("?page_token=e30", "invalid_page_token"),
        ("?limit=501", "invalid_request"),
        ("?limit=0", "invalid_request"),
        ("?state=sleeping", "invalid_request"),
        ("?created_after=yesterday", "invalid_request"),
        ("?colour=blue", "invalid_request"),
        // Found by schemathesis: a NUL byte reached Postgres, which refused it (500).
        ("?principal=%00", "invalid_request"),
        ("?principal=a%20b", "invalid_request"),
        ("?created_after=-10000-01-01T00:00:00Z", "invalid_request"),
    ] {
        assert_problem(gw.json(Method::GET, &format!("/v1/runs{query}"), None).await, StatusCode::BAD_REQUEST, code);
    }
    for dataset in ["%C3%AC", "%00", "raw-data"] {
        let answer = gw.json(Method::GET, &format!("/v1/runs?dataset={dataset}"), None).await;
        assert_problem(answer, StatusCode::UNPROCESSABLE_ENTITY, "invalid_dataset_id");
    }
    assert_eq!(gw.db_snapshot().await, before, "a refused list changes nothing");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_principal_lists_only_its_own_runs_and_read_all_lists_every_run() {
    let (acme, other, operator, writer) = (new_token(), new_token(), new_token(), new_token());
    let file = PrincipalsFile::new(&[
        entry("acme", &[&acme], "destinations = [\"filament-demo.*\"]"),
        entry("other", &[&other], "destinations = [\"filament-demo.*\"]"),
        entry("operator", &[&operator], "destinations = [\"none.none\"]\nactions = [\"read_all\"]"),
        entry("writer", &[&writer], "destinations = [\"filament-demo.*\"]\nactions = [\"write\"]"),
    ]);
    let (name, path) = file.env();
    let gw = GatewayOptions::new().env(name, &path).spawn().await;
    let as_principal = |token: &str, method: Method, path: &str, body: Option<Value>| {
        let mut request = gw.unauthenticated(method, path).bearer_auth(token);
        if let Some(body) = body {
            request = request.json(&body);
        }
        crate::support::send(request)
    };
    for (token, run) in [(&acme, "acme-1"), (&other, "other-1"), (&acme, "acme-2")] {
        let body = json!({"run_id": run, "destination": {"project": "filament-demo", "dataset": gw.dataset}});
        assert_eq!(as_principal(token, Method::POST, "/v1/runs", Some(body)).await.0, StatusCode::CREATED);
    }
    let listed = |token: String, query: &'static str| {
        let request = as_principal(&token, Method::GET, &format!("/v1/runs{query}"), None);
        async move {
            let (status, page) = request.await;
            assert_eq!(status, StatusCode::OK, "{page}");
            run_ids(&page)
        }
    };
    assert_eq!(listed(acme.clone(), "").await, ["acme-2", "acme-1"]);
    assert_eq!(listed(other.clone(), "").await, ["other-1"]);
    assert_eq!(listed(acme.clone(), "?principal=other").await, Vec::<String>::new(), "never another's runs");
    assert_eq!(listed(acme.clone(), "?principal=acme").await, ["acme-2", "acme-1"]);
    assert_eq!(listed(operator.clone(), "").await, ["acme-2", "other-1", "acme-1"]);
    assert_eq!(listed(operator.clone(), "?principal=other").await, ["other-1"]);
    let refused = as_principal(&writer, Method::GET, "/v1/runs", None).await;
    assert_problem(refused, StatusCode::FORBIDDEN, "action_not_permitted");
}
