//! What every request leaves behind: its root span (continuing the caller's
//! trace when it sends `traceparent`), metrics, a `Server-Timing` header,
//! and one log line when it overran a budget.

use crate::state::AppState;
use axum::extract::{MatchedPath, Request, State};
use axum::http::HeaderValue;
use axum::middleware::Next;
use axum::response::Response;
use ragtime_core::BudgetReport;
use ragtime_telemetry::metrics::Metrics;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tracing::{Span, field};

/// The root span of a request, named `METHOD /route`.
pub fn request_span(req: &Request) -> Span {
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map_or("unmatched", MatchedPath::as_str);
    let header = |name: &str| req.headers().get(name).and_then(|v| v.to_str().ok());
    let span = tracing::info_span!(
        "request",
        otel.name = format!("{} {route}", req.method()),
        otel.kind = "server",
        http.request.method = %req.method(),
        http.route = route,
        url.path = %req.uri().path(),
        http.response.status_code = field::Empty,
        request_id = header("x-request-id").unwrap_or(""),
        tenant = "default",
        ragtime.partial = field::Empty,
        ragtime.partial_reason = field::Empty,
        ragtime.experiment_arm = field::Empty,
    );
    ragtime_telemetry::continue_trace(&span, header("traceparent"), header("tracestate"));
    span
}

/// Counts the request in flight, then records its status on the root span
/// and in the metrics, and makes sure it carries `Server-Timing`.
pub async fn observe(
    State(state): State<Arc<AppState>>,
    matched: Option<MatchedPath>,
    req: Request,
    next: Next,
) -> Response {
    let _in_flight = state.metrics.in_flight();
    let started = Instant::now();
    let route = matched.map_or_else(|| "unmatched".to_owned(), |m| m.as_str().to_owned());
    let mut resp = next.run(req).await;
    let status = resp.status().as_u16();
    Span::current().record("http.response.status_code", status);
    state.metrics.request(&route, status);
    if !resp.headers().contains_key("server-timing") {
        let total = format!("total;dur={}", started.elapsed().as_millis());
        if let Ok(v) = HeaderValue::from_str(&total) {
            resp.headers_mut().insert("server-timing", v);
        }
    }
    resp
}

/// Feeds a finished request's budget story into the metrics, and writes the
/// one log line an overrun deserves.
pub fn record_report(metrics: &Metrics, report: &BudgetReport) {
    record_stages(metrics, report);
    let mut overran = Vec::new();
    for s in &report.stages {
        if s.overran {
            overran.push(format!(
                "{} by {} ms ({} of {} ms, {})",
                s.stage,
                s.elapsed_ms.saturating_sub(s.budget_ms),
                s.elapsed_ms,
                s.budget_ms,
                s.outcome
            ));
        }
    }
    if let Some(first) = report.stages.iter().find(|s| s.overran) {
        tracing::warn!(
            stage = first.stage.name(),
            overrun_ms = first.elapsed_ms.saturating_sub(first.budget_ms),
            budget_ms = first.budget_ms,
            elapsed_ms = first.elapsed_ms,
            total_ms = report.total_ms,
            stages = %overran.join("; "),
            "request overran its budget"
        );
    }
}

/// Each stage's latency, outcome and overrun into `metrics`.
pub fn record_stages(metrics: &Metrics, report: &BudgetReport) {
    for s in &report.stages {
        metrics.stage(
            s.stage.name(),
            s.outcome.name(),
            Duration::from_millis(s.elapsed_ms),
            s.overran,
        );
    }
}

/// Marks the root span (the current span of a handler) partial or not.
pub fn record_partial(partial: bool, reason: Option<&str>) {
    let span = Span::current();
    span.record("ragtime.partial", partial);
    if let Some(r) = reason {
        span.record("ragtime.partial_reason", r);
    }
}
