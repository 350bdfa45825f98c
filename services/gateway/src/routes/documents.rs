//! `POST /v1/documents` (JSON, or files as `multipart/form-data`), `GET`
//! and `DELETE /v1/documents/{id}`. Every document is validated before
//! anything is written; a 200 means every listed document is committed.
//! A large ingest (over `limits.job_above_bytes` of text or 1,000
//! documents), or one that asks with `"async": true`, runs as a job: 202
//! with the job (`GET /v1/jobs/{id}` follows it).

use crate::auth::Caller;
use crate::error::{ApiError, ErrorCode};
use crate::extract::{ApiJson, ApiPath, ApiQuery};
use crate::routes::{check_collection, default_collection};
use crate::state::AppState;
use axum::Json;
use axum::extract::{FromRequest, Multipart, Request, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use ragtime_core::Tenant;
use ragtime_pipeline::IngestSlot;
use ragtime_pipeline::corpus::IngestDoc;
use ragtime_store::Upsert;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::sync::Arc;
use utoipa::{IntoParams, ToSchema};

/// Documents an ingest answered at once may hold; more run as a job.
const MAX_DOCS: usize = 1000;
/// Documents one request may hold.
const MAX_JOB_DOCS: usize = 100_000;
const MAX_ID: usize = 256;
const MAX_TEXT: usize = 2_000_000;

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DocumentIn {
    /// Your id for it (1 to 256 bytes, not only spaces, no control
    /// characters); ingesting it again replaces it.
    #[schema(
        min_length = 1,
        max_length = 256,
        pattern = "^[^\\u0000-\\u001f\\u007f-\\u009f]*[^\\s\\u0000-\\u001f\\u007f-\\u009f][^\\u0000-\\u001f\\u007f-\\u009f]*$"
    )]
    id: String,
    #[serde(default)]
    title: String,
    /// The text (not only spaces; at most 2,000,000 bytes).
    #[schema(min_length = 1, max_length = 2000000, pattern = "\\S")]
    text: String,
    /// Numbers, strings, booleans, arrays of those and nested objects;
    /// keys must not start with `$`.
    #[serde(default)]
    #[schema(value_type = Object)]
    metadata: Map<String, Value>,
    /// Where a parsed file's sections begin (never from JSON).
    #[serde(skip)]
    sections: Vec<ragtime_core::Section>,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct IngestIn {
    #[serde(default = "default_collection")]
    #[schema(pattern = "^[A-Za-z0-9_.-]{1,64}$")]
    collection: String,
    /// 1 to 100,000 documents, ids unique in the request (over 1,000
    /// run as a job).
    #[schema(min_items = 1, max_items = 100000)]
    documents: Vec<DocumentIn>,
    /// Run as a job: answer 202 with it at once (large ingests do anyway).
    #[serde(default, rename = "async")]
    run_async: bool,
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct CollectionQuery {
    /// The collection (`default` unless named).
    #[serde(default = "default_collection")]
    #[param(pattern = "^[A-Za-z0-9_.-]{1,64}$")]
    collection: String,
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ListQuery {
    /// The collection (`default` unless named).
    #[serde(default = "default_collection")]
    #[param(pattern = "^[A-Za-z0-9_.-]{1,64}$")]
    collection: String,
    /// Documents per page, 1 to 1,000 (default 100).
    #[serde(default = "default_page")]
    #[param(minimum = 1, maximum = 1000)]
    limit: usize,
    /// The previous page's `next`: the documents after this id.
    #[serde(default)]
    after: String,
}

fn default_page() -> usize {
    100
}

#[derive(Serialize, ToSchema)]
pub struct DocumentListOut {
    collection: String,
    documents: Vec<DocumentLineOut>,
    /// Pass as `after` for the next page; `null` on the last one.
    next: Option<String>,
}

#[derive(Serialize, ToSchema)]
struct DocumentLineOut {
    id: String,
    title: String,
    updated_ms: i64,
    chunks: i64,
}

#[derive(Serialize, ToSchema)]
pub struct IngestOut {
    collection: String,
    documents: Vec<IngestedOut>,
    corpus_version: i64,
    /// Uploaded files that gave no document: left out by `include` or
    /// `exclude`, a page that only redirects, a page that repeats the
    /// others (a print-all page).
    skipped: Vec<SkippedOut>,
}

/// An uploaded file that gave no document, and why.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct SkippedOut {
    /// Its form field (`file[3]`).
    file: String,
    /// Its name as uploaded (the document id it would have had).
    id: String,
    #[schema(example = "only redirects to guide/intro.html")]
    reason: String,
}

impl SkippedOut {
    fn new(file: String, id: &str, reason: String) -> Self {
        Self {
            file,
            id: ragtime_parse::document_id(id),
            reason,
        }
    }
}

#[derive(Serialize, ToSchema)]
struct IngestedOut {
    id: String,
    /// `created`, `replaced` or `unchanged`.
    status: &'static str,
    chunks: usize,
}

#[derive(Serialize, ToSchema)]
pub struct DocumentOut {
    id: String,
    collection: String,
    title: String,
    #[schema(value_type = Object)]
    metadata: Value,
    updated_ms: i64,
    chunks: Vec<ChunkOut>,
}

#[derive(Serialize, ToSchema)]
struct ChunkOut {
    chunk_id: i64,
    position: i32,
    section: String,
    tokens: i32,
    text: String,
}

#[derive(Serialize, ToSchema)]
pub struct DeletedOut {
    id: String,
    collection: String,
    deleted: bool,
}

fn check_metadata(meta: &Map<String, Value>, path: &str) -> Result<(), ApiError> {
    for (k, v) in meta {
        let p = format!("{path}.{k}");
        if k.is_empty() || k.starts_with('$') {
            let msg = "metadata keys must be non-empty and not start with '$'";
            return Err(ApiError::invalid(p, msg));
        }
        match v {
            Value::Null => {
                let msg = "null is not a metadata value; leave the key out";
                return Err(ApiError::invalid(p, msg));
            }
            Value::Array(items)
                if items
                    .iter()
                    .any(|x| x.is_object() || x.is_array() || x.is_null()) =>
            {
                let msg = "arrays may hold only numbers, strings and booleans";
                return Err(ApiError::invalid(p, msg));
            }
            Value::Object(m) => check_metadata(m, &p)?,
            _ => {}
        }
    }
    Ok(())
}

impl DocumentIn {
    /// Checks the document; `path` names it in errors (`documents[3]`).
    fn check(self, path: &str) -> Result<IngestDoc, ApiError> {
        if self.id.trim().is_empty()
            || self.id.len() > MAX_ID
            || self.id.chars().any(char::is_control)
        {
            let msg = format!("must be 1 to {MAX_ID} bytes without control characters");
            return Err(ApiError::invalid(format!("{path}.id"), msg));
        }
        if self.text.trim().is_empty() {
            return Err(ApiError::invalid(
                format!("{path}.text"),
                "must not be empty",
            ));
        }
        if self.text.len() > MAX_TEXT {
            let msg = format!("longer than {MAX_TEXT} bytes");
            return Err(ApiError::invalid(format!("{path}.text"), msg));
        }
        check_metadata(&self.metadata, &format!("{path}.metadata"))?;
        Ok(IngestDoc {
            id: self.id,
            title: self.title,
            text: self.text,
            metadata: self.metadata,
            sections: self.sections,
        })
    }
}

/// Every document checked, ids unique in the request, at most `MAX_JOB_DOCS`.
fn check_all(docs: Vec<(String, DocumentIn)>, field: &str) -> Result<Vec<IngestDoc>, ApiError> {
    if docs.is_empty() {
        return Err(ApiError::invalid(field, "must not be empty"));
    }
    if docs.len() > MAX_JOB_DOCS {
        let msg = format!("at most {MAX_JOB_DOCS} documents per request");
        return Err(ApiError::invalid(field, msg));
    }
    let mut seen = std::collections::HashSet::new();
    let mut out = Vec::with_capacity(docs.len());
    for (path, d) in docs {
        let d = d.check(&path)?;
        if !seen.insert(d.id.clone()) {
            let msg = format!("duplicate id {:?} in this request", d.id);
            return Err(ApiError::invalid(format!("{path}.id"), msg));
        }
        out.push(d);
    }
    Ok(out)
}

async fn ingest(
    state: &AppState,
    slot: IngestSlot,
    tenant: &Tenant,
    up: Upload,
) -> Result<Response, ApiError> {
    let Upload {
        collection,
        docs,
        skipped,
        run_async,
    } = up;
    let pipeline = state.pipeline()?;
    let bytes: usize = docs.iter().map(|d| d.text.len() + d.title.len()).sum();
    if run_async || docs.len() > MAX_DOCS || bytes > state.config.limits.job_above_bytes {
        // The job takes its own slot when it runs.
        drop(slot);
        let job = pipeline.submit_job(tenant, &collection, docs).await?;
        return Ok(super::jobs::Accepted(job, skipped).into_response());
    }
    let (done, corpus_version) = pipeline.ingest(slot, tenant, &collection, docs).await?;
    let documents = done
        .into_iter()
        .map(|r| IngestedOut {
            id: r.id,
            status: match r.status {
                Upsert::Created => "created",
                Upsert::Replaced => "replaced",
                Upsert::Unchanged => "unchanged",
            },
            chunks: r.chunks,
        })
        .collect();
    Ok(Json(IngestOut {
        collection,
        documents,
        corpus_version,
        skipped,
    })
    .into_response())
}

/// Ingest documents: JSON, or files as `multipart/form-data`. A 200 means
/// every listed document is committed; a 202 answers a job (large
/// ingests, or `"async": true`).
#[utoipa::path(post, path = "/v1/documents", tag = "documents",
    request_body(content((IngestIn = "application/json"), (Object = "multipart/form-data")),
        description = "JSON documents, or `file` parts (.txt, .md, .html, .pdf, .rs, BEIR .jsonl/.jsonl.gz) with optional `collection`, `metadata`, `include`/`exclude` (file name patterns, one a part) and `async` (`true`) fields"),
    responses(
        (status = 200, description = "What happened to each document", body = IngestOut),
        (status = 202, description = "A job ingests them (`Location` names it)", body = super::jobs::JobOut,
            headers(("location" = String, description = "`/v1/jobs/{id}`")))))]
