//! Searching inside the database (the `postgres` retrieval engine):
//! PostgreSQL with pgvector holds each chunk's vector beside the chunk
//! and ranks text with its own full-text search, so a replica keeps no
//! index of its own and every replica sees a write as soon as it commits.
//!
//! The engine's schema is made by [`Store::enable_database_search`] at
//! start, not by a migration: it needs the `vector` extension, which a
//! database serving the in-memory engine may not have (the PostgreSQL
//! migrations stay runnable on any PostgreSQL). It is idempotent and
//! taken under an advisory lock, so replicas starting together make it
//! once:
//!
//! - `chunks.dense halfvec` (16-bit floats: half the size of `vector`; the
//!   embedding model's 384 dimensions at 776 bytes) with an HNSW index
//!   (cosine) on it cast to the deployment's dimension, which
//!   `search_schema` records and every start checks;
//! - `chunks.tsv` (section and text) and `documents.tsv` (title weighted
//!   `A`, then every chunk's section and text), English stemming, GIN
//!   indexed; `documents.meta`, the metadata as `jsonb`, for filters;
//! - `ragtime_rfc3339_ms`, for date filters ([`crate::filter_sql`]);
//! - `document_values`, every number and date in a document's metadata
//!   as a row, kept by a trigger, for range filters
//!   ([`crate::filter_sql::DOCUMENT_VALUES`]).
//!
//! Once enabled, every chunk write also writes its `dense` vector, and a
//! document's `tsv`, in the write's own transaction — by any process on
//! the database (a store opened on it finds the schema), so a replica or
//! `ragtime ingest` running the in-memory engine keeps them current too. Chunks stored
//! before (a corpus that served the in-memory engine) are filled in from
//! their stored embeddings by the same call, at every start; partial
//! indexes over the rows that lack them make that look cheap when none do.
//!
//! Each search runs in a transaction of its own under a
//! `statement_timeout` from its stage's deadline, so the database itself
//! stops a query that overruns, and the connection goes back to the pool
//! usable; a search dropped before it ends (its client went away) is
//! cancelled in the database at once. `hnsw.iterative_scan` lets a filtered search go on past
//! `ef_search` candidates until it has `k` that pass.
//!
//! A filter that passes few chunks is not left to the graph: a walk keeps
//! the nearest it reaches, and the few that pass lie scattered among
//! nearer ones that do not (at 1M chunks a 1 % filter's walk found 0.71
//! of the ten nearest). Where the filter has an equality the metadata
//! index (GIN on `documents.meta`) can answer, or a range on a number or
//! a date (`document_values`), the chunks that pass are counted through
//! it, and up to `SearchLimits::exact_below` of them are ranked exactly,
//! as the in-memory engine scans a small allowed set.

use crate::filter_sql::{
    Bind, Condition, DOCUMENT_VALUES, DOCUMENT_VALUES_FILL, Documents, RFC3339_FUNCTION,
    VALUES_FUNCTIONS, compile, index_condition,
};
use crate::standbys::Read;
use crate::{Pool, Store, StoreError};
use ragtime_core::{Chunk, Filter};
use sqlx::postgres::{PgArguments, Postgres};
use sqlx::query::QueryAs;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// A chunk as a search returns it, with its scores.
#[derive(Debug, Clone, PartialEq)]
pub struct FoundChunk {
    pub chunk: Chunk,
    /// Cosine similarity to the query vector (0 without one).
    pub similarity: f32,
    /// The chunk's own text rank for the query (0 from a dense search).
    pub rank: f32,
}

/// A document a lexical search found, with the chunks it holds.
#[derive(Debug, Clone, PartialEq)]
pub struct FoundDocument {
    pub document_id: i64,
    pub score: f32,
    /// Its chunks in order, scored against the query.
    pub chunks: Vec<FoundChunk>,
}

/// How documents are ranked by their words in the database.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lexical {
    /// BM25 from the `pg_textsearch` extension's index (`USING bm25`),
    /// where the database has it.
    Bm25,
    /// PostgreSQL's own `ts_rank`, everywhere else.
    TsRank,
}

/// The database engine's schema in this database.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Schema {
    /// The vectors' dimension.
    pub dim: usize,
    pub lexical: Lexical,
}

/// How one search runs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SearchLimits {
    /// The database cancels the query after this long (`None`: no limit).
    pub timeout: Option<Duration>,
    /// HNSW candidates the walk keeps (`hnsw.ef_search`, at most 1000).
    pub ef_search: usize,
    /// A filtered dense search whose filter the metadata index can narrow
    /// ([`index_condition`]) to at most this many chunks ranks them
    /// exactly instead of walking the graph (0: never).
    pub exact_below: usize,
}

/// How the database engine answered the filtered dense searches (those
/// that answered) since the store opened (`/metrics`: `ragtime_database_filtered_searches_total`):
/// an admin reads from it whether filters are ranked exactly or walked,
/// and what deciding cost.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FilteredPaths {
    /// Ranked exactly: the metadata index narrowed the filter to at most
    /// [`SearchLimits::exact_below`] chunks.
    pub exact: u64,
    /// Counted through the metadata index past the bound, then walked.
    pub counted: u64,
    /// Found broad by a sample of the documents, walked without a count.
    pub sampled: u64,
    /// Walked with nothing to try first (no index condition: negations,
    /// ranges on strings, equalities on dates, dotted keys; or exact
    /// ranking switched off).
    pub walked: u64,
}

/// The counts behind [`FilteredPaths`], shared by a store's clones.
#[derive(Debug, Default)]
pub(crate) struct PathCounts {
    exact: AtomicU64,
    counted: AtomicU64,
    sampled: AtomicU64,
    walked: AtomicU64,
}

impl PathCounts {
    /// Where `path` is counted.
    fn of(&self, path: &Narrowed) -> &AtomicU64 {
        match path {
            Narrowed::Exact(_) => &self.exact,
            Narrowed::Counted => &self.counted,
            Narrowed::Sampled => &self.sampled,
            Narrowed::Walked => &self.walked,
        }
    }
}

impl Store {
    /// How filtered dense searches were answered since the store opened.
    pub fn filtered_paths(&self) -> FilteredPaths {
        let n = |c: &AtomicU64| c.load(Ordering::Relaxed);
        FilteredPaths {
            exact: n(&self.paths.exact),
            counted: n(&self.paths.counted),
            sampled: n(&self.paths.sampled),
            walked: n(&self.paths.walked),
        }
    }
}

