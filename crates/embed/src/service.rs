//! The embedding service: a dedicated pool of worker threads behind an
//! async queue, with dynamic micro-batching across concurrent requests and
//! a bounded cache of query embeddings keyed by normalised text.

use crate::{Kind, OnnxEmbedder};
use async_trait::async_trait;
use moka::sync::Cache;
use ragtime_core::{Cancel, Embedder, StageError};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};
use tokio::sync::oneshot;
use unicode_normalization::UnicodeNormalization;

/// Settings for [`EmbedService`].
#[derive(Debug, Clone, Copy)]
pub struct ServiceOptions {
    /// Worker threads (each runs one inference at a time).
    pub workers: usize,
    /// Most texts in one inference.
    pub max_batch: usize,
    /// How long a worker waits for more requests to fill a batch. Zero (the
    /// default) takes only what is already queued: no added latency when
    /// idle, and under load requests queue up during an inference and form
    /// the next batch (continuous batching).
    pub max_wait: Duration,
    /// Cached query embeddings, at most.
    pub cache_entries: u64,
    pub cache_ttl: Duration,
    /// Texts the bulk queue (ingestion) may hold; a bulk job that would
    /// pass it while others wait is refused (`StageError::Busy`). A job
    /// alone in the queue is always taken, whatever its size.
    pub max_bulk_texts: usize,
}

impl Default for ServiceOptions {
    fn default() -> Self {
        Self {
            workers: 1,
            max_batch: 32,
            max_wait: Duration::ZERO,
            cache_entries: 100_000,
            cache_ttl: Duration::from_secs(3600),
            max_bulk_texts: 50_000,
        }
    }
}

type Reply = oneshot::Sender<Result<Vec<Vec<f32>>, StageError>>;

struct Job {
    texts: Vec<String>,
    kind: Kind,
    cancel: Cancel,
    reply: Reply,
}

/// A large job (ingestion) done one batch at a time, so interactive
/// requests never wait behind more than one batch of it.
struct BulkJob {
    job: Job,
    /// Text indices shortest first, so batches hold similar lengths.
    order: Vec<usize>,
    done: Vec<Vec<f32>>,
}

impl BulkJob {
    fn new(job: Job) -> Self {
        let mut order: Vec<usize> = (0..job.texts.len()).collect();
        order.sort_by_key(|&i| job.texts[i].len());
        Self {
            done: Vec::with_capacity(order.len()),
            order,
            job,
        }
    }

    /// The vectors in the caller's order.
    fn finish(self) -> Vec<Vec<f32>> {
        let mut out = vec![Vec::new(); self.order.len()];
        for (i, v) in self.order.into_iter().zip(self.done) {
            out[i] = v;
        }
        out
    }
}

#[derive(Default)]
struct Queues {
    interactive: VecDeque<Job>,
    bulk: VecDeque<BulkJob>,
    /// Texts left of the bulk job a worker holds now (out of `bulk` while
    /// its batch runs, still queued work).
    bulk_held: usize,
    /// Interactive batches run in a row while a bulk job waited.
    since_bulk: usize,
    closed: bool,
}

/// Interactive batches a waiting bulk job yields to before it runs one of
/// its own: queries come first, but a stream of them that never lets the
/// queue empty (chat past the embedder's capacity) cannot starve an ingest
/// for ever — it gets one batch in `BULK_AFTER + 1`, and a query waits
/// behind at most one of its batches.
const BULK_AFTER: usize = 3;

struct Shared {
    queues: Mutex<Queues>,
    ready: Condvar,
}

/// Whitespace collapsed, trimmed, Unicode NFKC: the cache key.
pub fn normalise_text(text: &str) -> String {
    let nfkc: String = text.nfkc().collect();
    nfkc.split_whitespace().collect::<Vec<_>>().join(" ")
}

pub struct EmbedService {
    shared: Arc<Shared>,
    cache: Cache<String, Arc<Vec<f32>>>,
    model: Arc<OnnxEmbedder>,
    workers: Vec<std::thread::JoinHandle<()>>,
    runs: Arc<AtomicU64>,
    max_batch: usize,
    max_bulk_texts: usize,
}

