//! `/admin`: for whoever holds `RAGTIME__ADMIN_KEY` (sent as
//! `Authorization: Bearer …`). Without a configured key the admin API is
//! off and says so.

use crate::error::{ApiError, ErrorCode};
use crate::extract::ApiJson;
use crate::state::AppState;
use axum::Json;
use axum::extract::State;
use axum::http::HeaderMap;
use ragtime_core::Stage;
use ragtime_pipeline::BudgetProfile;
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

/// The budgets document: `{"total_ms", "stages": {…}, "version"}`.
fn budgets_doc(p: &BudgetProfile, version: i64) -> Value {
    let stages: serde_json::Map<String, Value> = Stage::ALL
        .iter()
        .map(|s| (s.name().to_owned(), json!(p.stage_ms(*s))))
        .collect();
    json!({"total_ms": p.total_ms, "stages": stages, "version": version})
}

/// `GET /admin/budgets`.
pub async fn get_budgets(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
) -> Result<Json<Value>, ApiError> {
    authorize(&state, &headers)?;
    let (p, v) = state.budgets_versioned();
    Ok(Json(budgets_doc(&p, v)))
}

/// Applies `{"total_ms"?, "stages"?: {name: ms}}` to `base`; with `full`,
/// every field must be there (PUT).
fn apply(base: BudgetProfile, body: &Value, full: bool) -> Result<BudgetProfile, ApiError> {
    let Some(obj) = body.as_object() else {
        return Err(ApiError::invalid("", "expected a JSON object"));
    };
    let mut p = base;
    for key in obj.keys() {
        if key != "total_ms" && key != "stages" {
            return Err(ApiError::invalid(
                key.clone(),
                "unknown field (expected total_ms or stages)",
            ));
        }
    }
    let ms = |v: &Value, field: &str| {
        v.as_u64().ok_or_else(|| {
            ApiError::invalid(field, "must be a whole number of milliseconds, 0 or more")
        })
    };
    match obj.get("total_ms") {
        Some(v) => p.total_ms = ms(v, "total_ms")?,
        None if full => return Err(ApiError::invalid("total_ms", "missing field")),
        None => {}
    }
    match obj.get("stages") {
        Some(Value::Object(stages)) => {
            for (name, v) in stages {
                let field = format!("stages.{name}");
                let stage = Stage::from_name(name).ok_or_else(|| {
                    ApiError::invalid(
                        field.clone(),
                        "unknown stage (cache, embed, retrieve, rerank, llm_ttft, llm_generate)",
                    )
                })?;
                p.set_stage_ms(stage, ms(v, &field)?);
            }
            if full
                && let Some(missing) = Stage::ALL.iter().find(|s| !stages.contains_key(s.name()))
            {
                return Err(ApiError::invalid(
                    format!("stages.{missing}"),
                    "missing stage (PUT replaces every budget; PATCH changes some)",
                ));
            }
        }
        Some(_) => {
            return Err(ApiError::invalid(
                "stages",
                "must be an object of stage budgets",
            ));
        }
        None if full => return Err(ApiError::invalid("stages", "missing field")),
        None => {}
    }
    p.validate().map_err(|e| {
        // Name what the request changed: a stage it did not touch that no
        // longer fits is the new total's fault.
        let stage = e.field.trim_end_matches("_ms");
        let touched = obj
            .get("stages")
            .and_then(Value::as_object)
            .is_some_and(|s| s.contains_key(stage));
        let field = if e.field == "total_ms" || (!touched && obj.contains_key("total_ms")) {
            "total_ms".to_owned()
        } else {
            format!("stages.{stage}")
        };
        ApiError::invalid(field, e.message)
    })?;
    Ok(p)
}

async fn save(state: &AppState, p: BudgetProfile, note: &str) -> Result<Json<Value>, ApiError> {
    let text = serde_json::to_string(&p).map_err(ApiError::internal)?;
    let v = state
        .store
        .add_budget_version(&text, "admin", note)
        .await
        .map_err(ApiError::internal)?;
    state.apply_budgets(p, v.version);
    tracing::info!(
        version = v.version,
        note,
        "budgets changed through the admin api"
    );
    Ok(Json(budgets_doc(&p, v.version)))
}

/// `PUT /admin/budgets`: replaces every budget.
pub async fn put_budgets(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    ApiJson(body): ApiJson<Value>,
) -> Result<Json<Value>, ApiError> {
    authorize(&state, &headers)?;
    let p = apply(state.budgets(), &body, true)?;
    save(&state, p, "replaced").await
}

/// `PATCH /admin/budgets`: changes the budgets named.
pub async fn patch_budgets(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    ApiJson(body): ApiJson<Value>,
) -> Result<Json<Value>, ApiError> {
    authorize(&state, &headers)?;
    let p = apply(state.budgets(), &body, false)?;
    save(&state, p, "changed").await
}

/// `GET /admin/budgets/history`: every version, newest first.
pub async fn budget_history(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
) -> Result<Json<Value>, ApiError> {
    authorize(&state, &headers)?;
    let versions = state
        .store
        .budget_history(1000)
        .await
        .map_err(ApiError::internal)?;
    let list: Vec<Value> = versions
        .iter()
        .map(|v| {
            let p: BudgetProfile = serde_json::from_str(&v.profile).unwrap_or_default();
            let mut d = budgets_doc(&p, v.version);
            d["changed_by"] = json!(v.changed_by);
            d["changed_at_ms"] = json!(v.changed_ms);
            d["note"] = json!(v.note);
            d
        })
        .collect();
    Ok(Json(json!({"versions": list})))
}

#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RollbackIn {
    version: i64,
}

/// `POST /admin/budgets/rollback {"version": n}`: puts version n's budgets
/// in force again, as a new version.
pub async fn rollback_budgets(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    ApiJson(body): ApiJson<RollbackIn>,
) -> Result<Json<Value>, ApiError> {
    authorize(&state, &headers)?;
    let old = state
        .store
        .budget_version(body.version)
        .await
        .map_err(ApiError::internal)?
        .ok_or_else(|| {
            ApiError::new(
                ErrorCode::NotFound,
                format!("no budget version {}", body.version),
            )
            .field("version")
        })?;
    let p: BudgetProfile = serde_json::from_str(&old.profile).map_err(ApiError::internal)?;
    save(&state, p, &format!("rollback to version {}", body.version)).await
}