/// What a filtered dense search does ([`narrowed`]).
enum Narrowed {
    /// Rank exactly the chunks that pass this index condition.
    Exact(Condition),
    /// Walk: counted past the bound.
    Counted,
    /// Walk: a sample found the filter broad.
    Sampled,
    /// Walk: nothing to try.
    Walked,
}

/// The vector's text form (`[0.1,0.2,…]`), which `halfvec` parses.
pub fn vector_text(v: &[f32]) -> String {
    let mut s = String::with_capacity(v.len() * 10 + 2);
    s.push('[');
    for (i, x) in v.iter().enumerate() {
        if i > 0 {
            s.push(',');
        }
        let _ = write!(s, "{x}");
    }
    s.push(']');
    s
}

/// The HNSW graph's build parameters. At 1M SciFact-like chunks (`ragtime-bench
/// pgscale`, docs/scaling.md) a graph of 24 links built with a list of 128
/// finds 0.96 of the ten nearest at `ef_search` 400, 0.94 with a 10 %
/// filter at 400 and 0.96 at 1000; pgvector's default (16, 64) finds 0.92,
/// 0.81 and 0.87. It takes twice as long to build.
pub const HNSW_BUILD: &str = "m = 24, ef_construction = 128";

/// The advisory lock the schema is made under.
const LOCK_SCHEMA: i64 = 0x5254_0003;
/// Chunks filled in per statement when an existing corpus is enabled.
const BACKFILL_BATCH: i64 = 2000;
/// The text search configuration (Snowball English, as the in-memory
/// engine's analyser).
const TS_CONFIG: &str = "english";

/// The `tsv` a document gets: its title (weight A), then its chunks'
/// sections and text.
pub(crate) const DOCUMENT_TSV: &str = "UPDATE documents SET tsv = \
     setweight(to_tsvector('english', title), 'A') || to_tsvector('english', \
     COALESCE((SELECT string_agg(section || ' ' || text, ' ' ORDER BY position) \
     FROM chunks WHERE document_id = $1), '')) WHERE id = $1";

/// [`DOCUMENT_TSV`] and, for the BM25 index, the same words as one text
/// (`documents.body`).
pub(crate) const DOCUMENT_TEXT_BM25: &str = "UPDATE documents SET tsv = \
     setweight(to_tsvector('english', title), 'A') || to_tsvector('english', b.words), \
     body = title || ' ' || b.words \
     FROM (SELECT COALESCE((SELECT string_agg(section || ' ' || text, ' ' ORDER BY position) \
     FROM chunks WHERE document_id = $1), '') AS words) b WHERE id = $1";

/// What the engine needs of the database that it lacks, for the start's
/// error message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Missing {
    /// The store is SQLite.
    Postgres,
    /// No `vector` extension (or one older than 0.8) can be installed.
    Pgvector(String),
    /// The database's vectors have another dimension.
    Dimension { stored: i32, wanted: usize },
}

impl std::fmt::Display for Missing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Missing::Postgres => write!(
                f,
                "it needs the PostgreSQL store (database_url = \"postgres://…\"); this one is SQLite"
            ),
            Missing::Pgvector(found) => write!(
                f,
                "it needs the pgvector extension 0.8 or later (`vector`) in the database; {found}"
            ),
            Missing::Dimension { stored, wanted } => write!(
                f,
                "the database's vectors have {stored} dimensions and the embedding model gives {wanted}: use the model the corpus was embedded with, or a new database"
            ),
        }
    }
}

