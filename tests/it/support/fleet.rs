//! A fleet: several real gateway processes on one database behind a real haproxy (round-robin,
//! no affinity, health-checked on `/readyz`), as a site would run them. Replicas can be
//! restarted in place (SIGTERM, then a new process on the same port), killed, or added. The
//! [`Extractor`] talks to the load balancer and retries what a real client retries (503 and 429
//! after `Retry-After`, 502 and cut connections), always with the same `seq`, so a retry can
//! only replay a receipt, never add rows.

use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use super::{Gateway, GatewayOptions, eventually, random_suffix, within};

/// How long an extractor keeps retrying one request.
const RETRY_DEADLINE: Duration = Duration::from_secs(90);
/// An extractor's pause between two tries of a request.
const RETRY_INTERVAL: Duration = Duration::from_millis(300);

pub struct Fleet {
    pub replicas: Vec<Gateway>,
    ports: Vec<u16>,
    env: Vec<(String, String)>,
    token: String,
    pub database_url: String,
    pub dataset: String,
    haproxy: Child,
    pub lb_url: String,
    /// haproxy's statistics page (what its health checks made of each replica).
    stats_url: String,
    config_path: std::path::PathBuf,
}

impl Fleet {
    /// `size` replicas with `env` (plus a shared token, database and dataset) behind haproxy.
    pub async fn start(size: usize, env: &[(&str, &str)]) -> Self {
        let token = format!("fleet-token-{}", random_suffix());
        let env: Vec<(String, String)> = env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        let ports: Vec<u16> = (0..size).map(|_| super::free_port_for_later_bind()).collect();
        let first = spawn_replica(&env, &token, ports[0], None).await;
        let (database_url, dataset) = (first.database_url.clone(), first.dataset.clone());
        let mut replicas = vec![first];
        for port in &ports[1..] {
            replicas.push(spawn_replica(&env, &token, *port, Some((&database_url, &dataset))).await);
        }
        let (lb_port, stats_port) = (super::free_port_for_later_bind(), super::free_port_for_later_bind());
        let config_path = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("haproxy-{lb_port}.cfg"));
        std::fs::write(&config_path, haproxy_config(lb_port, stats_port, &ports)).unwrap();
        let haproxy = Command::new(haproxy_binary())
            .args(["-db", "-f"])
            .arg(&config_path)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start haproxy (scripts/system-deps.sh installs it)");
        let fleet = Self {
            replicas,
            ports,
            env,
            token,
            database_url,
            dataset,
            haproxy,
            lb_url: format!("http://127.0.0.1:{lb_port}"),
            stats_url: format!("http://127.0.0.1:{stats_port}/stats;csv"),
            config_path,
        };
        fleet.wait_until_balanced().await;
        fleet
    }

    /// An extractor that talks to the load balancer.
    pub fn extractor(&self) -> Extractor {
        Extractor {
            http: super::extractor_http_client().build().unwrap(),
            base_url: self.lb_url.clone(),
            token: self.token.clone(),
            dataset: self.dataset.clone(),
        }
    }

    /// An extractor that talks to replica `index` directly.
    pub fn direct_extractor(&self, index: usize) -> Extractor {
        Extractor { base_url: self.replicas[index].base_url.clone(), ..self.extractor() }
    }

    /// SIGTERM to replica `index`, which must exit cleanly, then a new process on its port; the
    /// stopped process's log.
    pub async fn restart(&mut self, index: usize) -> String {
        let status = self.replicas[index].terminate().await;
        let logs = self.replicas[index].logs();
        assert!(status.success(), "replica {index} exits cleanly on SIGTERM: {status}");
        let shared = (self.database_url.as_str(), self.dataset.as_str());
        self.replicas[index] = spawn_replica(&self.env, &self.token, self.ports[index], Some(shared)).await;
        self.wait_until_balanced().await;
        logs
    }

    /// A new replica on the fleet's database (not behind the load balancer).
    pub async fn spawn_extra(&self) -> Gateway {
        let shared = (self.database_url.as_str(), self.dataset.as_str());
        spawn_replica(&self.env, &self.token, super::free_port_for_later_bind(), Some(shared)).await
    }

    /// The replica index serving an execution now (by its advertised URL), if any.
    pub async fn owner_of(&self, run: &str, execution: &str) -> Option<usize> {
        use sqlx::Connection as _;
        let mut db = sqlx::PgConnection::connect(&self.database_url).await.unwrap();
        let url: Option<String> =
            sqlx::query_scalar("SELECT owner_url FROM executions WHERE run_id = $1 AND execution_id = $2")
                .bind(run)
                .bind(execution)
                .fetch_one(&mut db)
                .await
                .unwrap();
        let port: u16 = url?.rsplit(':').next()?.parse().ok()?;
        self.ports.iter().position(|p| *p == port)
    }

    /// Every replica answers `/readyz`, checked directly, and haproxy's health checks have
    /// marked every one of them up.
    async fn wait_until_balanced(&self) {
        let http = reqwest::Client::new();
        for replica in &self.replicas {
            let url = replica.url("/readyz");
            eventually(Duration::from_secs(30), "a replica to be ready", || {
                let request = http.get(&url).send();
                async move { request.await.ok().filter(|r| r.status().is_success()).map(|_| ()) }
            })
            .await;
        }
        eventually(Duration::from_secs(30), "haproxy to mark every replica up", || async {
            let csv = http.get(&self.stats_url).send().await.ok()?.text().await.ok()?;
            let statuses = server_statuses(&csv);
            (statuses.len() == self.replicas.len() && statuses.iter().all(|status| status == "UP")).then_some(())
        })
        .await;
    }
}

