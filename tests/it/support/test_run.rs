//! The set-up most tests start from: a run on the gateway's dataset, its resources declared and
//! one execution opened, every step asserting its status so a broken set-up fails where it
//! breaks rather than later, in an unrelated assertion.

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use super::Gateway;

/// `TestRun::new("run", "e").full_append(&["t"]).open(&gw).await`
#[derive(Debug, Clone)]
pub struct TestRun {
    run_id: String,
    execution_id: String,
    batching: Option<Value>,
    resources: Vec<(String, Value)>,
}

impl TestRun {
    pub fn new(run_id: &str, execution_id: &str) -> Self {
        Self { run_id: run_id.into(), execution_id: execution_id.into(), batching: None, resources: Vec::new() }
    }

    /// The run's `batching` settings (the gateway's defaults otherwise).
    pub fn batching(mut self, batching: Value) -> Self {
        self.batching = Some(batching);
        self
    }

    /// Declares `resource` with `declaration` (its write mode, table, keys).
    pub fn resource(mut self, resource: &str, declaration: Value) -> Self {
        self.resources.push((resource.into(), declaration));
        self
    }

    /// Declares each of `resources` as `full_append`.
    pub fn full_append(self, resources: &[&str]) -> Self {
        resources.iter().fold(self, |run, resource| run.resource(resource, json!({"write_mode": "full_append"})))
    }

    /// Creates the run (201), declares every resource (200) and opens the execution (201); the
    /// opened execution.
    pub async fn open(self, gw: &Gateway) -> Value {
        let mut run = json!({"run_id": self.run_id, "destination": {"project": gw.project, "dataset": gw.dataset}});
        if let Some(batching) = self.batching {
            run["batching"] = batching;
        }
        let (status, body) = gw.json(Method::POST, "/v1/runs", Some(run)).await;
        assert_eq!(status, StatusCode::CREATED, "create run {}: {body}", self.run_id);
        for (resource, declaration) in self.resources {
            gw.declare(&self.run_id, &resource, declaration).await;
        }
        gw.open_new_execution(&self.run_id, &self.execution_id).await
    }
}
