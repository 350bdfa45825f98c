//! `GET /v1/jobs`, `GET` and `DELETE /v1/jobs/{id}`: ingest jobs (large
//! uploads, or any with `"async": true`) — their progress, an estimate of
//! when they end, and cancelling one.

use crate::auth::Caller;
use crate::error::{ApiError, ErrorCode};
use crate::extract::{ApiPath, ApiQuery};
use crate::state::AppState;
use axum::Json;
use axum::extract::State;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use ragtime_store::{JobRecord, JobStatus};
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use std::time::Duration;
use utoipa::{IntoParams, ToSchema};

#[derive(Serialize, ToSchema)]
pub struct Progress {
    done: i64,
    total: i64,
}

/// An ingest job.
#[derive(Serialize, ToSchema)]
pub struct JobOut {
    id: String,
    collection: String,
    /// `queued` (waiting for an ingest slot), `running`, `done`, `failed`,
    /// `cancelled`, or `interrupted` (its server stopped before it ended:
    /// what it counted as done is stored whole; send the rest again).
    #[schema(example = "running")]
    status: &'static str,
    /// Documents committed (stored and searchable) of those sent.
    documents: Progress,
    /// Their chunks, of all the job's chunks.
    chunks: Progress,
    /// Of the chunks done, those of documents created or replaced (the
    /// rest are unchanged documents', not embedded again).
    chunks_written: i64,
    /// Of the documents done: new, replacing a stored one, or the same as
    /// the stored one (nothing written).
    created: i64,
    replaced: i64,
    unchanged: i64,
    /// Seconds until it ends at its rate so far (`null` until it has one,
    /// and once it ended).
    eta_seconds: Option<f64>,
    cancel_requested: bool,
    error: Option<String>,
    created_ms: i64,
    started_ms: Option<i64>,
    finished_ms: Option<i64>,
    /// In the answer to the upload that made the job: its files that gave
    /// no document, and why (as `POST /v1/documents` answers them).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    skipped: Vec<super::documents::SkippedOut>,
}

/// The job's estimated seconds to go: its chunks left at its chunk rate so
/// far (a job's cost is embedding its chunks).
fn eta_seconds(j: &JobRecord, now_ms: i64) -> Option<f64> {
    let started = j.started_ms?;
    if j.status != JobStatus::Running || j.chunks_done == 0 {
        return None;
    }
    let elapsed = (now_ms - started).max(1) as f64 / 1000.0;
    let rate = j.chunks_done as f64 / elapsed;
    Some(((j.chunks_total - j.chunks_done).max(0) as f64 / rate * 10.0).round() / 10.0)
}

impl From<JobRecord> for JobOut {
    fn from(j: JobRecord) -> Self {
        let eta_seconds = eta_seconds(&j, ragtime_store::now_ms());
        Self {
            status: j.status.as_str(),
            documents: Progress {
                done: j.documents_done,
                total: j.documents_total,
            },
            chunks: Progress {
                done: j.chunks_done,
                total: j.chunks_total,
            },
            chunks_written: j.chunks_written,
            created: j.created,
            replaced: j.replaced,
            unchanged: j.unchanged,
            eta_seconds,
            cancel_requested: j.cancel_requested,
            error: j.error,
            created_ms: j.created_ms,
            started_ms: j.started_ms,
            finished_ms: j.finished_ms,
            skipped: Vec::new(),
            id: j.id,
            collection: j.collection,
        }
    }
}

/// A job just made: 202 with `Location: /v1/jobs/{id}`.
pub struct Accepted(pub JobRecord, pub Vec<super::documents::SkippedOut>);

impl IntoResponse for Accepted {
    fn into_response(self) -> Response {
        let location = HeaderValue::from_str(&format!("/v1/jobs/{}", self.0.id));
        let mut job = JobOut::from(self.0);
        job.skipped = self.1;
        let mut resp = (StatusCode::ACCEPTED, Json(job)).into_response();
        if let Ok(v) = location {
            resp.headers_mut().insert(header::LOCATION, v);
        }
        resp
    }
}

fn not_found(id: &str) -> ApiError {
    ApiError::new(ErrorCode::NotFound, format!("no job {id:?}"))
}

/// A job: its progress and estimated time to go.
#[utoipa::path(get, path = "/v1/jobs/{id}", tag = "documents",
    params(("id" = String, Path, description = "The job's id (from `POST /v1/documents`)")),
    responses((status = 200, description = "The job", body = JobOut)))]
pub async fn get(
    State(state): State<Arc<AppState>>,
    Caller(tenant): Caller,
    ApiPath(id): ApiPath<String>,
) -> Result<Json<JobOut>, ApiError> {
    let job = state.pipeline()?.job(&tenant, &id).await?;
    Ok(Json(job.ok_or_else(|| not_found(&id))?.into()))
}

/// Cancels a job and removes it: a queued or running job stops at its
/// next batch (what it committed stays). Answers the job as it was last.
#[utoipa::path(delete, path = "/v1/jobs/{id}", tag = "documents",
    params(("id" = String, Path, description = "The job's id")),
    responses((status = 200, description = "The job as it was last: `cancelled` once stopped (or still `running` with `cancel_requested` when it runs on another replica, which stops it within seconds), or as it ended", body = JobOut)))]
pub async fn cancel(
    State(state): State<Arc<AppState>>,
    Caller(tenant): Caller,
    ApiPath(id): ApiPath<String>,
) -> Result<Json<JobOut>, ApiError> {
    let job = state
        .pipeline()?
        .cancel_job(&tenant, &id, Duration::from_secs(5))
        .await?;
    Ok(Json(job.ok_or_else(|| not_found(&id))?.into()))
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ListQuery {
    /// How many, newest first (1 to 100; 20 unless given).
    #[param(minimum = 1, maximum = 100)]
    limit: Option<usize>,
}

#[derive(Serialize, ToSchema)]
pub struct JobsOut {
    jobs: Vec<JobOut>,
}

/// Your latest jobs, newest first.
#[utoipa::path(get, path = "/v1/jobs", tag = "documents", params(ListQuery),
    responses((status = 200, description = "The jobs", body = JobsOut)))]
pub async fn list(
    State(state): State<Arc<AppState>>,
    Caller(tenant): Caller,
    ApiQuery(q): ApiQuery<ListQuery>,
) -> Result<Json<JobsOut>, ApiError> {
    let limit = q.limit.unwrap_or(20);
    if !(1..=100).contains(&limit) {
        return Err(ApiError::invalid("limit", "must be 1 to 100"));
    }
    let jobs = state.pipeline()?.jobs(&tenant, limit).await?;
    Ok(Json(JobsOut {
        jobs: jobs.into_iter().map(JobOut::from).collect(),
    }))
}
