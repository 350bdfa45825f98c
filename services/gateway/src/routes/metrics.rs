//! `GET /metrics`: Prometheus text exposition.

use crate::state::AppState;
use axum::extract::State;
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use ragtime_core::Stage;
use std::sync::Arc;

pub async fn metrics(State(state): State<Arc<AppState>>) -> Response {
    let mut text = state.metrics.render();
    // The budgets in force, for dashboards that draw latency against them.
    let b = state.budgets();
    text.push_str("# HELP ragtime_stage_budget_seconds The budget of each stage (and the total) for new requests.\n");
    text.push_str("# TYPE ragtime_stage_budget_seconds gauge\n");
    for s in Stage::ALL {
        text.push_str(&format!(
            "ragtime_stage_budget_seconds{{stage=\"{s}\"}} {}\n",
            b.stage_ms(s) as f64 / 1000.0
        ));
    }
    text.push_str(&format!(
        "ragtime_stage_budget_seconds{{stage=\"total\"}} {}\n",
        b.total_ms as f64 / 1000.0
    ));
    let mut resp = text.into_response();
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
    );
    resp
}
