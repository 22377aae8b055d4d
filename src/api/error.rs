//! The one place where problems become HTTP: `application/problem+json` with the code's status,
//! plus extractors whose rejections are problems too (so malformed JSON, paths and queries get
//! the same stable shape as everything else).

use axum::extract::rejection::{BytesRejection, FailedToBufferBody, PathRejection, QueryRejection};
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use serde::de::DeserializeOwned;

use crate::http::body_deadline::BodyTimedOut;

use crate::error::{ErrorCode, Problem};

pub(crate) const PROBLEM_CONTENT_TYPE: &str = "application/problem+json";

impl IntoResponse for Problem {
    fn into_response(self) -> Response {
        let status = self.code.status();
        if let Some(cause) = self.cause.as_deref().filter(|_| status.is_server_error()) {
            tracing::error!(code = %self.code, detail = %self.detail, cause, "request failed inside the gateway");
        }
        let mut body = serde_json::json!({
            "type": format!("urn:filament:problem:{}", self.code.as_str()),
            "title": self.code.title(),
            "status": status.as_u16(),
            "detail": self.detail,
            "code": self.code.as_str(),
        });
        if let Some(hint) = &self.hint {
            body["hint"] = serde_json::Value::String(hint.clone());
        }
        let mut response = (status, body.to_string()).into_response();
        let headers = response.headers_mut();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_CONTENT_TYPE));
        if let Some(seconds) = self.retry_after_secs {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        // A client too slow to send its body is not waited for again: the connection closes.
        if self.code == ErrorCode::BodyTimeout {
            headers.insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        response
    }
}

/// The problem+json body as documented in OpenAPI.
#[derive(Debug, serde::Serialize, utoipa::ToSchema)]
#[schema(as = Problem)]
pub(crate) struct ProblemDocument {
    /// URI naming the problem type.
    pub(crate) r#type: String,
    pub(crate) title: String,
    pub(crate) status: u16,
    pub(crate) detail: String,
    /// Stable error code (see the contract for the list).
    #[schema(example = "invalid_identifier")]
    pub(crate) code: String,
    /// How to fix it, when the gateway knows.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) hint: Option<String>,
}

/// The most a JSON request body may hold (axum's default body limit): 413 beyond.
pub(crate) const MAX_JSON_BODY_BYTES: usize = 2 * 1024 * 1024;

/// `Json` whose rejections are problems: `unsupported_media_type` without a JSON content type,
/// 413 `payload_too_large` beyond [`MAX_JSON_BODY_BYTES`], 408 `body_timeout` for a body too
/// slow to arrive, 422 `invalid_text` for a string holding U+0000 (Postgres stores no NUL, so
/// it would fail later as an internal error), and `invalid_request` for malformed JSON.
#[derive(Debug)]
pub(crate) struct ApiJson<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for ApiJson<T> {
    type Rejection = Problem;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let json_type = req.headers().get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).is_some_and(is_json);
        if !json_type {
            return Err(Problem::new(
                ErrorCode::UnsupportedMediaType,
                "send the body as Content-Type: application/json",
            ));
        }
        let bytes = Bytes::from_request(req, state).await.map_err(body_rejection)?;
        json_value(&bytes).map(ApiJson)
    }
}

/// [`ApiJson`] for a body a request may leave out: an empty body, with or without a content
/// type, is `None`; any other body is read as [`ApiJson`] reads it.
#[derive(Debug)]
pub(crate) struct OptionalApiJson<T>(pub Option<T>);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for OptionalApiJson<T> {
    type Rejection = Problem;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let json_type = req.headers().get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).is_some_and(is_json);
        let bytes = Bytes::from_request(req, state).await.map_err(body_rejection)?;
        if bytes.is_empty() {
            return Ok(OptionalApiJson(None));
        }
        if !json_type {
            return Err(Problem::new(
                ErrorCode::UnsupportedMediaType,
                "send the body as Content-Type: application/json, or send none",
            ));
        }
        json_value(&bytes).map(|value| OptionalApiJson(Some(value)))
    }
}

