//! The operator's CLI (`filament-bigquery runs list|show|events|watch`): a client of the HTTP API, so
//! it works against any replica or the load balancer, with the same scopes as any caller.
//! Human output is aligned text tables; `--json` prints the API's JSON unchanged.
//!
//! Tables are padded by hand (a dozen lines) rather than with a table crate: the columns are
//! plain ASCII-width text and nothing else here needs one.

use std::fmt::Write as _;
use std::time::Duration;

use serde_json::Value;

use crate::config::{GatewayConnection, RunsCommand};

/// How the command ended: `Failed` (exit 1) is an execution that failed or was aborted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Succeeded,
    Failed,
}

/// Why a command could not answer (exit 2 from `main`'s error).
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error("cannot reach the gateway at {url}: {source}")]
    Unreachable { url: String, source: reqwest::Error },
    #[error("the gateway answered {status}: {code}: {detail}")]
    Refused { status: u16, code: String, detail: String },
    #[error("the gateway's answer is not JSON: {0}")]
    NotJson(reqwest::Error),
    #[error("the gateway URL {0:?} is not an http(s) URL")]
    InvalidUrl(String),
    #[error("no token: {0}")]
    NoToken(String),
}

struct Api {
    http: reqwest::Client,
    connection: GatewayConnection,
    token: String,
}

impl Api {
    fn new(connection: GatewayConnection) -> Result<Self, CliError> {
        let http = reqwest::Client::builder().timeout(Duration::from_secs(30)).build().unwrap_or_default();
        let token = connection.bearer().map_err(CliError::NoToken)?;
        Ok(Self { http, connection, token })
    }

    /// The URL of the API path made of `segments` (each percent-encoded as one segment).
    fn url(&self, segments: &[&str]) -> Result<reqwest::Url, CliError> {
        let invalid = || CliError::InvalidUrl(self.connection.url.clone());
        let mut url = reqwest::Url::parse(&self.connection.url).map_err(|_| invalid())?;
        url.path_segments_mut().map_err(|()| invalid())?.pop_if_empty().extend(segments);
        Ok(url)
    }

    async fn get(&self, segments: &[&str], query: &[(&str, String)]) -> Result<Value, CliError> {
        let url = self.url(segments)?;
        let response = self
            .http
            .get(url.clone())
            .bearer_auth(&self.token)
            .query(query)
            .send()
            .await
            .map_err(|source| CliError::Unreachable { url: url.to_string(), source })?;
        let status = response.status();
        let body: Value = response.json().await.map_err(CliError::NotJson)?;
        if !status.is_success() {
            let text = |field: &str| printable(body[field].as_str().unwrap_or_default());
            return Err(CliError::Refused { status: status.as_u16(), code: text("code"), detail: text("detail") });
        }
        Ok(body)
    }
}

/// Runs one `runs` subcommand, printing to standard output.
pub async fn run(command: RunsCommand) -> Result<Outcome, CliError> {
    match command {
        RunsCommand::List { gateway, state, dataset, principal, limit, json } => {
            let runs = list_runs(
                &Api::new(gateway)?,
                [("state", state), ("dataset", dataset), ("principal", principal)],
                limit,
            )
            .await?;
            print!("{}", if json { pretty(&Value::Array(runs)) } else { runs_table(&runs) });
            Ok(Outcome::Succeeded)
        }
        RunsCommand::Show { gateway, run, json } => {
            let view = Api::new(gateway)?.get(&["v1", "runs", &run], &[]).await?;
            print!("{}", if json { pretty(&view) } else { run_text(&view) });
            Ok(Outcome::Succeeded)
        }
        RunsCommand::Events { gateway, run, execution, follow, json } => {
            events(&Api::new(gateway)?, &run, &execution, follow, json).await?;
            Ok(Outcome::Succeeded)
        }
        RunsCommand::Watch { gateway, run, execution, interval_secs } => {
            watch(&Api::new(gateway)?, &run, &execution, Duration::from_secs(interval_secs.max(1))).await
        }
    }
}

