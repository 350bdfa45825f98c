//! Budget experiments: `POST`/`GET`/`DELETE /admin/experiments`.

use crate::auth::Admin;
use crate::error::{ApiError, ErrorCode};
use crate::extract::ApiJson;
use crate::state::AppState;
use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use ragtime_pipeline::budget::experiment::{Experiment, ExperimentReport};
use ragtime_pipeline::budget::runtime::BudgetPatch;
use serde::{Deserialize, Serialize};
use std::sync::Arc;

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ExperimentIn {
    name: String,
    share: f64,
    /// The candidate's budgets: the fields sent over the global ones.
    #[schema(value_type = Object)]
    candidate: BudgetPatch,
}

#[derive(Serialize, utoipa::ToSchema)]
pub struct Running {
    #[schema(value_type = Option<Object>)]
    running: Option<ExperimentReport>,
}

#[derive(Serialize, utoipa::ToSchema)]
pub struct Stopped {
    #[schema(value_type = Object)]
    stopped: ExperimentReport,
}

/// `POST {"name", "share", "candidate": {"total_ms"?, "stages"?}}`: sends
/// `share` of requests to the candidate budgets.
#[utoipa::path(post, path = "/admin/experiments", tag = "admin", request_body = ExperimentIn,
    responses((status = 201, description = "Started", body = Running)))]
pub async fn start(
    State(state): State<Arc<AppState>>,
    _: Admin,
    ApiJson(body): ApiJson<ExperimentIn>,
) -> Result<(StatusCode, Json<Running>), ApiError> {
    if body.name.trim().is_empty() || body.name.len() > 100 {
        return Err(ApiError::invalid(
            "name",
            "must be a name of 1 to 100 characters",
        ));
    }
    if !(body.share > 0.0 && body.share <= 1.0) {
        let msg = "must be a number greater than 0 and at most 1";
        return Err(ApiError::invalid("share", msg));
    }
    let budgets = &state.budgets;
    let candidate = body
        .candidate
        .apply(budgets.global())
        .map_err(|e| ApiError::invalid(format!("candidate.{}", e.field), e.message))?;
    let exp = Arc::new(Experiment::new(body.name, body.share, candidate));
    budgets.start_experiment(exp.clone()).map_err(|running| {
        let msg = format!("experiment {running:?} is running; stop it first");
        ApiError::invalid("name", msg)
    })?;
    tracing::info!(name = %exp.name, share = exp.share, "budget experiment started");
    let running = Some(exp.report(&budgets.global()));
    Ok((StatusCode::CREATED, Json(Running { running })))
}

/// `GET`: the running experiment, arm by arm.
#[utoipa::path(get, path = "/admin/experiments", tag = "admin",
    responses((status = 200, description = "The running experiment, if any", body = Running)))]
pub async fn get(State(state): State<Arc<AppState>>, _: Admin) -> Json<Running> {
    let b = &state.budgets;
    let running = b.experiment().map(|e| e.report(&b.global()));
    Json(Running { running })
}

/// `DELETE`: stops it; answers its final figures.
#[utoipa::path(delete, path = "/admin/experiments", tag = "admin",
    responses((status = 200, description = "Stopped, with its final figures", body = Stopped)))]
pub async fn stop(State(state): State<Arc<AppState>>, _: Admin) -> Result<Json<Stopped>, ApiError> {
    let b = &state.budgets;
    let exp = b
        .stop_experiment()
        .ok_or_else(|| ApiError::new(ErrorCode::NotFound, "no experiment is running"))?;
    tracing::info!(name = %exp.name, "budget experiment stopped");
    Ok(Json(Stopped {
        stopped: exp.report(&b.global()),
    }))
}
