//! The embedding service: a dedicated pool of worker threads behind an
//! async queue, with dynamic micro-batching across concurrent requests and
//! a bounded cache of query embeddings keyed by normalised text.

use crate::OnnxEmbedder;
use moka::sync::Cache;
use ragtime_core::{Cancel, Embedder, StageError};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex, PoisonError};
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
}

impl Default for ServiceOptions {
    fn default() -> Self {
        Self {
            workers: 1,
            max_batch: 32,
            max_wait: Duration::ZERO,
            cache_entries: 100_000,
            cache_ttl: Duration::from_secs(3600),
        }
    }
}

type Reply = oneshot::Sender<Result<Vec<Vec<f32>>, StageError>>;

struct Job {
    texts: Vec<String>,
    cancel: Cancel,
    reply: Reply,
}

/// Whitespace collapsed, trimmed, Unicode NFKC: the cache key.
pub fn normalise_text(text: &str) -> String {
    let nfkc: String = text.nfkc().collect();
    nfkc.split_whitespace().collect::<Vec<_>>().join(" ")
}

pub struct EmbedService {
    tx: Mutex<Option<Sender<Job>>>,
    cache: Cache<String, Arc<Vec<f32>>>,
    model: Arc<OnnxEmbedder>,
    workers: Vec<std::thread::JoinHandle<()>>,
    runs: Arc<AtomicU64>,
}

impl EmbedService {
    pub fn new(model: OnnxEmbedder, opts: ServiceOptions) -> Self {
        let model = Arc::new(model);
        let (tx, rx) = mpsc::channel::<Job>();
        let rx = Arc::new(Mutex::new(rx));
        let runs = Arc::new(AtomicU64::new(0));
        let workers = (0..opts.workers.max(1))
            .map(|i| {
                let (rx, model, runs) = (rx.clone(), model.clone(), runs.clone());
                std::thread::Builder::new()
                    .name(format!("embed-{i}"))
                    .spawn(move || worker(&rx, &model, opts, &runs))
                    .unwrap_or_else(|e| panic!("cannot start an embedding thread: {e}"))
            })
            .collect();
        Self {
            tx: Mutex::new(Some(tx)),
            cache: Cache::builder()
                .max_capacity(opts.cache_entries)
                .time_to_live(opts.cache_ttl)
                .build(),
            model,
            workers,
            runs,
        }
    }

    /// Model calls made so far (a merged batch counts once).
    pub fn runs(&self) -> u64 {
        self.runs.load(Ordering::Relaxed)
    }

    pub fn dim(&self) -> usize {
        self.model.dim()
    }

    pub fn model(&self) -> &Arc<OnnxEmbedder> {
        &self.model
    }

    /// Embeds texts on the worker pool. The work stops (and this returns
    /// `Cancelled`) once `cancel` is set; dropping the future sets nothing,
    /// so pass the stage's cancel flag.
    pub async fn embed(
        &self,
        texts: Vec<String>,
        cancel: Cancel,
    ) -> Result<Vec<Vec<f32>>, StageError> {
        if texts.is_empty() {
            return Ok(Vec::new());
        }
        let (reply, rx) = oneshot::channel();
        let sent = self
            .tx
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
            .map(|tx| {
                tx.send(Job {
                    texts,
                    cancel,
                    reply,
                })
                .is_ok()
            });
        if sent != Some(true) {
            return Err(StageError::Backend("embedding service stopped".into()));
        }
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

impl Drop for EmbedService {
    fn drop(&mut self) {
        self.tx
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

fn worker(rx: &Mutex<Receiver<Job>>, model: &OnnxEmbedder, opts: ServiceOptions, runs: &AtomicU64) {
    loop {
        // Take a first job, then gather more for up to `max_wait`.
        let mut jobs = Vec::new();
        {
            let rx = rx.lock().unwrap_or_else(PoisonError::into_inner);
            match rx.recv() {
                Ok(j) => jobs.push(j),
                Err(_) => return,
            }
            let until = Instant::now() + opts.max_wait;
            let mut n: usize = jobs[0].texts.len();
            while n < opts.max_batch {
                let left = until.saturating_duration_since(Instant::now());
                let next = if left.is_zero() {
                    rx.try_recv().ok()
                } else {
                    match rx.recv_timeout(left) {
                        Ok(j) => Some(j),
                        Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => None,
                    }
                };
                let Some(j) = next else { break };
                n += j.texts.len();
                jobs.push(j);
            }
        }
        // Drop jobs whose request has already given up.
        let (live, dead): (Vec<Job>, Vec<Job>) =
            jobs.into_iter().partition(|j| !j.cancel.is_cancelled());
        for j in dead {
            let _ = j.reply.send(Err(StageError::Cancelled));
        }
        if live.is_empty() {
            continue;
        }
        if live.len() == 1 || live.iter().map(|j| j.texts.len()).sum::<usize>() > opts.max_batch {
            // One big job (or too much to merge): run each on its own.
            for j in live {
                runs.fetch_add(1, Ordering::Relaxed);
                let r = model.embed(&j.texts, &j.cancel);
                let _ = j.reply.send(r);
            }
            continue;
        }
        // Several small jobs: one inference for all of them.
        let all: Vec<String> = live.iter().flat_map(|j| j.texts.iter().cloned()).collect();
        runs.fetch_add(1, Ordering::Relaxed);
        match model.embed(&all, &Cancel::new()) {
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
}