/// Every page of `GET /v1/runs` up to `limit` runs.
async fn list_runs(api: &Api, filters: [(&str, Option<String>); 3], limit: usize) -> Result<Vec<Value>, CliError> {
    let mut query: Vec<(&str, String)> =
        filters.into_iter().filter_map(|(name, value)| value.map(|value| (name, value))).collect();
    query.push(("limit", limit.clamp(1, 500).to_string()));
    let mut runs = Vec::new();
    loop {
        let page = api.get(&["v1", "runs"], &query).await?;
        runs.extend(page["runs"].as_array().cloned().unwrap_or_default());
        match page["next_page_token"].as_str() {
            Some(token) if runs.len() < limit => {
                query.retain(|(name, _)| *name != "page_token");
                query.push(("page_token", token.to_string()));
            }
            _ => break,
        }
    }
    runs.truncate(limit);
    Ok(runs)
}

/// Polls the execution until it ends, printing each resource's progress at every look.
async fn watch(api: &Api, run: &str, execution: &str, interval: Duration) -> Result<Outcome, CliError> {
    let path = ["v1", "runs", run, "executions", execution];
    loop {
        let view = api.get(&path, &[]).await?;
        let state = view["state"].as_str().unwrap_or("unknown");
        print!("{}", progress_text(&view));
        match state {
            "committed" => return Ok(Outcome::Succeeded),
            "failed" | "aborted" => {
                let error = &view["error"];
                if let Some(code) = error["code"].as_str() {
                    println!("error: {}: {}", printable(code), text(&error["detail"]));
                }
                if let Some(hint) = error["hint"].as_str() {
                    println!("hint: {}", printable(hint));
                }
                return Ok(Outcome::Failed);
            }
            _ => tokio::time::sleep(interval).await,
        }
    }
}

/// Prints the execution's events; with `follow`, polls for new ones until its current
/// delivery has ended (its `ended` event, or a final state with nothing more to print: not
/// every failure outside a commit records an `ended` event).
async fn events(api: &Api, run: &str, execution: &str, follow: bool, json: bool) -> Result<(), CliError> {
    let execution_path = ["v1", "runs", run, "executions", execution];
    let path = ["v1", "runs", run, "executions", execution, "events"];
    let mut after = 0;
    loop {
        let current = api.get(&execution_path, &[]).await?;
        let final_state = matches!(current["state"].as_str(), Some("committed" | "failed" | "aborted"));
        let page = api.get(&path, &[("after", after.to_string())]).await?;
        let events = page["events"].as_array().cloned().unwrap_or_default();
        for event in &events {
            if json {
                println!("{event}");
            } else {
                println!("{}", event_line(event));
            }
        }
        after = page["next_after"].as_i64().unwrap_or(after);
        let ended = events.iter().any(|event| event["kind"] == "ended" && event["delivery"] == current["delivery"]);
        if !follow || ended || (final_state && events.is_empty()) {
            return Ok(());
        }
        if events.is_empty() {
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }
}

/// `time  kind  resource  count  detail` for one event.
fn event_line(event: &Value) -> String {
    let count = match event["count"].as_i64() {
        Some(count) if count > 1 => format!(" x{count}"),
        _ => String::new(),
    };
    format!(
        "{}  {:<20} {:<16}{count}  {}",
        text(&event["at"]),
        text(&event["kind"]),
        printable(event["resource"].as_str().unwrap_or("")),
        event["detail"]
    )
}

fn pretty(value: &Value) -> String {
    format!("{}\n", serde_json::to_string_pretty(value).unwrap_or_default())
}

/// A value of the gateway's answer as terminal text: strings with their control characters
/// escaped (`\n`, `\u{1b}`), so no answer moves the cursor, rewrites a line or fakes one.
fn text(value: &Value) -> String {
    match value {
        Value::Null => "-".into(),
        Value::String(s) => printable(s),
        other => other.to_string(),
    }
}

/// `s` with every control character escaped (the rest, any language's letters included, kept).
fn printable(s: &str) -> String {
    s.chars().map(|c| if c.is_control() { c.escape_default().to_string() } else { c.to_string() }).collect()
}

/// Rows under a header, each column as wide as its widest cell, two spaces apart.
fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let header: Vec<String> = header.iter().map(|h| h.to_string()).collect();
    for row in std::iter::once(&header).chain(rows) {
        let cells: Vec<String> = row.iter().zip(&widths).map(|(cell, width)| format!("{cell:<width$}")).collect();
        let _ = writeln!(out, "{}", cells.join("  ").trim_end());
    }
    out
}