pub async fn create(
    State(state): State<Arc<AppState>>,
    Caller(tenant): Caller,
    req: Request,
) -> Result<Response, ApiError> {
    let multipart = req
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|ct| ct.to_ascii_lowercase().starts_with("multipart/form-data"));
    // The body first, under its deadline: a client that sends the headers
    // and then stalls (or trickles) holds its own connection only, never
    // an ingest slot others need.
    let req = read_body(req, &state.config.server).await?;
    let slot = state.pipeline()?.ingest_slot()?;
    let up = if multipart {
        let form = Multipart::from_request(req, &state).await.map_err(|e| {
            ApiError::invalid("body", format!("bad multipart body: {}", e.body_text()))
        })?;
        upload(form, state.config.limits.max_upload_expanded_bytes).await?
    } else {
        let ApiJson(req) = ApiJson::<IngestIn>::from_request(req, &state).await?;
        check_collection(&req.collection, "collection")?;
        let docs = req.documents.into_iter().enumerate();
        let docs = docs.map(|(i, d)| (format!("documents[{i}]"), d)).collect();
        Upload {
            collection: req.collection,
            docs: check_all(docs, "documents")?,
            skipped: Vec::new(),
            run_async: req.run_async,
        }
    };
    ingest(&state, slot, &tenant, up).await
}

