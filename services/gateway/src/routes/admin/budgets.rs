//! Stage budgets at runtime: `GET`/`PUT`/`PATCH /admin/budgets`, the
//! history with rollback, and advice for a target total.

use crate::auth::Admin;
use crate::error::{ApiError, ErrorCode};
use crate::extract::{ApiJson, ApiQuery};
use crate::state::AppState;
use axum::Json;
use axum::extract::State;
use ragtime_core::Stage;
use ragtime_pipeline::BudgetProfile;
use ragtime_pipeline::budget::advice::{Advice, advise};
use ragtime_pipeline::budget::runtime::{BudgetError, BudgetPatch, BudgetPut, BudgetsDoc};
use serde::{Deserialize, Serialize};
use std::sync::Arc;

impl From<BudgetError> for ApiError {
    fn from(e: BudgetError) -> Self {
        ApiError::invalid(e.field, e.message)
    }
}

async fn save(
    state: &AppState,
    p: BudgetProfile,
    note: &str,
) -> Result<Json<BudgetsDoc>, ApiError> {
    let version = state
        .budgets
        .save(p, note)
        .await
        .map_err(ApiError::internal)?;
    Ok(Json(BudgetsDoc::new(&p, Some(version))))
}

/// The budgets in force, with their version.
#[utoipa::path(get, path = "/admin/budgets", tag = "admin",
    responses((status = 200, description = "The budgets", body = Object)))]
pub async fn get(State(state): State<Arc<AppState>>, _: Admin) -> Json<BudgetsDoc> {
    let (p, v) = state.budgets.versioned();
    Json(BudgetsDoc::new(&p, Some(v)))
}

/// Replace every budget (`{"total_ms", "stages": {…}}`).
#[utoipa::path(put, path = "/admin/budgets", tag = "admin", request_body = Object,
    responses((status = 200, description = "The budgets now in force", body = Object)))]
pub async fn put(
    State(state): State<Arc<AppState>>,
    _: Admin,
    ApiJson(body): ApiJson<BudgetPut>,
) -> Result<Json<BudgetsDoc>, ApiError> {
    let p = BudgetPatch::from(body).apply(state.budgets.global())?;
    save(&state, p, "replaced").await
}

/// Change the budgets named.
#[utoipa::path(patch, path = "/admin/budgets", tag = "admin", request_body = Object,
    responses((status = 200, description = "The budgets now in force", body = Object)))]
pub async fn patch(
    State(state): State<Arc<AppState>>,
    _: Admin,
    ApiJson(body): ApiJson<BudgetPatch>,
) -> Result<Json<BudgetsDoc>, ApiError> {
    let p = body.apply(state.budgets.global())?;
    save(&state, p, "changed").await
}

#[derive(Serialize, utoipa::ToSchema)]
pub struct History {
    versions: Vec<VersionOut>,
}

#[derive(Serialize, utoipa::ToSchema)]
struct VersionOut {
    #[serde(flatten)]
    #[schema(value_type = Object)]
    budgets: BudgetsDoc,
    changed_by: String,
    changed_at_ms: i64,
    note: String,
}

/// Every version of the budgets, newest first.
#[utoipa::path(get, path = "/admin/budgets/history", tag = "admin",
    responses((status = 200, description = "The versions", body = History)))]
pub async fn history(
    State(state): State<Arc<AppState>>,
    _: Admin,
) -> Result<Json<History>, ApiError> {
    let versions = state
        .store
        .budget_history(1000)
        .await
        .map_err(ApiError::internal)?;
    let versions = versions
        .into_iter()
        .map(|v| {
            let p: BudgetProfile = serde_json::from_str(&v.profile).unwrap_or_default();
            VersionOut {
                budgets: BudgetsDoc::new(&p, Some(v.version)),
                changed_by: v.changed_by,
                changed_at_ms: v.changed_ms,
                note: v.note,
            }
        })
        .collect();
    Ok(Json(History { versions }))
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RollbackIn {
    version: i64,
}

/// Put a version's budgets in force again, as a new version.
#[utoipa::path(post, path = "/admin/budgets/rollback", tag = "admin", request_body = RollbackIn,
    responses((status = 200, description = "The budgets now in force", body = Object)))]
pub async fn rollback(
    State(state): State<Arc<AppState>>,
    _: Admin,
    ApiJson(body): ApiJson<RollbackIn>,
) -> Result<Json<BudgetsDoc>, ApiError> {
    let old = state
        .budgets
        .version(body.version)
        .await
        .map_err(ApiError::internal)?;
    let p = old.ok_or_else(|| {
        let msg = format!("no budget version {}", body.version);
        ApiError::new(ErrorCode::NotFound, msg).field("version")
    })?;
    save(&state, p, &format!("rollback to version {}", body.version)).await
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct AdviceQuery {
    /// The target total (ms, 1 to 3600000); the current total if left out.
    total_ms: Option<u64>,
}

/// Stage budgets for a target total from each stage's live p95.
#[utoipa::path(get, path = "/admin/budgets/advice", tag = "admin", params(AdviceQuery),
    responses((status = 200, description = "The advice", body = Object)))]
pub async fn advice(
    State(state): State<Arc<AppState>>,
    _: Admin,
    ApiQuery(q): ApiQuery<AdviceQuery>,
) -> Result<Json<Advice>, ApiError> {
    let current = state.budgets.global();
    let target = q.total_ms.unwrap_or(current.total_ms);
    if !(1..=3_600_000).contains(&target) {
        return Err(ApiError::invalid(
            "total_ms",
            "must be between 1 and 3600000",
        ));
    }
    let w = &state.metrics.window;
    let samples = Stage::ALL.iter().map(|s| (*s, w.samples(*s))).collect();
    // Stages this server does not run get no budget in the advice.
    let (rerank, cache) = (
        state.config.rerank.model_dir.is_some(),
        state.config.cache.enabled,
    );
    let runs = move |s: Stage| match s {
        Stage::Rerank => rerank,
        Stage::Cache => cache,
        _ => true,
    };
    Ok(Json(advise(
        &current,
        &samples,
        target,
        w.window().as_secs(),
        &runs,
    )))
}
