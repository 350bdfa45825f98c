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

/// An admin request: extracting it checks the admin key, so a handler that
/// takes one runs for the admin only.
pub struct Admin;

impl axum::extract::FromRequestParts<Arc<AppState>> for Admin {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &Arc<AppState>,
    ) -> Result<Self, ApiError> {
        authorize(state, &parts.headers).map(|()| Admin)
    }
}

/// Checks the bearer key in constant time.
pub fn authorize(state: &AppState, headers: &HeaderMap) -> Result<(), ApiError> {
    let Some(key) = &state.config.admin_key else {
        return Err(ApiError::new(
            ErrorCode::NotFound,
            "the admin api is off: set RAGTIME__ADMIN_KEY to turn it on",
        ));
    };
    let sent = crate::tenant::bearer(headers).ok_or_else(|| {
        ApiError::new(
            ErrorCode::Unauthorized,
            "send the admin key as Authorization: Bearer <key>",
        )
    })?;
    if crate::tenant::same(sent.as_bytes(), key.0.as_bytes()) {
        Ok(())
    } else if sent.starts_with("rk_") {
        Err(ApiError::new(
            ErrorCode::Forbidden,
            "an api key cannot use the admin api",
        ))
    } else {
        Err(ApiError::new(ErrorCode::Forbidden, "wrong admin key"))
    }
}

