//! One error type for the HTTP API, and the one table that maps its codes
//! to HTTP statuses. Bodies are `{"error": {"code", "message", "field"?}}`.

use axum::Json;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use ragtime_core::BudgetReport;
use ragtime_pipeline::PipelineError;
use serde::Serialize;

/// Declares [`ErrorCode`] from its table: one row per code — the variant,
/// its name in bodies, its HTTP status and what it means — so the name, the
/// status and the OpenAPI document's list cannot disagree.
macro_rules! error_codes {
    ($($variant:ident = $code:literal, $status:ident, $what:literal;)*) => {
        /// Machine-readable error codes.
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub enum ErrorCode {
            $(#[doc = $what] $variant,)*
        }

        impl ErrorCode {
            /// Every code, in the table's order.
            pub const ALL: &[ErrorCode] = &[$(ErrorCode::$variant),*];

            pub const fn as_str(self) -> &'static str {
                match self {
                    $(ErrorCode::$variant => $code,)*
                }
            }

            pub const fn status(self) -> StatusCode {
                match self {
                    $(ErrorCode::$variant => StatusCode::$status,)*
                }
            }

            /// What the code means (for the API's documentation).
            pub const fn description(self) -> &'static str {
                match self {
                    $(ErrorCode::$variant => $what,)*
                }
            }
        }
    };
}

error_codes! {
    InvalidJson = "invalid_json", BAD_REQUEST, "Malformed JSON";
    InvalidRequest = "invalid_request", UNPROCESSABLE_ENTITY,
        "A field, parameter or path segment is missing or invalid (`field` names it)";
    UnsupportedMediaType = "unsupported_media_type", UNSUPPORTED_MEDIA_TYPE, "Not a JSON body";
    PayloadTooLarge = "payload_too_large", PAYLOAD_TOO_LARGE, "The body is over the size limit";
    RequestTimeout = "request_timeout", REQUEST_TIMEOUT,
        "The body did not arrive within `server.body_timeout_ms`";
    NotFound = "not_found", NOT_FOUND, "No such collection, document or resource";
    MethodNotAllowed = "method_not_allowed", METHOD_NOT_ALLOWED, "Not a method of this route";
    Unauthorized = "unauthorized", UNAUTHORIZED, "No credentials, or not a valid key";
    Forbidden = "forbidden", FORBIDDEN, "Credentials that do not grant this";
    QuotaExceeded = "quota_exceeded", FORBIDDEN,
        "A write past one of the tenant's quotas (`limit` names it); nothing was written";
    Conflict = "conflict", CONFLICT, "The resource exists already";
    RateLimited = "rate_limited", TOO_MANY_REQUESTS,
        "Over the tenant's rate limit; see `Retry-After`";
    NotReady = "not_ready", SERVICE_UNAVAILABLE,
        "The service is starting or a dependency is down; see `Retry-After`";
    BudgetExceeded = "budget_exceeded", SERVICE_UNAVAILABLE,
        "The request's budget ran out before it could produce anything (`budget` says how)";
    Overloaded = "overloaded", SERVICE_UNAVAILABLE,
        "A queue the request needs is full (the message names it); see `Retry-After`";
    Internal = "internal", INTERNAL_SERVER_ERROR, "A fault of the service (logged)";
}

#[derive(Debug)]
pub struct ApiError {
    pub code: ErrorCode,
    pub message: String,
    pub field: Option<String>,
    /// Boxed: a `Result<_, ApiError>` stays small on the happy path.
    pub budget: Option<Box<BudgetReport>>,
    /// Seconds for `Retry-After`.
    pub retry_after: Option<u64>,
    /// The quota a `quota_exceeded` is about, and its value.
    pub limit: Option<(&'static str, i64)>,
}

impl ApiError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
            field: None,
            budget: None,
            retry_after: None,
            limit: None,
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
        self.budget = Some(Box::new(report));
        self
    }

    pub fn internal(e: impl std::fmt::Display) -> Self {
        tracing::error!(error = %e, "internal error");
        Self::new(ErrorCode::Internal, "internal error")
    }
}

