//! The one place where problems become HTTP: `application/problem+json` with the code's status,
//! plus extractors whose rejections are problems too (so malformed JSON, paths and queries get
//! the same stable shape as everything else).

use axum::extract::rejection::{JsonRejection, PathRejection, QueryRejection};
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use serde::de::DeserializeOwned;

use crate::error::{ErrorCode, Problem};

pub(crate) const PROBLEM_CONTENT_TYPE: &str = "application/problem+json";

impl IntoResponse for Problem {
    fn into_response(self) -> Response {
        let status = self.code.status();
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

/// `Json` whose rejections are `invalid_request` (or `unsupported_media_type`) problems.
#[derive(Debug)]
pub(crate) struct ApiJson<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for ApiJson<T> {
    type Rejection = Problem;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        match axum::Json::<T>::from_request(req, state).await {
            Ok(axum::Json(value)) => Ok(ApiJson(value)),
            Err(JsonRejection::MissingJsonContentType(_)) => {
                Err(Problem::new(ErrorCode::UnsupportedMediaType, "send the body as Content-Type: application/json"))
            }
            Err(rejection) => Err(Problem::invalid_request(rejection.body_text())),
        }
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
