//! A tenant's own budgets (`GET`/`PUT`/`DELETE
//! /admin/tenants/{tenant}/budgets`) and its priority in the LLM queues
//! (`GET`/`PUT`/`DELETE /admin/tenants/{tenant}/priority`).

use crate::auth::Admin;
use crate::error::{ApiError, ErrorCode};
use crate::extract::{ApiJson, ApiPath};
use crate::routes::admin::keys::check_tenant;
use crate::state::AppState;
use axum::Json;
use axum::extract::State;
use ragtime_pipeline::budget::runtime::{BudgetPatch, BudgetsDoc};
use serde::{Deserialize, Serialize};
use std::sync::Arc;

#[derive(Serialize, utoipa::ToSchema)]
pub struct TenantBudgets {
    #[serde(flatten)]
    #[schema(value_type = Object)]
    budgets: BudgetsDoc,
    tenant: String,
    /// Whether these are the tenant's own (or the global ones).
    #[serde(rename = "override")]
    own: bool,
}

#[derive(Serialize, utoipa::ToSchema)]
pub struct Removed {
    tenant: String,
    #[serde(rename = "override")]
    own: bool,
}

fn doc(state: &AppState, tenant: String) -> TenantBudgets {
    let p = state.budgets.for_tenant(&tenant);
    TenantBudgets {
        budgets: BudgetsDoc::new(&p, Some(state.budgets.versioned().1)),
        own: state.budgets.has_own(&tenant),
        tenant,
    }
}

/// `GET`: the budgets the tenant's requests start with, and whether they
/// are its own.
#[utoipa::path(get, path = "/admin/tenants/{tenant}/budgets", tag = "admin", params(("tenant" = String, Path, description = "The tenant (1 to 32 of a-z, 0-9, _ and -)")),
    responses((status = 200, description = "The tenant's budgets", body = TenantBudgets)))]
pub async fn get(
    State(state): State<Arc<AppState>>,
    _: Admin,
    ApiPath(tenant): ApiPath<String>,
) -> Result<Json<TenantBudgets>, ApiError> {
    check_tenant(&tenant)?;
    Ok(Json(doc(&state, tenant)))
}

/// `PUT`: the tenant's own profile — the fields sent over the global
/// budgets in force now (validated as `PATCH /admin/budgets` is).
#[utoipa::path(put, path = "/admin/tenants/{tenant}/budgets", tag = "admin", params(("tenant" = String, Path, description = "The tenant (1 to 32 of a-z, 0-9, _ and -)")), request_body = Object,
    responses((status = 200, description = "The tenant's budgets", body = TenantBudgets)))]
pub async fn put(
    State(state): State<Arc<AppState>>,
    _: Admin,
    ApiPath(tenant): ApiPath<String>,
    ApiJson(body): ApiJson<BudgetPatch>,
) -> Result<Json<TenantBudgets>, ApiError> {
    check_tenant(&tenant)?;
    let p = body.apply(state.budgets.global())?;
    state
        .budgets
        .set_tenant(&tenant, Some(p))
        .await
        .map_err(ApiError::internal)?;
    tracing::info!(%tenant, "tenant budgets set through the admin api");
    Ok(Json(doc(&state, tenant)))
}

/// `DELETE`: back to the global budgets.
#[utoipa::path(delete, path = "/admin/tenants/{tenant}/budgets", tag = "admin", params(("tenant" = String, Path, description = "The tenant (1 to 32 of a-z, 0-9, _ and -)")),
    responses((status = 200, description = "Back to the global budgets", body = Removed)))]
pub async fn delete(
    State(state): State<Arc<AppState>>,
    _: Admin,
    ApiPath(tenant): ApiPath<String>,
) -> Result<Json<Removed>, ApiError> {
    check_tenant(&tenant)?;
    if !state
        .budgets
        .set_tenant(&tenant, None)
        .await
        .map_err(ApiError::internal)?
    {
        let msg = format!("tenant {tenant:?} has no budgets of its own");
        return Err(ApiError::new(ErrorCode::NotFound, msg).field("tenant"));
    }
    Ok(Json(Removed { tenant, own: false }))
}

/// `{"priority": 0–9}`: higher waits less for an LLM slot.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PriorityIn {
    priority: u8,
}

#[derive(Serialize, utoipa::ToSchema)]
pub struct Priority {
    tenant: String,
    priority: u8,
}

/// `GET`: the tenant's priority (0 unless set).
#[utoipa::path(get, path = "/admin/tenants/{tenant}/priority", tag = "admin", params(("tenant" = String, Path, description = "The tenant (1 to 32 of a-z, 0-9, _ and -)")),
    responses((status = 200, description = "The tenant's priority", body = Priority)))]
pub async fn get_priority(
    State(state): State<Arc<AppState>>,
    _: Admin,
    ApiPath(tenant): ApiPath<String>,
) -> Result<Json<Priority>, ApiError> {
    check_tenant(&tenant)?;
    let priority = state.budgets.priority(&tenant);
    Ok(Json(Priority { tenant, priority }))
}

/// `PUT {"priority": n}`: stored, followed by every replica.
#[utoipa::path(put, path = "/admin/tenants/{tenant}/priority", tag = "admin", params(("tenant" = String, Path, description = "The tenant (1 to 32 of a-z, 0-9, _ and -)")), request_body = PriorityIn,
    responses((status = 200, description = "The tenant's priority", body = Priority)))]
