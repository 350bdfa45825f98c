//! `GET`/`POST /v1/collections` and `GET`/`DELETE /v1/collections/{name}`:
//! a tenant's collections, with what they hold and their quotas.

use crate::auth::Caller;
use crate::error::{ApiError, ErrorCode};
use crate::extract::{ApiJson, ApiPath};
use crate::routes::check_collection;
use crate::state::AppState;
use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use ragtime_pipeline::corpus::{CollectionInfo, Quotas};
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use utoipa::ToSchema;

const MAX_DESCRIPTION: usize = 1000;

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CollectionIn {
    /// 1 to 64 of letters, digits, `_`, `-` and `.`.
    #[schema(pattern = "^[A-Za-z0-9_.-]{1,64}$")]
    name: String,
    /// At most 1,000 bytes, no control characters.
    #[serde(default)]
    #[schema(max_length = 1000, pattern = "^[^\\u0000-\\u001f\\u007f-\\u009f]*$")]
    description: String,
}

#[derive(Serialize, ToSchema)]
pub struct CollectionOut {
    name: String,
    description: String,
    documents: i64,
    chunks: i64,
    /// The memory its indexes hold now; `null` while they are not loaded
    /// (never searched since start, or dropped while idle).
    index_bytes: Option<usize>,
    /// The bytes of the files its indexes read in place (memory-mapped:
    /// the page cache holds what of them is read); `null` while not
    /// loaded.
    index_mapped_bytes: Option<usize>,
    /// Creation time (ms since the epoch; 0 for collections made before
    /// creation times were kept).
    created_ms: i64,
}

impl From<CollectionInfo> for CollectionOut {
    fn from(c: CollectionInfo) -> Self {
        Self {
            name: c.record.name,
            description: c.record.description,
            documents: c.record.documents,
            chunks: c.record.chunks,
            index_bytes: c.index_bytes.map(|b| b.resident),
            index_mapped_bytes: c.index_bytes.map(|b| b.mapped),
            created_ms: c.record.created_ms,
        }
    }
}

/// The tenant's quotas and what it uses of them.
#[derive(Serialize, ToSchema)]
pub struct QuotaOut {
    max_collections: i64,
    max_documents: i64,
    max_chunks: i64,
    collections: i64,
    documents: i64,
    chunks: i64,
}

#[derive(Serialize, ToSchema)]
pub struct CollectionsOut {
    collections: Vec<CollectionOut>,
    quota: QuotaOut,
}

#[derive(Serialize, ToSchema)]
pub struct DroppedOut {
    name: String,
    deleted: bool,
    documents: i64,
    chunks: i64,
    corpus_version: i64,
}

pub fn quota_out(q: Quotas, all: &[CollectionInfo]) -> QuotaOut {
    QuotaOut {
        max_collections: q.max_collections,
        max_documents: q.max_documents,
        max_chunks: q.max_chunks,
        collections: all.len() as i64,
        documents: all.iter().map(|c| c.record.documents).sum(),
        chunks: all.iter().map(|c| c.record.chunks).sum(),
    }
}

/// Your collections and your quota.
#[utoipa::path(get, path = "/v1/collections", tag = "collections",
    responses((status = 200, description = "The collections, with what they hold", body = CollectionsOut)))]
pub async fn list(
    State(state): State<Arc<AppState>>,
    Caller(tenant): Caller,
) -> Result<Json<CollectionsOut>, ApiError> {
    let p = state.pipeline()?;
    let all = p.collections(Some(&tenant)).await?;
    let quota = quota_out(p.quotas(&tenant).await?.0, &all);
    Ok(Json(CollectionsOut {
        collections: all.into_iter().map(CollectionOut::from).collect(),
        quota,
    }))
}

async fn one(
    state: &AppState,
    tenant: &ragtime_core::Tenant,
    name: &str,
) -> Result<CollectionOut, ApiError> {
    let one = state.pipeline()?.collection(tenant, name).await?;
    one.map(CollectionOut::from).ok_or_else(|| unknown(name))
}

fn unknown(name: &str) -> ApiError {
    ApiError::new(ErrorCode::NotFound, format!("unknown collection {name:?}")).field("name")
}

/// Create a collection: 201 with it; 409 if it exists; 403
/// `quota_exceeded` past your `max_collections`.
#[utoipa::path(post, path = "/v1/collections", tag = "collections", request_body = CollectionIn,
    responses((status = 201, description = "Created", body = CollectionOut),
        (status = 409, description = "It exists already", body = crate::error::ErrorBody)))]
pub async fn create(
    State(state): State<Arc<AppState>>,
    Caller(tenant): Caller,
    ApiJson(body): ApiJson<CollectionIn>,
) -> Result<(StatusCode, Json<CollectionOut>), ApiError> {
    check_collection(&body.name, "name")?;
    if body.description.len() > MAX_DESCRIPTION || body.description.chars().any(char::is_control) {
        let msg = format!("at most {MAX_DESCRIPTION} bytes without control characters");
        return Err(ApiError::invalid("description", msg));
    }
    let p = state.pipeline()?;
    if !p
        .create_collection(&tenant, &body.name, &body.description)
        .await?
    {
        let msg = format!("collection {:?} exists already", body.name);
        return Err(ApiError::new(ErrorCode::Conflict, msg).field("name"));
    }
    tracing::info!(tenant = tenant.name(), collection = %body.name, "collection created");
    Ok((
        StatusCode::CREATED,
        Json(one(&state, &tenant, &body.name).await?),
    ))
}

/// One collection.
#[utoipa::path(get, path = "/v1/collections/{name}", tag = "collections",
    params(("name" = String, Path, description = "The collection's name")),
    responses((status = 200, description = "The collection", body = CollectionOut)))]
pub async fn get(
    State(state): State<Arc<AppState>>,
    Caller(tenant): Caller,
    ApiPath(name): ApiPath<String>,
) -> Result<Json<CollectionOut>, ApiError> {
    check_collection(&name, "name")?;
    Ok(Json(one(&state, &tenant, &name).await?))
}

/// Delete a collection: its documents, chunks, indexes and cached
/// answers, in one durable write.
#[utoipa::path(delete, path = "/v1/collections/{name}", tag = "collections",
    params(("name" = String, Path, description = "The collection's name")),
    responses((status = 200, description = "Deleted", body = DroppedOut)))]
pub async fn delete(
    State(state): State<Arc<AppState>>,
    Caller(tenant): Caller,
    ApiPath(name): ApiPath<String>,
) -> Result<Json<DroppedOut>, ApiError> {
    check_collection(&name, "name")?;
    let d = state.pipeline()?.drop_collection(&tenant, &name).await;
    let d = d.map_err(|e| match e {
        ragtime_pipeline::PipelineError::UnknownCollection(_) => unknown(&name),
        other => other.into(),
    })?;
    tracing::info!(tenant = tenant.name(), collection = %name, documents = d.documents, "collection deleted");
    Ok(Json(DroppedOut {
        name,
        deleted: true,
        documents: d.documents,
        chunks: d.chunks,
        corpus_version: d.version,
    }))
}
