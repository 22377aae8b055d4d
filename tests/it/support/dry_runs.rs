//! Dry runs (`jobs.insert` with `configuration.dryRun`) as the REST proxy answers them: the
//! emulator plans every dry run at 0 bytes, so a test scripts what BigQuery would report
//! (`totalBytesProcessed` per query), refuse (an invalid query) or push back (a rate limit).
//! A dry run creates no job: no `JobMode` and no job refusal applies to it.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::fake_rest::bigquery_error;
use super::rest_proxy::RestProxy;

/// How the proxy answers dry runs; a dry run nothing here scripts is forwarded.
#[derive(Debug, Default)]
pub struct DryRunScript {
    /// (part of the query, bytes): answered DONE with `totalBytesProcessed` these bytes.
    pub bytes: Vec<(String, i64)>,
    /// Parts of queries BigQuery refuses to plan: 400 `invalidQuery`.
    pub refused: Vec<String>,
    /// The next this many dry runs are pushed back: 429 `rateLimitExceeded`.
    pub push_back: usize,
    /// Every dry run is answered 503 `backendError`: BigQuery cannot be asked.
    pub unavailable: bool,
}

/// Whether a `jobs.insert` body asks for a dry run.
pub fn is_dry_run(body: &Value) -> bool {
    body["configuration"]["dryRun"] == json!(true)
}

/// BigQuery's answer to the dry run `body` as `script` has it, or `None` to forward it.
pub fn answer(script: &mut DryRunScript, body: &Value) -> Option<Response> {
    let query = body["configuration"]["query"]["query"].as_str().unwrap_or("");
    if script.push_back > 0 {
        script.push_back -= 1;
        let message = "Exceeded rate limits: too many api requests per user per method for this user_method";
        let error = bigquery_error(429, "RESOURCE_EXHAUSTED", message, "rateLimitExceeded", vec![]);
        return Some((StatusCode::TOO_MANY_REQUESTS, axum::Json(error)).into_response());
    }
    if script.unavailable {
        let error = bigquery_error(
            503,
            "UNAVAILABLE",
            "Error encountered during execution. Retrying may solve the problem.",
            "backendError",
            vec![],
        );
        return Some((StatusCode::SERVICE_UNAVAILABLE, axum::Json(error)).into_response());
    }
    if script.refused.iter().any(|part| query.contains(part.as_str())) {
        let message = "Query error: Column v of type NUMERIC cannot be inserted into a column of type INT64";
        let error = bigquery_error(400, "INVALID_ARGUMENT", message, "invalidQuery", vec![]);
        return Some((StatusCode::BAD_REQUEST, axum::Json(error)).into_response());
    }
    let (_, bytes) = script.bytes.iter().find(|(part, _)| query.contains(part.as_str()))?;
    let answer = json!({
        "kind": "bigquery#job",
        "configuration": body["configuration"],
        "jobReference": {"projectId": "filament-demo", "location": "US"},
        "status": {"state": "DONE"},
        "statistics": {
            "totalBytesProcessed": bytes.to_string(),
            "query": {"totalBytesProcessed": bytes.to_string(), "totalBytesBilled": "0", "cacheHit": false},
        },
    });
    Some(axum::Json(answer).into_response())
}

impl RestProxy {
    /// The SQL of every dry run (`jobs.insert` with `configuration.dryRun`) seen.
    pub fn dry_runs(&self) -> Vec<String> {
        let state = self.state.lock().unwrap();
        state
            .requests
            .iter()
            .filter(|r| r.method == "POST" && r.path.ends_with("/jobs") && is_dry_run(&r.body))
            .filter_map(|r| r.body["configuration"]["query"]["query"].as_str().map(str::to_string))
            .collect()
    }
}
