//! Ingest jobs: a large upload answers at once with a job and runs in the
//! background on this replica, in batches. Each batch is chunked and
//! embedded, then committed with the job's progress in one transaction
//! (see `ragtime_store::JobStep`), so a crash leaves every counted
//! document whole and searchable and none half there. A job takes one
//! ingest slot while it runs (queued until one is free) and stops at its
//! next batch when cancelled — here or on any replica (the store carries
//! the request, read at each heartbeat).

use crate::PipelineError;
use crate::corpus::{CorpusError, IngestDoc, Ingested};
use crate::service::{AbortOnDrop, Pipeline};
use ragtime_core::{StageError, Tenant};
use ragtime_store::{JOB_HEARTBEAT_MS, JobRecord, JobStatus, JobStep, NewJob};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// Documents per batch at most: one transaction, one step of progress.
pub const JOB_BATCH_DOCUMENTS: usize = 32;
/// Chunks per batch at most (a batch holds at least one document): a few
/// long pages would otherwise be one step, and the progress would sit at
/// zero until the whole job was done. About 3 s of embedding on 2 cores.
pub const JOB_BATCH_CHUNKS: usize = 128;

/// The jobs running (or queued) on this replica, each with the switch that
/// stops it.
#[derive(Default)]
pub(crate) struct Jobs {
    live: Mutex<HashMap<String, Live>>,
}

/// A job this replica holds.
struct Live {
    stop: watch::Sender<bool>,
    tenant: String,
    /// The text it holds until it is done.
    bytes: usize,
}

impl Jobs {
    fn stop(&self, id: &str) -> bool {
        let live = self.live.lock().unwrap_or_else(PoisonError::into_inner);
        live.get(id).map(|j| j.stop.send_replace(true)).is_some()
    }

    fn remove(&self, id: &str) {
        self.live
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(id);
    }

    /// Whether this replica still runs the job.
    fn holds(&self, id: &str) -> bool {
        self.live
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .contains_key(id)
    }

    /// How many jobs this replica holds.
    pub(crate) fn len(&self) -> usize {
        self.live
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }
}

/// A job refused for want of room (`what` names the setting).
fn busy(what: &'static str) -> PipelineError {
    PipelineError::Busy {
        what,
        retry_after: Duration::from_secs(10),
    }
}

pub(crate) fn internal(e: impl std::fmt::Display) -> PipelineError {
    PipelineError::Internal(e.to_string())
}

impl Pipeline {
    /// Starts a job ingesting `docs` into `collection` of `tenant`; returns
    /// it as recorded (queued). Refused as busy past
    /// `limits.max_jobs` jobs on this replica.
    pub async fn submit_job(
        self: &Arc<Self>,
        tenant: &Tenant,
        collection: &str,
        docs: Vec<IngestDoc>,
    ) -> Result<JobRecord, PipelineError> {
        let max = self.settings.max_jobs;
        if max > 0 && self.jobs.len() >= max {
            return Err(busy("every job slot (limits.max_jobs)"));
        }
        let bytes: usize = docs.iter().map(|d| d.text.len() + d.title.len()).sum();
        // Let in (or refused) before any CPU work: a flood of uploads past
        // the limits costs no tokenizing.
        let (id, stopped) = self.admit_job(tenant, bytes)?;
        // Counted next, so progress has a total (chunking is a small part
        // of the work; embedding is the rest).
        let me = self.clone();
        let counted = tokio::task::spawn_blocking(move || {
            let counts: Vec<usize> = docs.iter().map(|d| me.corpus.count_chunks(d)).collect();
            (docs, counts)
        })
        .await;
        let (docs, counts) = match counted {
            Ok(c) => c,
            Err(e) => {
                self.jobs.remove(&id);
                return Err(internal(e));
            }
        };
        // The collection is taken now (once the job is let in), made if
        // missing, as a direct ingest would: removed while the job waits or
        // runs, the job fails naming it rather than making it again.
        let target = tenant.collection(collection);
        let coll_id = match self.corpus.target(&target).await {
            Ok(id) => id,
            Err(e) => {
                self.jobs.remove(&id);
                return Err(Self::corpus_error(e, collection));
            }
        };
        let new = NewJob {
            id: &id,
            tenant: tenant.name(),
            collection,
            documents: docs.len() as i64,
            chunks: counts.iter().sum::<usize>() as i64,
        };
        let store = &self.corpus.store;
        if let Err(e) = store.create_job(&new).await {
            self.jobs.remove(&id);
            return Err(internal(e));
        }
        let me = self.clone();
        let job = id.clone();
        tokio::spawn(async move {
            me.run_to_end(job, (target, coll_id), docs, counts, stopped)
                .await
        });
        store
            .job(&id)
            .await
            .map_err(internal)?
            .ok_or_else(|| internal("job vanished"))
    }

