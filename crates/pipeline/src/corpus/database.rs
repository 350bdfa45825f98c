//! The database engine (`retrieval.engine = "postgres"`): collections are
//! searched inside PostgreSQL (pgvector for the dense side, its full-text
//! ranking for the lexical side; see `ragtime_store::search`), so a
//! replica holds no index. Nothing loads at start or at a first request,
//! nothing follows the change log into indexes, nothing is saved or
//! dropped when idle, and a write is found by every replica as soon as it
//! commits: it is in the very rows the searches read.
//!
//! What stays the same is the pipeline's: fusion, reranking, answers and
//! budgets. A search runs under its stage's deadline (the database stops
//! the query at it: `statement_timeout`), and a query stopped so reports
//! [`StageError::Cancelled`], as the in-memory engine's work does when its
//! deadline passes, so the request degrades the same way.
//!
//! The corpus version (what cached answers are valid for) follows the
//! store's change log: [`IndexEngine::follow`] reads its last entry.

use super::engine::{Change, EngineStatus, IndexBytes, IndexEngine};
use super::follower::Lag;
use super::{CorpusError, Shared};
use async_trait::async_trait;
use ragtime_core::{Cancel, Chunk, DocHit, Filter, FusionParams, Hit, Retriever, StageError};
use ragtime_retrieve::in_document_score;
use ragtime_store::{FoundChunk, FoundDocument, SearchLimits, Store, StoreError};
use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// HNSW candidates a dense search keeps at least (`hnsw.ef_search`).
pub const DEFAULT_EF_SEARCH: usize = 100;

/// Chunks in the database up to which a dense search keeps the configured
/// `ef_search`; past it the candidate list grows as a power of the count
/// ([`ef_search_for`]).
pub const EF_REFERENCE_CHUNKS: usize = 100_000;
/// The power the candidate list grows by past [`EF_REFERENCE_CHUNKS`].
pub const EF_GROWTH: f32 = 0.6;
/// pgvector's bound on `hnsw.ef_search`.
const EF_SEARCH_MAX: usize = 1000;

/// `hnsw.ef_search` for a dense search of `k` chunks, with `configured`
/// the least (`retrieval.ef_search`) and `chunks` the vectors in the
/// database — pgvector's one graph holds every collection's. A walk
/// that keeps a fixed list finds fewer of the true nearest as the graph
/// grows, as the in-memory engine's does (`DenseParams::ef_for`), so the
/// list grows with it. Measured by `ragtime-bench pgscale` (recall@10
/// against an exact scan, a hit within 1e-3 of the tenth distance;
/// docs/scaling.md): at 1M chunks a fixed 100 finds 0.87 of the ten,
/// 400 finds 0.95.
pub fn ef_search_for(configured: usize, k: usize, chunks: usize) -> usize {
    let growth = ragtime_retrieve::DenseParams {
        ef_search: configured,
        ef_reference: EF_REFERENCE_CHUNKS,
        ef_growth: EF_GROWTH,
        ef_max: EF_SEARCH_MAX,
        ..ragtime_retrieve::DenseParams::default()
    };
    growth.ef_for(chunks).max(k).clamp(1, EF_SEARCH_MAX)
}

/// Chunks up to which a filtered dense search that the metadata indexes
/// can narrow ranks every chunk that passes instead of walking the graph
/// (`SearchLimits::exact_below`): at 1M chunks a 1 % filter's walk finds
/// 0.93 of the ten nearest (m 24 graph, 1000 candidates), the exact
/// ranking of its ≈ 10,000 chunks all of them, in ≈ 75 ms (each chunk's
/// row is read for its vector; `ragtime-bench pgscale`, docs/scaling.md).
/// A broader filter (an equality, or a range on a number or a date) pays
/// for counting this many before it walks, unless a sample of the
/// documents finds it far broader (the store's `broad_by_sample`).
pub const DATABASE_EXACT_BELOW: usize = 20_000;

/// The limits of one dense search of `k` chunks in the database: the
/// candidate list `ef_search` (from [`ef_search_for`]), and for a filtered
/// one pgvector's longest, since the chunks that pass lie further along
/// the walk (at 1M chunks a 10 % filter finds 0.94 of the ten nearest at
/// 400 and 0.96 at 1000); `timeout` the stage's time left.
pub fn database_limits(
    ef_search: usize,
    k: usize,
    filter: &Filter,
    timeout: Option<Duration>,
) -> SearchLimits {
    SearchLimits {
        timeout,
        ef_search: if filter.is_all() {
            ef_search.max(k).min(EF_SEARCH_MAX)
        } else {
            EF_SEARCH_MAX
        },
        exact_below: DATABASE_EXACT_BELOW,
    }
}

