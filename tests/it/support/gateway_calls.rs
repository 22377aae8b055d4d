//! The gateway's HTTP API as the tests call it: requests with the suite's token, JSON answers,
//! batches, runs, declarations, executions, commits and `/metrics`.

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use super::{Gateway, send};

impl Gateway {
    pub fn url(&self, path: &str) -> String {
        format!("{}{}", self.base_url, path)
    }

    /// A request with the gateway's token.
    pub fn request(&self, method: Method, path: &str) -> reqwest::RequestBuilder {
        self.http.request(method, self.url(path)).bearer_auth(&self.token)
    }

    pub fn unauthenticated(&self, method: Method, path: &str) -> reqwest::RequestBuilder {
        self.http.request(method, self.url(path))
    }

    pub async fn json(&self, method: Method, path: &str, body: Option<Value>) -> (StatusCode, Value) {
        let mut request = self.request(method, path);
        if let Some(body) = body {
            request = request.json(&body);
        }
        send(request).await
    }

    pub async fn post_batch(
        &self,
        run: &str,
        execution: &str,
        resource: &str,
        seq: Option<i64>,
        body: Vec<u8>,
    ) -> (StatusCode, Value) {
        let mut path = format!("/v1/runs/{run}/executions/{execution}/resources/{resource}/batches");
        if let Some(seq) = seq {
            path.push_str(&format!("?seq={seq}"));
        }
        send(self.request(Method::POST, &path).header("content-type", "application/vnd.apache.arrow.stream").body(body))
            .await
    }

    /// The gateway's Prometheus exposition (`/metrics`).
    pub async fn metrics(&self) -> String {
        self.unauthenticated(Method::GET, "/metrics").send().await.unwrap().text().await.unwrap()
    }

    /// The value of one series (its name and labels, as exported), when it is exported.
    pub async fn metric(&self, series: &str) -> Option<f64> {
        let metrics = self.metrics().await;
        metrics.lines().find_map(|line| line.strip_prefix(series)?.strip_prefix(' ')?.trim().parse().ok())
    }

    /// Creates a run on this gateway's dataset.
    pub async fn create_run(&self, run_id: &str) -> Value {
        let (status, body) = self
            .json(
                Method::POST,
                "/v1/runs",
                Some(json!({"run_id": run_id, "destination": {"project": self.project, "dataset": self.dataset}})),
            )
            .await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
        body
    }

    pub async fn declare(&self, run: &str, resource: &str, body: Value) -> Value {
        let (status, body) = self.json(Method::PUT, &format!("/v1/runs/{run}/resources/{resource}"), Some(body)).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        body
    }

    /// Opens a new execution, asserting 201.
    pub async fn open_new_execution(&self, run: &str, execution: &str) -> Value {
        let (status, body) = self.open_execution(run, execution).await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
        body
    }

    /// Posts a batch, asserting 202; the receipt.
    pub async fn post_accepted(
        &self,
        run: &str,
        execution: &str,
        resource: &str,
        seq: Option<i64>,
        body: Vec<u8>,
    ) -> Value {
        let (status, receipt) = self.post_batch(run, execution, resource, seq, body).await;
        assert_eq!(status, StatusCode::ACCEPTED, "{receipt}");
        receipt
    }

    pub async fn open_execution(&self, run: &str, execution: &str) -> (StatusCode, Value) {
        self.json(Method::POST, &format!("/v1/runs/{run}/executions"), Some(json!({"execution_id": execution}))).await
    }

    pub async fn commit_and_wait(&self, run: &str, execution: &str) -> Value {
        let (status, body) =
            self.json(Method::POST, &format!("/v1/runs/{run}/executions/{execution}/commit?wait=true"), None).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        body
    }

    /// The execution once its commit ended, failed or not: a lane that fails at set-up fails
    /// the execution at the commit's flush, or earlier when the flush interval passes first
    /// (then the commit answers 409 `execution_not_extracting` and the execution is read).
    pub async fn commit_until_ended(&self, run: &str, execution: &str) -> Value {
        let path = format!("/v1/runs/{run}/executions/{execution}");
        let (status, body) = self.json(Method::POST, &format!("{path}/commit?wait=true"), None).await;
        if status == StatusCode::OK {
            return body;
        }
        assert_eq!(body["code"], "execution_not_extracting", "{body}");
        self.json(Method::GET, &path, None).await.1
    }
}