    /// Lets a job in, within `limits.max_jobs`, the tenant's share and the
    /// bytes held jobs keep: its id and the switch that stops it.
    fn admit_job(
        &self,
        tenant: &Tenant,
        bytes: usize,
    ) -> Result<(String, watch::Receiver<bool>), PipelineError> {
        let mut live = self
            .jobs
            .live
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let max = self.settings.max_jobs;
        if max > 0 && live.len() >= max {
            return Err(busy("every job slot (limits.max_jobs)"));
        }
        let per_tenant = self.settings.max_jobs_per_tenant;
        if per_tenant > 0
            && live.values().filter(|j| j.tenant == tenant.name()).count() >= per_tenant
        {
            return Err(busy("the tenant's job slots (limits.max_jobs_per_tenant)"));
        }
        let held: usize = live.values().map(|j| j.bytes).sum();
        let max_bytes = self.settings.max_queued_job_bytes;
        if max_bytes > 0 && held + bytes > max_bytes {
            return Err(busy(
                "the memory for queued jobs (limits.max_queued_job_bytes)",
            ));
        }
        let id = format!("job_{}", uuid::Uuid::new_v4().simple());
        let (stop, stopped) = watch::channel(false);
        let tenant = tenant.name().to_owned();
        live.insert(
            id.clone(),
            Live {
                stop,
                tenant,
                bytes,
            },
        );
        Ok((id, stopped))
    }

    /// Runs a job to its end and records how it ended.
    async fn run_to_end(
        self: Arc<Self>,
        job: String,
        (collection, coll_id): (String, i64),
        docs: Vec<IngestDoc>,
        counts: Vec<usize>,
        stopped: watch::Receiver<bool>,
    ) {
        let _beat = AbortOnDrop::new(tokio::spawn(self.clone().beat(job.clone())));
        let outcome = self
            .run_job(&job, (&collection, coll_id), docs, counts, stopped)
            .await;
        let (status, error) = match outcome {
            Ok(true) => (JobStatus::Done, None),
            Ok(false) => (JobStatus::Cancelled, None),
            Err(e) => (JobStatus::Failed, Some(e.to_string())),
        };
        let recorded = self
            .corpus
            .store
            .finish_job(&job, status, error.as_deref())
            .await;
        if let Err(e) = recorded {
            tracing::warn!(job = %job, error = %e, "could not record the job's end");
        }
        self.jobs.remove(&job);
        tracing::info!(job = %job, status = status.as_str(), error = error.as_deref(), "ingest job ended");
    }

    /// Keeps the job's heartbeat fresh and passes on a cancellation asked
    /// for on another replica.
    async fn beat(self: Arc<Self>, job: String) {
        let every = Duration::from_millis(JOB_HEARTBEAT_MS as u64);
        loop {
            tokio::time::sleep(every).await;
            match self.corpus.store.job_heartbeat(&job).await {
                Ok(true) => {
                    self.jobs.stop(&job);
                }
                Ok(false) => {}
                Err(e) => tracing::warn!(job = %job, error = %e, "job heartbeat failed"),
            }
        }
    }

