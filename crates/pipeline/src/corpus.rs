//! The corpus: the store, the embedder and the indexes together. Ingestion
//! writes the store first (the write is acknowledged only once committed)
//! and then the in-memory indexes, which are loaded at start from their
//! snapshots brought up to the store's change log, or built from the
//! store, so a crash loses nothing acknowledged and leaves no half-indexed
//! document.

use crate::snapshots::{self, SnapshotConfig, SnapshotMeta};
use crate::stages::IndexRetriever;
use ragtime_core::{Cancel, Chunk, Embedder, Retriever, StageError, Tenant};
use ragtime_embed::Chunker;
use ragtime_retrieve::{CollectionIndex, IndexError, Indexes, LexicalUnit};
use ragtime_store::{
    CollectionRecord, Created, Dropped, IndexChunk, JobStep, Limits, NewChunk, NewDocument, Store,
    StoreError, Upsert, WriteReceipt,
};
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use thiserror::Error;

#[derive(Debug, Error)]
pub enum CorpusError {
    #[error("{0}")]
    Store(#[from] StoreError),
    #[error("{0}")]
    Index(#[from] IndexError),
    #[error("embedding: {0}")]
    Embed(StageError),
    #[error("unknown collection {0:?}")]
    UnknownCollection(String),
}

pub use ragtime_core::IngestDoc;

/// What happened to one document.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ingested {
    pub id: String,
    pub status: Upsert,
    pub chunks: usize,
}

/// A document on its way in: its chunks and their vectors, unless its
/// content is what the store already holds.
struct PendingDoc {
    doc: IngestDoc,
    metadata: String,
    hash: String,
    unchanged: bool,
    pieces: Vec<ragtime_embed::TextChunk>,
    vectors: Vec<Vec<f32>>,
}

impl PendingDoc {
    /// The document as the store takes it (its vectors moved out).
    fn new_document(&mut self) -> NewDocument {
        let vectors = std::mem::take(&mut self.vectors);
        let chunks = self.pieces.iter().zip(vectors).enumerate();
        NewDocument {
            external_id: self.doc.id.clone(),
            title: self.doc.title.clone(),
            metadata: self.metadata.clone(),
            content_hash: self.hash.clone(),
            chunks: chunks
                .map(|(i, (c, embedding))| NewChunk {
                    position: i as i32,
                    section: self.doc.section_at(c.anchor).to_owned(),
                    text: c.text.clone(),
                    tokens: c.tokens as i32,
                    embedding,
                })
                .collect(),
        }
    }
}

/// A stored document's chunks, with their vectors, as the indexes take them.
fn limits(owner: &str, q: Quotas) -> Limits<'_> {
    Limits {
        owner,
        max_collections: q.max_collections,
        max_documents: q.max_documents,
        max_chunks: q.max_chunks,
    }
}

fn index_entries(
    doc: IngestDoc,
    receipt: &WriteReceipt,
    new: NewDocument,
) -> Vec<(Chunk, Vec<f32>)> {
    let meta = Arc::new(Value::Object(doc.metadata));
    receipt
        .chunk_ids
        .iter()
        .zip(new.chunks)
        .map(|(id, c)| {
            let chunk = Chunk {
                chunk_id: *id,
                document_id: receipt.document_id,
                external_id: doc.id.clone(),
                position: c.position,
                title: doc.title.clone(),
                section: c.section,
                metadata: meta.clone(),
                text: c.text,
            };
            (chunk, c.embedding)
        })
        .collect()
}

/// Documents chunked and embedded by [`Corpus::prepare`], not yet written.
pub struct Prepared {
    collection: String,
    coll_id: i64,
    pending: Vec<PendingDoc>,
    job: Option<JobStep>,
}

impl Prepared {
    /// Counts these documents as `step` of a job, in their transaction.
    pub fn for_job(mut self, step: JobStep) -> Self {
        self.job = Some(step);
        self
    }
}

/// Chunking settings (they are part of the content hash, so changing them
/// re-embeds documents on their next ingest).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkParams {
    pub max_tokens: usize,
    pub overlap: usize,
}

/// The chunking rules' version, part of the content hash: a document
/// stored under older rules is chunked and embedded again on its next
/// ingest.
const CHUNKING: &str = "s2";

/// What a tenant may store unless the admin set its own (`[limits]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quotas {
    pub max_collections: i64,
    pub max_documents: i64,
    pub max_chunks: i64,
}

impl Default for Quotas {
    /// Far past what one user's corpus holds: they stop a runaway client.
    fn default() -> Self {
        Self {
            max_collections: 100_000,
            max_documents: 10_000_000,
            max_chunks: 100_000_000,
        }
    }
}

/// A collection as `GET /v1/collections` shows it.
#[derive(Debug, Clone)]
pub struct CollectionInfo {
    pub record: CollectionRecord,
    /// The memory its indexes hold, when they are loaded.
    pub index_bytes: Option<usize>,
}

/// Cancels its work when dropped.
struct CancelOnDrop(Cancel);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.cancel();
    }
}

/// Stored chunks as an index takes them.
pub fn index_items(chunks: Vec<IndexChunk>) -> Vec<(Chunk, Vec<f32>)> {
    chunks
        .into_iter()
        .map(|c| {
            let metadata =
                Arc::new(serde_json::from_str(&c.metadata).unwrap_or(Value::Object(Map::new())));
            let chunk = Chunk {
                chunk_id: c.chunk_id,
                document_id: c.document_id,
                external_id: c.external_id,
                position: c.position,
                title: c.title,
                section: c.section,
                metadata,
                text: c.text,
            };
            (chunk, c.embedding)
        })
        .collect()
}