impl Store {
    /// The statement that keeps a document's words current, when chunk
    /// writes also write the database engine's columns.
    pub(crate) fn document_text_sql(&self) -> Option<&'static str> {
        self.search_schema.get().map(|s| match s.lexical {
            Lexical::Bm25 => DOCUMENT_TEXT_BM25,
            Lexical::TsRank => DOCUMENT_TSV,
        })
    }

    /// Whether chunk writes also write the database engine's columns.
    pub fn searches_in_database(&self) -> bool {
        self.search_schema.get().is_some()
    }

    /// How documents are ranked by their words, once enabled.
    pub fn lexical_ranking(&self) -> Option<Lexical> {
        self.search_schema.get().map(|s| s.lexical)
    }

    /// Makes the database engine's schema for vectors of `dim` dimensions
    /// (see the module docs) and fills in chunks stored without it;
    /// returns how many it filled in. [`StoreError::Unsupported`] says what
    /// the database lacks.
    pub async fn enable_database_search(&self, dim: usize) -> Result<u64, StoreError> {
        let Pool::Postgres(p) = &self.pool else {
            return Err(StoreError::Unsupported(Missing::Postgres));
        };
        let version: Option<String> = sqlx::query_scalar(
            "SELECT COALESCE(installed_version, default_version) FROM pg_available_extensions WHERE name = 'vector'",
        )
        .fetch_optional(p)
        .await
        ?;
        match version.as_deref().map(version_at_least_0_8) {
            None => {
                return Err(StoreError::Unsupported(Missing::Pgvector(
                    "the server has no `vector` extension".into(),
                )));
            }
            Some(false) => {
                return Err(StoreError::Unsupported(Missing::Pgvector(format!(
                    "the server has {}",
                    version.unwrap_or_default()
                ))));
            }
            Some(true) => {}
        }
        let mut tx = p.begin().await?;
        // Each statement sees what committed before it (whatever the
        // database's default): `document_values` is filled from the
        // documents committed once its trigger holds the table's lock.
        let statements = [
            "SET TRANSACTION ISOLATION LEVEL READ COMMITTED".to_owned(),
            format!("SELECT pg_advisory_xact_lock({LOCK_SCHEMA})"),
            "CREATE EXTENSION IF NOT EXISTS vector".into(),
            "CREATE TABLE IF NOT EXISTS search_schema (id INTEGER PRIMARY KEY CHECK (id = 1), dim INTEGER NOT NULL)".into(),
            RFC3339_FUNCTION.into(),
        ];
        for sql in statements
            .iter()
            .map(String::as_str)
            .chain(VALUES_FUNCTIONS)
        {
            sqlx::query(sql).execute(&mut *tx).await?;
        }
        let values_made: bool =
            sqlx::query_scalar("SELECT to_regclass('document_values') IS NOT NULL")
                .fetch_one(&mut *tx)
                .await?;
        if !values_made {
            for sql in DOCUMENT_VALUES.into_iter().chain([DOCUMENT_VALUES_FILL]) {
                sqlx::query(sql).execute(&mut *tx).await?;
            }
        }
        let columns = [
            ("chunks", "dense", "halfvec".to_owned()),
            (
                "chunks",
                "tsv",
                format!(
                    "tsvector GENERATED ALWAYS AS (to_tsvector('{TS_CONFIG}', section || ' ' || text)) STORED"
                ),
            ),
            ("documents", "tsv", "tsvector".into()),
            (
                "documents",
                "meta",
                "jsonb GENERATED ALWAYS AS (metadata::jsonb) STORED".into(),
            ),
        ];
        for (table, column, definition) in columns {
            add_column(&mut tx, table, column, &definition).await?;
        }
        let stored: Option<i32> = sqlx::query_scalar("SELECT dim FROM search_schema WHERE id = 1")
            .fetch_optional(&mut *tx)
            .await?;
        let wanted = i32::try_from(dim).unwrap_or(i32::MAX);
        match stored {
            Some(s) if s != wanted => {
                return Err(StoreError::Unsupported(Missing::Dimension {
                    stored: s,
                    wanted: dim,
                }));
            }
            Some(_) => {}
            None => {
                sqlx::query("INSERT INTO search_schema (id, dim) VALUES (1, $1)")
                    .bind(wanted)
                    .execute(&mut *tx)
                    .await?;
            }
        }
        let lexical = bm25_if_available(&mut tx).await?;
        let indexes = [
            format!(
                "CREATE INDEX IF NOT EXISTS chunks_dense_hnsw ON chunks USING hnsw ((dense::halfvec({dim})) halfvec_cosine_ops) WITH ({HNSW_BUILD})"
            ),
            // Equality filters narrowed by containment (`index_condition`).
            "CREATE INDEX IF NOT EXISTS documents_meta ON documents USING gin (meta jsonb_path_ops)"
                .into(),
            "CREATE INDEX IF NOT EXISTS chunks_tsv ON chunks USING gin (tsv)".into(),
            "CREATE INDEX IF NOT EXISTS documents_tsv ON documents USING gin (tsv)".into(),
            // What a start fills in, found without reading every row.
            "CREATE INDEX IF NOT EXISTS chunks_without_dense ON chunks (id) WHERE dense IS NULL"
                .into(),
            "CREATE INDEX IF NOT EXISTS documents_without_tsv ON documents (id) WHERE tsv IS NULL"
                .into(),
        ];
        for sql in indexes {
            create_index(&mut tx, &sql).await?;
        }
        let filled = backfill(&mut tx, lexical).await?;
        if lexical == Lexical::Bm25 {
            // When the index was last built ([`crate::bm25_upkeep`]).
            add_column(&mut tx, "search_schema", "bm25_built_ms", "bigint").await?;
            let made = create_index(&mut tx, &format!(
                "CREATE INDEX IF NOT EXISTS documents_bm25 ON documents USING bm25 (body) WITH (text_config = '{TS_CONFIG}')"
            ))
            .await?;
            if made {
                crate::bm25_upkeep::record_build(&mut *tx, crate::now_ms()).await?;
            }
        }
        tx.commit().await?;
        let _ = self.search_schema.set(Schema { dim, lexical });
        Ok(filled)
    }

    /// The `k` chunks of collection `collection_id` nearest to unit
    /// `vector` among those whose document passes `filter`, nearest first.
    pub async fn dense_search(
        &self,
        collection_id: i64,
        vector: &[f32],
        k: usize,
        filter: &Filter,
        limits: SearchLimits,
    ) -> Result<Vec<FoundChunk>, StoreError> {
        self.on_reader(|p, dim| self.dense_on(p, dim, collection_id, vector, k, filter, limits))
            .await
    }

    #[allow(clippy::too_many_arguments)]
    async fn dense_on(
        &self,
        p: &sqlx::PgPool,
        dim: usize,
        collection_id: i64,
        vector: &[f32],
        k: usize,
        filter: &Filter,
        limits: SearchLimits,
    ) -> Result<Vec<FoundChunk>, StoreError> {
        let cond = compile(filter, "d.meta", 4);
        let mut tx = p.begin().await?;
        let running = set_limits(p, &mut tx, limits).await?;
        let path = match (limits.exact_below, filter.is_all()) {
            (_, true) => None,
            (0, _) => Some(Narrowed::Walked),
            _ => match narrowed(
                &mut tx,
                collection_id,
                filter,
                cond.binds.len(),
                limits.exact_below,
            )
            .await
            {
                Ok(path) => Some(path),
                Err(e) => {
                    running.ended();
                    return Err(e.into());
                }
            },
        };
        // Counted once the search has answered: one that fails here and
        // runs again on the primary is one search.
        let counter = path.as_ref().map(|path| self.paths.of(path));
        let (sql, pre) = match path {
            // The few chunks that pass, every one ranked. The distances
            // are materialized before they are ordered: an order by the
            // distance itself is the graph's, and the planner would walk
            // it.
            Some(Narrowed::Exact(pre)) => (
                format!(
                    "WITH passing AS MATERIALIZED (SELECT c.id, \
                     (c.dense::halfvec({dim}) <=> $1::halfvec({dim}))::float8 AS dist \
                     FROM chunks c JOIN documents d ON d.id = c.document_id \
                     WHERE d.collection_id = $2 AND c.dense IS NOT NULL AND {} AND {}), \
                     best AS (SELECT id, dist FROM passing ORDER BY dist, id LIMIT $3) \
                     SELECT {CHUNK_COLUMNS}, b.dist FROM best b \
                     JOIN chunks c ON c.id = b.id JOIN documents d ON d.id = c.document_id \
                     ORDER BY b.dist, c.id",
                    cond.sql, pre.sql
                ),
                Some(pre),
            ),
            _ => (
                format!(
                    "WITH r AS MATERIALIZED (SELECT {CHUNK_COLUMNS}, \
                     (c.dense::halfvec({dim}) <=> $1::halfvec({dim}))::float8 AS dist \
                     FROM chunks c JOIN documents d ON d.id = c.document_id \
                     WHERE d.collection_id = $2 AND c.dense IS NOT NULL AND {} \
                     ORDER BY c.dense::halfvec({dim}) <=> $1::halfvec({dim}) LIMIT $3) \
                     SELECT * FROM r ORDER BY dist, id",
                    cond.sql
                ),
                None,
            ),
        };
        let q = sqlx::query_as::<_, ChunkRow>(&sql)
            .bind(vector_text(vector))
            .bind(collection_id)
            .bind(i64::try_from(k).unwrap_or(i64::MAX))
            .persistent(false);
        let q = bind_all(q, &cond);
        let q = match &pre {
            Some(pre) => bind_all(q, pre),
            None => q,
        };
        let rows = q.fetch_all(&mut *tx).await;
        running.ended();
        let rows = rows?;
        tx.rollback().await?;
        if let Some(counter) = counter {
            counter.fetch_add(1, Ordering::Relaxed);
        }
        Ok(rows
            .into_iter()
            .map(|r| found(r, |dist| (1.0 - dist) as f32, 0.0))
            .collect())
    }

    /// The `k` documents of collection `collection_id` whose title and
    /// text rank best for `query` (any of its words, `ts_rank`), among
    /// those that pass `filter`, best first, each with all its chunks
    /// scored: their cosine similarity to `vector` (when given) and their
    /// own rank for the query.
    pub async fn lexical_documents(
        &self,
        collection_id: i64,
        query: &str,
        k: usize,
        filter: &Filter,
        vector: Option<&[f32]>,
        limits: SearchLimits,
    ) -> Result<Vec<FoundDocument>, StoreError> {
        self.on_reader(|p, dim| {
            let chunks = Chunks::Scored(vector);
            self.lexical_on(p, dim, collection_id, query, k, filter, chunks, limits)
        })
        .await
    }

    /// [`Store::lexical_documents`] without the chunks: the ranking alone
    /// (each document's `chunks` empty), for a search that reads the
    /// passages of the few documents it keeps afterwards
    /// ([`Store::document_passages`]) rather than those of all `k`.
    pub async fn ranked_documents(
        &self,
        collection_id: i64,
        query: &str,
        k: usize,
        filter: &Filter,
        limits: SearchLimits,
    ) -> Result<Vec<FoundDocument>, StoreError> {
        self.on_reader(|p, dim| {
            self.lexical_on(p, dim, collection_id, query, k, filter, Chunks::No, limits)
        })
        .await
    }

    /// The documents `ids` of collection `collection_id`, in that order,
    /// each with all its chunks scored as [`Store::lexical_documents`]
    /// scores them (similarity to `vector` when given, rank for `query`);
    /// a document's score is 0, and one not in the collection (removed
    /// since) is left out.
    pub async fn document_passages(
        &self,
        collection_id: i64,
        query: &str,
        ids: &[i64],
        vector: Option<&[f32]>,
        limits: SearchLimits,
    ) -> Result<Vec<FoundDocument>, StoreError> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        self.on_reader(|p, dim| async move {
            let mut tx = p.begin().await?;
            let running = set_limits(p, &mut tx, limits).await?;
            let docs: Vec<(i64, f64)> = ids.iter().map(|&id| (id, 0.0)).collect();
            let found = with_chunks(&mut tx, dim, collection_id, query, docs, vector).await;
            running.ended();
            let found = found?;
            tx.rollback().await?;
            Ok(found.into_iter().filter(|d| !d.chunks.is_empty()).collect())
        })
        .await
    }

    /// The ranking, and each document's chunks scored where `chunks` asks.
    #[allow(clippy::too_many_arguments)]
    async fn lexical_on(
        &self,
        p: &sqlx::PgPool,
        dim: usize,
        collection_id: i64,
        query: &str,
        k: usize,
        filter: &Filter,
        chunks: Chunks<'_>,
        limits: SearchLimits,
    ) -> Result<Vec<FoundDocument>, StoreError> {
        let cond = compile(filter, "d.meta", 4);
        let mut tx = p.begin().await?;
        let running = set_limits(p, &mut tx, limits).await?;
        let docs = match self.lexical_ranking() {
            Some(Lexical::Bm25) => bm25_documents(&mut tx, query, collection_id, k, &cond).await,
            _ => {
                let sql = format!(
                    "SELECT d.id, ts_rank({RANK_WEIGHTS}, d.tsv, q.q)::float8 AS score \
                     FROM documents d, ({ANY_WORD}) q \
                     WHERE d.collection_id = $2 AND d.tsv @@ q.q AND {} \
                     ORDER BY score DESC, d.id LIMIT $3",
                    cond.sql
                );
                let limit = i64::try_from(k).unwrap_or(i64::MAX);
                ranked_rows(&mut tx, &sql, query, collection_id, limit, &cond).await
            }
        };
        let found = match (docs, chunks) {
            (Ok(d), Chunks::Scored(vector)) if !d.is_empty() => {
                with_chunks(&mut tx, dim, collection_id, query, d, vector).await
            }
            (Ok(d), _) => Ok(d
                .into_iter()
                .map(|(document_id, score)| FoundDocument {
                    document_id,
                    score: score as f32,
                    chunks: Vec::new(),
                })
                .collect()),
            (Err(e), _) => Err(e),
        };
        running.ended();
        let found = found?;
        tx.rollback().await?;
        Ok(found)
    }

    /// Runs a search on a standby that may serve it, else (or when it
    /// fails there for any reason but its deadline) on the primary.
    async fn on_reader<'a, T, Fut>(
        &'a self,
        search: impl Fn(&'a sqlx::PgPool, usize) -> Fut,
    ) -> Result<T, StoreError>
    where
        Fut: std::future::Future<Output = Result<T, StoreError>> + 'a,
    {
        let (primary, dim) = self.search_pool()?;
        self.on_standby(Read::Search, primary, |p| search(p, dim))
            .await
            .map_err(|e| match e {
                StoreError::Db(sqlx::Error::PoolTimedOut) => StoreError::SearchesBusy,
                e => e,
            })
    }

    /// The searches' own pool and the vectors' dimension, once enabled.
    fn search_pool(&self) -> Result<(&sqlx::PgPool, usize), StoreError> {
        match (&self.searches, self.search_schema.get()) {
            (Some(p), Some(schema)) => Ok((p, schema.dim)),
            _ => Err(StoreError::Url(
                "searching in the database needs enable_database_search first".into(),
            )),
        }
    }

    /// Whether every search connection is taken: a search asked now would
    /// wait for one ([`StoreError::SearchesBusy`] after a second), so a
    /// caller refuses it at once instead.
    pub fn searches_full(&self) -> bool {
        self.searches
            .as_ref()
            .is_some_and(|p| p.size() >= p.options().get_max_connections() && p.num_idle() == 0)
    }
}