pub async fn put_priority(
    State(state): State<Arc<AppState>>,
    _: Admin,
    ApiPath(tenant): ApiPath<String>,
    ApiJson(body): ApiJson<PriorityIn>,
) -> Result<Json<Priority>, ApiError> {
    check_tenant(&tenant)?;
    if body.priority > 9 {
        return Err(ApiError::invalid("priority", "must be between 0 and 9"));
    }
    let set = state.budgets.set_priority(&tenant, Some(body.priority));
    set.await.map_err(ApiError::internal)?;
    tracing::info!(%tenant, priority = body.priority, "tenant priority set through the admin api");
    let priority = state.budgets.priority(&tenant);
    Ok(Json(Priority { tenant, priority }))
}

/// `DELETE`: back to priority 0.
#[utoipa::path(delete, path = "/admin/tenants/{tenant}/priority", tag = "admin", params(("tenant" = String, Path, description = "The tenant (1 to 32 of a-z, 0-9, _ and -)")),
    responses((status = 200, description = "Back to priority 0", body = Priority)))]
pub async fn delete_priority(
    State(state): State<Arc<AppState>>,
    _: Admin,
    ApiPath(tenant): ApiPath<String>,
) -> Result<Json<Priority>, ApiError> {
    check_tenant(&tenant)?;
    if !state
        .budgets
        .set_priority(&tenant, None)
        .await
        .map_err(ApiError::internal)?
    {
        let msg = format!("tenant {tenant:?} has no priority of its own");
        return Err(ApiError::new(ErrorCode::NotFound, msg).field("tenant"));
    }
    Ok(Json(Priority {
        tenant,
        priority: 0,
    }))
}

/// `PUT` body: the tenant's own quotas; a field left out takes the
/// configured default.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct QuotaIn {
    max_collections: Option<i64>,
    max_documents: Option<i64>,
    max_chunks: Option<i64>,
}

#[derive(Serialize, utoipa::ToSchema)]
pub struct TenantQuotas {
    tenant: String,
    /// Whether the tenant has quotas of its own.
    #[serde(rename = "override")]
    own: bool,
    #[serde(flatten)]
    quota: crate::routes::collections::QuotaOut,
}

async fn quotas_doc(state: &AppState, tenant: String) -> Result<TenantQuotas, ApiError> {
    let p = state.pipeline()?;
    let t = ragtime_core::Tenant(tenant.clone());
    let all = p.collections(Some(&t)).await?;
    let (q, own) = p.quotas(&t).await?;
    Ok(TenantQuotas {
        own,
        quota: crate::routes::collections::quota_out(q, &all),
        tenant,
    })
}

/// `GET`: the quotas the tenant writes under and what it uses.
#[utoipa::path(get, path = "/admin/tenants/{tenant}/quotas", tag = "admin", params(("tenant" = String, Path, description = "The tenant (1 to 32 of a-z, 0-9, _ and -)")),
    responses((status = 200, description = "The tenant's quotas and usage", body = TenantQuotas)))]
pub async fn get_quotas(
    State(state): State<Arc<AppState>>,
    _: Admin,
    ApiPath(tenant): ApiPath<String>,
) -> Result<Json<TenantQuotas>, ApiError> {
    check_tenant(&tenant)?;
    Ok(Json(quotas_doc(&state, tenant).await?))
}

/// `PUT {"max_collections"?, "max_documents"?, "max_chunks"?}`: stored,
/// read by every replica at the tenant's next write. Usage already past a
/// new limit stays; only writes that add are refused.
#[utoipa::path(put, path = "/admin/tenants/{tenant}/quotas", tag = "admin", params(("tenant" = String, Path, description = "The tenant (1 to 32 of a-z, 0-9, _ and -)")), request_body = QuotaIn,
    responses((status = 200, description = "The tenant's quotas and usage", body = TenantQuotas)))]
pub async fn put_quotas(
    State(state): State<Arc<AppState>>,
    _: Admin,
    ApiPath(tenant): ApiPath<String>,
    ApiJson(body): ApiJson<QuotaIn>,
) -> Result<Json<TenantQuotas>, ApiError> {
    check_tenant(&tenant)?;
    for (field, v) in [
        ("max_collections", body.max_collections),
        ("max_documents", body.max_documents),
        ("max_chunks", body.max_chunks),
    ] {
        if v.is_some_and(|v| v < 0) {
            return Err(ApiError::invalid(field, "must be 0 or more"));
        }
    }
    let q = ragtime_store::TenantQuota {
        max_collections: body.max_collections,
        max_documents: body.max_documents,
        max_chunks: body.max_chunks,
    };
    let set = state.store.set_tenant_quota(&tenant, Some(q)).await;
    set.map_err(ApiError::internal)?;
    tracing::info!(%tenant, ?q, "tenant quotas set through the admin api");
    Ok(Json(quotas_doc(&state, tenant).await?))
}

/// `DELETE`: back to the configured quotas.
#[utoipa::path(delete, path = "/admin/tenants/{tenant}/quotas", tag = "admin", params(("tenant" = String, Path, description = "The tenant (1 to 32 of a-z, 0-9, _ and -)")),
    responses((status = 200, description = "Back to the configured quotas", body = TenantQuotas)))]
pub async fn delete_quotas(
    State(state): State<Arc<AppState>>,
    _: Admin,
    ApiPath(tenant): ApiPath<String>,
) -> Result<Json<TenantQuotas>, ApiError> {
    check_tenant(&tenant)?;
    let removed = state.store.set_tenant_quota(&tenant, None).await;
    if !removed.map_err(ApiError::internal)? {
        let msg = format!("tenant {tenant:?} has no quotas of its own");
        return Err(ApiError::new(ErrorCode::NotFound, msg).field("tenant"));
    }
    Ok(Json(quotas_doc(&state, tenant).await?))
}
