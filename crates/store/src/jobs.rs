//! Ingest jobs: a large upload runs in the background on the replica that
//! took it. Its row holds its progress, which moves in the same
//! transaction as the documents it counts ([`JobStep`], written by
//! `upsert_documents`): after a crash the row says exactly which part of
//! the upload is durable. The running replica beats (`heartbeat_ms`); a
//! job whose replica stopped beating is reported as interrupted.

use crate::{Pool, Store, StoreError, now_ms};

/// A queued or running job whose heartbeat is older than this is reported
/// as `interrupted` (its process is gone). Replicas beat every
/// [`JOB_HEARTBEAT_MS`].
pub const JOB_STALE_MS: i64 = 10_000;
pub const JOB_HEARTBEAT_MS: i64 = 2_000;

/// Where a job is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobStatus {
    Queued,
    Running,
    Done,
    Failed,
    Cancelled,
    /// Its process stopped (killed, crashed) before it finished.
    Interrupted,
}

impl JobStatus {
    pub const fn as_str(self) -> &'static str {
        match self {
            JobStatus::Queued => "queued",
            JobStatus::Running => "running",
            JobStatus::Done => "done",
            JobStatus::Failed => "failed",
            JobStatus::Cancelled => "cancelled",
            JobStatus::Interrupted => "interrupted",
        }
    }

    fn parse(s: &str) -> Self {
        match s {
            "queued" => JobStatus::Queued,
            "running" => JobStatus::Running,
            "done" => JobStatus::Done,
            "cancelled" => JobStatus::Cancelled,
            "interrupted" => JobStatus::Interrupted,
            _ => JobStatus::Failed,
        }
    }

    /// Queued or running.
    pub const fn is_active(self) -> bool {
        matches!(self, JobStatus::Queued | JobStatus::Running)
    }
}

/// A new job: what it will ingest, counted before it starts.
#[derive(Debug, Clone)]
pub struct NewJob<'a> {
    pub id: &'a str,
    pub tenant: &'a str,
    pub collection: &'a str,
    pub documents: i64,
    pub chunks: i64,
}

/// A job's row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobRecord {
    pub id: String,
    pub tenant: String,
    pub collection: String,
    /// As read: a queued or running job whose heartbeat is stale reads as
    /// [`JobStatus::Interrupted`].
    pub status: JobStatus,
    pub cancel_requested: bool,
    pub documents_total: i64,
    pub chunks_total: i64,
    pub documents_done: i64,
    pub chunks_done: i64,
    /// Of `chunks_done`, those of documents created or replaced (the rest
    /// are unchanged documents').
    pub chunks_written: i64,
    pub created: i64,
    pub replaced: i64,
    pub unchanged: i64,
    pub error: Option<String>,
    pub created_ms: i64,
    pub started_ms: Option<i64>,
    pub heartbeat_ms: i64,
    pub finished_ms: Option<i64>,
}

/// A batch's share of a job, written with the batch's documents: the
/// documents of the batch (the written ones and those found unchanged
/// before the write) and their chunks. The store counts which were
/// created and replaced; the rest were unchanged.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct JobStep {
    pub id: String,
    pub documents: i64,
    pub chunks: i64,
}

const COLUMNS: &str = "id, tenant, collection, status, cancel_requested, documents_total, chunks_total, \
     documents_done, chunks_done, chunks_written, created, replaced, unchanged, error, created_ms, \
     started_ms, heartbeat_ms, finished_ms";

#[derive(sqlx::FromRow)]
struct Row {
    id: String,
    tenant: String,
    collection: String,
    status: String,
    cancel_requested: bool,
    documents_total: i64,
    chunks_total: i64,
    documents_done: i64,
    chunks_done: i64,
    chunks_written: i64,
    created: i64,
    replaced: i64,
    unchanged: i64,
    error: Option<String>,
    created_ms: i64,
    started_ms: Option<i64>,
    heartbeat_ms: i64,
    finished_ms: Option<i64>,
}

fn record(r: Row, now: i64) -> JobRecord {
    let mut status = JobStatus::parse(&r.status);
    if status.is_active() && r.heartbeat_ms < now - JOB_STALE_MS {
        status = JobStatus::Interrupted;
    }
    JobRecord {
        id: r.id,
        tenant: r.tenant,
        collection: r.collection,
        status,
        cancel_requested: r.cancel_requested,
        documents_total: r.documents_total,
        chunks_total: r.chunks_total,
        documents_done: r.documents_done,
        chunks_done: r.chunks_done,
        chunks_written: r.chunks_written,
        created: r.created,
        replaced: r.replaced,
        unchanged: r.unchanged,
        error: r.error,
        created_ms: r.created_ms,
        started_ms: r.started_ms,
        heartbeat_ms: r.heartbeat_ms,
        finished_ms: r.finished_ms,
    }
}

