//! A simulation of BigQuery's control plane for the many-tables benchmark and the fleet tests: a
//! REST server that keeps datasets, tables and query jobs in memory and answers them with
//! BigQuery's latencies and published quotas ([`Limits`]), beside the Storage Write fake
//! (`fake_write`) set to the same limits ([`Limits::apply_to`]). Nothing is stored but metadata:
//! rows are counted by the Storage Write fake.
//!
//! What it simulates (defaults and their sources: `docs/performance.md`):
//! - every REST call counts against the quotas it falls under (`quota_meter`): `tables.insert`
//!   per second, each method per second, concurrent requests (long polls included); a call
//!   beyond one is refused (403 `rateLimitExceeded`) and counted;
//! - `datasets.get`, `tables.get`: `metadata_read`; `tables.insert`, `tables.patch`:
//!   `metadata_write`, and at most `table_updates_per_10s` per table (beyond: 403
//!   `rateLimitExceeded`, as BigQuery answers its table metadata update limit);
//!   `tables.delete`: `table_delete`;
//! - query jobs: `query` plus `query_per_mib` per MiB staged, at most `concurrent_queries`
//!   running in the project and `concurrent_dml_per_table` on one table; the others queue (as
//!   BigQuery queues them), `jobs.getQueryResults` long polls answered when the job ends;
//! - `CreateWriteStream` (in the Storage Write fake): its hourly quota read as an hourly bucket
//!   or per minute ([`StreamQuota`]), and its latency beyond 40 calls a second.
//!
//! [`Limits::floor`] is the time no client can beat for a run of N resources under them;
//! [`SimulatedRest::quota_use`] the highest use of every quota, which a fleet pacing within
//! them keeps at or below 1.0.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use tokio::sync::{Semaphore, watch};
use tokio::time::Instant;

use super::fake_rest::bigquery_error;
use super::quota_meter::{ConcurrencyMeter, QuotaUse, RateMeter};

pub mod limits;

use limits::Limits;

/// Every quota a REST call counts against, and what each saw.
struct Quotas {
    tables_insert: RateMeter,
    per_method: HashMap<&'static str, RateMeter>,
    concurrent: ConcurrencyMeter,
    /// Calls by method (refused ones included).
    calls: HashMap<&'static str, usize>,
}

impl Quotas {
    fn new(limits: &Limits) -> Self {
        Quotas {
            tables_insert: RateMeter::per_second("tables.insert per second", limits.tables_insert_per_second),
            per_method: HashMap::new(),
            concurrent: ConcurrencyMeter::new("concurrent API requests", limits.concurrent_api_requests),
            calls: HashMap::new(),
        }
    }

    /// Counts a call of `method`: `false` when a quota refuses it (then it is not in flight).
    fn admit(&mut self, limits: &Limits, method: &'static str) -> bool {
        *self.calls.entry(method).or_default() += 1;
        let per_second = limits.api_requests_per_second_per_method;
        let method_meter = self
            .per_method
            .entry(method)
            .or_insert_with(|| RateMeter::per_second(format!("{method} per second"), per_second));
        let admitted = method_meter.admit() && (method != "tables.insert" || self.tables_insert.admit());
        admitted && self.concurrent.enter()
    }

    fn uses(&self) -> Vec<QuotaUse> {
        let mut uses: Vec<QuotaUse> = self.per_method.values().map(QuotaUse::from).collect();
        uses.push(QuotaUse::from(&self.tables_insert));
        uses.push(QuotaUse::from(&self.concurrent));
        uses
    }
}

/// The REST method a request calls, as BigQuery's quotas name it.
fn method_of(method: &str, parts: &[&str]) -> &'static str {
    match (method, parts) {
        ("GET", [_, "datasets"]) => "datasets.list",
        ("GET", [_, "datasets", _]) => "datasets.get",
        ("POST", [_, "datasets"]) => "datasets.insert",
        ("GET", [_, "datasets", _, "tables", _]) => "tables.get",
        ("POST", [_, "datasets", _, "tables"]) => "tables.insert",
        ("PATCH", [_, "datasets", _, "tables", _]) => "tables.patch",
        ("PUT", [_, "datasets", _, "tables", _]) => "tables.update",
        ("DELETE", [_, "datasets", _, "tables", _]) => "tables.delete",
        ("POST", [_, "jobs"]) => "jobs.insert",
        ("GET", [_, "jobs", _]) => "jobs.get",
        ("GET", [_, "queries", _]) => "jobs.getQueryResults",
        _ => "other",
    }
}

