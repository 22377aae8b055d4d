//! A recording, scriptable proxy in front of the emulator's REST API, for what the emulator
//! cannot show or do on demand: it records every request (method, path, JSON body) and can
//! take over query jobs (`jobs.insert` / `jobs.get`) with BigQuery's real answers: a 409
//! `duplicate` for an existing job id, a DONE job with an `errorResult`, or jobs that stay
//! RUNNING for a while (to observe how many publish at once). Everything else is forwarded.
//!
//! Every request is first judged by BigQuery's discovery document ([`super::discovery`]): one
//! BigQuery would refuse or misread (an unknown field, an int64 sent as a number, an output-only
//! field, an undeclared query parameter) is answered 400 as BigQuery would, and its problems are
//! kept ([`RestProxy::problems`]). Gateways spawned by the harness send their REST calls through
//! such a proxy unless a test points them elsewhere, so the whole suite is judged by it.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use tokio::time::Instant;

use super::arrow::{self, ipc_stream};
use super::discovery::Discovery;
use super::dry_runs::{self, DryRunScript, is_dry_run};
use super::fake_rest::bigquery_error;
use super::fake_write::FakeWrite;
use super::{Gateway, GatewayOptions, TestRun, required_env};

/// BigQuery's discovery document, parsed once per test process.
fn discovery() -> &'static Discovery {
    static DISCOVERY: OnceLock<Discovery> = OnceLock::new();
    DISCOVERY.get_or_init(Discovery::load)
}

/// What the proxy does with query jobs.
#[derive(Debug, Clone, Default)]
pub enum JobMode {
    /// Forward to the emulator.
    #[default]
    Forward,
    /// Answer every `jobs.insert` with 409 `duplicate` and `jobs.get` with a DONE job (as if
    /// an earlier attempt had submitted it: the configuration sent).
    AlreadyExists,
    /// Answer every `jobs.insert` with 409 `duplicate` and `jobs.get` with a DONE job someone
    /// else created first under the id: GoogleSQL `query`, the labels the insert carries
    /// copied onto it.
    Foreign { query: String },
    /// Answer `jobs.insert` of queries containing `query_contains` with a DONE job that failed
    /// with `reason` (`invalidQuery`, `bytesBilledLimitExceeded`, ...) and `message`; forward
    /// the others.
    Fail { query_contains: String, reason: String, message: String },
    /// Answer the first attempt of every publication (a job id without an `-aN` suffix) with a
    /// DONE job that failed with `reason` and `message`; forward the retries.
    FailFirstAttempt { reason: String, message: String },
    /// Answer `jobs.insert` with a RUNNING job that `jobs.get` reports DONE after this long.
    RunFor(Duration),
}

impl JobMode {
    /// Query jobs whose SQL contains `query_contains` (every one when it is empty) fail as
    /// BigQuery fails a query it cannot run: reason `invalidQuery`, with `message`.
    pub fn invalid_query(query_contains: &str, message: &str) -> Self {
        JobMode::Fail { query_contains: query_contains.into(), reason: "invalidQuery".into(), message: message.into() }
    }
}

#[derive(Debug, Clone)]
pub struct Recorded {
    pub method: String,
    pub path: String,
    /// The path with its query string, as sent.
    pub path_and_query: String,
    pub body: Value,
    /// What the discovery document finds wrong with the request (answered 400 when any).
    pub problems: Vec<String>,
    /// When it arrived.
    pub at: Instant,
}

#[derive(Debug, Default)]
pub struct ProxyState {
    pub jobs: JobMode,
    pub requests: Vec<Recorded>,
    /// Jobs taken over by `RunFor`: id -> when it finishes.
    pub running: HashMap<String, Instant>,
    pub max_running: usize,
    /// Jobs answered as failed by `Fail` (their `jobs.get` fails too).
    pub failed_jobs: Vec<String>,
    /// The `configuration` of each job inserted (by id: the first insert's), which BigQuery
    /// answers `jobs.get` with.
    pub configurations: HashMap<String, Value>,
    /// (table, column): `tables.get` of the table answers with the column collated `und:ci`
    /// (the emulator keeps no collation).
    pub collated: Vec<(String, String)>,
    /// Tables whose `tables.get` is answered 403 `accessDenied`.
    pub unreadable_tables: Vec<String>,
    /// The emulator cannot create BIGNUMERIC columns (DuckDB's decimals stop at 38 digits):
    /// `tables.insert` creates them NUMERIC instead, and `tables.get` reports them BIGNUMERIC
    /// again, so the gateway's statements run unchanged (with values NUMERIC can hold).
    pub bignumeric_as_numeric: bool,
    /// (table, column) created NUMERIC in place of BIGNUMERIC.
    pub narrowed: Vec<(String, String)>,
    /// The next this many `jobs.insert` calls are refused as BigQuery refuses jobs beyond the
    /// project's concurrent-query limit: 429 `rateLimitExceeded` (no job is created).
    pub refuse_job_inserts: usize,
    /// `jobs.insert` calls refused so far.
    pub refused_job_inserts: usize,
    /// How dry runs are answered ([`super::dry_runs`]: none of `jobs` applies to them).
    pub dry_runs: DryRunScript,
}