fn runs_table(runs: &[Value]) -> String {
    let rows: Vec<Vec<String>> = runs
        .iter()
        .map(|run| {
            let latest = &run["latest_execution"];
            vec![
                text(&run["run_id"]),
                text(&run["principal"]),
                format!("{}.{}", text(&run["destination"]["project"]), text(&run["destination"]["dataset"])),
                text(&run["created_at"]),
                text(&latest["execution_id"]),
                text(&latest["state"]),
                format!("{}/{}", text(&latest["rows_acknowledged"]), text(&latest["rows_received"])),
                text(&latest["error"]["code"]),
            ]
        })
        .collect();
    let header = ["RUN", "PRINCIPAL", "DESTINATION", "CREATED", "EXECUTION", "STATE", "ROWS ACKED/RECEIVED", "ERROR"];
    table(&header, &rows)
}

fn run_text(run: &Value) -> String {
    let mut out = format!(
        "run {} (principal {}) -> {}.{}, created {}\n\n",
        text(&run["run_id"]),
        text(&run["principal"]),
        text(&run["destination"]["project"]),
        text(&run["destination"]["dataset"]),
        text(&run["created_at"])
    );
    let resources: Vec<Vec<String>> = run["resources"]
        .as_array()
        .map(|list| {
            list.iter()
                .map(|r| vec![text(&r["resource"]), text(&r["table"]), text(&r["write_mode"]), text(&r["primary_key"])])
                .collect()
        })
        .unwrap_or_default();
    out.push_str(&table(&["RESOURCE", "TABLE", "WRITE MODE", "PRIMARY KEY"], &resources));
    let executions: Vec<Vec<String>> = run["executions"]
        .as_array()
        .map(|list| {
            list.iter()
                .map(|e| {
                    vec![text(&e["execution_id"]), text(&e["state"]), text(&e["delivery"]), text(&e["created_at"])]
                })
                .collect()
        })
        .unwrap_or_default();
    out.push('\n');
    out.push_str(&table(&["EXECUTION", "STATE", "DELIVERY", "CREATED"], &executions));
    out
}

/// One line per resource: a bar of acknowledged over received rows, then the counts.
fn progress_text(execution: &Value) -> String {
    const BAR_WIDTH: usize = 20;
    let mut out = format!("{} {}\n", text(&execution["execution_id"]), text(&execution["state"]));
    for resource in execution["resources"].as_array().into_iter().flatten() {
        let received = resource["rows_received"].as_u64().unwrap_or(0);
        let acknowledged = resource["rows_acknowledged"].as_u64().unwrap_or(0);
        let filled = (acknowledged * BAR_WIDTH as u64).checked_div(received).unwrap_or(0) as usize;
        let _ = writeln!(
            out,
            "  {:<24} [{}{}] {acknowledged}/{received} rows, {} bytes, publication {}",
            text(&resource["resource"]),
            "#".repeat(filled.min(BAR_WIDTH)),
            ".".repeat(BAR_WIDTH - filled.min(BAR_WIDTH)),
            text(&resource["bytes_received"]),
            text(&resource["publication"]["state"]),
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn control_characters_of_an_answer_are_escaped_and_letters_kept() {
        let hostile = json!("run\u{1b}[2J\nerror: forged line\tGröße");
        assert_eq!(text(&hostile), "run\\u{1b}[2J\\nerror: forged line\\tGröße");
        assert!(!runs_table(&[json!({"run_id": "a\u{7}b"})]).contains('\u{7}'));
    }

    #[test]
    fn tables_align_every_column_to_its_widest_cell() {
        let rows = vec![vec!["a-long-run".to_string(), "x".to_string()], vec!["r".to_string(), "yy".to_string()]];
        assert_eq!(table(&["RUN", "S"], &rows), "RUN         S\na-long-run  x\nr           yy\n");
    }

    #[test]
    fn progress_shows_acknowledged_over_received_rows() {
        let view = json!({"execution_id": "e", "state": "extracting", "resources": [
            {"resource": "t", "rows_received": 100, "rows_acknowledged": 50, "bytes_received": 800, "publication": null}
        ]});
        let text = progress_text(&view);
        assert!(text.contains("[##########..........] 50/100 rows, 800 bytes"), "{text}");
    }
}
