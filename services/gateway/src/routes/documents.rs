//! `POST /v1/documents` (JSON), `GET` and `DELETE /v1/documents/{id}`.
//! Every document is validated before anything is written; a 200 means
//! every listed document is committed to the store.

use crate::error::{ApiError, ErrorCode};
use crate::extract::ApiJson;
use crate::routes::{engine, rag_error};
use crate::state::AppState;
use crate::tenant::Tenant;
use axum::Json;
use axum::extract::{FromRequest, Multipart, Path, Query, Request, State};
use axum::http::header;
use ragtime_pipeline::rag::IngestDoc;
use ragtime_store::Upsert;
use serde::Deserialize;
use serde_json::{Map, Value, json};
use std::sync::Arc;

const MAX_DOCS: usize = 1000;
const MAX_ID: usize = 256;
const MAX_TEXT: usize = 2_000_000;

fn default_collection() -> String {
    "default".to_owned()
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DocumentIn {
    id: String,
    #[serde(default)]
    title: String,
    text: String,
    #[serde(default)]
    metadata: Map<String, Value>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IngestRequest {
    #[serde(default = "default_collection")]
    collection: String,
    documents: Vec<DocumentIn>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CollectionQuery {
    #[serde(default = "default_collection")]
    collection: String,
}

/// Collection names: 1–64 of `[A-Za-z0-9_.-]`.
pub fn check_collection(name: &str, field: &str) -> Result<(), ApiError> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'));
    if ok {
        Ok(())
    } else {
        Err(ApiError::invalid(
            field,
            "must be 1 to 64 characters of letters, digits, '_', '-' or '.'",
        ))
    }
}

fn check_metadata(meta: &Map<String, Value>, path: &str) -> Result<(), ApiError> {
    for (k, v) in meta {
        let p = format!("{path}.{k}");
        if k.is_empty() || k.starts_with('$') {
            return Err(ApiError::invalid(
                p,
                "metadata keys must be non-empty and not start with '$'",
            ));
        }
        match v {
            Value::Null => {
                return Err(ApiError::invalid(
                    p,
                    "null is not a metadata value; leave the key out",
                ));
            }
            Value::Array(items)
                if items
                    .iter()
                    .any(|x| x.is_object() || x.is_array() || x.is_null()) =>
            {
                return Err(ApiError::invalid(
                    p,
                    "arrays may hold only numbers, strings and booleans",
                ));
            }
            Value::Object(m) => check_metadata(m, &p)?,
            _ => {}
        }
    }
    Ok(())
}

/// Validates a document; `path` names it in errors (`documents[3]`).
pub fn validate_doc(d: &DocumentIn, path: &str) -> Result<(), ApiError> {
    if d.id.trim().is_empty() || d.id.len() > MAX_ID || d.id.chars().any(char::is_control) {
        return Err(ApiError::invalid(
            format!("{path}.id"),
            format!("must be 1 to {MAX_ID} bytes without control characters"),
        ));
    }
    if d.text.trim().is_empty() {
        return Err(ApiError::invalid(
            format!("{path}.text"),
            "must not be empty",
        ));
    }
    if d.text.len() > MAX_TEXT {
        return Err(ApiError::invalid(
            format!("{path}.text"),
            format!("longer than {MAX_TEXT} bytes"),
        ));
    }
    check_metadata(&d.metadata, &format!("{path}.metadata"))
}

pub fn status_name(u: Upsert) -> &'static str {
    match u {
        Upsert::Created => "created",
        Upsert::Replaced => "replaced",
        Upsert::Unchanged => "unchanged",
    }
}

pub async fn ingest_docs(
    state: &AppState,
    tenant: &Tenant,
    collection: &str,
    docs: Vec<DocumentIn>,
) -> Result<Json<Value>, ApiError> {
    let rag = engine(state)?;
    let docs: Vec<IngestDoc> = docs
        .into_iter()
        .map(|d| IngestDoc {
            id: d.id,
            title: d.title,
            text: d.text,
            metadata: d.metadata,
        })
        .collect();
    let results = rag
        .ingest(&tenant.collection(collection), docs)
        .await
        .map_err(|e| rag_error(e, collection))?;
    let version = rag
        .store
        .corpus_version()
        .await
        .map_err(ApiError::internal)?;
    Ok(Json(json!({
        "collection": collection,
        "documents": results
            .iter()
            .map(|r| json!({"id": r.id, "status": status_name(r.status), "chunks": r.chunks}))
            .collect::<Vec<_>>(),
        "corpus_version": version,
    })))
}

/// JSON documents, or files as `multipart/form-data`.
pub async fn create(
    State(state): State<Arc<AppState>>,
    tenant: Tenant,
    req: Request,
) -> Result<Json<Value>, ApiError> {
    let multipart = req
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|ct| ct.to_ascii_lowercase().starts_with("multipart/form-data"));
    if multipart {
        let form = Multipart::from_request(req, &state).await.map_err(|e| {
            ApiError::invalid("body", format!("bad multipart body: {}", e.body_text()))
        })?;
        return upload(&state, &tenant, form).await;
    }
    let ApiJson(req) = ApiJson::<IngestRequest>::from_request(req, &state).await?;
    check_collection(&req.collection, "collection")?;
    if req.documents.is_empty() {
        return Err(ApiError::invalid("documents", "must not be empty"));
    }
    if req.documents.len() > MAX_DOCS {
        return Err(ApiError::invalid(
            "documents",
            format!("at most {MAX_DOCS} documents per request"),
        ));
    }
    let mut seen = std::collections::HashSet::new();
    for (i, d) in req.documents.iter().enumerate() {
        validate_doc(d, &format!("documents[{i}]"))?;
        if !seen.insert(d.id.as_str()) {
            return Err(ApiError::invalid(
                format!("documents[{i}].id"),
                format!("duplicate id {:?} in this request", d.id),
            ));
        }
    }
    ingest_docs(&state, &tenant, &req.collection, req.documents).await
}

