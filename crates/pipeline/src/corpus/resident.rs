//! The in-process engine: each collection's HNSW and BM25 indexes resident
//! in memory, loaded at start (the largest first, up to the preload count)
//! or at their first request, from their snapshot or the store, under
//! their collection's lock; kept up to date with other writers' changes
//! ([`super::follower`]), saved to local disk ([`super::snapshots`]) and
//! dropped again when idle.

use super::engine::{Change, EngineStatus, IndexBytes, IndexEngine};
use super::follower::Follower;
use super::snapshots::{Behind, OnDisk, SnapshotConfig, Snapshots};
use super::{CorpusError, Shared, lock, snapshots};
use crate::adapters::IndexRetriever;
use async_trait::async_trait;
use ragtime_core::{Chunk, Retriever};
use ragtime_retrieve::CollectionIndex;
use ragtime_retrieve::{Indexes, LexicalUnit};
use ragtime_store::IndexChunk;
use ragtime_store::Store;
use serde_json::{Map, Value};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Stored chunks as an index takes them.
/// A document's chunks come together and carry its metadata each: a run
/// of the same metadata text is parsed once and shared.
pub fn index_items(chunks: Vec<IndexChunk>) -> Vec<(Chunk, Vec<f32>)> {
    let mut last: Option<(String, Arc<Value>)> = None;
    chunks
        .into_iter()
        .map(|c| {
            let metadata = match &last {
                Some((text, parsed)) if *text == c.metadata => parsed.clone(),
                _ => {
                    let parsed = Arc::new(
                        serde_json::from_str(&c.metadata).unwrap_or(Value::Object(Map::new())),
                    );
                    last = Some((c.metadata.clone(), parsed.clone()));
                    parsed
                }
            };
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

/// Chunks read from the store and indexed at a time when a collection is
/// built from it: the rows of one batch are held, not the collection's
/// (each batch is one lexical commit and one parallel graph insert).
const LOAD_BATCH: usize = 50_000;

/// How the in-process engine is set up.
#[derive(Debug, Clone)]
pub(super) struct Options {
    /// Collections (the largest first) loaded at start; the rest load at
    /// their first request.
    pub(super) preload: usize,
    pub(super) lexical_unit: LexicalUnit,
    /// Where loaded collections' indexes are saved (none: never).
    pub(super) snapshots: Option<SnapshotConfig>,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            preload: usize::MAX,
            lexical_unit: LexicalUnit::Auto,
            snapshots: None,
        }
    }
}

/// The in-process engine (see the module docs).
pub struct Resident {
    pub(super) shared: Arc<Shared>,
    pub(super) store: Store,
    pub indexes: Indexes,
    pub(super) preload: usize,
    pub(super) lexical_unit: LexicalUnit,
    /// Loaded collections by their store id (the log names collections by
    /// id), named before their load reads the store.
    pub(super) loaded_ids: std::sync::Mutex<HashMap<i64, String>>,
    pub(super) follower: Follower,
    pub(super) snapshots: Snapshots,
    /// This engine's name among the replicas that keep the change log
    /// from being trimmed past them.
    pub(super) replica: String,
    /// The lock on the name its snapshot folder keeps for it (none: a name
    /// of this run's own, and no snapshots outlive it).
    replica_lock: Option<std::fs::File>,
    /// Held while the engine lives: its workspace is a live run's.
    _workspace_lock: Option<std::fs::File>,
}

impl Resident {
    pub(super) fn new(shared: Arc<Shared>, dim: usize, options: Options) -> Self {
        let mut indexes = Indexes::new(dim, ragtime_retrieve::DenseParams::default());
        let mut workspace_lock = None;
        let mut replica = None;
        if let Some(cfg) = &options.snapshots {
            match snapshots::replica_name(&cfg.dir) {
                Ok(named) => replica = Some(named),
                Err(e) => {
                    tracing::info!(path = %cfg.dir.display(), error = %e, "the snapshot folder's replica name is in use; this run takes its own")
                }
            }
            match snapshots::workspace(&cfg.dir) {
                Ok((workspace, lock)) => {
                    indexes = indexes.with_workspace(workspace);
                    workspace_lock = Some(lock);
                }
                Err(e) => {
                    tracing::warn!(path = %cfg.dir.display(), error = %e, "no workspace for the indexes; they stay in memory")
                }
            }
        }
        Self {
            _workspace_lock: workspace_lock,
            store: shared.store.clone(),
            shared,
            indexes,
            preload: options.preload,
            lexical_unit: options.lexical_unit,
            loaded_ids: std::sync::Mutex::default(),
            follower: Follower::new(),
            snapshots: Snapshots {
                config: options.snapshots,
                ..Snapshots::default()
            },
            replica: replica.as_ref().map_or_else(
                || format!("replica_{}", uuid::Uuid::new_v4().simple()),
                |(name, _)| name.clone(),
            ),
            replica_lock: replica.map(|(_, lock)| lock),
        }
    }

    /// This engine's name among the replicas (see [`Resident::position`]).
    pub fn replica(&self) -> &str {
        &self.replica
    }
}

#[async_trait]
impl IndexEngine for Resident {
    async fn start(&self) -> Result<usize, CorpusError> {
        self.rebuild().await
    }

    async fn retriever(
        &self,
        name: &str,
    ) -> Result<(Arc<dyn Retriever>, Option<Duration>), CorpusError> {
        let (idx, loaded) = self.collection_loaded(name).await?;
        Ok((Arc::new(IndexRetriever(idx, self.lexical_unit)), loaded))
    }

    async fn before_write(&self, name: &str, id: i64) -> Result<(), CorpusError> {
        self.load_locked(name, id).await.map(drop)
    }

    fn lacks_any(&self, name: &str, chunks: &[i64]) -> bool {
        self.indexes
            .get(name)
            .is_some_and(|idx| chunks.iter().any(|c| !idx.contains(*c)))
    }

    fn written(&self, name: &str, change: Change) {
        for entry in &change.entries {
            self.remember(*entry);
        }
        if !change.entries.is_empty() {
            self.changed_since_snapshot(name);
        }
        let Some(index) = self.indexes.get(name) else {
            // Not loaded: it loads the store as it is at its next request.
            return;
        };
        let Change {
            removed,
            mut added,
            rebuild,
            ..
        } = change;
        // A document listed twice replaces its own first version.
        let gone: HashSet<i64> = removed.iter().copied().collect();
        added.retain(|(c, _)| !gone.contains(&c.chunk_id));
        let indexed = tokio::task::block_in_place(|| {
            index.remove(&removed)?;
            index.add(added)
        });
        if let Err(e) = &indexed {
            // The write is durable; the collection's next request loads
            // its indexes from the store again.
            tracing::warn!(error = %e, collection = %name, "index update failed: the collection reloads from the store");
        }
        if rebuild || indexed.is_err() {
            self.indexes.remove(name);
        }
    }

    fn dropped(&self, name: &str, id: i64, entry: i64) {
        self.indexes.remove(name);
        lock(&self.loaded_ids).remove(&id);
        self.forget_snapshot(id);
        self.remember(entry);
    }

    async fn follow(&self) -> Result<usize, CorpusError> {
        Resident::follow(self).await
    }

    async fn save(&self) -> Result<usize, CorpusError> {
        self.save_snapshots().await
    }

    async fn unload_idle(&self, idle: Duration) -> usize {
        Resident::unload_idle(self, idle).await
    }

    async fn keep_log_trimmed(&self, stale: Duration) -> Result<u64, CorpusError> {
        Resident::keep_log_trimmed(self, stale).await
    }

    async fn leave(&self) -> Result<(), CorpusError> {
        if self.replica_lock.is_some() {
            // Back under the same name: its snapshots replay from here.
            let position = self.position();
            return Ok(self.store.report_position(&self.replica, position).await?);
        }
        Ok(self.store.forget_replica(&self.replica).await?)
    }

    fn index_bytes(&self, name: &str) -> Option<IndexBytes> {
        self.indexes.get(name).map(|i| bytes_of(&i))
    }

    fn status(&self) -> EngineStatus {
        let loaded = self.indexes.loaded();
        EngineStatus {
            loaded: loaded.len(),
            chunks: self.indexes.len(),
            bytes: loaded.iter().map(|(_, i)| bytes_of(i)).sum(),
            snapshot_loads: self.snapshot_loads(),
            lag: self.lag(),
            following: self.following(),
        }
    }

    fn lag(&self) -> super::follower::Lag {
        Resident::lag(self)
    }

    fn as_resident(&self) -> Option<&Resident> {
        Some(self)
    }
}

impl Resident {
    /// Loads collections' indexes (from their snapshots or the store), the
    /// largest first, up to the preload count (every one by default); the
    /// rest load at their first request. Returns the chunks indexed.
    pub async fn rebuild(&self) -> Result<usize, CorpusError> {
        let version = self.store.corpus_version().await?;
        // What loads from here on is at least this new: the follower
        // starts after it, and the log is kept from here for it (other
        // replicas trim it meanwhile), or from an older snapshot's.
        self.follower
            .applied
            .fetch_max(version, std::sync::atomic::Ordering::AcqRel);
        let mut all = self.store.list_collections(None).await?;
        if let Some(cfg) = &self.snapshots.config {
            snapshots::retain(&cfg.dir, &all.iter().map(|c| c.id).collect());
            let mut at = lock(&self.snapshots.positions);
            for c in &all {
                if let Some((_, meta)) = snapshots::latest(&cfg.dir, c.id) {
                    at.insert(c.id, OnDisk::new(meta.log_position, Behind::Unknown));
                }
            }
        }
        self.store
            .report_position(&self.replica, self.position())
            .await?;
        all.sort_by(|a, b| b.chunks.cmp(&a.chunks).then(a.name.cmp(&b.name)));
        let mut n = 0;
        for c in all.into_iter().take(self.preload) {
            let _w = self.shared.lock_collection(&c.name).await;
            // Looked up again under the lock: it may have been removed,
            // or removed and made again, since the list was read.
            let Some(id) = self.store.collection_id(&c.name).await? else {
                continue;
            };
            let (idx, _) = self.load_locked(&c.name, id).await?;
            n += idx.len();
        }
        self.shared.advance(version);
        *lock(&self.follower.last_pass) = Instant::now();
        Ok(n)
    }

    /// A stored collection's indexes, loaded from the store unless they
    /// are in memory, and how long the load took. The caller holds the
    /// collection's lock, so no write lands between the read and the
    /// index, and has read `coll_id` under it, so the follower has not yet
    /// passed a removal of that collection.
    pub(super) async fn load_locked(
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
        let idx = Arc::new(self.indexes.create()?);
        self.store
            .index_chunks_in_batches(coll_id, LOAD_BATCH, |batch| {
                tokio::task::block_in_place(|| idx.add(index_items(batch)))
                    .map_err(CorpusError::from)
            })
            .await?;
        lock(&self.snapshots.saved).remove(&coll_id);
        Ok(idx)
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
        let _w = self.shared.lock_collection(name).await;
        let Some(id) = self.store.collection_id(name).await? else {
            return Err(CorpusError::UnknownCollection(name.to_owned()));
        };
        self.load_locked(name, id).await
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
            let Some(_w) = self.shared.try_lock_collection(&name) else {
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
}

/// What a loaded collection's indexes take.
fn bytes_of(index: &CollectionIndex) -> IndexBytes {
    IndexBytes {
        resident: index.memory_bytes(),
        mapped: index.mapped_bytes(),
    }
}
