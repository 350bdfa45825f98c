//! API keys per tenant: `POST`/`GET /admin/keys`, `DELETE /admin/keys/{id}`.

use crate::auth::{Admin, hash_secret};
use crate::error::{ApiError, ErrorCode};
use crate::extract::{ApiJson, ApiPath};
use crate::state::AppState;
use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use ragtime_core::Tenant;
use ragtime_store::ApiKeyRecord;
use serde::{Deserialize, Serialize};
use std::sync::Arc;

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct KeyIn {
    tenant: String,
    #[serde(default)]
    name: String,
}

#[derive(Serialize, utoipa::ToSchema)]
pub struct KeyOut {
    id: String,
    tenant: String,
    name: String,
    created_at_ms: i64,
    revoked_at_ms: Option<i64>,
    /// The key itself: in the creating response only.
    #[serde(skip_serializing_if = "Option::is_none")]
    key: Option<String>,
}

impl From<ApiKeyRecord> for KeyOut {
    fn from(k: ApiKeyRecord) -> Self {
        Self {
            id: k.id,
            tenant: k.tenant,
            name: k.name,
            created_at_ms: k.created_ms,
            revoked_at_ms: k.revoked_ms,
            key: None,
        }
    }
}

#[derive(Serialize, utoipa::ToSchema)]
pub struct KeyList {
    keys: Vec<KeyOut>,
}

#[derive(Serialize, utoipa::ToSchema)]
pub struct Revoked {
    id: String,
    revoked: bool,
}

pub fn check_tenant(tenant: &str) -> Result<(), ApiError> {
    if ragtime_core::valid_tenant(tenant) {
        Ok(())
    } else {
        let msg = "must be 1 to 32 characters of lowercase letters, digits, '_' or '-'";
        Err(ApiError::invalid("tenant", msg))
    }
}

/// `POST /admin/keys {"tenant", "name"?}`: a new API key for a tenant. The
/// key is in this response only; the store keeps a SHA-256 of its secret.
#[utoipa::path(post, path = "/admin/keys", tag = "admin", request_body = KeyIn,
    responses((status = 201, description = "The key, shown this once", body = KeyOut)))]
pub async fn create(
    State(state): State<Arc<AppState>>,
    _: Admin,
    ApiJson(body): ApiJson<KeyIn>,
) -> Result<(StatusCode, Json<KeyOut>), ApiError> {
    check_tenant(&body.tenant)?;
    if body.name.len() > 200 {
        return Err(ApiError::invalid("name", "at most 200 characters"));
    }
    let id = uuid::Uuid::new_v4().simple().to_string()[..12].to_owned();
    let secret = format!(
        "{}{}",
        uuid::Uuid::new_v4().simple(),
        uuid::Uuid::new_v4().simple()
    );
    let store = &state.store;
    let rec = store
        .add_api_key(&id, &body.tenant, &body.name, &hash_secret(&secret))
        .await
        .map_err(ApiError::internal)?;
    // Every tenant has a `default` collection, as the default tenant does.
    let default = Tenant(body.tenant.clone()).collection("default");
    store
        .ensure_collection(&default)
        .await
        .map_err(ApiError::internal)?;
    tracing::info!(id = %rec.id, tenant = %rec.tenant, "api key created");
    let mut out = KeyOut::from(rec);
    out.key = Some(format!("rk_{id}_{secret}"));
    Ok((StatusCode::CREATED, Json(out)))
}

/// `GET /admin/keys`: every key (never its secret).
#[utoipa::path(get, path = "/admin/keys", tag = "admin",
    responses((status = 200, description = "The keys", body = KeyList)))]
pub async fn list(State(state): State<Arc<AppState>>, _: Admin) -> Result<Json<KeyList>, ApiError> {
    let keys = state.store.api_keys().await.map_err(ApiError::internal)?;
    Ok(Json(KeyList {
        keys: keys.into_iter().map(KeyOut::from).collect(),
    }))
}

/// `DELETE /admin/keys/{id}`: revokes a key at once.
#[utoipa::path(delete, path = "/admin/keys/{id}", tag = "admin",
    params(("id" = String, Path, description = "The key's id")),
    responses((status = 200, description = "Revoked", body = Revoked)))]
pub async fn revoke(
    State(state): State<Arc<AppState>>,
    _: Admin,
    ApiPath(id): ApiPath<String>,
) -> Result<Json<Revoked>, ApiError> {
    if !state
        .store
        .revoke_api_key(&id)
        .await
        .map_err(ApiError::internal)?
    {
        let msg = format!("no active api key {id:?}");
        return Err(ApiError::new(ErrorCode::NotFound, msg).field("id"));
    }
    state.keys.invalidate(&id);
    tracing::info!(%id, "api key revoked");
    Ok(Json(Revoked { id, revoked: true }))
}