pub async fn get(
    State(state): State<Arc<AppState>>,
    tenant: Tenant,
    Path(id): Path<String>,
    Query(q): Query<CollectionQuery>,
) -> Result<Json<Value>, ApiError> {
    check_collection(&q.collection, "collection")?;
    let not_found = || {
        ApiError::new(
            ErrorCode::NotFound,
            format!("no document {id:?} in collection {:?}", q.collection),
        )
    };
    let Some(coll) = state
        .store
        .collection_id(&tenant.collection(&q.collection))
        .await
        .map_err(ApiError::internal)?
    else {
        return Err(ApiError::new(
            ErrorCode::NotFound,
            format!("unknown collection {:?}", q.collection),
        )
        .field("collection"));
    };
    let doc = state
        .store
        .get_document(coll, &id)
        .await
        .map_err(ApiError::internal)?
        .ok_or_else(not_found)?;
    let metadata: Value = serde_json::from_str(&doc.metadata).unwrap_or(Value::Object(Map::new()));
    Ok(Json(json!({
        "id": doc.external_id,
        "collection": q.collection,
        "title": doc.title,
        "metadata": metadata,
        "updated_ms": doc.updated_ms,
        "chunks": doc.chunks.iter().map(|c| json!({
            "chunk_id": c.id, "position": c.position, "tokens": c.tokens, "text": c.text,
        })).collect::<Vec<_>>(),
    })))
}

pub async fn delete(
    State(state): State<Arc<AppState>>,
    tenant: Tenant,
    Path(id): Path<String>,
    Query(q): Query<CollectionQuery>,
) -> Result<Json<Value>, ApiError> {
    check_collection(&q.collection, "collection")?;
    let rag = engine(&state)?;
    if rag
        .delete(&tenant.collection(&q.collection), &id)
        .await
        .map_err(|e| rag_error(e, &q.collection))?
    {
        Ok(Json(
            json!({"id": id, "collection": q.collection, "deleted": true}),
        ))
    } else {
        Err(ApiError::new(
            ErrorCode::NotFound,
            format!("no document {id:?} in collection {:?}", q.collection),
        ))
    }
}

/// Files uploaded as `multipart/form-data`: one or more `file` parts,
/// optional `collection` and `metadata` (a JSON object applied to every
/// document) text parts. Every file is read and validated before anything
/// is written.
async fn upload(
    state: &AppState,
    tenant: &Tenant,
    mut form: Multipart,
) -> Result<Json<Value>, ApiError> {
    let mut collection = default_collection();
    let mut extra = Map::new();
    let mut docs = Vec::new();
    let mut files = 0usize;
    while let Some(field) = form.next_field().await.map_err(|e| multipart_error(&e))? {
        let name = field.name().unwrap_or_default().to_owned();
        match name.as_str() {
            "collection" => collection = field.text().await.map_err(|e| multipart_error(&e))?,
            "metadata" => {
                let text = field.text().await.map_err(|e| multipart_error(&e))?;
                match serde_json::from_str(&text) {
                    Ok(Value::Object(m)) => extra = m,
                    _ => return Err(ApiError::invalid("metadata", "must be a JSON object")),
                }
            }
            "file" => {
                let path = format!("file[{files}]");
                files += 1;
                let filename = field
                    .file_name()
                    .map(str::to_owned)
                    .filter(|f| !f.is_empty())
                    .ok_or_else(|| {
                        ApiError::invalid(path.clone(), "a file part needs a filename")
                    })?;
                let bytes = field
                    .bytes()
                    .await
                    .map_err(|e| multipart_error(&e))?
                    .to_vec();
                let parsed = crate::files::docs_from_file(&filename, bytes)
                    .map_err(|e| ApiError::invalid(path.clone(), e))?;
                docs.extend(parsed.into_iter().map(|d| (path.clone(), d)));
            }
            other => {
                return Err(ApiError::invalid(
                    other,
                    "unknown form field; use file, collection or metadata",
                ));
            }
        }
    }
    check_collection(&collection, "collection")?;
    check_metadata(&extra, "metadata")?;
    if docs.is_empty() {
        return Err(ApiError::invalid("file", "no file was uploaded"));
    }
    if docs.len() > MAX_DOCS {
        return Err(ApiError::invalid(
            "file",
            format!("at most {MAX_DOCS} documents per request"),
        ));
    }
    let docs: Vec<DocumentIn> = docs
        .into_iter()
        .map(|(path, d)| {
            let mut metadata = d.metadata;
            metadata.extend(extra.clone());
            let doc = DocumentIn {
                id: d.id,
                title: d.title,
                text: d.text,
                metadata,
            };
            validate_doc(&doc, &path).map(|()| doc)
        })
        .collect::<Result<_, _>>()?;
    ingest_docs(state, tenant, &collection, docs).await
}

fn multipart_error(e: &axum::extract::multipart::MultipartError) -> ApiError {
    if e.status() == axum::http::StatusCode::PAYLOAD_TOO_LARGE {
        ApiError::new(ErrorCode::PayloadTooLarge, "request body is too large")
    } else {
        ApiError::invalid("body", format!("bad multipart body: {}", e.body_text()))
    }
}