/// The request with its body read whole: at most `server.body_limit_bytes`
/// (413), within `server.body_timeout_ms` (408).
async fn read_body(
    req: Request,
    server: &crate::config::ServerConfig,
) -> Result<Request, ApiError> {
    let (parts, body) = req.into_parts();
    let limit = server.body_limit_bytes;
    let time = std::time::Duration::from_millis(server.body_timeout_ms);
    let bytes = match tokio::time::timeout(time, axum::body::to_bytes(body, limit)).await {
        Ok(Ok(bytes)) => bytes,
        Ok(Err(e)) => {
            use std::error::Error;
            let mut cause: Option<&dyn Error> = e.source();
            let mut too_large = false;
            while let Some(c) = cause {
                too_large |= c.is::<http_body_util::LengthLimitError>();
                cause = c.source();
            }
            return Err(if too_large {
                let msg = format!("the body is over server.body_limit_bytes ({limit} bytes)");
                ApiError::new(ErrorCode::PayloadTooLarge, msg).field("body")
            } else {
                ApiError::invalid("body", format!("the body could not be read: {e}"))
            });
        }
        Err(_) => {
            let msg = format!(
                "the body did not arrive within server.body_timeout_ms ({} ms)",
                server.body_timeout_ms
            );
            return Err(ApiError::new(ErrorCode::RequestTimeout, msg).field("body"));
        }
    };
    Ok(Request::from_parts(parts, axum::body::Body::from(bytes)))
}