/// `GET /admin/stats`: p50/p95/p99 per stage over the last five minutes,
/// next to the stage's current budget.
pub async fn stats(
    State(state): State<Arc<AppState>>,
    _admin: Admin,
) -> Result<Json<Value>, ApiError> {
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
    let t = state.metrics.totals("/v1/chat/completions", 200);
    let overrun_rate: serde_json::Map<String, Value> = t
        .runs
        .iter()
        .map(|(stage, runs)| {
            let over = t.overruns.get(stage).copied().unwrap_or(0);
            (stage.clone(), json!(over as f64 / (*runs).max(1) as f64))
        })
        .collect();
    Ok(Json(json!({
        "window_s": 300,
        "total_ms": budgets.total_ms,
        "stages": stages,
        "rates": {
            "requests": t.requests,
            "partial_rate": if t.requests > 0 { Some(t.partial as f64 / t.requests as f64) } else { None },
            "overrun_rate": overrun_rate,
        },
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
    _admin: Admin,
) -> Result<Json<Value>, ApiError> {
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
    _admin: Admin,
    ApiJson(body): ApiJson<Value>,
) -> Result<Json<Value>, ApiError> {
    let p = apply(state.budgets(), &body, true)?;
    save(&state, p, "replaced").await
}

/// `PATCH /admin/budgets`: changes the budgets named.
pub async fn patch_budgets(
    State(state): State<Arc<AppState>>,
    _admin: Admin,
    ApiJson(body): ApiJson<Value>,
) -> Result<Json<Value>, ApiError> {
    let p = apply(state.budgets(), &body, false)?;
    save(&state, p, "changed").await
}

/// `GET /admin/budgets/history`: every version, newest first.
pub async fn budget_history(
    State(state): State<Arc<AppState>>,
    _admin: Admin,
) -> Result<Json<Value>, ApiError> {
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
    _admin: Admin,
    ApiJson(body): ApiJson<RollbackIn>,
) -> Result<Json<Value>, ApiError> {
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

/// Headroom over the observed p95 a proposed budget gets (and at least
/// 2 ms more).
const HEADROOM: f64 = 1.1;

/// `GET /admin/budgets/advice?total_ms=…`: stage budgets for a target total
/// from the live p95 of each stage, the stage that binds, the partial-answer
/// rate to expect, and the LLM concurrency the arrival rate needs (Little's
/// law: in flight = arrival rate × time in the LLM).
pub async fn budget_advice(
    State(state): State<Arc<AppState>>,
    _admin: Admin,
    axum::extract::Query(query): axum::extract::Query<std::collections::HashMap<String, String>>,
) -> Result<Json<Value>, ApiError> {
    if let Some(other) = query.keys().find(|k| *k != "total_ms") {
        return Err(ApiError::invalid(
            other.clone(),
            "unknown parameter (expected total_ms)",
        ));
    }
    let current = state.budgets();
    let target = match query.get("total_ms") {
        None => current.total_ms,
        Some(v) => v
            .parse::<u64>()
            .map_err(|_| ApiError::invalid("total_ms", "must be a whole number of milliseconds"))?,
    };
    if target == 0 || target > 3_600_000 {
        return Err(ApiError::invalid(
            "total_ms",
            "must be between 1 and 3600000",
        ));
    }
    // What each stage needs: its p95 with headroom, or (no samples yet)
    // its current budget.
    let mut basis = serde_json::Map::new();
    let mut need: Vec<(Stage, f64, Vec<f64>)> = Vec::new();
    for s in Stage::ALL {
        let (mut v, _) = state.metrics.samples(s.name());
        v.sort_by(f64::total_cmp);
        let p95 = (!v.is_empty()).then(|| v[((0.95 * (v.len() - 1) as f64).round()) as usize]);
        let want = match p95 {
            // Reports count whole milliseconds: at least 2 ms of headroom.
            Some(p) => (p * HEADROOM).max(p + 2.0).ceil(),
            None => current.stage_ms(s) as f64,
        };
        basis.insert(
            s.name().to_owned(),
            json!({"samples": v.len(), "p95_ms": p95, "needs_ms": want, "from": if p95.is_some() { "p95" } else { "current budget" }}),
        );
        need.push((s, want, v));
    }
    let total_need: f64 = need.iter().map(|(_, w, _)| w).sum();
    let fits = total_need <= target as f64;
    // Fit: spare time goes to generation (longer answers); a shortfall
    // shrinks every stage in proportion.
    let scale = if fits {
        1.0
    } else {
        target as f64 / total_need.max(1.0)
    };
    let mut proposed = current;
    proposed.total_ms = target;
    for (s, want, _) in &need {
        proposed.set_stage_ms(*s, (want * scale).floor() as u64);
    }
    if fits {
        let spare = target.saturating_sub(proposed.stages_sum_ms());
        proposed.set_stage_ms(
            Stage::LlmGenerate,
            proposed.stage_ms(Stage::LlmGenerate) + spare,
        );
    }
    // The binding stage: the one that needs the most time.
    let binding = need
        .iter()
        .max_by(|a, b| a.1.total_cmp(&b.1))
        .map_or("llm_generate", |(s, _, _)| s.name());
    // Expected partial answers: a request is partial when any stage runs
    // past its budget; per stage, the share of recent samples that would.
    let mut on_time = 1.0;
    for (s, _, v) in &need {
        if v.is_empty() {
            continue;
        }
        let b = proposed.stage_ms(*s) as f64;
        let over = v.iter().filter(|ms| **ms > b).count() as f64 / v.len() as f64;
        on_time *= 1.0 - over;
    }
    // Little's law on the LLM: one llm_ttft sample per LLM request.
    let (ttft, span_s) = state.metrics.samples(Stage::LlmTtft.name());
    let (generate, _) = state.metrics.samples(Stage::LlmGenerate.name());
    let mean = |v: &[f64]| {
        if v.is_empty() {
            0.0
        } else {
            v.iter().sum::<f64>() / v.len() as f64
        }
    };
    let rate = if span_s > 0.0 {
        ttft.len() as f64 / span_s.max(1.0)
    } else {
        0.0
    };
    let in_llm_ms = mean(&ttft) + mean(&generate);
    let at_budget_ms = in_llm_ms.min((proposed.llm_ttft_ms + proposed.llm_generate_ms) as f64);
    Ok(Json(json!({
        "total_ms": target,
        "fits": fits,
        "needs_ms": total_need.ceil(),
        "proposed": budgets_doc(&proposed, 0)["stages"].clone(),
        "binding_stage": binding,
        "expected_partial_rate": 1.0 - on_time,
        "llm": {
            "arrival_rate_per_s": rate,
            "mean_time_in_llm_ms": in_llm_ms,
            "concurrency_needed": (rate * at_budget_ms / 1000.0).ceil(),
        },
        "basis": basis,
        "window_s": 300,
    })))
}

/// `GET /admin`: the admin page (plain HTML and a little JavaScript, no
/// external assets). It signs in with the admin key and uses the API above.
pub async fn page() -> axum::response::Html<&'static str> {
    axum::response::Html(include_str!("admin_page.html"))
}

#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeyIn {
    tenant: String,
    #[serde(default)]
    name: String,
}

fn key_doc(k: &ragtime_store::ApiKeyRecord) -> Value {
    json!({
        "id": k.id,
        "tenant": k.tenant,
        "name": k.name,
        "created_at_ms": k.created_ms,
        "revoked_at_ms": k.revoked_ms,
    })
}

/// `POST /admin/keys {"tenant", "name"?}`: a new API key for a tenant. The
/// key is in this response only; the store keeps a SHA-256 of its secret.
pub async fn create_key(
    State(state): State<Arc<AppState>>,
    _admin: Admin,
    ApiJson(body): ApiJson<KeyIn>,
) -> Result<(axum::http::StatusCode, Json<Value>), ApiError> {
    if !crate::tenant::valid_tenant(&body.tenant) {
        return Err(ApiError::invalid(
            "tenant",
            "must be 1 to 32 characters of lowercase letters, digits, '_' or '-'",
        ));
    }
    if body.name.len() > 200 {
        return Err(ApiError::invalid("name", "at most 200 characters"));
    }
    let id = uuid::Uuid::new_v4().simple().to_string()[..12].to_owned();
    let secret = format!(
        "{}{}",
        uuid::Uuid::new_v4().simple(),
        uuid::Uuid::new_v4().simple()
    );
    let rec = state
        .store
        .add_api_key(
            &id,
            &body.tenant,
            &body.name,
            &crate::tenant::hash_secret(&secret),
        )
        .await
        .map_err(ApiError::internal)?;
    // Every tenant has a `default` collection, as the default tenant does.
    let tenant = crate::tenant::Tenant(body.tenant.clone());
    state
        .store
        .ensure_collection(&tenant.collection("default"))
        .await
        .map_err(ApiError::internal)?;
    tracing::info!(id = %rec.id, tenant = %rec.tenant, "api key created");
    let mut doc = key_doc(&rec);
    doc["key"] = json!(format!("rk_{id}_{secret}"));
    Ok((axum::http::StatusCode::CREATED, Json(doc)))
}

/// `GET /admin/keys`: every key (never its secret).
pub async fn list_keys(
    State(state): State<Arc<AppState>>,
    _admin: Admin,
) -> Result<Json<Value>, ApiError> {
    let keys = state.store.api_keys().await.map_err(ApiError::internal)?;
    Ok(Json(
        json!({"keys": keys.iter().map(key_doc).collect::<Vec<_>>()}),
    ))
}

/// `DELETE /admin/keys/{id}`: revokes a key at once.
pub async fn revoke_key(
    State(state): State<Arc<AppState>>,
    _admin: Admin,
    axum::extract::Path(id): axum::extract::Path<String>,
) -> Result<Json<Value>, ApiError> {
    if state
        .store
        .revoke_api_key(&id)
        .await
        .map_err(ApiError::internal)?
    {
        tracing::info!(%id, "api key revoked");
        Ok(Json(json!({"id": id, "revoked": true})))
    } else {
        Err(ApiError::new(ErrorCode::NotFound, format!("no active api key {id:?}")).field("id"))
    }
}

fn tenant_path(tenant: &str) -> Result<(), ApiError> {
    if crate::tenant::valid_tenant(tenant) {
        Ok(())
    } else {
        Err(ApiError::invalid(
            "tenant",
            "must be 1 to 32 characters of lowercase letters, digits, '_' or '-'",
        ))
    }
}

/// `GET /admin/tenants/{tenant}/budgets`: the budgets the tenant's requests
/// start with, and whether they are its own.
pub async fn get_tenant_budgets(
    State(state): State<Arc<AppState>>,
    _admin: Admin,
    axum::extract::Path(tenant): axum::extract::Path<String>,
) -> Result<Json<Value>, ApiError> {
    tenant_path(&tenant)?;
    let own = state.tenant_overrides().contains_key(&tenant);
    let p = state.budgets_for(&tenant);
    let mut d = budgets_doc(&p, state.budgets_versioned().1);
    d["tenant"] = json!(tenant);
    d["override"] = json!(own);
    Ok(Json(d))
}

/// `PUT /admin/tenants/{tenant}/budgets`: the tenant's own profile: the
/// fields sent over the global budgets in force now (same validation as
/// `PATCH /admin/budgets`).
pub async fn put_tenant_budgets(
    State(state): State<Arc<AppState>>,
    _admin: Admin,
    axum::extract::Path(tenant): axum::extract::Path<String>,
    ApiJson(body): ApiJson<Value>,
) -> Result<Json<Value>, ApiError> {
    tenant_path(&tenant)?;
    let p = apply(state.budgets(), &body, false)?;
    let text = serde_json::to_string(&p).map_err(ApiError::internal)?;
    state
        .store
        .set_tenant_budgets(&tenant, &text)
        .await
        .map_err(ApiError::internal)?;
    state
        .sync_tenant_budgets()
        .await
        .map_err(ApiError::internal)?;
    tracing::info!(%tenant, "tenant budgets set through the admin api");
    let mut d = budgets_doc(&p, state.budgets_versioned().1);
    d["tenant"] = json!(tenant);
    d["override"] = json!(true);
    Ok(Json(d))
}

/// `DELETE /admin/tenants/{tenant}/budgets`: back to the global budgets.
pub async fn delete_tenant_budgets(
    State(state): State<Arc<AppState>>,
    _admin: Admin,
    axum::extract::Path(tenant): axum::extract::Path<String>,
) -> Result<Json<Value>, ApiError> {
    tenant_path(&tenant)?;
    if !state
        .store
        .delete_tenant_budgets(&tenant)
        .await
        .map_err(ApiError::internal)?
    {
        return Err(ApiError::new(
            ErrorCode::NotFound,
            format!("tenant {tenant:?} has no budgets of its own"),
        )
        .field("tenant"));
    }
    state
        .sync_tenant_budgets()
        .await
        .map_err(ApiError::internal)?;
    Ok(Json(json!({"tenant": tenant, "override": false})))
}

/// `POST /admin/experiments {"name", "share", "candidate": {"total_ms"?,
/// "stages"?}}`: sends `share` of requests to the candidate budgets (the
/// fields sent over the global budgets in force).
pub async fn start_experiment(
    State(state): State<Arc<AppState>>,
    _admin: Admin,
    ApiJson(body): ApiJson<Value>,
) -> Result<(axum::http::StatusCode, Json<Value>), ApiError> {
    let Some(obj) = body.as_object() else {
        return Err(ApiError::invalid("", "expected a JSON object"));
    };
    if let Some(k) = obj
        .keys()
        .find(|k| !matches!(k.as_str(), "name" | "share" | "candidate"))
    {
        return Err(ApiError::invalid(
            k.clone(),
            "unknown field (expected name, share, candidate)",
        ));
    }
    let name = obj
        .get("name")
        .and_then(Value::as_str)
        .filter(|n| !n.trim().is_empty() && n.len() <= 100)
        .ok_or_else(|| ApiError::invalid("name", "must be a name of 1 to 100 characters"))?;
    let share = obj
        .get("share")
        .and_then(Value::as_f64)
        .filter(|s| *s > 0.0 && *s <= 1.0)
        .ok_or_else(|| {
            ApiError::invalid("share", "must be a number greater than 0 and at most 1")
        })?;
    let cand = obj
        .get("candidate")
        .ok_or_else(|| ApiError::invalid("candidate", "missing field"))?;
    let candidate = apply(state.budgets(), cand, false).map_err(|mut e| {
        e.field = Some(match e.field.take() {
            Some(f) if !f.is_empty() => format!("candidate.{f}"),
            _ => "candidate".to_owned(),
        });
        e
    })?;
    let exp = Arc::new(crate::experiment::Experiment::new(
        name.to_owned(),
        share,
        candidate,
    ));
    {
        let mut slot = state
            .experiment
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(running) = slot.as_ref() {
            return Err(ApiError::invalid(
                "name",
                format!("experiment {:?} is running; stop it first", running.name),
            ));
        }
        *slot = Some(exp.clone());
    }
    tracing::info!(name, share, "budget experiment started");
    Ok((
        axum::http::StatusCode::CREATED,
        Json(json!({"running": exp.report(&state.budgets())})),
    ))
}

/// `GET /admin/experiments`: the running experiment, arm by arm.
pub async fn get_experiment(
    State(state): State<Arc<AppState>>,
    _admin: Admin,
) -> Result<Json<Value>, ApiError> {
    let exp = state
        .experiment
        .read()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone();
    Ok(Json(
        json!({"running": exp.map(|e| e.report(&state.budgets()))}),
    ))
}

/// `DELETE /admin/experiments`: stops it; answers its final figures.
pub async fn stop_experiment(
    State(state): State<Arc<AppState>>,
    _admin: Admin,
) -> Result<Json<Value>, ApiError> {
    let exp = state
        .experiment
        .write()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .take()
        .ok_or_else(|| ApiError::new(ErrorCode::NotFound, "no experiment is running"))?;
    tracing::info!(name = %exp.name, "budget experiment stopped");
    Ok(Json(json!({"stopped": exp.report(&state.budgets())})))
}