#[derive(Default)]
struct Catalog {
    datasets: HashMap<String, Value>,
    tables: HashMap<String, Value>,
    /// Metadata updates per table within the last 10 s.
    table_updates: HashMap<String, VecDeque<Instant>>,
    jobs: HashMap<String, watch::Receiver<bool>>,
    table_slots: HashMap<String, Arc<Semaphore>>,
    counters: Counters,
}

/// What the simulation saw.
#[derive(Debug, Default, Clone)]
pub struct Counters {
    pub jobs_inserted: usize,
    /// Dry runs (`configuration.dryRun`): answered at once, creating no job.
    pub dry_runs: usize,
    pub running_queries: usize,
    pub max_running_queries: usize,
    pub refused_table_updates: usize,
    pub tables_deleted: usize,
}

/// A running simulated REST API. Point the gateway's `BIGQUERY_EMULATOR_HOST` at `address`.
#[derive(Clone)]
pub struct SimulatedRest {
    pub address: String,
    shared: Arc<Shared>,
}

struct Shared {
    limits: Limits,
    /// Bytes each query job reads (the benchmark's bytes per resource).
    bytes_per_job: u64,
    queries: Arc<Semaphore>,
    catalog: Mutex<Catalog>,
    quotas: Mutex<Quotas>,
}