fn not_found(id: &str, collection: &str) -> ApiError {
    let msg = format!("no document {id:?} in collection {collection:?}");
    ApiError::new(ErrorCode::NotFound, msg)
}

/// A collection's documents, in id order, a page at a time.
#[utoipa::path(get, path = "/v1/documents", tag = "documents",
    params(ListQuery),
    responses((status = 200, description = "A page of documents", body = DocumentListOut)))]
pub async fn list(
    State(state): State<Arc<AppState>>,
    Caller(tenant): Caller,
    ApiQuery(q): ApiQuery<ListQuery>,
) -> Result<Json<DocumentListOut>, ApiError> {
    check_collection(&q.collection, "collection")?;
    if !(1..=1000).contains(&q.limit) {
        return Err(ApiError::invalid("limit", "must be between 1 and 1000"));
    }
    // One more than asked says whether another page follows.
    let mut docs = state
        .pipeline()?
        .documents(&tenant, &q.collection, &q.after, q.limit + 1)
        .await?;
    let more = docs.len() > q.limit;
    docs.truncate(q.limit);
    let next = more
        .then(|| docs.last().map(|d| d.external_id.clone()))
        .flatten();
    Ok(Json(DocumentListOut {
        collection: q.collection,
        documents: docs
            .into_iter()
            .map(|d| DocumentLineOut {
                id: d.external_id,
                title: d.title,
                updated_ms: d.updated_ms,
                chunks: d.chunks,
            })
            .collect(),
        next,
    }))
}

/// A document with its chunks.
#[utoipa::path(get, path = "/v1/documents/{id}", tag = "documents",
    params(("id" = String, Path, description = "The document's id"), CollectionQuery),
    responses((status = 200, description = "The document", body = DocumentOut)))]
pub async fn get(
    State(state): State<Arc<AppState>>,
    Caller(tenant): Caller,
    ApiPath(id): ApiPath<String>,
    ApiQuery(q): ApiQuery<CollectionQuery>,
) -> Result<Json<DocumentOut>, ApiError> {
    check_collection(&q.collection, "collection")?;
    let doc = state
        .pipeline()?
        .document(&tenant, &q.collection, &id)
        .await?;
    let doc = doc.ok_or_else(|| not_found(&id, &q.collection))?;
    let chunks = doc.chunks.into_iter().map(|c| ChunkOut {
        chunk_id: c.id,
        position: c.position,
        section: c.section,
        tokens: c.tokens,
        text: c.text,
    });
    Ok(Json(DocumentOut {
        id: doc.external_id,
        collection: q.collection,
        title: doc.title,
        metadata: serde_json::from_str(&doc.metadata).unwrap_or(Value::Object(Map::new())),
        updated_ms: doc.updated_ms,
        chunks: chunks.collect(),
    }))
}

/// Delete a document and its chunks.
#[utoipa::path(delete, path = "/v1/documents/{id}", tag = "documents",
    params(("id" = String, Path, description = "The document's id"), CollectionQuery),
    responses((status = 200, description = "Deleted", body = DeletedOut)))]
pub async fn delete(
    State(state): State<Arc<AppState>>,
    Caller(tenant): Caller,
    ApiPath(id): ApiPath<String>,
    ApiQuery(q): ApiQuery<CollectionQuery>,
) -> Result<Json<DeletedOut>, ApiError> {
    check_collection(&q.collection, "collection")?;
    if !state
        .pipeline()?
        .delete(&tenant, &q.collection, &id)
        .await?
    {
        return Err(not_found(&id, &q.collection));
    }
    Ok(Json(DeletedOut {
        id,
        collection: q.collection,
        deleted: true,
    }))
}

