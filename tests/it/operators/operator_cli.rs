//! The operator's CLI (issue 24, item 5) against the real gateway: `runs list` (table and
//! `--json`, every page), `runs show`, `runs events [--follow]`, and `runs watch` exiting 0 on a committed execution and
//! 1 on a failed one with its code (and hint, when it has one); a wrong token: exit 2.

use serde_json::{Value, json};

use crate::support::arrow::{ids, ipc_stream};
use crate::support::fake_write::{AppendFault, FakeWrite};
use crate::support::{Gateway, GatewayOptions, TestRun};

/// `filament-bigquery runs ARGS...` against `gw`: (exit code, standard output, standard error).
fn runs(gw: &Gateway, token: &str, args: &[&str]) -> (i32, String, String) {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_filament-bigquery"))
        .arg("runs")
        .args(args)
        .env_clear()
        .env("FILAMENT_URL", &gw.base_url)
        .env("FILAMENT_TOKEN", token)
        .output()
        .unwrap();
    let text = |bytes: &[u8]| String::from_utf8_lossy(bytes).into_owned();
    (output.status.code().unwrap_or(-1), text(&output.stdout), text(&output.stderr))
}

#[tokio::test(flavor = "multi_thread")]
async fn runs_list_show_and_watch_a_committed_execution() {
    let gw = Gateway::spawn().await;
    for n in 0..3 {
        gw.create_run(&format!("cli-{n}")).await;
    }
    gw.declare("cli-2", "t", json!({"write_mode": "full_append"})).await;
    gw.open_new_execution("cli-2", "e").await;
    gw.post_accepted("cli-2", "e", "t", Some(0), ipc_stream(&[ids(0..7)])).await;
    assert_eq!(gw.commit_and_wait("cli-2", "e").await["state"], "committed");

    let (code, table, stderr) = runs(&gw, &gw.token, &["list"]);
    assert_eq!(code, 0, "{stderr}");
    let lines: Vec<&str> = table.lines().collect();
    assert!(lines[0].starts_with("RUN") && lines[0].contains("STATE"), "{table}");
    assert!(lines[1].starts_with("cli-2") && lines[1].contains("committed") && lines[1].contains("7/7"), "{table}");
    assert_eq!(lines.len(), 4, "a header and three runs, newest first: {table}");
    let column = lines[0].find("STATE").unwrap();
    assert!(lines.iter().skip(1).all(|line| line.len() >= column), "aligned columns: {table}");

    let (code, json_out, _) = runs(&gw, &gw.token, &["list", "--json", "--limit", "2"]);
    assert_eq!(code, 0);
    let listed: Value = serde_json::from_str(&json_out).unwrap();
    let ids: Vec<&str> = listed.as_array().unwrap().iter().map(|r| r["run_id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["cli-2", "cli-1"], "--limit across pages: {json_out}");

    let (code, shown, _) = runs(&gw, &gw.token, &["show", "cli-2"]);
    assert_eq!(code, 0);
    assert!(shown.contains("run cli-2") && shown.contains("full_append") && shown.contains("committed"), "{shown}");

    let (code, watched, stderr) = runs(&gw, &gw.token, &["watch", "cli-2", "e", "--interval-secs", "1"]);
    assert_eq!(code, 0, "{watched}{stderr}");
    assert!(watched.contains("e committed") && watched.contains("7/7 rows"), "{watched}");

    let (code, timeline, _) = runs(&gw, &gw.token, &["events", "cli-2", "e", "--follow"]);
    assert_eq!(code, 0, "--follow ends with the execution");
    let kinds: Vec<&str> = timeline.lines().filter_map(|line| line.split_whitespace().nth(1)).collect();
    assert_eq!(kinds.first(), Some(&"delivery_started"), "{timeline}");
    assert_eq!(kinds.last(), Some(&"ended"), "{timeline}");
    assert!(kinds.contains(&"publication_finished"), "{timeline}");
    let (_, as_json, _) = runs(&gw, &gw.token, &["events", "cli-2", "e", "--json"]);
    let last: Value = serde_json::from_str(as_json.lines().last().unwrap()).unwrap();
    assert_eq!(last["detail"]["state"], "committed", "{as_json}");

    let (code, _, stderr) = runs(&gw, "wrong-token-0123456789", &["list"]);
    assert_eq!(code, 2);
    assert!(stderr.contains("401") && stderr.contains("unauthorized"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread")]
async fn runs_watch_exits_1_with_the_code_and_hint_of_a_failed_execution() {
    let fake = FakeWrite::start().await;
    fake.script([AppendFault::InResponseError(3)]);
    let gw = GatewayOptions::new().fake_write(&fake).spawn().await;
    TestRun::new("run", "e").full_append(&["t"]).open(&gw).await;
    gw.post_accepted("run", "e", "t", None, ipc_stream(&[ids(0..10)])).await;
    let (status, failed) = gw.json(reqwest::Method::POST, "/v1/runs/run/executions/e/commit?wait=true", None).await;
    assert_eq!((status.as_u16(), failed["state"].as_str()), (200, Some("failed")), "{failed}");
    let (code, watched, stderr) = runs(&gw, &gw.token, &["watch", "run", "e"]);
    assert_eq!(code, 1, "{watched}{stderr}");
    let error_code = failed["error"]["code"].as_str().unwrap();
    assert!(watched.contains(&format!("error: {error_code}")), "{watched}");
    // A hint is printed exactly when the error carries one (this one does not).
    match failed["error"]["hint"].as_str() {
        Some(hint) => assert!(watched.contains(&format!("hint: {hint}")), "{watched}"),
        None => assert!(!watched.contains("hint:"), "{watched}"),
    }
    let (code, table, _) = runs(&gw, &gw.token, &["list", "--state", "failed"]);
    assert_eq!(code, 0);
    assert!(table.lines().nth(1).is_some_and(|line| line.starts_with("run") && line.contains(error_code)), "{table}");
}

/// The token comes from `FILAMENT_TOKEN` or a file; one on the command line still works, with
/// a warning (it shows in `ps` and shell history).
#[tokio::test(flavor = "multi_thread")]
async fn the_token_comes_from_a_file_and_one_in_argv_is_warned_about() {
    let gw = Gateway::spawn().await;
    gw.create_run("cli-token").await;
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), format!("{}\n", gw.token)).unwrap();
    let cli = |args: &[&str]| {
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_filament-bigquery"))
            .arg("runs")
            .args(args)
            .env_clear()
            .env("FILAMENT_URL", &gw.base_url)
            .output()
            .unwrap();
        (
            output.status.code(),
            String::from_utf8_lossy(&output.stdout).into_owned(),
            String::from_utf8_lossy(&output.stderr).into_owned(),
        )
    };
    let path = file.path().to_str().unwrap();
    let (code, listed, stderr) = cli(&["list", "--token-file", path]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(listed.contains("cli-token") && !stderr.contains("warning"), "{listed}{stderr}");
    let (code, listed, stderr) = cli(&["list", "--token", &gw.token]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(listed.contains("cli-token"), "{listed}");
    assert!(stderr.contains("warning: a token on the command line"), "{stderr}");
}