/// What a lexical search reads beside its ranking.
#[derive(Debug, Clone, Copy)]
enum Chunks<'a> {
    /// Nothing: the ranking alone.
    No,
    /// Each document's chunks, scored (against the query vector, if any).
    Scored(Option<&'a [f32]>),
}

/// The documents `docs` (`(id, score)`, in that order) of the collection,
/// each with all its chunks scored: their cosine similarity to `vector`
/// (when given) and their own rank for `query`. A document not in the
/// collection comes back with none.
async fn with_chunks(
    tx: &mut sqlx::Transaction<'static, Postgres>,
    dim: usize,
    collection_id: i64,
    query: &str,
    docs: Vec<(i64, f64)>,
    vector: Option<&[f32]>,
) -> Result<Vec<FoundDocument>, sqlx::Error> {
    let ids: Vec<i64> = docs.iter().map(|d| d.0).collect();
    let chunks_sql = format!(
        "SELECT {CHUNK_COLUMNS}, \
         CASE WHEN $3::text IS NULL THEN 1.0::float8 \
         ELSE (c.dense::halfvec({dim}) <=> $3::text::halfvec({dim}))::float8 END AS dist, \
         ts_rank({RANK_WEIGHTS}, c.tsv, q.q)::float8 AS rank \
         FROM chunks c JOIN documents d ON d.id = c.document_id, ({ANY_WORD}) q \
         WHERE c.document_id = ANY($2) AND d.collection_id = $4 \
         ORDER BY c.document_id, c.position"
    );
    let rows: Vec<RankedRow> = sqlx::query_as(&chunks_sql)
        .bind(query)
        .bind(&ids)
        .bind(vector.map(vector_text))
        .bind(collection_id)
        .fetch_all(&mut **tx)
        .await?;
    let mut out: Vec<FoundDocument> = docs
        .into_iter()
        .map(|(id, score)| FoundDocument {
            document_id: id,
            score: score as f32,
            chunks: Vec::new(),
        })
        .collect();
    let at: std::collections::HashMap<i64, usize> = out
        .iter()
        .enumerate()
        .map(|(i, d)| (d.document_id, i))
        .collect();
    let with_vector = vector.is_some();
    for r in rows {
        let Some(&i) = at.get(&r.1) else { continue };
        let row = (r.0, r.1, r.2, r.3, r.4, r.5, r.6, r.7, r.8);
        let sim = |dist: f64| {
            if with_vector {
                (1.0 - dist) as f32
            } else {
                0.0
            }
        };
        out[i].chunks.push(found(row, sim, r.9 as f32));
    }
    Ok(out)
}