/// How long reading one uploaded file may take (a PDF can take long).
const PARSE_TIME_LIMIT: std::time::Duration = std::time::Duration::from_secs(30);

/// Reads an uploaded file on the blocking pool, not on the async threads,
/// within [`PARSE_TIME_LIMIT`]. A file that expands past the limit or is not
/// read in time is a 413 naming it; one that cannot be read, a 422. (A read
/// past its time limit cannot be stopped: its thread finishes on its own,
/// and its result is dropped.)
async fn parse_off_thread(
    filename: String,
    bytes: Vec<u8>,
    path: &str,
    max_expanded: usize,
) -> Result<ragtime_parse::ParsedFile, ApiError> {
    let name = filename.clone();
    let read = tokio::task::spawn_blocking(move || {
        let max = u64::try_from(max_expanded).unwrap_or(u64::MAX);
        ragtime_parse::parse_file_within(&name, bytes, max, "limits.max_upload_expanded_bytes")
    });
    match tokio::time::timeout(PARSE_TIME_LIMIT, read).await {
        Err(_) => {
            let msg = format!(
                "{filename}: not read within {} s",
                PARSE_TIME_LIMIT.as_secs()
            );
            Err(ApiError::new(ErrorCode::PayloadTooLarge, msg).field(path))
        }
        Ok(Err(e)) => Err(ApiError::internal(e)),
        Ok(Ok(Err(e))) if e.too_large => {
            Err(ApiError::new(ErrorCode::PayloadTooLarge, e.message).field(path))
        }
        Ok(Ok(Err(e))) => Err(ApiError::invalid(path, e.message)),
        Ok(Ok(Ok(parsed))) => Ok(parsed),
    }
}

fn multipart_error(e: &axum::extract::multipart::MultipartError) -> ApiError {
    if e.status() == axum::http::StatusCode::PAYLOAD_TOO_LARGE {
        ApiError::new(ErrorCode::PayloadTooLarge, "request body is too large")
    } else {
        ApiError::invalid("body", format!("bad multipart body: {}", e.body_text()))
    }
}

/// What an upload asked for: the collection, the documents of its files,
/// the files skipped and whether to answer with a job.
pub(crate) struct Upload {
    collection: String,
    docs: Vec<IngestDoc>,
    skipped: Vec<SkippedOut>,
    run_async: bool,
}

/// A text part of the form, read.
async fn text_field(field: axum::extract::multipart::Field<'_>) -> Result<String, ApiError> {
    field.text().await.map_err(|e| multipart_error(&e))
}

/// Files uploaded as `multipart/form-data`: one or more `file` parts,
/// optional `collection`, `metadata` (a JSON object applied to every
/// document), `include` and `exclude` (file name patterns, one a part,
/// as `ragtime ingest` reads them) and `async` (`true` or `false`) text
/// parts. Every file is read and checked before anything is written.
async fn upload(mut form: Multipart, max_expanded: usize) -> Result<Upload, ApiError> {
    let mut collection = default_collection();
    let mut run_async = false;
    let mut extra = Map::new();
    let (mut include, mut exclude) = (Vec::new(), Vec::new());
    // Each file's form field, name and bytes, read once the form is.
    let mut files: Vec<(String, String, Vec<u8>)> = Vec::new();
    while let Some(field) = form.next_field().await.map_err(|e| multipart_error(&e))? {
        let name = field.name().unwrap_or_default().to_owned();
        match name.as_str() {
            "collection" => collection = text_field(field).await?,
            "async" => run_async = boolean(&text_field(field).await?, "async")?,
            "include" => include.push(text_field(field).await?),
            "exclude" => exclude.push(text_field(field).await?),
            "metadata" => match serde_json::from_str(&text_field(field).await?) {
                Ok(Value::Object(m)) => extra = m,
                _ => return Err(ApiError::invalid("metadata", "must be a JSON object")),
            },
            "file" => {
                let path = format!("file[{}]", files.len());
                let filename = field
                    .file_name()
                    .map(str::to_owned)
                    .filter(|f| !f.is_empty());
                let filename = filename
                    .ok_or_else(|| ApiError::invalid(&path, "a file part needs a filename"))?;
                let bytes = field.bytes().await.map_err(|e| multipart_error(&e))?;
                files.push((path, filename, bytes.to_vec()));
            }
            other => {
                let msg =
                    "unknown form field; use file, collection, metadata, include, exclude or async";
                return Err(ApiError::invalid(other, msg));
            }
        }
    }
    check_collection(&collection, "collection")?;
    check_metadata(&extra, "metadata")?;
    let filter = ragtime_parse::FileFilter::new(&include, &exclude)
        .map_err(|e| ApiError::invalid(e.list, e.message))?;
    let (docs, skipped) = read_files(files, &filter, &extra, max_expanded).await?;
    Ok(Upload {
        collection,
        docs: check_all(docs, "file")?,
        skipped,
        run_async,
    })
}

