//! `GET /metrics`: the OpenMetrics text exposition, with the budgets in
//! force (for dashboards that draw latency against them) and each LLM
//! backend's queue, busy slots and breaker, and what the loaded indexes
//! take, as of now.

use crate::state::AppState;
use axum::extract::State;
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use ragtime_core::Stage;
use std::sync::Arc;

/// Metrics in the OpenMetrics text format.
#[utoipa::path(get, path = "/metrics", tag = "health",
    responses((status = 200, description = "OpenMetrics text", content_type = "application/openmetrics-text", body = String)))]
pub async fn metrics(State(state): State<Arc<AppState>>, _probe: crate::auth::Probe) -> Response {
    let b = state.budgets.global();
    for s in Stage::ALL {
        state.metrics.set_budget(Some(s), b.stage_ms(s));
    }
    state.metrics.set_budget(None, b.total_ms);
    if let Some(p) = state.loaded() {
        let bytes = p.status().engine.bytes;
        state.metrics.set_index_bytes(bytes.resident, bytes.mapped);
    }
    for s in state.backends.status() {
        state
            .metrics
            .set_backend(&s.name, s.queued, s.busy, s.breaker.name());
    }
    let mut resp = state.metrics.render().into_response();
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(ragtime_telemetry::metrics::CONTENT_TYPE),
    );
    resp
}