    /// Runs a job's batches; `Ok(false)` if it was cancelled.
    async fn run_job(
        self: &Arc<Self>,
        job: &str,
        (collection, coll_id): (&str, i64),
        docs: Vec<IngestDoc>,
        counts: Vec<usize>,
        mut stopped: watch::Receiver<bool>,
    ) -> Result<bool, PipelineError> {
        let error = |e: CorpusError| Self::corpus_error(e, collection);
        // One ingest slot for the whole job; queued until one is free.
        let _slot = tokio::select! {
            slot = self.ingests.clone().acquire_owned() => slot.map_err(internal)?,
            _ = stopped.wait_for(|s| *s) => return Ok(false),
        };
        self.corpus.store.start_job(job).await.map_err(internal)?;
        // The previous batch's commit runs while the next is embedded; a
        // commit, once started, always runs to its end.
        let mut committing: Option<JoinHandle<Result<Vec<Ingested>, CorpusError>>> = None;
        let mut rest = docs.into_iter().zip(counts).peekable();
        let mut finished = true;
        while rest.peek().is_some() {
            let mut batch: Vec<(IngestDoc, usize)> = Vec::new();
            let mut chunks = 0;
            while let Some((_, n)) = rest.peek() {
                let full = batch.len() >= JOB_BATCH_DOCUMENTS || chunks + n > JOB_BATCH_CHUNKS;
                if full && !batch.is_empty() {
                    break;
                }
                chunks += n;
                batch.extend(rest.next());
            }
            let step = JobStep {
                id: job.to_owned(),
                documents: batch.len() as i64,
                chunks: batch.iter().map(|(_, n)| *n as i64).sum(),
            };
            let docs: Vec<IngestDoc> = batch.into_iter().map(|(d, _)| d).collect();
            let prepared = loop {
                let r = tokio::select! {
                    r = self.corpus.prepare_into(collection, coll_id, docs.clone()) => r,
                    _ = stopped.wait_for(|s| *s) => break None,
                };
                match r {
                    // The embedding queue is full (other ingests): wait.
                    Err(CorpusError::Embed(StageError::Busy(_))) => {
                        tokio::time::sleep(Duration::from_millis(500)).await;
                    }
                    Err(e) => {
                        if let Some(c) = committing.take() {
                            let _ = c.await;
                        }
                        return Err(error(e));
                    }
                    Ok(p) => break Some(p),
                }
            };
            if let Some(c) = committing.take() {
                c.await.map_err(internal)?.map_err(error)?;
            }
            let Some(prepared) = prepared.filter(|_| !*stopped.borrow()) else {
                finished = false;
                break;
            };
            let me = self.clone();
            committing = Some(tokio::spawn(async move {
                me.corpus.commit(prepared.for_job(step)).await
            }));
        }
        if let Some(c) = committing.take() {
            c.await.map_err(internal)?.map_err(error)?;
        }
        Ok(finished)
    }

    /// A job of `tenant`'s (`None` if there is none, or it is another's).
    pub async fn job(&self, tenant: &Tenant, id: &str) -> Result<Option<JobRecord>, PipelineError> {
        let job = self.corpus.store.job(id).await.map_err(internal)?;
        Ok(job.filter(|j| j.tenant == tenant.name()))
    }

    /// `tenant`'s latest jobs, newest first.
    pub async fn jobs(
        &self,
        tenant: &Tenant,
        limit: usize,
    ) -> Result<Vec<JobRecord>, PipelineError> {
        self.corpus
            .store
            .jobs(tenant.name(), limit as i64)
            .await
            .map_err(internal)
    }

    /// Cancels a job and removes its record: a queued or running job is
    /// asked to stop at its next batch (what it committed stays) and,
    /// when it runs here, awaited up to `wait`. The job as it was last
    /// (`cancelled` once it stopped; still `running` with
    /// `cancel_requested` if it runs on another replica, which stops it at
    /// its next heartbeat); `None` if `tenant` has no such job.
    pub async fn cancel_job(
        &self,
        tenant: &Tenant,
        id: &str,
        wait: Duration,
    ) -> Result<Option<JobRecord>, PipelineError> {
        let Some(job) = self.job(tenant, id).await? else {
            return Ok(None);
        };
        let store = &self.corpus.store;
        let mut last = job;
        if last.status.is_active() {
            store.request_job_cancel(id).await.map_err(internal)?;
            if self.jobs.stop(id) {
                let until = tokio::time::Instant::now() + wait;
                while self.jobs.holds(id) && tokio::time::Instant::now() < until {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
            if let Some(now) = self.job(tenant, id).await? {
                last = now;
            }
        }
        store.delete_job(id).await.map_err(internal)?;
        Ok(Some(last))
    }
}
