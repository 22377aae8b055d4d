//! The operator's CLI (`filament-bigquery runs list|show|events|watch`): a client of the HTTP API, so
//! it works against any replica or the load balancer, with the same scopes as any caller.
//! Human output is aligned text tables; `--json` prints the API's JSON unchanged.
//!
//! Tables are padded by hand (a dozen lines) rather than with a table crate: the columns are
//! plain ASCII-width text and nothing else here needs one.

use std::fmt::Write as _;
use std::time::Duration;

use chrono::{DateTime, SecondsFormat, Utc};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::api::run_list::RunListItem;
use crate::api::views::{ExecutionView, RunView};
use crate::config::{GatewayConnection, RunsCommand};
use crate::model::ExecutionState;
use crate::store::EventKind;

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
    #[error("the gateway's answer from {url} is not what this CLI reads: {source}")]
    UnexpectedAnswer { url: String, source: serde_json::Error },
    #[error("the gateway URL {0:?} is not an http(s) URL")]
    InvalidUrl(String),
    #[error("no token: {0}")]
    NoToken(String),
}

/// What stands for an absent value in text output.
const ABSENT: &str = "-";

/// The fields of a problem+json refusal the CLI shows. Not [`crate::error::Problem`]: a refusal
/// is shown whatever code it carries, also one this build does not know, and whatever it lacks.
#[derive(Debug, Default, Deserialize)]
struct Refusal {
    #[serde(default)]
    code: String,
    #[serde(default)]
    detail: String,
}

/// One page of `GET /v1/runs` (the API's `RunList`), with its runs read as `T`: the API's
/// [`RunListItem`] for the table, the JSON as answered for `--json`.
#[derive(Debug, Deserialize)]
struct RunsPage<T> {
    runs: Vec<T>,
    next_page_token: Option<String>,
}

/// One answer of `GET .../events` (the API's `ExecutionEvents`, which only serialises).
#[derive(Debug, Deserialize)]
struct EventsPage {
    events: Vec<AnsweredEvent>,
    next_after: i64,
}

/// An event as answered (what `--json` prints) and read.
#[derive(Debug, Deserialize)]
#[serde(try_from = "Value")]
struct AnsweredEvent {
    answered: Value,
    event: Event,
}

impl TryFrom<Value> for AnsweredEvent {
    type Error = serde_json::Error;

    fn try_from(answered: Value) -> Result<Self, Self::Error> {
        Ok(Self { event: Event::deserialize(&answered)?, answered })
    }
}

/// The fields of an event (the API's `EventRecord`, which only serialises) the CLI reads.
#[derive(Debug, Deserialize)]
struct Event {
    delivery: i32,
    at: DateTime<Utc>,
    /// Read as text: a kind a newer gateway adds is shown, not refused.
    kind: String,
    #[serde(default)]
    resource: Option<String>,
    count: i32,
    detail: Value,
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

    /// The answer to `GET` of the path, read as `T` (`Value`: the JSON as answered); a
    /// refusal (problem+json) becomes [`CliError::Refused`].
    async fn get<T: DeserializeOwned>(&self, segments: &[&str], query: &[(&str, String)]) -> Result<T, CliError> {
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
            let refusal = Refusal::deserialize(&body).unwrap_or_default();
            let (code, detail) = (printable(&refusal.code), printable(&refusal.detail));
            return Err(CliError::Refused { status: status.as_u16(), code, detail });
        }
        serde_json::from_value(body).map_err(|source| CliError::UnexpectedAnswer { url: url.to_string(), source })
    }
}

