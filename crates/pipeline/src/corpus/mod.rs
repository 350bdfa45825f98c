//! The corpus: the store, the embedder and the in-process indexes
//! together. Ingestion writes the store first (a write is acknowledged
//! only once committed) and then the indexes, which load from their
//! snapshots brought up to the store's change log, or from the store, so a
//! crash loses nothing acknowledged and leaves no half-indexed document.
//!
//! One `impl Corpus` block per job, each in its own file:
//! - [`write`]: prepare and commit, deletes, collections made and
//!   removed, quotas, the corpus version — what every engine needs;
//! - [`engine`]: the seam a retrieval engine plugs into ([`IndexEngine`]);
//! - [`database`]: the engine that searches inside PostgreSQL (no index in
//!   this process);
//! - [`resident`]: the in-process engine, its indexes loaded in this
//!   process (start, first request, idle drop) and the retriever over them;
//! - [`follower`]: other writers' changes applied from the change log, the
//!   log trimmed;
//! - [`snapshots`]: the indexes saved on local disk and loaded back;
//! - [`info`]: what collections hold.
//!
//! One lock per collection keeps its store rows and its indexes changing
//! together: a load, a save, a write, a removal and the follower's change
//! of one collection take it; other collections go on meanwhile.

mod database;
pub mod engine;
mod follower;
mod info;
mod resident;
pub mod snapshots;
mod write;

pub use database::{
    DATABASE_EXACT_BELOW, DATABASE_FUSION, DEFAULT_EF_SEARCH, database_limits, database_retriever,
    ef_search_for, lexical_depth,
};
pub use engine::{Change, EngineStatus, IndexBytes, IndexEngine};
pub use follower::Lag;
pub use info::CollectionInfo;
pub use ragtime_core::IngestDoc;
pub use resident::{Resident, index_items};
pub use write::Prepared;

use ragtime_core::{Embedder, Retriever, StageError};
use ragtime_embed::Chunker;
use ragtime_retrieve::{CollectionIndex, IndexError, LexicalUnit};
use ragtime_store::{Store, StoreError, Upsert};
use snapshots::SnapshotConfig;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
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
    /// Asked of the in-process indexes while another engine serves.
    #[error("the retrieval engine holds no in-process indexes")]
    NotResident,
}

/// What happened to one document.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ingested {
    pub id: String,
    pub status: Upsert,
    pub chunks: usize,
}

/// Chunking settings (they are part of the content hash, so changing them
/// re-embeds documents on their next ingest).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkParams {
    pub max_tokens: usize,
    pub overlap: usize,
}

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

pub struct Corpus {
    pub store: Store,
    pub embedder: Arc<dyn Embedder>,
    chunker: Chunker,
    params: ChunkParams,
    quotas: Quotas,
    shared: Arc<Shared>,
    /// How the in-process engine is set up (the builders change it, and
    /// make the engine again).
    options: resident::Options,
    engine: Arc<dyn IndexEngine>,
}

/// What the corpus and its engine share.
pub(crate) struct Shared {
    store: Store,
    /// One lock per collection (see the module docs).
    locks: std::sync::Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// The corpus version the engine reflects (the ingest log's last id):
    /// cached answers are only reused within one version.
    version: std::sync::atomic::AtomicI64,
}

/// A collection's lock, held. Its entry in the map goes with the last
/// holder or waiter, so names asked for once (a search of a collection
/// that does not exist) leave nothing behind.
pub(crate) struct CollectionGuard<'a> {
    shared: &'a Shared,
    name: String,
    guard: Option<tokio::sync::OwnedMutexGuard<()>>,
}

impl Drop for CollectionGuard<'_> {
    fn drop(&mut self) {
        self.guard.take();
        let mut locks = lock(&self.shared.locks);
        // Only the map holds it: no one waits (a waiter's clone is made
        // under the map's lock, so it cannot come in between).
        if locks
            .get(&self.name)
            .is_some_and(|m| Arc::strong_count(m) == 1)
        {
            locks.remove(&self.name);
        }
    }
}

impl Shared {
    /// The lock of collection `name` (made at its first use).
    fn collection_lock(&self, name: &str) -> Arc<tokio::sync::Mutex<()>> {
        lock(&self.locks)
            .entry(name.to_owned())
            .or_default()
            .clone()
    }

    /// Waits for collection `name`'s lock.
    async fn lock_collection(&self, name: &str) -> CollectionGuard<'_> {
        let guard = self.collection_lock(name).lock_owned().await;
        CollectionGuard {
            shared: self,
            name: name.to_owned(),
            guard: Some(guard),
        }
    }

    /// Collection `name`'s lock if no one holds it.
    fn try_lock_collection(&self, name: &str) -> Option<CollectionGuard<'_>> {
        let guard = self.collection_lock(name).try_lock_owned();
        let guard = CollectionGuard {
            shared: self,
            name: name.to_owned(),
            guard: guard.ok(),
        };
        guard.guard.is_some().then_some(guard)
    }

    fn version(&self) -> i64 {
        self.version.load(std::sync::atomic::Ordering::Acquire)
    }

    fn advance(&self, version: i64) {
        self.version
            .fetch_max(version, std::sync::atomic::Ordering::AcqRel);
    }
}

fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Corpus {
    /// `chunker` splits text with the embedding model's tokenizer. The
    /// corpus searches with the in-process engine ([`Resident`]).
    pub fn new(
        store: Store,
        embedder: Arc<dyn Embedder>,
        chunker: Chunker,
        params: ChunkParams,
    ) -> Self {
        let shared = Arc::new(Shared {
            store: store.clone(),
            locks: std::sync::Mutex::default(),
            version: std::sync::atomic::AtomicI64::new(0),
        });
        let options = resident::Options::default();
        let engine = Arc::new(Resident::new(
            shared.clone(),
            embedder.dim(),
            options.clone(),
        ));
        Self {
            store,
            embedder,
            chunker,
            params,
            quotas: Quotas::default(),
            shared,
            options,
            engine,
        }
    }

    /// Makes the in-process engine again with the options as they are now
    /// (the builders run before the corpus is used).
    fn with_options(mut self, change: impl FnOnce(&mut resident::Options)) -> Self {
        change(&mut self.options);
        if self.engine.as_resident().is_none() {
            // Another engine was chosen: it has no use for them.
            return self;
        }
        self.engine = Arc::new(Resident::new(
            self.shared.clone(),
            self.embedder.dim(),
            self.options.clone(),
        ));
        self
    }

    /// Quotas for tenants without their own.
    pub fn with_quotas(mut self, quotas: Quotas) -> Self {
        self.quotas = quotas;
        self
    }

    /// What BM25 ranks documents by in searches.
    pub fn with_lexical_unit(self, unit: LexicalUnit) -> Self {
        self.with_options(|o| o.lexical_unit = unit)
    }

    /// How many collections [`Corpus::rebuild`] loads (the largest first).
    pub fn with_preload(self, collections: usize) -> Self {
        self.with_options(|o| o.preload = collections)
    }

    /// Saves loaded collections' indexes under `config.dir` and loads them
    /// from there (see [`snapshots`]).
    pub fn with_snapshots(self, config: SnapshotConfig) -> Self {
        self.with_options(|o| o.snapshots = Some(config))
    }

    /// Searches inside the database instead of in this process (see
    /// [`database`]): makes the database's search schema, or fails
    /// saying what the database lacks ([`StoreError::Unsupported`]).
    /// `ef_search`: HNSW candidates a dense search keeps at least.
    pub async fn with_database_engine(mut self, ef_search: usize) -> Result<Self, CorpusError> {
        let filled = self
            .store
            .enable_database_search(self.embedder.dim())
            .await?;
        tracing::info!(
            words = match self.store.lexical_ranking() {
                Some(ragtime_store::Lexical::Bm25) => "BM25 (pg_textsearch)",
                _ => "ts_rank (no pg_textsearch in the database)",
            },
            filled_in = filled,
            "searching inside PostgreSQL"
        );
        self.engine = Arc::new(database::Database::new(self.shared.clone(), ef_search));
        Ok(self)
    }

    /// The engine collections are searched with.
    pub fn engine(&self) -> &dyn IndexEngine {
        &*self.engine
    }

    /// The in-process engine, when it is the one.
    pub fn resident(&self) -> Result<&Resident, CorpusError> {
        self.engine.as_resident().ok_or(CorpusError::NotResident)
    }

    /// The corpus version the engine reflects; it changes with every
    /// ingest or delete that changed something.
    pub fn version(&self) -> i64 {
        self.shared.version()
    }

    /// Makes ready what the engine serves from the start (the in-process
    /// engine loads collections, the largest first, up to the preload
    /// count). Returns the chunks indexed.
    pub async fn rebuild(&self) -> Result<usize, CorpusError> {
        self.engine.start().await
    }

    /// An existing collection as the pipeline's retriever, and how long
    /// making it ready took when this request did.
    pub async fn retriever(
        &self,
        name: &str,
    ) -> Result<(Arc<dyn Retriever>, Option<Duration>), CorpusError> {
        self.engine.retriever(name).await
    }

    /// The in-process indexes of an existing collection (404 material when
    /// missing).
    pub async fn collection(&self, name: &str) -> Result<Arc<CollectionIndex>, CorpusError> {
        self.resident()?.collection(name).await
    }

    /// See [`IndexEngine::follow`].
    pub async fn follow(&self) -> Result<usize, CorpusError> {
        self.engine.follow().await
    }

    /// See [`IndexEngine::save`].
    pub async fn save_snapshots(&self) -> Result<usize, CorpusError> {
        self.engine.save().await
    }

    /// See [`IndexEngine::unload_idle`].
    pub async fn unload_idle(&self, idle: Duration) -> usize {
        self.engine.unload_idle(idle).await
    }

    /// See [`IndexEngine::keep_log_trimmed`].
    pub async fn keep_log_trimmed(&self, stale: Duration) -> Result<u64, CorpusError> {
        self.engine.keep_log_trimmed(stale).await
    }

    /// See [`IndexEngine::leave`].
    pub async fn leave(&self) -> Result<(), CorpusError> {
        self.engine.leave().await
    }

    /// The engine's state (loaded collections, lag, snapshot loads).
    pub fn status(&self) -> EngineStatus {
        self.engine.status()
    }

    /// How far behind the store's change log the engine is.
    pub fn lag(&self) -> Lag {
        self.engine.lag()
    }

    /// Collections loaded from a snapshot since start.
    pub fn snapshot_loads(&self) -> usize {
        self.engine.status().snapshot_loads
    }
}