/// The documents the database engine's lexical side ranks in a hybrid
/// search of the `k` candidates the pipeline asks each side for: three
/// tenths (30 of a top 10's 100; never fewer than the search shows, and
/// a lexical-only search ranks all `k`). The latency goal decides it: at
/// 1M chunks, hybrid retrieval at four clients reads p50 / p99 21.6 /
/// 40.4 ms at 30 and 25.7 / 57.9 ms at 100 (`ragtime-bench pgscale`),
/// while SciFact's hybrid nDCG@10 (top 10, the BM25 index built again)
/// gains 0.0027 at 100: 0.7348 against 0.7321 (0.7525 / 0.7171 against
/// 0.7483 / 0.7160 on the even- and odd-numbered train queries;
/// docs/scaling.md).
pub fn lexical_depth(k: usize) -> usize {
    (k * 3).div_ceil(10).max(1)
}

/// How the database engine's rankings fuse: its lexical scores are
/// another BM25's (or `ts_rank`'s), so its fusion is chosen by its own
/// measurement (`BENCH_ENGINE=postgres ragtime-bench fusion`: the grid
/// on half the SciFact train queries, checked on the other half). With
/// pg_textsearch the grid's best on the first half is the in-memory
/// engine's fusion itself (nDCG@10 0.749 there, 0.713 on the unseen
/// half; docs/scaling.md).
pub const DATABASE_FUSION: FusionParams = crate::search::FUSION;

pub struct Database {
    shared: Arc<Shared>,
    /// This process in the store's replica table (it keeps no position of
    /// its own in the log, but says where the corpus version is).
    replica: String,
    ef_search: usize,
    /// Chunks in the database (every collection's: they share the
    /// graph), as of the last start or follow.
    chunks: AtomicUsize,
    /// The corpus version `chunks` was counted at (-1: not yet).
    counted_at: AtomicI64,
}

impl Database {
    pub(super) fn new(shared: Arc<Shared>, ef_search: usize) -> Self {
        Self {
            shared,
            replica: format!("db-{}", uuid::Uuid::new_v4().simple()),
            ef_search,
            chunks: AtomicUsize::new(0),
            counted_at: AtomicI64::new(-1),
        }
    }

    async fn count_chunks(&self) -> Result<(), CorpusError> {
        let usage = self.shared.store.total_usage().await?;
        let chunks = usize::try_from(usage.chunks).unwrap_or(0);
        self.chunks.store(chunks, Ordering::Relaxed);
        Ok(())
    }
}

#[async_trait]
impl IndexEngine for Database {
    async fn start(&self) -> Result<usize, CorpusError> {
        self.follow().await?;
        Ok(self.chunks.load(Ordering::Relaxed))
    }

    async fn retriever(
        &self,
        name: &str,
    ) -> Result<(Arc<dyn Retriever>, Option<Duration>), CorpusError> {
        // Refused at once when the searches' connections are all taken,
        // rather than waiting in a queue none of its budget would outlast.
        if self.shared.store.searches_full() {
            return Err(CorpusError::Store(StoreError::SearchesBusy));
        }
        let id = self
            .shared
            .store
            .collection_id(name)
            .await?
            .ok_or_else(|| CorpusError::UnknownCollection(name.to_owned()))?;
        let ef_search = ef_search_for(self.ef_search, 0, self.chunks.load(Ordering::Relaxed));
        Ok((
            database_retriever(self.shared.store.clone(), id, ef_search),
            None,
        ))
    }

    async fn before_write(&self, _name: &str, _id: i64) -> Result<(), CorpusError> {
        Ok(())
    }

    fn lacks_any(&self, _name: &str, _chunks: &[i64]) -> bool {
        false
    }

    fn written(&self, _name: &str, _change: Change) {}

    fn dropped(&self, _name: &str, _id: i64, _entry: i64) {}