/// The extension's bound on `pg_textsearch.default_limit`.
const BM25_MAX_DEPTH: usize = 100_000;

/// The `k` documents of the collection that BM25 ranks best for `query`
/// among those passing `cond` (scores positive, best first).
///
/// They are read from the index's walk with the scan's own scores
/// (`bm25_get_current_score()`, the negated score of the row it just
/// returned): 1 ms for a top 100 of SciFact, ≈ 25 ms for a long question
/// over 290,000 documents, where scoring the rows again with the `<@>`
/// operator tokenizes each text again (0.1–0.35 ms a document: 35 ms for
/// 100 rows, 0.3–0.5 s for all of SciFact's candidates for one question).
/// The walk is not exact in pg_textsearch 0.6: once the index is written
/// out in segments, its block-max walk leaves some documents under-scored
/// (its issue 365, fixed in 1.2): SciFact lexical nDCG@10 0.620 in
/// segments against 0.650–0.668 while the documents were still in the
/// index's memory, and scoring the walk's top 100 again by the operator
/// brings back only 0.647 (the documents it dropped stay dropped).
/// Sorting is switched off for the query so that the walk is the
/// planner's only plan without a sort: the score is only defined on that
/// plan.
async fn bm25_documents(
    tx: &mut sqlx::Transaction<'static, Postgres>,
    query: &str,
    collection_id: i64,
    k: usize,
    cond: &Condition,
) -> Result<Vec<(i64, f64)>, sqlx::Error> {
    let limit = i64::try_from(k).unwrap_or(i64::MAX);
    let ranked = format!(
        "SELECT d.id, bm25_get_current_score()::float8 AS score \
         FROM documents d WHERE d.collection_id = $2 AND {} \
         ORDER BY d.body <@> to_bm25query($1, 'documents_bm25') LIMIT $3",
        cond.sql
    );
    // The index ranks this many before the conditions apply, and ranks
    // deeper by itself when too few of them pass; the depth is what a
    // search costs (SciFact, 5,183 documents: 1 ms at 100, 46 ms at
    // 1,000).
    sqlx::query(
        "SELECT set_config('enable_sort', 'off', true), \
                set_config('pg_textsearch.default_limit', $1, true)",
    )
    .bind(k.clamp(1, BM25_MAX_DEPTH).to_string())
    .execute(&mut **tx)
    .await?;
    let found = ranked_rows(tx, &ranked, query, collection_id, limit, cond).await?;
    sqlx::query("SELECT set_config('enable_sort', 'on', true)")
        .execute(&mut **tx)
        .await?;
    // The index hands its rows over best (lowest) first: rows in any
    // other order did not come from its walk, and neither did their
    // scores, so the exact scoring decides instead.
    if !in_walk_order(&found) {
        return bm25_exact(tx, query, collection_id, limit, cond).await;
    }
    Ok(best_first(found))
}

/// Whether the rows are in the walk's order, best (lowest) first, within
/// a relative 10⁻⁵: the scores are single-precision sums, and two
/// segments can sum one score in another order (1M chunks: a pair
/// returned as -30.111101 before -30.111103). Exact scoring for that
/// pair scored every document holding any of the question's words again
/// from its text: 21 s for one question.
fn in_walk_order(found: &[(i64, f64)]) -> bool {
    found
        .windows(2)
        .all(|w| w[0].1 <= w[1].1 + 1e-5 * w[1].1.abs().max(1.0))
}

/// Every document of the collection with any of the words (the GIN index
/// on `tsv`, a bitmap scan), each scored by the `<@>` operator: exact, but
/// at 0.1–0.35 ms a candidate, so only where the walk's rows cannot be
/// trusted. No index scan, so that the BM25 index cannot cut the
/// candidates.
async fn bm25_exact(
    tx: &mut sqlx::Transaction<'static, Postgres>,
    query: &str,
    collection_id: i64,
    limit: i64,
    cond: &Condition,
) -> Result<Vec<(i64, f64)>, sqlx::Error> {
    sqlx::query("SELECT set_config('enable_indexscan', 'off', true)")
        .execute(&mut **tx)
        .await?;
    let exact = format!(
        "SELECT d.id, (d.body <@> to_bm25query($1, 'documents_bm25'))::float8 AS score \
         FROM documents d, ({ANY_WORD}) q WHERE d.collection_id = $2 AND d.tsv @@ q.q AND {} \
         ORDER BY score, d.id LIMIT $3",
        cond.sql
    );
    let found = ranked_rows(tx, &exact, query, collection_id, limit, cond).await?;
    sqlx::query("SELECT set_config('enable_indexscan', 'on', true)")
        .execute(&mut **tx)
        .await?;
    Ok(best_first(found))
}

