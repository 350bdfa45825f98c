//! `GET /admin/collections`: every tenant's collections, what they hold
//! and the memory their indexes take, with a summary per tenant.

use crate::auth::Admin;
use crate::error::ApiError;
use crate::state::AppState;
use axum::Json;
use axum::extract::State;
use ragtime_core::Tenant;
use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::Arc;

#[derive(Serialize, utoipa::ToSchema)]
pub struct AdminCollection {
    tenant: String,
    name: String,
    documents: i64,
    chunks: i64,
    /// `null` while its indexes are not loaded.
    index_bytes: Option<usize>,
    /// Files its indexes read in place (memory-mapped); `null` while not
    /// loaded.
    index_mapped_bytes: Option<usize>,
}

#[derive(Serialize, Default, utoipa::ToSchema)]
pub struct TenantSummary {
    collections: usize,
    /// Collections whose indexes are in memory now.
    loaded: usize,
    documents: i64,
    chunks: i64,
    index_bytes: usize,
    index_mapped_bytes: usize,
}

#[derive(Serialize, utoipa::ToSchema)]
pub struct AdminCollections {
    tenants: BTreeMap<String, TenantSummary>,
    collections: Vec<AdminCollection>,
}

/// Every tenant's collections with their memory, and a summary per tenant.
#[utoipa::path(get, path = "/admin/collections", tag = "admin",
    responses((status = 200, description = "The collections", body = AdminCollections)))]
pub async fn list(
    State(state): State<Arc<AppState>>,
    _: Admin,
) -> Result<Json<AdminCollections>, ApiError> {
    let all = state.pipeline()?.collections(None).await?;
    let mut tenants: BTreeMap<String, TenantSummary> = BTreeMap::new();
    let mut collections = Vec::with_capacity(all.len());
    for c in all {
        let (tenant, name) = Tenant::of_collection(&c.record.name);
        let t = tenants.entry(tenant.0.clone()).or_default();
        t.collections += 1;
        t.loaded += usize::from(c.index_bytes.is_some());
        t.documents += c.record.documents;
        t.chunks += c.record.chunks;
        t.index_bytes += c.index_bytes.map_or(0, |b| b.resident);
        t.index_mapped_bytes += c.index_bytes.map_or(0, |b| b.mapped);
        collections.push(AdminCollection {
            name: name.to_owned(),
            tenant: tenant.0,
            documents: c.record.documents,
            chunks: c.record.chunks,
            index_bytes: c.index_bytes.map(|b| b.resident),
            index_mapped_bytes: c.index_bytes.map(|b| b.mapped),
        });
    }
    Ok(Json(AdminCollections {
        tenants,
        collections,
    }))
}