impl SimulatedRest {
    pub async fn start(limits: Limits, bytes_per_job: u64) -> Self {
        let shared = Arc::new(Shared {
            limits,
            bytes_per_job,
            queries: Arc::new(Semaphore::new(limits.concurrent_queries)),
            catalog: Mutex::default(),
            quotas: Mutex::new(Quotas::new(&limits)),
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap().to_string();
        let app = axum::Router::new().fallback(handle).with_state(Arc::clone(&shared));
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        Self { address, shared }
    }

    pub fn counters(&self) -> Counters {
        self.shared.catalog.lock().unwrap().counters.clone()
    }

    /// The highest use of every REST quota so far, and the calls each refused.
    pub fn quota_use(&self) -> Vec<QuotaUse> {
        self.shared.quotas.lock().unwrap().uses()
    }

    /// REST calls made so far (refused ones included).
    pub fn rest_calls(&self) -> usize {
        self.shared.quotas.lock().unwrap().calls.values().sum()
    }

    /// Calls of one REST method (`tables.get`, ...) made so far, refused ones included.
    pub fn calls_of(&self, method: &str) -> usize {
        self.shared.quotas.lock().unwrap().calls.get(method).copied().unwrap_or(0)
    }
}

/// The path after `/projects/`, split: `[project, "datasets", d, "tables", t]`, ...
fn segments(path: &str) -> Vec<String> {
    path.split_once("/projects/").map(|(_, rest)| rest.split('/').map(str::to_string).collect()).unwrap_or_default()
}

/// Counts the call against the quotas (refusing one beyond them), then answers it.
async fn handle(State(shared): State<Arc<Shared>>, request: Request) -> Response {
    let method = request.method().as_str().to_string();
    let path = request.uri().path().to_string();
    let parts = segments(&path);
    let parts: Vec<&str> = parts.iter().map(String::as_str).collect();
    let quota_method = method_of(&method, &parts);
    if !shared.quotas.lock().unwrap().admit(&shared.limits, quota_method) {
        let message = format!("Exceeded rate limits: too many api requests per user per method for {quota_method}");
        let error = bigquery_error(403, "PERMISSION_DENIED", &message, "rateLimitExceeded", vec![]);
        return (StatusCode::FORBIDDEN, axum::Json(error)).into_response();
    }
    let answer = answer(&shared, request, &method, &path, &parts).await;
    shared.quotas.lock().unwrap().concurrent.leave();
    answer
}

async fn answer(shared: &Arc<Shared>, request: Request, method: &str, path: &str, parts: &[&str]) -> Response {
    let query = request.uri().query().unwrap_or_default().to_string();
    let body: Bytes = axum::body::to_bytes(request.into_body(), usize::MAX).await.unwrap_or_default();
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let limits = shared.limits;
    match (method, parts) {
        ("GET", [_, "datasets"]) => json_answer(json!({"datasets": []})),
        ("GET", [p, "datasets", d]) => {
            tokio::time::sleep(limits.metadata_read).await;
            let found = shared.catalog.lock().unwrap().datasets.get(&format!("{p}.{d}")).cloned();
            found.map_or_else(|| not_found(&format!("Dataset {p}:{d}")), json_answer)
        }
        ("POST", [p, "datasets"]) => {
            tokio::time::sleep(limits.metadata_write).await;
            let d = body["datasetReference"]["datasetId"].as_str().unwrap_or_default().to_string();
            let mut dataset = body.clone();
            dataset["location"] = json!(body["location"].as_str().unwrap_or("US"));
            shared.catalog.lock().unwrap().datasets.insert(format!("{p}.{d}"), dataset.clone());
            json_answer(dataset)
        }
        ("GET", [p, "datasets", d, "tables", t]) => {
            tokio::time::sleep(limits.metadata_read).await;
            let found = shared.catalog.lock().unwrap().tables.get(&format!("{p}.{d}.{t}")).cloned();
            found.map_or_else(|| not_found(&format!("Table {p}:{d}.{t}")), json_answer)
        }
        ("POST", [p, "datasets", d, "tables"]) => {
            let t = body["tableReference"]["tableId"].as_str().unwrap_or_default().to_string();
            update_table(shared, &format!("{p}.{d}.{t}"), body, true).await
        }
        ("PATCH" | "PUT", [p, "datasets", d, "tables", t]) => {
            update_table(shared, &format!("{p}.{d}.{t}"), body, false).await
        }
        ("DELETE", [p, "datasets", d, "tables", t]) => {
            tokio::time::sleep(limits.table_delete).await;
            let mut catalog = shared.catalog.lock().unwrap();
            catalog.tables.remove(&format!("{p}.{d}.{t}"));
            catalog.counters.tables_deleted += 1;
            StatusCode::NO_CONTENT.into_response()
        }
        ("POST", [_, "jobs"]) => insert_job(shared, body),
        ("GET", [_, "jobs", id]) => job_answer(shared, id, false, "").into_response(),
        ("GET", [_, "queries", id]) => job_answer(shared, id, true, &query).await_answer().await,
        _ => not_found(&format!("simulation: no route for {method} {path}")),
    }
}

fn json_answer(value: Value) -> Response {
    axum::Json(value).into_response()
}

fn not_found(what: &str) -> Response {
    let error = bigquery_error(404, "NOT_FOUND", &format!("Not found: {what}"), "notFound", vec![]);
    (StatusCode::NOT_FOUND, axum::Json(error)).into_response()
}

/// `tables.insert` (`create`) or `tables.patch`: within the table's metadata update limit.
async fn update_table(shared: &Shared, table: &str, body: Value, create: bool) -> Response {
    let limits = shared.limits;
    {
        let mut catalog = shared.catalog.lock().unwrap();
        if create && catalog.tables.contains_key(table) {
            let error =
                bigquery_error(409, "ALREADY_EXISTS", &format!("Already Exists: Table {table}"), "duplicate", vec![]);
            return (StatusCode::CONFLICT, axum::Json(error)).into_response();
        }
        let now = Instant::now();
        let updates = catalog.table_updates.entry(table.to_string()).or_default();
        while updates.front().is_some_and(|at| now.duration_since(*at) >= Duration::from_secs(10)) {
            updates.pop_front();
        }
        if updates.len() >= limits.table_updates_per_10s {
            catalog.counters.refused_table_updates += 1;
            let message = format!("Exceeded rate limits: too many table update operations for this table: {table}");
            let error = bigquery_error(403, "PERMISSION_DENIED", &message, "rateLimitExceeded", vec![]);
            return (StatusCode::FORBIDDEN, axum::Json(error)).into_response();
        }
        updates.push_back(now);
    }
    tokio::time::sleep(limits.metadata_write).await;
    let mut catalog = shared.catalog.lock().unwrap();
    let mut stored =
        if create { body.clone() } else { catalog.tables.get(table).cloned().unwrap_or_else(|| body.clone()) };
    if !create && let Some(object) = body.as_object() {
        for (key, value) in object {
            stored[key] = value.clone();
        }
    }
    stored["id"] = json!(table);
    stored["type"] = json!("TABLE");
    catalog.tables.insert(table.to_string(), stored.clone());
    json_answer(stored)
}

/// The table a statement writes: its first back-quoted path (`` `p`.`d`.`t` ``).
fn written_table(sql: &str) -> String {
    let Some(start) = sql.find('`') else { return String::new() };
    sql[start..].split_whitespace().next().unwrap_or_default().to_string()
}

/// `jobs.insert`: a dry run is answered DONE at once (no job); a job queues for a project slot and a slot on its table, runs for
/// [`Limits::query_duration`], then is DONE.
fn insert_job(shared: &Arc<Shared>, body: Value) -> Response {
    if body["configuration"]["dryRun"] == true {
        shared.catalog.lock().unwrap().counters.dry_runs += 1;
        let mut planned = super::rest_proxy::job("", "DONE", None);
        planned["statistics"]["query"]["totalBytesProcessed"] = json!("0");
        return json_answer(planned);
    }
    let id = body["jobReference"]["jobId"].as_str().unwrap_or_default().to_string();
    let table = written_table(body["configuration"]["query"]["query"].as_str().unwrap_or_default());
    let (done_tx, done_rx) = watch::channel(false);
    let table_slots = {
        let mut catalog = shared.catalog.lock().unwrap();
        if catalog.jobs.contains_key(&id) {
            let message = format!("Already Exists: Job filament-demo:US.{id}");
            let error = bigquery_error(409, "ALREADY_EXISTS", &message, "duplicate", vec![]);
            return (StatusCode::CONFLICT, axum::Json(error)).into_response();
        }
        catalog.jobs.insert(id.clone(), done_rx);
        catalog.counters.jobs_inserted += 1;
        let per_table = shared.limits.concurrent_dml_per_table;
        Arc::clone(catalog.table_slots.entry(table).or_insert_with(|| Arc::new(Semaphore::new(per_table))))
    };
    let shared = Arc::clone(shared);
    tokio::spawn(async move {
        let _table = table_slots.acquire_owned().await.unwrap();
        let _project = Arc::clone(&shared.queries).acquire_owned().await.unwrap();
        {
            let mut catalog = shared.catalog.lock().unwrap();
            catalog.counters.running_queries += 1;
            catalog.counters.max_running_queries =
                catalog.counters.max_running_queries.max(catalog.counters.running_queries);
        }
        tokio::time::sleep(shared.limits.query_duration(shared.bytes_per_job)).await;
        shared.catalog.lock().unwrap().counters.running_queries -= 1;
        let _ = done_tx.send(true);
    });
    json_answer(job_body(&id, false))
}

fn job_body(id: &str, done: bool) -> Value {
    super::rest_proxy::job(id, if done { "DONE" } else { "RUNNING" }, None)
}

/// `jobs.get` or a `jobs.getQueryResults` long poll (answered when the job ends, or after its
/// `timeoutMs`).
struct JobAnswer {
    done: Option<watch::Receiver<bool>>,
    id: String,
    long_poll: Option<Duration>,
}

fn job_answer(shared: &Shared, id: &str, long_poll: bool, query: &str) -> JobAnswer {
    let done = shared.catalog.lock().unwrap().jobs.get(id).cloned();
    let wait = super::rest_proxy::long_poll_wait(&format!("?{query}"));
    JobAnswer { done, id: id.to_string(), long_poll: long_poll.then_some(wait) }
}

impl JobAnswer {
    async fn await_answer(self) -> Response {
        let Some(mut done) = self.done else { return not_found(&format!("Job {}", self.id)) };
        let Some(wait) = self.long_poll else { return json_answer(job_body(&self.id, *done.borrow())) };
        let complete = tokio::time::timeout(wait, done.wait_for(|done| *done)).await.is_ok();
        let reference = json!({"projectId": "filament-demo", "jobId": self.id, "location": "US"});
        json_answer(
            json!({"kind": "bigquery#getQueryResultsResponse", "jobReference": reference, "jobComplete": complete}),
        )
    }
}

impl IntoResponse for JobAnswer {
    fn into_response(self) -> Response {
        let Some(done) = self.done else { return not_found(&format!("Job {}", self.id)) };
        json_answer(job_body(&self.id, *done.borrow()))
    }
}
