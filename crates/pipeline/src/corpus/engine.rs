//! The seam a retrieval engine plugs into.
//!
//! What every engine needs from a write stays in [`Corpus`](super::Corpus),
//! engine-agnostic: the store's transaction (the write is acknowledged once
//! it commits), the tenant's quotas, the collection's lock and the corpus
//! version (cached answers are only reused within one). What an engine
//! keeps of its own sits behind [`IndexEngine`]: the in-process engine
//! ([`Resident`](super::resident::Resident)) holds each collection's HNSW
//! and BM25 indexes in memory, loads them at start or first use, follows
//! other writers' changes from the store's change log, saves snapshots and
//! drops idle collections; an engine that searches inside the database
//! would hold none of that, and answer most of these calls with nothing to
//! do.
//!
//! The corpus calls the engine at these points of a write, always under
//! the collection's lock: [`IndexEngine::before_write`] before the store's
//! transaction, then [`IndexEngine::written`] with what the transaction
//! changed (or [`IndexEngine::dropped`] for a removed collection).

use super::CorpusError;
use super::follower::Lag;
use super::resident::Resident;
use async_trait::async_trait;
use ragtime_core::{Chunk, Retriever};
use std::sync::Arc;
use std::time::Duration;

/// What one committed write changed in a collection.
#[derive(Default)]
pub struct Change {
    /// Chunks the write removed (a replaced or deleted document's).
    pub removed: Vec<i64>,
    /// Chunks it stored, with their vectors.
    pub added: Vec<(Chunk, Vec<f32>)>,
    /// The change-log entries it wrote.
    pub entries: Vec<i64>,
    /// The engine's copy of the collection is known to lack stored chunks
    /// (an unchanged document it does not hold): rebuild it from the store.
    pub rebuild: bool,
}

/// What a collection's indexes take.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IndexBytes {
    /// Held in the process's memory (an estimate from their parts).
    pub resident: usize,
    /// Files read in place (memory-mapped): the page cache holds what of
    /// them is read, and gives it back under memory pressure.
    pub mapped: usize,
}

impl std::ops::Add for IndexBytes {
    type Output = Self;
    fn add(self, o: Self) -> Self {
        Self {
            resident: self.resident + o.resident,
            mapped: self.mapped + o.mapped,
        }
    }
}

impl std::iter::Sum for IndexBytes {
    fn sum<I: Iterator<Item = Self>>(iter: I) -> Self {
        iter.fold(Self::default(), |a, b| a + b)
    }
}

/// An engine's state, for readiness and statistics.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct EngineStatus {
    /// Collections whose indexes this process holds.
    pub loaded: usize,
    /// Their chunks.
    pub chunks: usize,
    /// What they take.
    pub bytes: IndexBytes,
    /// Collections loaded from a snapshot since start.
    pub snapshot_loads: usize,
    /// How far behind the store's change log the engine is.
    pub lag: Lag,
    /// Whether it follows the change log (only then is `lag` meaningful).
    pub following: bool,
}

/// A retrieval engine: where a collection's chunks are searched.
#[async_trait]
pub trait IndexEngine: Send + Sync {
    /// Makes ready what the engine serves from the start; the chunks it
    /// indexed.
    async fn start(&self) -> Result<usize, CorpusError>;

    /// A retriever over stored collection `name`, and how long making it
    /// ready took when this call did (a first use).
    async fn retriever(
        &self,
        name: &str,
    ) -> Result<(Arc<dyn Retriever>, Option<Duration>), CorpusError>;

    /// Before a write into collection `name` (store id `id`) starts its
    /// transaction.
    async fn before_write(&self, name: &str, id: i64) -> Result<(), CorpusError>;

    /// Whether the engine's copy of `name` lacks any of `chunks`, stored
    /// already (a write that found its documents unchanged asks).
    fn lacks_any(&self, name: &str, chunks: &[i64]) -> bool;

    /// After a write into `name` committed. The write is durable: an
    /// engine that cannot apply it must come back to the store.
    fn written(&self, name: &str, change: Change);

    /// After collection `name` (store id `id`) was removed by change-log
    /// entry `entry`.
    fn dropped(&self, name: &str, id: i64, entry: i64);

    /// Applies what other processes wrote since the last call; the
    /// change-log entries passed.
    async fn follow(&self) -> Result<usize, CorpusError>;

    /// Saves what is due to local disk; how many collections were saved.
    async fn save(&self) -> Result<usize, CorpusError>;

    /// Lets go of collections no search has used for `idle`; how many.
    async fn unload_idle(&self, idle: Duration) -> usize;

    /// Records the change-log position this engine needs kept and trims
    /// the log below every live replica's (those not heard from for
    /// `stale` are forgotten); the entries removed.
    async fn keep_log_trimmed(&self, stale: Duration) -> Result<u64, CorpusError>;

    /// The process stops. An engine whose saved snapshots outlive it (a
    /// data folder that keeps its replica name) leaves its position on
    /// record, so the log waits for it to start again (for `stale` at
    /// most); any other, the log no longer waits for.
    async fn leave(&self) -> Result<(), CorpusError>;

    /// What collection `name`'s indexes take, if the engine holds any.
    fn index_bytes(&self, name: &str) -> Option<IndexBytes>;

    fn status(&self) -> EngineStatus;

    /// How far behind the store's change log the engine is (what
    /// [`IndexEngine::status`] says of it, without the rest: the follower
    /// asks after every pass).
    fn lag(&self) -> Lag;

    /// The in-process engine, for what only it has (its indexes, to
    /// benchmarks and tests).
    fn as_resident(&self) -> Option<&Resident> {
        None
    }
}
