//! One file per route resource; `/admin` one per admin resource.

mod admin;
mod chat;
pub mod collections;
mod documents;
mod embeddings;
mod health;
mod jobs;
mod metrics;
pub mod openapi;
mod search;

use crate::error::ApiError;
use crate::state::AppState;
use axum::Json;
use axum::Router;
use axum::http::HeaderValue;
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use ragtime_core::{BudgetReport, Filter};
use serde::Serialize;
use serde_json::Value;
use std::sync::Arc;

pub fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/healthz", get(health::healthz))
        .route("/readyz", get(health::readyz))
        .route("/metrics", get(metrics::metrics))
        .route("/openapi.json", get(openapi::document_json))
        .route("/docs", get(openapi::docs))
        .merge(v1())
        .merge(admin())
        .with_state(state)
}

/// The user's API.
fn v1() -> Router<Arc<AppState>> {
    Router::new()
        .route("/v1/embeddings", post(embeddings::create))
        .route(
            "/v1/documents",
            post(documents::create).get(documents::list),
        )
        // Ids may hold slashes (a folder's files are ingested as
        // `folder/file.md`): the rest of the path is the id.
        .route(
            "/v1/documents/{*id}",
            get(documents::get).delete(documents::delete),
        )
        .route(
            "/v1/collections",
            get(collections::list).post(collections::create),
        )
        .route(
            "/v1/collections/{name}",
            get(collections::get).delete(collections::delete),
        )
        .route("/v1/jobs", get(jobs::list))
        .route("/v1/jobs/{id}", get(jobs::get).delete(jobs::cancel))
        .route("/v1/search", post(search::search))
        .route("/v1/chat/completions", post(chat::completions))
        .route("/v1/models", get(chat::models))
}

/// The operators' API and page.
fn admin() -> Router<Arc<AppState>> {
    Router::new()
        .route("/admin", get(admin::page::page))
        .route("/admin/stats", get(admin::stats::stats))
        .route("/admin/collections", get(admin::collections::list))
        .route(
            "/admin/budgets",
            get(admin::budgets::get)
                .put(admin::budgets::put)
                .patch(admin::budgets::patch),
        )
        .route("/admin/budgets/history", get(admin::budgets::history))
        .route("/admin/budgets/rollback", post(admin::budgets::rollback))
        .route("/admin/budgets/advice", get(admin::budgets::advice))
        .route(
            "/admin/keys",
            get(admin::keys::list).post(admin::keys::create),
        )
        .route("/admin/keys/{id}", delete(admin::keys::revoke))
        .route(
            "/admin/tenants/{tenant}/budgets",
            get(admin::tenants::get)
                .put(admin::tenants::put)
                .delete(admin::tenants::delete),
        )
        .route(
            "/admin/tenants/{tenant}/priority",
            get(admin::tenants::get_priority)
                .put(admin::tenants::put_priority)
                .delete(admin::tenants::delete_priority),
        )
        .route(
            "/admin/tenants/{tenant}/quotas",
            get(admin::tenants::get_quotas)
                .put(admin::tenants::put_quotas)
                .delete(admin::tenants::delete_quotas),
        )
        .route(
            "/admin/experiments",
            get(admin::experiments::get)
                .post(admin::experiments::start)
                .delete(admin::experiments::stop),
        )
}

/// A JSON answer with a `Server-Timing` header from its budget report.
pub struct Timed<'a, T>(pub &'a BudgetReport, pub T);

impl<T: Serialize> IntoResponse for Timed<'_, T> {
    fn into_response(self) -> Response {
        let timing = self.0.server_timing();
        let mut resp = Json(self.1).into_response();
        if let Ok(v) = HeaderValue::from_str(&timing) {
            resp.headers_mut().insert("server-timing", v);
        }
        resp
    }
}

/// Collection names: 1–64 of `[A-Za-z0-9_.-]`.
pub fn check_collection(name: &str, field: &str) -> Result<(), ApiError> {
    if ragtime_core::valid_collection(name) {
        Ok(())
    } else {
        Err(ApiError::invalid(
            field,
            "must be 1 to 64 characters of letters, digits, '_', '-' or '.'",
        ))
    }
}

/// The longest budget a request may name: an hour (it only ever tightens
/// the configured total).
pub const MAX_BUDGET_MS: u64 = 3_600_000;

/// A request's own budget may tighten the total, never be zero.
pub fn check_budget_ms(budget_ms: Option<u64>) -> Result<(), ApiError> {
    match budget_ms {
        Some(0) => Err(ApiError::invalid("budget_ms", "must be at least 1")),
        Some(ms) if ms > MAX_BUDGET_MS => Err(ApiError::invalid(
            "budget_ms",
            format!("must be at most {MAX_BUDGET_MS}"),
        )),
        _ => Ok(()),
    }
}

/// A `filter` field, parsed, and its canonical text (for cache scopes).
pub fn parse_filter(v: Option<&Value>) -> Result<(Filter, String), ApiError> {
    match v {
        None => Ok((Filter::All, String::new())),
        Some(v) => Filter::parse(v, "filter")
            .map(|f| (f, v.to_string()))
            .map_err(|e| ApiError::invalid(e.path, e.message)),
    }
}

pub fn default_collection() -> String {
    "default".to_owned()
}
