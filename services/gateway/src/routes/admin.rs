//! `/admin`: for whoever holds `RAGTIME__ADMIN_KEY` (sent as
//! `Authorization: Bearer …`). Without a configured key the admin API is
//! off and says so.

use crate::error::{ApiError, ErrorCode};
use crate::state::AppState;
use axum::Json;
use axum::extract::State;
use axum::http::HeaderMap;
use ragtime_core::Stage;
use serde_json::{Value, json};
use std::sync::Arc;

/// Checks the bearer key in constant time.
pub fn authorize(state: &AppState, headers: &HeaderMap) -> Result<(), ApiError> {
    let Some(key) = &state.config.admin_key else {
        return Err(ApiError::new(
            ErrorCode::NotFound,
            "the admin api is off: set RAGTIME__ADMIN_KEY to turn it on",
        ));
    };
    let sent = headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .ok_or_else(|| {
            ApiError::new(
                ErrorCode::Unauthorized,
                "send the admin key as Authorization: Bearer <key>",
            )
        })?;
    let (a, b) = (sent.as_bytes(), key.0.as_bytes());
    let same = a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0;
    if same {
        Ok(())
    } else {
        Err(ApiError::new(ErrorCode::Forbidden, "wrong admin key"))
    }
}

/// `GET /admin/stats`: p50/p95/p99 per stage over the last five minutes,
/// next to the stage's current budget.
pub async fn stats(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
) -> Result<Json<Value>, ApiError> {
    authorize(&state, &headers)?;
    let budgets = state.budgets();
    let live = state.metrics.stage_stats();
    let stages: serde_json::Map<String, Value> = Stage::ALL
        .iter()
        .map(|s| {
            let l = live.get(s.name());
            (
                s.name().to_owned(),
                json!({
                    "budget_ms": budgets.stage_ms(*s),
                    "count": l.map_or(0, |l| l.count),
                    "p50_ms": l.map(|l| l.p50_ms),
                    "p95_ms": l.map(|l| l.p95_ms),
                    "p99_ms": l.map(|l| l.p99_ms),
                }),
            )
        })
        .collect();
    Ok(Json(json!({
        "window_s": 300,
        "total_ms": budgets.total_ms,
        "stages": stages,
    })))
}
