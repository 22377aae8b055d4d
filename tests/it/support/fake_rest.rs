//! A scriptable fake of BigQuery's REST API that answers chosen routes with BigQuery's real
//! error shapes (HTTP status, `error.errors[].reason`, `error.details[]` with `ErrorInfo`), and
//! forwards nothing: tests point `BIGQUERY_EMULATOR_HOST` at it.

use std::sync::{Arc, Mutex};

use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

/// One scripted answer: requests whose method and path contain these parts get it.
#[derive(Clone, Debug)]
pub struct RestAnswer {
    pub method: &'static str,
    pub path_contains: &'static str,
    pub status: u16,
    pub body: Value,
}

#[derive(Clone)]
pub struct FakeRest {
    pub address: String,
    answers: Arc<Mutex<Vec<RestAnswer>>>,
    /// Every request seen: (method, path).
    seen: Arc<Mutex<Vec<(String, String)>>>,
}

type FakeState = (Arc<Mutex<Vec<RestAnswer>>>, Arc<Mutex<Vec<(String, String)>>>);

/// BigQuery's error body.
pub fn bigquery_error(status: u16, status_name: &str, message: &str, reason: &str, details: Vec<Value>) -> Value {
    json!({"error": {
        "code": status,
        "message": message,
        "errors": [{"message": message, "domain": "global", "reason": reason}],
        "status": status_name,
        "details": details,
    }})
}

pub fn service_disabled_info(service: &str) -> Value {
    json!({
        "@type": "type.googleapis.com/google.rpc.ErrorInfo",
        "reason": "SERVICE_DISABLED",
        "domain": "googleapis.com",
        "metadata": {"service": service, "consumer": "projects/123456"},
    })
}

impl FakeRest {
    pub async fn start(answers: Vec<RestAnswer>) -> Self {
        let answers = Arc::new(Mutex::new(answers));
        let seen = Arc::default();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap().to_string();
        let app = axum::Router::new().fallback(answer).with_state((Arc::clone(&answers), Arc::clone(&seen)));
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        Self { address, answers, seen }
    }

    /// How many requests with this method and a path containing `path_part` arrived.
    pub fn hits(&self, method: &str, path_part: &str) -> usize {
        self.seen.lock().unwrap().iter().filter(|(m, p)| m == method && p.contains(path_part)).count()
    }

    pub fn push(&self, answer: RestAnswer) {
        self.answers.lock().unwrap().push(answer);
    }
}

async fn answer(State((answers, seen)): State<FakeState>, request: Request) -> Response {
    let method = request.method().as_str().to_string();
    let path = request.uri().path().to_string();
    seen.lock().unwrap().push((method.clone(), path.clone()));
    let found = answers.lock().unwrap().iter().find(|a| a.method == method && path.contains(a.path_contains)).cloned();
    match found {
        Some(a) => (StatusCode::from_u16(a.status).unwrap(), axum::Json(a.body)).into_response(),
        None => (
            StatusCode::NOT_FOUND,
            axum::Json(bigquery_error(
                404,
                "NOT_FOUND",
                &format!("fake: no answer for {method} {path}"),
                "notFound",
                vec![],
            )),
        )
            .into_response(),
    }
}