/// The `(document id, score)` rows of a lexical query `sql` that reads the
/// query text as `$1`, the collection as `$2`, the limit as `$3` and the
/// filter's values after them.
///
/// Sent as an unnamed statement, parsed again each time, not as one of
/// the connection's prepared statements: pg_textsearch's walk ran twice
/// as long from a named statement executed again (1M chunks, the ranking
/// of 30 for SciFact's questions: p50 8.0 ms against 3.4 ms unnamed, the
/// same parameters and plan; `plan_cache_mode` changed nothing). The
/// dense query likewise (hybrid at four clients, p99 52 → 40 ms).
async fn ranked_rows(
    tx: &mut sqlx::Transaction<'static, Postgres>,
    sql: &str,
    query: &str,
    collection_id: i64,
    limit: i64,
    cond: &Condition,
) -> Result<Vec<(i64, f64)>, sqlx::Error> {
    let q = sqlx::query_as::<_, (i64, f64)>(sql)
        .bind(query)
        .bind(collection_id)
        .bind(limit)
        .persistent(false);
    bind_all(q, cond).fetch_all(&mut **tx).await
}

/// The metadata index's condition for `filter`, numbered after the exact
/// condition's `after` placeholders from `$4` (the dense query's), when
/// the documents that both pass hold at most `most` chunks. They are
/// counted through the index, so a filter it narrows to a few rows costs
/// those rows, and the count stops past `most`; a filter a sample of the
/// documents finds far broader is not counted ([`broad_by_sample`]).
/// Otherwise the graph walks.
async fn narrowed(
    tx: &mut sqlx::Transaction<'static, Postgres>,
    collection_id: i64,
    filter: &Filter,
    after: usize,
    most: usize,
) -> Result<Narrowed, sqlx::Error> {
    let on = |collection| Documents {
        meta: "d.meta",
        id: "d.id",
        collection,
    };
    // The search's numbering ($2 the collection), and the count's own: $1
    // the collection, $2 the bound, the conditions' placeholders moved
    // down by one.
    let (Some(pre), Some(count_pre)) = (
        index_condition(filter, &on("$2"), 4 + after),
        index_condition(filter, &on("$1"), 3 + after),
    ) else {
        return Ok(Narrowed::Walked);
    };
    if broad_by_sample(tx, collection_id, filter, most).await? {
        return Ok(Narrowed::Sampled);
    }
    let count_cond = compile(filter, "d.meta", 3);
    // A join with a limit, so that the count streams and stops at the
    // bound: a broad equality is not read whole to learn that it is broad
    // (a range's ids are read whole first, from its index: a few ms for
    // the tens of thousands a sample does not call broad).
    let sql = format!(
        "SELECT count(*) FROM (SELECT 1 FROM documents d JOIN chunks c ON c.document_id = d.id \
         WHERE d.collection_id = $1 AND {} AND {} LIMIT $2) s",
        count_pre.sql, count_cond.sql
    );
    let bound = i64::try_from(most).unwrap_or(i64::MAX).saturating_add(1);
    let q = sqlx::query_as::<_, (i64,)>(&sql)
        .bind(collection_id)
        .bind(bound);
    let (n,) = bind_all(bind_all(q, &count_cond), &count_pre)
        .fetch_one(&mut **tx)
        .await?;
    Ok(if n < bound {
        Narrowed::Exact(pre)
    } else {
        Narrowed::Counted
    })
}

/// Rows of `documents` a sample reads ([`broad_by_sample`]).
const SAMPLE_ROWS: i64 = 1000;
/// The least of the collection's documents a sample must hold to be
/// believed.
const SAMPLE_LEAST: i64 = 200;
/// How far past the bound a sample's estimate must be to skip the count.
const SAMPLE_MARGIN: f64 = 3.0;

/// Whether a sample of `documents` (about [`SAMPLE_ROWS`] rows, whole
/// pages picked at random: `TABLESAMPLE SYSTEM`) says that the filter
/// passes far more than `most` of the collection's chunks: the chunks of
/// the sampled documents that pass, scaled by the collection's documents
/// over those read, past [`SAMPLE_MARGIN`] times `most`. Then the count
/// is skipped and the graph walks: a broad equality paid the bounded
/// count first (10 % of a million chunks: 44.9 ms p50 against 6.3 ms for
/// a range of the same breadth, walked without a count then; 11.0 ms with
/// the sample, which reads in 3–5 ms). Ranges are sampled alike. The
/// sample only skips a count, so a filter it does not call broad is
/// counted exactly as before. It can
/// call a narrow one broad — at a million chunks the bound is 2 %, a
/// sample expecting 20 passing rows must find 60 — and documents of one
/// kind written together share pages, which makes that likelier; such a
/// filter is walked, not ranked exactly. A collection of at most that
/// many chunks is not sampled (nothing is read), nor decided by a sample
/// of too few of its documents (a small collection beside large ones).
async fn broad_by_sample(
    tx: &mut sqlx::Transaction<'static, Postgres>,
    collection_id: i64,
    filter: &Filter,
    most: usize,
) -> Result<bool, sqlx::Error> {
    let past = SAMPLE_MARGIN * most as f64;
    // $1 the collection, $2 the rows to read, $3 the chunks a collection
    // must hold for a sample to be read, the filter's from $4. A passing
    // document's chunks are counted (an index-only lookup), not assumed.
    let cond = compile(filter, "d.meta", 4);
    let sql = format!(
        "SELECT count(*)::int8, \
         COALESCE(sum(CASE WHEN {} THEN (SELECT count(*) FROM chunks c WHERE c.document_id = d.id) END), 0)::int8, \
         (SELECT k.documents FROM collections k WHERE k.id = $1)::int8 \
         FROM documents d TABLESAMPLE SYSTEM ((SELECT least(100.0, $2 * 100.0 / greatest(sum(k.documents), 1)) \
         FROM collections k)::float4) \
         WHERE d.collection_id = $1 AND (SELECT k.chunks FROM collections k WHERE k.id = $1) > $3",
        cond.sql
    );
    let q = sqlx::query_as::<_, (i64, i64, Option<i64>)>(&sql)
        .bind(collection_id)
        .bind(SAMPLE_ROWS)
        .bind(past as i64);
    let (read, passing, documents) = bind_all(q, &cond).fetch_one(&mut **tx).await?;
    if read < SAMPLE_LEAST {
        return Ok(false);
    }
    let estimate = passing as f64 * documents.unwrap_or(0) as f64 / read as f64;
    Ok(estimate > past)
}