#[derive(Clone)]
pub struct RestProxy {
    pub address: String,
    pub state: Arc<Mutex<ProxyState>>,
}

struct Shared {
    upstream: String,
    state: Arc<Mutex<ProxyState>>,
    http: reqwest::Client,
}

impl RestProxy {
    /// Proxies to the emulator at `upstream` (`host:port`).
    pub async fn start(upstream: &str) -> Self {
        let state = Arc::new(Mutex::new(ProxyState::default()));
        let shared = Arc::new(Shared {
            upstream: upstream.to_string(),
            state: Arc::clone(&state),
            http: reqwest::Client::new(),
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap().to_string();
        let app = axum::Router::new().fallback(handle).with_state(shared);
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        Self { address, state }
    }

    pub fn set_jobs(&self, mode: JobMode) {
        self.state.lock().unwrap().jobs = mode;
    }

    /// Recorded requests whose method is `method` and whose path contains `path_part`, dry
    /// runs left out (they create no job: [`RestProxy::dry_runs`] lists them).
    pub fn requests(&self, method: &str, path_part: &str) -> Vec<Recorded> {
        self.state
            .lock()
            .unwrap()
            .requests
            .iter()
            .filter(|r| r.method == method && r.path.contains(path_part) && !is_dry_run(&r.body))
            .cloned()
            .collect()
    }

    /// Every problem the discovery document found in the requests so far, with the request.
    pub fn problems(&self) -> Vec<String> {
        let state = self.state.lock().unwrap();
        state
            .requests
            .iter()
            .flat_map(|r| r.problems.iter().map(move |p| format!("{} {}: {p}", r.method, r.path_and_query)))
            .collect()
    }

    /// The SQL of every job inserted (`jobs.insert`, dry runs left out).
    pub fn queries(&self) -> Vec<String> {
        self.requests("POST", "/jobs")
            .iter()
            .filter_map(|r| r.body["configuration"]["query"]["query"].as_str().map(str::to_string))
            .collect()
    }
}

/// A gateway whose REST calls a new proxy in front of the shared emulator records and whose
/// appends go to a new Storage Write fake, with run `r` (resource `t`, full_append) and its
/// execution `e` open, and one batch of the rows `ids` posted to `t`.
pub async fn one_batch_behind_a_proxy(ids: Range<i64>) -> (RestProxy, FakeWrite, Gateway) {
    let proxy = RestProxy::start(&required_env("BIGQUERY_EMULATOR_HOST")).await;
    let fake = FakeWrite::start().await;
    let gw = GatewayOptions::new().rest_proxy(&proxy).fake_write(&fake).spawn().await;
    TestRun::new("r", "e").full_append(&["t"]).open(&gw).await;
    gw.post_accepted("r", "e", "t", None, ipc_stream(&[arrow::ids(ids)])).await;
    (proxy, fake, gw)
}

/// A job resource as BigQuery answers `jobs.insert` and `jobs.get` (`state`: `RUNNING`,
/// `DONE`), with query statistics and, when given, its error.
pub fn job(id: &str, state: &str, error: Option<(&str, &str)>) -> Value {
    let mut job = json!({
        "kind": "bigquery#job",
        "id": format!("filament-demo:US.{id}"),
        "jobReference": {"projectId": "filament-demo", "jobId": id, "location": "US"},
        "status": {"state": state},
        "statistics": {
            "totalBytesProcessed": "1048576",
            "totalSlotMs": "1234",
            "query": {
                "numDmlAffectedRows": "0",
                "totalBytesProcessed": "1048576",
                "totalBytesBilled": "10485760",
                "totalSlotMs": "1234",
                "dmlStats": {"insertedRowCount": "7", "updatedRowCount": "0", "deletedRowCount": "0"},
            },
        },
    });
    if let Some((reason, message)) = error {
        job["status"]["errorResult"] = json!({"reason": reason, "message": message});
        job["status"]["errors"] = json!([{"reason": reason, "message": message}]);
    }
    job
}

/// Whether this `jobs.insert` is refused (`refuse_job_inserts`), counting it.
fn refuse_job_insert(shared: &Shared) -> bool {
    let mut state = shared.state.lock().unwrap();
    if state.refuse_job_inserts == 0 {
        return false;
    }
    state.refuse_job_inserts -= 1;
    state.refused_job_inserts += 1;
    true
}

/// Whether `path` is a table's (`.../tables/{table}`, nothing after it).
fn is_table_path(path: &str) -> bool {
    path.rsplit_once("/tables/").is_some_and(|(_, table)| !table.is_empty() && !table.contains('/'))
}

/// Every top-level field of type `from` in `fields` retyped `to`; their names.
fn retype(fields: &mut Value, from: &str, to: &str, only: Option<&[String]>) -> Vec<String> {
    let mut renamed = Vec::new();
    for field in fields.as_array_mut().into_iter().flatten() {
        let name = field["name"].as_str().unwrap_or_default().to_string();
        if field["type"] == from && only.is_none_or(|only| only.contains(&name)) {
            field["type"] = json!(to);
            renamed.push(name);
        }
    }
    renamed
}

/// A `tables.insert` body with its BIGNUMERIC columns created NUMERIC (remembered per table).
fn narrowed_insert(shared: &Shared, body: Bytes) -> Bytes {
    let Ok(mut table) = serde_json::from_slice::<Value>(&body) else { return body };
    let name = table["tableReference"]["tableId"].as_str().unwrap_or_default().to_string();
    let columns = retype(&mut table["schema"]["fields"], "BIGNUMERIC", "NUMERIC", None);
    let mut state = shared.state.lock().unwrap();
    state.narrowed.extend(columns.into_iter().map(|column| (name.clone(), column)));
    Bytes::from(serde_json::to_vec(&table).unwrap())
}

/// A `tables.get` answer reporting the columns [`narrowed_insert`] created NUMERIC as BIGNUMERIC.
fn widened_answer(shared: &Shared, path: &str, bytes: Bytes) -> Bytes {
    let table = path.rsplit_once("/tables/").map(|(_, t)| t.to_string()).unwrap_or_default();
    let columns: Vec<String> =
        shared.state.lock().unwrap().narrowed.iter().filter(|(t, _)| *t == table).map(|(_, c)| c.clone()).collect();
    let Ok(mut answer) = serde_json::from_slice::<Value>(&bytes) else { return bytes };
    if columns.is_empty() {
        return bytes;
    }
    retype(&mut answer["schema"]["fields"], "NUMERIC", "BIGNUMERIC", Some(&columns));
    Bytes::from(serde_json::to_vec(&answer).unwrap())
}

/// A `tables.get` answer with the columns `collated` names for this table collated `und:ci`.
fn with_collations(shared: &Shared, path: &str, bytes: Bytes) -> Bytes {
    let table = path.rsplit_once("/tables/").map(|(_, t)| t.to_string()).unwrap_or_default();
    let columns: Vec<String> =
        shared.state.lock().unwrap().collated.iter().filter(|(t, _)| *t == table).map(|(_, c)| c.clone()).collect();
    let Ok(mut answer) = serde_json::from_slice::<Value>(&bytes) else { return bytes };
    if columns.is_empty() {
        return bytes;
    }
    for field in answer["schema"]["fields"].as_array_mut().into_iter().flatten() {
        if columns.iter().any(|c| field["name"].as_str() == Some(c)) {
            field["collation"] = json!("und:ci");
        }
    }
    Bytes::from(serde_json::to_vec(&answer).unwrap())
}

/// The job id of a `jobs.get` path (`.../jobs/{id}`) or a `jobs.getQueryResults` one
/// (`.../queries/{id}`).
fn job_id_of(path: &str) -> Option<String> {
    path.split("/jobs/")
        .nth(1)
        .or_else(|| path.split("/queries/").nth(1))
        .map(|id| id.trim_end_matches('/').to_string())
}

/// The `timeoutMs` of a `jobs.getQueryResults` query string (BigQuery's default: 10 s).
pub fn long_poll_wait(path_and_query: &str) -> Duration {
    let millis = path_and_query
        .split_once('?')
        .and_then(|(_, query)| query.split('&').find_map(|pair| pair.strip_prefix("timeoutMs=")))
        .and_then(|value| value.parse().ok())
        .unwrap_or(10_000);
    Duration::from_millis(millis)
}

/// A `jobs.insert`, `jobs.get` or `jobs.getQueryResults` call.
struct JobCall<'a> {
    id: &'a str,
    is_insert: bool,
    body: &'a Value,
    path: &'a str,
    path_and_query: &'a str,
}

/// A job resource answered for `id`, with the configuration its `jobs.insert` sent (as
/// BigQuery answers `jobs.get`).
fn job_answer(shared: &Shared, id: &str, state: &str, error: Option<(&str, &str)>) -> Response {
    let mut answer = job(id, state, error);
    if let Some(configuration) = shared.state.lock().unwrap().configurations.get(id) {
        answer["configuration"] = configuration.clone();
    }
    axum::Json(answer).into_response()
}

fn already_exists(id: &str) -> Response {
    let message = format!("Already Exists: Job filament-demo:US.{id}");
    (StatusCode::CONFLICT, axum::Json(bigquery_error(409, "ALREADY_EXISTS", &message, "duplicate", vec![])))
        .into_response()
}

/// The answer of a job call `mode` takes over, or `None` to forward it.
async fn taken_over(shared: &Shared, mode: JobMode, call: &JobCall<'_>) -> Option<Response> {
    let (id, is_insert) = (call.id, call.is_insert);
    match mode {
        JobMode::Forward => None,
        JobMode::AlreadyExists if is_insert => Some(already_exists(id)),
        JobMode::AlreadyExists => Some(job_answer(shared, id, "DONE", None)),
        JobMode::Foreign { query } => {
            if is_insert {
                let labels = call.body["configuration"]["labels"].clone();
                let foreign = json!({"query": {"query": query, "useLegacySql": false}, "labels": labels});
                shared.state.lock().unwrap().configurations.insert(id.to_string(), foreign);
                return Some(already_exists(id));
            }
            Some(job_answer(shared, id, "DONE", None))
        }
        JobMode::Fail { query_contains, reason, message } => {
            let query = call.body["configuration"]["query"]["query"].as_str().unwrap_or("");
            let failed = shared.state.lock().unwrap().failed_jobs.contains(&id.to_string());
            if (is_insert && query.contains(&query_contains)) || failed {
                shared.state.lock().unwrap().failed_jobs.push(id.to_string());
                return Some(job_answer(shared, id, "DONE", Some((reason.as_str(), &message))));
            }
            None
        }
        JobMode::FailFirstAttempt { reason, message } => {
            let retry = id.rsplit_once("-a").is_some_and(|(_, attempt)| attempt.parse::<u32>().is_ok());
            let failed = shared.state.lock().unwrap().failed_jobs.contains(&id.to_string());
            if (is_insert && !retry) || failed {
                shared.state.lock().unwrap().failed_jobs.push(id.to_string());
                return Some(job_answer(shared, id, "DONE", Some((&reason, &message))));
            }
            None
        }
        JobMode::RunFor(duration) => Some(run_for(shared, duration, call).await),
    }
}

/// `RunFor`: a job RUNNING for `duration` after its insert, then DONE; a long poll answered when
/// it completes or after its `timeoutMs`.
async fn run_for(shared: &Shared, duration: Duration, call: &JobCall<'_>) -> Response {
    let now = Instant::now();
    let done_at = {
        let mut state = shared.state.lock().unwrap();
        if call.is_insert {
            state.running.insert(call.id.to_string(), now + duration);
        }
        let running = state.running.values().filter(|done_at| **done_at > now).count();
        state.max_running = state.max_running.max(running);
        state.running.get(call.id).copied().unwrap_or(now)
    };
    if call.path.contains("/queries/") {
        let waited = done_at.saturating_duration_since(now).min(long_poll_wait(call.path_and_query));
        tokio::time::sleep(waited).await;
        let complete = Instant::now() >= done_at;
        let reference = json!({"projectId": "filament-demo", "jobId": call.id, "location": "US"});
        return axum::Json(
            json!({"kind": "bigquery#getQueryResultsResponse", "jobReference": reference, "jobComplete": complete}),
        )
        .into_response();
    }
    job_answer(shared, call.id, if done_at <= now { "DONE" } else { "RUNNING" }, None)
}

async fn handle(State(shared): State<Arc<Shared>>, request: Request) -> Response {
    let method = request.method().clone();
    let path = request.uri().path().to_string();
    let path_and_query = request.uri().path_and_query().map(|p| p.as_str().to_string()).unwrap_or_default();
    let content_type = request.headers().get("content-type").cloned();
    let body: Bytes = axum::body::to_bytes(request.into_body(), usize::MAX).await.unwrap_or_default();
    let json_body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let sent_body = (!body.is_empty()).then_some(&json_body);
    let problems = discovery().check_request(method.as_str(), &path_and_query, sent_body);
    let mode = {
        let mut state = shared.state.lock().unwrap();
        state.requests.push(Recorded {
            method: method.to_string(),
            path: path.clone(),
            path_and_query: path_and_query.clone(),
            body: json_body.clone(),
            problems: problems.clone(),
            at: Instant::now(),
        });
        state.jobs.clone()
    };
    if !problems.is_empty() {
        let message = format!("the request does not follow BigQuery's discovery document: {}", problems.join("; "));
        eprintln!("rest proxy: {method} {path_and_query}: {message}");
        let error = bigquery_error(400, "INVALID_ARGUMENT", &message, "invalid", vec![]);
        return (StatusCode::BAD_REQUEST, axum::Json(error)).into_response();
    }
    let is_insert = method == "POST" && path.ends_with("/jobs");
    let is_get = method == "GET";
    let table = path.rsplit_once("/tables/").map(|(_, t)| t.to_string()).unwrap_or_default();
    if is_get && is_table_path(&path) && shared.state.lock().unwrap().unreadable_tables.contains(&table) {
        let message = format!("Access Denied: Table {table}");
        let error = bigquery_error(403, "PERMISSION_DENIED", &message, "accessDenied", vec![]);
        return (StatusCode::FORBIDDEN, axum::Json(error)).into_response();
    }
    let get_id = (method == "GET" && (path.contains("/jobs/") || path.contains("/queries/")))
        .then(|| job_id_of(&path))
        .flatten();
    if is_insert && is_dry_run(&json_body) {
        let scripted = dry_runs::answer(&mut shared.state.lock().unwrap().dry_runs, &json_body);
        if let Some(answer) = scripted {
            return answer;
        }
        return forward(&shared, method, &path, &path_and_query, content_type, body).await;
    }
    if is_insert && refuse_job_insert(&shared) {
        let message = "Exceeded rate limits: too many concurrent queries for this project_and_region. \
            For more information, see https://cloud.google.com/bigquery/docs/troubleshoot-quotas";
        let error = bigquery_error(429, "RESOURCE_EXHAUSTED", message, "rateLimitExceeded", vec![]);
        return (StatusCode::TOO_MANY_REQUESTS, axum::Json(error)).into_response();
    }
    if is_insert || get_id.is_some() {
        let id =
            get_id.clone().unwrap_or_else(|| json_body["jobReference"]["jobId"].as_str().unwrap_or("").to_string());
        if is_insert {
            // The first insert under an id creates the job; a duplicate changes nothing.
            let configuration = json_body["configuration"].clone();
            shared.state.lock().unwrap().configurations.entry(id.clone()).or_insert(configuration);
        }
        let call = JobCall { id: &id, is_insert, body: &json_body, path: &path, path_and_query: &path_and_query };
        if let Some(answer) = taken_over(&shared, mode, &call).await {
            return answer;
        }
    }
    forward(&shared, method, &path, &path_and_query, content_type, body).await
}

/// Sends the request on to the emulator and its answer back, tables' answers given the
/// collations and widened types the test scripted.
async fn forward(
    shared: &Arc<Shared>,
    method: axum::http::Method,
    path: &str,
    path_and_query: &str,
    content_type: Option<axum::http::HeaderValue>,
    body: Bytes,
) -> Response {
    let is_get = method == "GET";
    let narrow = method == "POST" && path.ends_with("/tables") && shared.state.lock().unwrap().bignumeric_as_numeric;
    let body = if narrow { narrowed_insert(shared, body) } else { body };
    let mut forwarded = shared.http.request(method, format!("http://{}{path_and_query}", shared.upstream)).body(body);
    if let Some(content_type) = content_type {
        forwarded = forwarded.header("content-type", content_type);
    }
    match forwarded.timeout(Duration::from_secs(120)).send().await {
        Ok(response) => {
            let status = StatusCode::from_u16(response.status().as_u16()).unwrap();
            let content_type = response.headers().get("content-type").cloned();
            let mut bytes = response.bytes().await.unwrap_or_default();
            if is_get && is_table_path(path) {
                bytes = with_collations(shared, path, bytes);
                bytes = widened_answer(shared, path, bytes);
            }
            let mut answer = (status, bytes).into_response();
            if let Some(content_type) = content_type {
                answer.headers_mut().insert("content-type", content_type);
            }
            answer
        }
        Err(e) => (StatusCode::BAD_GATEWAY, e.to_string()).into_response(),
    }
}