/// The status haproxy's statistics (CSV) give each server of the `replicas` backend.
fn server_statuses(csv: &str) -> Vec<String> {
    let mut lines = csv.lines();
    let header: Vec<&str> = lines.next().unwrap_or_default().trim_start_matches("# ").split(',').collect();
    let column = |name: &str| header.iter().position(|h| *h == name);
    let (Some(proxy), Some(server), Some(status)) = (column("pxname"), column("svname"), column("status")) else {
        return Vec::new();
    };
    lines
        .map(|line| line.split(',').collect::<Vec<_>>())
        .filter(|fields| {
            fields.get(proxy) == Some(&"replicas") && fields.get(server).is_some_and(|s| s.starts_with('g'))
        })
        .filter_map(|fields| fields.get(status).map(|s| s.to_string()))
        .collect()
}

impl Drop for Fleet {
    fn drop(&mut self) {
        let _ = self.haproxy.kill();
        let _ = self.haproxy.wait();
        let _ = std::fs::remove_file(&self.config_path);
    }
}

fn haproxy_binary() -> String {
    ["/usr/sbin/haproxy", "/usr/local/sbin/haproxy"]
        .iter()
        .find(|p| std::path::Path::new(p).exists())
        .map_or_else(|| "haproxy".to_string(), |p| p.to_string())
}

/// Round-robin over the replicas, no affinity; a replica leaves the rotation when `/readyz`
/// fails (it does from SIGTERM on) and a refused connection is retried on another one. The
/// statistics page on `stats_port` shows what the health checks found.
fn haproxy_config(lb_port: u16, stats_port: u16, ports: &[u16]) -> String {
    let servers: String =
        ports.iter().enumerate().map(|(i, port)| format!("    server g{i} 127.0.0.1:{port} check\n")).collect();
    format!(
        "global\n    maxconn 2048\n\
         defaults\n    mode http\n    timeout connect 2s\n    timeout client 120s\n    timeout server 120s\n\
         \x20   retries 3\n    option redispatch\n    retry-on conn-failure empty-response\n\
         listen stats\n    bind 127.0.0.1:{stats_port}\n    stats enable\n    stats uri /stats\n\
         frontend gateway\n    bind 127.0.0.1:{lb_port}\n    default_backend replicas\n\
         backend replicas\n    balance roundrobin\n    option httpchk GET /readyz\n    http-check expect status 200\n\
         \x20   default-server inter 400ms fall 1 rise 1\n{servers}"
    )
}

async fn spawn_replica(env: &[(String, String)], token: &str, port: u16, shared: Option<(&str, &str)>) -> Gateway {
    let mut options =
        GatewayOptions::new().env("FILAMENT_LISTEN", &format!("127.0.0.1:{port}")).env("FILAMENT_API_TOKENS", token);
    for (k, v) in env {
        options = options.env(k, v);
    }
    if let Some((database_url, _)) = shared {
        options = options.database_url(database_url);
    }
    let mut gateway = options.spawn().await;
    gateway.token = token.to_string();
    if let Some((_, dataset)) = shared {
        gateway.dataset = dataset.to_string();
    }
    gateway
}

/// An extractor behind the load balancer.
#[derive(Clone)]
pub struct Extractor {
    http: reqwest::Client,
    base_url: String,
    token: String,
    pub dataset: String,
}