impl Store {
    /// Records a new job, queued.
    pub async fn create_job(&self, job: &NewJob<'_>) -> Result<(), StoreError> {
        let at = now_ms();
        let q = "INSERT INTO jobs (id, tenant, collection, status, documents_total, chunks_total, created_ms, heartbeat_ms) \
                 VALUES ($1, $2, $3, 'queued', $4, $5, $6, $6)";
        on_pool!(self, p => {
            sqlx::query(q)
                .bind(job.id)
                .bind(job.tenant)
                .bind(job.collection)
                .bind(job.documents)
                .bind(job.chunks)
                .bind(at)
                .execute(p)
                .await?;
        });
        Ok(())
    }

    /// A job by id.
    pub async fn job(&self, id: &str) -> Result<Option<JobRecord>, StoreError> {
        let q = format!("SELECT {COLUMNS} FROM jobs WHERE id = $1");
        let row: Option<Row> =
            on_pool!(self, p => sqlx::query_as(&q).bind(id).fetch_optional(p).await?);
        Ok(row.map(|r| record(r, now_ms())))
    }

    /// A tenant's latest `limit` jobs, newest first.
    pub async fn jobs(&self, tenant: &str, limit: i64) -> Result<Vec<JobRecord>, StoreError> {
        let q = format!(
            "SELECT {COLUMNS} FROM jobs WHERE tenant = $1 ORDER BY created_ms DESC, id DESC LIMIT $2"
        );
        let rows: Vec<Row> =
            on_pool!(self, p => sqlx::query_as(&q).bind(tenant).bind(limit).fetch_all(p).await?);
        let now = now_ms();
        Ok(rows.into_iter().map(|r| record(r, now)).collect())
    }

    /// Marks a queued job running.
    pub async fn start_job(&self, id: &str) -> Result<(), StoreError> {
        let q = "UPDATE jobs SET status = 'running', started_ms = $1, heartbeat_ms = $1 WHERE id = $2 AND status = 'queued'";
        on_pool!(self, p => { sqlx::query(q).bind(now_ms()).bind(id).execute(p).await?; });
        Ok(())
    }

    /// Beats for a live job; answers whether it should stop: its
    /// cancellation was asked for, or its record removed (on any replica).
    pub async fn job_heartbeat(&self, id: &str) -> Result<bool, StoreError> {
        let q = "UPDATE jobs SET heartbeat_ms = $1 WHERE id = $2 RETURNING cancel_requested";
        let cancel: Option<bool> = on_pool!(self, p => sqlx::query_scalar(q).bind(now_ms()).bind(id).fetch_optional(p).await?);
        Ok(cancel.unwrap_or(true))
    }

    /// Removes a job's record; `false` if there was none.
    pub async fn delete_job(&self, id: &str) -> Result<bool, StoreError> {
        let q = "DELETE FROM jobs WHERE id = $1";
        Ok(on_pool!(self, p => sqlx::query(q).bind(id).execute(p).await?.rows_affected()) > 0)
    }

    /// Asks a queued or running job to stop; the job as it is now (`None`
    /// if there is no such job).
    pub async fn request_job_cancel(&self, id: &str) -> Result<Option<JobRecord>, StoreError> {
        let q = "UPDATE jobs SET cancel_requested = $1 WHERE id = $2 AND status IN ('queued', 'running')";
        on_pool!(self, p => { sqlx::query(q).bind(true).bind(id).execute(p).await?; });
        self.job(id).await
    }

    /// Ends a job with `status` (and an error message for a failed one).
    pub async fn finish_job(
        &self,
        id: &str,
        status: JobStatus,
        error: Option<&str>,
    ) -> Result<(), StoreError> {
        let q = "UPDATE jobs SET status = $1, error = $2, finished_ms = $3, heartbeat_ms = $3 WHERE id = $4";
        on_pool!(self, p => {
            sqlx::query(q)
                .bind(status.as_str())
                .bind(error)
                .bind(now_ms())
                .bind(id)
                .execute(p)
                .await?;
        });
        Ok(())
    }

    /// Removes jobs that ended (or were interrupted) before `before_ms`;
    /// returns how many.
    pub async fn expire_jobs(&self, before_ms: i64) -> Result<u64, StoreError> {
        let q = "DELETE FROM jobs WHERE heartbeat_ms < $1";
        Ok(on_pool!(self, p => sqlx::query(q).bind(before_ms).execute(p).await?.rows_affected()))
    }
}

/// Adds a batch's counts to its job ([`JobStep`]), inside the batch's
/// transaction; binds documents, chunks, created, replaced, unchanged, the
/// time, the chunks of the documents written and the job's id (in the
/// order they appear: SQLite numbers `$N` by appearance).
pub(crate) const ADD_STEP: &str = "UPDATE jobs SET documents_done = documents_done + $1, \
     chunks_done = chunks_done + $2, created = created + $3, replaced = replaced + $4, \
     unchanged = unchanged + $5, heartbeat_ms = $6, chunks_written = chunks_written + $7 \
     WHERE id = $8";