fn lock(m: &Mutex<Queues>) -> std::sync::MutexGuard<'_, Queues> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl EmbedService {
    pub fn new(model: OnnxEmbedder, opts: ServiceOptions) -> Self {
        let model = Arc::new(model);
        let shared = Arc::new(Shared {
            queues: Mutex::new(Queues::default()),
            ready: Condvar::new(),
        });
        let runs = Arc::new(AtomicU64::new(0));
        let workers = (0..opts.workers.max(1))
            .map(|i| {
                let (shared, model, runs) = (shared.clone(), model.clone(), runs.clone());
                std::thread::Builder::new()
                    .name(format!("embed-{i}"))
                    .spawn(move || worker(&shared, &model, opts, &runs))
                    .unwrap_or_else(|e| panic!("cannot start an embedding thread: {e}"))
            })
            .collect();
        Self {
            shared,
            cache: Cache::builder()
                .max_capacity(opts.cache_entries)
                .time_to_live(opts.cache_ttl)
                .build(),
            model,
            workers,
            runs,
            max_batch: opts.max_batch.max(1),
            max_bulk_texts: opts.max_bulk_texts,
        }
    }

    pub fn dim(&self) -> usize {
        self.model.dim()
    }

    pub fn model(&self) -> &Arc<OnnxEmbedder> {
        &self.model
    }

    /// Model calls made so far (a merged batch counts once).
    pub fn runs(&self) -> u64 {
        self.runs.load(Ordering::Relaxed)
    }

    /// Embeds texts (as queries: fp32) on the worker pool. Small requests
    /// are merged with concurrent ones into one inference; requests larger
    /// than a batch go to the bulk queue, which yields to small requests
    /// between batches. The work stops (and this returns `Cancelled`) once
    /// `cancel` is set.
    pub async fn embed(
        &self,
        texts: Vec<String>,
        cancel: Cancel,
    ) -> Result<Vec<Vec<f32>>, StageError> {
        self.submit(texts, cancel, Kind::Query).await
    }

    /// Embeds passages for the index, with the passage model (int8
    /// compute when enabled); otherwise as [`EmbedService::embed`].
    pub async fn embed_passages(
        &self,
        texts: Vec<String>,
        cancel: Cancel,
    ) -> Result<Vec<Vec<f32>>, StageError> {
        self.submit(texts, cancel, Kind::Passage).await
    }

    async fn submit(
        &self,
        texts: Vec<String>,
        cancel: Cancel,
        kind: Kind,
    ) -> Result<Vec<Vec<f32>>, StageError> {
        if texts.is_empty() {
            return Ok(Vec::new());
        }
        let (reply, rx) = oneshot::channel();
        let job = Job {
            texts,
            kind,
            cancel,
            reply,
        };
        {
            let mut q = lock(&self.shared.queues);
            if q.closed {
                return Err(StageError::Backend("embedding service stopped".into()));
            }
            if job.texts.len() > self.max_batch {
                let queued: usize = q.bulk_held
                    + q.bulk
                        .iter()
                        .map(|b| b.order.len() - b.done.len())
                        .sum::<usize>();
                if queued > 0 && queued + job.texts.len() > self.max_bulk_texts {
                    return Err(StageError::Busy(format!(
                        "{queued} texts are waiting to be embedded"
                    )));
                }
                q.bulk.push_back(BulkJob::new(job));
            } else {
                q.interactive.push_back(job);
            }
        }
        self.shared.ready.notify_one();
        rx.await
            .unwrap_or_else(|_| Err(StageError::Backend("embedding worker died".into())))
    }

    /// Embeds one query, through the cache.
    pub async fn embed_query(
        &self,
        text: &str,
        cancel: Cancel,
    ) -> Result<(Arc<Vec<f32>>, bool), StageError> {
        let key = normalise_text(text);
        if key.is_empty() {
            return Err(StageError::InvalidInput("query is empty".into()));
        }
        if let Some(v) = self.cache.get(&key) {
            return Ok((v, true));
        }
        let mut v = self.embed(vec![key.clone()], cancel).await?;
        let v = Arc::new(v.pop().unwrap_or_default());
        self.cache.insert(key, v.clone());
        Ok((v, false))
    }

    pub fn cache_len(&self) -> u64 {
        self.cache.run_pending_tasks();
        self.cache.entry_count()
    }
}

#[async_trait]
impl Embedder for EmbedService {
    fn dim(&self) -> usize {
        self.model.dim()
    }

    async fn embed_query(&self, text: &str, cancel: Cancel) -> Result<Arc<Vec<f32>>, StageError> {
        EmbedService::embed_query(self, text, cancel)
            .await
            .map(|(v, _)| v)
    }

    async fn embed_texts(
        &self,
        texts: Vec<String>,
        cancel: Cancel,
    ) -> Result<Vec<Vec<f32>>, StageError> {
        self.embed(texts, cancel).await
    }

    async fn embed_passages(
        &self,
        texts: Vec<String>,
        cancel: Cancel,
    ) -> Result<Vec<Vec<f32>>, StageError> {
        EmbedService::embed_passages(self, texts, cancel).await
    }
}