/// Runs one `runs` subcommand, printing to standard output.
pub async fn run(command: RunsCommand) -> Result<Outcome, CliError> {
    match command {
        RunsCommand::List { gateway, state, dataset, principal, limit, json } => {
            let api = Api::new(gateway)?;
            let filters = [("state", state), ("dataset", dataset), ("principal", principal)];
            if json {
                print!("{}", pretty(&list_runs::<Value>(&api, filters, limit).await?));
            } else {
                print!("{}", runs_table(&list_runs::<RunListItem>(&api, filters, limit).await?));
            }
            Ok(Outcome::Succeeded)
        }
        RunsCommand::Show { gateway, run, json } => {
            let (api, path) = (Api::new(gateway)?, ["v1", "runs", run.as_str()]);
            if json {
                print!("{}", pretty(&api.get::<Value>(&path, &[]).await?));
            } else {
                print!("{}", run_text(&api.get::<RunView>(&path, &[]).await?));
            }
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

/// Every page of `GET /v1/runs` up to `limit` runs, each read as `T`.
async fn list_runs<T: DeserializeOwned>(
    api: &Api,
    filters: [(&str, Option<String>); 3],
    limit: usize,
) -> Result<Vec<T>, CliError> {
    let mut query: Vec<(&str, String)> =
        filters.into_iter().filter_map(|(name, value)| value.map(|value| (name, value))).collect();
    query.push(("limit", limit.clamp(1, 500).to_string()));
    let mut runs = Vec::new();
    loop {
        let page: RunsPage<T> = api.get(&["v1", "runs"], &query).await?;
        runs.extend(page.runs);
        match page.next_page_token {
            Some(token) if runs.len() < limit => {
                query.retain(|(name, _)| *name != "page_token");
                query.push(("page_token", token));
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
        let view: ExecutionView = api.get(&path, &[]).await?;
        print!("{}", progress_text(&view));
        match view.state {
            ExecutionState::Committed => return Ok(Outcome::Succeeded),
            ExecutionState::Failed | ExecutionState::Aborted => {
                if let Some(error) = &view.error {
                    println!("error: {}: {}", error.code, printable(&error.detail));
                    if let Some(hint) = &error.hint {
                        println!("hint: {}", printable(hint));
                    }
                }
                return Ok(Outcome::Failed);
            }
            // A staged execution waits for its next commit or abort, like one still extracting.
            ExecutionState::Extracting
            | ExecutionState::Paused
            | ExecutionState::Committing
            | ExecutionState::Staged => {
                tokio::time::sleep(interval).await;
            }
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
        let current: ExecutionView = api.get(&execution_path, &[]).await?;
        let page: EventsPage = api.get(&path, &[("after", after.to_string())]).await?;
        for AnsweredEvent { answered, event } in &page.events {
            if json {
                println!("{answered}");
            } else {
                println!("{}", event_line(event));
            }
        }
        after = page.next_after;
        let ended = page
            .events
            .iter()
            .any(|e| e.event.kind == EventKind::Ended.as_str() && e.event.delivery == current.delivery);
        if !follow || ended || (current.state.is_terminal() && page.events.is_empty()) {
            return Ok(());
        }
        if page.events.is_empty() {
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }
}

/// `time  kind  resource  count  detail` for one event.
fn event_line(event: &Event) -> String {
    let count = if event.count > 1 { format!(" x{}", event.count) } else { String::new() };
    format!(
        "{}  {:<20} {:<16}{count}  {}",
        timestamp(event.at),
        event.kind.as_str(),
        printable(event.resource.as_deref().unwrap_or("")),
        event.detail
    )
}

fn pretty<T: Serialize>(value: &T) -> String {
    format!("{}\n", serde_json::to_string_pretty(value).unwrap_or_default())
}

/// An instant as the API writes it (RFC 3339, UTC as `Z`, as many fraction digits as needed).
fn timestamp(at: DateTime<Utc>) -> String {
    at.to_rfc3339_opts(SecondsFormat::AutoSi, true)
}

/// A value as the API writes it, for types with no text form of their own (`PublicationState`:
/// its name; a list: its JSON).
fn wire_text<T: Serialize>(value: &T) -> String {
    match serde_json::to_value(value) {
        Ok(Value::String(s)) => printable(&s),
        Ok(other) => other.to_string(),
        Err(_) => ABSENT.into(),
    }
}

/// `s` with every control character escaped (`\n`, `\u{1b}`; the rest, any language's letters
/// included, kept), so no text of the gateway's answer moves the cursor, rewrites a line or
/// fakes one.
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

fn runs_table(runs: &[RunListItem]) -> String {
    let rows: Vec<Vec<String>> = runs
        .iter()
        .map(|run| {
            let latest = run.latest_execution.as_ref();
            let or_absent = |cell: Option<String>| cell.unwrap_or_else(|| ABSENT.into());
            vec![
                printable(&run.run_id),
                printable(&run.principal),
                format!("{}.{}", printable(&run.destination.project), printable(&run.destination.dataset)),
                timestamp(run.created_at),
                or_absent(latest.map(|latest| printable(&latest.execution_id))),
                or_absent(latest.map(|latest| latest.state.to_string())),
                latest.map_or_else(
                    || format!("{ABSENT}/{ABSENT}"),
                    |latest| format!("{}/{}", latest.rows_acknowledged, latest.rows_received),
                ),
                or_absent(latest.and_then(|latest| latest.error.as_ref()).map(|error| printable(&error.code))),
            ]
        })
        .collect();
    let header = ["RUN", "PRINCIPAL", "DESTINATION", "CREATED", "EXECUTION", "STATE", "ROWS ACKED/RECEIVED", "ERROR"];
    table(&header, &rows)
}

fn run_text(run: &RunView) -> String {
    let mut out = format!(
        "run {} (principal {}) -> {}.{}, created {}\n\n",
        printable(&run.run_id),
        printable(&run.principal),
        printable(&run.destination.project),
        printable(&run.destination.dataset),
        timestamp(run.created_at)
    );
    let resources: Vec<Vec<String>> = run
        .resources
        .iter()
        .map(|r| vec![printable(&r.resource), printable(&r.table), r.write_mode.to_string(), wire_text(&r.primary_key)])
        .collect();
    out.push_str(&table(&["RESOURCE", "TABLE", "WRITE MODE", "PRIMARY KEY"], &resources));
    // The run's execution summaries carry neither the delivery nor the creation time: both
    // columns show as absent.
    let executions: Vec<Vec<String>> = run
        .executions
        .iter()
        .map(|e| vec![printable(&e.execution_id), e.state.to_string(), ABSENT.into(), ABSENT.into()])
        .collect();
    out.push('\n');
    out.push_str(&table(&["EXECUTION", "STATE", "DELIVERY", "CREATED"], &executions));
    out
}

/// One line per resource: a bar of acknowledged over received rows, then the counts.
fn progress_text(execution: &ExecutionView) -> String {
    const BAR_WIDTH: usize = 20;
    let mut out = format!("{} {}\n", printable(&execution.execution_id), execution.state);
    for resource in &execution.resources {
        let received = u64::try_from(resource.rows_received).unwrap_or(0);
        let acknowledged = u64::try_from(resource.rows_acknowledged).unwrap_or(0);
        let filled = (acknowledged * BAR_WIDTH as u64).checked_div(received).unwrap_or(0) as usize;
        let publication = resource.publication.as_ref().map_or_else(|| ABSENT.into(), |p| wire_text(&p.state));
        let _ = writeln!(
            out,
            "  {:<24} [{}{}] {acknowledged}/{received} rows, {} bytes, publication {publication}",
            printable(&resource.resource),
            "#".repeat(filled.min(BAR_WIDTH)),
            ".".repeat(BAR_WIDTH - filled.min(BAR_WIDTH)),
            resource.bytes_received,
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
        assert_eq!(printable("run\u{1b}[2J\nerror: forged line\tGröße"), "run\\u{1b}[2J\\nerror: forged line\\tGröße");
        let run: RunListItem = serde_json::from_value(json!({
            "run_id": "a\u{7}b", "destination": {"project": "p", "dataset": "d"}, "principal": "x",
            "created_at": "2026-12-01T10:11:12.123456Z", "updated_at": "2026-12-01T10:11:12Z", "latest_execution": null
        }))
        .unwrap();
        let table = runs_table(&[run]);
        assert!(!table.contains('\u{7}'), "{table}");
        assert!(
            table.contains("a\\u{7}b  x          p.d          2026-12-01T10:11:12.123456Z  -          -      -/-"),
            "{table}"
        );
    }

    #[test]
    fn tables_align_every_column_to_its_widest_cell() {
        let rows = vec![vec!["a-long-run".to_string(), "x".to_string()], vec!["r".to_string(), "yy".to_string()]];
        assert_eq!(table(&["RUN", "S"], &rows), "RUN         S\na-long-run  x\nr           yy\n");
    }

    #[test]
    fn progress_shows_acknowledged_over_received_rows() {
        let view: ExecutionView = serde_json::from_value(json!({
            "run_id": "r", "execution_id": "e", "delivery": 1, "state": "extracting", "error": null,
            "created_at": "2026-12-01T10:11:12Z", "updated_at": "2026-12-01T10:11:12Z", "resources": [
                {"resource": "t", "table": "t", "write_mode": "full_append", "batches": 1, "rows_received": 100,
                 "rows_acknowledged": 50, "bytes_received": 800, "publication": null}
            ]
        }))
        .unwrap();
        let text = progress_text(&view);
        assert_eq!(
            text,
            "e extracting\n  t                        [##########..........] 50/100 rows, 800 bytes, publication -\n"
        );
    }

    #[test]
    fn an_event_line_shows_its_time_kind_resource_count_and_detail() {
        let page: EventsPage = serde_json::from_value(json!({"next_after": 9, "events": [
            {"event_id": 9, "delivery": 1, "at": "2026-12-01T10:11:12.120Z", "kind": "append_retried",
             "resource": "t\n", "count": 3, "detail": {"code": "unavailable"}}
        ]}))
        .unwrap();
        let AnsweredEvent { answered, event } = &page.events[0];
        assert_eq!(answered["event_id"], 9, "the event as answered is kept for --json");
        assert_eq!(
            event_line(event),
            "2026-12-01T10:11:12.120Z  append_retried       t\\n              x3  {\"code\":\"unavailable\"}"
        );
    }
}
