//! What every request leaves behind: its root span (continuing the caller's
//! trace when it sends `traceparent`), its status in the metrics, and a
//! `Server-Timing` header. (The budget story is recorded by the pipeline.)

use crate::state::AppState;
use axum::extract::{MatchedPath, Request, State};
use axum::http::HeaderValue;
use axum::middleware::Next;
use axum::response::Response;
use std::sync::Arc;
use std::time::Instant;
use tracing::{Span, field};

/// The root span of a request, named `METHOD /route`.
/// Routes that get no trace.
const UNTRACED: &[&str] = &["/healthz", "/readyz", "/metrics"];

pub fn request_span(req: &Request) -> Span {
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map_or("unmatched", MatchedPath::as_str);
    // Probes and scrapes are never traced: in a cluster they come every
    // few seconds from every replica and would bury the requests.
    if UNTRACED.contains(&route) {
        return Span::none();
    }
    let header = |name: &str| req.headers().get(name).and_then(|v| v.to_str().ok());
    let span = tracing::info_span!(
        "request",
        otel.name = format!("{} {route}", req.method()),
        otel.kind = "server",
        openinference.span.kind = "CHAIN",
        http.request.method = %req.method(),
        http.route = route,
        url.path = %req.uri().path(),
        http.response.status_code = field::Empty,
        request_id = header("x-request-id").unwrap_or(""),
        tenant = "default",
        ragtime.partial = field::Empty,
        ragtime.partial_reason = field::Empty,
        ragtime.experiment_arm = field::Empty,
        ragtime.load_level = field::Empty,
        llm.hedged = field::Empty,
        input.value = field::Empty,
        output.value = field::Empty,
    );
    ragtime_telemetry::continue_trace(&span, header("traceparent"), header("tracestate"));
    span
}

/// When the request arrived: its budget's clock starts there, before
/// authentication and lookups.
#[derive(Debug, Clone, Copy)]
pub struct Arrived(pub tokio::time::Instant);

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for Arrived {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        _: &S,
    ) -> Result<Self, Self::Rejection> {
        Ok(parts
            .extensions
            .get::<Arrived>()
            .copied()
            .unwrap_or(Arrived(tokio::time::Instant::now())))
    }
}

/// Stamps the request's arrival, counts it in flight, then records its
/// status on the root span and in the metrics, and makes sure it carries
/// `Server-Timing`.
pub async fn observe(
    State(state): State<Arc<AppState>>,
    matched: Option<MatchedPath>,
    mut req: Request,
    next: Next,
) -> Response {
    req.extensions_mut()
        .insert(Arrived(tokio::time::Instant::now()));
    let _in_flight = state.metrics.in_flight();
    let started = Instant::now();
    let route = matched.map_or_else(|| "unmatched".to_owned(), |m| m.as_str().to_owned());
    let mut resp = next.run(req).await;
    let status = resp.status().as_u16();
    // An int in OTLP (a u64 would be exported as text).
    Span::current().record("http.response.status_code", i64::from(status));
    state.metrics.request(&route, status);
    if !resp.headers().contains_key("server-timing") {
        let total = format!("total;dur={}", started.elapsed().as_millis());
        if let Ok(v) = HeaderValue::from_str(&total) {
            resp.headers_mut().insert("server-timing", v);
        }
    }
    resp
}