impl Drop for EmbedService {
    fn drop(&mut self) {
        lock(&self.shared.queues).closed = true;
        self.shared.ready.notify_all();
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

enum Work {
    Interactive(Vec<Job>),
    /// A bulk job and the texts it had left when taken.
    Bulk(BulkJob, usize),
}

/// Takes interactive jobs first (merged with queued jobs of the same kind
/// up to `max_batch` texts, waiting at most `max_wait` for more), else one
/// bulk job.
fn next_work(shared: &Shared, opts: &ServiceOptions) -> Option<Work> {
    let mut q = lock(&shared.queues);
    loop {
        if q.since_bulk >= BULK_AFTER
            && let Some(b) = q.bulk.pop_front()
        {
            q.since_bulk = 0;
            let held = b.order.len() - b.done.len();
            q.bulk_held += held;
            return Some(Work::Bulk(b, held));
        }
        if let Some(first) = q.interactive.pop_front() {
            if !q.bulk.is_empty() {
                q.since_bulk += 1;
            }
            let mut n = first.texts.len();
            let first_kind = first.kind;
            let mut jobs = vec![first];
            let until = Instant::now() + opts.max_wait;
            loop {
                while n < opts.max_batch {
                    match q.interactive.front() {
                        Some(j) if j.kind == first_kind && n + j.texts.len() <= opts.max_batch => {
                            n += j.texts.len();
                            jobs.extend(q.interactive.pop_front());
                        }
                        _ => break,
                    }
                }
                let left = until.saturating_duration_since(Instant::now());
                if n >= opts.max_batch || left.is_zero() {
                    break;
                }
                q = shared
                    .ready
                    .wait_timeout(q, left)
                    .unwrap_or_else(PoisonError::into_inner)
                    .0;
            }
            return Some(Work::Interactive(jobs));
        }
        if let Some(b) = q.bulk.pop_front() {
            q.since_bulk = 0;
            let held = b.order.len() - b.done.len();
            q.bulk_held += held;
            return Some(Work::Bulk(b, held));
        }
        if q.closed {
            return None;
        }
        q = shared.ready.wait(q).unwrap_or_else(PoisonError::into_inner);
    }
}

fn worker(shared: &Shared, model: &OnnxEmbedder, opts: ServiceOptions, runs: &AtomicU64) {
    while let Some(work) = next_work(shared, &opts) {
        match work {
            Work::Interactive(jobs) => {
                // Drop jobs whose request has already given up.
                let (live, dead): (Vec<Job>, Vec<Job>) =
                    jobs.into_iter().partition(|j| !j.cancel.is_cancelled());
                for j in dead {
                    let _ = j.reply.send(Err(StageError::Cancelled));
                }
                if live.is_empty() {
                    continue;
                }
                let all: Vec<String> = live.iter().flat_map(|j| j.texts.iter().cloned()).collect();
                runs.fetch_add(1, Ordering::Relaxed);
                let kind = live[0].kind;
                match model.embed_kind(&all, &Cancel::new(), kind) {
                    Ok(mut vs) => {
                        for j in live.into_iter().rev() {
                            let part = vs.split_off(vs.len() - j.texts.len());
                            let _ = j.reply.send(Ok(part));
                        }
                    }
                    Err(e) => {
                        for j in live {
                            let _ = j.reply.send(Err(e.clone()));
                        }
                    }
                }
            }
            Work::Bulk(mut b, held) => {
                // Gives the job back to the queue (or lets it go) and what
                // it held with it, in one step.
                let release = |back: Option<BulkJob>| {
                    let mut q = lock(&shared.queues);
                    q.bulk_held -= held;
                    if let Some(b) = back {
                        // Back to the front: it resumes after any interactive work.
                        q.bulk.push_front(b);
                        drop(q);
                        shared.ready.notify_one();
                    }
                };
                if b.job.cancel.is_cancelled() {
                    release(None);
                    let _ = b.job.reply.send(Err(StageError::Cancelled));
                    continue;
                }
                let start = b.done.len();
                let end = (start + opts.max_batch).min(b.order.len());
                let batch: Vec<String> = b.order[start..end]
                    .iter()
                    .map(|&i| b.job.texts[i].clone())
                    .collect();
                runs.fetch_add(1, Ordering::Relaxed);
                match model.embed_kind(&batch, &b.job.cancel, b.job.kind) {
                    Ok(vs) => b.done.extend(vs),
                    Err(e) => {
                        release(None);
                        let _ = b.job.reply.send(Err(e));
                        continue;
                    }
                }
                if b.done.len() == b.order.len() {
                    release(None);
                    let reply = std::mem::replace(&mut b.job.reply, oneshot::channel().0);
                    let _ = reply.send(Ok(b.finish()));
                } else {
                    release(Some(b));
                }
            }
        }
    }
}