pub struct Corpus {
    pub store: Store,
    pub embedder: Arc<dyn Embedder>,
    pub indexes: Indexes,
    chunker: Chunker,
    params: ChunkParams,
    /// One writer at a time per collection: its store rows and its
    /// indexes change together. A load, a save, a write, a removal and the
    /// follower's change of one collection take its lock; other
    /// collections go on meanwhile.
    locks: std::sync::Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// One follower pass at a time.
    follow_lock: tokio::sync::Mutex<()>,
    /// The corpus version the indexes reflect (the ingest log's last id):
    /// cached answers are only reused within one version.
    version: std::sync::atomic::AtomicI64,
    quotas: Quotas,
    /// Collections (the largest first) loaded by [`Corpus::rebuild`]; the
    /// rest load at their first request.
    preload: usize,
    lexical_unit: LexicalUnit,
    /// The ingest-log entry the follower has reached.
    applied: std::sync::atomic::AtomicI64,
    /// Log entries of this process's own writes the follower has not
    /// reached yet: already in the indexes, so it passes them by.
    own: std::sync::Mutex<std::collections::HashSet<i64>>,
    /// Loaded collections by their store id (the log names collections by id).
    loaded_ids: std::sync::Mutex<HashMap<i64, String>>,
    /// Whether a follower runs (only then are own writes remembered).
    following: std::sync::atomic::AtomicBool,
    /// How far behind the store the follower was at its last look.
    lag: std::sync::Mutex<Lag>,
    /// When the follower last finished a pass (or the indexes were loaded).
    last_pass: std::sync::Mutex<Instant>,
    /// Where loaded collections' indexes are saved (none: never).
    snapshots: Option<SnapshotConfig>,
    /// What was last saved or loaded of each collection, by its store id.
    saved: std::sync::Mutex<HashMap<i64, SavedState>>,
    /// The change-log position of each collection's snapshot on disk, by
    /// its store id: the log is kept from the lowest on (a start replays
    /// what came after it).
    snapshot_positions: std::sync::Mutex<HashMap<i64, i64>>,
    /// Collections loaded from a snapshot since start.
    snapshot_loads: std::sync::atomic::AtomicUsize,
}

/// A loaded collection's indexes as its snapshot holds them.
struct SavedState {
    /// The loaded index the snapshot was written from or read into.
    index: std::sync::Weak<CollectionIndex>,
    /// Its version then.
    version: u64,
    at: Instant,
}

/// Change-log entries of one collection replayed over its snapshot at
/// most; past this, loading from the store is as quick.
const REPLAY_MAX: i64 = 2000;

/// Entries written this long before a snapshot's position are replayed
/// too (see [`ragtime_store::Store::collection_log_recent`]).
const REPLAY_MARGIN_MS: i64 = 30_000;

/// Why a snapshot was not used.
enum SnapshotFault {
    /// It cannot be trusted: removed, the collection loads from the store.
    Untrusted(String),
    /// The store could not be read: the snapshot is kept.
    Store(StoreError),
}

impl From<StoreError> for SnapshotFault {
    fn from(e: StoreError) -> Self {
        Self::Store(e)
    }
}

/// How far the indexes are behind the store's change log.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Lag {
    /// Log entries not applied yet.
    pub entries: i64,
    /// Age of the oldest of them (0 when caught up).
    pub seconds: f64,
    /// The log entry the indexes reflect.
    pub applied: i64,
    /// Since the follower last finished a pass (or the indexes loaded): a
    /// follower stuck behind a lock or a store that does not answer shows
    /// here while `entries` and `seconds` still read as at its last look.
    pub since_pass: Duration,
}

/// Log entries one look at the store applies at most.
const FOLLOW_BATCH: i64 = 1000;

fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The first 16 hex digits of the SHA-256 of `parts`, each ended by 0xff
/// (which no UTF-8 text holds), so the parts cannot run into each other.
fn digest(parts: &[&[u8]]) -> String {
    let mut h = Sha256::new();
    for p in parts {
        h.update(p);
        h.update([0xff]);
    }
    h.finalize()[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The text embedded for a chunk: where it stands (its document's title
/// and section path), then the chunk.
fn embed_text(title: &str, section: &str, chunk: &str) -> String {
    let at = ragtime_core::heading_of(title, section);
    if at.is_empty() {
        chunk.to_owned()
    } else {
        format!("{at}\n{chunk}")
    }
}

impl Corpus {
    /// `chunker` splits text with the embedding model's tokenizer.
    pub fn new(
        store: Store,
        embedder: Arc<dyn Embedder>,
        chunker: Chunker,
        params: ChunkParams,
    ) -> Self {
        let indexes = Indexes::new(embedder.dim(), ragtime_retrieve::DenseParams::default());
        Self {
            store,
            embedder,
            indexes,
            chunker,
            params,
            locks: std::sync::Mutex::default(),
            follow_lock: tokio::sync::Mutex::new(()),
            version: std::sync::atomic::AtomicI64::new(0),
            quotas: Quotas::default(),
            preload: usize::MAX,
            lexical_unit: LexicalUnit::Auto,
            applied: std::sync::atomic::AtomicI64::new(0),
            own: std::sync::Mutex::default(),
            loaded_ids: std::sync::Mutex::default(),
            following: std::sync::atomic::AtomicBool::new(false),
            lag: std::sync::Mutex::default(),
            last_pass: std::sync::Mutex::new(Instant::now()),
            snapshots: None,
            saved: std::sync::Mutex::default(),
            snapshot_positions: std::sync::Mutex::default(),
            snapshot_loads: std::sync::atomic::AtomicUsize::new(0),
        }
    }

    /// Collections loaded from a snapshot since start.
    pub fn snapshot_loads(&self) -> usize {
        self.snapshot_loads
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Saves loaded collections' indexes under `config.dir` and loads them
    /// from there (see [`crate::snapshots`]).
    pub fn with_snapshots(mut self, config: SnapshotConfig) -> Self {
        self.snapshots = Some(config);
        self
    }

    /// Quotas for tenants without their own.
    pub fn with_quotas(mut self, quotas: Quotas) -> Self {
        self.quotas = quotas;
        self
    }

    /// How many collections [`Corpus::rebuild`] loads (the largest first).
    /// What BM25 ranks documents by in searches.
    pub fn with_lexical_unit(mut self, unit: LexicalUnit) -> Self {
        self.lexical_unit = unit;
        self
    }

    pub fn with_preload(mut self, collections: usize) -> Self {
        self.preload = collections;
        self
    }

    /// The quotas `tenant` writes under — its own where the admin set them,
    /// the configured ones otherwise — and whether it has its own.
    pub async fn quotas_of(&self, tenant: &Tenant) -> Result<(Quotas, bool), CorpusError> {
        let own = self.store.tenant_quota(tenant.name()).await?;
        let (o, d) = (own.unwrap_or_default(), self.quotas);
        let quotas = Quotas {
            max_collections: o.max_collections.unwrap_or(d.max_collections),
            max_documents: o.max_documents.unwrap_or(d.max_documents),
            max_chunks: o.max_chunks.unwrap_or(d.max_chunks),
        };
        Ok((quotas, own.is_some()))
    }

    /// The owner prefix and quotas a write to stored collection `name` runs
    /// under.
    async fn limits_of(&self, name: &str) -> Result<(String, Quotas), CorpusError> {
        let (tenant, _) = Tenant::of_collection(name);
        Ok((tenant.collection_prefix(), self.quotas_of(&tenant).await?.0))
    }

    /// The lock of collection `name` (made at its first use).
    fn collection_lock(&self, name: &str) -> Arc<tokio::sync::Mutex<()>> {
        lock(&self.locks)
            .entry(name.to_owned())
            .or_default()
            .clone()
    }

    /// Waits for collection `name`'s lock (see [`Corpus`]'s `locks`).
    async fn lock_collection(&self, name: &str) -> tokio::sync::OwnedMutexGuard<()> {
        self.collection_lock(name).lock_owned().await
    }

    /// The corpus version the indexes reflect; it changes with every
    /// ingest or delete that changed something.
    pub fn version(&self) -> i64 {
        self.version.load(std::sync::atomic::Ordering::Acquire)
    }

    fn advance(&self, version: i64) {
        self.version
            .fetch_max(version, std::sync::atomic::Ordering::AcqRel);
    }

    /// Loads collections' indexes (from their snapshots or the store), the
    /// largest first, up to the preload count (every one by default); the
    /// rest load at their first request. Returns the chunks indexed.
    pub async fn rebuild(&self) -> Result<usize, CorpusError> {
        let version = self.store.corpus_version().await?;
        // What loads from here on is at least this new: the follower
        // starts after it.
        self.applied
            .fetch_max(version, std::sync::atomic::Ordering::AcqRel);
        let mut all = self.store.list_collections(None).await?;
        if let Some(cfg) = &self.snapshots {
            snapshots::retain(&cfg.dir, &all.iter().map(|c| c.id).collect());
            let mut at = lock(&self.snapshot_positions);
            for c in &all {
                if let Some((_, meta)) = snapshots::latest(&cfg.dir, c.id) {
                    at.insert(c.id, meta.log_position);
                }
            }
        }
        all.sort_by(|a, b| b.chunks.cmp(&a.chunks).then(a.name.cmp(&b.name)));
        let mut n = 0;
        for c in all.into_iter().take(self.preload) {
            let _w = self.lock_collection(&c.name).await;
            // Looked up again under the lock: it may have been removed,
            // or removed and made again, since the list was read.
            let Some(id) = self.store.collection_id(&c.name).await? else {
                continue;
            };
            let (idx, _) = self.load_locked(&c.name, id).await?;
            n += idx.len();
        }
        self.advance(version);
        *lock(&self.last_pass) = Instant::now();
        Ok(n)
    }

    /// A stored collection's indexes, loaded from the store unless they
    /// are in memory, and how long the load took. The caller holds the
    /// collection's lock, so no write lands between the read and the
    /// index, and has read `coll_id` under it, so the follower has not yet
    /// passed a removal of that collection.
    async fn load_locked(
        &self,
        name: &str,
        coll_id: i64,
    ) -> Result<(Arc<CollectionIndex>, Option<Duration>), CorpusError> {
        if let Some(idx) = self.indexes.get(name) {
            if lock(&self.loaded_ids)
                .get(&coll_id)
                .is_some_and(|n| n == name)
            {
                return Ok((idx, None));
            }
            // Loaded under another id: the collection of this name was
            // removed and made again. The old one's indexes are not its.
            self.indexes.remove(name);
            lock(&self.loaded_ids).retain(|_, n| n != name);
        }
        let started = Instant::now();
        // Named before the store is read: the follower then waits for this
        // load (the lock) before it passes an entry of the collection.
        lock(&self.loaded_ids).insert(coll_id, name.to_owned());
        match self.read_indexes(name, coll_id).await {
            Ok(idx) => {
                self.indexes.insert(name, idx.clone());
                Ok((idx, Some(started.elapsed())))
            }
            Err(e) => {
                lock(&self.loaded_ids).remove(&coll_id);
                Err(e)
            }
        }
    }

    /// A collection's indexes from its snapshot or else the store.
    async fn read_indexes(
        &self,
        name: &str,
        coll_id: i64,
    ) -> Result<Arc<CollectionIndex>, CorpusError> {
        if let Some(idx) = self.load_snapshot(name, coll_id).await? {
            return Ok(idx);
        }
        let items = index_items(self.store.index_chunks_in(coll_id).await?);
        let idx = Arc::new(CollectionIndex::new(
            self.indexes.dim(),
            self.indexes.params(),
        )?);
        tokio::task::block_in_place(|| idx.add(items))?;
        lock(&self.saved).remove(&coll_id);
        Ok(idx)
    }

    /// The collection's indexes from its snapshot, brought up to the store
    /// by replaying its change-log entries after it; `None` (and the
    /// snapshot removed when it cannot be trusted) to load from the store.
    async fn load_snapshot(
        &self,
        name: &str,
        coll_id: i64,
    ) -> Result<Option<Arc<CollectionIndex>>, CorpusError> {
        let Some(cfg) = self.snapshots.as_ref() else {
            return Ok(None);
        };
        let Some((dir, meta)) = snapshots::latest(&cfg.dir, coll_id) else {
            return Ok(None);
        };
        let started = Instant::now();
        match self.open_snapshot(&dir, &meta).await {
            Ok(Some((idx, replayed))) => {
                self.snapshot_loads
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                tracing::info!(
                    collection = %name,
                    chunks = idx.len(),
                    log_position = meta.log_position,
                    replayed,
                    took_ms = started.elapsed().as_millis() as u64,
                    "indexes loaded from their snapshot"
                );
                Ok(Some(idx))
            }
            Ok(None) => Ok(None),
            Err(SnapshotFault::Untrusted(why)) => {
                tracing::warn!(collection = %name, path = %dir.display(), %why, "snapshot not used; loading from the store");
                snapshots::remove(&cfg.dir, coll_id);
                Ok(None)
            }
            Err(SnapshotFault::Store(e)) => Err(e.into()),
        }
    }

    /// Reads a snapshot and replays what came after it; `Ok(None)` when too
    /// much did (the snapshot stays for the next save to replace).
    async fn open_snapshot(
        &self,
        dir: &std::path::Path,
        meta: &SnapshotMeta,
    ) -> Result<Option<(Arc<CollectionIndex>, usize)>, SnapshotFault> {
        let untrusted = SnapshotFault::Untrusted;
        if meta.dim != self.indexes.dim() {
            return Err(untrusted(format!(
                "saved with {}-dimensional vectors, the embedder makes {}",
                meta.dim,
                self.indexes.dim()
            )));
        }
        let version = self.store.corpus_version().await?;
        let entry = self.store.log_entry(meta.log_position).await?;
        let same_store = match entry {
            None => meta.log_position == 0,
            Some(e) => e.at_ms == meta.log_at_ms,
        };
        if !same_store || meta.log_position > version {
            return Err(untrusted(format!(
                "log position {} is not this store's",
                meta.log_position
            )));
        }
        if meta.log_position + 1 < self.store.log_trimmed_below().await? {
            return Err(untrusted(format!(
                "the change log after position {} was trimmed",
                meta.log_position
            )));
        }
        let mut after = self
            .store
            .collection_log_since(meta.collection_id, meta.log_position, REPLAY_MAX + 1)
            .await?;
        if after.len() as i64 > REPLAY_MAX {
            return Ok(None);
        }
        let recent = self
            .store
            .collection_log_recent(
                meta.collection_id,
                meta.log_position,
                meta.log_at_ms - REPLAY_MARGIN_MS,
                REPLAY_MAX,
            )
            .await?;
        after.splice(0..0, recent);
        snapshots::check(dir, meta).map_err(untrusted)?;
        // Left behind if the process dies loading (hnsw_rs exits on a
        // truncated file): the next start then refuses the snapshot.
        let loading = snapshots::Loading::begin(dir).map_err(untrusted)?;
        let (dir, dim, params) = (dir.to_owned(), self.indexes.dim(), self.indexes.params());
        // On a blocking thread: a panic in the graph's loader is then an
        // error here, not the process's end.
        let idx = tokio::task::spawn_blocking(move || CollectionIndex::load(&dir, dim, params))
            .await
            .map_err(|e| untrusted(format!("loading panicked: {e}")))?
            .map_err(|e| untrusted(e.to_string()))?;
        drop(loading);
        if idx.len() != meta.chunks || idx.documents() != meta.documents {
            return Err(untrusted(format!(
                "holds {} chunks of {} documents, its record says {} of {}",
                idx.len(),
                idx.documents(),
                meta.chunks,
                meta.documents
            )));
        }
        let idx = Arc::new(idx);
        self.mark_saved(meta.collection_id, &idx, idx.version());
        lock(&self.snapshot_positions).insert(meta.collection_id, meta.log_position);
        for e in &after {
            if e.op == "upsert" || e.op == "delete" {
                match self.apply_document(&idx, e).await {
                    Ok(()) => {}
                    Err(CorpusError::Store(e)) => return Err(SnapshotFault::Store(e)),
                    Err(e) => return Err(untrusted(e.to_string())),
                }
            }
        }
        Ok(Some((idx, after.len())))
    }

    /// Saves the snapshot of every loaded collection of at least
    /// `min_chunks` chunks that has none yet, or that changed since its
    /// last one was saved `every` ago. Each save holds its collection's
    /// lock (no write to it lands while it writes; searches and other
    /// collections' writes go on). Returns how many were saved.
    pub async fn save_snapshots(&self) -> Result<usize, CorpusError> {
        let Some(cfg) = &self.snapshots else {
            return Ok(0);
        };
        let ids: Vec<(i64, String)> = lock(&self.loaded_ids)
            .iter()
            .map(|(id, name)| (*id, name.clone()))
            .collect();
        let mut n = 0;
        for (coll_id, name) in ids {
            let due = |idx: &Arc<CollectionIndex>| {
                idx.len() >= cfg.min_chunks
                    && match lock(&self.saved).get(&coll_id) {
                        None => true,
                        Some(s) if !std::ptr::eq(s.index.as_ptr(), Arc::as_ptr(idx)) => true,
                        Some(s) => s.version != idx.version() && s.at.elapsed() >= cfg.every,
                    }
            };
            if !self.indexes.get(&name).is_some_and(|idx| due(&idx)) {
                continue;
            }
            let _w = self.lock_collection(&name).await;
            // Looked at again under the lock: it may have gone meanwhile.
            let Some(idx) = self.indexes.get(&name).filter(|idx| due(idx)) else {
                continue;
            };
            if lock(&self.loaded_ids).get(&coll_id) != Some(&name) {
                continue;
            }
            // Every change up to the follower's position is in the index
            // (and this process's own later writes, which a load replays
            // again, changing nothing).
            let position = self.applied.load(std::sync::atomic::Ordering::Acquire);
            let version = idx.version();
            let started = Instant::now();
            let saved = match self.store.log_entry(position).await {
                Ok(entry) => {
                    let meta = SnapshotMeta {
                        format: snapshots::FORMAT,
                        collection_id: coll_id,
                        collection: name.clone(),
                        log_position: position,
                        log_at_ms: entry.map_or(0, |e| e.at_ms),
                        dim: self.indexes.dim(),
                        chunks: 0,
                        documents: 0,
                        saved_at_ms: ragtime_store::now_ms(),
                        files: Default::default(),
                    };
                    let (root, index) = (cfg.dir.clone(), idx.clone());
                    tokio::task::spawn_blocking(move || snapshots::save(&root, &index, meta))
                        .await
                        .unwrap_or_else(|e| {
                            Err(IndexError::Snapshot(format!("saving panicked: {e}")))
                        })
                        .map_err(|e| e.to_string())
                }
                Err(e) => Err(e.to_string()),
            };
            match saved {
                Ok(meta) => {
                    tracing::info!(
                        collection = %name,
                        chunks = meta.chunks,
                        log_position = meta.log_position,
                        took_ms = started.elapsed().as_millis() as u64,
                        "indexes saved"
                    );
                    self.mark_saved(coll_id, &idx, version);
                    lock(&self.snapshot_positions).insert(coll_id, meta.log_position);
                    n += 1;
                }
                Err(e) => {
                    tracing::warn!(collection = %name, error = %e, "saving the indexes failed");
                    // Marked as saved at another version: tried again
                    // after `every`, not at the next look.
                    self.mark_saved(coll_id, &idx, version.wrapping_sub(1));
                }
            }
        }
        Ok(n)
    }

    /// An existing collection as the pipeline's retriever, and how long
    /// loading its indexes took when this request loaded them.
    pub async fn retriever(
        &self,
        name: &str,
    ) -> Result<(Arc<dyn Retriever>, Option<Duration>), CorpusError> {
        let (idx, loaded) = self.collection_loaded(name).await?;
        Ok((Arc::new(IndexRetriever(idx, self.lexical_unit)), loaded))
    }

    /// The index of an existing collection (404 material when missing).
    pub async fn collection(&self, name: &str) -> Result<Arc<CollectionIndex>, CorpusError> {
        Ok(self.collection_loaded(name).await?.0)
    }

    async fn collection_loaded(
        &self,
        name: &str,
    ) -> Result<(Arc<CollectionIndex>, Option<Duration>), CorpusError> {
        if let Some(idx) = self.indexes.get(name) {
            return Ok((idx, None));
        }
        let _w = self.lock_collection(name).await;
        let Some(id) = self.store.collection_id(name).await? else {
            return Err(CorpusError::UnknownCollection(name.to_owned()));
        };
        self.load_locked(name, id).await
    }

    /// Creates a collection; `Created::Existing` when it was there already.
    /// Refused past its tenant's `max_collections`.
    pub async fn create_collection(
        &self,
        name: &str,
        description: &str,
    ) -> Result<Created, CorpusError> {
        let (owner, q) = self.limits_of(name).await?;
        let _w = self.lock_collection(name).await;
        let limits = limits(&owner, q);
        Ok(self
            .store
            .create_collection(name, description, Some(limits))
            .await?)
    }

    /// Removes a collection: its documents, chunks and indexes; cached
    /// answers go with the corpus version. `None` if there was none.
    pub async fn drop_collection(&self, name: &str) -> Result<Option<Dropped>, CorpusError> {
        let _w = self.lock_collection(name).await;
        let Some(id) = self.store.collection_id(name).await? else {
            return Ok(None);
        };
        let dropped = self.store.drop_collection(id).await?;
        self.indexes.remove(name);
        lock(&self.loaded_ids).remove(&id);
        self.forget_snapshot(id);
        if let Some(d) = &dropped {
            self.remember(d.version);
            self.advance(d.version);
        }
        Ok(dropped)
    }

    /// Notes that the collection's snapshot holds `index` at `version` as
    /// of now.
    fn mark_saved(&self, coll_id: i64, index: &Arc<CollectionIndex>, version: u64) {
        lock(&self.saved).insert(
            coll_id,
            SavedState {
                index: Arc::downgrade(index),
                version,
                at: Instant::now(),
            },
        );
    }

    /// Removes a dropped collection's snapshot.
    fn forget_snapshot(&self, coll_id: i64) {
        lock(&self.saved).remove(&coll_id);
        lock(&self.snapshot_positions).remove(&coll_id);
        if let Some(cfg) = &self.snapshots {
            snapshots::remove(&cfg.dir, coll_id);
        }
    }

    /// What every collection holds together, how many are loaded and the
    /// memory their indexes take (from the stored counts and the loaded
    /// indexes, without listing collections).
    pub async fn totals(&self) -> Result<(ragtime_store::Usage, usize, usize), CorpusError> {
        let usage = self.store.total_usage().await?;
        let loaded = self.indexes.loaded();
        let bytes = loaded.iter().map(|(_, i)| i.memory_bytes()).sum();
        Ok((usage, loaded.len(), bytes))
    }

    /// One collection by its stored name, with its index memory.
    pub async fn collection_info(&self, name: &str) -> Result<Option<CollectionInfo>, CorpusError> {
        Ok(self
            .store
            .collection(name)
            .await?
            .map(|record| CollectionInfo {
                index_bytes: self.indexes.get(name).map(|i| i.memory_bytes()),
                record,
            }))
    }

    /// An owner's collections (every one for `None`) with their index memory.
    pub async fn collections(
        &self,
        owner: Option<&str>,
    ) -> Result<Vec<CollectionInfo>, CorpusError> {
        let records = self.store.list_collections(owner).await?;
        Ok(records
            .into_iter()
            .map(|record| CollectionInfo {
                index_bytes: self.indexes.get(&record.name).map(|i| i.memory_bytes()),
                record,
            })
            .collect())
    }

    /// Notes a log entry of this process's own write for the follower.
    fn remember(&self, entry: i64) {
        if self.following.load(std::sync::atomic::Ordering::Acquire) {
            lock(&self.own).insert(entry);
        }
    }

    /// Applies the store's changes made since the last call by anyone
    /// else — another replica, `ragtime ingest` — to the loaded indexes, in
    /// the log's order, and moves the corpus version with them (so no
    /// cached answer older than an applied change is served). Collections
    /// not loaded need nothing: they load the store as it is. Returns the
    /// log entries passed.
    pub async fn follow(&self) -> Result<usize, CorpusError> {
        use std::sync::atomic::Ordering;
        let _pass = self.follow_lock.lock().await;
        self.following.store(true, Ordering::Release);
        self.catch_up_if_trimmed().await?;
        let after = self.applied.load(Ordering::Acquire);
        let entries = self.store.log_since(after, FOLLOW_BATCH).await?;
        for e in &entries {
            // Under the collection's lock: a load or a write of it under
            // way ends first (a load names its collection here before it
            // reads the store, so none misses an entry it did not see).
            let name = lock(&self.loaded_ids).get(&e.collection_id).cloned();
            let _c = match &name {
                Some(name) => Some(self.lock_collection(name).await),
                None => None,
            };
            if !lock(&self.own).remove(&e.id) {
                self.apply(e).await?;
            }
            self.applied.fetch_max(e.id, Ordering::AcqRel);
            self.advance(e.id);
        }
        let applied = self.applied.load(Ordering::Acquire);
        let mut lag = Lag {
            applied,
            ..Lag::default()
        };
        if entries.len() as i64 == FOLLOW_BATCH {
            // More may wait: how many, and since when.
            if let Some(next) = self.store.log_since(applied, 1).await?.first() {
                let now = ragtime_store::now_ms();
                lag.entries = self.store.corpus_version().await? - applied;
                lag.seconds = (now - next.at_ms).max(0) as f64 / 1000.0;
            }
        }
        *lock(&self.lag) = lag;
        *lock(&self.last_pass) = Instant::now();
        Ok(entries.len())
    }

    /// Entries this follower has not applied were trimmed from the log (it
    /// fell behind every other replica for longer than they are kept):
    /// every loaded collection is dropped, to load the store as it is now
    /// at its next request, and the follower goes on from the log's end.
    async fn catch_up_if_trimmed(&self) -> Result<(), CorpusError> {
        use std::sync::atomic::Ordering;
        let below = self.store.log_trimmed_below().await?;
        let applied = self.applied.load(Ordering::Acquire);
        if applied + 1 >= below {
            return Ok(());
        }
        let version = self.store.corpus_version().await?;
        let names: Vec<String> = lock(&self.loaded_ids).values().cloned().collect();
        tracing::warn!(
            applied,
            trimmed_below = below,
            collections = names.len(),
            "changes this replica had not applied were trimmed from the log: its collections reload from the store"
        );
        for name in names {
            let _c = self.lock_collection(&name).await;
            self.indexes.remove(&name);
            lock(&self.loaded_ids).retain(|_, n| *n != name);
        }
        lock(&self.own).clear();
        self.applied.fetch_max(version, Ordering::AcqRel);
        self.advance(version);
        Ok(())
    }

    /// The change-log position this replica needs kept: what its follower
    /// has applied, or an older position one of its snapshots on disk
    /// would replay from.
    pub fn position(&self) -> i64 {
        let applied = self.applied.load(std::sync::atomic::Ordering::Acquire);
        lock(&self.snapshot_positions)
            .values()
            .copied()
            .fold(applied, i64::min)
    }

    /// Reports this replica's [`Corpus::position`] as `replica`, then
    /// trims the log below every live replica's (those not heard from for
    /// `stale` are forgotten). Returns the entries removed.
    pub async fn keep_log_trimmed(
        &self,
        replica: &str,
        stale: Duration,
    ) -> Result<u64, CorpusError> {
        self.store.report_position(replica, self.position()).await?;
        let stale_ms = i64::try_from(stale.as_millis()).unwrap_or(i64::MAX);
        Ok(self
            .store
            .trim_log(ragtime_store::now_ms() - stale_ms)
            .await?)
    }

    /// Whether a follower runs (it has started a pass).
    pub fn following(&self) -> bool {
        self.following.load(std::sync::atomic::Ordering::Acquire)
    }

    /// How far behind the store the indexes were at the follower's last
    /// look, and how long ago that was.
    pub fn lag(&self) -> Lag {
        Lag {
            since_pass: lock(&self.last_pass).elapsed(),
            ..*lock(&self.lag)
        }
    }

    /// One log entry into the loaded indexes (the caller holds the write
    /// lock). A document's change is applied as the store holds it now, so
    /// applying an entry that a load already reflects changes nothing.
    async fn apply(&self, e: &ragtime_store::LogEntry) -> Result<(), CorpusError> {
        if e.op == "drop_collection" {
            self.forget_snapshot(e.collection_id);
        }
        let name = lock(&self.loaded_ids).get(&e.collection_id).cloned();
        let Some(name) = name else {
            return Ok(());
        };
        let Some(index) = self.indexes.get(&name) else {
            lock(&self.loaded_ids).remove(&e.collection_id);
            return Ok(());
        };
        match e.op.as_str() {
            "drop_collection" => {
                self.indexes.remove(&name);
                lock(&self.loaded_ids).remove(&e.collection_id);
            }
            "upsert" | "delete" => match self.apply_document(&index, e).await {
                Err(CorpusError::Index(err)) => {
                    tracing::warn!(error = %err, collection = %name, "applying a change failed: the collection reloads from the store");
                    self.indexes.remove(&name);
                    lock(&self.loaded_ids).remove(&e.collection_id);
                }
                r => r?,
            },
            _ => {}
        }
        Ok(())
    }

    /// Puts a document's changed chunks in `index` as the store holds them
    /// now (so applying an entry twice changes nothing the second time).
    async fn apply_document(
        &self,
        index: &CollectionIndex,
        e: &ragtime_store::LogEntry,
    ) -> Result<(), CorpusError> {
        let stored = self
            .store
            .document_index_chunks(e.collection_id, &e.external_id)
            .await?;
        let old: std::collections::HashSet<i64> =
            index.chunks_of(&e.external_id).into_iter().collect();
        let new: std::collections::HashSet<i64> = stored.iter().map(|c| c.chunk_id).collect();
        if old == new {
            return Ok(());
        }
        let gone: Vec<i64> = old.difference(&new).copied().collect();
        let mut items = index_items(stored);
        items.retain(|(c, _)| !old.contains(&c.chunk_id));
        tokio::task::block_in_place(|| {
            index.remove(&gone)?;
            index.add(items)
        })?;
        Ok(())
    }

    /// Drops the in-memory indexes of collections no search has used for
    /// `idle`; they load again from the store at their next request.
    /// Returns how many were dropped.
    pub async fn unload_idle(&self, idle: Duration) -> usize {
        let now = ragtime_retrieve::now_ms();
        let idle_ms = u64::try_from(idle.as_millis()).unwrap_or(u64::MAX);
        let mut n = 0;
        for (name, idx) in self.indexes.loaded() {
            if now.saturating_sub(idx.last_used_ms()) < idle_ms {
                continue;
            }
            // One being written to or saved is not idle: left for later.
            let Ok(_w) = self.collection_lock(&name).try_lock_owned() else {
                continue;
            };
            if self
                .indexes
                .get(&name)
                .is_some_and(|i| Arc::ptr_eq(&i, &idx))
            {
                self.indexes.remove(&name);
                n += 1;
            }
        }
        n
    }

    /// Ingests documents into `collection` (created if missing):
    /// [`Corpus::prepare`] then [`Corpus::commit`]. Only the commit is serialised
    /// with other writes, so concurrent ingests embed while another commits.
    pub async fn ingest(
        &self,
        collection: &str,
        docs: Vec<IngestDoc>,
    ) -> Result<Vec<Ingested>, CorpusError> {
        let prepared = self.prepare(collection, docs).await?;
        self.commit(prepared).await
    }

    /// Ingests a sequence of batches in order, preparing (chunking and
    /// embedding) the next batch while the previous one commits, so the
    /// embedding threads rarely wait for the store and the indexes.
    /// `done` sees each batch's outcome as it is committed.
    pub async fn ingest_batches(
        &self,
        collection: &str,
        batches: impl IntoIterator<Item = Vec<IngestDoc>>,
        mut done: impl FnMut(Vec<Ingested>),
    ) -> Result<(), CorpusError> {
        let mut previous: Option<Prepared> = None;
        let coll_id = self.target(collection).await?;
        for batch in batches {
            let next = self.prepare_into(collection, coll_id, batch);
            let next = match previous.take() {
                Some(p) => {
                    let (next, committed) = tokio::join!(next, self.commit(p));
                    done(committed?);
                    next?
                }
                None => next.await?,
            };
            previous = Some(next);
        }
        if let Some(p) = previous {
            done(self.commit(p).await?);
        }
        Ok(())
    }

    /// How many chunks `doc` makes (what a job counts before it starts).
    pub fn count_chunks(&self, doc: &IngestDoc) -> usize {
        let starts: Vec<usize> = doc.sections.iter().map(|s| s.start).collect();
        self.chunker.chunk_sections(&doc.text, &starts).len()
    }

    fn content_hash(&self, doc: &IngestDoc, metadata: &str) -> String {
        let sections: String = doc
            .sections
            .iter()
            .map(|s| format!("{}:{}\n", s.start, s.path))
            .collect();
        format!(
            "{}-{}-{}-{CHUNKING}",
            digest(&[
                doc.title.as_bytes(),
                doc.text.as_bytes(),
                metadata.as_bytes(),
                sections.as_bytes(),
            ]),
            self.params.max_tokens,
            self.params.overlap
        )
    }

    /// Chunks and embeds (all chunks of the request together, in full
    /// batches) every document whose content differs from the stored one.
    /// Writes nothing but the collection's name.
    pub async fn prepare(
        &self,
        collection: &str,
        docs: Vec<IngestDoc>,
    ) -> Result<Prepared, CorpusError> {
        let coll_id = self.target(collection).await?;
        self.prepare_into(collection, coll_id, docs).await
    }

    /// The id of the collection an ingest writes to, created if missing.
    /// A write that spans several transactions (a job, pipelined batches)
    /// takes it once: if the collection is removed meanwhile, its later
    /// batches fail as [`CorpusError::UnknownCollection`] instead of
    /// making it again.
    pub async fn target(&self, collection: &str) -> Result<i64, CorpusError> {
        // Every write, creating a collection too, happens under the write
        // lock (SQLite allows one writer; a second would see it busy).
        Ok(match self.store.collection_id(collection).await? {
            Some(id) => id,
            None => self.create_collection(collection, "").await?.id(),
        })
    }

    /// [`Corpus::prepare`] for the collection [`Corpus::target`] answered.
    pub async fn prepare_into(
        &self,
        collection: &str,
        coll_id: i64,
        docs: Vec<IngestDoc>,
    ) -> Result<Prepared, CorpusError> {
        let mut pending = Vec::with_capacity(docs.len());
        for doc in docs {
            let metadata = Value::Object(doc.metadata.clone()).to_string();
            let hash = self.content_hash(&doc, &metadata);
            let unchanged =
                self.store.content_hash(coll_id, &doc.id).await?.as_deref() == Some(hash.as_str());
            pending.push(PendingDoc {
                doc,
                metadata,
                hash,
                unchanged,
                pieces: Vec::new(),
                vectors: Vec::new(),
            });
        }
        self.embed_pending(pending.iter_mut().filter(|p| !p.unchanged))
            .await?;
        Ok(Prepared {
            collection: collection.to_owned(),
            coll_id,
            pending,
            job: None,
        })
    }

    async fn embed_pending(
        &self,
        docs: impl Iterator<Item = &mut PendingDoc>,
    ) -> Result<(), CorpusError> {
        let mut docs: Vec<&mut PendingDoc> = docs.collect();
        for p in docs.iter_mut() {
            let starts: Vec<usize> = p.doc.sections.iter().map(|s| s.start).collect();
            p.pieces =
                tokio::task::block_in_place(|| self.chunker.chunk_sections(&p.doc.text, &starts));
        }
        let texts: Vec<String> = docs
            .iter()
            .flat_map(|p| {
                p.pieces
                    .iter()
                    .map(|c| embed_text(&p.doc.title, p.doc.section_at(c.anchor), &c.text))
            })
            .collect();
        // Dropped with this future (the client went away): the embedding
        // workers stop at their next batch instead of finishing it.
        let cancel = Cancel::new();
        let _stop = CancelOnDrop(cancel.clone());
        let mut vectors = self
            .embedder
            .embed_passages(texts, cancel)
            .await
            .map_err(CorpusError::Embed)?
            .into_iter();
        for p in docs {
            p.vectors = vectors.by_ref().take(p.pieces.len()).collect();
        }
        Ok(())
    }

    /// Commits prepared documents to the store in one transaction, then to
    /// the indexes (a write is acknowledged once durable). Commits are
    /// serialised; a document found unchanged while preparing is checked
    /// again here, and embedded now if another write changed it since.
    pub async fn commit(&self, prepared: Prepared) -> Result<Vec<Ingested>, CorpusError> {
        let (owner, quotas) = self.limits_of(&prepared.collection).await?;
        let _w = self.lock_collection(&prepared.collection).await;
        let Prepared {
            collection,
            coll_id,
            mut pending,
            job,
        } = prepared;
        // Removed (here or by another replica) since it was prepared, or
        // removed and made again: the write was for a collection that is
        // gone, and neither makes it again nor lands in the new one.
        let gone = || CorpusError::UnknownCollection(collection.clone());
        if self.store.collection_id(&collection).await? != Some(coll_id) {
            return Err(gone());
        }
        let (index, _) = self.load_locked(&collection, coll_id).await?;
        let mut changed_since = Vec::new();
        for p in pending.iter_mut().filter(|p| p.unchanged) {
            let stored = self.store.content_hash(coll_id, &p.doc.id).await?;
            if stored.as_deref() != Some(p.hash.as_str()) {
                p.unchanged = false;
                changed_since.push(p);
            }
        }
        self.embed_pending(changed_since.into_iter()).await?;
        let new_docs: Vec<NewDocument> = pending
            .iter_mut()
            .filter(|p| !p.unchanged)
            .map(PendingDoc::new_document)
            .collect();
        let receipts = match self
            .store
            .upsert_documents(
                coll_id,
                &new_docs,
                Some(limits(&owner, quotas)),
                job.as_ref(),
            )
            .await
        {
            Err(StoreError::CollectionGone(_)) => {
                // Removed by another replica after the look above: the
                // follower drops its indexes when it passes the removal.
                return Err(gone());
            }
            r => r?,
        };
        // Durable from here on; the indexes follow the store.
        let version = receipts.iter().map(|r| r.version).max();
        let mut out = Vec::with_capacity(pending.len());
        let (mut removed, mut items) = (Vec::new(), Vec::new());
        let mut receipts = receipts.into_iter().zip(new_docs);
        // An unchanged document the index lacks (an earlier index update
        // failed) is repaired: the collection reloads from the store.
        let mut reload = false;
        for PendingDoc { doc, unchanged, .. } in pending {
            if unchanged {
                let stored = self.store.get_document(coll_id, &doc.id).await?;
                let chunks = stored.as_ref().map_or(&[][..], |d| &d.chunks[..]);
                reload |= chunks.iter().any(|c| index.chunk(c.id).is_none());
                out.push(Ingested {
                    id: doc.id,
                    status: Upsert::Unchanged,
                    chunks: stored.map_or(0, |d| d.chunks.len()),
                });
                continue;
            }
            let Some((receipt, new)) = receipts.next() else {
                break;
            };
            removed.extend_from_slice(&receipt.removed_chunk_ids);
            self.remember(receipt.version);
            out.push(Ingested {
                id: doc.id.clone(),
                status: receipt.upsert,
                chunks: receipt.chunk_ids.len(),
            });
            items.extend(index_entries(doc, &receipt, new));
        }
        // A document listed twice replaces its own first version.
        let gone: std::collections::HashSet<i64> = removed.iter().copied().collect();
        items.retain(|(c, _)| !gone.contains(&c.chunk_id));
        let indexed = tokio::task::block_in_place(|| {
            index.remove(&removed)?;
            index.add(items)
        });
        if let Err(e) = &indexed {
            // The write is durable; the collection's next request loads
            // its indexes from the store again.
            tracing::warn!(error = %e, collection = %collection, "index update failed: the collection reloads from the store");
            reload = true;
        }
        if reload {
            self.indexes.remove(&collection);
        }
        if let Some(v) = version {
            self.advance(v);
        }
        Ok(out)
    }

    /// Deletes a document; `false` if there was none.
    pub async fn delete(&self, collection: &str, id: &str) -> Result<bool, CorpusError> {
        let _w = self.lock_collection(collection).await;
        let Some(coll_id) = self.store.collection_id(collection).await? else {
            return Err(CorpusError::UnknownCollection(collection.to_owned()));
        };
        let Some(receipt) = self.store.delete_document(coll_id, id).await? else {
            return Ok(false);
        };
        if let Some(index) = self.indexes.get(collection) {
            index.remove(&receipt.removed_chunk_ids)?;
        }
        self.remember(receipt.version);
        self.advance(receipt.version);
        Ok(true)
    }
}