impl From<PipelineError> for ApiError {
    fn from(e: PipelineError) -> Self {
        match e {
            PipelineError::UnknownCollection(name) => {
                ApiError::new(ErrorCode::NotFound, format!("unknown collection {name:?}"))
                    .field("collection")
            }
            PipelineError::Invalid { field, message } => ApiError::invalid(field, message),
            PipelineError::BudgetExceeded { message, report } => {
                ApiError::new(ErrorCode::BudgetExceeded, message).with_budget(*report)
            }
            PipelineError::Overloaded { retry_after } => ApiError::new(
                ErrorCode::Overloaded,
                "every llm backend is at its queue limit: try again shortly",
            )
            .retry_after(retry_after.as_secs_f64().ceil().max(1.0) as u64),
            PipelineError::Busy { what, retry_after } => ApiError::new(
                ErrorCode::Overloaded,
                format!("{what} is full: try again shortly"),
            )
            .retry_after(retry_after.as_secs().max(1)),
            PipelineError::QuotaExceeded { limit, value } => {
                let mut e = ApiError::new(
                    ErrorCode::QuotaExceeded,
                    format!(
                        "this would take the tenant past its limits.{limit} of {value}: nothing was written"
                    ),
                );
                e.limit = Some((limit, value));
                e
            }
            PipelineError::Internal(e) => ApiError::internal(e),
        }
    }
}

/// `{"error": {…}, "budget"?: {…}}`.
#[derive(Serialize, utoipa::ToSchema)]
pub struct ErrorBody<'a> {
    error: ErrorFields<'a>,
    /// With `budget_exceeded`: how the time was spent.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<BudgetReport>)]
    budget: Option<&'a BudgetReport>,
}

#[derive(Serialize, utoipa::ToSchema)]
struct ErrorFields<'a> {
    /// One of the error table's codes (the document lists them).
    code: &'static str,
    message: &'a str,
    /// The request field it is about, as a JSON path (`documents[2].text`).
    #[serde(skip_serializing_if = "Option::is_none")]
    field: Option<&'a str>,
    /// For `quota_exceeded`: the limit (`limits.max_documents`) and its value.
    #[serde(skip_serializing_if = "Option::is_none")]
    limit: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    value: Option<i64>,
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = ErrorBody {
            error: ErrorFields {
                code: self.code.as_str(),
                message: &self.message,
                field: self.field.as_deref(),
                limit: self.limit.map(|(l, _)| format!("limits.{l}")),
                value: self.limit.map(|(_, v)| v),
            },
            budget: self.budget.as_deref(),
        };
        let timing = self.budget.as_deref().map(BudgetReport::server_timing);
        let mut resp = (self.code.status(), Json(body)).into_response();
        if let Some(t) = timing.and_then(|t| HeaderValue::from_str(&t).ok()) {
            resp.headers_mut().insert("server-timing", t);
        }
        if matches!(
            self.code,
            ErrorCode::PayloadTooLarge | ErrorCode::RequestTimeout
        ) {
            // The rest of the body was never read, so this connection cannot
            // carry another request: say so, or a pooling client reuses it
            // and its next request fails with an incomplete message.
            resp.headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        if self.code == ErrorCode::Unauthorized {
            resp.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"ragtime admin\""),
            );
        }
        let retry = match (self.retry_after, self.code) {
            (Some(s), _) => Some(s),
            (
                None,
                ErrorCode::NotReady
                | ErrorCode::BudgetExceeded
                | ErrorCode::RateLimited
                | ErrorCode::Overloaded,
            ) => Some(1),
            _ => None,
        };
        if let Some(v) = retry.and_then(|s| HeaderValue::from_str(&s.to_string()).ok()) {
            resp.headers_mut().insert(header::RETRY_AFTER, v);
        }
        resp
    }
}
