//! One error type for the HTTP API, and the one table that maps its codes
//! to HTTP statuses. Bodies are `{"error": {"code", "message", "field"?}}`.

use axum::Json;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use ragtime_core::BudgetReport;
use serde_json::{Value, json};

/// Machine-readable error codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorCode {
    /// The body is not valid JSON.
    InvalidJson,
    /// A field is missing, has the wrong type or an invalid value.
    InvalidRequest,
    UnsupportedMediaType,
    PayloadTooLarge,
    NotFound,
    MethodNotAllowed,
    /// No credentials, or not in the expected form.
    Unauthorized,
    /// Credentials that do not grant this.
    Forbidden,
    /// Over a rate limit (429, with `Retry-After`).
    RateLimited,
    /// The service is starting (models loading) or a dependency is down.
    NotReady,
    /// The request's budget ran out before it could produce anything.
    BudgetExceeded,
    Internal,
}

impl ErrorCode {
    pub const fn as_str(self) -> &'static str {
        match self {
            ErrorCode::InvalidJson => "invalid_json",
            ErrorCode::InvalidRequest => "invalid_request",
            ErrorCode::UnsupportedMediaType => "unsupported_media_type",
            ErrorCode::PayloadTooLarge => "payload_too_large",
            ErrorCode::NotFound => "not_found",
            ErrorCode::MethodNotAllowed => "method_not_allowed",
            ErrorCode::Unauthorized => "unauthorized",
            ErrorCode::Forbidden => "forbidden",
            ErrorCode::RateLimited => "rate_limited",
            ErrorCode::NotReady => "not_ready",
            ErrorCode::BudgetExceeded => "budget_exceeded",
            ErrorCode::Internal => "internal",
        }
    }

    /// The table: error code → HTTP status.
    pub const fn status(self) -> StatusCode {
        match self {
            ErrorCode::InvalidJson => StatusCode::BAD_REQUEST,
            ErrorCode::InvalidRequest => StatusCode::UNPROCESSABLE_ENTITY,
            ErrorCode::UnsupportedMediaType => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            ErrorCode::PayloadTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            ErrorCode::NotFound => StatusCode::NOT_FOUND,
            ErrorCode::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            ErrorCode::Unauthorized => StatusCode::UNAUTHORIZED,
            ErrorCode::Forbidden => StatusCode::FORBIDDEN,
            ErrorCode::RateLimited => StatusCode::TOO_MANY_REQUESTS,
            ErrorCode::NotReady | ErrorCode::BudgetExceeded => StatusCode::SERVICE_UNAVAILABLE,
            ErrorCode::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }
}

#[derive(Debug)]
pub struct ApiError {
    pub code: ErrorCode,
    pub message: String,
    pub field: Option<String>,
    pub budget: Option<BudgetReport>,
    /// Seconds for `Retry-After`.
    pub retry_after: Option<u64>,
}

impl ApiError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
            field: None,
            budget: None,
            retry_after: None,
        }
    }

    /// An invalid value in `field` (a JSON path like `input[2]`).
    pub fn invalid(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            field: Some(field.into()),
            ..Self::new(ErrorCode::InvalidRequest, message)
        }
    }

    /// Names the request field the error is about.
    pub fn field(mut self, field: impl Into<String>) -> Self {
        self.field = Some(field.into());
        self
    }

    pub fn retry_after(mut self, seconds: u64) -> Self {
        self.retry_after = Some(seconds);
        self
    }

    pub fn with_budget(mut self, report: BudgetReport) -> Self {
        self.budget = Some(report);
        self
    }

    pub fn internal(e: impl std::fmt::Display) -> Self {
        tracing::error!(error = %e, "internal error");
        Self::new(ErrorCode::Internal, "internal error")
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut err = json!({"code": self.code.as_str(), "message": self.message});
        if let Some(f) = &self.field {
            err["field"] = Value::String(f.clone());
        }
        let mut body = json!({ "error": err });
        let timing = self.budget.as_ref().map(BudgetReport::server_timing);
        if let Some(b) = self.budget {
            body["budget"] = serde_json::to_value(b).unwrap_or(Value::Null);
        }
        let mut resp = (self.code.status(), Json(body)).into_response();
        if let Some(t) = timing.and_then(|t| HeaderValue::from_str(&t).ok()) {
            resp.headers_mut().insert("server-timing", t);
        }
        if self.code == ErrorCode::Unauthorized {
            resp.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"ragtime admin\""),
            );
        }
        let retry = match (self.retry_after, self.code) {
            (Some(s), _) => Some(s),
            (None, ErrorCode::NotReady | ErrorCode::BudgetExceeded | ErrorCode::RateLimited) => {
                Some(1)
            }
            _ => None,
        };
        if let Some(v) = retry.and_then(|s| HeaderValue::from_str(&s.to_string()).ok()) {
            resp.headers_mut().insert(header::RETRY_AFTER, v);
        }
        resp
    }
}