    async fn follow(&self) -> Result<usize, CorpusError> {
        let before = self.shared.version();
        let now = self.shared.store.corpus_version().await?;
        self.shared.advance(now);
        // Counted against the version the count was taken at, not the
        // shared one: this replica's own writes advance that before a
        // follow sees them. A failed count is tried again next time; it
        // does not fail the follow (the list it sizes is only a search
        // setting).
        if self.counted_at.load(Ordering::Relaxed) != now {
            match self.count_chunks().await {
                Ok(()) => self.counted_at.store(now, Ordering::Relaxed),
                Err(e) => {
                    tracing::warn!(error = %e, "counting the database's chunks failed; the HNSW list keeps its size")
                }
            }
        }
        Ok(usize::try_from(now - before).unwrap_or(0))
    }

    async fn save(&self) -> Result<usize, CorpusError> {
        Ok(0)
    }

    async fn unload_idle(&self, _idle: Duration) -> usize {
        0
    }

    async fn keep_log_trimmed(&self, stale: Duration) -> Result<u64, CorpusError> {
        let store = &self.shared.store;
        store
            .report_position(&self.replica, self.shared.version())
            .await?;
        let stale_ms = i64::try_from(stale.as_millis()).unwrap_or(i64::MAX);
        Ok(store.trim_log(ragtime_store::now_ms() - stale_ms).await?)
    }

    async fn leave(&self) -> Result<(), CorpusError> {
        Ok(self.shared.store.forget_replica(&self.replica).await?)
    }

    fn index_bytes(&self, _name: &str) -> Option<IndexBytes> {
        None
    }

    fn status(&self) -> EngineStatus {
        EngineStatus {
            lag: self.lag(),
            // The database's chunks (every collection's), as last counted.
            chunks: self.chunks.load(Ordering::Relaxed),
            ..EngineStatus::default()
        }
    }

    /// Never behind: the searches read the rows the writes commit.
    fn lag(&self) -> Lag {
        Lag {
            applied: self.shared.version(),
            ..Lag::default()
        }
    }
}

/// The database engine's retriever of collection `collection` (its id)
/// in `store`, with `hnsw.ef_search` at least `ef_search`
/// ([`ef_search_for`]): what a request searches through, for benchmarks
/// that search a database without a service.
pub fn database_retriever(store: Store, collection: i64, ef_search: usize) -> Arc<dyn Retriever> {
    Arc::new(DatabaseRetriever {
        store,
        collection,
        ef_search,
        found: Mutex::default(),
        rank_scale: Mutex::default(),
    })
}

/// One request's view of a collection in the database. The chunks its
/// searches returned are kept for [`Retriever::chunk`] (the pipeline asks
/// for the text of the hits it keeps): a retriever lives as long as the
/// request that asked for it.
struct DatabaseRetriever {
    store: Store,
    collection: i64,
    ef_search: usize,
    found: Mutex<HashMap<i64, Arc<Chunk>>>,
    /// The best chunk rank among the documents read so far (the scale of
    /// [`in_document_score`]).
    rank_scale: Mutex<f32>,
}

impl DatabaseRetriever {
    fn limits(
        &self,
        cancel: &Cancel,
        k: usize,
        filter: &Filter,
    ) -> Result<SearchLimits, StageError> {
        if cancel.is_cancelled() {
            return Err(StageError::Cancelled);
        }
        let timeout = cancel
            .deadline()
            .map(|d| d.saturating_duration_since(Instant::now()));
        Ok(database_limits(self.ef_search, k, filter, timeout))
    }

    /// Each document with its passages picked ([`pick_passages`]) and
    /// those chunks kept for [`Retriever::chunk`]. As the in-memory
    /// engine: the scale of chunk ranks is the best among documents with
    /// more than one chunk to choose from — here among those this
    /// request has read, the lexical side's top first (the in-memory
    /// engine's is among all the documents it ranked, so a pick can differ
    /// where the best chunk lies in a document read by neither).
    fn picked(&self, docs: Vec<FoundDocument>, vector: bool, per_document: usize) -> Vec<DocHit> {
        let best = docs
            .iter()
            .filter(|d| d.chunks.len() > 1)
            .flat_map(|d| d.chunks.iter().map(|c| c.rank))
            .fold(0.0f32, f32::max);
        let top = {
            let mut scale = self
                .rank_scale
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            *scale = scale.max(best);
            *scale
        };
        let mut hits = Vec::with_capacity(docs.len());
        for d in docs {
            let chunks = pick_passages(&d.chunks, vector, top, per_document);
            let kept: Vec<FoundChunk> = d
                .chunks
                .into_iter()
                .filter(|c| chunks.iter().any(|h| h.chunk_id == c.chunk.chunk_id))
                .collect();
            self.keep(kept);
            hits.push(DocHit {
                document_id: d.document_id,
                score: d.score,
                chunks,
            });
        }
        hits
    }

