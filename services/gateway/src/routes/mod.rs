//! One file per route resource.

mod admin;
mod chat;
pub mod documents;
mod embeddings;
mod health;
mod metrics;
mod search;

use crate::error::{ApiError, ErrorCode};
use crate::state::AppState;
use axum::Json;
use axum::Router;
use axum::http::HeaderValue;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use ragtime_core::BudgetReport;
use ragtime_pipeline::rag::{Rag, RagError};
use std::sync::Arc;

pub fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/healthz", get(health::healthz))
        .route("/readyz", get(health::readyz))
        .route("/v1/embeddings", post(embeddings::create))
        .route("/v1/documents", post(documents::create))
        .route(
            "/v1/documents/{id}",
            get(documents::get).delete(documents::delete),
        )
        .route("/v1/search", post(search::search_route))
        .route("/v1/chat/completions", post(chat::completions))
        .route("/v1/models", get(chat::models))
        .route("/metrics", get(metrics::metrics))
        .route("/admin", get(admin::page))
        .route("/admin/stats", get(admin::stats))
        .route(
            "/admin/budgets",
            get(admin::get_budgets)
                .put(admin::put_budgets)
                .patch(admin::patch_budgets),
        )
        .route("/admin/budgets/history", get(admin::budget_history))
        .route("/admin/budgets/advice", get(admin::budget_advice))
        .route("/admin/keys", get(admin::list_keys).post(admin::create_key))
        .route(
            "/admin/experiments",
            get(admin::get_experiment)
                .post(admin::start_experiment)
                .delete(admin::stop_experiment),
        )
        .route(
            "/admin/tenants/{tenant}/budgets",
            get(admin::get_tenant_budgets)
                .put(admin::put_tenant_budgets)
                .delete(admin::delete_tenant_budgets),
        )
        .route("/admin/keys/{id}", axum::routing::delete(admin::revoke_key))
        .route("/admin/budgets/rollback", post(admin::rollback_budgets))
        .with_state(state)
}

/// The engine, or 503 while the models load and the indexes rebuild.
pub fn engine(state: &AppState) -> Result<Arc<Rag>, ApiError> {
    state
        .rag()
        .ok_or_else(|| ApiError::new(ErrorCode::NotReady, "the models are still loading"))
}

/// An engine error as the caller sees it (`collection`: the name the
/// caller used, not the stored one).
pub fn rag_error(e: RagError, collection: &str) -> ApiError {
    match e {
        RagError::UnknownCollection(_) => ApiError::new(
            ErrorCode::NotFound,
            format!("unknown collection {collection:?}"),
        )
        .field("collection"),
        other => ApiError::internal(other),
    }
}

/// A JSON response with a `Server-Timing` header from the budget report.
pub fn with_timing(report: &BudgetReport, body: serde_json::Value) -> Response {
    let mut resp = Json(body).into_response();
    if let Ok(v) = HeaderValue::from_str(&report.server_timing()) {
        resp.headers_mut().insert("server-timing", v);
    }
    resp
}