/// A JSON body's value, or the problem with it.
fn json_value<T: DeserializeOwned>(bytes: &Bytes) -> Result<T, Problem> {
    refuse_nul_characters(bytes)?;
    match axum::Json::<T>::from_bytes(bytes) {
        Ok(axum::Json(value)) => Ok(value),
        Err(rejection) => Err(Problem::invalid_request(rejection.body_text())),
    }
}

/// `application/json` or `application/*+json`, with any parameters (as axum's `Json` takes).
fn is_json(content_type: &str) -> bool {
    let essence = content_type.split(';').next().unwrap_or_default().trim().to_ascii_lowercase();
    essence == "application/json" || (essence.starts_with("application/") && essence.ends_with("+json"))
}

/// A JSON body that could not be read whole.
fn body_rejection(rejection: BytesRejection) -> Problem {
    let BytesRejection::FailedToBufferBody(failed) = &rejection else {
        return Problem::invalid_request(rejection.body_text());
    };
    if matches!(failed, FailedToBufferBody::LengthLimitError(_)) {
        return Problem::new(
            ErrorCode::PayloadTooLarge,
            format!("JSON request bodies take at most {MAX_JSON_BODY_BYTES} bytes"),
        );
    }
    match std::error::Error::source(failed).and_then(BodyTimedOut::in_chain) {
        Some(timed_out) => Problem::new(ErrorCode::BodyTimeout, timed_out.to_string()),
        None => Problem::invalid_request(rejection.body_text()),
    }
}

/// 422 `invalid_text` naming the first field (as a JSON path) whose name or value holds U+0000.
fn refuse_nul_characters(bytes: &[u8]) -> Result<(), Problem> {
    let escaped = bytes.windows(6).any(|w| w.eq_ignore_ascii_case(b"\\u0000"));
    if !escaped {
        return Ok(());
    }
    let Ok(value) = serde_json::from_slice::<serde_json::Value>(bytes) else { return Ok(()) };
    match nul_path(&value, "$") {
        Some(path) => Err(Problem::new(
            ErrorCode::InvalidText,
            format!("{path} holds the character U+0000, which the gateway cannot store"),
        )
        .with_hint("remove NUL characters from the text, or send binary data as an Arrow BYTES column")),
        None => Ok(()),
    }
}

fn nul_path(value: &serde_json::Value, path: &str) -> Option<String> {
    match value {
        serde_json::Value::String(text) if text.contains('\0') => Some(path.to_string()),
        serde_json::Value::Array(items) => {
            items.iter().enumerate().find_map(|(index, item)| nul_path(item, &format!("{path}[{index}]")))
        }
        serde_json::Value::Object(fields) => fields.iter().find_map(|(name, item)| {
            let shown: String = name.chars().map(|c| if c == '\0' { '\u{fffd}' } else { c }).take(64).collect();
            let at = format!("{path}.{shown}");
            if name.contains('\0') { Some(at) } else { nul_path(item, &at) }
        }),
        _ => None,
    }
}

/// `Path` whose rejections are `invalid_request` problems.
#[derive(Debug)]
pub(crate) struct ApiPath<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned + Send> FromRequestParts<S> for ApiPath<T> {
    type Rejection = Problem;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        axum::extract::Path::<T>::from_request_parts(parts, state)
            .await
            .map(|axum::extract::Path(value)| ApiPath(value))
            .map_err(|rejection: PathRejection| Problem::invalid_request(rejection.body_text()))
    }
}

/// `Query` whose rejections are `invalid_request` problems.
#[derive(Debug)]
pub(crate) struct ApiQuery<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequestParts<S> for ApiQuery<T> {
    type Rejection = Problem;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        axum::extract::Query::<T>::from_request_parts(parts, state)
            .await
            .map(|axum::extract::Query(value)| ApiQuery(value))
            .map_err(|rejection: QueryRejection| Problem::invalid_request(rejection.body_text()))
    }
}