/// What an extractor retries: the gateway said so (429, 503 other than `gateway_restarted`,
/// which asks for a redelivery), or the answer never came whole (502, 504, a cut connection).
fn retryable(answer: Option<&(StatusCode, Value)>) -> bool {
    match answer {
        None => true,
        Some((status, body)) => match status.as_u16() {
            429 | 502 | 504 => true,
            503 => body["code"] != "gateway_restarted",
            _ => false,
        },
    }
}

impl Extractor {
    /// Sends until an answer that is not retryable, every [`RETRY_INTERVAL`] within
    /// [`RETRY_DEADLINE`].
    pub async fn send(&self, method: Method, path: &str, body: Option<RequestBody>) -> (StatusCode, Value) {
        let last_retried = Mutex::new(None);
        let answer = within(RETRY_DEADLINE, RETRY_INTERVAL, || async {
            let answer = self.try_once(&method, path, body.as_ref()).await;
            if retryable(answer.as_ref()) {
                *last_retried.lock().unwrap() = Some(answer);
                return None;
            }
            answer
        })
        .await;
        answer.unwrap_or_else(|| {
            let last = last_retried.lock().unwrap().take();
            panic!("{method} {path} still failing after {RETRY_DEADLINE:?}: {last:?}")
        })
    }

    /// One try of a request: its answer, or `None` when none came whole.
    async fn try_once(&self, method: &Method, path: &str, body: Option<&RequestBody>) -> Option<(StatusCode, Value)> {
        let mut request =
            self.http.request(method.clone(), format!("{}{path}", self.base_url)).bearer_auth(&self.token);
        request = match body {
            Some(RequestBody::Json(json)) => request.json(json),
            Some(RequestBody::Arrow(bytes)) => {
                request.header("content-type", "application/vnd.apache.arrow.stream").body(bytes.clone())
            }
            None => request,
        };
        let response = request.send().await.ok()?;
        let status = response.status();
        let text = response.text().await.unwrap_or_default();
        Some((status, serde_json::from_str(&text).unwrap_or(Value::String(text))))
    }

    pub async fn json(&self, method: Method, path: &str, body: Option<Value>) -> (StatusCode, Value) {
        self.send(method, path, body.map(RequestBody::Json)).await
    }

    /// Creates the run with `resources` declared (name, declaration).
    pub async fn create_run(&self, run: &str, resources: &[(&str, Value)]) {
        let body = json!({"run_id": run, "destination": {"project": "filament-demo", "dataset": self.dataset}});
        let (status, created) = self.json(Method::POST, "/v1/runs", Some(body)).await;
        assert_eq!(status, StatusCode::CREATED, "{created}");
        for (resource, declaration) in resources {
            let path = format!("/v1/runs/{run}/resources/{resource}");
            let (status, declared) = self.json(Method::PUT, &path, Some(declaration.clone())).await;
            assert_eq!(status, StatusCode::OK, "{declared}");
        }
    }

    pub async fn open(&self, run: &str, execution: &str) -> (StatusCode, Value) {
        self.json(Method::POST, &format!("/v1/runs/{run}/executions"), Some(json!({"execution_id": execution}))).await
    }

    /// Posts a batch at `seq`: accepted (202) or, after a retry, replayed (200).
    pub async fn post(
        &self,
        run: &str,
        execution: &str,
        resource: &str,
        seq: i64,
        body: Vec<u8>,
    ) -> (StatusCode, Value) {
        let path = format!("/v1/runs/{run}/executions/{execution}/resources/{resource}/batches?seq={seq}");
        self.send(Method::POST, &path, Some(RequestBody::Arrow(body))).await
    }

    /// Commits and waits for the terminal state (polling the view when the commit answer is 202).
    pub async fn commit(&self, run: &str, execution: &str) -> Value {
        let (status, body) =
            self.json(Method::POST, &format!("/v1/runs/{run}/executions/{execution}/commit?wait=true"), None).await;
        if status == StatusCode::OK && body["state"] != "committing" {
            return body;
        }
        assert!(status.is_success() || status == StatusCode::CONFLICT, "commit {execution}: {status} {body}");
        let path = format!("/v1/runs/{run}/executions/{execution}");
        eventually(Duration::from_secs(90), "the commit to end", || async {
            let (_, seen) = self.json(Method::GET, &path, None).await;
            (seen["state"] != "committing" && seen["state"] != "extracting").then_some(seen)
        })
        .await
    }
}

pub enum RequestBody {
    Json(Value),
    Arrow(Vec<u8>),
}