/// The uploaded files read (those `filter` lets through), each document
/// with the form field it came from and the form's `metadata` added, and
/// the files skipped. Skipping every file is an error naming the first;
/// files whose text comes to more than `max_expanded` bytes in all
/// (`limits.max_upload_expanded_bytes`, decompressed), a 413 naming the
/// file that passed it.
async fn read_files(
    files: Vec<(String, String, Vec<u8>)>,
    filter: &ragtime_parse::FileFilter,
    extra: &Map<String, Value>,
    max_expanded: usize,
) -> Result<(Vec<(String, DocumentIn)>, Vec<SkippedOut>), ApiError> {
    if files.is_empty() {
        return Err(ApiError::invalid("file", "no file was uploaded"));
    }
    let mut skipped = Vec::new();
    let mut paths = Vec::new();
    let mut parsed = Vec::new();
    let mut expanded = 0usize;
    for (path, filename, bytes) in files {
        if let Some(reason) = filter.refuses(&filename) {
            skipped.push(SkippedOut::new(path, &filename, reason));
            continue;
        }
        let left = max_expanded.saturating_sub(expanded);
        let file = parse_off_thread(filename.clone(), bytes, &path, left).await?;
        expanded += file.text_bytes();
        if expanded > max_expanded {
            let msg = format!(
                "{filename}: the upload's files expand to more than limits.max_upload_expanded_bytes ({max_expanded} bytes)"
            );
            return Err(ApiError::new(ErrorCode::PayloadTooLarge, msg).field(&path));
        }
        parsed.push(file);
        paths.push(path);
    }
    // Read together, so lines repeated on most pages (chrome) are dropped
    // and a page that repeats the others is found.
    let read = ragtime_parse::into_documents(parsed);
    for s in read.skipped {
        skipped.push(SkippedOut::new(paths[s.file].clone(), &s.id, s.reason));
    }
    if read.docs.is_empty() {
        let first = skipped.first();
        let (field, msg) = first.map_or(("file".to_owned(), "no document".to_owned()), |s| {
            (
                s.file.clone(),
                format!("{}: {}; nothing to ingest", s.id, s.reason),
            )
        });
        return Err(ApiError::invalid(field, msg));
    }
    let mut docs = Vec::with_capacity(read.docs.len());
    for (d, file) in read.docs.into_iter().zip(read.from) {
        let path = paths[file].clone();
        if d.text.len() > MAX_TEXT {
            let msg = format!("{}: its text is longer than {MAX_TEXT} bytes", d.id);
            return Err(ApiError::new(ErrorCode::PayloadTooLarge, msg).field(&path));
        }
        let mut metadata = d.metadata;
        metadata.extend(extra.clone());
        let doc = DocumentIn {
            id: d.id,
            title: d.title,
            text: d.text,
            metadata,
            sections: d.sections,
        };
        docs.push((path, doc));
    }
    Ok((docs, skipped))
}

/// `true` or `false`, else an error naming `field`.
fn boolean(text: &str, field: &str) -> Result<bool, ApiError> {
    match text.trim() {
        "true" => Ok(true),
        "false" => Ok(false),
        _ => Err(ApiError::invalid(field, "must be true or false")),
    }
}