/// Negated BM25 scores made positive, best first (ties by id); documents
/// without any of the words (score 0) dropped.
fn best_first(found: Vec<(i64, f64)>) -> Vec<(i64, f64)> {
    let mut docs: Vec<(i64, f64)> = found
        .into_iter()
        .filter(|(_, s)| *s < 0.0)
        .map(|(id, s)| (id, -s))
        .collect();
    docs.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    docs
}

/// `ts_rank`'s weights for D, C, B and A (the title) words: all alike.
/// Its default (0.1, 0.2, 0.4, 1.0) counts a title word ten times a word
/// of the text: on SciFact's train queries that ranks documents at 0.45
/// nDCG@10, flat weights at 0.59 (and title 1, text 0.5 no better).
const RANK_WEIGHTS: &str = "'{1,1,1,1}'";

/// The query's words, any of them (`plainto_tsquery` joins them with AND).
const ANY_WORD: &str =
    "SELECT replace(plainto_tsquery('english', $1)::text, ' & ', ' | ')::tsquery AS q";

const CHUNK_COLUMNS: &str =
    "c.id, c.document_id, d.external_id, c.position, d.title, c.section, d.metadata, c.text";

type ChunkRow = (i64, i64, String, i32, String, String, String, String, f64);
/// A chunk row with its rank after its distance.
type RankedRow = (
    i64,
    i64,
    String,
    i32,
    String,
    String,
    String,
    String,
    f64,
    f64,
);

fn found(r: ChunkRow, similarity: impl Fn(f64) -> f32, rank: f32) -> FoundChunk {
    let metadata = serde_json::from_str(&r.6).unwrap_or_default();
    FoundChunk {
        chunk: Chunk {
            chunk_id: r.0,
            document_id: r.1,
            external_id: r.2,
            position: r.3,
            title: r.4,
            section: r.5,
            metadata: std::sync::Arc::new(metadata),
            text: r.7,
        },
        similarity: similarity(r.8),
        rank,
    }
}

fn bind_all<'q, O>(
    mut q: QueryAs<'q, Postgres, O, PgArguments>,
    cond: &'q Condition,
) -> QueryAs<'q, Postgres, O, PgArguments> {
    for b in &cond.binds {
        q = match b {
            Bind::Text(s) => q.bind(s.as_str()),
            Bind::Float(f) => q.bind(*f),
            Bind::Bool(v) => q.bind(*v),
            Bind::Int(i) => q.bind(*i),
            Bind::Texts(v) => q.bind(v.as_slice()),
            Bind::Floats(v) => q.bind(v.as_slice()),
            Bind::Bools(v) => q.bind(v.as_slice()),
            Bind::Ints(v) => q.bind(v.as_slice()),
        };
    }
    q
}

/// The query's limits for the rest of its transaction, and the guard
/// that cancels it if the search is dropped before it ends. Plans are
/// made for each query's own values: a generic plan walks the BM25
/// index 15 times slower (the query text is not known to it).
async fn set_limits(
    pool: &sqlx::PgPool,
    tx: &mut sqlx::Transaction<'static, Postgres>,
    limits: SearchLimits,
) -> Result<CancelOnDrop, sqlx::Error> {
    static SEARCHES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let tag = format!(
        "ragtime-search-{}-{}",
        std::process::id(),
        SEARCHES.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    );
    let timeout_ms = limits.timeout.map_or(0, |t| {
        u64::try_from(t.as_millis()).unwrap_or(u64::MAX).max(1)
    });
    let pid: i32 = sqlx::query_scalar(
        "SELECT pg_backend_pid() FROM (SELECT set_config('statement_timeout', $1, true), \
                set_config('hnsw.ef_search', $2, true), \
                set_config('hnsw.iterative_scan', 'relaxed_order', true), \
                set_config('application_name', $3, true), \
                set_config('plan_cache_mode', 'force_custom_plan', true)) s",
    )
    .bind(timeout_ms.to_string())
    .bind(limits.ef_search.clamp(1, 1000).to_string())
    .bind(&tag)
    .fetch_one(&mut **tx)
    .await?;
    Ok(CancelOnDrop {
        pool: pool.clone(),
        pid,
        tag,
        armed: true,
    })
}

/// Stops a search's query in the database when the search is dropped
/// before it ended (its request went away, or its stage was abandoned):
/// without it the query would run on, holding a connection and a core,
/// until its `statement_timeout`. The cancel names the backend and the
/// search's own `application_name` (set for its transaction only), so
/// it cannot stop a later query on the same connection.
struct CancelOnDrop {
    pool: sqlx::PgPool,
    pid: i32,
    tag: String,
    armed: bool,
}

impl CancelOnDrop {
    fn ended(mut self) {
        self.armed = false;
    }
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (pool, pid, tag) = (self.pool.clone(), self.pid, std::mem::take(&mut self.tag));
        runtime.spawn(async move {
            let sent = sqlx::query(
                "SELECT pg_cancel_backend(pid) FROM pg_stat_activity WHERE pid = $1 AND application_name = $2",
            )
            .bind(pid)
            .bind(&tag)
            .execute(&pool)
            .await;
            if let Err(e) = sent {
                tracing::warn!(error = %e, pid, "could not cancel an abandoned search");
            }
        });
    }
}

/// BM25 where the database offers `pg_textsearch` (its extension made,
/// `documents.body` added for its index); `ts_rank` where it does not, or
/// where making it fails (it must be in `shared_preload_libraries`).
async fn bm25_if_available(
    tx: &mut sqlx::Transaction<'static, Postgres>,
) -> Result<Lexical, sqlx::Error> {
    let offered: bool = sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM pg_available_extensions WHERE name = 'pg_textsearch')",
    )
    .fetch_one(&mut **tx)
    .await?;
    if !offered {
        return Ok(Lexical::TsRank);
    }
    sqlx::query("SAVEPOINT bm25").execute(&mut **tx).await?;
    if let Err(e) = sqlx::query("CREATE EXTENSION IF NOT EXISTS pg_textsearch")
        .execute(&mut **tx)
        .await
    {
        tracing::warn!(error = %e, "pg_textsearch is offered but cannot be made; ranking words with ts_rank");
        sqlx::query("ROLLBACK TO SAVEPOINT bm25")
            .execute(&mut **tx)
            .await?;
        return Ok(Lexical::TsRank);
    }
    add_column(tx, "documents", "body", "text").await?;
    create_index(
        tx,
        "CREATE INDEX IF NOT EXISTS documents_without_body ON documents (id) WHERE body IS NULL",
    )
    .await?;
    Ok(Lexical::Bm25)
}