    fn keep(&self, rows: Vec<FoundChunk>) {
        let mut found = self.found.lock().unwrap_or_else(PoisonError::into_inner);
        for r in rows {
            found.insert(r.chunk.chunk_id, Arc::new(r.chunk));
        }
    }
}

/// A query the database stopped at its deadline is cancelled work, as
/// the in-memory engine's is; anything else is the backend failing.
fn stage_error(e: StoreError) -> StageError {
    if e.is_query_cancelled() {
        return StageError::Cancelled;
    }
    if matches!(e, StoreError::SearchesBusy) {
        return StageError::Busy(e.to_string());
    }
    StageError::Backend(e.to_string())
}

#[async_trait]
impl Retriever for DatabaseRetriever {
    async fn dense(
        &self,
        vector: Arc<Vec<f32>>,
        k: usize,
        filter: &Filter,
        cancel: Cancel,
    ) -> Result<Vec<Hit>, StageError> {
        let limits = self.limits(&cancel, k, filter)?;
        let rows = self
            .store
            .dense_search(self.collection, &vector, k, filter, limits)
            .await
            .map_err(stage_error)?;
        let hits = rows
            .iter()
            .map(|r| Hit {
                chunk_id: r.chunk.chunk_id,
                score: r.similarity,
            })
            .collect();
        self.keep(rows);
        Ok(hits)
    }

    async fn lexical_documents(
        &self,
        query: &str,
        k: usize,
        filter: &Filter,
        vector: Option<Arc<Vec<f32>>>,
        per_document: usize,
        cancel: Cancel,
    ) -> Result<Vec<DocHit>, StageError> {
        let limits = self.limits(&cancel, k, filter)?;
        let vector_ref = vector.as_deref().map(Vec::as_slice);
        let docs = if per_document == 0 {
            self.store
                .ranked_documents(self.collection, query, k, filter, limits)
                .await
        } else {
            self.store
                .lexical_documents(self.collection, query, k, filter, vector_ref, limits)
                .await
        }
        .map_err(stage_error)?;
        Ok(self.picked(docs, vector.is_some(), per_document))
    }

    /// Passages are read for the documents shown only: scoring a
    /// document's chunks reads them all, and a top 100's cost the database
    /// 6–14 ms of a hybrid search's ≈ 35 at 1M chunks (`ragtime-bench
    /// pgscale`), where a top 10 is what is shown.
    fn passages_apart(&self) -> bool {
        true
    }

    fn hybrid_lexical_depth(&self, k: usize) -> usize {
        lexical_depth(k)
    }

    async fn passages(
        &self,
        query: &str,
        documents: &[i64],
        vector: Option<Arc<Vec<f32>>>,
        per_document: usize,
        cancel: Cancel,
    ) -> Result<Vec<DocHit>, StageError> {
        let limits = self.limits(&cancel, documents.len(), &Filter::All)?;
        let docs = self
            .store
            .document_passages(
                self.collection,
                query,
                documents,
                vector.as_deref().map(Vec::as_slice),
                limits,
            )
            .await
            .map_err(stage_error)?;
        Ok(self.picked(docs, vector.is_some(), per_document))
    }

    fn fusion(&self) -> Option<FusionParams> {
        Some(DATABASE_FUSION)
    }

    fn chunk(&self, id: i64) -> Option<Arc<Chunk>> {
        self.found
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&id)
            .cloned()
    }
}