/// Adds a column the engine needs, only where it is missing. `ALTER
/// TABLE … ADD COLUMN IF NOT EXISTS` takes the table's exclusive lock even
/// when the column is there: a replica starting would queue behind every
/// open search and stop every later one until it got it, and two
/// processes starting together deadlocked (seen: one start failed with
/// `deadlock detected` while another searched).
async fn add_column(
    tx: &mut sqlx::Transaction<'static, Postgres>,
    table: &str,
    column: &str,
    definition: &str,
) -> Result<(), sqlx::Error> {
    let there: bool = sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = to_regclass($1) AND attname = $2 AND NOT attisdropped)",
    )
    .bind(table)
    .bind(column)
    .fetch_one(&mut **tx)
    .await?;
    if !there {
        sqlx::query(&format!(
            "ALTER TABLE {table} ADD COLUMN IF NOT EXISTS {column} {definition}"
        ))
        .execute(&mut **tx)
        .await?;
    }
    Ok(())
}

/// Runs `CREATE INDEX IF NOT EXISTS name …` only where index `name` is
/// missing: the statement locks its table against writes before it looks.
/// Whether it made it.
async fn create_index(
    tx: &mut sqlx::Transaction<'static, Postgres>,
    sql: &str,
) -> Result<bool, sqlx::Error> {
    let name = sql
        .strip_prefix("CREATE INDEX IF NOT EXISTS ")
        .and_then(|rest| rest.split_whitespace().next())
        .expect("CREATE INDEX IF NOT EXISTS <name> …");
    let there: bool = sqlx::query_scalar("SELECT to_regclass($1) IS NOT NULL")
        .bind(name)
        .fetch_one(&mut **tx)
        .await?;
    if !there {
        sqlx::query(sql).execute(&mut **tx).await?;
    }
    Ok(!there)
}

/// Fills in `dense` and `documents.tsv` (and `body` for BM25) for rows
/// stored before the engine was enabled.
async fn backfill(
    tx: &mut sqlx::Transaction<'static, Postgres>,
    lexical: Lexical,
) -> Result<u64, sqlx::Error> {
    let mut filled = 0u64;
    loop {
        let rows: Vec<(i64, Vec<u8>)> = sqlx::query_as(
            "SELECT id, embedding FROM chunks WHERE dense IS NULL ORDER BY id LIMIT $1",
        )
        .bind(BACKFILL_BATCH)
        .fetch_all(&mut **tx)
        .await?;
        if rows.is_empty() {
            break;
        }
        let ids: Vec<i64> = rows.iter().map(|r| r.0).collect();
        let vectors: Vec<String> = rows
            .iter()
            .map(|r| vector_text(&crate::decode_vector(&r.1)))
            .collect();
        filled += sqlx::query(
            "UPDATE chunks SET dense = v.d::halfvec FROM unnest($1::bigint[], $2::text[]) AS v(id, d) WHERE chunks.id = v.id",
        )
        .bind(&ids)
        .bind(&vectors)
        .execute(&mut **tx)
        .await?
        .rows_affected();
    }
    let (missing, fill) = match lexical {
        Lexical::Bm25 => (
            "SELECT id FROM documents WHERE tsv IS NULL OR body IS NULL",
            DOCUMENT_TEXT_BM25,
        ),
        Lexical::TsRank => ("SELECT id FROM documents WHERE tsv IS NULL", DOCUMENT_TSV),
    };
    let docs: Vec<i64> = sqlx::query_scalar(missing).fetch_all(&mut **tx).await?;
    for id in docs {
        sqlx::query(fill).bind(id).execute(&mut **tx).await?;
    }
    Ok(filled)
}

/// The database engine's schema if it was made in this database (by any
/// process): every writer then keeps its columns current, whichever
/// engine it searches with.
pub(crate) async fn enabled_schema(pool: &sqlx::PgPool) -> Result<Option<Schema>, sqlx::Error> {
    let made: bool = sqlx::query_scalar("SELECT to_regclass('search_schema') IS NOT NULL")
        .fetch_one(pool)
        .await?;
    if !made {
        return Ok(None);
    }
    let dim: Option<i32> = sqlx::query_scalar("SELECT dim FROM search_schema WHERE id = 1")
        .fetch_optional(pool)
        .await?;
    let bm25: bool = sqlx::query_scalar("SELECT to_regclass('documents_bm25') IS NOT NULL")
        .fetch_one(pool)
        .await?;
    let lexical = if bm25 { Lexical::Bm25 } else { Lexical::TsRank };
    Ok(dim
        .and_then(|d| usize::try_from(d).ok())
        .map(|dim| Schema { dim, lexical }))
}

/// Whether an extension version (`0.8.1`) is 0.8 or later.
fn version_at_least_0_8(v: &str) -> bool {
    let mut parts = v.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
    let (major, minor) = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    (major, minor) >= (0, 8)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vectors_travel_as_halfvec_text_and_versions_compare_as_numbers() {
        assert_eq!(vector_text(&[0.5, -1.0, 0.25]), "[0.5,-1,0.25]");
        assert!(version_at_least_0_8("0.8.1"));
        assert!(version_at_least_0_8("0.10.0"));
        assert!(!version_at_least_0_8("0.7.4"));
        assert!(!version_at_least_0_8("garbage"));
    }

    #[test]
    fn the_walks_order_allows_its_scores_rounding_and_nothing_more() {
        // As pg_textsearch returned them at 1M chunks: equal scores summed
        // in another order.
        let rounded = [
            (1, -30.2),
            (2, -30.111_101_150_512_695),
            (3, -30.111_103_057_861_328),
        ];
        assert!(in_walk_order(&rounded));
        assert!(in_walk_order(&[(1, -3.0), (2, -2.0), (3, 0.0)]));
        assert!(in_walk_order(&[]));
        // A row a tenth of a point out of place is another plan's.
        assert!(!in_walk_order(&[(1, -30.0), (2, -30.1)]));
        assert!(!in_walk_order(&[(1, 0.0), (2, -0.001)]));
        // Sorted once kept: best first, ties by id.
        assert_eq!(
            best_first(rounded.to_vec())
                .iter()
                .map(|d| d.0)
                .collect::<Vec<_>>(),
            [1, 3, 2]
        );
    }
}