/// A document's passages, as the in-memory engine picks them: by
/// similarity (document order without a vector); where there is more
/// than one, by [`in_document_score`], keeping the best and then those
/// that match the query's words; `per_document` at most.
fn pick_passages(chunks: &[FoundChunk], vector: bool, top: f32, per_document: usize) -> Vec<Hit> {
    if per_document == 0 {
        return Vec::new();
    }
    let mut hits: Vec<(Hit, f32)> = chunks
        .iter()
        .map(|c| {
            let score = if vector { c.similarity } else { 0.0 };
            (
                Hit {
                    chunk_id: c.chunk.chunk_id,
                    score,
                },
                c.rank,
            )
        })
        .collect();
    // Stable: equal scores keep document order.
    hits.sort_by(|a, b| b.0.score.total_cmp(&a.0.score));
    if hits.len() > 1 {
        for (h, rank) in &mut hits {
            h.score = in_document_score(vector.then_some(h.score), *rank, top);
        }
        hits.sort_by(|a, b| b.0.score.total_cmp(&a.0.score));
        let mut kept = 0;
        hits.retain(|(_, rank)| {
            kept += 1;
            kept == 1 || *rank > 0.0
        });
    }
    hits.truncate(per_document);
    hits.into_iter().map(|(h, _)| h).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lexical_side_ranks_three_tenths_of_the_candidates() {
        assert_eq!(lexical_depth(100), 30);
        assert_eq!(lexical_depth(300), 90);
        assert_eq!(lexical_depth(1), 1);
        assert_eq!(lexical_depth(0), 1);
    }

    #[test]
    fn the_candidate_list_grows_with_the_database_and_stays_within_pgvectors_bound() {
        // Up to the reference size the configured list is kept.
        assert_eq!(ef_search_for(100, 10, 0), 100);
        assert_eq!(ef_search_for(100, 10, EF_REFERENCE_CHUNKS), 100);
        // Past it, it grows as the size's power: 10× the chunks, 10^0.6×.
        assert_eq!(ef_search_for(100, 10, 10 * EF_REFERENCE_CHUNKS), 398);
        let (a, b) = (
            ef_search_for(100, 10, 300_000),
            ef_search_for(100, 10, 600_000),
        );
        assert!(100 < a && a < b && b < 398, "{a} {b}");
        // Never past pgvector's bound, never under k or the configured list.
        assert_eq!(ef_search_for(100, 10, 1_000 * EF_REFERENCE_CHUNKS), 1000);
        assert_eq!(ef_search_for(100, 500, 0), 500);
        assert_eq!(ef_search_for(700, 10, 2 * EF_REFERENCE_CHUNKS), 1000);
        assert_eq!(ef_search_for(40, 10, 0), 40);
    }

    #[test]
    fn a_filtered_search_walks_the_longest_list_and_may_be_ranked_exactly() {
        let filter = Filter::parse(&serde_json::json!({"tag": "a"}), "filter").expect("filter");
        let plain = database_limits(400, 10, &Filter::All, None);
        assert_eq!(
            (plain.ef_search, plain.exact_below),
            (400, DATABASE_EXACT_BELOW)
        );
        assert_eq!(database_limits(100, 500, &Filter::All, None).ef_search, 500);
        assert_eq!(
            database_limits(100, 5000, &Filter::All, None).ef_search,
            1000
        );
        let filtered = database_limits(100, 10, &filter, Some(Duration::from_millis(40)));
        assert_eq!(filtered.ef_search, 1000);
        assert_eq!(filtered.timeout, Some(Duration::from_millis(40)));
    }

    fn chunk(id: i64, similarity: f32, rank: f32) -> FoundChunk {
        FoundChunk {
            chunk: Chunk {
                chunk_id: id,
                document_id: 1,
                external_id: "d".into(),
                position: i32::try_from(id).unwrap_or(0),
                title: String::new(),
                section: String::new(),
                metadata: Arc::default(),
                text: String::new(),
            },
            similarity,
            rank,
        }
    }

    #[test]
    fn passages_are_the_best_then_those_matching_the_words() {
        let chunks = [chunk(1, 0.9, 0.1), chunk(2, 0.2, 0.0), chunk(3, 0.5, 0.4)];
        let ids = |h: Vec<Hit>| h.into_iter().map(|h| h.chunk_id).collect::<Vec<_>>();
        // 1: 0.9 + 0.5·0.1/0.4; 3: 0.5 + 0.5·0.4/0.4; 2 has none of the words.
        assert_eq!(ids(pick_passages(&chunks, true, 0.4, 5)), vec![1, 3]);
        assert_eq!(ids(pick_passages(&chunks, true, 0.4, 1)), vec![1]);
        // Without a vector: by rank alone.
        assert_eq!(ids(pick_passages(&chunks, false, 0.4, 5)), vec![3, 1]);
        assert!(pick_passages(&chunks, true, 0.4, 0).is_empty());
        // One chunk: kept whatever its rank.
        assert_eq!(ids(pick_passages(&chunks[1..2], true, 0.4, 5)), vec![2]);
    }
}
